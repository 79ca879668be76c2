/*
 * lm/qgemm_amx.c - 16 rows against a group of 16 tokens with AMX tiles,
 * for the 32-element block types (Q4_0, Q5_0, Q8_0) and the K-quants, where
 * the CPU has AMX-INT8 and the kernel lets the process use it.
 *
 * qgemm.c's kernel spends one vpdpbusd per 4 codes of 16 tokens.  Here
 * one tile multiply (TDPBSSD) takes a whole 32-element block of 16 rows
 * and 16 tokens: the rows' signed codes are tile A ([16 rows][32 codes]),
 * the tokens' signed codes are tile B, in the token group's layout
 * ([8][16 tokens][4 codes]), and tile C gets the 256 exact integer sums,
 * those qgemm.c's row_groups_b32 reaches through unsigned codes and an
 * offset correction.  They go through its float steps in the same order
 * (times row scale * token scale, into lane b % 16, then the lane tree), so
 * the logits are bitwise those of every other path.  Q8_0 rows are read
 * where they lie in the mapped file.  K-quant rows go in as each code times
 * its group's scale, split into two signed bytes (v = 128 hi + lo), so the
 * tiles sum a whole super-block exactly; its float steps are qgemm.c's.
 */
#include "internal.h"
#include "simd.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
/* s8[i] = u[i] - off: unsigned codes as the signed bytes the tiles multiply. */
AVX512 static void codes_s8(int8_t *s8, const uint8_t *u, int64_t k, uint8_t off)
{
    const __m512i o = _mm512_set1_epi8((char)off);
    int64_t i = 0;
    for (; i + 64 <= k; i += 64)
        _mm512_storeu_si512(s8 + i, _mm512_sub_epi8(_mm512_loadu_si512(u + i), o));
    __mmask64 tail = k - i > 0 ? ~0ull >> (64 - (k - i)) : 0;
    _mm512_mask_storeu_epi8(s8 + i, tail, _mm512_sub_epi8(_mm512_maskz_loadu_epi8(tail, u + i), o));
}
#else
static void codes_s8(int8_t *s8, const uint8_t *u, int64_t k, uint8_t off)
{
    for (int64_t i = 0; i < k; i++)
        s8[i] = (int8_t)(uint8_t)(u[i] - off);
}
#endif

/*
 * K-quant codes times their group's scale, v = (u - off) * scale (|v| <= 4096),
 * as two signed bytes: lo = v & 127 and hi = v >> 7, so v = 128 hi + lo.  A
 * tile multiply of each against the tokens then sums a whole super-block,
 * whatever its groups' scales, in exact integers.
 */
#if defined(__x86_64__) && defined(__GNUC__)
AVX512 static void scaled_codes(int8_t *lo, int8_t *hi, const qrow *r, int64_t k)
{
    const __m512i off = _mm512_set1_epi16((short)lm_code_offset(r->type)), m7 = _mm512_set1_epi16(127);
    /* word i of a 32-code step takes scale i / 4 of its 8 */
    const __m512i rep = _mm512_set_epi16(7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4,
                                         3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    for (int64_t i = 0; i < k; i += 32) {
        __m512i u = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(r->u + i)));
        __m512i sc = _mm512_castsi256_si512(_mm256_castsi128_si256(
            _mm256_cvtepi32_epi16(_mm256_loadu_si256((const __m256i *)(r->sc4 + i / 4)))));
        __m512i v = _mm512_mullo_epi16(_mm512_sub_epi16(u, off), _mm512_permutexvar_epi16(rep, sc));
        _mm256_storeu_si256((__m256i *)(lo + i), _mm512_cvtepi16_epi8(_mm512_and_si512(v, m7)));
        _mm256_storeu_si256((__m256i *)(hi + i), _mm512_cvtepi16_epi8(_mm512_srai_epi16(v, 7)));
    }
}
#else
static void scaled_codes(int8_t *lo, int8_t *hi, const qrow *r, int64_t k)
{
    const int off = lm_code_offset(r->type);
    for (int64_t i = 0; i < k; i++) {
        int v = ((int)r->u[i] - off) * r->sc4[i / 4];
        lo[i] = (int8_t)(v & 127), hi[i] = (int8_t)(v >> 7);
    }
}
#endif

