/* The work coordinator (src/ps/coord.h) without sockets: grants, claims settled by step or push,
 * members joining, leaving and lost, the bounds and their refusals, the state's save and load; a
 * seeded randomised cluster (sync and async) in which every batch of every epoch enters the model
 * exactly once, and a restore mid-epoch after which the rest of the epoch is trained once. */
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "ps/coord.h"
#include "test.h"
#include "transport/wire.h"

#define MS INT64_C(1000)

static dt_coord_plan plan_of(uint64_t examples, uint32_t batch, uint32_t unit, int sync) {
    return (dt_coord_plan){.examples = examples, .seed = 7, .epochs = 0, .batch_size = batch, .unit_batches = unit,
                           .max_workers = 4, .max_held = 2, .liveness_ms = 100, .sync = sync};
}

static dt_coord *coord_of(dt_coord_plan p) {
    dt_coord *c = NULL;
    dt_error err = {0};
    int rc = dt_coord_new(&c, &p, NULL, &err);
    CHECK_MSG(rc == DT_OK, "%s", err.msg);
    return c;
}

static void test_units(void) {
    dt_coord *c = coord_of(plan_of(1000, 64, 4, 1)); /* 16 batches (the last of 40), 4 units */
    dt_coord_stats st;
    dt_coord_get_stats(c, &st);
    CHECK(st.batches == 16 && st.units == 4);
    uint64_t first;
    uint32_t n;
    dt_coord_unit_batches(c, 3, &first, &n);
    CHECK(first == 12 && n == 4);
    dt_coord_free(c);
    c = coord_of(plan_of(1000, 64, 5, 1)); /* 16 batches in units of 5: the last unit has 1 */
    dt_coord_unit_batches(c, 3, &first, &n);
    CHECK(first == 15 && n == 1);
    dt_coord_free(c);
    dt_coord_plan bad = plan_of(1000, 64, 65, 1);
    dt_error err = {0};
    CHECK(dt_coord_new(&c, &bad, NULL, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "batches per unit");
    bad = plan_of(UINT64_C(1) << 32, 1, 1, 1);
    CHECK(dt_coord_new(&c, &bad, NULL, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "examples");
    bad = plan_of(UINT32_MAX, 1, 64, 1); /* 2^26 units */
    CHECK(dt_coord_new(&c, &bad, NULL, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "at most 262144 units");
}

/* One worker trains a whole epoch in sync mode: grants, claims, commits, the epoch's end. */
static void test_sync_epoch(void) {
    dt_coord *c = coord_of(plan_of(512, 64, 4, 1)); /* 8 batches, 2 units */
    char why[256] = "";
    dt_coord_grant g;
    CHECK(dt_coord_ask(c, 1, 1, 0, 0, &g, why, sizeof why) == DT_WIRE_OK);
    CHECK(g.epoch == 0 && g.unit == 0 && g.mask == 0xf);
    int64_t step = 0;
    for (int b = 0; b < 4; b++, step++) {
        CHECK(dt_coord_claim(c, 1, 0, 0, (uint64_t)b, step, 0, why, sizeof why) == DT_WIRE_OK);
        uint16_t w = 1;
        dt_coord_applied(c, step, &w, 1);
    }
    dt_coord_stats st;
    dt_coord_get_stats(c, &st);
    CHECK(st.done == 1 && st.held == 0 && st.committed == 4);
    /* Unit 0 is done: claiming one of its batches again is refused, naming it. */
    CHECK(dt_coord_claim(c, 1, 0, 0, 2, step, 0, why, sizeof why) == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(why, "batch 2 of epoch 0 is already counted (unit 0)");
    CHECK(dt_coord_ask(c, 1, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_OK && g.unit == 1);
    /* A stale gradient: the claim for step t is voided when t is applied without it, and the unit
     * taken back; alone, the worker is granted it again (nobody else would take it). */
    CHECK(dt_coord_claim(c, 1, 0, 0, 4, step, 0, why, sizeof why) == DT_WIRE_OK);
    dt_coord_applied(c, step++, NULL, 0);
    dt_coord_get_stats(c, &st);
    CHECK(st.voided == 1 && st.committed == 4 && st.dropped == 1 && st.pool == 1 && st.held == 0);
    CHECK(dt_coord_claim(c, 1, 0, 0, 5, step, 0, why, sizeof why) == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(why, "does not hold unit 1 of epoch 0 (held by nobody: it is in the pool)");
    CHECK(dt_coord_ask(c, 1, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_OK && g.unit == 1 && g.mask == 0xf);
    /* A claim for a step applied already is STALE: the unit goes back again. */
    CHECK(dt_coord_claim(c, 1, 0, 0, 4, step - 1, 0, why, sizeof why) == DT_WIRE_STALE);
    CHECK_CONTAINS(why, "the unit goes back");
    dt_coord_get_stats(c, &st);
    CHECK(st.dropped == 2 && st.pool == 1);
    CHECK(dt_coord_ask(c, 1, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_OK && g.unit == 1);
    for (int b = 4; b < 8; b++, step++) {
        CHECK(dt_coord_claim(c, 1, 0, 0, (uint64_t)b, step, 0, why, sizeof why) == DT_WIRE_OK);
        uint16_t w = 1;
        dt_coord_applied(c, step, &w, 1);
    }
    dt_coord_get_stats(c, &st);
    CHECK(st.epoch == 1 && st.epochs_done == 1 && st.done == 0 && st.committed == 8);
    CHECK(dt_coord_ask(c, 1, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_OK && g.epoch == 1 && g.unit == 0);
    /* A late claim for the old epoch. */
    CHECK(dt_coord_claim(c, 1, 0, 0, 0, step, 0, why, sizeof why) == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(why, "claim for epoch 0, the coordinator is in epoch 1");
    dt_coord_free(c);
}

/* The refusals, each naming its bound. */
static void test_refusals(void) {
    dt_coord_plan p = plan_of(64 * 40, 64, 4, 1); /* 40 batches, 10 units */
    dt_coord *c = coord_of(p);
    char why[256] = "";
    dt_coord_grant g;
    CHECK(dt_coord_ask(c, 4, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(why, "worker 4 cannot join: max_workers 4 allows task indices 0..3");
    CHECK(dt_coord_claim(c, 2, 0, 0, 0, 0, 0, why, sizeof why) == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(why, "worker 2 is not a member");
    CHECK(dt_coord_ask(c, 0, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_OK && g.unit == 0);
    CHECK(dt_coord_ask(c, 0, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_OK && g.unit == 1);
    CHECK(dt_coord_ask(c, 0, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_E_BUSY);
    CHECK_CONTAINS(why, "already holds 2 unit(s), the most one worker may hold (max_held 2)");
    CHECK(dt_coord_ask(c, 1, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_OK && g.unit == 2);
    CHECK(dt_coord_claim(c, 1, 0, 0, 0, 0, 0, why, sizeof why) == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(why, "worker 1 does not hold unit 0 of epoch 0 (held by worker 0)");
    CHECK(dt_coord_claim(c, 1, 0, 0, 39, 0, 0, why, sizeof why) == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(why, "does not hold unit 9 of epoch 0 (held by nobody: not granted yet)");
    CHECK(dt_coord_claim(c, 1, 0, 0, 40, 0, 0, why, sizeof why) == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(why, "batch 40 is out of range: epoch 0 has 40 batch(es) (0..39)");
    CHECK(dt_coord_claim(c, 0, 0, 0, 0, 0, 0, why, sizeof why) == DT_WIRE_OK);
    CHECK(dt_coord_claim(c, 0, 0, 0, 0, 1, 0, why, sizeof why) == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(why, "batch 0 is claimed already");
    /* The same claim again stands; another batch for the same step replaces it (batch 0 is free). */
    CHECK(dt_coord_claim(c, 0, 0, 0, 0, 0, 0, why, sizeof why) == DT_WIRE_OK);
    CHECK(dt_coord_claim(c, 0, 0, 0, 1, 0, 0, why, sizeof why) == DT_WIRE_OK);
    CHECK(dt_coord_claim(c, 0, 0, 0, 0, 1, 0, why, sizeof why) == DT_WIRE_OK);
    for (int k = 2; k < 8; k++) CHECK(dt_coord_claim(c, 0, 0, 0, (uint64_t)k, k, 0, why, sizeof why) == DT_WIRE_OK);
    CHECK(dt_coord_claim(c, 0, 0, 0, 8, 8, 0, why, sizeof why) == DT_WIRE_E_BAD_VALUE); /* unit 2: worker 1's */
    dt_coord_stats st;
    dt_coord_get_stats(c, &st);
    CHECK(st.refused > 7);
    CHECK(dt_coord_check_plan(c, 3, 2560, 64, 8, why, sizeof why) == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(why, "seed 8, the work plan with 7");
    CHECK(dt_coord_check_plan(c, 3, 2559, 64, 7, why, sizeof why) == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(why, "2559 training examples, the work plan 2560");
    CHECK(dt_coord_check_plan(c, 3, 2560, 64, 7, why, sizeof why) == DT_WIRE_OK);
    dt_coord_free(c);
}

/* Forged claims (docs/elastic.md, "Claims"): a claim counts only from the connection the unit was
 * granted on. Before, a stranger's claim as worker 0 for the step after the current one stood, and
 * worker 0's own claim for that step was refused ("one batch per gradient"); it dropped the
 * gradient and claimed again, refused again, and the sync job waited for it forever. A claim its
 * worker makes again for a step it claimed (after a gradient it dropped) replaces that claim. */
static void test_claims_bound_to_connection(void) {
    dt_coord *c = coord_of(plan_of(512, 64, 4, 1)); /* sync: 8 batches, 2 units */
    char why[256] = "";
    dt_coord_grant g;
    CHECK(dt_coord_ask(c, 0, 1, 7, 0, &g, why, sizeof why) == DT_WIRE_OK && g.unit == 0);
    for (int64_t step = 1; step < 3; step++)
        for (uint64_t b = 0; b < 4; b++) {
            CHECK(dt_coord_claim(c, 0, 99, 0, b, step, 0, why, sizeof why) == DT_WIRE_E_BAD_VALUE);
            CHECK_CONTAINS(why, "worker 0's unit 0 was granted on another connection");
        }
    CHECK(dt_coord_claim(c, 0, 7, 0, 0, 1, 0, why, sizeof why) == DT_WIRE_OK);
    /* its gradient for step 1 dropped, worker 0 claims step 1 again with its next batch */
    CHECK(dt_coord_claim(c, 0, 7, 0, 1, 1, 0, why, sizeof why) == DT_WIRE_OK);
    uint16_t w = 0;
    dt_coord_applied(c, 1, &w, 1);
    dt_coord_stats st;
    dt_coord_get_stats(c, &st);
    CHECK_MSG(st.committed == 1 && st.replaced == 1 && st.voided == 1, "committed %llu replaced %llu voided %llu",
              (unsigned long long)st.committed, (unsigned long long)st.replaced, (unsigned long long)st.voided);
    CHECK(dt_coord_claim(c, 0, 7, 0, 0, 2, 0, why, sizeof why) == DT_WIRE_OK); /* batch 0 is free again */
    dt_coord_free(c);
}

/* The claims bound: a worker with 16 unsettled claims must push first. */
static void test_claims_bound(void) {
    dt_coord_plan p = plan_of(64 * 64, 64, 64, 0); /* one unit of 64 batches, async */
    dt_coord *c = coord_of(p);
    char why[256] = "";
    dt_coord_grant g;
    CHECK(dt_coord_ask(c, 0, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_OK && g.mask == UINT64_MAX);
    for (int k = 0; k < 16; k++) CHECK(dt_coord_claim(c, 0, 0, 0, (uint64_t)k, k, 0, why, sizeof why) == DT_WIRE_OK);
    CHECK(dt_coord_claim(c, 0, 0, 0, 16, 16, 0, why, sizeof why) == DT_WIRE_E_BUSY);
    CHECK_CONTAINS(why, "has 16 claims not yet settled, the most one worker may have");
    /* A push of step 3 commits its claim and voids the claims of steps 0..2 (their pushes never came). */
    dt_coord_pushed(c, 0, 3);
    dt_coord_stats st;
    dt_coord_get_stats(c, &st);
    CHECK(st.committed == 1 && st.voided == 3);
    CHECK(dt_coord_claim(c, 0, 0, 0, 0, 16, 0, why, sizeof why) == DT_WIRE_OK); /* batch 0 is free again */
    CHECK(dt_coord_claim(c, 0, 0, 0, 3, 17, 0, why, sizeof why) == DT_WIRE_E_BAD_VALUE);
    dt_coord_free(c);
}

/* Loss, leave, rejoin: units go back to the pool, after their claims settle; granted first. */
static void test_members(void) {
    dt_coord *c = coord_of(plan_of(64 * 16, 64, 4, 1)); /* 4 units */
    char why[256] = "";
    dt_coord_grant g;
    CHECK(dt_coord_ask(c, 0, 1, 0, 0, &g, why, sizeof why) == DT_WIRE_OK && g.unit == 0);
    CHECK(dt_coord_ask(c, 1, 1, 0, 0, &g, why, sizeof why) == DT_WIRE_OK && g.unit == 1);
    /* Worker 1 trains batch 4 (committed) and claims batch 5 for step 1, then dies at the barrier. */
    uint16_t both[2] = {0, 1};
    CHECK(dt_coord_claim(c, 1, 0, 0, 4, 0, 0, why, sizeof why) == DT_WIRE_OK);
    dt_coord_applied(c, 0, &both[1], 1);
    CHECK(dt_coord_claim(c, 1, 0, 0, 5, 1, 10 * MS, why, sizeof why) == DT_WIRE_OK);
    dt_coord_seen(c, 0, 150 * MS);
    CHECK(dt_coord_cron(c, 150 * MS) == 1); /* worker 1 silent 140 ms > 100 */
    dt_coord_stats st;
    dt_coord_get_stats(c, &st);
    CHECK(st.live == 1 && st.losses == 1 && st.orphaned == 1 && st.pool == 0 && st.returned == 1);
    /* Its unit waits for the claim: the next grant is a fresh unit. */
    CHECK(dt_coord_ask(c, 0, 0, 0, 150 * MS, &g, why, sizeof why) == DT_WIRE_OK && g.unit == 2);
    /* Step 1 is applied with its gradient (held before it died): batch 5 counts, unit 1 goes back. */
    dt_coord_applied(c, 1, both, 2);
    dt_coord_get_stats(c, &st);
    CHECK(st.orphaned == 0 && st.pool == 1 && st.committed == 2);
    CHECK(dt_coord_ask(c, 2, 0, 0, 150 * MS, &g, why, sizeof why) == DT_WIRE_OK);
    CHECK(g.unit == 1 && g.mask == 0xc); /* batches 6 and 7 are left */
    /* Worker 0 restarts (JOIN): units 0 and 2 go back. Then worker 2 leaves cleanly. */
    CHECK(dt_coord_ask(c, 0, 1, 0, 160 * MS, &g, why, sizeof why) == DT_WIRE_OK && g.unit == 0 && g.mask == 0xf);
    dt_coord_get_stats(c, &st);
    CHECK(st.pool == 1 && st.returned == 3 && st.joins == 4);
    dt_coord_leave(c, 2);
    dt_coord_get_stats(c, &st);
    CHECK(st.live == 1 && st.leaves == 1 && st.pool == 2);
    CHECK(dt_coord_claim(c, 2, 0, 0, 6, 2, 170 * MS, why, sizeof why) == DT_WIRE_E_BAD_VALUE);
    dt_coord_free(c);
}

/* A claim refused as a confused or hostile peer's, naming why. */
static void claim_refused(dt_coord *c, int w, uint64_t batch, int64_t step, const char *says) {
    char why[256] = "";
    CHECK_MSG(dt_coord_claim(c, w, 0, 0, batch, step, 0, why, sizeof why) == DT_WIRE_E_BAD_VALUE, "%s", says);
    CHECK_CONTAINS(why, says);
}

/* Backup workers (docs/elastic.md, "A dropped gradient"): a gradient left out of its step loses
 * the worker its unit, which is granted to any other member first (a fresh unit to the dropper);
 * with --staleness a unit taken with a later claim still unsettled waits for it. Every batch is
 * counted once; hostile claims (done twice, by a worker that does not hold it) are refused. */
static void test_dropped_gradient(void) {
    dt_coord *c = coord_of(plan_of(64 * 16, 64, 4, 1)); /* 16 batches, 4 units */
    char why[256] = "";
    dt_coord_grant g;
    for (int w = 0; w < 3; w++)
        CHECK(dt_coord_ask(c, w, 1, 0, 0, &g, why, sizeof why) == DT_WIRE_OK && g.unit == (uint32_t)w);
    uint16_t w01[2] = {0, 1}, w02[2] = {0, 2}, w0 = 0, w2 = 2;
    CHECK(dt_coord_claim(c, 0, 0, 0, 0, 0, 0, why, sizeof why) == DT_WIRE_OK);
    CHECK(dt_coord_claim(c, 1, 0, 0, 4, 0, 0, why, sizeof why) == DT_WIRE_OK);
    CHECK(dt_coord_claim(c, 2, 0, 0, 8, 0, 0, why, sizeof why) == DT_WIRE_OK);
    dt_coord_applied(c, 0, w01, 2); /* k = 2 of 3: worker 2's gradient is the backup's, dropped */
    dt_coord_stats st;
    dt_coord_get_stats(c, &st);
    CHECK(st.committed == 2 && st.voided == 1 && st.dropped == 1 && st.pool == 1 && st.held == 2);
    claim_refused(c, 2, 9, 1, "worker 2 does not hold unit 2 of epoch 0 (held by nobody: it is in the pool)");
    CHECK(dt_coord_ask(c, 2, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_OK && g.unit == 3); /* not its own unit 2 */
    /* Step 1: worker 1's gradient is dropped; unit 2 goes to worker 1 whole (batch 8 free again). */
    CHECK(dt_coord_claim(c, 0, 0, 0, 1, 1, 0, why, sizeof why) == DT_WIRE_OK);
    CHECK(dt_coord_claim(c, 1, 0, 0, 5, 1, 0, why, sizeof why) == DT_WIRE_OK);
    CHECK(dt_coord_claim(c, 2, 0, 0, 12, 1, 0, why, sizeof why) == DT_WIRE_OK);
    dt_coord_applied(c, 1, w02, 2);
    CHECK(dt_coord_ask(c, 1, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_OK && g.unit == 2 && g.mask == 0xf);
    /* Only unit 1, its own, is left to grant: worker 1 waits, worker 2 takes it (batch 4 counted). */
    CHECK(dt_coord_ask(c, 1, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_WORK_WAIT);
    CHECK(dt_coord_ask(c, 2, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_OK && g.unit == 1 && g.mask == 0xe);
    /* Hostile claims: a batch counted already, a unit another worker holds, a non-member. */
    claim_refused(c, 0, 0, 2, "batch 0 of epoch 0 is already counted");
    claim_refused(c, 1, 13, 2, "worker 1 does not hold unit 3 of epoch 0 (held by worker 2)");
    claim_refused(c, 3, 13, 2, "worker 3 is not a member");
    /* Staleness: worker 2 claims batches 13 and 14 for steps 2 and 3; step 2 goes without it, so
     * unit 3 is taken but waits for the claim of step 3, which counts when step 3 is applied. */
    CHECK(dt_coord_claim(c, 2, 0, 0, 13, 2, 0, why, sizeof why) == DT_WIRE_OK);
    CHECK(dt_coord_claim(c, 2, 0, 0, 14, 3, 0, why, sizeof why) == DT_WIRE_OK);
    dt_coord_applied(c, 2, &w0, 1);
    dt_coord_get_stats(c, &st);
    CHECK(st.dropped == 3 && st.orphaned == 1);
    dt_coord_applied(c, 3, &w2, 1);
    dt_coord_get_stats(c, &st);
    CHECK(st.orphaned == 0 && st.pool == 1 && st.committed == 5);
    CHECK(dt_coord_ask(c, 2, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_WORK_WAIT); /* unit 3 was taken from it */
    CHECK(dt_coord_ask(c, 0, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_OK && g.unit == 3 && g.mask == 0xa);
    dt_coord_free(c);
}

/* A fractional --epochs: 2.5 epochs of 10 batches train epochs 0 and 1 whole and the first 5
 * batches of epoch 2, each once; the state saved in the short epoch loads with its size; a plan
 * whose last epoch is not shorter is refused. */
static void test_fractional_epochs(void) {
    dt_coord_plan p = plan_of(64 * 10, 64, 4, 1); /* 10 batches: units of 4, 4 and 2 */
    p.epochs = 3, p.last_batches = 5;
    dt_coord *c = coord_of(p);
    char why[256] = "";
    dt_coord_grant g;
    uint16_t w0 = 0;
    int64_t step = 0;
    uint32_t counted[3] = {0};
    int32_t r;
    while ((r = dt_coord_ask(c, 0, 0, 0, 0, &g, why, sizeof why)) == DT_WIRE_OK) {
        dt_coord_stats st;
        dt_coord_get_stats(c, &st);
        if (g.epoch == 2) CHECK(st.units == 2 && st.batches == 5 && (g.unit == 0 ? g.mask == 0xf : g.mask == 0x1));
        for (uint64_t m = g.mask; m; m &= m - 1) {
            uint64_t b = g.unit * 4u + (uint64_t)__builtin_ctzll(m);
            CHECK(dt_coord_claim(c, 0, 0, g.epoch, b, step, 0, why, sizeof why) == DT_WIRE_OK);
            dt_coord_applied(c, step++, &w0, 1);
            if (g.epoch < 3) counted[g.epoch]++;
        }
        if (g.epoch == 2 && g.unit == 0) { /* the short epoch's state, saved and loaded */
            CHECK(dt_coord_claim(c, 0, 0, 2, 5, step, 0, why, sizeof why) == DT_WIRE_E_BAD_VALUE);
            CHECK_CONTAINS(why, "batch 5 is out of range: epoch 2 has 5 batch(es) (0..4)");
            size_t n = dt_coord_state_size(c);
            uint8_t *a = malloc(n);
            dt_coord_save(c, a);
            CHECK(n == 72 + 1 && memcmp(a, "DTCOORD2", 8) == 0);
            dt_coord *d = NULL;
            dt_error err = {0};
            CHECK_MSG(dt_coord_load(&d, a, n, NULL, &err) == DT_OK, "%s", err.msg);
            dt_coord_get_stats(d, &st);
            CHECK(st.epoch == 2 && st.units == 2 && st.batches == 5 && st.done == 1);
            dt_coord_free(d);
            free(a);
        }
    }
    CHECK(r == DT_WIRE_WORK_FINISHED);
    CHECK(counted[0] == 10 && counted[1] == 10 && counted[2] == 5);
    dt_coord_free(c);
    dt_error err = {0};
    p.last_batches = 10;
    CHECK(dt_coord_new(&c, &p, NULL, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "the last epoch's 10 batch(es) (must be 1..9");
    p.last_batches = 3, p.epochs = 0;
    CHECK(dt_coord_new(&c, &p, NULL, &err) == DT_EINVAL);
}

static void test_finished_and_wait(void) {
    dt_coord_plan p = plan_of(128, 64, 1, 0); /* 2 units of 1 batch, 1 epoch */
    p.epochs = 1;
    dt_coord *c = coord_of(p);
    char why[256];
    dt_coord_grant g;
    CHECK(dt_coord_ask(c, 0, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_OK);
    CHECK(dt_coord_ask(c, 1, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_OK);
    CHECK(dt_coord_ask(c, 2, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_WORK_WAIT);
    CHECK(dt_coord_claim(c, 0, 0, 0, 0, 5, 0, why, sizeof why) == DT_WIRE_OK);
    CHECK(dt_coord_claim(c, 1, 0, 0, 1, 9, 0, why, sizeof why) == DT_WIRE_OK);
    dt_coord_pushed(c, 0, 5);
    dt_coord_pushed(c, 1, 9);
    CHECK(dt_coord_ask(c, 2, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_WORK_FINISHED);
    dt_coord_stats st;
    dt_coord_get_stats(c, &st);
    CHECK(st.epoch == 1 && st.epochs_done == 1);
    dt_coord_free(c);
}

/* ---- The randomised cluster ------------------------------------------------------------------- */

#define SIM_WORKERS 6
#define SIM_EPOCHS 3

typedef struct {
    int alive, paused;        /* a paused worker is silent (stopped) but comes back */
    uint32_t unit[DT_COORD_MAX_HELD];
    uint64_t todo[DT_COORD_MAX_HELD]; /* its own view: batches of each unit it still has to train */
    uint64_t epoch[DT_COORD_MAX_HELD];
    int n;
    int64_t local;            /* async: its push counter */
} sim_worker;

typedef struct {
    dt_coord *c;
    int sync;
    uint64_t rng, draws;
    int64_t now, step;
    sim_worker w[SIM_WORKERS];
    uint32_t *applied;        /* [SIM_EPOCHS * batches]: gradients of each batch in the model */
    uint32_t batches, unit_batches;
    /* sync: the step in flight, its gradients, rounds it still waits */
    uint16_t in[SIM_WORKERS];
    uint64_t ep[SIM_WORKERS], ba[SIM_WORKERS];
    int n_in, defer;
} sim;

static uint64_t sim_rand(sim *s, uint64_t n) { return dt_hash64(s->rng, s->draws++) % n; }

/* The next batch worker w trains: the first of its first unit, or asks. 0 when it has none. */
static int sim_pick(sim *s, int i, uint64_t *epoch, uint64_t *batch) {
    sim_worker *w = &s->w[i];
    while (w->n && !w->todo[0]) { /* a unit fully trained is dropped */
        memmove(w->unit, w->unit + 1, (size_t)(w->n - 1) * sizeof *w->unit);
        memmove(w->todo, w->todo + 1, (size_t)(w->n - 1) * sizeof *w->todo);
        memmove(w->epoch, w->epoch + 1, (size_t)(w->n - 1) * sizeof *w->epoch);
        w->n--;
    }
    if (!w->n) {
        char why[256];
        dt_coord_grant g;
        int32_t r = dt_coord_ask(s->c, i, 0, 0, s->now, &g, why, sizeof why);
        if (r != DT_WIRE_OK) return 0;
        w->unit[0] = g.unit, w->todo[0] = g.mask, w->epoch[0] = g.epoch, w->n = 1;
    }
    int k = __builtin_ctzll(w->todo[0]);
    *epoch = w->epoch[0];
    *batch = (uint64_t)w->unit[0] * s->unit_batches + (uint64_t)k;
    return 1;
}

/* Its claim was refused as not its own: it forgets its units and asks again. */
static void sim_forget(sim *s, int i) { s->w[i].n = 0; }

static void sim_apply(sim *s, uint64_t epoch, uint64_t batch) {
    CHECK(epoch < SIM_EPOCHS);
    if (epoch < SIM_EPOCHS) s->applied[epoch * s->batches + batch]++;
}

/* Random membership events: a death, a pause, a clean leave, a start, a resume. */
static void sim_events(sim *s) {
    int i = (int)sim_rand(s, SIM_WORKERS);
    sim_worker *w = &s->w[i];
    uint64_t r = sim_rand(s, 100);
    if (w->alive && r < 3) {
        *w = (sim_worker){0}; /* SIGKILL: the coordinator finds out by its silence */
    } else if (w->alive && !w->paused && r < 5 && s->sync) {
        w->paused = 1;
    } else if (w->alive && r < 7) {
        dt_coord_leave(s->c, i);
        *w = (sim_worker){0};
    } else if (!w->alive && r < 30) {
        *w = (sim_worker){.alive = 1};
        char why[256];
        dt_coord_grant g;
        if (dt_coord_ask(s->c, i, 1, 0, s->now, &g, why, sizeof why) == DT_WIRE_OK)
            w->unit[0] = g.unit, w->todo[0] = g.mask, w->epoch[0] = g.epoch, w->n = 1;
    } else if (w->paused && r < 40) {
        w->paused = 0;
    }
}

/* One sync step: every running worker with a batch claims it and pushes (or dies before its
 * push, or after it); the step is applied with the gradients that came, at once or, one step in
 * ten, after the ps waited longer than the liveness timeout for a worker (meanwhile one killed at
 * the barrier is declared lost, with its gradient still held). */
static void sim_sync_gather(sim *s) {
    s->n_in = 0;
    for (int i = 0; i < SIM_WORKERS; i++) {
        sim_worker *w = &s->w[i];
        uint64_t e, b;
        if (!w->alive || w->paused || !sim_pick(s, i, &e, &b)) continue;
        char why[256];
        int32_t r = dt_coord_claim(s->c, i, 0, e, b, s->step, s->now, why, sizeof why);
        if (r == DT_WIRE_E_BAD_VALUE) sim_forget(s, i);
        if (r != DT_WIRE_OK) continue;
        uint64_t fate = sim_rand(s, 100);
        if (fate < 2) { /* killed before its push */
            *w = (sim_worker){0};
            continue;
        }
        if (fate < 6) { /* a backup's gradient, too late: stale; the worker drops its unit */
            sim_forget(s, i);
            continue;
        }
        s->in[s->n_in] = (uint16_t)i, s->ep[s->n_in] = e, s->ba[s->n_in] = b, s->n_in++;
        if (fate < 8) *w = (sim_worker){0}; /* killed at the barrier, its gradient held */
        else w->todo[0] &= ~(UINT64_C(1) << (b % s->unit_batches));
    }
    s->defer = sim_rand(s, 10) == 0 ? 20 : 0; /* 20 rounds of 5 ms > 60 ms */
}

static void sim_sync_step(sim *s) {
    if (s->defer) {
        s->defer--;
        return;
    }
    for (int k = 0; k < s->n_in; k++) sim_apply(s, s->ep[k], s->ba[k]);
    dt_coord_applied(s->c, s->step, s->in, s->n_in);
    s->step++;
    sim_sync_gather(s);
}

/* Async: one running worker claims its next batch and pushes it (or dies first). */
static void sim_async_push(sim *s) {
    int i = (int)sim_rand(s, SIM_WORKERS);
    sim_worker *w = &s->w[i];
    uint64_t e, b;
    if (!w->alive || !sim_pick(s, i, &e, &b)) return;
    char why[256];
    int64_t t = w->local++;
    int32_t r = dt_coord_claim(s->c, i, 0, e, b, t, s->now, why, sizeof why);
    if (r == DT_WIRE_E_BAD_VALUE) sim_forget(s, i);
    if (r != DT_WIRE_OK) return;
    if (sim_rand(s, 100) < 3) {
        *w = (sim_worker){0};
        return;
    }
    sim_apply(s, e, b);
    dt_coord_pushed(s->c, i, t);
    w->todo[0] &= ~(UINT64_C(1) << (b % s->unit_batches));
}

static void sim_round(sim *s) {
    s->now += 5 * MS;
    sim_events(s);
    if (s->sync) sim_sync_step(s);
    else
        for (int k = 0; k < SIM_WORKERS; k++) sim_async_push(s);
    for (int i = 0; i < SIM_WORKERS; i++)
        if (s->w[i].alive && !s->w[i].paused) dt_coord_seen(s->c, i, s->now);
    dt_coord_cron(s->c, s->now);
    /* Somebody runs: a cluster with nobody left gets a worker back. */
    int any = 0;
    for (int i = 0; i < SIM_WORKERS; i++) any |= s->w[i].alive && !s->w[i].paused;
    if (!any) s->w[0] = (sim_worker){.alive = 1};
}

/* Every batch of epochs [0, upto) entered the model exactly once. */
static int sim_exactly_once(const sim *s, uint64_t upto) {
    int bad = 0;
    for (uint64_t e = 0; e < upto; e++)
        for (uint32_t b = 0; b < s->batches; b++)
            if (s->applied[e * s->batches + b] != 1) {
                if (bad++ < 5)
                    fprintf(stderr, "epoch %" PRIu64 " batch %u applied %u times\n", e, b,
                            s->applied[e * s->batches + b]);
            }
    return bad == 0;
}

static void sim_init(sim *s, int sync, uint64_t seed, uint64_t examples, uint32_t unit) {
    memset(s, 0, sizeof *s);
    dt_coord_plan p = plan_of(examples, 32, unit, sync);
    p.max_workers = SIM_WORKERS, p.epochs = SIM_EPOCHS, p.liveness_ms = 60, p.max_held = 2;
    s->c = coord_of(p);
    s->sync = sync, s->rng = seed, s->unit_batches = unit;
    dt_coord_stats st;
    dt_coord_get_stats(s->c, &st);
    s->batches = st.batches;
    s->applied = calloc((size_t)SIM_EPOCHS * st.batches, sizeof *s->applied);
    for (int i = 0; i < 3; i++) s->w[i].alive = 1;
}

static void sim_run(sim *s, int64_t rounds) {
    dt_coord_stats st;
    for (int64_t r = 0; r < rounds; r++) {
        sim_round(s);
        dt_coord_get_stats(s->c, &st);
        if (st.epoch >= SIM_EPOCHS) break;
    }
}

static void test_random_cluster(void) {
    for (int sync = 0; sync <= 1; sync++)
        for (uint64_t seed = 1; seed <= 6; seed++) {
            sim s;
            sim_init(&s, sync, seed, 32 * 200 + 17, 1 + (uint32_t)(seed % 5)); /* 201 batches, the last of 17 */
            sim_run(&s, 200000);
            dt_coord_stats st;
            dt_coord_get_stats(s.c, &st);
            CHECK_MSG(st.epoch == SIM_EPOCHS, "sync %d seed %" PRIu64 ": stopped in epoch %" PRIu64, sync, seed,
                      st.epoch);
            CHECK_MSG(sim_exactly_once(&s, SIM_EPOCHS), "sync %d seed %" PRIu64, sync, seed);
            CHECK(st.committed == (uint64_t)SIM_EPOCHS * s.batches);
            CHECK_MSG(st.losses > 0 && st.leaves > 0 && st.joins > 3 && st.voided > 0 && st.returned > 0 &&
                      (!sync || st.dropped > 0),
                      "sync %d seed %" PRIu64 ": losses %" PRIu64 " leaves %" PRIu64 " joins %" PRIu64 " voided %" PRIu64,
                      sync, seed, st.losses, st.leaves, st.joins, st.voided);
            dt_coord_free(s.c);
            free(s.applied);
        }
}

/* A restore mid-epoch: the state saved between steps (as the chief fetches it before the model),
 * loaded into a new coordinator; every worker starts again; the rest of the epoch trains each
 * batch the state did not count exactly once, and none it counted. */
static void test_restore_mid_epoch(void) {
    for (int sync = 0; sync <= 1; sync++) {
        sim s;
        sim_init(&s, sync, 40 + (uint64_t)sync, 32 * 300, 3);
        dt_coord_stats st;
        do {
            sim_round(&s);
            dt_coord_get_stats(s.c, &st);
        } while (st.epoch < 1 || st.done < st.units / 2);
        size_t size = dt_coord_state_size(s.c);
        uint8_t *state = malloc(size);
        dt_coord_save(s.c, state);
        uint32_t *before = malloc((size_t)s.batches * sizeof *before);
        memcpy(before, s.applied + s.batches, (size_t)s.batches * sizeof *before); /* epoch 1 so far */
        dt_coord_free(s.c);
        dt_error err = {0};
        CHECK_MSG(dt_coord_load(&s.c, state, size, NULL, &err) == DT_OK, "%s", err.msg);
        /* The model goes back to the checkpoint: epoch 1's gradients are what the state counted. */
        uint64_t counted = 0;
        for (uint32_t b = 0; b < s.batches; b++) counted += before[b];
        dt_coord_get_stats(s.c, &st);
        CHECK(st.epoch == 1 && st.live == 0 && st.held == 0);
        memset(s.applied + s.batches, 0, (size_t)s.batches * sizeof *s.applied);
        for (int i = 0; i < SIM_WORKERS; i++) s.w[i] = (sim_worker){.alive = i < 3};
        s.step += 1000; /* the restored job goes on from the checkpoint's step (dt_coord_reset_step) */
        s.n_in = 0, s.defer = 0; /* the gradients held for the step in flight are gone with the old model */
        dt_coord_reset_step(s.c, s.step);
        sim_run(&s, 200000);
        dt_coord_get_stats(s.c, &st);
        CHECK(st.epoch == SIM_EPOCHS);
        /* The state counts exactly what was applied before it (sync: claims are settled between
         * steps; async: every push settled at once). After it: each batch once, none counted twice. */
        int bad = 0;
        for (uint32_t b = 0; b < s.batches; b++) bad += before[b] + s.applied[s.batches + b] != 1;
        CHECK_MSG(bad == 0, "sync %d: %d batch(es) of the restored epoch not trained exactly once", sync, bad);
        CHECK(counted > 0 && counted < s.batches);
        CHECK(sim_exactly_once(&s, 1));
        dt_coord_free(s.c);
        free(s.applied);
        free(state);
        free(before);
    }
}

/* ---- The state's bytes ------------------------------------------------------------------------ */

static uint8_t *saved(const dt_coord *c, size_t *size) {
    *size = dt_coord_state_size(c);
    uint8_t *b = malloc(*size);
    dt_coord_save(c, b);
    return b;
}

static void test_state_round_trip(void) {
    dt_coord_plan p = plan_of(64 * 30 + 5, 64, 4, 1); /* 31 batches, 8 units */
    p.epochs = 5;
    dt_coord *c = coord_of(p);
    char why[256];
    dt_coord_grant g;
    uint16_t w0 = 0;
    for (int k = 0; k < 3; k++) dt_coord_ask(c, k % 2, 0, 0, 0, &g, why, sizeof why); /* units 0, 1, 2 */
    for (int b = 0; b < 6; b++) { /* worker 0: unit 0 (done), half of unit 2 */
        uint64_t batch = b < 4 ? (uint64_t)b : (uint64_t)(8 + b - 4);
        CHECK(dt_coord_claim(c, 0, 0, 0, batch, b, 0, why, sizeof why) == DT_WIRE_OK);
        dt_coord_applied(c, b, &w0, 1);
    }
    size_t size;
    uint8_t *a = saved(c, &size);
    CHECK(size == 72 + 1 + 12); /* the done bit of unit 0, unit 2 partial */
    dt_coord *d = NULL;
    dt_error err = {0};
    CHECK_MSG(dt_coord_load(&d, a, size, NULL, &err) == DT_OK, "%s", err.msg);
    size_t size2;
    uint8_t *b = saved(d, &size2);
    CHECK(size2 == size && memcmp(a, b, size) == 0);
    /* The partial unit is granted first, with the batches left. */
    CHECK(dt_coord_ask(d, 3, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_OK && g.unit == 2 && g.mask == 0xc);
    CHECK(dt_coord_ask(d, 3, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_OK && g.unit == 1 && g.mask == 0xf);
    dt_coord_free(c), dt_coord_free(d), free(a), free(b);
}

/* Hostile states: each refused, naming what is wrong. */
static void test_state_refusals(void) {
    dt_coord_plan p = plan_of(64 * 26, 64, 4, 1); /* 26 batches, 7 units */
    p.epochs = 3;
    dt_coord *c = coord_of(p);
    char why[256];
    dt_coord_grant g;
    uint16_t w0 = 0;
    dt_coord_ask(c, 0, 0, 0, 0, &g, why, sizeof why);
    dt_coord_claim(c, 0, 0, 0, 1, 0, 0, why, sizeof why);
    dt_coord_applied(c, 0, &w0, 1);
    size_t size;
    uint8_t *a = saved(c, &size); /* 72 + 1 + 12: unit 0 partial (batch 1) */
    uint8_t *t = malloc(size + 1);
    struct {
        size_t off;
        uint8_t value;
        const char *says;
    } cases[] = {
        {0, 'X', "bad magic"},
        {60, 2, "unknown flags"},
        {44, 65, "batches per unit"},
        {64, 9, "9 units (byte 64), the plan makes 7"},
        {68, 9, "9 partial units"},
        {68, 2, "bytes, its counts make"},
        {72, 0x01, "unit 0 with batch mask"},            /* unit 0 done and partial */
        {72, 0x80, "padding bits after unit 6"},
        {73, 8, "partial entry 0 names unit 8"},
        {77, 0x0f, "batch mask 0xf"},                     /* all of the unit */
        {77, 0x00, "batch mask 0x0"},
        {24, 4, "epoch 4 beyond the 3 epoch(s)"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        memcpy(t, a, size);
        t[cases[k].off] = cases[k].value;
        dt_coord *d = NULL;
        dt_error err = {0};
        int rc = dt_coord_load(&d, t, size, NULL, &err);
        CHECK_MSG(rc == DT_EFORMAT && !d, "case %zu loaded", k);
        CHECK_CONTAINS(err.msg, cases[k].says);
    }
    dt_coord *d = NULL;
    dt_error err = {0};
    CHECK(dt_coord_load(&d, a, size - 1, NULL, &err) == DT_EFORMAT);
    CHECK(dt_coord_load(&d, a, 10, NULL, &err) == DT_EFORMAT);
    CHECK_CONTAINS(err.msg, "the header alone is 72");
    /* Version 1 (epochs in 64 bits) loads, its epochs' high half 0; version 2's last epoch must be
     * shorter than the others. */
    memcpy(t, a, size);
    memcpy(t, "DTCOORD1", 8);
    dt_coord *v1 = NULL;
    CHECK_MSG(dt_coord_load(&v1, t, size, NULL, &err) == DT_OK, "%s", err.msg);
    dt_coord_free(v1);
    t[36] = 1;
    CHECK(dt_coord_load(&v1, t, size, NULL, &err) == DT_EFORMAT);
    CHECK_CONTAINS(err.msg, "(version 1): 4294967299 epochs (byte 32; at most 4294967295)");
    memcpy(t, a, size);
    t[36] = 26;
    CHECK(dt_coord_load(&v1, t, size, NULL, &err) == DT_EFORMAT);
    CHECK_CONTAINS(err.msg, "the last epoch's 26 batch(es) (must be 1..25");
    dt_coord_free(c), free(a), free(t);
}

int main(void) {
    RUN(test_units);
    RUN(test_sync_epoch);
    RUN(test_refusals);
    RUN(test_claims_bound_to_connection);
    RUN(test_claims_bound);
    RUN(test_members);
    RUN(test_dropped_gradient);
    RUN(test_fractional_epochs);
    RUN(test_finished_and_wait);
    RUN(test_random_cluster);
    RUN(test_restore_mid_epoch);
    RUN(test_state_round_trip);
    RUN(test_state_refusals);
    return test_summary();
}
