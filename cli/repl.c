/*
 * cli/repl.c - the three ways of talking to kvchat: a terminal (readline,
 * history, multi-line """ blocks, Ctrl-C stops a reply), piped stdin (each
 * line a message, only replies and command output on stdout) and -f
 * scripts (the same grammar plus # comments; an error stops the run with
 * file:line).  --json turns stdout into one JSON object per line.
 */
#include "cli.h"

#include <errno.h>
#include <readline/history.h>
#include <readline/readline.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Set by SIGINT; read by the engine between tokens and layers. The only
 * mutable global of the program: signal handlers cannot take arguments. */
static volatile int interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* ---------------------------------------------------------------- output */

/*
 * SIGINT held while stdout is written.  It has no SA_RESTART (so that
 * Ctrl-C interrupts a blocked read), so a Ctrl-C arriving during a write
 * to a terminal failed that write with EINTR; stdio then dropped the rest
 * and marked stdout failed, and the program left ("stdout: write error")
 * where it should have stopped the reply.  Held, the signal arrives right
 * after the write, between tokens as before.
 */
static sigset_t hold_sigint(void)
{
    sigset_t int_only, old;
    sigemptyset(&int_only);
    sigaddset(&int_only, SIGINT);
    sigprocmask(SIG_BLOCK, &int_only, &old);
    return old;
}

static void release_sigint(const sigset_t *old)
{
    sigprocmask(SIG_SETMASK, old, NULL);
}

/* stdout's buffer written out, SIGINT held. */
static void flush_out(void)
{
    const sigset_t old = hold_sigint();
    fflush(stdout);
    release_sigint(&old);
}

/* Writes s as a JSON string body (RFC 8259); invalid UTF-8 becomes U+FFFD. */
static void json_string(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') {
            fputc('\\', f), fputc(ch, f), i++;
        } else if (ch < 0x20) {
            static const char esc[] = "btn\0fr";
            if (ch >= 8 && ch <= 13 && ch != 11)
                fputc('\\', f), fputc(esc[ch - 8], f);
            else
                fprintf(f, "\\u%04x", ch);
            i++;
        } else if (ch < 0x80) {
            fputc(ch, f), i++;
        } else {
            size_t ok = tok_utf8_valid_prefix(s + i, n - i);
            size_t j = i;
            if (ok) { /* copy one valid character */
                do
                    j++;
                while (j < n && ((unsigned char)s[j] & 0xc0) == 0x80 && j - i < 4);
                fwrite(s + i, 1, j - i, f);
            } else {
                fputs("\\ufffd", f);
                j = i + 1;
            }
            i = j;
        }
    }
    fputc('"', f);
}

void session_output(session *s, const char *command, const char *text)
{
    const sigset_t old = hold_sigint();
    if (s->json) {
        printf("{\"type\":\"output\",\"command\":");
        json_string(stdout, command, strlen(command));
        printf(",\"text\":");
        json_string(stdout, text, strlen(text));
        printf("}\n");
    } else {
        size_t n = strlen(text);
        fputs(text, stdout);
        if (!n || text[n - 1] != '\n')
            fputc('\n', stdout);
    }
    fflush(stdout);
    release_sigint(&old);
}

static void session_error(session *s, const char *msg)
{
    if (s->json) {
        const sigset_t old = hold_sigint();
        printf("{\"type\":\"error\",\"line\":%d,\"message\":", s->line_no);
        json_string(stdout, msg, strlen(msg));
        printf("}\n");
        fflush(stdout);
        release_sigint(&old);
    }
    if (s->script)
        fprintf(stderr, "%s:%d: %s\n", s->source, s->line_no, msg);
    else if (s->tty)
        fprintf(stderr, "%s%s%s\n", s->color ? "\033[31m" : "", msg, s->color ? "\033[0m" : "");
    else
        fprintf(stderr, "kvchat: line %d: %s\n", s->line_no, msg);
}

/* Reply text as it streams: printed at once, or gathered for JSON. */
typedef struct gather {
    session *s;
    char *buf;
    size_t n, cap;
    int last_nl;
} gather;

static void sink_write(void *ud, const char *p, size_t n)
{
    gather *g = ud;
    if (!n)
        return;
    g->last_nl = p[n - 1] == '\n';
    if (!g->s->json) {
        const sigset_t old = hold_sigint();
        fwrite(p, 1, n, stdout);
        fflush(stdout);
        release_sigint(&old);
        return;
    }
    if (g->n + n > g->cap) {
        size_t cap = (g->n + n) * 2;
        char *b = realloc(g->buf, cap);
        if (!b)
            return;
        g->buf = b;
        g->cap = cap;
    }
    memcpy(g->buf + g->n, p, n);
    g->n += n;
}

