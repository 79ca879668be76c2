/*
 * tests/run_tests.c - the Check runner: one suite, a test case per module.
 * Needs the kvchat binary (KVCHAT_BIN) and the reference data
 * (KVCHAT_SHARED); `make check` sets both.  The files the tests write go
 * to one fresh directory (KVCHAT_TEST_TMP, under $TMPDIR or /tmp), removed
 * when the run ends: Check forks every test, so each would otherwise leave
 * a directory of its own behind.
 */
#define _XOPEN_SOURCE 700
#include "util.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* A fresh directory for the run's files, named in KVCHAT_TEST_TMP; 0 when made. */
static int make_tmp_dir(char *dir, size_t size)
{
    const char *base = getenv("TMPDIR");
    snprintf(dir, size, "%s/kvchat-tests-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(dir) || setenv("KVCHAT_TEST_TMP", dir, 1)) {
        perror("kvchat tests: temporary directory");
        return -1;
    }
    return 0;
}

int main(void)
{
    char dir[4096];
    if (make_tmp_dir(dir, sizeof dir))
        return EXIT_FAILURE;
    Suite *s = suite_create("kvchat");
    suite_add_tcase(s, tcase_quant());
    suite_add_tcase(s, tcase_kernels());
    suite_add_tcase(s, tcase_matmul());
    suite_add_tcase(s, tcase_bounds());
    suite_add_tcase(s, tcase_layer_math());
    suite_add_tcase(s, tcase_gguf());
    suite_add_tcase(s, tcase_tok());
    suite_add_tcase(s, tcase_sample());
    suite_add_tcase(s, tcase_cache());
    suite_add_tcase(s, tcase_engine());
    suite_add_tcase(s, tcase_cli());
    suite_add_tcase(s, tcase_template());
    suite_add_tcase(s, tcase_chat());
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    struct stat st;
    if (nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) || stat(dir, &st) == 0) {
        fprintf(stderr, "kvchat tests: could not remove %s\n", dir);
        return EXIT_FAILURE;
    }
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
