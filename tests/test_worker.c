/* The worker's side of the parameter servers (src/worker/): gradient buffers are the caller's
 * again whenever a push returns, even a failed one (no torn gradient reaches a slow or restarted
 * ps), and non-finite parameters pulled from a ps are refused naming the ps, the step and the
 * parameter. Fake ps tasks are raw ROUTER sockets in threads; real ones run in threads as in
 * test_ps.c. Every wait is bounded. */
#include <pthread.h>
#include <stdatomic.h>
#include <zmq.h>

#include "cluster/cluster.h"
#include "cluster/placement.h"
#include "compute/optim.h"
#include "core/clock.h"
#include "core/error.h"
#include "model/net.h"
#include "model/spec.h"
#include "ps_harness.h"
#include "worker/remote.h"

static const float MARKER = -777.25f; /* written over a gradient after its push failed */

static int has_marker(const void *payload, size_t bytes) {
    const unsigned char *b = payload;
    for (size_t k = 0; k + sizeof(float) <= bytes; k += sizeof(float)) {
        float v;
        memcpy(&v, b + k, sizeof v);
        if (v == MARKER) return 1;
    }
    return 0;
}

/* ---------- a fake ps that stops reading ---------- */

typedef struct {
    void *srv;
    size_t n;
    atomic_int read_again;    /* set by the test: read (and answer STATUS) from now on */
    int welcomed, statuses, pushes, torn;
} stall_ps;

/* The reply of an initialised ps that cuts its shard into one chunk: a client that knows the cut
 * pushes at once (one that does not asks STATUS first, which this ps leaves unanswered). */
static void reply(void *srv, zmq_msg_t *id, const dt_wire_header *req, dt_msg_type type, size_t n) {
    dt_wire_header r = dt_wire_header_make(type, DT_ROLE_PS, 0, req->request_id);
    r.shard_floats = n;
    r.generation = 1;
    r.chunks = 1;
    dt_wire_send(srv, id, &r, NULL, ZMQ_DONTWAIT, NULL);
}

/* Answers HELLO, then reads nothing until read_again: its queue (RCVHWM 1) fills with the first
 * request and its small kernel buffer with the start of the next, so a large PUSH stalls half
 * sent. Then reads everything for a while, looking for the marker in every PUSH payload. */
static void *stall_main(void *arg) {
    stall_ps *f = arg;
    zmq_pollitem_t it = {.socket = f->srv, .events = ZMQ_POLLIN};
    while (!f->welcomed && zmq_poll(&it, 1, 3000) == 1) {
        dt_wire_in in;
        if (dt_wire_recv(f->srv, 1, &in, NULL) == DT_OK && in.hdr.type == DT_MSG_HELLO) {
            reply(f->srv, &in.identity, &in.hdr, DT_MSG_WELCOME, f->n);
            f->welcomed = 1;
        }
        dt_wire_in_close(&in);
    }
    for (int i = 0; i < 1000 && !atomic_load(&f->read_again); i++) sleep_ms(10);
    int64_t end = (dt_clock_us() / 1000) + 1500;
    while ((dt_clock_us() / 1000) < end) {
        if (zmq_poll(&it, 1, 50) != 1) continue;
        dt_wire_in in;
        int rc = dt_wire_recv(f->srv, 1, &in, NULL);
        if (rc == DT_OK && in.hdr.type == DT_MSG_PUSH) {
            f->pushes++;
            f->torn += has_marker(zmq_msg_data(&in.payload), zmq_msg_size(&in.payload));
        } else if (rc == DT_OK && in.hdr.type == DT_MSG_STATUS) {
            f->statuses++;
            reply(f->srv, &in.identity, &in.hdr, DT_MSG_STATUS_REPLY, 0);
        }
        dt_wire_in_close(&in);
    }
    return NULL;
}

/* A push that fails while its gradient is half sent to a ps that does not read: once the call
 * has returned, the test overwrites the gradient, and the ps must never receive the new values
 * (before the fix libzmq went on sending the rest from the caller's reused buffer: a torn
 * gradient). The client then still works: its socket was replaced. */
