/* Prefetching the next batch's sparse rows (docs/sparse.md, "Prefetch"): while batch t computes,
 * the rows of batch t + 1 (its ids known: the training loop reads one batch ahead and tells the net,
 * dt_net_set_lookahead) travel on a connection of their own, a second ps client that holds at most
 * one pull under way (dt_ps_client_sparse_send/_end: its replies land in the transport's queue meanwhile,
 * no thread). When batch t + 1's forward lists its ids, the prefetched rows go into the net's blocks
 * if the ids are the same, in the same order (they are, for the batch announced); otherwise they are
 * dropped and the caller pulls as before.
 *
 * Sync replicas: the pull asks for step t + 1 and the ps holds it until step t is applied (the
 * deferred SPARSE_PULLs of docs/protocol.md, with their caps): the rows are exactly those a pull
 * after the push would get. Async: the rows are read as the ps holds them when the pull arrives,
 * before this worker's own push of step t: ids in both batches miss that one update (one step
 * staler, as TensorFlow's async PS training reads variables while other updates are in flight).
 *
 * Not thread-safe: the worker's training thread only. */
#ifndef DT_WORKER_SPARSE_PREFETCH_H
#define DT_WORKER_SPARSE_PREFETCH_H

#include "worker/sparse_client.h"

typedef struct dt_sparse_prefetch dt_sparse_prefetch;

typedef struct {
    uint64_t sent;            /* pulls sent ahead */
    uint64_t taken;           /* of which filled a forward's blocks */
    uint64_t missed;          /* answered, but the forward named other ids (or was not a training one) */
    uint64_t failed;          /* failed or abandoned (the forward pulled as before) */
} dt_prefetch_stats;

/* cfg as the updater's sparse client's, but cfg->client a ps client of its own, which the prefetch
 * owns from here on (closed by dt_sparse_prefetch_free, even when create fails). */
int dt_sparse_prefetch_create(dt_sparse_prefetch **out, const dt_sparse_config *cfg, dt_net *net, dt_error *err);
void dt_sparse_prefetch_free(dt_sparse_prefetch *p);

/* Sends the pull of batch next's rows (dt_net_table_keys) at step (dt_sparse_next_want). Refused
 * (DT_EINVAL) while another is under way. */
int dt_sparse_prefetch_send(dt_sparse_prefetch *p, const dt_ctr_batch *next, int64_t step, dt_error *err);
/* After the forward listed its blocks' ids: if a prefetch is under way, waits for its rows and, when
 * its ids are the blocks', writes them there (*taken 1, *reply_step the oldest step the ps tasks
 * reported); else drops them (*taken 0). An error (the prefetch failed) leaves *taken 0. */
int dt_sparse_prefetch_take(dt_sparse_prefetch *p, int *taken, int64_t *reply_step, dt_error *err);
/* Drops the pull under way, if any, unanswered (the ps tasks were initialised again). */
void dt_sparse_prefetch_cancel(dt_sparse_prefetch *p);

const dt_prefetch_stats *dt_sparse_prefetch_stats(const dt_sparse_prefetch *p);
/* Its pulls' counts (messages, sections, rows) and its connection's sparse bytes. */
const dt_sparse_stats *dt_sparse_prefetch_pull_stats(const dt_sparse_prefetch *p);
const dt_ps_client_stats *dt_sparse_prefetch_client_stats(const dt_sparse_prefetch *p);

#endif
