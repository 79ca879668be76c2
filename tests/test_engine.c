/*
 * tests/test_engine.c - the forward pass against llama.cpp's reference data:
 * logits parity (judged by ../shared/tools/parity.py, the rule),
 * greedy continuations, the stories260K text, and bitwise determinism
 * across batch splits and thread counts.
 */
#include "util.h"
#include "../lm/internal.h" /* the lanes layout of the weights' copy */

#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Reference model directories whose architecture we support, sorted. */
static int ref_dirs(char ***out)
{
    char *base = shared_path("reference");
    DIR *d = opendir(base);
    ck_assert_msg(d != NULL, "no %s", base);
    char **list = NULL;
    int n = 0;
    static const char *const prefixes[] = {"llama", "qwen2-", "qwen3-", "phi3", "gemma2-", "gemma3-", NULL};
    for (struct dirent *de; (de = readdir(d));) {
        int ok = 0;
        for (int i = 0; prefixes[i]; i++)
            ok |= !strncmp(de->d_name, prefixes[i], strlen(prefixes[i]));
        if (!ok || !strstr(de->d_name, "-t512-"))
            continue;
        list = realloc(list, (size_t)(n + 1) * sizeof *list);
        size_t l = strlen(base) + strlen(de->d_name) + 2;
        list[n] = malloc(l);
        snprintf(list[n++], l, "%s/%s", base, de->d_name);
    }
    closedir(d);
    free(base);
    *out = list;
    return n;
}

static void free_list(char **l, int n)
{
    for (int i = 0; i < n; i++)
        free(l[i]);
    free(l);
}

START_TEST(test_parity_judge)
{
    char **dirs;
    int n = ref_dirs(&dirs);
    ck_assert_int_ge(n, 45);
    char **argv = calloc((size_t)n + 4, sizeof *argv);
    char *judge = shared_path("tools/parity.py");
    argv[0] = "/usr/bin/python3";
    argv[1] = judge;
    argv[2] = (char *)kvchat_bin();
    for (int i = 0; i < n; i++)
        argv[3 + i] = dirs[i];
    char *out, *err;
    int rc = run_cmd(argv, NULL, &out, &err);
    ck_assert_msg(rc == 0, "parity.py failed (%d):\n%s%s", rc, out, err);
    free(out);
    free(err);
    free(judge);
    free(argv);
    free_list(dirs, n);
}
END_TEST

static int32_t *read_ids(const char *path, int *n)
{
    char *s = slurp(path, NULL);
    if (!s)
        return NULL;
    int32_t *ids = malloc(strlen(s) / 2 * sizeof *ids + 4);
    *n = 0;
    for (char *p = s, *end;; p = end) {
        long v = strtol(p, &end, 10);
        if (end == p)
            break;
        ids[(*n)++] = (int32_t)v;
    }
    free(s);
    return ids;
}

static void open_model(lm_model *m, const char *path)
{
    lm_err e;
    ck_assert_msg(lm_model_open(m, path, &e) == 0, "%s", e.msg);
}

static float max_abs_diff(const char *a_path, const char *b_path)
{
    size_t la, lb;
    char *a = slurp(a_path, &la), *b = slurp(b_path, &lb);
    float d = 0;
    for (size_t i = 0; a && b && i + 4 <= la && i + 4 <= lb; i += 4) {
        float x, y;
        memcpy(&x, a + i, 4), memcpy(&y, b + i, 4);
        d = fabsf(x - y) > d ? fabsf(x - y) : d;
    }
    free(a), free(b);
    return d;
}

/* info.json's "batch_vs_seq_max_abs" of sequence S: llama.cpp's own noise. */
static double batch_vs_seq(const char *info, char S)
{
    char key[8] = {'"', S, '"', ':', 0};
    const char *p = info ? strstr(info, key) : NULL;
    p = p ? strstr(p, "\"batch_vs_seq_max_abs\":") : NULL;
    return p ? strtod(p + 23, NULL) : 0.0;
}

/*
 * The smallest top1-top2 gap at which a greedy step must agree.  The
 * continuation is decoded token by token, where llama.cpp differs from its
 * own one-batch logits by batch_vs_seq; a step whose gap is within twice
 * that may legitimately go either way (the README's "noise level"), as may
 * one within twice llama.cpp's deviation from exact math when the
 * continuation comes from a float64 reference (info.json "reference").
 */
