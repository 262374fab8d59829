#include "worker/remote.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/assert.h"
#include "core/clock.h"
#include "core/error.h"
#include "update/decay_mask.h"
#include "transport/wire.h"
#include "worker/overlap.h"
#include "worker/ps_client.h"
#include "worker/sparse_client.h"
#include "worker/sparse_prefetch.h"

typedef struct {
    dt_updater base;              /* first, so a dt_updater * is a remote * */
    dt_remote_config cfg;
    dt_ps_client *client;
    dt_ps_client_config cc;       /* the client's configuration (its pointers are this updater's) */
    int n_ps;
    float **grads;                /* [n_ps] gradient shards, sent zero-copy */
    const float **views;          /* [n_ps] received parameter shards (valid until the next call) */
    int64_t *steps;               /* [n_ps] the step each shard belongs to */
    int64_t *steps_max;           /* [n_ps] a fetched shard's chunk furthest ahead */
    char **endpoints;
    int sync;
    int64_t iter;                 /* sync: the step this worker's next gradient is for */
    /* Where the time goes: compute (between updates, including the debug delay), exchange (push
     * and pull), and within it waiting at the barrier (reported by the ps tasks). */
    double t_last, compute_s, exchange_s, wait_s;
    int64_t updates, stale, stale_ref, recoveries;
    /* Batch-norm state (docs/batchnorm.md): views the forward pass updates. Their "gradient" is
     * the change since the values came from the ps tasks, which add it (sync: the mean). */
    int n_state;
    int *state_views;             /* [n_state] view indices */
    float *state_base;            /* their values as last received, back to back */
    /* --overlap: the exchange streams under backward and the next forward (worker/overlap.h);
     * NULL: push and pull between them. */
    dt_overlap *ov;
    dt_net *net;                  /* whose hooks drive it */
    /* OV_NONE --first gradient range of a step--> OV_FILLING (backward reports ranges) --apply-->
     * OV_FLYING (every chunk handed over; parameters land under the next forward) --the next
     * step's first range, a checkpoint, the end (settle)--> OV_NONE */
    int ov_phase;
    int64_t ov_tag;               /* the step the gradient in the exchange is for */
    int ov_rc;                    /* a failure met in a hook, reported by the next apply */
    dt_error ov_err;
    int64_t gstep;                /* the global step the last apply returned (async: the next tag) */
    double blocked_s;             /* since the last apply: hooks waiting for the exchange */
    double rows_wait_s;           /* training forwards waiting for their sparse rows, in all */
    dt_sparse_client *sparse;     /* a compact net's tables on the ps tasks; NULL: none */
    dt_sparse_stats sparse0;      /* its counts, and the client's sparse bytes, when training began */
    uint64_t sparse_tx0, sparse_rx0;
    dt_sparse_prefetch *prefetch; /* the next batch's rows under this step's compute; NULL: off */
    dt_sparse_stats prefetch0;    /* its pulls' counts, its connection's bytes, its own, at that time */
    uint64_t prefetch_tx0, prefetch_rx0;
    dt_prefetch_stats prefetched0;
    int64_t created_us;           /* the chief's end waits for named workers from here (wait_workers) */
} remote;

enum { OV_NONE, OV_FILLING, OV_FLYING };

/* The received values of the state views within flat floats [lo, hi), for the change pushed with
 * the next gradient (with --overlap a layer's values arrive just before its forward). */
static void remember_state(remote *r, const float *params, size_t lo, size_t hi) {
    const dt_param_view *v = r->cfg.placement->views;
    float *b = r->state_base;
    for (int k = 0; k < r->n_state; k++) {
        const dt_param_view *sv = &v[r->state_views[k]];
        if (sv->offset >= lo && sv->offset + sv->count <= hi) memcpy(b, params + sv->offset, sv->count * sizeof *b);
        b += sv->count;
    }
}

/* grads of the state views within [lo, hi) = their change since remember_state (with --overlap,
 * written after the layer's backward, which zeroes them, and before its range is pushed) */
static void state_changes(const remote *r, float *grads, const float *params, size_t lo, size_t hi) {
    const dt_param_view *v = r->cfg.placement->views;
    const float *b = r->state_base;
    for (int k = 0; k < r->n_state; k++) {
        const dt_param_view *sv = &v[r->state_views[k]];
        if (sv->offset >= lo && sv->offset + sv->count <= hi)
            for (size_t i = 0; i < sv->count; i++) grads[sv->offset + i] = params[sv->offset + i] - b[i];
        b += sv->count;
    }
}

/* Names float `index` of ps shard `ps` after its variable ("conv2/kernel[123]"), for messages. */
static void name_shard_float(void *user, int ps, size_t index, char *out, size_t cap) {
    const dt_placement *pl = user;
    for (int k = pl->ps_begin[ps]; k < pl->ps_begin[ps + 1]; k++) {
        const dt_slice *sl = &pl->slices[pl->ps_slices[k]];
        if (index < sl->shard_offset || index - sl->shard_offset >= sl->count) continue;
        const dt_param_view *v = &pl->views[sl->view];
        snprintf(out, cap, "%s[%zu]", v->name, sl->offset + (index - sl->shard_offset) - v->offset);
        return;
    }
    snprintf(out, cap, "float %zu of its shard", index);
}

/* The gradient buffers are written (a gradient, or shards to INIT or fetch) only while the ps
 * client holds none of them: after every push call, unless it failed with DT_EIO (ps_client.h). */
static int grads_writable(remote *r, dt_error *err) {
    if (!dt_ps_client_buffers_held(r->client)) return DT_OK;
    return dt_errorf(err, DT_EIO, "worker %d: the transport still holds the gradient buffers of a failed push; they "
                     "are not reused", r->cfg.cluster->task_index);
}

/* The received shards become the net's parameters; ps 0's step is the cluster's global step. */
static void views_into_net(remote *r, dt_net *net, int64_t *global_step) {
    for (int p = 0; p < r->n_ps; p++) dt_placement_scatter(r->cfg.placement, p, dt_net_params(net), r->views[p]);
    remember_state(r, dt_net_params(net), 0, SIZE_MAX);
    *global_step = r->gstep = r->steps[0];
}

