/*
 * lm/matmul.c - weight matrix times a batch of activations.  Each token's
 * activation row is first rounded to the weight type's vec_dot_type (as
 * llama.cpp does, see qdot.c); then rows of the weight matrix are split
 * across OpenMP threads and go through the kernel that suits the batch:
 *   one token     16 short rows at a time, or one row at a time, straight
 *                 from the mapped weights (qdot_simd.c; K-quants qrow_k.c);
 *                 Q4_0 and Q5_0 rows front to back with byte permutes where
 *                 the CPU has VBMI (qrow_vbmi.c);
 *   a few tokens  one row against up to 8 tokens, decoded once (qdot_simd.c,
 *                 qrow_k.c);
 *   a batch       16 rows at a time, two by two, each decoded once, against
 *                 groups of 16 tokens (qgemm.c), so a prompt reads each
 *                 weight once per 256 tokens; with AMX, the 16 rows go into
 *                 tiles (qgemm_amx.c); outputs are stored token by token;
 *   otherwise     the row decoded into the thread's qrow, lm_qrow_dot per token.
 * Q4_0 matrices the weights' copy rearranged (repack.c) go through the
 * kernels with blocks in lanes for one token or a few, and the groups for
 * a batch; a path that does not read that layout unpacks each row first.
 * Every kernel computes each output element exactly as lm_qrow_dot's scalar
 * reference does, so batched and token-by-token evaluation, any thread
 * split and any CPU path give bitwise identical logits.
 */
#include "internal.h"

#include <omp.h>

#define TOKEN_BLOCK 64
#define GROUPED_BLOCK (4 * TOKEN_BLOCK) /* the grouped kernels decode a row once a block */
#define QROWS 4 /* qrows a thread holds: the VNNI groups take four rows a call */
#define GROUPS_L2 (640 * 1024) /* bytes of token groups a VNNI block keeps in L2 */
#include <stdlib.h>
#include <string.h>

/* Per thread: 16 rows' codes and scales, and the AMX kernel's scratch. */
static int rows16_init(mm_scratch *s, int64_t max_k)
{
    s->r16 = calloc((size_t)s->n_threads, sizeof *s->r16);
    s->amx_scratch = calloc((size_t)s->n_threads, sizeof *s->amx_scratch);
    if (!s->r16 || !s->amx_scratch)
        return -1;
    size_t stride = (size_t)(max_k + 63) / 64 * 64, nb = (size_t)(max_k / 32 + 1);
    for (int i = 0; i < s->n_threads; i++) {
        rows16 *p = &s->r16[i];
        p->stride = stride;
        p->s8 = aligned_alloc(64, 16 * stride);
        p->d = malloc(16 * nb * sizeof *p->d);
        p->m = malloc(16 * nb * sizeof *p->m);
        p->s8hi = aligned_alloc(64, 16 * stride);
        p->mn = malloc(16 * 2 * nb * sizeof *p->mn);
        s->amx_scratch[i] = aligned_alloc(64, LM_AMX_SCRATCH * sizeof(float));
        if (!p->s8 || !p->s8hi || !p->d || !p->m || !p->mn || !s->amx_scratch[i])
            return -1;
    }
    return 0;
}

/* A qrow's buffers for rows of up to max_k elements. */
static int qrow_alloc(qrow *r, int64_t max_k)
{
    size_t k64 = (size_t)(max_k + 63) / 64 * 64;
    r->f = aligned_alloc(64, k64 * sizeof *r->f);
    r->u = aligned_alloc(64, k64);
    r->sc4 = aligned_alloc(64, k64); /* k/4 int32 */
    r->mn = malloc((size_t)(max_k / 16 + 1) * sizeof *r->mn);
    r->d = malloc((size_t)(max_k / 32 + 1) * sizeof *r->d);
    r->m = malloc((size_t)(max_k / 32 + 1) * sizeof *r->m);
    r->s8 = aligned_alloc(64, k64);
    r->corr16 = malloc((size_t)(max_k / 16 + 1) * sizeof *r->corr16);
    return r->f && r->u && r->sc4 && r->mn && r->d && r->m && r->s8 && r->corr16 ? 0 : -1;
}

