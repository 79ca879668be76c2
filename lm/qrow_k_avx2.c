/*
 * lm/qrow_k_avx2.c - one token through K-quant rows (Q2_K to Q6_K) read as
 * the file stores them, on x86 CPUs with AVX2 but not AVX-512 (AVX-512
 * CPUs take them for Q2_K and Q3_K, which have no kernel of their own).
 * qdot_avx2.c's lm_rows_avx2 hands these types here; qrow_klanes_avx2.c
 * takes a rearranged Q4_K row's last super-blocks here (lm_k_blocks_avx2).
 *
 * A 32-code chunk's products meet their group scales in one multiply-add
 * (its scales spread by one byte shuffle), a super-block's sums stay in
 * eight int32 lanes, and four super-blocks, one a lane of the scalar
 * code's four float lanes, share one horizontal sum and one conversion of
 * their f16 factors: tinyllama Q6_K generating 15.0 -> 17.3 t/s on Zen 1.
 * Every sum is the exact integer of lm_dot_k_scalar and every float step
 * its own, so the bytes are the scalar code's; tests compare them.
 */
#include "internal.h"
#include "simd.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)

/* Scale times code times activation over 32 codes (sc: each code pair's scale), into acc's lanes. */
AVX2 static INLINE __m256i scaled_chunk(__m256i acc, __m256i u, const int8_t *a, __m256i sc)
{
    __m256i p = _mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)a)); /* codes < 64: exact */
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc));
}

/*
 * Byte shuffles putting one 16-bit word of a 128-bit half in every word of
 * the low half and one in every word of the high: same[j] word j in both,
 * pair[j] words 2j and 2j + 1.  A table, so each is one load (built in the
 * loop, each had cost four operations a super-block).
 */
#define PICK(j) (uint16_t)(0x0100 + 0x0202 * (j))
#define PICKS(j0, j1)                                                                                     \
    {PICK(j0), PICK(j0), PICK(j0), PICK(j0), PICK(j0), PICK(j0), PICK(j0), PICK(j0),                     \
     PICK(j1), PICK(j1), PICK(j1), PICK(j1), PICK(j1), PICK(j1), PICK(j1), PICK(j1)}
static const uint16_t picks_same[8][16] __attribute__((aligned(32))) = {
    PICKS(0, 0), PICKS(1, 1), PICKS(2, 2), PICKS(3, 3), PICKS(4, 4), PICKS(5, 5), PICKS(6, 6), PICKS(7, 7)};
static const uint16_t picks_pair[4][16] __attribute__((aligned(32))) = {PICKS(0, 1), PICKS(2, 3), PICKS(4, 5),
                                                                         PICKS(6, 7)};
#undef PICKS
#undef PICK

/* K-quants of 16 groups of 16 codes (Q4_K and Q5_K: 8 of 32). */
#define K_GROUPS16(t) ((t) == LM_Q2_K || (t) == LM_Q3_K || (t) == LM_Q6_K)

/*
 * The sum over a K-quant super-block of scale * unsigned code *
 * activation, in 8 lanes.  lo holds the scales of groups 0-7 as 16-bit
 * words in both 128-bit halves, hi (16 groups of 16 codes) those of 8-15,
 * and a chunk's (Q4_K, Q5_K: its 32-code group's; the others: groups 2c
 * and 2c + 1, one a half) are spread by one byte shuffle (building each
 * from two scalars had cost five operations a chunk).
 */
AVX2 static INLINE __m256i superblock_sums(uint32_t t, const uint8_t *blk, const int8_t *a, __m256i lo, __m256i hi)
{
    __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) { /* codes 32c.. */
        __m256i sc = K_GROUPS16(t)
                         ? _mm256_shuffle_epi8(c < 4 ? lo : hi, _mm256_load_si256((const __m256i *)picks_pair[c % 4]))
                         : _mm256_shuffle_epi8(lo, _mm256_load_si256((const __m256i *)picks_same[c]));
        acc = scaled_chunk(acc, k_codes32(t, blk, c), a + 32 * c, sc);
    }
    return acc;
}

/* Eight signed scale bytes at p as 16-bit words, in both 128-bit halves. */
AVX2 static INLINE __m256i scales8_both(const uint8_t *p)
{
    int64_t x;
    memcpy(&x, p, 8);
    return _mm256_cvtepi8_epi16(_mm_set1_epi64x(x));
}

