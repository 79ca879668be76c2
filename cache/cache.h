/*
 * cache/cache.h - the one persistent context: the KV cache, n_past, and the
 * exact tokens the cache holds.  Every evaluation goes through here so the
 * token list and the cache never disagree: n_past grows only after a
 * successful evaluation, and a failed or interrupted one leaves both as they
 * were.  kv_sync() is the product's core move: keep the longest common
 * prefix with the wanted tokens, drop the rest, decode only the difference.
 */
#ifndef KVCHAT_CACHE_H
#define KVCHAT_CACHE_H

#include "../lm/lm.h"

typedef struct kv_context {
    const lm_model *model;
    lm_ctx *lm;
    lm_kv kv;
    int n_ctx, n_past;
    int32_t *tokens;     /* [n_ctx]: tokens[0..n_past) are in the cache */
    float *logits;       /* n_vocab: after the last evaluated token */
    int has_logits;
} kv_context;

int kv_init(kv_context *c, const lm_model *m, int n_ctx, int kv_type, int n_threads, lm_err *e);
void kv_free(kv_context *c);

/* Appends n tokens; all_logits (optional) receives n rows of n_vocab. */
int kv_eval(kv_context *c, const int32_t *toks, int n, float *all_logits, volatile int *stop,
            lm_err *e);
/*
 * Maps the cache memory of the next n positions (from n_past on) before they
 * are written, which would otherwise fault its pages in during the next
 * prefill: for a moment when nobody waits, as after a reply.
 */
void kv_prepare_ahead(kv_context *c, int n);
#define KV_AHEAD 512 /* positions readied at init and after a reply: a message and its answer */
#define KV_TOUCH 64  /* of those, the first touched too (lm_kv_touch): the next message's, at 5-7 us a page in a VM */
/* Drops positions >= pos. */
void kv_truncate(kv_context *c, int pos);
void kv_reset(kv_context *c);
/* Length of the common prefix of the cached tokens and want[0..n). */
int kv_common_prefix(const kv_context *c, const int32_t *want, int n);
/*
 * Makes the cache hold exactly want[0..n) with logits after the last token:
 * keeps the common prefix, evaluates the rest (re-evaluates the last token
 * when everything was cached).  Reports reused and decoded counts.
 */
int kv_sync(kv_context *c, const int32_t *want, int n, int *reused, int *decoded,
            volatile int *stop, lm_err *e);

#endif
