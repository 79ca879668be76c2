/*
 * lm/qrow_k.c - a few tokens through Q4_K, Q5_K or Q6_K rows: the kernel
 * that decides how fast a K-quant model generates.
 *
 * Generating a token reads every weight once, so a row must be finished
 * faster than memory delivers it.  On CPUs whose 512-bit work goes to two
 * ports only, every vector operation a super-block counts: one 64-byte
 * load gives 128 codes (both nibbles of Q4_K/Q5_K; an in-order half of
 * Q6_K); super-blocks go in fours, whose scales and mins are unpacked
 * together; the sums of 4 products of two chunks fit in 16 bits, so they
 * are packed into one vector and meet their scales in one multiply-add; a
 * quad's sums and mins all meet in one reduction tree.  The token's codes
 * are laid out in the order the Q4_K/Q5_K nibbles come (lm_act_nibbles),
 * so the codes need no permute, and rows go through in runs of about
 * 64 KiB a call.  Integer sums are exact, so their order is free; the
 * float steps are lm_dot_k_scalar's, block b's in lane b % 4, so a quad's
 * four steps are one vector multiply-add and the result is bitwise the same.
 *
 * The file is compiled twice.  Alone it gives lm_rows_k_avx512 (AVX-512
 * with VNNI) and the batch paths' decoders, of the file's rows and of
 * the lanes layouts' (qrow_klanes.c); qrow_k_gfni.c includes it with
 * QROW_K_GFNI for CPUs that also have VBMI and GFNI (Ice Lake, Zen 4 on),
 * where a high nibble is one affine byte operation instead of two, and a
 * block's scales are picked across the whole vector by vpermb with no
 * broadcast of the block first.
 */
#include "internal.h"
#include "simd.h"

#include <string.h>

#ifdef QROW_K_GFNI
#define LM_ROWS_K lm_rows_k_gfni
#else
#define LM_ROWS_K lm_rows_k_avx512
#endif

#ifndef QROW_K_GFNI

/*
 * The token's codes in the order a Q4_K/Q5_K super-block's nibbles give
 * them (half_codes with nib): per 128 codes, 0-31, 64-95, 32-63, 96-127.
 */
void lm_act_nibbles(act_row *a)
{
    static const int from[4] = {0, 64, 32, 96};
    for (int64_t h = 0; h < a->k / 128; h++)
        for (int c = 0; c < 4; c++)
            memcpy(a->qw + 128 * h + 32 * c, a->qs + 128 * h + from[c], 32);
    a->nibbles = 1;
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)

#ifdef QROW_K_GFNI
#include <cpuid.h>

#define KQ X86_TARGET("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx512vbmi,gfni")

int lm_cpu_gfni(void)
{
    unsigned a, b, c, d;
    if (lm_cpu_isa() < LM_ISA_AVX512 || !__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
#ifdef LM_EMULATE_AVX512
    return lm_cpu_vbmi();
#endif
    return (c >> 1 & 1) && (c >> 8 & 1); /* VBMI and GFNI */
}

/* Each byte's high nibble: one affine map over GF(2) (bit i takes bit i + 4) */
KQ static INLINE __m512i high_nibbles(__m512i x)
{
    return _mm512_gf2p8affine_epi64_epi8(x, _mm512_set1_epi64(0x1020408000000000ll), 0);
}

/* The bytes of the quad's scales that idx names (16 * block + byte), where keep is set */
KQ static INLINE __m512i pick_scales(__m512i s8, __m512i lanes, __m512i idx, __mmask64 keep)
{
    (void)lanes; /* vpermb reaches every block's lane */
    return _mm512_maskz_permutexvar_epi8(keep, idx, s8);
}
#else
#define KQ AVX512

KQ static INLINE __m512i high_nibbles(__m512i x)
{
    return _mm512_and_si512(_mm512_srli_epi16(x, 4), _mm512_set1_epi8(0x0f));
}

/* The same from lanes, which holds the right block in each 128-bit lane (pshufb ignores idx's block bits) */
KQ static INLINE __m512i pick_scales(__m512i s8, __m512i lanes, __m512i idx, __mmask64 keep)
{
    (void)s8;
    return _mm512_maskz_shuffle_epi8(keep, lanes, idx);
}
#endif

/*
 * The 128 codes of half p of a super-block (codes 128p..128p+127) as two
 * chunks of 64 in order, unsigned (code + offset).  Q4_K/Q5_K with nib: in
 * their nibble order instead, c[0] codes 0-31 and 64-95 of the half, c[1]
 * codes 32-63 and 96-127, the order of the token's codes in act_row.qw
 * (lm_act_nibbles), which saves the two permutes.
 */
KQ static INLINE void half_codes(uint32_t t, const uint8_t *blk, int p, int nib, __m512i c[2])
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    if (t == LM_Q6_K) {
        /* ql bytes l, 32+l hold codes l, 32+l (low nibble) and 64+l, 96+l
           (high); qh byte l their top two bits, at bits 0, 2, 4, 6 */
        const __m512i shift = _mm512_set_epi64(2 * 0x0001000100010001ll, 2 * 0x0001000100010001ll,
                                               2 * 0x0001000100010001ll, 2 * 0x0001000100010001ll, 0, 0, 0, 0);
        const __m512i m30 = _mm512_set1_epi8(0x30);
        const __m512i x = load_once512(blk + 64 * p);
        __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * p)));
        h = _mm512_srlv_epi16(h, shift);
        c[0] = _mm512_ternarylogic_epi32(_mm512_and_si512(x, m4), _mm512_slli_epi16(h, 4), m30, 0xf8);
        c[1] = _mm512_ternarylogic_epi32(high_nibbles(x), h, m30, 0xf8);
        return;
    }
    /* Q4_K/Q5_K: ql bytes 64p+l hold code 128p+l (low nibble) and 128p+32+l
       (high), bytes 64p+32+l codes 128p+64+l and 128p+96+l */
    const __m512i x = load_once512(blk + (t == LM_Q4_K ? 16 : 48) + 64 * p);
    __m512i lo = _mm512_and_si512(x, m4), hi = high_nibbles(x);
    if (t == LM_Q5_K) { /* bit j of qh byte l: the fifth bit of code 32j + l */
        const __m512i shift = _mm512_set_epi64(0x0001000100010001ll * (4 * p + 2), 0x0001000100010001ll * (4 * p + 2),
                                               0x0001000100010001ll * (4 * p + 2), 0x0001000100010001ll * (4 * p + 2),
                                               0x0001000100010001ll * (4 * p), 0x0001000100010001ll * (4 * p),
                                               0x0001000100010001ll * (4 * p), 0x0001000100010001ll * (4 * p));
        const __m512i m10 = _mm512_set1_epi8(0x10);
        __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)));
        h = _mm512_srlv_epi16(h, shift);
        lo = _mm512_ternarylogic_epi32(lo, _mm512_slli_epi16(h, 4), m10, 0xf8);
        hi = _mm512_ternarylogic_epi32(hi, _mm512_slli_epi16(h, 3), m10, 0xf8);
    }
    if (nib) {
        c[0] = lo, c[1] = hi;
        return;
    }
    c[0] = _mm512_permutex2var_epi64(lo, _mm512_set_epi64(11, 10, 9, 8, 3, 2, 1, 0), hi);
    c[1] = _mm512_permutex2var_epi64(lo, _mm512_set_epi64(15, 14, 13, 12, 7, 6, 5, 4), hi);
}

