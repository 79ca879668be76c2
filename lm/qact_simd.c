/*
 * lm/qact_simd.c - the AVX-512, AVX2 and NEON forms of lm_quantize_act
 * (qdot.c) for the Q8_0 and Q8_K activations, chosen at run time.  Rounding a batch's
 * activations was a sixth of a small model's prompt time in scalar code.
 * Every value is the scalar code's: the same maxima (NaN never wins), the
 * same products rounded the same way, the same exact integer sums; a test
 * compares the bytes.
 */
#include "internal.h"
#include "simd.h"

#include <math.h>
#include <string.h>

/* One instruction set's steps of lm_quantize_act: a Q8_K super-block, a run of nb <= 16 Q8_0
   blocks from block b0, the code sums. */
typedef struct act_steps {
    void (*quant_k)(const float *x, act_row *r, int64_t b);
    void (*quant_b32)(const float *x, act_row *r, int64_t b0, int nb);
    void (*code_sums)(act_row *r, int64_t k, int off);
} act_steps;

/* lm_quantize_act for weights of type wtype through the steps st; 0 for types it does not take. */
static inline int quantize_with(const act_steps *st, uint32_t wtype, const float *x, void *dst, int64_t k)
{
    int atype = lm_act_type(wtype);
    if (atype != LM_Q8_0 && atype != LM_Q8_K)
        return 0;
    act_row r;
    lm_act_layout(atype, k, &r, dst);
    if (atype == LM_Q8_K)
        for (int64_t b = 0; b < k / 256; b++)
            st->quant_k(x + b * 256, &r, b);
    else
        for (int64_t b = 0; b < k / 32; b += 16)
            st->quant_b32(x + b * 32, &r, b, k / 32 - b < 16 ? (int)(k / 32 - b) : 16);
    st->code_sums(&r, k, lm_code_offset(wtype));
    return 1;
}

#if defined(__x86_64__) && defined(__GNUC__)

/* max(|x|, m) lane by lane, where a NaN x leaves m (as fabsf(x) > m does). */
AVX512 static INLINE __m512 abs_max16(__m512 x, __m512 m)
{
    return _mm512_max_ps(_mm512_abs_ps(x), m);
}

/* code8(nearbyintf(v)) for 16 values: NaN -> 0, clamped to [-128, 127]. */
AVX512 static INLINE __m128i codes16(__m512 v)
{
    v = _mm512_roundscale_ps(v, _MM_FROUND_CUR_DIRECTION);
    v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);
    v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-128.0f)), _mm512_set1_ps(127.0f));
    return _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v));
}

/*
 * Q8_0 blocks b0 .. b0+nb-1 (nb <= 16) at once: their maxima meet in one
 * vector (max does not depend on the order), so the divisions and the f16
 * rounding of the scales (F16C, round to nearest even, as lm_f32_to_f16; a
 * scale is never NaN) go 16 at a time.
 */
AVX512 static void quant_b32(const float *x, act_row *r, int64_t b0, int nb)
{
    __m512 m[16], t[16];
    for (int j = 0; j < 16; j++)
        m[j] = j < nb ? abs_max16(_mm512_loadu_ps(x + 32 * j + 16),
                                  abs_max16(_mm512_loadu_ps(x + 32 * j), _mm512_setzero_ps()))
                      : _mm512_setzero_ps();
    transpose16(m, t);
    __m512 amax = t[0];
    for (int i = 1; i < 16; i++) /* lane j: block j's maximum */
        amax = _mm512_max_ps(t[i], amax);
    __m512 d = _mm512_div_ps(amax, _mm512_set1_ps(127.0f));
    __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_NEQ_OQ),
                                    _mm512_set1_ps(127.0f), amax);
    const __mmask16 live = (__mmask16)((1u << nb) - 1);
    _mm512_mask_storeu_ps(r->d + b0, live, _mm512_cvtph_ps(_mm512_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
    _mm512_mask_storeu_ps(r->s + b0, live, _mm512_setzero_ps());
    float ids[16];
    _mm512_storeu_ps(ids, id);
    for (int j = 0; j < nb; j++) {
        __m512 vid = _mm512_set1_ps(ids[j]);
        int8_t *q = r->qs + (b0 + j) * 32;
        _mm_storeu_si128((__m128i *)q, codes16(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * j), vid)));
        _mm_storeu_si128((__m128i *)(q + 16), codes16(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * j + 16), vid)));
    }
}

