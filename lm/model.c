/*
 * lm/model.c - model descriptions.  An architecture is a table entry: its
 * GGUF name, RoPE style and feature flags; the loader reads the
 * hyperparameters under "<arch>.*", binds every tensor the entry needs and
 * checks its shape and type before anything runs.  The forward pass
 * (forward.c) reads only the lm_model filled in here, so adding an
 * architecture means adding an entry and the few steps where it differs.
 */
#include "lm.h"
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const lm_arch ARCHS[] = {
    /* name     rope          features                                    swa  base_swa big */
    {"llama", LM_ROPE_NORM, 0, 0, 0, 0},
    {"qwen2", LM_ROPE_NEOX, ARCH_QKV_BIAS, 0, 0, 0},
    {"qwen3", LM_ROPE_NEOX, ARCH_QK_NORM, 0, 0, 0},
    {"phi3", LM_ROPE_NEOX, ARCH_FUSED_QKV | ARCH_FUSED_GATE_UP | ARCH_Q_PRESCALE |
                               ARCH_ROPE_FACTORS | ARCH_NO_SWA, 0, 0, 0},
    {"gemma", LM_ROPE_NEOX, ARCH_EMBD_SCALE | ARCH_GELU | ARCH_Q_PRESCALE, 0, 0, 0},
    {"gemma2", LM_ROPE_NEOX, ARCH_EMBD_SCALE | ARCH_POST_NORMS | ARCH_GELU | ARCH_Q_PRESCALE |
                                 ARCH_SOFTCAP, 2, 0, 46},
    {"gemma3", LM_ROPE_NEOX, ARCH_EMBD_SCALE | ARCH_POST_NORMS | ARCH_GELU | ARCH_Q_PRESCALE |
                                 ARCH_QK_NORM | ARCH_SOFTCAP, 6, 10000.0f, 62},
};

static const char *const FEATURES[] = {
    "qkv-bias", "qk-norm", "fused-qkv", "fused-gate-up", "embedding-scale", "post-norms",
    "gelu", "q-prescale", "softcap", "longrope", "swa-ignored",
};

void lm_arch_features(const lm_model *m, char *buf, size_t size)
{
    size_t off = (size_t)snprintf(buf, size, "rope=%s", m->rope_style == LM_ROPE_NEOX ? "neox" : "norm");
    unsigned shown = m->arch->flags & ~(unsigned)(ARCH_SOFTCAP | ARCH_ROPE_FACTORS);
    for (size_t i = 0; i < sizeof FEATURES / sizeof FEATURES[0] && off < size; i++)
        if (shown & (1u << i))
            off += (size_t)snprintf(buf + off, size - off, ", %s", FEATURES[i]);
    if (m->hp.attn_softcap > 0 && off < size)
        off += (size_t)snprintf(buf + off, size - off, ", attn-softcap=%g", m->hp.attn_softcap);
    if (m->hp.final_softcap > 0 && off < size)
        off += (size_t)snprintf(buf + off, size - off, ", final-softcap=%g", m->hp.final_softcap);
    if (m->rope_long && m->rope_short && off < size)
        off += (size_t)snprintf(buf + off, size - off, ", longrope (original context %d)", m->hp.n_ctx_orig);
    if (m->hp.sliding_window && off < size)
        off += (size_t)snprintf(buf + off, size - off, ", sliding-window=%d (pattern %d)",
                                m->hp.sliding_window, m->hp.swa_pattern);
    if (m->rope_freqs && off < size)
        snprintf(buf + off, size - off, ", rope-freqs");
}

int lm_layer_swa(const lm_model *m, int il)
{
    int p = m->hp.swa_pattern;
    return m->hp.sliding_window > 0 && (p <= 1 || il % p < p - 1);
}
#define N_ARCHS (sizeof ARCHS / sizeof ARCHS[0])

void lm_supported_archs(char *buf, size_t size)
{
    size_t off = 0;
    buf[0] = 0;
    for (size_t i = 0; i < N_ARCHS && off < size; i++)
        off += (size_t)snprintf(buf + off, size - off, "%s%s", i ? ", " : "", ARCHS[i].name);
}

const char *lm_arch_name(const lm_model *m) { return m->arch->name; }

