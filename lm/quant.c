/*
 * lm/quant.c - tensor element types: their sizes, half-precision
 * conversion, and dequantization of one row to f32.  The block layouts are
 * those of ggml (llama.cpp's ggml-common.h); blocks are read byte by byte
 * through memcpy so that any alignment and either endianness of host is safe.
 *
 * Float weights are used through lm_dequant_row; quantized ones are decoded
 * for integer dot products in qdot.c.
 */
#include "internal.h"

#include <math.h>
#include <string.h>

#define QK 32
#define QK_K 256

typedef struct type_info {
    const char *name;
    int64_t block;
    size_t size;
    int supported;
} type_info;

static const type_info TYPES[LM_NTYPES] = {
    [LM_F32] = {"F32", 1, 4, 1},
    [LM_F16] = {"F16", 1, 2, 1},
    [LM_Q4_0] = {"Q4_0", QK, 18, 1},
    [LM_Q4_1] = {"Q4_1", QK, 20, 1},
    [LM_Q5_0] = {"Q5_0", QK, 22, 1},
    [LM_Q5_1] = {"Q5_1", QK, 24, 1},
    [LM_Q8_0] = {"Q8_0", QK, 34, 1},
    [LM_Q8_1] = {"Q8_1", QK, 36, 0},
    [LM_Q2_K] = {"Q2_K", QK_K, 84, 1},
    [LM_Q3_K] = {"Q3_K", QK_K, 110, 1},
    [LM_Q4_K] = {"Q4_K", QK_K, 144, 1},
    [LM_Q5_K] = {"Q5_K", QK_K, 176, 1},
    [LM_Q6_K] = {"Q6_K", QK_K, 210, 1},
    [LM_Q8_K] = {"Q8_K", QK_K, 292, 0},
    [16] = {"IQ2_XXS", QK_K, 66, 0},
    [17] = {"IQ2_XS", QK_K, 74, 0},
    [18] = {"IQ3_XXS", QK_K, 98, 0},
    [19] = {"IQ1_S", QK_K, 50, 0},
    [20] = {"IQ4_NL", QK, 18, 0},
    [21] = {"IQ3_S", QK_K, 110, 0},
    [22] = {"IQ2_S", QK_K, 82, 0},
    [23] = {"IQ4_XS", QK_K, 136, 0},
    [24] = {"I8", 1, 1, 0},
    [25] = {"I16", 1, 2, 0},
    [26] = {"I32", 1, 4, 0},
    [27] = {"I64", 1, 8, 0},
    [28] = {"F64", 1, 8, 0},
    [29] = {"IQ1_M", QK_K, 56, 0},
    [LM_BF16] = {"BF16", 1, 2, 1},
    [34] = {"TQ1_0", QK_K, 54, 0},
    [35] = {"TQ2_0", QK_K, 66, 0},
};

const char *lm_type_name(uint32_t t) { return t < LM_NTYPES ? TYPES[t].name : NULL; }
int lm_type_known(uint32_t t) { return t < LM_NTYPES && TYPES[t].name != NULL; }
int lm_type_supported(uint32_t t) { return lm_type_known(t) && TYPES[t].supported; }
int64_t lm_type_block(uint32_t t) { return TYPES[t].block; }
size_t lm_type_size(uint32_t t) { return TYPES[t].size; }

size_t lm_row_bytes(uint32_t t, int64_t n) { return (size_t)(n / TYPES[t].block) * TYPES[t].size; }

/* IEEE half -> float, exact for every input including subnormals and NaN. */
float lm_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man) {
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* float -> IEEE half, round to nearest even. */
uint16_t lm_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xff, man = x & 0x7fffff;
    if (exp == 0xff)
        return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 0x1f)
        return (uint16_t)(sign | 0x7c00);
    if (e <= 0) {
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000;
        int shift = 14 - e;
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1)))
        half++;
    return (uint16_t)(sign | half);
}

float lm_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* ---- 32-element blocks ---- */

static void deq_q4_0(const uint8_t *b, float *y)
{
    float d = lm_half_at(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = (float)((qs[j] & 0xf) - 8) * d;
        y[j + QK / 2] = (float)((qs[j] >> 4) - 8) * d;
    }
}

static void deq_q4_1(const uint8_t *b, float *y)
{
    float d = lm_half_at(b), m = lm_half_at(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = (float)(qs[j] & 0xf) * d + m;
        y[j + QK / 2] = (float)(qs[j] >> 4) * d + m;
    }
}

/* Q5: the fifth bit of element j is bit j of the 32-bit qh word. */
static void deq_q5(const uint8_t *qh_p, const uint8_t *qs, float d, float m, int offset, float *y)
{
    uint32_t qh;
    memcpy(&qh, qh_p, 4);
    for (int j = 0; j < QK / 2; j++) {
        int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
        y[j] = (float)(((qs[j] & 0xf) | h0) - offset) * d + m;
        y[j + QK / 2] = (float)(((qs[j] >> 4) | h1) - offset) * d + m;
    }
}

static void deq_q5_0(const uint8_t *b, float *y) { deq_q5(b + 2, b + 6, lm_half_at(b), 0.0f, 16, y); }
static void deq_q5_1(const uint8_t *b, float *y) { deq_q5(b + 4, b + 8, lm_half_at(b), lm_half_at(b + 2), 0, y); }

