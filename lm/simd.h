/*
 * lm/simd.h - what the x86 kernel files share (qdot_simd.c, qdot_avx2.c,
 * qgemm.c, qgemm_avx2.c, attention_simd.c, attention_avx2.c, qact_simd.c,
 * qrow_k.c, qrow_klanes.c):
 * the target attributes that let one binary carry AVX2 and AVX-512 code
 * for CPUs chosen at run time, the one tree by which every path adds 16
 * float lanes, and helpers more than one file uses.
 */
#ifndef LM_SIMD_H
#define LM_SIMD_H

#include "internal.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/*
 * The instructions a function may use, the inlining the kernels count on,
 * and an empty asm that makes a 512-bit value opaque (it stays where it
 * was loaded).  Built with LM_EMULATE_AVX512 (`make check-avx512emu`,
 * tests/avx512emu), the AVX-512 intrinsics are portable code run on an
 * AVX2 CPU: every function is compiled for AVX2, GCC chooses what to
 * inline (every unrolled copy inlined, the emulated kernels took minutes
 * to compile), and the opaque values live in memory.  The sanitizer and
 * fuzz builds (LM_CHOSEN_INLINING) let the compiler choose too: the same
 * operations in the same order, so the same bytes, and their kernels
 * compile in a tenth of the time (attention_simd.c 45 -> 2 s under gcc's
 * sanitizers).
 */
#ifdef LM_EMULATE_AVX512
#define X86_TARGET(isa) __attribute__((target("avx2,fma,f16c")))
#define OPAQUE512(x) __asm__("" : "+m"(x))
#else
#define X86_TARGET(isa) __attribute__((target(isa)))
#define OPAQUE512(x) __asm__("" : "+v"(x))
#endif
#if defined(LM_EMULATE_AVX512) || defined(LM_CHOSEN_INLINING)
#define INLINE inline
#else
#define INLINE __attribute__((always_inline)) inline
#endif
#define AVX2 X86_TARGET("avx2,fma,f16c")
/*
 * Two 256-bit sums kept as they are at this point: GCC otherwise
 * reassociates a kernel's unrolled chains of integer adds into trees, with
 * every product alive at once, and spills them (Zen 1: one token through
 * Q4_K rows in lanes 29.3 -> 26.6 cycles a 256 weights from L2).
 */
#define OPAQUE256X2(a, b) __asm__("" : "+x"(a), "+x"(b))
#define OPAQUE256(a) __asm__("" : "+x"(a))
#define AVX512 X86_TARGET("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")

/*
 * A vector of 64 weight bytes read from memory once.  A kernel that takes
 * both nibbles of each byte uses the vector twice, and GCC folds the load
 * into both uses: two loads of every weight byte, where loads are much of
 * a one-token kernel's work (Q4_0 in lanes, one thread, rows from L2:
 * 20.8 -> 17.9 ticks a 16-block step with one load).  The empty asm makes
 * the value opaque, so it stays in the register it was loaded into.
 */
AVX512 static INLINE __m512i load_once512(const void *p)
{
    __m512i x = _mm512_loadu_si512(p);
    OPAQUE512(x);
    return x;
}

/* Eight F16 or BF16 values at p as floats (both conversions exact, as lm_dequant_row's). */
AVX2 static INLINE __m256 halves_ps(uint32_t t, const uint8_t *p)
{
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    return t == LM_F16 ? _mm256_cvtph_ps(h) : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* lm_hsum16 of the 16 lanes lo (0-7) and hi (8-15): halves, quarters, then (0+2) + (1+3). */
AVX2 static INLINE float hsum16_avx2(__m256 lo, __m256 hi)
{
    __m256 t8 = _mm256_add_ps(lo, hi);
    __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
    __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    return _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)));
}

/*
 * The end of lm_dot_f_scalar's 16 lanes (lo, hi): the last n (< 16)
 * products x[j] * y[j] into lanes 0.., the tree; in registers where there
 * are none (a float tile ends 24 dots at once: llama3.2-1b BF16 prompts of
 * 64 tokens, Zen 5, two rounds alternated, 123.6-125.1 -> 129.4-130.4 t/s
 * against a store and lm_hsum16 for each; F16 level within the noise).
 */
