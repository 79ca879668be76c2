/*
 * tests/test_quant.c - known answers for every tensor type: blocks packed
 * by hand from chosen integer codes and scales, dequantized, and compared
 * with the value the format defines for each element.
 */
#include "util.h"
#include "../lm/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void put_half(uint8_t *p, float f)
{
    uint16_t h = lm_f32_to_f16(f);
    memcpy(p, &h, 2);
}

static void expect_row(uint32_t type, const uint8_t *blk, const float *want, int n)
{
    float got[256];
    lm_dequant_row(type, blk, got, n);
    for (int i = 0; i < n; i++)
        ck_assert_msg(fabsf(got[i] - want[i]) < 1e-6f, "%s element %d: got %g want %g",
                      lm_type_name(type), i, got[i], want[i]);
}

START_TEST(test_q8_0)
{
    uint8_t b[34];
    float want[32];
    put_half(b, 0.5f);
    for (int j = 0; j < 32; j++) {
        b[2 + j] = (uint8_t)(int8_t)(j - 16);
        want[j] = 0.5f * (float)(j - 16);
    }
    expect_row(LM_Q8_0, b, want, 32);
}
END_TEST

START_TEST(test_q4_0_q4_1)
{
    uint8_t b0[18], b1[20];
    float w0[32], w1[32];
    put_half(b0, 2.0f);
    put_half(b1, 0.5f);
    put_half(b1 + 2, -1.0f);
    for (int j = 0; j < 16; j++) {
        b0[2 + j] = b1[4 + j] = (uint8_t)(j | ((15 - j) << 4));
        w0[j] = 2.0f * (float)(j - 8);
        w0[j + 16] = 2.0f * (float)(7 - j);
        w1[j] = 0.5f * (float)j - 1.0f;
        w1[j + 16] = 0.5f * (float)(15 - j) - 1.0f;
    }
    expect_row(LM_Q4_0, b0, w0, 32);
    expect_row(LM_Q4_1, b1, w1, 32);
}
END_TEST

START_TEST(test_q5_0_q5_1)
{
    uint8_t b0[22], b1[24];
    float w0[32], w1[32];
    uint32_t qh = 0xAAAAAAAAu; /* fifth bit set on odd elements */
    put_half(b0, 1.0f);
    memcpy(b0 + 2, &qh, 4);
    put_half(b1, 1.0f);
    put_half(b1 + 2, 0.5f);
    memcpy(b1 + 4, &qh, 4);
    for (int j = 0; j < 16; j++) {
        b0[6 + j] = b1[8 + j] = (uint8_t)(j | (j << 4));
        int v = j | ((j & 1) ? 16 : 0);
        w0[j] = w0[j + 16] = (float)(v - 16);
        w1[j] = w1[j + 16] = (float)v + 0.5f;
    }
    expect_row(LM_Q5_0, b0, w0, 32);
    expect_row(LM_Q5_1, b1, w1, 32);
}
END_TEST

START_TEST(test_q2_k)
{
    uint8_t b[84];
    float want[256];
    for (int i = 0; i < 16; i++)
        b[i] = (uint8_t)(i | (1 << 4));        /* scale i, min 1 */
    memset(b + 16, 0xE4, 64);                  /* 2-bit codes 0,1,2,3 by shift */
    put_half(b + 80, 1.0f);
    put_half(b + 82, 0.5f);
    for (int n = 0; n < 2; n++)
        for (int j = 0; j < 4; j++)
            for (int half = 0; half < 2; half++)
                for (int l = 0; l < 16; l++) {
                    int is = n * 8 + 2 * j + half;
                    want[n * 128 + j * 32 + half * 16 + l] = (float)(is * j) - 0.5f;
                }
    expect_row(LM_Q2_K, b, want, 256);
}
END_TEST

START_TEST(test_q3_k)
{
    uint8_t b[110] = {0};
    float want[256];
    memset(b, 0x0F, 32);       /* high bit set for the first 128 elements only */
    memset(b + 32, 0xE4, 64);  /* low codes 0,1,2,3 by shift */
    for (int i = 0; i < 16; i++) { /* 6-bit scale i+33, i.e. i+1 after the -32 */
        int s = i + 33;
        if (i < 8)
            b[96 + i] |= (uint8_t)(s & 0xf);
        else
            b[96 + i - 8] |= (uint8_t)((s & 0xf) << 4);
        b[96 + 8 + i % 4] |= (uint8_t)(((s >> 4) & 3) << (2 * (i / 4)));
    }
    put_half(b + 108, 1.0f);
    for (int n = 0; n < 2; n++)
        for (int j = 0; j < 4; j++)
            for (int half = 0; half < 2; half++)
                for (int l = 0; l < 16; l++) {
                    int is = n * 8 + 2 * j + half;
                    want[n * 128 + j * 32 + half * 16 + l] = (float)((is + 1) * (j - (n ? 4 : 0)));
                }
    expect_row(LM_Q3_K, b, want, 256);
}
END_TEST

