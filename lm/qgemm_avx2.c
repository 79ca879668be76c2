/*
 * lm/qgemm_avx2.c - several tokens through Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * Q4_K, Q5_K and Q6_K rows, eight rows at a time, on x86 CPUs with AVX2 but not
 * AVX-512 (prompts; qgemm.c is the AVX-512 kernel of the same job).
 *
 * A token at a time (qdot_avx2.c), every 32 codes of a row cost each token
 * a multiply, a widening, a correction, and the row ends on a horizontal
 * sum.  Here eight rows are first unpacked into one layout, four codes of
 * each row side by side in a 32-bit lane ([k/4][8 rows][4 codes]): one
 * vpmaddubsw against four codes of a token broadcast to every lane then
 * multiplies four codes of all eight rows, and each row's sum ends in its
 * own lane, so no lane is ever summed across.  The pair sums stay in 16
 * bits for as many steps as cannot overflow (activation codes are within
 * +-127: code8), and one vpmaddwd a run widens them, times the group's
 * scale for K-quants.  Four tokens a tile share every load of the rows.
 *
 * The integers are the exact sums of lm_dot_b32_scalar and lm_dot_k_scalar,
 * and the float steps are theirs, lane for lane: a row's block b goes to
 * its lane b % 16 (super-block b to b % LM_K_LANES), and the lanes end in
 * the same trees.  So a token's logits are the same bytes as on every
 * other path; tests compare them.
 */
#include "internal.h"
#include "simd.h"

#include <string.h>

/* Eight rows of k codes unpacked, each array [blocks or groups][8 rows]. */
typedef struct rows8 {
    uint8_t *codes; /* [k/4][8][4]: four codes of each row a lane (Q8_0: as signed bytes) */
    int32_t *sc;    /* K-quants: [groups][8]: the group's scale in both 16-bit halves */
    int32_t *pairs; /* K-quants: [k/32][8]: the factors of the sums of 16-code groups 2p and 2p + 1 */
    float *d, *m;   /* [blocks][8]: scales, and K-quant min scales */
} rows8;

static size_t round64(size_t n)
{
    return (n + 63) / 64 * 64;
}

size_t lm_rows8_bytes(int64_t k)
{
    const size_t per8 = 8 * 4; /* one int32 or float for each of the eight rows */
    return round64((size_t)k * 8) + round64((size_t)(k / 16) * per8) + round64((size_t)(k / 32) * per8) +
           2 * round64((size_t)(k / 32) * per8);
}

int lm_rows8_type(uint32_t t)
{
    return t == LM_Q4_0 || t == LM_Q4_1 || t == LM_Q5_0 || t == LM_Q5_1 || t == LM_Q8_0 || t == LM_Q2_K ||
           t == LM_Q3_K || t == LM_Q4_K || t == LM_Q5_K || t == LM_Q6_K;
}

#if defined(__x86_64__) && defined(__GNUC__)

/* ------------------------------------------------------------ unpacking */

static void rows8_layout(rows8 *w, int64_t k, void *base)
{
    uint8_t *p = base;
    const size_t per8 = 8 * 4;
    w->codes = p;
    p += round64((size_t)k * 8);
    w->sc = (int32_t *)p;
    p += round64((size_t)(k / 16) * per8);
    w->pairs = (int32_t *)p;
    p += round64((size_t)(k / 32) * per8);
    w->d = (float *)p;
    p += round64((size_t)(k / 32) * per8);
    w->m = (float *)p;
}

/*
 * The eight 32-bit lanes of eight rows (v[r]) turned (an 8 x 8 transpose):
 * w[s] holds lane s of every row, the rows side by side.  Every loop of the
 * unpacking is unrolled so its arrays stay in registers: left as loops,
 * GCC kept them on the stack, and unpacking eight Q4_0 rows of 2048 cost
 * three times as long (a 128-token prompt through tinyllama Q4_K_M: 154
 * against 169 tokens/s; 6 tokens: 60 against 81).
 */
