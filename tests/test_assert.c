/* DT_ASSERT (src/core/assert.h): worth 1 when the invariant holds; when it fails, aborts naming
 * file and line where the process is set to abort, else records one sticky message and is worth 0,
 * and the operation it guards is refused (a ps shard's gradient for an accumulator that holds
 * another step). A DT_ASSERT whose result is ignored does not compile. */
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

/* A sync shard (2 of 2 workers, staleness 1) whose accumulator of step 1 holds a gradient of step 3
 * (a broken invariant, made by hand): worker 1's gradient for step 1 is refused (RESYNC, naming
 * the invariant), not summed with the other step's; the chunk stays at step 0. Exits 42 if so. */
#ifdef NDEBUG /* release builds only: the others abort at a broken invariant */
#include "ps/shard_impl.h"
#include "shard_io.h"

static void push_into_broken_accumulator(void *unused) {
    unsetenv("DTRAIN_ABORT_ON_ASSERT");
    enum { N = 4 };
    ps_shard *s = shard_new_n(N);
    shard_init_n(s, N, 1, 2, 2, 1, 0, 0, 0);
    accum *a = &s->parts[0].acc[1];
    a->step = 3, a->count = 1, a->worker[0] = 0;
    float g[N] = {1, 1, 1, 1};
    dt_wire_header h = hdr(DT_MSG_PUSH, DT_ROLE_WORKER, 1);
    h.chunks = 1, h.local_step = 1, h.global_step = 2, h.flags = DT_WIRE_F_SYNC, h.payload_bytes = sizeof g;
    ps_origin o = from(1);
    dt_bytes b = {.data = g, .size = sizeof g};
    ps_shard_request(s, &o, &h, &b, 0, &io);
    const reply *r = last();
    int refused = r && r->h.type == DT_MSG_ERROR && r->h.status == DT_WIRE_E_RESYNC &&
                  strstr(r->text, "invariant failed: a->count == 0 || a->step == t") && a->count == 1 && a->step == 3 &&
                  s->parts[0].step == 0;
    fprintf(stderr, "reply %d status %d: %s; accumulator step %lld count %d\n", r ? (int)r->h.type : -1,
            r ? r->h.status : 0, r ? r->text : "", (long long)a->step, a->count);
    a->step = -1, a->count = 0;
    shard_done(s);
    _exit(refused ? 42 : 1);
}
#endif

static void test_refuses(void) {
#ifdef NDEBUG
    char out[2048];
    int st = run_child(push_into_broken_accumulator, NULL, out, sizeof out);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 42, "status %d: %s", st, out);
#else
    printf("  (builds without NDEBUG abort at a broken invariant: nothing is refused to check)\n");
#endif
}

/* A file with `body` in a function, compiled as the library is (DTRAIN_CC, -Werror=unused-result;
 * to an object: gcc warns of unused results past its front end, not with -fsyntax-only):
 * whether it compiled. -1: no compiler to ask. */
static int compiles(const char *body) {
    const char *cc = getenv("DTRAIN_CC"), *src = getenv("DTRAIN_SRC");
    if (!cc || !*cc || !src) return -1;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "printf '#include \"core/assert.h\"\\nint f(int x) { %s return 0; }\\n' | "
             "%s -c -o /dev/null -Wall -Werror=unused-result -I '%s/src' -x c - 2>/dev/null", body, cc, src);
    return system(cmd) == 0;
}

static void test_ignored_result_fails_the_build(void) {
    int ok = compiles("if (!DT_ASSERT(x > 0)) return 1;");
    if (ok < 0) {
        printf("  (DTRAIN_CC not set: not checked)\n");
        return;
    }
    CHECK(ok == 1);
    CHECK(compiles("DT_ASSERT(x > 0);") == 0);
}

int main(void) {
    RUN(test_holds);
    RUN(test_fails);
    RUN(test_refuses);
    RUN(test_ignored_result_fails_the_build);
    return test_summary();
}
