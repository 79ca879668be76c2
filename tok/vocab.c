/*
 * tok/vocab.c - building a tok_vocab from GGUF metadata: the token list,
 * scores and types, the text -> id and merge -> rank hash tables, special
 * token ids and flags, the end-of-generation set and the piece cache.  The
 * rules (defaults per tokenizer model, which flags a pre-tokenizer implies,
 * which token texts end a generation) are llama.cpp's, so the same file
 * tokenizes the same way in both programs.
 */
#include "internal.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_VOCAB (1 << 24)

uint32_t tok_hash(const char *s, size_t len, uint32_t seed)
{
    uint32_t h = 2166136261u ^ seed;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

/* The slot of text s (hash h): the one that holds its id, or the empty one where it would go. */
static uint32_t text_slot(const tok_vocab *v, const char *s, size_t len, uint32_t h)
{
    uint32_t mask = v->n_slots - 1, i = h & mask;
    for (; v->slots[i] >= 0; i = (i + 1) & mask) {
        const tok_entry *t = &v->tok[v->slots[i]];
        if (t->len == len && !memcmp(t->text, s, len))
            break;
    }
    return i;
}

/* tok_lookup with the text's hash already known */
static int32_t lookup_hashed(const tok_vocab *v, const char *s, size_t len, uint32_t h)
{
    return v->slots[text_slot(v, s, len, h)]; /* -1 in an empty slot */
}

int32_t tok_lookup(const tok_vocab *v, const char *s, size_t len)
{
    return lookup_hashed(v, s, len, tok_hash(s, len, 0));
}

int32_t tok_find(const tok_vocab *v, const char *text, size_t len)
{
    return tok_lookup(v, text, len);
}

/* The pair's 64 bits, mixed (a multiply spreads them into the high half). */
static uint32_t pair_hash(int32_t a, int32_t b)
{
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    k = (k ^ (k >> 31)) * 0x9e3779b97f4a7c15ull;
    return (uint32_t)(k >> 32);
}

/* The slot of pair (a, b): the one that holds it, or the empty one where it would go. */
static merge_slot *merge_find(const tok_vocab *v, int32_t a, int32_t b)
{
    uint32_t mask = v->n_merge_slots - 1, i = pair_hash(a, b) & mask;
    while (v->merges[i].rank >= 0 && (v->merges[i].a != a || v->merges[i].b != b))
        i = (i + 1) & mask;
    return &v->merges[i];
}

int32_t tok_merge_rank(const tok_vocab *v, int32_t a, int32_t b)
{
    if (!v->n_merge_slots || a < 0 || b < 0)
        return -1;
    return merge_find(v, a, b)->rank; /* -1 in an empty slot */
}

/* A power of two of at least 16 slots and at least n * num / den. */
static uint32_t slots_for(uint64_t n, uint64_t num, uint64_t den)
{
    uint32_t s = 16;
    while ((uint64_t)s * den < n * num)
        s <<= 1;
    return s;
}

static int build_index(tok_vocab *v, const char *path, lm_err *e)
{
    v->n_slots = slots_for((uint64_t)v->n, 2, 1);
    v->slots = malloc(v->n_slots * sizeof *v->slots);
    if (!v->slots) {
        lm_seterr(e, "%s: out of memory for the vocabulary", path);
        return -1;
    }
    memset(v->slots, 0xff, v->n_slots * sizeof *v->slots);
    for (int32_t id = 0; id < v->n; id++) {
        const tok_entry *t = &v->tok[id];
        const uint32_t i = text_slot(v, t->text, t->len, tok_hash(t->text, t->len, 0));
        if (v->slots[i] >= 0) {
            lm_seterr(e, "%s: duplicate token in vocabulary: '%.*s' has ids %d and %d", path,
                      (int)(t->len > 40 ? 40 : t->len), t->text, v->slots[i], id);
            return -1;
        }
        v->slots[i] = id;
    }
    return 0;
}

/* The first rank of a pair wins, as with llama.cpp's emplace. */
static void add_merge(tok_vocab *v, int32_t a, int32_t b, int32_t rank)
{
    merge_slot *m = merge_find(v, a, b);
    if (m->rank < 0)
        *m = (merge_slot){a, b, rank};
}

/*
 * Loading merges is three cache misses deep for each side (the hash slot,
 * the token's entry, its text) and one more for the rank's slot, and there
 * are 151k-280k merges.  So each goes through a pipeline: its sides are
 * hashed and their slots asked for, SLOTS_AHEAD merges later looked up
 * (their rank's slot asked for), and SLOTS_AHEAD after that added; in rank
 * order still, so the first rank of a pair still wins.
 */
#define SLOTS_AHEAD 8
#define MERGE_RING 32 /* > 2 * SLOTS_AHEAD */

typedef struct merge_step {
    const char *a, *b;
    size_t la, lb;
    uint32_t ha, hb;  /* the sides' text hashes */
    int32_t ia, ib;   /* their ids, once looked up */
    int64_t r;        /* the rank; -1: a merge without a space */
} merge_step;

/* Merge r split at its space and its sides hashed, their slots asked for. */
static void merge_parse(const tok_vocab *v, const gguf_kv *kv, uint64_t r, merge_step *m)
{
    size_t len;
    const char *s = gguf_arr_str(kv, r, &len);
    const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
    m->r = -1;
    if (!sp) /* llama.cpp keeps it as ("", ""): a pair no two symbols make */
        return;
    m->r = (int64_t)r;
    m->a = s, m->la = (size_t)(sp - s);
    m->b = sp + 1, m->lb = len - m->la - 1;
    m->ha = tok_hash(m->a, m->la, 0), m->hb = tok_hash(m->b, m->lb, 0);
    __builtin_prefetch(&v->slots[m->ha & (v->n_slots - 1)]);
    __builtin_prefetch(&v->slots[m->hb & (v->n_slots - 1)]);
}

/* The ids of a parsed merge's sides, its rank's slot asked for; -1 when a side is not a token. */
static int merge_ids(const tok_vocab *v, merge_step *m)
{
    if (m->r < 0)
        return 0;
    m->ia = lookup_hashed(v, m->a, m->la, m->ha);
    m->ib = lookup_hashed(v, m->b, m->lb, m->hb);
    if (m->ia < 0 || m->ib < 0)
        return -1;
    __builtin_prefetch(&v->merges[pair_hash(m->ia, m->ib) & (v->n_merge_slots - 1)]);
    return 0;
}

static int load_merges(tok_vocab *v, const gguf_file *g, lm_err *e)
{
    const gguf_kv *kv = gguf_find(g, "tokenizer.ggml.merges");
    if (!kv) {
        lm_seterr(e, "%s: BPE vocabulary without tokenizer.ggml.merges", g->path);
        return -1;
    }
    if (kv->type != GGUF_ARRAY || kv->arr_type != GGUF_STRING || kv->arr_n > MAX_VOCAB * 4ull) {
        lm_seterr(e, "%s: tokenizer.ggml.merges is not an array of strings", g->path);
        return -1;
    }
    /* at most 2/3 full: 12-byte slots, 6 MB for Llama 3's 280k merges */
    v->n_merge_slots = slots_for(kv->arr_n, 3, 2);
    v->merges = malloc(v->n_merge_slots * sizeof *v->merges);
    if (!v->merges) {
        lm_seterr(e, "%s: out of memory for merges", g->path);
        return -1;
    }
    for (uint32_t i = 0; i < v->n_merge_slots; i++)
        v->merges[i].rank = -1;
    merge_step ring[MERGE_RING];
    const uint64_t n = kv->arr_n;
    for (uint64_t r = 0; r < n + 2 * SLOTS_AHEAD; r++) {
        if (r < n)
            merge_parse(v, kv, r, &ring[r % MERGE_RING]);
        merge_step *m = &ring[(r - SLOTS_AHEAD) % MERGE_RING];
        if (r >= SLOTS_AHEAD && r - SLOTS_AHEAD < n && merge_ids(v, m)) {
            const size_t len = m->la + 1 + m->lb;
            lm_seterr(e, "%s: merge %llu ('%.*s') names a token that is not in the vocabulary", g->path,
                      (unsigned long long)m->r, (int)(len > 40 ? 40 : len), m->a);
            return -1;
        }
        const merge_step *done = &ring[(r - 2 * SLOTS_AHEAD) % MERGE_RING];
        if (r >= 2 * SLOTS_AHEAD && done->r >= 0)
            add_merge(v, done->ia, done->ib, (int32_t)done->r);
    }
    return 0;
}

static const gguf_kv *array_of(const gguf_file *g, const char *key, uint32_t t1, uint32_t t2,
                               uint64_t min_n, lm_err *e)
{
    const gguf_kv *kv = gguf_find(g, key);
    if (!kv)
        return NULL;
    if (kv->type != GGUF_ARRAY || (kv->arr_type != t1 && kv->arr_type != t2) || kv->arr_n < min_n) {
        lm_seterr(e, "%s: %s must be an array of %s with at least %llu entries", g->path, key,
                  gguf_type_name(t1), (unsigned long long)min_n);
        return (const gguf_kv *)-1;
    }
    return kv;
}

static uint32_t attr_of_type(int32_t type)
{
    switch (type) {
    case 1: return TOK_ATTR_NORMAL;
    case 2: return TOK_ATTR_UNKNOWN;
    case 3: return TOK_ATTR_CONTROL;
    case 4: return TOK_ATTR_USER_DEFINED;
    case 5: return TOK_ATTR_UNUSED;
    case 6: return TOK_ATTR_BYTE;
    default: return 0;
    }
}

static int load_tokens(tok_vocab *v, const gguf_file *g, lm_err *e)
{
    const gguf_kv *toks = gguf_find(g, "tokenizer.ggml.tokens");
    if (!toks || toks->type != GGUF_ARRAY || toks->arr_type != GGUF_STRING || toks->arr_n == 0 ||
        toks->arr_n > MAX_VOCAB) {
        lm_seterr(e, "%s: tokenizer.ggml.tokens is missing or not a non-empty array of strings",
                  g->path);
        return -1;
    }
    v->n = (int)toks->arr_n;
    const gguf_kv *scores = array_of(g, "tokenizer.ggml.scores", GGUF_F32, GGUF_I32, toks->arr_n, e);
    const gguf_kv *types = array_of(g, "tokenizer.ggml.token_type", GGUF_I32, GGUF_I32, toks->arr_n, e);
    if (scores == (const gguf_kv *)-1 || types == (const gguf_kv *)-1)
        return -1;
    v->tok = calloc((size_t)v->n, sizeof *v->tok);
    if (!v->tok) {
        lm_seterr(e, "%s: out of memory for the vocabulary", g->path);
        return -1;
    }
    for (int i = 0; i < v->n; i++) {
        tok_entry *t = &v->tok[i];
        size_t len;
        t->text = gguf_arr_str(toks, (uint64_t)i, &len);
        if (len > 4096) {
            lm_seterr(e, "%s: token %d is %zu bytes long", g->path, i, len);
            return -1;
        }
        t->len = (uint32_t)len;
        t->attr = TOK_ATTR_NORMAL;
        if (scores) {
            if (scores->arr_type == GGUF_F32) {
                memcpy(&t->score, scores->data + 4 * (size_t)i, 4);
            } else {
                int32_t s;
                memcpy(&s, scores->data + 4 * (size_t)i, 4);
                t->score = (float)s;
            }
        }
        if (types) {
            int32_t ty;
            memcpy(&ty, types->data + 4 * (size_t)i, 4);
            t->attr = attr_of_type(ty);
        }
    }
    return 0;
}

static int get_id(const gguf_file *g, const char *key, int32_t *id, int n, lm_err *e)
{
    if (*id >= n)
        *id = -1;
    uint32_t u;
    int r = gguf_get_u32(g, key, &u, e);
    if (r < 0) {
        /* llama.cpp ignores a bad special id; we say so instead of guessing */
        return -1;
    }
    if (r == 1) {
        if (u >= (uint32_t)n) {
            lm_seterr(e, "%s: %s = %u is out of range (vocabulary of %d)", g->path, key, u, n);
            return -1;
        }
        *id = (int32_t)u;
    }
    return 0;
}

static int load_specials(tok_vocab *v, const gguf_file *g, lm_err *e)
{
    v->eot = v->eom = -1;
    if (get_id(g, "tokenizer.ggml.bos_token_id", &v->bos, v->n, e) ||
        get_id(g, "tokenizer.ggml.eos_token_id", &v->eos, v->n, e) ||
        get_id(g, "tokenizer.ggml.eot_token_id", &v->eot, v->n, e) ||
        get_id(g, "tokenizer.ggml.eom_token_id", &v->eom, v->n, e) ||
        get_id(g, "tokenizer.ggml.unknown_token_id", &v->unk, v->n, e))
        return -1;
    int b;
    if (gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b, e) < 0)
        return -1;
    else if (gguf_find(g, "tokenizer.ggml.add_bos_token"))
        v->add_bos = b;
    if (gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b, e) < 0)
        return -1;
    else if (gguf_find(g, "tokenizer.ggml.add_eos_token"))
        v->add_eos = b;
    if ((v->add_bos && v->bos < 0) || (v->add_eos && v->eos < 0)) {
        lm_seterr(e, "%s: the vocabulary asks for BOS/EOS but has no such token", g->path);
        return -1;
    }
    return 0;
}

