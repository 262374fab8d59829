/* Sync replicas on the parameter server (docs/protocol.md, "Training, sync replicas"): ps tasks in
 * threads, workers as clients in threads, all on 127.0.0.1 with bounded waits. Checks the mean
 * applied once per step, the barrier, the sum in worker-index order, stale gradients of backup
 * workers dropped and counted, the refusals, EXACT pulls, one step across several ps, and the
 * staleness bound. */
#include <pthread.h>
#include <stdatomic.h>

#include "compute/optim.h"
#include "core/clock.h"
#include "ps_harness.h"

static dt_opt_config sgd(float lr) {
    dt_opt_config o;
    dt_opt_config_init(&o, "sgd", lr, NULL);
    return o;
}

static void set_all(float *x, size_t n, float v) {
    for (size_t i = 0; i < n; i++) x[i] = v;
}

static int all_equal(const float *x, size_t n, float v) {
    for (size_t i = 0; i < n; i++)
        if (x[i] != v) return 0;
    return 1;
}

/* ---------- one step: the mean, applied once, behind a barrier ---------- */

typedef struct {
    dt_ps_client *c;
    const float *grad;
    int delay_ms;
    int64_t tag, min_step;
    uint64_t examples;        /* what the gradient says it averages (0: not said) */
    int rc;
    int64_t took_ms, step;
    dt_push_result res;
    float first;              /* parameter 0 as pulled */
} step_job;

static void *step_main(void *arg) {
    step_job *j = arg;
    if (j->delay_ms) sleep_ms(j->delay_ms);
    const float *gs[1] = {j->grad}, *views[1] = {NULL};
    int64_t steps[1] = {-1}, t0 = dt_clock_us() / 1000;
    dt_error e = {0};
    j->rc = dt_ps_client_set_examples(j->c, j->examples, &e);
    if (!j->rc) j->rc = dt_ps_client_push_pull(j->c, gs, j->tag, j->min_step, views, steps, &j->res, &e);
    j->took_ms = (dt_clock_us() / 1000) - t0;
    if (j->rc) fprintf(stderr, "  push_pull: %s\n", e.msg);
    j->step = steps[0];
    j->first = views[0] ? views[0][0] : NAN;
    return NULL;
}

/* One step of two sync workers on one ps of 100 floats, all 10, sgd 0.5: worker 0 (the chief)
 * pushes all 1s saying ex0 examples, worker 1 all v1 saying ex1, delay_ms late. j: how each
 * worker's step went (j[k].rc is -1 if the clients could not start); *st: the ps's stats at its end. */
static void two_workers_one_step(float v1, uint64_t ex0, uint64_t ex1, int delay_ms, step_job j[2], dt_ps_stats *st) {
    enum { N = 100 };
    ps_thread ps;
    ps_start(&ps, 0, N, NULL, 0);
    size_t sizes[1] = {N};
    dt_ps_client *w[2] = {client_sync(1, &ps, sizes, DT_ROLE_CHIEF, 0, 2, 2, 0),
                          client_sync(1, &ps, sizes, DT_ROLE_WORKER, 1, 2, 2, 0)};
    j[0] = j[1] = (step_job){.rc = -1};
    CHECK(w[0] && w[1]);
    if (!w[0] || !w[1]) goto out;
    static float p[N], g0[N], g1[N];
    set_all(p, N, 10.0f);
    set_all(g0, N, 1.0f);
    set_all(g1, N, v1);
    const float *src[1] = {p};
    dt_opt_config opt = sgd(0.5f);
    dt_error e = {0};
    CHECK(dt_ps_client_init(w[0], &opt, src, NULL, NULL, 0, &e) == DT_OK);
    j[0] = (step_job){.c = w[0], .grad = g0, .tag = 0, .min_step = 1, .examples = ex0};
    j[1] = (step_job){.c = w[1], .grad = g1, .tag = 0, .min_step = 1, .examples = ex1, .delay_ms = delay_ms};
    pthread_t th[2];
    for (int k = 0; k < 2; k++) pthread_create(&th[k], NULL, step_main, &j[k]);
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
out:
    dt_ps_client_close(w[0]);
    dt_ps_client_close(w[1]);
    ps_stop(&ps);
    *st = ps.stats;
}

/* Two workers; the second pushes 300 ms late. The first one's PULL is held until the step is
 * applied (the ps reports that wait), and both get p - lr * mean(g0, g1). */
static void test_mean_once_behind_barrier(void) {
    step_job j[2];
    dt_ps_stats st;
    two_workers_one_step(3.0f, 0, 0, 300, j, &st);
    CHECK(j[0].rc == DT_OK && j[1].rc == DT_OK);
    CHECK_MSG(j[0].took_ms >= 250, "the first worker came back after %lld ms, before the second pushed",
              (long long)j[0].took_ms);
    CHECK_MSG(j[0].res.wait_us >= 200000, "ps reported a barrier wait of %lld us", (long long)j[0].res.wait_us);
    CHECK(j[1].res.wait_us < 200000);
    CHECK(j[0].step == 1 && j[1].step == 1);
    CHECK(j[0].first == 10.0f - 0.5f * 2.0f && j[1].first == 10.0f - 0.5f * 2.0f);
    CHECK(j[0].res.n_stale == 0 && j[1].res.n_stale == 0);
    CHECK(st.global_step == 1 && st.updates == 1 && st.pushes == 2 && st.stale == 0 && st.weighted == 0);
}

/* Two workers whose gradients average 3 and 1 examples (1 and 5 each): the step applies the mean
 * over the 4 examples, (3 * 1 + 5) / 4 = 2, not the mean of the two gradients, 3. */
static void test_weighted_by_examples(void) {
    step_job j[2];
    dt_ps_stats st;
    two_workers_one_step(5.0f, 3, 1, 0, j, &st);
    CHECK(j[0].rc == DT_OK && j[1].rc == DT_OK);
    CHECK_MSG(j[0].first == 10.0f - 0.5f * 2.0f && j[1].first == 10.0f - 0.5f * 2.0f, "got %g and %g",
              (double)j[0].first, (double)j[1].first);
    CHECK(st.global_step == 1 && st.weighted == 1);
}

/* The gradients are summed in worker-index order whatever the arrival order: with
 * g = (1e8, -1e8, 1) for workers 0, 1, 2, index order gives (1e8 - 1e8) + 1 = 1, while the arrival
 * order 2, 0, 1 would give (1 + 1e8) - 1e8 = 0 in float. */
