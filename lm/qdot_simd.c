/*
 * lm/qdot_simd.c - the x86 fast paths of qdot.c, chosen at run time.
 * Every function here computes exactly what its scalar twin computes (same
 * integer sums, same fused multiply-adds in the same lanes, same final tree),
 * so switching paths never changes a bit of the logits; tests compare them.
 *   decoders  AVX2: nibble and bit unpacking of Q4_0, Q5_0, Q8_0, Q4_K,
 *             Q5_K and Q6_K rows into unsigned codes;
 *   dots      AVX-512 VNNI, one token: vpdpbusd over 64 codes, seeded with
 *             the offset correction; each block's sum scaled into 16 float
 *             lanes (32-element blocks) or one sum (K-quants).  Several
 *             tokens go through qgemm.c instead.
 * Other architectures and older x86 CPUs use the scalar paths.
 */
#include "internal.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))

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
    size_t bs = lm_type_size(type);
    for (int64_t i = 0; i < k / 256; i++) {
        const uint8_t *blk = b + (size_t)i * bs;
        lm_k_scales_decode(r, type, blk, i);
        if (type == LM_Q6_K)
            codes_q6k(blk, r->u + i * 256);
        else
            codes_q45k(blk, r->u + i * 256, type == LM_Q5_K);
    }
    return 1;
}

/* ------------------------------------------------------------ dots */

AVX512 static inline float hsum16_avx512(__m512 acc)
{
    /* the same tree as lm_hsum16: halves, quarters, then (0+2) + (1+3) */
    __m256 t8 = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
    __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
    __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    return _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)));
}

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

/* Two vectors of 8-lane groups -> one of their pairwise sums, groups kept in order. */
AVX512 static inline __m512i pair_sums(__m512i x, __m512i y)
{
    const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i od = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_add_epi32(_mm512_permutex2var_epi32(x, ev, y), _mm512_permutex2var_epi32(x, od, y));
}

/* v[p] holds 8 lanes of block 2p, then 8 of block 2p+1: lane j of the result is block j's sum. */
AVX512 static inline __m512i block_totals16(const __m512i v[8])
{
    __m512i w0 = pair_sums(v[0], v[1]), w1 = pair_sums(v[2], v[3]);
    __m512i w2 = pair_sums(v[4], v[5]), w3 = pair_sums(v[6], v[7]);
    return pair_sums(pair_sums(w0, w1), pair_sums(w2, w3));
}

AVX512 static inline int32_t hsum8_epi32(__m256i v)
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
    float acc = 0.0f, mins = 0.0f;
    for (int64_t b = 0; b < w->k / 256; b++) {
        __m512i sum = _mm512_setzero_si512();
        for (int z = 0; z < 4; z++) {
            int64_t e = b * 256 + 64 * z;
            __m512i q = _mm512_sub_epi8(_mm512_loadu_si512(w->u + e), off);
            __m512i v = lanes64(seed64(q), q, a->qs + e);
            sum = _mm512_add_epi32(sum, _mm512_mullo_epi32(_mm512_loadu_si512(w->sc4 + e / 4), v));
        }
        acc = __builtin_fmaf(w->d[b] * a->d[b], (float)_mm512_reduce_add_epi32(sum), acc);
        mins += lm_k_mins(w, a, b);
    }
    return acc - mins;
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

#else /* not x86: scalar only */

int lm_cpu_isa(void) { return LM_ISA_SCALAR; }
int lm_qrow_decode_avx2(qrow *r, uint32_t type, const void *src, int64_t k)
{
    (void)r, (void)type, (void)src, (void)k;
    return 0;
}
float lm_dot_b32_avx512(const qrow *w, const act_row *a) { return lm_dot_b32_scalar(w, a); }
float lm_dot_k_avx512(const qrow *w, const act_row *a) { return lm_dot_k_scalar(w, a); }
float lm_dot_f_avx512(const float *x, const float *y, int64_t n) { return lm_dot_f_scalar(x, y, n); }

#endif

/* ------------------------------------------------ fused row x tokens */
#if defined(__x86_64__) && defined(__GNUC__)

#define GROUP 8 /* tokens a fused call; larger batches go to qgemm.c's groups */

/*
 * A generated token streams every weight from DRAM once, and the hardware
 * prefetcher alone leaves the core waiting on most loads (tinyllama Q4_0
 * generated 15 tokens/s without this, 34 with it): each kernel asks for the
 * bytes 4 KiB beyond the span it is about to read.  Both ends of the span
 * are requested, so no cache line is skipped when a span crosses two.
 */
