/*
 * lm/repack.c - Q4_0, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K rows rearranged, in place, for
 * the kernels that read them fastest so (qrow_vbmi.c's row_lanes,
 * qrow_klanes.c, qdot_avx2.c).
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
 * size and its offsets stay the file's: bytes 64q + 4j..+3 of the step's
 * codes are nibble bytes 4q..4q+3 of block j (q < 4, j < 16), and bytes
 * 2j, 2j + 1 of its scales are block j's f16 scale, the scales after the
 * codes or, where the step starts mid-line, before them, so that the codes
 * start on a line (internal.h, lm_lanes_codes); a row's last m < 16 blocks
 * are a step of their own in the same order (vectors of 4m bytes, then m
 * scales).  Only matrices whose rows come 16 at a time and
 * hold a step at least are rearranged, and only where
 * the kernels that read them run (AVX-512 with VBMI, or AVX2; where AMX takes the
 * prompts, its rows are transposed straight from the layout, qgemm_amx.c);
 * any other path unpacks a row to the file's layout before reading it.
 * (Xeon with AMX, two threads: tinyllama Q4_0 generation 41 -> 49 t/s,
 * prompts of 3-9 tokens 12-20% faster, of 14-512 level; at the tuned
 * prefetch distance 10%, 45-46 -> 50-51 t/s.)  qwen2.5-0.5b Q4_0 (896
 * columns, a step and 12 blocks; its tied embeddings, the largest matrix,
 * included): with the last blocks left as the file has them, generation
 * level and 6-token prompts 8% faster; with them in a short step of their
 * own, generation 92-96 -> 103-106 t/s and 6-token prompts 358-370 ->
 * 389-406, 512-token ones level.  Where AVX2 is the widest, its kernels
 * read the layout too (qdot_avx2.c, qgemm_avx2.c): one token's eight blocks
 * a step without the four inserts and eight unpacks that transpose the
 * file's, which on a core that splits 256-bit operations in two (Zen 1)
 * had set the pace instead of memory: tinyllama Q4_0 generating 27-28 ->
 * 33-35 t/s, qwen2.5-0.5b Q4_0 41-43 -> 51-52; prompts level.
 *
 * Q5_0 (AVX2 only): the same steps of 16 blocks (22 bytes each), the
 * nibble vectors as Q4_0's, then each block's 32 fifth bits with code c's
 * at bit 8(c % 4) + c / 4, then the scales (internal.h has the places).
 * Read from the file, eight blocks cost the AVX2 kernel four transposing
 * unpacks, eight inserts of their fifth bits and a shuffle, an and and a
 * compare a code vector to spread them; laid out, four loads and a shift
 * and a mask a vector (qdot_avx2.c: 256 rows of 2048 from L2, one core,
 * 82 -> 34 us).  Zen 1, two threads: qwen2.5-0.5b Q4_K_M (its Q5_0 rows
 * of 896 columns, a step and 12 blocks) generates 26.3-28.4 -> 29.5-31.2
 * t/s; smollm2-135m Q4_K_M (576 columns) and prompts level.  Q5_1 (24-byte
 * blocks, Q5_K's fallback where rows cannot hold super-blocks) the same,
 * its mins after the scales: smollm2 Q5_1 generating 73-77 -> 86-96 t/s.
 *
 * Q8_0 (AVX-512 with VBMI, no AMX): a whole step's 16 blocks with the
 * codes as vectors, block j's codes 4q..4q+3 at 64q + 4j, then the scales
 * (or the scales first, where that puts the codes on a line's start:
 * internal.h, lm_lanes_codes); a row's last blocks past its whole
 * steps stay as the file has them.  As the file has them a step cost the
 * one-token kernel three rounds of eight two-table permutes to transpose
 * (rows of 2048 from L2, one thread: 44 -> 65 GB/s laid out); a batch
 * transposes each step back once a row (qgemm.c, q8_0_lanes_step).
 *
 * Q4_K and Q6_K: a super-block's 256 codes come in groups (8 of 32, 16 of
 * 16) with a scale each.  As the file has them, a 32-bit lane of the
 * multiply-add holds 4 codes of one group and a group spans several lanes,
 * so every 64 products must meet their scales and then be added across
 * the vector, super-block by super-block, which costs more than the
 * products.  Rearranged in steps of 4 super-blocks, lane 4b + g of every
 * code vector holds 4 codes of one group of super-block b, a further 4
 * each chunk: a lane adds up its groups by itself, and a step's four
 * super-blocks meet their scales in a few multiplies (Zen 4, one thread,
 * 2048 columns from L2: Q4_K 14.9 -> 7.8 ticks a super-block, Q6_K 20.2
 * -> 15.4 through lm_matmul).  A step keeps its 4 super-blocks' bytes
 * (k_to_lanes below has the places); a row's last k/256 mod 4
 * super-blocks stay as they are, and only where AVX2 is the widest may a
 * row end so (layout_for).  Only where the kernels that read them run (AVX-512
 * with VBMI and GFNI; AMX's tiles take a step's codes transposed back to
 * their order, qrow_k.c; and Q4_K where AVX2 is the widest,
 * qrow_klanes_avx2.c, whose batches unpack it in qgemm_avx2.c); Q6_K only
 * where the CPU has AMX (lm_lanes_plan says why).  On the
 * Xeon with AMX (2026-11-25, two threads) tinyllama Q4_K_M generates
 * 40.1-40.9 -> 46.3-46.5 t/s, and pays for it in short prompts, where the
 * few-token kernels here are slower than the file's on that core: 6
 * tokens 125-131 -> 105-110 t/s, 14 tokens 168-176 -> 154, 512 level;
 * qwen2.5-0.5b Q4_K_M (only ffn_down in the layout) generates level, 14
 * tokens 8% and 512 3% slower.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define STEP_BLOCKS 16

/*
 * A Q4_0 step of m blocks (the file's 18m bytes; m = 16 but for a row's
 * last) or a whole Q8_0 step (34 bytes a block) into the lanes layout, in
 * place: vector q (4m bytes) of the codes holds code bytes 4q..4q+3 of
 * block j at 4j (4 vectors of Q4_0's nibble bytes, 8 of Q8_0's codes), and
 * the m f16 scales come after the codes (or before them: internal.h,
 * lm_lanes_codes).
 */
