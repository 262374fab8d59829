/* The public API's error contract (include/dtrain.h): err may be NULL, and a call returns the same
 * code whether or not it was given an err to fill. Every public function is called on failing
 * inputs twice, with an err and with NULL, including a distributed run whose end fails (the chief's
 * wait for a worker that never came, then a ps that is gone), where messages used to be read
 * through err. */
#include <ftw.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "dtrain.h"
#include "ps_harness.h" /* free_port, sleep_ms */
#include "test.h"
#include "tmpdir.h"
#include "transport/auth.h"

static void put_be32(FILE *f, uint32_t v) {
    uint8_t b[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    fwrite(b, 1, 4, f);
}

/* An IDX pair of n 4x4 images (pixel = label * 200 + i) with labels alternating 0, 1. */
static void write_idx(const char *dir, const char *prefix, uint32_t n) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte", dir, prefix);
    FILE *f = fopen(p, "wb");
    put_be32(f, 0x803), put_be32(f, n), put_be32(f, 4), put_be32(f, 4);
    for (uint32_t i = 0; i < n; i++)
        for (int j = 0; j < 16; j++) fputc((int)((i % 2) * 200 + i + (uint32_t)j), f);
    fclose(f);
    snprintf(p, sizeof p, "%s/%s-labels-idx1-ubyte", dir, prefix);
    f = fopen(p, "wb");
    put_be32(f, 0x801), put_be32(f, n);
    for (uint32_t i = 0; i < n; i++) fputc((int)(i % 2), f);
    fclose(f);
}

