/*
 * lm/forward.c - the transformer forward pass over a batch of tokens, in
 * the plain style of llama2.c's run.c: embed, then per layer RMSNorm ->
 * Q/K/V -> RoPE -> causal attention over the KV cache -> output projection
 * -> residual, RMSNorm -> gated FFN -> residual; then the final norm and the
 * vocabulary projection.  Batches are processed in micro-batches of at most
 * ubatch tokens so the scratch memory is fixed when the context is created:
 * no allocation happens per token.
 *
 * Every per-token step (norms, RoPE, attention) reads only that token's
 * row and the cache, and the matmul is batch-independent (matmul.c), so any
 * split of the same tokens gives bitwise identical logits.
 */
#include "internal.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <stdio.h>
#include <unistd.h>

/*
 * Micro-batches are as long as 32 MiB of per-token buffers allow, within
 * 128..256 tokens: longer ones read each weight row fewer times per prompt
 * (256 is 4-10% faster than 128 on the 0.1-1B models), while the scratch of
 * a 7B model stays near 32 MiB.
 */
#define UBATCH_MIN 128
#define UBATCH_MAX 256
#define UBATCH_BYTES (32u << 20)

struct lm_ctx {
    const lm_model *m;
    int n_threads, ubatch; /* tokens a forward pass takes at most */
    int q_dim, k_dim, v_dim, o_dim;
    float *x, *xb, *q, *k, *v, *att, *proj, *hb, *hb2;
    mm_scratch mm;       /* matmul: quantized activations, decoded rows */
    lm_ahead_tune ahead; /* how far ahead the one-token kernels ask for weights */
    int ahead_settled;   /* whether that tuning began with the weights where they stay */
    float **scores;      /* per thread: att_qmax rows of scores_cap scores, value sums */
    int scores_cap, att_qmax;
    float *split_scores; /* n_head rows of scores_cap, then n_head * n_threads maxima of 16 (split_parts) */
    float *kv32;         /* one layer of an f16 cache as f32 (lm_kv_layer_f32), kv32_floats floats */
    size_t kv32_floats;
    float *rope_cs, *rope_sn; /* per token of the ubatch: its rotation (lm_rope_angles) */
    int rope_pos0, rope_n, rope_swa, rope_ctx; /* what they were computed for; rope_n -1: nothing */
};

/* Rows of floats that vector loops read 16 at a time: on a cache line each, where their lengths allow. */
static float *alloc_floats(size_t n)
{
    return aligned_alloc(64, ((n ? n : 1) * sizeof(float) + 63) & ~(size_t)63);
}

int lm_default_threads(void)
{
    /* physical cores: count distinct (package, core) pairs in sysfs */
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        return 1;
    int seen = 0;
    long ids[1024];
    for (long cpu = 0; cpu < n && cpu < 1024; cpu++) {
        char path[128];
        long pkg = 0, core = cpu;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/topology/core_id", cpu);
        FILE *f = fopen(path, "r");
        if (f) {
            if (fscanf(f, "%ld", &core) != 1)
                core = cpu;
            fclose(f);
        }
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/topology/physical_package_id", cpu);
        f = fopen(path, "r");
        if (f) {
            if (fscanf(f, "%ld", &pkg) != 1)
                pkg = 0;
            fclose(f);
        }
        long id = pkg * 100000 + core;
        int dup = 0;
        for (int i = 0; i < seen; i++)
            dup |= ids[i] == id;
        if (!dup)
            ids[seen++] = id;
    }
    return seen > 0 ? seen : (int)n;
}

