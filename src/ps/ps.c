#include "ps/ps.h"

#include <errno.h>
#include <math.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "compute/optim.h"
#include "core/error.h"
#include "ps/peers.h"
#include "transport/auth.h"
#include "transport/wire.h"
#include "transport/zmq_io.h"

#define MAX_PENDING 4096      /* deferred PULLs (waiting for a later step), bounded */
#define PENDING_PER_PEER 4    /* deferred PULLs one connection may hold */
#define ASYNC_AHEAD 1024      /* async: a deferred PULL may wait for at most this many steps ahead */
#define PENDING_MAX_WAIT_US (600 * INT64_C(1000000)) /* no deferred PULL is held longer (async) */
#define REPLIES_PER_PEER 2    /* large replies (PARAMS, STATE) libzmq may hold for one connection */
#define PEER_HWM 16           /* messages queued per connection, each way */
#define FIRST_MESSAGE_US (10 * INT64_C(1000000))  /* a new connection's first message, at the latest */
#define MESSAGE_US (120 * INT64_C(1000000))       /* a large message, once begun, must finish */
#define MAX_CONNECTIONS 1024
#define PEER_SILENCE_MS 30000 /* a connection with no traffic at all (not even heartbeats) for this long is dropped */
#define BATCH 64              /* messages handled per poll wake-up before checking *stop */
#define LOG_REFUSALS 20       /* refusals logged one by one; later ones only counted */
#define LOG_STALE 3           /* stale gradients logged one by one per worker; later ones counted */
#define SHUTDOWN_LINGER_MS 1000
#define SNAP_POOL 8           /* snapshot buffers; more in flight at once fall back to a copy */
#define SNAP_KEEP 4           /* sync mode: steps whose snapshot is kept for EXACT pulls */
#define MAX_IO_THREADS 4      /* ZeroMQ I/O threads of a ps: one per core up to this */

/* A snapshot of the shard at one step, sent zero-copy to every puller of that step. An update is
 * written out of place into a free snapshot buffer, which then holds the current values (no copy
 * per step); a buffer that messages still hold is never written. refs counts
 * the ps's own reference (while it keeps the snapshot) plus each message libzmq still holds;
 * libzmq's I/O thread drops its references, hence the atomic. A buffer with refs == 0 is reused:
 * the pool keeps the allocator (and the kernel's page faults) out of the steady state. */
typedef struct {
    atomic_int refs;
    int kept;                 /* the ps holds a reference (only the ps thread reads this) */
    int64_t step;
    float *data;              /* [n] */
} snap_buf;

typedef struct {
    zmq_msg_t identity;
    dt_wire_header req;
    dt_peer *peer;            /* its connection (a reference), NULL if unknown */
    int64_t since_us;         /* when it arrived (its barrier wait is reported in the reply) */
} pending_pull;

/* What a large reply's free function releases: the snapshot it was sent from, or its own buffer,
 * and its place in the connection's count of replies in flight. */
typedef struct {
    snap_buf *snap;
    void *own;
    dt_peer *peer;
} reply_hold;

/* Sync mode: the gradients received for one step, held as received (no copy) until
 * replicas_to_aggregate of them are in; then summed in worker-index order. */
typedef struct {
    int64_t step;             /* -1: empty */
    int count;
    uint16_t *worker;         /* [aggregate] */
    zmq_msg_t *grad;          /* [aggregate] payloads */
} accum;

typedef struct {
    const dt_ps_config *cfg;
    size_t n;                 /* shard floats */
    void *ctx, *sock;
    dt_zap *zap;              /* --auth=curve: the ZAP handler thread */
    dt_peers *peers;          /* the connections, watched and bounded (peers.h) */
    dt_peer *peer;            /* the connection of the message being handled (NULL: unknown) */
    int64_t peers_checked_us;
    int workers;              /* from INIT: worker tasks in the cluster (0: not told) */
    float *params;            /* [n] the current values: own, or the current step's snapshot */
    float *own;               /* [n] the ps's private copy, when no snapshot buffer is free (and after INIT) */
    float *state;             /* [slots * n], slot-major as dt_opt_apply wants */
    float *scratch;           /* [n] aligned copy of a misaligned gradient frame (rare) */
    dt_opt_config opt;
    int slots, initialised, shutdown;
    uint8_t generation;       /* of the INIT that set the shard (1..255), reported in every reply */
    int64_t step;
    uint64_t pushes, updates, pulls, refused;
    /* PARAMS replies share one snapshot per step, so n workers pulling the same step cost one
     * memcpy, and pushes never tear a reply in flight. Sync mode keeps the last SNAP_KEEP steps, so a
     * worker can pull every shard at one step (EXACT) even if this ps has moved on. */
    snap_buf snaps[SNAP_POOL];
    int n_snaps;
    pending_pull *pending;
    int n_pending;
    uint8_t *done;            /* [65536 / 8] bitmap of worker tasks that sent DONE (lazily allocated) */
    uint64_t n_done;
    /* Sync replicas (INIT's configuration): aggregate == 0 means asynchronous. */
    int aggregate, total, staleness;
    accum *acc;               /* [staleness + 1], step t in acc[t % (staleness + 1)] */
    float *sum;               /* [n] the mean gradient of a step */
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
} ps_t;

static int64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

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

