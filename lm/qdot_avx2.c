/*
 * lm/qdot_avx2.c - qdot.c's fast paths for x86 CPUs with AVX2 but not
 * AVX-512 (chosen at run time): the decoders that unpack Q4_0, Q4_1, Q5_0,
 * Q5_1, Q8_0 and the K-quant rows into unsigned codes and F16 and BF16
 * rows into floats (AVX-512 CPUs use them too), the integer dots of
 * decoded rows, and one token through rows of every type read as the file
 * stores them.  Q4_0, Q4_1 and Q5_0 (and Q5_0 and Q5_1 rows in their
 * lanes layouts) go eight blocks a step against the token's codes in
 * lanes, so no block needs a horizontal sum (on one core,
 * in L2, Q4_0 rows of 2048 33.6 -> 47.5 billion weights a second, of 896
 * 22 -> 37; Q5_0 21.6 -> 26.5 and 15.9 -> 19.0); K-quant rows in
 * qrow_k_avx2.c.
 * Every sum is the exact integer of the scalar dot and every float step
 * its own, so the logits are bitwise those of the other paths; tests
 * compare them.
 */
#include "internal.h"
#include "simd.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)

/* ---------------------------------------------------------- decoders */

/* Blocks of 32 (t a constant where inlined): codes, scales, and Q4_1's and Q5_1's mins. */
AVX2 static INLINE void decode_b32_type(qrow *r, const uint32_t t, const uint8_t *src, int64_t nb)
{
    const size_t bs = lm_type_size(t);
    const int mins = t == LM_Q4_1 || t == LM_Q5_1;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *b = src + (size_t)i * bs;
        r->d[i] = half(b);
        r->m[i] = mins ? half(b + 2) : 0.0f;
        _mm256_storeu_si256((__m256i *)(r->u + i * 32), b32_codes32(t, b));
    }
}

AVX2 static void decode_b32_avx2(qrow *r, const uint8_t *src, int64_t nb)
{
    switch (r->type) {
    case LM_Q4_0: decode_b32_type(r, LM_Q4_0, src, nb); break;
    case LM_Q4_1: decode_b32_type(r, LM_Q4_1, src, nb); break;
    case LM_Q5_0: decode_b32_type(r, LM_Q5_0, src, nb); break;
    case LM_Q5_1: decode_b32_type(r, LM_Q5_1, src, nb); break;
    default: decode_b32_type(r, LM_Q8_0, src, nb); break;
    }
}

/* F16 and BF16 rows as floats, eight at a time. */
AVX2 void lm_halves_to_f32_avx2(float *f, uint32_t t, const void *row, int64_t k)
{
    const uint8_t *src = row;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
        _mm256_storeu_ps(f + i, halves_ps(t, src + 2 * i));
    if (i < k)
        lm_dequant_row(t, src + 2 * i, f + i, k - i);
}

/* A K-quant super-block's 256 codes. */
AVX2 static void k_codes(uint32_t type, const uint8_t *blk, uint8_t *u)
{
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++)
        _mm256_storeu_si256((__m256i *)(u + 32 * c), k_codes32(type, blk, c));
}

/*
 * lm_k_scales_decode for the K-quants, with each group scale
 * broadcast to its four lanes of sc4 and the factors converted by F16C.
 * (Loading sc[] as vectors right after its int stores stalls on the
 * store forwarding; one value at a time the spreading took longer than
 * the AVX2 dot itself.)
 */
AVX2 static void k_scales_avx2(qrow *r, uint32_t t, const uint8_t *b, int64_t i)
{
    int sc[16], mn[16];
    lm_k_scales(t, b, sc, mn);
    for (int g = 0; g < 16; g++) {
        _mm_storeu_si128((__m128i *)(r->sc4 + i * 64 + 4 * g), _mm_set1_epi32(sc[g]));
        r->mn[i * 16 + g] = (int16_t)mn[g];
    }
    r->d[i] = half(b + lm_k_d_at(t));
    r->m[i] = lm_k_m_at(t) ? half(b + lm_k_m_at(t)) : 0.0f;
}

