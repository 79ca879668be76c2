/*
 * lm/simd.h - what the x86 kernel files share (qdot_simd.c, qgemm.c,
 * attention_simd.c): the target attributes that let one binary carry
 * AVX2 and AVX-512 code for CPUs chosen at run time, and the one tree by
 * which every path adds 16 float lanes.
 */
#ifndef LM_SIMD_H
#define LM_SIMD_H

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))
#define INLINE __attribute__((always_inline)) inline

AVX512 static INLINE float hsum16_avx512(__m512 acc)
{
    /* the same tree as lm_hsum16: halves, quarters, then (0+2) + (1+3) */
    __m256 t8 = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
    __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
    __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    return _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)));
}

/* The same tree lane by lane over 16 vectors: lane i of the result sums lane i of each. */
AVX512 static INLINE __m512 hsum16_lanes(const __m512 a[16])
{
    __m512 t8[8], t4[4];
    for (int i = 0; i < 8; i++)
        t8[i] = _mm512_add_ps(a[i], a[i + 8]);
    for (int i = 0; i < 4; i++)
        t4[i] = _mm512_add_ps(t8[i], t8[i + 4]);
    return _mm512_add_ps(_mm512_add_ps(t4[0], t4[2]), _mm512_add_ps(t4[1], t4[3]));
}

#endif

#endif
