/*
 * lm/qgemm.c - quantized rows against groups of 16 tokens, with AVX-512 VNNI.
 *
 * The fused kernels of qdot_simd.c take one token at a time: every 64 codes
 * cost each token a vpdpbusd and then a scale multiply (K-quants) or a
 * conversion and multiply-add (32-element blocks).
 * Here the activations of 16 tokens are laid side by side, four codes of
 * each token in one 32-bit lane ([k/4][16 tokens][4 codes]).  One vpdpbusd
 * against four weight codes broadcast from the decoded row then does four
 * codes of all 16 tokens, and a group of codes is scaled once for all 16.
 * Rows go in fours (K-quants in pairs): four groups' codes outgrow L1, and
 * each one loaded from L2 then serves four rows (one row at a time was
 * bound by L2, and so were two on a Zen 5).
 *
 * The integer sums are the exact ones of lm_dot_k_scalar and
 * lm_dot_b32_scalar and the float steps are the same, so a token gets
 * bitwise the same logits here as on the one-token paths.
 */
#include "internal.h"
#include "simd.h"

#include <string.h>

#define TG 16       /* tokens in a group: one per 32-bit lane */
#define QK_K 256

/* Bytes of one group's layout for rows of k elements (tgroup_layout). */
size_t lm_tgroup_bytes(int64_t k)
{
    size_t codes = (size_t)k * TG, d = (size_t)(k / 32) * TG * 4, s16 = (size_t)(k / 32) * TG * 4;
    return (codes + d + s16 + 3 * 64) / 64 * 64;
}

/* q and s8 share their bytes: a group is built in the one form its kernel reads. */
static void tgroup_layout(tgroup *g, int64_t k, void *base)
{
    uint8_t *p = base;
    g->q = p;
    g->s8 = (int8_t *)p;
    p += (size_t)k * TG;
    g->d = (float *)p;
    p += ((size_t)(k / 32) * TG * 4 + 63) / 64 * 64;
    g->sum16 = (int16_t *)p;
}

/*
 * Lay out up to 16 tokens' Q8_0 or Q8_K activations; absent tokens are zero.
 * Codes are stored + 128 in q (unsigned, as vpdpbusd wants them), or as they
 * are in s8 when amx (for the tiles' signed multiply): each kernel reads one.
 * The sums of 16 codes go in pairs, so one vpmaddwd weighs two groups' mins.
 */
#if defined(__x86_64__) && defined(__GNUC__)
/*
 * The codes of lm_tgroup_build, 64 codes of the 16 tokens a step: their
 * words are a 16 x 16 block, transposed in registers (not word by word).
 */
AVX512 static int tgroup_codes_avx512(uint8_t *dst, const act_row *a, int n, int64_t k, int amx)
{
    const __m512i flip = _mm512_set1_epi32(amx ? 0 : (int)0x80808080u); /* each byte + 128 */
    for (int64_t e = 0; e < k; e += 64) {
        const int words = k - e >= 64 ? 16 : (int)(k - e) / 4;
        const __mmask16 live = (__mmask16)((1u << words) - 1);
        __m512 rows[16], cols[16];
        for (int t = 0; t < TG; t++)
            rows[t] = _mm512_castsi512_ps(
                t < n ? _mm512_maskz_loadu_epi32(live, a[t].qs + e) : _mm512_setzero_si512());
        transpose16(rows, cols);
        for (int j = 0; j < words; j++)
            _mm512_storeu_si512(dst + (e / 4 + j) * TG * 4, _mm512_xor_si512(_mm512_castps_si512(cols[j]), flip));
    }
    return 1;
}
#else
static int tgroup_codes_avx512(uint8_t *dst, const act_row *a, int n, int64_t k, int amx)
{
    (void)dst, (void)a, (void)n, (void)k, (void)amx;
    return 0;
}
#endif