#define PREFETCH_AHEAD 4096

static inline void prefetch_span(const uint8_t *p, size_t n)
{
    _mm_prefetch((const char *)(p + PREFETCH_AHEAD), _MM_HINT_T0);
    _mm_prefetch((const char *)(p + PREFETCH_AHEAD + n - 1), _MM_HINT_T0);
}

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

#define INLINE __attribute__((always_inline)) inline

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

/* The f16 scales opening the nb blocks of a step (a gather of 32 bits, low halves kept). */
AVX512 static inline __m512 step_scales(const uint8_t *blk, size_t bs, __mmask16 live)
{
    const __m512i at = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32((int)bs));
    __m512i d32 = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, at, (const void *)blk, 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d32));
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
    for (size_t o = 0; o < (size_t)m * bs; o += 64)
        prefetch_span(blk + o, 1);
    if (m == 16) {
        _Pragma("GCC unroll 8")
        for (int p = 0; p < 8; p++)
            u[p] = ucodes2_b32(t, blk + 2 * p * bs, bs);
    } else {
        _Pragma("GCC unroll 8")
        for (int p = 0; p < 8; p++)
            u[p] = step_codes(t, blk, bs, p, m);
    }
    *dw = step_scales(blk, bs, (__mmask16)(m == 16 ? 0xffff : (1u << m) - 1));
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
    const __m512i step = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32((int)bs));
    __m512 acc = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 16 <= nb; b += 16) {
        const uint8_t *blk = row + (size_t)b * bs;
        for (size_t o = 0; o < 16 * bs; o += 64)
            prefetch_span(blk + o, 1);
        __m512i v[8];
        for (int p = 0; p < 8; p++) {
            int64_t e = (b + 2 * p) * 32;
            v[p] = _mm512_dpbusd_epi32(_mm512_loadu_si512(a->negcorr + e / 4),
                                       ucodes2_b32(t, blk + 2 * p * bs, bs), _mm512_loadu_si512(a->qs + e));
        }
        /* the f16 scale opens each block: gather 32 bits, keep the low half */
        __m512i d32 = _mm512_i32gather_epi32(step, (const void *)blk, 1);
        __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d32));
        __m512 dd = _mm512_mul_ps(dw, _mm512_loadu_ps(a->d + b));
        acc = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(block_totals16(v)), acc);
    }
    if (nb - b > 4) { /* a long tail as one masked step, a short one block by block */
        __m512 dw;
        __m512i u[8];
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

/* The 64 unsigned codes (code + offset) of chunk z of a K super-block. */
AVX512 static inline __m512i ucodes_k(uint32_t t, const uint8_t *blk, int z)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i lo, hi;
    if (t == LM_Q6_K) {
        int n = z / 2, j0 = 2 * (z % 2); /* stripes j0, j0+1 of half n */
        const uint8_t *ql = blk + 64 * n;
        __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n));
        __m256i x0 = _mm256_loadu_si256((const __m256i *)ql);
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
        __m256i l0 = j0 ? _mm256_srli_epi16(x0, 4) : x0, l1 = j0 ? _mm256_srli_epi16(x1, 4) : x1;
        __m256i m3 = _mm256_set1_epi8(3);
        lo = _mm256_or_si256(_mm256_and_si256(l0, m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j0), m3), 4));
        hi = _mm256_or_si256(_mm256_and_si256(l1, m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j0 + 2), m3), 4));
        return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
    const uint8_t *ql = blk + (t == LM_Q4_K ? 16 : 48) + 32 * z; /* pair z: low, then high nibbles */
    __m256i x = _mm256_loadu_si256((const __m256i *)ql);
    lo = _mm256_and_si256(x, m4);
    hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
    if (t == LM_Q5_K) {
        __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16)), one = _mm256_set1_epi8(1);
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * z), one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * z + 1), one), 4));
    }
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* A K super-block's scales as lanes of each 64-code chunk, its mins and factors. */
typedef struct kblk {
    __m512i sc[4];
    float d, dmin;
    int16_t mn[16];     /* one per 16 codes; zero when the type has no mins */
} kblk;

