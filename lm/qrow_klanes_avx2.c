/*
 * lm/qrow_klanes_avx2.c - one token through Q4_K rows in their lanes
 * layout (repack.c) on x86 CPUs with AVX2 but not AVX-512.
 *
 * As the file has them, qrow_k_avx2.c's kernel meets every 32 codes' group
 * scale with a multiply of its own and adds each super-block across the
 * vector.  On a core whose vector multiplies go through one pipe (Zen 1
 * and 2 split every 256-bit multiply in two halves there), those
 * multiplies and sums, not memory, set the pace: tinyllama Q4_K_M
 * generated 18 tokens/s, reading half of what the machine reads.  In the
 * lanes layout lane 4b + g of a step's code vectors holds 4 codes of group
 * g (low nibbles) and g + 4 (high) of super-block b, so a lane adds its
 * group's pair sums over the step's 8 chunks in 16 bits (16 products of
 * at most 15 * 128: 30720), and the step meets its scales in four word
 * multiply-adds and its mins in two.  Each 128-bit half of a vector is
 * one super-block, where its total comes out of a short tree.  The token's
 * codes are laid out to match (lm_act_klanes).  The sums are exact
 * integers and the float steps lm_dot_k_scalar's, in the lanes where
 * k_lanes_total (simd.h) wants them, so the bytes out are the file's.
 */
#include "internal.h"
#include "simd.h"

#if defined(__x86_64__) && defined(__GNUC__)

/* The same 16 bytes in both 128-bit halves (byte shuffles and masks work within each). */
#define EACH_LANE(...) _mm256_broadcastsi128_si256(_mm_setr_epi8(__VA_ARGS__))

/*
 * The 16 bytes of each 128-bit lane's Q4_K header (d, dmin, scales) ->
 * scales in bytes 0-7, mins in 8-15: simd.h's six_bit_scales in AVX2
 * (a variable blend for its byte mask, and and-or for its ternary logic).
 */
AVX2 static INLINE __m256i six_bit_scales_avx2(__m256i x)
{
    const __m256i lo_src = EACH_LANE(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m256i hi_src = EACH_LANE(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11);
    const __m256i keep = EACH_LANE(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15);
    const __m256i upper = EACH_LANE(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1, -1, -1, -1);
    __m256i lo = _mm256_shuffle_epi8(x, lo_src), hi = _mm256_shuffle_epi8(x, hi_src);
    lo = _mm256_and_si256(_mm256_blendv_epi8(lo, _mm256_srli_epi16(lo, 4), upper), keep); /* mins 4-7: high nibbles */
    return _mm256_or_si256(lo, _mm256_and_si256(_mm256_srli_epi16(hi, 2), _mm256_set1_epi8(0x30)));
}

/* 32 bytes of a step, and its line asked for as one token's are (lm_prefetch_ahead). */
AVX2 static INLINE __m256i load_line(const uint8_t *p, size_t ahead)
{
    lm_prefetch_ahead(p, 64, 1, ahead);
    return _mm256_loadu_si256((const __m256i *)p);
}

/* The word pairs of each lane's group sums (A) times their scales or mins (f): one dword a lane. */
#define LANE_SCALES(i0, i1, i2, i3) EACH_LANE(i0, -1, i0, -1, i1, -1, i1, -1, i2, -1, i2, -1, i3, -1, i3, -1)

/*
 * Step s of a rearranged Q4_K row for one token into acc: lanes 2b and
 * 2b + 1 the sums and the mins of super-block b of the step.
 */
AVX2 static INLINE __m256 q4_k_step_avx2(const uint8_t *st, const act_row *a, int64_t s, __m256 acc)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i hd[2] = {load_line(st, a->ahead), _mm256_loadu_si256((const __m256i *)(st + 32))};
    __m256i A[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    const int8_t *q = a->qw + 1024 * s;
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) { /* A[2h]: the low nibbles of super-blocks 2h, 2h + 1; A[2h + 1] the high */
        const __m256i w[2] = {load_line(st + 64 + 64 * c, a->ahead),
                              _mm256_loadu_si256((const __m256i *)(st + 96 + 64 * c))};
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i lo = _mm256_and_si256(w[h], m4), hi = _mm256_and_si256(_mm256_srli_epi16(w[h], 4), m4);
            const int8_t *qc = q + 128 * c + 32 * h;
            const __m256i qlo = _mm256_loadu_si256((const __m256i *)qc);
            const __m256i qhi = _mm256_loadu_si256((const __m256i *)(qc + 64));
            A[2 * h] = _mm256_add_epi16(A[2 * h], _mm256_maddubs_epi16(lo, qlo));
            A[2 * h + 1] = _mm256_add_epi16(A[2 * h + 1], _mm256_maddubs_epi16(hi, qhi));
            OPAQUE256X2(A[2 * h], A[2 * h + 1]);
        }
    }
    __m256i T[2], M[2];
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) { /* lane 4b + g: scale g times group g, g + 4 times g + 4; then the mins */
        const __m256i s8 = six_bit_scales_avx2(hd[h]);
        T[h] = _mm256_add_epi32(_mm256_madd_epi16(A[2 * h], _mm256_shuffle_epi8(s8, LANE_SCALES(0, 1, 2, 3))),
                                _mm256_madd_epi16(A[2 * h + 1], _mm256_shuffle_epi8(s8, LANE_SCALES(4, 5, 6, 7))));
        const __m256i mins = EACH_LANE(8, -1, 12, -1, 9, -1, 13, -1, 10, -1, 14, -1, 11, -1, 15, -1);
        const __m256i mw = _mm256_shuffle_epi8(s8, mins);
        M[h] = _mm256_madd_epi16(mw, _mm256_loadu_si256((const __m256i *)(a->ncw + 16 * s + 8 * h)));
    }
    /* per 128-bit lane b: its sums then its mins, added in pairs twice; then in super-block order */
    const __m256i Y = _mm256_hadd_epi32(_mm256_hadd_epi32(T[0], M[0]), _mm256_hadd_epi32(T[1], M[1]));
    const __m256 f = _mm256_cvtepi32_ps(_mm256_permute4x64_epi64(Y, 0xd8));
    /* d and dmin of super-blocks 0-3 (the header's first dword each), times the token's scales */
    const __m256i dm = _mm256_permutevar8x32_epi32(_mm256_unpacklo_epi32(hd[0], hd[1]),
                                                   _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0));
    const __m256 ad = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(a->d + 4 * s)),
                                               _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
    const __m256 p = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(dm)), ad);
    /* lm_dot_k_scalar's float steps: acc = fma(d * ad, isum, acc); mins += (dmin * ad) * msum */
    return _mm256_blend_ps(_mm256_fmadd_ps(p, f, acc), _mm256_add_ps(acc, _mm256_mul_ps(p, f)), 0xaa);
}
#undef LANE_SCALES
#undef EACH_LANE

