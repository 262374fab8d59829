/* The parameter server and its client on 127.0.0.1: ps tasks run in threads (fast) and, where the
 * exit status matters, in forked processes. Every wait is bounded: a broken ps makes a check fail
 * within seconds, never a hang. Ports are chosen by the kernel (bind to port 0 / "*"). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "compute/optim.h"
#include "core/clock.h"
#include "io/bytes.h"
#include "metrics/metrics.h"
#include "ps/coord.h"
#include "ps_harness.h"
#include "worker/work_client.h"

/* ---------- tests ---------- */

static void test_init_then_pull(void) {
    enum { N = 1000 };
    ps_thread ps;
    ps_start(&ps, 0, N, NULL, 0);
    size_t sizes[1] = {N};
    dt_ps_client *w = client(1, &ps, sizes, DT_ROLE_WORKER, 1);
    dt_ps_client *chief = client(1, &ps, sizes, DT_ROLE_CHIEF, 0);
    CHECK(w && chief);
    if (!w || !chief) goto out;
    CHECK(dt_ps_client_shard(w, 0)->initialised == 0);

    /* Before INIT: pulls and pushes are refused, and waiting for readiness times out clearly. */
    static float p[N], got[N], g[N];
    float *dst[1] = {got};
    dt_error e = {0};
    CHECK(dt_ps_client_pull_all(w, dst, 0, NULL, &e) == DT_EPROTO);
    CHECK_CONTAINS(e.msg, "not initialised");
    CHECK_CONTAINS(e.msg, ps.endpoint);
    const float *gs[1] = {g};
    CHECK(dt_ps_client_push_all(w, gs, 0, NULL, &e) == DT_EPROTO);
    int64_t t0 = dt_clock_us() / 1000;
    CHECK(dt_ps_client_wait_ready(w, 200, &e) == DT_ETIMEOUT);
    CHECK((dt_clock_us() / 1000) - t0 < 2000);
    CHECK_CONTAINS(e.msg, "chief");
    CHECK_CONTAINS(e.msg, ps.endpoint);

    /* A worker may not initialise. */
    fill(p, N, 1.0f, 1);
    const float *src[1] = {p};
    dt_opt_config opt;
    dt_opt_config_init(&opt, "sgd", 0.1f, NULL);
    CHECK(dt_ps_client_init(w, &opt, src, NULL, NULL, 0, &e) == DT_EINVAL);

    CHECK(dt_ps_client_init(chief, &opt, src, NULL, NULL, 5, &e) == DT_OK);
    CHECK(dt_ps_client_wait_ready(w, 2000, &e) == DT_OK);
    int64_t steps[1] = {-1};
    CHECK(dt_ps_client_pull_all(w, dst, 0, steps, &e) == DT_OK);
    CHECK(memcmp(got, p, sizeof p) == 0);
    CHECK(steps[0] == 5);
    dt_ps_shard_status st[1];
    CHECK(dt_ps_client_status(w, st, &e) == DT_OK);
    CHECK(st[0].initialised == 1 && st[0].global_step == 5 && st[0].pulls == 1 && st[0].pushes == 0);
out:
    dt_ps_client_close(w);
    dt_ps_client_close(chief);
    CHECK(ps_stop(&ps) == DT_EINTR);
    CHECK(ps.stats.refused == 2); /* the pull and the push; the worker's INIT never left the client */
}

/* Async pushes apply the optimizer exactly as dt_opt_apply on a local copy (bit for bit: same
 * code, same order), for SGD and Adam, over two ps shards of different sizes. */
static void check_optimizer_exact(const char *name) {
    enum { N0 = 700, N1 = 333, STEPS = 4 };
    ps_thread ps[2];
    ps_start(&ps[0], 0, N0, NULL, 0);
    ps_start(&ps[1], 1, N1, NULL, 0);
    size_t sizes[2] = {N0, N1};
    dt_ps_client *c = client(2, ps, sizes, DT_ROLE_CHIEF, 0);
    CHECK(c != NULL);
    if (!c) goto out;
    dt_opt_config opt;
    dt_opt_config_init(&opt, name, 0.01f, NULL);
    int slots = dt_opt_slots(&opt);
    static float p0[N0], p1[N1], s0[2 * N0], s1[2 * N1], r0[N0], r1[N1];
    fill(p0, N0, 1.0f, 3);
    fill(p1, N1, 1.0f, 4);
    fill(s0, (size_t)slots * N0, 0.01f, 5); /* non-zero state: checks that INIT carries it */
    for (int i = 0; i < slots * N0; i++) s0[i] = fabsf(s0[i]);
    fill(s1, (size_t)slots * N1, 0.01f, 6);
    for (int i = 0; i < slots * N1; i++) s1[i] = fabsf(s1[i]);
    const float *src[2] = {p0, p1}, *state[2] = {s0, s1};
    dt_error e = {0};
    CHECK(dt_ps_client_init(c, &opt, src, state, NULL, 10, &e) == DT_OK);
    float *pp[2] = {p0, p1}, *ss[2] = {s0, s1};
    push_and_mirror(c, &opt, pp, ss, NULL, sizes, STEPS, 10);
    float *dst[2] = {r0, r1};
    int64_t steps[2];
    CHECK(dt_ps_client_pull_all(c, dst, 0, steps, &e) == DT_OK);
    CHECK_MSG(memcmp(r0, p0, sizeof r0) == 0 && memcmp(r1, p1, sizeof r1) == 0, "%s: shards differ from dt_opt_apply", name);
    CHECK(steps[0] == 10 + STEPS && steps[1] == 10 + STEPS);
    const float *views[2] = {NULL, NULL};
    steps[0] = steps[1] = -1;
    CHECK(dt_ps_client_pull_views(c, 0, views, steps, &e) == DT_OK);
    CHECK(views[0] && views[1] && memcmp(views[0], p0, sizeof p0) == 0 && memcmp(views[1], p1, sizeof p1) == 0);
    CHECK(steps[0] == 10 + STEPS && steps[1] == 10 + STEPS);
out:
    dt_ps_client_close(c);
    ps_stop(&ps[0]);
    ps_stop(&ps[1]);
}

static void test_async_sgd_exact(void) { check_optimizer_exact("sgd"); }
static void test_async_adam_exact(void) { check_optimizer_exact("adam"); }

