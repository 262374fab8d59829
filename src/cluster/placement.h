/* Placement: which ps task holds which floats of the flat parameter buffer. Every process computes
 * it from the same inputs (the model's parameter views in creation order, the number of ps tasks,
 * the strategy) with integer arithmetic only, so all processes agree (docs/cluster.md).
 *
 * Greedy (default): share = ceil(total / k) floats. In creation order, a variable of at most share
 * floats goes whole to the ps with the smallest load so far (first minimum wins; load += its
 * floats, i.e. bytes / 4). A variable larger than share is cut into contiguous slices: ps tasks in
 * index order each take what fits up to share, until the variable is placed. Then no ps ends above
 * max(share, total/k + (1 - 1/k) * (largest unsplit variable)).
 * Round robin: variable i goes whole to ps i % k (TensorFlow's default; no splitting).
 *
 * Shards: each ps stores its slices contiguously in one buffer (its "shard"), in flat-offset order.
 * A slice maps flat[offset .. offset+count) <-> shard[shard_offset .. shard_offset+count). */
#ifndef DT_CLUSTER_PLACEMENT_H
#define DT_CLUSTER_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dtrain.h"
#include "model/net.h"

typedef enum {
    DT_PLACE_GREEDY = 0,
    DT_PLACE_ROUND_ROBIN,
} dt_place_strategy;

typedef struct {
    int view;            /* index into the views */
    int ps;              /* the ps task holding it */
    size_t offset;       /* in floats, into the flat parameter buffer */
    size_t count;        /* floats, > 0 */
    size_t shard_offset; /* in floats, into that ps's shard */
} dt_slice;

typedef struct {
    dt_place_strategy strategy;
    int n_ps;
    int n_views;
    dt_param_view *views; /* [n_views], a copy */
    size_t total;         /* floats in all views */
    size_t share;         /* ceil(total / n_ps): the even share */
    int n_slices;
    dt_slice *slices;     /* [n_slices], in flat-offset order */
    size_t *shard_count;  /* [n_ps]: floats each ps holds (its shard's length) */
    int *ps_begin;        /* [n_ps + 1] */
    int *ps_slices;       /* [n_slices]: slice indices of ps p are ps_slices[ps_begin[p] ..
                             ps_begin[p+1]), in shard order */
} dt_placement;

/* views [n_views] in creation order, with ascending non-overlapping offsets (gaps allowed); views
 * with count 0 get no slice. On failure *p holds nothing to free (dt_placement_free is safe). */
int dt_placement_compute(dt_placement *p, const dt_param_view *views, int n_views, int n_ps,
                         dt_place_strategy strategy, dt_error *err);
void dt_placement_free(dt_placement *p);
/* The placement of net's dense variables: its embedding tables (views with `table` set) get no
 * slice, as a compact net's tables live on the ps tasks as sparse tables (docs/sparse.md). */
int dt_placement_compute_dense(dt_placement *p, const dt_net *net, int n_ps, dt_place_strategy strategy,
                               dt_error *err);

/* "greedy" or "round_robin" (the --placement flag). */
int dt_place_strategy_parse(const char *name, dt_place_strategy *out, dt_error *err);
const char *dt_place_strategy_name(dt_place_strategy s);

/* Where a float of the flat buffer lives: returns its slice index and sets *ps, *shard_offset; -1 if
 * the offset is in no view. */
int dt_placement_locate(const dt_placement *p, size_t flat_offset, int *ps, size_t *shard_offset);

/* shard [shard_count[ps]] <- flat, and flat <- shard (only the floats that ps holds are written). */
void dt_placement_gather(const dt_placement *p, int ps, float *shard, const float *flat);
void dt_placement_scatter(const dt_placement *p, int ps, float *flat, const float *shard);
/* The same for the part [off, off + len) of ps's shard only (a chunk of it). */
void dt_placement_gather_range(const dt_placement *p, int ps, size_t off, size_t len, float *shard, const float *flat);
void dt_placement_scatter_range(const dt_placement *p, int ps, size_t off, size_t len, float *flat, const float *shard);

/* max shard / (total / n_ps): 1.0 is perfectly even (also when total is 0). */
double dt_placement_imbalance(const dt_placement *p);

/* FNV-1a over n_ps, strategy and every slice: processes can compare it to check they agree. */
uint64_t dt_placement_fingerprint(const dt_placement *p);

/* Human-readable table for `dtrain train --dry_run`: per-ps totals, then each variable's slices. */
void dt_placement_print(const dt_placement *p, FILE *f);

#endif