static void deq_q8_0(const uint8_t *b, float *y)
{
    float d = lm_half_at(b);
    for (int j = 0; j < QK; j++)
        y[j] = (float)(int8_t)b[2 + j] * d;
}

/* ---- 256-element super-blocks ---- */

static void deq_q2_k(const uint8_t *b, float *y)
{
    const uint8_t *scales = b, *q = b + 16;
    float d = lm_half_at(b + 80), dmin = lm_half_at(b + 82);
    int is = 0;
    for (int n = 0; n < QK_K; n += 128) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int half = 0; half < 2; half++) {
                uint8_t sc = scales[is++];
                float dl = d * (float)(sc & 0xf), ml = dmin * (float)(sc >> 4);
                for (int l = 0; l < 16; l++)
                    *y++ = dl * (float)((q[l + 16 * half] >> shift) & 3) - ml;
            }
        }
        q += 32;
    }
}

/* Q3_K packs sixteen 6-bit scales into 12 bytes: low 4 bits then high 2. */
static void q3k_scales(const uint8_t *p, int8_t out[16])
{
    for (int i = 0; i < 16; i++) {
        int low = i < 8 ? (p[i] & 0xf) : (p[i - 8] >> 4);
        int high = (p[8 + (i % 4)] >> (2 * (i / 4))) & 3;
        out[i] = (int8_t)((low | (high << 4)) - 32);
    }
}

static void deq_q3_k(const uint8_t *b, float *y)
{
    const uint8_t *hm = b, *q = b + 32;
    float d = lm_half_at(b + 108);
    int8_t sc[16];
    q3k_scales(b + 96, sc);
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < QK_K; n += 128) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int half = 0; half < 2; half++) {
                float dl = d * (float)sc[is++];
                for (int l = 0; l < 16; l++) {
                    int k = l + 16 * half;
                    int v = ((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4);
                    *y++ = dl * (float)v;
                }
            }
            m <<= 1;
        }
        q += 32;
    }
}

/* Q4_K/Q5_K: eight 6-bit (scale, min) pairs in 12 bytes. */
static void k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *mn)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
        *mn = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Q4_K and Q5_K (qh != NULL: the fifth bit of code l of pair j is bit 2j or 2j+1 of qh[l]). */
static void deq_q45_k(const uint8_t *b, const uint8_t *qh, const uint8_t *ql, float *y)
{
    float d = lm_half_at(b), dmin = lm_half_at(b + 2);
    const uint8_t *scales = b + 4;
    for (int j = 0; j < 8; j += 2) {
        uint8_t s0, m0, s1, m1;
        k4_scale_min(j, scales, &s0, &m0);
        k4_scale_min(j + 1, scales, &s1, &m1);
        float d1 = d * s0, m1f = dmin * m0, d2 = d * s1, m2f = dmin * m1;
        for (int l = 0; l < 32; l++)
            *y++ = d1 * (float)((ql[l] & 0xf) + (qh && ((qh[l] >> j) & 1) ? 16 : 0)) - m1f;
        for (int l = 0; l < 32; l++)
            *y++ = d2 * (float)((ql[l] >> 4) + (qh && ((qh[l] >> (j + 1)) & 1) ? 16 : 0)) - m2f;
        ql += 32;
    }
}

static void deq_q4_k(const uint8_t *b, float *y) { deq_q45_k(b, NULL, b + 16, y); }
static void deq_q5_k(const uint8_t *b, float *y) { deq_q45_k(b, b + 16, b + 48, y); }

static void deq_q6_k(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = lm_half_at(b + 208);
    for (int n = 0; n < QK_K; n += 128) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = (int)((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = (int)((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * (float)sc[is] * (float)q1;
            y[l + 32] = d * (float)sc[is + 2] * (float)q2;
            y[l + 64] = d * (float)sc[is + 4] * (float)q3;
            y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

typedef void (*deq_fn)(const uint8_t *, float *);

static deq_fn block_fn(uint32_t t)
{
    switch (t) {
    case LM_Q4_0: return deq_q4_0;
    case LM_Q4_1: return deq_q4_1;
    case LM_Q5_0: return deq_q5_0;
    case LM_Q5_1: return deq_q5_1;
    case LM_Q8_0: return deq_q8_0;
    case LM_Q2_K: return deq_q2_k;
    case LM_Q3_K: return deq_q3_k;
    case LM_Q4_K: return deq_q4_k;
    case LM_Q5_K: return deq_q5_k;
    case LM_Q6_K: return deq_q6_k;
    default: return NULL;
    }
}

void lm_dequant_row(uint32_t type, const void *src, float *dst, int64_t n)
{
    const uint8_t *p = src;
    switch (type) {
    case LM_F32:
        memcpy(dst, src, (size_t)n * 4);
        return;
    case LM_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = lm_half_at(p + 2 * i);
        return;
    case LM_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = lm_bf16_to_f32(h);
        }
        return;
    default: {
        deq_fn f = block_fn(type);
        int64_t bk = TYPES[type].block;
        size_t bs = TYPES[type].size;
        for (int64_t i = 0; i < n / bk; i++)
            f(p + (size_t)i * bs, dst + i * bk);
    }
    }
}
