/*
 * lm/attention_neon.c - attention, the FFN's SiLU and RMSNorm's sums of
 * squares on aarch64 (isa LM_ISA_NEON or NEON_DOT: Advanced SIMD only): attention_avx2.c's plan in
 * four-lane vectors.  Four queries of a KV head go over its K tiles
 * together, a tile's 16 keys in four vectors loaded once for all four;
 * the softmax takes its exponentials four at a time; the weighted values
 * are summed 16 components a pass.  Every step is the portable code's own
 * (attention.c: each score a chain of fused multiply-adds in component
 * order from zero, the same exp polynomial, the same 16 partial sums in
 * double, each value sum in key order), so a logit does not depend on the
 * CPU; tests/aarch64/neon_kernels.c holds them to the scalar bytes under
 * qemu.  Without it every query read its head's cache alone, a float at
 * a time.
 */
#include "internal.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#if defined(__aarch64__) && defined(__GNUC__)
#include <arm_neon.h>

/* lm_expf on 4 lanes: the same operations in the same order. */
static inline float32x4_t exp4_neon(float32x4_t x)
{
    float32x4_t z = vfmaq_f32(vdupq_n_f32(EXP_SHIFT), x, vdupq_n_f32(EXP_LOG2E));
    float32x4_t n = vsubq_f32(z, vdupq_n_f32(EXP_SHIFT));
    float32x4_t r = vfmaq_f32(x, n, vdupq_n_f32(-EXP_LN2_HI));
    r = vfmaq_f32(r, n, vdupq_n_f32(-EXP_LN2_LO));
    float32x4_t p = vfmaq_f32(vdupq_n_f32(EXP_C5), vdupq_n_f32(EXP_C6), r);
    p = vfmaq_f32(vdupq_n_f32(EXP_C4), p, r);
    p = vfmaq_f32(vdupq_n_f32(EXP_C3), p, r);
    p = vfmaq_f32(vdupq_n_f32(EXP_C2), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    uint32x4_t sb = vaddq_u32(vshlq_n_u32(vreinterpretq_u32_f32(z), 23), vdupq_n_u32(0x3f800000u));
    float32x4_t e = vmulq_f32(p, vreinterpretq_f32_u32(sb));
    e = vbslq_f32(vcltq_f32(x, vdupq_n_f32(EXP_UNDER)), vdupq_n_f32(0.0f), e);
    return vbslq_f32(vcgtq_f32(x, vdupq_n_f32(EXP_OVER)), vdupq_n_f32(INFINITY), e);
}

/* lm_softcap on 4 lanes: both of tanh's forms, each lane keeping the one lm_softcap takes. */
static inline float32x4_t softcap4_neon(float32x4_t x, float32x4_t cap)
{
    const float32x4_t t = vdivq_f32(x, cap), one = vdupq_n_f32(1.0f), a = vabsq_f32(t), u = vmulq_f32(a, a);
    float32x4_t p = vfmaq_f32(vdupq_n_f32(TANH_P3), vdupq_n_f32(TANH_P4), u);
    p = vfmaq_f32(vdupq_n_f32(TANH_P2), p, u);
    p = vfmaq_f32(vdupq_n_f32(TANH_P1), p, u);
    p = vfmaq_f32(vdupq_n_f32(TANH_P0), p, u);
    const float32x4_t poly = vfmaq_f32(a, vmulq_f32(a, u), p);
    const float32x4_t e = exp4_neon(vmulq_f32(vdupq_n_f32(2.0f), a));
    const float32x4_t far = vsubq_f32(one, vdivq_f32(vdupq_n_f32(2.0f), vaddq_f32(e, one)));
    const float32x4_t r = vbslq_f32(vcltq_f32(a, vdupq_n_f32(TANH_POLY)), poly, far);
    const uint32x4_t sign = vdupq_n_u32(0x80000000u);
    return vmulq_f32(cap, vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(r),
                                                          vandq_u32(sign, vreinterpretq_u32_f32(t)))));
}

/* lm_softcap_rows 4 values at a time; returns how many it did. */
size_t lm_softcap_neon(float *x, size_t n, float cap)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(x + i, softcap4_neon(vld1q_f32(x + i), vdupq_n_f32(cap)));
    return i;
}