/* Returns 0 when the type has no fast decoder (the caller uses the scalar one). */
AVX2 int lm_qrow_decode_avx2(qrow *r, uint32_t type, const void *src, int64_t k)
{
    const uint8_t *b = src;
    r->type = type;
    r->k = k;
    if (type == LM_Q4_0 || type == LM_Q4_1 || type == LM_Q5_0 || type == LM_Q5_1 || type == LM_Q8_0) {
        decode_b32_avx2(r, b, k / 32);
        return 1;
    }
    if (type == LM_F16 || type == LM_BF16) {
        lm_halves_to_f32_avx2(r->f, type, b, k);
        return 1;
    }
    if (type != LM_Q2_K && type != LM_Q3_K && type != LM_Q4_K && type != LM_Q5_K && type != LM_Q6_K)
        return 0;
    const size_t bs = lm_type_size(type);
    for (int64_t i = 0; i < k / 256; i++) {
        k_scales_avx2(r, type, b + (size_t)i * bs, i);
        k_codes(type, b + (size_t)i * bs, r->u + i * 256);
    }
    return 1;
}

/* ------------------------------------------------------------ dots */

/*
 * The dots without AVX-512 (AVX2 CPUs): maddubs multiplies unsigned by
 * signed bytes and adds each pair in 16 bits, saturating, and madd by ones
 * adds those pairs into 32 bits.  Codes of at most 7 bits against
 * activations within +-127 stay inside 16 bits (2 * 127 * 127), so a lane's
 * sum is exact, and the activation row's negcorr takes the code offset off
 * it.  Q8_0's 8-bit codes would not fit: they are centred first and their
 * signs moved onto the activations (2 * 128 * 127).  The sums are exact
 * integers and the float steps the scalar dots' own, in their lanes.
 */
AVX2 static inline __m256i lane_sums_avx2(__m256i uu, const int8_t *a, const int32_t *negcorr, int q8)
{
    const __m256i aa = _mm256_loadu_si256((const __m256i *)a), ones = _mm256_set1_epi16(1);
    if (q8) {
        __m256i c = _mm256_xor_si256(uu, _mm256_set1_epi8((char)0x80)); /* u - 128 */
        return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(c), _mm256_sign_epi8(aa, c)), ones);
    }
    __m256i v = _mm256_madd_epi16(_mm256_maddubs_epi16(uu, aa), ones);
    return negcorr ? _mm256_add_epi32(v, _mm256_loadu_si256((const __m256i *)negcorr)) : v; /* NULL: later */
}

/* The same for 32 decoded codes at u. */
AVX2 static inline __m256i lanes32_avx2(const uint8_t *u, const int8_t *a, const int32_t *negcorr, int q8)
{
    return lane_sums_avx2(_mm256_loadu_si256((const __m256i *)u), a, negcorr, q8);
}

/* Element j of the result: the sum of v[j]'s 8 lanes. */
AVX2 static inline __m256i totals8_avx2(const __m256i v[8])
{
    __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
    __m256i h45 = _mm256_hadd_epi32(v[4], v[5]), h67 = _mm256_hadd_epi32(v[6], v[7]);
    __m256i lo = _mm256_hadd_epi32(h01, h23), hi = _mm256_hadd_epi32(h45, h67); /* halves: 4 + 4 lanes */
    /* each half's two 128-bit lanes added, by extracts and one insert (a lane-crossing permute is
       eight operations on Zen 1) */
    __m128i s_lo = _mm_add_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
    __m128i s_hi = _mm_add_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
    return _mm256_set_m128i(s_hi, s_lo);
}

/* The code offset taken off blocks b..b+m-1 at once: -offset * (each block's two 16-code sums). */
AVX2 static INLINE __m256i minus_offset8(__m256i sums, const act_row *a, int64_t b, int m, int offset)
{
    __m256i s16 = first_dwords(a->sum16 + 2 * b, m);
    return _mm256_add_epi32(sums, _mm256_madd_epi16(s16, _mm256_set1_epi16((short)-offset)));
}

/* Blocks b..b+m-1 (m <= 8) of a decoded row scaled into acc's lanes 0..m-1 (see stored8_avx2). */
AVX2 static INLINE __m256 blocks8_avx2(const qrow *w, const act_row *a, int64_t b, int m, __m256 acc, int q8)
{
    __m256i v[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        int64_t e = (b + j) * 32;
        v[j] = j < m ? lanes32_avx2(w->u + e, a->qs + e, NULL, q8) : _mm256_setzero_si256();
    }
    __m256i sums = totals8_avx2(v);
    const int offset = q8 ? 0 : lm_code_offset(w->type); /* (Q8_0's codes were centred instead) */
    if (offset)
        sums = minus_offset8(sums, a, b, m, offset);
    __m256 dd = _mm256_mul_ps(first8_ps(w->d + b, m), first8_ps(a->d + b, m));
    return _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sums), acc);
}

