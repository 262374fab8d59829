#include "ps/snapshots.h"

#include <stdlib.h>

#include "core/error.h"

void dt_snap_pool_init(dt_snap_pool *p, size_t n) {
    p->n = n;
    p->count = 0;
}

static void snap_free(dt_snap *b) {
    free(b->data);
    free(b);
}

/* Drops one reference; whoever drops the last of an orphan frees it. */
static void unref(dt_snap *b) {
    if (atomic_fetch_sub(&b->refs, 1) == 1 && atomic_load(&b->orphan)) snap_free(b);
}

static void unkeep(dt_snap *b) {
    if (!b->kept) return;
    b->kept = 0;
    unref(b);
}

/* Hands b to its last message (or frees it now): the pool no longer has it. */
static void give_up(dt_snap *b) {
    /* A reference of our own while the flag goes up, so that exactly one side sees the count
     * reach zero with the flag set: a message released meanwhile, or this drop. */
    atomic_fetch_add(&b->refs, 1);
    atomic_store(&b->orphan, 1);
    if (b->kept) {
        b->kept = 0;
        atomic_fetch_sub(&b->refs, 1);
    }
    unref(b);
}

void dt_snap_trim(dt_snap_pool *p, int64_t oldest) {
    for (int i = 0; i < p->count; i++) {
        dt_snap *b = p->bufs[i];
        if (b->step < oldest) unkeep(b);
        if (b->extra && !b->kept) {
            give_up(b);
            p->bufs[i--] = p->bufs[--p->count];
        }
    }
}

dt_snap *dt_snap_find(dt_snap_pool *p, int64_t step) {
    for (int i = 0; i < p->count; i++)
        if (p->bufs[i]->kept && p->bufs[i]->step == step) return p->bufs[i];
    return NULL;
}

dt_snap *dt_snap_claim(dt_snap_pool *p, int64_t step, int must_keep) {
    dt_snap *b = NULL;
    int pooled = 0;
    for (int i = 0; i < p->count; i++) {
        if (!b && atomic_load(&p->bufs[i]->refs) == 0) b = p->bufs[i];
        pooled += !p->bufs[i]->extra;
    }
    const int extra = pooled >= DT_SNAP_POOL;
    if (!b && (!extra || (must_keep && p->count < DT_SNAP_POOL + DT_SNAP_EXTRA)) && (b = calloc(1, sizeof *b))) {
        if (!(b->data = dt_alloc_floats(p->n, "ps snapshot", NULL))) {
            free(b);
            return NULL;
        }
        atomic_init(&b->refs, 0);
        atomic_init(&b->orphan, 0);
        b->extra = extra;
        p->bufs[p->count++] = b;
    }
    if (!b) return NULL;
    b->step = step;
    b->kept = 1;
    atomic_store(&b->refs, 1);
    return b;
}

void dt_snap_hold(dt_snap *b) { atomic_fetch_add(&b->refs, 1); }

void dt_snap_release(dt_snap *b) { unref(b); }

void dt_snap_pool_retire(dt_snap_pool *p) {
    for (int i = 0; i < p->count; i++) give_up(p->bufs[i]);
    p->count = 0;
}
