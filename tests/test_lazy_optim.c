/* The lazy optimizers (src/compute/lazy_optim.h) against a float64 reference of TensorFlow's
 * formulas (tests/fixtures/lazy_optim.safetensors, from gen_lazy_fixtures.py with numpy): several
 * updates with repeated ids (their rows summed first, dt_rowsum) and absent ids (untouched rows and
 * their slots stay bit for bit). The tolerance can fail: the same runs with duplicates applied one
 * by one, Adam's bias correction counted per row instead of per table, or a rate 0.1% off miss
 * the reference by far more. Also dt_rowsum, and the configuration's refusals. */
#include <stdint.h>

#include "compute/lazy_optim.h"
#include "compute/rowsum.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "test.h"

#define TOL 2e-6 /* relative to max(1, |reference|) */

enum { VARIANT_RIGHT, VARIANT_UNSUMMED, VARIANT_ROW_STEPS, VARIANT_RATE_OFF };

typedef struct {
    int rows, dim, steps, k;
    float *v0, *grads;
    int64_t *ids;
} fixture;

static double meta_num(const dt_st_file *f, const char *key, double dflt) {
    const char *v = dt_st_meta_get(f, key);
    return v ? atof(v) : dflt;
}

static void *read_tensor(const dt_st_file *f, const char *name, dt_st_dtype type, size_t count) {
    void *out = malloc(count * dt_st_dtype_size(type));
    dt_error e = {0};
    if (out && dt_st_read(f, name, type, out, count, &e) != DT_OK) {
        CHECK_MSG(0, "fixture: %s", e.msg);
        free(out);
        return NULL;
    }
    return out;
}

static int case_config(const dt_st_file *f, const char *name, dt_lazy_config *c) {
    char key[96];
    snprintf(key, sizeof key, "%s/kind", name);
    const char *kind = dt_st_meta_get(f, key);
    snprintf(key, sizeof key, "%s/lr", name);
    if (!kind || dt_lazy_config_init(c, kind, (float)meta_num(f, key, 0), NULL) != DT_OK) return 0;
    static const char *fields[] = {"initial_accumulator", "lr_power", "l1", "l2", "beta1", "beta2", "epsilon"};
    float *dst[] = {&c->initial_accumulator, &c->lr_power, &c->l1, &c->l2, &c->beta1, &c->beta2, &c->epsilon};
    for (int i = 0; i < 7; i++) {
        snprintf(key, sizeof key, "%s/%s", name, fields[i]);
        *dst[i] = (float)meta_num(f, key, *dst[i]);
    }
    return dt_lazy_config_check(c, NULL) == DT_OK;
}

/* Runs the fixture's updates on a table of rows (value then slots, one block each) the way a ps
 * does; checks after each update that rows it did not name are bit for bit as before. */
static void run(const fixture *fx, const dt_lazy_config *c, int variant, float *value, float *slots) {
    const int d = fx->dim, ns = dt_lazy_slots(c->kind);
    dt_lazy_config cc = *c;
    if (variant == VARIANT_RATE_OFF) cc.learning_rate *= 1.001f;
    memcpy(value, fx->v0, (size_t)fx->rows * d * sizeof *value);
    for (int r = 0; r < fx->rows; r++) dt_lazy_init_slots(&cc, slots + (size_t)r * ns * d, d);
    int *row_updates = calloc((size_t)fx->rows, sizeof *row_updates);
    float *before = malloc((size_t)fx->rows * d * (1 + ns) * sizeof *before);
    dt_rowsum sum;
    dt_rowsum_init(&sum, d);
    CHECK(dt_rowsum_reserve(&sum, (size_t)fx->k, NULL) == DT_OK);
    for (int t = 0; t < fx->steps; t++) {
        memcpy(before, value, (size_t)fx->rows * d * sizeof *value);
        memcpy(before + (size_t)fx->rows * d, slots, (size_t)fx->rows * d * ns * sizeof *slots);
        dt_rowsum_clear(&sum);
        const dt_lazy_rates rates = dt_lazy_rates_at(&cc, t);
        for (int k = 0; k < fx->k; k++) {
            const int64_t id = fx->ids[(size_t)t * fx->k + k];
            const float *g = fx->grads + ((size_t)t * fx->k + k) * d;
            if (variant == VARIANT_UNSUMMED)
                dt_lazy_apply_row(&cc, &rates, value + id * d, slots + id * ns * d, g, d);
            else
                dt_rowsum_add(&sum, (uint64_t)id, g);
        }
        for (size_t u = 0; u < sum.n; u++) {
            const uint64_t id = sum.ids[u];
            dt_lazy_rates r = variant == VARIANT_ROW_STEPS ? dt_lazy_rates_at(&cc, row_updates[id]) : rates;
            dt_lazy_apply_row(&cc, &r, value + id * d, slots + id * ns * d, sum.rows + u * d, d);
            row_updates[id]++;
        }
        for (int r = 0; r < fx->rows && variant == VARIANT_RIGHT; r++) {
            int named = 0;
            for (int k = 0; k < fx->k; k++) named |= fx->ids[(size_t)t * fx->k + k] == r;
            if (named) continue;
            CHECK_MSG(!memcmp(value + r * d, before + r * d, (size_t)d * sizeof *value), "step %d: row %d moved", t, r);
            CHECK_MSG(!memcmp(slots + (size_t)r * ns * d, before + (size_t)fx->rows * d + (size_t)r * ns * d,
                              (size_t)ns * d * sizeof *slots), "step %d: slots of row %d moved", t, r);
        }
    }
    dt_rowsum_free(&sum);
    free(row_updates);
    free(before);
}

