/* The cluster from a cluster manager's environment (docs/cluster.md, "Cluster managers"): with
 * --num_ps N, the job's tasks are ranks 0..n-1 of whatever started them; ranks 0..N-1 serve as ps
 * tasks, the rest are workers, rank N is the chief (worker 0). Which manager, in this order:
 *   1. Open MPI's mpirun/mpiexec: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE. Set only
 *      by the launcher of this very process, so they win over Slurm variables an mpirun inside an
 *      allocation inherits.
 *   2. Slurm's srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_NODELIST (else
 *      SLURM_JOB_NODELIST), SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE), SLURM_DISTRIBUTION
 *      (block, the default, or cyclic); this task's SLURM_LOCALID, SLURM_NODEID and SLURMD_NODENAME
 *      must agree with that layout. Needs SLURM_STEP_ID: a batch script itself is no task.
 *      With PMI_RANK too (srun --mpi=pmi2), they must agree.
 *   3. A PMI launcher (MPICH's hydra, Intel MPI): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID,
 *      MPI_LOCALNRANKS.
 * Every task's port is --base_port + its local id (its index among the job's tasks on its node),
 * so tasks sharing a node do not clash. Slurm's variables give every task's host. MPI's name no
 * peer: the ranks meet at --rendezvous (cluster/rendezvous.h), or, when every rank is on this
 * host (LOCAL_SIZE == SIZE) and no rendezvous is given, use 127.0.0.1.
 * Every value is untrusted; a refusal is one line naming the variable and quoting its value. */
#ifndef DT_CLUSTER_MANAGER_H
#define DT_CLUSTER_MANAGER_H

#include <stdio.h>

#include "cluster/cluster.h"

#define DT_BASE_PORT_DEFAULT 2222 /* the source article's first port */

/* Reads a variable (NULL: unset). */
typedef const char *(*dt_env_fn)(void *ctx, const char *name);

typedef struct {
    int num_ps;             /* ps tasks among the job's tasks, >= 1 */
    int base_port;          /* 1..65535; 0: DT_BASE_PORT_DEFAULT */
    const char *rendezvous; /* MPI: "host:port" of rank 0's rendezvous, or NULL/"" */
    int deadline_ms;        /* the longest the rendezvous waits for every rank (the connect deadline) */
    FILE *log;              /* the rendezvous's notes (connections it closed); NULL: quiet */
    dt_env_fn env;          /* NULL: getenv */
    void *env_ctx;
} dt_manager_options;

/* Derives the cluster as above into c, with c->source "slurm" or "mpi" and c->origin saying where
 * each value came from. No manager in the environment is an error naming the variables looked for. */
int dt_cluster_from_manager(dt_cluster *c, const dt_manager_options *m, dt_error *err);

#endif
