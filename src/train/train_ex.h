/* dt_train with what a binding adds (api/options.c, docs/python.md): the data as arrays in the
 * caller's memory instead of a data path, and a callback every N steps. Not public: the options
 * object of dtrain.h (dt_options) carries them. */
#ifndef DT_TRAIN_TRAIN_EX_H
#define DT_TRAIN_TRAIN_EX_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cluster/cluster.h"
#include "compute/optim.h"
#include "data/ctr.h"
#include "dtrain.h"
#include "model/net.h"
#include "train/train_debug.h"
#include "transport/auth.h"
#include "worker/remote.h"

/* Examples [n, h, w, c] in the caller's memory (data/dataset.h, dt_dataset_from_memory). */
typedef struct {
    const void *x;
    int x_u8;                     /* 1: uint8, scaled by 1/255 as IDX pixels; 0: float32 as is */
    const int32_t *labels;        /* [n] */
    size_t n;
    int h, w, c;
} dt_train_array;

/* The callback: step (the global step after the update), this step's batch loss and accuracy;
 * a non-zero return stops training (DT_EINTR, as a stop flag does). */
typedef int (*dt_train_step_fn)(void *user, int64_t step, double loss, double accuracy);

/* A batch source (a binding's iterator): *x [*n, h, w, c] float32 (*x_u8 0) or uint8 (1, scaled by
 * 1/255 as IDX pixels), *labels [*n], *n in 1..max, in the caller's memory until the next call;
 * non-zero: none (the source ended or failed). */
typedef int (*dt_train_batch_fn)(void *user, int max, const void **x, int *x_u8, const int32_t **labels, int *n);

typedef struct {
    /* next_batch: every training batch from it (train unused; test, needed, validates and tests;
     * --train_steps, needed, ends the run). */
    dt_train_batch_fn next_batch;
    void *batch_user;
    /* train.n > 0: the training data instead of data_path, test (n > 0) its validation and test
     * split (n 0: none, nothing is validated or tested). An image model only. */
    dt_train_array train, test;
    /* clicks.n > 0: a click-log model's data instead of data_path, split into training, validation
     * and test rows by the click-log rule (row i as line i + 1, --validation_fraction). */
    dt_ctr_memory clicks;
    dt_train_step_fn on_step;     /* NULL: none */
    void *user;
    int64_t every;                /* on_step every this many global steps (<= 0: 1) */
    float *params_out;            /* the chief's final parameters [params_n] (NULL: not wanted) */
    size_t params_n;
} dt_train_ex_args;

/* dt_train_hooked with ex (NULL: none, as dt_train_hooked). */
int dt_train_ex(const dt_train_options *o, const dt_train_debug *d, const dt_train_ex_args *ex, FILE *log,
                dt_train_result *result, dt_error *err);

/* The optimizer of o as dt_train makes it (kind, rate, schedule over total global steps, weight
 * decay), for a binding's own step loop (api/model.c). */
int dt_train_opt_config(const dt_train_options *o, int64_t total, dt_opt_config *c, dt_error *err);

/* For a binding's step loop as a cluster worker (api/model.c), the pieces dt_train's workers use:
 * the cluster o gives (the four flags, else --num_ps under a cluster manager, else TF_CONFIG, else
 * this process alone; DT_EINVAL for a cluster without ps tasks or an evaluator task), released with
 * dt_cluster_clear; --auth's keys (none: a zeroed a; curve: dt_auth_free); and the remote updater's
 * configuration from o (sync replicas with backup workers and staleness, compression, chunks,
 * overlap, timeouts, faults, the tables' optimizer of a net with tables), all but what the caller
 * owns: placement, opt, auth, metrics, the checkpoint hooks (none: a lost ps restarts from the seed),
 * dynamic sharding. */
int dt_train_cluster(dt_cluster *c, const dt_train_options *o, FILE *log, dt_error *err);
/* The options of a task's role in a cluster checked as dt_train checks them (sync replicas, the
 * exchange, timeouts, --bind, sharding). */
int dt_train_check_cluster(const dt_train_options *o, dt_error *err);
int dt_train_load_auth(dt_auth *a, const dt_train_options *o, const dt_cluster *c, dt_error *err);
int dt_train_remote_config(const dt_train_options *o, const dt_cluster *c, const dt_net *net, dt_remote_config *cfg,
                           FILE *log, dt_error *err);

#endif
