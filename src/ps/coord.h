/* The work coordinator of dynamic data sharding (docs/elastic.md), as a state machine: no sockets,
 * no clock (`now` is an argument), no threads. ps 0's shard owns one and feeds it (shard_work.c).
 *
 * Epoch e visits the permutation of (seed, e) in batches of B: batch b is positions
 * [b*B, min((b+1)*B, N)), so an epoch has nb = ceil(N/B) batches, the last one short when B does
 * not divide N. Unit u is batches [u*U, min((u+1)*U, nb)). A worker asks for a unit and is granted
 * the mask of its batches still to train; before pushing a batch's gradient it claims the batch
 * for the step the gradient is for; the claim is settled where the gradient is applied: committed
 * when it is (sync: dt_coord_applied with the workers whose gradients a step summed; async:
 * dt_coord_pushed), voided when it is not. A unit is done when all its batches are committed; the
 * epoch ends when every unit is done. A member silent past the liveness timeout is lost, and a
 * member that leaves or rejoins gives its units back: they return to the pool (granted before any
 * fresh unit) once their claims have settled.
 *
 * Results are the wire's statuses (transport/wire.h): DT_WIRE_OK, DT_WIRE_WORK_WAIT,
 * DT_WIRE_WORK_FINISHED, DT_WIRE_STALE, or a refusal (DT_WIRE_E_BAD_VALUE for a confused or
 * hostile peer, DT_WIRE_E_BUSY for a bound a worker may meet and retry, DT_WIRE_E_NOMEM) with its
 * text, which names the bound. */
#ifndef DT_PS_COORD_H
#define DT_PS_COORD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dtrain.h"

#define DT_COORD_MAX_UNITS (1u << 18)      /* units per epoch */
#define DT_COORD_MAX_UNIT_BATCHES 64u      /* batches per unit: a unit's batches are a u64 mask */
#define DT_COORD_MAX_BATCH_SIZE (1u << 20)
#define DT_COORD_MAX_EXAMPLES UINT32_MAX   /* the loader's permutation is of u32 indices */
#define DT_COORD_MAX_WORKERS 65536u        /* task indices are u16 on the wire */
#define DT_COORD_MAX_HELD 16u              /* units one worker may hold at once */
#define DT_COORD_MAX_CLAIMS 16             /* claims one worker may have unsettled */
#define DT_COORD_MAX_LIVENESS_MS 86400000u /* a day */
#define DT_COORD_MAX_EPOCHS UINT32_MAX   /* the state keeps them in 32 bits (version 2) */
#define DT_COORD_HEADER_BYTES 72u
/* The largest state dt_coord_save writes: the header, a bit per unit, 12 bytes per partial unit. */
#define DT_COORD_MAX_STATE_BYTES (DT_COORD_HEADER_BYTES + DT_COORD_MAX_UNITS / 8 + 12 * DT_COORD_MAX_UNITS)

typedef struct {
    uint64_t examples;        /* N, 1..DT_COORD_MAX_EXAMPLES */
    uint64_t seed;            /* the permutation's (the worker checks its own against it) */
    uint64_t epochs;          /* 0: no end; else FINISHED once this many epochs are done (at most
                               * DT_COORD_MAX_EPOCHS) */
    uint32_t batch_size;      /* B, 1..DT_COORD_MAX_BATCH_SIZE */
    uint32_t unit_batches;    /* U, 1..DT_COORD_MAX_UNIT_BATCHES */
    uint32_t max_workers;     /* task indices 0..max_workers-1 may join */
    uint32_t max_held;        /* 1..DT_COORD_MAX_HELD */
    uint32_t liveness_ms;     /* a member silent this long is lost; 0: never */
    int sync;                 /* claims name the step they are for and settle by dt_coord_applied */
    uint32_t last_batches;    /* a fractional --epochs: the last epoch trains only its first
                               * last_batches batches (1..batches per epoch - 1); 0: it is whole */
} dt_coord_plan;

/* A unit granted: the batches of `mask` (bit i: batch unit * U + i) are the worker's to train. */
typedef struct {
    uint64_t epoch;
    uint32_t unit;
    uint64_t mask;
} dt_coord_grant;

typedef struct {
    uint64_t epoch;           /* the current one (== plan.epochs when finished) */
    uint32_t units, batches;  /* of the current epoch (the last one is shorter with last_batches) */
    int live;                 /* members */
    uint32_t done, held, pool, orphaned; /* units this epoch: done, held by members, returned and
                                          * waiting in the pool, waiting for a departed holder's claims */
    uint64_t joins, leaves, losses, returned, grants, committed, voided, epochs_done, refused;
    uint64_t replaced;        /* claims replaced by a later one of their worker for the same step */
    uint64_t dropped;         /* units taken back from a sync worker whose gradient was dropped as
                               * stale (also counted in returned) */
} dt_coord_stats;