void lm_tgroup_build(tgroup *g, int atype, const act_row *a, int n, int64_t k, int amx, int isa,
                     void *base)
{
    const int64_t nb = k / (atype == LM_Q8_K ? QK_K : 32);
    tgroup_layout(g, k, base);
    const int fast = isa >= LM_ISA_AVX512 && tgroup_codes_avx512(g->q, a, n, k, amx);
    for (int t = 0; t < TG; t++) {
        const act_row *r = t < n ? &a[t] : NULL;
        for (int64_t e = 0; !fast && e < k; e += 4) { /* a word of 4 codes at a time */
            uint32_t w = 0;
            if (r)
                memcpy(&w, r->qs + e, 4);
            uint32_t u = w ^ 0x80808080u; /* each byte + 128 */
            if (amx)
                memcpy(g->s8 + (e / 4) * TG * 4 + t * 4, &w, 4);
            else
                memcpy(g->q + (e / 4) * TG * 4 + t * 4, &u, 4);
        }
        for (int64_t b = 0; b < nb; b++)
            g->d[b * TG + t] = r ? r->d[b] : 0.0f;
        for (int64_t p = 0; p < k / 32; p++)
            for (int i = 0; i < 2; i++)
                g->sum16[(p * TG + t) * 2 + i] = r ? r->sum16[2 * p + i] : 0;
    }
}

#if defined(__x86_64__) && defined(__GNUC__)

/*
 * The decoded row in the form the kernel reads: codes as signed bytes, and
 * the offset correction -128 * sum(codes) of every group of 16.
 */
AVX512 int lm_trow_prepare_avx512(qrow *r)
{
    const int off = lm_code_offset(r->type);
    const __m512i voff = _mm512_set1_epi8((char)off);
    int64_t e = 0;
    for (; e + 256 <= r->k; e += 256) { /* 16 groups' sums in one vector */
        __m512i u[4];
        for (int z = 0; z < 4; z++)
            u[z] = _mm512_loadu_si512(r->u + e + 64 * z);
        put_s8_256(u, off, r->s8 + e, r->corr16 + e / 16);
    }
    for (; e + 64 <= r->k; e += 64) {
        __m512i u = _mm512_loadu_si512(r->u + e);
        _mm512_storeu_si512(r->s8 + e, _mm512_sub_epi8(u, voff));
        __m512i s8x8 = _mm512_sad_epu8(u, _mm512_setzero_si512()); /* sums of 8 codes + off */
        int64_t sums[8];
        _mm512_storeu_si512(sums, s8x8);
        for (int g = 0; g < 4; g++)
            r->corr16[e / 16 + g] = -128 * ((int32_t)(sums[2 * g] + sums[2 * g + 1]) - 16 * off);
    }
    for (; e < r->k; e += 16) { /* a last 32-block */
        int32_t sum = 0;
        for (int i = 0; i < 16; i++)
            sum += r->s8[e + i] = (int8_t)(r->u[e + i] - off);
        r->corr16[e / 16] = -128 * sum;
    }
    return 1;
}

/* Four blocks' sums of 16 codes + off (two vectors of 8-byte sums) as -128 * (sum - 16 * off). */
AVX512 static INLINE __m256i b32_corr8(__m512i sad_a, __m512i sad_b, int off)
{
    const __m512i even = _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0);
    __m512i s16a = _mm512_add_epi64(sad_a, _mm512_bsrli_epi128(sad_a, 8));
    __m512i s16b = _mm512_add_epi64(sad_b, _mm512_bsrli_epi128(sad_b, 8));
    __m256i sums = _mm512_cvtepi64_epi32(_mm512_permutex2var_epi64(s16a, even, s16b));
    return _mm256_mullo_epi32(_mm256_sub_epi32(sums, _mm256_set1_epi32(16 * off)), _mm256_set1_epi32(-128));
}

/*
 * Blocks b..b+3 as unsigned codes + off (x: blocks b, b+1; y: b+2, b+3,
 * 32 codes each) into the form the groups read: signed codes and
 * -128 * (sum of every 16).
 */
AVX512 static INLINE void put_b32_4(__m512i x, __m512i y, int off, int8_t *s8, int32_t *corr16, int64_t b)
{
    const __m512i voff = _mm512_set1_epi8((char)off);
    _mm512_storeu_si512(s8 + b * 32, _mm512_sub_epi8(x, voff));
    _mm512_storeu_si512(s8 + b * 32 + 64, _mm512_sub_epi8(y, voff));
    _mm256_storeu_si256((__m256i *)(corr16 + 2 * b),
                        b32_corr8(_mm512_sad_epu8(x, _mm512_setzero_si512()), _mm512_sad_epu8(y, _mm512_setzero_si512()), off));
}

/*
 * The nibbles of four blocks whose 16 nibble bytes fill the four 128-bit
 * lanes of q, in code order: blocks 0 and 1 into *x, 2 and 3 into *y.
 */
