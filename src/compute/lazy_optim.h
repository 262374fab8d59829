/* Lazy optimizers over the rows of an embedding table (docs/sparse.md has every formula): an update
 * touches only the rows a gradient names, their values and their optimizer slots; every other row
 * and its slots stay as they are, bit for bit. TensorFlow 1.x's formulas: GradientDescent,
 * Adagrad (ApplyAdagrad), FTRL-Proximal (ApplyFtrl) and LazyAdam (tf.contrib.opt's
 * LazyAdamOptimizer). A row is `dim` values and `slots * dim` slot floats, slot-major within the
 * row: slot k of value j at slots[k * dim + j].
 *
 * The caller sums the gradients of an id named twice before applying (as TensorFlow does for
 * IndexedSlices with duplicate indices: dt_rowsum), and numbers the updates of a table: `step` is
 * the number of updates the table has had before this one (LazyAdam's bias correction counts
 * them, touched or not). */
#ifndef DT_COMPUTE_LAZY_OPTIM_H
#define DT_COMPUTE_LAZY_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain.h"

typedef enum { DT_LAZY_SGD = 0, DT_LAZY_ADAGRAD = 1, DT_LAZY_FTRL = 2, DT_LAZY_ADAM = 3 } dt_lazy_kind;
#define DT_LAZY_KINDS 4
#define DT_LAZY_MAX_SLOTS 2

typedef struct {
    dt_lazy_kind kind;
    float learning_rate;       /* > 0 */
    float initial_accumulator; /* adagrad, ftrl: the accumulator of a new row (TF: 0.1); > 0 */
    float lr_power;            /* ftrl: <= 0 (TF: -0.5) */
    float l1, l2;              /* ftrl: >= 0 (TF: 0, 0) */
    float beta1, beta2, epsilon; /* adam: TF's 0.9, 0.999, 1e-8 */
} dt_lazy_config;

/* name: "sgd", "adagrad", "ftrl" or "adam"; the other fields get TensorFlow's defaults. DT_EINVAL
 * naming the name or the rate. */
int dt_lazy_config_init(dt_lazy_config *c, const char *name, float learning_rate, dt_error *err);
/* Every field in its range (above), finite; DT_EINVAL naming the field. */
int dt_lazy_config_check(const dt_lazy_config *c, dt_error *err);
const char *dt_lazy_name(dt_lazy_kind kind); /* "?" outside the enum */
/* Slot floats per value: sgd 0, adagrad 1 (accumulator), ftrl 2 (accumulator, linear), adam 2 (m, v). */
int dt_lazy_slots(dt_lazy_kind kind);

/* The slots of a new row ([slots * dim]): the accumulators at initial_accumulator, the rest 0. */
void dt_lazy_init_slots(const dt_lazy_config *c, float *slots, int dim);

/* What one update of a table applies to every row it touches, from the table's step (updates
 * it had before this one): the rate, and LazyAdam's bias-corrected rate
 * lr * sqrt(1 - beta2^t) / (1 - beta1^t) with t = step + 1, computed in double as TF computes
 * the beta powers. */
typedef struct {
    float lr, lr_t;
} dt_lazy_rates;
dt_lazy_rates dt_lazy_rates_at(const dt_lazy_config *c, int64_t step);

/* One update of one row: value [dim], slots [slots * dim] in place, grad [dim] (the row's summed
 * gradient), r = dt_lazy_rates_at(c, the table's step). */
void dt_lazy_apply_row(const dt_lazy_config *c, const dt_lazy_rates *r, float *value, float *slots, const float *grad,
                       int dim);
/* The same with slot k of value j at slots[k * stride + j]: the local updater keeps a table's slots
 * in the flat layout of checkpoints (slot k of flat float i at state[k * n + i]), a ps row keeps
 * them together (stride = dim). */
void dt_lazy_apply_row_strided(const dt_lazy_config *c, const dt_lazy_rates *r, float *value, float *slots,
                               size_t stride, const float *grad, int dim);

#endif