static double greedy_gap(const char *dir, char S)
{
    char p[600], q[600];
    snprintf(p, sizeof p, "%s/info.json", dir);
    char *info = slurp(p, NULL);
    int exact_ref = info && strstr(info, "\"reference\"") && strstr(info, "float64");
    double self = 2 * batch_vs_seq(info, S);
    free(info);
    if (!exact_ref)
        return self > 0.05 ? self : 0.05;
    float noise = 0;
    for (const char *S = "ABC"; *S; S++) {
        snprintf(p, sizeof p, "%s/%c.logits", dir, *S);
        snprintf(q, sizeof q, "%s/%c.exact.logits", dir, *S);
        float d = max_abs_diff(p, q);
        noise = d > noise ? d : noise;
    }
    return 2 * noise > 0.05 ? 2 * noise : 0.05;
}

/* Greedy continuation: ids must match until the reference's gap drops below the limit. */
static void check_greedy(const char *dir, const char *S)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s.greedy.txt", dir, S);
    size_t tlen;
    char *txt = slurp(p, &tlen);
    if (!txt)
        return;
    snprintf(p, sizeof p, "%s/%s.tokens.txt", dir, S);
    int n;
    int32_t *ids = read_ids(p, &n), *ref = malloc(32 * sizeof *ref);
    char *q = txt;
    for (int i = 0; i < 32; i++)
        ref[i] = (int32_t)strtol(q, &q, 10);
    char *g = memmem(txt, tlen, "# top1-top2", 11); /* the text between may hold NULs */
    ck_assert(g);
    g = strchr(g, '\n') + 1;
    lm_model m;
    snprintf(p, sizeof p, "%s/model.gguf", dir);
    open_model(&m, p);
    kv_context c;
    lm_err e;
    ck_assert(kv_init(&c, &m, n + 40, LM_KV_F32, 2, &e) == 0);
    ck_assert_msg(kv_eval(&c, ids, n, NULL, NULL, &e) == 0, "%s", e.msg);
    double min_gap = greedy_gap(dir, S[0]);
    for (int step = 0; step < 32; step++) {
        double gap = strtod(g, &g);
        if (gap < min_gap)
            break;
        int32_t t = lm_argmax(c.logits, m.hp.n_vocab);
        ck_assert_msg(t == ref[step], "%s %s step %d: %d, llama.cpp %d (gap %g)", dir, S, step, t,
                      ref[step], gap);
        ck_assert(kv_eval(&c, &t, 1, NULL, NULL, &e) == 0);
    }
    kv_free(&c);
    lm_model_close(&m);
    free(ids);
    free(ref);
    free(txt);
}

START_TEST(test_greedy_continuations)
{
    char **dirs;
    int n = ref_dirs(&dirs);
    for (int i = 0; i < n; i++)
        for (const char *S = "ABC"; *S; S++) {
            char s[2] = {*S, 0};
            check_greedy(dirs[i], s);
        }
    free_list(dirs, n);
}
END_TEST

/* Logits of ids evaluated in chunks of the given sizes (cycled). */
static float *eval_split(const lm_model *m, const int32_t *ids, int n, const int *chunks,
                         int n_chunks, int threads, int kv_type)
{
    kv_context c;
    lm_err e;
    ck_assert(kv_init(&c, m, n, kv_type, threads, &e) == 0);
    size_t nv = (size_t)m->hp.n_vocab;
    float *out = malloc((size_t)n * nv * sizeof *out);
    for (int done = 0, k = 0; done < n; k++) {
        int len = chunks[k % n_chunks];
        if (len > n - done)
            len = n - done;
        ck_assert(kv_eval(&c, ids + done, len, out + (size_t)done * nv, NULL, &e) == 0);
        done += len;
    }
    kv_free(&c);
    return out;
}

