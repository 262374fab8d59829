/* A click log's training lines counted beside the steps, on a thread and a reader of their own
 * (docs/ctr-data.md, "Epochs"): an epoch's batches come from the count, but training starts at
 * once instead of after a pass over the whole file (a 19 MB gzip of 20M lines had not trained one
 * step after 40 s, issue 36). Until the count is in, the lines counted so far are a lower bound. */
#ifndef DT_TRAIN_CTR_COUNT_H
#define DT_TRAIN_CTR_COUNT_H

#include <stdint.h>

#include "data/ctr.h"

typedef struct dt_ctr_counter dt_ctr_counter;

/* Opens path with options o (its split; shards do not matter: every shard's lines are counted) and
 * starts counting. */
int dt_ctr_counter_start(dt_ctr_counter **out, const char *path, const dt_ctr_options *o, dt_error *err);
/* The lines counted so far in *lines. Returns 1 when that is the whole count, 0 while the count goes
 * on, or the count's error (a read error, a corrupt gzip stream: err says which). With wait_beyond
 * >= 0 it first waits until more than that many lines are counted or the count is over. */
int dt_ctr_counter_get(dt_ctr_counter *c, int64_t wait_beyond, uint64_t *lines, dt_error *err);
/* Seconds the count took (0 while it goes on). */
double dt_ctr_counter_seconds(const dt_ctr_counter *c);
/* Stops the count if it goes on, and frees it; NULL is fine. */
void dt_ctr_counter_free(dt_ctr_counter *c);

#endif
