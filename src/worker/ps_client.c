#include "worker/ps_client.h"

#include <errno.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/finite.h"
#include "metrics/metrics.h"
#include "metrics/names.h"
#include "transport/auth.h"
#include "transport/zmq_io.h"
#include "worker/codec.h"

/* Outstanding requests per ps within one call: a push and a pull of every chunk. */
#define MAX_AWAIT (2 * (int)DT_WIRE_MAX_CHUNKS + 2)
#define HELLO_RESEND_MS 1000  /* a HELLO lost with a dropped connection is sent again */
#define READY_POLL_MS 100
#define STOP_GRACE_MS 2000    /* what a request may still wait once this process is stopped (stop_deadline) */
#define RELEASE_MS 2000       /* how long libzmq may take to drop the frames of a closed socket */
#define LATE_WAKE_MS 250      /* a poll that returns this much later than asked: the process was stopped */
#define SCAN_BLOCK 8192     /* floats unpacked then checked for NaN/infinity while in cache (32 KiB) */

typedef struct {
    uint32_t id;              /* request id awaited */
    uint8_t req, want;        /* request type sent, reply type expected */
    int64_t sent_ms;          /* when (dt_clock_ms) */
} await_t;

typedef struct {
    void *sock;
    char *endpoint;
    size_t n;                 /* shard floats */
    dt_ps_shard_status st;
    await_t await[MAX_AWAIT];
    int n_await;
    int chunks;               /* how the ps cuts its shard: 1 until a reply says otherwise */
    int cut_known;            /* a reply of the initialised ps said so */
    float *recv;              /* [n] the shard as pulled, chunk by chunk (dt_ps_client_pull_views) */
    atomic_int inflight;      /* zero-copy gradient frames to this ps that libzmq still references */
    atomic_int wake_fd;       /* written when libzmq lets one go (dt_ps_client_set_wake_fd); -1: none */
    int64_t quiet_since;      /* since when this ps may have heard nothing from us (dt_ps_client_silent_ms) */
    int64_t gap_ms, gap_end;  /* the longest such silence that has ended, and when: until the ps answers a
                               * request sent after it, it may have declared us lost meanwhile */
} ps_conn;

/* This ps may have heard from us from `from` until `to` (a send or an answer: one moment; a wait
 * for its reply while running: the whole wait). A silence that ends at `from` is remembered: the
 * next request resets quiet_since, but a ps that timed us out during the silence is not brought
 * back by it (it may be gone, the send merely queued). */
static void heard(ps_conn *p, int64_t from, int64_t to) {
    if (to <= p->quiet_since) return;
    if (p->quiet_since && from - p->quiet_since > p->gap_ms) p->gap_ms = from - p->quiet_since, p->gap_end = from;
    p->quiet_since = to;
}

/* Where the replies of a push and/or pull go: each chunk of PARAMS into dst[i] at its offset. */
typedef struct {
    dt_push_result res;
    float *const *dst;        /* [n_ps] */
    int64_t min_step;
    int64_t *chunk_step;      /* [n_ps * DT_WIRE_MAX_CHUNKS] the step each chunk came back at */
    uint8_t *stale;           /* [n_ps] a chunk of this ps's push arrived stale */
    double t0;                /* when it began (dt_seconds), for the latency metrics; 0: metrics off */
} xfer_ctx;

static int64_t *chunk_step(xfer_ctx *x, int i, int k) { return &x->chunk_step[(size_t)i * DT_WIRE_MAX_CHUNKS + k]; }

struct dt_ps_client {
    void *ctx;
    int n_ps;
    ps_conn *ps;
    dt_wire_role role;
    uint16_t task;
    int connect_timeout_ms, request_timeout_ms;
    int curve;                /* --auth=curve (for the connect error's hint) */
    dt_auth auth;             /* the client's keys (a copy): a replaced socket is set up as at open */
    char unusable[256];       /* why this client refuses every request ("" while it works) */
    int buffers_held;         /* libzmq kept gradient frames after a failed call (see the header) */
    uint32_t next_id;
    int aggregate, total, staleness; /* sync replicas; aggregate 0: asynchronous */
    int n_workers;            /* told to every ps in INIT; 0: not told */
    uint64_t chunk_bytes;     /* the cut INIT asks for: chunks of about this size (0: one chunk) */
    int liveness_ms, strict;
    int last_refusal;         /* DT_WIRE_E_* of the latest ERROR reply (dt_ps_client_last_refusal) */
    uint8_t encoding;         /* --compression: of gradients up and parameters down */
    dt_codec *codec;          /* 16-bit gradients with error feedback; NULL: float32 */
    void (*name_float)(void *user, int ps, size_t index, char *out, size_t cap);
    void *name_user;
    FILE *log;                /* NULL: quiet */
    int sndbuf;               /* SO_SNDBUF of each connection; 0: the kernel's */
    const volatile int *stop; /* set by a signal handler: waits end (DT_EINTR); NULL: none */
    int64_t stopped_at;       /* when a wait first saw *stop set (dt_clock_ms); 0: not yet */
    dt_ps_client_stats stats;
    /* Metrics (NULL series when off): latency of each kind of exchange, bytes, stale gradients. */
    dt_metric *m_push, *m_pull, *m_push_pull, *m_wait, *m_tx, *m_rx, *m_stale;
    /* The streaming exchange under way (dt_ps_client_stream_begin .. _end). */
    int streaming;
    xfer_ctx sx;
    int64_t s_local_step, s_deadline;
    int64_t *s_chunk_step;    /* [n_ps * DT_WIRE_MAX_CHUNKS] */
    uint8_t *s_stale;         /* [n_ps] */
    float **s_dst;            /* [n_ps] the receive buffers */
};

/* What a gather call does with each expected reply. */
typedef int (*reply_fn)(dt_ps_client *c, int ps, dt_wire_in *in, void *user, dt_error *err);

static int fail_ps(dt_ps_client *c, int ps, dt_error *err, int code, const char *what, const char *msg) {
    return dt_errorf(err, code, "ps %d at %s: %s%s%s", ps, c->ps[ps].endpoint, what, *what ? ": " : "", msg);
}

static void set_send_timeout(ps_conn *p, int64_t deadline) {
    int64_t left = deadline - dt_clock_ms();
    int ms = left <= 0 ? 0 : left > INT32_MAX ? INT32_MAX : (int)left;
    zmq_setsockopt(p->sock, ZMQ_SNDTIMEO, &ms, sizeof ms);
}

/* Sends one request to ps i and records that its reply (want) is awaited. h: type and the
 * type-specific fields; routing fields are filled here. payload is consumed. */