/* A reply header for a request: same request id, this ps's index and step. */
static dt_wire_header reply_to(const ps_t *ps, dt_msg_type type, const dt_wire_header *req) {
    dt_wire_header h = dt_wire_header_make(type, DT_ROLE_PS, (uint16_t)ps->cfg->ps_index, req->request_id);
    h.shard = (uint32_t)ps->cfg->ps_index;
    h.global_step = ps->step;
    h.local_step = req->local_step;
    h.shard_floats = ps->n;
    h.initialised = ps->initialised ? ps->generation : 0;
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

/* libzmq's I/O thread is done with a large reply. */
static void reply_release(void *data, void *hint) {
    (void)data;
    reply_hold *h = hint;
    if (h->snap) atomic_fetch_sub(&h->snap->refs, 1);
    free(h->own);
    dt_peer_reply_done(h->peer);
    free(h);
}

/* A large reply to the current connection, zero-copy from a snapshot (snap) or from a buffer it
 * then owns (own, freed with it). Counts against the connection's replies in flight: 1 if it
 * already has REPLIES_PER_PEER unread (nothing is sent; own is freed), DT_ENOMEM, or DT_OK. */
static int reply_msg(ps_t *ps, dt_peer *peer, zmq_msg_t *m, void *data, size_t bytes, snap_buf *snap, void *own) {
    reply_hold *h = NULL;
    if (!dt_peer_reply_begin(peer, REPLIES_PER_PEER)) {
        free(own);
        return 1;
    }
    if (!(h = malloc(sizeof *h))) {
        dt_peer_reply_done(peer);
        free(own);
        return DT_ENOMEM;
    }
    *h = (reply_hold){.snap = snap, .own = own, .peer = peer};
    if (snap) atomic_fetch_add(&snap->refs, 1);
    if (zmq_msg_init_data(m, data, bytes, reply_release, h) != 0) {
        reply_release(data, h);
        return DT_ENOMEM;
    }
    return DT_OK;
}

static void snap_unkeep(snap_buf *b) {
    if (!b->kept) return;
    b->kept = 0;
    atomic_fetch_sub(&b->refs, 1);
}

/* Drops the snapshots the ps no longer needs: steps before the keep window (async: all but the
 * current step), or all of them (all = 1: INIT replaced the values). */
static void snap_trim(ps_t *ps, int all) {
    int64_t oldest = ps->step - (ps->aggregate ? SNAP_KEEP - 1 : 0);
    for (int i = 0; i < ps->n_snaps; i++)
        if (all || ps->snaps[i].step < oldest) snap_unkeep(&ps->snaps[i]);
}

static snap_buf *snap_find(ps_t *ps, int64_t step) {
    for (int i = 0; i < ps->n_snaps; i++)
        if (ps->snaps[i].kept && ps->snaps[i].step == step) return &ps->snaps[i];
    return NULL;
}

/* A buffer neither kept nor held by a message, now the snapshot of `step` (kept; the caller
 * fills it); NULL if every buffer is in flight. */
static snap_buf *snap_claim(ps_t *ps, int64_t step) {
    snap_buf *b = NULL;
    snap_trim(ps, 0);
    for (int i = 0; i < ps->n_snaps && !b; i++)
        if (atomic_load(&ps->snaps[i].refs) == 0) b = &ps->snaps[i];
    if (!b && ps->n_snaps < SNAP_POOL &&
        (ps->snaps[ps->n_snaps].data = dt_alloc_floats(ps->n, "ps snapshot", NULL)))
        b = &ps->snaps[ps->n_snaps++];
    if (!b) return NULL;
    b->step = step;
    b->kept = 1;
    atomic_store(&b->refs, 1);
    return b;
}

/* The snapshot of the current step: the current values themselves after an update, else a copy
 * made now; NULL if every buffer is in flight. */
static snap_buf *snap_current(ps_t *ps) {
    snap_buf *b = snap_find(ps, ps->step);
    if (b) return b;
    if ((b = snap_claim(ps, ps->step))) memcpy(b->data, ps->params, ps->n * sizeof(float));
    return b;
}

/* Applies one (mean) gradient and moves to the next step, writing the new values into a free
 * snapshot buffer (the next PULLs send it as is); the old values stay intact for messages still
 * holding them and, in sync mode, EXACT pulls. With every buffer in flight the ps's own copy takes
 * the update. */
static void advance(ps_t *ps, const float *grads) {
    snap_buf *b = snap_claim(ps, ps->step + 1);
    float *out = b ? b->data : ps->own;
    dt_opt_apply_to(&ps->opt, out, ps->params, grads, ps->state, ps->n, ps->step);
    ps->params = out;
    ps->step++;
    snap_trim(ps, 0);
}

/* The payload of a PARAMS reply at `step` (the current one, or a kept one) for peer: DT_OK,
 * DT_ENOMEM, 1 if the peer has too many replies unread, or 2 if that step is no longer kept. */
static int params_msg(ps_t *ps, dt_peer *peer, int64_t step, zmq_msg_t *m) {
    const size_t bytes = ps->n * sizeof(float);
    snap_buf *b = step == ps->step ? snap_current(ps) : snap_find(ps, step);
    if (b) return reply_msg(ps, peer, m, b->data, bytes, b, NULL);
    if (step != ps->step) return 2;
    /* every buffer still in flight: a copy of its own */
    float *copy = malloc(bytes);
    if (!copy) return DT_ENOMEM;
    memcpy(copy, ps->params, bytes);
    return reply_msg(ps, peer, m, copy, bytes, NULL, copy);
}

/* Answers a PULL with the parameters at the step it asked for: the current step, or for an EXACT
 * pull of an earlier step its kept snapshot (else ERROR 109). waited_us goes to the reply. */
static void send_params(ps_t *ps, dt_peer *peer, zmq_msg_t *identity, const dt_wire_header *req, int64_t waited_us) {
    int64_t step = (req->flags & DT_WIRE_F_EXACT) ? req->global_step : ps->step;
    zmq_msg_t m;
    int rc = params_msg(ps, peer, step, &m);
    dt_wire_header r = reply_to(ps, rc ? DT_MSG_ERROR : DT_MSG_PARAMS, req);
    if (rc == 2) {
        dt_wire_send_error(ps->sock, identity, r, DT_WIRE_E_GONE,
                           "ps %d: step %lld is no longer kept (now at step %lld, keeping the last %d)",
                           ps->cfg->ps_index, (long long)step, (long long)ps->step, SNAP_KEEP);
        return;
    }
    if (rc == 1) {
        dt_wire_send_error(ps->sock, identity, r, DT_WIRE_E_BUSY,
                           "ps %d: %d earlier replies to this connection are still unread: read them first",
                           ps->cfg->ps_index, REPLIES_PER_PEER);
        return;
    }
    if (rc) {
        dt_wire_send_error(ps->sock, identity, r, DT_WIRE_E_NOMEM, "ps %d: out of memory for a PARAMS reply",
                           ps->cfg->ps_index);
        return;
    }
    r.global_step = step;
    r.count_a = waited_us > 0 ? (uint64_t)waited_us : 0;
    ps->pulls++;
    dt_wire_send(ps->sock, identity, &r, &m, ZMQ_DONTWAIT, NULL);
}

/* Whether a PULL can be answered now: a minimum step reached, or an exact step reached (a passed
 * exact step is answered too: from its snapshot, or with ERROR 109). */
static int pull_ready(const ps_t *ps, const dt_wire_header *req) { return req->global_step <= ps->step; }

/* Answers every deferred PULL with an ERROR: the ps is shutting down, was re-initialised (the
 * steps they wait for may never come) or has stopped the job (strict). */
static void fail_pending(ps_t *ps, int32_t status, const char *text) {
    for (int i = 0; i < ps->n_pending; i++) {
        pending_pull *p = &ps->pending[i];
        dt_wire_header r = reply_to(ps, DT_MSG_ERROR, &p->req);
        dt_wire_send_error(ps->sock, &p->identity, r, status, "ps %d: %s", ps->cfg->ps_index, text);
        zmq_msg_close(&p->identity);
        dt_peer_unref(p->peer);
    }
    ps->n_pending = 0;
}

/* Removes the deferred PULLs that keep(ps, p, user) rejects (their identities and peers released;
 * nothing is sent), keeping the others in order. */
static void pending_filter(ps_t *ps, int (*keep)(ps_t *, pending_pull *, void *), void *user) {
    int kept = 0;
    for (int i = 0; i < ps->n_pending; i++) {
        pending_pull *p = &ps->pending[i];
        if (!keep(ps, p, user)) {
            zmq_msg_close(&p->identity);
            dt_peer_unref(p->peer);
            continue;
        }
        if (kept != i) { /* zmq_msg_t must be moved, not copied */
            pending_pull *dst = &ps->pending[kept];
            zmq_msg_init(&dst->identity);
            zmq_msg_move(&dst->identity, &p->identity);
            dst->req = p->req;
            dst->peer = p->peer;
            dst->since_us = p->since_us;
        }
        kept++;
    }
    ps->n_pending = kept;
}

/* Answers the deferred PULLs whose step has been reached (all of them with an ERROR when the ps
 * is shutting down). */
static int keep_unready(ps_t *ps, pending_pull *p, void *user) {
    (void)user;
    if (!pull_ready(ps, &p->req)) return 1;
    send_params(ps, p->peer, &p->identity, &p->req, now_us() - p->since_us);
    return 0;
}

static void serve_pending(ps_t *ps) {
    if (ps->shutdown) {
        fail_pending(ps, DT_WIRE_E_SHUTDOWN, "shutting down (training is over)");
        return;
    }
    pending_filter(ps, keep_unready, NULL);
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
 * so holding it longer only holds memory. */
static int64_t pending_max_wait(const ps_t *ps) {
    return ps->liveness_us > 0 && 2 * ps->liveness_us < PENDING_MAX_WAIT_US ? 2 * ps->liveness_us : PENDING_MAX_WAIT_US;
}

static int keep_fresh(ps_t *ps, pending_pull *p, void *now) {
    if (*(int64_t *)now - p->since_us <= pending_max_wait(ps)) return 1;
    dt_wire_header r = reply_to(ps, DT_MSG_ERROR, &p->req);
    dt_wire_send_error(ps->sock, &p->identity, r, DT_WIRE_E_BUSY, "ps %d: step %lld did not come within %lld s",
                       ps->cfg->ps_index, (long long)p->req.global_step, (long long)(pending_max_wait(ps) / 1000000));
    return 0;
}

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

/* Sync replicas state, built whole from INIT before anything of the ps changes (so a failed
 * allocation leaves the ps as it was). aggregate 0: asynchronous, nothing allocated. */
typedef struct {
    int aggregate, total, staleness;
    accum *acc;               /* [staleness + 1] */
    float *sum;               /* [n] */
    uint64_t *stale;          /* [total]; NULL: keep the ps's counts (same number of replicas) */
    int64_t *last_seen;       /* [total] */
    uint8_t *lost;            /* [total] */
} sync_state;

static void sync_state_free(sync_state *s) {
    for (int i = 0; s->acc && i <= s->staleness; i++) {
        for (int k = 0; k < s->acc[i].count; k++) zmq_msg_close(&s->acc[i].grad[k]);
        free(s->acc[i].worker);
        free(s->acc[i].grad);
    }
    free(s->acc), free(s->sum), free(s->stale), free(s->last_seen), free(s->lost);
    memset(s, 0, sizeof *s);
}

static int sync_prepare(ps_t *ps, int aggregate, int total, int staleness, sync_state *s) {
    memset(s, 0, sizeof *s);
    if (!aggregate) return DT_OK;
    *s = (sync_state){.aggregate = aggregate, .total = total, .staleness = staleness};
    int keep_stale = total == ps->total && ps->stale; /* stale counts survive a re-INIT alike */
    if (!keep_stale) s->stale = dt_calloc((size_t)total, sizeof *s->stale, "ps stale counts", NULL);
    s->last_seen = dt_calloc((size_t)total, sizeof *s->last_seen, "ps worker liveness", NULL);
    s->lost = dt_calloc((size_t)total, sizeof *s->lost, "ps worker liveness", NULL);
    s->sum = dt_alloc_floats(ps->n, "ps gradient mean", NULL);
    s->acc = dt_calloc((size_t)staleness + 1, sizeof *s->acc, "ps accumulators", NULL);
    if ((!keep_stale && !s->stale) || !s->last_seen || !s->lost || !s->sum || !s->acc ||
        (!ps->scratch && !(ps->scratch = dt_alloc_floats(ps->n, "ps gradient scratch", NULL)))) {
        sync_state_free(s);
        return DT_ENOMEM;
    }
    for (int i = 0; i <= staleness; i++) {
        s->acc[i].step = -1;
        s->acc[i].worker = dt_calloc((size_t)aggregate, sizeof *s->acc[i].worker, "ps accumulator", NULL);
        s->acc[i].grad = dt_calloc((size_t)aggregate, sizeof *s->acc[i].grad, "ps accumulator", NULL);
        if (!s->acc[i].worker || !s->acc[i].grad) {
            sync_state_free(s);
            return DT_ENOMEM;
        }
    }
    /* Every worker counts as just seen: a worker that never shows up is lost after the timeout. */
    int64_t now = now_us();
    for (int w = 0; w < total; w++) s->last_seen[w] = now;
    return DT_OK;
}

/* The ps's sync state as a sync_state (to free it), its fields cleared. */
static sync_state sync_take(ps_t *ps) {
    sync_state old = {.aggregate = ps->aggregate, .total = ps->total, .staleness = ps->staleness, .acc = ps->acc,
                      .sum = ps->sum, .stale = ps->stale, .last_seen = ps->last_seen, .lost = ps->lost};
    ps->acc = NULL, ps->sum = NULL, ps->stale = NULL, ps->last_seen = NULL, ps->lost = NULL;
    ps->n_lost = 0;
    ps->aggregate = ps->total = ps->staleness = 0;
    return old;
}

static void sync_free(ps_t *ps) {
    sync_state old = sync_take(ps);
    sync_state_free(&old);
}

/* Cannot fail: s was allocated whole by sync_prepare. Held gradients are dropped. */
static void sync_commit(ps_t *ps, sync_state *s) {
    sync_state old = sync_take(ps);
    if (s->aggregate && !s->stale) s->stale = old.stale, old.stale = NULL;
    sync_state_free(&old);
    ps->aggregate = s->aggregate, ps->total = s->total, ps->staleness = s->staleness;
    ps->acc = s->acc, ps->sum = s->sum, ps->stale = s->stale, ps->last_seen = s->last_seen, ps->lost = s->lost;
    memset(s, 0, sizeof *s);
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

/* The whole shard for a checkpoint: parameters, then the optimizer state slot-major, as INIT takes
 * them back (a restore is an INIT with this payload and step). */
static void on_fetch(ps_t *ps, zmq_msg_t *id, dt_wire_in *in) {
    if (!check_ready(ps, id, in)) return;
    const size_t pbytes = ps->n * sizeof(float), sbytes = (size_t)ps->slots * pbytes;
    char *d = malloc(pbytes + sbytes);
    if (!d) {
        refuse(ps, id, in, DT_WIRE_E_NOMEM, "out of memory for a STATE reply");
        return;
    }
    memcpy(d, ps->params, pbytes);
    if (sbytes) memcpy(d + pbytes, ps->state, sbytes);
    zmq_msg_t m;
    int rc = reply_msg(ps, ps->peer, &m, d, pbytes + sbytes, NULL, d);
    if (rc) {
        char msg[128];
        snprintf(msg, sizeof msg, rc == 1 ? "%d earlier replies to this connection are still unread: read them first"
                                          : "out of memory for a STATE reply", REPLIES_PER_PEER);
        refuse(ps, id, in, rc == 1 ? DT_WIRE_E_BUSY : DT_WIRE_E_NOMEM, msg);
        return;
    }
    dt_wire_header r = reply_to(ps, DT_MSG_STATE, &in->hdr);
    put_optimizer(ps, &r);
    dt_wire_send(ps->sock, id, &r, &m, ZMQ_DONTWAIT, NULL);
}

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

/* What all connections' unfinished messages may hold together: every worker's gradient in
 * flight at once, two of the largest messages (an INIT, a STATE-sized one) and room to spare. */
static uint64_t peers_budget(const ps_t *ps) {
    uint64_t shard = (uint64_t)ps->n * sizeof(float);
    return 2 * dt_wire_max_frame(ps->n) + (uint64_t)(ps->workers > 0 ? ps->workers : 8) * shard + (UINT64_C(64) << 20);
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
    dt_opt_config opt = {.kind = (dt_opt_kind)h->opt_kind, .learning_rate = h->learning_rate,
                         .momentum = h->momentum, .beta1 = h->beta1, .beta2 = h->beta2, .epsilon = h->epsilon};
    if (!(opt.learning_rate > 0.0f)) {
        snprintf(msg, sizeof msg, "INIT with learning_rate %g, must be positive", (double)opt.learning_rate);
        refuse(ps, id, in, DT_WIRE_E_BAD_VALUE, msg);
        return;
    }
    int slots = dt_opt_slots(&opt);
    /* Non-finite values would only show up later as a NaN loss, far from their source. The payload
     * may be misaligned (libzmq promises nothing), so it is read through memcpy. */
    const char *data = zmq_msg_data(&in->payload);
    size_t total = (size_t)(1 + slots) * ps->n, bad = total;
    for (size_t i = 0; i < total && bad == total; i++) {
        float v;
        memcpy(&v, data + i * sizeof v, sizeof v);
        if (!isfinite(v)) bad = i;
    }
    if (bad < total) {
        float v;
        memcpy(&v, data + bad * sizeof v, sizeof v);
        if (bad < ps->n)
            snprintf(msg, sizeof msg, "INIT holds a non-finite parameter (%g at float %zu of the shard)", (double)v, bad);
        else
            snprintf(msg, sizeof msg, "INIT holds a non-finite optimizer state value (%g at float %zu of slot %zu)",
                     (double)v, (bad - ps->n) % ps->n, (bad - ps->n) / ps->n);
        refuse(ps, id, in, DT_WIRE_E_BAD_VALUE, msg);
        return;
    }
    /* Everything INIT needs is allocated before anything changes: a refusal leaves the ps as it was. */
    float *st = NULL;
    if ((slots != ps->slots || !ps->state) && !(st = dt_alloc_floats(slots ? (size_t)slots * ps->n : 1,
                                                                    "ps optimizer state", NULL))) {
        refuse(ps, id, in, DT_WIRE_E_NOMEM, "out of memory for the optimizer state");
        return;
    }
    sync_state sy;
    /* Bounds checked by the decoder: aggregate <= total <= DT_WIRE_MAX_REPLICAS, staleness <= its limit. */
    if (sync_prepare(ps, (int)h->count_a, (int)h->count_b, (int)h->count_c, &sy)) {
        free(st);
        refuse(ps, id, in, DT_WIRE_E_NOMEM, "out of memory for the sync accumulators");
        return;
    }
    if (st) {
        free(ps->state);
        ps->state = st;
        ps->slots = slots;
    }
    sync_commit(ps, &sy);
    ps->workers = (int)h->count_b;
    ps->params = ps->own; /* snapshots may still be in flight: never overwritten */
    memcpy(ps->params, data, ps->n * sizeof(float));
    memcpy(ps->state, data + ps->n * sizeof(float), (size_t)slots * ps->n * sizeof(float));
    ps->opt = opt;
    prune_done(ps);
    if (ps->peers) dt_peers_set_budget(ps->peers, peers_budget(ps));
    char mode[256] = "asynchronous";
    if (ps->aggregate)
        snprintf(mode, sizeof mode, "sync replicas: mean of %d of %d workers' gradients per step, staleness %d",
                 ps->aggregate, ps->total, ps->staleness);
    if (ps->aggregate && h->local_step)
        snprintf(mode + strlen(mode), sizeof mode - strlen(mode), "; a worker silent %lld ms is lost%s",
                 (long long)h->local_step, (h->flags & DT_WIRE_F_STRICT) ? " and stops the job (strict)" : "");
    ps_log(ps, "%s by the chief (worker %u) at global step %lld (generation %u): %zu floats, %s, learning rate %g, %s",
           ps->initialised ? "re-initialised" : "initialised", h->task, (long long)h->global_step, h->initialised,
           ps->n, dt_opt_name(opt.kind), (double)opt.learning_rate, mode);
    /* PULLs held for a step of the old values: their workers pull again (a rollback). */
    if (ps->n_pending) {
        snprintf(msg, sizeof msg, "re-initialised by the chief at global step %lld (generation %u): pull again",
                 (long long)h->global_step, h->initialised);
        fail_pending(ps, DT_WIRE_E_RESYNC, msg);
    }
    ps->initialised = 1;
    ps->generation = h->initialised;
    ps->step = h->global_step;
    ps->liveness_us = ps->aggregate ? h->local_step * 1000 : 0;
    ps->strict = (h->flags & DT_WIRE_F_STRICT) != 0;
    ps->failed[0] = '\0';
    snap_trim(ps, 1); /* same step numbers, new values */
    dt_wire_header r = reply_to(ps, DT_MSG_ACK, h);
    dt_wire_send(ps->sock, id, &r, NULL, ZMQ_DONTWAIT, NULL);
}

/* A gradient's payload as aligned floats (libzmq promises no alignment: copied if needed); NULL if
 * the copy cannot be allocated. */
static const float *grad_floats(ps_t *ps, zmq_msg_t *m) {
    const float *g = zmq_msg_data(m);
    if ((uintptr_t)g % alignof(float) == 0) return g;
    if (!ps->scratch && !(ps->scratch = dt_alloc_floats(ps->n, "ps gradient scratch", NULL))) return NULL;
    memcpy(ps->scratch, g, ps->n * sizeof(float));
    return ps->scratch;
}

static void push_ack(ps_t *ps, zmq_msg_t *id, const dt_wire_header *req, int32_t status, uint64_t stale) {
    dt_wire_header r = reply_to(ps, DT_MSG_PUSH_ACK, req);
    r.status = status;
    r.count_a = stale;
    dt_wire_send(ps->sock, id, &r, NULL, ZMQ_DONTWAIT, NULL);
}

/* Applies the mean of the current step's gradients, summed in worker-index order (so the result
 * does not depend on arrival order), and moves to the next step. */
static void apply_sync_step(ps_t *ps) {
    accum *a = &ps->acc[ps->step % (ps->staleness + 1)];
    for (int i = 1; i < a->count; i++) /* insertion sort by worker index; count is small */
        for (int j = i; j > 0 && a->worker[j - 1] > a->worker[j]; j--) {
            uint16_t w = a->worker[j];
            a->worker[j] = a->worker[j - 1], a->worker[j - 1] = w;
            zmq_msg_t t;
            zmq_msg_init(&t);
            zmq_msg_move(&t, &a->grad[j]);
            zmq_msg_move(&a->grad[j], &a->grad[j - 1]);
            zmq_msg_move(&a->grad[j - 1], &t);
        }
    /* mean = ((g0 + g1) + g2 ...) / count in count - 1 passes: the first reads g0 and g1 where they
     * arrived, the division rides on the last; a single gradient is its own mean (no copy).
     * grad_floats may use the scratch buffer (it exists in sync mode), so a misaligned g0 goes to
     * sum first. */
    const size_t n = ps->n;
    const float *mean = ps->sum;
    if (a->count == 1) {
        mean = grad_floats(ps, &a->grad[0]);
    } else {
        float *sum = ps->sum;
        const float div = (float)a->count;
        const float *g0 = zmq_msg_data(&a->grad[0]);
        if ((uintptr_t)g0 % alignof(float) != 0) {
            memcpy(sum, g0, n * sizeof(float));
            g0 = sum;
        }
        for (int k = 1; k < a->count; k++) {
            const float *g = grad_floats(ps, &a->grad[k]), *acc = k == 1 ? g0 : sum;
            if (k < a->count - 1)
                for (size_t i = 0; i < n; i++) sum[i] = acc[i] + g[i];
            else
                for (size_t i = 0; i < n; i++) sum[i] = (acc[i] + g[i]) / div;
        }
    }
    /* Kept for EXACT pulls of this step from workers that see another shard ahead. */
    snap_current(ps);
    advance(ps, mean);
    for (int k = 0; k < a->count; k++) zmq_msg_close(&a->grad[k]);
    a->count = 0;
    a->step = -1;
    ps->updates++;
    serve_pending(ps);
}

/* Gradients a step needs: replicas_to_aggregate, or the live workers if fewer are left. */
static int needed(const ps_t *ps) {
    int live = ps->total - ps->n_lost;
    return live < ps->aggregate ? (live > 0 ? live : 1) : ps->aggregate;
}

/* Applies every complete step (with staleness, later steps may be complete already). */
static void apply_complete_steps(ps_t *ps) {
    for (;;) {
        accum *a = &ps->acc[ps->step % (ps->staleness + 1)];
        if (a->count == 0 || a->step != ps->step || a->count < needed(ps)) return;
        apply_sync_step(ps);
    }
}

/* A sync-mode gradient for step t = local_step: stale (t < step) is dropped and counted; fresh is
 * held for its step; a complete step (replicas_to_aggregate gradients) is applied at once. */
static void on_sync_push(ps_t *ps, zmq_msg_t *id, dt_wire_in *in) {
    const dt_wire_header *h = &in->hdr;
    char msg[256];
    if (h->task >= ps->total) {
        snprintf(msg, sizeof msg, "gradient from worker %u, but the chief declared %d replicas (--total_num_replicas)",
                 h->task, ps->total);
        refuse(ps, id, in, DT_WIRE_E_BAD_VALUE, msg);
        return;
    }
    const int64_t t = h->local_step;
    if (t < ps->step) {
        uint64_t k = ++ps->stale[h->task];
        ps->n_stale++;
        if (k <= LOG_STALE)
            ps_log(ps, "stale gradient from worker %u for step %lld (now at step %lld): dropped%s", h->task,
                   (long long)t, (long long)ps->step, k == LOG_STALE ? "; further ones from it are counted" : "");
        push_ack(ps, id, h, DT_WIRE_STALE, k);
        return;
    }
    if (t > ps->step + ps->staleness) {
        /* A worker ahead of the ps: the chief rolled the cluster back; it pulls again. */
        snprintf(msg, sizeof msg, "gradient for step %lld, but this ps is at step %lld and staleness %d allows at most %lld",
                 (long long)t, (long long)ps->step, ps->staleness, (long long)(ps->step + ps->staleness));
        refuse(ps, id, in, DT_WIRE_E_RESYNC, msg);
        return;
    }
    accum *a = &ps->acc[t % (ps->staleness + 1)];
    int k = 0;
    while (k < a->count && a->worker[k] != h->task) k++;
    if (k < a->count) {
        /* A second gradient from one worker for one step: the worker restarted (or gave up waiting
         * and pulled again) and computed it afresh. The newer one replaces the first. */
        ps_log(ps, "worker %u sent step %lld's gradient again (restarted?): the newer one replaces it", h->task,
               (long long)t);
        zmq_msg_close(&a->grad[k]);
    } else {
        a->worker[a->count++] = h->task;
    }
    a->step = t;
    zmq_msg_init(&a->grad[k]);
    zmq_msg_move(&a->grad[k], &in->payload);
    ps->pushes++;
    apply_complete_steps(ps);
    push_ack(ps, id, h, DT_WIRE_OK, ps->stale[h->task]);
}

static void on_push(ps_t *ps, zmq_msg_t *id, dt_wire_in *in) {
    if (!check_ready(ps, id, in) || !check_payload(ps, id, in)) return;
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
        on_sync_push(ps, id, in);
        return;
    }
    const float *g = grad_floats(ps, &in->payload);
    if (!g) {
        refuse(ps, id, in, DT_WIRE_E_NOMEM, "out of memory for a misaligned gradient");
        return;
    }
    advance(ps, g);
    ps->pushes++;
    ps->updates++;
    push_ack(ps, id, &in->hdr, DT_WIRE_OK, 0);
    if (ps->n_pending) serve_pending(ps);
}

/* The latest step a deferred PULL may wait for: sync, the next step a worker can push for (a
 * worker runs at most staleness steps ahead), plus one for an exact pull of a shard ahead; async,
 * a bounded distance. Later steps cannot come soon: the PULL is refused, not held. */
static int64_t pull_horizon(const ps_t *ps) {
    return ps->step + (ps->aggregate ? ps->staleness + 2 : ASYNC_AHEAD);
}

static void on_pull(ps_t *ps, zmq_msg_t *id, dt_wire_in *in) {
    char msg[192];
    if (!check_ready(ps, id, in)) return;
    if (pull_ready(ps, &in->hdr)) {
        send_params(ps, ps->peer, id, &in->hdr, 0);
        return;
    }
    if (in->hdr.global_step > pull_horizon(ps)) {
        snprintf(msg, sizeof msg, "PULL waits for step %lld, but this ps is at step %lld and holds PULLs for at most "
                 "step %lld", (long long)in->hdr.global_step, (long long)ps->step, (long long)pull_horizon(ps));
        refuse(ps, id, in, DT_WIRE_E_BAD_VALUE, msg);
        return;
    }
    int mine = 0;
    for (int i = 0; i < ps->n_pending && ps->peer; i++) mine += ps->pending[i].peer == ps->peer;
    if (mine >= PENDING_PER_PEER || ps->n_pending >= MAX_PENDING) {
        snprintf(msg, sizeof msg, mine >= PENDING_PER_PEER ? "this connection already has %d PULLs waiting"
                                                            : "too many PULLs waiting for a later step (%d)",
                 mine >= PENDING_PER_PEER ? PENDING_PER_PEER : MAX_PENDING);
        refuse(ps, id, in, DT_WIRE_E_BUSY, msg);
        return;
    }
    if (!ps->pending && !(ps->pending = dt_calloc(MAX_PENDING, sizeof *ps->pending, "ps pending pulls", NULL))) {
        refuse(ps, id, in, DT_WIRE_E_NOMEM, "out of memory for a deferred PULL");
        return;
    }
    pending_pull *p = &ps->pending[ps->n_pending++];
    zmq_msg_init(&p->identity);
    zmq_msg_copy(&p->identity, id);
    p->req = in->hdr;
    p->peer = ps->peer;
    dt_peer_ref(p->peer);
    p->since_us = now_us();
}

/* Any message from a worker proves it alive; one that was lost is back (its steps count again). */
static void note_alive(ps_t *ps, const dt_wire_header *h) {
    if (!ps->last_seen || (h->role != DT_ROLE_WORKER && h->role != DT_ROLE_CHIEF) || h->task >= ps->total) return;
    ps->last_seen[h->task] = now_us();
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
 * at the barrier, is not). Each
 * step then waits for the live workers only, or, strict, the job stops: every held and later
 * request is refused, and the ps exits after one more timeout (so that workers hear why). */
static void check_liveness(ps_t *ps) {
    if (!ps->aggregate || !ps->liveness_us || !ps->initialised || ps->failed[0]) return;
    int64_t now = now_us();
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
    apply_complete_steps(ps);
}

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
        r.count_a = ps->updates;
        r.count_b = ps->pulls;
        r.count_c = ps->n_done;
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
               h->task, (long long)ps->step, (unsigned long long)ps->pushes, (unsigned long long)ps->updates,
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
            ps_log(ps, "worker %u finished (%llu done)", h->task, (unsigned long long)ps->n_done);
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

/* What libzmq itself bounds per connection: whole messages queued each way (a ROUTER drops
 * replies to a peer past its mark instead of queueing them), the handshake's duration, and
 * silence (ZMTP heartbeats: a peer that stops answering, even in the middle of a frame, is
 * dropped). */
static int limit_socket(void *s, int handshake_ms, dt_error *err) {
    int hwm = PEER_HWM;
    if (zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm) != 0 || zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm) != 0 ||
        zmq_setsockopt(s, ZMQ_HANDSHAKE_IVL, &handshake_ms, sizeof handshake_ms) != 0)
        return dt_errorf(err, DT_ENET, "zmq_setsockopt (connection bounds): %s", zmq_strerror(errno));
    return dt_zsock_heartbeat(s, PEER_SILENCE_MS, err);
}

