/* A worker's loop over the units ps 0 grants (train/work_loop.h, docs/elastic.md). */
#include "train/work_loop.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "ps/coord.h"
#include "transport/wire.h"
#include "worker/remote.h"
#include "worker/work_client.h"

#define ASK_AGAIN_MS 20  /* WAIT: every unit of the epoch is granted; ask again this much later */
#define MAX_HELD 2       /* units one worker may hold: the one it trains and the next, asked for ahead */
#define LOG_REFUSED 3    /* refused claims logged one by one; later ones counted (the end's line) */

/* The request on the work client whose answer is still due (one at a time). */
enum { PENDING_NONE, PENDING_CLAIM, PENDING_ASK };

typedef struct {
    int held;
    uint64_t epoch, unit, mask; /* mask: its batches still to train */
} held_unit;

struct dt_work_loop {
    dt_work_config cfg;
    dt_ps_client *client;
    dt_work_data data;
    uint64_t nb;              /* batches per epoch */
    int joined;               /* asked once already (the first ask says JOIN) */
    int rejoin;               /* the next ask says JOIN: ps 0 may think this worker holds units it dropped */
    int sitting;              /* sync: DONE sent, steps go on without this worker */
    held_unit cur, next;      /* the unit in training; the next one, granted ahead */
    int asked_ahead;          /* for cur: asked ahead once already (not again: WAIT near an epoch's end) */
    int pending;              /* PENDING_*: the work client's request whose answer is due */
    int64_t claim_tag;        /* the step the claim in flight names */
    uint64_t units, ahead;    /* units granted; of them, granted ahead (no round trip at the boundary) */
    uint64_t refused;         /* claims refused (their gradients dropped) */
    uint64_t batch;           /* the batch of the claim in flight */
    int64_t next_index;       /* the loader's next batch (a seek only when another one is wanted) */
    int64_t last_epoch;       /* of the latest counted batch; -1: none yet */
    uint64_t reached;         /* batches of the run before the furthest one counted (epoch * nb + batch + 1),
                               * or before the first unit granted while none is */
    uint8_t *saved;           /* the coordinator state fetched for a checkpoint */
    size_t saved_len, saved_cap;
};

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int stopped(const dt_work_loop *w) { return w->cfg.stop && *w->cfg.stop; }

/* Chief: the checkpoint's coordinator state goes to ps 0, once checked against this run: a plan
 * cut otherwise would grant units this run's workers read as other batches. */
static int install_restored(dt_work_loop *w, const uint8_t *state, size_t len, dt_error *err) {
    const dt_work_config *c = &w->cfg;
    dt_coord *coord;
    int rc = dt_coord_load(&coord, state, len, NULL, err);
    if (rc) return dt_error_wrap(err, rc, "the checkpoint's work plan: ");
    const dt_coord_plan *p = dt_coord_get_plan(coord);
    dt_coord_stats st;
    dt_coord_get_stats(coord, &st);
    if (p->examples != c->examples || p->batch_size != c->batch_size || p->seed != c->seed ||
        p->unit_batches != c->unit_batches || p->sync != c->sync)
        rc = dt_errorf(err, DT_EINVAL, "the checkpoint's work plan is of %" PRIu64 " examples in batches of %u, seed %"
                       PRIu64 ", units of %u batch(es), %s; this run has %" PRIu64 ", %u, %" PRIu64 ", %u, %s (the "
                       "same data_path, batch_size, seed, unit_batches and issync to resume it)", p->examples,
                       p->batch_size, p->seed, p->unit_batches, p->sync ? "sync" : "async", c->examples, c->batch_size,
                       c->seed, c->unit_batches, c->sync ? "sync" : "async");
    dt_coord_free(coord);
    if (!rc) rc = dt_work_state_put(w->client, state, len, err);
    if (!rc)
        fprintf(c->log, "chief: work plan on ps 0 from the checkpoint: epoch %" PRIu64 ", %u of %u unit(s) done\n",
                st.epoch, st.done, st.units);
    return rc;
}

