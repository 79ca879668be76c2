/*
 * cli/args.c - command-line parsing.  Option names follow llama-cli (-m,
 * -p, -f, -n, -c, -t, -s, --temp, --top-k, ...) so people can carry their
 * habits over.  Every value is checked: a bad number is an error naming the
 * option and the value, never a silent zero.
 */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int cli_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kvchat: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return EXIT_ERR;
}

void cli_usage(FILE *f)
{
    fputs("usage: kvchat -m MODEL [options]            chat (terminal, piped stdin, or -f SCRIPT)\n"
          "       kvchat COMMAND -m MODEL [options]\n"
          "\n"
          "commands:\n"
          "  (none)      chat: -p TEXT answers one message; -f SCRIPT runs a script\n"
          "  complete    complete a prompt (-p TEXT or -f FILE), no chat template\n"
          "  info        describe a model file\n"
          "  tokenize    print the token ids of a file or of stdin\n"
          "  logits      write the logits of a token sequence\n"
          "  bench       measure prompt processing and generation speed\n"
          "\n"
          "options:\n"
          "  -m, --model FILE        GGUF model file\n"
          "  -p, --prompt TEXT       prompt text\n"
          "  -f, --file FILE         chat: a script of messages and commands;\n"
          "                          complete, tokenize: read the text from FILE\n"
          "  -n, --n-predict N       tokens to generate per reply (default -1: until the end)\n"
          "  -sys, --system-prompt TEXT  chat: the system prompt\n"
          "      --chat-template NAME    chat: use this template family (see kvchat info)\n"
          "      --no-context-shift  chat: fail instead of dropping the oldest turns when full\n"
          "      --stats             chat: print a statistics line after every reply\n"
          "      --json              chat: one JSON object per line on stdout\n"
          "  -c, --ctx-size N        context size (default: the model's, at most 4096)\n"
          "  -t, --threads N         threads (default: physical cores)\n"
          "  -s, --seed N            random seed (default: random)\n"
          "      --temp T            temperature (default 0.8; 0 = greedy)\n"
          "      --top-k N           top-k (default 40; 0 = off)\n"
          "      --top-p P           top-p (default 0.95; 1 = off)\n"
          "      --min-p P           min-p (default 0.05; 0 = off)\n"
          "      --repeat-penalty F  repeat penalty (default 1.0 = off)\n"
          "      --repeat-last-n N   tokens the penalty looks back (default 64)\n"
          "      --kv-type TYPE      KV cache type: f32 (default) or f16\n"
          "      --echo              complete: print the prompt first\n"
          "      --no-bos            tokenize: add no BOS/EOS\n"
          "      --special           tokenize: parse control-token text\n"
          "      --ids-file FILE     logits: token ids, whitespace separated\n"
          "  -o, --output FILE       logits: output file (float32 rows; default stdout)\n"
          "      --sequential        logits: one token per evaluation\n"
          "  -p N, -n N, -r N        bench: prompt tokens (512), generated tokens (128), repetitions (3);\n"
          "  -d, --n-depth N         bench: tokens already in the cache when each test starts (0)\n"
          "                          -p, -n, -t and -d take lists (-p 512,16 -t 1,2), every combination run\n"
          "      --csv               bench: print test,tokens_per_s,stddev rows\n"
          "  -h, --help              this help\n"
          "      --version           print the version\n",
          f);
}

static int parse_int(const char *opt, const char *s, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return cli_error("invalid value '%s' for %s (expected an integer from %ld to %ld)", s, opt,
                         lo, hi);
    *out = (int)v;
    return 0;
}

static int parse_float(const char *opt, const char *s, float lo, float hi, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
        return cli_error("invalid value '%s' for %s (expected a number from %g to %g)", s, opt, lo,
                         hi);
    *out = v;
    return 0;
}

static int parse_seed(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-')
        return cli_error("invalid value '%s' for --seed (expected a non-negative integer)", s);
    *out = v;
    return 0;
}

/* A comma-separated list of integers in [lo, hi], as llama-bench takes them (-p 512,128). */
static int parse_int_list(const char *opt, const char *s, int lo, int hi, int *out, int *n)
{
    char item[32];
    *n = 0;
    for (const char *p = s;; p++) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (*n == CLI_BENCH_LIST || len == 0 || len >= sizeof item)
            return cli_error("invalid value '%s' for %s (expected up to %d integers from %d to %d, "
                             "separated by commas)", s, opt, CLI_BENCH_LIST, lo, hi);
        memcpy(item, p, len);
        item[len] = 0;
        if (parse_int(opt, item, lo, hi, &out[(*n)++]))
            return -1;
        if (!end)
            return 0;
        p = end;
    }
}

static int is(const char *a, const char *s1, const char *s2)
{
    return !strcmp(a, s1) || (s2 && !strcmp(a, s2));
}

static const char *const VALUE_OPTS[] = {
    "-m", "--model", "-p", "--prompt", "-f", "--file", "--ids-file", "-o", "--output", "-n",
    "--n-predict", "-c", "--ctx-size", "-t", "--threads", "-s", "--seed", "--temp", "--top-k",
    "--top-p", "--min-p", "--repeat-penalty", "--repeat-last-n", "--kv-type", "-sys",
    "--system-prompt", "--chat-template", "-r", "--repetitions", "-d", "--n-depth", NULL};

static int takes_value(const char *a)
{
    for (int k = 0; VALUE_OPTS[k]; k++)
        if (!strcmp(a, VALUE_OPTS[k]))
            return 1;
    return 0;
}

