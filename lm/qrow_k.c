/*
 * lm/qrow_k.c - one token through a Q4_K, Q5_K or Q6_K row: the kernel
 * that decides how fast a K-quant model generates.
 *
 * Generating a token reads every weight once, so a row must be finished
 * faster than memory delivers it.  On CPUs whose 512-bit work goes to two
 * ports only, the old kernel was bound by those ports at about 10 GB/s a
 * core: some 70 vector operations a super-block, for codes built 64 at a
 * time from 256-bit pieces, scales unpacked in scalar registers, and two
 * horizontal sums.  Here one 64-byte load gives 128 codes (both nibbles
 * of Q4_K/Q5_K; an in-order half of Q6_K), byte shuffles unpack the six-bit
 * scales and mins, and the super-block's code sum and min sum share one
 * reduction tree.  Integer sums are exact, so their order is free; the
 * float steps are lm_dot_k_scalar's, so the result is bitwise the same.
 */
#include "internal.h"
#include "simd.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)

/*
 * The 128 codes of half p of a super-block (codes 128p..128p+127) as two
 * chunks of 64 in order, unsigned (code + offset).
 */
AVX512 static INLINE void half_codes(uint32_t t, const uint8_t *blk, int p, __m512i c[2])
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    if (t == LM_Q6_K) {
        /* ql bytes l, 32+l hold codes l, 32+l (low nibble) and 64+l, 96+l
           (high); qh byte l their top two bits, at bits 0, 2, 4, 6 */
        const __m512i shift = _mm512_set_epi64(2 * 0x0001000100010001ll, 2 * 0x0001000100010001ll,
                                               2 * 0x0001000100010001ll, 2 * 0x0001000100010001ll, 0, 0, 0, 0);
        const __m512i m30 = _mm512_set1_epi8(0x30);
        __m512i x = _mm512_loadu_si512(blk + 64 * p);
        __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * p)));
        h = _mm512_srlv_epi16(h, shift);
        c[0] = _mm512_ternarylogic_epi32(_mm512_and_si512(x, m4), _mm512_slli_epi16(h, 4), m30, 0xf8);
        c[1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(x, 4), m4), h, m30, 0xf8);
        return;
    }
    /* Q4_K/Q5_K: ql bytes 64p+l hold code 128p+l (low nibble) and 128p+32+l
       (high), bytes 64p+32+l codes 128p+64+l and 128p+96+l */
    __m512i x = _mm512_loadu_si512(blk + (t == LM_Q4_K ? 16 : 48) + 64 * p);
    __m512i lo = _mm512_and_si512(x, m4), hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
    if (t == LM_Q5_K) { /* bit j of qh byte l: the fifth bit of code 32j + l */
        const __m512i shift = _mm512_set_epi64(0x0001000100010001ll * (4 * p + 2), 0x0001000100010001ll * (4 * p + 2),
                                               0x0001000100010001ll * (4 * p + 2), 0x0001000100010001ll * (4 * p + 2),
                                               0x0001000100010001ll * (4 * p), 0x0001000100010001ll * (4 * p),
                                               0x0001000100010001ll * (4 * p), 0x0001000100010001ll * (4 * p));
        const __m512i m10 = _mm512_set1_epi8(0x10);
        __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)));
        h = _mm512_srlv_epi16(h, shift);
        lo = _mm512_ternarylogic_epi32(lo, _mm512_slli_epi16(h, 4), m10, 0xf8);
        hi = _mm512_ternarylogic_epi32(hi, _mm512_slli_epi16(h, 3), m10, 0xf8);
    }
    c[0] = _mm512_permutex2var_epi64(lo, _mm512_set_epi64(11, 10, 9, 8, 3, 2, 1, 0), hi);
    c[1] = _mm512_permutex2var_epi64(lo, _mm512_set_epi64(15, 14, 13, 12, 7, 6, 5, 4), hi);
}

