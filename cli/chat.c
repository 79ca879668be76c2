/*
 * cli/chat.c - the conversation: a list of messages and the one persistent
 * context.  Each turn renders the WHOLE conversation with the chat
 * template, tokenizes it, and lets kv_sync() keep the longest common token
 * prefix with what the cache holds: only the new message and the template
 * glue are decoded.  Positions are never computed from message lengths;
 * tokens are compared.  Generated tokens stay in the cache, so when the next
 * rendering reproduces the reply they are reused too.
 */
#include "cli.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const ROLE_NAMES[] = {"system", "user", "assistant"};

const char *role_name(int role) { return ROLE_NAMES[role]; }

int role_from_name(const char *name)
{
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, ROLE_NAMES[i]))
            return i;
    return -1;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The template: --chat-template, else the GGUF's, else raw. */
static int pick_family(const cli_opts *o, const lm_model *m)
{
    if (o->chat_template)
        return tmpl_from_name(o->chat_template);
    const char *t;
    size_t len;
    lm_err e;
    if (gguf_get_str(&m->gguf, "tokenizer.chat_template", &t, &len, &e) != 1)
        return TMPL_RAW;
    int f = tmpl_detect(t, len);
    if (f < 0) {
        fprintf(stderr, "kvchat: %s: chat template not recognised, using chatml "
                        "(--chat-template NAME chooses another)\n", o->model);
        f = TMPL_CHATML;
    }
    return f;
}

int chat_open(chat *c, const cli_opts *o, volatile int *interrupt)
{
    memset(c, 0, sizeof *c);
    if (o->chat_template && tmpl_from_name(o->chat_template) < 0) {
        char list[512];
        tmpl_list(list, sizeof list);
        return cli_error("unknown chat template '%s' (known: %s)", o->chat_template, list);
    }
    if (cli_open_model(o, &c->model, &c->vocab))
        return EXIT_ERR;
    lm_err e = {{0}};
    c->family = pick_family(o, &c->model);
    c->sampling = o->sampling;
    c->sampling.seed = cli_seed(o);
    c->n_predict = o->n_predict;
    c->context_shift = !o->no_context_shift;
    c->show_stats = o->stats;
    c->interrupt = interrupt;
    if (kv_init(&c->kv, &c->model, cli_ctx_size(o, &c->model), o->kv_type, o->n_threads, &e)) {
        chat_close(c);
        return cli_error("%s", e.msg);
    }
    c->sampler = lm_sampler_new(&c->sampling, c->model.hp.n_vocab);
    c->memo = tok_memo_new();
    if (!c->sampler || !c->memo || (o->system_prompt && chat_set_system(c, o->system_prompt))) {
        chat_close(c);
        return cli_error("out of memory");
    }
    return 0;
}

void chat_close(chat *c)
{
    chat_drop_from(c, 0);
    free(c->msgs);
    free(c->system);
    lm_sampler_free(c->sampler);
    tok_memo_free(c->memo);
    if (c->kv.lm)
        kv_free(&c->kv);
    tok_free(c->vocab);
    if (c->model.tensors)
        lm_model_close(&c->model);
    memset(c, 0, sizeof *c);
}

int chat_add(chat *c, int role, const char *text, size_t len)
{
    if (c->n_msgs == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        chat_message *m = realloc(c->msgs, (size_t)cap * sizeof *m);
        if (!m)
            return -1;
        c->msgs = m;
        c->cap = cap;
    }
    char *t = malloc(len + 1);
    if (!t)
        return -1;
    memcpy(t, text, len);
    t[len] = 0;
    c->msgs[c->n_msgs++] = (chat_message){role, t};
    return 0;
}

void chat_drop_from(chat *c, int index)
{
    while (c->n_msgs > index)
        free(c->msgs[--c->n_msgs].text);
}

int chat_set_system(chat *c, const char *text)
{
    char *s = text && *text ? strdup(text) : NULL;
    if (text && *text && !s)
        return -1;
    free(c->system);
    c->system = s;
    return 0;
}

void chat_reset(chat *c)
{
    chat_drop_from(c, 0);
    kv_reset(&c->kv);
}

