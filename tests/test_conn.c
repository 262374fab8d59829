/* The transport seam's contract (transport/conn.h, docs/transport.md), through its calls alone, so
 * that any transport behind it must pass the same: whole messages with their header checked, the
 * payload owned by the message until taken and then by the taker, zero-copy sends released once
 * the transport is done with them (the send's completion), borrowed ones copied, routes held past
 * their message, a payload over the largest frame never handed over, connection events, and the
 * releases of a closed connection. Over TCP on 127.0.0.1 (a port the kernel picks). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "test.h"
#include "transport/conn.h"

static dt_wire_header request(dt_msg_type type) {
    dt_wire_header h = dt_wire_header_make(type, 0, 0, 0);
    h.role = DT_ROLE_WORKER;
    h.request_id = 77;
    return h;
}

static atomic_int released;

static void count_release(void *hint) {
    (void)hint;
    atomic_fetch_add(&released, 1);
}

static void pause_ms(int ms) {
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits until *counter reaches want, at most ms: whether it did. */
static int reaches(atomic_int *counter, int want, int ms) {
    for (int64_t until = dt_clock_us() + ms * INT64_C(1000); atomic_load(counter) < want;) {
        if (dt_clock_us() > until) return 0;
        pause_ms(2);
    }
    return 1;
}

static int gone_count;
static dt_peer *gone_last;

static void on_gone(void *user, dt_peer *peer) {
    (void)user;
    gone_count++;
    gone_last = peer;
}

/* The next message on the server within ms (DT_ETIMEOUT if none). */
static int server_next(dt_server *s, dt_msg *m, int ms, dt_error *e) {
    for (int64_t until = dt_clock_us() + ms * INT64_C(1000); dt_clock_us() < until;) {
        int readable = 0;
        if (dt_server_wait(s, 50, on_gone, NULL, &readable, e)) return e->code;
        if (!readable) continue;
        int rc = dt_server_recv(s, m, e);
        if (rc != DT_ETIMEOUT) return rc;
        dt_msg_close(m);
    }
    return DT_ETIMEOUT;
}

static int conn_next(dt_conn *c, dt_msg *m, int ms, dt_error *e) {
    for (int64_t until = dt_clock_us() + ms * INT64_C(1000); dt_clock_us() < until;) {
        int ready[2] = {0, 0};
        int r = dt_conn_poll(&c, 1, -1, 50, ready, e);
        if (r < 0) return r;
        if (!ready[0]) continue;
        int rc = dt_conn_recv(c, m, e);
        if (rc != DT_ETIMEOUT) return rc;
        dt_msg_close(m);
    }
    return DT_ETIMEOUT;
}

static int hello(dt_conn *c, dt_error *e) {
    dt_wire_header h = request(DT_MSG_HELLO);
    return dt_conn_send(c, &h, NULL, dt_clock_us() + 2000000, e);
}

/* Waits on the server for ms, hearing its connection events (until one is told gone, if asked). */
static void hear_events(dt_server *s, int ms, int until_gone) {
    dt_error e = {0};
    for (int64_t until = dt_clock_us() + ms * INT64_C(1000); dt_clock_us() < until && !(until_gone && gone_count);) {
        int readable;
        dt_server_wait(s, 20, on_gone, NULL, &readable, &e);
    }
}

typedef struct {
    dt_server *srv;
    dt_transport *tr;
    dt_conn *conn;
    char bound[128];
} pair_t;

static int pair_open(pair_t *p, uint64_t max_frame) {
    memset(p, 0, sizeof *p);
    dt_error e = {0};
    dt_server_config sc = {.max_frame = max_frame, .io_threads = 1, .linger_ms = 0, .send_queue = 64,
                           .handshake_ms = 5000, .log_prefix = "test: ",
                           .peers = {.max_partial_bytes = max_frame + DT_WIRE_HEADER_SIZE,
                                     .first_message_us = 10 * INT64_C(1000000), .message_us = 10 * INT64_C(1000000),
                                     .budget_bytes = UINT64_C(1) << 30, .max_connections = 64, .queued_messages = 4}};
    int rc = dt_server_open(&p->srv, &sc, &e);
    if (!rc) rc = dt_server_bind(p->srv, "tcp://127.0.0.1:*", p->bound, sizeof p->bound, &e);
    if (!rc) rc = dt_transport_open(&p->tr, &e);
    dt_conn_config cc = {.max_frame = max_frame, .heartbeat_ms = 10000, .send_timeout_ms = 2000};
    if (!rc) rc = dt_conn_open(&p->conn, p->tr, p->bound, &cc, &e);
    if (rc) fprintf(stderr, "pair_open: %s\n", e.msg);
    return rc;
}