/* Partial sums j..j+3 of 16 (two vectors of doubles) plus the four floats of v. */
static inline void add_parts4(float64x2_t part[8], int j, float32x4_t v)
{
    part[j / 2] = vaddq_f64(part[j / 2], vcvt_f64_f32(vget_low_f32(v)));
    part[j / 2 + 1] = vaddq_f64(part[j / 2 + 1], vcvt_high_f64_f32(v));
}

static inline void store_parts16_neon(double part[16], const float64x2_t p[8])
{
    for (int j = 0; j < 8; j++)
        vst1q_f64(part + 2 * j, p[j]);
}

static inline void zero_parts(float64x2_t p[8])
{
    for (int j = 0; j < 8; j++)
        p[j] = vdupq_n_f64(0.0);
}

/* lm_sumsq, 16 elements a step: its partial sums are the lanes of eight vectors of doubles. */
double lm_sumsq_neon(const float *x, int n)
{
    float64x2_t p[8];
    zero_parts(p);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j += 4) {
            float32x4_t v = vld1q_f32(x + i + j);
            add_parts4(p, j, vmulq_f32(v, v));
        }
    double part[16];
    store_parts16_neon(part, p);
    for (int j = 0; i < n; i++, j++) /* the last 1-15 elements into their lanes */
        part[j] += (double)(x[i] * x[i]);
    return lm_sum_parts16(part);
}

/* lm_silu_mul 4 values at a time, lm_silu's operations; returns how many it did. */
size_t lm_silu_mul_neon(float *g, const float *up, size_t n)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t x = vld1q_f32(g + i);
        float32x4_t s = vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0f), exp4_neon(vnegq_f32(x))));
        vst1q_f32(g + i, vmulq_f32(s, vld1q_f32(up + i)));
    }
    return i;
}

/* dst[i] = src[i] as f32 (exact, as lm_f16_to_f32), 4 at a time; returns how many it did. */
size_t lm_f16_to_f32_neon(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(dst + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(src + i))));
    return i;
}

/* lm_softmax_exp, 16 keys a step: four vectors, their lanes its 16 partial sums. */
float lm_softmax_exp_neon(float *scores, int lo, int hi, float mx)
{
    float64x2_t p[8];
    zero_parts(p);
    int j = lo;
    for (; j + 16 <= hi + 1; j += 16)
        for (int u = 0; u < 16; u += 4) {
            float32x4_t e = exp4_neon(vsubq_f32(vld1q_f32(scores + j + u), vdupq_n_f32(mx)));
            vst1q_f32(scores + j + u, e);
            add_parts4(p, u, e);
        }
    double part[16];
    store_parts16_neon(part, p);
    return lm_softmax_finish(scores, lo, j, hi, mx, part); /* the last 0-15 keys */
}

/* 4 cache values as f32: from an f32 row, or converted (exactly) from an f16 one. */
static inline float32x4_t kv4(const void *base, size_t off, int f16)
{
    if (f16)
        return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)base + off)));
    return vld1q_f32((const float *)base + off);
}

/*
 * A tile's 16 scores of one query (s[4]: keys j0.., scaled) into sc[]
 * where they are its keys (attention.c's scores_one): whole tiles store
 * all 16 and fold them into the maximum by vector (maxnm keeps the number
 * when a score is NaN, as the scalar "s > mx" does); tiles cut by the
 * range go one at a time.  Soft-capping comes first, on the vectors.
 */
static inline void keep_tile(const lm_attq *qa, int j0, const float32x4_t s0[4], float cap, float *sc,
                             float32x4_t *m4, float *mx)
{
    float32x4_t s[4];
    for (int u = 0; u < 4; u++)
        s[u] = cap > 0 ? softcap4_neon(s0[u], vdupq_n_f32(cap)) : s0[u];
    if (j0 >= qa->lo && j0 + 15 <= qa->pos) {
        for (int u = 0; u < 4; u++) {
            vst1q_f32(sc + j0 + 4 * u, s[u]);
            *m4 = vmaxnmq_f32(s[u], *m4);
        }
        return;
    }
    float tile[16];
    for (int u = 0; u < 4; u++)
        vst1q_f32(tile + 4 * u, s[u]);
    for (int j = j0 < qa->lo ? qa->lo : j0; j <= qa->pos && j < j0 + 16; j++) {
        const float s1 = tile[j - j0];
        sc[j] = s1;
        *mx = s1 > *mx ? s1 : *mx;
    }
}

