/* Batch-norm state on a ps (docs/batchnorm.md): floats named as state take the pushed change as it
 * is (sync: the mean of the step's changes), the others go through the optimizer, bit for bit as
 * on one machine; with the shard cut into chunks the state ranges still land where they belong. */
#include <math.h>
#include <string.h>

#include "compute/optim.h"
#include "ps_harness.h"

enum { N = 100 };
/* [offset, count] pairs: one range inside a chunk, one across chunk boundaries, one at the end */
static const size_t RANGES[] = {10, 5, 30, 25, 95, 5};
#define N_RANGES 3

static int is_state(size_t i) {
    for (int r = 0; r < N_RANGES; r++)
        if (i >= RANGES[2 * r] && i < RANGES[2 * r] + RANGES[2 * r + 1]) return 1;
    return 0;
}

/* ps_start with state ranges */
static void ps_start_state(ps_thread *t) {
    memset(t, 0, sizeof *t);
    snprintf(t->bind_ep, sizeof t->bind_ep, "tcp://127.0.0.1:*");
    t->cfg = (dt_ps_config){.endpoint = t->bind_ep, .shard_floats = N, .poll_ms = 20, .stop = &t->stop,
                            .on_bound = on_bound, .user = t, .stats = &t->stats,
                            .log = getenv("DT_TEST_VERBOSE") ? stderr : NULL,
                            .state_ranges = RANGES, .n_state_ranges = N_RANGES};
    atomic_init(&t->bound, 0);
    atomic_init(&t->returned, 0);
    pthread_create(&t->th, NULL, ps_main, t);
    for (int i = 0; i < 500 && !atomic_load(&t->bound); i++) sleep_ms(10);
}

/* expected <- one update: the optimizer on everything, then state = before + change */
static void expect_update(const dt_opt_config *opt, float *p, const float *g, float *st, int64_t step) {
    float before[N];
    memcpy(before, p, sizeof before);
    dt_opt_apply(opt, p, g, st, NULL, N, step);
    for (size_t i = 0; i < N; i++)
        if (is_state(i)) p[i] = before[i] + g[i];
}

static void run_async(int64_t chunk) {
    chunk_bytes = chunk;
    ps_thread ps;
    ps_start_state(&ps);
    size_t sizes[1] = {N};
    dt_ps_client *c = client(1, &ps, sizes, DT_ROLE_CHIEF, 0);
    CHECK(c != NULL);
    if (!c) goto out;
    dt_opt_config opt;
    dt_opt_config_init(&opt, "adam", 0.01f, NULL);
    static float p[N], st[2 * N], g[N], got[N];
    fill(p, N, 1.0f, 3);
    memset(st, 0, sizeof st);
    const float *src[1] = {p}, *state[1] = {st};
    dt_error e = {0};
    CHECK(dt_ps_client_init(c, &opt, src, state, NULL, 0, &e) == DT_OK);
    for (int t = 0; t < 3; t++) {
        fill(g, N, 0.5f, 100 + t);
        const float *gs[1] = {g};
        CHECK(dt_ps_client_push_all(c, gs, t, NULL, &e) == DT_OK);
        expect_update(&opt, p, g, st, t);
    }
    float *dst[1] = {got};
    CHECK(dt_ps_client_pull_all(c, dst, 0, NULL, &e) == DT_OK);
    CHECK_MSG(memcmp(got, p, sizeof p) == 0, "chunk %lld: the shard differs from the optimizer + state changes",
              (long long)chunk);
out:
    dt_ps_client_close(c);
    ps_stop(&ps);
    chunk_bytes = 0;
}

static void test_async_whole(void) { run_async(0); }
static void test_async_chunks(void) { run_async(16 * sizeof(float)); } /* chunks of 16 floats */

/* Two sync workers: the state takes the mean of their changes, the rest sgd on the mean gradient. */
static void test_sync_mean_change(void) {
    ps_thread ps;
    ps_start_state(&ps);
    size_t sizes[1] = {N};
    dt_ps_client *w[2] = {client_sync(1, &ps, sizes, DT_ROLE_CHIEF, 0, 2, 2, 0),
                          client_sync(1, &ps, sizes, DT_ROLE_WORKER, 1, 2, 2, 0)};
    CHECK(w[0] && w[1]);
    if (!w[0] || !w[1]) goto out;
    dt_opt_config opt;
    dt_opt_config_init(&opt, "sgd", 0.5f, NULL);
    static float p[N], g0[N], g1[N], mean[N], got[N];
    fill(p, N, 1.0f, 7);
    fill(g0, N, 0.5f, 8);
    fill(g1, N, 0.5f, 9);
    const float *src[1] = {p};
    dt_error e = {0};
    CHECK(dt_ps_client_init(w[0], &opt, src, NULL, NULL, 0, &e) == DT_OK);
    const float *a[1] = {g0}, *b[1] = {g1};
    CHECK(dt_ps_client_push_all(w[0], a, 0, NULL, &e) == DT_OK);
    CHECK(dt_ps_client_push_all(w[1], b, 0, NULL, &e) == DT_OK);
    float *dst[1] = {got};
    CHECK(dt_ps_client_pull_all(w[1], dst, 1, NULL, &e) == DT_OK);
    for (size_t i = 0; i < N; i++) {
        mean[i] = (g0[i] + g1[i]) * 0.5f;
        float want = is_state(i) ? p[i] + mean[i] : p[i] - 0.5f * mean[i];
        CHECK_MSG(fabsf(got[i] - want) <= 1e-6f * (1 + fabsf(want)), "float %zu: %g, want %g (%s)", i, got[i], want,
                  is_state(i) ? "state" : "trained");
    }
out:
    for (int k = 0; k < 2; k++) dt_ps_client_close(w[k]);
    ps_stop(&ps);
}

/* Ranges that overlap or leave the shard are refused before anything is bound. */
static void test_bad_ranges(void) {
    static const size_t overlap[] = {10, 10, 15, 2}, outside[] = {90, 11};
    dt_ps_config cfg = {.endpoint = "tcp://127.0.0.1:*", .shard_floats = N, .state_ranges = overlap, .n_state_ranges = 2};
    dt_error e = {0};
    CHECK(dt_ps_serve(&cfg, &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "state range 1");
    cfg.state_ranges = outside, cfg.n_state_ranges = 1;
    CHECK(dt_ps_serve(&cfg, &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "outside the shard");
}

int main(void) {
    RUN(test_async_whole);
    RUN(test_async_chunks);
    RUN(test_sync_mean_change);
    RUN(test_bad_ranges);
    return test_summary();
}
