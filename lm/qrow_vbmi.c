/*
 * lm/qrow_vbmi.c - one token through a Q4_0 or Q5_0 row read front to
 * back, and a few tokens (2-19, a short chat turn) through Q4_0, Q5_0 or
 * Q8_0 rows, where the CPU has AVX-512 VBMI (byte permutes) besides VNNI.
 *
 * Generating a token reads every weight once, so the kernel must finish a
 * row faster than memory delivers it, and read in the order the hardware
 * prefetcher follows.  The 16-row kernel of qdot_simd.c reads 16 rows side
 * by side, which the prefetcher does not follow; one_b32 reads a row in
 * order but spends about 6 vector operations per block building its codes.
 * Here two loads cover 4 blocks (72 bytes), and one byte permute gathers
 * their 64 bytes of nibbles.  The token's codes were laid out once in the
 * same order (lm_act_windows: per window of 4 blocks, codes 0-15 of each,
 * then codes 16-31), so two vpdpbusd give 4 lanes per block, and folding
 * them (fold_fours) gives 16 blocks' exact sums in lanes 0-15.  Those
 * take lm_dot_b32_scalar's float steps (block b into lane b % 16, then the
 * lane tree), so the result is bitwise the scalar one.  Q4_0's steps
 * keep block 4w + i in lane 4i + w until the row's last whole window
 * (step_q4_0_transposed): each lane still sums one block's products in
 * order, and a permute a row instead of a step puts them back.  Q5_0 windows are
 * 88 bytes; one more byte permute puts each block's 32 bits of qh in two
 * quadwords, and a bit shuffle (BITALG) a half picks each code's fifth bit
 * into a mask that adds 16 (two permutes and two tests before: rows of
 * 2048, one thread, hot, 36.5 -> 39.3 billion weights a second).
 */
#include "internal.h"
#include "simd.h"

#include <stdlib.h>
#include <string.h>

/* The token's codes and corrections in window order; zeros past the last block. */
void lm_act_windows(act_row *a)
{
    const int64_t nb = a->k / 32, nw = (nb + 3) / 4;
    memset(a->qw, 0, (size_t)nw * 128);
    memset(a->ncw, 0, (size_t)nw * 16 * sizeof *a->ncw);
    memset(a->dt, 0, (size_t)(nb + 15) / 16 * 16 * sizeof *a->dt);
    for (int64_t b = 0; b < nb; b++) {
        int64_t j = b / 4, i = b % 4;
        memcpy(a->qw + 128 * j + 16 * i, a->qs + 32 * b, 16);
        memcpy(a->qw + 128 * j + 64 + 16 * i, a->qs + 32 * b + 16, 16);
        for (int q = 0; q < 4; q++)
            a->ncw[16 * j + 4 * i + q] = a->negcorr[8 * b + q] + a->negcorr[8 * b + 4 + q];
        a->dt[b / 16 * 16 + 4 * (b % 4) + b % 16 / 4] = a->d[b]; /* the lane of fold_fours_transposed */
    }
    a->windows = 1;
}

/*
 * The token's codes for a few tokens through Q4_0, Q5_0 or Q8_0 rows (lm_rows_lanes_vbmi):
 * per step of 16 blocks, 8 vectors of 64 bytes, vector q holding codes
 * 4q..4q+3 of block j in lane j; ncw lane j the block's whole negcorr.
 * Zeros past the last block.
 */
