/*
 * lm/internal.h - what the files of lm/ share and nobody else sees: the
 * architecture entry and the matrix kernels.
 */
#ifndef KVCHAT_LM_INTERNAL_H
#define KVCHAT_LM_INTERNAL_H

#include "lm.h"

enum arch_flags {
    ARCH_QKV_BIAS = 1 << 0, /* attn_q/k/v have biases */
};

typedef struct lm_arch {
    const char *name;
    int rope_style;
    unsigned flags;
} lm_arch;

/*
 * out[t][r] = dot(row r of w, x[t]) for t < n_tok, r < rows of w.
 * scratch: per-thread buffers of at least w->ne[0] floats.
 */
void lm_matmul(float *out, const lm_tensor *w, const float *x, int n_tok, float **scratch,
               int n_threads);

#endif
