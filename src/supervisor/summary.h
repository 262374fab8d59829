/* The chief's training curves for TensorBoard (docs/summaries.md): two event files, one in
 * <dir>/train (training batches) and one in <dir>/test (validation), as the source's summary
 * writers. Scalars: cost and accuracy in both; global_step/sec, examples/sec and learning_rate in
 * train. */
#ifndef DT_SUPERVISOR_SUMMARY_H
#define DT_SUPERVISOR_SUMMARY_H

#include <stdint.h>

#include "dtrain.h"

typedef struct dt_summary dt_summary;

/* Creates <dir>/train and <dir>/test (with parents) and an event file in each. */
int dt_summary_open(dt_summary **out, const char *dir, dt_error *err);
/* Training batches of the last interval: mean cost, accuracy, the cluster's rates, and the learning
 * rate at global_step. Flushed. */
int dt_summary_train(dt_summary *s, int64_t global_step, double cost, double accuracy, double steps_per_sec,
                     double examples_per_sec, double learning_rate, dt_error *err);
/* Validation at global_step. Flushed. */
int dt_summary_test(dt_summary *s, int64_t global_step, double cost, double accuracy, dt_error *err);
/* A binary (click-log) model's validation figures: `auc` and `logloss`, in the test writer. */
int dt_summary_binary(dt_summary *s, int64_t global_step, double auc, double logloss, dt_error *err);
const char *dt_summary_path(const dt_summary *s, int test); /* the event file written */
/* Closes both files (s may be NULL); returns the first write error. */
int dt_summary_close(dt_summary *s, dt_error *err);

#endif