static void b32_to_lanes(uint32_t t, uint8_t *step, int m)
{
    const int bs = lm_b32_block_bytes(t), vectors = t == LM_Q8_0 ? 8 : 4;
    uint8_t in[LM_Q8_0_STEP_BYTES];
    memcpy(in, step, (size_t)bs * (size_t)m);
    uint8_t *codes = step + lm_lanes_codes(t, step, m), *scales = step + lm_lanes_scales(t, step, m);
    for (int j = 0; j < m; j++) {
        const uint8_t *blk = in + bs * j;
        for (int q = 0; q < vectors; q++)
            memcpy(codes + 4 * m * q + 4 * j, blk + 2 + 4 * q, 4);
        memcpy(scales + 2 * j, blk, 2);
    }
}

/* The inverse: a step of m blocks of type t in the lanes layout into the file's layout at out. */
static void b32_step_from_lanes(uint32_t t, const uint8_t *step, uint8_t *out, int m)
{
    const int bs = lm_b32_block_bytes(t), vectors = t == LM_Q8_0 ? 8 : 4;
    const uint8_t *codes = step + lm_lanes_codes(t, step, m), *scales = step + lm_lanes_scales(t, step, m);
    for (int j = 0; j < m; j++) {
        for (int q = 0; q < vectors; q++)
            memcpy(out + bs * j + 2 + 4 * q, codes + 4 * m * q + 4 * j, 4);
        memcpy(out + bs * j, scales + 2 * j, 2);
    }
}