/* Token texts that end a generation (llama.cpp's list); every token is
   asked, so the lengths are constants, not strlen calls. */
static int eog_text(const char *s, size_t len)
{
#define NAME(str) {str, sizeof str - 1}
    static const struct {
        const char *s;
        size_t len;
    } names[] = {
        NAME("<|eot_id|>"), NAME("<|im_end|>"),    NAME("<|end|>"),           NAME("<end_of_turn>"),
        NAME("<|endoftext|>"), NAME("<|eom_id|>"), NAME("<EOT>"),             NAME("_<EOT>"),
        NAME("<|end_of_text|>"), NAME("<end_of_utterance>"), NAME("<|return|>"), NAME("<|call|>"),
    };
#undef NAME
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].len == len && !memcmp(names[i].s, s, len))
            return 1;
    return 0;
}

/* Adds id to the end-of-generation set; text matches also become control tokens. */
static int add_eog(tok_vocab *v, int32_t id, int make_control)
{
    if (id < 0)
        return 0;
    if (make_control)
        v->tok[id].attr |= TOK_ATTR_CONTROL;
    if (tok_is_eog(v, id))
        return 0;
    int32_t *p = realloc(v->eog, (size_t)(v->n_eog + 1) * sizeof *p);
    if (!p)
        return -1;
    v->eog = p;
    v->eog[v->n_eog++] = id;
    return 0;
}