static const lm_arch *find_arch(const char *name, size_t len)
{
    for (size_t i = 0; i < N_ARCHS; i++)
        if (strlen(ARCHS[i].name) == len && !memcmp(ARCHS[i].name, name, len))
            return &ARCHS[i];
    return NULL;
}

/* Reads "<arch>.<key>" as u32; missing and required is an error. */
static int hp_u32(const lm_model *m, const char *key, int *out, int required, lm_err *e)
{
    char full[160];
    snprintf(full, sizeof full, "%s.%s", m->arch->name, key);
    uint32_t v;
    int r = gguf_get_u32(&m->gguf, full, &v, e);
    if (r < 0)
        return -1;
    if (r == 0) {
        if (!required)
            return 0;
        lm_seterr(e, "%s: missing metadata key '%s'", m->gguf.path, full);
        return -1;
    }
    if (v > (1u << 30)) {
        lm_seterr(e, "%s: metadata '%s' = %u is out of range", m->gguf.path, full, v);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int hp_f32(const lm_model *m, const char *key, float *out, lm_err *e)
{
    char full[160];
    snprintf(full, sizeof full, "%s.%s", m->arch->name, key);
    return gguf_get_f32(&m->gguf, full, out, e) < 0 ? -1 : 0;
}

static int positive(const lm_model *m, const char *what, int v, lm_err *e)
{
    if (v > 0)
        return 0;
    lm_seterr(e, "%s: %s must be positive, got %d", m->gguf.path, what, v);
    return -1;
}

static int read_rope_scaling(lm_model *m, lm_err *e)
{
    char key[160];
    const char *s;
    size_t len;
    snprintf(key, sizeof key, "%s.rope.scaling.type", m->arch->name);
    int r = gguf_get_str(&m->gguf, key, &s, &len, e);
    if (r < 0)
        return -1;
    float factor = 0;
    if (hp_f32(m, "rope.scaling.factor", &factor, e))
        return -1;
    if (r == 0 || (len == 4 && !memcmp(s, "none", 4)) || factor == 0 || factor == 1)
        return 0;
    if (len == 6 && !memcmp(s, "linear", 6)) {
        m->hp.rope_freq_scale = 1.0f / factor;
        return 0;
    }
    if (len == 8 && !memcmp(s, "longrope", 8))
        return 0; /* the factors come as tensors */
    lm_seterr(e, "%s: rope scaling type '%.*s' is not supported (none, linear are)", m->gguf.path,
              (int)len, s);
    return -1;
}

/* Sliding window, soft-capping, attention scale and LongRoPE settings. */
static int read_arch_hparams(lm_model *m, lm_err *e)
{
    lm_hparams *hp = &m->hp;
    const lm_arch *a = m->arch;
    hp->rope_attn_factor = 1.0f;
    hp->n_ctx_orig = hp->n_ctx_train;
    if (hp_f32(m, "rope.scaling.attn_factor", &hp->rope_attn_factor, e) ||
        hp_u32(m, "rope.scaling.original_context_length", &hp->n_ctx_orig, 0, e))
        return -1;
    if (!(a->flags & ARCH_NO_SWA) && hp_u32(m, "attention.sliding_window", &hp->sliding_window, 0, e))
        return -1;
    hp->swa_pattern = a->swa_pattern;
    hp->rope_base_swa = a->rope_base_swa > 0 ? a->rope_base_swa : hp->rope_base;
    hp->rope_freq_scale_swa = a->rope_base_swa > 0 ? 1.0f : hp->rope_freq_scale;
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    if (a->big_n_layer && hp->n_layer == a->big_n_layer) /* Gemma 27B: query_pre_attn_scalar */
        hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
    if (a->flags & ARCH_SOFTCAP) { /* gemma2 caps attention too; gemma3 only the logits, if set */
        int gemma2 = !strcmp(a->name, "gemma2");
        if (gemma2)
            hp->attn_softcap = 50.0f, hp->final_softcap = 30.0f;
        if ((gemma2 && hp_f32(m, "attn_logit_softcapping", &hp->attn_softcap, e)) ||
            hp_f32(m, "final_logit_softcapping", &hp->final_softcap, e))
            return -1;
    }
    if (hp->attn_softcap < 0 || hp->final_softcap < 0 || !(hp->rope_attn_factor > 0)) {
        lm_seterr(e, "%s: bad soft-capping or rope attention factor", m->gguf.path);
        return -1;
    }
    return 0;
}

static int read_hparams(lm_model *m, lm_err *e)
{
    lm_hparams *hp = &m->hp;
    memset(hp, 0, sizeof *hp);
    if (hp_u32(m, "embedding_length", &hp->n_embd, 1, e) ||
        hp_u32(m, "block_count", &hp->n_layer, 1, e) ||
        hp_u32(m, "feed_forward_length", &hp->n_ff, 1, e) ||
        hp_u32(m, "attention.head_count", &hp->n_head, 1, e))
        return -1;
    hp->n_head_kv = hp->n_head;
    hp->n_ctx_train = 2048;
    if (hp_u32(m, "attention.head_count_kv", &hp->n_head_kv, 0, e) ||
        hp_u32(m, "context_length", &hp->n_ctx_train, 0, e))
        return -1;
    if (positive(m, "embedding_length", hp->n_embd, e) ||
        positive(m, "block_count", hp->n_layer, e) ||
        positive(m, "feed_forward_length", hp->n_ff, e) ||
        positive(m, "attention.head_count", hp->n_head, e) ||
        positive(m, "attention.head_count_kv", hp->n_head_kv, e) ||
        positive(m, "context_length", hp->n_ctx_train, e))
        return -1;
    if (hp->n_head % hp->n_head_kv) {
        lm_seterr(e, "%s: head_count %d is not a multiple of head_count_kv %d", m->gguf.path,
                  hp->n_head, hp->n_head_kv);
        return -1;
    }
    hp->head_dim = hp->n_embd / hp->n_head;
    if (hp_u32(m, "attention.key_length", &hp->head_dim, 0, e))
        return -1;
    hp->head_dim_v = hp->head_dim;
    if (hp_u32(m, "attention.value_length", &hp->head_dim_v, 0, e))
        return -1;
    hp->n_rot = hp->head_dim;
    if (hp_u32(m, "rope.dimension_count", &hp->n_rot, 0, e))
        return -1;
    if (positive(m, "attention.key_length", hp->head_dim, e) ||
        positive(m, "attention.value_length", hp->head_dim_v, e))
        return -1;
    if (hp->n_rot > hp->head_dim || hp->n_rot % 2) {
        lm_seterr(e, "%s: rope dimension count %d does not fit head size %d", m->gguf.path,
                  hp->n_rot, hp->head_dim);
        return -1;
    }
    hp->rms_eps = 1e-5f;
    hp->rope_base = 10000.0f;
    hp->rope_freq_scale = 1.0f;
    if (hp_f32(m, "attention.layer_norm_rms_epsilon", &hp->rms_eps, e) ||
        hp_f32(m, "rope.freq_base", &hp->rope_base, e))
        return -1;
    if (!(hp->rms_eps > 0) || !(hp->rope_base > 0)) {
        lm_seterr(e, "%s: bad rms epsilon %g or rope base %g", m->gguf.path, hp->rms_eps,
                  hp->rope_base);
        return -1;
    }
    if (read_rope_scaling(m, e) || read_arch_hparams(m, e))
        return -1;
    return 0;
}

/* Finds a tensor, checks its shape (ne1 = 0: one-dimensional) and type. */
static const lm_tensor *bind(lm_model *m, const char *name, int64_t ne0, int64_t ne1,
                             int required, lm_err *e)
{
    const gguf_file *g = &m->gguf;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        if (strcmp(t->name, name))
            continue;
        int dims_ok = ne1 ? (t->ne[0] == ne0 && t->ne[1] == ne1 && t->ne[2] == 1 && t->ne[3] == 1)
                          : (t->ne[0] == ne0 && t->ne[1] == 1 && t->ne[2] == 1 && t->ne[3] == 1);
        if (!dims_ok) {
            lm_seterr(e, "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
                      g->path, name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                      (long long)t->ne[3], (long long)ne0, (long long)(ne1 ? ne1 : 1));
            return NULL;
        }
        if (!lm_type_supported(t->type) || (!ne1 && t->type != LM_F32)) {
            lm_seterr(e, "%s: tensor '%s' has type %s, which is not supported here", g->path,
                      name, lm_type_name(t->type));
            return NULL;
        }
        if ((uintptr_t)t->data % 4) {
            lm_seterr(e, "%s: tensor '%s' data at offset %llu is not 4-byte aligned", g->path, name,
                      (unsigned long long)(g->data_off + t->offset));
            return NULL;
        }
        return &m->tensors[i];
    }
    if (required)
        lm_seterr(e, "%s: missing tensor '%s'", g->path, name);
    else
        e->msg[0] = 0;
    return NULL;
}

#define BIND(dst, name, ne0, ne1)                                                                  \
    do {                                                                                           \
        if (!((dst) = bind(m, name, ne0, ne1, 1, e)))                                              \
            return -1;                                                                             \
    } while (0)

static const lm_tensor *bind_optional(lm_model *m, const char *name, int64_t ne0, int64_t ne1,
                                      int *err, lm_err *e)
{
    const lm_tensor *t = bind(m, name, ne0, ne1, 0, e);
    if (!t && e->msg[0])
        *err = 1;
    return t;
}

static int bind_attention(lm_model *m, int il, lm_err *e)
{
    const lm_hparams *hp = &m->hp;
    const unsigned f = m->arch->flags;
    lm_layer *L = &m->layers[il];
    int64_t q_dim = (int64_t)hp->n_head * hp->head_dim, k_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    int64_t v_dim = (int64_t)hp->n_head_kv * hp->head_dim_v, o_dim = (int64_t)hp->n_head * hp->head_dim_v;
    char n[96];
    int err = 0;
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, il), n)
    if (f & ARCH_FUSED_QKV)
        L->wqkv = bind_optional(m, NAME("attn_qkv.weight"), hp->n_embd, q_dim + k_dim + v_dim, &err, e);
    if (err)
        return -1;
    if (!L->wqkv) {
        BIND(L->wq, NAME("attn_q.weight"), hp->n_embd, q_dim);
        BIND(L->wk, NAME("attn_k.weight"), hp->n_embd, k_dim);
        BIND(L->wv, NAME("attn_v.weight"), hp->n_embd, v_dim);
    }
    BIND(L->wo, NAME("attn_output.weight"), o_dim, hp->n_embd);
    if (f & ARCH_QKV_BIAS) {
        BIND(L->bq, NAME("attn_q.bias"), q_dim, 0);
        BIND(L->bk, NAME("attn_k.bias"), k_dim, 0);
        BIND(L->bv, NAME("attn_v.bias"), v_dim, 0);
    }
    if (f & ARCH_QK_NORM) {
        BIND(L->q_norm, NAME("attn_q_norm.weight"), hp->head_dim, 0);
        BIND(L->k_norm, NAME("attn_k_norm.weight"), hp->head_dim, 0);
    }
    if (f & ARCH_POST_NORMS)
        BIND(L->post_attn_norm, NAME("post_attention_norm.weight"), hp->n_embd, 0);
    return 0;
}