/* Four super-blocks' scales, unpacked together. */
typedef struct kquad {
    __m512i s8;     /* block i's scales in bytes 0-7 and mins in 8-15 of lane i (Q6_K: 16 scales) */
    __m256 dd;      /* d and dmin of each block in turn (Q6_K: d and 0) */
} kquad;

KQ static INLINE void decode_quad(uint32_t t, const uint8_t *blk, size_t bs, int m, kquad *q)
{
    if (t == LM_Q6_K) {
        __m512i x = quad_bytes(blk, bs, 192, m);
        q->s8 = x;
        /* block i's d in word 2i, dmin's 0 in word 2i + 1, by word inserts: a 4-dword gather
           did it before, slower on AMD cores (Zen 5, one token, one thread, rows from L2, five
           rounds alternated: 2048 columns 15.9-16.3 -> 15.4-15.9 ticks a super-block, 5632
           13.9-14.4 -> 13.2-13.7) */
        __m128i d = _mm_cvtsi32_si128(lm_u16_at(blk + 208));
        if (m > 1)
            d = _mm_insert_epi16(d, lm_u16_at(blk + bs + 208), 2);
        if (m > 2)
            d = _mm_insert_epi16(d, lm_u16_at(blk + 2 * bs + 208), 4);
        if (m > 3)
            d = _mm_insert_epi16(d, lm_u16_at(blk + 3 * bs + 208), 6);
        q->dd = _mm256_cvtph_ps(d);
        return;
    }
    __m512i x = quad_bytes(blk, bs, 0, m), s = six_bit_scales(x);
    q->s8 = s;
    __m512i d = _mm512_permutexvar_epi32(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), x);
    q->dd = _mm256_cvtph_ps(_mm512_castsi512_si128(d));
}

/* Lane i (0-3) of x in every lane; the shuffle wants a literal, which -O1 does not fold from i. */
KQ static INLINE __m512i lane_everywhere(__m512i x, int i)
{
    switch (i) {
    case 0: return _mm512_shuffle_i32x4(x, x, 0x00);
    case 1: return _mm512_shuffle_i32x4(x, x, 0x55);
    case 2: return _mm512_shuffle_i32x4(x, x, 0xaa);
    default: return _mm512_shuffle_i32x4(x, x, 0xff);
    }
}

/* A super-block's codes: chunk z holds codes 64z..64z+63 (nib: half_codes' nibble order). */
KQ static INLINE void block_codes(uint32_t t, const uint8_t *blk, int nib, __m512i c[4])
{
    half_codes(t, blk, 0, nib, c);
    half_codes(t, blk, 1, nib, c + 2);
}

/* A dword of four equal index bytes */
#define KQ_B4(x) ((int)(0x01010101u * (unsigned)(x)))

/*
 * Block i's scales for chunk pair p once packed (block_sums): 128-bit
 * lanes 0-1 take the scales of the two chunks' first groups, lanes 2-3
 * their second; in a lane, dwords 0-1 serve chunk 2p, dwords 2-3 chunk
 * 2p + 1.  Q4_K/Q5_K put the scale in both words of each dword; Q6_K its
 * signed scale of 16 codes (lane k of chunk z: scale 4z + k), sign-extended
 * into each word.
 */
