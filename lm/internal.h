/*
 * lm/internal.h - what the files of lm/ share and nobody else sees: the
 * architecture entry and the matrix kernels.
 */
#ifndef KVCHAT_LM_INTERNAL_H
#define KVCHAT_LM_INTERNAL_H

#include "lm.h"

#include <stdatomic.h>
#include <string.h>

enum arch_flags {
    ARCH_QKV_BIAS = 1 << 0,      /* attn_q/k/v have biases (qwen2) */
    ARCH_QK_NORM = 1 << 1,       /* per-head RMSNorm of q and k before RoPE */
    ARCH_FUSED_QKV = 1 << 2,     /* attn_qkv holds [q | k | v] (phi3) */
    ARCH_FUSED_GATE_UP = 1 << 3, /* ffn_up holds [gate | up] (phi3) */
    ARCH_EMBD_SCALE = 1 << 4,    /* embeddings times sqrt(n_embd) (gemma) */
    ARCH_POST_NORMS = 1 << 5,    /* RMSNorm after attention and after the FFN */
    ARCH_GELU = 1 << 6,          /* GELU-tanh gate instead of SiLU */
    ARCH_Q_PRESCALE = 1 << 7,    /* q is scaled before q.k, not the scores */
    ARCH_SOFTCAP = 1 << 8,       /* attention and final logit soft-capping */
    ARCH_ROPE_FACTORS = 1 << 9,  /* LongRoPE rope_factors_long/short */
    ARCH_NO_SWA = 1 << 10,       /* sliding_window metadata is ignored (as llama.cpp) */
};

typedef struct lm_arch {
    const char *name;
    int rope_style;
    unsigned flags;
    int swa_pattern;             /* 0: every layer when a window is set */
    float rope_base_swa;         /* 0: the global base */
    int big_n_layer;             /* that many layers: q scaled by 1/sqrt(n_embd/n_head) */
} lm_arch;

/* A weight row decoded for integer dot products (qdot.c). */
typedef struct qrow {
    uint32_t type;
    int64_t k;
    float *f;          /* float weights (F32/F16/BF16): k values */
    uint8_t *u;        /* quantized: k unsigned codes, code = u - lm_code_offset(type) */
    int32_t *sc4;      /* K-quants: the group scale of every 4 codes (k/4) */
    int16_t *mn;       /* K-quants: the group min of every 16 codes (k/16) */
    float *d, *m;      /* per block: scale, and min/offset scale */
    int8_t *s8;        /* for qgemm.c: the codes as signed bytes */
    int32_t *corr16;   /* and -128 * (sum of every 16 codes) */
} qrow;

/* An activation row rounded to its vec_dot_type (qdot.c). */
typedef struct act_row {
    int64_t k;
    float *f;          /* F32/F16/BF16: the rounded values */
    int8_t *qs;        /* 8-bit codes */
    float *d, *s;      /* per block: scale; Q8_1 also d * sum */
    int16_t *sum16;    /* sum of every 16 codes */
    int32_t *negcorr;  /* -offset * (sum of every 4 codes), offset of the weight type */
    int8_t *qw;        /* per window of 4 blocks: their codes 0-15, then 16-31 (qrow_vbmi.c) */
    int32_t *ncw;      /* per window: negcorr of codes 4q.. and 16+4q.. added, lane 4i+q */
    float *dt;         /* windows: each step's 16 block scales d, lane b at 4 (b % 4) + b / 4 */
    int windows;       /* 1 once qw and ncw hold this row's values */
    int nibbles;       /* 1 once qw holds the codes in Q4_K's nibble order (qrow_k.c) */
    int lanes;         /* 1 once qw and ncw hold the block-per-lane order (lm_act_lanes) */
    int klanes;        /* LM_Q4_K_LANES or LM_Q6_K_LANES once they hold that layout's order (lm_act_klanes) */
    size_t ahead;      /* bytes ahead of its reads a one-token kernel asks for the weights (mm_scratch's) */
} act_row;

/*
 * NEON (any aarch64 core) and NEON_DOT (with SDOT, ARMv8.2) sit below AVX2
 * so that the x86 tests (isa >= LM_ISA_AVX2 ...) never take them.
 */
enum { LM_ISA_SCALAR, LM_ISA_NEON, LM_ISA_NEON_DOT, LM_ISA_AVX2, LM_ISA_AVX512 };

static inline int lm_isa_neon(int isa)
{
    return isa == LM_ISA_NEON || isa == LM_ISA_NEON_DOT;
}

int lm_cpu_isa(void);
int lm_act_type(uint32_t wtype);                 /* llama.cpp's vec_dot_type */
int lm_code_offset(uint32_t wtype);
size_t lm_act_row_bytes(int atype, int64_t k);
void lm_act_layout(int atype, int64_t k, act_row *r, void *base);
void lm_quantize_act(uint32_t wtype, const float *x, void *dst, int64_t k);
int lm_quantize_act_avx512(uint32_t wtype, const float *x, void *dst, int64_t k); /* 0: not here */
int lm_quantize_act_avx2(uint32_t wtype, const float *x, void *dst, int64_t k);   /* 0: not here */
int lm_quantize_act_neon(uint32_t wtype, const float *x, void *dst, int64_t k);   /* 0: not here */
void lm_qrow_decode_scalar(qrow *r, uint32_t type, const void *src, int64_t k);
int lm_qrow_decode_avx2(qrow *r, uint32_t type, const void *src, int64_t k);
/* k F16 or BF16 values (type t) as floats, lm_dequant_row's, eight at a time (qdot_avx2.c). */
void lm_halves_to_f32_avx2(float *f, uint32_t t, const void *row, int64_t k);
void lm_k_scales(uint32_t type, const uint8_t *blk, int *sc, int *mn); /* super-block's 16 group scales, mins */
void lm_k_codes(uint32_t type, const uint8_t *blk, uint8_t *u);      /* its 256 codes, unsigned */
void lm_k_scales_decode(qrow *r, uint32_t type, const uint8_t *blk, int64_t i);
typedef void (*lm_k_codes_fn)(uint32_t type, const uint8_t *blk, uint8_t *u); /* 256 codes */
void lm_qrow_decode_k_with(qrow *r, uint32_t type, const uint8_t *src, int64_t k, lm_k_codes_fn codes);
float lm_hsum16(const float *a);
float lm_k_mins(const qrow *w, const act_row *a, int64_t b);
/* K-quant dots keep super-block b's terms in lane b % LM_K_LANES, added at the end by lm_k_total */
#define LM_K_LANES 4
float lm_k_total(const float *acc, const float *mins);
float lm_dot_b32_scalar(const qrow *w, const act_row *a);
float lm_dot_k_scalar(const qrow *w, const act_row *a);
float lm_dot_f_scalar(const float *x, const float *y, int64_t n);
float lm_dot_b32_avx512(const qrow *w, const act_row *a);
float lm_dot_k_avx512(const qrow *w, const act_row *a);
float lm_dot_f_avx512(const float *x, const float *y, int64_t n);
float lm_dot_b32_avx2(const qrow *w, const act_row *a);
float lm_dot_k_avx2(const qrow *w, const act_row *a);
float lm_dot_f_avx2(const float *x, const float *y, int64_t n);
/* qrow_f.c: nr (1-4) F32, F16 or BF16 rows as stored, rb bytes apart, against tokens a[0..n), the same sums:
   out[t * ldo + r]; 0 for other types (nothing done) */
