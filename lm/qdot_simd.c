/*
 * lm/qdot_simd.c - the x86 fast paths of qdot.c, chosen at run time.
 * Every function here computes exactly what its scalar twin computes (same
 * integer sums, same fused multiply-adds in the same lanes, same final tree),
 * so switching paths never changes a bit of the logits; tests compare them.
 *   decoders  AVX2: nibble and bit unpacking of Q4_0, Q5_0, Q8_0, Q4_K,
 *             Q5_K and Q6_K rows into unsigned codes;
 *   dots      AVX2: pairs of byte products (maddubs), for CPUs without
 *             AVX-512;
 *             AVX-512 VNNI, one token: vpdpbusd over 64 codes, seeded with
 *             the offset correction; each block's sum scaled into 16 float
 *             lanes (32-element blocks) or one sum (K-quants).  Rows read
 *             straight from the weights against up to 8 tokens: 32-element
 *             blocks here, K-quants in qrow_k.c; groups of 16 tokens go
 *             through qgemm.c.
 * aarch64 has its dots in qdot_neon.c; other CPUs use the scalar paths.
 */
#include "internal.h"
#include "simd.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>


/* CPUID for the instructions, XGETBV for the OS saving the registers. */
int lm_cpu_isa(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return LM_ISA_SCALAR;
    int fma = (c >> 12) & 1, f16c = (c >> 29) & 1, osxsave = (c >> 27) & 1;
    if (!osxsave || !__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return LM_ISA_SCALAR;
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    int ymm = (lo & 0x6) == 0x6, zmm = ymm && (lo & 0xe0) == 0xe0;
    int avx2 = (b >> 5) & 1, avx512 = ((b >> 16) & 1) && ((b >> 17) & 1) && ((b >> 30) & 1) &&
                                     ((b >> 31) & 1) && ((c >> 11) & 1);
    if (zmm && avx512 && avx2 && fma && f16c)
        return LM_ISA_AVX512;
    if (ymm && avx2 && fma && f16c)
        return LM_ISA_AVX2;
    return LM_ISA_SCALAR;
}

/* ---------------------------------------------------------- decoders */

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

AVX2 static void decode_b32_avx2(qrow *r, const uint8_t *src, int64_t nb)
{
    const uint32_t t = r->type;
    const size_t bs = lm_type_size(t);
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *b = src + (size_t)i * bs;
        __m256i u;
        r->d[i] = half(b);
        r->m[i] = 0.0f;
        if (t == LM_Q8_0) {
            u = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 2)), _mm256_set1_epi8((char)0x80));
        } else if (t == LM_Q4_0) {
            u = nibbles32(b + 2);
        } else { /* Q5_0 */
            uint32_t qh;
            memcpy(&qh, b + 2, 4);
            u = _mm256_or_si256(nibbles32(b + 6), bits32(qh));
        }
        _mm256_storeu_si256((__m256i *)(r->u + i * 32), u);
    }
}

/* Q4_K, Q5_K: 4 chunks of 32 bytes, each 32 low then 32 high nibbles. */
AVX2 static void codes_q45k(const uint8_t *b, uint8_t *u, int five)
{
    const uint8_t *ql = five ? b + 48 : b + 16;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
    for (int p = 0; p < 4; p++) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(ql + 32 * p));
        __m256i lo = _mm256_and_si256(x, m4), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
        if (five) { /* bit 2p of qh[l] -> +16 on the low half, bit 2p+1 on the high */
            __m256i one = _mm256_set1_epi8(1);
            __m256i b0 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * p), one);
            __m256i b1 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * p + 1), one);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(b0, 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(b1, 4));
        }
        _mm256_storeu_si256((__m256i *)(u + 64 * p), lo);
        _mm256_storeu_si256((__m256i *)(u + 64 * p + 32), hi);
    }
}

