/*
 * lm/weights_copy.c - the weights moved from the file's mapping into 2 MiB
 * pages, in the background.
 *
 * Generating a token reads every weight once, and a file's page-cache
 * pages are 4 KiB: each page is a TLB miss and a point where the hardware
 * prefetcher stops.  The same matrices in 2 MiB pages stream faster from
 * memory (Zen 4, Q4_0, two threads: 31-34 GB/s against 28-32), so once a
 * model is open a thread copies its tensor data into anonymous memory
 * asked for in huge pages, and drops each mapped page it has copied, so
 * the process holds one copy, not two.  The thread runs at idle priority
 * (SCHED_IDLE) and only once no decode has run for COPY_IDLE_MS: it takes
 * time no one else wants, such as while the user types, and pauses while
 * a decode runs (copying beside one, at normal priority, cost tinyllama's
 * first 64 tokens a fifth of their speed).  A script or a pipe that keeps
 * decoding back to back leaves it no such gap: there (lm_weights_eager)
 * the decodes finish the copy on their own threads once they have spent
 * as long reading the mapping as the rest of the copy is taken to need,
 * as one pays for a thing once renting it has cost as much (tinyllama
 * Q4_0, a 10-turn script of 64-token replies: 11.0-11.3 s against
 * 11.9-13.4, replies after the first at 64-70 t/s against 47-59).
 * Decoding adopts what is done (lm_weights_enter, at the start of each
 * lm_decode, on the decoding thread, when no other thread reads the
 * tensors): a tensor's data pointer moves to the copy once all of its
 * bytes are there.  The bytes are the file's, so no result changes.
 * Nothing is copied when the kernel gives no huge pages, when the copy
 * would take more than half the memory available (models larger than RAM
 * stay mapped and read from the file), or when KVCHAT_MMAP is set.
 * Where the kernels read them faster so, Q4_0, Q8_0, Q4_K and Q6_K matrices
 * are rearranged as they are copied (repack.c), each unit (a row) before
 * the copy counts it done, in place (a Q4_0 or Q8_0 step's order depends on
 * where it lies); a tensor adopted with its data takes its layout.
 */
#include "internal.h"

#include <errno.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define HUGE_PAGE ((size_t)2 << 20)
#define COPY_CHUNK HUGE_PAGE          /* bytes dropped from the mapping and published at once */
#define COPY_PIECE ((size_t)256 << 10) /* bytes copied between two looks for a decode */
#define COPY_IDLE_MS 50                /* how long no decode runs before the copy goes on */

/* A tensor rearranged as it is copied: its bytes in the data section, how far it is done, in units of how many bytes. */
typedef struct lanes_span {
    size_t offset, bytes, done, unit;
    int layout;
    int64_t k;
} lanes_span;

struct lm_copy {
    const uint8_t *src;   /* the mapped data section */
    int fd;               /* the file, and where the data section begins in it */
    size_t file_off;
    uint8_t *region;      /* the mmap holding the copy (dst rounded up to a huge page) */
    uint8_t *dst;
    size_t size, region_size;
    int all_adopted;      /* the decoding thread's: every tensor points into the copy */
    pthread_t thread;
    pthread_mutex_t lock; /* over done, decoding, idle_since and stop */
    pthread_cond_t moved; /* stop was set (the copy thread's waits also time out: wait_for_idle) */
    size_t done;          /* bytes of the data section copied */
    int decoding;         /* a decode is reading the tensors */
    struct timespec idle_since; /* when the last decode ended (CLOCK_MONOTONIC) */
    int stop;
    size_t copied;        /* the copy thread's: bytes copied, rearranged where due (read once it ended) */
    int joined;           /* the copy thread has ended (stop_copy_thread) */
    int eager;            /* finish once decodes have taken as long as the rest would (lm_weights_eager) */
    double decoded_ms;    /* the decoding thread's: time spent decoding before the copy was whole */
    struct timespec entered; /* when the current decode began */
    uint8_t *layout;      /* per tensor: its layout in the copy (LM_LAYOUT_*) */
    lanes_span *spans;    /* those tensors; the copy thread's */
    size_t n_spans;
};

/* Whether the kernel hands out transparent huge pages to memory that asks (not "[never]"). */
static int huge_pages_on(void)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f)
        return 0;
    char line[128] = {0};
    int on = fgets(line, sizeof line, f) && !strstr(line, "[never]");
    fclose(f);
    return on;
}

