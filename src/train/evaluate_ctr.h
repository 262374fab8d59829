/* Forward-only passes of a click-log model over one split of a click log (docs/ctr-data.md): AUC,
 * logloss, accuracy at 0.5; and probabilities for `dtrain predict`. */
#ifndef DT_TRAIN_EVALUATE_CTR_H
#define DT_TRAIN_EVALUATE_CTR_H

#include <stdint.h>
#include <stdio.h>

#include "data/ctr.h"
#include "model/net.h"

typedef struct {
    int64_t examples, positives;
    double loss;        /* mean logloss of the model's own formula (the training loss), unclipped */
    double accuracy;    /* probability above 0.5 on the label's side */
    double auc, auc_error_bound, logloss, mean_p; /* stats/binary.h: logloss clipped at 1e-7 */
    uint64_t bad_lines;
} dt_ctr_eval_result;

/* The reader's options for a pass of net over path's `split` (one pass, net's batch size, the
 * model's field count for libffm, the default 8:1:1 split); bad lines skipped unless fail. */
void dt_ctr_eval_options(dt_ctr_options *o, const dt_net *net, dt_ctr_split split, int fail_on_bad);
/* net over every line of the split o selects (o->training must be 0). */
int dt_evaluate_ctr(dt_net *net, const char *path, const dt_ctr_options *o, dt_ctr_eval_result *out, dt_error *err);
/* dt_evaluate_ctr, and each line L's logit and probability to logits[L - 1] and probs[L - 1] (either
 * NULL: not wanted; a line past `lines` is DT_EINVAL): a binding's arrays, whose row i is line i + 1. */
int dt_evaluate_ctr_into(dt_net *net, const char *path, const dt_ctr_options *o, float *logits, float *probs,
                         int64_t lines, dt_ctr_eval_result *out, dt_error *err);
/* The header of dt_predict_ctr's rows, which the caller writes once, however many files follow. */
#define DT_PREDICT_CTR_HEADER "line,label,probability,file\n"
/* Writes "line,label,probability,file" for every line of the split o selects (file: path, a CSV
 * field quoted where it must be), no header; *count: the lines written. */
int dt_predict_ctr(dt_net *net, const char *path, const dt_ctr_options *o, FILE *out, int64_t *count,
                   dt_ctr_eval_result *res, dt_error *err);

#endif