void lm_q4_0_step_from_lanes(const uint8_t *step, uint8_t *out, int m)
{
    b32_step_from_lanes(LM_Q4_0, step, out, m);
}

/* A row of k columns in the lanes layout back into the file's layout at dst. */
void lm_q4_0_from_lanes(const uint8_t *row, uint8_t *dst, int64_t k)
{
    const int64_t nb = k / 32;
    for (int64_t b = 0; b < nb; b += STEP_BLOCKS)
        lm_q4_0_step_from_lanes(row + 18 * b, dst + 18 * b, lm_lanes_step_blocks(nb, b));
}

/* A Q8_0 row in the lanes layout back into the file's layout at dst (the blocks past its whole steps as they are). */
static void q8_0_from_lanes(const uint8_t *row, uint8_t *dst, int64_t k)
{
    const int64_t whole = k / 32 / STEP_BLOCKS;
    for (int64_t s = 0; s < whole; s++)
        b32_step_from_lanes(LM_Q8_0, row + LM_Q8_0_STEP_BYTES * s, dst + LM_Q8_0_STEP_BYTES * s, STEP_BLOCKS);
    memcpy(dst + LM_Q8_0_STEP_BYTES * whole, row + LM_Q8_0_STEP_BYTES * whole, (size_t)(k / 32 % STEP_BLOCKS) * 34);
}

/*
 * Q5_0's 32 fifth bits with code c's moved to bit 8(c % 4) + c / 4, and
 * back.  Codes 4r..4r+3 (nibble r) go to bit r of bytes 0-3, a table
 * entry a nibble: a bit at a time, the copy of qwen2.5-0.5b Q4_K_M's 13.6
 * million Q5_0 blocks spent 673 ms on this, a nibble at a time 116.
 */
static uint32_t fifth_bits_spread(uint32_t qh)
{
    static const uint32_t to_bytes[16] = {
        0x0000000, 0x0000001, 0x0000100, 0x0000101, 0x0010000, 0x0010001, 0x0010100, 0x0010101,
        0x1000000, 0x1000001, 0x1000100, 0x1000101, 0x1010000, 0x1010001, 0x1010100, 0x1010101,
    };
    uint32_t o = 0;
    for (int r = 0; r < 8; r++)
        o |= to_bytes[qh >> (4 * r) & 15] << r;
    return o;
}

static uint32_t fifth_bits_gathered(uint32_t o)
{
    uint32_t qh = 0;
    for (int c = 0; c < 32; c++)
        qh |= (o >> (8 * (c % 4) + c / 4) & 1u) << c;
    return qh;
}

/*
 * A Q5_0 or Q5_1 (t) step of m blocks (the file's bytes) into its lanes
 * layout, in place (internal.h has the places).  A block's fifth bits
 * follow its scale (and min), then come its 16 bytes of nibbles.
 */
static void q5_to_lanes(uint8_t *step, int m, uint32_t t)
{
    const int bs = lm_b32_block_bytes(t), at = lm_q5_fifth_at(t), five_one = t == LM_Q5_1;
    uint8_t in[24 * STEP_BLOCKS];
    memcpy(in, step, (size_t)bs * (size_t)m);
    for (int j = 0; j < m; j++) {
        const uint8_t *blk = in + bs * j;
        uint32_t qh;
        memcpy(&qh, blk + at, 4);
        qh = fifth_bits_spread(qh);
        for (int q = 0; q < 4; q++)
            memcpy(step + 4 * m * q + 4 * j, blk + at + 4 + 4 * q, 4);
        memcpy(step + LM_Q5_0_FIFTH(m) + 4 * j, &qh, 4);
        memcpy(step + lm_lanes_scales(t, step, m) + 2 * j, blk, 2);
        if (five_one)
            memcpy(step + LM_Q5_1_MINS(m) + 2 * j, blk + 2, 2);
    }
}

