/*
 * tests/test_matmul.c - lm_matmul end to end against the scalar dot of
 * each row and token, bit for bit, for one token, a few and a batch on
 * every path this CPU has; and Q4_0 matrices in the lanes layout (the
 * weights' copy, lm/repack.c) against the file's layout.
 */
#include "util.h"
#include "qrows.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/*
 * out (n tokens x rows, token-major) against the scalar dot of each row of
 * the matrix w (rows of type ty, k wide) and each token of x; 0 when all agree.
 */
static int matmul_matches_scalar(const lm_tensor *w, const float *x, const float *out, int n)
{
    static uint8_t act[K * 8];
    static qrow_buf buf;
    const uint32_t ty = w->type;
    const int64_t k = w->ne[0], rows = w->ne[1];
    const size_t rb = lm_row_bytes(ty, k);
    for (int t = 0; t < n; t++) {
        act_row ar;
        lm_quantize_act(ty, x + t * k, act, k);
        lm_act_layout(lm_act_type(ty), k, &ar, act);
        for (int64_t r = 0; r < rows; r++) {
            qrow_init(&buf);
            lm_qrow_decode_scalar(&buf.r, ty, (const uint8_t *)w->data + r * rb, k);
            float want = lm_qrow_dot(&buf.r, &ar, LM_ISA_SCALAR);
            if (memcmp(&out[t * rows + r], &want, 4)) {
                fprintf(stderr, "%s k=%ld, %d tokens: row %ld token %d: %a vs scalar %a\n", lm_type_name(ty),
                        (long)k, n, (long)r, t, out[t * rows + r], want);
                return -1;
            }
        }
    }
    return 0;
}

/*
 * lm_matmul end to end, on a matrix whose rows are not a multiple of 16
 * (16-row tiles, then the rows left over) and for one token, a few and a
 * batch (every kernel family), against the scalar dot of each row and token;
 * where the CPU has AVX-512, the same again without VBMI and GFNI (as on
 * Skylake-X: one token through the 16-row kernel) and through the AVX2 kernels.
 */
START_TEST(test_matmul_paths_bitwise)
{
    enum { ROWS = 37, NT = 40 };
    static const uint32_t types[] = {LM_Q4_0, LM_Q5_0, LM_Q8_0, LM_Q4_K, LM_Q5_K, LM_Q6_K,
                                     LM_Q4_1, LM_Q5_1, LM_Q2_K, LM_Q3_K, LM_F16, LM_BF16};
    /* four-token tiles and the 1-3 left; 12, 24 and (rows under 1024 columns) 30: row by row;
       17, 19, 33 and 38: the last 1-6 tokens row by row after whole groups */
    static const int counts[] = {1, 2, 5, 7, 12, 17, 19, 24, 30, 33, 38, NT};
    static uint8_t wmem[ROWS * K * 2];
    static float x[NT * K], out[NT * ROWS];
    uint64_t seed = 17;
    for (int i = 0; i < NT * K; i++)
        x[i] = cosf((float)i * 0.013f) * (float)(1 + i % 7);
    mm_scratch s = {0};
    ck_assert(mm_scratch_init(&s, 2, K, NT) == 0);
    const int isa = s.isa, amx = s.amx;
    const size_t ntypes = sizeof types / sizeof types[0];
    for (size_t ti = 0; ti < 4 * ntypes; ti++) {
        uint32_t ty = types[ti % ntypes];
        s.amx = amx && ti < ntypes; /* then the same without AMX tiles, where there were */
        s.ahead = (size_t)1024 << (ti % 7); /* any prefetch distance: it changes when lines come, not sums */
        if (ti >= 2 * ntypes) {     /* AVX-512 without VBMI and GFNI (the 16-row kernel) */
            if (isa < LM_ISA_AVX512)
                break;
            s.vbmi = s.gfni = 0;
        }
        if (ti >= 3 * ntypes) /* and through the AVX2 kernels */
            s.isa = LM_ISA_AVX2;
        size_t rb = lm_row_bytes(ty, K);
        for (int r = 0; r < ROWS; r++)
            random_row(ty, wmem + r * rb, rb, &seed);
        lm_tensor w = {"w", ty, {K, ROWS}, wmem, LM_LAYOUT_FILE};
        for (int c = 0; c < (int)(sizeof counts / sizeof counts[0]); c++) {
            lm_matmul(out, &w, x, counts[c], &s);
            ck_assert_msg(matmul_matches_scalar(&w, x, out, counts[c]) == 0, "%s, isa %d, %d tokens",
                          lm_type_name(ty), s.isa, counts[c]);
        }
    }
    mm_scratch_free(&s);
}
END_TEST

