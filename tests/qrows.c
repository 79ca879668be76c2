/*
 * tests/qrows.c - random valid quantized rows, and the buffers of the
 * scalar reference decode (see qrows.h).
 */
#include "qrows.h"

#include <math.h>
#include <stdio.h>

#include <string.h>

void put_half(uint8_t *p, float f)
{
    uint16_t h = lm_f32_to_f16(f);
    memcpy(p, &h, 2);
}

/* Random bytes make valid blocks of every type once the scales are tamed. */
void random_row(uint32_t type, uint8_t *b, size_t n, uint64_t *seed)
{
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
        b[i] = (uint8_t)(*seed >> 56);
    }
    size_t bs = lm_type_size(type);
    for (size_t off = 0; off < n; off += bs) { /* f16 scales: small and finite */
        static const int at[][2] = {{LM_Q4_0, 0}, {LM_Q4_1, 0}, {LM_Q4_1, 2}, {LM_Q5_0, 0},
                                    {LM_Q5_1, 0}, {LM_Q5_1, 2}, {LM_Q8_0, 0}, {LM_Q2_K, 80},
                                    {LM_Q2_K, 82}, {LM_Q3_K, 108}, {LM_Q4_K, 0}, {LM_Q4_K, 2},
                                    {LM_Q5_K, 0}, {LM_Q5_K, 2}, {LM_Q6_K, 208}};
        for (size_t k = 0; k < sizeof at / sizeof at[0]; k++)
            if ((uint32_t)at[k][0] == type)
                put_half(b + off + at[k][1], 0.01f * (float)(b[off] % 7 + 1));
    }
    if (type == LM_F16)
        for (size_t i = 0; i < n; i += 2)
            put_half(b + i, (float)((int)b[i] - 128) / 64.0f);
    if (type == LM_BF16)
        for (size_t i = 0; i < n; i += 2)
            b[i + 1] = (uint8_t)(0x3c + (b[i + 1] & 1)), b[i] &= 0x7f;
}

const uint32_t ALL_TYPES[N_ALL_TYPES] = {LM_F32, LM_F16, LM_BF16, LM_Q4_0, LM_Q4_1, LM_Q5_0,
                                     LM_Q5_1, LM_Q8_0, LM_Q2_K, LM_Q3_K, LM_Q4_K, LM_Q5_K, LM_Q6_K};
void qrow_init(qrow_buf *b)
{
    memset(b, 0, sizeof *b);
    b->r = (qrow){0, 0, b->f, b->u, b->sc4, b->mn, b->d, b->m, b->s8, b->corr16};
}

void test_row(uint32_t ty, uint8_t *row, int k, uint64_t *seed)
{
    random_row(ty, row, lm_row_bytes(ty, k), seed);
    if (ty == LM_F32)
        for (int i = 0; i < k; i++)
            ((float *)row)[i] = (float)(i % 17 - 8) * 0.125f;
}

/* K activations: ties, NaN, infinities, an all-zero block, +max and -max both, tiny scales. */
static void act_edge_input(float *x)
{
    for (int i = 0; i < K; i++)
        x[i] = sinf((float)i * 1.7f) * (float)(1 + i % 9) * 3.0f;
    for (int i = 256; i < 288; i++) /* an all-zero block and super-block start */
        x[i] = 0.0f;
    x[300] = 0.5f * 127.0f / 8.0f, x[301] = -8.0f, x[302] = 8.0f; /* a tie and both signs of max */
    x[400] = __builtin_nanf(""), x[520] = __builtin_inff(), x[700] = -__builtin_inff();
    for (int i = 608; i < 672; i++) /* scales below f16's normal range */
        x[i] = (float)(i % 7 - 3) * (i < 640 ? 1e-6f : 3e-5f);
}

int act_rounding_check(quantize_fn fn, char *msg, size_t cap)
{
    static const uint32_t types[] = {LM_Q4_0, LM_Q5_0, LM_Q8_0, LM_Q2_K, LM_Q3_K, LM_Q4_K, LM_Q6_K};
    static float x[K];
    static uint8_t want[K * 8] __attribute__((aligned(64))), got[K * 8] __attribute__((aligned(64)));
    int bad = 0;
    act_edge_input(x);
    for (int ti = 0; ti < 7; ti++)
        for (int k = K; k >= K - 32; k -= 32) {
            uint32_t ty = types[ti];
            if (k % lm_type_block(ty))
                continue;
            size_t n = lm_act_row_bytes(lm_act_type(ty), k), at = 0;
            memset(want, 0, n), memset(got, 0, n);
            lm_quantize_act(ty, x, want, k);
            int took = fn(ty, x, got, k);
            while (took && at < n && want[at] == got[at])
                at++;
            if ((!took || at < n) && !bad++)
                snprintf(msg, cap, took ? "%s k=%d: byte %zu is %u, scalar %u" : "%s k=%d: not taken",
                         lm_type_name(ty), k, at, got[at], want[at]);
        }
    return bad;
}