static void q5_from_lanes(const uint8_t *row, uint8_t *dst, int64_t k, uint32_t t)
{
    const int bs = lm_b32_block_bytes(t), at = lm_q5_fifth_at(t), five_one = t == LM_Q5_1;
    const int64_t nb = k / 32;
    for (int64_t b = 0; b < nb; b += STEP_BLOCKS) {
        const int m = lm_lanes_step_blocks(nb, b);
        const uint8_t *step = row + bs * b;
        for (int j = 0; j < m; j++) {
            uint8_t *out = dst + bs * (b + j);
            uint32_t qh;
            memcpy(&qh, step + LM_Q5_0_FIFTH(m) + 4 * j, 4);
            qh = fifth_bits_gathered(qh);
            memcpy(out, step + lm_lanes_scales(t, step, m) + 2 * j, 2);
            if (five_one)
                memcpy(out + 2, step + LM_Q5_1_MINS(m) + 2 * j, 2);
            memcpy(out + at, &qh, 4);
            for (int q = 0; q < 4; q++)
                memcpy(out + at + 4 + 4 * q, step + 4 * m * q + 4 * j, 4);
        }
    }
}

/*
 * The K-quant layouts' codes.  Q4_K (step 576 bytes): chunk c (0-7) at
 * 64 + 64c, code 4c + i of group g (low nibble) and g + 4 (high) of
 * super-block b at byte 4(4b + g) + i; super-block b's 16 bytes of d, dmin
 * and scales at 16b.  Q6_K (step 840): set s (groups 4s..4s+3), slice j
 * (codes 4j..4j+3 of each group of 16): the low four bits in nibble s % 2
 * of lm_q6_k_lanes_low(j, s / 2), the top two in bits 2s..2s+1 of
 * lm_q6_k_lanes_top(j), byte 4(4b + g) + i each; super-block b's 16 scales
 * and d at 768 + 18b.
 */
/* A super-block's codes u (lm_k_codes') back into its code bytes as the file has them (its scales untouched). */
static void k_file_bytes(uint32_t t, const uint8_t *u, uint8_t *blk)
{
    if (t == LM_Q4_K) {
        for (int p = 0; p < 4; p++)
            for (int l = 0; l < 32; l++)
                blk[16 + 32 * p + l] = (uint8_t)(u[64 * p + l] | u[64 * p + 32 + l] << 4);
        return;
    }
    for (int n = 0; n < 2; n++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *q = u + 128 * n + l;
            blk[64 * n + l] = (uint8_t)((q[0] & 15) | (q[64] & 15) << 4);
            blk[64 * n + 32 + l] = (uint8_t)((q[32] & 15) | (q[96] & 15) << 4);
            blk[128 + 32 * n + l] = (uint8_t)(q[0] >> 4 | (q[32] >> 4) << 2 | (q[64] >> 4) << 4 | (q[96] >> 4) << 6);
        }
}

/* A step's code bytes in the lanes layout from its 4 super-blocks' codes (lane = 4(4b + g) + i). */
static void k_lanes_bytes(uint32_t t, uint8_t u[4][256], uint8_t *step)
{
    if (t == LM_Q4_K) { /* chunk c: code 4c + i of group g (low nibble), g + 4 (high) */
        for (int c = 0; c < 8; c++)
            for (int b = 0; b < 4; b++)
                for (int g = 0; g < 4; g++)
                    for (int i = 0; i < 4; i++)
                        step[64 + 64 * c + 4 * (4 * b + g) + i] =
                            (uint8_t)(u[b][32 * g + 4 * c + i] | u[b][32 * (g + 4) + 4 * c + i] << 4);
        return;
    }
    for (int j = 0; j < 4; j++) /* Q6_K slice j: group g of set s is q[64 s] */
        for (int b = 0; b < 4; b++)
            for (int g = 0; g < 4; g++)
                for (int i = 0; i < 4; i++) {
                    const int lane = 4 * (4 * b + g) + i;
                    const uint8_t *q = u[b] + 16 * g + 4 * j + i;
                    step[lm_q6_k_lanes_low(j, 0) + lane] = (uint8_t)((q[0] & 15) | (q[64] & 15) << 4);
                    step[lm_q6_k_lanes_low(j, 1) + lane] = (uint8_t)((q[128] & 15) | (q[192] & 15) << 4);
                    step[lm_q6_k_lanes_top(j) + lane] =
                        (uint8_t)(q[0] >> 4 | (q[64] >> 4) << 2 | (q[128] >> 4) << 4 | (q[192] >> 4) << 6);
                }
}

