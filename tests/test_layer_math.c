/*
 * tests/test_layer_math.c - the steps of a layer beside its matmuls, fast
 * paths against the portable ones, bit for bit: exp and SiLU, RMSNorm's
 * sums of squares, and attention over the cache's tiles.  Each test skips
 * what this CPU lacks.
 */
#include "util.h"
#include "../lm/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    static float g0[N];
    memcpy(g0, g, sizeof g);
    for (int isa = LM_ISA_AVX2; isa <= lm_cpu_isa(); isa++) { /* each x86 path the CPU has */
        memcpy(g, g0, sizeof g);
        lm_silu_mul(g, up, N, isa);
        for (int i = 0; i < N; i++)
            ck_assert_msg(!memcmp(&g[i], &ref[i], 4), "isa %d element %d: %a vs scalar %a", isa, i, g[i], ref[i]);
    }
    if (lm_cpu_isa() == LM_ISA_NEON || lm_cpu_isa() == LM_ISA_SCALAR) {
        lm_silu_mul(g, up, N, lm_cpu_isa());
        for (int i = 0; i < N; i++)
            ck_assert_msg(!memcmp(&g[i], &ref[i], 4), "element %d: %a vs scalar %a", i, g[i], ref[i]);
    }
}
END_TEST

/* RMSNorm with the AVX-512 sums of squares where there is AVX-512 gives each row lm_rmsnorm's bytes,
   and each sum (AVX2's too) is lm_sumsq's, for every tail length of its 16 partial sums. */
START_TEST(test_rmsnorm_isa_bitwise)
{
    enum { R = 19, N = 577 };
    static float x[R * N], w[N], got[R * N], want[R * N];
    for (int i = 0; i < R * N; i++) /* magnitudes far apart, so the order of the sums shows */
        x[i] = sinf((float)i * 0.77f) * (i % 13 == 0 ? 3e3f : 0.3f);
    for (int i = 0; i < N; i++)
        w[i] = 1.0f + 0.01f * (float)(i % 17);
    static const int dims[] = {N, 64, 7};
    for (int di = 0; di < 3; di++)
        for (int rows = 1; rows <= R; rows += 3) {
            int n = dims[di];
            for (int r = 0; r < rows; r++) {
                lm_rmsnorm_isa(got + (size_t)r * n, x + (size_t)r * n, w, n, 1e-5f, lm_cpu_isa());
                lm_rmsnorm(want + (size_t)r * n, x + (size_t)r * n, w, n, 1e-5f);
            }
            ck_assert_msg(!memcmp(got, want, (size_t)rows * n * sizeof *got), "n %d rows %d", n, rows);
        }
    if (lm_cpu_isa() < LM_ISA_AVX2)
        return;
    for (int n = 1; n <= N; n += n < 48 ? 1 : 97) {
        double a = lm_sumsq(x + 5, n), b = lm_sumsq_avx2(x + 5, n);
        ck_assert_msg(!memcmp(&a, &b, sizeof a), "AVX2 n %d: %a vs scalar %a", n, b, a);
        if (lm_cpu_isa() >= LM_ISA_AVX512) {
            b = lm_sumsq_avx512(x + 5, n);
            ck_assert_msg(!memcmp(&a, &b, sizeof a), "AVX-512 n %d: %a vs scalar %a", n, b, a);
        }
    }
}
END_TEST

/*
 * Portable attention of one head over keys and values in rows, step for
 * step as lm_attend_group without the fast path: a score is q[d] * k[d]
 * summed in d order, fused, from zero.
 */
static void attend_ref(const float *q, const float *k, const float *v, int lo, int pos, int hd,
                       float scale, float cap, float *scores, float *out)
{
    float mx = -INFINITY;
    for (int j = lo; j <= pos; j++) {
        float s = 0.0f;
        for (int d = 0; d < hd; d++)
            s = fmaf(q[d], k[(size_t)j * hd + d], s);
        s *= scale;
        if (cap > 0)
            s = cap * tanhf(s / cap);
        scores[j] = s;
        mx = s > mx ? s : mx;
    }
    float inv = lm_softmax_exp(scores, lo, pos, mx);
    for (int i = 0; i < hd; i++)
        out[i] = 0.0f;
    for (int j = lo; j <= pos; j++)
        for (int i = 0; i < hd; i++)
            out[i] = fmaf(scores[j], v[(size_t)j * hd + i], out[i]);
    for (int i = 0; i < hd; i++)
        out[i] *= inv;
}

