/* The remote updater: a worker's side of training with parameter servers. Gradients are cut into
 * the ps shards by the placement and pushed to every ps at once; fresh parameters are pulled back
 * into the net's flat buffer. The chief initialises the ps tasks; other workers wait (bounded). */
#ifndef DT_WORKER_REMOTE_H
#define DT_WORKER_REMOTE_H

#include <stdio.h>

#include "cluster/cluster.h"
#include "cluster/placement.h"
#include "compute/optim.h"
#include "train/updater.h"

typedef struct {
    const dt_cluster *cluster;    /* job must be worker */
    const dt_placement *placement;
    dt_opt_config opt;
    int connect_timeout_ms;       /* retrying the ps tasks, and waiting for the chief to initialise */
    int request_timeout_ms;       /* any single request (<= 0: 60000) */
    int n_workers_to_wait;        /* chief: workers (besides itself) whose end it waits for */
    FILE *log;
} dt_remote_config;

int dt_remote_updater_create(dt_updater **out, const dt_remote_config *cfg, dt_error *err);

#endif
