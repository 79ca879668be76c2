/*
 * tests/test_layer_math.c - the steps of a layer beside its matmuls, fast
 * paths against the portable ones, bit for bit: exp and SiLU, RMSNorm's
 * sums of squares, and attention over the cache's tiles.  Each test skips
 * what this CPU lacks.
 */
#include "util.h"
#include "../lm/internal.h"
#include "attcheck.h"

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
 * The vector softmaxes give the scalar bytes (each weight and 1 / their
 * sum) on rows where some keys lie past exp's underflow edge and others
 * not, in every lane and vector of a step, whatever the row's start and
 * length; and where none do.
 */
START_TEST(test_softmax_bitwise)
{
    enum { N = 300 };
    static float src[N], a[N], b[N];
    for (int spread = 0; spread < 2; spread++)
        for (int lo = 0; lo < 20; lo += 3)
            for (int hi = lo; hi < N; hi += 37) {
                for (int i = 0; i < N; i++) /* from 0 down to -120 (or -50: no underflow) */
                    src[i] = (float)((i * 7919) % 1201) * (spread ? -0.1f : -0.04f) + 3.0f;
                src[(lo + hi) / 2] = 3.0f;
                memcpy(a, src, sizeof src), memcpy(b, src, sizeof src);
                float want = lm_softmax_exp(a, lo, hi, 3.0f), got = lm_softmax_exp_avx2(b, lo, hi, 3.0f);
                if (lm_cpu_isa() >= LM_ISA_AVX2) {
                    ck_assert_msg(!memcmp(&got, &want, sizeof got), "AVX2 1/sum %a vs %a (%d..%d)", got, want, lo, hi);
                    ck_assert_msg(!memcmp(a + lo, b + lo, (size_t)(hi - lo + 1) * sizeof *a), "AVX2 weights (%d..%d)", lo, hi);
                }
                if (lm_cpu_isa() >= LM_ISA_AVX512) {
                    memcpy(b, src, sizeof src);
                    got = lm_softmax_exp_avx512(b, lo, hi, 3.0f);
                    ck_assert_msg(!memcmp(&got, &want, sizeof got), "AVX-512 1/sum %a vs %a (%d..%d)", got, want, lo, hi);
                    ck_assert_msg(!memcmp(a + lo, b + lo, (size_t)(hi - lo + 1) * sizeof *a), "AVX-512 weights (%d..%d)", lo, hi);
                }
            }
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
    if (lm_cpu_isa() < LM_ISA_AVX2) { /* scalar or NEON */
        lm_silu_mul(g, up, N, lm_cpu_isa());
        for (int i = 0; i < N; i++)
            ck_assert_msg(!memcmp(&g[i], &ref[i], 4), "element %d: %a vs scalar %a", i, g[i], ref[i]);
    }
}
END_TEST

/*
 * GELU(g) * up through ggml's f16 table: the vector path gives the scalar
 * bytes for values that round to every kind of f16 (normal, subnormal,
 * zero, halfway cases), the ends past +-10, infinities and NaNs.
 */
START_TEST(test_gelu_mul)
{
    enum { N = 4107 };
    static float g[N], up[N], ref[N], g0[N];
    lm_model m;
    memset(&m, 0, sizeof m);
    ck_assert_int_eq(lm_gelu_table_init(&m), 0);
    for (int i = 0; i < N; i++) {
        g[i] = -12.0f + (float)i * (24.0f / N) + (i % 5) * 0.003f;
        up[i] = 0.5f + (float)(i % 7) * 0.25f;
    }
    const float odd[] = {0.0f, -0.0f, 10.0f, -10.0f, 9.999f, -9.999f, 1e-6f, -3e-8f, 1e-40f,
                         1.0f + 0x1p-11f, 1.0f + 0x1p-11f + 0x1p-23f, 2049.0f / 2048.0f + 0x1p-12f,
                         __builtin_inff(), -__builtin_inff(), __builtin_nanf(""), -__builtin_nanf("0x123")};
    for (size_t j = 0; j < sizeof odd / sizeof odd[0]; j++)
        g[3 + 5 * j] = odd[j];
    for (int i = 0; i < N; i++)
        ref[i] = lm_gelu(&m, g[i]) * up[i];
    ck_assert(ref[3] == 0.0f && ref[13] == 10.0f * up[13] && ref[18] == 0.0f); /* 0, the ends */
    for (uint32_t h = 0x7c01; h < 0x10000; h++) /* the vector path's NaNs: one NaN a sign */
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
            ck_assert_msg(!memcmp(&m.gelu_table[h], &m.gelu_table[(h & 0x8000) | 0x7e00], 4), "table[%#x]", h);
    memcpy(g0, g, sizeof g);
    for (int isa = LM_ISA_SCALAR; isa <= lm_cpu_isa(); isa++) {
        memcpy(g, g0, sizeof g);
        lm_gelu_mul(&m, g, up, N, isa);
        for (int i = 0; i < N; i++)
            ck_assert_msg(!memcmp(&g[i], &ref[i], 4), "isa %d element %d (%a): %a vs scalar %a", isa, i, g0[i],
                          g[i], ref[i]);
    }
    free(m.gelu_table);
}
END_TEST

