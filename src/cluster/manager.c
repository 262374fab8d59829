#include "cluster/manager.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cluster/hostlist.h"
#include "cluster/rendezvous.h"
#include "core/error.h"

/* A job's tasks: every ps and every worker. */
#define MAX_RANKS (2 * DT_CLUSTER_MAX_TASKS)

static const char *env_get(const dt_manager_options *m, const char *name) {
    const char *v = m->env ? m->env(m->env_ctx, name) : getenv(name);
    return v && *v ? v : NULL;
}

/* An integer variable in lo..hi. Absent: *out = dflt if !required. */
static int env_int(const dt_manager_options *m, const char *name, long lo, long hi, int required, long dflt,
                   long *out, dt_error *err) {
    const char *v = env_get(m, name);
    char q[80];
    *out = dflt;
    if (!v) return required ? dt_errorf(err, DT_EINVAL, "%s: not set", name) : 0;
    size_t len = strlen(v), i = 0;
    long value = 0;
    if (len == 0 || len > 9) goto bad; /* beyond 10^9 is beyond any range here */
    for (; i < len; i++) {
        if (v[i] < '0' || v[i] > '9') goto bad;
        value = value * 10 + (v[i] - '0');
    }
    if (value < lo || value > hi)
        return dt_errorf(err, DT_EINVAL, "%s: %ld is out of range %ld..%ld", name, value, lo, hi);
    *out = value;
    return 0;
bad:
    return dt_errorf(err, DT_EINVAL, "%s: %s is not a number in %ld..%ld", name, dt_text_quote(q, v, len), lo, hi);
}

/* Appends to c->origin (the one line `dtrain train` prints below the cluster). */
static void note(dt_cluster *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(dt_cluster *c, const char *fmt, ...) {
    size_t used = strlen(c->origin);
    if (used + 1 >= sizeof c->origin) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->origin + used, sizeof c->origin - used, fmt, ap);
    va_end(ap);
}

/* The task count must leave room for a worker. */
static int check_size(long size, int num_ps, const char *var, dt_error *err) {
    if (size < num_ps + 1)
        return dt_errorf(err, DT_EINVAL, "%s: %ld task%s, but --num_ps %d needs at least %d (%d ps and a worker)", var,
                         size, size == 1 ? "" : "s", num_ps, num_ps + 1, num_ps);
    if (size - num_ps > DT_CLUSTER_MAX_TASKS)
        return dt_errorf(err, DT_EINVAL, "%s: %ld tasks, more than --num_ps %d plus %d workers", var, size, num_ps,
                         DT_CLUSTER_MAX_TASKS);
    return 0;
}

static int port_of(int base, long local, const char *local_var, dt_addr *a, dt_error *err) {
    if (base + local > 65535)
        return dt_errorf(err, DT_EINVAL, "%s: --base_port %d + local id %ld is past port 65535", local_var, base,
                         local);
    a->port = base + (int)local;
    return 0;
}

/* ---- Slurm ---- */

typedef struct {
    const char *name, *value; /* the variable used, and its value */
} var;

static var first_of(const dt_manager_options *m, const char *a, const char *b) {
    var v = {a, env_get(m, a)};
    if (!v.value) v = (var){b, env_get(m, b)};
    return v;
}

/* Places every rank on a node, as Slurm does: block fills node 0's count first, cyclic deals one
 * task to each node with room in turn. node[r], local[r]: rank r's node and index on it. */
static void lay_out(const int *counts, int n_nodes, int n_ranks, int cyclic, int *node, int *local, int *filled) {
    memset(filled, 0, (size_t)n_nodes * sizeof *filled);
    if (!cyclic) {
        for (int r = 0, k = 0; r < n_ranks; r++) {
            while (filled[k] == counts[k]) k++; /* counts sum to n_ranks: k stays < n_nodes */
            node[r] = k;
            local[r] = filled[k]++;
        }
        return;
    }
    for (int r = 0, k = 0; r < n_ranks; r++) {
        while (filled[k] == counts[k]) k = (k + 1) % n_nodes;
        node[r] = k;
        local[r] = filled[k]++;
        k = (k + 1) % n_nodes;
    }
}

/* A Slurm task's view of its step, from its environment. */
typedef struct {
    long rank, ntasks, localid, nodeid; /* localid, nodeid: -1 when not set */
    var list, tpn;            /* the step's (or job's) node list and tasks per node */
    const char *dist;         /* SLURM_DISTRIBUTION, or NULL */
    int cyclic;
} slurm_env;

