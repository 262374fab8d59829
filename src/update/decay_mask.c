#include "update/decay_mask.h"

#include <string.h>

#include "core/error.h"

int dt_decay_mask_flat(uint8_t **out, const dt_opt_config *c, const dt_param_view *views, int n_views, size_t n,
                       dt_error *err) {
    *out = NULL;
    if (c->weight_decay == 0) return DT_OK;
    uint8_t *m = dt_calloc(n ? n : 1, 1, "weight decay mask", err);
    if (!m) return DT_ENOMEM;
    for (int v = 0; v < n_views; v++)
        if (views[v].offset + views[v].count <= n && dt_opt_decays(c, views[v].ndim))
            memset(m + views[v].offset, 1, views[v].count);
    *out = m;
    return DT_OK;
}

void dt_decay_mask_shard(uint8_t *out, const dt_opt_config *c, const dt_placement *pl, int ps) {
    memset(out, 0, pl->shard_count[ps]);
    for (int k = pl->ps_begin[ps]; k < pl->ps_begin[ps + 1]; k++) {
        const dt_slice *s = &pl->slices[pl->ps_slices[k]];
        if (dt_opt_decays(c, pl->views[s->view].ndim)) memset(out + s->shard_offset, 1, s->count);
    }
}
