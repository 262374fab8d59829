#include "ps/ps.h"

#include <errno.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "compute/optim.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/finite.h"
#include "metrics/metrics.h"
#include "metrics/names.h"
#include "ps/peers.h"
#include "ps/snapshots.h"
#include "transport/auth.h"
#include "transport/compress.h"
#include "transport/wire.h"
#include "transport/zmq_io.h"

#define MAX_PENDING 4096      /* deferred PULLs (waiting for a later step) of strangers, bounded; each worker has its own quota */
#define PENDING_PER_PEER DT_PS_PENDING_PER_PEER
#define ASYNC_AHEAD 1024      /* async: a deferred PULL may wait for at most this many steps ahead */
#define PENDING_MAX_WAIT_US (600 * INT64_C(1000000)) /* no deferred PULL is held longer (async) */
#define SEND_HWM (2 * (int)DT_WIRE_MAX_CHUNKS + 16) /* replies queued per connection: more than a client ever awaits (a push and a pull of every chunk) */
/* Whole requests libzmq queues per connection: no limit. A connection whose queue is full stops
 * being read, and in libzmq 4.3 a hang-up on it followed by a ZMTP PING already read behind the
 * queued requests aborts the process (stream_engine_base.cpp, !_io_error): any peer could do it.
 * The ps bounds a flood itself instead (peers.c: the heap beyond what is counted). */
#define RECV_HWM 0
#define QUEUED_ASSUMED 4      /* for peers.c's looser check while not drained: whole messages assumed queued */
#define FIRST_MESSAGE_US (10 * INT64_C(1000000))  /* a new connection's first message, at the latest */
#define MESSAGE_US (120 * INT64_C(1000000))       /* a large message, once begun, must finish */
#define MAX_CONNECTIONS 1024
#define PEER_SILENCE_MS 30000 /* a connection with no traffic at all (not even its heartbeats) for this long is cut */
#define LOG_DONE 20           /* DONE lines from tasks not (yet) known as workers: logged one by one, then counted */
#define DRAIN_US 20000        /* reading the router at most this long before checking *stop and the deadlines */
#define LOG_REFUSALS 20       /* refusals logged one by one; later ones only counted */
#define LOG_STALE 3           /* stale gradients logged one by one per worker; later ones counted */
#define SHUTDOWN_LINGER_MS 1000
#define SNAP_KEEP 4           /* sync mode: steps whose snapshot is kept for EXACT pulls */
#define MAX_IO_THREADS 4      /* ZeroMQ I/O threads of a ps: one per core up to this */

/* A PULL waiting for a later step of its chunk (the sync barrier), or the pull half of a PUSH
 * that asked for PARAMS. */
typedef struct {
    zmq_msg_t identity;
    dt_wire_header req;
    dt_peer *peer;            /* its connection (a reference), NULL if unknown */
    int owned;                /* from the connection that pushes as its worker task (that task's quota, not strangers') */
    int64_t since_us;         /* when it arrived (its barrier wait is reported in the reply) */
    int32_t status;           /* a PUSH's outcome (OK, STALE), reported with the PARAMS */
    uint64_t stale;           /* that worker's stale gradients so far */
} pending_pull;

/* What a large reply's free function releases: the snapshot it was sent from, or its own buffer,
 * and its bytes in the connection's count of replies in flight. */
typedef struct {
    dt_snap *snap;
    void *own;
    dt_peer *peer;
    size_t bytes;
} reply_hold;

/* Sync mode: the gradients received for one step of one part, held as received (no copy) until
 * replicas_to_aggregate of them are in; then summed in worker-index order. */
typedef struct {
    int64_t step;             /* -1: empty */
    int count;
    uint16_t *worker;         /* [aggregate] */
    zmq_msg_t *grad;          /* [aggregate] payloads */
    uint8_t *enc;             /* [aggregate] their encodings (workers may differ) */
} accum;

/* One chunk of the shard (docs/protocol.md, "Chunks"): its own values, optimizer state, step,
 * snapshots and (sync) gradient accumulators, so each chunk is applied and sent back as soon as
 * its gradients are in while later chunks are still on the wire. */
typedef struct {
    size_t off, n;            /* floats [off, off + n) of the shard */
    float *params;            /* [n] the current values: own, or the current step's snapshot */
    float *own;               /* [n] the ps's private copy, when no snapshot buffer is free (and after INIT) */
    float *state;             /* [slots * n], slot-major as dt_opt_apply wants */
    uint8_t *decay;           /* [n] 1 where weight decay applies (INIT's mask); NULL: no weight decay */
    dt_snap_pool snaps;
    int64_t step;             /* updates applied to this part */
    accum *acc;               /* sync: [staleness + 1], step t in acc[t % (staleness + 1)] */
} part_t;

typedef struct {
    const dt_ps_config *cfg;
    size_t n;                 /* shard floats */
    void *ctx, *sock;
    dt_zap *zap;              /* --auth=curve: the ZAP handler thread */
    dt_peers *peers;          /* the connections, watched and bounded (peers.h) */
    dt_peer *peer;            /* the connection of the message being handled (NULL: unknown) */
    int64_t peers_checked_us;
    int workers;              /* from INIT: worker tasks in the cluster (0: not told) */
    part_t *parts;            /* [n_parts], the shard cut as INIT said; NULL before INIT */
    int n_parts;
    float *scratch;           /* [largest part] aligned float32 copy of a misaligned or 16-bit gradient frame */
    float *sum;               /* sync: [largest part] the mean gradient of a step */
    dt_opt_config opt;
    int slots, initialised, shutdown;
    uint8_t generation;       /* of the INIT that set the shard (1..255), reported in every reply */
    uint64_t pushes, updates, pulls, refused; /* pushes and updates counted on chunk 0: whole gradients */
    uint64_t budget;          /* everything peers may make this ps hold (peers_budget) */
    pending_pull *pending;    /* [cap_pending]: MAX_PENDING for strangers, a quota per worker task */
    int n_pending, cap_pending;
    uint64_t *owner;          /* [workers] the connection (dt_peer_serial) that latest pushed as each worker task */
    uint64_t n_done_logged;
    uint8_t *done;            /* [65536 / 8] bitmap of worker tasks that sent DONE (lazily allocated) */
    uint64_t n_done;
    /* Sync replicas (INIT's configuration): aggregate == 0 means asynchronous. */
    int aggregate, total, staleness;
    uint64_t *stale;          /* [total] stale gradients per worker */
    uint64_t n_stale;
    /* Worker liveness (sync mode): the traffic is the heartbeat. A worker that sends nothing for
     * liveness_us is lost, and each step then waits for at most the live workers' gradients (or,
     * strict, the job stops). A lost worker that speaks again is back. */
    int64_t liveness_us;      /* 0: workers are never lost */
    int strict;
    int64_t *last_seen;       /* [total] monotonic us of each worker's latest message */
    uint8_t *lost;            /* [total] */
    int n_lost;
    char failed[320];         /* strict mode after a loss: why every request is now refused */
    int64_t failed_at_us;
    int64_t last_message_us;  /* any client's latest message (the idle deadline) */
    /* Metrics (NULL series when off): the counts above, published once per loop (ps_publish). */
    struct {
        dt_metric *step, *pushes, *updates, *pulls, *refused, *live, *rx, *tx, *wait;
        uint64_t stale_seen;
    } m;
} ps_t;