typedef struct {
    ps_thread *ps;
    int n_ps, task, pushes, failures;
    const size_t *sizes;
} pusher;

static void *pusher_main(void *arg) {
    pusher *u = arg;
    dt_ps_client *c = client(u->n_ps, u->ps, u->sizes, DT_ROLE_WORKER, u->task);
    if (!c) {
        u->failures = u->pushes;
        return NULL;
    }
    static float zeros[2000]; /* read-only, shared by both pushers */
    const float *gs[2] = {zeros, zeros};
    float buf0[2000], buf1[2000];
    float *dst[2] = {buf0, buf1};
    dt_error e = {0};
    for (int i = 0; i < u->pushes; i++) {
        if (dt_ps_client_push_all(c, gs, i, NULL, &e)) u->failures++;
        if (dt_ps_client_pull_all(c, dst, 0, NULL, &e)) u->failures++;
    }
    dt_ps_client_close(c);
    return NULL;
}

/* Two workers pushing at the same time: every push is counted, on every shard. */
static void test_concurrent_pushes_counted(void) {
    enum { PUSHES = 60 };
    ps_thread ps[2];
    ps_start(&ps[0], 0, 2000, NULL, 0);
    ps_start(&ps[1], 1, 1500, NULL, 0);
    size_t sizes[2] = {2000, 1500};
    dt_ps_client *chief = client(2, ps, sizes, DT_ROLE_CHIEF, 0);
    CHECK(chief != NULL);
    if (!chief) goto out;
    static float p0[2000], p1[1500];
    const float *src[2] = {p0, p1};
    dt_opt_config opt;
    dt_opt_config_init(&opt, "sgd", 0.1f, NULL);
    dt_error e = {0};
    CHECK(dt_ps_client_init(chief, &opt, src, NULL, NULL, 0, &e) == DT_OK);
    pusher u[2];
    pthread_t th[2];
    for (int k = 0; k < 2; k++) {
        u[k] = (pusher){.ps = ps, .n_ps = 2, .task = k + 1, .pushes = PUSHES, .sizes = sizes};
        pthread_create(&th[k], NULL, pusher_main, &u[k]);
    }
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    CHECK(u[0].failures == 0 && u[1].failures == 0);
    dt_ps_shard_status st[2];
    CHECK(dt_ps_client_status(chief, st, &e) == DT_OK);
    CHECK_MSG(st[0].global_step == 2 * PUSHES && st[1].global_step == 2 * PUSHES, "steps %lld %lld",
              (long long)st[0].global_step, (long long)st[1].global_step);
    CHECK(st[0].pushes == 2 * PUSHES && st[0].pulls == 2 * PUSHES);
out:
    dt_ps_client_close(chief);
    ps_stop(&ps[0]);
    ps_stop(&ps[1]);
    CHECK(ps[0].stats.pushes == 2 * PUSHES && ps[1].stats.global_step == 2 * PUSHES);
}

/* A worker started before its ps retries and connects once the ps appears. */
static void test_client_before_ps(void) {
    int port = free_port();
    CHECK(port > 0);
    char bind_ep[64];
    snprintf(bind_ep, sizeof bind_ep, "tcp://127.0.0.1:%d", port);
    ps_thread ps;
    ps_start(&ps, 0, 100, bind_ep, 400);
    snprintf(ps.endpoint, sizeof ps.endpoint, "%s", bind_ep);
    size_t sizes[1] = {100};
    int64_t t0 = dt_clock_us() / 1000;
    dt_ps_client *c = client(1, &ps, sizes, DT_ROLE_WORKER, 1);
    int64_t took = (dt_clock_us() / 1000) - t0;
    CHECK(c != NULL);
    CHECK_MSG(took >= 300 && took < 2500, "connected after %lld ms", (long long)took);
    dt_ps_client_close(c);
    ps_stop(&ps);
}

/* No ps at all: the client gives up after its timeout, naming the address. */
static void test_no_ps_times_out(void) {
    int port = free_port();
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    const char *eps[1] = {ep};
    size_t sizes[1] = {10};
    dt_ps_client_config cc = {.n_ps = 1, .endpoints = eps, .shard_floats = sizes, .role = DT_ROLE_WORKER,
                              .task = 1, .connect_timeout_ms = 300, .request_timeout_ms = 300};
    dt_ps_client *c = NULL;
    dt_error e = {0};
    int64_t t0 = dt_clock_us() / 1000;
    CHECK(dt_ps_client_open(&c, &cc, &e) == DT_ETIMEOUT);
    int64_t took = (dt_clock_us() / 1000) - t0;
    CHECK(c == NULL);
    CHECK_MSG(took >= 280 && took < 1500, "gave up after %lld ms", (long long)took);
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    CHECK_CONTAINS(e.msg, addr);
    CHECK_CONTAINS(e.msg, "no answer");
}

/* Refusals on a live ps: wrong version, lying payload length, wrong shard index, wrong role,
 * wrong shard size; the ps keeps serving afterwards. */
