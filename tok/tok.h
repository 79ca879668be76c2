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

/*
 * A memo of the last text tokenized through it: pieces of the next text
 * between special tokens that repeat the last one's, at the same place,
 * take their ids from it instead of being tokenized again, and byte-level
 * BPE words it has seen before take theirs from a table of words.  The ids
 * are those tok_encode gives.  A chat keeps one for its conversation; a
 * memo follows the vocab it was last used with.
 */
typedef struct tok_memo tok_memo;
tok_memo *tok_memo_new(void);
void tok_memo_free(tok_memo *m);
int tok_encode_memo(const tok_vocab *v, tok_memo *memo, const char *text, size_t len,
                    int add_special, int parse_special, int32_t **out, int *n_out, lm_err *e);
/* Pieces the last tok_encode_memo call took from the memo. */
int tok_memo_reused(const tok_memo *m);

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

/* Length of the prefix of s that does not end inside a UTF-8 character. */
size_t tok_utf8_complete(const char *s, size_t n);
/* Length of the longest valid UTF-8 prefix of s (for validating input). */
size_t tok_utf8_valid_prefix(const char *s, size_t len);

/* ---- chat templates (template.c) ---- */

enum tmpl_family {
    TMPL_RAW, TMPL_CHATML, TMPL_LLAMA2, TMPL_LLAMA2_SYS, TMPL_LLAMA2_SYS_BOS,
    TMPL_LLAMA2_SYS_STRIP, TMPL_MISTRAL_V1, TMPL_MISTRAL_V3, TMPL_MISTRAL_V3_TEKKEN,
    TMPL_MISTRAL_V7, TMPL_MISTRAL_V7_TEKKEN, TMPL_PHI3, TMPL_PHI4, TMPL_FALCON3, TMPL_ZEPHYR,
    TMPL_MONARCH, TMPL_GEMMA, TMPL_ORION, TMPL_OPENCHAT, TMPL_VICUNA, TMPL_VICUNA_ORCA,
    TMPL_DEEPSEEK, TMPL_DEEPSEEK2, TMPL_DEEPSEEK3, TMPL_COMMAND_R, TMPL_LLAMA3, TMPL_CHATGLM3,
    TMPL_CHATGLM4, TMPL_GLMEDGE, TMPL_MINICPM, TMPL_EXAONE3, TMPL_GRANITE, TMPL_MEGREZ,
    TMPL_LLAMA4, TMPL_COUNT
};

typedef struct chat_msg {
    const char *role;      /* "system", "user" or "assistant" */
    const char *content;
} chat_msg;

/* The family a template text (or a family name) belongs to, -1 if unknown. */
int tmpl_detect(const char *tmpl, size_t len);
int tmpl_from_name(const char *name);
const char *tmpl_name(int family);
void tmpl_list(char *buf, size_t size);
/* The rendered conversation (malloc'ed), with the assistant prompt when add_gen. */
char *tmpl_render(int family, const chat_msg *msgs, int n, int add_gen, size_t *len);
/* NULL-terminated texts that end an assistant turn in this family. */
const char *const *tmpl_stops(int family);

#endif
