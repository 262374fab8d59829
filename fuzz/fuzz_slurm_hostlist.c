/* libFuzzer target: bytes as Slurm's compressed host list and tasks-per-node list (both parsers on
 * the whole input), then as a task's environment (first line SLURM_STEP_NODELIST, second
 * SLURM_STEP_TASKS_PER_NODE, third SLURM_NTASKS, fourth SLURM_PROCID) through the Slurm
 * derivation. Each must refuse with a message or accept something self-consistent, without
 * crashing, leaking, reading past the input or expanding beyond its bound. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/hostlist.h"
#include "cluster/manager.h"

static void refused(const dt_error *err) {
    if (err->msg[0] == '\0' || memchr(err->msg, '\0', sizeof err->msg) == NULL) __builtin_trap();
}

typedef struct {
    char value[4][256];
} env4;

static const char *lookup(void *ctx, const char *name) {
    env4 *e = ctx;
    if (!strcmp(name, "SLURM_STEP_NODELIST")) return e->value[0];
    if (!strcmp(name, "SLURM_STEP_TASKS_PER_NODE")) return e->value[1];
    if (!strcmp(name, "SLURM_NTASKS")) return e->value[2];
    if (!strcmp(name, "SLURM_PROCID")) return e->value[3];
    if (!strcmp(name, "SLURM_STEP_ID")) return "0";
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    dt_error err = {0};
    dt_hostlist l;
    if (dt_hostlist_parse(&l, text, size, 0, "SLURM_STEP_NODELIST", &err) == 0) {
        if (l.n < 1 || l.n > DT_HOSTLIST_MAX) __builtin_trap();
        for (int i = 0; i < l.n; i++) {
            size_t n = strnlen(l.host[i], DT_HOST_MAX);
            if (n == 0 || n == DT_HOST_MAX) __builtin_trap();
        }
        dt_hostlist_free(&l);
    } else {
        refused(&err);
        if (l.host || l.n) __builtin_trap();
    }
    int *counts, n;
    memset(&err, 0, sizeof err);
    if (dt_tasks_per_node_parse(&counts, &n, text, size, 64, "SLURM_STEP_TASKS_PER_NODE", &err) == 0) {
        if (n < 1 || n > 64) __builtin_trap();
        for (int i = 0; i < n; i++)
            if (counts[i] < 1) __builtin_trap();
        free(counts);
    } else {
        refused(&err);
    }
    /* The lines as a task's environment. */
    env4 e = {0};
    size_t at = 0;
    for (int k = 0; k < 4 && at <= size; k++) {
        const char *nl = memchr(text + at, '\n', size - at);
        size_t len = nl ? (size_t)(nl - text - at) : size - at;
        if (memchr(text + at, '\0', len)) return 0; /* the environment holds C strings */
        memcpy(e.value[k], text + at, len < 255 ? len : 255);
        at += len + 1;
    }
    dt_manager_options m = {.num_ps = 1, .env = lookup, .env_ctx = &e};
    dt_cluster c;
    memset(&err, 0, sizeof err);
    if (dt_cluster_from_manager(&c, &m, &err) == 0) {
        if (!c.distributed || c.n_ps != 1 || c.n_workers < 1 || !c.origin[0]) __builtin_trap();
        dt_cluster_clear(&c);
    } else {
        refused(&err);
    }
    return 0;
}