START_TEST(test_bitwise_determinism)
{
    static const char *const models[] = {"llama-t512-Q4_K_M", "llama-t512-F16", "qwen2-t512-Q8_0",
                                         "llama3rope-t512-Q4_K_M", "llama-t512-Q5_1", "qwen3-t512-Q6_K",
                                         "phi3-t512-Q4_0", "gemma2-t512-Q8_0", "gemma3-t512-Q4_K_M"};
    for (size_t k = 0; k < sizeof models / sizeof models[0]; k++) {
        char rel[200];
        snprintf(rel, sizeof rel, "reference/%s/C.tokens.txt", models[k]);
        char *tp = shared_path(rel);
        int n;
        int32_t *ids = read_ids(tp, &n);
        ck_assert_msg(ids && n == 300, "%s", tp);
        snprintf(rel, sizeof rel, "reference/%s/model.gguf", models[k]);
        char *mp = shared_path(rel);
        lm_model m;
        open_model(&m, mp);
        /* odd: a token alone at 261 too, whose heads the 3 threads cut in parts (attend_pass.c's split_parts) */
        int one[] = {300}, seq[] = {1}, odd[] = {7, 1, 130, 3, 120, 1, 38};
        /* one token at a time on two threads: each works out a token's steps between matrices whole
           and writes back its share of the residual row (forward.c's own_rows); on one, below */
        float *a = eval_split(&m, ids, n, one, 1, 2, LM_KV_F32);
        float *b = eval_split(&m, ids, n, seq, 1, 2, LM_KV_F32);
        float *c = eval_split(&m, ids, n, odd, 7, 3, LM_KV_F32);
        size_t bytes = (size_t)n * (size_t)m.hp.n_vocab * sizeof(float);
        ck_assert_msg(!memcmp(a, b, bytes), "%s: batch != sequential", models[k]);
        ck_assert_msg(!memcmp(a, c, bytes), "%s: batch != odd splits", models[k]);
        free(a), free(b), free(c);
        /* an f16 cache: long passes attend over its rows converted once a layer (lm_kv_layer_f32),
           a token alone over the cache itself */
        a = eval_split(&m, ids, n, one, 1, 2, LM_KV_F16);
        b = eval_split(&m, ids, n, seq, 1, 1, LM_KV_F16);
        c = eval_split(&m, ids, n, odd, 7, 3, LM_KV_F16);
        ck_assert_msg(!memcmp(a, b, bytes), "%s: f16 cache: batch != sequential", models[k]);
        ck_assert_msg(!memcmp(a, c, bytes), "%s: f16 cache: batch != odd splits", models[k]);
        free(a), free(b), free(c), free(ids), free(tp), free(mp);
        lm_model_close(&m);
    }
}
END_TEST

START_TEST(test_stories_text)
{
    char *want = shared_path("reference/stories260K/once.continuation.txt");
    size_t wl;
    char *w = slurp(want, &wl);
    ck_assert(w);
    static const char *const files[] = {"models/stories260K.gguf", "models/stories260K-f16.gguf"};
    for (int i = 0; i < 2; i++) {
        char *mp = shared_path(files[i]), *out;
        char *argv[] = {(char *)kvchat_bin(), "complete", "-m", mp, "-p", "Once upon a time",
                        "-n", "128", "--temp", "0", "--echo", NULL};
        ck_assert_int_eq(run_cmd(argv, NULL, &out, NULL), 0);
        ck_assert_msg(strlen(out) == wl && !memcmp(out, w, wl), "%s gave:\n%s", files[i], out);
        free(out);
        free(mp);
    }
    free(w);
    free(want);
}
END_TEST

/* The logits subcommand: batch, --sequential, -t 1 and -t 2 byte-identical. */
START_TEST(test_cli_logits_identical)
{
    char *mp = shared_path("reference/llama-t512-Q6_K/model.gguf");
    char *ids = shared_path("reference/llama-t512-Q6_K/C.tokens.txt");
    char *o1 = tmp_path("l1.f32"), *o2 = tmp_path("l2.f32"), *o3 = tmp_path("l3.f32");
    char *a1[] = {(char *)kvchat_bin(), "logits", "-m", mp, "--ids-file", ids, "-o", o1, "-t", "2", NULL};
    char *a2[] = {(char *)kvchat_bin(), "logits", "-m", mp, "--ids-file", ids, "-o", o2, "--sequential", NULL};
    char *a3[] = {(char *)kvchat_bin(), "logits", "-m", mp, "--ids-file", ids, "-o", o3, "-t", "1", NULL};
    ck_assert_int_eq(run_cmd(a1, NULL, NULL, NULL), 0);
    ck_assert_int_eq(run_cmd(a2, NULL, NULL, NULL), 0);
    ck_assert_int_eq(run_cmd(a3, NULL, NULL, NULL), 0);
    size_t l1, l2, l3;
    char *b1 = slurp(o1, &l1), *b2 = slurp(o2, &l2), *b3 = slurp(o3, &l3);
    ck_assert_int_eq((int)l1, 300 * 512 * 4);
    ck_assert(l1 == l2 && !memcmp(b1, b2, l1));
    ck_assert(l1 == l3 && !memcmp(b1, b3, l1));
    free(b1), free(b2), free(b3), free(o1), free(o2), free(o3), free(mp), free(ids);
}
END_TEST

/*
 * Mistral-style window W on a 2-layer llama: position p sees at most
 * 2(W-1) positions back, so changing token 0 leaves the logits of later
 * positions bitwise unchanged, and changes them without the window.
 */