static int slurm_env_read(const dt_manager_options *m, slurm_env *s, dt_error *err) {
    char q[80];
    int rc;
    if (!env_get(m, "SLURM_STEP_ID") && !env_get(m, "SLURM_STEPID"))
        return dt_errorf(err, DT_EINVAL, "SLURM_STEP_ID: not set, so this is a job's batch script and not one of "
                         "its tasks: start dtrain with srun (examples/slurm/)");
    if ((rc = env_int(m, "SLURM_NTASKS", 1, 1000000000, 1, 0, &s->ntasks, err))) return rc;
    if ((rc = check_size(s->ntasks, m->num_ps, "SLURM_NTASKS", err))) return rc;
    if ((rc = env_int(m, "SLURM_PROCID", 0, s->ntasks - 1, 1, 0, &s->rank, err))) return rc;
    if ((rc = env_int(m, "SLURM_LOCALID", 0, s->ntasks - 1, 0, -1, &s->localid, err))) return rc;
    if ((rc = env_int(m, "SLURM_NODEID", 0, s->ntasks - 1, 0, -1, &s->nodeid, err))) return rc;
    s->list = first_of(m, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST");
    s->tpn = first_of(m, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE");
    if (!s->list.value) return dt_errorf(err, DT_EINVAL, "SLURM_STEP_NODELIST: not set (nor SLURM_JOB_NODELIST)");
    if (!s->tpn.value)
        return dt_errorf(err, DT_EINVAL, "SLURM_STEP_TASKS_PER_NODE: not set (nor SLURM_TASKS_PER_NODE)");
    const char *dist = s->dist = env_get(m, "SLURM_DISTRIBUTION");
    s->cyclic = dist && !strncmp(dist, "cyclic", 6) && (dist[6] == '\0' || dist[6] == ':');
    if (dist && !s->cyclic && !(!strncmp(dist, "block", 5) && (dist[5] == '\0' || dist[5] == ':')))
        return dt_errorf(err, DT_EINVAL, "SLURM_DISTRIBUTION: %s: dtrain derives addresses for block or cyclic "
                         "only (give --ps_hosts/--worker_hosts for another layout)",
                         dt_text_quote(q, dist, strlen(dist)));
    return DT_OK;
}

/* This task's own variables must agree with the layout, or every address is wrong. q, q2: the
 * node list and tasks per node, quoted. */
static int slurm_check_self(const dt_manager_options *m, const slurm_env *s, const dt_hostlist *hosts, const int *node,
                            const int *local, const char *q, const char *q2, dt_error *err) {
    const long r = s->rank;
    const char *layout = s->cyclic ? "cyclic" : "block", *host = hosts->host[node[r]];
    if (s->localid >= 0 && s->localid != local[r])
        return dt_errorf(err, DT_EINVAL, "SLURM_LOCALID: %ld, but %s=%s over %s=%s (%s) makes rank %ld task %d of "
                         "node %s", s->localid, s->tpn.name, q2, s->list.name, q, layout, r, local[r], host);
    if (s->nodeid >= 0 && s->nodeid != node[r])
        return dt_errorf(err, DT_EINVAL, "SLURM_NODEID: %ld, but %s=%s over %s=%s (%s) puts rank %ld on node %d (%s)",
                         s->nodeid, s->tpn.name, q2, s->list.name, q, layout, r, node[r], host);
    const char *self = env_get(m, "SLURMD_NODENAME");
    if (self && strcasecmp(self, host))
        return dt_errorf(err, DT_EINVAL, "SLURMD_NODENAME: %s, but %s=%s over %s=%s (%s) puts rank %ld on %s",
                         dt_text_quote((char[80]){0}, self, strlen(self)), s->tpn.name, q2, s->list.name, q, layout, r,
                         host);
    return DT_OK;
}

static int from_slurm(dt_cluster *c, const dt_manager_options *m, int base, dt_error *err) {
    char q[80], q2[80];
    slurm_env s;
    int rc = slurm_env_read(m, &s, err);
    if (rc) return rc;
    const long ntasks = s.ntasks, rank = s.rank;
    dt_hostlist hosts = {0};
    int *counts = NULL, n_counts = 0, *node = NULL, *local = NULL, *filled = NULL;
    dt_addr *addrs = NULL;
    if ((rc = dt_hostlist_parse(&hosts, s.list.value, strlen(s.list.value), DT_HOSTLIST_MAX, s.list.name, err)) ||
        (rc = dt_tasks_per_node_parse(&counts, &n_counts, s.tpn.value, strlen(s.tpn.value), DT_HOSTLIST_MAX,
                                      s.tpn.name, err)))
        goto out;
    dt_text_quote(q, s.list.value, strlen(s.list.value));
    dt_text_quote(q2, s.tpn.value, strlen(s.tpn.value));
    if (n_counts != hosts.n) {
        rc = dt_errorf(err, DT_EINVAL, "%s: %s counts %d node%s, but %s=%s names %d", s.tpn.name, q2, n_counts,
                       n_counts == 1 ? "" : "s", s.list.name, q, hosts.n);
        goto out;
    }
    long sum = 0;
    for (int i = 0; i < n_counts; i++) sum += counts[i];
    if (sum != ntasks) {
        rc = dt_errorf(err, DT_EINVAL, "%s: %s sums to %ld tasks, but SLURM_NTASKS=%ld", s.tpn.name, q2, sum, ntasks);
        goto out;
    }
    node = dt_calloc((size_t)ntasks, sizeof *node, "the Slurm layout", err);
    local = dt_calloc((size_t)ntasks, sizeof *local, "the Slurm layout", err);
    filled = dt_calloc((size_t)n_counts, sizeof *filled, "the Slurm layout", err);
    addrs = dt_calloc((size_t)ntasks, sizeof *addrs, "the Slurm addresses", err);
    if (!node || !local || !filled || !addrs) {
        rc = DT_ENOMEM;
        goto out;
    }
    lay_out(counts, n_counts, (int)ntasks, s.cyclic, node, local, filled);
    if ((rc = slurm_check_self(m, &s, &hosts, node, local, q, q2, err))) goto out;
    for (long r = 0; r < ntasks; r++) {
        snprintf(addrs[r].host, sizeof addrs[r].host, "%s", hosts.host[node[r]]);
        if ((rc = port_of(base, local[r], "SLURM_LOCALID", &addrs[r], err))) goto out;
    }
    if ((rc = dt_cluster_from_ranks(c, addrs, (int)ntasks, m->num_ps, (int)rank, "slurm", err))) {
        rc = dt_error_wrap(err, rc, "%s=%s with %s=%s: ", s.list.name, q, s.tpn.name, q2);
        goto out;
    }
    note(c, "rank %ld of %ld (SLURM_PROCID=%ld, SLURM_NTASKS=%ld); hosts from %s=%s, %s=%s, %s; ports --base_port "
         "%d + local id (SLURM_LOCALID=%d)", rank, ntasks, rank, ntasks, s.list.name, q, s.tpn.name, q2,
         s.dist ? "SLURM_DISTRIBUTION" : "block (Slurm's default)", base, local[rank]);
    if (s.dist) note(c, "=%s", s.cyclic ? "cyclic" : "block");
out:
    dt_hostlist_free(&hosts);
    free(counts);
    free(node);
    free(local);
    free(filled);
    free(addrs);
    return rc;
}

/* ---- MPI ---- */

typedef struct {
    const char *rank, *size, *local_rank, *local_size; /* the variables' names */
} mpi_vars;

static const mpi_vars OMPI = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                              "OMPI_COMM_WORLD_LOCAL_SIZE"};
static const mpi_vars PMI = {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"};

static int from_mpi(dt_cluster *c, const dt_manager_options *m, const mpi_vars *v, int base, dt_error *err) {
    long size, rank, local, local_size;
    int rc;
    if ((rc = env_int(m, v->size, 1, 1000000000, 1, 0, &size, err))) return rc;
    if ((rc = check_size(size, m->num_ps, v->size, err))) return rc;
    if ((rc = env_int(m, v->rank, 0, size - 1, 1, 0, &rank, err))) return rc;
    if ((rc = env_int(m, v->local_size, 1, size, 0, 0, &local_size, err))) return rc;
    if ((rc = env_int(m, v->local_rank, 0, local_size ? local_size - 1 : size - 1, 0, -1, &local, err))) return rc;
    /* Without a local rank, the world rank keeps ports apart (wider, never clashing). */
    const char *local_var = local >= 0 ? v->local_rank : v->rank;
    if (local < 0) local = rank;
    dt_addr *addrs = dt_calloc((size_t)size, sizeof *addrs, "the MPI addresses", err);
    if (!addrs) return DT_ENOMEM;
    const char *at = m->rendezvous && *m->rendezvous ? m->rendezvous : NULL;
    if (at) {
        dt_rendezvous rv = {.at = at, .rank = (int)rank, .size = (int)size, .port = base + (int)local,
                            .local = (int)local, .rank_var = v->rank, .size_var = v->size, .local_var = local_var,
                            .deadline_ms = m->deadline_ms, .log = m->log};
        if (base + local > 65535) rc = port_of(base, local, local_var, &addrs[0], err);
        else rc = dt_rendezvous_gather(&rv, addrs, err);
    } else if (local_size == size) {
        /* One host: loopback reaches every rank, and the world rank, which every rank knows of
         * every other, keeps the ports apart (it is the local rank too when all share a host). */
        local_var = v->rank;
        local = rank;
        for (long r = 0; r < size && !rc; r++) {
            snprintf(addrs[r].host, sizeof addrs[r].host, "127.0.0.1");
            rc = port_of(base, r, local_var, &addrs[r], err);
        }
    } else {
        rc = dt_errorf(err, DT_EINVAL, "%s: %s, so the ranks span several hosts, whose addresses MPI does not put in "
                       "the environment: give --rendezvous HOST:PORT, HOST being where rank 0 runs", v->local_size,
                       local_size ? "smaller than the world" : "not set");
    }
    if (!rc) rc = dt_cluster_from_ranks(c, addrs, (int)size, m->num_ps, (int)rank, "mpi", err);
    free(addrs);
    if (rc) return rc;
    note(c, "rank %ld of %ld (%s=%ld, %s=%ld); hosts ", rank, size, v->rank, rank, v->size, size);
    if (at) note(c, "gathered at --rendezvous %s", at);
    else note(c, "127.0.0.1 (%s=%ld: every rank on this host)", v->local_size, local_size);
    note(c, "; ports --base_port %d + %s=%ld", base, local_var, local);
    return 0;
}

/* ---- which manager ---- */

int dt_cluster_from_manager(dt_cluster *c, const dt_manager_options *m, dt_error *err) {
    dt_cluster_single(c);
    int base = m->base_port ? m->base_port : DT_BASE_PORT_DEFAULT, rc;
    if (m->num_ps < 1 || m->num_ps > DT_CLUSTER_MAX_TASKS)
        return dt_errorf(err, DT_EINVAL, "--num_ps: %d is out of range 1..%d", m->num_ps, DT_CLUSTER_MAX_TASKS);
    if (base < 1 || base > 65535) return dt_errorf(err, DT_EINVAL, "--base_port: %d is out of range 1..65535", base);
    const char *slurm_rank = env_get(m, "SLURM_PROCID"), *pmi_rank = env_get(m, "PMI_RANK");
    const char *slurm_size = env_get(m, "SLURM_NTASKS"), *pmi_size = env_get(m, "PMI_SIZE");
    int in_step = env_get(m, "SLURM_STEP_ID") || env_get(m, "SLURM_STEPID");
    /* PMI variables beside Slurm's: srun --mpi=pmi2 (the same ranks: Slurm's, which name hosts), or
     * a PMI launcher inside an allocation whose Slurm variables are its own launch's or inherited. */
    int pmi_is_slurm = pmi_rank && in_step && slurm_rank && slurm_size && pmi_size && !strcmp(pmi_rank, slurm_rank) &&
                       !strcmp(pmi_size, slurm_size);
    if (env_get(m, OMPI.rank)) rc = from_mpi(c, m, &OMPI, base, err);
    else if (slurm_rank && (!pmi_rank || pmi_is_slurm)) rc = from_slurm(c, m, base, err);
    else if (pmi_rank) rc = from_mpi(c, m, &PMI, base, err);
    else
        return dt_errorf(err, DT_EINVAL, "--num_ps: no cluster manager in the environment (looked for "
                         "OMPI_COMM_WORLD_RANK, SLURM_PROCID and PMI_RANK): start dtrain with mpirun or srun, or "
                         "give --ps_hosts/--worker_hosts/--job_name/--task_index");
    if (rc) return rc;
    note(c, "; ranks 0..%d are ps tasks (--num_ps %d), rank %d is the chief", m->num_ps - 1, m->num_ps, m->num_ps);
    if (env_get(m, "TF_CONFIG")) note(c, "; TF_CONFIG ignored (--num_ps takes the manager's)");
    return 0;
}
