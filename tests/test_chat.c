/*
 * tests/test_chat.c - the conversation as users drive it: piped messages
 * and -f scripts with --json, checked for what the persistent context
 * promises: each turn decodes only its delta, a long session's reply equals
 * a fresh replay's, /edit, /regen, /undo and /reset touch only what they
 * must, overflow never breaks the session, Ctrl-C stops a reply (under a
 * pseudo-terminal too), and the command grammar rejects what it should.
 */
#include "util.h"
#include "../cli/cli.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- helpers over --json output ---- */

static int json_int(const char *obj, const char *key)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(obj, k);
    ck_assert_msg(p != NULL, "no %s in %s", key, obj);
    return atoi(p + strlen(k));
}

/* The content string of a reply object, JSON-unescaped (BMP \u escapes). */
static char *json_content(const char *obj)
{
    const char *p = strstr(obj, "\"content\":\"");
    ck_assert(p);
    p += 11;
    char *out = malloc(3 * strlen(p) + 1), *o = out;
    for (; *p && *p != '"'; p++) {
        if (*p != '\\') {
            *o++ = *p;
            continue;
        }
        p++;
        const char *map = strchr("n\nt\tr\rb\bf\f", *p);
        if (map && *p != '\\' && *p != '"' && *p != '/') {
            *o++ = map[1];
        } else if (*p == 'u') {
            char hex[5] = {p[1], p[2], p[3], p[4], 0};
            unsigned cp = (unsigned)strtoul(hex, NULL, 16);
            p += 4;
            if (cp < 0x80) {
                *o++ = (char)cp;
            } else if (cp < 0x800) {
                *o++ = (char)(0xc0 | (cp >> 6)), *o++ = (char)(0x80 | (cp & 0x3f));
            } else {
                *o++ = (char)(0xe0 | (cp >> 12)), *o++ = (char)(0x80 | ((cp >> 6) & 0x3f));
                *o++ = (char)(0x80 | (cp & 0x3f));
            }
        } else {
            *o++ = *p;
        }
    }
    *o = 0;
    return out;
}

/* The k-th line (0-based) of text that starts with prefix. */
static char *nth_line(const char *text, const char *prefix, int k)
{
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (!strncmp(p, prefix, strlen(prefix)) && k-- == 0) {
            size_t n = strcspn(p, "\n");
            char *l = malloc(n + 1);
            memcpy(l, p, n);
            l[n] = 0;
            return l;
        }
    }
    return NULL;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; s && *s; s++)
        n += *s == '\n';
    return n;
}

static char *stories(void) { return shared_path("models/stories260K.gguf"); }

/* Runs kvchat with args and stdin; returns stdout (exit code in *rc). */
static char *chat_run(const char *model, const char *input, int *rc, const char *extra[])
{
    char *argv[40] = {(char *)kvchat_bin(), "-m", (char *)model, "--temp", "0", "--json"};
    int k = 6;
    for (int i = 0; extra && extra[i]; i++)
        argv[k++] = (char *)extra[i];
    argv[k] = NULL;
    char *out;
    *rc = run_cmd(argv, input, &out, NULL);
    return out;
}

START_TEST(test_delta_only)
{
    char *m = stories();
    const char *extra[] = {"-n", "24", NULL};
    int rc;
    char *out = chat_run(m, "Once upon a time\nOne day\nThe dog ran\nShe smiled\nThe end came\n", &rc, extra);
    ck_assert_int_eq(rc, 0);
    int prev_reused = -1, prev_past = 0;
    for (int t = 0; t < 5; t++) {
        char *r = nth_line(out, "{\"type\":\"reply\"", t);
        ck_assert_msg(r, "reply %d missing in %s", t, out);
        int P = json_int(r, "prompt"), R = json_int(r, "reused"), D = json_int(r, "decoded");
        ck_assert_int_eq(json_int(r, "turn"), t + 1);
        ck_assert_msg(R + D == P || R + D == P + 1, "turn %d: R %d + D %d vs P %d", t, R, D, P);
        if (t > 0) {
            ck_assert_msg(R > prev_reused, "reuse must grow: %d then %d", prev_reused, R);
            ck_assert_msg(D <= 12, "turn %d decoded %d tokens: more than the new message", t, D);
            ck_assert_msg(R >= prev_past - 4, "turn %d reused %d of %d cached", t, R, prev_past);
        }
        prev_reused = R;
        prev_past = json_int(r, "n_past");
        free(r);
    }
    free(out);
    free(m);
}
END_TEST

