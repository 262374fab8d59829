#include "compute/lazy_optim.h"

#include <math.h>
#include <string.h>

#include "core/error.h"

static const char *const NAMES[DT_LAZY_KINDS] = {"sgd", "adagrad", "ftrl", "adam"};

const char *dt_lazy_name(dt_lazy_kind kind) {
    return (unsigned)kind < DT_LAZY_KINDS ? NAMES[kind] : "?";
}

int dt_lazy_slots(dt_lazy_kind kind) {
    switch (kind) {
    case DT_LAZY_SGD: return 0;
    case DT_LAZY_ADAGRAD: return 1;
    case DT_LAZY_FTRL: return 2;
    case DT_LAZY_ADAM: return 2;
    }
    return 0;
}

int dt_lazy_config_init(dt_lazy_config *c, const char *name, float learning_rate, dt_error *err) {
    memset(c, 0, sizeof *c);
    c->learning_rate = learning_rate;
    c->initial_accumulator = 0.1f;
    c->lr_power = -0.5f;
    c->beta1 = 0.9f;
    c->beta2 = 0.999f;
    c->epsilon = 1e-8f;
    int k = 0;
    while (k < DT_LAZY_KINDS && strcmp(name, NAMES[k]) != 0) k++;
    if (k == DT_LAZY_KINDS)
        return dt_errorf(err, DT_EINVAL, "sparse optimizer: unknown name '%.64s' (expected sgd, adagrad, ftrl or adam)",
                         name);
    c->kind = (dt_lazy_kind)k;
    return dt_lazy_config_check(c, err);
}

int dt_lazy_config_check(const dt_lazy_config *c, dt_error *err) {
    const char *n = dt_lazy_name(c->kind);
    if ((unsigned)c->kind >= DT_LAZY_KINDS)
        return dt_errorf(err, DT_EINVAL, "sparse optimizer: unknown kind %d", (int)c->kind);
    if (!(c->learning_rate > 0.0f) || !isfinite(c->learning_rate))
        return dt_errorf(err, DT_EINVAL, "%s: learning_rate %g, must be a positive number", n, (double)c->learning_rate);
    if (c->kind == DT_LAZY_ADAGRAD && !(c->initial_accumulator > 0.0f && isfinite(c->initial_accumulator)))
        return dt_errorf(err, DT_EINVAL, "adagrad: initial_accumulator %g, must be positive",
                         (double)c->initial_accumulator);
    if (c->kind == DT_LAZY_FTRL) {
        if (!(c->initial_accumulator >= 0.0f && isfinite(c->initial_accumulator)))
            return dt_errorf(err, DT_EINVAL, "ftrl: initial_accumulator %g, must be >= 0", (double)c->initial_accumulator);
        if (!(c->lr_power <= 0.0f && isfinite(c->lr_power)))
            return dt_errorf(err, DT_EINVAL, "ftrl: lr_power %g, must be <= 0", (double)c->lr_power);
        if (!(c->l1 >= 0.0f && isfinite(c->l1)))
            return dt_errorf(err, DT_EINVAL, "ftrl: l1 %g, must be >= 0", (double)c->l1);
        if (!(c->l2 >= 0.0f && isfinite(c->l2)))
            return dt_errorf(err, DT_EINVAL, "ftrl: l2 %g, must be >= 0", (double)c->l2);
    }
    if (c->kind == DT_LAZY_ADAM) {
        if (!(c->beta1 >= 0.0f && c->beta1 < 1.0f))
            return dt_errorf(err, DT_EINVAL, "adam: beta1 %g, must be in [0, 1)", (double)c->beta1);
        if (!(c->beta2 >= 0.0f && c->beta2 < 1.0f))
            return dt_errorf(err, DT_EINVAL, "adam: beta2 %g, must be in [0, 1)", (double)c->beta2);
        if (!(c->epsilon > 0.0f && isfinite(c->epsilon)))
            return dt_errorf(err, DT_EINVAL, "adam: epsilon %g, must be positive", (double)c->epsilon);
    }
    return DT_OK;
}

void dt_lazy_init_slots(const dt_lazy_config *c, float *slots, int dim) {
    int k = dt_lazy_slots(c->kind);
    memset(slots, 0, (size_t)k * (size_t)dim * sizeof *slots);
    if (c->kind == DT_LAZY_ADAGRAD || c->kind == DT_LAZY_FTRL)
        for (int j = 0; j < dim; j++) slots[j] = c->initial_accumulator;
}

dt_lazy_rates dt_lazy_rates_at(const dt_lazy_config *c, int64_t step) {
    dt_lazy_rates r = {.lr = c->learning_rate, .lr_t = 0};
    if (c->kind == DT_LAZY_ADAM) {
        double t = (double)step + 1.0;
        r.lr_t = (float)(c->learning_rate * sqrt(1.0 - pow(c->beta2, t)) / (1.0 - pow(c->beta1, t)));
    }
    return r;
}

/* ApplyFtrl on one row: accum [dim], linear [dim]. */
static void ftrl_row(const dt_lazy_config *c, float lr, float *restrict w, float *restrict acc, float *restrict lin,
                     const float *restrict grad, int dim) {
    const float l1 = c->l1, l2x2 = 2.0f * c->l2, p = -c->lr_power;
    const int half = c->lr_power == -0.5f;
    for (int j = 0; j < dim; j++) {
        float g = grad[j], a = acc[j], na = a + g * g;
        float pn = half ? sqrtf(na) : powf(na, p), pa = half ? sqrtf(a) : powf(a, p);
        float l = lin[j] + (g - (pn - pa) / lr * w[j]);
        float y = pn / lr + l2x2;
        w[j] = fabsf(l) > l1 ? (copysignf(l1, l) - l) / y : 0.0f;
        lin[j] = l;
        acc[j] = na;
    }
}

void dt_lazy_apply_row_strided(const dt_lazy_config *c, const dt_lazy_rates *r, float *restrict value,
                               float *restrict slots, size_t stride, const float *restrict grad, int dim) {
    const float lr = r->lr;
    switch (c->kind) {
    case DT_LAZY_SGD:
        for (int j = 0; j < dim; j++) value[j] -= lr * grad[j];
        break;
    case DT_LAZY_ADAGRAD:
        for (int j = 0; j < dim; j++) {
            slots[j] += grad[j] * grad[j];
            value[j] -= lr * grad[j] / sqrtf(slots[j]);
        }
        break;
    case DT_LAZY_FTRL:
        ftrl_row(c, lr, value, slots, slots + stride, grad, dim);
        break;
    case DT_LAZY_ADAM: {
        const float b1 = c->beta1, b2 = c->beta2, eps = c->epsilon, lr_t = r->lr_t;
        float *m = slots, *v = slots + stride;
        for (int j = 0; j < dim; j++) {
            float g = grad[j];
            m[j] = b1 * m[j] + (1.0f - b1) * g;
            v[j] = b2 * v[j] + (1.0f - b2) * g * g;
            value[j] -= lr_t * m[j] / (sqrtf(v[j]) + eps);
        }
        break;
    }
    }
}

void dt_lazy_apply_row(const dt_lazy_config *c, const dt_lazy_rates *r, float *restrict value, float *restrict slots,
                       const float *restrict grad, int dim) {
    dt_lazy_apply_row_strided(c, r, value, slots, (size_t)dim, grad, dim);
}
