/* The local updater: the optimizer runs in this process on the whole flat buffer, except on the
 * embedding tables of click-log models, where the tables' lazy optimizer (compute/lazy_optim.h, the
 * ps tasks' formulas) runs on the rows the last backward touched only, so a step costs the batch's
 * rows, not the tables' size. */
#include <stdlib.h>
#include <string.h>

#include "compute/lazy_optim.h"
#include "core/error.h"
#include "update/decay_mask.h"
#include "update/updater.h"

/* Rows ahead whose values and slots the tables' update asks the memory for. */
#define ROW_PREFETCH 8

typedef struct {
    dt_updater base;
    dt_opt_config opt;
    dt_lazy_config table_opt; /* the tables' optimizer */
    int slots;        /* state floats per parameter: dt_state_slots, the checkpoints' count */
    float *state;     /* [slots * n], slot k of float i at state[k * n + i] (checkpoint.h's layout) */
    uint8_t *decay;   /* [n] where weight decay applies (decay_mask.h); NULL: nowhere */
    size_t *skip;     /* the untrained floats' ranges (decay_mask.h), as the ps tasks skip theirs */
    int n_skip;
    int64_t step;     /* updates applied: the global step */
    int tables;       /* embedding tables: skipped by the dense pass (their ranges are in skip), then
                       * updated row by row */
    dt_tables_apply_fn tables_apply; /* a compact net's: its tables are elsewhere (NULL: here, flat) */
    void *tables_user;
} local_updater;

/* The tables' slots at their start (the accumulators at initial_accumulator, the rest 0); the dense
 * slots start at 0 as allocated. */
static void init_table_slots(local_updater *l, const dt_net *net) {
    size_t n = dt_net_param_count(net);
    float first[DT_LAZY_MAX_SLOTS];
    dt_lazy_init_slots(&l->table_opt, first, 1); /* each slot's initial value */
    for (int v = 0; v < dt_net_num_views(net); v++) {
        const dt_param_view *pv = dt_net_view(net, v);
        if (!pv->table) continue;
        for (int k = 0; k < dt_lazy_slots(l->table_opt.kind); k++)
            for (size_t i = 0; i < pv->count; i++) l->state[(size_t)k * n + pv->offset + i] = first[k];
    }
}

static int local_start(dt_updater *u, dt_net *net, uint64_t seed, int64_t *global_step, dt_error *err) {
    local_updater *l = (local_updater *)u;
    dt_net_init_params(net, seed);
    init_table_slots(l, net);
    *global_step = l->step = 0;
    return DT_OK;
}

static int local_restore(dt_updater *u, dt_net *net, const float *state, int64_t step, int64_t *global_step,
                         dt_error *err) {
    local_updater *l = (local_updater *)u;
    memcpy(l->state, state, dt_net_param_count(net) * (size_t)l->slots * sizeof(float));
    *global_step = l->step = step;
    return DT_OK;
}

static int local_snapshot(dt_updater *u, dt_net *net, float *params, float *state, int64_t *global_step, int final,
                          dt_error *err) {
    local_updater *l = (local_updater *)u;
    size_t n = dt_net_param_count(net);
    memcpy(params, dt_net_params(net), n * sizeof(float));
    if (state) memcpy(state, l->state, n * (size_t)l->slots * sizeof(float));
    *global_step = l->step;
    return DT_OK;
}

static int local_apply(dt_updater *u, dt_net *net, int64_t local_step, int64_t *global_step, dt_error *err) {
    local_updater *l = (local_updater *)u;
    /* The forward pass moved the moving statistics; the optimizer leaves them and their slots be. */
    dt_opt_skip skip = {l->skip, l->n_skip, 0};
    float *params = dt_net_params(net);
    size_t n = dt_net_param_count(net);
    dt_opt_apply_to(&l->opt, params, params, dt_net_grads(net), l->state, l->decay, n, local_step, &skip);
    if (l->tables_apply) {
        int rc = l->tables_apply(l->tables_user, err);
        if (rc) return rc;
        *global_step = l->step = local_step + 1;
        return DT_OK;
    }
    /* The tables: each touched row once, with its gradient summed over the batch's ids, at the
     * rates of the tables' update number local_step (every step updates every table). */
    const dt_lazy_rates rates = dt_lazy_rates_at(&l->table_opt, local_step);
    const int slots = dt_lazy_slots(l->table_opt.kind);
    for (int t = 0; t < l->tables; t++) {
        dt_table_grad g;
        if (dt_net_table_grad(net, t, &g)) continue;
        size_t off = dt_net_view(net, g.view)->offset;
        for (size_t r = 0; r < g.n; r++) {
            size_t at = off + (size_t)g.rows[r] * (size_t)g.dim;
            if (r + ROW_PREFETCH < g.n) { /* random rows of a table far larger than the caches */
                size_t next = off + (size_t)g.rows[r + ROW_PREFETCH] * (size_t)g.dim;
                __builtin_prefetch(params + next, 1);
                for (int k = 0; k < slots; k++) __builtin_prefetch(l->state + (size_t)k * n + next, 1);
            }
            dt_lazy_apply_row_strided(&l->table_opt, &rates, params + at, l->state + at, n, g.grad + r * (size_t)g.dim,
                                      g.dim);
        }
    }
    *global_step = l->step = local_step + 1;
    return DT_OK;
}

