/* AUC and logloss (src/stats/binary.h) against numpy's figures on the cases of
 * tests/fixtures/gen_auc_fixtures.py (ties, CTR-like, constant, extremes, separable, reversed), fed
 * in uneven batches; the histogram past the cap within its own bound; refusals naming the row. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stats/binary.h"
#include "hash32.h"
#include "test.h"

/* ---- the fixture's cases (keep in step with gen_auc_fixtures.py) ------------------------------ */

static double u(uint32_t s, uint32_t i) {
    return ((double)(h32(i * 0x9E3779B1u + s * 0x85EBCA77u) >> 8) + 0.5) / 16777216.0;
}

static const double extremes[] = {0.0, 1.0, 1e-30, 1.0 - 0x1p-24, 0x1p-41, 0x1p-40, 0.5, 1e-7, 1.0 - 1e-7, 0.03125};

static void case_row(int c, uint32_t i, float *p, float *y) {
    double a = u(2u * (uint32_t)c, i), b = u(2u * (uint32_t)c + 1u, i);
    switch (c) {
    case 1: *p = (float)(floor(a * 64) / 64), *y = b < (double)*p; break;
    case 2: *p = (float)(a * a * a), *y = b < (double)*p; break;
    case 3: *p = 0.25f, *y = b < 0.25; break;
    case 4: *p = (float)extremes[i % 10], *y = b < 0.5; break;
    case 5: *p = (float)a, *y = a > 0.5; break;
    default: *p = (float)a, *y = a < 0.5; break;
    }
}

typedef struct {
    int number;
    char name[32];
    size_t n;
    uint64_t positives;
    double auc, logloss, mean_p;
} ref_case;

static int read_reference(ref_case *cases, int max) {
    FILE *f = fopen("tests/fixtures/auc_reference.txt", "r");
    if (!f) {
        perror("tests/fixtures/auc_reference.txt");
        exit(1);
    }
    char line[512];
    int k = 0;
    while (k < max && fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        ref_case *c = &cases[k];
        unsigned long long pos;
        if (sscanf(line, "%d %31s %zu %llu %lf %lf %lf", &c->number, c->name, &c->n, &pos, &c->auc, &c->logloss,
                   &c->mean_p) == 7) {
            c->positives = pos;
            k++;
        }
    }
    fclose(f);
    return k;
}

/* Adds case c to e in batches of 1, 2, 3, ... rows (uneven, so batch edges fall everywhere). */
static void feed(dt_binary_eval *e, const ref_case *c) {
    float *p = malloc(c->n * sizeof *p), *y = malloc(c->n * sizeof *y);
    for (size_t i = 0; i < c->n; i++) case_row(c->number, (uint32_t)i, &p[i], &y[i]);
    dt_error err = {0};
    for (size_t at = 0, b = 1; at < c->n; at += b, b++) {
        size_t m = at + b > c->n ? c->n - at : b;
        CHECK(dt_binary_eval_add(e, p + at, y + at, m, &err) == 0);
    }
    free(p);
    free(y);
}

/* ---- tests ------------------------------------------------------------------------------------ */

static ref_case cases[16];
static int ncases;

static void test_exact_matches_numpy(void) {
    CHECK(ncases == 6);
    for (int k = 0; k < ncases; k++) {
        const ref_case *c = &cases[k];
        dt_binary_eval *e = NULL;
        dt_error err = {0};
        CHECK(dt_binary_eval_create(&e, 0, &err) == 0);
        feed(e, c);
        dt_binary_result r;
        CHECK(dt_binary_eval_result(e, &r, &err) == 0);
        CHECK_MSG(r.examples == c->n && r.positives == c->positives, "%s", c->name);
        CHECK(r.exact == 1 && r.auc_error_bound == 0);
        CHECK_MSG(fabs(r.auc - c->auc) <= 1e-13, "%s: auc %.17g vs numpy %.17g", c->name, r.auc, c->auc);
        CHECK_MSG(fabs(r.logloss - c->logloss) <= 1e-12 * c->logloss, "%s: logloss %.17g vs numpy %.17g", c->name,
                  r.logloss, c->logloss);
        CHECK_MSG(fabs(r.mean_p - c->mean_p) <= 1e-12, "%s: mean_p %.17g vs %.17g", c->name, r.mean_p, c->mean_p);
        /* The result can be asked for twice, and more added afterwards. */
        dt_binary_result again;
        CHECK(dt_binary_eval_result(e, &again, &err) == 0 && again.auc == r.auc);
        dt_binary_eval_free(e);
    }
}

