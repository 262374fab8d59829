/* Batch-norm state on a ps (docs/batchnorm.md): floats named as state take the pushed change as it
 * is (sync: the mean of the step's changes) and nothing else (their optimizer slots stay 0, whatever
 * the optimizer and weight decay), the others go through the optimizer, bit for bit as on one
 * machine; with the shard cut into chunks the state ranges still land where they belong. */
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

/* expected <- one update, written without the skip the ps uses: the optimizer on everything
 * (mask: weight decay), then the state floats put back: value = before + change, slots as before. */
static void expect_update(const dt_opt_config *opt, float *p, const float *g, float *st, const uint8_t *mask,
                          int64_t step) {
    static float before[N], st_before[2 * N];
    int slots = dt_opt_slots(opt);
    memcpy(before, p, sizeof before);
    memcpy(st_before, st, (size_t)slots * N * sizeof(float));
    dt_opt_apply(opt, p, g, st, mask, N, step);
    for (size_t i = 0; i < N; i++) {
        if (!is_state(i)) continue;
        p[i] = before[i] + g[i];
        for (int k = 0; k < slots; k++) st[(size_t)k * N + i] = st_before[(size_t)k * N + i];
    }
}

/* Reads the ps's shard and optimizer state: the values equal p bit for bit, the slots st, and the
 * state floats' slots are all still 0 (issue 27: the optimizer used to run over them, and a
 * checkpoint saved the momentum or Adam moments the change built). */
static void check_shard(dt_ps_client *c, const dt_opt_config *opt, const float *p, const float *st, const char *what) {
    static float got[N], got_st[2 * N];
    float *dst[1] = {got}, *dst_st[1] = {got_st};
    dt_error e = {0};
    int slots = dt_opt_slots(opt);
    CHECK_MSG(dt_ps_client_fetch_state(c, opt, dst, dst_st, NULL, NULL, &e) == DT_OK, "%s: %s", what, e.msg);
    CHECK_MSG(memcmp(got, p, N * sizeof(float)) == 0, "%s: the shard differs from the optimizer + state changes", what);
    CHECK_MSG(memcmp(got_st, st, (size_t)slots * N * sizeof(float)) == 0, "%s: the optimizer state differs", what);
    int nonzero = 0;
    for (int k = 0; k < slots; k++)
        for (size_t i = 0; i < N; i++) nonzero += is_state(i) && got_st[(size_t)k * N + i] != 0.0f;
    CHECK_MSG(nonzero == 0, "%s: %d slot floats of the state ranges are not 0", what, nonzero);
}

/* Async pushes with optimizer `name` (weight decay wd on every float, state ones included, as a
 * careless mask would ask): the trained floats get exactly dt_opt_apply, the state floats their
 * change and nothing else. */
static void run_async(const char *name, float wd, int64_t chunk) {
    char what[64];
    snprintf(what, sizeof what, "%s, weight decay %g, chunk %lld", name, (double)wd, (long long)chunk);
    chunk_bytes = chunk;
    ps_thread ps;
    ps_start_state(&ps);
    size_t sizes[1] = {N};
    dt_ps_client *c = client(1, &ps, sizes, DT_ROLE_CHIEF, 0);
    CHECK(c != NULL);
    if (!c) goto out;
    dt_opt_config opt;
    dt_opt_config_init(&opt, name, 0.01f, NULL);
    opt.weight_decay = wd;
    static float p[N], st[2 * N], g[N];
    static uint8_t mask[N];
    memset(mask, 1, sizeof mask);
    fill(p, N, 1.0f, 3);
    memset(st, 0, sizeof st);
    const float *src[1] = {p}, *state[1] = {st};
    const uint8_t *masks[1] = {mask};
    dt_error e = {0};
    CHECK(dt_ps_client_init(c, &opt, src, state, masks, 0, &e) == DT_OK);
    for (int t = 0; t < 3; t++) {
        fill(g, N, 0.5f, 100 + t);
        const float *gs[1] = {g};
        CHECK(dt_ps_client_push_all(c, gs, t, NULL, &e) == DT_OK);
        expect_update(&opt, p, g, st, mask, t);
    }
    check_shard(c, &opt, p, st, what);
out:
    dt_ps_client_close(c);
    ps_stop(&ps);
    chunk_bytes = 0;
}