AVX2 static INLINE float dot_b32_avx2(const qrow *w, const act_row *a, int q8)
{
    const int64_t nb = w->k / 32;
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 16 <= nb; b += 16) {
        lo = blocks8_avx2(w, a, b, 8, lo, q8);
        hi = blocks8_avx2(w, a, b + 8, 8, hi, q8);
    }
    const int left = (int)(nb - b); /* the last 0-15 blocks: lanes 0.. of lo, then of hi */
    if (left > 0)
        lo = blocks8_avx2(w, a, b, left < 8 ? left : 8, lo, q8);
    if (left > 8)
        hi = blocks8_avx2(w, a, b + 8, left - 8, hi, q8);
    float sum = hsum16_avx2(lo, hi), mins = 0.0f;
    if (w->type == LM_Q4_1 || w->type == LM_Q5_1)
        for (b = 0; b < nb; b++)
            mins = __builtin_fmaf(w->m[b], a->s[b], mins);
    return sum + mins;
}

AVX2 float lm_dot_b32_avx2(const qrow *w, const act_row *a)
{
    return w->type == LM_Q8_0 ? dot_b32_avx2(w, a, 1) : dot_b32_avx2(w, a, 0);
}

/* Sum over the 16 groups of (per-group value) * (group's activation sum): vals as 16 int16. */
AVX2 static inline int32_t group_dot16(__m256i vals16, const int16_t *s16)
{
    return hsum8_epi32(_mm256_madd_epi16(vals16, _mm256_loadu_si256((const __m256i *)s16)));
}

/* K-quant codes have at most 6 bits: every lane takes the maddubs path. */
AVX2 float lm_dot_k_avx2(const qrow *w, const act_row *a)
{
    float acc[LM_K_LANES] = {0}, mins[LM_K_LANES] = {0};
    for (int64_t b = 0; b < w->k / 256; b++) {
        __m256i sum = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int z = 0; z < 8; z++) {
            int64_t e = b * 256 + 32 * z;
            __m256i v = lanes32_avx2(w->u + e, a->qs + e, a->negcorr + e / 4, 0);
            sum = _mm256_add_epi32(sum, _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i *)(w->sc4 + e / 4)), v));
        }
        acc[b % LM_K_LANES] = __builtin_fmaf(w->d[b] * a->d[b], (float)hsum8_epi32(sum), acc[b % LM_K_LANES]);
        /* lm_k_mins, its integer sum in one multiply-add of 16 pairs */
        int32_t msum = group_dot16(_mm256_loadu_si256((const __m256i *)(w->mn + b * 16)), a->sum16 + b * 16);
        mins[b % LM_K_LANES] += (w->m[b] * a->d[b]) * (float)msum;
    }
    return lm_k_total(acc, mins);
}

/* lm_dot_f_scalar's 16 lanes as two vectors of 8. */
AVX2 float lm_dot_f_avx2(const float *x, const float *y, int64_t n)
{
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), hi);
    }
    return dot16_end(lo, hi, x + i, y + i, n - i);
}

/* lm_dot_f_avx2 of an F16 or BF16 row as stored (bs unused) with a token's floats: no decoded copy. */
AVX2 static INLINE float row_halves_avx2(uint32_t t, const uint8_t *row, size_t bs, int64_t k, const act_row *a)
{
    (void)bs;
    const float *y = a->f;
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        if (i % 64 == 0) /* two lines a step of 64 values */
            lm_prefetch_ahead(row + 2 * i, 128, 1, a->ahead);
        lo = _mm256_fmadd_ps(halves_ps(t, row + 2 * i), _mm256_loadu_ps(y + i), lo);
        hi = _mm256_fmadd_ps(halves_ps(t, row + 2 * i + 16), _mm256_loadu_ps(y + i + 8), hi);
    }
    float w[16];
    if (i < k)
        lm_dequant_row(t, row + 2 * i, w, k - i); /* the last 1-15 */
    return dot16_end(lo, hi, w, y + i, k - i);
}

/*
 * Blocks b..b+m-1 (m <= 8, as stored) scaled into acc's lanes 0..m-1.
 * The other lanes add 0 * 0: a lane of these sums is never -0 (it starts
 * at +0, and a sum of exact zeros rounds to +0), so adding +0 leaves it as
 * the scalar dot, which does not touch it, leaves it.
 */