static void test_sum_in_worker_order(void) {
    enum { N = 8 };
    ps_thread ps;
    ps_start(&ps, 0, N, NULL, 0);
    size_t sizes[1] = {N};
    dt_ps_client *w[3];
    for (int k = 0; k < 3; k++) w[k] = client_sync(1, &ps, sizes, k ? DT_ROLE_WORKER : DT_ROLE_CHIEF, k, 3, 3, 0);
    CHECK(w[0] && w[1] && w[2]);
    if (w[0] && w[1] && w[2]) {
        static float p[N], g[3][N], got[N];
        const float vals[3] = {1e8f, -1e8f, 1.0f};
        for (int k = 0; k < 3; k++) set_all(g[k], N, vals[k]);
        const float *src[1] = {p};
        dt_opt_config opt = sgd(1.0f);
        dt_error e = {0};
        CHECK(dt_ps_client_init(w[0], &opt, src, NULL, NULL, 0, &e) == DT_OK);
        const int order[3] = {2, 0, 1};
        for (int i = 0; i < 3; i++) {
            const float *gs[1] = {g[order[i]]};
            CHECK(dt_ps_client_push_all(w[order[i]], gs, 0, NULL, &e) == DT_OK);
        }
        float *dst[1] = {got};
        int64_t steps[1];
        CHECK(dt_ps_client_pull_all(w[0], dst, 1, steps, &e) == DT_OK);
        volatile float a = vals[0], b = vals[1], c = vals[2]; /* no constant folding */
        float index_order = -(((a + b) + c) / 3.0f), arrival_order = -(((c + a) + b) / 3.0f);
        CHECK(index_order != arrival_order); /* the test can tell them apart */
        CHECK_MSG(all_equal(got, N, index_order), "got %.9g, index order %.9g, arrival order %.9g", (double)got[0],
                  (double)index_order, (double)arrival_order);
        CHECK(steps[0] == 1);
    }
    for (int k = 0; k < 3; k++) dt_ps_client_close(w[k]);
    ps_stop(&ps);
}

/* Backup workers: aggregate 2 of 3. The first two fresh gradients make the step; a late one is
 * stale: dropped (not in the mean), acknowledged as stale and counted for its worker. */
static void test_backup_worker_stale(void) {
    enum { N = 16 };
    ps_thread ps;
    ps_start(&ps, 0, N, NULL, 0);
    size_t sizes[1] = {N};
    dt_ps_client *w[3];
    for (int k = 0; k < 3; k++) w[k] = client_sync(1, &ps, sizes, k ? DT_ROLE_WORKER : DT_ROLE_CHIEF, k, 2, 3, 0);
    CHECK(w[0] && w[1] && w[2]);
    if (w[0] && w[1] && w[2]) {
        static float p[N], g[3][N], got[N];
        for (int k = 0; k < 3; k++) set_all(g[k], N, (float)(1 << k)); /* 1, 2, 4 */
        const float *src[1] = {p};
        dt_opt_config opt = sgd(1.0f);
        dt_error e = {0};
        CHECK(dt_ps_client_init(w[0], &opt, src, NULL, NULL, 0, &e) == DT_OK);
        dt_push_result r;
        const float *g0[1] = {g[0]}, *g1[1] = {g[1]}, *g2[1] = {g[2]};
        /* step 0: workers 0 and 1; worker 2 late */
        CHECK(dt_ps_client_push_all(w[0], g0, 0, &r, &e) == DT_OK && r.n_stale == 0);
        CHECK(dt_ps_client_push_all(w[1], g1, 0, &r, &e) == DT_OK && r.n_stale == 0 && r.global_step == 1);
        CHECK(dt_ps_client_push_all(w[2], g2, 0, &r, &e) == DT_OK);
        CHECK(r.n_stale == 1 && r.global_step == 1);
        /* step 1: workers 2 and 0; worker 1 late */
        CHECK(dt_ps_client_push_all(w[2], g2, 1, &r, &e) == DT_OK && r.n_stale == 0);
        CHECK(dt_ps_client_push_all(w[0], g0, 1, &r, &e) == DT_OK && r.n_stale == 0 && r.global_step == 2);
        CHECK(dt_ps_client_push_all(w[1], g1, 1, &r, &e) == DT_OK && r.n_stale == 1);
        float *dst[1] = {got};
        CHECK(dt_ps_client_pull_all(w[1], dst, 2, NULL, &e) == DT_OK);
        CHECK_MSG(all_equal(got, N, -(1.5f + 2.5f)), "got %g", (double)got[0]); /* mean(1,2) + mean(4,1) */
        CHECK(dt_ps_client_get_stats(w[2])->stale_pushes == 1 && dt_ps_client_get_stats(w[0])->stale_pushes == 0);
    }
    for (int k = 0; k < 3; k++) dt_ps_client_close(w[k]);
    ps_stop(&ps);
    CHECK(ps.stats.global_step == 2 && ps.stats.updates == 2 && ps.stats.pushes == 4 && ps.stats.stale == 2);
}

/* ---------- refusals ---------- */

static void expect_push_refused(dt_ps_client *c, const float *g, int64_t tag, const char *needle) {
    const float *gs[1] = {g};
    dt_error e = {0};
    int rc = dt_ps_client_push_all(c, gs, tag, NULL, &e);
    CHECK_MSG(rc == DT_EPROTO && strstr(e.msg, needle), "rc %d, \"%s\" lacks \"%s\"", rc, e.msg, needle);
}

