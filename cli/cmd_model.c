/*
 * cli/cmd_model.c - the subcommands that expose one part of the engine each:
 * info (the model description), tokenize (the tokenizer alone, works on
 * vocab-only files) and logits (the forward pass, for parity checks).
 */
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void print_tensor_types(const lm_model *m)
{
    int count[LM_NTYPES] = {0};
    for (uint64_t i = 0; i < m->gguf.n_tensors; i++)
        count[m->gguf.tensors[i].type]++;
    printf("tensor types:");
    for (int t = 0; t < LM_NTYPES; t++)
        if (count[t])
            printf(" %s:%d", lm_type_name((uint32_t)t), count[t]);
    printf("\n");
}

int cmd_info(const cli_opts *o)
{
    lm_model m;
    tok_vocab *v = NULL;
    if (cli_open_model(o, &m, &v))
        return EXIT_ERR;
    const lm_hparams *hp = &m.hp;
    size_t tlen = 0;
    const char *tmpl;
    lm_err e;
    int has_tmpl = gguf_get_str(&m.gguf, "tokenizer.chat_template", &tmpl, &tlen, &e) == 1;
    printf("file: %s\nfile size: %zu bytes\nGGUF version: %u\n", o->model, m.gguf.size,
           m.gguf.version);
    char features[512], tmpl_family[64] = "none";
    lm_arch_features(&m, features, sizeof features);
    printf("architecture: %s (%s)\n", lm_arch_name(&m), features);
    printf("context length: %d\nembedding length: %d\nlayers: %d\n", hp->n_ctx_train, hp->n_embd,
           hp->n_layer);
    printf("heads: %d\nkv heads: %d\nhead dim: %d\nfeed forward: %d\n", hp->n_head, hp->n_head_kv,
           hp->head_dim, hp->n_ff);
    printf("rope: %s, base %g, %d dims%s\n", m.rope_style == LM_ROPE_NEOX ? "neox" : "norm",
           hp->rope_base, hp->n_rot, m.rope_freqs ? ", with rope_freqs" : "");
    printf("rms epsilon: %g\n", hp->rms_eps);
    printf("tied embeddings: %s\n", m.output == m.tok_embd ? "yes" : "no");
    printf("vocab: %s%s%s, %d tokens\n", tok_kind_name(v), tok_kind(v) == TOK_BPE ? " pre=" : "",
           tok_pre_name(v), tok_n_vocab(v));
    print_tensor_types(&m);
    printf("KV bytes per token: %zu (f32), %zu (f16)\n", lm_kv_bytes_per_token(&m, 4),
           lm_kv_bytes_per_token(&m, 2));
    if (has_tmpl) {
        int f = tmpl_detect(tmpl, tlen);
        snprintf(tmpl_family, sizeof tmpl_family, "%s", f >= 0 ? tmpl_name(f) : "present, not recognised (chatml is used)");
    }
    printf("chat template: %s\n", tmpl_family);
    tok_free(v);
    lm_model_close(&m);
    return EXIT_OK;
}

int cmd_tokenize(const cli_opts *o)
{
    if (!o->model)
        return cli_error("no model given (use -m FILE)");
    gguf_file g;
    lm_err e = {{0}};
    if (gguf_open(&g, o->model, &e))
        return cli_error("%s", e.msg);
    tok_vocab *v = tok_load(&g, &e);
    if (!v) {
        gguf_close(&g);
        return cli_error("%s", e.msg);
    }
    char *text = NULL;
    size_t len = 0;
    int rc = EXIT_ERR;
    if (o->prompt) {
        text = strdup(o->prompt);
        len = strlen(o->prompt);
    } else if (cli_read_file(o->prompt_file ? o->prompt_file : "-", &text, &len)) {
        goto out;
    }
    int32_t *ids;
    int n;
    if (tok_encode(v, text, len, !o->no_bos, o->special, &ids, &n, &e)) {
        cli_error("%s", e.msg);
        goto out;
    }
    for (int i = 0; i < n; i++)
        printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    free(ids);
    rc = EXIT_OK;
out:
    free(text);
    tok_free(v);
    gguf_close(&g);
    return rc;
}

/* Parses whitespace-separated token ids, each checked against n_vocab. */
static int parse_ids(const char *path, const char *s, int n_vocab, int32_t **ids, int *n)
{
    int cap = 256, k = 0;
    int32_t *a = malloc((size_t)cap * sizeof *a);
    for (const char *p = s; a;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= n_vocab ||
            (*end && *end != ' ' && *end != '\t' && *end != '\n' && *end != '\r')) {
            free(a);
            return cli_error("%s: token %d ('%.20s') is not an id below %d", path, k + 1, p,
                             n_vocab);
        }
        if (k == cap) {
            int32_t *b = realloc(a, (size_t)(cap *= 2) * sizeof *a);
            if (!b)
                free(a);
            a = b;
            if (!a)
                break;
        }
        a[k++] = (int32_t)v;
        p = end;
    }
    if (!a)
        return cli_error("out of memory");
    if (k == 0) {
        free(a);
        return cli_error("%s: no token ids", path);
    }
    *ids = a;
    *n = k;
    return 0;
}

static int eval_logits(const cli_opts *o, const lm_model *m, const int32_t *ids, int n, float *out)
{
    kv_context c;
    lm_err e = {{0}};
    int n_ctx = o->n_ctx > n ? o->n_ctx : n;
    if (kv_init(&c, m, n_ctx, o->kv_type, o->n_threads, &e))
        return cli_error("%s", e.msg);
    size_t nv = (size_t)m->hp.n_vocab;
    int rc = 0;
    if (o->sequential) {
        for (int i = 0; i < n && !rc; i++)
            rc = kv_eval(&c, ids + i, 1, out + (size_t)i * nv, NULL, &e);
    } else {
        rc = kv_eval(&c, ids, n, out, NULL, &e);
    }
    kv_free(&c);
    return rc ? cli_error("%s", e.msg) : 0;
}

int cmd_logits(const cli_opts *o)
{
    if (!o->ids_file)
        return cli_error("logits needs --ids-file FILE");
    lm_model m;
    if (cli_open_model(o, &m, NULL))
        return EXIT_ERR;
    char *text = NULL;
    size_t len;
    int32_t *ids = NULL;
    float *out = NULL;
    int n = 0, rc = EXIT_ERR;
    if (cli_read_file(o->ids_file, &text, &len) || parse_ids(o->ids_file, text, m.hp.n_vocab, &ids, &n))
        goto done;
    size_t total = (size_t)n * (size_t)m.hp.n_vocab;
    if (!(out = malloc(total * sizeof *out))) {
        cli_error("out of memory for %d rows of logits", n);
        goto done;
    }
    if (eval_logits(o, &m, ids, n, out))
        goto done;
    FILE *f = o->out_file ? fopen(o->out_file, "wb") : stdout;
    if (!f) {
        cli_error("%s: %s", o->out_file, strerror(errno));
        goto done;
    }
    int bad = fwrite(out, sizeof *out, total, f) != total;
    bad |= (f != stdout ? fclose(f) : fflush(f)) != 0;
    if (bad)
        cli_error("%s: write error", o->out_file ? o->out_file : "stdout");
    else
        rc = EXIT_OK;
done:
    free(text);
    free(ids);
    free(out);
    lm_model_close(&m);
    return rc;
}