static int local_finish(dt_updater *u, dt_error *err) { return DT_OK; }

static void local_free(dt_updater *u) {
    local_updater *l = (local_updater *)u;
    if (l) free(l->state), free(l->decay), free(l->skip);
    free(l);
}

/* The tables' ranges joined to the untrained floats' (both ascending), so the dense pass skips them. */
static int add_table_ranges(local_updater *l, const dt_net *net, dt_error *err) {
    int nv = dt_net_num_views(net), n = 0;
    size_t *r = dt_calloc(2 * ((size_t)l->n_skip + (size_t)nv), sizeof *r, "optimizer ranges", err);
    if (!r) return DT_ENOMEM;
    for (int v = 0, k = 0; v < nv || k < l->n_skip;) {
        const dt_param_view *pv = v < nv ? dt_net_view(net, v) : NULL;
        if (pv && !pv->table) {
            v++;
            continue;
        }
        size_t off, cnt;
        if (k < l->n_skip && (!pv || l->skip[2 * k] < pv->offset)) off = l->skip[2 * k], cnt = l->skip[2 * k + 1], k++;
        else off = pv->offset, cnt = pv->count, v++;
        if (n && r[2 * (n - 1)] + r[2 * (n - 1) + 1] == off) r[2 * (n - 1) + 1] += cnt;
        else r[2 * n] = off, r[2 * n + 1] = cnt, n++;
    }
    free(l->skip);
    l->skip = r, l->n_skip = n;
    return DT_OK;
}

int dt_view_state_slots(const dt_param_view *pv, const dt_opt_config *opt, const dt_lazy_config *tables) {
    if (!opt) return 0;
    return pv->table && tables ? dt_lazy_slots(tables->kind) : dt_opt_slots(opt);
}

int dt_state_slots(const dt_net *net, const dt_opt_config *opt, const dt_lazy_config *tables) {
    int most = 0;
    for (int v = 0; v < dt_net_num_views(net); v++) {
        int k = dt_view_state_slots(dt_net_view(net, v), opt, tables);
        if (k > most) most = k;
    }
    return most;
}

void dt_local_updater_set_tables(dt_updater *u, dt_tables_apply_fn fn, void *user) {
    local_updater *l = (local_updater *)u;
    l->tables_apply = fn, l->tables_user = user;
}

int dt_local_updater_create(dt_updater **out, const dt_opt_config *opt, const dt_lazy_config *tables,
                            const dt_net *net, dt_error *err) {
    *out = NULL;
    size_t n_params = dt_net_param_count(net);
    local_updater *l = dt_calloc(1, sizeof *l, "updater", err);
    if (!l) return DT_ENOMEM;
    l->base = (dt_updater){local_start, local_apply, local_finish, local_free, local_restore, local_snapshot, NULL};
    l->opt = *opt;
    l->tables = dt_net_num_tables(net);
    int rc = DT_OK;
    if (l->tables && !tables) rc = dt_errorf(err, DT_EINVAL, "updater: the model has embedding tables but no table optimizer");
    if (!rc && l->tables) {
        l->table_opt = *tables;
        rc = dt_lazy_config_check(tables, err);
    }
    /* The checkpoints' count (snapshot and restore copy [slots * n]); a model of tables only holds
     * none of opt's. */
    l->slots = dt_state_slots(net, opt, l->tables ? tables : NULL);
    size_t n_state = n_params * (size_t)l->slots;
    if (!rc && !(l->state = dt_alloc_floats(n_state ? n_state : 1, "optimizer state", err))) rc = DT_ENOMEM;
    if (!rc) rc = dt_decay_mask_flat(&l->decay, opt, dt_net_view(net, 0), dt_net_num_views(net), n_params, err);
    if (!rc) rc = dt_state_ranges_flat(&l->skip, &l->n_skip, dt_net_view(net, 0), dt_net_num_views(net), err);
    if (!rc && l->tables) rc = add_table_ranges(l, net, err);
    if (rc) {
        local_free(&l->base);
        return rc;
    }
    *out = &l->base;
    return DT_OK;
}

