/* The ps client (worker/ps_client.h): its sockets, one ZeroMQ DEALER per ps (replaced when libzmq
 * still holds a gradient frame on one), its calls, and the data the replies carry. Which replies
 * a call awaits and what each one means is the exchange core's (worker/exchange.h, a state
 * machine without sockets): every call is one exchange, begin, send, wait, end. The streaming
 * calls are that core as it is (overlap.c sends each chunk when it is ready); push_all, pull_all,
 * push_pull and the pulls wrap it (begin, send every chunk, wait for every reply, end), the
 * per-ps requests (HELLO, INIT, STATUS, FETCH, DONE, SHUTDOWN) are exchanges of one slot per ps,
 * and a request to one ps alone (the WORK messages to ps 0) is an exchange of one slot. */
#include "worker/ps_client.h"

#include <errno.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "core/assert.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/finite.h"
#include "metrics/metrics.h"
#include "metrics/names.h"
#include "transport/auth.h"
#include "transport/zmq_io.h"
#include "worker/codec.h"
#include "worker/exchange.h"

#define HELLO_RESEND_US 1000000 /* a HELLO lost with a dropped connection is sent again */
#define HELLO_POLL_MS 50        /* re-evaluate resends and the deadline */
#define READY_POLL_MS 100
#define STOP_GRACE_MS 2000      /* what a request may still wait once this process is stopped (stop_deadline) */
#define RELEASE_MS 2000         /* how long libzmq may take to drop the frames of a closed socket */
#define LATE_WAKE_MS 250        /* a poll that returns this much later than asked: the process was stopped */
#define BUSY_PAUSE_MS 50        /* after ERROR 106 (ask again shortly): the first pause, doubling ... */
#define BUSY_PAUSE_MAX_MS 1000  /* ... up to this */
#define SCAN_BLOCK 8192         /* floats unpacked then checked for NaN/infinity while in cache (32 KiB) */

typedef struct {
    void *sock;
    char *endpoint;
    size_t n;                 /* shard floats */
    dt_ps_shard_status st;
    int chunks;               /* how the ps cuts its shard: 1 until a reply says otherwise */
    int cut_known;            /* a reply of the initialised ps said so */
    float *recv;              /* [n] the shard as pulled, chunk by chunk (dt_ps_client_pull_views) */
    atomic_int inflight;      /* zero-copy gradient frames to this ps that libzmq still references */
    atomic_int wake_fd;       /* written when libzmq lets one go (dt_ps_client_set_wake_fd); -1: none */
    int64_t quiet_since;      /* since when (dt_clock_us) this ps may have heard nothing from us (silent_ms) */
    int64_t gap_us, gap_end;  /* the longest such silence that has ended, and when: until the ps answers a
                               * request sent after it, it may have declared us lost meanwhile */
} ps_conn;

/* This ps may have heard from us from `from` until `to` (a send or an answer: one moment; a wait
 * for its reply while running: the whole wait). A silence that ends at `from` is remembered: the
 * next request resets quiet_since, but a ps that timed us out during the silence is not brought
 * back by it (it may be gone, the send merely queued). */
static void heard(ps_conn *p, int64_t from, int64_t to) {
    if (to <= p->quiet_since) return;
    if (p->quiet_since && from - p->quiet_since > p->gap_us) p->gap_us = from - p->quiet_since, p->gap_end = from;
    p->quiet_since = to;
}

/* What a per-ps request's call does with each reply (STATUS, FETCH, HELLO...). */
typedef int (*reply_fn)(dt_ps_client *c, int ps, dt_wire_in *in, void *user, dt_error *err);

/* The call under way: what its exchange (worker/exchange.h) is for and where its replies go. */
typedef struct {
    const char *what;         /* names it in messages: "PUSH+PULL", "STATUS"... */
    int push, pull;           /* per chunk: gradients go up (PUSH); parameters come down (PARAMS) */
    int64_t local_step;       /* the pushed gradients' step */
    uint32_t examples;        /* the examples they average (dt_ps_client_set_examples; 0: not said) */
    int64_t min_step;         /* PARAMS: the oldest step wanted */
    float *const *dst;        /* [n_ps] where each PARAMS chunk goes, at its offset */
    int repull;               /* sync pulls: make every chunk one step, at the newest (0) or oldest (1); -1: no */
    int repulled;             /* shards pulled again for that */
    reply_fn fn;              /* a per-ps request: what each reply does (NULL: nothing) */
    void *user;
    int alone, to_ps;         /* a request to ps to_ps alone (dt_ps_client_ask_one) */
    dt_ps_chunk_fn on_chunk;  /* streaming: told of each PARAMS chunk as it lands (set while polling) */
    void *chunk_user;
    double t0;                /* when it began (dt_seconds), for the latency metrics; 0: metrics off */
    const int *slots;         /* sparse tables: requests to each ps [n_ps] (the exchange's multi kind) */
    int reply_slot;           /* the slot the reply handed to fn answers */
    dt_sparse_reply_fn sparse_fn; /* sparse tables: the caller's handler of each reply */
    void *sparse_user;
} call_t;

struct dt_ps_client {
    void *ctx;
    int n_ps;
    ps_conn *ps;
    const char **names;       /* [n_ps] the endpoints, naming each ps in the exchange's messages */
    dt_exchange *ex;          /* the exchange core: the requests out and the replies awaited */
    call_t call;              /* what the exchange under way is for */
    dt_wire_role role;
    uint16_t task;
    int connect_timeout_ms, request_timeout_ms;
    int curve;                /* --auth=curve (for the connect error's hint) */
    dt_auth auth;             /* the client's keys (a copy): a replaced socket is set up as at open */
    char unusable[256];       /* why this client refuses every request ("" while it works) */
    int buffers_held;         /* libzmq kept gradient frames after a failed call (see the header) */
    int aggregate, total, staleness; /* sync replicas; aggregate 0: asynchronous */
    int n_workers;            /* told to every ps in INIT; 0: not told */
    uint64_t chunk_bytes;     /* the cut INIT asks for: chunks of about this size (0: one chunk) */
    int liveness_ms, strict;
    int elastic;              /* INIT says workers join and leave (dynamic sharding) */
    int last_refusal;         /* DT_WIRE_E_* of the latest ERROR reply (dt_ps_client_last_refusal) */
    uint8_t encoding;         /* --compression: of gradients up and parameters down */
    uint32_t examples;        /* the next pushes' (dt_ps_client_set_examples) */
    dt_codec *codec;          /* 16-bit gradients with error feedback; NULL: float32 */
    void (*name_float)(void *user, int ps, size_t index, char *out, size_t cap);
    void *name_user;
    FILE *log;                /* NULL: quiet */
    int sndbuf;               /* SO_SNDBUF of each connection; 0: the kernel's */
    const volatile int *stop; /* set by a signal handler: waits end (DT_EINTR); NULL: none */
    int64_t stopped_at;       /* when a wait first saw *stop set (dt_clock_us); 0: not yet */
    dt_ps_client_stats stats;
    /* Metrics (NULL series when off): latency of each kind of exchange, bytes, stale gradients. */
    dt_metric *m_push, *m_pull, *m_push_pull, *m_wait, *m_tx, *m_rx, *m_stale;
    float **s_dst;            /* [n_ps] a streaming exchange's receive buffers */
    /* dt_ps_client_ask_one: its reply, and a copy of the reply's payload (grown as needed) */
    dt_wire_header one_reply;
    uint8_t *one_buf;
    size_t one_cap, one_len;
};

static int fail_ps(dt_ps_client *c, int ps, dt_error *err, int code, const char *what, const char *msg) {
    return dt_errorf(err, code, "ps %d at %s: %s%s%s", ps, c->ps[ps].endpoint, what, *what ? ": " : "", msg);
}

/* The call under way has failed (rc): its exchange awaits nothing more. */
static int fail_call(dt_ps_client *c, int rc) {
    dt_ex_state s = dt_ex_get_state(c->ex);
    if (s == DT_EX_OPEN || s == DT_EX_DONE) dt_ex_fail(c->ex);
    return rc;
}

/* Once this process is told to stop (a signal sets *stop), what it still asks (DONE, SHUTDOWN, the
 * step in flight) waits at most STOP_GRACE_MS more: its ps tasks are most likely stopping too, and
 * a stop must not wait out --heartbeat_timeout for them. */
static int stopping(const dt_ps_client *c) { return c->stop && *c->stop; }

static int64_t stop_deadline(dt_ps_client *c) {
    if (!c->stopped_at) c->stopped_at = dt_clock_us();
    return c->stopped_at + STOP_GRACE_MS * 1000LL;
}

static void set_send_timeout(ps_conn *p, int64_t deadline_us) {
    int64_t left = (deadline_us - dt_clock_us()) / 1000;
    int ms = left <= 0 ? 0 : left > INT32_MAX ? INT32_MAX : (int)left;
    zmq_setsockopt(p->sock, ZMQ_SNDTIMEO, &ms, sizeof ms);
}

/* Sends one request to ps i for slot `chunk` of the exchange under way (a send blocks until
 * send_by at the latest), which then awaits its reply. h: type and the type-specific fields;
 * routing fields are filled here. payload is consumed. */
static int send_req(dt_ps_client *c, int i, int chunk, dt_wire_header *h, zmq_msg_t *payload, int64_t send_by,
                    dt_error *err) {
    ps_conn *p = &c->ps[i];
    h->role = (uint8_t)c->role;
    h->task = c->task;
    h->request_id = dt_ex_new_id(c->ex);
    h->shard = (uint32_t)i;
    set_send_timeout(p, send_by);
    size_t bytes = DT_WIRE_HEADER_SIZE + (payload ? zmq_msg_size(payload) : 0);
    dt_metric_add(c->m_tx, (double)bytes);
    c->stats.tx_bytes += bytes;
    if (dt_wire_type_is_sparse(h->type)) c->stats.sparse_tx_bytes += bytes;
    dt_error e = {0};
    int rc = dt_wire_send(p->sock, NULL, h, payload, 0, &e);
    if (rc) return fail_ps(c, i, err, rc, "", rc == DT_ETIMEOUT ? "send timed out (too many requests queued)" : e.msg);
    int64_t now = dt_clock_us();
    heard(p, now, now);
    rc = dt_ex_sent(c->ex, i, chunk, h->type, h->request_id, now);
    return rc ? dt_errorf(err, rc, "ps client: %s", dt_assert_why()) : DT_OK;
}