AVX512 static INLINE void nibbles_4(__m512i q, __m512i *x, __m512i *y)
{
    const __m512i lo_hi_a = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), lo_hi_b = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
    const __m512i nib = _mm512_set1_epi8(15);
    __m512i lo = _mm512_and_si512(q, nib), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), nib);
    *x = _mm512_permutex2var_epi64(lo, lo_hi_a, hi);
    *y = _mm512_permutex2var_epi64(lo, lo_hi_b, hi);
}

/* Q4_0 blocks b..b+3 whose 16 nibble bytes fill the four 128-bit lanes of q, put as put_b32_4 puts them. */
AVX512 static INLINE void put_q4_0_4(__m512i q, int8_t *s8, int32_t *corr16, int64_t b)
{
    __m512i x, y;
    nibbles_4(q, &x, &y);
    put_b32_4(x, y, 8, s8, corr16, b);
}

/* Q5_0 blocks b..b+3 from p (22 bytes each: scale, 32 fifth bits, nibbles), put as put_b32_4 puts them. */
AVX512 static INLINE void put_q5_0_4(const uint8_t *p, int8_t *s8, int32_t *corr16, int64_t b)
{
    __m512i q = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p + 6)));
    q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(p + 28)), 1);
    q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(p + 50)), 2);
    q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(p + 72)), 3);
    uint32_t qh[4];
    for (int i = 0; i < 4; i++)
        memcpy(&qh[i], p + 22 * i + 2, 4);
    __m512i x, y;
    nibbles_4(q, &x, &y);
    const __m512i fifth = _mm512_set1_epi8(16); /* bit i of a block's qh is code i's */
    x = _mm512_or_si512(x, _mm512_maskz_mov_epi8(qh[0] | (uint64_t)qh[1] << 32, fifth));
    y = _mm512_or_si512(y, _mm512_maskz_mov_epi8(qh[2] | (uint64_t)qh[3] << 32, fifth));
    put_b32_4(x, y, 16, s8, corr16, b);
}

/*
 * A step's worth of prepared blocks, for a row's last blocks: the step is
 * put there whole and only the row's blocks are kept (keep_blocks).
 */
typedef struct b32_room {
    int8_t s8[32 * 16];
    int32_t corr16[2 * 16];
    float d[16];
} b32_room;

/* The first m blocks of room into a row's prepared codes, corrections and scales from its block b on. */
static void keep_blocks(const b32_room *room, size_t m, int8_t *s8, int32_t *corr16, float *d)
{
    memcpy(s8, room->s8, 32 * m);
    memcpy(corr16, room->corr16, 2 * sizeof(int32_t) * m);
    memcpy(d, room->d, sizeof(float) * m);
}

/*
 * A step of m <= 16 Q4_0 blocks in the lanes layout (repack.c: vector q,
 * 4m bytes, holds nibble bytes 4q..4q+3 of block j at 4j, then the m
 * scales) put as the file's blocks would be: the four vectors transposed,
 * dword by dword, into four blocks a vector (two rounds of permutes),
 * then the same steps.  A short step (a row's last blocks) is loaded
 * masked, so blocks m..15 come out as zero nibbles the caller drops.
 */
AVX512 static INLINE void q4_0_lanes_step(const uint8_t *st, int m, int8_t *s8, int32_t *corr16, float *d)
{
    /* round 1: dwords j of two vectors side by side (lanes 0-7, then 8-15); round 2: their pairs, four blocks a vector */
    const __m512i pair_lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i pair_hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    const __m512i quad_lo = _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0), quad_hi = _mm512_set_epi64(15, 7, 14, 6, 13, 5, 12, 4);
    const __mmask16 have = (__mmask16)((1u << m) - 1);
    const uint8_t *c = st + lm_lanes_codes(LM_Q4_0, st, m);
    const __m512i v0 = _mm512_maskz_loadu_epi32(have, c), v1 = _mm512_maskz_loadu_epi32(have, c + 4 * m);
    const __m512i v2 = _mm512_maskz_loadu_epi32(have, c + 8 * m), v3 = _mm512_maskz_loadu_epi32(have, c + 12 * m);
    const __m512i a_lo = _mm512_permutex2var_epi32(v0, pair_lo, v1), a_hi = _mm512_permutex2var_epi32(v0, pair_hi, v1);
    const __m512i c_lo = _mm512_permutex2var_epi32(v2, pair_lo, v3), c_hi = _mm512_permutex2var_epi32(v2, pair_hi, v3);
    put_q4_0_4(_mm512_permutex2var_epi64(a_lo, quad_lo, c_lo), s8, corr16, 0);
    put_q4_0_4(_mm512_permutex2var_epi64(a_lo, quad_hi, c_lo), s8, corr16, 4);
    put_q4_0_4(_mm512_permutex2var_epi64(a_hi, quad_lo, c_hi), s8, corr16, 8);
    put_q4_0_4(_mm512_permutex2var_epi64(a_hi, quad_hi, c_hi), s8, corr16, 12);
    _mm512_storeu_ps(d, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(have, st + lm_lanes_scales(LM_Q4_0, st, m))));
}

