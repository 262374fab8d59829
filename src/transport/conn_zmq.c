/* The transport seam (transport/conn.h) over libzmq: a ps's server is one ROUTER (its routes are
 * the ROUTER's routing identities, its connections watched by peers.c through a socket monitor),
 * a worker's connection one DEALER (libzmq reconnects it and queues what is sent meanwhile).
 * Sends with a release go zero-copy (zmq_msg_init_data): libzmq's I/O thread calls the release
 * when it has written the frame or dropped it. */
#include "transport/conn.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zmq.h>

#include "core/clock.h"
#include "core/error.h"
#include "transport/zmq_io.h"

/* What a dt_msg keeps of libzmq's: its frames. */
typedef struct {
    zmq_msg_t identity;       /* the route (ROUTER only) */
    zmq_msg_t payload;
    int has_identity;
} zmq_msg_impl;

_Static_assert(sizeof(zmq_msg_impl) <= sizeof(((dt_msg *)0)->impl), "dt_msg.impl too small for libzmq's frames");
_Static_assert(_Alignof(zmq_msg_impl) <= 16, "dt_msg.impl under-aligned for libzmq's frames");

static zmq_msg_impl *impl_of(dt_msg *m) { return (zmq_msg_impl *)(void *)m->impl; }

/* The received message's frames moved into m (a small frame's bytes live inside its zmq_msg_t, so
 * the payload pointer is taken after the move). */
static void msg_from(dt_msg *m, dt_wire_in *in) {
    zmq_msg_impl *z = impl_of(m);
    zmq_msg_init(&z->identity);
    zmq_msg_init(&z->payload);
    zmq_msg_move(&z->identity, &in->identity);
    zmq_msg_move(&z->payload, &in->payload);
    z->has_identity = in->has_identity;
    m->hdr = in->hdr;
    m->size = zmq_msg_size(&z->payload);
    static const char no_bytes[1];
    m->data = m->size ? zmq_msg_data(&z->payload) : no_bytes; /* as libzmq's own empty frames: not NULL */
    m->route = z->has_identity ? (dt_route *)&z->identity : NULL;
    m->peer = NULL;
    snprintf(m->addr, sizeof m->addr, "%s", in->peer);
    dt_wire_in_close(in);
}

static void release_msg(void *held) {
    zmq_msg_close(held);
    free(held);
}

dt_bytes *dt_msg_take(dt_msg *m, dt_bytes *out) {
    zmq_msg_impl *z = impl_of(m);
    if (!m->size) return NULL;
    zmq_msg_t *held = malloc(sizeof *held);
    if (!held) {
        *out = (dt_bytes){m->data, m->size, NULL, NULL};
        return out;
    }
    zmq_msg_init(held);
    zmq_msg_move(held, &z->payload);
    *out = (dt_bytes){zmq_msg_data(held), m->size, release_msg, held};
    m->data = NULL;
    m->size = 0;
    return out;
}

void dt_msg_close(dt_msg *m) {
    zmq_msg_impl *z = impl_of(m);
    zmq_msg_close(&z->identity);
    zmq_msg_close(&z->payload);
    zmq_msg_init(&z->identity);
    zmq_msg_init(&z->payload);
    z->has_identity = 0;
    m->data = NULL;
    m->size = 0;
    m->route = NULL;
}

/* A receive's outcome into m; m is valid (dt_msg_close) whatever it is. */
static int recv_into(void *sock, int with_identity, dt_msg *m, dt_error *err) {
    dt_wire_in in;
    int rc = dt_wire_recv(sock, with_identity, &in, err);
    msg_from(m, &in);
    return rc;
}

/* ---- payloads out ---- */

static void release_sent(void *data, void *hint) {
    (void)data;
    dt_bytes *b = hint;
    dt_bytes_release(b);
    free(b);
}

/* payload as a frame: zero-copy for bytes handed over, a copy of borrowed ones. DT_ENOMEM (the
 * payload released) or DT_OK; *none 1 for an empty payload (released: no frame). */
