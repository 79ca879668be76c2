/*
 * tests/llama_diff/llama_logits.c - llama.cpp's side of the logits
 * comparison: MODEL.gguf IDS OUT [sequential] evaluates the token ids of
 * the file IDS (whitespace separated) and writes every position's logits
 * to OUT as float32 rows, the format of `kvchat logits -o`.  The cache is
 * f32 and flash attention off, as kvchat computes (llama.cpp's defaults
 * would store the cache in f16, which is not the arithmetic being
 * compared; LLAMA_KV=f16 in the environment asks for an f16 cache, to
 * compare with kvchat's --kv-type f16).  LLAMA_LIB in the environment
 * names the directory to load CPU backends from, for builds that choose
 * theirs at run time (as node-llama-cpp's do).  With sequential 1 each
 * token is its own llama_decode, so the one-token paths are the ones
 * compared.  Built by logits.sh.
 */
#include "ggml-backend.h"
#include "llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum ggml_log_level level, const char *text, void *user)
{
    (void)level, (void)text, (void)user;
}

static int read_ids(const char *path, llama_token *ids, int cap)
{
    FILE *f = fopen(path, "r");
    int n = 0, v;
    if (!f)
        return -1;
    while (n < cap && fscanf(f, "%d", &v) == 1)
        ids[n++] = v;
    fclose(f);
    return n;
}

/* Decode ids[from, to) as one batch, asking for every position's logits. */
static int decode_span(struct llama_context *ctx, const llama_token *ids, int from, int to)
{
    struct llama_batch b = llama_batch_init(to - from, 0, 1);
    for (int i = from; i < to; i++) {
        const int j = i - from;
        b.token[j] = ids[i], b.pos[j] = i, b.n_seq_id[j] = 1, b.seq_id[j][0] = 0, b.logits[j] = 1;
    }
    b.n_tokens = to - from;
    const int rc = llama_decode(ctx, b);
    llama_batch_free(b);
    return rc;
}

static int write_rows(struct llama_context *ctx, int rows, int n_vocab, FILE *out)
{
    for (int i = 0; i < rows; i++) {
        const float *row = llama_get_logits_ith(ctx, i);
        if (!row || fwrite(row, sizeof *row, (size_t)n_vocab, out) != (size_t)n_vocab)
            return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    enum { MAX_IDS = 4096 };
    static llama_token ids[MAX_IDS];
    if (argc < 4) {
        fprintf(stderr, "usage: llama_logits MODEL.gguf IDS OUT [sequential]\n");
        return 2;
    }
    const int n = read_ids(argv[2], ids, MAX_IDS), sequential = argc > 4 && atoi(argv[4]);
    if (n <= 0) {
        fprintf(stderr, "llama_logits: no token ids in %s\n", argv[2]);
        return 1;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    if (getenv("LLAMA_LIB")) /* a build whose CPU backends are loaded at run time */
        ggml_backend_load_all_from_path(getenv("LLAMA_LIB"));
    struct llama_model *model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) {
        fprintf(stderr, "llama_logits: cannot load %s\n", argv[1]);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = cp.n_batch = cp.n_ubatch = (uint32_t)(n < 512 ? 512 : n);
    cp.n_threads = cp.n_threads_batch = 2;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    const char *kv_type = getenv("LLAMA_KV");
    cp.type_k = cp.type_v = kv_type && !strcmp(kv_type, "f16") ? GGML_TYPE_F16 : GGML_TYPE_F32;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    FILE *out = fopen(argv[3], "wb");
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    int rc = !ctx || !out;
    for (int at = 0; !rc && at < n; at += sequential ? 1 : n) {
        const int to = sequential ? at + 1 : n;
        rc = decode_span(ctx, ids, at, to) || write_rows(ctx, to - at, n_vocab, out);
    }
    if (out && fclose(out))
        rc = 1;
    if (rc)
        fprintf(stderr, "llama_logits: evaluating %s failed\n", argv[1]);
    llama_free(ctx);
    llama_model_free(model);
    return rc != 0;
}
