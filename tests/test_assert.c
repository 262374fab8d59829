/* DT_ASSERT (src/core/assert.h): worth 1 when the invariant holds; when it fails, aborts naming
 * file and line where the process is set to abort, else records one sticky message and is worth 0. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/assert.h"
#include "test.h"

static void test_holds(void) {
    int n = 0;
    CHECK(DT_ASSERT(n == 0) == 1);
    CHECK(dt_assert_sticky() == NULL);
}

/* Runs a failing assertion in a child with DTRAIN_ABORT_ON_ASSERT as given; returns its wait
 * status and what it wrote to stderr. */
static int failing_child(const char *env, char *out, size_t cap) {
    int fd[2];
    if (pipe(fd) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        if (env) setenv("DTRAIN_ABORT_ON_ASSERT", env, 1);
        else unsetenv("DTRAIN_ABORT_ON_ASSERT");
        int first = DT_ASSERT(1 + 1 == 3);
        int second = DT_ASSERT(2 + 2 == 5); /* the first failure stays the sticky one */
        const char *s = dt_assert_sticky();
        _exit(first == 0 && second == 0 && s && strstr(s, "1 + 1 == 3") ? 42 : 1);
    }
    close(fd[1]);
    ssize_t got = 0, r;
    while (got < (ssize_t)cap - 1 && (r = read(fd[0], out + got, cap - 1 - (size_t)got)) > 0) got += r;
    out[got] = 0;
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
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