void lm_act_lanes(act_row *a)
{
    const int64_t nb = a->k / 32, ns = (nb + 15) / 16;
    memset(a->qw, 0, (size_t)ns * 512);
    memset(a->ncw, 0, (size_t)ns * 16 * sizeof *a->ncw);
    for (int64_t b = 0; b < nb; b++) {
        int8_t *step = a->qw + 512 * (b / 16) + 4 * (b % 16);
        int32_t nc = 0;
        for (int q = 0; q < 8; q++) {
            memcpy(step + 64 * q, a->qs + 32 * b + 4 * q, 4);
            nc += a->negcorr[8 * b + q];
        }
        a->ncw[b] = nc;
    }
    a->lanes = 1;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>

#define VBMI X86_TARGET("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx512vbmi,avx512bitalg")

int lm_cpu_vbmi(void)
{
    unsigned a, b, c, d;
    if (lm_cpu_isa() < LM_ISA_AVX512 || !__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
#ifdef LM_EMULATE_AVX512 /* a Zen 4's, Ice Lake's or (spr) Sapphire Rapids'; KVCHAT_EMULATE=novbmi: a Cascade Lake's */
    const char *emu = getenv("KVCHAT_EMULATE");
    return !(emu && !strcmp(emu, "novbmi"));
#endif
    return (c >> 1) & (c >> 12) & 1; /* VBMI and BITALG (Q5_0's fifth bits); VNNI is part of LM_ISA_AVX512 */
}

/* A mask of the first n (1..63) bytes. */
static inline __mmask64 first_bytes(int64_t n)
{
    return ~0ull >> (64 - n);
}

/*
 * Window j (blocks 4j..4j+3, the first `live` of them in the row) of a
 * Q4_0 (18-byte blocks: f16 scale, 16 bytes of nibbles) or Q5_0 row
 * (22-byte blocks: f16 scale, 4 bytes of fifth bits, then the nibbles):
 * the exact sums of each block in lanes 4i..4i+3, and the blocks' f16
 * scales merged into words 4(j % 4)..+3 of *sc, or, given first64, the
 * window's first 64 bytes there for the caller to gather them.
 */
VBMI static INLINE __m512i window_sums(uint32_t t, const uint8_t *row, const act_row *a, int64_t j, int live,
                                       __m512i *sc, __m512i *first64)
{
    /* Q4_0: nibbles of block i at bytes 18i+2..18i+17 of the window; bytes past 63 come
       from the second load, which starts at byte 8 so as to end with the window.
       Q5_0: at bytes 22i+6..22i+21; the second load starts at byte 24. */
    const __m512i nib4 = _mm512_set_epi8(
        127, 126, 125, 124, 123, 122, 121, 120, 119, 118, 117, 116, 115, 114, 113, 112,
        53, 52, 51, 50, 49, 48, 47, 46, 45, 44, 43, 42, 41, 40, 39, 38,
        35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20,
        17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2);
    const __m512i nib5 = _mm512_set_epi8(
        127, 126, 125, 124, 123, 122, 121, 120, 119, 118, 117, 116, 115, 114, 113, 112,
        105, 104, 63, 62, 61, 60, 59, 58, 57, 56, 55, 54, 53, 52, 51, 50,
        43, 42, 41, 40, 39, 38, 37, 36, 35, 34, 33, 32, 31, 30, 29, 28,
        21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6);
    const __m512i scale4 = _mm512_set_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        55, 54, 37, 36, 19, 18, 1, 0, 55, 54, 37, 36, 19, 18, 1, 0,
        55, 54, 37, 36, 19, 18, 1, 0, 55, 54, 37, 36, 19, 18, 1, 0);
    const __m512i scale5 = _mm512_set_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        107, 106, 45, 44, 23, 22, 1, 0, 107, 106, 45, 44, 23, 22, 1, 0,
        107, 106, 45, 44, 23, 22, 1, 0, 107, 106, 45, 44, 23, 22, 1, 0);
    const int q5 = t == LM_Q5_0, bs = q5 ? 22 : 18, second = q5 ? 24 : 8;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __mmask64 words = (__mmask64)0xff << (8 * (j % 4));
    const uint8_t *w = row + (size_t)(4 * bs) * j;
    __m512i lo_bytes, hi_bytes;
    if (live == 4) {
        lo_bytes = _mm512_loadu_si512(w);
        hi_bytes = _mm512_loadu_si512(w + second);
    } else { /* the row's last 1-3 blocks: nothing past them is read */
        int n = bs * live;
        if (n < 64) {
            lo_bytes = _mm512_maskz_loadu_epi8(first_bytes(n), w);
            hi_bytes = _mm512_setzero_si512();
        } else { /* three Q5_0 blocks: 66 bytes */
            lo_bytes = _mm512_loadu_si512(w);
            hi_bytes = _mm512_maskz_loadu_epi8(first_bytes(n - second), w + second);
        }
    }
    __m512i x = _mm512_permutex2var_epi8(lo_bytes, q5 ? nib5 : nib4, hi_bytes);
    if (first64) /* the caller gathers the scales (step_q4_0_transposed) */
        *first64 = lo_bytes;
    else if (q5)
        *sc = _mm512_mask_mov_epi8(*sc, words, _mm512_permutex2var_epi8(lo_bytes, scale5, hi_bytes));
    else
        *sc = _mm512_mask_permutexvar_epi8(*sc, words, scale4, lo_bytes);
    __m512i lo = _mm512_and_si512(x, m4), hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
    if (q5) { /* bit j of a block's qh is the fifth bit of its code j: 0-15 low nibbles, 16-31 high */
        /* quadwords 2i and 2i + 1: block i's 32 bits of qh (window bytes 22i + 2.., block 3's from the second load) */
        const __m512i qh = _mm512_set_epi8(
            111, 110, 109, 108, 111, 110, 109, 108, 111, 110, 109, 108, 111, 110, 109, 108,
            49, 48, 47, 46, 49, 48, 47, 46, 49, 48, 47, 46, 49, 48, 47, 46,
            27, 26, 25, 24, 27, 26, 25, 24, 27, 26, 25, 24, 27, 26, 25, 24,
            5, 4, 3, 2, 5, 4, 3, 2, 5, 4, 3, 2, 5, 4, 3, 2);
        /* byte 16i + j of x holds codes j and 16 + j of block i: bits j, 16 + j of its quadword */
        const __m512i bit_lo = _mm512_set_epi8(
            15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0,
            15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        const __m512i bit_hi = _mm512_add_epi8(bit_lo, _mm512_set1_epi8(16)), m10 = _mm512_set1_epi8(0x10);
        const __m512i q = _mm512_permutex2var_epi8(lo_bytes, qh, hi_bytes);
        lo = _mm512_mask_add_epi8(lo, _mm512_bitshuffle_epi64_mask(q, bit_lo), lo, m10);
        hi = _mm512_mask_add_epi8(hi, _mm512_bitshuffle_epi64_mask(q, bit_hi), hi, m10);
    }
    __m512i v = _mm512_dpbusd_epi32(_mm512_loadu_si512(a->ncw + 16 * j), lo, _mm512_loadu_si512(a->qw + 128 * j));
    return _mm512_dpbusd_epi32(v, hi, _mm512_loadu_si512(a->qw + 128 * j + 64));
}

/*
 * A whole Q4_0 step with its 16 blocks in fold_fours_transposed's lanes
 * (block 4w + i in lane 4i + w), so that no permute puts each step's sums
 * in order: the scales are gathered in that order (two two-table byte
 * permutes and a blend, where a permute a window took four), the token's
 * block scales were laid out so (a->dt), and row_b32 puts the lanes in
 * order once a row.  This core issues one 512-bit shuffle a cycle; a step
 * had 12, now 9.
 */
VBMI static INLINE __m512 step_q4_0_transposed(const uint8_t *row, const act_row *a, int64_t b, int nwin, __m512 acc)
{
    /* word 4i + w: the scale of block i of window w, at byte 18i of its first 64 (w odd: table 2) */
    const __m512i pick = _mm512_set_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        119, 118, 55, 54, 119, 118, 55, 54, 101, 100, 37, 36, 101, 100, 37, 36,
        83, 82, 19, 18, 83, 82, 19, 18, 65, 64, 1, 0, 65, 64, 1, 0);
    __m512i v[4], first[4];
#pragma GCC unroll 4
    for (int jj = 0; jj < 4; jj++) /* a row's last step: nwin whole windows, the rest not read */
        v[jj] = jj < nwin ? window_sums(LM_Q4_0, row, a, b / 4 + jj, 4, NULL, &first[jj])
                          : (first[jj] = _mm512_setzero_si512());
    __m512i s01 = _mm512_permutex2var_epi8(first[0], pick, first[1]); /* windows 0, 1: words 4i, 4i + 1 */
    __m512i s23 = nwin > 2 ? _mm512_permutex2var_epi8(first[2], pick, first[3]) : s01; /* 2, 3: 4i + 2, 4i + 3 */
    __m512i sc = _mm512_mask_mov_epi8(s01, (__mmask64)0xf0f0f0f0u, s23);
    __m512 dd = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(sc)), _mm512_loadu_ps(a->dt + b));
    __m512 sums = _mm512_cvtepi32_ps(fold_fours_transposed(v[0], v[1], v[2], v[3]));
    if (nwin == 4)
        return _mm512_fmadd_ps(dd, sums, acc);
    const __mmask16 live = (__mmask16)(0x1111u * ((1u << nwin) - 1)); /* lane 4i + w: window w's block i */
    return _mm512_mask3_fmadd_ps(dd, sums, acc, live);
}