static void test_failed_push_releases_gradient(void) {
    enum { N = 4 << 20 }; /* 16 MB: more than the kernel's socket buffers hold */
    void *ctx = zmq_ctx_new();
    stall_ps f = {.n = N};
    atomic_init(&f.read_again, 0);
    f.srv = dt_zsock_open(ctx, ZMQ_ROUTER, dt_wire_max_frame(N), 0, 1000, NULL);
    int hwm = 1, rcvbuf = 64 << 10;
    zmq_setsockopt(f.srv, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(f.srv, ZMQ_RCVBUF, &rcvbuf, sizeof rcvbuf);
    CHECK(zmq_bind(f.srv, "tcp://127.0.0.1:*") == 0);
    ps_thread ps;
    memset(&ps, 0, sizeof ps);
    size_t len = sizeof ps.endpoint;
    zmq_getsockopt(f.srv, ZMQ_LAST_ENDPOINT, ps.endpoint, &len);
    pthread_t th;
    pthread_create(&th, NULL, stall_main, &f);

    size_t sizes[1] = {N};
    int saved = request_ms;
    request_ms = 400;
    dt_ps_client *c = client(1, &ps, sizes, DT_ROLE_WORKER, 1);
    request_ms = saved;
    CHECK(c != NULL);
    float *g = dt_alloc_floats(N, "gradient", NULL);
    if (!c || !g) goto out;
    for (size_t i = 0; i < N; i++) g[i] = 1.0f;
    dt_error e = {0};
    /* Unanswered, and left in the ps's queue: the queue is full from now on. */
    CHECK(dt_ps_client_status(c, NULL, &e) == DT_ETIMEOUT);
    const float *gs[1] = {g};
    int64_t t0 = dt_clock_us() / 1000;
    CHECK(dt_ps_client_push_all(c, gs, 0, NULL, &e) == DT_ETIMEOUT);
    CHECK_CONTAINS(e.msg, "PUSH: no reply"); /* the push itself went out and stalled */
    CHECK_MSG((dt_clock_us() / 1000) - t0 < 3000, "the failed push took %lld ms", (long long)((dt_clock_us() / 1000) - t0));
    /* The contract: the buffer is the caller's again. */
    for (size_t i = 0; i < N; i++) g[i] = MARKER;
    atomic_store(&f.read_again, 1);
    sleep_ms(300);
    /* The socket that held the frame was replaced and reconnected: the ps answers it. */
    CHECK_MSG(dt_ps_client_status(c, NULL, &e) == DT_OK, "%s", e.msg);
out:
    pthread_join(th, NULL);
    CHECK(f.welcomed == 1);
    CHECK_MSG(f.torn == 0, "%d of %d PUSH payload(s) received carry values written after the push returned",
              f.torn, f.pushes);
    CHECK(f.statuses >= 1);
    dt_ps_client_close(c);
    free(g);
    zmq_close(f.srv);
    zmq_ctx_term(ctx);
}

/* A push to a ps that is down stays queued in libzmq (a DEALER sends it once the ps is back): the
 * failed call must take it back, or the restarted ps gets a gradient the caller has since
 * overwritten. Here the restarted ps, not initialised, would refuse it: it must see no PUSH. */
static void test_push_to_dead_ps_not_sent_later(void) {
    enum { N = 1000 };
    int port = free_port();
    CHECK(port > 0);
    char bind_ep[64];
    snprintf(bind_ep, sizeof bind_ep, "tcp://127.0.0.1:%d", port);
    ps_thread ps;
    ps_start(&ps, 0, N, bind_ep, 0);
    size_t sizes[1] = {N};
    int saved = request_ms;
    request_ms = 300;
    dt_ps_client *c = client(1, &ps, sizes, DT_ROLE_CHIEF, 0);
    request_ms = saved;
    CHECK(c != NULL);
    if (!c) {
        ps_stop(&ps);
        return;
    }
    static float p[N], g[N];
    fill(p, N, 1.0f, 1);
    fill(g, N, 0.5f, 2);
    const float *src[1] = {p}, *gs[1] = {g};
    dt_opt_config opt;
    dt_opt_config_init(&opt, "sgd", 0.1f, NULL);
    dt_error e = {0};
    CHECK(dt_ps_client_init(c, &opt, src, NULL, NULL, 0, &e) == DT_OK);
    CHECK(ps_stop(&ps) == DT_EINTR);
    CHECK(dt_ps_client_push_all(c, gs, 0, NULL, &e) == DT_ETIMEOUT);
    for (int i = 0; i < N; i++) g[i] = MARKER;
    ps_start(&ps, 0, N, bind_ep, 0);
    /* The client reconnects (backoff up to 1 s); its STATUS proves the ps is reached. */
    int64_t until = (dt_clock_us() / 1000) + 3000;
    int rc;
    while ((rc = dt_ps_client_status(c, NULL, &e)) != DT_OK && (dt_clock_us() / 1000) < until) {}
    CHECK_MSG(rc == DT_OK, "%s", e.msg);
    dt_ps_client_close(c);
    CHECK(ps_stop(&ps) == DT_EINTR);
    CHECK_MSG(ps.stats.refused == 0, "the restarted ps got %llu refused request(s): the old PUSH",
              (unsigned long long)ps.stats.refused);
}

/* ---------- non-finite parameters ---------- */

/* The dense kernel (48 x 400 floats) is large enough that its last float lies past the first block
 * a pulled chunk is unpacked and checked in (ps_client.c, SCAN_BLOCK). */
static const char *MODEL = "model small\ninput 6 6 1\nconv2d filters=3 kernel=3\nrelu\nflatten\ndense units=400\n";

/* A real ps made to hold -inf (SGD with a gradient whose update overflows): the worker's pull
 * fails naming the ps, its address, the step and the parameter, instead of training on until the
 * loss is NaN. */
static void test_nonfinite_params_named(void) {
    setenv("DTRAIN_IPC", "0", 1); /* the ps threads listen on TCP only */
    dt_error e = {0};
    dt_model_spec spec;
    dt_net *net = NULL;
    CHECK(dt_model_spec_parse(&spec, MODEL, strlen(MODEL), "small.model", &e) == 0);
    CHECK_MSG(dt_net_build(&net, &spec, 2, &e) == 0, "%s", e.msg);
    dt_model_spec_free(&spec);
    int ports[3] = {free_port(), free_port(), free_port()};
    dt_cluster cl;
    dt_placement pl;
    memset(&pl, 0, sizeof pl);
    CHECK_MSG(dt_cluster_local(&cl, 2, 1, ports, DT_JOB_WORKER, 0, &e) == 0, "%s", e.msg);
    CHECK_MSG(dt_placement_compute(&pl, dt_net_view(net, 0), dt_net_num_views(net), 2, DT_PLACE_GREEDY, &e) == 0,
              "%s", e.msg);
    ps_thread ps[2];
    for (int i = 0; i < 2; i++) {
        char ep[64];
        snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", ports[i]);
        ps_start(&ps[i], i, pl.shard_count[i], ep, 0);
    }
    dt_opt_config opt;
    dt_opt_config_init(&opt, "sgd", 10.0f, NULL);
    dt_remote_config rcfg = {.cluster = &cl, .placement = &pl, .opt = opt, .connect_timeout_ms = 3000,
                             .request_timeout_ms = 3000};
    dt_updater *u = NULL;
    int64_t step = -1;
    CHECK_MSG(dt_remote_updater_create(&u, &rcfg, &e) == 0, "%s", e.msg);
    if (!u) goto out;
    CHECK_MSG(u->start(u, net, 1, &step, &e) == 0 && step == 0, "%s", e.msg);

    /* The last float of the largest variable: 10 * 3e38 overflows, so the ps's update makes it -inf. */
    const dt_param_view *v = dt_net_view(net, 0);
    for (int k = 1; k < dt_net_num_views(net); k++)
        if (dt_net_view(net, k)->count > v->count) v = dt_net_view(net, k);
    size_t last = v->count - 1;
    int at = -1;
    size_t off = 0;
    CHECK(dt_placement_locate(&pl, v->offset + last, &at, &off) >= 0 && at >= 0);
    CHECK_MSG(off > 8192, "the float checked lies at %zu of its shard, inside the first block", off);
    memset(dt_net_grads(net), 0, dt_net_param_count(net) * sizeof(float));
    dt_net_grads(net)[v->offset + last] = 3e38f;
    CHECK(u->apply(u, net, 0, &step, &e) == DT_EFORMAT);
    char want[256];
    snprintf(want, sizeof want, "ps %d at tcp://127.0.0.1:%d: served a non-finite parameter (%s[%zu] = -inf) at step 1: "
             "training diverged (lower --learning_rate) or the ps is damaged", at, ports[at], v->name, last);
    CHECK_CONTAINS(e.msg, want);

    /* A plain client, which knows no variable names, gives the float's place in the shard. */
    dt_ps_client *c = client(2, ps, pl.shard_count, DT_ROLE_WORKER, 0); /* the one worker task there is */
    CHECK(c != NULL);
    if (c) {
        float *got0 = dt_alloc_floats(pl.shard_count[0], "shard", NULL);
        float *got1 = dt_alloc_floats(pl.shard_count[1], "shard", NULL);
        float *dst[2] = {got0, got1};
        CHECK(dt_ps_client_pull_all(c, dst, 0, NULL, &e) == DT_EFORMAT);
        snprintf(want, sizeof want, "ps %d at tcp://127.0.0.1:%d: served a non-finite parameter (float %zu of its "
                 "shard = -inf) at step 1", at, ports[at], off);
        CHECK_CONTAINS(e.msg, want);
        free(got0), free(got1);
        dt_ps_client_close(c);
    }
    u->free(u);
out:
    for (int i = 0; i < 2; i++) CHECK(ps_stop(&ps[i]) == DT_EINTR);
    dt_placement_free(&pl);
    dt_cluster_clear(&cl);
    dt_net_free(net);
}

int main(void) {
    RUN(test_failed_push_releases_gradient);
    RUN(test_push_to_dead_ps_not_sent_later);
    RUN(test_nonfinite_params_named);
    return test_summary();
}
