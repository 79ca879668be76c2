/*
 * lm/attention_simd.c - the AVX-512 forms of attention.c's softmax and
 * head attention, chosen at run time.  They compute exactly what the
 * portable code computes (same exp polynomial, same addition trees), so a
 * logit never depends on the path; tests compare them bit for bit.
 */
#include "internal.h"
#include "simd.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)

/* 16 cache values as f32: from an f32 row, or converted (exactly) from an f16 one. */
AVX512 static inline __m512 kv16(const void *base, size_t off, int f16)
{
    if (f16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + off)));
    return _mm512_loadu_ps((const float *)base + off);
}

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

/* lm_softmax_exp, 16 keys at a time: lanes are its 16 partial sums. */
AVX512 float lm_softmax_exp_avx512(float *scores, int lo, int hi, float mx)
{
    __m512d lo8 = _mm512_setzero_pd(), hi8 = _mm512_setzero_pd();
    int j = lo;
    for (; j + 16 <= hi + 1; j += 16) {
        __m512 e = exp16_avx512(_mm512_sub_ps(_mm512_loadu_ps(scores + j), _mm512_set1_ps(mx)));
        _mm512_storeu_ps(scores + j, e);
        lo8 = _mm512_add_pd(lo8, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        hi8 = _mm512_add_pd(hi8, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    double part[16];
    _mm512_storeu_pd(part, lo8);
    _mm512_storeu_pd(part + 8, hi8);
    return lm_softmax_finish(scores, lo, j, hi, mx, part);
}

/* Two vectors folded lane-wise: chunks (imm) of a and b, plus the other chunks. */
#define FOLD4(a, b, i1, i2) \
    _mm512_add_ps(_mm512_shuffle_f32x4(a, b, i1), _mm512_shuffle_f32x4(a, b, i2))
#define FOLD1(a, b, i1, i2) _mm512_add_ps(_mm512_shuffle_ps(a, b, i1), _mm512_shuffle_ps(a, b, i2))

/*
 * The 16 horizontal sums of acc[0..15] at once, each by exactly the tree of
 * hsum16_avx512 (halves, quarters, then (0+2) + (1+3)), so a score does not
 * depend on whether its key was reduced alone or in a group.  Lane 4k+l of
 * the result is the sum of acc[4l+k]: callers fill acc in that order.
 */
AVX512 static inline __m512 hsum16x16_avx512(const __m512 acc[16])
{
    __m512 b[8], c[4], d[2];
#pragma GCC unroll 8
    for (int m = 0; m < 8; m++) /* lanes 0-7: acc[2m] halves added; 8-15: acc[2m+1] */
        b[m] = FOLD4(acc[2 * m], acc[2 * m + 1], 0x44, 0xEE);
#pragma GCC unroll 4
    for (int m = 0; m < 4; m++) /* chunk k: quarters of acc[4m+k] added */
        c[m] = FOLD4(b[2 * m], b[2 * m + 1], 0x88, 0xDD);
    for (int m = 0; m < 2; m++) /* chunk k: (0+2, 1+3) of acc[8m+k], then of acc[8m+4+k] */
        d[m] = FOLD1(c[2 * m], c[2 * m + 1], 0x44, 0xEE);
    return FOLD1(d[0], d[1], 0x88, 0xDD);
}

/*
 * The kernels below take the head sizes in 16-float vectors (nq for keys,
 * nv for values) as arguments that are constants where they are inlined:
 * then the accumulators live in registers, not on the stack.
 */
#define INLINE_AVX512 AVX512 __attribute__((always_inline)) static inline

/* Scores of the 16 keys j..j+15 (q . k * scale) into scores[j..j+15]; returns them. */
INLINE_AVX512 __m512 scores16(const __m512 *qv, const void *k0, size_t kstride, int j, int nq,
                            float scale, int f16, float *scores)
{
    __m512 acc[16];
#pragma GCC unroll 16
    for (int s = 0; s < 16; s++) {
        size_t kj = (size_t)(j + 4 * (s % 4) + s / 4) * kstride;
        acc[s] = _mm512_mul_ps(qv[0], kv16(k0, kj, f16));
#pragma GCC unroll 16
        for (int i = 1; i < nq; i++)
            acc[s] = _mm512_fmadd_ps(qv[i], kv16(k0, kj + 16 * (size_t)i, f16), acc[s]);
    }
    __m512 sc = _mm512_mul_ps(hsum16x16_avx512(acc), _mm512_set1_ps(scale));
    _mm512_storeu_ps(scores + j, sc);
    return sc;
}

/* The score of key j alone, by the same steps. */
INLINE_AVX512 float score1(const __m512 *qv, const void *k0, size_t kstride, int j, int nq,
                           float scale, int f16)
{
    size_t kj = (size_t)j * kstride;
    __m512 acc = _mm512_mul_ps(qv[0], kv16(k0, kj, f16));
#pragma GCC unroll 16
    for (int i = 1; i < nq; i++)
        acc = _mm512_fmadd_ps(qv[i], kv16(k0, kj + 16 * (size_t)i, f16), acc);
    return hsum16_avx512(acc) * scale;
}

INLINE_AVX512 void attend(const float *q, const void *k0, size_t kstride, const void *v0,
                          size_t vstride, int lo, int pos, int nq, int nv, float scale, float cap,
                          float *scores, float *out, int f16)
{
    __m512 qv[16], o[16], odd[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) /* (dead stores past nq, nv; quiets -Wmaybe-uninitialized) */
        qv[i] = o[i] = odd[i] = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int i = 0; i < nq; i++)
        qv[i] = _mm512_loadu_ps(q + 16 * i);
    /* the maximum is the same in any order: max_ps(s, m) keeps m when s is
       NaN, as the scalar "s > mx" does, and the sign of a zero maximum does
       not change exp(s - mx) */
    __m512 vmx = _mm512_set1_ps(-__builtin_inff());
    int j16 = lo;
    for (; j16 + 16 <= pos + 1; j16 += 16)
        vmx = _mm512_max_ps(scores16(qv, k0, kstride, j16, nq, scale, f16, scores), vmx);
    /* soft-capped scores take their maximum after the cap, one at a time */
    float mx = cap > 0 ? -__builtin_inff() : _mm512_reduce_max_ps(vmx);
    for (int j = cap > 0 ? lo : j16; j <= pos; j++) {
        float s = j < j16 ? scores[j] : score1(qv, k0, kstride, j, nq, scale, f16);
        if (cap > 0)
            s = cap * tanhf(s / cap);
        scores[j] = s;
        mx = s > mx ? s : mx;
    }
    float inv = lm_softmax_exp_avx512(scores, lo, pos, mx);
    int j = lo;
    for (; j < pos; j += 2) { /* keys lo, lo+2, ... into o; lo+1, lo+3, ... into odd */
        size_t v1 = (size_t)j * vstride, v2 = v1 + vstride;
        __m512 w1 = _mm512_set1_ps(scores[j] * inv), w2 = _mm512_set1_ps(scores[j + 1] * inv);
#pragma GCC unroll 16
        for (int i = 0; i < nv; i++) {
            o[i] = _mm512_fmadd_ps(w1, kv16(v0, v1 + 16 * (size_t)i, f16), o[i]);
            odd[i] = _mm512_fmadd_ps(w2, kv16(v0, v2 + 16 * (size_t)i, f16), odd[i]);
        }
    }
    if (j == pos) {
        __m512 w = _mm512_set1_ps(scores[j] * inv);
#pragma GCC unroll 16
        for (int i = 0; i < nv; i++)
            o[i] = _mm512_fmadd_ps(w, kv16(v0, (size_t)j * vstride + 16 * (size_t)i, f16), o[i]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < nv; i++)
        _mm512_storeu_ps(out + 16 * i, _mm512_add_ps(o[i], odd[i]));
}

/* attend with the cache type made a constant too. */
INLINE_AVX512 void attend_sized(const float *q, const void *k0, size_t kstride, const void *v0,
                                size_t vstride, int lo, int pos, int nq, int nv, float scale,
                                float cap, float *scores, float *out, int f16)
{
    if (f16)
        attend(q, k0, kstride, v0, vstride, lo, pos, nq, nv, scale, cap, scores, out, 1);
    else
        attend(q, k0, kstride, v0, vstride, lo, pos, nq, nv, scale, cap, scores, out, 0);
}

/*
 * One query head against cache rows lo..pos (f32 or f16).  Same steps as
 * the portable lm_attend_head, with the loops vectorized; it is used for
 * every batch shape, so evaluation stays deterministic.  The usual head
 * sizes get their own unrolled copies.
 */
AVX512 int lm_attend_avx512(const float *q, const void *k0, size_t kstride, const void *v0,
                            size_t vstride, int lo, int pos, int hd, int hdv, float scale,
                            float cap, float *scores, float *out, int f16)
{
    if (hd % 16 || hdv % 16 || hd > 256 || hdv > 256)
        return 0;
    if (hd == 64 && hdv == 64)
        attend_sized(q, k0, kstride, v0, vstride, lo, pos, 4, 4, scale, cap, scores, out, f16);
    else if (hd == 128 && hdv == 128)
        attend_sized(q, k0, kstride, v0, vstride, lo, pos, 8, 8, scale, cap, scores, out, f16);
    else if (hd == 256 && hdv == 256)
        attend_sized(q, k0, kstride, v0, vstride, lo, pos, 16, 16, scale, cap, scores, out, f16);
    else
        attend_sized(q, k0, kstride, v0, vstride, lo, pos, hd / 16, hdv / 16, scale, cap, scores,
                     out, f16);
    return 1;
}

#else
float lm_softmax_exp_avx512(float *scores, int lo, int hi, float mx)
{
    return lm_softmax_exp(scores, lo, hi, mx);
}

int lm_attend_avx512(const float *q, const void *k0, size_t kstride, const void *v0,
                     size_t vstride, int lo, int pos, int hd, int hdv, float scale, float cap,
                     float *scores, float *out, int f16)
{
    (void)q, (void)k0, (void)kstride, (void)v0, (void)vstride, (void)lo, (void)pos, (void)hd;
    (void)hdv, (void)scale, (void)cap, (void)scores, (void)out, (void)f16;
    return 0;
}
#endif