/* A super-block's scales as 16-bit words, and its f16 factors. */
typedef struct kscales {
    __m512i sc[4];   /* chunk z (codes 64z..): lane j's scale in its low word, high word 0 */
    __m256i mn;      /* the min of every 16 codes (Q4_K/Q5_K) */
    float d, dmin;
} kscales;

/*
 * Q4_K/Q5_K pack eight six-bit scales and mins in 12 bytes (q below, bytes
 * 4..15 of the block): scale j < 4 is q[j] & 63, min j < 4 is q[j+4] & 63;
 * for j >= 4 the low four bits come from q[j+4] (scale: low nibble, min:
 * high) and the top two from bits 6-7 of q[j-4] (scale) or q[j] (min).
 */
AVX512 static INLINE __m128i six_bit_scales(__m128i x)
{
    const __m128i lo_src = _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m128i hi_src = _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11);
    const __m128i keep = _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15);
    __m128i lo = _mm_shuffle_epi8(x, lo_src), hi = _mm_shuffle_epi8(x, hi_src);
    lo = _mm_and_si128(_mm_mask_blend_epi8(0xf000, lo, _mm_srli_epi16(lo, 4)), keep);
    return _mm_ternarylogic_epi32(lo, _mm_srli_epi16(hi, 2), _mm_set1_epi8(0x30), 0xf8);
}

AVX512 static INLINE void decode_scales(uint32_t t, const uint8_t *blk, kscales *ks)
{
    __m256i s16;
    if (t == LM_Q6_K) { /* 16 signed scales, one per 16 codes: lane j of chunk z has 4z + j/4 */
        s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
        _Pragma("GCC unroll 4")
        for (int z = 0; z < 4; z++) {
            __m512i idx = _mm512_set_epi32(4 * z + 3, 4 * z + 3, 4 * z + 3, 4 * z + 3, 4 * z + 2, 4 * z + 2,
                                           4 * z + 2, 4 * z + 2, 4 * z + 1, 4 * z + 1, 4 * z + 1, 4 * z + 1,
                                           4 * z, 4 * z, 4 * z, 4 * z);
            ks->sc[z] = _mm512_maskz_permutexvar_epi16(0x55555555, idx, _mm512_castsi256_si512(s16));
        }
        ks->mn = _mm256_setzero_si256();
        uint16_t h;
        memcpy(&h, blk + 208, 2);
        ks->d = _cvtsh_ss(h), ks->dmin = 0.0f;
        return;
    }
    __m128i x = _mm_loadu_si128((const __m128i *)blk);
    s16 = _mm256_cvtepu8_epi16(six_bit_scales(x)); /* words 0-7 scales, 8-15 mins */
    _Pragma("GCC unroll 4")
    for (int z = 0; z < 4; z++) { /* chunk z: groups of 32 codes 2z, 2z+1 */
        __m512i idx = _mm512_set_epi32(2 * z + 1, 2 * z + 1, 2 * z + 1, 2 * z + 1, 2 * z + 1, 2 * z + 1,
                                       2 * z + 1, 2 * z + 1, 2 * z, 2 * z, 2 * z, 2 * z, 2 * z, 2 * z, 2 * z, 2 * z);
        ks->sc[z] = _mm512_maskz_permutexvar_epi16(0x55555555, idx, _mm512_castsi256_si512(s16));
    }
    ks->mn = _mm256_permutexvar_epi16(_mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15),
                                      s16);
    __m128 dd = _mm_cvtph_ps(x);
    ks->d = _mm_cvtss_f32(dd), ks->dmin = _mm_cvtss_f32(_mm_movehdup_ps(dd));
}

/* A super-block's codes: chunk z holds codes 64z..64z+63. */
AVX512 static INLINE void block_codes(uint32_t t, const uint8_t *blk, __m512i c[4])
{
    half_codes(t, blk, 0, c);
    half_codes(t, blk, 1, c + 2);
}