static void test_sync_refusals(void) {
    enum { N = 4 };
    static float p[N], g[N];
    const float *src[1] = {p};
    dt_opt_config opt = sgd(0.1f);
    dt_error e = {0};
    size_t sizes[1] = {N};
    ps_thread ps[2];
    ps_start(&ps[0], 0, N, NULL, 0); /* asynchronous */
    ps_start(&ps[1], 0, N, NULL, 0); /* sync: aggregate 2 of 3, staleness 1 */
    dt_ps_client *ac = client(1, &ps[0], sizes, DT_ROLE_CHIEF, 0);
    dt_ps_client *sc = client_sync(1, &ps[1], sizes, DT_ROLE_CHIEF, 0, 2, 3, 1);
    dt_ps_client *sync_to_async = client_sync(1, &ps[0], sizes, DT_ROLE_WORKER, 1, 2, 3, 1);
    dt_ps_client *async_to_sync = client(1, &ps[1], sizes, DT_ROLE_WORKER, 1);
    dt_ps_client *w7 = client_sync(1, &ps[1], sizes, DT_ROLE_WORKER, 7, 2, 3, 1);
    CHECK(ac && sc && sync_to_async && async_to_sync && w7);
    if (ac && sc && sync_to_async && async_to_sync && w7) {
        CHECK(dt_ps_client_init(ac, &opt, src, NULL, NULL, 0, &e) == DT_OK);
        CHECK(dt_ps_client_init(sc, &opt, src, NULL, NULL, 0, &e) == DT_OK);
        expect_push_refused(sync_to_async, g, 0, "asynchronous training (give every task the same --issync)");
        expect_push_refused(async_to_sync, g, 0, "sync replicas (give every task the same --issync)");
        expect_push_refused(w7, g, 0, "worker 7 is not in this cluster (the chief declared 3 worker task(s)");
        expect_push_refused(sc, g, 2, "gradient for step 2, but this ps is at step 0 and staleness 1 allows at most 1");
        const float *gs[1] = {g};
        CHECK(dt_ps_client_push_all(sc, gs, 1, NULL, &e) == DT_OK); /* within the bound: held */
        CHECK(dt_ps_client_push_all(sc, gs, 1, NULL, &e) == DT_OK); /* again: replaces (test_sync_replace) */
        /* The examples a client says are checked before anything is sent. */
        CHECK(dt_ps_client_set_examples(sc, DT_WIRE_MAX_EXAMPLES + 1, &e) == DT_EINVAL);
        CHECK_CONTAINS(e.msg, "beyond the bound DT_WIRE_MAX_EXAMPLES = 1048576");
    }
    /* A client's own sync configuration is checked before anything is sent. */
    const char *eps[1] = {ps[1].endpoint};
    dt_ps_client_config cc = {.n_ps = 1, .endpoints = eps, .shard_floats = sizes, .role = DT_ROLE_WORKER,
                              .replicas_to_aggregate = 3, .total_num_replicas = 2};
    dt_ps_client *bad = NULL;
    CHECK(dt_ps_client_open(&bad, &cc, &e) == DT_EINVAL && bad == NULL);
    CHECK_CONTAINS(e.msg, "aggregate 3, total 2");
    dt_ps_client_close(ac);
    dt_ps_client_close(sc);
    dt_ps_client_close(sync_to_async);
    dt_ps_client_close(async_to_sync);
    dt_ps_client_close(w7);
    ps_stop(&ps[0]);
    ps_stop(&ps[1]);
    CHECK(ps[1].stats.updates == 0 && ps[1].stats.pushes == 2);
}

/* A worker that sends a step's gradient twice (it restarted, or pulled again after a timeout):
 * the newer one replaces the first in the mean. */
static void test_sync_replace(void) {
    enum { N = 4 };
    static float p[N], g[3][N], got[N];
    const float vals[3] = {1.0f, 5.0f, 3.0f};
    for (int k = 0; k < 3; k++) set_all(g[k], N, vals[k]);
    ps_thread ps;
    ps_start(&ps, 0, N, NULL, 0);
    size_t sizes[1] = {N};
    dt_ps_client *w0 = client_sync(1, &ps, sizes, DT_ROLE_CHIEF, 0, 2, 2, 0);
    dt_ps_client *w1 = client_sync(1, &ps, sizes, DT_ROLE_WORKER, 1, 2, 2, 0);
    CHECK(w0 && w1);
    if (w0 && w1) {
        const float *src[1] = {p}, *a[1] = {g[0]}, *b[1] = {g[1]}, *c[1] = {g[2]};
        float *dst[1] = {got};
        dt_opt_config opt = sgd(1.0f);
        dt_error e = {0};
        CHECK(dt_ps_client_init(w0, &opt, src, NULL, NULL, 0, &e) == DT_OK);
        CHECK(dt_ps_client_push_all(w0, a, 0, NULL, &e) == DT_OK);
        CHECK(dt_ps_client_push_all(w0, b, 0, NULL, &e) == DT_OK);
        CHECK(dt_ps_client_push_all(w1, c, 0, NULL, &e) == DT_OK);
        CHECK(dt_ps_client_pull_all(w1, dst, 1, NULL, &e) == DT_OK);
        CHECK_MSG(all_equal(got, N, -4.0f), "got %g, want -(5 + 3) / 2", (double)got[0]);
    }
    dt_ps_client_close(w0);
    dt_ps_client_close(w1);
    ps_stop(&ps);
    CHECK(ps.stats.updates == 1);
}

/* Worker liveness: aggregate 3 of 3, worker 2 silent. After the liveness timeout the ps applies the
 * step with the two live workers' mean; worker 2 speaking again makes it count again. */