static void pair_close(pair_t *p) {
    dt_conn_close(p->conn);
    dt_transport_close(p->tr);
    dt_server_close(p->srv);
}


/* A zero-copy request, its payload taken by the receiver beyond its message, a reply along a held
 * route after the message is closed; each zero-copy payload released exactly once. */
static void test_round_trip_and_ownership(void) {
    pair_t p;
    if (pair_open(&p, 1 << 20)) {
        CHECK(0);
        return;
    }
    atomic_store(&released, 0);
    static float grad[4096];
    for (int i = 0; i < 4096; i++) grad[i] = (float)i;
    dt_error e = {0};
    dt_wire_header h = request(DT_MSG_PUSH);
    dt_bytes b = {.data = grad, .size = sizeof grad, .release = count_release};
    CHECK(dt_conn_send(p.conn, &h, &b, dt_clock_us() + 2000000, &e) == DT_OK);
    CHECK(h.payload_bytes == sizeof grad);

    dt_msg m;
    CHECK(server_next(p.srv, &m, 3000, &e) == DT_OK);
    CHECK(m.hdr.type == DT_MSG_PUSH && m.hdr.request_id == 77 && m.size == sizeof grad);
    CHECK(m.route != NULL && m.peer != NULL && dt_peer_serial(m.peer) > 0);
    CHECK_CONTAINS(m.addr, "127.0.0.1");
    /* The send completed: the client's transport let go of the caller's buffer. */
    CHECK(reaches(&released, 1, 2000));

    dt_bytes taken;
    CHECK(dt_msg_take(&m, &taken) == &taken && taken.release != NULL && taken.size == sizeof grad);
    CHECK(m.size == 0 && m.data == NULL); /* the message keeps none of it */
    dt_route *route = dt_route_hold(m.route);
    CHECK(route != NULL);
    dt_msg_close(&m);
    /* Still the taker's after the message is gone. */
    CHECK(memcmp(taken.data, grad, sizeof grad) == 0);
    dt_bytes_release(&taken);
    CHECK(taken.release == NULL && taken.data == NULL);

    /* A reply along the held route, zero-copy: arrives, and is released once sent. */
    static float params[1000];
    for (int i = 0; i < 1000; i++) params[i] = -(float)i;
    dt_wire_header r = dt_wire_header_make(DT_MSG_PARAMS, 0, 0, 0);
    r.request_id = 77;
    dt_bytes rb = {.data = params, .size = sizeof params, .release = count_release};
    CHECK(dt_server_send(p.srv, route, &r, &rb, &e) == DT_OK);
    dt_route_drop(route);
    CHECK(conn_next(p.conn, &m, 3000, &e) == DT_OK);
    CHECK(m.hdr.type == DT_MSG_PARAMS && m.size == sizeof params && memcmp(m.data, params, sizeof params) == 0);
    CHECK(m.route == NULL); /* a client's messages have no route */
    dt_msg_close(&m);
    CHECK(reaches(&released, 2, 2000));

    /* Nothing more queued: a receive does not wait. */
    CHECK(dt_conn_recv(p.conn, &m, &e) == DT_ETIMEOUT);
    dt_msg_close(&m);
    pair_close(&p);
    CHECK(atomic_load(&released) == 2); /* exactly once each */
}

/* Borrowed bytes (no release) are copied before the send returns: the caller may reuse them. An
 * empty payload is no payload. An ERROR reply carries its text. */
