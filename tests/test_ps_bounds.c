/* A ps under hostile or broken peers (docs/security.md, "What a peer can make a ps hold"): every
 * resource a peer can make it hold has a bound, a peer past it is cut off or refused, and the
 * cluster's own clients go on. ps tasks run in threads on 127.0.0.1; hostile peers are raw
 * sockets: ZeroMQ DEALERs, or plain TCP speaking ZMTP by hand where libzmq would never send what
 * is needed (a message that never ends). Every wait is bounded. */
#include <errno.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>

#include "core/clock.h"
#include "compute/lazy_optim.h"
#include "core/error.h"
#include "ps_harness.h"
#include "raw_zmtp.h"

/* The ps's log, kept in memory to look for lines. */
typedef struct {
    char *buf;
    size_t len;
    FILE *f;
} log_capture;

static void capture(ps_thread *t, log_capture *c) {
    c->buf = NULL, c->len = 0;
    c->f = open_memstream(&c->buf, &c->len);
    t->cfg.log = c->f;
}

/* Stops the ps and returns its log (the caller frees it). */
static char *stop_and_log(ps_thread *t, log_capture *c) {
    ps_stop(t);
    fclose(c->f);
    if (getenv("DT_TEST_VERBOSE") && c->buf) fputs(c->buf, stderr);
    return c->buf;
}

/* ps_start, but with a log to read and the configuration adjusted before the thread starts. */
static void start_logged(ps_thread *t, size_t n, log_capture *c, int first_message_ms, int max_connections) {
    memset(t, 0, sizeof *t);
    snprintf(t->bind_ep, sizeof t->bind_ep, "tcp://127.0.0.1:*");
    t->cfg = (dt_ps_config){.endpoint = t->bind_ep, .ps_index = 0, .shard_floats = n, .poll_ms = 20,
                            .stop = &t->stop, .on_bound = on_bound, .user = t, .stats = &t->stats,
                            .first_message_ms = first_message_ms, .max_connections = max_connections};
    capture(t, c);
    atomic_init(&t->bound, 0);
    atomic_init(&t->returned, 0);
    pthread_create(&t->th, NULL, ps_main, t);
    for (int i = 0; i < 500 && !atomic_load(&t->bound); i++) sleep_ms(10);
}

static long rss_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

static int port_of(const char *ep) {
    const char *c = strrchr(ep, ':');
    return c ? atoi(c + 1) : -1;
}

static int tcp_connect(int port) { return raw_tcp_connect(port, 2); }

/* Whether the ps closed the connection within ms (reads until EOF or an error). */
static int closed_within(int s, int ms) {
    int64_t end = (dt_clock_us() / 1000) + ms;
    char buf[4096];
    fcntl(s, F_SETFL, O_NONBLOCK);
    while ((dt_clock_us() / 1000) < end) {
        ssize_t k = recv(s, buf, sizeof buf, 0);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return 1;
        if (k < 0) sleep_ms(20);
    }
    return 0;
}

static dt_wire_header req(dt_msg_type type, uint16_t task, uint32_t id) {
    return dt_wire_header_make(type, DT_ROLE_WORKER, task, id);
}

/* A chief that initialises one ps of n floats with sgd (async; n_workers tasks, 0: not told). */
static dt_ps_client *init_chief(ps_thread *ps, size_t n, int n_workers) {
    const char *eps[1] = {ps->endpoint};
    size_t sizes[1] = {n};
    dt_ps_client_config cc = {.n_ps = 1, .endpoints = eps, .shard_floats = sizes, .role = DT_ROLE_CHIEF,
                              .connect_timeout_ms = 3000, .request_timeout_ms = 3000, .n_workers = n_workers};
    dt_ps_client *c = NULL;
    dt_error e = {0};
    if (dt_ps_client_open(&c, &cc, &e)) {
        fprintf(stderr, "  open: %s\n", e.msg);
        return NULL;
    }
    float *p = calloc(n, sizeof *p);
    const float *src[1] = {p};
    dt_opt_config opt;
    dt_opt_config_init(&opt, "sgd", 0.5f, NULL);
    int rc = p ? dt_ps_client_init(c, &opt, src, NULL, NULL, 0, &e) : DT_ENOMEM;
    free(p);
    if (rc) {
        fprintf(stderr, "  init: %s\n", e.msg);
        dt_ps_client_close(c);
        return NULL;
    }
    return c;
}

