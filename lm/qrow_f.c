/*
 * lm/qrow_f.c - F32, F16 and BF16 rows through a batch of tokens, four
 * rows and six tokens a tile (AVX-512: lm_rows_f_avx512), two rows and
 * three tokens where AVX2 is the widest (lm_rows_f_avx2).
 *
 * A float row's dot with a token is lm_dot_f_scalar's: 16 lanes of fused
 * multiply-adds, lane j taking the products j mod 16, then the last k mod
 * 16 products into lanes 0.. and lm_hsum16's tree.  One 512-bit register
 * holds exactly those 16 lanes, so a tile keeps one register per row and
 * token, and the sums are bitwise the one-token kernels'.  Row by row, each
 * row met every token of the block in turn (four tokens a pass, before
 * 37a8a34), and the block's activations (64 tokens, 512 KiB at 2048 columns)
 * came from L2 once a row: the prompt waited on L2, not on the multiplies.
 * A tile reads each token's values once for four rows and each row's
 * weights, converted to floats in registers, once for six tokens.
 */
#include "internal.h"
#include "simd.h"

#define TILE_ROWS 4
#define TILE_TOKENS 6 /* 24 accumulators, 4 weight vectors and a token's: 29 of the 32 registers */

#if defined(__x86_64__) && defined(__GNUC__)

/* Values i..i+15 of a row of type t as floats (exact: halves widen without rounding). */
AVX512 static INLINE __m512 row16(uint32_t t, const uint8_t *row, int64_t i)
{
    if (t == LM_F32)
        return _mm512_loadu_ps((const float *)row + i);
    const __m256i h = _mm256_loadu_si256((const __m256i *)(row + 2 * i));
    if (t == LM_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); /* BF16 */
}

/* lm_dot_f_scalar's end (simd.h's dot16_end) of 16 lanes in one register. */
AVX512 static INLINE float dot_end(__m512 acc, const float *x, const float *y, int64_t n)
{
    return dot16_end(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1), x, y, n);
}

/* The tile's loops, unrolled: left as loops, GCC kept the accumulators on the stack */
#define EACH_ROW(r) _Pragma("GCC unroll 4") for (int r = 0; r < TILE_ROWS; r++)
#define EACH_TOKEN(j) _Pragma("GCC unroll 6") for (int j = 0; j < nt; j++)
_Static_assert(TILE_ROWS == 4 && TILE_TOKENS == 6, "EACH_ROW and EACH_TOKEN unroll the tile's loops");

/*
 * Rows row[0..3] against tokens a[0..nt) (t and nt literals at each call,
 * so the accumulators stay in registers): out[j * ldo + r] for the first nr
 * rows.
 */
AVX512 static INLINE void tile(uint32_t t, const uint8_t *const row[TILE_ROWS], int nr, int64_t k, const act_row *a,
                               int nt, float *out, size_t ldo)
{
    __m512 acc[TILE_ROWS][TILE_TOKENS];
    EACH_ROW(r)
        EACH_TOKEN(j)
            acc[r][j] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        __m512 w[TILE_ROWS];
        EACH_ROW(r)
            w[r] = row16(t, row[r], i);
        EACH_TOKEN(j) {
            __m512 y = _mm512_loadu_ps(a[j].f + i);
            OPAQUE512(y); /* in a register: folded into each multiply-add, it was loaded four times */
            EACH_ROW(r)
                acc[r][j] = _mm512_fmadd_ps(w[r], y, acc[r][j]);
        }
    }
    for (int r = 0; r < nr; r++) {
        float tail[16];
        if (i < k)
            lm_dequant_row(t, row[r] + lm_row_bytes(t, i), tail, k - i);
        for (int j = 0; j < nt; j++)
            out[(size_t)j * ldo + r] = dot_end(acc[r][j], tail, a[j].f + i, k - i);
    }
}

/* The block's tokens six at a time, the last few in a tile of their own, for a type t. */
#define ROWS_F(name, t)                                                                                        \
    AVX512 __attribute__((noinline)) static void name(const uint8_t *const row[TILE_ROWS], int nr, int64_t k,  \
                                                      const act_row *a, int n, float *out, size_t ldo)        \
    {                                                                                                          \
        for (int j = 0; j < n; j += TILE_TOKENS) {                                                             \
            float *o = out + (size_t)j * ldo;                                                                  \
            switch (n - j) {                                                                                   \
            case 1: tile(t, row, nr, k, a + j, 1, o, ldo); break;                                              \
            case 2: tile(t, row, nr, k, a + j, 2, o, ldo); break;                                              \
            case 3: tile(t, row, nr, k, a + j, 3, o, ldo); break;                                              \
            case 4: tile(t, row, nr, k, a + j, 4, o, ldo); break;                                              \
            case 5: tile(t, row, nr, k, a + j, 5, o, ldo); break;                                              \
            default: tile(t, row, nr, k, a + j, TILE_TOKENS, o, ldo); break;                                   \
            }                                                                                                  \
        }                                                                                                      \
    }
ROWS_F(rows_f16, LM_F16)
ROWS_F(rows_bf16, LM_BF16)
ROWS_F(rows_f32, LM_F32)
#undef ROWS_F

