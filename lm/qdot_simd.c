/*
 * lm/qdot_simd.c - the x86 fast paths of qdot.c, chosen at run time.
 * Every function here computes exactly what its scalar twin computes (same
 * integer sums, same fused multiply-adds in the same lanes, same final tree),
 * so switching paths never changes a bit of the logits; tests compare them.
 *   dots      AVX-512 VNNI, one token: vpdpbusd over 64 codes, seeded with
 *             the offset correction; each block's sum scaled into 16 float
 *             lanes (32-element blocks) or one sum (K-quants).  Rows read
 *             straight from the weights against up to 8 tokens: 32-element
 *             blocks here, K-quants in qrow_k.c; groups of 16 tokens go
 *             through qgemm.c.
 * CPUs with AVX2 but not AVX-512 have theirs in qdot_avx2.c, aarch64 in
 * qdot_neon.c; other CPUs use the scalar paths.
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
#ifdef LM_EMULATE_AVX512 /* tests/avx512emu: the AVX-512 paths, emulated on AVX2 */
    if (ymm && avx2 && fma && f16c)
        return LM_ISA_AVX512;
#endif
    if (ymm && avx2 && fma && f16c)
        return LM_ISA_AVX2;
    return LM_ISA_SCALAR;
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

#else /* not x86: scalar, or NEON's dots (qdot_neon.c) */

int lm_cpu_isa(void)
{
    return lm_cpu_neon_dot() ? LM_ISA_NEON_DOT : lm_cpu_neon() ? LM_ISA_NEON : LM_ISA_SCALAR;
}
float lm_dot_b32_avx512(const qrow *w, const act_row *a) { return lm_dot_b32_scalar(w, a); }
float lm_dot_k_avx512(const qrow *w, const act_row *a) { return lm_dot_k_scalar(w, a); }
float lm_dot_f_avx512(const float *x, const float *y, int64_t n) { return lm_dot_f_scalar(x, y, n); }

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
AVX512 static INLINE void step_decode(uint32_t t, const uint8_t *blk, size_t bs, int m, int ntok, size_t ahead,
                                      __m512i u[8], __m512 *dw)
{
    lm_prefetch_ahead(blk, (size_t)m * bs, ntok, ahead);
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
        step_decode(t, row + (size_t)b * bs, bs, 16, 1, a->ahead, u, &dw);
        acc = step_dot(a, b, 16, u, dw, acc);
    }
    if (nb - b > 4) { /* a long tail as one masked step, a short one block by block */
        step_decode(t, row + (size_t)b * bs, bs, (int)(nb - b), 1, a->ahead, u, &dw);
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
        step_decode(t, row + (size_t)b * bs, bs, 16, n, a[0].ahead, u, &dw);
        for (int j = 0; j < n; j++)
            acc[j] = step_dot(&a[j], b, 16, u, dw, acc[j]);
    }
    if (b < nb) {
        step_decode(t, row + (size_t)b * bs, bs, (int)(nb - b), n, a[0].ahead, u, &dw);
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