/* Blocks b..b+m-1 (m <= 16, b a multiple of 16) scaled into acc's lanes 0..m-1. */
VBMI static INLINE __m512 step(uint32_t t, const uint8_t *row, const act_row *a, int64_t b, int m, __m512 acc)
{
    __m512i v[4], sc = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int jj = 0; jj < 4; jj++) {
        int live = m - 4 * jj;
        v[jj] = live > 0 ? window_sums(t, row, a, b / 4 + jj, live < 4 ? live : 4, &sc, NULL) : _mm512_setzero_si512();
    }
    __m512i sums = fold_fours(v[0], v[1], v[2], v[3]);
    __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(sc));
    if (m == 16)
        return _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_loadu_ps(a->d + b)), _mm512_cvtepi32_ps(sums), acc);
    __mmask16 lanes = (__mmask16)((1u << m) - 1);
    __m512 dd = _mm512_mul_ps(dw, _mm512_maskz_loadu_ps(lanes, a->d + b));
    return _mm512_mask3_fmadd_ps(dd, _mm512_cvtepi32_ps(sums), acc, lanes);
}

VBMI static INLINE float row_b32(uint32_t t, const uint8_t *row, int64_t k, const act_row *a)
{
    const int64_t nb = k / 32;
    const size_t bs = (size_t)lm_b32_block_bytes(t);
    __m512 acc = _mm512_setzero_ps();
    int64_t b = 0;
    if (t == LM_Q4_0) { /* lanes transposed until the last whole window, each lane its block's own sum */
        for (; b + 16 <= nb; b += 16) {
            lm_prefetch_ahead(row + bs * b, bs * 16, 1, a->ahead);
            acc = step_q4_0_transposed(row, a, b, 4, acc);
        }
        if (b < nb && (nb - b) % 4 == 0) { /* rows of 896: 28 blocks, a step and three windows */
            lm_prefetch_ahead(row + bs * b, (size_t)(bs * (nb - b)), 1, a->ahead);
            switch ((nb - b) / 4) {
            case 1: acc = step_q4_0_transposed(row, a, b, 1, acc); break;
            case 2: acc = step_q4_0_transposed(row, a, b, 2, acc); break;
            default: acc = step_q4_0_transposed(row, a, b, 3, acc); break;
            }
            b = nb;
        }
        acc = _mm512_permutexvar_ps(fold_order(), acc);
    }
    for (; b + 16 <= nb; b += 16) {
        lm_prefetch_ahead(row + bs * b, bs * 16, 1, a->ahead);
        acc = step(t, row, a, b, 16, acc);
    }
    if (b < nb) {
        lm_prefetch_ahead(row + bs * b, (size_t)(bs * (nb - b)), 1, a->ahead);
        acc = step(t, row, a, b, (int)(nb - b), acc);
    }
    return hsum16_avx512(acc);
}

