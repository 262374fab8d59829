/* Dynamic data sharding, a worker's loop (docs/elastic.md): which batch this worker trains next.
 * The chief installs the work plan on ps 0 (unless ps 0 already has one: a restarted chief goes on
 * with it); every worker asks ps 0 for units, trains each granted batch through the loader's
 * whole-epoch order, claims it before its gradient's push (the claim's round trip under the
 * forward) and keeps it in its mask until it is counted; it asks for its next unit under the last
 * batch of the current one (it holds two at most). A sync gradient ps 0 drops as stale (or a claim
 * whose step is applied already) costs the worker its unit: ps 0 grants it to another worker
 * first, and this one asks anew (docs/elastic.md, "A dropped gradient"). Without work at an epoch's end a sync worker sits steps out (DONE on
 * every ps) until it is granted a unit again; the run ends when ps 0 says every epoch is done. */
#ifndef DT_TRAIN_WORK_LOOP_H
#define DT_TRAIN_WORK_LOOP_H

#include <stdint.h>
#include <stdio.h>

#include "data/loader.h"
#include "model/net.h"
#include "update/updater.h"

typedef struct {
    dt_updater *updater;          /* the remote updater: its client talks to ps 0 */
    dt_loader *loader;            /* whole_epoch order */
    int task, chief, sync;
    uint64_t examples, seed, epochs; /* the plan: epochs 0: no end */
    uint32_t last_batches;        /* a fractional --epochs: the last epoch's first batches; 0: whole */
    uint32_t batch_size, unit_batches, max_workers, liveness_ms;
    int wait_ms;                  /* how long to wait for the chief's plan */
    /* Chief: the coordinator state of the checkpoint the model was restored from (at the start, or
     * by a rollback after a ps lost its shard), installed instead of a fresh plan when ps 0 has
     * none; 0: none (NULL: never). */
    int (*restored)(void *user, const uint8_t **state, size_t *len);
    void *user;
    const volatile int *stop;
    FILE *log;
    FILE *trained;                /* test hook (--debug_work_log): one line per counted batch; NULL: none */
} dt_work_config;

typedef struct dt_work_loop dt_work_loop;

/* The chief installs the plan if ps 0 has none; a worker waits (bounded) for it. */
int dt_work_loop_open(dt_work_loop **out, const dt_work_config *cfg, dt_error *err);
void dt_work_loop_free(dt_work_loop *w);

/* The next batch: the unit granted ahead, or asks ps 0 for work (waiting out WAIT), loads the
 * batch into *b and, when the step its gradient will be for is known (sync), sends its claim, so
 * the claim's round trip runs under the forward. *finished: every epoch is done (b unset). net and
 * *global_step: a sync worker back from sitting steps out pulls the parameters again. */
int dt_work_loop_next(dt_work_loop *w, dt_net *net, int64_t *global_step, dt_batch *b, int *finished, dt_error *err);
/* After the forward, before backward: settles the updater's exchange in flight (with --overlap it
 * ran under the forward: the gradient's step is known only now), claims the batch for the
 * gradient of that step (or checks that the claim sent before the forward named it) and takes the
 * answer, so ps 0 holds the claim before any of the gradient is pushed. Under the unit's last
 * batch it asks for the next unit, the answer taken by the next dt_work_loop_next. *push 0: its
 * step is applied already (the parameters were pulled again, *global_step, and ps 0 took the unit
 * back), the claim named another step, or the unit is not this worker's any more: skip this
 * batch. */
int dt_work_loop_claim(dt_work_loop *w, dt_net *net, int64_t *global_step, int *push, dt_error *err);
/* Chief, for a checkpoint: fetches ps 0's coordinator state (kept until the next fetch) and ps 0's
 * step then; saved_state gives it (NULL before the first fetch). */
int dt_work_loop_fetch_state(dt_work_loop *w, int64_t *step, dt_error *err);
void dt_work_loop_saved_state(const dt_work_loop *w, const uint8_t **state, size_t *len);

/* Training ended (finished, stopped by a signal, or failed): an answer still due (a claim's, an
 * ask ahead's) is taken, so the client is free for DONE, which gives the units held back to ps 0;
 * logs how many units were granted ahead. */
void dt_work_loop_end(dt_work_loop *w);
/* After the push: counted 1 if ps 0 applied the gradient (not stale); 0 in sync mode: the unit is
 * ps 0's again, and the next batch comes from a new grant. Returns 1 when this batch began a new
 * epoch for this worker (for the loop's log line). */
int dt_work_loop_pushed(dt_work_loop *w, const dt_batch *b, int counted);
/* Epochs done as this worker has seen ps 0's grants (docs/elastic.md): the furthest batch it
 * counted (or, before its first, the start of its first unit), as epochs and a fraction of one.
 * Step lines and the progress line give it instead of global step / steps per epoch, which
 * follows no fixed count when workers join and leave. */
double dt_work_loop_epochs(const dt_work_loop *w);

#endif