/*
 * F32, F16 and BF16 rows through several tokens go four rows and six
 * tokens a tile (lm/qrow_f.c): rows whose width leaves 1-15 values past
 * the tile's steps of 16, matrices whose rows leave 1-3 past the tiles,
 * and every count of tokens past whole tiles, bitwise the scalar dots;
 * where the CPU has AVX-512, AVX2's tiles of two rows and three tokens too.
 */
START_TEST(test_matmul_float_tiles)
{
    enum { NT = 13 };
    static const uint32_t types[] = {LM_F32, LM_F16, LM_BF16};
    static const int widths[] = {777, 16, 9, 1040};
    static const int heights[] = {37, 4, 2};
    static uint8_t wmem[37 * 1040 * 4];
    static float x[NT * 1040], out[NT * 37];
    uint64_t seed = 29;
    for (int i = 0; i < NT * 1040; i++)
        x[i] = sinf((float)i * 0.029f) * (float)(1 + i % 5);
    mm_scratch s = {0};
    ck_assert(mm_scratch_init(&s, 2, 1040, NT) == 0);
    const int native = s.isa, passes = native >= LM_ISA_AVX512 ? 2 : 1; /* then as AVX2 */
    for (size_t ti = 0; ti < passes * sizeof types / sizeof types[0]; ti++)
        for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
            for (size_t hi = 0; hi < sizeof heights / sizeof heights[0]; hi++) {
                const uint32_t ty = types[ti % 3];
                const int k = widths[wi], rows = heights[hi];
                s.isa = ti < 3 ? native : LM_ISA_AVX2;
                const size_t rb = lm_row_bytes(ty, k);
                for (int r = 0; r < rows; r++)
                    test_row(ty, wmem + r * rb, k, &seed);
                lm_tensor w = {"w", ty, {k, rows}, wmem, LM_LAYOUT_FILE};
                for (int n = 1; n <= NT; n++) {
                    lm_matmul(out, &w, x, n, &s);
                    ck_assert_msg(matmul_matches_scalar(&w, x, out, n) == 0, "%s k=%d, %d rows, %d tokens, isa %d",
                                  lm_type_name(ty), k, rows, n, s.isa);
                }
            }
    mm_scratch_free(&s);
}
END_TEST

/*
 * Matrices that share their activations as rounded (the same width, kind
 * and layout) but take them differently: Q2_K rows go in groups from 10
 * tokens, Q4_K rows from 14 and with their last 1-4 tokens row by row; in
 * one lm_matmul_many (a Q2_K file's attn_k and Q4_K attn_v) each must get
 * what its own lm_matmul gives.
 */
START_TEST(test_matmul_many_shared_acts)
{
    enum { ROWS = 32, NT = 40 };
    static const int counts[] = {1, 6, 12, 17, 20, 33};
    static const uint32_t pairs[][2] = {{LM_Q2_K, LM_Q4_K}, {LM_Q4_K, LM_Q2_K}, {LM_Q4_K, LM_Q5_K}};
    static uint8_t wmem[2][ROWS * K];
    static float x[NT * K], other[NT * K], want[2][NT * ROWS], got[2][NT * ROWS];
    uint64_t seed = 23;
    for (int i = 0; i < NT * K; i++)
        x[i] = cosf((float)i * 0.021f) * (float)(1 + i % 5), other[i] = sinf((float)i * 0.037f);
    mm_scratch s = {0};
    ck_assert(mm_scratch_init(&s, 2, K, NT) == 0);
    s.amx = 0; /* (the tiles' crossings differ) */
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        lm_tensor w[2];
        for (int i = 0; i < 2; i++) {
            size_t rb = lm_row_bytes(pairs[p][i], K);
            for (int r = 0; r < ROWS; r++)
                random_row(pairs[p][i], wmem[i] + r * rb, rb, &seed);
            w[i] = (lm_tensor){"w", pairs[p][i], {K, ROWS}, wmem[i], LM_LAYOUT_FILE};
        }
        const lm_tensor *ws[2] = {&w[0], &w[1]};
        float *outs[2] = {got[0], got[1]};
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
            for (int i = 0; i < 2; i++)
                lm_matmul(want[i], &w[i], x, counts[c], &s);
            lm_matmul(got[0], &w[0], other, NT, &s); /* groups of other tokens left in the scratch */
            lm_matmul_many(outs, ws, 2, x, counts[c], &s);
            for (int i = 0; i < 2; i++)
                ck_assert_msg(!memcmp(want[i], got[i], (size_t)counts[c] * ROWS * sizeof *got[i]),
                              "%s after %s, %d tokens: not as alone", lm_type_name(pairs[p][i]),
                              lm_type_name(pairs[p][1 - i]), counts[c]);
        }
    }
    mm_scratch_free(&s);
}
END_TEST