/* A cap smaller than the pass: the histogram's AUC is within the bound it reports of the exact one,
 * and the bound is small where scores are distinct. Logloss does not depend on the mode. */
static void test_histogram_within_its_bound(void) {
    for (int k = 0; k < ncases; k++) {
        const ref_case *c = &cases[k];
        dt_binary_eval *e = NULL;
        dt_error err = {0};
        CHECK(dt_binary_eval_create(&e, 100, &err) == 0);
        feed(e, c);
        dt_binary_result r;
        CHECK(dt_binary_eval_result(e, &r, &err) == 0);
        CHECK(r.exact == 0 && r.examples == c->n);
        CHECK_MSG(fabs(r.auc - c->auc) <= r.auc_error_bound + 1e-12, "%s: histogram auc %.17g, exact %.17g, bound %g",
                  c->name, r.auc, c->auc, r.auc_error_bound);
        CHECK_MSG(fabs(r.logloss - c->logloss) <= 1e-12 * c->logloss, "%s", c->name);
        if (!strcmp(c->name, "ctr")) CHECK_MSG(r.auc_error_bound < 1e-4, "ctr bound %g", r.auc_error_bound);
        if (!strcmp(c->name, "ties")) CHECK(fabs(r.auc - c->auc) <= 1e-13); /* ties at 1/64: one bin each */
        dt_binary_eval_free(e);
    }
}

static void test_reset_and_empty(void) {
    dt_binary_eval *e = NULL;
    dt_error err = {0};
    CHECK(dt_binary_eval_create(&e, 10, &err) == 0);
    dt_binary_result r;
    CHECK(dt_binary_eval_result(e, &r, &err) == 0);
    CHECK(r.examples == 0 && isnan(r.auc) && isnan(r.logloss));
    float p[3] = {0.1f, 0.2f, 0.3f}, y1[3] = {1, 1, 1};
    CHECK(dt_binary_eval_add(e, p, y1, 3, &err) == 0);
    CHECK(dt_binary_eval_result(e, &r, &err) == 0);
    CHECK(r.examples == 3 && isnan(r.auc) && r.logloss > 0); /* one class only: AUC undefined */
    feed(e, &cases[1]);                                      /* past the cap of 10: histogram */
    CHECK(dt_binary_eval_result(e, &r, &err) == 0 && !r.exact);
    dt_binary_eval_reset(e);
    CHECK(dt_binary_eval_add(e, p, (float[]){0, 1, 1}, 3, &err) == 0);
    CHECK(dt_binary_eval_result(e, &r, &err) == 0);
    CHECK(r.exact && r.examples == 3 && r.auc == 1.0);
    dt_binary_eval_free(e);
}

static void test_refusals_name_the_row(void) {
    dt_binary_eval *e = NULL;
    dt_error err = {0};
    CHECK(dt_binary_eval_create(&e, 0, &err) == 0);
    float p[3] = {0.5f, NAN, 0.5f}, y[3] = {0, 1, 0};
    CHECK(dt_binary_eval_add(e, p, y, 3, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "row 1");
    p[1] = 1.5f;
    CHECK(dt_binary_eval_add(e, p, y, 3, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "not in [0, 1]");
    p[1] = 0.5f, y[2] = 2;
    CHECK(dt_binary_eval_add(e, p, y, 3, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "row 2: label 2 is not 0 or 1");
    dt_binary_result r;
    CHECK(dt_binary_eval_result(e, &r, &err) == 0 && r.examples == 0); /* nothing of a refused call */
    CHECK(dt_binary_eval_create(&(dt_binary_eval *){NULL}, DT_AUC_MAX_CAP + 1, &err) == DT_EINVAL);
    dt_binary_eval_free(e);
}

int main(void) {
    ncases = read_reference(cases, 16);
    RUN(test_exact_matches_numpy);
    RUN(test_histogram_within_its_bound);
    RUN(test_reset_and_empty);
    RUN(test_refusals_name_the_row);
    return test_summary();
}