lm_ctx *lm_ctx_new(const lm_model *m, int n_threads, lm_err *e)
{
    const lm_hparams *hp = &m->hp;
    lm_ctx *c = calloc(1, sizeof *c);
    if (!c)
        goto oom;
    c->m = m;
    c->n_threads = n_threads > 0 ? n_threads : lm_default_threads();
    c->q_dim = hp->n_head * hp->head_dim;
    c->k_dim = hp->n_head_kv * hp->head_dim;
    c->v_dim = hp->n_head_kv * hp->head_dim_v;
    c->o_dim = hp->n_head * hp->head_dim_v;
    size_t per_token = (7 * (size_t)hp->n_embd + 3 * (size_t)hp->n_ff) * sizeof(float);
    size_t ub = UBATCH_BYTES / per_token / 16 * 16;
    ub = ub < UBATCH_MIN ? UBATCH_MIN : ub > UBATCH_MAX ? UBATCH_MAX : ub;
    c->ubatch = (int)ub;
    c->x = alloc_floats(ub * hp->n_embd);
    c->xb = alloc_floats(ub * hp->n_embd);
    c->proj = alloc_floats(ub * hp->n_embd);
    c->q = alloc_floats(ub * c->q_dim);
    c->k = alloc_floats(ub * c->k_dim);
    c->v = alloc_floats(ub * c->v_dim);
    c->att = alloc_floats(ub * c->o_dim);
    size_t qkv = (size_t)c->q_dim + (size_t)c->k_dim + (size_t)c->v_dim;
    c->hb = alloc_floats(ub * (qkv > (size_t)hp->n_ff ? qkv : (size_t)hp->n_ff)); /* also fused qkv */
    c->hb2 = alloc_floats(ub * 2 * (size_t)hp->n_ff);                           /* also [gate | up] */
    c->rope_cs = alloc_floats(ub * (size_t)(hp->n_rot / 2));
    c->rope_sn = alloc_floats(ub * (size_t)(hp->n_rot / 2));
    c->rope_n = -1;
    c->scores = calloc((size_t)c->n_threads, sizeof *c->scores);
    if (!c->x || !c->xb || !c->proj || !c->q || !c->k || !c->v || !c->att || !c->hb || !c->hb2 ||
        !c->rope_cs || !c->rope_sn || !c->scores)
        goto oom;
    int64_t widest = hp->n_embd > hp->n_ff ? hp->n_embd : hp->n_ff;
    if (c->o_dim > widest)
        widest = c->o_dim;
    if (mm_scratch_init(&c->mm, c->n_threads, widest, c->ubatch))
        goto oom;
    lm_ahead_tune_init(&c->ahead);
    return c;
oom:
    lm_seterr(e, "out of memory for the evaluation buffers");
    lm_ctx_free(c);
    return NULL;
}

void lm_ctx_free(lm_ctx *c)
{
    if (!c)
        return;
    for (int i = 0; c->scores && i < c->n_threads; i++)
        free(c->scores[i]);
    free(c->scores);
    free(c->split_scores);
    free(c->kv32);
    mm_scratch_free(&c->mm);
    free(c->x);
    free(c->xb);
    free(c->proj);
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->att);
    free(c->hb);
    free(c->rope_cs);
    free(c->rope_sn);
    free(c->hb2);
    free(c);
}

/* ---------------------------------------------------------------- steps */

/*
 * The rotations of positions pos0..pos0+n-1 in layer il.  They depend on
 * the layer only through its sliding window (its own base), so the layers
 * after the first mostly find them already there.
 */
static void rope_tables(lm_ctx *c, int il, int n, int pos0, int n_ctx)
{
    const lm_model *m = c->m;
    const int swa = lm_layer_swa(m, il), half = m->hp.n_rot / 2;
    if (c->rope_n == n && c->rope_pos0 == pos0 && c->rope_swa == swa && c->rope_ctx == n_ctx)
        return;
#pragma omp for schedule(static) nowait
    for (int t = 0; t < n; t++)
        lm_rope_angles(m, il, pos0 + t, n_ctx, c->rope_cs + (size_t)t * half,
                       c->rope_sn + (size_t)t * half);
    lm_barrier_wait(&c->mm.bar);
#pragma omp single nowait /* after every thread has read the old key, above */
    c->rope_n = n, c->rope_pos0 = pos0, c->rope_swa = swa, c->rope_ctx = n_ctx;
    lm_barrier_wait(&c->mm.bar);
}

/*
 * Token t's query heads sharing KV head kh and its key there: per-head
 * RMSNorm (qwen3, gemma3), RoPE and q scaling; then the cache write of the
 * key and value.  Heads are independent, so any split of this work gives
 * the same bytes.
 */
static void position_head(lm_ctx *c, lm_kv *kv, const lm_layer *L, int il, int t, int pos0, int kh)
{
    const lm_model *m = c->m;
    const lm_hparams *hp = &m->hp;
    const int hd = hp->head_dim, half = hp->n_rot / 2, group = hp->n_head / hp->n_head_kv;
    float *q = c->q + (size_t)t * c->q_dim + (size_t)kh * group * hd;
    float *k = c->k + (size_t)t * c->k_dim + (size_t)kh * hd;
    const float *cs = c->rope_cs + (size_t)t * half, *sn = c->rope_sn + (size_t)t * half;
    if (L->q_norm) {
        for (int h = 0; h < group; h++)
            lm_rmsnorm(q + (size_t)h * hd, q + (size_t)h * hd, L->q_norm->data, hd, hp->rms_eps);
        lm_rmsnorm(k, k, L->k_norm->data, hd, hp->rms_eps);
    }
    lm_rope_apply(m, q, group, hd, cs, sn);
    lm_rope_apply(m, k, 1, hd, cs, sn);
    if (m->arch->flags & ARCH_Q_PRESCALE)
        for (int i = 0; i < group * hd; i++)
            q[i] *= hp->attn_scale;
    lm_kv_store_head(kv, il, pos0 + t, kh, k, c->v + (size_t)t * c->v_dim + (size_t)kh * hp->head_dim_v);
}

