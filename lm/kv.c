/*
 * lm/kv.c - the KV cache's memory: K and V of every layer and KV head laid
 * out [layer][kv head][position] (K in tiles of 16 positions, see
 * attention.c), mapped zeroed and page by page as it is first written,
 * populated (and the next message's pages touched) ahead of a prefill, and
 * unmapped.  What goes in it and how it
 * is read belong to forward.c, attend_pass.c and attention.c.
 */
#include "internal.h"

#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Bytes of the K (or V) cache, whose heads have dim elements a position. */
static size_t kv_bytes(const lm_kv *kv, int dim)
{
    return (size_t)kv->n_layer * (size_t)kv->n_head_kv * (size_t)kv->n_pos * (size_t)dim * lm_kv_elem_bytes(kv);
}

/*
 * Zeroed memory mapped page by page when first written, as calloc's, but
 * page aligned: calloc's large blocks begin 16 bytes into a page, so every
 * 64-byte row of keys or values would straddle two cache lines (each
 * vector load two accesses; attention over a cache in L2 3-8% slower).
 */
static void *zeroed_pages(size_t n)
{
    void *p = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

int lm_kv_init(lm_kv *kv, const lm_model *m, int n_ctx, int type, lm_err *e)
{
    const lm_hparams *hp = &m->hp;
    memset(kv, 0, sizeof *kv);
    kv->n_ctx = n_ctx;
    kv->n_pos = (n_ctx + 31) & ~31;
    kv->n_layer = hp->n_layer;
    kv->n_head_kv = hp->n_head_kv;
    kv->head_dim = hp->head_dim;
    kv->head_dim_v = hp->head_dim_v;
    kv->type = type;
    kv->k = zeroed_pages(kv_bytes(kv, kv->head_dim));
    kv->v = zeroed_pages(kv_bytes(kv, kv->head_dim_v));
    if (!kv->k || !kv->v) {
        lm_seterr(e, "out of memory for a KV cache of %d tokens", n_ctx);
        lm_kv_free(kv);
        return -1;
    }
    return 0;
}

/*
 * Pages of [p, p + n) mapped writable with their content kept, as the first
 * store to each would.  MADV_POPULATE_WRITE (Linux 5.14) does it without
 * touching the bytes; elsewhere each page gets one byte written back.
 */
static void populate(char *p, size_t n)
{
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    char *first = (char *)((uintptr_t)p & ~(uintptr_t)(pg - 1)), *end = p + n;
#ifdef MADV_POPULATE_WRITE
    if (madvise(first, (size_t)(end - first), MADV_POPULATE_WRITE) == 0)
        return;
#endif
    for (char *q = first; q < end; q += pg) {
        volatile char *b = q < p ? p : q; /* only the cache's own bytes */
        *b = *b;
    }
}

/*
 * A byte of each page of [p, p + n) read from user space.  A guest whose
 * page tables the hypervisor shadows (this project's VMs; `perf` shows
 * pvm_* functions) traps on a page's first touch from user space even
 * after the kernel has mapped it: a store then cost 5-7 us a page, against
 * 0.03 after such a read.  A 6-token message whose keys entered new 16-key
 * tiles stored into 180 such pages (smollm2: 30 layers x 3 heads, K and V),
 * and its first token came 1.5-2 ms later than its neighbours'.
 */
static void touch(char *p, size_t n)
{
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    const char *first = (const char *)((uintptr_t)p & ~(uintptr_t)(pg - 1)), *end = p + n;
    for (const char *q = first; q < end; q += pg)
        (void)*(const volatile char *)(q < p ? p : q); /* only the cache's own bytes */
}

/* Each head's K and V bytes of positions [from, to) (whole tiles, within n_pos), through fn. */
static void each_run(lm_kv *kv, int from, int to, void (*fn)(char *, size_t))
{
    const size_t es = lm_kv_elem_bytes(kv), heads = (size_t)kv->n_layer * (size_t)kv->n_head_kv;
    for (size_t h = 0; h < heads; h++) { /* [layer][kv head][position]: a run per head */
        size_t at = h * (size_t)kv->n_pos + (size_t)from, n = (size_t)(to - from);
        fn((char *)kv->k + at * (size_t)kv->head_dim * es, n * (size_t)kv->head_dim * es);
        fn((char *)kv->v + at * (size_t)kv->head_dim_v * es, n * (size_t)kv->head_dim_v * es);
    }
}

void lm_kv_populate(lm_kv *kv, int from, int to)
{
    from = from < 0 ? 0 : from & ~15; /* whole 16-key tiles */
    to = to > kv->n_pos ? kv->n_pos : (to + 15) & ~15;
    if (kv->k && from < to)
        each_run(kv, from, to, populate);
}

void lm_kv_touch(lm_kv *kv, int from, int to)
{
    from = from < kv->touched ? kv->touched : from & ~15;
    to = to > kv->n_pos ? kv->n_pos : (to + 15) & ~15;
    if (!kv->k || from >= to)
        return;
    each_run(kv, from, to, touch);
    kv->touched = to; /* (positions before from were stored to already) */
}

void lm_kv_free(lm_kv *kv)
{
    if (kv->k)
        munmap(kv->k, kv_bytes(kv, kv->head_dim));
    if (kv->v)
        munmap(kv->v, kv_bytes(kv, kv->head_dim_v));
    kv->k = kv->v = NULL;
}