/* Keys in rows (n of hd) laid out as lm_kv's tiles of 16 positions, f32 and f16. */
static void keys_to_tiles(const float *k, int n, int hd, float *t, uint16_t *t16)
{
    for (int j = 0; j < n; j++)
        for (int d = 0; d < hd; d++) {
            size_t at = (size_t)(j / 16) * 16 * hd + (size_t)d * 16 + j % 16;
            t[at] = k[(size_t)j * hd + d];
            t16[at] = lm_f32_to_f16(t[at]);
        }
}

typedef int (*attend_fn)(const lm_attq *qs, int n, const void *k0, const void *v0, int hd, int hdv, float scale,
                         float cap, float *scores, size_t sstride, float *acc, int f16);

/*
 * The AVX-512 attention (groups of queries over blocks of keys, K in tiles
 * of 16 positions, vector exp) gives every query the portable bytes, whatever the
 * other queries of its group: positions and windows differ within a group,
 * pairs share value loads, and rows span several key blocks.  So does the
 * AVX2 one, four queries at a time (some with no key in common).
 */
START_TEST(test_attention_fast_bitwise)
{
    enum { N = 150, NPOS = 160, HD = 256, NQ = LM_ATT_QMAX };
    static const int dims[] = {64, 96, 128, 256}; /* the unrolled sizes, and one that is not */
    static float k[N * HD], v[N * HD], q[NQ * HD], s1[N], s2[NQ * N], o1[HD], o2[NQ * HD];
    static float acc[NQ * LM_ATT_ACC];
    static uint16_t kt16[NPOS * HD], v16[N * HD];
    static float kt[NPOS * HD];
    if (lm_cpu_isa() < LM_ISA_AVX2)
        return;
    for (int i = 0; i < N * HD; i++) {
        k[i] = lm_f16_to_f32(lm_f32_to_f16(sinf((float)i * 0.37f) * 3.0f));
        v16[i] = lm_f32_to_f16(cosf((float)i * 0.21f)), v[i] = lm_f16_to_f32(v16[i]);
    }
    for (int i = 0; i < NQ * HD; i++)
        q[i] = sinf((float)i * 1.3f);
    static const int counts[] = {1, 6, NQ}; /* queries in a group */
    for (int c = 0; c < 4 * 2 * 3 * 3 * 2; c++) {
        int hd = dims[c % 4], f16 = c / 4 % 2, n = counts[c / 8 % 3], start = 53 * (c / 24 % 3);
        attend_fn attend = c / 72 ? lm_attend_group_avx512 : lm_attend_group_avx2;
        if (attend == lm_attend_group_avx512 && lm_cpu_isa() < LM_ISA_AVX512)
            continue;
        float cap = start % 2 ? 0.0f : 2.0f, sc = 1.0f / sqrtf((float)hd);
        lm_attq qs[NQ];
        for (int a = 0; a < n; a++) { /* pairs share lo; some windows cut */
            int pos = (start + 13 * a) % N, lo = (a / 2) % 3 == 2 ? pos / 3 : 0;
            qs[a] = (lm_attq){q + a * HD, o2 + a * HD, lo, pos};
        }
        keys_to_tiles(k, N, hd, kt, kt16);
        ck_assert(attend(qs, n, f16 ? (void *)kt16 : kt, f16 ? (void *)v16 : v, hd, hd, sc, cap, s2, N, acc, f16));
        for (int a = 0; a < n; a++) {
            attend_ref(qs[a].q, k, v, qs[a].lo, qs[a].pos, hd, sc, cap, s1, o1);
            ck_assert_msg(!memcmp(o1, o2 + a * HD, (size_t)hd * 4),
                          "%s hd %d f16 %d query %d of %d (lo %d pos %d)", c / 72 ? "AVX-512" : "AVX2", hd, f16,
                          a, n, qs[a].lo, qs[a].pos);
        }
    }
}
END_TEST