KQ static INLINE __m512i pair_scales(uint32_t t, const kquad *q, int i, int p, int nib)
{
    const int o = 16 * i;
    const __m512i lanes = lane_everywhere(q->s8, i);
    if (t == LM_Q6_K) {
        const int a = o + 8 * p, c = a + 4;
        __m512i idx = _mm512_set_epi32(KQ_B4(c + 3), KQ_B4(c + 3), KQ_B4(a + 3), KQ_B4(a + 3),
                                       KQ_B4(c + 2), KQ_B4(c + 2), KQ_B4(a + 2), KQ_B4(a + 2),
                                       KQ_B4(c + 1), KQ_B4(c + 1), KQ_B4(a + 1), KQ_B4(a + 1),
                                       KQ_B4(c), KQ_B4(c), KQ_B4(a), KQ_B4(a));
        return _mm512_srai_epi16(pick_scales(q->s8, lanes, idx, 0xaaaaaaaaaaaaaaaaull), 8);
    }
    /* chunk z's groups: in nibble order 4(z/2) + z%2 and two after it, else 2z and 2z + 1 */
    const int a0 = o + 4 * p, a1 = a0 + (nib ? 1 : 2), b0 = a0 + (nib ? 2 : 1), b1 = a0 + 3;
    __m512i idx = _mm512_set_epi32(KQ_B4(b1), KQ_B4(b1), KQ_B4(b0), KQ_B4(b0), KQ_B4(b1), KQ_B4(b1), KQ_B4(b0),
                                   KQ_B4(b0), KQ_B4(a1), KQ_B4(a1), KQ_B4(a0), KQ_B4(a0), KQ_B4(a1), KQ_B4(a1),
                                   KQ_B4(a0), KQ_B4(a0));
    return pick_scales(q->s8, lanes, idx, 0x5555555555555555ull);
}

/* The mins of blocks 2h and 2h + 1 as words, each twice (one per 16 codes) */
KQ static INLINE __m512i quad_mins(const kquad *q, int h)
{
#define KQ_M1(x) (char)(x), (char)(x), (char)(x), (char)(x)
#define KQ_M(blk) KQ_M1(16 * (blk) + 15), KQ_M1(16 * (blk) + 14), KQ_M1(16 * (blk) + 13), KQ_M1(16 * (blk) + 12), \
                  KQ_M1(16 * (blk) + 11), KQ_M1(16 * (blk) + 10), KQ_M1(16 * (blk) + 9), KQ_M1(16 * (blk) + 8)
    const __m512i idx = h ? _mm512_set_epi8(KQ_M(3), KQ_M(2)) : _mm512_set_epi8(KQ_M(1), KQ_M(0));
#undef KQ_M
#undef KQ_M1
    /* lanes 0-1 from block 2h, 2-3 from block 2h + 1 */
    const __m512i lanes = h ? _mm512_shuffle_i32x4(q->s8, q->s8, 0xfa) : _mm512_shuffle_i32x4(q->s8, q->s8, 0x50);
    return pick_scales(q->s8, lanes, idx, 0x5555555555555555ull);
}

/*
 * Super-block b for one token: 16 partial sums of code times scale.  A
 * chunk's sums of 4 products fit in 16 bits (|v| <= 4 * 32 * 128 even for
 * Q6_K's codes less 32), so two chunks pack into one vector of words and
 * one multiply-add applies both chunks' scales.
 */
KQ static INLINE __m512i block_sums(uint32_t t, const __m512i c[4], const __m512i sp[2], const act_row *a,
                                    int64_t b, int nib)
{
    const int off = t == LM_Q6_K;
    const int8_t *qs = nib ? a->qw : a->qs;
    __m512i v[4], s = _mm512_setzero_si512();
    _Pragma("GCC unroll 4")
    for (int z = 0; z < 4; z++) {
        int64_t e = b * 256 + 64 * z;
        __m512i seed = off ? _mm512_loadu_si512(a->negcorr + e / 4) : _mm512_setzero_si512();
        v[z] = _mm512_dpbusd_epi32(seed, c[z], _mm512_loadu_si512(qs + e));
    }
    s = _mm512_dpwssd_epi32(s, _mm512_packs_epi32(v[0], v[1]), sp[0]);
    return _mm512_dpwssd_epi32(s, _mm512_packs_epi32(v[2], v[3]), sp[1]);
}

/*
 * The m blocks' sums (y[i]) and mins (mn: blocks 0-1, 2-3) of one token
 * added in one tree, then lm_dot_k_scalar's float steps, block i of the quad
 * in lane i (acc: lane 2i its sums, 2i + 1 its mins).
 */
