/*
 * cli/commands.c - the REPL commands, the same in the terminal, in piped
 * input and in -f scripts.  Parsing is separate from running so the grammar
 * can be tested alone; a command with a bad argument changes nothing.
 * Every command that changes the conversation does it through chat.c, and
 * the next turn's prefix match decides what the cache keeps.
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct cmd_def {
    const char *name;
    int kind;
    int args;          /* 0: none; 1: optional text; 2: required */
} cmd_def;

static const cmd_def CMDS[] = {
    {"help", CMD_HELP, 0}, {"quit", CMD_QUIT, 0}, {"exit", CMD_QUIT, 0}, {"bye", CMD_QUIT, 0},
    {"pos", CMD_POS, 0}, {"reset", CMD_RESET, 0}, {"history", CMD_HISTORY, 0},
    {"edit", CMD_EDIT, 2}, {"regen", CMD_REGEN, 0}, {"undo", CMD_UNDO, 0}, {"add", CMD_ADD, 2},
    {"system", CMD_SYSTEM, 1}, {"set", CMD_SET, 1}, {"stats", CMD_STATS, 0},
};

static int fail(char *err, size_t n, const char *fmt, const char *arg)
{
    snprintf(err, n, fmt, arg);
    return -1;
}

/* "\n", "\t", "\r" and "\\" become the characters; other backslashes stay. */
static char *unescape(const char *s)
{
    char *out = malloc(strlen(s) + 1), *o = out;
    if (!out)
        return NULL;
    for (; *s; s++) {
        if (s[0] == '\\' && (s[1] == 'n' || s[1] == 't' || s[1] == 'r' || s[1] == '\\')) {
            *o++ = s[1] == 'n' ? '\n' : s[1] == 't' ? '\t' : s[1] == 'r' ? '\r' : '\\';
            s++;
        } else {
            *o++ = *s;
        }
    }
    *o = 0;
    return out;
}

/* /edit N [TEXT] */
static int parse_edit(const char *args, command *c, char *err, size_t n)
{
    char *end;
    errno = 0;
    long v = strtol(args, &end, 10);
    if (end == args || errno || v < 0 || v > 1000000 || (*end && *end != ' '))
        return fail(err, n, "/edit needs a message number, got '%s'", args);
    c->index = (int)v;
    c->has_text = *end == ' ';
    c->text = strdup(c->has_text ? end + 1 : "");
    return c->text ? 0 : fail(err, n, "%s", "out of memory");
}

/* /add ROLE TEXT */
static int parse_add(const char *args, command *c, char *err, size_t n)
{
    char role[16] = "";
    size_t rl = strcspn(args, " ");
    if (rl < sizeof role)
        memcpy(role, args, rl), role[rl] = 0;
    c->role = role_from_name(role);
    if (c->role < 0)
        return fail(err, n, "/add needs a role (system, user or assistant), got '%s'", args);
    c->has_text = args[rl] == ' ';
    c->text = unescape(c->has_text ? args + rl + 1 : "");
    return c->text ? 0 : fail(err, n, "%s", "out of memory");
}

/* /set [NAME VALUE] */
static int parse_set(const char *args, command *c, char *err, size_t n)
{
    if (!*args)
        return 0;
    const char *sp = strchr(args, ' ');
    if (!sp || sp == args || (size_t)(sp - args) >= sizeof c->name || strlen(sp + 1) >= sizeof c->value ||
        !sp[1] || strchr(sp + 1, ' '))
        return fail(err, n, "/set needs NAME VALUE, got '%s'", args);
    memcpy(c->name, args, (size_t)(sp - args));
    c->name[sp - args] = 0;
    strcpy(c->value, sp + 1);
    c->has_text = 1;
    return 0;
}

int command_parse(const char *line, command *c, char *err, size_t n)
{
    memset(c, 0, sizeof *c);
    if (line[0] != '/')
        return fail(err, n, "not a command: '%s'", line);
    size_t nl = strcspn(line + 1, " ");
    const char *args = line + 1 + nl + (line[1 + nl] == ' ');
    const cmd_def *d = NULL;
    for (size_t i = 0; i < sizeof CMDS / sizeof CMDS[0]; i++)
        if (strlen(CMDS[i].name) == nl && !memcmp(CMDS[i].name, line + 1, nl))
            d = &CMDS[i];
    if (!d)
        return fail(err, n, "unknown command '%s' (see /help)", line);
    c->kind = d->kind;
    if (d->args == 0 && *args)
        return fail(err, n, "%s takes no argument", line);
    if (d->args == 2 && !*args)
        return fail(err, n, "%s needs an argument (see /help)", line);
    switch (d->kind) {
    case CMD_EDIT: return parse_edit(args, c, err, n);
    case CMD_ADD: return parse_add(args, c, err, n);
    case CMD_SET: return parse_set(args, c, err, n);
    case CMD_SYSTEM:
        c->has_text = *args != 0;
        c->text = strdup(args);
        return c->text ? 0 : fail(err, n, "%s", "out of memory");
    default: return 0;
    }
}