/* position_head for every token and KV head, shared out among the threads. */
static void position_qk(lm_ctx *c, lm_kv *kv, const lm_layer *L, int il, int n, int pos0)
{
    const int n_kv = c->m->hp.n_head_kv;
#pragma omp for schedule(static) nowait
    for (int j = 0; j < n * n_kv; j++)
        position_head(c, kv, L, il, j / n_kv, pos0, j % n_kv);
    lm_barrier_wait(&c->mm.bar);
}

/*
 * Chunks the queries of one KV head are split into: at most qmax queries
 * each, and enough chunks that every thread gets a job.  No more than
 * that: every chunk reads its head's whole cache, and a token's attention
 * over a long cache is bound by those reads (smollm2 generating at 1000
 * cached tokens: 213-218 t/s with its 3 heads cut in 6 jobs, 247 with 3).
 */
static int attention_chunks(int per_kv, int n_kv, int n_threads, int qmax)
{
    int chunks = (per_kv + qmax - 1) / qmax;
    int spread = (n_threads + n_kv - 1) / n_kv;
    if (chunks < spread)
        chunks = spread < per_kv ? spread : per_kv;
    return chunks;
}

/* Chunks of each KV head's queries when n tokens attend (attention_chunks for this model and context). */
static int head_chunks(const lm_ctx *c, int n)
{
    const lm_hparams *hp = &c->m->hp;
    return attention_chunks(hp->n_head / hp->n_head_kv * n, hp->n_head_kv, c->n_threads, c->att_qmax);
}

/*
 * KV heads left over when a short turn's heads are shared out whole: a
 * head's queries fit one job (per_kv <= qmax), there are more heads than
 * threads, but not a multiple of them (smollm2: 3 heads, 2 threads).  Then
 * each head but these is one job, so its cache is streamed from memory
 * once with all its queries (18 for 6 tokens) to keep the arithmetic busy
 * while it comes, and the leftovers are cut in one chunk a thread, so the
 * threads end together.  Chunks of 8 + 10 queries for every head read each
 * head from memory with only 8 queries' work to hide it: `kvchat bench -p 6
 * -n 0 -d 740 -r 20`, three alternations, 6.57-6.85 -> 6.51-6.58 ms; whole
 * heads alone (3 jobs, one thread doing two) 6.64-6.83.  Generation (one
 * token) keeps a job a head: it is bound by reading the cache, and a cut
 * head is read twice.
 */
static int leftover_heads(const lm_ctx *c, int n)
{
    const lm_hparams *hp = &c->m->hp;
    if (n < 2 || hp->n_head / hp->n_head_kv * n > c->att_qmax || hp->n_head_kv <= c->n_threads)
        return 0;
    return hp->n_head_kv % c->n_threads;
}

/* Where chunk part of a KV head's per_kv queries begins.  Chunks of four or
   more start at a multiple of 4 where the kernel takes queries four at a
   time (AVX-512, NEON): a lone leftover query runs at half speed (its sums
   are too few to cover the multiply-adds' latency).  Rounding to the
   nearest multiple of 4 keeps every chunk within qmax when qmax is one
   too.  The AVX2 kernel cuts any count into even sets (9: 5 + 4), so there
   chunks are cut evenly: 18 queries 9 + 9, not 8 + 10. */
static int chunk_start(int per_kv, int part, int chunks, int qmax, int isa)
{
    int r = (int)((int64_t)per_kv * part / chunks);
    if (part == chunks || per_kv / chunks < 4 || qmax % 4 || isa == LM_ISA_AVX2)
        return r;
    r = (r + 2) & ~3;
    return r < per_kv ? r : per_kv;
}

/*
 * The KV head and chunk of job.  With leftover heads: the whole heads
 * first, then the leftovers' chunks, a chunk of each in turn.  Otherwise
 * every head has `chunks`: a head's in a row when there are more than two
 * (long prompts: a thread's next job mostly finds the head's rows still in
 * L2), else across heads (threads that start together then stream
 * different rows from memory, and a head's second chunk finds them in L3).
 */
static void job_head(int job, int n_kv, int chunks, int left, int *kh, int *part)
{
    const int whole = n_kv - left;
    if (left) {
        *kh = job < whole ? job : whole + (job - whole) % left;
        *part = job < whole ? 0 : (job - whole) / left;
    } else if (chunks > 2) {
        *kh = job / chunks, *part = job % chunks;
    } else {
        *kh = job % n_kv, *part = job / n_kv;
    }
}

/*
 * Parts each KV head is cut in when one token attends and the heads do not
 * share out evenly among the threads (smollm2: 3 heads, 2 threads): a
 * token's attention over a long cache is bound by reading it, and with a
 * job a head one thread read two heads while the other read one.  Cut in
 * parts (lm_attend_scores_part, lm_attend_values_part), each thread reads
 * its share; the same bytes.  smollm2 Q4_K_M on the Xeon with AMX, one
 * token's attention timed alone (`kvchat bench -p 1 -n 0 -d D -r 60`, two
 * or three rounds): at 1400 cached tokens 3.17-3.38 -> 2.78-2.81 ms a
 * pass, at 700 1.43 -> 1.28-1.29, at 300 0.66-0.69 -> 0.61-0.62.  Short
 * caches keep a job a head: the cut costs a barrier a layer.
 */
