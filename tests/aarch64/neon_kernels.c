/*
 * tests/aarch64/neon_kernels.c - the NEON decoders and dots (lm/qdot_neon.c:
 * with SDOT where the CPU has it, and without) against the scalar
 * reference, bit for bit, for every weight type, and
 * the NEON rounding of activations (lm/qact_simd.c) and attention, softmax,
 * SiLU and sums of squares (lm/attention_neon.c).  Built with the
 * aarch64 cross compiler and run under qemu by `make check-aarch64` (part
 * of `make check` where those tools are installed); a plain C program,
 * since Check is not built for aarch64 here.
 */
#include "../../lm/internal.h"
#include "../attcheck.h"
#include "../qrows.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int failures;

static void expect_same(float got, float want, const char *what, const char *type, int k)
{
    if (!memcmp(&got, &want, sizeof got))
        return;
    fprintf(stderr, "FAIL %s %s k=%d: NEON %a, scalar %a\n", what, type, k, got, want);
    failures++;
}

/* The NEON decoders write the scalar decoder's codes, scales and mins. */
static void check_decode(uint32_t ty, const uint8_t *row, int k, const qrow_buf *want)
{
    static qrow_buf got;
    qrow_init(&got);
    if (!lm_qrow_decode_neon(&got.r, ty, row, k))
        return;
    int kq = ty == LM_Q4_0 || ty == LM_Q5_0 || ty == LM_Q8_0 ? 32 : 256;
    int same = !memcmp(got.u, want->u, (size_t)k) && !memcmp(got.d, want->d, (size_t)(k / kq) * 4) &&
               !memcmp(got.m, want->m, (size_t)(k / kq) * 4);
    if (kq == 256)
        same &= !memcmp(got.sc4, want->sc4, (size_t)(k / 4) * 4) && !memcmp(got.mn, want->mn, (size_t)(k / 16) * 2);
    if (!same) {
        fprintf(stderr, "FAIL decode %s k=%d: not the scalar decoder's bytes\n", lm_type_name(ty), k);
        failures++;
    }
}

/*
 * Every type, rows of 24 blocks and of 23 (a tail past the last four), and
 * of 56 (7 super-blocks: K-quants' four lanes wrap).
 */
static void check_rows(void)
{
    static uint8_t row[KMAX * 4], act[KMAX * 8];
    static float x[KMAX];
    static qrow_buf ref;
    static const int widths[] = {K, K - 32, KMAX - 256};
    uint64_t seed = 5;
    int decoded = 0;
    for (int i = 0; i < KMAX; i++)
        x[i] = sinf((float)i * 0.61f) * (float)(1 + i % 7);
    for (int ti = 0; ti < N_ALL_TYPES; ti++)
        for (int rep = 0; rep < 4; rep++)
            for (int wi = 0; wi < 3; wi++) {
                uint32_t ty = ALL_TYPES[ti];
                int k = widths[wi];
                if (k % lm_type_block(ty))
                    continue;
                size_t rb = lm_row_bytes(ty, k);
                random_row(ty, row, rb, &seed);
                if (ty == LM_F32 || ty == LM_F16 || ty == LM_BF16)
                    test_row(ty, row, k, &seed);
                act_row ar;
                lm_quantize_act(ty, x, act, k);
                lm_act_layout(lm_act_type(ty), k, &ar, act);
                qrow_init(&ref);
                lm_qrow_decode_scalar(&ref.r, ty, row, k);
                check_decode(ty, row, k, &ref);
                decoded += lm_qrow_decode_neon(&ref.r, ty, row, k); /* the same bytes, checked above */
                float want = lm_qrow_dot(&ref.r, &ar, LM_ISA_SCALAR);
                expect_same(lm_qrow_dot(&ref.r, &ar, LM_ISA_NEON), want, "row (ARMv8.0)", lm_type_name(ty), k);
                if (lm_cpu_isa() == LM_ISA_NEON_DOT)
                    expect_same(lm_qrow_dot(&ref.r, &ar, LM_ISA_NEON_DOT), want, "row (SDOT)", lm_type_name(ty), k);
            }
    if (decoded != 4 * (3 * 3 + 3 * 2)) { /* Q4_0, Q5_0, Q8_0 at all lengths; Q4_K, Q5_K, Q6_K at two */
        fprintf(stderr, "FAIL %d rows went through the NEON decoders\n", decoded);
        failures++;
    }
}

/*
 * Several tokens through a decoded row (lm_qrow_dots: four a pass, then
 * one at a time), with and without SDOT, each token's output the scalar
 * dot's bytes: 6 tokens (a pass and two left), outputs 3 floats apart.
 */
