/* A hostile peer for tests/test_hostile_peers.sh: for a given time it attacks a live ps at
 * 127.0.0.1:PORT every way docs/security.md bounds, all at once (one thread per attack), and
 * prints what it did. Not a test by itself: the shell test measures the ps meanwhile.
 *
 *   hostile_peer PORT SECONDS FRAME_BYTES [ATTACK,...]
 *
 * Without ATTACK: the first round's attacks, all at once. ATTACK names the second round's
 * (docs/security.md), any of them together:
 *   reset      200 connections each queue 8 FETCHes, then reset (SO_LINGER 0), over and over
 *   ping       the same over raw ZMTP, each burst ending with a ZMTP PING behind the requests
 *   pulls=N    N connections that never read send PULLs for the step after next, filling the
 *              deferred-PULL table as a worker's (task 1's) PULLs would
 *   tiny       14 connections each park 5 MiB of 0-byte frames of one unfinished message
 *   unread=N   N connections ask for FETCHes and never read the replies (ZMTP heartbeats on)
 *   ipc=PATH   endless messages over the ps's same-host socket PATH
 *   announce=N N connections each announce a frame of FRAME_BYTES (libzmq allocates it whole at
 *              once) and send a byte of it every 5 s, never finishing
 *   claims     forged WORK_DONE claims as workers 0 and 1 (dynamic sharding, docs/elastic.md), for
 *              every batch of epochs 0..3 and the steps from the ps's current one to 3 after, as fast
 *              as the replies come; prints how many ps 0 accepted
 *   first      the first round's attacks too
 *
 * FRAME_BYTES: the endless messages' frame size (below the ps's frame limit, or libzmq itself
 * drops the connection at the first frame).
 * Attacks: endless multipart messages over raw TCP (reconnecting after each cut); FETCH and PULL
 * requests never read; PULLs for step 2^40 and more deferred PULLs than allowed; DONE from tasks
 * outside the cluster; idle connections, and connections stopped in the middle of a frame. */
#include <arpa/inet.h>
#include <sys/un.h>
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
static atomic_long resets, pulls_sent, tiny_bytes, ipc_bytes, ps_step, announced, claims_sent, claims_accepted;
static int n_pulls = 20, n_unread = 100, n_announce = 200;
static const char *ipc_path;

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

/* ---- The second round ---- */

/* A request as raw ZMTP bytes: the header, one short final frame. */
static size_t raw_request(uint8_t *out, dt_msg_type type, uint16_t task, uint32_t id) {
    dt_wire_header h = dt_wire_header_make(type, DT_ROLE_WORKER, task, id);
    out[0] = 0x00;
    out[1] = DT_WIRE_HEADER_SIZE;
    dt_wire_encode(out + 2, &h);
    return 2 + DT_WIRE_HEADER_SIZE;
}