/* Q6_K: codes = low nibble | two high bits << 4, in four 32-wide stripes per half. */
AVX2 static void codes_q6k(const uint8_t *b, uint8_t *u)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
    for (int n = 0; n < 2; n++) {
        __m256i l0 = _mm256_loadu_si256((const __m256i *)(b + 64 * n));
        __m256i l1 = _mm256_loadu_si256((const __m256i *)(b + 64 * n + 32));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * n));
        __m256i low[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                          _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                          _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
        for (int j = 0; j < 4; j++) {
            __m256i h = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), m3);
            _mm256_storeu_si256((__m256i *)(u + 128 * n + 32 * j),
                                _mm256_or_si256(low[j], _mm256_slli_epi16(h, 4)));
        }
    }
}

/* A K-quant super-block's codes. */
AVX2 static void k_codes(uint32_t type, const uint8_t *blk, uint8_t *u)
{
    if (type == LM_Q6_K)
        codes_q6k(blk, u);
    else
        codes_q45k(blk, u, type == LM_Q5_K);
}

/*
 * lm_k_scales_decode for Q4_K, Q5_K and Q6_K, with each group scale
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
    r->d[i] = half(t == LM_Q6_K ? b + 208 : b);
    r->m[i] = t == LM_Q6_K ? 0.0f : half(b + 2);
}

/* Returns 0 when the type has no fast decoder (the caller uses the scalar one). */
AVX2 int lm_qrow_decode_avx2(qrow *r, uint32_t type, const void *src, int64_t k)
{
    const uint8_t *b = src;
    r->type = type;
    r->k = k;
    if (type == LM_Q4_0 || type == LM_Q5_0 || type == LM_Q8_0) {
        decode_b32_avx2(r, b, k / 32);
        return 1;
    }
    if (type != LM_Q4_K && type != LM_Q5_K && type != LM_Q6_K)
        return 0;
    const size_t bs = lm_type_size(type);
    for (int64_t i = 0; i < k / 256; i++) {
        k_scales_avx2(r, type, b + (size_t)i * bs, i);
        k_codes(type, b + (size_t)i * bs, r->u + i * 256);
    }
    return 1;
}

/* ------------------------------------------------------------ dots */

/* -128 * (sum of each 4 signed weight codes): seeds dpbusd of (a + 128) by q. */
AVX512 static inline __m512i seed64(__m512i q)
{
    __m512i s4 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), q);
    return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(s4, 7));
}

AVX512 static inline __m256i seed32(__m256i q)
{
    __m256i s4 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), q);
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(s4, 7));
}

/* Lanes of sum(q * a) over 4 codes: (a + 128) is the unsigned operand. */
AVX512 static inline __m512i lanes64(__m512i seed, __m512i q, const int8_t *a)
{
    __m512i au = _mm512_xor_si512(_mm512_loadu_si512(a), _mm512_set1_epi8((char)0x80));
    return _mm512_dpbusd_epi32(seed, au, q);
}

AVX512 static inline __m256i lanes32(__m256i seed, __m256i q, const int8_t *a)
{
    __m256i au = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)a), _mm256_set1_epi8((char)0x80));
    return _mm256_dpbusd_epi32(seed, au, q);
}

/* v[p] holds 8 lanes of block 2p, then 8 of block 2p+1: lane j of the result is block j's sum. */
AVX512 static inline __m512i block_totals16(const __m512i v[8])
{
    __m512i w0 = pair_sums(v[0], v[1]), w1 = pair_sums(v[2], v[3]);
    __m512i w2 = pair_sums(v[4], v[5]), w3 = pair_sums(v[6], v[7]);
    return pair_sums(pair_sums(w0, w1), pair_sums(w2, w3));
}

AVX2 static inline int32_t hsum8_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* lane b % 16 of acc += dd * total: one block outside a run of 16. */
AVX512 static inline __m512 add_block(__m512 acc, int64_t b, float dd, int32_t total)
{
    return _mm512_mask3_fmadd_ps(_mm512_set1_ps(dd), _mm512_set1_ps((float)total), acc,
                                 (__mmask16)(1u << (b % 16)));
}

