/*
 * lm/qrow_k_gfni.c - qrow_k.c's one-token K-quant kernel once more, for
 * CPUs with AVX-512 VBMI and GFNI (lm_cpu_gfni): lm_rows_k_gfni.  One
 * source, two targets: the instructions differ in two helpers only, and a
 * target attribute cannot be switched inside one compiled function.
 */
#define QROW_K_GFNI 1
#include "qrow_k.c"