static void test_ps_refusals(void) {
    enum { N = 64 };
    ps_thread ps;
    ps_start(&ps, 0, N, NULL, 0);
    void *ctx = zmq_ctx_new();
    void *s = raw_open(ctx, ps.endpoint);
    dt_wire_in in;
    uint8_t hb[DT_WIRE_HEADER_SIZE];

    dt_wire_header h = dt_wire_header_make(DT_MSG_HELLO, DT_ROLE_WORKER, 1, 7);
    dt_wire_encode(hb, &h);
    hb[4] = 1; /* version 1 (before sync replicas) */
    zmq_send(s, hb, sizeof hb, 0);
    CHECK(raw_reply(s, &in) == DT_OK);
    char says[64];
    snprintf(says, sizeof says, "version 1, this program speaks version %u", DT_WIRE_VERSION);
    CHECK(raw_error_says(&in, DT_WIRE_E_VERSION, says));
    CHECK(in.hdr.request_id == 7);
    dt_wire_in_close(&in);

    /* INIT from a worker, then from the chief with a payload length that lies. */
    h = dt_wire_header_make(DT_MSG_INIT, DT_ROLE_WORKER, 1, 8);
    h.shard_floats = N;
    h.generation = 1;
    zmq_msg_t m;
    zmq_msg_init_size(&m, N * 4);
    memset(zmq_msg_data(&m), 0, N * 4);
    dt_wire_send(s, NULL, &h, &m, 0, NULL);
    CHECK(raw_reply(s, &in) == DT_OK && raw_error_says(&in, DT_WIRE_E_ROLE, "only the chief"));
    dt_wire_in_close(&in);
    h.role = DT_ROLE_CHIEF;
    h.request_id = 9;
    h.payload_bytes = UINT64_C(1) << 45;
    dt_wire_encode(hb, &h);
    zmq_send(s, hb, sizeof hb, ZMQ_SNDMORE);
    zmq_send(s, "abcd", 4, 0);
    CHECK(raw_reply(s, &in) == DT_OK && raw_error_says(&in, DT_WIRE_E_MALFORMED, "payload"));
    dt_wire_in_close(&in);
    /* Right length for another shard size. */
    h.request_id = 10;
    zmq_msg_init_size(&m, 2 * N * 4);
    memset(zmq_msg_data(&m), 0, 2 * N * 4);
    h.shard_floats = 2 * N;
    dt_wire_send(s, NULL, &h, &m, 0, NULL);
    CHECK(raw_reply(s, &in) == DT_OK && raw_error_says(&in, DT_WIRE_E_SHARD, "holds 64"));
    dt_wire_in_close(&in);

    /* Addressed to ps 1. */
    h = dt_wire_header_make(DT_MSG_STATUS, DT_ROLE_WORKER, 1, 11);
    h.shard = 1;
    dt_wire_send(s, NULL, &h, NULL, 0, NULL);
    CHECK(raw_reply(s, &in) == DT_OK && raw_error_says(&in, DT_WIRE_E_SHARD, "same order"));
    dt_wire_in_close(&in);

    /* A reply type sent as a request, the reserved TOKEN, an unknown type. */
    h = dt_wire_header_make(DT_MSG_WELCOME, DT_ROLE_WORKER, 1, 12);
    dt_wire_send(s, NULL, &h, NULL, 0, NULL);
    CHECK(raw_reply(s, &in) == DT_OK && raw_error_says(&in, DT_WIRE_E_MALFORMED, "reply"));
    dt_wire_in_close(&in);
    h = dt_wire_header_make(DT_MSG_TOKEN, DT_ROLE_WORKER, 1, 13);
    dt_wire_send(s, NULL, &h, NULL, 0, NULL);
    CHECK(raw_reply(s, &in) == DT_OK && raw_error_says(&in, DT_WIRE_E_UNSUPPORTED, "TOKEN"));
    dt_wire_in_close(&in);
    dt_wire_encode(hb, &h);
    hb[6] = 99;
    zmq_send(s, hb, sizeof hb, 0);
    CHECK(raw_reply(s, &in) == DT_OK && raw_error_says(&in, DT_WIRE_E_MALFORMED, "unknown message type 99"));
    dt_wire_in_close(&in);

    /* A non-chief SHUTDOWN is refused; the ps is still serving. */
    h = dt_wire_header_make(DT_MSG_SHUTDOWN, DT_ROLE_WORKER, 1, 14);
    dt_wire_send(s, NULL, &h, NULL, 0, NULL);
    CHECK(raw_reply(s, &in) == DT_OK && raw_error_says(&in, DT_WIRE_E_ROLE, "chief"));
    dt_wire_in_close(&in);
    h = dt_wire_header_make(DT_MSG_HEARTBEAT, DT_ROLE_WORKER, 1, 15);
    dt_wire_send(s, NULL, &h, NULL, 0, NULL);
    CHECK(raw_reply(s, &in) == DT_OK && in.hdr.type == DT_MSG_HEARTBEAT && in.hdr.request_id == 15);
    dt_wire_in_close(&in);

    /* A client expecting another shard size is refused at HELLO. */
    size_t wrong[1] = {N + 1};
    dt_ps_client *c = client(1, &ps, wrong, DT_ROLE_WORKER, 1);
    CHECK(c == NULL);
    zmq_close(s);
    zmq_ctx_term(ctx);
    CHECK(ps_stop(&ps) == DT_EINTR);
    CHECK(ps.stats.refused >= 10);
}

/* A ps of another protocol version (a fake one here) is refused by the client with both versions
 * named. */
static void *fake_ps_main(void *arg) {
    void *srv = arg;
    zmq_pollitem_t it = {.socket = srv, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, 3000) != 1) return NULL;
    zmq_msg_t id;
    zmq_msg_init(&id);
    zmq_msg_recv(&id, srv, 0);
    char drop[256];
    while (zmq_recv(srv, drop, sizeof drop, ZMQ_DONTWAIT) >= 0) {}
    dt_wire_header w = dt_wire_header_make(DT_MSG_WELCOME, DT_ROLE_PS, 0, 1);
    uint8_t hb[DT_WIRE_HEADER_SIZE];
    dt_wire_encode(hb, &w);
    hb[4] = DT_WIRE_VERSION + 1; /* a newer version */
    zmq_msg_send(&id, srv, ZMQ_SNDMORE);
    zmq_send(srv, hb, sizeof hb, 0);
    return NULL;
}

static void test_client_refuses_other_version(void) {
    void *ctx = zmq_ctx_new();
    void *srv = dt_zsock_open(ctx, ZMQ_ROUTER, 4096, 0, -1, NULL);
    zmq_bind(srv, "tcp://127.0.0.1:*");
    char ep[128];
    size_t len = sizeof ep;
    zmq_getsockopt(srv, ZMQ_LAST_ENDPOINT, ep, &len);
    pthread_t th;
    pthread_create(&th, NULL, fake_ps_main, srv);
    const char *eps[1] = {ep};
    size_t sizes[1] = {10};
    dt_ps_client_config cc = {.n_ps = 1, .endpoints = eps, .shard_floats = sizes, .role = DT_ROLE_WORKER,
                              .connect_timeout_ms = 3000, .request_timeout_ms = 3000};
    dt_ps_client *c = NULL;
    dt_error e = {0};
    CHECK(dt_ps_client_open(&c, &cc, &e) == DT_EPROTO);
    char newer[32], ours[32];
    snprintf(newer, sizeof newer, "version %u", DT_WIRE_VERSION + 1);
    snprintf(ours, sizeof ours, "version %u", DT_WIRE_VERSION);
    CHECK_CONTAINS(e.msg, newer);
    CHECK_CONTAINS(e.msg, ours);
    CHECK_CONTAINS(e.msg, ep);
    pthread_join(th, NULL);
    zmq_close(srv);
    zmq_ctx_term(ctx);
}