AVX512 float lm_dot_b32_avx512(const qrow *w, const act_row *a)
{
    const int64_t nb = w->k / 32;
    __m512 acc = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 16 <= nb; b += 16) {
        __m512i v[8];
        for (int p = 0; p < 8; p++) {
            int64_t e = (b + 2 * p) * 32;
            v[p] = _mm512_dpbusd_epi32(_mm512_loadu_si512(a->negcorr + e / 4), _mm512_loadu_si512(w->u + e),
                                       _mm512_loadu_si512(a->qs + e));
        }
        __m512 dd = _mm512_mul_ps(_mm512_loadu_ps(w->d + b), _mm512_loadu_ps(a->d + b));
        acc = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(block_totals16(v)), acc);
    }
    for (; b < nb; b++) {
        __m256i v = _mm256_dpbusd_epi32(_mm256_loadu_si256((const __m256i *)(a->negcorr + b * 8)),
                                        _mm256_loadu_si256((const __m256i *)(w->u + b * 32)),
                                        _mm256_loadu_si256((const __m256i *)(a->qs + b * 32)));
        acc = add_block(acc, b, w->d[b] * a->d[b], hsum8_epi32(v));
    }
    float mins = 0.0f;
    if (w->type == LM_Q4_1 || w->type == LM_Q5_1)
        for (b = 0; b < nb; b++)
            mins = __builtin_fmaf(w->m[b], a->s[b], mins);
    return hsum16_avx512(acc) + mins;
}

AVX512 float lm_dot_k_avx512(const qrow *w, const act_row *a)
{
    const __m512i off = _mm512_set1_epi8((char)lm_code_offset(w->type));
    float acc[LM_K_LANES] = {0}, mins[LM_K_LANES] = {0};
    for (int64_t b = 0; b < w->k / 256; b++) {
        __m512i sum = _mm512_setzero_si512();
        for (int z = 0; z < 4; z++) {
            int64_t e = b * 256 + 64 * z;
            __m512i q = _mm512_sub_epi8(_mm512_loadu_si512(w->u + e), off);
            __m512i v = lanes64(seed64(q), q, a->qs + e);
            sum = _mm512_add_epi32(sum, _mm512_mullo_epi32(_mm512_loadu_si512(w->sc4 + e / 4), v));
        }
        acc[b % LM_K_LANES] = __builtin_fmaf(w->d[b] * a->d[b], (float)_mm512_reduce_add_epi32(sum),
                                             acc[b % LM_K_LANES]);
        mins[b % LM_K_LANES] += lm_k_mins(w, a, b);
    }
    return lm_k_total(acc, mins);
}

AVX512 float lm_dot_f_avx512(const float *x, const float *y, int64_t n)
{
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), acc);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        acc = _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i),
                                    acc, m);
    }
    return hsum16_avx512(acc);
}

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
    return _mm256_add_epi32(v, _mm256_loadu_si256((const __m256i *)negcorr));
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
    return _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20), _mm256_permute2x128_si256(lo, hi, 0x31));
}

/* Blocks b..b+7 (b + 8 <= nb) scaled into acc: block b + j in lane j. */
AVX2 static inline __m256 blocks8_avx2(const qrow *w, const act_row *a, int64_t b, __m256 acc)
{
    const int q8 = w->type == LM_Q8_0;
    __m256i v[8];
    for (int j = 0; j < 8; j++) {
        int64_t e = (b + j) * 32;
        v[j] = lanes32_avx2(w->u + e, a->qs + e, a->negcorr + e / 4, q8);
    }
    __m256 dd = _mm256_mul_ps(_mm256_loadu_ps(w->d + b), _mm256_loadu_ps(a->d + b));
    return _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(totals8_avx2(v)), acc);
}

AVX2 float lm_dot_b32_avx2(const qrow *w, const act_row *a)
{
    const int64_t nb = w->k / 32;
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 16 <= nb; b += 16) {
        lo = blocks8_avx2(w, a, b, lo);
        hi = blocks8_avx2(w, a, b + 8, hi);
    }
    float acc[16], mins = 0.0f;
    _mm256_storeu_ps(acc, lo);
    _mm256_storeu_ps(acc + 8, hi);
    for (; b < nb; b++) { /* the last 1-15 blocks one at a time */
        __m256i v = lanes32_avx2(w->u + b * 32, a->qs + b * 32, a->negcorr + b * 8, w->type == LM_Q8_0);
        acc[b % 16] = __builtin_fmaf(w->d[b] * a->d[b], (float)hsum8_epi32(v), acc[b % 16]);
    }
    if (w->type == LM_Q4_1 || w->type == LM_Q5_1)
        for (b = 0; b < nb; b++)
            mins = __builtin_fmaf(w->m[b], a->s[b], mins);
    return lm_hsum16(acc) + mins;
}