/* A request due a request timeout from now. */
static int64_t request_deadline(const dt_ps_client *c) { return dt_clock_us() + c->request_timeout_ms * 1000LL; }

static void note_status(ps_conn *p, const dt_wire_header *h) {
    if (h->type != DT_MSG_PARAMS && h->type != DT_MSG_PUSH_ACK) p->st.global_step = h->global_step; /* a chunk's own */
    p->st.initialised = h->generation != 0;
    if (h->type == DT_MSG_WELCOME || h->type == DT_MSG_STATUS_REPLY) p->st.importing = (h->flags & DT_WIRE_F_IMPORTING) != 0;
    if (!p->st.initialised) p->st.importing = 0;
    p->st.generation = h->generation;
    if (h->chunks) p->chunks = h->chunks;
    if (h->chunks && h->generation) p->cut_known = 1;
}

/* A chunk reply the exchange took: the push's outcome goes to the codec's error feedback; a PARAMS
 * chunk goes into the call's dst at its offset (checked: finite values), and to the streaming
 * caller. */
static int on_chunk(dt_ps_client *c, int i, dt_wire_in *in, const dt_ex_reply_info *r, dt_error *err) {
    const dt_wire_header *h = &in->hdr;
    if (c->codec && r->req == DT_MSG_PUSH) dt_codec_settle(c->codec, i, h->chunk, r->accepted);
    if (h->type != DT_MSG_PARAMS) return DT_OK;
    uint64_t off, len;
    dt_wire_chunk(c->ps[i].n, h->chunks, h->chunk, &off, &len); /* its size and cut were checked by the exchange */
    float *dst = c->call.dst[i] + off;
    /* A non-finite value is caught here, where it enters, and named by its source; left alone it
     * would surface only later as a NaN loss. Unpacked and scanned a block at a time, so the scan
     * reads what the copy just wrote from cache instead of a whole chunk again from memory. */
    const unsigned char *src = zmq_msg_data(&in->payload); /* libzmq promises no alignment */
    size_t esize = dt_enc_size(h->encoding), bad = (size_t)len;
    for (size_t at = 0; at < (size_t)len && bad == (size_t)len; at += SCAN_BLOCK) {
        size_t k = (size_t)len - at < SCAN_BLOCK ? (size_t)len - at : SCAN_BLOCK;
        dt_unpack(h->encoding, dst + at, src + at * esize, k);
        size_t b = dt_first_nonfinite(dst + at, k);
        if (b < k) bad = at + b;
    }
    if (bad < len) {
        char name[96], msg[320];
        if (c->name_float) c->name_float(c->name_user, i, (size_t)off + bad, name, sizeof name);
        else snprintf(name, sizeof name, "float %zu of its shard", (size_t)off + bad);
        snprintf(msg, sizeof msg, "served a non-finite parameter (%s = %g) at step %lld: training diverged (lower "
                 "--learning_rate) or the ps is damaged", name, (double)dst[bad], (long long)h->global_step);
        return fail_ps(c, i, err, DT_EFORMAT, "", msg);
    }
    if (c->call.on_chunk) c->call.on_chunk(c->call.chunk_user, i, h->chunk, c->call.dst[i]);
    return DT_OK;
}

/* Handles one message received from ps i: 1 if it answered an awaited request, 0 if the exchange
 * ignored it (a late reply to an earlier request), < 0 on error (the exchange has failed). */
static int on_message(dt_ps_client *c, int i, dt_wire_in *in, dt_error *err) {
    ps_conn *p = &c->ps[i];
    size_t bytes = DT_WIRE_HEADER_SIZE + zmq_msg_size(&in->payload);
    dt_metric_add(c->m_rx, (double)bytes);
    c->stats.rx_bytes += bytes;
    if (c->call.slots) c->stats.sparse_rx_bytes += bytes;
    dt_ex_reply_info r;
    int rc = dt_ex_reply(c->ex, i, &in->hdr, zmq_msg_data(&in->payload), zmq_msg_size(&in->payload), &r, err);
    if (rc == DT_EX_IGNORED) return 0;
    /* The ps heard from us when it answered (a PULL it held: that much after we sent it), however
     * late we read the reply (this process may have been stopped meanwhile). */
    uint64_t waited = in->hdr.type == DT_MSG_PARAMS ? in->hdr.params.waited_us : 0;
    int64_t now = dt_clock_us(), held = waited > INT64_MAX ? INT64_MAX : (int64_t)waited;
    int64_t answered = held < now - r.sent_us ? r.sent_us + held : now;
    if (r.chunk >= 0) heard(p, answered, answered);
    if (r.refused) {
        c->last_refusal = dt_ex_refusal(c->ex);
        note_status(p, &in->hdr); /* a refusal for another cut teaches the cut */
    }
    if (rc < 0) return rc;
    if (r.sent_us >= p->gap_end) p->gap_us = 0; /* it answered after our last silence: it kept us */
    note_status(p, &in->hdr);
    if (c->call.push || c->call.pull) rc = on_chunk(c, i, in, &r, err);
    else {
        c->call.reply_slot = r.chunk;
        rc = c->call.fn ? c->call.fn(c, i, in, c->call.user, err) : DT_OK;
    }
    return rc ? fail_call(c, rc) : 1;
}

/* Receives what ps i has queued while its replies are due. */
static int drain(dt_ps_client *c, int i, dt_error *err) {
    while (dt_ex_awaiting(c->ex, i)) {
        dt_wire_in in;
        dt_error e = {0};
        int rc = dt_wire_recv(c->ps[i].sock, 0, &in, &e);
        if (rc == DT_ETIMEOUT) {
            dt_wire_in_close(&in);
            return DT_OK;
        }
        if (rc == DT_OK) rc = on_message(c, i, &in, err);
        else rc = fail_call(c, fail_ps(c, i, err, rc, c->call.what, e.msg));
        dt_wire_in_close(&in);
        if (rc < 0) return rc;
    }
    return DT_OK;
}

/* The replies of ps first_due are overdue (the deadline passed with some missing). */
static int timed_out(dt_ps_client *c, int first_due, int stopped, dt_error *err) {
    char msg[256];
    /* A sync PULL is the barrier: it waits for the other workers, not only for the ps. */
    snprintf(msg, sizeof msg, "no reply within %d ms (%s): %s", stopped ? STOP_GRACE_MS : c->request_timeout_ms,
             stopped ? "of this process being stopped by a signal" : "--heartbeat_timeout",
             c->aggregate && strstr(c->call.what, "PULL")
                 ? "the ps is down, or the sync barrier waits for workers that are gone (the step "
                   "needs --replicas_to_aggregate gradients; backup workers let it lose some)"
                 : "the ps is down or overloaded");
    return fail_call(c, fail_ps(c, first_due, err, DT_ETIMEOUT, c->call.what, msg));
}

/* One wait of at most max_ms for the replies due (each handed to on_message) and, fd >= 0, for fd
 * to become readable: DT_OK, or < 0 on error (the deadline passed with replies missing, a bad
 * reply): the exchange has then failed. */
static int wait_round(dt_ps_client *c, long max_ms, int fd, dt_error *err) {
    zmq_pollitem_t items[c->n_ps + 1];
    int idx[c->n_ps];
    int n = 0;
    for (int i = 0; i < c->n_ps; i++)
        if (dt_ex_awaiting(c->ex, i)) {
            items[n] = (zmq_pollitem_t){.socket = c->ps[i].sock, .events = ZMQ_POLLIN};
            idx[n++] = i;
        }
    if (n == 0 && fd < 0) return DT_OK;
    int stopped = stopping(c);
    if (stopped) dt_ex_cap_deadline(c->ex, stop_deadline(c));
    int64_t before = dt_clock_us();
    int late = dt_ex_overdue(c->ex, before);
    if (late >= 0) return timed_out(c, late, stopped, err);
    int64_t left_ms = (dt_ex_deadline(c->ex) - before + 999) / 1000;
    long wait_ms = n && left_ms < max_ms ? (long)left_ms : max_ms;
    int m = n;
    if (fd >= 0) items[m++] = (zmq_pollitem_t){.socket = NULL, .fd = fd, .events = ZMQ_POLLIN};
    int r = zmq_poll(items, m, wait_ms);
    int64_t after = dt_clock_us();
    /* Waiting for a reply, this worker counts as alive to the ps (a sync ps holding its PULL
     * does not count it silent), unless the process was not running: a wake far later than
     * asked means it was stopped (SIGSTOP, a paused machine), and its silence runs on. */
    if (after - before <= (wait_ms + LATE_WAKE_MS) * 1000LL)
        for (int k = 0; k < n; k++) heard(&c->ps[idx[k]], before, after);
    if (r < 0) {
        if (errno == EINTR) return fail_call(c, dt_errorf(err, DT_EINTR, "%s interrupted by a signal", c->call.what));
        return fail_call(c, dt_errorf(err, DT_ENET, "%s: zmq_poll: %s", c->call.what, zmq_strerror(errno)));
    }
    for (int k = 0; k < n && r > 0; k++) {
        int rc = items[k].revents & ZMQ_POLLIN ? drain(c, idx[k], err) : DT_OK;
        if (rc < 0) return rc;
    }
    return DT_OK;
}

