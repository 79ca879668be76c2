/*
 * tests/test_kernels.c - the matmul's fast paths against the scalar
 * reference, bit for bit: activation rounding, the one-token, 16-row, VBMI
 * and AMX kernels.  Each test skips what this CPU lacks.  (lm_matmul end
 * to end: test_matmul.c; a layer's other steps: test_layer_math.c.)
 */
#include "util.h"
#include "qrows.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/*
 * Quantized rows against 16-token groups (qgemm.c): group A holds tokens 0-7,
 * group B tokens 3-7, the rest is padding; one to four groups a call, for
 * the row alone and with up to three copies scaled by 2, 4 and 8 (so every
 * sum exactly that multiple of the scalar one), which shows rows or outputs
 * mixed up.
 */
static void check_token_groups(qrow *r, const act_row *ar, const float *want)
{
    static uint8_t mem[2][KMAX * 32 + 4096] __attribute__((aligned(64)));
    static float d2[3][KMAX / 32], m2[3][KMAX / 32];
    ck_assert_uint_le(lm_tgroup_bytes(r->k), sizeof mem[0]);
    tgroup ga, gb;
    lm_tgroup_build(&ga, lm_act_type(r->type), ar, 8, r->k, 0, lm_cpu_isa(), mem[0]);
    lm_tgroup_build(&gb, lm_act_type(r->type), ar + 3, 5, r->k, 0, lm_cpu_isa(), mem[1]);
    ck_assert(lm_trow_prepare_avx512(r));
    qrow scaled[3]; /* share the codes */
    for (int i = 0; i < 3; i++) {
        scaled[i] = *r;
        scaled[i].d = d2[i], scaled[i].m = m2[i];
        for (int64_t b = 0; b < r->k / 32; b++) /* times 2, 4, 8: exact */
            d2[i][b] = (float)(2 << i) * r->d[b], m2[i][b] = (float)(2 << i) * r->m[b];
    }
    const tgroup *gs[4] = {&ga, &gb, &ga, &gb};
    const qrow *rows[4] = {r, &scaled[0], &scaled[1], &scaled[2]};
    for (int nr = 1; nr <= 4; nr++)
        for (int ng = 1; ng <= 4; ng++) {
            float got[4][64];
            float *outs[4] = {got[0], got[1], got[2], got[3]};
            ck_assert(lm_trow_groups_avx512(rows, nr, gs, ng, outs));
            for (int i = 0; i < nr; i++)
                for (int j = 0; j < ng; j++)
                    for (int t = 0; t < 16; t++) {
                        int tok = (j % 2 ? 3 : 0) + t, n = j % 2 ? 5 : 8;
                        float w = t < n ? want[tok] * (float)(1 << i) : 0.0f; /* absent tokens are zero */
                        ck_assert_msg(!memcmp(&got[i][16 * j + t], &w, 4),
                                      "%s k=%d rows=%d ng=%d row %d group %d lane %d: %a vs scalar %a",
                                      lm_type_name(r->type), (int)r->k, nr, ng, i, j, t, got[i][16 * j + t], w);
                    }
        }
}

