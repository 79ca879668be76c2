/*
 * tests/llama_diff/llama_tmpl.c - random conversations rendered by each
 * of kvchat's chat-template families (tok/template.c) and by llama.cpp's
 * llama_chat_apply_template under the same name; prints the first two
 * differences of each family and a count.  SEED N: N conversations.
 * Linked with template.o alone: llama.cpp's libraries define functions
 * named as lm/gguf.c's, so the two engines' loaders must not meet in one
 * process (run.sh compares tokenizers through two processes instead).
 */
#include "tok/tok.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* llama.h's declarations of the one call used (its header would bring ggml's gguf.h) */
typedef struct llama_chat_message {
    const char *role;
    const char *content;
} llama_chat_message;
int llama_chat_apply_template(const char *tmpl, const llama_chat_message *chat, size_t n_msg, bool add_ass,
                              char *buf, int length);

static unsigned long long rng;

static unsigned next(void)
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (unsigned)(rng >> 33);
}

/* Up to five pieces: words, runs of spaces and newlines at either end, other scripts, template-like text. */
static char *content(void)
{
    static const char *bits[] = {"hello", " ", "  ", "\n", "\n\n", " world", "How are you?", "\t", "x",
                                 "日本語", "😀", "<|im_start|>", "[INST]", "</s>", "  trailing  ", " lead",
                                 "Line1\nLine2", "a b c", "42", "{{ }}", "%s", "\\n"};
    char *s = calloc(1, 512);
    for (int k = next() % 6; s && k > 0; k--)
        strcat(s, bits[next() % (sizeof bits / sizeof *bits)]);
    return s;
}

/*
 * Whether ours is theirs: byte for byte, or but for the newline that
 * c392e5094 (the project's reference) ends granite's generation prompt with
 * and later llama.cpp does not.
 */
static int same(int family, int add, const char *ours, size_t len, const char *theirs, int r)
{
    if (!ours || r < 0)
        return 0;
    if ((size_t)r == len)
        return memcmp(ours, theirs, len) == 0;
    return family == TMPL_GRANITE && add && len == (size_t)r + 1 && ours[r] == '\n' &&
           memcmp(ours, theirs, (size_t)r) == 0;
}

/* One conversation through every family; counts differences in bad[]. */
static void compare_one(int bad[TMPL_COUNT])
{
    chat_msg m[8];
    llama_chat_message lm[8];
    int n = 0;
    if (next() % 2)
        m[n++] = (chat_msg){"system", content()};
    for (int i = 0, turns = 1 + (int)(next() % 6); i < turns; i++)
        m[n++] = (chat_msg){i % 2 ? "assistant" : "user", content()};
    for (int i = 0; i < n; i++)
        lm[i] = (llama_chat_message){m[i].role, m[i].content};
    const int add = (int)(next() % 2);
    static char buf[1 << 16];
    for (int f = 1; f < TMPL_COUNT; f++) {
        size_t len = 0;
        char *ours = tmpl_render(f, m, n, add, &len);
        const int r = llama_chat_apply_template(tmpl_name(f), lm, (size_t)n, add, buf, (int)sizeof buf);
        if (same(f, add, ours, len, buf, r)) {
            free(ours);
            continue;
        }
        if (bad[f]++ < 2)
            printf("== %s (%d messages, generation prompt %d)\n--- llama.cpp (%d):\n%.*s\n--- kvchat:\n%.*s\n",
                   tmpl_name(f), n, add, r, r > 0 ? r : 0, buf, ours ? (int)len : 0, ours ? ours : "");
        free(ours);
    }
    for (int i = 0; i < n; i++)
        free((char *)m[i].content);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: llama_tmpl SEED N\n");
        return 2;
    }
    rng = strtoull(argv[1], NULL, 10);
    const int n = atoi(argv[2]);
    int bad[TMPL_COUNT] = {0}, families = 0;
    for (int i = 0; i < n; i++)
        compare_one(bad);
    for (int f = 1; f < TMPL_COUNT; f++) {
        printf("%-18s %d of %d differ\n", tmpl_name(f), bad[f], n);
        families += bad[f] > 0;
    }
    return families > 0;
}