typedef struct dt_coord dt_coord;

/* A coordinator at epoch 0 for a checked plan (refusals name the field). log: joins, leaves,
 * losses, epoch ends (one line each, prefixed "ps 0: "); NULL: quiet. */
int dt_coord_new(dt_coord **out, const dt_coord_plan *plan, FILE *log, dt_error *err);
void dt_coord_free(dt_coord *c);
const dt_coord_plan *dt_coord_get_plan(const dt_coord *c);
void dt_coord_get_stats(const dt_coord *c, dt_coord_stats *out);

/* Batches of the current epoch counted so far (O(units): for a log line, not per request). */
uint64_t dt_coord_counted(const dt_coord *c);

/* Batches [*first, *first + *count) of the epoch make unit u (u < units). */
void dt_coord_unit_batches(const dt_coord *c, uint32_t unit, uint64_t *first, uint32_t *count);

/* A worker's data plan against the coordinator's: DT_WIRE_OK, or DT_WIRE_E_BAD_VALUE naming the
 * field that differs. */
int32_t dt_coord_check_plan(dt_coord *c, int worker, uint64_t examples, uint64_t batch_size, uint64_t seed,
                            char *why, size_t len);

/* A worker asks for a unit on connection conn (the ps's serial of it; claims of the unit count
 * only from there) (join: this process has just started, so anything the coordinator
 * thinks it holds goes back to the pool first). A non-member joins. OK with *g filled, WAIT (every
 * unit of the epoch is granted), FINISHED, or a refusal. */
int32_t dt_coord_ask(dt_coord *c, int worker, int join, uint64_t conn, int64_t now, dt_coord_grant *g, char *why,
                     size_t len);

/* A worker claims batch `batch` of `epoch` for its gradient of `step`, on connection conn (that of
 * the unit's grant, else refused). OK (recorded; a claim for a step it claimed before replaces
 * that one), STALE (sync: that step is applied already: the unit is taken back, as below), or a
 * refusal. */
int32_t dt_coord_claim(dt_coord *c, int worker, uint64_t conn, uint64_t epoch, uint64_t batch, int64_t step,
                       int64_t now, char *why, size_t len);

/* Sync: step `step` was applied with the gradients of workers[0..n): their claims for it are
 * committed, every claim for it or an earlier step voided; claims are taken from step + 1 on.
 * A member whose claim is voided here (its gradient came too late: a backup worker's, or with
 * --staleness) loses the claim's unit: it goes back to the pool with its other batches and is
 * granted to any other member before this one (docs/elastic.md, "A dropped gradient"). */
void dt_coord_applied(dt_coord *c, int64_t step, const uint16_t *workers, int n);
/* Async: a gradient of `worker` tagged `step` was applied: its claim for that step is committed,
 * its claims for earlier steps voided. */
void dt_coord_pushed(dt_coord *c, int worker, int64_t step);
/* The model was (re-)initialised at step `next` (sync: the next step to apply): every claim is
 * voided (held gradients were dropped). */
void dt_coord_reset_step(dt_coord *c, int64_t next);

/* Any message from a worker: a member is alive. */
void dt_coord_seen(dt_coord *c, int worker, int64_t now);
/* A clean leave (DONE): the member's units go back. */
void dt_coord_leave(dt_coord *c, int worker);

/* Members that joined and have neither left nor been lost, `worker` not counted: the chief's end of
 * a job waits until none is left (STATUS_REPLY's workers_busy). */
int dt_coord_busy(const dt_coord *c, int worker);
/* Task indices that left or were lost and have not joined again, together with those set in
 * `also` (a bit set of also_tasks tasks, may be NULL): STATUS_REPLY's workers_done on ps 0. */
uint32_t dt_coord_count_ended(const dt_coord *c, const uint8_t *also, uint32_t also_tasks);
/* Members silent past the liveness timeout are lost (their units go back): how many now. */
int dt_coord_cron(dt_coord *c, int64_t now);

/* The state (docs/elastic.md, "Checkpoints"): its size, and the bytes (out [size]). */
size_t dt_coord_state_size(const dt_coord *c);
void dt_coord_save(const dt_coord *c, uint8_t *out);
/* A coordinator from a saved state: hostile input, checked whole (canonical) before it is used;
 * refusals name the field and its offset. */
int dt_coord_load(dt_coord **out, const void *buf, size_t len, FILE *log, dt_error *err);

#endif