/* Q8_K: the scale comes from the first value of largest magnitude, sign and all. */
AVX512 static void quant_k(const float *x, act_row *r, int64_t b)
{
    __m512 m = _mm512_setzero_ps();
    for (int i = 0; i < 256; i += 16)
        m = abs_max16(_mm512_loadu_ps(x + i), m);
    float amax = _mm512_reduce_max_ps(m);
    int8_t *qs = r->qs + b * 256;
    if (amax == 0.0f) {
        memset(qs, 0, 256);
        r->d[b] = 0.0f;
        return;
    }
    float max = 0.0f;
    for (int i = 0; i < 256; i += 16) {
        __mmask16 hit = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + i)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
        if (hit) {
            max = x[i + __builtin_ctz(hit)];
            break;
        }
    }
    float iscale = -127.0f / max;
    __m512 vs = _mm512_set1_ps(iscale);
    for (int i = 0; i < 256; i += 16)
        _mm_storeu_si128((__m128i *)(qs + i), codes16(_mm512_mul_ps(vs, _mm512_loadu_ps(x + i))));
    r->d[b] = 1.0f / iscale;
}

/* The sums of every 16 codes, and -off * (sum of every 4), 64 codes a step. */
AVX512 static void code_sums(act_row *r, int64_t k, int off)
{
    const __m512i ones = _mm512_set1_epi8(1), noff = _mm512_set1_epi32(-off);
    for (int64_t e = 0; e < k; e += 64) {
        __m512i q = e + 64 <= k ? _mm512_loadu_si512(r->qs + e) : _mm512_maskz_loadu_epi8(0xffffffffull, r->qs + e);
        __m512i s4 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, q);
        int32_t s[16];
        _mm512_storeu_si512(s, s4);
        int lanes = e + 64 <= k ? 16 : 8;
        _mm512_mask_storeu_epi32(r->negcorr + e / 4, (__mmask16)((1u << lanes) - 1), _mm512_mullo_epi32(s4, noff));
        for (int g = 0; g < lanes / 4; g++)
            r->sum16[e / 16 + g] = (int16_t)(s[4 * g] + s[4 * g + 1] + s[4 * g + 2] + s[4 * g + 3]);
    }
}

AVX512 int lm_quantize_act_avx512(uint32_t wtype, const float *x, void *dst, int64_t k)
{
    static const act_steps avx512 = {quant_k, quant_b32, code_sums};
    return quantize_with(&avx512, wtype, x, dst, k);
}

/* ---- AVX2 (no AVX-512): the same values, 8 lanes at a time ---- */

/* max(|x|, m) lane by lane, where a NaN x leaves m (as fabsf(x) > m does). */
AVX2 static INLINE __m256 abs_max8(__m256 x, __m256 m)
{
    return _mm256_max_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), x), m);
}

/* The largest lane (no lane is NaN). */
AVX2 static inline float hmax8(__m256 m)
{
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

/* code8(nearbyintf(v)) for 8 values, as int32: NaN -> 0, clamped to [-128, 127]. */
AVX2 static INLINE __m256i codes8(__m256 v)
{
    v = _mm256_round_ps(v, _MM_FROUND_CUR_DIRECTION);
    v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
    v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-128.0f)), _mm256_set1_ps(127.0f));
    return _mm256_cvtps_epi32(v);
}

/* 32 codes of x * scale into q, in order (the packs work per 128-bit half: a permute puts them back). */
AVX2 static INLINE void codes32(const float *x, __m256 scale, int8_t *q)
{
    __m256i c[4];
    for (int i = 0; i < 4; i++)
        c[i] = codes8(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), scale));
    __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, b);
}

