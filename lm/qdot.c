/*
 * lm/qdot.c - quantized dot products the way llama.cpp computes them.
 *
 * llama.cpp never multiplies a quantized weight by an f32 activation: it
 * first rounds the activation row to the weight type's "vec_dot_type"
 * (Q8_0, Q8_1 or Q8_K: 8-bit codes with a per-block scale; F16 or BF16 for
 * half-precision weights) and then sums integer products block by block.
 * That rounding is where its logits differ from exact math, so we do the
 * same rounding, with the same scale formulas, to give the same logits.
 *
 * A weight row is decoded once into signed 8-bit codes plus integer
 * sub-block scales (a "qrow"); the integer dot of a qrow with each token's
 * quantized activation is then a plain loop the compiler vectorizes.  Every
 * sum runs in a fixed order, so the result does not depend on the batch.
 */
#include "internal.h"

#include <math.h>
#include <string.h>

#define QK 32
#define QK_K 256

int lm_act_type(uint32_t wtype)
{
    switch (wtype) {
    case LM_F32: return LM_F32;
    case LM_F16: return LM_F16;
    case LM_BF16: return LM_BF16;
    case LM_Q4_1:
    case LM_Q5_1: return LM_Q8_1;
    case LM_Q4_0:
    case LM_Q5_0:
    case LM_Q8_0: return LM_Q8_0;
    default: return LM_Q8_K;
    }
}

size_t lm_act_row_bytes(int atype, int64_t k)
{
    switch (atype) {
    case LM_Q8_0: return (size_t)(k / QK) * 34;
    case LM_Q8_1: return (size_t)(k / QK) * 36;
    case LM_Q8_K: return (size_t)(k / QK_K) * 292;
    default: return (size_t)k * sizeof(float);
    }
}

/* ------------------------------------------------ activation rounding */

static float abs_max(const float *x, int n)
{
    float m = 0.0f;
    for (int i = 0; i < n; i++)
        m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

/* Q8_0 / Q8_1: d = max/127 stored as f16, codes round(x * 127/max), ties to even. */
static void quant_q8_01(const float *x, uint8_t *b, int with_sum)
{
    float amax = abs_max(x, QK), d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    uint16_t dh = lm_f32_to_f16(d);
    int8_t *qs = (int8_t *)(b + (with_sum ? 4 : 2));
    int sum = 0;
    for (int j = 0; j < QK; j++) {
        qs[j] = (int8_t)nearbyintf(x[j] * id);
        sum += qs[j];
    }
    memcpy(b, &dh, 2);
    if (with_sum) {
        uint16_t sh = lm_f32_to_f16(d * (float)sum);
        memcpy(b + 2, &sh, 2);
    }
}

/* Q8_K: scale from the signed value of largest magnitude, d = 1/iscale. */
static void quant_q8_k(const float *x, uint8_t *b)
{
    float amax = 0.0f, max = 0.0f, d = 0.0f;
    int8_t *qs = (int8_t *)(b + 4);
    int16_t bsums[QK_K / 16];
    for (int j = 0; j < QK_K; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    if (amax == 0.0f) {
        memset(qs, 0, QK_K);
    } else {
        float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) {
            long v = lrintf(iscale * x[j]);
            qs[j] = (int8_t)(v > 127 ? 127 : v);
        }
        d = 1.0f / iscale;
    }
    for (int g = 0; g < QK_K / 16; g++) {
        int s = 0;
        for (int j = 0; j < 16; j++)
            s += qs[16 * g + j];
        bsums[g] = (int16_t)s;
    }
    memcpy(b, &d, 4);
    memcpy(b + 4 + QK_K, bsums, sizeof bsums);
}

void lm_quantize_act(int atype, const float *x, void *dst, int64_t k)
{
    uint8_t *b = dst;
    float *f = dst;
    switch (atype) {
    case LM_Q8_0:
        for (int64_t i = 0; i < k / QK; i++)
            quant_q8_01(x + i * QK, b + i * 34, 0);
        break;
    case LM_Q8_1:
        for (int64_t i = 0; i < k / QK; i++)
            quant_q8_01(x + i * QK, b + i * 36, 1);
        break;
    case LM_Q8_K:
        for (int64_t i = 0; i < k / QK_K; i++)
            quant_q8_k(x + i * QK_K, b + i * 292);
        break;
    case LM_F16:
        for (int64_t i = 0; i < k; i++)
            f[i] = lm_f16_to_f32(lm_f32_to_f16(x[i]));
        break;
    case LM_BF16:
        for (int64_t i = 0; i < k; i++) {
            uint32_t u;
            memcpy(&u, &x[i], 4);
            if ((u & 0x7fffffff) <= 0x7f800000) /* not NaN: round to nearest even */
                u += 0x7fff + ((u >> 16) & 1);
            f[i] = lm_bf16_to_f32((uint16_t)(u >> 16));
        }
        break;
    default:
        memcpy(f, x, (size_t)k * sizeof *f);
    }
}

/* --------------------------------------------------- weight row decode */

static float half_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return lm_f16_to_f32(h);
}