/* Chief: a fresh plan, epoch 0. */
static int install_fresh(dt_work_loop *w, dt_error *err) {
    const dt_work_config *c = &w->cfg;
    dt_coord_plan p = {.examples = c->examples, .seed = c->seed, .epochs = c->epochs, .batch_size = c->batch_size,
                       .unit_batches = c->unit_batches, .max_workers = c->max_workers, .max_held = MAX_HELD,
                       .liveness_ms = c->liveness_ms, .sync = c->sync, .last_batches = c->last_batches};
    dt_coord *coord;
    int rc = dt_coord_new(&coord, &p, NULL, err);
    if (rc) return dt_error_wrap(err, rc, "work plan: ");
    size_t n = dt_coord_state_size(coord);
    uint8_t *state = dt_malloc(n, "work plan", err);
    if (state) dt_coord_save(coord, state);
    dt_coord_stats st;
    dt_coord_get_stats(coord, &st);
    dt_coord_free(coord);
    if (!state) return DT_ENOMEM;
    rc = dt_work_state_put(w->client, state, n, err);
    free(state);
    if (!rc && c->last_batches)
        fprintf(c->log, "chief: work plan on ps 0: %" PRIu64 " epoch(s) of %u unit(s) of %u batch(es) of %u, the "
                "last one its first %u batch(es) of %" PRIu64 ", max_workers %u\n", c->epochs, st.units,
                c->unit_batches, c->batch_size, c->last_batches, w->nb, c->max_workers);
    else if (!rc)
        fprintf(c->log, "chief: work plan on ps 0: %" PRIu64 " epoch(s) of %u unit(s) of %u batch(es) of %u, "
                "max_workers %u\n", c->epochs, st.units, c->unit_batches, c->batch_size, c->max_workers);
    return rc;
}

/* Chief: ps 0 gets the plan of the checkpoint the model came from, or a fresh one, unless it has
 * one already (a restarted chief goes on with it). */
static int install_plan(dt_work_loop *w, dt_error *err) {
    const dt_work_config *c = &w->cfg;
    const void *have;
    size_t len;
    int64_t step;
    dt_error e = {0};
    int rc = dt_work_state_get(w->client, &have, &len, &step, &e);
    if (!rc) {
        fprintf(c->log, "chief: ps 0 already holds a work plan (%zu bytes at global step %lld): going on with it\n",
                len, (long long)step);
        return DT_OK;
    }
    if (dt_ps_client_last_refusal(w->client) != DT_WIRE_E_NOT_READY) {
        if (err) *err = e;
        return rc;
    }
    const uint8_t *state;
    if (c->restored && c->restored(c->user, &state, &len)) return install_restored(w, state, len, err);
    return install_fresh(w, err);
}

int dt_work_loop_open(dt_work_loop **out, const dt_work_config *cfg, dt_error *err) {
    *out = NULL;
    dt_work_loop *w = dt_calloc(1, sizeof *w, "work loop", err);
    if (!w) return DT_ENOMEM;
    w->cfg = *cfg;
    w->data = (dt_work_data){.examples = cfg->examples, .batch_size = cfg->batch_size, .seed = cfg->seed};
    w->nb = (uint64_t)dt_loader_batches_per_epoch(cfg->loader);
    w->next_index = -1;
    w->last_epoch = -1;
    /* A client of its own: a claim goes out while the previous step's exchange, overlapped with
     * this step's forward, holds the updater's. */
    int rc = dt_remote_open_client(cfg->updater, &w->client, err);
    if (!rc && cfg->chief) rc = install_plan(w, err);
    if (rc) {
        dt_work_loop_free(w);
        return rc;
    }
    *out = w;
    return DT_OK;
}

void dt_work_loop_free(dt_work_loop *w) {
    if (!w) return;
    dt_ps_client_close(w->client);
    free(w->saved);
    free(w);
}

static int drain(dt_work_loop *w, dt_error *err);