/* A PULL asking for a later step waits until a push gets the shard there. */
static void test_pull_waits_for_step(void) {
    enum { N = 32 };
    ps_thread ps;
    ps_start(&ps, 0, N, NULL, 0);
    size_t sizes[1] = {N};
    dt_ps_client *chief = client(1, &ps, sizes, DT_ROLE_CHIEF, 0);
    CHECK(chief != NULL);
    if (!chief) {
        ps_stop(&ps);
        return;
    }
    static float p[N], g[N];
    for (int i = 0; i < N; i++) p[i] = 1.0f, g[i] = 1.0f;
    const float *src[1] = {p};
    dt_opt_config opt;
    dt_opt_config_init(&opt, "sgd", 0.5f, NULL);
    dt_error e = {0};
    CHECK(dt_ps_client_init(chief, &opt, src, NULL, NULL, 3, &e) == DT_OK);
    void *ctx = zmq_ctx_new();
    void *s = raw_open(ctx, ps.endpoint);
    dt_wire_header h = dt_wire_header_make(DT_MSG_PULL, DT_ROLE_WORKER, 1, 21);
    h.global_step = 4;
    dt_wire_send(s, NULL, &h, NULL, 0, NULL);
    zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
    CHECK(zmq_poll(&it, 1, 200) == 0); /* deferred: the shard is at step 3 */
    const float *gs[1] = {g};
    CHECK(dt_ps_client_push_all(chief, gs, 3, NULL, &e) == DT_OK);
    dt_wire_in in;
    CHECK(raw_reply(s, &in) == DT_OK);
    CHECK(in.hdr.type == DT_MSG_PARAMS && in.hdr.global_step == 4 && in.hdr.request_id == 21);
    float got[N];
    if (zmq_msg_size(&in.payload) == sizeof got) memcpy(got, zmq_msg_data(&in.payload), sizeof got);
    CHECK(zmq_msg_size(&in.payload) == sizeof got && got[0] == 0.5f && got[N - 1] == 0.5f);
    dt_wire_in_close(&in);
    /* A deferred pull still waiting at shutdown is answered, not left hanging. */
    h.global_step = 100;
    h.request_id = 22;
    dt_wire_send(s, NULL, &h, NULL, 0, NULL);
    /* The ps handles one connection's requests in order: once this STATUS is answered, the PULL
     * is known to be waiting. */
    dt_wire_header q = dt_wire_header_make(DT_MSG_STATUS, DT_ROLE_WORKER, 1, 23);
    dt_wire_send(s, NULL, &q, NULL, 0, NULL);
    CHECK(raw_reply(s, &in) == DT_OK && in.hdr.type == DT_MSG_STATUS_REPLY && in.hdr.request_id == 23);
    dt_wire_in_close(&in);
    CHECK(dt_ps_client_shutdown(chief, &e) == DT_OK);
    CHECK(raw_reply(s, &in) == DT_OK && raw_error_says(&in, DT_WIRE_E_SHUTDOWN, "shutting down"));
    dt_wire_in_close(&in);
    zmq_close(s);
    zmq_ctx_term(ctx);
    dt_ps_client_close(chief);
    CHECK(ps_stop(&ps) == DT_OK);
}

/* Workers say DONE; the chief waits (bounded) until the expected number of distinct workers did. */
static void test_done_and_wait_done(void) {
    ps_thread ps[2];
    ps_start(&ps[0], 0, 10, NULL, 0);
    ps_start(&ps[1], 1, 20, NULL, 0);
    size_t sizes[2] = {10, 20};
    dt_ps_client *chief = client(2, ps, sizes, DT_ROLE_CHIEF, 0);
    dt_ps_client *w1 = client(2, ps, sizes, DT_ROLE_WORKER, 1);
    dt_ps_client *w2 = client(2, ps, sizes, DT_ROLE_WORKER, 2);
    CHECK(chief && w1 && w2);
    dt_error e = {0};
    if (chief && w1 && w2) {
        CHECK(dt_ps_client_wait_done(chief, 0, 0, &e) == DT_OK);
        int64_t t0 = dt_clock_us() / 1000;
        CHECK(dt_ps_client_wait_done(chief, 2, 200, &e) == DT_ETIMEOUT);
        CHECK((dt_clock_us() / 1000) - t0 < 2000);
        CHECK_CONTAINS(e.msg, "only 0 of 2 worker(s) finished");
        CHECK(dt_ps_client_done(w1, 0, &e) == DT_OK);
        CHECK(dt_ps_client_done(w1, 0, &e) == DT_OK); /* a resent DONE counts once */
        CHECK(dt_ps_client_wait_done(chief, 2, 200, &e) == DT_ETIMEOUT);
        CHECK_CONTAINS(e.msg, "only 1 of 2");
        CHECK(dt_ps_client_done(w2, 0, &e) == DT_OK);
        CHECK(dt_ps_client_wait_done(chief, 2, 2000, &e) == DT_OK);
        dt_ps_shard_status st[2];
        CHECK(dt_ps_client_status(chief, st, &e) == DT_OK);
        CHECK(st[0].workers_done == 2 && st[1].workers_done == 2);
    }
    dt_ps_client_close(chief);
    dt_ps_client_close(w1);
    dt_ps_client_close(w2);
    ps_stop(&ps[0]);
    ps_stop(&ps[1]);
}

/* A checkpoint round trip: FETCH returns each shard's parameters, Adam state and step exactly as a
 * local replica computes them; a fresh ps INITed from that (a restore) continues bit for bit. */