static int frame_of(zmq_msg_t *m, dt_bytes *payload, int *none) {
    *none = !payload || payload->size == 0;
    if (*none) {
        dt_bytes_release(payload);
        return DT_OK;
    }
    if (!payload->release) {
        if (zmq_msg_init_size(m, payload->size) != 0) return DT_ENOMEM;
        memcpy(zmq_msg_data(m), payload->data, payload->size);
        return DT_OK;
    }
    dt_bytes *h = malloc(sizeof *h);
    if (!h) {
        dt_bytes_release(payload);
        return DT_ENOMEM;
    }
    *h = *payload;
    *payload = (dt_bytes){0};
    if (zmq_msg_init_data(m, (void *)h->data, h->size, release_sent, h) != 0) {
        release_sent(NULL, h);
        return DT_ENOMEM;
    }
    return DT_OK;
}

/* ---- the server ---- */

struct dt_server {
    void *ctx, *sock;
    dt_zap *zap;              /* --auth=curve: the ZAP handler thread */
    dt_peers *peers;
};

/* What libzmq itself bounds per connection: replies queued (a ROUTER drops replies to a peer past
 * its mark instead of queueing them) and the handshake's duration. Not requests (ZMQ_RCVHWM 0) and
 * not silence: libzmq 4.3's heartbeat timer aborts the process when it fires on a connection that
 * reset while its queue was full, so peers.c watches silence in the kernel's counters instead.
 * Whole requests queued per connection have no limit for the same reason: a connection whose queue
 * is full stops being read, and in libzmq 4.3 a hang-up on it followed by a ZMTP PING already read
 * behind the queued requests aborts the process (stream_engine_base.cpp, !_io_error): any peer
 * could do it. peers.c bounds a flood instead (the heap beyond what is counted). */
static int limit_socket(void *s, int send_queue, int handshake_ms, dt_error *err) {
    int rcv = 0;
    if (zmq_setsockopt(s, ZMQ_SNDHWM, &send_queue, sizeof send_queue) != 0 ||
        zmq_setsockopt(s, ZMQ_RCVHWM, &rcv, sizeof rcv) != 0 ||
        zmq_setsockopt(s, ZMQ_HANDSHAKE_IVL, &handshake_ms, sizeof handshake_ms) != 0)
        return dt_errorf(err, DT_ENET, "zmq_setsockopt (connection bounds): %s", zmq_strerror(errno));
    return DT_OK;
}

static void zap_handshake_failed(void *user, const char *endpoint) { dt_auth_server_handshake_failed(user, endpoint); }

/* The context with cfg->io_threads I/O threads (libzmq spreads connections over them, so the
 * workers' transfers are copied on several cores at once), the router, bounded, its connections
 * watched (before it binds: the monitor must see every one), and authentication in place. */
int dt_server_open(dt_server **out, const dt_server_config *cfg, dt_error *err) {
    *out = NULL;
    dt_server *s = dt_calloc(1, sizeof *s, "transport server", err);
    if (!s) return DT_ENOMEM;
    int rc = DT_OK;
    if (!(s->ctx = zmq_ctx_new())) rc = dt_errorf(err, DT_ENET, "zmq_ctx_new: %s", zmq_strerror(errno));
    int io = cfg->io_threads < 1 ? 1 : cfg->io_threads;
    if (!rc && zmq_ctx_set(s->ctx, ZMQ_IO_THREADS, io) != 0)
        rc = dt_errorf(err, DT_ENET, "zmq_ctx_set(ZMQ_IO_THREADS=%d): %s", io, zmq_strerror(errno));
    if (!rc && !(s->sock = dt_zsock_open(s->ctx, ZMQ_ROUTER, cfg->max_frame, cfg->linger_ms, -1, err))) rc = DT_ENET;
    if (!rc) rc = limit_socket(s->sock, cfg->send_queue, cfg->handshake_ms, err);
    if (!rc)
        rc = dt_auth_server_start(&s->zap, s->ctx, s->sock, cfg->auth, cfg->peers.log,
                                  cfg->log_prefix ? cfg->log_prefix : "", err);
    dt_peers_config pc = cfg->peers;
    if (s->zap) pc.handshake_failed = zap_handshake_failed, pc.hook_user = s->zap;
    if (!rc) rc = dt_peers_open(&s->peers, s->ctx, s->sock, &pc, err);
    if (rc) {
        dt_server_close(s);
        return rc;
    }
    *out = s;
    return DT_OK;
}