/* --stats: one line a turn whose counts add up and whose times are ordered. */
START_TEST(test_stats_line)
{
    char *m = stories();
    char *argv[] = {(char *)kvchat_bin(), "-m", m, "--temp", "0", "-n", "8", "-t", "1", "--stats", NULL};
    char *out, *err;
    ck_assert_int_eq(run_cmd(argv, "Once upon a time\nOne day\n", &out, &err), 0);
    const char *p = err;
    for (int t = 0; t < 2; t++) {
        p = strstr(p, "[stats] ");
        ck_assert_msg(p, "turn %d: no stats line in [%s]", t, err);
        int P, R, D, G, N;
        double pre, ttft, tps;
        ck_assert_int_eq(sscanf(p, "[stats] prompt=%d reused=%d decoded=%d generated=%d n_past=%d "
                                   "prefill_ms=%lf ttft_ms=%lf gen_tps=%lf",
                                &P, &R, &D, &G, &N, &pre, &ttft, &tps), 8);
        ck_assert_int_eq(R + D, P);
        ck_assert_int_eq(N, P + G);
        ck_assert_int_eq(G, 8);
        ck_assert_msg(pre >= 0 && ttft >= pre && tps > 0, "times: prefill %g ttft %g tps %g", pre, ttft, tps);
        ck_assert(t == 0 ? R == 0 : R > 0);
        p++;
    }
    free(out), free(err), free(m);
}
END_TEST

/* Adds "/add ROLE TEXT" with TEXT escaped for the command's \n, \t, \\ rules. */
static void add_line(char *dst, const char *role, const char *text)
{
    strcat(dst, "/add ");
    strcat(dst, role);
    strcat(dst, " ");
    char *o = dst + strlen(dst);
    for (const char *p = text; *p; p++) {
        if (*p == '\n') *o++ = '\\', *o++ = 'n';
        else if (*p == '\t') *o++ = '\\', *o++ = 't';
        else if (*p == '\r') *o++ = '\\', *o++ = 'r';
        else if (*p == '\\') *o++ = '\\', *o++ = '\\';
        else *o++ = *p;
    }
    *o++ = '\n';
    *o = 0;
}

/* Turn k of a long session equals a fresh process that replays 1..k-1 with /add. */
static void check_replay(const char *model, const char *const *msgs, int n, const char *extra[])
{
    char input[4096] = "";
    for (int i = 0; i < n; i++)
        strcat(strcat(input, msgs[i]), "\n");
    int rc;
    char *out = chat_run(model, input, &rc, extra);
    ck_assert_int_eq(rc, 0);
    char *replay = calloc(1, 1 << 16);
    for (int i = 0; i < n - 1; i++) {
        char *r = nth_line(out, "{\"type\":\"reply\"", i);
        ck_assert(r);
        char *content = json_content(r);
        add_line(replay, "user", msgs[i]);
        add_line(replay, "assistant", content);
        free(content);
        free(r);
    }
    strcat(strcat(replay, msgs[n - 1]), "\n");
    char *fresh = chat_run(model, replay, &rc, extra);
    ck_assert_int_eq(rc, 0);
    char *a = nth_line(out, "{\"type\":\"reply\"", n - 1), *b = nth_line(fresh, "{\"type\":\"reply\"", 0);
    ck_assert(a && b);
    char *ca = json_content(a), *cb = json_content(b);
    ck_assert_msg(!strcmp(ca, cb), "session reply [%s] != replay reply [%s]", ca, cb);
    free(ca), free(cb), free(a), free(b), free(out), free(fresh), free(replay);
}

START_TEST(test_replay_raw)
{
    char *m = stories();
    const char *msgs[] = {"Once upon a time", "One day", "The cat was sad", "Then the sun came out"};
    const char *extra[] = {"-n", "20", NULL};
    check_replay(m, msgs, 4, extra);
    free(m);
}
END_TEST

START_TEST(test_replay_templates)
{
    static const char *const vocabs[][2] = {{"vocab/ggml-vocab-qwen2.gguf", "q.gguf"},
                                            {"vocab/ggml-vocab-llama3.gguf", "l3.gguf"},
                                            {"vocab/ggml-vocab-gemma3.gguf", "g3.gguf"}};
    const char *msgs[] = {"Hello there", "What is 2+2?", "Tell me more\nplease"};
    for (int v = 0; v < 3; v++) {
        char *m = model_with_vocab(vocabs[v][0], vocabs[v][1]);
        ck_assert(m);
        const char *extra[] = {"-n", "6", "-sys", "Be brief.", NULL};
        check_replay(m, msgs, 3, extra);
        unlink(m);
        free(m);
    }
}
END_TEST

