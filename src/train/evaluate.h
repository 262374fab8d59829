/* Forward-only passes over a whole data set: loss, accuracy and (optionally) a confusion matrix. */
#ifndef DT_TRAIN_EVALUATE_H
#define DT_TRAIN_EVALUATE_H

#include <stdint.h>

#include "data/dataset.h"
#include "model/net.h"

typedef struct {
    int64_t examples;
    double loss;       /* mean over examples */
    double accuracy;   /* fraction correct */
} dt_eval_result;

/* confusion, if non-NULL, is [classes * classes] counts, row = true label, column = prediction. */
int dt_evaluate(dt_net *net, const dt_dataset *ds, int64_t *confusion, dt_eval_result *out,
                dt_error *err);

#endif
