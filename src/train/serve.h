/* The ps role of a training process (`dtrain train --job_name=ps`, or dt_serve). */
#ifndef DT_TRAIN_SERVE_H
#define DT_TRAIN_SERVE_H

#include <stdint.h>
#include <stdio.h>

#include "cluster/cluster.h"
#include "cluster/placement.h"

struct dt_auth_s; /* transport/auth.h */

/* Serves shard c->task_index of the placement on this ps's address (auth: CURVE keys, NULL for
 * none) until the chief sends SHUTDOWN (returns 0), *stop is set (DT_EINTR), or nobody has sent
 * anything for idle_timeout_ms (<= 0: no limit) or strict mode lost a worker (DT_ETIMEOUT). Logs
 * to log. */
int dt_serve_task(const dt_cluster *c, const dt_placement *pl, const struct dt_auth_s *auth, int idle_timeout_ms,
                  const volatile int *stop, FILE *log, dt_error *err);
struct dt_metrics;
/* What a ps task is told beyond its cluster and placement (`dtrain train`'s ps flags). */
typedef struct {
    const struct dt_auth_s *auth; /* CURVE keys; NULL: none */
    const char *bind;        /* non-empty: bind there instead of the ps's own address (--bind; cluster.h:
                              * dt_addr_bind_resolve) */
    int idle_timeout_ms;     /* <= 0: no limit */
    const volatile int *stop;
    struct dt_metrics *metrics; /* series to update; NULL: none */
    /* The most bytes the sparse tables may grow to on this ps together (--ps_table_memory); 0: three
     * quarters of the memory this process may use, a container's limit included (dt_ps_table_memory_default). */
    uint64_t table_memory;
    /* Tests only (--debug_ps_stop_at_sparse_pull): > 0, the ps stops, unanswered, at the n-th
     * SPARSE_PULL it receives from a worker (dt_ps_config's debug_stop_at_sparse_pull). */
    int64_t debug_stop_at_sparse_pull;
} dt_serve_options;
/* The same with every option. */
int dt_serve_task_opts(const dt_cluster *c, const dt_placement *pl, const dt_serve_options *so, FILE *log,
                       dt_error *err);

#endif
