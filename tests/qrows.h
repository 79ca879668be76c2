/*
 * tests/qrows.h - quantized rows for the tests of tests/test_quant.c and
 * tests/test_kernels.c: random valid rows of every type, and buffers for
 * the scalar reference decode (qdot.c) that the fast paths are held to.
 */
#ifndef KVCHAT_TESTS_QROWS_H
#define KVCHAT_TESTS_QROWS_H

#include "../lm/internal.h"

#include <stddef.h>
#include <stdint.h>

enum { K = 768 };     /* three super-blocks; an odd number of 32-blocks (24) is tested too */
enum { KMAX = 2048 }; /* the longest row a reference decode takes */
enum { N_ALL_TYPES = 13 };
extern const uint32_t ALL_TYPES[N_ALL_TYPES];

typedef struct qrow_buf {
    float f[KMAX], d[KMAX / 32], m[KMAX / 32];
    uint8_t u[KMAX];
    int32_t sc4[KMAX / 4];
    int16_t mn[KMAX / 16];
    int8_t s8[KMAX];
    int32_t corr16[KMAX / 16];
    qrow r;
} qrow_buf;

void put_half(uint8_t *p, float f);
/* Random bytes made valid blocks of type: scales small and finite. */
void random_row(uint32_t type, uint8_t *b, size_t n, uint64_t *seed);
void qrow_init(qrow_buf *b);
/* A random row of k elements (F32 rows: a fixed ramp). */
void test_row(uint32_t ty, uint8_t *row, int k, uint64_t *seed);
/*
 * A fast rounding of activations (lm_quantize_act_*) against the scalar
 * bytes, for 7 weight types at 2 widths, on values with ties, NaN,
 * infinities, an all-zero block, +max and -max both and scales below
 * f16's normal range.  Returns how many differ (the first in msg).
 */
typedef int (*quantize_fn)(uint32_t wtype, const float *x, void *dst, int64_t k);
int act_rounding_check(quantize_fn fn, char *msg, size_t cap);

#endif
