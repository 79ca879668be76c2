/*
 * cli/cmd_bench.c - `kvchat bench`: prompt processing (pp: p tokens in one
 * evaluation) and generation (tg: n tokens one at a time), each repeated r
 * times after a warm-up, printed like llama-bench; as there, -p, -n and -t
 * take lists, and every thread count runs every test.  It also measures the
 * machine's memory read bandwidth in the same run (between pieces of one
 * more generation run) and reports how much of it generation uses, since
 * token generation is bound by reading weights.
 */
#include "cli.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

/*
 * The cache holding t[0..d), untimed: decoded once, then cut back to it
 * before every run, as a chat's turn keeps the conversation before it.
 */
static int to_depth(kv_context *c, const int32_t *t, int d, lm_err *e)
{
    if (kv_common_prefix(c, t, d) == d) { /* (it stops at n_past) */
        kv_truncate(c, d);
        return 0;
    }
    kv_reset(c);
    return d > 0 ? kv_eval(c, t, d, NULL, NULL, e) : 0;
}

/* p tokens in one evaluation after the d tokens of depth. */
static int run_pp(kv_context *c, const int32_t *t, int d, int p, double *tps, lm_err *e)
{
    if (to_depth(c, t, d, e))
        return -1;
    double t0 = now_s();
    if (kv_eval(c, t + d, p, NULL, NULL, e))
        return -1;
    *tps = p / (now_s() - t0);
    return 0;
}

/* Tokens t[0..n) one at a time, as generation evaluates them. */
static int one_by_one(kv_context *c, const int32_t *t, int n, lm_err *e)
{
    for (int i = 0; i < n; i++)
        if (kv_eval(c, t + i, 1, NULL, NULL, e))
            return -1;
    return 0;
}

/* n tokens one at a time after the d tokens of depth. */
static int run_tg(kv_context *c, const int32_t *t, int d, int n, double *tps, lm_err *e)
{
    if (to_depth(c, t, d, e))
        return -1;
    double t0 = now_s();
    if (one_by_one(c, t + d, n, e))
        return -1;
    *tps = n / (now_s() - t0);
    return 0;
}

/* A test's name as llama-bench prints it: pp512, tg128, pp512 @ d4096. */
static void test_name(char *buf, size_t cap, const char *kind, int tokens, int d)
{
    if (d > 0)
        snprintf(buf, cap, "%s%d @ d%d", kind, tokens, d);
    else
        snprintf(buf, cap, "%s%d", kind, tokens);
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
    /* in 2 MiB pages where the kernel gives them, as the weights are read (1-2% faster here) */
    const size_t huge = (size_t)2 << 20;
    r->buf = aligned_alloc(huge, r->n * sizeof *r->buf);
    if (!r->buf)
        return -1;
#ifdef MADV_HUGEPAGE
    madvise(r->buf, r->n * sizeof *r->buf, MADV_HUGEPAGE);
#endif
    uint64_t *buf = r->buf;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < r->n; i++)
        buf[i] = i;
    return 0;
}

/*
 * One pass summing the buffer with every thread, a cache line a step,
 * asking for each line `ahead` uint64 before it is read: into L1
 * (prefetcht0), or into L2 (prefetcht1) when l2.
 */
static double read_pass(const read_probe *r, size_t ahead, int l2)
{
    const uint64_t *buf = r->buf;
    const size_t n = r->n;
    uint64_t sum = 0;
    double t0 = now_s();
#pragma omp parallel for num_threads(r->threads) schedule(static) reduction(+ : sum)
    for (size_t i = 0; i < n; i += 8) {
        if (l2)
            __builtin_prefetch(buf + i + ahead, 0, 2);
        else
            __builtin_prefetch(buf + i + ahead, 0, 3);
        uint64_t s8 = 0;
        for (int j = 0; j < 8; j++)
            s8 ^= buf[i + j];
        sum += s8;
    }
    const double gbs = (double)(n * sizeof *buf) / (now_s() - t0) / 1e9;
    return sum != 1 ? gbs : 0; /* (the sum is used, so the reads are made) */
}

/*
 * GB/s of the best of three passes over the buffer (1 GiB each), asking
 * for lines 4 KiB ahead into L1, 8 KiB ahead into L1 and 32 KiB ahead
 * into L2: which reads fastest depends on the machine and the moment, and
 * the best is what it can do.  The Zen 5, when it read fast, 8 KiB into
 * L1: 70 GB/s against 65 at 4 KiB; on 2026-12-02 32 KiB into L2, means
 * of 20 passes of each alternated, three times: 53.4-54.2 GB/s against
 * 51.2-51.8 at 4 KiB into L1 and 47.1-48.4 at 8 KiB.
 */