int lm_rows_f_avx512(uint32_t t, const uint8_t *row0, size_t rb, int nr, int64_t k, const act_row *a, int n,
                     float *out, size_t ldo);
/* the same with AVX2, nr 1-2 */
int lm_rows_f_avx2(uint32_t t, const uint8_t *row0, size_t rb, int nr, int64_t k, const act_row *a, int n,
                   float *out, size_t ldo);
/* One token through nr F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/K-quant rows read as stored (or LM_Q5_0_LANES: Q5_0
   in its lanes layout, against a token in lanes), AVX2; 0: not this type (nothing done) */
int lm_rows_avx2(uint32_t t, const uint8_t *row0, size_t rb, int64_t nr, int64_t k, const act_row *a,
                 float *out);
/* qrow_k_avx2.c: lm_rows_avx2 for the K-quants (Q2_K to Q6_K); 0: not one (nothing done) */
int lm_rows_k_avx2(uint32_t t, const uint8_t *row0, size_t rb, int64_t nr, int64_t k, const act_row *a,
                   float *out);
/* qgemm_avx2.c: nt tokens through 8 rows of a type lm_rows8_type takes, AVX2: out[i * ldo + r];
   scratch: lm_rows8_bytes(k), 64-byte aligned */
int lm_rows8_type(uint32_t t);
size_t lm_rows8_bytes(int64_t k);
void lm_rows8_avx2(uint32_t t, const uint8_t *row0, size_t rb, int64_t k, const act_row *a, int nt, float *out,
                   size_t ldo, void *scratch);
/* qdot_neon.c: the same dots on aarch64, with SDOT or without (scalar twins elsewhere) */
int lm_cpu_neon(void);                     /* 1: aarch64 */
int lm_cpu_neon_dot(void);                 /* 1: aarch64 with the dot-product instructions */
int lm_qrow_decode_neon(qrow *r, uint32_t type, const void *src, int64_t k); /* 0: not here */
float lm_dot_b32_neon(const qrow *w, const act_row *a);       /* SDOT */
float lm_dot_k_neon(const qrow *w, const act_row *a);
float lm_dot_b32_neon_plain(const qrow *w, const act_row *a); /* ARMv8.0 */
float lm_dot_k_neon_plain(const qrow *w, const act_row *a);
/* Four tokens a[0..3] through w: out[t * ld]; 0 for rows that are not integer dots */
int lm_dot4_neon(const qrow *w, const act_row *a, float *out, size_t ld);
int lm_dot4_neon_plain(const qrow *w, const act_row *a, float *out, size_t ld);
float lm_dot_f_neon(const float *x, const float *y, int64_t n);
/* qrow_vbmi.c: one token through a Q4_0/Q5_0 row read in order, 4 blocks a load pair */
int lm_cpu_vbmi(void);                     /* 1: AVX-512 VBMI and VNNI usable */
void lm_act_windows(act_row *a);           /* fills qw, ncw from qs, negcorr */
/* Q4_0, Q5_0: nr rows rb bytes apart, out[r] */
void lm_rows_b32_vbmi(uint32_t t, const uint8_t *row0, size_t rb, int64_t nr, int64_t k,
                      const act_row *a, float *out);
/* Q4_0, Q5_0, Q8_0 rows (or LM_Q4_0_LANES: rearranged Q4_0) through a few tokens or one, each step's blocks one a lane (qrow_vbmi.c) */
void lm_act_lanes(act_row *a);             /* fills qw, ncw from qs, negcorr */
/* nr rows rb bytes apart times tokens a[0..n): out[t * ostride + r] */
void lm_rows_lanes_vbmi(uint32_t t, const uint8_t *row0, size_t rb, int64_t nr, int64_t k,
                        const act_row *a, int n, float *out, size_t ostride);

/* qrow_k.c: Q4_K, Q5_K and Q6_K rows through a few tokens, 8 at a time (AVX-512 VNNI) */
#define LM_ROW_K_TOKENS 8
void lm_act_nibbles(act_row *a); /* fills qw with the codes in Q4_K/Q5_K's nibble order */
/* nr rows rb bytes apart through n tokens: out[ldo * j + r]; 0 for other types. */
int lm_rows_k_avx512(uint32_t t, const uint8_t *row0, size_t rb, int64_t nr, int64_t k,
                     const act_row *a, int n, float *out, size_t ldo);
/* qrow_k_gfni.c: the same where the CPU also has VBMI and GFNI (lm_cpu_gfni) */
int lm_cpu_gfni(void);
int lm_rows_k_gfni(uint32_t t, const uint8_t *row0, size_t rb, int64_t nr, int64_t k,
                   const act_row *a, int n, float *out, size_t ldo);
/* qrow_klanes.c: Q4_K and Q6_K rows in their lanes layouts (tag LM_Q4_K_LANES, LM_Q6_K_LANES), with GFNI */
void lm_act_klanes(act_row *a, uint32_t tag); /* fills qw, ncw in that layout's order */
int lm_rows_klanes(uint32_t tag, const uint8_t *row0, size_t rb, int64_t nr, int64_t k, const act_row *a, int n,
                   float *out, size_t ldo);