/*
 * One token and a few through Q4_0, Q5_0 and Q8_0 rows (1-19: the kernels of
 * every token count, blocks in lanes where the CPU has VBMI), rows whose
 * last step has 1-16 blocks (Q8_0's last 1-4 apart), against the scalar dot
 * of each row and token; and the same through the AVX2 kernels (lanes of
 * 1-16 blocks, 1-4 tokens a tile).
 */
START_TEST(test_matmul_few_tokens_bitwise)
{
    enum { ROWS = 19, NT = 19 };
    static const uint32_t types[] = {LM_Q4_0, LM_Q5_0, LM_Q8_0};
    static const int blocks[] = {1, 15, 16, 17, 18, 19, 20, 23, 24};
    static uint8_t wmem[ROWS * K * 2];
    static float x[NT * K], out[NT * ROWS];
    uint64_t seed = 29;
    mm_scratch s = {0};
    ck_assert(mm_scratch_init(&s, 2, K, NT) == 0);
    const size_t cases = 3 * sizeof blocks / sizeof blocks[0];
    for (size_t c = 0; c < 2 * cases; c++) {
        if (c == cases) { /* again through the AVX2 kernels, where the CPU has AVX-512 */
            if (s.isa < LM_ISA_AVX512)
                break;
            s.isa = LM_ISA_AVX2, s.amx = s.vbmi = s.gfni = 0;
        }
        const uint32_t ty = types[c % 3];
        const int k = 32 * blocks[c % cases / 3];
        const size_t rb = lm_row_bytes(ty, k);
        for (int r = 0; r < ROWS; r++)
            random_row(ty, wmem + r * rb, rb, &seed);
        for (int i = 0; i < NT * k; i++)
            x[i] = sinf((float)(i + c) * 0.021f) * (float)(1 + i % 5);
        lm_tensor w = {"w", ty, {k, ROWS}, wmem, LM_LAYOUT_FILE};
        for (int n = 1; n <= NT; n++) {
            lm_matmul(out, &w, x, n, &s);
            ck_assert_msg(matmul_matches_scalar(&w, x, out, n) == 0, "%s k=%d isa %d, %d tokens", lm_type_name(ty), k,
                          s.isa, n);
        }
    }
    mm_scratch_free(&s);
}
END_TEST

/* A matrix of `rows` rows into the layout, in place, unit by unit as the weights' copy does it. */
static void to_layout(int layout, uint8_t *m, int64_t k, int rows)
{
    const size_t unit = lm_layout_unit(layout, k), bytes = (size_t)rows * lm_row_bytes(lm_layout_type(layout), k);
    for (size_t at = 0; at < bytes; at += unit)
        lm_layout_apply(layout, m + at, k);
}

/*
 * Q4_0, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K rows in their lanes layouts (lm/repack.c): the layout
 * gives back the file's bytes, and a matrix in it multiplies to the bytes
 * the file's layout gives, for one token, a few and a batch (the lanes
 * kernels and the groups of 16), and again where the context's kernels do
 * not read the layout and unpack each row first (AVX-512 without VBMI,
 * AVX2, scalar).  K-quant rows come in whole steps of 4 super-blocks, as
 * the plan gives them the layout (test_klanes_plan), except Q4_K rows of 5
 * and 22 super-blocks, which end on super-blocks the layout leaves as they
 * are: only where AVX2 reads the layout (or nothing does) may rows end so.
 */