/* The inverse: a step's 4 super-blocks' codes from its code bytes in the lanes layout. */
static void k_lanes_codes(uint32_t t, const uint8_t *step, uint8_t u[4][256])
{
    if (t == LM_Q4_K) {
        for (int c = 0; c < 8; c++)
            for (int b = 0; b < 4; b++)
                for (int g = 0; g < 4; g++)
                    for (int i = 0; i < 4; i++) {
                        const uint8_t x = step[64 + 64 * c + 4 * (4 * b + g) + i];
                        u[b][32 * g + 4 * c + i] = x & 15, u[b][32 * (g + 4) + 4 * c + i] = x >> 4;
                    }
        return;
    }
    for (int j = 0; j < 4; j++)
        for (int b = 0; b < 4; b++)
            for (int g = 0; g < 4; g++)
                for (int i = 0; i < 4; i++) {
                    const int lane = 4 * (4 * b + g) + i;
                    const uint8_t lo = step[lm_q6_k_lanes_low(j, 0) + lane], hi = step[lm_q6_k_lanes_low(j, 1) + lane];
                    const uint8_t top = step[lm_q6_k_lanes_top(j) + lane];
                    uint8_t *q = u[b] + 16 * g + 4 * j + i;
                    q[0] = (uint8_t)((lo & 15) | (top & 3) << 4);
                    q[64] = (uint8_t)((lo >> 4) | (top >> 2 & 3) << 4);
                    q[128] = (uint8_t)((hi & 15) | (top >> 4 & 3) << 4);
                    q[192] = (uint8_t)((hi >> 4) | (top >> 6) << 4);
                }
}

/* A K-quant row of k columns into its lanes layout, in place (the super-blocks past whole steps stay). */
static void k_to_lanes(uint32_t t, uint8_t *row, int64_t k)
{
    const size_t bs = lm_type_size(t), step_bytes = 4 * bs;
    for (int64_t s = 0; s < k / 1024; s++) {
        uint8_t *step = row + step_bytes * s, head[4][18], u[4][256];
        for (int b = 0; b < 4; b++) {
            size_t hs, hb, hn;
            lm_klanes_header(t, b, &hs, &hb, &hn);
            memcpy(head[b], step + bs * b + hb, hn);
            lm_k_codes(t, step + bs * b, u[b]);
        }
        k_lanes_bytes(t, u, step);
        for (int b = 0; b < 4; b++) {
            size_t hs, hb, hn;
            lm_klanes_header(t, b, &hs, &hb, &hn);
            memcpy(step + hs, head[b], hn);
        }
        const size_t h = t == LM_Q6_K ? lm_q6_k_lanes_codes(step) : 0;
        if (h) { /* the codes from the step's first line start, the header around them (internal.h) */
            uint8_t in[LM_Q6_K_STEP_BYTES];
            memcpy(in, step, sizeof in);
            memcpy(step, in + 768, h);
            memcpy(step + h, in, 768);
        }
    }
}

