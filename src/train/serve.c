/* A ps task of a cluster: hold its shard until the chief ends training. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "ps/ps.h"
#include "train/serve.h"
#include "update/decay_mask.h"

int dt_serve_task_opts(const dt_cluster *c, const dt_placement *pl, const dt_serve_options *so, FILE *log,
                       dt_error *err) {
    char endpoint[DT_ENDPOINT_MAX], field[48], warn[640];
    snprintf(field, sizeof field, "%s[%d]", c->source && !strcmp(c->source, "TF_CONFIG") ? "TF_CONFIG cluster.ps"
                                                                                          : "--ps_hosts", c->task_index);
    int rc = dt_addr_bind_resolve(&c->ps[c->task_index], field, so->bind, endpoint, sizeof endpoint, warn, sizeof warn,
                                  err);
    if (rc) return dt_error_wrap(err, rc, "ps %d: ", c->task_index);
    if (warn[0]) {
        fprintf(log, "ps %d: warning: %s\n", c->task_index, warn);
        fflush(log);
    }
    /* This ps's floats of batch-norm state (docs/batchnorm.md), in shard order. */
    size_t *state = NULL;
    int n_state = 0;
    if ((rc = dt_state_ranges_shard(&state, &n_state, pl, c->task_index, err))) return rc;
    dt_ps_stats stats;
    char ipc[DT_ENDPOINT_MAX];
    int has_ipc = dt_addr_ipc_endpoint(&c->ps[c->task_index], ipc, sizeof ipc) == 0;
    dt_ps_config cfg = {.endpoint = endpoint,
                        .ipc_endpoint = has_ipc ? ipc : NULL,
                        .ps_index = c->task_index,
                        .n_ps = c->n_ps,
                        .shard_floats = pl->shard_count[c->task_index],
                        .stop = (volatile sig_atomic_t *)so->stop,
                        .idle_timeout_ms = so->idle_timeout_ms,
                        .log = log,
                        .stats = &stats,
                        .auth = so->auth,
                        .state_ranges = state,
                        .n_state_ranges = n_state,
                        .metrics = so->metrics,
                        .table_memory = so->table_memory,
                        .debug_stop_at_sparse_pull = so->debug_stop_at_sparse_pull};
    rc = dt_ps_serve(&cfg, err);
    free(state);
    if (has_ipc) unlink(ipc + strlen("ipc://")); /* the transport leaves the socket file behind */
    if (rc == 0)
        fprintf(log, "ps %d: training over at global step %lld (%llu pushes, %llu pulls); exiting\n",
                c->task_index, (long long)stats.global_step, (unsigned long long)stats.pushes,
                (unsigned long long)stats.pulls);
    return rc;
}

int dt_serve_task(const dt_cluster *c, const dt_placement *pl, const struct dt_auth_s *auth, int idle_timeout_ms,
                  const volatile int *stop, FILE *log, dt_error *err) {
    const dt_serve_options so = {.auth = auth, .idle_timeout_ms = idle_timeout_ms, .stop = stop};
    return dt_serve_task_opts(c, pl, &so, log, err);
}
