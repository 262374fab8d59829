/* The cluster definition: which ps and worker tasks exist, at which addresses, and which one this
 * process is. Every process builds the same definition from one of three sources (docs/cluster.md):
 *   1. flags   --ps_hosts=h:p,... --worker_hosts=h:p,... --job_name=ps|worker --task_index=N
 *   2. the TF_CONFIG environment variable (JSON, as written by Kubernetes operators)
 *   3. a local definition on 127.0.0.1 (what `dtrain launch` starts)
 *   4. a cluster manager's environment: Slurm, Open MPI, PMI (cluster/manager.h, with --num_ps)
 * Precedence: any of the four flags -> the flags alone define the cluster; else --num_ps -> the
 * manager's environment (dt_train); else a non-empty TF_CONFIG; else a single process (no cluster).
 *
 * Worker indexing: the chief counts as a worker and is always worker 0. A TF_CONFIG `chief` (or the
 * legacy `master`) becomes worker 0 and TF_CONFIG's workers are shifted by one (TF_CONFIG worker i is
 * our worker i+1); without a chief, worker 0 is the chief. So "worker 0 is the chief" holds everywhere
 * and n_workers = len(worker) + len(chief), as in TensorFlow. An evaluator is not a training task: it
 * has its own list and is never the chief. */
#ifndef DT_CLUSTER_CLUSTER_H
#define DT_CLUSTER_CLUSTER_H

#include <stddef.h>

#include "dtrain.h"

#define DT_HOST_MAX 256            /* a DNS name is at most 253 characters; "[v6]" fits too */
#define DT_CLUSTER_MAX_TASKS 4096  /* per job: bounds memory and the duplicate check */
#define DT_ENDPOINT_MAX (DT_HOST_MAX + 16) /* "tcp://" + host + ":65535" + NUL */

typedef enum {
    DT_JOB_NONE = 0,   /* single process, or a launcher that only describes the cluster */
    DT_JOB_PS,
    DT_JOB_WORKER,
    DT_JOB_EVALUATOR,
} dt_job;

typedef struct {
    char host[DT_HOST_MAX]; /* name or IPv4 as written; IPv6 keeps its brackets: "[::1]" */
    int port;               /* 1..65535 */
} dt_addr;

typedef struct dt_cluster {
    int distributed;        /* 0: single process, every list empty, is_chief = 1 */
    int n_ps;
    dt_addr *ps;            /* [n_ps], owned */
    int n_workers;          /* chief included */
    dt_addr *workers;       /* [n_workers], owned; workers[0] is the chief */
    int n_evaluators;
    dt_addr *evaluators;    /* [n_evaluators], owned (TF_CONFIG only) */
    dt_job job;             /* this process */
    int task_index;         /* index into this job's list */
    int is_chief;           /* job == worker && task_index == 0, or single process */
    const char *source;     /* "single process", "flags", "TF_CONFIG", "local", "slurm" or "mpi" (static) */
    char origin[768];       /* a cluster manager's: where each derived value came from (manager.h); or "" */
} dt_cluster;

/* Every constructor below starts by overwriting *c (it need not be initialised) and, on failure,
 * leaves it as a single-process definition with nothing allocated. Release with dt_cluster_clear. */

/* A single process: no ps, no workers, is_chief = 1. Allocates nothing. */
void dt_cluster_single(dt_cluster *c);

/* From the four flag values; NULL means the flag was not given (task_index then defaults to 0,
 * ps_hosts to no ps). worker_hosts and job_name are required. job_name is "ps" or "worker". */
int dt_cluster_from_flags(dt_cluster *c, const char *ps_hosts, const char *worker_hosts,
                          const char *job_name, const char *task_index, dt_error *err);

/* From TF_CONFIG text (len bytes, need not be NUL-terminated). Text that is empty or only
 * whitespace, `{}`, or an object without "cluster" and "task" gives a single process. */
int dt_cluster_from_tf_config(dt_cluster *c, const char *text, size_t len, dt_error *err);

/* n_ps ps tasks and n_workers workers on 127.0.0.1; ports [n_ps + n_workers], ps first. job may be
 * DT_JOB_NONE for a launcher that only needs the lists. */
int dt_cluster_local(dt_cluster *c, int n_ps, int n_workers, const int *ports, dt_job job,
                     int task_index, dt_error *err);

/* n ranks of a cluster manager's job (cluster/manager.h): ranks [0, n_ps) are ps 0..n_ps-1 and the
 * rest workers, rank n_ps being worker 0, the chief; this process is rank `rank`. addrs[n] are the
 * ranks' addresses (checked like any list: a duplicate is refused as "rank 2: duplicate address
 * h:p (also rank 1)"); source is a static string. */
int dt_cluster_from_ranks(dt_cluster *c, const dt_addr *addrs, int n, int n_ps, int rank, const char *source,
                          dt_error *err);

