/* Both shipped models against PyTorch: tests/fixtures/<model>.safetensors holds the logits, loss
 * and every parameter gradient that tests/fixtures/gen_fixtures.py computed in float64 for
 * parameters, inputs and labels from a hash formula; this test rebuilds the same values, runs
 * dtrain's float32 forward/loss/backward on the models built from the shipped model files, and compares.
 *
 * Tolerance ("1e-4 relative"): for every element, |ours - ref| <= 1e-4 * max(|ref|, floor) with
 * floor = 1e-2 * max|ref| over the tensor. The floor keeps elements that are tiny only because
 * their terms cancel from demanding more than float32 can give: their error is set by the size of
 * the terms, not of the sum. Fixtures need no torch: regenerate them only when the formula or the
 * models change.
 *
 * `test_fixtures cuda` (ctest test_fixtures_cuda, label gpu) runs the same comparisons with the nets on
 * the CUDA backend (docs/gpu.md): the shipped models against PyTorch, every other layer the backend
 * has against the CPU (tests/fixtures/cuda_layers.model), and a model with batch norm refused. With
 * no GPU (or a build without CUDA) it says why and exits 77, which ctest reports as skipped. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/cuda.h"
#include "model/net.h"
#include "io/safetensors.h"
#include "hash32.h"
#include "test.h"

/* "cuda" when the nets run on the GPU (main's argument), else NULL. */
static const char *g_device;

/* Puts net on g_device (if any); 0 when that failed (a check has failed then). */
static int to_device(dt_net *net, const char *what) {
    if (!g_device) return 1;
    dt_error err = {0};
    int rc = dt_net_set_device(net, g_device, &err);
    CHECK_MSG(rc == 0, "%s on %s: %s", what, g_device, err.msg);
    return rc == 0;
}

/* A device failure (a kernel, a copy) after a step, named. */
static void check_device(const dt_net *net, const char *what) {
    dt_error err = {0};
    int rc = dt_net_status(net, &err);
    CHECK_MSG(rc == 0, "%s: %s", what, err.msg);
}

#define INPUT_ID 1000u
#define LABEL_ID 2000u

/* ---- the formula, as in gen_fixtures.py ---- */

static uint32_t raw_hash(uint32_t t, uint32_t i, uint32_t salt) {
    return h32(i * 0x9E3779B1u + t * 0x85EBCA77u + salt * 0xC2B2AE3Du);
}

