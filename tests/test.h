/* Minimal test harness: each tests/test_<name>.c is one executable registered with ctest.
 *   static void test_something(void) { CHECK(x == 1); CHECK_NEAR(a, b, 1e-6); }
 *   int main(void) { RUN(test_something); return test_summary(); }
 * A failed CHECK prints file:line and the expression and marks the test failed; the executable
 * exits non-zero if any check failed. */
#ifndef DT_TEST_H
#define DT_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failures_ = 0, test_checks_ = 0, test_run_ = 0, test_failed_tests_ = 0;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        test_checks_++;                                                               \
        if (!(cond)) {                                                                \
            test_failures_++;                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);  \
        }                                                                             \
    } while (0)

#define CHECK_MSG(cond, ...)                                                          \
    do {                                                                              \
        test_checks_++;                                                               \
        if (!(cond)) {                                                                \
            test_failures_++;                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                             \
            fputc('\n', stderr);                                                      \
        }                                                                             \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                         \
    do {                                                                              \
        double a_ = (a), b_ = (b);                                                    \
        CHECK_MSG(fabs(a_ - b_) <= (tol), "%.9g vs %.9g (tol %g)", a_, b_, (double)(tol)); \
    } while (0)

/* The substring must occur in the string (for error-message checks). */
#define CHECK_CONTAINS(haystack, needle)                                              \
    CHECK_MSG(strstr((haystack), (needle)) != NULL, "\"%s\" does not contain \"%s\"", \
              (haystack), (needle))

#define RUN(fn)                                                                       \
    do {                                                                              \
        int before_ = test_failures_;                                                 \
        test_run_++;                                                                  \
        fn();                                                                         \
        if (test_failures_ != before_) test_failed_tests_++;                          \
        fprintf(stderr, "%s %s\n", test_failures_ == before_ ? "ok  " : "FAIL", #fn); \
    } while (0)

static inline int test_summary(void) {
    fprintf(stderr, "%d passed, %d failed\n", test_run_ - test_failed_tests_, test_failed_tests_);
    return test_failed_tests_ ? 1 : 0;
}

#endif