START_TEST(test_sliding_window)
{
    const int W = 4, N = 12;
    int32_t a[12] = {1, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140}, b[12];
    memcpy(b, a, sizeof a);
    b[0] = 200;
    for (int window = 0; window <= W; window += W) {
        size_t len;
        uint8_t *buf = tiny_llama_swa(&len, 0, window);
        char *p = tmp_path("swa.gguf");
        write_file(p, buf, len);
        lm_model m;
        open_model(&m, p);
        ck_assert_int_eq(lm_layer_swa(&m, 1), window > 0);
        int one[] = {N};
        float *la = eval_split(&m, a, N, one, 1, 1, LM_KV_F32), *lb = eval_split(&m, b, N, one, 1, 1, LM_KV_F32);
        size_t row = (size_t)m.hp.n_vocab, far = (size_t)(2 * (W - 1) + 1);
        int same = !memcmp(la + far * row, lb + far * row, (N - far) * row * sizeof(float));
        ck_assert_msg(same == (window > 0), "window %d: far positions %s", window,
                      same ? "unchanged" : "changed");
        free(la), free(lb), free(buf), free(p);
        lm_model_close(&m);
    }
}
END_TEST

/* End to end, the scalar path and the machine's fastest give the same bytes (f32 and f16 cache). */
START_TEST(test_fast_paths_end_to_end)
{
    static const char *const models[] = {"llama-t512-Q4_K_M", "qwen2-t512-Q5_0", "gemma3-t512-Q6_K",
                                         "phi3-t512-Q4_0", "llama-t512-Q3_K"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        char rel[200];
        snprintf(rel, sizeof rel, "reference/%s/model.gguf", models[i]);
        char *mp = shared_path(rel);
        snprintf(rel, sizeof rel, "reference/%s/B.tokens.txt", models[i]);
        char *ids = shared_path(rel);
        if (access(mp, R_OK)) { /* not every type is in every corpus */
            free(mp), free(ids);
            continue;
        }
        for (int f16 = 0; f16 < 2; f16++) {
            char *o1 = tmp_path("e1.f32"), *o2 = tmp_path("e2.f32");
            char *a[] = {(char *)kvchat_bin(), "logits", "-m", mp, "--ids-file", ids, "-o", o1,
                         "--kv-type", f16 ? "f16" : "f32", NULL};
            ck_assert_int_eq(run_cmd(a, NULL, NULL, NULL), 0);
            setenv("KVCHAT_ISA", "scalar", 1);
            a[7] = o2;
            ck_assert_int_eq(run_cmd(a, NULL, NULL, NULL), 0);
            unsetenv("KVCHAT_ISA");
            size_t l1, l2;
            char *b1 = slurp(o1, &l1), *b2 = slurp(o2, &l2);
            ck_assert_msg(l1 == l2 && l1 > 0 && !memcmp(b1, b2, l1), "%s %s: fast != scalar", models[i],
                          f16 ? "f16" : "f32");
            free(b1), free(b2), free(o1), free(o2);
        }
        free(mp), free(ids);
    }
}
END_TEST

/* Whether this machine's kernel gives huge pages to memory that asks, as weights_copy.c reads it. */
static int huge_pages_on(void)
{
    char *s = slurp("/sys/kernel/mm/transparent_hugepage/enabled", NULL);
    int on = s && !strstr(s, "[never]");
    free(s);
    return on;
}

/*
 * The weights' copy into huge pages (weights_copy.c): once settled every
 * tensor reads from the copy, byte for byte the file's, and logits equal
 * those read from the mapping bit for bit; so do those of a fresh model
 * evaluated a token at a time with pauses after its first tokens, as a
 * typed chat's, whose copy runs in them and is adopted, as far as it got,
 * before each decode; and so do those of a model whose
 * decodes finish the copy themselves (eager, as a script's do), which its
 * token-at-a-time decodes take long enough to start.  Q4_0, Q4_K and Q6_K matrices
 * that the kernels read faster rearranged (lm/repack.c) are in their lanes
 * layouts in the copy, and give the file's bytes back.
 */
/* Logits of ids a token at a time, pausing 60 ms after each of the first `pauses` (the copy goes on after 50 ms without a decode). */
static float *eval_paused(const lm_model *m, const int32_t *ids, int n, int pauses)
{
    kv_context c;
    lm_err e;
    ck_assert(kv_init(&c, m, n, LM_KV_F32, 2, &e) == 0);
    const size_t nv = (size_t)m->hp.n_vocab;
    float *out = malloc((size_t)n * nv * sizeof *out);
    for (int i = 0; i < n; i++) {
        ck_assert(kv_eval(&c, ids + i, 1, out + (size_t)i * nv, NULL, &e) == 0);
        if (i < pauses)
            usleep(60000);
    }
    kv_free(&c);
    return out;
}

