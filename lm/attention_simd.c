/*
 * lm/attention_simd.c - the AVX-512 form of attention.c's attention,
 * chosen at run time (softmax's exponentials: pointwise_simd.c).  The queries that share a KV head go over
 * its cache a block of keys at a time, so the block is read from memory
 * once for all of them.  Each query still gets exactly what the portable
 * per-query code computes (same exp polynomial, same addition trees, keys
 * in the same order into each sum), so a logit never depends on the path
 * or on the other queries; tests compare them bit for bit.
 */
#include "internal.h"
#include "simd.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)

/*
 * The next block of a head's cache is asked for while the group works on
 * this one, a few lines at each step of the inner loops, spread over every
 * query's pass: a group of queries puts hundreds of multiply-adds between
 * two new lines, so the out-of-order window holds few misses at a time and
 * the hardware prefetcher does not get far enough ahead.  Asked for in a
 * burst (or with every load, which the group's first pass over a block
 * issues all of), the requests fill the miss buffers and stall the
 * arithmetic behind them.  Into L2 (prefetcht1), not L1: such a request
 * does not hold one of L1's few miss buffers while it waits on memory (a
 * 6-token message at 716 cached tokens, smollm2 Q4_K_M, over the same one
 * at 38: 1.18-1.24 against 1.24-1.29 in five alternations).  Prefetches
 * never fault, so asking past the last key is fine.
 */
typedef struct pf_cursor {
    const char *base;
    size_t line, end; /* the next line to ask for and the last + 1, counted from base */
    int per;          /* lines a step */
    int shift;        /* a row's lines: 1 << shift, row r's from base + r * stride */
    size_t stride;
} pf_cursor;

static inline void pf_step(pf_cursor *c)
{
    const size_t mask = ((size_t)1 << c->shift) - 1;
    for (int i = 0; i < c->per && c->line < c->end; i++, c->line++)
        __builtin_prefetch(c->base + (c->line >> c->shift) * c->stride + ((c->line & mask) << 6), 0, 2);
}

/* A cursor over bytes [from, to) of base, spread over steps inner-loop steps. */
static inline pf_cursor pf_span(const void *base, size_t from, size_t to, int steps)
{
    const size_t lines = (to - from + 63) / 64;
    pf_cursor c = {(const char *)base + from, 0, lines, (int)((lines + (size_t)steps - 1) / (size_t)steps), 0, 64};
    return c;
}

/*
 * A cursor over the first `bytes` of rows [r0, r1) of stride bytes from
 * base (a head's values cut by vectors: a part's own lines only).
 */
static inline pf_cursor pf_rows(const void *base, size_t stride, size_t bytes, int r0, int r1, int steps)
{
    int shift = 0;
    while (((size_t)64 << shift) < bytes)
        shift++;
    const size_t lines = (size_t)(r1 > r0 ? r1 - r0 : 0) << shift;
    pf_cursor c = {(const char *)base + (size_t)r0 * stride, 0, lines,
                   (int)((lines + (size_t)steps - 1) / (size_t)steps), shift, stride};
    return c;
}

/* 16 cache values as f32: from an f32 row, or converted (exactly) from an f16 one. */
AVX512 static inline __m512 kv16(const void *base, size_t off, int f16)
{
    const char *at = (const char *)base + off * (f16 ? 2 : 4);
    if (f16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)at));
    return _mm512_loadu_ps((const float *)at);
}

/*
 * The kernels below take the head sizes in 16-float vectors (nq for keys,
 * nv for values) as arguments that are constants where they are inlined:
 * then the accumulators live in registers, not on the stack.
 */
#define INLINE_AVX512 AVX512 static INLINE

/*
 * Scores of queries qs[0..na) (na <= 4) against the nt (1, 2 or 4) K tiles
 * at t (16 keys each: see lm_kv), both constants where inlined: acc[4i + u]
 * holds query i's 16 scores of tile u, each the sum of q[d] * k[d] in d
 * order, one fused multiply-add a component from zero, as attention.c's
 * scores_one.  Sixteen sums in flight keep both multiply-add units busy
 * through each one's latency.
 */
