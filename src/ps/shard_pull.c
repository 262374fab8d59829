/* PULL: PARAMS replies (zero-copy from a step's snapshot, or packed into 16 bits) and the PULLs
 * held until their chunk reaches the step they ask for (the sync barrier). */
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/error.h"
#include "ps/shard_impl.h"
#include "transport/compress.h"

/* ---- PARAMS ----------------------------------------------------------------------------------- */

enum { PARAMS_OK = 0, PARAMS_BUSY = 1, PARAMS_GONE = 2, PARAMS_RANGE = 3, PARAMS_NOMEM = 4 };

static void release_snap(void *b) { dt_snap_release(b); }
static void release_free(void *p) { free(p); }

/* A PARAMS payload in a 16-bit encoding: packed from the float32 values into a buffer of its own.
 * PARAMS_RANGE if a value does not fit fp16 (nothing is sent: a parameter has no error feedback to
 * carry the remainder, and a saturated one would be silently wrong). */
static int params_packed(const shard_req *r, const part_t *p, const float *values, uint8_t enc, dt_bytes *out,
                         char *why, size_t why_len) {
    const size_t bytes = p->n * dt_enc_size(enc);
    if (shard_admit(r, bytes, why, why_len)) return PARAMS_BUSY;
    void *packed = malloc(bytes ? bytes : 1);
    if (!packed || dt_pack(enc, packed, values, p->n)) {
        r->io->unadmit(r->io->user, r->from, bytes);
        free(packed);
        return packed ? PARAMS_RANGE : PARAMS_NOMEM;
    }
    *out = (dt_bytes){.data = packed, .size = bytes, .release = release_free, .hint = packed};
    return PARAMS_OK;
}

/* The payload of a PARAMS reply of chunk p at `step` (the current one, or a kept one) in encoding
 * enc (admitted against the caller's budget): PARAMS_OK or why not. */
static int params_payload(const shard_req *r, part_t *p, int64_t step, uint8_t enc, dt_bytes *out, char *why,
                          size_t why_len) {
    const size_t bytes = p->n * sizeof(float);
    if (enc != DT_ENC_FP32) { /* packed from the current values or a kept step's: no snapshot needed */
        if (step == p->step) return params_packed(r, p, p->params, enc, out, why, why_len);
        dt_snap *k = dt_snap_find(&p->snaps, step);
        return k ? params_packed(r, p, k->data, enc, out, why, why_len) : PARAMS_GONE;
    }
    dt_snap *b = step == p->step ? shard_snap_current(r->s, p, 0) : dt_snap_find(&p->snaps, step);
    if (!b && step != p->step) return PARAMS_GONE;
    if (shard_admit(r, bytes, why, why_len)) return PARAMS_BUSY;
    if (b) {
        dt_snap_hold(b);
        *out = (dt_bytes){.data = b->data, .size = bytes, .release = release_snap, .hint = b};
        return PARAMS_OK;
    }
    float *copy = malloc(bytes ? bytes : 1); /* every buffer still in flight: a copy of its own */
    if (!copy) {
        r->io->unadmit(r->io->user, r->from, bytes);
        return PARAMS_NOMEM;
    }
    memcpy(copy, p->params, bytes);
    *out = (dt_bytes){.data = copy, .size = bytes, .release = release_free, .hint = copy};
    return PARAMS_OK;
}

/* The ERROR for a PARAMS reply that could not be built. */
static void params_refused(const shard_req *r, const part_t *p, int64_t step, int why, const char *busy) {
    const ps_shard *s = r->s;
    const dt_wire_header *req = r->h;
    if (why == PARAMS_GONE)
        shard_send_error(s, r->io, r->from, req, DT_WIRE_E_GONE, "ps %d: step %lld of chunk %u is no longer kept (now "
                         "at step %lld, keeping the last %d)", s->cfg.ps_index, (long long)step, req->chunk,
                         (long long)p->step, SHARD_SNAP_KEEP);
    else if (why == PARAMS_RANGE)
        shard_send_error(s, r->io, r->from, req, DT_WIRE_E_BAD_VALUE, "ps %d: a parameter of chunk %u at step %lld is "
                         "beyond fp16's range (+-65504): pull in bf16 or float32 (--compression)", s->cfg.ps_index,
                         req->chunk, (long long)step);
    else if (why == PARAMS_BUSY)
        shard_send_error(s, r->io, r->from, req, DT_WIRE_E_BUSY, "%s", busy);
    else
        shard_send_error(s, r->io, r->from, req, DT_WIRE_E_NOMEM, "ps %d: out of memory for a PARAMS reply",
                         s->cfg.ps_index);
}

/* Answers a PULL (or a PUSH that asked for PARAMS), r->h, with its chunk's values at the step it
 * asked for: the current step, or for an EXACT pull of an earlier step its kept snapshot (else
 * ERROR 109). waited_us, and a push's status and stale count, go into the reply. */