AVX2 static INLINE float dot16_end(__m256 lo, __m256 hi, const float *x, const float *y, int64_t n)
{
    if (n == 0)
        return hsum16_avx2(lo, hi);
    float acc[16];
    _mm256_storeu_ps(acc, lo);
    _mm256_storeu_ps(acc + 8, hi);
    for (int64_t j = 0; j < n; j++)
        acc[j] = __builtin_fmaf(x[j], y[j], acc[j]);
    return lm_hsum16(acc);
}

/* The same tree over one vector of 16. */
AVX512 static INLINE float hsum16_avx512(__m512 acc)
{
    return hsum16_avx2(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
}

/*
 * Eight floats (lanes 8h..8h+7 of 16 partial sums) added, as doubles, to
 * the partial sums in part4 (four vectors of four): lm_sumsq's and
 * lm_softmax_exp's lanes in AVX2.
 */
AVX2 static INLINE void add_parts8(__m256d part4[4], int h, __m256 v)
{
    part4[2 * h] = _mm256_add_pd(part4[2 * h], _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    part4[2 * h + 1] = _mm256_add_pd(part4[2 * h + 1], _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

/* The 16 partial sums in order. */
AVX2 static inline void store_parts16(double part[16], const __m256d part4[4])
{
    for (int j = 0; j < 4; j++)
        _mm256_storeu_pd(part + 4 * j, part4[j]);
}

/* The f16 at p as f32, by F16C. */
AVX2 static inline float half(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 16 bytes of nibbles -> 32 codes: low nibbles first, then high. */
AVX2 static inline __m256i nibbles32(const uint8_t *p)
{
    __m128i x = _mm_loadu_si128((const __m128i *)p);
    __m256i both = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

/* 32 bits -> 32 bytes of 0x00 / 0x10 (the fifth bit of Q5 codes). */
AVX2 static inline __m256i bits32(uint32_t bits)
{
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    const __m256i mask = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, mask), mask);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

/*
 * The f16 at p + r * rb of each of eight rows, as f32: inserted into a
 * vector one by one (stored as 16-bit values and read back as one vector,
 * they stalled on the store forwarding).
 */
AVX2 static INLINE __m256 halves8(const uint8_t *p, size_t rb)
{
    uint16_t h[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++)
        memcpy(&h[r], p + r * rb, 2);
    return _mm256_cvtph_ps(_mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3], (short)h[4],
                                          (short)h[5], (short)h[6], (short)h[7]));
}

/* The f16 at p + i * stride for i = 0..3, as f32: four blocks' scales (put together in a scalar). */
AVX2 static INLINE __m128 halves4(const uint8_t *p, size_t stride)
{
    uint64_t x = 0;
    for (int i = 0; i < 4; i++) {
        uint16_t h;
        memcpy(&h, p + (size_t)i * stride, 2);
        x |= (uint64_t)h << (16 * i);
    }
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)x));
}

/* Rows one after another through row_fn, each type a function of its own (type and block size constants inside). */
#define ROWS_AVX2(name, row_fn, t, bs)                                                               \
    AVX2 __attribute__((noinline)) static void name(const uint8_t *row0, size_t rb, int64_t nr,       \
                                                    int64_t k, const act_row *a, float *out)         \
    {                                                                                                \
        for (int64_t r = 0; r < nr; r++)                                                             \
            out[r] = row_fn(t, row0 + (size_t)r * rb, bs, k, a);                                     \
    }

/*
 * The unsigned codes (code offset kept) of 32 weights as the file stores
 * them: what the row decoders of qdot_avx2.c store and its one-token row
 * kernels and qgemm_avx2.c use directly, so all unpack alike.
 */

/* Block blk of a Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0 row. */
AVX2 static INLINE __m256i b32_codes32(uint32_t t, const uint8_t *blk)
{
    if (t == LM_Q4_0)
        return nibbles32(blk + 2);
    if (t == LM_Q4_1) /* (after the scale and the min) */
        return nibbles32(blk + 4);
    if (t == LM_Q8_0)
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)), _mm256_set1_epi8((char)0x80));
    const int at = lm_q5_fifth_at(t); /* Q5_0, Q5_1: the fifth bits, then the nibbles */
    uint32_t qh;
    memcpy(&qh, blk + at, 4);
    return _mm256_or_si256(nibbles32(blk + at + 4), bits32(qh));
}