AVX2 static INLINE __m256 stored8_avx2(uint32_t t, const uint8_t *row, size_t bs, int64_t b, int m,
                                       const act_row *a, __m256 acc)
{
    __m256i v[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        const int64_t i = b + j;
        v[j] = j < m ? lane_sums_avx2(b32_codes32(t, row + i * bs), a->qs + i * 32, NULL, t == LM_Q8_0)
                     : _mm256_setzero_si256();
    }
    __m256i sums = totals8_avx2(v);
    if (t == LM_Q4_0 || t == LM_Q5_0) /* the code offset, once a block */
        sums = minus_offset8(sums, a, b, m, t == LM_Q4_0 ? 8 : 16);
    __m256 dw = _mm256_cvtph_ps(block_scales8_words(row + b * bs, bs, m));
    return _mm256_fmadd_ps(_mm256_mul_ps(dw, first8_ps(a->d + b, m)), _mm256_cvtepi32_ps(sums), acc);
}

/* lm_dot_b32_avx2 on the row's blocks as the file holds them (bs bytes each), not decoded first. */
AVX2 static INLINE float row_b32_avx2(uint32_t t, const uint8_t *row, size_t bs, int64_t k, const act_row *a)
{
    const int64_t nb = k / 32;
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 16 <= nb; b += 16) {
        lm_prefetch_ahead(row + b * bs, 16 * bs, 1, a->ahead);
        lo = stored8_avx2(t, row, bs, b, 8, a, lo);
        hi = stored8_avx2(t, row, bs, b + 8, 8, a, hi);
    }
    const int left = (int)(nb - b); /* the last 0-15 blocks: lanes 0.. of lo, then of hi */
    if (left > 0) {
        lm_prefetch_ahead(row + b * bs, (size_t)left * bs, 1, a->ahead);
        lo = stored8_avx2(t, row, bs, b, left < 8 ? left : 8, a, lo);
    }
    if (left > 8)
        hi = stored8_avx2(t, row, bs, b + 8, left - 8, a, hi);
    return hsum16_avx2(lo, hi); /* (Q4_1, Q5_1: without the min terms, rows_mins_avx2) */
}

/*
 * Q4_0, Q4_1 and Q5_0 with the token's codes in lanes (lm_act_lanes:
 * codes 4q..4q+3 of block j in 32-bit lane j of vector q), eight blocks a
 * step: their nibble bytes are transposed the same way (two rounds of
 * unpacks), so eight maddubs give every block's products in its own lane
 * and no block needs a horizontal sum.  Q5_0's fifth bits: byte q / 2 of
 * each block's qh (bits 8(q / 2)..) in all four bytes of its lane, one bit
 * a byte tested.  Codes up to 15 (31) times +-127, eight (four) pairs
 * added: at most 30480 (31496), exact in 16 bits.  The float steps are
 * stored8_avx2's (Q4_1: its min terms are rows_mins_avx2's).  Q5_1 is
 * not taken here: its fifth bits picked out this way cost what the lanes
 * save (smollm2 generating 76-78 t/s either way); its rows are laid out at
 * load as Q5_0's are (repack.c) and read by row_layout_avx2.
 */
AVX2 static INLINE __m128i b32_nibbles(uint32_t t, const uint8_t *blk, int j, int m)
{
    if (j >= m)
        return _mm_setzero_si128();
    const int bs = lm_b32_block_bytes(t); /* the nibbles are a block's last 16 bytes */
    return _mm_loadu_si128((const __m128i *)(blk + bs * j + bs - 16));
}

/* Codes plus 16 where their bit of the qh bytes in sel (bit mask per byte: 1, 2, 4, 8 << shift) is set. */
AVX2 static INLINE __m256i plus_fifth(__m256i codes, __m256i sel, __m256i bit)
{
    __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(sel, bit), bit);
    return _mm256_or_si256(codes, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
}