/* MemAvailable in bytes (0 when unknown). */
static size_t memory_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[128];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (size_t)kb * 1024;
}

/*
 * Bytes [at, at + n) of the data section into the copy, read from the file:
 * the kernel copies them from its page cache without touching this
 * process's page tables.  Through the mapping, each 4 KiB page's first
 * touch cost about 1.6 us in this VM (it shadows its guests' page tables):
 * tinyllama Q8_0's 1.17 GB copied in 2 MiB steps at 0.4-1.9 GB/s, against
 * 7.4 with pread.  From the mapping where a read fails.
 */
static void copy_bytes(const struct lm_copy *cp, size_t at, size_t n)
{
    size_t got = 0;
    while (got < n) {
        const ssize_t r = pread(cp->fd, cp->dst + at + got, n - got, (off_t)(cp->file_off + at + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    if (got < n)
        memcpy(cp->dst + at + got, cp->src + at + got, n - got);
}

/* Drops the mapped pages wholly inside [p, p + n): reads refault them from the page cache. */
static void drop_mapped(const uint8_t *p, size_t n)
{
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + pg - 1) & ~(pg - 1), b = ((uintptr_t)p + n) & ~(pg - 1);
    if (a < b)
        madvise((void *)a, (size_t)(b - a), MADV_DONTNEED);
}

/* The copy's progress, for the decoding thread to adopt. */
static void set_done(struct lm_copy *cp, size_t done)
{
    pthread_mutex_lock(&cp->lock);
    cp->done = done;
    pthread_mutex_unlock(&cp->lock);
}

static size_t get_done(struct lm_copy *cp)
{
    pthread_mutex_lock(&cp->lock);
    const size_t done = cp->done;
    pthread_mutex_unlock(&cp->lock);
    return done;
}

/* Ends the copy thread (once): it stops at its next look and is joined. */
static void stop_copy_thread(struct lm_copy *cp)
{
    if (cp->joined)
        return;
    pthread_mutex_lock(&cp->lock);
    cp->stop = 1;
    pthread_cond_broadcast(&cp->moved);
    pthread_mutex_unlock(&cp->lock);
    pthread_join(cp->thread, NULL);
    cp->joined = 1;
}

static double ms_since(const struct timespec *t)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t->tv_sec) * 1e3 + (double)(now.tv_nsec - t->tv_nsec) / 1e6;
}

/* The units of the rearranged tensors that now lie wholly in the copy's first `upto` bytes. */
static void rearrange_copied(struct lm_copy *cp, size_t upto)
{
    for (size_t i = 0; i < cp->n_spans; i++) { /* a few hundred spans, a look each per 2 MiB copied */
        lanes_span *sp = &cp->spans[i];
        const size_t end = sp->offset + sp->bytes, to = upto < end ? upto : end;
        for (size_t at = sp->offset + sp->done; at + sp->unit <= to; at += sp->unit, sp->done += sp->unit)
            lm_layout_apply(sp->layout, cp->dst + at, sp->k);
    }
}

/*
 * Waits until no decode has run for COPY_IDLE_MS; returns whether the copy
 * is to stop.  It looks every COPY_IDLE_MS / 2 rather than being woken at
 * each decode's end (a few hundred times a second while a reply is made).
 */
static int wait_for_idle(struct lm_copy *cp)
{
    pthread_mutex_lock(&cp->lock);
    while (!cp->stop && (cp->decoding || ms_since(&cp->idle_since) < COPY_IDLE_MS)) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += COPY_IDLE_MS / 2 * 1000000L;
        until.tv_sec += until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&cp->moved, &cp->lock, &until);
    }
    const int stop = cp->stop;
    pthread_mutex_unlock(&cp->lock);
    return stop;
}

/*
 * Every step (a piece's copy and rearranging, a chunk's drop) waits until
 * no decode has run for COPY_IDLE_MS.  Beside a decode, the step would
 * read the tensors copied since from the mapping, faulting back the pages
 * dropped here (both copies held), each drop interrupts its threads to
 * flush their TLBs, and a step begun in the few ms between two turns of a
 * script crawls on at idle priority through the next decodes, whose
 * threads it stalls where a fresh page's first touch stops its processor
 * (a VM that backs its memory lazily).  Pausing only between 2 MiB chunks
 * and at any gap, a chat run from a script (smollm2, 20 turns) copied a
 * chunk a turn, each over 7-550 ms of its decodes, and never finished;
 * turns came 5-30 ms late at random and turn 2 1.5 times turn 3's.
 */