static int send_req(dt_ps_client *c, int i, dt_wire_header *h, uint8_t want, zmq_msg_t *payload,
                    int64_t deadline, dt_error *err) {
    ps_conn *p = &c->ps[i];
    if (c->unusable[0]) {
        if (payload) zmq_msg_close(payload);
        return dt_errorf(err, DT_EIO, "ps client: %s", c->unusable);
    }
    if (p->n_await >= MAX_AWAIT) {
        if (payload) zmq_msg_close(payload);
        return dt_errorf(err, DT_EINVAL, "ps %d: too many outstanding requests", i);
    }
    if (++c->next_id == 0) c->next_id = 1; /* 0 means "no id" in refusals */
    h->role = (uint8_t)c->role;
    h->task = c->task;
    h->request_id = c->next_id;
    h->shard = (uint32_t)i;
    set_send_timeout(p, deadline);
    dt_metric_add(c->m_tx, (double)(DT_WIRE_HEADER_SIZE + (payload ? zmq_msg_size(payload) : 0)));
    dt_error e = {0};
    int rc = dt_wire_send(p->sock, NULL, h, payload, 0, &e);
    if (rc) return fail_ps(c, i, err, rc, "", rc == DT_ETIMEOUT ? "send timed out (too many requests queued)" : e.msg);
    int64_t now = dt_clock_ms();
    heard(p, now, now);
    p->await[p->n_await++] = (await_t){.id = h->request_id, .req = h->type, .want = want, .sent_ms = now};
    return DT_OK;
}

static int take_await(ps_conn *p, uint32_t id, await_t *a) {
    for (int k = 0; k < p->n_await; k++) {
        if (p->await[k].id != id) continue;
        *a = p->await[k];
        p->await[k] = p->await[--p->n_await];
        return 1;
    }
    return 0;
}

static void clear_awaits(dt_ps_client *c) {
    for (int i = 0; i < c->n_ps; i++) c->ps[i].n_await = 0;
}

static void note_status(ps_conn *p, const dt_wire_header *h) {
    if (h->type != DT_MSG_PARAMS && h->type != DT_MSG_PUSH_ACK) p->st.global_step = h->global_step; /* a chunk's own */
    p->st.initialised = h->generation != 0;
    p->st.generation = h->generation;
    if (h->chunks) p->chunks = h->chunks;
    if (h->chunks && h->generation) p->cut_known = 1;
}

/* Handles one received message from ps i: 1 if it answered an awaited request, 0 if it was a
 * stale reply (an earlier request that timed out), < 0 on error. */
static int on_message(dt_ps_client *c, int i, dt_wire_in *in, reply_fn fn, void *user, dt_error *err) {
    ps_conn *p = &c->ps[i];
    await_t a;
    dt_metric_add(c->m_rx, (double)(DT_WIRE_HEADER_SIZE + zmq_msg_size(&in->payload)));
    if (!take_await(p, in->hdr.request_id, &a)) return 0;
    /* The ps heard from us when it answered (a PULL it held: that much after we sent it), however
     * late we read the reply (this process may have been stopped meanwhile). */
    int64_t now = dt_clock_ms(), held_ms = in->hdr.type == DT_MSG_PARAMS ? (int64_t)(in->hdr.params.waited_us / 1000) : 0;
    int64_t answered = held_ms < now - a.sent_ms ? a.sent_ms + held_ms : now;
    heard(p, answered, answered);
    const uint8_t want = a.want;
    const char *tn = dt_wire_type_name(a.req);
    if (in->hdr.type == DT_MSG_ERROR) {
        c->last_refusal = in->hdr.status;
        note_status(p, &in->hdr); /* a refusal for another cut teaches the cut */
        char text[DT_WIRE_MAX_ERROR_TEXT + 1], what[32];
        dt_wire_error_text(text, sizeof text, zmq_msg_data(&in->payload), zmq_msg_size(&in->payload));
        snprintf(what, sizeof what, "%s refused", tn);
        return fail_ps(c, i, err, DT_EPROTO, what, text);
    }
    if (in->hdr.type != want || in->hdr.shard != (uint32_t)i || in->hdr.role != DT_ROLE_PS) {
        char msg[160];
        snprintf(msg, sizeof msg, "got %s from %s %u for shard %u, expected %s from ps %d",
                 dt_wire_type_name(in->hdr.type), dt_wire_role_name(in->hdr.role), in->hdr.task,
                 in->hdr.shard, tn, i);
        return fail_ps(c, i, err, DT_EPROTO, "unexpected reply", msg);
    }
    dt_error e = {0};
    if (dt_wire_check_payload(&in->hdr, p->n, &e)) return fail_ps(c, i, err, DT_EPROTO, tn, e.msg);
    if (a.sent_ms >= p->gap_end) p->gap_ms = 0; /* it answered after our last silence: it kept us */
    note_status(p, &in->hdr);
    int rc = fn ? fn(c, i, in, user, err) : DT_OK;
    return rc ? rc : 1;
}

/* Once this process is told to stop (a signal sets *stop), what it still asks (DONE, SHUTDOWN, the
 * step in flight) waits at most STOP_GRACE_MS more: its ps tasks are most likely stopping too, and
 * a stop must not wait out --heartbeat_timeout for them. *stopped: 1 when that applies. */
static int stopping(const dt_ps_client *c) { return c->stop && *c->stop; }

static int64_t stop_deadline(dt_ps_client *c, int64_t deadline, int *stopped) {
    if (!stopping(c)) return deadline;
    if (!c->stopped_at) c->stopped_at = dt_clock_ms();
    *stopped = 1;
    return c->stopped_at + STOP_GRACE_MS < deadline ? c->stopped_at + STOP_GRACE_MS : deadline;
}

/* One wait of at most max_ms for the awaited replies (each handed to fn) and, fd >= 0, for fd to
 * become readable: 1 when no reply is awaited any more, 0 while some still are, < 0 on error (the
 * deadline passed with replies missing, a bad reply). */