/* Blocks b..b+m-1 (b % 8 == 0, m <= 8) into acc's lanes 0..m-1; the others add 0 * 0 (see stored8_avx2). */
AVX2 static INLINE __m256 b32_lanes8_avx2(uint32_t t, const uint8_t *blk, const act_row *a, int64_t b, int m,
                                          __m256 acc)
{
    const int bs = lm_b32_block_bytes(t), q5 = t == LM_Q5_0;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i y[4], tt[4], x[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) /* blocks j and j + 4 */
        y[j] = _mm256_set_m128i(b32_nibbles(t, blk, j + 4, m), b32_nibbles(t, blk, j, m));
    tt[0] = _mm256_unpacklo_epi32(y[0], y[1]), tt[1] = _mm256_unpackhi_epi32(y[0], y[1]);
    tt[2] = _mm256_unpacklo_epi32(y[2], y[3]), tt[3] = _mm256_unpackhi_epi32(y[2], y[3]);
    x[0] = _mm256_unpacklo_epi64(tt[0], tt[2]), x[1] = _mm256_unpackhi_epi64(tt[0], tt[2]); /* x[q]: dword q */
    x[2] = _mm256_unpacklo_epi64(tt[1], tt[3]), x[3] = _mm256_unpackhi_epi64(tt[1], tt[3]);
    __m256i qh = _mm256_setzero_si256();
    if (q5) { /* lane by lane, as the scales below */
        __m128i h4[2] = {_mm_setzero_si128(), _mm_setzero_si128()};
        int32_t h;
#define QH_LANE(j) /* j a literal: the insert takes its lane as an immediate, whatever the optimizer unrolls */ \
    if ((j) < m) {                                                                                          \
        memcpy(&h, blk + bs * (j) + 2, 4);                                                                  \
        h4[(j) / 4] = _mm_insert_epi32(h4[(j) / 4], h, (j) % 4);                                            \
    }
        QH_LANE(0) QH_LANE(1) QH_LANE(2) QH_LANE(3) QH_LANE(4) QH_LANE(5) QH_LANE(6) QH_LANE(7)
#undef QH_LANE
        qh = _mm256_set_m128i(h4[1], h4[0]);
    }
    const int8_t *qw = a->qw + 512 * (b / 16) + 32 * (b / 8 % 2);
    __m256i p[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}; /* Q5_0: lows, highs apart */
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) { /* low nibbles: codes 4q.., high: 16 + 4q.. */
        __m256i lo = _mm256_and_si256(x[q], m4), hi = _mm256_and_si256(_mm256_srli_epi16(x[q], 4), m4);
        if (q5) {
            const __m256i bit = _mm256_set1_epi32((int)(0x08040201u << (4 * (q % 2))));
            const __m256i at = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0c0c0c0c, /* lane j's first byte */
                                                 0, 0x04040404, 0x08080808, 0x0c0c0c0c);
            lo = plus_fifth(lo, _mm256_shuffle_epi8(qh, _mm256_add_epi8(at, _mm256_set1_epi8((char)(q / 2)))), bit);
            hi = plus_fifth(hi, _mm256_shuffle_epi8(qh, _mm256_add_epi8(at, _mm256_set1_epi8((char)(2 + q / 2)))),
                            bit);
        }
        p[0] = _mm256_add_epi16(p[0], _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(qw + 64 * q))));
        p[q5] = _mm256_add_epi16(p[q5],
                                 _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(qw + 64 * (q + 4)))));
    }
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i sums = _mm256_add_epi32(_mm256_madd_epi16(p[0], ones), _mm256_loadu_si256((const __m256i *)(a->ncw + b)));
    if (q5)
        sums = _mm256_add_epi32(sums, _mm256_madd_epi16(p[1], ones));
    __m256 dw = _mm256_cvtph_ps(block_scales8_words(blk, (size_t)bs, m));
    return _mm256_fmadd_ps(_mm256_mul_ps(dw, first8_ps(a->d + b, m)), _mm256_cvtepi32_ps(sums), acc);
}

/* The last 1-7 blocks of a row, their count a constant in each case (the loads and masks unrolled). */
AVX2 static INLINE __m256 b32_tail_avx2(uint32_t t, const uint8_t *blk, const act_row *a, int64_t b, int m,
                                        __m256 acc)
{
    switch (m) {
    case 1: return b32_lanes8_avx2(t, blk, a, b, 1, acc);
    case 2: return b32_lanes8_avx2(t, blk, a, b, 2, acc);
    case 3: return b32_lanes8_avx2(t, blk, a, b, 3, acc);
    case 4: return b32_lanes8_avx2(t, blk, a, b, 4, acc);
    case 5: return b32_lanes8_avx2(t, blk, a, b, 5, acc);
    case 6: return b32_lanes8_avx2(t, blk, a, b, 6, acc);
    default: return b32_lanes8_avx2(t, blk, a, b, 7, acc);
    }
}

