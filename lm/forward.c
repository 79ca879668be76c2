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

/* Rows of floats that vector loops read 16 at a time: on a cache line each, where their lengths allow. */
static float *alloc_floats(size_t n)
{
    return aligned_alloc(64, ((n ? n : 1) * sizeof(float) + 63) & ~(size_t)63);
}

/* Floats of each of a thread's own rows (own_rows), a whole number of cache lines. */
static size_t own_row_floats(const lm_hparams *hp)
{
    const size_t most = (size_t)(hp->n_embd > hp->n_ff ? hp->n_embd : hp->n_ff);
    return (most + 15) & ~(size_t)15;
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
    c->own = calloc((size_t)c->n_threads, sizeof *c->own);
    for (int i = 0; c->own && i < c->n_threads; i++)
        if (!(c->own[i] = alloc_floats(3 * own_row_floats(hp))))
            goto oom;
    c->rope_cs = alloc_floats(ub * (size_t)(hp->n_rot / 2));
    c->rope_sn = alloc_floats(ub * (size_t)(hp->n_rot / 2));
    c->rope_n = -1;
    c->scores = calloc((size_t)c->n_threads, sizeof *c->scores);
    if (!c->x || !c->xb || !c->proj || !c->q || !c->k || !c->v || !c->att || !c->hb || !c->hb2 ||
        !c->own || !c->rope_cs || !c->rope_sn || !c->scores)
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
    for (int i = 0; c->own && i < c->n_threads; i++)
        free(c->own[i]);
    free(c->own);
    free(c->rope_cs);
    free(c->rope_sn);
    free(c->hb2);
    free(c);
}

/* ---------------------------------------------------------------- steps */

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