AVX2 static INLINE void transpose8(const __m256i v[8], __m256i w[8])
{
    __m256i t[8], u[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i += 2) { /* rows i, i + 1: lanes 0 1 | 4 5, then 2 3 | 6 7 */
        t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; i += 4) { /* rows i..i + 3: lanes 0 | 4, 1 | 5, 2 | 6, 3 | 7 */
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
#pragma GCC unroll 8
    for (int s = 0; s < 4; s++) {
        w[s] = _mm256_inserti128_si256(u[s], _mm256_castsi256_si128(u[s + 4]), 1);
        w[s + 4] = _mm256_inserti128_si256(u[s + 4], _mm256_extracti128_si256(u[s], 1), 0);
    }
}

/*
 * The same four lanes of eight rows (p[r]): w[s] holds bytes 4s..4s + 3 of
 * every row; only the first c <= 4 dwords of each are read (a lanes step's
 * last blocks), the rest are 0.
 */
AVX2 static INLINE void transpose8x4_first(const uint8_t *const p[8], int c, __m256i w[4])
{
    __m256i a[4], t[4];
#pragma GCC unroll 8
    for (int r = 0; r < 4; r++) /* rows r and r + 4 */
        a[r] = _mm256_set_m128i(first_dwords4(p[r + 4], c), first_dwords4(p[r], c));
    t[0] = _mm256_unpacklo_epi32(a[0], a[1]), t[1] = _mm256_unpackhi_epi32(a[0], a[1]);
    t[2] = _mm256_unpacklo_epi32(a[2], a[3]), t[3] = _mm256_unpackhi_epi32(a[2], a[3]);
    w[0] = _mm256_unpacklo_epi64(t[0], t[2]), w[1] = _mm256_unpackhi_epi64(t[0], t[2]);
    w[2] = _mm256_unpacklo_epi64(t[1], t[3]), w[3] = _mm256_unpackhi_epi64(t[1], t[3]);
}

/* Eight 16-byte rows, four lanes each. */
AVX2 static INLINE void transpose8x4(const uint8_t *const p[8], __m256i w[4])
{
    transpose8x4_first(p, 4, w);
}

/* Eight rows' lanes (v[r]) stored lane by lane: for codes, 32 of a row become eight steps of four. */
AVX2 static INLINE void put_lanes8(uint8_t *dst, const __m256i v[8])
{
    __m256i w[8];
    transpose8(v, w);
#pragma GCC unroll 8
    for (int s = 0; s < 8; s++)
        _mm256_storeu_si256((__m256i *)(dst + 32 * s), w[s]);
}

/*
 * Steps of nibble codes: the low nibbles of w[0..n) to lo, the high ones to
 * hi; with h (Q5_K), bits `bit` and bit + 1 of h's bytes add 16 to them.
 */
AVX2 static INLINE void put_nibbles(uint8_t *lo, uint8_t *hi, const __m256i *w, int n, const __m256i *h, int bit)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
#pragma GCC unroll 8
    for (int s = 0; s < n; s++) {
        __m256i l = _mm256_and_si256(w[s], m4), u = _mm256_and_si256(_mm256_srli_epi16(w[s], 4), m4);
        if (h) {
            l = _mm256_or_si256(l, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h[s], bit), one), 4));
            u = _mm256_or_si256(u, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h[s], bit + 1), one), 4));
        }
        _mm256_storeu_si256((__m256i *)(lo + 32 * s), l);
        _mm256_storeu_si256((__m256i *)(hi + 32 * s), u);
    }
}

/* Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: every block's codes and scale (and min). */
AVX2 static INLINE void unpack_b32(rows8 *w, uint32_t t, const uint8_t *row0, size_t rb, int64_t k)
{
    const size_t bs = lm_type_size(t);
    const int four = t == LM_Q4_0 || t == LM_Q4_1;
    for (int64_t b = 0; b < k / 32; b++) {
        __m256i v[8];
        const uint8_t *qs[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            const uint8_t *blk = row0 + r * rb + b * bs;
            qs[r] = blk + (t == LM_Q4_1 ? 4 : 2);
            if (!four)
                v[r] = t == LM_Q8_0 ? _mm256_loadu_si256((const __m256i *)(blk + 2)) : b32_codes32(t, blk);
        }
        _mm256_storeu_ps(w->d + b * 8, halves8(row0 + b * bs, rb));
        if (t == LM_Q4_1 || t == LM_Q5_1)
            _mm256_storeu_ps(w->m + b * 8, halves8(row0 + b * bs + 2, rb));
        uint8_t *dst = w->codes + b * 256;
        if (four) { /* codes 0-15 the low nibbles of the 16 bytes, 16-31 the high ones */
            __m256i q[4];
            transpose8x4(qs, q);
            put_nibbles(dst, dst + 4 * 32, q, 4, NULL, 0);
        } else {
            put_lanes8(dst, v);
        }
    }
}

