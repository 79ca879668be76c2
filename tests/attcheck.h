/*
 * tests/attcheck.h - attention's fast paths against the portable steps,
 * bit for bit: shared by the Check tests (tests/test_layer_math.c, x86)
 * and the plain aarch64 program (tests/aarch64/neon_kernels.c, NEON).
 */
#ifndef KVCHAT_TESTS_ATTCHECK_H
#define KVCHAT_TESTS_ATTCHECK_H

#include "../lm/internal.h"

#include <stddef.h>

typedef int (*attend_fn)(const lm_attq *qs, int n, const void *k0, const void *v0, int hd, int hdv, float scale,
                         float cap, float *scores, size_t sstride, float *acc, int f16);

/*
 * Groups of 1, 6 and LM_ATT_QMAX queries, head sizes 64/96/128/256, f32
 * and f16 caches, soft-capped or not, windows cut mid-tile.  Returns the
 * number of queries whose output differs from the portable one (the
 * first described in msg).
 */
int attcheck_groups(attend_fn attend, char *msg, size_t cap);

/*
 * Keys outside a query's range must not reach its scores' maximum:
 * scores rise (or fall) with the key, and the queries' ends and windows
 * take every place in a tile; groups of 1, 1 + n_step, ... LM_ATT_QMAX
 * queries.  Returns the count of differing queries.
 */
int attcheck_range_edges(attend_fn attend, int n_step, char *msg, size_t cap);

/*
 * A vector conversion of f16 rows to f32 (lm_f16_to_f32_neon: how many it
 * did, a multiple of `step`; AVX2's converts all) over every f16 value at every
 * alignment of a row's tail: each as lm_f16_to_f32 gives it (a NaN as a
 * NaN).  Returns the count of wrong values.
 */
typedef size_t (*f16_rows_fn)(float *dst, const uint16_t *src, size_t n);
int attcheck_f16_rows(f16_rows_fn convert, size_t step, char *msg, size_t cap);

#endif