#define SPLIT_MIN_KEYS 256

static int split_parts(const lm_ctx *c, const lm_kv *kv, int n, int pos0)
{
    const int heads = c->m->hp.n_head_kv, nv = kv->head_dim_v / 16;
    const int group = c->m->hp.n_head / heads; /* a thread's own rows take a head's queries */
    if (n != 1 || c->n_threads < 2 || heads % c->n_threads == 0 || pos0 + 1 < SPLIT_MIN_KEYS ||
        group > c->att_qmax || !lm_attend_splits(kv, c->mm.isa))
        return 0;
    const int parts = c->n_threads < nv ? c->n_threads : nv;
    return parts >= 2 ? parts : 0;
}

/* Whether every KV head is a single job when n tokens attend (the pass may then fuse RoPE into them). */
static int one_job_a_head(const lm_ctx *c, const lm_kv *kv, int n, int pos0)
{
    return head_chunks(c, n) == 1 && !leftover_heads(c, n) && !split_parts(c, kv, n, pos0);
}

/* The query heads of KV head kh for token 0 at pos0. */
static void head_queries(const lm_ctx *c, int kh, int pos0, lm_attq *qs)
{
    const lm_hparams *hp = &c->m->hp;
    const int group = hp->n_head / hp->n_head_kv;
    for (int i = 0; i < group; i++) {
        const int h = kh * group + i;
        qs[i] = (lm_attq){.q = c->q + (size_t)h * hp->head_dim, .out = c->att + (size_t)h * hp->head_dim_v,
                          .pos = pos0};
    }
}

/* One token's attention, every head cut in `parts` (split_parts); q and the cache rows are ready. */
static void attention_split(lm_ctx *c, lm_kv *kv, int il, int pos0, int parts)
{
    const lm_hparams *hp = &c->m->hp;
    const int group = hp->n_head / hp->n_head_kv, jobs = hp->n_head_kv * parts;
    const size_t row = (size_t)c->scores_cap;
    float *maxima = c->split_scores + (size_t)hp->n_head * row; /* [head][part][query][16] */
    lm_attq qs[LM_ATT_QMAX];
#pragma omp for schedule(static) nowait
    for (int j = 0; j < jobs; j++) {
        const int kh = j / parts, part = j % parts;
        head_queries(c, kh, pos0, qs);
        lm_attend_scores_part(c->m, kv, il, kh, qs, group, part, parts, c->split_scores + kh * group * row,
                              row, maxima + (size_t)(kh * parts + part) * group * 16);
    }
    lm_barrier_wait(&c->mm.bar);
#pragma omp for schedule(static) nowait
    for (int j = 0; j < jobs; j++) {
        const int kh = j / parts, part = j % parts;
        float *own = c->scores[omp_get_thread_num()];
        head_queries(c, kh, pos0, qs);
        lm_attend_values_part(c->m, kv, il, kh, qs, group, part, parts, c->split_scores + kh * group * row,
                              row, maxima + (size_t)kh * parts * group * 16, own, row,
                              own + (size_t)c->att_qmax * row);
    }
    lm_barrier_wait(&c->mm.bar);
}

/*
 * The rows a job asks for while it computes (lm_ahead): those of the job
 * n_threads later, the one its thread most likely takes next; a head that
 * several jobs of that round take is cut in shares among them.  A head
 * read from memory while its arithmetic waits cost smollm2's 18 queries
 * over 725 keys (AVX2, Zen 1, a harness cycling 90 heads) 155-160 us
 * against 117-122 from L2; with the next head asked for during each call,
 * 134-136 (116-117 since the call asks for its own V rows first and a
 * tile's lines at a time, attention_avx2.c).  A 6-token pass at 722 cached
 * tokens (smollm2 Q4_K_M, two threads: two whole heads, then the third cut
 * in two), attention alone, six alternations: 8.88 -> 8.64 ms; with the
 * queries in sets of six (attention_avx2.c), 8.11 -> 7.47.  The last
 * round asks for nothing: the next layer's rows, asked for then, came no
 * faster (the weights read between evict them).  Returns 0 when there is
 * no next job or it reads the same head.
 */