/*
 * Eight Q4_0 or (q5) Q5_0 rows in their lanes layout (repack.c): each
 * row's 16 bytes of a step's nibble vector q at block j hold blocks
 * j..j+3's nibble bytes 4q..4q+3, so one transpose8x4 gives block j + s's
 * codes 4q.. (low nibbles) and 16 + 4q.. (high) of all eight rows, and one
 * more Q5's fifth bits, which a shift puts at bit 4 (q5_lanes_codes, as
 * qdot_avx2.c's layout8_avx2).  c < 4: a step's last blocks, loaded by
 * their size (one at a time, each byte copied, they had cost rows of 576
 * columns, 16 + 2 blocks, twice the unpacking time of the file's layout).
 */
AVX2 static INLINE void layout_four(uint8_t *dst, const uint8_t *step, int m, int j, int c, size_t rb, const int q5)
{
    const uint8_t *p[8];
    __m256i f[4], x[4];
    const __m256i m4 = _mm256_set1_epi8(0x0f);
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++)
        p[r] = step + r * rb + LM_Q5_0_FIFTH(m) + 4 * j;
    if (q5) /* (c == 4 apart: whole loads, no per-row branch on the count) */
        c == 4 ? transpose8x4(p, f) : transpose8x4_first(p, c, f);
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) { /* each vector stored as it comes: 16 at once spilled */
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) /* (each row's step where it lies: lm_lanes_codes) */
            p[r] = step + r * rb + lm_lanes_codes(q5 ? LM_Q5_0 : LM_Q4_0, step + r * rb, m) + 4 * (size_t)m * q + 4 * j;
        c == 4 ? transpose8x4(p, x) : transpose8x4_first(p, c, x);
#pragma GCC unroll 4
        for (int s = 0; s < c; s++) { /* block j + s */
            __m256i lo = _mm256_and_si256(x[s], m4), hi = _mm256_and_si256(_mm256_srli_epi16(x[s], 4), m4);
            if (q5)
                q5_lanes_codes(x[s], f[s], q, &lo, &hi);
            _mm256_storeu_si256((__m256i *)(dst + 256 * s + 32 * q), lo);
            _mm256_storeu_si256((__m256i *)(dst + 256 * s + 32 * (q + 4)), hi);
        }
    }
}

/* Block j's scales of a lanes step of m blocks in eight rows (rb bytes apart), each row's where it lies. */
AVX2 static INLINE __m256 layout_scales8(uint32_t t, const uint8_t *step, int m, int j, size_t rb)
{
    uint16_t h[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++)
        memcpy(&h[r], step + r * rb + lm_lanes_scales(t, step + r * rb, m) + 2 * j, 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

/* Q4_0, Q5_0 or Q5_1 rows in their lanes layouts (tag: LM_Q4_0_LANES..): codes, scales, Q5_1's mins. */
AVX2 static INLINE void unpack_layout(rows8 *w, uint32_t tag, const uint8_t *row0, size_t rb, int64_t k)
{
    const uint32_t t = tag == LM_Q4_0_LANES ? LM_Q4_0 : tag == LM_Q5_0_LANES ? LM_Q5_0 : LM_Q5_1;
    const int q5 = t != LM_Q4_0;
    const int64_t nb = k / 32, bs = lm_b32_block_bytes(t);
    for (int64_t b0 = 0; b0 < nb; b0 += 16) {
        const int m = lm_lanes_step_blocks(nb, b0);
        const uint8_t *step = row0 + bs * b0;
        for (int j = 0; j < m; j += 4) {
            const int c = m - j < 4 ? m - j : 4;
            q5 ? layout_four(w->codes + (b0 + j) * 256, step, m, j, c, rb, 1)
               : layout_four(w->codes + (b0 + j) * 256, step, m, j, c, rb, 0);
        }
        /* the scales after the codes, so that a step's lines are read in order: with the scales
           first, 16384 Q4_0 rows of 2048 from memory took 3.8 ms to unpack on one core, 2.9 in
           the file's layout and so now */
        for (int j = 0; j < m; j++) {
            _mm256_storeu_ps(w->d + (b0 + j) * 8, layout_scales8(t, step, m, j, rb));
            if (t == LM_Q5_1)
                _mm256_storeu_ps(w->m + (b0 + j) * 8, halves8(step + LM_Q5_1_MINS(m) + 2 * j, rb));
        }
    }
}

/*
 * A Q4_K or (five) Q5_K super-block's codes of eight rows (blk, rb bytes
 * apart) as 64 steps: chunks 2j and 2j + 1 are the low and high nibbles of
 * the same 32 bytes, so one transpose serves both; Q5_K's fifth bits (bit c
 * of each qh byte for chunk c) come from one transpose of the qh bytes.
 */
AVX2 static INLINE void unpack_k4_codes(uint8_t *dst, int five, const uint8_t *blk, size_t rb)
{
    __m256i v[8], q[8], h[8];
    if (five) {
        for (int r = 0; r < 8; r++)
            v[r] = _mm256_loadu_si256((const __m256i *)(blk + r * rb + 16));
        transpose8(v, h);
    }
    for (int j = 0; j < 4; j++) {
        for (int r = 0; r < 8; r++)
            v[r] = _mm256_loadu_si256((const __m256i *)(blk + r * rb + (five ? 48 : 16) + 32 * j));
        transpose8(v, q);
        uint8_t *lo = dst + 16 * j * 32;
        put_nibbles(lo, lo + 8 * 32, q, 8, five ? h : NULL, 2 * j);
    }
}

/*
 * The same from rows in the Q4_K lanes layout (repack.c): super-block b of
 * a step (its header at 16b) has its codes in the 16 bytes at 16b of each
 * of the step's 8 chunks, dword g of chunk c holding codes 4c..4c+3 of
 * group g (low nibbles) and g + 4 (high), so one transpose a chunk puts
 * them in the steps 8g + c and 8(g + 4) + c.
 */
AVX2 static INLINE void unpack_k4_lanes_codes(uint8_t *dst, const uint8_t *step, int b, size_t rb)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        const uint8_t *p[8];
        __m256i q[4];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++)
            p[r] = step + r * rb + 64 + 64 * c + 16 * b;
        transpose8x4(p, q);
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            _mm256_storeu_si256((__m256i *)(dst + 32 * (8 * g + c)), _mm256_and_si256(q[g], m4));
            _mm256_storeu_si256((__m256i *)(dst + 32 * (8 * (g + 4) + c)),
                                _mm256_and_si256(_mm256_srli_epi16(q[g], 4), m4));
        }
    }
}

