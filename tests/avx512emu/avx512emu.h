/*
 * tests/avx512emu/avx512emu.h - the AVX-512 intrinsics the kernels use,
 * carried out on a CPU with AVX2 only, for `make check-avx512emu`.
 *
 * The AVX-512 kernels are what most of the machines kvchat is measured
 * on run, and a session on a CPU without AVX-512 could change them (or
 * what they share with the AVX2 ones) without running them.  Built with
 * -DLM_EMULATE_AVX512 and this header forced in front of every file, the
 * engine takes its AVX-512 paths (lm_cpu_isa says so; simd.h drops the
 * AVX-512 target attributes), and each intrinsic runs as SIMDe's portable
 * code or, where SIMDe 0.7 has none, as the lane loop below.  Slow, but
 * every path still has to give the scalar code's bytes.
 *
 * The loops follow Intel's definitions; the ones whose result depends on
 * order or on MXCSR (the float reductions, the conversions) do what GCC's
 * own headers do, on the same instructions at 128 or 256 bits.
 */
#ifndef KVCHAT_AVX512EMU_H
#define KVCHAT_AVX512EMU_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/gfni.h>

/* SIMDe 0.7.4's aliases of these two take the wrong arguments. */
#undef _mm512_madd_epi16
#define _mm512_madd_epi16(a, b) simde_mm512_madd_epi16(a, b)
#undef _mm512_set_epi8
#define _mm512_set_epi8(...) simde_mm512_set_epi8(__VA_ARGS__)

/* SIMDe has these under its own names only. */
#define _mm512_shuffle_f32x4(a, b, imm) simde_mm512_shuffle_f32x4(a, b, imm)
#define _mm512_shuffle_i64x2(a, b, imm) simde_mm512_shuffle_i64x2(a, b, imm)

/* Lanes of a vector as an array, and back. */
#define EMU_LANES(type, n, name, v) \
    type name[n];                   \
    memcpy(name, &(v), sizeof name)
#define EMU_RETURN(vtype, arr) \
    do {                       \
        vtype r_;              \
        memcpy(&r_, arr, sizeof r_); \
        return r_;             \
    } while (0)

static inline __m256 emu_mm512_extractf32x8_ps(__m512 a, int hi)
{
    EMU_LANES(float, 16, x, a);
    __m256 r;
    memcpy(&r, x + 8 * (hi & 1), sizeof r);
    return r;
}
#define _mm512_extractf32x8_ps(a, imm) emu_mm512_extractf32x8_ps(a, imm)

static inline __m512i emu_mm512_zextsi128_si512(__m128i a)
{
    uint8_t x[64] = {0};
    memcpy(x, &a, 16);
    EMU_RETURN(__m512i, x);
}
#define _mm512_zextsi128_si512(a) emu_mm512_zextsi128_si512(a)

/* Within each 128-bit lane, bytes shifted down by n, zeros in. */
static inline __m512i emu_mm512_bsrli_epi128(__m512i a, int n)
{
    EMU_LANES(uint8_t, 64, x, a);
    uint8_t r[64];
    for (int l = 0; l < 4; l++)
        for (int i = 0; i < 16; i++)
            r[16 * l + i] = i + n < 16 ? x[16 * l + i + n] : 0;
    EMU_RETURN(__m512i, r);
}
#define _mm512_bsrli_epi128(a, n) emu_mm512_bsrli_epi128(a, n)

/* pshufd in each 128-bit lane. */
static inline __m512i emu_mm512_shuffle_epi32(__m512i a, int imm)
{
    EMU_LANES(int32_t, 16, x, a);
    int32_t r[16];
    for (int l = 0; l < 4; l++)
        for (int i = 0; i < 4; i++)
            r[4 * l + i] = x[4 * l + ((imm >> (2 * i)) & 3)];
    EMU_RETURN(__m512i, r);
}
#define _mm512_shuffle_epi32(a, imm) emu_mm512_shuffle_epi32(a, (int)(imm))

