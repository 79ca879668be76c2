/*
 * tests/test_cli.c - the command line as a user meets it: tokenize keeps
 * every byte (no newline stripped), --no-bos and --special do what they
 * say, bad option values are named, --help and --version exit 0.
 */
#include "util.h"

#include <sys/wait.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int kv(char **argv_tail, const char *in, char **out, char **err)
{
    char *argv[32] = {(char *)kvchat_bin()};
    int i = 0;
    while (argv_tail[i] && i < 30) {
        argv[i + 1] = argv_tail[i];
        i++;
    }
    argv[i + 1] = NULL;
    return run_cmd(argv, in, out, err);
}

START_TEST(test_tokenize_bytes_exactly)
{
    char *vocab = shared_path("vocab/ggml-vocab-llama3.gguf"), *out, *out2;
    char *a[] = {"tokenize", "-m", vocab, "--no-bos", NULL};
    ck_assert_int_eq(kv(a, "Hello world\n", &out, NULL), 0);
    ck_assert_int_eq(kv(a, "Hello world", &out2, NULL), 0);
    ck_assert_str_ne(out, out2); /* the trailing newline is a token */
    ck_assert_str_eq(out2, "9906 1917\n");
    free(out), free(out2);
    char *b[] = {"tokenize", "-m", vocab, NULL};
    ck_assert_int_eq(kv(b, "Hello world", &out, NULL), 0);
    ck_assert_str_eq(out, "128000 9906 1917\n");
    free(out);
    char *c[] = {"tokenize", "-m", vocab, "--no-bos", "--special", NULL};
    ck_assert_int_eq(kv(c, "<|eot_id|>", &out, NULL), 0);
    ck_assert_str_eq(out, "128009\n");
    free(out);
    free(vocab);
}
END_TEST

/*
 * kvchat bench: --csv gives one pp and one tg row with positive rates; the
 * table names the model and the tests, and says what share of the
 * machine's read bandwidth generation used and how fast each thread's
 * core ran before and after; lists of -p and -t give every
 * combination in order, and a malformed list is refused.
 */
START_TEST(test_bench)
{
    char *model = shared_path("models/stories260K.gguf"), *out;
    char *a[] = {"bench", "-m", model, "-p", "16", "-n", "8", "-r", "2", "-t", "2", "--csv", NULL};
    ck_assert_int_eq(kv(a, NULL, &out, NULL), 0);
    double pp, pp_sd, tg, tg_sd;
    int used = 0;
    ck_assert_msg(sscanf(out, "pp16,%lf,%lf\ntg8,%lf,%lf\n%n", &pp, &pp_sd, &tg, &tg_sd, &used) == 4 &&
                      out[used] == 0,
                  "%s", out);
    ck_assert(pp > 0 && tg > 0 && pp_sd >= 0 && tg_sd >= 0);
    free(out);
    char *b[] = {"bench", "-m", model, "-p", "8", "-n", "8", "-r", "1", "-t", "2", NULL};
    ck_assert_int_eq(kv(b, NULL, &out, NULL), 0);
    ck_assert_msg(strstr(out, "| stories260K.gguf") && strstr(out, "pp8 |") && strstr(out, "tg8 |") &&
                      strstr(out, "of what this machine read beside it"),
                  "%s", out);
    /* the share run's figures: what it read, its share, the machine's readings beside its pieces */
    double gbs, pct, lo, hi;
    const char *note = strstr(out, "cache per token: ");
    ck_assert_msg(note && sscanf(note, "cache per token: %lf GB/s, %lf%% of what this machine read beside it "
                                       "(%lf-%lf GB/s",
                                 &gbs, &pct, &lo, &hi) == 4 &&
                      gbs > 0 && pct > 0 && lo > 0 && lo <= hi,
                  "%s", out);
    /* each thread's core read before and after the tests: additions a second, about a clock */
    double core[4];
    const char *cores = strstr(out, "something else): ");
    ck_assert_msg(cores && sscanf(cores, "something else): %lf, %lf billion before the tests, %lf, %lf after",
                                  &core[0], &core[1], &core[2], &core[3]) == 4,
                  "%s", out);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(core[i] > 0.05 && core[i] < 50, "core reading %g\n%s", core[i], out);
    free(out);
    /* lists, as llama-bench takes them: every test for each thread count, in order */
    char *c[] = {"bench", "-m", model, "-p", "8,16", "-n", "4", "-r", "1", "-t", "1,2", "--csv", NULL};
    ck_assert_int_eq(kv(c, NULL, &out, NULL), 0);
    double v[12];
    used = 0;
    ck_assert_msg(sscanf(out, "pp8,%lf,%lf\npp16,%lf,%lf\ntg4,%lf,%lf\npp8,%lf,%lf\npp16,%lf,%lf\ntg4,%lf,%lf\n%n",
                         &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10], &v[11],
                         &used) == 12 && out[used] == 0,
                  "%s", out);
    free(out);
    char *d[] = {"bench", "-m", model, "-p", "8,,16", NULL}, *err;
    ck_assert_int_eq(kv(d, NULL, NULL, &err), 2);
    ck_assert_msg(strstr(err, "invalid value '8,,16' for -p"), "%s", err);
    free(err);
    free(model);
}
END_TEST