/* Waits until every reply of the exchange under way is in (DONE) or it fails. Every request has
 * gone out. */
static int gather(dt_ps_client *c, dt_error *err) {
    while (dt_ex_get_state(c->ex) == DT_EX_OPEN) {
        int due = 0;
        for (int i = 0; i < c->n_ps; i++) due += dt_ex_awaiting(c->ex, i);
        if (!DT_ASSERT(due > 0)) /* open with nothing due: a request was never sent */
            return fail_call(c, dt_errorf(err, DT_EINVAL, "ps client: %s: %s", c->call.what, dt_assert_why()));
        int rc = wait_round(c, 1000, -1, err);
        if (rc) return rc;
    }
    if (!DT_ASSERT(dt_ex_get_state(c->ex) == DT_EX_DONE))
        return dt_errorf(err, DT_EINVAL, "ps client: %s", dt_assert_why());
    return DT_OK;
}

/* ---- the sockets: one per ps, replaced when libzmq still holds a gradient frame on it ---- */

/* libzmq's I/O thread calls this when it is done with a zero-copy gradient frame (hint: its ps). */
static void release_inflight(void *data, void *hint) {
    (void)data;
    ps_conn *p = hint;
    int before = atomic_fetch_sub(&p->inflight, 1);
    if (!DT_ASSERT(before > 0)) atomic_fetch_add(&p->inflight, 1); /* never below 0 */
    int fd = atomic_load(&p->wake_fd);
    if (fd >= 0) {
        uint64_t one = 1;
        ssize_t w = write(fd, &one, sizeof one); /* an eventfd: never blocks for long */
        (void)w;
    }
}

