/* Invariants of the library's own state machines (never a check of input: bad input is an error
 * returned through dt_error). DT_ASSERT(cond) is an expression worth 1 when cond holds. When it
 * does not:
 *   - builds without NDEBUG (the sanitizer build, debug builds) and any process started with
 *     DTRAIN_ABORT_ON_ASSERT=1 (the test suite sets it) print "file:line: invariant failed: cond"
 *     and abort, so a broken invariant stops a test where it broke;
 *   - release builds record the first failure as a sticky error (dt_assert_sticky), log it once,
 *     and the expression is worth 0, so the caller can refuse the operation rather than go on with
 *     corrupt state. The library still never aborts in a release build. */
#ifndef DT_CORE_ASSERT_H
#define DT_CORE_ASSERT_H

/* Every use must act on the result (refuse what the invariant guards): its value is marked
 * warn_unused_result, and the build makes that warning an error (-Werror=unused-result), so a bare
 * `DT_ASSERT(x);` statement does not compile. */
#define DT_ASSERT(cond) dt_assert_result((cond) ? 1 : dt_assert_fail(#cond, __FILE__, __LINE__))

__attribute__((warn_unused_result)) static inline int dt_assert_result(int holds) { return holds; }

/* Aborts, or records the failure and returns 0 (see above). */
int dt_assert_fail(const char *expr, const char *file, int line);

/* The first recorded failure as "file:line: invariant failed: expr", or NULL if none. */
const char *dt_assert_sticky(void);
/* The same for a refusal's message: never NULL ("broken invariant" when none is readable yet). */
const char *dt_assert_why(void);

/* Whether a failed assertion aborts in this process (for tests of the release behaviour). */
int dt_assert_aborts(void);

#endif
