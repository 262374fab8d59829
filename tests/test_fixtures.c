/* Both shipped models against PyTorch: tests/fixtures/<model>.safetensors holds the logits, loss
 * and every parameter gradient that tests/fixtures/gen_fixtures.py computed in float64 for
 * parameters, inputs and labels from a hash formula; this test rebuilds the same values, runs
 * dtrain's float32 forward/loss/backward on the models built from the shipped model files, and compares.
 *
 * Tolerance ("1e-4 relative"): for every element, |ours - ref| <= 1e-4 * max(|ref|, floor) with
 * floor = 1e-2 * max|ref| over the tensor. The floor keeps elements that are tiny only because
 * their terms cancel from demanding more than float32 can give: their error is set by the size of
 * the terms, not of the sum. Fixtures need no torch: regenerate them only when the formula or the
 * models change. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/net.h"
#include "io/safetensors.h"
#include "test.h"

#define INPUT_ID 1000u
#define LABEL_ID 2000u

/* ---- the formula, as in gen_fixtures.py ---- */

static uint32_t h32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

static uint32_t raw_hash(uint32_t t, uint32_t i, uint32_t salt) {
    return h32(i * 0x9E3779B1u + t * 0x85EBCA77u + salt * 0xC2B2AE3Du);
}

static void fill(float *dst, size_t n, uint32_t t, double scale, uint32_t salt) {
    for (size_t i = 0; i < n; i++) {
        double v = ((double)(raw_hash(t, (uint32_t)i, salt) >> 8) + 0.5) / 8388608.0 - 1.0;
        dst[i] = (float)(scale * v);
    }
}

/* ---- fixture access, through the library's safetensors reader ---- */

/* Copies F32 tensor `name` to a new array; *n = its element count. NULL if absent. */
static float *st_get(const dt_st_file *f, const char *name, size_t *n) {
    const dt_st_info *t = dt_st_find(f, name);
    if (!t || t->dtype != DT_ST_F32) return NULL;
    float *out = malloc(t->count ? t->count * sizeof *out : sizeof *out);
    dt_error err;
    if (out && dt_st_read(f, name, DT_ST_F32, out, t->count, &err) != 0) {
        free(out);
        return NULL;
    }
    *n = (size_t)t->count;
    return out;
}

/* ---- comparison ---- */

/* Worst |a - ref| / max(|ref|, 1e-2 max|ref|) over n elements (see the top of the file). */
static double rel_err(const float *a, const double *ref, size_t n, size_t *where) {
    double mx = 0, worst = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
    double floor = 1e-2 * mx;
    *where = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - ref[i]) / fmax(fmax(fabs(ref[i]), floor), 1e-30);
        if (e > worst) worst = e, *where = i;
    }
    return worst;
}

#define TOL 1e-4

static void check_tensor(const char *model, const char *name, const float *ours, const double *ref, size_t n) {
    size_t at;
    double e = rel_err(ours, ref, n, &at);
    CHECK_MSG(e <= TOL, "%s %s: relative error %.3g at [%zu]: %.9g vs reference %.9g", model, name, e, at,
              (double)ours[at], ref[at]);
    if (getenv("SHOW_ERRORS")) fprintf(stderr, "  %s %-16s %zu values, worst relative error %.2e\n", model, name, n, e);
}