/* call is evaluated twice, first with E an err, then with E NULL: both must return want. */
#define SAME_CODE(want, call)                                                                       \
    do {                                                                                            \
        dt_error e_ = {0};                                                                          \
        dt_error *E = &e_;                                                                          \
        int with_ = (call);                                                                         \
        E = NULL;                                                                                   \
        int without_ = (call);                                                                      \
        (void)E;                                                                                    \
        CHECK_MSG(with_ == (want) && without_ == (want), "%s: %d with err (%s), %d with NULL, want %d", \
                  #call, with_, e_.msg, without_, (want));                                          \
    } while (0)

static void test_wrap(void) {
    /* The code is the caller's, with or without an err to prefix. */
    CHECK(dt_error_wrap(NULL, DT_ENET, "ps %d: ", 3) == DT_ENET);
    dt_error e = {0};
    dt_errorf(&e, DT_EIO, "cannot open x");
    CHECK(dt_error_wrap(&e, DT_ETIMEOUT, "ps %d: ", 3) == DT_ETIMEOUT);
    CHECK(e.code == DT_ETIMEOUT);
    CHECK(strcmp(e.msg, "ps 3: cannot open x") == 0);
}

static int net_load(const char *path, dt_error *E) {
    dt_net *net = NULL;
    int rc = dt_net_load(&net, path, 8, E);
    dt_net_free(net);
    return rc;
}

static int cluster_args(const char *a1, const char *a2, const char *a3, dt_error *E) {
    char *argv[5] = {"prog", (char *)a1, (char *)a2, (char *)a3, NULL};
    int argc = a3 ? 4 : a2 ? 3 : 2;
    dt_cluster *c = NULL;
    int rc = dt_cluster_from_args(&c, &argc, argv, E);
    dt_cluster_free(c);
    return rc;
}

static int serve(const char *ps_hosts, const dt_net *net, dt_error *E) {
    char a1[128];
    snprintf(a1, sizeof a1, "--ps_hosts=%s", ps_hosts);
    char *argv[5] = {"prog", a1, "--worker_hosts=127.0.0.1:1", "--job_name=ps", NULL};
    int argc = 4;
    dt_cluster *c = NULL;
    int rc = dt_cluster_from_args(&c, &argc, argv, E);
    if (!rc) rc = dt_serve(c, net, NULL, 600000, NULL, E);
    dt_cluster_free(c);
    return rc;
}

static int batches_first(const char *data, const dt_net *net, dt_error *E) {
    dt_batches *b = NULL;
    int rc = dt_batches_open(&b, data, net, 1, 1, NULL, E);
    const float *x;
    const int32_t *y;
    int n;
    if (!rc) rc = dt_batches_next(b, &x, &y, &n, E);
    dt_batches_free(b);
    return rc;
}

static int optimizer(const char *name, float lr, const dt_net *net, const dt_cluster *c, dt_error *E) {
    dt_optimizer *o = NULL;
    int rc = dt_optimizer_new(&o, name, lr, net, E);
    if (!rc) rc = dt_optimizer_distribute(o, c, net, 0, NULL, E);
    dt_optimizer_free(o);
    return rc;
}

static int train(dt_train_options o, dt_error *E) {
    o.logdir = o.summary_dir = "";
    FILE *log = fopen("/dev/null", "w");
    int rc = dt_train(&o, log, NULL, E);
    fclose(log);
    return rc;
}

static void test_single_process(void) {
    unsetenv("TF_CONFIG");
    char model[600];
    snprintf(model, sizeof model, "%s", tpath("tiny.model"));
    write_text(model, "model tiny\ninput 4 4 1\nconv2d filters=2 kernel=3\nrelu\nflatten\ndense units=2\n");
    write_text(tpath("typo.model"), "model typo\ninput 4 4 1\nflaten\ndense units=2\n");
    mkdir(tpath("idx"), 0755);
    write_idx(tpath("idx"), "train", 8);
    write_idx(tpath("idx"), "t10k", 4);
    mkdir(tpath("half_idx"), 0755);
    write_idx(tpath("half_idx"), "train", 8); /* no t10k pair */
    mkdir(tpath("bad_imgs"), 0755);
    mkdir(tpath("bad_imgs/cat"), 0755);
    mkdir(tpath("bad_imgs/dog"), 0755);
    write_text(tpath("bad_imgs/cat/a.png"), "not a png");
    write_text(tpath("bad_imgs/dog/b.jpg"), "not a jpeg");

    SAME_CODE(DT_EIO, net_load(tpath("missing.model"), E));
    SAME_CODE(DT_EFORMAT, net_load(tpath("typo.model"), E));

    SAME_CODE(DT_EINVAL, cluster_args("--worker_hosts=a:1", "--job_name=chief", NULL, E));
    SAME_CODE(DT_EINVAL, cluster_args("--worker_hosts=a:1", "--task_index=3", "--job_name=worker", E));
    SAME_CODE(DT_EINVAL, cluster_args("--worker_hosts=a:1", "--worker_hosts=b:1", NULL, E));
    SAME_CODE(DT_EINVAL, cluster_args("--worker_hosts=a:0", "--job_name=worker", NULL, E));

    dt_net *net = NULL;
    dt_error err = {0};
    int rc = dt_net_load(&net, model, 8, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc) return;
    SAME_CODE(DT_EINVAL, dt_serve(NULL, net, NULL, 600000, NULL, E)); /* not a ps */
    /* A ps that cannot bind: the port is taken by a socket of ours. */
    int port = free_port(), s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(s, (struct sockaddr *)&a, sizeof a) == 0 && listen(s, 1) == 0) {
        char hosts[64];
        snprintf(hosts, sizeof hosts, "127.0.0.1:%d", port);
        SAME_CODE(DT_ENET, serve(hosts, net, E));
    }
    close(s);

    SAME_CODE(DT_EIO, batches_first(tpath("no_such_data"), net, E));
    SAME_CODE(DT_EIO, batches_first(tpath("half_idx"), net, E));
    SAME_CODE(DT_EFORMAT, batches_first(tpath("bad_imgs"), net, E)); /* the loader's error, copied out */

    SAME_CODE(DT_EINVAL, optimizer("adagrad", 0.1f, net, NULL, E));
    dt_cluster *ps = NULL;
    char *argv[5] = {"prog", "--ps_hosts=127.0.0.1:2", "--worker_hosts=127.0.0.1:1", "--job_name=ps", NULL};
    int argc = 4;
    CHECK(dt_cluster_from_args(&ps, &argc, argv, &err) == 0);
    SAME_CODE(DT_EINVAL, optimizer("sgd", 0.1f, net, ps, E)); /* a ps does not distribute an optimizer */
    dt_cluster_free(ps);
    dt_net_free(net);

    dt_train_options o;
    dt_train_options_init(&o);
    o.data_path = tpath("idx");
    SAME_CODE(DT_EINVAL, train(o, E)); /* no model */
    o.model_path = tpath("missing.model");
    SAME_CODE(DT_EIO, train(o, E));
    o.model_path = tpath("typo.model");
    SAME_CODE(DT_EFORMAT, train(o, E));
    o.model_path = model;
    o.data_path = tpath("half_idx");
    SAME_CODE(DT_EIO, train(o, E));
    o.data_path = tpath("bad_imgs");
    o.batch_size = 1;
    o.fail_on_bad_images = 1;
    SAME_CODE(DT_EFORMAT, train(o, E));
    o.data_path = tpath("idx");
    o.optimizer = "adagrad";
    SAME_CODE(DT_EINVAL, train(o, E));
    o.optimizer = "sgd";
    o.ps_hosts = "127.0.0.1:1";
    o.worker_hosts = "127.0.0.1:2";
    o.job_name = "ps";
    o.task_index = "4";
    SAME_CODE(DT_EINVAL, train(o, E));
}