static void check_dots_many(void)
{
    enum { NT = 6, LD = 3 };
    static uint8_t row[KMAX * 4], act[NT][KMAX * 8];
    static float x[KMAX], out[NT * LD];
    static qrow_buf ref;
    static const int widths[] = {K, K - 32, KMAX - 256};
    uint64_t seed = 11;
    act_row ar[NT];
    for (int ti = 0; ti < N_ALL_TYPES; ti++)
        for (int wi = 0; wi < 3; wi++) {
            uint32_t ty = ALL_TYPES[ti];
            int k = widths[wi];
            if (k % lm_type_block(ty))
                continue;
            test_row(ty, row, k, &seed);
            qrow_init(&ref);
            lm_qrow_decode_scalar(&ref.r, ty, row, k);
            for (int t = 0; t < NT; t++) {
                for (int i = 0; i < k; i++)
                    x[i] = sinf((float)(i * (t + 2)) * 0.37f) * (float)(1 + (i + t) % 5);
                lm_quantize_act(ty, x, act[t], k);
                lm_act_layout(lm_act_type(ty), k, &ar[t], act[t]);
            }
            for (int isa = LM_ISA_NEON; isa <= lm_cpu_isa(); isa++) {
                lm_qrow_dots(&ref.r, ar, NT, out, LD, isa);
                for (int t = 0; t < NT; t++)
                    expect_same(out[t * LD], lm_qrow_dot(&ref.r, &ar[t], LM_ISA_SCALAR),
                                isa == LM_ISA_NEON ? "dots of 6 tokens (ARMv8.0)" : "dots of 6 tokens (SDOT)",
                                lm_type_name(ty), k);
            }
        }
}

/* The NEON rounding of activations (qact_simd.c) writes the scalar one's bytes. */
static void check_quantize(void)
{
    char msg[160] = "";
    if (act_rounding_check(lm_quantize_act_neon, msg, sizeof msg)) {
        fprintf(stderr, "FAIL rounding %s\n", msg);
        failures++;
    }
}

/* Float dots of every length from 0 to 40: each tail length after 0, 1 and 2 full steps. */
static void check_floats(void)
{
    float x[40], y[40];
    for (int i = 0; i < 40; i++)
        x[i] = cosf((float)i * 1.3f) * 3.0f, y[i] = sinf((float)i * 0.7f) / 7.0f;
    for (int n = 0; n <= 40; n++)
        expect_same(lm_dot_f_neon(x, y, n), lm_dot_f_scalar(x, y, n), "f32 dot", "n", n);
}

/*
 * The steps beside the matmuls: sums of squares, SiLU, soft-capping and
 * softmax of every length up to 40 (each tail after 0, 1 and 2 full
 * steps), values from tiny to past exp's overflow; then attention
 * (attcheck.h).
 */
static void check_layer_math(void)
{
    float x[40], wide[40], up[40], g1[40], g2[40], s1[40], s2[40];
    for (int i = 0; i < 40; i++) {
        x[i] = sinf((float)i * 2.1f) * (i % 3 ? 9.0f : 95.0f), up[i] = cosf((float)i * 0.9f);
        wide[i] = x[i] * powf(10.0f, (float)(i % 9 - 4)); /* squares 1e-8..1e8: their order shows in the sum */
    }
    for (int n = 0; n <= 40; n++) {
        double a = lm_sumsq(wide, n), b = lm_sumsq_neon(wide, n);
        if (memcmp(&a, &b, sizeof a)) {
            fprintf(stderr, "FAIL sumsq n=%d: NEON %a, scalar %a\n", n, b, a);
            failures++;
        }
        memcpy(g1, x, sizeof x), memcpy(g2, x, sizeof x);
        lm_silu_mul(g1, up, (size_t)n, LM_ISA_SCALAR);
        lm_silu_mul(g2, up, (size_t)n, LM_ISA_NEON);
        for (int i = 0; i < n; i++)
            expect_same(g2[i], g1[i], "silu", "n", n);
        memcpy(g1, x, sizeof x), memcpy(g2, x, sizeof x); /* soft-capping: both of tanh's forms */
        lm_softcap_rows(g1, (size_t)n, 30.0f, LM_ISA_SCALAR);
        lm_softcap_rows(g2, (size_t)n, 30.0f, LM_ISA_NEON);
        for (int i = 0; i < n; i++)
            expect_same(g2[i], g1[i], "softcap", "n", n);
        for (int i = 0; i < 40; i++)
            s1[i] = s2[i] = x[i] * 0.25f - 3.0f;
        if (n == 0)
            continue;
        float i1 = lm_softmax_exp(s1, 40 - n, 39, 20.0f), i2 = lm_softmax_exp_neon(s2, 40 - n, 39, 20.0f);
        expect_same(i2, i1, "softmax sum", "n", n);
        for (int i = 40 - n; i < 40; i++)
            expect_same(s2[i], s1[i], "softmax", "n", n);
    }
    char msg[160] = "";
    int bad = attcheck_groups(lm_attend_group_neon, msg, sizeof msg);
    /* groups of 1, 16, 31, 46, 61: every count of queries past the last four (qemu is slow) */
    bad += attcheck_range_edges(lm_attend_group_neon, 15, bad ? NULL : msg, bad ? 0 : sizeof msg);
    if (bad) {
        fprintf(stderr, "FAIL attention: %d queries differ, first: %s\n", bad, msg);
        failures++;
    }
    if ((bad = attcheck_f16_rows(lm_f16_to_f32_neon, 4, msg, sizeof msg))) {
        fprintf(stderr, "FAIL f16 rows: %d values differ, first: %s\n", bad, msg);
        failures++;
    }
}

int main(void)
{
    if (!lm_isa_neon(lm_cpu_isa())) {
        fprintf(stderr, "FAIL the engine does not take this CPU (or qemu's) for an aarch64 one\n");
        return 1;
    }
    check_rows();
    check_dots_many();
    check_quantize();
    check_floats();
    check_layer_math();
    printf("aarch64 NEON %s: dots, rounding and attention %s\n",
           lm_cpu_isa() == LM_ISA_NEON_DOT ? "with SDOT and without" : "without SDOT",
           failures ? "FAILED" : "bitwise equal to the scalar ones");
    return failures != 0;
}