static const char *const COMMANDS[] = {"complete", "info", "tokenize", "logits", "bench", NULL};

/* Options that take a value; returns 1 if a was one of them, -1 on error. */
static int value_opt(cli_opts *o, const char *a, const char *v)
{
    lm_sampling *s = &o->sampling;
    const int bench = o->cmd && !strcmp(o->cmd, "bench");
    if (is(a, "-m", "--model")) o->model = v;
    else if (bench && is(a, "-p", "--prompt"))
        return parse_int_list(a, v, 0, 1 << 20, o->bench_p, &o->n_bench_p) ? -1 : 1;
    else if (bench && is(a, "-n", "--n-predict"))
        return parse_int_list(a, v, 0, 1 << 20, o->bench_n, &o->n_bench_n) ? -1 : 1;
    else if (bench && is(a, "-t", "--threads"))
        return parse_int_list(a, v, 1, 1024, o->bench_t, &o->n_bench_t) ? -1 : 1;
    else if (bench && is(a, "-d", "--n-depth"))
        return parse_int_list(a, v, 0, 1 << 20, o->bench_d, &o->n_bench_d) ? -1 : 1;
    else if (is(a, "-p", "--prompt")) o->prompt = v;
    else if (is(a, "-r", "--repetitions")) return parse_int(a, v, 1, 64, &o->bench_reps) ? -1 : 1;
    else if (is(a, "-f", "--file")) o->prompt_file = v;
    else if (is(a, "--ids-file", NULL)) o->ids_file = v;
    else if (is(a, "-sys", "--system-prompt")) o->system_prompt = v;
    else if (is(a, "--chat-template", NULL)) o->chat_template = v;
    else if (is(a, "-o", "--output")) o->out_file = v;
    else if (is(a, "-n", "--n-predict")) return parse_int(a, v, -1, 1 << 30, &o->n_predict) ? -1 : 1;
    else if (is(a, "-c", "--ctx-size")) return parse_int(a, v, 0, 1 << 24, &o->n_ctx) ? -1 : 1;
    else if (is(a, "-t", "--threads")) return parse_int(a, v, 1, 1024, &o->n_threads) ? -1 : 1;
    else if (is(a, "-s", "--seed")) {
        o->seed_set = 1;
        return parse_seed(v, &s->seed) ? -1 : 1;
    }
    else if (is(a, "--temp", NULL)) return parse_float(a, v, 0, 100, &s->temp) ? -1 : 1;
    else if (is(a, "--top-k", NULL)) return parse_int(a, v, 0, 1 << 30, &s->top_k) ? -1 : 1;
    else if (is(a, "--top-p", NULL)) return parse_float(a, v, 0, 1, &s->top_p) ? -1 : 1;
    else if (is(a, "--min-p", NULL)) return parse_float(a, v, 0, 1, &s->min_p) ? -1 : 1;
    else if (is(a, "--repeat-penalty", NULL)) return parse_float(a, v, 0, 100, &s->repeat_penalty) ? -1 : 1;
    else if (is(a, "--repeat-last-n", NULL)) return parse_int(a, v, -1, 1 << 24, &s->repeat_last_n) ? -1 : 1;
    else if (is(a, "--kv-type", NULL)) {
        if (!strcmp(v, "f32")) o->kv_type = LM_KV_F32;
        else if (!strcmp(v, "f16")) o->kv_type = LM_KV_F16;
        else return cli_error("invalid value '%s' for --kv-type (f32 or f16)", v), -1;
    } else return 0;
    return 1;
}

static int flag_opt(cli_opts *o, const char *a)
{
    if (is(a, "--echo", NULL)) o->echo = 1;
    else if (is(a, "--no-bos", NULL)) o->no_bos = 1;
    else if (is(a, "--special", NULL)) o->special = 1;
    else if (is(a, "--sequential", NULL)) o->sequential = 1;
    else if (is(a, "--no-context-shift", NULL)) o->no_context_shift = 1;
    else if (is(a, "--stats", NULL)) o->stats = 1;
    else if (is(a, "--json", NULL)) o->json = 1;
    else if (is(a, "--csv", NULL)) o->bench_csv = 1;
    else return 0;
    return 1;
}

/* Returns 0 to run, EXIT_OK after --help/--version, or an error code. */
int cli_parse(int argc, char **argv, cli_opts *o)
{
    memset(o, 0, sizeof *o);
    o->n_predict = -1;
    o->bench_reps = 3;
    lm_sampling_defaults(&o->sampling);
    int i = 1;
    for (int k = 0; argc > 1 && COMMANDS[k]; k++)
        if (!strcmp(argv[1], COMMANDS[k])) {
            o->cmd = COMMANDS[k];
            i = 2;
        }
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (is(a, "-h", "--help")) {
            cli_usage(stdout);
            return -1;
        }
        if (is(a, "--version", NULL)) {
            printf("kvchat %s\n", KVCHAT_VERSION);
            return -1;
        }
        if (flag_opt(o, a))
            continue;
        if (takes_value(a)) {
            if (i + 1 >= argc) {
                cli_error("option %s needs a value", a);
                return EXIT_USAGE;
            }
            int known = value_opt(o, a, argv[++i]);
            if (known < 0)
                return EXIT_USAGE;
            if (!known) { /* an option of another command */
                cli_error("option %s is for kvchat bench only (see kvchat --help)", a);
                return EXIT_USAGE;
            }
            continue;
        }
        cli_error("unknown argument '%s' (see kvchat --help)", a);
        return EXIT_USAGE;
    }
    return 0;
}