/* qrow_klanes_avx2.c: one token through rearranged Q4_K rows, AVX2; 0: not this layout (nothing done) */
int lm_rows_klanes_avx2(uint32_t tag, const uint8_t *row0, size_t rb, int64_t nr, int64_t k, const act_row *a,
                        float *out);
/* qrow_k_avx2.c: super-blocks b0..b1-1 of a K-quant row as stored into acc and mins (lanes b % LM_K_LANES) */
void lm_k_blocks_avx2(uint32_t t, const uint8_t *row, int64_t b0, int64_t b1, const act_row *a, float *acc,
                      float *mins);
/* A K-quant row as the AMX tiles take it (lm_rows16_put's bytes; also from the lanes layouts); 0 for other types */
int lm_row_k_scaled(uint32_t t, const uint8_t *row, int64_t k, int8_t *lo, int8_t *hi, float *d, float *m,
                    int16_t *mn);
/* A K-quant row as qgemm.c's VNNI groups read it (lm_qrow_decode then lm_trow_prepare); 0 for other types */
int lm_row_k_prepare(uint32_t t, const uint8_t *row, int64_t k, qrow *r);
/* The same from a row in a lanes layout (tag LM_Q4_K_LANES, LM_Q6_K_LANES) */
int lm_row_klanes_prepare(uint32_t tag, const uint8_t *row, int64_t k, qrow *r);

/* One row against n tokens straight from the weights; 0 if the type has no such kernel. */
/* One token through 16 rows rb bytes apart (Q4_0, Q5_0, Q8_0); 0 if not built here. */
int lm_rows16_avx512(uint32_t t, const uint8_t *row0, size_t rb, int64_t k, const act_row *a, float *out);
int lm_rows16_type(uint32_t t);
int lm_fused_row_avx512(uint32_t t, const void *row, int64_t k, const act_row *a, int n,
                        float *out, qrow *scratch);

/* Decodes a row and dots it with an activation, on the given instruction set. */
void lm_qrow_decode(qrow *r, uint32_t type, const void *src, int64_t k, int isa);
float lm_qrow_dot(const qrow *r, const act_row *a, int isa);
/* lm_qrow_dot for tokens a[0..nt): out[t * ld] (NEON: four tokens a pass over the row) */
void lm_qrow_dots(const qrow *r, const act_row *a, int nt, float *out, size_t ld, int isa);
float lm_dot_f(const float *x, const float *y, int64_t n, int isa);

/* 16 tokens' Q8_0 or Q8_K activations side by side, for qgemm.c's kernels. */
typedef struct tgroup {
    uint8_t *q;        /* [k/4][16 tokens][4 codes], each code + 128 (VNNI) */
    int8_t *s8;        /* or the same codes as they are (AMX), in the same bytes */
    float *d;          /* [blocks][16]: block scales */
    int16_t *sum16;    /* [k/32][16][2]: the sums of each two groups of 16 codes */
} tgroup;

size_t lm_tgroup_bytes(int64_t k);
void lm_tgroup_build(tgroup *g, int atype, const act_row *a, int n, int64_t k, int amx, int isa,
                     void *base);
int lm_trow_prepare_avx512(qrow *r);             /* 0: not built here */
/* A Q4_0 or Q8_0 row straight from the file as lm_trow_prepare_avx512 leaves it (s8, corr16, d); 0 for others */
int lm_row_b32_prepare(uint32_t t, const uint8_t *row, int64_t k, qrow *r);
/* nr rows of one type against ng <= 4 groups: out[i][16 * j + t] */
int lm_trow_groups_avx512(const qrow *const *r, int nr, const tgroup *const *g, int ng, float *const *out);
/* Rows m = 0..15 of stage (stage[m * sld + t], sld >= n rounded up to 16) stored token by token: out[ldo * t + m]. */
void lm_store_rows16(const float *stage, size_t sld, float *out, size_t ldo, int n);

/* 16 prepared rows, for the AMX kernels (qgemm_amx.c). */
typedef struct rows16 {
    int64_t k;
    int8_t *s8;        /* [16][stride]: each row's codes as signed bytes; K-quants: */
    int8_t *s8hi;      /* code * scale = 128 * s8hi + s8, both [16][stride] */
    size_t stride;
    const int8_t *a;   /* what the tiles read: block j of row m at a + m * astride + j * ablk */
    size_t astride, ablk; /* (s8 itself, or Q8_0 rows where they lie in the file) */
    float *d;          /* [16][blocks]: their block (super-block) scales */
    /* K-quants only */
    float *m;          /* [16][k/256]: min scales */
    int16_t *mn;       /* [16][k/16]: the mins of every 16 codes */
} rows16;

/* Q4_0/Q5_0/Q8_0 rows of this many blocks or more go through the AMX tiles
   lane by lane (k = 2048: 22% faster; k = 896: 15% slower than in order) */
#define LANE_WALK_BLOCKS 48
#define LM_AMX_SCRATCH (16 * 16 * 16 + 2 * 16 * 16) /* floats: lane sums and two tiles */
int lm_cpu_amx(void);                            /* 1: AMX-INT8 usable by this process */
int lm_k_has_mins(uint32_t type);
/* Copies a decoded row into slot m; p->k set. */
void lm_rows16_put(rows16 *p, int m, const qrow *r);
int lm_rows16_put_raw(rows16 *p, int m, uint32_t type, const uint8_t *row); /* Q4_0 (also LM_Q4_0_LANES), Q4-6_K; 0: not here */
void lm_rows16_use_s8(rows16 *p);                /* the tiles read the rows put into s8 */
/* The tiles read 16 Q8_0 rows (rb bytes apart) where they lie; their scales go to p->d. */
void lm_rows16_point_q8_0(rows16 *p, const uint8_t *row0, size_t rb);
/* The kernels below run between these, on the thread that called them. */
void lm_amx_begin(uint32_t type);                /* configures the tiles for a weight type */
void lm_amx_end(void);                           /* releases them */
/* out[ldo * t + m]: row m of r times token t of g, for its first n tokens. */
int lm_rows16_group_amx(const rows16 *r, const tgroup *g, float *out, size_t ldo, int n,
                        float *scratch);
int lm_rows16_group_k_amx(const rows16 *r, const tgroup *g, int has_mins, float *out, size_t ldo,
                          int n, float *scratch);