static void test_lost_worker(void) {
    enum { N = 4 };
    static float p[N], g[3][N], got[N];
    for (int k = 0; k < 3; k++) set_all(g[k], N, (float)(k + 1));
    ps_thread ps;
    ps_start(&ps, 0, N, NULL, 0);
    size_t sizes[1] = {N};
    liveness_ms = 300;
    dt_ps_client *w[3];
    for (int k = 0; k < 3; k++) w[k] = client_sync(1, &ps, sizes, k ? DT_ROLE_WORKER : DT_ROLE_CHIEF, k, 3, 3, 0);
    liveness_ms = 0;
    CHECK(w[0] && w[1] && w[2]);
    if (w[0] && w[1] && w[2]) {
        const float *src[1] = {p};
        float *dst[1] = {got};
        dt_opt_config opt = sgd(1.0f);
        dt_error e = {0};
        int64_t steps[1] = {0};
        CHECK(dt_ps_client_init(w[0], &opt, src, NULL, NULL, 0, &e) == DT_OK);
        int64_t t0 = dt_clock_us() / 1000;
        for (int k = 0; k < 2; k++) {
            const float *gs[1] = {g[k]};
            CHECK(dt_ps_client_push_all(w[k], gs, 0, NULL, &e) == DT_OK);
        }
        /* The barrier: held until worker 2 is declared lost, then the mean of workers 0 and 1. */
        CHECK(dt_ps_client_pull_all(w[0], dst, 1, steps, &e) == DT_OK);
        int64_t waited = (dt_clock_us() / 1000) - t0;
        CHECK_MSG(waited >= 250 && waited < 2500, "step applied after %lld ms (liveness 300 ms)", (long long)waited);
        CHECK_MSG(steps[0] == 1 && all_equal(got, N, -1.5f), "step %lld, got %g, want -(1 + 2) / 2",
                  (long long)steps[0], (double)got[0]);
        /* Every worker speaks (worker 1 may have been lost too while worker 0 waited): step 1
         * needs all three again. */
        const float *g2[1] = {g[2]}, *g0[1] = {g[0]}, *g1[1] = {g[1]};
        for (int k = 0; k < 3; k++) CHECK(dt_ps_client_status(w[k], NULL, &e) == DT_OK);
        CHECK(dt_ps_client_push_all(w[2], g2, 1, NULL, &e) == DT_OK);
        CHECK(dt_ps_client_push_all(w[0], g0, 1, NULL, &e) == DT_OK);
        dt_ps_shard_status st[1];
        CHECK(dt_ps_client_status(w[1], st, &e) == DT_OK && st[0].global_step == 1);
        CHECK(dt_ps_client_push_all(w[1], g1, 1, NULL, &e) == DT_OK);
        CHECK(dt_ps_client_pull_all(w[1], dst, 2, steps, &e) == DT_OK);
        CHECK_MSG(steps[0] == 2 && all_equal(got, N, -1.5f - 2.0f), "step %lld, got %g", (long long)steps[0],
                  (double)got[0]);
    }
    for (int k = 0; k < 3; k++) dt_ps_client_close(w[k]);
    CHECK(ps_stop(&ps) == DT_EINTR);
}

/* Strict mode: the lost worker stops the job. The held PULL is refused saying so, and the ps
 * returns DT_ETIMEOUT by itself (after one more liveness period, so workers hear why). */
static void test_strict_lost_worker(void) {
    enum { N = 4 };
    static float p[N], g[N], got[N];
    ps_thread ps;
    ps_start(&ps, 0, N, NULL, 0);
    size_t sizes[1] = {N};
    liveness_ms = 200, strict_mode = 1;
    dt_ps_client *w0 = client_sync(1, &ps, sizes, DT_ROLE_CHIEF, 0, 2, 2, 0);
    liveness_ms = 0, strict_mode = 0;
    CHECK(w0 != NULL);
    if (w0) {
        const float *src[1] = {p}, *gs[1] = {g};
        float *dst[1] = {got};
        dt_opt_config opt = sgd(1.0f);
        dt_error e = {0};
        CHECK(dt_ps_client_init(w0, &opt, src, NULL, NULL, 0, &e) == DT_OK);
        CHECK(dt_ps_client_push_all(w0, gs, 0, NULL, &e) == DT_OK);
        CHECK(dt_ps_client_pull_all(w0, dst, 1, NULL, &e) == DT_EPROTO);
        CHECK_CONTAINS(e.msg, "worker 1 lost");
        CHECK_CONTAINS(e.msg, "--strict");
        CHECK(dt_ps_client_last_refusal(w0) == DT_WIRE_E_LOST);
    }
    /* The ps ends by itself: ps_stop's stop flag must not be what ends it. */
    for (int i = 0; i < 300 && !atomic_load(&ps.returned); i++) sleep_ms(10);
    CHECK(atomic_load(&ps.returned));
    dt_ps_client_close(w0);
    int rc = ps_stop(&ps);
    CHECK_MSG(rc == DT_ETIMEOUT, "ps returned %d: %s", rc, ps.err.msg);
    CHECK_CONTAINS(ps.err.msg, "--strict is set");
}

/* A re-INIT (the chief rolling the cluster back) is a new generation, and the PULLs held for a
 * step of the old values are refused with RESYNC so their workers pull again. */
static void test_reinit_generation(void) {
    enum { N = 4 };
    static float p[N], g[N], got[N];
    ps_thread ps;
    ps_start(&ps, 0, N, NULL, 0);
    size_t sizes[1] = {N};
    dt_ps_client *c = client_sync(1, &ps, sizes, DT_ROLE_CHIEF, 0, 2, 2, 0);
    dt_ps_client *w = client_sync(1, &ps, sizes, DT_ROLE_WORKER, 1, 2, 2, 0);
    CHECK(c && w);
    if (c && w) {
        const float *src[1] = {p}, *gs[1] = {g};
        float *dst[1] = {got};
        dt_opt_config opt = sgd(1.0f);
        dt_error e = {0};
        CHECK(dt_ps_client_shard(c, 0)->generation == 0 && !dt_ps_client_shard(c, 0)->initialised);
        CHECK(dt_ps_client_init(c, &opt, src, NULL, NULL, 5, &e) == DT_OK);
        CHECK(dt_ps_client_shard(c, 0)->generation == 1);
        step_job j = {.c = w, .grad = g, .tag = 5, .min_step = 6};
        pthread_t th;
        pthread_create(&th, NULL, step_main, &j); /* held at the barrier: the chief never pushes */
        sleep_ms(200);
        CHECK(dt_ps_client_init(c, &opt, src, NULL, NULL, 3, &e) == DT_OK);
        pthread_join(th, NULL);
        CHECK(j.rc == DT_EPROTO && dt_ps_client_last_refusal(w) == DT_WIRE_E_RESYNC);
        CHECK(dt_ps_client_shard(c, 0)->generation == 2);
        /* Now the worker's gradient for step 5 is ahead of the ps (at 3): RESYNC too. */
        CHECK(dt_ps_client_push_all(w, gs, 5, NULL, &e) == DT_EPROTO && dt_ps_client_last_refusal(w) == DT_WIRE_E_RESYNC);
        int64_t steps[1];
        CHECK(dt_ps_client_pull_all(w, dst, 0, steps, &e) == DT_OK && steps[0] == 3);
        CHECK(dt_ps_client_shard(w, 0)->generation == 2 && dt_ps_client_last_refusal(w) == 0);
    }
    dt_ps_client_close(c);
    dt_ps_client_close(w);
    ps_stop(&ps);
}

/* ---------- EXACT pulls ---------- */

