/* Predictions over a data set (labelled or not): one forward pass in data-set order, batches from
 * the same loader and decoding as training and evaluation, and for each example its predicted class
 * (dt_argmax_first of the logits, as dt_evaluate counts it) and the softmax of its logits. Bad images
 * follow the data set's policy: left out and counted (dt_dataset_bad_count), or an error naming
 * the file. */
#ifndef DT_TRAIN_PREDICT_H
#define DT_TRAIN_PREDICT_H

#include <stddef.h>
#include <stdint.h>

#include "data/dataset.h"
#include "model/net.h"

/* One batch of n examples: ids [n] (their index in the data set), predicted [n], probs and logits
 * [n, classes]. */
typedef struct {
    const size_t *ids;
    const int *predicted;
    const float *probs, *logits;
    int n, classes;
} dt_predict_batch;

/* Called once per batch. A non-zero return stops the pass and is returned by dt_predict. */
typedef int (*dt_predict_fn)(void *user, const dt_predict_batch *b, dt_error *err);

/* *count (may be NULL) gets the number of examples predicted. */
int dt_predict(dt_net *net, const dt_dataset *ds, dt_predict_fn emit, void *user, int64_t *count, dt_error *err);

#endif