/*
 * Super-block blk (activation codes qs, group sums s16) in 8 int32 lanes:
 * *sums add up to its scale * code * activation total less the code
 * offset's share (Q6_K: 32, Q3_K: 4, times each scale * group's
 * activation sum), *mins (Q2_K, Q4_K, Q5_K) to min * group activation sum.
 * The scale halves are built from the bytes (a lane-crossing permute is
 * eight operations on Zen 1), and the offset comes off lane by lane, so a
 * super-block needs one horizontal sum, and four share it (hsum4x8_epi32).
 */
AVX2 static INLINE void k_block_lanes(uint32_t t, const uint8_t *blk, const int8_t *qs, const int16_t *s16,
                                      __m256i *sums, __m256i *mins)
{
    const __m256i g16 = _mm256_loadu_si256((const __m256i *)s16);
    __m256i lo, hi = _mm256_setzero_si256(), off = _mm256_setzero_si256();
    *mins = _mm256_setzero_si256();
    if (t == LM_Q6_K) { /* codes 0..63 for -32..31 */
        lo = scales8_both(blk + 192), hi = scales8_both(blk + 200);
        const __m256i all = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
        off = _mm256_slli_epi32(_mm256_madd_epi16(all, g16), 5);
    } else if (t == LM_Q2_K || t == LM_Q3_K) { /* Q3_K: codes 0..7 for -4..3 */
        __m256i m16, all = q23k_scales(t, blk, &m16);
        lo = _mm256_inserti128_si256(all, _mm256_castsi256_si128(all), 1);
        hi = _mm256_inserti128_si256(all, _mm256_extracti128_si256(all, 1), 0);
        if (t == LM_Q3_K)
            off = _mm256_slli_epi32(_mm256_madd_epi16(all, g16), 2);
        else
            *mins = _mm256_madd_epi16(m16, g16);
    } else {
        uint64_t sc8, mn8;
        k4_scales8(blk + 4, &sc8, &mn8);
        lo = _mm256_cvtepu8_epi16(_mm_set1_epi64x((long long)sc8));
        const __m128i m8 = _mm_cvtsi64_si128((long long)mn8);
        *mins = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)), g16); /* each min twice */
    }
    *sums = _mm256_sub_epi32(superblock_sums(t, blk, qs, lo, hi), off);
}

/* Lane i: the sum of v[i]'s 8 lanes (exact: int32 adds). */
AVX2 static INLINE __m128i hsum4x8_epi32(const __m256i v[4])
{
    const __m256i a = _mm256_add_epi32(_mm256_unpacklo_epi32(v[0], v[1]), _mm256_unpackhi_epi32(v[0], v[1]));
    const __m256i b = _mm256_add_epi32(_mm256_unpacklo_epi32(v[2], v[3]), _mm256_unpackhi_epi32(v[2], v[3]));
    const __m256i c = _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
    return _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
}

/* Super-block b of a K-quant row into its lanes of acc and mins, alone. */
AVX2 static INLINE void k_block_one(uint32_t t, const uint8_t *row, size_t bs, int64_t b, const act_row *a,
                                    float *acc, float *mins)
{
    const uint8_t *blk = row + (size_t)b * bs;
    __m256i s, m;
    lm_prefetch_ahead(blk, bs, 1, a->ahead);
    k_block_lanes(t, blk, a->qs + b * 256, a->sum16 + b * 16, &s, &m);
    const float dd = half(blk + lm_k_d_at(t)) * a->d[b];
    acc[b % LM_K_LANES] = __builtin_fmaf(dd, (float)hsum8_epi32(s), acc[b % LM_K_LANES]);
    if (lm_k_m_at(t)) /* (else the scalar code adds zeros) */
        mins[b % LM_K_LANES] += (half(blk + lm_k_m_at(t)) * a->d[b]) * (float)hsum8_epi32(m); /* lm_k_mins */
}

_Static_assert(LM_K_LANES == 4, "k_blocks_avx2 keeps the lanes in one 4-float vector");

/*
 * lm_dot_k_avx2 on a row's super-blocks as stored, into the lanes acc and
 * mins (b % LM_K_LANES): lm_dot_k_scalar's float steps, four super-blocks
 * (one a lane) at a time where b0..b1 has them in lane order.
 */
