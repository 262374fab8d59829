/* Shared by the parameter-server tests (test_ps.c, test_sync.c): ps tasks in threads on
 * 127.0.0.1 with kernel-chosen ports, clients with short timeouts, a raw DEALER for requests the
 * client API would never send. Every wait is bounded. */
#ifndef DT_TESTS_PS_HARNESS_H
#define DT_TESTS_PS_HARNESS_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "ps/ps.h"
#include "test.h"
#include "transport/wire.h"
#include "transport/zmq_io.h"
#include "worker/ps_client.h"

static inline void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A port nobody listens on right now (the kernel's pick; closed again at once). */
static inline int free_port(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(s, (struct sockaddr *)&a, &len) != 0) {
        if (s >= 0) close(s);
        return -1;
    }
    close(s);
    return ntohs(a.sin_port);
}

typedef struct {
    dt_ps_config cfg;
    dt_ps_stats stats;
    volatile sig_atomic_t stop;
    char bind_ep[64];
    char endpoint[128];    /* as bound, for clients */
    atomic_int bound;
    atomic_int returned;   /* dt_ps_serve has returned (by itself, or stopped) */
    int start_delay_ms;
    int rc;
    dt_error err;
    pthread_t th;
} ps_thread;

static inline void on_bound(void *user, const char *ep) {
    ps_thread *t = user;
    snprintf(t->endpoint, sizeof t->endpoint, "%s", ep);
    atomic_store(&t->bound, 1);
}

static inline void *ps_main(void *arg) {
    ps_thread *t = arg;
    if (t->start_delay_ms) sleep_ms(t->start_delay_ms);
    t->rc = dt_ps_serve(&t->cfg, &t->err);
    atomic_store(&t->bound, 1); /* a failed bind must not leave the starter waiting */
    atomic_store(&t->returned, 1);
    return NULL;
}

static struct dt_metrics *ps_metrics = NULL; /* the next ps started publishes here (NULL: none) */

/* Starts a ps thread serving n floats; bind_ep NULL: a free loopback port. Waits (bounded) until
 * it is bound unless it starts with a delay. */
static inline void ps_start(ps_thread *t, int index, size_t n, const char *bind_ep, int delay_ms) {
    memset(t, 0, sizeof *t);
    snprintf(t->bind_ep, sizeof t->bind_ep, "%s", bind_ep ? bind_ep : "tcp://127.0.0.1:*");
    t->cfg = (dt_ps_config){.endpoint = t->bind_ep, .ps_index = index, .shard_floats = n, .poll_ms = 20,
                            .stop = &t->stop, .on_bound = on_bound, .user = t, .stats = &t->stats,
                            .log = getenv("DT_TEST_VERBOSE") ? stderr : NULL, .metrics = ps_metrics};
    t->start_delay_ms = delay_ms;
    atomic_init(&t->bound, 0);
    atomic_init(&t->returned, 0);
    pthread_create(&t->th, NULL, ps_main, t);
    if (delay_ms) return;
    for (int i = 0; i < 500 && !atomic_load(&t->bound); i++) sleep_ms(10);
}

/* Stops the ps (if still running) and joins it; returns its dt_ps_serve status. */
static inline int ps_stop(ps_thread *t) {
    t->stop = 1;
    pthread_join(t->th, NULL);
    return t->rc;
}

static int request_ms = 3000; /* clients' request timeout */
static int liveness_ms = 0;   /* sync clients' INIT: a worker silent this long is lost (0: never) */
static int strict_mode = 0;   /* sync clients' INIT: a lost worker stops the job */
static int64_t chunk_bytes = 0; /* chiefs' INIT: the cut (0: one chunk per shard) */

/* A client of n_ps ps tasks; aggregate > 0: sync replicas (aggregate of total, staleness). */
static inline dt_ps_client *client_sync(int n_ps, ps_thread *ps, const size_t *sizes, dt_wire_role role, int task,
                                        int aggregate, int total, int staleness) {
    const char *eps[8];
    for (int i = 0; i < n_ps; i++) eps[i] = ps[i].endpoint;
    dt_ps_client_config cc = {.n_ps = n_ps, .endpoints = eps, .shard_floats = sizes, .role = role,
                              .task = task, .connect_timeout_ms = 3000, .request_timeout_ms = request_ms,
                              .replicas_to_aggregate = aggregate, .total_num_replicas = total,
                              .staleness = staleness, .liveness_ms = liveness_ms, .strict = strict_mode,
                              .chunk_bytes = chunk_bytes};
    dt_ps_client *c = NULL;
    dt_error e = {0};
    if (dt_ps_client_open(&c, &cc, &e)) fprintf(stderr, "  open: %s\n", e.msg);
    return c;
}

static inline dt_ps_client *client(int n_ps, ps_thread *ps, const size_t *sizes, dt_wire_role role, int task) {
    return client_sync(n_ps, ps, sizes, role, task, 0, 0, 0);
}

static inline void fill(float *x, size_t n, float scale, int seed) {
    for (size_t i = 0; i < n; i++) x[i] = scale * (float)((int)((i * 2654435761u + (unsigned)seed * 97u) % 2001u) - 1000) / 1000.0f;
}

/* Pushes `steps` rounds of gradients through c to its two shards (sizes n[0], n[1]), each round
 * also applied here with dt_opt_apply (decay masks m, may be NULL) to p and s, from global step
 * `first`; checks each push's global step and that none was stale. Then p holds what the ps tasks
 * should hold, bit for bit. */
static inline void push_and_mirror(dt_ps_client *c, const dt_opt_config *opt, float *p[2], float *s[2],
                                   const uint8_t *m[2], const size_t n[2], int steps, int64_t first) {
    float *g[2] = {malloc(n[0] * sizeof(float)), malloc(n[1] * sizeof(float))};
    CHECK(g[0] && g[1]);
    dt_error e = {0};
    for (int t = 0; g[0] && g[1] && t < steps; t++) {
        fill(g[0], n[0], 0.5f, 100 + t);
        fill(g[1], n[1], 0.5f, 200 + t);
        const float *gs[2] = {g[0], g[1]};
        dt_push_result res;
        CHECK_MSG(dt_ps_client_push_all(c, gs, t, &res, &e) == DT_OK, "%s", e.msg);
        CHECK(res.global_step == first + 1 + t && res.n_stale == 0);
        for (int k = 0; k < 2; k++) dt_opt_apply(opt, p[k], g[k], s[k], m ? m[k] : NULL, n[k], first + t);
    }
    free(g[0]), free(g[1]);
}

/* A raw DEALER speaking to the ps: requests the client API would never send. */
static inline void *raw_open(void *ctx, const char *ep) {
    void *s = dt_zsock_open(ctx, ZMQ_DEALER, 1 << 20, 0, 2000, NULL);
    zmq_connect(s, ep);
    return s;
}

static inline int raw_reply(void *s, dt_wire_in *in) {
    zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, 3000) != 1) return DT_ETIMEOUT;
    return dt_wire_recv(s, 0, in, NULL);
}

static inline int raw_error_says(dt_wire_in *in, int32_t status, const char *needle) {
    char text[DT_WIRE_MAX_ERROR_TEXT + 1];
    dt_wire_error_text(text, sizeof text, zmq_msg_data(&in->payload), zmq_msg_size(&in->payload));
    int ok = in->hdr.type == DT_MSG_ERROR && in->hdr.status == status && strstr(text, needle);
    if (!ok) fprintf(stderr, "  reply %s status %d text \"%s\"\n", dt_wire_type_name(in->hdr.type), in->hdr.status, text);
    return ok;
}

#endif