/* K-quant codes have at most 6 bits: every lane takes the maddubs path. */
AVX2 float lm_dot_k_avx2(const qrow *w, const act_row *a)
{
    float acc[LM_K_LANES] = {0}, mins[LM_K_LANES] = {0};
    for (int64_t b = 0; b < w->k / 256; b++) {
        __m256i sum = _mm256_setzero_si256();
        for (int z = 0; z < 8; z++) {
            int64_t e = b * 256 + 32 * z;
            __m256i v = lanes32_avx2(w->u + e, a->qs + e, a->negcorr + e / 4, 0);
            sum = _mm256_add_epi32(sum, _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i *)(w->sc4 + e / 4)), v));
        }
        acc[b % LM_K_LANES] = __builtin_fmaf(w->d[b] * a->d[b], (float)hsum8_epi32(sum), acc[b % LM_K_LANES]);
        mins[b % LM_K_LANES] += lm_k_mins(w, a, b);
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
    float acc[16];
    _mm256_storeu_ps(acc, lo);
    _mm256_storeu_ps(acc + 8, hi);
    for (int j = 0; i < n; i++, j++)
        acc[j] = __builtin_fmaf(x[i], y[i], acc[j]);
    return lm_hsum16(acc);
}

/* Block i's 32 codes (code offset kept) of a Q4_0, Q5_0 or Q8_0 row, straight from the file. */
AVX2 static INLINE __m256i raw_codes32(uint32_t t, const uint8_t *blk)
{
    if (t == LM_Q4_0)
        return nibbles32(blk + 2);
    if (t == LM_Q8_0)
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)), _mm256_set1_epi8((char)0x80));
    uint32_t qh; /* Q5_0 */
    memcpy(&qh, blk + 2, 4);
    return _mm256_or_si256(nibbles32(blk + 6), bits32(qh));
}

/* lm_dot_b32_avx2 on the row's blocks as the file holds them (bs bytes each), not decoded first. */
AVX2 static INLINE float row_b32_avx2(uint32_t t, const uint8_t *row, size_t bs, int64_t k, const act_row *a)
{
    const int64_t nb = k / 32;
    const int q8 = t == LM_Q8_0;
    __m256 acc8[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t b = 0;
    for (; b + 16 <= nb; b += 16) {
        lm_prefetch_ahead(row + b * bs, 16 * bs);
        for (int h = 0; h < 2; h++) {
            __m256i v[8];
            uint16_t dh[8];
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                const int64_t i = b + 8 * h + j;
                const uint8_t *blk = row + i * bs;
                memcpy(&dh[j], blk, 2);
                v[j] = lane_sums_avx2(raw_codes32(t, blk), a->qs + i * 32, a->negcorr + i * 8, q8);
            }
            __m256 dw = _mm256_cvtph_ps(_mm_setr_epi16((short)dh[0], (short)dh[1], (short)dh[2], (short)dh[3],
                                                       (short)dh[4], (short)dh[5], (short)dh[6], (short)dh[7]));
            __m256 dd = _mm256_mul_ps(dw, _mm256_loadu_ps(a->d + b + 8 * h));
            acc8[h] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(totals8_avx2(v)), acc8[h]);
        }
    }
    float acc[16];
    _mm256_storeu_ps(acc, acc8[0]);
    _mm256_storeu_ps(acc + 8, acc8[1]);
    for (; b < nb; b++) { /* the last 1-15 blocks one at a time */
        const uint8_t *blk = row + b * bs;
        __m256i v = lane_sums_avx2(raw_codes32(t, blk), a->qs + b * 32, a->negcorr + b * 8, q8);
        acc[b % 16] = __builtin_fmaf(half(blk) * a->d[b], (float)hsum8_epi32(v), acc[b % 16]);
    }
    return lm_hsum16(acc);
}

