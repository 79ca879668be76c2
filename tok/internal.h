/*
 * tok/internal.h - the vocabulary structure shared by the files of tok/.
 */
#ifndef KVCHAT_TOK_INTERNAL_H
#define KVCHAT_TOK_INTERNAL_H

#include "tok.h"

#define PRE_MAX_REGEX 8

typedef struct tok_entry {
    const char *text;     /* in the GGUF mapping */
    uint32_t len;
    uint32_t attr;
    float score;
} tok_entry;

/* A merge by the ids of its two sides: every side is a token (tok_load
   checks), so a pair of symbols that are not both tokens has no rank. */
typedef struct merge_slot {
    int32_t a, b;
    int32_t rank;         /* -1: empty slot */
} merge_slot;

typedef struct pretok {
    const char *name;
    int n_regex;
    void *re[PRE_MAX_REGEX];   /* pcre2_code_8 * */
} pretok;

struct tok_vocab {
    int kind;
    int n;
    tok_entry *tok;
    int32_t *slots;            /* open-addressed text -> id, -1 empty */
    uint32_t n_slots;
    merge_slot *merges;        /* open-addressed (id a, id b) -> rank */
    uint32_t n_merge_slots;
    int32_t bos, eos, eot, eom, unk;
    int add_bos, add_eos, add_space_prefix, ignore_merges;
    int32_t *eog;
    int n_eog;
    int32_t *special;          /* control/user-defined/unknown, longest text first */
    int n_special;
    char *pieces;              /* decoded piece of every token, special = 1 */
    size_t *piece_off;         /* n + 1 offsets into pieces */
    int32_t byte_tok[256];     /* byte -> token, -1 if none */
    pretok pre;
};

uint32_t tok_hash(const char *s, size_t len, uint32_t seed);
int32_t tok_lookup(const tok_vocab *v, const char *s, size_t len);
int32_t tok_merge_rank(const tok_vocab *v, int32_t a, int32_t b);

/* GPT-2 byte <-> unicode mapping. */
size_t tok_byte_to_utf8(uint8_t byte, char out[4]);
int tok_cpt_to_byte(uint32_t cpt);  /* -1 when not a mapped code point */
uint32_t tok_utf8_next(const char *s, size_t len, size_t *i); /* U+FFFD on invalid */
size_t tok_utf8_put(uint32_t cpt, char *out);

int pretok_init(pretok *p, const char *name, size_t len, lm_err *e);
void pretok_free(pretok *p);
/*
 * Splits text (valid UTF-8) into words given by starts[i], lens[i], i < n.
 * The arrays are malloc'ed.
 */
int pretok_split(const pretok *p, const char *text, size_t len, size_t **starts, size_t **lens,
                 int *n);

/* Encoders of one raw fragment, appending to a growing array. */
typedef struct tok_out {
    int32_t *ids;
    int n, cap;
} tok_out;

int tok_out_push(tok_out *o, int32_t id);
int spm_encode(const tok_vocab *v, const char *text, size_t len, tok_out *o);
/* words: a memo of BPE words to read and add to, or NULL (words.c) */
typedef struct word_memo word_memo;
int bpe_encode(const tok_vocab *v, const char *text, size_t len, word_memo *words, tok_out *o);

word_memo *word_memo_new(void);
void word_memo_free(word_memo *m);
void word_memo_clear(word_memo *m);
/* The ids noted for the len bytes at w (*n of them), or NULL. */
const int32_t *word_memo_get(const word_memo *m, const char *w, size_t len, int *n);
void word_memo_put(word_memo *m, const char *w, size_t len, const int32_t *ids, int n);

#endif