static int ps_open(ps_t *ps, const dt_ps_config *cfg, dt_error *err) {
    ps->cfg = cfg;
    ps->n = cfg->shard_floats;
    if (!cfg->endpoint || !*cfg->endpoint)
        return dt_errorf(err, DT_EINVAL, "ps %d: no endpoint to bind", cfg->ps_index);
    if (cfg->shard_floats == 0 || cfg->shard_floats > DT_WIRE_MAX_SHARD_FLOATS)
        return dt_errorf(err, DT_EINVAL, "ps %d: shard of %zu floats (must be 1..%llu)", cfg->ps_index,
                         cfg->shard_floats, (unsigned long long)DT_WIRE_MAX_SHARD_FLOATS);
    if (cfg->ps_index < 0 || cfg->ps_index > UINT16_MAX)
        return dt_errorf(err, DT_EINVAL, "ps index %d out of range", cfg->ps_index);
    if (!(ps->params = ps->own = dt_alloc_floats(ps->n, "ps shard", err))) return DT_ENOMEM;
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
    if (!ps->sock) return dt_error_prefix(err, "ps %d: ", cfg->ps_index);
    if (limit_socket(ps->sock, cfg->first_message_ms > 0 ? cfg->first_message_ms : (int)(FIRST_MESSAGE_US / 1000), err))
        return dt_error_prefix(err, "ps %d: ", cfg->ps_index);
    dt_peers_config pc = {.max_partial_bytes = dt_wire_max_frame(ps->n) + DT_WIRE_HEADER_SIZE,
                          .first_message_us = cfg->first_message_ms > 0 ? cfg->first_message_ms * INT64_C(1000)
                                                                        : FIRST_MESSAGE_US,
                          .message_us = MESSAGE_US,
                          .max_connections = cfg->max_connections > 0 ? cfg->max_connections : MAX_CONNECTIONS,
                          .log = cfg->log, .ps_index = cfg->ps_index};
    pc.budget_bytes = peers_budget(ps);
    if (dt_peers_open(&ps->peers, ps->ctx, ps->sock, &pc, err)) return dt_error_prefix(err, "ps %d: ", cfg->ps_index);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "ps %d: ", cfg->ps_index);
    if (dt_auth_server_start(&ps->zap, ps->ctx, ps->sock, cfg->auth, cfg->log, prefix, err))
        return dt_error_prefix(err, "%s", prefix);
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
    ps_log(ps, "serving %zu floats on %s", ps->n, bound);
    if (cfg->on_bound) cfg->on_bound(cfg->user, bound);
    return DT_OK;
}