/* The chief still pushes and pulls (the cluster goes on). */
static int chief_works(dt_ps_client *c, size_t n) {
    float *g = calloc(n, sizeof *g), *got = calloc(n, sizeof *got);
    const float *gs[1] = {g};
    float *dst[1] = {got};
    dt_error e = {0};
    int ok = g && got && dt_ps_client_push_all(c, gs, 0, NULL, &e) == DT_OK &&
             dt_ps_client_pull_all(c, dst, 0, NULL, &e) == DT_OK;
    if (!ok) fprintf(stderr, "  chief: %s\n", e.msg);
    free(g), free(got);
    return ok;
}

/* Item 7: a message that never ends (frames with MORE, forever) is cut off once it holds more than
 * the largest message the ps accepts; the ps's memory stays bounded and the chief goes on. */
static void test_endless_message_cut(void) {
    enum { N = 1 << 18 }; /* 1 MiB shard: the largest message (INIT with Adam) is 3 MiB */
    ps_thread ps;
    log_capture lc;
    start_logged(&ps, N, &lc, 0, 0);
    dt_ps_client *chief = init_chief(&ps, N, 0);
    CHECK(chief != NULL);
    int s = tcp_connect(port_of(ps.endpoint));
    CHECK(s >= 0 && zmtp_hello(s) == 0);
    static uint8_t frame[1 << 20];
    long before = rss_kb(), peak = before;
    size_t sent = 0;
    int64_t end = (dt_clock_us() / 1000) + 15000;
    while (sent < (size_t)256 << 20 && (dt_clock_us() / 1000) < end) { /* 256 MiB at most */
        if (zmtp_frame_header(s, sizeof frame, 1) || raw_send_all(s, frame, sizeof frame)) break;
        sent += sizeof frame;
        long now = rss_kb();
        if (now > peak) peak = now;
    }
    fprintf(stderr, "  cut off after %zu MiB sent; ps memory peaked %ld MiB above where it was\n", sent >> 20,
            (peak - before) >> 10);
    CHECK_MSG(sent < (size_t)256 << 20, "sent %zu bytes, never cut off", sent);
    CHECK_MSG(peak - before < 96 * 1024, "ps memory grew by %ld KiB while a peer sent %zu bytes of one message",
              peak - before, sent);
    if (chief) CHECK(chief_works(chief, N));
    close(s);
    dt_ps_client_close(chief);
    char *log = stop_and_log(&ps, &lc);
    CHECK(log && strstr(log, "cut off the connection from 127.0.0.1") && strstr(log, "unfinished message"));
    CHECK(ps.stats.cut >= 1);
    free(log);
}

/* Item 11: a connection that announces a frame and goes silent mid-frame, and one that never
 * completes the greeting, are closed once the first-message deadline passes. */
static void test_silent_connections_closed(void) {
    ps_thread ps;
    log_capture lc;
    start_logged(&ps, 64, &lc, 500, 0);
    int mid = tcp_connect(port_of(ps.endpoint));
    int mute = tcp_connect(port_of(ps.endpoint));
    CHECK(mid >= 0 && mute >= 0);
    CHECK(zmtp_hello(mid) == 0 && zmtp_frame_header(mid, 200, 0) == 0 && raw_send_all(mid, "x", 1) == 0);
    CHECK(closed_within(mid, 5000));
    CHECK(closed_within(mute, 5000));
    close(mid);
    close(mute);
    char *log = stop_and_log(&ps, &lc);
    CHECK(log && strstr(log, "no valid message within"));
    free(log);
}

/* Item 11: idle connections beyond the limit: the least recently useful are cut (those that never
 * sent a valid message first), the limit is logged, and a known client goes on. */
static void test_connection_limit(void) {
    enum { N = 64, LIMIT = 16, IDLE = 40 };
    ps_thread ps;
    log_capture lc;
    start_logged(&ps, N, &lc, 0, LIMIT);
    dt_ps_client *chief = init_chief(&ps, N, 0);
    CHECK(chief != NULL);
    int idle[IDLE];
    for (int i = 0; i < IDLE; i++) idle[i] = tcp_connect(port_of(ps.endpoint));
    sleep_ms(1000);
    int closed = 0;
    for (int i = 0; i < IDLE; i++) closed += idle[i] >= 0 && closed_within(idle[i], 50);
    CHECK_MSG(closed >= IDLE - LIMIT, "%d of %d idle connections closed", closed, IDLE);
    if (chief) CHECK(chief_works(chief, N));
    for (int i = 0; i < IDLE; i++)
        if (idle[i] >= 0) close(idle[i]);
    dt_ps_client_close(chief);
    char *log = stop_and_log(&ps, &lc);
    CHECK(log && strstr(log, "near the limit of 16") && strstr(log, "least recently useful"));
    free(log);
}