/* Largest error of the run against the reference, relative to max(1, |reference|). */
static double case_error(const dt_st_file *f, const fixture *fx, const char *name, int variant) {
    dt_lazy_config c;
    CHECK_MSG(case_config(f, name, &c), "%s: configuration from the fixture", name);
    const int d = fx->dim, ns = dt_lazy_slots(c.kind);
    const size_t n = (size_t)fx->rows * d;
    float *value = malloc(n * sizeof *value), *slots = malloc((ns ? ns : 1) * n * sizeof *slots);
    run(fx, &c, variant, value, slots);
    double err = 0;
    char key[96];
    snprintf(key, sizeof key, "%s/value", name);
    double *want = read_tensor(f, key, DT_ST_F64, n);
    for (size_t i = 0; want && i < n; i++) err = fmax(err, fabs(value[i] - want[i]) / fmax(1.0, fabs(want[i])));
    free(want);
    for (int k = 0; k < ns; k++) {
        snprintf(key, sizeof key, "%s/slot%d", name, k);
        want = read_tensor(f, key, DT_ST_F64, n);
        for (int r = 0; want && r < fx->rows; r++)
            for (int j = 0; j < d; j++) {
                double got = slots[(size_t)r * ns * d + (size_t)k * d + j], w = want[(size_t)r * d + j];
                err = fmax(err, fabs(got - w) / fmax(1.0, fabs(w)));
            }
        free(want);
    }
    /* Rows 7.. are never named: bit for bit v0 and the initial slots. */
    float init[DT_LAZY_MAX_SLOTS * 8];
    dt_lazy_init_slots(&c, init, d);
    for (int r = 7; variant == VARIANT_RIGHT && r < fx->rows; r++) {
        CHECK_MSG(!memcmp(value + r * d, fx->v0 + r * d, (size_t)d * sizeof *value), "%s: untouched row %d", name, r);
        CHECK_MSG(!memcmp(slots + (size_t)r * ns * d, init, (size_t)ns * d * sizeof *slots), "%s: slots of row %d", name, r);
    }
    free(value), free(slots);
    return err;
}

static void test_against_reference(void) {
    dt_st_file *f = NULL;
    dt_error e = {0};
    if (dt_st_open(&f, "tests/fixtures/lazy_optim.safetensors", &e) != DT_OK) {
        CHECK_MSG(0, "%s (make it with /usr/bin/python3 tests/fixtures/gen_lazy_fixtures.py)", e.msg);
        return;
    }
    fixture fx = {.rows = (int)meta_num(f, "rows", 0), .dim = (int)meta_num(f, "dim", 0),
                  .steps = (int)meta_num(f, "steps", 0), .k = (int)meta_num(f, "k", 0)};
    CHECK(fx.rows == 10 && fx.dim > 0 && fx.dim <= 8 && fx.steps >= 3 && fx.k > 0);
    fx.v0 = read_tensor(f, "v0", DT_ST_F32, (size_t)fx.rows * fx.dim);
    fx.ids = read_tensor(f, "ids", DT_ST_I64, (size_t)fx.steps * fx.k);
    fx.grads = read_tensor(f, "grads", DT_ST_F32, (size_t)fx.steps * fx.k * fx.dim);
    for (size_t i = 0; fx.ids && i < (size_t)fx.steps * fx.k; i++) CHECK(fx.ids[i] >= 0 && fx.ids[i] < 7);
    static const char *cases[] = {"sgd", "adagrad", "ftrl", "ftrl_pow", "adam"};
    for (size_t i = 0; fx.v0 && fx.ids && fx.grads && i < sizeof cases / sizeof *cases; i++) {
        double err = case_error(f, &fx, cases[i], VARIANT_RIGHT);
        CHECK_MSG(err < TOL, "%s: max relative error %g against the float64 reference", cases[i], err);
        if (getenv("DT_TEST_VERBOSE")) fprintf(stderr, "%s: max relative error %.3g\n", cases[i], err);
        /* The tolerance bites: a rate 0.1% off misses by far more, and so (but for sgd, which is
         * linear) do duplicates applied one by one; Adam's bias correction counted per row too. */
        double off = case_error(f, &fx, cases[i], VARIANT_RATE_OFF);
        CHECK_MSG(off > 5 * TOL, "%s: a rate 0.1%% off is within %g of the reference", cases[i], off);
        if (strcmp(cases[i], "sgd") != 0) {
            off = case_error(f, &fx, cases[i], VARIANT_UNSUMMED);
            CHECK_MSG(off > 100 * TOL, "%s: duplicates applied one by one are within %g", cases[i], off);
        }
        if (!strcmp(cases[i], "adam")) {
            off = case_error(f, &fx, cases[i], VARIANT_ROW_STEPS);
            CHECK_MSG(off > 100 * TOL, "adam: per-row bias correction is within %g", off);
        }
    }
    free(fx.v0), free(fx.ids), free(fx.grads);
    dt_st_close(f);
}

