/* The shard's dense requests, handlers on the core (shard_core.c): INIT installs the chunks, PUSH
 * updates them (async at once; sync held until a step's gradients are in, then applied by the
 * core), FETCH copies them whole. */
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/error.h"
#include "core/finite.h"
#include "ps/shard_impl.h"
#include "transport/compress.h"

/* The whole shard for a checkpoint: parameters, then the optimizer state slot-major, as INIT takes
 * them back (a restore is an INIT with this payload and step). global_step is the step every chunk
 * has reached, state.step_max the step of the chunk furthest ahead: they differ while a gradient
 * is still arriving, and the client fetches again. */
void shard_on_fetch(const shard_req *r) {
    ps_shard *s = r->s;
    const size_t n = s->n, bytes = (size_t)(1 + s->slots) * n * sizeof(float);
    float *d = shard_reply_buffer(r, bytes);
    if (!d) return;
    for (int c = 0; c < s->n_parts; c++) {
        const part_t *p = &s->parts[c];
        memcpy(d + p->off, p->params, p->n * sizeof(float));
        for (int k = 0; k < s->slots; k++)
            memcpy(d + (size_t)(1 + k) * n + p->off, p->state + (size_t)k * p->n, p->n * sizeof(float));
    }
    dt_wire_header h = shard_reply_to(s, DT_MSG_STATE, r->h);
    shard_put_optimizer(s, &h);
    h.state.step_max = (uint64_t)shard_step_max(s);
    shard_send_buffer(r, &h, d, bytes);
}

/* ---- INIT ------------------------------------------------------------------------------------- */

/* DONE from tasks beyond the cluster's workers (heard before INIT told how many there are) does
 * not count. */
static void prune_done(ps_shard *s) {
    if (!s->done) return;
    for (int w = s->workers ? s->workers : 65536; w < 65536; w++) {
        uint8_t bit = (uint8_t)(1u << (w & 7));
        if (!(s->done[w >> 3] & bit)) continue;
        s->done[w >> 3] &= (uint8_t)~bit;
        s->n_done--;
    }
    s->n_sitting = 0; /* recounted: the declared workers whose DONE stands */
    for (int w = 0; w < s->total && s->done; w++) s->n_sitting += (s->done[w >> 3] >> (w & 7)) & 1;
}

/* Everything an INIT installs, built whole before anything of the shard changes (so a refusal or
 * a failed allocation leaves it as it was). */
typedef struct {
    part_t *parts;
    int n_parts, aggregate, total, staleness;
    float *scratch, *sum;     /* [largest part] */
    uint64_t *stale;          /* [total]; NULL: keep the shard's counts (same number of replicas) */
    int64_t *last_seen;       /* [total] */
    uint8_t *lost;            /* [total] */
    int64_t *count_from;      /* [total] */
    push_count *counts;       /* [total] */
    uint64_t *owner;          /* [workers] */
} init_state;

static void init_state_free(init_state *t) {
    shard_parts_free(t->parts, t->n_parts, t->staleness);
    free(t->scratch), free(t->sum), free(t->stale), free(t->last_seen), free(t->lost), free(t->owner);
    free(t->count_from);
    free(t->counts);
    memset(t, 0, sizeof *t);
}

/* One chunk's values, state and decay mask from INIT's payload (params [n], state slot-major
 * [slots][n], the options block, the mask's bits; the mask only with weight decay on). */
static int part_prepare(part_t *p, size_t n, const float *data, int slots, int decays) {
    dt_snap_pool_init(&p->snaps, p->n);
    if (!(p->own = dt_alloc_floats(p->n, "ps chunk", NULL)) ||
        !(p->state = dt_alloc_floats(slots ? (size_t)slots * p->n : 1, "ps optimizer state", NULL)))
        return DT_ENOMEM;
    memcpy(p->own, data + p->off, p->n * sizeof(float));
    for (int k = 0; k < slots; k++)
        memcpy(p->state + (size_t)k * p->n, data + (size_t)(1 + k) * n + p->off, p->n * sizeof(float));
    if (decays) {
        if (!(p->decay = dt_calloc(p->n, 1, "ps decay mask", NULL))) return DT_ENOMEM;
        const uint8_t *bits = (const uint8_t *)data + (size_t)(1 + slots) * n * sizeof(float) + DT_WIRE_OPTS_BYTES;
        for (size_t i = 0; i < p->n; i++) p->decay[i] = (bits[(p->off + i) >> 3] >> ((p->off + i) & 7)) & 1;
    }
    p->params = p->own;
    return DT_OK;
}

