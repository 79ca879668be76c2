/*
 * lm/attention.c - the per-token pieces of a layer: RMSNorm, rotary
 * position embeddings (NORM and NEOX pairing, per-layer bases, Llama-3
 * and LongRoPE frequency factors), the KV cache rows (and an f16 cache's
 * rows as f32, once a layer, for long passes), and causal attention
 * of the query heads sharing a KV head over the cache with an optional
 * sliding window and soft-capping.  Each query's result depends on its own
 * token's data and the cache only, which is what keeps batched and
 * sequential evaluation bitwise equal.
 * Also ggml's F16 GELU table, so GELU models round as llama.cpp does.
 */
#include "internal.h"

#include <omp.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* out = x / rms * w, rms from the row's sum of squares. */
static void rmsnorm_apply(float *out, const float *x, const float *w, int n, double sum, float eps)
{
    float scale = 1.0f / sqrtf((float)(sum / n) + eps);
#pragma omp simd /* -O2 leaves plain loops scalar; each element is computed alone */
    for (int i = 0; i < n; i++)
        out[i] = x[i] * scale * w[i];
}

/*
 * The sum of (double)(x[i] * x[i]), in double as ggml sums them, but in 16
 * partial sums (element i in partial i % 16) added in order at the end:
 * one chain of n additions took a one-token pass 1.5-2 us a norm
 * (tinyllama, 2048 features) while the other thread waited; 16 lanes take
 * it 16 elements a step.  (Against ggml's single chain this moves a sum
 * by about n ulps of a double, far below the float it becomes.)
 */
double lm_sumsq(const float *x, int n)
{
    double part[16] = {0};
    for (int i = 0; i < n; i++)
        part[i % 16] += (double)(x[i] * x[i]);
    return lm_sum_parts16(part);
}

/* 16 partial sums added in order: how the scalar and vector paths of sumsq and softmax end alike. */
double lm_sum_parts16(const double part[16])
{
    double sum = 0.0;
    for (int j = 0; j < 16; j++)
        sum += part[j];
    return sum;
}

void lm_rmsnorm(float *out, const float *x, const float *w, int n, float eps)
{
    rmsnorm_apply(out, x, w, n, lm_sumsq(x, n), eps);
}

/* lm_rmsnorm with the sum of squares in vectors where the CPU has AVX-512 or AVX2 (the same bytes). */
void lm_rmsnorm_isa(float *out, const float *x, const float *w, int n, float eps, int isa)
{
    double sum = isa >= LM_ISA_AVX512 ? lm_sumsq_avx512(x, n)
                 : isa == LM_ISA_AVX2 ? lm_sumsq_avx2(x, n)
                 : lm_isa_neon(isa) ? lm_sumsq_neon(x, n)
                                      : lm_sumsq(x, n);
    rmsnorm_apply(out, x, w, n, sum, eps);
}

/* The frequency divisors of layer il: Llama-3 rope_freqs or LongRoPE factors. */
static const float *rope_factors(const lm_model *m, int n_ctx)
{
    if (m->rope_freqs)
        return m->rope_freqs->data;
    if (m->rope_long && m->rope_short)
        return n_ctx > m->hp.n_ctx_orig ? m->rope_long->data : m->rope_short->data;
    return NULL;
}

/*
 * The rotation of position pos in layer il: cs[i], sn[i] for the n_rot / 2
 * pairs.  theta follows ggml's recurrence in float (theta_i = pos *
 * base^(-2i/n_rot) by repeated multiplication) so that our rounding matches
 * llama.cpp's, not just its math.
 */
void lm_rope_angles(const lm_model *m, int il, int pos, int n_ctx, float *cs, float *sn)
{
    const lm_hparams *hp = &m->hp;
    int swa = lm_layer_swa(m, il);
    float base = swa ? hp->rope_base_swa : hp->rope_base;
    float scale = swa ? hp->rope_freq_scale_swa : hp->rope_freq_scale;
    const float *ff = rope_factors(m, n_ctx);
    const float theta_scale = powf(base, -2.0f / (float)hp->n_rot), mscale = hp->rope_attn_factor;
    float theta = (float)pos;
    for (int i = 0; i < hp->n_rot / 2; i++, theta *= theta_scale) {
        float t = scale * (ff ? theta / ff[i] : theta);
        cs[i] = cosf(t) * mscale, sn[i] = sinf(t) * mscale;
    }
}