int mm_scratch_init(mm_scratch *s, int n_threads, int64_t max_k, int max_tok)
{
    lm_barrier_init(&s->bar);
    if (lm_runs_init(&s->runs, n_threads))
        return -1;
    s->n_threads = n_threads;
    s->ahead = LM_AHEAD_ONE;
    s->isa = lm_cpu_isa();
    const char *force = getenv("KVCHAT_ISA"); /* tests and benchmarks compare the paths */
    if (force && !strcmp(force, "scalar"))
        s->isa = LM_ISA_SCALAR;
    else if (force && !strcmp(force, "avx2") && s->isa > LM_ISA_AVX2)
        s->isa = LM_ISA_AVX2;
    else if (force && !strcmp(force, "neon") && s->isa == LM_ISA_NEON_DOT)
        s->isa = LM_ISA_NEON; /* the ARMv8.0 dots */
    s->amx = s->isa >= LM_ISA_AVX512 && !(force && !strcmp(force, "avx512")) && lm_cpu_amx();
    s->vbmi = s->isa >= LM_ISA_AVX512 && lm_cpu_vbmi();
    s->gfni = s->vbmi && lm_cpu_gfni();
    s->max_k = max_k;
    size_t f32 = lm_act_row_bytes(LM_F32, max_k), q8 = lm_act_row_bytes(LM_Q8_0, max_k);
    const int slots = max_tok > n_threads ? max_tok : n_threads; /* one token: a slot a thread */
    s->act_cap = (size_t)slots * (f32 > q8 ? f32 : q8); /* the largest act format */
    s->act = aligned_alloc(64, s->act_cap);
    s->rows = calloc(QROWS * (size_t)n_threads, sizeof *s->rows);
    s->outs = calloc((size_t)n_threads, sizeof *s->outs);
    s->stage = calloc((size_t)n_threads, sizeof *s->stage);
    s->acts = calloc((size_t)slots, sizeof *s->acts);
    if (!s->act || !s->rows || !s->outs || !s->stage || !s->acts)
        return -1;
    for (int i = 0; i < QROWS * n_threads; i++)
        if (qrow_alloc(&s->rows[i], max_k))
            return -1;
    for (int i = 0; i < n_threads; i++) {
        s->outs[i] = malloc(GROUPED_BLOCK * sizeof(float));
        s->stage[i] = aligned_alloc(64, 16 * GROUPED_BLOCK * sizeof(float));
        if (!s->outs[i] || !s->stage[i])
            return -1;
    }
    if (s->amx && rows16_init(s, max_k))
        return -1;
    if (s->isa >= LM_ISA_AVX2) { /* tests take the AVX2 path on AVX-512 CPUs too */
        if (!(s->r8 = calloc((size_t)n_threads, sizeof *s->r8)))
            return -1;
        for (int i = 0; i < n_threads; i++)
            if (!(s->r8[i] = aligned_alloc(64, lm_rows8_bytes(max_k))))
                return -1;
    }
    /* a row of any rearranged type unpacked (file_row): Q6_K's the most bytes an element of those in
       super-blocks, Q8_0's of those in blocks of 32 */
    const size_t k6 = lm_row_bytes(LM_Q6_K, max_k / 256 * 256), k8 = lm_row_bytes(LM_Q8_0, max_k / 32 * 32);
    if (!(s->file_rows = calloc((size_t)n_threads, sizeof *s->file_rows)))
        return -1;
    for (int i = 0; i < n_threads; i++)
        if (!(s->file_rows[i] = malloc(k6 > k8 ? k6 : k8)))
            return -1;
    int n_groups = (max_tok + 15) / 16;
    s->tg_mem = aligned_alloc(64, (size_t)n_groups * lm_tgroup_bytes(max_k));
    s->groups = calloc((size_t)n_groups, sizeof *s->groups);
    return s->tg_mem && s->groups ? 0 : -1;
}

void mm_scratch_free(mm_scratch *s)
{
    lm_runs_free(&s->runs);
    for (int i = 0; s->rows && i < QROWS * s->n_threads; i++) {
        qrow *r = &s->rows[i];
        free(r->f), free(r->u), free(r->sc4), free(r->mn), free(r->d), free(r->m);
        free(r->s8), free(r->corr16);
    }
    for (int i = 0; s->outs && i < s->n_threads; i++)
        free(s->outs[i]);
    for (int i = 0; s->stage && i < s->n_threads; i++)
        free(s->stage[i]);
    free(s->rows);
    free(s->outs);
    free(s->stage);
    free(s->acts);
    free(s->act);
    for (int i = 0; s->r16 && i < s->n_threads; i++) {
        free(s->r16[i].s8), free(s->r16[i].d), free(s->r16[i].m);
        free(s->r16[i].s8hi), free(s->r16[i].mn);
        free(s->amx_scratch[i]);
    }
    for (int i = 0; s->r8 && i < s->n_threads; i++)
        free(s->r8[i]);
    for (int i = 0; s->file_rows && i < s->n_threads; i++)
        free(s->file_rows[i]);
    free(s->file_rows);
    s->file_rows = NULL;
    free(s->r8);
    s->r8 = NULL;
    free(s->r16);
    free(s->amx_scratch);
    s->r16 = NULL;
    s->amx_scratch = NULL;
    free(s->tg_mem);
    free(s->groups);
    s->tg_mem = NULL;
    s->groups = NULL;
    s->rows = NULL;
    s->act = NULL;
}

/* Whether w's rows are rearranged (repack.c). */
static int in_lanes(const lm_tensor *w)
{
    return w->layout != LM_LAYOUT_FILE;
}

/* The kernels' name for w's K-quant lanes layout (qrow_klanes.c), or 0. */
static uint32_t klanes_tag(const lm_tensor *w)
{
    return w->layout == LM_LAYOUT_Q4_K_LANES ? LM_Q4_K_LANES : w->layout == LM_LAYOUT_Q6_K_LANES ? LM_Q6_K_LANES : 0;
}

/*
 * The kernels' name for w's Q5_0 or Q5_1 lanes layout, or its Q4_0 one
 * where AVX2 reads it (qdot_avx2.c, qgemm_avx2.c; AVX-512 VBMI's kernels
 * take Q4_0's otherwise), or 0.
 */
static uint32_t avx2_lanes_tag(const lm_tensor *w, const mm_scratch *s)
{
    if (w->layout == LM_LAYOUT_Q4_0_LANES)
        return s->isa == LM_ISA_AVX2 ? LM_Q4_0_LANES : 0;
    return w->layout == LM_LAYOUT_Q5_0_LANES ? LM_Q5_0_LANES : w->layout == LM_LAYOUT_Q5_1_LANES ? LM_Q5_1_LANES : 0;
}

/* The kernels' name for w's Q4_0 or Q8_0 lanes layout (qrow_vbmi.c, qgemm.c), or 0. */
static uint32_t b32_lanes_tag(const lm_tensor *w)
{
    return w->layout == LM_LAYOUT_Q4_0_LANES ? LM_Q4_0_LANES : w->layout == LM_LAYOUT_Q8_0_LANES ? LM_Q8_0_LANES : 0;
}