/*
 * Generating a token streams every weight from DRAM once, and the hardware
 * prefetcher alone leaves a core waiting on most of those loads (tinyllama
 * Q4_0 generated 15 tokens/s without this and 34 with it).  So the kernels
 * request the n bytes a row's reads are about to reach, some distance
 * beyond them, a cache line at a time: a thread's run of rows is
 * contiguous, so that is what it reads a few rows later.  For one token the
 * lines go into L2 (the T1 hint), and the distance is the act_row's
 * `ahead`, which each context tunes by timing its tokens (prefetch_tune.c):
 * the best one is the machine's.  The Zen 4 this project was first measured
 * on wanted 6 KiB (2026-11-24, tinyllama's 154 matrices one token at a
 * time, two threads, as a share of the machine's read speed beside them,
 * ten rounds alternated: 6 KiB beat 3, 4, 5, 5.5, 6.5, 7, 8, 12 and 16;
 * against 8, Q4_0 (lanes) 93 -> 95% when the machine read 35 GB/s, Q4_K
 * 92 -> 96%), the Xeon with AMX of 2026-11-25 3 KiB (`kvchat bench -p 0
 * -n 32`, two rounds: tinyllama Q8_0 23.6 -> 26.8-27.6 t/s, qwen2.5 Q4_0
 * 78-86 -> 90-100, tinyllama Q4_0 49.2-49.7 -> 51.3-51.9, Q4_K_M 39-40
 * -> 41-42; 2 and 4 KiB in between, 8 worse).  For a few tokens a row takes
 * that many times longer, the lines asked for into L2 arrive long before
 * they are read, and each read then waits on L2: there the lines go into
 * L1 (a 6-token message on smollm2 Q4_K_M on the Zen 4, best of 80:
 * 10.11-10.31 ms at 716 cached tokens against 10.41-10.57 into L2), the
 * same distance ahead, which both machines liked there too (the Zen 4 6
 * KiB; the Xeon 2-3 KiB, against 6: tinyllama Q4_K_M 6 tokens 102-109 ->
 * 134-138 t/s, Q8_0 111 -> 129-130, Q4_0 189-194 -> 203-205).
 */
#define LM_AHEAD_ONE (6144 | LM_AHEAD_L1) /* bytes ahead, into L2 (and L1 nearer), for one token, until tuned */

/* prefetch_tune.c: a context's choice of that distance, from its passes' times. */
#define LM_AHEAD_CHOICES 10
typedef struct lm_ahead_tune {
    size_t fixed;                   /* KVCHAT_PREFETCH's bytes, or 0 */
    int trials;                     /* timed passes so far */
    double best[LM_AHEAD_CHOICES];  /* each candidate's fastest pass, seconds */
    size_t chosen;                  /* 0 while trying */
} lm_ahead_tune;
void lm_ahead_tune_init(lm_ahead_tune *t);
size_t lm_ahead_next(const lm_ahead_tune *t);
void lm_ahead_record(lm_ahead_tune *t, size_t ahead, double seconds);
#define LM_PREFETCH_BATCH 6144 /* into L1, when 16 rows at a time meet a batch (10 tokens or more) */

/*
 * repack.c: Q4_0, Q5_0 and Q5_1 rows in their lanes layouts
 * (LM_LAYOUT_Q4_0_LANES, LM_LAYOUT_Q5_0_LANES, LM_LAYOUT_Q5_1_LANES), in
 * steps of 16 blocks, and Q4_K and Q6_K rows in theirs
 * (LM_LAYOUT_Q4_K_LANES, LM_LAYOUT_Q6_K_LANES), in steps of 4 super-blocks;
 * LM_Q4_0_LANES, LM_Q5_0_LANES, LM_Q5_1_LANES, LM_Q4_K_LANES and
 * LM_Q6_K_LANES name them to the kernels that take a type.
 */
#define LM_Q4_0_LANES 0x100
#define LM_Q4_K_LANES 0x101
#define LM_Q6_K_LANES 0x102
#define LM_Q5_0_LANES 0x103
#define LM_Q5_1_LANES 0x104
#define LM_Q8_0_LANES 0x105
#define LM_Q4_0_STEP_BYTES 288 /* a step of the layout: 16 Q4_0 blocks, as in the file */
#define LM_Q8_0_STEP_BYTES 544 /* 16 Q8_0 blocks */
#define LM_Q4_K_STEP_BYTES 576 /* 4 Q4_K super-blocks */
#define LM_Q6_K_STEP_BYTES 840 /* 4 Q6_K super-blocks */
/* Blocks in the Q4_0, Q5_0 or Q5_1 lanes step at block b of a row of nb: 16, but for the row's last step. */
static inline int lm_lanes_step_blocks(int64_t nb, int64_t b)
{
    return nb - b < 16 ? (int)(nb - b) : 16;
}
/*
 * Where a Q6_K lanes step keeps slice j's code bytes (repack.c): its top
 * bits, then the low four bits of sets 0-1 (h = 0) and 2-3 (h = 1), 192
 * bytes a slice, so a one-token kernel reads a step in address order (Zen
 * 5, one thread, 2048 columns from memory: 18.8-19.0 -> 22.3-24.2 GB/s
 * against the three kinds of chunk in three runs of their own; from L2
 * 60.6 -> 70.4).
 */
static inline size_t lm_q6_k_lanes_top(int j)
{
    return 192 * (size_t)j;
}
static inline size_t lm_q6_k_lanes_low(int j, int h)
{
    return 192 * (size_t)j + 64 + 64 * (size_t)h;
}
/*
 * Where super-block b (0-3) of a K-quant lanes step keeps its scales and
 * factors (they stay whole: Q4_K's 16 header bytes at 16b, Q6_K's 16
 * scales and d at 768 + 18b), where the file's block has them, and how many.
 */
static inline void lm_klanes_header(uint32_t t, int b, size_t *in_step, size_t *in_block, size_t *n)
{
    *in_step = t == LM_Q4_K ? 16 * (size_t)b : 768 + 18 * (size_t)b;
    *in_block = t == LM_Q4_K ? 0 : 192;
    *n = t == LM_Q4_K ? 16 : 18;
}
/*
 * A Q6_K lanes step is 840 bytes (13.1 lines), so its slices of codes would
 * start anywhere in a line, and a 64-byte load across two lines costs a
 * one-token kernel more than the layout saves (Zen 5, tinyllama Q6_K
 * generating, four rounds each against the file's layout: so, slower in
 * three by 3.5-8%; with the codes on lines, faster in three by 1-6%).  So
 * the codes start at the step's first line start, at
 * lm_q6_k_lanes_codes(step), and the step's 72 bytes of scales and factors
 * lie around them: header byte i at step + i for i below that, at step +
 * 768 + i from it (the copy lays each step out where it will be read).
 */
