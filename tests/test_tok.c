/*
 * tests/test_tok.c - tokenizers against llama.cpp's token ids for every
 * vocab-only file in ../shared/vocab, plus the invariants users rely on:
 * decoding gives the text back, special-token text is plain text unless
 * asked, BOS follows the vocab's flag, and the stream decoder never splits a
 * UTF-8 character.
 */
#include "util.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

typedef struct vfile {
    gguf_file g;
    tok_vocab *v;
} vfile;

static int vopen(vfile *f, const char *rel)
{
    char *p = shared_path(rel);
    lm_err e;
    int rc = gguf_open(&f->g, p, &e);
    ck_assert_msg(rc == 0, "%s", e.msg);
    f->v = tok_load(&f->g, &e);
    ck_assert_msg(f->v != NULL, "%s", e.msg);
    free(p);
    return 0;
}

static void vclose(vfile *f)
{
    tok_free(f->v);
    gguf_close(&f->g);
}

/* Compares every test string of NAME.inp with the ids of NAME.out, tokenized
 * through memo when there is one. */
static int check_vectors(const char *dir, const char *name, tok_memo *memo)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.inp", dir, name);
    size_t ilen;
    char *inp = slurp(path, &ilen);
    snprintf(path, sizeof path, "%s/%s.out", dir, name);
    char *out = slurp(path, NULL);
    ck_assert_msg(inp && out, "missing vectors for %s", name);
    snprintf(path, sizeof path, "vocab/%s", name);
    vfile f;
    vopen(&f, path);
    const char *sep = "\n__ggml_vocab_test__\n";
    char *s = inp, *line = out;
    int n_cases = 0;
    for (char *end; (end = strstr(s, sep)); s = end + strlen(sep), n_cases++) {
        char *nl = strchr(line, '\n');
        ck_assert(nl);
        *nl = 0;
        int32_t *ids;
        int n;
        lm_err e;
        size_t len = (size_t)(end - s);
        ck_assert((memo ? tok_encode_memo(f.v, memo, s, len, 0, 0, &ids, &n, &e)
                        : tok_encode(f.v, s, len, 0, 0, &ids, &n, &e)) == 0);
        char *q = line;
        for (int i = 0; i <= n; i++) {
            char *next;
            long want = strtol(q, &next, 10);
            if (i == n) {
                ck_assert_msg(next == q, "%s case %d: too few ids: %s", name, n_cases, line);
                break;
            }
            ck_assert_msg(next != q && want == ids[i], "%s case %d '%.*s': id %d is %d, want [%s]",
                          name, n_cases, (int)(end - s), s, i, ids[i], line);
            q = next;
        }
        /* decoding the ids gives the text back (no normalization is applied) */
        char text[65536];
        size_t tl = 0;
        for (int i = 0; i < n; i++) {
            size_t pl;
            const char *p = tok_piece(f.v, ids[i], 1, &pl);
            memcpy(text + tl, p, pl);
            tl += pl;
        }
        /* SPM adds one leading space (add_space_prefix) */
        size_t skip = tok_kind(f.v) == TOK_SPM && tl > (size_t)(end - s) && text[0] == ' ';
        if (tok_utf8_valid_prefix(s, (size_t)(end - s)) == (size_t)(end - s))
            ck_assert_msg(tl - skip == (size_t)(end - s) && !memcmp(text + skip, s, tl - skip),
                          "%s case %d does not decode back", name, n_cases);
        free(ids);
        line = nl + 1;
    }
    vclose(&f);
    free(inp);
    free(out);
    return n_cases;
}