/*
 * x's bits `from` and up moved to bit `to` of each byte (x shifted by
 * to - from as 16-bit words): the bits a mask then keeps come from the
 * same byte, so one shift serves where a shift down, a mask and a shift
 * up had (from and to constants where inlined: one operation, or none).
 */
AVX2 static INLINE __m256i bits_to(__m256i x, int from, int to)
{
    return from == to ? x : from < to ? _mm256_slli_epi16(x, to - from) : _mm256_srli_epi16(x, from - to);
}

/* Codes 32c..32c+31 of a Q4_K or (five) Q5_K super-block: chunk c / 2's low (c even) or high
   nibbles, and for Q5_K bit c of each qh byte adding 16. */
AVX2 static INLINE __m256i q45k_codes32(const uint8_t *blk, int c, int five)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i x = _mm256_loadu_si256((const __m256i *)((five ? blk + 48 : blk + 16) + 32 * (c / 2)));
    __m256i u = _mm256_and_si256(c % 2 ? _mm256_srli_epi16(x, 4) : x, m4);
    if (five) {
        __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
        u = _mm256_or_si256(u, _mm256_and_si256(bits_to(qh, c, 4), _mm256_set1_epi8(0x10)));
    }
    return u;
}

/* Codes 32c..32c+31 of a Q6_K super-block (c = 4n + j): a low nibble of the stripe and two high
   bits << 4. */
AVX2 static INLINE __m256i q6k_codes32(const uint8_t *blk, int c)
{
    const int n = c / 4, j = c % 4;
    __m256i l = _mm256_loadu_si256((const __m256i *)(blk + 64 * n + 32 * (j & 1)));
    __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n));
    __m256i low = _mm256_and_si256(j >> 1 ? _mm256_srli_epi16(l, 4) : l, _mm256_set1_epi8(0x0f));
    return _mm256_or_si256(low, _mm256_and_si256(bits_to(qh, 2 * j, 4), _mm256_set1_epi8(0x30)));
}

/* Codes 32c..32c+31 (c = 4n + j) of a Q2_K super-block (two bits), or of a Q3_K one (and 4 where the
   hmask bit is set: code + 4). */
AVX2 static INLINE __m256i q23k_codes32(const uint8_t *blk, int c, int three)
{
    const int n = c / 4, j = c % 4;
    __m256i q = _mm256_loadu_si256((const __m256i *)(blk + (three ? 32 : 16) + 32 * n));
    __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), _mm256_set1_epi8(3));
    if (three) {
        __m256i h = _mm256_loadu_si256((const __m256i *)blk);
        u = _mm256_or_si256(u, _mm256_and_si256(bits_to(h, 4 * n + j, 2), _mm256_set1_epi8(0x04)));
    }
    return u;
}

/* Codes 32c..32c+31 of a K-quant super-block. */
AVX2 static INLINE __m256i k_codes32(uint32_t t, const uint8_t *blk, int c)
{
    if (t == LM_Q6_K)
        return q6k_codes32(blk, c);
    if (t == LM_Q2_K || t == LM_Q3_K)
        return q23k_codes32(blk, c, t == LM_Q3_K);
    return q45k_codes32(blk, c, t == LM_Q5_K);
}

/* A Q2_K or Q3_K super-block's 16 group scales as 16-bit words, and (Q2_K) its mins. */
AVX2 static INLINE __m256i q23k_scales(uint32_t t, const uint8_t *blk, __m256i *mins)
{
    if (t == LM_Q2_K) { /* a byte a group: the scale in the low nibble, the min in the high */
        const __m128i b = _mm_loadu_si128((const __m128i *)blk), m4 = _mm_set1_epi8(0x0f);
        *mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(b, 4), m4));
        return _mm256_cvtepu8_epi16(_mm_and_si128(b, m4));
    }
    /* Q3_K (lm_k_scales): group g's low four bits from byte g % 8 of blk + 96 (g < 8: its low
       nibble), its top two from byte 8 + g % 4 (bits 2 (g / 4)..), less 32 */
    const uint8_t *p = blk + 96;
    const __m128i m4 = _mm_set1_epi8(0x0f), x = _mm_loadl_epi64((const __m128i *)p);
    const __m128i low = _mm_unpacklo_epi64(_mm_and_si128(x, m4), _mm_and_si128(_mm_srli_epi16(x, 4), m4));
    int32_t h;
    memcpy(&h, p + 8, 4);
    __m128i top = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(h), _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
    __m128i sc = _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16(top, 4)), _mm_set1_epi8(32));
    *mins = _mm256_setzero_si256();
    return _mm256_cvtepi8_epi16(sc);
}

