/* Optimizers with TensorFlow 1.x's update formulas. Each works on a slice: (params, grads, state)
 * of n floats, so a parameter server can run it on the shard it holds. State is slot-major:
 * slot k of the slice lives at state[k*n .. k*n + n). */
#ifndef DT_COMPUTE_OPTIM_H
#define DT_COMPUTE_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain.h"

typedef enum { DT_OPT_SGD, DT_OPT_MOMENTUM, DT_OPT_ADAM } dt_opt_kind;

typedef struct {
    dt_opt_kind kind;
    float learning_rate;
    float momentum;           /* momentum: 0.9 */
    float beta1, beta2, epsilon; /* adam: 0.9, 0.999, 1e-8 (TensorFlow's defaults) */
} dt_opt_config;

/* name: "sgd", "momentum" or "adam"; other fields get TensorFlow's defaults. */
int dt_opt_config_init(dt_opt_config *c, const char *name, float learning_rate, dt_error *err);
const char *dt_opt_name(dt_opt_kind kind);
/* State floats per parameter: sgd 0, momentum 1 (accumulator), adam 2 (m, v). */
int dt_opt_slots(const dt_opt_config *c);

/* One update of a slice. step = updates already applied (0 before the first); Adam's bias
 * correction uses t = step + 1:
 *   sgd:      p -= lr * g
 *   momentum: a = momentum * a + g;  p -= lr * a
 *   adam:     lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
 *             m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
 *             p -= lr_t * m / (sqrt(v) + epsilon)          (epsilon is TF's "epsilon hat") */
void dt_opt_apply(const dt_opt_config *c, float *params, const float *grads, float *state, size_t n,
                  int64_t step);
/* The same update written out of place: out = params updated (state still in place), bit for bit
 * what dt_opt_apply computes. out is either params itself or a buffer that overlaps neither params
 * nor grads; a parameter server writes the next step straight into a fresh snapshot this way. */
void dt_opt_apply_to(const dt_opt_config *c, float *out, const float *params, const float *grads, float *state,
                     size_t n, int64_t step);

#endif