START_TEST(test_matmul_lanes_layout)
{
    enum { ROWS = 32, NT = 40, KL = 5632 };
    static const struct { int layout, type, k; } cases[] = {
        {LM_LAYOUT_Q4_0_LANES, LM_Q4_0, 512},  {LM_LAYOUT_Q4_0_LANES, LM_Q4_0, 2048},
        {LM_LAYOUT_Q4_0_LANES, LM_Q4_0, 896},  {LM_LAYOUT_Q4_0_LANES, LM_Q4_0, 1568}, /* 12 and 1 blocks past the steps */
        {LM_LAYOUT_Q4_0_LANES, LM_Q4_0, 576},  {LM_LAYOUT_Q4_0_LANES, LM_Q4_0, 1184}, /* 2 and 5 past */
        {LM_LAYOUT_Q4_K_LANES, LM_Q4_K, 1024}, {LM_LAYOUT_Q4_K_LANES, LM_Q4_K, 3072},
        {LM_LAYOUT_Q4_K_LANES, LM_Q4_K, 2048}, {LM_LAYOUT_Q4_K_LANES, LM_Q4_K, 5120},
        {LM_LAYOUT_Q4_K_LANES, LM_Q4_K, 1280}, {LM_LAYOUT_Q4_K_LANES, LM_Q4_K, KL}, /* past their steps */
        {LM_LAYOUT_Q6_K_LANES, LM_Q6_K, 1024}, {LM_LAYOUT_Q6_K_LANES, LM_Q6_K, 3072},
        {LM_LAYOUT_Q6_K_LANES, LM_Q6_K, 2048}, {LM_LAYOUT_Q6_K_LANES, LM_Q6_K, 5120},
        {LM_LAYOUT_Q5_0_LANES, LM_Q5_0, 512},  {LM_LAYOUT_Q5_0_LANES, LM_Q5_0, 2048},
        {LM_LAYOUT_Q5_0_LANES, LM_Q5_0, 576},  {LM_LAYOUT_Q5_0_LANES, LM_Q5_0, 896}, /* 2 and 12 blocks past */
        {LM_LAYOUT_Q5_0_LANES, LM_Q5_0, 1568}, {LM_LAYOUT_Q5_0_LANES, LM_Q5_0, 1280}, /* 1 and 8 past */
        {LM_LAYOUT_Q5_0_LANES, LM_Q5_0, 1184}, /* 5 past: a group of four and one alone */
        {LM_LAYOUT_Q5_1_LANES, LM_Q5_1, 512},  {LM_LAYOUT_Q5_1_LANES, LM_Q5_1, 576},
        {LM_LAYOUT_Q5_1_LANES, LM_Q5_1, 896},  {LM_LAYOUT_Q5_1_LANES, LM_Q5_1, 1184},
        {LM_LAYOUT_Q8_0_LANES, LM_Q8_0, 512},  {LM_LAYOUT_Q8_0_LANES, LM_Q8_0, 2048},
        {LM_LAYOUT_Q8_0_LANES, LM_Q8_0, KL},   {LM_LAYOUT_Q8_0_LANES, LM_Q8_0, 576}, /* 2 blocks past */
        {LM_LAYOUT_Q8_0_LANES, LM_Q8_0, 1184}, {LM_LAYOUT_Q8_0_LANES, LM_Q8_0, 896}, /* 5 and 12 past */
    };
    static const int counts[] = {1, 2, 3, 4, 5, 8, 9, 13, 15, 16, 17, 23, 24, 33, NT};
    enum { RB = KL / 32 * 34 }; /* the longest row's bytes: Q8_0's */
    static uint8_t file[ROWS * RB], lanes[ROWS * RB], back[ROWS * RB];
    static float x[NT * KL], want[NT * ROWS], got[NT * ROWS];
    uint64_t seed = 41;
    for (int i = 0; i < NT * KL; i++)
        x[i] = sinf((float)i * 0.017f) * (float)(1 + i % 6);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int k = cases[ci].k, layout = cases[ci].layout;
        const uint32_t type = (uint32_t)cases[ci].type;
        const size_t rb = lm_row_bytes(type, k);
        for (int r = 0; r < ROWS; r++)
            random_row(type, file + r * rb, rb, &seed);
        memcpy(lanes, file, ROWS * rb);
        to_layout(layout, lanes, k, ROWS);
        ck_assert(memcmp(lanes, file, ROWS * rb) != 0);
        for (int r = 0; r < ROWS; r++)
            lm_layout_undo(layout, lanes + r * rb, back + r * rb, k);
        ck_assert_msg(!memcmp(back, file, ROWS * rb), "%s k=%d: the layout does not give the file's bytes back",
                      lm_type_name(type), k);
        lm_tensor wf = {"w", type, {k, ROWS}, file, LM_LAYOUT_FILE};
        lm_tensor wl = {"w", type, {k, ROWS}, lanes, layout};
        for (int r = 0; r < ROWS; r += 7) { /* looked up a row at a time, as tied embeddings are */
            static float from_file[KL], from_lanes[KL];
            lm_tensor_row_f32(&wf, r, from_file, back);
            lm_tensor_row_f32(&wl, r, from_lanes, back);
            ck_assert_msg(!memcmp(from_file, from_lanes, (size_t)k * sizeof *from_file), "%s k=%d: row %d looked up",
                          lm_type_name(type), k, r);
        }
        mm_scratch s = {0};
        ck_assert(mm_scratch_init(&s, 2, k, NT) == 0);
        const int isa = s.isa, gfni = s.gfni, vbmi = s.vbmi, amx = s.amx;
        for (int path = -1; path < 5; path++) {
            if (path == -1 && !amx)
                continue;
            if (path == -1) /* without AMX, as on a Zen 4: the VNNI groups read the layouts for batches */
                s.amx = 0;
            if (path == 0)
                s.isa = isa, s.vbmi = vbmi, s.gfni = gfni, s.amx = amx;
            if (path == 1 && (isa < LM_ISA_AVX512 || !gfni))
                continue;
            if (path == 1) /* AVX-512 without GFNI: K-quant rows unpacked, the other copy of qrow_k.c */
                s.gfni = 0;
            if (path == 2 && isa < LM_ISA_AVX512)
                continue;
            if (path == 2) /* AVX-512 without VBMI: Q4_0 rows unpacked, 16-row groups for batches */
                s.vbmi = s.gfni = s.amx = 0;
            if (path == 3 && isa < LM_ISA_AVX2)
                continue;
            if (path == 3)
                s.isa = LM_ISA_AVX2, s.vbmi = s.gfni = s.amx = 0;
            if (path == 4)
                s.isa = LM_ISA_SCALAR, s.vbmi = s.gfni = s.amx = 0;
            if (layout == LM_LAYOUT_Q4_K_LANES && k % 1024 && (s.gfni || s.amx))
                continue; /* (the GFNI and AMX kernels never meet such rows: test_klanes_plan) */
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
                lm_matmul(want, &wf, x, counts[c], &s);
                lm_matmul(got, &wl, x, counts[c], &s);
                ck_assert_msg(!memcmp(want, got, (size_t)counts[c] * ROWS * sizeof *got),
                              "%s k=%d isa %d vbmi %d gfni %d amx %d, %d tokens: lanes layout != file layout",
                              lm_type_name(type), k, s.isa, s.vbmi, s.gfni, s.amx, counts[c]);
            }
        }
        mm_scratch_free(&s);
    }
}
END_TEST