INLINE_AVX512 void tile_scores(const lm_attq *qs, int na, int nt, const void *t, int nq, int f16,
                               pf_cursor *pf, __m512 acc[16])
{
    const int hd = 16 * nq;
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        acc[i] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int d = 0; d < hd; d++) {
        __m512 k[4];
#pragma GCC unroll 4
        for (int u = 0; u < nt; u++)
            k[u] = kv16(t, 16 * (size_t)(u * hd + d), f16);
        pf_step(pf);
#pragma GCC unroll 4
        for (int i = 0; i < na; i++) {
            __m512 qd = _mm512_set1_ps(qs[i].q[d]);
#pragma GCC unroll 4
            for (int u = 0; u < nt; u++)
                acc[4 * i + u] = _mm512_fmadd_ps(qd, k[u], acc[4 * i + u]);
        }
    }
}

/* The lanes of a tile whose keys lie in [lo, hi], given relative to the tile's first key. */
static inline __mmask16 lane_range(int lo, int hi)
{
    if (hi < 0 || lo > 15)
        return 0;
    lo = lo < 0 ? 0 : lo;
    hi = hi > 15 ? 15 : hi;
    return (__mmask16)(((1u << (hi + 1)) - 1) & ~((1u << lo) - 1));
}

/*
 * Scores of the nt tiles from key p into the rows of the na queries that
 * see them; their running maxima in mx (na, nt constants where inlined).
 * Most tiles lie inside every query's range (all of [inner_lo, inner_hi]):
 * they skip the lane masks.
 */
INLINE_AVX512 void tiles_to_rows(const lm_attq *qs, int na, int p, int nt, const __m512 acc[16],
                                 float scale, int inner_lo, int inner_hi, float *scores,
                                 size_t sstride, __m512 mx[4])
{
    const int whole = p >= inner_lo && p + 16 * nt - 1 <= inner_hi;
#pragma GCC unroll 4
    for (int i = 0; i < na; i++)
#pragma GCC unroll 4
        for (int u = 0; u < nt; u++) {
            const int j0 = p + 16 * u;
            /* the maximum is the same in any order: max_ps(s, m) keeps m
               when s is NaN, as the scalar "s > mx" does, and the sign of a
               zero maximum does not change exp(s - mx) */
            __m512 sc = _mm512_mul_ps(acc[4 * i + u], _mm512_set1_ps(scale));
            if (whole) {
                _mm512_storeu_ps(scores + (size_t)i * sstride + j0, sc);
                mx[i] = _mm512_max_ps(sc, mx[i]);
                continue;
            }
            const __mmask16 m = lane_range(qs[i].lo - j0, qs[i].pos - j0);
            _mm512_mask_storeu_ps(scores + (size_t)i * sstride + j0, m, sc);
            mx[i] = _mm512_mask_max_ps(mx[i], m, sc, mx[i]);
        }
}

/* Scores and maxima of nt tiles from key p for na queries (both constants). */
INLINE_AVX512 void tiles_step(const lm_attq *qs, int na, int nt, int p, const void *k0, int nq,
                              pf_cursor *pf, int f16, float scale, int inner_lo, int inner_hi, float *scores,
                              size_t sstride, __m512 mx[4])
{
    __m512 acc[16];
    tile_scores(qs, na, nt, (const char *)k0 + (size_t)p * 16 * nq * (f16 ? 2 : 4), nq, f16, pf, acc);
    tiles_to_rows(qs, na, p, nt, acc, scale, inner_lo, inner_hi, scores, sstride, mx);
}

/*
 * Out-of-line copies of the widest step (four queries, four tiles) for
 * head size 64, and 128 with an f16 cache.  Inlined into attend_group,
 * whose other values keep registers busy, the step had three of its four
 * key vectors stored to the stack and read back by every multiply-add
 * (GCC 12).  18 queries over 760 keys in L2 (smollm2's 6-token turn at
 * 722 cached tokens; Zen 5, one core, best of 2000): head size 64 f32
 * 26.2 -> 21.4 us, f16 28.8 -> 22.1; 128 f16 56 -> 42.  Head size 128
 * f32 (46.0 against 44.2 us, three alternations) and 256 f32 (91 against
 * 87; f16 level) ran slower out of line, so they stay inlined.
 */
#define TILES_COPY(name, NQ, F16)                                                                          \
    AVX512 static __attribute__((noinline)) void name(const lm_attq *qs, int p, const void *k0, pf_cursor *pf, \
                                                      float scale, int inner_lo, int inner_hi, float *scores,  \
                                                      size_t sstride, __m512 mx[4])                            \
    {                                                                                                      \
        tiles_step(qs, 4, 4, p, k0, NQ, pf, F16, scale, inner_lo, inner_hi, scores, sstride, mx);          \
    }