static void test_borrowed_copied_and_errors(void) {
    pair_t p;
    if (pair_open(&p, 1 << 20)) {
        CHECK(0);
        return;
    }
    dt_error e = {0};
    char buf[300];
    memset(buf, 'a', sizeof buf);
    dt_wire_header h = request(DT_MSG_PUSH);
    dt_bytes b = {.data = buf, .size = sizeof buf};
    CHECK(dt_conn_send(p.conn, &h, &b, dt_clock_us() + 2000000, &e) == DT_OK);
    memset(buf, 'b', sizeof buf);
    dt_wire_header s = request(DT_MSG_STATUS);
    atomic_store(&released, 0);
    dt_bytes empty = {.data = buf, .size = 0, .release = count_release};
    CHECK(dt_conn_send(p.conn, &s, &empty, dt_clock_us() + 2000000, &e) == DT_OK);
    CHECK(s.payload_bytes == 0 && atomic_load(&released) == 1); /* released at once: nothing to send */

    dt_msg m;
    CHECK(server_next(p.srv, &m, 3000, &e) == DT_OK);
    CHECK(m.hdr.type == DT_MSG_PUSH && m.size == sizeof buf);
    int all_a = m.size == sizeof buf;
    for (size_t i = 0; all_a && i < m.size; i++) all_a = ((const char *)m.data)[i] == 'a';
    CHECK(all_a);
    CHECK(dt_server_send_error(p.srv, m.route, m.hdr, DT_WIRE_E_BUSY, "busy: %d", 42) == DT_OK);
    dt_msg_close(&m);
    CHECK(server_next(p.srv, &m, 3000, &e) == DT_OK);
    CHECK(m.hdr.type == DT_MSG_STATUS && m.size == 0 && m.data != NULL); /* an empty payload: a pointer to no bytes, never NULL */
    dt_bytes none;
    CHECK(dt_msg_take(&m, &none) == NULL);
    dt_msg_close(&m);

    CHECK(conn_next(p.conn, &m, 3000, &e) == DT_OK);
    CHECK(m.hdr.type == DT_MSG_ERROR && m.hdr.status == DT_WIRE_E_BUSY && m.hdr.request_id == 77);
    CHECK(m.size == 8 && memcmp(m.data, "busy: 42", 8) == 0);
    dt_msg_close(&m);
    pair_close(&p);
}

/* A payload over the server's largest frame is never handed over (its connection is dropped); the
 * client connects again and its next message arrives. */
static void test_oversize_refused(void) {
    pair_t p;
    if (pair_open(&p, 1000)) {
        CHECK(0);
        return;
    }
    dt_error e = {0};
    static char big[4000];
    dt_wire_header h = request(DT_MSG_PUSH);
    dt_bytes b = {.data = big, .size = sizeof big};
    CHECK(dt_conn_send(p.conn, &h, &b, dt_clock_us() + 2000000, &e) == DT_OK);
    int pushes = 0, statuses = 0;
    for (int64_t until = dt_clock_us() + 5000000; dt_clock_us() < until && !statuses;) {
        dt_wire_header s = request(DT_MSG_STATUS);
        CHECK(dt_conn_send(p.conn, &s, NULL, dt_clock_us() + 2000000, &e) == DT_OK);
        dt_msg m;
        int rc = server_next(p.srv, &m, 300, &e);
        if (rc == DT_OK) {
            pushes += m.hdr.type == DT_MSG_PUSH;
            statuses += m.hdr.type == DT_MSG_STATUS;
        }
        dt_msg_close(&m);
    }
    CHECK(statuses >= 1);
    CHECK(pushes == 0);
    pair_close(&p);
}

/* A closed connection is told to the server (gone), and a reply along a route held for it is
 * dropped, not an error. */
static void test_gone(void) {
    pair_t p;
    if (pair_open(&p, 1 << 20)) {
        CHECK(0);
        return;
    }
    dt_error e = {0};
    CHECK(hello(p.conn, &e) == DT_OK);
    dt_msg m;
    CHECK(server_next(p.srv, &m, 3000, &e) == DT_OK);
    dt_peer *peer = m.peer;
    dt_peer_ref(peer);
    dt_route *route = dt_route_hold(m.route);
    dt_msg_close(&m);
    gone_count = 0;
    hear_events(p.srv, 100, 0);
    CHECK(gone_count == 0 && dt_peers_count(dt_server_peers(p.srv)) == 1 && !dt_peer_gone(peer));

    gone_last = NULL;
    dt_conn_close(p.conn);
    p.conn = NULL;
    hear_events(p.srv, 3000, 1);
    CHECK(gone_count == 1 && gone_last == peer);
    CHECK(dt_peer_gone(peer) && dt_peers_count(dt_server_peers(p.srv)) == 0);
    dt_wire_header r = dt_wire_header_make(DT_MSG_WELCOME, 0, 0, 0);
    int rc = dt_server_send(p.srv, route, &r, NULL, &e);
    CHECK(rc == DT_OK || rc == DT_ETIMEOUT);
    dt_route_drop(route);
    dt_peer_unref(peer);
    pair_close(&p);
}