/* Rows one after another, each type a function of its own. */
#define ROWS_B32_VARIANT(name, t)                                                                \
    VBMI __attribute__((noinline)) static void name(const uint8_t *row0, size_t rb, int64_t nr,   \
                                                    int64_t k, const act_row *a, float *out)     \
    {                                                                                            \
        for (int64_t r = 0; r < nr; r++)                                                         \
            out[r] = row_b32(t, row0 + (size_t)r * rb, k, a);                                    \
    }
ROWS_B32_VARIANT(rows_q4_0, LM_Q4_0)
ROWS_B32_VARIANT(rows_q5_0, LM_Q5_0)
#undef ROWS_B32_VARIANT

/* a: laid out by lm_act_windows, for the rows' type. */
VBMI void lm_rows_b32_vbmi(uint32_t t, const uint8_t *row0, size_t rb, int64_t nr, int64_t k,
                           const act_row *a, float *out)
{
    (t == LM_Q5_0 ? rows_q5_0 : rows_q4_0)(row0, rb, nr, k, a, out);
}

/*
 * A few tokens through Q4_0, Q5_0 or Q8_0 rows.  With one token, the lanes
 * of a window hold 4 partial sums of a block, added up per step
 * (fold_fours); with several, that adding would be paid per token.
 * Here a step's 16 blocks are laid out once per row with lane j holding 4
 * code bytes of block j: each 128 bytes of the step hold `per` whole
 * blocks (7 of 18 bytes, 5 of 22), and a byte permute a part picks their
 * bytes.  Then each token's 8 vpdpbusd leave every block's exact sum in
 * its own lane, and take lm_dot_b32_scalar's float steps as the other
 * kernels do.  Q8_0's 34-byte blocks would need 6 parts and 48 permutes
 * a step (measured no faster than the fused kernel); their codes are
 * loaded two blocks a vector and transposed instead (q8_0_lanes).
 */

/* Bytes [from, from + 64) of a step of n bytes at w, zeros past n. */
VBMI static INLINE __m512i step_bytes(const uint8_t *w, int from, int n)
{
    if (n >= from + 64)
        return _mm512_loadu_si512(w + from);
    return n > from ? _mm512_maskz_loadu_epi8(first_bytes(n - from), w + from) : _mm512_setzero_si512();
}

/* Blocks of bs bytes whole in each 128 bytes of a step. */
static inline int blocks_per_part(int bs) { return 128 / bs; }

/* Byte c of lane j: byte bs*j + off + c (c < width; else its first) of the step, from its part's start. */
VBMI static INLINE __m512i lane_index(int bs, int off, int width)
{
    const int per = blocks_per_part(bs);
    int8_t ix[64];
    for (int j = 0; j < 16; j++)
        for (int c = 0; c < 4; c++)
            ix[4 * j + c] = (int8_t)(bs * j + off + (c < width ? c : 0) - bs * per * (j / per));
    return _mm512_loadu_si512(ix);
}

/* The index vectors of a type: its codes (4 bytes a lane from byte off), scales, Q5_0's high bits. */
typedef struct lane_ix {
    __m512i codes, scale, qh;
} lane_ix;

VBMI static INLINE lane_ix lane_indexes(uint32_t t)
{
    const int bs = lm_b32_block_bytes(t);
    return (lane_ix){lane_index(bs, t == LM_Q5_0 ? 6 : 2, 4), lane_index(bs, 0, 2), lane_index(bs, 2, 4)};
}

/*
 * Lane j: the 4 bytes of block j that ix points to (src: each part's 128
 * bytes).  Each part's permute writes its lanes over the index vector
 * itself and keeps the rest (vpermi2b), so the next part still finds its
 * indexes there and no merging is needed.
 */
VBMI static INLINE __m512i lanes_pick(const __m512i src[8], int bs, __m512i ix)
{
    const int per = blocks_per_part(bs), parts = (16 + per - 1) / per;
#pragma GCC unroll 4
    for (int p = 0; p < parts; p++) {
        const __mmask64 mine = (~0ull >> (64 - 4 * per)) << (4 * per * p);
        ix = _mm512_mask2_permutex2var_epi8(src[2 * p], ix, mine, src[2 * p + 1]);
    }
    return ix;
}