/*
 * Which tensors the weights' copy lays out in lanes: Q4_0 (and Q8_0)
 * matrices of a 16-block step a row or more in rows 16 at a time, where
 * the kernels read them natively; the embeddings only when tied (no output.weight); never a
 * tensor past the data section, or one that shares bytes with another.
 */
START_TEST(test_lanes_plan)
{
    enum { STEP = LM_Q4_0_STEP_BYTES };
    gguf_tensor t[] = {
        {"a", 2, {512, 16, 1, 1}, LM_Q4_0, 0, 16 * STEP, NULL},                /* fits */
        {"b", 2, {512, 16, 1, 1}, LM_Q4_0, 16 * STEP, 16 * STEP, NULL},        /* fits, right after a */
        {"c", 2, {512, 16, 1, 1}, LM_Q4_0, 40 * STEP, 16 * STEP, NULL},        /* overlapped by d */
        {"d", 2, {64, 8, 1, 1}, LM_F32, 50 * STEP, 2048, NULL},
        {"token_embd.weight", 2, {512, 16, 1, 1}, LM_Q4_0, 60 * STEP, 16 * STEP, NULL},
        {"e", 2, {512, 8, 1, 1}, LM_Q4_0, 80 * STEP, 8 * STEP, NULL},          /* 8 rows */
        {"f", 2, {768, 16, 1, 1}, LM_Q4_0, 90 * STEP, 24 * STEP, NULL},        /* 1.5 steps a row: fits */
        {"g", 2, {512, 16, 1, 1}, LM_Q8_0, 120 * STEP, 16 * 544, NULL},        /* Q8_0: its own */
        {"h", 3, {512, 16, 2, 1}, LM_Q4_0, 168 * STEP, 32 * STEP, NULL},       /* 3-D */
        {"j", 2, {480, 16, 1, 1}, LM_Q4_0, 151 * STEP, 15 * STEP, NULL},       /* under a step a row */
        {"i", 2, {512, 16, 1, 1}, LM_Q4_0, 200 * STEP, 16 * STEP, NULL},       /* fits, at the section's end */
        {"output.weight", 2, {64, 8, 1, 1}, LM_F32, 167 * STEP, 0, NULL},     /* so the embeddings are not tied */
    };
    const uint8_t want[] = {1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0};
    const int n = sizeof t / sizeof t[0];
    gguf_file g = {.n_tensors = n, .tensors = t};
    uint8_t got[sizeof t / sizeof t[0]];
    ck_assert_int_eq(lm_lanes_plan(&g, 216 * STEP, got), 0);
    const int native = lm_lanes_layout_native();
    for (int i = 0; i < n; i++) {
        const int q8 = t[i].type == LM_Q8_0 && lm_q8_0_lanes_native();
        ck_assert_msg(got[i] == (q8 ? LM_LAYOUT_Q8_0_LANES : want[i] && native), "tensor %s: %d", t[i].name, got[i]);
    }
    ck_assert_int_eq(lm_lanes_plan(&g, 215 * STEP, got), 0); /* i now ends past the section */
    ck_assert_int_eq(got[n - 2], 0);
    g.n_tensors = n - 1; /* without an output matrix the embeddings serve as one */
    ck_assert_int_eq(lm_lanes_plan(&g, 216 * STEP, got), 0);
    ck_assert_int_eq(got[4], native);
}
END_TEST

