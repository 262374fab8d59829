/* The parameter server: one process (or thread) that holds one shard of the model's parameters and
 * their optimizer state, applies the workers' gradients and serves the parameters back.
 *
 * Life of a ps (docs/protocol.md):
 *   1. binds cfg->endpoint (the transport's server, transport/conn.h) and answers HELLO/STATUS/HEARTBEAT right away;
 *   2. refuses PULL and PUSH (ERROR "not initialised") until the chief sends INIT with the initial
 *      parameters, optimizer state, optimizer configuration and starting global step;
 *   3. async mode (INIT's replicas_to_aggregate 0): applies each PUSH on arrival with dt_opt_apply
 *      and increments its global step. Sync replicas: holds each step's gradients until
 *      replicas_to_aggregate of them are in, applies their mean once (summed in worker-index order)
 *      and increments the step; a gradient for a step already applied is stale: dropped, counted per
 *      worker and logged. PULLs may ask for a minimum step (the reply waits until the shard gets
 *      there: the barrier) or an exact one (sync mode keeps the last few steps' snapshots), so a
 *      worker can get every shard at the same step;
 *   4. returns 0 when the chief sends SHUTDOWN (after acknowledging it).
 *
 * Global step: every ps counts the updates applied to its own shard, starting from the step INIT
 * gave. A worker pushes to every ps, so the counts agree once in-flight pushes have landed; ps 0's
 * count is the cluster's global step (TensorFlow keeps global_step on ps 0 too). Every reply
 * carries the shard's step, so a client can check that the shards it pulled belong together.
 *
 * No signal handler is installed here: the caller's handler sets *cfg->stop and dt_ps_serve returns
 * DT_EINTR within poll_ms. Every wait is the transport's, with a timeout. */
#ifndef DT_PS_PS_H
#define DT_PS_PS_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dtrain.h"
#include "ps/shard.h" /* DT_PS_PENDING_PER_PEER */
#include "transport/wire.h"

typedef struct {
    int64_t global_step;    /* at return */
    uint64_t pushes;        /* gradients accepted (async: each applied; sync: each added to its step) */
    uint64_t updates;       /* optimizer updates applied (async: = pushes; sync: one per step) */
    uint64_t stale;         /* sync: stale gradients dropped (per worker in the log) */
    uint64_t weighted;      /* sync: steps whose gradients averaged different numbers of examples
                             * (the mean over the examples, not over the gradients) */
    uint64_t pulls;         /* PARAMS replies sent */
    uint64_t refused;       /* requests answered with ERROR (malformed, wrong version, not ready...) */
    uint64_t cut;           /* connections cut off for holding too much (transport/peers.h) */
    int pending;            /* deferred PULLs still held at return */
    int initialised;
} dt_ps_stats;

typedef struct {
    const char *endpoint;   /* bind endpoint "tcp://host:port" (host "*": all interfaces; port "*": a free one) */
    const char *ipc_endpoint; /* NULL, or a second endpoint also bound ("ipc://path": same-host workers) */
    int ps_index;           /* this ps's task index (sent in every reply) */
    int n_ps;               /* ps tasks in the cluster: a SPARSE_PULL or SPARSE_PUSH naming an id whose
                             * home (dt_row_ps) is another ps is refused; 0: not checked */
    size_t shard_floats;    /* parameters this ps holds (> 0, <= DT_WIRE_MAX_SHARD_FLOATS) */
    int poll_ms;            /* how often *stop and the deadlines are checked; <= 0: 100 */
    int idle_timeout_ms;    /* no message from anyone for this long: return DT_ETIMEOUT; <= 0: never */
    volatile sig_atomic_t *stop; /* may be NULL; set non-zero (e.g. by a signal handler) to stop */
    FILE *log;              /* one line per notable event (init, refusals, shutdown); NULL: quiet */
    /* Called once after binding with the actual endpoint (port resolved for "*"), e.g. for a
     * launcher or a test that binds port 0. May be NULL. */
    void (*on_bound)(void *user, const char *endpoint);
    void *user;
    dt_ps_stats *stats;     /* filled at return if non-NULL */
    const struct dt_auth_s *auth; /* CURVE keys (transport/auth.h); NULL: no security */
    /* Connection bounds (docs/security.md); <= 0: the defaults (10 s, 1024, or less as the
     * descriptor limit allows). */
    int first_message_ms;   /* a new connection must send a valid message within this */
    int max_connections;    /* beyond: the least recently useful connection is cut */
    /* Floats of the shard that are state, not trained (batch norm's moving statistics,
     * docs/batchnorm.md): a push carries their change, which is added as it is (sync: the step's
     * mean of the changes, weighted as the gradients); the optimizer skips them (their slots stay as INIT gave them: 0). Pairs [offset, count] in shard
     * floats, ascending, not overlapping; NULL when there are none. */
    const size_t *state_ranges; /* [2 * n_state_ranges] */
    int n_state_ranges;
    struct dt_metrics *metrics; /* Prometheus series of this ps (docs/metrics.md); NULL: none */
    /* The most bytes the sparse tables may grow to here together at their capacities (a SPARSE_INIT
     * past it is refused: docs/sparse.md, "Memory"); 0: dt_ps_table_memory_default(). */
    uint64_t table_memory;
    /* Tests only: > 0, dt_ps_serve returns DT_EINTR, unanswered, at the n-th SPARSE_PULL a worker sends
     * (the ps lost in the middle of a sparse pull, on purpose: tests/test_sparse_ps_lost.sh). */
    int64_t debug_stop_at_sparse_pull;
} dt_ps_config;

/* Three quarters of the memory this process may use (the machine's physical memory, or its cgroup's
 * limit if lower: a container's; dt_mem_limit), or 4 GiB if neither can be read: what the sparse
 * tables of one ps may grow to by default. */
uint64_t dt_ps_table_memory_default(void);

/* Serves until SHUTDOWN from the chief (returns 0), *stop (DT_EINTR), the idle deadline or, strict,
 * a lost worker (DT_ETIMEOUT, message says which), or a fatal socket error.
 * Fails up front if the endpoint cannot be bound (message names it). */
int dt_ps_serve(const dt_ps_config *cfg, dt_error *err);

#endif
