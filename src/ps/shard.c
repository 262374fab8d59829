/* The shard's chunks: INIT installs them, PUSH updates them, FETCH copies them whole; the helpers
 * every request uses (replies, refusals, the log). shard.h says what the shard is. */
#include "ps/shard.h"

#include <stdalign.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/error.h"
#include "core/finite.h"
#include "ps/shard_impl.h"
#include "transport/compress.h"

void ps_bytes_release(ps_bytes *b) {
    if (b && b->release) b->release(b->hint);
    if (b) *b = (ps_bytes){0};
}

void shard_log(const ps_shard *s, const char *fmt, ...) {
    FILE *f = s->cfg.log;
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(f, "ps %d: ", s->cfg.ps_index);
    vfprintf(f, fmt, ap);
    fputc('\n', f);
    fflush(f);
    va_end(ap);
}

/* The shard's step: updates applied to every chunk (a chunk may be a step ahead while a gradient
 * is still arriving). */
int64_t shard_step(const ps_shard *s) {
    int64_t t = s->n_parts ? s->parts[0].step : 0;
    for (int c = 1; c < s->n_parts; c++)
        if (s->parts[c].step < t) t = s->parts[c].step;
    return t;
}

int64_t shard_step_max(const ps_shard *s) {
    int64_t t = 0;
    for (int c = 0; c < s->n_parts; c++)
        if (s->parts[c].step > t) t = s->parts[c].step;
    return t;
}

/* A reply header for a request: same request id, this ps's index, step and cut; a request about
 * one chunk gets that chunk's step. */
dt_wire_header shard_reply_to(const ps_shard *s, dt_msg_type type, const dt_wire_header *req) {
    dt_wire_header h = dt_wire_header_make(type, DT_ROLE_PS, (uint16_t)s->cfg.ps_index, req->request_id);
    h.shard = (uint32_t)s->cfg.ps_index;
    h.local_step = req->local_step;
    h.shard_floats = s->n;
    h.generation = s->initialised ? s->generation : 0;
    h.chunks = (uint8_t)s->n_parts;
    int chunked = type == DT_MSG_PARAMS || type == DT_MSG_PUSH_ACK;
    if (chunked && req->chunk < s->n_parts) {
        h.chunk = req->chunk;
        h.global_step = s->parts[req->chunk].step;
    } else {
        h.global_step = shard_step(s);
    }
    return h;
}

static void send_error_v(const ps_shard *s, const ps_io *io, const ps_origin *to, const dt_wire_header *req,
                         int32_t status, const char *fmt, va_list ap) {
    char text[DT_WIRE_MAX_ERROR_TEXT + 1];
    int n = vsnprintf(text, sizeof text, fmt, ap);
    size_t len = n < 0 ? 0 : (size_t)n >= sizeof text ? sizeof text - 1 : (size_t)n;
    dt_wire_header r = shard_reply_to(s, DT_MSG_ERROR, req);
    r.status = status;
    ps_bytes b = {.data = text, .size = len};
    io->send(io->user, to, &r, &b, 0);
}

void shard_send_error(const ps_shard *s, const ps_io *io, const ps_origin *to, const dt_wire_header *req,
                      int32_t status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    send_error_v(s, io, to, req, status, fmt, ap);
    va_end(ap);
}

static void refuse_text(ps_shard *s, const ps_origin *to, const dt_wire_header *h, int32_t status, const char *text,
                        const ps_io *io) {
    s->refused++;
    if (s->refused <= SHARD_LOG_REFUSALS)
        shard_log(s, "refused %s from %s (%s %u): %s", h->type ? dt_wire_type_name(h->type) : "message",
                  to->addr ? to->addr : "?", dt_wire_role_name(h->role), h->task, text);
    else if (s->refused == SHARD_LOG_REFUSALS + 1)
        shard_log(s, "further refusals are counted, not logged");
    shard_send_error(s, io, to, h, status, "%s", text);
}