/* Whether got is within n units in the last place of the float nearest want. */
static int within_ulps(float got, double want, int n)
{
    int e;
    frexp(want, &e);
    return fabs((double)got - want) <= n * ldexp(1.0, e - 24);
}

/*
 * Soft-capping: tanh within 2 ulp of the exact value on both sides of
 * TANH_POLY and out to where it is 1 (odd: -x gives the negated bytes);
 * with a cap of 50, within 3 (x / cap and cap * t each round once); zeros
 * keep their signs, infinities reach the cap, NaN stays NaN.  Every path
 * the CPU has gives the scalar bytes, tails included, and AVX-512's capped
 * scores and their maximum are the scalar ones, a NaN passed over.
 */
START_TEST(test_softcap)
{
    for (uint32_t b = 0x32000000u; b < 0x41a00000u; b += 997) { /* 7e-9 .. 20 */
        float x, neg;
        memcpy(&x, &b, 4);
        const float got = lm_softcap(x, 1.0f);
        ck_assert_msg(within_ulps(got, tanh((double)x), 2), "tanh(%a) = %a, want %a", x, got, tanh((double)x));
        neg = lm_softcap(-x, 1.0f);
        ck_assert_msg(neg == -got, "tanh(-%a) = %a, not -%a", x, neg, got);
        const double want = 50.0 * tanh((double)(50.0f * x) / 50.0);
        ck_assert_msg(within_ulps(lm_softcap(50.0f * x, 50.0f), want, 3), "50 tanh(%a / 50)", 50.0f * x);
    }
    const float zero = lm_softcap(0.0f, 30.0f), nzero = lm_softcap(-0.0f, 30.0f);
    ck_assert(zero == 0.0f && !signbit(zero) && nzero == 0.0f && signbit(nzero));
    ck_assert(lm_softcap(INFINITY, 30.0f) == 30.0f && lm_softcap(-INFINITY, 30.0f) == -30.0f);
    ck_assert(lm_softcap(1e30f, 30.0f) == 30.0f && isnan(lm_softcap(NAN, 30.0f)));

    enum { N = 4107 };
    static float x[N], ref[N], got[N];
    const float cap = 50.0f, edge = TANH_POLY * cap;
    for (int i = 0; i < N; i++)
        x[i] = -400.0f + (float)i * (800.0f / N) + (float)(i % 5) * 0.003f;
    const float odd[] = {0.0f, -0.0f, edge, -edge, nextafterf(edge, 0), nextafterf(edge, 100), 1e-30f, 5000.0f,
                         INFINITY, -INFINITY, NAN};
    for (size_t j = 0; j < sizeof odd / sizeof odd[0]; j++)
        x[3 + 7 * j] = odd[j];
    for (int i = 0; i < N; i++)
        ref[i] = lm_softcap(x[i], cap);
    for (int isa = LM_ISA_SCALAR; isa <= lm_cpu_isa(); isa++) {
        memcpy(got, x, sizeof x);
        lm_softcap_rows(got, N, cap, isa);
        for (int i = 0; i < N; i++)
            ck_assert_msg(!memcmp(&got[i], &ref[i], 4), "isa %d element %d (%a): %a vs scalar %a", isa, i, x[i],
                          got[i], ref[i]);
    }
    if (lm_cpu_isa() >= LM_ISA_AVX512)
        for (int lo = 0; lo < 40; lo += 7)
            for (int hi = lo; hi < 300; hi += 23) {
                memcpy(got, x, sizeof x);
                float want = -INFINITY;
                for (int j = lo; j <= hi; j++)
                    want = ref[j] > want ? ref[j] : want;
                const float mx = lm_softcap_max_avx512(got, lo, hi, cap);
                ck_assert_msg(mx == want, "max of %d..%d: %a, not %a", lo, hi, mx, want);
                ck_assert_msg(!memcmp(got + lo, ref + lo, (size_t)(hi - lo + 1) * 4), "scores %d..%d", lo, hi);
                ck_assert(lo == 0 || !memcmp(got + lo - 1, x + lo - 1, 4)); /* the key before lo untouched */
                ck_assert(!memcmp(got + hi + 1, x + hi + 1, 4));          /* and the one after hi */
            }
    if (lm_cpu_isa() >= LM_ISA_AVX512)
        for (int lo = 0; lo < 16; lo++) { /* the maximum, then a NaN and a low score in its lane */
            for (int j = 0; j < 64; j++)
                got[j] = -1.0f;
            got[lo] = 3.0f, got[lo + 16] = NAN, got[lo + 32] = -5.0f;
            ck_assert(lm_softcap_max_avx512(got, lo, lo + 40, cap) == lm_softcap(3.0f, cap));
        }
}
END_TEST