/*
 * A Q4_0 row in the lanes layout put as the file's, step by step.  The
 * last blocks' short step goes through a step's worth of room and only
 * its blocks are kept: block by block in scalar code, the 12 last blocks
 * of qwen2.5-0.5b's rows of 896 had taken 28% of its 512-token prompts.
 */
AVX512 static void q4_0_lanes_prepare(const uint8_t *row, int64_t nb, int8_t *s8, int32_t *corr16, float *d)
{
    int64_t b = 0;
    for (; b + 16 <= nb; b += 16)
        q4_0_lanes_step(row + 18 * b, 16, s8 + 32 * b, corr16 + 2 * b, d + b);
    if (b < nb) {
        const int m = (int)(nb - b);
        b32_room room;
        q4_0_lanes_step(row + 18 * b, m, room.s8, room.corr16, room.d);
        keep_blocks(&room, (size_t)m, s8 + 32 * b, corr16 + 2 * b, d + b);
    }
}

/*
 * The index of a round of q8_0_lanes_step: output lane l of the pair's
 * vector t takes this lane of the two inputs (the second's from 16).
 */
AVX512 static INLINE __m512i q8_0_round(int round, int t)
{
    int32_t ix[16];
    for (int l = 0; l < 16; l++)
        ix[l] = round == 0   ? 16 * (l >> 3) + 8 * t + (l & 7)
                : round == 1 ? 16 * (l >> 2 & 1) + 8 * (l >> 3) + 4 * t + (l & 3)
                             : 16 * (l & 1) + 8 * (l >> 2 & 1) + 4 * (l >> 1 & 1) + 2 * t + (l >> 3);
    return _mm512_loadu_si512(ix);
}

/*
 * A whole Q8_0 step in the lanes layout (repack.c: vector q holds codes
 * 4q..4q+3 of block j in dword j, then the 16 scales) put as the file's
 * blocks would be.  With element (q, j) at vector q, lane j, each round
 * of two-table permutes trades a bit of the vector's index (q2, then q1,
 * then q0) for one of the lane's (j3, j2, j1), the last also putting the
 * lane's bits in order, so that vector p ends holding blocks 2p and 2p + 1.
 */
AVX512 static INLINE void q8_0_lanes_step(const uint8_t *st, int8_t *s8, int32_t *corr16, float *d)
{
    __m512i u[8], a[8], b[8], x[8];
#pragma GCC unroll 8
    for (int q = 0; q < 8; q++)
        u[q] = _mm512_loadu_si512(st + lm_lanes_codes(LM_Q8_0, st, 16) + 64 * q);
    const __m512i a0 = q8_0_round(0, 0), a1 = q8_0_round(0, 1);
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) { /* a[4 j3 + q]: lanes (q2 j2 j1 j0) */
        a[q] = _mm512_permutex2var_epi32(u[q], a0, u[q + 4]);
        a[q + 4] = _mm512_permutex2var_epi32(u[q], a1, u[q + 4]);
    }
    const __m512i b0 = q8_0_round(1, 0), b1 = q8_0_round(1, 1);
#pragma GCC unroll 2
    for (int j3 = 0; j3 < 2; j3++) /* b[4 j3 + 2 j2 + q0]: lanes (q2 q1 j1 j0) */