/* Waits until libzmq has released every gradient frame (DT_OK) or the deadline passes (DT_ETIMEOUT). */
static int wait_released(dt_ps_client *c, int64_t deadline_us) {
    for (;;) {
        int held = 0;
        for (int i = 0; i < c->n_ps; i++) held += atomic_load(&c->ps[i].inflight);
        if (!held) return DT_OK;
        if (dt_clock_us() > deadline_us) return DT_ETIMEOUT;
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
}

/* ps i's socket, set up and connected: at open, and again when one that held gradient frames is
 * replaced (replace_socket), so both get the same options. */
static int conn_socket(dt_ps_client *c, int i, dt_error *err) {
    ps_conn *p = &c->ps[i];
    dt_error e = {0};
    /* The largest reply is STATE (parameters and up to 2 optimizer slots). */
    /* ps 0 may also send the work coordinator's state (WORK_STATE). */
    uint64_t max = i == 0 ? dt_wire_max_frame_ps0(p->n) : dt_wire_max_frame(p->n);
    void *s = dt_zsock_open(c->ctx, ZMQ_DEALER, max, 0, c->request_timeout_ms, &e);
    int rc = s ? DT_OK : e.code;
    if (!rc) rc = dt_zsock_heartbeat(s, c->request_timeout_ms, &e);
    if (!rc && c->sndbuf > 0 && zmq_setsockopt(s, ZMQ_SNDBUF, &c->sndbuf, sizeof c->sndbuf) != 0)
        rc = dt_errorf(&e, DT_ENET, "zmq_setsockopt(ZMQ_SNDBUF): %s", zmq_strerror(errno));
    if (!rc) rc = dt_auth_client_socket(s, c->curve ? &c->auth : NULL, &e);
    if (!rc && dt_zsock_connect(s, p->endpoint) != 0)
        rc = dt_errorf(&e, DT_EINVAL, "cannot connect to '%s': %s", p->endpoint, zmq_strerror(errno));
    if (rc) {
        if (s) zmq_close(s);
        return dt_errorf(err, rc, "ps %d at %s: %s", i, p->endpoint, e.msg);
    }
    p->sock = s;
    return DT_OK;
}

/* ps i's socket is closed with linger 0, so libzmq drops the frames it still queues for it (a ps
 * discards a message cut short), and a fresh one connects in its place (to the same ps, or the
 * one restarted there). Replies due on the old socket never come: the exchange stops awaiting
 * them. A socket that cannot be replaced makes the client unusable. */
static void replace_socket(dt_ps_client *c, int i) {
    ps_conn *p = &c->ps[i];
    zmq_close(p->sock);
    p->sock = NULL;
    dt_ex_drop_ps(c->ex, i);
    dt_error e = {0};
    if (conn_socket(c, i, &e) && !c->unusable[0])
        snprintf(c->unusable, sizeof c->unusable, "could not replace a socket: %.200s", e.msg);
}

/* The header's contract: when a call that sent gradients returns, libzmq holds none of them.
 * After the replies they are almost always released already (a reply proves the ps read them).
 * A frame still held sits in the queue of a ps that is down or not reading, or is half written to
 * it, and libzmq would send it, or its rest, later from a buffer the caller has since reused: a
 * torn gradient. The socket that holds it is replaced. rc is the call's outcome so far, returned
 * unless the frames cannot be released. */
static int release_gradients(dt_ps_client *c, int rc, int64_t deadline_us, dt_error *err) {
    if (!rc && wait_released(c, deadline_us) == DT_OK) return DT_OK;
    for (int i = 0; i < c->n_ps; i++)
        if (atomic_load(&c->ps[i].inflight) && c->ps[i].sock) replace_socket(c, i);
    if (wait_released(c, dt_clock_us() + RELEASE_MS * 1000LL) != DT_OK) {
        /* Never seen; but then the caller must not touch its buffers, so nothing is sent again. */
        c->buffers_held = 1;
        snprintf(c->unusable, sizeof c->unusable, "ZeroMQ still holds gradient buffers %d ms after their sockets "
                 "were closed: they must stay untouched, so this client sends nothing more (close it)", RELEASE_MS);
        char before[512] = "";
        if (rc && err) snprintf(before, sizeof before, "%.500s; ", err->msg);
        return dt_errorf(err, DT_EIO, "%s%s", before, c->unusable);
    }
    return rc;
}

/* ---- calls: each one exchange (begin, send, wait, end) ---- */

/* ERROR 106 says a ps is at its memory budget, or its table of deferred requests is full, and to ask
 * again shortly (docs/protocol.md). A call that changes nothing on the ps (a pull, FETCH, STATUS) is
 * asked again after a pause, 50 ms doubling to 1 s, until its own timeout (--heartbeat_timeout) has
 * passed since it was first asked: 1 to ask again (the pause taken), 0 to end with rc. A push is not:
 * its gradient may have been applied before the refusal of the reply (the caller's recovery,
 * worker/remote.c, pulls again). */
static int ask_again(dt_ps_client *c, int rc, int64_t first_us, int *pause_ms) {
    if (rc != DT_EPROTO || c->last_refusal != DT_WIRE_E_BUSY || stopping(c)) return 0;
    const int64_t left_ms = (first_us + c->request_timeout_ms * 1000LL - dt_clock_us()) / 1000;
    if (left_ms <= *pause_ms) return 0;
    if (++c->stats.busy_retries <= 3 && c->log) {
        fprintf(c->log, "worker %u: a ps is busy (ERROR 106: ask again shortly): asking again for up to %.1f s%s\n",
                c->task, left_ms / 1000.0, c->stats.busy_retries == 3 ? "; further ones are counted" : "");
        fflush(c->log);
    }
    struct timespec ts = {*pause_ms / 1000, (long)(*pause_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    *pause_ms = *pause_ms * 2 < BUSY_PAUSE_MAX_MS ? *pause_ms * 2 : BUSY_PAUSE_MAX_MS;
    return 1;
}

/* Begins the exchange of a call that awaits `want` replies (per chunk of every ps for PARAMS
 * and PUSH_ACK, else one per ps). */
static int call_begin(dt_ps_client *c, const call_t *call, uint8_t want, dt_error *err) {
    if (dt_ex_get_state(c->ex) != DT_EX_IDLE)
        return dt_errorf(err, DT_EINVAL, "ps client: %s while an exchange is already under way", call->what);
    if (c->unusable[0]) return dt_errorf(err, DT_EIO, "ps client: %s", c->unusable);
    int chunks[c->n_ps];
    for (int i = 0; i < c->n_ps; i++) chunks[i] = c->ps[i].chunks;
    dt_ex_kind kind = {.want = want, .min_step = call->min_step, .timeout_us = c->request_timeout_ms * 1000LL,
                       .multi = call->slots != NULL, .alone = call->alone, .ps = call->to_ps};
    for (int i = 0; call->slots && i < c->n_ps; i++) chunks[i] = call->slots[i];
    /* HELLO: hello_all's own deadline (the connect timeout) passes first. */
    if (want == DT_MSG_WELCOME) kind.timeout_us = (c->connect_timeout_ms + 1000) * 1000LL;
    if (dt_ex_begin(c->ex, &kind, chunks, dt_clock_us()))
        return dt_errorf(err, DT_EINVAL, "ps client: %s: %s", call->what, dt_assert_why());
    c->call = *call;
    c->call.t0 = c->m_push || c->m_pull ? dt_seconds() : 0;
    return DT_OK;
}

/* Sync mode: a chunk may come back a step ahead of another (with backup workers a ps can move a
 * chunk on while this worker's requests are in flight). The chunks behind are pulled again at
 * exactly the newest step seen: a ps answers an EXACT pull when the chunk reaches that step, or
 * from its snapshot if it has passed it, so one round makes every chunk of every ps one step.
 * oldest (a worker resuming, which pushes nothing for the step under way): the chunks ahead are
 * pulled again at the oldest step instead, from the ps's snapshots. Waiting for the newest would
 * wait for this worker's own gradient: a ps counts a worker that was lost as live again from its
 * first message, so the chunks behind now wait for its gradient of their step, which comes only
 * after the pull (the chief moving on alone streams its chunks one by one, so a resuming worker
 * often finds them a step apart). */
static int send_pull(dt_ps_client *c, int i, int k, int64_t step, int exact, dt_error *err);

static int same_step(dt_ps_client *c, dt_error *err) {
    int64_t target;
    int shards = dt_ex_repull(c->ex, c->call.repull, &target);
    if (!shards) return DT_OK;
    c->call.repulled += shards;
    c->stats.repulls += (uint64_t)shards;
    c->call.what = "PULL (exact step)";
    for (int i = 0; i < c->n_ps; i++)
        for (int k = 0; k < dt_ex_chunks(c->ex, i); k++) {
            int rc = dt_ex_slot(c->ex, i, k) == DT_EX_UNSENT ? send_pull(c, i, k, target, 1, err) : DT_OK;
            if (rc) return fail_call(c, rc);
        }
    return gather(c, err);
}

/* After every reply of a push or pull: each shard's step (what every one of its chunks reached),
 * the counts. */
static void call_done(dt_ps_client *c, int64_t *steps, dt_push_result *res) {
    int64_t s[c->n_ps];
    dt_push_result r = {.repulled = c->call.repulled};
    dt_ex_result(c->ex, s, &r.n_stale, &r.wait_us);
    r.stale_ref = dt_ex_stale_ref(c->ex);
    for (int i = 0; i < c->n_ps; i++) {
        c->ps[i].st.global_step = s[i];
        if (steps) steps[i] = s[i];
    }
    r.global_step = c->ps[0].st.global_step;
    int pushed = c->call.push, pulled = c->call.pull;
    if (pulled) {
        c->stats.pulls++;
        c->stats.wait_us += r.wait_us;
    }
    if (pushed) {
        c->stats.pushes++;
        c->stats.stale_pushes += r.n_stale > 0;
    }
    if (c->call.t0) {
        dt_metric *m = pushed && pulled ? c->m_push_pull : pushed ? c->m_push : c->m_pull;
        dt_metric_observe(m, dt_seconds() - c->call.t0);
        if (pulled) dt_metric_observe(c->m_wait, (double)r.wait_us * 1e-6);
        if (pushed && r.n_stale > 0) dt_metric_add(c->m_stale, 1);
    }
    if (res) *res = r;
}

/* The caller ends an exchange that is not DONE, saying nothing went wrong. */
static int unfinished(dt_ps_client *c, dt_error *err) {
    for (int i = 0; i < c->n_ps; i++)
        for (int k = 0; k < dt_ex_chunks(c->ex, i); k++)
            if (dt_ex_slot(c->ex, i, k) != DT_EX_ARRIVED)
                return dt_errorf(err, DT_EINVAL, "ps client: exchange ended with chunk %d of ps %d not %s", k, i,
                                 dt_ex_slot(c->ex, i, k) == DT_EX_UNSENT ? "sent" : "answered");
    return dt_errorf(err, DT_EINVAL, "ps client: exchange ended as if it had not failed");
}

/* Ends the call under way, whatever its outcome so far (rc): the caller gets its gradient
 * buffers back, sync pulls are made one step, a push or pull is counted; the exchange is over. */
static int call_end(dt_ps_client *c, int rc, int64_t *steps, dt_push_result *res, dt_error *err) {
    if (!rc && dt_ex_get_state(c->ex) != DT_EX_DONE) rc = unfinished(c, err);
    if (rc) fail_call(c, rc);
    if (c->call.push) rc = release_gradients(c, rc, dt_ex_deadline(c->ex), err);
    if (!rc && c->call.pull && c->call.repull >= 0) rc = same_step(c, err);
    if (!rc && (c->call.push || c->call.pull)) call_done(c, steps, res);
    if (rc) fail_call(c, rc);
    else c->last_refusal = 0;
    dt_ex_end(c->ex);
    c->call = (call_t){.what = "no call"};
    return rc;
}

/* The same payload-less request to every ps, then every reply (each passed to fn, if any). */
static int ask_every_ps_once(dt_ps_client *c, dt_msg_type type, uint8_t flags, dt_msg_type reply, const char *what,
                             reply_fn fn, void *user, dt_error *err) {
    int rc = call_begin(c, &(call_t){.what = what, .fn = fn, .user = user, .repull = -1}, reply, err);
    if (rc) return rc;
    for (int i = 0; i < c->n_ps && !rc; i++) {
        dt_wire_header h = dt_wire_header_make(type, 0, 0, 0);
        h.flags = flags;
        rc = send_req(c, i, 0, &h, NULL, request_deadline(c), err);
    }
    if (!rc) rc = gather(c, err);
    return call_end(c, rc, NULL, NULL, err);
}

/* ... asked again while a ps says it is busy, for the requests that change nothing (ask_again). */
static int ask_every_ps_flagged(dt_ps_client *c, dt_msg_type type, uint8_t flags, dt_msg_type reply,
                                const char *what, reply_fn fn, void *user, dt_error *err) {
    const int64_t first = dt_clock_us();
    int pause = BUSY_PAUSE_MS, rc;
    while ((rc = ask_every_ps_once(c, type, flags, reply, what, fn, user, err)) &&
           (type == DT_MSG_FETCH || type == DT_MSG_STATUS) && ask_again(c, rc, first, &pause)) {
    }
    return rc;
}

static int ask_every_ps(dt_ps_client *c, dt_msg_type type, dt_msg_type reply, const char *what, reply_fn fn,
                        void *user, dt_error *err) {
    return ask_every_ps_flagged(c, type, 0, reply, what, fn, user, err);
}

int dt_ps_client_n_ps(const dt_ps_client *c) { return c->n_ps; }

int dt_ps_client_last_refusal(const dt_ps_client *c) { return c->last_refusal; }

int dt_ps_client_buffers_held(const dt_ps_client *c) { return c->buffers_held; }

int64_t dt_ps_client_silent_ms(const dt_ps_client *c) {
    int64_t now = dt_clock_us(), longest = 0;
    for (int i = 0; i < c->n_ps; i++) {
        int64_t q = now - c->ps[i].quiet_since;
        if (q > longest) longest = q;
        if (c->ps[i].gap_us > longest) longest = c->ps[i].gap_us;
    }
    return longest / 1000;
}

const dt_ps_client_stats *dt_ps_client_get_stats(const dt_ps_client *c) { return &c->stats; }

const dt_ps_shard_status *dt_ps_client_shard(const dt_ps_client *c, int ps) {
    return ps >= 0 && ps < c->n_ps ? &c->ps[ps].st : NULL;
}

void dt_ps_client_close(dt_ps_client *c) {
    if (!c) return;
    for (int i = 0; i < c->n_ps && c->ps; i++) {
        if (c->ps[i].sock) zmq_close(c->ps[i].sock);
        free(c->ps[i].endpoint);
        free(c->ps[i].recv);
    }
    /* Terminating the context releases every zero-copy frame still queued (linger is 0). */
    if (c->ctx) zmq_ctx_term(c->ctx);
    dt_codec_free(c->codec); /* after: libzmq may have held packed gradients till then */
    dt_ex_close(c->ex);
    free(c->s_dst), free(c->names), free(c->one_buf);
    free(c->ps);
    free(c);
}

/* ---- open: connect, then HELLO to every ps ---- */

static int on_welcome(dt_ps_client *c, int i, dt_wire_in *in, void *user, dt_error *err) {
    (void)user;
    if (in->hdr.shard_floats == c->ps[i].n) return DT_OK;
    char msg[160];
    snprintf(msg, sizeof msg, "holds %llu floats, this worker expects %zu (same model and --ps_hosts everywhere?)",
             (unsigned long long)in->hdr.shard_floats, c->ps[i].n);
    return fail_ps(c, i, err, DT_EPROTO, "", msg);
}

typedef struct {
    int64_t start, deadline;  /* dt_clock_us */
    int64_t *sent_at;         /* [n_ps] the latest HELLO (-1: none yet) */
    uint8_t *told;            /* [n_ps] the log said whom this worker waits for */
} hello_t;

/* A ps silent for a second is most likely not up yet: say once whom this worker waits for, and
 * how long it will, rather than nothing until the deadline. Past the deadline, fail naming the
 * first ps that has not answered. */
static int hello_check(dt_ps_client *c, hello_t *h, int64_t now, dt_error *err) {
    for (int i = 0; i < c->n_ps && c->log && now - h->start >= HELLO_RESEND_US; i++) {
        if (dt_ex_slot(c->ex, i, 0) == DT_EX_ARRIVED || h->told[i]) continue;
        fprintf(c->log, "worker %u: waiting for ps %d at %s (not up yet?); retrying for up to %g s "
                "(--connect_timeout)\n", c->task, i, c->ps[i].endpoint, c->connect_timeout_ms / 1000.0);
        fflush(c->log);
        h->told[i] = 1;
    }
    for (int i = 0; i < c->n_ps && now >= h->deadline; i++) {
        if (dt_ex_slot(c->ex, i, 0) == DT_EX_ARRIVED) continue;
        char msg[320];
        snprintf(msg, sizeof msg, "no answer to HELLO within %d ms (is the ps running, and do all processes "
                 "use the same --ps_hosts and --auth?%s)", c->connect_timeout_ms,
                 c->curve ? " With --auth=curve a ps refuses a client whose key is not in its authorized "
                            "folder, or that has another server.key; the ps logs the refusal" : "");
        return fail_ps(c, i, err, DT_ETIMEOUT, "", msg);
    }
    return DT_OK;
}

/* A DEALER queues messages until its connection is up (ZeroMQ reconnects with backoff), so one
 * HELLO per ps would do; it is sent again every HELLO_RESEND_US in case a connection dropped with
 * it. Any of a ps's HELLOs may be answered (the exchange awaits them all as one); the replies to
 * the others are ignored. */
static int hello_send(dt_ps_client *c, hello_t *h, int64_t now, dt_error *err) {
    for (int i = 0; i < c->n_ps; i++) {
        if (dt_ex_slot(c->ex, i, 0) == DT_EX_ARRIVED || (h->sent_at[i] >= 0 && now - h->sent_at[i] < HELLO_RESEND_US))
            continue;
        dt_wire_header hd = dt_wire_header_make(DT_MSG_HELLO, c->role, c->task, 0);
        hd.shard_floats = c->ps[i].n;
        int rc = send_req(c, i, 0, &hd, NULL, h->deadline, err);
        /* A ps that refuses the handshake (--auth) leaves no connection to queue on, so the resend
         * blocks until the deadline: reported as no answer, like a ps that is down. */
        if (rc == DT_ETIMEOUT) break;
        if (rc) return rc;
        h->sent_at[i] = now;
    }
    return DT_OK;
}

/* HELLO to every ps until each has answered WELCOME (its shard size checked), or the connect
 * timeout passes. */
static int hello_all(dt_ps_client *c, dt_error *err) {
    int64_t sent_at[c->n_ps];
    uint8_t told[c->n_ps];
    hello_t h = {.start = dt_clock_us(), .sent_at = sent_at, .told = told};
    h.deadline = h.start + c->connect_timeout_ms * 1000LL;
    for (int i = 0; i < c->n_ps; i++) sent_at[i] = -1, told[i] = 0;
    int rc = call_begin(c, &(call_t){.what = "HELLO", .fn = on_welcome, .repull = -1}, DT_MSG_WELCOME, err);
    if (rc) return rc;
    while (!rc && dt_ex_get_state(c->ex) == DT_EX_OPEN) {
        if (stopping(c)) rc = DT_EINTR;
        if (!rc) rc = hello_send(c, &h, dt_clock_us(), err); /* may block until the deadline */
        int64_t now = dt_clock_us();
        if (!rc) rc = hello_check(c, &h, now, err);
        int64_t wait_ms = (h.deadline - now + 999) / 1000;
        if (!rc) rc = wait_round(c, wait_ms < HELLO_POLL_MS ? (long)wait_ms : HELLO_POLL_MS, -1, err);
    }
    if (rc == DT_EINTR) /* a stop, or a signal during the wait */
        rc = dt_errorf(err, DT_EINTR, "connecting to the ps tasks interrupted by a signal");
    return call_end(c, rc, NULL, NULL, err);
}

/* The client's series; one reopened after a fault continues the same ones. */
static void client_metrics(dt_ps_client *c, struct dt_metrics *m) {
    const double *b = dt_metrics_latency_bounds;
    int n = dt_metrics_latency_n;
    c->m_push = dt_metrics_histogram(m, "dtrain_push_seconds", "Pushing a gradient to every ps, until acknowledged.", NULL, b, n);
    c->m_pull = dt_metrics_histogram(m, "dtrain_pull_seconds", "Pulling the parameters from every ps.", NULL, b, n);
    c->m_push_pull = dt_metrics_histogram(m, "dtrain_push_pull_seconds", "A push and the following pull in one "
                                          "exchange (each step's), until every parameter is back.", NULL, b, n);
    c->m_wait = dt_metrics_histogram(m, "dtrain_barrier_wait_seconds", "Per pull, the longest a ps held it until its "
                                     "step was reached (the sync barrier).", NULL, b, n);
    c->m_tx = dt_metrics_counter(m, DT_M_SENT, DT_M_SENT_HELP, NULL);
    c->m_rx = dt_metrics_counter(m, DT_M_RECEIVED, DT_M_RECEIVED_HELP, NULL);
    c->m_stale = dt_metrics_counter(m, DT_M_STALE, "This worker's gradients that at least one ps dropped as stale.", NULL);
}

/* The configuration's checks that need no connection. */
static int check_config(const dt_ps_client_config *cfg, dt_error *err) {
    if (cfg->n_ps <= 0 || !cfg->endpoints || !cfg->shard_floats)
        return dt_errorf(err, DT_EINVAL, "ps client: no ps tasks given");
    if (cfg->role != DT_ROLE_WORKER && cfg->role != DT_ROLE_CHIEF)
        return dt_errorf(err, DT_EINVAL, "ps client: role must be worker or chief");
    if (cfg->task < 0 || cfg->task > UINT16_MAX)
        return dt_errorf(err, DT_EINVAL, "ps client: task index %d out of range", cfg->task);
    if (cfg->replicas_to_aggregate < 0 || cfg->total_num_replicas < 0 || cfg->staleness < 0 ||
        (cfg->replicas_to_aggregate > 0 &&
         (cfg->total_num_replicas < cfg->replicas_to_aggregate || cfg->total_num_replicas > (int)DT_WIRE_MAX_REPLICAS ||
          cfg->staleness > (int)DT_WIRE_MAX_STALENESS ||
          (uint64_t)(cfg->staleness + 1) * (uint64_t)cfg->replicas_to_aggregate > DT_WIRE_MAX_HELD_GRADIENTS)))
        return dt_errorf(err, DT_EINVAL, "ps client: sync configuration aggregate %d, total %d, staleness %d "
                         "(need 1 <= aggregate <= total <= %u, staleness <= %u, (staleness + 1) x aggregate <= %u)",
                         cfg->replicas_to_aggregate, cfg->total_num_replicas, cfg->staleness, DT_WIRE_MAX_REPLICAS,
                         DT_WIRE_MAX_STALENESS, DT_WIRE_MAX_HELD_GRADIENTS);
    if ((unsigned)cfg->compression >= DT_ENC_COUNT)
        return dt_errorf(err, DT_EINVAL, "ps client: compression %d is not an encoding", (int)cfg->compression);
    for (int i = 0; i < cfg->n_ps; i++) {
        const char *ep = cfg->endpoints[i];
        size_t n = cfg->shard_floats[i];
        if (!ep || !*ep) return dt_errorf(err, DT_EINVAL, "ps %d: empty endpoint", i);
        if (n == 0 || n > DT_WIRE_MAX_SHARD_FLOATS)
            return dt_errorf(err, DT_EINVAL, "ps %d at %s: shard of %zu floats (must be 1..%llu)", i, ep, n,
                             (unsigned long long)DT_WIRE_MAX_SHARD_FLOATS);
    }
    return DT_OK;
}

/* The settings a client keeps from its (checked) configuration. */
static void take_config(dt_ps_client *c, const dt_ps_client_config *cfg) {
    c->n_ps = cfg->n_ps;
    c->role = cfg->role;
    c->task = (uint16_t)cfg->task;
    c->connect_timeout_ms = cfg->connect_timeout_ms > 0 ? cfg->connect_timeout_ms : 10000;
    c->request_timeout_ms = cfg->request_timeout_ms > 0 ? cfg->request_timeout_ms : 60000;
    c->stop = cfg->stop;
    if (cfg->replicas_to_aggregate > 0) {
        c->aggregate = cfg->replicas_to_aggregate;
        c->total = cfg->total_num_replicas;
        c->staleness = cfg->staleness;
        c->liveness_ms = cfg->liveness_ms > 0 ? cfg->liveness_ms : 0;
        c->strict = cfg->strict != 0;
        c->elastic = cfg->elastic != 0;
    }
    c->n_workers = cfg->n_workers > 0 && cfg->n_workers <= (int)DT_WIRE_MAX_REPLICAS ? cfg->n_workers : 0;
    c->chunk_bytes = cfg->chunk_bytes < 0 ? DT_WIRE_CHUNK_BYTES_DEFAULT : (uint64_t)cfg->chunk_bytes;
    c->name_float = cfg->name_float;
    c->name_user = cfg->name_user;
    c->encoding = (uint8_t)cfg->compression;
    c->curve = cfg->auth && cfg->auth->curve;
    if (c->curve) {
        c->auth = *cfg->auth;
        c->auth.n_allowed = 0; /* the server's list: not a client's */
        c->auth.allowed = NULL;
    }
    c->log = cfg->log;
    c->sndbuf = cfg->sndbuf_bytes > 0 ? cfg->sndbuf_bytes : 0;
}

/* Every ps's connection, its socket connected (HELLO not sent yet), and the exchange core. */
static int open_conns(dt_ps_client *c, const dt_ps_client_config *cfg, dt_error *err) {
    if (!(c->ps = dt_calloc((size_t)c->n_ps, sizeof *c->ps, "ps client connections", err)) ||
        !(c->names = dt_calloc((size_t)c->n_ps, sizeof *c->names, "ps client connections", err)))
        return DT_ENOMEM;
    if (!(c->ctx = zmq_ctx_new())) return dt_errorf(err, DT_ENET, "zmq_ctx_new: %s", zmq_strerror(errno));
    for (int i = 0; i < c->n_ps; i++) {
        atomic_init(&c->ps[i].inflight, 0);
        atomic_init(&c->ps[i].wake_fd, -1);
        c->ps[i].chunks = 1;
    }
    for (int i = 0; i < c->n_ps; i++) {
        ps_conn *p = &c->ps[i];
        p->n = cfg->shard_floats[i];
        if (!(p->endpoint = dt_malloc(strlen(cfg->endpoints[i]) + 1, "ps endpoint", err))) return DT_ENOMEM;
        strcpy(p->endpoint, cfg->endpoints[i]);
        c->names[i] = p->endpoint;
        int rc = conn_socket(c, i, err);
        if (rc) return rc;
    }
    return dt_ex_open(&c->ex, c->n_ps, cfg->shard_floats, c->names, err);
}

int dt_ps_client_open(dt_ps_client **out, const dt_ps_client_config *cfg, dt_error *err) {
    *out = NULL;
    int rc = check_config(cfg, err);
    if (rc) return rc;
    dt_ps_client *c = dt_calloc(1, sizeof *c, "ps client", err);
    if (!c) return DT_ENOMEM;
    take_config(c, cfg);
    client_metrics(c, cfg->metrics);
    c->call.what = "no call";
    if (!(rc = open_conns(c, cfg, err)) && c->encoding != DT_ENC_FP32)
        rc = dt_codec_open(&c->codec, (dt_encoding)c->encoding, c->n_ps, cfg->shard_floats, err);
    if (!rc) rc = hello_all(c, err);
    if (rc) {
        dt_ps_client_close(c);
        return rc;
    }
    *out = c;
    return DT_OK;
}

/* ---- per-ps requests: INIT, STATUS, FETCH, DONE, SHUTDOWN ---- */

/* ps i's INIT: header h and payload m (parameters, optimizer state, options, decay mask). */
static int init_message(dt_ps_client *c, int i, const dt_opt_config *opt, const float *params, const float *state,
                        const uint8_t *decay, dt_wire_header *h, zmq_msg_t *m, dt_error *err) {
    int slots = dt_opt_slots(opt);
    size_t n = c->ps[i].n, pbytes = n * sizeof(float), sbytes = (size_t)slots * pbytes;
    size_t total = (size_t)dt_wire_init_bytes((unsigned)slots, n);
    if (zmq_msg_init_size(m, total) != 0)
        return dt_errorf(err, DT_ENOMEM, "out of memory for the INIT of ps %d (%zu bytes)", i, total);
    uint8_t *d = zmq_msg_data(m);
    memcpy(d, params, pbytes);
    if (state) memcpy(d + pbytes, state, sbytes);
    else memset(d + pbytes, 0, sbytes);
    /* The options block, then the decay mask as bits (docs/protocol.md, "INIT options"). */
    uint8_t *o = d + pbytes + sbytes, *bits = o + DT_WIRE_OPTS_BYTES;
    dt_wire_opts_encode(o, &opt->schedule, opt->weight_decay);
    memset(bits, 0, (n + 7) / 8);
    for (size_t k = 0; decay && k < n; k++)
        if (decay[k]) bits[k >> 3] |= (uint8_t)(1u << (k & 7));
    *h = dt_wire_header_make(DT_MSG_INIT, 0, 0, 0);
    h->shard_floats = n;
    h->opt_kind = (uint8_t)opt->kind;
    h->opt_slots = (uint8_t)slots;
    h->learning_rate = opt->learning_rate;
    h->momentum = opt->momentum;
    h->beta1 = opt->beta1;
    h->beta2 = opt->beta2;
    h->epsilon = opt->epsilon;
    h->init.replicas_to_aggregate = (uint64_t)c->aggregate;
    h->init.total_num_replicas = (uint64_t)(c->aggregate ? c->total : c->n_workers);
    h->init.staleness = (uint64_t)c->staleness;
    unsigned k = dt_wire_chunks_for(n, c->chunk_bytes);
    h->chunks = (uint8_t)(k > n ? n : k);
    h->liveness_ms = c->liveness_ms;
    if (c->strict) h->flags = DT_WIRE_F_STRICT;
    if (c->elastic) h->flags |= DT_WIRE_F_ELASTIC;
    return DT_OK;
}

int dt_ps_client_init(dt_ps_client *c, const dt_opt_config *opt, const float *const *params,
                      const float *const *state, const uint8_t *const *decay, int64_t global_step, dt_error *err) {
    if (c->role != DT_ROLE_CHIEF) return dt_errorf(err, DT_EINVAL, "only the chief initialises the ps tasks");
    if (global_step < 0) return dt_errorf(err, DT_EINVAL, "initial global step %lld < 0", (long long)global_step);
    /* A generation no shard reported last: after the newest one, skipping any in use (1..255). */
    int gen = 0;
    for (int i = 0; i < c->n_ps; i++)
        if (c->ps[i].st.generation > gen) gen = c->ps[i].st.generation;
    /* At most 255 tries: with fewer than 255 shards some value is free. */
    for (int clash = 1, tries = 0; clash && tries < 255; tries++) {
        gen = gen % 255 + 1;
        clash = 0;
        for (int i = 0; i < c->n_ps; i++) clash |= c->ps[i].st.generation == gen;
    }
    int rc = call_begin(c, &(call_t){.what = "INIT", .repull = -1}, DT_MSG_ACK, err);
    if (rc) return rc;
    for (int i = 0; i < c->n_ps && !rc; i++) {
        dt_wire_header h;
        zmq_msg_t m;
        rc = init_message(c, i, opt, params[i], state ? state[i] : NULL, decay ? decay[i] : NULL, &h, &m, err);
        h.global_step = global_step;
        h.generation = (uint8_t)gen;
        if (!rc) rc = send_req(c, i, 0, &h, &m, request_deadline(c), err);
    }
    if (!rc) rc = gather(c, err);
    return call_end(c, rc, NULL, NULL, err);
}

static int on_status(dt_ps_client *c, int i, dt_wire_in *in, void *user, dt_error *err) {
    (void)user, (void)err;
    c->ps[i].st.pushes = in->hdr.status_reply.updates;
    c->ps[i].st.pulls = in->hdr.status_reply.params_replies;
    c->ps[i].st.workers_done = in->hdr.status_reply.workers_done;
    c->ps[i].st.workers_busy = in->hdr.workers_busy;
    return DT_OK;
}

int dt_ps_client_status(dt_ps_client *c, dt_ps_shard_status *out, dt_error *err) {
    int rc = ask_every_ps(c, DT_MSG_STATUS, DT_MSG_STATUS_REPLY, "STATUS", on_status, NULL, err);
    if (!rc && out)
        for (int i = 0; i < c->n_ps; i++) out[i] = c->ps[i].st;
    return rc;
}

int dt_ps_client_wait_ready(dt_ps_client *c, int timeout_ms, dt_error *err) {
    int64_t deadline = dt_clock_us() + (timeout_ms > 0 ? timeout_ms : 0) * 1000LL;
    for (;;) {
        if (stopping(c))
            return dt_errorf(err, DT_EINTR, "interrupted by a signal");
        int rc = dt_ps_client_status(c, NULL, err), waiting = -1;
        if (rc) return rc;
        for (int i = 0; i < c->n_ps && waiting < 0; i++)
            if (!c->ps[i].st.initialised || c->ps[i].st.importing) waiting = i;
        if (waiting < 0) return DT_OK;
        int64_t left = (deadline - dt_clock_us()) / 1000;
        if (left <= 0) {
            char msg[160];
            snprintf(msg, sizeof msg, "not initialised after %d ms: the chief (worker 0) has not sent the model (is it running?)",
                     timeout_ms);
            return fail_ps(c, waiting, err, DT_ETIMEOUT, "", msg);
        }
        zmq_poll(NULL, 0, left < READY_POLL_MS ? (long)left : READY_POLL_MS); /* a bounded sleep */
    }
}

/* ---- push and pull: the streaming calls are the core, the whole-shard calls wrap them ---- */

/* A PULL of chunk k of ps i: step is the minimum wanted, or with exact the very step (sync mode). */
static int send_pull(dt_ps_client *c, int i, int k, int64_t step, int exact, dt_error *err) {
    dt_wire_header h = dt_wire_header_make(DT_MSG_PULL, 0, 0, 0);
    h.global_step = step;
    h.chunk = (uint8_t)k;
    h.chunks = (uint8_t)dt_ex_chunks(c->ex, i);
    h.encoding = c->encoding;
    if (exact) h.flags = DT_WIRE_F_EXACT;
    return send_req(c, i, k, &h, NULL, request_deadline(c), err);
}

/* A PUSH of chunk k of ps i, zero-copy from the caller's buffer (release_inflight tells when libzmq
 * is done with it); when the call pulls too, the ps answers with that chunk's PARAMS at min_step or
 * later. */
static int send_push(dt_ps_client *c, int i, int k, const float *grad, dt_error *err) {
    ps_conn *p = &c->ps[i];
    unsigned chunks = (unsigned)dt_ex_chunks(c->ex, i);
    uint64_t off, len;
    dt_wire_chunk(p->n, chunks, (unsigned)k, &off, &len);
    const void *data = grad + off;
    size_t bytes = (size_t)len * sizeof(float);
    /* --compression: packed with error feedback into the codec's buffer, sent from there. */
    if (c->codec) data = dt_codec_encode(c->codec, i, chunks, (unsigned)k, grad, &bytes);
    zmq_msg_t m;
    atomic_fetch_add(&p->inflight, 1);
    if (zmq_msg_init_data(&m, (void *)data, bytes, release_inflight, p) != 0) {
        atomic_fetch_sub(&p->inflight, 1);
        return dt_errorf(err, DT_ENOMEM, "zmq_msg_init_data: %s", zmq_strerror(errno));
    }
    int pull = c->call.pull;
    dt_wire_header h = dt_wire_header_make(DT_MSG_PUSH, 0, 0, 0);
    h.local_step = c->call.local_step;
    h.push.examples = c->call.examples;
    h.global_step = pull ? c->call.min_step : 0;
    h.chunk = (uint8_t)k;
    h.chunks = (uint8_t)chunks;
    h.flags = (uint8_t)((c->aggregate ? DT_WIRE_F_SYNC : 0) | (pull ? DT_WIRE_F_PULL : 0));
    h.encoding = c->encoding;
    return send_req(c, i, k, &h, &m, request_deadline(c), err);
}

/* One chunk of the call under way: its gradient (a PUSH, asking for its PARAMS when the call pulls
 * too), or a PULL. */
static int send_chunk(dt_ps_client *c, int i, int k, const float *grad, dt_error *err) {
    return c->call.push ? send_push(c, i, k, grad, err) : send_pull(c, i, k, c->call.min_step, 0, err);
}

/* A client learns how a ps cuts its shard from the ps's replies. One that has not heard from an
 * initialised ps yet (it only said HELLO before the chief's INIT) asks every ps first: a push sent
 * with a wrong cut would be refused at that ps while another applied it, and could not simply be
 * sent again. */
static int learn_cut(dt_ps_client *c, dt_error *err) {
    for (int i = 0; i < c->n_ps; i++)
        if (!c->ps[i].cut_known) return dt_ps_client_status(c, NULL, err);
    return DT_OK;
}

/* The receive buffers pull_views and streaming hand out. */
static int recv_buffers(dt_ps_client *c, float **dst, dt_error *err) {
    for (int i = 0; i < c->n_ps; i++) {
        if (!c->ps[i].recv && !(c->ps[i].recv = dt_alloc_floats(c->ps[i].n, "pulled shard", err))) return DT_ENOMEM;
        dst[i] = c->ps[i].recv;
    }
    return DT_OK;
}

/* Begins a push, a pull or both (call: what and where), once the cut is known. */
static int xfer_begin(dt_ps_client *c, call_t *call, dt_error *err) {
    if (dt_ex_get_state(c->ex) != DT_EX_IDLE)
        return dt_errorf(err, DT_EINVAL, "ps client: an exchange is already under way");
    if (c->unusable[0]) return dt_errorf(err, DT_EIO, "ps client: %s", c->unusable);
    if (call->push && call->local_step < 0)
        return dt_errorf(err, DT_EINVAL, "push: local_step %lld < 0", (long long)call->local_step);
    if (call->min_step < 0) return dt_errorf(err, DT_EINVAL, "pull: min_step %lld < 0", (long long)call->min_step);
    call->what = call->push && call->pull ? "PUSH+PULL" : call->push ? "PUSH" : "PULL";
    call->examples = call->push ? c->examples : 0;
    int rc = learn_cut(c, err);
    return rc ? rc : call_begin(c, call, call->pull ? DT_MSG_PARAMS : DT_MSG_PUSH_ACK, err);
}

/* A whole push, pull or both: begin, send every chunk of every ps at once, chunk by chunk across
 * the ps tasks (chunk 0 of every ps first), so every link is busy from the start and each ps can
 * apply and answer its first chunks while the later ones are still on the wire (docs/protocol.md,
 * "Chunks"); wait for every reply; end. */
static int xfer_once(dt_ps_client *c, call_t *call, const float *const *grads, int64_t *steps, dt_push_result *res,
                     dt_error *err) {
    int rc = xfer_begin(c, call, err);
    if (rc) return rc;
    int most = 0;
    for (int i = 0; i < c->n_ps; i++)
        if (dt_ex_chunks(c->ex, i) > most) most = dt_ex_chunks(c->ex, i);
    for (int k = 0; k < most && !rc; k++)
        for (int i = 0; i < c->n_ps && !rc; i++)
            if (k < dt_ex_chunks(c->ex, i)) rc = send_chunk(c, i, k, grads ? grads[i] : NULL, err);
    if (!rc) rc = gather(c, err);
    /* Whatever happened, the caller gets its gradient buffers back. */
    return call_end(c, rc, steps, res, err);
}

/* ... a pull asked again while a ps says it is busy (ask_again). */
static int xfer(dt_ps_client *c, call_t *call, const float *const *grads, int64_t *steps, dt_push_result *res,
                dt_error *err) {
    const int64_t first = dt_clock_us();
    int pause = BUSY_PAUSE_MS, rc;
    while ((rc = xfer_once(c, call, grads, steps, res, err)) && !call->push && ask_again(c, rc, first, &pause)) {
    }
    return rc;
}

/* A pull into the receive buffers, handed out as views (valid until the next call). */
static int xfer_views(dt_ps_client *c, call_t *call, const float *const *grads, const float **views, int64_t *steps,
                      dt_push_result *res, dt_error *err) {
    float *dst[c->n_ps];
    int rc = recv_buffers(c, dst, err);
    call->dst = dst;
    if (!rc) rc = xfer(c, call, grads, steps, res, err);
    for (int i = 0; i < c->n_ps && !rc; i++) views[i] = dst[i];
    return rc;
}

int dt_ps_client_pull_views(dt_ps_client *c, int64_t min_step, const float **views, int64_t *steps,
                            dt_error *err) {
    return dt_ps_client_push_pull(c, NULL, 0, min_step, views, steps, NULL, err);
}

int dt_ps_client_pull_resume(dt_ps_client *c, const float **views, int64_t *steps, dt_error *err) {
    call_t call = {.pull = 1, .repull = c->aggregate ? 1 : -1};
    return xfer_views(c, &call, NULL, views, steps, NULL, err);
}

int dt_ps_client_pull_all(dt_ps_client *c, float *const *params, int64_t min_step, int64_t *steps,
                          dt_error *err) {
    call_t call = {.pull = 1, .min_step = min_step, .dst = params, .repull = c->aggregate ? 0 : -1};
    return xfer(c, &call, NULL, steps, NULL, err);
}

int dt_ps_client_push_all(dt_ps_client *c, const float *const *grads, int64_t local_step,
                          dt_push_result *res, dt_error *err) {
    call_t call = {.push = 1, .local_step = local_step, .repull = -1};
    return xfer(c, &call, grads, NULL, res, err);
}

int dt_ps_client_push_pull(dt_ps_client *c, const float *const *grads, int64_t local_step,
                           int64_t min_step, const float **views, int64_t *steps, dt_push_result *res,
                           dt_error *err) {
    call_t call = {.push = grads != NULL, .pull = 1, .local_step = local_step, .min_step = min_step,
                   .repull = c->aggregate ? 0 : -1};
    return xfer_views(c, &call, grads, views, steps, res, err);
}

int dt_ps_client_set_examples(dt_ps_client *c, uint64_t examples, dt_error *err) {
    if (examples > DT_WIRE_MAX_EXAMPLES)
        return dt_errorf(err, DT_EINVAL, "ps client: a gradient of %llu examples, beyond the bound "
                         "DT_WIRE_MAX_EXAMPLES = %llu", (unsigned long long)examples,
                         (unsigned long long)DT_WIRE_MAX_EXAMPLES);
    c->examples = (uint32_t)examples;
    return DT_OK;
}

/* ---- streaming: one exchange whose chunks are pushed one by one (worker/overlap.c) ---- */

int dt_ps_client_stream_begin(dt_ps_client *c, int64_t local_step, int64_t min_step, dt_error *err) {
    if (!c->s_dst && !(c->s_dst = dt_calloc((size_t)c->n_ps, sizeof *c->s_dst, "receive buffers", err)))
        return DT_ENOMEM;
    int rc = recv_buffers(c, c->s_dst, err);
    call_t call = {.push = 1, .pull = 1, .local_step = local_step, .min_step = min_step, .dst = c->s_dst,
                   .repull = -1};
    return rc ? rc : xfer_begin(c, &call, err);
}

int dt_ps_client_chunks(const dt_ps_client *c, int ps) { return c->ps[ps].chunks; }

int dt_ps_client_inflight(const dt_ps_client *c, int ps) { return atomic_load(&c->ps[ps].inflight); }

void dt_ps_client_set_wake_fd(dt_ps_client *c, int fd) {
    for (int i = 0; i < c->n_ps; i++) atomic_store(&c->ps[i].wake_fd, fd);
}

int dt_ps_client_stream_push(dt_ps_client *c, int ps, int chunk, const float *grad, dt_error *err) {
    if (dt_ex_get_state(c->ex) != DT_EX_OPEN || !c->call.push || dt_ex_slot(c->ex, ps, chunk) != DT_EX_UNSENT)
        return dt_errorf(err, DT_EINVAL, "ps client: no exchange under way, or chunk %d of ps %d is not due", chunk,
                         ps);
    return send_push(c, ps, chunk, grad, err);
}

int dt_ps_client_stream_poll(dt_ps_client *c, int fd, int max_ms, dt_ps_chunk_fn fn, void *user, dt_error *err) {
    dt_ex_state s = dt_ex_get_state(c->ex);
    if (s != DT_EX_OPEN && s != DT_EX_DONE) return dt_errorf(err, DT_EINVAL, "ps client: no exchange under way");
    c->call.on_chunk = fn, c->call.chunk_user = user;
    int rc = wait_round(c, max_ms, fd, err);
    c->call.on_chunk = NULL, c->call.chunk_user = NULL;
    return rc;
}

int dt_ps_client_stream_end(dt_ps_client *c, int rc, int64_t *steps, dt_push_result *res, dt_error *err) {
    if (dt_ex_get_state(c->ex) == DT_EX_IDLE)
        return rc ? rc : dt_errorf(err, DT_EINVAL, "ps client: no exchange under way");
    /* Sync mode: with every replica's gradient in each step every chunk comes back at one step. While
     * a ps waits for fewer (a worker lost), a chunk can come back a step ahead of another; the
     * caller has already computed on it as it came (it cannot be pulled again under a forward that
     * read it), the shard's step is its oldest chunk's, and the chunks ahead drop the next gradient
     * as stale, so the worker is back in step after one exchange: no repull here. */
    return call_end(c, rc, steps, res, err);
}

/* ---- sparse tables: messages built by the caller (worker/sparse_client.h) ---- */

static int on_sparse(dt_ps_client *c, int i, dt_wire_in *in, void *user, dt_error *err) {
    (void)user;
    return c->call.sparse_fn(c->call.sparse_user, i, c->call.reply_slot, &in->hdr, zmq_msg_data(&in->payload),
                             zmq_msg_size(&in->payload), err);
}

int dt_ps_client_sparse_send(dt_ps_client *c, const int *n_msgs, dt_sparse_msg *const *msgs, dt_sparse_reply_fn fn,
                             void *user, int *sent, dt_error *err) {
    uint8_t type = 0;
    *sent = 0;
    for (int i = 0; i < c->n_ps; i++) {
        if (n_msgs[i] < 0 || n_msgs[i] > (int)DT_WIRE_MAX_CHUNKS)
            return dt_errorf(err, DT_EINVAL, "ps client: %d sparse messages to ps %d (at most %u per call)", n_msgs[i],
                             i, DT_WIRE_MAX_CHUNKS);
        for (int k = 0; k < n_msgs[i]; k++) {
            if (!type) type = msgs[i][k].h.type;
            if (msgs[i][k].h.type != type || !dt_wire_type_is_sparse(type) || type == DT_MSG_SPARSE_ROWS ||
                type == DT_MSG_SPARSE_PAGE)
                return dt_errorf(err, DT_EINVAL, "ps client: a sparse call sends requests of one kind (SPARSE_INIT, "
                                 "_PULL, _PUSH, _EXPORT or _IMPORT)");
        }
    }
    if (!type) return DT_OK; /* nothing to send */
    call_t call = {.what = dt_wire_type_name(type), .fn = on_sparse, .repull = -1, .slots = n_msgs,
                   .sparse_fn = fn, .sparse_user = user};
    const uint8_t want = type == DT_MSG_SPARSE_PULL     ? DT_MSG_SPARSE_ROWS
                         : type == DT_MSG_SPARSE_EXPORT ? DT_MSG_SPARSE_PAGE
                                                        : DT_MSG_ACK;
    int rc = call_begin(c, &call, want, err);
    if (rc) return rc;
    *sent = 1;
    for (int i = 0; i < c->n_ps && !rc; i++)
        for (int k = 0; k < n_msgs[i] && !rc; k++) {
            const dt_sparse_msg *m = &msgs[i][k];
            zmq_msg_t z;
            if (zmq_msg_init_size(&z, m->bytes) != 0) {
                rc = dt_errorf(err, DT_ENOMEM, "out of memory for a %s of %zu bytes", call.what, m->bytes);
                break;
            }
            if (m->bytes) memcpy(zmq_msg_data(&z), m->payload, m->bytes);
            dt_wire_header h = m->h;
            rc = send_req(c, i, k, &h, &z, request_deadline(c), err);
        }
    /* the call stays under way: dt_ps_client_sparse_end takes its replies, or ends its failure */
    return rc;
}

int dt_ps_client_sparse_end(dt_ps_client *c, int rc, dt_error *err) {
    if (!rc) rc = gather(c, err);
    return call_end(c, rc, NULL, NULL, err);
}

int dt_ps_client_sparse(dt_ps_client *c, const int *n_msgs, dt_sparse_msg *const *msgs, dt_sparse_reply_fn fn,
                        void *user, dt_error *err) {
    int sent, rc = dt_ps_client_sparse_send(c, n_msgs, msgs, fn, user, &sent, err);
    return sent ? dt_ps_client_sparse_end(c, rc, err) : rc;
}

/* ---- checkpoints and the end of training ---- */

/* Where STATE replies go. */
typedef struct {
    const dt_opt_config *opt;
    float *const *params, *const *state;
    int64_t *steps_max;
} fetch_ctx;

static int on_state(dt_ps_client *c, int i, dt_wire_in *in, void *user, dt_error *err) {
    fetch_ctx *f = user;
    const dt_wire_header *h = &in->hdr;
    if (h->opt_kind != (uint8_t)f->opt->kind) {
        char msg[160];
        snprintf(msg, sizeof msg, "holds %s optimizer state, the caller expects %s (same --optimizer everywhere?)",
                 dt_opt_name((dt_opt_kind)h->opt_kind), dt_opt_name(f->opt->kind));
        return fail_ps(c, i, err, DT_EPROTO, "FETCH", msg);
    }
    /* The slot count matches the kind (checked by decode) and the size the slots (by the exchange). */
    const char *d = zmq_msg_data(&in->payload);
    size_t pbytes = c->ps[i].n * sizeof(float);
    memcpy(f->params[i], d, pbytes);
    if (f->state && h->opt_slots) memcpy(f->state[i], d + pbytes, (size_t)h->opt_slots * pbytes);
    if (f->steps_max) f->steps_max[i] = h->state.step_max > INT64_MAX ? INT64_MAX : (int64_t)h->state.step_max;
    return DT_OK;
}

int dt_ps_client_fetch_state(dt_ps_client *c, const dt_opt_config *opt, float *const *params,
                             float *const *state, int64_t *steps, int64_t *steps_max, dt_error *err) {
    fetch_ctx f = {.opt = opt, .params = params, .state = state, .steps_max = steps_max};
    int rc = ask_every_ps(c, DT_MSG_FETCH, DT_MSG_STATE, "FETCH", on_state, &f, err);
    if (!rc && steps)
        for (int i = 0; i < c->n_ps; i++) steps[i] = c->ps[i].st.global_step;
    return rc;
}

int dt_ps_client_shutdown(dt_ps_client *c, dt_error *err) {
    if (c->role != DT_ROLE_CHIEF) return dt_errorf(err, DT_EINVAL, "only the chief shuts the ps tasks down");
    return ask_every_ps(c, DT_MSG_SHUTDOWN, DT_MSG_ACK, "SHUTDOWN", NULL, NULL, err);
}

int dt_ps_client_done(dt_ps_client *c, int waiting, dt_error *err) {
    return ask_every_ps_flagged(c, DT_MSG_DONE, waiting ? DT_WIRE_F_WAITING : 0, DT_MSG_ACK, "DONE", NULL, NULL, err);
}

/* The first ps the chief's end of a job still waits for (-1: none): a member of ps 0's work plan
 * still training (a joiner that left must not stand in for one), or too few DONE. */
static int end_behind(const dt_ps_client *c, int n_workers) {
    for (int i = 0; i < c->n_ps; i++)
        if (c->ps[i].st.workers_busy > 0 || c->ps[i].st.workers_done < (uint64_t)(n_workers > 0 ? n_workers : 0))
            return i;
    return -1;
}

int dt_ps_client_wait_done(dt_ps_client *c, int n_workers, int timeout_ms, dt_error *err) {
    int64_t deadline = dt_clock_us() + (timeout_ms > 0 ? timeout_ms : 0) * 1000LL;
    for (;;) { /* asked even when n_workers <= 0: joiners of a work plan may be training */
        int rc = dt_ps_client_status(c, NULL, err), behind;
        if (rc) return rc;
        if ((behind = end_behind(c, n_workers)) < 0) return DT_OK;
        int stopped = stopping(c);
        int64_t until = stopped && stop_deadline(c) < deadline ? stop_deadline(c) : deadline;
        int64_t left = (until - dt_clock_us()) / 1000;
        if (left <= 0) {
            const dt_ps_shard_status *st = &c->ps[behind].st;
            char msg[240];
            snprintf(msg, sizeof msg, "only %llu of %d worker(s) finished, %lld still training on the work plan, within "
                     "%d ms%s (still training, or gone?)", (unsigned long long)st->workers_done, n_workers,
                     (long long)st->workers_busy, stopped ? STOP_GRACE_MS : timeout_ms,
                     stopped ? " of this process being stopped by a signal" : "");
            return fail_ps(c, behind, err, DT_ETIMEOUT, "", msg);
        }
        zmq_poll(NULL, 0, left < READY_POLL_MS ? (long)left : READY_POLL_MS); /* a bounded sleep */
    }
}

/* ---- one request to one ps (the WORK messages to ps 0, worker/work_client.h) ---- */

static int on_one(dt_ps_client *c, int i, dt_wire_in *in, void *user, dt_error *err) {
    (void)i, (void)user;
    size_t len = zmq_msg_size(&in->payload); /* bounded by the socket's frame limit and dt_wire_check_payload */
    if (len > c->one_cap) {
        uint8_t *b = realloc(c->one_buf, len);
        if (!b) return dt_errorf(err, DT_ENOMEM, "ps client: out of memory for a %zu-byte reply", len);
        c->one_buf = b, c->one_cap = len;
    }
    if (len) memcpy(c->one_buf, zmq_msg_data(&in->payload), len);
    c->one_reply = in->hdr;
    c->one_len = len;
    return DT_OK;
}

int dt_ps_client_ask_one(dt_ps_client *c, int ps, dt_wire_header *h, const void *payload, size_t len, uint8_t want,
                         const char *what, dt_error *err) {
    if (ps < 0 || ps >= c->n_ps) return dt_errorf(err, DT_EINVAL, "ps client: %s to ps %d of %d", what, ps, c->n_ps);
    call_t call = {.what = what, .fn = on_one, .repull = -1, .alone = 1, .to_ps = ps};
    int rc = call_begin(c, &call, want, err);
    if (rc) return rc;
    zmq_msg_t m;
    if (len && zmq_msg_init_size(&m, len) != 0)
        rc = dt_errorf(err, DT_ENOMEM, "zmq_msg_init_size(%zu): %s", len, zmq_strerror(errno));
    else if (len)
        memcpy(zmq_msg_data(&m), payload, len);
    h->payload_bytes = len;
    if (!rc) rc = send_req(c, ps, 0, h, len ? &m : NULL, request_deadline(c), err);
    if (rc) return call_end(c, rc, NULL, NULL, err);
    c->one_len = 0;
    return DT_OK;
}

int dt_ps_client_ask_one_end(dt_ps_client *c, dt_wire_header *reply, const void **payload, size_t *len,
                             dt_error *err) {
    if (dt_ex_get_state(c->ex) == DT_EX_IDLE || !c->call.alone)
        return dt_errorf(err, DT_EINVAL, "ps client: no request to one ps under way");
    int rc = gather(c, err);
    rc = call_end(c, rc, NULL, NULL, err);
    if (rc) return rc;
    if (reply) *reply = c->one_reply;
    if (payload) *payload = c->one_len ? c->one_buf : NULL;
    if (len) *len = c->one_len;
    return DT_OK;
}

int dt_ps_client_asking_one(const dt_ps_client *c) {
    return dt_ex_get_state(c->ex) != DT_EX_IDLE && c->call.alone;
}
