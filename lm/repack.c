/*
 * lm/repack.c - Q4_0 rows rearranged, in place, for the kernels that hold
 * a block in each 32-bit lane (qrow_vbmi.c's row_lanes).
 *
 * Read as the file stores them (18-byte blocks: an f16 scale, then 16
 * bytes of nibbles), a step of 16 blocks needs byte permutes to put each
 * block's bytes in a lane of its own, and on a core those permutes cost
 * more than the multiply-adds.  Rearranged once, while the weights are
 * copied into 2 MiB pages (weights_copy.c), a step is loaded as it will be
 * used (Zen 4, one thread, 2048 columns from L2: one token 25 -> 18 ticks
 * a step, three tokens 49 -> 37; tinyllama Q4_0 6- and 12-token turns 6%
 * and 9% faster; generation from memory, bound by memory, level).
 *
 * The layout keeps every step of 16 blocks in its 288 bytes, so a row, its
 * size and its offsets stay the file's: bytes 64q + 4j..+3 of the step are
 * nibble bytes 4q..4q+3 of block j (q < 4, j < 16), then bytes 256 + 2j,
 * 257 + 2j are block j's f16 scale.  Only matrices whose rows are whole
 * steps and whose rows come 16 at a time are rearranged, and only where
 * the kernels that read them run (AVX-512 with VBMI, without AMX); any
 * other path unpacks a row to the file's layout before reading it.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define STEP_BLOCKS 16
#define STEP_BYTES LM_Q4_0_STEP_BYTES /* STEP_BLOCKS blocks of 18 bytes */

/* A step of 16 blocks (the file's 288 bytes) into the lanes layout, in place. */
void lm_q4_0_to_lanes(uint8_t *step)
{
    uint8_t in[STEP_BYTES];
    memcpy(in, step, sizeof in);
    for (int j = 0; j < STEP_BLOCKS; j++) {
        const uint8_t *blk = in + 18 * j;
        for (int q = 0; q < 4; q++)
            memcpy(step + 64 * q + 4 * j, blk + 2 + 4 * q, 4);
        memcpy(step + 256 + 2 * j, blk, 2);
    }
}

/* A row of k columns in the lanes layout back into the file's layout at dst. */
void lm_q4_0_from_lanes(const uint8_t *row, uint8_t *dst, int64_t k)
{
    for (int64_t s = 0; s < k / (32 * STEP_BLOCKS); s++) {
        const uint8_t *step = row + STEP_BYTES * s;
        uint8_t *out = dst + STEP_BYTES * s;
        for (int j = 0; j < STEP_BLOCKS; j++) {
            for (int q = 0; q < 4; q++)
                memcpy(out + 18 * j + 2 + 4 * q, step + 64 * q + 4 * j, 4);
            memcpy(out + 18 * j, step + 256 + 2 * j, 2);
        }
    }
}

/* Whether this machine's kernels read rearranged Q4_0 rows natively (KVCHAT_ISA forces other paths). */
int lm_lanes_layout_native(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    return !getenv("KVCHAT_ISA") && lm_cpu_isa() >= LM_ISA_AVX512 && lm_cpu_vbmi() && !lm_cpu_amx();
#else
    return 0; /* its kernels are AVX-512 VBMI ones */
#endif
}

/* Whether tensor t, a matrix of whole steps in rows that come 16 at a time, takes the layout. */
static int layout_fits(const gguf_tensor *t)
{
    for (uint32_t i = 2; i < t->n_dims; i++)
        if (t->ne[i] != 1)
            return 0;
    return t->type == LM_Q4_0 && t->n_dims >= 2 && t->ne[0] % (32 * STEP_BLOCKS) == 0 && t->ne[1] > 0 &&
           t->ne[1] % 16 == 0 && t->nbytes == (uint64_t)t->ne[1] * (uint64_t)(t->ne[0] / 32 * 18) &&
           strcmp(t->name, "token_embd.weight") != 0; /* embeddings are looked up row by row */
}

/* A tensor's bytes in the data section, to find tensors that share them. */
typedef struct tensor_bytes {
    uint64_t offset, end, index;
} tensor_bytes;

static int by_start(const void *a, const void *b)
{
    const tensor_bytes *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/*
 * Clears ok[i] for every tensor i that shares bytes with another: a file
 * whose tensors overlap (legal to read, odd to write) would otherwise
 * find another tensor's bytes moved.  0, or -1 out of memory.
 */
static int keep_alone(const gguf_file *g, uint8_t *ok)
{
    tensor_bytes *all = malloc((g->n_tensors ? g->n_tensors : 1) * sizeof *all);
    if (!all)
        return -1;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        all[i] = (tensor_bytes){g->tensors[i].offset, g->tensors[i].offset + g->tensors[i].nbytes, i};
    qsort(all, g->n_tensors, sizeof *all, by_start);
    uint64_t reach = 0; /* the furthest end of the tensors before */
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        if ((i > 0 && reach > all[i].offset) || (i + 1 < g->n_tensors && all[i + 1].offset < all[i].end))
            ok[all[i].index] = 0;
        reach = all[i].end > reach ? all[i].end : reach;
    }
    free(all);
    return 0;
}

/*
 * in_lanes[i] = whether the copy of g's data section (size bytes) lays
 * tensor i out in lanes: where the kernels read it natively, a matrix that
 * fits, within the section, sharing no byte with another tensor.  0, or -1
 * out of memory.
 */
int lm_lanes_plan(const gguf_file *g, size_t size, uint8_t *in_lanes)
{
    const int native = lm_lanes_layout_native();
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        in_lanes[i] = native && layout_fits(t) && t->offset <= size && t->nbytes <= size - t->offset;
    }
    return native ? keep_alone(g, in_lanes) : 0;
}
