/* dtrain: data-parallel distributed training in C. Public API.
 *
 * Every fallible call returns 0 on success or a negative DT_E* code and, when err is non-NULL, fills
 * err->msg with a one-line message that names the file, line or field at fault. Nothing in the
 * library exits or aborts on bad input. */
#ifndef DTRAIN_H
#define DTRAIN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    DT_OK = 0,
    DT_EINVAL = -1,   /* bad argument, flag or config value */
    DT_ENOMEM = -2,   /* allocation failed */
    DT_EIO = -3,      /* file or socket i/o failed */
    DT_EFORMAT = -4,  /* malformed input file or message */
    DT_ESHAPE = -5,   /* shapes do not fit */
    DT_ENET = -6,     /* network failure */
    DT_ETIMEOUT = -7, /* a deadline passed */
    DT_EPROTO = -8,   /* peer speaks another protocol or broke it */
    DT_EINTR = -9,    /* stopped by a signal */
};

typedef struct dt_error {
    int code;
    char msg[1024];
} dt_error;

const char *dt_strerror(int code);
const char *dt_version(void);

/* ---- Training on one machine (what `dtrain train` runs) ------------------------------------- */

typedef struct dt_train_options {
    const char *model_path;      /* model file (docs/model-format.md) */
    const char *data_path;       /* IDX folder or image folder (docs/data.md) */
    const char *optimizer;       /* "sgd", "momentum" or "adam" */
    float learning_rate;
    int batch_size;
    int64_t train_steps;         /* > 0: stop after this many steps; else run `epochs` */
    double epochs;
    int64_t steps_to_validate;   /* log + validate every this many steps (and at every epoch end) */
    uint64_t seed;               /* initialisation, shuffling, dropout */
    int threads;                 /* compute threads; <= 0: all cores */
    double validation_fraction;  /* image folders; < 0: default 0.2 */
    int fail_on_bad_images;      /* 0: count and skip undecodable images; 1: stop with an error */
    int progress;                /* 1: a live progress line with ETA on stderr (a terminal) */
    const volatile int *stop;    /* if non-NULL and set (e.g. from SIGINT), training stops early */

    /* The cluster, as the source's flags (docs/cluster.md). All NULL: the TF_CONFIG environment
     * variable if set, else this machine alone. job_name "ps" serves until the chief ends
     * training; "worker" trains its shard of the data (worker 0 is the chief). */
    const char *ps_hosts, *worker_hosts, *job_name, *task_index;
    int issync;                  /* 0: asynchronous (the source's default); 1: sync replicas */
    const char *placement;       /* "greedy" (default) or "round_robin" */
    int connect_timeout_ms;      /* how long a worker retries the ps tasks (default 60000) */
    int dry_run;                 /* print the cluster and the placement, then return */
} dt_train_options;

typedef struct dt_train_result {
    int64_t steps;
    double final_loss;           /* mean training loss over the last logging interval */
    double validation_accuracy;
    double test_accuracy, test_loss;
    int64_t test_examples;
    double seconds, examples_per_sec;
    int64_t bad_images;
} dt_train_result;

/* Fills o with dtrain's defaults (adam, 0.001, batch 64, 1 epoch, steps_to_validate 1000, seed 1,
 * asynchronous, greedy placement). */
void dt_train_options_init(dt_train_options *o);
/* Trains on this machine, logging to `log` (NULL: stdout); returns DT_EINTR if *stop was set. */
int dt_train(const dt_train_options *o, FILE *log, dt_train_result *result, dt_error *err);

#ifdef __cplusplus
}
#endif
#endif