static int job_ahead(const lm_ctx *c, const lm_kv *kv, int il, int job, int jobs, int n, int pos0, lm_ahead *a)
{
    const lm_hparams *hp = &c->m->hp;
    const int threads = c->n_threads, chunks = head_chunks(c, n), left = leftover_heads(c, n);
    const int next = job + threads, round = next - next % threads;
    if (next >= jobs)
        return 0;
    int kh, part, now, share = 0, shares = 0;
    job_head(next, hp->n_head_kv, chunks, left, &kh, &part);
    job_head(job, hp->n_head_kv, chunks, left, &now, &part);
    if (kh == now) /* (its rows are the ones this job reads) */
        return 0;
    for (int j = round; j < round + threads && j < jobs; j++) {
        int h;
        job_head(j, hp->n_head_kv, chunks, left, &h, &part);
        share += h == kh && j < next;
        shares += h == kh;
    }
    lm_attend_ahead(kv, il, kh, lm_attend_first_key(c->m, il, pos0), pos0 + n - 1, share, shares, a);
    return 1;
}

/*
 * positioned: whether q and the cache rows of these tokens are ready; if
 * not, each KV head has one job (one_job_a_head), which first
 * positions its own heads: a one-token pass then spends no barrier between
 * RoPE and attention, and the threads share the RoPE and cache writes.
 */
static void attention(lm_ctx *c, lm_kv *kv, const lm_layer *L, int il, int n, int pos0, int positioned)
{
    const lm_hparams *hp = &c->m->hp;
    const int parts = split_parts(c, kv, n, pos0);
    if (parts) {
        attention_split(c, kv, il, pos0, parts);
        return;
    }
    lm_kv f32;
    const int copy = positioned && lm_kv_copy_worth(c->m, kv, n);
    if (copy) {
        f32 = lm_kv_layer_f32(c->m, kv, il, pos0, n, c->kv32, c->mm.isa);
        lm_barrier_wait(&c->mm.bar); /* every thread's rows converted */
    }
    const lm_kv *akv = copy ? &f32 : kv; /* the cache attention reads */
    /* The queries sharing a KV head (its query heads, for every token) go
       over its cache rows together, a block of keys at a time, so the cache
       is read from memory once per job instead of once per query.  Jobs
       cost more the later their tokens (causal), so they are handed out as
       threads come free, in job_head's order. */
    const int group = hp->n_head / hp->n_head_kv, per_kv = group * n, chunks = head_chunks(c, n);
    const int left = leftover_heads(c, n), whole = hp->n_head_kv - left;
    const int jobs = left ? whole + left * c->n_threads : hp->n_head_kv * chunks;
#pragma omp for schedule(dynamic) nowait
    for (int job = 0; job < jobs; job++) {
        int kh, part, tid = omp_get_thread_num();
        job_head(job, hp->n_head_kv, chunks, left, &kh, &part);
        const int nch = !left ? chunks : kh < whole ? 1 : c->n_threads; /* kh's chunks */
        int r0 = chunk_start(per_kv, part, nch, c->att_qmax, c->mm.isa);
        int r1 = chunk_start(per_kv, part + 1, nch, c->att_qmax, c->mm.isa);
        lm_attq qs[LM_ATT_QMAX];
        for (int t = 0; !positioned && t < n; t++)
            position_head(c, kv, L, il, t, pos0, kh);
        for (int r = r0; r < r1; r++) { /* token-major: a chunk's keys end near together */
            int t = r / group, h = kh * group + r % group;
            qs[r - r0] = (lm_attq){.q = c->q + (size_t)t * c->q_dim + (size_t)h * hp->head_dim,
                                   .out = c->att + (size_t)t * c->o_dim + (size_t)h * hp->head_dim_v,
                                   .pos = pos0 + t};
        }
        float *scores = c->scores[tid];
        lm_ahead ahead;
        const int asks = c->mm.isa == LM_ISA_AVX2 && job_ahead(c, akv, il, job, jobs, n, pos0, &ahead);
        lm_attend_group(c->m, akv, il, kh, qs, r1 - r0, scores, (size_t)c->scores_cap,
                        scores + (size_t)c->att_qmax * (size_t)c->scores_cap, c->mm.isa, asks ? &ahead : NULL);
    }
    lm_barrier_wait(&c->mm.bar);
}

static void add_bias(lm_ctx *c, float *x, const lm_tensor *b, int n, int dim)
{
    if (!b)
        return;
    const float *bd = b->data;
#pragma omp for schedule(static) nowait
    for (int t = 0; t < n; t++) {
        float *xt = x + (size_t)t * dim;
#pragma omp simd
        for (int i = 0; i < dim; i++)
            xt[i] += bd[i];
    }
    lm_barrier_wait(&c->mm.bar);
}