static void ps_log(ps_t *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ps_log(ps_t *ps, const char *fmt, ...) {
    FILE *f = ps->cfg->log;
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(f, "ps %d: ", ps->cfg->ps_index);
    vfprintf(f, fmt, ap);
    fputc('\n', f);
    fflush(f);
    va_end(ap);
}

/* The shard's step: updates applied to every chunk (a chunk may be a step ahead while a gradient
 * is still arriving). */
static int64_t shard_step(const ps_t *ps) {
    int64_t s = ps->n_parts ? ps->parts[0].step : 0;
    for (int c = 1; c < ps->n_parts; c++)
        if (ps->parts[c].step < s) s = ps->parts[c].step;
    return s;
}

static int64_t shard_step_max(const ps_t *ps) {
    int64_t s = 0;
    for (int c = 0; c < ps->n_parts; c++)
        if (ps->parts[c].step > s) s = ps->parts[c].step;
    return s;
}

/* A reply header for a request: same request id, this ps's index, step and cut; a request about
 * one chunk gets that chunk's step. */
static dt_wire_header reply_to(const ps_t *ps, dt_msg_type type, const dt_wire_header *req) {
    dt_wire_header h = dt_wire_header_make(type, DT_ROLE_PS, (uint16_t)ps->cfg->ps_index, req->request_id);
    h.shard = (uint32_t)ps->cfg->ps_index;
    h.local_step = req->local_step;
    h.shard_floats = ps->n;
    h.generation = ps->initialised ? ps->generation : 0;
    h.chunks = (uint8_t)ps->n_parts;
    int chunked = type == DT_MSG_PARAMS || type == DT_MSG_PUSH_ACK;
    if (chunked && req->chunk < ps->n_parts) {
        h.chunk = req->chunk;
        h.global_step = ps->parts[req->chunk].step;
    } else {
        h.global_step = shard_step(ps);
    }
    return h;
}

static void refuse(ps_t *ps, zmq_msg_t *identity, const dt_wire_in *in, int32_t status, const char *msg) {
    ps->refused++;
    if (ps->refused <= LOG_REFUSALS)
        ps_log(ps, "refused %s from %s (%s %u): %s", in->hdr.type ? dt_wire_type_name(in->hdr.type) : "message",
               in->peer, dt_wire_role_name(in->hdr.role), in->hdr.task, msg);
    else if (ps->refused == LOG_REFUSALS + 1)
        ps_log(ps, "further refusals are counted, not logged");
    dt_wire_header r = reply_to(ps, DT_MSG_ERROR, &in->hdr);
    dt_wire_send_error(ps->sock, identity, r, status, "%s", msg);
}

/* ---- Large replies ---------------------------------------------------------------------------- */

/* What one connection may have in large replies not yet handed to the kernel: two of the largest
 * messages (a step's chunks of PARAMS fit many times). */
static uint64_t peer_reply_budget(const ps_t *ps) { return 2 * dt_wire_max_frame(ps->n); }

/* libzmq's I/O thread is done with a large reply. */
static void reply_release(void *data, void *hint) {
    (void)data;
    reply_hold *h = hint;
    if (h->snap) dt_snap_release(h->snap);
    free(h->own);
    dt_peer_reply_done(h->peer, h->bytes);
    free(h);
}

/* Counts a large reply of `bytes` to peer before anything is built or copied for it: DT_OK, 1 if
 * it would take the connection past its own budget, 4 if it would take everything peers make the
 * ps hold past the ps's budget. */
static int reply_admit(ps_t *ps, dt_peer *peer, size_t bytes) {
    int r = dt_peer_reply_begin(ps->peers, peer, bytes, peer_reply_budget(ps));
    return r > 0 ? DT_OK : r == 0 ? 1 : 4;
}

/* The text of ERROR 106 for reply_admit's 1 or 4. */
static void busy_text(const ps_t *ps, int why, char *msg, size_t n) {
    if (why == 4)
        snprintf(msg, n, "ps %d: its peers hold %llu bytes of its memory, at its budget of %llu: ask again shortly",
                 ps->cfg->ps_index, (unsigned long long)dt_peers_held(ps->peers), (unsigned long long)ps->budget);
    else
        snprintf(msg, n, "ps %d: earlier replies to this connection (%llu bytes at most) are still unread: read them "
                 "first", ps->cfg->ps_index, (unsigned long long)peer_reply_budget(ps));
}

/* A large reply admitted by reply_admit, zero-copy from a snapshot (snap) or from a buffer it then
 * owns (own, freed with it): DT_ENOMEM (own freed, the admission undone) or DT_OK. */
static int reply_attach(dt_peer *peer, zmq_msg_t *m, void *data, size_t bytes, dt_snap *snap, void *own) {
    reply_hold *h = NULL;
    if (!(h = malloc(sizeof *h))) {
        dt_peer_reply_done(peer, bytes);
        free(own);
        return DT_ENOMEM;
    }
    *h = (reply_hold){.snap = snap, .own = own, .peer = peer, .bytes = bytes};
    if (snap) dt_snap_hold(snap);
    if (zmq_msg_init_data(m, data, bytes, reply_release, h) != 0) {
        reply_release(data, h);
        return DT_ENOMEM;
    }
    return DT_OK;
}

static int reply_msg(ps_t *ps, dt_peer *peer, zmq_msg_t *m, void *data, size_t bytes, dt_snap *snap) {
    int rc = reply_admit(ps, peer, bytes);
    return rc ? rc : reply_attach(peer, m, data, bytes, snap, NULL);
}

/* ---- Parts: values, snapshots, updates -------------------------------------------------------- */

/* Drops the snapshots a part no longer needs: steps before the keep window (async: all but the
 * current step). */
static void part_trim(const ps_t *ps, part_t *p) {
    dt_snap_trim(&p->snaps, p->step - (ps->aggregate ? SNAP_KEEP - 1 : 0));
}

/* The snapshot of a part's current step: the current values themselves after an update, else a
 * copy made now; NULL if every buffer is in flight. */
static dt_snap *snap_current(const ps_t *ps, part_t *p) {
    dt_snap *b = dt_snap_find(&p->snaps, p->step);
    if (b) return b;
    part_trim(ps, p);
    if ((b = dt_snap_claim(&p->snaps, p->step))) memcpy(b->data, p->params, p->n * sizeof(float));
    return b;
}

/* Applies one (mean) gradient to a part and moves it to the next step, writing the new values
 * into a free snapshot buffer (the next PULLs send it as is); the old values stay intact for
 * messages still holding them and, in sync mode, EXACT pulls. With every buffer in flight the
 * part's own copy takes the update. */
static void advance(ps_t *ps, part_t *p, const float *grads) {
    part_trim(ps, p);
    dt_snap *b = dt_snap_claim(&p->snaps, p->step + 1);
    float *out = b ? b->data : p->own;
    /* The optimizer skips the state floats (their slots stay 0); they take their change as it is. */
    dt_opt_skip skip = {ps->cfg->state_ranges, ps->cfg->n_state_ranges, p->off};
    dt_opt_apply_to(&ps->opt, out, p->params, grads, p->state, p->decay, p->n, p->step, &skip);
    for (int r = 0; r < ps->cfg->n_state_ranges; r++) {
        size_t lo = ps->cfg->state_ranges[2 * r], hi = lo + ps->cfg->state_ranges[2 * r + 1];
        if (lo < p->off) lo = p->off;
        if (hi > p->off + p->n) hi = p->off + p->n;
        for (size_t i = lo; i < hi; i++) out[i - p->off] = p->params[i - p->off] + grads[i - p->off];
    }
    p->params = out;
    p->step++;
    part_trim(ps, p);
}

static void part_free(part_t *p, int aggregate_staleness) {
    dt_snap_pool_retire(&p->snaps);
    free(p->own);
    free(p->state);
    free(p->decay);
    for (int i = 0; p->acc && i < aggregate_staleness; i++) {
        for (int k = 0; k < p->acc[i].count; k++) zmq_msg_close(&p->acc[i].grad[k]);
        free(p->acc[i].worker);
        free(p->acc[i].grad);
        free(p->acc[i].enc);
    }
    free(p->acc);
    memset(p, 0, sizeof *p);
}

static void parts_free(part_t *parts, int n, int staleness) {
    for (int c = 0; parts && c < n; c++) part_free(&parts[c], parts[c].acc ? staleness + 1 : 0);
    free(parts);
}

/* ---- PARAMS ----------------------------------------------------------------------------------- */

/* A PARAMS payload in a 16-bit encoding: packed from the float32 values into a buffer of its own.
 * 3 if a value does not fit fp16 (nothing is sent: a parameter has no error feedback to carry the
 * remainder, and a saturated one would be silently wrong). */
static int params_packed(ps_t *ps, part_t *p, dt_peer *peer, const float *values, uint8_t enc, zmq_msg_t *m) {
    const size_t bytes = p->n * dt_enc_size(enc);
    int rc = reply_admit(ps, peer, bytes);
    if (rc) return rc;
    void *packed = malloc(bytes ? bytes : 1);
    if (!packed || dt_pack(enc, packed, values, p->n)) {
        dt_peer_reply_done(peer, bytes); /* undoes the admission */
        free(packed);
        return packed ? 3 : DT_ENOMEM;
    }
    return reply_attach(peer, m, packed, bytes, NULL, packed);
}

/* The payload of a PARAMS reply of part p at `step` (the current one, or a kept one) in encoding
 * enc for peer: DT_OK, DT_ENOMEM, 1 if the peer has too many replies unread, 2 if that step is no
 * longer kept, 3 if a value does not fit the encoding, or 4 if the ps is at its budget. */
static int params_msg(ps_t *ps, part_t *p, dt_peer *peer, int64_t step, uint8_t enc, zmq_msg_t *m) {
    const size_t bytes = p->n * sizeof(float);
    if (enc != DT_ENC_FP32) { /* packed from the current values or a kept step's: no snapshot needed */
        if (step == p->step) return params_packed(ps, p, peer, p->params, enc, m);
        dt_snap *k = dt_snap_find(&p->snaps, step);
        return k ? params_packed(ps, p, peer, k->data, enc, m) : 2;
    }
    dt_snap *b = step == p->step ? snap_current(ps, p) : dt_snap_find(&p->snaps, step);
    if (b) return reply_msg(ps, peer, m, b->data, bytes, b);
    if (step != p->step) return 2;
    /* every buffer still in flight: a copy of its own */
    int rc = reply_admit(ps, peer, bytes);
    if (rc) return rc;
    float *copy = malloc(bytes ? bytes : 1);
    if (!copy) {
        dt_peer_reply_done(peer, bytes);
        return DT_ENOMEM;
    }
    memcpy(copy, p->params, bytes);
    return reply_attach(peer, m, copy, bytes, NULL, copy);
}

/* Answers a PULL (or a PUSH that asked for PARAMS) with its chunk's values at the step it asked
 * for: the current step, or for an EXACT pull of an earlier step its kept snapshot (else ERROR
 * 109). waited_us, and a push's status and stale count, go into the reply. */
static void send_params(ps_t *ps, dt_peer *peer, zmq_msg_t *identity, const dt_wire_header *req, int64_t waited_us,
                        int32_t status, uint64_t stale) {
    part_t *p = &ps->parts[req->chunk];
    int64_t step = (req->flags & DT_WIRE_F_EXACT) ? req->global_step : p->step;
    zmq_msg_t m;
    int rc = params_msg(ps, p, peer, step, req->encoding, &m);
    dt_wire_header r = reply_to(ps, rc ? DT_MSG_ERROR : DT_MSG_PARAMS, req);
    if (rc == 2) {
        dt_wire_send_error(ps->sock, identity, r, DT_WIRE_E_GONE,
                           "ps %d: step %lld of chunk %u is no longer kept (now at step %lld, keeping the last %d)",
                           ps->cfg->ps_index, (long long)step, req->chunk, (long long)p->step, SNAP_KEEP);
        return;
    }
    if (rc == 3) {
        dt_wire_send_error(ps->sock, identity, r, DT_WIRE_E_BAD_VALUE,
                           "ps %d: a parameter of chunk %u at step %lld is beyond fp16's range (+-65504): pull in "
                           "bf16 or float32 (--compression)", ps->cfg->ps_index, req->chunk, (long long)step);
        return;
    }
    if (rc == 1 || rc == 4) {
        char msg[224];
        busy_text(ps, rc, msg, sizeof msg);
        dt_wire_send_error(ps->sock, identity, r, DT_WIRE_E_BUSY, "%s", msg);
        return;
    }
    if (rc) {
        dt_wire_send_error(ps->sock, identity, r, DT_WIRE_E_NOMEM, "ps %d: out of memory for a PARAMS reply",
                           ps->cfg->ps_index);
        return;
    }
    r.global_step = step;
    r.encoding = req->encoding;
    r.status = status;
    r.params.waited_us = waited_us > 0 ? (uint64_t)waited_us : 0;
    r.params.stale_count = stale;
    if (req->chunk == 0) ps->pulls++;
    if (waited_us > 0) dt_metric_observe(ps->m.wait, (double)waited_us * 1e-6);
    dt_metric_add(ps->m.tx, (double)(DT_WIRE_HEADER_SIZE + zmq_msg_size(&m)));
    dt_wire_send(ps->sock, identity, &r, &m, ZMQ_DONTWAIT, NULL);
}

/* Whether a PULL can be answered now: a minimum step reached, or an exact step reached (a passed
 * exact step is answered too: from its snapshot, or with ERROR 109). */
static int pull_ready(const ps_t *ps, const dt_wire_header *req) {
    return req->global_step <= ps->parts[req->chunk].step;
}

/* ---- Deferred PULLs --------------------------------------------------------------------------- */

static void pending_drop(pending_pull *p) {
    zmq_msg_close(&p->identity);
    dt_peer_unref(p->peer);
}

/* Answers every deferred PULL with an ERROR: the ps is shutting down, was re-initialised (the
 * steps they wait for may never come) or has stopped the job (strict). */
static void fail_pending(ps_t *ps, int32_t status, const char *text) {
    for (int i = 0; i < ps->n_pending; i++) {
        pending_pull *p = &ps->pending[i];
        dt_wire_header r = reply_to(ps, DT_MSG_ERROR, &p->req);
        dt_wire_send_error(ps->sock, &p->identity, r, status, "ps %d: %s", ps->cfg->ps_index, text);
        pending_drop(p);
    }
    ps->n_pending = 0;
}

/* Removes the deferred PULLs that keep(ps, p, user) rejects (their identities and peers released;
 * keep may have answered them), keeping the others in order. */
static void pending_filter(ps_t *ps, int (*keep)(ps_t *, pending_pull *, void *), void *user) {
    int kept = 0;
    for (int i = 0; i < ps->n_pending; i++) {
        pending_pull *p = &ps->pending[i];
        if (!keep(ps, p, user)) {
            pending_drop(p);
            continue;
        }
        if (kept != i) { /* zmq_msg_t must be moved, not copied */
            pending_pull *dst = &ps->pending[kept];
            zmq_msg_init(&dst->identity);
            zmq_msg_move(&dst->identity, &p->identity);
            dst->req = p->req;
            dst->peer = p->peer;
            dst->owned = p->owned;
            dst->since_us = p->since_us;
            dst->status = p->status;
            dst->stale = p->stale;
        }
        kept++;
    }
    ps->n_pending = kept;
}

/* Any message from a worker proves it alive, and so does the answer to its held PULL: it waited
 * at the barrier and will speak next, which the liveness check must not take for silence. */
static void saw_worker(ps_t *ps, const dt_wire_header *h) {
    if (!ps->last_seen || (h->role != DT_ROLE_WORKER && h->role != DT_ROLE_CHIEF) || h->task >= ps->total) return;
    ps->last_seen[h->task] = dt_clock_us();
}

static int keep_unready(ps_t *ps, pending_pull *p, void *user) {
    (void)user;
    if (!pull_ready(ps, &p->req)) return 1;
    send_params(ps, p->peer, &p->identity, &p->req, dt_clock_us() - p->since_us, p->status, p->stale);
    saw_worker(ps, &p->req);
    return 0;
}

/* Answers the deferred PULLs whose step has been reached (all of them with an ERROR when the ps
 * is shutting down). */
static void serve_pending(ps_t *ps) {
    if (ps->shutdown) {
        fail_pending(ps, DT_WIRE_E_SHUTDOWN, "shutting down (training is over)");
        return;
    }
    if (ps->n_pending) pending_filter(ps, keep_unready, NULL);
}

/* A connection closed: its deferred PULLs go (nobody would read the replies). */
static int keep_other_peer(ps_t *ps, pending_pull *p, void *gone) {
    (void)ps;
    return p->peer != gone;
}

static void on_peer_gone(void *user, dt_peer *peer) {
    ps_t *ps = user;
    if (ps->n_pending) pending_filter(ps, keep_other_peer, peer);
}

/* How long a deferred PULL is held: its client gives up after twice the liveness timeout (sync),
 * so holding it much longer only holds memory; at least a minute, whatever a client's timeout. */
static int64_t pending_max_wait(const ps_t *ps) {
    int64_t t = 4 * ps->liveness_us;
    return t < 60 * INT64_C(1000000) ? 60 * INT64_C(1000000) : t > PENDING_MAX_WAIT_US ? PENDING_MAX_WAIT_US : t;
}

static int keep_fresh(ps_t *ps, pending_pull *p, void *now) {
    if (*(int64_t *)now - p->since_us <= pending_max_wait(ps)) return 1;
    dt_wire_header r = reply_to(ps, DT_MSG_ERROR, &p->req);
    dt_wire_send_error(ps->sock, &p->identity, r, DT_WIRE_E_BUSY, "ps %d: step %lld did not come within %lld s",
                       ps->cfg->ps_index, (long long)p->req.global_step, (long long)(pending_max_wait(ps) / 1000000));
    return 0;
}

/* The latest step a deferred PULL may wait for: sync, the next step a worker can push for (a
 * worker runs at most staleness steps ahead), plus one for an exact pull of a chunk ahead; async,
 * a bounded distance. Later steps cannot come soon: the PULL is refused, not held. */
static int64_t pull_horizon(const ps_t *ps, const part_t *p) {
    return p->step + (ps->aggregate ? ps->staleness + 2 : ASYNC_AHEAD);
}

/* Whether a request comes from the connection that latest pushed a gradient as its worker task. */
static int owns_task(const ps_t *ps, const dt_wire_header *h) {
    return ps->owner && ps->peer && (h->role == DT_ROLE_WORKER || h->role == DT_ROLE_CHIEF) &&
           h->task < ps->workers && ps->owner[h->task] == dt_peer_serial(ps->peer);
}

/* Keeps a deferred PULL unless it is an earlier connection's under the quota of the task of the
 * PULL that now takes its place (answered ERROR 106, which its client retries). */
static int keep_not_superseded(ps_t *ps, pending_pull *p, void *user) {
    const dt_wire_header *h = user;
    if (!p->owned || p->req.task != h->task || p->peer == ps->peer) return 1;
    dt_wire_header r = reply_to(ps, DT_MSG_ERROR, &p->req);
    dt_wire_send_error(ps->sock, &p->identity, r, DT_WIRE_E_BUSY, "ps %d: worker %u's PULLs from another connection "
                       "took this one's place", ps->cfg->ps_index, h->task);
    return 0;
}

/* Answers a PULL now or holds it until its chunk reaches the step (status, stale: a PUSH's outcome
 * to report with the PARAMS). */
static void answer_pull(ps_t *ps, zmq_msg_t *id, dt_wire_in *in, int32_t status, uint64_t stale) {
    char msg[192];
    const dt_wire_header *h = &in->hdr;
    if (pull_ready(ps, h)) {
        send_params(ps, ps->peer, id, h, 0, status, stale);
        return;
    }
    const part_t *p = &ps->parts[h->chunk];
    if (h->global_step > pull_horizon(ps, p)) {
        snprintf(msg, sizeof msg, "PULL waits for step %lld, but this ps is at step %lld and holds PULLs for at most "
                 "step %lld", (long long)h->global_step, (long long)p->step, (long long)pull_horizon(ps, p));
        refuse(ps, id, in, DT_WIRE_E_BAD_VALUE, msg);
        return;
    }
    /* A worker's own PULLs (from the connection that pushes as that task) have a quota of their
     * own: strangers filling the table cannot hold up the barrier. */
    const int owned = owns_task(ps, h);
    int mine = 0, strangers = 0, task_owned = 0;
    for (int i = 0; i < ps->n_pending; i++) {
        const pending_pull *q = &ps->pending[i];
        mine += ps->peer && q->peer == ps->peer;
        strangers += !q->owned;
        task_owned += q->owned && q->req.task == h->task;
    }
    if (mine >= PENDING_PER_PEER || (!owned && strangers >= MAX_PENDING)) {
        snprintf(msg, sizeof msg, mine >= PENDING_PER_PEER ? "this connection already has %d PULLs waiting"
                                                            : "too many PULLs waiting for a later step (%d)",
                 mine >= PENDING_PER_PEER ? PENDING_PER_PEER : MAX_PENDING);
        refuse(ps, id, in, DT_WIRE_E_BUSY, msg);
        return;
    }
    /* The quota is full of PULLs from an earlier connection of that task (a worker that
     * reconnected): they give way. */
    if (owned && task_owned >= PENDING_PER_PEER) pending_filter(ps, keep_not_superseded, (void *)h);
    if (!ps->pending) {
        ps->cap_pending = MAX_PENDING + (ps->workers > 0 ? ps->workers : 0) * PENDING_PER_PEER;
        if (!(ps->pending = dt_calloc((size_t)ps->cap_pending, sizeof *ps->pending, "ps pending pulls", NULL))) {
            ps->cap_pending = 0;
            refuse(ps, id, in, DT_WIRE_E_NOMEM, "out of memory for a deferred PULL");
            return;
        }
    }
    if (ps->n_pending >= ps->cap_pending) { /* cannot happen with the quotas above; never overrun */
        refuse(ps, id, in, DT_WIRE_E_BUSY, "too many PULLs waiting for a later step");
        return;
    }
    pending_pull *q = &ps->pending[ps->n_pending++];
    zmq_msg_init(&q->identity);
    zmq_msg_copy(&q->identity, id);
    q->req = *h;
    q->peer = ps->peer;
    q->owned = owned;
    dt_peer_ref(q->peer);
    q->since_us = dt_clock_us();
    q->status = status;
    q->stale = stale;
}

/* ---- Checks ----------------------------------------------------------------------------------- */

static int check_chief(ps_t *ps, zmq_msg_t *id, const dt_wire_in *in) {
    if (in->hdr.role == DT_ROLE_CHIEF) return 1;
    char msg[128];
    snprintf(msg, sizeof msg, "only the chief may send %s (sender is %s %u)", dt_wire_type_name(in->hdr.type),
             dt_wire_role_name(in->hdr.role), in->hdr.task);
    refuse(ps, id, in, DT_WIRE_E_ROLE, msg);
    return 0;
}

static int check_ready(ps_t *ps, zmq_msg_t *id, const dt_wire_in *in) {
    if (ps->initialised) return 1;
    refuse(ps, id, in, DT_WIRE_E_NOT_READY, "not initialised yet: the chief (worker 0) has not sent INIT");
    return 0;
}

static int check_payload(ps_t *ps, zmq_msg_t *id, const dt_wire_in *in) {
    dt_error e = {0};
    if (dt_wire_check_payload(&in->hdr, ps->n, &e) == DT_OK) return 1;
    refuse(ps, id, in, DT_WIRE_E_MALFORMED, e.msg);
    return 0;
}

/* A chunked request must cut the shard as INIT did; a client that cut it otherwise learns the cut
 * from the refusal (every reply carries it) and asks again. */
static int check_chunks(ps_t *ps, zmq_msg_t *id, const dt_wire_in *in) {
    if (in->hdr.chunks == ps->n_parts) return 1;
    char msg[160];
    snprintf(msg, sizeof msg, "%s for chunk %u of %u, but this ps cuts its shard into %d chunk(s) (the chief's "
             "--chunk_kb): ask again with that cut", dt_wire_type_name(in->hdr.type), in->hdr.chunk, in->hdr.chunks,
             ps->n_parts);
    refuse(ps, id, in, DT_WIRE_E_RESYNC, msg);
    return 0;
}

/* The optimizer fields of WELCOME and STATE (all zero before INIT: sgd, 0 slots). */
static void put_optimizer(const ps_t *ps, dt_wire_header *r) {
    r->opt_kind = (uint8_t)ps->opt.kind;
    r->opt_slots = (uint8_t)ps->slots;
    r->learning_rate = ps->opt.learning_rate;
    r->momentum = ps->opt.momentum;
    r->beta1 = ps->opt.beta1;
    r->beta2 = ps->opt.beta2;
    r->epsilon = ps->opt.epsilon;
}

/* One line: how many stale gradients each worker sent (TensorFlow drops them silently). */
static void log_stale_summary(ps_t *ps) {
    if (!ps->aggregate) return;
    char line[512];
    int len = snprintf(line, sizeof line, "stale gradients dropped: %llu", (unsigned long long)ps->n_stale);
    for (int w = 0; w < ps->total && len < (int)sizeof line - 40; w++)
        len += snprintf(line + len, sizeof line - (size_t)len, "%sworker %d: %llu", w ? ", " : " (", w,
                        (unsigned long long)ps->stale[w]);
    if (len < (int)sizeof line - 2) snprintf(line + len, sizeof line - (size_t)len, ")");
    ps_log(ps, "%s", line);
}

/* ---- FETCH ------------------------------------------------------------------------------------ */

/* The whole shard for a checkpoint: parameters, then the optimizer state slot-major, as INIT takes
 * them back (a restore is an INIT with this payload and step). global_step is the step every chunk
 * has reached, state.step_max the step of the chunk furthest ahead: they differ while a gradient is still
 * arriving, and the client fetches again. */
static void on_fetch(ps_t *ps, zmq_msg_t *id, dt_wire_in *in) {
    if (!check_ready(ps, id, in)) return;
    const size_t n = ps->n, bytes = (size_t)(1 + ps->slots) * n * sizeof(float);
    /* Counted before the copy: a refused FETCH costs nothing. */
    int rc = reply_admit(ps, ps->peer, bytes);
    if (rc) {
        char msg[224];
        busy_text(ps, rc, msg, sizeof msg);
        refuse(ps, id, in, DT_WIRE_E_BUSY, msg);
        return;
    }
    float *d = malloc(bytes);
    if (!d) {
        dt_peer_reply_done(ps->peer, bytes);
        refuse(ps, id, in, DT_WIRE_E_NOMEM, "out of memory for a STATE reply");
        return;
    }
    for (int c = 0; c < ps->n_parts; c++) {
        const part_t *p = &ps->parts[c];
        memcpy(d + p->off, p->params, p->n * sizeof(float));
        for (int k = 0; k < ps->slots; k++)
            memcpy(d + (size_t)(1 + k) * n + p->off, p->state + (size_t)k * p->n, p->n * sizeof(float));
    }
    zmq_msg_t m;
    if (reply_attach(ps->peer, &m, d, bytes, NULL, d)) {
        refuse(ps, id, in, DT_WIRE_E_NOMEM, "out of memory for a STATE reply");
        return;
    }
    dt_wire_header r = reply_to(ps, DT_MSG_STATE, &in->hdr);
    put_optimizer(ps, &r);
    r.state.step_max = (uint64_t)shard_step_max(ps);
    dt_wire_send(ps->sock, id, &r, &m, ZMQ_DONTWAIT, NULL);
}

/* ---- INIT ------------------------------------------------------------------------------------- */

/* DONE from tasks beyond the cluster's workers (heard before INIT told how many there are) does
 * not count. */
static void prune_done(ps_t *ps) {
    if (!ps->done || !ps->workers) return;
    for (int w = ps->workers; w < 65536; w++) {
        uint8_t bit = (uint8_t)(1u << (w & 7));
        if (!(ps->done[w >> 3] & bit)) continue;
        ps->done[w >> 3] &= (uint8_t)~bit;
        ps->n_done--;
    }
}

/* Everything peers may make the ps hold together (docs/security.md): unfinished messages, large
 * replies not yet sent, deferred PULLs. Room for every worker's pull and gradient of a step in
 * flight at once, four of the largest messages (an INIT, STATE replies) and 64 MiB to spare. */
static uint64_t peers_budget(const ps_t *ps) {
    uint64_t shard = (uint64_t)ps->n * sizeof(float);
    return 4 * dt_wire_max_frame(ps->n) + 2 * (uint64_t)(ps->workers > 0 ? ps->workers : 8) * shard +
           (UINT64_C(64) << 20);
}

/* Everything an INIT installs, built whole before anything of the ps changes (so a refusal or a
 * failed allocation leaves the ps as it was). */
typedef struct {
    part_t *parts;
    int n_parts, aggregate, total, staleness;
    float *scratch, *sum;     /* [largest part] */
    uint64_t *stale;          /* [total]; NULL: keep the ps's counts (same number of replicas) */
    int64_t *last_seen;       /* [total] */
    uint8_t *lost;            /* [total] */
} init_state;

static void init_state_free(init_state *s) {
    parts_free(s->parts, s->n_parts, s->staleness);
    free(s->scratch), free(s->sum), free(s->stale), free(s->last_seen), free(s->lost);
    memset(s, 0, sizeof *s);
}

/* Cuts the shard into chunks parts, each with its values, state and decay mask from INIT's payload
 * (params [n], state slot-major [slots][n], the options block, the mask's bits; the mask is only
 * kept with weight decay on) and, in sync mode, its accumulators. */
static int init_prepare(ps_t *ps, const dt_wire_header *h, const float *data, int slots, int decays, init_state *s) {
    memset(s, 0, sizeof *s);
    *s = (init_state){.n_parts = h->chunks, .aggregate = (int)h->init.replicas_to_aggregate,
                      .total = (int)h->init.total_num_replicas,
                      .staleness = (int)h->init.staleness};
    const size_t n = ps->n;
    size_t largest = 0;
    if (!(s->parts = dt_calloc((size_t)s->n_parts, sizeof *s->parts, "ps chunks", NULL))) goto oom;
    for (int c = 0; c < s->n_parts; c++) {
        part_t *p = &s->parts[c];
        uint64_t off, len;
        dt_wire_chunk(n, (unsigned)s->n_parts, (unsigned)c, &off, &len);
        p->off = (size_t)off, p->n = (size_t)len, p->step = h->global_step;
        if (p->n > largest) largest = p->n;
        dt_snap_pool_init(&p->snaps, p->n);
        if (!(p->own = dt_alloc_floats(p->n, "ps chunk", NULL)) ||
            !(p->state = dt_alloc_floats(slots ? (size_t)slots * p->n : 1, "ps optimizer state", NULL)))
            goto oom;
        memcpy(p->own, data + p->off, p->n * sizeof(float));
        for (int k = 0; k < slots; k++)
            memcpy(p->state + (size_t)k * p->n, data + (size_t)(1 + k) * n + p->off, p->n * sizeof(float));
        if (decays) {
            if (!(p->decay = dt_calloc(p->n, 1, "ps decay mask", NULL))) goto oom;
            const uint8_t *bits = (const uint8_t *)data + (size_t)(1 + slots) * n * sizeof(float) + DT_WIRE_OPTS_BYTES;
            for (size_t i = 0; i < p->n; i++) p->decay[i] = (bits[(p->off + i) >> 3] >> ((p->off + i) & 7)) & 1;
        }
        p->params = p->own;
        if (!s->aggregate) continue;
        if (!(p->acc = dt_calloc((size_t)s->staleness + 1, sizeof *p->acc, "ps accumulators", NULL))) goto oom;
        for (int i = 0; i <= s->staleness; i++) {
            p->acc[i].step = -1;
            p->acc[i].worker = dt_calloc((size_t)s->aggregate, sizeof *p->acc[i].worker, "ps accumulator", NULL);
            p->acc[i].grad = dt_calloc((size_t)s->aggregate, sizeof *p->acc[i].grad, "ps accumulator", NULL);
            p->acc[i].enc = dt_calloc((size_t)s->aggregate, sizeof *p->acc[i].enc, "ps accumulator", NULL);
            if (!p->acc[i].worker || !p->acc[i].grad || !p->acc[i].enc) goto oom;
        }
    }
    if (!(s->scratch = dt_alloc_floats(largest, "ps gradient scratch", NULL))) goto oom;
    if (s->aggregate) {
        int keep_stale = s->total == ps->total && ps->stale; /* stale counts survive a re-INIT alike */
        if ((!keep_stale && !(s->stale = dt_calloc((size_t)s->total, sizeof *s->stale, "ps stale counts", NULL))) ||
            !(s->last_seen = dt_calloc((size_t)s->total, sizeof *s->last_seen, "ps worker liveness", NULL)) ||
            !(s->lost = dt_calloc((size_t)s->total, sizeof *s->lost, "ps worker liveness", NULL)) ||
            !(s->sum = dt_alloc_floats(largest, "ps gradient mean", NULL)))
            goto oom;
        /* Every worker counts as just seen: a worker that never shows up is lost after the timeout. */
        int64_t now = dt_clock_us();
        for (int w = 0; w < s->total; w++) s->last_seen[w] = now;
    }
    return DT_OK;
oom:
    init_state_free(s);
    return DT_ENOMEM;
}

/* Cannot fail: s was built whole by init_prepare. The old parts' snapshots still in flight are
 * freed by their last message; held gradients are dropped. */
static void init_commit(ps_t *ps, init_state *s) {
    init_state old = {.parts = ps->parts, .n_parts = ps->n_parts, .staleness = ps->staleness,
                      .scratch = ps->scratch, .sum = ps->sum, .stale = ps->stale, .last_seen = ps->last_seen,
                      .lost = ps->lost};
    if (s->aggregate && !s->stale) s->stale = ps->stale, old.stale = NULL;
    init_state_free(&old);
    ps->parts = s->parts, ps->n_parts = s->n_parts;
    ps->aggregate = s->aggregate, ps->total = s->aggregate ? s->total : 0, ps->staleness = s->staleness;
    ps->scratch = s->scratch, ps->sum = s->sum, ps->stale = s->stale, ps->last_seen = s->last_seen, ps->lost = s->lost;
    ps->n_lost = 0;
    memset(s, 0, sizeof *s);
}

static void on_init(ps_t *ps, zmq_msg_t *id, dt_wire_in *in) {
    const dt_wire_header *h = &in->hdr;
    char msg[256];
    if (!check_chief(ps, id, in)) return;
    if (h->shard_floats != ps->n) {
        snprintf(msg, sizeof msg, "INIT for a shard of %llu floats, this ps holds %zu (same model and --ps_hosts everywhere?)",
                 (unsigned long long)h->shard_floats, ps->n);
        refuse(ps, id, in, DT_WIRE_E_SHARD, msg);
        return;
    }
    if (!check_payload(ps, id, in)) return;
    if (h->chunks > ps->n) {
        snprintf(msg, sizeof msg, "INIT cuts a shard of %zu floats into %u chunks (at most one per float)", ps->n,
                 h->chunks);
        refuse(ps, id, in, DT_WIRE_E_BAD_VALUE, msg);
        return;
    }
    dt_opt_config opt = {.kind = (dt_opt_kind)h->opt_kind, .learning_rate = h->learning_rate,
                         .momentum = h->momentum, .beta1 = h->beta1, .beta2 = h->beta2, .epsilon = h->epsilon};
    if (!(opt.learning_rate > 0.0f)) {
        snprintf(msg, sizeof msg, "INIT with learning_rate %g, must be positive", (double)opt.learning_rate);
        refuse(ps, id, in, DT_WIRE_E_BAD_VALUE, msg);
        return;
    }
    int slots = dt_opt_slots(&opt);
    /* Non-finite values would only show up later as a NaN loss, far from their source. */
    const float *data = zmq_msg_data(&in->payload);
    dt_error oe = {0};
    if (dt_wire_opts_decode(&opt.schedule, &opt.weight_decay, (const uint8_t *)data + (size_t)(1 + slots) * ps->n * 4,
                            DT_WIRE_OPTS_BYTES, &oe)) {
        refuse(ps, id, in, DT_WIRE_E_BAD_VALUE, oe.msg);
        return;
    }
    size_t total = (size_t)(1 + slots) * ps->n, bad = dt_first_nonfinite(data, total);
    if (bad < total) {
        float v;
        memcpy(&v, (const char *)data + bad * sizeof v, sizeof v);
        if (bad < ps->n)
            snprintf(msg, sizeof msg, "INIT holds a non-finite parameter (%g at float %zu of the shard)", (double)v, bad);
        else
            snprintf(msg, sizeof msg, "INIT holds a non-finite optimizer state value (%g at float %zu of slot %zu)",
                     (double)v, (bad - ps->n) % ps->n, (bad - ps->n) / ps->n);
        refuse(ps, id, in, DT_WIRE_E_BAD_VALUE, msg);
        return;
    }
    /* The payload may be misaligned (libzmq promises nothing): the parts are filled with memcpy. */
    init_state s;
    uint64_t *owner = dt_calloc(h->init.total_num_replicas ? h->init.total_num_replicas : 1, sizeof *owner,
                                "ps worker connections", NULL);
    if (!owner || init_prepare(ps, h, data, slots, opt.weight_decay != 0, &s)) {
        free(owner);
        refuse(ps, id, in, DT_WIRE_E_NOMEM, "out of memory for the shard's chunks, optimizer state or accumulators");
        return;
    }
    /* PULLs held for a step of the old values: their workers pull again (a rollback). */
    if (ps->n_pending) {
        snprintf(msg, sizeof msg, "re-initialised by the chief at global step %lld (generation %u): pull again",
                 (long long)h->global_step, h->generation);
        fail_pending(ps, DT_WIRE_E_RESYNC, msg);
    }
    init_commit(ps, &s);
    /* The deferred PULL table is sized by the workers (a quota each): made anew for the new count. */
    free(ps->pending);
    ps->pending = NULL;
    ps->cap_pending = 0;
    free(ps->owner);
    ps->owner = owner;
    ps->slots = slots;
    ps->opt = opt;
    ps->workers = (int)h->init.total_num_replicas;
    prune_done(ps);
    ps->budget = peers_budget(ps);
    if (ps->peers) dt_peers_set_budget(ps->peers, ps->budget);
    char mode[256] = "asynchronous";
    if (ps->aggregate)
        snprintf(mode, sizeof mode, "sync replicas: mean of %d of %d workers' gradients per step, staleness %d",
                 ps->aggregate, ps->total, ps->staleness);
    if (ps->aggregate && h->liveness_ms)
        snprintf(mode + strlen(mode), sizeof mode - strlen(mode), "; a worker silent %lld ms is lost%s",
                 (long long)h->liveness_ms, (h->flags & DT_WIRE_F_STRICT) ? " and stops the job (strict)" : "");
    char sched[160];
    dt_lr_describe(&opt.schedule, sched, sizeof sched);
    ps_log(ps, "%s by the chief (worker %u) at global step %lld (generation %u): %zu floats in %d chunk(s), %s, "
           "learning rate %g, schedule %s, weight decay %g, %s", ps->initialised ? "re-initialised" : "initialised",
           h->task, (long long)h->global_step, h->generation, ps->n, ps->n_parts, dt_opt_name(opt.kind),
           (double)opt.learning_rate, sched, (double)opt.weight_decay, mode);
    ps->initialised = 1;
    ps->generation = h->generation;
    ps->liveness_us = ps->aggregate ? h->liveness_ms * 1000 : 0;
    ps->strict = (h->flags & DT_WIRE_F_STRICT) != 0;
    ps->failed[0] = '\0';
    dt_wire_header r = reply_to(ps, DT_MSG_ACK, h);
    dt_wire_send(ps->sock, id, &r, NULL, ZMQ_DONTWAIT, NULL);
}

/* ---- PUSH ------------------------------------------------------------------------------------- */

/* A gradient's payload as aligned float32 (libzmq promises no alignment: copied if needed; a
 * 16-bit encoding is unpacked, exactly). into: where a copy goes (the scratch buffer, or the sum). */
static const float *grad_floats(float *into, zmq_msg_t *m, uint8_t enc) {
    const float *g = zmq_msg_data(m);
    if (enc == DT_ENC_FP32 && (uintptr_t)g % alignof(float) == 0) return g;
    dt_unpack(enc, into, g, zmq_msg_size(m) / dt_enc_size(enc));
    return into;
}

/* A PUSH's reply: PUSH_ACK, or for a PUSH that asked for PARAMS its chunk's values once they
 * reach the step it asked for (the push's outcome rides along). */
static void push_reply(ps_t *ps, zmq_msg_t *id, dt_wire_in *in, int32_t status, uint64_t stale) {
    if (in->hdr.flags & DT_WIRE_F_PULL) {
        answer_pull(ps, id, in, status, stale);
        return;
    }
    dt_wire_header r = reply_to(ps, DT_MSG_PUSH_ACK, &in->hdr);
    r.status = status;
    r.push_ack.stale_count = stale;
    dt_wire_send(ps->sock, id, &r, NULL, ZMQ_DONTWAIT, NULL);
}

/* Applies the mean of a part's gradients of its current step, summed in worker-index order (so
 * the result does not depend on arrival order), and moves it to the next step. */
static void apply_sync_step(ps_t *ps, part_t *p) {
    accum *a = &p->acc[p->step % (ps->staleness + 1)];
    for (int i = 1; i < a->count; i++) /* insertion sort by worker index; count is small */
        for (int j = i; j > 0 && a->worker[j - 1] > a->worker[j]; j--) {
            uint16_t w = a->worker[j];
            a->worker[j] = a->worker[j - 1], a->worker[j - 1] = w;
            zmq_msg_t t;
            zmq_msg_init(&t);
            zmq_msg_move(&t, &a->grad[j]);
            zmq_msg_move(&a->grad[j], &a->grad[j - 1]);
            zmq_msg_move(&a->grad[j - 1], &t);
            uint8_t e = a->enc[j];
            a->enc[j] = a->enc[j - 1], a->enc[j - 1] = e;
        }
    /* mean = ((g0 + g1) + g2 ...) / count in count - 1 passes: the first reads g0 and g1 where they
     * arrived, the division rides on the last; a single gradient is its own mean (no copy).
     * The later gradients may use the scratch buffer, so a misaligned or 16-bit g0 goes to sum. */
    const size_t n = p->n;
    const float *mean = ps->sum;
    if (a->count == 1) {
        mean = grad_floats(ps->scratch, &a->grad[0], a->enc[0]);
    } else {
        float *sum = ps->sum;
        const float div = (float)a->count;
        const float *g0 = grad_floats(sum, &a->grad[0], a->enc[0]);
        for (int k = 1; k < a->count; k++) {
            const float *g = grad_floats(ps->scratch, &a->grad[k], a->enc[k]), *acc = k == 1 ? g0 : sum;
            if (k < a->count - 1)
                for (size_t i = 0; i < n; i++) sum[i] = acc[i] + g[i];
            else
                for (size_t i = 0; i < n; i++) sum[i] = (acc[i] + g[i]) / div;
        }
    }
    /* Kept for EXACT pulls of this step from workers that see another chunk ahead. */
    snap_current(ps, p);
    advance(ps, p, mean);
    for (int k = 0; k < a->count; k++) zmq_msg_close(&a->grad[k]);
    a->count = 0;
    a->step = -1;
    if (p == &ps->parts[0]) ps->updates++;
}

/* Gradients a step needs: replicas_to_aggregate, or the live workers if fewer are left. */
static int needed(const ps_t *ps) {
    int live = ps->total - ps->n_lost;
    return live < ps->aggregate ? (live > 0 ? live : 1) : ps->aggregate;
}

/* Applies every complete step of a part (with staleness, later steps may be complete already);
 * whether any was. */
static int apply_complete_steps(ps_t *ps, part_t *p) {
    int any = 0;
    for (;;) {
        accum *a = &p->acc[p->step % (ps->staleness + 1)];
        if (a->count == 0 || a->step != p->step || a->count < needed(ps)) return any;
        apply_sync_step(ps, p);
        any = 1;
    }
}

/* A sync-mode gradient chunk for step t = local_step: stale (t < the chunk's step) is dropped and
 * counted (once per gradient: on chunk 0); fresh is held for its step; a complete step
 * (replicas_to_aggregate gradients) is applied at once. */
static void on_sync_push(ps_t *ps, zmq_msg_t *id, dt_wire_in *in) {
    const dt_wire_header *h = &in->hdr;
    part_t *p = &ps->parts[h->chunk];
    char msg[256];
    const int64_t t = h->local_step;
    if (t < p->step) {
        uint64_t k = ps->stale[h->task];
        if (h->chunk == 0) {
            k = ++ps->stale[h->task];
            ps->n_stale++;
            if (k <= LOG_STALE)
                ps_log(ps, "stale gradient from worker %u for step %lld (now at step %lld): dropped%s", h->task,
                       (long long)t, (long long)p->step, k == LOG_STALE ? "; further ones from it are counted" : "");
        }
        push_reply(ps, id, in, DT_WIRE_STALE, k);
        return;
    }
    if (t > p->step + ps->staleness) {
        /* A worker ahead of the ps: the chief rolled the cluster back; it pulls again. */
        snprintf(msg, sizeof msg, "gradient for step %lld, but this ps is at step %lld and staleness %d allows at most %lld",
                 (long long)t, (long long)p->step, ps->staleness, (long long)(p->step + ps->staleness));
        refuse(ps, id, in, DT_WIRE_E_RESYNC, msg);
        return;
    }
    accum *a = &p->acc[t % (ps->staleness + 1)];
    int k = 0;
    while (k < a->count && a->worker[k] != h->task) k++;
    if (k < a->count) {
        /* A second gradient from one worker for one step: the worker restarted (or gave up waiting
         * and pulled again) and computed it afresh. The newer one replaces the first. */
        if (h->chunk == 0)
            ps_log(ps, "worker %u sent step %lld's gradient again (restarted?): the newer one replaces it", h->task,
                   (long long)t);
        zmq_msg_close(&a->grad[k]);
    } else {
        a->worker[a->count++] = h->task;
    }
    a->step = t;
    zmq_msg_init(&a->grad[k]);
    zmq_msg_move(&a->grad[k], &in->payload);
    a->enc[k] = h->encoding;
    if (h->chunk == 0) ps->pushes++;
    int applied = apply_complete_steps(ps, p);
    push_reply(ps, id, in, DT_WIRE_OK, ps->stale[h->task]);
    if (applied) serve_pending(ps);
}

static void on_push(ps_t *ps, zmq_msg_t *id, dt_wire_in *in) {
    if (!check_ready(ps, id, in) || !check_chunks(ps, id, in) || !check_payload(ps, id, in)) return;
    if (ps->owner && ps->peer && (in->hdr.role == DT_ROLE_WORKER || in->hdr.role == DT_ROLE_CHIEF) &&
        in->hdr.task < ps->workers)
        ps->owner[in->hdr.task] = dt_peer_serial(ps->peer);
    int sync = (in->hdr.flags & DT_WIRE_F_SYNC) != 0;
    if (sync != (ps->aggregate > 0)) {
        refuse(ps, id, in, DT_WIRE_E_BAD_VALUE,
               sync ? "synchronous gradient, but the chief initialised this ps for asynchronous training "
                      "(give every task the same --issync)"
                    : "asynchronous gradient, but the chief initialised this ps for sync replicas "
                      "(give every task the same --issync)");
        return;
    }
    if (sync) {
        if (in->hdr.task >= ps->total) {
            char msg[160];
            snprintf(msg, sizeof msg, "gradient from worker %u, but the chief declared %d replicas", in->hdr.task,
                     ps->total);
            refuse(ps, id, in, DT_WIRE_E_BAD_VALUE, msg);
            return;
        }
        on_sync_push(ps, id, in);
        return;
    }
    part_t *p = &ps->parts[in->hdr.chunk];
    advance(ps, p, grad_floats(ps->scratch, &in->payload, in->hdr.encoding));
    if (in->hdr.chunk == 0) ps->pushes++, ps->updates++;
    push_reply(ps, id, in, DT_WIRE_OK, 0);
    if (ps->n_pending) serve_pending(ps);
}

static void on_pull(ps_t *ps, zmq_msg_t *id, dt_wire_in *in) {
    if (!check_ready(ps, id, in) || !check_chunks(ps, id, in)) return;
    answer_pull(ps, id, in, DT_WIRE_OK, 0);
}

/* ---- Worker liveness -------------------------------------------------------------------------- */

/* Any message from a worker proves it alive; one that was lost is back (its steps count again). */
static void note_alive(ps_t *ps, const dt_wire_header *h) {
    if (!ps->last_seen || (h->role != DT_ROLE_WORKER && h->role != DT_ROLE_CHIEF) || h->task >= ps->total) return;
    saw_worker(ps, h);
    if (!ps->lost[h->task]) return;
    ps->lost[h->task] = 0;
    ps->n_lost--;
    ps_log(ps, "worker %u is back: steps wait for %d gradient(s) again", h->task, needed(ps));
}

/* Whether worker w has a PULL held here: it is waiting at the barrier, alive however long. */
static int has_pending(const ps_t *ps, int w) {
    for (int i = 0; i < ps->n_pending; i++)
        if (ps->pending[i].req.task == w && ps->pending[i].req.role != DT_ROLE_PS) return 1;
    return 0;
}

/* Sync mode: workers silent for the liveness timeout are lost (a finished worker, or one waiting
 * at the barrier, is not). Each step then waits for the live workers only, or, strict, the job
 * stops: every held and later request is refused, and the ps exits after one more timeout (so
 * that workers hear why). */
static void check_liveness(ps_t *ps) {
    if (!ps->aggregate || !ps->liveness_us || !ps->initialised || ps->failed[0]) return;
    int64_t now = dt_clock_us();
    for (int w = 0; w < ps->total; w++) {
        if (ps->lost[w] || now - ps->last_seen[w] <= ps->liveness_us) continue;
        if ((ps->done && (ps->done[w >> 3] & (1u << (w & 7)))) || has_pending(ps, w)) continue;
        ps->lost[w] = 1;
        ps->n_lost++;
        if (ps->strict) {
            snprintf(ps->failed, sizeof ps->failed, "worker %d lost (no message for %lld ms, --heartbeat_timeout / 2) "
                     "and --strict is set: the job stops", w, (long long)(ps->liveness_us / 1000));
            ps_log(ps, "%s", ps->failed);
            ps->failed_at_us = now;
            fail_pending(ps, DT_WIRE_E_LOST, ps->failed);
            return;
        }
        ps_log(ps, "worker %d lost (no message for %lld ms): steps now wait for %d gradient(s) from the %d live "
               "worker(s) instead of %d", w, (long long)(ps->liveness_us / 1000), needed(ps), ps->total - ps->n_lost,
               ps->aggregate);
    }
    int applied = 0;
    for (int c = 0; c < ps->n_parts; c++) applied |= apply_complete_steps(ps, &ps->parts[c]);
    if (applied) serve_pending(ps);
}

/* ---- Requests --------------------------------------------------------------------------------- */

static void handle(ps_t *ps, dt_wire_in *in) {
    zmq_msg_t *id = &in->identity;
    const dt_wire_header *h = &in->hdr;
    char msg[256];
    if (h->shard != (uint32_t)ps->cfg->ps_index) {
        snprintf(msg, sizeof msg, "message for ps %u reached ps %d (do all processes list --ps_hosts in the same order?)",
                 h->shard, ps->cfg->ps_index);
        refuse(ps, id, in, DT_WIRE_E_SHARD, msg);
        return;
    }
    if ((h->role == DT_ROLE_WORKER || h->role == DT_ROLE_CHIEF) && ps->workers && h->task >= ps->workers) {
        snprintf(msg, sizeof msg, "%s %u is not in this cluster (the chief declared %d worker task(s), 0..%d)",
                 dt_wire_role_name(h->role), h->task, ps->workers, ps->workers - 1);
        refuse(ps, id, in, DT_WIRE_E_BAD_VALUE, msg);
        return;
    }
    note_alive(ps, h);
    if (ps->failed[0] && (h->type == DT_MSG_PUSH || h->type == DT_MSG_PULL)) {
        refuse(ps, id, in, DT_WIRE_E_LOST, ps->failed);
        return;
    }
    switch (h->type) {
    case DT_MSG_HELLO: {
        if (h->shard_floats != 0 && h->shard_floats != ps->n) {
            snprintf(msg, sizeof msg, "this ps holds %zu floats, the client expects %llu (same model and --ps_hosts everywhere?)",
                     ps->n, (unsigned long long)h->shard_floats);
            refuse(ps, id, in, DT_WIRE_E_SHARD, msg);
            return;
        }
        dt_wire_header r = reply_to(ps, DT_MSG_WELCOME, h);
        put_optimizer(ps, &r);
        dt_wire_send(ps->sock, id, &r, NULL, ZMQ_DONTWAIT, NULL);
        return;
    }
    case DT_MSG_INIT: on_init(ps, id, in); return;
    case DT_MSG_PULL: on_pull(ps, id, in); return;
    case DT_MSG_PUSH: on_push(ps, id, in); return;
    case DT_MSG_FETCH: on_fetch(ps, id, in); return;
    case DT_MSG_STATUS: {
        dt_wire_header r = reply_to(ps, DT_MSG_STATUS_REPLY, h);
        r.status_reply.updates = ps->updates;
        r.status_reply.params_replies = ps->pulls;
        r.status_reply.workers_done = ps->n_done;
        dt_wire_send(ps->sock, id, &r, NULL, ZMQ_DONTWAIT, NULL);
        return;
    }
    case DT_MSG_HEARTBEAT: {
        dt_wire_header r = reply_to(ps, DT_MSG_HEARTBEAT, h);
        dt_wire_send(ps->sock, id, &r, NULL, ZMQ_DONTWAIT, NULL);
        return;
    }
    case DT_MSG_SHUTDOWN: {
        if (!check_chief(ps, id, in)) return;
        ps_log(ps, "shutdown by the chief (worker %u) at global step %lld after %llu pushes, %llu updates, %llu pulls",
               h->task, (long long)shard_step(ps), (unsigned long long)ps->pushes, (unsigned long long)ps->updates,
               (unsigned long long)ps->pulls);
        log_stale_summary(ps);
        dt_wire_header r = reply_to(ps, DT_MSG_ACK, h);
        dt_wire_send(ps->sock, id, &r, NULL, ZMQ_DONTWAIT, NULL);
        ps->shutdown = 1;
        serve_pending(ps);
        return;
    }
    case DT_MSG_DONE: {
        /* Counted per distinct worker task, so a resent DONE is not counted twice. */
        if (h->role != DT_ROLE_WORKER && h->role != DT_ROLE_CHIEF) {
            refuse(ps, id, in, DT_WIRE_E_ROLE, "only workers send DONE");
            return;
        }
        if (!ps->done && !(ps->done = dt_calloc(65536 / 8, 1, "ps done set", NULL))) {
            refuse(ps, id, in, DT_WIRE_E_NOMEM, "out of memory for the done set");
            return;
        }
        uint8_t bit = (uint8_t)(1u << (h->task & 7));
        if (!(ps->done[h->task >> 3] & bit)) {
            ps->done[h->task >> 3] |= bit;
            ps->n_done++;
            /* Every declared worker's line; from tasks not (yet) declared, a few, then a count. */
            int known = ps->workers && h->task < ps->workers;
            if (known || ++ps->n_done_logged <= LOG_DONE)
                ps_log(ps, "worker %u finished (%llu done)%s", h->task, (unsigned long long)ps->n_done,
                       !known && ps->n_done_logged == LOG_DONE ? "; further DONE from tasks the chief has not "
                       "declared are counted, not logged" : "");
        }
        dt_wire_header r = reply_to(ps, DT_MSG_ACK, h);
        dt_wire_send(ps->sock, id, &r, NULL, ZMQ_DONTWAIT, NULL);
        return;
    }
    case DT_MSG_TOKEN:
        refuse(ps, id, in, DT_WIRE_E_UNSUPPORTED, "TOKEN (sync mode) is not served by this ps");
        return;
    default:
        snprintf(msg, sizeof msg, "%s is a reply, not a request", dt_wire_type_name(h->type));
        refuse(ps, id, in, DT_WIRE_E_MALFORMED, msg);
        return;
    }
}

/* What libzmq itself bounds per connection: replies queued (a ROUTER drops replies to a peer past
 * its mark instead of queueing them) and the handshake's duration. Not requests (RECV_HWM) and not
 * silence: libzmq 4.3's heartbeat timer aborts the process when it fires on a connection that
 * reset while its queue was full, so peers.c watches silence in the kernel's counters instead. */
static int limit_socket(void *s, int handshake_ms, dt_error *err) {
    int snd = SEND_HWM, rcv = RECV_HWM;
    if (zmq_setsockopt(s, ZMQ_SNDHWM, &snd, sizeof snd) != 0 || zmq_setsockopt(s, ZMQ_RCVHWM, &rcv, sizeof rcv) != 0 ||
        zmq_setsockopt(s, ZMQ_HANDSHAKE_IVL, &handshake_ms, sizeof handshake_ms) != 0)
        return dt_errorf(err, DT_ENET, "zmq_setsockopt (connection bounds): %s", zmq_strerror(errno));
    return DT_OK;
}

/* ---- Metrics ---------------------------------------------------------------------------------- */

static void ps_metrics_open(ps_t *ps) {
    struct dt_metrics *r = ps->cfg->metrics;
    ps->m.step = dt_metrics_gauge(r, DT_M_GLOBAL_STEP, "Global step: updates this ps has applied to its shard.", NULL);
    ps->m.pushes = dt_metrics_counter(r, DT_M_PS_PUSHES, "Gradients this ps accepted.", NULL);
    ps->m.updates = dt_metrics_counter(r, "dtrain_ps_updates_total", "Optimizer updates this ps applied.", NULL);
    ps->m.pulls = dt_metrics_counter(r, DT_M_PS_PULLS, "Parameter replies this ps sent.", NULL);
    ps->m.refused = dt_metrics_counter(r, "dtrain_ps_refused_total", "Requests this ps refused (ERROR replies).", NULL);
    ps->m.live = dt_metrics_gauge(r, DT_M_PS_LIVE_WORKERS, "Workers this ps counts as alive: sync mode, those not "
                                  "lost; asynchronous, those declared that have not finished.", NULL);
    ps->m.rx = dt_metrics_counter(r, DT_M_RECEIVED, DT_M_RECEIVED_HELP, NULL);
    ps->m.tx = dt_metrics_counter(r, DT_M_SENT, DT_M_SENT_HELP, NULL);
    ps->m.wait = dt_metrics_histogram(r, "dtrain_ps_barrier_wait_seconds", "How long this ps held a PULL until its "
                                      "step was reached (the sync barrier).", NULL, dt_metrics_latency_bounds,
                                      dt_metrics_latency_n);
}

/* The ps's counts into its series; per worker stale counts only when one changed. */
static void ps_publish(ps_t *ps) {
    if (!ps->cfg->metrics) return;
    dt_metric_set(ps->m.step, (double)shard_step(ps));
    dt_metric_set(ps->m.pushes, (double)ps->pushes);
    dt_metric_set(ps->m.updates, (double)ps->updates);
    dt_metric_set(ps->m.pulls, (double)ps->pulls);
    dt_metric_set(ps->m.refused, (double)ps->refused);
    int live = ps->aggregate ? ps->total - ps->n_lost : ps->workers - (int)ps->n_done;
    dt_metric_set(ps->m.live, live > 0 ? live : 0);
    if (ps->stale && ps->n_stale != ps->m.stale_seen) {
        for (int w = 0; w < ps->total; w++) {
            char label[32];
            snprintf(label, sizeof label, "worker=\"%d\"", w);
            dt_metric_set(dt_metrics_counter(ps->cfg->metrics, "dtrain_ps_stale_gradients_total",
                                             "Sync mode: gradients this ps dropped as stale, per worker.", label),
                          (double)ps->stale[w]);
        }
        ps->m.stale_seen = ps->n_stale;
    }
}

static int ps_open(ps_t *ps, const dt_ps_config *cfg, dt_error *err) {
    int rc;
    ps->cfg = cfg;
    ps->n = cfg->shard_floats;
    if (!cfg->endpoint || !*cfg->endpoint)
        return dt_errorf(err, DT_EINVAL, "ps %d: no endpoint to bind", cfg->ps_index);
    if (cfg->shard_floats == 0 || cfg->shard_floats > DT_WIRE_MAX_SHARD_FLOATS)
        return dt_errorf(err, DT_EINVAL, "ps %d: shard of %zu floats (must be 1..%llu)", cfg->ps_index,
                         cfg->shard_floats, (unsigned long long)DT_WIRE_MAX_SHARD_FLOATS);
    if (cfg->ps_index < 0 || cfg->ps_index > UINT16_MAX)
        return dt_errorf(err, DT_EINVAL, "ps index %d out of range", cfg->ps_index);
    size_t end = 0;
    for (int r = 0; r < cfg->n_state_ranges; r++) {
        size_t off = cfg->state_ranges[2 * r], cnt = cfg->state_ranges[2 * r + 1];
        if (off < end || cnt > cfg->shard_floats || off > cfg->shard_floats - cnt)
            return dt_errorf(err, DT_EINVAL, "ps %d: state range %d [%zu, +%zu) out of order or outside the shard",
                             cfg->ps_index, r, off, cnt);
        end = off + cnt;
    }
    if (!(ps->ctx = zmq_ctx_new())) return dt_errorf(err, DT_ENET, "zmq_ctx_new: %s", zmq_strerror(errno));
    /* Every byte a ps moves is copied by a ZeroMQ I/O thread; libzmq spreads connections over its
     * I/O threads, so with more than one the workers' transfers are copied on several cores at once
     * instead of queueing behind one thread (1 by default). */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int io = cores < 1 ? 1 : cores > MAX_IO_THREADS ? MAX_IO_THREADS : (int)cores;
    if (zmq_ctx_set(ps->ctx, ZMQ_IO_THREADS, io) != 0)
        return dt_errorf(err, DT_ENET, "ps %d: zmq_ctx_set(ZMQ_IO_THREADS=%d): %s", cfg->ps_index, io,
                         zmq_strerror(errno));
    ps->sock = dt_zsock_open(ps->ctx, ZMQ_ROUTER, dt_wire_max_frame(ps->n), SHUTDOWN_LINGER_MS, -1, err);
    if (!ps->sock) return dt_error_wrap(err, DT_ENET, "ps %d: ", cfg->ps_index);
    if (limit_socket(ps->sock, cfg->first_message_ms > 0 ? cfg->first_message_ms : (int)(FIRST_MESSAGE_US / 1000), err))
        return dt_error_wrap(err, DT_ENET, "ps %d: ", cfg->ps_index);
    dt_peers_config pc = {.max_partial_bytes = dt_wire_max_frame(ps->n) + DT_WIRE_HEADER_SIZE,
                          .first_message_us = cfg->first_message_ms > 0 ? cfg->first_message_ms * INT64_C(1000)
                                                                        : FIRST_MESSAGE_US,
                          .message_us = MESSAGE_US,
                          .max_connections = cfg->max_connections > 0 ? cfg->max_connections : MAX_CONNECTIONS,
                          .queued_messages = QUEUED_ASSUMED,
                          .silence_us = PEER_SILENCE_MS * INT64_C(1000),
                          .log = cfg->log, .ps_index = cfg->ps_index};
    pc.budget_bytes = ps->budget = peers_budget(ps);
    if ((rc = dt_peers_open(&ps->peers, ps->ctx, ps->sock, &pc, err))) return dt_error_wrap(err, rc, "ps %d: ", cfg->ps_index);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "ps %d: ", cfg->ps_index);
    rc = dt_auth_server_start(&ps->zap, ps->ctx, ps->sock, cfg->auth, cfg->log, prefix, err);
    if (rc) return dt_error_wrap(err, rc, "%s", prefix);
    if (dt_zsock_bind(ps->sock, cfg->endpoint) != 0)
        return dt_errorf(err, DT_ENET, "ps %d: cannot bind %s: %s", cfg->ps_index, cfg->endpoint,
                         zmq_strerror(errno));
    char bound[256] = "";
    size_t len = sizeof bound;
    if (zmq_getsockopt(ps->sock, ZMQ_LAST_ENDPOINT, bound, &len) != 0) snprintf(bound, sizeof bound, "%s", cfg->endpoint);
    if (cfg->ipc_endpoint && zmq_bind(ps->sock, cfg->ipc_endpoint) != 0)
        return dt_errorf(err, DT_ENET, "ps %d: cannot bind %s: %s (DTRAIN_IPC=0 turns the same-host path off)",
                         cfg->ps_index, cfg->ipc_endpoint, zmq_strerror(errno));
    if (cfg->ipc_endpoint) ps_log(ps, "same-host workers connect on %s", cfg->ipc_endpoint);
    ps_metrics_open(ps);
    ps_log(ps, "serving %zu floats on %s", ps->n, bound);
    if (cfg->on_bound) cfg->on_bound(cfg->user, bound);
    return DT_OK;
}

