/* Optimizers with TensorFlow 1.x's update formulas. Each works on a slice: (params, grads, state)
 * of n floats, so a parameter server can run it on the shard it holds. State is slot-major:
 * slot k of the slice lives at state[k*n .. k*n + n). */
#ifndef DT_COMPUTE_OPTIM_H
#define DT_COMPUTE_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "compute/schedule.h"
#include "dtrain.h"

typedef enum { DT_OPT_SGD, DT_OPT_MOMENTUM, DT_OPT_ADAM } dt_opt_kind;

typedef struct {
    dt_opt_kind kind;
    float learning_rate;
    float momentum;           /* momentum: 0.9 */
    float beta1, beta2, epsilon; /* adam: 0.9, 0.999, 1e-8 (TensorFlow's defaults) */
    dt_lr_schedule schedule;  /* the rate of each update from learning_rate and its step (constant) */
    /* Weight decay of the parameters the caller's mask marks (dt_opt_decays): sgd and momentum add
     * weight_decay * p to the gradient (L2, as torch.optim.SGD's weight_decay); adam decays p by
     * lr * weight_decay * p beside its update (decoupled, as torch.optim.AdamW). 0: none. */
    float weight_decay;
    int decay_rank1;          /* dt_opt_decays: also rank-1 parameters (biases, batch-norm scale and offset) */
} dt_opt_config;

/* name: "sgd", "momentum" or "adam"; other fields get TensorFlow's defaults. */
int dt_opt_config_init(dt_opt_config *c, const char *name, float learning_rate, dt_error *err);
const char *dt_opt_name(dt_opt_kind kind);
/* State floats per parameter: sgd 0, momentum 1 (accumulator), adam 2 (m, v). */
int dt_opt_slots(const dt_opt_config *c);

/* Whether weight decay applies to a parameter of this rank: kernels (rank >= 2) always, rank-1
 * ones (biases; batch norm's scale and offset, which are per-channel vectors too) only with
 * decay_rank1. The one rule for a single process and the ps tasks alike. */
int dt_opt_decays(const dt_opt_config *c, int rank);

/* One update of a slice. step = updates already applied (0 before the first); lr =
 * dt_lr_at(schedule, learning_rate, step); wd = weight_decay where decay[i] is non-zero, else 0
 * (decay NULL: 0 everywhere); Adam's bias correction uses t = step + 1:
 *   sgd:      g' = g + wd p;  p -= lr * g'
 *   momentum: g' = g + wd p;  a = momentum * a + g';  p -= lr * a
 *   adam:     lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
 *             m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
 *             p -= lr * wd * p + lr_t * m / (sqrt(v) + epsilon)   (epsilon is TF's "epsilon hat") */
void dt_opt_apply(const dt_opt_config *c, float *params, const float *grads, float *state, const uint8_t *decay,
                  size_t n, int64_t step);

/* Floats the optimizer does not train (batch norm's moving statistics, docs/batchnorm.md): their
 * values and every slot of theirs are left as they are, whatever the gradient, the optimizer or the
 * weight decay (out of place: out = params there). ranges: pairs [offset, count], ascending, not
 * overlapping, counted from a float `base` floats before the slice's first, so a ps part passes its
 * shard's ranges and its offset in the shard; the parts of ranges outside the slice are ignored. */
typedef struct {
    const size_t *ranges; /* [2 * n] */
    int n;
    size_t base;
} dt_opt_skip;

/* dt_opt_apply except on the floats of skip (NULL: none), written out of place: out = params
 * updated (state still in place), bit for bit what dt_opt_apply computes elsewhere. out is either
 * params itself or a buffer that overlaps neither params nor grads; a parameter server writes the
 * next step straight into a fresh snapshot this way. The one update of the local updater and the
 * ps alike. */
void dt_opt_apply_to(const dt_opt_config *c, float *out, const float *params, const float *grads, float *state,
                     const uint8_t *decay, size_t n, int64_t step, const dt_opt_skip *skip);

/* Clips a whole gradient g [n] to a global L2 norm of at most max_norm (tf.clip_by_global_norm:
 * g *= max_norm / max(norm, max_norm)); returns the norm before clipping (computed in double). */
double dt_clip_global_norm(float *g, size_t n, float max_norm);

#endif