/* Item 8: a peer that asks for large replies and never reads them gets at most two in flight;
 * further requests are refused (ERROR 106), not queued. */
static void test_unread_replies_bounded(void) {
    enum { N = 1 << 20, ASKS = 12 }; /* 4 MiB STATE replies: more than the kernel's buffers hold */
    ps_thread ps;
    log_capture lc;
    start_logged(&ps, N, &lc, 0, 0);
    dt_ps_client *chief = init_chief(&ps, N, 0);
    CHECK(chief != NULL);
    void *ctx = zmq_ctx_new();
    void *s = dt_zsock_open(ctx, ZMQ_DEALER, 64 << 20, 0, 2000, NULL);
    int one = 1;
    zmq_setsockopt(s, ZMQ_RCVHWM, &one, sizeof one); /* its libzmq stops reading too */
    zmq_setsockopt(s, ZMQ_RCVBUF, &(int){65536}, sizeof(int));
    zmq_connect(s, ps.endpoint);
    for (uint32_t i = 1; i <= ASKS; i++) {
        dt_wire_header h = req(DT_MSG_FETCH, 1, i);
        dt_wire_send(s, NULL, &h, NULL, 0, NULL);
        sleep_ms(30);
    }
    sleep_ms(500);
    int state = 0, busy = 0;
    dt_wire_in in;
    for (int i = 0; i < ASKS && raw_reply(s, &in) == DT_OK; i++) {
        state += in.hdr.type == DT_MSG_STATE;
        busy += in.hdr.type == DT_MSG_ERROR && in.hdr.status == DT_WIRE_E_BUSY;
        dt_wire_in_close(&in);
    }
    CHECK_MSG(busy >= 1 && state + busy == ASKS, "%d STATE, %d BUSY of %d", state, busy, ASKS);
    if (chief) CHECK(chief_works(chief, N));
    zmq_close(s);
    zmq_ctx_term(ctx);
    dt_ps_client_close(chief);
    free(stop_and_log(&ps, &lc));
}

/* Issue 40, item 9: strangers that ask for large replies and never read them hold the ps at its
 * budget (40 connections, then 2 more every 250 ms, each asking 2 FETCHes of a 4 MiB shard: B is
 * 96 MiB). A sync run goes on: the
 * worker that pushes gets its PARAMS, a quarter of the budget being kept from strangers for the
 * workers (before, steps were refused ERROR 106); and a worker that has pushed nothing yet (a
 * restart) asks again while the ps says it is busy, within its timeout, until strangers' unread
 * replies are cut (before, its PULL failed at once: the worker exited). */
/* Issue 40, item 4: a forged chief's INIT of 1,008 replicas at staleness 64, then a SPARSE_INIT of
 * 64 tables of one row, to a ps whose table memory is 64 MiB: the tables' sync accumulators (65 x
 * 1,008 entries each, 7.3 MB a table, 467 MB in all) count against it before any is built, so the
 * SPARSE_INIT is refused (ERROR 107 naming them) and the ps's resident size stays put. Before, the
 * ps took it, logging "up to 0.0 MiB" of table memory, and grew by the 467 MB. */
