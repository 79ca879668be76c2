/*
 * cache/cache.c - the persistent context (see cache.h).  Truncation is only
 * bookkeeping: positions past n_past are overwritten by the next
 * evaluation, and attention never reads past the position it computes.
 */
#include "cache.h"

#include <stdlib.h>
#include <string.h>

int kv_init(kv_context *c, const lm_model *m, int n_ctx, int kv_type, int n_threads, lm_err *e)
{
    memset(c, 0, sizeof *c);
    if (n_ctx < 1) {
        lm_seterr(e, "context size %d must be positive", n_ctx);
        return -1;
    }
    c->model = m;
    c->n_ctx = n_ctx;
    c->tokens = malloc((size_t)n_ctx * sizeof *c->tokens);
    c->logits = malloc((size_t)m->hp.n_vocab * sizeof *c->logits);
    if (!c->tokens || !c->logits) {
        lm_seterr(e, "out of memory for a context of %d tokens", n_ctx);
        kv_free(c);
        return -1;
    }
    if (lm_kv_init(&c->kv, m, n_ctx, kv_type, e) || !(c->lm = lm_ctx_new(m, n_threads, e))) {
        kv_free(c);
        return -1;
    }
    kv_prepare_ahead(c, KV_AHEAD);
    return 0;
}

void kv_prepare_ahead(kv_context *c, int n)
{
    lm_kv_populate(&c->kv, c->n_past, c->n_past + n);
    lm_kv_touch(&c->kv, c->n_past, c->n_past + (n < KV_TOUCH ? n : KV_TOUCH));
}

void kv_free(kv_context *c)
{
    lm_ctx_free(c->lm);
    lm_kv_free(&c->kv);
    free(c->tokens);
    free(c->logits);
    memset(c, 0, sizeof *c);
}

int kv_eval(kv_context *c, const int32_t *toks, int n, float *all_logits, volatile int *stop,
            lm_err *e)
{
    if (n <= 0)
        return 0;
    if (n > c->n_ctx - c->n_past) {
        lm_seterr(e, "KV cache overflow: n_past=%d + n_tokens=%d > n_ctx=%d", c->n_past, n,
                  c->n_ctx);
        return -1;
    }
    size_t nv = (size_t)c->model->hp.n_vocab;
    int rc = all_logits ? lm_decode(c->lm, &c->kv, toks, n, c->n_past, LM_LOGITS_ALL, all_logits, stop, e)
                        : lm_decode(c->lm, &c->kv, toks, n, c->n_past, LM_LOGITS_LAST, c->logits, stop, e);
    if (rc)
        return -1; /* n_past and the token list are untouched */
    if (all_logits)
        memcpy(c->logits, all_logits + (size_t)(n - 1) * nv, nv * sizeof *c->logits);
    memcpy(c->tokens + c->n_past, toks, (size_t)n * sizeof *toks);
    c->n_past += n;
    c->has_logits = 1;
    return 0;
}

void kv_truncate(kv_context *c, int pos)
{
    if (pos < 0)
        pos = 0;
    if (pos < c->n_past) {
        c->n_past = pos;
        c->has_logits = 0;
    }
}

void kv_reset(kv_context *c) { kv_truncate(c, 0); }

int kv_common_prefix(const kv_context *c, const int32_t *want, int n)
{
    int p = 0;
    while (p < n && p < c->n_past && c->tokens[p] == want[p])
        p++;
    return p;
}

int kv_sync(kv_context *c, const int32_t *want, int n, int *reused, int *decoded,
            volatile int *stop, lm_err *e)
{
    if (n <= 0) {
        lm_seterr(e, "nothing to evaluate");
        return -1;
    }
    if (n > c->n_ctx) {
        lm_seterr(e, "KV cache overflow: n_past=0 + n_tokens=%d > n_ctx=%d", n, c->n_ctx);
        return -1;
    }
    int p = kv_common_prefix(c, want, n);
    if (p == n && p == c->n_past && c->has_logits) {
        *reused = p;
        *decoded = 0;
        return 0;
    }
    if (p == n)
        p = n - 1; /* everything cached: re-evaluate the last token for its logits */
    /* On failure the cache holds exactly the common prefix: consistent, and
       what the next sync would keep anyway. */
    kv_truncate(c, p);
    if (kv_eval(c, want + p, n - p, NULL, stop, e))
        return -1;
    *reused = p;
    *decoded = n - p;
    return 0;
}
