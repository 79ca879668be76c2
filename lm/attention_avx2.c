/*
 * lm/attention_avx2.c - attention (and the FFN's SiLU, RMSNorm's sums of squares) for x86 CPUs with
 * AVX2 but not AVX-512 (and GELU's table lookups, for AVX-512 too), chosen at run time: up to
 * six queries of a KV head at a time, their
 * scores over the K tiles eight keys to a vector (each load serving all of them),
 * the softmax's exponentials eight at a time, their weighted values eight
 * components to a vector.  Each step is the portable
 * code's own (attention.c: the same multiply-adds in the same order, the
 * same exp polynomial, the same partial sums), so a logit does not depend
 * on the path; tests compare them bit for bit.  Without it, attention over
 * a cache of 1000 positions took three quarters of a token's time.
 */
#include "internal.h"
#include "simd.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)

/*
 * lm_expf on the 8 lanes of each of n <= 4 vectors (n a constant where
 * inlined): the same operations in the same order.  Each step runs on all
 * n before the next: one vector at a time, its chain of dependent
 * multiply-adds filled the scheduler while the next vector's independent
 * steps waited behind it.  Lanes past the underflow edge are set to 0 only
 * when there are some, and with nonpositive (the softmax's x = s - max)
 * the overflow edge is never met, so neither blend runs in a softmax step
 * whose keys all lie near the maximum: a 725-key row 1.37 -> 1.29 us,
 * 18 queries over 725 keys 112.4 -> 111.1 us (harness, best of 5).
 */
AVX2 static INLINE void exp8n_avx2(__m256 x[], const int n, const int nonpositive)
{
    __m256 z[4], m[4], r[4], p[4];
#pragma GCC unroll 4
    for (int k = 0; k < n; k++)
        z[k] = _mm256_fmadd_ps(x[k], _mm256_set1_ps(EXP_LOG2E), _mm256_set1_ps(EXP_SHIFT));
#pragma GCC unroll 4
    for (int k = 0; k < n; k++)
        m[k] = _mm256_sub_ps(z[k], _mm256_set1_ps(EXP_SHIFT));
#pragma GCC unroll 4
    for (int k = 0; k < n; k++)
        r[k] = _mm256_fmadd_ps(m[k], _mm256_set1_ps(-EXP_LN2_HI), x[k]);
#pragma GCC unroll 4
    for (int k = 0; k < n; k++)
        r[k] = _mm256_fmadd_ps(m[k], _mm256_set1_ps(-EXP_LN2_LO), r[k]);
#pragma GCC unroll 4
    for (int k = 0; k < n; k++)
        p[k] = _mm256_fmadd_ps(_mm256_set1_ps(EXP_C6), r[k], _mm256_set1_ps(EXP_C5));
#pragma GCC unroll 4
    for (int k = 0; k < n; k++)
        p[k] = _mm256_fmadd_ps(p[k], r[k], _mm256_set1_ps(EXP_C4));
#pragma GCC unroll 4
    for (int k = 0; k < n; k++)
        p[k] = _mm256_fmadd_ps(p[k], r[k], _mm256_set1_ps(EXP_C3));
#pragma GCC unroll 4
    for (int k = 0; k < n; k++)
        p[k] = _mm256_fmadd_ps(p[k], r[k], _mm256_set1_ps(EXP_C2));
#pragma GCC unroll 4
    for (int k = 0; k < n; k++)
        p[k] = _mm256_fmadd_ps(p[k], r[k], _mm256_set1_ps(1.0f));
#pragma GCC unroll 4
    for (int k = 0; k < n; k++)
        p[k] = _mm256_fmadd_ps(p[k], r[k], _mm256_set1_ps(1.0f));
    __m256 under[4], any = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int k = 0; k < n; k++) {
        under[k] = _mm256_cmp_ps(x[k], _mm256_set1_ps(EXP_UNDER), _CMP_LT_OQ);
        any = _mm256_or_ps(any, under[k]);
    }
    const int some_under = !_mm256_testz_ps(any, any);
#pragma GCC unroll 4
    for (int k = 0; k < n; k++) {
        __m256i sb = _mm256_add_epi32(_mm256_slli_epi32(_mm256_castps_si256(z[k]), 23), _mm256_set1_epi32(0x3f800000));
        __m256 e = _mm256_mul_ps(p[k], _mm256_castsi256_ps(sb));
        if (some_under)
            e = _mm256_blendv_ps(e, _mm256_setzero_ps(), under[k]);
        x[k] = nonpositive ? e : _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x[k], _mm256_set1_ps(EXP_OVER), _CMP_GT_OQ));
    }
}