/* float32(offset + scale * v): offset is 0 except for batch norm's gamma and variance (> 0) */
static void fill(float *dst, size_t n, uint32_t t, double scale, double offset, uint32_t salt) {
    for (size_t i = 0; i < n; i++) {
        double v = ((double)(raw_hash(t, (uint32_t)i, salt) >> 8) + 0.5) / 8388608.0 - 1.0;
        dst[i] = (float)(offset + scale * v);
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

/* A reference that is 0 in exact arithmetic (a conv's bias before a batch norm: the norm removes
 * any constant) is float64 rounding noise; ours must be float32 noise around 0 then. */
#define EXACT_ZERO 1e-12
#define ZERO_TOL 1e-6

static void check_tensor(const char *model, const char *name, const float *ours, const double *ref, size_t n) {
    size_t at;
    double mx = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
    if (mx < EXACT_ZERO) {
        double worst = 0;
        for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)ours[i]));
        CHECK_MSG(worst <= ZERO_TOL, "%s %s: reference is 0, ours reaches %.3g", model, name, worst);
        return;
    }
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
    if (!to_device(net, model)) {
        dt_net_free(net);
        dt_st_close(f);
        return;
    }

    /* parameters from the formula, per view */
    float *params = dt_net_params(net);
    for (int v = 0; v < dt_net_num_views(net); v++) {
        const dt_param_view *pv = dt_net_view(net, v);
        char key[80];
        snprintf(key, sizeof key, "scale/%s", pv->name);
        const char *scale = dt_st_meta_get(f, key);
        snprintf(key, sizeof key, "salt/%s", pv->name);
        const char *salt = dt_st_meta_get(f, key);
        snprintf(key, sizeof key, "offset/%s", pv->name);
        const char *offset = dt_st_meta_get(f, key);
        CHECK_MSG(scale && salt, "%s: fixture has no scale/salt for %s", model, pv->name);
        if (!scale || !salt) continue;
        fill(params + pv->offset, pv->count, (uint32_t)v, strtod(scale, NULL), offset ? strtod(offset, NULL) : 0.0,
             (uint32_t)strtoul(salt, NULL, 10));
    }

    /* inputs and labels: the fixture keeps the first inputs and the labels to prove we agree */
    size_t in_n = (size_t)batch * dt_net_input_size(net), n;
    float *x = malloc(in_n * sizeof *x);
    fill(x, in_n, INPUT_ID, 1.0, 0.0, 0);
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

    double *ref = malloc(sizeof(double) * (in_n > dt_net_param_count(net) ? in_n : dt_net_param_count(net)));
    /* evaluation first (it reads the moving statistics training then updates): batch norm folded
     * into the conv before it, and not */
    float *rel = st_get(f, "eval_logits", &n);
    if (rel) {
        CHECK(n == (size_t)batch * (size_t)classes);
        for (size_t i = 0; i < n; i++) ref[i] = rel[i];
        for (int fold = 1; fold >= 0 && n == (size_t)batch * (size_t)classes; fold--) {
            dt_net_set_fold_batchnorm(net, fold);
            const float *el = dt_net_forward(net, x, batch, 0, 0, NULL);
            CHECK(el != NULL);
            if (el) check_tensor(model, fold ? "eval_logits (folded)" : "eval_logits", el, ref, n);
        }
        free(rel);
    }

    /* forward, loss, backward */
    const float *logits = dt_net_forward(net, x, batch, 1, 0, NULL);
    CHECK(logits != NULL);
    int correct = -1;
    float loss = dt_net_loss(net, labels, &correct);
    dt_net_backward(net, NULL);
    check_device(net, model);

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
        if (pv->not_trained) { /* moving statistics: updated by the forward pass, never trained */
            snprintf(key, sizeof key, "moving/%s", pv->name);
            float *m = st_get(f, key, &n);
            CHECK_MSG(m && n == pv->count, "%s: fixture lacks %s", model, key);
            if (m && n == pv->count) {
                for (size_t i = 0; i < n; i++) ref[i] = m[i];
                check_tensor(model, key, params + pv->offset, ref, n);
            }
            free(m);
            for (size_t i = 0; i < pv->count; i++) CHECK(grads[pv->offset + i] == 0.0f);
            continue;
        }
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

/* Every layer kind residual networks brought (tests/fixtures/layers.model), and the shipped ResNet. */
static void test_layers(void) {
    run_model("layers", "tests/fixtures/layers.model", "tests/fixtures/layers.safetensors", 0);
}

static void test_resnet(void) {
    run_model("resnet", "models/resnet.model", "tests/fixtures/resnet.safetensors", 273754);
}

/* ---- the CUDA backend ---- */

/* Every layer kind the CUDA backend has beyond the shipped models', against the CPU backend (itself
 * checked against PyTorch above): logits, loss, correct count and every gradient, 1e-4 as above. */