KQ static INLINE void quad_steps(uint32_t t, const __m512i y[4], const __m512i mn[2], const kquad *q,
                                 const act_row *a, int64_t b, int m, __m256 *acc)
{
    __m512i ms[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    if (t != LM_Q6_K) { /* min times sum of 16 codes, the sums masked to the m blocks */
        const __mmask32 k0 = m >= 2 ? ~0u : 0xffffu, k1 = m >= 4 ? ~0u : m == 3 ? 0xffffu : 0;
        ms[0] = _mm512_madd_epi16(mn[0], _mm512_maskz_loadu_epi16(k0, a->sum16 + b * 16));
        ms[1] = _mm512_madd_epi16(mn[1], _mm512_maskz_loadu_epi16(k1, a->sum16 + b * 16 + 32));
    }
    /* halves: block 2h's 8 partials in lanes 0-7, block 2h+1's in 8-15, as ms[h] */
    __m512i z0 = _mm512_add_epi32(_mm512_shuffle_i32x4(y[0], y[1], 0x44), _mm512_shuffle_i32x4(y[0], y[1], 0xee));
    __m512i z1 = _mm512_add_epi32(_mm512_shuffle_i32x4(y[2], y[3], 0x44), _mm512_shuffle_i32x4(y[2], y[3], 0xee));
    /* quarters: lanes 0-3 of P hold sums of blocks 0, 1, mins of 0, 1; Q blocks 2, 3 */
    __m512i P = _mm512_add_epi32(_mm512_shuffle_i32x4(z0, ms[0], 0x88), _mm512_shuffle_i32x4(z0, ms[0], 0xdd));
    __m512i Q = _mm512_add_epi32(_mm512_shuffle_i32x4(z1, ms[1], 0x88), _mm512_shuffle_i32x4(z1, ms[1], 0xdd));
    __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi32(P, Q), _mm512_unpackhi_epi32(P, Q));
    __m512i r = _mm512_add_epi32(u, _mm512_shuffle_epi32(u, 0x4e)); /* lane k: P's total, Q's total */
    /* block i's sum in lane 2i, its mins in 2i + 1 */
    const __m512i order = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 13, 5, 9, 1, 12, 4, 8, 0);
    __m256 f = _mm512_castps512_ps256(_mm512_permutexvar_ps(order, _mm512_cvtepi32_ps(r)));
    __m128 ad4 = _mm_maskz_loadu_ps((__mmask8)((1u << m) - 1), a->d + b);
    __m256 ad = _mm256_permutexvar_ps(_mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), _mm256_castps128_ps256(ad4));
    __m256 p = _mm256_mul_ps(q->dd, ad); /* d * d8 and dmin * d8 */
    const __mmask8 live = (__mmask8)((1u << 2 * m) - 1); /* blocks past the row's end take no step */
    *acc = _mm256_mask3_fmadd_ps(p, f, *acc, live & 0x55);
    *acc = _mm256_mask_add_ps(*acc, live & 0xaa, *acc, _mm256_mul_ps(p, f));
}

/* Super-blocks b..b+m-1 (m <= 4) for n tokens. */
KQ static INLINE void quad(uint32_t t, size_t bs, const uint8_t *row, int64_t b, int m, const act_row *a, int n,
                           int nib, __m256 *acc)
{
    const uint8_t *blk = row + (size_t)b * bs;
    kquad q;
    decode_quad(t, blk, bs, m, &q);
    __m512i y[LM_ROW_K_TOKENS][4], mn[2] = {quad_mins(&q, 0), quad_mins(&q, 1)};
    _Pragma("GCC unroll 4")
    for (int i = 0; i < 4; i++) {
        if (i >= m) {
            for (int j = 0; j < n; j++)
                y[j][i] = _mm512_setzero_si512();
            continue;
        }
        __m512i c[4], sp[2];
        lm_prefetch_ahead(blk + (size_t)i * bs, bs, n, a->ahead); /* block by block: four at once was slower from DRAM */
        block_codes(t, blk + (size_t)i * bs, nib, c);
        sp[0] = pair_scales(t, &q, i, 0, nib);
        sp[1] = pair_scales(t, &q, i, 1, nib);
        for (int j = 0; j < n; j++)
            y[j][i] = block_sums(t, c, sp, &a[j], b + i, nib);
    }
    for (int j = 0; j < n; j++)
        quad_steps(t, y[j], mn, &q, &a[j], b, m, &acc[j]);
}

/* n (1..LM_ROW_K_TOKENS) tokens through a row, each super-block decoded once for all: out[ldo * j]. */
KQ static INLINE void row_k(uint32_t t, size_t bs, const uint8_t *row, int64_t k, const act_row *a, int n,
                            int nib, float *out, size_t ldo)
{
    __m256 acc[LM_ROW_K_TOKENS]; /* lane 2i: the sums of blocks b = i mod 4, 2i + 1: their mins */
    for (int j = 0; j < n; j++)
        acc[j] = _mm256_setzero_ps();
    const int64_t nb = k / 256;
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4)
        quad(t, bs, row, b, 4, a, n, nib, acc);
    if (b < nb)
        quad(t, bs, row, b, (int)(nb - b), a, n, nib, acc);
    for (int j = 0; j < n; j++)
        out[(size_t)j * ldo] = k_lanes_total(acc[j]);
}

/* Whether all n tokens' codes are also in nibble order (lm_act_nibbles). */
static int all_nibbles(const act_row *a, int n)
{
    for (int j = 0; j < n; j++)
        if (!a[j].nibbles)
            return 0;
    return 1;
}

/*
 * Rows one after another, tokens LM_ROW_K_TOKENS at a time; each type and
 * order a function of its own (inlined into one, GCC dropped every
 * prefetch of it).  One token (generation) gets a loop of its own, which
 * keeps its constants in registers from row to row: rows of 8 super-blocks
 * 12.3 -> 10.2 cycles a super-block.
 */
