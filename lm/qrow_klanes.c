/*
 * lm/qrow_klanes.c - Q4_K and Q6_K rows in their lanes layouts (repack.c)
 * through one token or a few (qrow_k.c decodes them for the batch paths).
 *
 * As the file has them, a 32-bit lane of the multiply-add holds 4 codes of
 * one group and a group spans several lanes, so a super-block's products
 * must meet their scales and be added across the vector before its float
 * step, and that costs a one-token kernel more than the products.  In the
 * lanes layouts, lane 4b + g of every code vector of a step holds 4 codes
 * of one group of super-block b: a lane adds up a group by itself over the
 * step's chunks, the step's sums meet their scales in a few multiplies,
 * and each super-block's total comes out of a two-level tree within its
 * 128-bit lane, which is where the float steps (lm_dot_k_scalar's, block b
 * in lane b % 4) want it.  The token's codes are laid out to match
 * (lm_act_klanes).  Integer sums are exact, so the result is bitwise the
 * file's.  Rows are whole steps (repack.c's layout_for).
 *
 * What it gives (Zen 4, two threads, tinyllama Q4_K_M, alternated with
 * the file's layout): prompts of 2-23 tokens 2-25% faster (up to 23 go
 * row by row, matmul.c's is_grouped), 24-512 level; generation level in
 * t/s at 35 GB/s, and 77-80% of what the machine reads in its fast spells
 * against 70-75%.
 *
 * Only for CPUs with AVX-512 VNNI, VBMI and GFNI (Ice Lake, Zen 4 on),
 * where the layouts are used (lm_klanes_layout_native).
 */
#include "internal.h"
#include "simd.h"

#include <string.h>

#define KLANES_TOKENS 2 /* tokens a pass: with 3 or 4, Q4_K's constants spilled */

/* Each of the pass's n tokens, the loop unrolled: left to GCC, a pair's sums went through the stack (ROWS_KLANES) */
#define EACH_TOKEN(j) _Pragma("GCC unroll 2") for (int j = 0; j < n; j++)
_Static_assert(KLANES_TOKENS == 2, "EACH_TOKEN unrolls KLANES_TOKENS times");

/*
 * The token's codes in the order of rearranged rows, in qw, and what each
 * lane adds to its sums, in ncw (k/4 bytes a row at most).  Q4_K: per
 * step of 1024, chunk c's 64 codes for the low nibbles (lane 4b + g: codes
 * 4c..4c+3 of group g of super-block b) at 128c, those for the high
 * nibbles (group g + 4) at 128c + 64; in ncw, lane 4b + g: the sums of
 * groups g and g + 4 (for the mins) as two words.  Q6_K: per step, set s
 * (groups 4s..4s+3) and slice j (codes 4j..4j+3 of each group of 16) at
 * 256j + 64s; in ncw, per set, -32 times each group's sum (the codes'
 * offset), the seed of the lane's sum.
 */
static void act_q4_k(act_row *a)
{
    for (int64_t s = 0; s < a->k / 1024; s++) {
        const int8_t *in = a->qs + 1024 * s;
        int8_t *q = a->qw + 1024 * s;
        int16_t *sums = (int16_t *)(a->ncw + 16 * s);
        for (int lane = 0; lane < 16; lane++) {
            const int b = lane / 4, g = lane % 4;
            for (int c = 0; c < 8; c++) {
                memcpy(q + 128 * c + 4 * lane, in + 256 * b + 32 * g + 4 * c, 4);
                memcpy(q + 128 * c + 64 + 4 * lane, in + 256 * b + 32 * (g + 4) + 4 * c, 4);
            }
            const int16_t *s16 = a->sum16 + 64 * s + 16 * b;
            sums[2 * lane] = (int16_t)(s16[2 * g] + s16[2 * g + 1]);
            sums[2 * lane + 1] = (int16_t)(s16[2 * g + 8] + s16[2 * g + 9]);
        }
    }
}