/* Rows one after another, each type a function of its own (the type a constant inside). */
#define ROWS_B32_AVX2(name, t, bs)                                                                   \
    AVX2 __attribute__((noinline)) static void name(const uint8_t *row0, size_t rb, int64_t nr,       \
                                                    int64_t k, const act_row *a, float *out)         \
    {                                                                                                \
        for (int64_t r = 0; r < nr; r++)                                                             \
            out[r] = row_b32_avx2(t, row0 + (size_t)r * rb, bs, k, a);                               \
    }
ROWS_B32_AVX2(rows_q4_0_avx2, LM_Q4_0, 18)
ROWS_B32_AVX2(rows_q5_0_avx2, LM_Q5_0, 22)
ROWS_B32_AVX2(rows_q8_0_avx2, LM_Q8_0, 34)
#undef ROWS_B32_AVX2

/*
 * One token through nr Q4_0, Q5_0 or Q8_0 rows (rb bytes apart) without
 * decoding them first: generation reads each row once, and the decoded
 * row's stores and loads had cost as much as the dot.  Returns 0, doing
 * nothing, for other types.
 */
AVX2 int lm_rows_b32_avx2(uint32_t t, const uint8_t *row0, size_t rb, int64_t nr, int64_t k, const act_row *a,
                          float *out)
{
    if (t == LM_Q4_0)
        rows_q4_0_avx2(row0, rb, nr, k, a, out);
    else if (t == LM_Q5_0)
        rows_q5_0_avx2(row0, rb, nr, k, a, out);
    else if (t == LM_Q8_0)
        rows_q8_0_avx2(row0, rb, nr, k, a, out);
    else
        return 0;
    return 1;
}

#else /* not x86: scalar, or NEON's dots (qdot_neon.c) */

int lm_cpu_isa(void) { return lm_cpu_neon_dot() ? LM_ISA_NEON : LM_ISA_SCALAR; }
int lm_qrow_decode_avx2(qrow *r, uint32_t type, const void *src, int64_t k)
{
    (void)r, (void)type, (void)src, (void)k;
    return 0;
}
float lm_dot_b32_avx512(const qrow *w, const act_row *a) { return lm_dot_b32_scalar(w, a); }
float lm_dot_k_avx512(const qrow *w, const act_row *a) { return lm_dot_k_scalar(w, a); }
float lm_dot_f_avx512(const float *x, const float *y, int64_t n) { return lm_dot_f_scalar(x, y, n); }
float lm_dot_b32_avx2(const qrow *w, const act_row *a) { return lm_dot_b32_scalar(w, a); }
float lm_dot_k_avx2(const qrow *w, const act_row *a) { return lm_dot_k_scalar(w, a); }
float lm_dot_f_avx2(const float *x, const float *y, int64_t n) { return lm_dot_f_scalar(x, y, n); }
int lm_rows_b32_avx2(uint32_t t, const uint8_t *row0, size_t rb, int64_t nr, int64_t k, const act_row *a,
                     float *out)
{
    (void)t, (void)row0, (void)rb, (void)nr, (void)k, (void)a, (void)out;
    return 0;
}

#endif

/* ------------------------------------------------ fused row x tokens */
#if defined(__x86_64__) && defined(__GNUC__)

#define GROUP 8 /* tokens a fused call; larger batches go to qgemm.c's groups */

AVX512 static inline __m256i codes1_b32(uint32_t t, const uint8_t *b0)
{
    if (t == LM_Q8_0)
        return _mm256_loadu_si256((const __m256i *)(b0 + 2));
    __m256i u;
    if (t == LM_Q4_0) {
        u = nibbles32(b0 + 2);
    } else {
        uint32_t h;
        memcpy(&h, b0 + 2, 4);
        u = _mm256_or_si256(nibbles32(b0 + 6), bits32(h));
    }
    return _mm256_sub_epi8(u, _mm256_set1_epi8((char)lm_code_offset(t)));
}

