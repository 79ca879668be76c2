/*
 * tests/test_gguf.c - the GGUF parser on valid files (every value type,
 * nested arrays, alignment, v2) and the model loader's checks; then hostile
 * files: truncated at every header byte, lying counts and lengths, tensors
 * out of bounds, overlapping, misaligned, of unknown type or overflowing
 * shape, missing or misshapen tensors.  Each must fail with a message that
 * names the problem, never crash.
 */
#include "util.h"

#include <stdlib.h>
#include <string.h>

static int parse(const uint8_t *buf, size_t len, lm_err *e)
{
    gguf_file g;
    int rc = gguf_parse(&g, "mem.gguf", buf, len, e);
    gguf_close(&g);
    return rc;
}

START_TEST(test_value_types)
{
    gbuf b = {0};
    gb_u32(&b, 0x46554747u);
    gb_u32(&b, 2); /* version 2 */
    gb_u64(&b, 0);
    gb_u64(&b, 4);
    gb_str(&b, "a.u8"), gb_u32(&b, GGUF_U8), gb_put(&b, "\x07", 1);
    gb_str(&b, "a.i64"), gb_u32(&b, GGUF_I64), gb_u64(&b, 1234567);
    gb_str(&b, "a.nested"), gb_u32(&b, GGUF_ARRAY), gb_u32(&b, GGUF_ARRAY), gb_u64(&b, 2);
    for (int i = 0; i < 2; i++)
        gb_u32(&b, GGUF_STRING), gb_u64(&b, 1), gb_str(&b, "x");
    gb_str(&b, "a.f64"), gb_u32(&b, GGUF_F64);
    double d = 2.5;
    gb_put(&b, &d, 8);
    gguf_file g;
    lm_err e;
    ck_assert_msg(gguf_parse(&g, "mem", b.p, b.n, &e) == 0, "%s", e.msg);
    uint32_t u;
    float f;
    ck_assert_int_eq(gguf_get_u32(&g, "a.u8", &u, &e), 1);
    ck_assert_int_eq(u, 7);
    ck_assert_int_eq(gguf_get_u32(&g, "a.i64", &u, &e), 1);
    ck_assert_int_eq(u, 1234567);
    ck_assert_int_eq(gguf_get_f32(&g, "a.f64", &f, &e), 1);
    ck_assert_float_eq(f, 2.5f);
    ck_assert_int_eq(gguf_get_u32(&g, "missing", &u, &e), 0);
    ck_assert_int_eq(gguf_get_u32(&g, "a.nested", &u, &e), -1);
    ck_assert(gguf_find(&g, "a.nested")->arr_n == 2);
    gguf_close(&g);
    free(b.p);
}
END_TEST