int dt_work_loop_fetch_state(dt_work_loop *w, int64_t *step, dt_error *err) {
    const void *st;
    size_t len;
    int rc = drain(w, err); /* an ask ahead's answer first: the client takes one request at a time */
    if (!rc) rc = dt_work_state_get(w->client, &st, &len, step, err);
    if (rc) return rc;
    if (len > w->saved_cap) { /* len: bounded by the frame limit of ps 0's socket */
        uint8_t *b = realloc(w->saved, len);
        if (!b) return dt_errorf(err, DT_ENOMEM, "out of memory for a %zu-byte work coordinator state", len);
        w->saved = b, w->saved_cap = len;
    }
    memcpy(w->saved, st, len);
    w->saved_len = len;
    return DT_OK;
}

void dt_work_loop_saved_state(const dt_work_loop *w, const uint8_t **state, size_t *len) {
    *state = w && w->saved_len ? w->saved : NULL;
    *len = w ? w->saved_len : 0;
}

/* The updater's exchange in flight ends (with --overlap it runs under the next forward); its
 * failures are handled there. */
static int settle(dt_work_loop *w, dt_net *net, int64_t *global_step, dt_error *err) {
    dt_updater *u = w->cfg.updater;
    return u->settle ? u->settle(u, net, global_step, err) : DT_OK;
}

/* Sync, no unit to train: DONE (WAITING) on every ps, so steps go on without this worker. Its last
 * gradient is in already (get_unit settled before asking): a push after the DONE would count the
 * worker back in, and steps would wait for it. */
static int sit_out(dt_work_loop *w, dt_error *err) {
    if (!w->cfg.sync || w->sitting) return DT_OK;
    int rc = dt_ps_client_done(w->client, 1, err);
    if (rc) return rc;
    w->sitting = 1;
    fprintf(w->cfg.log, "worker %d: no unit left in this epoch: sitting steps out until there is\n", w->cfg.task);
    return DT_OK;
}

/* A grant into *u, checked against this worker's epoch (units counts the grants). */
static int take_grant(dt_work_loop *w, const dt_work_grant *g, held_unit *u, dt_error *err) {
    uint64_t first = g->unit * w->cfg.unit_batches; /* no overflow once unit < nb (nb <= 2^24) */
    if (g->unit >= w->nb || first >= w->nb || (w->nb - first < 64 && (g->mask >> (w->nb - first)) != 0))
        return dt_errorf(err, DT_EPROTO, "ps 0 granted unit %" PRIu64 " (mask %#" PRIx64 ") beyond the epoch's %" PRIu64
                         " batches (the same batch_size and unit_batches everywhere?)", g->unit, g->mask, w->nb);
    *u = (held_unit){.held = 1, .epoch = g->epoch, .unit = g->unit, .mask = g->mask};
    if (w->last_epoch < 0 && g->epoch * w->nb + first > w->reached) w->reached = g->epoch * w->nb + first;
    w->units++;
    return DT_OK;
}

/* One ask: a unit (held), WAIT (nothing now), FINISHED, or, before the chief's plan, nothing yet.
 * ps 0 without a plan after the chief installed one restarted (a rollback re-initialised the
 * model): the chief installs the plan again, from the checkpoint the model came back from. */
static int ask(dt_work_loop *w, dt_net *net, int64_t *global_step, int64_t deadline_ms, int *finished,
               dt_error *err) {
    dt_work_grant g;
    dt_error e = {0};
    int rc = dt_work_ask(w->client, &w->data, !w->joined || w->rejoin, &g, &e);
    if (rc && w->cfg.chief && w->joined && dt_ps_client_last_refusal(w->client) == DT_WIRE_E_NOT_READY) {
        fprintf(w->cfg.log, "chief: ps 0 has lost the work plan (it restarted): installing it again\n");
        /* The model first: a restarted ps 0 lost its shard too (with --overlap no push may have
         * met it yet), and the plan to install is that of the checkpoint the model rolls back to. */
        if ((rc = dt_remote_resync(w->cfg.updater, net, global_step, err)) || (rc = install_plan(w, err))) return rc;
        rc = dt_work_ask(w->client, &w->data, 1, &g, &e);
    }
    if (rc) {
        /* No plan yet: the chief has not installed it (it starts later, or loads its data slower). */
        if (dt_ps_client_last_refusal(w->client) == DT_WIRE_E_NOT_READY && deadline_ms > 0) return DT_OK;
        if (err) *err = e;
        return dt_error_wrap(err, rc, "worker %d: asking ps 0 for work: ", w->cfg.task);
    }
    w->joined = 1, w->rejoin = 0;
    if (g.answer == DT_WORK_FINISHED) *finished = 1;
    if (g.answer == DT_WORK_WAIT) return sit_out(w, err);
    return g.answer == DT_WORK_GRANTED ? take_grant(w, &g, &w->cur, err) : DT_OK;
}

