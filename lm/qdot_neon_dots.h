/*
 * lm/qdot_neon_dots.h - the bodies of qdot_neon.c's integer dot products,
 * included there twice: with SDOT (ARMv8.2) and without it (ARMv8.0), as
 * a function takes SDOT's target whole or not at all.  The includer
 * defines DOTS_ATTR (the target attribute, or nothing), DOT4(acc, a, b)
 * (acc plus the sums of each 4 byte products, lane by lane) and
 * DOTS(name) (the names this copy defines).  Either way the integer sums
 * are exact and the float steps are lm_dot_*_scalar's.
 */

/* The exact sum of (u - off) * a over 32 codes, as 4 partial lanes. */
DOTS_ATTR static inline int32x4_t DOTS(dot32)(const uint8_t *u, const int8_t *a, uint8x16_t off)
{
    int8x16_t q0 = vreinterpretq_s8_u8(vsubq_u8(vld1q_u8(u), off));
    int8x16_t q1 = vreinterpretq_s8_u8(vsubq_u8(vld1q_u8(u + 16), off));
    int32x4_t s = DOT4(vdupq_n_s32(0), q0, vld1q_s8(a));
    return DOT4(s, q1, vld1q_s8(a + 16));
}

/*
 * 32-element blocks: four blocks at a time, their exact sums side by side,
 * scaled into lanes b % 16 (four vectors of four) as lm_dot_b32_scalar does.
 */
DOTS_ATTR float DOTS(lm_dot_b32_neon)(const qrow *w, const act_row *a)
{
    const uint8x16_t off = vdupq_n_u8((uint8_t)lm_code_offset(w->type));
    const int64_t nb = w->k / 32;
    float acc[16] = {0}, mins = 0.0f;
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        int32x4_t s[4];
        for (int i = 0; i < 4; i++)
            s[i] = DOTS(dot32)(w->u + (b + i) * 32, a->qs + (b + i) * 32, off);
        int32x4_t tot = vpaddq_s32(vpaddq_s32(s[0], s[1]), vpaddq_s32(s[2], s[3]));
        float32x4_t dd = vmulq_f32(vld1q_f32(w->d + b), vld1q_f32(a->d + b));
        float *lane = acc + b % 16;
        vst1q_f32(lane, vfmaq_f32(vld1q_f32(lane), dd, vcvtq_f32_s32(tot)));
    }
    for (; b < nb; b++) {
        int32_t tot = vaddvq_s32(DOTS(dot32)(w->u + b * 32, a->qs + b * 32, off));
        acc[b % 16] = fmaf(w->d[b] * a->d[b], (float)tot, acc[b % 16]);
    }
    if (w->type == LM_Q4_1 || w->type == LM_Q5_1)
        for (b = 0; b < nb; b++)
            mins = fmaf(w->m[b], a->s[b], mins);
    return lm_hsum16(acc) + mins;
}

/*
 * 256-element super-blocks: each 4 codes' sum times its group scale, summed
 * exactly, then lm_dot_k_scalar's one multiply-add per super-block into its lane.
 */
DOTS_ATTR float DOTS(lm_dot_k_neon)(const qrow *w, const act_row *a)
{
    const uint8x16_t off = vdupq_n_u8((uint8_t)lm_code_offset(w->type));
    float acc[LM_K_LANES] = {0}, mins[LM_K_LANES] = {0};
    for (int64_t b = 0; b < w->k / 256; b++) {
        int32x4_t sum = vdupq_n_s32(0);
        for (int64_t e = b * 256; e < (b + 1) * 256; e += 16) {
            int8x16_t q = vreinterpretq_s8_u8(vsubq_u8(vld1q_u8(w->u + e), off));
            int32x4_t fours = DOT4(vdupq_n_s32(0), q, vld1q_s8(a->qs + e));
            sum = vmlaq_s32(sum, vld1q_s32(w->sc4 + e / 4), fours);
        }
        acc[b % LM_K_LANES] = fmaf(w->d[b] * a->d[b], (float)vaddvq_s32(sum), acc[b % LM_K_LANES]);
        mins[b % LM_K_LANES] += lm_k_mins(w, a, b);
    }
    return lm_k_total(acc, mins);
}

/*
 * Four tokens through one decoded row: each block's codes are loaded and
 * offset once for all four, and each token's sums take exactly the steps
 * of DOTS(lm_dot_b32_neon) (its own lanes b % 16, the same tree).
 * out[t * ld] gets token t's dot.
 */