static inline size_t lm_q6_k_lanes_codes(const uint8_t *step)
{
    return (size_t)(-(uintptr_t)step & 63);
}

void lm_q4_0_step_from_lanes(const uint8_t *step, uint8_t *out, int m); /* m blocks, to the file's */
void lm_q4_0_from_lanes(const uint8_t *row, uint8_t *dst, int64_t k);
/*
 * A Q5_0 step of m blocks (22m bytes) in its lanes layout: Q4_0's vectors
 * of nibble bytes (4m bytes each, at 4mq), then block j's 32 fifth bits at
 * 16m + 4j with code c's at bit 8(c % 4) + c / 4 (byte i holds codes
 * i, i + 4, ..., i + 28), then block j's f16 scale at 20m + 2j.  A Q5_1
 * step (24m bytes) is the same, then block j's f16 min at 22m + 2j.
 */
#define LM_Q5_0_FIFTH(m) (16 * (size_t)(m))
#define LM_Q5_1_MINS(m) (22 * (size_t)(m))
/*
 * Where a Q4_0, Q5_0, Q5_1 or (whole) Q8_0 lanes step of m blocks at
 * `step` keeps its codes, and its scales: after the codes (and fifth
 * bits), but where a whole Q4_0 or Q8_0 step starts mid-line (they are 4.5
 * and 8.5 lines long, so every other one does where a row starts on a
 * line), before them, so that the code vectors start on lines: a 64-byte
 * load across two lines cost the one-token kernels more than they read
 * (Zen 5, tinyllama Q8_0, one thread: 19.8-22.7 t/s against the file's
 * kernel's 23.6-25.2, level with it on lines; Q4_0, two threads: 71-79%
 * of the machine's reads against 79-87% on lines).  The copy lays a step
 * out where it is read (weights_copy.c), so the place is where it lies.
 */
static inline size_t lm_lanes_codes(uint32_t t, const uint8_t *step, int m)
{
    return (t == LM_Q4_0 || t == LM_Q8_0) && m == 16 && ((uintptr_t)step & 63) == 32 ? 32 : 0;
}
static inline size_t lm_lanes_scales(uint32_t t, const uint8_t *step, int m)
{
    return lm_lanes_codes(t, step, m) ? 0 : (t == LM_Q4_0 ? 16 : t == LM_Q8_0 ? 32 : 20) * (size_t)m;
}
uint32_t lm_layout_type(int layout);                           /* LM_Q4_0, LM_Q4_K, LM_Q6_K, LM_Q5_0, LM_Q5_1 */
size_t lm_layout_unit(int layout, int64_t k);                   /* bytes rearranged at once */
void lm_layout_apply(int layout, uint8_t *unit, int64_t k);     /* one unit, in place */
void lm_layout_undo(int layout, const uint8_t *row, uint8_t *dst, int64_t k); /* a row, to the file's */
void lm_tensor_row_f32(const lm_tensor *t, int64_t i, float *out, uint8_t *scratch); /* any layout */
int lm_lanes_layout_native(void);
int lm_q8_0_lanes_native(void);
int lm_klanes_layout_native(uint32_t t); /* Q4_K or Q6_K */
int lm_q5_0_lanes_native(void); /* (Q5_1's too) */
int lm_lanes_plan(const gguf_file *g, size_t size, uint8_t *layout);

/* Bytes of a Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0 block: a constant in the kernels, whose t is one. */
static inline int lm_b32_block_bytes(uint32_t t)
{
    return t == LM_Q8_0 || t == LM_Q8_0_LANES ? 34 : t == LM_Q5_1 ? 24 : t == LM_Q5_0 ? 22 : t == LM_Q4_1 ? 20 : 18;
}

/* Where a Q5_0 or Q5_1 block keeps its fifth bits: after its scale (and min), before its 16 bytes of nibbles. */
static inline int lm_q5_fifth_at(uint32_t t)
{
    return lm_b32_block_bytes(t) - 20;
}

/* Where a K-quant super-block keeps its factor d, and (0: it has none) its min factor. */
static inline size_t lm_k_d_at(uint32_t t)
{
    return t == LM_Q2_K ? 80 : t == LM_Q3_K ? 108 : t == LM_Q6_K ? 208 : 0;
}
static inline size_t lm_k_m_at(uint32_t t)
{
    return t == LM_Q2_K ? 82 : t == LM_Q4_K || t == LM_Q5_K ? 2 : 0;
}

/* The 16-bit word at p (any alignment), little-endian as the files store it. */
static inline int lm_u16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

/* The f16 at p (any alignment), as f32: block scales as the files store them. */
static inline float lm_half_at(const uint8_t *p)
{
    return lm_f16_to_f32((uint16_t)lm_u16_at(p));
}

/*
 * One token's lines, asked into L2 `ahead` bytes before they are read, may
 * be asked again into L1 LM_AHEAD_NEAR bytes before: where `ahead` has the
 * bit LM_AHEAD_L1 (distances are whole KiB).  On the Xeon with AMX, left
 * to the hardware, each row's loads waited on L2 (`kvchat bench -p 0 -n
 * 64`, two rounds, against none: tinyllama Q4_0 48.7-51.1 -> 53.8-54.5 t/s
 * at 512, 53.9-54.2 at 256, 52-53 at 768-1536; Q8_0 26.6-27.0 -> 28.1-28.7
 * at 512; alternated with the binary before, two rounds: qwen2.5-0.5b Q4_0
 * 114-115 -> 122-124, Q4_K_M 70-72 -> 76-77, tinyllama Q8_0 27.4-27.6 ->
 * 28.8-29.1).  On the Zen 5 the second request costs the same tokens 3-17%
 * (tinyllama Q4_0 73.2-73.8 t/s against 78.5-86.8 without, Q8_0 39.9-42.5
 * against 45.6-45.9, Q4_K_M 66.5-67.5 against 68.7-70.8; three and two
 * rounds alternated, the machine reading 45-65 GB/s), so each context
 * tunes whether to ask with the distance (prefetch_tune.c).
 */