/* Q, K, V of n tokens from the normed rows in: separate matrices or one fused [q | k | v]. */
static void project_qkv(lm_ctx *c, const lm_layer *L, const float *in, int n)
{
    if (!L->wqkv) {
        float *outs[] = {c->q, c->k, c->v};
        const lm_tensor *ws[] = {L->wq, L->wk, L->wv};
        lm_matmul_many(outs, ws, 3, in, n, &c->mm);
    } else {
        int all = c->q_dim + c->k_dim + c->v_dim;
        lm_matmul(c->hb, L->wqkv, in, n, &c->mm);
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
 * A step of one token between two matrices runs whole on every thread, on
 * rows of its own (c->own): the residual row, its norm, the gated FFN row.
 * Each thread rounds the whole input of the next matrix for itself anyway
 * (matmul.c's round_acts), and a token's rows are a few thousand floats,
 * so no thread waits for another between one matrix and the next: a layer
 * passes five barriers instead of eight, and only the new residual row
 * goes back to c->x, each thread its share.  The same operations on the
 * same values, so the same bytes.  Each wait costs most where a thread
 * shares its core (two threads, a busy loop on one of the two cores,
 * alternated: smollm2 Q4_K_M generating 9.1-10.5 -> 9.6-13.3 t/s,
 * tinyllama Q4_0 6.2-6.6 -> 7.0-9.2); with both cores free a 24-layer
 * model that fits in L3 went 931-964 -> 942-992 t/s, the 0.1-1.1B models
 * level within the noise.
 */
typedef struct own_rows {
    float *x, *xb, *g; /* the residual row, its norm (the next matrix's input), act(gate) * up */
} own_rows;

static own_rows own_rows_of(const lm_ctx *c)
{
    const size_t row = own_row_floats(&c->m->hp);
    float *b = c->own[omp_get_thread_num()];
    return (own_rows){b, b + row, b + 2 * row};
}

/* The normed rows the next matrix reads: this thread's own for one token. */
static const float *normed(const lm_ctx *c, int n)
{
    return n == 1 ? own_rows_of(c).xb : c->xb;
}

/* The rows of c->x normed by w into normed(c, n). */
static void norm_input(lm_ctx *c, const lm_tensor *w, int n)
{
    if (n > 1) {
        norm_rows(c, c->xb, c->x, w, n);
        return;
    }
    lm_rmsnorm_isa(own_rows_of(c).xb, c->x, w->data, c->m->hp.n_embd, c->m->hp.rms_eps, c->mm.isa);
}

/*
 * One token: this thread's residual row = x + norm(out) or x + out, where
 * x is c->x after the attention and the thread's own row after the FFN;
 * its norm by next (if any) into the next matrix's input.  After the FFN
 * its share of the row goes to c->x, and without next every thread waits
 * for the others' shares (the output norm reads the whole row).
 */
static void token_residual(lm_ctx *c, const float *out, const lm_tensor *post_norm, const lm_tensor *next,
                           int after_ffn)
{
    const lm_hparams *hp = &c->m->hp;
    const int E = hp->n_embd;
    const own_rows r = own_rows_of(c);
    const float *x = after_ffn ? r.x : c->x, *o = out;
    if (post_norm) { /* into the norm's row, free until the end: out is every thread's */
        lm_rmsnorm_isa(r.xb, out, post_norm->data, E, hp->rms_eps, c->mm.isa);
        o = r.xb;
    }
#pragma omp simd
    for (int i = 0; i < E; i++)
        r.x[i] = x[i] + o[i];
    if (after_ffn) {
        const int p = omp_get_thread_num(), parts = omp_get_num_threads();
        const size_t a = (size_t)E * (size_t)p / (size_t)parts, b = (size_t)E * (size_t)(p + 1) / (size_t)parts;
        memcpy(c->x + a, r.x + a, (b - a) * sizeof *r.x);
    }
    if (next)
        lm_rmsnorm_isa(r.xb, r.x, next->data, E, hp->rms_eps, c->mm.isa);
    else if (after_ffn)
        lm_barrier_wait(&c->mm.bar);
}

/*
 * c->x += norm(out) or c->x += out after the attention or the FFN, for n
 * tokens of E features; then, with next, the rows normed by next into
 * normed(c, n) for the step that follows (the FFN, the next layer's
 * attention).  A token's steps run in one loop (one barrier, not two or
 * three); one token's on every thread (token_residual).
 */
static void residual(lm_ctx *c, float *out, const lm_tensor *post_norm, const lm_tensor *next, int n, int after_ffn)
{
    if (n == 1) {
        token_residual(c, out, post_norm, next, after_ffn);
        return;
    }
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

/* The attention half of layer il for n tokens; returns how many rows go on (keep from 'from'). */
static int attention_block(lm_ctx *c, lm_kv *kv, int il, int n, int pos0, int from)
{
    const lm_layer *L = &c->m->layers[il];
    if (il == 0) /* later layers find their input normed by the last one's residual */
        norm_input(c, L->attn_norm, n);
    project_qkv(c, L, normed(c, n), n);
    n = lm_pass_attention(c, kv, il, n, pos0, from);
    if (!n)
        return 0;
    lm_matmul(c->proj, L->wo, c->att, n, &c->mm);
    residual(c, c->proj, L->post_attn_norm, L->ffn_norm, n, 0);
    return n;
}

/* g = act(g) * up, n features. */
static void act_mul(const lm_ctx *c, float *g, const float *up, size_t n)
{
    if (c->m->arch->flags & ARCH_GELU)
        lm_gelu_mul(c->m, g, up, n, c->mm.isa);
    else
        lm_silu_mul(g, up, n, c->mm.isa);
}

/*
 * act(gate) * up from separate matrices or one fused [gate | up], into
 * c->hb (one token: the thread's own row); returns the rows.
 */
static const float *gated_ffn(lm_ctx *c, const lm_layer *L, int n)
{
    const size_t F = (size_t)c->m->hp.n_ff;
    if (L->w_gate) {
        float *outs[] = {c->hb, c->hb2};
        const lm_tensor *ws[] = {L->w_gate, L->w_up};
        lm_matmul_many(outs, ws, 2, normed(c, n), n, &c->mm);
    } else {
        lm_matmul(c->hb2, L->w_up, normed(c, n), n, &c->mm); /* [gate | up] rows */
    }
    if (n == 1) {
        float *g = own_rows_of(c).g;
        memcpy(g, L->w_gate ? c->hb : c->hb2, F * sizeof *g);
        act_mul(c, g, L->w_gate ? c->hb2 : c->hb2 + F, F);
        return g;
    }
    if (!L->w_gate) {
#pragma omp single nowait /* split the [gate | up] rows */
        for (size_t t = 0; t < (size_t)n; t++) { /* ascending: token t's up lands below token t+1's row */
            memcpy(c->hb + t * F, c->hb2 + t * 2 * F, F * sizeof(float));
            memmove(c->hb2 + t * F, c->hb2 + t * 2 * F + F, F * sizeof(float));
        }
        lm_barrier_wait(&c->mm.bar);
    }
#pragma omp for schedule(static) nowait
    for (int t = 0; t < n; t++)
        act_mul(c, c->hb + (size_t)t * F, c->hb2 + (size_t)t * F, F);
    lm_barrier_wait(&c->mm.bar);
    return c->hb;
}

static void ffn_block(lm_ctx *c, int il, int n)
{
    const lm_layer *L = &c->m->layers[il];
    const lm_layer *next = il + 1 < c->m->hp.n_layer ? L + 1 : NULL;
    const float *g = gated_ffn(c, L, n); /* on the rows normed by the attention's residual */
    lm_matmul(c->proj, L->w_down, g, n, &c->mm);
    residual(c, c->proj, L->post_ffn_norm, next ? next->attn_norm : NULL, n, 1);
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
