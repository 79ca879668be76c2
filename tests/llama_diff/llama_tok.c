/*
 * tests/llama_diff/llama_tok.c - llama.cpp's side of the tokenizer
 * comparison: VOCAB.gguf [special] reads strings separated by lines
 * "__ggml_vocab_test__" (the format of ../shared/vocab's .inp files) from
 * stdin and prints llama.cpp's token ids of each, one line a string, as
 * the .out files have them (no BOS/EOS; control-token text parsed only
 * when special is 1).  Built against a llama.cpp tree by run.sh.
 */
#include "llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum ggml_log_level level, const char *text, void *user)
{
    (void)level, (void)text, (void)user;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: llama_tok VOCAB.gguf [special] < strings\n");
        return 2;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "llama_tok: cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const bool special = argc > 2 && atoi(argv[2]);
    enum { CAP = 1 << 24, MAX_TOK = 1 << 22 };
    char *text = malloc(CAP);
    llama_token *toks = malloc(sizeof *toks * MAX_TOK);
    if (!text || !toks)
        return 1;
    size_t n = fread(text, 1, CAP - 1, stdin);
    text[n] = 0;
    const char *sep = "\n__ggml_vocab_test__\n";
    for (char *p = text;;) {
        char *end = strstr(p, sep);
        const int len = end ? (int)(end - p) : (int)strlen(p);
        if (!end && len == 0)
            break; /* (the separator after the last string) */
        const int k = llama_tokenize(vocab, p, len, toks, MAX_TOK, false, special);
        for (int i = 0; i < k; i++)
            printf(i ? " %d" : "%d", toks[i]);
        printf("\n");
        if (!end)
            break;
        p = end + strlen(sep);
    }
    llama_model_free(model);
    return 0;
}