/* A connection's first message may be read before the server hears of the connection (its
 * accept event comes on another queue): that event, heard later, is the same connection, not a
 * reused descriptor, so the peer stays open and is not told gone (a ps would have dropped the
 * request unanswered: a FETCH as a connection's first message hears the events before it runs). */
static void test_message_before_accept(void) {
    pair_t p;
    if (pair_open(&p, 1 << 20)) {
        CHECK(0);
        return;
    }
    dt_error e = {0};
    CHECK(hello(p.conn, &e) == DT_OK);
    dt_msg m;
    int rc = DT_ETIMEOUT;
    for (int k = 0; k < 3000 && rc == DT_ETIMEOUT; k++) { /* no wait: no events heard meanwhile */
        rc = dt_server_recv(p.srv, &m, &e);
        if (rc == DT_ETIMEOUT) {
            dt_msg_close(&m);
            pause_ms(1);
        }
    }
    CHECK(rc == DT_OK && m.peer != NULL);
    dt_peer *peer = m.peer;
    dt_peer_ref(peer);
    dt_msg_close(&m);
    gone_count = 0;
    hear_events(p.srv, 200, 0);
    CHECK(gone_count == 0 && !dt_peer_gone(peer));
    CHECK(dt_peers_count(dt_server_peers(p.srv)) == 1);
    CHECK(hello(p.conn, &e) == DT_OK);
    CHECK(server_next(p.srv, &m, 3000, &e) == DT_OK);
    CHECK(m.peer == peer); /* the same connection, the same peer */
    dt_msg_close(&m);
    dt_peer_unref(peer);
    pair_close(&p);
}

/* With --auth=curve too, the server hears of its connections (the ZAP handler watches the same
 * socket for failed handshakes: libzmq keeps one monitor per socket, and a second replaced the
 * connection watch's, so a closed connection was never told gone and its descriptor's next
 * connection inherited its peer); and a client without the key is still refused and logged. */