static int gather_round(dt_ps_client *c, int64_t deadline, long max_ms, int fd, const char *what, reply_fn fn,
                        void *user, dt_error *err) {
    zmq_pollitem_t items[c->n_ps + 1];
    int idx[c->n_ps];
    int n = 0;
    for (int i = 0; i < c->n_ps; i++)
        if (c->ps[i].n_await) {
            items[n] = (zmq_pollitem_t){.socket = c->ps[i].sock, .events = ZMQ_POLLIN};
            idx[n++] = i;
        }
    if (n == 0 && fd < 0) return 1;
    int stopped = 0;
    deadline = stop_deadline(c, deadline, &stopped);
    int64_t left = deadline - dt_clock_ms();
    if (n && left <= 0) {
        char msg[256];
        /* A sync PULL is the barrier: it waits for the other workers, not only for the ps. */
        snprintf(msg, sizeof msg, "no reply within %d ms (%s): %s", stopped ? STOP_GRACE_MS : c->request_timeout_ms,
                 stopped ? "of this process being stopped by a signal" : "--heartbeat_timeout",
                 c->aggregate && strstr(what, "PULL")
                     ? "the ps is down, or the sync barrier waits for workers that are gone (the step "
                       "needs --replicas_to_aggregate gradients; backup workers let it lose some)"
                     : "the ps is down or overloaded");
        int rc = fail_ps(c, idx[0], err, DT_ETIMEOUT, what, msg);
        clear_awaits(c);
        return rc;
    }
    long wait_ms = n && left < max_ms ? (long)left : max_ms;
    int m = n;
    if (fd >= 0) items[m++] = (zmq_pollitem_t){.socket = NULL, .fd = fd, .events = ZMQ_POLLIN};
    int64_t before = dt_clock_ms();
    int r = zmq_poll(items, m, wait_ms);
    int64_t after = dt_clock_ms();
    /* Waiting for a reply, this worker counts as alive to the ps (a sync ps holding its PULL
     * does not count it silent), unless the process was not running: a wake far later than
     * asked means it was stopped (SIGSTOP, a paused machine), and its silence runs on. */
    if (after - before <= wait_ms + LATE_WAKE_MS)
        for (int k = 0; k < n; k++) heard(&c->ps[idx[k]], before, after);
    if (r < 0) {
        clear_awaits(c);
        if (errno == EINTR) return dt_errorf(err, DT_EINTR, "%s interrupted by a signal", what);
        return dt_errorf(err, DT_ENET, "%s: zmq_poll: %s", what, zmq_strerror(errno));
    }
    for (int k = 0; k < n && r > 0; k++) {
        if (!(items[k].revents & ZMQ_POLLIN)) continue;
        int i = idx[k];
        while (c->ps[i].n_await) {
            dt_wire_in in;
            dt_error e = {0};
            int rc = dt_wire_recv(c->ps[i].sock, 0, &in, &e);
            if (rc == DT_ETIMEOUT) {
                dt_wire_in_close(&in);
                break;
            }
            if (rc == DT_OK) rc = on_message(c, i, &in, fn, user, err);
            else rc = fail_ps(c, i, err, rc, what, e.msg);
            dt_wire_in_close(&in);
            if (rc < 0) {
                clear_awaits(c);
                return rc;
            }
        }
    }
    for (int i = 0; i < c->n_ps; i++)
        if (c->ps[i].n_await) return 0;
    return 1;
}

/* Waits until every awaited reply has arrived (calling fn on each) or the deadline passes. */
static int gather(dt_ps_client *c, int64_t deadline, const char *what, reply_fn fn, void *user,
                  dt_error *err) {
    for (;;) {
        int rc = gather_round(c, deadline, 1000, -1, what, fn, user, err);
        if (rc < 0) return rc;
        if (rc) {
            c->last_refusal = 0;
            return DT_OK;
        }
    }
}

/* The same payload-less request to every ps, then every reply (each passed to fn, if any), within
 * one request timeout. */
static int ask_every_ps(dt_ps_client *c, dt_msg_type type, dt_msg_type reply, const char *what, reply_fn fn,
                        void *user, dt_error *err) {
    int64_t deadline = dt_clock_ms() + c->request_timeout_ms;
    for (int i = 0; i < c->n_ps; i++) {
        dt_wire_header h = dt_wire_header_make(type, 0, 0, 0);
        int rc = send_req(c, i, &h, reply, NULL, deadline, err);
        if (rc) {
            clear_awaits(c);
            return rc;
        }
    }
    return gather(c, deadline, what, fn, user, err);
}

/* libzmq's I/O thread calls this when it is done with a zero-copy gradient frame (hint: its ps). */
static void release_inflight(void *data, void *hint) {
    (void)data;
    ps_conn *p = hint;
    atomic_fetch_sub(&p->inflight, 1);
    int fd = atomic_load(&p->wake_fd);
    if (fd >= 0) {
        uint64_t one = 1;
        ssize_t w = write(fd, &one, sizeof one); /* an eventfd: never blocks for long */
        (void)w;
    }
}

