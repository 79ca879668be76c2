/*
 * tests/fuzz/fuzz_tok.c - libFuzzer target: arbitrary bytes through the
 * SentencePiece (byte fallback) and byte-level BPE tokenizers of real
 * vocabularies.  No crash on any input, and for valid UTF-8 the pieces of
 * the tokens give the text back: decode(encode(x)) == x (SentencePiece adds
 * one leading space, and writes spaces as U+2581, so inputs holding that
 * character are only checked for crashes).
 */
#include "../../lm/lm.h"
#include "../../tok/tok.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct loaded {
    gguf_file g;
    tok_vocab *v;
} loaded;

static loaded vocabs[2];
static int n_vocabs;

static void load(const char *name)
{
    const char *dir = getenv("KVCHAT_SHARED") ? getenv("KVCHAT_SHARED") : "../shared";
    char path[1024];
    lm_err e;
    snprintf(path, sizeof path, "%s/vocab/%s", dir, name);
    loaded *l = &vocabs[n_vocabs];
    if (gguf_open(&l->g, path, &e) || !(l->v = tok_load(&l->g, &e))) {
        fprintf(stderr, "fuzz_tok: %s\n", e.msg);
        abort();
    }
    n_vocabs++;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    load("ggml-vocab-llama-spm.gguf");
    load("ggml-vocab-qwen2.gguf");
    return 0;
}

static void roundtrip(const tok_vocab *v, const char *s, size_t n, int special)
{
    int32_t *ids;
    int k;
    lm_err e;
    if (tok_encode(v, s, n, 0, special, &ids, &k, &e))
        return;
    char *out = malloc(4 * n + 64);
    size_t len = 0;
    for (int i = 0; i < k; i++) {
        size_t pl;
        const char *p = tok_piece(v, ids[i], 1, &pl);
        memcpy(out + len, p, pl);
        len += pl;
    }
    int checkable = tok_utf8_valid_prefix(s, n) == n && !memmem(s, n, "\xe2\x96\x81", 3) && !special;
    if (checkable) {
        size_t skip = tok_kind(v) == TOK_SPM && len > n && out[0] == ' ';
        if (len - skip != n || memcmp(out + skip, s, n)) {
            fprintf(stderr, "fuzz_tok: %s text of %zu bytes does not decode back (%zu bytes, %d tokens)\n",
                    tok_kind_name(v), n, len - skip, k);
            FILE *dump = fopen("fuzz_tok.decoded", "wb");
            if (dump)
                fwrite(out, 1, len, dump), fclose(dump);
            abort();
        }
    }
    free(out);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size ? size : 1);
    memcpy(s, data, size);
    for (int i = 0; i < n_vocabs; i++) {
        roundtrip(vocabs[i].v, s, size, 0);
        roundtrip(vocabs[i].v, s, size, 1);
        tok_stream st = {{0}, 0};
        char buf[64];
        for (size_t j = 0; j < size; j++) /* the stream decoder on arbitrary bytes */
            tok_stream_put(&st, s + j, 1, buf);
        tok_stream_flush(&st, buf);
    }
    free(s);
    return 0;
}