/* Unsigned codes of blocks b and b+1 (code + offset), 64 in one register. */
AVX512 static inline __m512i ucodes2_b32(uint32_t t, const uint8_t *b0, size_t bs)
{
    const uint8_t *b1 = b0 + bs;
    if (t == LM_Q8_0) {
        __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 2))),
                                       _mm256_loadu_si256((const __m256i *)(b1 + 2)), 1);
        return _mm512_xor_si512(q, _mm512_set1_epi8((char)0x80));
    }
    int qo = t == LM_Q4_0 ? 2 : 6;
    __m256i x = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(b1 + qo)),
                                 _mm_loadu_si128((const __m128i *)(b0 + qo)));
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(x, m4)),
                                   _mm256_and_si256(_mm256_srli_epi16(x, 4), m4), 1);
    z = _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)); /* lo0 hi0 lo1 hi1 */
    if (t == LM_Q5_0) { /* bit e of qh is the fifth bit of code e */
        uint32_t h0, h1;
        memcpy(&h0, b0 + 2, 4), memcpy(&h1, b1 + 2, 4);
        z = _mm512_or_si512(z, _mm512_maskz_mov_epi8((__mmask64)h0 | ((__mmask64)h1 << 32), _mm512_set1_epi8(0x10)));
    }
    return z;
}

/* The unsigned codes of blocks 2p, 2p+1 of a step of nb blocks (zero past the last). */
AVX512 static INLINE __m512i step_codes(uint32_t t, const uint8_t *blk, size_t bs, int p, int nb)
{
    if (2 * p + 1 < nb)
        return ucodes2_b32(t, blk + 2 * p * bs, bs);
    if (2 * p < nb) /* a last odd block: the upper half stays zero */
        return _mm512_castsi256_si512(
            _mm256_add_epi8(codes1_b32(t, blk + 2 * p * bs), _mm256_set1_epi8((char)lm_code_offset(t))));
    return _mm512_setzero_si512();
}

/* Sums of blocks b+2p, b+2p+1 of one token; past the activation's end nothing is read. */
AVX512 static INLINE __m512i step_pair(const act_row *a, int64_t b, int p, int nb, __m512i u)
{
    int64_t e = (b + 2 * p) * 32;
    if (2 * p + 1 < nb)
        return _mm512_dpbusd_epi32(_mm512_loadu_si512(a->negcorr + e / 4), u, _mm512_loadu_si512(a->qs + e));
    if (2 * p < nb)
        return _mm512_dpbusd_epi32(_mm512_maskz_loadu_epi32(0xff, a->negcorr + e / 4), u,
                                   _mm512_maskz_loadu_epi8(0xffffffffull, a->qs + e));
    return _mm512_setzero_si512();
}

/* A step of m <= 16 blocks decoded: codes two blocks a vector, scales. */
AVX512 static INLINE void step_decode(uint32_t t, const uint8_t *blk, size_t bs, int m, __m512i u[8], __m512 *dw)
{
    lm_prefetch_ahead(blk, (size_t)m * bs);
    if (m == 16) {
        _Pragma("GCC unroll 8")
        for (int p = 0; p < 8; p++)
            u[p] = ucodes2_b32(t, blk + 2 * p * bs, bs);
    } else {
        _Pragma("GCC unroll 8")
        for (int p = 0; p < 8; p++)
            u[p] = step_codes(t, blk, bs, p, m);
    }
    *dw = block_scales16(blk, bs, (__mmask16)(m == 16 ? 0xffff : (1u << m) - 1));
}

/* One token through a decoded step at block b: its lanes of acc. */
AVX512 static INLINE __m512 step_dot(const act_row *a, int64_t b, int m, const __m512i u[8], __m512 dw, __m512 acc)
{
    __m512i v[8];
    if (m == 16) {
        _Pragma("GCC unroll 8")
        for (int p = 0; p < 8; p++) {
            int64_t e = (b + 2 * p) * 32;
            v[p] = _mm512_dpbusd_epi32(_mm512_loadu_si512(a->negcorr + e / 4), u[p], _mm512_loadu_si512(a->qs + e));
        }
        __m512 dd = _mm512_mul_ps(dw, _mm512_loadu_ps(a->d + b));
        return _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(block_totals16(v)), acc);
    }
    const __mmask16 live = (__mmask16)((1u << m) - 1);
    _Pragma("GCC unroll 8")
    for (int p = 0; p < 8; p++)
        v[p] = step_pair(a, b, p, m, u[p]);
    __m512 dd = _mm512_mul_ps(dw, _mm512_maskz_loadu_ps(live, a->d + b));
    return _mm512_mask3_fmadd_ps(dd, _mm512_cvtepi32_ps(block_totals16(v)), acc, live);
}