/* Whether this context's kernels read them as they lie (elsewhere each row is unpacked first). */
static int lanes_native(const lm_tensor *w, const mm_scratch *s)
{
    if (klanes_tag(w)) /* AVX2: Q4_K's, one token (qrow_klanes_avx2.c) or eight rows a batch (qgemm_avx2.c) */
        return s->gfni || (s->isa == LM_ISA_AVX2 && klanes_tag(w) == LM_Q4_K_LANES);
    if (avx2_lanes_tag(w, s)) /* AVX2 only: one token (qdot_avx2.c), eight rows a batch */
        return s->isa == LM_ISA_AVX2;
    return in_lanes(w) && s->vbmi;
}

/* Row i of w (rb bytes a row) in the file's layout: a rearranged one unpacked into the thread's buffer. */
static const uint8_t *file_row(const lm_tensor *w, int64_t i, size_t rb, mm_scratch *s)
{
    const uint8_t *row = (const uint8_t *)w->data + (size_t)i * rb;
    if (!in_lanes(w))
        return row;
    uint8_t *buf = s->file_rows[omp_get_thread_num()];
    lm_layout_undo(w->layout, row, buf, w->ne[0]);
    return buf;
}

/*
 * Without AMX: the thread's rows 16 at a time, each decoded once and run
 * against every token group of the block (qgemm.c); the 16 rows' outputs
 * are then stored token by token, 16 adjacent floats each.  Returns the
 * first row left for the loop of rows.
 */
static int64_t rows16_times_groups_vnni(float *out, const lm_tensor *w, int t0, int nt, mm_scratch *s)
{
    const int64_t k = w->ne[0], rows = w->ne[1];
    const size_t row_bytes = lm_row_bytes(w->type, k);
    const int tid = omp_get_thread_num();
    qrow *r = &s->rows[QROWS * tid];
    const qrow *rq[QROWS];
    for (int i = 0; i < QROWS; i++)
        rq[i] = &r[i];
    float *stage = s->stage[tid];
    /* guided: a thread that shares its core (a busy neighbour, a noisy VM)
       takes fewer chunks instead of holding the others at the barrier */
#pragma omp for schedule(guided) nowait
    for (int64_t c = 0; c < rows / 16; c++) {
        for (int m = 0; m < 16; m += QROWS) { /* four rows at a time share the token loads */
            for (int i = 0; i < QROWS; i++) {
                const uint8_t *raw = (const uint8_t *)w->data + (size_t)(c * 16 + m + i) * row_bytes;
                lm_prefetch_ahead(raw, row_bytes, nt, nt == 1 ? s->ahead : LM_PREFETCH_BATCH);
                if (b32_lanes_tag(w) && lm_row_b32_prepare(b32_lanes_tag(w), raw, k, &r[i]))
                    continue;
                if (klanes_tag(w) && lanes_native(w, s) && lm_row_klanes_prepare(klanes_tag(w), raw, k, &r[i]))
                    continue;
                const uint8_t *row = file_row(w, c * 16 + m + i, row_bytes, s);
                if (lm_row_k_prepare(w->type, row, k, &r[i]) || lm_row_b32_prepare(w->type, row, k, &r[i]))
                    continue;
                lm_qrow_decode(&r[i], w->type, row, k, s->isa);
                lm_trow_prepare_avx512(&r[i]);
            }
            for (int c0 = t0; c0 < t0 + nt; c0 += 64) { /* four groups a call */
                int cn = t0 + nt - c0 < 64 ? t0 + nt - c0 : 64, ng = (cn + 15) / 16;
                const tgroup *g[4];
                for (int j = 0; j < ng; j++)
                    g[j] = &s->groups[c0 / 16 + j];
                float *o[QROWS];
                for (int i = 0; i < QROWS; i++)
                    o[i] = stage + (m + i) * GROUPED_BLOCK + (c0 - t0);
                lm_trow_groups_avx512(rq, QROWS, g, ng, o);
            }
        }
        lm_store_rows16(stage, GROUPED_BLOCK, out + (size_t)t0 * rows + c * 16, (size_t)rows, nt);
    }
    return rows / 16 * 16;
}

/* Row i decoded into slot m of the thread's 16 rows. */
static void rows16_put(rows16 *p, int m, const lm_tensor *w, int64_t i, mm_scratch *s, qrow *r)
{
    const int64_t k = w->ne[0];
    const size_t rb = lm_row_bytes(w->type, k);
    const uint8_t *raw = (const uint8_t *)w->data + (size_t)i * rb;
    const uint32_t tag = w->layout == LM_LAYOUT_Q4_0_LANES ? LM_Q4_0_LANES : klanes_tag(w);
    if (tag && lm_rows16_put_raw(p, m, tag, raw))
        return; /* transposed from the layout as it lies */
    const uint8_t *row = file_row(w, i, rb, s);
    if (lm_rows16_put_raw(p, m, w->type, row))
        return;
    lm_qrow_decode(r, w->type, row, k, s->isa);
    lm_rows16_put(p, m, r);
}

/* Asks for bytes [from, to) of p to be brought into L2. */
static void prefetch_span(const uint8_t *p, size_t from, size_t to)
{
    for (size_t off = from & ~(size_t)63; off < to; off += 64)
        __builtin_prefetch(p + off, 0, 2);
}

/*
 * With AMX: the thread's rows 16 at a time against
 * every group of the token block (qgemm_amx.c).  Returns the first row left
 * for the loop of rows.
 */