/* Packs eight 6-bit scales and mins the way Q4_K and Q5_K store them. */
static void pack_k4(uint8_t *q, const int *sc, const int *mn)
{
    memset(q, 0, 12);
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        q[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
        q[j + 8] = (uint8_t)((sc[j + 4] & 0xf) | ((mn[j + 4] & 0xf) << 4));
    }
}

static void k4_expect(float *want, const int *sc, const int *mn, int with_high)
{
    for (int p = 0; p < 4; p++)
        for (int l = 0; l < 32; l++) {
            int lo = l & 0xf, hi = 15 - lo, h = with_high && (l & 1) ? 16 : 0;
            want[64 * p + l] = (float)(sc[2 * p] * (lo + h) - mn[2 * p]);
            want[64 * p + 32 + l] = (float)(sc[2 * p + 1] * (hi + h) - mn[2 * p + 1]);
        }
}

START_TEST(test_q4_k_q5_k)
{
    int sc[8], mn[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = 8 * j + 7;
        mn[j] = 63 - 8 * j;
    }
    uint8_t b4[144], b5[176];
    float w4[256], w5[256];
    put_half(b4, 1.0f);
    put_half(b4 + 2, 1.0f);
    pack_k4(b4 + 4, sc, mn);
    memcpy(b5, b4, 16);
    for (int l = 0; l < 128; l++)
        b4[16 + l] = b5[48 + l] = (uint8_t)((l & 0xf) | ((15 - (l & 0xf)) << 4));
    for (int l = 0; l < 32; l++)
        b5[16 + l] = (l & 1) ? 0xFF : 0x00;
    k4_expect(w4, sc, mn, 0);
    k4_expect(w5, sc, mn, 1);
    expect_row(LM_Q4_K, b4, w4, 256);
    expect_row(LM_Q5_K, b5, w5, 256);
}
END_TEST

START_TEST(test_q6_k)
{
    uint8_t b[210] = {0};
    float want[256];
    int8_t *sc = (int8_t *)(b + 192);
    for (int i = 0; i < 16; i++)
        sc[i] = (int8_t)(i - 8);
    put_half(b + 208, 0.25f);
    for (int n = 0; n < 2; n++)
        for (int l = 0; l < 32; l++)
            for (int k = 0; k < 4; k++) {
                int idx = n * 128 + 32 * k + l, q = (idx * 7) % 64 - 32, u = q + 32;
                uint8_t *ql = b + 64 * n + l + (k & 1) * 32, *qh = b + 128 + 32 * n + l;
                *ql |= (uint8_t)((u & 0xf) << (k >= 2 ? 4 : 0));
                *qh |= (uint8_t)((u >> 4) << (2 * k));
                want[idx] = 0.25f * (float)sc[8 * n + l / 16 + 2 * k] * (float)q;
            }
    expect_row(LM_Q6_K, b, want, 256);
}
END_TEST

START_TEST(test_half_roundtrip)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = lm_f16_to_f32((uint16_t)h);
        if (isnan(f)) {
            ck_assert(isnan(lm_f16_to_f32(lm_f32_to_f16(f))));
            continue;
        }
        ck_assert_msg(lm_f32_to_f16(f) == h, "half 0x%04x -> %g -> 0x%04x", h, f, lm_f32_to_f16(f));
    }
    ck_assert_float_eq(lm_f16_to_f32(0x3C00), 1.0f);
    ck_assert_float_eq(lm_f16_to_f32(0xC000), -2.0f);
    ck_assert_float_eq(lm_f16_to_f32(0x0001), 5.9604644775390625e-08f);
    ck_assert_float_eq(lm_bf16_to_f32(0x3F80), 1.0f);
    ck_assert_int_eq(lm_f32_to_f16(1.0f + 1.0f / 4096), 0x3C00); /* ties to even */
    ck_assert_int_eq(lm_f32_to_f16(65520.0f), 0x7C00);           /* overflow to inf */
}
END_TEST

START_TEST(test_f16_bf16_rows)
{
    uint16_t h[4] = {0x3C00, 0xC000, 0x3800, 0x0000}, bf[4] = {0x3F80, 0xC000, 0x4040, 0x8000};
    float want_h[4] = {1, -2, 0.5f, 0}, want_b[4] = {1, -2, 3, -0.0f};
    expect_row(LM_F16, (uint8_t *)h, want_h, 4);
    expect_row(LM_BF16, (uint8_t *)bf, want_b, 4);
}
END_TEST

START_TEST(test_dot)
{
    float a[37], b[37];
    double want = 0;
    for (int i = 0; i < 37; i++) {
        a[i] = (float)(i - 18);
        b[i] = (float)(i % 5);
        want += (double)a[i] * b[i];
    }
    ck_assert_float_eq(lm_dot_f_scalar(a, b, 37), (float)want);
    ck_assert_float_eq(lm_dot_f_scalar(a, b, 0), 0.0f);
}
END_TEST