#pragma GCC unroll 2
        for (int q0 = 0; q0 < 2; q0++) {
            b[4 * j3 + q0] = _mm512_permutex2var_epi32(a[4 * j3 + q0], b0, a[4 * j3 + 2 + q0]);
            b[4 * j3 + 2 + q0] = _mm512_permutex2var_epi32(a[4 * j3 + q0], b1, a[4 * j3 + 2 + q0]);
        }
    const __m512i c0 = q8_0_round(2, 0), c1 = q8_0_round(2, 1), flip = _mm512_set1_epi8((char)0x80);
#pragma GCC unroll 4
    for (int p = 0; p < 8; p += 2) { /* x[p]: lanes (j0 q2 q1 q0), blocks 2p and 2p + 1 */
        x[p] = _mm512_xor_si512(_mm512_permutex2var_epi32(b[p], c0, b[p + 1]), flip);
        x[p + 1] = _mm512_xor_si512(_mm512_permutex2var_epi32(b[p], c1, b[p + 1]), flip);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        put_b32_4(x[2 * i], x[2 * i + 1], 128, s8, corr16, 4 * i);
    _mm512_storeu_ps(d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(st + lm_lanes_scales(LM_Q8_0, st, 16)))));
}

/* Blocks b..b+3 of type t (bb bytes each) from p, put as put_b32_4 puts them, and their scales. */
AVX512 static INLINE void b32_step4(uint32_t t, const uint8_t *p, int bb, int8_t *s8, int32_t *corr16, float *d,
                                    int64_t b)
{
    if (t == LM_Q5_0) {
        put_q5_0_4(p, s8, corr16, b);
    } else if (t == LM_Q4_0) {
        __m512i q = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p + 2)));
        q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(p + 20)), 1);
        q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(p + 38)), 2);
        q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(p + 56)), 3);
        put_q4_0_4(q, s8, corr16, b);
    } else { /* signed codes + 128 */
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 2))),
                                       _mm256_loadu_si256((const __m256i *)(p + 36)), 1);
        __m512i y = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 70))),
                                       _mm256_loadu_si256((const __m256i *)(p + 104)), 1);
        put_b32_4(_mm512_xor_si512(x, flip), _mm512_xor_si512(y, flip), 128, s8, corr16, b);
    }
    uint16_t h[4];
    for (int i = 0; i < 4; i++)
        memcpy(&h[i], p + i * bb, 2);
    _mm_storeu_ps(d + b, _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)h))); /* exact, as lm_f16_to_f32 */
}

/*
 * A Q4_0, Q5_0 or Q8_0 row straight from the file (or a Q4_0 or Q8_0 row
 * in its lanes layout, t = LM_Q4_0_LANES, LM_Q8_0_LANES) into the form the groups read (what
 * lm_qrow_decode and lm_trow_prepare_avx512 make of it, in one pass):
 * codes as signed bytes, -128 * (sum of every 16), and the block scales.
 * A row's last 1-3 blocks go through a step's worth of room: block by
 * block in scalar code, smollm2's Q5_0 rows of 18 blocks took longer than
 * decoding and preparing them apart (pp64 1500-1594 -> 1263-1287 t/s).
 * Returns 0 for other types.
 */
AVX512 int lm_row_b32_prepare(uint32_t t, const uint8_t *row, int64_t k, qrow *r)
{
    if (t != LM_Q4_0 && t != LM_Q5_0 && t != LM_Q8_0 && t != LM_Q4_0_LANES && t != LM_Q8_0_LANES)
        return 0;
    const int64_t nb = k / 32;
    int8_t *s8 = r->s8; /* locals: the stores below cannot then move r's pointers */
    int32_t *corr16 = r->corr16;
    float *d = r->d;
    r->type = t == LM_Q4_0_LANES ? LM_Q4_0 : t == LM_Q8_0_LANES ? LM_Q8_0 : t, r->k = k;
    if (t == LM_Q4_0_LANES) {
        q4_0_lanes_prepare(row, nb, s8, corr16, d);
        return 1;
    }
    int64_t b = 0;
    if (t == LM_Q8_0_LANES) /* its whole steps; the blocks past them are the file's */
        for (t = LM_Q8_0; b + 16 <= nb; b += 16)
            q8_0_lanes_step(row + 34 * b, s8 + 32 * b, corr16 + 2 * b, d + b);
    const int bb = (int)lm_type_size(t); /* bytes a block */
    for (; b + 4 <= nb; b += 4)
        b32_step4(t, row + b * bb, bb, s8, corr16, d, b);
    if (b < nb) {
        uint8_t blocks[4 * 34] = {0}; /* four of the largest blocks, Q8_0's */
        const size_t m = (size_t)(nb - b);
        memcpy(blocks, row + b * bb, m * (size_t)bb);
        b32_room room;
        b32_step4(t, blocks, bb, room.s8, room.corr16, room.d, 0);
        keep_blocks(&room, m, s8 + 32 * b, corr16 + 2 * b, d + b);
    }
    return 1;
}

