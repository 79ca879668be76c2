/*
 * lm/lm.h - the engine: GGUF files, tensor types, model architectures, the
 * forward pass and sampling.  This is the only header other modules include
 * from lm/.  Nothing here prints or exits: every function that can fail
 * returns -1 (or NULL) and leaves a one-line message in an lm_err, naming the
 * file and the offending offset, tensor or value.
 *
 * Determinism contract: the logits of a position depend only on the tokens
 * at positions <= it, never on how the tokens were split into lm_decode()
 * calls or on the thread count.  Every kernel below computes each output
 * element with a fixed reduction order to keep that promise.
 */
#ifndef KVCHAT_LM_H
#define KVCHAT_LM_H

#include <stddef.h>
#include <stdint.h>

typedef struct lm_err {
    char msg[512];
} lm_err;

void lm_seterr(lm_err *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ------------------------------------------------------------------ GGUF */

enum gguf_vtype {
    GGUF_U8 = 0, GGUF_I8, GGUF_U16, GGUF_I16, GGUF_U32, GGUF_I32, GGUF_F32,
    GGUF_BOOL, GGUF_STRING, GGUF_ARRAY, GGUF_U64, GGUF_I64, GGUF_F64,
    GGUF_NTYPES
};

typedef struct gguf_kv {
    char *key;                /* NUL-terminated copy */
    uint32_t type;            /* enum gguf_vtype */
    uint32_t arr_type;        /* element type when type == GGUF_ARRAY */
    uint64_t arr_n;           /* element count when type == GGUF_ARRAY */
    const uint8_t *data;      /* value bytes (string: its bytes; array: first element) */
    uint64_t str_len;         /* type == GGUF_STRING */
    uint64_t *str_off;        /* string arrays: offset of element i's length field from data */
} gguf_kv;

#define LM_MAX_DIMS 4

typedef struct gguf_tensor {
    char *name;
    uint32_t n_dims;
    int64_t ne[LM_MAX_DIMS];  /* ne[0] is the contiguous (row) dimension */
    uint32_t type;            /* ggml type id */
    uint64_t offset;          /* from the start of the data section */
    uint64_t nbytes;
    const void *data;         /* inside the read-only mapping */
} gguf_tensor;

typedef struct gguf_file {
    char *path;
    const uint8_t *map;
    size_t size;
    uint32_t version;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;
    gguf_tensor *tensors;
    uint64_t alignment;
    uint64_t data_off;
    int mapped;               /* map came from gguf_open: unmap on close */
    int fd;                   /* while mapped: the file, open (the weights' copy reads it) */
} gguf_file;

int gguf_open(gguf_file *g, const char *path, lm_err *e);
int gguf_parse(gguf_file *g, const char *name, const uint8_t *buf, size_t size, lm_err *e);
void gguf_close(gguf_file *g);
const gguf_kv *gguf_find(const gguf_file *g, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name);
/* Typed getters: 1 found, 0 absent, -1 present with the wrong type (message set). */
int gguf_get_u32(const gguf_file *g, const char *key, uint32_t *out, lm_err *e);
int gguf_get_f32(const gguf_file *g, const char *key, float *out, lm_err *e);
int gguf_get_bool(const gguf_file *g, const char *key, int *out, lm_err *e);
/* Returns a pointer into the mapping (not NUL-terminated) and its length. */
int gguf_get_str(const gguf_file *g, const char *key, const char **s, size_t *len, lm_err *e);
const char *gguf_arr_str(const gguf_kv *kv, uint64_t i, size_t *len);
const char *gguf_type_name(uint32_t vtype);

/* --------------------------------------------------------- tensor types */

enum lm_type {
    LM_F32 = 0, LM_F16 = 1, LM_Q4_0 = 2, LM_Q4_1 = 3, LM_Q5_0 = 6, LM_Q5_1 = 7,
    LM_Q8_0 = 8, LM_Q8_1 = 9, LM_Q2_K = 10, LM_Q3_K = 11, LM_Q4_K = 12,
    LM_Q5_K = 13, LM_Q6_K = 14, LM_Q8_K = 15, LM_BF16 = 30, LM_NTYPES = 40
};

const char *lm_type_name(uint32_t type);          /* "Q4_K", or NULL if unknown */
int lm_type_known(uint32_t type);                 /* a ggml type id we can size */
int lm_type_supported(uint32_t type);             /* one we can multiply with */
int64_t lm_type_block(uint32_t type);             /* elements per block */
size_t lm_type_size(uint32_t type);               /* bytes per block */
size_t lm_row_bytes(uint32_t type, int64_t n);    /* n must be a block multiple */
void lm_dequant_row(uint32_t type, const void *src, float *dst, int64_t n);
float lm_f16_to_f32(uint16_t h);
uint16_t lm_f32_to_f16(float f);
float lm_bf16_to_f32(uint16_t h);

/* --------------------------------------------------------------- models */

typedef struct lm_tensor {
    const char *name;
    uint32_t type;
    int64_t ne[2];
    const void *data;
    int layout; /* LM_LAYOUT_*: how data holds the rows (lm/repack.c) */
} lm_tensor;

enum lm_layout {
    LM_LAYOUT_FILE,       /* as the GGUF file stores them */
    LM_LAYOUT_Q4_0_LANES, /* Q4_0 rows rearranged for the kernels with blocks in lanes */
    LM_LAYOUT_Q4_K_LANES, /* Q4_K rows rearranged so a group's codes add up in a lane */
    LM_LAYOUT_Q6_K_LANES, /* the same for Q6_K */
    LM_LAYOUT_Q5_0_LANES, /* Q5_0 rows rearranged as Q4_0's, their fifth bits spread for shifts (AVX2) */
    LM_LAYOUT_Q5_1_LANES, /* the same for Q5_1, the blocks' mins after their scales */
    LM_LAYOUT_Q8_0_LANES, /* Q8_0 rows' whole steps of 16 blocks rearranged with blocks in lanes */
};

enum lm_rope_style { LM_ROPE_NORM, LM_ROPE_NEOX };

typedef struct lm_hparams {
    int n_vocab, n_ctx_train, n_embd, n_layer, n_head, n_head_kv, n_ff;
    int head_dim, head_dim_v, n_rot;
    float rms_eps;
    float rope_base, rope_freq_scale, rope_attn_factor;
    float rope_base_swa, rope_freq_scale_swa;   /* sliding-window layers */
    int n_ctx_orig;          /* rope.scaling.original_context_length (LongRoPE) */
    int sliding_window;      /* 0: none */
    int swa_pattern;         /* layer il slides when il % p < p - 1; 1: every layer */
    float attn_scale;        /* multiplies q.k (or q itself, see ARCH_Q_PRESCALE) */
    float attn_softcap, final_softcap;          /* 0: off */
} lm_hparams;

typedef struct lm_layer {
    const lm_tensor *attn_norm, *wq, *wk, *wv, *wqkv, *wo, *bq, *bk, *bv;
    const lm_tensor *q_norm, *k_norm, *post_attn_norm;
    const lm_tensor *ffn_norm, *w_gate, *w_up, *w_down, *post_ffn_norm;
} lm_layer;

struct lm_arch;

typedef struct lm_model {
    gguf_file gguf;
    const struct lm_arch *arch;
    lm_hparams hp;
    int rope_style;
    lm_tensor *tensors;      /* one per GGUF tensor, same order */
    const lm_tensor *tok_embd, *output_norm, *output, *rope_freqs, *rope_long, *rope_short;
    lm_layer *layers;
    float *gelu_table;       /* ggml's f16 GELU table, for archs that use GELU */
    struct lm_copy *copy;    /* the weights' copy into huge pages, or NULL (weights_copy.c) */
} lm_model;

int lm_model_open(lm_model *m, const char *path, lm_err *e);
/* The same on m->gguf already parsed (from memory, for instance); closes it on failure. */
int lm_model_init(lm_model *m, lm_err *e);
void lm_model_close(lm_model *m);
/*
 * lm_model_open's weights move into 2 MiB pages in the background, while
 * no decode runs (weights_copy.c; KVCHAT_MMAP keeps them mapped).  Settle
 * makes the rest of the copy now, on every thread, and has every tensor
 * read from it (benchmarks, before timing);
 * copied says whether they do.  Eager: where no one types between
 * messages (a script, a pipe), decodes finish the copy themselves once
 * they have taken as long as the rest of it would.
 */
void lm_weights_settle(const lm_model *m);
void lm_weights_eager(const lm_model *m);
int lm_weights_copied(const lm_model *m);
const char *lm_arch_name(const lm_model *m);
/* The architecture's features, comma separated (for kvchat info). */
void lm_arch_features(const lm_model *m, char *buf, size_t size);
/* Whether layer il attends through the sliding window. */
int lm_layer_swa(const lm_model *m, int il);
/* Writes the comma-separated list of architecture names into buf. */
void lm_supported_archs(char *buf, size_t size);
/* Bytes of K and V per token for a cache of the given element size. */
size_t lm_kv_bytes_per_token(const lm_model *m, size_t elem_size);

/* ------------------------------------------------------- KV cache + eval */

enum lm_kv_type { LM_KV_F32 = 0, LM_KV_F16 = 1 };

/*
 * Keys and values of every layer and KV head, f32 or f16.  A head's keys are
 * kept in tiles of 16 positions, component by component (for each d, the
 * 16 keys' d-th values side by side), so 16 scores come out of one vector
 * multiply-add a component; its values are rows, one a position.  n_pos is
 * n_ctx rounded up to whole pairs of tiles.  It holds layers first_layer..
 * first_layer + n_layer - 1: all of them (first_layer 0) but in the f32 copy
 * of one layer that attention may read (lm/attention.c's lm_kv_layer_f32).
 *   k: [n_layer][n_head_kv][n_pos / 16][head_dim][16]
 *   v: [n_layer][n_head_kv][n_pos][head_dim_v]
 */
typedef struct lm_kv {
    int n_ctx, n_pos, n_layer, first_layer, n_head_kv, head_dim, head_dim_v, type;
    int touched; /* positions [0, touched) have had their pages touched (lm_kv_touch) */
    void *k, *v;
} lm_kv;

int lm_kv_init(lm_kv *kv, const lm_model *m, int n_ctx, int type, lm_err *e);
void lm_kv_free(lm_kv *kv);
/*
 * Maps the memory of positions [from, to) ahead of their first stores (the
 * cache is allocated lazily: a page is faulted in when first written).  The
 * content is kept; positions past n_ctx are ignored.
 */
void lm_kv_populate(lm_kv *kv, int from, int to);
/*
 * Reads a byte of each page of positions [from, to), populated before, so
 * that their first stores cost no trap either (see kv.c); positions
 * touched before are skipped.
 */
void lm_kv_touch(lm_kv *kv, int from, int to);

typedef struct lm_ctx lm_ctx;

lm_ctx *lm_ctx_new(const lm_model *m, int n_threads, lm_err *e);
void lm_ctx_free(lm_ctx *c);
int lm_default_threads(void);
/* Bytes ahead of its reads a one-token pass asks for weights, whether into L1 too (just
   before), and whether that is chosen yet: tuned on the context's first passes. */
size_t lm_ctx_prefetch(const lm_ctx *c, int *l1_too, int *chosen);

enum lm_logits_mode { LM_LOGITS_NONE, LM_LOGITS_LAST, LM_LOGITS_ALL };

/*
 * Evaluates tokens[0..n) at positions pos0..pos0+n-1, writing their K/V into
 * kv.  logits receives n_vocab floats for the last token (LM_LOGITS_LAST) or
 * for every token (LM_LOGITS_ALL).  Positions must satisfy pos0 + n <= n_ctx.
 * Returns 0, or -1 when interrupted via *stop (checked between micro-batches
 * and layers) or on a bad token id.
 */
int lm_decode(lm_ctx *c, lm_kv *kv, const int32_t *tokens, int n, int pos0,
              int logits_mode, float *logits, volatile int *stop, lm_err *e);

/* ------------------------------------------------------------- sampling */

typedef struct lm_sampling {
    float temp;             /* <= 0: greedy */
    int top_k;              /* <= 0: off */
    float top_p;            /* >= 1: off */
    float min_p;            /* <= 0: off */
    float repeat_penalty;   /* 1: off */
    int repeat_last_n;
    uint64_t seed;
} lm_sampling;

void lm_sampling_defaults(lm_sampling *p);

typedef struct lm_sampler lm_sampler;
lm_sampler *lm_sampler_new(const lm_sampling *p, int n_vocab);
void lm_sampler_free(lm_sampler *s);
void lm_sampler_reseed(lm_sampler *s, uint64_t seed);
uint64_t lm_sampler_state(const lm_sampler *s);   /* for carrying the stream over */
/* recent: the last tokens of the context, for the repeat penalty. */
int32_t lm_sample(lm_sampler *s, const float *logits, const int32_t *recent, int n_recent);
int32_t lm_argmax(const float *logits, int n);

#endif