static double read_bandwidth(const read_probe *r)
{
    static const struct {
        size_t ahead; /* in uint64 */
        int l2;
    } passes[] = {{512, 0}, {1024, 0}, {4096, 1}};
    double best = 0;
    for (size_t p = 0; p < sizeof passes / sizeof passes[0]; p++) {
        const double gbs = read_pass(r, passes[p].ahead, passes[p].l2);
        best = gbs > best ? gbs : best;
    }
    return best;
}

/*
 * Each thread's core, read as dependent additions a second (one a cycle:
 * about its clock), the best of a few rounds with every thread at once.
 * On a VM a core can share its time with another guest for minutes: the
 * Zen 5 of 2026-11-30 ran one of its two at 1.8-2.6 billion against the
 * other's 3.1-3.5 for ten minutes at a time, between spells of both at
 * 3.5, and every figure of a run in such a spell is off with it.  Taken
 * before and after the tests, so that a reader can tell such a run from
 * a slow program.
 */
#define CORE_ADDS 2000000
#define CORE_ROUNDS 5
#define CORES_SHOWN 16

static void core_speeds(int threads, double *adds)
{
#pragma omp parallel num_threads(threads)
    {
        double best = 0;
        for (int r = 0; r < CORE_ROUNDS; r++) {
            unsigned long x = 0;
            const double t0 = now_s();
            for (long i = 0; i < CORE_ADDS; i++) {
                x += 1;
                __asm__ volatile("" : "+r"(x)); /* each addition waits for the last */
            }
            const double rate = (double)x / (now_s() - t0) / 1e9;
            best = rate > best ? rate : best;
        }
        adds[omp_get_thread_num()] = best;
    }
}

/* "3.52, 3.49" (the first CORES_SHOWN threads, then their range) appended to buf. */
static void cores_text(char *buf, size_t cap, const double *adds, int threads)
{
    size_t used = strlen(buf);
    double lo = adds[0], hi = adds[0];
    for (int i = 0; i < threads && used < cap; i++) {
        lo = adds[i] < lo ? adds[i] : lo, hi = adds[i] > hi ? adds[i] : hi;
        if (i < CORES_SHOWN)
            used += (size_t)snprintf(buf + used, cap - used, "%s%.2f", i ? ", " : "", adds[i]);
    }
    if (threads > CORES_SHOWN && used < cap)
        snprintf(buf + used, cap - used, ", ... (all %.2f-%.2f)", lo, hi);
}