static inline __m512i emu_mm512_srai_epi32(__m512i a, unsigned n)
{
    EMU_LANES(int32_t, 16, x, a);
    for (int i = 0; i < 16; i++)
        x[i] = n > 31 ? (x[i] < 0 ? -1 : 0) : x[i] >> n;
    EMU_RETURN(__m512i, x);
}
#define _mm512_srai_epi32(a, n) emu_mm512_srai_epi32(a, (unsigned)(n))

/* ---- conversions */

static inline __m128i emu_mm256_cvtepi32_epi16(__m256i a)
{
    EMU_LANES(int32_t, 8, x, a);
    int16_t r[8];
    for (int i = 0; i < 8; i++)
        r[i] = (int16_t)x[i];
    EMU_RETURN(__m128i, r);
}
#define _mm256_cvtepi32_epi16(a) emu_mm256_cvtepi32_epi16(a)

static inline __m256i emu_mm512_cvtepi32_epi16(__m512i a)
{
    EMU_LANES(int32_t, 16, x, a);
    int16_t r[16];
    for (int i = 0; i < 16; i++)
        r[i] = (int16_t)x[i];
    EMU_RETURN(__m256i, r);
}
#define _mm512_cvtepi32_epi16(a) emu_mm512_cvtepi32_epi16(a)

static inline __m128i emu_mm512_cvtepi32_epi8(__m512i a)
{
    EMU_LANES(int32_t, 16, x, a);
    int8_t r[16];
    for (int i = 0; i < 16; i++)
        r[i] = (int8_t)x[i];
    EMU_RETURN(__m128i, r);
}
#define _mm512_cvtepi32_epi8(a) emu_mm512_cvtepi32_epi8(a)

static inline __m512i emu_mm512_cvtepu8_epi16(__m256i a)
{
    EMU_LANES(uint8_t, 32, x, a);
    int16_t r[32];
    for (int i = 0; i < 32; i++)
        r[i] = x[i];
    EMU_RETURN(__m512i, r);
}
#define _mm512_cvtepu8_epi16(a) emu_mm512_cvtepu8_epi16(a)

/* The conversions to and from floats on the 256-bit instructions: the same rounding. */
static inline __m512 emu_mm512_cvtepi32_ps(__m512i a)
{
    EMU_LANES(__m256i, 2, x, a);
    __m256 r[2] = {_mm256_cvtepi32_ps(x[0]), _mm256_cvtepi32_ps(x[1])};
    EMU_RETURN(__m512, r);
}
#define _mm512_cvtepi32_ps(a) emu_mm512_cvtepi32_ps(a)

static inline __m512i emu_mm512_cvtps_epi32(__m512 a)
{
    EMU_LANES(__m256, 2, x, a);
    __m256i r[2] = {_mm256_cvtps_epi32(x[0]), _mm256_cvtps_epi32(x[1])};
    EMU_RETURN(__m512i, r);
}
#define _mm512_cvtps_epi32(a) emu_mm512_cvtps_epi32(a)

static inline __m512d emu_mm512_cvtps_pd(__m256 a)
{
    EMU_LANES(__m128, 2, x, a);
    __m256d r[2] = {_mm256_cvtps_pd(x[0]), _mm256_cvtps_pd(x[1])};
    EMU_RETURN(__m512d, r);
}
#define _mm512_cvtps_pd(a) emu_mm512_cvtps_pd(a)

static inline __m512 emu_mm512_cvtph_ps(__m256i a)
{
    EMU_LANES(__m128i, 2, x, a);
    __m256 r[2] = {_mm256_cvtph_ps(x[0]), _mm256_cvtph_ps(x[1])};
    EMU_RETURN(__m512, r);
}
#define _mm512_cvtph_ps(a) emu_mm512_cvtph_ps(a)

