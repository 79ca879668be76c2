/*
 * tests/util.h - helpers for the Check suite: where the reference data is,
 * reading files, running the kvchat binary, and building GGUF files in
 * memory (valid ones to corrupt, and tiny models).
 */
#ifndef KVCHAT_TESTS_UTIL_H
#define KVCHAT_TESTS_UTIL_H

#include <check.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "../cache/cache.h"
#include "../lm/lm.h"
#include "../tok/tok.h"

const char *shared_dir(void);        /* $KVCHAT_SHARED or ../shared */
const char *kvchat_bin(void);        /* $KVCHAT_BIN or ./kvchat */
char *shared_path(const char *rel);  /* malloc'ed */
char *slurp(const char *path, size_t *len);  /* NULL if missing */
char *tmp_path(const char *name);    /* a file in the test temp dir */
int write_file(const char *path, const void *buf, size_t len);

/* Runs argv (NULL-terminated); captures stdout and stderr; returns the exit code. */
int run_cmd(char *const argv[], const char *stdin_data, char **out, char **err);

/* A child with pipes to its stdin and stdout (or a pseudo-terminal for both). */
typedef struct child {
    int pid, in, out, err;
} child;

int child_spawn(child *c, char *const argv[], int pty);
/* Reads from the child's stdout until needle appears or timeout_ms passes;
 * appends to *buf (malloc'ed, NUL-terminated). Returns 1 if found. */
int child_read_until(child *c, char **buf, size_t *len, const char *needle, int timeout_ms);
void child_write(child *c, const char *s);
int child_wait(child *c);   /* closes the pipes, returns the exit code */

/* A small llama model carrying the tokenizer (and chat template) of a vocab file. */
char *model_with_vocab(const char *vocab_rel, const char *name);

/* ---- GGUF writer ---- */
typedef struct gbuf {
    uint8_t *p;
    size_t n, cap;
} gbuf;

void gb_put(gbuf *b, const void *d, size_t n);
void gb_u32(gbuf *b, uint32_t v);
void gb_u64(gbuf *b, uint64_t v);
void gb_str(gbuf *b, const char *s);

typedef struct gtensor {
    const char *name;
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t type;
    const void *data;
    size_t nbytes;
} gtensor;

typedef struct gmodel {
    gbuf kv;          /* encoded key-value pairs */
    uint64_t n_kv;
    gtensor t[64];
    int n_t;
} gmodel;

void gm_kv_str(gmodel *m, const char *key, const char *val);
void gm_kv_u32(gmodel *m, const char *key, uint32_t v);
void gm_kv_f32(gmodel *m, const char *key, float v);
void gm_kv_bool(gmodel *m, const char *key, int v);
void gm_kv_strs(gmodel *m, const char *key, const char *const *v, int n);
void gm_kv_f32s(gmodel *m, const char *key, const float *v, int n);
void gm_kv_i32s(gmodel *m, const char *key, const int32_t *v, int n);
void gm_tensor(gmodel *m, const char *name, uint32_t type, int64_t ne0, int64_t ne1,
               const void *data, size_t nbytes);
/* Serializes with 32-byte alignment; tensor offsets in order. */
uint8_t *gm_build(const gmodel *m, size_t *len);
void gm_free(gmodel *m);

/* A small random llama model with a byte-level vocabulary of n_vocab tokens. */
uint8_t *tiny_llama(size_t *len, int tied);
/* The same with llama.attention.sliding_window = window (Mistral style). */
uint8_t *tiny_llama_swa(size_t *len, int tied, int window);

TCase *tcase_quant(void);
TCase *tcase_kernels(void);
TCase *tcase_matmul(void);
TCase *tcase_bounds(void);
TCase *tcase_layer_math(void);
TCase *tcase_gguf(void);

TCase *tcase_tok(void);
TCase *tcase_engine(void);
TCase *tcase_cache(void);
TCase *tcase_sample(void);
TCase *tcase_cli(void);
TCase *tcase_template(void);
TCase *tcase_chat(void);

#endif