/* Rotates n_heads heads in place by those angles (NORM or NEOX pairing). */
void lm_rope_apply(const lm_model *m, float *h, int n_heads, int head_dim, const float *cs,
                   const float *sn)
{
    const int half = m->hp.n_rot / 2;
    for (int hh = 0; hh < n_heads; hh++) {
        float *x = h + (size_t)hh * head_dim;
        if (m->rope_style == LM_ROPE_NEOX) { /* pairs (i, i + half): contiguous, in vectors */
#pragma omp simd
            for (int i = 0; i < half; i++) {
                float x0 = x[i], x1 = x[i + half];
                x[i] = x0 * cs[i] - x1 * sn[i];
                x[i + half] = x0 * sn[i] + x1 * cs[i];
            }
            continue;
        }
        for (int i = 0; i < half; i++) { /* pairs (2i, 2i + 1) */
            float x0 = x[2 * i], x1 = x[2 * i + 1];
            x[2 * i] = x0 * cs[i] - x1 * sn[i];
            x[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
        }
    }
}

/* Where head kh of layer il begins in the cache: its K tiles, its V rows (elements). */
static size_t k_head(const lm_kv *kv, int il, int kh)
{
    return ((size_t)(il - kv->first_layer) * kv->n_head_kv + kh) * kv->n_pos * kv->head_dim;
}

static size_t v_head(const lm_kv *kv, int il, int kh)
{
    return ((size_t)(il - kv->first_layer) * kv->n_head_kv + kh) * kv->n_pos * kv->head_dim_v;
}

/* Component d of the key at pos, within its head's tiles. */
static size_t k_at(int hd, int pos, int d)
{
    return (size_t)(pos / 16) * 16 * hd + (size_t)d * 16 + pos % 16;
}

static void kv_put(const lm_kv *kv, void *base, size_t off, float x)
{
    if (kv->type == LM_KV_F32)
        ((float *)base)[off] = x;
    else
        ((uint16_t *)base)[off] = lm_f32_to_f16(x);
}

static float kv_get(const lm_kv *kv, const void *base, size_t off)
{
    return kv->type == LM_KV_F32 ? ((const float *)base)[off]
                                 : lm_f16_to_f32(((const uint16_t *)base)[off]);
}

/* The key and value of KV head kh at pos in layer il (k, v: that head's head_dim floats). */
void lm_kv_store_head(lm_kv *kv, int il, int pos, int kh, const float *k, const float *v)
{
    const int hd = kv->head_dim, hdv = kv->head_dim_v;
    size_t kb = k_head(kv, il, kh), vb = v_head(kv, il, kh) + (size_t)pos * hdv;
    for (int d = 0; d < hd; d++)
        kv_put(kv, kv->k, kb + k_at(hd, pos, d), k[d]);
    for (int d = 0; d < hdv; d++)
        kv_put(kv, kv->v, vb + d, v[d]);
}

/*
 * With an f16 cache, a pass of at least COPY_MIN_QUERIES queries a KV head
 * converts the rows the layer's attention reads to f32 once and attends
 * over those: else each set of queries converts every row it reads, and on
 * AVX2 a conversion a vector cost about a third of the multiply-adds of the
 * six queries it serves.  The same bytes (the conversion is exact).
 * smollm2 Q4_K_M, `kvchat bench --kv-type f16 -r 2` (Zen 1, two threads,
 * alternated twice): pp512 @ d2048 150-154 -> 163-168 t/s (f32 166-172),
 * pp256 @ d3800 110-115 -> 125-127 (f32 128).  Fewer queries do not repay
 * writing and reading the f32 rows: at d1000 smollm2's 8 and 16 tokens (24
 * and 48 queries) 142-169 against 158-181 without, tinyllama's 8 (64)
 * 31-34 against 34-36; 96-128 queries about level.  The copy takes up to
 * COPY_MAX_BYTES (a 1.1B model's at 2048 positions: 4 MiB; a 7B's without
 * grouped queries at 4096 would take 128), beyond which its memory would
 * outgrow what a context may add to the file and the cache.
 */
#define COPY_MIN_QUERIES 192
#define COPY_MAX_BYTES (32u << 20)

size_t lm_kv_f32_floats(const lm_kv *kv)
{
    return (size_t)kv->n_head_kv * kv->n_pos * (size_t)(kv->head_dim + kv->head_dim_v);
}

int lm_kv_copy_worth(const lm_model *m, const lm_kv *kv, int n)
{
    return kv->type == LM_KV_F16 && m->hp.n_head / m->hp.n_head_kv * n >= COPY_MIN_QUERIES &&
           lm_kv_f32_floats(kv) * sizeof(float) <= COPY_MAX_BYTES;
}

/* n f16 values as f32, exactly (the F16 weights' conversion where there is AVX2). */
static void f16_to_f32(float *dst, const uint16_t *src, size_t n, int isa)
{
    if (isa >= LM_ISA_AVX2) {
        lm_halves_to_f32_avx2(dst, LM_F16, src, (int64_t)n);
        return;
    }
    const size_t i = lm_isa_neon(isa) ? lm_f16_to_f32_neon(dst, src, n) : 0;
    lm_dequant_row(LM_F16, src + i, dst + i, (int64_t)(n - i));
}

/* Positions from..to-1 of KV head kh of layer il into f32 (the K tiles holding them whole). */
static void rows_to_f32(const lm_kv *kv, int il, int kh, int from, int to, const lm_kv *f32, int isa)
{
    const size_t hd = (size_t)kv->head_dim, hdv = (size_t)kv->head_dim_v;
    const size_t k0 = (size_t)(from & ~15) * hd, k1 = (size_t)((to + 15) & ~15) * hd;
    const size_t kb = k_head(kv, il, kh), fkb = k_head(f32, il, kh);
    f16_to_f32((float *)f32->k + fkb + k0, (const uint16_t *)kv->k + kb + k0, k1 - k0, isa);
    const size_t v0 = (size_t)from * hdv, v1 = (size_t)to * hdv;
    const size_t vb = v_head(kv, il, kh), fvb = v_head(f32, il, kh);
    f16_to_f32((float *)f32->v + fvb + v0, (const uint16_t *)kv->v + vb + v0, v1 - v0, isa);
}

lm_kv lm_kv_layer_f32(const lm_model *m, const lm_kv *kv, int il, int pos0, int n, float *buf, int isa)
{
    lm_kv f = *kv;
    f.n_layer = 1, f.first_layer = il, f.type = LM_KV_F32;
    f.k = buf, f.v = buf + (size_t)kv->n_head_kv * kv->n_pos * kv->head_dim;
    const int heads = kv->n_head_kv, pieces = omp_get_num_threads();
    const int lo = lm_attend_first_key(m, il, pos0) & ~15, end = pos0 + n, tiles = (end - lo + 15) / 16;
#pragma omp for schedule(static) nowait
    for (int j = 0; j < heads * pieces; j++) { /* each head in a piece a thread, whole tiles */
        const int kh = j / pieces, p = j % pieces;
        const int from = lo + 16 * (tiles * p / pieces), to = lo + 16 * (tiles * (p + 1) / pieces);
        if (from < to)
            rows_to_f32(kv, il, kh, from, to < end ? to : end, &f, isa);
    }
    return f;
}

float lm_expf(float x)
{
    if (x < EXP_UNDER)
        return 0.0f;
    if (x > EXP_OVER)
        return INFINITY;
    float z = fmaf(x, EXP_LOG2E, EXP_SHIFT), n = z - EXP_SHIFT;
    float r = fmaf(n, -EXP_LN2_HI, x);
    r = fmaf(n, -EXP_LN2_LO, r);
    float p = fmaf(EXP_C6, r, EXP_C5);
    p = fmaf(p, r, EXP_C4);
    p = fmaf(p, r, EXP_C3);
    p = fmaf(p, r, EXP_C2);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    uint32_t zb, sb;
    memcpy(&zb, &z, 4);
    sb = (zb << 23) + 0x3f800000u; /* 2^n: n sits in the low bits of z */
    float scale;
    memcpy(&scale, &sb, 4);
    return p * scale;
}

/* tanh(a) for a >= 0 (NaN stays NaN), as internal.h's TANH_ constants say. */
static float tanh_nonneg(float a)
{
    if (a < TANH_POLY) {
        const float u = a * a;
        float p = fmaf(TANH_P4, u, TANH_P3);
        p = fmaf(p, u, TANH_P2);
        p = fmaf(p, u, TANH_P1);
        p = fmaf(p, u, TANH_P0);
        return fmaf(a * u, p, a);
    }
    return 1.0f - 2.0f / (lm_expf(2.0f * a) + 1.0f);
}

float lm_softcap(float x, float cap)
{
    const float t = x / cap;
    return cap * copysignf(tanh_nonneg(fabsf(t)), t);
}

/* x[i] = lm_softcap(x[i], cap), vectors first: the same bits on every path. */
void lm_softcap_rows(float *x, size_t n, float cap, int isa)
{
    size_t i = isa >= LM_ISA_AVX512 ? lm_softcap_avx512(x, n, cap)
               : isa == LM_ISA_AVX2 ? lm_softcap_avx2(x, n, cap)
               : lm_isa_neon(isa) ? lm_softcap_neon(x, n, cap)
                                    : 0;
    for (; i < n; i++)
        x[i] = lm_softcap(x[i], cap);
}

/* SiLU(g) = g * sigmoid(g), written as llama.cpp writes it: g / (1 + e^-g). */
float lm_silu(float g)
{
    return g / (1.0f + lm_expf(-g));
}

/* g[i] = SiLU(g[i]) * up[i]: the gated FFN's product, the same bits on every path. */
void lm_silu_mul(float *g, const float *up, size_t n, int isa)
{
    size_t i = isa >= LM_ISA_AVX512 ? lm_silu_mul_avx512(g, up, n)
               : isa == LM_ISA_AVX2 ? lm_silu_mul_avx2(g, up, n)
               : lm_isa_neon(isa) ? lm_silu_mul_neon(g, up, n)
                                    : 0;
    for (; i < n; i++)
        g[i] = lm_silu(g[i]) * up[i];
}

/*
 * scores[lo..hi] = exp(score - mx); returns 1 / their sum.  The sum is kept
 * in double in 16 interleaved partial sums (key j in partial (j - lo) % 16)
 * added in order at the end: the layout of the AVX-512 version.
 */
float lm_softmax_exp(float *scores, int lo, int hi, float mx)
{
    double part[16] = {0};
    return lm_softmax_finish(scores, lo, lo, hi, mx, part);
}

/* Keys from..hi of that softmax, into the partial sums so far; 1 / the total. */
float lm_softmax_finish(float *scores, int lo, int from, int hi, float mx, double part[16])
{
    for (int j = from; j <= hi; j++) {
        scores[j] = lm_expf(scores[j] - mx);
        part[(j - lo) % 16] += scores[j];
    }
    return (float)(1.0 / lm_sum_parts16(part));
}

/*
 * Scores of one query over keys lo..pos into scores[], each the sum of
 * q[d] * k[d] in d order, one fused multiply-add a component from zero,
 * then scaled (and soft-capped); returns their maximum.  A tile's 16 keys
 * go side by side, as the vector path takes them.
 */
static float scores_one(const lm_kv *kv, size_t kb, const float *q, int lo, int pos, float scale,
                        float cap, float *scores)
{
    const int hd = kv->head_dim;
    float mx = -INFINITY;
    for (int t = lo / 16; t <= pos / 16; t++) {
        float acc[16] = {0};
        for (int d = 0; d < hd; d++)
            for (int l = 0; l < 16; l++)
                acc[l] = fmaf(q[d], kv_get(kv, kv->k, kb + k_at(hd, 16 * t + l, d)), acc[l]);
        for (int j = 16 * t; j < 16 * t + 16; j++) {
            if (j < lo || j > pos)
                continue;
            float s = acc[j % 16] * scale;
            if (cap > 0)
                s = lm_softcap(s, cap);
            scores[j] = s;
            mx = s > mx ? s : mx;
        }
    }
    return mx;
}

/* One query, portably (and for head sizes the vector kernel does not take). */
static void attend_one(const lm_kv *kv, int il, int kh, const lm_attq *qa, float scale, float cap,
                       float *scores, int isa)
{
    const int hdv = kv->head_dim_v, lo = qa->lo, pos = qa->pos;
    float *out = qa->out;
    float mx = scores_one(kv, k_head(kv, il, kh), qa->q, lo, pos, scale, cap, scores);
    float inv = isa >= LM_ISA_AVX512 ? lm_softmax_exp_avx512(scores, lo, pos, mx)
                : isa == LM_ISA_AVX2     ? lm_softmax_exp_avx2(scores, lo, pos, mx)
                : lm_isa_neon(isa)     ? lm_softmax_exp_neon(scores, lo, pos, mx)
                                         : lm_softmax_exp(scores, lo, pos, mx);
    memset(out, 0, (size_t)hdv * sizeof *out);
    const size_t vb = v_head(kv, il, kh);
    for (int j = lo; j <= pos; j++) /* fused, as the AVX-512 path */
        for (int i = 0; i < hdv; i++)
            out[i] = fmaf(scores[j], kv_get(kv, kv->v, vb + (size_t)j * hdv + i), out[i]);
    for (int i = 0; i < hdv; i++)
        out[i] *= inv;
}

int lm_attend_first_key(const lm_model *m, int il, int pos)
{
    const int lo = pos - m->hp.sliding_window + 1;
    return lm_layer_swa(m, il) && lo > 0 ? lo : 0;
}

/* Each query's first key. */
static void attq_windows(const lm_model *m, int il, lm_attq *qs, int n)
{
    for (int a = 0; a < n; a++)
        qs[a].lo = lm_attend_first_key(m, il, qs[a].pos);
}

static float score_scale(const lm_model *m)
{
    return (m->arch->flags & ARCH_Q_PRESCALE) ? 1.0f : m->hp.attn_scale;
}

int lm_attend_splits(const lm_kv *kv, int isa)
{
    return isa >= LM_ISA_AVX512 && kv->head_dim % 16 == 0 && kv->head_dim_v % 16 == 0 &&
           kv->head_dim <= 256 && kv->head_dim_v <= 256;
}

void lm_attend_scores_part(const lm_model *m, const lm_kv *kv, int il, int kh, lm_attq *qs, int n, int part,
                           int parts, float *scores, size_t sstride, float *vmx)
{
    attq_windows(m, il, qs, n);
    const void *k0 = (const char *)kv->k + k_head(kv, il, kh) * lm_kv_elem_bytes(kv);
    lm_attend_scores_avx512(qs, n, k0, kv->head_dim, kv->head_dim_v, score_scale(m), part, parts, scores,
                            sstride, vmx, kv->type == LM_KV_F16);
}

void lm_attend_values_part(const lm_model *m, const lm_kv *kv, int il, int kh, lm_attq *qs, int n, int part,
                           int parts, const float *scores, size_t sstride, const float *vmx, float *w,
                           size_t wstride, float *acc)
{
    attq_windows(m, il, qs, n);
    const void *v0 = (const char *)kv->v + v_head(kv, il, kh) * lm_kv_elem_bytes(kv);
    lm_attend_values_avx512(qs, n, v0, kv->head_dim, kv->head_dim_v, m->hp.attn_softcap, part, parts, scores,
                            sstride, vmx, w, wstride, acc, kv->type == LM_KV_F16);
}

void lm_attend_ahead(const lm_kv *kv, int il, int kh, int lo, int hi, int share, int shares, lm_ahead *a)
{
    const size_t es = lm_kv_elem_bytes(kv);
    const char *base[2] = {(const char *)kv->k + k_head(kv, il, kh) * es,
                           (const char *)kv->v + v_head(kv, il, kh) * es};
    const size_t span[2][2] = {{(size_t)(lo & ~15) * kv->head_dim * es, (size_t)((hi | 15) + 1) * kv->head_dim * es},
                               {(size_t)lo * kv->head_dim_v * es, (size_t)(hi + 1) * kv->head_dim_v * es}};
    for (int s = 0; s < 2; s++) { /* (heads begin on a line: n_pos is a multiple of 32) */
        const size_t from = span[s][0] & ~(size_t)63, lines = (span[s][1] - from + 63) / 64;
        const size_t l0 = lines * (size_t)share / (size_t)shares, l1 = lines * (size_t)(share + 1) / (size_t)shares;
        a->p[s] = base[s] + from + 64 * l0;
        a->lines[s] = l1 - l0;
    }
}

void lm_attend_group(const lm_model *m, const lm_kv *kv, int il, int kh, lm_attq *qs, int n,
                     float *scores, size_t sstride, float *acc, int isa, lm_ahead *ahead)
{
    const lm_hparams *hp = &m->hp;
    const float scale = score_scale(m);
    const float cap = hp->attn_softcap;
    attq_windows(m, il, qs, n);
    const int f16 = kv->type == LM_KV_F16;
    const size_t es = lm_kv_elem_bytes(kv);
    const void *k0 = (const char *)kv->k + k_head(kv, il, kh) * es;
    const void *v0 = (const char *)kv->v + v_head(kv, il, kh) * es;
    if (isa >= LM_ISA_AVX512 && lm_attend_group_avx512(qs, n, k0, v0, kv->head_dim,
                                                       kv->head_dim_v, scale, cap, scores,
                                                       sstride, acc, f16))
        return;
    if (isa == LM_ISA_AVX2 && lm_attend_group_avx2_ahead(qs, n, k0, v0, kv->head_dim, kv->head_dim_v, scale,
                                                         cap, scores, sstride, f16, ahead))
        return;
    if (lm_isa_neon(isa) && lm_attend_group_neon(qs, n, k0, v0, kv->head_dim, kv->head_dim_v, scale, cap,
                                                   scores, sstride, acc, f16))
        return;
    for (int a = 0; a < n; a++)
        attend_one(kv, il, kh, &qs[a], scale, cap, scores, isa);
}

/* ---- GELU ---- */

static float gelu_exact(float x)
{
    const float sqrt_2_over_pi = 0.79788456080286535587989211986876f, coef_a = 0.044715f;
    return 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * x * (1.0f + coef_a * x * x)));
}

/* ggml evaluates GELU as f16(gelu(f16(x))) through a 64K table. */
int lm_gelu_table_init(lm_model *m)
{
    m->gelu_table = malloc(65536 * sizeof *m->gelu_table);
    if (!m->gelu_table)
        return -1;
    for (uint32_t i = 0; i < 65536; i++)
        m->gelu_table[i] = lm_f16_to_f32(lm_f32_to_f16(gelu_exact(lm_f16_to_f32((uint16_t)i))));
    return 0;
}

float lm_gelu(const lm_model *m, float x)
{
    if (x <= -10.0f)
        return 0.0f;
    if (x >= 10.0f)
        return x;
    return m->gelu_table[lm_f32_to_f16(x)];
}

/* g[i] = GELU(g[i]) * up[i], as lm_silu_mul for SiLU: the same bits on every path. */
void lm_gelu_mul(const lm_model *m, float *g, const float *up, size_t n, int isa)
{
    size_t i = isa >= LM_ISA_AVX2 ? lm_gelu_mul_avx2(m->gelu_table, g, up, n) : 0;
    for (; i < n; i++)
        g[i] = lm_gelu(m, g[i]) * up[i];
}