START_TEST(test_vocab_vectors)
{
    char *dir = shared_path("vocab");
    DIR *d = opendir(dir);
    ck_assert_msg(d != NULL, "no %s", dir);
    int files = 0;
    for (struct dirent *de; (de = readdir(d));) {
        size_t l = strlen(de->d_name);
        if (l < 6 || strcmp(de->d_name + l - 5, ".gguf"))
            continue;
        ck_assert_int_gt(check_vectors(dir, de->d_name, NULL), 10);
        /* through a memo: its words come from the first pass in the second */
        tok_memo *memo = tok_memo_new();
        ck_assert(memo);
        for (int pass = 0; pass < 2; pass++)
            check_vectors(dir, de->d_name, memo);
        tok_memo_free(memo);
        files++;
    }
    closedir(d);
    ck_assert_int_ge(files, 6);
    free(dir);
}
END_TEST

static int encode_n(const tok_vocab *v, const char *s, int add, int special, int32_t **ids)
{
    int n;
    lm_err e;
    ck_assert(tok_encode(v, s, strlen(s), add, special, ids, &n, &e) == 0);
    return n;
}

/* A special token of v whose text can cut a conversation into pieces. */
static const char *some_special(const tok_vocab *v)
{
    static const char *const names[] = {"<|im_start|>", "<start_of_turn>", "<|user|>", "<s>",
                                        "<|start_header_id|>", "<|endoftext|>"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (tok_find(v, names[i], strlen(names[i])) >= 0)
            return names[i];
    return NULL;
}

/*
 * A memo gives tok_encode's ids for a growing, edited and repeated
 * conversation, and does reuse the pieces that repeat.
 */
START_TEST(test_memo_same_ids)
{
    static const char *const vocabs[] = {"vocab/ggml-vocab-qwen2.gguf", "vocab/ggml-vocab-llama-spm.gguf",
                                         "vocab/ggml-vocab-phi-3.gguf", "vocab/ggml-vocab-gemma3.gguf",
                                         "vocab/ggml-vocab-llama3.gguf"};
    static const char *const msgs[] = {"user\nHello there ", "assistant\n Hi!  How can I help?\n",
                                       "user\nTell me 日本 things\t\n", "assistant\nSure:  1, 2, 3 "};
    for (size_t iv = 0; iv < sizeof vocabs / sizeof vocabs[0]; iv++) {
        vfile f;
        vopen(&f, vocabs[iv]);
        const char *sp = some_special(f.v);
        ck_assert_msg(sp, "%s: no special token", vocabs[iv]);
        tok_memo *memo = tok_memo_new();
        ck_assert(memo);
        char text[1024];
        /* turns 1..4, then turn 2 with its first message edited, then turn 4 again */
        static const int turns[] = {1, 2, 3, 4, -2, 4}, reused[] = {0, 1, 2, 3, 1, 1};
        for (size_t k = 0; k < sizeof turns / sizeof turns[0]; k++) {
            int nm = abs(turns[k]);
            text[0] = 0;
            for (int i = 0; i < nm; i++) {
                strcat(text, sp);
                strcat(text, i == 0 && turns[k] < 0 ? "user\nHello here" : msgs[i]);
            }
            strcat(text, sp);
            int32_t *a, *b;
            int na, nb;
            lm_err e;
            ck_assert(tok_encode(f.v, text, strlen(text), 1, 1, &a, &na, &e) == 0);
            ck_assert(tok_encode_memo(f.v, memo, text, strlen(text), 1, 1, &b, &nb, &e) == 0);
            ck_assert_msg(na == nb && !memcmp(a, b, (size_t)na * sizeof *a), "%s, call %zu",
                          vocabs[iv], k);
            /* at least the messages that repeat the last call's at the same place
               (more where special tokens cut messages, as Gemma's whitespace runs) */
            int got = tok_memo_reused(memo);
            ck_assert_msg(k == 0 ? got == 0 : got >= reused[k], "%s, call %zu: %d pieces reused",
                          vocabs[iv], k, got);
            free(a);
            free(b);
        }
        tok_memo_free(memo);
        vclose(&f);
    }
}
END_TEST

/*
 * A conversation without a template is one fragment that grows every turn;
 * through one memo, switching between two vocabs as it grows, every call
 * still gives tok_encode's ids (the words noted for one vocab are not the
 * other's).
 */
START_TEST(test_memo_raw_growing)
{
    vfile f[2];
    vopen(&f[0], "vocab/ggml-vocab-gpt-2.gguf");
    vopen(&f[1], "vocab/ggml-vocab-llama3.gguf");
    char *path = shared_path("vocab/ggml-vocab-qwen2.gguf.inp");
    size_t ilen;
    char *inp = slurp(path, &ilen);
    ck_assert_msg(inp, "no %s", path);
    tok_memo *memo = tok_memo_new();
    ck_assert(memo);
    const char *sep = "\n__ggml_vocab_test__\n";
    size_t upto = 0;
    int calls = 0;
    for (char *end; (end = strstr(inp + upto, sep)); upto = (size_t)(end - inp) + strlen(sep)) {
        size_t len = (size_t)(end - inp); /* every case so far, separators and all */
        for (int r = 0; r < 2; r++, calls++) {
            const tok_vocab *v = f[(calls / 3) % 2].v;
            int32_t *a, *b;
            int na, nb;
            lm_err e;
            ck_assert(tok_encode(v, inp, len, 1, 0, &a, &na, &e) == 0);
            ck_assert(tok_encode_memo(v, memo, inp, len, 1, 0, &b, &nb, &e) == 0);
            ck_assert_msg(na == nb && !memcmp(a, b, (size_t)na * sizeof *a), "call %d, %zu bytes",
                          calls, len);
            free(a);
            free(b);
        }
    }
    ck_assert_int_gt(calls, 20);
    tok_memo_free(memo);
    free(inp);
    free(path);
    vclose(&f[0]);
    vclose(&f[1]);
}
END_TEST

/*
 * More distinct words than the word memo keeps (it starts over, 65536),
 * and words too long to keep, through one memo twice: tok_encode's ids.
 */
START_TEST(test_memo_many_words)
{
    vfile f;
    vopen(&f, "vocab/ggml-vocab-llama3.gguf");
    const int words = 70000;
    char *text = malloc((size_t)words * 8 + 4096);
    ck_assert(text);
    size_t n = 0;
    for (int i = 0; i < words; i++) { /* " " and a base-26 number: every word differs */
        text[n++] = ' ';
        for (int x = i; x; x /= 26)
            text[n++] = (char)('a' + x % 26);
    }
    for (int i = 0; i < 1000; i++) /* one word of 1000 letters */
        text[n++] = (char)('a' + i * 7 % 26);
    int32_t *a, *b;
    int na, nb;
    lm_err e;
    ck_assert(tok_encode(f.v, text, n, 1, 0, &a, &na, &e) == 0);
    tok_memo *memo = tok_memo_new();
    ck_assert(memo);
    for (int pass = 0; pass < 2; pass++) {
        ck_assert(tok_encode_memo(f.v, memo, text, n, 1, 0, &b, &nb, &e) == 0);
        ck_assert_msg(na == nb && !memcmp(a, b, (size_t)na * sizeof *a), "pass %d", pass);
        free(b);
    }
    tok_memo_free(memo);
    free(a);
    free(text);
    vclose(&f);
}
END_TEST

START_TEST(test_special_parsing)
{
    vfile f;
    vopen(&f, "vocab/ggml-vocab-qwen2.gguf");
    int32_t *ids, id = tok_find(f.v, "<|im_start|>", 12);
    ck_assert_int_ge(id, 0);
    int n = encode_n(f.v, "<|im_start|>user", 0, 1, &ids);
    ck_assert_int_eq(ids[0], id);
    ck_assert_int_eq(n, 2);
    free(ids);
    n = encode_n(f.v, "<|im_start|>user", 0, 0, &ids);
    ck_assert_int_gt(n, 2); /* plain text when parse_special is off */
    for (int i = 0; i < n; i++)
        ck_assert_int_ne(ids[i], id);
    free(ids);
    ck_assert(tok_is_eog(f.v, tok_find(f.v, "<|im_end|>", 10)));
    ck_assert(!tok_add_bos(f.v));
    vclose(&f);
}
END_TEST

START_TEST(test_bos_flags)
{
    vfile f;
    int32_t *ids;
    vopen(&f, "vocab/ggml-vocab-llama3.gguf");
    int n = encode_n(f.v, "Hello", 1, 0, &ids);
    ck_assert_int_eq(ids[0], tok_bos(f.v));
    ck_assert_int_eq(n, 2);
    free(ids);
    vclose(&f);
    vopen(&f, "vocab/ggml-vocab-llama-spm.gguf");
    n = encode_n(f.v, "", 1, 0, &ids);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(ids[0], 1);
    free(ids);
    n = encode_n(f.v, "", 0, 0, &ids);
    ck_assert_int_eq(n, 0);
    free(ids);
    vclose(&f);
}
END_TEST

START_TEST(test_byte_fallback_and_stream)
{
    vfile f;
    vopen(&f, "vocab/ggml-vocab-llama-spm.gguf");
    const char *s = "\xf0\x9f\xa6\x99 llama"; /* an emoji unlikely to be one token */
    int32_t *ids;
    int n = encode_n(f.v, s, 0, 0, &ids);
    tok_stream st = {{0}, 0};
    char out[256], buf[64];
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        size_t pl;
        const char *p = tok_piece(f.v, ids[i], 0, &pl);
        size_t w = tok_stream_put(&st, p, pl, buf);
        ck_assert_msg(tok_utf8_valid_prefix(buf, w) == w, "token %d broke a character", i);
        memcpy(out + at, buf, w);
        at += w;
    }
    at += tok_stream_flush(&st, out + at);
    ck_assert_int_eq((int)at, (int)strlen(s) + 1); /* plus the SPM leading space */
    ck_assert(!memcmp(out + 1, s, strlen(s)));
    free(ids);
    vclose(&f);
}
END_TEST