TILES_COPY(tiles_4x4_64_f32, 4, 0)
TILES_COPY(tiles_4x4_64_f16, 4, 1)
TILES_COPY(tiles_4x4_128_f16, 8, 1)
#undef TILES_COPY

/* Four queries' scores of four tiles from key p (nq and f16 constants where inlined). */
INLINE_AVX512 void tiles_4x4(const lm_attq *qs, int p, const void *k0, int nq, pf_cursor *pf, int f16,
                             float scale, int inner_lo, int inner_hi, float *scores, size_t sstride,
                             __m512 mx[4])
{
    if (nq == 4 && !f16)
        tiles_4x4_64_f32(qs, p, k0, pf, scale, inner_lo, inner_hi, scores, sstride, mx);
    else if (nq == 4)
        tiles_4x4_64_f16(qs, p, k0, pf, scale, inner_lo, inner_hi, scores, sstride, mx);
    else if (nq == 8 && f16)
        tiles_4x4_128_f16(qs, p, k0, pf, scale, inner_lo, inner_hi, scores, sstride, mx);
    else
        tiles_step(qs, 4, 4, p, k0, nq, pf, f16, scale, inner_lo, inner_hi, scores, sstride, mx);
}

/*
 * Scores of keys [b0, b1) (b0 a multiple of 32) for na queries (a
 * constant), four tiles at a time; running maxima in vmx.  A tile past the
 * last key is never read (nt stops at it): its pages may not have been
 * written yet, and reading one maps the zero page, which the key's store
 * then has to replace at the cost of a TLB shootdown.
 */
INLINE_AVX512 void quad_scores(const lm_attq *qs, int na, const void *k0, int b0, int b1, int nq,
                               pf_cursor *pf, float scale, int f16, float *scores, size_t sstride, __m512 *vmx)
{
    int lo, hi, inner_lo, inner_hi;
    lm_attq_span(qs, na, &lo, &hi);
    lm_attq_common(qs, na, &inner_lo, &inner_hi); /* keys every query sees */
    __m512 mx[4];
#pragma GCC unroll 4
    for (int i = 0; i < na; i++)
        mx[i] = vmx[i];
    const int end = hi + 1 < b1 ? hi + 1 : b1;
    for (int p = (lo > b0 ? lo : b0) & ~31; p < end;) {
        const int left = (end - p + 15) / 16;
        if (left >= 4 && na == 4) {
            tiles_4x4(qs, p, k0, nq, pf, f16, scale, inner_lo, inner_hi, scores, sstride, mx);
            p += 64;
        } else if (left >= 4) {
            tiles_step(qs, na, 4, p, k0, nq, pf, f16, scale, inner_lo, inner_hi, scores, sstride, mx);
            p += 64;
        } else if (left >= 2) {
            tiles_step(qs, na, 2, p, k0, nq, pf, f16, scale, inner_lo, inner_hi, scores, sstride, mx);
            p += 32;
        } else {
            tiles_step(qs, na, 1, p, k0, nq, pf, f16, scale, inner_lo, inner_hi, scores, sstride, mx);
            p += 16;
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < na; i++)
        vmx[i] = mx[i];
}

/* Scores of keys [b0, b1) for each query that sees them, four queries at a time. */
INLINE_AVX512 void group_scores(const lm_attq *qs, int n, const void *k0, int b0, int b1, int nq,
                                pf_cursor *pf, float scale, int f16, float *scores, size_t sstride, __m512 *vmx)
{
    for (int a = 0; a < n; a += 4) {
        const lm_attq *qa = qs + a;
        float *sa = scores + (size_t)a * sstride;
        if (n - a >= 4)
            quad_scores(qa, 4, k0, b0, b1, nq, pf, scale, f16, sa, sstride, vmx + a);
        else if (n - a == 3)
            quad_scores(qa, 3, k0, b0, b1, nq, pf, scale, f16, sa, sstride, vmx + a);
        else if (n - a == 2)
            quad_scores(qa, 2, k0, b0, b1, nq, pf, scale, f16, sa, sstride, vmx + a);
        else
            quad_scores(qa, 1, k0, b0, b1, nq, pf, scale, f16, sa, sstride, vmx + a);
    }
}

/*
 * Keys per block: one block of a head's K tiles (then of its V rows) stays
 * in L1 while every query of the group goes over it.  Read once per query
 * from L2 instead, the cache was the bottleneck: 512 bytes a key at L2 speed.
 */
static int block_keys(int hd, int f16)
{
    int kb = (16384 / (hd * (f16 ? 2 : 4))) & ~31;
    return kb < 32 ? 32 : kb;
}

/* Softmax of one query's scores, left in place as exp(s - mx); returns 1 / their sum. */
AVX512 static float softmax_weights(float *sc, int lo, int pos, float cap, __m512 vmx)
{
    /* soft-capped scores take their maximum after the cap */
    const float mx = cap > 0 ? lm_softcap_max_avx512(sc, lo, pos, cap) : _mm512_reduce_max_ps(vmx);
    return lm_softmax_exp_avx512(sc, lo, pos, mx);
}

/*
 * Weighted values of keys j..end (in order) into the sums s[0..g) of g
 * queries (g and nv constants where inlined), each value vector loaded
 * once for all of them; w[i] is query i's weights.
 */
/* (v[u] and values_group's s[i][u] are only used for u < nv, which GCC
   cannot see when nv is not a constant; zeroing all 16 cost 4% in L2) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
INLINE_AVX512 void values_run(const void *v0, size_t vstride, int j, int end, int nv, int f16,
                              int g, const float *const w[4], pf_cursor *pf, __m512 s[4][16])
{
    for (; j <= end; j++) {
        pf_step(pf);
        __m512 v[16];
#pragma GCC unroll 16
        for (int u = 0; u < nv; u++) {
            v[u] = kv16(v0, (size_t)j * vstride + 16 * (size_t)u, f16);
            if (g > 1) /* one load for the g queries: GCC would fold it into each fma */
                OPAQUE512(v[u]);
        }