/*
 * Q4_K and Q5_K's eight 6-bit scales (sc8) and mins (mn8) from the
 * block's 12 scale bytes, a byte each, computed in registers: stored
 * as ints and read back as vectors they stalled on the store forwarding.
 * Byte j is lm_k_scales' group 2j (and 2j + 1).
 */
static inline void k4_scales8(const uint8_t *q, uint64_t *sc8, uint64_t *mn8)
{
    uint32_t u0, u1, u2;
    memcpy(&u0, q, 4), memcpy(&u1, q + 4, 4), memcpy(&u2, q + 8, 4);
    const uint32_t six = 0x3f3f3f3f, four = 0x0f0f0f0f, two = 0x03030303;
    uint32_t sc_hi = (u2 & four) | (((u0 >> 6) & two) << 4), mn_hi = ((u2 >> 4) & four) | (((u1 >> 6) & two) << 4);
    *sc8 = (u0 & six) | (uint64_t)sc_hi << 32;
    *mn8 = (u1 & six) | (uint64_t)mn_hi << 32;
}

/*
 * Q5_0 in its lanes layout (repack.c): from x, dword q of the nibble bytes
 * of eight blocks (or rows), and their fifth bits as the layout spreads
 * them, codes 4q..4q+3 (low nibbles) into lo and 16 + 4q.. (high) into hi,
 * each fifth bit shifted to bit 4 of its code's byte.
 */
AVX2 static INLINE void q5_lanes_codes(__m256i x, __m256i fifth, int q, __m256i *lo, __m256i *hi)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), bit4 = _mm256_set1_epi8(0x10);
    *lo = _mm256_or_si256(_mm256_and_si256(x, m4), _mm256_and_si256(_mm256_slli_epi32(fifth, 4 - q), bit4));
    *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x, 4), m4),
                          _mm256_and_si256(_mm256_srli_epi32(fifth, q), bit4));
}

/*
 * The f16 scales of the first m (<= 8) blocks `stride` bytes apart, the
 * rest 0, word by word: a vector loaded from two-byte stores would wait for
 * them to retire.  Each insert takes its lane as a literal, whatever the
 * optimizer unrolls.
 */
AVX2 static INLINE __m128i block_scales8_words(const uint8_t *blk, size_t stride, int m)
{
    __m128i h = _mm_setzero_si128();
    uint16_t d16;
#define SCALE_WORD(j)                                \
    if ((j) < m) {                                   \
        memcpy(&d16, blk + stride * (j), 2);         \
        h = _mm_insert_epi16(h, (short)d16, (j));    \
    }
    SCALE_WORD(0) SCALE_WORD(1) SCALE_WORD(2) SCALE_WORD(3) SCALE_WORD(4) SCALE_WORD(5) SCALE_WORD(6) SCALE_WORD(7)
#undef SCALE_WORD
    return h;
}

/*
 * The first c (1..8) dwords at p, the rest 0, by loads of their size:
 * nothing past them read.  Masked loads did the same, but on a Zen 1 the
 * few they took at each row's end held a row of 576 columns (Q5_0 in
 * lanes: 16 blocks, then 2) half again as long as one of 512: smollm2
 * Q4_K_M generating 81-86 -> 97-101 t/s.
 */
AVX2 static INLINE __m128i first_dwords4(const void *p, int c)
{
    int32_t v;
    if (c >= 4)
        return _mm_loadu_si128((const __m128i *)p);
    if (c == 1)
        return memcpy(&v, p, 4), _mm_cvtsi32_si128(v);
    const __m128i two = _mm_loadl_epi64((const __m128i *)p);
    return c == 2 ? two : (memcpy(&v, (const char *)p + 8, 4), _mm_insert_epi32(two, v, 2));
}

