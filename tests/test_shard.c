/* The ps shard as a state machine (src/ps/shard.h), driven directly: no sockets, no ZeroMQ, the
 * time an argument. Each test feeds requests and deadlines and checks the replies the shard sends
 * through a recording ps_io: INIT, async and sync pushes, chunks out of order, a replica twice, a
 * stale step, a later step already full (backup workers), a lost worker at the barrier, strict
 * mode, deferred PULLs answered, expiring, superseded and forgotten with their connection, the
 * admission of large replies, and the dispatch table's conditions. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/optim.h"
#include "ps/ps.h"
#include "ps/shard.h"
#include "test.h"

#include "shard_io.h"

enum { N = 12 };
#define SEC INT64_C(1000000)

/* ---- Requests --------------------------------------------------------------------------------- */

/* INIT of N floats all 1, sgd lr 1 (shard_io.h). */
static void init(ps_shard *s, int chunks, int aggregate, int total, int staleness, int64_t liveness_ms, int strict,
                 int64_t now) {
    shard_init_n(s, N, chunks, aggregate, total, staleness, liveness_ms, strict, now);
}

/* A gradient of `value` for chunk c of `chunks` at step `step` from worker task (PARAMS asked with
 * pull: at least step + 1). */
static void push(ps_shard *s, int conn, uint16_t task, int chunk, int chunks, int64_t step, float value, int pull,
                 int sync, int64_t now) {
    uint64_t off, len;
    dt_wire_chunk(N, (unsigned)chunks, (unsigned)chunk, &off, &len);
    float *g = malloc(len * sizeof *g);
    for (uint64_t i = 0; i < len; i++) g[i] = value;
    dt_wire_header h = hdr(DT_MSG_PUSH, task ? DT_ROLE_WORKER : DT_ROLE_CHIEF, task);
    h.chunk = (uint8_t)chunk, h.chunks = (uint8_t)chunks;
    h.local_step = step;
    h.global_step = step + 1;
    h.payload_bytes = len * sizeof *g;
    h.flags = (sync ? DT_WIRE_F_SYNC : 0) | (pull ? DT_WIRE_F_PULL : 0);
    ps_origin o = from(conn);
    dt_bytes b = {.data = g, .size = len * sizeof *g, .release = free, .hint = g}; /* handed over */
    ps_shard_request(s, &o, &h, &b, now, &io);
}

static void pull(ps_shard *s, int conn, uint16_t task, int chunk, int chunks, int64_t min_step, int64_t now) {
    dt_wire_header h = hdr(DT_MSG_PULL, task ? DT_ROLE_WORKER : DT_ROLE_CHIEF, task);
    h.chunk = (uint8_t)chunk, h.chunks = (uint8_t)chunks;
    h.global_step = min_step;
    ps_origin o = from(conn);
    ps_shard_request(s, &o, &h, NULL, now, &io);
}

static ps_shard *shard_new(void) { return shard_new_n(N); }

static int64_t step_of(ps_shard *s) {
    ps_shard_stats st;
    ps_shard_get_stats(s, &st);
    return st.step;
}

/* ---- Tests ------------------------------------------------------------------------------------ */

