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

/* A weight row decoded for integer dot products (qdot.c). */
typedef struct qrow {
    uint32_t type;
    int64_t k;
    float *f;          /* float weights (F32/F16/BF16): k values */
    int8_t *q;         /* quantized: k signed codes */
    int16_t *sc, *mn;  /* K-quants: scale and min per 16 elements */
    float *d, *m;      /* per block: scale, and min/offset scale */
} qrow;

int lm_act_type(uint32_t wtype);                 /* llama.cpp's vec_dot_type */
size_t lm_act_row_bytes(int atype, int64_t k);
void lm_quantize_act(int atype, const float *x, void *dst, int64_t k);
void lm_qrow_decode(qrow *r, uint32_t type, const void *src, int64_t k);
float lm_qrow_dot(const qrow *r, const void *act);

/* Per-context matmul scratch: quantized activations and one qrow per thread. */
typedef struct mm_scratch {
    int n_threads;
    int64_t max_k;
    uint8_t *act;      /* n_tok quantized activation rows */
    size_t act_cap;
    qrow *rows;
} mm_scratch;

int mm_scratch_init(mm_scratch *s, int n_threads, int64_t max_k, int max_tok);
void mm_scratch_free(mm_scratch *s);

/* out[t][r] = dot(row r of w, x[t]) for t < n_tok, r < rows of w. */
void lm_matmul(float *out, const lm_tensor *w, const float *x, int n_tok, mm_scratch *s);

#endif