static void test_fetch_state_and_restore(void) {
    enum { N0 = 500, N1 = 300 };
    ps_thread ps[2];
    ps_start(&ps[0], 0, N0, NULL, 0);
    ps_start(&ps[1], 1, N1, NULL, 0);
    size_t sizes[2] = {N0, N1};
    dt_ps_client *c = client(2, ps, sizes, DT_ROLE_CHIEF, 0);
    dt_ps_client *w = client(2, ps, sizes, DT_ROLE_WORKER, 1);
    CHECK(c && w);
    if (!c || !w) goto out;
    static float p0[N0], p1[N1], s0[2 * N0], s1[2 * N1], g0[N0], g1[N1];
    static float f0[N0], f1[N1], fs0[2 * N0], fs1[2 * N1];
    float *fp[2] = {f0, f1}, *fs[2] = {fs0, fs1};
    dt_opt_config adam, sgd;
    dt_opt_config_init(&adam, "adam", 0.01f, NULL);
    dt_opt_config_init(&sgd, "sgd", 0.01f, NULL);
    dt_error e = {0};
    CHECK(dt_ps_client_fetch_state(w, &adam, fp, fs, NULL, NULL, &e) == DT_EPROTO);
    CHECK_CONTAINS(e.msg, "not initialised");
    fill(p0, N0, 1.0f, 7);
    fill(p1, N1, 1.0f, 8);
    fill(s0, 2 * N0, 0.01f, 9);
    fill(s1, 2 * N1, 0.01f, 10);
    for (int i = 0; i < 2 * N0; i++) s0[i] = fabsf(s0[i]);
    for (int i = 0; i < 2 * N1; i++) s1[i] = fabsf(s1[i]);
    const float *src[2] = {p0, p1}, *st[2] = {s0, s1}, *gs[2] = {g0, g1};
    CHECK(dt_ps_client_init(c, &adam, src, st, NULL, 7, &e) == DT_OK);
    for (int t = 0; t < 3; t++) {
        fill(g0, N0, 0.5f, 300 + t);
        fill(g1, N1, 0.5f, 400 + t);
        CHECK_MSG(dt_ps_client_push_all(w, gs, 7 + t, NULL, &e) == DT_OK, "%s", e.msg);
        dt_opt_apply(&adam, p0, g0, s0, NULL, N0, 7 + t);
        dt_opt_apply(&adam, p1, g1, s1, NULL, N1, 7 + t);
    }
    int64_t steps[2] = {-1, -1};
    CHECK(dt_ps_client_fetch_state(w, &adam, fp, fs, steps, NULL, &e) == DT_OK); /* any role may read */
    CHECK(steps[0] == 10 && steps[1] == 10);
    CHECK(memcmp(f0, p0, sizeof p0) == 0 && memcmp(f1, p1, sizeof p1) == 0);
    CHECK(memcmp(fs0, s0, sizeof s0) == 0 && memcmp(fs1, s1, sizeof s1) == 0);
    CHECK(dt_ps_client_fetch_state(w, &adam, fp, NULL, NULL, NULL, &e) == DT_OK); /* parameters only */
    CHECK(dt_ps_client_fetch_state(w, &sgd, fp, NULL, NULL, NULL, &e) == DT_EPROTO);
    CHECK_CONTAINS(e.msg, "holds adam optimizer state, the caller expects sgd");
    CHECK(strstr(e.msg, ps[0].endpoint) || strstr(e.msg, ps[1].endpoint)); /* names the ps */

    /* Restore into fresh ps tasks (a restarted cluster) and take one more step on both sides. */
    dt_ps_client_close(c);
    dt_ps_client_close(w);
    c = w = NULL;
    ps_stop(&ps[0]);
    ps_stop(&ps[1]);
    ps_start(&ps[0], 0, N0, NULL, 0);
    ps_start(&ps[1], 1, N1, NULL, 0);
    c = client(2, ps, sizes, DT_ROLE_CHIEF, 0);
    CHECK(c != NULL);
    if (!c) goto out;
    const float *rp[2] = {f0, f1}, *rs[2] = {fs0, fs1};
    CHECK(dt_ps_client_init(c, &adam, rp, rs, NULL, steps[0], &e) == DT_OK);
    fill(g0, N0, 0.5f, 500);
    fill(g1, N1, 0.5f, 501);
    dt_push_result res;
    CHECK(dt_ps_client_push_all(c, gs, 10, &res, &e) == DT_OK);
    CHECK(res.global_step == 11);
    dt_opt_apply(&adam, p0, g0, s0, NULL, N0, 10);
    dt_opt_apply(&adam, p1, g1, s1, NULL, N1, 10);
    CHECK(dt_ps_client_fetch_state(c, &adam, fp, fs, steps, NULL, &e) == DT_OK);
    CHECK(steps[0] == 11 && steps[1] == 11);
    CHECK(memcmp(f0, p0, sizeof p0) == 0 && memcmp(f1, p1, sizeof p1) == 0);
    CHECK(memcmp(fs0, s0, sizeof s0) == 0 && memcmp(fs1, s1, sizeof s1) == 0);
out:
    dt_ps_client_close(c);
    dt_ps_client_close(w);
    ps_stop(&ps[0]);
    ps_stop(&ps[1]);
}

/* A pull the ps holds (here until step 4) keeps the worker heard for the whole wait, however many
 * poll rounds it takes: afterwards dt_ps_client_silent_ms is near 0, not the length of a round. */
typedef struct {
    dt_ps_client *c;
    float *dst;
    int rc;
} held_pull;

static void *held_pull_main(void *arg) {
    held_pull *h = arg;
    float *dst[1] = {h->dst};
    dt_error e = {0};
    h->rc = dt_ps_client_pull_all(h->c, dst, 4, NULL, &e);
    return NULL;
}

static void test_held_pull_is_not_silence(void) {
    enum { N = 32 };
    ps_thread ps;
    ps_start(&ps, 0, N, NULL, 0);
    size_t sizes[1] = {N};
    dt_ps_client *chief = client(1, &ps, sizes, DT_ROLE_CHIEF, 0);
    dt_ps_client *w = client(1, &ps, sizes, DT_ROLE_WORKER, 1);
    CHECK(chief && w);
    static float p[N], g[N], got[N];
    const float *src[1] = {p}, *gs[1] = {g};
    dt_opt_config opt;
    dt_opt_config_init(&opt, "sgd", 0.5f, NULL);
    dt_error e = {0};
    if (chief && w && dt_ps_client_init(chief, &opt, src, NULL, NULL, 3, &e) == DT_OK) {
        held_pull h = {.c = w, .dst = got, .rc = -1};
        pthread_t th;
        pthread_create(&th, NULL, held_pull_main, &h);
        sleep_ms(1500); /* more than one of the client's poll rounds (1 s) */
        CHECK(dt_ps_client_push_all(chief, gs, 3, NULL, &e) == DT_OK);
        pthread_join(th, NULL);
        CHECK(h.rc == DT_OK);
        CHECK_MSG(dt_ps_client_silent_ms(w) < 300, "%lld ms after a pull held 1.5 s",
                  (long long)dt_ps_client_silent_ms(w));
    } else {
        CHECK(0);
    }
    dt_ps_client_close(w);
    dt_ps_client_close(chief);
    ps_stop(&ps);
}