AVX512 __attribute__((noinline)) int lm_rows_f_avx512(uint32_t t, const uint8_t *row0, size_t rb, int nr, int64_t k,
                                                      const act_row *a, int n, float *out, size_t ldo)
{
    if ((t != LM_F32 && t != LM_F16 && t != LM_BF16) || nr < 1 || nr > TILE_ROWS)
        return 0;
    const uint8_t *row[TILE_ROWS];
    for (int r = 0; r < TILE_ROWS; r++) /* rows past nr repeat the last: read, never stored */
        row[r] = row0 + (size_t)(r < nr ? r : nr - 1) * rb;
    if (t == LM_F16)
        rows_f16(row, nr, k, a, n, out, ldo);
    else if (t == LM_BF16)
        rows_bf16(row, nr, k, a, n, out, ldo);
    else
        rows_f32(row, nr, k, a, n, out, ldo);
    return 1;
}

/*
 * Where AVX2 is the widest: a token's 16 lanes are two registers of 8 (lo,
 * hi), so two rows and three tokens a tile take 12 of the 16 registers,
 * the halves one after the other.
 */
#define TILE2_ROWS 2
#define TILE2_TOKENS 3

/* Values i..i+7 of a row of type t as floats. */
AVX2 static INLINE __m256 row8(uint32_t t, const uint8_t *row, int64_t i)
{
    return t == LM_F32 ? _mm256_loadu_ps((const float *)row + i) : halves_ps(t, row + 2 * i);
}

#define EACH_ROW2(r) _Pragma("GCC unroll 2") for (int r = 0; r < TILE2_ROWS; r++)
#define EACH_TOKEN2(j) _Pragma("GCC unroll 3") for (int j = 0; j < nt; j++)
_Static_assert(TILE2_ROWS == 2 && TILE2_TOKENS == 3, "EACH_ROW2 and EACH_TOKEN2 unroll the tile's loops");

AVX2 static INLINE void tile2(uint32_t t, const uint8_t *const row[TILE2_ROWS], int nr, int64_t k, const act_row *a,
                              int nt, float *out, size_t ldo)
{
    __m256 acc[2][TILE2_ROWS][TILE2_TOKENS]; /* [lo, hi][row][token] */
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
        EACH_ROW2(r)
            EACH_TOKEN2(j)
                acc[h][r][j] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16)
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            __m256 w[TILE2_ROWS];
            EACH_ROW2(r)
                w[r] = row8(t, row[r], i + 8 * h);
            EACH_TOKEN2(j) {
                __m256 y = _mm256_loadu_ps(a[j].f + i + 8 * h);
                OPAQUE256(y); /* in a register, not loaded again for each row */
                EACH_ROW2(r)
                    acc[h][r][j] = _mm256_fmadd_ps(w[r], y, acc[h][r][j]);
            }
        }
    for (int r = 0; r < nr; r++) {
        float tail[16];
        if (i < k)
            lm_dequant_row(t, row[r] + lm_row_bytes(t, i), tail, k - i);
        for (int j = 0; j < nt; j++)
            out[(size_t)j * ldo + r] = dot16_end(acc[0][r][j], acc[1][r][j], tail, a[j].f + i, k - i);
    }
}

#define ROWS_F2(name, t)                                                                                       \
    AVX2 __attribute__((noinline)) static void name(const uint8_t *const row[TILE2_ROWS], int nr, int64_t k,   \
                                                    const act_row *a, int n, float *out, size_t ldo)          \
    {                                                                                                          \
        for (int j = 0; j < n; j += TILE2_TOKENS) {                                                            \
            float *o = out + (size_t)j * ldo;                                                                  \
            switch (n - j) {                                                                                   \
            case 1: tile2(t, row, nr, k, a + j, 1, o, ldo); break;                                             \
            case 2: tile2(t, row, nr, k, a + j, 2, o, ldo); break;                                             \
            default: tile2(t, row, nr, k, a + j, TILE2_TOKENS, o, ldo); break;                                 \
            }                                                                                                  \
        }                                                                                                      \
    }
ROWS_F2(rows2_f16, LM_F16)
ROWS_F2(rows2_bf16, LM_BF16)
ROWS_F2(rows2_f32, LM_F32)
#undef ROWS_F2

AVX2 __attribute__((noinline)) int lm_rows_f_avx2(uint32_t t, const uint8_t *row0, size_t rb, int nr, int64_t k,
                                                  const act_row *a, int n, float *out, size_t ldo)
{
    if ((t != LM_F32 && t != LM_F16 && t != LM_BF16) || nr < 1 || nr > TILE2_ROWS)
        return 0;
    const uint8_t *row[TILE2_ROWS] = {row0, row0 + (size_t)(nr > 1) * rb}; /* a lone row twice: read, not stored */
    if (t == LM_F16)
        rows2_f16(row, nr, k, a, n, out, ldo);
    else if (t == LM_BF16)
        rows2_bf16(row, nr, k, a, n, out, ldo);
    else
        rows2_f32(row, nr, k, a, n, out, ldo);
    return 1;
}

#else /* not x86-64: the float rows go row by row (qdot.c) */

int lm_rows_f_avx512(uint32_t t, const uint8_t *row0, size_t rb, int nr, int64_t k, const act_row *a, int n,
                     float *out, size_t ldo)
{
    (void)t, (void)row0, (void)rb, (void)nr, (void)k, (void)a, (void)n, (void)out, (void)ldo;
    return 0;
}

int lm_rows_f_avx2(uint32_t t, const uint8_t *row0, size_t rb, int nr, int64_t k, const act_row *a, int n,
                   float *out, size_t ldo)
{
    (void)t, (void)row0, (void)rb, (void)nr, (void)k, (void)a, (void)n, (void)out, (void)ldo;
    return 0;
}

#endif