static void *copy_main(void *arg)
{
    struct lm_copy *cp = arg;
    struct sched_param idle = {0};
    if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle))
        setpriority(PRIO_PROCESS, (id_t)gettid(), 19); /* the next best thing */
    for (size_t at = 0; at < cp->size;) {
        const size_t n = cp->size - at < COPY_CHUNK ? cp->size - at : COPY_CHUNK;
        for (size_t p = 0; p < n; p += COPY_PIECE) {
            const size_t m = n - p < COPY_PIECE ? n - p : COPY_PIECE;
            if (wait_for_idle(cp))
                return NULL;
            copy_bytes(cp, at + p, m);
            rearrange_copied(cp, at + p + m);
            cp->copied = at + p + m;
        }
        if (wait_for_idle(cp))
            return NULL;
        drop_mapped(cp->src + at, n);
        at += n;
        set_done(cp, at);
    }
    return NULL;
}

/* Which tensors the copy rearranges (none where the kernels gain nothing); 0, or -1 out of memory. */
static int plan_lanes(struct lm_copy *cp, const gguf_file *g)
{
    cp->layout = calloc(g->n_tensors ? g->n_tensors : 1, 1);
    cp->spans = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *cp->spans);
    if (!cp->layout || !cp->spans)
        return -1;
    if (lm_lanes_plan(g, cp->size, cp->layout))
        return -1;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        if (cp->layout[i])
            cp->spans[cp->n_spans++] = (lanes_span){(size_t)t->offset, (size_t)t->nbytes, 0,
                                                    lm_layout_unit(cp->layout[i], t->ne[0]), cp->layout[i],
                                                    t->ne[0]};
    }
    return 0;
}

static void free_copy(struct lm_copy *cp)
{
    munmap(cp->region, cp->region_size);
    free(cp->layout);
    free(cp->spans);
    free(cp);
}