static void send_exact_pull(void *s, uint32_t id, int64_t step) {
    dt_wire_header h = dt_wire_header_make(DT_MSG_PULL, DT_ROLE_WORKER, 0, id);
    h.global_step = step;
    h.flags = DT_WIRE_F_EXACT;
    dt_wire_send(s, NULL, &h, NULL, 0, NULL);
}

/* A sync ps keeps the last few steps: an EXACT pull of a kept step gets that step's values, one of
 * a step long gone is refused (109), one of a later step waits for it. */
static void test_exact_pulls(void) {
    enum { N = 10 };
    ps_thread ps;
    ps_start(&ps, 0, N, NULL, 0);
    size_t sizes[1] = {N};
    dt_ps_client *c = client_sync(1, &ps, sizes, DT_ROLE_CHIEF, 0, 1, 1, 0);
    CHECK(c != NULL);
    if (!c) {
        ps_stop(&ps);
        return;
    }
    static float p[N], g[N];
    set_all(g, N, -1.0f); /* sgd lr 1 from 0: the parameters equal the step */
    const float *src[1] = {p}, *gs[1] = {g};
    dt_opt_config opt = sgd(1.0f);
    dt_error e = {0};
    CHECK(dt_ps_client_init(c, &opt, src, NULL, NULL, 0, &e) == DT_OK);
    for (int t = 0; t < 6; t++) CHECK(dt_ps_client_push_all(c, gs, t, NULL, &e) == DT_OK);
    void *ctx = zmq_ctx_new();
    void *s = raw_open(ctx, ps.endpoint);
    dt_wire_in in;
    send_exact_pull(s, 31, 4);
    CHECK(raw_reply(s, &in) == DT_OK && in.hdr.type == DT_MSG_PARAMS && in.hdr.global_step == 4);
    CHECK(zmq_msg_size(&in.payload) == N * 4 && ((const float *)zmq_msg_data(&in.payload))[N - 1] == 4.0f);
    dt_wire_in_close(&in);
    send_exact_pull(s, 32, 1);
    CHECK(raw_reply(s, &in) == DT_OK && raw_error_says(&in, DT_WIRE_E_GONE, "step 1 of chunk 0 is no longer kept"));
    dt_wire_in_close(&in);
    send_exact_pull(s, 33, 8);
    zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
    CHECK(zmq_poll(&it, 1, 150) == 0); /* held: the ps is at step 6 */
    CHECK(dt_ps_client_push_all(c, gs, 6, NULL, &e) == DT_OK);
    CHECK(zmq_poll(&it, 1, 150) == 0); /* step 7: still held */
    CHECK(dt_ps_client_push_all(c, gs, 7, NULL, &e) == DT_OK);
    CHECK(raw_reply(s, &in) == DT_OK && in.hdr.type == DT_MSG_PARAMS && in.hdr.global_step == 8 &&
          in.hdr.request_id == 33);
    CHECK(zmq_msg_size(&in.payload) == N * 4 && ((const float *)zmq_msg_data(&in.payload))[0] == 8.0f);
    CHECK(in.hdr.params.waited_us >= 100000); /* it waited at least the two polls */
    dt_wire_in_close(&in);
    zmq_close(s);
    zmq_ctx_term(ctx);
    dt_ps_client_close(c);
    ps_stop(&ps);
}

/* ---------- several ps: one step ---------- */

/* A sync PUSH straight to ps `shard` over a raw socket (the client API always pushes to every ps). */
static int raw_sync_push(const char *endpoint, uint32_t shard, uint16_t task, int64_t step, const float *g, size_t n) {
    void *ctx = zmq_ctx_new();
    void *s = raw_open(ctx, endpoint);
    dt_wire_header h = dt_wire_header_make(DT_MSG_PUSH, DT_ROLE_WORKER, task, 77);
    h.shard = shard;
    h.local_step = step;
    h.flags = DT_WIRE_F_SYNC;
    zmq_msg_t m;
    zmq_msg_init_size(&m, n * sizeof(float));
    memcpy(zmq_msg_data(&m), g, n * sizeof(float));
    dt_wire_send(s, NULL, &h, &m, 0, NULL);
    dt_wire_in in;
    int ok = raw_reply(s, &in) == DT_OK && in.hdr.type == DT_MSG_PUSH_ACK && in.hdr.status == DT_WIRE_OK;
    dt_wire_in_close(&in);
    zmq_close(s);
    zmq_ctx_term(ctx);
    return ok;
}

typedef struct {
    const char *endpoint;
    const float *g;
    size_t n;
    int ok;
} late_push;

static void *late_push_main(void *arg) {
    late_push *l = arg;
    sleep_ms(200);
    l->ok = raw_sync_push(l->endpoint, 1, 1, 0, l->g, l->n);
    return NULL;
}

/* Two ps, one of them a step ahead (worker 1 has pushed to ps 0 only, so far): a worker's pull sees
 * ps 0 at step 1 and ps 1 at step 0, pulls ps 1 again at exactly step 1, and returns once ps 1
 * gets there: both shards at step 1, never a mix. */
static void test_pull_waits_for_one_step(void) {
    enum { N0 = 30, N1 = 20 };
    ps_thread ps[2];
    ps_start(&ps[0], 0, N0, NULL, 0);
    ps_start(&ps[1], 1, N1, NULL, 0);
    size_t sizes[2] = {N0, N1};
    dt_ps_client *chief = client_sync(2, ps, sizes, DT_ROLE_CHIEF, 0, 1, 2, 0);
    CHECK(chief != NULL);
    if (chief) {
        static float p0[N0], p1[N1], g0[N0], g1[N1];
        set_all(g0, N0, -1.0f);
        set_all(g1, N1, -1.0f);
        const float *src[2] = {p0, p1};
        dt_opt_config opt = sgd(1.0f);
        dt_error e = {0};
        CHECK(dt_ps_client_init(chief, &opt, src, NULL, NULL, 0, &e) == DT_OK);
        CHECK(raw_sync_push(ps[0].endpoint, 0, 1, 0, g0, N0)); /* ps 0 -> step 1 */
        late_push l = {.endpoint = ps[1].endpoint, .g = g1, .n = N1}; /* ps 1 -> step 1, 200 ms later */
        pthread_t th;
        pthread_create(&th, NULL, late_push_main, &l);
        const float *views[2] = {NULL, NULL};
        int64_t steps[2] = {-1, -1}, t0 = dt_clock_us() / 1000;
        CHECK(dt_ps_client_pull_views(chief, 0, views, steps, &e) == DT_OK);
        int64_t took = (dt_clock_us() / 1000) - t0;
        pthread_join(th, NULL);
        CHECK(l.ok);
        CHECK(steps[0] == 1 && steps[1] == 1);
        CHECK(views[0] && views[1] && all_equal(views[0], N0, 1.0f) && all_equal(views[1], N1, 1.0f));
        CHECK_MSG(took >= 150, "returned after %lld ms, before ps 1 reached step 1", (long long)took);
        CHECK(dt_ps_client_get_stats(chief)->repulls == 1);
    }
    dt_ps_client_close(chief);
    ps_stop(&ps[0]);
    ps_stop(&ps[1]);
}