/*
 * Q5_0 and Q5_1 matrices take theirs (LM_LAYOUT_Q5_0_LANES, _Q5_1_) with a
 * 16-block step a row or more, any number of rows, where AVX2 is the
 * widest: smollm2's and qwen2.5's rows of 576 and 896 columns (Q4_K_M's
 * Q5_0 fallback, Q5_K_M's Q5_1).
 */
START_TEST(test_q5_lanes_plan)
{
    enum { B = 22, Q5 = LM_LAYOUT_Q5_0_LANES };
    gguf_tensor t[] = {
        {"a", 2, {576, 3, 1, 1}, LM_Q5_0, 0, 3 * 18 * B, NULL},                  /* fits, 2 blocks past the step */
        {"b", 2, {896, 5, 1, 1}, LM_Q5_0, 100 * B, 5 * 28 * B, NULL},            /* fits, 12 past */
        {"c", 2, {480, 4, 1, 1}, LM_Q5_0, 300 * B, 4 * 15 * B, NULL},            /* under a step a row */
        {"d", 2, {512, 2, 1, 1}, LM_Q5_0, 400 * B, 2 * 16 * B - 1, NULL},        /* short of its bytes */
        {"token_embd.weight", 2, {512, 2, 1, 1}, LM_Q5_0, 500 * B, 32 * B, NULL}, /* untied embeddings */
        {"e", 2, {512, 1, 1, 1}, LM_Q5_1, 600 * B, 16 * 24, NULL},               /* Q5_1: its own */
        {"f", 2, {512, 1, 1, 1}, LM_Q5_1, 650 * B, 16 * 24 - 2, NULL},           /* Q5_1 short of its bytes */
        {"output.weight", 2, {64, 8, 1, 1}, LM_F32, 699 * B, 0, NULL},
    };
    const uint8_t want[] = {Q5, Q5, 0, 0, 0, LM_LAYOUT_Q5_1_LANES, 0, 0};
    gguf_file g = {.n_tensors = sizeof t / sizeof t[0], .tensors = t};
    uint8_t got[sizeof t / sizeof t[0]];
    ck_assert_int_eq(lm_lanes_plan(&g, 700 * B, got), 0);
    const int native = lm_q5_0_lanes_native();
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        ck_assert_msg(got[i] == (native ? want[i] : LM_LAYOUT_FILE), "tensor %s: %d", t[i].name, got[i]);
}
END_TEST

/*
 * Q4_K and Q6_K matrices take their layouts with rows of whole steps (4
 * super-blocks), any number of rows, each type where its kernels run
 * (Q4_K's on AVX2 CPUs too, and there also rows whose whole steps hold
 * three quarters of them at least: b and l, not n).
 */