#define LM_AHEAD_NEAR 512
#define LM_AHEAD_L1 ((size_t)1)

/* The distance in bytes of an `ahead`, without its LM_AHEAD_L1 bit. */
static inline size_t lm_ahead_bytes(size_t ahead)
{
    return ahead & ~LM_AHEAD_L1;
}

/*
 * The n bytes `ahead` beyond p that a kernel of ntok tokens reads next: into L2 (and L1 nearer) for one token, L1 for
 * several.  One loop, the run-time LM_AHEAD_L1 test inside it: written as a loop in each branch of that test, GCC 12
 * dropped every request of some inlined calls (152 -> 74 in qrow_k_avx2.o; all of a one-line call's).
 */
static inline void lm_prefetch_ahead(const uint8_t *p, size_t n, int ntok, size_t ahead)
{
    const size_t far = lm_ahead_bytes(ahead);
#pragma GCC unroll 8 /* a loop of a few lines costs the one-token kernels 5% in L2 */
    for (size_t off = 0; off < n; off += 64) {
        if (ntok > 1) {
            __builtin_prefetch(p + far + off, 0, 3); /* prefetcht0: into L1 */
            continue;
        }
        __builtin_prefetch(p + far + off, 0, 2); /* prefetcht1: into L2 */
        if (ahead & LM_AHEAD_L1)
            __builtin_prefetch(p + LM_AHEAD_NEAR + off, 0, 3); /* prefetcht0: into L1 */
    }
}

/*
 * weights_copy.c: the copy, started (NULL: stay mapped); a decode's start
 * (adopts what is done, holds the copy back while the tensors are read) and
 * end; freeing it.
 */
struct lm_copy *lm_weights_plan(const gguf_file *g);
void lm_weights_enter(const lm_model *m, int n_threads); /* n_threads: to finish an eager copy */
void lm_weights_leave(const lm_model *m);
int lm_weights_settled(const lm_model *m); /* no copy, or every tensor in it */
void lm_weights_free(struct lm_copy *cp);

/*
 * A barrier among the threads of the enclosing OpenMP region: a pass's
 * worksharing loops end `nowait` and wait here instead.  libgomp's last
 * thread to reach a barrier calls futex(FUTEX_WAKE) every time, whether or
 * not a thread sleeps (a microsecond on this project's VMs), and a
 * generated token passes about 270 of them (smollm2).  Here it calls the
 * kernel only when a thread went to sleep (barrier.c).  Zen 5, two
 * threads, `kvchat bench -p 6 -n 64 -r 3` alternated twice: generation
 * smollm2 Q4_K_M 271-297 -> 295-312 t/s, its Q8_0 208-231 -> 225-246,
 * qwen2.5-0.5b Q4_0 122-141 -> 143-152.
 */
typedef struct lm_barrier {
    atomic_uint arrived, phase, sleepers;
    int procs; /* processors this process may run on */
} lm_barrier;
void lm_barrier_init(lm_barrier *b);
void lm_barrier_wait(lm_barrier *b); /* every thread of the enclosing region calls it */

/*
 * A matrix's runs of rows shared out among a pass's threads (runs.c): each
 * thread starts on its own contiguous share and, once through it, takes
 * the back half of what another has left.  Every thread of the region
 * calls lm_runs_begin for every matrix, then lm_runs_next until it gives -1.
 */
typedef struct lm_runs_share {
    _Alignas(64) atomic_uint_least64_t word; /* work share, front, back (runs.c) */
    unsigned seq;                            /* the owner's count of work shares */
} lm_runs_share;
typedef struct lm_runs {
    lm_runs_share *share; /* one per thread, a cache line each */
    int n_threads;
} lm_runs;
typedef struct lm_runs_iter {
    lm_runs *r;
    int tid;
    unsigned gen;
    int64_t n_runs;
    int64_t next, end; /* runs this thread holds and has not done: stolen, or an even split */
} lm_runs_iter;
#define LM_RUNS_MAX ((1 << 24) - 1) /* runs a matrix may be cut into */
int lm_runs_init(lm_runs *r, int n_threads);
void lm_runs_free(lm_runs *r);
void lm_runs_begin(lm_runs *r, lm_runs_iter *it, int64_t n_runs);
int64_t lm_runs_next(lm_runs_iter *it); /* the next run this thread does, or -1 */

/* Per-context matmul scratch: quantized activations and one qrow per thread. */
typedef struct mm_scratch {
    lm_barrier bar;    /* the threads of a pass, between its steps */
    lm_runs runs;      /* the one-token kernels' runs of rows */
    int n_threads, isa, amx, vbmi, gfni;
    int64_t max_k;
    uint8_t *act;      /* n_tok quantized activation rows */
    size_t act_cap;
    act_row *acts;     /* their layouts */
    qrow *rows;        /* two per thread */
    float **outs;      /* per thread: one row's outputs for a token block */
    float **stage;     /* per thread: 16 rows' outputs for a token block (grouped) */
    uint8_t *tg_mem;   /* the token groups of a batch (K-quants, AVX-512) */
    tgroup *groups;
    rows16 *r16;       /* per thread, with AMX: 16 rows prepared for the tiles */
    void **r8;         /* per thread, x86: eight rows unpacked for qgemm_avx2.c */
    uint8_t **file_rows; /* per thread: a rearranged row back in the file's layout (Q6_K's are the longest) */
    float **amx_scratch;
    size_t ahead;      /* the one-token kernels' prefetch distance (act_row's), set by lm_decode's tuning */
} mm_scratch;

int mm_scratch_init(mm_scratch *s, int n_threads, int64_t max_k, int max_tok);
void mm_scratch_free(mm_scratch *s);

/* out[t][r] = dot(row r of w, x[t]) for t < n_tok, r < rows of w. */
void lm_matmul(float *out, const lm_tensor *w, const float *x, int n_tok, mm_scratch *s);
/*
 * outs[j] = ws[j] times x for j < nw (Q, K and V; gate and up), in one
 * parallel region: x's rounded activations are used again when the next
 * matrix takes the same ones (same vec_dot_type and code offset).  Inside
 * a parallel region, all its threads call it together (lm_matmul too).
 */
