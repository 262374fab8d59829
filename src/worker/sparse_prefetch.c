/* The next batch's sparse rows pulled under the current step's compute (sparse_prefetch.h). */
#include "worker/sparse_prefetch.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

struct dt_sparse_prefetch {
    dt_ps_client *client;     /* its own connection to every ps */
    dt_sparse_client *pull;   /* detached: pulls into rows below */
    dt_net *net;
    int n_tables;
    dt_rowsum *keys;          /* [n_tables] the next batch's ids, in the order its forward lists them */
    float **rows;             /* [n_tables] their rows, [n, dim] */
    size_t *cap;              /* [n_tables] rows each holds */
    int open;                 /* a pull under way */
    dt_prefetch_stats st;
};

int dt_sparse_prefetch_create(dt_sparse_prefetch **out, const dt_sparse_config *cfg, dt_net *net, dt_error *err) {
    *out = NULL;
    dt_sparse_prefetch *p = dt_calloc(1, sizeof *p, "sparse prefetch", err);
    if (!p) {
        dt_ps_client_close(cfg->client);
        return DT_ENOMEM;
    }
    p->client = cfg->client;
    p->net = net;
    p->n_tables = dt_net_num_tables(net);
    size_t n = p->n_tables > 0 ? (size_t)p->n_tables : 1;
    p->keys = dt_calloc(n, sizeof *p->keys, "sparse prefetch", err);
    p->rows = dt_calloc(n, sizeof *p->rows, "sparse prefetch", err);
    p->cap = dt_calloc(n, sizeof *p->cap, "sparse prefetch", err);
    if (!p->keys || !p->rows || !p->cap) {
        dt_sparse_prefetch_free(p);
        return DT_ENOMEM;
    }
    for (int t = 0; t < p->n_tables; t++) dt_rowsum_init(&p->keys[t], 0);
    dt_sparse_config c = *cfg;
    c.detached = 1;
    int rc = dt_sparse_client_create(&p->pull, &c, net, err);
    if (rc) {
        dt_sparse_prefetch_free(p);
        return rc;
    }
    *out = p;
    return DT_OK;
}

void dt_sparse_prefetch_free(dt_sparse_prefetch *p) {
    if (!p) return;
    dt_sparse_client_free(p->pull); /* first: it ends a pull under way on the client */
    dt_ps_client_close(p->client);
    for (int t = 0; p->keys && t < p->n_tables; t++) dt_rowsum_free(&p->keys[t]);
    for (int t = 0; p->rows && t < p->n_tables; t++) free(p->rows[t]);
    free(p->keys), free(p->rows), free(p->cap);
    free(p);
}

/* Room for table t's n rows. */
static int reserve_rows(dt_sparse_prefetch *p, int t, size_t n, int dim, dt_error *err) {
    if (n <= p->cap[t]) return DT_OK;
    free(p->rows[t]);
    p->cap[t] = 0;
    if (!(p->rows[t] = dt_calloc(n, (size_t)dim * sizeof(float), "prefetched rows", err))) return DT_ENOMEM;
    p->cap[t] = n;
    return DT_OK;
}

int dt_sparse_prefetch_send(dt_sparse_prefetch *p, const dt_ctr_batch *next, int64_t step, dt_error *err) {
    if (p->open) return dt_errorf(err, DT_EINVAL, "sparse prefetch: a pull is under way already");
    int rc = dt_net_table_keys(p->net, next, p->keys, err);
    dt_sparse_rows tabs[p->n_tables > 0 ? p->n_tables : 1];
    for (int t = 0; !rc && t < p->n_tables; t++) {
        dt_table_grad g;
        dt_net_table_grad(p->net, t, &g);
        rc = reserve_rows(p, t, p->keys[t].n, g.dim, err);
        tabs[t] = (dt_sparse_rows){.ids = p->keys[t].ids, .n = p->keys[t].n, .rows = p->rows[t]};
    }
    if (!rc) rc = dt_sparse_pull_send(p->pull, tabs, step, err);
    if (rc) {
        p->st.failed++;
        return rc;
    }
    p->open = 1;
    p->st.sent++;
    return DT_OK;
}

/* Whether every table's block lists the prefetched ids, in their order. */
static int same_ids(dt_sparse_prefetch *p) {
    for (int t = 0; t < p->n_tables; t++) {
        dt_table_block b;
        if (dt_net_table_block(p->net, t, &b) || b.n != p->keys[t].n ||
            (b.n && memcmp(b.ids, p->keys[t].ids, b.n * sizeof *b.ids)))
            return 0;
    }
    return 1;
}

int dt_sparse_prefetch_take(dt_sparse_prefetch *p, int *taken, int64_t *reply_step, dt_error *err) {
    *taken = 0;
    *reply_step = -1;
    if (!p->open) return DT_OK;
    p->open = 0;
    int rc = dt_sparse_pull_end(p->pull, 0, reply_step, err);
    if (rc) {
        p->st.failed++;
        return rc;
    }
    if (!same_ids(p)) {
        p->st.missed++;
        return DT_OK;
    }
    for (int t = 0; t < p->n_tables; t++) {
        dt_table_block b;
        dt_net_table_block(p->net, t, &b);
        memcpy(b.rows, p->rows[t], b.n * (size_t)b.dim * sizeof(float));
    }
    p->st.taken++;
    *taken = 1;
    return DT_OK;
}

void dt_sparse_prefetch_cancel(dt_sparse_prefetch *p) {
    if (!p || !p->open) return;
    int64_t step;
    dt_sparse_pull_end(p->pull, 1, &step, NULL);
    p->open = 0;
    p->st.failed++;
}

const dt_prefetch_stats *dt_sparse_prefetch_stats(const dt_sparse_prefetch *p) { return &p->st; }

const dt_sparse_stats *dt_sparse_prefetch_pull_stats(const dt_sparse_prefetch *p) { return dt_sparse_get_stats(p->pull); }

const dt_ps_client_stats *dt_sparse_prefetch_client_stats(const dt_sparse_prefetch *p) {
    return dt_ps_client_get_stats(p->client);
}