/*
 * One token through a Q4_0, Q5_0 or Q8_0 row, straight from the weights:
 * 16 blocks a step, their sums gathered into one vector and scaled at once.
 * The offset correction comes from the activation.
 */
AVX512 static float one_b32(uint32_t t, const uint8_t *row, int64_t k, const act_row *a)
{
    const size_t bs = lm_type_size(t);
    const int64_t nb = k / 32;
    __m512 acc = _mm512_setzero_ps(), dw;
    __m512i u[8];
    int64_t b = 0;
    for (; b + 16 <= nb; b += 16) {
        step_decode(t, row + (size_t)b * bs, bs, 16, u, &dw);
        acc = step_dot(a, b, 16, u, dw, acc);
    }
    if (nb - b > 4) { /* a long tail as one masked step, a short one block by block */
        step_decode(t, row + (size_t)b * bs, bs, (int)(nb - b), u, &dw);
        return hsum16_avx512(step_dot(a, b, (int)(nb - b), u, dw, acc));
    }
    for (; b < nb; b++) {
        const uint8_t *blk = row + (size_t)b * bs;
        __m256i q = codes1_b32(t, blk);
        acc = add_block(acc, b, half(blk) * a->d[b], hsum8_epi32(lanes32(seed32(q), q, a->qs + b * 32)));
    }
    return hsum16_avx512(acc);
}


/* The same rows against 2..GROUP tokens, each step decoded once for all. */
AVX512 static void fused_b32(uint32_t t, const uint8_t *row, int64_t k, const act_row *a, int n,
                             float *out)
{
    if (n == 1) {
        out[0] = one_b32(t, row, k, a);
        return;
    }
    const size_t bs = lm_type_size(t);
    const int64_t nb = k / 32;
    __m512 acc[GROUP], dw;
    __m512i u[8];
    for (int j = 0; j < n; j++)
        acc[j] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 16 <= nb; b += 16) {
        step_decode(t, row + (size_t)b * bs, bs, 16, u, &dw);
        for (int j = 0; j < n; j++)
            acc[j] = step_dot(&a[j], b, 16, u, dw, acc[j]);
    }
    if (b < nb) {
        step_decode(t, row + (size_t)b * bs, bs, (int)(nb - b), u, &dw);
        for (int j = 0; j < n; j++)
            acc[j] = step_dot(&a[j], b, (int)(nb - b), u, dw, acc[j]);
    }
    for (int j = 0; j < n; j++)
        out[j] = hsum16_avx512(acc[j]);
}

/*
 * Q4_0 and Q5_0 in the 16-row kernel: four rows' 16 bytes of nibbles in one
 * vector, low nibbles (codes 0-15) and high (16-31) apart, against the
 * block's two halves of activation; then 4 lanes per row fold to one.
 */
AVX512 static INLINE __m512i rows16_nibble_sums(uint32_t t, const uint8_t *blk, size_t rb, const act_row *a,
                                                int64_t b)
{
    const int qo = t == LM_Q4_0 ? 2 : 6;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512i alo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(a->qs + b * 32)));
    __m512i ahi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(a->qs + b * 32 + 16)));
    __m512i nlo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(a->negcorr + b * 8)));
    __m512i nhi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(a->negcorr + b * 8 + 4)));
    __m512i w[4];
    for (int g = 0; g < 4; g++) { /* rows 4g .. 4g+3, 4 lanes each */
        const uint8_t *r0 = blk + 4 * (size_t)g * rb;
        __m512i x = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(r0 + qo)));
        x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(r0 + rb + qo)), 1);
        x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(r0 + 2 * rb + qo)), 2);
        x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(r0 + 3 * rb + qo)), 3);
        __m512i lo = _mm512_and_si512(x, m4), hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
        if (t == LM_Q5_0) { /* bit j of qh is the fifth bit of code j */
            uint64_t mlo = 0, mhi = 0;
            for (int i = 0; i < 4; i++) {
                uint32_t h;
                memcpy(&h, r0 + (size_t)i * rb + 2, 4);
                mlo |= (uint64_t)(h & 0xffff) << (16 * i);
                mhi |= (uint64_t)(h >> 16) << (16 * i);
            }
            lo = _mm512_or_si512(lo, _mm512_maskz_mov_epi8(mlo, _mm512_set1_epi8(0x10)));
            hi = _mm512_or_si512(hi, _mm512_maskz_mov_epi8(mhi, _mm512_set1_epi8(0x10)));
        }
        w[g] = _mm512_add_epi32(_mm512_dpbusd_epi32(nlo, lo, alo), _mm512_dpbusd_epi32(nhi, hi, ahi));
    }
    return fold_fours(w[0], w[1], w[2], w[3]);
}

