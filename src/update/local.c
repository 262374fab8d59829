/* The local updater: the optimizer runs in this process on the whole flat buffer. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "update/decay_mask.h"
#include "update/updater.h"

typedef struct {
    dt_updater base;
    dt_opt_config opt;
    float *state;
    uint8_t *decay;   /* [n] where weight decay applies (decay_mask.h); NULL: nowhere */
    size_t *skip;     /* the untrained floats' ranges (decay_mask.h), as the ps tasks skip theirs */
    int n_skip;
    int64_t step;     /* updates applied: the global step */
} local_updater;

static int local_start(dt_updater *u, dt_net *net, uint64_t seed, int64_t *global_step, dt_error *err) {
    dt_net_init_params(net, seed);
    *global_step = ((local_updater *)u)->step = 0;
    return DT_OK;
}

static int local_restore(dt_updater *u, dt_net *net, const float *state, int64_t step, int64_t *global_step,
                         dt_error *err) {
    local_updater *l = (local_updater *)u;
    memcpy(l->state, state, dt_net_param_count(net) * (size_t)dt_opt_slots(&l->opt) * sizeof(float));
    *global_step = l->step = step;
    return DT_OK;
}

static int local_snapshot(dt_updater *u, dt_net *net, float *params, float *state, int64_t *global_step, int final,
                          dt_error *err) {
    local_updater *l = (local_updater *)u;
    size_t n = dt_net_param_count(net);
    memcpy(params, dt_net_params(net), n * sizeof(float));
    if (state) memcpy(state, l->state, n * (size_t)dt_opt_slots(&l->opt) * sizeof(float));
    *global_step = l->step;
    return DT_OK;
}

static int local_apply(dt_updater *u, dt_net *net, int64_t local_step, int64_t *global_step, dt_error *err) {
    local_updater *l = (local_updater *)u;
    /* The forward pass moved the moving statistics; the optimizer leaves them and their slots be. */
    dt_opt_skip skip = {l->skip, l->n_skip, 0};
    float *params = dt_net_params(net);
    dt_opt_apply_to(&l->opt, params, params, dt_net_grads(net), l->state, l->decay, dt_net_param_count(net),
                    local_step, &skip);
    *global_step = l->step = local_step + 1;
    return DT_OK;
}

static int local_finish(dt_updater *u, dt_error *err) { return DT_OK; }

static void local_free(dt_updater *u) {
    local_updater *l = (local_updater *)u;
    if (l) free(l->state), free(l->decay), free(l->skip);
    free(l);
}

int dt_local_updater_create(dt_updater **out, const dt_opt_config *opt, const dt_net *net, dt_error *err) {
    *out = NULL;
    size_t n_params = dt_net_param_count(net);
    local_updater *l = dt_calloc(1, sizeof *l, "updater", err);
    if (!l) return DT_ENOMEM;
    l->base = (dt_updater){local_start, local_apply, local_finish, local_free, local_restore, local_snapshot, NULL};
    l->opt = *opt;
    size_t n_state = n_params * (size_t)dt_opt_slots(opt);
    int rc = DT_OK;
    if (!(l->state = dt_alloc_floats(n_state ? n_state : 1, "optimizer state", err))) rc = DT_ENOMEM;
    if (!rc) rc = dt_decay_mask_flat(&l->decay, opt, dt_net_view(net, 0), dt_net_num_views(net), n_params, err);
    if (!rc) rc = dt_state_ranges_flat(&l->skip, &l->n_skip, dt_net_view(net, 0), dt_net_num_views(net), err);
    if (rc) {
        local_free(&l->base);
        return rc;
    }
    *out = &l->base;
    return DT_OK;
}