static void test_cuda_layers(void) {
    const char *path = "tests/fixtures/cuda_layers.model";
    const int batch = 5;
    dt_error err = {0};
    dt_net *cpu = NULL, *gpu = NULL;
    CHECK_MSG(dt_net_load(&cpu, path, batch, &err) == 0, "%s", err.msg);
    CHECK_MSG(dt_net_load(&gpu, path, batch, &err) == 0, "%s", err.msg);
    if (!cpu || !gpu || !to_device(gpu, path)) {
        dt_net_free(cpu), dt_net_free(gpu);
        return;
    }
    size_t np = dt_net_param_count(cpu), in_n = (size_t)batch * dt_net_input_size(cpu);
    int classes = dt_net_num_classes(cpu);
    fill(dt_net_params(cpu), np, 1, 0.5, 0.0, 7);
    memcpy(dt_net_params(gpu), dt_net_params(cpu), np * sizeof(float));
    float *x = malloc(in_n * sizeof *x);
    int32_t labels[5];
    double *ref = malloc((np > in_n ? np : in_n) * sizeof *ref);
    fill(x, in_n, INPUT_ID, 1.0, 0.0, 7);
    for (int i = 0; i < batch; i++) labels[i] = (int32_t)(raw_hash(LABEL_ID, (uint32_t)i, 7) % (uint32_t)classes);
    for (int training = 0; training <= 1; training++) {
        const float *lc = dt_net_forward(cpu, x, batch, training, 42, NULL), *lg = dt_net_forward(gpu, x, batch, training, 42, NULL);
        int cc = -1, cg = -2;
        float loss_c = dt_net_loss(cpu, labels, &cc), loss_g = dt_net_loss(gpu, labels, &cg);
        check_device(gpu, training ? "training forward" : "evaluation forward");
        CHECK(lc && lg);
        if (!lc || !lg) break;
        for (size_t i = 0; i < (size_t)batch * classes; i++) ref[i] = lc[i];
        check_tensor("cuda_layers", training ? "logits" : "eval logits", lg, ref, (size_t)batch * classes);
        ref[0] = loss_c;
        check_tensor("cuda_layers", "loss", &loss_g, ref, 1);
        CHECK(cc == cg);
    }
    dt_net_backward(cpu, NULL);
    dt_net_backward(gpu, NULL);
    check_device(gpu, "backward");
    for (int v = 0; v < dt_net_num_views(cpu); v++) {
        const dt_param_view *pv = dt_net_view(cpu, v);
        for (size_t i = 0; i < pv->count; i++) ref[i] = dt_net_grads(cpu)[pv->offset + i];
        check_tensor("cuda_layers", pv->name, dt_net_grads(gpu) + pv->offset, ref, pv->count);
    }
    free(x);
    free(ref);
    dt_net_free(cpu);
    dt_net_free(gpu);
}

/* Batch norm has no CUDA kernels yet: the net is refused naming the layer, and stays usable on the CPU. */
static void test_cuda_refuses_batchnorm(void) {
    dt_error err = {0};
    dt_net *net = NULL;
    CHECK_MSG(dt_net_load(&net, "tests/fixtures/layers.model", 2, &err) == 0, "%s", err.msg);
    if (!net) return;
    CHECK(dt_net_set_device(net, g_device, &err) != 0);
    CHECK_CONTAINS(err.msg, "not supported on cuda yet: layer bn1 (batchnorm)");
    CHECK(strcmp(dt_net_device(net), "cpu") == 0);
    float x[2 * 12 * 12 * 2] = {0};
    CHECK(dt_net_forward(net, x, 2, 0, 0, NULL) != NULL);
    dt_net_free(net);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "cuda") == 0) {
        /* skip (77) unless a device opens; the reason goes to the log */
        dt_error err = {0};
        dt_cuda *cuda = NULL;
        if (dt_cuda_open(&cuda, 0, &err) != 0) {
            fprintf(stderr, "skipped: %s\n", err.msg);
            return 77;
        }
        char desc[320];
        dt_backend b = dt_cuda_backend(cuda);
        b.ops->describe(b.ctx, desc, sizeof desc);
        fprintf(stderr, "device: %s\n", desc);
        g_device = "cuda";
        RUN(test_fashion);
        RUN(test_catdog);
        RUN(test_cuda_layers);
        RUN(test_cuda_refuses_batchnorm);
        dt_cuda_close(cuda);
        return test_summary();
    }
    RUN(test_tolerance_bites);
    RUN(test_fashion);
    RUN(test_catdog);
    RUN(test_layers);
    RUN(test_resnet);
    RUN(test_cuda_layers); /* here CPU against CPU: the model and the comparison, ready for the GPU run */
    return test_summary();
}
