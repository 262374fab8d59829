/* The coordinator's state, shared by coord.c (grants, claims, members) and coord_state.c (save,
 * load). Nothing outside src/ps/coord*.c includes this. */
#ifndef DT_PS_COORD_IMPL_H
#define DT_PS_COORD_IMPL_H

#include "ps/coord.h"

#define COORD_NONE UINT32_MAX /* no holder */

enum { UNIT_FRESH, UNIT_POOL, UNIT_HELD, UNIT_ORPHAN, UNIT_DONE };

/* A claim: this member's gradient of `step` trains `batch`. */
typedef struct {
    uint64_t batch;
    int64_t step;
} claim_t;

/* A worker that asked for work. A member that left or was lost stays a ghost (joined 0) while
 * claims of its last gradients are unsettled (sync: they settle when their step is applied). */
typedef struct {
    int joined;
    int64_t seen;
    uint32_t held[DT_COORD_MAX_HELD];
    int n_held;
    claim_t claims[DT_COORD_MAX_CLAIMS];
    int n_claims;
    int active_pos;           /* index in c->active */
} member_t;

struct dt_coord {
    dt_coord_plan plan;
    FILE *log;
    uint32_t units, batches;  /* of the current epoch (coord_epoch_size) */
    uint32_t max_units;       /* of a whole epoch: the arrays' size */
    uint64_t epoch;
    int64_t next_step;        /* sync: claims for earlier steps are stale */
    /* Per unit of the epoch. */
    uint64_t *done_mask;      /* batches committed */
    uint64_t *claimed;        /* batches committed or claimed */
    uint32_t *holder;
    uint64_t *conn;           /* the connection the holder was granted it on: only its claims count */
    uint32_t *avoid;          /* 1 + the worker it was last taken from (a dropped gradient); 0: none */
    uint8_t *state;           /* UNIT_* */
    uint8_t *claims;          /* unsettled claims on it (<= DT_COORD_MAX_CLAIMS: one holder's) */
    uint32_t *pool;           /* ring of returned units, granted before fresh ones */
    uint32_t pool_head, pool_len;
    uint32_t next_fresh;      /* units below it are not fresh */
    uint32_t n_done, n_held, n_orphan;
    /* Members, by task index; active: the indices with a record (members and ghosts). */
    member_t **m;             /* [max_workers] */
    uint32_t *active;         /* [max_workers] */
    int n_active, live;
    uint8_t *ended;           /* [ceil(max_workers / 8)] bit w: w left or was lost, not back since */
    dt_coord_stats totals;    /* only the cumulative counters are used */
};

/* coord.c, for the loader: the plan's check (its units and batches per epoch), a unit's batches
 * as a mask, and the pool. */
int coord_check_plan(const dt_coord_plan *p, uint32_t *units, uint32_t *batches, dt_error *err);
/* The units and batches of epoch `epoch` of a checked plan (the last one is shorter with
 * plan.last_batches). */
void coord_epoch_size(const dt_coord_plan *p, uint64_t epoch, uint32_t *units, uint32_t *batches);
uint64_t coord_full_mask(const dt_coord *c, uint32_t unit);
void coord_pool_push(dt_coord *c, uint32_t unit);

#endif