/*
 * Adds 16 to the codes (byte c of lane j: code 4q + c, or 16 + 4q + c when
 * high) whose qh bit is set: lane j holds block j's 32 bits of qh, so the
 * bit is bit 32 (j % 2) + 16 high + 4q + c of quadword j / 2 (a bit
 * shuffle picks it for every byte at once).
 */
VBMI static INLINE __m512i fifth_bits(__m512i codes, __m512i qh, int q, int high)
{
    const char o = (char)(16 * high + 4 * q);
    const __m512i pick = _mm512_add_epi8(
        _mm512_set_epi8(35, 34, 33, 32, 3, 2, 1, 0, 35, 34, 33, 32, 3, 2, 1, 0, 35, 34, 33, 32, 3, 2, 1, 0,
                        35, 34, 33, 32, 3, 2, 1, 0, 35, 34, 33, 32, 3, 2, 1, 0, 35, 34, 33, 32, 3, 2, 1, 0,
                        35, 34, 33, 32, 3, 2, 1, 0, 35, 34, 33, 32, 3, 2, 1, 0),
        _mm512_set1_epi8(o));
    return _mm512_mask_add_epi8(codes, _mm512_bitshuffle_epi64_mask(qh, pick), codes, _mm512_set1_epi8(0x10));
}

/* dwords of a, b (16 each, b's from 16) in the order of ix */
#define PICK32(a, ix, b) _mm512_permutex2var_epi32((a), (ix), (b))

/* The 16-lane index of a transpose stage: lane l takes from (l / 16 >= 1 ? b : a) lane f(l). */
VBMI static INLINE __m512i stage_index(int stage, int part)
{
    int32_t ix[16];
    for (int l = 0; l < 16; l++) {
        if (stage == 1) { /* rows 4i..4i+3, columns 4h..4h+3 (part h): lane 4r + c */
            int r = l / 4, c = l % 4;
            ix[l] = (r / 2) * 16 + 8 * (r % 2) + 4 * part + c;
        } else if (stage == 2) { /* rows 8g..8g+7, columns 2e, 2e+1 of a half (part e): lane 2r + c */
            int r = l / 2, c = l % 2;
            ix[l] = (r / 4) * 16 + 4 * (r % 4) + 2 * part + c;
        } else { /* rows 0..15, column c (part): lane j */
            ix[l] = (l / 8) * 16 + 2 * (l % 8) + part;
        }
    }
    return _mm512_loadu_si512(ix);
}

/*
 * The byte indexes (0-7 of a two-line permute) of the f16 scales of Q8_0
 * blocks 4i..4i+3 of a step: block j's scale is at byte 34j, so lines 2i
 * and 2i + 1 (64 bytes each) hold them at 8i, 8i + 34 and 8i + 4, 8i + 38.
 */
static inline long long q8_0_scale_pick(int i)
{
    const unsigned char at[8] = {8 * i, 8 * i + 1, 8 * i + 34, 8 * i + 35, 64 + 8 * i + 4, 64 + 8 * i + 5,
                                 64 + 8 * i + 38, 64 + 8 * i + 39};
    long long q;
    memcpy(&q, at, 8);
    return q;
}

/*
 * The 16 scales of a whole Q8_0 step, from its first 8 lines (which its
 * codes' loads bring into L1) by four byte permutes.  The gather it
 * replaces held one token's Q8_0 rows back on Zen 5 (a fifth of the
 * kernel's samples on the instruction after it): rows of 2048 columns
 * from L2, one thread, 38 -> 43.5 GB/s; from memory the rows were
 * already read at 88-95% of the machine's speed, and stay there.
 */
VBMI static INLINE __m512 q8_0_step_scales(const uint8_t *w)
{
    __m128i t[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        t[i] = _mm512_castsi512_si128(_mm512_permutex2var_epi8(_mm512_loadu_si512(w + 128 * i),
                                                               _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, q8_0_scale_pick(i)),
                                                               _mm512_loadu_si512(w + 128 * i + 64)));
    return _mm512_cvtph_ps(_mm256_set_m128i(_mm_unpacklo_epi64(t[2], t[3]), _mm_unpacklo_epi64(t[0], t[1])));
}

/*
 * A step of m Q8_0 blocks: u[q] lane j the codes 4q..4q+3 of block j, plus
 * 128; scales as f32.  Each pair of blocks is loaded as one vector of
 * their 32 codes each, then the 16 x 8 dwords are transposed in three
 * rounds of 8 two-table permutes.
 */