static void test_sparse_accumulators_counted(void) {
    enum { N = 64, TABLES = 64 };
    ps_thread ps;
    memset(&ps, 0, sizeof ps);
    snprintf(ps.bind_ep, sizeof ps.bind_ep, "tcp://127.0.0.1:*");
    ps.cfg = (dt_ps_config){.endpoint = ps.bind_ep, .ps_index = 0, .shard_floats = N, .poll_ms = 20,
                            .stop = &ps.stop, .on_bound = on_bound, .user = &ps, .stats = &ps.stats,
                            .table_memory = UINT64_C(64) << 20};
    log_capture lc;
    capture(&ps, &lc);
    atomic_init(&ps.bound, 0);
    atomic_init(&ps.returned, 0);
    pthread_create(&ps.th, NULL, ps_main, &ps);
    for (int i = 0; i < 500 && !atomic_load(&ps.bound); i++) sleep_ms(10);
    size_t sizes[1] = {N};
    dt_ps_client *chief = client_sync(1, &ps, sizes, DT_ROLE_CHIEF, 0, 1008, 1008, 64);
    CHECK(chief != NULL);
    static float p[N];
    const float *src[1] = {p};
    dt_opt_config opt;
    dt_opt_config_init(&opt, "sgd", 0.5f, NULL);
    dt_error e = {0};
    CHECK(chief && dt_ps_client_init(chief, &opt, src, NULL, NULL, 0, &e) == DT_OK);
    static uint8_t recs[TABLES * DT_WIRE_TABLE_BYTES];
    for (uint32_t t = 0; t < TABLES; t++) {
        dt_wire_table w = {.table = t, .dim = 1, .capacity = 1, .seed = 7};
        dt_lazy_config_init(&w.opt, "sgd", 0.1f, NULL);
        dt_wire_table_encode(recs + t * DT_WIRE_TABLE_BYTES, &w);
    }
    void *ctx = zmq_ctx_new();
    void *s = raw_open(ctx, ps.endpoint);
    dt_wire_header h = dt_wire_header_make(DT_MSG_SPARSE_INIT, DT_ROLE_CHIEF, 0, 1);
    h.sparse.ids = TABLES, h.payload_bytes = sizeof recs;
    zmq_msg_t m;
    zmq_msg_init_size(&m, sizeof recs);
    memcpy(zmq_msg_data(&m), recs, sizeof recs);
    const long before = rss_kb();
    dt_wire_send(s, NULL, &h, &m, 0, NULL);
    dt_wire_in in;
    CHECK(raw_reply(s, &in) == DT_OK &&
          raw_error_says(&in, DT_WIRE_E_BAD_VALUE, "of it sync accumulators (1008 replicas to aggregate, staleness 64"));
    dt_wire_in_close(&in);
    const long grew = rss_kb() - before;
    CHECK_MSG(grew < 32 * 1024, "the ps grew by %ld KiB", grew);
    fprintf(stderr, "  resident size %+ld KiB after the SPARSE_INIT\n", grew);
    zmq_close(s);
    zmq_ctx_term(ctx);
    if (chief) CHECK(dt_ps_client_shutdown(chief, &e) == DT_OK);
    dt_ps_client_close(chief);
    free(stop_and_log(&ps, &lc));
}

enum { STRANGERS = 40, STRANGERS_MOST = 96 };

/* A stranger: a connection that asks for 2 FETCHes and never reads. */
static void *stranger(void *ctx, const char *ep) {
    void *s = dt_zsock_open(ctx, ZMQ_DEALER, 64 << 20, 0, 2000, NULL);
    zmq_setsockopt(s, ZMQ_RCVHWM, &(int){1}, sizeof(int)); /* its libzmq stops reading too */
    zmq_setsockopt(s, ZMQ_RCVBUF, &(int){65536}, sizeof(int));
    zmq_connect(s, ep);
    for (uint32_t i = 1; i <= 2; i++) {
        dt_wire_header h = req(DT_MSG_FETCH, 1, i);
        dt_wire_send(s, NULL, &h, NULL, 0, NULL);
    }
    return s;
}

/* The strangers, in a process of their own (forked before the ps starts: in this one, what their
 * libzmq reads would count in the ps's heap): once the endpoint arrives on fd, STRANGERS of them,
 * then 2 more every 250 ms (the ps cuts those whose replies wait unread), the oldest closed beyond
 * STRANGERS_MOST, until fd closes. */
static void strangers_main(int fd) {
    char ep[128] = {0};
    if (read(fd, ep, sizeof ep - 1) <= 0) _exit(1);
    void *ctx = zmq_ctx_new();
    void *s[STRANGERS_MOST] = {0};
    int next = 0;
    for (; next < STRANGERS; next++) s[next] = stranger(ctx, ep);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    char c;
    while (read(fd, &c, 1) != 0) {
        sleep_ms(250);
        for (int k = 0; k < 2; k++, next = (next + 1) % STRANGERS_MOST) {
            if (s[next]) zmq_close(s[next]);
            s[next] = stranger(ctx, ep);
        }
    }
    for (int k = 0; k < STRANGERS_MOST; k++)
        if (s[k]) zmq_close(s[k]);
    zmq_ctx_term(ctx);
    _exit(0);
}