/* sum over the 16 groups of super-block b of min * (sum of 16 codes), per token. */
AVX512 static INLINE __m512i group_mins(const int16_t *mn, const tgroup *g, int64_t b)
{
    __m512i m = _mm512_setzero_si512();
    for (int p = 0; p < 8; p++) {
        int64_t gi = b * 16 + 2 * p;
        uint32_t pair = (uint16_t)mn[gi] | ((uint32_t)(uint16_t)mn[gi + 1] << 16);
        __m512i s = _mm512_loadu_si512(g->sum16 + (b * 8 + p) * TG * 2);
        m = _mm512_add_epi32(m, _mm512_madd_epi16(s, _mm512_set1_epi32((int)pair)));
    }
    return m;
}

/*
 * nr (1 or 2) prepared rows against ng groups (ng x 16 tokens): each token
 * word is loaded once for both rows and each weight word broadcast once for
 * all groups.  The activations of four groups outgrow L1, so sharing their
 * loads between two rows halves what comes from L2, which bounds the kernel.
 * span: codes that share one scale.  Super-block b goes into lane b % 4 of
 * lm_dot_k_scalar's sums, kept in memory: four lanes of every row and
 * group would not fit the registers, and taking the blocks lane by lane
 * (b = l, l + 4, ...) cost more, as its reads of the groups go 16 KiB apart.
 */
AVX512 static INLINE void rows_groups(const qrow *const *r, int nr, const tgroup *const *g, int ng, int span,
                                      int has_mins, float *const *out)
{
    /* [row][group][lane], set by each lane's first super-block (zeroing all first cost 3% of a call) */
    __m512 sums[2][4][LM_K_LANES], mins[2][4][LM_K_LANES];
    const __m512 zero = _mm512_setzero_ps();
    const int64_t nb = r[0]->k / QK_K;
    for (int64_t b = 0; b < nb; b++) {
        const int l = (int)(b % LM_K_LANES), fresh = b < LM_K_LANES;
        __m512i isum[2][4];
        _Pragma("GCC unroll 2")
        for (int i = 0; i < nr; i++)
            _Pragma("GCC unroll 4")
            for (int j = 0; j < ng; j++)
                isum[i][j] = _mm512_setzero_si512();
        for (int64_t e = b * QK_K; e < (b + 1) * QK_K; e += span) {
            __m512i v[2][4];
            _Pragma("GCC unroll 2")
            for (int i = 0; i < nr; i++) {
                int32_t corr = r[i]->corr16[e / 16] + (span == 32 ? r[i]->corr16[e / 16 + 1] : 0);
                _Pragma("GCC unroll 4")
                for (int j = 0; j < ng; j++)
                    v[i][j] = _mm512_set1_epi32(corr);
            }
            _Pragma("GCC unroll 8")
            for (int q = 0; q < span; q += 4) {
                __m512i w[2];
                _Pragma("GCC unroll 2")
                for (int i = 0; i < nr; i++) {
                    int32_t w4;
                    memcpy(&w4, r[i]->s8 + e + q, 4);
                    w[i] = _mm512_set1_epi32(w4);
                }
                _Pragma("GCC unroll 4")
                for (int j = 0; j < ng; j++) {
                    __m512i a = _mm512_loadu_si512(g[j]->q + (e + q) * TG);
                    _Pragma("GCC unroll 2")
                    for (int i = 0; i < nr; i++)
                        v[i][j] = _mm512_dpbusd_epi32(v[i][j], a, w[i]);
                }
            }
            _Pragma("GCC unroll 2")
            for (int i = 0; i < nr; i++) {
                __m512i sc = _mm512_set1_epi32(r[i]->sc4[e / 4]);
                _Pragma("GCC unroll 4")
                for (int j = 0; j < ng; j++)
                    isum[i][j] = _mm512_add_epi32(isum[i][j], _mm512_mullo_epi32(v[i][j], sc));
            }
        }
        _Pragma("GCC unroll 2")
        for (int i = 0; i < nr; i++) {
            __m512 dw = _mm512_set1_ps(r[i]->d[b]), mw = _mm512_set1_ps(r[i]->m[b]);
            _Pragma("GCC unroll 4")
            for (int j = 0; j < ng; j++) {
                __m512 da = _mm512_loadu_ps(g[j]->d + b * TG);
                sums[i][j][l] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(isum[i][j]),
                                                fresh ? zero : sums[i][j][l]);
                if (has_mins) {
                    __m512 mm = _mm512_mul_ps(mw, da);
                    __m512i ms = group_mins(r[i]->mn, g[j], b);
                    mins[i][j][l] = _mm512_add_ps(fresh ? zero : mins[i][j][l],
                                                  _mm512_mul_ps(mm, _mm512_cvtepi32_ps(ms)));
                }
            }
        }
    }
    const __m512 none[LM_K_LANES] = {zero, zero, zero, zero}; /* Q6_K's mins */
    _Pragma("GCC unroll 2")
    for (int i = 0; i < nr; i++)
        _Pragma("GCC unroll 4")
        for (int j = 0; j < ng; j++) {
            for (int64_t l = nb; l < LM_K_LANES; l++) /* rows of fewer than four super-blocks */
                sums[i][j][l] = mins[i][j][l] = zero;
            _mm512_storeu_ps(out[i] + 16 * j, k_total16(sums[i][j], has_mins ? mins[i][j] : none));
        }
}