/* ---- a distributed run whose end fails --------------------------------------------------------- */

typedef struct {
    dt_train_options o;
    dt_error *err;
    FILE *log;
    int rc;
    atomic_int done;
} train_thread;

static void *train_main(void *arg) {
    train_thread *t = arg;
    t->rc = dt_train(&t->o, t->log, NULL, t->err);
    atomic_store(&t->done, 1);
    return NULL;
}

static int file_has(const char *path, const char *needle) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[2048];
    int hit = 0;
    while (!hit && fgets(line, sizeof line, f)) hit = strstr(line, needle) != NULL;
    fclose(f);
    return hit;
}

/* One ps and two workers, of which only the chief runs: at the end its wait for worker 1 fails
 * (logged, not returned), then the ps is stopped under it, so telling the ps to shut down fails
 * and dt_train returns that failure. */
static int failing_end(dt_error *E) {
    char ps_hosts[64], worker_hosts[64], log_path[600];
    snprintf(ps_hosts, sizeof ps_hosts, "127.0.0.1:%d", free_port());
    snprintf(worker_hosts, sizeof worker_hosts, "127.0.0.1:%d,127.0.0.1:%d", free_port(), free_port());
    snprintf(log_path, sizeof log_path, "%s", tpath(E ? "chief_err.log" : "chief_null.log"));
    volatile int ps_stop = 0;
    dt_error ps_err = {0};
    train_thread ps = {.err = &ps_err, .log = fopen("/dev/null", "w")}, chief = {.err = E, .log = fopen(log_path, "w")};
    dt_train_options_init(&ps.o);
    ps.o.model_path = tpath("tiny.model");
    ps.o.data_path = tpath("idx");
    ps.o.optimizer = "sgd";
    ps.o.logdir = ps.o.summary_dir = "";
    ps.o.ps_hosts = ps_hosts;
    ps.o.worker_hosts = worker_hosts;
    ps.o.threads = 1;
    ps.o.heartbeat_timeout_ms = 2000;
    chief.o = ps.o;
    ps.o.job_name = "ps";
    ps.o.stop = &ps_stop;
    chief.o.job_name = "worker";
    chief.o.task_index = "0";
    chief.o.batch_size = 2;
    chief.o.train_steps = 2;
    chief.o.connect_timeout_ms = 10000;
    pthread_t tp, tc;
    pthread_create(&tp, NULL, train_main, &ps);
    pthread_create(&tc, NULL, train_main, &chief);
    /* Training ends at once; the chief then waits heartbeat_timeout for worker 1: stop the ps then. */
    for (int i = 0; i < 3000 && !atomic_load(&chief.done); i++) {
        fflush(chief.log);
        if (file_has(log_path, "trained ")) break;
        sleep_ms(10);
    }
    ps_stop = 1;
    pthread_join(tc, NULL);
    pthread_join(tp, NULL);
    fclose(ps.log);
    fclose(chief.log);
    CHECK_MSG(file_has(log_path, "ending the cluster anyway"), "the chief's log: %s", log_path);
    return chief.rc;
}

static void test_distributed_end(void) {
    unsetenv("TF_CONFIG");
    dt_error e = {0};
    int with = failing_end(&e), without = failing_end(NULL);
    CHECK_MSG(with != 0 && with == without, "%d with err (%s), %d with NULL", with, e.msg, without);
}