void command_free(command *c)
{
    free(c->text);
    c->text = NULL;
}

static const char HELP[] =
    "/help                 this help\n"
    "/quit, /exit, /bye    leave\n"
    "/pos                  the cache: n_past=N n_ctx=M\n"
    "/reset                forget the conversation (the system prompt stays)\n"
    "/history              the messages, numbered (system prompt as 0)\n"
    "/edit N TEXT          replace message N, drop the later ones (a user message gets a new reply)\n"
    "/regen                generate the last reply again\n"
    "/undo                 drop the last user message and its reply\n"
    "/add ROLE TEXT        append a message without a reply (\\n, \\t, \\r, \\\\ escapes)\n"
    "/system TEXT          set the system prompt\n"
    "/set [NAME VALUE]     temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, n_predict\n"
    "/stats                toggle the per-turn statistics line\n"
    "\"\"\"                   on its own line, starts and ends a multi-line message";

static int run_set(session *s, const command *cmd, char *err, size_t n)
{
    chat *c = s->chat;
    lm_sampling *p = &c->sampling;
    char buf[256];
    if (!cmd->has_text) {
        snprintf(buf, sizeof buf, "temp=%g top_k=%d top_p=%g min_p=%g repeat_penalty=%g "
                 "repeat_last_n=%d seed=%llu n_predict=%d", p->temp, p->top_k, p->top_p, p->min_p,
                 p->repeat_penalty, p->repeat_last_n, (unsigned long long)p->seed, c->n_predict);
        session_output(s, "/set", buf);
        return 0;
    }
    char *end;
    errno = 0;
    double v = strtod(cmd->value, &end);
    if (end == cmd->value || *end || errno || !isfinite(v))
        return fail(err, n, "/set: '%s' is not a number", cmd->value);
    lm_sampling q = *p;
    int n_predict = c->n_predict, whole = v == floor(v);
    if (!strcmp(cmd->name, "temp") && v >= 0) q.temp = (float)v;
    else if (!strcmp(cmd->name, "top_k") && whole && v >= 0 && v < 1e9) q.top_k = (int)v;
    else if (!strcmp(cmd->name, "top_p") && v >= 0 && v <= 1) q.top_p = (float)v;
    else if (!strcmp(cmd->name, "min_p") && v >= 0 && v <= 1) q.min_p = (float)v;
    else if (!strcmp(cmd->name, "repeat_penalty") && v > 0) q.repeat_penalty = (float)v;
    else if (!strcmp(cmd->name, "repeat_last_n") && whole && v >= -1 && v < 1e9) q.repeat_last_n = (int)v;
    else if (!strcmp(cmd->name, "seed") && whole && v >= 0 && v < 1.8e19) q.seed = (uint64_t)v;
    else if (!strcmp(cmd->name, "n_predict") && whole && v >= -1 && v < 1e9) n_predict = (int)v;
    else {
        snprintf(err, n, "/set %s %s: unknown name or value out of range", cmd->name, cmd->value);
        return -1;
    }
    lm_sampler *ns = lm_sampler_new(&q, c->model.hp.n_vocab);
    if (!ns)
        return fail(err, n, "%s", "out of memory");
    if (strcmp(cmd->name, "seed")) /* the random stream goes on unless reseeded */
        lm_sampler_reseed(ns, lm_sampler_state(c->sampler));
    lm_sampler_free(c->sampler);
    c->sampler = ns;
    c->sampling = q;
    c->n_predict = n_predict;
    return 0;
}