/* K-quants whose groups also have mins (subtracted as min * sum of codes). */
int lm_k_has_mins(uint32_t type)
{
    return type == LM_Q2_K || type == LM_Q4_K || type == LM_Q5_K;
}

void lm_rows16_put(rows16 *p, int m, const qrow *r)
{
    const int64_t k = p->k;
    if (lm_act_type(r->type) == LM_Q8_0) {
        codes_s8(p->s8 + (size_t)m * p->stride, r->u, k, (uint8_t)lm_code_offset(r->type));
        memcpy(p->d + m * (k / 32), r->d, (size_t)(k / 32) * sizeof *p->d);
        return;
    }
    scaled_codes(p->s8 + (size_t)m * p->stride, p->s8hi + (size_t)m * p->stride, r, k);
    const int64_t nsb = k / 256;
    memcpy(p->d + m * nsb, r->d, (size_t)nsb * sizeof *p->d);
    memcpy(p->m + m * nsb, r->m, (size_t)nsb * sizeof *p->m);
    memcpy(p->mn + m * (k / 16), r->mn, (size_t)(k / 16) * sizeof *p->mn);
}

#if defined(__x86_64__) && defined(__GNUC__)
/* A Q4_0 block's 32 codes as signed bytes: byte j holds codes j (low nibble) and j + 16. */
AVX512 static INLINE __m256i q4_0_s8(const uint8_t *blk)
{
    __m128i x = _mm_loadu_si128((const __m128i *)(blk + 2)), m4 = _mm_set1_epi8(0x0f);
    __m256i u = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m4), _mm_and_si128(x, m4));
    return _mm256_sub_epi8(u, _mm256_set1_epi8(8));
}

/* d[b] = the f16 scale opening block b (bs bytes apart) of a row, 16 blocks a gather. */
AVX512 static void block_scales(float *d, const uint8_t *row, int bs, int64_t nb)
{
    const __m512i at = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(bs));
    for (int64_t b = 0; b < nb; b += 16) {
        __mmask16 live = (__mmask16)(nb - b >= 16 ? 0xffff : (1u << (nb - b)) - 1);
        __m512i h = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, at, row + b * bs, 1);
        _mm512_mask_storeu_ps(d + b, live, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h)));
    }
}

/*
 * A step of a rearranged Q4_0 row (repack.c: dword j of vector q holds
 * nibble bytes 4q..4q+3 of block j) as 16 blocks of 32 signed codes at s8,
 * and their scales at d: the low nibbles' 4 vectors give each block's codes
 * 0-15, the high ones' 16-31 (unpacking each row to the file's layout
 * first cost a 14-token prompt 40% on tinyllama Q4_0).
 */
AVX512 static INLINE void q4_0_lanes_s8(int8_t *s8, float *d, const uint8_t *step)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), eight = _mm512_set1_epi8(8);
    __m512i lo[4], hi[4], a[4], b[4];
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        const __m512i x = _mm512_loadu_si512(step + lm_lanes_codes(LM_Q4_0, step, 16) + 64 * q);
        lo[q] = _mm512_sub_epi8(_mm512_and_si512(x, m4), eight);
        hi[q] = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(x, 4), m4), eight);
    }
    dwords_4x16(lo, a); /* a[r]'s chunk c: codes 0-15 of block 4c + r */
    dwords_4x16(hi, b);
    const __m512i first = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), last = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        const __m512i z0 = _mm512_permutex2var_epi64(a[r], first, b[r]); /* blocks r, 4 + r */
        const __m512i z1 = _mm512_permutex2var_epi64(a[r], last, b[r]);  /* blocks 8 + r, 12 + r */
        _mm256_storeu_si256((__m256i *)(s8 + 32 * r), _mm512_castsi512_si256(z0));
        _mm256_storeu_si256((__m256i *)(s8 + 32 * (4 + r)), _mm512_extracti64x4_epi64(z0, 1));
        _mm256_storeu_si256((__m256i *)(s8 + 32 * (8 + r)), _mm512_castsi512_si256(z1));
        _mm256_storeu_si256((__m256i *)(s8 + 32 * (12 + r)), _mm512_extracti64x4_epi64(z1, 1));
    }
    _mm512_storeu_ps(d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(step + lm_lanes_scales(LM_Q4_0, step, 16)))));
}

