/* The overlap engine (worker/overlap.h) against ps tasks in threads on 127.0.0.1: a step streamed
 * chunk by chunk, gradient ranges reported last layer first and parameters waited for first layer
 * first, gives the parameters of the same step exchanged whole (push_pull), bit for bit, in either
 * order; an exchange abandoned half-way leaves the client usable. Every wait is bounded. */
#include "cluster/placement.h"
#include "compute/optim.h"
#include "ps_harness.h"
#include "worker/overlap.h"

/* Four "layers" of a flat buffer, uneven, so chunks straddle them and a variable is split across
 * the two ps tasks. */
#define NV 4
static const size_t COUNTS[NV] = {37, 1000, 5003, 11};
#define NP 2

typedef struct {
    ps_thread ps[NP];
    dt_placement pl;
    dt_param_view views[NV];
    size_t n;
    dt_ps_client *c;
    float *shards[NP], *grads[NP];
} bed;

static void bed_open(bed *b) {
    memset(b, 0, sizeof *b);
    size_t off = 0;
    for (int v = 0; v < NV; v++) {
        b->views[v] = (dt_param_view){.offset = off, .count = COUNTS[v], .ndim = 1, .shape = {(int)COUNTS[v]}};
        snprintf(b->views[v].name, sizeof b->views[v].name, "layer%d/kernel", v);
        off += COUNTS[v];
    }
    b->n = off;
    CHECK(dt_placement_compute(&b->pl, b->views, NV, NP, DT_PLACE_GREEDY, NULL) == 0);
    for (int p = 0; p < NP; p++) {
        ps_start(&b->ps[p], p, b->pl.shard_count[p], NULL, 0);
        b->shards[p] = calloc(b->pl.shard_count[p], sizeof(float));
        b->grads[p] = calloc(b->pl.shard_count[p], sizeof(float));
    }
    chunk_bytes = 1200; /* chunks of 300 floats: several per shard, across the variables */
    b->c = client_sync(NP, b->ps, b->pl.shard_count, DT_ROLE_CHIEF, 0, 1, 1, 0);
    chunk_bytes = 0;
    CHECK(b->c != NULL);
}

static void bed_close(bed *b) {
    dt_ps_client_close(b->c);
    for (int p = 0; p < NP; p++) {
        ps_stop(&b->ps[p]); /* stopped by its flag: DT_EINTR */
        free(b->shards[p]);
        free(b->grads[p]);
    }
    dt_placement_free(&b->pl);
}

/* The chief gives every ps the flat params at step 0 (a new generation each time). */
static void init(bed *b, const float *flat) {
    dt_opt_config opt;
    dt_opt_config_init(&opt, "momentum", 0.1f, NULL);
    for (int p = 0; p < NP; p++) dt_placement_gather(&b->pl, p, b->shards[p], flat);
    dt_error e = {0};
    CHECK_MSG(dt_ps_client_init(b->c, &opt, (const float *const *)b->shards, NULL, NULL, 0, &e) == 0, "%s", e.msg);
}

/* One step of push_pull from p0 with gradient g: the parameters after it, in out. */
static void step_whole(bed *b, const float *p0, const float *g, float *out) {
    init(b, p0);
    for (int p = 0; p < NP; p++) dt_placement_gather(&b->pl, p, b->grads[p], g);
    const float *views[NP];
    int64_t steps[NP];
    dt_error e = {0};
    CHECK_MSG(dt_ps_client_push_pull(b->c, (const float *const *)b->grads, 0, 1, views, steps, NULL, &e) == 0, "%s",
              e.msg);
    for (int p = 0; p < NP; p++) dt_placement_scatter(&b->pl, p, out, views[p]);
}

static void test_streamed_equals_whole(dt_overlap_mode mode) {
    bed b;
    bed_open(&b);
    float *p0 = malloc(b.n * sizeof(float)), *g = malloc(b.n * sizeof(float));
    float *whole = calloc(b.n, sizeof(float)), *net = calloc(b.n, sizeof(float));
    fill(p0, b.n, 1.0f, 1);
    fill(g, b.n, 0.5f, 2);
    /* Two steps each way, so the momentum slot matters too. */
    step_whole(&b, p0, g, whole);
    dt_overlap *o = NULL;
    dt_overlap_config oc = {.client = b.c, .placement = &b.pl, .grads = b.grads, .params = net, .flat_grads = g,
                            .mode = mode};
    dt_error e = {0};
    CHECK_MSG(dt_overlap_create(&o, &oc, &e) == 0, "%s", e.msg);
    init(&b, p0);
    memcpy(net, p0, b.n * sizeof(float));
    CHECK_MSG(dt_overlap_begin(o, 0, 1, &e) == 0, "%s", e.msg);
    for (int v = NV - 1; v >= 1; v--) dt_overlap_ready(o, b.views[v].offset, b.views[v].count); /* backward */
    dt_overlap_ready_rest(o); /* layer 0 too */
    for (int v = 0; v < NV; v++) dt_overlap_need(o, b.views[v].offset, b.views[v].count); /* next forward */
    int64_t steps[NP] = {-1, -1};
    dt_push_result res;
    CHECK_MSG(dt_overlap_finish(o, 0, steps, &res, &e) == 0, "%s", e.msg);
    CHECK(steps[0] == 1 && steps[1] == 1);
    CHECK_MSG(memcmp(net, whole, b.n * sizeof(float)) == 0, "%s: streamed parameters differ from push_pull's",
              dt_overlap_name(mode));
    CHECK(memcmp(net, p0, b.n * sizeof(float)) != 0); /* something was applied */

    /* Abandoned half-way (training stopped mid-backward): DT_EINTR, and the client works on. */
    CHECK(dt_overlap_begin(o, 1, 2, &e) == 0);
    dt_overlap_ready(o, b.views[NV - 1].offset, b.views[NV - 1].count);
    CHECK(dt_overlap_finish(o, 1, NULL, NULL, &e) == DT_EINTR);
    dt_overlap_free(o);
    step_whole(&b, p0, g, whole); /* a fresh INIT and a whole exchange still go through */
    CHECK(memcmp(net, whole, b.n * sizeof(float)) == 0);
    free(p0), free(g), free(whole), free(net);
    bed_close(&b);
}

static void test_priority(void) { test_streamed_equals_whole(DT_OVERLAP_PRIORITY); }
static void test_fifo(void) { test_streamed_equals_whole(DT_OVERLAP_FIFO); }

static void test_parse(void) {
    dt_overlap_mode m;
    CHECK(dt_overlap_parse("fifo", &m, NULL) == 0 && m == DT_OVERLAP_FIFO);
    CHECK(dt_overlap_parse("none", &m, NULL) == 0 && m == DT_OVERLAP_NONE);
    dt_error e = {0};
    CHECK(dt_overlap_parse("1", &m, &e) == DT_EINVAL && strstr(e.msg, "--overlap"));
}

int main(void) {
    RUN(test_priority);
    RUN(test_fifo);
    RUN(test_parse);
    return test_summary();
}
