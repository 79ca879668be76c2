/*
 * cli/cli.h - the command line: options, subcommands, and (later) the REPL.
 * This is the only layer that prints to the user, reads their files and
 * decides exit codes; below it, errors come back as lm_err messages.
 */
#ifndef KVCHAT_CLI_H
#define KVCHAT_CLI_H

#include <stdio.h>

#include "../cache/cache.h"
#include "../lm/lm.h"
#include "../tok/tok.h"

#define KVCHAT_VERSION "0.1.0"

enum { EXIT_OK = 0, EXIT_ERR = 1, EXIT_USAGE = 2 };

typedef struct cli_opts {
    const char *cmd;          /* subcommand, NULL for the default */
    const char *model;
    const char *prompt;
    const char *prompt_file;  /* -f / --file */
    const char *ids_file;
    const char *out_file;
    int n_predict, n_ctx, n_threads, kv_type;
    int echo, no_bos, special, sequential;
    lm_sampling sampling;
    int seed_set;
} cli_opts;

int cli_main(int argc, char **argv);
int cli_parse(int argc, char **argv, cli_opts *o);
void cli_usage(FILE *f);
int cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Loading helpers shared by the subcommands. */
int cli_read_file(const char *path, char **buf, size_t *len);
int cli_open_model(const cli_opts *o, lm_model *m, tok_vocab **v);
int cli_ctx_size(const cli_opts *o, const lm_model *m);

int cmd_info(const cli_opts *o);
int cmd_tokenize(const cli_opts *o);
int cmd_logits(const cli_opts *o);
int cmd_complete(const cli_opts *o);

#endif
