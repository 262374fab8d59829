/* Which parameters weight decay applies to, as a byte per float (1: decays), from the variables'
 * ranks (dt_opt_decays: kernels always; biases and batch norm's per-channel scale and offset,
 * rank 1, only with --weight_decay_biases; batch norm's moving statistics never: they are not
 * trained). Local training gets the flat mask; each ps its shard's, sent by the chief in INIT.
 * And which floats the optimizer skips altogether (the moving statistics again). */
#ifndef DT_UPDATE_DECAY_MASK_H
#define DT_UPDATE_DECAY_MASK_H

#include <stddef.h>
#include <stdint.h>

#include "cluster/placement.h"
#include "compute/optim.h"
#include "model/net.h"

/* *out [n] (malloc'd; the caller frees): the flat layout of views [n_views]; floats in no view: 0.
 * NULL (and DT_OK) when c has no weight decay. */
int dt_decay_mask_flat(uint8_t **out, const dt_opt_config *c, const dt_param_view *views, int n_views, size_t n,
                       dt_error *err);
/* out [pl->shard_count[ps]]: ps's shard of the placement's variables. */
void dt_decay_mask_shard(uint8_t *out, const dt_opt_config *c, const dt_placement *pl, int ps);

/* The floats the optimizer skips (dt_opt_skip): those of the views that are not trained (batch
 * norm's moving statistics), as ascending [offset, count] pairs, neighbours merged. *out [2 * *n]
 * (malloc'd; the caller frees; NULL and *n = 0 when there are none). The local updater takes the
 * flat layout's, each ps task its shard's; both from the same not_trained flags. */
int dt_state_ranges_flat(size_t **out, int *n, const dt_param_view *views, int n_views, dt_error *err);
int dt_state_ranges_shard(size_t **out, int *n, const dt_placement *pl, int ps, dt_error *err);

#endif
