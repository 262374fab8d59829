/* The work coordinator: plan, units, grants, claims and their settling, members (coord.h says
 * what it is; coord_state.c saves and loads it). */
#include "ps/coord.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/error.h"
#include "ps/coord_impl.h"
#include "transport/wire.h"

#define COORD_LOG_DROPPED 3 /* units taken back for a dropped gradient: the first few logged */

_Static_assert(DT_COORD_MAX_STATE_BYTES == DT_WIRE_MAX_WORK_STATE, "WORK_STATE's bound and the coordinator's disagree");

static void coord_log(const dt_coord *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void coord_log(const dt_coord *c, const char *fmt, ...) {
    if (!c->log) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("ps 0: ", c->log);
    vfprintf(c->log, fmt, ap);
    fputc('\n', c->log);
    fflush(c->log);
    va_end(ap);
}

/* A refusal: counted, its text in why. */
static int32_t refuse(dt_coord *c, int32_t status, char *why, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int32_t refuse(dt_coord *c, int32_t status, char *why, size_t len, const char *fmt, ...) {
    c->totals.refused++;
    va_list ap;
    va_start(ap, fmt);
    if (len) vsnprintf(why, len, fmt, ap);
    va_end(ap);
    return status;
}

/* ---- Plan and units --------------------------------------------------------------------------- */

int coord_check_plan(const dt_coord_plan *p, uint32_t *units, uint32_t *batches, dt_error *err) {
    if (p->examples < 1 || p->examples > DT_COORD_MAX_EXAMPLES)
        return dt_errorf(err, DT_EINVAL, "work plan: %" PRIu64 " examples (must be 1..%u)", p->examples,
                         DT_COORD_MAX_EXAMPLES);
    if (p->batch_size < 1 || p->batch_size > DT_COORD_MAX_BATCH_SIZE)
        return dt_errorf(err, DT_EINVAL, "work plan: batch size %u (must be 1..%u)", p->batch_size,
                         DT_COORD_MAX_BATCH_SIZE);
    if (p->unit_batches < 1 || p->unit_batches > DT_COORD_MAX_UNIT_BATCHES)
        return dt_errorf(err, DT_EINVAL, "work plan: %u batches per unit (must be 1..%u)", p->unit_batches,
                         DT_COORD_MAX_UNIT_BATCHES);
    if (p->max_workers < 1 || p->max_workers > DT_COORD_MAX_WORKERS)
        return dt_errorf(err, DT_EINVAL, "work plan: max_workers %u (must be 1..%u)", p->max_workers,
                         DT_COORD_MAX_WORKERS);
    if (p->max_held < 1 || p->max_held > DT_COORD_MAX_HELD)
        return dt_errorf(err, DT_EINVAL, "work plan: max_held %u (must be 1..%u)", p->max_held, DT_COORD_MAX_HELD);
    if (p->liveness_ms > DT_COORD_MAX_LIVENESS_MS)
        return dt_errorf(err, DT_EINVAL, "work plan: liveness %u ms (at most %u)", p->liveness_ms,
                         DT_COORD_MAX_LIVENESS_MS);
    uint64_t nb = (p->examples + p->batch_size - 1) / p->batch_size, nu = (nb + p->unit_batches - 1) / p->unit_batches;
    if (nu > DT_COORD_MAX_UNITS)
        return dt_errorf(err, DT_EINVAL, "work plan: %" PRIu64 " units of %u batches of %u (at most %u units: larger "
                         "units or batches)", nu, p->unit_batches, p->batch_size, DT_COORD_MAX_UNITS);
    if (p->epochs > DT_COORD_MAX_EPOCHS)
        return dt_errorf(err, DT_EINVAL, "work plan: %" PRIu64 " epochs (at most %u)", p->epochs, DT_COORD_MAX_EPOCHS);
    if (p->last_batches && (!p->epochs || p->last_batches >= nb))
        return dt_errorf(err, DT_EINVAL, "work plan: the last epoch's %u batch(es) (must be 1..%" PRIu64 " of a plan "
                         "with an end, or 0: the last epoch whole)", p->last_batches, nb - 1);
    *units = (uint32_t)nu, *batches = (uint32_t)nb;
    return DT_OK;
}

void dt_coord_unit_batches(const dt_coord *c, uint32_t unit, uint64_t *first, uint32_t *count) {
    uint64_t b = (uint64_t)unit * c->plan.unit_batches, end = b + c->plan.unit_batches;
    if (end > c->batches) end = c->batches;
    *first = b;
    *count = end > b ? (uint32_t)(end - b) : 0;
}

uint64_t coord_full_mask(const dt_coord *c, uint32_t unit) {
    uint64_t first;
    uint32_t n;
    dt_coord_unit_batches(c, unit, &first, &n);
    return n >= 64 ? UINT64_MAX : (UINT64_C(1) << n) - 1;
}

void coord_epoch_size(const dt_coord_plan *p, uint64_t epoch, uint32_t *units, uint32_t *batches) {
    uint64_t nb = (p->examples + p->batch_size - 1) / p->batch_size; /* checked: at most 2^24 */
    if (p->last_batches && epoch + 1 == p->epochs) nb = p->last_batches;
    *batches = (uint32_t)nb;
    *units = (uint32_t)((nb + p->unit_batches - 1) / p->unit_batches);
}

/* Every unit fresh: the start of an epoch (of c->epoch's size). */
static void units_reset(dt_coord *c) {
    coord_epoch_size(&c->plan, c->epoch, &c->units, &c->batches);
    memset(c->done_mask, 0, c->max_units * sizeof *c->done_mask);
    memset(c->claimed, 0, c->max_units * sizeof *c->claimed);
    memset(c->avoid, 0, c->max_units * sizeof *c->avoid);
    memset(c->state, UNIT_FRESH, c->max_units);
    memset(c->claims, 0, c->max_units);
    for (uint32_t u = 0; u < c->max_units; u++) c->holder[u] = COORD_NONE;
    c->pool_head = c->pool_len = c->next_fresh = 0;
    c->n_done = c->n_held = c->n_orphan = 0;
}

int dt_coord_new(dt_coord **out, const dt_coord_plan *plan, FILE *log, dt_error *err) {
    *out = NULL;
    uint32_t units, batches;
    int rc = coord_check_plan(plan, &units, &batches, err);
    if (rc) return rc;
    dt_coord *c = dt_calloc(1, sizeof *c, "work coordinator", err);
    if (!c) return DT_ENOMEM;
    c->plan = *plan, c->log = log, c->max_units = units;
    c->done_mask = dt_calloc(units, sizeof *c->done_mask, "work units", err);
    c->claimed = dt_calloc(units, sizeof *c->claimed, "work units", err);
    c->holder = dt_calloc(units, sizeof *c->holder, "work units", err);
    c->conn = dt_calloc(units, sizeof *c->conn, "work units", err);
    c->avoid = dt_calloc(units, sizeof *c->avoid, "work units", err);
    c->state = dt_calloc(units, 1, "work units", err);
    c->claims = dt_calloc(units, 1, "work units", err);
    c->pool = dt_calloc(units, sizeof *c->pool, "work pool", err);
    c->m = dt_calloc(plan->max_workers, sizeof *c->m, "work members", err);
    c->active = dt_calloc(plan->max_workers, sizeof *c->active, "work members", err);
    c->ended = dt_calloc((plan->max_workers + 7) / 8, 1, "work members", err);
    if (!c->done_mask || !c->claimed || !c->holder || !c->conn || !c->avoid || !c->state || !c->claims || !c->pool ||
        !c->m || !c->active || !c->ended) {
        dt_coord_free(c);
        return DT_ENOMEM;
    }
    units_reset(c);
    *out = c;
    return DT_OK;
}

void dt_coord_free(dt_coord *c) {
    if (!c) return;
    for (int i = 0; c->m && i < c->n_active; i++) free(c->m[c->active[i]]);
    free(c->done_mask), free(c->claimed), free(c->holder), free(c->conn), free(c->avoid), free(c->state);
    free(c->claims);
    free(c->pool);
    free(c->m), free(c->active), free(c->ended);
    free(c);
}

const dt_coord_plan *dt_coord_get_plan(const dt_coord *c) { return &c->plan; }

void dt_coord_get_stats(const dt_coord *c, dt_coord_stats *o) {
    *o = c->totals;
    o->epoch = c->epoch, o->units = c->units, o->batches = c->batches, o->live = c->live;
    o->done = c->n_done, o->held = c->n_held, o->pool = c->pool_len, o->orphaned = c->n_orphan;
}

int32_t dt_coord_check_plan(dt_coord *c, int worker, uint64_t examples, uint64_t batch_size, uint64_t seed,
                            char *why, size_t len) {
    const dt_coord_plan *p = &c->plan;
    if (examples != p->examples)
        return refuse(c, DT_WIRE_E_BAD_VALUE, why, len, "worker %d has %" PRIu64 " training examples, the work plan "
                      "%" PRIu64 " (the same --data and --validation_fraction everywhere?)", worker, examples, p->examples);
    if (batch_size != p->batch_size)
        return refuse(c, DT_WIRE_E_BAD_VALUE, why, len, "worker %d trains batches of %" PRIu64 ", the work plan %u "
                      "(the same --batch_size everywhere?)", worker, batch_size, p->batch_size);
    if (seed != p->seed)
        return refuse(c, DT_WIRE_E_BAD_VALUE, why, len, "worker %d shuffles with seed %" PRIu64 ", the work plan with "
                      "%" PRIu64 " (the same --seed everywhere?)", worker, seed, p->seed);
    return DT_WIRE_OK;
}

/* ---- The pool and the epoch ------------------------------------------------------------------- */

void coord_pool_push(dt_coord *c, uint32_t unit) {
    if (!DT_ASSERT(c->pool_len < c->units)) return; /* a full pool: never written past its end */
    c->pool[(c->pool_head + c->pool_len++) % c->units] = unit;
    c->state[unit] = UNIT_POOL;
}

/* Takes the pool's unit at position i (from the head): the head moves into its place. */
static uint32_t pool_remove(dt_coord *c, uint32_t i) {
    uint32_t at = (c->pool_head + i) % c->units, u = c->pool[at];
    c->pool[at] = c->pool[c->pool_head];
    c->pool_head = (c->pool_head + 1) % c->units;
    c->pool_len--;
    return u;
}

/* The next unit to grant worker w: a returned one first, else the next fresh one; COORD_NONE if
 * none. A unit taken from w for a dropped gradient goes to anyone else first: to w only when no
 * other member is there to ask for it (the others ask until the epoch ends, or are lost). The
 * scan is bounded by the pool, and passes only units w itself dropped. */
static uint32_t pool_take(dt_coord *c, int w) {
    for (uint32_t i = 0; i < c->pool_len; i++)
        if (c->avoid[c->pool[(c->pool_head + i) % c->units]] != (uint32_t)w + 1) return pool_remove(c, i);
    while (c->next_fresh < c->units && c->state[c->next_fresh] != UNIT_FRESH) c->next_fresh++;
    if (c->next_fresh < c->units) return c->next_fresh++;
    return c->pool_len && c->live <= 1 ? pool_remove(c, 0) : COORD_NONE;
}

static int finished(const dt_coord *c) { return c->plan.epochs && c->epoch >= c->plan.epochs; }

static void epoch_end(dt_coord *c) {
    if (!DT_ASSERT(c->n_held == 0 && c->n_orphan == 0 && c->pool_len == 0)) return; /* units still out: no end */
    c->totals.epochs_done++;
    c->epoch++;
    coord_log(c, "epoch %" PRIu64 " done: its %u unit(s), %u batch(es), each counted once%s", c->epoch - 1, c->units,
              c->batches, finished(c) ? "; training finished" : "");
    units_reset(c);
}

/* ---- Members ---------------------------------------------------------------------------------- */

static void held_remove(member_t *m, uint32_t unit) {
    for (int i = 0; i < m->n_held; i++)
        if (m->held[i] == unit) {
            m->held[i] = m->held[--m->n_held];
            return;
        }
}

/* A unit whose holder is gone: to the pool, or, with claims unsettled, waiting for them. */
static void unit_release(dt_coord *c, uint32_t u) {
    c->holder[u] = COORD_NONE;
    c->n_held--;
    c->totals.returned++;
    if (c->claims[u]) {
        c->state[u] = UNIT_ORPHAN;
        c->n_orphan++;
    } else {
        coord_pool_push(c, u);
    }
}

/* Sync: member w's gradient of a batch of unit u was dropped as stale (it came after its step was
 * applied, or to a step already full with backup workers), and its claim voided. w loses the unit:
 * it goes back with the batches not yet counted and is granted to another member first. A slow
 * worker (the one backup workers leave out, by design) would otherwise train the same batch again
 * and again, each time too late, and hold its unit, and the epoch's end, for as long. */
static void unit_take(dt_coord *c, int w, uint64_t batch, int64_t step) {
    uint32_t u = (uint32_t)(batch / c->plan.unit_batches);
    if (c->state[u] != UNIT_HELD || c->holder[u] != (uint32_t)w) return;
    held_remove(c->m[w], u);
    unit_release(c, u);
    c->avoid[u] = (uint32_t)w + 1;
    if (++c->totals.dropped <= COORD_LOG_DROPPED)
        coord_log(c, "worker %d's gradient of batch %" PRIu64 " for step %" PRId64 " was not applied (stale): unit %u "
                  "goes back, to another worker first%s", w, batch, step, u,
                  c->totals.dropped == COORD_LOG_DROPPED ? "; further ones are counted" : "");
}

static void member_free(dt_coord *c, int w) {
    member_t *m = c->m[w];
    uint32_t last = c->active[--c->n_active];
    c->active[m->active_pos] = last;
    c->m[last]->active_pos = m->active_pos;
    free(m);
    c->m[w] = NULL;
}

static void settle(dt_coord *c, int w, int k, int commit);

/* A member leaves (clean, lost or rejoining): its units go back; async claims are void (their
 * pushes will not come), sync ones settle with their steps. A ghost with no claims is freed. */
static void member_depart(dt_coord *c, int w) {
    member_t *m = c->m[w];
    for (int i = 0; i < m->n_held; i++) unit_release(c, m->held[i]);
    m->n_held = 0;
    if (!c->plan.sync)
        while (m->n_claims) settle(c, w, 0, 0);
    if (m->joined) c->live--;
    m->joined = 0;
    c->ended[w >> 3] |= (uint8_t)(1u << (w & 7));
    if (!m->n_claims) member_free(c, w);
}

/* A new member (or a ghost joining again). DT_WIRE_OK or DT_WIRE_E_NOMEM. */
static int32_t member_join(dt_coord *c, int w, int64_t now) {
    member_t *m = c->m[w];
    if (!m) {
        if (!(m = calloc(1, sizeof *m))) return DT_WIRE_E_NOMEM;
        c->m[w] = m;
        m->active_pos = c->n_active;
        c->active[c->n_active++] = (uint32_t)w;
    }
    m->joined = 1;
    m->seen = now;
    c->ended[w >> 3] &= (uint8_t)~(1u << (w & 7));
    c->live++;
    c->totals.joins++;
    coord_log(c, "worker %d joined: %d live worker(s)", w, c->live);
    return DT_WIRE_OK;
}

void dt_coord_seen(dt_coord *c, int w, int64_t now) {
    if (w >= 0 && (uint32_t)w < c->plan.max_workers && c->m[w] && c->m[w]->joined) c->m[w]->seen = now;
}

void dt_coord_leave(dt_coord *c, int w) {
    if (w < 0 || (uint32_t)w >= c->plan.max_workers || !c->m[w] || !c->m[w]->joined) return;
    int held = c->m[w]->n_held;
    member_depart(c, w);
    c->totals.leaves++;
    coord_log(c, "worker %d left: %d unit(s) returned, %d live worker(s)", w, held, c->live);
}

int dt_coord_busy(const dt_coord *c, int w) {
    int self = w >= 0 && (uint32_t)w < c->plan.max_workers && c->m[w] && c->m[w]->joined;
    return c->live - self;
}

uint32_t dt_coord_count_ended(const dt_coord *c, const uint8_t *also, uint32_t also_tasks) {
    uint32_t n = 0, bytes = (c->plan.max_workers + 7) / 8, also_bytes = (also_tasks + 7) / 8;
    for (uint32_t i = 0; i < bytes || (also && i < also_bytes); i++)
        n += (uint32_t)__builtin_popcount((i < bytes ? c->ended[i] : 0) | (also && i < also_bytes ? also[i] : 0));
    return n;
}

int dt_coord_cron(dt_coord *c, int64_t now) {
    if (!c->plan.liveness_ms) return 0;
    int lost = 0;
    for (int i = 0; i < c->n_active;) {
        int w = (int)c->active[i];
        member_t *m = c->m[w];
        if (!m->joined || now - m->seen <= (int64_t)c->plan.liveness_ms * 1000) {
            i++;
            continue;
        }
        int held = m->n_held;
        member_depart(c, w); /* may move another index into slot i */
        c->totals.losses++;
        lost++;
        coord_log(c, "worker %d lost (no message for %u ms): %d unit(s) returned, %d live worker(s)", w,
                  c->plan.liveness_ms, held, c->live);
        if (i < c->n_active && c->active[i] == (uint32_t)w) i++; /* still a ghost: it stayed in place */
    }
    return lost;
}

/* ---- Grants ----------------------------------------------------------------------------------- */

int32_t dt_coord_ask(dt_coord *c, int w, int join, uint64_t conn, int64_t now, dt_coord_grant *g, char *why,
                     size_t len) {
    memset(g, 0, sizeof *g);
    if (w < 0 || (uint32_t)w >= c->plan.max_workers)
        return refuse(c, DT_WIRE_E_BAD_VALUE, why, len, "worker %d cannot join: max_workers %u allows task indices "
                      "0..%u", w, c->plan.max_workers, c->plan.max_workers - 1);
    member_t *m = c->m[w];
    if (m && m->joined && join) { /* a restarted process: what its earlier life held goes back */
        int held = m->n_held;
        member_depart(c, w);
        coord_log(c, "worker %d started again: %d unit(s) of its earlier life returned", w, held);
        m = c->m[w];
    }
    if (!m || !m->joined) {
        if (member_join(c, w, now) != DT_WIRE_OK)
            return refuse(c, DT_WIRE_E_NOMEM, why, len, "out of memory for worker %d's record", w);
        m = c->m[w];
    }
    m->seen = now;
    if (finished(c)) return DT_WIRE_WORK_FINISHED;
    if ((uint32_t)m->n_held >= c->plan.max_held)
        return refuse(c, DT_WIRE_E_BUSY, why, len, "worker %d already holds %d unit(s), the most one worker may hold "
                      "(max_held %u): finish one first", w, m->n_held, c->plan.max_held);
    uint32_t u = pool_take(c, w);
    if (u == COORD_NONE) return DT_WIRE_WORK_WAIT;
    c->state[u] = UNIT_HELD;
    c->holder[u] = (uint32_t)w;
    c->conn[u] = conn;
    c->n_held++;
    m->held[m->n_held++] = u;
    c->totals.grants++;
    *g = (dt_coord_grant){.epoch = c->epoch, .unit = u, .mask = coord_full_mask(c, u) & ~c->claimed[u]};
    return DT_WIRE_OK;
}

/* ---- Claims ----------------------------------------------------------------------------------- */

/* Why a member may not claim batch b of unit u: DT_WIRE_OK when it may. */
static int32_t claim_check(dt_coord *c, int w, uint64_t conn, uint64_t epoch, uint64_t b, char *why, size_t len) {
    if (epoch != c->epoch)
        return refuse(c, DT_WIRE_E_BAD_VALUE, why, len, "claim for epoch %" PRIu64 ", the coordinator is %s %" PRIu64,
                      epoch, finished(c) ? "finished after epoch" : "in epoch", finished(c) ? c->epoch - 1 : c->epoch);
    if (b >= c->batches)
        return refuse(c, DT_WIRE_E_BAD_VALUE, why, len, "batch %" PRIu64 " is out of range: epoch %" PRIu64 " has %u "
                      "batch(es) (0..%u)", b, epoch, c->batches, c->batches - 1);
    uint32_t u = (uint32_t)(b / c->plan.unit_batches);
    uint64_t bit = UINT64_C(1) << (b % c->plan.unit_batches);
    if (c->done_mask[u] & bit)
        return refuse(c, DT_WIRE_E_BAD_VALUE, why, len, "batch %" PRIu64 " of epoch %" PRIu64 " is already counted "
                      "(unit %u): not again", b, epoch, u);
    if (c->holder[u] != (uint32_t)w) {
        char by[48] = "nobody: it is in the pool";
        if (c->holder[u] != COORD_NONE) snprintf(by, sizeof by, "worker %u", c->holder[u]);
        else if (c->state[u] == UNIT_FRESH) snprintf(by, sizeof by, "nobody: not granted yet");
        else if (c->state[u] == UNIT_ORPHAN) snprintf(by, sizeof by, "nobody: returned");
        return refuse(c, DT_WIRE_E_BAD_VALUE, why, len, "worker %d does not hold unit %u of epoch %" PRIu64 " (held by "
                      "%s)", w, u, epoch, by);
    }
    /* Bound to the connection it was granted on: under --auth=none anyone may say it is worker w,
     * and a forged claim that stood would block w's own for that step. */
    if (c->conn[u] != conn)
        return refuse(c, DT_WIRE_E_BAD_VALUE, why, len, "worker %d's unit %u was granted on another connection: a "
                      "claim counts only from the connection that asked for the unit", w, u);
    if (c->claimed[u] & bit)
        return refuse(c, DT_WIRE_E_BAD_VALUE, why, len, "batch %" PRIu64 " is claimed already, its gradient not yet "
                      "settled", b);
    return DT_WIRE_OK;
}

int32_t dt_coord_claim(dt_coord *c, int w, uint64_t conn, uint64_t epoch, uint64_t b, int64_t step, int64_t now,
                       char *why, size_t len) {
    member_t *m = w >= 0 && (uint32_t)w < c->plan.max_workers ? c->m[w] : NULL;
    if (!m || !m->joined)
        return refuse(c, DT_WIRE_E_BAD_VALUE, why, len, "worker %d is not a member (it never asked for work, or it "
                      "left or was lost): ask for work again", w);
    m->seen = now;
    /* The same claim again (a resend) stands; another batch for a step w claimed before replaces
     * that claim once it is checked, as the ps replaces a worker's gradient for a step with its
     * newer one: the earlier gradient was dropped (or w restarted), and refusing would wedge w,
     * which would drop this gradient and claim that step again, forever. */
    int same = -1;
    for (int i = 0; i < m->n_claims; i++)
        if (m->claims[i].step == step) same = i;
    if (same >= 0 && m->claims[same].batch == b && epoch == c->epoch && b < c->batches &&
        c->holder[b / c->plan.unit_batches] == (uint32_t)w && c->conn[b / c->plan.unit_batches] == conn)
        return DT_WIRE_OK;
    int32_t rc = claim_check(c, w, conn, epoch, b, why, len);
    if (rc != DT_WIRE_OK) return rc;
    if (c->plan.sync && step < c->next_step) {
        snprintf(why, len, "claim for step %" PRId64 ", ps 0 has applied it already (now at step %" PRId64 "): the "
                 "unit goes back", step, c->next_step);
        unit_take(c, w, b, step);
        return DT_WIRE_STALE;
    }
    if (same >= 0) {
        settle(c, w, same, 0);
        c->totals.replaced++;
    }
    if (m->n_claims >= DT_COORD_MAX_CLAIMS)
        return refuse(c, DT_WIRE_E_BUSY, why, len, "worker %d has %d claims not yet settled, the most one worker may "
                      "have: push first", w, m->n_claims);
    uint32_t u = (uint32_t)(b / c->plan.unit_batches);
    c->claimed[u] |= UINT64_C(1) << (b % c->plan.unit_batches);
    c->claims[u]++;
    m->claims[m->n_claims++] = (claim_t){.batch = b, .step = step};
    return DT_WIRE_OK;
}

/* Settles claim k of member w: its batch counts (commit) or is free again. A unit complete is
 * done (and the epoch, with its last unit); an orphan with no claims left goes to the pool; a
 * ghost with no claims left is freed. */
static void settle(dt_coord *c, int w, int k, int commit) {
    member_t *m = c->m[w];
    claim_t cl = m->claims[k];
    memmove(&m->claims[k], &m->claims[k + 1], (size_t)(m->n_claims - k - 1) * sizeof *m->claims);
    m->n_claims--;
    uint32_t u = (uint32_t)(cl.batch / c->plan.unit_batches);
    uint64_t bit = UINT64_C(1) << (cl.batch % c->plan.unit_batches);
    c->claims[u]--;
    if (commit) {
        c->done_mask[u] |= bit;
        c->totals.committed++;
    } else {
        c->claimed[u] &= ~bit;
        c->totals.voided++;
    }
    if (c->done_mask[u] == coord_full_mask(c, u)) {
        if (c->state[u] == UNIT_HELD) {
            held_remove(c->m[c->holder[u]], u);
            c->n_held--;
        } else if (c->state[u] == UNIT_ORPHAN) {
            c->n_orphan--;
        }
        c->state[u] = UNIT_DONE;
        c->holder[u] = COORD_NONE;
        if (++c->n_done == c->units) epoch_end(c);
    } else if (c->state[u] == UNIT_ORPHAN && !c->claims[u]) {
        c->n_orphan--;
        coord_pool_push(c, u);
    }
}

/* Settles member w's claims: those of `step` by commit, those before it void; take: a voided
 * claim's unit is taken from w (unit_take). */
static void settle_member(dt_coord *c, int w, int64_t step, int commit, int take) {
    for (int k = 0; c->m[w] && k < c->m[w]->n_claims;) {
        const claim_t *cl = &c->m[w]->claims[k];
        if (cl->step > step) {
            k++;
            continue;
        }
        const claim_t was = *cl;
        const int counts = commit && was.step == step;
        settle(c, w, k, counts);
        if (!counts && take) unit_take(c, w, was.batch, was.step);
    }
    if (c->m[w] && !c->m[w]->joined && !c->m[w]->n_claims) member_free(c, w);
}

void dt_coord_applied(dt_coord *c, int64_t step, const uint16_t *workers, int n) {
    for (int i = 0; i < n; i++)
        if (workers[i] < c->plan.max_workers && c->m[workers[i]]) settle_member(c, workers[i], step, 1, 1);
    for (int i = 0; i < c->n_active;) {
        uint32_t w = c->active[i];
        settle_member(c, (int)w, step, 0, 1);
        if (i < c->n_active && c->active[i] == w) i++; /* else freed: another index moved into slot i */
    }
    if (step + 1 > c->next_step) c->next_step = step + 1;
}

void dt_coord_pushed(dt_coord *c, int w, int64_t step) {
    if (w >= 0 && (uint32_t)w < c->plan.max_workers && c->m[w]) settle_member(c, w, step, 1, 0);
}

void dt_coord_reset_step(dt_coord *c, int64_t next) {
    for (int i = 0; i < c->n_active;) {
        uint32_t w = c->active[i];
        settle_member(c, (int)w, INT64_MAX, 0, 0);
        if (i < c->n_active && c->active[i] == w) i++;
    }
    c->next_step = next;
}

uint64_t dt_coord_counted(const dt_coord *c) {
    uint64_t n = 0;
    for (uint32_t u = 0; u < c->units; u++) n += (uint64_t)__builtin_popcountll(c->done_mask[u]);
    return n;
}