void lm_matmul_many(float *const *outs, const lm_tensor *const *ws, int nw, const float *x,
                    int n_tok, mm_scratch *s);

/* ---- attention.c ---- */
void lm_rope_angles(const lm_model *m, int il, int pos, int n_ctx, float *cs, float *sn);
void lm_rope_apply(const lm_model *m, float *h, int n_heads, int head_dim, const float *cs,
                   const float *sn);
void lm_rmsnorm(float *out, const float *x, const float *w, int n, float eps);
void lm_rmsnorm_isa(float *out, const float *x, const float *w, int n, float eps, int isa);
double lm_sumsq(const float *x, int n);
double lm_sum_parts16(const double part[16]);
double lm_sumsq_avx512(const float *x, int n); /* lm_sumsq's bytes */
double lm_sumsq_avx2(const float *x, int n);   /* the same */
void lm_kv_store_head(lm_kv *kv, int il, int pos, int kh, const float *k, const float *v);
/*
 * An f16 cache read by many queries at once is converted to f32 once a
 * layer: lm_kv_copy_worth says whether for a pass of n tokens;
 * lm_kv_layer_f32, called by every thread of a parallel region (which share
 * the work), converts the rows of layer il that tokens pos0..pos0+n-1
 * attend into buf (lm_kv_f32_floats(kv) floats) and returns it as a cache
 * of that one layer; it does not wait for the other threads' rows (the
 * caller does, at the pass's barrier, lm_barrier_wait).
 */
int lm_kv_copy_worth(const lm_model *m, const lm_kv *kv, int n);
size_t lm_kv_f32_floats(const lm_kv *kv);
lm_kv lm_kv_layer_f32(const lm_model *m, const lm_kv *kv, int il, int pos0, int n, float *buf, int isa);
/* Bytes of one element of the cache: f16 or f32. */
static inline size_t lm_kv_elem_bytes(const lm_kv *kv)
{
    return kv->type == LM_KV_F16 ? 2 : 4;
}
/* One query head of a group sharing a KV head: keys lo..pos of the cache. */
typedef struct lm_attq {
    const float *q;
    float *out;
    int lo, pos;
} lm_attq;
/* The keys any of queries qs[0..n) attends: from the lowest lo to the highest pos. */
static inline void lm_attq_span(const lm_attq *qs, int n, int *lo, int *hi)
{
    *lo = qs[0].lo, *hi = qs[0].pos;
    for (int a = 1; a < n; a++) {
        *lo = qs[a].lo < *lo ? qs[a].lo : *lo;
        *hi = qs[a].pos > *hi ? qs[a].pos : *hi;
    }
}
/* The keys every one of them attends: from the highest lo to the lowest pos (empty when *lo > *hi). */
static inline void lm_attq_common(const lm_attq *qs, int n, int *lo, int *hi)
{
    *lo = qs[0].lo, *hi = qs[0].pos;
    for (int a = 1; a < n; a++) {
        *lo = qs[a].lo > *lo ? qs[a].lo : *lo;
        *hi = qs[a].pos < *hi ? qs[a].pos : *hi;
    }
}
/*
 * Cache rows a thread reads after its current attention job (the next
 * job's head), asked for a line at a time while the job computes, so
 * that they come from memory beside the arithmetic instead of before it
 * (attend_pass.c says when).  Two spans, K's and V's.
 */
typedef struct lm_ahead {
    const char *p[2];
    size_t lines[2];
} lm_ahead;
#define LM_ATT_QMAX 64     /* queries attended together, at most */
#define LM_ATT_ACC (16 * 16) /* floats of the value sums of one query */
/*
 * Queries qs[0..n) (n <= LM_ATT_QMAX) of KV head kh against the cache of
 * layer il; each query's pos is set, lo is set here (sliding windows).
 * scores: n rows of sstride >= n_ctx floats; acc: n * LM_ATT_ACC floats.
 * A query's output is the sum over its keys, in order, of exp(s - mx) v
 * (fused multiply-adds from zero), times 1 / the sum of the exp(s - mx):
 * it does not depend on the other queries in its group.
 */
void lm_attend_group(const lm_model *m, const lm_kv *kv, int il, int kh, lm_attq *qs, int n,
                     float *scores, size_t sstride, float *acc, int isa, lm_ahead *ahead);
/* The first key the query at pos attends in layer il: its sliding window's in a layer that has one. */
int lm_attend_first_key(const lm_model *m, int il, int pos);
/* Share `share` of `shares` of the rows of keys lo..hi of KV head kh of layer il, into a. */
void lm_attend_ahead(const lm_kv *kv, int il, int kh, int lo, int hi, int share, int shares, lm_ahead *a);
/*
 * lm_attend_group in two phases, for threads to share one head's work:
 * the scores of part `part` of `parts` of the keys (into rows every part
 * fills; the part's maxima, 16 floats a query, into vmx), then after every
 * part's scores, the values of part `part` of the output vectors (vmx:
 * [parts][n][16]; w and acc: the thread's own rows, as lm_attend_group's
 * scores and acc).  The same bytes as lm_attend_group; taken where
 * lm_attend_splits says so (AVX-512, heads of whole vectors up to 256).
 */
int lm_attend_splits(const lm_kv *kv, int isa);
void lm_attend_scores_part(const lm_model *m, const lm_kv *kv, int il, int kh, lm_attq *qs, int n, int part,
                           int parts, float *scores, size_t sstride, float *vmx);
void lm_attend_values_part(const lm_model *m, const lm_kv *kv, int il, int kh, lm_attq *qs, int n, int part,
                           int parts, const float *scores, size_t sstride, const float *vmx, float *w,
                           size_t wstride, float *acc);
int lm_attend_group_avx512(const lm_attq *qs, int n, const void *k0, const void *v0, int hd,
                           int hdv, float scale, float cap, float *scores, size_t sstride,
                           float *acc, int f16);
/* A head's scores and values in parts, for threads to share (attention_simd.c; 0: not taken) */
int lm_attend_scores_avx512(const lm_attq *qs, int n, const void *k0, int hd, int hdv, float scale,
                            int part, int parts, float *scores, size_t sstride, float *vmx, int f16);
int lm_attend_values_avx512(const lm_attq *qs, int n, const void *v0, int hd, int hdv, float cap,
                            int part, int parts, const float *scores, size_t sstride, const float *vmx,
                            float *w, size_t wstride, float *acc, int f16);
