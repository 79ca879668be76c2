/*
 * cli/cli.c - the entry point: parse the command line, dispatch to a
 * subcommand, and the small helpers the subcommands share (reading a
 * file whole, opening a model with its vocabulary, choosing n_ctx).
 */
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int cli_read_file(const char *path, char **buf, size_t *len)
{
    FILE *f = !strcmp(path, "-") ? stdin : fopen(path, "rb");
    if (!f)
        return cli_error("%s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *b = malloc(cap + 1);
    while (b) {
        n += fread(b + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *nb = realloc(b, 2 * cap + 1);
        if (!nb) {
            free(b);
            b = NULL;
            break;
        }
        b = nb;
        cap *= 2;
    }
    int bad = ferror(f);
    if (f != stdin)
        fclose(f);
    if (!b)
        return cli_error("%s: out of memory", path);
    if (bad) {
        free(b);
        return cli_error("%s: read error", path);
    }
    b[n] = 0;
    *buf = b;
    *len = n;
    return 0;
}

int cli_open_model(const cli_opts *o, lm_model *m, tok_vocab **v)
{
    lm_err e = {{0}};
    if (!o->model)
        return cli_error("no model given (use -m FILE; models.txt lists known models)");
    if (lm_model_open(m, o->model, &e))
        return cli_error("%s", e.msg);
    if (v && !(*v = tok_load(&m->gguf, &e))) {
        lm_model_close(m);
        return cli_error("%s", e.msg);
    }
    if (v && tok_n_vocab(*v) != m->hp.n_vocab) {
        cli_error("%s: vocabulary has %d tokens but token_embd.weight has %d rows", o->model,
                  tok_n_vocab(*v), m->hp.n_vocab);
        tok_free(*v);
        lm_model_close(m);
        return EXIT_ERR;
    }
    return 0;
}

/* -s, or a fresh seed from the clock and the pid (as llama-cli's random default). */
uint64_t cli_seed(const cli_opts *o)
{
    if (o->seed_set)
        return o->sampling.seed;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid();
}

int cli_ctx_size(const cli_opts *o, const lm_model *m)
{
    if (o->n_ctx > 0)
        return o->n_ctx;
    return m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096;
}

int cli_main(int argc, char **argv)
{
    cli_opts o;
    int r = cli_parse(argc, argv, &o);
    if (r < 0)
        return EXIT_OK; /* --help or --version */
    if (r)
        return r;
    if (!o.cmd)
        return cmd_chat(&o);
    if (!strcmp(o.cmd, "info"))
        return cmd_info(&o);
    if (!strcmp(o.cmd, "tokenize"))
        return cmd_tokenize(&o);
    if (!strcmp(o.cmd, "logits"))
        return cmd_logits(&o);
    if (!strcmp(o.cmd, "bench"))
        return cmd_bench(&o);
    return cmd_complete(&o);
}