struct lm_copy *lm_weights_plan(const gguf_file *g)
{
#ifdef MADV_HUGEPAGE
    if (getenv("KVCHAT_MMAP") || !g->mapped || g->data_off >= g->size || !huge_pages_on())
        return NULL;
    const size_t size = g->size - g->data_off, avail = memory_available();
    if (avail == 0 || size > avail / 2)
        return NULL;
    struct lm_copy *cp = calloc(1, sizeof *cp);
    if (!cp)
        return NULL;
    cp->region_size = size + HUGE_PAGE;
    cp->region = mmap(NULL, cp->region_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (cp->region == MAP_FAILED) {
        free(cp);
        return NULL;
    }
    cp->dst = (uint8_t *)(((uintptr_t)cp->region + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    madvise(cp->dst, size, MADV_HUGEPAGE); /* a hint: without it the copy still works, in small pages */
    cp->src = g->map + g->data_off;
    cp->fd = g->fd;
    cp->file_off = (size_t)g->data_off;
    cp->size = size;
    if (plan_lanes(cp, g)) {
        free_copy(cp);
        return NULL;
    }
    pthread_mutex_init(&cp->lock, NULL);
    pthread_condattr_t clock;
    pthread_condattr_init(&clock);
    pthread_condattr_setclock(&clock, CLOCK_MONOTONIC);
    pthread_cond_init(&cp->moved, &clock);
    pthread_condattr_destroy(&clock);
    clock_gettime(CLOCK_MONOTONIC, &cp->idle_since);
    /* now: an interactive chat copies while the user types */
    if (pthread_create(&cp->thread, NULL, copy_main, cp)) {
        pthread_cond_destroy(&cp->moved);
        pthread_mutex_destroy(&cp->lock);
        free_copy(cp);
        return NULL;
    }
    return cp;
#else
    (void)g;
    return NULL;
#endif
}

/* Points every tensor whose bytes are all copied at the copy; returns how far the copy was. */
static size_t adopt(const lm_model *m, struct lm_copy *cp)
{
    const size_t done = get_done(cp);
    int all = 1;
    for (uint64_t i = 0; i < m->gguf.n_tensors; i++) {
        const gguf_tensor *t = &m->gguf.tensors[i];
        if (t->offset + t->nbytes > done) {
            all = 0;
        } else if (m->tensors[i].data != cp->dst + t->offset) {
            m->tensors[i].data = cp->dst + t->offset;
            m->tensors[i].layout = cp->layout[i];
            /* pages a decode faulted in again after the copy dropped them:
               nothing reads them now */
            drop_mapped(cp->src + t->offset, (size_t)t->nbytes);
        }
    }
    cp->all_adopted = all;
    return done;
}

/*
 * The rest of the copy, now, on n_threads threads: the copy thread is
 * stopped, the bytes it had not copied are copied in 2 MiB chunks and
 * their mapped pages dropped, and every unit not yet rearranged is.
 */
static void finish_now(struct lm_copy *cp, int n_threads)
{
    stop_copy_thread(cp);
    const size_t from = cp->copied, chunks = (cp->size - from + HUGE_PAGE - 1) / HUGE_PAGE;
    drop_mapped(cp->src + cp->done, from - cp->done);
#pragma omp parallel num_threads(n_threads)
    {
#pragma omp for schedule(dynamic)
        for (size_t c = 0; c < chunks; c++) { /* dropped as it goes: never both copies whole */
            const size_t at = from + c * HUGE_PAGE, n = cp->size - at < HUGE_PAGE ? cp->size - at : HUGE_PAGE;
            copy_bytes(cp, at, n);
            drop_mapped(cp->src + at, n);
        }
        for (size_t i = 0; i < cp->n_spans; i++) {
            const lanes_span *sp = &cp->spans[i];
            const size_t units = (sp->bytes - sp->done) / sp->unit;
#pragma omp for schedule(static)
            for (size_t u = 0; u < units; u++)
                lm_layout_apply(sp->layout, cp->dst + sp->offset + sp->done + u * sp->unit, sp->k);
        }
    }
    for (size_t i = 0; i < cp->n_spans; i++)
        cp->spans[i].done += (cp->spans[i].bytes - cp->spans[i].done) / cp->spans[i].unit * cp->spans[i].unit;
    set_done(cp, cp->size);
}

/* Milliseconds the rest of the copy is taken to need: at 1 GB/s, this VM's with fresh memory
   (0.7-1.4 GB/s; 4-8 once its memory has been used before), so the rule errs towards waiting. */
static double rest_ms(struct lm_copy *cp)
{
    return (double)(cp->size - get_done(cp)) / 1e6;
}

void lm_weights_eager(const lm_model *m)
{
    if (m->copy)
        m->copy->eager = 1;
}

void lm_weights_enter(const lm_model *m, int n_threads)
{
    struct lm_copy *cp = m->copy;
    if (!cp || cp->all_adopted)
        return;
    if (cp->eager && !cp->joined && cp->decoded_ms >= rest_ms(cp))
        finish_now(cp, n_threads);
    clock_gettime(CLOCK_MONOTONIC, &cp->entered);
    pthread_mutex_lock(&cp->lock);
    cp->decoding = 1; /* the copy pauses after its piece */
    pthread_mutex_unlock(&cp->lock);
    adopt(m, cp);
}

/* Whether the tensors stay where they are from now on (the decoding thread's view). */
int lm_weights_settled(const lm_model *m)
{
    return !m->copy || m->copy->all_adopted;
}

void lm_weights_leave(const lm_model *m)
{
    struct lm_copy *cp = m->copy;
    if (!cp || cp->all_adopted)
        return;
    cp->decoded_ms += ms_since(&cp->entered);
    pthread_mutex_lock(&cp->lock);
    cp->decoding = 0;
    clock_gettime(CLOCK_MONOTONIC, &cp->idle_since);
    pthread_mutex_unlock(&cp->lock);
}

/* The rest of the copy made now, on every thread (finish_now), rather than waited for. */
void lm_weights_settle(const lm_model *m)
{
    struct lm_copy *cp = m->copy;
    if (!cp)
        return;
    if (!cp->joined)
        finish_now(cp, omp_get_max_threads());
    adopt(m, cp);
}

int lm_weights_copied(const lm_model *m)
{
    return m->copy && m->copy->all_adopted;
}

void lm_weights_free(struct lm_copy *cp)
{
    if (!cp)
        return;
    stop_copy_thread(cp);
    pthread_cond_destroy(&cp->moved);
    pthread_mutex_destroy(&cp->lock);
    free_copy(cp);
}