START_TEST(test_type_table)
{
    ck_assert_str_eq(lm_type_name(LM_Q4_K), "Q4_K");
    ck_assert_int_eq((int)lm_row_bytes(LM_Q6_K, 512), 420);
    ck_assert_int_eq((int)lm_row_bytes(LM_Q4_0, 64), 36);
    ck_assert(lm_type_supported(LM_BF16));
    ck_assert(!lm_type_supported(16)); /* IQ2_XXS: known, not supported */
    ck_assert(lm_type_known(16));
    ck_assert(!lm_type_known(4));      /* removed Q4_2 */
    ck_assert(!lm_type_known(1000));
}
END_TEST

/* Random bytes make valid blocks of every type once the scales are tamed. */
static void random_row(uint32_t type, uint8_t *b, size_t n, uint64_t *seed)
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

/* Dequantizes an activation row held in the vec_dot_type. */
static void act_to_f32(int atype, const act_row *a, float *y, int k)
{
    for (int i = 0; i < k; i++) {
        if (atype == LM_Q8_K)
            y[i] = a->d[i / 256] * (float)a->qs[i];
        else if (atype == LM_Q8_0 || atype == LM_Q8_1)
            y[i] = a->d[i / 32] * (float)a->qs[i];
        else
            y[i] = a->f[i];
    }
}

static const uint32_t ALL_TYPES[] = {LM_F32, LM_F16, LM_BF16, LM_Q4_0, LM_Q4_1, LM_Q5_0,
                                     LM_Q5_1, LM_Q8_0, LM_Q2_K, LM_Q3_K, LM_Q4_K, LM_Q5_K, LM_Q6_K};
enum { K = 768 }; /* three super-blocks; an odd number of 32-blocks (24) is tested below */

enum { KMAX = 2048 }; /* the longest row a reference decode below takes */
typedef struct qrow_buf {
    float f[KMAX], d[KMAX / 32], m[KMAX / 32];
    uint8_t u[KMAX];
    int32_t sc4[KMAX / 4];
    int16_t mn[KMAX / 16];
    int8_t s8[KMAX];
    int32_t corr16[KMAX / 16];
    qrow r;
} qrow_buf;

static void qrow_init(qrow_buf *b)
{
    memset(b, 0, sizeof *b);
    b->r = (qrow){0, 0, b->f, b->u, b->sc4, b->mn, b->d, b->m, b->s8, b->corr16};
}

static void test_row(uint32_t ty, uint8_t *row, uint64_t *seed)
{
    random_row(ty, row, lm_row_bytes(ty, K), seed);
    if (ty == LM_F32)
        for (int i = 0; i < K; i++)
            ((float *)row)[i] = (float)(i % 17 - 8) * 0.125f;
}

/*
 * The integer path (decode the weight row, quantize the activation, sum
 * integer products) equals f32 math on the dequantized operands, for every
 * type: this ties qdot.c's decoders to quant.c's dequantizers.
 */
START_TEST(test_int_dot_matches_dequant)
{
    uint64_t seed = 1;
    static float x[K], w[K], a[K];
    static uint8_t row[K * 4], actbuf[K * 8];
    static qrow_buf qb;
    for (int i = 0; i < K; i++)
        x[i] = sinf((float)i * 0.37f) * (1.0f + (float)(i % 13));
    for (size_t t = 0; t < sizeof ALL_TYPES / sizeof ALL_TYPES[0]; t++) {
        uint32_t ty = ALL_TYPES[t];
        int at = lm_act_type(ty);
        test_row(ty, row, &seed);
        lm_dequant_row(ty, row, w, K);
        lm_quantize_act(ty, x, actbuf, K);
        act_row ar;
        lm_act_layout(at, K, &ar, actbuf);
        act_to_f32(at, &ar, a, K);
        double want = 0, mag = 0;
        for (int i = 0; i < K; i++) {
            want += (double)w[i] * a[i];
            mag += fabs((double)w[i] * a[i]);
        }
        qrow_init(&qb);
        lm_qrow_decode_scalar(&qb.r, ty, row, K);
        float got = lm_qrow_dot(&qb.r, &ar, LM_ISA_SCALAR);
        ck_assert_msg(fabs(got - want) <= 1e-5 * mag + 1e-6, "%s: int path %g, dequantized %g",
                      lm_type_name(ty), got, want);
        ck_assert_msg(mag > 0, "%s: empty test row", lm_type_name(ty));
    }
}
END_TEST

/*
 * The fast paths against the scalar reference, bit for bit: AVX2 decoders,
 * AVX-512 dots and the fused row-by-tokens kernels, on rows whose number of
 * 32-blocks is even and odd.  (On a CPU without them, lm_cpu_isa says so
 * and there is nothing to compare.)
 */
/*
 * Quantized rows against 16-token groups (qgemm.c): group A holds tokens 0-7,
 * group B tokens 3-7, the rest is padding; one, two and four groups a call.
 */