#pragma GCC unroll 4
        for (int i = 0; i < g; i++) {
            __m512 x = _mm512_set1_ps(w[i][j]);
#pragma GCC unroll 16
            for (int u = 0; u < nv; u++)
                s[i][u] = _mm512_fmadd_ps(x, v[u], s[i][u]);
        }
    }
}

/* A query's keys within [b0, b1): j..*end, empty when j > *end. */
static inline int block_range(const lm_attq *qa, int b0, int b1, int *end)
{
    *end = b1 - 1 < qa->pos ? b1 - 1 : qa->pos;
    return b0 > qa->lo ? b0 : qa->lo;
}

/*
 * Weighted values of keys [b0, b1) into the sums (acc) of the g queries
 * qs[0..g), g a constant: first each one's keys before their common run,
 * then the common run with each value loaded once, then each one's keys
 * after it.  Every sum still takes its keys in order.
 */
INLINE_AVX512 void values_group(const lm_attq *qs, int g, const void *v0, size_t vstride, int b0,
                                int b1, int nv, int f16, const float *w, size_t sstride,
                                pf_cursor *pf, float *acc)
{
    int j[4], e[4], from = b0, to = b1 - 1;
    const float *wi[4];
    __m512 s[4][16];
    for (int i = 0; i < g; i++) {
        j[i] = block_range(&qs[i], b0, b1, &e[i]);
        from = j[i] > from ? j[i] : from;
        to = e[i] < to ? e[i] : to;
        wi[i] = w + (size_t)i * sstride;
#pragma GCC unroll 16
        for (int u = 0; u < nv; u++)
            s[i][u] = _mm512_loadu_ps(acc + (size_t)i * LM_ATT_ACC + 16 * u);
    }
    if (from > to) { /* no common run: one query at a time */
        for (int i = 0; i < g; i++)
            values_run(v0, vstride, j[i], e[i], nv, f16, 1, wi + i, pf, s + i);
    } else {
        for (int i = 0; i < g; i++)
            values_run(v0, vstride, j[i], from - 1, nv, f16, 1, wi + i, pf, s + i);
        values_run(v0, vstride, from, to, nv, f16, g, wi, pf, s);
        for (int i = 0; i < g; i++)
            values_run(v0, vstride, to + 1, e[i], nv, f16, 1, wi + i, pf, s + i);
    }
    for (int i = 0; i < g; i++)
#pragma GCC unroll 16
        for (int u = 0; u < nv; u++)
            _mm512_storeu_ps(acc + (size_t)i * LM_ATT_ACC + 16 * u, s[i][u]);
}
#pragma GCC diagnostic pop

/* Queries whose value sums fit in registers together: 4 for head size 64, 2 for 128. */
static inline int values_at_once(int nv)
{
    return nv <= 4 ? 4 : nv <= 8 ? 2 : 1;
}

/*
 * Weighted values of keys [b0, b1) into each query's sums (acc): as many
 * queries at a time as values_at_once, sharing each value load.
 */
