/* Row placement: which ps task holds a row of a sparse table. Rows are spread by a hash of
 * (table, id), so every process computes it alone, any id (unbounded, hashed or raw) has a home,
 * and the load evens out whatever ids the data uses (docs/sparse.md, "Placement"):
 *
 *   h = hash64(hash64(DT_ROW_PLACE_SEED, table), id)     (core/rng.h: splitmix64's finaliser)
 *   ps = floor(h * n_ps / 2^64)                           (the high bits: no modulo bias)
 *
 * The dense variables keep their own placement (placement.h); a table's rows go to every ps. The
 * same rows go to the same ps for a given n_ps; a checkpoint restored on another count re-hashes. */
#ifndef DT_CLUSTER_ROW_PLACEMENT_H
#define DT_CLUSTER_ROW_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

#define DT_ROW_PLACE_SEED UINT64_C(0x9a7e1ace0fd15eed)

/* The ps task (0..n_ps-1) of row id of table; n_ps >= 1. */
int dt_row_ps(uint32_t table, uint64_t id, int n_ps);

/* Groups ids [n] by ps task, keeping their order within each: order [n] positions into ids, the
 * ids of ps p at order[begin[p] .. begin[p + 1]); begin [n_ps + 1]; ps_of [n] (scratch or the
 * caller's: each id's task). */
void dt_row_split(uint32_t table, const uint64_t *ids, size_t n, int n_ps, int *ps_of, size_t *begin, size_t *order);

#endif