uint64_t shard_sync_bytes(uint64_t chunks, uint64_t aggregate, uint64_t total, uint64_t staleness) {
    if (!aggregate) return 0;
    const uint64_t each = sizeof(uint16_t) + sizeof(dt_bytes) + sizeof(uint8_t) + sizeof(uint32_t); /* accum's arrays */
    const uint64_t worker = sizeof(uint64_t) + sizeof(int64_t) + sizeof(uint8_t) + sizeof(push_count) +
                            sizeof(uint64_t); /* stale, last_seen, lost, counts; the sparse stale counts */
    return chunks * (staleness + 1) * (sizeof(accum) + aggregate * each) + total * worker;
}

static int part_accumulators(part_t *p, int aggregate, int staleness) {
    if (!(p->acc = dt_calloc((size_t)staleness + 1, sizeof *p->acc, "ps accumulators", NULL))) return DT_ENOMEM;
    for (int i = 0; i <= staleness; i++) {
        p->acc[i].step = -1;
        p->acc[i].worker = dt_calloc((size_t)aggregate, sizeof *p->acc[i].worker, "ps accumulator", NULL);
        p->acc[i].grad = dt_calloc((size_t)aggregate, sizeof *p->acc[i].grad, "ps accumulator", NULL);
        p->acc[i].enc = dt_calloc((size_t)aggregate, sizeof *p->acc[i].enc, "ps accumulator", NULL);
        p->acc[i].examples = dt_calloc((size_t)aggregate, sizeof *p->acc[i].examples, "ps accumulator", NULL);
        if (!p->acc[i].worker || !p->acc[i].grad || !p->acc[i].enc || !p->acc[i].examples) return DT_ENOMEM;
    }
    return DT_OK;
}

/* Cuts the shard into chunks as INIT says, each with its values, state and decay mask and, in
 * sync mode, its accumulators; the per-worker tables. */
static int init_prepare(const ps_shard *s, const dt_wire_header *h, const float *data, int slots, int decays,
                        int64_t now, init_state *t) {
    *t = (init_state){.n_parts = h->chunks, .aggregate = (int)h->init.replicas_to_aggregate,
                      .total = (int)h->init.total_num_replicas, .staleness = (int)h->init.staleness};
    size_t largest = 0;
    uint32_t workers = h->init.total_num_replicas;
    if (!(t->owner = dt_calloc(workers ? workers : 1, sizeof *t->owner, "ps worker connections", NULL)) ||
        !(t->parts = dt_calloc((size_t)t->n_parts, sizeof *t->parts, "ps chunks", NULL)))
        goto oom;
    for (int c = 0; c < t->n_parts; c++) {
        part_t *p = &t->parts[c];
        uint64_t off, len;
        dt_wire_chunk(s->n, (unsigned)t->n_parts, (unsigned)c, &off, &len);
        p->off = (size_t)off, p->n = (size_t)len, p->step = h->global_step;
        if (p->n > largest) largest = p->n;
        if (part_prepare(p, s->n, data, slots, decays) ||
            (t->aggregate && part_accumulators(p, t->aggregate, t->staleness)))
            goto oom;
    }
    if (!(t->scratch = dt_alloc_floats(largest, "ps gradient scratch", NULL))) goto oom;
    if (t->aggregate) {
        int keep_stale = t->total == s->total && s->stale; /* stale counts survive a re-INIT alike */
        if ((!keep_stale && !(t->stale = dt_calloc((size_t)t->total, sizeof *t->stale, "ps stale counts", NULL))) ||
            !(t->last_seen = dt_calloc((size_t)t->total, sizeof *t->last_seen, "ps worker liveness", NULL)) ||
            !(t->lost = dt_calloc((size_t)t->total, sizeof *t->lost, "ps worker liveness", NULL)) ||
            !(t->count_from = dt_calloc((size_t)t->total, sizeof *t->count_from, "ps worker liveness", NULL)) ||
            !(t->counts = dt_calloc((size_t)t->total, sizeof *t->counts, "ps gradient examples", NULL)) ||
            !(t->sum = dt_alloc_floats(largest, "ps gradient mean", NULL)))
            goto oom;
        /* Every worker counts as just seen: a worker that never shows up is lost after the timeout. */
        for (int w = 0; w < t->total; w++) t->last_seen[w] = now, t->counts[w].step = -1;
    }
    return DT_OK;
oom:
    init_state_free(t);
    return DT_ENOMEM;
}