#define _mm512_cvtps_ph(a, imm)                                                            \
    __extension__({                                                                        \
        __m256 x_[2];                                                                      \
        __m512 a_ = (a);                                                                   \
        memcpy(x_, &a_, sizeof x_);                                                        \
        __m128i r_[2] = {_mm256_cvtps_ph(x_[0], (imm)), _mm256_cvtps_ph(x_[1], (imm))};    \
        __m256i v_;                                                                        \
        memcpy(&v_, r_, sizeof v_);                                                        \
        v_;                                                                                \
    })

/* ---- masked arithmetic (the multiply-adds fused, as the instructions are) */

static inline __m512 emu_mm512_mask3_fmadd_ps(__m512 a, __m512 b, __m512 c, __mmask16 k)
{
    EMU_LANES(float, 16, x, a);
    EMU_LANES(float, 16, y, b);
    EMU_LANES(float, 16, z, c);
    for (int i = 0; i < 16; i++)
        if (k >> i & 1)
            z[i] = __builtin_fmaf(x[i], y[i], z[i]);
    EMU_RETURN(__m512, z);
}
#define _mm512_mask3_fmadd_ps(a, b, c, k) emu_mm512_mask3_fmadd_ps(a, b, c, k)

static inline __m256 emu_mm256_mask3_fmadd_ps(__m256 a, __m256 b, __m256 c, __mmask8 k)
{
    EMU_LANES(float, 8, x, a);
    EMU_LANES(float, 8, y, b);
    EMU_LANES(float, 8, z, c);
    for (int i = 0; i < 8; i++)
        if (k >> i & 1)
            z[i] = __builtin_fmaf(x[i], y[i], z[i]);
    EMU_RETURN(__m256, z);
}
#define _mm256_mask3_fmadd_ps(a, b, c, k) emu_mm256_mask3_fmadd_ps(a, b, c, k)

static inline __m256 emu_mm256_mask_add_ps(__m256 src, __mmask8 k, __m256 a, __m256 b)
{
    EMU_LANES(float, 8, s, src);
    EMU_LANES(float, 8, x, a);
    EMU_LANES(float, 8, y, b);
    for (int i = 0; i < 8; i++)
        if (k >> i & 1)
            s[i] = x[i] + y[i];
    EMU_RETURN(__m256, s);
}
#define _mm256_mask_add_ps(src, k, a, b) emu_mm256_mask_add_ps(src, k, a, b)

/* ---- reductions: GCC's trees (avx512fintrin.h) */

static inline int emu_mm512_reduce_add_epi32(__m512i a)
{
    EMU_LANES(int32_t, 16, x, a);
    uint32_t s = 0;
    for (int i = 0; i < 16; i++)
        s += (uint32_t)x[i];
    return (int)s;
}
#define _mm512_reduce_add_epi32(a) emu_mm512_reduce_add_epi32(a)