/*
 * K-quants (or LM_Q4_K_LANES: Q4_K in its lanes layout): codes, the scale
 * of each group (Q2_K, Q3_K, Q6_K: 16 codes, the others 32), the factors of
 * the 16-code sums (Q3_K, Q6_K: their scales, for the code offsets 4 and
 * 32; Q2_K: its mins; Q4_K, Q5_K: each 32-code group's min, twice) and d,
 * m.  Each row's values are made as a row of lanes and then turned, like
 * the codes.
 */
AVX2 static INLINE void unpack_k(rows8 *w, uint32_t tag, const uint8_t *row0, size_t rb, int64_t k)
{
    const int lanes = tag == LM_Q4_K_LANES;
    const uint32_t t = lanes ? LM_Q4_K : tag;
    const size_t bs = lm_type_size(t);
    const int g16 = t == LM_Q2_K || t == LM_Q3_K || t == LM_Q6_K, ng = g16 ? 16 : 8;
    const int64_t whole = lanes ? k / 1024 * 4 : 0; /* super-blocks in the layout's steps */
    for (int64_t b = 0; b < k / 256; b++) {
        __m256i sc[2][8], pairs[8];
        /* the super-block's header (d, dmin, scales) in each row, and its step */
        const size_t head = b < whole ? LM_Q4_K_STEP_BYTES * (size_t)(b / 4) + 16 * (size_t)(b % 4) : (size_t)b * bs;
        const uint8_t *step = row0 + LM_Q4_K_STEP_BYTES * (size_t)(b / 4);
        for (int r = 0; r < 8; r++) {
            const uint8_t *blk = row0 + r * rb + head;
            if (g16) { /* 16 scales: as int16 (Q2_K: its mins) the pairs; each twice, the groups' lanes */
                __m256i mins, s16 = t == LM_Q6_K ? _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)))
                                                 : q23k_scales(t, blk, &mins);
                __m256i lo = _mm256_unpacklo_epi16(s16, s16), hi = _mm256_unpackhi_epi16(s16, s16);
                pairs[r] = t == LM_Q2_K ? mins : s16;
                sc[0][r] = _mm256_inserti128_si256(lo, _mm256_castsi256_si128(hi), 1);
                sc[1][r] = _mm256_inserti128_si256(hi, _mm256_extracti128_si256(lo, 1), 0);
            } else {
                uint64_t sc8, mn8;
                k4_scales8(blk + 4, &sc8, &mn8);
                __m256i s = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc8));
                __m256i m = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn8));
                sc[0][r] = _mm256_or_si256(s, _mm256_slli_epi32(s, 16));
                pairs[r] = _mm256_or_si256(m, _mm256_slli_epi32(m, 16));
            }
        }
        for (int h = 0; h < ng / 8; h++)
            put_lanes8((uint8_t *)(w->sc + (b * ng + 8 * h) * 8), sc[h]);
        put_lanes8((uint8_t *)(w->pairs + b * 64), pairs);
        const uint8_t *blk = row0 + head;
        _mm256_storeu_ps(w->d + b * 8, halves8(blk + lm_k_d_at(t), rb));
        _mm256_storeu_ps(w->m + b * 8, lm_k_m_at(t) ? halves8(blk + lm_k_m_at(t), rb) : _mm256_setzero_ps());
        if (g16) {
            for (int c = 0; c < 8; c++) {
                __m256i v[8];
                for (int r = 0; r < 8; r++)
                    v[r] = k_codes32(t, row0 + r * rb + b * bs, c);
                put_lanes8(w->codes + (b * 64 + 8 * c) * 32, v);
            }
        } else if (b < whole) {
            unpack_k4_lanes_codes(w->codes + b * 64 * 32, step, (int)(b % 4), rb);
        } else {
            unpack_k4_codes(w->codes + b * 64 * 32, t == LM_Q5_K, row0 + b * bs, rb);
        }
    }
}

