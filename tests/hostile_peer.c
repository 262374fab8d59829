/* A hostile peer for tests/test_hostile_peers.sh: for a given time it attacks a live ps at
 * 127.0.0.1:PORT every way docs/security.md bounds, all at once (one thread per attack), and
 * prints what it did. Not a test by itself: the shell test measures the ps meanwhile.
 *
 *   hostile_peer PORT SECONDS FRAME_BYTES
 *
 * FRAME_BYTES: the endless messages' frame size (below the ps's frame limit, or libzmq itself
 * drops the connection at the first frame).
 * Attacks: endless multipart messages over raw TCP (reconnecting after each cut); FETCH and PULL
 * requests never read; PULLs for step 2^40 and more deferred PULLs than allowed; DONE from tasks
 * outside the cluster; idle connections, and connections stopped in the middle of a frame. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "raw_zmtp.h"
#include "transport/wire.h"
#include "transport/zmq_io.h"

static int port;
static size_t frame_bytes;
static int64_t deadline_ms;
static atomic_long endless_cuts, endless_bytes, unread_asks, refused_far, refused_done, idle_open;

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int tcp_connect(void) { return raw_tcp_connect(port, 1); }

/* Frames of 1 MiB with MORE, never the last one; a new connection after each cut. */
static void *endless(void *arg) {
    (void)arg;
    uint8_t *frame = calloc(frame_bytes, 1);
    while (frame && now_ms() < deadline_ms) {
        int s = tcp_connect();
        if (s < 0 || zmtp_hello(s)) {
            if (s >= 0) close(s);
            usleep(100000);
            continue;
        }
        while (now_ms() < deadline_ms && !zmtp_frame_header(s, frame_bytes, 1) && !raw_send_all(s, frame, frame_bytes))
            atomic_fetch_add(&endless_bytes, (long)frame_bytes);
        if (now_ms() < deadline_ms) atomic_fetch_add(&endless_cuts, 1);
        close(s);
    }
    free(frame);
    return NULL;
}

static void *zsock(void *ctx, int rcvhwm) {
    void *s = dt_zsock_open(ctx, ZMQ_DEALER, 64 << 20, 0, 1000, NULL);
    if (!s) return NULL;
    zmq_setsockopt(s, ZMQ_RCVHWM, &rcvhwm, sizeof rcvhwm);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    zmq_connect(s, ep);
    return s;
}

static uint8_t chunks = 1; /* the ps's cut, once table_fill asked */

static void send_req(void *s, dt_msg_type type, uint16_t task, int64_t step, uint32_t id) {
    dt_wire_header h = dt_wire_header_make(type, DT_ROLE_WORKER, task, id);
    h.global_step = step;
    if (type == DT_MSG_PULL) h.chunks = chunks;
    dt_wire_send(s, NULL, &h, NULL, ZMQ_DONTWAIT, NULL);
}

/* FETCH and PULL, never read (libzmq of this side stops reading too: RCVHWM 1). */
static void *unread(void *ctx) {
    void *s = zsock(ctx, 1);
    for (uint32_t id = 1; s && now_ms() < deadline_ms; id++) {
        send_req(s, id % 2 ? DT_MSG_FETCH : DT_MSG_PULL, 1, 0, id);
        atomic_fetch_add(&unread_asks, 1);
        usleep(5000);
    }
    if (s) zmq_close(s);
    return NULL;
}

/* Reads replies for a while and counts the ERRORs with a given status. */
static long count_errors(void *s, int32_t status, int ms) {
    long n = 0;
    int64_t end = now_ms() + ms;
    while (now_ms() < end) {
        zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 50) != 1) continue;
        dt_wire_in in;
        if (dt_wire_recv(s, 0, &in, NULL) == DT_OK && in.hdr.type == DT_MSG_ERROR && in.hdr.status == status) n++;
        dt_wire_in_close(&in);
    }
    return n;
}