static int64_t rows16_times_groups(float *out, const lm_tensor *w, int t0, int nt, mm_scratch *s)
{
    const int64_t rows = w->ne[1];
    const int tid = omp_get_thread_num();
    rows16 *p = &s->r16[tid];
    float *scratch = s->amx_scratch[tid];
    const int b32 = lm_act_type(w->type) == LM_Q8_0;
    const int has_mins = lm_k_has_mins(w->type);
    const size_t rb = lm_row_bytes(w->type, w->ne[0]);
    p->k = w->ne[0];
    lm_rows16_use_s8(p);
    lm_amx_begin(w->type);
#pragma omp for schedule(static) nowait
    for (int64_t c = 0; c < rows / 16; c++) {
        if (w->type == LM_Q8_0 && !in_lanes(w)) /* (the tiles read Q8_0 rows as the file has them) */
            lm_rows16_point_q8_0(p, (const uint8_t *)w->data + (size_t)c * 16 * rb, rb);
        else
            for (int m = 0; m < 16; m++)
                rows16_put(p, m, w, c * 16 + m, s, &s->rows[QROWS * tid]);
        /* the next 16 rows come into L2 a slice before each group: read when
           they are unpacked, they stalled on memory (lm_prefetch_ahead's few KiB
           is a fraction of 16 long rows) */
        const uint8_t *next = (const uint8_t *)w->data + (size_t)(c + 1) * 16 * rb;
        const size_t span = c + 1 < rows / 16 ? 16 * rb : 0, ng = (size_t)(nt + 15) / 16;
        for (int g0 = t0; g0 < t0 + nt; g0 += 16) {
            int cn = t0 + nt - g0 < 16 ? t0 + nt - g0 : 16;
            size_t i = (size_t)(g0 - t0) / 16;
            prefetch_span(next, span * i / ng, span * (i + 1) / ng);
            float *o = out + (size_t)g0 * rows + c * 16;
            if (b32)
                lm_rows16_group_amx(p, &s->groups[g0 / 16], o, (size_t)rows, cn, scratch);
            else
                lm_rows16_group_k_amx(p, &s->groups[g0 / 16], has_mins, o, (size_t)rows, cn, scratch);
        }
    }
    lm_amx_end();
    return rows / 16 * 16;
}

/*
 * AVX2, several tokens: the thread's rows eight at a time, unpacked once
 * and run against every token of the block (qgemm_avx2.c).  Returns the
 * first row left for the loop of rows.
 */
static int64_t rows8_times_tokens(float *out, const lm_tensor *w, int t0, int nt, const act_row *acts,
                                  mm_scratch *s)
{
    const int64_t k = w->ne[0], rows = w->ne[1];
    const size_t rb = lm_row_bytes(w->type, k);
    void *scratch = s->r8[omp_get_thread_num()];
    const uint32_t tag = klanes_tag(w)     ? klanes_tag(w)
                         : avx2_lanes_tag(w, s) ? avx2_lanes_tag(w, s)
                                                 : w->type; /* (eights: the file's or these lanes) */
#pragma omp for schedule(guided) nowait
    for (int64_t c = 0; c < rows / 8; c++)
        lm_rows8_avx2(tag, (const uint8_t *)w->data + (size_t)c * 8 * rb, rb, k, acts + t0, nt,
                      out + (size_t)t0 * rows + c * 8, (size_t)rows, scratch);
    return rows / 8 * 8;
}

/*
 * One token through short rows (under 1024 elements, as in small models):
 * 16 rows a call where the kernel takes the type, so no row ends on a
 * tail of blocks of its own.  Long rows stream faster one at a time, and
 * so do short ones where VBMI lays the token out for rows read in order
 * (windows, lanes): 16 rows side by side defeat the prefetcher (Q8_0 rows
 * of 576 on one core, from memory: 9.0 Gw/s here, 14.3 in lanes;
 * smollm2 Q8_0 generating 119 -> 170 t/s).
 * Returns the first row left for the loop of rows.
 */
static int64_t rows16_times_token(float *out, const lm_tensor *w, const act_row *acts, mm_scratch *s)
{
    const int64_t k = w->ne[0], rows = w->ne[1];
    if (s->isa < LM_ISA_AVX512 || !lm_rows16_type(w->type) || k >= 1024 || acts[0].windows || acts[0].lanes ||
        in_lanes(w))
        return 0;
    const size_t rb = lm_row_bytes(w->type, k);
#pragma omp for schedule(static) nowait
    for (int64_t g = 0; g < rows / 16; g++)
        lm_rows16_avx512(w->type, (const uint8_t *)w->data + (size_t)g * 16 * rb, rb, k, &acts[0], out + g * 16);
    return rows / 16 * 16;
}

/*
 * Rows [a, e) of w for tokens t0..t0+nt through the kernel that takes
 * many rows a call, when there is one for w's type and these tokens;
 * returns whether there was.
 */
static int fast_rows(float *out, const lm_tensor *w, int64_t a, int64_t e, int t0, int nt, const act_row *acts,
                     mm_scratch *s)
{
    const int64_t k = w->ne[0], rows = w->ne[1];
    const size_t rb = lm_row_bytes(w->type, k);
    const uint8_t *row = (const uint8_t *)w->data + (size_t)a * rb;
    float *o = out + (size_t)t0 * rows + a;
    if (klanes_tag(w)) { /* rearranged: each lane adds up its groups */
        if (!lanes_native(w, s) || acts[t0].klanes != (int)klanes_tag(w))
            return 0;
        if (!s->gfni)
            return nt == 1 && lm_rows_klanes_avx2(klanes_tag(w), row, rb, e - a, k, &acts[t0], o);
        return lm_rows_klanes(klanes_tag(w), row, rb, e - a, k, acts + t0, nt, o, (size_t)rows);
    }
    if (avx2_lanes_tag(w, s)) /* (a batch goes eight rows at a time, rows8_times_tokens) */
        return nt == 1 && lanes_native(w, s) && lm_rows_avx2(avx2_lanes_tag(w, s), row, rb, e - a, k, &acts[t0], o);
    if (in_lanes(w)) { /* rearranged: one token or a few, no permutes */
        if (!lanes_native(w, s) || !acts[t0].lanes)
            return 0;
        lm_rows_lanes_vbmi(b32_lanes_tag(w), row, rb, e - a, k, &acts[t0], nt, o, (size_t)rows);
        return 1;
    }
    if (s->isa == LM_ISA_AVX2)
        return nt == 1 && lm_rows_avx2(w->type, row, rb, e - a, k, &acts[t0], o);
    if (nt == 1 && acts[t0].windows) {
        lm_rows_b32_vbmi(w->type, row, rb, e - a, k, &acts[t0], o);
        return 1;
    }
    if (acts[t0].lanes) {
        lm_rows_lanes_vbmi(w->type, row, rb, e - a, k, &acts[t0], nt, o, (size_t)rows);
        return 1;
    }
    if (s->isa >= LM_ISA_AVX512 &&
        (s->gfni ? lm_rows_k_gfni : lm_rows_k_avx512)(w->type, row, rb, e - a, k, acts + t0, nt, o, (size_t)rows))
        return 1;
    /* one token through types with no AVX-512 kernel: the AVX2 one, as stored, not decoded first */
    const int avx2_only = w->type == LM_Q4_1 || w->type == LM_Q5_1 || w->type == LM_Q2_K || w->type == LM_Q3_K ||
                          w->type == LM_F16 || w->type == LM_BF16;
    return nt == 1 && avx2_only && s->isa >= LM_ISA_AVX2 && lm_rows_avx2(w->type, row, rb, e - a, k, &acts[t0], o);
}