#define ROWS_K_VARIANT(name, t, bs, nib)                                                                  \
    KQ __attribute__((noinline)) static void name(const uint8_t *row0, size_t rb, int64_t nr, int64_t k, \
                                                  const act_row *a, int n, float *out, size_t ldo)       \
    {                                                                                                     \
        if (n == 1) {                                                                                     \
            for (int64_t r = 0; r < nr; r++)                                                              \
                row_k(t, bs, row0 + (size_t)r * rb, k, a, 1, nib, out + r, ldo);                          \
            return;                                                                                       \
        }                                                                                                 \
        for (int64_t r = 0; r < nr; r++)                                                                  \
            for (int j = 0; j < n; j += LM_ROW_K_TOKENS)                                                  \
                row_k(t, bs, row0 + (size_t)r * rb, k, a + j,                                             \
                      n - j < LM_ROW_K_TOKENS ? n - j : LM_ROW_K_TOKENS, nib,                             \
                      out + (size_t)j * ldo + r, ldo);                                                    \
    }
ROWS_K_VARIANT(rows_q4_k, LM_Q4_K, 144, 0)
ROWS_K_VARIANT(rows_q4_k_nib, LM_Q4_K, 144, 1)
ROWS_K_VARIANT(rows_q5_k, LM_Q5_K, 176, 0)
ROWS_K_VARIANT(rows_q5_k_nib, LM_Q5_K, 176, 1)
ROWS_K_VARIANT(rows_q6_k, LM_Q6_K, 210, 0)
#undef ROWS_K_VARIANT

KQ int LM_ROWS_K(uint32_t t, const uint8_t *row0, size_t rb, int64_t nr, int64_t k,
                 const act_row *a, int n, float *out, size_t ldo)
{
    const int nib = all_nibbles(a, n);
    switch (t) {
    case LM_Q4_K: (nib ? rows_q4_k_nib : rows_q4_k)(row0, rb, nr, k, a, n, out, ldo); return 1;
    case LM_Q5_K: (nib ? rows_q5_k_nib : rows_q5_k)(row0, rb, nr, k, a, n, out, ldo); return 1;
    case LM_Q6_K: rows_q6_k(row0, rb, nr, k, a, n, out, ldo); return 1;
    default: return 0;
    }
}

#ifndef QROW_K_GFNI /* the batch paths: one copy is enough */

/*
 * A byte shuffle that gives lane j of a chunk the scale of its group (byte
 * 0 of the dword, the rest 0): scale a for lanes 0-7, b for 8-15 (listed
 * from byte 63 down).  Literals: GCC built computed ones byte by byte.
 */
#define K4_IDX(a, b)                                                                            \
    _mm512_set_epi8(o, o, o, b, o, o, o, b, o, o, o, b, o, o, o, b, o, o, o, b, o, o, o, b, o, o, o, b, \
                    o, o, o, b, o, o, o, a, o, o, o, a, o, o, o, a, o, o, o, a, o, o, o, a, o, o, o, a, \
                    o, o, o, a, o, o, o, a)

/*
 * Q4_K/Q5_K block i's scales, by byte shuffles (vpermw costs more): its
 * lane of s8 in every lane, then chunk z takes the scales of groups 2z and
 * 2z + 1 (in nibble order, 4(z/2) + z%2 and the one two after it); the
 * mins go out as words, each twice.
 */
KQ static INLINE void block_scales_k4(const kquad *q, int i, int nib, __m512i sc[4], __m256i *mn)
{
    const __m512i own = lane_everywhere(q->s8, i);
    const char o = (char)0x80;
    sc[0] = _mm512_shuffle_epi8(own, nib ? K4_IDX(0, 2) : K4_IDX(0, 1));
    sc[1] = _mm512_shuffle_epi8(own, nib ? K4_IDX(1, 3) : K4_IDX(2, 3));
    sc[2] = _mm512_shuffle_epi8(own, nib ? K4_IDX(4, 6) : K4_IDX(4, 5));
    sc[3] = _mm512_shuffle_epi8(own, nib ? K4_IDX(5, 7) : K4_IDX(6, 7));
    const __m256i midx = _mm256_set_epi8(o, 15, o, 15, o, 14, o, 14, o, 13, o, 13, o, 12, o, 12,
                                         o, 11, o, 11, o, 10, o, 10, o, 9, o, 9, o, 8, o, 8);
    *mn = _mm256_shuffle_epi8(_mm512_castsi512_si256(own), midx);
}
#undef K4_IDX

/*
 * Q6_K block i's signed scales the same way: lane j of chunk z takes scale
 * 4z + j/4, put in byte 1 of its dword and shifted down as a word, so the
 * low word is the scale, sign-extended, and the high word 0.
 */
KQ static INLINE void block_scales_k6(const kquad *q, int i, __m512i sc[4])
{
    const __m512i own = lane_everywhere(q->s8, i);
    const char o = (char)0x80;
    for (int z = 0; z < 4; z++) {
        const char a = (char)(4 * z), b = (char)(4 * z + 1), c = (char)(4 * z + 2), d = (char)(4 * z + 3);
        const __m512i idx = _mm512_set_epi8(o, o, d, o, o, o, d, o, o, o, d, o, o, o, d, o,
                                            o, o, c, o, o, o, c, o, o, o, c, o, o, o, c, o,
                                            o, o, b, o, o, o, b, o, o, o, b, o, o, o, b, o,
                                            o, o, a, o, o, o, a, o, o, o, a, o, o, o, a, o);
        sc[z] = _mm512_srai_epi16(_mm512_shuffle_epi8(own, idx), 8);
    }
}

