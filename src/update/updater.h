/* How a step's gradients become new parameters: the seam between the training loop (train/) and
 * where updates happen. The loop is the same on one machine and on a cluster worker; only the
 * updater differs:
 *   local  (update/local.c):   the optimizer runs here on the whole flat buffer;
 *   remote (worker/remote.c):  gradients go to the ps tasks holding each slice, and the fresh
 *                              parameters come back.
 * A small vtable rather than if/else in the loop, so each side owns its own state. */
#ifndef DT_UPDATE_UPDATER_H
#define DT_UPDATE_UPDATER_H

#include <stdint.h>

#include "compute/lazy_optim.h"
#include "compute/optim.h"
#include "model/net.h"

typedef struct dt_updater dt_updater;
struct dt_updater {
    /* Makes the net's parameters the starting ones (initialise from the seed, or wait for the chief
     * and pull) and returns the global step training starts at. */
    int (*start)(dt_updater *u, dt_net *net, uint64_t seed, int64_t *global_step, dt_error *err);
    /* Applies the net's gradients (from the last backward, computed at local_step); on return the
     * net holds current parameters and *global_step is the cluster's step after this update. */
    int (*apply)(dt_updater *u, dt_net *net, int64_t local_step, int64_t *global_step, dt_error *err);
    /* Training is over for this process (the chief also ends the cluster). */
    int (*finish)(dt_updater *u, dt_error *err);
    void (*free)(dt_updater *u);
    /* Checkpoints (src/supervisor/); state is in the flat layout: slot k of flat float i at
     * state[k*n + i]. restore: like start, but from a checkpoint: the net holds its parameters,
     * state and step its optimizer state and global step (a cluster's chief gives every ps its
     * shard back, unless the ps tasks already hold a model: then it pulls that). snapshot: the
     * current parameters [n], optimizer state [slots * n] (NULL: skip) and *global_step, between
     * steps; final: training is over (a chief first waits for the other workers). */
    int (*restore)(dt_updater *u, dt_net *net, const float *state, int64_t step, int64_t *global_step,
                   dt_error *err);
    int (*snapshot)(dt_updater *u, dt_net *net, float *params, float *state, int64_t *global_step, int final,
                    dt_error *err);
    /* May be NULL. An updater whose apply returns before the parameters are all in (the remote one
     * with --overlap: they land under the next forward) completes the last update: the net then
     * holds its parameters and *global_step is the cluster's step. */
    int (*settle)(dt_updater *u, dt_net *net, int64_t *global_step, dt_error *err);
};

/* The local updater: opt over net's trained parameters (the moving statistics skipped, as on a ps;
 * weight decay where decay_mask.h says), except the embedding tables, which tables (required when
 * the net has any; train/table_optim.h makes it from the options) updates lazily, row by row, as
 * the ps tasks do (no schedule, no weight decay). State held here, in checkpoint.h's flat layout
 * with the most slots of the two optimizers (a table's own slots first, the rest unused). */
int dt_local_updater_create(dt_updater **out, const dt_opt_config *opt, const dt_lazy_config *tables,
                            const dt_net *net, dt_error *err);
/* The flat layout's optimizer slots, in one place for the updaters and the checkpoints
 * (supervisor/checkpoint.h): view pv's are tables' for a table (when there is a table optimizer),
 * opt's otherwise (none without opt); a run's are the most of any of net's views. An optimizer
 * whose variables the net lacks (adam's 2 slots for a model of tables only) adds none. */
int dt_view_state_slots(const dt_param_view *pv, const dt_opt_config *opt, const dt_lazy_config *tables);
int dt_state_slots(const dt_net *net, const dt_opt_config *opt, const dt_lazy_config *tables);
/* A compact net's tables (model/net.h) live elsewhere (one process's: train/local_tables.h): after the
 * dense variables, each apply calls fn, which updates them from the net's table gradients, instead of
 * updating the blocks here. */
typedef int (*dt_tables_apply_fn)(void *user, dt_error *err);
void dt_local_updater_set_tables(dt_updater *local, dt_tables_apply_fn fn, void *user);

#endif