static int find_eog(tok_vocab *v)
{
    for (int32_t id = 0; id < v->n; id++) {
        const tok_entry *t = &v->tok[id];
        if (!eog_text(t->text, t->len))
            continue;
        int is_eom = t->len == 10 && !memcmp(t->text, "<|eom_id|>", 10);
        if (is_eom && v->eom < 0)
            v->eom = id;
        else if (!is_eom && v->eot < 0)
            v->eot = id;
        if (add_eog(v, id, 1))
            return -1;
    }
    return add_eog(v, v->eos, 0) | add_eog(v, v->eot, 0) | add_eog(v, v->eom, 0);
}

static int cmp_special(const void *a, const void *b, void *ctx)
{
    const tok_vocab *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (v->tok[x].len != v->tok[y].len)
        return v->tok[x].len > v->tok[y].len ? -1 : 1;
    return x - y;
}

static int build_special_cache(tok_vocab *v)
{
    v->special = malloc((size_t)v->n * sizeof *v->special);
    if (!v->special)
        return -1;
    for (int32_t id = 0; id < v->n; id++)
        if ((v->tok[id].attr & (TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNKNOWN)) &&
            v->tok[id].len > 0)
            v->special[v->n_special++] = id;
    qsort_r(v->special, (size_t)v->n_special, sizeof *v->special, cmp_special, v);
    return 0;
}

