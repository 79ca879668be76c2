/*
 * lm/attention.c - the per-token pieces of a layer: RMSNorm, rotary
 * position embeddings (NORM and NEOX pairing, per-layer bases, Llama-3
 * and LongRoPE frequency factors), the KV cache rows, and causal attention
 * of the query heads sharing a KV head over the cache with an optional
 * sliding window and soft-capping.  Each query's result depends on its own
 * token's data and the cache only, which is what keeps batched and
 * sequential evaluation bitwise equal.
 * Also ggml's F16 GELU table, so GELU models round as llama.cpp does.
 */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* out = x / rms * w, rms from the row's sum of squares (in double, as ggml sums them). */
static void rmsnorm_apply(float *out, const float *x, const float *w, int n, double sum, float eps)
{
    float scale = 1.0f / sqrtf((float)(sum / n) + eps);
#pragma omp simd /* -O2 leaves plain loops scalar; each element is computed alone */
    for (int i = 0; i < n; i++)
        out[i] = x[i] * scale * w[i];
}

void lm_rmsnorm(float *out, const float *x, const float *w, int n, float eps)
{
    double sum = 0.0; /* ggml sums squares in double too */
    for (int i = 0; i < n; i++)
        sum += (double)(x[i] * x[i]);
    rmsnorm_apply(out, x, w, n, sum, eps);
}

/*
 * RMSNorm of rows rows of n features (x and out rows n apart).  Each row's
 * sum of squares is one chain of double additions, latency-bound; with
 * AVX-512 eight rows run their chains side by side in the lanes of a
 * vector, each in lm_rmsnorm's order, so the bytes are the same.
 */
