/*
 * tests/aarch64/logits.c - `kvchat logits` for the aarch64 check: the
 * engine (lm/) alone, built for aarch64 and run under qemu, so that
 * ../shared/tools/parity.py can hold the NEON build to llama.cpp's logits
 * (tests/aarch64/parity.sh).  Only what parity.py passes:
 *   logits -m MODEL --ids-file FILE -o OUT
 */
#include "../../lm/lm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, const char *msg)
{
    fprintf(stderr, "kvchat-aarch64: %s: %s\n", what, msg);
    return 1;
}

/* Whitespace-separated token ids; *n of them in a malloc'd array. */
static int32_t *read_ids(const char *path, int *n)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    int cap = 64;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    long v;
    *n = 0;
    while (ids && fscanf(f, "%ld", &v) == 1) {
        if (*n == cap) {
            int32_t *p = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            if (!p)
                free(ids);
            ids = p;
        }
        if (ids)
            ids[(*n)++] = (int32_t)v;
    }
    fclose(f);
    return ids;
}

static int run(const char *model, const char *ids_path, const char *out_path)
{
    lm_model m;
    lm_kv kv;
    lm_err e = {{0}};
    int n = 0, rc = 1;
    int32_t *ids = read_ids(ids_path, &n);
    if (!ids || !n)
        return fail(ids_path, "no token ids");
    if (lm_model_open(&m, model, &e)) {
        free(ids);
        return fail(model, e.msg);
    }
    size_t total = (size_t)n * (size_t)m.hp.n_vocab;
    float *out = malloc(total * sizeof *out);
    lm_ctx *c = NULL;
    if (!out || lm_kv_init(&kv, &m, n, LM_KV_F32, &e)) {
        fail(model, out ? e.msg : "out of memory");
        goto done_model;
    }
    if (!(c = lm_ctx_new(&m, 2, &e)) || lm_decode(c, &kv, ids, n, 0, LM_LOGITS_ALL, out, NULL, &e)) {
        fail(model, e.msg);
        goto done;
    }
    FILE *f = fopen(out_path, "wb");
    if (!f || fwrite(out, sizeof *out, total, f) != total || fclose(f)) {
        fail(out_path, "write error");
        goto done;
    }
    rc = 0;
done:
    lm_ctx_free(c);
    lm_kv_free(&kv);
done_model:
    free(out);
    free(ids);
    lm_model_close(&m);
    return rc;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *ids = NULL, *out = NULL;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-m"))
            model = argv[i + 1];
        else if (!strcmp(argv[i], "--ids-file"))
            ids = argv[i + 1];
        else if (!strcmp(argv[i], "-o"))
            out = argv[i + 1];
        else
            return fail(argv[i], "not an option of this test build");
    }
    if (argc < 2 || strcmp(argv[1], "logits") || !model || !ids || !out)
        return fail("usage", "logits -m MODEL --ids-file FILE -o OUT");
    return run(model, ids, out);
}