static void check_token_groups(qrow *r, const act_row *ar, const float *want)
{
    static uint8_t mem[2][K * 32 + 4096] __attribute__((aligned(64)));
    ck_assert_uint_le(lm_tgroup_bytes(r->k), sizeof mem[0]);
    tgroup ga, gb;
    lm_tgroup_build(&ga, lm_act_type(r->type), ar, 8, r->k, 0, mem[0]);
    lm_tgroup_build(&gb, lm_act_type(r->type), ar + 3, 5, r->k, 0, mem[1]);
    ck_assert(lm_trow_prepare_avx512(r));
    const tgroup *gs[4] = {&ga, &gb, &ga, &gb};
    for (int ng = 1; ng <= 4; ng *= 2) {
        float got[64];
        ck_assert(lm_trow_groups_avx512(r, gs, ng, got));
        for (int j = 0; j < ng; j++)
            for (int t = 0; t < 16; t++) {
                int tok = (j % 2 ? 3 : 0) + t, n = j % 2 ? 5 : 8;
                float w = t < n ? want[tok] : 0.0f; /* absent tokens are zero, whatever the row */
                ck_assert_msg(!memcmp(&got[16 * j + t], &w, 4), "%s k=%d ng=%d group %d lane %d: %a vs scalar %a",
                              lm_type_name(r->type), (int)r->k, ng, j, t, got[16 * j + t], w);
            }
    }
}

/*
 * The AVX-512 rounding of activations (qact_simd.c) writes the scalar one's
 * bytes: ties, NaN, infinities, an all-zero block, +max and -max both.
 */
START_TEST(test_quantize_act_bitwise)
{
    if (lm_cpu_isa() < LM_ISA_AVX512)
        return;
    static const uint32_t types[] = {LM_Q4_0, LM_Q5_0, LM_Q8_0, LM_Q2_K, LM_Q3_K, LM_Q4_K, LM_Q6_K};
    static float x[K];
    static uint8_t want[K * 8] __attribute__((aligned(64))), got[K * 8] __attribute__((aligned(64))); /* same layout */
    for (int i = 0; i < K; i++)
        x[i] = sinf((float)i * 1.7f) * (float)(1 + i % 9) * 3.0f;
    for (int i = 256; i < 288; i++) /* an all-zero block and super-block start */
        x[i] = 0.0f;
    x[300] = 0.5f * 127.0f / 8.0f, x[301] = -8.0f, x[302] = 8.0f; /* a tie and both signs of max */
    x[400] = __builtin_nanf(""), x[520] = __builtin_inff(), x[700] = -__builtin_inff();
    for (int ti = 0; ti < 7; ti++)
        for (int k = K; k >= K - 32; k -= 32) {
            uint32_t ty = types[ti];
            if (k % lm_type_block(ty))
                continue;
            size_t n = lm_act_row_bytes(lm_act_type(ty), k);
            memset(want, 0, n), memset(got, 0, n);
            lm_quantize_act(ty, x, want, k);
            ck_assert(lm_quantize_act_avx512(ty, x, got, k));
            for (size_t i = 0; i < n; i++)
                ck_assert_msg(want[i] == got[i], "%s k=%d: byte %zu is %u, scalar %u", lm_type_name(ty), k, i,
                              got[i], want[i]);
        }
}
END_TEST

/* One token through 16 rows at once (qdot_simd.c), against the scalar dot of each row. */
START_TEST(test_rows16_bitwise)
{
    if (lm_cpu_isa() < LM_ISA_AVX512)
        return;
    static const uint32_t types[] = {LM_Q4_0, LM_Q5_0, LM_Q8_0};
    static uint8_t rows[16 * K * 2], act[K * 8];
    static float x[K];
    static qrow_buf ref;
    uint64_t seed = 11;
    for (int i = 0; i < K; i++)
        x[i] = sinf((float)i * 0.37f) * (float)(1 + i % 5);
    for (int ti = 0; ti < 3; ti++)
        for (int k = K; k >= K - 32; k -= 32) { /* 24 and 23 blocks: accumulators wrap past 16 */
            uint32_t ty = types[ti];
            size_t rb = lm_row_bytes(ty, k);
            for (int r = 0; r < 16; r++)
                random_row(ty, rows + r * rb, rb, &seed);
            act_row ar;
            lm_quantize_act(ty, x, act, k);
            lm_act_layout(lm_act_type(ty), k, &ar, act);
            float got[16];
            ck_assert(lm_rows16_type(ty) && lm_rows16_avx512(ty, rows, rb, k, &ar, got));
            for (int r = 0; r < 16; r++) {
                qrow_init(&ref);
                lm_qrow_decode_scalar(&ref.r, ty, rows + r * rb, k);
                float want = lm_qrow_dot(&ref.r, &ar, LM_ISA_SCALAR);
                ck_assert_msg(!memcmp(&got[r], &want, 4), "%s k=%d row %d: %a vs scalar %a", lm_type_name(ty), k, r,
                              got[r], want);
            }
        }
}
END_TEST

/*
 * One token through a Q4_0 row read in 4-block windows (qrow_vbmi.c),
 * against the scalar dot, for every row length from 1 to K / 32 = 24 blocks:
 * tails of every length after no full 16-block step, then after one, and
 * windows cut after 1, 2 or 3 blocks.  Each row ends its allocation, so a
 * read past it shows under the sanitizers.
 */
