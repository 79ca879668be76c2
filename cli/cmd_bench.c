/*
 * cli/cmd_bench.c - `kvchat bench`: prompt processing (pp: p tokens in one
 * evaluation) and generation (tg: n tokens one at a time), each repeated r
 * times after a warm-up, printed like llama-bench.  It also measures the
 * machine's memory read bandwidth in the same run (between the generation
 * runs) and reports how much of it generation uses, since token generation
 * is bound by reading weights.
 */
#include "cli.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct series {
    double tps[64];
    int n;
} series;

static void stats(const series *s, double *mean, double *sd)
{
    double m = 0, v = 0;
    for (int i = 0; i < s->n; i++)
        m += s->tps[i];
    m /= s->n;
    for (int i = 0; i < s->n; i++)
        v += (s->tps[i] - m) * (s->tps[i] - m);
    *mean = m;
    *sd = s->n > 1 ? sqrt(v / (s->n - 1)) : 0;
}

/* Random but fixed token ids, as llama-bench uses. */
static void fill_tokens(int32_t *t, int n, int n_vocab)
{
    uint64_t x = 12345;
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (int32_t)((x >> 33) % (uint64_t)n_vocab);
    }
}

static int run_pp(kv_context *c, const int32_t *t, int p, double *tps, lm_err *e)
{
    kv_reset(c);
    double t0 = now_s();
    if (kv_eval(c, t, p, NULL, NULL, e))
        return -1;
    *tps = p / (now_s() - t0);
    return 0;
}

static int run_tg(kv_context *c, const int32_t *t, int n, double *tps, lm_err *e)
{
    kv_reset(c);
    double t0 = now_s();
    for (int i = 0; i < n; i++)
        if (kv_eval(c, t + i, 1, NULL, NULL, e))
            return -1;
    *tps = n / (now_s() - t0);
    return 0;
}

/* A 1 GiB buffer to time the machine's memory reads with, filled once. */
typedef struct read_probe {
    uint64_t *buf;
    size_t n;
    int threads;
} read_probe;

static int probe_init(read_probe *r, int threads)
{
    r->n = (size_t)1 << 27; /* 128 Mi uint64 = 1 GiB */
    r->threads = threads;
    r->buf = malloc(r->n * sizeof *r->buf);
    if (!r->buf)
        return -1;
    uint64_t *buf = r->buf;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < r->n; i++)
        buf[i] = i;
    return 0;
}

/* Best of three passes summing the buffer with every thread: GB/s. */
static double read_bandwidth(const read_probe *r)
{
    const uint64_t *buf = r->buf;
    const size_t n = r->n;
    double best = 0;
    for (int pass = 0; pass < 3; pass++) {
        uint64_t sum = 0;
        double t0 = now_s();
#pragma omp parallel for num_threads(r->threads) schedule(static) reduction(+ : sum)
        for (size_t i = 0; i < n; i += 8) { /* a cache line a step, asked for 4 KiB ahead as the kernels do */
            __builtin_prefetch(buf + i + 512, 0, 3);
            uint64_t s8 = 0;
            for (int j = 0; j < 8; j++)
                s8 ^= buf[i + j];
            sum += s8;
        }
        double gbs = (double)(n * sizeof *buf) / (now_s() - t0) / 1e9;
        best = gbs > best && sum != 1 ? gbs : best;
    }
    return best;
}

/* Bytes of weights one generated token reads: every matrix, one embedding row. */
static double bytes_per_token(const lm_model *m, double *params)
{
    double bytes = 0;
    *params = 0;
    for (uint64_t i = 0; i < m->gguf.n_tensors; i++) {
        const gguf_tensor *t = &m->gguf.tensors[i];
        *params += (double)t->ne[0] * (double)t->ne[1] * (double)t->ne[2] * (double)t->ne[3];
        if (strcmp(t->name, "token_embd.weight") || m->output == m->tok_embd)
            bytes += (double)t->nbytes;
    }
    return bytes;
}

