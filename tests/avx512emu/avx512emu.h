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
 * code or, where SIMDe 0.7 has none, as the lane loop below; so do the
 * AMX tile instructions (KVCHAT_EMULATE=spr).  Slow, but every path still
 * has to give the scalar code's bytes.
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

/* Each lane converted by a C cast (narrowing keeps the low bits, as the instructions do). */
#define EMU_CAST(name, vin, tin, vout, tout, n) \
    static inline vout name(vin a)              \
    {                                           \
        EMU_LANES(tin, n, x, a);                \
        tout r[n];                              \
        for (int i = 0; i < n; i++)             \
            r[i] = (tout)x[i];                  \
        EMU_RETURN(vout, r);                    \
    }
EMU_CAST(emu_mm256_cvtepi32_epi16, __m256i, int32_t, __m128i, int16_t, 8)
EMU_CAST(emu_mm512_cvtepi32_epi16, __m512i, int32_t, __m256i, int16_t, 16)
EMU_CAST(emu_mm512_cvtepi32_epi8, __m512i, int32_t, __m128i, int8_t, 16)
EMU_CAST(emu_mm512_cvtepu8_epi16, __m256i, uint8_t, __m512i, int16_t, 32)
EMU_CAST(emu_mm512_cvtepu16_epi32, __m256i, uint16_t, __m512i, int32_t, 16)
#define _mm256_cvtepi32_epi16(a) emu_mm256_cvtepi32_epi16(a)
#define _mm512_cvtepu16_epi32(a) emu_mm512_cvtepu16_epi32(a)
#define _mm512_cvtepi32_epi16(a) emu_mm512_cvtepi32_epi16(a)
#define _mm512_cvtepi32_epi8(a) emu_mm512_cvtepi32_epi8(a)
#define _mm512_cvtepu8_epi16(a) emu_mm512_cvtepu8_epi16(a)

/* The conversions to and from floats on the 256-bit instructions, half by half: the same rounding. */
#define EMU_HALVES(name, vin, hin, vout, hout, op) \
    static inline vout name(vin a)                 \
    {                                              \
        EMU_LANES(hin, 2, x, a);                   \
        hout r[2] = {op(x[0]), op(x[1])};          \
        EMU_RETURN(vout, r);                       \
    }
EMU_HALVES(emu_mm512_cvtepi32_ps, __m512i, __m256i, __m512, __m256, _mm256_cvtepi32_ps)
EMU_HALVES(emu_mm512_cvtps_epi32, __m512, __m256, __m512i, __m256i, _mm256_cvtps_epi32)
EMU_HALVES(emu_mm512_cvtps_pd, __m256, __m128, __m512d, __m256d, _mm256_cvtps_pd)
EMU_HALVES(emu_mm512_cvtph_ps, __m256i, __m128i, __m512, __m256, _mm256_cvtph_ps)
#define _mm512_cvtepi32_ps(a) emu_mm512_cvtepi32_ps(a)
#define _mm512_cvtps_epi32(a) emu_mm512_cvtps_epi32(a)
#define _mm512_cvtps_pd(a) emu_mm512_cvtps_pd(a)
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

/* Lanes where k is set: dst = expr of x, y, z (the lanes of a, b, c); the others keep dst. */
#define EMU_MASKED(name, v, n, mtype, dst, expr)                        \
    static inline v name(v a, v b, v c, mtype k)                        \
    {                                                                   \
        EMU_LANES(float, n, x, a);                                      \
        EMU_LANES(float, n, y, b);                                      \
        EMU_LANES(float, n, z, c);                                      \
        for (int i = 0; i < n; i++)                                     \
            if (k >> i & 1)                                             \
                dst[i] = expr;                                          \
        EMU_RETURN(v, dst);                                             \
    }
EMU_MASKED(emu_mm512_mask3_fmadd_ps, __m512, 16, __mmask16, z, __builtin_fmaf(x[i], y[i], z[i]))
EMU_MASKED(emu_mm256_mask3_fmadd_ps, __m256, 8, __mmask8, z, __builtin_fmaf(x[i], y[i], z[i]))
EMU_MASKED(emu_mm256_mask_add_ps, __m256, 8, __mmask8, x, y[i] + z[i]) /* x: src, y + z: a + b */
#define _mm512_mask3_fmadd_ps(a, b, c, k) emu_mm512_mask3_fmadd_ps(a, b, c, k)
#define _mm256_mask3_fmadd_ps(a, b, c, k) emu_mm256_mask3_fmadd_ps(a, b, c, k)
#define _mm256_mask_add_ps(src, k, a, b) emu_mm256_mask_add_ps(src, a, b, k)

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

