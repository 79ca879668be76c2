/*
 * lm/barrier.c - the barrier a forward pass's threads meet at between its
 * steps (lm_barrier_wait; internal.h says why not OpenMP's).
 *
 * Waiting threads spin on the phase, then sleep on it (a futex on Linux),
 * as libgomp's do; the last to arrive calls the kernel only when one
 * sleeps.  With no more threads than processors a wait is short and
 * spins; with more, a spinning thread would hold the core of the one it
 * waits for, so it sleeps almost at once (`-t 4` on two cores: smollm2
 * generating 75 t/s, 9.7 with spinning alone, 85 with libgomp's barrier).
 * The processors are counted once: omp_get_num_procs() asks the kernel
 * for the affinity mask every time, and asked at every wait it cost
 * smollm2 Q4_K_M 280-287 -> 307-315 t/s, qwen2.5-0.5b Q4_0 145-152 ->
 * 162-180 (Zen 5, two threads, alternated twice).
 */
#include "internal.h"

#include <limits.h>
#include <omp.h>
#include <sched.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define BARRIER_SPINS 65536
#define BARRIER_SPINS_CROWDED 64

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* Sleeps while *word is still `seen` (or yields the core, where there is no futex). */
static void sleep_on(atomic_uint *word, unsigned seen)
{
#ifdef __linux__
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
#else
    (void)word, (void)seen;
    sched_yield();
#endif
}

static void wake_all(atomic_uint *word)
{
#ifdef __linux__
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
    (void)word;
#endif
}

void lm_barrier_init(lm_barrier *b)
{
    atomic_init(&b->arrived, 0);
    atomic_init(&b->phase, 0);
    atomic_init(&b->sleepers, 0);
    b->procs = omp_get_num_procs();
}

void lm_barrier_wait(lm_barrier *b)
{
    const unsigned n = (unsigned)omp_get_num_threads();
    const unsigned phase = atomic_load_explicit(&b->phase, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&b->arrived, 1, memory_order_acq_rel) + 1 == n) {
        atomic_store_explicit(&b->arrived, 0, memory_order_relaxed); /* before the phase moves */
        atomic_store(&b->phase, phase + 1); /* then sleepers is read after it (seq_cst, as below) */
        if (atomic_load(&b->sleepers))
            wake_all(&b->phase);
        return;
    }
    const unsigned spins = (int)n <= b->procs ? BARRIER_SPINS : BARRIER_SPINS_CROWDED;
    for (unsigned i = 0; i < spins; i++) {
        if (atomic_load_explicit(&b->phase, memory_order_acquire) != phase)
            return;
        cpu_relax();
    }
    atomic_fetch_add(&b->sleepers, 1); /* before the phase is read again: the last one sees it or we see the phase */
    while (atomic_load(&b->phase) == phase)
        sleep_on(&b->phase, phase);
    atomic_fetch_sub(&b->sleepers, 1);
}
