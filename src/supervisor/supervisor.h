/* The chief's supervisor (TensorFlow's tf.train.Supervisor, in C): restores the newest good
 * checkpoint of --logdir at start (or lets the updater initialise), saves one at start, every
 * --save_model_secs and at the end, and writes the TensorBoard summaries. The training loop calls
 * it at a few points; the training state comes from a snapshot callback in the net's flat layout
 * (checkpoint.h), so the same code serves one machine and a cluster.
 *
 * Errors: a checkpoint that cannot be written at start or at the end fails the run; a periodic one
 * that fails is a warning (training goes on, and the next interval tries again). A summary write
 * error is a warning and turns summaries off. */
#ifndef DT_SUPERVISOR_SUPERVISOR_H
#define DT_SUPERVISOR_SUPERVISOR_H

#include <stdint.h>
#include <stdio.h>

#include "supervisor/checkpoint.h"

/* Fills params [n] and state [slots * n] with the current training state and *global_step with
 * the step they belong to. final: training is over (a cluster waits for its workers first). */
typedef int (*dt_snapshot_fn)(void *user, float *params, float *state, int64_t *global_step, int final,
                              dt_error *err);

typedef struct {
    const char *logdir;       /* checkpoints; NULL or "": none (no restore either) */
    double save_secs;         /* between periodic saves; <= 0: only at start and at the end */
    int max_to_keep;          /* <= 0: keep all */
    const char *summary_dir;  /* event files in <summary_dir>/{train,test}; NULL or "": none */
    dt_ckpt_run run;          /* the run (net, optimizer, seed, data stream) */
    int examples_per_step;    /* examples in one global step (summaries' examples/sec) */
    dt_snapshot_fn snapshot;
    /* Dynamic data sharding: the work coordinator's state that the latest snapshot fetched (it
     * fetches it before the model, docs/elastic.md), saved beside the model; NULL: none. */
    void (*coord)(void *user, const uint8_t **state, size_t *len);
    void *user;
    FILE *log;                /* restore and save lines, warnings; NULL: quiet */
} dt_supervisor_config;

typedef struct dt_supervisor dt_supervisor;

/* Restores from the newest good checkpoint if there is one (see dt_ckpt_open_latest and
 * dt_ckpt_load: a damaged newest file is skipped with a warning, another model's is an error), makes
 * the index name it (dt_ckpt_adopt; a failure there is a warning), and opens the summary files. */
int dt_supervisor_open(dt_supervisor **out, const dt_supervisor_config *cfg, dt_error *err);
/* 1 and the restored state (valid until close) if open restored a checkpoint, else 0. */
int dt_supervisor_restored(const dt_supervisor *s, const float **params, const float **state, int64_t *global_step);
/* 1 and the restored checkpoint, open, and its path (valid until the next reload or close) when the
 * run's net keeps its tables elsewhere (a compact net: their rows are read from the file with
 * dt_ckpt_read_rows once the ps tasks are ready for them), else 0. */
int dt_supervisor_restored_file(const dt_supervisor *s, const dt_st_file **f, const char **path);
/* 1 and the coordinator state (valid until close) if the restored checkpoint holds one, else 0. */
int dt_supervisor_restored_coord(const dt_supervisor *s, const uint8_t **state, size_t *len);
/* Reads the newest good checkpoint of the logdir again (a cluster rolling back after a ps lost its
 * shard): 1 and its state as dt_supervisor_restored gives it, 0 if there is none (or checkpoints are
 * off), < 0 on error. */
int dt_supervisor_reload(dt_supervisor *s, const float **params, const float **state, int64_t *global_step,
                         dt_error *err);
/* Training starts at global_step: saves a checkpoint unless the one just restored is of that step. */
int dt_supervisor_started(dt_supervisor *s, int64_t global_step, dt_error *err);
/* After each step: saves when save_secs have passed since the last save. Cheap otherwise. */
int dt_supervisor_step(dt_supervisor *s, int64_t global_step, dt_error *err);
/* End of training: takes the final snapshot, saves it (unless that step is saved already) and
 * copies its parameters into params_out [n] (may be NULL), so that what the run reports is what
 * the checkpoint holds; *global_step (may be NULL) gets its step. */
int dt_supervisor_final(dt_supervisor *s, float *params_out, int64_t *global_step, dt_error *err);
/* Summaries (no-ops without a summary_dir). The training summary adds global_step/sec and
 * examples/sec: global steps since the previous one (or the start) over the wall time between
 * them, as TensorFlow's step counter (the whole cluster's rate, validation time included). */
void dt_supervisor_summary_train(dt_supervisor *s, int64_t global_step, double cost, double accuracy);
void dt_supervisor_summary_test(dt_supervisor *s, int64_t global_step, double cost, double accuracy);
/* A binary model's validation AUC and logloss (scalars `auc` and `logloss` beside the test ones). */
void dt_supervisor_summary_binary(dt_supervisor *s, int64_t global_step, double auc, double logloss);
/* Last checkpoint written or restored ("" if none), and the number written. */
const char *dt_supervisor_last_checkpoint(const dt_supervisor *s);
int dt_supervisor_saves(const dt_supervisor *s);
void dt_supervisor_close(dt_supervisor *s);
/* The batches of an epoch for the checkpoints' data position, once known later than open (a click
 * log's count, train/ctr_count.h; 0 until then: unknown). NULL is fine. */
void dt_supervisor_set_batches_per_epoch(dt_supervisor *s, int64_t per);

#endif
