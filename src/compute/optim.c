#include "compute/optim.h"

#include <math.h>
#include <string.h>

#include "core/error.h"

int dt_opt_config_init(dt_opt_config *c, const char *name, float learning_rate, dt_error *err) {
    memset(c, 0, sizeof *c);
    c->learning_rate = learning_rate;
    c->momentum = 0.9f;
    c->beta1 = 0.9f;
    c->beta2 = 0.999f;
    c->epsilon = 1e-8f;
    if (!(learning_rate > 0.0f) || !isfinite(learning_rate))
        return dt_errorf(err, DT_EINVAL, "learning_rate must be a positive number, got %g",
                         (double)learning_rate);
    if (!strcmp(name, "sgd")) c->kind = DT_OPT_SGD;
    else if (!strcmp(name, "momentum")) c->kind = DT_OPT_MOMENTUM;
    else if (!strcmp(name, "adam")) c->kind = DT_OPT_ADAM;
    else
        return dt_errorf(err, DT_EINVAL, "optimizer: unknown name '%s' (expected sgd, momentum or adam)",
                         name);
    return DT_OK;
}

const char *dt_opt_name(dt_opt_kind kind) {
    switch (kind) {
    case DT_OPT_SGD: return "sgd";
    case DT_OPT_MOMENTUM: return "momentum";
    case DT_OPT_ADAM: return "adam";
    }
    return "?";
}

int dt_opt_slots(const dt_opt_config *c) {
    switch (c->kind) {
    case DT_OPT_SGD: return 0;
    case DT_OPT_MOMENTUM: return 1;
    case DT_OPT_ADAM: return 2;
    }
    return 0;
}

int dt_opt_decays(const dt_opt_config *c, int rank) { return rank >= 2 || c->decay_rank1; }

/* One loop body per optimizer over a run of len floats that share one weight decay wd, instantiated
 * for in-place (out == params) and out-of-place use, so that restrict holds in both and the
 * compiler vectorises without runtime overlap checks (which would fail, and fall back to scalar
 * code, when out == params). State slot k of float i lives at state[k * stride + i]. */
#define OPT_LOOPS(OUT, IN)                                                                       \
    switch (c->kind) {                                                                           \
    case DT_OPT_SGD:                                                                             \
        for (size_t i = 0; i < len; i++) OUT[i] = IN[i] - lr * (grads[i] + wd * IN[i]);          \
        break;                                                                                   \
    case DT_OPT_MOMENTUM: {                                                                      \
        float *restrict acc = state, mom = c->momentum;                                          \
        for (size_t i = 0; i < len; i++) {                                                       \
            acc[i] = mom * acc[i] + (grads[i] + wd * IN[i]);                                     \
            OUT[i] = IN[i] - lr * acc[i];                                                        \
        }                                                                                        \
        break;                                                                                   \
    }                                                                                            \
    case DT_OPT_ADAM: {                                                                          \
        float b1 = c->beta1, b2 = c->beta2, eps = c->epsilon, lwd = lr * wd;                     \
        float *restrict m = state, *restrict v = state + stride;                                 \
        for (size_t i = 0; i < len; i++) {                                                       \
            float g = grads[i];                                                                  \
            m[i] = b1 * m[i] + (1.0f - b1) * g;                                                  \
            v[i] = b2 * v[i] + (1.0f - b2) * g * g;                                              \
            OUT[i] = IN[i] - lwd * IN[i] - lr_t * m[i] / (sqrtf(v[i]) + eps);                    \
        }                                                                                        \
        break;                                                                                   \
    }                                                                                            \
    }

static void run_in_place(const dt_opt_config *c, float *restrict params, const float *restrict grads,
                         float *restrict state, size_t stride, size_t len, float lr, float lr_t, float wd) {
    OPT_LOOPS(params, params)
}

static void run_out_of_place(const dt_opt_config *c, float *restrict out, const float *restrict params,
                             const float *restrict grads, float *restrict state, size_t stride, size_t len, float lr,
                             float lr_t, float wd) {
    OPT_LOOPS(out, params)
}

/* The update of floats [lo, hi) of a slice of n: runs of floats that decay alike (whole variables:
 * a few runs per slice). */
static void apply_span(const dt_opt_config *c, float *out, const float *params, const float *grads, float *state,
                       const uint8_t *decay, size_t n, size_t lo, size_t hi, float lr, float lr_t) {
    for (size_t i = lo; i < hi;) {
        size_t j = decay ? i + 1 : hi;
        while (j < hi && (decay[j] != 0) == (decay[i] != 0)) j++;
        float wd = decay && decay[i] ? c->weight_decay : 0.0f;
        float *st = state ? state + i : NULL;
        if (out == params) run_in_place(c, out + i, grads + i, st, n, j - i, lr, lr_t, wd);
        else run_out_of_place(c, out + i, params + i, grads + i, st, n, j - i, lr, lr_t, wd);
        i = j;
    }
}

/* The step's rate, and Adam's bias correction folded into it (in double, as TF computes the beta
 * powers). */
static float step_rates(const dt_opt_config *c, int64_t step, float *lr_t) {
    const float lr = dt_lr_at(&c->schedule, c->learning_rate, step);
    double t = (double)step + 1.0;
    *lr_t = c->kind == DT_OPT_ADAM ? (float)(lr * sqrt(1.0 - pow(c->beta2, t)) / (1.0 - pow(c->beta1, t))) : 0;
    return lr;
}

void dt_opt_apply_to(const dt_opt_config *c, float *out, const float *params, const float *grads, float *state,
                     const uint8_t *decay, size_t n, int64_t step, const dt_opt_skip *skip) {
    float lr_t;
    const float lr = step_rates(c, step, &lr_t);
    if (c->weight_decay == 0) decay = NULL;
    /* The spans between the skipped ranges. Skipping, rather than running the optimizer and
     * overwriting the values, keeps the slots of the untrained floats at zero: a gradient in their
     * place (a ps gets their change there) would otherwise build momentum or Adam moments that a
     * checkpoint saves and a resumed run then applies. */
    size_t i = 0;
    for (int r = 0; skip && r < skip->n; r++) {
        size_t lo = skip->ranges[2 * r], hi = lo + skip->ranges[2 * r + 1];
        lo = lo > skip->base ? lo - skip->base : 0;
        hi = hi > skip->base ? hi - skip->base : 0;
        if (lo < i) lo = i;
        if (hi > n) hi = n;
        if (lo >= hi) continue;
        apply_span(c, out, params, grads, state, decay, n, i, lo, lr, lr_t);
        if (out != params) memcpy(out + lo, params + lo, (hi - lo) * sizeof *out);
        i = hi;
    }
    apply_span(c, out, params, grads, state, decay, n, i, n, lr, lr_t);
}

void dt_opt_apply(const dt_opt_config *c, float *params, const float *grads, float *state, const uint8_t *decay,
                  size_t n, int64_t step) {
    dt_opt_apply_to(c, params, params, grads, state, decay, n, step, NULL);
}

double dt_clip_global_norm(float *g, size_t n, float max_norm) {
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += (double)g[i] * g[i];
    double norm = sqrt(sum);
    if (norm > (double)max_norm && max_norm > 0) {
        float scale = (float)((double)max_norm / norm);
        for (size_t i = 0; i < n; i++) g[i] *= scale;
    }
    return norm;
}