static void test_workers_before_strangers_at_the_budget(void) {
    enum { N = 1 << 20, STEPS = 10 };
    int pipefd[2];
    if (pipe(pipefd) != 0) return;
    pid_t kid = fork();
    if (kid == 0) {
        close(pipefd[1]);
        alarm(60);
        strangers_main(pipefd[0]);
    }
    close(pipefd[0]);
    ps_thread ps;
    log_capture lc;
    start_logged(&ps, N, &lc, 0, 0);
    size_t sizes[1] = {N};
    const int request_ms_was = request_ms;
    request_ms = 10000;
    dt_ps_client *chief = client_sync(1, &ps, sizes, DT_ROLE_CHIEF, 0, 1, 2, 0);
    CHECK(chief != NULL);
    float *p = calloc(N, sizeof *p), *g = calloc(N, sizeof *g);
    const float *src[1] = {p}, *gs[1] = {g}, *views[1];
    dt_opt_config opt;
    dt_opt_config_init(&opt, "sgd", 0.5f, NULL);
    dt_error e = {0};
    CHECK(chief && dt_ps_client_init(chief, &opt, src, NULL, NULL, 0, &e) == DT_OK);
    CHECK(chief && dt_ps_client_push_pull(chief, gs, 0, 1, views, NULL, NULL, &e) == DT_OK); /* declared */
    CHECK(write(pipefd[1], ps.endpoint, strlen(ps.endpoint)) == (ssize_t)strlen(ps.endpoint));
    sleep_ms(500);
    dt_ps_client *late = client_sync(1, &ps, sizes, DT_ROLE_WORKER, 1, 1, 2, 0);
    CHECK(late != NULL);
    int64_t pulled[1] = {0};
    if (late) {
        int rc = dt_ps_client_pull_resume(late, views, pulled, &e);
        CHECK_MSG(rc == DT_OK && pulled[0] == 1, "late worker's pull: rc %d: %s", rc, e.msg);
        /* how often depends on when the ps cuts strangers (0 when the pull came between cuts) */
        fprintf(stderr, "  the late worker asked %llu time(s) again\n",
                (unsigned long long)dt_ps_client_get_stats(late)->busy_retries);
    }
    request_ms = request_ms_was;
    int steps = 0;
    for (int t = 1; chief && t <= STEPS; t++) {
        int64_t t0 = dt_clock_us();
        int rc = dt_ps_client_push_pull(chief, gs, t, t + 1, views, NULL, NULL, &e);
        CHECK_MSG(rc == DT_OK, "step %d: %s", t, e.msg);
        if (getenv("DT_TEST_VERBOSE")) fprintf(stderr, "  step %d: %.2f s\n", t, (dt_clock_us() - t0) / 1e6);
        if (rc) break;
        steps++;
    }
    CHECK_MSG(steps == STEPS, "%d of %d sync steps while strangers hold the budget", steps, STEPS);
    char *log = NULL;
    close(pipefd[1]);
    int status = 0;
    waitpid(kid, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "strangers: status %d", status);
    if (chief) CHECK(dt_ps_client_shutdown(chief, &e) == DT_OK);
    dt_ps_client_close(late);
    dt_ps_client_close(chief);
    free(p), free(g);
    log = stop_and_log(&ps, &lc);
    CHECK_CONTAINS(log, "for a connection that pushes as no worker (the rest is kept for the workers')");
    free(log);
}

/* Item 9: deferred PULLs: a step that cannot come soon is refused, one connection holds at most
 * a step's chunks and a few more, and a connection's PULLs go when it does. */