DOTS_ATTR static void DOTS(dot_b32_x4)(const qrow *w, const act_row *a, float *out, size_t ld)
{
    const uint8x16_t off = vdupq_n_u8((uint8_t)lm_code_offset(w->type));
    const int64_t nb = w->k / 32;
    float acc[4][16] = {{0}}, mins[4] = {0};
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        int32x4_t s[4][4];
        for (int i = 0; i < 4; i++) {
            const uint8_t *u = w->u + (b + i) * 32;
            int8x16_t q0 = vreinterpretq_s8_u8(vsubq_u8(vld1q_u8(u), off));
            int8x16_t q1 = vreinterpretq_s8_u8(vsubq_u8(vld1q_u8(u + 16), off));
            for (int t = 0; t < 4; t++) {
                const int8_t *x = a[t].qs + (b + i) * 32;
                s[t][i] = DOT4(DOT4(vdupq_n_s32(0), q0, vld1q_s8(x)), q1, vld1q_s8(x + 16));
            }
        }
        const float32x4_t wd = vld1q_f32(w->d + b);
        for (int t = 0; t < 4; t++) {
            int32x4_t tot = vpaddq_s32(vpaddq_s32(s[t][0], s[t][1]), vpaddq_s32(s[t][2], s[t][3]));
            float *lane = acc[t] + b % 16;
            vst1q_f32(lane, vfmaq_f32(vld1q_f32(lane), vmulq_f32(wd, vld1q_f32(a[t].d + b)), vcvtq_f32_s32(tot)));
        }
    }
    for (; b < nb; b++)
        for (int t = 0; t < 4; t++) {
            int32_t tot = vaddvq_s32(DOTS(dot32)(w->u + b * 32, a[t].qs + b * 32, off));
            acc[t][b % 16] = fmaf(w->d[b] * a[t].d[b], (float)tot, acc[t][b % 16]);
        }
    for (int t = 0; t < 4; t++) {
        if (w->type == LM_Q4_1 || w->type == LM_Q5_1)
            for (b = 0; b < nb; b++)
                mins[t] = fmaf(w->m[b], a[t].s[b], mins[t]);
        out[(size_t)t * ld] = lm_hsum16(acc[t]) + mins[t];
    }
}

/* DOTS(lm_dot_k_neon) for four tokens, each block's codes and group scales loaded once. */
DOTS_ATTR static void DOTS(dot_k_x4)(const qrow *w, const act_row *a, float *out, size_t ld)
{
    const uint8x16_t off = vdupq_n_u8((uint8_t)lm_code_offset(w->type));
    float acc[4][LM_K_LANES] = {{0}}, mins[4][LM_K_LANES] = {{0}};
    for (int64_t b = 0; b < w->k / 256; b++) {
        int32x4_t sum[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
        for (int64_t e = b * 256; e < (b + 1) * 256; e += 16) {
            const int8x16_t q = vreinterpretq_s8_u8(vsubq_u8(vld1q_u8(w->u + e), off));
            const int32x4_t sc = vld1q_s32(w->sc4 + e / 4);
            for (int t = 0; t < 4; t++)
                sum[t] = vmlaq_s32(sum[t], sc, DOT4(vdupq_n_s32(0), q, vld1q_s8(a[t].qs + e)));
        }
        for (int t = 0; t < 4; t++) {
            acc[t][b % LM_K_LANES] = fmaf(w->d[b] * a[t].d[b], (float)vaddvq_s32(sum[t]), acc[t][b % LM_K_LANES]);
            mins[t][b % LM_K_LANES] += lm_k_mins(w, &a[t], b);
        }
    }
    for (int t = 0; t < 4; t++)
        out[(size_t)t * ld] = lm_k_total(acc[t], mins[t]);
}

/* Four tokens through a decoded row of an integer-dot type; 0 for the others (float rows). */
DOTS_ATTR int DOTS(lm_dot4_neon)(const qrow *w, const act_row *a, float *out, size_t ld)
{
    switch (lm_act_type(w->type)) {
    case LM_Q8_0:
    case LM_Q8_1:
        DOTS(dot_b32_x4)(w, a, out, ld);
        return 1;
    case LM_Q8_K:
        DOTS(dot_k_x4)(w, a, out, ld);
        return 1;
    default:
        return 0;
    }
}