/*
 * The first bytes of a run of rows, asked for at once: the kernels ask for
 * the bytes s->ahead beyond those they read, so a run's
 * start would otherwise wait on memory line by line, and a thread starts
 * a run several times a matrix (at its share's start and after each
 * steal, lm_runs; seven matrices a layer).  tinyllama Q4_0's 154 matrices one token at a time, two threads,
 * against the machine's read speed beside them, alternated: 90.5 -> 92.5%
 * when it read 35 GB/s, 75 -> 76% at 50-60; `kvchat bench -n 64` on the
 * three tinyllamas, four rounds: 86-93 -> 90-94% at 35.
 */
static void ask_run_start(const uint8_t *run, size_t bytes, size_t ahead)
{
    const size_t far = lm_ahead_bytes(ahead);
    prefetch_span(run, 0, bytes < far ? bytes : far);
}

#define RUN_BYTES 65536 /* weight bytes of a run of rows for the fast kernels, about */

/*
 * Several tokens through F32, F16 or BF16 rows: four rows at a time (two
 * where AVX2 is the widest), so that the block's activations come from L2
 * once for those rows, not once a row (qrow_f.c).  Returns 0 where it does
 * not apply.
 */
static int float_tiles(float *out, const lm_tensor *w, int64_t r0, int t0, int nt, const act_row *acts,
                       const mm_scratch *s)
{
    const int float_rows = w->type == LM_F32 || w->type == LM_F16 || w->type == LM_BF16;
    if (s->isa < LM_ISA_AVX2 || nt < 2 || !float_rows || in_lanes(w))
        return 0;
    const int wide = s->isa >= LM_ISA_AVX512, per = wide ? 4 : 2;
    const int64_t k = w->ne[0], rows = w->ne[1], tiles = (rows - r0 + per - 1) / per;
    const size_t rb = lm_row_bytes(w->type, k);
    const uint8_t *base = w->data;
#pragma omp for schedule(static) nowait
    for (int64_t q = 0; q < tiles; q++) {
        const int64_t i = r0 + per * q;
        const int nr = rows - i < per ? (int)(rows - i) : per;
        (wide ? lm_rows_f_avx512 : lm_rows_f_avx2)(w->type, base + (size_t)i * rb, rb, nr, k, acts + t0, nt,
                                                   out + (size_t)t0 * rows + i, (size_t)rows);
    }
    return 1;
}

/*
 * One block of tokens against the rows from r0 on, by the threads of the
 * region.  The fast kernels take runs of about 64 KiB of rows (a multiple
 * of 16), shared out by lm_runs (runs.c): each thread starts on a
 * contiguous 1/T of them, read in order as the kernels' prefetches expect,
 * and one that is through takes the back half of what another has left, so
 * a thread slowed down (a shared core, a noisy VM) does fewer instead of
 * holding the other at the barrier.  Guided before, which hands the first
 * thread half the matrix at once: tinyllama Q4_0 generation on a Zen 5
 * with one core lagging, perf's share of lm_barrier_wait 8-9% -> 4%, and
 * 82-92% of the machine's read speed -> 89-94% (fast spells level; few-
 * token prompts level within the noise).
 */
static void rows_times_tokens(float *out, const lm_tensor *w, int64_t r0, int t0, int nt,
                              const act_row *acts, mm_scratch *s)
{
    const int64_t k = w->ne[0], rows = w->ne[1];
    const size_t row_bytes = lm_row_bytes(w->type, k);
    const uint8_t *base = w->data;
    const int tid = omp_get_thread_num();
    if (fast_rows(out, w, r0, r0, t0, nt, acts, s)) { /* (no rows: only asks) */
        const int64_t left = rows - r0, most = left / (4 * (int64_t)omp_get_num_threads());
        int64_t per = (int64_t)(RUN_BYTES / row_bytes);
        per = (per < most ? per : most) / 16 * 16; /* four runs a thread at least: small matrices stay even */
        per = per > 16 ? per : 16;
        while ((left + per - 1) / per > LM_RUNS_MAX)
            per *= 2;
        const int64_t runs = (left + per - 1) / per;
        lm_runs_iter it;
        lm_runs_begin(&s->runs, &it, runs);
        for (int64_t u; (u = lm_runs_next(&it)) >= 0;) {
            const int64_t a = r0 + per * u, e = a + per < rows ? a + per : rows;
            if (nt == 1)
                ask_run_start(base + (size_t)a * row_bytes, (size_t)(e - a) * row_bytes, s->ahead);
            fast_rows(out, w, a, e, t0, nt, acts, s);
        }
        return;
    }
    if (float_tiles(out, w, r0, t0, nt, acts, s))
        return;
    qrow *r = &s->rows[QROWS * tid];
    float *tmp = s->outs[tid];
#pragma omp for schedule(static) nowait
    for (int64_t i = r0; i < rows; i++) {
        const uint8_t *row = file_row(w, i, row_bytes, s);
        if (s->isa >= LM_ISA_AVX512 && lm_fused_row_avx512(w->type, row, k, acts + t0, nt, tmp, r)) {
            for (int t = 0; t < nt; t++)
                out[(size_t)(t0 + t) * rows + i] = tmp[t];
            continue;
        }
        lm_prefetch_ahead(base + (size_t)i * row_bytes, row_bytes, nt, s->ahead); /* the fused kernels prefetch as they go */
        lm_qrow_decode(r, w->type, row, k, s->isa);
        lm_qrow_dots(r, acts + t0, nt, out + (size_t)t0 * rows + i, (size_t)rows, s->isa);
    }
}