/* row_b32_avx2 for Q4_0, Q4_1 or Q5_0 against a token in lanes: whole steps of 8 blocks, then the last 0-7. */
AVX2 static INLINE float row_b32_lanes_avx2(uint32_t t, const uint8_t *row, size_t bs, int64_t k,
                                            const act_row *a)
{
    const int64_t nb = k / 32;
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps(); /* blocks b % 16 < 8, then the rest */
    int64_t b = 0;
    for (; b + 16 <= nb; b += 16) {
        lm_prefetch_ahead(row + b * bs, 16 * bs, 1, a->ahead);
        lo = b32_lanes8_avx2(t, row + b * bs, a, b, 8, lo);
        hi = b32_lanes8_avx2(t, row + (b + 8) * bs, a, b + 8, 8, hi);
    }
    const int left = (int)(nb - b);
    if (left > 0) /* the row's last blocks: qwen2.5's rows of 896 columns are 16 + 12 */
        lm_prefetch_ahead(row + b * bs, (size_t)left * bs, 1, a->ahead);
    if (left >= 8)
        lo = b32_lanes8_avx2(t, row + b * bs, a, b, 8, lo);
    if (left > 8)
        hi = b32_tail_avx2(t, row + (b + 8) * bs, a, b + 8, left - 8, hi);
    else if (left > 0 && left < 8)
        lo = b32_tail_avx2(t, row + b * bs, a, b, left, lo);
    return hsum16_avx2(lo, hi);
}

/*
 * Q4_0, Q5_0 and Q5_1 rows in their lanes layouts (repack.c, internal.h): a
 * step's nibble bytes lie as b32_lanes8_avx2's transposes leave them, and
 * Q5's block j's fifth bits lie in lane j with code 4q + i's at bit q of
 * byte i and code 16 + 4q + i's at bit 4 + q, so a shift and a mask put
 * each at bit 4 of its code's byte: no inserts, no transposes, no bits
 * picked out byte by byte (one core, in L2, 256 Q5_0 rows of 2048: 82 ->
 * 34 us).  The sums and float steps are b32_lanes8_avx2's, so the bytes
 * are too.  Half h (blocks 8h..) of a step of m blocks, c <= 8 of them,
 * into acc's lanes (the others add 0 * 0).
 */
AVX2 static INLINE __m256 layout8_avx2(uint32_t t, const uint8_t *step, const int m, int h, const int c,
                                       const act_row *a, int64_t b, __m256 acc)
{
    const int q5 = t != LM_Q4_0;
    const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(0x0f);
    const __m256i fifth = q5 ? first_dwords(step + LM_Q5_0_FIFTH(m) + 32 * h, c) : _mm256_setzero_si256();
    const int8_t *qw = a->qw + 512 * (b / 16) + 32 * h;
    __m256i p[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}; /* Q5: lows, highs apart */
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        const __m256i x = first_dwords(step + lm_lanes_codes(t, step, m) + 4 * m * q + 32 * h, c);
        __m256i l = _mm256_and_si256(x, m4), u = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
        if (q5)
            q5_lanes_codes(x, fifth, q, &l, &u);
        p[0] = _mm256_add_epi16(p[0], _mm256_maddubs_epi16(l, _mm256_loadu_si256((const __m256i *)(qw + 64 * q))));
        p[q5] = _mm256_add_epi16(p[q5],
                                 _mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(qw + 64 * (q + 4)))));
        OPAQUE256X2(p[0], p[1]);
    }
    __m256i sums = _mm256_add_epi32(_mm256_madd_epi16(p[0], ones), _mm256_loadu_si256((const __m256i *)(a->ncw + b)));
    if (q5)
        sums = _mm256_add_epi32(sums, _mm256_madd_epi16(p[1], ones));
    const uint8_t *d = step + lm_lanes_scales(t, step, m) + 16 * h;
    const __m256 dw = _mm256_cvtph_ps(c == 8 ? _mm_loadu_si128((const __m128i *)d) : block_scales8_words(d, 2, c));
    return _mm256_fmadd_ps(_mm256_mul_ps(dw, first8_ps(a->d + b, c)), _mm256_cvtepi32_ps(sums), acc);
}