static void test_config(void) {
    dt_lazy_config c;
    dt_error e = {0};
    CHECK(dt_lazy_config_init(&c, "momentum", 0.1f, &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "momentum");
    CHECK(dt_lazy_config_init(&c, "ftrl", 0.0f, &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "learning_rate");
    CHECK(dt_lazy_config_init(&c, "ftrl", 0.1f, NULL) == DT_OK);
    CHECK(dt_lazy_slots(c.kind) == 2 && c.lr_power == -0.5f && c.initial_accumulator == 0.1f);
    c.l1 = -1;
    CHECK(dt_lazy_config_check(&c, &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "l1");
    c.l1 = 0, c.lr_power = 0.5f;
    CHECK(dt_lazy_config_check(&c, &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "lr_power");
    CHECK(dt_lazy_config_init(&c, "adagrad", 0.1f, NULL) == DT_OK);
    c.initial_accumulator = 0;
    CHECK(dt_lazy_config_check(&c, &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "initial_accumulator");
    CHECK(dt_lazy_config_init(&c, "adam", 0.1f, NULL) == DT_OK);
    c.beta2 = 1.0f;
    CHECK(dt_lazy_config_check(&c, &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "beta2");
    CHECK(dt_lazy_slots(DT_LAZY_SGD) == 0 && dt_lazy_slots(DT_LAZY_ADAGRAD) == 1 && dt_lazy_slots(DT_LAZY_ADAM) == 2);
    CHECK(!strcmp(dt_lazy_name(DT_LAZY_FTRL), "ftrl") && !strcmp(dt_lazy_name((dt_lazy_kind)9), "?"));
}

/* First-seen order, sums in the order given, counts; growth past the first reserve; ids only. */
static void test_rowsum(void) {
    dt_rowsum s;
    dt_rowsum_init(&s, 2);
    CHECK(dt_rowsum_add(&s, 1, NULL) == (size_t)-1); /* no room reserved */
    CHECK(dt_rowsum_reserve(&s, 3, NULL) == DT_OK);
    const float a[2] = {1, 2}, b[2] = {10, 20}, c[2] = {0.5f, 0.25f};
    CHECK(dt_rowsum_add(&s, 42, a) == 0);
    CHECK(dt_rowsum_add(&s, 7, b) == 1);
    CHECK(dt_rowsum_add(&s, 42, c) == 0);
    CHECK(s.n == 2 && s.ids[0] == 42 && s.ids[1] == 7 && s.count[0] == 2 && s.count[1] == 1);
    CHECK(s.rows[0] == 1.5f && s.rows[1] == 2.25f && s.rows[2] == 10 && s.rows[3] == 20);
    CHECK(dt_rowsum_find(&s, 7) == 1 && dt_rowsum_find(&s, 8) == (size_t)-1);
    CHECK(dt_rowsum_reserve(&s, 10000, NULL) == DT_OK);
    for (uint64_t i = 0; i < 10000; i++) dt_rowsum_add(&s, i * 0x9e3779b97f4a7c15ULL, a);
    CHECK(s.n == 10002 && s.ids[0] == 42 && dt_rowsum_find(&s, 7) == 1 && s.rows[0] == 1.5f);
    CHECK(dt_rowsum_find(&s, 5000 * 0x9e3779b97f4a7c15ULL) == 5002);
    dt_rowsum_clear(&s);
    CHECK(s.n == 0 && dt_rowsum_find(&s, 42) == (size_t)-1 && dt_rowsum_add(&s, 9, NULL) == 0 && s.rows[0] == 0);
    dt_rowsum_free(&s);
    dt_rowsum_init(&s, 0); /* ids only: a worker uniques a batch */
    CHECK(dt_rowsum_reserve(&s, 4, NULL) == DT_OK);
    uint64_t ids[6] = {5, 3, 5, 5, 9, 3};
    size_t pos[6];
    for (int i = 0; i < 6; i++) pos[i] = dt_rowsum_add(&s, ids[i], NULL);
    CHECK(s.n == 3 && pos[0] == 0 && pos[1] == 1 && pos[2] == 0 && pos[4] == 2 && pos[5] == 1 && s.count[0] == 3);
    dt_rowsum_free(&s);
}

int main(void) {
    RUN(test_config);
    RUN(test_rowsum);
    RUN(test_against_reference);
    return test_summary();
}