/* ---- the caller's log and idle timeout (dt_serve, dt_optimizer_distribute) ---------------------- */

static int cluster_of(dt_cluster **c, const char *ps_hosts, const char *worker_hosts, const char *job, dt_error *E) {
    char a1[96], a2[96], a3[32];
    snprintf(a1, sizeof a1, "--ps_hosts=%s", ps_hosts);
    snprintf(a2, sizeof a2, "--worker_hosts=%s", worker_hosts);
    snprintf(a3, sizeof a3, "--job_name=%s", job);
    char *argv[5] = {"prog", a1, a2, a3, NULL};
    int argc = 4;
    return dt_cluster_from_args(c, &argc, argv, E);
}

typedef struct {
    const dt_cluster *c;
    const dt_net *net;
    FILE *log;
    int idle_ms, rc;
    dt_error err;
} serve_thread;

static void *serve_main(void *arg) {
    serve_thread *t = arg;
    t->rc = dt_serve(t->c, t->net, t->log, t->idle_ms, NULL, &t->err);
    return NULL;
}

static void test_log_and_idle_timeout(void) {
    unsetenv("TF_CONFIG");
    dt_error e = {0};
    dt_net *net = NULL;
    int rc = dt_net_load(&net, tpath("tiny.model"), 2, &e);
    CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc) return;
    char ps_hosts[64], worker_hosts[64], ps_log[600], worker_log[600];
    snprintf(ps_hosts, sizeof ps_hosts, "127.0.0.1:%d", free_port());
    snprintf(worker_hosts, sizeof worker_hosts, "127.0.0.1:%d", free_port());
    snprintf(ps_log, sizeof ps_log, "%s", tpath("serve.log"));
    snprintf(worker_log, sizeof worker_log, "%s", tpath("worker.log"));
    dt_cluster *ps = NULL, *worker = NULL;
    CHECK(cluster_of(&ps, ps_hosts, worker_hosts, "ps", &e) == 0);
    CHECK(cluster_of(&worker, ps_hosts, worker_hosts, "worker", &e) == 0);
    if (!ps || !worker) goto out;

    /* A negative idle timeout is refused; a ps nobody talks to gives up after the caller's 300 ms,
     * having logged to the caller's file. */
    SAME_CODE(DT_EINVAL, dt_serve(ps, net, NULL, -1, NULL, E));
    serve_thread t = {.c = ps, .net = net, .log = fopen(ps_log, "w"), .idle_ms = 300};
    double t0 = (double)time(NULL);
    serve_main(&t);
    fclose(t.log);
    CHECK_MSG(t.rc == DT_ETIMEOUT, "dt_serve returned %d: %s", t.rc, t.err.msg);
    CHECK((double)time(NULL) - t0 < 20);
    CHECK_MSG(file_has(ps_log, "serving"), "the ps's log %s", ps_log);

    /* A ps (idle timeout 0: never) and the chief on the public API: the worker's lines go to the
     * caller's file, and the chief's end stops the ps (returns 0). */
    t = (serve_thread){.c = ps, .net = net, .log = fopen(ps_log, "w"), .idle_ms = 0};
    pthread_t tp;
    pthread_create(&tp, NULL, serve_main, &t);
    dt_optimizer *opt = NULL;
    FILE *wlog = fopen(worker_log, "w");
    int64_t step = 0;
    rc = dt_optimizer_new(&opt, "sgd", 0.1f, net, &e);
    if (!rc) rc = dt_optimizer_distribute(opt, worker, net, 0, wlog, &e);
    if (!rc) rc = dt_optimizer_start(opt, net, 1, &step, &e);
    if (!rc) rc = dt_optimizer_finish(opt, &e);
    CHECK_MSG(rc == 0, "%s", e.msg);
    dt_optimizer_free(opt);
    pthread_join(tp, NULL);
    fclose(wlog);
    fclose(t.log);
    CHECK_MSG(t.rc == 0, "dt_serve returned %d: %s", t.rc, t.err.msg);
    CHECK_MSG(file_has(worker_log, "chief: initialised 1 ps task(s)"), "the worker's log %s", worker_log);
    CHECK_MSG(file_has(ps_log, "shutdown by the chief"), "the ps's log %s", ps_log);