/* Whether a few tokens go through w's rows with their blocks in lanes (qrow_vbmi.c). */
static int lanes_type(const lm_tensor *w, const mm_scratch *s)
{
    return s->vbmi && (w->type == LM_Q4_0 || w->type == LM_Q5_0 || w->type == LM_Q8_0);
}

/* Whether the activations rounded for a serve b as they are. */
static int acts_fit(const lm_tensor *a, const lm_tensor *b)
{
    return a->ne[0] == b->ne[0] && lm_act_type(a->type) == lm_act_type(b->type) &&
           lm_code_offset(a->type) == lm_code_offset(b->type) && a->layout == b->layout;
}

/* How a token's rounded row is laid out for the kernel that will take it through w. */
enum { LAYOUT_AS_ROUNDED, LAYOUT_WINDOWS, LAYOUT_LANES, LAYOUT_NIBBLES, LAYOUT_KLANES };

static int act_layout(const lm_tensor *w, int n_tok, int grouped, const mm_scratch *s)
{
    const int b32 = w->type == LM_Q4_0 || w->type == LM_Q5_0;
    if (klanes_tag(w)) /* (AVX2 takes a batch eight rows at a time, from the codes as rounded) */
        return lanes_native(w, s) && !grouped && (s->gfni || n_tok == 1) ? LAYOUT_KLANES : LAYOUT_AS_ROUNDED;
    if (avx2_lanes_tag(w, s)) /* (a batch takes the codes as rounded, qgemm_avx2.c) */
        return lanes_native(w, s) && n_tok == 1 ? LAYOUT_LANES : LAYOUT_AS_ROUNDED;
    if (in_lanes(w))
        return lanes_native(w, s) && !grouped ? LAYOUT_LANES : LAYOUT_AS_ROUNDED;
    if (n_tok == 1 && s->vbmi && b32)
        return LAYOUT_WINDOWS; /* one token, rows read in order (qrow_vbmi.c) */
    if (!grouped && lanes_type(w, s))
        return LAYOUT_LANES; /* a few tokens, or one through Q8_0 rows (qrow_vbmi.c) */
    if (n_tok == 1 && s->isa == LM_ISA_AVX2 && (b32 || w->type == LM_Q4_1))
        return LAYOUT_LANES; /* qdot_avx2.c's Q4_0, Q4_1 and Q5_0 rows, eight blocks a step */
    if (!grouped && s->isa >= LM_ISA_AVX512 && (w->type == LM_Q4_K || w->type == LM_Q5_K))
        return LAYOUT_NIBBLES; /* codes as the row's nibbles lie (qrow_k.c) */
    return LAYOUT_AS_ROUNDED;
}

/* Token t's row x rounded to w's vec_dot_type into act slot `slot`, laid out for the kernel that takes it. */
static void round_token(const lm_tensor *w, const float *x, int n_tok, int grouped, int slot, mm_scratch *s)
{
    const int64_t k = w->ne[0];
    const int atype = lm_act_type(w->type);
    uint8_t *dst = s->act + (size_t)slot * lm_act_row_bytes(atype, k);
    act_row *a = &s->acts[slot];
    int done = s->isa >= LM_ISA_AVX512 ? lm_quantize_act_avx512(w->type, x, dst, k)
               : s->isa == LM_ISA_AVX2 ? lm_quantize_act_avx2(w->type, x, dst, k)
               : lm_isa_neon(s->isa)   ? lm_quantize_act_neon(w->type, x, dst, k)
                                       : 0;
    if (!done)
        lm_quantize_act(w->type, x, dst, k);
    lm_act_layout(atype, k, a, dst);
    a->ahead = s->ahead; /* lm_act_layout left the default */
    switch (act_layout(w, n_tok, grouped, s)) {
    case LAYOUT_WINDOWS: lm_act_windows(a); break;
    case LAYOUT_LANES: lm_act_lanes(a); break;
    case LAYOUT_NIBBLES: lm_act_nibbles(a); break;
    case LAYOUT_KLANES: lm_act_klanes(a, klanes_tag(w)); break;
    }
}

/*
 * x rounded to w's vec_dot_type, token by token, and laid out in groups of
 * 16 when grouped.  One token is rounded by every thread into a slot of
 * its own (acts_for): no thread waits at a barrier while another rounds,
 * and a thread may round for the next matrix while the other still reads
 * its slot for this one (tinyllama generating: four barriers a layer).
 */