static void print_row(const cli_opts *o, const char *name, double size_mib, double params,
                      int threads, const char *test, const series *s)
{
    double mean, sd;
    stats(s, &mean, &sd);
    if (o->bench_csv)
        printf("%s,%.2f,%.2f\n", test, mean, sd);
    else
        printf("| %-28s | %8.2f MiB | %8.2f M | %7d | %13s | %9.2f ± %6.2f |\n", name, size_mib,
               params / 1e6, threads, test, mean, sd);
    fflush(stdout);
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static int bench(const cli_opts *o, lm_model *m, kv_context *c, int p, int n, int reps)
{
    lm_err e = {{0}};
    int big = p > n ? p : n;
    int32_t *toks = malloc((size_t)big * sizeof *toks);
    if (!toks)
        return cli_error("out of memory");
    fill_tokens(toks, big, m->hp.n_vocab);
    double params, per_token = bytes_per_token(m, &params), tps;
    int threads = o->n_threads > 0 ? o->n_threads : lm_default_threads();
    double mib = (double)m->gguf.size / (1024.0 * 1024.0);
    series pp = {{0}, 0}, tg = {{0}, 0};
    int rc = 0;
    if (!o->bench_csv) {
        printf("| %-28s | %12s | %10s | %7s | %13s | %18s |\n", "model", "size", "params", "threads", "test", "t/s");
        printf("| %.28s | %.12s | %.10s | %.7s | %.13s | %.18s |\n", "-----------------------------",
               "-------------", "-----------", "--------", "--------------", "-------------------");
    }
    if (p > 0 && (run_pp(c, toks, p < 32 ? p : 32, &tps, &e) || run_pp(c, toks, p, &tps, &e)))
        rc = 1; /* warm-up: pages mapped, threads started */
    for (int r = 0; !rc && p > 0 && r < reps; r++)
        rc = run_pp(c, toks, p, &pp.tps[pp.n++], &e);
    /* the machine's read speed next to every tg run: its neighbours take
       bandwidth now and then, so each run is set against the better of the
       readings on its two sides */
    read_probe probe = {0};
    const int measure = n > 0 && !o->bench_csv && !rc && probe_init(&probe, threads) == 0;
    double before = measure ? read_bandwidth(&probe) : 0, share = 0, lo = 0, hi = 0;
    if (!rc && n > 0)
        rc = run_tg(c, toks, n < 16 ? n : 16, &tps, &e);
    for (int r = 0; !rc && n > 0 && r < reps; r++) {
        rc = run_tg(c, toks, n, &tg.tps[tg.n], &e);
        double after = measure ? read_bandwidth(&probe) : 0, machine = after > before ? after : before;
        share += machine > 0 ? per_token * tg.tps[tg.n] / 1e9 / machine / reps : 0;
        lo = r == 0 || machine < lo ? machine : lo, hi = machine > hi ? machine : hi;
        before = after, tg.n++;
    }
    free(probe.buf);
    if (rc) {
        free(toks);
        return cli_error("%s", e.msg);
    }
    char test[32];
    if (p > 0)
        snprintf(test, sizeof test, "pp%d", p), print_row(o, base_name(o->model), mib, params, threads, test, &pp);
    if (n > 0)
        snprintf(test, sizeof test, "tg%d", n), print_row(o, base_name(o->model), mib, params, threads, test, &tg);
    if (measure) {
        double mean, sd;
        stats(&tg, &mean, &sd);
        printf("\ntg reads %.1f MiB of weights per token: %.1f GB/s, %.0f%% of what this machine read next to each run "
               "(%.1f-%.1f GB/s)\n",
               per_token / (1024.0 * 1024.0), per_token * mean / 1e9, 100 * share, lo, hi);
    }
    free(toks);
    return EXIT_OK;
}

int cmd_bench(const cli_opts *o)
{
    int p = o->bench_p, n = o->n_predict < 0 ? 128 : o->n_predict, reps = o->bench_reps;
    lm_model m;
    if (cli_open_model(o, &m, NULL))
        return EXIT_ERR;
    kv_context c;
    lm_err e = {{0}};
    int big = (p > n ? p : n) + 1;
    if (kv_init(&c, &m, big, o->kv_type, o->n_threads, &e)) {
        lm_model_close(&m);
        return cli_error("%s", e.msg);
    }
    int rc = bench(o, &m, &c, p, n, reps);
    kv_free(&c);
    lm_model_close(&m);
    return rc;
}