static void send_params(const shard_req *r, int64_t waited_us, int32_t status, uint64_t stale) {
    ps_shard *s = r->s;
    const dt_wire_header *req = r->h;
    part_t *p = &s->parts[req->chunk];
    int64_t step = (req->flags & DT_WIRE_F_EXACT) ? req->global_step : p->step;
    dt_bytes b = {0};
    char why[320];
    int rc = params_payload(r, p, step, req->encoding, &b, why, sizeof why);
    if (rc != PARAMS_OK) {
        params_refused(r, p, step, rc, why);
        return;
    }
    dt_wire_header h = shard_reply_to(s, DT_MSG_PARAMS, req);
    h.global_step = step;
    h.encoding = req->encoding;
    h.status = status;
    h.params.waited_us = waited_us > 0 ? (uint64_t)waited_us : 0;
    h.params.stale_count = stale;
    if (req->chunk == 0) s->pulls++;
    r->io->send(r->io->user, r->from, &h, &b, b.size);
}

/* Whether a PULL can be answered now: a minimum step reached, or an exact step reached (a passed
 * exact step is answered too: from its snapshot, or with ERROR 109). */
static int pull_ready(const ps_shard *s, const dt_wire_header *req) {
    return req->global_step <= s->parts[req->chunk].step;
}

/* ---- Deferred PULLs --------------------------------------------------------------------------- */

/* Answers every deferred PULL with an ERROR: the ps is shutting down, was re-initialised (the
 * steps they wait for may never come) or has stopped the job (strict). */
void shard_fail_pending(ps_shard *s, const ps_io *io, int32_t status, const char *text) {
    shard_sparse_fail(s, io, status, text);
    for (int i = 0; i < s->n_pending; i++) {
        pending_pull *p = &s->pending[i];
        shard_send_error(s, io, &p->from, &p->req, status, "ps %d: %s", s->cfg.ps_index, text);
        io->drop(io->user, &p->from);
    }
    s->n_pending = 0;
}

/* Removes the deferred PULLs that keep(s, p, user) rejects (their origins dropped; keep may have
 * answered them), keeping the others in order. */
static void pending_filter(ps_shard *s, const ps_io *io, int (*keep)(ps_shard *, const ps_io *, pending_pull *, void *),
                           void *user) {
    int kept = 0;
    for (int i = 0; i < s->n_pending; i++) {
        pending_pull *p = &s->pending[i];
        if (!keep(s, io, p, user)) {
            io->drop(io->user, &p->from);
            continue;
        }
        if (kept != i) s->pending[kept] = *p;
        kept++;
    }
    s->n_pending = kept;
}

static int keep_unready(ps_shard *s, const ps_io *io, pending_pull *p, void *now) {
    if (!pull_ready(s, &p->req)) return 1;
    const int64_t t = *(const int64_t *)now;
    shard_req r = {.s = s, .from = &p->from, .h = &p->req, .now = t, .io = io};
    send_params(&r, t - p->since_us, p->status, p->stale);
    shard_saw_worker(s, &p->req, t);
    return 0;
}

/* Answers the deferred PULLs whose step has been reached (all of them with an ERROR when the ps
 * is shutting down). */
void shard_serve_pending(ps_shard *s, int64_t now, const ps_io *io) {
    if (s->shutdown) {
        shard_fail_pending(s, io, DT_WIRE_E_SHUTDOWN, "shutting down (training is over)");
        return;
    }
    if (s->n_pending) pending_filter(s, io, keep_unready, &now);
}

static int keep_other_conn(ps_shard *s, const ps_io *io, pending_pull *p, void *gone) {
    return p->from.conn != gone;
}

void ps_shard_forget(ps_shard *s, const void *conn, const ps_io *io) {
    if (s->n_pending && conn) pending_filter(s, io, keep_other_conn, (void *)conn);
    shard_sparse_forget(s, conn, io);
}

/* How long a deferred PULL is held: its client gives up after twice the liveness timeout (sync),
 * so holding it much longer only holds memory; at least a minute, whatever a client's timeout. */
static int64_t pending_max_wait(const ps_shard *s) {
    int64_t t = 4 * s->liveness_us;
    return t < 60 * INT64_C(1000000) ? 60 * INT64_C(1000000)
                                     : t > SHARD_PENDING_MAX_WAIT_US ? SHARD_PENDING_MAX_WAIT_US : t;
}

static int keep_fresh(ps_shard *s, const ps_io *io, pending_pull *p, void *now) {
    if (*(int64_t *)now - p->since_us <= pending_max_wait(s)) return 1;
    shard_send_error(s, io, &p->from, &p->req, DT_WIRE_E_BUSY, "ps %d: step %lld did not come within %lld s",
                     s->cfg.ps_index, (long long)p->req.global_step, (long long)(pending_max_wait(s) / 1000000));
    return 0;
}

void shard_expire_pending(ps_shard *s, int64_t now, const ps_io *io) {
    if (s->n_pending) pending_filter(s, io, keep_fresh, &now);
    shard_sparse_expire(s, now, io);
}

