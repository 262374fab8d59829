/* How well a binary classifier's probabilities rank and fit: ROC AUC and logloss, accumulated batch
 * by batch over a pass of any length (docs/ctr-data.md, "AUC and logloss").
 *
 * AUC is exact while the pass has at most `exact_cap` examples (default 2^24, 4 bytes each): every
 * probability is kept, split by label, and at the end both lists are sorted and merged, counting
 * each positive/negative pair that ranks the positive higher as 1 and each tie as 1/2 (the average
 * rank formula of Mann-Whitney U, what sklearn's roc_auc_score computes). Past the cap the kept
 * probabilities are folded into a histogram of 163,841 bins over the float32 bits of p (each bin
 * 2^-12 of its value wide; everything under 2^-40 in bin 0; 2.6 MB) and the pass goes on there;
 * pairs within one bin then count 1/2, so the result carries the exact bound of that error,
 * 0.5 * sum_b pos_b * neg_b / (P * N), computed from the bins (0 when exact).
 *
 * Logloss is the mean of -(y log p + (1 - y) log(1 - p)) with p clipped to [1e-7, 1 - 1e-7] in
 * float64 (Keras' epsilon: tf.keras.losses.binary_crossentropy; sklearn's log_loss clips at the
 * float32 epsilon, 1.19e-7), so a confident wrong answer costs 16.1, not infinity. */
#ifndef DT_STATS_BINARY_H
#define DT_STATS_BINARY_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain.h"

#define DT_AUC_DEFAULT_CAP ((size_t)1 << 24)
#define DT_AUC_MAX_CAP ((size_t)1 << 31)
#define DT_LOGLOSS_EPS 1e-7

typedef struct dt_binary_eval dt_binary_eval;

typedef struct {
    uint64_t examples, positives;
    double auc;             /* NaN when the pass has no positive or no negative */
    double auc_error_bound; /* |auc - exact AUC| <= this; 0 when every example was kept */
    double logloss;         /* NaN for an empty pass */
    double mean_p;          /* mean predicted probability (calibration: compare with positives/examples) */
    int exact;              /* 1 while at most exact_cap examples were added */
} dt_binary_result;

/* exact_cap: examples whose probabilities are kept for the exact AUC (0: DT_AUC_DEFAULT_CAP; at most
 * DT_AUC_MAX_CAP). Memory grows with the examples up to 4 * exact_cap bytes, then stays at the
 * histogram's 2.6 MB. */
int dt_binary_eval_create(dt_binary_eval **out, size_t exact_cap, dt_error *err);
/* Adds n examples: prob[i] in [0, 1], label[i] 0 or 1. Anything else (NaN included) is refused with
 * DT_EINVAL naming the row, and nothing of the call is added. */
int dt_binary_eval_add(dt_binary_eval *e, const float *prob, const float *label, size_t n, dt_error *err);
/* The figures of everything added so far; more may be added afterwards. Sorting needs a scratch
 * buffer as large as the larger class (DT_ENOMEM if it cannot be had). */
int dt_binary_eval_result(dt_binary_eval *e, dt_binary_result *r, dt_error *err);
/* Forgets every example (a new pass), keeping the memory. */
void dt_binary_eval_reset(dt_binary_eval *e);
void dt_binary_eval_free(dt_binary_eval *e);

#endif