/* Workers training against two ps with backup workers (2 of 3), random small delays: every pull
 * returns both shards at one step, every parameter equal to that step (sgd lr 1 on gradients -1:
 * the parameters count the updates, so a step applied twice or skipped would show). */
enum { TS_N0 = 100000, TS_N1 = 200, TS_STEPS = 60 };

static float ts_g0[TS_N0], ts_g1[TS_N1]; /* -1 everywhere (run_ts), read by every worker */

typedef struct {
    ps_thread *ps;
    int task, staleness, aggregate, total, slow_ms;
    int64_t steps_target;
    atomic_int *pushed;       /* [total] pushes sent by each worker (bumped before sending) */
    int n_workers;
    /* results */
    int errors, mismatches, bound_violations, max_lead;
    int64_t updates;
    uint64_t repulls;
} ts_worker;

static void *ts_worker_main(void *arg) {
    ts_worker *w = arg;
    size_t sizes[2] = {TS_N0, TS_N1};
    dt_ps_client *c = client_sync(2, w->ps, sizes, w->task ? DT_ROLE_WORKER : DT_ROLE_CHIEF, w->task, w->aggregate,
                                  w->total, w->staleness);
    if (!c) {
        w->errors++;
        return NULL;
    }
    const float *gs[2] = {ts_g0, ts_g1}, *views[2];
    int64_t steps[2];
    dt_error e = {0};
    if (dt_ps_client_wait_ready(c, 3000, &e) || dt_ps_client_pull_views(c, 0, views, steps, &e)) {
        fprintf(stderr, "  worker %d start: %s\n", w->task, e.msg);
        w->errors++;
        dt_ps_client_close(c);
        return NULL;
    }
    uint64_t rng = 0x9E3779B97F4A7C15ull * (uint64_t)(w->task + 1);
    int64_t iter = steps[0];
    while (steps[0] < w->steps_target) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        int ms = w->slow_ms + (int)(rng % 3);
        if (ms) sleep_ms(ms);
        atomic_fetch_add(&w->pushed[w->task], 1);
        dt_push_result r;
        int64_t min = iter + 1 - w->staleness;
        if (dt_ps_client_push_pull(c, gs, iter, min < 0 ? 0 : min, views, steps, &r, &e)) {
            fprintf(stderr, "  worker %d: %s\n", w->task, e.msg);
            w->errors++;
            break;
        }
        w->updates++;
        if (steps[0] != steps[1] || !all_equal(views[0], TS_N0, (float)steps[0]) ||
            !all_equal(views[1], TS_N1, (float)steps[1]))
            w->mismatches++;
        iter = steps[0] > iter + 1 ? steps[0] : iter + 1;
        /* The bound: about to compute step iter, at most staleness steps ahead of the slowest. */
        int slowest = INT32_MAX;
        for (int k = 0; k < w->n_workers; k++) {
            int v = atomic_load(&w->pushed[k]);
            if (v < slowest) slowest = v;
        }
        int lead = (int)(iter - slowest);
        if (lead > w->max_lead) w->max_lead = lead;
        if (w->aggregate == w->total && (lead > w->staleness || iter - steps[0] > w->staleness)) w->bound_violations++;
    }
    if (dt_ps_client_done(c, 0, &e)) w->errors++;
    w->repulls = dt_ps_client_get_stats(c)->repulls;
    dt_ps_client_close(c);
    return NULL;
}

/* Runs n workers against two fresh ps tasks until the step reaches target. */
static void run_ts(ts_worker *w, int n, int aggregate, int staleness, const int *slow_ms, int64_t target) {
    ps_thread ps[2];
    ps_start(&ps[0], 0, TS_N0, NULL, 0);
    ps_start(&ps[1], 1, TS_N1, NULL, 0);
    size_t sizes[2] = {TS_N0, TS_N1};
    dt_ps_client *chief = client_sync(2, ps, sizes, DT_ROLE_CHIEF, 0, aggregate, n, staleness);
    CHECK(chief != NULL);
    static float p0[TS_N0], p1[TS_N1];
    const float *src[2] = {p0, p1};
    dt_opt_config opt = sgd(1.0f);
    dt_error e = {0};
    if (chief) CHECK(dt_ps_client_init(chief, &opt, src, NULL, NULL, 0, &e) == DT_OK);
    set_all(ts_g0, TS_N0, -1.0f);
    set_all(ts_g1, TS_N1, -1.0f);
    atomic_int pushed[8];
    for (int k = 0; k < n; k++) atomic_init(&pushed[k], 0);
    pthread_t th[8];
    for (int k = 0; k < n; k++) {
        w[k] = (ts_worker){.ps = ps, .task = k, .staleness = staleness, .aggregate = aggregate, .total = n,
                           .slow_ms = slow_ms[k], .steps_target = target, .pushed = pushed, .n_workers = n};
        pthread_create(&th[k], NULL, ts_worker_main, &w[k]);
    }
    for (int k = 0; k < n; k++) pthread_join(th[k], NULL);
    dt_ps_shard_status st[2] = {{0}};
    if (chief) CHECK(dt_ps_client_status(chief, st, &e) == DT_OK);
    dt_ps_client_close(chief);
    ps_stop(&ps[0]);
    ps_stop(&ps[1]);
    /* every ps applied every step exactly once, the same steps */
    CHECK_MSG(ps[0].stats.global_step == ps[1].stats.global_step && ps[0].stats.global_step >= target,
              "ps steps %lld and %lld", (long long)ps[0].stats.global_step, (long long)ps[1].stats.global_step);
    CHECK(ps[0].stats.updates == (uint64_t)ps[0].stats.global_step && ps[1].stats.updates == ps[0].stats.updates);
    if (getenv("DT_TEST_VERBOSE"))
        for (int k = 0; k < n; k++)
            fprintf(stderr, "  %d workers, aggregate %d, staleness %d: worker %d: %lld updates, at most %d steps ahead, "
                    "%llu shards pulled again\n", n, aggregate, staleness, k, (long long)w[k].updates, w[k].max_lead,
                    (unsigned long long)w[k].repulls);
}