/* The ps's cut of its shard (STATUS_REPLY says it), so that PULLs reach the step checks. */
static uint8_t ps_cut(void *s) {
    send_req(s, DT_MSG_STATUS, 1, 0, 999);
    int64_t end = now_ms() + 1000;
    while (now_ms() < end) {
        zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 50) != 1) continue;
        dt_wire_in in;
        uint8_t k = dt_wire_recv(s, 0, &in, NULL) == DT_OK && in.hdr.type == DT_MSG_STATUS_REPLY ? in.hdr.chunks : 0;
        dt_wire_in_close(&in);
        if (k) return k;
    }
    return 1;
}

/* PULLs for step 2^40; deferred PULLs past the per-connection cap from several connections that
 * then close; DONE from tasks 7 and 65535. */
static void *table_fill(void *ctx) {
    while (now_ms() < deadline_ms) {
        void *s = zsock(ctx, 1000);
        if (!s) break;
        chunks = ps_cut(s);
        for (uint32_t id = 1; id <= 64; id++) send_req(s, DT_MSG_PULL, 1, INT64_C(1) << 40, id);
        atomic_fetch_add(&refused_far, count_errors(s, DT_WIRE_E_BAD_VALUE, 300));
        for (uint32_t id = 100; id < 400; id++) send_req(s, DT_MSG_PULL, 1, 1 << 20, id); /* past the cap */
        send_req(s, DT_MSG_DONE, 7, 0, 200);
        send_req(s, DT_MSG_DONE, 65535, 0, 201);
        atomic_fetch_add(&refused_done, count_errors(s, DT_WIRE_E_BAD_VALUE, 300));
        zmq_close(s);
    }
    return NULL;
}

/* Connections that never speak, and ones that stop in the middle of a frame, renewed as the ps
 * closes them. */
static void *idle(void *arg) {
    (void)arg;
    enum { N = 200 };
    int s[N];
    for (int i = 0; i < N; i++) s[i] = -1;
    while (now_ms() < deadline_ms) {
        long open = 0;
        for (int i = 0; i < N; i++) {
            char c;
            if (s[i] >= 0 && recv(s[i], &c, 1, MSG_DONTWAIT) == 0) {
                close(s[i]);
                s[i] = -1;
            }
            if (s[i] < 0 && (s[i] = tcp_connect()) >= 0 && i % 2 &&
                (zmtp_hello(s[i]) || zmtp_frame_header(s[i], 4 << 20, 0) || raw_send_all(s[i], "x", 1))) {
                close(s[i]);
                s[i] = -1;
            }
            open += s[i] >= 0;
        }
        atomic_store(&idle_open, open);
        usleep(200000);
    }
    for (int i = 0; i < N; i++)
        if (s[i] >= 0) close(s[i]);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: hostile_peer PORT SECONDS FRAME_BYTES\n");
        return 2;
    }
    port = atoi(argv[1]);
    frame_bytes = (size_t)atol(argv[3]);
    deadline_ms = now_ms() + 1000 * (int64_t)atoi(argv[2]);
    void *ctx = zmq_ctx_new();
    pthread_t th[5];
    pthread_create(&th[0], NULL, endless, NULL);
    pthread_create(&th[1], NULL, unread, ctx);
    pthread_create(&th[2], NULL, unread, ctx);
    pthread_create(&th[3], NULL, table_fill, ctx);
    pthread_create(&th[4], NULL, idle, NULL);
    for (int i = 0; i < 5; i++) pthread_join(th[i], NULL);
    zmq_ctx_term(ctx);
    printf("endless messages cut: %ld (%ld MiB sent)\nunread requests: %ld\nfar PULLs refused: %ld\n"
           "DONE from outside refused: %ld\nidle connections open at the end: %ld\n",
           atomic_load(&endless_cuts), atomic_load(&endless_bytes) >> 20, atomic_load(&unread_asks),
           atomic_load(&refused_far), atomic_load(&refused_done), atomic_load(&idle_open));
    return 0;
}