static void test_deferred_pulls_bounded(void) {
    enum { N = 32 };
    ps_thread ps;
    log_capture lc;
    start_logged(&ps, N, &lc, 0, 0);
    dt_ps_client *chief = init_chief(&ps, N, 0);
    CHECK(chief != NULL);
    void *ctx = zmq_ctx_new();
    void *s = raw_open(ctx, ps.endpoint);
    dt_wire_in in;
    dt_wire_header h = req(DT_MSG_PULL, 1, 1);
    h.global_step = INT64_C(1) << 40;
    dt_wire_send(s, NULL, &h, NULL, 0, NULL);
    CHECK(raw_reply(s, &in) == DT_OK && raw_error_says(&in, DT_WIRE_E_BAD_VALUE, "holds PULLs for at most step"));
    dt_wire_in_close(&in);
    const uint32_t last = 2 + DT_PS_PENDING_PER_PEER;
    for (uint32_t i = 2; i <= last; i++) {
        h = req(DT_MSG_PULL, 1, i);
        h.global_step = 1;
        dt_wire_send(s, NULL, &h, NULL, 0, NULL);
    }
    char says[64];
    snprintf(says, sizeof says, "already has %d PULLs waiting", DT_PS_PENDING_PER_PEER);
    CHECK(raw_reply(s, &in) == DT_OK && in.hdr.request_id == last && raw_error_says(&in, DT_WIRE_E_BUSY, says));
    dt_wire_in_close(&in);
    zmq_close(s); /* its deferred PULLs must go with it */
    sleep_ms(500);
    void *s2 = raw_open(ctx, ps.endpoint); /* another connection defers as usual */
    h = req(DT_MSG_PULL, 1, 7);
    h.global_step = 1;
    dt_wire_send(s2, NULL, &h, NULL, 0, NULL);
    if (chief) CHECK(chief_works(chief, N));
    CHECK(raw_reply(s2, &in) == DT_OK && in.hdr.type == DT_MSG_PARAMS && in.hdr.request_id == 7);
    dt_wire_in_close(&in);
    zmq_close(s2);
    zmq_ctx_term(ctx);
    dt_ps_client_close(chief);
    free(stop_and_log(&ps, &lc));
    CHECK_MSG(ps.stats.pending == 0, "%d deferred PULLs of closed connections still held", ps.stats.pending);
}

/* Item 10: messages naming a worker task outside the cluster are refused; a DONE from one does
 * not count toward the chief's wait. */
static void test_unknown_task_refused(void) {
    enum { N = 16 };
    ps_thread ps;
    log_capture lc;
    start_logged(&ps, N, &lc, 0, 0);
    void *ctx = zmq_ctx_new();
    void *s = raw_open(ctx, ps.endpoint);
    dt_wire_in in;
    /* Before INIT the cluster is not known: a DONE from task 9 is taken, then pruned by INIT. */
    dt_wire_header h = req(DT_MSG_DONE, 9, 1);
    dt_wire_send(s, NULL, &h, NULL, 0, NULL);
    CHECK(raw_reply(s, &in) == DT_OK && in.hdr.type == DT_MSG_ACK);
    dt_wire_in_close(&in);
    dt_ps_client *chief = init_chief(&ps, N, 2);
    CHECK(chief != NULL);
    uint16_t tasks[2] = {7, 65535};
    for (int k = 0; k < 2; k++) {
        h = req(DT_MSG_DONE, tasks[k], 2 + (uint32_t)k);
        dt_wire_send(s, NULL, &h, NULL, 0, NULL);
        CHECK(raw_reply(s, &in) == DT_OK && raw_error_says(&in, DT_WIRE_E_BAD_VALUE, "is not in this cluster"));
        dt_wire_in_close(&in);
    }
    h = req(DT_MSG_PULL, 2, 4);
    dt_wire_send(s, NULL, &h, NULL, 0, NULL);
    CHECK(raw_reply(s, &in) == DT_OK && raw_error_says(&in, DT_WIRE_E_BAD_VALUE, "worker 2 is not in this cluster"));
    dt_wire_in_close(&in);
    dt_error e = {0};
    if (chief) {
        CHECK(dt_ps_client_wait_done(chief, 1, 300, &e) == DT_ETIMEOUT);
        CHECK_CONTAINS(e.msg, "only 0 of 1");
    }
    h = req(DT_MSG_DONE, 1, 5);
    dt_wire_send(s, NULL, &h, NULL, 0, NULL);
    CHECK(raw_reply(s, &in) == DT_OK && in.hdr.type == DT_MSG_ACK);
    dt_wire_in_close(&in);
    if (chief) CHECK(dt_ps_client_wait_done(chief, 1, 2000, &e) == DT_OK);
    zmq_close(s);
    zmq_ctx_term(ctx);
    dt_ps_client_close(chief);
    free(stop_and_log(&ps, &lc));
}

/* Item 14: an INIT that runs out of memory part way is refused with status 112 and leaves the ps
 * exactly as it was (before, the new state buffer was committed before the sync accumulators
 * failed, and the next PUSH ran Adam over a zero-slot buffer). */