static void reset_close(int s) {
    struct linger l = {1, 0};
    setsockopt(s, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(s);
}

/* 200 connections, each 8 FETCHes queued (more than the ps's receive queue of 4 holds while it
 * is behind), then all reset at once. with_ping: over raw ZMTP, a PING command after the requests,
 * so libzmq has one to answer on a connection that already reset. */
static void *reset_storm(void *arg) {
    const int with_ping = arg != NULL;
    enum { N = 200, Q = 8 };
    while (now_ms() < deadline_ms) {
        int r[N];
        for (int i = 0; i < N; i++) {
            if ((r[i] = tcp_connect()) < 0 || zmtp_hello(r[i])) continue;
            uint8_t buf[Q * (2 + DT_WIRE_HEADER_SIZE) + 16];
            size_t len = 0;
            for (int k = 0; k < Q; k++) len += raw_request(buf + len, DT_MSG_FETCH, 1, (uint32_t)k + 1);
            const uint8_t ping[] = {0x04, 7, 4, 'P', 'I', 'N', 'G', 0, 100}; /* TTL 10 s */
            if (with_ping) memcpy(buf + len, ping, sizeof ping), len += sizeof ping;
            raw_send_all(r[i], buf, len);
        }
        usleep(with_ping ? 20000 : 100000);
        for (int i = 0; i < N; i++)
            if (r[i] >= 0) reset_close(r[i]);
        atomic_fetch_add(&resets, N);
    }
    return NULL;
}

/* Connections that never read, each sending PULLs for the step after the next (inside what a ps
 * holds), as worker 1 would at the barrier. */
static void *pull_fill(void *ctx) {
    void **z = calloc((size_t)n_pulls, sizeof *z);
    for (int i = 0; z && i < n_pulls; i++) {
        if (!(z[i] = zsock(ctx, 1))) continue;
        uint8_t k = ps_cut(z[i]);
        if (k) chunks = k;
    }
    for (uint32_t id = 1; z && now_ms() < deadline_ms; id++) {
        /* The ps's step, from a STATUS on the first connection, is read only once: PULLs ask for
         * step 2^20 when it is unknown, which is refused; the real horizon needs it. */
        for (int i = 0; i < n_pulls; i++) {
            if (!z[i]) continue;
            for (int c = 0; c < chunks; c++) {
                dt_wire_header h = dt_wire_header_make(DT_MSG_PULL, DT_ROLE_WORKER, 1, id * 256 + (uint32_t)c);
                h.global_step = (int64_t)atomic_load(&ps_step) + 2;
                h.chunks = chunks;
                h.chunk = (uint8_t)c;
                dt_wire_send(z[i], NULL, &h, NULL, ZMQ_DONTWAIT, NULL);
                atomic_fetch_add(&pulls_sent, 1);
            }
        }
        usleep(50000);
    }
    for (int i = 0; z && i < n_pulls; i++)
        if (z[i]) zmq_close(z[i]);
    free(z);
    return NULL;
}

/* The ps's global step (STATUS) on a reading socket, for the PULLs above to aim at step + 2. */
static void *step_watch(void *ctx) {
    void *s = zsock(ctx, 1000);
    while (s && now_ms() < deadline_ms) {
        send_req(s, DT_MSG_STATUS, 1, 0, 7);
        int64_t end = now_ms() + 200;
        while (now_ms() < end) {
            zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
            if (zmq_poll(&it, 1, 50) != 1) continue;
            dt_wire_in in;
            if (dt_wire_recv(s, 0, &in, NULL) == DT_OK && in.hdr.type == DT_MSG_STATUS_REPLY)
                atomic_store(&ps_step, (long)in.hdr.global_step);
            dt_wire_in_close(&in);
        }
    }
    if (s) zmq_close(s);
    return NULL;
}

/* Forged claims: WORK_DONE as worker 0 or 1 for epoch e, batch b, step ps_step + k (step_watch
 * keeps ps_step), a window of 64 in flight; ACKs with status OK counted as accepted. */
static void *forge_claims(void *ctx) {
    void *s = zsock(ctx, 1000);
    uint32_t id = 1;
    long in_flight = 0;
    while (s && now_ms() < deadline_ms) {
        for (; in_flight < 64; in_flight++, id++) {
            dt_wire_header h = dt_wire_header_make(DT_MSG_WORK_DONE, DT_ROLE_WORKER, (uint16_t)(id & 1), id);
            h.work_done.epoch = (id >> 1) % 4;
            h.work_done.batch = (id >> 3) % 64;
            h.local_step = atomic_load(&ps_step) + (int64_t)((id >> 9) % 4);
            if (dt_wire_send(s, NULL, &h, NULL, ZMQ_DONTWAIT, NULL) != DT_OK) break;
            atomic_fetch_add(&claims_sent, 1);
        }
        zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
        for (int wait = 50; zmq_poll(&it, 1, wait) == 1; wait = 0) {
            dt_wire_in in;
            if (dt_wire_recv(s, 0, &in, NULL) != DT_OK) break;
            in_flight--;
            if (in.hdr.type == DT_MSG_ACK && in.hdr.status == DT_WIRE_OK) atomic_fetch_add(&claims_accepted, 1);
            dt_wire_in_close(&in);
        }
    }
    if (s) zmq_close(s);
    return NULL;
}

/* 14 connections, each one unfinished message of 0-byte frames (2 bytes on the wire, a 64-byte
 * msg_t in libzmq): 5 MiB each, then held open. */
static void *tiny(void *arg) {
    (void)arg;
    enum { N = 14 };
    const size_t bytes = 5u << 20;
    uint8_t *frames = malloc(bytes);
    for (size_t i = 0; frames && i < bytes; i += 2) frames[i] = 0x01, frames[i + 1] = 0; /* MORE, size 0 */
    int s[N];
    for (int i = 0; i < N; i++) s[i] = -1;
    while (frames && now_ms() < deadline_ms) {
        for (int i = 0; i < N; i++) {
            char c;
            if (s[i] >= 0 && recv(s[i], &c, 1, MSG_DONTWAIT) == 0) {
                close(s[i]);
                s[i] = -1;
            }
            if (s[i] >= 0) continue;
            if ((s[i] = tcp_connect()) < 0) continue;
            uint8_t req[2 + DT_WIRE_HEADER_SIZE];
            raw_request(req, DT_MSG_HELLO, 1, 1); /* a valid message first */
            if (zmtp_hello(s[i]) || raw_send_all(s[i], req, sizeof req) || raw_send_all(s[i], frames, bytes)) {
                close(s[i]);
                s[i] = -1;
                continue;
            }
            atomic_fetch_add(&tiny_bytes, (long)bytes);
        }
        usleep(100000);
    }
    for (int i = 0; i < N; i++)
        if (s[i] >= 0) close(s[i]);
    free(frames);
    return NULL;
}

/* Connections that ask for the whole shard and never read it (their heartbeats keep them alive). */
static void *unread_many(void *ctx) {
    void **z = calloc((size_t)n_unread, sizeof *z);
    for (int i = 0; z && i < n_unread; i++) {
        if (!(z[i] = zsock(ctx, 1))) continue;
        dt_zsock_heartbeat(z[i], 30000, NULL);
    }
    for (uint32_t id = 1; z && now_ms() < deadline_ms; id++) {
        for (int i = 0; i < n_unread; i++)
            if (z[i]) send_req(z[i], DT_MSG_FETCH, 1, 0, id);
        atomic_fetch_add(&unread_asks, n_unread);
        usleep(200000);
    }
    for (int i = 0; z && i < n_unread; i++)
        if (z[i]) zmq_close(z[i]);
    free(z);
    return NULL;
}

/* Endless messages over the same-host socket: a valid HELLO, then 1 MiB frames with MORE. */
static void *ipc_endless(void *arg) {
    (void)arg;
    uint8_t *frame = calloc(frame_bytes, 1);
    while (frame && now_ms() < deadline_ms) {
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path, sizeof a.sun_path, "%s", ipc_path);
        struct timeval tv = {1, 0};
        setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        uint8_t req[2 + DT_WIRE_HEADER_SIZE];
        raw_request(req, DT_MSG_HELLO, 1, 1);
        if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) || zmtp_hello(s) || raw_send_all(s, req, sizeof req)) {
            if (s >= 0) close(s);
            usleep(100000);
            continue;
        }
        while (now_ms() < deadline_ms && !zmtp_frame_header(s, frame_bytes, 1) && !raw_send_all(s, frame, frame_bytes))
            atomic_fetch_add(&ipc_bytes, (long)frame_bytes);
        close(s);
    }
    free(frame);
    return NULL;
}