/* Renders and tokenizes the conversation with the generation prompt (and a next user message, if any). */
static int render_with(chat *c, const char *next, int32_t **ids, int *n, lm_err *e)
{
    chat_msg *m = malloc(((size_t)c->n_msgs + 2) * sizeof *m);
    if (!m)
        return lm_seterr(e, "out of memory"), -1;
    int k = 0;
    if (c->system)
        m[k++] = (chat_msg){"system", c->system};
    for (int i = 0; i < c->n_msgs; i++)
        m[k++] = (chat_msg){role_name(c->msgs[i].role), c->msgs[i].text};
    if (next)
        m[k++] = (chat_msg){"user", next};
    size_t len;
    char *text = tmpl_render(c->family, m, k, 1, &len);
    free(m);
    if (!text)
        return lm_seterr(e, "out of memory"), -1;
    int rc = tok_encode_memo(c->vocab, c->memo, text, len, 1, c->family != TMPL_RAW, ids, n, e);
    free(text);
    return rc;
}

/* Room kept free for the reply when deciding whether a prompt fits. */
static int reply_room(const chat *c)
{
    int cap = c->kv.n_ctx / 4 > 0 ? c->kv.n_ctx / 4 : 1;
    if (c->n_predict > 0 && c->n_predict < cap)
        return c->n_predict;
    return cap;
}

/* Drops the oldest whole turn (a user message and what follows up to the next one). */
static int drop_oldest_turn(chat *c)
{
    int end = 1;
    while (end < c->n_msgs && c->msgs[end].role != ROLE_USER)
        end++;
    if (end >= c->n_msgs)
        return 0; /* only the newest turn is left */
    for (int i = 0; i < end; i++)
        free(c->msgs[i].text);
    memmove(c->msgs, c->msgs + end, (size_t)(c->n_msgs - end) * sizeof *c->msgs);
    c->n_msgs -= end;
    return end;
}

/* Tokens of a prompt that fits, shifting old turns out if allowed. */
static int fitting_prompt(chat *c, int32_t **ids, int *n, lm_err *e)
{
    for (;;) {
        if (render_with(c, NULL, ids, n, e))
            return -1;
        if (*n + reply_room(c) <= c->kv.n_ctx)
            return 0;
        int p = kv_common_prefix(&c->kv, *ids, *n), room = reply_room(c);
        if (!c->context_shift) {
            lm_seterr(e, "KV cache overflow: n_past=%d + n_tokens=%d > n_ctx=%d (%d prompt tokens + %d reserved for the reply)",
                      p, *n - p + room, c->kv.n_ctx, *n - p, room);
            free(*ids);
            return -1;
        }
        int dropped = drop_oldest_turn(c);
        if (!dropped) {
            if (*n < c->kv.n_ctx)
                return 0; /* the newest turn alone: run it with what room is left */
            lm_seterr(e, "message too long: %d tokens do not fit n_ctx=%d", *n, c->kv.n_ctx);
            free(*ids);
            return -1;
        }
        fprintf(stderr, "kvchat: context full: dropped the oldest turn (%d messages) to fit n_ctx=%d\n",
                dropped, c->kv.n_ctx);
        free(*ids);
    }
}

/* The reply so far and what of it has been shown. */
typedef struct reply {
    char *s;
    size_t n, cap, shown;
    int stopped;
} reply;

/* Longest suffix of r that is a proper prefix of a stop string. */
static size_t stop_prefix_held(const reply *r, const char *const *stops)
{
    size_t held = 0;
    for (int i = 0; stops[i]; i++) {
        size_t sl = strlen(stops[i]);
        for (size_t k = sl - 1; k > held; k--)
            if (k <= r->n && !memcmp(r->s + r->n - k, stops[i], k)) {
                held = k;
                break;
            }
    }
    return held;
}

/* Adds a piece; shows what can no longer turn into a stop string. */
static int reply_append(reply *r, const char *p, size_t len, const char *const *stops,
                        reply_sink *sink)
{
    if (r->n + len + 1 > r->cap) {
        size_t cap = (r->n + len + 1) * 2;
        char *s = realloc(r->s, cap);
        if (!s)
            return -1;
        r->s = s;
        r->cap = cap;
    }
    memcpy(r->s + r->n, p, len);
    r->n += len;
    r->s[r->n] = 0;
    for (int i = 0; stops[i]; i++) {
        const char *hit = memmem(r->s, r->n, stops[i], strlen(stops[i]));
        if (hit) {
            r->n = (size_t)(hit - r->s);
            r->s[r->n] = 0;
            r->stopped = 1;
        }
    }
    size_t upto = r->stopped ? r->n : r->n - stop_prefix_held(r, stops);
    upto = tok_utf8_complete(r->s, upto);
    if (upto > r->shown) {
        sink->write(sink->ud, r->s + r->shown, upto - r->shown);
        r->shown = upto;
    }
    return 0;
}