START_TEST(test_row_q4_0_vbmi_bitwise)
{
    if (!lm_cpu_vbmi())
        return;
    static uint8_t act[K * 8];
    static float x[K];
    static qrow_buf ref;
    uint64_t seed = 23;
    for (int i = 0; i < K; i++)
        x[i] = sinf((float)i * 0.29f) * (float)(1 + i % 3);
    for (int nb = 1; nb <= K / 32; nb++) {
        int k = 32 * nb;
        size_t rb = lm_row_bytes(LM_Q4_0, k);
        uint8_t *row = malloc(rb);
        ck_assert(row != NULL);
        random_row(LM_Q4_0, row, rb, &seed);
        act_row ar;
        lm_quantize_act(LM_Q4_0, x, act, k);
        lm_act_layout(LM_Q8_0, k, &ar, act);
        lm_act_windows(&ar);
        float got = lm_row_q4_0_vbmi(row, k, &ar);
        qrow_init(&ref);
        lm_qrow_decode_scalar(&ref.r, LM_Q4_0, row, k);
        float want = lm_qrow_dot(&ref.r, &ar, LM_ISA_SCALAR);
        ck_assert_msg(!memcmp(&got, &want, 4), "%d blocks: %a vs scalar %a", nb, got, want);
        free(row);
    }
}
END_TEST

/*
 * 16 rows against a group of 8 tokens in AMX tiles (qgemm_amx.c), against
 * the scalar dot of each row and token, for every type the tiles take; rows
 * are all different, so a row read at the wrong stride or a lane mixed up
 * shows.
 */
START_TEST(test_rows16_amx_bitwise)
{
    if (lm_cpu_isa() < LM_ISA_AVX512 || !lm_cpu_amx())
        return;
    static const uint32_t types[] = {LM_Q4_0, LM_Q5_0, LM_Q8_0, LM_Q2_K, LM_Q3_K, LM_Q4_K, LM_Q5_K, LM_Q6_K};
    static uint8_t rows[16 * KMAX * 2], act[8][KMAX * 8], gmem[KMAX * 40 + 4096] __attribute__((aligned(64)));
    static int8_t s8[16 * KMAX] __attribute__((aligned(64))), s8hi[16 * KMAX] __attribute__((aligned(64)));
    static int16_t mn[16 * KMAX / 16];
    static float x[8][KMAX], d[16 * KMAX / 32], m[16 * KMAX / 32], scratch[LM_AMX_SCRATCH] __attribute__((aligned(64)));
    static qrow_buf buf;
    uint64_t seed = 13;
    for (int t = 0; t < 8; t++)
        for (int i = 0; i < KMAX; i++)
            x[t][i] = sinf((float)(i * (t + 2)) * 0.29f) * (float)(1 + (i + t) % 5);
    /* 24, 23 and 15 blocks: lanes wrap, or some stay 0; 64 and 63, past
       LANE_WALK_BLOCKS: blocks taken lane by lane, every lane 4 or 3 deep */
    static const int widths[] = {K, K - 32, 480, KMAX, KMAX - 32};
    ck_assert_int_ge(KMAX / 32 - 1, LANE_WALK_BLOCKS);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (int wi = 0; wi < 5; wi++) {
            uint32_t ty = types[ti];
            int k = widths[wi];
            if (k % lm_type_block(ty))
                continue;
            size_t rb = lm_row_bytes(ty, k);
            rows16 r16 = {.k = k, .s8 = s8, .s8hi = s8hi, .stride = KMAX, .d = d, .m = m, .mn = mn};
            for (int r = 0; r < 16; r++) {
                random_row(ty, rows + r * rb, rb, &seed);
                qrow_init(&buf);
                lm_qrow_decode_scalar(&buf.r, ty, rows + r * rb, k);
                lm_rows16_put(&r16, r, &buf.r);
            }
            lm_rows16_use_s8(&r16);
            if (ty == LM_Q8_0 && wi % 3 == 1) /* Q8_0 rows read where they lie, as matmul.c does */
                lm_rows16_point_q8_0(&r16, rows, rb);
            act_row ar[8];
            for (int t = 0; t < 8; t++) {
                lm_quantize_act(ty, x[t], act[t], k);
                lm_act_layout(lm_act_type(ty), k, &ar[t], act[t]);
            }
            tgroup g;
            ck_assert_uint_le(lm_tgroup_bytes(k), sizeof gmem);
            lm_tgroup_build(&g, lm_act_type(ty), ar, 8, k, 1, gmem);
            float got[256];
            int mins = lm_k_has_mins(ty);
            lm_amx_begin(ty);
            ck_assert(lm_act_type(ty) == LM_Q8_0 ? lm_rows16_group_amx(&r16, &g, got, 16, 8, scratch)
                                                 : lm_rows16_group_k_amx(&r16, &g, mins, got, 16, 8, scratch));
            lm_amx_end();
            for (int r = 0; r < 16; r++) {
                qrow_init(&buf);
                lm_qrow_decode_scalar(&buf.r, ty, rows + r * rb, k);
                for (int t = 0; t < 8; t++) {
                    float want = lm_qrow_dot(&buf.r, &ar[t], LM_ISA_SCALAR);
                    ck_assert_msg(!memcmp(&got[16 * t + r], &want, 4), "%s k=%d row %d token %d: %a vs scalar %a",
                                  lm_type_name(ty), k, r, t, got[16 * t + r], want);
                }
            }
        }
}
END_TEST