static void print_stats(const chat *c)
{
    const turn_stats *t = &c->last;
    fprintf(stderr, "[stats] prompt=%d reused=%d decoded=%d generated=%d n_past=%d prefill_ms=%.1f ttft_ms=%.1f gen_tps=%.1f\n",
            t->prompt, t->reused, t->decoded, t->generated, t->n_past, t->prefill_ms, t->ttft_ms, t->gen_tps);
}

static void finish_reply(session *s, gather *g)
{
    chat *c = s->chat;
    const turn_stats *t = &c->last;
    const sigset_t old = hold_sigint();
    if (s->json) {
        printf("{\"type\":\"reply\",\"turn\":%d,\"content\":", c->turns);
        json_string(stdout, g->buf ? g->buf : "", g->n);
        printf(",\"prompt\":%d,\"reused\":%d,\"decoded\":%d,\"generated\":%d,\"n_past\":%d}\n",
               t->prompt, t->reused, t->decoded, t->generated, t->n_past);
    } else {
        if (!g->last_nl)
            fputc('\n', stdout);
        if (s->color)
            fputs("\033[0m", stdout);
    }
    fflush(stdout);
    release_sigint(&old);
    if (c->show_stats)
        print_stats(c);
}

/* One user message and the reply to it. */
int session_turn(session *s, const char *text, size_t len, char *err, size_t n)
{
    chat *c = s->chat;
    size_t ok = tok_utf8_valid_prefix(text, len);
    if (ok < len) {
        snprintf(err, n, "invalid UTF-8 at byte %zu of the message", ok);
        return -1;
    }
    if (chat_add(c, ROLE_USER, text, len)) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    gather g = {s, NULL, 0, 0, 1};
    reply_sink sink = {sink_write, &g};
    lm_err e = {{0}};
    interrupted = 0;
    if (s->color && !s->json)
        fputs("\033[36m", stdout);
    if (chat_reply(c, &sink, &e)) {
        chat_drop_from(c, c->n_msgs - 1); /* the turn did not happen */
        if (s->color && !s->json)
            fputs("\033[0m", stdout), flush_out();
        snprintf(err, n, "%s", interrupted ? "interrupted" : e.msg);
        interrupted = 0;
        return -1;
    }
    const int cut = interrupted;
    if (interrupted && s->tty)
        fputs(" [interrupted]", stdout);
    interrupted = 0;
    finish_reply(s, &g);
    free(g.buf);
    if (s->more && !cut) {
        flush_out();
        chat_prepare_next(c);
        interrupted = 0; /* Ctrl-C during it only stops it */
    }
    return 0;
}

/* ----------------------------------------------------------------- input */

typedef struct input {
    FILE *f;            /* pipe or script; NULL for readline */
    char *line;
    size_t cap;
} input;

static char *history_path(void)
{
    const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    char dir[1024];
    if (xdg && *xdg)
        snprintf(dir, sizeof dir, "%s/kvchat", xdg);
    else if (home && *home)
        snprintf(dir, sizeof dir, "%s/.local/state/kvchat", home);
    else
        return NULL;
    for (char *p = dir + 1; *p; p++) /* mkdir -p */
        if (*p == '/') {
            *p = 0;
            mkdir(dir, 0700);
            *p = '/';
        }
    mkdir(dir, 0700);
    size_t n = strlen(dir) + 16;
    char *path = malloc(n);
    if (path)
        snprintf(path, n, "%s/history", dir);
    return path;
}

static const char *edit_prefill;

static int prefill_hook(void)
{
    if (edit_prefill) {
        rl_insert_text(edit_prefill);
        edit_prefill = NULL;
    }
    rl_startup_hook = NULL;
    return 0;
}

/* Ctrl-C at the prompt: drop the line being typed, keep the program. */
static int on_readline_signal(void)
{
    if (interrupted) {
        interrupted = 0;
        rl_replace_line("", 0);
        fputs("^C", stdout);
        rl_crlf();
        rl_on_new_line();
        rl_redisplay();
    }
    return 0;
}

/* Next line without its newline; NULL at end of input. */
static char *next_line(session *s, input *in, int continuation)
{
    s->line_no++;
    if (!in->f) {
        free(in->line);
        const char *prompt = continuation ? "... " : s->color ? "\001\033[32m\002> \001\033[0m\002" : "> ";
        in->line = readline(prompt);
        clearerr(stdout); /* its prompt is written without SIGINT held (hold_sigint): only our writes count */
        if (in->line && *in->line && !continuation)
            add_history(in->line);
        return in->line;
    }
    errno = 0;
    ssize_t n = getline(&in->line, &in->cap, in->f);
    if (n < 0)
        return NULL;
    while (n > 0 && (in->line[n - 1] == '\n' || in->line[n - 1] == '\r'))
        in->line[--n] = 0;
    return in->line;
}

