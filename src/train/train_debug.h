/* Test and benchmark hooks of dt_train, kept out of the public dt_train_options: the --debug_*
 * flags of `dtrain train`, for the tests and bench/ only. */
#ifndef DT_TRAIN_DEBUG_H
#define DT_TRAIN_DEBUG_H

#include <stdio.h>

#include "dtrain.h"

typedef struct dt_train_debug {
    /* Worker delay_worker (-1: every worker) sleeps step_delay_ms before each update. */
    int step_delay_ms, delay_worker;
    /* Benchmarks of scale only: >= 0 replaces each step's batch, forward and backward with a sleep
     * of this many ms and pushes a constant gradient of the model's full size (nothing learns and
     * nothing is evaluated); -1: off. docs/testbed.md. */
    int emulate_compute_ms;
    /* If set, the chief (or a single process) writes its final parameters there (raw float32). */
    const char *dump_params;
    /* If set, this process writes the gradient of its first step there (raw float32), as backward
     * made it: before clipping, the update or the push (tests compare devices with it). */
    const char *dump_grads;
    /* If set (--sharding dynamic), this worker appends one line per batch of its that counted
     * ("epoch E batch B ids I..."): tests check every example once per epoch. */
    const char *work_log;
    /* A ps task stops, without answering it, at the n-th SPARSE_PULL a worker sends it (> 0; 0: off):
     * a test restarts it there, so the ps is lost in the middle of a sparse pull (docs/faults.md). */
    int64_t ps_stop_at_sparse_pull;
    /* The chief, restoring a checkpoint onto the ps tasks, sleeps this long (ms, 0: off) between
     * declaring the sparse tables and sending their rows: a test widens the window in which the other
     * workers must not pull them yet (docs/sparse.md, "Checkpoints"). */
    int import_delay_ms;
    /* A click log: after the first step, log the bytes of text the training reader has read
     * (dt_ctr_bytes): tests check training starts without a pass over the whole file. */
    int log_data_bytes;
} dt_train_debug;

/* Every hook off. */
void dt_train_debug_init(dt_train_debug *d);
/* Training itself: dt_train is this with every hook off (d NULL). */
int dt_train_hooked(const dt_train_options *o, const dt_train_debug *d, FILE *log, dt_train_result *result,
                    dt_error *err);

#endif