/* A K-quant row in its lanes layout back into the file's layout at dst. */
static void k_from_lanes(uint32_t t, const uint8_t *row, uint8_t *dst, int64_t k)
{
    const size_t bs = lm_type_size(t), step_bytes = 4 * bs;
    const int64_t whole = k / 1024;
    for (int64_t s = 0; s < whole; s++) {
        const uint8_t *step = row + step_bytes * s;
        uint8_t *out = dst + step_bytes * s, u[4][256], in_order[LM_Q6_K_STEP_BYTES];
        const size_t h = t == LM_Q6_K ? lm_q6_k_lanes_codes(step) : 0;
        if (h) { /* back in lm_klanes_header's places, the codes from 0 */
            memcpy(in_order, step + h, 768);
            memcpy(in_order + 768, step, h);
            memcpy(in_order + 768 + h, step + 768 + h, 72 - h);
            step = in_order;
        }
        k_lanes_codes(t, step, u);
        for (int b = 0; b < 4; b++) {
            size_t hs, hb, hn;
            lm_klanes_header(t, b, &hs, &hb, &hn);
            memcpy(out + bs * b + hb, step + hs, hn);
            k_file_bytes(t, u[b], out + bs * b);
        }
    }
    memcpy(dst + step_bytes * whole, row + step_bytes * whole, (size_t)(k / 256 % 4) * bs);
}

/* The tensor type a rearranged layout holds (0 for the file's, which holds any). */
uint32_t lm_layout_type(int layout)
{
    return layout == LM_LAYOUT_Q4_0_LANES   ? LM_Q4_0
           : layout == LM_LAYOUT_Q4_K_LANES ? LM_Q4_K
           : layout == LM_LAYOUT_Q6_K_LANES ? LM_Q6_K
           : layout == LM_LAYOUT_Q5_0_LANES ? LM_Q5_0
           : layout == LM_LAYOUT_Q5_1_LANES ? LM_Q5_1
           : layout == LM_LAYOUT_Q8_0_LANES ? LM_Q8_0
                                            : 0;
}

/* The bytes a layout rearranges at once: a row. */
size_t lm_layout_unit(int layout, int64_t k)
{
    return lm_row_bytes(lm_layout_type(layout), k);
}

void lm_layout_apply(int layout, uint8_t *unit, int64_t k)
{
    if (layout == LM_LAYOUT_Q4_0_LANES)
        for (int64_t b = 0; b < k / 32; b += STEP_BLOCKS)
            b32_to_lanes(LM_Q4_0, unit + 18 * b, lm_lanes_step_blocks(k / 32, b));
    else if (layout == LM_LAYOUT_Q8_0_LANES) /* whole steps only: a row's last blocks stay as they are */
        for (int64_t s = 0; s < k / 32 / STEP_BLOCKS; s++)
            b32_to_lanes(LM_Q8_0, unit + LM_Q8_0_STEP_BYTES * s, STEP_BLOCKS);
    else if (layout == LM_LAYOUT_Q5_0_LANES || layout == LM_LAYOUT_Q5_1_LANES) {
        const uint32_t t = lm_layout_type(layout);
        for (int64_t b = 0; b < k / 32; b += STEP_BLOCKS)
            q5_to_lanes(unit + lm_b32_block_bytes(t) * b, lm_lanes_step_blocks(k / 32, b), t);
    }
    else if (layout != LM_LAYOUT_FILE)
        k_to_lanes(lm_layout_type(layout), unit, k);
}

void lm_layout_undo(int layout, const uint8_t *row, uint8_t *dst, int64_t k)
{
    if (layout == LM_LAYOUT_Q4_0_LANES)
        lm_q4_0_from_lanes(row, dst, k);
    else if (layout == LM_LAYOUT_Q8_0_LANES)
        q8_0_from_lanes(row, dst, k);
    else if (layout == LM_LAYOUT_Q5_0_LANES || layout == LM_LAYOUT_Q5_1_LANES)
        q5_from_lanes(row, dst, k, lm_layout_type(layout));
    else
        k_from_lanes(lm_layout_type(layout), row, dst, k);
}

/* Row i of t as floats, whatever its layout (scratch: a row's bytes, for a rearranged one). */
void lm_tensor_row_f32(const lm_tensor *t, int64_t i, float *out, uint8_t *scratch)
{
    const uint8_t *row = (const uint8_t *)t->data + (size_t)i * lm_row_bytes(t->type, t->ne[0]);
    if (t->layout != LM_LAYOUT_FILE) {
        lm_layout_undo(t->layout, row, scratch, t->ne[0]);
        row = scratch;
    }
    lm_dequant_row(t->type, row, out, t->ne[0]);
}