/* Waits until libzmq has released every gradient frame (DT_OK) or the deadline passes (DT_ETIMEOUT). */
static int wait_released(dt_ps_client *c, int64_t deadline) {
    for (;;) {
        int held = 0;
        for (int i = 0; i < c->n_ps; i++) held += atomic_load(&c->ps[i].inflight);
        if (!held) return DT_OK;
        if (dt_clock_ms() > deadline) return DT_ETIMEOUT;
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
}

/* ps i's socket, set up and connected: at open, and again when one that held gradient frames is
 * replaced (release_gradients), so both get the same options. */
static int conn_socket(dt_ps_client *c, int i, dt_error *err) {
    ps_conn *p = &c->ps[i];
    dt_error e = {0};
    /* The largest reply is STATE (parameters and up to 2 optimizer slots). */
    void *s = dt_zsock_open(c->ctx, ZMQ_DEALER, dt_wire_max_frame(p->n), 0, c->request_timeout_ms, &e);
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

/* The header's contract: when a call that sent gradients returns, libzmq holds none of them.
 * After the replies they are almost always released already (a reply proves the ps read them).
 * A frame still held sits in the queue of a ps that is down or not reading, or is half written to
 * it, and libzmq would send it, or its rest, later from a buffer the caller has since reused: a
 * torn gradient. Closing that socket with linger 0 makes libzmq drop it (a ps discards a message
 * cut short), and a fresh socket takes its place. rc is the call's outcome so far, returned
 * unless the frames cannot be released. */
static int release_gradients(dt_ps_client *c, int rc, int64_t deadline, dt_error *err) {
    if (!rc && wait_released(c, deadline) == DT_OK) return DT_OK;
    for (int i = 0; i < c->n_ps; i++) {
        ps_conn *p = &c->ps[i];
        if (!atomic_load(&p->inflight) || !p->sock) continue;
        zmq_close(p->sock); /* linger 0 (conn_socket): libzmq drops what it still queues */
        p->sock = NULL;
        p->n_await = 0;
        dt_error e = {0};
        if (conn_socket(c, i, &e) && !c->unusable[0])
            snprintf(c->unusable, sizeof c->unusable, "could not replace a socket: %.200s", e.msg);
    }
    if (wait_released(c, dt_clock_ms() + RELEASE_MS) != DT_OK) {
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

int dt_ps_client_n_ps(const dt_ps_client *c) { return c->n_ps; }

int dt_ps_client_last_refusal(const dt_ps_client *c) { return c->last_refusal; }

int dt_ps_client_buffers_held(const dt_ps_client *c) { return c->buffers_held; }

int64_t dt_ps_client_silent_ms(const dt_ps_client *c) {
    int64_t now = dt_clock_ms(), longest = 0;
    for (int i = 0; i < c->n_ps; i++) {
        int64_t q = now - c->ps[i].quiet_since;
        if (q > longest) longest = q;
        if (c->ps[i].gap_ms > longest) longest = c->ps[i].gap_ms;
    }
    return longest;
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
    free(c->s_chunk_step), free(c->s_stale), free(c->s_dst);
    free(c->ps);
    free(c);
}

static int on_welcome(dt_ps_client *c, int i, dt_wire_in *in, void *user, dt_error *err) {
    if (in->hdr.shard_floats == c->ps[i].n) return DT_OK;
    char msg[160];
    snprintf(msg, sizeof msg, "holds %llu floats, this worker expects %zu (same model and --ps_hosts everywhere?)",
             (unsigned long long)in->hdr.shard_floats, c->ps[i].n);
    return fail_ps(c, i, err, DT_EPROTO, "", msg);
}

/* HELLO to every ps. A DEALER queues messages until its connection is up (ZeroMQ reconnects with
 * backoff), so one HELLO per ps would do; it is resent every HELLO_RESEND_MS in case a connection
 * dropped with it, and replies to the duplicates are discarded by request id. */
static int hello_all(dt_ps_client *c, dt_error *err) {
    int64_t start = dt_clock_ms(), deadline = start + c->connect_timeout_ms;
    int n = c->n_ps;
    int64_t sent_at[n];
    int welcomed[n], told[n], left = n;
    for (int i = 0; i < n; i++) sent_at[i] = -1, welcomed[i] = 0, told[i] = 0;
    zmq_pollitem_t items[n];
    while (left > 0) {
        if (stopping(c)) {
            clear_awaits(c);
            return dt_errorf(err, DT_EINTR, "connecting to the ps tasks interrupted by a signal");
        }
        int64_t now = dt_clock_ms();
        /* A ps silent for a second is most likely not up yet: say once whom this worker waits for,
         * and how long it will, rather than nothing until the deadline. */
        for (int i = 0; i < n && c->log && now - start >= HELLO_RESEND_MS; i++) {
            if (welcomed[i] || told[i]) continue;
            fprintf(c->log, "worker %u: waiting for ps %d at %s (not up yet?); retrying for up to %g s "
                    "(--connect_timeout)\n", c->task, i, c->ps[i].endpoint, c->connect_timeout_ms / 1000.0);
            fflush(c->log);
            told[i] = 1;
        }
        for (int i = 0; i < n && now >= deadline; i++) {
            if (welcomed[i]) continue;
            char msg[320];
            snprintf(msg, sizeof msg, "no answer to HELLO within %d ms (is the ps running, and do all processes "
                     "use the same --ps_hosts and --auth?%s)", c->connect_timeout_ms,
                     c->curve ? " With --auth=curve a ps refuses a client whose key is not in its authorized "
                                "folder, or that has another server.key; the ps logs the refusal" : "");
            clear_awaits(c);
            return fail_ps(c, i, err, DT_ETIMEOUT, "", msg);
        }
        for (int i = 0; i < n; i++) {
            ps_conn *p = &c->ps[i];
            items[i] = (zmq_pollitem_t){.socket = p->sock, .events = welcomed[i] ? 0 : ZMQ_POLLIN};
            if (welcomed[i] || (sent_at[i] >= 0 && now - sent_at[i] < HELLO_RESEND_MS)) continue;
            dt_wire_header h = dt_wire_header_make(DT_MSG_HELLO, c->role, c->task, 0);
            h.shard_floats = p->n;
            if (p->n_await == MAX_AWAIT) p->n_await = 0; /* forget the oldest HELLOs */
            int rc = send_req(c, i, &h, DT_MSG_WELCOME, NULL, deadline, err);
            /* A ps that refuses the handshake (--auth) leaves no connection to queue on, so the
             * resend blocks until the deadline: reported as no answer, like a ps that is down. */
            if (rc == DT_ETIMEOUT) break;
            if (rc) {
                clear_awaits(c);
                return rc;
            }
            sent_at[i] = now;
        }
        int64_t wait = deadline - now;
        if (wait > 50) wait = 50; /* re-evaluate resends and the deadline */
        if (zmq_poll(items, n, (long)wait) < 0) {
            clear_awaits(c);
            if (errno == EINTR) return dt_errorf(err, DT_EINTR, "connecting to the ps tasks interrupted by a signal");
            return dt_errorf(err, DT_ENET, "zmq_poll: %s", zmq_strerror(errno));
        }
        for (int i = 0; i < n; i++) {
            ps_conn *p = &c->ps[i];
            if (!(items[i].revents & ZMQ_POLLIN)) continue;
            for (;;) {
                dt_wire_in in;
                dt_error e = {0};
                int rc = dt_wire_recv(p->sock, 0, &in, &e);
                if (rc == DT_ETIMEOUT) {
                    dt_wire_in_close(&in);
                    break;
                }
                if (rc == DT_OK) rc = on_message(c, i, &in, on_welcome, NULL, err);
                else rc = fail_ps(c, i, err, rc, "HELLO", e.msg);
                dt_wire_in_close(&in);
                if (rc < 0) {
                    clear_awaits(c);
                    return rc;
                }
                if (rc == 1) {
                    welcomed[i] = 1;
                    left--;
                    p->n_await = 0; /* later replies to duplicate HELLOs are discarded as stale */
                    break;
                }
            }
        }
    }
    return DT_OK;
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

int dt_ps_client_open(dt_ps_client **out, const dt_ps_client_config *cfg, dt_error *err) {
    *out = NULL;
    if (cfg->n_ps <= 0 || !cfg->endpoints || !cfg->shard_floats)
        return dt_errorf(err, DT_EINVAL, "ps client: no ps tasks given");
    if (cfg->role != DT_ROLE_WORKER && cfg->role != DT_ROLE_CHIEF)
        return dt_errorf(err, DT_EINVAL, "ps client: role must be worker or chief");
    if (cfg->task < 0 || cfg->task > UINT16_MAX)
        return dt_errorf(err, DT_EINVAL, "ps client: task index %d out of range", cfg->task);
    dt_ps_client *c = dt_calloc(1, sizeof *c, "ps client", err);
    if (!c) return DT_ENOMEM;
    c->n_ps = cfg->n_ps;
    c->role = cfg->role;
    c->task = (uint16_t)cfg->task;
    c->connect_timeout_ms = cfg->connect_timeout_ms > 0 ? cfg->connect_timeout_ms : 10000;
    c->request_timeout_ms = cfg->request_timeout_ms > 0 ? cfg->request_timeout_ms : 60000;
    c->stop = cfg->stop;
    if (cfg->replicas_to_aggregate < 0 || cfg->total_num_replicas < 0 || cfg->staleness < 0 ||
        (cfg->replicas_to_aggregate > 0 &&
         (cfg->total_num_replicas < cfg->replicas_to_aggregate || cfg->total_num_replicas > (int)DT_WIRE_MAX_REPLICAS ||
          cfg->staleness > (int)DT_WIRE_MAX_STALENESS))) {
        free(c);
        return dt_errorf(err, DT_EINVAL, "ps client: sync configuration aggregate %d, total %d, staleness %d "
                         "(need 1 <= aggregate <= total <= %u, staleness <= %u)", cfg->replicas_to_aggregate,
                         cfg->total_num_replicas, cfg->staleness, DT_WIRE_MAX_REPLICAS, DT_WIRE_MAX_STALENESS);
    }
    if (cfg->replicas_to_aggregate > 0) {
        c->aggregate = cfg->replicas_to_aggregate;
        c->total = cfg->total_num_replicas;
        c->staleness = cfg->staleness;
        c->liveness_ms = cfg->liveness_ms > 0 ? cfg->liveness_ms : 0;
        c->strict = cfg->strict != 0;
    }
    c->n_workers = cfg->n_workers > 0 && cfg->n_workers <= (int)DT_WIRE_MAX_REPLICAS ? cfg->n_workers : 0;
    c->chunk_bytes = cfg->chunk_bytes < 0 ? DT_WIRE_CHUNK_BYTES_DEFAULT : (uint64_t)cfg->chunk_bytes;
    c->name_float = cfg->name_float;
    c->name_user = cfg->name_user;
    if ((unsigned)cfg->compression >= DT_ENC_COUNT) {
        free(c);
        return dt_errorf(err, DT_EINVAL, "ps client: compression %d is not an encoding", (int)cfg->compression);
    }
    c->encoding = (uint8_t)cfg->compression;
    c->curve = cfg->auth && cfg->auth->curve;
    client_metrics(c, cfg->metrics);
    if (c->curve) {
        c->auth = *cfg->auth;
        c->auth.n_allowed = 0; /* the server's list: not a client's */
        c->auth.allowed = NULL;
    }
    c->log = cfg->log;
    c->sndbuf = cfg->sndbuf_bytes > 0 ? cfg->sndbuf_bytes : 0;
    int rc = DT_OK;
    if (!(c->ps = dt_calloc((size_t)cfg->n_ps, sizeof *c->ps, "ps client connections", err))) {
        rc = DT_ENOMEM;
        goto fail;
    }
    if (!(c->ctx = zmq_ctx_new())) {
        rc = dt_errorf(err, DT_ENET, "zmq_ctx_new: %s", zmq_strerror(errno));
        goto fail;
    }
    for (int i = 0; i < c->n_ps; i++) {
        atomic_init(&c->ps[i].inflight, 0);
        c->ps[i].chunks = 1;
        atomic_init(&c->ps[i].wake_fd, -1);
    }
    for (int i = 0; i < c->n_ps; i++) {
        ps_conn *p = &c->ps[i];
        const char *ep = cfg->endpoints[i];
        size_t n = cfg->shard_floats[i];
        if (!ep || !*ep) {
            rc = dt_errorf(err, DT_EINVAL, "ps %d: empty endpoint", i);
            goto fail;
        }
        if (n == 0 || n > DT_WIRE_MAX_SHARD_FLOATS) {
            rc = dt_errorf(err, DT_EINVAL, "ps %d at %s: shard of %zu floats (must be 1..%llu)", i, ep, n,
                           (unsigned long long)DT_WIRE_MAX_SHARD_FLOATS);
            goto fail;
        }
        p->n = n;
        if (!(p->endpoint = dt_malloc(strlen(ep) + 1, "ps endpoint", err))) {
            rc = DT_ENOMEM;
            goto fail;
        }
        strcpy(p->endpoint, ep);
        if ((rc = conn_socket(c, i, err))) goto fail;
    }
    if (c->encoding != DT_ENC_FP32 && (rc = dt_codec_open(&c->codec, (dt_encoding)c->encoding, c->n_ps,
                                                          cfg->shard_floats, err)))
        goto fail;
    if ((rc = hello_all(c, err))) goto fail;
    *out = c;
    return DT_OK;
fail:
    dt_ps_client_close(c);
    return rc;
}

int dt_ps_client_init(dt_ps_client *c, const dt_opt_config *opt, const float *const *params,
                      const float *const *state, const uint8_t *const *decay, int64_t global_step, dt_error *err) {
    if (c->role != DT_ROLE_CHIEF) return dt_errorf(err, DT_EINVAL, "only the chief initialises the ps tasks");
    if (global_step < 0) return dt_errorf(err, DT_EINVAL, "initial global step %lld < 0", (long long)global_step);
    int slots = dt_opt_slots(opt);
    int64_t deadline = dt_clock_ms() + c->request_timeout_ms;
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
    for (int i = 0; i < c->n_ps; i++) {
        size_t n = c->ps[i].n, pbytes = n * sizeof(float), sbytes = (size_t)slots * pbytes;
        size_t total = (size_t)dt_wire_init_bytes((unsigned)slots, n);
        zmq_msg_t m;
        if (zmq_msg_init_size(&m, total) != 0) {
            clear_awaits(c);
            return dt_errorf(err, DT_ENOMEM, "out of memory for the INIT of ps %d (%zu bytes)", i, total);
        }
        uint8_t *d = zmq_msg_data(&m);
        memcpy(d, params[i], pbytes);
        if (state) memcpy(d + pbytes, state[i], sbytes);
        else memset(d + pbytes, 0, sbytes);
        /* The options block, then the decay mask as bits (docs/protocol.md, "INIT options"). */
        uint8_t *o = d + pbytes + sbytes, *bits = o + DT_WIRE_OPTS_BYTES;
        dt_wire_opts_encode(o, &opt->schedule, opt->weight_decay);
        memset(bits, 0, (n + 7) / 8);
        for (size_t k = 0; decay && k < n; k++)
            if (decay[i][k]) bits[k >> 3] |= (uint8_t)(1u << (k & 7));
        dt_wire_header h = dt_wire_header_make(DT_MSG_INIT, 0, 0, 0);
        h.global_step = global_step;
        h.shard_floats = n;
        h.opt_kind = (uint8_t)opt->kind;
        h.opt_slots = (uint8_t)slots;
        h.learning_rate = opt->learning_rate;
        h.momentum = opt->momentum;
        h.beta1 = opt->beta1;
        h.beta2 = opt->beta2;
        h.epsilon = opt->epsilon;
        h.init.replicas_to_aggregate = (uint64_t)c->aggregate;
        h.init.total_num_replicas = (uint64_t)(c->aggregate ? c->total : c->n_workers);
        h.init.staleness = (uint64_t)c->staleness;
        h.generation = (uint8_t)gen;
        unsigned k = dt_wire_chunks_for(n, c->chunk_bytes);
        h.chunks = (uint8_t)(k > n ? n : k);
        h.liveness_ms = c->liveness_ms;
        if (c->strict) h.flags = DT_WIRE_F_STRICT;
        int rc = send_req(c, i, &h, DT_MSG_ACK, &m, deadline, err);
        if (rc) {
            clear_awaits(c);
            return rc;
        }
    }
    return gather(c, deadline, "INIT", NULL, NULL, err);
}

static int on_status(dt_ps_client *c, int i, dt_wire_in *in, void *user, dt_error *err) {
    c->ps[i].st.pushes = in->hdr.status_reply.updates;
    c->ps[i].st.pulls = in->hdr.status_reply.params_replies;
    c->ps[i].st.workers_done = in->hdr.status_reply.workers_done;
    return DT_OK;
}

int dt_ps_client_status(dt_ps_client *c, dt_ps_shard_status *out, dt_error *err) {
    int rc = ask_every_ps(c, DT_MSG_STATUS, DT_MSG_STATUS_REPLY, "STATUS", on_status, NULL, err);
    if (!rc && out)
        for (int i = 0; i < c->n_ps; i++) out[i] = c->ps[i].st;
    return rc;
}

int dt_ps_client_wait_ready(dt_ps_client *c, int timeout_ms, dt_error *err) {
    int64_t deadline = dt_clock_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        if (stopping(c))
            return dt_errorf(err, DT_EINTR, "interrupted by a signal");
        int rc = dt_ps_client_status(c, NULL, err), waiting = -1;
        if (rc) return rc;
        for (int i = 0; i < c->n_ps && waiting < 0; i++)
            if (!c->ps[i].st.initialised) waiting = i;
        if (waiting < 0) return DT_OK;
        int64_t left = deadline - dt_clock_ms();
        if (left <= 0) {
            char msg[160];
            snprintf(msg, sizeof msg, "not initialised after %d ms: the chief (worker 0) has not sent the model (is it running?)",
                     timeout_ms);
            return fail_ps(c, waiting, err, DT_ETIMEOUT, "", msg);
        }
        zmq_poll(NULL, 0, left < READY_POLL_MS ? (long)left : READY_POLL_MS); /* a bounded sleep */
    }
}

/* PARAMS: the chunk goes into dst at its offset (checked: its step, finite values). PUSH_ACK and
 * a PARAMS answering a PUSH: the push's outcome is counted. */
static int on_xfer(dt_ps_client *c, int i, dt_wire_in *in, void *user, dt_error *err) {
    xfer_ctx *x = user;
    ps_conn *p = &c->ps[i];
    const dt_wire_header *h = &in->hdr;
    if (h->status == DT_WIRE_STALE) x->stale[i] = 1;
    else if (h->status != DT_WIRE_OK) return fail_ps(c, i, err, DT_EPROTO, "PUSH", dt_wire_status_name(h->status));
    if (c->codec) dt_codec_settle(c->codec, i, h->chunk, h->request_id, h->status == DT_WIRE_OK);
    if (h->type == DT_MSG_PUSH_ACK) {
        *chunk_step(x, i, h->chunk) = h->global_step;
        return DT_OK;
    }
    if (h->global_step < x->min_step) {
        char msg[160];
        snprintf(msg, sizeof msg, "answered a pull for step >= %lld with step %lld (chunk %u)", (long long)x->min_step,
                 (long long)h->global_step, h->chunk);
        return fail_ps(c, i, err, DT_EPROTO, "PULL", msg);
    }
    int64_t waited = h->params.waited_us > INT64_MAX ? INT64_MAX : (int64_t)h->params.waited_us;
    if (waited > x->res.wait_us) x->res.wait_us = waited;
    uint64_t off, len;
    dt_wire_chunk(p->n, h->chunks, h->chunk, &off, &len); /* the size was checked by on_message */
    float *dst = x->dst[i] + off;
    *chunk_step(x, i, h->chunk) = h->global_step;
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
    return DT_OK;
}

/* A PULL of chunk k of ps i: step is the minimum wanted, or with exact the very step (sync mode). */
static int send_pull(dt_ps_client *c, int i, int k, int64_t step, int exact, int64_t deadline, dt_error *err) {
    dt_wire_header h = dt_wire_header_make(DT_MSG_PULL, 0, 0, 0);
    h.global_step = step;
    h.chunk = (uint8_t)k;
    h.chunks = (uint8_t)c->ps[i].chunks;
    h.encoding = c->encoding;
    if (exact) h.flags = DT_WIRE_F_EXACT;
    return send_req(c, i, &h, DT_MSG_PARAMS, NULL, deadline, err);
}

/* A PUSH of chunk k of ps i, zero-copy from the caller's buffer (release_inflight tells when libzmq
 * is done with it); with pull, the ps answers with that chunk's PARAMS at min_step or later. */
static int send_push(dt_ps_client *c, int i, int k, const float *grad, int64_t local_step, int pull, int64_t min_step,
                     int64_t deadline, dt_error *err) {
    ps_conn *p = &c->ps[i];
    uint64_t off, len;
    dt_wire_chunk(p->n, (unsigned)p->chunks, (unsigned)k, &off, &len);
    const void *data = grad + off;
    size_t bytes = (size_t)len * sizeof(float);
    /* --compression: packed with error feedback into the codec's buffer, sent from there. */
    if (c->codec) data = dt_codec_encode(c->codec, i, (unsigned)p->chunks, (unsigned)k, grad, &bytes);
    zmq_msg_t m;
    atomic_fetch_add(&p->inflight, 1);
    if (zmq_msg_init_data(&m, (void *)data, bytes, release_inflight, p) != 0) {
        atomic_fetch_sub(&p->inflight, 1);
        return dt_errorf(err, DT_ENOMEM, "zmq_msg_init_data: %s", zmq_strerror(errno));
    }
    dt_wire_header h = dt_wire_header_make(DT_MSG_PUSH, 0, 0, 0);
    h.local_step = local_step;
    h.global_step = pull ? min_step : 0;
    h.chunk = (uint8_t)k;
    h.chunks = (uint8_t)p->chunks;
    h.flags = (uint8_t)((c->aggregate ? DT_WIRE_F_SYNC : 0) | (pull ? DT_WIRE_F_PULL : 0));
    h.encoding = c->encoding;
    int rc = send_req(c, i, &h, pull ? DT_MSG_PARAMS : DT_MSG_PUSH_ACK, &m, deadline, err);
    if (!rc && c->codec) dt_codec_sent(c->codec, i, (unsigned)k, h.request_id);
    return rc;
}

/* Every chunk of every ps goes out at once, chunk by chunk across the ps tasks, so every link is
 * busy from the start and each ps can apply and answer its first chunks while the later ones are
 * still on the wire (docs/protocol.md, "Chunks"). */
static int send_all(dt_ps_client *c, const float *const *grads, int64_t local_step, int pull, int64_t min_step,
                    int64_t deadline, dt_error *err) {
    int most = 0;
    for (int i = 0; i < c->n_ps; i++)
        if (c->ps[i].chunks > most) most = c->ps[i].chunks;
    for (int k = 0; k < most; k++)
        for (int i = 0; i < c->n_ps; i++) {
            if (k >= c->ps[i].chunks) continue;
            int rc = grads ? send_push(c, i, k, grads[i], local_step, pull, min_step, deadline, err)
                           : send_pull(c, i, k, min_step, 0, deadline, err);
            if (rc) return rc;
        }
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
static int same_step(dt_ps_client *c, int64_t deadline, xfer_ctx *x, int oldest, dt_error *err) {
    int64_t newest = oldest ? INT64_MAX : 0;
    for (int i = 0; i < c->n_ps; i++)
        for (int k = 0; k < c->ps[i].chunks; k++)
            if (oldest ? *chunk_step(x, i, k) < newest : *chunk_step(x, i, k) > newest) newest = *chunk_step(x, i, k);
    int behind = 0, shards = 0;
    for (int i = 0; i < c->n_ps; i++) {
        int any = 0;
        for (int k = 0; k < c->ps[i].chunks; k++) {
            if (*chunk_step(x, i, k) == newest) continue;
            int rc = send_pull(c, i, k, newest, 1, deadline, err);
            if (rc) {
                clear_awaits(c);
                return rc;
            }
            behind++, any = 1;
        }
        shards += any;
    }
    if (!behind) return DT_OK;
    x->res.repulled += shards;
    c->stats.repulls += (uint64_t)shards;
    int64_t min = x->min_step;
    x->min_step = newest;
    int rc = gather(c, deadline, "PULL (exact step)", on_xfer, x, err);
    x->min_step = min;
    if (rc) return rc;
    for (int i = 0; i < c->n_ps; i++)
        for (int k = 0; k < c->ps[i].chunks; k++)
            if (*chunk_step(x, i, k) != newest) {
                char msg[128];
                snprintf(msg, sizeof msg, "answered an exact pull of step %lld with step %lld (chunk %d)",
                         (long long)newest, (long long)*chunk_step(x, i, k), k);
                return fail_ps(c, i, err, DT_EPROTO, "PULL", msg);
            }
    return DT_OK;
}

/* After every reply of an exchange: each shard's step (what every one of its chunks reached), the
 * counts. */
static void xfer_done(dt_ps_client *c, xfer_ctx *x, int pushed, int pulled, int64_t *steps, dt_push_result *res) {
    for (int i = 0; i < c->n_ps; i++) {
        int64_t s = *chunk_step(x, i, 0);
        for (int k = 1; k < c->ps[i].chunks; k++)
            if (*chunk_step(x, i, k) < s) s = *chunk_step(x, i, k);
        c->ps[i].st.global_step = s;
        x->res.n_stale += x->stale[i];
        if (steps) steps[i] = s;
    }
    x->res.global_step = c->ps[0].st.global_step;
    if (pulled) {
        c->stats.pulls++;
        c->stats.wait_us += x->res.wait_us;
    }
    if (pushed) {
        c->stats.pushes++;
        c->stats.stale_pushes += x->res.n_stale > 0;
    }
    if (c->m_push || c->m_pull) {
        dt_metric_observe(pushed && pulled ? c->m_push_pull : pushed ? c->m_push : c->m_pull, dt_seconds() - x->t0);
        if (pulled) dt_metric_observe(c->m_wait, (double)x->res.wait_us * 1e-6);
        if (pushed && x->res.n_stale > 0) dt_metric_add(c->m_stale, 1);
    }
    if (res) *res = x->res;
}

/* One call for push, pull or both (a PUSH that asks for PARAMS): sends everything, then gathers
 * every reply; pulled chunks go into dst[i]. */
static int xfer_once(dt_ps_client *c, const float *const *grads, int64_t local_step, int64_t min_step,
                float *const *dst, int64_t *steps, dt_push_result *res, int oldest, dt_error *err) {
    if (c->unusable[0]) return dt_errorf(err, DT_EIO, "ps client: %s", c->unusable);
    if (grads && local_step < 0) return dt_errorf(err, DT_EINVAL, "push: local_step %lld < 0", (long long)local_step);
    if (min_step < 0) return dt_errorf(err, DT_EINVAL, "pull: min_step %lld < 0", (long long)min_step);
    int64_t deadline = dt_clock_ms() + c->request_timeout_ms;
    int64_t cs[(size_t)c->n_ps * DT_WIRE_MAX_CHUNKS];
    uint8_t stale[c->n_ps];
    memset(stale, 0, sizeof stale);
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) cs[k] = -1; /* a chunk not heard from */
    xfer_ctx x = {.dst = dst, .min_step = min_step, .chunk_step = cs, .stale = stale,
                  .t0 = c->m_push || c->m_pull ? dt_seconds() : 0};
    int rc = send_all(c, grads, local_step, dst != NULL, min_step, deadline, err);
    if (rc) clear_awaits(c);
    else rc = gather(c, deadline, grads && dst ? "PUSH+PULL" : grads ? "PUSH" : "PULL", on_xfer, &x, err);
    /* Whatever happened, the caller gets its gradient buffers back. */
    if (grads) rc = release_gradients(c, rc, deadline, err);
    if (rc) return rc;
    if (dst && c->aggregate && (rc = same_step(c, deadline, &x, oldest, err))) return rc;
    xfer_done(c, &x, grads != NULL, dst != NULL, steps, res);
    return DT_OK;
}

/* A client learns how a ps cuts its shard from the ps's replies. One that has not heard from an
 * initialised ps yet (it only said HELLO before the chief's INIT) asks every ps first: a push sent
 * with a wrong cut would be refused at that ps while another applied it, and could not simply be
 * sent again. */
static int xfer(dt_ps_client *c, const float *const *grads, int64_t local_step, int64_t min_step, float *const *dst,
                int64_t *steps, dt_push_result *res, int oldest, dt_error *err) {
    int known = 1;
    for (int i = 0; i < c->n_ps; i++) known &= c->ps[i].cut_known;
    int rc = known ? DT_OK : dt_ps_client_status(c, NULL, err);
    return rc ? rc : xfer_once(c, grads, local_step, min_step, dst, steps, res, oldest, err);
}

/* The receive buffers pull_views hands out. */
static int recv_buffers(dt_ps_client *c, float **dst, dt_error *err) {
    for (int i = 0; i < c->n_ps; i++) {
        if (!c->ps[i].recv && !(c->ps[i].recv = dt_alloc_floats(c->ps[i].n, "pulled shard", err))) return DT_ENOMEM;
        dst[i] = c->ps[i].recv;
    }
    return DT_OK;
}

int dt_ps_client_pull_views(dt_ps_client *c, int64_t min_step, const float **views, int64_t *steps,
                            dt_error *err) {
    return dt_ps_client_push_pull(c, NULL, 0, min_step, views, steps, NULL, err);
}

int dt_ps_client_pull_resume(dt_ps_client *c, const float **views, int64_t *steps, dt_error *err) {
    float *dst[c->n_ps];
    int rc = recv_buffers(c, dst, err);
    if (!rc) rc = xfer(c, NULL, 0, 0, dst, steps, NULL, 1, err);
    for (int i = 0; i < c->n_ps && !rc; i++) views[i] = dst[i];
    return rc;
}

int dt_ps_client_pull_all(dt_ps_client *c, float *const *params, int64_t min_step, int64_t *steps,
                          dt_error *err) {
    return xfer(c, NULL, 0, min_step, params, steps, NULL, 0, err);
}

int dt_ps_client_push_all(dt_ps_client *c, const float *const *grads, int64_t local_step,
                          dt_push_result *res, dt_error *err) {
    return xfer(c, grads, local_step, 0, NULL, NULL, res, 0, err);
}

int dt_ps_client_push_pull(dt_ps_client *c, const float *const *grads, int64_t local_step,
                           int64_t min_step, const float **views, int64_t *steps, dt_push_result *res,
                           dt_error *err) {
    float *dst[c->n_ps];
    int rc = recv_buffers(c, dst, err);
    if (!rc) rc = xfer(c, grads, local_step, min_step, dst, steps, res, 0, err);
    for (int i = 0; i < c->n_ps && !rc; i++) views[i] = dst[i];
    return rc;
}

/* ---- streaming: one exchange whose chunks are pushed one by one (worker/overlap.c) ---- */

int dt_ps_client_stream_begin(dt_ps_client *c, int64_t local_step, int64_t min_step, dt_error *err) {
    if (c->streaming) return dt_errorf(err, DT_EINVAL, "ps client: an exchange is already under way");
    if (c->unusable[0]) return dt_errorf(err, DT_EIO, "ps client: %s", c->unusable);
    if (local_step < 0 || min_step < 0)
        return dt_errorf(err, DT_EINVAL, "push: local_step %lld or min_step %lld < 0", (long long)local_step,
                         (long long)min_step);
    int known = 1;
    for (int i = 0; i < c->n_ps; i++) known &= c->ps[i].cut_known;
    int rc = known ? DT_OK : dt_ps_client_status(c, NULL, err);
    if (rc) return rc;
    size_t n = (size_t)c->n_ps * DT_WIRE_MAX_CHUNKS;
    if (!c->s_chunk_step && !(c->s_chunk_step = dt_calloc(n, sizeof *c->s_chunk_step, "chunk steps", err)))
        return DT_ENOMEM;
    if (!c->s_stale && !(c->s_stale = dt_calloc((size_t)c->n_ps, 1, "stale flags", err))) return DT_ENOMEM;
    if (!c->s_dst && !(c->s_dst = dt_calloc((size_t)c->n_ps, sizeof *c->s_dst, "receive buffers", err)))
        return DT_ENOMEM;
    if ((rc = recv_buffers(c, c->s_dst, err))) return rc;
    for (size_t k = 0; k < n; k++) c->s_chunk_step[k] = -1; /* a chunk not heard from */
    memset(c->s_stale, 0, (size_t)c->n_ps);
    c->sx = (xfer_ctx){.dst = c->s_dst, .min_step = min_step, .chunk_step = c->s_chunk_step, .stale = c->s_stale,
                       .t0 = c->m_push || c->m_pull ? dt_seconds() : 0};
    c->s_local_step = local_step;
    c->s_deadline = dt_clock_ms() + c->request_timeout_ms;
    c->streaming = 1;
    return DT_OK;
}

int dt_ps_client_chunks(const dt_ps_client *c, int ps) { return c->ps[ps].chunks; }


int dt_ps_client_inflight(const dt_ps_client *c, int ps) { return atomic_load(&c->ps[ps].inflight); }

void dt_ps_client_set_wake_fd(dt_ps_client *c, int fd) {
    for (int i = 0; i < c->n_ps; i++) atomic_store(&c->ps[i].wake_fd, fd);
}

int dt_ps_client_stream_push(dt_ps_client *c, int ps, int chunk, const float *grad, dt_error *err) {
    if (!c->streaming || ps < 0 || ps >= c->n_ps || chunk < 0 || chunk >= c->ps[ps].chunks)
        return dt_errorf(err, DT_EINVAL, "ps client: no exchange under way, or no chunk %d of ps %d", chunk, ps);
    /* The replies are due a request timeout after the latest request (not the first). */
    c->s_deadline = dt_clock_ms() + c->request_timeout_ms;
    return send_push(c, ps, chunk, grad, c->s_local_step, 1, c->sx.min_step, c->s_deadline, err);
}

typedef struct {
    dt_ps_chunk_fn fn;
    void *user;
} stream_ctx;

static int on_stream(dt_ps_client *c, int i, dt_wire_in *in, void *user, dt_error *err) {
    stream_ctx *s = user;
    int rc = on_xfer(c, i, in, &c->sx, err);
    if (!rc && in->hdr.type == DT_MSG_PARAMS) s->fn(s->user, i, in->hdr.chunk, c->s_dst[i]);
    return rc;
}

int dt_ps_client_stream_poll(dt_ps_client *c, int fd, int max_ms, dt_ps_chunk_fn fn, void *user, dt_error *err) {
    if (!c->streaming) return dt_errorf(err, DT_EINVAL, "ps client: no exchange under way");
    stream_ctx s = {fn, user};
    int rc = gather_round(c, c->s_deadline, max_ms, fd, "PUSH+PULL", on_stream, &s, err);
    return rc < 0 ? rc : DT_OK;
}

int dt_ps_client_stream_end(dt_ps_client *c, int rc, int64_t *steps, dt_push_result *res, dt_error *err) {
    if (!c->streaming) return rc ? rc : dt_errorf(err, DT_EINVAL, "ps client: no exchange under way");
    c->streaming = 0;
    if (rc) clear_awaits(c);
    for (int i = 0; i < c->n_ps && !rc; i++)
        if (c->ps[i].n_await) rc = dt_errorf(err, DT_EINVAL, "ps client: exchange ended with replies of ps %d due", i);
    rc = release_gradients(c, rc, c->s_deadline, err);
    if (rc) return rc;
    /* Sync mode: with every replica's gradient in each step every chunk comes back at one step. While
     * a ps waits for fewer (a worker lost), a chunk can come back a step ahead of another; the
     * caller has already computed on it as it came (it cannot be pulled again under a forward that
     * read it), the shard's step is its oldest chunk's, and the chunks ahead drop the next gradient
     * as stale, so the worker is back in step after one exchange. */
    c->last_refusal = 0;
    xfer_done(c, &c->sx, 1, 1, steps, res);
    return DT_OK;
}

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
    /* The slot count matches the kind (checked by decode) and the size the slots (by on_message). */
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

int dt_ps_client_done(dt_ps_client *c, dt_error *err) {
    return ask_every_ps(c, DT_MSG_DONE, DT_MSG_ACK, "DONE", NULL, NULL, err);
}

int dt_ps_client_wait_done(dt_ps_client *c, int n_workers, int timeout_ms, dt_error *err) {
    if (n_workers <= 0) return DT_OK;
    int64_t deadline = dt_clock_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        int rc = dt_ps_client_status(c, NULL, err), behind = -1;
        if (rc) return rc;
        for (int i = 0; i < c->n_ps && behind < 0; i++)
            if (c->ps[i].st.workers_done < (uint64_t)n_workers) behind = i;
        if (behind < 0) return DT_OK;
        int stopped = 0;
        int64_t left = stop_deadline(c, deadline, &stopped) - dt_clock_ms();
        if (left <= 0) {
            char msg[200];
            snprintf(msg, sizeof msg, "only %llu of %d worker(s) finished within %d ms%s (still training, or gone?)",
                     (unsigned long long)c->ps[behind].st.workers_done, n_workers, stopped ? STOP_GRACE_MS : timeout_ms,
                     stopped ? " of this process being stopped by a signal" : "");
            return fail_ps(c, behind, err, DT_ETIMEOUT, "", msg);
        }
        zmq_poll(NULL, 0, left < READY_POLL_MS ? (long)left : READY_POLL_MS); /* a bounded sleep */
    }
}