/* Asking ahead: under the last batch of its unit (its claim answered) a worker asks for the next
 * one, once per unit, and takes the answer before its next batch (ahead_take), so a unit's
 * boundary costs no round trip and, in sync mode, no settled exchange. As late as that so that
 * an epoch's last units are not hoarded by workers that would train them a unit later. */
static void ahead_send(dt_work_loop *w) {
    if (w->pending != PENDING_NONE || w->asked_ahead || w->next.held || !w->cur.held || w->rejoin ||
        __builtin_popcountll(w->cur.mask) != 1)
        return;
    w->asked_ahead = 1;
    dt_error e = {0};
    if (!dt_work_ask_send(w->client, &w->data, 0, &e)) w->pending = PENDING_ASK;
    /* not sent: the unit's end asks, and meets what failed */
}

/* The ask ahead's answer: a grant is the next unit. WAIT (every unit of the epoch is granted),
 * FINISHED or a refusal leave none: the unit's end asks again, and handles them (a refusal of
 * max_held: with --staleness ps 0 may still count a unit whose last claims have not settled). No
 * answer (ps 0 lost, or slow): what ps 0 may have granted is returned by the next ask's JOIN. */
static int ahead_take(dt_work_loop *w, dt_error *err) {
    if (w->pending != PENDING_ASK) return DT_OK;
    w->pending = PENDING_NONE;
    dt_work_grant g;
    dt_error e = {0};
    int rc = dt_work_ask_answer(w->client, &g, &e);
    if (rc == DT_ETIMEOUT || rc == DT_ENET) w->rejoin = 1;
    if (rc || g.answer != DT_WORK_GRANTED) return DT_OK;
    if ((rc = take_grant(w, &g, &w->next, err))) return rc;
    w->ahead++;
    return DT_OK;
}

/* Takes the answer still due on the work client, so it is free for another request. */
static int drain(dt_work_loop *w, dt_error *err) {
    if (w->pending == PENDING_ASK) return ahead_take(w, err);
    if (w->pending != PENDING_CLAIM) return DT_OK;
    w->pending = PENDING_NONE;
    int stale;
    dt_error e = {0};
    dt_work_claim_answer(w->client, &stale, &e); /* its gradient is never pushed: the claim is voided */
    return DT_OK;
}

/* Every unit dropped here goes back on ps 0 too: its next ask says JOIN. */
static void drop_all(dt_work_loop *w) {
    w->cur.held = w->next.held = 0;
    w->rejoin = 1;
}

/* ps 0 did not answer (rc: a timeout, a dropped connection): it may be restarting. The updater
 * waits for the ps tasks as for a failed push (--ps_timeout; the chief rolls the model back to the
 * newest checkpoint) and the parameters come back; the units are asked for anew (JOIN: if ps 0
 * lives on, what it granted this worker goes back). */
static int ps_lost(dt_work_loop *w, dt_net *net, int64_t *global_step, int rc, dt_error *err) {
    if (rc != DT_ETIMEOUT && rc != DT_ENET) return rc;
    drop_all(w);
    fprintf(w->cfg.log, "worker %d: ps 0 did not answer a work request: %s\n", w->cfg.task, err ? err->msg : "");
    return dt_remote_resync(w->cfg.updater, net, global_step, err);
}