/* Q8_0 blocks b0..b0+nb-1: d = max/127 rounded to f16 (F16C, to nearest even, as
   lm_f32_to_f16), codes x * 127/max. */
AVX2 static void quant_b32_avx2(const float *x, act_row *r, int64_t b0, int nb)
{
    for (int64_t b = b0; b < b0 + nb; b++, x += 32) {
        __m256 m = _mm256_setzero_ps();
        for (int i = 0; i < 32; i += 8)
            m = abs_max8(_mm256_loadu_ps(x + i), m);
        float amax = hmax8(m), d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        codes32(x, _mm256_set1_ps(id), r->qs + b * 32);
        r->d[b] = _cvtsh_ss(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
        r->s[b] = 0.0f;
    }
}

/* Q8_K super-block b: the scale from the first value of largest magnitude, sign and all. */
AVX2 static void quant_k_avx2(const float *x, act_row *r, int64_t b)
{
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 256; i += 8)
        m = abs_max8(_mm256_loadu_ps(x + i), m);
    float amax = hmax8(m), max = 0.0f;
    int8_t *qs = r->qs + b * 256;
    if (amax == 0.0f) {
        memset(qs, 0, 256);
        r->d[b] = 0.0f;
        return;
    }
    const __m256 am = _mm256_set1_ps(amax), sign = _mm256_set1_ps(-0.0f);
    for (int i = 0; i < 256; i += 8) {
        int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), am, _CMP_EQ_OQ));
        if (hit) {
            max = x[i + __builtin_ctz((unsigned)hit)];
            break;
        }
    }
    float iscale = -127.0f / max;
    for (int i = 0; i < 256; i += 32)
        codes32(x + i, _mm256_set1_ps(iscale), qs + i);
    r->d[b] = 1.0f / iscale;
}

/* The sums of every 16 codes, and -off * (sum of every 4), 32 codes a step. */
AVX2 static void code_sums_avx2(act_row *r, int64_t k, int off)
{
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1), noff = _mm256_set1_epi32(-off);
    for (int64_t e = 0; e < k; e += 32) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(r->qs + e));
        __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16); /* sums of 4, exact */
        _mm256_storeu_si256((__m256i *)(r->negcorr + e / 4), _mm256_mullo_epi32(s4, noff));
        int32_t s[8];
        _mm256_storeu_si256((__m256i *)s, s4);
        r->sum16[e / 16] = (int16_t)(s[0] + s[1] + s[2] + s[3]);
        r->sum16[e / 16 + 1] = (int16_t)(s[4] + s[5] + s[6] + s[7]);
    }
}

int lm_quantize_act_avx2(uint32_t wtype, const float *x, void *dst, int64_t k)
{
    static const act_steps avx2 = {quant_k_avx2, quant_b32_avx2, code_sums_avx2};
    return quantize_with(&avx2, wtype, x, dst, k);
}

int lm_quantize_act_neon(uint32_t wtype, const float *x, void *dst, int64_t k)
{
    (void)wtype, (void)x, (void)dst, (void)k;
    return 0; /* not built here: the caller rounds with lm_quantize_act */
}

#else

int lm_quantize_act_avx512(uint32_t wtype, const float *x, void *dst, int64_t k)
{
    (void)wtype, (void)x, (void)dst, (void)k;
    return 0; /* not built here: the caller rounds with lm_quantize_act */
}

int lm_quantize_act_avx2(uint32_t wtype, const float *x, void *dst, int64_t k)
{
    (void)wtype, (void)x, (void)dst, (void)k;
    return 0;
}

#if defined(__aarch64__) && defined(__GNUC__)
#include <arm_neon.h>

/* ---- NEON (any aarch64 core): the same values, 4 lanes at a time ---- */

/* max(|x|, m) lane by lane, where a NaN x leaves m (maxnm: the number wins). */
static inline float32x4_t abs_max4(float32x4_t x, float32x4_t m)
{
    return vmaxnmq_f32(vabsq_f32(x), m);
}