/* Cannot fail: t was built whole by init_prepare. The old chunks' snapshots still in flight are
 * freed by their last reply; held gradients are dropped. */
static void init_commit(ps_shard *s, init_state *t) {
    init_state old = {.parts = s->parts, .n_parts = s->n_parts, .staleness = s->staleness, .scratch = s->scratch,
                      .sum = s->sum, .stale = s->stale, .last_seen = s->last_seen, .lost = s->lost,
                      .count_from = s->count_from, .counts = s->counts, .owner = s->owner};
    if (t->aggregate && !t->stale) t->stale = s->stale, old.stale = NULL;
    init_state_free(&old);
    s->parts = t->parts, s->n_parts = t->n_parts, s->owner = t->owner;
    s->aggregate = t->aggregate, s->total = t->aggregate ? t->total : 0, s->staleness = t->staleness;
    s->scratch = t->scratch, s->sum = t->sum, s->stale = t->stale, s->last_seen = t->last_seen, s->lost = t->lost;
    s->counts = t->counts, s->count_from = t->count_from;
    s->n_lost = s->n_late = 0;
    memset(t, 0, sizeof *t);
}

/* INIT's optimizer and options block, and its values all finite: else the refusal's text. */
static int init_check_values(const ps_shard *s, const dt_wire_header *h, const float *data, dt_opt_config *opt,
                             char *msg, size_t len) {
    *opt = (dt_opt_config){.kind = (dt_opt_kind)h->opt_kind, .learning_rate = h->learning_rate,
                           .momentum = h->momentum, .beta1 = h->beta1, .beta2 = h->beta2, .epsilon = h->epsilon};
    if (!(opt->learning_rate > 0.0f)) {
        snprintf(msg, len, "INIT with learning_rate %g, must be positive", (double)opt->learning_rate);
        return 1;
    }
    int slots = dt_opt_slots(opt);
    dt_error oe = {0};
    if (dt_wire_opts_decode(&opt->schedule, &opt->weight_decay, (const uint8_t *)data + (size_t)(1 + slots) * s->n * 4,
                            DT_WIRE_OPTS_BYTES, &oe)) {
        snprintf(msg, len, "%.250s", oe.msg);
        return 1;
    }
    /* Non-finite values would only show up later as a NaN loss, far from their source. */
    size_t total = (size_t)(1 + slots) * s->n, bad = dt_first_nonfinite(data, total);
    if (bad == total) return 0;
    float v;
    memcpy(&v, (const char *)data + bad * sizeof v, sizeof v);
    if (bad < s->n)
        snprintf(msg, len, "INIT holds a non-finite parameter (%g at float %zu of the shard)", (double)v, bad);
    else
        snprintf(msg, len, "INIT holds a non-finite optimizer state value (%g at float %zu of slot %zu)", (double)v,
                 (bad - s->n) % s->n, (bad - s->n) / s->n);
    return 1;
}