/* The net's parameters as they are now become what the ps tasks hold, after pulling them. */
static int resume_from_ps(remote *r, dt_net *net, int64_t *global_step, dt_error *err) {
    int rc = dt_ps_client_pull_resume(r->client, r->views, r->steps, err);
    if (rc) return rc;
    if (r->sparse) { /* the tables start again at the chief's SPARSE_INIT, which follows its INIT */
        dt_sparse_reset(r->sparse);
        dt_sparse_prefetch_cancel(r->prefetch); /* rows of the tables before it */
        if (!r->cfg.cluster->is_chief && (rc = dt_sparse_wait_declared(r->sparse, r->cfg.connect_timeout_ms, err)))
            return rc;
        /* the log's counts are training's: from here on (the declaration and its wait left out) */
        r->sparse0 = *dt_sparse_get_stats(r->sparse);
        r->sparse_tx0 = dt_ps_client_get_stats(r->client)->sparse_tx_bytes;
        r->sparse_rx0 = dt_ps_client_get_stats(r->client)->sparse_rx_bytes;
        if (r->prefetch) {
            r->prefetch0 = *dt_sparse_prefetch_pull_stats(r->prefetch);
            r->prefetch_tx0 = dt_sparse_prefetch_client_stats(r->prefetch)->sparse_tx_bytes;
            r->prefetch_rx0 = dt_sparse_prefetch_client_stats(r->prefetch)->sparse_rx_bytes;
            r->prefetched0 = *dt_sparse_prefetch_stats(r->prefetch);
        }
    }
    views_into_net(r, net, global_step);
    r->iter = *global_step;
    r->t_last = dt_seconds();
    return DT_OK;
}

/* Gathers flat-layout optimizer state [slots * n] into per-shard slot-major buffers (*out[p] of
 * slots * shard_count[p] floats, one allocation), as INIT and STATE carry it. */
static float **shard_buffers(const dt_placement *pl, int slots, dt_error *err) {
    size_t total = 0;
    for (int p = 0; p < pl->n_ps; p++) total += pl->shard_count[p] * (size_t)slots;
    float **b = dt_calloc((size_t)pl->n_ps + 1, sizeof *b, "shard state pointers", err);
    if (!b) return NULL;
    if (!(b[pl->n_ps] = dt_alloc_floats(total ? total : 1, "shard optimizer state", err))) {
        free(b);
        return NULL;
    }
    size_t off = 0;
    for (int p = 0; p < pl->n_ps; p++) {
        b[p] = b[pl->n_ps] + off;
        off += pl->shard_count[p] * (size_t)slots;
    }
    return b;
}

static void free_shard_buffers(const dt_placement *pl, float **b) {
    if (b) free(b[pl->n_ps]);
    free(b);
}

/* Chief: every ps gets its shard of the net's parameters and of state (flat layout; NULL: zeros)
 * at global step `step`, then the sparse tables are declared at that step and, from a checkpoint
 * (from_ckpt), given its rows (cfg.tables). The gradient buffers are free between steps: they carry
 * the shards. */
static int init_shards(remote *r, dt_net *net, const float *state, int64_t step, int from_ckpt, dt_error *err) {
    const dt_placement *pl = r->cfg.placement;
    size_t n = dt_net_param_count(net);
    int slots = state ? dt_opt_slots(&r->cfg.opt) : 0;
    int rc = grads_writable(r, err);
    if (rc) return rc;
    float **st = slots ? shard_buffers(pl, slots, err) : NULL;
    if (slots && !st) return DT_ENOMEM;
    for (int p = 0; p < r->n_ps; p++) {
        dt_placement_gather(pl, p, r->grads[p], dt_net_params(net));
        for (int k = 0; k < slots; k++)
            dt_placement_gather(pl, p, st[p] + (size_t)k * pl->shard_count[p], state + (size_t)k * n);
    }
    /* Each shard's decay mask (the ps applies weight decay where it says), when weight decay is on. */
    uint8_t **decay = NULL;
    if (r->cfg.opt.weight_decay != 0) {
        size_t total = 0;
        for (int p = 0; p < r->n_ps; p++) total += pl->shard_count[p];
        if (!(decay = dt_calloc((size_t)r->n_ps + 1, sizeof *decay, "decay masks", err)) ||
            !(decay[r->n_ps] = dt_calloc(total ? total : 1, 1, "decay masks", err))) {
            free(decay);
            free_shard_buffers(pl, st);
            return DT_ENOMEM;
        }
        for (size_t p = 0, off = 0; p < (size_t)r->n_ps; off += pl->shard_count[p], p++) {
            decay[p] = decay[r->n_ps] + off;
            dt_decay_mask_shard(decay[p], &r->cfg.opt, pl, (int)p);
        }
    }
    rc = dt_ps_client_init(r->client, &r->cfg.opt, (const float *const *)r->grads, (const float *const *)st,
                           (const uint8_t *const *)decay, step, err);
    /* an INIT drops the sparse tables: declared again after each one, at its step (LazyAdam's bias
     * correction counts the tables' updates: a checkpoint's tables go on from its step) */
    const int importing = r->sparse && from_ckpt && r->cfg.tables;
    if (!rc && r->sparse) rc = dt_sparse_declare(r->sparse, step, importing, err);
    /* a worker's pull waits at its ps until the rows are in: no step on the tables' initial rows */
    if (!rc && importing) rc = r->cfg.tables(r->cfg.user, r->sparse, err);
    if (!rc && importing) rc = dt_sparse_import_end(r->sparse, err);
    if (decay) free(decay[r->n_ps]);
    free(decay);
    free_shard_buffers(pl, st);
    return rc;
}

/* Every ps initialised, none of them waiting for a chief's import of the tables to end (a chief that
 * died during it: the one starting now initialises them again). */
static int all_initialised(remote *r) {
    int ready = 1;
    for (int p = 0; p < r->n_ps; p++)
        ready &= dt_ps_client_shard(r->client, p)->initialised && !dt_ps_client_shard(r->client, p)->importing;
    return ready;
}

static int attach(remote *r, dt_net *net, dt_error *err);
static int remote_settle(dt_updater *u, dt_net *net, int64_t *global_step, dt_error *err);