/*
 * Q4_0 rows go into slot m straight from the file (or rearranged,
 * LM_Q4_0_LANES): the codes are the decoder's minus the offset, the scales
 * the same f16 values, so the slot holds what lm_rows16_put would copy.
 * Q4_K, Q5_K and Q6_K rows too, by qrow_k.c's decoders.  0 for other types.
 */
AVX512 int lm_rows16_put_raw(rows16 *p, int m, uint32_t type, const uint8_t *row)
{
    const int64_t nsb = p->k / 256;
    if (lm_row_k_scaled(type, row, p->k, p->s8 + (size_t)m * p->stride, p->s8hi + (size_t)m * p->stride,
                        p->d + m * nsb, p->m + m * nsb, p->mn + m * (p->k / 16)))
        return 1;
    if (type != LM_Q4_0 && type != LM_Q4_0_LANES)
        return 0;
    const int64_t nb = p->k / 32;
    int8_t *s8 = p->s8 + (size_t)m * p->stride;
    lm_prefetch_ahead(row, (size_t)nb * 18, 16, LM_PREFETCH_BATCH); /* the rows after this one, which come next */
    int64_t b = 0;
    uint8_t tail[18 * 16];
    if (type == LM_Q4_0_LANES) /* whole steps of 16 blocks, then the last blocks' step in the file's order */
        for (; b + 16 <= nb; b += 16)
            q4_0_lanes_s8(s8 + 32 * b, p->d + m * nb + b, row + (size_t)b * 18);
    const uint8_t *rest = row + (size_t)b * 18; /* blocks b.. */
    if (type == LM_Q4_0_LANES && b < nb) {
        lm_q4_0_step_from_lanes(rest, tail, (int)(nb - b));
        rest = tail;
    }
    for (int64_t i = b; i < nb; i++)
        _mm256_storeu_si256((__m256i *)(s8 + 32 * i), q4_0_s8(rest + (size_t)(i - b) * 18));
    if (b < nb)
        block_scales(p->d + m * nb + b, rest, 18, nb - b);
    return 1;
}

/*
 * Q8_0 codes are already the signed bytes the tiles multiply, 32 to a
 * block after its f16 scale: the tiles read them in the mapped file, 34
 * bytes a block, and only the scales are converted, 16 blocks a gather.
 */
AVX512 void lm_rows16_point_q8_0(rows16 *p, const uint8_t *row0, size_t rb)
{
    const int64_t nb = p->k / 32;
    p->a = (const int8_t *)row0 + 2, p->astride = rb, p->ablk = 34;
    for (int m = 0; m < 16; m++)
        block_scales(p->d + m * nb, row0 + m * rb, 34, nb);
}
#else
int lm_rows16_put_raw(rows16 *p, int m, uint32_t type, const uint8_t *row)
{
    (void)p, (void)m, (void)type, (void)row;
    return 0;
}

void lm_rows16_point_q8_0(rows16 *p, const uint8_t *row0, size_t rb)
{
    (void)p, (void)row0, (void)rb; /* never called: no AMX here */
}
#endif

void lm_rows16_use_s8(rows16 *p)
{
    p->a = p->s8, p->astride = p->stride, p->ablk = 32;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX X86_TARGET("amx-tile,amx-int8,avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")

#define ARCH_REQ_XCOMP_PERM 0x1023 /* Linux: ask to use an XSAVE feature */
#define XFEATURE_XTILEDATA 18

/*
 * CPUID for AMX-TILE and AMX-INT8, XCR0 for the OS saving tile state, and
 * Linux's permission for this process to use it (asked once; granting it
 * again is harmless).
 */
int lm_cpu_amx(void)
{
#ifdef LM_EMULATE_AVX512 /* tests/avx512emu: tiles emulated for a Sapphire Rapids */
    const char *emu = getenv("KVCHAT_EMULATE");
    return lm_cpu_isa() >= LM_ISA_AVX512 && emu && !strcmp(emu, "spr");
#endif
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) /* OSXSAVE */
        return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 24) & 1) || !((d >> 25) & 1))
        return 0;
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17))
        return 0;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