VBMI static INLINE void q8_0_lanes(const uint8_t *w, int m, __m512i u[8], __m512 *dw)
{
    __m512i x[8], a[8], b[8];
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++) {
        __m256i lo = 2 * p < m ? _mm256_loadu_si256((const __m256i *)(w + 34 * 2 * p + 2)) : _mm256_setzero_si256();
        __m256i hi = 2 * p + 1 < m ? _mm256_loadu_si256((const __m256i *)(w + 34 * (2 * p + 1) + 2))
                                   : _mm256_setzero_si256();
        x[p] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
    const __m512i s10 = stage_index(1, 0), s11 = stage_index(1, 1);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) { /* a[2i + h]: blocks 4i..4i+3, dwords 4h..4h+3 */
        a[2 * i] = PICK32(x[2 * i], s10, x[2 * i + 1]);
        a[2 * i + 1] = PICK32(x[2 * i], s11, x[2 * i + 1]);
    }
    const __m512i s20 = stage_index(2, 0), s21 = stage_index(2, 1);
#pragma GCC unroll 2
    for (int g = 0; g < 2; g++) /* b[4g + 2h + e]: blocks 8g..8g+7, dwords 4h + 2e, +1 */
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            b[4 * g + 2 * h] = PICK32(a[4 * g + h], s20, a[4 * g + 2 + h]);
            b[4 * g + 2 * h + 1] = PICK32(a[4 * g + h], s21, a[4 * g + 2 + h]);
        }
    const __m512i s30 = stage_index(3, 0), s31 = stage_index(3, 1), flip = _mm512_set1_epi8((char)0x80);
#pragma GCC unroll 4
    for (int he = 0; he < 4; he++) { /* dwords 2he, 2he + 1 */
        u[2 * he] = _mm512_xor_si512(PICK32(b[he], s30, b[4 + he]), flip);
        u[2 * he + 1] = _mm512_xor_si512(PICK32(b[he], s31, b[4 + he]), flip);
    }
    *dw = m == 16 ? q8_0_step_scales(w) : block_scales16(w, 34, (__mmask16)((1u << m) - 1));
}
#undef PICK32

/* A step of m blocks decoded: u[q] lane j the unsigned codes 4q..4q+3 of block j; scales as f32. */
VBMI static INLINE void b32_lanes(uint32_t t, const uint8_t *w, int m, const lane_ix *ix, __m512i u[8],
                                  __m512 *dw)
{
    if (t == LM_Q8_0) {
        q8_0_lanes(w, m, u, dw);
        return;
    }
    if (t == LM_Q8_0_LANES) { /* a whole step rearranged at load (repack.c): 8 vectors of codes and the scales */
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        const uint8_t *codes = w + lm_lanes_codes(LM_Q8_0, w, 16);
#pragma GCC unroll 8
        for (int q = 0; q < 8; q++)
            u[q] = _mm512_xor_si512(_mm512_loadu_si512(codes + 64 * q), flip);
        *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + lm_lanes_scales(LM_Q8_0, w, 16))));
        return;
    }
    if (t == LM_Q4_0_LANES) { /* rearranged at load (repack.c): already in lanes, vectors of 4m bytes */
        const __m512i m4 = _mm512_set1_epi8(0x0f);
        const uint8_t *codes = w + lm_lanes_codes(LM_Q4_0, w, m);
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            const __m512i x = m == 16 ? load_once512(codes + 64 * q) : _mm512_maskz_loadu_epi8(first_bytes(4 * m), codes + 4 * m * q);
            u[q] = _mm512_and_si512(x, m4);
            u[q + 4] = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
        }
        const uint8_t *d = w + lm_lanes_scales(LM_Q4_0, w, m);
        *dw = _mm512_cvtph_ps(m == 16 ? _mm256_loadu_si256((const __m256i *)d)
                                      : _mm256_maskz_loadu_epi16((__mmask16)((1u << m) - 1), d));
        return;
    }
    const int bs = lm_b32_block_bytes(t), per = blocks_per_part(bs), parts = (16 + per - 1) / per;
    const int n = bs * m;
    __m512i src[8];
#pragma GCC unroll 4
    for (int p = 0; p < parts; p++) {
        src[2 * p] = step_bytes(w, bs * per * p, n);
        src[2 * p + 1] = step_bytes(w, bs * per * p + 64, n);
    }
    /* lane j: its scale in the low 16 bits */
    *dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(lanes_pick(src, bs, ix->scale)));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i qh = t == LM_Q5_0 ? lanes_pick(src, bs, ix->qh) : _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        __m512i r = lanes_pick(src, bs, _mm512_add_epi8(ix->codes, _mm512_set1_epi8((char)(4 * q))));
        u[q] = _mm512_and_si512(r, m4);
        u[q + 4] = _mm512_and_si512(_mm512_srli_epi16(r, 4), m4);
        if (t == LM_Q5_0) {
            u[q] = fifth_bits(u[q], qh, q, 0);
            u[q + 4] = fifth_bits(u[q + 4], qh, q, 1);
        }
    }
}

/*
 * The last m (1..4) Q8_0 blocks of a row, where a whole step's transpose
 * would cost as much as 16 blocks (rows of 576: 18 blocks): two blocks'
 * codes a vector against the token's codes as they lie, then each block's
 * 8 lanes added up.  Block i's exact sum in lane i.
 */
