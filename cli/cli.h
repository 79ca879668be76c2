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

#define CLI_BENCH_LIST 16

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
    const char *system_prompt;   /* -sys */
    const char *chat_template;   /* --chat-template NAME */
    int no_context_shift, stats, json;
    /* kvchat bench: lists of prompt lengths, generation lengths, thread counts and cache
       depths (llama-bench's -p 512,128 and -d 0,4096) */
    int bench_p[CLI_BENCH_LIST], bench_n[CLI_BENCH_LIST], bench_t[CLI_BENCH_LIST], bench_d[CLI_BENCH_LIST];
    int n_bench_p, n_bench_n, n_bench_t, n_bench_d;
    int bench_reps, bench_csv;
} cli_opts;

int cli_main(int argc, char **argv);
int cli_parse(int argc, char **argv, cli_opts *o);
void cli_usage(FILE *f);
int cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Loading helpers shared by the subcommands. */
int cli_read_file(const char *path, char **buf, size_t *len);
int cli_open_model(const cli_opts *o, lm_model *m, tok_vocab **v);
int cli_ctx_size(const cli_opts *o, const lm_model *m);
uint64_t cli_seed(const cli_opts *o);

/* ---- the conversation (chat.c) ---- */

enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT };

typedef struct chat_message {
    int role;
    char *text;
} chat_message;

typedef struct turn_stats {
    int prompt, reused, decoded, generated, n_past;
    double prefill_ms, gen_tps;
    double ttft_ms; /* turn start (render, tokenize) to the first token sampled */
} turn_stats;

/* Where a reply's text goes as it is generated. */
typedef struct reply_sink {
    void (*write)(void *ud, const char *s, size_t n);
    void *ud;
} reply_sink;

typedef struct chat {
    lm_model model;
    tok_vocab *vocab;
    tok_memo *memo;             /* the last rendering's token ids, for the next turn */
    kv_context kv;
    lm_sampler *sampler;
    lm_sampling sampling;
    int family;                 /* enum tmpl_family */
    char *system;               /* the system prompt, NULL when none */
    chat_message *msgs;
    int n_msgs, cap;
    int n_predict, context_shift, show_stats;
    volatile int *interrupt;
    turn_stats last;
    int turns;                  /* replies generated so far */
} chat;

int chat_open(chat *c, const cli_opts *o, volatile int *interrupt);
void chat_close(chat *c);
const char *role_name(int role);
int role_from_name(const char *name);
int chat_add(chat *c, int role, const char *text, size_t len);
void chat_drop_from(chat *c, int index);     /* drops msgs[index..] */
int chat_set_system(chat *c, const char *text);
void chat_reset(chat *c);
/*
 * Generates the assistant's reply to the conversation as it stands (its
 * last message is the user's), streaming text to sink; the reply becomes
 * the last message.  0 on success (also when interrupted: the partial reply
 * is kept), -1 with a message in e when the turn could not run; then the
 * conversation and the cache are as before the turn.
 */
int chat_reply(chat *c, reply_sink *sink, lm_err *e);
/* Decodes the next turn's opening, the same whatever the user writes (after a reply). */
void chat_prepare_next(chat *c);

/* ---- commands (commands.c) ---- */

enum cmd_kind {
    CMD_NONE, CMD_HELP, CMD_QUIT, CMD_POS, CMD_RESET, CMD_HISTORY, CMD_EDIT, CMD_REGEN,
    CMD_UNDO, CMD_ADD, CMD_SYSTEM, CMD_SET, CMD_STATS
};

typedef struct command {
    int kind;
    int index;             /* /edit N */
    int role;              /* /add ROLE */
    char *text;            /* /edit, /add, /system: malloc'ed, escapes decoded for /add */
    char name[32];         /* /set NAME */
    char value[64];        /* /set VALUE */
    int has_text;
} command;

/* Parses a line starting with '/'; -1 with a message in err on bad input. */
int command_parse(const char *line, command *cmd, char *err, size_t errlen);
void command_free(command *cmd);

/* Output of the interactive, piped and scripted modes (repl.c). */
typedef struct session {
    chat *chat;
    int json, tty, color, script, line_no;
    const char *source;    /* script file name for error messages */
    int pending_edit;      /* terminal: /edit N without text */
    int more;              /* more messages may follow: decode the next turn's opening after a reply */
} session;

/* Runs one command; writes its output; -1 on a bad argument (message in err). */
int command_run(session *s, const command *cmd, char *err, size_t errlen);
void session_output(session *s, const char *command, const char *text);
int session_turn(session *s, const char *text, size_t len, char *err, size_t errlen);

int cmd_chat(const cli_opts *o);
/* Runs a script (the -f grammar) on an open chat; for tests and fuzzing. */
int cli_run_script(chat *c, FILE *f, const char *name, int json);
int cmd_bench(const cli_opts *o);
int cmd_info(const cli_opts *o);
int cmd_tokenize(const cli_opts *o);
int cmd_logits(const cli_opts *o);
int cmd_complete(const cli_opts *o);

#endif
