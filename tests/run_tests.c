/*
 * tests/run_tests.c - the Check runner: one suite, a test case per module.
 * Needs the kvchat binary (KVCHAT_BIN) and the reference data
 * (KVCHAT_SHARED); `make check` sets both.
 */
#include "util.h"

#include <stdlib.h>

int main(void)
{
    Suite *s = suite_create("kvchat");
    suite_add_tcase(s, tcase_quant());
    suite_add_tcase(s, tcase_kernels());
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
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