static void log_init(const ps_shard *s, const dt_wire_header *h) {
    char mode[256] = "asynchronous", sched[160];
    if (s->aggregate && (h->flags & DT_WIRE_F_ELASTIC))
        snprintf(mode, sizeof mode, "sync replicas, elastic: mean of the live workers' gradients but %d backup(s) per "
                 "step, of %d declared workers, staleness %d", s->total - s->aggregate, s->total, s->staleness);
    else if (s->aggregate)
        snprintf(mode, sizeof mode, "sync replicas: mean of %d of %d workers' gradients per step, staleness %d",
                 s->aggregate, s->total, s->staleness);
    if (s->aggregate && h->liveness_ms)
        snprintf(mode + strlen(mode), sizeof mode - strlen(mode), "; a worker silent %lld ms is lost%s",
                 (long long)h->liveness_ms, (h->flags & DT_WIRE_F_STRICT) ? " and stops the job (strict)" : "");
    dt_lr_describe(&s->opt.schedule, sched, sizeof sched);
    shard_log(s, "%s by the chief (worker %u) at global step %lld (generation %u): %zu floats in %d chunk(s), %s, "
              "learning rate %g, schedule %s, weight decay %g, %s", s->initialised ? "re-initialised" : "initialised",
              h->task, (long long)h->global_step, h->generation, s->n, s->n_parts, dt_opt_name(s->opt.kind),
              (double)s->opt.learning_rate, sched, (double)s->opt.weight_decay, mode);
}

/* The chief's INIT (the dispatch table checked its role and its payload): the shard's values,
 * optimizer state and configuration, cut and step, all replaced at once. */
void shard_on_init(const shard_req *r) {
    ps_shard *s = r->s;
    const dt_wire_header *h = r->h;
    char msg[256];
    if (h->chunks > s->n) {
        shard_refuse(r, DT_WIRE_E_BAD_VALUE, "INIT cuts a shard of %zu floats into %u chunks (at most one per float)",
                     s->n, h->chunks);
        return;
    }
    /* The payload may be misaligned (nothing promises alignment): chunks are filled with memcpy. */
    const float *data = r->payload->data;
    dt_opt_config opt;
    if (init_check_values(s, h, data, &opt, msg, sizeof msg)) {
        shard_refuse(r, DT_WIRE_E_BAD_VALUE, "%s", msg);
        return;
    }
    int slots = dt_opt_slots(&opt);
    /* Counted before anything is allocated: a peer's INIT cannot make the ps hold more than its
     * table memory in accumulators (65,536 replicas at staleness 64 were 477 MiB per chunk). */
    const uint64_t sync = shard_sync_bytes(h->chunks, h->init.replicas_to_aggregate, h->init.total_num_replicas,
                                           h->init.staleness);
    if (s->cfg.table_memory && sync > s->cfg.table_memory) {
        shard_refuse(r, DT_WIRE_E_BAD_VALUE, "INIT's sync configuration (%llu of %llu workers, staleness %llu, %u "
                     "chunks) would hold %.1f MiB of accumulators and worker counts on this ps, over its table memory "
                     "of %.1f MiB (--ps_table_memory)", (unsigned long long)h->init.replicas_to_aggregate,
                     (unsigned long long)h->init.total_num_replicas, (unsigned long long)h->init.staleness, h->chunks,
                     (double)sync / 1048576.0, (double)s->cfg.table_memory / 1048576.0);
        return;
    }
    init_state t;
    if (init_prepare(s, h, data, slots, opt.weight_decay != 0, r->now, &t)) {
        shard_refuse(r, DT_WIRE_E_NOMEM, "out of memory for the shard's chunks, optimizer state or accumulators");
        return;
    }
    /* PULLs held for a step of the old values: their workers pull again (a rollback). */
    if (s->n_pending) {
        snprintf(msg, sizeof msg, "re-initialised by the chief at global step %lld (generation %u): pull again",
                 (long long)h->global_step, h->generation);
        shard_fail_pending(s, r->io, DT_WIRE_E_RESYNC, msg);
    }
    shard_sparse_drop(s, r->io); /* sized by the old sync configuration: the chief declares them again */
    free(s->sparse_stale);
    s->sparse_stale = NULL;
    init_commit(s, &t);
    s->sync_bytes = sync;
    if (s->coord) dt_coord_reset_step(s->coord, h->global_step); /* held gradients are gone: their claims too */
    /* The deferred PULL table is sized by the workers (a quota each): made anew for the new count. */
    free(s->pending);
    s->pending = NULL;
    s->cap_pending = 0;
    s->slots = slots;
    s->opt = opt;
    s->workers = (int)h->init.total_num_replicas;
    prune_done(s);
    log_init(s, h);
    s->initialised = 1;
    s->generation = h->generation;
    s->liveness_us = s->aggregate ? h->liveness_ms * 1000 : 0;
    s->strict = (h->flags & DT_WIRE_F_STRICT) != 0;
    /* Elastic: workers join and leave; none counts toward steps before the ps hears from it (a
     * declared worker that never starts is not waited for the liveness timeout). */
    s->elastic = (h->flags & DT_WIRE_F_ELASTIC) && s->aggregate;
    if (s->elastic) {
        memset(s->lost, SHARD_NEVER_HEARD, (size_t)s->total);
        s->n_lost = s->total;
    }
    s->failed[0] = '\0';
    dt_wire_header a = shard_reply_to(s, DT_MSG_ACK, h);
    shard_send(r, &a);
}