/*
 * One token through 16 consecutive Q4_0, Q5_0 or Q8_0 rows at once: the
 * 16 rows' sums of a block land in one vector, lane r for row r, and every row keeps lm_dot_b32_scalar's
 * 16 accumulators (block b in accumulator b % 16) in lane r of acc[b % 16].
 * No row has a tail of blocks to finish on its own.
 */
int lm_rows16_type(uint32_t t)
{
    return t == LM_Q4_0 || t == LM_Q5_0 || t == LM_Q8_0;
}

AVX512 int lm_rows16_avx512(uint32_t t, const uint8_t *row0, size_t rb, int64_t k, const act_row *a, float *out)
{
    if (!lm_rows16_type(t))
        return 0;
    const size_t bs = lm_type_size(t);
    const int64_t nb = k / 32;
    __m512 acc[16];
    for (int l = 0; l < 16; l++)
        acc[l] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row0 + (size_t)b * bs;
        if (bs > 32 || b % 2 == 0) /* the next 16 rows, where this step will read them */
            for (int r = 0; r < 16; r++)
                _mm_prefetch((const char *)(blk + (16 + r) * rb), _MM_HINT_T0);
        __m512i sums;
        if (t == LM_Q8_0) { /* a vector holds one block of two rows */
            __m512i qa = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(a->qs + b * 32)));
            __m512i nc = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(a->negcorr + b * 8)));
            __m512i v[8];
            for (int p = 0; p < 8; p++)
                v[p] = _mm512_dpbusd_epi32(nc, ucodes2_b32(t, blk + 2 * p * rb, rb), qa);
            sums = block_totals16(v);
        } else {
            sums = rows16_nibble_sums(t, blk, rb, a, b);
        }
        __m512 dd = _mm512_mul_ps(block_scales16(blk, rb, 0xffff), _mm512_set1_ps(a->d[b]));
        acc[b % 16] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(sums), acc[b % 16]);
    }
    _mm512_storeu_ps(out, hsum16_lanes(acc));
    return 1;
}

/*
 * One 32-element-block row against a few tokens (out[j] for token j); 0 for
 * other types (K-quant rows go through lm_rows_k_avx512).
 */
AVX512 int lm_fused_row_avx512(uint32_t t, const void *row, int64_t k, const act_row *a, int n,
                               float *out, qrow *scratch)
{
    (void)scratch;
    if (t != LM_Q4_0 && t != LM_Q5_0 && t != LM_Q8_0)
        return 0;
    for (int j = 0; j < n; j += GROUP)
        fused_b32(t, row, k, a + j, n - j < GROUP ? n - j : GROUP, out + j);
    return 1;
}

#else
int lm_rows16_type(uint32_t t)
{
    (void)t;
    return 0;
}

int lm_rows16_avx512(uint32_t t, const uint8_t *row0, size_t rb, int64_t k, const act_row *a, float *out)
{
    (void)t, (void)row0, (void)rb, (void)k, (void)a, (void)out;
    return 0;
}

int lm_fused_row_avx512(uint32_t t, const void *row, int64_t k, const act_row *a, int n,
                        float *out, qrow *scratch)
{
    (void)t, (void)row, (void)k, (void)a, (void)n, (void)out, (void)scratch;
    return 0;
}
#endif