/* Reads a """ block; its lines joined with newlines. NULL: end of input first. */
static char *read_block(session *s, input *in, size_t *len)
{
    size_t cap = 256, n = 0;
    char *b = malloc(cap);
    for (char *l; b && (l = next_line(s, in, 1));) {
        if (!strcmp(l, "\"\"\""))
            return *len = n, b[n] = 0, b;
        size_t ll = strlen(l);
        if (n + ll + 2 > cap) {
            char *nb = realloc(b, cap = (n + ll + 2) * 2);
            if (!nb)
                break;
            b = nb;
        }
        if (n)
            b[n++] = '\n';
        memcpy(b + n, l, ll);
        n += ll;
    }
    free(b);
    return NULL;
}

/* Handles one input line; 1 to quit, -1 on error, 0 otherwise. */
static int handle_line(session *s, input *in, const char *line, char *err, size_t n)
{
    if (s->pending_edit) {
        command cmd = {.kind = CMD_EDIT, .index = s->pending_edit, .has_text = 1, .text = (char *)line};
        s->pending_edit = 0;
        return command_run(s, &cmd, err, n);
    }
    if (!*line || (s->script && line[0] == '#'))
        return 0;
    if (line[0] == '/') {
        command cmd;
        int rc = command_parse(line, &cmd, err, n);
        if (!rc)
            rc = command_run(s, &cmd, err, n);
        command_free(&cmd);
        if (s->pending_edit && in && !in->f) {
            const chat_message *m = &s->chat->msgs[s->pending_edit - 1];
            edit_prefill = m->text;
            rl_startup_hook = prefill_hook;
        }
        return rc;
    }
    if (!strcmp(line, "\"\"\"")) {
        size_t len;
        int start = s->line_no;
        char *block = read_block(s, in, &len);
        if (!block) {
            s->line_no = start;
            snprintf(err, n, "unterminated \"\"\" block (end of input)");
            return -1;
        }
        int rc = session_turn(s, block, len, err, n);
        free(block);
        return rc;
    }
    return session_turn(s, line, strlen(line), err, n);
}

static int run_loop(session *s, input *in)
{
    int failed = 0;
    char err[600];
    s->more = 1;
    for (char *line; (line = next_line(s, in, 0));) {
        err[0] = 0;
        int rc = handle_line(s, in, line, err, sizeof err);
        if (rc > 0)
            break;
        if (rc < 0) {
            session_error(s, err);
            failed = 1;
            if (s->script)
                return EXIT_ERR;
        }
        if (ferror(stdout))
            return cli_error("stdout: write error");
    }
    return failed && !s->tty ? EXIT_ERR : EXIT_OK;
}

static int interactive(session *s)
{
    char *hist = history_path();
    if (hist)
        read_history(hist);
    rl_catch_signals = 0;
    rl_signal_event_hook = on_readline_signal;
    fprintf(stderr, "kvchat %s: %s, %s template, n_ctx %d. /help for commands, Ctrl-D to leave.\n",
            KVCHAT_VERSION, lm_arch_name(&s->chat->model), tmpl_name(s->chat->family),
            s->chat->kv.n_ctx);
    input in = {0};
    int rc = run_loop(s, &in);
    free(in.line);
    if (hist) {
        write_history(hist);
        history_truncate_file(hist, 2000);
        free(hist);
    }
    fputc('\n', stdout);
    return rc;
}

int cli_run_script(chat *c, FILE *f, const char *name, int json)
{
    session s = {c, json, 0, 0, 1, 0, name, 0, 0};
    input in = {f, NULL, 0};
    int rc = run_loop(&s, &in);
    free(in.line);
    return rc;
}

int cmd_chat(const cli_opts *o)
{
    chat c;
    if (chat_open(&c, o, &interrupted))
        return EXIT_ERR;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL); /* no SA_RESTART: Ctrl-C interrupts a blocked read */
    session s = {&c, o->json, 0, 0, 0, 0, NULL, 0, 0};
    int rc;
    const int typed = !o->prompt && !o->prompt_file && isatty(0) && isatty(1) && !o->json;
    if (!typed) /* no one types between messages: the decodes finish the weights' copy */
        lm_weights_eager(&c.model);
    if (o->prompt) { /* one message, its reply, and out: like `ollama run MODEL PROMPT` */
        char err[600];
        if ((rc = session_turn(&s, o->prompt, strlen(o->prompt), err, sizeof err)))
            cli_error("%s", err);
        rc = rc ? EXIT_ERR : EXIT_OK;
    } else if (o->prompt_file) {
        input in = {fopen(o->prompt_file, "r"), NULL, 0};
        if (!in.f) {
            chat_close(&c);
            return cli_error("%s: %s", o->prompt_file, strerror(errno));
        }
        s.script = 1;
        s.source = o->prompt_file;
        rc = run_loop(&s, &in);
        fclose(in.f);
        free(in.line);
    } else if (typed) {
        s.tty = 1;
        s.color = getenv("NO_COLOR") == NULL || !*getenv("NO_COLOR") ? 1 : 0;
        rc = interactive(&s);
    } else {
        input in = {stdin, NULL, 0};
        rc = run_loop(&s, &in);
        free(in.line);
    }
    chat_close(&c);
    return rc;
}