/* LDTILECFG's 64 bytes: palette 1, then each tile's bytes per row and rows. */
typedef struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

AMX void lm_amx_end(void) { _tile_release(); }

/*
 * LDTILECFG.  Not _tile_loadconfig: its asm tells the compiler it reads 8
 * bytes of cfg, so the stores to the rest may be dropped.
 */
AMX static void load_tile_config(const tile_config *cfg)
{
#ifdef LM_EMULATE_AVX512
    _tile_loadconfig(cfg);
#else
    __asm__ volatile("ldtilecfg %0" ::"m"(*cfg));
#endif
}

/*
 * 32-element blocks: four C tiles (0-3) and two each of A (4, 5) and B (6,
 * 7), so blocks_piped keeps four blocks in flight while the oldest one's
 * sums are scaled (the tile intrinsics take literal numbers).  K-quants: C,
 * A, B are tiles 0, 1, 2 and 3, 4, 5 for 64 codes, and 6, 7 more A tiles.
 */
AMX void lm_amx_begin(uint32_t type)
{
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    if (lm_act_type(type) == LM_Q8_0) { /* blocks_piped's tiles */
        for (int t = 0; t < 4; t++)
            cfg.rows[t] = 16, cfg.colsb[t] = 64; /* C: [16 rows][16 tokens] int32 */
        cfg.rows[4] = cfg.rows[5] = 16, cfg.colsb[4] = cfg.colsb[5] = 32; /* A: [16 rows][32 codes] */
        cfg.rows[6] = cfg.rows[7] = 8, cfg.colsb[6] = cfg.colsb[7] = 64;  /* B: [8][16 tokens][4] */
        load_tile_config(&cfg);
        return;
    }
    const int span = 64;
    for (int set = 0; set < 2; set++) {
        cfg.rows[3 * set] = 16, cfg.colsb[3 * set] = 64;              /* C: [16 rows][16 tokens] int32 */
        cfg.rows[3 * set + 1] = 16, cfg.colsb[3 * set + 1] = (uint16_t)span; /* A: [16 rows][span codes] */
        cfg.rows[3 * set + 2] = (uint8_t)(span / 4), cfg.colsb[3 * set + 2] = 64; /* B: [span/4][16][4] */
    }
    cfg.rows[6] = cfg.rows[7] = 16, cfg.colsb[6] = cfg.colsb[7] = (uint16_t)span; /* more A tiles */
    load_tile_config(&cfg);
}

/*
 * Block b's sums (c, stored from its C tile) scaled into lane b % 16 of the
 * 16 rows, held in registers: the blocks of one lane come one after another.
 */
AMX static INLINE void lane_scale(const rows16 *r, const tgroup *g, int64_t b, const int32_t *c,
                                   __m512 lane[16])
{
    const int64_t nb = r->k / 32;
    __m512 da = _mm512_loadu_ps(g->d + b * 16);
#pragma GCC unroll 16 /* lane[] must stay in registers */
    for (int m = 0; m < 16; m++) {
        __m512 dd = _mm512_mul_ps(_mm512_set1_ps(r->d[m * nb + b]), da);
        lane[m] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * m)), lane[m]);
    }
}

/*
 * Block b's sums scaled into the rows' lanes b % 16 kept in acc.  The first
 * 16 blocks find their lanes at zero: they start from a zero register
 * instead of a load (the same fma, so the same bits).
 */
AMX static void block_scale(const rows16 *r, const tgroup *g, int64_t b, const int32_t *c,
                            float *acc)
{
    float *a = acc + (b % 16) * 16;
    __m512 lane[16];
#pragma GCC unroll 16
    for (int m = 0; m < 16; m++)
        lane[m] = b < 16 ? _mm512_setzero_ps() : _mm512_load_ps(a + m * 256);
    lane_scale(r, g, b, c, lane);
#pragma GCC unroll 16
    for (int m = 0; m < 16; m++)
        _mm512_store_ps(a + m * 256, lane[m]);
}