/* ---- PUSH ------------------------------------------------------------------------------------- */

/* A PUSH's reply: PUSH_ACK, or for a PUSH that asked for PARAMS its chunk's values once they
 * reach the step it asked for (the push's outcome rides along). */
static void push_reply(const shard_req *r, int32_t status, uint64_t stale) {
    if (r->h->flags & DT_WIRE_F_PULL) {
        shard_answer_pull(r, status, stale);
        return;
    }
    dt_wire_header a = shard_reply_to(r->s, DT_MSG_PUSH_ACK, r->h);
    a.status = status;
    a.push_ack.stale_count = stale;
    shard_send(r, &a);
}

/* A copy of borrowed bytes that owns itself: DT_OK, or DT_ENOMEM with b unchanged. */
static int keep_copy(dt_bytes *b) {
    void *c = malloc(b->size ? b->size : 1);
    if (!c) return DT_ENOMEM;
    memcpy(c, b->data, b->size);
    *b = (dt_bytes){.data = c, .size = b->size, .release = shard_release_free, .hint = c};
    return DT_OK;
}

/* A gradient dropped as stale and counted (once per gradient: on chunk 0): its step has passed,
 * or (full) a later step already holds replicas_to_aggregate gradients, which are the ones it
 * will apply. The worker hears STALE with its count. */
static void on_stale_push(const shard_req *r, const part_t *p, int full) {
    ps_shard *s = r->s;
    const dt_wire_header *h = r->h;
    uint64_t k = s->stale[h->task];
    if (h->chunk == 0) {
        k = ++s->stale[h->task];
        s->n_stale++;
        if (k <= SHARD_LOG_STALE && full)
            shard_log(s, "gradient from worker %u for step %lld: that step already has its %d gradient(s): dropped "
                      "as stale%s", h->task, (long long)h->local_step, s->aggregate,
                      k == SHARD_LOG_STALE ? "; further ones from it are counted" : "");
        else if (k <= SHARD_LOG_STALE)
            shard_log(s, "stale gradient from worker %u for step %lld (now at step %lld): dropped%s", h->task,
                      (long long)h->local_step, (long long)p->step,
                      k == SHARD_LOG_STALE ? "; further ones from it are counted" : "");
    }
    push_reply(r, DT_WIRE_STALE, k);
}

/* Every chunk of one gradient says the examples its first chunk said (a worker's gradient for a
 * step starts over once all the chunks of its last one were heard: a worker that restarted sends
 * its step's gradient again); 0, the refusal sent, otherwise. */
static int same_examples(const shard_req *r) {
    const dt_wire_header *h = r->h;
    push_count *pc = &r->s->counts[h->task];
    const uint32_t ex = (uint32_t)h->push.examples; /* at most DT_WIRE_MAX_EXAMPLES: checked by the decoder */
    if (pc->step != h->local_step || pc->chunks >= r->s->n_parts) {
        *pc = (push_count){.step = h->local_step, .examples = ex, .chunks = 1};
        return 1;
    }
    if (pc->examples != ex) {
        shard_refuse(r, DT_WIRE_E_BAD_VALUE, "chunk %u of worker %u's gradient for step %lld averages %u examples, "
                     "its chunks before %u: every chunk of one gradient says the same", h->chunk, h->task,
                     (long long)h->local_step, ex, pc->examples);
        return 0;
    }
    pc->chunks++;
    return 1;
}

/* A sync-mode gradient chunk for step t = local_step: stale (t < the chunk's step) is dropped and
 * counted; fresh is held for its step; a complete step (replicas_to_aggregate gradients, or the
 * live workers') is applied at once. */
