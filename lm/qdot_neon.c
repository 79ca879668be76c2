/*
 * lm/qdot_neon.c - the aarch64 fast paths of qdot.c: the dot products of a
 * decoded row with a quantized activation row, on NEON with the dot-product
 * instructions (SDOT, ARMv8.2) where the core has them, found at run time,
 * and with widening multiplies and pairwise adds where it does not
 * (ARMv8.0: Cortex-A53/A72, Raspberry Pi 3 and 4).
 *
 * Like qdot_simd.c on x86, every function computes exactly what its scalar
 * twin computes: the same exact integer sums (their order is free), then
 * the same fused multiply-adds into the same lanes, added by the same tree,
 * so the logits do not depend on the CPU; tests/aarch64/ holds them to the
 * scalar bytes under qemu.  The rows of the common types (Q4_0, Q5_0,
 * Q8_0, Q4_K, Q5_K, Q6_K) are decoded with NEON too, into qdot.c's codes.
 * A build for the plain ARMv8 baseline runs on every aarch64 core.
 */
#include "internal.h"

#include <math.h>
#include <string.h>

#if defined(__aarch64__) && defined(__GNUC__)
#include <arm_neon.h>
#include <sys/auxv.h>

#define NEON_DOT __attribute__((target("arch=armv8.2-a+dotprod")))

#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif

int lm_cpu_neon(void)
{
    return 1; /* Advanced SIMD is part of every AArch64 core */
}

int lm_cpu_neon_dot(void)
{
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
}

/* ---------------------------------------------------------- decoders */

/* 32 bits -> 32 bytes of 0x00 / 0x10 (the fifth bit of Q5 codes), in bit order. */
static inline void bits32(uint32_t bits, uint8x16_t out[2])
{
    static const uint8_t pick[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t mask = vld1q_u8(pick), five = vdupq_n_u8(0x10);
    for (int h = 0; h < 2; h++) {
        uint8x16_t bytes = vcombine_u8(vdup_n_u8((uint8_t)(bits >> 16 * h)),
                                       vdup_n_u8((uint8_t)(bits >> (16 * h + 8))));
        out[h] = vandq_u8(vtstq_u8(bytes, mask), five);
    }
}

static void decode_b32_neon(qrow *r, const uint8_t *src, int64_t nb)
{
    const uint32_t t = r->type;
    const size_t bs = lm_type_size(t);
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *b = src + (size_t)i * bs;
        uint8_t *u = r->u + i * 32;
        r->d[i] = lm_half_at(b);
        r->m[i] = 0.0f;
        if (t == LM_Q8_0) { /* q + 128 */
            vst1q_u8(u, veorq_u8(vld1q_u8(b + 2), vdupq_n_u8(0x80)));
            vst1q_u8(u + 16, veorq_u8(vld1q_u8(b + 18), vdupq_n_u8(0x80)));
            continue;
        }
        uint8x16_t x = vld1q_u8(t == LM_Q4_0 ? b + 2 : b + 6), lo = vandq_u8(x, m4), hi = vshrq_n_u8(x, 4);
        if (t == LM_Q5_0) {
            uint32_t qh;
            uint8x16_t h[2];
            memcpy(&qh, b + 2, 4);
            bits32(qh, h);
            lo = vorrq_u8(lo, h[0]), hi = vorrq_u8(hi, h[1]);
        }
        vst1q_u8(u, lo);
        vst1q_u8(u + 16, hi);
    }
}

/* Q4_K, Q5_K: 4 chunks of 32 bytes, each 32 low then 32 high nibbles. */
static void codes_q45k(const uint8_t *b, uint8_t *u, int five)
{
    const uint8_t *ql = five ? b + 48 : b + 16;
    const uint8x16_t m4 = vdupq_n_u8(0x0f), one = vdupq_n_u8(1);
    for (int p = 0; p < 4; p++)
        for (int half = 0; half < 2; half++) {
            uint8x16_t x = vld1q_u8(ql + 32 * p + 16 * half), lo = vandq_u8(x, m4), hi = vshrq_n_u8(x, 4);
            if (five) { /* bit 2p of qh[l]: +16 on the low nibble's code, bit 2p+1 on the high one's */
                uint8x16_t qh = vld1q_u8(b + 16 + 16 * half);
                uint8x16_t b0 = vandq_u8(vshlq_u8(qh, vdupq_n_s8((int8_t)(-2 * p))), one);
                uint8x16_t b1 = vandq_u8(vshlq_u8(qh, vdupq_n_s8((int8_t)(-2 * p - 1))), one);
                lo = vorrq_u8(lo, vshlq_n_u8(b0, 4));
                hi = vorrq_u8(hi, vshlq_n_u8(b1, 4));
            }
            vst1q_u8(u + 64 * p + 16 * half, lo);
            vst1q_u8(u + 64 * p + 32 + 16 * half, hi);
        }
}

