/* The ps role of a training process (`dtrain train --job_name=ps`, or dt_serve). */
#ifndef DT_TRAIN_SERVE_H
#define DT_TRAIN_SERVE_H

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
/* The same on bind instead of the ps's own address when bind is non-empty (--bind; cluster.h:
 * dt_addr_bind_resolve), updating the series of metrics (NULL: none). */
struct dt_metrics;
int dt_serve_task_bind(const dt_cluster *c, const dt_placement *pl, const struct dt_auth_s *auth, const char *bind,
                       int idle_timeout_ms, const volatile int *stop, struct dt_metrics *metrics, FILE *log,
                       dt_error *err);

#endif
