/* dt_first_nonfinite (src/core/finite.h): every place in whole blocks and the tail, each kind of
 * non-finite value, the largest finite ones, unaligned data. */
#include <float.h>
#include <stdint.h>

#include "core/finite.h"
#include "test.h"

static void test_finds_first(void) {
    enum { N = 3 * 4096 + 77 }; /* whole blocks and a tail */
    static float x[N];
    for (size_t i = 0; i < N; i++) x[i] = (i % 3 == 0 ? FLT_MAX : i % 3 == 1 ? -FLT_MIN / 4 : 1.0f) * (i & 1 ? -1 : 1);
    CHECK(dt_first_nonfinite(x, N) == N);
    CHECK(dt_first_nonfinite(x, 0) == 0);
    const float bad[] = {NAN, -NAN, INFINITY, -INFINITY};
    const size_t at[] = {0, 1, 4095, 4096, 8191, 3 * 4096, N - 1};
    for (size_t b = 0; b < sizeof bad / sizeof *bad; b++)
        for (size_t k = 0; k < sizeof at / sizeof *at; k++) {
            float keep = x[at[k]];
            x[at[k]] = bad[b];
            CHECK_MSG(dt_first_nonfinite(x, N) == at[k], "value %g at %zu", (double)bad[b], at[k]);
            CHECK(dt_first_nonfinite(x, at[k]) == at[k]); /* not counted beyond n */
            x[at[k]] = keep;
        }
    x[10] = INFINITY, x[9000] = NAN;
    CHECK(dt_first_nonfinite(x, N) == 10);
}

static void test_unaligned(void) {
    static unsigned char raw[4 * 5000 + 1];
    float one = 1.0f, nan = NAN;
    for (size_t i = 0; i < 5000; i++) memcpy(raw + 1 + 4 * i, &one, 4);
    CHECK(dt_first_nonfinite(raw + 1, 5000) == 5000);
    memcpy(raw + 1 + 4 * 4321, &nan, 4);
    CHECK(dt_first_nonfinite(raw + 1, 5000) == 4321);
}

int main(void) {
    RUN(test_finds_first);
    RUN(test_unaligned);
    return test_summary();
}