/*
 * Whether this machine's kernels read rearranged Q4_0 rows natively: AVX-512
 * VBMI's (qrow_vbmi.c), or AVX2's where it is the widest (qdot_avx2.c,
 * qgemm_avx2.c).  KVCHAT_ISA forces other paths.
 */
int lm_lanes_layout_native(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    return !getenv("KVCHAT_ISA") && ((lm_cpu_isa() >= LM_ISA_AVX512 && lm_cpu_vbmi()) || lm_cpu_isa() == LM_ISA_AVX2);
#else
    return 0; /* its kernels are AVX-512 VBMI ones */
#endif
}

/*
 * Whether rearranged rows of type t (Q4_K or Q6_K) are read natively:
 * both with AVX-512 VBMI and GFNI (qrow_klanes.c); Q4_K where AVX2 is the
 * widest (qrow_klanes_avx2.c).
 */
int lm_klanes_layout_native(uint32_t t)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (getenv("KVCHAT_ISA"))
        return 0;
    return lm_cpu_gfni() || (t == LM_Q4_K && lm_cpu_isa() == LM_ISA_AVX2);
#else
    (void)t;
    return 0;
#endif
}

/*
 * Whether rearranged Q8_0 rows are read natively: by AVX-512 VBMI's
 * kernels (qrow_vbmi.c; a batch's groups, qgemm.c), where AMX does not
 * take the prompts (its tiles read Q8_0 rows as the file has them).
 */
int lm_q8_0_lanes_native(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    return !getenv("KVCHAT_ISA") && lm_cpu_isa() >= LM_ISA_AVX512 && lm_cpu_vbmi() && !lm_cpu_amx();
#else
    return 0;
#endif
}

/* Whether rearranged Q5_0 rows are read natively: where AVX2 is the widest (qdot_avx2.c, qgemm_avx2.c). */
int lm_q5_0_lanes_native(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    return !getenv("KVCHAT_ISA") && lm_cpu_isa() == LM_ISA_AVX2;
#else
    return 0;
#endif
}

/*
 * The layout tensor t takes where the kernels read both natively: Q4_0
 * (and Q8_0) matrices of a step a row at least, in rows that come 16 at a time, Q5_0
 * matrices of a step a row at least, Q4_K ones (and Q6_K ones where the
 * CPU has AMX) of whole steps (4 super-blocks; where AVX2 is the widest, k_tails, Q4_K ones whose
 * whole steps hold three quarters of a row at least); the embeddings only where
 * they are also the output matrix (tied), as a lookup reads one row a
 * token and unpacks it first.
 */