START_TEST(test_weights_copy)
{
    static const char *const models[] = {"gemma2-t512-Q6_K", "llama-t512-Q4_0", "llama-tied-t512-Q8_0"};
    char rel[200];
    snprintf(rel, sizeof rel, "reference/%s/model.gguf", models[_i]);
    char *mp = shared_path(rel);
    snprintf(rel, sizeof rel, "reference/%s/C.tokens.txt", models[_i]);
    char *tp = shared_path(rel);
    int n;
    int32_t *ids = read_ids(tp, &n);
    ck_assert_msg(ids && n == 300, "%s", tp);
    lm_model mapped, copied, settled;
    setenv("KVCHAT_MMAP", "1", 1);
    open_model(&mapped, mp);
    unsetenv("KVCHAT_MMAP");
    open_model(&copied, mp);
    open_model(&settled, mp);
    lm_weights_settle(&settled);
    lm_weights_settle(&mapped);
    ck_assert(!lm_weights_copied(&mapped));
    ck_assert_int_eq(lm_weights_copied(&settled), huge_pages_on());
    int in_lanes = 0;
    for (uint64_t i = 0; i < settled.gguf.n_tensors; i++) {
        const gguf_tensor *t = &settled.gguf.tensors[i];
        ck_assert(mapped.tensors[i].data == mapped.gguf.tensors[i].data);
        ck_assert(mapped.tensors[i].layout == LM_LAYOUT_FILE);
        if (!lm_weights_copied(&settled))
            continue;
        ck_assert_msg(settled.tensors[i].data != t->data, "%s still mapped", t->name);
        const uint8_t *bytes = settled.tensors[i].data;
        uint8_t *back = NULL;
        const int layout = settled.tensors[i].layout;
        if (layout != LM_LAYOUT_FILE) {
            const size_t rb = lm_row_bytes(t->type, t->ne[0]);
            ck_assert(t->type == lm_layout_type(layout));
            ck_assert((back = malloc((size_t)t->nbytes)));
            for (int64_t r = 0; r < t->ne[1]; r++)
                lm_layout_undo(layout, bytes + r * rb, back + r * rb, t->ne[0]);
            bytes = back, in_lanes++;
        }
        ck_assert_msg(!memcmp(bytes, t->data, (size_t)t->nbytes), "%s differs", t->name);
        free(back);
    }
    if (lm_weights_copied(&settled) && ((lm_lanes_layout_native() && strstr(models[_i], "Q4_0")) ||
                                        (lm_q8_0_lanes_native() && strstr(models[_i], "Q8_0"))))
        ck_assert_msg(in_lanes > 0, "%s: no matrix in the lanes layout", models[_i]);
    const int whole[] = {300};
    float *a = eval_split(&mapped, ids, n, whole, 1, 2, LM_KV_F32);
    float *b = eval_paused(&copied, ids, n, 4);
    float *c = eval_split(&settled, ids, n, whole, 1, 2, LM_KV_F32);
    size_t bytes = (size_t)n * (size_t)mapped.hp.n_vocab * sizeof(float);
    ck_assert_msg(!memcmp(a, b, bytes), "logits change while the copy is made");
    ck_assert_msg(!memcmp(a, c, bytes), "logits change with the weights in the copy");
    lm_model eager; /* opened last and decoded at once: the copy thread never sees 50 ms without a decode */
    open_model(&eager, mp);
    lm_weights_eager(&eager);
    const int one[] = {1};
    float *d = eval_split(&eager, ids, n, one, 1, 2, LM_KV_F32);
    ck_assert_int_eq(lm_weights_copied(&eager), huge_pages_on());
    ck_assert_msg(!memcmp(a, d, bytes), "logits change when the decodes finish the copy");
    free(a), free(b), free(c), free(d), free(ids), free(tp), free(mp);
    lm_model_close(&mapped), lm_model_close(&copied), lm_model_close(&settled), lm_model_close(&eager);
}
END_TEST

TCase *tcase_engine(void)
{
    TCase *tc = tcase_create("engine");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_parity_judge);
    tcase_add_test(tc, test_greedy_continuations);
    tcase_add_test(tc, test_bitwise_determinism);
    tcase_add_test(tc, test_stories_text);
    tcase_add_test(tc, test_cli_logits_identical);
    tcase_add_test(tc, test_sliding_window);
    tcase_add_test(tc, test_fast_paths_end_to_end);
    tcase_add_loop_test(tc, test_weights_copy, 0, 3);
    return tc;
}