static int bind_layer(lm_model *m, int il, lm_err *e)
{
    const lm_hparams *hp = &m->hp;
    const unsigned f = m->arch->flags;
    lm_layer *L = &m->layers[il];
    char n[96];
    BIND(L->attn_norm, NAME("attn_norm.weight"), hp->n_embd, 0);
    if (bind_attention(m, il, e))
        return -1;
    BIND(L->ffn_norm, NAME("ffn_norm.weight"), hp->n_embd, 0);
    if (f & ARCH_FUSED_GATE_UP) {
        BIND(L->w_up, NAME("ffn_up.weight"), hp->n_embd, 2 * (int64_t)hp->n_ff);
    } else {
        BIND(L->w_gate, NAME("ffn_gate.weight"), hp->n_embd, hp->n_ff);
        BIND(L->w_up, NAME("ffn_up.weight"), hp->n_embd, hp->n_ff);
    }
    BIND(L->w_down, NAME("ffn_down.weight"), hp->n_ff, hp->n_embd);
    if (f & ARCH_POST_NORMS)
        BIND(L->post_ffn_norm, NAME("post_ffw_norm.weight"), hp->n_embd, 0);
#undef NAME
    return 0;
}

static int bind_tensors(lm_model *m, lm_err *e)
{
    const gguf_file *g = &m->gguf;
    if ((uint64_t)m->hp.n_layer > g->n_tensors) { /* before allocating per-layer state */
        lm_seterr(e, "%s: block_count %d exceeds the %llu tensors of the file", g->path,
                  m->hp.n_layer, (unsigned long long)g->n_tensors);
        return -1;
    }
    m->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *m->tensors);
    m->layers = calloc((size_t)m->hp.n_layer, sizeof *m->layers);
    if (!m->tensors || !m->layers) {
        lm_seterr(e, "%s: out of memory", g->path);
        return -1;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        m->tensors[i] = (lm_tensor){t->name, t->type, {t->ne[0], t->ne[1]}, t->data, LM_LAYOUT_FILE};
    }
    const gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
    if (!emb) {
        lm_seterr(e, "%s: missing tensor 'token_embd.weight'", g->path);
        return -1;
    }
    m->hp.n_vocab = (int)(emb->ne[1] > (1 << 30) ? 0 : emb->ne[1]);
    if (positive(m, "vocabulary size", m->hp.n_vocab, e))
        return -1;
    BIND(m->tok_embd, "token_embd.weight", m->hp.n_embd, m->hp.n_vocab);
    BIND(m->output_norm, "output_norm.weight", m->hp.n_embd, 0);
    int err = 0;
    m->output = bind_optional(m, "output.weight", m->hp.n_embd, m->hp.n_vocab, &err, e);
    m->rope_freqs = bind_optional(m, "rope_freqs.weight", m->hp.n_rot / 2, 0, &err, e);
    if (m->arch->flags & ARCH_ROPE_FACTORS) {
        m->rope_long = bind_optional(m, "rope_factors_long.weight", m->hp.n_rot / 2, 0, &err, e);
        m->rope_short = bind_optional(m, "rope_factors_short.weight", m->hp.n_rot / 2, 0, &err, e);
    }
    if (err)
        return -1;
    if (!m->output)
        m->output = m->tok_embd; /* tied embeddings */
    for (int il = 0; il < m->hp.n_layer; il++)
        if (bind_layer(m, il, e))
            return -1;
    return 0;
}