static void ps_close(ps_t *ps) {
    for (int i = 0; i < ps->n_pending; i++) pending_drop(&ps->pending[i]);
    free(ps->pending);
    free(ps->owner);
    /* Snapshots still in flight are freed by their last message, at the latest while the context
     * terminates; peers referenced by replies in flight likewise. */
    init_state old = {.parts = ps->parts, .n_parts = ps->n_parts, .staleness = ps->staleness, .scratch = ps->scratch,
                      .sum = ps->sum, .stale = ps->stale, .last_seen = ps->last_seen, .lost = ps->lost};
    init_state_free(&old);
    dt_auth_server_stop(ps->zap);
    dt_peers_close(ps->peers);
    if (ps->sock) zmq_close(ps->sock);
    if (ps->ctx) zmq_ctx_term(ps->ctx); /* waits at most the socket linger to flush the last replies */
    free(ps->done);
}

int dt_ps_serve(const dt_ps_config *cfg, dt_error *err) {
    ps_t ps;
    memset(&ps, 0, sizeof ps);
    int rc = ps_open(&ps, cfg, err);
    const int poll_ms = cfg->poll_ms > 0 ? cfg->poll_ms : 100;
    ps.last_message_us = dt_clock_us();
    while (rc == DT_OK && !ps.shutdown) {
        dt_peers_events(ps.peers, on_peer_gone, &ps);
        if (cfg->stop && *cfg->stop) {
            ps_log(&ps, "stopped by a signal at global step %lld", (long long)shard_step(&ps));
            rc = dt_errorf(err, DT_EINTR, "ps %d: stopped by a signal", cfg->ps_index);
            break;
        }
        check_liveness(&ps);
        int64_t now = dt_clock_us();
        if (ps.failed[0] && now - ps.failed_at_us > ps.liveness_us) {
            rc = dt_errorf(err, DT_ETIMEOUT, "ps %d: %s", cfg->ps_index, ps.failed);
            break;
        }
        if (cfg->idle_timeout_ms > 0 && now - ps.last_message_us > (int64_t)cfg->idle_timeout_ms * 1000) {
            /* Nobody waits forever: a ps whose chief is gone (outside dtrain launch) ends too. */
            rc = dt_errorf(err, DT_ETIMEOUT, "ps %d: no message from any worker for %d s (--idle_timeout) at global "
                           "step %lld: the chief never ended training (is it gone?); exiting", cfg->ps_index,
                           cfg->idle_timeout_ms / 1000, (long long)shard_step(&ps));
            break;
        }
        if (ps.n_pending) pending_filter(&ps, keep_fresh, &now);
        zmq_pollitem_t items[2] = {{.socket = ps.sock, .events = ZMQ_POLLIN},
                                   {.socket = dt_peers_socket(ps.peers), .events = ZMQ_POLLIN}};
        int64_t check_ms = dt_peers_count(ps.peers) ? dt_peers_check_interval_us(ps.peers) / 1000 : poll_ms;
        int n = zmq_poll(items, 2, check_ms < poll_ms ? (long)check_ms : poll_ms);
        if (n < 0) {
            if (errno == EINTR) continue;
            rc = dt_errorf(err, DT_ENET, "ps %d: zmq_poll: %s", cfg->ps_index, zmq_strerror(errno));
            break;
        }
        int drained = !(items[0].revents & ZMQ_POLLIN);
        if (items[1].revents & ZMQ_POLLIN) dt_peers_events(ps.peers, on_peer_gone, &ps);
        /* Drained, as a rule: the connection checks below need it, and reading is cheap next to
         * what a message costs to handle; a flood faster than that is cut off by DRAIN_US. */
        for (int64_t until = dt_clock_us() + DRAIN_US; !drained && !ps.shutdown && dt_clock_us() < until;) {
            dt_wire_in in;
            dt_error e = {0};
            int r = dt_wire_recv(ps.sock, 1, &in, &e);
            if (r == DT_ETIMEOUT || r == DT_EINTR) {
                dt_wire_in_close(&in);
                drained = 1;
                break;
            }
            if (r == DT_ENET) {
                dt_wire_in_close(&in);
                rc = dt_errorf(err, DT_ENET, "ps %d: %s", cfg->ps_index, e.msg);
                break;
            }
            ps.last_message_us = dt_clock_us();
            dt_metric_add(ps.m.rx, (double)(DT_WIRE_HEADER_SIZE + zmq_msg_size(&in.payload)));
            ps.peer = dt_peers_of(ps.peers, in.srcfd);
            dt_peer_ref(ps.peer); /* held while handled: the table may drop it meanwhile */
            dt_peers_delivered(ps.peers, ps.peer, r == DT_OK && in.hdr.role != DT_ROLE_NONE);
            /* A FETCH copies the whole shard: its connection may have closed while it waited here
             * (closes are heard on the monitor); nobody would read that reply. */
            if (r == DT_OK && in.hdr.type == DT_MSG_FETCH) dt_peers_events(ps.peers, on_peer_gone, &ps);
            int answer = !dt_peer_gone(ps.peer); /* a closed connection's requests: nobody would read the answer */
            if (answer && r == DT_OK) handle(&ps, &in);
            else if (answer && in.has_identity)
                refuse(&ps, &in.identity, &in, r == DT_EPROTO ? DT_WIRE_E_VERSION : DT_WIRE_E_MALFORMED, e.msg);
            dt_peer_unref(ps.peer);
            ps.peer = NULL;
            dt_wire_in_close(&in);
        }
        /* The counters are read with the router drained, so a connection's unread bytes are its
         * unfinished message, not whole ones waiting here; a flood that keeps the router from
         * draining gets the looser check (peers.h) rather than none. */
        ps_publish(&ps);
        dt_peers_set_other(ps.peers, (uint64_t)ps.n_pending * (sizeof(pending_pull) + 64));
        int64_t since = dt_clock_us() - ps.peers_checked_us, every = dt_peers_check_interval_us(ps.peers);
        if ((drained && since >= every) || since >= 4 * every) {
            dt_peers_check(ps.peers, drained);
            ps.peers_checked_us = dt_clock_us();
        }
    }
    if (cfg->stats) {
        cfg->stats->global_step = shard_step(&ps);
        cfg->stats->pushes = ps.pushes;
        cfg->stats->updates = ps.updates;
        cfg->stats->stale = ps.n_stale;
        cfg->stats->pulls = ps.pulls;
        cfg->stats->refused = ps.refused;
        cfg->stats->cut = ps.peers ? dt_peers_cut_count(ps.peers) : 0;
        cfg->stats->pending = ps.n_pending;
        cfg->stats->initialised = ps.initialised;
    }
    ps_close(&ps);
    return rc;
}