/* turn_t0: when the turn started (now_ms), for the time to first token */
static int generate(chat *c, double turn_t0, reply *r, reply_sink *sink, lm_err *e)
{
    const char *const *stops = tmpl_stops(c->family);
    double t0 = now_ms();
    int g = 0;
    while ((c->n_predict < 0 || g < c->n_predict) && !r->stopped && !*c->interrupt) {
        int32_t t = lm_sample(c->sampler, c->kv.logits, c->kv.tokens, c->kv.n_past);
        if (tok_is_eog(c->vocab, t))
            break;
        size_t len;
        const char *piece = tok_piece(c->vocab, t, 0, &len);
        if (g++ == 0)
            c->last.ttft_ms = now_ms() - turn_t0;
        if (reply_append(r, piece, len, stops, sink))
            return lm_seterr(e, "out of memory"), -1;
        if (r->stopped)
            break;
        if (c->kv.n_past >= c->kv.n_ctx) {
            fprintf(stderr, "\nkvchat: context full (n_ctx=%d): reply cut\n", c->kv.n_ctx);
            break;
        }
        if (kv_eval(&c->kv, &t, 1, NULL, c->interrupt, e))
            break; /* interrupted, or a bad token: the reply so far stands */
    }
    /* a reply cut short never ends inside a UTF-8 character; a stop-string
       prefix held back is shown now */
    r->n = tok_utf8_complete(r->s, r->n);
    if (r->n > r->shown)
        sink->write(sink->ud, r->s + r->shown, r->n - r->shown);
    double ms = now_ms() - t0;
    c->last.generated = g;
    c->last.gen_tps = ms > 0 ? g * 1000.0 / ms : 0;
    return 0;
}

int chat_reply(chat *c, reply_sink *sink, lm_err *e)
{
    int32_t *ids;
    int n;
    memset(&c->last, 0, sizeof c->last);
    double turn_t0 = now_ms();
    if (fitting_prompt(c, &ids, &n, e))
        return -1;
    double t0 = now_ms();
    int rc = kv_sync(&c->kv, ids, n, &c->last.reused, &c->last.decoded, c->interrupt, e);
    free(ids);
    if (rc)
        return -1;
    c->last.prompt = n;
    c->last.prefill_ms = now_ms() - t0;
    reply r = {0};
    rc = generate(c, turn_t0, &r, sink, e);
    if (!rc && chat_add(c, ROLE_ASSISTANT, r.s ? r.s : "", r.n)) {
        lm_seterr(e, "out of memory");
        rc = -1;
    }
    free(r.s);
    c->last.n_past = c->kv.n_past;
    c->turns += rc == 0;
    kv_prepare_ahead(&c->kv, KV_AHEAD); /* while the reply is read: the next prefill faults no pages */
    return rc;
}

/*
 * The start of the next turn is the same whatever the user writes: the end
 * of this turn and the template's header of the next user message
 * ("<|im_end|>\n<|im_start|>user\n").  It is what two renderings with
 * different one-letter messages share; decoded after a reply, while the
 * user reads it, the next turn's first token waits only for the message
 * and the generation prompt.  Should the real message's tokens begin
 * otherwise, kv_sync keeps the common prefix and decodes from there, as
 * for any other change.  Raw conversations have no such glue.
 */
void chat_prepare_next(chat *c)
{
    if (c->family == TMPL_RAW || *c->interrupt)
        return;
    int32_t *a = NULL, *b = NULL;
    int na = 0, nb = 0, p = 0, reused, decoded;
    lm_err e = {{0}};
    if (!render_with(c, "a", &a, &na, &e) && !render_with(c, "b", &b, &nb, &e)) {
        while (p < na && p < nb && a[p] == b[p])
            p++;
        if (p > kv_common_prefix(&c->kv, a, p) && p + reply_room(c) <= c->kv.n_ctx)
            kv_sync(&c->kv, a, p, &reused, &decoded, c->interrupt, &e); /* on failure the next turn decodes it */
    }
    free(a);
    free(b);
}