static int remote_start(dt_updater *u, dt_net *net, uint64_t seed, int64_t *global_step, dt_error *err) {
    remote *r = (remote *)u;
    int rc = attach(r, net, err);
    if (rc) return rc;
    r->cfg.seed = seed; /* a rollback without a checkpoint starts over from it */
    if (r->cfg.cluster->is_chief) {
        if (!all_initialised(r)) {
            /* First start of the cluster: the chief alone initialises (TF's Supervisor). */
            dt_net_init_params(net, seed);
            if ((rc = init_shards(r, net, NULL, 0, 0, err))) return rc;
            if (r->cfg.log) fprintf(r->cfg.log, "chief: initialised %d ps task(s) from seed %llu\n", r->n_ps,
                                    (unsigned long long)seed);
        }
    } else {
        if ((rc = dt_ps_client_wait_ready(r->client, r->cfg.connect_timeout_ms, err)))
            return dt_error_wrap(err, rc, "waiting for the chief to initialise the model: ");
    }
    return resume_from_ps(r, net, global_step, err);
}

static int remote_restore(dt_updater *u, dt_net *net, const float *state, int64_t step, int64_t *global_step,
                          dt_error *err) {
    remote *r = (remote *)u;
    int rc = attach(r, net, err);
    if (rc) return rc;
    int ready = all_initialised(r);
    if (!r->cfg.cluster->is_chief || ready) {
        /* The ps tasks outlived the chief: what they hold is newer than any checkpoint. */
        if (ready && r->cfg.log)
            fprintf(r->cfg.log, "chief: the ps tasks already hold the model (step %lld); not restoring step %lld\n",
                    (long long)dt_ps_client_shard(r->client, 0)->global_step, (long long)step);
        return remote_start(u, net, r->cfg.seed, global_step, err);
    }
    rc = init_shards(r, net, state, step, 1, err);
    if (rc) return rc;
    if (r->cfg.log) fprintf(r->cfg.log, "chief: gave %d ps task(s) their shards back at global step %lld\n", r->n_ps,
                            (long long)step);
    return resume_from_ps(r, net, global_step, err);
}

/* Chief, after a ps came back uninitialised (or the shards disagree): every shard goes back to the
 * newest checkpoint together, the survivors too, so the model is one step's again. */
static int rollback(remote *r, dt_net *net, dt_error *err) {
    const float *params = NULL, *state = NULL;
    int64_t step = 0;
    int have = r->cfg.reload ? r->cfg.reload(r->cfg.user, &params, &state, &step, err) : 0;
    if (have < 0) return have;
    if (have) memcpy(dt_net_params(net), params, dt_net_param_count(net) * sizeof(float));
    else dt_net_init_params(net, r->cfg.seed);
    int rc = init_shards(r, net, have ? state : NULL, have ? step : 0, have, err);
    if (rc) return rc;
    if (r->cfg.log) {
        if (have)
            fprintf(r->cfg.log, "chief: a ps task lost its shard: every ps rolled back to the newest checkpoint "
                    "(global step %lld, generation %d)\n", (long long)step, dt_ps_client_shard(r->client, 0)->generation);
        else
            fprintf(r->cfg.log, "chief: a ps task lost its shard and there is no checkpoint (--logdir): the model "
                    "starts over from the seed at step 0\n");
        fflush(r->cfg.log);
    }
    return DT_OK;
}

/* Whether a failed exchange may be a ps that is down or restarting, worth waiting for: no reply,
 * or a refusal that a restart or a rollback explains, or a busy ps (ERROR 106: its memory budget
 * or its table of deferred PULLs full, maybe of strangers' requests; asking again is safe, since a
 * PULL changes nothing and the step goes on from what the ps tasks hold). */
static int recoverable(remote *r, int rc) {
    if (rc == DT_ETIMEOUT || rc == DT_ENET) return 1;
    int why = dt_ps_client_last_refusal(r->client);
    return rc == DT_EPROTO && (why == DT_WIRE_E_NOT_READY || why == DT_WIRE_E_RESYNC || why == DT_WIRE_E_GONE ||
                               why == DT_WIRE_E_BUSY);
}

/* A ps is lost (cause): wait with backoff, up to --ps_timeout, until every ps answers and holds
 * the same initialisation (the chief makes it so from the newest checkpoint), then resume from
 * what they hold. The step in flight is lost; the loop goes on from the ps tasks' step. */
static int recover(remote *r, dt_net *net, int64_t *global_step, dt_error *err) {
    const int task = r->cfg.cluster->task_index;
    int64_t start = dt_clock_us(), deadline = start + r->cfg.ps_timeout_ms * 1000LL;
    int backoff_ms = 100;
    if (r->cfg.log) {
        fprintf(r->cfg.log, "worker %d: at global step %lld: %s; waiting up to %.0f s for the ps tasks (--ps_timeout)\n",
                task, (long long)*global_step, err ? err->msg : "a ps did not answer", r->cfg.ps_timeout_ms / 1000.0);
        fflush(r->cfg.log);
    }
    r->recoveries++;
    for (;;) {
        dt_error e = {0};
        int rc = dt_ps_client_status(r->client, NULL, &e);
        if (!rc) {
            int same = all_initialised(r);
            for (int p = 1; p < r->n_ps && same; p++)
                same = dt_ps_client_shard(r->client, p)->generation == dt_ps_client_shard(r->client, 0)->generation;
            if (same) rc = resume_from_ps(r, net, global_step, &e);
            else if (r->cfg.cluster->is_chief) rc = rollback(r, net, &e);
            else rc = DT_ETIMEOUT; /* waiting for the chief */
            if (!rc && same) {
                if (r->cfg.log) {
                    fprintf(r->cfg.log, "worker %d: the ps tasks are back after %.1f s: resuming at global step %lld\n",
                            task, (dt_clock_us() - start) / 1e6, (long long)*global_step);
                    fflush(r->cfg.log);
                }
                return DT_OK;
            }
            if (rc == DT_ETIMEOUT && !same)
                snprintf(e.msg, sizeof e.msg, "the ps tasks are not all initialised alike (a ps restarted) and the "
                         "chief has not re-initialised them");
        }
        if ((rc == DT_EINTR) || (r->cfg.stop && *r->cfg.stop))
            return dt_errorf(err, DT_EINTR, "worker %d: stopped by a signal while waiting for the ps tasks", task);
        if (rc && !recoverable(r, rc)) {
            if (err) *err = e;
            return rc;
        }
        int64_t left = (deadline - dt_clock_us()) / 1000;
        if (left <= 0)
            return dt_errorf(err, DT_ETIMEOUT, "worker %d: the ps tasks did not come back within %.0f s (--ps_timeout): %s",
                             task, r->cfg.ps_timeout_ms / 1000.0, e.msg);
        if (!rc) continue; /* the chief rolled back: check again at once */
        int ms = backoff_ms < left ? backoff_ms : (int)left;
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        if (backoff_ms < 2000) backoff_ms *= 2;
    }
}

