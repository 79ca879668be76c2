/*
 * cli/cmd_complete.c - raw completion: the prompt as it is (no chat
 * template), then tokens sampled one at a time and streamed to stdout until
 * an end-of-generation token, -n tokens, or the end of the context.
 * Ctrl-C stops the generation and keeps what was printed.
 */
#include "cli.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile int interrupted; /* set by SIGINT: the only global state, owned by cli/ */

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

static int load_prompt(const cli_opts *o, char **text, size_t *len)
{
    if (o->prompt) {
        *text = strdup(o->prompt);
        *len = strlen(o->prompt);
        return *text ? 0 : cli_error("out of memory");
    }
    if (o->prompt_file)
        return cli_read_file(o->prompt_file, text, len);
    return cli_error("complete needs a prompt (-p TEXT or -f FILE)");
}

static int emit(tok_stream *st, const char *piece, size_t len)
{
    char buf[4096 + 16];
    if (len > 4096)
        len = 4096;
    size_t n = tok_stream_put(st, piece, len, buf);
    if (n && fwrite(buf, 1, n, stdout) != n)
        return -1;
    return fflush(stdout);
}

static int generate(const cli_opts *o, kv_context *c, const tok_vocab *v)
{
    lm_sampling sp = o->sampling;
    sp.seed = cli_seed(o);
    lm_sampler *s = lm_sampler_new(&sp, c->model->hp.n_vocab);
    if (!s)
        return cli_error("out of memory for the sampler");
    tok_stream st = {{0}, 0};
    lm_err e = {{0}};
    int rc = 0;
    for (int i = 0; o->n_predict < 0 || i < o->n_predict; i++) {
        if (interrupted)
            break;
        if (c->n_past >= c->n_ctx) {
            fprintf(stderr, "\nkvchat: context full (%d tokens)\n", c->n_ctx);
            break;
        }
        int32_t t = lm_sample(s, c->logits, c->tokens, c->n_past);
        if (tok_is_eog(v, t))
            break;
        size_t len;
        const char *piece = tok_piece(v, t, 0, &len);
        if (emit(&st, piece, len)) {
            rc = cli_error("stdout: write error");
            break;
        }
        if (kv_eval(c, &t, 1, NULL, &interrupted, &e)) {
            if (!interrupted)
                rc = cli_error("%s", e.msg);
            break;
        }
    }
    /* like llama-cli, end the output with a newline so the shell prompt
       starts on its own line */
    char tail[16];
    size_t n = tok_stream_flush(&st, tail);
    tail[n++] = '\n';
    if ((fwrite(tail, 1, n, stdout) != n || fflush(stdout)) && !rc)
        rc = cli_error("stdout: write error");
    lm_sampler_free(s);
    return rc;
}

int cmd_complete(const cli_opts *o)
{
    lm_model m;
    tok_vocab *v = NULL;
    char *text = NULL;
    size_t len = 0;
    if (load_prompt(o, &text, &len))
        return EXIT_ERR;
    if (cli_open_model(o, &m, &v)) {
        free(text);
        return EXIT_ERR;
    }
    int32_t *ids = NULL;
    int n = 0, rc = EXIT_ERR;
    lm_err e = {{0}};
    kv_context c;
    int have_ctx = 0;
    if (tok_encode(v, text, len, 1, 1, &ids, &n, &e) || n == 0) {
        cli_error("%s", n == 0 ? "the prompt gives no tokens" : e.msg);
        goto out;
    }
    if (kv_init(&c, &m, cli_ctx_size(o, &m), o->kv_type, o->n_threads, &e)) {
        cli_error("%s", e.msg);
        goto out;
    }
    have_ctx = 1;
    lm_weights_eager(&m); /* one long run: its decodes finish the weights' copy */
    signal(SIGINT, on_sigint);
    if (kv_eval(&c, ids, n, NULL, &interrupted, &e)) {
        cli_error("%s", e.msg);
        goto out;
    }
    if (o->echo && (fwrite(text, 1, len, stdout) != len || fflush(stdout))) {
        cli_error("stdout: write error");
        goto out;
    }
    rc = generate(o, &c, v) ? EXIT_ERR : EXIT_OK;
out:
    if (have_ctx)
        kv_free(&c);
    free(ids);
    free(text);
    tok_free(v);
    lm_model_close(&m);
    return rc;
}
