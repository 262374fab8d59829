/* A ps's snapshot pool (src/ps/snapshots.h): with every pooled buffer held by a reply still in
 * flight (peers that never read them), a sync step's values are still kept for EXACT pulls, in one
 * of at most DT_SNAP_EXTRA buffers beyond the pool, each given up (freed now, or by its last
 * message) once the step is trimmed. Under the sanitizers, a buffer freed twice or never fails too. */
#include "ps/snapshots.h"
#include "test.h"

/* The pool's buffers all in flight: each claimed, held by a message, then no longer kept. */
static void fill_in_flight(dt_snap_pool *p, dt_snap **held) {
    for (int i = 0; i < DT_SNAP_POOL; i++) {
        held[i] = dt_snap_claim(p, i, 0);
        CHECK(held[i] != NULL);
        if (held[i]) dt_snap_hold(held[i]);
    }
    dt_snap_trim(p, DT_SNAP_POOL);
    CHECK(p->count == DT_SNAP_POOL);
}

static void test_kept_beyond_pool(void) {
    dt_snap_pool p;
    dt_snap_pool_init(&p, 4);
    dt_snap *held[DT_SNAP_POOL];
    fill_in_flight(&p, held);
    const int64_t s = DT_SNAP_POOL;
    CHECK(dt_snap_claim(&p, s, 0) == NULL); /* a reply's snapshot: the caller copies instead */
    dt_snap *k = dt_snap_claim(&p, s, 1);   /* a step's values to keep */
    CHECK(k != NULL && k->extra && k->kept);
    CHECK(dt_snap_find(&p, s) == k);
    /* Held by a message of its own, then trimmed: out of the pool, freed by that message. */
    dt_snap_hold(k);
    dt_snap_trim(&p, s + 1);
    CHECK(p.count == DT_SNAP_POOL);
    CHECK(dt_snap_find(&p, s) == NULL);
    dt_snap_release(k);
    /* Not held: freed by the trim itself. */
    CHECK(dt_snap_claim(&p, s + 1, 1) != NULL);
    dt_snap_trim(&p, s + 2);
    CHECK(p.count == DT_SNAP_POOL);
    for (int i = 0; i < DT_SNAP_POOL; i++) dt_snap_release(held[i]);
    /* Free again: the pool's own buffers are reused, no extra made. */
    dt_snap *r = dt_snap_claim(&p, s + 2, 1);
    CHECK(r != NULL && !r->extra && p.count == DT_SNAP_POOL);
    dt_snap_pool_retire(&p);
}

static void test_extras_bounded(void) {
    dt_snap_pool p;
    dt_snap_pool_init(&p, 4);
    dt_snap *held[DT_SNAP_POOL], *extra[DT_SNAP_EXTRA];
    fill_in_flight(&p, held);
    for (int i = 0; i < DT_SNAP_EXTRA; i++) {
        extra[i] = dt_snap_claim(&p, DT_SNAP_POOL + i, 1);
        CHECK(extra[i] != NULL);
    }
    CHECK(dt_snap_claim(&p, DT_SNAP_POOL + DT_SNAP_EXTRA, 1) == NULL);
    CHECK(p.count == DT_SNAP_POOL + DT_SNAP_EXTRA);
    /* The pool given up (the ps re-cut its shard): kept extras freed, in-flight buffers by their
     * messages. */
    dt_snap_pool_retire(&p);
    CHECK(p.count == 0);
    for (int i = 0; i < DT_SNAP_POOL; i++) dt_snap_release(held[i]);
}

int main(void) {
    RUN(test_kept_beyond_pool);
    RUN(test_extras_bounded);
    return test_summary();
}