AVX2 static INLINE void k_blocks_avx2(uint32_t t, const uint8_t *row, size_t bs, int64_t b0, int64_t b1,
                                      const act_row *a, float *acc, float *mins)
{
    int64_t b = b0;
    for (; b < b1 && b % LM_K_LANES; b++)
        k_block_one(t, row, bs, b, a, acc, mins);
    __m128 acc4 = _mm_loadu_ps(acc), mins4 = _mm_loadu_ps(mins);
    for (; b + LM_K_LANES <= b1; b += LM_K_LANES) {
        __m256i s[LM_K_LANES], m[LM_K_LANES];
        for (int i = 0; i < LM_K_LANES; i++) {
            const uint8_t *blk = row + (size_t)(b + i) * bs;
            lm_prefetch_ahead(blk, bs, 1, a->ahead);
            k_block_lanes(t, blk, a->qs + (b + i) * 256, a->sum16 + (b + i) * 16, &s[i], &m[i]);
        }
        const __m128 ad = _mm_loadu_ps(a->d + b);
        const __m128 dd = _mm_mul_ps(halves4(row + (size_t)b * bs + lm_k_d_at(t), bs), ad);
        acc4 = _mm_fmadd_ps(dd, _mm_cvtepi32_ps(hsum4x8_epi32(s)), acc4);
        if (lm_k_m_at(t)) { /* lm_k_mins: (m * d) * msum */
            const __m128 md = _mm_mul_ps(halves4(row + (size_t)b * bs + lm_k_m_at(t), bs), ad);
            mins4 = _mm_add_ps(mins4, _mm_mul_ps(md, _mm_cvtepi32_ps(hsum4x8_epi32(m))));
        }
    }
    _mm_storeu_ps(acc, acc4), _mm_storeu_ps(mins, mins4);
    for (; b < b1; b++)
        k_block_one(t, row, bs, b, a, acc, mins);
}

AVX2 static INLINE float row_k_avx2(uint32_t t, const uint8_t *row, size_t bs, int64_t k, const act_row *a)
{
    float acc[LM_K_LANES] = {0}, mins[LM_K_LANES] = {0};
    k_blocks_avx2(t, row, bs, 0, k / 256, a, acc, mins);
    return lm_k_total(acc, mins);
}

/* Super-blocks b0..b1-1 of a K-quant row as stored, into the lanes acc and mins (b % LM_K_LANES). */
AVX2 void lm_k_blocks_avx2(uint32_t t, const uint8_t *row, int64_t b0, int64_t b1, const act_row *a, float *acc,
                           float *mins)
{
    k_blocks_avx2(t, row, lm_type_size(t), b0, b1, a, acc, mins);
}

ROWS_AVX2(rows_q2_k_avx2, row_k_avx2, LM_Q2_K, 84)
ROWS_AVX2(rows_q3_k_avx2, row_k_avx2, LM_Q3_K, 110)
ROWS_AVX2(rows_q4_k_avx2, row_k_avx2, LM_Q4_K, 144)
ROWS_AVX2(rows_q5_k_avx2, row_k_avx2, LM_Q5_K, 176)
ROWS_AVX2(rows_q6_k_avx2, row_k_avx2, LM_Q6_K, 210)

/* One token through nr K-quant rows (rb bytes apart) as stored; 0, doing nothing, for other types. */
AVX2 int lm_rows_k_avx2(uint32_t t, const uint8_t *row0, size_t rb, int64_t nr, int64_t k, const act_row *a,
                        float *out)
{
    switch (t) {
    case LM_Q2_K: rows_q2_k_avx2(row0, rb, nr, k, a, out); return 1;
    case LM_Q3_K: rows_q3_k_avx2(row0, rb, nr, k, a, out); return 1;
    case LM_Q4_K: rows_q4_k_avx2(row0, rb, nr, k, a, out); return 1;
    case LM_Q5_K: rows_q5_k_avx2(row0, rb, nr, k, a, out); return 1;
    case LM_Q6_K: rows_q6_k_avx2(row0, rb, nr, k, a, out); return 1;
    default: return 0;
    }
}

#else /* not x86: never called (the AVX2 path is never chosen) */

int lm_rows_k_avx2(uint32_t t, const uint8_t *row0, size_t rb, int64_t nr, int64_t k, const act_row *a,
                   float *out)
{
    (void)t, (void)row0, (void)rb, (void)nr, (void)k, (void)a, (void)out;
    return 0;
}
void lm_k_blocks_avx2(uint32_t t, const uint8_t *row, int64_t b0, int64_t b1, const act_row *a, float *acc,
                      float *mins)
{
    (void)t, (void)row, (void)b0, (void)b1, (void)a, (void)acc, (void)mins;
}

#endif