/* Super-block b for one token: the exact sum of code times scale (lane 0) and of min times group sum (lane 8). */
AVX512 static INLINE __m512i block_sums(uint32_t t, const __m512i c[4], const kscales *ks, const act_row *a,
                                        int64_t b)
{
    const int off = t == LM_Q6_K;
    __m512i s[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()}; /* two chains, not one of four */
    _Pragma("GCC unroll 4")
    for (int z = 0; z < 4; z++) {
        int64_t e = b * 256 + 64 * z;
        __m512i seed = off ? _mm512_loadu_si512(a->negcorr + e / 4) : _mm512_setzero_si512();
        __m512i v = _mm512_dpbusd_epi32(seed, c[z], _mm512_loadu_si512(a->qs + e));
        s[z & 1] = _mm512_dpwssd_epi32(s[z & 1], v, ks->sc[z]);
    }
    __m512i sum = _mm512_add_epi32(s[0], s[1]);
    __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64(sum, 1));
    __m256i m8 = off ? _mm256_setzero_si256() /* Q6_K has no mins */
                     : _mm256_madd_epi16(ks->mn, _mm256_loadu_si256((const __m256i *)(a->sum16 + b * 16)));
    __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(s8), m8, 1);
    x = _mm512_add_epi32(x, _mm512_shuffle_i64x2(x, x, 0xb1));
    x = _mm512_add_epi32(x, _mm512_shuffle_epi32(x, 0x4e));
    return _mm512_add_epi32(x, _mm512_shuffle_epi32(x, 0xb1));
}

/* n (1..LM_ROW_K_TOKENS) tokens through a row, each super-block decoded once for all. */
AVX512 static INLINE void row_k(uint32_t t, size_t bs, const uint8_t *row, int64_t k, const act_row *a, int n,
                                float *out)
{
    float acc[LM_ROW_K_TOKENS] = {0}, mins[LM_ROW_K_TOKENS] = {0};
    kscales ks;
    __m512i c[4];
    for (int64_t b = 0; b < k / 256; b++) {
        const uint8_t *blk = row + (size_t)b * bs;
        lm_prefetch_ahead(blk, bs);
        decode_scales(t, blk, &ks);
        block_codes(t, blk, c);
        for (int j = 0; j < n; j++) {
            __m512 f = _mm512_cvtepi32_ps(block_sums(t, c, &ks, &a[j], b));
            acc[j] = __builtin_fmaf(ks.d * a[j].d[b], _mm512_cvtss_f32(f), acc[j]);
            if (t != LM_Q6_K) /* Q6_K's min term is +0 */
                mins[j] += (ks.dmin * a[j].d[b]) * _mm_cvtss_f32(_mm512_extractf32x4_ps(f, 2));
        }
    }
    for (int j = 0; j < n; j++)
        out[j] = acc[j] - mins[j];
}

/* The row's type as a constant, and one token apart: generation's case, kept in registers. */
AVX512 static INLINE void row_k_n(uint32_t t, size_t bs, const uint8_t *row, int64_t k, const act_row *a, int n,
                                  float *out)
{
    if (n == 1)
        row_k(t, bs, row, k, a, 1, out);
    else
        row_k(t, bs, row, k, a, n, out);
}

AVX512 void lm_row_k_avx512(uint32_t t, const uint8_t *row, int64_t k, const act_row *a, int n, float *out)
{
    switch (t) {
    case LM_Q4_K: row_k_n(LM_Q4_K, 144, row, k, a, n, out); break;
    case LM_Q5_K: row_k_n(LM_Q5_K, 176, row, k, a, n, out); break;
    default: row_k_n(LM_Q6_K, 210, row, k, a, n, out); break;
    }
}

#else

void lm_row_k_avx512(uint32_t t, const uint8_t *row, int64_t k, const act_row *a, int n, float *out)
{
    (void)t, (void)row, (void)k, (void)a, (void)n, (void)out; /* never called: lm_cpu_isa() is scalar */
}

#endif