static void test_two_ps_one_step(void) {
    ts_worker w[3];
    const int slow[3] = {0, 0, 1};
    run_ts(w, 3, 2, 0, slow, TS_STEPS);
    uint64_t repulls = 0;
    for (int k = 0; k < 3; k++) {
        CHECK(w[k].errors == 0);
        CHECK_MSG(w[k].mismatches == 0, "worker %d saw %d pulls mixing steps", k, w[k].mismatches);
        CHECK(w[k].updates > 0);
        repulls += w[k].repulls;
    }
    /* How often a shard came back a step ahead and the others were pulled again (timing-dependent;
     * test_pull_waits_for_one_step makes it happen on purpose). */
    if (getenv("DT_TEST_VERBOSE")) fprintf(stderr, "  shards pulled again for one step: %llu\n", (unsigned long long)repulls);
}

/* Bounded staleness (e): 3 workers, all needed for a step, staleness 2, worker 2 slow. No worker
 * ever starts a step more than 2 ahead of the slowest, nor computes on parameters more than 2
 * steps old; the fast ones do run ahead (the bound is what holds them). */
static void test_staleness_bound(void) {
    ts_worker w[3];
    /* The slow worker's delay must dwarf a push_pull round trip even under ASan on a loaded
     * machine (CI saw 8 ms leave worker 0 never ahead), or the bound is never exercised. */
    const int slow[3] = {0, 0, 30};
    run_ts(w, 3, 3, 2, slow, 25);
    for (int k = 0; k < 3; k++) {
        CHECK(w[k].errors == 0 && w[k].mismatches == 0);
        CHECK_MSG(w[k].bound_violations == 0, "worker %d exceeded the bound %d times", k, w[k].bound_violations);
        CHECK_MSG(w[k].max_lead <= 2, "worker %d ran %d steps ahead of the slowest", k, w[k].max_lead);
    }
    CHECK_MSG(w[0].max_lead >= 1 && w[1].max_lead >= 1, "fast workers never ran ahead (%d, %d)", w[0].max_lead,
              w[1].max_lead);
    /* staleness 0: lockstep */
    const int slow0[3] = {0, 0, 3};
    run_ts(w, 3, 3, 0, slow0, 15);
    for (int k = 0; k < 3; k++) {
        CHECK(w[k].errors == 0 && w[k].mismatches == 0 && w[k].bound_violations == 0);
        CHECK_MSG(w[k].max_lead <= 0, "worker %d ran %d steps ahead at staleness 0", k, w[k].max_lead);
    }
}

/* Worker 1: slow but alive (a STATUS every 100 ms while it computes for delay_ms), then two steps in
 * a row (its second waits at the barrier for worker 0). */
static void *two_steps_main(void *arg) {
    step_job *j = arg;
    for (int waited = 0; waited < j->delay_ms; waited += 100) {
        dt_ps_client_status(j->c, NULL, NULL);
        sleep_ms(100);
    }
    j->delay_ms = 0;
    step_main(j);
    if (j->rc) return NULL;
    j->tag = 1, j->min_step = 2;
    step_main(j);
    return NULL;
}

/* A worker that waited at the barrier longer than the liveness timeout is alive: answering its held
 * PULL counts as hearing from it. Before, the ps declared it lost right after answering (its last
 * message was the old PUSH), applied the next step without it and dropped its gradient as stale. */
static void test_barrier_wait_keeps_worker_alive(void) {
    enum { N = 8 };
    ps_thread ps;
    ps_start(&ps, 0, N, NULL, 0);
    size_t sizes[1] = {N};
    int saved = liveness_ms;
    liveness_ms = 600;
    dt_ps_client *w[2] = {client_sync(1, &ps, sizes, DT_ROLE_CHIEF, 0, 2, 2, 0),
                          client_sync(1, &ps, sizes, DT_ROLE_WORKER, 1, 2, 2, 0)};
    liveness_ms = saved;
    CHECK(w[0] && w[1]);
    if (w[0] && w[1]) {
        static float p[N], g[N];
        set_all(p, N, 1.0f), set_all(g, N, 1.0f);
        const float *src[1] = {p};
        dt_opt_config o = sgd(0.1f);
        dt_error e = {0};
        CHECK(dt_ps_client_init(w[0], &o, src, NULL, NULL, 0, &e) == DT_OK);
        /* Worker 0 waits 1.5 s at the barrier of step 0 (worker 1 comes late, alive), then takes
         * 150 ms (well within the 600 ms timeout) before pushing step 1; worker 1 pushes step 1 at
         * once. */
        step_job j0 = {.c = w[0], .grad = g, .tag = 0, .min_step = 1};
        step_job j1 = {.c = w[1], .grad = g, .tag = 0, .min_step = 1, .delay_ms = 1500};
        pthread_t t1;
        pthread_create(&t1, NULL, two_steps_main, &j1);
        step_main(&j0);
        CHECK(j0.rc == DT_OK && j0.step == 1);
        sleep_ms(150);
        j0.tag = 1, j0.min_step = 2;
        step_main(&j0);
        pthread_join(t1, NULL);
        CHECK_MSG(j0.rc == DT_OK && j0.res.n_stale == 0 && j0.step == 2, "worker 0's step 1: rc %d, stale %d, step %lld",
                  j0.rc, j0.res.n_stale, (long long)j0.step);
        CHECK(j1.rc == DT_OK && j1.step == 2);
        CHECK(dt_ps_client_shutdown(w[0], &e) == DT_OK);
    }
    dt_ps_client_close(w[0]);
    dt_ps_client_close(w[1]);
    ps_stop(&ps);
    CHECK_MSG(ps.stats.stale == 0 && ps.stats.updates == 2, "stale %llu, updates %llu",
              (unsigned long long)ps.stats.stale, (unsigned long long)ps.stats.updates);
}