static void on_sync_push(const shard_req *r) {
    ps_shard *s = r->s;
    const dt_wire_header *h = r->h;
    part_t *p = &s->parts[h->chunk];
    const int64_t t = h->local_step;
    if (t < p->step || shard_too_early(s, h->task, t)) {
        on_stale_push(r, p, 0);
        return;
    }
    if (t > p->step + s->staleness) { /* a worker ahead of the ps: the chief rolled the cluster back; it pulls again */
        shard_refuse(r, DT_WIRE_E_RESYNC, "gradient for step %lld, but this ps is at step %lld and staleness %d allows "
                     "at most %lld", (long long)t, (long long)p->step, s->staleness, (long long)(p->step + s->staleness));
        return;
    }
    accum *a = &p->acc[t % (s->staleness + 1)];
    if (!DT_ASSERT(a->count == 0 || a->step == t)) {
        shard_refuse(r, DT_WIRE_E_RESYNC, "gradient for step %lld refused: %s", (long long)t, dt_assert_why());
        return;
    }
    int k = 0;
    while (k < a->count && a->worker[k] != h->task) k++;
    /* Only a later step can be full (the current one is applied once full): with backup workers
     * (replicas_to_aggregate < total) its extra gradients are stale before they could count. */
    if (k == a->count && a->count >= s->aggregate) {
        on_stale_push(r, p, 1);
        return;
    }
    if (!same_examples(r)) return;
    dt_bytes g = *r->payload;
    if (!g.release && keep_copy(&g)) { /* borrowed bytes: kept as a copy */
        shard_refuse(r, DT_WIRE_E_NOMEM, "out of memory for a gradient");
        return;
    }
    *r->payload = (dt_bytes){0};
    if (k < a->count) {
        /* A second gradient from one worker for one step: the worker restarted (or gave up waiting
         * and pulled again) and computed it afresh. The newer one replaces the first. */
        if (h->chunk == 0)
            shard_log(s, "worker %u sent step %lld's gradient again (restarted?): the newer one replaces it", h->task,
                      (long long)t);
        dt_bytes_release(&a->grad[k]);
    } else {
        a->worker[a->count++] = h->task;
    }
    a->step = t;
    a->grad[k] = g; /* kept: released when its step is applied */
    a->enc[k] = h->encoding;
    a->examples[k] = (uint32_t)h->push.examples;
    if (h->chunk == 0) s->pushes++;
    int applied = shard_apply_complete_steps(s, p);
    push_reply(r, DT_WIRE_OK, s->stale[h->task]);
    if (applied) shard_serve_pending(s, r->now, r->io);
}

/* A gradient (the dispatch table checked readiness, the cut and the payload). */
void shard_on_push(const shard_req *r) {
    ps_shard *s = r->s;
    const dt_wire_header *h = r->h;
    if (s->owner && r->from->serial && (h->role == DT_ROLE_WORKER || h->role == DT_ROLE_CHIEF) && h->task < s->workers)
        s->owner[h->task] = r->from->serial;
    int sync = (h->flags & DT_WIRE_F_SYNC) != 0;
    if (sync != (s->aggregate > 0)) {
        shard_refuse(r, DT_WIRE_E_BAD_VALUE, "%s gradient, but the chief initialised this ps for %s (give every task "
                     "the same --issync)", sync ? "synchronous" : "asynchronous",
                     sync ? "asynchronous training" : "sync replicas");
        return;
    }
    if (sync) {
        if (h->task >= s->total) {
            shard_refuse(r, DT_WIRE_E_BAD_VALUE, "gradient from worker %u, but the chief declared %d replicas", h->task,
                         s->total);
            return;
        }
        on_sync_push(r);
        return;
    }
    shard_advance(s, &s->parts[h->chunk], shard_grad_floats(s->scratch, r->payload, h->encoding));
    if (h->chunk == 0) s->pushes++, s->updates++;
    if (h->chunk == 0 && s->coord) dt_coord_pushed(s->coord, h->task, h->local_step);
    push_reply(r, DT_WIRE_OK, 0);
    if (s->n_pending) shard_serve_pending(s, r->now, r->io);
}