static void round_acts(const lm_tensor *w, const float *x, int n_tok, int grouped, int rest, mm_scratch *s)
{
    const int64_t k = w->ne[0];
    const int in_groups = n_tok - rest; /* the last `rest` tokens go row by row (rest_by_row) */
    if (n_tok == 1) {
        round_token(w, x, 1, grouped, omp_get_thread_num(), s);
        return;
    }
#pragma omp for schedule(static) nowait
    for (int t = 0; t < n_tok; t++) {
        if (t < in_groups)
            round_token(w, x + (size_t)t * k, n_tok, grouped, t, s);
        else
            round_token(w, x + (size_t)t * k, rest, 0, t, s);
    }
    lm_barrier_wait(&s->bar);
    if (grouped) {
        const int atype = lm_act_type(w->type);
#pragma omp for schedule(static) nowait
        for (int g = 0; g < (in_groups + 15) / 16; g++)
            lm_tgroup_build(&s->groups[g], atype, s->acts + 16 * g, in_groups - 16 * g < 16 ? in_groups - 16 * g : 16,
                            k, s->amx, s->isa, s->tg_mem + (size_t)g * lm_tgroup_bytes(k));
        lm_barrier_wait(&s->bar);
    }
}

/* The rounded activations of token 0 as this thread reads them (round_acts). */
static const act_row *acts_for(const mm_scratch *s, int n_tok)
{
    return n_tok == 1 ? &s->acts[omp_get_thread_num()] : s->acts;
}

/* w times the rounded activations, by the threads of the enclosing region (outputs only). */
static void matmul_rows(float *out, const lm_tensor *w, int n_tok, int grouped, int rest, mm_scratch *s)
{
    /* token blocks keep their activations in L2 while every row passes; the
       grouped kernels decode a row once a block, so their blocks are longer */
    const int tiles = grouped && s->amx;
    const int mins_b32 = w->type == LM_Q4_1 || w->type == LM_Q5_1; /* (no AVX-512 kernel: AVX2's there too) */
    const int eights = (s->isa == LM_ISA_AVX2 || (mins_b32 && s->isa >= LM_ISA_AVX512)) && n_tok > 1 &&
                       lm_rows8_type(w->type) && (!in_lanes(w) || lanes_native(w, s));
    int block = grouped ? GROUPED_BLOCK : TOKEN_BLOCK;
    while (grouped && !tiles && block > 64 && (size_t)block * lm_tgroup_bytes(w->ne[0]) / 16 > GROUPS_L2)
        block /= 2; /* each four rows stream the block's groups: from L2, not L3 */
    const act_row *acts = acts_for(s, n_tok);
    int64_t r0 = n_tok == 1 ? rows16_times_token(out, w, acts, s) : 0;
    const int in_groups = n_tok - rest;
    for (int t0 = 0; t0 < in_groups; t0 += block) {
        int nb = in_groups - t0 < block ? in_groups - t0 : block;
        int64_t first = tiles     ? rows16_times_groups(out, w, t0, nb, s)
                        : grouped ? rows16_times_groups_vnni(out, w, t0, nb, s)
                        : eights  ? rows8_times_tokens(out, w, t0, nb, acts, s)
                                  : r0;
        rows_times_tokens(out, w, first, t0, nb, acts, s);
    }
    if (rest) /* (their own activations' layout: round_acts) */
        rows_times_tokens(out, w, 0, in_groups, rest, acts, s);
}

/*
 * Several tokens through a quantized matrix go 16 at a time (qgemm.c).
 * Fewer go row by row, where the kernels of a few tokens beat a group's
 * 16 lanes with lanes to spare: from 10 tokens on; with the blocks of
 * Q4_0, Q5_0 and Q8_0 rows in lanes (qrow_vbmi.c; as the file has them or
 * rearranged, repack.c) from 28.  Prompts of 14 tokens:
 * tinyllama Q8_0 180 -> 240 t/s, smollm2 Q8_0 785 -> 1367, its Q4_K_M
 * (Q5_0 rows) 892 -> 1103, tinyllama Q4_0 210 -> 258.  Of 20 tokens, with
 * groups from 28 instead of 16-20: tinyllama Q4_0 136-142 -> 164-183
 * (rearranged 141-148 -> 192-202), qwen2.5-0.5b Q4_0 236-337 -> 370-382,
 * smollm2 Q8_0 614-653 -> 778-812, tinyllama Q8_0 105-117 -> 117; of 24
 * level to 1.2x, tinyllama Q8_0 4% slower.  Q5_0 rows went in groups
 * from 16 until the few-token kernels asked for their rows ahead
 * (062961e); then, Zen 5, a message of 16-40 tokens decoded at 38 cached
 * (`kv_eval`, the mean of 1-5 rounds with both cores whole, grouped
 * against row by row): smollm2 Q4_K_M (Q5_0 rows of 576) 16 tokens 19.9
 * -> 16.0 ms, 20 24.2 -> 20.1, 24 24.6 -> 22.2, 25-27 level, 32 25.6 ->
 * 27.8; qwen2.5-0.5b Q4_K_M (896) 16 51.7 -> 36.3, 24 64.1 -> 49.9, 27
 * 65.1 -> 55.7, 40 level; tinyllama-1.1b Q5_0 (2048) 16 115 -> 83, 24
 * 137 -> 118, 25 141 -> 132, 28 136 -> 134, 32 138 -> 153.  Q4_K, Q5_K
 * and Q6_K rows (qrow_k.c's kernels) from 14:
 * tinyllama Q4_K_M prompts of 10-13 tokens 75-98 -> 115-122 t/s, smollm2's
 * and qwen2.5-0.5b's level, 14 and up level.  Against AMX tiles the
 * crossing was not measured, so there groups start at 10 as before.
 * Short Q4_0 and Q8_0 rows (under 1024 columns) go row by row up to 31:
 * smollm2 Q8_0 (576) pp28 939 -> 1024, pp30 1004 -> 1049 (medians of four
 * alternations), qwen2.5-0.5b Q4_0 (896) level.  Rearranged Q4_K and Q6_K
 * rows (qrow_klanes.c) go row by row up to 23: tinyllama Q4_K_M pp16
 * 113-137 -> 137-138, pp20 106-121 -> 134-135, pp23 122-138 -> 136-139
 * (pp24 level, pp26 141 against 156 grouped).  With AMX, the tiles take
 * groups from 10 tokens (that crossing not measured), from 13 through
 * Q4_K and Q6_K rows in their layout (Xeon with AMX, 3 KiB ahead, two
 * rounds: tinyllama Q4_K_M pp10 111-123 -> 152-168 t/s, pp12 135-145 ->
 * 155-170; pp13 level, pp20 and pp23 faster in the tiles).
 */