/* 32-element blocks: code, scale d and (Q4_1/Q5_1) offset m per block. */
static void decode_b32(uint32_t t, const uint8_t *b, int8_t *q, float *d, float *m)
{
    *d = half_at(b);
    *m = 0.0f;
    if (t == LM_Q8_0) {
        memcpy(q, b + 2, QK);
        return;
    }
    const uint8_t *qs = b + 2;
    uint32_t qh = 0;
    int off = 8;
    if (t == LM_Q4_1) {
        *m = half_at(b + 2), qs = b + 4, off = 0;
    } else if (t == LM_Q5_0) {
        memcpy(&qh, b + 2, 4), qs = b + 6, off = 16;
    } else if (t == LM_Q5_1) {
        *m = half_at(b + 2), memcpy(&qh, b + 4, 4), qs = b + 8, off = 0;
    }
    for (int j = 0; j < QK / 2; j++) {
        int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
        q[j] = (int8_t)(((qs[j] & 0xf) | h0) - off);
        q[j + QK / 2] = (int8_t)(((qs[j] >> 4) | h1) - off);
    }
}

static void k4_scale_min(int j, const uint8_t *q, int *sc, int *mn)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* 256-element super-blocks: codes, sixteen scales and mins, d and dmin. */
static void decode_k(uint32_t t, const uint8_t *b, int8_t *q, int16_t *sc, int16_t *mn, float *d,
                     float *dmin)
{
    *dmin = 0.0f;
    memset(mn, 0, 16 * sizeof *mn);
    if (t == LM_Q2_K) {
        *d = half_at(b + 80), *dmin = half_at(b + 82);
        for (int g = 0; g < 16; g++)
            sc[g] = b[g] & 0xf, mn[g] = b[g] >> 4;
        for (int i = 0; i < QK_K; i++) {
            int n = i / 128, shift = 2 * ((i % 128) / 32), l = i % 32;
            q[i] = (int8_t)((b[16 + 32 * n + l] >> shift) & 3);
        }
    } else if (t == LM_Q3_K) {
        const uint8_t *hm = b, *p = b + 96;
        *d = half_at(b + 108);
        for (int g = 0; g < 16; g++) {
            int low = g < 8 ? (p[g] & 0xf) : (p[g - 8] >> 4);
            sc[g] = (int16_t)((low | (((p[8 + g % 4] >> (2 * (g / 4))) & 3) << 4)) - 32);
        }
        for (int i = 0; i < QK_K; i++) {
            int n = i / 128, j = (i % 128) / 32, l = i % 32;
            int v = (b[32 + 32 * n + l] >> (2 * j)) & 3;
            q[i] = (int8_t)(v - ((hm[l] >> (4 * n + j)) & 1 ? 0 : 4));
        }
    } else if (t == LM_Q4_K || t == LM_Q5_K) {
        *d = half_at(b), *dmin = half_at(b + 2);
        const uint8_t *qh = b + 16, *ql = t == LM_Q4_K ? b + 16 : b + 48;
        for (int j = 0; j < 8; j++) {
            int s, m;
            k4_scale_min(j, b + 4, &s, &m);
            sc[2 * j] = sc[2 * j + 1] = (int16_t)s;
            mn[2 * j] = mn[2 * j + 1] = (int16_t)m;
        }
        for (int i = 0; i < QK_K; i++) {
            int pair = i / 64, hi = (i % 64) / 32, l = i % 32;
            int v = (ql[32 * pair + l] >> (4 * hi)) & 0xf;
            if (t == LM_Q5_K && (qh[l] >> (2 * pair + hi)) & 1)
                v += 16;
            q[i] = (int8_t)v;
        }
    } else { /* Q6_K */
        *d = half_at(b + 208);
        for (int g = 0; g < 16; g++)
            sc[g] = (int8_t)b[192 + g];
        for (int i = 0; i < QK_K; i++) {
            int n = i / 128, k = (i % 128) / 32, l = i % 32;
            int low = (b[64 * n + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 0xf;
            int high = (b[128 + 32 * n + l] >> (2 * k)) & 3;
            q[i] = (int8_t)((low | (high << 4)) - 32);
        }
    }
}

void lm_qrow_decode(qrow *r, uint32_t type, const void *src, int64_t k)
{
    const uint8_t *b = src;
    r->type = type;
    r->k = k;
    switch (lm_act_type(type)) {
    case LM_F32:
    case LM_F16:
    case LM_BF16:
        lm_dequant_row(type, src, r->f, k);
        return;
    case LM_Q8_0:
    case LM_Q8_1: {
        size_t bs = lm_type_size(type);
        for (int64_t i = 0; i < k / QK; i++)
            decode_b32(type, b + (size_t)i * bs, r->q + i * QK, &r->d[i], &r->m[i]);
        return;
    }
    default: {
        size_t bs = lm_type_size(type);
        for (int64_t i = 0; i < k / QK_K; i++)
            decode_k(type, b + (size_t)i * bs, r->q + i * QK_K, r->sc + i * 16, r->mn + i * 16,
                     &r->d[i], &r->m[i]);
    }
    }
}

/* ------------------------------------------------------- dot products */

static int32_t idot(const int8_t *a, const int8_t *b, int n)
{
    int32_t s = 0;
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static float dot_b32(const qrow *r, const uint8_t *act, int with_sum)
{
    const size_t bs = with_sum ? 36 : 34;
    const int qoff = with_sum ? 4 : 2;
    float sum = 0.0f, mins = 0.0f;
    for (int64_t i = 0; i < r->k / QK; i++) {
        const uint8_t *a = act + (size_t)i * bs;
        int32_t isum = idot(r->q + i * QK, (const int8_t *)(a + qoff), QK);
        sum += (r->d[i] * half_at(a)) * (float)isum;
        if (with_sum)
            mins += r->m[i] * half_at(a + 2);
    }
    return sum + mins;
}

static float dot_k(const qrow *r, const uint8_t *act)
{
    float sum = 0.0f;
    for (int64_t i = 0; i < r->k / QK_K; i++) {
        const uint8_t *a = act + (size_t)i * 292;
        const int8_t *aq = (const int8_t *)(a + 4), *wq = r->q + i * QK_K;
        const int16_t *sc = r->sc + i * 16, *mn = r->mn + i * 16;
        int16_t bsums[16];
        float ad;
        memcpy(&ad, a, 4);
        memcpy(bsums, a + 4 + QK_K, sizeof bsums);
        int32_t isum = 0, msum = 0;
        for (int g = 0; g < 16; g++) {
            isum += sc[g] * idot(wq + 16 * g, aq + 16 * g, 16);
            msum += mn[g] * bsums[g];
        }
        sum += (r->d[i] * ad) * (float)isum;
        if (msum)
            sum -= (r->m[i] * ad) * (float)msum;
    }
    return sum;
}

float lm_qrow_dot(const qrow *r, const void *act)
{
    switch (lm_act_type(r->type)) {
    case LM_Q8_0: return dot_b32(r, act, 0);
    case LM_Q8_1: return dot_b32(r, act, 1);
    case LM_Q8_K: return dot_k(r, act);
    default: return lm_dot_f32(r->f, act, r->k);
    }
}