/*
 * Q4_0, Q5_0 and Q8_0 rows: a block's sum per token, scaled, into lane
 * b % 16 of lm_dot_b32_scalar's accumulators, then its tree.  The blocks of
 * one lane are taken together (b = l, l + 16, ...), in the same order as
 * there, so that lane's sums stay in registers: 16 lanes of every row and
 * group would not.  nr <= 4 rows share each token load.
 */
AVX512 static INLINE void rows_groups_b32(const qrow *const *r, int nr, const tgroup *const *g, int ng,
                                          float *const *out)
{
    const int64_t nb = r[0]->k / 32;
    __m512 lanes[4][4][16];
    for (int l = 0; l < 16; l++) {
        __m512 acc[4][4];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < nr; i++)
            _Pragma("GCC unroll 4")
            for (int j = 0; j < ng; j++)
                acc[i][j] = _mm512_setzero_ps();
        for (int64_t b = l; b < nb; b += 16) {
            __m512i v[4][4];
            _Pragma("GCC unroll 4")
            for (int i = 0; i < nr; i++)
                _Pragma("GCC unroll 4")
                for (int j = 0; j < ng; j++)
                    v[i][j] = _mm512_set1_epi32(r[i]->corr16[2 * b] + r[i]->corr16[2 * b + 1]);
            _Pragma("GCC unroll 8")
            for (int q = 0; q < 32; q += 4) {
                __m512i w[4];
                _Pragma("GCC unroll 4")
                for (int i = 0; i < nr; i++) {
                    int32_t w4;
                    memcpy(&w4, r[i]->s8 + b * 32 + q, 4);
                    w[i] = _mm512_set1_epi32(w4);
                }
                _Pragma("GCC unroll 4")
                for (int j = 0; j < ng; j++) {
                    __m512i a = _mm512_loadu_si512(g[j]->q + (b * 32 + q) * TG);
                    _Pragma("GCC unroll 4")
                    for (int i = 0; i < nr; i++)
                        v[i][j] = _mm512_dpbusd_epi32(v[i][j], a, w[i]);
                }
            }
            _Pragma("GCC unroll 4")
            for (int i = 0; i < nr; i++) {
                __m512 dw = _mm512_set1_ps(r[i]->d[b]);
                _Pragma("GCC unroll 4")
                for (int j = 0; j < ng; j++) {
                    __m512 dd = _mm512_mul_ps(dw, _mm512_loadu_ps(g[j]->d + b * TG));
                    acc[i][j] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(v[i][j]), acc[i][j]);
                }
            }
        }
        _Pragma("GCC unroll 4")
        for (int i = 0; i < nr; i++)
            _Pragma("GCC unroll 4")
            for (int j = 0; j < ng; j++)
                lanes[i][j][l] = acc[i][j];
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < nr; i++)
        _Pragma("GCC unroll 4")
        for (int j = 0; j < ng; j++)
            _mm512_storeu_ps(out[i] + 16 * j, hsum16_lanes(lanes[i][j]));
}