/*
 * After a reply the next turn's opening (the end of this turn and the
 * header of the next user message) is already decoded: a turn reuses more
 * than the previous turn left in the cache and decodes only its message
 * and the generation prompt; /regen after that still gives the same reply.
 */
START_TEST(test_next_turn_opening)
{
    char *m = model_with_vocab("vocab/ggml-vocab-qwen2.gguf", "q2.gguf");
    ck_assert(m);
    const char *extra[] = {"-n", "6", NULL};
    int rc;
    char *out = chat_run(m, "Hello there\nWhat is 2+2?\n/regen\nTell me more\n", &rc, extra);
    ck_assert_int_eq(rc, 0);
    int prev_past = 0;
    for (int t = 0; t < 4; t++) {
        char *r = nth_line(out, "{\"type\":\"reply\"", t);
        ck_assert_msg(r, "reply %d missing in %s", t, out);
        int R = json_int(r, "reused"), D = json_int(r, "decoded");
        if (t == 1 || t == 3) {
            ck_assert_msg(R > prev_past, "turn %d reused %d of the %d cached before the opening", t, R, prev_past);
            ck_assert_msg(D <= 12, "turn %d decoded %d tokens: more than its message", t, D);
        }
        prev_past = json_int(r, "n_past");
        free(r);
    }
    char *a = nth_line(out, "{\"type\":\"reply\"", 1), *b = nth_line(out, "{\"type\":\"reply\"", 2);
    char *ca = json_content(a), *cb = json_content(b);
    ck_assert_msg(!strcmp(ca, cb), "reply [%s] != regenerated [%s]", ca, cb);
    free(ca), free(cb), free(a), free(b), free(out);
    unlink(m);
    free(m);
}
END_TEST

START_TEST(test_edit_regen_undo_reset)
{
    char *m = stories();
    const char *extra[] = {"-n", "16", NULL};
    int rc;
    const char *in = "Once upon a time\nOne day\nThe dog ran\n/regen\n/edit 1 Once upon a hill\n"
                     "The cat sat\n/undo\nA bird flew\n/reset\n/pos\n";
    char *out = chat_run(m, in, &rc, extra);
    ck_assert_int_eq(rc, 0);
    char *t3 = nth_line(out, "{\"type\":\"reply\"", 2), *regen = nth_line(out, "{\"type\":\"reply\"", 3);
    char *c3 = json_content(t3), *cr = json_content(regen);
    ck_assert_str_eq(c3, cr); /* temp 0: the same reply again */
    ck_assert_int_le(json_int(regen, "decoded"), 1);
    char *edit = nth_line(out, "{\"type\":\"reply\"", 4);
    ck_assert_int_le(json_int(edit, "reused"), 4); /* BOS and "Once upon a" */
    ck_assert_int_ge(json_int(edit, "reused"), 1);
    char *cat = nth_line(out, "{\"type\":\"reply\"", 5), *bird = nth_line(out, "{\"type\":\"reply\"", 6);
    /* after /undo the new turn reuses everything before the undone one */
    ck_assert_int_ge(json_int(bird, "reused"), json_int(edit, "n_past") - 2);
    ck_assert_msg(strstr(out, "\"text\":\"n_past=0 n_ctx="), "%s", out);
    free(c3), free(cr), free(t3), free(regen), free(edit), free(cat), free(bird), free(out), free(m);
}
END_TEST

START_TEST(test_overflow)
{
    char *m = stories();
    int rc;
    const char *shift[] = {"-n", "20", "-c", "48", NULL};
    const char *in = "Once upon a time there was a girl\nShe had a dog named Max\nThey went to the park\n/pos\n";
    char *out = chat_run(m, in, &rc, shift);
    ck_assert_int_eq(rc, 0);
    char *third = nth_line(out, "{\"type\":\"reply\"", 2);
    ck_assert_msg(third != NULL, "session did not go on: %s", out);
    free(third);
    free(out);
    const char *strict[] = {"-n", "20", "-c", "48", "--no-context-shift", NULL};
    out = chat_run(m, "Once upon a time there was a girl\nShe had a dog named Max\n/reset\n/pos\nHello\n", &rc, strict);
    ck_assert_int_eq(rc, 1);
    ck_assert_msg(strstr(out, "KV cache overflow: n_past="), "%s", out);
    ck_assert_msg(strstr(out, "\"text\":\"n_past=0 n_ctx=48"), "%s", out);
    char *last = nth_line(out, "{\"type\":\"reply\"", 1);
    ck_assert_msg(last != NULL, "no reply after /reset: %s", out); /* still usable */
    free(last), free(out), free(m);
}
END_TEST