/* Several ps tasks apply pushes independently, so a fetch can catch them at different steps. The
 * chief fetches between its own steps and fetches again until every shard has applied the same
 * number of updates (docs/checkpoint-format.md says what that guarantees). */
#define SNAPSHOT_TRIES 20

/* Chief: the other workers' end (DONE) and, with dynamic sharding, no member of ps 0's work plan
 * still training. A dynamic job may name more workers than ever start (a Kubernetes Job names the
 * most it may have): those that have not joined within --connect_timeout of this process's start
 * would have given up themselves, so from then on only the plan's members are waited for. */
static int wait_workers(remote *r, dt_error *err) {
    int n = r->cfg.n_workers_to_wait, timeout = r->cfg.request_timeout_ms;
    if (r->cfg.max_workers > 0 && n > 0) {
        int64_t left = r->cfg.connect_timeout_ms - (dt_clock_us() - r->created_us) / 1000;
        dt_error e = {0};
        if (left > 0 && !dt_ps_client_wait_done(r->client, n, (int)(left < timeout ? left : timeout), &e)) return DT_OK;
        n = 0;
    }
    return dt_ps_client_wait_done(r->client, n, timeout, err);
}

static int remote_snapshot(dt_updater *u, dt_net *net, float *params, float *state, int64_t *global_step, int final,
                           dt_error *err) {
    remote *r = (remote *)u;
    const dt_placement *pl = r->cfg.placement;
    int rc = remote_settle(u, net, global_step, err);
    if (!rc) rc = grads_writable(r, err);
    if (rc) return rc;
    dt_error werr = {0};
    if (final && r->cfg.n_workers_to_wait > 0 && wait_workers(r, &werr) && r->cfg.log)
        fprintf(r->cfg.log, "chief: %s; taking the final checkpoint anyway\n", werr.msg);
    size_t n = dt_net_param_count(net);
    int slots = state ? dt_opt_slots(&r->cfg.opt) : 0;
    float **st = slots ? shard_buffers(pl, slots, err) : NULL;
    if (slots && !st) return DT_ENOMEM;
    /* The gradient buffers are free between steps: they receive the parameter shards. */
    for (int t = 0; t < SNAPSHOT_TRIES; t++) {
        if ((rc = dt_ps_client_fetch_state(r->client, &r->cfg.opt, r->grads, st, r->steps, r->steps_max, err))) break;
        /* Sync mode: every chunk of every shard at one step. Async mode takes a chunk a push ahead,
         * as TensorFlow's Saver reads variables while updates land, but not shards apart. */
        int agree = 1;
        for (int p = 0; p < r->n_ps; p++)
            agree &= r->steps[p] == r->steps[0] && (!r->sync || r->steps_max[p] == r->steps[p]);
        if (agree) break;
        if (t == SNAPSHOT_TRIES - 1 && r->cfg.log)
            fprintf(r->cfg.log, "chief: warning: shards at different steps after %d fetches (ps 0 at %lld, ps %d at "
                                "%lld); checkpoint at ps 0's step\n",
                    SNAPSHOT_TRIES, (long long)r->steps[0], r->n_ps - 1, (long long)r->steps[r->n_ps - 1]);
    }
    if (!rc) {
        for (int p = 0; p < r->n_ps; p++) {
            dt_placement_scatter(pl, p, params, r->grads[p]);
            for (int k = 0; k < slots; k++)
                dt_placement_scatter(pl, p, state + (size_t)k * n, st[p] + (size_t)k * pl->shard_count[p]);
        }
        *global_step = r->steps[0];
    }
    free_shard_buffers(pl, st);
    return rc;
}

/* Strict sync mode: the ps tasks declare a worker silent for their liveness timeout lost, stop the
 * job and exit one more timeout later, so a worker that was silent that long (stopped, or busy)
 * may find nobody left to tell it why. It knows why, and says so, instead of waiting for the ps
 * tasks to come back. Half a timeout more covers the ps's own check interval. */
static int lost_to_strict_ps(remote *r, dt_error *err) {
    if (!r->sync || !r->cfg.strict) return DT_OK;
    int64_t liveness = r->cfg.request_timeout_ms / 2, silent = dt_ps_client_silent_ms(r->client);
    if (silent <= liveness + liveness / 2) return DT_OK;
    return dt_errorf(err, DT_ETIMEOUT, "worker %d: the ps tasks declared this worker lost and the job stopped "
                     "(--strict): nothing reached them from it for %.1f s (was this process stopped, or busy?), "
                     "more than their liveness timeout of %.1f s (--heartbeat_timeout / 2)",
                     r->cfg.cluster->task_index, silent / 1000.0, liveness / 1000.0);
}

/* A failed exchange: a ps that may come back is waited for (this step's gradient is lost with it, or
 * with the rollback; training goes on from what the ps tasks hold once they are back). */
static int exchange_failed(remote *r, dt_net *net, int rc, int64_t *global_step, dt_error *err) {
    /* No reply after this process was stopped mid-exchange: the same. */
    if (recoverable(r, rc) && lost_to_strict_ps(r, err)) return DT_ETIMEOUT;
    if (r->cfg.ps_timeout_ms <= 0 || !recoverable(r, rc)) return rc;
    return recover(r, net, global_step, err);
}

/* What an exchange of the gradient for step tag brought back (the parameters are in the net). */
static void exchange_done(remote *r, int64_t tag, const dt_push_result *res, int64_t *global_step) {
    *global_step = r->gstep = r->steps[0];
    r->wait_s += (double)res->wait_us * 1e-6;
    r->stale_ref += res->stale_ref != 0;
    if (res->n_stale) {
        r->stale++;
        if (r->cfg.log && r->stale <= 3)
            fprintf(r->cfg.log, "worker %d: gradient for step %lld arrived stale at %d of %d ps task(s) (now at "
                    "step %lld): dropped%s\n", r->cfg.cluster->task_index, (long long)tag, res->n_stale, r->n_ps,
                    (long long)*global_step, r->stale == 3 ? "; further ones are counted" : "");
    }
    /* Next: the step after this one, or the cluster's step if it moved on without us (backup workers). */
    if (r->sync) r->iter = *global_step > tag + 1 ? *global_step : tag + 1;
}