static int layout_for(const gguf_tensor *t, int q4_0, int q8_0, int q4_k, int q6_k, int q5_0, int k_tails, int tied)
{
    for (uint32_t i = 2; i < t->n_dims; i++)
        if (t->ne[i] != 1)
            return LM_LAYOUT_FILE;
    if (t->n_dims < 2 || t->ne[1] <= 0 || (strcmp(t->name, "token_embd.weight") == 0 && !tied))
        return LM_LAYOUT_FILE;
    const uint64_t rows = (uint64_t)t->ne[1];
    if (q4_0 && t->type == LM_Q4_0 && t->ne[0] % 32 == 0 && t->ne[0] >= 32 * STEP_BLOCKS && rows % 16 == 0 &&
        t->nbytes == rows * (uint64_t)(t->ne[0] / 32 * 18))
        return LM_LAYOUT_Q4_0_LANES;
    if (q8_0 && t->type == LM_Q8_0 && t->ne[0] % 32 == 0 && t->ne[0] >= 32 * STEP_BLOCKS && rows % 16 == 0 &&
        t->nbytes == rows * (uint64_t)(t->ne[0] / 32 * 34))
        return LM_LAYOUT_Q8_0_LANES;
    const int q5 = q5_0 && (t->type == LM_Q5_0 || t->type == LM_Q5_1);
    if (q5 && t->ne[0] % 32 == 0 && t->ne[0] >= 32 * STEP_BLOCKS &&
        t->nbytes == rows * (uint64_t)(t->ne[0] / 32 * lm_b32_block_bytes(t->type)))
        return t->type == LM_Q5_1 ? LM_LAYOUT_Q5_1_LANES : LM_LAYOUT_Q5_0_LANES;
    const int k_quant = (q4_k && t->type == LM_Q4_K) || (q6_k && t->type == LM_Q6_K);
    /* With GFNI, rows of whole steps only: those ending past them (gemma2's 2304, tinyllama's
       ffn_down 5632, qwen2.5's 4864 and 8960) ran faster or level as the file has them, their
       last super-blocks having taken a kernel of their own with a quarter to half of its lanes
       in use (Zen 5, `kvchat bench -p 16,64 -n 32 -r 2`, three alternations: gemma2-2b Q4_K_M
       pp16 60.6-64.2 -> 70.5-71.3, tinyllama Q4_K_M pp16 176-181 -> 184-191, pp64 and tg32 3-5%
       ahead, qwen2.5's level).  Where AVX2 is the widest (k_tails), the file's Q4_K kernel is
       bound by its multiplies (Zen 1: tinyllama Q4_K_M generating at 51% of the machine's reads,
       79-81% in the layout), so there rows take the layout where whole steps hold three
       quarters of them at least, their last super-blocks through lm_k_blocks_avx2 (smollm2's
       ffn_down, a step and half of one more, stays as the file has it). */
    const int steps_fit = t->ne[0] % 1024 == 0 || (k_tails && 4 * (t->ne[0] % 1024) <= t->ne[0]);
    if (k_quant && steps_fit && t->ne[0] % 256 == 0 && t->ne[0] >= 1024 &&
        t->nbytes == rows * (uint64_t)lm_row_bytes(t->type, t->ne[0]))
        return t->type == LM_Q4_K ? LM_LAYOUT_Q4_K_LANES : LM_LAYOUT_Q6_K_LANES;
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
    const int q4_0 = lm_lanes_layout_native(), q4_k = lm_klanes_layout_native(LM_Q4_K);
    /* Q6_K had been kept to AMX CPUs: with its steps' codes across cache lines (840-byte steps),
       the file's GFNI kernel generated faster on the Zen 5 (tinyllama Q6_K 60.0-64.1 against
       55.8-58.0 t/s), though its 16-token prompts ran slower so (165-180 against 198-205).
       With the codes on lines (lm_q6_k_lanes_codes) the layout generates as fast or a few
       percent faster (tinyllama Q6_K, a throwaway build's four rounds: 89-94% of the probe
       against 85-89%) and keeps the short prompts' lead (16 tokens 156-199 against 123-175
       t/s, nine rounds), 512-token ones 3-5% behind (the batch's preparer costs more here) */
    const int q6_k = lm_klanes_layout_native(LM_Q6_K), q5_0 = lm_q5_0_lanes_native();
    const int k_tails = q4_k && !lm_cpu_gfni(); /* AVX2's kernel (qrow_klanes_avx2.c) takes them */
    const int q8_0 = lm_q8_0_lanes_native();
    int tied = 1; /* no output matrix: the embeddings serve as one */
    for (uint64_t i = 0; i < g->n_tensors; i++)
        tied = tied && strcmp(g->tensors[i].name, "output.weight") != 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        const int inside = t->offset <= size && t->nbytes <= size - t->offset;
        layout[i] = (uint8_t)(inside ? layout_for(t, q4_0, q8_0, q4_k, q6_k, q5_0, k_tails, tied) : LM_LAYOUT_FILE);
    }
    return q4_0 || q8_0 || q4_k || q6_k || q5_0 ? keep_alone(g, layout) : 0;
}