/*
 * kvchat bench -d: every test again after that many tokens in the cache,
 * named as llama-bench names them; generation's note counts the cache it
 * reads (stories260K: 5 layers x 4 KV heads x (8 + 8) floats = 1280 bytes
 * a position; at depth 64, tg4 reads 64 + 2.5 positions on average: 0.08
 * MiB).  -d belongs to bench alone.
 */
START_TEST(test_bench_depth)
{
    char *model = shared_path("models/stories260K.gguf"), *out, *err;
    char *a[] = {"bench", "-m", model, "-p", "8", "-n", "4", "-r", "1", "-t", "2", "-d", "0,64", "--csv", NULL};
    ck_assert_int_eq(kv(a, NULL, &out, NULL), 0);
    double v[8];
    int used = 0;
    ck_assert_msg(sscanf(out, "pp8,%lf,%lf\ntg4,%lf,%lf\npp8 @ d64,%lf,%lf\ntg4 @ d64,%lf,%lf\n%n", &v[0], &v[1],
                         &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &used) == 8 && out[used] == 0,
                  "%s", out);
    ck_assert(v[4] > 0 && v[6] > 0);
    free(out);
    char *b[] = {"bench", "-m", model, "-p", "0", "-n", "4", "-r", "1", "-t", "2", "-d", "64", NULL};
    ck_assert_int_eq(kv(b, NULL, &out, NULL), 0);
    ck_assert_msg(strstr(out, "tg4 @ d64 |") &&
                      strstr(out, "tg4 @ d64 with 2 threads reads 1.0 MiB of weights and 0.08 MiB of cache"),
                  "%s", out);
    free(out);
    char *c[] = {"complete", "-m", model, "-p", "x", "-d", "4", NULL};
    ck_assert_int_eq(kv(c, NULL, NULL, &err), 2);
    ck_assert_msg(strstr(err, "option -d is for kvchat bench only"), "%s", err);
    free(err);
    free(model);
}
END_TEST

START_TEST(test_bad_arguments)
{
    char *err;
    char *a[] = {"complete", "-m", "x.gguf", "-n", "ten", NULL};
    ck_assert_int_eq(kv(a, NULL, NULL, &err), 2);
    ck_assert_msg(strstr(err, "invalid value 'ten' for -n"), "%s", err);
    free(err);
    char *b[] = {"complete", "--bogus", NULL};
    ck_assert_int_eq(kv(b, NULL, NULL, &err), 2);
    ck_assert_msg(strstr(err, "unknown argument '--bogus'"), "%s", err);
    free(err);
    char *c[] = {"info", "-m", NULL};
    ck_assert_int_eq(kv(c, NULL, NULL, &err), 2);
    ck_assert_msg(strstr(err, "-m needs a value"), "%s", err);
    free(err);
    char *d[] = {"complete", "--temp", "nan", NULL};
    ck_assert_int_eq(kv(d, NULL, NULL, &err), 2);
    free(err);
}
END_TEST

START_TEST(test_help_version)
{
    char *out;
    char *a[] = {"--help", NULL};
    ck_assert_int_eq(kv(a, NULL, &out, NULL), 0);
    ck_assert(strstr(out, "usage: kvchat"));
    free(out);
    char *b[] = {"logits", "--version", NULL};
    ck_assert_int_eq(kv(b, NULL, &out, NULL), 0);
    ck_assert(!strncmp(out, "kvchat ", 7));
    free(out);
}
END_TEST

START_TEST(test_logits_bad_ids)
{
    char *mp = shared_path("models/stories260K.gguf"), *ids = tmp_path("bad.ids"), *err;
    write_file(ids, "1 2 99999", 9);
    char *a[] = {"logits", "-m", mp, "--ids-file", ids, NULL};
    ck_assert_int_eq(kv(a, NULL, NULL, &err), 1);
    ck_assert_msg(strstr(err, "token 3") && strstr(err, "99999"), "%s", err);
    free(err), free(mp), free(ids);
}
END_TEST