static void test_gone_with_curve(void) {
    char dir[] = "/tmp/dtrain-conn-keys-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char auth_dir[300], server_dir[300], client_dir[300];
    dt_error e = {0};
    snprintf(server_dir, sizeof server_dir, "%s/ps", dir);
    snprintf(client_dir, sizeof client_dir, "%s/worker", dir);
    snprintf(auth_dir, sizeof auth_dir, "%s/ps/authorized", dir);
    CHECK(dt_auth_keygen(server_dir, "server", &e) == DT_OK && dt_auth_keygen(client_dir, "client", &e) == DT_OK);
    CHECK(dt_auth_keygen(auth_dir, "stranger", &e) == DT_OK); /* a key in the list: not the client's */
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cp %s/client.key %s/ && cp %s/server.key %s/ && rm %s/stranger.secret", client_dir,
             auth_dir, server_dir, client_dir, auth_dir);
    CHECK(system(cmd) == 0);
    dt_auth sa = {0}, ca = {0};
    CHECK(dt_auth_load(&sa, server_dir, 1, &e) == DT_OK);
    CHECK(dt_auth_load(&ca, client_dir, 0, &e) == DT_OK);
    char logbuf[4096] = "";
    FILE *log = fmemopen(logbuf, sizeof logbuf - 1, "w");
    dt_server *srv = NULL;
    dt_server_config sc = {.max_frame = 1 << 16, .io_threads = 1, .send_queue = 64, .handshake_ms = 5000,
                           .auth = &sa, .log_prefix = "test: ",
                           .peers = {.max_partial_bytes = (1 << 16) + DT_WIRE_HEADER_SIZE,
                                     .first_message_us = 10 * INT64_C(1000000), .message_us = 10 * INT64_C(1000000),
                                     .budget_bytes = UINT64_C(1) << 30, .max_connections = 64, .queued_messages = 4,
                                     .log = log}};
    char bound[128];
    CHECK(dt_server_open(&srv, &sc, &e) == DT_OK);
    CHECK(srv && dt_server_bind(srv, "tcp://127.0.0.1:*", bound, sizeof bound, &e) == DT_OK);
    dt_transport *tr = NULL;
    CHECK(dt_transport_open(&tr, &e) == DT_OK);
    dt_conn *c = NULL;
    dt_conn_config cc = {.max_frame = 1 << 16, .send_timeout_ms = 2000, .auth = &ca};
    CHECK(dt_conn_open(&c, tr, bound, &cc, &e) == DT_OK);
    CHECK(hello(c, &e) == DT_OK);
    dt_msg m;
    CHECK(server_next(srv, &m, 5000, &e) == DT_OK);
    dt_peer *peer = m.peer;
    dt_peer_ref(peer);
    dt_msg_close(&m);
    gone_count = 0;
    gone_last = NULL;
    dt_conn_close(c);
    hear_events(srv, 3000, 1);
    CHECK(gone_count == 1 && gone_last == peer && dt_peer_gone(peer));
    dt_peer_unref(peer);

    /* A client without CURVE: refused, and the refusal logged. */
    dt_conn_config plain = {.max_frame = 1 << 16, .send_timeout_ms = 2000};
    CHECK(dt_conn_open(&c, tr, bound, &plain, &e) == DT_OK);
    CHECK(hello(c, &e) == DT_OK);
    CHECK(server_next(srv, &m, 1500, &e) == DT_ETIMEOUT);
    dt_conn_close(c);
    dt_transport_close(tr);
    dt_server_close(srv);
    fclose(log);
    CHECK_CONTAINS(logbuf, "handshake failed");
    dt_auth_free(&sa);
    dt_auth_free(&ca);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

/* What a closed connection still queued (nobody listens) is released soon after the close: the
 * worker's gradient buffers are its own again (ps_client.h). */
static void test_close_releases(void) {
    dt_error e = {0};
    dt_transport *tr = NULL;
    CHECK(dt_transport_open(&tr, &e) == DT_OK);
    dt_conn *c = NULL;
    dt_conn_config cc = {.max_frame = 1 << 20, .send_timeout_ms = 1000};
    /* Port 1 on loopback: nothing listens there, so the message waits for a connection. */
    CHECK(dt_conn_open(&c, tr, "tcp://127.0.0.1:1", &cc, &e) == DT_OK);
    atomic_store(&released, 0);
    static float grad[1024];
    dt_wire_header h = request(DT_MSG_PUSH);
    dt_bytes b = {.data = grad, .size = sizeof grad, .release = count_release};
    CHECK(dt_conn_send(c, &h, &b, dt_clock_us() + 1000000, &e) == DT_OK);
    pause_ms(20);
    CHECK(atomic_load(&released) == 0); /* still queued */
    dt_conn_close(c);
    CHECK(reaches(&released, 1, 2000));
    dt_transport_close(tr);
    CHECK(atomic_load(&released) == 1);
}

/* A bad endpoint fails at open, naming it. */
static void test_bad_endpoint(void) {
    dt_error e = {0};
    dt_transport *tr = NULL;
    CHECK(dt_transport_open(&tr, &e) == DT_OK);
    dt_conn *c = NULL;
    dt_conn_config cc = {.max_frame = 1000};
    CHECK(dt_conn_open(&c, tr, "nonsense://x", &cc, &e) != DT_OK && c == NULL);
    CHECK_CONTAINS(e.msg, "nonsense://x");
    dt_transport_close(tr);
}

int main(void) {
    RUN(test_round_trip_and_ownership);
    RUN(test_borrowed_copied_and_errors);
    RUN(test_oversize_refused);
    RUN(test_gone);
    RUN(test_message_before_accept);
    RUN(test_gone_with_curve);
    RUN(test_close_releases);
    RUN(test_bad_endpoint);
    return test_summary();
}
