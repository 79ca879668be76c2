/*
 * lm/qgemm_amx.c - 16 rows against a group of 16 tokens with AMX tiles,
 * for the 32-element block types (Q4_0, Q5_0, Q8_0), where the CPU has
 * AMX-INT8 and the kernel lets the process use it.
 *
 * qgemm.c's kernel spends one vpdpbusd per 4 codes of 16 tokens.  Here
 * one tile multiply (TDPBSSD) takes a whole 32-element block of 16 rows
 * and 16 tokens: the rows' signed codes are tile A ([16 rows][32 codes]),
 * the tokens' signed codes are tile B, in the token group's layout
 * ([8][16 tokens][4 codes]), and tile C gets the 256 exact integer sums,
 * those qgemm.c's row_groups_b32 reaches through unsigned codes and an
 * offset correction.  They go through its float steps in the same order
 * (times row scale * token scale, into lane b % 16, then the lane tree), so
 * the logits are bitwise those of every other path.
 */
#include "internal.h"
#include "simd.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX __attribute__((target("amx-tile,amx-int8,avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))

#define ARCH_REQ_XCOMP_PERM 0x1023 /* Linux: ask to use an XSAVE feature */
#define XFEATURE_XTILEDATA 18

/*
 * CPUID for AMX-TILE and AMX-INT8, XCR0 for the OS saving tile state, and
 * Linux's permission for this process to use it (asked once; granting it
 * again is harmless).
 */
int lm_cpu_amx(void)
{
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

/*
 * Two sets of tiles, so one block's multiply runs while the previous
 * block's sums are scaled: C, A, B are tiles 0, 1, 2 and 3, 4, 5 (the
 * tile intrinsics take literal numbers).
 */
AMX static void tiles_configure(void)
{
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int set = 0; set < 2; set++) {
        cfg.rows[3 * set] = 16, cfg.colsb[3 * set] = 64;    /* C: [16 rows][16 tokens] int32 */
        cfg.rows[3 * set + 1] = 16, cfg.colsb[3 * set + 1] = 32; /* A: [16 rows][32 codes] */
        cfg.rows[3 * set + 2] = 8, cfg.colsb[3 * set + 2] = 64;  /* B: [8][16 tokens][4 codes] */
    }
    _tile_loadconfig(&cfg);
}

/* Block b's sums (c, stored from its C tile) scaled into the rows' lanes b % 16. */
AMX static void block_scale(const rows16 *r, const tgroup *g, int64_t b, const int32_t *c,
                            float *acc)
{
    const int64_t nb = r->k / 32;
    __m512 da = _mm512_loadu_ps(g->d + b * 16);
    for (int m = 0; m < 16; m++) {
        __m512i v = _mm512_load_si512(c + 16 * m);
        __m512 dd = _mm512_mul_ps(_mm512_set1_ps(r->d[m * nb + b]), da);
        float *a = acc + (m * 16 + b % 16) * 16;
        _mm512_store_ps(a, _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(v), _mm512_load_ps(a)));
    }
}

#define TILE_BLOCK(C, A, B, r, g, b)                                   \
    do {                                                               \
        _tile_zero(C);                                                 \
        _tile_loadd(A, (r)->s8 + (b) * 32, (long)(r)->stride);         \
        _tile_loadd(B, (g)->s8 + (b) * 32 * 16, 64);                   \
        _tile_dpbssd(C, A, B);                                         \
    } while (0)

/*
 * r: 16 prepared rows.  out[16 * m + t]: row m times token t of g.
 * scratch: LM_AMX_SCRATCH floats, 64-byte aligned (lane sums, one tile).
 */
AMX int lm_rows16_group_amx(const rows16 *r, const tgroup *g, float *out, float *scratch)
{
    const int64_t nb = r->k / 32;
    float *acc = scratch;                             /* [16 rows][16 lanes][16 tokens] */
    int32_t *c = (int32_t *)(scratch + 16 * 16 * 16); /* [16 rows][16 tokens] */
    memset(acc, 0, 16 * 16 * 16 * sizeof *acc);
    tiles_configure();
    TILE_BLOCK(0, 1, 2, r, g, 0);
    for (int64_t b = 0; b < nb; b += 2) { /* even blocks in tiles 0-2, odd ones in 3-5 */
        if (b + 1 < nb)
            TILE_BLOCK(3, 4, 5, r, g, b + 1);
        _tile_stored(0, c, 64);
        block_scale(r, g, b, c, acc);
        if (b + 2 < nb)
            TILE_BLOCK(0, 1, 2, r, g, b + 2);
        if (b + 1 < nb) {
            _tile_stored(3, c, 64);
            block_scale(r, g, b + 1, c, acc);
        }
    }
    _tile_release();
    for (int m = 0; m < 16; m++) {
        __m512 lanes[16];
        for (int l = 0; l < 16; l++)
            lanes[l] = _mm512_load_ps(acc + (m * 16 + l) * 16);
        _mm512_storeu_ps(out + 16 * m, hsum16_lanes(lanes));
    }
    return 1;
}

#else

int lm_cpu_amx(void) { return 0; }

int lm_rows16_group_amx(const rows16 *r, const tgroup *g, float *out, float *scratch)
{
    (void)r, (void)g, (void)out, (void)scratch;
    return 0;
}

#endif