/* ---------- forked ps processes: exit statuses ---------- */

static volatile sig_atomic_t child_stop;
static int child_fd = -1;
static void on_term(int sig) { (void)sig; child_stop = 1; }
static void child_on_bound(void *user, const char *ep) {
    (void)user;
    (void)!write(child_fd, ep, strlen(ep));
    close(child_fd);
    child_fd = -1;
}

/* Forks a ps serving n floats on a free port; the child sends its endpoint back through a pipe
 * and exits 0 on SHUTDOWN or SIGTERM/SIGINT, 1 on any failure. */
static pid_t fork_ps(size_t n, char *endpoint, size_t cap) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        child_fd = fds[1];
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_term;
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
        alarm(20); /* never outlive a broken parent */
        dt_ps_config cfg = {.endpoint = "tcp://127.0.0.1:*", .shard_floats = n, .poll_ms = 1000,
                            .stop = &child_stop, .on_bound = child_on_bound};
        dt_error e = {0};
        int rc = dt_ps_serve(&cfg, &e);
        if (rc != DT_OK && rc != DT_EINTR) fprintf(stderr, "child ps: %s\n", e.msg);
        _exit(rc == DT_OK || rc == DT_EINTR ? 0 : 1);
    }
    close(fds[1]);
    size_t len = 0;
    int64_t end = (dt_clock_us() / 1000) + 5000;
    while (len + 1 < cap && (dt_clock_us() / 1000) < end) {
        struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
        if (poll(&pfd, 1, 100) <= 0) continue;
        ssize_t r = read(fds[0], endpoint + len, cap - 1 - len);
        if (r <= 0) break;
        len += (size_t)r;
    }
    endpoint[len] = '\0';
    close(fds[0]);
    if (pid > 0 && len == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    return pid;
}

