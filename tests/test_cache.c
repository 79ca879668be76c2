/*
 * tests/test_cache.c - the persistent context's invariants: a failed,
 * overflowing or interrupted evaluation changes nothing; truncation and
 * sync reuse exactly the common prefix; and logits after any sequence of
 * syncs equal those of a fresh evaluation, bit for bit.
 */
#include "util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static lm_model model;

static void setup(void)
{
    char *p = shared_path("models/stories260K.gguf");
    lm_err e;
    ck_assert_msg(lm_model_open(&model, p, &e) == 0, "%s", e.msg);
    free(p);
}

static void teardown(void) { lm_model_close(&model); }

static const int32_t SEQ[] = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315};

START_TEST(test_overflow_changes_nothing)
{
    kv_context c;
    lm_err e;
    ck_assert(kv_init(&c, &model, 8, LM_KV_F32, 2, &e) == 0);
    ck_assert(kv_eval(&c, SEQ, 5, NULL, NULL, &e) == 0);
    float before[512];
    memcpy(before, c.logits, sizeof before);
    ck_assert(kv_eval(&c, SEQ + 5, 4, NULL, NULL, &e) != 0);
    ck_assert_str_eq(e.msg, "KV cache overflow: n_past=5 + n_tokens=4 > n_ctx=8");
    ck_assert_int_eq(c.n_past, 5);
    ck_assert(!memcmp(c.tokens, SEQ, 5 * sizeof *SEQ));
    ck_assert(!memcmp(before, c.logits, sizeof before));
    int32_t bad = 100000;
    ck_assert(kv_eval(&c, &bad, 1, NULL, NULL, &e) != 0);
    ck_assert_int_eq(c.n_past, 5);
    volatile int stop = 1;
    ck_assert(kv_eval(&c, SEQ + 5, 2, NULL, &stop, &e) != 0);
    ck_assert_int_eq(c.n_past, 5);
    ck_assert(kv_eval(&c, SEQ + 5, 3, NULL, NULL, &e) == 0);
    ck_assert_int_eq(c.n_past, 8);
    kv_free(&c);
}
END_TEST

static void fresh_logits(const int32_t *ids, int n, float *out)
{
    kv_context c;
    lm_err e;
    ck_assert(kv_init(&c, &model, 64, LM_KV_F32, 1, &e) == 0);
    ck_assert(kv_eval(&c, ids, n, NULL, NULL, &e) == 0);
    memcpy(out, c.logits, 512 * sizeof *out);
    kv_free(&c);
}

START_TEST(test_sync_reuses_prefix)
{
    kv_context c;
    lm_err e;
    int reused, decoded;
    float want[512];
    ck_assert(kv_init(&c, &model, 64, LM_KV_F32, 2, &e) == 0);
    ck_assert(kv_sync(&c, SEQ, 6, &reused, &decoded, NULL, &e) == 0);
    ck_assert_int_eq(reused, 0);
    ck_assert_int_eq(decoded, 6);
    ck_assert(kv_sync(&c, SEQ, 10, &reused, &decoded, NULL, &e) == 0);
    ck_assert_int_eq(reused, 6);
    ck_assert_int_eq(decoded, 4);
    fresh_logits(SEQ, 10, want);
    ck_assert(!memcmp(want, c.logits, sizeof want));
    int32_t edited[10];
    memcpy(edited, SEQ, sizeof edited);
    edited[7] = 300;
    ck_assert(kv_sync(&c, edited, 9, &reused, &decoded, NULL, &e) == 0);
    ck_assert_int_eq(reused, 7);
    ck_assert_int_eq(decoded, 2);
    ck_assert_int_eq(c.n_past, 9);
    fresh_logits(edited, 9, want);
    ck_assert(!memcmp(want, c.logits, sizeof want));
    ck_assert(kv_sync(&c, edited, 9, &reused, &decoded, NULL, &e) == 0);
    ck_assert_int_eq(reused, 9);
    ck_assert_int_eq(decoded, 0);
    ck_assert(kv_sync(&c, edited, 5, &reused, &decoded, NULL, &e) == 0);
    ck_assert_int_eq(reused, 4);
    ck_assert_int_eq(decoded, 1); /* re-evaluate the last */
    fresh_logits(edited, 5, want);
    ck_assert(!memcmp(want, c.logits, sizeof want));
    kv_truncate(&c, 2);
    ck_assert_int_eq(c.n_past, 2);
    kv_reset(&c);
    ck_assert_int_eq(c.n_past, 0);
    ck_assert_int_eq(kv_common_prefix(&c, SEQ, 3), 0);
    kv_free(&c);
}
END_TEST