static void test_conditions(void) {
    ps_shard *s = shard_new();
    pull(s, 1, 1, 0, 1, 0, 0);
    CHECK(last()->h.type == DT_MSG_ERROR && last()->h.status == DT_WIRE_E_NOT_READY);
    /* only the chief initialises */
    dt_wire_header h = hdr(DT_MSG_INIT, DT_ROLE_WORKER, 1);
    h.shard_floats = N;
    ps_origin o = from(1);
    ps_shard_request(s, &o, &h, NULL, 0, &io);
    CHECK(last()->h.status == DT_WIRE_E_ROLE);
    CHECK_CONTAINS(last()->text, "only the chief may send INIT");
    init(s, 2, 0, 2, 0, 0, 0, 0);
    CHECK(last()->h.type == DT_MSG_ACK && last()->h.chunks == 2 && last()->h.generation == 1);
    pull(s, 1, 1, 0, 3, 0, 0); /* another cut: told the ps's */
    CHECK(last()->h.status == DT_WIRE_E_RESYNC && last()->h.chunks == 2);
    pull(s, 1, 5, 0, 2, 0, 0); /* a task beyond the cluster */
    CHECK(last()->h.status == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(last()->text, "not in this cluster");
    h = hdr(DT_MSG_PULL, DT_ROLE_WORKER, 1);
    h.shard = 3;
    ps_shard_request(s, &o, &h, NULL, 0, &io);
    CHECK(last()->h.status == DT_WIRE_E_SHARD);
    h = hdr(DT_MSG_PARAMS, DT_ROLE_WORKER, 1); /* a reply kind sent as a request */
    ps_shard_request(s, &o, &h, NULL, 0, &io);
    CHECK(last()->h.status == DT_WIRE_E_MALFORMED);
    /* Types the table (indexed by type) has no room or no handler for: refused, never read past it. */
    const uint8_t odd[] = {0, DT_MSG_TYPE_MAX + 1, 255};
    for (size_t i = 0; i < sizeof odd; i++) {
        h = hdr(DT_MSG_PULL, DT_ROLE_WORKER, 1);
        h.type = odd[i];
        ps_shard_request(s, &o, &h, NULL, 0, &io);
        CHECK_MSG(last()->h.status == DT_WIRE_E_MALFORMED, "type %u", odd[i]);
    }
    h = hdr(DT_MSG_DONE, DT_ROLE_PS, 0);
    ps_shard_request(s, &o, &h, NULL, 0, &io);
    CHECK(last()->h.status == DT_WIRE_E_ROLE);
    ps_shard_stats st;
    ps_shard_get_stats(s, &st);
    CHECK_MSG(st.refused == 10, "refused %llu", (unsigned long long)st.refused);
    shard_done(s);
}

static void test_async_chunks_out_of_order(void) {
    ps_shard *s = shard_new();
    init(s, 3, 0, 2, 0, 0, 0, 0);
    push(s, 1, 1, 2, 3, 0, 0.25f, 1, 0, 0); /* chunk 2 first */
    CHECK(last()->h.type == DT_MSG_PARAMS && last()->h.chunk == 2 && last()->h.global_step == 1);
    CHECK_NEAR(last()->first[0], 0.75f, 1e-7); /* sgd lr 1: 1 - 0.25 */
    CHECK(step_of(s) == 0); /* chunks 0 and 1 are behind */
    push(s, 1, 1, 0, 3, 0, 0.5f, 0, 0, 0);
    CHECK(last()->h.type == DT_MSG_PUSH_ACK && last()->h.global_step == 1);
    push(s, 1, 1, 1, 3, 0, 0.5f, 0, 0, 0);
    CHECK(step_of(s) == 1);
    pull(s, 2, 0, 0, 3, 1, 0);
    CHECK(last()->h.type == DT_MSG_PARAMS && last()->first[0] == 0.5f);
    ps_shard_stats st;
    ps_shard_get_stats(s, &st);
    CHECK(st.pushes == 1 && st.updates == 1 && st.pulls == 1); /* counted on chunk 0: whole gradients */
    CHECK(rec.released == 2); /* both PARAMS went zero-copy from a snapshot, handed over and released */
    shard_done(s);
}

/* Two replicas of two: a step applies their mean once both are in, whatever the order; the same
 * worker twice replaces its gradient; a late one is stale, counted. */
static void test_sync_replica_twice_and_stale(void) {
    ps_shard *s = shard_new();
    init(s, 1, 2, 2, 0, 0, 0, 0);
    push(s, 1, 1, 0, 1, 0, 4.0f, 0, 1, 0);
    push(s, 1, 1, 0, 1, 0, 2.0f, 0, 1, 0); /* again: replaces 4 */
    CHECK(step_of(s) == 0);
    push(s, 2, 0, 0, 1, 0, 1.0f, 1, 1, 0);
    CHECK(step_of(s) == 1);
    CHECK(last()->h.type == DT_MSG_PARAMS);
    CHECK_NEAR(last()->first[0], 1.0f - 1.5f, 1e-7); /* mean of 1 and 2 */
    push(s, 1, 1, 0, 1, 0, 9.0f, 0, 1, 0); /* step 0 again: stale */
    CHECK(last()->h.type == DT_MSG_PUSH_ACK && last()->h.status == DT_WIRE_STALE && last()->h.push_ack.stale_count == 1);
    ps_shard_stats st;
    ps_shard_get_stats(s, &st);
    CHECK(st.stale == 1 && st.updates == 1);
    int n;
    const uint64_t *stale = ps_shard_stale_counts(s, &n);
    CHECK(n == 2 && stale[0] == 0 && stale[1] == 1);
    shard_done(s);
}

/* Backup workers (2 of 3) with staleness 1: a later step that already holds its 2 gradients drops
 * a third as stale instead of writing past its table (a heap overflow before the shard machine). */
static void test_sync_later_step_full(void) {
    ps_shard *s = shard_new();
    init(s, 1, 2, 3, 1, 0, 0, 0);
    for (uint16_t w = 0; w < 3; w++) push(s, 1 + w, w, 0, 1, 1, 1.0f, 0, 1, 0);
    CHECK(last()->h.status == DT_WIRE_STALE && last()->h.push_ack.stale_count == 1);
    CHECK(step_of(s) == 0);
    push(s, 1, 0, 0, 1, 0, 1.0f, 0, 1, 0);
    push(s, 2, 1, 0, 1, 0, 1.0f, 0, 1, 0); /* step 0 complete, then step 1 (already full) at once */
    CHECK_MSG(step_of(s) == 2, "step %lld", (long long)step_of(s));
    shard_done(s);
}

/* The barrier: a PULL for a later step is held, answered when the step comes, with its wait. */
static void test_barrier_and_lost_worker(void) {
    ps_shard *s = shard_new();
    init(s, 1, 2, 2, 0, 1000, 0, 0);
    push(s, 1, 0, 0, 1, 0, 1.0f, 1, 1, 10); /* worker 0 pushes and waits for step 1 */
    CHECK(last()->h.type == DT_MSG_ACK); /* nothing new: the INIT's ACK */
    CHECK(rec.held == 1);
    /* worker 1 says nothing: at 1 s it is not lost (it was seen at INIT), after 1 s + it is */
    CHECK(ps_shard_cron(s, 1 * SEC, &io, NULL) == DT_OK && rec.n == 1);
    CHECK(ps_shard_cron(s, 1 * SEC + 1, &io, NULL) == DT_OK);
    CHECK(step_of(s) == 1); /* the step went with the live worker's gradient */
    CHECK(last()->h.type == DT_MSG_PARAMS && last()->h.params.waited_us == (uint64_t)(1 * SEC + 1 - 10));
    CHECK(rec.held == 0);
    ps_shard_stats st;
    ps_shard_get_stats(s, &st);
    CHECK(st.live == 1);
    push(s, 2, 1, 0, 1, 1, 1.0f, 0, 1, 2 * SEC); /* it speaks again: back, and its gradient counts */
    ps_shard_get_stats(s, &st);
    CHECK(st.live == 2 && st.step == 1);
    shard_done(s);
}

static void test_strict_stops(void) {
    ps_shard *s = shard_new();
    init(s, 1, 2, 2, 0, 1000, 1, 0);
    pull(s, 1, 0, 0, 1, 1, 0);
    dt_error e = {0};
    CHECK(ps_shard_cron(s, 2 * SEC, &io, &e) == DT_OK); /* both silent: worker 0 waits, worker 1 is lost */
    CHECK(last()->h.status == DT_WIRE_E_LOST);
    CHECK_CONTAINS(last()->text, "worker 1 lost");
    push(s, 2, 0, 0, 1, 0, 1.0f, 0, 1, 2 * SEC);
    CHECK(last()->h.status == DT_WIRE_E_LOST);
    CHECK(ps_shard_cron(s, 3 * SEC + 1, &io, &e) == DT_ETIMEOUT); /* a timeout later the ps exits */
    CHECK_CONTAINS(e.msg, "--strict");
    shard_done(s);
}

/* Deferred PULLs: held past their longest wait they are answered 106; a closed connection's go
 * unanswered; an earlier connection of a task gives way to the newer one; strangers have a quota. */
static void test_pending_expire_forget_supersede(void) {
    ps_shard *s = shard_new();
    init(s, 1, 1, 2, 0, 0, 0, 0);
    pull(s, 1, 1, 0, 1, 1, 0);
    pull(s, 2, 1, 0, 1, 1, 0);
    CHECK(rec.held == 2 && rec.n == 1);
    ps_shard_forget(s, &conns[2], &io);
    CHECK(rec.held == 1 && rec.n == 1);
    CHECK(ps_shard_cron(s, 59 * SEC, &io, NULL) == DT_OK && rec.n == 1);
    CHECK(ps_shard_cron(s, 61 * SEC, &io, NULL) == DT_OK);
    CHECK(last()->h.status == DT_WIRE_E_BUSY && rec.held == 0);
    CHECK_CONTAINS(last()->text, "did not come within 60 s");
    /* task 1 pushes from connection 3 (it owns the task), fills its quota from 3, then
     * reconnects as 4: 3's PULLs give way */
    push(s, 3, 1, 0, 1, 5, 1.0f, 0, 1, 62 * SEC); /* a step ahead of staleness 0: refused, but the owner is noted */
    for (int i = 0; i < DT_PS_PENDING_PER_PEER; i++) pull(s, 3, 1, 0, 1, 1, 62 * SEC);
    CHECK(rec.held == DT_PS_PENDING_PER_PEER);
    pull(s, 3, 1, 0, 1, 1, 62 * SEC);
    CHECK(last()->h.status == DT_WIRE_E_BUSY);
    CHECK_CONTAINS(last()->text, "this connection already has");
    push(s, 4, 1, 0, 1, 5, 1.0f, 0, 1, 62 * SEC);
    int before = rec.n;
    pull(s, 4, 1, 0, 1, 1, 62 * SEC);
    CHECK(rec.n - before == DT_PS_PENDING_PER_PEER); /* every PULL of connection 3 answered 106 */
    CHECK_CONTAINS(last()->text, "took this one's place");
    CHECK(rec.held == 1);
    shard_done(s);
}

/* A large reply is admitted before it is built: refused with 106 and nothing copied. */
static void test_admission(void) {
    ps_shard *s = shard_new();
    init(s, 1, 0, 1, 0, 0, 0, 0);
    rec.refuse_admit = 1;
    pull(s, 1, 0, 0, 1, 0, 0);
    CHECK(last()->h.status == DT_WIRE_E_BUSY);
    CHECK_CONTAINS(last()->text, "test says no");
    dt_wire_header h = hdr(DT_MSG_FETCH, DT_ROLE_CHIEF, 0);
    ps_origin o = from(1);
    ps_shard_request(s, &o, &h, NULL, 0, &io);
    CHECK(last()->h.status == DT_WIRE_E_BUSY);
    rec.refuse_admit = 0;
    ps_shard_request(s, &o, &h, NULL, 0, &io);
    CHECK(last()->h.type == DT_MSG_STATE && last()->size == N * sizeof(float) && last()->first[N - 1] == 1.0f);
    shard_done(s);
}

static void test_shutdown_fails_pending(void) {
    ps_shard *s = shard_new();
    init(s, 1, 2, 2, 0, 0, 0, 0);
    pull(s, 1, 1, 0, 1, 1, 0);
    dt_wire_header h = hdr(DT_MSG_SHUTDOWN, DT_ROLE_CHIEF, 0);
    ps_origin o = from(0);
    ps_shard_request(s, &o, &h, NULL, 0, &io);
    CHECK(rec.r[rec.n - 2].h.type == DT_MSG_ACK);
    CHECK(last()->h.status == DT_WIRE_E_SHUTDOWN && rec.held == 0);
    ps_shard_stats st;
    ps_shard_get_stats(s, &st);
    CHECK(st.shutdown == 1);
    shard_done(s);
}

/* ---- The work coordinator on ps 0 (docs/elastic.md) ------------------------------------------- */

/* A plan of 8 batches of 2 (16 examples) in units of 4, for `workers` workers, from the chief. */
static void work_plan_for(ps_shard *s, int sync, uint32_t workers, int64_t now) {
    dt_coord_plan p = {.examples = 16, .seed = 5, .batch_size = 2, .unit_batches = 4, .max_workers = workers,
                       .max_held = 2, .liveness_ms = 1000, .sync = sync};
    dt_coord *c = NULL;
    CHECK(dt_coord_new(&c, &p, NULL, NULL) == DT_OK);
    uint8_t state[128];
    CHECK(dt_coord_state_size(c) <= sizeof state);
    dt_coord_save(c, state);
    dt_wire_header h = hdr(DT_MSG_WORK_STATE, DT_ROLE_CHIEF, 0);
    h.payload_bytes = dt_coord_state_size(c);
    ps_origin o = from(0);
    dt_bytes b = {.data = state, .size = h.payload_bytes};
    ps_shard_request(s, &o, &h, &b, now, &io);
    dt_coord_free(c);
}

static void work_plan(ps_shard *s, int sync, int64_t now) { work_plan_for(s, sync, 2, now); }

static void work_ask(ps_shard *s, int conn, uint16_t task, int join, int64_t now) {
    dt_wire_header h = hdr(DT_MSG_WORK_ASK, task ? DT_ROLE_WORKER : DT_ROLE_CHIEF, task);
    h.work_ask.examples = 16, h.work_ask.batch_size = 2, h.work_ask.seed = 5;
    if (join) h.flags = DT_WIRE_F_JOIN;
    ps_origin o = from(conn);
    ps_shard_request(s, &o, &h, NULL, now, &io);
}

static void work_claim(ps_shard *s, int conn, uint16_t task, uint64_t batch, int64_t step, int64_t now) {
    dt_wire_header h = hdr(DT_MSG_WORK_DONE, task ? DT_ROLE_WORKER : DT_ROLE_CHIEF, task);
    h.work_done.epoch = 0, h.work_done.batch = batch, h.local_step = step;
    ps_origin o = from(conn);
    ps_shard_request(s, &o, &h, NULL, now, &io);
}

static dt_coord_stats work_stats(ps_shard *s) {
    dt_coord_stats st = {0};
    CHECK(ps_shard_work_stats(s, &st) == 1);
    return st;
}

/* Before the plan, on another ps, from a worker: refused, saying why. */
static void test_work_conditions(void) {
    ps_shard *s = shard_new();
    init(s, 1, 2, 2, 0, 1000, 0, 0);
    work_ask(s, 1, 1, 1, 0);
    CHECK(last()->h.status == DT_WIRE_E_NOT_READY);
    CHECK_CONTAINS(last()->text, "no work plan yet");
    dt_wire_header h = hdr(DT_MSG_WORK_STATE, DT_ROLE_WORKER, 1);
    ps_origin o = from(1);
    ps_shard_request(s, &o, &h, NULL, 0, &io);
    CHECK(last()->h.status == DT_WIRE_E_ROLE);
    work_plan(s, 0, 0); /* an asynchronous plan for a sync ps */
    CHECK(last()->h.status == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(last()->text, "WORK_STATE for asynchronous training");
    uint8_t junk[80] = "DTCOORD1";
    h = hdr(DT_MSG_WORK_STATE, DT_ROLE_CHIEF, 0);
    h.payload_bytes = sizeof junk;
    dt_bytes b = {.data = junk, .size = sizeof junk};
    ps_shard_request(s, &o, &h, &b, 0, &io);
    CHECK(last()->h.status == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(last()->text, "coordinator state");
    CHECK(ps_shard_work_stats(s, &(dt_coord_stats){0}) == 0);
    shard_done(s);
    ps_shard_config cfg = {.ps_index = 1, .shard_floats = N};
    CHECK(ps_shard_new(&s, &cfg, NULL) == DT_OK);
    h = hdr(DT_MSG_WORK_ASK, DT_ROLE_WORKER, 1);
    h.shard = 1;
    ps_shard_request(s, &o, &h, NULL, 0, &io);
    CHECK(last()->h.status == DT_WIRE_E_UNSUPPORTED);
    CHECK_CONTAINS(last()->text, "the work coordinator is ps 0, this is ps 1");
    shard_done(s);
}

/* Sync: two workers ask, claim and push; the step applied commits both claims on chunk 0; a claim
 * for an applied step is STALE; the refusals name their bound; the state fetched is the chief's. */
static void test_work_sync(void) {
    ps_shard *s = shard_new();
    init(s, 2, 2, 2, 0, 1000, 0, 0);
    work_plan(s, 1, 0);
    CHECK(last()->h.type == DT_MSG_ACK && last()->h.status == DT_WIRE_OK);
    work_ask(s, 1, 0, 1, 0);
    CHECK(last()->h.type == DT_MSG_WORK_GRANT && last()->h.status == DT_WIRE_OK);
    CHECK(last()->h.work_grant.unit == 0 && last()->h.work_grant.mask == 0xf);
    work_ask(s, 2, 1, 1, 0);
    CHECK(last()->h.work_grant.unit == 1);
    work_claim(s, 1, 0, 0, 0, 0);
    CHECK(last()->h.type == DT_MSG_ACK && last()->h.status == DT_WIRE_OK);
    work_claim(s, 2, 1, 0, 0, 0); /* worker 1 claims worker 0's batch */
    CHECK(last()->h.status == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(last()->text, "worker 1 does not hold unit 0 of epoch 0 (held by worker 0)");
    work_claim(s, 2, 1, 4, 0, 0);
    for (int c = 0; c < 2; c++) push(s, 1, 0, c, 2, 0, 1.0f, 0, 1, 0);
    CHECK(work_stats(s).committed == 0); /* chunk 0 waits for worker 1's gradient */
    push(s, 2, 1, 1, 2, 0, 1.0f, 0, 1, 0);
    CHECK(work_stats(s).committed == 0);
    push(s, 2, 1, 0, 2, 0, 1.0f, 0, 1, 0); /* chunk 0 of step 0 applied: both claims count */
    dt_coord_stats st = work_stats(s);
    CHECK(st.committed == 2 && st.voided == 0 && st.live == 2 && st.held == 2);
    /* A claim for an applied step is STALE, and the unit goes back (docs/elastic.md, "A dropped
     * gradient"): granted to worker 1 before worker 0, which is told WAIT. */
    work_claim(s, 1, 0, 1, 0, 0);
    CHECK(last()->h.type == DT_MSG_ACK && last()->h.status == DT_WIRE_STALE);
    st = work_stats(s);
    CHECK(st.dropped == 1 && st.pool == 1 && st.held == 1);
    work_claim(s, 1, 0, 0, 1, 0);
    CHECK(last()->h.status == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(last()->text, "batch 0 of epoch 0 is already counted");
    work_claim(s, 1, 0, 1, 1, 0);
    CHECK(last()->h.status == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(last()->text, "worker 0 does not hold unit 0 of epoch 0 (held by nobody: it is in the pool)");
    work_ask(s, 1, 0, 0, 0);
    CHECK(last()->h.type == DT_MSG_WORK_GRANT && last()->h.status == DT_WIRE_WORK_WAIT);
    /* A stale gradient: worker 1's claim for step 1 is voided when step 1 is applied without it. */
    work_claim(s, 2, 1, 5, 1, 0);
    push(s, 1, 0, 0, 2, 1, 1.0f, 1, 1, 0); /* worker 0 waits at the barrier (a gradient without a claim) */
    CHECK(ps_shard_cron(s, 2 * SEC, &io, NULL) == DT_OK); /* worker 1 is lost: the step goes without it */
    st = work_stats(s);
    CHECK(st.committed == 2 && st.voided == 1 && st.losses == 1 && st.live == 1);
    CHECK(st.pool == 2); /* its unit, batch 4 counted, is back, beside unit 0 */
    /* The chief fetches the state: unit 0 partial (batches 0, 1), unit 1 partial (batch 4). */
    dt_wire_header h = hdr(DT_MSG_WORK_STATE, DT_ROLE_CHIEF, 0);
    ps_origin o = from(0);
    ps_shard_request(s, &o, &h, NULL, 2 * SEC, &io);
    CHECK(last()->h.type == DT_MSG_WORK_STATE && last()->size == 72 + 1 + 2 * 12);
    shard_done(s);
}

/* Async: a push on chunk 0 commits the claim of its step; DONE returns the units; a join past
 * max_workers is refused; a re-INIT voids claims. */
static void test_work_async(void) {
    ps_shard *s = shard_new();
    init(s, 1, 0, 2, 0, 0, 0, 0);
    work_plan(s, 0, 0);
    work_ask(s, 1, 1, 1, 0);
    work_claim(s, 1, 1, 0, 7, 0);
    push(s, 1, 1, 0, 1, 7, 1.0f, 0, 0, 0);
    dt_coord_stats st = work_stats(s);
    CHECK(st.committed == 1);
    work_claim(s, 1, 1, 1, 8, 0);
    init(s, 1, 0, 2, 0, 0, 0, 0); /* the chief re-initialises: the held claim is void */
    st = work_stats(s);
    CHECK(st.voided == 1 && st.held == 1);
    dt_wire_header h = hdr(DT_MSG_DONE, DT_ROLE_WORKER, 1);
    ps_origin o = from(1);
    ps_shard_request(s, &o, &h, NULL, 0, &io);
    st = work_stats(s);
    CHECK(st.leaves == 1 && st.live == 0 && st.pool == 1 && st.held == 0);
    ps_shard_free(s, &io);
    s = shard_new();
    init(s, 1, 0, 3, 0, 0, 0, 0); /* three workers declared, the plan allows two */
    work_plan(s, 0, 0);
    work_ask(s, 3, 2, 1, 0);
    CHECK(last()->h.status == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(last()->text, "worker 2 cannot join: max_workers 2 allows task indices 0..1");
    h = hdr(DT_MSG_WORK_ASK, DT_ROLE_WORKER, 1);
    h.work_ask.examples = 15, h.work_ask.batch_size = 2, h.work_ask.seed = 5;
    ps_shard_request(s, &o, &h, NULL, 0, &io);
    CHECK(last()->h.status == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(last()->text, "worker 1 has 15 training examples, the work plan 16");
    shard_done(s);
}

/* Sync: a worker that sends DONE sits steps out (dynamic sharding's epoch end): the step held for
 * it goes on with the other's gradient; its PULL brings it back, and the next step waits for it
 * again. A second DONE is not counted twice. */
static void test_sit_out_and_back(void) {
    ps_shard *s = shard_new();
    init(s, 1, 2, 2, 0, 0, 0, 0);
    push(s, 1, 0, 0, 1, 0, 1.0f, 0, 1, 0);
    CHECK(step_of(s) == 0); /* waits for worker 1 */
    dt_wire_header h = hdr(DT_MSG_DONE, DT_ROLE_WORKER, 1);
    ps_origin o = from(2);
    ps_shard_request(s, &o, &h, NULL, 0, &io);
    CHECK(step_of(s) == 1); /* applied with worker 0's gradient alone */
    ps_shard_request(s, &o, &h, NULL, 0, &io);
    ps_shard_stats st;
    ps_shard_get_stats(s, &st);
    CHECK(st.updates == 1);
    pull(s, 2, 1, 0, 1, 0, 0); /* back: granted work again */
    push(s, 1, 0, 0, 1, 1, 1.0f, 0, 1, 0);
    CHECK(step_of(s) == 1); /* step 1 waits for worker 1 again */
    push(s, 2, 1, 0, 1, 1, 1.0f, 0, 1, 0);
    CHECK(step_of(s) == 2);
    shard_done(s);
}

/* INIT's ELASTIC flag: of the three declared workers none is waited for before the ps hears from
 * it; worker 0 trains alone, then worker 2 shows up and step 1 waits for it. */
static void test_elastic_init(void) {
    ps_shard *s = shard_new();
    init(s, 1, 3, 3, 0, 0, 2, 0);
    push(s, 1, 0, 0, 1, 0, 1.0f, 0, 1, 0);
    CHECK(step_of(s) == 1); /* workers 1 and 2 never started */
    pull(s, 3, 2, 0, 1, 0, 0);
    push(s, 1, 0, 0, 1, 1, 1.0f, 0, 1, 0);
    CHECK(step_of(s) == 1);
    push(s, 3, 2, 0, 1, 1, 1.0f, 0, 1, 0);
    CHECK(step_of(s) == 2);
    shard_done(s);
}

/* Backup workers under INIT's ELASTIC flag: a step waits for the live workers but b = total -
 * aggregate (here 3 - 2 = 1), k = max(1, live - b), as workers come and go; the gradient beyond
 * k is stale. */
static void test_elastic_backup(void) {
    ps_shard *s = shard_new();
    init(s, 1, 2, 3, 0, 1000, 2, 0);
    push(s, 1, 0, 0, 1, 0, 1.0f, 0, 1, 0);
    CHECK(step_of(s) == 1); /* 1 live: k = max(1, 1 - 1) = 1 */
    pull(s, 2, 1, 0, 1, 0, 0);
    push(s, 1, 0, 0, 1, 1, 1.0f, 0, 1, 0);
    CHECK(step_of(s) == 2); /* 2 live: k = 1 still */
    pull(s, 3, 2, 0, 1, 0, 0);
    push(s, 2, 1, 0, 1, 2, 1.0f, 0, 1, 0);
    CHECK(step_of(s) == 2); /* 3 live: k = 2 */
    push(s, 3, 2, 0, 1, 2, 1.0f, 0, 1, 0);
    CHECK(step_of(s) == 3);
    push(s, 1, 0, 0, 1, 2, 1.0f, 0, 1, 0); /* the backup's gradient: too late */
    CHECK(last()->h.status == DT_WIRE_STALE);
    /* Worker 2 sits steps out: 2 live, k = 1 */
    dt_wire_header h = hdr(DT_MSG_DONE, DT_ROLE_WORKER, 2);
    ps_origin o = from(3);
    ps_shard_request(s, &o, &h, NULL, 0, &io);
    push(s, 1, 0, 0, 1, 3, 1.0f, 0, 1, 0);
    CHECK(step_of(s) == 4);
    shard_done(s);
}

/* A worker that joins while a step is part applied (chunks apply one by one as the gradients come:
 * chunk 0 is past step 0, chunk 1 not) counts from the next step: chunk 1 applies step 0 with the
 * workers it waited for, and the joiner's gradient for step 0 is stale everywhere. Before, chunk 1
 * waited for worker 2's gradient for step 0, which worker 2 could not send (its claim for step 0
 * is stale: chunk 0 applied it): the sync job froze at a join. The ps's log says "joined" at a
 * first message, "is back" after a loss, and a loss's figures are what steps waited for. */
static void test_join_mid_step(void) {
    FILE *log = tmpfile();
    CHECK(log != NULL);
    if (!log) return;
    memset(&rec, 0, sizeof rec);
    ps_shard *s = NULL;
    ps_shard_config cfg = {.ps_index = 0, .shard_floats = N, .log = log};
    CHECK(ps_shard_new(&s, &cfg, NULL) == DT_OK);
    init(s, 2, 3, 3, 0, 1000, 2, 0); /* elastic: 3 declared, none heard from yet */
    work_plan_for(s, 1, 3, 0);
    work_ask(s, 1, 0, 1, 0); /* unit 0; worker 1 pushes without a unit (the plan has 2) */
    pull(s, 2, 1, 0, 2, 0, 0);
    push(s, 1, 0, 0, 2, 0, 1.0f, 0, 1, 0);
    push(s, 2, 1, 0, 2, 0, 1.0f, 0, 1, 0); /* chunk 0 applies step 0: 2 live workers */
    push(s, 1, 0, 1, 2, 0, 1.0f, 0, 1, 0); /* chunk 1 waits for worker 1's */
    work_ask(s, 3, 2, 1, 0);               /* worker 2 joins now */
    CHECK(last()->h.type == DT_MSG_WORK_GRANT && last()->h.status == DT_WIRE_OK);
    const uint64_t batch = last()->h.work_grant.unit * 4 + 0;
    work_claim(s, 3, 2, batch, 0, 0);
    CHECK(last()->h.status == DT_WIRE_STALE); /* step 0 is applied on chunk 0: no gradient of its counts */
    push(s, 2, 1, 1, 2, 0, 1.0f, 0, 1, 0);
    CHECK_MSG(step_of(s) == 1, "chunk 1 still waits at step %lld for the joiner", (long long)step_of(s));
    push(s, 3, 2, 1, 2, 0, 1.0f, 0, 1, 0);
    CHECK(last()->h.status == DT_WIRE_STALE);
    /* From step 1 on worker 2 counts on every chunk. */
    for (int c = 0; c < 2; c++) {
        push(s, 1, 0, c, 2, 1, 1.0f, 0, 1, 0);
        push(s, 2, 1, c, 2, 1, 1.0f, 0, 1, 0);
    }
    CHECK(step_of(s) == 1);
    for (int c = 0; c < 2; c++) push(s, 3, 2, c, 2, 1, 1.0f, 0, 1, 0);
    CHECK(step_of(s) == 2);
    /* Worker 1 sits steps out, worker 2 is lost: steps waited for 2, now for 1 of 1 live worker. */
    dt_wire_header h = hdr(DT_MSG_DONE, DT_ROLE_WORKER, 1);
    h.flags = DT_WIRE_F_WAITING;
    ps_origin o = from(2);
    ps_shard_request(s, &o, &h, NULL, 0, &io);
    push(s, 1, 0, 0, 2, 2, 1.0f, 0, 1, 1500000); /* the chief speaks; worker 2 is silent */
    CHECK(ps_shard_cron(s, 1500000, &io, NULL) == DT_OK);
    pull(s, 3, 2, 0, 2, 0, 1600000);            /* and back */
    char text[8192] = "";
    rewind(log);
    size_t got = fread(text, 1, sizeof text - 1, log);
    text[got] = '\0';
    CHECK_CONTAINS(text, "worker 2 joined: steps wait for 3 gradient(s)");
    CHECK_CONTAINS(text, "worker 2 lost (no message for 1000 ms): steps now wait for 1 gradient(s) from the 1 live "
                   "worker(s) instead of 2");
    CHECK_CONTAINS(text, "worker 2 is back: steps wait for 2 gradient(s) again");
    CHECK(strstr(text, "worker 0 is back") == NULL && strstr(text, "worker 2 is back: steps wait for 3") == NULL);
    shard_done(s);
    fclose(log);
}

/* The chief's end of a job (docs/elastic.md, "The end of a job"): STATUS says how many members of
 * the work plan besides the asker still train, and counts a DONE or a loss as an end. */
static dt_wire_header status_of(ps_shard *s, int64_t now) {
    dt_wire_header h = hdr(DT_MSG_STATUS, DT_ROLE_CHIEF, 0);
    ps_origin o = from(0);
    ps_shard_request(s, &o, &h, NULL, now, &io);
    CHECK(last()->h.type == DT_MSG_STATUS_REPLY);
    return last()->h;
}

static void test_end_of_job(void) {
    ps_shard *s = shard_new();
    init(s, 1, 0, 2, 0, 0, 0, 0);
    work_plan(s, 0, 0);
    dt_wire_header st = status_of(s, 0);
    CHECK(st.workers_busy == 0 && st.status_reply.workers_done == 0);
    work_ask(s, 1, 0, 1, 0); /* the chief and worker 1 join */
    work_ask(s, 2, 1, 1, 0);
    st = status_of(s, 0);
    CHECK(st.workers_busy == 1 && st.status_reply.workers_done == 0); /* the asker is not counted */
    dt_wire_header h = hdr(DT_MSG_DONE, DT_ROLE_WORKER, 1);
    h.flags = DT_WIRE_F_WAITING; /* sitting steps out until there is work: still a member */
    ps_origin o = from(2);
    ps_shard_request(s, &o, &h, NULL, 0, &io);
    CHECK(last()->h.type == DT_MSG_ACK && status_of(s, 0).workers_busy == 1);
    h.flags = 0; /* finished */
    ps_shard_request(s, &o, &h, NULL, 0, &io);
    st = status_of(s, 0);
    CHECK(st.workers_busy == 0 && st.status_reply.workers_done == 1);
    work_ask(s, 2, 1, 0, 1); /* back for more: busy again */
    CHECK(status_of(s, SEC).workers_busy == 1); /* the chief's STATUS keeps it a member */
    CHECK(ps_shard_cron(s, 2 * SEC, &io, NULL) == DT_OK); /* worker 1 silent past the plan's 1 s: lost */
    st = status_of(s, 2 * SEC);
    CHECK(st.workers_busy == 0 && st.status_reply.workers_done == 1); /* one task, ended once */
    shard_done(s);
}

/* ---- Sync steps weighted by examples (docs/elastic.md, "Sync mode when membership changes") ---- */

/* Chunk c of `chunks` of the whole gradient g [N] from worker task, saying `examples`. */
static void push_g(ps_shard *s, int conn, uint16_t task, int chunk, int chunks, int64_t step, const float *g,
                   uint64_t examples) {
    uint64_t off, len;
    dt_wire_chunk(N, (unsigned)chunks, (unsigned)chunk, &off, &len);
    float *b = malloc(len * sizeof *b);
    memcpy(b, g + off, len * sizeof *b);
    dt_wire_header h = hdr(DT_MSG_PUSH, task ? DT_ROLE_WORKER : DT_ROLE_CHIEF, task);
    h.chunk = (uint8_t)chunk, h.chunks = (uint8_t)chunks;
    h.local_step = step;
    h.push.examples = examples;
    h.payload_bytes = len * sizeof *b;
    h.flags = DT_WIRE_F_SYNC;
    ps_origin o = from(conn);
    dt_bytes pb = {.data = b, .size = len * sizeof *b, .release = free, .hint = b};
    ps_shard_request(s, &o, &h, &pb, 0, &io);
}

/* Worker w's gradient: irregular values of both signs and several magnitudes. */
static void grad_of(int w, float *g) {
    uint32_t x = 2654435761u * (uint32_t)(w + 1);
    for (int i = 0; i < N; i++) {
        x = x * 1664525u + 1013904223u;
        g[i] = ((float)(x >> 8) / 16777216.0f - 0.5f) * (float)(1 << (i % 5));
    }
}

/* One sync step of 3 workers (chunks 2) whose gradients say ex[w] examples; the parameters after
 * it into out [N] (INIT's are all 1, sgd lr 1). */
static void weighted_step(const uint64_t ex[3], float out[N]) {
    ps_shard *s = shard_new();
    init(s, 2, 3, 3, 0, 0, 0, 0);
    float g[3][N];
    for (int w = 0; w < 3; w++) grad_of(w, g[w]);
    for (int w = 2; w >= 0; w--) /* arrival order is not the sum's order */
        for (int c = 1; c >= 0; c--) push_g(s, 1 + w, (uint16_t)w, c, 2, 0, g[w], ex[w]);
    CHECK(step_of(s) == 1);
    for (int c = 0; c < 2; c++) {
        pull(s, 1, 0, c, 2, 1, 0);
        uint64_t off, len;
        dt_wire_chunk(N, 2, (unsigned)c, &off, &len);
        CHECK(last()->h.type == DT_MSG_PARAMS && last()->h.global_step == 1);
        memcpy(out + off, last()->first, len * sizeof(float));
    }
    shard_done(s);
}

/* Batches of different sizes (an epoch's short last batch): the update is the mean over the
 * examples, sum(w_k g_k) / sum(w_k), against a float64 reference, and not the plain mean. Equal
 * batches, or a gradient that does not say (0: an older client), give the plain mean bit for bit
 * as the ps computed it before gradients said their examples: ((g0 + g1) + g2) / 3 in float,
 * applied by the same optimizer call. */
static void test_sync_weighted_by_examples(void) {
    float g[3][N], got[N], plain[N], same[N], unsaid[N];
    for (int w = 0; w < 3; w++) grad_of(w, g[w]);
    weighted_step((const uint64_t[3]){32, 32, 16}, got);
    float one[N], mean[N];
    for (int i = 0; i < N; i++) one[i] = 1.0f, mean[i] = ((g[0][i] + g[1][i]) + g[2][i]) / 3.0f;
    dt_opt_config opt = {.kind = DT_OPT_SGD, .learning_rate = 1.0f};
    dt_opt_apply_to(&opt, plain, one, mean, NULL, NULL, N, 0, NULL);
    double worst = 0, apart = 0;
    for (int i = 0; i < N; i++) {
        double ref = 1.0 - (32.0 * g[0][i] + 32.0 * g[1][i] + 16.0 * g[2][i]) / 80.0;
        double d = fabs((double)got[i] - ref) / (fabs(ref) > 1 ? fabs(ref) : 1);
        if (d > worst) worst = d;
        if (fabs((double)plain[i] - ref) > apart) apart = fabs((double)plain[i] - ref);
    }
    CHECK_MSG(worst < 4e-7, "weighted mean off the float64 reference by %g (relative)", worst);
    CHECK_MSG(apart > 1e-3, "the plain mean is only %g from the weighted one: the test cannot tell them", apart);
    weighted_step((const uint64_t[3]){32, 32, 32}, same);
    weighted_step((const uint64_t[3]){32, 0, 16}, unsaid);
    CHECK(memcmp(same, plain, sizeof plain) == 0);
    CHECK(memcmp(unsaid, plain, sizeof plain) == 0);
}

/* Every chunk of one gradient says the same examples: a chunk that differs is refused naming both
 * and changes nothing; the worker's next gradient starts over. Weighted steps are counted. */
static void test_sync_examples_per_chunk(void) {
    ps_shard *s = shard_new();
    init(s, 2, 2, 2, 0, 0, 0, 0);
    float g[N];
    grad_of(0, g);
    push_g(s, 1, 0, 1, 2, 0, g, 32);
    push_g(s, 1, 0, 0, 2, 0, g, 31);
    CHECK(last()->h.type == DT_MSG_ERROR && last()->h.status == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(last()->text, "chunk 0 of worker 0's gradient for step 0 averages 31 examples, its chunks before 32");
    push_g(s, 1, 0, 0, 2, 0, g, 32);
    CHECK(last()->h.type == DT_MSG_PUSH_ACK && last()->h.status == DT_WIRE_OK);
    push_g(s, 2, 1, 0, 2, 0, g, 8);
    push_g(s, 2, 1, 1, 2, 0, g, 8);
    CHECK(step_of(s) == 1);
    /* Step 1: worker 1 sends its gradient whole, then again (restarted) with other examples. */
    for (int c = 0; c < 2; c++) push_g(s, 2, 1, c, 2, 1, g, 8);
    for (int c = 0; c < 2; c++) push_g(s, 2, 1, c, 2, 1, g, 4);
    CHECK(last()->h.type == DT_MSG_PUSH_ACK && last()->h.status == DT_WIRE_OK);
    ps_shard_stats st;
    ps_shard_get_stats(s, &st);
    CHECK(st.weighted == 1 && st.refused == 1 && st.updates == 1);
    shard_done(s);
}

/* Steps just below the most a header carries (DT_WIRE_MAX_STEP, 2^62): gradients applied there,
 * their replies one step on, a pull held up to step + staleness + 2 and refused beyond, asynchronous
 * pulls up to step + 1024; the sanitizer build checks that none of it overflows (it did at 2^63 - 1,
 * which the decoder now refuses: test_wire.c). */
static void test_steps_at_the_bound(void) {
    const int64_t b = DT_WIRE_MAX_STEP - 8;
    init_step = b;
    ps_shard *s = shard_new();
    init(s, 1, 1, 1, 1, 0, 0, 0); /* sync, 1 of 1, staleness 1 */
    push(s, 1, 0, 0, 1, b, 1.0f, 1, 1, 0);
    CHECK(last()->h.type == DT_MSG_PARAMS && last()->h.global_step == b + 1);
    CHECK(step_of(s) == b + 1);
    int replies = rec.n;
    pull(s, 1, 0, 0, 1, b + 4, 0); /* step + staleness + 2: held */
    CHECK(rec.n == replies && rec.held == 1);
    pull(s, 2, 0, 0, 1, b + 5, 0);
    CHECK(last()->h.type == DT_MSG_ERROR && last()->h.status == DT_WIRE_E_BAD_VALUE);
    shard_done(s);
    s = shard_new();
    init(s, 1, 0, 1, 0, 0, 0, 0); /* async */
    push(s, 1, 0, 0, 1, b, 1.0f, 0, 0, 0);
    CHECK(last()->h.type == DT_MSG_PUSH_ACK && last()->h.global_step == b + 1);
    replies = rec.n;
    pull(s, 1, 0, 0, 1, DT_WIRE_MAX_STEP, 0); /* within step + 1024: held */
    CHECK(rec.n == replies && rec.held == 1);
    shard_done(s);
    init_step = 0;
}

int main(void) {
    RUN(test_conditions);
    RUN(test_sit_out_and_back);
    RUN(test_elastic_init);
    RUN(test_elastic_backup);
    RUN(test_join_mid_step);
    RUN(test_async_chunks_out_of_order);
    RUN(test_sync_replica_twice_and_stale);
    RUN(test_sync_later_step_full);
    RUN(test_barrier_and_lost_worker);
    RUN(test_strict_stops);
    RUN(test_pending_expire_forget_supersede);
    RUN(test_admission);
    RUN(test_shutdown_fails_pending);
    RUN(test_work_conditions);
    RUN(test_work_sync);
    RUN(test_work_async);
    RUN(test_end_of_job);
    RUN(test_sync_weighted_by_examples);
    RUN(test_sync_examples_per_chunk);
    RUN(test_steps_at_the_bound);
    return test_summary();
}
