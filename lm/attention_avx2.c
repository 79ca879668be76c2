/*
 * lm/attention_avx2.c - attention (and the FFN's SiLU, RMSNorm's sums of squares) for x86 CPUs with
 * AVX2 but not AVX-512, chosen at run time: one query at a time, its scores over the K tiles
 * eight keys to a vector, the softmax's exponentials eight at a time, its
 * weighted values eight components to a vector.  Each step is the portable
 * code's own (attention.c: the same multiply-adds in the same order, the
 * same exp polynomial, the same partial sums), so a logit does not depend
 * on the path; tests compare them bit for bit.  Without it, attention over
 * a cache of 1000 positions took three quarters of a token's time.
 */
#include "internal.h"
#include "simd.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)

/* lm_expf on 8 lanes: the same operations in the same order. */
AVX2 static inline __m256 exp8_avx2(__m256 x)
{
    __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(EXP_LOG2E), _mm256_set1_ps(EXP_SHIFT));
    __m256 n = _mm256_sub_ps(z, _mm256_set1_ps(EXP_SHIFT));
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EXP_LN2_HI), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EXP_LN2_LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(EXP_C6), r, _mm256_set1_ps(EXP_C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i sb = _mm256_add_epi32(_mm256_slli_epi32(_mm256_castps_si256(z), 23), _mm256_set1_epi32(0x3f800000));
    __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(sb));
    e = _mm256_blendv_ps(e, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(EXP_UNDER), _CMP_LT_OQ));
    return _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, _mm256_set1_ps(EXP_OVER), _CMP_GT_OQ));
}

/* lm_sumsq, 16 elements a step: its partial sums are the lanes of four vectors of doubles. */
AVX2 double lm_sumsq_avx2(const float *x, int n)
{
    __m256d part4[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int h = 0; h < 2; h++) {
            __m256 v = _mm256_loadu_ps(x + i + 8 * h);
            add_parts8(part4, h, _mm256_mul_ps(v, v));
        }
    double part[16];
    store_parts16(part, part4);
    for (int j = 0; i < n; i++, j++) /* the last 1-15 elements into their lanes */
        part[j] += (double)(x[i] * x[i]);
    return lm_sum_parts16(part);
}

/* lm_silu_mul 8 values at a time, lm_silu's operations (lm_silu_mul_avx512's); returns how many it did. */
AVX2 size_t lm_silu_mul_avx2(float *g, const float *up, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 e = exp8_avx2(_mm256_sub_ps(_mm256_setzero_ps(), x));
        __m256 s = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
    return i;
}

/* lm_softmax_exp, 16 keys a step: two vectors, their lanes its 16 partial sums. */
AVX2 float lm_softmax_exp_avx2(float *scores, int lo, int hi, float mx)
{
    __m256d part4[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    int j = lo;
    for (; j + 16 <= hi + 1; j += 16) {
        __m256 e0 = exp8_avx2(_mm256_sub_ps(_mm256_loadu_ps(scores + j), _mm256_set1_ps(mx)));
        __m256 e1 = exp8_avx2(_mm256_sub_ps(_mm256_loadu_ps(scores + j + 8), _mm256_set1_ps(mx)));
        _mm256_storeu_ps(scores + j, e0);
        _mm256_storeu_ps(scores + j + 8, e1);
        add_parts8(part4, 0, e0);
        add_parts8(part4, 1, e1);
    }
    double part[16];
    store_parts16(part, part4);
    return lm_softmax_finish(scores, lo, j, hi, mx, part); /* the last 0-15 keys */
}

/* 8 cache values as f32: from an f32 row, or converted (exactly) from an f16 one. */
AVX2 static inline __m256 kv8(const void *base, size_t off, int f16)
{
    if (f16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + off)));
    return _mm256_loadu_ps((const float *)base + off);
}

/*
 * Scores of one query over its keys into sc[] (attention.c's scores_one): a
 * tile's 16 keys in two vectors, each score its own chain of multiply-adds
 * in component order.  Whole tiles store all 16 and fold them into the
 * maximum by vector (max_ps keeps the maximum when a score is NaN, as the
 * scalar "s > mx" does); tiles cut by the range, and soft-capped scores,
 * go one at a time.
 */