#define EMU_GATHER(name, v, n, mtype)                                                   \
    static inline v name(v src, mtype k, v at, const void *base, int scale)            \
    {                                                                                   \
        EMU_LANES(int32_t, n, r, src);                                                  \
        EMU_LANES(int32_t, n, idx, at);                                                 \
        for (int i = 0; i < n; i++)                                                     \
            if (k >> i & 1)                                                             \
                memcpy(&r[i], (const char *)base + (int64_t)idx[i] * scale, 4);         \
        EMU_RETURN(v, r);                                                               \
    }
EMU_GATHER(emu_mm512_mask_i32gather_epi32, __m512i, 16, __mmask16)
EMU_GATHER(emu_mm_mmask_i32gather_epi32, __m128i, 4, __mmask8)
#define _mm512_mask_i32gather_epi32(src, k, at, base, scale) emu_mm512_mask_i32gather_epi32(src, k, at, base, scale)
#define _mm_mmask_i32gather_epi32(src, k, at, base, scale) emu_mm_mmask_i32gather_epi32(src, k, at, base, scale)

/*
 * ---- AMX tiles (KVCHAT_EMULATE=spr: a Sapphire Rapids).  Each thread has
 * its own eight tiles, as each has its own tile registers, shaped by the
 * last configuration it loaded (_tile_loadconfig, given the 64 bytes of
 * LDTILECFG); the tiles' rows past their shape are never read.  The tile
 * numbers are arguments here, where the instructions take immediates.
 */
typedef struct emu_tile {
    int rows, colsb;
    uint8_t data[16][64];
} emu_tile;

static __thread emu_tile emu_tiles[8] __attribute__((unused));

static inline void emu_tile_loadconfig(const void *cfg)
{
    const uint8_t *c = cfg;
    for (int t = 0; t < 8; t++) {
        uint16_t colsb;
        memcpy(&colsb, c + 16 + 2 * t, 2);
        emu_tiles[t].colsb = colsb, emu_tiles[t].rows = c[48 + t];
        memset(emu_tiles[t].data, 0, sizeof emu_tiles[t].data);
    }
}

static inline void emu_tile_loadd(int t, const void *base, long stride)
{
    for (int r = 0; r < emu_tiles[t].rows; r++)
        memcpy(emu_tiles[t].data[r], (const char *)base + r * stride, (size_t)emu_tiles[t].colsb);
}

static inline void emu_tile_stored(int t, void *base, long stride)
{
    for (int r = 0; r < emu_tiles[t].rows; r++)
        memcpy((char *)base + r * stride, emu_tiles[t].data[r], (size_t)emu_tiles[t].colsb);
}

static inline void emu_tile_zero(int t)
{
    memset(emu_tiles[t].data, 0, sizeof emu_tiles[t].data);
}

/* TDPBSSD: C[m][n] += the four signed byte products of A[m] dword k and B[k] dword n, over k. */
static inline void emu_tile_dpbssd(int c, int a, int b)
{
    const emu_tile *A = &emu_tiles[a], *B = &emu_tiles[b];
    emu_tile *C = &emu_tiles[c];
    for (int m = 0; m < C->rows; m++)
        for (int n = 0; n < C->colsb / 4; n++) {
            uint32_t acc; /* (wrapping, as the instruction's adds) */
            memcpy(&acc, C->data[m] + 4 * n, 4);
            for (int k = 0; k < A->colsb / 4; k++)
                for (int i = 0; i < 4; i++)
                    acc += (uint32_t)((int32_t)(int8_t)A->data[m][4 * k + i] * (int8_t)B->data[k][4 * n + i]);
            memcpy(C->data[m] + 4 * n, &acc, 4);
        }
}

#undef _tile_loadconfig
#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbssd
#undef _tile_release
#define _tile_loadconfig(cfg) emu_tile_loadconfig(cfg)
#define _tile_loadd(t, base, stride) emu_tile_loadd(t, base, stride)
#define _tile_stored(t, base, stride) emu_tile_stored(t, base, stride)
#define _tile_zero(t) emu_tile_zero(t)
#define _tile_dpbssd(c, a, b) emu_tile_dpbssd(c, a, b)
#define _tile_release() ((void)0)

#endif