/* Rows qrow_k.c's kernels take (and qrow_klanes.c's, rearranged). */
static int k_quant(const lm_tensor *w)
{
    return w->type == LM_Q4_K || w->type == LM_Q5_K || w->type == LM_Q6_K;
}

static int is_grouped(const lm_tensor *w, int n_tok, const mm_scratch *s)
{
    const int atype = lm_act_type(w->type);
    const int klanes = klanes_tag(w) && lanes_native(w, s);
    const int from = s->amx ? (klanes ? 13 : 10)
                     : lanes_type(w, s) ? (w->ne[0] < 1024 && w->type != LM_Q5_0 ? 32 : 28)
                     : klanes ? 24
                     : k_quant(w) ? 14 : 10;
    return s->isa >= LM_ISA_AVX512 && (atype == LM_Q8_K || atype == LM_Q8_0) && n_tok >= from;
}

/*
 * Of n_tok tokens going in groups of 16, how many past the last whole group
 * go row by row instead: a group costs its 16 lanes whatever it holds, and
 * the few-token kernels give the same bytes (qwen2.5-1.5b Q4_K_M, Zen 5:
 * 16 tokens in 140 ms, 17 in 206, 32 in 209, 33 in 282, one token through
 * every row 24 ms).  So, alternated twice: qwen2.5-1.5b pp17 79-92 ->
 * 102-115 t/s, pp33 114-132 -> 140-158; tinyllama Q4_K_M pp33 156-159 ->
 * 192-196; with Q4_0, Q5_0 and Q8_0 rows too, tinyllama Q4_0 pp33-36
 * 16-20% faster, smollm2 and qwen2.5-0.5b Q4_K_M (Q5_0 rows) pp33-34
 * 8-27%, tinyllama Q8_0 pp33 5%.  Up to 6 rather than 4: qwen2.5-1.5b
 * pp21 103 -> 117, pp22 106-109 -> 119-120, tinyllama Q4_K_M pp37 185 ->
 * 201; at 8 left over (pp24, pp40) level or a few % slower.
 */
#define REST_BY_ROW 6
static int rest_by_row(const lm_tensor *w, int n_tok, int grouped, const mm_scratch *s)
{
    const int few_fast = k_quant(w) || w->type == LM_Q4_0 || w->type == LM_Q5_0 ||
                         w->type == LM_Q8_0; /* kernels of a few tokens (qrow_*.c) */
    const int rest = n_tok % 16;
    return grouped && !s->amx && few_fast && n_tok > 16 && rest <= REST_BY_ROW ? rest : 0;
}

/*
 * ws[0..nw) times the same x into outs[0..nw), by the threads of the
 * enclosing region: the activations are rounded again only when a matrix
 * needs other ones, and only then do the threads wait for each other
 * between matrices (the kernels' loops end without a barrier).
 */
static void matmul_many(float *const *outs, const lm_tensor *const *ws, int nw, const float *x,
                        int n_tok, mm_scratch *s)
{
    int was_grouped = 0, was_rest = 0; /* how the activations were last rounded */
    for (int j = 0; j < nw; j++) {
        const int grouped = is_grouped(ws[j], n_tok, s), rest = rest_by_row(ws[j], n_tok, grouped, s);
        /* two matrices whose activations fit can still take them in groups, or row by row, differently
           (a Q2_K file's Q4_K attn_v after its Q2_K attn_k): then they are rounded again */
        if (j == 0 || !acts_fit(ws[j - 1], ws[j]) || grouped != was_grouped || rest != was_rest ||
            act_layout(ws[j - 1], n_tok, grouped, s) != act_layout(ws[j], n_tok, grouped, s)) {
            if (j > 0 && n_tok > 1) /* the last matrix's kernels may still read the activations */
                lm_barrier_wait(&s->bar);
            round_acts(ws[j], x, n_tok, grouped, rest, s);
            was_grouped = grouped, was_rest = rest;
        }
        matmul_rows(outs[j], ws[j], n_tok, grouped, rest, s);
    }
}

/*
 * Inside a parallel region (lm_decode's), every thread of it must call
 * this, and the outputs are complete when it returns; outside, it opens a
 * region of its own.  A region of one thread counts as inside: opening
 * another in it, every matrix of a one-thread pass paid a fork and a join
 * (`-t 1`, Zen 5: smollm2 Q4_K_M generating 190-195 -> 213 t/s).
 */
void lm_matmul_many(float *const *outs, const lm_tensor *const *ws, int nw, const float *x,
                    int n_tok, mm_scratch *s)
{
    if (omp_get_level() > 0) {
        matmul_many(outs, ws, nw, x, n_tok, s);
        lm_barrier_wait(&s->bar);
        return;
    }
    const int nt = nw == 1 && ws[0]->ne[1] < 64 ? 1 : s->n_threads;
#pragma omp parallel num_threads(nt)
    matmul_many(outs, ws, nw, x, n_tok, s);
}

void lm_matmul(float *out, const lm_tensor *w, const float *x, int n_tok, mm_scratch *s)
{
    lm_matmul_many(&out, &w, 1, x, n_tok, s);
}