/*
 * One token through a rearranged Q4_K row: its whole steps, then the
 * super-blocks left as the file has them (on AVX2 only, rows may end past
 * their steps: repack.c's layout_for).
 */
AVX2 static INLINE float row_q4_k_lanes(const uint8_t *row, int64_t k, const act_row *a)
{
    __m256 acc = _mm256_setzero_ps();
    const int64_t steps = k / 1024, nb = k / 256;
    for (int64_t s = 0; s < steps; s++)
        acc = q4_k_step_avx2(row + LM_Q4_K_STEP_BYTES * s, a, s, acc);
    if (4 * steps == nb)
        return k_lanes_total(acc);
    float lanes[8], sums[LM_K_LANES], mins[LM_K_LANES];
    _mm256_storeu_ps(lanes, acc);
    for (int b = 0; b < LM_K_LANES; b++)
        sums[b] = lanes[2 * b], mins[b] = lanes[2 * b + 1];
    lm_k_blocks_avx2(LM_Q4_K, row, 4 * steps, nb, a, sums, mins);
    return lm_k_total(sums, mins);
}

/*
 * One token (a, its codes in the layout's order: a->klanes) through nr
 * rearranged rows rb bytes apart.  Returns 0, doing nothing, for a layout
 * it does not read (Q6_K's).
 */
AVX2 __attribute__((noinline)) int lm_rows_klanes_avx2(uint32_t tag, const uint8_t *row0, size_t rb, int64_t nr,
                                                        int64_t k, const act_row *a, float *out)
{
    if (tag != LM_Q4_K_LANES)
        return 0;
    for (int64_t r = 0; r < nr; r++)
        out[r] = row_q4_k_lanes(row0 + (size_t)r * rb, k, a);
    return 1;
}

#else /* not x86-64: never called, the layouts are not used (lm_klanes_layout_native) */

int lm_rows_klanes_avx2(uint32_t tag, const uint8_t *row0, size_t rb, int64_t nr, int64_t k, const act_row *a,
                        float *out)
{
    (void)tag, (void)row0, (void)rb, (void)nr, (void)k, (void)a, (void)out;
    return 0;
}

#endif