/* code8(nearbyintf(x * scale)) for 16 values into q: clamped to [-128, 127], NaN -> 0. */
static inline void codes16_neon(const float *x, float32x4_t scale, int8_t *q)
{
    int16x4_t h[4];
    for (int i = 0; i < 4; i++) {
        float32x4_t v = vrndiq_f32(vmulq_f32(vld1q_f32(x + 4 * i), scale)); /* the current mode, as nearbyintf */
        v = vminq_f32(vmaxq_f32(v, vdupq_n_f32(-128.0f)), vdupq_n_f32(127.0f)); /* a NaN stays NaN */
        h[i] = vqmovn_s32(vcvtq_s32_f32(v)); /* and converts to 0 (FCVTZS), as in code8 */
    }
    vst1q_s8(q, vcombine_s8(vqmovn_s16(vcombine_s16(h[0], h[1])), vqmovn_s16(vcombine_s16(h[2], h[3]))));
}

/* Q8_0 blocks b0..b0+nb-1: d = max/127 rounded to f16 (to nearest even, as lm_f32_to_f16),
   codes x * 127/max. */
static void quant_b32_neon(const float *x, act_row *r, int64_t b0, int nb)
{
    for (int64_t b = b0; b < b0 + nb; b++, x += 32) {
        float32x4_t m = vdupq_n_f32(0.0f);
        for (int i = 0; i < 32; i += 4)
            m = abs_max4(vld1q_f32(x + i), m);
        float amax = vmaxvq_f32(m), d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        codes16_neon(x, vdupq_n_f32(id), r->qs + b * 32);
        codes16_neon(x + 16, vdupq_n_f32(id), r->qs + b * 32 + 16);
        r->d[b] = vgetq_lane_f32(vcvt_f32_f16(vcvt_f16_f32(vdupq_n_f32(d))), 0);
        r->s[b] = 0.0f;
    }
}

/* Q8_K super-block b: the scale from the first value of largest magnitude, sign and all. */
static void quant_k_neon(const float *x, act_row *r, int64_t b)
{
    float32x4_t m = vdupq_n_f32(0.0f);
    for (int i = 0; i < 256; i += 4)
        m = abs_max4(vld1q_f32(x + i), m);
    float amax = vmaxvq_f32(m), max = 0.0f;
    int8_t *qs = r->qs + b * 256;
    if (amax == 0.0f) {
        memset(qs, 0, 256);
        r->d[b] = 0.0f;
        return;
    }
    for (int i = 0; i < 256; i++)
        if (fabsf(x[i]) == amax) {
            max = x[i];
            break;
        }
    float iscale = -127.0f / max;
    for (int i = 0; i < 256; i += 16)
        codes16_neon(x + i, vdupq_n_f32(iscale), qs + i);
    r->d[b] = 1.0f / iscale;
}

/* The sums of every 16 codes, and -off * (sum of every 4), 16 codes a step. */
static void code_sums_neon(act_row *r, int64_t k, int off)
{
    const int32x4_t noff = vdupq_n_s32(-off);
    for (int64_t e = 0; e < k; e += 16) {
        int32x4_t s4 = vpaddlq_s16(vpaddlq_s8(vld1q_s8(r->qs + e))); /* sums of 4, exact */
        vst1q_s32(r->negcorr + e / 4, vmulq_s32(s4, noff));
        r->sum16[e / 16] = (int16_t)vaddvq_s32(s4);
    }
}

int lm_quantize_act_neon(uint32_t wtype, const float *x, void *dst, int64_t k)
{
    static const act_steps neon = {quant_k_neon, quant_b32_neon, code_sums_neon};
    return quantize_with(&neon, wtype, x, dst, k);
}

#else

int lm_quantize_act_neon(uint32_t wtype, const float *x, void *dst, int64_t k)
{
    (void)wtype, (void)x, (void)dst, (void)k;
    return 0;
}

#endif
#endif