/* lm_expf on 8 lanes. */
AVX2 static INLINE __m256 exp8_avx2(__m256 x)
{
    exp8n_avx2(&x, 1, 0);
    return x;
}

/* lm_softcap on 8 lanes: both of tanh's forms, each lane keeping the one lm_softcap takes. */
AVX2 static INLINE __m256 softcap8_avx2(__m256 x, __m256 cap)
{
    const __m256 t = _mm256_div_ps(x, cap), one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    const __m256 a = _mm256_andnot_ps(sign, t), u = _mm256_mul_ps(a, a);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(TANH_P4), u, _mm256_set1_ps(TANH_P3));
    p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(TANH_P2));
    p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(TANH_P1));
    p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(TANH_P0));
    const __m256 poly = _mm256_fmadd_ps(_mm256_mul_ps(a, u), p, a);
    const __m256 e = exp8_avx2(_mm256_mul_ps(_mm256_set1_ps(2.0f), a));
    const __m256 far = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
    const __m256 r = _mm256_blendv_ps(far, poly, _mm256_cmp_ps(a, _mm256_set1_ps(TANH_POLY), _CMP_LT_OQ));
    return _mm256_mul_ps(cap, _mm256_or_ps(r, _mm256_and_ps(sign, t)));
}

/* lm_softcap_rows 8 values at a time; returns how many it did. */
AVX2 size_t lm_softcap_avx2(float *x, size_t n, float cap)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, softcap8_avx2(_mm256_loadu_ps(x + i), _mm256_set1_ps(cap)));
    return i;
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

/*
 * lm_gelu_mul 8 values at a time, for AVX-512 too (a gather a vector is
 * the cost either way): each value rounded to f16 as lm_f32_to_f16 rounds
 * (to nearest even) and looked up in the table, with lm_gelu's ends past
 * +-10.  A NaN keeps some of its payload here where lm_f32_to_f16 drops
 * it, but every NaN entry of the table of one sign holds the same NaN
 * (built through lm_f32_to_f16; test_gelu_mul checks).  Returns how many
 * it did.
 */
AVX2 size_t lm_gelu_mul_avx2(const float *table, float *g, const float *up, size_t n)
{
    const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256i h = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        __m256 y = _mm256_i32gather_ps(table, h, 4);
        y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LE_OQ));
        y = _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, hi, _CMP_GE_OQ));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(y, _mm256_loadu_ps(up + i)));
    }
    return i;
}