/* The line that reports both readings (before, after: threads values each). */
static void print_cores(const double *before, const double *after, int threads)
{
    char line[1024] = "";
    cores_text(line, sizeof line, before, threads);
    strncat(line, " billion before the tests, ", sizeof line - strlen(line) - 1);
    cores_text(line, sizeof line, after, threads);
    printf("\nDependent additions a second on each thread's core (about its clock; a core well below the "
           "others shares its time with something else): %s after\n",
           line);
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

/* What every test of a run shares: the model, its token ids (longest of them all), the table's columns. */
typedef struct bench_run {
    const cli_opts *o;
    lm_model *m;
    const int32_t *toks;
    int longest;          /* tokens of the deepest cache plus the longest test */
    double params, per_token, mib;
    double per_pos;       /* cache bytes a token reads per position: K and V of every layer */
} bench_run;

/* pp of p tokens at depth d with the context's threads: a warm-up, then o->bench_reps runs, one row. */
static int pp_test(const bench_run *b, kv_context *c, int threads, int d, int p, lm_err *e)
{
    series s = {{0}, 0};
    double tps;
    if (run_pp(c, b->toks, d, p < 32 ? p : 32, &tps, e) || run_pp(c, b->toks, d, p, &tps, e))
        return -1; /* warm-up: pages mapped, threads started */
    for (int r = 0; r < b->o->bench_reps; r++)
        if (run_pp(c, b->toks, d, p, &s.tps[s.n++], e))
            return -1;
    char test[48];
    test_name(test, sizeof test, "pp", p, d);
    print_row(b->o, base_name(b->o->model), b->mib, b->params, threads, test, &s);
    return 0;
}

#define SHARE_PIECE 16 /* tokens between two readings of the machine's read speed */

/* Generation's reads against the machine's, from share_run. */
typedef struct read_share {
    double share;  /* of what the machine read beside the tokens */
    double gbs;    /* what generation read */
    double lo, hi; /* the machine's readings */
} read_share;

/*
 * n more tokens at depth d for generation's share of the machine's read
 * speed, in pieces of SHARE_PIECE tokens with the probe read between
 * them, each piece set against the better reading on its two sides.  Here
 * neighbours take bandwidth in spells of seconds: a reading taken a whole
 * run away (2-3 s) from the tokens it judged often saw a spell they did
 * not, and the share swung from 66% to 93% with it (tinyllama Q4_0).
 */
static int share_run(const bench_run *b, kv_context *c, int d, int n, const read_probe *probe, read_share *out,
                     lm_err *e)
{
    if (to_depth(c, b->toks, d, e))
        return -1;
    double before = read_bandwidth(probe), need = 0, took = 0, bytes = 0;
    out->lo = out->hi = before;
    for (int at = 0; at < n; at += SHARE_PIECE) {
        const int m = n - at < SHARE_PIECE ? n - at : SHARE_PIECE;
        const double t0 = now_s();
        if (one_by_one(c, b->toks + d + at, m, e))
            return -1;
        const double dt = now_s() - t0, after = read_bandwidth(probe);
        /* token i of the piece reads the weights and d + at + i + 1 positions of the cache */
        const double piece = m * (b->per_token + b->per_pos * (d + at + (m + 1) / 2.0));
        need += piece / 1e9 / (after > before ? after : before); /* seconds the machine's reads would take */
        took += dt, bytes += piece;
        out->lo = after < out->lo ? after : out->lo, out->hi = after > out->hi ? after : out->hi;
        before = after;
    }
    out->share = took > 0 ? need / took : 0;
    out->gbs = took > 0 ? bytes / took / 1e9 : 0;
    return 0;
}

/* tg of n tokens, one row; with a probe, note gets generation's share of the machine's read speed. */
static int tg_test(const bench_run *b, kv_context *c, int threads, int d, int n, const read_probe *probe,
                   char *note, size_t cap, lm_err *e)
{
    series s = {{0}, 0};
    double tps;
    int l1_too, chosen = 0;
    const int m = n < 16 ? n : 16;
    for (int done = 0; done < 64 && (done == 0 || !chosen); done += m) { /* warm-up, and the prefetch distance chosen */
        if (run_tg(c, b->toks, d, m, &tps, e))
            return -1;
        lm_ctx_prefetch(c->lm, &l1_too, &chosen);
    }
    for (int r = 0; r < b->o->bench_reps; r++)
        if (run_tg(c, b->toks, d, n, &s.tps[s.n++], e))
            return -1;
    char test[48];
    test_name(test, sizeof test, "tg", n, d);
    print_row(b->o, base_name(b->o->model), b->mib, b->params, threads, test, &s);
    read_share rs;
    if (!probe)
        return 0;
    if (share_run(b, c, d, n, probe, &rs, e))
        return -1;
    /* a token reads the weights and the cache so far: d + 1 .. d + n positions, on average */
    const double cache = b->per_pos * (d + (n + 1) / 2.0);
    const size_t ahead = lm_ctx_prefetch(c->lm, &l1_too, &chosen);
    snprintf(note, cap, "%s with %d thread%s reads %.1f MiB of weights and %.2f MiB of cache per token: "
             "%.1f GB/s, %.0f%% of what this machine read beside it (%.1f-%.1f GB/s; one more run, "
             "the machine read between every %d tokens; weights asked for %.1f KiB ahead%s)\n", test, threads,
             threads == 1 ? "" : "s", b->per_token / (1024.0 * 1024.0), cache / (1024.0 * 1024.0), rs.gbs,
             100 * rs.share, rs.lo, rs.hi, SHARE_PIECE, ahead / 1024.0, l1_too ? ", and into L1 just before" : "");
    return 0;
}

/*
 * Every pp and tg test with one thread count; the tg tests' notes appended
 * to notes.  probe (NULL: no readings) reads with the same threads.
 */
static int tests_with_threads(const bench_run *b, int threads, read_probe *probe, char *notes, size_t cap,
                              lm_err *e)
{
    const cli_opts *o = b->o;
    kv_context c;
    if (kv_init(&c, b->m, b->longest + 1, o->kv_type, threads, e))
        return -1;
    if (probe)
        probe->threads = threads;
    int rc = 0;
    for (int k = 0; !rc && k < o->n_bench_d; k++) {
        const int d = o->bench_d[k];
        for (int i = 0; !rc && i < o->n_bench_p; i++)
            rc = o->bench_p[i] > 0 ? pp_test(b, &c, threads, d, o->bench_p[i], e) : 0;
        for (int i = 0; !rc && i < o->n_bench_n; i++) {
            size_t used = strlen(notes);
            rc = o->bench_n[i] > 0 ? tg_test(b, &c, threads, d, o->bench_n[i], probe, notes + used, cap - used, e)
                                   : 0;
        }
    }
    kv_free(&c);
    return rc;
}

static void print_header(const cli_opts *o)
{
    if (o->bench_csv)
        return;
    printf("| %-28s | %12s | %10s | %7s | %13s | %18s |\n", "model", "size", "params", "threads", "test", "t/s");
    printf("| %.28s | %.12s | %.10s | %.7s | %.13s | %.18s |\n", "-----------------------------", "-------------",
           "-----------", "--------", "--------------", "-------------------");
}

/* The lists not given take llama-bench's defaults (-p 512 -n 128) and the usual threads. */
static void default_lists(cli_opts *o)
{
    if (!o->n_bench_p)
        o->bench_p[o->n_bench_p++] = 512;
    if (!o->n_bench_n)
        o->bench_n[o->n_bench_n++] = o->n_predict >= 0 ? o->n_predict : 128;
    if (!o->n_bench_t)
        o->bench_t[o->n_bench_t++] = o->n_threads > 0 ? o->n_threads : lm_default_threads();
    if (!o->n_bench_d)
        o->bench_d[o->n_bench_d++] = 0;
}

/* The largest of v[0..n), and at least floor. */
static int list_max(const int *v, int n, int floor)
{
    for (int i = 0; i < n; i++)
        floor = v[i] > floor ? v[i] : floor;
    return floor;
}

int cmd_bench(const cli_opts *opts)
{
    cli_opts o = *opts;
    default_lists(&o);
    lm_model m;
    if (cli_open_model(&o, &m, NULL))
        return EXIT_ERR;
    lm_weights_settle(&m); /* time the weights where generation reads them: in the copy, once made */
    const int most_n = list_max(o.bench_n, o.n_bench_n, 0);
    int most = list_max(o.bench_p, o.n_bench_p, most_n > 1 ? most_n : 1);
    most += list_max(o.bench_d, o.n_bench_d, 0); /* a test at depth d reads tokens d.. on */
    const size_t cap = (size_t)CLI_BENCH_LIST * CLI_BENCH_LIST * CLI_BENCH_LIST * 256; /* a line per tg test */
    int32_t *toks = malloc((size_t)most * sizeof *toks);
    char *notes = calloc(cap, 1);
    if (!toks || !notes) {
        free(toks);
        free(notes);
        lm_model_close(&m);
        return cli_error("out of memory");
    }
    fill_tokens(toks, most, m.hp.n_vocab);
    bench_run b = {&o, &m, toks, most, 0, 0, (double)m.gguf.size / (1024.0 * 1024.0), 0};
    b.per_token = bytes_per_token(&m, &b.params);
    b.per_pos = (double)lm_kv_bytes_per_token(&m, o.kv_type == LM_KV_F16 ? 2 : 4);
    /* the 1 GiB the readings go through, filled once, and only when a tg test reports its share */
    read_probe probe = {0};
    const int measured = most_n > 0 && !o.bench_csv && probe_init(&probe, o.bench_t[0]) == 0;
    const int threads = list_max(o.bench_t, o.n_bench_t, 1); /* the most any test runs with */
    double *cores = o.bench_csv ? NULL : calloc(2 * (size_t)threads, sizeof *cores);
    if (cores)
        core_speeds(threads, cores);
    lm_err e = {{0}};
    int rc = 0;
    print_header(&o);
    for (int i = 0; !rc && i < o.n_bench_t; i++)
        rc = tests_with_threads(&b, o.bench_t[i], measured ? &probe : NULL, notes, cap, &e);
    if (!rc && notes[0])
        printf("\n%s", notes);
    if (!rc && cores) {
        core_speeds(threads, cores + threads);
        print_cores(cores, cores + threads, threads);
    }
    free(cores);
    free(probe.buf);
    free(notes);
    free(toks);
    lm_model_close(&m);
    return rc ? cli_error("%s", e.msg) : EXIT_OK;
}