/* Q, K, V of n tokens from c->xb: separate matrices or one fused [q | k | v]. */
static void project_qkv(lm_ctx *c, const lm_layer *L, int n)
{
    if (!L->wqkv) {
        float *outs[] = {c->q, c->k, c->v};
        const lm_tensor *ws[] = {L->wq, L->wk, L->wv};
        lm_matmul_many(outs, ws, 3, c->xb, n, &c->mm);
    } else {
        int all = c->q_dim + c->k_dim + c->v_dim;
        lm_matmul(c->hb, L->wqkv, c->xb, n, &c->mm);
#pragma omp for schedule(static) nowait
        for (int t = 0; t < n; t++) {
            const float *r = c->hb + (size_t)t * all;
            memcpy(c->q + (size_t)t * c->q_dim, r, (size_t)c->q_dim * sizeof *r);
            memcpy(c->k + (size_t)t * c->k_dim, r + c->q_dim, (size_t)c->k_dim * sizeof *r);
            memcpy(c->v + (size_t)t * c->v_dim, r + c->q_dim + c->k_dim, (size_t)c->v_dim * sizeof *r);
        }
        lm_barrier_wait(&c->mm.bar);
    }
    add_bias(c, c->q, L->bq, n, c->q_dim);
    add_bias(c, c->k, L->bk, n, c->k_dim);
    add_bias(c, c->v, L->bv, n, c->v_dim);
}

/* out = RMSNorm(x) * w for n tokens, a token a step. */
static void norm_rows(lm_ctx *c, float *out, const float *x, const lm_tensor *w, int n)
{
    const int E = c->m->hp.n_embd;
#pragma omp for schedule(static) nowait
    for (int t = 0; t < n; t++)
        lm_rmsnorm_isa(out + (size_t)t * E, x + (size_t)t * E, w->data, E, c->m->hp.rms_eps, c->mm.isa);
    lm_barrier_wait(&c->mm.bar);
}

/*
 * x += norm(out) or x += out, over n tokens of E features; then, with
 * next, xb = RMSNorm(x) * next for the step that follows (the FFN, the
 * next layer's attention).  A token's steps run in one loop, so a
 * one-token pass waits at one barrier here instead of two or three.
 */
static void residual(lm_ctx *c, float *out, const lm_tensor *post_norm, const lm_tensor *next, int n)
{
    const lm_hparams *hp = &c->m->hp;
    const int E = hp->n_embd;
#pragma omp for schedule(static) nowait
    for (int t = 0; t < n; t++) {
        float *o = out + (size_t)t * E, *x = c->x + (size_t)t * E;
        if (post_norm) /* in place: a row's sum is taken before it is written */
            lm_rmsnorm_isa(o, o, post_norm->data, E, hp->rms_eps, c->mm.isa);
#pragma omp simd
        for (int i = 0; i < E; i++)
            x[i] += o[i];
        if (next)
            lm_rmsnorm_isa(c->xb + (size_t)t * E, x, next->data, E, hp->rms_eps, c->mm.isa);
    }
    lm_barrier_wait(&c->mm.bar);
}

/*
 * Moves the queries and residual rows of tokens [from, n) down to rows
 * [0, n - from): in the last layer only the tokens whose logits are
 * wanted go on past the cache write (each row's result does not depend on
 * the others, so theirs is unchanged).
 */
static void keep_rows(lm_ctx *c, int from, int n)
{
    const size_t E = (size_t)c->m->hp.n_embd, qd = (size_t)c->q_dim;
#pragma omp single nowait
    {
        memmove(c->q, c->q + (size_t)from * qd, (size_t)(n - from) * qd * sizeof *c->q);
        memmove(c->x, c->x + (size_t)from * E, (size_t)(n - from) * E * sizeof *c->x);
    }
    lm_barrier_wait(&c->mm.bar);
}

/* The attention half of layer il for n tokens; returns how many rows go on (keep from 'from'). */
static int attention_block(lm_ctx *c, lm_kv *kv, int il, int n, int pos0, int from)
{
    const lm_layer *L = &c->m->layers[il];
    if (il == 0) /* later layers find xb normed by the last one's residual */
        norm_rows(c, c->xb, c->x, L->attn_norm, n);
    project_qkv(c, L, n);
    rope_tables(c, il, n, pos0, kv->n_ctx);
    const int fused = from == 0 && one_job_a_head(c, kv, n, pos0);
    if (!fused)
        position_qk(c, kv, L, il, n, pos0);
    if (from >= n)
        return 0;
    if (from > 0)
        keep_rows(c, from, n);
    n -= from, pos0 += from;
    attention(c, kv, L, il, n, pos0, !fused);
    lm_matmul(c->proj, L->wo, c->att, n, &c->mm);
    residual(c, c->proj, L->post_attn_norm, L->ffn_norm, n);
    return n;
}