VBMI static INLINE __m512i q8_0_tail_sums(const uint8_t *w, int m, const act_row *a, int64_t b)
{
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512i v[2];
#pragma GCC unroll 2
    for (int p = 0; p < 2; p++) {
        const int live = m - 2 * p; /* blocks of this pair in the row */
        if (live <= 0) {
            v[p] = _mm512_setzero_si512();
            continue;
        }
        __m256i lo = _mm256_loadu_si256((const __m256i *)(w + 34 * 2 * p + 2));
        __m256i hi = live > 1 ? _mm256_loadu_si256((const __m256i *)(w + 34 * (2 * p + 1) + 2)) : _mm256_setzero_si256();
        __m512i u = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), flip);
        const __mmask16 words = live > 1 ? 0xffff : 0x00ff;
        __m512i qa = _mm512_maskz_loadu_epi32(words, a->qs + 32 * (b + 2 * p));
        __m512i nc = _mm512_maskz_loadu_epi32(words, a->negcorr + 8 * (b + 2 * p));
        v[p] = _mm512_dpbusd_epi32(nc, u, qa);
    }
    /* 128-bit chunk c: the four halves of block c's 8 lanes, then each chunk summed */
    __m512i x = _mm512_add_epi32(_mm512_shuffle_i32x4(v[0], v[1], 0x88), _mm512_shuffle_i32x4(v[0], v[1], 0xdd));
    x = _mm512_add_epi32(x, _mm512_shuffle_epi32(x, _MM_PERM_BADC));
    x = _mm512_add_epi32(x, _mm512_shuffle_epi32(x, _MM_PERM_CDAB));
    return _mm512_maskz_compress_epi32(0x1111, x);
}

/*
 * The step of m blocks (16 but in a row's last step) at block b of a row of
 * type t against n tokens, into their accumulators.  m is a constant where
 * inlined for whole steps, so their loop has no masks and no test a token
 * (the row's loop with m worked out a step spilled and branched there).
 */
VBMI static INLINE void step_lanes(uint32_t t, const uint8_t *row, int64_t b, int m, const act_row *a, int n,
                                   const lane_ix *ix, __m512 *acc)
{
    const size_t bs = (size_t)lm_b32_block_bytes(t);
    const __mmask16 live = (__mmask16)((1u << m) - 1);
    __m512i u[8];
    __m512 dw;
    const size_t step = t == LM_Q4_0_LANES && m == 16 ? LM_Q4_0_STEP_BYTES : bs * (size_t)m; /* (whole steps: a constant) */
    const uint32_t tm = t == LM_Q8_0_LANES && m < 16 ? LM_Q8_0 : t; /* (a row's last Q8_0 blocks: the file's) */
    lm_prefetch_ahead(row + bs * (size_t)b, step, n, a[0].ahead);
    if (tm == LM_Q8_0 && m <= 4) {
        dw = _mm512_cvtph_ps(_mm256_zextsi128_si256(block_scales8_words(row + bs * (size_t)b, bs, m)));
#pragma GCC unroll 8
        for (int i = 0; i < n; i++) {
            const __m512 sums = _mm512_cvtepi32_ps(q8_0_tail_sums(row + bs * (size_t)b, m, &a[i], b));
            const __m512 dd = _mm512_mul_ps(dw, _mm512_maskz_loadu_ps(live, a[i].d + b));
            acc[i] = _mm512_mask3_fmadd_ps(dd, sums, acc[i], live);
        }
        return;
    }
    b32_lanes(tm, row + bs * (size_t)b, m, ix, u, &dw);
#pragma GCC unroll 8
    for (int i = 0; i < n; i++) {
        const int8_t *qw = a[i].qw + 512 * (b / 16);
        __m512i v0 = _mm512_loadu_si512(a[i].ncw + b), v1 = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int q = 0; q < 8; q += 2) {
            v0 = _mm512_dpbusd_epi32(v0, u[q], _mm512_loadu_si512(qw + 64 * q));
            v1 = _mm512_dpbusd_epi32(v1, u[q + 1], _mm512_loadu_si512(qw + 64 * q + 64));
        }
        const __m512 sums = _mm512_cvtepi32_ps(_mm512_add_epi32(v0, v1));
        if (m == 16) {
            acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_loadu_ps(a[i].d + b)), sums, acc[i]);
        } else {
            const __m512 dd = _mm512_mul_ps(dw, _mm512_maskz_loadu_ps(live, a[i].d + b));
            acc[i] = _mm512_mask3_fmadd_ps(dd, sums, acc[i], live);
        }
    }
}

/* n (a constant, <= 8) tokens through one row of type t (a constant): token i into out[i * ostride]. */
VBMI static INLINE void row_lanes(uint32_t t, const uint8_t *row, int64_t k, const act_row *a, int n,
                                  const lane_ix *ix, float *out, size_t ostride)
{
    const int64_t nb = k / 32, whole = nb / 16 * 16;
    __m512 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < n; i++)
        acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < whole; b += 16)
        step_lanes(t, row, b, 16, a, n, ix, acc);
    if (whole < nb)
        step_lanes(t, row, whole, (int)(nb - whole), a, n, ix, acc);