static void act_q6_k(act_row *a)
{
    for (int64_t s = 0; s < a->k / 1024; s++) {
        const int8_t *in = a->qs + 1024 * s;
        int8_t *q = a->qw + 1024 * s;
        int32_t *seed = a->ncw + 64 * s;
        for (int set = 0; set < 4; set++)
            for (int lane = 0; lane < 16; lane++) {
                const int b = lane / 4, group = 4 * set + lane % 4;
                for (int j = 0; j < 4; j++)
                    memcpy(q + 256 * j + 64 * set + 4 * lane, in + 256 * b + 16 * group + 4 * j, 4);
                seed[16 * set + lane] = -32 * a->sum16[64 * s + 16 * b + group];
            }
    }
}

void lm_act_klanes(act_row *a, uint32_t tag)
{
    if (tag == LM_Q6_K_LANES)
        act_q6_k(a);
    else
        act_q4_k(a);
    a->klanes = (int)tag;
}

#if defined(__x86_64__) && defined(__GNUC__)

#define KL X86_TARGET("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx512vbmi,gfni")

/* Each byte's high nibble: one affine map over GF(2) (bit i takes bit i + 4) */
KL static INLINE __m512i high_nibbles(__m512i x)
{
    return _mm512_gf2p8affine_epi64_epi8(x, _mm512_set1_epi64(0x1020408000000000ll), 0);
}

/* A 128-bit lane's byte shuffle, the same in every lane */
KL static INLINE __m512i lane_shuffle(__m512i x, __m128i idx)
{
    return _mm512_shuffle_epi8(x, _mm512_broadcast_i32x4(idx));
}

/*
 * A 64-byte load of a step's, and its line asked for by lm_prefetch_ahead
 * (and for one token, LM_AHEAD_NEAR on into L1 if asked: tinyllama
 * Q4_K_M generating, Xeon with AMX, three rounds, 48.3-48.4 -> 50.3-50.5
 * t/s): a step's lines asked for one a load, as a burst of them a
 * step stalls the loads behind it from memory (tinyllama Q4_K_M
 * generating at 35 GB/s, its ffn_down also in the layout: 82-85% of what
 * the machine read with the burst, 89-92% spread; 6 KiB ahead against 8
 * and 12 with only whole steps in the layout: 95% against 93-94).
 */
KL static INLINE __m512i load_ahead(const uint8_t *p, int n, size_t ahead)
{
    lm_prefetch_ahead(p, 64, n, ahead);
    return load_once512(p);
}

/* The token's super-block scales d of the step's 4 super-blocks, each in its 128-bit lane. */
KL static INLINE __m512 step_act_scales(const act_row *a, int64_t s)
{
    return _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                                 _mm512_castps128_ps512(_mm_loadu_ps(a->d + 4 * s)));
}

/*
 * A step of a rearranged Q4_K row (repack.c) for n tokens: the lanes add
 * up 16 codes of their groups a chunk pair (|sum| <= 16 * 15 * 127 fits the
 * word its scale meets), so the step meets its scales in four word
 * multiply-adds, and its mins in one.  acc[j]: lane 4b the sums, 4b + 2 the
 * mins of the super-blocks b mod 4.
 */
