/* DT_ASSERT (src/core/assert.h): worth 1 when the invariant holds; when it fails, aborts naming
 * file and line where the process is set to abort, else records one sticky message and is worth 0. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "child.h"
#include "core/assert.h"
#include "test.h"

static void test_holds(void) {
    int n = 0;
    CHECK(DT_ASSERT(n == 0) == 1);
    CHECK(dt_assert_sticky() == NULL);
}

/* A failing assertion with DTRAIN_ABORT_ON_ASSERT as given (env; NULL: unset); exits 42 when the
 * failures were recorded, not aborted. */
static void fail_twice(void *env) {
    if (env) setenv("DTRAIN_ABORT_ON_ASSERT", env, 1);
    else unsetenv("DTRAIN_ABORT_ON_ASSERT");
    int first = DT_ASSERT(1 + 1 == 3);
    int second = DT_ASSERT(2 + 2 == 5); /* the first failure stays the sticky one */
    const char *s = dt_assert_sticky();
    _exit(first == 0 && second == 0 && s && strstr(s, "1 + 1 == 3") ? 42 : 1);
}

static int failing_child(const char *env, char *out, size_t cap) {
    return run_child(fail_twice, (void *)env, out, cap);
}

static void test_fails(void) {
    char out[1024];
    int st = failing_child("1", out, sizeof out);
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "status %d", st);
    CHECK_CONTAINS(out, "test_assert.c:");
    CHECK_CONTAINS(out, "invariant failed: 1 + 1 == 3");
    st = failing_child(NULL, out, sizeof out);
#ifdef NDEBUG
    /* release: recorded, logged once, the call refused */
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 42, "status %d: %s", st, out);
    CHECK(strstr(out, "2 + 2") == NULL);
#else
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "status %d", st);
#endif
}

int main(void) {
    RUN(test_holds);
    RUN(test_fails);
    return test_summary();
}
