/*
 * tests/test_quant.c - known answers for every tensor type: blocks packed
 * by hand from chosen integer codes and scales, dequantized, and compared
 * with the value the format defines for each element; and the integer dot
 * products against f32 math on the dequantized rows.  The fast kernels are
 * held to the scalar reference in test_kernels.c.
 */
#include "util.h"
#include "qrows.h"

#include <math.h>
#include <string.h>

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
        test_row(ty, row, K, &seed);
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
    tcase_add_test(tc, test_q8k_activation);
    return tc;
}