int lm_model_open(lm_model *m, const char *path, lm_err *e)
{
    memset(m, 0, sizeof *m);
    if (gguf_open(&m->gguf, path, e) || lm_model_init(m, e))
        return -1;
    m->copy = lm_weights_plan(&m->gguf);
    return 0;
}

int lm_model_init(lm_model *m, lm_err *e)
{
    const char *path = m->gguf.path, *name;
    size_t len;
    int r = gguf_get_str(&m->gguf, "general.architecture", &name, &len, e);
    if (r <= 0) {
        if (r == 0)
            lm_seterr(e, "%s: missing metadata key 'general.architecture'", path);
        goto fail;
    }
    m->arch = find_arch(name, len);
    if (!m->arch) {
        char list[256];
        lm_supported_archs(list, sizeof list);
        lm_seterr(e, "%s: unsupported architecture '%.*s' (supported: %s)", path,
                  (int)(len > 64 ? 64 : len), name, list);
        goto fail;
    }
    m->rope_style = m->arch->rope_style;
    if (read_hparams(m, e) || bind_tensors(m, e))
        goto fail;
    if ((m->arch->flags & ARCH_GELU) && lm_gelu_table_init(m)) {
        lm_seterr(e, "%s: out of memory", path);
        goto fail;
    }
    return 0;
fail:
    lm_model_close(m);
    return -1;
}

void lm_model_close(lm_model *m)
{
    lm_weights_free(m->copy); /* stops the copy before the mapping it reads goes */
    free(m->gelu_table);
    free(m->tensors);
    free(m->layers);
    gguf_close(&m->gguf);
    memset(m, 0, sizeof *m);
}

size_t lm_kv_bytes_per_token(const lm_model *m, size_t elem_size)
{
    const lm_hparams *hp = &m->hp;
    return (size_t)hp->n_layer * (size_t)hp->n_head_kv * (size_t)(hp->head_dim + hp->head_dim_v) *
           elem_size;
}
