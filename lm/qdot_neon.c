/*
 * lm/qdot_neon.c - the aarch64 fast paths of qdot.c: the dot products of a
 * decoded row with a quantized activation row, on NEON with the dot-product
 * instructions (SDOT, ARMv8.2), chosen at run time.
 *
 * Like qdot_simd.c on x86, every function computes exactly what its scalar
 * twin computes: the same exact integer sums (their order is free), then
 * the same fused multiply-adds into the same lanes, added by the same tree,
 * so the logits do not depend on the CPU; tests/aarch64/ holds them to the
 * scalar bytes under qemu.  The rows are still decoded by the portable
 * code (qdot.c); a build for the plain ARMv8 baseline keeps running on
 * cores without SDOT, which take the scalar path.
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

int lm_cpu_neon_dot(void)
{
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
}

/* The exact sum of (u - off) * a over 32 codes, as 4 partial lanes. */
NEON_DOT static inline int32x4_t dot32(const uint8_t *u, const int8_t *a, uint8x16_t off)
{
    int8x16_t q0 = vreinterpretq_s8_u8(vsubq_u8(vld1q_u8(u), off));
    int8x16_t q1 = vreinterpretq_s8_u8(vsubq_u8(vld1q_u8(u + 16), off));
    int32x4_t s = vdotq_s32(vdupq_n_s32(0), q0, vld1q_s8(a));
    return vdotq_s32(s, q1, vld1q_s8(a + 16));
}

/*
 * 32-element blocks: four blocks at a time, their exact sums side by side,
 * scaled into lanes b % 16 (four vectors of four) as lm_dot_b32_scalar does.
 */
NEON_DOT float lm_dot_b32_neon(const qrow *w, const act_row *a)
{
    const uint8x16_t off = vdupq_n_u8((uint8_t)lm_code_offset(w->type));
    const int64_t nb = w->k / 32;
    float acc[16] = {0}, mins = 0.0f;
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        int32x4_t s[4];
        for (int i = 0; i < 4; i++)
            s[i] = dot32(w->u + (b + i) * 32, a->qs + (b + i) * 32, off);
        int32x4_t tot = vpaddq_s32(vpaddq_s32(s[0], s[1]), vpaddq_s32(s[2], s[3]));
        float32x4_t dd = vmulq_f32(vld1q_f32(w->d + b), vld1q_f32(a->d + b));
        float *lane = acc + b % 16;
        vst1q_f32(lane, vfmaq_f32(vld1q_f32(lane), dd, vcvtq_f32_s32(tot)));
    }
    for (; b < nb; b++) {
        int32_t tot = vaddvq_s32(dot32(w->u + b * 32, a->qs + b * 32, off));
        acc[b % 16] = fmaf(w->d[b] * a->d[b], (float)tot, acc[b % 16]);
    }
    if (w->type == LM_Q4_1 || w->type == LM_Q5_1)
        for (b = 0; b < nb; b++)
            mins = fmaf(w->m[b], a->s[b], mins);
    return lm_hsum16(acc) + mins;
}

/*
 * 256-element super-blocks: each 4 codes' sum times its group scale, summed
 * exactly, then lm_dot_k_scalar's one multiply-add per super-block.
 */
NEON_DOT float lm_dot_k_neon(const qrow *w, const act_row *a)
{
    const uint8x16_t off = vdupq_n_u8((uint8_t)lm_code_offset(w->type));
    float acc = 0.0f, mins = 0.0f;
    for (int64_t b = 0; b < w->k / 256; b++) {
        int32x4_t sum = vdupq_n_s32(0);
        for (int64_t e = b * 256; e < (b + 1) * 256; e += 16) {
            int8x16_t q = vreinterpretq_s8_u8(vsubq_u8(vld1q_u8(w->u + e), off));
            int32x4_t fours = vdotq_s32(vdupq_n_s32(0), q, vld1q_s8(a->qs + e));
            sum = vmlaq_s32(sum, vld1q_s32(w->sc4 + e / 4), fours);
        }
        acc = fmaf(w->d[b] * a->d[b], (float)vaddvq_s32(sum), acc);
        mins += lm_k_mins(w, a, b);
    }
    return acc - mins;
}

/* Float rows: element i into lane i % 16, fused, then the fixed tree. */
NEON_DOT float lm_dot_f_neon(const float *x, const float *y, int64_t n)
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

int lm_cpu_neon_dot(void) { return 0; }
float lm_dot_b32_neon(const qrow *w, const act_row *a) { return lm_dot_b32_scalar(w, a); }
float lm_dot_k_neon(const qrow *w, const act_row *a) { return lm_dot_k_scalar(w, a); }
float lm_dot_f_neon(const float *x, const float *y, int64_t n) { return lm_dot_f_scalar(x, y, n); }

#endif
