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

#include "compute/cpu.h"
#include "compute/cuda.h"
#include "compute/kernels.h"
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
        int ni = pv->shape[0], no = pv->shape[1]; /* not I: complex.h defines it (cblas.h, compute/cpu.h) */
        CHECK_MSG(a && d && pv->ndim == 2 && na == (size_t)batch * ni && nb == (size_t)batch * no,
                  "%s: fixture lacks the gradient of %s", model, pv->name);
        if (a && d && pv->ndim == 2 && na == (size_t)batch * ni && nb == (size_t)batch * no) {
            for (int i = 0; i < ni; i++)
                for (int o = 0; o < no; o++) {
                    double s = 0;
                    for (int b = 0; b < batch; b++) s += (double)a[(size_t)b * ni + i] * d[(size_t)b * no + o];
                    ref[(size_t)i * no + o] = s;
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

/* ---- bf16 (--precision bf16): single layers against float64 --------------------------------- */
/* tests/fixtures/bf16_layers.safetensors (gen_bf16_fixtures.py) holds, per layer and output T, the
 * float64 reference, S1 = sum_k |a_k b_k| per element, S2 = sum_k (a_k b_k)^2 over the tensor, K the
 * terms per element, and the error of PyTorch's bf16 autocast on the same layer. A bf16 product rounds
 * both operands to 8 significant bits (u = 2^-8, ties to even) and adds exact products in float32:
 *   every element   |T~ - T| <= (2u + u^2 + gamma_K) S1,  gamma_K = k 2^-24 / (1 - k 2^-24), k = 2K + 16
 *                   (float32 additions: two per term where a kernel adds pairs, and the transforms'),
 *                   plus 4 * 2^-24 |T| (the reference stored in float32, the bias added in float32);
 *   mean square     u^2/6 <= sum (T~ - T)^2 / S2 <= 2u^2/3 in expectation (independent roundings, each
 *                   uniform in half an ulp: mean square relative error u^2/12 .. u^2/3 as the
 *                   significand runs 2 .. 1): the sum is checked within [1/2, 2] of those ends;
 *   against PyTorch its root mean square error is no larger than autocast's.
 * A layer of Winograd's shape runs im2col in bf16 (conv_cpu.c says why): its bounds are im2col's. */

#define BF16_U (1.0 / 256.0)
#define F32_U (1.0 / 16777216.0)

static double meta_num(const dt_st_file *f, const char *layer, const char *key) {
    char k[128];
    snprintf(k, sizeof k, "%s%s", layer, key);
    const char *v = dt_st_meta_get(f, k);
    CHECK_MSG(v != NULL, "bf16 fixture lacks %s", k);
    return v ? strtod(v, NULL) : NAN;
}

/* Checks ours [n] (a layer's output T) against the fixture's reference, as above. */
static void check_bf16(const dt_st_file *f, const char *layer, const char *key, const float *ours, size_t n) {
    char name[128], mkey[64];
    size_t nr = 0, ns = 0;
    snprintf(name, sizeof name, "%s/%s", layer, key);
    float *ref = st_get(f, name, &nr);
    snprintf(name, sizeof name, "%s/%s:s1", layer, key);
    float *s1 = st_get(f, name, &ns);
    CHECK_MSG(ref && s1 && nr == n && ns == n, "%s/%s: fixture has %zu and %zu values, ours %zu", layer, key, nr, ns,
              n);
    snprintf(mkey, sizeof mkey, "/%s:", key);
    char *end = mkey + strlen(mkey);
    strcpy(end, "s2");
    double s2 = meta_num(f, layer, mkey);
    strcpy(end, "k");
    double k = 2 * meta_num(f, layer, mkey) + 16;
    strcpy(end, "torch_rms");
    double torch_rms = meta_num(f, layer, mkey);
    strcpy(end, "torch_max");
    double torch_max = meta_num(f, layer, mkey);
    if (ref && s1 && nr == n && ns == n) {
        const double gamma = k * F32_U / (1 - k * F32_U), c1 = 2 * BF16_U + BF16_U * BF16_U + gamma;
        double worst = 0, sq = 0, mx = 0;
        size_t at = 0;
        for (size_t i = 0; i < n; i++) {
            double e = fabs((double)ours[i] - ref[i]), bound = c1 * s1[i] + 4 * F32_U * fabs(ref[i]);
            if (e > worst * bound) worst = bound > 0 ? e / bound : INFINITY, at = i;
            sq += e * e;
            mx = fmax(mx, e);
        }
        const double ms = s2 > 0 ? sq / s2 : NAN, lo = BF16_U * BF16_U / 6, hi = 2 * BF16_U * BF16_U / 3;
        const double rms = sqrt(sq / (double)n);
        CHECK_MSG(worst <= 1, "bf16 %s/%s: [%zu] = %.9g, reference %.9g: %.3g of the bound", layer, key, at,
                  (double)ours[at], (double)ref[at], worst);
        CHECK_MSG(ms >= lo / 2 && ms <= 2 * hi,
                  "bf16 %s/%s: sum of squared errors / S2 = %.3g u^2, expected %.3g..%.3g", layer, key,
                  ms / (BF16_U * BF16_U), lo / (BF16_U * BF16_U), hi / (BF16_U * BF16_U));
        CHECK_MSG(rms <= torch_rms, "bf16 %s/%s: rms error %.3g, PyTorch's autocast %.3g", layer, key, rms, torch_rms);
        if (getenv("SHOW_ERRORS"))
            fprintf(stderr, "  bf16 %-15s %-3s %6zu values: worst %.2f of the bound, mean square %.3f u^2 S2 "
                    "(%.3f..%.3f), rms %.3g (autocast %.3g), max %.3g (autocast %.3g)\n", layer, key, n, worst,
                    ms / (BF16_U * BF16_U), lo / (BF16_U * BF16_U), hi / (BF16_U * BF16_U), rms, torch_rms, mx,
                    torch_max);
    }
    free(ref);
    free(s1);
}

/* One layer of the fixture, at 1 and 2 threads (the same bits), against the reference; its bias
 * gradient, never a bf16 product, is float32's (to float32's rounding: bf16's would be 2^-8 off). */
static void bf16_layer(const dt_st_file *f, const char *layer, int li) {
    char key[96];
    snprintf(key, sizeof key, "%s:kind", layer);
    const char *kind = dt_st_meta_get(f, key);
    snprintf(key, sizeof key, "%s:geometry", layer);
    const char *geo = dt_st_meta_get(f, key);
    CHECK(kind && geo);
    if (!kind || !geo) return;
    const int batch = (int)meta_num(f, layer, ":batch");
    const int dense = !strcmp(kind, "dense");
    int v[7] = {0};
    char pad[16] = "";
    if (dense) CHECK(sscanf(geo, "%d,%d", &v[0], &v[1]) == 2);
    else CHECK(sscanf(geo, "%d,%d,%d,%d,%d,%d,%15s", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], pad) == 7);
    dt_window g = {0};
    dt_error err = {0};
    size_t nx, nw, nb, ny;
    if (dense) {
        nx = (size_t)batch * v[0], nw = (size_t)v[0] * v[1], nb = (size_t)v[1], ny = (size_t)batch * v[1];
    } else {
        int rc = dt_window_init(&g, v[0], v[1], v[2], v[3], v[4], v[4], v[5], v[5],
                                strcmp(pad, "same") ? DT_PAD_VALID : DT_PAD_SAME, &err);
        CHECK_MSG(rc == 0, "%s", err.msg);
        if (rc) return;
        snprintf(key, sizeof key, "%s:winograd_shape", layer); /* Winograd's in float32, im2col in bf16 */
        CHECK_MSG(dt_wino_applies(&g) == (dt_st_meta_get(f, key) != NULL), "%s: Winograd's shape or not, as the "
                  "fixture says", layer);
        nx = (size_t)batch * v[0] * v[1] * v[2], nw = (size_t)v[4] * v[4] * v[2] * v[3], nb = (size_t)v[3];
        ny = (size_t)batch * g.out_h * g.out_w * v[3];
    }
    float *x = malloc(nx * sizeof *x), *w = malloc(nw * sizeof *w), *b = malloc(nb * sizeof *b);
    float *dout = malloc(ny * sizeof *dout), *out[3], *dx[3], *dw[3], *db[3];
    float *scratch = dense ? NULL : malloc((dt_conv2d_scratch_floats(&g, batch) + 1) * sizeof *scratch);
    fill(x, nx, 10u * li, meta_num(f, layer, ":scale/x"), 0, 0);
    fill(w, nw, 10u * li + 1, meta_num(f, layer, ":scale/w"), 0, 0);
    fill(b, nb, 10u * li + 2, meta_num(f, layer, ":scale/b"), 0, 0);
    fill(dout, ny, 10u * li + 3, 1.0, 0, 0);
    snprintf(key, sizeof key, "%s:probe", layer);
    const char *probe = dt_st_meta_get(f, key);
    CHECK_MSG(probe && fabs(strtod(probe, NULL) - x[0]) <= 1e-7 * fabs(x[0]), "%s: the inputs are the fixture's",
              layer);
    /* runs: bf16 on 1 thread, bf16 on 2 (every loop in parallel), float32 */
    for (int r = 0; r < 3; r++) {
        dt_cpu cpu;
        dt_cpu_init(&cpu, r == 1 ? 2 : 1);
        cpu.par_always = r == 1;
        cpu.bf16 = r < 2;
        out[r] = malloc(ny * sizeof(float)), dx[r] = malloc(nx * sizeof(float));
        dw[r] = malloc(nw * sizeof(float)), db[r] = malloc(nb * sizeof(float));
        if (dense) {
            dt_dense_forward(&cpu, out[r], x, w, b, batch, v[0], v[1]);
            dt_dense_backward(&cpu, dx[r], dw[r], db[r], dout, x, w, batch, v[0], v[1]);
        } else {
            dt_conv2d_forward(&cpu, out[r], x, w, b, batch, &g, scratch);
            dt_conv2d_backward(&cpu, dx[r], dw[r], db[r], dout, x, w, batch, &g, scratch);
        }
    }
    check_bf16(f, layer, "y", out[0], ny);
    check_bf16(f, layer, "dx", dx[0], nx);
    check_bf16(f, layer, "dw", dw[0], nw);
    CHECK_MSG(!memcmp(out[0], out[1], ny * sizeof(float)) && !memcmp(dx[0], dx[1], nx * sizeof(float)) &&
              !memcmp(dw[0], dw[1], nw * sizeof(float)), "bf16 %s: 1 and 2 threads give the same bits", layer);
    double dbd = 0, dbm = 0; /* float32 sums, in another order where float32 runs Winograd */
    for (size_t i = 0; i < nb; i++) dbd = fmax(dbd, fabs((double)db[0][i] - db[2][i])), dbm = fmax(dbm, fabs(db[2][i]));
    CHECK_MSG(dbd <= 1e-5 * dbm, "bf16 %s: the bias gradient is %.3g off float32's (of %.3g)", layer, dbd, dbm);
    for (int r = 0; r < 3; r++) free(out[r]), free(dx[r]), free(dw[r]), free(db[r]);
    free(x), free(w), free(b), free(dout), free(scratch);
}

static void test_bf16_layers(void) {
    if (!dt_cpu_has_bf16()) {
        fprintf(stderr, "  skipped: this CPU lacks AVX512_BF16\n");
        return;
    }
    dt_st_file *f = NULL;
    dt_error err = {0};
    if (dt_st_open(&f, "tests/fixtures/bf16_layers.safetensors", &err) != 0) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    const char *layers = dt_st_meta_get(f, "layers");
    CHECK(layers != NULL);
    char list[512];
    snprintf(list, sizeof list, "%s", layers ? layers : "");
    int li = 0;
    for (char *save = NULL, *L = strtok_r(list, ",", &save); L; L = strtok_r(NULL, ",", &save), li++)
        bf16_layer(f, L, li);
    CHECK(li == 7);
    dt_st_close(f);
}

/* The fused conv + max pool in bf16 is the bf16 conv and the pool run apart (to float32 rounding:
 * its products cover other rows at once), and not float32's. */
static void test_bf16_fused(void) {
    dt_window cg, pg;
    dt_error err = {0};
    const int batch = 2;
    CHECK(dt_window_init(&cg, 14, 14, 1, 16, 3, 3, 1, 1, DT_PAD_SAME, &err) == 0);
    CHECK(dt_window_init(&pg, 14, 14, 16, 16, 2, 2, 2, 2, DT_PAD_SAME, &err) == 0);
    CHECK(dt_conv2d_maxpool_fusable(&cg, &pg));
    size_t nx = (size_t)batch * 14 * 14, nc = (size_t)batch * 14 * 14 * 16, np = nc / 4;
    size_t ns = dt_conv2d_maxpool_scratch_floats(&cg, &pg, batch) + dt_conv2d_scratch_floats(&cg, batch);
    float *x = malloc(nx * sizeof *x), *w = malloc(144 * sizeof *w), *conv = malloc(nc * sizeof *conv);
    float *sep = malloc(np * sizeof *sep), *fused = malloc(np * sizeof *fused), *f32 = malloc(np * sizeof *f32);
    float *scratch = malloc(ns * sizeof *scratch);
    int32_t *am = malloc(np * sizeof *am);
    fill(x, nx, 7, 1.0, 0, 3);
    fill(w, 144, 8, 0.8, 0, 3);
    dt_cpu cpu;
    dt_cpu_init(&cpu, 1);
    cpu.bf16 = 1;
    dt_conv2d_forward(&cpu, conv, x, w, NULL, batch, &cg, scratch);
    dt_maxpool_forward(&cpu, sep, am, conv, batch, &pg);
    dt_conv2d_maxpool_forward(&cpu, fused, am, x, w, NULL, batch, &cg, &pg, scratch);
    cpu.bf16 = 0;
    dt_conv2d_maxpool_forward(&cpu, f32, am, x, w, NULL, batch, &cg, &pg, scratch);
    double worst = 0, apart = 0;
    for (size_t i = 0; i < np; i++) {
        worst = fmax(worst, fabs((double)fused[i] - sep[i]));
        apart = fmax(apart, fabs((double)fused[i] - f32[i]));
    }
    CHECK_MSG(worst <= 1e-5, "bf16 fused conv + pool vs apart: %.3g", worst);
    CHECK_MSG(apart > 1e-4, "bf16 fused conv + pool vs float32: %.3g (bf16 not in use?)", apart);
    free(x), free(w), free(conv), free(sep), free(fused), free(f32), free(scratch), free(am);
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
    RUN(test_bf16_layers);
    RUN(test_bf16_fused);
    RUN(test_resnet);
    RUN(test_cuda_layers); /* here CPU against CPU: the model and the comparison, ready for the GPU run */
    return test_summary();
}