INLINE_AVX512 void group_values(const lm_attq *qs, int n, const void *v0, size_t vstride, int b0,
                                int b1, int nv, int f16, const float *w, size_t sstride,
                                pf_cursor *pf, float *acc)
{
    const int most = values_at_once(nv);
    for (int a = 0; a < n;) {
        const int g = n - a < most ? n - a : most;
        const float *wa = w + (size_t)a * sstride;
        float *acc_a = acc + (size_t)a * LM_ATT_ACC;
        if (g == 4)
            values_group(qs + a, 4, v0, vstride, b0, b1, nv, f16, wa, sstride, pf, acc_a);
        else if (g == 3)
            values_group(qs + a, 3, v0, vstride, b0, b1, nv, f16, wa, sstride, pf, acc_a);
        else if (g == 2)
            values_group(qs + a, 2, v0, vstride, b0, b1, nv, f16, wa, sstride, pf, acc_a);
        else
            values_group(qs + a, 1, v0, vstride, b0, b1, nv, f16, wa, sstride, pf, acc_a);
        a += g;
    }
}

/*
 * Scores of the queries' keys within [from, to) (from a multiple of 32), a
 * block of kb keys at a time, into their rows; running maxima in vmx.  The
 * last block asks for the first V block (keys first.. v_end) instead of a
 * next K block.
 */
INLINE_AVX512 void scores_span(const lm_attq *qs, int n, const void *k0, const void *v0, int from, int to,
                               int first, int v_end, int kb, int nq, int nv, float scale, float *scores,
                               size_t sstride, __m512 *vmx, int f16)
{
    const size_t es = f16 ? 2 : 4, kbytes = 16 * (size_t)nq * es, vbytes = 16 * (size_t)nv * es;
    /* inner-loop steps a block: a component of four tiles for each four queries */
    const int score_steps = (n + 3) / 4 * ((kb + 63) / 64) * 16 * nq;
    for (int b = from; b < to; b += kb) {
        const int next = b + kb < to ? b + kb : to, after = next + kb < to ? next + kb : to;
        pf_cursor pf = next < to ? pf_span(k0, (size_t)next * kbytes, (size_t)after * kbytes, score_steps)
                                 : pf_span(v0, (size_t)first * vbytes, (size_t)v_end * vbytes, score_steps);
        group_scores(qs, n, k0, b, next, nq, &pf, scale, f16, scores, sstride, vmx);
    }
}

/*
 * Weighted values of keys first..hi (w: each query's weights, a row of
 * wstride) into acc, nv vectors a query from v0 (rows of vstride values),
 * a block of kb keys at a time.
 */
INLINE_AVX512 void values_span(const lm_attq *qs, int n, const void *v0, size_t vstride, int first, int hi,
                               int kb, int nv, const float *w, size_t wstride, float *acc, int f16)
{
    const size_t es = f16 ? 2 : 4, vbytes = vstride * es;
    /* inner-loop steps a block: a key for each group of values_at_once queries */
    const int value_steps = (n + values_at_once(nv) - 1) / values_at_once(nv) * kb;
    memset(acc, 0, (size_t)n * LM_ATT_ACC * sizeof *acc);
    for (int b = first; b <= hi; b += kb) {
        const int next = b + kb, after = next + kb < hi + 1 ? next + kb : hi + 1;
        pf_cursor pf = 16 * (size_t)nv == vstride /* whole rows, or a part's vectors of each */
                           ? pf_span(v0, (size_t)next * vbytes, (size_t)(next < after ? after : next) * vbytes,
                                     value_steps)
                           : pf_rows(v0, vbytes, 16 * (size_t)nv * es, next, after, value_steps);
        group_values(qs, n, v0, vstride, b, b + kb, nv, f16, w, wstride, &pf, acc);
    }
}

/* Each query's value sums times 1 / its sum of weights: output vectors u0.. u0 + nv. */
INLINE_AVX512 void values_out(const lm_attq *qs, int n, const float *acc, const float *inv, int u0, int nv)
{
    for (int a = 0; a < n; a++) {
        const float *sa = acc + (size_t)a * LM_ATT_ACC;
#pragma GCC unroll 16
        for (int u = 0; u < nv; u++)
            _mm512_storeu_ps(qs[a].out + 16 * (u0 + u),
                             _mm512_mul_ps(_mm512_loadu_ps(sa + 16 * u), _mm512_set1_ps(inv[a])));
    }
}

