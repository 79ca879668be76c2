/*
 * lm/pointwise_simd.c - the AVX-512 forms of attention.c's steps that take
 * one value at a time: softmax's exponentials, SiLU, soft-capping, and
 * RMSNorm's sum of squares, chosen at run time.  Each runs the scalar
 * function's operations in the same order (the polynomials of lm_expf and
 * lm_softcap, the same partial sums), so every path gives the same bytes;
 * tests compare them.
 */
#include "internal.h"
#include "simd.h"

#include <math.h>

#if defined(__x86_64__) && defined(__GNUC__)

/* lm_expf on 16 lanes: the same operations in the same order. */
AVX512 static inline __m512 exp16_avx512(__m512 x)
{
    __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(EXP_LOG2E), _mm512_set1_ps(EXP_SHIFT));
    __m512 n = _mm512_sub_ps(z, _mm512_set1_ps(EXP_SHIFT));
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-EXP_LN2_HI), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-EXP_LN2_LO), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(EXP_C6), r, _mm512_set1_ps(EXP_C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512i sb = _mm512_add_epi32(_mm512_slli_epi32(_mm512_castps_si512(z), 23),
                                  _mm512_set1_epi32(0x3f800000));
    __m512 e = _mm512_mul_ps(p, _mm512_castsi512_ps(sb));
    e = _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_UNDER), _CMP_LT_OQ),
                           _mm512_setzero_ps());
    return _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_OVER), _CMP_GT_OQ),
                              _mm512_set1_ps(__builtin_inff()));
}

/* lm_softcap on 16 lanes: both of tanh's forms, each lane keeping the one lm_softcap takes. */
AVX512 static inline __m512 softcap16_avx512(__m512 x, __m512 cap)
{
    const __m512 t = _mm512_div_ps(x, cap), one = _mm512_set1_ps(1.0f);
    const __m512i sign = _mm512_set1_epi32(INT32_MIN);
    const __m512 a = _mm512_castsi512_ps(_mm512_andnot_si512(sign, _mm512_castps_si512(t)));
    const __m512 u = _mm512_mul_ps(a, a);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(TANH_P4), u, _mm512_set1_ps(TANH_P3));
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(TANH_P2));
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(TANH_P1));
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(TANH_P0));
    const __m512 poly = _mm512_fmadd_ps(_mm512_mul_ps(a, u), p, a);
    const __m512 e = exp16_avx512(_mm512_mul_ps(_mm512_set1_ps(2.0f), a));
    const __m512 far = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
    const __m512 r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(TANH_POLY), _CMP_LT_OQ), far, poly);
    const __m512i signed_r = _mm512_or_si512(_mm512_castps_si512(r), _mm512_and_si512(sign, _mm512_castps_si512(t)));
    return _mm512_mul_ps(cap, _mm512_castsi512_ps(signed_r));
}

/* lm_softcap_rows 16 values at a time; returns how many it did. */
AVX512 size_t lm_softcap_avx512(float *x, size_t n, float cap)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(x + i, softcap16_avx512(_mm512_loadu_ps(x + i), _mm512_set1_ps(cap)));
    return i;
}

/*
 * Scores lo..hi soft-capped in place; returns their maximum after the cap
 * (NaNs passed over, as the scalar "s > mx" does: max_ps keeps its second
 * operand when the first is NaN).
 */
AVX512 float lm_softcap_max_avx512(float *sc, int lo, int hi, float cap)
{
    __m512 mx = _mm512_set1_ps(-__builtin_inff());
    for (int j = lo; j <= hi; j += 16) {
        const __mmask16 live = hi + 1 - j >= 16 ? 0xffff : (__mmask16)((1u << (hi + 1 - j)) - 1);
        const __m512 s = softcap16_avx512(_mm512_maskz_loadu_ps(live, sc + j), _mm512_set1_ps(cap));
        _mm512_mask_storeu_ps(sc + j, live, s);
        mx = _mm512_mask_max_ps(mx, live, s, mx);
    }
    return _mm512_reduce_max_ps(mx);
}

