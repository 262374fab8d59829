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
        if (views[v].offset + views[v].count <= n && !views[v].not_trained && dt_opt_decays(c, views[v].ndim))
            memset(m + views[v].offset, 1, views[v].count);
    *out = m;
    return DT_OK;
}

void dt_decay_mask_shard(uint8_t *out, const dt_opt_config *c, const dt_placement *pl, int ps) {
    memset(out, 0, pl->shard_count[ps]);
    for (int k = pl->ps_begin[ps]; k < pl->ps_begin[ps + 1]; k++) {
        const dt_slice *s = &pl->slices[pl->ps_slices[k]];
        if (!pl->views[s->view].not_trained && dt_opt_decays(c, pl->views[s->view].ndim)) memset(out + s->shard_offset, 1, s->count);
    }
}

/* Appends [off, off + count) to the ranges r [2 * *n], merged with the last one when they touch. */
static void add_range(size_t *r, int *n, size_t off, size_t count) {
    if (*n && r[2 * *n - 2] + r[2 * *n - 1] == off) r[2 * *n - 1] += count;
    else r[2 * *n] = off, r[2 * *n + 1] = count, ++*n;
}

int dt_state_ranges_flat(size_t **out, int *n, const dt_param_view *views, int n_views, dt_error *err) {
    *out = NULL, *n = 0;
    int k = 0;
    for (int v = 0; v < n_views; v++) k += views[v].not_trained && views[v].count;
    if (!k) return DT_OK;
    if (!(*out = dt_calloc(2 * (size_t)k, sizeof **out, "state ranges", err))) return DT_ENOMEM;
    /* the views lie in the flat buffer in order, so their ranges come out ascending */
    for (int v = 0; v < n_views; v++)
        if (views[v].not_trained && views[v].count) add_range(*out, n, views[v].offset, views[v].count);
    return DT_OK;
}

int dt_state_ranges_shard(size_t **out, int *n, const dt_placement *pl, int ps, dt_error *err) {
    *out = NULL, *n = 0;
    int k = 0;
    for (int j = pl->ps_begin[ps]; j < pl->ps_begin[ps + 1]; j++) {
        const dt_slice *s = &pl->slices[pl->ps_slices[j]];
        k += pl->views[s->view].not_trained && s->count;
    }
    if (!k) return DT_OK;
    if (!(*out = dt_calloc(2 * (size_t)k, sizeof **out, "state ranges", err))) return DT_ENOMEM;
    /* a ps's slices are listed in shard order */
    for (int j = pl->ps_begin[ps]; j < pl->ps_begin[ps + 1]; j++) {
        const dt_slice *s = &pl->slices[pl->ps_slices[j]];
        if (pl->views[s->view].not_trained && s->count) add_range(*out, n, s->shard_offset, s->count);
    }
    return DT_OK;
}
