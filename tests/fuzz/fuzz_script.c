/*
 * tests/fuzz/fuzz_script.c - libFuzzer target: arbitrary bytes as a -f
 * script (messages, """ blocks, # comments and commands) run against the
 * stories260K model with short replies and a small context.  Every line
 * either runs or fails with a message; the cache must stay consistent:
 * n_past never exceeds n_ctx and the cached tokens are a valid sequence.
 */
#include "../../cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static chat c;
static volatile int never;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    static char path[1024];
    const char *dir = getenv("KVCHAT_SHARED") ? getenv("KVCHAT_SHARED") : "../shared";
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", dir);
    cli_opts o;
    char *args[] = {"kvchat", NULL};
    cli_parse(1, args, &o);
    o.model = path;
    o.n_predict = 3;
    o.n_ctx = 96;
    o.n_threads = 1;
    o.sampling.temp = 0;
    o.seed_set = 1;
    if (chat_open(&c, &o, &never))
        abort();
    if (!freopen("/dev/null", "w", stdout))
        abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f = fmemopen((void *)data, size, "r");
    if (!f)
        return 0;
    chat_reset(&c);
    chat_set_system(&c, NULL);
    cli_run_script(&c, f, "fuzz.txt", size % 2);
    fclose(f);
    if (c.kv.n_past > c.kv.n_ctx)
        abort();
    for (int i = 0; i < c.kv.n_past; i++)
        if (c.kv.tokens[i] < 0 || c.kv.tokens[i] >= c.model.hp.n_vocab)
            abort();
    return 0;
}