/* K-quant rows.  Q4_K and Q5_K share a scale between two groups of 16, so
   they scale 32 codes at once (constant spans: the loops unroll). */
AVX512 static INLINE void rows_groups_k(const qrow *const *r, int nr, const tgroup *const *g, int ng,
                                        float *const *out)
{
    const int has_mins = lm_k_has_mins(r[0]->type);
    if (r[0]->type == LM_Q4_K || r[0]->type == LM_Q5_K)
        rows_groups(r, nr, g, ng, 32, has_mins, out);
    else
        rows_groups(r, nr, g, ng, 16, has_mins, out);
}

/* The group count as a constant, so that the kernels' loops unroll. */
AVX512 static INLINE void b32_groups_n(const qrow *const *r, int nr, const tgroup *const *g, int ng,
                                       float *const *out)
{
    switch (ng) {
    case 1: rows_groups_b32(r, nr, g, 1, out); break;
    case 2: rows_groups_b32(r, nr, g, 2, out); break;
    case 3: rows_groups_b32(r, nr, g, 3, out); break;
    default: rows_groups_b32(r, nr, g, 4, out);
    }
}

AVX512 static INLINE void k_groups_n(const qrow *const *r, int nr, const tgroup *const *g, int ng,
                                     float *const *out)
{
    switch (ng) {
    case 1: rows_groups_k(r, nr, g, 1, out); break;
    case 2: rows_groups_k(r, nr, g, 2, out); break;
    case 3: rows_groups_k(r, nr, g, 3, out); break;
    default: rows_groups_k(r, nr, g, 4, out);
    }
}

/*
 * nr prepared rows of one type against ng <= 4 groups: out[i][16 * j + t]
 * for row i, token t of group j.  Rows of 32-element blocks go four at a
 * time (each token load then serves four rows); K-quant rows two at a time,
 * since the sums of four would not stay in registers.
 */
AVX512 int lm_trow_groups_avx512(const qrow *const *r, int nr, const tgroup *const *g, int ng, float *const *out)
{
    int i = 0;
    if (lm_act_type(r[0]->type) == LM_Q8_0) {
        for (; nr - i >= 4; i += 4)
            b32_groups_n(r + i, 4, g, ng, out + i);
        for (; nr - i >= 2; i += 2)
            b32_groups_n(r + i, 2, g, ng, out + i);
        if (i < nr)
            b32_groups_n(r + i, 1, g, ng, out + i);
        return 1;
    }
    for (; nr - i >= 2; i += 2)
        k_groups_n(r + i, 2, g, ng, out + i);
    if (i < nr)
        k_groups_n(r + i, 1, g, ng, out + i);
    return 1;
}

/* Rows m = 0..15 of stage (stage[m * sld + t]) stored token by token: out[ldo * t + m], t < n. */
AVX512 void lm_store_rows16(const float *stage, size_t sld, float *out, size_t ldo, int n)
{
    for (int t0 = 0; t0 < n; t0 += 16) {
        __m512 r[16];
#pragma GCC unroll 16
        for (int m = 0; m < 16; m++)
            r[m] = _mm512_loadu_ps(stage + (size_t)m * sld + t0);
        store_rows_by_token(r, out + ldo * (size_t)t0, ldo, n - t0 < 16 ? n - t0 : 16);
    }
}

#else

int lm_trow_prepare_avx512(qrow *r)
{
    (void)r;
    return 0; /* no such path here: the caller uses the one-token kernels */
}

int lm_trow_groups_avx512(const qrow *const *r, int nr, const tgroup *const *g, int ng, float *const *out)
{
    (void)r, (void)nr, (void)g, (void)ng, (void)out;
    return 0;
}

int lm_row_b32_prepare(uint32_t t, const uint8_t *row, int64_t k, qrow *r)
{
    (void)t, (void)row, (void)k, (void)r;
    return 0;
}

void lm_store_rows16(const float *stage, size_t sld, float *out, size_t ldo, int n)
{
    for (int t = 0; t < n; t++)
        for (int m = 0; m < 16; m++)
            out[ldo * (size_t)t + m] = stage[(size_t)m * sld + t];
}

#endif
