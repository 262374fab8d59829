/* Slurm's compressed lists, as Slurm writes them into a task's environment (docs/cluster.md,
 * "Slurm"):
 *   host list       "node[01-04,07],gpu3"  -> node01 node02 node03 node04 node07 gpu3
 *                   (SLURM_STEP_NODELIST, SLURM_JOB_NODELIST). A host may hold several bracket
 *                   groups ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2, the last group fastest); a
 *                   range keeps the zero padding of its first number ("[08-10]" -> 08 09 10).
 *   tasks per node  "2(x3),1"  -> 2 2 2 1   (SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE)
 * Both come from the environment, so both are untrusted: every count is bounded by `max` before
 * anything is expanded, and a refusal names `field` (the variable) and quotes the value. */
#ifndef DT_CLUSTER_HOSTLIST_H
#define DT_CLUSTER_HOSTLIST_H

#include <stddef.h>

#include "cluster/cluster.h"

/* Nodes a job may span here: a node holds at least one task and a cluster at most
 * 2 * DT_CLUSTER_MAX_TASKS (every ps and every worker). */
#define DT_HOSTLIST_MAX (2 * DT_CLUSTER_MAX_TASKS)

typedef struct {
    char (*host)[DT_HOST_MAX]; /* [n], owned */
    int n;
} dt_hostlist;

/* Expands text (len bytes, need not be NUL-terminated; blanks around it ignored) into l, at most
 * max hosts (1..DT_HOSTLIST_MAX). On failure l is empty. Free with dt_hostlist_free. */
int dt_hostlist_parse(dt_hostlist *l, const char *text, size_t len, int max, const char *field, dt_error *err);
void dt_hostlist_free(dt_hostlist *l);

/* Expands a tasks-per-node list into *counts (malloc'd, [*n], each >= 1), at most max nodes.
 * On failure *counts is NULL and *n 0. */
int dt_tasks_per_node_parse(int **counts, int *n, const char *text, size_t len, int max, const char *field,
                            dt_error *err);

#endif