START_TEST(test_klanes_plan)
{
    enum { SB = 144, Q4K = LM_LAYOUT_Q4_K_LANES, Q6K = LM_LAYOUT_Q6_K_LANES };
    gguf_tensor t[] = {
        {"a", 2, {1024, 3, 1, 1}, LM_Q4_K, 0, 3 * 4 * SB, NULL},                 /* fits */
        {"b", 2, {1280, 2, 1, 1}, LM_Q4_K, 100 * SB, 2 * 5 * SB, NULL},          /* a super-block past its step */
        {"c", 2, {768, 4, 1, 1}, LM_Q4_K, 200 * SB, 4 * 3 * SB, NULL},           /* 3 super-blocks a row */
        {"token_embd.weight", 2, {1024, 2, 1, 1}, LM_Q4_K, 300 * SB, 8 * SB, NULL},
        {"d", 2, {1024, 2, 1, 1}, LM_Q6_K, 400 * SB, 2 * 4 * 210, NULL},         /* fits, Q6_K */
        {"e", 2, {1024, 2, 1, 1}, LM_Q4_K, 500 * SB, 7 * SB, NULL},              /* short of its bytes */
        {"f", 2, {1024, 2, 1, 1}, LM_Q4_K, 600 * SB, 8 * SB, NULL},              /* overlapped by g */
        {"g", 2, {1024, 1, 1, 1}, LM_Q4_K, 604 * SB, 4 * SB, NULL},
        {"h", 2, {1536, 3, 1, 1}, LM_Q6_K, 620 * SB, 3 * 6 * 210, NULL},        /* a third of each row left over */
        {"i", 2, {512, 3, 1, 1}, LM_Q6_K, 650 * SB, 3 * 2 * 210, NULL},         /* 2 super-blocks a row */
        {"j", 2, {2048, 1, 1, 1}, LM_Q6_K, 670 * SB, 8 * 210, NULL},            /* fits, Q6_K */
        {"k", 2, {2560, 1, 1, 1}, LM_Q6_K, 683 * SB, 10 * 210, NULL},           /* half a step past its steps */
        {"output.weight", 2, {64, 8, 1, 1}, LM_F32, 699 * SB, 0, NULL},         /* the embeddings untied */
        {"l", 2, {5632, 1, 1, 1}, LM_Q4_K, 700 * SB, 22 * SB, NULL},            /* 5 steps and half of one */
        {"m", 2, {5120, 1, 1, 1}, LM_Q4_K, 722 * SB, 20 * SB, NULL},            /* 5 steps */
        {"n", 2, {1536, 1, 1, 1}, LM_Q4_K, 742 * SB, 6 * SB, NULL},             /* a step and half of one */
    };
    const uint8_t want[] = {Q4K, 0, 0, 0, Q6K, 0, 0, 0, 0, 0, Q6K, 0, 0, 0, Q4K, 0};
    const uint8_t want_avx2[] = {Q4K, Q4K, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, Q4K, Q4K, 0}; /* no Q6_K kernel */
    gguf_file g = {.n_tensors = sizeof t / sizeof t[0], .tensors = t};
    uint8_t got[sizeof t / sizeof t[0]];
    ck_assert_int_eq(lm_lanes_plan(&g, 748 * SB, got), 0);
    const int q4_k = lm_klanes_layout_native(LM_Q4_K), q6_k = lm_klanes_layout_native(LM_Q6_K);
    const int avx2 = q4_k && !lm_cpu_gfni();
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        const int native = want[i] == Q4K ? q4_k : q6_k;
        const int w = avx2 ? want_avx2[i] : native ? want[i] : LM_LAYOUT_FILE;
        ck_assert_msg(got[i] == w, "tensor %s: %d, not %d", t[i].name, got[i], w);
    }
}
END_TEST

/*
 * The prefetch distance's tuning (lm/prefetch_tune.c): every candidate in
 * turn, each distance with the request into L1 and without, each judged by
 * its fastest pass, so a pass slowed by the machine does not lose its
 * candidate the choice; then the choice stays.  KVCHAT_PREFETCH fixes it.
 */
static size_t tuned_ahead(double l1_cost)
{
    lm_ahead_tune t;
    lm_ahead_tune_init(&t);
    size_t seen[LM_AHEAD_CHOICES] = {0};
    int passes = 0;
    while (t.chosen == 0) {
        const size_t ahead = lm_ahead_next(&t), d = lm_ahead_bytes(ahead);
        ck_assert(passes < 100);
        if (passes < LM_AHEAD_CHOICES)
            seen[passes] = ahead;
        /* 3 KiB the fastest, but its first pass stalled; 2 KiB next, 8 KiB the slowest */
        double secs = 0.020 + (d > 3072 ? d - 3072 : 3072 - d) * 1e-7 + (ahead & LM_AHEAD_L1 ? l1_cost : 0);
        if (d == 3072 && passes < LM_AHEAD_CHOICES)
            secs *= 3;
        lm_ahead_record(&t, ahead ^ LM_AHEAD_L1, 0.001); /* not what was asked with: not counted */
        lm_ahead_record(&t, ahead, secs);
        passes++;
    }
    for (int i = 0; i < LM_AHEAD_CHOICES; i++)
        for (int j = 0; j < i; j++)
            ck_assert_msg(seen[i] > 1 && seen[i] != seen[j], "candidate %d: %zu", i, seen[i]);
    ck_assert_int_eq(passes % LM_AHEAD_CHOICES, 0);
    const size_t chosen = lm_ahead_next(&t);
    lm_ahead_record(&t, chosen, 1.0); /* once chosen, later passes change nothing */
    ck_assert_uint_eq(lm_ahead_next(&t), chosen);
    return chosen;
}