START_TEST(test_f16_cache_close)
{
    kv_context a, b;
    lm_err e;
    ck_assert(kv_init(&a, &model, 32, LM_KV_F32, 2, &e) == 0);
    ck_assert(kv_init(&b, &model, 32, LM_KV_F16, 2, &e) == 0);
    ck_assert(kv_eval(&a, SEQ, 12, NULL, NULL, &e) == 0);
    ck_assert(kv_eval(&b, SEQ, 12, NULL, NULL, &e) == 0);
    float d = 0;
    for (int i = 0; i < 512; i++)
        d = fabsf(a.logits[i] - b.logits[i]) > d ? fabsf(a.logits[i] - b.logits[i]) : d;
    ck_assert_msg(d > 0 && d < 5e-2, "f16 cache differs by %g", d);
    kv_free(&a);
    kv_free(&b);
}
END_TEST

/* Whether the page holding p is in memory (mincore). */
static int resident(const void *p)
{
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    unsigned char v = 0;
    ck_assert(mincore((void *)((uintptr_t)p & ~(uintptr_t)(pg - 1)), pg, &v) == 0);
    return v & 1;
}

/* Transparent huge pages for every mapping make untouched pages resident with their neighbours. */
static int thp_always(void)
{
    char buf[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f) {
        if (!fgets(buf, sizeof buf, f))
            buf[0] = 0;
        fclose(f);
    }
    return strstr(buf, "[always]") != NULL;
}

/*
 * kv_prepare_ahead maps the next positions' pages before the next
 * evaluation writes them (at init too), leaves the rest of a large cache
 * unmapped, touches the first KV_TOUCH of them (whole tiles) once, and
 * keeps what the cache holds: logits after it equal a fresh evaluation's,
 * bit for bit.
 */
START_TEST(test_prepare_ahead)
{
    kv_context c;
    lm_err e;
    float want[512];
    fresh_logits(SEQ, 12, want);
    ck_assert(kv_init(&c, &model, 1 << 16, LM_KV_F32, 2, &e) == 0);
    const size_t row = (size_t)c.kv.head_dim * sizeof(float), head = (size_t)c.kv.n_pos * row;
    const char *k = c.kv.k, *v = c.kv.v;
    const size_t last = (size_t)c.kv.n_layer * c.kv.n_head_kv - 1; /* the last head's run */
    ck_assert(resident(k) && resident(v + last * head + (KV_AHEAD - 1) * row));
    ck_assert_int_eq(c.kv.touched, KV_TOUCH);
    if (!thp_always())
        ck_assert(!resident(k + 8192 * row) && !resident(v + last * head + 40000 * row));
    ck_assert(kv_eval(&c, SEQ, 11, NULL, NULL, &e) == 0);
    kv_prepare_ahead(&c, 8192 - 11); /* over the written positions too */
    ck_assert_int_eq(c.kv.touched, (11 + KV_TOUCH + 15) & ~15);
    kv_prepare_ahead(&c, 8192 - 11);
    ck_assert_int_eq(c.kv.touched, (11 + KV_TOUCH + 15) & ~15);
    ck_assert(resident(k + 8191 * row) && resident(v + last * head + 8191 * row));
    if (!thp_always())
        ck_assert(!resident(k + 16384 * row));
    ck_assert(kv_eval(&c, SEQ + 11, 1, NULL, NULL, &e) == 0);
    ck_assert(!memcmp(c.logits, want, sizeof want));
    kv_free(&c);
}
END_TEST

TCase *tcase_cache(void)
{
    TCase *tc = tcase_create("cache");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_overflow_changes_nothing);
    tcase_add_test(tc, test_sync_reuses_prefix);
    tcase_add_test(tc, test_f16_cache_close);
    tcase_add_test(tc, test_prepare_ahead);
    return tc;
}