START_TEST(test_tiny_model_loads)
{
    size_t len;
    uint8_t *buf = tiny_llama(&len, 0);
    lm_err e;
    ck_assert_msg(parse(buf, len, &e) == 0, "%s", e.msg);
    char *p = tmp_path("tiny.gguf");
    write_file(p, buf, len);
    lm_model m;
    ck_assert_msg(lm_model_open(&m, p, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(m.hp.n_vocab, 264);
    ck_assert_int_eq(m.hp.n_head_kv, 2);
    ck_assert(m.output != m.tok_embd);
    lm_model_close(&m);
    free(buf);
    buf = tiny_llama(&len, 1);
    write_file(p, buf, len);
    ck_assert_msg(lm_model_open(&m, p, &e) == 0, "%s", e.msg);
    ck_assert(m.output == m.tok_embd); /* tied */
    lm_model_close(&m);
    free(buf);
    free(p);
}
END_TEST

/* Every prefix of a valid file fails cleanly (the data section last). */
START_TEST(test_truncated_everywhere)
{
    size_t len;
    uint8_t *buf = tiny_llama(&len, 0);
    lm_err e;
    for (size_t cut = 0; cut < len; cut += cut < 20000 ? 1 : 997) {
        uint8_t *copy = malloc(cut + 1); /* exact-size copy: ASan sees any overread */
        memcpy(copy, buf, cut);
        e.msg[0] = 0;
        ck_assert_msg(parse(copy, cut, &e) != 0, "prefix of %zu bytes accepted", cut);
        ck_assert_msg(strstr(e.msg, "mem.gguf") != NULL, "message without file name: %s", e.msg);
        free(copy);
    }
    free(buf);
}
END_TEST

/* Offset of the info block of tensor `name` (just after its name). */
static size_t info_of(const uint8_t *buf, size_t len, const char *name)
{
    size_t nl = strlen(name);
    for (size_t i = 8; i + nl < len; i++) {
        uint64_t l;
        memcpy(&l, buf + i - 8, 8);
        if (l == nl && !memcmp(buf + i, name, nl))
            return i + nl;
    }
    ck_abort_msg("tensor %s not found", name);
    return 0;
}

static void set_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static void set_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

static void expect_reject(uint8_t *buf, size_t len, const char *needle)
{
    lm_err e = {{0}};
    ck_assert_msg(parse(buf, len, &e) != 0, "accepted a file that should fail with '%s'", needle);
    ck_assert_msg(strstr(e.msg, needle), "message '%s' lacks '%s'", e.msg, needle);
}

START_TEST(test_corrupt_headers)
{
    size_t len;
    uint8_t *buf = tiny_llama(&len, 0), *c = malloc(len);
#define FRESH() memcpy(c, buf, len)
    FRESH(), c[0] = 'X', expect_reject(c, len, "not a GGUF file");
    FRESH(), set_u32(c + 4, 1), expect_reject(c, len, "version 1");
    FRESH(), set_u64(c + 8, 1ull << 63), expect_reject(c, len, "more than");
    FRESH(), set_u64(c + 16, 1ull << 63), expect_reject(c, len, "more than");
    FRESH(), set_u64(c + 24, 1ull << 62), expect_reject(c, len, "past end of file");
    size_t t = info_of(buf, len, "output_norm.weight"); /* 1-D: dims, type, offset */
    FRESH(), set_u64(c + t + 4 + 8 + 4, 1ull << 40), expect_reject(c, len, "past end of file");
    FRESH(), set_u64(c + t + 4 + 8 + 4, 0), expect_reject(c, len, "overlap");
    size_t t0 = info_of(buf, len, "token_embd.weight");
    uint64_t off0;
    memcpy(&off0, buf + t0 + 4 + 16 + 4, 8);
    FRESH(), set_u64(c + t0 + 4 + 16 + 4, off0 + 4), expect_reject(c, len, "alignment");
    FRESH(), set_u32(c + t + 4 + 8, 99), expect_reject(c, len, "unknown type 99");
    FRESH(), set_u64(c + t + 4, 0), expect_reject(c, len, "dimension 0 is 0");
    FRESH(), set_u32(c + t0, 5), expect_reject(c, len, "dimensions");
    FRESH(), set_u64(c + t0 + 4, 1ull << 62), set_u64(c + t0 + 12, 1ull << 62);
    expect_reject(c, len, "overflowing");
#undef FRESH
    free(c);
    free(buf);
}
END_TEST

/* Model-level checks: architecture, required tensors and their shapes. */
static void expect_model_error(gmodel *m, const char *needle)
{
    size_t len;
    uint8_t *buf = gm_build(m, &len);
    char *p = tmp_path("bad-model.gguf");
    write_file(p, buf, len);
    lm_model mod;
    lm_err e = {{0}};
    ck_assert_msg(lm_model_open(&mod, p, &e) != 0, "bad model accepted ('%s')", needle);
    ck_assert_msg(strstr(e.msg, needle), "message '%s' lacks '%s'", e.msg, needle);
    free(p);
    free(buf);
}

static void base_meta(gmodel *m, const char *arch, uint32_t n_embd)
{
    char k[64];
    gm_kv_str(m, "general.architecture", arch);
    snprintf(k, sizeof k, "%s.embedding_length", arch), gm_kv_u32(m, k, n_embd);
    snprintf(k, sizeof k, "%s.block_count", arch), gm_kv_u32(m, k, 1);
    snprintf(k, sizeof k, "%s.feed_forward_length", arch), gm_kv_u32(m, k, 64);
    snprintf(k, sizeof k, "%s.attention.head_count", arch), gm_kv_u32(m, k, 4);
}

START_TEST(test_model_checks)
{
    gmodel m = {0};
    base_meta(&m, "mamba", 32);
    expect_model_error(&m, "unsupported architecture 'mamba' (supported: llama");
    gm_free(&m);

    base_meta(&m, "llama", 32);
    gm_tensor(&m, "token_embd.weight", LM_F32, 32, 10, calloc(320, 4), 1280);
    gm_tensor(&m, "output_norm.weight", LM_F32, 32, 1, calloc(32, 4), 128);
    expect_model_error(&m, "missing tensor 'blk.0.attn_norm.weight'");
    gm_free(&m);

    base_meta(&m, "llama", 32);
    gm_tensor(&m, "token_embd.weight", LM_F32, 32, 10, calloc(320, 4), 1280);
    gm_tensor(&m, "output_norm.weight", LM_F32, 16, 1, calloc(16, 4), 64);
    expect_model_error(&m, "tensor 'output_norm.weight' has shape [16");
    gm_free(&m);

    base_meta(&m, "llama", 256);
    gm_tensor(&m, "token_embd.weight", 16 /* IQ2_XXS */, 256, 10, calloc(66, 10), 660);
    expect_model_error(&m, "type IQ2_XXS");
    gm_free(&m);

    gm_kv_str(&m, "general.architecture", "llama");
    expect_model_error(&m, "missing metadata key 'llama.embedding_length'");
    gm_free(&m);

    gm_kv_str(&m, "general.architecture", "llama"); /* a huge layer count allocates nothing */
    gm_kv_u32(&m, "llama.embedding_length", 32);
    gm_kv_u32(&m, "llama.block_count", 1u << 30);
    gm_kv_u32(&m, "llama.feed_forward_length", 64);
    gm_kv_u32(&m, "llama.attention.head_count", 4);
    gm_tensor(&m, "token_embd.weight", LM_F32, 32, 10, calloc(320, 4), 1280);
    expect_model_error(&m, "block_count 1073741824 exceeds the 1 tensors");
    gm_free(&m);
}
END_TEST

/* The command line turns each of these into one line and exit code 1. */
START_TEST(test_cli_rejects)
{
    size_t len;
    uint8_t *buf = tiny_llama(&len, 0);
    char *p = tmp_path("cut.gguf");
    write_file(p, buf, len - 100);
    char *argv[] = {(char *)kvchat_bin(), "info", "-m", p, NULL}, *err;
    ck_assert_int_eq(run_cmd(argv, NULL, NULL, &err), 1);
    ck_assert_msg(strstr(err, "kvchat: ") == err && strstr(err, "past end of file"), "%s", err);
    ck_assert_msg(strchr(err, '\n') == err + strlen(err) - 1, "not one line: %s", err);
    free(err);
    argv[3] = "/nonexistent/model.gguf";
    ck_assert_int_eq(run_cmd(argv, NULL, NULL, &err), 1);
    ck_assert_msg(strstr(err, "No such file"), "%s", err);
    free(err);
    free(buf);
    free(p);
}
END_TEST

/* Builds a vocabulary-only file and expects tok_load to reject it with needle. */
static void expect_vocab_error(gmodel *m, const char *needle)
{
    size_t len;
    uint8_t *buf = gm_build(m, &len);
    gguf_file g;
    lm_err e = {{0}};
    ck_assert_msg(gguf_parse(&g, "vocab.gguf", buf, len, &e) == 0, "%s", e.msg);
    tok_vocab *v = tok_load(&g, &e);
    ck_assert_msg(v == NULL, "bad vocabulary accepted ('%s')", needle);
    ck_assert_msg(strstr(e.msg, needle), "message '%s' lacks '%s'", e.msg, needle);
    gguf_close(&g);
    free(buf);
    gm_free(m);
}

START_TEST(test_hostile_vocabularies)
{
    static const char *const spm[] = {"<unk>", "<s>", "</s>", "a"}, *const dup[] = {"a", "b", "a"};
    static const char *const bpe[] = {"a", "b", "ab"}, *const merges[] = {"a b", "a c"};
    static const int32_t types[] = {2, 3, 3, 1};
    gmodel m = {0};
    gm_kv_str(&m, "tokenizer.ggml.model", "llama");
    gm_kv_strs(&m, "tokenizer.ggml.tokens", spm, 4);
    gm_kv_u32(&m, "tokenizer.ggml.bos_token_id", 99);
    expect_vocab_error(&m, "bos_token_id = 99 is out of range");

    gm_kv_str(&m, "tokenizer.ggml.model", "llama");
    gm_kv_strs(&m, "tokenizer.ggml.tokens", dup, 3);
    expect_vocab_error(&m, "duplicate token");

    gm_kv_str(&m, "tokenizer.ggml.model", "llama");
    gm_kv_strs(&m, "tokenizer.ggml.tokens", spm, 4);
    gm_kv_i32s(&m, "tokenizer.ggml.token_type", types, 3);
    expect_vocab_error(&m, "token_type must be an array");

    gm_kv_str(&m, "tokenizer.ggml.model", "gpt2");
    gm_kv_str(&m, "tokenizer.ggml.pre", "gpt-2");
    gm_kv_strs(&m, "tokenizer.ggml.tokens", bpe, 3);
    gm_kv_strs(&m, "tokenizer.ggml.merges", merges, 2);
    expect_vocab_error(&m, "merge 1 ('a c') names a token that is not in the vocabulary");

    gm_kv_str(&m, "tokenizer.ggml.model", "gpt2");
    gm_kv_str(&m, "tokenizer.ggml.pre", "klingon");
    gm_kv_strs(&m, "tokenizer.ggml.tokens", bpe, 3);
    gm_kv_strs(&m, "tokenizer.ggml.merges", merges, 1);
    expect_vocab_error(&m, "unknown pre-tokenizer type 'klingon'");

    gm_kv_str(&m, "tokenizer.ggml.model", "wordpiece");
    expect_vocab_error(&m, "unsupported tokenizer model 'wordpiece'");

    gm_kv_str(&m, "general.architecture", "llama");
    expect_vocab_error(&m, "tokenizer.ggml.model is missing");
}
END_TEST

/* NaN and Inf block scales in quantized weights: evaluation and sampling run. */
START_TEST(test_nan_scales_run)
{
    size_t len;
    uint8_t *buf = tiny_llama(&len, 0);
    gguf_file g;
    lm_err e;
    ck_assert(gguf_parse(&g, "t", buf, len, &e) == 0);
    /* rewrite blk.0.ffn_up (F32 [32, 64]) as Q8_0 in place: 64 rows x 1 block of 34 bytes
       fit in its 8 KiB, with NaN, +Inf and ordinary scales */
    const gguf_tensor *t = gguf_find_tensor(&g, "blk.0.ffn_up.weight");
    uint8_t *data = buf + g.data_off + t->offset;
    for (int r = 0; r < 64; r++) {
        uint16_t d = r % 3 == 0 ? 0x7e00 : r % 3 == 1 ? 0x7c00 : 0x2000;
        memcpy(data + 34 * r, &d, 2);
        for (int j = 0; j < 32; j++)
            data[34 * r + 2 + j] = (uint8_t)(j * 7);
    }
    size_t info = 0; /* the type field follows the name, n_dims and two dims */
    for (size_t i = 8; i + 20 < len; i++)
        if (!memcmp(buf + i, "blk.0.ffn_up.weight", 19)) {
            info = i + 19 + 4 + 16;
            break;
        }
    ck_assert(info);
    uint32_t q8 = LM_Q8_0;
    memcpy(buf + info, &q8, 4);
    gguf_close(&g);
    char *p = tmp_path("nan.gguf");
    write_file(p, buf, len);
    char *out, *err;
    char *argv[] = {(char *)kvchat_bin(), "complete", "-m", p, "-p", "the cat", "-n", "6", "-s", "1", NULL};
    int rc = run_cmd(argv, NULL, &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    free(out), free(err), free(p), free(buf);
}
END_TEST

TCase *tcase_gguf(void)
{
    TCase *tc = tcase_create("gguf");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_value_types);
    tcase_add_test(tc, test_tiny_model_loads);
    tcase_add_test(tc, test_truncated_everywhere);
    tcase_add_test(tc, test_corrupt_headers);
    tcase_add_test(tc, test_model_checks);
    tcase_add_test(tc, test_cli_rejects);
    tcase_add_test(tc, test_hostile_vocabularies);
    tcase_add_test(tc, test_nan_scales_run);
    return tc;
}
