/* A worker's side of the work coordinator on ps 0 (dynamic data sharding, docs/elastic.md): the
 * WORK messages as calls of the ps client (worker/ps_client.h), each a request to ps 0 alone.
 *
 * A claim is split in two: dt_work_claim_send sends it before the batch's forward,
 * dt_work_claim_answer takes its answer after, before any of the gradient is pushed, so ps 0 has it
 * first and the round trip hides under the forward. An ask is split the same way, so a worker asks
 * for its next unit while it trains the last batch of its current one. No other call of the client
 * may run between the two halves. */
#ifndef DT_WORKER_WORK_CLIENT_H
#define DT_WORKER_WORK_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain.h"
#include "worker/ps_client.h"

/* What a worker's data look like; ps 0 checks it against the plan (the same --data everywhere). */
typedef struct {
    uint64_t examples, batch_size, seed;
} dt_work_data;

typedef enum { DT_WORK_GRANTED, DT_WORK_WAIT, DT_WORK_FINISHED } dt_work_answer;

typedef struct {
    dt_work_answer answer;
    uint64_t epoch, unit, mask;   /* GRANTED: bit i of mask, batch unit * unit_batches + i of the epoch */
    int64_t global_step;          /* ps 0's step when it answered */
} dt_work_grant;

/* Asks ps 0 for a unit (join: this process has just started). A refusal (a join past
 * --max_workers, data that differ from the plan, no plan yet) fails with DT_EPROTO and ps 0's text
 * (dt_ps_client_last_refusal has its status). */
int dt_work_ask(dt_ps_client *c, const dt_work_data *d, int join, dt_work_grant *g, dt_error *err);
/* dt_work_ask in two halves: the request, and its answer (the same outcomes). */
int dt_work_ask_send(dt_ps_client *c, const dt_work_data *d, int join, dt_error *err);
int dt_work_ask_answer(dt_ps_client *c, dt_work_grant *g, dt_error *err);

/* Claims batch `batch` of `epoch` for the gradient of `step` (sent; the answer is dt_work_claim_answer's). */
int dt_work_claim_send(dt_ps_client *c, uint64_t epoch, uint64_t batch, int64_t step, dt_error *err);
/* The claim's answer: *stale = 1 when its step is applied already (do not push that gradient). A
 * refusal (the unit is not this worker's any more: it was lost meanwhile) fails with DT_EPROTO. */
int dt_work_claim_answer(dt_ps_client *c, int *stale, dt_error *err);

/* Chief: installs a coordinator state (a fresh plan or a checkpoint's) on ps 0. */
int dt_work_state_put(dt_ps_client *c, const void *state, size_t len, dt_error *err);
/* Fetches ps 0's state: *state (valid until the next call on c), its size and ps 0's step. */
int dt_work_state_get(dt_ps_client *c, const void **state, size_t *len, int64_t *step, dt_error *err);

#endif