/*
 * Keys outside a query's range must not reach its scores' maximum.  Scores
 * here rise with the key (or fall), so the maximum is the query's last key
 * (or first): a key past pos (or before lo) that leaked in would change it,
 * and with it every weight.  Queries of a group end and start apart, so
 * some tiles hold keys that one query sees and another does not.
 */
/* One group of n queries for test_attention_range_edges: ends and windows shifted by shift. */
static void range_edges_case(attend_fn attend, const float *k, const float *v, const float *kt,
                             const uint16_t *kt16, const uint16_t *v16, const float *q, int hd, int f16,
                             int rising, int shift, int n)
{
    static float s1[256], s2[LM_ATT_QMAX * 256], o1[128], o2[LM_ATT_QMAX * 128];
    static float acc[LM_ATT_QMAX * LM_ATT_ACC];
    lm_attq qs[LM_ATT_QMAX];
    for (int a = 0; a < n; a++) { /* ends 1..15 apart, windows starting mid-tile */
        int pos = 100 + shift + 7 * a % 61, lo = rising ? 0 : 3 + shift + 5 * a % 37;
        qs[a] = (lm_attq){q + a * 128, o2 + a * 128, lo, pos};
    }
    ck_assert(attend(qs, n, f16 ? (const void *)kt16 : kt, f16 ? (const void *)v16 : v, hd, hd, 0.125f, 0.0f, s2,
                     256, acc, f16));
    for (int a = 0; a < n; a++) {
        attend_ref(qs[a].q, k, v, qs[a].lo, qs[a].pos, hd, 0.125f, 0.0f, s1, o1);
        ck_assert_msg(!memcmp(o1, o2 + a * 128, (size_t)hd * 4),
                      "rising %d hd %d f16 %d shift %d query %d of %d (lo %d pos %d)", rising, hd,
                      f16, shift, a, n, qs[a].lo, qs[a].pos);
    }
}

START_TEST(test_attention_range_edges)
{
    enum { N = 200, NPOS = 208, HD = 128, NQ = LM_ATT_QMAX };
    static float k[N * HD], v[N * HD], q[NQ * HD], kt[NPOS * HD];
    static uint16_t kt16[NPOS * HD], v16[N * HD];
    if (lm_cpu_isa() < LM_ISA_AVX2)
        return;
    for (int c = 0; c < 2 * 2 * 2; c++) {
        const int rising = c % 2, hd = c / 2 % 2 ? 128 : 64, f16 = c / 4;
        for (int j = 0; j < N; j++)
            for (int d = 0; d < hd; d++) {
                float x = 0.01f * (float)(rising ? j : N - j) + 0.001f * (float)(d % 7);
                k[j * hd + d] = lm_f16_to_f32(lm_f32_to_f16(x));
                v16[j * hd + d] = lm_f32_to_f16(cosf((float)(j * hd + d) * 0.21f));
                v[j * hd + d] = lm_f16_to_f32(v16[j * hd + d]);
            }
        for (int i = 0; i < NQ * HD; i++)
            q[i] = 0.5f + 0.01f * (float)(i % 5);
        keys_to_tiles(k, N, hd, kt, kt16);
        for (int shift = 0; shift < 16; shift++) /* every place in a tile for the ends */
            for (int n = 1; n <= NQ; n += 5) {
                range_edges_case(lm_attend_group_avx2, k, v, kt, kt16, v16, q, hd, f16, rising, shift, n);
                if (lm_cpu_isa() >= LM_ISA_AVX512)
                    range_edges_case(lm_attend_group_avx512, k, v, kt, kt16, v16, q, hd, f16, rising, shift, n);
            }
    }
}
END_TEST

TCase *tcase_layer_math(void)
{
    TCase *tc = tcase_create("layer_math");
    tcase_set_timeout(tc, 60); /* the sanitizer build runs the bit-for-bit sweeps slowly */
    tcase_add_test(tc, test_expf);
    tcase_add_test(tc, test_silu_mul);
    tcase_add_test(tc, test_attention_fast_bitwise);
    tcase_add_test(tc, test_attention_range_edges);
    tcase_add_test(tc, test_rmsnorm_isa_bitwise);
    return tc;
}