/* Sync: the gradient is for step iter; the pull waits until step iter - staleness has been applied
 * (staleness 0: this very step, the barrier). Async: tagged with the step the loop was given. */
static int64_t min_step_for(const remote *r, int64_t tag) {
    int64_t min_step = r->sync ? tag + 1 - r->cfg.staleness : 0;
    return min_step < 0 ? 0 : min_step;
}

/* ---- --overlap: the net's hooks drive the exchange (worker/overlap.h) ---- */

/* A broken invariant of the phases below (DT_ASSERT in a release build): the step is refused. */
static int ov_broken(dt_error *err) { return dt_errorf(err, DT_EINVAL, "overlap: %s", dt_assert_why()); }

/* Ends the exchange in flight and takes in its outcome (*global_step is then the cluster's step).
 * One whose gradient is incomplete (training stopped mid-step) is abandoned. */
static int ov_settle(remote *r, int64_t *global_step, dt_error *err) {
    if (!r->ov || r->ov_phase == OV_NONE) return DT_OK;
    int abandon = r->ov_phase == OV_FILLING;
    dt_push_result res;
    double t0 = dt_seconds();
    int rc = dt_overlap_finish(r->ov, abandon, r->steps, &res, err);
    r->blocked_s += dt_seconds() - t0;
    r->ov_phase = OV_NONE;
    if (abandon) return DT_OK;
    if (!rc) exchange_done(r, r->ov_tag, &res, global_step);
    return rc;
}

/* The first gradient range of a step is final: the previous exchange has ended by now (the forward
 * waited for every chunk), so this step's begins. */
static int ov_open(remote *r, dt_error *err) {
    int64_t g;
    int rc = ov_settle(r, &g, err);
    if (!rc) rc = grads_writable(r, err);
    if (!rc) rc = lost_to_strict_ps(r, err);
    if (rc) return rc;
    if (!DT_ASSERT(r->ov_phase == OV_NONE)) return ov_broken(err);
    r->ov_tag = r->sync ? r->iter : r->gstep;
    if ((rc = dt_ps_client_set_examples(r->client, (uint64_t)dt_net_batch(r->net), err)) ||
        (rc = dt_overlap_begin(r->ov, r->ov_tag, min_step_for(r, r->ov_tag), err))) return rc;
    r->ov_phase = OV_FILLING;
    return DT_OK;
}

static void ov_after_backward(void *user, size_t offset, size_t count) {
    remote *r = user;
    if (r->ov_rc) return; /* reported by apply */
    if (r->ov_phase != OV_FILLING && (r->ov_rc = ov_open(r, &r->ov_err))) return;
    state_changes(r, dt_net_grads(r->net), dt_net_params(r->net), offset, offset + count);
    dt_overlap_ready(r->ov, offset, count);
}

static void ov_before_forward(void *user, size_t offset, size_t count) {
    remote *r = user;
    if (r->ov_phase != OV_FLYING) return;
    double t0 = dt_seconds();
    dt_overlap_need(r->ov, offset, count);
    r->blocked_s += dt_seconds() - t0;
    remember_state(r, dt_net_params(r->net), offset, offset + count); /* before the forward moves them */
}

/* Apply with --overlap: whatever backward did not report goes too, and the step returns at once;
 * its parameters land under the next forward. Sync with every replica's gradient, the step after
 * this update is known now (tag + 1); async, one more than the newest step heard of. */
static int ov_apply(remote *r, int64_t *global_step, dt_error *err) {
    int rc = r->ov_rc;
    if (rc) {
        if (err) *err = r->ov_err;
        r->ov_rc = 0;
        return rc;
    }
    if (r->ov_phase != OV_FILLING && (rc = ov_open(r, err))) return rc;
    if (!DT_ASSERT(r->ov_phase == OV_FILLING)) return ov_broken(err);
    state_changes(r, dt_net_grads(r->net), dt_net_params(r->net), 0, SIZE_MAX); /* ranges not reported yet */
    dt_overlap_ready_rest(r->ov);
    r->ov_phase = OV_FLYING;
    *global_step = r->gstep = r->sync ? r->ov_tag + 1 : r->gstep + 1;
    return DT_OK;
}