AVX2 static INLINE __m256i first_dwords(const void *p, int c)
{
    if (c == 8)
        return _mm256_loadu_si256((const __m256i *)p);
    if (c <= 4)
        return _mm256_zextsi128_si256(first_dwords4(p, c));
    return _mm256_set_m128i(first_dwords4((const char *)p + 16, c - 4), _mm_loadu_si128((const __m128i *)p));
}

/* The first m (1..8) floats at p, the rest 0 (nothing past them read). */
AVX2 static INLINE __m256 first8_ps(const float *p, int m)
{
    return _mm256_castsi256_ps(first_dwords(p, m));
}

/* The sum of 8 int32 lanes. */
AVX2 static inline int32_t hsum8_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/*
 * The f16 scales opening the live ones of 16 blocks `stride` bytes apart
 * (consecutive blocks of a row, or one block of 16 rows): a gather of 32
 * bits, low halves kept.
 */
AVX512 static INLINE __m512 block_scales16(const uint8_t *blk, size_t stride, __mmask16 live)
{
    const __m512i at = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32((int)stride));
    __m512i d32 = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, at, (const void *)blk, 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d32));
}

/* A 16 x 16 block transposed: lane i of t[j] is lane j of r[i]. */
AVX512 static INLINE void transpose16(const __m512 r[16], __m512 t[16])
{
    __m512 a[16], u[16];
#pragma GCC unroll 8 /* whole, so that a[] and u[] stay in registers */
    for (int i = 0; i < 8; i++) { /* 32-bit pairs of rows 2i, 2i+1 */
        a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) { /* u[4g + j], 128-bit lane l: column 4l + j of rows 4g..4g+3 */
        __m512d lo0 = _mm512_castps_pd(a[4 * g]), hi0 = _mm512_castps_pd(a[4 * g + 1]);
        __m512d lo1 = _mm512_castps_pd(a[4 * g + 2]), hi1 = _mm512_castps_pd(a[4 * g + 3]);
        u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo0, lo1));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo0, lo1));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(hi0, hi1));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(hi0, hi1));
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) { /* 128-bit lanes gathered: columns j, 4 + j, 8 + j, 12 + j */
        __m512 va = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x88), vb = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xDD);
        __m512 vc = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x88), vd = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xDD);
        t[j] = _mm512_shuffle_f32x4(va, vc, 0x88);
        t[8 + j] = _mm512_shuffle_f32x4(va, vc, 0xDD);
        t[4 + j] = _mm512_shuffle_f32x4(vb, vd, 0x88);
        t[12 + j] = _mm512_shuffle_f32x4(vb, vd, 0xDD);
    }
}

/*
 * 16 rows' outputs (rows[m], lane t: token t) stored token by token,
 * out[ldo * t + m] for t < n: each token's 16 rows as one vector, not 16
 * floats in 16 cache lines.
 */
AVX512 static INLINE void store_rows_by_token(const __m512 rows[16], float *out, size_t ldo, int n)
{
    __m512 tok[16];
    transpose16(rows, tok);
    for (int t = 0; t < n; t++)
        _mm512_storeu_ps(out + ldo * (size_t)t, tok[t]);
}

/*
 * 256 unsigned codes (code + off, four vectors) into the form qgemm.c's
 * VNNI groups read: the codes as signed bytes, and -128 * (sum of every
 * 16).  Called on the codes while they are in registers, a row is
 * prepared in the pass that decodes it instead of a second one over it.
 * qgemm.c's put_b32_4 does the same for 128 codes; two of its calls here
 * made qwen2.5-1.5b Q4_K_M's 16-token prompts slower (Zen 5, alternated
 * three times: 101-108 against 122-125 t/s).
 */
AVX512 static INLINE void put_s8_256(const __m512i u[4], int off, int8_t *s8, int32_t *corr16)
{
    const __m512i voff = _mm512_set1_epi8((char)off);
    const __m512i ev = _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0), od = _mm512_set_epi64(15, 13, 11, 9, 7, 5, 3, 1);
    __m512i s8x8[4];