/* hb = act(gate) * up, from separate matrices or one fused [gate | up]. */
static void gated_ffn(lm_ctx *c, const lm_layer *L, int n)
{
    const lm_model *m = c->m;
    const int F = m->hp.n_ff, gelu = m->arch->flags & ARCH_GELU;
    if (L->w_gate) {
        float *outs[] = {c->hb, c->hb2};
        const lm_tensor *ws[] = {L->w_gate, L->w_up};
        lm_matmul_many(outs, ws, 2, c->xb, n, &c->mm);
    } else {
        lm_matmul(c->hb2, L->w_up, c->xb, n, &c->mm); /* [gate | up] rows: split them */
#pragma omp single nowait
        for (int t = 0; t < n; t++) { /* ascending: token t's up lands below token t+1's row */
            memcpy(c->hb + (size_t)t * F, c->hb2 + (size_t)t * 2 * F, (size_t)F * sizeof(float));
            memmove(c->hb2 + (size_t)t * F, c->hb2 + (size_t)t * 2 * F + F, (size_t)F * sizeof(float));
        }
        lm_barrier_wait(&c->mm.bar);
    }
    /* element by element: one token's features are shared out among the threads */
    const int parts = n == 1 ? omp_get_num_threads() : 1;
#pragma omp for schedule(static) nowait
    for (int j = 0; j < n * parts; j++) {
        const size_t t = (size_t)(j / parts), f = (size_t)F;
        const int p = j % parts;
        size_t a = f * (size_t)p / (size_t)parts & ~(size_t)15;
        size_t b = p + 1 == parts ? f : f * (size_t)(p + 1) / (size_t)parts & ~(size_t)15;
        if (gelu)
            lm_gelu_mul(m, c->hb + t * f + a, c->hb2 + t * f + a, b - a, c->mm.isa);
        else
            lm_silu_mul(c->hb + t * f + a, c->hb2 + t * f + a, b - a, c->mm.isa);
    }
    lm_barrier_wait(&c->mm.bar);
}

static void ffn_block(lm_ctx *c, int il, int n)
{
    const lm_layer *L = &c->m->layers[il];
    const lm_layer *next = il + 1 < c->m->hp.n_layer ? L + 1 : NULL;
    gated_ffn(c, L, n); /* on xb, normed by the attention's residual */
    lm_matmul(c->proj, L->w_down, c->hb, n, &c->mm);
    residual(c, c->proj, L->post_ffn_norm, next ? next->attn_norm : NULL, n);
}

/* Score rows for n_ctx keys: as many queries at once as 4 MiB a thread holds (1..LM_ATT_QMAX). */
static int ensure_scores(lm_ctx *c, int n_ctx, lm_err *e)
{
    if (c->scores_cap >= n_ctx)
        return 0;
    int qmax = (1 << 20) / n_ctx;
    qmax = qmax < 1 ? 1 : qmax > LM_ATT_QMAX ? LM_ATT_QMAX : qmax;
    const int row = (n_ctx + 15) & ~15;
    size_t floats = (size_t)qmax * (size_t)row + (size_t)qmax * LM_ATT_ACC;
    for (int i = 0; i < c->n_threads; i++) { /* vectors of 16 scores: a cache line each */
        free(c->scores[i]);
        c->scores[i] = alloc_floats(floats);
        if (!c->scores[i]) {
            c->scores_cap = 0; /* some rows are gone: the next pass asks again */
            lm_seterr(e, "out of memory for attention scores");
            return -1;
        }
    }
    free(c->split_scores);
    const size_t heads = (size_t)c->m->hp.n_head;
    c->split_scores = alloc_floats(heads * (size_t)row + heads * (size_t)c->n_threads * 16);
    if (!c->split_scores) {
        c->scores_cap = 0;
        lm_seterr(e, "out of memory for attention scores");
        return -1;
    }
    c->scores_cap = row;
    c->att_qmax = qmax;
    return 0;
}

/* c->kv32 for kv when a pass of n tokens would use it (lm_kv_copy_worth). */
static int ensure_kv32(lm_ctx *c, const lm_kv *kv, int n, lm_err *e)
{
    const size_t floats = lm_kv_f32_floats(kv);
    if (!lm_kv_copy_worth(c->m, kv, n < c->ubatch ? n : c->ubatch) || c->kv32_floats >= floats)
        return 0;
    free(c->kv32);
    c->kv32 = alloc_floats(floats); /* pages are mapped as the rows are converted */
    c->kv32_floats = c->kv32 ? floats : 0;
    if (!c->kv32) {
        lm_seterr(e, "out of memory for an f32 copy of the cache's rows (%zu MiB)", floats * sizeof(float) >> 20);
        return -1;
    }
    return 0;
}

static int embed(lm_ctx *c, const int32_t *tokens, int n, lm_err *e)
{
    const lm_model *m = c->m;
    const lm_tensor *te = m->tok_embd;
    const int E = m->hp.n_embd;
    for (int t = 0; t < n; t++) {
        if (tokens[t] < 0 || tokens[t] >= m->hp.n_vocab) {
            lm_seterr(e, "token id %d is out of range (vocabulary of %d)", tokens[t], m->hp.n_vocab);
            return -1;
        }
        float *x = c->x + (size_t)t * E;
        /* (tied embeddings may be in a layout the copy gave them for the output's kernels) */
        lm_tensor_row_f32(te, tokens[t], x, c->mm.file_rows[0]);
        if (m->arch->flags & ARCH_EMBD_SCALE)
            for (int i = 0; i < E; i++)
                x[i] *= sqrtf((float)E);
    }
    return 0;
}

