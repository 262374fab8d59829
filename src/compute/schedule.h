/* Learning-rate schedules with TensorFlow's formulas, as a function of the global step (the updates
 * already applied, 0 before the first): a ps, a single process and a restarted run all compute the
 * rate of an update from its step alone, so they agree. lr0 is --learning_rate.
 *   constant:    lr0
 *   exponential: lr0 * decay_rate ^ (step / decay_steps)      (tf.train.exponential_decay; staircase:
 *                the exponent is floor(step / decay_steps))
 *   piecewise:   values[0] while step <= boundaries[0], values[i] while boundaries[i-1] < step <=
 *                boundaries[i], values[n] after the last        (tf.train.piecewise_constant; lr0 unused)
 *   cosine:      step < warmup_steps: lr0 * step / warmup_steps (linear from 0), then with
 *                s = min(step - warmup_steps, decay_steps):
 *                lr0 * ((1 - alpha) * 0.5 * (1 + cos(pi * s / decay_steps)) + alpha)
 *                (tf.keras.optimizers.schedules.CosineDecay with initial_learning_rate 0,
 *                warmup_target lr0; without warmup, tf.train.cosine_decay)
 * Computed in double and rounded once to float, so every process gets the same float. */
#ifndef DT_COMPUTE_SCHEDULE_H
#define DT_COMPUTE_SCHEDULE_H

#include <stdint.h>

#include "dtrain.h"

typedef enum { DT_LR_CONSTANT = 0, DT_LR_EXPONENTIAL, DT_LR_PIECEWISE, DT_LR_COSINE } dt_lr_kind;
#define DT_LR_KINDS 4
#define DT_LR_MAX_BOUNDARIES 16 /* piecewise: at most this many boundaries (and one more value) */
#define DT_LR_MAX_STEPS (INT64_C(1) << 50) /* steps in any field: far beyond a run, exact in a double */

typedef struct {
    dt_lr_kind kind;
    int staircase;              /* exponential */
    int64_t decay_steps;        /* exponential: the period (> 0); cosine: steps of the decay after warmup (> 0) */
    float decay_rate;           /* exponential: > 0 */
    float alpha;                /* cosine: the final rate as a fraction of lr0, 0..1 */
    int64_t warmup_steps;       /* cosine: >= 0 */
    int n_boundaries;           /* piecewise: 1..DT_LR_MAX_BOUNDARIES, values has one more */
    int64_t boundaries[DT_LR_MAX_BOUNDARIES];
    float values[DT_LR_MAX_BOUNDARIES + 1];
} dt_lr_schedule;

/* "constant", "exponential", "piecewise" or "cosine" (--lr_schedule); other fields zeroed. */
int dt_lr_kind_parse(const char *name, dt_lr_kind *out, dt_error *err);
const char *dt_lr_kind_name(dt_lr_kind kind);

/* Comma-separated lists for piecewise: --lr_boundaries (integers, strictly increasing, >= 0) and
 * --lr_values (positive finite numbers). Errors name the flag and the item at fault. */
int dt_lr_parse_boundaries(dt_lr_schedule *s, const char *text, dt_error *err);
int dt_lr_parse_values(dt_lr_schedule *s, const char *text, dt_error *err);

/* Every field in range for its kind (fields another kind uses must be zero, so a peer cannot slip
 * in unused values); the message names the flag. */
int dt_lr_schedule_check(const dt_lr_schedule *s, dt_error *err);

/* The rate of the update at global step `step` (>= 0). */
float dt_lr_at(const dt_lr_schedule *s, float lr0, int64_t step);

/* One line for logs: "cosine (warmup 500, decay 9000 steps, alpha 0)". */
void dt_lr_describe(const dt_lr_schedule *s, char *out, int n);

#endif
