/*
 * lm/sample.c - choosing the next token from logits.  The chain follows
 * llama.cpp's default order: repeat penalty, top-k, top-p, min-p,
 * temperature, then a draw from the softmax.  temp <= 0 is greedy (argmax,
 * lowest id on ties).  The random stream is SplitMix64 from the seed, so the
 * same seed and the same logits give the same tokens on every machine.
 */
#include "lm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct cand {
    int32_t id;
    float logit;
} cand;

struct lm_sampler {
    lm_sampling p;
    uint64_t rng;
    int n_vocab;
    cand *c;
    float *penalized;
    double *prob;
};

void lm_sampling_defaults(lm_sampling *p)
{
    p->temp = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->seed = 0;
}

lm_sampler *lm_sampler_new(const lm_sampling *p, int n_vocab)
{
    lm_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->p = *p;
    s->rng = p->seed;
    s->n_vocab = n_vocab;
    s->c = malloc((size_t)n_vocab * sizeof *s->c);
    s->penalized = malloc((size_t)n_vocab * sizeof *s->penalized);
    s->prob = malloc((size_t)n_vocab * sizeof *s->prob);
    if (!s->c || !s->penalized || !s->prob) {
        lm_sampler_free(s);
        return NULL;
    }
    return s;
}

void lm_sampler_free(lm_sampler *s)
{
    if (!s)
        return;
    free(s->c);
    free(s->penalized);
    free(s->prob);
    free(s);
}

void lm_sampler_reseed(lm_sampler *s, uint64_t seed) { s->rng = seed; }
uint64_t lm_sampler_state(const lm_sampler *s) { return s->rng; }

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *state) { return (double)(splitmix64(state) >> 11) * 0x1.0p-53; }

/*
 * The first index of the largest logit (NaNs never win; a NaN at 0 does,
 * as "logits[i] > logits[best]" from best = 0 would have it).  The maximum
 * is found first in vectors, then its first index: one compare-and-move
 * chain through 150K logits cost ~0.1 ms a token.
 */
int32_t lm_argmax(const float *logits, int n)
{
    float mx = logits[0];
    if (mx != mx)
        return 0;
#pragma omp simd reduction(max : mx)
    for (int i = 1; i < n; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    int32_t i = 0;
    while (i < n - 1 && !(logits[i] == mx))
        i++;
    return i;
}

/* Descending by logit, ascending id on ties: a total order, so qsort is deterministic. */
static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return x->id - y->id;
}

static void apply_penalty(lm_sampler *s, const int32_t *recent, int n_recent)
{
    float pen = s->p.repeat_penalty;
    int from = n_recent - s->p.repeat_last_n;
    if (pen == 1.0f || s->p.repeat_last_n == 0)
        return;
    if (s->p.repeat_last_n < 0 || from < 0)
        from = 0;
    for (int i = from; i < n_recent; i++) {
        int32_t t = recent[i];
        if (t < 0 || t >= s->n_vocab)
            continue;
        int dup = 0; /* penalize each distinct token once */
        for (int j = from; j < i && !dup; j++)
            dup = recent[j] == t;
        if (dup)
            continue;
        float *l = &s->penalized[t];
        *l = *l > 0 ? *l / pen : *l * pen;
    }
}

/* Keeps the k best candidates, sorted; O(n log n) only when k is off. */
static int top_k(cand *c, int n, int k)
{
    if (k <= 0 || k >= n) {
        qsort(c, (size_t)n, sizeof *c, cand_cmp);
        return n;
    }
    /* selection: keep the k best in c[0..k) via a running sorted insert */
    int have = 0;
    for (int i = 0; i < n; i++) {
        cand x = c[i];
        if (have == k && cand_cmp(&x, &c[k - 1]) >= 0)
            continue;
        int j = have < k ? have++ : k - 1;
        while (j > 0 && cand_cmp(&x, &c[j - 1]) < 0) {
            c[j] = c[j - 1];
            j--;
        }
        c[j] = x;
    }
    return k;
}

static void softmax_probs(const cand *c, int n, double *p, float temp)
{
    double sum = 0;
    for (int i = 0; i < n; i++) {
        p[i] = exp((double)(c[i].logit - c[0].logit) / temp);
        sum += p[i];
    }
    for (int i = 0; i < n; i++)
        p[i] /= sum;
}

int32_t lm_sample(lm_sampler *s, const float *logits, const int32_t *recent, int n_recent)
{
    int n = s->n_vocab;
    memcpy(s->penalized, logits, (size_t)n * sizeof *logits);
    apply_penalty(s, recent, n_recent);
    if (s->p.temp <= 0)
        return lm_argmax(s->penalized, n);
    for (int i = 0; i < n; i++)
        s->c[i] = (cand){i, s->penalized[i]};
    n = top_k(s->c, n, s->p.top_k);
    double *p = s->prob;
    if (s->p.top_p < 1.0f) {
        softmax_probs(s->c, n, p, 1.0f);
        double cum = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += p[i];
            if (cum >= s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (s->p.min_p > 0) {
        float floor_logit = s->c[0].logit + logf(s->p.min_p);
        int keep = 1;
        while (keep < n && s->c[keep].logit >= floor_logit)
            keep++;
        n = keep;
    }
    softmax_probs(s->c, n, p, s->p.temp);
    double r = uniform01(&s->rng), cum = 0;
    int32_t pick = s->c[n - 1].id;
    for (int i = 0; i < n; i++) {
        cum += p[i];
        if (r < cum) {
            pick = s->c[i].id;
            break;
        }
    }
    return pick;
}