/* Connections that announce a large frame after a valid HELLO and then trickle it. */
static void *announce(void *arg) {
    (void)arg;
    int *s = malloc((size_t)n_announce * sizeof *s);
    for (int i = 0; s && i < n_announce; i++) s[i] = -1;
    for (int64_t next_byte = 0; s && now_ms() < deadline_ms; usleep(100000)) {
        int trickle = now_ms() >= next_byte;
        if (trickle) next_byte = now_ms() + 5000;
        for (int i = 0; i < n_announce; i++) {
            char c;
            if (s[i] >= 0 && recv(s[i], &c, 1, MSG_DONTWAIT) == 0) {
                close(s[i]);
                s[i] = -1;
            }
            if (s[i] >= 0) {
                if (trickle && raw_send_all(s[i], "", 1)) close(s[i]), s[i] = -1;
                continue;
            }
            if ((s[i] = tcp_connect()) < 0) continue;
            uint8_t req[2 + DT_WIRE_HEADER_SIZE];
            raw_request(req, DT_MSG_HELLO, 1, 1); /* a valid message first */
            uint8_t push[2 + DT_WIRE_HEADER_SIZE];
            raw_request(push, DT_MSG_PUSH, 1, 2);
            push[0] = 0x01; /* MORE: the payload frame follows */
            if (zmtp_hello(s[i]) || raw_send_all(s[i], req, sizeof req) || raw_send_all(s[i], push, sizeof push) ||
                zmtp_frame_header(s[i], frame_bytes, 0)) {
                close(s[i]);
                s[i] = -1;
                continue;
            }
            atomic_fetch_add(&announced, 1);
        }
    }
    for (int i = 0; s && i < n_announce; i++)
        if (s[i] >= 0) close(s[i]);
    free(s);
    return NULL;
}