/*
 * Scores of nq <= 4 queries of one KV head into their rows sc[i], maxima
 * into mx[i]: a tile's 16 keys are four vectors, loaded once for all the
 * queries, and each score is its own chain of multiply-adds in component
 * order (four components of a query loaded together, taken lane by lane).
 */
static inline void quad_scores(const lm_attq *qs, const int nq, const void *k0, int hd, float scale, float cap,
                               float *const sc[4], float mx[4], int f16)
{
    int lo, hi;
    lm_attq_span(qs, nq, &lo, &hi);
    float32x4_t m4[4];
    for (int i = 0; i < nq; i++)
        m4[i] = vdupq_n_f32(-INFINITY), mx[i] = -INFINITY;
    for (int t = lo / 16; t <= hi / 16; t++) {
        const size_t base = (size_t)t * 16 * (size_t)hd;
        float32x4_t a[4][4];
        for (int i = 0; i < nq; i++)
            for (int u = 0; u < 4; u++)
                a[i][u] = vdupq_n_f32(0.0f);
        for (int d = 0; d < hd; d += 4) {
            float32x4_t qd[4];
            for (int i = 0; i < nq; i++)
                qd[i] = vld1q_f32(qs[i].q + d);
#define NEON_SCORE_STEP(lane)                                                                 \
    for (int u = 0; u < 4; u++) {                                                             \
        const float32x4_t k = kv4(k0, base + 16 * (size_t)(d + lane) + 4 * (size_t)u, f16); \
        for (int i = 0; i < nq; i++)                                                          \
            a[i][u] = vfmaq_laneq_f32(a[i][u], k, qd[i], lane);                               \
    }
            NEON_SCORE_STEP(0)
            NEON_SCORE_STEP(1)
            NEON_SCORE_STEP(2)
            NEON_SCORE_STEP(3)
#undef NEON_SCORE_STEP
        }
        for (int i = 0; i < nq; i++) {
            for (int u = 0; u < 4; u++)
                a[i][u] = vmulq_n_f32(a[i][u], scale);
            keep_tile(&qs[i], 16 * t, a[i], cap, sc[i], &m4[i], &mx[i]);
        }
    }
    for (int i = 0; i < nq; i++) {
        float m[4];
        vst1q_f32(m, m4[i]);
        for (int l = 0; l < 4; l++)
            mx[i] = m[l] > mx[i] ? m[l] : mx[i];
    }
}

/* s[0..nv) += w * v_j's components c.. (nv <= 4 vectors). */
static inline void add_value(float32x4_t s[4], const int nv, float w, const void *v0, size_t row, int f16)
{
    for (int u = 0; u < nv; u++)
        s[u] = vfmaq_n_f32(s[u], kv4(v0, row + 4 * (size_t)u, f16), w);
}

/*
 * out[c..c+4nv) of each of nq <= 4 queries = inv[i] * the sum over its
 * keys, in order, of w[i][j] * v_j.  The keys all of them attend (cl..ch)
 * go once for all, each value vector loaded once; a query's keys before
 * and after those go on their own, so each sum still runs in key order.
 */
static inline void quad_values(const lm_attq *qs, const int nq, const void *v0, int hdv, int c, const int nv,
                               float *const w[4], const float inv[4], int f16)
{
    int cl, ch;
    lm_attq_common(qs, nq, &cl, &ch);
    if (cl > ch) /* no key in common: each query alone */
        cl = INT_MAX, ch = INT_MAX - 1;
    float32x4_t s[4][4];
    for (int i = 0; i < nq; i++) {
        for (int u = 0; u < 4; u++)
            s[i][u] = vdupq_n_f32(0.0f);
        for (int j = qs[i].lo; j <= qs[i].pos && j < cl; j++)
            add_value(s[i], nv, w[i][j], v0, (size_t)j * (size_t)hdv + (size_t)c, f16);
    }
    for (int j = cl; j <= ch; j++) {
        const size_t row = (size_t)j * (size_t)hdv + (size_t)c;
        float32x4_t v[4];
        for (int u = 0; u < nv; u++)
            v[u] = kv4(v0, row + 4 * (size_t)u, f16);
        for (int i = 0; i < nq; i++)
            for (int u = 0; u < nv; u++)
                s[i][u] = vfmaq_n_f32(s[i][u], v[u], w[i][j]);
    }
    for (int i = 0; i < nq; i++) {
        for (int j = ch + 1 > qs[i].lo ? ch + 1 : qs[i].lo; j <= qs[i].pos; j++)
            add_value(s[i], nv, w[i][j], v0, (size_t)j * (size_t)hdv + (size_t)c, f16);
        for (int u = 0; u < nv; u++)
            vst1q_f32(qs[i].out + c + 4 * u, vmulq_n_f32(s[i][u], inv[i]));
    }
}