/* Q6_K: code = low nibble | two high bits << 4, in four 32-wide stripes per half. */
static void codes_q6k(const uint8_t *b, uint8_t *u)
{
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m3 = vdupq_n_u8(3);
    for (int n = 0; n < 2; n++)
        for (int half = 0; half < 2; half++) {
            uint8x16_t l0 = vld1q_u8(b + 64 * n + 16 * half), l1 = vld1q_u8(b + 64 * n + 32 + 16 * half);
            uint8x16_t qh = vld1q_u8(b + 128 + 32 * n + 16 * half);
            uint8x16_t low[4] = {vandq_u8(l0, m4), vandq_u8(l1, m4), vshrq_n_u8(l0, 4), vshrq_n_u8(l1, 4)};
            for (int j = 0; j < 4; j++) {
                uint8x16_t h = vandq_u8(vshlq_u8(qh, vdupq_n_s8((int8_t)(-2 * j))), m3);
                vst1q_u8(u + 128 * n + 32 * j + 16 * half, vorrq_u8(low[j], vshlq_n_u8(h, 4)));
            }
        }
}

/* A K-quant super-block's codes. */
static void k_codes(uint32_t type, const uint8_t *blk, uint8_t *u)
{
    if (type == LM_Q6_K)
        codes_q6k(blk, u);
    else
        codes_q45k(blk, u, type == LM_Q5_K);
}

/* qdot.c's decode of the common types; 0 for the others (the caller uses the scalar one). */
int lm_qrow_decode_neon(qrow *r, uint32_t type, const void *src, int64_t k)
{
    const uint8_t *b = src;
    r->type = type;
    r->k = k;
    if (type == LM_Q4_0 || type == LM_Q5_0 || type == LM_Q8_0) {
        decode_b32_neon(r, b, k / 32);
        return 1;
    }
    if (type != LM_Q4_K && type != LM_Q5_K && type != LM_Q6_K)
        return 0;
    lm_qrow_decode_k_with(r, type, b, k, k_codes);
    return 1;
}

/* ------------------------------------------------------- dot products */

/*
 * The sums of each 4 products a[4i..4i+3] * b[4i..4i+3] added to acc's
 * lanes, as one SDOT does, on cores without it (ARMv8.0: Cortex-A53/A72,
 * Raspberry Pi 3 and 4): 16-bit products (int8 * int8 fits), adjacent
 * pairs added into 32 bits, then adjacent pairs of those.  Integer sums
 * are exact, so the lanes are SDOT's bit for bit.
 */
static inline int32x4_t dot4_plain(int32x4_t acc, int8x16_t a, int8x16_t b)
{
    int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    int32x4_t hi = vpaddlq_s16(vmull_high_s8(a, b));
    return vaddq_s32(acc, vpaddq_s32(lo, hi));
}

/* The dot products twice (qdot_neon_dots.h): with SDOT, and without as *_plain. */
#define DOTS_ATTR NEON_DOT
#define DOT4 vdotq_s32
#define DOTS(name) name
#include "qdot_neon_dots.h"
#undef DOTS_ATTR
#undef DOT4
#undef DOTS
#define DOTS_ATTR
#define DOT4 dot4_plain
#define DOTS(name) name##_plain
#include "qdot_neon_dots.h"
#undef DOTS_ATTR
#undef DOT4
#undef DOTS

/* Float rows: element i into lane i % 16, fused, then the fixed tree. */
float lm_dot_f_neon(const float *x, const float *y, int64_t n)
{
    float32x4_t v[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 4; j++)
            v[j] = vfmaq_f32(v[j], vld1q_f32(x + i + 4 * j), vld1q_f32(y + i + 4 * j));
    float acc[16];
    for (int j = 0; j < 4; j++)
        vst1q_f32(acc + 4 * j, v[j]);
    for (int j = 0; i < n; i++, j++)
        acc[j] = fmaf(x[i], y[i], acc[j]);
    return lm_hsum16(acc);
}

#else /* not aarch64: never chosen, the scalar twins stand in */

int lm_cpu_neon(void) { return 0; }
int lm_cpu_neon_dot(void) { return 0; }
int lm_qrow_decode_neon(qrow *r, uint32_t type, const void *src, int64_t k)
{
    (void)r, (void)type, (void)src, (void)k;
    return 0;
}
float lm_dot_b32_neon(const qrow *w, const act_row *a) { return lm_dot_b32_scalar(w, a); }
float lm_dot_k_neon(const qrow *w, const act_row *a) { return lm_dot_k_scalar(w, a); }
float lm_dot_b32_neon_plain(const qrow *w, const act_row *a) { return lm_dot_b32_scalar(w, a); }
float lm_dot_k_neon_plain(const qrow *w, const act_row *a) { return lm_dot_k_scalar(w, a); }
int lm_dot4_neon(const qrow *w, const act_row *a, float *out, size_t ld)
{
    (void)w, (void)a, (void)out, (void)ld;
    return 0;
}
int lm_dot4_neon_plain(const qrow *w, const act_row *a, float *out, size_t ld)
{
    (void)w, (void)a, (void)out, (void)ld;
    return 0;
}
float lm_dot_f_neon(const float *x, const float *y, int64_t n) { return lm_dot_f_scalar(x, y, n); }

#endif