/* Keys per block, and the queries' first key rounded down to a pair of tiles and their last. */
static int span_of(const lm_attq *qs, int n, int nq, int nv, int f16, int *first, int *hi)
{
    int lo;
    lm_attq_span(qs, n, &lo, hi);
    *first = lo & ~31;
    return block_keys(16 * (nq > nv ? nq : nv), f16);
}

INLINE_AVX512 void attend_group(const lm_attq *qs, int n, const void *k0, const void *v0, int nq,
                                int nv, float scale, float cap, float *scores, size_t sstride,
                                float *acc, int f16)
{
    __m512 vmx[LM_ATT_QMAX];
    for (int a = 0; a < n; a++)
        vmx[a] = _mm512_set1_ps(-__builtin_inff());
    int first, hi, kb = span_of(qs, n, nq, nv, f16, &first, &hi);
    const int end = (hi + 16) & ~15; /* from a pair of tiles to a tile */
    const int v_end = first + kb < hi + 1 ? first + kb : hi + 1;
    scores_span(qs, n, k0, v0, first, end, first, v_end, kb, nq, nv, scale, scores, sstride, vmx, f16);
    float inv[LM_ATT_QMAX];
    for (int a = 0; a < n; a++) /* the sums of exp(s - mx) v, over the sum of exp(s - mx) */
        inv[a] = softmax_weights(scores + (size_t)a * sstride, qs[a].lo, qs[a].pos, cap, vmx[a]);
    values_span(qs, n, v0, 16 * (size_t)nv, first, hi, kb, nv, scores, sstride, acc, f16);
    values_out(qs, n, acc, inv, 0, nv);
}

/*
 * Out-of-line copies of the kernels, each with its sizes and cache type as
 * constants: one for each usual head size (other sizes go through
 * attend_any, below), so that no function holds them all.  Inlined into
 * one, they made 220 KB of code whose register liveness took GCC most of a
 * minute (the file 55-70 s at -O2, 81 s under the sanitizers, the longest
 * step of the build; 25 s at -O2 now).
 */
#define OUT_OF_LINE AVX512 static __attribute__((noinline))

#define ATTEND_COPY(name, NQ, NV, F16)                                                                       \
    OUT_OF_LINE void name(const lm_attq *qs, int n, const void *k0, const void *v0, int nq, int nv,          \
                          float scale, float cap, float *scores, size_t sstride, float *acc)                 \
    {                                                                                                        \
        (void)nq, (void)nv;                                                                                  \
        attend_group(qs, n, k0, v0, NQ, NV, scale, cap, scores, sstride, acc, F16);                          \
    }
ATTEND_COPY(attend_64_f32, 4, 4, 0)
ATTEND_COPY(attend_64_f16, 4, 4, 1)
ATTEND_COPY(attend_128_f32, 8, 8, 0)
ATTEND_COPY(attend_128_f16, 8, 8, 1)
ATTEND_COPY(attend_256_f32, 16, 16, 0)
ATTEND_COPY(attend_256_f16, 16, 16, 1)

typedef void attend_fn(const lm_attq *qs, int n, const void *k0, const void *v0, int nq, int nv, float scale,
                       float cap, float *scores, size_t sstride, float *acc);

/*
 * A head split among threads (lm_attend_split in attention.c): the steps of
 * attend_group in two phases, each query's bytes unchanged.  Scores do not
 * depend on each other, so the keys are cut in parts (of whole groups of
 * 64, from the queries' first pair of tiles); a part's lane maxima go to
 * vmx, and a maximum is the same whichever parts it is taken over.  Each
 * output vector sums its keys in order by itself, so the values are cut by
 * vectors; every values part takes the softmax of the whole rows again, on
 * a copy (w), the same operations on the same scores.
 */
static void part_range(int from, int to, int step, int part, int parts, int *a, int *b)
{
    const int per = ((to - from + parts - 1) / parts + step - 1) / step * step;
    *a = from + per * part < to ? from + per * part : to;
    *b = *a + per < to ? *a + per : to;
}

/* The two phases' copies: scores for head sizes 64, 128 or any; values for 1, 2, 4 or any vectors. */
#define SCORES_COPY(name, NQ)                                                                                \
    OUT_OF_LINE void name(const lm_attq *qs, int n, const void *k0, int from, int to, int kb, int nq, int nv, \
                          float scale, float *scores, size_t sstride, __m512 *mx, int f16)                   \
    {                                                                                                        \
        (void)nq;                                                                                            \
        scores_span(qs, n, k0, k0, from, to, 0, 0, kb, NQ, nv, scale, scores, sstride, mx, f16);             \
    }
