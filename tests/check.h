/* tests/check.h — the C tests' reporter: check(ok, fmt, ...) prints one
 * "ok   ..." or "FAIL ..." line and counts it in n_pass / n_fail; each test
 * ends with printf("%d passed, %d failed\n", n_pass, n_fail). */
#ifndef LLMTRAIN_TESTS_CHECK_H
#define LLMTRAIN_TESTS_CHECK_H
#include <stdarg.h>
#include <stdio.h>

static int n_pass, n_fail;

static void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    if (ok) n_pass++;
    else n_fail++;
}

#endif