START_TEST(test_prefetch_tune)
{
    unsetenv("KVCHAT_PREFETCH");
    ck_assert_uint_eq(tuned_ahead(0.002), 3072);               /* the request into L1 slows the passes */
    ck_assert_uint_eq(tuned_ahead(-0.002), 3072 | LM_AHEAD_L1); /* or speeds them up */
    const char *fixed[] = {"5120", "5120:l2"};
    for (int f = 0; f < 2; f++) {
        setenv("KVCHAT_PREFETCH", fixed[f], 1);
        lm_ahead_tune t;
        lm_ahead_tune_init(&t);
        for (int i = 0; i < 40; i++)
            lm_ahead_record(&t, lm_ahead_next(&t), 0.01);
        ck_assert_uint_eq(lm_ahead_next(&t), f ? 5120 : 5120 | LM_AHEAD_L1);
    }
    unsetenv("KVCHAT_PREFETCH");
}
END_TEST

/* One work share of n runs: each run taken counted in hits; some runs spin a while, so that shares are stolen. */
static void take_runs(lm_runs *r, int64_t n, _Atomic int *hits, unsigned seed)
{
    lm_runs_iter it;
    lm_runs_begin(r, &it, n);
    for (int64_t u; (u = lm_runs_next(&it)) >= 0;) {
        ck_assert(u < n);
        atomic_fetch_add(&hits[u], 1);
        seed = seed * 1103515245u + 12345u + (unsigned)u;
        for (volatile unsigned spin = (seed >> 16) % 16 == 0 ? (seed >> 8) % 2000 : 0; spin > 0; spin--)
            ;
    }
}

/* Work share j's runs: mostly few, so that the wrap comes soon; 0 too. */
static int64_t runs_of(int j, int most)
{
    return j * 37 % (j % 16 ? 20 : most);
}

/*
 * Every run of every work share is done exactly once, with 2-4 threads,
 * many matrices in a row without a barrier between (as matmul_many has
 * them), past the 16-bit work-share numbers' wrap; and a region of fewer
 * threads splits its runs without leaving the shares' numbers apart.
 */
START_TEST(test_runs_each_once)
{
    enum { RING = 8, MOST = 300 };
    static _Atomic int hits[RING][MOST];
    const int threads[] = {2, 3, 4}, shares[] = {70000, 3000, 3000};
    for (int c = 0; c < 3; c++) {
        lm_runs r;
        ck_assert_int_eq(lm_runs_init(&r, threads[c]), 0);
        memset(hits, 0, sizeof hits);
        int bad = 0;
        for (int part = 0; part < 2; part++) { /* a region of every thread, then one of one */
            const int nt = part ? 1 : threads[c], n_shares = part ? 50 : shares[c];
#pragma omp parallel num_threads(nt) reduction(+ : bad)
            for (int j = 0; j < n_shares; j++) {
                take_runs(&r, runs_of(j, MOST), hits[j % RING], (unsigned)(j * 7 + omp_get_thread_num()));
                if (j % 4 != 3 && j != n_shares - 1)
                    continue;
#pragma omp barrier
                if (omp_get_thread_num() == 0)
                    for (int i = j - j % 4; i <= j; i++)
                        for (int u = 0; u < MOST; u++) {
                            bad += atomic_load(&hits[i % RING][u]) != (u < runs_of(i, MOST));
                            atomic_store(&hits[i % RING][u], 0);
                        }
#pragma omp barrier
            }
            ck_assert_int_eq(bad, 0);
            for (int t = 1; t < threads[c]; t++)
                ck_assert_uint_eq(r.share[t].seq, r.share[0].seq);
        }
        lm_runs_free(&r);
    }
}
END_TEST

TCase *tcase_matmul(void)
{
    TCase *tc = tcase_create("matmul");
    tcase_set_timeout(tc, 60); /* the sanitizer build runs the bit-for-bit sweeps slowly */
    tcase_add_test(tc, test_matmul_paths_bitwise);
    tcase_add_test(tc, test_matmul_float_tiles);
    tcase_add_test(tc, test_matmul_many_shared_acts);
    tcase_add_test(tc, test_matmul_few_tokens_bitwise);
    tcase_add_test(tc, test_matmul_lanes_layout);
    tcase_add_test(tc, test_lanes_plan);
    tcase_add_test(tc, test_klanes_plan);
    tcase_add_test(tc, test_q5_lanes_plan);
    tcase_add_test(tc, test_prefetch_tune);
    tcase_add_test(tc, test_runs_each_once);
    return tc;
}