SCORES_COPY(scores_64, 4)
SCORES_COPY(scores_128, 8)
SCORES_COPY(scores_any, nq)

#define VALUES_COPY(name, M)                                                                                 \
    OUT_OF_LINE void name(const lm_attq *qs, int n, const void *vu, size_t vstride, int first, int hi, int kb, \
                          int m, const float *w, size_t wstride, float *acc, int f16)                        \
    {                                                                                                        \
        (void)m;                                                                                             \
        values_span(qs, n, vu, vstride, first, hi, kb, M, w, wstride, acc, f16);                             \
    }
VALUES_COPY(values_1, 1)
VALUES_COPY(values_2, 2)
VALUES_COPY(values_4, 4)

/*
 * Weighted values of output vectors [u0, u1) of heads nv vectors wide, then
 * their outputs (inv: each query's 1 / sum of weights): slices of 4, 2 and
 * 1 vectors, each through its own copy.  Any head size is served by the
 * three, bytes unchanged, since each vector sums its keys by itself; a
 * copy with the width unknown (as the scores' is) took GCC 30 s to build,
 * more than the rest of the file.
 */
AVX512 static void values_slices(const lm_attq *qs, int n, const void *v0, int nv, int u0, int u1, int first,
                                 int hi, int kb, const float *w, size_t wstride, float *acc, const float *inv,
                                 int f16)
{
    const size_t vstride = 16 * (size_t)nv;
    for (int u = u0; u < u1;) {
        const int m = u1 - u >= 4 ? 4 : u1 - u >= 2 ? 2 : 1;
        const void *vu = (const char *)v0 + 16 * (size_t)u * (f16 ? 2 : 4);
        if (m == 4)
            values_4(qs, n, vu, vstride, first, hi, kb, m, w, wstride, acc, f16);
        else if (m == 2)
            values_2(qs, n, vu, vstride, first, hi, kb, m, w, wstride, acc, f16);
        else
            values_1(qs, n, vu, vstride, first, hi, kb, m, w, wstride, acc, f16);
        values_out(qs, n, acc, inv, u, m);
        u += m;
    }
}

/* attend_group for head sizes without a copy of their own: scores_any, then the values in slices. */
AVX512 static void attend_any(const lm_attq *qs, int n, const void *k0, const void *v0, int nq, int nv,
                              float scale, float cap, float *scores, size_t sstride, float *acc, int f16)
{
    __m512 vmx[LM_ATT_QMAX];
    for (int a = 0; a < n; a++)
        vmx[a] = _mm512_set1_ps(-__builtin_inff());
    int first, hi, kb = span_of(qs, n, nq, nv, f16, &first, &hi);
    scores_any(qs, n, k0, first, (hi + 16) & ~15, kb, nq, nv, scale, scores, sstride, vmx, f16);
    float inv[LM_ATT_QMAX];
    for (int a = 0; a < n; a++)
        inv[a] = softmax_weights(scores + (size_t)a * sstride, qs[a].lo, qs[a].pos, cap, vmx[a]);
    values_slices(qs, n, v0, nv, 0, nv, first, hi, kb, scores, sstride, acc, inv, f16);
}

AVX512 int lm_attend_scores_avx512(const lm_attq *qs, int n, const void *k0, int hd, int hdv, float scale,
                                   int part, int parts, float *scores, size_t sstride, float *vmx, int f16)
{
    if (hd % 16 || hdv % 16 || hd > 256 || hdv > 256 || n < 1 || n > LM_ATT_QMAX)
        return 0;
    const int nq = hd / 16, nv = hdv / 16;
    int first, hi, from, to, kb = span_of(qs, n, nq, nv, f16, &first, &hi);
    part_range(first, (hi + 16) & ~15, 64, part, parts, &from, &to);
    __m512 mx[LM_ATT_QMAX];
    for (int a = 0; a < n; a++)
        mx[a] = _mm512_set1_ps(-__builtin_inff());
    if (nq == 4)
        scores_64(qs, n, k0, from, to, kb, nq, nv, scale, scores, sstride, mx, f16);
    else if (nq == 8)
        scores_128(qs, n, k0, from, to, kb, nq, nv, scale, scores, sstride, mx, f16);
    else
        scores_any(qs, n, k0, from, to, kb, nq, nv, scale, scores, sstride, mx, f16);
    for (int a = 0; a < n; a++)
        _mm512_storeu_ps(vmx + 16 * a, mx[a]);
    return 1;
}