/* A row's last step's half of c blocks, c a constant in each case (the masks and copies unrolled). */
AVX2 static INLINE __m256 layout_tail_avx2(uint32_t t, const uint8_t *step, int m, int h, int c, const act_row *a,
                                           int64_t b, __m256 acc)
{
    switch (c) {
    case 1: return layout8_avx2(t, step, m, h, 1, a, b, acc);
    case 2: return layout8_avx2(t, step, m, h, 2, a, b, acc);
    case 3: return layout8_avx2(t, step, m, h, 3, a, b, acc);
    case 4: return layout8_avx2(t, step, m, h, 4, a, b, acc);
    case 5: return layout8_avx2(t, step, m, h, 5, a, b, acc);
    case 6: return layout8_avx2(t, step, m, h, 6, a, b, acc);
    case 7: return layout8_avx2(t, step, m, h, 7, a, b, acc);
    default: return layout8_avx2(t, step, m, h, 8, a, b, acc);
    }
}

/*
 * A Q4_0, Q5_0 or Q5_1 row (bs: 18, 22 or 24 bytes a block) in its lanes
 * layout against a token in lanes: steps of 16 blocks, a row's last m < 16
 * a step too (Q5_1: without the min terms, rows_mins_avx2).
 */
AVX2 static INLINE float row_layout_avx2(uint32_t t, const uint8_t *row, size_t bs, int64_t k, const act_row *a)
{
    const int64_t nb = k / 32;
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps(); /* blocks b % 16 < 8, then the rest */
    int64_t b = 0;
    for (; b + 16 <= nb; b += 16) {
        lm_prefetch_ahead(row + bs * b, 16 * bs, 1, a->ahead);
        lo = layout8_avx2(t, row + bs * b, 16, 0, 8, a, b, lo);
        hi = layout8_avx2(t, row + bs * b, 16, 1, 8, a, b + 8, hi);
    }
    const int m = (int)(nb - b);
    if (m > 0) {
        lm_prefetch_ahead(row + bs * b, bs * (size_t)m, 1, a->ahead);
        lo = layout_tail_avx2(t, row + bs * b, m, 0, m < 8 ? m : 8, a, b, lo);
    }
    if (m > 8)
        hi = layout_tail_avx2(t, row + bs * b, m, 1, m - 8, a, b + 8, hi);
    return hsum16_avx2(lo, hi);
}

ROWS_AVX2(rows_q4_0_avx2, row_b32_avx2, LM_Q4_0, 18)
ROWS_AVX2(rows_q4_0_lanes_avx2, row_b32_lanes_avx2, LM_Q4_0, 18)
ROWS_AVX2(rows_q5_0_lanes_avx2, row_b32_lanes_avx2, LM_Q5_0, 22)
ROWS_AVX2(rows_q5_0_avx2, row_b32_avx2, LM_Q5_0, 22)
ROWS_AVX2(rows_q4_0_layout_avx2, row_layout_avx2, LM_Q4_0, 18)
ROWS_AVX2(rows_q5_0_layout_avx2, row_layout_avx2, LM_Q5_0, 22)
ROWS_AVX2(rows_q8_0_avx2, row_b32_avx2, LM_Q8_0, 34)

/*
 * Q4_1's and Q5_1's min terms added to rows' sums, eight rows at a time:
 * each lane one row's chain of lm_dot_b32_scalar in block order.  One
 * row at a time, that chain of dependent multiply-adds took a third of
 * the kernel's time.
 */
/* Where block b of a Q4_1 or Q5_1 row (nb blocks of bs bytes) keeps its min: after its scale, or in its step's mins (lanes). */
static inline size_t min_at(size_t bs, int64_t nb, int64_t b, int lanes)
{
    if (!lanes)
        return (size_t)b * bs + 2;
    const int64_t s0 = b - b % 16; /* its step */
    return (size_t)s0 * bs + LM_Q5_1_MINS(lm_lanes_step_blocks(nb, s0)) + 2 * (size_t)(b % 16);
}

AVX2 static INLINE void rows_mins_avx2(const uint8_t *row0, size_t rb, int64_t nr, size_t bs, int64_t nb,
                                       const act_row *a, float *out, int lanes)
{
    int64_t r = 0;
    for (; r + 8 <= nr; r += 8) {
        __m256 m8 = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const __m256 m = halves8(row0 + (size_t)r * rb + min_at(bs, nb, b, lanes), rb);
            m8 = _mm256_fmadd_ps(m, _mm256_set1_ps(a->s[b]), m8);
        }
        _mm256_storeu_ps(out + r, _mm256_add_ps(_mm256_loadu_ps(out + r), m8));
    }
    for (; r < nr; r++) {
        float mins = 0.0f;
        for (int64_t b = 0; b < nb; b++)
            mins = __builtin_fmaf(half(row0 + (size_t)r * rb + min_at(bs, nb, b, lanes)), a->s[b], mins);
        out[r] += mins;
    }
}