float lm_softmax_exp(float *scores, int lo, int hi, float mx);
float lm_softmax_finish(float *scores, int lo, int from, int hi, float mx, double part[16]);
float lm_softmax_exp_avx512(float *scores, int lo, int hi, float mx);
/* attention_avx2.c: the same without AVX-512, up to six queries at a time (0: head sizes it does not take) */
int lm_attend_group_avx2(const lm_attq *qs, int n, const void *k0, const void *v0, int hd, int hdv,
                         float scale, float cap, float *scores, size_t sstride, float *acc, int f16);
/* The same, asking for ahead's lines as it goes (NULL: none). */
int lm_attend_group_avx2_ahead(const lm_attq *qs, int n, const void *k0, const void *v0, int hd, int hdv,
                               float scale, float cap, float *scores, size_t sstride, int f16, lm_ahead *ahead);
float lm_softmax_exp_avx2(float *scores, int lo, int hi, float mx);
size_t lm_silu_mul_avx2(float *g, const float *up, size_t n);
/* attention_neon.c: the same on aarch64 (0: head sizes it does not take) */
int lm_attend_group_neon(const lm_attq *qs, int n, const void *k0, const void *v0, int hd, int hdv,
                         float scale, float cap, float *scores, size_t sstride, float *acc, int f16);
float lm_softmax_exp_neon(float *scores, int lo, int hi, float mx);
size_t lm_silu_mul_neon(float *g, const float *up, size_t n);
size_t lm_f16_to_f32_neon(float *dst, const uint16_t *src, size_t n);
double lm_sumsq_neon(const float *x, int n);
float lm_expf(float x);
float lm_silu(float g);
void lm_silu_mul(float *g, const float *up, size_t n, int isa);
size_t lm_silu_mul_avx512(float *g, const float *up, size_t n);

/*
 * exp(x) = 2^n * e^r with n = round(x / ln 2), r = x - n ln 2 (ln 2 split in
 * two so n ln 2 is exact), e^r by its Taylor series to r^6 (|r| <= ln2 / 2:
 * under 2 ulp).  The scalar and AVX-512 versions run the same operations in
 * the same order, so attention gives the same bytes on every path.
 */
#define EXP_LOG2E 0x1.715476p+0f
#define EXP_SHIFT 0x1.8p23f /* adding it rounds to an integer, kept in the low bits */
#define EXP_LN2_HI 0x1.62e4p-1f
#define EXP_LN2_LO 0x1.7f7d1cp-20f
#define EXP_UNDER -87.33f /* below: 0 (ggml's values here are denormal or 0) */
#define EXP_OVER 88.37f /* above: inf (n would pass 127; softmax only meets x <= 0) */
#define EXP_C6 (1.0f / 720)
#define EXP_C5 (1.0f / 120)
#define EXP_C4 (1.0f / 24)
#define EXP_C3 (1.0f / 6)
#define EXP_C2 0.5f

/*
 * Soft-capping, cap * tanh(x / cap) (Gemma 2's scores and logits), with
 * tanh(a) for a = |x / cap| as a + a^3 P(a^2) below TANH_POLY, where
 * 1 - 2 / (e^2a + 1) would cancel, and as that above: within 1.7 ulp of
 * tanh (glibc's tanhf 2.2 on the same sweep).  P is a least-error fit of
 * (tanh(a) - a) / a^3 on [0, 0.625].  Every path runs these operations in
 * this order (lm_softcap), so a capped score has the same bits on each.
 */
#define TANH_POLY 0.625f
#define TANH_P4 -0x1.75e1d4p-8f
#define TANH_P3 0x1.52269ep-6f
#define TANH_P2 -0x1.b83c5ap-5f
#define TANH_P1 0x1.110726p-3f
#define TANH_P0 -0x1.555532p-2f
float lm_softcap(float x, float cap);
void lm_softcap_rows(float *x, size_t n, float cap, int isa);
size_t lm_softcap_avx512(float *x, size_t n, float cap);
float lm_softcap_max_avx512(float *sc, int lo, int hi, float cap);
size_t lm_softcap_avx2(float *x, size_t n, float cap);
size_t lm_softcap_neon(float *x, size_t n, float cap);
float lm_gelu(const lm_model *m, float x);
void lm_gelu_mul(const lm_model *m, float *g, const float *up, size_t n, int isa);
size_t lm_gelu_mul_avx2(const float *table, float *g, const float *up, size_t n);
int lm_gelu_table_init(lm_model *m);

/* ---- forward.c, attend_pass.c ---- */
/* A context: the scratch of a forward pass, sized when it is made (forward.c). */
struct lm_ctx {
    const lm_model *m;
    int n_threads, ubatch; /* tokens a forward pass takes at most */
    int q_dim, k_dim, v_dim, o_dim;
    float *x, *xb, *q, *k, *v, *att, *proj, *hb, *hb2;
    float **own;         /* per thread: a one-token pass's own rows (forward.c's own_rows) */
    mm_scratch mm;       /* matmul: quantized activations, decoded rows */
    lm_ahead_tune ahead; /* how far ahead the one-token kernels ask for weights */
    int ahead_settled;   /* whether that tuning began with the weights where they stay */
    float **scores;      /* per thread: att_qmax rows of scores_cap scores, value sums */
    int scores_cap, att_qmax;
    float *split_scores; /* n_head rows of scores_cap, then n_head * n_threads maxima of 16 (split_parts) */
    float *kv32;         /* one layer of an f16 cache as f32 (lm_kv_layer_f32), kv32_floats floats */
    size_t kv32_floats;
    float *rope_cs, *rope_sn; /* per token of the ubatch: its rotation (lm_rope_angles) */
    int rope_pos0, rope_n, rope_swa, rope_ctx; /* what they were computed for; rope_n -1: nothing */
};
/*
 * Layer il's attention for n tokens at pos0.., by every thread of the
 * pass's region: rotates c->q and c->k, writes the keys and values to the
 * cache, and attends from the rows of tokens `from`.. only (moved down to
 * row 0, the residual rows with them) into c->att.  Returns how many rows
 * go on (n - from, 0 if none).
 */
int lm_pass_attention(lm_ctx *c, lm_kv *kv, int il, int n, int pos0, int from);

#endif