KL static INLINE void q4_k_step(const uint8_t *st, const act_row *a, int n, int64_t s, __m512 *acc)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i x = load_ahead(st, n, a->ahead), s8 = six_bit_scales(x);
    __m512i A[KLANES_TOKENS][4]; /* low nibbles' codes 0-15 of each group, high's, low's 16-31, high's */
    EACH_TOKEN(j)
        A[j][0] = A[j][1] = A[j][2] = A[j][3] = _mm512_setzero_si512();
    _Pragma("GCC unroll 8")
    for (int c = 0; c < 8; c++) {
        const __m512i w = load_ahead(st + 64 + 64 * c, n, a->ahead);
        const __m512i lo = _mm512_and_si512(w, m4), hi = high_nibbles(w);
        const int z = 2 * (c / 4);
        EACH_TOKEN(j) {
            const int8_t *q = a[j].qw + 1024 * s + 128 * c;
            A[j][z] = _mm512_dpbusd_epi32(A[j][z], lo, _mm512_loadu_si512(q));
            A[j][z + 1] = _mm512_dpbusd_epi32(A[j][z + 1], hi, _mm512_loadu_si512(q + 64));
        }
    }
    /* lane 4b + g: scale g of super-block b (S0), g + 4 (S1), in the low word; mins g and g + 4 as words */
    const __m512i S0 = lane_shuffle(s8, _mm_setr_epi8(0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1));
    const __m512i S1 = lane_shuffle(s8, _mm_setr_epi8(4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7, -1, -1, -1));
    const __m512i Mw = lane_shuffle(s8, _mm_setr_epi8(8, -1, 12, -1, 9, -1, 13, -1, 10, -1, 14, -1, 11, -1, 15, -1));
    /* d, d, dmin, dmin of super-block b in lanes 4b..4b+3 */
    const __m512i dd_idx = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                            25, 25, 24, 24, 17, 17, 16, 16, 9, 9, 8, 8, 1, 1, 0, 0);
    const __m512 dd = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(dd_idx, x)));
    EACH_TOKEN(j) {
        __m512i T = _mm512_dpwssd_epi32(_mm512_setzero_si512(), A[j][0], S0);
        __m512i U = _mm512_dpwssd_epi32(_mm512_setzero_si512(), A[j][1], S1);
        T = _mm512_add_epi32(_mm512_dpwssd_epi32(T, A[j][2], S0), _mm512_dpwssd_epi32(U, A[j][3], S1));
        __m512i M = _mm512_madd_epi16(Mw, _mm512_loadu_si512(a[j].ncw + 16 * s));
        T = _mm512_add_epi32(T, _mm512_shuffle_epi32(T, 0x4e));
        M = _mm512_add_epi32(M, _mm512_shuffle_epi32(M, 0x4e));
        __m512i X = _mm512_mask_blend_epi32(0xcccc, T, M); /* per 128-bit lane: sums, sums, mins, mins */
        X = _mm512_add_epi32(X, _mm512_shuffle_epi32(X, 0xb1));
        const __m512 f = _mm512_cvtepi32_ps(X), p = _mm512_mul_ps(dd, step_act_scales(&a[j], s));
        acc[j] = _mm512_mask3_fmadd_ps(p, f, acc[j], 0x1111); /* lm_dot_k_scalar's float steps */
        acc[j] = _mm512_mask_add_ps(acc[j], 0x4444, acc[j], _mm512_mul_ps(p, f));
    }
}

/* Bytes x (< 72) of a Q6_K step's 72 bytes of scales and factors, from its two loads (at 768 and 776). */
#define K6_AT(x) ((x) < 64 ? (x) : 56 + (x))

/* A Q6_K lanes step's header bytes 0-63 in order, at768 its 64 bytes at step + 768 (the first ones lie before the codes). */
KL static INLINE __m512i q6_k_lanes_header64(const uint8_t *step, __m512i at768)
{
    const size_t h = lm_q6_k_lanes_codes(step);
    return _mm512_mask_blend_epi8(~0ull >> (63 - h) >> 1, at768, _mm512_loadu_si512(step));
}

/*
 * A step of a rearranged Q6_K row for n tokens: each lane adds up the 16
 * codes of one group, seeded with -32 times the token's sum over them, so
 * the sum is the signed codes' (|sum| <= 16 * 32 * 127, more than a word:
 * the scales meet it in 32-bit multiplies, one a set of 16 groups).
 */
