/*
 * lm/attend_pass.c - a forward pass's attention step, shared among its
 * threads: the rotations of the batch's positions, each token's queries and
 * key rotated and its key and value written to the cache, then causal
 * attention over the cache, cut into jobs (a KV head's queries, or parts of
 * them) that the threads take as they come free.  forward.c calls
 * lm_pass_attention between the Q/K/V projections and the output one.
 */
#include "internal.h"

#include <omp.h>
#include <string.h>

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

int lm_pass_attention(lm_ctx *c, lm_kv *kv, int il, int n, int pos0, int from)
{
    const lm_layer *L = &c->m->layers[il];
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
    return n;
}