/* Block i of a quad: the scale of each lane of chunk z (low word, high word 0) and the mins. */
KQ static INLINE void block_scales(uint32_t t, const kquad *q, int i, int nib, __m512i sc[4],
                                   __m256i *mn)
{
    if (t != LM_Q6_K) {
        block_scales_k4(q, i, nib, sc, mn);
        return;
    }
    block_scales_k6(q, i, sc);
    *mn = _mm256_setzero_si256();
}

/* Block i's scale of every 4 codes as int32 (qrow.sc4) and min of every 16 (qrow.mn). */
KQ static INLINE void kscales_of(uint32_t t, const kquad *q, int i, int32_t *sc4, int16_t *mn)
{
    __m512i sc[4];
    __m256i m16;
    block_scales(t, q, i, 0, sc, &m16);
    for (int z = 0; z < 4; z++) /* the low word, sign-extended (Q6_K's scales are signed) */
        _mm512_storeu_si512(sc4 + 16 * z, _mm512_srai_epi32(_mm512_slli_epi32(sc[z], 16), 16));
    _mm256_storeu_si256((__m256i *)mn, m16);
}

/* Block i of a decoded quad's factors, d and dmin, into d[b] and m[b]. */
KQ static INLINE void store_factors(const kquad *q, int i, float *d, float *m, int64_t b)
{
    float dd[8];
    _mm256_storeu_ps(dd, q->dd);
    d[b] = dd[2 * i], m[b] = dd[2 * i + 1];
}

/*
 * Super-block b of a row read alone, for the batch paths: prefetched (rows
 * go in file order, so this reads the next ones), its scales unpacked into
 * *q, its codes into c, its factors into d[b] and m[b].
 */
KQ static INLINE void one_block(uint32_t t, size_t bs, const uint8_t *row, int64_t b, kquad *q, __m512i c[4],
                                float *d, float *m)
{
    const uint8_t *blk = row + (size_t)b * bs;
    lm_prefetch_ahead(blk, bs, 16, LM_PREFETCH_BATCH); /* for the batch kernels */
    decode_quad(t, blk, bs, 1, q);
    block_codes(t, blk, 0, c);
    store_factors(q, 0, d, m, b);
}

/*
 * A K-quant row straight into the form the AMX tiles take (lm_rows16_put's
 * bytes): each code minus its offset times its group scale, v, as lo =
 * v & 127 and hi = v >> 7; the super-block factors d and dmin; the min of
 * every 16 codes.  It skips the generic decode, which cost the batch path
 * more than its tiles.
 */
KQ static INLINE void put_block_scaled(uint32_t t, const kquad *q, int i, const __m512i c[4], int64_t b, int8_t *lo,
                                       int8_t *hi, int16_t *mn)
{
    const __m512i m7 = _mm512_set1_epi16(127), off = _mm512_set1_epi16(t == LM_Q6_K ? 32 : 0);
    __m512i sc4[4];
    __m256i mins;
    block_scales(t, q, i, 0, sc4, &mins);
    _mm256_storeu_si256((__m256i *)(mn + b * 16), mins);
    for (int z = 0; z < 4; z++) { /* 64 codes: each 128-bit lane's 16 share a scale */
        /* the scale in both words of its dword, for the widened codes */
        __m512i sc = _mm512_or_si512(sc4[z], _mm512_slli_epi32(sc4[z], 16)), zero = _mm512_setzero_si512();
        /* bytes widened within their lane, and packed back the same way: no permutes */
        __m512i v0 = _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_unpacklo_epi8(c[z], zero), off), sc);
        __m512i v1 = _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_unpackhi_epi8(c[z], zero), off), sc);
        int64_t e = b * 256 + 64 * z;
        _mm512_storeu_si512(lo + e, _mm512_packus_epi16(_mm512_and_si512(v0, m7), _mm512_and_si512(v1, m7)));
        _mm512_storeu_si512(hi + e, _mm512_packs_epi16(_mm512_srai_epi16(v0, 7), _mm512_srai_epi16(v1, 7)));
    }
}

KQ static INLINE void put_scaled(uint32_t t, size_t bs, const uint8_t *row, int64_t k, int8_t *lo, int8_t *hi,
                                 float *d, float *m, int16_t *mn)
{
    for (int64_t b = 0; b < k / 256; b++) {
        kquad q;
        __m512i c[4];
        one_block(t, bs, row, b, &q, c, d, m);
        put_block_scaled(t, &q, 0, c, b, lo, hi, mn);
    }
}

/*
 * A step of a rearranged Q4_K row (repack.c: dword 4b + g of chunk c holds
 * codes 4c..4c+3 of group g, low nibbles, and g + 4, high, of super-block
 * b) as its 4 super-blocks' codes in order, c[b][z] = codes 64z.. of b.
 */
KQ static INLINE void q4_k_lanes_codes(const uint8_t *st, __m512i c[4][4])
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int h = 0; h < 2; h++) { /* groups 0-3, then 4-7 */
        __m512i v[8], a[4], e[4], in[4], out[4];
        for (int ch = 0; ch < 8; ch++) {
            const __m512i x = _mm512_loadu_si512(st + 64 + 64 * ch);
            v[ch] = _mm512_and_si512(h ? _mm512_srli_epi16(x, 4) : x, m4);
        }
        dwords_4x16(v, a);     /* a[g]'s chunk b: codes 0-15 of group g (+ 4h) of super-block b */
        dwords_4x16(v + 4, e); /* codes 16-31 */
        for (int z = 0; z < 2; z++) { /* groups 2z, 2z + 1 of the half */
            in[0] = a[2 * z], in[1] = e[2 * z], in[2] = a[2 * z + 1], in[3] = e[2 * z + 1];
            chunks_4x4(in, out);
            for (int b = 0; b < 4; b++)
                c[b][2 * h + z] = out[b];
        }
    }
}