/*
 * lm_matmul end to end, on a matrix whose rows are not a multiple of 16
 * (16-row tiles, then the rows left over) and for one token, a few and a
 * batch (every kernel family), against the scalar dot of each row and token.
 */
START_TEST(test_matmul_paths_bitwise)
{
    enum { ROWS = 37, NT = 40 };
    static const uint32_t types[] = {LM_Q4_0, LM_Q8_0, LM_Q4_K, LM_Q6_K};
    static const int counts[] = {1, 5, NT};
    static uint8_t wmem[ROWS * K * 2], act[K * 8];
    static float x[NT * K], out[NT * ROWS];
    static qrow_buf buf;
    uint64_t seed = 17;
    for (int i = 0; i < NT * K; i++)
        x[i] = cosf((float)i * 0.013f) * (float)(1 + i % 7);
    mm_scratch s = {0};
    ck_assert(mm_scratch_init(&s, 2, K, NT) == 0);
    const size_t ntypes = sizeof types / sizeof types[0];
    for (size_t ti = 0; ti < 2 * ntypes; ti++) {
        uint32_t ty = types[ti % ntypes];
        s.amx = s.amx && ti < ntypes; /* then the same without AMX tiles, where there were */
        size_t rb = lm_row_bytes(ty, K);
        for (int r = 0; r < ROWS; r++)
            random_row(ty, wmem + r * rb, rb, &seed);
        lm_tensor w = {"w", ty, {K, ROWS}, wmem};
        for (int c = 0; c < 3; c++) {
            int n = counts[c];
            lm_matmul(out, &w, x, n, &s);
            for (int t = 0; t < n; t++) {
                act_row ar;
                lm_quantize_act(ty, x + t * K, act, K);
                lm_act_layout(lm_act_type(ty), K, &ar, act);
                for (int r = 0; r < ROWS; r++) {
                    qrow_init(&buf);
                    lm_qrow_decode_scalar(&buf.r, ty, wmem + r * rb, K);
                    float want = lm_qrow_dot(&buf.r, &ar, LM_ISA_SCALAR);
                    ck_assert_msg(!memcmp(&out[t * ROWS + r], &want, 4), "%s %d tokens: row %d token %d: %a vs %a",
                                  lm_type_name(ty), n, r, t, out[t * ROWS + r], want);
                }
            }
        }
    }
    mm_scratch_free(&s);
}
END_TEST

START_TEST(test_fast_paths_bitwise)
{
    int isa = lm_cpu_isa();
    if (isa == LM_ISA_SCALAR)
        return;
    uint64_t seed = 7;
    static float x[8][K];
    static uint8_t row[K * 4], act[8][K * 8];
    static qrow_buf ref, fast;
    for (int t = 0; t < 8; t++)
        for (int i = 0; i < K; i++)
            x[t][i] = cosf((float)(i * (t + 1)) * 0.11f) * (1.0f + (float)((i + t) % 7));
    for (size_t ti = 0; ti < sizeof ALL_TYPES / sizeof ALL_TYPES[0]; ti++) {
        uint32_t ty = ALL_TYPES[ti];
        int at = lm_act_type(ty);
        for (int k = K; k >= K - 32; k -= 32) {
            if (k % lm_type_block(ty))
                continue;
            test_row(ty, row, &seed);
            qrow_init(&ref);
            qrow_init(&fast);
            lm_qrow_decode_scalar(&ref.r, ty, row, k);
            lm_qrow_decode(&fast.r, ty, row, k, isa);
            ck_assert_msg(!memcmp(ref.u, fast.u, (size_t)k) && !memcmp(ref.sc4, fast.sc4, sizeof ref.sc4) &&
                          !memcmp(ref.d, fast.d, sizeof ref.d), "%s k=%d: decoders differ", lm_type_name(ty), k);
            act_row ar[8];
            float want[8], got[8];
            for (int t = 0; t < 8; t++) {
                lm_quantize_act(ty, x[t], act[t], k);
                lm_act_layout(at, k, &ar[t], act[t]);
                want[t] = lm_qrow_dot(&ref.r, &ar[t], LM_ISA_SCALAR);
                float f = lm_qrow_dot(&fast.r, &ar[t], isa);
                ck_assert_msg(!memcmp(&f, &want[t], 4), "%s k=%d: dot %a vs scalar %a", lm_type_name(ty), k, f, want[t]);
            }
            for (int n = 1; n <= 8 && isa >= LM_ISA_AVX512; n += 3) /* one token, and groups */
                if (lm_fused_row_avx512(ty, row, k, ar, n, got, &fast.r))
                    for (int t = 0; t < n; t++)
                        ck_assert_msg(!memcmp(&got[t], &want[t], 4), "%s k=%d n=%d token %d: fused %a vs scalar %a",
                                      lm_type_name(ty), k, n, t, got[t], want[t]);
            if ((at == LM_Q8_K || at == LM_Q8_0) && isa >= LM_ISA_AVX512)
                check_token_groups(&fast.r, ar, want);
        }
    }
    float f1[K], f2[K];
    for (int i = 0; i < K; i++)
        f1[i] = x[0][i], f2[i] = x[1][i];
    for (int n = 1; n <= 70; n += 23) {
        float a1 = lm_dot_f(f1, f2, n, isa), a2 = lm_dot_f_scalar(f1, f2, n);
        ck_assert_msg(!memcmp(&a1, &a2, 4), "float dot n=%d", n);
    }
}
END_TEST