void lm_rmsnorm_rows(float *out, const float *x, const float *w, int rows, int n, float eps, int isa)
{
    int r = 0;
    if (isa >= LM_ISA_AVX512)
        for (; r + 8 <= rows; r += 8) {
            double sum[8];
            lm_sumsq8_avx512(x + (size_t)r * n, n, sum);
            for (int j = 0; j < 8; j++)
                rmsnorm_apply(out + (size_t)(r + j) * n, x + (size_t)(r + j) * n, w, n, sum[j], eps);
        }
    for (; r < rows; r++)
        lm_rmsnorm(out + (size_t)r * n, x + (size_t)r * n, w, n, eps);
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

static float *row_f32(const lm_kv *kv, void *base, int dim, int il, int pos)
{
    return (float *)base + ((size_t)il * kv->n_ctx + pos) * dim;
}

static uint16_t *row_f16(const lm_kv *kv, void *base, int dim, int il, int pos)
{
    return (uint16_t *)base + ((size_t)il * kv->n_ctx + pos) * dim;
}

void lm_kv_store(lm_kv *kv, int il, int pos, const float *k, const float *v)
{
    if (kv->type == LM_KV_F32) {
        memcpy(row_f32(kv, kv->k, kv->k_dim, il, pos), k, (size_t)kv->k_dim * 4);
        memcpy(row_f32(kv, kv->v, kv->v_dim, il, pos), v, (size_t)kv->v_dim * 4);
        return;
    }
    uint16_t *kd = row_f16(kv, kv->k, kv->k_dim, il, pos), *vd = row_f16(kv, kv->v, kv->v_dim, il, pos);
    for (int i = 0; i < kv->k_dim; i++)
        kd[i] = lm_f32_to_f16(k[i]);
    for (int i = 0; i < kv->v_dim; i++)
        vd[i] = lm_f32_to_f16(v[i]);
}

/* Head kh of cached K or V at pos, as f32. */
static const float *kv_head(const lm_kv *kv, void *base, int dim, int hd, int il, int pos, int kh,
                            float *tmp)
{
    if (kv->type == LM_KV_F32)
        return row_f32(kv, base, dim, il, pos) + (size_t)kh * hd;
    const uint16_t *s = row_f16(kv, base, dim, il, pos) + (size_t)kh * hd;
    for (int i = 0; i < hd; i++)
        tmp[i] = lm_f16_to_f32(s[i]);
    return tmp;
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

/* SiLU(g) = g * sigmoid(g), written as llama.cpp writes it: g / (1 + e^-g). */
float lm_silu(float g)
{
    return g / (1.0f + lm_expf(-g));
}

/* g[i] = SiLU(g[i]) * up[i]: the gated FFN's product, the same bits on every path. */
void lm_silu_mul(float *g, const float *up, size_t n, int isa)
{
    size_t i = isa >= LM_ISA_AVX512 ? lm_silu_mul_avx512(g, up, n) : 0;
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
    double sum = 0.0;
    for (int i = 0; i < 16; i++)
        sum += part[i];
    return (float)(1.0 / sum);
}

/* One query, portably (and for head sizes the vector kernel does not take). */
static void attend_one(const lm_kv *kv, int il, int kh, const lm_attq *qa, int hd, int hdv,
                       float scale, float cap, float *scores, float *tmp, int isa)
{
    const float *q = qa->q;
    float *out = qa->out;
    const int lo = qa->lo, pos = qa->pos;
    float mx = -INFINITY;
    for (int j = lo; j <= pos; j++) {
        float s = lm_dot_f(q, kv_head(kv, kv->k, kv->k_dim, hd, il, j, kh, tmp), hd, isa) * scale;
        if (cap > 0)
            s = cap * tanhf(s / cap);
        scores[j] = s;
        mx = s > mx ? s : mx;
    }
    float inv = isa >= LM_ISA_AVX512 ? lm_softmax_exp_avx512(scores, lo, pos, mx)
                                     : lm_softmax_exp(scores, lo, pos, mx);
    float *odd = tmp + (hd > hdv ? hd : hdv); /* the sum over keys lo+1, lo+3, ... */
    memset(out, 0, (size_t)hdv * sizeof *out);
    memset(odd, 0, (size_t)hdv * sizeof *odd);
    for (int j = lo; j <= pos; j++) {
        const float *vj = kv_head(kv, kv->v, kv->v_dim, hdv, il, j, kh, tmp);
        float w = scores[j] * inv, *acc = (j - lo) % 2 ? odd : out;
        for (int i = 0; i < hdv; i++) /* fused, as the AVX-512 path */
            acc[i] = fmaf(w, vj[i], acc[i]);
    }
    for (int i = 0; i < hdv; i++)
        out[i] += odd[i];
}

void lm_attend_group(const lm_model *m, const lm_kv *kv, int il, int kh, lm_attq *qs, int n,
                     float *scores, size_t sstride, float *acc, float *tmp, int isa)
{
    const lm_hparams *hp = &m->hp;
    const int hd = hp->head_dim, hdv = hp->head_dim_v;
    const float scale = (m->arch->flags & ARCH_Q_PRESCALE) ? 1.0f : hp->attn_scale;
    const float cap = hp->attn_softcap;
    const int swa = lm_layer_swa(m, il);
    for (int a = 0; a < n; a++) {
        int lo = qs[a].pos - hp->sliding_window + 1;
        qs[a].lo = swa && lo > 0 ? lo : 0;
    }
    const int f16 = kv->type == LM_KV_F16;
    const void *k0 = f16 ? (const void *)(row_f16(kv, kv->k, kv->k_dim, il, 0) + (size_t)kh * hd)
                         : (const void *)(row_f32(kv, kv->k, kv->k_dim, il, 0) + (size_t)kh * hd);
    const void *v0 = f16 ? (const void *)(row_f16(kv, kv->v, kv->v_dim, il, 0) + (size_t)kh * hdv)
                         : (const void *)(row_f32(kv, kv->v, kv->v_dim, il, 0) + (size_t)kh * hdv);
    if (isa >= LM_ISA_AVX512 && lm_attend_group_avx512(qs, n, k0, (size_t)kv->k_dim, v0,
                                                       (size_t)kv->v_dim, hd, hdv, scale, cap,
                                                       scores, sstride, acc, f16))
        return;
    for (int a = 0; a < n; a++)
        attend_one(kv, il, kh, &qs[a], hd, hdv, scale, cap, scores, tmp, isa);
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