START_TEST(test_plain_pipe_and_script)
{
    char *m = stories(), *out;
    char *argv[] = {(char *)kvchat_bin(), "-m", m, "--temp", "0", "-n", "32", NULL};
    ck_assert_int_eq(run_cmd(argv, "Once upon a time\nOne day\n", &out, NULL), 0);
    int lines = 0;
    for (char *p = out; *p; p++)
        lines += *p == '\n';
    ck_assert_msg(lines >= 2 && out[strlen(out) - 1] == '\n', "[%s]", out);
    free(out);
    char *script = tmp_path("s.txt");
    const char *text = "# comment\n/add user Once upon a time\n/add assistant , there was\n\"\"\"\nA dog\nran\n\"\"\"\n/pos\n/nope\n/pos\n";
    write_file(script, text, strlen(text));
    char *err;
    char *sargv[] = {(char *)kvchat_bin(), "-m", m, "--temp", "0", "-n", "8", "-f", script, NULL};
    ck_assert_int_eq(run_cmd(sargv, NULL, &out, &err), 1);
    ck_assert_msg(strstr(err, "s.txt:9: unknown command '/nope'"), "%s", err);
    ck_assert_msg(strstr(out, "n_past="), "%s", out);
    ck_assert_msg(!strstr(strstr(out, "n_past=") + 1, "n_past="), "ran past the error: %s", out);
    free(out), free(err), free(script), free(m);
}
END_TEST

/* SIGINT mid-reply: the partial reply stays, and the next turn equals a fresh replay. */
START_TEST(test_interrupt_then_replay)
{
    char *m = model_with_vocab("vocab/ggml-vocab-qwen2.gguf", "qi.gguf");
    char *argv[] = {(char *)kvchat_bin(), "-m", m, "--temp", "0", "--json", "-n", "3000", "-c", "4096", NULL};
    child c;
    ck_assert(child_spawn(&c, argv, 0) == 0);
    child_write(&c, "Hello there\n");
    usleep(600 * 1000);
    kill(c.pid, SIGINT);
    char *buf = NULL;
    size_t len;
    ck_assert(child_read_until(&c, &buf, &len, "\n", 30000));
    int was_reply = strstr(buf, "\"type\":\"reply\"") != NULL;
    child_write(&c, "/set n_predict 40\nAnd then?\n"); /* a short second reply, also under ASan */
    int want_lines = 1 + was_reply; /* whole JSON lines: they arrive in pieces */
    for (int waited = 0; count_lines(buf) < want_lines; waited += 200) {
        ck_assert_msg(waited < 60000, "no reply to the second message");
        child_read_until(&c, &buf, &len, "\n\n\n\n", 200);
    }
    child_write(&c, "/quit\n");
    ck_assert_int_eq(child_wait(&c), 0);
    char replay[1 << 16] = "";
    if (was_reply) {
        char *first = nth_line(buf, "{\"type\":\"reply\"", 0), *content = json_content(first);
        ck_assert_int_lt(json_int(first, "generated"), 3000); /* it was stopped */
        add_line(replay, "user", "Hello there");
        add_line(replay, "assistant", content);
        free(first), free(content);
    }
    strcat(replay, "/set n_predict 40\nAnd then?\n");
    int rc;
    const char *extra[] = {"-n", "3000", "-c", "4096", NULL};
    char *fresh = chat_run(m, replay, &rc, extra);
    char *a = nth_line(buf, "{\"type\":\"reply\"", was_reply), *b = nth_line(fresh, "{\"type\":\"reply\"", 0);
    char *ca = json_content(a), *cb = json_content(b);
    ck_assert_msg(!strcmp(ca, cb), "after Ctrl-C the next reply differs from a replay");
    free(ca), free(cb), free(a), free(b), free(fresh), free(buf);
    unlink(m);
    free(m);
}
END_TEST

/*
 * Under a terminal: Ctrl-C stops the reply, the program stays, Ctrl-D
 * leaves.  With stop_first, Ctrl-S has stopped the terminal's output first,
 * so the reply's next write waits when the signal comes: that write failed
 * with EINTR (SIGINT has no SA_RESTART), and stdout's error then ended the
 * program ("stdout: write error") instead of the reply.
 */