static void run_model(const char *model, const char *model_path, const char *fixture_path,
                      size_t expect_params) {
    dt_st_file *f = NULL;
    dt_error err = {0};
    if (dt_st_open(&f, fixture_path, &err) != 0) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    const char *mp = dt_st_meta_get(f, "model");
    CHECK(mp && strcmp(mp, model_path) == 0);
    int batch = dt_st_meta_get(f, "batch") ? atoi(dt_st_meta_get(f, "batch")) : 0;
    CHECK(batch >= 1 && batch <= 16);
    dt_net *net = NULL;
    int rc = dt_net_load(&net, model_path, batch > 0 ? batch : 1, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc || batch < 1) {
        dt_st_close(f);
        return;
    }
    if (expect_params) CHECK(dt_net_param_count(net) == expect_params);

    /* parameters from the formula, per view */
    float *params = dt_net_params(net);
    for (int v = 0; v < dt_net_num_views(net); v++) {
        const dt_param_view *pv = dt_net_view(net, v);
        char key[80];
        snprintf(key, sizeof key, "scale/%s", pv->name);
        const char *scale = dt_st_meta_get(f, key);
        snprintf(key, sizeof key, "salt/%s", pv->name);
        const char *salt = dt_st_meta_get(f, key);
        CHECK_MSG(scale && salt, "%s: fixture has no scale/salt for %s", model, pv->name);
        if (!scale || !salt) continue;
        fill(params + pv->offset, pv->count, (uint32_t)v, strtod(scale, NULL), (uint32_t)strtoul(salt, NULL, 10));
    }

    /* inputs and labels: the fixture keeps the first inputs and the labels to prove we agree */
    size_t in_n = (size_t)batch * dt_net_input_size(net), n;
    float *x = malloc(in_n * sizeof *x);
    fill(x, in_n, INPUT_ID, 1.0, 0);
    int32_t *labels = malloc((size_t)batch * sizeof *labels);
    int classes = dt_net_num_classes(net);
    for (int i = 0; i < batch; i++) labels[i] = (int32_t)(raw_hash(LABEL_ID, (uint32_t)i, 0) % (uint32_t)classes);
    float *probe = st_get(f, "input_probe", &n);
    CHECK(probe && n == 16 && memcmp(probe, x, 16 * sizeof *x) == 0);
    free(probe);
    float *flabels = st_get(f, "labels", &n);
    CHECK(flabels && n == (size_t)batch);
    for (int i = 0; flabels && i < batch; i++) CHECK(flabels[i] == (float)labels[i]);
    free(flabels);

    /* forward, loss, backward */
    const float *logits = dt_net_forward(net, x, batch, 1, 0);
    CHECK(logits != NULL);
    int correct = -1;
    float loss = dt_net_loss(net, labels, &correct);
    dt_net_backward(net);

    double *ref = malloc(sizeof(double) * (in_n > dt_net_param_count(net) ? in_n : dt_net_param_count(net)));
    float *rl = st_get(f, "logits", &n);
    CHECK(rl && n == (size_t)batch * (size_t)classes);
    if (rl && logits && n == (size_t)batch * (size_t)classes) {
        for (size_t i = 0; i < n; i++) ref[i] = rl[i];
        check_tensor(model, "logits", logits, ref, n);
        int ref_correct = 0;
        for (int b = 0; b < batch; b++) {
            int best = 0;
            for (int k = 1; k < classes; k++)
                if (rl[b * classes + k] > rl[b * classes + best]) best = k;
            ref_correct += best == labels[b];
        }
        CHECK(correct == ref_correct);
    }
    free(rl);
    float *rloss = st_get(f, "loss", &n);
    CHECK(rloss && n == 1);
    if (rloss) {
        ref[0] = rloss[0];
        check_tensor(model, "loss", &loss, ref, 1);
    }
    free(rloss);

    const float *grads = dt_net_grads(net);
    for (int v = 0; v < dt_net_num_views(net); v++) {
        const dt_param_view *pv = dt_net_view(net, v);
        char key[96];
        snprintf(key, sizeof key, "grad/%s", pv->name);
        float *g = st_get(f, key, &n);
        if (g) {
            CHECK_MSG(n == pv->count, "%s: %s has %zu values, view %zu", model, key, n, pv->count);
            if (n == pv->count) {
                for (size_t i = 0; i < n; i++) ref[i] = g[i];
                check_tensor(model, pv->name, grads + pv->offset, ref, n);
            }
            free(g);
            continue;
        }
        /* a large dense kernel's gradient, stored as its factors: grad[i][o] = sum_b in[b][i] dout[b][o] */
        size_t na, nb;
        snprintf(key, sizeof key, "grad/%s:in", pv->name);
        float *a = st_get(f, key, &na);
        snprintf(key, sizeof key, "grad/%s:dout", pv->name);
        float *d = st_get(f, key, &nb);
        int I = pv->shape[0], O = pv->shape[1];
        CHECK_MSG(a && d && pv->ndim == 2 && na == (size_t)batch * I && nb == (size_t)batch * O,
                  "%s: fixture lacks the gradient of %s", model, pv->name);
        if (a && d && pv->ndim == 2 && na == (size_t)batch * I && nb == (size_t)batch * O) {
            for (int i = 0; i < I; i++)
                for (int o = 0; o < O; o++) {
                    double s = 0;
                    for (int b = 0; b < batch; b++) s += (double)a[(size_t)b * I + i] * d[(size_t)b * O + o];
                    ref[(size_t)i * O + o] = s;
                }
            check_tensor(model, pv->name, grads + pv->offset, ref, pv->count);
        }
        free(a);
        free(d);
    }
    free(ref);
    free(x);
    free(labels);
    dt_net_free(net);
    dt_st_close(f);
}

static void test_fashion(void) {
    run_model("fashion", "models/fashion.model", "tests/fixtures/fashion.safetensors",
              9 * 32 + 32 + 9 * 32 * 64 + 64 + 3136 * 128 + 128 + 128 * 10 + 10);
}

static void test_catdog(void) {
    /* the source's model has 2,126,178 parameters */
    run_model("catdog", "models/catdog.model", "tests/fixtures/catdog.safetensors", 2126178);
}

/* The reader and the comparison must be able to fail: a perturbed gradient is caught. */
static void test_tolerance_bites(void) {
    float a[4] = {1.0f, -2.0f, 0.001f, 3.0f};
    double ref[4] = {1.0, -2.0, 0.001, 3.0};
    size_t at;
    CHECK(rel_err(a, ref, 4, &at) < 1e-6);
    a[1] = -2.0f * (1 + 2e-4f);
    CHECK(rel_err(a, ref, 4, &at) > TOL && at == 1);
    a[1] = -2.0f;
    a[2] = 0.001f + 2e-6f; /* 0.2% off, but below the floor (0.03): judged against 0.03 */
    CHECK(rel_err(a, ref, 4, &at) <= TOL);
    a[2] = 0.001f + 6e-6f;
    CHECK(rel_err(a, ref, 4, &at) > TOL && at == 2);
}

int main(void) {
    RUN(test_tolerance_bites);
    RUN(test_fashion);
    RUN(test_catdog);
    return test_summary();
}
