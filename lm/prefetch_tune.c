/*
 * lm/prefetch_tune.c - how far ahead of their reads the one-token kernels
 * ask for the weights, chosen by each context from its own tokens' times.
 *
 * Generating a token streams every weight from memory, and the kernels ask
 * for each line some distance before they read it (internal.h).  The best
 * distance is the machine's: far enough to hide memory's latency at the
 * rate a core reads, not so far that the requests outrun the misses a core
 * keeps in flight.  The Zen 4 this project was first measured on read
 * fastest 6 KiB ahead; the Xeon with AMX of 2026-11-25 3 KiB, where 6 KiB
 * cost its Q8_0 and Q4_0 rows 10-15% of their speed.  Whether to ask for
 * each line again into L1 just before it is read is the machine's too (the
 * Xeon gained 5-10% by it, the Zen 5 lost 3-17%: internal.h), so each
 * distance is a candidate with that request and without.  A context takes
 * the candidates in turn on its first one-token passes (over the mapped
 * file while the weights' copy is made, then again once they have settled,
 * weights_copy.c), keeps each one's fastest pass (the
 * machine's noise only ever slows a pass down), and from then on asks as
 * far ahead as the fastest of them.  A distance only changes when lines
 * arrive, never a result.  KVCHAT_PREFETCH=BYTES fixes it instead, with
 * the request into L1, or BYTES:l2 without (comparisons, benchmarks of
 * one distance).
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define L1 LM_AHEAD_L1
static const size_t candidates[LM_AHEAD_CHOICES] = {2048 | L1, 3072 | L1, 4096 | L1, 6144 | L1, 8192 | L1,
                                                   2048,      3072,      4096,      6144,      8192};
#undef L1

#define ROUNDS 3 /* passes each candidate gets */

void lm_ahead_tune_init(lm_ahead_tune *t)
{
    const char *env = getenv("KVCHAT_PREFETCH");
    char *end = NULL;
    long fixed = env ? strtol(env, &end, 10) : 0;
    *t = (lm_ahead_tune){0};
    if (fixed > 1 && fixed <= (1 << 20))
        t->fixed = lm_ahead_bytes((size_t)fixed) | (strcmp(end, ":l2") ? LM_AHEAD_L1 : 0);
}

/* The distance the next one-token pass asks with. */
size_t lm_ahead_next(const lm_ahead_tune *t)
{
    if (t->fixed)
        return t->fixed;
    if (t->chosen)
        return t->chosen;
    return candidates[t->trials % LM_AHEAD_CHOICES];
}

/* A one-token pass that asked `ahead` bytes ahead took `seconds`; the choice once every candidate had its rounds. */
void lm_ahead_record(lm_ahead_tune *t, size_t ahead, double seconds)
{
    if (t->fixed || t->chosen || ahead != candidates[t->trials % LM_AHEAD_CHOICES])
        return;
    double *best = &t->best[t->trials % LM_AHEAD_CHOICES];
    if (t->trials < LM_AHEAD_CHOICES || seconds < *best)
        *best = seconds;
    if (++t->trials < ROUNDS * LM_AHEAD_CHOICES)
        return;
    int pick = 0;
    for (int i = 1; i < LM_AHEAD_CHOICES; i++)
        pick = t->best[i] < t->best[pick] ? i : pick;
    t->chosen = candidates[pick];
}
