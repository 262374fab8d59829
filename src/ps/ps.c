#include "ps/ps.h"

#include <errno.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "compute/optim.h"
#include "core/error.h"
#include "transport/wire.h"
#include "transport/zmq_io.h"

#define MAX_PENDING 4096      /* deferred PULLs (waiting for a later step), bounded */
#define BATCH 64              /* messages handled per poll wake-up before checking *stop */
#define LOG_REFUSALS 20       /* refusals logged one by one; later ones only counted */
#define SHUTDOWN_LINGER_MS 1000
#define SNAP_POOL 8           /* snapshot buffers; more in flight at once fall back to a copy */

/* A snapshot of the shard at one step, sent zero-copy to every puller of that step. refs counts
 * the ps's own reference (while it is the current snapshot) plus each message libzmq still holds;
 * libzmq's I/O thread drops its references, hence the atomic. A buffer with refs == 0 is reused:
 * the pool keeps the allocator (and the kernel's page faults) out of the steady state. */
typedef struct {
    atomic_int refs;
    int64_t step;
    float *data;              /* [n] */
} snap_buf;

typedef struct {
    zmq_msg_t identity;
    dt_wire_header req;
} pending_pull;

typedef struct {
    const dt_ps_config *cfg;
    size_t n;                 /* shard floats */
    void *ctx, *sock;
    float *params;            /* [n] */
    float *state;             /* [slots * n], slot-major as dt_opt_apply wants */
    float *scratch;           /* [n] aligned copy of a misaligned gradient frame (rare) */
    dt_opt_config opt;
    int slots, initialised, shutdown;
    int64_t step;
    uint64_t pushes, pulls, refused;
    /* PARAMS replies share one snapshot per step, so n workers pulling the same step cost one
     * memcpy, and pushes never tear a reply in flight. */
    snap_buf snaps[SNAP_POOL];
    int n_snaps, cur;         /* cur: snapshot of the current step, -1 if none */
    pending_pull *pending;
    int n_pending;
    uint8_t *done;            /* [65536 / 8] bitmap of worker tasks that sent DONE (lazily allocated) */
    uint64_t n_done;
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

/* A reply header for a request: same request id, this ps's index and step. */
static dt_wire_header reply_to(const ps_t *ps, dt_msg_type type, const dt_wire_header *req) {
    dt_wire_header h = dt_wire_header_make(type, DT_ROLE_PS, (uint16_t)ps->cfg->ps_index, req->request_id);
    h.shard = (uint32_t)ps->cfg->ps_index;
    h.global_step = ps->step;
    h.local_step = req->local_step;
    h.shard_floats = ps->n;
    h.initialised = (uint8_t)ps->initialised;
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

static void snap_release(void *data, void *hint) {
    (void)data;
    atomic_fetch_sub(&((snap_buf *)hint)->refs, 1);
}

/* Drops the ps's reference to the current snapshot (the step moved on). */
static void snap_retire(ps_t *ps) {
    if (ps->cur >= 0) atomic_fetch_sub(&ps->snaps[ps->cur].refs, 1);
    ps->cur = -1;
}

/* The payload of a PARAMS reply at the current step. */
static int params_msg(ps_t *ps, zmq_msg_t *m) {
    const size_t bytes = ps->n * sizeof(float);
    if (ps->cur < 0 || ps->snaps[ps->cur].step != ps->step) {
        snap_retire(ps);
        for (int i = 0; i < ps->n_snaps && ps->cur < 0; i++)
            if (atomic_load(&ps->snaps[i].refs) == 0) ps->cur = i;
        if (ps->cur < 0 && ps->n_snaps < SNAP_POOL &&
            (ps->snaps[ps->n_snaps].data = dt_alloc_floats(ps->n, "ps snapshot", NULL)))
            ps->cur = ps->n_snaps++;
        if (ps->cur < 0) { /* every buffer still in flight: a plain copy */
            if (zmq_msg_init_size(m, bytes) != 0) return DT_ENOMEM;
            memcpy(zmq_msg_data(m), ps->params, bytes);
            return DT_OK;
        }
        snap_buf *b = &ps->snaps[ps->cur];
        memcpy(b->data, ps->params, bytes);
        b->step = ps->step;
        atomic_store(&b->refs, 1);
    }
    snap_buf *b = &ps->snaps[ps->cur];
    atomic_fetch_add(&b->refs, 1);
    if (zmq_msg_init_data(m, b->data, bytes, snap_release, b) != 0) {
        atomic_fetch_sub(&b->refs, 1);
        return DT_ENOMEM;
    }
    return DT_OK;
}

static int send_params(ps_t *ps, zmq_msg_t *identity, const dt_wire_header *req) {
    zmq_msg_t m;
    if (params_msg(ps, &m)) return DT_ENOMEM;
    dt_wire_header r = reply_to(ps, DT_MSG_PARAMS, req);
    ps->pulls++;
    return dt_wire_send(ps->sock, identity, &r, &m, ZMQ_DONTWAIT, NULL);
}

/* Answers the deferred PULLs whose step has been reached (all of them with an ERROR when the ps
 * is shutting down). */
static void serve_pending(ps_t *ps) {
    int kept = 0;
    for (int i = 0; i < ps->n_pending; i++) {
        pending_pull *p = &ps->pending[i];
        if (ps->shutdown) {
            dt_wire_header r = reply_to(ps, DT_MSG_ERROR, &p->req);
            dt_wire_send_error(ps->sock, &p->identity, r, DT_WIRE_E_SHUTDOWN,
                               "ps %d is shutting down (training is over)", ps->cfg->ps_index);
        } else if (p->req.global_step <= ps->step) {
            send_params(ps, &p->identity, &p->req);
        } else {
            if (kept != i) { /* zmq_msg_t must be moved, not copied */
                pending_pull *dst = &ps->pending[kept];
                zmq_msg_init(&dst->identity);
                zmq_msg_move(&dst->identity, &p->identity);
                dst->req = p->req;
            }
            kept++;
            continue;
        }
        zmq_msg_close(&p->identity);
    }
    ps->n_pending = kept;
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

/* The whole shard for a checkpoint: parameters, then the optimizer state slot-major, as INIT takes
 * them back (a restore is an INIT with this payload and step). */
static void on_fetch(ps_t *ps, zmq_msg_t *id, dt_wire_in *in) {
    if (!check_ready(ps, id, in)) return;
    const size_t pbytes = ps->n * sizeof(float), sbytes = (size_t)ps->slots * pbytes;
    zmq_msg_t m;
    if (zmq_msg_init_size(&m, pbytes + sbytes) != 0) {
        refuse(ps, id, in, DT_WIRE_E_BUSY, "out of memory for a STATE reply");
        return;
    }
    char *d = zmq_msg_data(&m);
    memcpy(d, ps->params, pbytes);
    if (sbytes) memcpy(d + pbytes, ps->state, sbytes);
    dt_wire_header r = reply_to(ps, DT_MSG_STATE, &in->hdr);
    put_optimizer(ps, &r);
    dt_wire_send(ps->sock, id, &r, &m, ZMQ_DONTWAIT, NULL);
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
    if (slots != ps->slots || !ps->state) {
        dt_error e = {0};
        float *st = dt_alloc_floats((size_t)slots * ps->n, "ps optimizer state", &e);
        if (!st) {
            refuse(ps, id, in, DT_WIRE_E_BAD_VALUE, e.msg);
            return;
        }
        free(ps->state);
        ps->state = st;
        ps->slots = slots;
    }
    const char *data = zmq_msg_data(&in->payload);
    memcpy(ps->params, data, ps->n * sizeof(float));
    memcpy(ps->state, data + ps->n * sizeof(float), (size_t)slots * ps->n * sizeof(float));
    ps->opt = opt;
    ps_log(ps, "%s by the chief (worker %u) at global step %lld: %zu floats, %s, learning rate %g",
           ps->initialised ? "re-initialised" : "initialised", h->task, (long long)h->global_step, ps->n,
           dt_opt_name(opt.kind), (double)opt.learning_rate);
    ps->initialised = 1;
    ps->step = h->global_step;
    snap_retire(ps); /* same step number, new values */
    dt_wire_header r = reply_to(ps, DT_MSG_ACK, h);
    dt_wire_send(ps->sock, id, &r, NULL, ZMQ_DONTWAIT, NULL);
    serve_pending(ps);
}

static void on_push(ps_t *ps, zmq_msg_t *id, dt_wire_in *in) {
    if (!check_ready(ps, id, in) || !check_payload(ps, id, in)) return;
    const float *g = zmq_msg_data(&in->payload);
    if ((uintptr_t)g % alignof(float) != 0) { /* libzmq gives no alignment promise: copy if needed */
        if (!ps->scratch && !(ps->scratch = dt_alloc_floats(ps->n, "ps gradient scratch", NULL))) {
            refuse(ps, id, in, DT_WIRE_E_BAD_VALUE, "out of memory for a misaligned gradient");
            return;
        }
        memcpy(ps->scratch, g, ps->n * sizeof(float));
        g = ps->scratch;
    }
    dt_opt_apply(&ps->opt, ps->params, g, ps->state, ps->n, ps->step);
    ps->step++;
    ps->pushes++;
    dt_wire_header r = reply_to(ps, DT_MSG_PUSH_ACK, &in->hdr);
    r.status = DT_WIRE_OK;
    dt_wire_send(ps->sock, id, &r, NULL, ZMQ_DONTWAIT, NULL);
    if (ps->n_pending) serve_pending(ps);
}

static void on_pull(ps_t *ps, zmq_msg_t *id, dt_wire_in *in) {
    if (!check_ready(ps, id, in)) return;
    if (in->hdr.global_step <= ps->step) {
        if (send_params(ps, id, &in->hdr)) refuse(ps, id, in, DT_WIRE_E_BAD_VALUE, "out of memory for a snapshot");
        return;
    }
    if (ps->n_pending >= MAX_PENDING) {
        refuse(ps, id, in, DT_WIRE_E_BUSY, "too many PULLs waiting for a later step");
        return;
    }
    if (!ps->pending && !(ps->pending = dt_calloc(MAX_PENDING, sizeof *ps->pending, "ps pending pulls", NULL))) {
        refuse(ps, id, in, DT_WIRE_E_BUSY, "out of memory for a deferred PULL");
        return;
    }
    pending_pull *p = &ps->pending[ps->n_pending++];
    zmq_msg_init(&p->identity);
    zmq_msg_copy(&p->identity, id);
    p->req = in->hdr;
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
        r.count_a = ps->pushes;
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
        ps_log(ps, "shutdown by the chief (worker %u) at global step %lld after %llu pushes, %llu pulls",
               h->task, (long long)ps->step, (unsigned long long)ps->pushes, (unsigned long long)ps->pulls);
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
            refuse(ps, id, in, DT_WIRE_E_BUSY, "out of memory for the done set");
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

static int ps_open(ps_t *ps, const dt_ps_config *cfg, dt_error *err) {
    ps->cfg = cfg;
    ps->n = cfg->shard_floats;
    ps->cur = -1;
    if (!cfg->endpoint || !*cfg->endpoint)
        return dt_errorf(err, DT_EINVAL, "ps %d: no endpoint to bind", cfg->ps_index);
    if (cfg->shard_floats == 0 || cfg->shard_floats > DT_WIRE_MAX_SHARD_FLOATS)
        return dt_errorf(err, DT_EINVAL, "ps %d: shard of %zu floats (must be 1..%llu)", cfg->ps_index,
                         cfg->shard_floats, (unsigned long long)DT_WIRE_MAX_SHARD_FLOATS);
    if (cfg->ps_index < 0 || cfg->ps_index > UINT16_MAX)
        return dt_errorf(err, DT_EINVAL, "ps index %d out of range", cfg->ps_index);
    if (!(ps->params = dt_alloc_floats(ps->n, "ps shard", err))) return DT_ENOMEM;
    if (!(ps->ctx = zmq_ctx_new())) return dt_errorf(err, DT_ENET, "zmq_ctx_new: %s", zmq_strerror(errno));
    ps->sock = dt_zsock_open(ps->ctx, ZMQ_ROUTER, dt_wire_max_frame(ps->n), SHUTDOWN_LINGER_MS, -1, err);
    if (!ps->sock) return dt_error_prefix(err, "ps %d: ", cfg->ps_index);
    if (zmq_bind(ps->sock, cfg->endpoint) != 0)
        return dt_errorf(err, DT_ENET, "ps %d: cannot bind %s: %s", cfg->ps_index, cfg->endpoint,
                         zmq_strerror(errno));
    char bound[256] = "";
    size_t len = sizeof bound;
    if (zmq_getsockopt(ps->sock, ZMQ_LAST_ENDPOINT, bound, &len) != 0) snprintf(bound, sizeof bound, "%s", cfg->endpoint);
    ps_log(ps, "serving %zu floats on %s", ps->n, bound);
    if (cfg->on_bound) cfg->on_bound(cfg->user, bound);
    return DT_OK;
}

static void ps_close(ps_t *ps) {
    for (int i = 0; i < ps->n_pending; i++) zmq_msg_close(&ps->pending[i].identity);
    free(ps->pending);
    if (ps->sock) zmq_close(ps->sock);
    if (ps->ctx) zmq_ctx_term(ps->ctx); /* waits at most the socket linger to flush the last replies */
    for (int i = 0; i < ps->n_snaps; i++) free(ps->snaps[i].data); /* libzmq holds none after term */
    free(ps->params);
    free(ps->state);
    free(ps->scratch);
    free(ps->done);
}

int dt_ps_serve(const dt_ps_config *cfg, dt_error *err) {
    ps_t ps;
    memset(&ps, 0, sizeof ps);
    int rc = ps_open(&ps, cfg, err);
    const int poll_ms = cfg->poll_ms > 0 ? cfg->poll_ms : 100;
    while (rc == DT_OK && !ps.shutdown) {
        if (cfg->stop && *cfg->stop) {
            ps_log(&ps, "stopped by a signal at global step %lld", (long long)ps.step);
            rc = dt_errorf(err, DT_EINTR, "ps %d: stopped by a signal", cfg->ps_index);
            break;
        }
        zmq_pollitem_t item = {.socket = ps.sock, .events = ZMQ_POLLIN};
        int n = zmq_poll(&item, 1, poll_ms);
        if (n < 0) {
            if (errno == EINTR) continue;
            rc = dt_errorf(err, DT_ENET, "ps %d: zmq_poll: %s", cfg->ps_index, zmq_strerror(errno));
            break;
        }
        for (int k = 0; n > 0 && k < BATCH && !ps.shutdown; k++) {
            dt_wire_in in;
            dt_error e = {0};
            int r = dt_wire_recv(ps.sock, 1, &in, &e);
            if (r == DT_ETIMEOUT || r == DT_EINTR) {
                dt_wire_in_close(&in);
                break;
            }
            if (r == DT_ENET) {
                dt_wire_in_close(&in);
                rc = dt_errorf(err, DT_ENET, "ps %d: %s", cfg->ps_index, e.msg);
                break;
            }
            if (r == DT_OK) handle(&ps, &in);
            else if (in.has_identity) refuse(&ps, &in.identity, &in, r == DT_EPROTO ? DT_WIRE_E_VERSION : DT_WIRE_E_MALFORMED, e.msg);
            dt_wire_in_close(&in);
        }
    }
    if (cfg->stats) {
        cfg->stats->global_step = ps.step;
        cfg->stats->pushes = ps.pushes;
        cfg->stats->pulls = ps.pulls;
        cfg->stats->refused = ps.refused;
        cfg->stats->initialised = ps.initialised;
    }
    ps_close(&ps);
    return rc;
}
