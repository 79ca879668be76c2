/*
 * lm/qdot.c - quantized dot products the way llama.cpp rounds them.
 *
 * llama.cpp never multiplies a quantized weight by an f32 activation: it
 * first rounds the activation row to the weight type's "vec_dot_type"
 * (Q8_0, Q8_1 or Q8_K: 8-bit codes with a per-block scale; F16 or BF16 for
 * half-precision weights) and sums integer products block by block.  We do
 * the same rounding with the same scale formulas, so our logits are
 * llama.cpp's up to the order of float additions.
 *
 * Layouts are our own, built for SIMD (see internal.h):
 *   weights     a row decodes once into unsigned 8-bit codes u = q + off,
 *               one int32 scale per 4 codes (K-quants), and block scales;
 *   activations signed 8-bit codes, block scales (also one per 4 codes),
 *               and the sums of 16 codes (for the K-quant mins).
 * Integer sums are exact, so the SIMD paths may regroup them freely (they
 * multiply a + 128 by u - off and subtract 128 * sum(u - off) per lane).
 * Each 32-element block or K-quant super-block is summed to one integer
 * first; blocks then accumulate in 16 float lanes (block b in lane b % 16)
 * with a fixed tree at the end, super-blocks in one sum, in order.  The scalar, AVX2 and AVX-512 paths
 * (qdot_simd.c) do exactly these operations, so all three agree bit for bit
 * and the result never depends on the batch or the thread split.
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

/* The constant added to a type's codes to make them unsigned. */
int lm_code_offset(uint32_t wtype)
{
    switch (wtype) {
    case LM_Q4_0: return 8;
    case LM_Q5_0: return 16;
    case LM_Q8_0: return 128;
    case LM_Q3_K: return 4;
    case LM_Q6_K: return 32;
    default: return 0;
    }
}

/* One activation row: codes, then per-block floats, group sums and corrections. */
void lm_act_layout(int atype, int64_t k, act_row *r, void *base)
{
    uint8_t *p = base;
    int64_t nb = k / (atype == LM_Q8_K ? QK_K : QK);
    r->k = k;
    r->qs = (int8_t *)p;
    p += (k + 63) / 64 * 64;
    r->d = (float *)p;
    p += nb * sizeof(float);
    r->s = (float *)p;
    p += nb * sizeof(float);
    r->sum16 = (int16_t *)p;
    p += (k / 16) * sizeof(int16_t);
    p = (uint8_t *)(((uintptr_t)p + 63) & ~(uintptr_t)63);
    r->negcorr = (int32_t *)p;
    p += (k / 4) * sizeof(int32_t);
    p = (uint8_t *)(((uintptr_t)p + 63) & ~(uintptr_t)63);
    r->qw = (int8_t *)p;
    r->ncw = (int32_t *)(p + (k / QK + 15) / 16 * 512);
    r->dt = (float *)(p + (k / QK + 15) / 16 * (512 + 256));
    r->windows = r->nibbles = r->lanes = r->klanes = 0;
    r->ahead = LM_AHEAD_ONE;
    r->f = (float *)base;
}

size_t lm_act_row_bytes(int atype, int64_t k)
{
    if (atype == LM_F32 || atype == LM_F16 || atype == LM_BF16)
        return ((size_t)k * sizeof(float) + 63) / 64 * 64;
    int64_t nb = k / QK;
    size_t n = (size_t)(k + 63) / 64 * 64 + 2 * (size_t)nb * 4 + (size_t)(k / 16) * 2 + 64;
    n += (size_t)(k / 4) * 4 + 64;              /* negcorr */
    n += (size_t)(nb + 15) / 16 * (512 + 256 + 64); /* qw, ncw, dt: whole steps of 16 blocks */
    return (n + 63) / 64 * 64;
}

/* ------------------------------------------------ activation rounding */