AVX512 static inline void kblk_decode(uint32_t t, const uint8_t *blk, kblk *kb)
{
    if (t == LM_Q6_K) {
        __m512i s16 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192)));
        for (int z = 0; z < 4; z++) { /* lane j of chunk z: group 4z + j/4 */
            __m512i idx = _mm512_set_epi32(4 * z + 3, 4 * z + 3, 4 * z + 3, 4 * z + 3, 4 * z + 2, 4 * z + 2,
                                           4 * z + 2, 4 * z + 2, 4 * z + 1, 4 * z + 1, 4 * z + 1, 4 * z + 1,
                                           4 * z, 4 * z, 4 * z, 4 * z);
            kb->sc[z] = _mm512_permutexvar_epi32(idx, s16);
        }
        kb->d = half(blk + 208), kb->dmin = 0.0f;
        memset(kb->mn, 0, sizeof kb->mn);
        return;
    }
    /* Q4_K/Q5_K: eight 6-bit scales and mins packed in 12 bytes */
    uint32_t u[4];
    const uint32_t km1 = 0x3f3f3f3f, km2 = 0x0f0f0f0f, km3 = 0x03030303;
    memcpy(u, blk + 4, 12);
    u[3] = ((u[2] >> 4) & km2) | (((u[1] >> 6) & km3) << 4);
    uint32_t m_lo = u[1] & km1;
    u[1] = (u[2] & km2) | (((u[0] >> 6) & km3) << 4);
    u[2] = m_lo;
    u[0] &= km1;
    const uint8_t *b8 = (const uint8_t *)u; /* scales 0..7, mins 8..15 */
    __m512i s8 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b8));
    for (int z = 0; z < 4; z++) { /* chunk z: sub-blocks 2z, 2z+1 of 32 codes */
        __m512i idx = _mm512_set_epi32(2 * z + 1, 2 * z + 1, 2 * z + 1, 2 * z + 1, 2 * z + 1, 2 * z + 1,
                                       2 * z + 1, 2 * z + 1, 2 * z, 2 * z, 2 * z, 2 * z, 2 * z, 2 * z, 2 * z, 2 * z);
        kb->sc[z] = _mm512_permutexvar_epi32(idx, s8);
    }
    /* each min covers two groups of 16: widen to 16-bit and repeat each */
    __m128i m8 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(b8 + 8)));
    _mm_storeu_si128((__m128i *)kb->mn, _mm_unpacklo_epi16(m8, m8));
    _mm_storeu_si128((__m128i *)(kb->mn + 8), _mm_unpackhi_epi16(m8, m8));
    kb->d = half(blk), kb->dmin = half(blk + 2);
}

/* The min term of a token on this super-block, as lm_k_mins computes it. */
AVX512 static inline float kblk_mins(const kblk *kb, const act_row *a, int64_t b)
{
    __m256i prod = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)kb->mn),
                                     _mm256_loadu_si256((const __m256i *)(a->sum16 + b * 16)));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(prod), _mm256_extracti128_si256(prod, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
    return (kb->dmin * a->d[b]) * (float)_mm_cvtsi128_si32(s4);
}

/* One token through a K row: the offset correction comes from the activation. */
AVX512 static float one_k(uint32_t t, const uint8_t *row, int64_t k, const act_row *a)
{
    const size_t bs = lm_type_size(t);
    const int off = lm_code_offset(t);
    float acc = 0.0f, mins = 0.0f;
    kblk kb;
    for (int64_t b = 0; b < k / 256; b++) {
        const uint8_t *blk = row + (size_t)b * bs;
        for (size_t o = 0; o < bs; o += 64)
            prefetch_span(blk + o, 1);
        kblk_decode(t, blk, &kb);
        __m512i sum = _mm512_setzero_si512();
        for (int z = 0; z < 4; z++) {
            int64_t e = b * 256 + 64 * z;
            __m512i seed = off ? _mm512_loadu_si512(a->negcorr + e / 4) : _mm512_setzero_si512();
            __m512i v = _mm512_dpbusd_epi32(seed, ucodes_k(t, blk, z), _mm512_loadu_si512(a->qs + e));
            sum = _mm512_add_epi32(sum, _mm512_mullo_epi32(kb.sc[z], v));
        }
        acc = __builtin_fmaf(kb.d * a->d[b], (float)_mm512_reduce_add_epi32(sum), acc);
        mins += kblk_mins(&kb, a, b);
    }
    return acc - mins;
}