static int has(const char *list, const char *name, const char **value) {
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len >= n && !strncmp(p, name, n) && (len == n || p[n] == '=')) {
            if (value) *value = p[n] == '=' ? p + n + 1 : NULL;
            return 1;
        }
        p = end ? end + 1 : NULL;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: hostile_peer PORT SECONDS FRAME_BYTES [ATTACK,...]\n");
        return 2;
    }
    port = atoi(argv[1]);
    frame_bytes = (size_t)atol(argv[3]);
    deadline_ms = now_ms() + 1000 * (int64_t)atoi(argv[2]);
    const char *list = argc == 5 ? argv[4] : "first", *v = NULL;
    void *ctx = zmq_ctx_new();
    pthread_t th[16];
    int n = 0;
    if (has(list, "first", NULL)) {
        pthread_create(&th[n++], NULL, endless, NULL);
        pthread_create(&th[n++], NULL, unread, ctx);
        pthread_create(&th[n++], NULL, unread, ctx);
        pthread_create(&th[n++], NULL, table_fill, ctx);
        pthread_create(&th[n++], NULL, idle, NULL);
    }
    if (has(list, "reset", NULL)) pthread_create(&th[n++], NULL, reset_storm, NULL);
    if (has(list, "ping", NULL)) pthread_create(&th[n++], NULL, reset_storm, (void *)1);
    if (has(list, "pulls", &v)) {
        if (v) n_pulls = atoi(v);
        pthread_create(&th[n++], NULL, step_watch, ctx);
        pthread_create(&th[n++], NULL, pull_fill, ctx);
    }
    if (has(list, "tiny", NULL)) pthread_create(&th[n++], NULL, tiny, NULL);
    if (has(list, "unread", &v)) {
        if (v) n_unread = atoi(v);
        pthread_create(&th[n++], NULL, unread_many, ctx);
    }
    if (has(list, "announce", &v)) {
        if (v) n_announce = atoi(v);
        pthread_create(&th[n++], NULL, announce, NULL);
    }
    if (has(list, "claims", NULL)) {
        pthread_create(&th[n++], NULL, step_watch, ctx);
        pthread_create(&th[n++], NULL, forge_claims, ctx);
    }
    if (has(list, "ipc", &v) && v) {
        ipc_path = v;
        pthread_create(&th[n++], NULL, ipc_endless, NULL);
    }
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    zmq_ctx_term(ctx);
    if (has(list, "first", NULL))
        printf("endless messages cut: %ld (%ld MiB sent)\nunread requests: %ld\nfar PULLs refused: %ld\n"
               "DONE from outside refused: %ld\nidle connections open at the end: %ld\n",
               atomic_load(&endless_cuts), atomic_load(&endless_bytes) >> 20, atomic_load(&unread_asks),
               atomic_load(&refused_far), atomic_load(&refused_done), atomic_load(&idle_open));
    if (has(list, "claims", NULL))
        printf("forged claims sent: %ld\nforged claims accepted: %ld\n", atomic_load(&claims_sent),
               atomic_load(&claims_accepted));
    printf("connections reset: %ld\ndeferred PULLs sent: %ld\ntiny-frame MiB sent: %ld\nunread requests: %ld\n"
           "ipc MiB sent: %ld\nframes announced: %ld\n", atomic_load(&resets), atomic_load(&pulls_sent), atomic_load(&tiny_bytes) >> 20,
           atomic_load(&unread_asks), atomic_load(&ipc_bytes) >> 20, atomic_load(&announced));
    return 0;
}
