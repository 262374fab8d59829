/* Row placement over ps tasks (src/cluster/row_placement.h): every row on exactly one task in
 * range, the same answer on every call, balance within 2% of even for sequential ids, hashed ids
 * and a Zipf-like skewed id stream's distinct ids, a table's rows not placed as another table's, and
 * dt_row_split's grouping. */
#include <stdint.h>

#include "cluster/row_placement.h"
#include "core/rng.h"
#include "test.h"

enum { IDS = 1000000 };

/* Largest |count - even| / even over the tasks for ids [n] of table. */
static double imbalance(uint32_t table, const uint64_t *ids, size_t n, int n_ps) {
    size_t count[64] = {0};
    for (size_t i = 0; i < n; i++) {
        int p = dt_row_ps(table, ids[i], n_ps);
        CHECK(p >= 0 && p < n_ps);
        if (p >= 0 && p < n_ps) count[p]++;
    }
    double even = (double)n / n_ps, worst = 0;
    for (int p = 0; p < n_ps; p++) worst = fmax(worst, fabs((double)count[p] - even) / even);
    return worst;
}

static void test_balance(void) {
    uint64_t *seq = malloc(IDS * sizeof *seq), *hashed = malloc(IDS * sizeof *hashed), *strided = malloc(IDS * 8);
    for (size_t i = 0; i < IDS; i++)
        seq[i] = i, hashed[i] = dt_hash64(3, i) & 0xffffffffu, strided[i] = i << 6; /* Criteo: 32-bit */
    static const int counts[] = {1, 2, 3, 4, 7, 8, 16, 64};
    for (size_t k = 0; k < sizeof counts / sizeof *counts; k++) {
        int n_ps = counts[k];
        double a = imbalance(0, seq, IDS, n_ps), b = imbalance(5, hashed, IDS, n_ps);
        double c = imbalance(0, strided, IDS, n_ps); /* multiples of 64: id % n_ps would fail this */
        /* Within 4 binomial standard deviations, sqrt(n_ps / n): 1.1% for 8 tasks, 3.2% for 64. */
        double tol = 4 * sqrt((double)n_ps / IDS);
        CHECK_MSG(a < tol && b < tol && c < tol, "%d ps: imbalance %.4f (sequential), %.4f (hashed), %.4f (strided)",
                  n_ps, a, b, c);
    }
    /* Skewed: the distinct ids of a stream drawn Zipf-like (p ~ 1/rank) over 10^6 ids. */
    dt_rng r;
    dt_rng_seed(&r, 11);
    uint8_t *seen = calloc(IDS, 1);
    size_t n = 0;
    for (size_t i = 0; i < IDS; i++) {
        uint64_t id = (uint64_t)exp(dt_rng_uniform(&r) * log(1e6)) % IDS; /* log-uniform: density ~ 1/rank */
        if (!seen[id]) seen[id] = 1, seq[n++] = id;
    }
    CHECK(n > 50000 && imbalance(1, seq, n, 8) < 4 * sqrt(8.0 / n));
    free(seen), free(strided);
    /* The same id in different tables goes to different tasks, evenly. */
    size_t per[8] = {0};
    for (uint32_t t = 0; t < 80000; t++) per[dt_row_ps(t, 42, 8)]++;
    for (int p = 0; p < 8; p++) CHECK(per[p] > 9500 && per[p] < 10500);
    for (size_t i = 0; i < 1000; i++) CHECK(dt_row_ps(9, hashed[i], 5) == dt_row_ps(9, hashed[i], 5));
    for (size_t i = 0; i < 1000; i++) CHECK(dt_row_ps(9, hashed[i], 1) == 0);
    free(seq), free(hashed);
}

static void test_split(void) {
    enum { N = 1000, P = 5 };
    uint64_t ids[N];
    int ps_of[N];
    size_t begin[P + 1], order[N];
    for (int i = 0; i < N; i++) ids[i] = dt_hash64(1, (uint64_t)i);
    dt_row_split(2, ids, N, P, ps_of, begin, order);
    CHECK(begin[0] == 0 && begin[P] == N);
    int seen[N] = {0};
    for (int p = 0; p < P; p++) {
        CHECK(begin[p] <= begin[p + 1]);
        for (size_t k = begin[p]; k < begin[p + 1]; k++) {
            CHECK(dt_row_ps(2, ids[order[k]], P) == p);
            if (k > begin[p]) CHECK(order[k] > order[k - 1]); /* stable */
            seen[order[k]]++;
        }
    }
    for (int i = 0; i < N; i++) CHECK(seen[i] == 1);
    dt_row_split(2, ids, 0, P, ps_of, begin, order);
    CHECK(begin[0] == 0 && begin[P] == 0);
}

int main(void) {
    RUN(test_balance);
    RUN(test_split);
    return test_summary();
}