#pragma GCC unroll 4
    for (int z = 0; z < 4; z++) {
        _mm512_storeu_si512(s8 + 64 * z, _mm512_sub_epi8(u[z], voff));
        s8x8[z] = _mm512_sad_epu8(u[z], _mm512_setzero_si512()); /* sums of 8 codes + off */
    }
    __m512i s16a = _mm512_add_epi64(_mm512_permutex2var_epi64(s8x8[0], ev, s8x8[1]),
                                    _mm512_permutex2var_epi64(s8x8[0], od, s8x8[1]));
    __m512i s16b = _mm512_add_epi64(_mm512_permutex2var_epi64(s8x8[2], ev, s8x8[3]),
                                    _mm512_permutex2var_epi64(s8x8[2], od, s8x8[3]));
    __m512i sums = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(s16a)),
                                      _mm512_cvtepi64_epi32(s16b), 1);
    sums = _mm512_sub_epi32(sums, _mm512_set1_epi32(16 * off)); /* sums of 16 signed codes */
    _mm512_storeu_si512(corr16, _mm512_mullo_epi32(sums, _mm512_set1_epi32(-128)));
}

/* Two vectors of 8-lane groups -> one of their pairwise sums, groups kept in order. */
AVX512 static INLINE __m512i pair_sums(__m512i x, __m512i y)
{
    const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i od = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_add_epi32(_mm512_permutex2var_epi32(x, ev, y), _mm512_permutex2var_epi32(x, od, y));
}

/*
 * pair_sums(pair_sums(v0, v1), pair_sums(v2, v3)) for lanes within
 * +-16383: lane 4w + i of the result sums lanes 4i..4i+3 of vw.  The one-
 * token kernels' lanes each sum 8 products of a centred weight code (at
 * most 16 in size) and an activation code (at most 127: x * 127 / amax
 * rounds to no more), so they are within 8 * 16 * 127 = 16256 and every
 * pair within 32512.  That lets two rounds of 16-bit packs (in-lane) and
 * multiply-adds by 1 fold them, and one permute puts the blocks in order,
 * where pair_sums takes six cross-lane permutes: one-token Q4_0 rows in L2
 * went from 1.27 to 1.15 cycles a block.
 */
/* Lane b <-> lane 4 (b % 4) + b / 4 (a 4 x 4 transpose: its own inverse). */
AVX512 static INLINE __m512i fold_order(void)
{
    return _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
}

/* fold_fours's sums before its last permute: lane 4i + w holds block 4w + i's. */
AVX512 static INLINE __m512i fold_fours_transposed(__m512i v0, __m512i v1, __m512i v2, __m512i v3)
{
    const __m512i one = _mm512_set1_epi16(1);
    __m512i p01 = _mm512_madd_epi16(_mm512_packs_epi32(v0, v1), one); /* lanes (v0: 0+1, 2+3, v1: ...) */
    __m512i p23 = _mm512_madd_epi16(_mm512_packs_epi32(v2, v3), one);
    return _mm512_madd_epi16(_mm512_packs_epi32(p01, p23), one); /* lane 4i + w: vw's lanes 4i.. */
}

AVX512 static INLINE __m512i fold_fours(__m512i v0, __m512i v1, __m512i v2, __m512i v3)
{
    return _mm512_permutexvar_epi32(fold_order(), fold_fours_transposed(v0, v1, v2, v3));
}

/* lm_k_total's tree, 16 outputs at once: the four K-quant lanes' sums s, less their mins m. */
AVX512 static INLINE __m512 k_total16(const __m512 s[4], const __m512 m[4])
{
    __m512 sums = _mm512_add_ps(_mm512_add_ps(s[0], s[1]), _mm512_add_ps(s[2], s[3]));
    return _mm512_sub_ps(sums, _mm512_add_ps(_mm512_add_ps(m[0], m[1]), _mm512_add_ps(m[2], m[3])));
}

/* The same tree lane by lane over 16 vectors: lane i of the result sums lane i of each. */
AVX512 static INLINE __m512 hsum16_lanes(const __m512 a[16])
{
    __m512 t8[8], t4[4];
#pragma GCC unroll 8 /* t8, t4 and the caller's a[] stay in registers */
    for (int i = 0; i < 8; i++)
        t8[i] = _mm512_add_ps(a[i], a[i + 8]);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        t4[i] = _mm512_add_ps(t8[i], t8[i + 4]);
    return _mm512_add_ps(_mm512_add_ps(t4[0], t4[2]), _mm512_add_ps(t4[1], t4[3]));
}