static void terminal_ctrl_c(const char *name, int stop_first)
{
    char *m = model_with_vocab("vocab/ggml-vocab-qwen2.gguf", name);
    char *dir = tmp_path(stop_first ? "state_stopped" : "state");
    setenv("XDG_STATE_HOME", dir, 1);
    char *argv[] = {(char *)kvchat_bin(), "-m", m, "--temp", "0", "-n", "3000", "-c", "4096", NULL};
    child c;
    ck_assert(child_spawn(&c, argv, 1) == 0);
    char *buf = NULL;
    size_t len;
    ck_assert_msg(child_read_until(&c, &buf, &len, "> ", 20000), "no prompt: %s", buf);
    child_write(&c, "Hello\r");
    usleep(stop_first ? 500 * 1000 : 800 * 1000);
    if (stop_first) {
        child_write(&c, "\x13"); /* Ctrl-S: the terminal's output stops, the next write waits */
        usleep(500 * 1000);
    }
    child_write(&c, "\x03"); /* (after a Ctrl-S, the terminal's output goes on after the signal) */
    ck_assert_msg(child_read_until(&c, &buf, &len, "[interrupted]", 20000), "not stopped: %.300s",
                  buf + (len > 300 ? len - 300 : 0));
    child_write(&c, "/pos\r");
    ck_assert_msg(child_read_until(&c, &buf, &len, "messages=2", 20000), "no answer to /pos; the output ends: %s",
                  buf + (len > 400 ? len - 400 : 0));
    usleep(300 * 1000); /* back at the prompt */
    child_write(&c, "\x04");
    ck_assert_int_eq(child_wait(&c), 0);
    free(buf), free(dir);
    unlink(m);
    free(m);
}

START_TEST(test_terminal_ctrl_c)
{
    terminal_ctrl_c("qt.gguf", 0);
}
END_TEST

START_TEST(test_terminal_ctrl_c_in_write)
{
    terminal_ctrl_c("qw.gguf", 1);
}
END_TEST

START_TEST(test_command_grammar)
{
    command c;
    char err[256];
    ck_assert_int_eq(command_parse("/edit 3 new text", &c, err, sizeof err), 0);
    ck_assert_int_eq(c.kind, CMD_EDIT);
    ck_assert_int_eq(c.index, 3);
    ck_assert_str_eq(c.text, "new text");
    command_free(&c);
    ck_assert_int_eq(command_parse("/edit 2", &c, err, sizeof err), 0);
    ck_assert(!c.has_text);
    command_free(&c);
    ck_assert_int_eq(command_parse("/add assistant a\\nb\\tc\\\\d\\x", &c, err, sizeof err), 0);
    ck_assert_int_eq(c.role, ROLE_ASSISTANT);
    ck_assert_str_eq(c.text, "a\nb\tc\\d\\x");
    command_free(&c);
    ck_assert_int_eq(command_parse("/set temp 0.5", &c, err, sizeof err), 0);
    ck_assert_str_eq(c.name, "temp");
    ck_assert_str_eq(c.value, "0.5");
    command_free(&c);
    ck_assert_int_eq(command_parse("/set", &c, err, sizeof err), 0);
    command_free(&c);
    ck_assert_int_eq(command_parse("/bye", &c, err, sizeof err), 0);
    ck_assert_int_eq(c.kind, CMD_QUIT);
    command_free(&c);
    static const char *const bad[] = {"/edit", "/edit x", "/edit -1 t", "/add robot hi", "/add",
                                      "/pos now", "/set temp", "/set a b c", "/frob", "/", NULL};
    for (int i = 0; bad[i]; i++) {
        err[0] = 0;
        ck_assert_msg(command_parse(bad[i], &c, err, sizeof err) == -1, "accepted %s", bad[i]);
        ck_assert_msg(err[0], "no message for %s", bad[i]);
        command_free(&c);
    }
}
END_TEST

TCase *tcase_chat(void)
{
    TCase *tc = tcase_create("chat");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_command_grammar);
    tcase_add_test(tc, test_delta_only);
    tcase_add_test(tc, test_replay_raw);
    tcase_add_test(tc, test_replay_templates);
    tcase_add_test(tc, test_next_turn_opening);
    tcase_add_test(tc, test_edit_regen_undo_reset);
    tcase_add_test(tc, test_overflow);
    tcase_add_test(tc, test_plain_pipe_and_script);
    tcase_add_test(tc, test_interrupt_then_replay);
    tcase_add_test(tc, test_terminal_ctrl_c);
    tcase_add_test(tc, test_terminal_ctrl_c_in_write);
    tcase_add_test(tc, test_stats_line);
    return tc;
}