/* Final norm and vocabulary projection for rows [first, n) of c->x. */
static void output_logits(lm_ctx *c, int first, int n, float *logits)
{
    const lm_model *m = c->m;
    const int E = m->hp.n_embd;
    norm_rows(c, c->xb, c->x + (size_t)first * E, m->output_norm, n - first);
    lm_matmul(logits, m->output, c->xb, n - first, &c->mm);
    const float cap = m->hp.final_softcap;
    if (cap > 0) {
        const size_t all = (size_t)(n - first) * (size_t)m->hp.n_vocab, part = 4096;
#pragma omp for schedule(static) nowait
        for (size_t i = 0; i < all; i += part)
            lm_softcap_rows(logits + i, all - i < part ? all - i : part, cap, c->mm.isa);
        lm_barrier_wait(&c->mm.bar);
    }
}

static int decode_ubatch(lm_ctx *c, lm_kv *kv, const int32_t *tokens, int n, int pos0,
                         int want_first, float *logits, volatile int *stop, lm_err *e)
{
    if (embed(c, tokens, n, e))
        return -1;
    if (n == 1 && stop && *stop) { /* a token is short: asked before it, not between its layers */
        lm_seterr(e, "interrupted");
        return -1;
    }
    int halt = 0;
    /* One region for the whole pass: its steps share the threads through
       worksharing loops and barriers, cheaper than a fork and join a step. */
#pragma omp parallel num_threads(c->n_threads)
    for (int il = 0; il < c->m->hp.n_layer; il++) {
        if (n > 1) {
#pragma omp single nowait /* every thread sees the same answer */
            halt = stop && *stop;
            lm_barrier_wait(&c->mm.bar);
        }
        if (halt)
            break;
        const int last = il + 1 == c->m->hp.n_layer; /* only wanted rows past its cache write */
        const int rows = attention_block(c, kv, il, n, pos0, last ? want_first : 0);
        if (rows)
            ffn_block(c, il, rows);
        if (last && rows)
            output_logits(c, 0, rows, logits);
    }
    if (halt) {
        lm_seterr(e, "interrupted");
        return -1;
    }
    return 0;
}

static int decode_all(lm_ctx *c, lm_kv *kv, const int32_t *tokens, int n, int pos0, int logits_mode,
                      float *logits, volatile int *stop, lm_err *e)
{
    if (n <= 0 || pos0 < 0 || pos0 + n > kv->n_ctx) {
        lm_seterr(e, "positions %d..%d do not fit a context of %d", pos0, pos0 + n - 1, kv->n_ctx);
        return -1;
    }
    if (ensure_scores(c, kv->n_ctx, e) || ensure_kv32(c, kv, n, e))
        return -1;
    const size_t nv = (size_t)c->m->hp.n_vocab;
    for (int done = 0; done < n; done += c->ubatch) {
        int nb = n - done < c->ubatch ? n - done : c->ubatch;
        int last = done + nb == n;
        int want_first = nb;
        float *out = NULL;
        if (logits_mode == LM_LOGITS_ALL) {
            want_first = 0;
            out = logits + (size_t)done * nv;
        } else if (logits_mode == LM_LOGITS_LAST && last) {
            want_first = nb - 1;
            out = logits;
        }
        if (decode_ubatch(c, kv, tokens + done, nb, pos0 + done, want_first, out, stop, e))
            return -1;
    }
    return 0;
}

size_t lm_ctx_prefetch(const lm_ctx *c, int *l1_too, int *chosen)
{
    const size_t ahead = lm_ahead_next(&c->ahead);
    *l1_too = (ahead & LM_AHEAD_L1) != 0;
    *chosen = c->ahead.fixed || c->ahead.chosen;
    return lm_ahead_bytes(ahead);
}

int lm_decode(lm_ctx *c, lm_kv *kv, const int32_t *tokens, int n, int pos0, int logits_mode,
              float *logits, volatile int *stop, lm_err *e)
{
    lm_weights_enter(c->m, c->n_threads); /* the tensors copied so far are read from the copy */
    if (!c->ahead_settled && lm_weights_settled(c->m)) {
        /* tuned on the mapped file while the copy was made (a script leaves it little idle
           time), tuned again once the weights are where they stay */
        lm_ahead_tune_init(&c->ahead);
        c->ahead_settled = 1;
    }
    c->mm.ahead = lm_ahead_next(&c->ahead);
    const double t0 = n == 1 ? omp_get_wtime() : 0;
    int rc = decode_all(c, kv, tokens, n, pos0, logits_mode, logits, stop, e);
    if (n == 1 && rc == 0)
        lm_ahead_record(&c->ahead, c->mm.ahead, omp_get_wtime() - t0);
    lm_weights_leave(c->m);
    return rc;
}