/* All of an f16 row through the AVX2 conversion (F16 weights', lm_kv_layer_f32's). */
static size_t halves_avx2(float *dst, const uint16_t *src, size_t n)
{
    lm_halves_to_f32_avx2(dst, LM_F16, src, (int64_t)n);
    return n;
}

/* An f16 cache's rows converted for attention (lm_kv_layer_f32): the AVX2 converter gives lm_f16_to_f32's values. */
START_TEST(test_f16_rows)
{
    if (lm_cpu_isa() < LM_ISA_AVX2)
        return; /* (NEON's: tests/aarch64/neon_kernels.c) */
    char msg[160] = "";
    int bad = attcheck_f16_rows(halves_avx2, 1, msg, sizeof msg);
    ck_assert_msg(!bad, "%d values differ, first: %s", bad, msg);
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
 * The AVX-512 attention (groups of queries over blocks of keys, K in tiles
 * of 16 positions, vector exp) gives every query the portable bytes, whatever the
 * other queries of its group: positions and windows differ within a group,
 * pairs share value loads, and rows span several key blocks.  So does the
 * AVX2 one, four queries at a time (some with no key in common).
 */
START_TEST(test_attention_fast_bitwise)
{
    char msg[160] = "";
    if (lm_cpu_isa() >= LM_ISA_AVX2) {
        int bad = attcheck_groups(lm_attend_group_avx2, msg, sizeof msg);
        ck_assert_msg(!bad, "AVX2: %d queries differ, first: %s", bad, msg);
    }
    if (lm_cpu_isa() >= LM_ISA_AVX512) {
        int bad = attcheck_groups(lm_attend_group_avx512, msg, sizeof msg);
        ck_assert_msg(!bad, "AVX-512: %d queries differ, first: %s", bad, msg);
    }
}
END_TEST

/*
 * The AVX-512 attention cut in parts for threads to share (keys for the
 * scores, output vectors for the values; lm_attend_scores_avx512 and
 * lm_attend_values_avx512), run part after part: the same bytes as in one
 * piece, for 2 and 3 parts (with head size 64, the third of 3 is empty).
 */
static int split_parts_now;

static int attend_in_parts(const lm_attq *qs, int n, const void *k0, const void *v0, int hd, int hdv,
                           float scale, float cap, float *scores, size_t sstride, float *acc, int f16)
{
    static float vmx[4 * LM_ATT_QMAX * 16];
    const int parts = split_parts_now;
    float *w = malloc((size_t)n * sstride * sizeof *w);
    int ok = w != NULL;
    for (int p = 0; ok && p < parts; p++)
        ok = lm_attend_scores_avx512(qs, n, k0, hd, hdv, scale, p, parts, scores, sstride,
                                     vmx + (size_t)p * n * 16, f16);
    for (int p = 0; ok && p < parts; p++)
        ok = lm_attend_values_avx512(qs, n, v0, hd, hdv, cap, p, parts, scores, sstride, vmx, w, sstride, acc,
                                     f16);
    free(w);
    return ok;
}

START_TEST(test_attention_parts_bitwise)
{
    if (lm_cpu_isa() < LM_ISA_AVX512)
        return;
    char msg[160] = "";
    for (split_parts_now = 2; split_parts_now <= 3; split_parts_now++) {
        int bad = attcheck_groups(attend_in_parts, msg, sizeof msg);
        ck_assert_msg(!bad, "%d parts: %d queries differ, first: %s", split_parts_now, bad, msg);
        bad = attcheck_range_edges(attend_in_parts, 5, msg, sizeof msg);
        ck_assert_msg(!bad, "%d parts, range edges: %d queries differ, first: %s", split_parts_now, bad, msg);
    }
}
END_TEST

/* Keys outside a query's range must not reach its scores' maximum (attcheck.h). */
START_TEST(test_attention_range_edges)
{
    char msg[160] = "";
    if (lm_cpu_isa() >= LM_ISA_AVX2) {
        int bad = attcheck_range_edges(lm_attend_group_avx2, 5, msg, sizeof msg);
        ck_assert_msg(!bad, "AVX2: %d queries differ, first: %s", bad, msg);
    }
    if (lm_cpu_isa() >= LM_ISA_AVX512) {
        int bad = attcheck_range_edges(lm_attend_group_avx512, 5, msg, sizeof msg);
        ck_assert_msg(!bad, "AVX-512: %d queries differ, first: %s", bad, msg);
    }
}
END_TEST

/*
 * The rows a job asks for ahead (lm_attend_ahead): its shares, one after
 * another, cover exactly the lines of the head's K tiles holding keys
 * lo..hi and of its V rows lo..hi, no more, none twice, in either cache
 * type, whatever the head and layer (K and V of different widths).
 */
static void check_ahead_span(const char *what, const char *got, size_t lines, const char *base, size_t from,
                             size_t to, const char **next)
{
    const char *first = base + (from & ~(size_t)63), *end = base + ((to + 63) & ~(size_t)63);
    if (!*next)
        *next = first;
    ck_assert_msg(got == *next, "%s share begins at %td, not %td", what, got - base, *next - base);
    *next = got + 64 * lines;
    ck_assert_msg(*next <= end, "%s share ends at %td, past %td", what, *next - base, end - base);
}

START_TEST(test_attention_ahead_spans)
{
    static char k[2 * 3 * 64 * 64 * 4], v[2 * 3 * 64 * 32 * 4];
    const int ranges[][2] = {{0, 0}, {0, 63}, {5, 40}, {16, 31}, {17, 17}, {33, 62}};
    for (int type = LM_KV_F32; type <= LM_KV_F16; type++) {
        lm_kv kv = {.n_ctx = 64, .n_pos = 64, .n_layer = 2, .n_head_kv = 3, .head_dim = 64, .head_dim_v = 32,
                    .type = type, .k = k, .v = v};
        const size_t es = lm_kv_elem_bytes(&kv);
        for (int il = 0; il < 2; il++)
            for (int kh = 0; kh < 3; kh++)
                for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++)
                    for (int shares = 1; shares <= 3; shares++) {
                        const int lo = ranges[r][0], hi = ranges[r][1];
                        const char *kb = k + ((size_t)il * 3 + (size_t)kh) * 64 * 64 * es;
                        const char *vb = v + ((size_t)il * 3 + (size_t)kh) * 64 * 32 * es;
                        const size_t k_from = (size_t)(lo & ~15) * 64 * es, k_to = (size_t)((hi | 15) + 1) * 64 * es;
                        const size_t v_from = (size_t)lo * 32 * es, v_to = (size_t)(hi + 1) * 32 * es;
                        const char *k_next = NULL, *v_next = NULL;
                        for (int share = 0; share < shares; share++) {
                            lm_ahead a;
                            lm_attend_ahead(&kv, il, kh, lo, hi, share, shares, &a);
                            check_ahead_span("K", a.p[0], a.lines[0], kb, k_from, k_to, &k_next);
                            check_ahead_span("V", a.p[1], a.lines[1], vb, v_from, v_to, &v_next);
                        }
                        ck_assert_msg(k_next == kb + ((k_to + 63) & ~(size_t)63), "K shares stop short (%d..%d)", lo, hi);
                        ck_assert_msg(v_next == vb + ((v_to + 63) & ~(size_t)63), "V shares stop short (%d..%d)", lo, hi);
                    }
    }
}
END_TEST

TCase *tcase_layer_math(void)
{
    TCase *tc = tcase_create("layer_math");
    tcase_set_timeout(tc, 180); /* the sanitizer build runs the bit-for-bit sweeps slowly */
    tcase_add_test(tc, test_expf);
    tcase_add_test(tc, test_silu_mul);
    tcase_add_test(tc, test_gelu_mul);
    tcase_add_test(tc, test_softcap);
    tcase_add_test(tc, test_f16_rows);
    tcase_add_test(tc, test_softmax_bitwise);
    tcase_add_test(tc, test_attention_fast_bitwise);
    tcase_add_test(tc, test_attention_range_edges);
    tcase_add_test(tc, test_attention_parts_bitwise);
    tcase_add_test(tc, test_attention_ahead_spans);
    tcase_add_test(tc, test_rmsnorm_isa_bitwise);
    return tc;
}