/* ------------------------------------------------------------ the tiles */

/* Four activation codes at p in every lane. */
AVX2 static INLINE __m256i codes4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* The 16-lane tree of lm_hsum16, each lane a vector of eight rows. */
AVX2 static INLINE __m256 hsum16_rows(const __m256 l[16])
{
    __m256 t8[8], t4[4];
    for (int i = 0; i < 8; i++)
        t8[i] = _mm256_add_ps(l[i], l[i + 8]);
    for (int i = 0; i < 4; i++)
        t4[i] = _mm256_add_ps(t8[i], t8[i + 4]);
    return _mm256_add_ps(_mm256_add_ps(t4[0], t4[2]), _mm256_add_ps(t4[1], t4[3]));
}

/*
 * Steps s0..s0 + run - 1 of the codes (each four codes of the eight rows)
 * against T tokens' activation codes q[i]: the pair sums added in 16 bits,
 * then widened by one vpmaddwd with f (ones, or a group's scale) into is[i].
 * The steps unroll by two: all eight at once, GCC ran out of registers and
 * kept the sums on the stack (tinyllama Q4_0, 128-token prompt: 117
 * against 142 t/s).
 */
AVX2 static INLINE void run_sums(const uint8_t *codes, int s0, const int run, const int8_t *const q[4], const int T,
                                 __m256i f, __m256i is[4])
{
    __m256i p[4];
#pragma GCC unroll 4
    for (int i = 0; i < T; i++)
        p[i] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int s = s0; s < s0 + run; s++) {
        const __m256i c = _mm256_loadu_si256((const __m256i *)(codes + 32 * s));
#pragma GCC unroll 4
        for (int i = 0; i < T; i++)
            p[i] = _mm256_add_epi16(p[i], _mm256_maddubs_epi16(c, codes4(q[i] + 4 * s)));
    }
#pragma GCC unroll 4
    for (int i = 0; i < T; i++)
        is[i] = _mm256_add_epi32(is[i], _mm256_madd_epi16(p[i], f));
}

/*
 * Block b's exact integer sums for T tokens (is[i], a lane a row): the
 * codes less their offset times the activations.  Q4_0 (Q4_1) pair sums reach at
 * most 2 * 15 * 127, so eight steps add up in 16 bits; Q5_0's (Q5_1's) 2 * 31 * 127,
 * four steps.  Q4_1's and Q5_1's codes have no offset (their mins are
 * tile_b32's).  Q8_0's codes are signed: their signs go onto the
 * activations (sign trick) and every step widens.
 */