static void ps_close(ps_t *ps) {
    sync_free(ps);
    for (int i = 0; i < ps->n_pending; i++) {
        zmq_msg_close(&ps->pending[i].identity);
        dt_peer_unref(ps->pending[i].peer);
    }
    free(ps->pending);
    dt_auth_server_stop(ps->zap);
    dt_peers_close(ps->peers); /* peers still referenced by replies in flight live on until those are freed */
    if (ps->sock) zmq_close(ps->sock);
    if (ps->ctx) zmq_ctx_term(ps->ctx); /* waits at most the socket linger to flush the last replies */
    for (int i = 0; i < ps->n_snaps; i++) free(ps->snaps[i].data); /* libzmq holds none after term */
    free(ps->own);
    free(ps->state);
    free(ps->scratch);
    free(ps->done);
}

int dt_ps_serve(const dt_ps_config *cfg, dt_error *err) {
    ps_t ps;
    memset(&ps, 0, sizeof ps);
    int rc = ps_open(&ps, cfg, err);
    const int poll_ms = cfg->poll_ms > 0 ? cfg->poll_ms : 100;
    ps.last_message_us = now_us();
    while (rc == DT_OK && !ps.shutdown) {
        dt_peers_events(ps.peers, on_peer_gone, &ps);
        if (cfg->stop && *cfg->stop) {
            ps_log(&ps, "stopped by a signal at global step %lld", (long long)ps.step);
            rc = dt_errorf(err, DT_EINTR, "ps %d: stopped by a signal", cfg->ps_index);
            break;
        }
        check_liveness(&ps);
        int64_t now = now_us();
        if (ps.failed[0] && now - ps.failed_at_us > ps.liveness_us) {
            rc = dt_errorf(err, DT_ETIMEOUT, "ps %d: %s", cfg->ps_index, ps.failed);
            break;
        }
        if (cfg->idle_timeout_ms > 0 && now - ps.last_message_us > (int64_t)cfg->idle_timeout_ms * 1000) {
            /* Nobody waits forever: a ps whose chief is gone (outside dtrain launch) ends too. */
            rc = dt_errorf(err, DT_ETIMEOUT, "ps %d: no message from any worker for %d s (--idle_timeout) at global "
                           "step %lld: the chief never ended training (is it gone?); exiting", cfg->ps_index,
                           cfg->idle_timeout_ms / 1000, (long long)ps.step);
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
        for (int k = 0; !drained && k < BATCH && !ps.shutdown; k++) {
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
            ps.last_message_us = now_us();
            ps.peer = dt_peers_of(ps.peers, in.srcfd);
            dt_peers_delivered(ps.peers, ps.peer, r == DT_OK && in.hdr.role != DT_ROLE_NONE);
            if (r == DT_OK) handle(&ps, &in);
            else if (in.has_identity) refuse(&ps, &in.identity, &in, r == DT_EPROTO ? DT_WIRE_E_VERSION : DT_WIRE_E_MALFORMED, e.msg);
            ps.peer = NULL;
            dt_wire_in_close(&in);
        }
        /* The counters are read with the router drained, so a connection's unread bytes are its
         * unfinished message, not whole ones waiting here. */
        if (drained && now_us() - ps.peers_checked_us >= dt_peers_check_interval_us(ps.peers)) {
            dt_peers_check(ps.peers);
            ps.peers_checked_us = now_us();
        }
    }
    if (cfg->stats) {
        cfg->stats->global_step = ps.step;
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