/*
 * One token through 16 consecutive Q4_0, Q5_0 or Q8_0 rows at once: a
 * vector holds one block of two rows, so the 16 rows' sums of a block land
 * in one vector, lane r for row r, and every row keeps lm_dot_b32_scalar's
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
    const __m512i at = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32((int)rb));
    __m512 acc[16];
    for (int l = 0; l < 16; l++)
        acc[l] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row0 + (size_t)b * bs;
        if (b % 2 == 0) /* each row 512 bytes ahead; the last ones reach into the next 16 */
            for (int r = 0; r < 16; r++)
                _mm_prefetch((const char *)(blk + r * rb + 512), _MM_HINT_T0);
        __m512i qa = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(a->qs + b * 32)));
        __m512i nc = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(a->negcorr + b * 8)));
        __m512i v[8];
        for (int p = 0; p < 8; p++)
            v[p] = _mm512_dpbusd_epi32(nc, ucodes2_b32(t, blk + 2 * p * rb, rb), qa);
        __m512i d32 = _mm512_i32gather_epi32(at, (const void *)blk, 1);
        __m512 dd = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(d32)), _mm512_set1_ps(a->d[b]));
        acc[b % 16] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(block_totals16(v)), acc[b % 16]);
    }
    __m512 t8[8], t4[4]; /* lm_hsum16's tree, lane by lane */
    for (int i = 0; i < 8; i++)
        t8[i] = _mm512_add_ps(acc[i], acc[i + 8]);
    for (int i = 0; i < 4; i++)
        t4[i] = _mm512_add_ps(t8[i], t8[i + 4]);
    _mm512_storeu_ps(out, _mm512_add_ps(_mm512_add_ps(t4[0], t4[2]), _mm512_add_ps(t4[1], t4[3])));
    return 1;
}

/* One row against a few tokens (out[j] for token j); 0 if this type has no fused kernel. */
AVX512 int lm_fused_row_avx512(uint32_t t, const void *row, int64_t k, const act_row *a, int n,
                               float *out, qrow *scratch)
{
    (void)scratch;
    if (t == LM_Q4_0 || t == LM_Q5_0 || t == LM_Q8_0) {
        for (int j = 0; j < n; j += GROUP)
            fused_b32(t, row, k, a + j, n - j < GROUP ? n - j : GROUP, out + j);
        return 1;
    }
    if (t == LM_Q4_K || t == LM_Q5_K || t == LM_Q6_K) {
        for (int j = 0; j < n; j++)
            out[j] = one_k(t, row, k, a + j);
        return 1;
    }
    return 0;
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

/* ----------------------------------------------------------- attention */
#if defined(__x86_64__) && defined(__GNUC__)

/* 16 cache values as f32: from an f32 row, or converted (exactly) from an f16 one. */
AVX512 static inline __m512 kv16(const void *base, size_t off, int f16)
{
    if (f16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + off)));
    return _mm512_loadu_ps((const float *)base + off);
}

/* lm_expf on 16 lanes: the same operations in the same order. */
AVX512 static inline __m512 exp16_avx512(__m512 x)
{
    __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(EXP_LOG2E), _mm512_set1_ps(EXP_SHIFT));
    __m512 n = _mm512_sub_ps(z, _mm512_set1_ps(EXP_SHIFT));
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-EXP_LN2_HI), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-EXP_LN2_LO), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(EXP_C6), r, _mm512_set1_ps(EXP_C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512i sb = _mm512_add_epi32(_mm512_slli_epi32(_mm512_castps_si512(z), 23),
                                  _mm512_set1_epi32(0x3f800000));
    __m512 e = _mm512_mul_ps(p, _mm512_castsi512_ps(sb));
    e = _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_UNDER), _CMP_LT_OQ),
                           _mm512_setzero_ps());
    return _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_OVER), _CMP_GT_OQ),
                              _mm512_set1_ps(__builtin_inff()));
}