AVX2 static INLINE void block_sums(uint32_t t, const uint8_t *codes, const act_row *a, int64_t b, const int T,
                                   __m256i is[4])
{
    const __m256i ones = _mm256_set1_epi16(1);
    if (t == LM_Q8_0) {
#pragma GCC unroll 4
        for (int i = 0; i < T; i++)
            is[i] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int s = 0; s < 8; s++) {
            const __m256i c = _mm256_loadu_si256((const __m256i *)(codes + 32 * s)), ac = _mm256_abs_epi8(c);
#pragma GCC unroll 4
            for (int i = 0; i < T; i++) {
                __m256i p = _mm256_maddubs_epi16(ac, _mm256_sign_epi8(codes4(a[i].qs + b * 32 + 4 * s), c));
                is[i] = _mm256_add_epi32(is[i], _mm256_madd_epi16(p, ones));
            }
        }
        return;
    }
    const int four = t == LM_Q4_0 || t == LM_Q4_1, run = four ? 8 : 4;
    const int off = t == LM_Q4_0 ? 8 : t == LM_Q5_0 ? 16 : 0; /* (Q4_1, Q5_1: none) */
    const int8_t *q[4];
#pragma GCC unroll 4
    for (int i = 0; i < T; i++)
        q[i] = a[i].qs + b * 32, is[i] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int h = 0; h < 8; h += run)
        run_sums(codes, h, run, q, T, ones, is);
    if (!off)
        return;
#pragma GCC unroll 4
    for (int i = 0; i < T; i++) /* the offset: off times the block's activation sum */
        is[i] = _mm256_add_epi32(is[i], _mm256_set1_epi32(-off * (a[i].sum16[2 * b] + a[i].sum16[2 * b + 1])));
}

/*
 * T tokens (a[0..T)) through the eight rows of 32-element blocks:
 * out[i * ldo + r].  Lane j's blocks j, j + 16, ... are taken together,
 * so its T sums stay in registers.
 */
AVX2 static INLINE void tile_b32(uint32_t t, const rows8 *w, int64_t k, const act_row *a, const int T, float *out,
                                 size_t ldo)
{
    const int64_t nb = k / 32;
    __m256 lanes[4][16];
    for (int j = 0; j < 16; j++) {
        __m256 acc[4];
#pragma GCC unroll 4
        for (int i = 0; i < T; i++)
            acc[i] = _mm256_setzero_ps();
        for (int64_t b = j; b < nb; b += 16) {
            __m256i is[4];
            block_sums(t, w->codes + b * 256, a, b, T, is);
            const __m256 dw = _mm256_loadu_ps(w->d + b * 8);
#pragma GCC unroll 4
            for (int i = 0; i < T; i++)
                acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(a[i].d[b])), _mm256_cvtepi32_ps(is[i]),
                                         acc[i]);
        }
#pragma GCC unroll 4
        for (int i = 0; i < T; i++)
            lanes[i][j] = acc[i];
    }
    if (t != LM_Q4_1 && t != LM_Q5_1) {
#pragma GCC unroll 4
        for (int i = 0; i < T; i++)
            _mm256_storeu_ps(out + i * ldo, hsum16_rows(lanes[i]));
        return;
    }
    __m256 mins[4]; /* each row's min terms, a chain in block order (lm_dot_b32_scalar) */
#pragma GCC unroll 4
    for (int i = 0; i < T; i++)
        mins[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m256 mw = _mm256_loadu_ps(w->m + b * 8);
#pragma GCC unroll 4
        for (int i = 0; i < T; i++)
            mins[i] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a[i].s[b]), mins[i]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < T; i++)
        _mm256_storeu_ps(out + i * ldo, _mm256_add_ps(hsum16_rows(lanes[i]), mins[i]));
}

/*
 * Super-block b's integer sums for T tokens: scale * code * activation
 * (is[i]) and the 16-code sums times their factors (ps[i]).  Pair sums run
 * 16 bits for 8 steps (Q4_K: 2 * 15 * 127 each), 4 (Q5_K; Q2_K and Q3_K:
 * a 16-code group) or 2 (Q6_K: 2 * 63 * 127), then one vpmaddwd by the
 * group's scale widens them.
 */