#define ROWS_MINS_AVX2(name, row_fn, t, bs, lanes)                                                    \
    AVX2 __attribute__((noinline)) static void name(const uint8_t *row0, size_t rb, int64_t nr,       \
                                                    int64_t k, const act_row *a, float *out)         \
    {                                                                                                \
        for (int64_t r = 0; r < nr; r++)                                                             \
            out[r] = row_fn(t, row0 + (size_t)r * rb, bs, k, a);                                     \
        rows_mins_avx2(row0, rb, nr, bs, k / 32, a, out, lanes);                                     \
    }
ROWS_MINS_AVX2(rows_q4_1_avx2, row_b32_avx2, LM_Q4_1, 20, 0)
ROWS_MINS_AVX2(rows_q5_1_avx2, row_b32_avx2, LM_Q5_1, 24, 0)
ROWS_MINS_AVX2(rows_q4_1_lanes_avx2, row_b32_lanes_avx2, LM_Q4_1, 20, 0)
ROWS_MINS_AVX2(rows_q5_1_layout_avx2, row_layout_avx2, LM_Q5_1, 24, 1)
#undef ROWS_MINS_AVX2

ROWS_AVX2(rows_f16_avx2, row_halves_avx2, LM_F16, 2)
ROWS_AVX2(rows_bf16_avx2, row_halves_avx2, LM_BF16, 2)

/*
 * One token through nr F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 or K-quant rows (rb bytes
 * apart) without decoding them first: generation reads each row once, and
 * the decoded row's stores and loads had cost as much as the dot.  Returns
 * 0, doing nothing, for other types.
 */
AVX2 int lm_rows_avx2(uint32_t t, const uint8_t *row0, size_t rb, int64_t nr, int64_t k, const act_row *a,
                      float *out)
{
    switch (t) {
    case LM_Q4_0: (a->lanes ? rows_q4_0_lanes_avx2 : rows_q4_0_avx2)(row0, rb, nr, k, a, out); return 1;
    case LM_Q5_0: (a->lanes ? rows_q5_0_lanes_avx2 : rows_q5_0_avx2)(row0, rb, nr, k, a, out); return 1;
    case LM_Q4_0_LANES: /* (their lanes layouts: only against a token in lanes) */
    case LM_Q5_0_LANES:
    case LM_Q5_1_LANES:
        if (!a->lanes)
            return 0;
        (t == LM_Q4_0_LANES   ? rows_q4_0_layout_avx2
         : t == LM_Q5_0_LANES ? rows_q5_0_layout_avx2
                              : rows_q5_1_layout_avx2)(row0, rb, nr, k, a, out);
        return 1;
    case LM_Q8_0: rows_q8_0_avx2(row0, rb, nr, k, a, out); return 1;
    case LM_Q4_1: (a->lanes ? rows_q4_1_lanes_avx2 : rows_q4_1_avx2)(row0, rb, nr, k, a, out); return 1;
    case LM_Q5_1: rows_q5_1_avx2(row0, rb, nr, k, a, out); return 1;
    case LM_F16: rows_f16_avx2(row0, rb, nr, k, a, out); return 1;
    case LM_BF16: rows_bf16_avx2(row0, rb, nr, k, a, out); return 1;
    default: return lm_rows_k_avx2(t, row0, rb, nr, k, a, out); /* (qrow_k_avx2.c: the K-quants, or 0) */
    }
}

#else /* not x86 */

void lm_halves_to_f32_avx2(float *f, uint32_t t, const void *row, int64_t k)
{
    lm_dequant_row(t, row, f, k);
}
int lm_qrow_decode_avx2(qrow *r, uint32_t type, const void *src, int64_t k)
{
    (void)r, (void)type, (void)src, (void)k;
    return 0;
}
float lm_dot_b32_avx2(const qrow *w, const act_row *a) { return lm_dot_b32_scalar(w, a); }
float lm_dot_k_avx2(const qrow *w, const act_row *a) { return lm_dot_k_scalar(w, a); }
float lm_dot_f_avx2(const float *x, const float *y, int64_t n) { return lm_dot_f_scalar(x, y, n); }
int lm_rows_avx2(uint32_t t, const uint8_t *row0, size_t rb, int64_t nr, int64_t k, const act_row *a,
                 float *out)
{
    (void)t, (void)row0, (void)rb, (void)nr, (void)k, (void)a, (void)out;
    return 0;
}

#endif