START_TEST(test_invalid_utf8)
{
    vfile f;
    vopen(&f, "vocab/ggml-vocab-gpt-2.gguf");
    int32_t *ids;
    int n = encode_n(f.v, "a\xff\xfe b", 0, 0, &ids);
    ck_assert_int_gt(n, 0); /* tokenized (as U+FFFD, like llama.cpp), not rejected */
    free(ids);
    vclose(&f);
    ck_assert_int_eq((int)tok_utf8_valid_prefix("ab\xc3", 3), 2);
    ck_assert_int_eq((int)tok_utf8_valid_prefix("\xed\xa0\x80", 3), 0); /* surrogate */
    ck_assert_int_eq((int)tok_utf8_valid_prefix("a\xe0\x9b\x96", 4), 1);  /* overlong U+06D6 */
    ck_assert_int_eq((int)tok_utf8_valid_prefix("\xc0\x80", 2), 0);        /* overlong NUL */
    ck_assert_int_eq((int)tok_utf8_valid_prefix("\xf4\x90\x80\x80", 4), 0); /* above U+10FFFF */
    ck_assert_int_eq((int)tok_utf8_valid_prefix("\xdb\x96\xf0\x9f\xa6\x99", 6), 6);
}
END_TEST

TCase *tcase_tok(void)
{
    TCase *tc = tcase_create("tok");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_vocab_vectors);
    tcase_add_test(tc, test_special_parsing);
    tcase_add_test(tc, test_memo_same_ids);
    tcase_add_test(tc, test_memo_raw_growing);
    tcase_add_test(tc, test_memo_many_words);
    tcase_add_test(tc, test_bos_flags);
    tcase_add_test(tc, test_byte_fallback_and_stream);
    tcase_add_test(tc, test_invalid_utf8);
    return tc;
}