static int contains_ci(const char *s, size_t len, const char *needle)
{
    size_t nl = strlen(needle);
    for (size_t i = 0; i + nl <= len; i++) {
        size_t j = 0;
        while (j < nl && tolower((unsigned char)s[i + j]) == needle[j])
            j++;
        if (j == nl)
            return 1;
    }
    return 0;
}

/* Phi-3 files rely on llama.cpp stripping spaces after their special tokens. */
static void model_specific_attrs(tok_vocab *v, const gguf_file *g)
{
    const char *name;
    size_t len;
    lm_err ignore;
    if (gguf_get_str(g, "general.name", &name, &len, &ignore) != 1)
        return;
    if (!contains_ci(name, len, "phi-3") && !contains_ci(name, len, "phi3"))
        return;
    for (int i = 0; i < v->n_special; i++)
        v->tok[v->special[i]].attr |= TOK_ATTR_RSTRIP;
    int32_t id = tok_lookup(v, "</s>", 4);
    if (id >= 0)
        v->tok[id].attr |= TOK_ATTR_RSTRIP;
    static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
    for (int i = 0; i < 3; i++)
        if ((id = tok_lookup(v, keep[i], strlen(keep[i]))) >= 0)
            v->tok[id].attr &= ~(uint32_t)TOK_ATTR_RSTRIP;
}