/* The child's exit status, or -1 if it did not exit within ms (it is then killed and reaped). */
static int wait_exit(pid_t pid, int ms) {
    int status = 0;
    for (int i = 0; i < ms / 10; i++) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        sleep_ms(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

/* A forked ps of 50 floats (*pid, its endpoint in ep) and a client of it with the given role and
 * request timeout; NULL (and *pid <= 0 if the fork failed) when either is not up: a failed check. */
static dt_ps_client *forked_ps_client(pid_t *pid, char *ep, size_t cap, dt_wire_role role, int task, int req_ms) {
    *pid = fork_ps(50, ep, cap);
    CHECK(*pid > 0);
    if (*pid <= 0) return NULL;
    ps_thread fake; /* only .endpoint is read by client() */
    snprintf(fake.endpoint, sizeof fake.endpoint, "%s", ep);
    size_t sizes[1] = {50};
    request_ms = req_ms;
    dt_ps_client *c = client(1, &fake, sizes, role, task);
    request_ms = 3000;
    CHECK(c != NULL);
    return c;
}

/* The chief's SHUTDOWN ends the ps process with status 0 (the source's ps never exits). */
static void test_fork_shutdown_exits_0(void) {
    char ep[128];
    pid_t pid;
    /* The last check waits for the request timeout. */
    dt_ps_client *c = forked_ps_client(&pid, ep, sizeof ep, DT_ROLE_CHIEF, 0, 1000);
    if (pid <= 0) return;
    dt_error e = {0};
    static float p[50];
    const float *src[1] = {p};
    dt_opt_config opt;
    dt_opt_config_init(&opt, "adam", 1e-3f, NULL);
    if (c) {
        CHECK(dt_ps_client_init(c, &opt, src, NULL, NULL, 0, &e) == DT_OK);
        CHECK_MSG(dt_ps_client_shutdown(c, &e) == DT_OK, "%s", e.msg);
    }
    int64_t t0 = dt_clock_us() / 1000;
    CHECK(wait_exit(pid, 5000) == 0);
    CHECK((dt_clock_us() / 1000) - t0 < 3000);
    /* Nobody answers any more: the next request fails within the request timeout, naming the ps. */
    if (c) {
        CHECK(dt_ps_client_status(c, NULL, &e) == DT_ETIMEOUT);
        CHECK_CONTAINS(e.msg, ep);
    }
    dt_ps_client_close(c);
}

/* SIGTERM ends a ps cleanly (the caller's handler sets the stop flag) and promptly, even with a
 * long poll interval. */
static void test_fork_sigterm_exits_0(void) {
    char ep[128];
    pid_t pid;
    dt_ps_client *c = forked_ps_client(&pid, ep, sizeof ep, DT_ROLE_WORKER, 1, 3000);
    if (pid <= 0) return;
    dt_ps_client_close(c);
    int64_t t0 = dt_clock_us() / 1000;
    kill(pid, SIGTERM);
    CHECK(wait_exit(pid, 5000) == 0);
    CHECK((dt_clock_us() / 1000) - t0 < 2000);
}

/* dt_ps_client_silent_ms: a silence (this process stopped, or busy) is forgotten only when the ps
 * answers a request sent after it. A request sent after the ps died is only queued (libzmq
 * reconnects), and waiting for its reply must not count as having been heard: a strict sync ps
 * that timed the worker out meanwhile has stopped the job (what test_strict_stopped.sh saw). */
static void test_silence_outlives_a_queued_request(void) {
    char ep[128];
    pid_t pid;
    dt_ps_client *c = forked_ps_client(&pid, ep, sizeof ep, DT_ROLE_CHIEF, 0, 1000);
    if (pid <= 0) return;
    dt_error e = {0};
    if (c) {
        sleep_ms(600);
        CHECK(dt_ps_client_silent_ms(c) >= 600);
        CHECK_MSG(dt_ps_client_status(c, NULL, &e) == DT_OK, "%s", e.msg);
        CHECK_MSG(dt_ps_client_silent_ms(c) < 300, "%lld ms after an answer", (long long)dt_ps_client_silent_ms(c));
        sleep_ms(1200);
        kill(pid, SIGKILL);
        CHECK(wait_exit(pid, 5000) == 128 + SIGKILL);
        pid = -1;
        int64_t t0 = dt_clock_us() / 1000;
        CHECK(dt_ps_client_status(c, NULL, &e) == DT_ETIMEOUT);
        CHECK((dt_clock_us() / 1000) - t0 >= 900); /* it was queued and waited for, not refused at once */
        CHECK_MSG(dt_ps_client_silent_ms(c) >= 1200, "%lld ms", (long long)dt_ps_client_silent_ms(c));
    }
    dt_ps_client_close(c);
    if (pid > 0) wait_exit(pid, 0);
}

/* The work coordinator over ZeroMQ (docs/elastic.md): ps 0 takes the largest coordinator state
 * there can be (3,178,568 bytes: 2^18 units, each partly trained) in one frame and gives it back
 * byte for byte; then a small plan, a grant, a claim; ps 1 refuses WORK messages. */
static void test_work_over_zeromq(void) {
    enum { N = 64 };
    ps_thread ps, ps1;
    dt_metrics *reg = NULL;
    CHECK(dt_metrics_create(&reg, "ps", 0, NULL) == DT_OK);
    ps_metrics = reg;
    ps_start(&ps, 0, N, NULL, 0);
    ps_metrics = NULL;
    ps_start(&ps1, 1, N, NULL, 0);
    void *ctx = zmq_ctx_new();
    void *s = dt_zsock_open(ctx, ZMQ_DEALER, dt_wire_max_frame_ps0(N), 0, 2000, NULL);
    zmq_connect(s, ps.endpoint);
    size_t units = 1u << 18, size = DT_COORD_MAX_STATE_BYTES;
    zmq_msg_t m;
    zmq_msg_init_size(&m, size);
    uint8_t *b = zmq_msg_data(&m);
    memset(b, 0, size);
    memcpy(b, "DTCOORD2", 8);
    dt_put_u64(b + 8, 2 * units); /* examples: batches of 1 in units of 2 */
    dt_put_u32(b + 40, 1), dt_put_u32(b + 44, 2), dt_put_u32(b + 48, 4), dt_put_u32(b + 52, 2);
    dt_put_u32(b + 64, (uint32_t)units), dt_put_u32(b + 68, (uint32_t)units);
    for (size_t u = 0; u < units; u++) { /* partial entries: unit u, batch mask 0x1 */
        dt_put_u32(b + 72 + units / 8 + 12 * u, (uint32_t)u);
        b[72 + units / 8 + 12 * u + 4] = 1;
    }
    uint8_t *copy = malloc(size);
    memcpy(copy, b, size);
    dt_wire_header h = dt_wire_header_make(DT_MSG_WORK_STATE, DT_ROLE_CHIEF, 0, 30);
    CHECK(dt_wire_send(s, NULL, &h, &m, 0, NULL) == DT_OK);
    dt_wire_in in;
    CHECK(raw_reply(s, &in) == DT_OK && in.hdr.type == DT_MSG_ACK && in.hdr.request_id == 30);
    dt_wire_in_close(&in);
    h = dt_wire_header_make(DT_MSG_WORK_STATE, DT_ROLE_CHIEF, 0, 31); /* fetch */
    CHECK(dt_wire_send(s, NULL, &h, NULL, 0, NULL) == DT_OK);
    CHECK(raw_reply(s, &in) == DT_OK && in.hdr.type == DT_MSG_WORK_STATE && zmq_msg_size(&in.payload) == size);
    CHECK(zmq_msg_size(&in.payload) == size && memcmp(zmq_msg_data(&in.payload), copy, size) == 0);
    dt_wire_in_close(&in);
    /* A worker asks: the first partial unit, its second batch; claims it. */
    h = dt_wire_header_make(DT_MSG_WORK_ASK, DT_ROLE_WORKER, 1, 32);
    h.flags = DT_WIRE_F_JOIN, h.work_ask.examples = 2 * units, h.work_ask.batch_size = 1;
    CHECK(dt_wire_send(s, NULL, &h, NULL, 0, NULL) == DT_OK);
    CHECK(raw_reply(s, &in) == DT_OK && in.hdr.type == DT_MSG_WORK_GRANT && in.hdr.status == DT_WIRE_OK);
    CHECK(in.hdr.work_grant.unit == 0 && in.hdr.work_grant.mask == 2);
    dt_wire_in_close(&in);
    h = dt_wire_header_make(DT_MSG_WORK_DONE, DT_ROLE_WORKER, 1, 33);
    h.work_done.batch = 0; /* counted already */
    CHECK(dt_wire_send(s, NULL, &h, NULL, 0, NULL) == DT_OK);
    CHECK(raw_reply(s, &in) == DT_OK && raw_error_says(&in, DT_WIRE_E_BAD_VALUE, "batch 0 of epoch 0 is already counted"));
    dt_wire_in_close(&in);
    h.work_done.batch = 1, h.request_id = 34;
    CHECK(dt_wire_send(s, NULL, &h, NULL, 0, NULL) == DT_OK);
    CHECK(raw_reply(s, &in) == DT_OK && in.hdr.type == DT_MSG_ACK && in.hdr.status == DT_WIRE_OK);
    dt_wire_in_close(&in);
    /* ps 0 publishes the coordinator's counts once per round (poll_ms 20). */
    double held = -1;
    for (int k = 0; k < 100 && held != 1; k++, sleep_ms(10)) held = dt_metrics_lookup(reg, "dtrain_work_units", "state=\"held\"");
    CHECK(held == 1);
    CHECK(dt_metrics_lookup(reg, "dtrain_work_units", "state=\"pool\"") == (double)units - 1);
    CHECK(dt_metrics_lookup(reg, "dtrain_work_live_workers", NULL) == 1);
    CHECK(dt_metrics_lookup(reg, "dtrain_work_refused_total", NULL) == 1);
    CHECK(dt_metrics_lookup(reg, "dtrain_work_joins_total", NULL) == 1);
    void *s1 = raw_open(ctx, ps1.endpoint);
    h = dt_wire_header_make(DT_MSG_WORK_ASK, DT_ROLE_WORKER, 1, 35);
    h.shard = 1;
    CHECK(dt_wire_send(s1, NULL, &h, NULL, 0, NULL) == DT_OK);
    CHECK(raw_reply(s1, &in) == DT_OK && raw_error_says(&in, DT_WIRE_E_UNSUPPORTED, "the work coordinator is ps 0"));
    dt_wire_in_close(&in);
    zmq_close(s1);
    zmq_close(s);
    zmq_ctx_term(ctx);
    free(copy);
    CHECK(ps_stop(&ps) == DT_EINTR && ps_stop(&ps1) == DT_EINTR);
    dt_metrics_free(reg);
}

/* The worker's WORK calls (worker/work_client.h) through the client's exchange core, with two
 * ps: before the plan an ask is refused; the chief installs a plan on ps 0; a worker is granted a
 * unit and claims a batch, and while the claim's answer is due the client refuses any other call;
 * another worker claiming that unit's batch, and a claim of a batch counted already, are refused
 * naming why; the fetched state says which batch counted. */
static void test_work_client(void) {
    enum { N = 64 };
    ps_thread ps[2];
    ps_start(&ps[0], 0, N, NULL, 0);
    ps_start(&ps[1], 1, N, NULL, 0);
    size_t sizes[2] = {N, N};
    dt_ps_client *chief = client(2, ps, sizes, DT_ROLE_CHIEF, 0), *w1 = client(2, ps, sizes, DT_ROLE_WORKER, 1),
                 *w2 = client(2, ps, sizes, DT_ROLE_WORKER, 2);
    static float p[N], g[N];
    const float *src[2] = {p, p}, *gs[2] = {g, g};
    dt_opt_config opt;
    dt_opt_config_init(&opt, "sgd", 0.1f, NULL);
    dt_error e = {0};
    CHECK(chief && w1 && w2 && dt_ps_client_init(chief, &opt, src, NULL, NULL, 0, &e) == DT_OK);
    dt_work_data d = {.examples = 16, .batch_size = 2, .seed = 5};
    dt_work_grant gr;
    CHECK(dt_work_ask(w1, &d, 1, &gr, &e) == DT_EPROTO && dt_ps_client_last_refusal(w1) == DT_WIRE_E_NOT_READY);
    CHECK_CONTAINS(e.msg, "no work plan yet");
    dt_coord_plan plan = {.examples = 16, .seed = 5, .epochs = 1, .batch_size = 2, .unit_batches = 4, .max_workers = 3,
                          .max_held = 2};
    dt_coord *co = NULL;
    CHECK(dt_coord_new(&co, &plan, NULL, &e) == DT_OK);
    size_t n = co ? dt_coord_state_size(co) : 0;
    uint8_t *st = malloc(n ? n : 1);
    if (co) dt_coord_save(co, st);
    dt_coord_free(co);
    CHECK(dt_work_state_put(chief, st, n, &e) == DT_OK);
    free(st);
    CHECK(dt_work_ask(w1, &d, 1, &gr, &e) == DT_OK && gr.answer == DT_WORK_GRANTED && gr.unit == 0 && gr.mask == 0xf);
    CHECK(dt_work_ask(w2, &d, 1, &gr, &e) == DT_OK && gr.answer == DT_WORK_GRANTED && gr.unit == 1);
    CHECK(dt_work_claim_send(w1, 0, 0, 0, &e) == DT_OK);
    CHECK(dt_ps_client_status(w1, NULL, &e) == DT_EINVAL); /* one call at a time: the claim's answer is due */
    int stale = -1;
    CHECK(dt_work_claim_answer(w1, &stale, &e) == DT_OK && stale == 0);
    CHECK(dt_ps_client_push_all(w1, gs, 0, NULL, &e) == DT_OK); /* applied on ps 0's chunk 0: batch 0 counts */
    CHECK(dt_work_claim_send(w2, 0, 1, 0, &e) == DT_OK);
    CHECK(dt_work_claim_answer(w2, &stale, &e) == DT_EPROTO);
    CHECK_CONTAINS(e.msg, "worker 2 does not hold unit 0 of epoch 0 (held by worker 1)");
    CHECK(dt_work_claim_send(w1, 0, 0, 1, &e) == DT_OK && dt_work_claim_answer(w1, &stale, &e) == DT_EPROTO);
    CHECK_CONTAINS(e.msg, "batch 0 of epoch 0 is already counted");
    const void *got = NULL;
    size_t len = 0;
    int64_t step = -1;
    CHECK(dt_work_state_get(chief, &got, &len, &step, &e) == DT_OK);
    CHECK(len == 72 + 1 + 12 && step == 1); /* unit 0 partly trained: batch 0 (mask 0x1) */
    CHECK(got && len == 85 && ((const uint8_t *)got)[73] == 0 && ((const uint8_t *)got)[77] == 1);
    dt_ps_client_close(chief), dt_ps_client_close(w1), dt_ps_client_close(w2);
    CHECK(ps_stop(&ps[0]) == DT_EINTR && ps_stop(&ps[1]) == DT_EINTR);
    CHECK(ps[1].stats.refused == 0); /* ps 1 never saw a WORK message */
}

int main(void) {
    /* Forking tests first, while this process has no threads or ZeroMQ contexts. */
    RUN(test_fork_shutdown_exits_0);
    RUN(test_fork_sigterm_exits_0);
    RUN(test_silence_outlives_a_queued_request);
    RUN(test_init_then_pull);
    RUN(test_async_sgd_exact);
    RUN(test_async_adam_exact);
    RUN(test_concurrent_pushes_counted);
    RUN(test_client_before_ps);
    RUN(test_no_ps_times_out);
    RUN(test_ps_refusals);
    RUN(test_client_refuses_other_version);
    RUN(test_pull_waits_for_step);
    RUN(test_held_pull_is_not_silence);
    RUN(test_done_and_wait_done);
    RUN(test_fetch_state_and_restore);
    RUN(test_work_over_zeromq);
    RUN(test_work_client);
    /* Again with shards cut into chunks of 28 bytes (7 floats): each chunk is applied on its own,
     * and the results must be the same bit for bit. */
    chunk_bytes = 28;
    fprintf(stderr, "-- the same, in chunks of %lld bytes\n", (long long)chunk_bytes);
    RUN(test_init_then_pull);
    RUN(test_async_sgd_exact);
    RUN(test_async_adam_exact);
    RUN(test_concurrent_pushes_counted);
    RUN(test_fetch_state_and_restore);
    return test_summary();
}