static int remote_apply(dt_updater *u, dt_net *net, int64_t local_step, int64_t *global_step, dt_error *err) {
    remote *r = (remote *)u;
    if (r->cfg.step_delay_ms > 0) {
        struct timespec ts = {r->cfg.step_delay_ms / 1000, (long)(r->cfg.step_delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    double t0 = dt_seconds();
    int rc;
    if (r->ov) {
        rc = ov_apply(r, global_step, err);
    } else if (!(rc = grads_writable(r, err)) && !(rc = lost_to_strict_ps(r, err)) &&
               !(rc = r->sparse ? dt_sparse_push(r->sparse, err) : DT_OK)) {
        state_changes(r, dt_net_grads(net), dt_net_params(net), 0, SIZE_MAX);
        for (int p = 0; p < r->n_ps; p++) dt_placement_gather(r->cfg.placement, p, r->grads[p], dt_net_grads(net));
        int64_t tag = r->sync ? r->iter : local_step;
        dt_push_result res;
        /* Push and pull in one round trip per ps; the gradient says its examples (a sync step
         * weights each worker's by them: an epoch's short last batch counts for what it holds). */
        if (!(rc = dt_ps_client_set_examples(r->client, (uint64_t)dt_net_batch(net), err)))
            rc = dt_ps_client_push_pull(r->client, (const float *const *)r->grads, tag, min_step_for(r, tag),
                                        r->views, r->steps, &res, err);
        if (!rc) {
            views_into_net(r, net, global_step);
            exchange_done(r, tag, &res, global_step);
        }
    }
    if (rc) {
        if ((rc = exchange_failed(r, net, rc, global_step, err))) return rc;
        r->exchange_s += dt_seconds() - t0 + r->blocked_s;
        r->blocked_s = 0;
        return DT_OK;
    }
    /* Compute: since the last update, less what the hooks waited for the exchange. */
    double t1 = dt_seconds();
    r->compute_s += t0 - r->t_last - r->blocked_s;
    r->exchange_s += t1 - t0 + r->blocked_s;
    r->blocked_s = 0;
    r->t_last = t1;
    r->updates++;
    return DT_OK;
}

/* The net holds the last update's parameters and *global_step is the cluster's step. */
static int remote_settle(dt_updater *u, dt_net *net, int64_t *global_step, dt_error *err) {
    remote *r = (remote *)u;
    int rc = ov_settle(r, global_step, err);
    return rc ? exchange_failed(r, net, rc, global_step, err) : DT_OK;
}

/* The net's tables from the ps tasks (its fill callback, at the start of each forward): a pull that
 * fails as an exchange can (a ps lost, restarting or rolled back) waits for the ps tasks as an
 * exchange does (--ps_timeout), then is made again from what they hold; the step's gradient goes to
 * the step they resumed at. A ps lost again at once is waited for again, FILL_TRIES times. */
#define FILL_TRIES 3
static int fill_pull(remote *r, dt_net *net, int training, dt_error *err) {
    int rc = dt_sparse_pull(r->sparse, training, err);
    for (int k = 0; rc && k < FILL_TRIES; k++) {
        int64_t step = r->gstep;
        if ((rc = exchange_failed(r, net, rc, &step, err))) return rc;
        r->gstep = step;
        rc = dt_sparse_pull(r->sparse, training, err);
    }
    return rc;
}

/* A training forward takes the rows prefetched for it, if they are its blocks' (else, or if the
 * prefetch failed, pulls them as without one: a ps lost is met and waited for there), then sends
 * the pull of the next batch the loop announced (dt_net_lookahead), at the step after these rows'.
 * A prefetch that cannot be sent is counted, not fatal: the next forward pulls as before. */
static int remote_fill(void *user, dt_net *net, int training, dt_error *err) {
    remote *r = user;
    int taken = 0, rc = DT_OK;
    int64_t step;
    const double t0 = dt_seconds();
    if (training && r->prefetch) {
        dt_error e = {0};
        if (!dt_sparse_prefetch_take(r->prefetch, &taken, &step, &e) && taken) dt_sparse_prefetched(r->sparse, step);
    }
    if (!taken && (rc = fill_pull(r, net, training, err))) return rc;
    /* a training forward waiting for its rows waits for the exchange, not compute (with the
     * prefetch, only for what did not arrive under the step before) */
    if (training) {
        const double waited = dt_seconds() - t0;
        r->blocked_s += waited, r->rows_wait_s += waited;
    }
    const dt_ctr_batch *next = training && r->prefetch ? dt_net_lookahead(net) : NULL;
    if (next && next->n > 0) {
        dt_error e = {0};
        dt_sparse_prefetch_send(r->prefetch, next, dt_sparse_next_want(r->sparse), &e);
    }
    return DT_OK;
}

/* The next batch's rows pulled under this step's compute, on a connection of its own. */
static int open_prefetch(remote *r, const dt_sparse_config *sc, dt_net *net, dt_error *err) {
    dt_sparse_config pc = *sc;
    int rc = dt_remote_open_client(&r->base, &pc.client, err);
    return rc ? rc : dt_sparse_prefetch_create(&r->prefetch, &pc, net, err);
}

/* Connects the net's hooks to the exchange, at the start (the net is known from then on). */
static int attach(remote *r, dt_net *net, dt_error *err) {
    if (!r->sparse && dt_net_compact_tables(net) && dt_net_num_tables(net) > 0) {
        dt_sparse_config sc = {.client = r->client, .sync = r->sync, .opt = r->cfg.table_opt, .seed = r->cfg.seed,
                               .encoding = r->cfg.compression};
        int rc = dt_sparse_client_create(&r->sparse, &sc, net, err);
        if (rc) return rc;
        dt_net_set_table_fill(net, remote_fill, r); /* the client's pull, with the exchange's waiting */
        r->net = net;
        /* the tables' pulls and pushes share the client between steps: no stream under compute
         * (docs/sparse.md, "On a worker") */
        r->cfg.overlap = DT_OVERLAP_NONE;
        if (r->cfg.sparse_prefetch && (rc = open_prefetch(r, &sc, net, err))) return rc;
    }
    if (r->cfg.overlap == DT_OVERLAP_NONE || r->ov) return DT_OK;
    /* Every chunk of one step comes back at one step only when each sync step waits for every
     * replica; with backup workers or staleness a chunk can be a step ahead, which the client
     * repairs by pulling again after the whole exchange. */
    if (r->sync && (r->cfg.replicas_to_aggregate < r->cfg.total_num_replicas || r->cfg.staleness > 0)) {
        if (r->cfg.log)
            fprintf(r->cfg.log, "worker %d: --overlap=%s needs every replica's gradient in every step (no backup "
                    "workers, --staleness 0): exchanging between steps instead\n", r->cfg.cluster->task_index,
                    dt_overlap_name(r->cfg.overlap));
        r->cfg.overlap = DT_OVERLAP_NONE;
        return DT_OK;
    }
    dt_overlap_config oc = {.client = r->client, .placement = r->cfg.placement, .grads = r->grads,
                            .params = dt_net_params(net), .flat_grads = dt_net_grads(net), .mode = r->cfg.overlap};
    int rc = dt_overlap_create(&r->ov, &oc, err);
    if (rc) return rc;
    r->net = net;
    dt_net_set_hooks(net, &(dt_net_hooks){ov_before_forward, ov_after_backward, r});
    return DT_OK;
}

/* The prefetch's part of the sparse tables' line: its pulls' counts into *tot, its connection's
 * sparse bytes into up and down, all its bytes into all[2]; and its own line. */
static void log_prefetch(remote *r, dt_sparse_stats *tot, unsigned long long *up, unsigned long long *down,
                         double *all) {
    if (!r->prefetch) return;
    const dt_sparse_stats *a = &r->prefetch0, *b = dt_sparse_prefetch_pull_stats(r->prefetch);
    const dt_ps_client_stats *st = dt_sparse_prefetch_client_stats(r->prefetch);
    tot->pulls += b->pulls - a->pulls, tot->rows_pulled += b->rows_pulled - a->rows_pulled;
    tot->messages += b->messages - a->messages, tot->sections += b->sections - a->sections;
    *up += st->sparse_tx_bytes - r->prefetch_tx0, *down += st->sparse_rx_bytes - r->prefetch_rx0;
    all[0] += (double)st->tx_bytes, all[1] += (double)st->rx_bytes;
    const dt_prefetch_stats *p0 = &r->prefetched0, *p1 = dt_sparse_prefetch_stats(r->prefetch);
    fprintf(r->cfg.log, "worker %d: sparse tables: prefetch: %llu pulls sent ahead, %llu taken by the next forward, "
            "%llu missed, %llu failed\n", r->cfg.cluster->task_index, (unsigned long long)(p1->sent - p0->sent),
            (unsigned long long)(p1->taken - p0->taken), (unsigned long long)(p1->missed - p0->missed),
            (unsigned long long)(p1->failed - p0->failed));
}

/* The sparse tables' line: what travelled since training began, counted (docs/sparse.md); a pull
 * sent ahead counts as a pull, its bytes as the tables' (on the prefetch's connection). */
static void log_sparse(remote *r, const dt_ps_client_stats *st) {
    const dt_sparse_stats *a = &r->sparse0, *b = dt_sparse_get_stats(r->sparse);
    dt_sparse_stats d = {.pulls = b->pulls - a->pulls, .pushes = b->pushes - a->pushes,
                         .messages = b->messages - a->messages, .sections = b->sections - a->sections,
                         .rows_pulled = b->rows_pulled - a->rows_pulled, .rows_pushed = b->rows_pushed - a->rows_pushed};
    unsigned long long up = st->sparse_tx_bytes - r->sparse_tx0, down = st->sparse_rx_bytes - r->sparse_rx0;
    double all[2] = {(double)st->tx_bytes, (double)st->rx_bytes};
    log_prefetch(r, &d, &up, &down, all);
    double n = (double)r->updates;
    fprintf(r->cfg.log, "worker %d: sparse tables: %llu pulls, %llu pushes, %llu messages, %llu sections, %llu rows "
            "pulled, %llu pushed, %llu bytes up, %llu down; per update %.1f rows pulled, %.0f bytes up, %.0f down "
            "(dense and sparse: %.0f up, %.0f down); stale pushes %llu\n", r->cfg.cluster->task_index,
            (unsigned long long)d.pulls, (unsigned long long)d.pushes, (unsigned long long)d.messages,
            (unsigned long long)d.sections, (unsigned long long)d.rows_pulled, (unsigned long long)d.rows_pushed, up,
            down, (double)d.rows_pulled / n, (double)up / n, (double)down / n, all[0] / n, all[1] / n,
            (unsigned long long)(b->stale - a->stale));
    if (r->cfg.compression != DT_ENC_FP32)
        fprintf(r->cfg.log, "worker %d: sparse tables: rows pulled and pushed in %s, %llu gradient values "
                "saturated\n", r->cfg.cluster->task_index, dt_enc_name(r->cfg.compression),
                (unsigned long long)(b->saturated - a->saturated));
}

/* One line per worker: how many updates, where the time went, how many gradients were stale. */
static void log_summary(remote *r) {
    if (!r->cfg.log || r->updates == 0) return;
    const dt_ps_client_stats *st = dt_ps_client_get_stats(r->client);
    double n = (double)r->updates;
    fprintf(r->cfg.log, "worker %d: %lld updates (%s): per step compute %.1f ms, exchange %.1f ms ",
            r->cfg.cluster->task_index, (long long)r->updates, r->sync ? "sync replicas" : "asynchronous",
            1e3 * r->compute_s / n, 1e3 * r->exchange_s / n);
    /* Overlapped, the exchange counts only where compute waited for it; the ps's barrier hold
     * runs under compute too, so it is no part of that. */
    if (r->ov)
        fprintf(r->cfg.log, "(compute waiting for it; overlapped, %s order; the ps held chunks at the barrier %.1f ms)",
                dt_overlap_name(r->cfg.overlap), 1e3 * r->wait_s / n);
    else
        fprintf(r->cfg.log, "(waiting at the barrier %.1f ms, transfer and apply %.1f ms)", 1e3 * r->wait_s / n,
                1e3 * (r->exchange_s - r->wait_s) / n);
    fprintf(r->cfg.log, "; stale gradients dropped: %lld of %lld", (long long)r->stale, (long long)r->updates);
    if (r->sync && r->n_ps > 1) fprintf(r->cfg.log, "; shards pulled again for one step: %llu",
                                        (unsigned long long)st->repulls);
    if (r->recoveries) fprintf(r->cfg.log, "; ps outages waited out: %lld", (long long)r->recoveries);
    fputc('\n', r->cfg.log);
    if (r->sparse) log_sparse(r, st);
    fflush(r->cfg.log);
}

void dt_remote_get_timing(const dt_updater *u, dt_remote_timing *out) {
    const remote *r = (const remote *)u;
    *out = (dt_remote_timing){.updates = r->updates, .stale = r->stale, .stale_ref = r->stale_ref,
                              .compute_s = r->compute_s, .exchange_s = r->exchange_s, .wait_s = r->wait_s,
                              .repulls = dt_ps_client_get_stats(r->client)->repulls, .rows_wait_s = r->rows_wait_s};
}

int dt_remote_open_client(dt_updater *u, struct dt_ps_client **out, dt_error *err) {
    dt_ps_client_config cc = ((remote *)u)->cc;
    cc.compression = DT_ENC_FP32; /* it sends no gradients: no codec, no error-feedback buffers */
    cc.metrics = NULL;            /* the exchange's series are the updater's client's */
    cc.sndbuf_bytes = 0;
    return dt_ps_client_open(out, &cc, err);
}
struct dt_sparse_client *dt_remote_sparse(dt_updater *u) { return ((remote *)u)->sparse; }

int64_t dt_remote_next_tag(const dt_updater *u, int64_t tag) {
    const remote *r = (const remote *)u;
    /* what the next PUSH carries: ov_open's tag with --overlap (the step of the exchange just
     * settled, which a checkpoint's fetch does not move), else remote_apply's */
    return r->sync ? r->iter : r->ov ? r->gstep : tag;
}

int64_t dt_remote_expected_tag(const dt_updater *u, int64_t tag) {
    const remote *r = (const remote *)u;
    if (!r->ov || r->ov_phase == OV_NONE) return dt_remote_next_tag(u, tag); /* nothing in flight: known */
    /* sync, the exchange of ov_tag in flight: it ends at step ov_tag + 1 unless the cluster moved on
     * without this worker (exchange_done); async takes the step its reply brings */
    return r->sync && r->ov_phase == OV_FLYING ? r->ov_tag + 1 : -1;
}

int dt_remote_resync(dt_updater *u, dt_net *net, int64_t *global_step, dt_error *err) {
    remote *r = (remote *)u;
    int rc = ov_settle(r, global_step, err);
    if (!rc) rc = resume_from_ps(r, net, global_step, err);
    return rc ? exchange_failed(r, net, rc, global_step, err) : DT_OK;
}

static int remote_finish(dt_updater *u, dt_error *err) {
    remote *r = (remote *)u;
    int64_t g;
    if (r->ov_phase != OV_NONE) {
        dt_error e = {0};
        if (ov_settle(r, &g, &e) && r->cfg.log) fprintf(r->cfg.log, "worker %d: the last exchange failed: %s\n",
                                                         r->cfg.cluster->task_index, e.msg);
    }
    log_summary(r);
    if (!r->cfg.cluster->is_chief) return dt_ps_client_done(r->client, 0, err);
    dt_error werr = {0};
    int rc = wait_workers(r, &werr);
    if (rc && r->cfg.log) fprintf(r->cfg.log, "chief: %s; ending the cluster anyway\n", werr.msg);
    return dt_ps_client_shutdown(r->client, err);
}

static void remote_free(dt_updater *u) {
    remote *r = (remote *)u;
    if (!r) return;
    dt_overlap_free(r->ov); /* first: its thread may hold the client */
    dt_sparse_prefetch_free(r->prefetch);
    dt_sparse_client_free(r->sparse);
    if (r->net) dt_net_set_hooks(r->net, NULL);
    dt_ps_client_close(r->client);
    for (int p = 0; p < r->n_ps; p++) {
        if (r->grads) free(r->grads[p]);
        if (r->endpoints) free(r->endpoints[p]);
    }
    free(r->grads), free(r->endpoints), free(r->views), free(r->steps), free(r->steps_max);
    free(r->state_views), free(r->state_base);
    free(r);
}

int dt_remote_updater_create(dt_updater **out, const dt_remote_config *cfg, dt_error *err) {
    *out = NULL;
    remote *r = dt_calloc(1, sizeof *r, "remote updater", err);
    if (!r) return DT_ENOMEM;
    r->base = (dt_updater){remote_start, remote_apply, remote_finish, remote_free, remote_restore,
                           remote_snapshot, remote_settle};
    r->cfg = *cfg;
    r->created_us = dt_clock_us();
    if (r->cfg.request_timeout_ms <= 0) r->cfg.request_timeout_ms = 60000;
    r->n_ps = cfg->placement->n_ps;
    int rc = DT_ENOMEM;
    if (!(r->views = dt_calloc((size_t)r->n_ps, sizeof *r->views, "shard pointers", err)) ||
        !(r->steps = dt_calloc((size_t)r->n_ps, sizeof *r->steps, "shard steps", err)) ||
        !(r->steps_max = dt_calloc((size_t)r->n_ps, sizeof *r->steps_max, "shard steps", err)) ||
        !(r->grads = dt_calloc((size_t)r->n_ps, sizeof *r->grads, "shard pointers", err)) ||
        !(r->endpoints = dt_calloc((size_t)r->n_ps, sizeof *r->endpoints, "endpoints", err)))
        goto fail;
    size_t n_base = 0;
    const dt_placement *pl = cfg->placement;
    if (!(r->state_views = dt_calloc((size_t)pl->n_views + 1, sizeof *r->state_views, "state views", err))) goto fail;
    for (int v = 0; v < pl->n_views; v++)
        if (pl->views[v].not_trained) r->state_views[r->n_state++] = v, n_base += pl->views[v].count;
    if (!(r->state_base = dt_alloc_floats(n_base + 1, "state values", err))) goto fail;
    for (int p = 0; p < r->n_ps; p++) {
        size_t n = cfg->placement->shard_count[p];
        if (!(r->grads[p] = dt_alloc_floats(n, "gradient shard", err)) ||
            !(r->endpoints[p] = dt_malloc(DT_ENDPOINT_MAX, "endpoint", err)))
            goto fail;
        /* A ps on this host is reached over its Unix socket (cluster.h: same-host fast path). */
        if (dt_addr_ipc_endpoint(&cfg->cluster->ps[p], r->endpoints[p], DT_ENDPOINT_MAX) &&
            dt_addr_connect_endpoint(&cfg->cluster->ps[p], r->endpoints[p], DT_ENDPOINT_MAX)) {
            rc = dt_errorf(err, DT_EINVAL, "--ps_hosts[%d]: address too long", p);
            goto fail;
        }
    }
    dt_ps_client_config cc = {
        .n_ps = r->n_ps,
        .endpoints = (const char *const *)r->endpoints,
        .shard_floats = cfg->placement->shard_count,
        .role = cfg->cluster->is_chief ? DT_ROLE_CHIEF : DT_ROLE_WORKER,
        .task = cfg->cluster->task_index,
        .connect_timeout_ms = cfg->connect_timeout_ms,
        .request_timeout_ms = cfg->request_timeout_ms,
        .replicas_to_aggregate = cfg->replicas_to_aggregate,
        .total_num_replicas = cfg->total_num_replicas,
        .staleness = cfg->staleness,
        .n_workers = cfg->max_workers > 0 ? cfg->max_workers : cfg->cluster->n_workers,
        .chunk_bytes = cfg->chunk_bytes,
        .compression = cfg->compression,
        /* Half the request deadline: the ps gives up on a silent worker before the others do. */
        .liveness_ms = r->cfg.request_timeout_ms / 2,
        .strict = cfg->strict,
        .elastic = cfg->max_workers > 0,
        .auth = cfg->auth,
        .name_float = name_shard_float,
        .name_user = (void *)cfg->placement,
        .log = cfg->log,
        .metrics = cfg->metrics,
        .sndbuf_bytes = cfg->overlap == DT_OVERLAP_PRIORITY ? DT_OVERLAP_SNDBUF : 0,
        .stop = cfg->stop,
    };
    r->sync = cfg->replicas_to_aggregate > 0;
    r->cc = cc; /* for dt_remote_open_client */
    if ((rc = dt_ps_client_open(&r->client, &cc, err))) goto fail;
    *out = &r->base;
    return DT_OK;
fail:
    remote_free(&r->base);
    return rc;
}