void shard_refuse(const shard_req *r, int32_t status, const char *fmt, ...) {
    char text[DT_WIRE_MAX_ERROR_TEXT + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    refuse_text(r->s, r->from, r->h, status, text, r->io);
}

void ps_shard_refuse(ps_shard *s, const ps_origin *to, const dt_wire_header *h, int32_t status, const char *text,
                     const ps_io *io) {
    refuse_text(s, to, h, status, text, io);
}

void shard_send(const shard_req *r, dt_wire_header *h) { r->io->send(r->io->user, r->from, h, NULL, 0); }

int shard_owns_task(const ps_shard *s, const ps_origin *from, const dt_wire_header *h) {
    return s->owner && from->serial && (h->role == DT_ROLE_WORKER || h->role == DT_ROLE_CHIEF) &&
           h->task < s->workers && s->owner[h->task] == from->serial;
}

int shard_admit(const shard_req *r, size_t bytes, char *why, size_t why_len) {
    why[0] = '\0';
    ps_origin to = *r->from;
    to.declared = shard_owns_task(r->s, r->from, r->h); /* a worker's replies before strangers' */
    return r->io->admit(r->io->user, &to, bytes, why, why_len) ? 1 : DT_OK;
}

/* ---- Lifecycle and counts --------------------------------------------------------------------- */

int ps_shard_new(ps_shard **out, const ps_shard_config *cfg, dt_error *err) {
    *out = NULL;
    if (cfg->shard_floats == 0 || cfg->shard_floats > DT_WIRE_MAX_SHARD_FLOATS)
        return dt_errorf(err, DT_EINVAL, "ps %d: shard of %zu floats (must be 1..%llu)", cfg->ps_index,
                         cfg->shard_floats, (unsigned long long)DT_WIRE_MAX_SHARD_FLOATS);
    if (cfg->ps_index < 0 || cfg->ps_index > UINT16_MAX)
        return dt_errorf(err, DT_EINVAL, "ps index %d out of range", cfg->ps_index);
    if (cfg->n_ps < 0 || (cfg->n_ps > 0 && cfg->ps_index >= cfg->n_ps))
        return dt_errorf(err, DT_EINVAL, "ps %d: n_ps %d does not include it", cfg->ps_index, cfg->n_ps);
    size_t end = 0;
    for (int r = 0; r < cfg->n_state_ranges; r++) {
        size_t off = cfg->state_ranges[2 * r], cnt = cfg->state_ranges[2 * r + 1];
        if (off < end || cnt > cfg->shard_floats || off > cfg->shard_floats - cnt)
            return dt_errorf(err, DT_EINVAL, "ps %d: state range %d [%zu, +%zu) out of order or outside the shard",
                             cfg->ps_index, r, off, cnt);
        end = off + cnt;
    }
    ps_shard *s = dt_calloc(1, sizeof *s, "ps shard", err);
    if (!s) return DT_ENOMEM;
    s->cfg = *cfg;
    s->n = cfg->shard_floats;
    *out = s;
    return DT_OK;
}

void ps_shard_free(ps_shard *s, const ps_io *io) {
    if (!s) return;
    for (int i = 0; i < s->n_pending; i++) io->drop(io->user, &s->pending[i].from);
    shard_sparse_free(s, io);
    free(s->pending);
    free(s->owner);
    shard_parts_free(s->parts, s->n_parts, s->staleness);
    free(s->scratch), free(s->sum), free(s->stale), free(s->last_seen), free(s->lost), free(s->done);
    free(s->count_from);
    free(s->counts);
    dt_coord_free(s->coord);
    free(s);
}

void ps_shard_get_stats(const ps_shard *s, ps_shard_stats *o) {
    int live = s->aggregate ? s->total - s->n_lost : s->workers - (int)s->n_done;
    *o = (ps_shard_stats){.step = shard_step(s), .pushes = s->pushes, .updates = s->updates, .pulls = s->pulls,
                          .refused = s->refused, .stale = s->n_stale, .weighted = s->n_weighted,
                          .pending = s->n_pending,
                          .pending_bytes = (uint64_t)s->n_pending * sizeof(pending_pull),
                          .initialised = s->initialised, .shutdown = s->shutdown, .live = live > 0 ? live : 0,
                          .workers = s->workers, .sync_bytes = s->sync_bytes};
    shard_sparse_stats(s, o);
}

int ps_shard_is_shut(const ps_shard *s) {
    return s->shutdown;
}

const uint64_t *ps_shard_stale_counts(const ps_shard *s, int *n) {
    *n = s->stale ? s->total : 0;
    return s->stale;
}

uint64_t ps_max_frame(int ps_index, size_t shard_floats) {
    return ps_index == 0 ? dt_wire_max_frame_ps0(shard_floats) : dt_wire_max_frame(shard_floats);
}

/* Everything peers may make the ps hold together (docs/security.md): unfinished messages, large
 * replies not yet sent, deferred PULLs. Room for every worker's pull and gradient of a step in
 * flight at once, four of the largest messages (an INIT, STATE replies) and 64 MiB to spare. */
uint64_t ps_shard_budget(const ps_shard *s) {
    uint64_t shard = (uint64_t)s->n * sizeof(float);
    return 4 * ps_max_frame(s->cfg.ps_index, s->n) + 2 * (uint64_t)(s->workers > 0 ? s->workers : 8) * shard +
           (UINT64_C(64) << 20);
}

/* ---- Chunks: values, snapshots, updates ------------------------------------------------------- */

/* Drops the snapshots a chunk no longer needs: steps before the keep window (async: all but the
 * current step). */
static void part_trim(const ps_shard *s, part_t *p) {
    dt_snap_trim(&p->snaps, p->step - (s->aggregate ? SHARD_SNAP_KEEP - 1 : 0));
}

/* The snapshot of a chunk's current step: the current values themselves after an update, else a
 * copy made now; NULL if every buffer is in flight. */
dt_snap *shard_snap_current(const ps_shard *s, part_t *p, int must_keep) {
    dt_snap *b = dt_snap_find(&p->snaps, p->step);
    if (b) return b;
    part_trim(s, p);
    if ((b = dt_snap_claim(&p->snaps, p->step, must_keep))) memcpy(b->data, p->params, p->n * sizeof(float));
    return b;
}

/* Applies one (mean) gradient to a chunk and moves it to the next step, writing the new values
 * into a free snapshot buffer (the next PULLs send it as is); the old values stay intact for
 * replies still holding them and, in sync mode, EXACT pulls. With every buffer in flight the
 * chunk's own copy takes the update. */
static void advance(ps_shard *s, part_t *p, const float *grads) {
    part_trim(s, p);
    dt_snap *b = dt_snap_claim(&p->snaps, p->step + 1, 0);
    float *out = b ? b->data : p->own;
    /* The optimizer skips the state floats (their slots stay 0); they take their change as it is. */
    dt_opt_skip skip = {s->cfg.state_ranges, s->cfg.n_state_ranges, p->off};
    dt_opt_apply_to(&s->opt, out, p->params, grads, p->state, p->decay, p->n, p->step, &skip);
    for (int r = 0; r < s->cfg.n_state_ranges; r++) {
        size_t lo = s->cfg.state_ranges[2 * r], hi = lo + s->cfg.state_ranges[2 * r + 1];
        if (lo < p->off) lo = p->off;
        if (hi > p->off + p->n) hi = p->off + p->n;
        for (size_t i = lo; i < hi; i++) out[i - p->off] = p->params[i - p->off] + grads[i - p->off];
    }
    p->params = out;
    p->step++;
    part_trim(s, p);
}

static void accum_clear(accum *a) {
    for (int k = 0; k < a->count; k++) ps_bytes_release(&a->grad[k]);
    a->count = 0;
    a->step = -1;
}

static void part_free(part_t *p, int accumulators) {
    dt_snap_pool_retire(&p->snaps);
    free(p->own);
    free(p->state);
    free(p->decay);
    for (int i = 0; p->acc && i < accumulators; i++) {
        accum_clear(&p->acc[i]);
        free(p->acc[i].worker);
        free(p->acc[i].grad);
        free(p->acc[i].enc);
        free(p->acc[i].examples);
    }
    free(p->acc);
    memset(p, 0, sizeof *p);
}

void shard_parts_free(part_t *parts, int n, int staleness) {
    for (int c = 0; parts && c < n; c++) part_free(&parts[c], parts[c].acc ? staleness + 1 : 0);
    free(parts);
}

/* The optimizer fields of WELCOME and STATE (all zero before INIT: sgd, 0 slots). */
void shard_put_optimizer(const ps_shard *s, dt_wire_header *r) {
    r->opt_kind = (uint8_t)s->opt.kind;
    r->opt_slots = (uint8_t)s->slots;
    r->learning_rate = s->opt.learning_rate;
    r->momentum = s->opt.momentum;
    r->beta1 = s->opt.beta1;
    r->beta2 = s->opt.beta2;
    r->epsilon = s->opt.epsilon;
}

/* ---- FETCH ------------------------------------------------------------------------------------ */

static void release_free(void *p) { free(p); }

void *shard_reply_buffer(const shard_req *r, size_t bytes) {
    char why[320];
    if (shard_admit(r, bytes, why, sizeof why)) { /* before the copy: a refused reply costs nothing */
        shard_refuse(r, DT_WIRE_E_BUSY, "%s", why);
        return NULL;
    }
    void *d = malloc(bytes ? bytes : 1);
    if (!d) {
        r->io->unadmit(r->io->user, r->from, bytes);
        shard_refuse(r, DT_WIRE_E_NOMEM, "out of memory for a %s reply", dt_wire_type_name(r->h->type));
    }
    return d;
}

void shard_send_buffer(const shard_req *r, dt_wire_header *h, void *d, size_t bytes) {
    ps_bytes b = {.data = d, .size = bytes, .release = release_free, .hint = d};
    r->io->send(r->io->user, r->from, h, &b, bytes);
}

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
    const uint64_t each = sizeof(uint16_t) + sizeof(ps_bytes) + sizeof(uint8_t) + sizeof(uint32_t); /* accum's arrays */
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

/* A gradient's payload as aligned float32 (nothing promises alignment: copied if needed; a 16-bit
 * encoding is unpacked, exactly). into: where a copy goes (the scratch buffer, or the sum). */
static const float *grad_floats(float *into, const ps_bytes *m, uint8_t enc) {
    const float *g = m->data;
    if (enc == DT_ENC_FP32 && (uintptr_t)g % alignof(float) == 0) return g;
    dt_unpack(enc, into, g, m->size / dt_enc_size(enc));
    return into;
}

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

/* Sorts a step's gradients by worker index (insertion sort; count is small). */
static void accum_sort(accum *a) {
    for (int i = 1; i < a->count; i++)
        for (int j = i; j > 0 && a->worker[j - 1] > a->worker[j]; j--) {
            uint16_t w = a->worker[j];
            a->worker[j] = a->worker[j - 1], a->worker[j - 1] = w;
            ps_bytes g = a->grad[j];
            a->grad[j] = a->grad[j - 1], a->grad[j - 1] = g;
            uint8_t e = a->enc[j];
            a->enc[j] = a->enc[j - 1], a->enc[j - 1] = e;
            uint32_t x = a->examples[j];
            a->examples[j] = a->examples[j - 1], a->examples[j - 1] = x;
        }
}

/* Whether a step's gradients are weighted by their examples: when each says how many it averages
 * and they do not all say the same. Otherwise each weighs 1: the plain mean, bit for bit as before
 * gradients said their examples (x * 1 is exact), and an older client's gradients (0: not said). */
static int step_weighted(const accum *a, float *div) {
    int unequal = 0, unsaid = 0;
    uint64_t total = 0;
    for (int k = 0; k < a->count; k++) {
        unsaid |= a->examples[k] == 0;
        unequal |= a->examples[k] != a->examples[0];
        total += a->examples[k];
    }
    int weighted = unequal && !unsaid;
    *div = weighted ? (float)total : (float)a->count;
    return weighted;
}

static void log_weighted(ps_shard *s, const accum *a, float div) {
    if (++s->n_weighted > SHARD_LOG_WEIGHTED) return;
    char each[96] = ""; /* the first 8 counts: 8 x ", 1048576" fit */
    for (int k = 0, len = 0; k < a->count && k < 8; k++)
        len += snprintf(each + len, sizeof each - (size_t)len, "%s%u", k ? ", " : "", a->examples[k]);
    shard_log(s, "step %lld: the mean of %d gradient(s) weighted by their examples (%s%s; %.0f in all)%s",
              (long long)a->step, a->count, each, a->count > 8 ? "..." : "", (double)div,
              s->n_weighted == SHARD_LOG_WEIGHTED ? "; further weighted steps are counted" : "");
}

/* Applies the mean of a chunk's gradients of its current step, summed in worker-index order (so
 * the result does not depend on arrival order), each weighted by its examples when they differ
 * (step_weighted: the mean over the examples the step trained), and moves it to the next step. */
static int apply_sync_step(ps_shard *s, part_t *p) {
    accum *a = &p->acc[p->step % (s->staleness + 1)];
    if (!DT_ASSERT(a->count > 0 && a->step == p->step)) return 0;
    accum_sort(a);
    /* mean = ((w0 g0 + w1 g1) + w2 g2 ...) / div in count - 1 passes: the first reads g0 and g1
     * where they arrived, the division rides on the last; a single gradient is its own mean (no
     * copy). The later gradients may use the scratch buffer, so a misaligned or 16-bit g0 goes to sum. */
    const size_t n = p->n;
    const float *mean = s->sum;
    if (a->count == 1) {
        mean = grad_floats(s->scratch, &a->grad[0], a->enc[0]);
    } else {
        float *sum = s->sum, div;
        const int weighted = step_weighted(a, &div);
        const float *g0 = grad_floats(sum, &a->grad[0], a->enc[0]);
        for (int k = 1; k < a->count; k++) {
            const float *g = grad_floats(s->scratch, &a->grad[k], a->enc[k]), *acc = k == 1 ? g0 : sum;
            const float wa = weighted && k == 1 ? (float)a->examples[0] : 1.0f;
            const float wk = weighted ? (float)a->examples[k] : 1.0f;
            if (k < a->count - 1)
                for (size_t i = 0; i < n; i++) sum[i] = wa * acc[i] + wk * g[i];
            else
                for (size_t i = 0; i < n; i++) sum[i] = (wa * acc[i] + wk * g[i]) / div;
        }
        if (weighted && p == &s->parts[0]) log_weighted(s, a, div);
    }
    shard_snap_current(s, p, 1); /* kept for EXACT pulls of this step from workers that see another chunk ahead */
    const int64_t t = p->step;
    advance(s, p, mean);
    /* Chunk 0 counts whole gradients: the coordinator's claims for step t settle here. */
    if (p == &s->parts[0] && s->coord) dt_coord_applied(s->coord, t, a->worker, a->count);
    accum_clear(a);
    if (p == &s->parts[0]) s->updates++;
    return 1;
}

/* Applies every complete step of a chunk (with staleness, later steps may be complete already);
 * whether any was. */
int shard_apply_complete_steps(ps_shard *s, part_t *p) {
    int any = 0;
    for (;;) {
        accum *a = &p->acc[p->step % (s->staleness + 1)];
        if (a->count == 0 || a->step != p->step || a->count < shard_needed_at(s, p->step)) return any;
        if (!apply_sync_step(s, p)) return any;
        any = 1;
    }
}

/* A copy of borrowed bytes that owns itself: DT_OK, or DT_ENOMEM with b unchanged. */
static int keep_copy(ps_bytes *b) {
    void *c = malloc(b->size ? b->size : 1);
    if (!c) return DT_ENOMEM;
    memcpy(c, b->data, b->size);
    *b = (ps_bytes){.data = c, .size = b->size, .release = release_free, .hint = c};
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
    ps_bytes g = *r->payload;
    if (!g.release && keep_copy(&g)) { /* borrowed bytes: kept as a copy */
        shard_refuse(r, DT_WIRE_E_NOMEM, "out of memory for a gradient");
        return;
    }
    *r->payload = (ps_bytes){0};
    if (k < a->count) {
        /* A second gradient from one worker for one step: the worker restarted (or gave up waiting
         * and pulled again) and computed it afresh. The newer one replaces the first. */
        if (h->chunk == 0)
            shard_log(s, "worker %u sent step %lld's gradient again (restarted?): the newer one replaces it", h->task,
                      (long long)t);
        ps_bytes_release(&a->grad[k]);
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
    advance(s, &s->parts[h->chunk], grad_floats(s->scratch, r->payload, h->encoding));
    if (h->chunk == 0) s->pushes++, s->updates++;
    if (h->chunk == 0 && s->coord) dt_coord_pushed(s->coord, h->task, h->local_step);
    push_reply(r, DT_WIRE_OK, 0);
    if (s->n_pending) shard_serve_pending(s, r->now, r->io);
}