static void run_history(session *s)
{
    chat *c = s->chat;
    size_t cap = 256;
    for (int i = 0; i < c->n_msgs; i++)
        cap += strlen(c->msgs[i].text) + 32;
    if (c->system)
        cap += strlen(c->system);
    char *buf = malloc(cap);
    if (!buf)
        return;
    size_t off = (size_t)snprintf(buf, cap, "0 system: %s", c->system ? c->system : "");
    for (int i = 0; i < c->n_msgs; i++)
        off += (size_t)snprintf(buf + off, cap - off, "\n%d %s: %s", i + 1, role_name(c->msgs[i].role),
                                c->msgs[i].text);
    session_output(s, "/history", buf);
    free(buf);
}

static int run_edit(session *s, const command *cmd, char *err, size_t n)
{
    chat *c = s->chat;
    if (cmd->index == 0)
        return chat_set_system(c, cmd->text) ? fail(err, n, "%s", "out of memory") : 0;
    if (cmd->index > c->n_msgs) {
        snprintf(err, n, "/edit %d: there is no message %d (%d messages)", cmd->index, cmd->index,
                 c->n_msgs);
        return -1;
    }
    if (!cmd->has_text && s->tty) {
        s->pending_edit = cmd->index; /* the old text goes on the input line */
        return 0;
    }
    if (!cmd->has_text)
        return fail(err, n, "%s", "/edit N needs the new text");
    int i = cmd->index - 1;
    if (c->msgs[i].role == ROLE_USER) { /* a new user message: it gets a new reply */
        chat_drop_from(c, i);
        return session_turn(s, cmd->text, strlen(cmd->text), err, n);
    }
    char *t = strdup(cmd->text);
    if (!t)
        return fail(err, n, "%s", "out of memory");
    chat_drop_from(c, i + 1);
    free(c->msgs[i].text);
    c->msgs[i].text = t;
    return 0;
}

static int run_regen(session *s, char *err, size_t n)
{
    chat *c = s->chat;
    if (c->n_msgs && c->msgs[c->n_msgs - 1].role == ROLE_ASSISTANT)
        chat_drop_from(c, c->n_msgs - 1);
    if (!c->n_msgs || c->msgs[c->n_msgs - 1].role != ROLE_USER)
        return fail(err, n, "%s", "/regen: there is no user message to reply to");
    char *t = strdup(c->msgs[c->n_msgs - 1].text);
    if (!t)
        return fail(err, n, "%s", "out of memory");
    chat_drop_from(c, c->n_msgs - 1);
    int rc = session_turn(s, t, strlen(t), err, n);
    free(t);
    return rc;
}

static int run_undo(session *s, char *err, size_t n)
{
    chat *c = s->chat;
    int i = c->n_msgs - 1;
    while (i >= 0 && c->msgs[i].role != ROLE_USER)
        i--;
    if (i < 0)
        return fail(err, n, "%s", "/undo: there is no user message");
    chat_drop_from(c, i);
    return 0;
}

int command_run(session *s, const command *cmd, char *err, size_t n)
{
    chat *c = s->chat;
    char buf[128];
    switch (cmd->kind) {
    case CMD_HELP:
        session_output(s, "/help", HELP);
        return 0;
    case CMD_QUIT:
        return 1;
    case CMD_POS:
        snprintf(buf, sizeof buf, "n_past=%d n_ctx=%d messages=%d", c->kv.n_past, c->kv.n_ctx,
                 c->n_msgs);
        session_output(s, "/pos", buf);
        return 0;
    case CMD_RESET:
        chat_reset(c);
        return 0;
    case CMD_HISTORY:
        run_history(s);
        return 0;
    case CMD_EDIT:
        return run_edit(s, cmd, err, n);
    case CMD_REGEN:
        return run_regen(s, err, n);
    case CMD_UNDO:
        return run_undo(s, err, n);
    case CMD_ADD:
        if (cmd->role == ROLE_SYSTEM && c->n_msgs == 0 && !c->system)
            return chat_set_system(c, cmd->text) ? fail(err, n, "%s", "out of memory") : 0;
        return chat_add(c, cmd->role, cmd->text, strlen(cmd->text)) ? fail(err, n, "%s", "out of memory") : 0;
    case CMD_SYSTEM:
        if (!cmd->has_text) {
            session_output(s, "/system", c->system ? c->system : "");
            return 0;
        }
        return chat_set_system(c, cmd->text) ? fail(err, n, "%s", "out of memory") : 0;
    case CMD_SET:
        return run_set(s, cmd, err, n);
    case CMD_STATS:
        c->show_stats = !c->show_stats;
        return 0;
    default:
        return fail(err, n, "%s", "unknown command");
    }
}