/* Until a unit is held or every epoch is done: the one granted ahead, else an ask; a sync worker
 * back from sitting out pulls first. */
static int get_unit(dt_work_loop *w, dt_net *net, int64_t *global_step, int *finished, dt_error *err) {
    int64_t waited = 0;
    int rc = ahead_take(w, err);
    if (rc) return rc;
    if (!w->cur.held && w->next.held) w->cur = w->next, w->next.held = 0, w->asked_ahead = 0;
    /* Sync, with --overlap, and no unit granted ahead (an epoch's end): the unit's last step is
     * applied first (its exchange ends), so that an epoch's last unit is counted before this worker
     * asks, and it is not told WAIT and sent to sit steps out while its own last gradient is still
     * on the way. Before a JOIN too: it voids an async worker's claims, so its last push lands
     * (and counts) first. */
    rc = !w->cur.held && (w->cfg.sync || w->rejoin) ? settle(w, net, global_step, err) : DT_OK;
    if (rc) return rc;
    while (!w->cur.held && !*finished) {
        if (stopped(w)) return dt_errorf(err, DT_EINTR, "worker %d: stopped by a signal", w->cfg.task);
        rc = ask(w, net, global_step, w->cfg.wait_ms - waited, finished, err);
        if (rc && (rc = ps_lost(w, net, global_step, rc, err))) return rc;
        w->asked_ahead = 0;
        if (!w->cur.held && !*finished) {
            sleep_ms(ASK_AGAIN_MS);
            waited += ASK_AGAIN_MS;
        }
    }
    if (!w->cur.held || !w->sitting) return DT_OK;
    w->sitting = 0;
    fprintf(w->cfg.log, "worker %d: granted unit %" PRIu64 " of epoch %" PRIu64 ": training again\n", w->cfg.task,
            w->cur.unit, w->cur.epoch);
    return dt_remote_resync(w->cfg.updater, net, global_step, err);
}

/* The claim goes out before the forward when the step its gradient will be for is known already
 * (sync: the step the exchange in flight ends at), so its round trip hides under the forward;
 * dt_work_loop_claim checks the step once that exchange has ended. Else (async with --overlap),
 * or if it cannot be sent, it goes after the forward. */
static void claim_early(dt_work_loop *w, int64_t global_step) {
    int64_t tag = dt_remote_expected_tag(w->cfg.updater, global_step);
    dt_error e = {0};
    if (tag < 0 || dt_work_claim_send(w->client, w->cur.epoch, w->batch, tag, &e)) return;
    w->pending = PENDING_CLAIM, w->claim_tag = tag;
}

int dt_work_loop_next(dt_work_loop *w, dt_net *net, int64_t *global_step, dt_batch *b, int *finished, dt_error *err) {
    *finished = 0;
    int rc = get_unit(w, net, global_step, finished, err);
    if (rc || *finished) return rc;
    int bit = __builtin_ctzll(w->cur.mask);
    w->batch = w->cur.unit * w->cfg.unit_batches + (uint64_t)bit;
    int64_t index = (int64_t)(w->cur.epoch * w->nb + w->batch);
    if (index != w->next_index && (rc = dt_loader_seek(w->cfg.loader, index, err))) return rc;
    if ((rc = dt_loader_next(w->cfg.loader, b, err))) return rc;
    w->next_index = index + 1;
    claim_early(w, *global_step);
    return DT_OK;
}

/* The claim's answer, sending it first if it did not go before the forward. */
static int claim_answer(dt_work_loop *w, int64_t tag, int *stale, dt_error *e) {
    int rc = DT_OK;
    if (w->pending == PENDING_CLAIM) w->pending = PENDING_NONE;
    else if (!(rc = dt_work_claim_send(w->client, w->cur.epoch, w->batch, tag, e))) w->claim_tag = tag;
    return rc ? rc : dt_work_claim_answer(w->client, stale, e);
}

