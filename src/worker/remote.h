/* The remote updater: a worker's side of training with parameter servers. Gradients are cut into
 * the ps shards by the placement and pushed to every ps at once; fresh parameters are pulled back
 * into the net's flat buffer. The chief initialises the ps tasks; other workers wait (bounded).
 * At the end each worker logs where its time went (compute, exchange, waiting at the barrier) and
 * how many of its gradients arrived stale. */
#ifndef DT_WORKER_REMOTE_H
#define DT_WORKER_REMOTE_H

#include <stdio.h>

#include "cluster/cluster.h"
#include "cluster/placement.h"
#include "compute/lazy_optim.h"
#include "compute/optim.h"
#include "transport/compress.h"
#include "update/updater.h"
#include "worker/overlap.h"

struct dt_sparse_client; /* worker/sparse_client.h */

typedef struct {
    const dt_cluster *cluster;    /* job must be worker */
    const dt_placement *placement;
    dt_opt_config opt;
    int connect_timeout_ms;       /* retrying the ps tasks, and waiting for the chief to initialise */
    int request_timeout_ms;       /* any single request (<= 0: 60000) */
    int n_workers_to_wait;        /* chief: workers (besides itself) whose end it waits for */
    /* Dynamic sharding: the worker task indices the chief's INIT declares, any of which may join
     * (INIT's ELASTIC flag: none is waited for before it shows up); 0: fixed, the cluster's. */
    int max_workers;
    /* Sync replicas (docs/protocol.md); replicas_to_aggregate 0: asynchronous. Each step this
     * worker pushes the gradient for its step t and waits until the ps tasks have applied step
     * t - staleness (staleness 0: the step itself, TensorFlow's token barrier), then computes on
     * the parameters it pulled, every shard at one step. */
    int replicas_to_aggregate, total_num_replicas, staleness;
    int step_delay_ms;            /* testing: sleep before each push (a slow worker) */
    /* Faults (docs/faults.md). A ps that stops answering (or comes back uninitialised) is waited
     * for with backoff up to ps_timeout_ms (0: fail at once); then the chief re-initialises every
     * shard from the newest checkpoint (reload; none: from the seed at step 0) and every worker
     * resumes from what the ps tasks then hold. Sync mode: strict makes a lost worker stop the job
     * instead of lowering the replicas a step waits for. */
    int ps_timeout_ms, strict;
    int64_t chunk_bytes;          /* chief: the cut INIT asks for (ps_client.h); 0: one chunk per shard */
    dt_encoding compression;      /* gradients up and parameters down in 16 bits (ps_client.h); 0: float32 */
    /* Stream the exchange under backward and the next forward (worker/overlap.h), through the
     * net's hooks; DT_OVERLAP_NONE (0): exchange between steps. */
    dt_overlap_mode overlap;
    /* A compact net's embedding tables (model/net.h) live on the ps tasks as sparse tables
     * (worker/sparse_client.h), updated with this optimizer; the chief declares them after each
     * INIT. Ignored for a net without compact tables. */
    dt_lazy_config table_opt;
    /* The next batch's rows pulled under the current step's compute, on a second connection
     * (worker/sparse_prefetch.h; the training loop announces the batch: dt_net_set_lookahead). */
    int sparse_prefetch;
    uint64_t seed;
    const volatile int *stop;     /* may be NULL; set (a signal): waits for the ps tasks end */
    /* The newest checkpoint in the flat layout (params [n], state [slots * n]): 1 if there is one,
     * 0 if none, < 0 on error. NULL: none. */
    int (*reload)(void *user, const float **params, const float **state, int64_t *step, dt_error *err);
    /* Chief, a compact net: the sparse tables' rows of the checkpoint restored (or reloaded for a
     * rollback) into the ps tasks, once their SPARSE_INIT is in (dt_sparse_import). NULL: the tables
     * start from their initial rows. */
    int (*tables)(void *user, struct dt_sparse_client *sparse, dt_error *err);
    void *user;
    FILE *log;
    const struct dt_auth_s *auth; /* CURVE keys (transport/auth.h); NULL: no security */
    struct dt_metrics *metrics;   /* the ps client's series (ps_client.h); NULL: none */
} dt_remote_config;

int dt_remote_updater_create(dt_updater **out, const dt_remote_config *cfg, dt_error *err);

/* Where a remote updater's time went so far (what its end-of-training log line says). */
typedef struct {
    int64_t updates;              /* gradients pushed */
    int64_t stale;                /* of which at least one ps dropped as stale */
    int64_t stale_ref;            /* of which ps 0's chunk 0 dropped as stale: under dynamic
                                   * sharding, those whose batch did not count */
    double compute_s;             /* between updates: batches, forward, backward (and any delay) */
    double exchange_s;            /* pushing and pulling, placement copies included */
    double wait_s;                /* of exchange_s: PULLs held at the ps (the barrier) */
    uint64_t repulls;             /* shards pulled again to get one step */
    double rows_wait_s;           /* of exchange_s: training forwards waiting for their sparse rows (a
                                   * pull, or the prefetched one's replies) */
} dt_remote_timing;
void dt_remote_get_timing(const dt_updater *remote_updater, dt_remote_timing *out);

/* A second client to the same ps tasks, with this updater's role, task, keys and timeouts, for
 * messages sent while an overlapped exchange holds the updater's own (dynamic data sharding's
 * claims, train/work_loop.h); float32, no metrics. The caller closes it. */
int dt_remote_open_client(dt_updater *remote_updater, struct dt_ps_client **out, dt_error *err);
/* Its sparse tables' client (a compact net's, once started or restored); NULL: none. */
struct dt_sparse_client *dt_remote_sparse(dt_updater *remote_updater);
/* The step the next gradient is for (its PUSH carries it): sync, the step this worker is at; async,
 * with --overlap the step of the exchange last settled, else tag (the loop's). */
int64_t dt_remote_next_tag(const dt_updater *remote_updater, int64_t tag);
/* The same before the exchange in flight has ended (with --overlap it runs under the next forward):
 * sync, the step it will end at if the cluster waits for this worker (dt_remote_next_tag says, once
 * it has ended); -1 when not known before then (async with --overlap: the step its reply brings). */
int64_t dt_remote_expected_tag(const dt_updater *remote_updater, int64_t tag);
/* Pulls the parameters again into net and takes the cluster's step: a claim found its step applied
 * already, or the worker sat steps out (sync) and trains again. */
int dt_remote_resync(dt_updater *remote_updater, dt_net *net, int64_t *global_step, dt_error *err);

#endif