AVX2 static INLINE void superblock_sums8(uint32_t t, const rows8 *w, const act_row *a, int64_t b, const int T,
                                         __m256i is[4], __m256i ps[4])
{
    const int ng = t == LM_Q4_K || t == LM_Q5_K ? 8 : 16, per_group = 64 / ng;
    const int run = t == LM_Q4_K ? 8 : t == LM_Q6_K ? 2 : 4;
    const uint8_t *codes = w->codes + b * 64 * 32;
    const int8_t *q[4];
#pragma GCC unroll 4
    for (int i = 0; i < T; i++)
        q[i] = a[i].qs + b * 256, is[i] = ps[i] = _mm256_setzero_si256();
    for (int g = 0; g < ng; g++) {
        const __m256i sc = _mm256_loadu_si256((const __m256i *)(w->sc + (b * ng + g) * 8));
        for (int h = g * per_group; h < (g + 1) * per_group; h += run)
            run_sums(codes, h, run, q, T, sc, is);
    }
    for (int p = 0; p < 8; p++) {
        const __m256i f = _mm256_loadu_si256((const __m256i *)(w->pairs + (b * 8 + p) * 8));
#pragma GCC unroll 4
        for (int i = 0; i < T; i++) {
            int32_t s2;
            memcpy(&s2, a[i].sum16 + b * 16 + 2 * p, 4);
            ps[i] = _mm256_add_epi32(ps[i], _mm256_madd_epi16(f, _mm256_set1_epi32(s2)));
        }
    }
}

/*
 * T tokens through the eight rows of super-blocks: lm_dot_k_scalar's
 * steps, the code offset of Q6_K (32) off as 32 * its scales times the
 * 16-code sums, the mins of Q4_K and Q5_K as lm_k_mins.
 */
AVX2 static INLINE void tile_k(uint32_t t, const rows8 *w, int64_t k, const act_row *a, const int T, float *out,
                               size_t ldo)
{
    __m256 acc[4][LM_K_LANES], mins[4][LM_K_LANES];
#pragma GCC unroll 4
    for (int i = 0; i < T; i++)
        for (int j = 0; j < LM_K_LANES; j++)
            acc[i][j] = mins[i][j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < k / 256; b++) {
        __m256i is[4], ps[4];
        superblock_sums8(t, w, a, b, T, is, ps);
        const __m256 dw = _mm256_loadu_ps(w->d + b * 8), mw = _mm256_loadu_ps(w->m + b * 8);
        const int j = (int)(b % LM_K_LANES);
#pragma GCC unroll 4
        for (int i = 0; i < T; i++) {
            const int off = t == LM_Q6_K ? 5 : t == LM_Q3_K ? 2 : 0; /* log2 of the code offset */
            __m256i isum = off ? _mm256_sub_epi32(is[i], _mm256_slli_epi32(ps[i], off)) : is[i];
            __m256i msum = off ? _mm256_setzero_si256() : ps[i];
            const __m256 da = _mm256_set1_ps(a[i].d[b]);
            acc[i][j] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isum), acc[i][j]);
            mins[i][j] = _mm256_add_ps(mins[i][j], _mm256_mul_ps(_mm256_mul_ps(mw, da), _mm256_cvtepi32_ps(msum)));
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < T; i++) { /* lm_k_total */
        __m256 s = _mm256_add_ps(_mm256_add_ps(acc[i][0], acc[i][1]), _mm256_add_ps(acc[i][2], acc[i][3]));
        __m256 m = _mm256_add_ps(_mm256_add_ps(mins[i][0], mins[i][1]), _mm256_add_ps(mins[i][2], mins[i][3]));
        _mm256_storeu_ps(out + i * ldo, _mm256_sub_ps(s, m));
    }
}

/*
 * Unpacked eight rows of one type (tag: the type, or its lanes layout),
 * then all nt tokens through them, four a tile (the type a constant inside).
 */
#define TOKENS8(name, unpack, tile, tag, ty)                                                                \
    AVX2 __attribute__((noinline)) static void name(const uint8_t *row0, size_t rb, int64_t k,            \
                                                    const act_row *a, int nt, float *out, size_t ldo,     \
                                                    void *scratch)                                        \
    {                                                                                                     \
        rows8 w;                                                                                          \
        rows8_layout(&w, k, scratch);                                                                     \
        unpack(&w, tag, row0, rb, k);                                                                     \
        int i = 0;                                                                                        \
        for (; i + 4 <= nt; i += 4)                                                                       \
            tile(ty, &w, k, a + i, 4, out + i * ldo, ldo);                                                \
        switch (nt - i) {                                                                                 \
        case 3: tile(ty, &w, k, a + i, 3, out + i * ldo, ldo); break;                                     \
        case 2: tile(ty, &w, k, a + i, 2, out + i * ldo, ldo); break;                                     \
        case 1: tile(ty, &w, k, a + i, 1, out + i * ldo, ldo); break;                                     \
        }                                                                                                 \
    }