/* nq <= 4 queries: scores, softmax, values, each as attention.c's attend_one. */
static inline void attend_quad(const lm_attq *qs, const int nq, const void *k0, const void *v0, int hd, int hdv,
                               float scale, float cap, float *scores, size_t sstride, int f16)
{
    float *sc[4], mx[4], inv[4];
    for (int i = 0; i < nq; i++)
        sc[i] = scores + (size_t)i * sstride;
    quad_scores(qs, nq, k0, hd, scale, cap, sc, mx, f16);
    for (int i = 0; i < nq; i++)
        inv[i] = lm_softmax_exp_neon(sc[i], qs[i].lo, qs[i].pos, mx[i]);
    int c = 0;
    for (; c + 16 <= hdv; c += 16) /* four vectors of sums a query */
        quad_values(qs, nq, v0, hdv, c, 4, sc, inv, f16);
    if (c < hdv)
        quad_values(qs, nq, v0, hdv, c, (hdv - c) / 4, sc, inv, f16);
}

/*
 * lm_attend_group_avx512's contract on aarch64: queries qs[0..n) against
 * a KV head's cache (K tiles at k0, V rows at v0), four at a time, each
 * with a row of scores (sstride apart; acc unused).  Returns 0 for head
 * sizes that are not multiples of 4.
 */
int lm_attend_group_neon(const lm_attq *qs, int n, const void *k0, const void *v0, int hd, int hdv, float scale,
                         float cap, float *scores, size_t sstride, float *acc, int f16)
{
    (void)acc;
    if (hd % 4 || hdv % 4 || n < 1)
        return 0;
    int a = 0; /* literal counts, so that each quad's sums stay in registers */
    for (; a + 4 <= n; a += 4)
        attend_quad(qs + a, 4, k0, v0, hd, hdv, scale, cap, scores, sstride, f16);
    switch (n - a) {
    case 3: attend_quad(qs + a, 3, k0, v0, hd, hdv, scale, cap, scores, sstride, f16); break;
    case 2: attend_quad(qs + a, 2, k0, v0, hd, hdv, scale, cap, scores, sstride, f16); break;
    case 1: attend_quad(qs + a, 1, k0, v0, hd, hdv, scale, cap, scores, sstride, f16); break;
    }
    return 1;
}

#else /* not aarch64: the portable code */

double lm_sumsq_neon(const float *x, int n)
{
    return lm_sumsq(x, n);
}

size_t lm_silu_mul_neon(float *g, const float *up, size_t n)
{
    (void)g, (void)up, (void)n;
    return 0;
}

size_t lm_softcap_neon(float *x, size_t n, float cap)
{
    (void)x, (void)n, (void)cap;
    return 0;
}

size_t lm_f16_to_f32_neon(float *dst, const uint16_t *src, size_t n)
{
    (void)dst, (void)src, (void)n;
    return 0;
}

float lm_softmax_exp_neon(float *scores, int lo, int hi, float mx)
{
    return lm_softmax_exp(scores, lo, hi, mx);
}

int lm_attend_group_neon(const lm_attq *qs, int n, const void *k0, const void *v0, int hd, int hdv, float scale,
                         float cap, float *scores, size_t sstride, float *acc, int f16)
{
    (void)qs, (void)n, (void)k0, (void)v0, (void)hd, (void)hdv;
    (void)scale, (void)cap, (void)scores, (void)sstride, (void)acc, (void)f16;
    return 0;
}
#endif