/* lm_silu_mul 16 values at a time, lm_silu's operations; returns how many it did. */
AVX512 size_t lm_silu_mul_avx512(float *g, const float *up, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(g + i);
        __m512 e = exp16_avx512(_mm512_sub_ps(_mm512_setzero_ps(), x));
        __m512 s = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_storeu_ps(g + i, _mm512_mul_ps(s, _mm512_loadu_ps(up + i)));
    }
    return i;
}

/* lm_sumsq, 16 elements a step: its partial sums are the lanes of lo8 and hi8. */
AVX512 double lm_sumsq_avx512(const float *x, int n)
{
    __m512d lo8 = _mm512_setzero_pd(), hi8 = _mm512_setzero_pd();
    for (int i = 0; i < n; i += 16) {
        const __mmask16 live = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(live, x + i); /* lanes past n add zeros */
        v = _mm512_mul_ps(v, v);
        lo8 = _mm512_add_pd(lo8, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
        hi8 = _mm512_add_pd(hi8, _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)));
    }
    double part[16];
    _mm512_storeu_pd(part, lo8);
    _mm512_storeu_pd(part + 8, hi8);
    return lm_sum_parts16(part);
}

/*
 * lm_softmax_exp, 16 keys at a time: lanes are its 16 partial sums.  Two
 * passes, exponentials then sums: in one loop each step's conversions and
 * additions waited on its exponential's long chain, and the out-of-order
 * window held too few steps to hide it (Zen 5, 743 keys: 13.3 cycles a
 * vector in one pass, 10.6 in two).  The same operations in the same order.
 */
AVX512 float lm_softmax_exp_avx512(float *scores, int lo, int hi, float mx)
{
    int j = lo;
    for (; j + 16 <= hi + 1; j += 16) {
        __m512 x = _mm512_sub_ps(_mm512_loadu_ps(scores + j), _mm512_set1_ps(mx));
        _mm512_storeu_ps(scores + j, exp16_avx512(x));
    }
    __m512d lo8 = _mm512_setzero_pd(), hi8 = _mm512_setzero_pd();
    for (int i = lo; i < j; i += 16) {
        __m512 e = _mm512_loadu_ps(scores + i);
        lo8 = _mm512_add_pd(lo8, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        hi8 = _mm512_add_pd(hi8, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    if (j <= hi) { /* the last 1-15 keys in the lanes they fall in, the rest left alone */
        const __mmask16 live = (__mmask16)((1u << (hi + 1 - j)) - 1);
        __m512 e = exp16_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, scores + j), _mm512_set1_ps(mx)));
        _mm512_mask_storeu_ps(scores + j, live, e);
        lo8 = _mm512_mask_add_pd(lo8, (__mmask8)live, lo8, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        hi8 = _mm512_mask_add_pd(hi8, (__mmask8)(live >> 8), hi8, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
        j = hi + 1;
    }
    double part[16];
    _mm512_storeu_pd(part, lo8);
    _mm512_storeu_pd(part + 8, hi8);
    return lm_softmax_finish(scores, lo, j, hi, mx, part);
}

#else
double lm_sumsq_avx512(const float *x, int n)
{
    return lm_sumsq(x, n);
}

size_t lm_silu_mul_avx512(float *g, const float *up, size_t n)
{
    (void)g, (void)up, (void)n;
    return 0;
}

size_t lm_softcap_avx512(float *x, size_t n, float cap)
{
    (void)x, (void)n, (void)cap;
    return 0;
}

float lm_softmax_exp_avx512(float *scores, int lo, int hi, float mx)
{
    return lm_softmax_exp(scores, lo, hi, mx);
}


float lm_softcap_max_avx512(float *sc, int lo, int hi, float cap)
{
    float mx = -INFINITY;
    for (int j = lo; j <= hi; j++) {
        sc[j] = lm_softcap(sc[j], cap);
        mx = sc[j] > mx ? sc[j] : mx;
    }
    return mx;
}
#endif