/* Whether worker w has a PULL held here: it is waiting at the barrier, alive however long. */
int shard_has_pending(const ps_shard *s, int w) {
    if (shard_sparse_has_pending(s, w)) return 1;
    for (int i = 0; i < s->n_pending; i++)
        if (s->pending[i].req.task == w && s->pending[i].req.role != DT_ROLE_PS) return 1;
    return 0;
}

/* The latest step a deferred PULL may wait for: sync, the next step a worker can push for (a
 * worker runs at most staleness steps ahead), plus one for an exact pull of a chunk ahead; async,
 * a bounded distance. Later steps cannot come soon: the PULL is refused, not held. */
static int64_t pull_horizon(const ps_shard *s, const part_t *p) {
    return p->step + (s->aggregate ? s->staleness + 2 : SHARD_ASYNC_AHEAD);
}

/* Keeps a deferred PULL unless it is an earlier connection's under the quota of the task of the
 * PULL that now takes its place (answered ERROR 106, which its client retries). */
static int keep_not_superseded(ps_shard *s, const ps_io *io, pending_pull *p, void *user) {
    const shard_req *r = user;
    if (!p->owned || p->req.task != r->h->task || p->from.conn == r->from->conn) return 1;
    shard_send_error(s, io, &p->from, &p->req, DT_WIRE_E_BUSY, "ps %d: worker %u's PULLs from another connection "
                     "took this one's place", s->cfg.ps_index, r->h->task);
    return 0;
}

/* Whether the table has room for r's PULL (an earlier connection of its task gives way); else
 * refused. */
static int pending_room(const shard_req *r, int owned) {
    ps_shard *s = r->s;
    int mine = 0, strangers = 0, task_owned = 0;
    for (int i = 0; i < s->n_pending; i++) {
        const pending_pull *q = &s->pending[i];
        mine += r->from->conn && q->from.conn == r->from->conn;
        strangers += !q->owned;
        task_owned += q->owned && q->req.task == r->h->task;
    }
    if (mine >= DT_PS_PENDING_PER_PEER) {
        shard_refuse(r, DT_WIRE_E_BUSY, "this connection already has %d PULLs waiting", DT_PS_PENDING_PER_PEER);
        return 0;
    }
    if (!owned && strangers >= SHARD_MAX_PENDING) {
        shard_refuse(r, DT_WIRE_E_BUSY, "too many PULLs waiting for a later step (%d)", SHARD_MAX_PENDING);
        return 0;
    }
    if (owned && task_owned >= DT_PS_PENDING_PER_PEER) pending_filter(s, r->io, keep_not_superseded, (void *)r);
    if (!s->pending) {
        s->cap_pending = SHARD_MAX_PENDING + (s->workers > 0 ? s->workers : 0) * DT_PS_PENDING_PER_PEER;
        if (!(s->pending = dt_calloc((size_t)s->cap_pending, sizeof *s->pending, "ps pending pulls", NULL))) {
            s->cap_pending = 0;
            shard_refuse(r, DT_WIRE_E_NOMEM, "out of memory for a deferred PULL");
            return 0;
        }
    }
    /* The quotas above keep the table from filling; never overrun it. */
    if (!DT_ASSERT(s->n_pending < s->cap_pending)) {
        shard_refuse(r, DT_WIRE_E_BUSY, "too many PULLs waiting for a later step");
        return 0;
    }
    return 1;
}

/* Answers a PULL now or holds it until its chunk reaches the step (status, stale: a PUSH's outcome
 * to report with the PARAMS). */
void shard_answer_pull(const shard_req *r, int32_t status, uint64_t stale) {
    ps_shard *s = r->s;
    const dt_wire_header *h = r->h;
    if (pull_ready(s, h)) {
        send_params(r, 0, status, stale);
        return;
    }
    const part_t *p = &s->parts[h->chunk];
    if (h->global_step > pull_horizon(s, p)) {
        shard_refuse(r, DT_WIRE_E_BAD_VALUE, "PULL waits for step %lld, but this ps is at step %lld and holds PULLs "
                     "for at most step %lld", (long long)h->global_step, (long long)p->step,
                     (long long)pull_horizon(s, p));
        return;
    }
    /* A worker's own PULLs (from the connection that pushes as that task) have a quota of their
     * own: strangers filling the table cannot hold up the barrier. */
    const int owned = shard_owns_task(s, r->from, h);
    if (!pending_room(r, owned)) return;
    pending_pull *q = &s->pending[s->n_pending];
    if (r->io->hold(r->io->user, r->from, &q->from)) {
        shard_refuse(r, DT_WIRE_E_NOMEM, "out of memory for a deferred PULL");
        return;
    }
    s->n_pending++;
    q->req = *h;
    q->owned = owned;
    q->since_us = r->now;
    q->status = status;
    q->stale = stale;
}

/* A PULL (the dispatch table checked readiness and the cut). */
void shard_on_pull(const shard_req *r) { shard_answer_pull(r, DT_WIRE_OK, 0); }