/* A chunk of a sync push that asks for PARAMS: sent by hand as worker `task`. */
static void chunk_push(void *s, uint16_t task, uint8_t chunk, uint8_t chunks, float value, size_t n, uint32_t id) {
    dt_wire_header h = dt_wire_header_make(DT_MSG_PUSH, DT_ROLE_WORKER, task, id);
    h.local_step = 0;
    h.global_step = 1; /* the PARAMS of step 1 at least: the barrier */
    h.chunk = chunk, h.chunks = chunks;
    h.flags = DT_WIRE_F_SYNC | DT_WIRE_F_PULL;
    zmq_msg_t m;
    zmq_msg_init_size(&m, n * sizeof(float));
    for (size_t i = 0; i < n; i++) ((float *)zmq_msg_data(&m))[i] = value;
    dt_wire_send(s, NULL, &h, &m, 0, NULL);
}

/* Chunks travel alone: each has its own barrier, so chunk 0 of step 1 comes back (the mean applied)
 * as soon as both workers' chunk 0 is in, while every other chunk is still at step 0 and no other
 * chunk was even sent. This is what lets parameters stream back while later gradients go up. */
static void test_chunk_has_its_own_barrier(void) {
    enum { N = 100, K = 10 };
    ps_thread ps;
    ps_start(&ps, 0, N, NULL, 0);
    size_t sizes[1] = {N};
    chunk_bytes = N / K * sizeof(float);
    dt_ps_client *chief = client_sync(1, &ps, sizes, DT_ROLE_CHIEF, 0, 2, 2, 0);
    chunk_bytes = 0;
    CHECK(chief != NULL);
    if (!chief) {
        ps_stop(&ps);
        return;
    }
    static float p[N];
    for (int i = 0; i < N; i++) p[i] = 1.0f;
    const float *src[1] = {p};
    dt_opt_config opt;
    dt_opt_config_init(&opt, "sgd", 0.5f, NULL);
    dt_error e = {0};
    CHECK(dt_ps_client_init(chief, &opt, src, NULL, NULL, 0, &e) == DT_OK);
    void *ctx = zmq_ctx_new();
    void *w0 = raw_open(ctx, ps.endpoint), *w1 = raw_open(ctx, ps.endpoint);
    chunk_push(w1, 1, 0, K, 4.0f, N / K, 1);
    zmq_pollitem_t it = {.socket = w1, .events = ZMQ_POLLIN};
    CHECK(zmq_poll(&it, 1, 200) == 0); /* chunk 0 waits for worker 0's chunk 0 */
    chunk_push(w0, 0, 0, K, 2.0f, N / K, 2);
    dt_wire_in in;
    for (int k = 0; k < 2; k++) {
        int got = raw_reply(k ? w0 : w1, &in) == DT_OK;
        CHECK(got);
        if (!got) continue; /* nothing to look at (or to close) */
        CHECK_MSG(in.hdr.type == DT_MSG_PARAMS && in.hdr.chunk == 0 && in.hdr.chunks == K && in.hdr.global_step == 1 &&
                      zmq_msg_size(&in.payload) == N / K * sizeof(float),
                  "reply %s chunk %u of %u step %lld", dt_wire_type_name(in.hdr.type), in.hdr.chunk, in.hdr.chunks,
                  (long long)in.hdr.global_step);
        if (zmq_msg_size(&in.payload) == N / K * sizeof(float))
            CHECK(((const float *)zmq_msg_data(&in.payload))[0] == 1.0f - 0.5f * 3.0f); /* the mean of 4 and 2 */
        dt_wire_in_close(&in);
    }
    /* Chunk 9 is still at step 0, holding its first values. */
    dt_wire_header h = dt_wire_header_make(DT_MSG_PULL, DT_ROLE_WORKER, 1, 3);
    h.chunk = K - 1, h.chunks = K;
    dt_wire_send(w1, NULL, &h, NULL, 0, NULL);
    if (raw_reply(w1, &in) == DT_OK) {
        CHECK(in.hdr.type == DT_MSG_PARAMS && in.hdr.chunk == K - 1 && in.hdr.global_step == 0);
        if (in.hdr.type == DT_MSG_PARAMS) CHECK(((const float *)zmq_msg_data(&in.payload))[0] == 1.0f);
        dt_wire_in_close(&in);
    } else {
        CHECK(!"no reply to the PULL of chunk 9");
    }
    /* The shard's step is what every chunk has reached. */
    dt_ps_shard_status st[1];
    CHECK(dt_ps_client_status(chief, st, &e) == DT_OK && st[0].global_step == 0);
    zmq_close(w0);
    zmq_close(w1);
    zmq_ctx_term(ctx);
    CHECK(dt_ps_client_shutdown(chief, &e) == DT_OK);
    dt_ps_client_close(chief);
    CHECK(ps_stop(&ps) == DT_OK);
}

int main(void) {
    RUN(test_mean_once_behind_barrier);
    RUN(test_sum_in_worker_order);
    RUN(test_backup_worker_stale);
    RUN(test_sync_refusals);
    RUN(test_sync_replace);
    RUN(test_lost_worker);
    RUN(test_strict_lost_worker);
    RUN(test_reinit_generation);
    RUN(test_exact_pulls);
    RUN(test_pull_waits_for_one_step);
    RUN(test_two_ps_one_step);
    RUN(test_staleness_bound);
    RUN(test_chunk_has_its_own_barrier);
    RUN(test_barrier_wait_keeps_worker_alive);
    RUN(test_weighted_by_examples);
    /* Again with every shard cut into chunks of 12 bytes (3 floats; shards of 1..14 chunks): each
     * chunk has its own barrier, and the results must not change. */
    chunk_bytes = 12;
    fprintf(stderr, "-- the same, in chunks of %lld bytes\n", (long long)chunk_bytes);
    RUN(test_mean_once_behind_barrier);
    RUN(test_sum_in_worker_order);
    RUN(test_backup_worker_stale);
    RUN(test_sync_refusals);
    RUN(test_sync_replace);
    RUN(test_lost_worker);
    RUN(test_strict_lost_worker);
    RUN(test_reinit_generation);
    RUN(test_two_ps_one_step);
    RUN(test_weighted_by_examples);
    RUN(test_staleness_bound);
    /* (test_exact_pulls and test_pull_waits_for_one_step speak the wire by hand, one chunk a shard.) */
    return test_summary();
}