out:
    dt_cluster_free(ps);
    dt_cluster_free(worker);
    dt_net_free(net);
}

/* ---- the building blocks with dtrain train's flags (dt_serve_opts, dt_optimizer_distribute_opts) ---- */

typedef struct {
    const dt_cluster *c;
    const dt_net *net;
    const dt_options *opts;
    FILE *log;
    int rc;
    dt_error err;
} serve_opts_thread;

static void *serve_opts_main(void *arg) {
    serve_opts_thread *t = arg;
    t->rc = dt_serve_opts(t->c, t->net, t->opts, t->log, &t->err);
    return NULL;
}

static dt_options *flags_of(const char *const *kv, dt_error *E) {
    dt_options *o = NULL;
    if (dt_options_new(&o, E)) return NULL;
    for (int i = 0; kv[i]; i += 2)
        if (dt_options_set(o, kv[i], kv[i + 1], E)) {
            dt_options_free(o);
            return NULL;
        }
    return o;
}

/* A ps of dt_serve_opts with --auth=curve refuses a worker without keys and trains with the chief of
 * dt_optimizer_distribute_opts (curve, bf16, 1 KiB chunks, overlap, sync): the chief's end stops it. */
static void test_building_blocks_with_flags(void) {
    unsetenv("TF_CONFIG");
    dt_error e = {0};
    dt_net *net = NULL;
    int rc = dt_net_load(&net, tpath("tiny.model"), 2, &e);
    CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc) return;
    char keys[600], key_from[700], key_to[700], ps_hosts[64], worker_hosts[64], ps_log[600], worker_log[600];
    snprintf(keys, sizeof keys, "%s", tpath("keys"));
    CHECK_MSG(dt_auth_keygen(keys, "server", &e) == 0 && dt_auth_keygen(keys, "client", &e) == 0, "%s", e.msg);
    snprintf(key_from, sizeof key_from, "%s/client.key", keys);
    snprintf(key_to, sizeof key_to, "%s/authorized", keys);
    mkdir(key_to, 0755);
    snprintf(key_to, sizeof key_to, "%s/authorized/worker0.key", keys);
    char key[64] = "";
    FILE *f = fopen(key_from, "r");
    if (f && fgets(key, sizeof key, f)) write_text(key_to, key);
    if (f) fclose(f);
    snprintf(ps_hosts, sizeof ps_hosts, "127.0.0.1:%d", free_port());
    snprintf(worker_hosts, sizeof worker_hosts, "127.0.0.1:%d", free_port());
    snprintf(ps_log, sizeof ps_log, "%s", tpath("serve_opts.log"));
    snprintf(worker_log, sizeof worker_log, "%s", tpath("worker_opts.log"));
    dt_cluster *ps = NULL, *worker = NULL;
    const char *ps_flags[] = {"auth", "curve", "keys", keys, "idle_timeout", "60000", NULL};
    const char *chief_flags[] = {"auth", "curve", "keys", keys, "compression", "bf16", "chunk_kb", "1",
                                 "overlap", "priority", "issync", "1", NULL};
    const char *stranger_flags[] = {"connect_timeout", "2", NULL};
    dt_options *pso = flags_of(ps_flags, &e), *wo = flags_of(chief_flags, &e), *so = flags_of(stranger_flags, &e);
    CHECK_MSG(pso && wo && so, "%s", e.msg);
    CHECK(cluster_of(&ps, ps_hosts, worker_hosts, "ps", &e) == 0);
    CHECK(cluster_of(&worker, ps_hosts, worker_hosts, "worker", &e) == 0);
    if (!ps || !worker || !pso || !wo || !so) goto out;
    SAME_CODE(DT_EINVAL, dt_serve_opts(worker, net, pso, NULL, E)); /* not a ps */
    serve_opts_thread t = {.c = ps, .net = net, .opts = pso, .log = fopen(ps_log, "w")};
    pthread_t tp;
    pthread_create(&tp, NULL, serve_opts_main, &t);
    /* A worker without keys is refused (it gives up after its connect timeout). */
    dt_optimizer *opt = NULL;
    int64_t step = 0;
    rc = dt_optimizer_new(&opt, "sgd", 0.1f, net, &e);
    if (!rc) rc = dt_optimizer_distribute_opts(opt, worker, net, so, NULL, &e);
    if (!rc) rc = dt_optimizer_start(opt, net, 1, &step, &e);
    CHECK_MSG(rc != 0, "a worker without keys trained against a curve ps");
    dt_optimizer_free(opt);
    opt = NULL;
    FILE *wlog = fopen(worker_log, "w");
    rc = dt_optimizer_new(&opt, "sgd", 0.1f, net, &e);
    if (!rc) rc = dt_optimizer_distribute_opts(opt, worker, net, wo, wlog, &e);
    if (!rc) rc = dt_optimizer_start(opt, net, 1, &step, &e);
    for (int i = 0; !rc && i < 3; i++) rc = dt_optimizer_apply(opt, net, &step, &e);
    if (!rc) rc = dt_optimizer_finish(opt, &e);
    CHECK_MSG(rc == 0 && step == 3, "rc %d step %lld: %s", rc, (long long)step, e.msg);
    dt_optimizer_free(opt);
    pthread_join(tp, NULL);
    fclose(wlog);
    fclose(t.log);
    CHECK_MSG(t.rc == 0, "dt_serve_opts returned %d: %s", t.rc, t.err.msg);
    CHECK_MSG(file_has(ps_log, "refused a client"), "the ps's log %s", ps_log);
    CHECK_MSG(file_has(ps_log, "shutdown by the chief"), "the ps's log %s", ps_log);