/*
 * Q4_K/Q5_K pack eight six-bit scales and mins in 12 bytes (q below, bytes
 * 4..15 of the block): scale j < 4 is q[j] & 63, min j < 4 is q[j+4] & 63;
 * for j >= 4 the low four bits come from q[j+4] (scale: low nibble, min:
 * high) and the top two from bits 6-7 of q[j-4] (scale) or q[j] (min).
 * x holds a block's first 16 bytes in each 128-bit lane; the result, its
 * scales in bytes 0-7 and mins in 8-15.
 */
AVX512 static INLINE __m512i six_bit_scales(__m512i x)
{
    const __m512i lo_src = _mm512_broadcast_i32x4(_mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m512i hi_src = _mm512_broadcast_i32x4(_mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
    const __m512i keep = _mm512_broadcast_i32x4(_mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15));
    __m512i lo = _mm512_shuffle_epi8(x, lo_src), hi = _mm512_shuffle_epi8(x, hi_src);
    lo = _mm512_and_si512(_mm512_mask_blend_epi8(0xf000f000f000f000ull, lo, _mm512_srli_epi16(lo, 4)), keep);
    return _mm512_ternarylogic_epi32(lo, _mm512_srli_epi16(hi, 2), _mm512_set1_epi8(0x30), 0xf8);
}

/* 16 bytes at offset off of each of the m (1..4) blocks bs bytes apart, one per 128-bit lane; zeros past them. */
AVX512 static INLINE __m512i quad_bytes(const uint8_t *blk, size_t bs, size_t off, int m)
{
    __m512i x = _mm512_zextsi128_si512(_mm_loadu_si128((const __m128i *)(blk + off)));
    if (m > 1)
        x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(blk + bs + off)), 1);
    if (m > 2)
        x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(blk + 2 * bs + off)), 2);
    if (m > 3)
        x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(blk + 3 * bs + off)), 3);
    return x;
}

/*
 * The rearranged layouts (repack.c) keep 4 codes of each of 16 blocks or
 * groups in the dwords of a vector; the AMX tiles want each block's codes
 * in order.  dwords_4x16: r[g]'s chunk c = dword 4c + g of v[0], v[1],
 * v[2], v[3] (a block's 16 codes); chunks_4x4: out[i]'s chunk j = in[j]'s
 * chunk i.
 */
AVX512 static INLINE void dwords_4x16(const __m512i v[4], __m512i r[4])
{
    const __m512i t0 = _mm512_unpacklo_epi32(v[0], v[1]), t1 = _mm512_unpackhi_epi32(v[0], v[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(v[2], v[3]), t3 = _mm512_unpackhi_epi32(v[2], v[3]);
    r[0] = _mm512_unpacklo_epi64(t0, t2), r[1] = _mm512_unpackhi_epi64(t0, t2);
    r[2] = _mm512_unpacklo_epi64(t1, t3), r[3] = _mm512_unpackhi_epi64(t1, t3);
}

AVX512 static INLINE void chunks_4x4(const __m512i in[4], __m512i out[4])
{
    const __m512i u0 = _mm512_shuffle_i32x4(in[0], in[1], 0x44), u1 = _mm512_shuffle_i32x4(in[0], in[1], 0xee);
    const __m512i u2 = _mm512_shuffle_i32x4(in[2], in[3], 0x44), u3 = _mm512_shuffle_i32x4(in[2], in[3], 0xee);
    out[0] = _mm512_shuffle_i32x4(u0, u2, 0x88), out[1] = _mm512_shuffle_i32x4(u0, u2, 0xdd);
    out[2] = _mm512_shuffle_i32x4(u1, u3, 0x88), out[3] = _mm512_shuffle_i32x4(u1, u3, 0xdd);
}

/*
 * lm_k_total of a K-quant row's lanes (acc: super-blocks b mod 4's sums in
 * lane 2b, their mins in 2b + 1), in its fixed tree: inline, as a call cost
 * a short row 4%.
 */
AVX2 static INLINE float k_lanes_total(__m256 acc)
{
    __m256 pairs = _mm256_add_ps(acc, _mm256_permute_ps(acc, 0x4e)); /* s0 + s1, m0 + m1; s2 + s3, ... */
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(pairs), _mm256_extractf128_ps(pairs, 1));
    return _mm_cvtss_f32(_mm_sub_ss(u, _mm_movehdup_ps(u)));
}

#endif

#endif