AVX2 static float scores_avx2(const lm_attq *qa, const void *k0, int hd, float scale, float cap, float *sc,
                              int f16)
{
    const int lo = qa->lo, pos = qa->pos;
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    float mx = -INFINITY;
    for (int t = lo / 16; t <= pos / 16; t++) {
        const size_t base = (size_t)t * 16 * (size_t)hd;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (int d = 0; d < hd; d++) {
            __m256 qd = _mm256_set1_ps(qa->q[d]);
            a0 = _mm256_fmadd_ps(qd, kv8(k0, base + 16 * (size_t)d, f16), a0);
            a1 = _mm256_fmadd_ps(qd, kv8(k0, base + 16 * (size_t)d + 8, f16), a1);
        }
        a0 = _mm256_mul_ps(a0, _mm256_set1_ps(scale));
        a1 = _mm256_mul_ps(a1, _mm256_set1_ps(scale));
        const int j0 = 16 * t;
        if (cap <= 0 && j0 >= lo && j0 + 15 <= pos) {
            _mm256_storeu_ps(sc + j0, a0);
            _mm256_storeu_ps(sc + j0 + 8, a1);
            m8 = _mm256_max_ps(a1, _mm256_max_ps(a0, m8));
            continue;
        }
        float tile[16];
        _mm256_storeu_ps(tile, a0);
        _mm256_storeu_ps(tile + 8, a1);
        for (int j = j0 < lo ? lo : j0; j <= pos && j < j0 + 16; j++) {
            float s = tile[j - j0];
            if (cap > 0)
                s = cap * tanhf(s / cap);
            sc[j] = s;
            mx = s > mx ? s : mx;
        }
    }
    float m[8];
    _mm256_storeu_ps(m, m8);
    for (int i = 0; i < 8; i++)
        mx = m[i] > mx ? m[i] : mx;
    return mx;
}

/* out[c..c+8nv) = inv * sum over keys lo..pos, in order, of w[j] * v_j (nv <= 8, a constant where inlined). */
AVX2 static INLINE void values_avx2(const lm_attq *qa, const void *v0, int hdv, int c, int nv, const float *w,
                                    float inv, int f16)
{
    __m256 s[8];
#pragma GCC unroll 8
    for (int u = 0; u < nv; u++)
        s[u] = _mm256_setzero_ps();
    for (int j = qa->lo; j <= qa->pos; j++) {
        __m256 x = _mm256_set1_ps(w[j]);
        const size_t row = (size_t)j * (size_t)hdv + (size_t)c;
#pragma GCC unroll 8
        for (int u = 0; u < nv; u++)
            s[u] = _mm256_fmadd_ps(x, kv8(v0, row + 8 * (size_t)u, f16), s[u]);
    }
#pragma GCC unroll 8
    for (int u = 0; u < nv; u++)
        _mm256_storeu_ps(qa->out + c + 8 * u, _mm256_mul_ps(s[u], _mm256_set1_ps(inv)));
}

/* One query: scores, softmax, values, as attention.c's attend_one. */
AVX2 static void attend_one_avx2(const lm_attq *qa, const void *k0, const void *v0, int hd, int hdv, float scale,
                                 float cap, float *scores, int f16)
{
    float mx = scores_avx2(qa, k0, hd, scale, cap, scores, f16);
    float inv = lm_softmax_exp_avx2(scores, qa->lo, qa->pos, mx);
    int c = 0;
    for (; c + 64 <= hdv; c += 64) /* eight vectors of sums at a time */
        values_avx2(qa, v0, hdv, c, 8, scores, inv, f16);
    for (; c < hdv; c += 8)
        values_avx2(qa, v0, hdv, c, 1, scores, inv, f16);
}

/*
 * lm_attend_group_avx512's contract without AVX-512: queries qs[0..n)
 * against KV head's cache (K tiles at k0, V rows at v0), one at a time,
 * each with scores[] (sstride and acc unused).  Returns 0 for head sizes
 * that are not multiples of 16 (keys) and 8 (values).
 */
AVX2 int lm_attend_group_avx2(const lm_attq *qs, int n, const void *k0, const void *v0, int hd, int hdv,
                              float scale, float cap, float *scores, size_t sstride, float *acc, int f16)
{
    (void)sstride, (void)acc;
    if (hd % 16 || hdv % 8 || n < 1)
        return 0;
    for (int a = 0; a < n; a++)
        attend_one_avx2(&qs[a], k0, v0, hd, hdv, scale, cap, scores, f16);
    return 1;
}

#else

double lm_sumsq_avx2(const float *x, int n)
{
    return lm_sumsq(x, n);
}

size_t lm_silu_mul_avx2(float *g, const float *up, size_t n)
{
    (void)g, (void)up, (void)n;
    return 0;
}

float lm_softmax_exp_avx2(float *scores, int lo, int hi, float mx)
{
    return lm_softmax_exp(scores, lo, hi, mx);
}

int lm_attend_group_avx2(const lm_attq *qs, int n, const void *k0, const void *v0, int hd, int hdv,
                         float scale, float cap, float *scores, size_t sstride, float *acc, int f16)
{
    (void)qs, (void)n, (void)k0, (void)v0, (void)hd, (void)hdv;
    (void)scale, (void)cap, (void)scores, (void)sstride, (void)acc, (void)f16;
    return 0;
}
#endif