KL static INLINE void q6_k_step(const uint8_t *step, const act_row *a, int n, int64_t s, __m512 *acc)
{
    const uint8_t *st = step + lm_q6_k_lanes_codes(step); /* the codes, after the header's first bytes */
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    __m512i A[KLANES_TOKENS][4]; /* set s: groups 4s..4s+3 of each super-block */
    EACH_TOKEN(j)
        _Pragma("GCC unroll 4")
        for (int set = 0; set < 4; set++)
            A[j][set] = _mm512_loadu_si512(a[j].ncw + 64 * s + 16 * set);
    _Pragma("GCC unroll 4")
    for (int sl = 0; sl < 4; sl++) {
        const __m512i qh = load_ahead(st + lm_q6_k_lanes_top(sl), n, a->ahead);
        const __m512i top[4] = {_mm512_slli_epi16(qh, 4), _mm512_slli_epi16(qh, 2), qh, _mm512_srli_epi16(qh, 2)};
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; h++) {
            const __m512i w = load_ahead(st + lm_q6_k_lanes_low(sl, h), n, a->ahead);
            const __m512i v0 = _mm512_ternarylogic_epi32(_mm512_and_si512(w, m4), top[2 * h], m30, 0xf8);
            const __m512i v1 = _mm512_ternarylogic_epi32(high_nibbles(w), top[2 * h + 1], m30, 0xf8);
            EACH_TOKEN(j) {
                const int8_t *q = a[j].qw + 1024 * s + 256 * sl + 128 * h;
                A[j][2 * h] = _mm512_dpbusd_epi32(A[j][2 * h], v0, _mm512_loadu_si512(q));
                A[j][2 * h + 1] = _mm512_dpbusd_epi32(A[j][2 * h + 1], v1, _mm512_loadu_si512(q + 64));
            }
        }
    }
    /* super-block b's 16 scales in 128-bit lane b, its d in words 4b..4b+3 */
#define K6_B(b, i) (char)K6_AT(18 * (b) + (i))
#define K6_LANE(b) K6_B(b, 15), K6_B(b, 14), K6_B(b, 13), K6_B(b, 12), K6_B(b, 11), K6_B(b, 10), K6_B(b, 9), \
                   K6_B(b, 8), K6_B(b, 7), K6_B(b, 6), K6_B(b, 5), K6_B(b, 4), K6_B(b, 3), K6_B(b, 2), K6_B(b, 1), K6_B(b, 0)
#define K6_D(b) K6_B(b, 17), K6_B(b, 16), K6_B(b, 17), K6_B(b, 16), K6_B(b, 17), K6_B(b, 16), K6_B(b, 17), K6_B(b, 16)
    /* header bytes 0-63 (the first h of them before the codes) and 8-71 */
    const __m512i tail0 = q6_k_lanes_header64(step, load_ahead(step + 768, n, a->ahead)),
                  tail1 = load_ahead(step + 776, n, a->ahead);
    const __m512i sc = _mm512_permutex2var_epi8(tail0, _mm512_set_epi8(K6_LANE(3), K6_LANE(2), K6_LANE(1), K6_LANE(0)), tail1);
    const __m512i d16 = _mm512_permutex2var_epi8(tail0, _mm512_set_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                                                        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                                                        K6_D(3), K6_D(2), K6_D(1), K6_D(0)), tail1);
#undef K6_D
#undef K6_LANE
#undef K6_B
    const __m512 dd = _mm512_cvtph_ps(_mm512_castsi512_si256(d16));
    /* lane 4b + g: the signed scale of group 4 set + g, from the top byte of its dword */
    __m512i SC[4];
    for (int set = 0; set < 4; set++) {
        const char g0 = (char)(4 * set);
        SC[set] = _mm512_srai_epi32(lane_shuffle(sc, _mm_setr_epi8(-1, -1, -1, g0, -1, -1, -1, (char)(g0 + 1), -1, -1, -1,
                                                                    (char)(g0 + 2), -1, -1, -1, (char)(g0 + 3))), 24);
    }
    EACH_TOKEN(j) {
        __m512i T = _mm512_add_epi32(_mm512_mullo_epi32(A[j][0], SC[0]), _mm512_mullo_epi32(A[j][1], SC[1]));
        T = _mm512_add_epi32(T, _mm512_add_epi32(_mm512_mullo_epi32(A[j][2], SC[2]), _mm512_mullo_epi32(A[j][3], SC[3])));
        T = _mm512_add_epi32(T, _mm512_shuffle_epi32(T, 0x4e));
        T = _mm512_add_epi32(T, _mm512_shuffle_epi32(T, 0xb1));
        const __m512 p = _mm512_mul_ps(dd, step_act_scales(&a[j], s));
        acc[j] = _mm512_mask3_fmadd_ps(p, _mm512_cvtepi32_ps(T), acc[j], 0x1111); /* no mins */
    }
}

