/* What the status page (`/`, data from `/status.json`) shows: this process's own figures, and on
 * the chief the whole training: global step, progress and ETA, the training and validation
 * curves, and the cluster (every ps and worker task, alive or lost, each one's figures as its own
 * /status.json says; metrics/status_poll.h fetches them). docs/metrics.md describes the JSON.
 *
 * The training loop reports each step (a mutex taken once per step, never contended for long: the
 * HTTP thread holds it only to copy the figures out). Curves keep at most DT_STATUS_MAX_POINTS
 * points each: when full, every other point is dropped, so the whole run stays in view. */
#ifndef DT_METRICS_STATUS_H
#define DT_METRICS_STATUS_H

#include <stddef.h>
#include <stdint.h>

#include "cluster/cluster.h"
#include "dtrain.h"
#include "metrics/metrics.h"

#define DT_STATUS_MAX_POINTS 1000
#define DT_STATUS_MAX_SELF_BYTES 65536 /* the most of a peer's /status.json that is read */

typedef struct dt_status dt_status;

/* A task's own figures, as its /status.json "self" object gives them (NaN: not reported). */
typedef struct {
    char job[16];                 /* "ps" or "worker" */
    int task;
    char state[16];               /* "starting", "training", "finished", "serving" */
    double global_step, total_steps, steps_per_sec, examples_per_sec, loss, accuracy, stale;
    double live_workers, memory_bytes, pushes, pulls; /* a ps */
    /* ps 0 with a work plan (dynamic data sharding, docs/elastic.md): the coordinator's epoch,
     * members, units of the epoch done, held and waiting in the pool, and its joins, leaves and
     * losses so far */
    double work_epoch, work_live, units_done, units_held, units_pool, work_joins, work_leaves, work_losses;
} dt_status_self;

/* The status of a process with registry m (figures are read from its series at each request);
 * cluster: the tasks (copied; NULL or single: none). */
int dt_status_create(dt_status **out, dt_metrics *m, const dt_cluster *cluster, dt_error *err);
void dt_status_free(dt_status *s);

/* The training loop: the steps to reach, where this process started (a restored step), and the
 * examples one global step takes (the cluster's examples/s from the global step's rate). */
void dt_status_start(dt_status *s, int64_t total_steps, int64_t start_step, double examples_per_step);
/* After each step: the global step, the batch's loss and correct count of its n examples. */
void dt_status_step(dt_status *s, int64_t global_step, double loss, int correct, int n);
/* After each validation (the chief): its loss and accuracy, and a binary model's AUC (NAN for others). */
void dt_status_validation(dt_status *s, int64_t global_step, double loss, double accuracy, double auc);
void dt_status_finished(dt_status *s);
/* The run's steps, once known later than dt_status_start (a click log's count, train/ctr_count.h). */
void dt_status_set_total(dt_status *s, int64_t total_steps);

/* The peers' figures (status_poll.h): task index i of the list given to it answered with self
 * (NULL: did not answer). */
void dt_status_peer(dt_status *s, const dt_status_self *self);

/* Figures read at each request (resident memory) into their series. */
void dt_status_refresh(dt_status *s);

/* This process's own figures. */
void dt_status_get_self(dt_status *s, dt_status_self *out);

/* /status.json: "self" and, for the chief, the training and the cluster. Malloc'ed into *out. */
int dt_status_json(dt_status *s, char **out, size_t *len, dt_error *err);

/* A peer's /status.json (len bytes, untrusted: any size, any content) -> its "self" object.
 * Fails with DT_EFORMAT naming what is wrong. */
int dt_status_parse_self(const char *text, size_t len, dt_status_self *out, dt_error *err);

#endif