static void test_async_whole(void) {
    run_async("sgd", 0, 0);
    run_async("momentum", 0, 0);
    run_async("adam", 0, 0);
}
static void test_async_chunks(void) { /* chunks of 16 floats */
    run_async("momentum", 0, 16 * sizeof(float));
    run_async("adam", 0, 16 * sizeof(float));
}
static void test_async_weight_decay(void) {
    run_async("sgd", 0.1f, 0);
    run_async("momentum", 0.1f, 16 * sizeof(float));
    run_async("adam", 0.1f, 0);
}

/* Two sync workers: the state takes the mean of their changes, the rest the optimizer on the mean
 * gradient; the state floats' slots stay 0. */
static void run_sync(const char *name) {
    ps_thread ps;
    ps_start_state(&ps);
    size_t sizes[1] = {N};
    dt_ps_client *w[2] = {client_sync(1, &ps, sizes, DT_ROLE_CHIEF, 0, 2, 2, 0),
                          client_sync(1, &ps, sizes, DT_ROLE_WORKER, 1, 2, 2, 0)};
    CHECK(w[0] && w[1]);
    if (!w[0] || !w[1]) goto out;
    dt_opt_config opt;
    dt_opt_config_init(&opt, name, 0.5f, NULL);
    static float p[N], g0[N], g1[N], mean[N], got[N], st[2 * N], got_st[2 * N];
    fill(p, N, 1.0f, 7);
    memset(st, 0, sizeof st);
    const float *src[1] = {p};
    dt_error e = {0};
    CHECK(dt_ps_client_init(w[0], &opt, src, NULL, NULL, 0, &e) == DT_OK);
    for (int t = 0; t < 2; t++) {
        fill(g0, N, 0.5f, 8 + t);
        fill(g1, N, 0.5f, 20 + t);
        const float *a[1] = {g0}, *b[1] = {g1};
        CHECK(dt_ps_client_push_all(w[0], a, t, NULL, &e) == DT_OK);
        CHECK(dt_ps_client_push_all(w[1], b, t, NULL, &e) == DT_OK);
        for (size_t i = 0; i < N; i++) mean[i] = (g0[i] + g1[i]) * 0.5f;
        expect_update(&opt, p, mean, st, NULL, t);
    }
    float *dst[1] = {got}, *dst_st[1] = {got_st};
    int64_t steps[1];
    CHECK(dt_ps_client_fetch_state(w[1], &opt, dst, dst_st, steps, NULL, &e) == DT_OK);
    CHECK(steps[0] == 2);
    for (size_t i = 0; i < N; i++) {
        CHECK_MSG(fabsf(got[i] - p[i]) <= 1e-6f * (1 + fabsf(p[i])), "%s float %zu: %g, want %g (%s)", name, i, got[i],
                  p[i], is_state(i) ? "state" : "trained");
        for (int k = 0; k < dt_opt_slots(&opt); k++) {
            float s = got_st[(size_t)k * N + i], want = st[(size_t)k * N + i];
            if (is_state(i)) CHECK_MSG(s == 0.0f, "%s float %zu: slot %d is %g, want 0 (state)", name, i, k, s);
            else CHECK_MSG(fabsf(s - want) <= 1e-6f * (1 + fabsf(want)), "%s float %zu: slot %d is %g, want %g", name, i,
                           k, s, want);
        }
    }
out:
    for (int k = 0; k < 2; k++) dt_ps_client_close(w[k]);
    ps_stop(&ps);
}

static void test_sync_mean_change(void) {
    run_sync("sgd");
    run_sync("momentum");
    run_sync("adam");
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
    RUN(test_async_weight_decay);
    RUN(test_sync_mean_change);
    RUN(test_bad_ranges);
    return test_summary();
}