int dt_work_loop_claim(dt_work_loop *w, dt_net *net, int64_t *global_step, int *push, dt_error *err) {
    int stale = 0;
    dt_error e = {0};
    *push = 0;
    int rc = settle(w, net, global_step, err);
    if (rc) return rc;
    int64_t tag = dt_remote_next_tag(w->cfg.updater, *global_step);
    rc = claim_answer(w, tag, &stale, &e);
    int why = rc == DT_EPROTO ? dt_ps_client_last_refusal(w->client) : 0;
    if (why == DT_WIRE_E_BAD_VALUE || why == DT_WIRE_E_NOT_READY) {
        /* Not this worker's any more (it was lost meanwhile, its units handed on), or ps 0 lost the
         * plan (it restarted; the chief installs it again): ask anew. */
        if (++w->refused <= LOG_REFUSED)
            fprintf(w->cfg.log, "worker %d: claim refused: %s: dropping the gradient and unit %" PRIu64 "%s\n",
                    w->cfg.task, e.msg, w->cur.unit, w->refused == LOG_REFUSED ? "; further ones are counted" : "");
        drop_all(w);
        return DT_OK;
    }
    if (rc) {
        if (err) *err = e;
        return ps_lost(w, net, global_step, rc, err);
    }
    if (!stale && w->claim_tag != tag) {
        /* Claimed before the forward for a step the exchange did not end at (the cluster moved on
         * without this worker, or a ps outage rolled it back): the gradient is dropped, and ps 0
         * takes the claim's unit back as a restarted worker's (JOIN), waiting for the claim. */
        fprintf(w->cfg.log, "worker %d: batch %" PRIu64 " was claimed for step %" PRId64 ", its gradient is for step %"
                PRId64 ": dropping it and asking anew\n", w->cfg.task, w->batch, w->claim_tag, tag);
        drop_all(w);
        return DT_OK;
    }
    if (!stale) {
        *push = 1;
        ahead_send(w);
        return DT_OK;
    }
    /* Sync: its step went by (this worker was slow, or just back): ps 0 took the unit back, to
     * grant it to another worker first; this one pulls the parameters and goes on with the next
     * unit (one granted ahead, or asked for). */
    w->cur.held = 0;
    return dt_remote_resync(w->cfg.updater, net, global_step, err);
}

void dt_work_loop_end(dt_work_loop *w) {
    if (!w) return;
    drain(w, NULL);
    if (w->units)
        fprintf(w->cfg.log, "worker %d: %" PRIu64 " unit(s) granted, %" PRIu64 " of them asked for ahead (no round "
                "trip at the unit's start); claims refused: %" PRIu64 "\n", w->cfg.task, w->units, w->ahead,
                w->refused);
}

int dt_work_loop_pushed(dt_work_loop *w, const dt_batch *b, int counted) {
    if (!counted) { /* stale: the claim was voided and the unit is ps 0's again (sync) */
        if (w->cfg.sync) w->cur.held = 0;
        return 0;
    }
    w->cur.mask &= ~(1ull << (w->batch - w->cur.unit * w->cfg.unit_batches));
    if (!w->cur.mask) w->cur.held = 0;
    if (w->cfg.trained) {
        fprintf(w->cfg.trained, "epoch %" PRIu64 " batch %" PRIu64 " ids", w->cur.epoch, w->batch);
        for (int i = 0; i < b->n; i++) fprintf(w->cfg.trained, " %zu", b->ids[i]);
        fputc('\n', w->cfg.trained);
        fflush(w->cfg.trained);
    }
    int began = w->last_epoch >= 0 && (int64_t)w->cur.epoch > w->last_epoch;
    w->last_epoch = (int64_t)w->cur.epoch;
    if (w->cur.epoch * w->nb + w->batch + 1 > w->reached) w->reached = w->cur.epoch * w->nb + w->batch + 1;
    return began;
}

double dt_work_loop_epochs(const dt_work_loop *w) { return w->nb ? (double)w->reached / (double)w->nb : 0.0; }