/*
 * The same for Q6_K (repack.c: for groups 4s..4s+3, codes 4j..4j+3 of group
 * 4s + g of super-block b have their low four bits in dword 4b + g of chunk
 * 4(s / 2) + j, nibble s % 2, and their top two in bits 2s.. of dword 4b + g
 * of chunk 8 + j).
 */
KQ static INLINE void q6_k_lanes_codes(const uint8_t *st, __m512i c[4][4])
{
    st += lm_q6_k_lanes_codes(st);
    const __m512i m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(0x03);
    for (int s = 0; s < 4; s++) {
        __m512i v[4], r[4], out[4];
        for (int j = 0; j < 4; j++) {
            const __m512i low = _mm512_loadu_si512(st + lm_q6_k_lanes_low(j, s / 2));
            const __m512i top = _mm512_loadu_si512(st + lm_q6_k_lanes_top(j));
            const __m512i l4 = _mm512_and_si512(s % 2 ? _mm512_srli_epi16(low, 4) : low, m4);
            const __m512i t2 = _mm512_and_si512(_mm512_srli_epi16(top, 2 * s), m2);
            v[j] = _mm512_or_si512(l4, _mm512_slli_epi16(t2, 4));
        }
        dwords_4x16(v, r); /* r[g]'s chunk b: the 16 codes of group 4s + g of super-block b */
        chunks_4x4(r, out);
        for (int b = 0; b < 4; b++)
            c[b][s] = out[b];
    }
}

/*
 * The scales and factors of a Q6_K lanes step's 4 super-blocks (header
 * bytes 18b..18b+17, lm_klanes_header), as decode_quad gives them, read
 * where they lie around the codes (lm_q6_k_lanes_codes): a copy put
 * together first was read back across its two stores, which the core does
 * not forward (Zen 5: a fifth of the batch preparer's time on one load).
 */
KQ static INLINE void q6_k_lanes_quad(const uint8_t *st, kquad *q)
{
    const int h = (int)lm_q6_k_lanes_codes(st); /* header bytes from h on lie 768 further */
    __m512i s8 = _mm512_setzero_si512();
    short d[4];
    for (int b = 0; b < 4; b++) {
        const int at = 18 * b, from = h - at; /* this block's bytes from `from` on lie after the codes */
        const __mmask16 after = from <= 0 ? 0xffff : from >= 16 ? 0 : (__mmask16)(0xffffu << from);
        const __m128i v = _mm_mask_blend_epi8(after, _mm_loadu_si128((const __m128i *)(st + at)),
                                              _mm_loadu_si128((const __m128i *)(st + 768 + at)));
        s8 = _mm512_mask_broadcast_i32x4(s8, (__mmask16)(0xf << (4 * b)), v);
        const int lo = st[at + 16 < h ? at + 16 : 768 + at + 16], hi = st[at + 17 < h ? at + 17 : 768 + at + 17];
        d[b] = (short)(lo | hi << 8);
    }
    q->s8 = s8;
    q->dd = _mm256_cvtph_ps(_mm_set_epi16(0, d[3], 0, d[2], 0, d[1], 0, d[0])); /* dmin 0, as decode_quad */
}

/*
 * A step of a rearranged Q4_K or Q6_K row: its 4 super-blocks' codes in
 * order, c[b][z], and their scales and factors in one quad, read where the
 * step keeps its headers side by side (lm_klanes_header).
 */
KQ static INLINE void lanes_step(uint32_t t, const uint8_t *st, __m512i c[4][4], kquad *q)
{
    lm_prefetch_ahead(st, 4 * lm_type_size(t), 16, LM_PREFETCH_BATCH); /* for the batch kernels */
    if (t == LM_Q4_K) {
        q4_k_lanes_codes(st, c);
        decode_quad(t, st, 16, 4, q); /* the headers at 16b (lm_klanes_header) */
    } else {
        q6_k_lanes_codes(st, c);
        q6_k_lanes_quad(st, q);
    }
}

/* A rearranged Q4_K or Q6_K row (tag LM_Q4_K_LANES, LM_Q6_K_LANES) as put_scaled gives the file's. */
KQ static INLINE void put_scaled_lanes(uint32_t tag, const uint8_t *row, int64_t k, int8_t *lo, int8_t *hi,
                                       float *d, float *m, int16_t *mn)
{
    const uint32_t t = tag == LM_Q4_K_LANES ? LM_Q4_K : LM_Q6_K;
    for (int64_t s = 0; s < k / 1024; s++) {
        __m512i c[4][4];
        kquad q;
        lanes_step(t, row + 4 * lm_type_size(t) * (size_t)s, c, &q);
        for (int b = 0; b < 4; b++) {
            store_factors(&q, b, d, m, 4 * s + b);
            put_block_scaled(t, &q, b, c[b], 4 * s + b, lo, hi, mn);
        }
    }
}