/* Our exp is within 2 ulp of the true value, and exact at the edges softmax meets. */
START_TEST(test_expf)
{
    for (int i = 0; i <= 400000; i++) {
        float x = -90.0f + (float)i * (180.0f / 400000);
        float got = lm_expf(x);
        double want = exp((double)x);
        if (x < -87.33f) {
            ck_assert_msg(got == 0.0f, "exp(%a) = %a, want 0", x, got);
            continue;
        }
        if (x > 88.37f) {
            ck_assert_msg(isinf(got), "exp(%a) = %a, want inf", x, got);
            continue;
        }
        double ulp = want < 0x1p-126 ? 0x1p-149 : want * 0x1p-23;
        ck_assert_msg(fabs(got - want) <= 2 * ulp, "exp(%a) = %a, want %a", x, got, want);
    }
    ck_assert(lm_expf(0.0f) == 1.0f);
    ck_assert(lm_expf(-INFINITY) == 0.0f);
    ck_assert(isnan(lm_expf(NAN)));
}
END_TEST

/*
 * The gated FFN's SiLU(g) * up: within 4 ulp of the exact value (values
 * under 2^-100 may flush to zero, as past -88.4 where e^-g is taken as
 * infinite), and the vector path gives the scalar bytes, tail included.
 */
START_TEST(test_silu_mul)
{
    enum { N = 4099 };
    static float g[N], up[N], ref[N];
    for (int i = 0; i < N; i++) {
        g[i] = -100.0f + (float)i * (200.0f / N) + (i % 3) * 0.01f;
        up[i] = 1.0f + (float)(i % 11) * 0.25f;
    }
    g[7] = 0.0f, g[8] = -0.0f, g[9] = 88.5f, g[10] = -88.5f;
    for (int i = 0; i < N; i++) {
        ref[i] = lm_silu(g[i]) * up[i];
        double x = g[i], want = x / (1.0 + exp(-x)) * up[i];
        ck_assert_msg(fabs(ref[i] - want) <= 4 * fabs(want) * 0x1p-23 + 0x1p-100, "silu(%a) * %a = %a, want %a",
                      g[i], up[i], ref[i], want);
    }
    lm_silu_mul(g, up, N, lm_cpu_isa());
    for (int i = 0; i < N; i++)
        ck_assert_msg(!memcmp(&g[i], &ref[i], 4), "element %d: %a vs scalar %a", i, g[i], ref[i]);
}
END_TEST

/* Portable attention of one head, step for step as lm_attend_head without the fast path. */
static void attend_ref(const float *q, const float *k, const float *v, int lo, int pos, int hd,
                       float scale, float cap, float *scores, float *out)
{
    float mx = -INFINITY;
    for (int j = lo; j <= pos; j++) {
        float s = lm_dot_f_scalar(q, k + (size_t)j * hd, hd) * scale;
        if (cap > 0)
            s = cap * tanhf(s / cap);
        scores[j] = s;
        mx = s > mx ? s : mx;
    }
    float inv = lm_softmax_exp(scores, lo, pos, mx);
    float odd[256] = {0};
    for (int i = 0; i < hd; i++)
        out[i] = 0.0f;
    for (int j = lo; j <= pos; j++) {
        float *acc = (j - lo) % 2 ? odd : out;
        for (int i = 0; i < hd; i++)
            acc[i] = fmaf(scores[j] * inv, v[(size_t)j * hd + i], acc[i]);
    }
    for (int i = 0; i < hd; i++)
        out[i] += odd[i];
}

/*
 * The AVX-512 attention (groups of queries over blocks of keys, 16 keys a
 * step, vector exp) gives every query the portable bytes, whatever the
 * other queries of its group: positions and windows differ within a group,
 * pairs share value loads, and rows span several key blocks.
 */
