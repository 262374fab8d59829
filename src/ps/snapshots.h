/* Snapshots of a ps's parameters, one per step, sent zero-copy to every puller of that step.
 *
 * An update is written out of place into a free snapshot buffer, which then holds the current
 * values (no copy per step); a buffer that messages still hold is never written. refs counts the
 * ps's own reference (while it keeps the snapshot) plus each reply the transport still holds; the
 * transport's I/O thread drops its references (transport/conn.h: a send's release), hence the
 * atomics. A buffer with refs == 0 is reused: the pool keeps the allocator (and the kernel's page
 * faults) out of the steady state.
 *
 * A pool given up while messages still hold some of its buffers (the ps re-cut its shard) hands
 * each such buffer to its last message, whose release frees it. */
#ifndef DT_PS_SNAPSHOTS_H
#define DT_PS_SNAPSHOTS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define DT_SNAP_POOL 8        /* buffers per pool; more in flight at once fall back to a copy */
#define DT_SNAP_EXTRA 8       /* ... beyond them, buffers for snapshots that must be kept (dt_snap_claim) */

typedef struct {
    atomic_int refs;
    atomic_int orphan;        /* the pool gave it up: the last release frees it */
    int kept;                 /* the ps holds a reference (only the ps thread reads this) */
    int extra;                /* beyond the pool: given up as soon as it is no longer kept */
    int64_t step;
    float *data;              /* [n] */
} dt_snap;

typedef struct {
    size_t n;                 /* floats per buffer */
    dt_snap *bufs[DT_SNAP_POOL + DT_SNAP_EXTRA];
    int count;
} dt_snap_pool;

void dt_snap_pool_init(dt_snap_pool *p, size_t n);

/* Stops keeping the snapshots of steps before `oldest` (INT64_MAX: all of them). */
void dt_snap_trim(dt_snap_pool *p, int64_t oldest);

/* The kept snapshot of `step`, or NULL. */
dt_snap *dt_snap_find(dt_snap_pool *p, int64_t step);

/* A buffer neither kept nor held by a message, now the snapshot of `step` (kept; the caller fills
 * it); NULL if every buffer is in flight (or none can be allocated). must_keep: with the pool's
 * buffers all in flight, one of DT_SNAP_EXTRA more, given up once trimmed. A sync step's values
 * must be kept for EXACT pulls (a resuming worker's): peers that never read their replies held
 * every pool buffer, the step's values were not kept, and both workers, resuming, were refused
 * that step until --ps_timeout (tests/test_hostile_round2_slow.sh, about 1 run in 10). */
dt_snap *dt_snap_claim(dt_snap_pool *p, int64_t step, int must_keep);

/* A message's reference: taken by the ps thread, dropped by the transport's I/O thread. */
void dt_snap_hold(dt_snap *b);
void dt_snap_release(dt_snap *b);

/* Gives every buffer up: freed now, or by its last message. The pool is empty afterwards. */
void dt_snap_pool_retire(dt_snap_pool *p);

#endif