TOKENS8(tokens_q4_0, unpack_b32, tile_b32, LM_Q4_0, LM_Q4_0)
TOKENS8(tokens_q4_1, unpack_b32, tile_b32, LM_Q4_1, LM_Q4_1)
TOKENS8(tokens_q5_0, unpack_b32, tile_b32, LM_Q5_0, LM_Q5_0)
TOKENS8(tokens_q5_1, unpack_b32, tile_b32, LM_Q5_1, LM_Q5_1)
TOKENS8(tokens_q4_0_lanes, unpack_layout, tile_b32, LM_Q4_0_LANES, LM_Q4_0)
TOKENS8(tokens_q5_0_lanes, unpack_layout, tile_b32, LM_Q5_0_LANES, LM_Q5_0)
TOKENS8(tokens_q5_1_lanes, unpack_layout, tile_b32, LM_Q5_1_LANES, LM_Q5_1)
TOKENS8(tokens_q8_0, unpack_b32, tile_b32, LM_Q8_0, LM_Q8_0)
TOKENS8(tokens_q2_k, unpack_k, tile_k, LM_Q2_K, LM_Q2_K)
TOKENS8(tokens_q3_k, unpack_k, tile_k, LM_Q3_K, LM_Q3_K)
TOKENS8(tokens_q4_k, unpack_k, tile_k, LM_Q4_K, LM_Q4_K)
TOKENS8(tokens_q4_k_lanes, unpack_k, tile_k, LM_Q4_K_LANES, LM_Q4_K)
TOKENS8(tokens_q5_k, unpack_k, tile_k, LM_Q5_K, LM_Q5_K)
TOKENS8(tokens_q6_k, unpack_k, tile_k, LM_Q6_K, LM_Q6_K)
#undef TOKENS8

/*
 * nt tokens (a[0..nt)) through the eight rows at row0 (rb bytes apart) of
 * a type lm_rows8_type takes (t; or LM_Q4_0_LANES, LM_Q4_K_LANES, LM_Q5_0_LANES,
 * LM_Q5_1_LANES: those types' rows in their lanes layouts): out[i * ldo + r] for token i and row r.
 * scratch holds lm_rows8_bytes(k), 64-byte aligned.
 */
AVX2 void lm_rows8_avx2(uint32_t t, const uint8_t *row0, size_t rb, int64_t k, const act_row *a, int nt, float *out,
                        size_t ldo, void *scratch)
{
    switch (t) {
    case LM_Q4_0: tokens_q4_0(row0, rb, k, a, nt, out, ldo, scratch); break;
    case LM_Q4_1: tokens_q4_1(row0, rb, k, a, nt, out, ldo, scratch); break;
    case LM_Q5_0: tokens_q5_0(row0, rb, k, a, nt, out, ldo, scratch); break;
    case LM_Q5_1: tokens_q5_1(row0, rb, k, a, nt, out, ldo, scratch); break;
    case LM_Q4_0_LANES: tokens_q4_0_lanes(row0, rb, k, a, nt, out, ldo, scratch); break;
    case LM_Q5_0_LANES: tokens_q5_0_lanes(row0, rb, k, a, nt, out, ldo, scratch); break;
    case LM_Q5_1_LANES: tokens_q5_1_lanes(row0, rb, k, a, nt, out, ldo, scratch); break;
    case LM_Q8_0: tokens_q8_0(row0, rb, k, a, nt, out, ldo, scratch); break;
    case LM_Q2_K: tokens_q2_k(row0, rb, k, a, nt, out, ldo, scratch); break;
    case LM_Q3_K: tokens_q3_k(row0, rb, k, a, nt, out, ldo, scratch); break;
    case LM_Q4_K: tokens_q4_k(row0, rb, k, a, nt, out, ldo, scratch); break;
    case LM_Q4_K_LANES: tokens_q4_k_lanes(row0, rb, k, a, nt, out, ldo, scratch); break;
    case LM_Q5_K: tokens_q5_k(row0, rb, k, a, nt, out, ldo, scratch); break;
    case LM_Q6_K: tokens_q6_k(row0, rb, k, a, nt, out, ldo, scratch); break;
    }
}

#else /* not x86: never called (the AVX2 path is never chosen) */

void lm_rows8_avx2(uint32_t t, const uint8_t *row0, size_t rb, int64_t k, const act_row *a, int nt, float *out,
                   size_t ldo, void *scratch)
{
    (void)t, (void)row0, (void)rb, (void)k, (void)a, (void)nt, (void)out, (void)ldo, (void)scratch;
}

#endif
