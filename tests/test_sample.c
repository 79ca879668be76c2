/*
 * tests/test_sample.c - sampling: greedy picks the lowest id on ties, the
 * same seed gives the same draws, top-k 1 is greedy, top-p/min-p never
 * pick outside their set, and the repeat penalty pushes repeated tokens down.
 */
#include <math.h>
#include "util.h"

#include <stdlib.h>

static lm_sampler *make(float temp, int top_k, float top_p, float min_p, float pen, uint64_t seed)
{
    lm_sampling p;
    lm_sampling_defaults(&p);
    p.temp = temp, p.top_k = top_k, p.top_p = top_p, p.min_p = min_p;
    p.repeat_penalty = pen, p.seed = seed;
    return lm_sampler_new(&p, 8);
}

static const float LOGITS[8] = {1.0f, 3.0f, 0.5f, 3.0f, 2.9f, -1.0f, 0.0f, 2.0f};

START_TEST(test_greedy_ties)
{
    lm_sampler *s = make(0, 40, 1, 0, 1, 1);
    ck_assert_int_eq(lm_sample(s, LOGITS, NULL, 0), 1);
    ck_assert_int_eq(lm_argmax(LOGITS, 8), 1);
    lm_sampler_free(s);
}
END_TEST

/* lm_argmax against its definition: the first index that nothing after it beats, NaNs never winning. */
START_TEST(test_argmax_definition)
{
    static float x[1000];
    uint32_t r = 7;
    for (int c = 0; c < 400; c++) {
        int n = 1 + c * 7 % 999;
        for (int i = 0; i < n; i++) {
            r = r * 1103515245u + 12345u;
            x[i] = (float)((r >> 16) % 9) - 4.0f; /* many ties */
            if ((r >> 8) % 37 == 0)
                x[i] = NAN;
            if ((r >> 8) % 41 == 0)
                x[i] = (r >> 4) % 2 ? 0.0f : -0.0f;
        }
        if (c % 50 == 3)
            x[0] = NAN;
        int32_t best = 0;
        for (int i = 1; i < n; i++)
            if (x[i] > x[best])
                best = i;
        ck_assert_int_eq(lm_argmax(x, n), best);
    }
}
END_TEST

START_TEST(test_seed_reproducible)
{
    int a[64], b[64], differs = 0;
    lm_sampler *s1 = make(1.0f, 0, 1, 0, 1, 1234), *s2 = make(1.0f, 0, 1, 0, 1, 1234),
               *s3 = make(1.0f, 0, 1, 0, 1, 99);
    for (int i = 0; i < 64; i++) {
        a[i] = lm_sample(s1, LOGITS, NULL, 0);
        b[i] = lm_sample(s2, LOGITS, NULL, 0);
        differs |= a[i] != lm_sample(s3, LOGITS, NULL, 0);
        ck_assert_int_eq(a[i], b[i]);
    }
    ck_assert(differs);
    lm_sampler_free(s1), lm_sampler_free(s2), lm_sampler_free(s3);
}
END_TEST

START_TEST(test_filters)
{
    lm_sampler *k1 = make(1.0f, 1, 1, 0, 1, 7), *kp = make(1.0f, 0, 0.5f, 0, 1, 7),
               *mp = make(1.0f, 0, 1, 0.5f, 1, 7);
    for (int i = 0; i < 200; i++) {
        ck_assert_int_eq(lm_sample(k1, LOGITS, NULL, 0), 1);
        int t = lm_sample(kp, LOGITS, NULL, 0);
        ck_assert_msg(t == 1 || t == 3, "top-p 0.5 picked %d", t); /* two tied leaders */
        t = lm_sample(mp, LOGITS, NULL, 0);    /* p >= 0.5 * p_max: logit >= 3 - ln 2 */
        ck_assert_msg(t == 1 || t == 3 || t == 4, "min-p picked %d", t);
    }
    lm_sampler_free(k1), lm_sampler_free(kp), lm_sampler_free(mp);
}
END_TEST

START_TEST(test_repeat_penalty)
{
    lm_sampler *s = make(0, 40, 1, 0, 2.0f, 1);
    int32_t recent[] = {1, 3, 1};
    ck_assert_int_eq(lm_sample(s, LOGITS, recent, 3), 4); /* 3/2 = 1.5 < 2.9 */
    lm_sampler_free(s);
}
END_TEST

TCase *tcase_sample(void)
{
    TCase *tc = tcase_create("sample");
    tcase_add_test(tc, test_greedy_ties);
    tcase_add_test(tc, test_argmax_definition);
    tcase_add_test(tc, test_seed_reproducible);
    tcase_add_test(tc, test_filters);
    tcase_add_test(tc, test_repeat_penalty);
    return tc;
}
