/*
 * tok/tok.h - tokenizers and chat templates.  A tok_vocab is built from the
 * tokenizer.* keys of a GGUF file (a model or a vocab-only file) and
 * reproduces llama.cpp's llama-vocab.cpp behaviour: SentencePiece
 * (tokenizer.ggml.model = "llama") with byte fallback, byte-level BPE
 * ("gpt2") with the pre-tokenizer chosen by tokenizer.ggml.pre, special-token
 * partitioning, BOS/EOS flags, end-of-generation sets and token pieces.
 */
#ifndef KVCHAT_TOK_H
#define KVCHAT_TOK_H

#include "../lm/lm.h"

#include <stddef.h>
#include <stdint.h>

typedef struct tok_vocab tok_vocab;

enum tok_kind { TOK_SPM, TOK_BPE };

/* Token attributes, as llama.cpp's llama_token_attr. */
enum tok_attr {
    TOK_ATTR_UNKNOWN = 1 << 0, TOK_ATTR_UNUSED = 1 << 1, TOK_ATTR_NORMAL = 1 << 2,
    TOK_ATTR_CONTROL = 1 << 3, TOK_ATTR_USER_DEFINED = 1 << 4, TOK_ATTR_BYTE = 1 << 5,
    TOK_ATTR_LSTRIP = 1 << 7, TOK_ATTR_RSTRIP = 1 << 8,
};

tok_vocab *tok_load(const gguf_file *g, lm_err *e);
void tok_free(tok_vocab *v);

int tok_kind(const tok_vocab *v);
const char *tok_kind_name(const tok_vocab *v);   /* "SPM" or "BPE" */
const char *tok_pre_name(const tok_vocab *v);    /* BPE pre-tokenizer, "" for SPM */
int tok_n_vocab(const tok_vocab *v);
int32_t tok_bos(const tok_vocab *v);             /* -1 when none */
int32_t tok_eos(const tok_vocab *v);
int tok_add_bos(const tok_vocab *v);
int tok_is_eog(const tok_vocab *v, int32_t id);
unsigned tok_attr_of(const tok_vocab *v, int32_t id);
/* The raw vocabulary text of a token (pointer into the model, not NUL-terminated). */
const char *tok_text(const tok_vocab *v, int32_t id, size_t *len);
/* Token id of an exact vocabulary string, or -1. */
int32_t tok_find(const tok_vocab *v, const char *text, size_t len);

/*
 * Tokenizes len bytes of text.  add_special adds BOS/EOS as the vocab says;
 * parse_special turns control-token text into the token.  *out is malloc'ed.
 */
int tok_encode(const tok_vocab *v, const char *text, size_t len, int add_special,
               int parse_special, int32_t **out, int *n_out, lm_err *e);

/* The bytes a token stands for; special = 0 hides control tokens. */
const char *tok_piece(const tok_vocab *v, int32_t id, int special, size_t *len);

/*
 * Streaming decoder: holds back the bytes of a UTF-8 character that is not
 * complete yet, so a terminal never sees half a character.
 */
typedef struct tok_stream {
    char pend[8];
    int n;
} tok_stream;

/* Appends a token's piece; writes the printable bytes to out (cap >= len+8). */
size_t tok_stream_put(tok_stream *s, const char *piece, size_t len, char *out);
/* Flushes what is held back (an incomplete character at the end). */
size_t tok_stream_flush(tok_stream *s, char *out);

/* Length of the longest valid UTF-8 prefix of s (for validating input). */
size_t tok_utf8_valid_prefix(const char *s, size_t len);

#endif