#pragma GCC unroll 8
    for (int i = 0; i < n; i++)
        out[(size_t)i * ostride] = hsum16_avx512(acc[i]);
}

/* Rows one after another against n (a constant, <= 8) tokens, one function per type and count. */
#define ROWS_LANES_VARIANT(name, t, n)                                                              \
    VBMI __attribute__((noinline)) static void name(const uint8_t *row0, size_t rb, int64_t nr,      \
                                                    int64_t k, const act_row *a, float *out,        \
                                                    size_t ostride)                                 \
    {                                                                                               \
        const lane_ix ix = lane_indexes(t);                                                         \
        for (int64_t r = 0; r < nr; r++)                                                            \
            row_lanes(t, row0 + (size_t)r * rb, k, a, n, &ix, out + r, ostride);                    \
    }
#define ROWS_LANES_TYPE(ty, T)                                                                      \
    ROWS_LANES_VARIANT(rows_##ty##_1, T, 1) ROWS_LANES_VARIANT(rows_##ty##_2, T, 2)                 \
    ROWS_LANES_VARIANT(rows_##ty##_3, T, 3) ROWS_LANES_VARIANT(rows_##ty##_4, T, 4)                 \
    ROWS_LANES_VARIANT(rows_##ty##_5, T, 5) ROWS_LANES_VARIANT(rows_##ty##_6, T, 6)                 \
    ROWS_LANES_VARIANT(rows_##ty##_7, T, 7) ROWS_LANES_VARIANT(rows_##ty##_8, T, 8)
ROWS_LANES_TYPE(q4_0, LM_Q4_0)
ROWS_LANES_TYPE(q5_0, LM_Q5_0)
ROWS_LANES_TYPE(q8_0, LM_Q8_0)
ROWS_LANES_TYPE(q4_0_lanes, LM_Q4_0_LANES)
ROWS_LANES_TYPE(q8_0_lanes, LM_Q8_0_LANES)
#undef ROWS_LANES_TYPE
#undef ROWS_LANES_VARIANT

typedef void rows_lanes_fn(const uint8_t *, size_t, int64_t, int64_t, const act_row *, float *, size_t);

/* a[0..n): laid out by lm_act_lanes; up to 8 tokens a pass over the rows (8 sums and the
   row's codes in registers; more take a pass per 8, the later ones mostly from L2/L3). */
VBMI void lm_rows_lanes_vbmi(uint32_t t, const uint8_t *row0, size_t rb, int64_t nr, int64_t k,
                             const act_row *a, int n, float *out, size_t ostride)
{
    static rows_lanes_fn *const by_count[5][8] = {
        {rows_q4_0_1, rows_q4_0_2, rows_q4_0_3, rows_q4_0_4, rows_q4_0_5, rows_q4_0_6, rows_q4_0_7, rows_q4_0_8},
        {rows_q5_0_1, rows_q5_0_2, rows_q5_0_3, rows_q5_0_4, rows_q5_0_5, rows_q5_0_6, rows_q5_0_7, rows_q5_0_8},
        {rows_q8_0_1, rows_q8_0_2, rows_q8_0_3, rows_q8_0_4, rows_q8_0_5, rows_q8_0_6, rows_q8_0_7, rows_q8_0_8},
        {rows_q4_0_lanes_1, rows_q4_0_lanes_2, rows_q4_0_lanes_3, rows_q4_0_lanes_4, rows_q4_0_lanes_5,
         rows_q4_0_lanes_6, rows_q4_0_lanes_7, rows_q4_0_lanes_8},
        {rows_q8_0_lanes_1, rows_q8_0_lanes_2, rows_q8_0_lanes_3, rows_q8_0_lanes_4, rows_q8_0_lanes_5,
         rows_q8_0_lanes_6, rows_q8_0_lanes_7, rows_q8_0_lanes_8}};
    const int ti = t == LM_Q4_0 ? 0 : t == LM_Q5_0 ? 1 : t == LM_Q8_0 ? 2 : t == LM_Q4_0_LANES ? 3 : 4;
    for (int t0 = 0; t0 < n; t0 += 8) {
        int c = n - t0 < 8 ? n - t0 : 8;
        by_count[ti][c - 1](row0, rb, nr, k, a + t0, out + (size_t)t0 * ostride, ostride);
    }
}

#else

int lm_cpu_vbmi(void) { return 0; }

void lm_rows_b32_vbmi(uint32_t t, const uint8_t *row0, size_t rb, int64_t nr, int64_t k,
                      const act_row *a, float *out)
{
    (void)t, (void)row0, (void)rb, (void)nr, (void)k, (void)a, (void)out; /* never called: lm_cpu_vbmi() is 0 */
}

void lm_rows_lanes_vbmi(uint32_t t, const uint8_t *row0, size_t rb, int64_t nr, int64_t k,
                        const act_row *a, int n, float *out, size_t ostride)
{
    (void)t, (void)row0, (void)rb, (void)nr, (void)k, (void)a, (void)n, (void)out, (void)ostride; /* never called */
}

#endif