out:
    dt_options_free(pso);
    dt_options_free(wo);
    dt_options_free(so);
    dt_cluster_free(ps);
    dt_cluster_free(worker);
    dt_net_free(net);
}

/* The binding's calls (docs/python.md): options by flag name with the table's messages, arrays in
 * memory (uint8 and float32 train alike; bad labels refused), the step API, its checkpoints. */
static int opt_set(dt_options *o, const char *flag, const char *value, dt_error *E) {
    return dt_options_set(o, flag, value, E);
}

static void test_options_and_model(void) {
    char model[600];
    snprintf(model, sizeof model, "%s", tpath("tiny.model")); /* test_single_process wrote it */
    dt_options *o = NULL;
    dt_error e = {0};
    CHECK(dt_options_new(&o, &e) == 0);
    SAME_CODE(DT_EINVAL, opt_set(o, "learning_rat", "0.1", E));
    CHECK(opt_set(o, "learning_rat", "1", &e) == DT_EINVAL);
    CHECK_MSG(strstr(e.msg, "did you mean --learning_rate"), "%s", e.msg);
    SAME_CODE(DT_EINVAL, opt_set(o, "batch_size", "0", E));
    SAME_CODE(DT_EINVAL, opt_set(o, "batch_size", "abc", E));
    const char *flags[][2] = {{"model", model}, {"batch_size", "8"}, {"train_steps", "6"}, {"seed", "4"},
                              {"threads", "1"}, {"logdir", ""}, {"summary_dir", ""}, {"optimizer", "sgd"},
                              {"learning_rate", "0.05"}};
    for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++) CHECK(opt_set(o, flags[k][0], flags[k][1], &e) == 0);
    CHECK(opt_set(o, "batch_size", "4", &e) == 0); /* set again: replaced */
    char v[64];
    CHECK(dt_options_get(o, "batch_size", v, sizeof v, &e) == 0 && !strcmp(v, "4"));
    CHECK(dt_options_get(o, "optimizer", v, sizeof v, &e) == 0 && !strcmp(v, "sgd"));
    enum { N = 16 };
    uint8_t x8[N * 16];
    float xf[N * 16];
    int32_t y[N];
    for (int i = 0; i < N; i++) {
        y[i] = i % 2;
        for (int j = 0; j < 16; j++) x8[i * 16 + j] = (uint8_t)((i % 2) * 200 + i + j), xf[i * 16 + j] = x8[i * 16 + j] / 255.0f;
    }
    dt_model *m = NULL;
    CHECK_MSG(dt_model_new(&m, o, &e) == 0, "%s", e.msg);
    if (!m) goto out;
    size_t n = dt_model_param_count(m);
    float *a = calloc(n, sizeof(float)), *b = calloc(n, sizeof(float));
    /* fit on uint8 and on the same pixels as float32: the same parameters, bit for bit */
    for (int k = 0; k < 2; k++) {
        CHECK(dt_options_set_arrays(o, 0, k ? (const void *)xf : x8, k ? DT_FLOAT32 : DT_UINT8, y, N, 4, 4, 1, &e) == 0);
        dt_options_set_params_out(o, k ? b : a, n);
        dt_train_result r;
        FILE *devnull = fopen("/dev/null", "w");
        int rc = dt_options_train(o, devnull, &r, &e);
        fclose(devnull);
        CHECK_MSG(rc == 0 && r.steps == 6, "%d: %s", rc, e.msg);
    }
    CHECK(memcmp(a, b, n * sizeof(float)) == 0);
    /* a label past the model's classes: the run refuses it, naming the arrays */
    int32_t bad[N];
    memcpy(bad, y, sizeof bad);
    bad[5] = 7;
    dt_options_set_params_out(o, NULL, 0);
    CHECK(dt_options_set_arrays(o, 0, x8, DT_UINT8, bad, N, 4, 4, 1, &e) == 0);
    CHECK(dt_options_train(o, NULL, NULL, &e) == DT_ESHAPE && strstr(e.msg, "arrays has 8 classes"));
    SAME_CODE(DT_EINVAL, dt_options_set_arrays(o, 2, x8, DT_UINT8, y, N, 4, 4, 1, E));
    SAME_CODE(DT_EINVAL, dt_options_set_arrays(o, 0, x8, 5, y, N, 4, 4, 1, E));
    /* the step API: shapes, counts, labels refused before anything changes */
    int h, w, c;
    dt_model_input_shape(m, &h, &w, &c);
    CHECK(h == 4 && w == 4 && c == 1 && dt_model_num_classes(m) == 2 && dt_model_max_batch(m) == 4);
    float loss = 0;
    int correct = 0;
    SAME_CODE(DT_EINVAL, dt_model_train_step(m, x8, DT_UINT8, y, 5, &loss, &correct, E));
    SAME_CODE(DT_EINVAL, dt_model_train_step(m, x8, DT_UINT8, bad + 4, 2, &loss, &correct, E));
    SAME_CODE(DT_EINVAL, dt_model_train_step(m, NULL, DT_UINT8, y, 2, &loss, &correct, E));
    SAME_CODE(DT_ESHAPE, dt_model_get_params(m, a, n - 1, E));
    CHECK(dt_model_global_step(m) == 0);
    for (int i = 0; i < 4; i++)
        CHECK_MSG(dt_model_train_step(m, x8 + i * 64, DT_UINT8, y + i * 4, 4, &loss, &correct, &e) == 0, "%s", e.msg);
    CHECK(dt_model_global_step(m) == 4 && isfinite(loss));
    float logits[N * 2];
    double el = 0, acc = 0;
    CHECK(dt_model_predict(m, xf, DT_FLOAT32, N, logits, &e) == 0);
    CHECK(dt_model_evaluate(m, x8, DT_UINT8, y, N, &el, &acc, &e) == 0 && acc >= 0 && acc <= 1);
    /* a checkpoint restored into a fresh model: the same parameters and step */
    char ck[600];
    snprintf(ck, sizeof ck, "%s", tpath("model_ckpt"));
    CHECK_MSG(dt_model_save(m, ck, 0, &e) == 0, "%s", e.msg);
    dt_model *r = NULL;
    CHECK(dt_model_new(&r, o, &e) == 0);
    CHECK_MSG(r && dt_model_restore(r, ck, &e) == 1, "%s", e.msg);
    CHECK(r && dt_model_global_step(r) == 4);
    if (r) dt_model_get_params(r, b, n, &e);
    dt_model_get_params(m, a, n, &e);
    CHECK(memcmp(a, b, n * sizeof(float)) == 0);
    CHECK(r && dt_model_restore(r, tpath("no_such_dir"), &e) == 0);
    dt_model_free(r);
    free(a), free(b);
out:
    dt_model_free(m);
    dt_options_free(o);
}

int main(void) {
    tmp_make("api");
    RUN(test_wrap);
    RUN(test_single_process);
    RUN(test_distributed_end);
    RUN(test_log_and_idle_timeout);
    RUN(test_building_blocks_with_flags);
    RUN(test_options_and_model);
    tmp_remove();
    return test_summary();
}