/* lm_softmax_exp, 16 keys at a time: lanes are its 16 partial sums. */
AVX512 float lm_softmax_exp_avx512(float *scores, int lo, int hi, float mx)
{
    __m512d lo8 = _mm512_setzero_pd(), hi8 = _mm512_setzero_pd();
    int j = lo;
    for (; j + 16 <= hi + 1; j += 16) {
        __m512 e = exp16_avx512(_mm512_sub_ps(_mm512_loadu_ps(scores + j), _mm512_set1_ps(mx)));
        _mm512_storeu_ps(scores + j, e);
        lo8 = _mm512_add_pd(lo8, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        hi8 = _mm512_add_pd(hi8, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    double part[16];
    _mm512_storeu_pd(part, lo8);
    _mm512_storeu_pd(part + 8, hi8);
    return lm_softmax_finish(scores, lo, j, hi, mx, part);
}

/* Two vectors folded lane-wise: chunks (imm) of a and b, plus the other chunks. */
#define FOLD4(a, b, i1, i2) \
    _mm512_add_ps(_mm512_shuffle_f32x4(a, b, i1), _mm512_shuffle_f32x4(a, b, i2))
#define FOLD1(a, b, i1, i2) _mm512_add_ps(_mm512_shuffle_ps(a, b, i1), _mm512_shuffle_ps(a, b, i2))

/*
 * The 16 horizontal sums of acc[0..15] at once, each by exactly the tree of
 * hsum16_avx512 (halves, quarters, then (0+2) + (1+3)), so a score does not
 * depend on whether its key was reduced alone or in a group.  Lane 4k+l of
 * the result is the sum of acc[4l+k]: callers fill acc in that order.
 */
AVX512 static inline __m512 hsum16x16_avx512(const __m512 acc[16])
{
    __m512 b[8], c[4], d[2];
#pragma GCC unroll 8
    for (int m = 0; m < 8; m++) /* lanes 0-7: acc[2m] halves added; 8-15: acc[2m+1] */
        b[m] = FOLD4(acc[2 * m], acc[2 * m + 1], 0x44, 0xEE);
#pragma GCC unroll 4
    for (int m = 0; m < 4; m++) /* chunk k: quarters of acc[4m+k] added */
        c[m] = FOLD4(b[2 * m], b[2 * m + 1], 0x88, 0xDD);
    for (int m = 0; m < 2; m++) /* chunk k: (0+2, 1+3) of acc[8m+k], then of acc[8m+4+k] */
        d[m] = FOLD1(c[2 * m], c[2 * m + 1], 0x44, 0xEE);
    return FOLD1(d[0], d[1], 0x88, 0xDD);
}

/*
 * The kernels below take the head sizes in 16-float vectors (nq for keys,
 * nv for values) as arguments that are constants where they are inlined:
 * then the accumulators live in registers, not on the stack.
 */
#define INLINE_AVX512 AVX512 __attribute__((always_inline)) static inline

/* Scores of the 16 keys j..j+15 (q . k * scale) into scores[j..j+15]; returns them. */
INLINE_AVX512 __m512 scores16(const __m512 *qv, const void *k0, size_t kstride, int j, int nq,
                            float scale, int f16, float *scores)
{
    __m512 acc[16];
#pragma GCC unroll 16
    for (int s = 0; s < 16; s++) {
        size_t kj = (size_t)(j + 4 * (s % 4) + s / 4) * kstride;
        acc[s] = _mm512_mul_ps(qv[0], kv16(k0, kj, f16));
#pragma GCC unroll 16
        for (int i = 1; i < nq; i++)
            acc[s] = _mm512_fmadd_ps(qv[i], kv16(k0, kj + 16 * (size_t)i, f16), acc[s]);
    }
    __m512 sc = _mm512_mul_ps(hsum16x16_avx512(acc), _mm512_set1_ps(scale));
    _mm512_storeu_ps(scores + j, sc);
    return sc;
}

/* The score of key j alone, by the same steps. */
INLINE_AVX512 float score1(const __m512 *qv, const void *k0, size_t kstride, int j, int nq,
                           float scale, int f16)
{
    size_t kj = (size_t)j * kstride;
    __m512 acc = _mm512_mul_ps(qv[0], kv16(k0, kj, f16));
#pragma GCC unroll 16
    for (int i = 1; i < nq; i++)
        acc = _mm512_fmadd_ps(qv[i], kv16(k0, kj + 16 * (size_t)i, f16), acc);
    return hsum16_avx512(acc) * scale;
}

INLINE_AVX512 void attend(const float *q, const void *k0, size_t kstride, const void *v0,
                          size_t vstride, int lo, int pos, int nq, int nv, float scale, float cap,
                          float *scores, float *out, int f16)
{
    __m512 qv[16], o[16], odd[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) /* (dead stores past nq, nv; quiets -Wmaybe-uninitialized) */
        qv[i] = o[i] = odd[i] = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int i = 0; i < nq; i++)
        qv[i] = _mm512_loadu_ps(q + 16 * i);
    /* the maximum is the same in any order: max_ps(s, m) keeps m when s is
       NaN, as the scalar "s > mx" does, and the sign of a zero maximum does
       not change exp(s - mx) */
    __m512 vmx = _mm512_set1_ps(-__builtin_inff());
    int j16 = lo;
    for (; j16 + 16 <= pos + 1; j16 += 16)
        vmx = _mm512_max_ps(scores16(qv, k0, kstride, j16, nq, scale, f16, scores), vmx);
    /* soft-capped scores take their maximum after the cap, one at a time */
    float mx = cap > 0 ? -__builtin_inff() : _mm512_reduce_max_ps(vmx);
    for (int j = cap > 0 ? lo : j16; j <= pos; j++) {
        float s = j < j16 ? scores[j] : score1(qv, k0, kstride, j, nq, scale, f16);
        if (cap > 0)
            s = cap * tanhf(s / cap);
        scores[j] = s;
        mx = s > mx ? s : mx;
    }
    float inv = lm_softmax_exp_avx512(scores, lo, pos, mx);
    int j = lo;
    for (; j < pos; j += 2) { /* keys lo, lo+2, ... into o; lo+1, lo+3, ... into odd */
        size_t v1 = (size_t)j * vstride, v2 = v1 + vstride;
        __m512 w1 = _mm512_set1_ps(scores[j] * inv), w2 = _mm512_set1_ps(scores[j + 1] * inv);
#pragma GCC unroll 16
        for (int i = 0; i < nv; i++) {
            o[i] = _mm512_fmadd_ps(w1, kv16(v0, v1 + 16 * (size_t)i, f16), o[i]);
            odd[i] = _mm512_fmadd_ps(w2, kv16(v0, v2 + 16 * (size_t)i, f16), odd[i]);
        }
    }
    if (j == pos) {
        __m512 w = _mm512_set1_ps(scores[j] * inv);
#pragma GCC unroll 16
        for (int i = 0; i < nv; i++)
            o[i] = _mm512_fmadd_ps(w, kv16(v0, (size_t)j * vstride + 16 * (size_t)i, f16), o[i]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < nv; i++)
        _mm512_storeu_ps(out + 16 * i, _mm512_add_ps(o[i], odd[i]));
}

/* attend with the cache type made a constant too. */
INLINE_AVX512 void attend_sized(const float *q, const void *k0, size_t kstride, const void *v0,
                                size_t vstride, int lo, int pos, int nq, int nv, float scale,
                                float cap, float *scores, float *out, int f16)
{
    if (f16)
        attend(q, k0, kstride, v0, vstride, lo, pos, nq, nv, scale, cap, scores, out, 1);
    else
        attend(q, k0, kstride, v0, vstride, lo, pos, nq, nv, scale, cap, scores, out, 0);
}

/*
 * One query head against cache rows lo..pos (f32 or f16).  Same steps as
 * the portable lm_attend_head, with the loops vectorized; it is used for
 * every batch shape, so evaluation stays deterministic.  The usual head
 * sizes get their own unrolled copies.
 */
AVX512 int lm_attend_avx512(const float *q, const void *k0, size_t kstride, const void *v0,
                            size_t vstride, int lo, int pos, int hd, int hdv, float scale,
                            float cap, float *scores, float *out, int f16)
{
    if (hd % 16 || hdv % 16 || hd > 256 || hdv > 256)
        return 0;
    if (hd == 64 && hdv == 64)
        attend_sized(q, k0, kstride, v0, vstride, lo, pos, 4, 4, scale, cap, scores, out, f16);
    else if (hd == 128 && hdv == 128)
        attend_sized(q, k0, kstride, v0, vstride, lo, pos, 8, 8, scale, cap, scores, out, f16);
    else if (hd == 256 && hdv == 256)
        attend_sized(q, k0, kstride, v0, vstride, lo, pos, 16, 16, scale, cap, scores, out, f16);
    else
        attend_sized(q, k0, kstride, v0, vstride, lo, pos, hd / 16, hdv / 16, scale, cap, scores,
                     out, f16);
    return 1;
}

#else
float lm_softmax_exp_avx512(float *scores, int lo, int hi, float mx)
{
    return lm_softmax_exp(scores, lo, hi, mx);
}

int lm_attend_avx512(const float *q, const void *k0, size_t kstride, const void *v0,
                     size_t vstride, int lo, int pos, int hd, int hdv, float scale, float cap,
                     float *scores, float *out, int f16)
{
    (void)q, (void)k0, (void)kstride, (void)v0, (void)vstride, (void)lo, (void)pos, (void)hd;
    (void)hdv, (void)scale, (void)cap, (void)scores, (void)out, (void)f16;
    return 0;
}
#endif