int dt_server_bind(dt_server *s, const char *endpoint, char *bound, size_t n, dt_error *err) {
    if (dt_zsock_bind(s->sock, endpoint) != 0)
        return dt_errorf(err, DT_ENET, "cannot bind %s: %s", endpoint, zmq_strerror(errno));
    size_t len = n;
    if (bound && n && zmq_getsockopt(s->sock, ZMQ_LAST_ENDPOINT, bound, &len) != 0) snprintf(bound, n, "%s", endpoint);
    /* Owner only, whatever the umask: a peer that can connect to it runs as the ps's user, who
     * could as well stop the ps (docs/security.md). connect(2) needs write permission. */
    if (!strncmp(endpoint, "ipc://", 6) && chmod(endpoint + 6, 0600) != 0)
        return dt_errorf(err, DT_ENET, "cannot make %s owner-only: %s", endpoint + 6, strerror(errno));
    return DT_OK;
}

void dt_server_close(dt_server *s) {
    if (!s) return;
    dt_peers_close(s->peers); /* first: its monitor may report to the ZAP handler */
    dt_auth_server_stop(s->zap);
    if (s->sock) zmq_close(s->sock);
    /* Waits at most the socket's linger to flush the last replies; releases every reply payload
     * and every peer they reference. */
    if (s->ctx) zmq_ctx_term(s->ctx);
    free(s);
}

dt_peers *dt_server_peers(dt_server *s) { return s->peers; }

void dt_server_events(dt_server *s, void (*gone)(void *user, dt_peer *peer), void *user) {
    dt_peers_events(s->peers, gone, user);
}

int dt_server_wait(dt_server *s, long timeout_ms, void (*gone)(void *user, dt_peer *peer), void *user,
                   int *readable, dt_error *err) {
    *readable = 0;
    zmq_pollitem_t items[2] = {{.socket = s->sock, .events = ZMQ_POLLIN},
                               {.socket = dt_peers_socket(s->peers), .events = ZMQ_POLLIN}};
    if (zmq_poll(items, 2, timeout_ms) < 0) {
        if (errno == EINTR) return dt_errorf(err, DT_EINTR, "wait interrupted by a signal");
        return dt_errorf(err, DT_ENET, "zmq_poll: %s", zmq_strerror(errno));
    }
    if (items[1].revents & ZMQ_POLLIN) dt_peers_events(s->peers, gone, user);
    *readable = (items[0].revents & ZMQ_POLLIN) != 0;
    return DT_OK;
}

int dt_server_recv(dt_server *s, dt_msg *m, dt_error *err) {
    dt_wire_in in;
    int rc = dt_wire_recv(s->sock, 1, &in, err);
    int fd = in.srcfd;
    msg_from(m, &in);
    if (rc != DT_ETIMEOUT && rc != DT_EINTR && rc != DT_ENET) m->peer = dt_peers_of(s->peers, fd);
    return rc;
}

int dt_server_send(dt_server *s, dt_route *to, dt_wire_header *h, dt_bytes *payload, dt_error *err) {
    zmq_msg_t m;
    int none;
    if (frame_of(&m, payload, &none)) return dt_errorf(err, DT_ENOMEM, "out of memory for a %s reply", dt_wire_type_name(h->type));
    return dt_wire_send(s->sock, (zmq_msg_t *)to, h, none ? NULL : &m, ZMQ_DONTWAIT, err);
}

int dt_server_send_error(dt_server *s, dt_route *to, dt_wire_header h, int32_t status, const char *fmt, ...) {
    char text[DT_WIRE_MAX_ERROR_TEXT + 1];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return dt_wire_send_error(s->sock, (zmq_msg_t *)to, h, status, "%.*s", n < 0 ? 0 : n, text);
}

dt_route *dt_route_hold(const dt_route *r) {
    zmq_msg_t *id = malloc(sizeof *id);
    if (!id) return NULL;
    zmq_msg_init(id);
    zmq_msg_copy(id, (zmq_msg_t *)r);
    return (dt_route *)id;
}

void dt_route_drop(dt_route *r) {
    if (!r) return;
    zmq_msg_close((zmq_msg_t *)r);
    free(r);
}

/* ---- a worker's connections ---- */