/*
 * The blocks in the order that keeps one lane in registers: 0, 16, 32, ...
 * (lane 0), then 1, 17, ... .  Each lane still adds its blocks in block
 * order, so the sums are those of the block-by-block order.  After the last
 * block of a lane, the lane goes to acc ([16 rows][16 lanes][16 tokens])
 * and restarts at zero.
 */
typedef struct lane_walk {
    int64_t nb, b;
    int l;
} lane_walk;

/* The block after w's: the next one (by_lane 0); the next of its lane, or the next lane's first. */
static INLINE void walk_step(lane_walk *w, int by_lane)
{
    if (!by_lane)
        w->b++;
    else if (w->b + 16 < w->nb)
        w->b += 16;
    else
        w->b = ++w->l;
}

AMX static INLINE void walk_scale(lane_walk *w, const rows16 *r, const tgroup *g, const int32_t *c,
                                  __m512 lane[16], float *acc)
{
    lane_scale(r, g, w->b, c, lane);
    if (w->b + 16 >= w->nb) { /* the lane's last block */
#pragma GCC unroll 16
        for (int m = 0; m < 16; m++) {
            _mm512_store_ps(acc + (m * 16 + w->l) * 16, lane[m]);
            lane[m] = _mm512_setzero_ps();
        }
    }
    walk_step(w, 1);
}

/* Block j (32 codes) of the 16 rows times that of the 16 tokens, into tile C. */
#define TILE_BLOCK(C, A, B, r, g, j)                                   \
    do {                                                               \
        _tile_zero(C);                                                 \
        _tile_loadd(A, (r)->a + (j) * (r)->ablk, (long)(r)->astride);  \
        _tile_loadd(B, (g)->s8 + (j) * 32 * 16, 64);                   \
        _tile_dpbssd(C, A, B);                                         \
    } while (0)

/* The next block in the walk's order into tile C, while blocks are left to issue. */
#define TILE_NEXT(C, A, B)                                     \
    do {                                                       \
        if (left > 0) {                                        \
            left--;                                            \
            TILE_BLOCK(C, A, B, r, g, iw.b);                   \
            walk_step(&iw, by_lane);                           \
        }                                                      \
    } while (0)

/* Tile C's sums (of the oldest block in flight) into c, then the next block into C. */
#define TILE_TURN(C, A, B, c)      \
    do {                           \
        _tile_stored(C, c, 64);    \
        TILE_NEXT(C, A, B);        \
    } while (0)

/*
 * All blocks, each scaled into its lanes: in block order, its lane in acc
 * (by_lane 0), or lane by lane (lane_walk), each lane kept in registers
 * until its last block (1).  Each lane adds its blocks in block order
 * either way.  Four blocks are in flight in C tiles 0-3 (A tiles 4, 5 and
 * B tiles 6, 7 in turn): a block's sums are stored three multiplies after
 * its own was issued, so the vector unit scaling them does not wait.
 */
AMX static INLINE void blocks_piped(const rows16 *r, const tgroup *g, float *acc, int32_t *c,
                                    int by_lane)
{
    const int64_t nb = r->k / 32;
    int32_t *c0 = c, *c1 = c + 256;
    __m512 lane[16];
#pragma GCC unroll 16
    for (int m = 0; m < 16; m++)
        lane[m] = _mm512_setzero_ps();
    lane_walk w = {nb, 0, 0}, iw = w; /* the block to scale next; to issue next */
    int64_t left = nb;
    TILE_NEXT(0, 4, 6);
    TILE_NEXT(1, 5, 7);
    TILE_NEXT(2, 4, 6);
    TILE_NEXT(3, 5, 7);
#define SCALE(c)                                \
    do {                                        \
        if (by_lane) {                          \
            walk_scale(&w, r, g, c, lane, acc); \
        } else {                                \
            block_scale(r, g, w.b, c, acc);     \
            walk_step(&w, 0);                   \
        }                                       \
    } while (0)
    for (int64_t i = 0; i < nb; i += 4) {
        TILE_TURN(0, 4, 6, c0);
        SCALE(c0);
        if (i + 1 >= nb)
            break;
        TILE_TURN(1, 5, 7, c1);
        SCALE(c1);
        if (i + 2 >= nb)
            break;
        TILE_TURN(2, 4, 6, c0);
        SCALE(c0);
        if (i + 3 >= nb)
            break;
        TILE_TURN(3, 5, 7, c1);
        SCALE(c1);
    }
#undef SCALE
}