/* The AVX2 and AVX-512 rounding of activations (qact_simd.c) write the scalar one's bytes. */
START_TEST(test_quantize_act_bitwise)
{
    char msg[160] = "";
    if (lm_cpu_isa() >= LM_ISA_AVX2)
        ck_assert_msg(!act_rounding_check(lm_quantize_act_avx2, msg, sizeof msg), "AVX2 %s", msg);
    if (lm_cpu_isa() >= LM_ISA_AVX512)
        ck_assert_msg(!act_rounding_check(lm_quantize_act_avx512, msg, sizeof msg), "AVX-512 %s", msg);
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
 * One token through Q4_0 and Q5_0 rows read in 4-block windows
 * (qrow_vbmi.c), two rows a call, against the scalar dot, for every row
 * length from 1 to K / 32 = 24 blocks: tails of every length after no full
 * 16-block step, then after one, and windows cut after 1, 2 or 3 blocks.
 * The rows end their allocation, so a read past them shows under the
 * sanitizers.
 */
START_TEST(test_row_b32_vbmi_bitwise)
{
    if (!lm_cpu_vbmi())
        return;
    static const uint32_t types[] = {LM_Q4_0, LM_Q5_0};
    static uint8_t act[K * 8];
    static float x[K];
    static qrow_buf ref;
    uint64_t seed = 23;
    for (int i = 0; i < K; i++)
        x[i] = sinf((float)i * 0.29f) * (float)(1 + i % 3);
    for (int ti = 0; ti < 2; ti++)
        for (int nb = 1; nb <= K / 32; nb++) {
            uint32_t ty = types[ti];
            int k = 32 * nb;
            size_t rb = lm_row_bytes(ty, k);
            uint8_t *rows = malloc(2 * rb);
            ck_assert(rows != NULL);
            act_row ar;
            lm_quantize_act(ty, x, act, k);
            lm_act_layout(LM_Q8_0, k, &ar, act);
            lm_act_windows(&ar);
            float got[2];
            for (int r = 0; r < 2; r++)
                random_row(ty, rows + r * rb, rb, &seed);
            lm_rows_b32_vbmi(ty, rows, rb, 2, k, &ar, got);
            for (int r = 0; r < 2; r++) {
                qrow_init(&ref);
                lm_qrow_decode_scalar(&ref.r, ty, rows + r * rb, k);
                float want = lm_qrow_dot(&ref.r, &ar, LM_ISA_SCALAR);
                ck_assert_msg(!memcmp(&got[r], &want, 4), "%s, %d blocks, row %d: %a vs scalar %a",
                              lm_type_name(ty), nb, r, got[r], want);
            }
            free(rows);
        }
}
END_TEST

/*
 * The largest block sums the one-token Q4_0 and Q5_0 kernels fold in 16
 * bits (fold_fours): every weight code 0 (centred -8, or -16) against
 * every activation code 127, then -127, so each lane of 8 products is
 * -8128 or +8128 (Q4_0), -16256 or +16256 (Q5_0), through the 16-row
 * kernel and the windowed one, against the scalar dot.
 */
START_TEST(test_one_token_extreme_sums)
{
    if (lm_cpu_isa() < LM_ISA_AVX512)
        return;
    static const uint32_t types[] = {LM_Q4_0, LM_Q5_0};
    static uint8_t rows[16 * K * 2], act[K * 8];
    static float x[K];
    static qrow_buf ref;
    for (int ti = 0; ti < 2; ti++)
        for (int sign = -1; sign <= 1; sign += 2) {
            uint32_t ty = types[ti];
            size_t rb = lm_row_bytes(ty, K), bs = lm_row_bytes(ty, 32);
            memset(rows, 0, 16 * rb);
            for (size_t b = 0; b < 16 * rb / bs; b++)
                memcpy(rows + b * bs, &(uint16_t){0x3c00}, 2); /* scale 1.0, codes 0 */
            for (int i = 0; i < K; i++)
                x[i] = (float)sign;
            act_row ar;
            lm_quantize_act(ty, x, act, K);
            lm_act_layout(LM_Q8_0, K, &ar, act);
            ck_assert_int_eq(ar.qs[0], 127 * sign);
            qrow_init(&ref);
            lm_qrow_decode_scalar(&ref.r, ty, rows, K);
            float want = lm_qrow_dot(&ref.r, &ar, LM_ISA_SCALAR), got[16];
            float ideal = -(ty == LM_Q4_0 ? 8.0f : 16.0f) * K * sign; /* but for the f16 activation scale */
            ck_assert_msg(fabsf(want - ideal) < 1e-3f * fabsf(ideal), "%s: %g, not about %g", lm_type_name(ty), want, ideal);
            ck_assert(lm_rows16_avx512(ty, rows, rb, K, &ar, got));
            for (int r = 0; r < 16; r++)
                ck_assert_msg(!memcmp(&got[r], &want, 4), "%s rows16 row %d: %a vs %a", lm_type_name(ty), r,
                              got[r], want);
            if (!lm_cpu_vbmi())
                continue;
            lm_act_windows(&ar);
            lm_rows_b32_vbmi(ty, rows, rb, 2, K, &ar, got);
            for (int r = 0; r < 2; r++)
                ck_assert_msg(!memcmp(&got[r], &want, 4), "%s windows row %d: %a vs %a", lm_type_name(ty), r,
                              got[r], want);
        }
}
END_TEST

/*
 * K-quant rows of 1..8 super-blocks (whole groups of four and every tail)
 * through both builds of qrow_k.c (AVX-512 VNNI; with VBMI and GFNI), three
 * rows a call (outputs ldo apart), for one token, for eight and for nine
 * (two passes of the kernel), with the token codes
 * as they are and also in nibble order (lm_act_nibbles), against the scalar
 * dot; the rows end their allocation, so the sanitizer build sees any
 * over-read.
 */
#define ROW_K_NTOK (LM_ROW_K_TOKENS + 1)
START_TEST(test_row_k_bitwise)
{
    if (lm_cpu_isa() < LM_ISA_AVX512)
        return;
    static const uint32_t types[] = {LM_Q4_K, LM_Q5_K, LM_Q6_K};
    static const int ntoks[] = {1, LM_ROW_K_TOKENS, ROW_K_NTOK};
    static uint8_t act[ROW_K_NTOK][KMAX * 8];
    static float x[KMAX];
    static qrow_buf ref;
    uint64_t seed = 31;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (int nb = 1; nb <= KMAX / 256; nb++) {
            int k = 256 * nb;
            size_t rb = lm_row_bytes(types[ti], k);
            uint8_t *rows = malloc(3 * rb);
            ck_assert(rows != NULL);
            act_row ar[ROW_K_NTOK];
            float want[3][ROW_K_NTOK], got[3 * ROW_K_NTOK];
            for (int t = 0; t < ROW_K_NTOK; t++) {
                for (int i = 0; i < k; i++)
                    x[i] = sinf((float)(i * (t + 2)) * 0.13f) * (float)(1 + (i + nb) % 5);
                lm_quantize_act(types[ti], x, act[t], k);
                lm_act_layout(LM_Q8_K, k, &ar[t], act[t]);
            }
            for (int r = 0; r < 3; r++) {
                random_row(types[ti], rows + r * rb, rb, &seed);
                qrow_init(&ref);
                lm_qrow_decode_scalar(&ref.r, types[ti], rows + r * rb, k);
                for (int t = 0; t < ROW_K_NTOK; t++)
                    want[r][t] = lm_qrow_dot(&ref.r, &ar[t], LM_ISA_SCALAR);
            }
            for (int nib = 0; nib < 2; nib++) {
                for (int t = 0; nib && t < ROW_K_NTOK; t++)
                    lm_act_nibbles(&ar[t]);
                for (size_t ni = 0; ni < sizeof ntoks / sizeof ntoks[0]; ni++)
                    for (int kv = 0; kv < 2; kv++) { /* AVX-512 VNNI, then with VBMI and GFNI */
                        int n = ntoks[ni];
                        if (kv && !lm_cpu_gfni())
                            continue;
                        ck_assert((kv ? lm_rows_k_gfni : lm_rows_k_avx512)(types[ti], rows, rb, 3, k, ar, n, got, 3));
                        for (int r = 0; r < 3; r++)
                            for (int t = 0; t < n; t++)
                                ck_assert_msg(!memcmp(&got[3 * t + r], &want[r][t], 4),
                                              "%s%s, %d super-blocks, nibble order %d, row %d, token %d of %d: %a vs "
                                              "scalar %a", lm_type_name(types[ti]), kv ? " (GFNI)" : "", nb, nib, r,
                                              t, n, got[3 * t + r], want[r][t]);
                    }
            }
            free(rows);
        }
}
END_TEST

/*
 * Rows put into an AMX slot straight from the file (lm_rows16_put_raw) hold
 * the bytes the generic decode puts there, for slot 5 of 16: codes, high
 * parts, scales, mins; K-quant rows prepared for the VNNI groups straight
 * from the file hold what decode and prepare leave.  Each row ends its
 * allocation (the sanitizer build).
 */
START_TEST(test_rows16_put_raw_bitwise)
{
    if (lm_cpu_isa() < LM_ISA_AVX512)
        return;
    static const uint32_t types[] = {LM_Q4_0, LM_Q4_K, LM_Q5_K, LM_Q6_K};
    static const int widths[] = {256, K, KMAX};
    static int8_t s8[2][16 * KMAX], s8hi[2][16 * KMAX];
    static int16_t mn[2][16 * KMAX / 16];
    static float d[2][16 * KMAX / 32], m[2][16 * KMAX / 32];
    static qrow_buf buf;
    uint64_t seed = 41;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (int wi = 0; wi < 3; wi++) {
            uint32_t ty = types[ti];
            int k = widths[wi];
            size_t rb = lm_row_bytes(ty, k);
            uint8_t *row = malloc(rb);
            ck_assert(row != NULL);
            random_row(ty, row, rb, &seed);
            rows16 r[2];
            for (int i = 0; i < 2; i++) {
                memset(s8[i], 0x55, sizeof s8[i]), memset(s8hi[i], 0x55, sizeof s8hi[i]);
                memset(mn[i], 0x55, sizeof mn[i]), memset(d[i], 0x55, sizeof d[i]), memset(m[i], 0x55, sizeof m[i]);
                r[i] = (rows16){.k = k, .s8 = s8[i], .s8hi = s8hi[i], .stride = KMAX, .d = d[i], .m = m[i], .mn = mn[i]};
            }
            ck_assert(lm_rows16_put_raw(&r[0], 5, ty, row));
            qrow_init(&buf);
            lm_qrow_decode_scalar(&buf.r, ty, row, k);
            lm_rows16_put(&r[1], 5, &buf.r);
            int kq = lm_act_type(ty) == LM_Q8_K;
            ck_assert_msg(!memcmp(s8[0], s8[1], sizeof s8[0]), "%s k=%d: codes differ", lm_type_name(ty), k);
            ck_assert_msg(!kq || !memcmp(s8hi[0], s8hi[1], sizeof s8hi[0]), "%s k=%d: high parts differ",
                          lm_type_name(ty), k);
            ck_assert_msg(!memcmp(d[0], d[1], sizeof d[0]), "%s k=%d: scales differ", lm_type_name(ty), k);
            ck_assert_msg(!kq || (!memcmp(m[0], m[1], sizeof m[0]) && !memcmp(mn[0], mn[1], sizeof mn[0])),
                          "%s k=%d: mins differ", lm_type_name(ty), k);
            if (kq) { /* and as the VNNI groups read it, against decode and prepare */
                static qrow_buf direct;
                qrow_init(&direct);
                ck_assert(lm_row_k_prepare(ty, row, k, &direct.r));
                ck_assert(lm_trow_prepare_avx512(&buf.r));
                ck_assert_msg(!memcmp(direct.s8, buf.s8, (size_t)k) &&
                                  !memcmp(direct.corr16, buf.corr16, (size_t)k / 16 * sizeof *buf.corr16) &&
                                  !memcmp(direct.sc4, buf.sc4, (size_t)k / 4 * sizeof *buf.sc4) &&
                                  !memcmp(direct.mn, buf.mn, (size_t)k / 16 * sizeof *buf.mn) &&
                                  !memcmp(direct.d, buf.d, (size_t)k / 256 * sizeof *buf.d) &&
                                  !memcmp(direct.m, buf.m, (size_t)k / 256 * sizeof *buf.m) &&
                                  direct.r.type == ty && direct.r.k == k,
                              "%s k=%d: prepared rows differ", lm_type_name(ty), k);
            }
            free(row);
        }
}
END_TEST

/*
 * Q4_0, Q5_0 and Q8_0 rows prepared for the VNNI groups straight from the file
 * (lm_row_b32_prepare) hold what decode and prepare make of them: the codes
 * as signed bytes, every 16 codes' correction and the scales, for every
 * block count mod 4 (the last 1-3 blocks go through a step's room).
 */
START_TEST(test_row_b32_prepare_bitwise)
{
    if (lm_cpu_isa() < LM_ISA_AVX512)
        return;
    static const uint32_t types[] = {LM_Q4_0, LM_Q5_0, LM_Q8_0};
    static const int widths[] = {32, 64, 96, 128, 160, 224, K - 32, K, KMAX};
    static qrow_buf direct, ref;
    uint64_t seed = 43;
    for (int ti = 0; ti < 3; ti++)
        for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
            uint32_t ty = types[ti];
            int k = widths[wi];
            size_t rb = lm_row_bytes(ty, k);
            uint8_t *row = malloc(rb); /* ends where the row ends: ASan sees a read past it */
            ck_assert(row != NULL);
            random_row(ty, row, rb, &seed);
            if (ty == LM_Q8_0 && k == KMAX)
                for (int i = 0; i < 32; i++) /* a block at both ends of the code range */
                    row[2 + i] = i % 2 ? 0x80 : 0x7f;
            qrow_init(&direct), qrow_init(&ref);
            memset(direct.s8, 0x55, sizeof direct.s8), memset(direct.corr16, 0x55, sizeof direct.corr16);
            memset(direct.d, 0x55, sizeof direct.d);
            ck_assert(lm_row_b32_prepare(ty, row, k, &direct.r));
            lm_qrow_decode_scalar(&ref.r, ty, row, k);
            ck_assert(lm_trow_prepare_avx512(&ref.r));
            ck_assert_msg(!memcmp(direct.s8, ref.s8, (size_t)k), "%s k=%d: codes differ", lm_type_name(ty), k);
            ck_assert_msg(!memcmp(direct.corr16, ref.corr16, (size_t)k / 16 * sizeof *ref.corr16),
                          "%s k=%d: corrections differ", lm_type_name(ty), k);
            ck_assert_msg(!memcmp(direct.d, ref.d, (size_t)k / 32 * sizeof *ref.d), "%s k=%d: scales differ",
                          lm_type_name(ty), k);
            ck_assert(direct.r.type == ty && direct.r.k == k);
            free(row);
        }
    ck_assert(!lm_row_b32_prepare(LM_Q4_1, NULL, 32, &direct.r)); /* other types: decode and prepare */
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
    /* 24 to 21 and 15 blocks: lanes wrap, or some stay 0; 64 to 61, past
       LANE_WALK_BLOCKS: blocks taken lane by lane, every lane 4 or 3 deep;
       1 to 3 blocks.  Every count mod 4, for the four blocks in flight. */
    static const int widths[] = {K,    K - 32,    K - 64,    K - 96, 480, 32, 64, 96,
                                 KMAX, KMAX - 32, KMAX - 64, KMAX - 96};
    const int nw = (int)(sizeof widths / sizeof widths[0]);
    ck_assert_int_ge(KMAX / 32 - 1, LANE_WALK_BLOCKS);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (int wi = 0; wi < nw; wi++) {
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
            lm_tgroup_build(&g, lm_act_type(ty), ar, 8, k, 1, lm_cpu_isa(), gmem);
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

/* The fast paths of one type and width against the scalar ones, decoder and dots, at one isa. */
static void check_fast_paths(uint32_t ty, int k, int isa, const uint8_t *row, uint8_t act[][KMAX * 8],
                             float x[][KMAX], qrow_buf *ref, qrow_buf *fast)
{
    int at = lm_act_type(ty);
    qrow_init(ref);
    qrow_init(fast);
    lm_qrow_decode_scalar(&ref->r, ty, row, k);
    lm_qrow_decode(&fast->r, ty, row, k, isa);
    ck_assert_msg(!memcmp(ref->u, fast->u, (size_t)k) && !memcmp(ref->sc4, fast->sc4, sizeof ref->sc4) &&
                      !memcmp(ref->d, fast->d, sizeof ref->d) && !memcmp(ref->m, fast->m, sizeof ref->m) &&
                      !memcmp(ref->mn, fast->mn, sizeof ref->mn),
                  "%s k=%d isa %d: decoders differ", lm_type_name(ty), k, isa);
    act_row ar[8];
    float want[8], got[8];
    for (int t = 0; t < 8; t++) {
        lm_quantize_act(ty, x[t], act[t], k);
        lm_act_layout(at, k, &ar[t], act[t]);
        want[t] = lm_qrow_dot(&ref->r, &ar[t], LM_ISA_SCALAR);
        float f = lm_qrow_dot(&fast->r, &ar[t], isa);
        ck_assert_msg(!memcmp(&f, &want[t], 4), "%s k=%d isa %d: dot %a vs scalar %a", lm_type_name(ty), k, isa, f,
                      want[t]);
    }
    lm_qrow_dots(&fast->r, ar, 8, got, 1, isa); /* the same, several tokens a pass */
    for (int t = 0; t < 8; t++)
        ck_assert_msg(!memcmp(&got[t], &want[t], 4), "%s k=%d isa %d: token %d of 8 %a vs scalar %a",
                      lm_type_name(ty), k, isa, t, got[t], want[t]);
    if (isa == LM_ISA_AVX2) {
        const size_t rb = lm_row_bytes(ty, k);
        for (int t = 0; t < 8 && lm_rows_avx2(ty, row, rb, 1, k, &ar[t], &got[t]); t++)
            ck_assert_msg(!memcmp(&got[t], &want[t], 4), "%s k=%d token %d: AVX2 row %a vs scalar %a",
                          lm_type_name(ty), k, t, got[t], want[t]);
        for (int64_t split = 1; lm_type_block(ty) == 256 && split < k / 256 && split < 4; split++) {
            /* a K-quant row's super-blocks in two calls, the second from a lane past 0: the same lanes */
            float acc[LM_K_LANES] = {0}, mins[LM_K_LANES] = {0};
            lm_k_blocks_avx2(ty, row, 0, split, &ar[0], acc, mins);
            lm_k_blocks_avx2(ty, row, split, k / 256, &ar[0], acc, mins);
            const float f = lm_k_total(acc, mins);
            ck_assert_msg(!memcmp(&f, &want[0], 4), "%s k=%d split at %d: AVX2 blocks %a vs scalar %a",
                          lm_type_name(ty), k, (int)split, f, want[0]);
        }
        return;
    }
    if (isa < LM_ISA_AVX512)
        return;
    for (int n = 1; n <= 8; n += 3) /* one token, and groups */
        if (lm_fused_row_avx512(ty, row, k, ar, n, got, &fast->r))
            for (int t = 0; t < n; t++)
                ck_assert_msg(!memcmp(&got[t], &want[t], 4), "%s k=%d n=%d token %d: fused %a vs scalar %a",
                              lm_type_name(ty), k, n, t, got[t], want[t]);
    if (at == LM_Q8_K || at == LM_Q8_0)
        check_token_groups(&fast->r, ar, want);
}

/* Every path the CPU has (AVX2 too where it has AVX-512) against the scalar one. */
START_TEST(test_fast_paths_bitwise)
{
    const int cpu = lm_cpu_isa();
    if (cpu == LM_ISA_SCALAR)
        return;
    int isas[2], n_isa = 0;
    if (cpu >= LM_ISA_AVX2)
        isas[n_isa++] = LM_ISA_AVX2;
    if (cpu != LM_ISA_AVX2)
        isas[n_isa++] = cpu;
    uint64_t seed = 7;
    static float x[8][KMAX];
    static uint8_t row[KMAX * 4], act[8][KMAX * 8];
    static qrow_buf ref, fast;
    /* 24 and 23 blocks; 7 super-blocks, past K-quants' four lanes (56 blocks); 32 blocks, whole runs
       of 16; 28 blocks (qwen2.5-0.5b's rows), a run of 16 and 12 more; float rows whose last 15
       values are past the 16-lane steps */
    static const int widths[] = {K, K - 32, KMAX - 256, 1024, 896, 1007};
    for (int t = 0; t < 8; t++)
        for (int i = 0; i < KMAX; i++)
            x[t][i] = cosf((float)(i * (t + 1)) * 0.11f) * (1.0f + (float)((i + t) % 7));
    for (size_t ti = 0; ti < sizeof ALL_TYPES / sizeof ALL_TYPES[0]; ti++) {
        uint32_t ty = ALL_TYPES[ti];
        for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
            int k = widths[wi];
            if (k % lm_type_block(ty))
                continue;
            test_row(ty, row, k, &seed);
            for (int i = 0; i < n_isa; i++)
                check_fast_paths(ty, k, isas[i], row, act, x, &ref, &fast);
        }
    }
    float f1[K], f2[K];
    for (int i = 0; i < K; i++)
        f1[i] = x[0][i], f2[i] = x[1][i];
    for (int i = 0; i < n_isa; i++)
        for (int n = 1; n <= 70; n += 23) {
            float a1 = lm_dot_f(f1, f2, n, isas[i]), a2 = lm_dot_f_scalar(f1, f2, n);
            ck_assert_msg(!memcmp(&a1, &a2, 4), "float dot n=%d isa %d", n, isas[i]);
        }
}
END_TEST

/*
 * The AVX2 dots add byte products in pairs in 16 bits, which saturate:
 * every code at its largest and at 0 (the most negative once centred),
 * against activation codes all 127 and all -127 (x all 1 or -1), and group scales at
 * +-127, must still give the scalar dot's bits, decoded or read as stored, one
 * token at a time or eight rows by several tokens (qgemm_avx2.c).
 */
START_TEST(test_avx2_dots_extreme)
{
    if (lm_cpu_isa() < LM_ISA_AVX2)
        return;
    static const uint32_t types[] = {LM_Q4_0, LM_Q4_1, LM_Q5_0, LM_Q5_1, LM_Q8_0,
                                     LM_Q2_K, LM_Q3_K, LM_Q4_K, LM_Q5_K, LM_Q6_K};
    static const int bits[] = {4, 4, 5, 5, 8, 2, 3, 4, 5, 6};
    static uint8_t act[K * 8], raw[K * 2];
    static float x[K];
    static qrow_buf w;
    void *scratch8 = aligned_alloc(64, lm_rows8_bytes(K));
    ck_assert(scratch8);
    for (int ti = 0; ti < (int)(sizeof types / sizeof types[0]); ti++)
        for (int code = 0; code <= 1; code++)
            for (int sign = -1; sign <= 1; sign += 2) {
                uint32_t ty = types[ti];
                qrow_init(&w);
                w.r.type = ty, w.r.k = K;
                memset(w.u, code ? (1 << bits[ti]) - 1 : 0, K);
                for (int i = 0; i < K / 4; i++)
                    w.sc4[i] = ty == LM_Q3_K ? -32 : sign * 127;
                for (int i = 0; i < K / 16; i++)
                    w.mn[i] = 63;
                for (int i = 0; i < K / 32; i++)
                    w.d[i] = 1.0f, w.m[i] = 0.5f;
                for (int i = 0; i < K; i++)
                    x[i] = (float)sign;
                act_row ar;
                lm_quantize_act(ty, x, act, K);
                lm_act_layout(lm_act_type(ty), K, &ar, act);
                ck_assert_int_eq(abs(ar.qs[0]), 127); /* Q8_K puts the sign in its scale */
                float want = lm_qrow_dot(&w.r, &ar, LM_ISA_SCALAR), got = lm_qrow_dot(&w.r, &ar, LM_ISA_AVX2);
                ck_assert_msg(!memcmp(&got, &want, 4), "%s codes %s, activations %d: %a vs %a", lm_type_name(ty),
                              code ? "largest" : "0", 127 * sign, got, want);
                if (ty == LM_Q2_K || ty == LM_Q3_K)
                    continue;
                /* the same codes as the file holds them, through the row kernels: factors 1, then
                   the code bytes (Q8_0: 127 or -128; the others all bits set or none) under the
                   largest scales (Q4_K, Q5_K: 63 and mins 63; Q6_K: -128) */
                const int kq = lm_type_block(ty) == 256;
                size_t bs = lm_row_bytes(ty, kq ? 256 : 32);
                for (int b = 0; b < K / (kq ? 256 : 32); b++) {
                    uint8_t *blk = raw + b * bs;
                    memset(blk, ty == LM_Q8_0 ? (code ? 0x7f : 0x80) : (code ? 0xff : 0), bs);
                    if (ty == LM_Q6_K) {
                        memset(blk + 192, 0x80, 16);
                        memcpy(blk + 208, &(uint16_t){0x3c00}, 2);
                    } else if (kq) {
                        memset(blk + 4, 0xff, 12);
                        memcpy(blk, &(uint16_t){0x3c00}, 2);
                        memcpy(blk + 2, &(uint16_t){0x3c00}, 2);
                    } else {
                        memcpy(blk, &(uint16_t){0x3c00}, 2);
                        if (ty == LM_Q4_1 || ty == LM_Q5_1) /* the min */
                            memcpy(blk + 2, &(uint16_t){0x3c00}, 2);
                    }
                }
                qrow_init(&w);
                lm_qrow_decode_scalar(&w.r, ty, raw, K);
                want = lm_qrow_dot(&w.r, &ar, LM_ISA_SCALAR);
                ck_assert(lm_rows_avx2(ty, raw, lm_row_bytes(ty, K), 1, K, &ar, &got));
                ck_assert_msg(!memcmp(&got, &want, 4), "%s raw codes %s, activations %d: %a vs %a",
                              lm_type_name(ty), code ? "largest" : "0", 127 * sign, got, want);
                if (ty == LM_Q4_0 || ty == LM_Q4_1 || ty == LM_Q5_0) { /* and with the token in lanes (16-bit sums) */
                    act_row al = ar;
                    lm_act_lanes(&al);
                    ck_assert(lm_rows_avx2(ty, raw, lm_row_bytes(ty, K), 1, K, &al, &got));
                    ck_assert_msg(!memcmp(&got, &want, 4), "%s raw codes %s in lanes, activations %d: %a vs %a",
                                  lm_type_name(ty), code ? "largest" : "0", 127 * sign, got, want);
                }
                /* eight such rows (the same bytes) and five tokens through the batch kernel */
                float got8[5 * 8];
                const act_row ar5[5] = {ar, ar, ar, ar, ar};
                lm_rows8_avx2(ty, raw, 0, K, ar5, 5, got8, 8, scratch8);
                for (int i = 0; i < 5 * 8; i++)
                    ck_assert_msg(!memcmp(&got8[i], &want, 4), "%s raw codes %s, activations %d: rows8 %a vs %a",
                                  lm_type_name(ty), code ? "largest" : "0", 127 * sign, got8[i], want);
            }
    free(scratch8);
}
END_TEST

TCase *tcase_kernels(void)
{
    TCase *tc = tcase_create("kernels");
    tcase_set_timeout(tc, 60); /* the sanitizer build runs the bit-for-bit sweeps slowly */
    tcase_add_test(tc, test_fast_paths_bitwise);
    tcase_add_test(tc, test_avx2_dots_extreme);
    tcase_add_test(tc, test_rows16_bitwise);
    tcase_add_test(tc, test_one_token_extreme_sums);
    tcase_add_test(tc, test_rows16_amx_bitwise);
    tcase_add_test(tc, test_row_b32_vbmi_bitwise);
    tcase_add_test(tc, test_row_k_bitwise);
    tcase_add_test(tc, test_rows16_put_raw_bitwise);
    tcase_add_test(tc, test_row_b32_prepare_bitwise);
    tcase_add_test(tc, test_quantize_act_bitwise);
    return tc;
}
