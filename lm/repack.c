/*
 * lm/repack.c - Q4_0 and Q4_K rows rearranged, in place, for the kernels
 * that read them fastest so (qrow_vbmi.c's row_lanes, qrow_k.c's
 * row_klanes).
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
 *
 * Q4_K: a super-block's 256 codes come as 8 groups of 32 with a scale
 * each.  As the file has them, a 32-bit lane of the multiply-add holds 4
 * codes of one group and a group spans 8 lanes, so every 64 products must
 * meet their scales and then be added across the vector, super-block by
 * super-block, which costs more than the products.  Rearranged in steps
 * of 4 super-blocks, lane 4b + g of every vector holds group g (low
 * nibbles) and g + 4 (high) of super-block b, a further 4 codes of them
 * each 64-byte chunk: a lane adds up its groups' products by itself, and a
 * step's four super-blocks meet their scales in four multiply-adds (Zen 4,
 * one thread, 2048 columns from L2: 14.9 -> 7.8 ticks a super-block).
 * Bytes 16b..16b+15 of the step are super-block b's d, dmin and scales as
 * the file has them; then chunk c (0-7), 64 bytes, whose byte 4(4b + g) + i
 * holds code 4c + i of group g of super-block b (low nibble) and of group
 * g + 4 (high).  A row's last k/256 mod 4 super-blocks stay as they are.
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

/* Code e (0-255) of a Q4_K super-block's 128 code bytes as the file has them. */
static int q4_k_code(const uint8_t *qs, int e)
{
    return qs[32 * (e / 64) + e % 32] >> (4 * (e / 32 % 2)) & 15;
}

/* Where code e of super-block b goes in a step's chunks, and in which nibble (shift). */
static int q4_k_lane_byte(int b, int e, int *shift)
{
    const int g = e / 32, c = e % 32;
    *shift = 4 * (g / 4);
    return 64 * (c / 4) + 4 * (4 * b + g % 4) + c % 4;
}

/* A Q4_K row of k columns into the lanes layout, in place (the super-blocks past whole steps stay). */
void lm_q4_k_to_lanes(uint8_t *row, int64_t k)
{
    for (int64_t s = 0; s < k / 1024; s++) {
        uint8_t *step = row + LM_Q4_K_STEP_BYTES * s, in[LM_Q4_K_STEP_BYTES];
        memcpy(in, step, sizeof in);
        memset(step + 64, 0, 512);
        for (int b = 0; b < 4; b++) {
            memcpy(step + 16 * b, in + 144 * b, 16);
            for (int e = 0; e < 256; e++) {
                int shift, at = q4_k_lane_byte(b, e, &shift);
                step[64 + at] |= (uint8_t)(q4_k_code(in + 144 * b + 16, e) << shift);
            }
        }
    }
}

/* A Q4_K row in the lanes layout back into the file's layout at dst. */
void lm_q4_k_from_lanes(const uint8_t *row, uint8_t *dst, int64_t k)
{
    const int64_t whole = k / 1024;
    for (int64_t s = 0; s < whole; s++) {
        const uint8_t *step = row + LM_Q4_K_STEP_BYTES * s;
        uint8_t *out = dst + LM_Q4_K_STEP_BYTES * s;
        memset(out, 0, LM_Q4_K_STEP_BYTES);
        for (int b = 0; b < 4; b++) {
            memcpy(out + 144 * b, step + 16 * b, 16);
            for (int e = 0; e < 256; e++) {
                int shift, at = q4_k_lane_byte(b, e, &shift);
                out[144 * b + 16 + 32 * (e / 64) + e % 32] |= (uint8_t)((step[64 + at] >> shift & 15) << (4 * (e / 32 % 2)));
            }
        }
    }
    memcpy(dst + LM_Q4_K_STEP_BYTES * whole, row + LM_Q4_K_STEP_BYTES * whole, (size_t)(k / 256 % 4) * 144);
}

/* The bytes a layout rearranges at once: a Q4_0 step, a Q4_K row (its tail stays). */
size_t lm_layout_unit(int layout, int64_t k)
{
    return layout == LM_LAYOUT_Q4_K_LANES ? (size_t)(k / 256) * 144 : STEP_BYTES;
}

void lm_layout_apply(int layout, uint8_t *unit, int64_t k)
{
    if (layout == LM_LAYOUT_Q4_K_LANES)
        lm_q4_k_to_lanes(unit, k);
    else if (layout == LM_LAYOUT_Q4_0_LANES)
        lm_q4_0_to_lanes(unit);
}

void lm_layout_undo(int layout, const uint8_t *row, uint8_t *dst, int64_t k)
{
    if (layout == LM_LAYOUT_Q4_K_LANES)
        lm_q4_k_from_lanes(row, dst, k);
    else
        lm_q4_0_from_lanes(row, dst, k);
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

/* Whether rearranged Q4_K rows are read natively: as Q4_0's, with VBMI (the batch paths' byte permutes). */
int lm_klanes_layout_native(void)
{
    return lm_lanes_layout_native();
}

/*
 * The layout tensor t takes where the kernels read both natively: Q4_0
 * matrices of whole steps in rows that come 16 at a time, Q4_K matrices of
 * a step a row at least; never the embeddings, looked up row by row.
 */
static int layout_for(const gguf_tensor *t, int q4_0, int q4_k)
{
    for (uint32_t i = 2; i < t->n_dims; i++)
        if (t->ne[i] != 1)
            return LM_LAYOUT_FILE;
    if (t->n_dims < 2 || t->ne[1] <= 0 || strcmp(t->name, "token_embd.weight") == 0)
        return LM_LAYOUT_FILE;
    const uint64_t rows = (uint64_t)t->ne[1];
    if (q4_0 && t->type == LM_Q4_0 && t->ne[0] % (32 * STEP_BLOCKS) == 0 && rows % 16 == 0 &&
        t->nbytes == rows * (uint64_t)(t->ne[0] / 32 * 18))
        return LM_LAYOUT_Q4_0_LANES;
    if (q4_k && t->type == LM_Q4_K && t->ne[0] % 256 == 0 && t->ne[0] >= 1024 &&
        t->nbytes == rows * (uint64_t)(t->ne[0] / 256 * 144))
        return LM_LAYOUT_Q4_K_LANES;
    return LM_LAYOUT_FILE;
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
 * layout[i] = the layout the copy of g's data section (size bytes) gives
 * tensor i (LM_LAYOUT_*): where the kernels read it natively, a matrix that
 * fits, within the section, sharing no byte with another tensor.  0, or -1
 * out of memory.
 */
int lm_lanes_plan(const gguf_file *g, size_t size, uint8_t *layout)
{
    const int q4_0 = lm_lanes_layout_native(), q4_k = lm_klanes_layout_native();
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        const int inside = t->offset <= size && t->nbytes <= size - t->offset;
        layout[i] = (uint8_t)(inside ? layout_for(t, q4_0, q4_k) : LM_LAYOUT_FILE);
    }
    return q4_0 || q4_k ? keep_alone(g, layout) : 0;
}