/* Applies the precedence: any flag non-NULL -> flags; else tf_config non-NULL and not blank ->
 * TF_CONFIG; else single process. */
int dt_cluster_resolve(dt_cluster *c, const char *ps_hosts, const char *worker_hosts,
                       const char *job_name, const char *task_index, const char *tf_config,
                       dt_error *err);

/* Behind the public dt_cluster_from_args (include/dtrain.h), change 1 of 3 for a user's program: consumes --ps_hosts, --worker_hosts, --job_name and
 * --task_index (as `--flag=value` or `--flag value`) from argv, reads getenv("TF_CONFIG"), and
 * resolves as above. Other arguments stay in argv in their order; *argc is updated and
 * argv[*argc] = NULL. Scanning stops at "--". On failure argv is left unchanged. */
int dt_cluster_parse_args(dt_cluster *c, int *argc, char **argv, dt_error *err);

/* Frees what c holds and leaves it a single process (c itself is the caller's: the public
 * dt_cluster_free frees both). */
void dt_cluster_clear(dt_cluster *c);

/* This process's address, or NULL (single process, launcher, evaluator not listed). */
const dt_addr *dt_cluster_self(const dt_cluster *c);

/* "ps", "worker", "evaluator", "none". */
const char *dt_job_name(dt_job job);

/* One line for logs, e.g. "worker 1 of 2 (not chief); ps=[10.0.0.1:2222]
 * workers=[10.0.0.1:2224,10.0.0.2:2225]; from flags". Long lists are shortened. Always
 * NUL-terminates (truncating if n is small). */
void dt_cluster_describe(const dt_cluster *c, char *buf, size_t n);

/* The list of one job as "h:p,h:p" (to pass --ps_hosts/--worker_hosts to child processes).
 * DT_EINVAL if buf is too small. */
int dt_cluster_format_hosts(const dt_cluster *c, dt_job job, char *buf, size_t n, dt_error *err);

/* Untrusted text for a message (cluster/hostlist.c, manager.c): in double quotes, at most 64
 * characters then "...", non-printables as '?'. Returns out. */
const char *dt_text_quote(char out[80], const char *s, size_t len);

/* Parses one "host:port" (len bytes; surrounding blanks ignored). field names the value in
 * messages, e.g. "--ps_hosts[1]". */
int dt_addr_parse(dt_addr *a, const char *text, size_t len, const char *field, dt_error *err);

/* The transport's endpoints (transport/conn.h), "tcp://host:port". Connect: the address as listed.
 * Bind: the same, with "localhost" as 127.0.0.1 (the transport binds addresses, not names); a ps
 * resolves other names with dt_addr_bind_resolve. buf should hold DT_ENDPOINT_MAX bytes; DT_EINVAL
 * if it is too small. */
int dt_addr_connect_endpoint(const dt_addr *a, char *buf, size_t n);
int dt_addr_bind_endpoint(const dt_addr *a, char *buf, size_t n);
int dt_addr_is_loopback(const dt_addr *a);

/* The endpoint a ps task binds: its own address a (field names it in messages, e.g.
 * "--ps_hosts[1]"), so that ps tasks of one host on different addresses may share a port; or,
 * when bind is non-empty (--bind), that instead: "*" or 0.0.0.0 (every IPv4 interface), [::]
 * (every interface), an interface address or name, each with an optional :PORT (default a's).
 * Names are resolved here (blocking) to their first IPv4 address, else their first IPv6 one:
 * where a worker connecting to the name arrives (transport/conn.h). Fails naming the field or
 * --bind when a name does not resolve or the address is not this host's (a NAT'd address, a
 * Kubernetes service address: the message says --bind). warn (warn_n bytes) gets "" or a warning:
 * a name other than localhost that resolves to a loopback address here. */
int dt_addr_bind_resolve(const dt_addr *a, const char *field, const char *bind, char *buf, size_t n, char *warn,
                         size_t warn_n, dt_error *err);
/* --bind's syntax alone (nothing resolved): DT_EINVAL naming --bind. NULL or "" is fine. */
int dt_bind_check(const char *bind, dt_error *err);

/* Same-host fast path: a ps on a loopback address also listens on a Unix domain socket (the
 * transport's ipc), which moves large messages about 40% faster than TCP loopback here (BENCHMARKS.md), and
 * workers connect there. "ipc://$TMPDIR/dtrain-<host>:<port>.sock" ($TMPDIR default /tmp): unique
 * per address as the port is, and messages naming it name the address. DT_EINVAL if a is not a
 * loopback address, the path is too long, or DTRAIN_IPC=0 (e.g. processes in separate network
 * namespaces, whose 127.0.0.1 are different hosts, that share /tmp). */
int dt_addr_ipc_endpoint(const dt_addr *a, char *buf, size_t n);

#endif
