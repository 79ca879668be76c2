/*
 * lm/qdot_simd.c - the x86 fast paths of qdot.c, chosen at run time.
 * Every function here computes exactly what its scalar twin computes (same
 * integer sums, same fused multiply-adds in the same lanes, same final tree),
 * so switching paths never changes a bit of the logits; tests compare them.
 *   decoders  AVX2: nibble and bit unpacking of Q4_0, Q5_0, Q8_0, Q4_K,
 *             Q5_K and Q6_K rows into unsigned codes;
 *   dots      AVX-512 VNNI: vpdpbusd over 64 codes, seeded with the offset
 *             correction, scaled and accumulated in 16 float lanes.
 * Other architectures and older x86 CPUs use the scalar paths.
 */
#include "internal.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

int lm_cpu_isa(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
        return LM_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
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
    float a[16];
    _mm512_storeu_ps(a, acc);
    return lm_hsum16(a);
}

AVX512 float lm_dot_b32_avx512(const qrow *w, const act_row *a)
{
    const int64_t nb = w->k / 32;
    const int has_min = w->type == LM_Q4_1 || w->type == LM_Q5_1;
    __m512 acc = _mm512_setzero_ps();
    float mins = 0.0f;
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        __m512i v = _mm512_dpbusd_epi32(_mm512_loadu_si512(a->negcorr + b * 8),
                                        _mm512_loadu_si512(w->u + b * 32),
                                        _mm512_loadu_si512(a->qs + b * 32));
        __m512 dd = _mm512_insertf32x8(_mm512_set1_ps(w->d[b] * a->d[b]),
                                       _mm256_set1_ps(w->d[b + 1] * a->d[b + 1]), 1);
        acc = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(v), acc);
        if (has_min) {
            mins = __builtin_fmaf(w->m[b], a->s[b], mins);
            mins = __builtin_fmaf(w->m[b + 1], a->s[b + 1], mins);
        }
    }
    if (b < nb) { /* an odd last block lands in lanes 0-7 */
        __m256i v = _mm256_dpbusd_epi32(_mm256_loadu_si256((const __m256i *)(a->negcorr + b * 8)),
                                        _mm256_loadu_si256((const __m256i *)(w->u + b * 32)),
                                        _mm256_loadu_si256((const __m256i *)(a->qs + b * 32)));
        __m256 lo = _mm256_fmadd_ps(_mm256_set1_ps(w->d[b] * a->d[b]), _mm256_cvtepi32_ps(v),
                                    _mm512_castps512_ps256(acc));
        acc = _mm512_insertf32x8(acc, lo, 0);
        if (has_min)
            mins = __builtin_fmaf(w->m[b], a->s[b], mins);
    }
    return hsum16_avx512(acc) + mins;
}

AVX512 float lm_dot_k_avx512(const qrow *w, const act_row *a)
{
    __m512 acc = _mm512_setzero_ps();
    float mins = 0.0f;
    for (int64_t b = 0; b < w->k / 256; b++) {
        __m512i sum = _mm512_setzero_si512();
        for (int z = 0; z < 4; z++) {
            int64_t e = b * 256 + 64 * z;
            __m512i v = _mm512_dpbusd_epi32(_mm512_loadu_si512(a->negcorr + e / 4),
                                            _mm512_loadu_si512(w->u + e), _mm512_loadu_si512(a->qs + e));
            sum = _mm512_add_epi32(sum, _mm512_mullo_epi32(_mm512_loadu_si512(w->sc4 + e / 4), v));
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(w->d[b] * a->d[b]), _mm512_cvtepi32_ps(sum), acc);
        mins += lm_k_mins(w, a, b);
    }
    return hsum16_avx512(acc) - mins;
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