static inline float emu_mm512_reduce_max_ps(__m512 a)
{
    EMU_LANES(__m256, 2, h, a);
    __m256 t = _mm256_max_ps(h[1], h[0]);
    __m128 q = _mm_max_ps(_mm256_extractf128_ps(t, 1), _mm256_castps256_ps128(t));
    q = _mm_max_ps(q, _mm_shuffle_ps(q, q, _MM_SHUFFLE(1, 0, 3, 2)));
    q = _mm_max_ps(q, _mm_shuffle_ps(q, q, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtss_f32(q);
}
#define _mm512_reduce_max_ps(a) emu_mm512_reduce_max_ps(a)

/* ---- masked loads and stores: lanes outside the mask are never touched */

#define EMU_MASKZ_LOAD(name, vtype, ltype, n, mtype)        \
    static inline vtype name(mtype k, const void *p)        \
    {                                                       \
        ltype r[n] = {0};                                   \
        for (int i = 0; i < n; i++)                         \
            if (k >> i & 1)                                 \
                memcpy(&r[i], (const char *)p + i * sizeof(ltype), sizeof(ltype)); \
        EMU_RETURN(vtype, r);                               \
    }
EMU_MASKZ_LOAD(emu_mm512_maskz_loadu_epi8, __m512i, int8_t, 64, __mmask64)
EMU_MASKZ_LOAD(emu_mm512_maskz_loadu_epi16, __m512i, int16_t, 32, __mmask32)
EMU_MASKZ_LOAD(emu_mm512_maskz_loadu_epi32, __m512i, int32_t, 16, __mmask16)
EMU_MASKZ_LOAD(emu_mm512_maskz_loadu_ps, __m512, float, 16, __mmask16)
EMU_MASKZ_LOAD(emu_mm256_maskz_loadu_epi16, __m256i, int16_t, 16, __mmask16)
EMU_MASKZ_LOAD(emu_mm_maskz_loadu_ps, __m128, float, 4, __mmask8)
#define _mm512_maskz_loadu_epi8(k, p) emu_mm512_maskz_loadu_epi8(k, p)
#define _mm512_maskz_loadu_epi16(k, p) emu_mm512_maskz_loadu_epi16(k, p)
#define _mm512_maskz_loadu_epi32(k, p) emu_mm512_maskz_loadu_epi32(k, p)
#define _mm512_maskz_loadu_ps(k, p) emu_mm512_maskz_loadu_ps(k, p)
#define _mm256_maskz_loadu_epi16(k, p) emu_mm256_maskz_loadu_epi16(k, p)
#define _mm_maskz_loadu_ps(k, p) emu_mm_maskz_loadu_ps(k, p)

#define EMU_MASK_STORE(name, vtype, ltype, n, mtype)        \
    static inline void name(void *p, mtype k, vtype v)      \
    {                                                       \
        EMU_LANES(ltype, n, x, v);                          \
        for (int i = 0; i < n; i++)                         \
            if (k >> i & 1)                                 \
                memcpy((char *)p + i * sizeof(ltype), &x[i], sizeof(ltype)); \
    }
EMU_MASK_STORE(emu_mm512_mask_storeu_epi8, __m512i, int8_t, 64, __mmask64)
EMU_MASK_STORE(emu_mm512_mask_storeu_epi32, __m512i, int32_t, 16, __mmask16)
EMU_MASK_STORE(emu_mm512_mask_storeu_ps, __m512, float, 16, __mmask16)
#define _mm512_mask_storeu_epi8(p, k, v) emu_mm512_mask_storeu_epi8(p, k, v)
#define _mm512_mask_storeu_epi32(p, k, v) emu_mm512_mask_storeu_epi32(p, k, v)
#define _mm512_mask_storeu_ps(p, k, v) emu_mm512_mask_storeu_ps(p, k, v)

/* ---- gathers of 32-bit values at base + index * scale */

static inline __m512i emu_mm512_mask_i32gather_epi32(__m512i src, __mmask16 k, __m512i at, const void *base, int scale)
{
    EMU_LANES(int32_t, 16, r, src);
    EMU_LANES(int32_t, 16, idx, at);
    for (int i = 0; i < 16; i++)
        if (k >> i & 1)
            memcpy(&r[i], (const char *)base + (int64_t)idx[i] * scale, 4);
    EMU_RETURN(__m512i, r);
}
#define _mm512_mask_i32gather_epi32(src, k, at, base, scale) emu_mm512_mask_i32gather_epi32(src, k, at, base, scale)

static inline __m128i emu_mm_mmask_i32gather_epi32(__m128i src, __mmask8 k, __m128i at, const void *base, int scale)
{
    EMU_LANES(int32_t, 4, r, src);
    EMU_LANES(int32_t, 4, idx, at);
    for (int i = 0; i < 4; i++)
        if (k >> i & 1)
            memcpy(&r[i], (const char *)base + (int64_t)idx[i] * scale, 4);
    EMU_RETURN(__m128i, r);
}
#define _mm_mmask_i32gather_epi32(src, k, at, base, scale) emu_mm_mmask_i32gather_epi32(src, k, at, base, scale)

#endif