/* vmx: every scores part's maxima ([parts][n][16]); w, acc: a thread's own rows. */
AVX512 int lm_attend_values_avx512(const lm_attq *qs, int n, const void *v0, int hd, int hdv, float cap,
                                   int part, int parts, const float *scores, size_t sstride, const float *vmx,
                                   float *w, size_t wstride, float *acc, int f16)
{
    if (hd % 16 || hdv % 16 || hd > 256 || hdv > 256 || n < 1 || n > LM_ATT_QMAX)
        return 0;
    const int nq = hd / 16, nv = hdv / 16;
    int first, hi, u0, u1, kb = span_of(qs, n, nq, nv, f16, &first, &hi);
    part_range(0, nv, 1, part, parts, &u0, &u1);
    if (u0 == u1)
        return 1;
    float inv[LM_ATT_QMAX];
    for (int a = 0; a < n; a++) {
        __m512 mx = _mm512_loadu_ps(vmx + 16 * a);
        for (int p = 1; p < parts; p++)
            mx = _mm512_max_ps(_mm512_loadu_ps(vmx + 16 * ((size_t)p * n + a)), mx);
        float *wa = w + (size_t)a * wstride;
        memcpy(wa + qs[a].lo, scores + (size_t)a * sstride + qs[a].lo,
               (size_t)(qs[a].pos - qs[a].lo + 1) * sizeof *wa);
        inv[a] = softmax_weights(wa, qs[a].lo, qs[a].pos, cap, mx);
    }
    values_slices(qs, n, v0, nv, u0, u1, first, hi, kb, w, wstride, acc, inv, f16);
    return 1;
}

/*
 * Up to LM_ATT_QMAX query heads sharing one KV head, against the cache
 * each sees (f32 or f16; k0 the head's K tiles, v0 its V rows, as lm_kv
 * lays them out).  Each query gets the bytes of the portable
 * lm_attend_group: the same per-key steps, the same addition orders; only
 * the order in which queries and keys are visited differs.  It is used for
 * every batch shape, so evaluation stays deterministic.  The usual head
 * sizes get their own unrolled copies.
 */
AVX512 int lm_attend_group_avx512(const lm_attq *qs, int n, const void *k0, const void *v0, int hd,
                                  int hdv, float scale, float cap, float *scores, size_t sstride,
                                  float *acc, int f16)
{
    if (hd % 16 || hdv % 16 || hd > 256 || hdv > 256 || n < 1 || n > LM_ATT_QMAX)
        return 0;
    attend_fn *const copies[3][2] = {
        {attend_64_f32, attend_64_f16},
        {attend_128_f32, attend_128_f16},
        {attend_256_f32, attend_256_f16},
    };
    const int size = hd != hdv ? -1 : hd == 64 ? 0 : hd == 128 ? 1 : hd == 256 ? 2 : -1;
    if (size < 0)
        attend_any(qs, n, k0, v0, hd / 16, hdv / 16, scale, cap, scores, sstride, acc, f16);
    else
        copies[size][f16 != 0](qs, n, k0, v0, hd / 16, hdv / 16, scale, cap, scores, sstride, acc);
    return 1;
}

#else
int lm_attend_scores_avx512(const lm_attq *qs, int n, const void *k0, int hd, int hdv, float scale,
                            int part, int parts, float *scores, size_t sstride, float *vmx, int f16)
{
    (void)qs, (void)n, (void)k0, (void)hd, (void)hdv, (void)scale, (void)part, (void)parts;
    (void)scores, (void)sstride, (void)vmx, (void)f16;
    return 0;
}

int lm_attend_values_avx512(const lm_attq *qs, int n, const void *v0, int hd, int hdv, float cap,
                            int part, int parts, const float *scores, size_t sstride, const float *vmx,
                            float *w, size_t wstride, float *acc, int f16)
{
    (void)qs, (void)n, (void)v0, (void)hd, (void)hdv, (void)cap, (void)part, (void)parts;
    (void)scores, (void)sstride, (void)vmx, (void)w, (void)wstride, (void)acc, (void)f16;
    return 0;
}

int lm_attend_group_avx512(const lm_attq *qs, int n, const void *k0, const void *v0, int hd,
                           int hdv, float scale, float cap, float *scores, size_t sstride,
                           float *acc, int f16)
{
    (void)qs, (void)n, (void)k0, (void)v0, (void)hd, (void)hdv;
    (void)scale, (void)cap, (void)scores, (void)sstride, (void)acc, (void)f16;
    return 0;
}
#endif