struct dt_transport {
    void *ctx;
};

struct dt_conn {
    void *sock;
};

int dt_transport_open(dt_transport **out, dt_error *err) {
    *out = NULL;
    dt_transport *t = dt_calloc(1, sizeof *t, "transport", err);
    if (!t) return DT_ENOMEM;
    if (!(t->ctx = zmq_ctx_new())) {
        free(t);
        return dt_errorf(err, DT_ENET, "zmq_ctx_new: %s", zmq_strerror(errno));
    }
    *out = t;
    return DT_OK;
}

void dt_transport_close(dt_transport *t) {
    if (!t) return;
    zmq_ctx_term(t->ctx); /* every zero-copy frame still queued is released (linger is 0) */
    free(t);
}

int dt_conn_open(dt_conn **out, dt_transport *t, const char *endpoint, const dt_conn_config *cfg, dt_error *err) {
    *out = NULL;
    dt_conn *c = dt_calloc(1, sizeof *c, "connection", err);
    if (!c) return DT_ENOMEM;
    void *s = dt_zsock_open(t->ctx, ZMQ_DEALER, cfg->max_frame, 0, cfg->send_timeout_ms, err);
    int rc = s ? DT_OK : DT_ENET;
    if (!rc && cfg->heartbeat_ms > 0) rc = dt_zsock_heartbeat(s, cfg->heartbeat_ms, err);
    if (!rc && cfg->sndbuf > 0 && zmq_setsockopt(s, ZMQ_SNDBUF, &cfg->sndbuf, sizeof cfg->sndbuf) != 0)
        rc = dt_errorf(err, DT_ENET, "zmq_setsockopt(ZMQ_SNDBUF): %s", zmq_strerror(errno));
    if (!rc) rc = dt_auth_client_socket(s, cfg->auth, err);
    if (!rc && dt_zsock_connect(s, endpoint) != 0)
        rc = dt_errorf(err, DT_EINVAL, "cannot connect to '%s': %s", endpoint, zmq_strerror(errno));
    if (rc) {
        if (s) zmq_close(s);
        free(c);
        return rc;
    }
    c->sock = s;
    *out = c;
    return DT_OK;
}

void dt_conn_close(dt_conn *c) {
    if (!c) return;
    zmq_close(c->sock);
    free(c);
}

int dt_conn_send(dt_conn *c, dt_wire_header *h, dt_bytes *payload, int64_t deadline_us, dt_error *err) {
    int64_t left = (deadline_us - dt_clock_us()) / 1000;
    int ms = left <= 0 ? 0 : left > INT32_MAX ? INT32_MAX : (int)left;
    zmq_setsockopt(c->sock, ZMQ_SNDTIMEO, &ms, sizeof ms);
    zmq_msg_t m;
    int none;
    if (frame_of(&m, payload, &none))
        return dt_errorf(err, DT_ENOMEM, "out of memory for a %s message", dt_wire_type_name(h->type));
    return dt_wire_send(c->sock, NULL, h, none ? NULL : &m, 0, err);
}

int dt_conn_recv(dt_conn *c, dt_msg *m, dt_error *err) { return recv_into(c->sock, 0, m, err); }

int dt_conn_poll(dt_conn *const *conns, int n, int fd, long timeout_ms, int *ready, dt_error *err) {
    zmq_pollitem_t items[n + 1];
    int m = 0;
    for (int k = 0; k < n; k++) items[m++] = (zmq_pollitem_t){.socket = conns[k]->sock, .events = ZMQ_POLLIN};
    if (fd >= 0) items[m++] = (zmq_pollitem_t){.socket = NULL, .fd = fd, .events = ZMQ_POLLIN};
    int r = zmq_poll(items, m, timeout_ms);
    if (r < 0) {
        if (errno == EINTR) return dt_errorf(err, DT_EINTR, "wait interrupted by a signal");
        return dt_errorf(err, DT_ENET, "zmq_poll: %s", zmq_strerror(errno));
    }
    for (int k = 0; k < n; k++) ready[k] = (items[k].revents & ZMQ_POLLIN) != 0;
    ready[n] = fd >= 0 && (items[m - 1].revents & ZMQ_POLLIN) != 0;
    return r;
}