static float abs_max(const float *x, int n)
{
    float m = 0.0f;
    for (int i = 0; i < n; i++)
        m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

/* A rounded value as an 8-bit code: finite values are within [-127, 127] by
 * construction; NaN (from NaN weights in a hostile file) becomes 0. */
static int8_t code8(float v)
{
    if (v >= 127.0f)
        return 127;
    if (v <= -128.0f)
        return -128;
    return v == v ? (int8_t)v : 0;
}

/* Q8_0 / Q8_1: d = max/127 rounded to f16, codes round(x * 127/max), ties to even. */
static void quant_b32(const float *x, act_row *r, int64_t b, int with_sum)
{
    float amax = abs_max(x, QK), d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int8_t *qs = r->qs + b * QK;
    int sum = 0;
    for (int j = 0; j < QK; j++) {
        qs[j] = code8(nearbyintf(x[j] * id));
        sum += qs[j];
    }
    r->d[b] = lm_f16_to_f32(lm_f32_to_f16(d));
    r->s[b] = with_sum ? lm_f16_to_f32(lm_f32_to_f16(d * (float)sum)) : 0.0f;
}

/* Q8_K: the scale comes from the signed value of largest magnitude; d = 1/iscale. */
static void quant_k(const float *x, act_row *r, int64_t b)
{
    float amax = 0.0f, max = 0.0f;
    int8_t *qs = r->qs + b * QK_K;
    for (int j = 0; j < QK_K; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    if (amax == 0.0f) {
        memset(qs, 0, QK_K);
        r->d[b] = 0.0f;
        return;
    }
    float iscale = -127.0f / max;
    for (int j = 0; j < QK_K; j++)
        qs[j] = code8(nearbyintf(iscale * x[j]));
    r->d[b] = 1.0f / iscale;
}

static void half_round(int atype, const float *x, float *f, int64_t k)
{
    for (int64_t i = 0; i < k; i++) {
        if (atype == LM_F16) {
            f[i] = lm_f16_to_f32(lm_f32_to_f16(x[i]));
        } else if (atype == LM_BF16) {
            uint32_t u;
            memcpy(&u, &x[i], 4);
            if ((u & 0x7fffffff) <= 0x7f800000) /* not NaN: round to nearest even */
                u += 0x7fff + ((u >> 16) & 1);
            f[i] = lm_bf16_to_f32((uint16_t)(u >> 16));
        } else {
            f[i] = x[i];
        }
    }
}

void lm_quantize_act(uint32_t wtype, const float *x, void *dst, int64_t k)
{
    int atype = lm_act_type(wtype);
    act_row r;
    lm_act_layout(atype, k, &r, dst);
    if (atype == LM_F32 || atype == LM_F16 || atype == LM_BF16) {
        half_round(atype, x, r.f, k);
        return;
    }
    if (atype == LM_Q8_K)
        for (int64_t b = 0; b < k / QK_K; b++)
            quant_k(x + b * QK_K, &r, b);
    else
        for (int64_t b = 0; b < k / QK; b++)
            quant_b32(x + b * QK, &r, b, atype == LM_Q8_1);
    for (int64_t g = 0; g < k / 16; g++) {
        int s = 0;
        for (int j = 0; j < 16; j++)
            s += r.qs[16 * g + j];
        r.sum16[g] = (int16_t)s;
    }
    int off = lm_code_offset(wtype);
    for (int64_t l = 0; l < k / 4; l++) { /* per lane of 4 codes, for SIMD */
        const int8_t *q = r.qs + 4 * l;
        r.negcorr[l] = -off * (q[0] + q[1] + q[2] + q[3]);
    }
}

/* --------------------------------------------------- weight row decode */

/* 32-element blocks: codes, scale d and (Q4_1/Q5_1) offset m per block. */
static void decode_b32(uint32_t t, const uint8_t *b, uint8_t *u, float *d, float *m)
{
    *d = lm_half_at(b);
    *m = 0.0f;
    if (t == LM_Q8_0) {
        for (int j = 0; j < QK; j++)
            u[j] = (uint8_t)(b[2 + j] ^ 0x80); /* q + 128 */
        return;
    }
    const uint8_t *qs = b + 2;
    uint32_t qh = 0;
    if (t == LM_Q4_1) {
        *m = lm_half_at(b + 2), qs = b + 4;
    } else if (t == LM_Q5_0) {
        memcpy(&qh, b + 2, 4), qs = b + 6;
    } else if (t == LM_Q5_1) {
        *m = lm_half_at(b + 2), memcpy(&qh, b + 4, 4), qs = b + 8;
    }
    for (int j = 0; j < QK / 2; j++) {
        u[j] = (uint8_t)((qs[j] & 0xf) | (((qh >> j) << 4) & 0x10));
        u[j + QK / 2] = (uint8_t)((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10));
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

/* Sixteen scales and mins of a super-block. */
void lm_k_scales(uint32_t t, const uint8_t *b, int *sc, int *mn)
{
    memset(mn, 0, 16 * sizeof *mn);
    if (t == LM_Q2_K) {
        for (int g = 0; g < 16; g++)
            sc[g] = b[g] & 0xf, mn[g] = b[g] >> 4;
    } else if (t == LM_Q3_K) {
        const uint8_t *p = b + 96;
        for (int g = 0; g < 16; g++) {
            int low = g < 8 ? (p[g] & 0xf) : (p[g - 8] >> 4);
            sc[g] = (low | (((p[8 + g % 4] >> (2 * (g / 4))) & 3) << 4)) - 32;
        }
    } else if (t == LM_Q4_K || t == LM_Q5_K) {
        for (int j = 0; j < 8; j++) {
            k4_scale_min(j, b + 4, &sc[2 * j], &mn[2 * j]);
            sc[2 * j + 1] = sc[2 * j], mn[2 * j + 1] = mn[2 * j];
        }
    } else { /* Q6_K */
        for (int g = 0; g < 16; g++)
            sc[g] = (int8_t)b[192 + g];
    }
}

/*
 * The 256 unsigned codes of a super-block (code + lm_code_offset).  Q4_K
 * and Q6_K, which the weights' copy also rearranges (repack.c), go byte by
 * byte: a code at a time through the general form ran the copy at a fifth
 * of the speed.  u never overlaps b (restrict: without it the byte loops
 * were not vectorized, 0.9 GB/s against 1.5-1.8).
 */
void lm_k_codes(uint32_t t, const uint8_t *restrict b, uint8_t *restrict u)
{
    if (t == LM_Q4_K) { /* bytes 32p + l: codes 64p + l (low nibble) and 64p + 32 + l (high) */
        for (int p = 0; p < 4; p++)
            for (int l = 0; l < 32; l++) {
                const uint8_t x = b[16 + 32 * p + l];
                u[64 * p + l] = x & 15, u[64 * p + 32 + l] = x >> 4;
            }
        return;
    }
    if (t == LM_Q6_K) { /* each half's quarters: low bits from bytes l, 32 + l, top bits from qh byte l */
        for (int n = 0; n < 2; n++)
            for (int l = 0; l < 32; l++) {
                const uint8_t x = b[64 * n + l], y = b[64 * n + 32 + l], h = b[128 + 32 * n + l];
                u[128 * n + l] = (uint8_t)((x & 15) | (h & 3) << 4);
                u[128 * n + 32 + l] = (uint8_t)((y & 15) | (h >> 2 & 3) << 4);
                u[128 * n + 64 + l] = (uint8_t)((x >> 4) | (h >> 4 & 3) << 4);
                u[128 * n + 96 + l] = (uint8_t)((y >> 4) | (h >> 6) << 4);
            }
        return;
    }
    for (int i = 0; i < QK_K; i++) {
        int n = i / 128, j = (i % 128) / 32, l = i % 32, v;
        if (t == LM_Q2_K) {
            v = (b[16 + 32 * n + l] >> (2 * j)) & 3;
        } else if (t == LM_Q3_K) {
            v = ((b[32 + 32 * n + l] >> (2 * j)) & 3) + (((b[l] >> (4 * n + j)) & 1) << 2);
        } else { /* Q5_K */
            int pair = i / 64, hi = (i % 64) / 32;
            v = (b[48 + 32 * pair + l] >> (4 * hi)) & 0xf;
            if ((b[16 + l] >> (2 * pair + hi)) & 1)
                v += 16;
        }
        u[i] = (uint8_t)v;
    }
}

/* Scales, mins and block factors of super-block i (the codes are separate). */
void lm_k_scales_decode(qrow *r, uint32_t t, const uint8_t *b, int64_t i)
{
    int sc[16], mn[16];
    lm_k_scales(t, b, sc, mn);
    for (int g = 0; g < 16; g++) {
        r->mn[i * 16 + g] = (int16_t)mn[g];
        for (int j = 0; j < 4; j++)
            r->sc4[i * 64 + 4 * g + j] = sc[g];
    }
    r->d[i] = lm_half_at(b + lm_k_d_at(t));
    r->m[i] = lm_k_m_at(t) ? lm_half_at(b + lm_k_m_at(t)) : 0.0f;
}

static void decode_k(uint32_t t, const uint8_t *b, qrow *r, int64_t i)
{
    lm_k_scales_decode(r, t, b, i);
    lm_k_codes(t, b, r->u + i * QK_K);
}

/* A K-quant row: scales by lm_k_scales_decode, codes by a vector decoder's codes(). */
void lm_qrow_decode_k_with(qrow *r, uint32_t type, const uint8_t *src, int64_t k, lm_k_codes_fn codes)
{
    size_t bs = lm_type_size(type);
    for (int64_t i = 0; i < k / QK_K; i++) {
        const uint8_t *blk = src + (size_t)i * bs;
        lm_k_scales_decode(r, type, blk, i);
        codes(type, blk, r->u + i * QK_K);
    }
}

void lm_qrow_decode_scalar(qrow *r, uint32_t type, const void *src, int64_t k)
{
    const uint8_t *b = src;
    size_t bs = lm_type_size(type);
    r->type = type;
    r->k = k;
    switch (lm_act_type(type)) {
    case LM_F32:
    case LM_F16:
    case LM_BF16:
        lm_dequant_row(type, src, r->f, k);
        return;
    case LM_Q8_0:
    case LM_Q8_1:
        for (int64_t i = 0; i < k / QK; i++)
            decode_b32(type, b + (size_t)i * bs, r->u + i * QK, &r->d[i], &r->m[i]);
        return;
    default:
        for (int64_t i = 0; i < k / QK_K; i++)
            decode_k(type, b + (size_t)i * bs, r, i);
    }
}

/* ------------------------------------------------------- dot products */

/* The fixed tree every path uses to add 16 lanes. */
float lm_hsum16(const float *a)
{
    float t8[8], t4[4];
    for (int i = 0; i < 8; i++)
        t8[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++)
        t4[i] = t8[i] + t8[i + 4];
    return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

/* Sum of (u - off) * a over the 4 codes of a lane. */
static int32_t lane(const uint8_t *u, const int8_t *a, int off)
{
    return (u[0] - off) * a[0] + (u[1] - off) * a[1] + (u[2] - off) * a[2] + (u[3] - off) * a[3];
}

/*
 * 32-element blocks: the exact integer sum of each block, scaled, goes to
 * lane b % 16, and the lanes end in the fixed tree.  One total per block
 * lets the batch kernels (qgemm.c) keep 16 tokens in the lanes instead;
 * sixteen lanes let the one-token kernel scale 16 blocks at once.  Q8_1
 * adds m*s per block.
 */
float lm_dot_b32_scalar(const qrow *w, const act_row *a)
{
    const int off = lm_code_offset(w->type);
    float acc[16] = {0}, mins = 0.0f;
    for (int64_t b = 0; b < w->k / QK; b++) {
        int32_t isum = 0;
        for (int64_t e = b * QK; e < (b + 1) * QK; e += 4)
            isum += lane(w->u + e, a->qs + e, off);
        acc[b % 16] = fmaf(w->d[b] * a->d[b], (float)isum, acc[b % 16]);
        if (w->type == LM_Q4_1 || w->type == LM_Q5_1)
            mins = fmaf(w->m[b], a->s[b], mins);
    }
    return lm_hsum16(acc) + mins;
}

/* The min term of super-block b: sum over groups of min * (sum of 16 codes). */
float lm_k_mins(const qrow *w, const act_row *a, int64_t b)
{
    int32_t msum = 0;
    for (int g = 0; g < 16; g++)
        msum += w->mn[b * 16 + g] * a->sum16[b * 16 + g];
    return (w->m[b] * a->d[b]) * (float)msum;
}

/*
 * The end of every K-quant dot: the four lanes' sums, less their mins, in
 * one fixed tree.  Lanes (super-block b in lane b % 4) let the one-token
 * kernel take a quad's four float steps in one vector multiply-add; a
 * single chain of them cost it a sixth of its time.
 */
float lm_k_total(const float *acc, const float *mins)
{
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) - ((mins[0] + mins[1]) + (mins[2] + mins[3]));
}

/*
 * 256-element super-blocks: the exact integer sum of every code times its
 * group scale, then one multiply-add per super-block into its lane.
 * Summing each super-block to one integer first lets the batch kernels
 * (qgemm.c) work on whole groups of 16 tokens and scale once per group.
 */
float lm_dot_k_scalar(const qrow *w, const act_row *a)
{
    const int off = lm_code_offset(w->type);
    float acc[LM_K_LANES] = {0}, mins[LM_K_LANES] = {0};
    for (int64_t b = 0; b < w->k / QK_K; b++) {
        int32_t isum = 0;
        for (int64_t e = b * QK_K; e < (b + 1) * QK_K; e += 4)
            isum += w->sc4[e / 4] * lane(w->u + e, a->qs + e, off);
        acc[b % LM_K_LANES] = fmaf(w->d[b] * a->d[b], (float)isum, acc[b % LM_K_LANES]);
        mins[b % LM_K_LANES] += lm_k_mins(w, a, b);
    }
    return lm_k_total(acc, mins);
}

/* Float rows: 16 lanes over consecutive elements, then the same tree. */
float lm_dot_f_scalar(const float *x, const float *y, int64_t n)
{
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++)
            acc[j] = fmaf(x[i + j], y[i + j], acc[j]);
    for (int j = 0; i < n; i++, j++)
        acc[j] = fmaf(x[i], y[i], acc[j]);
    return lm_hsum16(acc);
}

/* ------------------------------------------------------------ dispatch */

void lm_qrow_decode(qrow *r, uint32_t type, const void *src, int64_t k, int isa)
{
    if (isa >= LM_ISA_AVX2 && lm_qrow_decode_avx2(r, type, src, k))
        return;
    if (lm_isa_neon(isa) && lm_qrow_decode_neon(r, type, src, k))
        return;
    lm_qrow_decode_scalar(r, type, src, k);
}

float lm_dot_f(const float *x, const float *y, int64_t n, int isa)
{
    if (isa >= LM_ISA_AVX512)
        return lm_dot_f_avx512(x, y, n);
    if (isa == LM_ISA_AVX2)
        return lm_dot_f_avx2(x, y, n);
    return lm_isa_neon(isa) ? lm_dot_f_neon(x, y, n) : lm_dot_f_scalar(x, y, n);
}

float lm_qrow_dot(const qrow *r, const act_row *a, int isa)
{
    switch (lm_act_type(r->type)) {
    case LM_Q8_0:
    case LM_Q8_1:
        if (isa >= LM_ISA_AVX512)
            return lm_dot_b32_avx512(r, a);
        if (isa == LM_ISA_AVX2)
            return lm_dot_b32_avx2(r, a);
        return isa == LM_ISA_NEON_DOT ? lm_dot_b32_neon(r, a)
               : isa == LM_ISA_NEON   ? lm_dot_b32_neon_plain(r, a)
                                      : lm_dot_b32_scalar(r, a);
    case LM_Q8_K:
        if (isa >= LM_ISA_AVX512)
            return lm_dot_k_avx512(r, a);
        if (isa == LM_ISA_AVX2)
            return lm_dot_k_avx2(r, a);
        return isa == LM_ISA_NEON_DOT ? lm_dot_k_neon(r, a)
               : isa == LM_ISA_NEON   ? lm_dot_k_neon_plain(r, a)
                                      : lm_dot_k_scalar(r, a);
    default:
        return lm_dot_f(r->f, a->f, r->k, isa);
    }
}

void lm_qrow_dots(const qrow *r, const act_row *a, int nt, float *out, size_t ld, int isa)
{
    int t = 0; /* (x86's float rows meet several tokens in tiles: qrow_f.c) */
    if (lm_isa_neon(isa))
        for (; t + 4 <= nt; t += 4)
            if (!(isa == LM_ISA_NEON_DOT ? lm_dot4_neon : lm_dot4_neon_plain)(r, a + t, out + (size_t)t * ld, ld))
                break;
    for (; t < nt; t++)
        out[(size_t)t * ld] = lm_qrow_dot(r, &a[t], isa);
}