START_TEST(test_attention_fast_bitwise)
{
    enum { N = 150, HD = 256, NQ = LM_ATT_QMAX };
    static const int dims[] = {64, 96, 128, 256}; /* the unrolled sizes, and one that is not */
    static float k[N * HD], v[N * HD], q[NQ * HD], s1[N], s2[NQ * N], o1[HD], o2[NQ * HD];
    static float acc[NQ * LM_ATT_ACC];
    static uint16_t k16[N * HD], v16[N * HD];
    if (lm_cpu_isa() < LM_ISA_AVX512)
        return;
    for (int i = 0; i < N * HD; i++) {
        k16[i] = lm_f32_to_f16(sinf((float)i * 0.37f) * 3.0f), k[i] = lm_f16_to_f32(k16[i]);
        v16[i] = lm_f32_to_f16(cosf((float)i * 0.21f)), v[i] = lm_f16_to_f32(v16[i]);
    }
    for (int i = 0; i < NQ * HD; i++)
        q[i] = sinf((float)i * 1.3f);
    static const int counts[] = {1, 6, NQ}; /* queries in a group */
    for (int c = 0; c < 4 * 2 * 3 * 3; c++) {
        int hd = dims[c % 4], f16 = c / 4 % 2, n = counts[c / 8 % 3], start = 53 * (c / 24);
        float cap = start % 2 ? 0.0f : 2.0f, sc = 1.0f / sqrtf((float)hd);
        lm_attq qs[NQ];
        for (int a = 0; a < n; a++) { /* pairs share lo; some windows cut */
            int pos = (start + 13 * a) % N, lo = (a / 2) % 3 == 2 ? pos / 3 : 0;
            qs[a] = (lm_attq){q + a * HD, o2 + a * HD, lo, pos};
        }
        ck_assert(lm_attend_group_avx512(qs, n, f16 ? (void *)k16 : k, (size_t)hd,
                                         f16 ? (void *)v16 : v, (size_t)hd, hd, hd, sc, cap, s2,
                                         N, acc, f16));
        for (int a = 0; a < n; a++) {
            attend_ref(qs[a].q, k, v, qs[a].lo, qs[a].pos, hd, sc, cap, s1, o1);
            ck_assert_msg(!memcmp(o1, o2 + a * HD, (size_t)hd * 4),
                          "hd %d f16 %d query %d of %d (lo %d pos %d)", hd, f16, a, n, qs[a].lo,
                          qs[a].pos);
        }
    }
}
END_TEST

/* Q8_K follows llama.cpp: scale from the signed extreme, codes clamp at 127. */
START_TEST(test_q8k_activation)
{
    float x[256];
    static uint8_t buf[4096];
    act_row r;
    for (int i = 0; i < 256; i++)
        x[i] = (float)(i - 128) / 64.0f; /* extreme is -2 at i = 0 */
    lm_quantize_act(LM_Q4_K, x, buf, 256);
    lm_act_layout(LM_Q8_K, 256, &r, buf);
    float d = r.d[0];
    uint8_t *b = (uint8_t *)r.qs - 4;
    ck_assert_float_eq_tol(d, 2.0f / 127.0f, 1e-9f); /* iscale = -127 / -2 */
    ck_assert_int_eq((int8_t)b[4], -127);
    ck_assert_int_eq((int8_t)b[4 + 255], 126);  /* 1.984375 * 63.5 = 126.01 */
    ck_assert_int_eq((int8_t)b[4 + 128], 0);
    int s = 0;
    for (int i = 0; i < 16; i++)
        s += r.qs[i];
    ck_assert_int_eq(r.sum16[0], s);
    float y[32];
    for (int i = 0; i < 32; i++)
        y[i] = (float)i / 2.0f; /* max 15.5 -> code 127, 0.5 * 127/15.5 = 4.097 -> 4 */
    lm_quantize_act(LM_Q8_0, y, buf, 32);
    lm_act_layout(LM_Q8_0, 32, &r, buf);
    ck_assert_int_eq(r.qs[31], 127);
    ck_assert_int_eq(r.qs[1], 4);
    ck_assert_float_eq(r.d[0], lm_f16_to_f32(lm_f32_to_f16(15.5f / 127.0f))); /* d is an f16 */
}
END_TEST

TCase *tcase_quant(void)
{
    TCase *tc = tcase_create("quant");
    tcase_set_timeout(tc, 60); /* the sanitizer build runs the kernels' bit-for-bit sweeps slowly */
    tcase_add_test(tc, test_q8_0);
    tcase_add_test(tc, test_q4_0_q4_1);
    tcase_add_test(tc, test_q5_0_q5_1);
    tcase_add_test(tc, test_q2_k);
    tcase_add_test(tc, test_q3_k);
    tcase_add_test(tc, test_q4_k_q5_k);
    tcase_add_test(tc, test_q6_k);
    tcase_add_test(tc, test_half_roundtrip);
    tcase_add_test(tc, test_f16_bf16_rows);
    tcase_add_test(tc, test_dot);
    tcase_add_test(tc, test_type_table);
    tcase_add_test(tc, test_int_dot_matches_dequant);
    tcase_add_test(tc, test_fast_paths_bitwise);
    tcase_add_test(tc, test_rows16_bitwise);
    tcase_add_test(tc, test_rows16_amx_bitwise);
    tcase_add_test(tc, test_row_q4_0_vbmi_bitwise);
    tcase_add_test(tc, test_matmul_paths_bitwise);
    tcase_add_test(tc, test_quantize_act_bitwise);
    tcase_add_test(tc, test_expf);
    tcase_add_test(tc, test_silu_mul);
    tcase_add_test(tc, test_attention_fast_bitwise);
    tcase_add_test(tc, test_q8k_activation);
    return tc;
}