/*
 * The official judge, tools/tokcheck.py, on every vocab: the CLI path end to
 * end.  Under the sanitizers on one SentencePiece and one BPE vocabulary:
 * the judge starts a process for each string (a third of the sanitizer
 * suite's time for all six), and test_vocab_vectors already puts every
 * string of every vocabulary through the tokenizer there.
 */
#if defined(__SANITIZE_ADDRESS__)
#define TOKCHECK_VOCABS 2
#else
#define TOKCHECK_VOCABS 6
#endif
START_TEST(test_tokcheck_judge)
{
    char *dir = shared_path("vocab"), *judge = shared_path("tools/tokcheck.py");
    static const char *const names[] = {"llama-spm", "gpt-2", "llama3", "qwen2", "phi-3", "gemma3"};
    for (int i = 0; i < TOKCHECK_VOCABS; i++) {
        char v[512], in[520], out[520];
        snprintf(v, sizeof v, "%s/ggml-vocab-%s.gguf", dir, names[i]);
        snprintf(in, sizeof in, "%s.inp", v);
        snprintf(out, sizeof out, "%s.out", v);
        char *argv[] = {"/usr/bin/python3", judge, (char *)kvchat_bin(), v, in, out, NULL}, *o, *e;
        int rc = run_cmd(argv, NULL, &o, &e);
        ck_assert_msg(rc == 0, "tokcheck %s: %s%s", names[i], o, e);
        free(o), free(e);
    }
    free(dir), free(judge);
}
END_TEST

/* The manual renders without a groff warning and names every option --help lists. */
START_TEST(test_man_page_covers_help)
{
    char *argv[] = {"/usr/bin/groff", "-ww", "-man", "-Tascii", "-P-cbou", "man/kvchat.1", NULL}, *man, *err;
    ck_assert_int_eq(run_cmd(argv, NULL, &man, &err), 0);
    ck_assert_msg(err[0] == 0, "groff warnings: %s", err);
    char *help, *ha[] = {"--help", NULL};
    ck_assert_int_eq(kv(ha, NULL, &help, NULL), 0);
    int checked = 0;
    for (char *p = help; *p; p++) {
        if (*p != '-' || (p > help && p[-1] != ' ' && p[-1] != ','))
            continue;
        char opt[40];
        size_t n = strspn(p, "-abcdefghijklmnopqrstuvwxyz");
        if (n < 2 || n >= sizeof opt)
            continue;
        memcpy(opt, p, n);
        opt[n] = 0;
        ck_assert_msg(strstr(man, opt) != NULL, "the manual does not mention %s", opt);
        checked++;
        p += n - 1;
    }
    ck_assert_int_gt(checked, 30);
    static const char *const cmds[] = {"/help", "/quit", "/pos", "/reset", "/history", "/edit", "/regen",
                                       "/undo", "/add", "/system", "/set", "/stats", "NO_COLOR",
                                       "XDG_STATE_HOME", "EXIT STATUS", "EXAMPLES", NULL};
    for (int i = 0; cmds[i]; i++)
        ck_assert_msg(strstr(man, cmds[i]) != NULL, "the manual does not mention %s", cmds[i]);
    free(man), free(err), free(help);
}
END_TEST

/* A full disk is an error with a message; a closed pipe ends the run by SIGPIPE. */
START_TEST(test_write_failures)
{
    char *mp = shared_path("models/stories260K.gguf");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s complete -m %s -p 'Once upon a time' -n 20 > /dev/full 2> /dev/null",
             kvchat_bin(), mp);
    int st = system(cmd);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1, "full disk: status %d", st);
    snprintf(cmd, sizeof cmd, "printf 'Once upon a time\\nOne day\\n' | %s -m %s -n 200 | head -c 3 > /dev/null;"
             " exit ${PIPESTATUS[1]}", kvchat_bin(), mp);
    char *argv[] = {"/bin/bash", "-c", cmd, NULL};
    int rc = run_cmd(argv, NULL, NULL, NULL);
    ck_assert_msg(rc == 0 || rc == 141, "closed pipe: status %d", rc); /* never a crash */
    free(mp);
}
END_TEST

TCase *tcase_cli(void)
{
    TCase *tc = tcase_create("cli");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_tokcheck_judge);
    tcase_add_test(tc, test_tokenize_bytes_exactly);
    tcase_add_test(tc, test_bad_arguments);
    tcase_add_test(tc, test_help_version);
    tcase_add_test(tc, test_logits_bad_ids);
    tcase_add_test(tc, test_man_page_covers_help);
    tcase_add_test(tc, test_write_failures);
    tcase_add_test(tc, test_bench);
    tcase_add_test(tc, test_bench_depth);
    return tc;
}