/* lm_softmax_exp, 16 keys a step: two vectors, their lanes its 16 partial sums. */
AVX2 float lm_softmax_exp_avx2(float *scores, int lo, int hi, float mx)
{
    __m256d part4[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    int j = lo;
    for (; j + 32 <= hi + 1; j += 32) {
        __m256 e[4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            e[k] = _mm256_sub_ps(_mm256_loadu_ps(scores + j + 8 * k), _mm256_set1_ps(mx));
        exp8n_avx2(e, 4, 1);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            _mm256_storeu_ps(scores + j + 8 * k, e[k]);
            add_parts8(part4, k & 1, e[k]);
        }
    }
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
 * A tile's 16 scores of one query (lo0, hi8: keys j0.., scaled) into sc[]
 * where they are its keys (attention.c's scores_one): whole tiles store all
 * 16 and fold them into the maximum by vector (max_ps keeps the maximum when
 * a score is NaN, as the scalar "s > mx" does); tiles cut by the range go
 * one at a time.  Soft-capping comes first, on the vectors.
 */
AVX2 static INLINE void keep_tile(const lm_attq *qa, int j0, __m256 lo8, __m256 hi8, float cap, float *sc,
                                  __m256 *m8, float *mx)
{
    if (cap > 0) {
        lo8 = softcap8_avx2(lo8, _mm256_set1_ps(cap));
        hi8 = softcap8_avx2(hi8, _mm256_set1_ps(cap));
    }
    if (j0 >= qa->lo && j0 + 15 <= qa->pos) {
        _mm256_storeu_ps(sc + j0, lo8);
        _mm256_storeu_ps(sc + j0 + 8, hi8);
        *m8 = _mm256_max_ps(hi8, _mm256_max_ps(lo8, *m8));
        return;
    }
    float tile[16];
    _mm256_storeu_ps(tile, lo8);
    _mm256_storeu_ps(tile + 8, hi8);
    for (int j = j0 < qa->lo ? qa->lo : j0; j <= qa->pos && j < j0 + 16; j++) {
        const float s = tile[j - j0];
        sc[j] = s;
        *mx = s > *mx ? s : *mx;
    }
}

#define SET_MAX 6 /* queries that go over the cache together (attend_sets) */

/*
 * Lines asked for while the scores compute, one a component step (about
 * one a K line read): first the call's own V rows, then the next job's
 * (ahead).  The K tiles run front to back and the hardware finds them;
 * the V rows, read a 16-component slice at a time, 256 bytes apart, it
 * does not, and the first set's values waited for them.  smollm2's 18
 * queries over 725 keys (Zen 1, two harnesses at once cycling 90 heads
 * from memory; 113-120 us from L2): 155-166 -> 140 us, with the next head
 * asked for too 146 -> 137-139 (a burst of lines a tile, as before, filled
 * the miss buffers; asking for K tiles ahead as well gave nothing).  A
 * tile's lines are taken at once (ask_take), so the steps keep no state in
 * memory: advanced a step at a time, it cost the call's scores 48 -> 55 us
 * from L2; taken a tile at a time, the call from memory runs in 116-120 us.
 * In a 6-token pass at 722 cached tokens, each thread's first job of a
 * layer (nothing asked for it) 5.3-5.9 -> 4.0-5.1 ms a pass.
 */
typedef struct asks {
    const char *p[3]; /* own V rows, then the next job's K and V (lm_ahead) */
    size_t lines[3];
} asks;
/* The next up to `most` lines to ask for, from the first span with lines left; *n of them. */
static inline const char *ask_take(asks *a, int most, int *n)
{
    int s = 0;
    while (s < 3 && !a->lines[s])
        s++;
    if (s == 3) {
        *n = 0;
        return NULL;
    }
    const char *p = a->p[s];
    *n = a->lines[s] < (size_t)most ? (int)a->lines[s] : most;
    a->p[s] += 64 * (size_t)*n, a->lines[s] -= (size_t)*n;
    return p;
}

/*
 * Scores of nq <= SET_MAX queries of one KV head into their rows sc[i], maxima
 * into mx[i]: a tile's 16 keys are two vectors, loaded once for all the
 * queries, and each score is its own chain of multiply-adds in component
 * order.  Each query keeps the scores of its own keys only.
 */
AVX2 static INLINE void set_scores(const lm_attq *qs, const int nq, const void *k0, int hd, float scale, float cap,
                                    float *const sc[SET_MAX], float mx[SET_MAX], int f16, asks *ask)
{
    int lo, hi;
    lm_attq_span(qs, nq, &lo, &hi);
    __m256 m8[SET_MAX];
    for (int i = 0; i < nq; i++)
        m8[i] = _mm256_set1_ps(-INFINITY), mx[i] = -INFINITY;
    for (int t = lo / 16; t <= hi / 16; t++) {
        const size_t base = (size_t)t * 16 * (size_t)hd;
        int asked;
        const char *ask_p = ask_take(ask, hd, &asked);
        __m256 a[SET_MAX][2];
#pragma GCC unroll 8
        for (int i = 0; i < nq; i++)
            a[i][0] = a[i][1] = _mm256_setzero_ps();
        for (int d = 0; d < hd; d++) {
            if (d < asked)
                __builtin_prefetch(ask_p + 64 * (size_t)d, 0, 2);
            const __m256 k_lo = kv8(k0, base + 16 * (size_t)d, f16), k_hi = kv8(k0, base + 16 * (size_t)d + 8, f16);
#pragma GCC unroll 8
            for (int i = 0; i < nq; i++) {
                const __m256 qd = _mm256_set1_ps(qs[i].q[d]);
                a[i][0] = _mm256_fmadd_ps(qd, k_lo, a[i][0]);
                a[i][1] = _mm256_fmadd_ps(qd, k_hi, a[i][1]);
            }
        }
        for (int i = 0; i < nq; i++)
            keep_tile(&qs[i], 16 * t, _mm256_mul_ps(a[i][0], _mm256_set1_ps(scale)),
                      _mm256_mul_ps(a[i][1], _mm256_set1_ps(scale)), cap, sc[i], &m8[i], &mx[i]);
    }
    for (int i = 0; i < nq; i++) {
        float m[8];
        _mm256_storeu_ps(m, m8[i]);
        for (int l = 0; l < 8; l++)
            mx[i] = m[l] > mx[i] ? m[l] : mx[i];
    }
}

/* s[0..nv) += w * v_j's components c.. (nv <= 2 vectors). */
AVX2 static INLINE void add_value(__m256 s[2], const int nv, float w, const void *v0, size_t row, int f16)
{
    const __m256 x = _mm256_set1_ps(w);
    for (int u = 0; u < nv; u++)
        s[u] = _mm256_fmadd_ps(x, kv8(v0, row + 8 * (size_t)u, f16), s[u]);
}

/*
 * out[c..c+8nv) of each of nq <= SET_MAX queries = inv[i] * the sum over its
 * keys, in order, of w[i][j] * v_j.  The keys all of them attend (cl..ch)
 * go once for all, each value vector loaded once; a query's keys before
 * and after those go on their own, so each sum still runs in key order.
 */
AVX2 static INLINE void set_values(const lm_attq *qs, const int nq, const void *v0, int hdv, int c, const int nv,
                                    float *const w[SET_MAX], const float inv[SET_MAX], int f16)
{
    int cl, ch;
    lm_attq_common(qs, nq, &cl, &ch);
    if (cl > ch) /* no key in common: each query alone */
        cl = INT_MAX, ch = INT_MAX - 1;
    __m256 s[SET_MAX][2];
    for (int i = 0; i < nq; i++) {
        s[i][0] = s[i][1] = _mm256_setzero_ps();
        for (int j = qs[i].lo; j <= qs[i].pos && j < cl; j++)
            add_value(s[i], nv, w[i][j], v0, (size_t)j * (size_t)hdv + (size_t)c, f16);
    }
    for (int j = cl; j <= ch; j++) {
        const size_t row = (size_t)j * (size_t)hdv + (size_t)c;
        __m256 v[2];
        for (int u = 0; u < nv; u++)
            v[u] = kv8(v0, row + 8 * (size_t)u, f16);
#pragma GCC unroll 8
        for (int i = 0; i < nq; i++) {
            const __m256 x = _mm256_set1_ps(w[i][j]);
            for (int u = 0; u < nv; u++)
                s[i][u] = _mm256_fmadd_ps(x, v[u], s[i][u]);
        }
    }
    for (int i = 0; i < nq; i++) {
        for (int j = ch + 1 > qs[i].lo ? ch + 1 : qs[i].lo; j <= qs[i].pos; j++)
            add_value(s[i], nv, w[i][j], v0, (size_t)j * (size_t)hdv + (size_t)c, f16);
        for (int u = 0; u < nv; u++)
            _mm256_storeu_ps(qs[i].out + c + 8 * u, _mm256_mul_ps(s[i][u], _mm256_set1_ps(inv[i])));
    }
}

/* nq <= SET_MAX queries: scores, softmax, values, each as attention.c's attend_one. */
AVX2 static INLINE void attend_set(const lm_attq *qs, const int nq, const void *k0, const void *v0, int hd, int hdv,
                                    float scale, float cap, float *scores, size_t sstride, int f16, asks *ask)
{
    float *sc[SET_MAX], mx[SET_MAX], inv[SET_MAX];
    for (int i = 0; i < nq; i++)
        sc[i] = scores + (size_t)i * sstride;
    set_scores(qs, nq, k0, hd, scale, cap, sc, mx, f16, ask);
    for (int i = 0; i < nq; i++)
        inv[i] = lm_softmax_exp_avx2(sc[i], qs[i].lo, qs[i].pos, mx[i]);
    int c = 0;
    for (; c + 16 <= hdv; c += 16) /* two vectors of sums a query */
        set_values(qs, nq, v0, hdv, c, 2, sc, inv, f16);
    if (c < hdv)
        set_values(qs, nq, v0, hdv, c, 1, sc, inv, f16);
}

/*
 * Queries in sets of up to six, as even as can be (18: 6 + 6 + 6, 9: 5 + 4,
 * 8: 4 + 4): each K and V load then serves up to six queries' multiply-adds
 * (twelve sums in registers, two loads, one broadcast: 15 of the 16), and
 * no set is left with one query, whose two chains of dependent
 * multiply-adds run at the latency, not the rate.  In fours, as before, a
 * 9th query took a third of the other eight's time.  smollm2's 18 queries
 * of a KV head over 725 keys (Zen 1, best of 5 x 1000 calls, cache in L2):
 * 114.8 -> 107.5 us; 9 queries 61.6 -> 54.6, 10 66.4 -> 61.2; qwen2.5's 42
 * 272 -> 252; 8 and 12 level.
 */
AVX2 __attribute__((noinline)) static void attend_sets(const lm_attq *qs, int n, const void *k0, const void *v0,
                                                       int hd, int hdv, float scale, float cap, float *scores,
                                                       size_t sstride, int f16, asks *ask)
{
    const int sets = (n + SET_MAX - 1) / SET_MAX;
    for (int i = 0, a = 0; i < sets; i++) {
        const int nq = (n - a + (sets - i) - 1) / (sets - i), at = a;
        a += nq;
        switch (nq) { /* a constant count keeps the sums in registers */
        case 6: attend_set(qs + at, 6, k0, v0, hd, hdv, scale, cap, scores, sstride, f16, ask); break;
        case 5: attend_set(qs + at, 5, k0, v0, hd, hdv, scale, cap, scores, sstride, f16, ask); break;
        case 4: attend_set(qs + at, 4, k0, v0, hd, hdv, scale, cap, scores, sstride, f16, ask); break;
        case 3: attend_set(qs + at, 3, k0, v0, hd, hdv, scale, cap, scores, sstride, f16, ask); break;
        case 2: attend_set(qs + at, 2, k0, v0, hd, hdv, scale, cap, scores, sstride, f16, ask); break;
        default: attend_set(qs + at, 1, k0, v0, hd, hdv, scale, cap, scores, sstride, f16, ask); break;
        }
    }
}

/*
 * lm_attend_group_avx512's contract without AVX-512: queries qs[0..n)
 * against KV head's cache (K tiles at k0, V rows at v0), up to six at a time,
 * each with a row of scores (sstride apart; acc unused).  Returns 0 for head sizes
 * that are not multiples of 16 (keys) and 8 (values).
 */
AVX2 int lm_attend_group_avx2(const lm_attq *qs, int n, const void *k0, const void *v0, int hd, int hdv,
                              float scale, float cap, float *scores, size_t sstride, float *acc, int f16)
{
    (void)acc;
    return lm_attend_group_avx2_ahead(qs, n, k0, v0, hd, hdv, scale, cap, scores, sstride, f16, NULL);
}

/* The lines of the V rows of keys lo..hi (of hdv components, es bytes each), then ahead's. */
static asks lines_to_ask(const void *v0, int lo, int hi, int hdv, size_t es, const lm_ahead *ahead)
{
    const size_t from = (size_t)lo * (size_t)hdv * es & ~(size_t)63, to = (size_t)(hi + 1) * (size_t)hdv * es;
    asks a = {{(const char *)v0 + from}, {(to - from + 63) / 64}};
    for (int s = 0; ahead && s < 2; s++)
        a.p[1 + s] = ahead->p[s], a.lines[1 + s] = ahead->lines[s];
    return a;
}

AVX2 int lm_attend_group_avx2_ahead(const lm_attq *qs, int n, const void *k0, const void *v0, int hd, int hdv,
                                    float scale, float cap, float *scores, size_t sstride, int f16, lm_ahead *ahead)
{
    if (hd % 16 || hdv % 8 || n < 1)
        return 0;
    int lo, hi;
    lm_attq_span(qs, n, &lo, &hi);
    asks ask = lines_to_ask(v0, lo, hi, hdv, f16 ? 2 : 4, ahead);
    attend_sets(qs, n, k0, v0, hd, hdv, scale, cap, scores, sstride, f16, &ask);
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

size_t lm_softcap_avx2(float *x, size_t n, float cap)
{
    (void)x, (void)n, (void)cap;
    return 0;
}

size_t lm_gelu_mul_avx2(const float *table, float *g, const float *up, size_t n)
{
    (void)table, (void)g, (void)up, (void)n;
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

int lm_attend_group_avx2_ahead(const lm_attq *qs, int n, const void *k0, const void *v0, int hd, int hdv,
                               float scale, float cap, float *scores, size_t sstride, int f16, lm_ahead *ahead)
{
    (void)qs, (void)n, (void)k0, (void)v0, (void)hd, (void)hdv;
    (void)scale, (void)cap, (void)scores, (void)sstride, (void)f16, (void)ahead;
    return 0;
}
#endif
