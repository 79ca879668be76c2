/*
 * lm/matmul.c - the matrix-times-activations kernel.  Rows of the weight
 * matrix are split across OpenMP threads; each row is dequantized once into
 * the thread's scratch buffer and then dotted with every token of the batch,
 * so a prompt reads each weight once.  Each output element is one call of
 * lm_dot_f32 on the same operands whatever the batch or thread split: that
 * is what makes batched and token-by-token evaluation bitwise identical.
 */
#include "internal.h"

#include <omp.h>

void lm_matmul(float *out, const lm_tensor *w, const float *x, int n_tok, float **scratch,
               int n_threads)
{
    const int64_t k = w->ne[0], rows = w->ne[1];
    const size_t row_bytes = lm_row_bytes(w->type, k);
    const uint8_t *base = w->data;
    int nt = rows < 64 ? 1 : n_threads;
#pragma omp parallel num_threads(nt)
    {
        float *buf = scratch[omp_get_thread_num()];
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const float *row;
            if (w->type == LM_F32) {
                row = (const float *)(base + (size_t)r * row_bytes);
            } else {
                lm_dequant_row(w->type, base + (size_t)r * row_bytes, buf, k);
                row = buf;
            }
            for (int t = 0; t < n_tok; t++)
                out[(size_t)t * rows + r] = lm_dot_f32(row, x + (size_t)t * k, k);
        }
    }
}