/*
 * r: 16 prepared rows.  out[ldo * t + m]: row m times token t of g, for the
 * group's first n tokens.
 * scratch: LM_AMX_SCRATCH floats, 64-byte aligned (lane sums, two tiles).
 * Long rows keep a lane in registers over its blocks; short ones (a lane
 * or two of blocks) spend less storing their lanes block by block.
 */
AMX int lm_rows16_group_amx(const rows16 *r, const tgroup *g, float *out, size_t ldo, int n,
                            float *scratch)
{
    const int64_t nb = r->k / 32;
    float *acc = scratch;                             /* [16 rows][16 lanes][16 tokens] */
    int32_t *c = (int32_t *)(scratch + 16 * 16 * 16); /* [16 rows][16 tokens] */
    for (int m = 0; nb < 16 && m < 16; m++) /* lanes no block reaches */
        memset(acc + (m * 16 + nb) * 16, 0, (size_t)(16 - nb) * 16 * sizeof *acc);
    if (nb >= LANE_WALK_BLOCKS)
        blocks_piped(r, g, acc, c, 1);
    else
        blocks_piped(r, g, acc, c, 0);
    __m512 rows[16];
    for (int m = 0; m < 16; m++) {
        __m512 lanes[16];
#pragma GCC unroll 16
        for (int l = 0; l < 16; l++)
            lanes[l] = _mm512_load_ps(acc + (m * 16 + l) * 16);
        rows[m] = hsum16_lanes(lanes);
    }
    store_rows_by_token(rows, out, ldo, n);
    return 1;
}

/*
 * Per row and token, the sum over super-block b's 16 groups of min * (sum
 * of 16 codes): qgemm.c's group_mins for the 16 rows at once, each
 * pair of groups' token sums loaded once for all rows.  Integer sums, so
 * the order of the terms does not change them.
 */
AMX static INLINE void rows16_mins(const rows16 *r, const tgroup *g, int64_t b, __m512i mins[16])
{
    const int64_t ng = r->k / 16;
#pragma GCC unroll 16
    for (int m = 0; m < 16; m++)
        mins[m] = _mm512_setzero_si512();
    for (int p = 0; p < 8; p++) {
        __m512i s = _mm512_loadu_si512(g->sum16 + (b * 8 + p) * 16 * 2);
#pragma GCC unroll 16
        for (int m = 0; m < 16; m++) {
            int32_t pair; /* mins of groups 2p and 2p + 1, as madd's 16-bit pairs */
            memcpy(&pair, r->mn + m * ng + b * 16 + 2 * p, 4);
            mins[m] = _mm512_add_epi32(mins[m], _mm512_madd_epi16(s, _mm512_set1_epi32(pair)));
        }
    }
}

/* Super-block b's integer sums scaled into the rows' sums and mins (acc: [2][16 rows][16 tokens]). */
AMX static void super_scale(const rows16 *r, const tgroup *g, int64_t b, const __m512i *isum,
                            int has_mins, float *acc)
{
    const int64_t nsb = r->k / 256;
    __m512 da = _mm512_loadu_ps(g->d + b * 16);
    for (int m = 0; m < 16; m++) {
        float *a = acc + 16 * m;
        __m512 dd = _mm512_mul_ps(_mm512_set1_ps(r->d[m * nsb + b]), da);
        _mm512_store_ps(a, _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(isum[m]), _mm512_load_ps(a)));
    }
    if (!has_mins)
        return;
    __m512i msum[16];
    rows16_mins(r, g, b, msum);
    for (int m = 0; m < 16; m++) {
        float *mins = acc + 256 + 16 * m;
        __m512 mm = _mm512_mul_ps(_mm512_set1_ps(r->m[m * nsb + b]), da);
        _mm512_store_ps(mins, _mm512_add_ps(_mm512_load_ps(mins), _mm512_mul_ps(mm, _mm512_cvtepi32_ps(msum[m]))));
    }
}