/*
 * Super-block b of a row into r as qgemm.c's VNNI groups read it: the
 * scale of every 4 codes, min of every 16 and factors that lm_qrow_decode
 * leaves, and lm_trow_prepare_avx512's signed codes and corrections, made
 * from the codes in registers (r->u is not written).
 */
KQ static INLINE void prepare_block(uint32_t t, size_t bs, const uint8_t *row, int64_t b, qrow *r)
{
    kquad q;
    __m512i c[4];
    one_block(t, bs, row, b, &q, c, r->d, r->m);
    kscales_of(t, &q, 0, r->sc4 + b * 64, r->mn + b * 16);
    put_s8_256(c, lm_code_offset(t), r->s8 + b * 256, r->corr16 + b * 16);
}

/* A K-quant row straight into what qgemm.c's VNNI groups read, in one pass. */
KQ static INLINE void prepare_groups(uint32_t t, size_t bs, const uint8_t *row, int64_t k, qrow *r)
{
    for (int64_t b = 0; b < k / 256; b++)
        prepare_block(t, bs, row, b, r);
    r->type = t, r->k = k;
}

/*
 * A rearranged row (tag LM_Q4_K_LANES, LM_Q6_K_LANES) into what qgemm.c's
 * VNNI groups read, as prepare_groups does from the file's, a step at a
 * time: its codes transposed whole vectors at once, its headers decoded
 * four at once (a super-block at a time, gathering 16 bytes of each of
 * four slices and calling for its scales, tinyllama Q6_K prompts of 512
 * tokens ran 3-5% behind the file's layout).
 */
KQ static INLINE void prepare_lanes(uint32_t t, const uint8_t *row, int64_t k, qrow *r)
{
    const int off = lm_code_offset(t);
    for (int64_t s = 0; s < k / 1024; s++) {
        __m512i c[4][4];
        kquad q;
        lanes_step(t, row + 4 * lm_type_size(t) * (size_t)s, c, &q);
        for (int b = 0; b < 4; b++) {
            const int64_t i = 4 * s + b;
            store_factors(&q, b, r->d, r->m, i);
            kscales_of(t, &q, b, r->sc4 + i * 64, r->mn + i * 16);
            put_s8_256(c[b], off, r->s8 + i * 256, r->corr16 + i * 16);
        }
    }
    r->type = t, r->k = k;
}

KQ int lm_row_klanes_prepare(uint32_t tag, const uint8_t *row, int64_t k, qrow *r)
{
    if (tag == LM_Q4_K_LANES) /* each type compiled on its own, as lm_row_k_prepare's */
        prepare_lanes(LM_Q4_K, row, k, r);
    else
        prepare_lanes(LM_Q6_K, row, k, r);
    return 1;
}

KQ int lm_row_k_prepare(uint32_t t, const uint8_t *row, int64_t k, qrow *r)
{
    switch (t) {
    case LM_Q4_K: prepare_groups(LM_Q4_K, 144, row, k, r); return 1;
    case LM_Q5_K: prepare_groups(LM_Q5_K, 176, row, k, r); return 1;
    case LM_Q6_K: prepare_groups(LM_Q6_K, 210, row, k, r); return 1;
    default: return 0;
    }
}

KQ int lm_row_k_scaled(uint32_t t, const uint8_t *row, int64_t k, int8_t *lo, int8_t *hi, float *d, float *m,
                       int16_t *mn)
{
    switch (t) {
    case LM_Q4_K: put_scaled(LM_Q4_K, 144, row, k, lo, hi, d, m, mn); return 1;
    case LM_Q5_K: put_scaled(LM_Q5_K, 176, row, k, lo, hi, d, m, mn); return 1;
    case LM_Q6_K: put_scaled(LM_Q6_K, 210, row, k, lo, hi, d, m, mn); return 1;
    case LM_Q4_K_LANES: put_scaled_lanes(LM_Q4_K_LANES, row, k, lo, hi, d, m, mn); return 1;
    case LM_Q6_K_LANES: put_scaled_lanes(LM_Q6_K_LANES, row, k, lo, hi, d, m, mn); return 1;
    default: return 0;
    }
}

#endif

#else /* not x86-64: never called, lm_cpu_isa() is below LM_ISA_AVX512 */

int LM_ROWS_K(uint32_t t, const uint8_t *row0, size_t rb, int64_t nr, int64_t k,
              const act_row *a, int n, float *out, size_t ldo)
{
    (void)t, (void)row0, (void)rb, (void)nr, (void)k, (void)a, (void)n, (void)out, (void)ldo;
    return 0;
}

#ifdef QROW_K_GFNI
int lm_cpu_gfni(void) { return 0; }
#else
int lm_row_k_scaled(uint32_t t, const uint8_t *row, int64_t k, int8_t *lo, int8_t *hi, float *d, float *m,
                    int16_t *mn)
{
    (void)t, (void)row, (void)k, (void)lo, (void)hi, (void)d, (void)m, (void)mn;
    return 0;
}

int lm_row_k_prepare(uint32_t t, const uint8_t *row, int64_t k, qrow *r)
{
    (void)t, (void)row, (void)k, (void)r;
    return 0;
}

int lm_row_klanes_prepare(uint32_t tag, const uint8_t *row, int64_t k, qrow *r)
{
    (void)tag, (void)row, (void)k, (void)r;
    return 0;
}

#endif

#endif
