/*
 * tests/fuzz/fuzz_gguf.c - libFuzzer target: arbitrary bytes as a GGUF file.
 * The parser, the model checks (architecture, hyperparameters, tensor
 * shapes and types) and the tokenizer loader must reject anything bad with
 * a message, never read outside the buffer; a file that passes them all
 * is evaluated for two tokens, which must not crash either.
 */
#include "../../cache/cache.h"
#include "../../lm/lm.h"
#include "../../tok/tok.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1); /* exact size: ASan sees any overread */
    memcpy(copy, data, size);
    lm_model m;
    lm_err e;
    memset(&m, 0, sizeof m);
    if (gguf_parse(&m.gguf, "fuzz.gguf", copy, size, &e) == 0) {
        tok_vocab *v = tok_load(&m.gguf, &e);
        if (v) {
            int32_t *ids;
            int n;
            if (tok_encode(v, "Hello, world", 12, 1, 1, &ids, &n, &e) == 0)
                free(ids);
            tok_free(v);
        }
        if (lm_model_init(&m, &e) == 0) {
            kv_context c;
            int32_t toks[2] = {0, m.hp.n_vocab - 1};
            if (m.hp.n_embd <= 4096 && kv_init(&c, &m, 4, LM_KV_F32, 1, &e) == 0) {
                kv_eval(&c, toks, 2, NULL, NULL, &e);
                kv_free(&c);
            }
            lm_model_close(&m);
        }
    } else {
        gguf_close(&m.gguf);
    }
    free(copy);
    return 0;
}