static void test_init_out_of_memory_changes_nothing(void) {
    enum { N = 256 };
    ps_thread ps;
    ps_start(&ps, 0, N, NULL, 0);
    size_t sizes[1] = {N};
    dt_ps_client *adam = client_sync(1, &ps, sizes, DT_ROLE_CHIEF, 0, 1, 1, 0);
    CHECK(adam != NULL);
    if (!adam) {
        ps_stop(&ps);
        return;
    }
    static float p[N], g[N], got[N];
    for (int i = 0; i < N; i++) p[i] = 1.0f, g[i] = 1.0f;
    const float *src[1] = {p}, *gs[1] = {g};
    float *dst[1] = {got};
    dt_opt_config opt;
    dt_opt_config_init(&opt, "adam", 0.1f, NULL);
    dt_error e = {0};
    CHECK(dt_ps_client_init(adam, &opt, src, NULL, NULL, 0, &e) == DT_OK);
    /* An sgd INIT (zero slots): its state buffer is the first allocation, the sync accumulators
     * come next and fail. */
    dt_opt_config sgd;
    dt_opt_config_init(&sgd, "sgd", 0.5f, NULL);
    dt_alloc_fail_after(2);
    CHECK(dt_ps_client_init(adam, &sgd, src, NULL, NULL, 0, &e) == DT_EPROTO);
    dt_alloc_fail_after(0);
    CHECK_CONTAINS(e.msg, "out of memory");
    CHECK(dt_ps_client_last_refusal(adam) == DT_WIRE_E_NOMEM);
    /* Still Adam, with its state: one step of Adam from zero moments moves each parameter by
     * about the learning rate. */
    CHECK(dt_ps_client_push_all(adam, gs, 0, NULL, &e) == DT_OK);
    CHECK(dt_ps_client_pull_all(adam, dst, 1, NULL, &e) == DT_OK);
    CHECK_NEAR(got[0], 0.9, 1e-4);
    CHECK_NEAR(got[N - 1], 0.9, 1e-4);
    CHECK(dt_ps_client_shutdown(adam, &e) == DT_OK);
    dt_ps_client_close(adam);
    CHECK(ps_stop(&ps) == DT_OK);
}

/* Item 4 (the ps's side): an INIT carrying a NaN or infinity is refused, naming where it is. */
static void test_init_non_finite_refused(void) {
    enum { N = 64 };
    ps_thread ps;
    ps_start(&ps, 0, N, NULL, 0);
    size_t sizes[1] = {N};
    dt_ps_client *chief = client(1, &ps, sizes, DT_ROLE_CHIEF, 0);
    CHECK(chief != NULL);
    if (chief) {
        static float p[N], st[2 * N];
        p[17] = NAN;
        const float *src[1] = {p}, *state[1] = {st};
        dt_opt_config opt;
        dt_opt_config_init(&opt, "adam", 0.1f, NULL);
        dt_error e = {0};
        CHECK(dt_ps_client_init(chief, &opt, src, NULL, NULL, 0, &e) == DT_EPROTO);
        CHECK_CONTAINS(e.msg, "non-finite parameter (nan at float 17");
        p[17] = 0.0f;
        st[N + 5] = INFINITY;
        CHECK(dt_ps_client_init(chief, &opt, src, state, NULL, 0, &e) == DT_EPROTO);
        CHECK_CONTAINS(e.msg, "non-finite optimizer state value (inf at float 5 of slot 1)");
        CHECK(dt_ps_client_shard(chief, 0)->initialised == 0);
        st[N + 5] = 0.0f;
        CHECK(dt_ps_client_init(chief, &opt, src, state, NULL, 0, &e) == DT_OK);
        CHECK(dt_ps_client_shutdown(chief, &e) == DT_OK);
    }
    dt_ps_client_close(chief);
    CHECK(ps_stop(&ps) == DT_OK);
}

int main(void) {
    RUN(test_init_non_finite_refused);
    RUN(test_init_out_of_memory_changes_nothing);
    RUN(test_unknown_task_refused);
    RUN(test_deferred_pulls_bounded);
    RUN(test_unread_replies_bounded);
    RUN(test_workers_before_strangers_at_the_budget);
    RUN(test_sparse_accumulators_counted);
    RUN(test_silent_connections_closed);
    RUN(test_connection_limit);
    RUN(test_endless_message_cut);
    return test_summary();
}