/*
 * K-quant rows (256-element super-blocks), from their scaled codes: per
 * super-block, 4 steps of 64 codes multiply the low bytes into one tile and
 * the high bytes into another, so the tiles end holding the exact sum of
 * scale * code * token code; then qgemm.c's float steps for the super-block,
 * into the sums and mins of its lane (b % 4, lm_dot_k_scalar's).
 * Tiles (configured for 64 codes): C 0 and 3; A 1, 4 and 6, 7; B 2 and 5.
 */
_Static_assert(LM_K_LANES * 512 + 512 <= LM_AMX_SCRATCH, "the K kernel's lane sums and tiles fit the scratch");

AMX int lm_rows16_group_k_amx(const rows16 *r, const tgroup *g, int has_mins, float *out,
                              size_t ldo, int n, float *scratch)
{
    const long st = (long)r->stride;
    float *acc = scratch; /* [4 lanes][2][16 rows][16 tokens]: sums, mins */
    int32_t *lo = (int32_t *)(scratch + LM_K_LANES * 512), *hi = lo + 256; /* [16 rows][16 tokens] */
    memset(acc, 0, LM_K_LANES * 512 * sizeof *acc);
    for (int64_t b = 0; b < r->k / 256; b++) {
        _tile_zero(0);
        _tile_zero(3);
        for (int64_t e = b * 256; e < (b + 1) * 256; e += 128) {
            _tile_loadd(1, r->s8 + e, st);
            _tile_loadd(4, r->s8hi + e, st);
            _tile_loadd(2, g->s8 + e * 16, 64);
            _tile_loadd(6, r->s8 + e + 64, st);
            _tile_loadd(7, r->s8hi + e + 64, st);
            _tile_loadd(5, g->s8 + (e + 64) * 16, 64);
            _tile_dpbssd(0, 1, 2);
            _tile_dpbssd(3, 4, 2);
            _tile_dpbssd(0, 6, 5);
            _tile_dpbssd(3, 7, 5);
        }
        _tile_stored(0, lo, 64);
        _tile_stored(3, hi, 64);
        __m512i isum[16];
        for (int m = 0; m < 16; m++)
            isum[m] = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(hi + 16 * m), 7),
                                       _mm512_load_si512(lo + 16 * m));
        super_scale(r, g, b, isum, has_mins, acc + (b % LM_K_LANES) * 512);
    }
    __m512 rows[16];
    for (int m = 0; m < 16; m++) {
        __m512 sums[LM_K_LANES], mins[LM_K_LANES];
        for (int l = 0; l < LM_K_LANES; l++)
            sums[l] = _mm512_load_ps(acc + 512 * l + 16 * m), mins[l] = _mm512_load_ps(acc + 512 * l + 256 + 16 * m);
        rows[m] = k_total16(sums, mins);
    }
    store_rows_by_token(rows, out, ldo, n);
    return 1;
}

#else

int lm_cpu_amx(void) { return 0; }
void lm_amx_begin(uint32_t type) { (void)type; }
void lm_amx_end(void) {}

int lm_rows16_group_amx(const rows16 *r, const tgroup *g, float *out, size_t ldo, int n,
                        float *scratch)
{
    (void)r, (void)g, (void)out, (void)ldo, (void)n, (void)scratch;
    return 0;
}

int lm_rows16_group_k_amx(const rows16 *r, const tgroup *g, int has_mins, float *out, size_t ldo,
                          int n, float *scratch)
{
    (void)r, (void)g, (void)has_mins, (void)out, (void)ldo, (void)n, (void)scratch;
    return 0;
}

#endif