/* n (1-2) tokens through a rearranged row, step by step. */
KL static INLINE void row_klanes(uint32_t tag, const uint8_t *row, int64_t k, const act_row *a, int n, float *out,
                                 size_t ldo)
{
    const int q6 = tag == LM_Q6_K_LANES;
    const size_t step = q6 ? LM_Q6_K_STEP_BYTES : LM_Q4_K_STEP_BYTES;
    __m512 acc[KLANES_TOKENS];
    EACH_TOKEN(j)
        acc[j] = _mm512_setzero_ps();
    for (int64_t s = 0; s < k / 1024; s++) {
        if (q6)
            q6_k_step(row + step * s, a, n, s, acc);
        else
            q4_k_step(row + step * s, a, n, s, acc);
    }
    /* row_k's order: the sums and mins of super-blocks b mod 4 in lanes 2b, 2b + 1 */
    const __m512i pick = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 14, 12, 10, 8, 6, 4, 2, 0);
    EACH_TOKEN(j)
        out[(size_t)j * ldo] = k_lanes_total(_mm512_castps512_ps256(_mm512_permutexvar_ps(pick, acc[j])));
}

/*
 * Rows one after another, tokens two at a time, each count a literal so
 * the accumulators stay in registers (Q4_K, one thread, 2048 columns from
 * L2: 9.4-10.2 ticks a super-block and token in pairs, 14-15 three or four
 * at a time, 9.7-11.3 for the file's layout).  Every loop over the tokens
 * above is unrolled (EACH_TOKEN): left to GCC, a pair's accumulators went
 * through the stack at every step (Zen 5, two threads, tinyllama Q4_K_M
 * prompts of 6 tokens 159-174 -> 219 t/s, 14 tokens 172-190 -> 229-230;
 * one token's code changes only in its registers, and generates level).
 */
#define ROWS_KLANES(name, tag)                                                                              \
    KL __attribute__((noinline)) static void name(const uint8_t *row0, size_t rb, int64_t nr, int64_t k,   \
                                                  const act_row *a, int n, float *out, size_t ldo)         \
    {                                                                                                       \
        for (int64_t r = 0; r < nr; r++)                                                                    \
            for (int j = 0; j < n; j += KLANES_TOKENS) {                                                    \
                if (n - j == 1)                                                                             \
                    row_klanes(tag, row0 + (size_t)r * rb, k, a + j, 1, out + (size_t)j * ldo + r, ldo);    \
                else                                                                                        \
                    row_klanes(tag, row0 + (size_t)r * rb, k, a + j, 2, out + (size_t)j * ldo + r, ldo);    \
            }                                                                                               \
    }
ROWS_KLANES(rows_q4_k_lanes, LM_Q4_K_LANES)
ROWS_KLANES(rows_q6_k_lanes, LM_Q6_K_LANES)
#undef ROWS_KLANES

int lm_rows_klanes(uint32_t tag, const uint8_t *row0, size_t rb, int64_t nr, int64_t k, const act_row *a, int n,
                   float *out, size_t ldo)
{
    if (tag == LM_Q4_K_LANES)
        rows_q4_k_lanes(row0, rb, nr, k, a, n, out, ldo);
    else
        rows_q6_k_lanes(row0, rb, nr, k, a, n, out, ldo);
    return 1;
}

#else /* not x86-64: never called, the layouts are not used (lm_klanes_layout_native) */

int lm_rows_klanes(uint32_t tag, const uint8_t *row0, size_t rb, int64_t nr, int64_t k, const act_row *a, int n,
                   float *out, size_t ldo)
{
    (void)tag, (void)row0, (void)rb, (void)nr, (void)k, (void)a, (void)n, (void)out, (void)ldo;
    return 0;
}

#endif