static void build_byte_tokens(tok_vocab *v)
{
    for (int b = 0; b < 256; b++) {
        char buf[8];
        int32_t id;
        if (v->kind == TOK_SPM) {
            snprintf(buf, sizeof buf, "<0x%02X>", b);
            id = tok_lookup(v, buf, 6);
            if (id < 0) {
                buf[0] = (char)b;
                id = tok_lookup(v, buf, 1);
            }
        } else {
            id = tok_lookup(v, buf, tok_byte_to_utf8((uint8_t)b, buf));
        }
        v->byte_tok[b] = id;
    }
}

int tok_build_pieces(tok_vocab *v); /* decode.c */

static int set_kind(tok_vocab *v, const gguf_file *g, lm_err *e)
{
    const char *model, *pre = "";
    size_t ml, pl = 0;
    int r = gguf_get_str(g, "tokenizer.ggml.model", &model, &ml, e);
    if (r <= 0) {
        if (r == 0)
            lm_seterr(e, "%s: no tokenizer (tokenizer.ggml.model is missing)", g->path);
        return -1;
    }
    if (ml == 5 && !memcmp(model, "llama", 5)) {
        v->kind = TOK_SPM;
        v->bos = 1, v->eos = 2, v->unk = 0;
        v->add_bos = 1, v->add_space_prefix = 1;
    } else if (ml == 4 && !memcmp(model, "gpt2", 4)) {
        v->kind = TOK_BPE;
        v->bos = 11, v->eos = 11, v->unk = -1;
        if (gguf_get_str(g, "tokenizer.ggml.pre", &pre, &pl, e) < 0)
            return -1;
        if (pretok_init(&v->pre, pre, pl, e) < 0) {
            char msg[sizeof e->msg];
            memcpy(msg, e->msg, sizeof msg);
            lm_seterr(e, "%s: %s", g->path, msg);
            return -1;
        }
        v->ignore_merges = !strcmp(v->pre.name, "llama3");
        v->add_bos = v->ignore_merges;
    } else {
        lm_seterr(e, "%s: unsupported tokenizer model '%.*s' (llama, gpt2 are)", g->path,
                  (int)(ml > 32 ? 32 : ml), model);
        return -1;
    }
    if (gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix, e) < 0)
        return -1;
    if (v->kind == TOK_BPE)
        v->add_space_prefix = 0;
    return 0;
}

tok_vocab *tok_load(const gguf_file *g, lm_err *e)
{
    tok_vocab *v = calloc(1, sizeof *v);
    if (!v) {
        lm_seterr(e, "out of memory");
        return NULL;
    }
    if (set_kind(v, g, e) || load_tokens(v, g, e) || build_index(v, g->path, e) ||
        (v->kind == TOK_BPE && load_merges(v, g, e)) || load_specials(v, g, e))
        goto fail;
    if (v->unk >= v->n)
        v->unk = -1;
    if (find_eog(v) || build_special_cache(v))
        goto oom;
    model_specific_attrs(v, g);
    build_byte_tokens(v);
    if (tok_build_pieces(v))
        goto oom;
    return v;
oom:
    lm_seterr(e, "%s: out of memory for the vocabulary", g->path);
fail:
    tok_free(v);
    return NULL;
}

void tok_free(tok_vocab *v)
{
    if (!v)
        return;
    pretok_free(&v->pre);
    free(v->tok);
    free(v->slots);
    free(v->merges);
    free(v->eog);
    free(v->special);
    free(v->pieces);
    free(v->piece_off);
    free(v);
}

int tok_kind(const tok_vocab *v) { return v->kind; }
const char *tok_kind_name(const tok_vocab *v) { return v->kind == TOK_SPM ? "SPM" : "BPE"; }
const char *tok_pre_name(const tok_vocab *v) { return v->kind == TOK_BPE ? v->pre.name : ""; }
int tok_n_vocab(const tok_vocab *v) { return v->n; }
int32_t tok_bos(const tok_vocab *v) { return v->bos; }
int32_t tok_eos(const tok_vocab *v) { return v->eos; }
int tok_add_bos(const tok_vocab *v) { return v->add_bos; }
unsigned tok_attr_of(const tok_vocab *v, int32_t id) { return v->tok[id].attr; }

int tok_is_eog(const tok_vocab *v, int32_t id)
{
    for (int i = 0; i < v->n_eog; i++)
        if (v->eog[i] == id)
            return 1;
    return 0;
}

const char *tok_text(const tok_vocab *v, int32_t id, size_t *len)
{
    *len = v->tok[id].len;
    return v->tok[id].text;
}
