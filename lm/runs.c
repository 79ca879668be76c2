/*
 * lm/runs.c - a matrix's runs of rows shared out among the threads of a
 * pass: each thread starts on a contiguous share of its own (1/T of the
 * runs, front to back, as the kernels' prefetches expect), and a thread
 * that runs out takes the back half of what another has left.
 *
 * Why not schedule(guided): it hands the first thread half the matrix in
 * one chunk, so when that thread's vCPU is the slower one (a busy host
 * neighbour; the bench's per-core clock probe often shows one core at
 * 60% of the other) the other finishes the rest and waits for it at the
 * barrier.  Here whatever is left in the slow thread's share is halved
 * again and again, so the two finish within about a run of each other,
 * while both still stream long stretches in order.
 *
 * Each thread's share lives in one 64-bit word on a cache line of its
 * own: a work-share number (gen), the next run its owner takes (front)
 * and one past the last run left (back).  The owner takes runs from the
 * front, thieves take the back half, both by compare-and-swap.  A thread
 * leaves a work share only when every share of it is empty, so a word
 * still at an older work share is empty: the first thread of the newer
 * one to need it (its owner or a thief) sets it up.  Stolen runs are done
 * by the thief itself and are never published: another thread that found
 * every share empty may already have moved on.
 */
#include "internal.h"

#include <omp.h>
#include <stdlib.h>

#define GEN_SHIFT 48
#define POS_BITS 24
#define POS_MASK ((1u << POS_BITS) - 1)

static uint64_t pack(unsigned gen, int64_t front, int64_t back)
{
    return (uint64_t)(gen & 0xffff) << GEN_SHIFT | (uint64_t)front << POS_BITS | (uint64_t)back;
}

static unsigned gen_of(uint64_t w) { return (unsigned)(w >> GEN_SHIFT); }
static int64_t front_of(uint64_t w) { return (int64_t)(w >> POS_BITS & POS_MASK); }
static int64_t back_of(uint64_t w) { return (int64_t)(w & POS_MASK); }

/* Whether work share a is older than b (16-bit numbers that wrap). */
static int older(unsigned a, unsigned b)
{
    return (int16_t)(uint16_t)(a - b) < 0;
}

int lm_runs_init(lm_runs *r, int n_threads)
{
    r->n_threads = n_threads;
    r->share = aligned_alloc(64, (size_t)n_threads * sizeof *r->share);
    if (!r->share)
        return -1;
    for (int i = 0; i < n_threads; i++) {
        atomic_init(&r->share[i].word, pack(0, 0, 0));
        r->share[i].seq = 0;
    }
    return 0;
}

void lm_runs_free(lm_runs *r)
{
    free(r->share);
    r->share = NULL;
}

/*
 * Thread t's share of work share gen as it is now: set up first if its
 * word is at an older one.  Returns 0 when the work share has moved past.
 */
static int share_now(lm_runs *r, int t, unsigned gen, int64_t n_runs, uint64_t *w)
{
    *w = atomic_load_explicit(&r->share[t].word, memory_order_acquire);
    while (gen_of(*w) != gen) { /* (gen: 16 bits, as lm_runs_begin keeps it) */
        if (!older(gen_of(*w), gen))
            return 0;
        const int T = r->n_threads;
        const uint64_t fresh = pack(gen, n_runs * t / T, n_runs * (t + 1) / T);
        if (atomic_compare_exchange_weak_explicit(&r->share[t].word, w, fresh, memory_order_acq_rel,
                                                  memory_order_acquire))
            *w = fresh;
    }
    return 1;
}

/*
 * A region of other than n_threads threads (a matrix too small to share, or
 * OpenMP granting fewer) splits the runs evenly and leaves the shares
 * alone: the threads outside it would not count the work share, and their
 * numbers would fall behind the others'.
 */
void lm_runs_begin(lm_runs *r, lm_runs_iter *it, int64_t n_runs)
{
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    if (n != r->n_threads) {
        it->r = NULL;
        it->next = n_runs * t / n;
        it->end = n_runs * (t + 1) / n;
        return;
    }
    it->r = r;
    it->tid = t;
    it->gen = ++r->share[t].seq & 0xffff;
    it->n_runs = n_runs;
    it->next = it->end = 0;
    uint64_t w;
    share_now(r, t, it->gen, n_runs, &w); /* (set up before any thief comes) */
}

/* The next run from the front of the thread's own share, or -1. */
static int64_t take_front(lm_runs_iter *it)
{
    lm_runs *r = it->r;
    uint64_t w;
    if (!share_now(r, it->tid, it->gen, it->n_runs, &w))
        return -1;
    while (front_of(w) < back_of(w)) {
        const uint64_t less = pack(it->gen, front_of(w) + 1, back_of(w));
        if (atomic_compare_exchange_weak_explicit(&r->share[it->tid].word, &w, less, memory_order_acq_rel,
                                                  memory_order_acquire))
            return front_of(w);
        if (gen_of(w) != it->gen)
            return -1;
    }
    return -1;
}

/* The back half of the fullest other share into it->next..end; 0 when every share is empty. */
static int steal(lm_runs_iter *it)
{
    lm_runs *r = it->r;
    for (;;) {
        int victim = -1;
        int64_t most = 0;
        uint64_t seen = 0;
        for (int t = 0; t < r->n_threads; t++) {
            uint64_t w;
            if (t == it->tid || !share_now(r, t, it->gen, it->n_runs, &w))
                continue;
            if (back_of(w) - front_of(w) > most)
                victim = t, most = back_of(w) - front_of(w), seen = w;
        }
        if (victim < 0)
            return 0;
        const int64_t f = front_of(seen), b = back_of(seen), mid = f + (b - f) / 2;
        if (atomic_compare_exchange_strong_explicit(&r->share[victim].word, &seen, pack(it->gen, f, mid),
                                                    memory_order_acq_rel, memory_order_acquire)) {
            it->next = mid;
            it->end = b;
            return 1;
        }
    }
}

int64_t lm_runs_next(lm_runs_iter *it)
{
    if (it->next < it->end)
        return it->next++;
    if (!it->r)
        return -1;
    const int64_t u = take_front(it);
    if (u >= 0)
        return u;
    return steal(it) ? it->next++ : -1;
}
