/* Placement: every float placed exactly once, shards laid out contiguously, the same result on every
 * call, greedy's tie rule, splitting of large variables, and balance within 10% of even for the two
 * shipped models (their parameter counts are from the model definitions, docs/cluster.md). */
#include <stdint.h>

#include "cluster/placement.h"
#include "core/error.h"
#include "core/rng.h"
#include "test.h"

typedef struct {
    const char *name;
    size_t count;
} var;

/* Views laid out back to back in creation order, as the flat buffer of dt_net. */
static int make_views(dt_param_view *out, const var *vars, int n) {
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof out[i]);
        snprintf(out[i].name, sizeof out[i].name, "%s", vars[i].name);
        out[i].offset = off;
        out[i].count = vars[i].count;
        off += vars[i].count;
    }
    return n;
}

static const var CATS[] = {
    {"conv1/kernel", 864},     {"conv1/bias", 32},   {"conv2/kernel", 9216},  {"conv2/bias", 32},
    {"conv3/kernel", 18432},   {"conv3/bias", 64},   {"dense1/kernel", 2097152},
    {"dense1/bias", 128},      {"dense2/kernel", 256}, {"dense2/bias", 2},
};
static const var FASHION[] = {
    {"conv1/kernel", 288},      {"conv1/bias", 32},   {"conv2/kernel", 18432}, {"conv2/bias", 64},
    {"dense1/kernel", 401408},  {"dense1/bias", 128}, {"dense2/kernel", 1280}, {"dense2/bias", 10},
};
#define NVARS(a) ((int)(sizeof(a) / sizeof(a[0])))

/* Checks the invariants any placement must hold. */
static void check_invariants(const dt_placement *p, const dt_param_view *views, int n_views) {
    size_t flat = 0, total = 0;
    for (int i = 0; i < n_views; i++) {
        if (views[i].offset + views[i].count > flat) flat = views[i].offset + views[i].count;
        total += views[i].count;
    }
    CHECK(p->total == total);
    unsigned char *hits = calloc(flat ? flat : 1, 1);
    for (int s = 0; s < p->n_slices; s++) {
        const dt_slice *sl = &p->slices[s];
        CHECK(sl->count > 0);
        CHECK(sl->ps >= 0 && sl->ps < p->n_ps);
        CHECK(sl->view >= 0 && sl->view < n_views);
        /* inside its view */
        CHECK(sl->offset >= views[sl->view].offset);
        CHECK(sl->offset + sl->count <= views[sl->view].offset + views[sl->view].count);
        if (s > 0) CHECK(sl->offset >= p->slices[s - 1].offset + p->slices[s - 1].count);
        for (size_t j = sl->offset; j < sl->offset + sl->count && j < flat; j++) hits[j]++;
    }
    /* every float of every view exactly once */
    int bad = 0;
    for (int i = 0; i < n_views; i++)
        for (size_t j = views[i].offset; j < views[i].offset + views[i].count; j++) bad += hits[j] != 1;
    CHECK_MSG(bad == 0, "%d floats not covered exactly once", bad);
    /* shards: per ps, slices in shard order tile [0, shard_count) */
    size_t sum = 0;
    for (int ps = 0; ps < p->n_ps; ps++) {
        size_t at = 0;
        for (int j = p->ps_begin[ps]; j < p->ps_begin[ps + 1]; j++) {
            const dt_slice *sl = &p->slices[p->ps_slices[j]];
            CHECK(sl->ps == ps);
            CHECK(sl->shard_offset == at);
            at += sl->count;
        }
        CHECK(at == p->shard_count[ps]);
        sum += at;
    }
    CHECK(sum == total);
    CHECK(p->ps_begin[p->n_ps] == p->n_slices);
    free(hits);
}

static void check_balance(const var *vars, int n, int k) {
    dt_param_view views[16];
    make_views(views, vars, n);
    dt_placement p;
    dt_error err = {0};
    CHECK(dt_placement_compute(&p, views, n, k, DT_PLACE_GREEDY, &err) == 0);
    check_invariants(&p, views, n);
    double even = (double)p.total / k;
    for (int i = 0; i < k; i++)
        CHECK_MSG(fabs((double)p.shard_count[i] - even) <= 0.10 * even, "k=%d ps %d holds %zu, even %.0f",
                  k, i, p.shard_count[i], even);
    CHECK(dt_placement_imbalance(&p) <= 1.10);
    dt_placement_free(&p);
}

static void test_cats_balance(void) {
    size_t total = 0;
    for (int i = 0; i < NVARS(CATS); i++) total += CATS[i].count;
    CHECK(total == 2126178);
    for (int k = 1; k <= 4; k++) check_balance(CATS, NVARS(CATS), k);
}

static void test_fashion_balance(void) {
    for (int k = 1; k <= 4; k++) check_balance(FASHION, NVARS(FASHION), k);
}

/* Round robin cannot balance a model with one dominant layer: that is why greedy splits. */
static void test_round_robin(void) {
    dt_param_view views[16];
    make_views(views, CATS, NVARS(CATS));
    dt_placement p;
    CHECK(dt_placement_compute(&p, views, NVARS(CATS), 3, DT_PLACE_ROUND_ROBIN, NULL) == 0);
    check_invariants(&p, views, NVARS(CATS));
    CHECK(p.n_slices == NVARS(CATS));
    for (int s = 0; s < p.n_slices; s++) {
        CHECK(p.slices[s].view == s);
        CHECK(p.slices[s].ps == s % 3);
        CHECK(p.slices[s].count == CATS[s].count);
    }
    CHECK(dt_placement_imbalance(&p) > 2.5); /* dense1/kernel alone is ~99% of the bytes */
    dt_placement_free(&p);
}

/* Equal loads: the lowest ps index wins; otherwise the smallest load. */
static void test_greedy_ties(void) {
    const var vars[] = {{"a", 10}, {"b", 10}, {"c", 10}, {"d", 3}};
    dt_param_view views[4];
    make_views(views, vars, 4);
    dt_placement p;
    CHECK(dt_placement_compute(&p, views, 4, 2, DT_PLACE_GREEDY, NULL) == 0);
    check_invariants(&p, views, 4);
    CHECK(p.n_slices == 4);
    CHECK(p.slices[0].ps == 0); /* 0,0 -> first minimum */
    CHECK(p.slices[1].ps == 1); /* 10,0 */
    CHECK(p.slices[2].ps == 0); /* 10,10 -> first minimum */
    CHECK(p.slices[3].ps == 1); /* 20,10 */
    CHECK(p.shard_count[0] == 20 && p.shard_count[1] == 13);
    dt_placement_free(&p);

    const var vars2[] = {{"a", 5}, {"b", 3}, {"c", 4}};
    make_views(views, vars2, 3);
    CHECK(dt_placement_compute(&p, views, 3, 2, DT_PLACE_GREEDY, NULL) == 0);
    CHECK(p.slices[0].ps == 0 && p.slices[1].ps == 1 && p.slices[2].ps == 1); /* 4 goes to load 3 */
    CHECK(p.shard_count[0] == 5 && p.shard_count[1] == 7);
    dt_placement_free(&p);
}

/* A variable above the even share is cut into contiguous slices, ps tasks filled in index order. */
static void test_split(void) {
    const var vars[] = {{"big", 100}};
    dt_param_view views[1];
    make_views(views, vars, 1);
    dt_placement p;
    CHECK(dt_placement_compute(&p, views, 1, 3, DT_PLACE_GREEDY, NULL) == 0);
    check_invariants(&p, views, 1);
    CHECK(p.share == 34);
    CHECK(p.n_slices == 3);
    CHECK(p.slices[0].ps == 0 && p.slices[0].offset == 0 && p.slices[0].count == 34);
    CHECK(p.slices[1].ps == 1 && p.slices[1].offset == 34 && p.slices[1].count == 34);
    CHECK(p.slices[2].ps == 2 && p.slices[2].offset == 68 && p.slices[2].count == 32);
    dt_placement_free(&p);

    /* small ones first, then the big one fills the rest up to the share */
    const var vars2[] = {{"s1", 4}, {"s2", 2}, {"big", 30}};
    dt_param_view v2[3];
    make_views(v2, vars2, 3);
    CHECK(dt_placement_compute(&p, v2, 3, 2, DT_PLACE_GREEDY, NULL) == 0); /* share 18 */
    check_invariants(&p, v2, 3);
    CHECK(p.n_slices == 4);
    CHECK(p.slices[2].ps == 0 && p.slices[2].count == 14 && p.slices[2].offset == 6);
    CHECK(p.slices[3].ps == 1 && p.slices[3].count == 16 && p.slices[3].offset == 20);
    CHECK(p.shard_count[0] == 18 && p.shard_count[1] == 18);
    /* shard layout of ps 0: s1 then its slice of big */
    CHECK(p.slices[2].shard_offset == 4);
    dt_placement_free(&p);
}

static void test_deterministic(void) {
    dt_param_view views[16];
    make_views(views, CATS, NVARS(CATS));
    dt_placement a, b;
    CHECK(dt_placement_compute(&a, views, NVARS(CATS), 3, DT_PLACE_GREEDY, NULL) == 0);
    CHECK(dt_placement_compute(&b, views, NVARS(CATS), 3, DT_PLACE_GREEDY, NULL) == 0);
    CHECK(a.n_slices == b.n_slices);
    CHECK(memcmp(a.slices, b.slices, (size_t)a.n_slices * sizeof *a.slices) == 0);
    CHECK(dt_placement_fingerprint(&a) == dt_placement_fingerprint(&b));
    dt_placement_free(&b);
    CHECK(dt_placement_compute(&b, views, NVARS(CATS), 2, DT_PLACE_GREEDY, NULL) == 0);
    CHECK(dt_placement_fingerprint(&a) != dt_placement_fingerprint(&b));
    dt_placement_free(&a);
    dt_placement_free(&b);
}

/* gather then scatter reproduces the flat buffer; locate agrees with the slices. */
static void test_gather_scatter_locate(void) {
    dt_param_view views[16];
    make_views(views, FASHION, NVARS(FASHION));
    views[3].offset += 7; /* a gap between views is allowed and belongs to nobody */
    for (int i = 4; i < NVARS(FASHION); i++) views[i].offset += 7;
    dt_placement p;
    dt_error err = {0};
    CHECK(dt_placement_compute(&p, views, NVARS(FASHION), 3, DT_PLACE_GREEDY, &err) == 0);
    check_invariants(&p, views, NVARS(FASHION));
    size_t flat_n = views[NVARS(FASHION) - 1].offset + views[NVARS(FASHION) - 1].count;
    float *flat = calloc(flat_n, sizeof *flat), *back = calloc(flat_n, sizeof *back);
    for (size_t i = 0; i < flat_n; i++) flat[i] = (float)i;
    for (int ps = 0; ps < 3; ps++) {
        float *shard = calloc(p.shard_count[ps] + 1, sizeof *shard);
        dt_placement_gather(&p, ps, shard, flat);
        /* every float of the shard is where locate says */
        int bad = 0;
        for (size_t j = 0; j < p.shard_count[ps]; j++) {
            int where;
            size_t so;
            size_t f = (size_t)shard[j];
            if (dt_placement_locate(&p, f, &where, &so) < 0 || where != ps || so != j) bad++;
        }
        CHECK_MSG(bad == 0, "ps %d: %d floats not where locate says", ps, bad);
        dt_placement_scatter(&p, ps, back, shard);
        free(shard);
    }
    int diff = 0;
    for (size_t i = 0; i < flat_n; i++) {
        int in_gap = i >= views[2].offset + views[2].count && i < views[3].offset;
        diff += in_gap ? back[i] != 0.0f : back[i] != flat[i];
    }
    CHECK(diff == 0);
    int ps;
    size_t so;
    CHECK(dt_placement_locate(&p, views[3].offset - 1, &ps, &so) == -1); /* in the gap */
    CHECK(dt_placement_locate(&p, flat_n, &ps, &so) == -1);
    free(flat);
    free(back);
    dt_placement_free(&p);
}

/* A shard gathered and scattered in uneven parts (chunks, as the overlap streams them) is the
 * shard gathered whole, and a part touches no float outside it. */
static void test_ranges(void) {
    dt_param_view views[16];
    make_views(views, CATS, NVARS(CATS));
    dt_placement p;
    CHECK(dt_placement_compute(&p, views, NVARS(CATS), 3, DT_PLACE_GREEDY, NULL) == 0);
    size_t flat_n = views[NVARS(CATS) - 1].offset + views[NVARS(CATS) - 1].count;
    float *flat = calloc(flat_n, sizeof *flat), *back = calloc(flat_n, sizeof *back);
    for (size_t i = 0; i < flat_n; i++) flat[i] = (float)i + 0.5f;
    int bad = 0;
    for (int ps = 0; ps < 3; ps++) {
        size_t n = p.shard_count[ps];
        float *whole = calloc(n, sizeof *whole), *parts = calloc(n, sizeof *parts);
        dt_placement_gather(&p, ps, whole, flat);
        for (size_t off = 0, len = 1; off < n; off += len, len = len * 3 + 7) {
            if (len > n - off) len = n - off;
            if (off + len < n) parts[off + len] = -1; /* must stay: outside the part */
            dt_placement_gather_range(&p, ps, off, len, parts, flat);
            if (off + len < n) bad += parts[off + len] != -1;
            dt_placement_scatter_range(&p, ps, off, len, back, parts);
        }
        bad += memcmp(whole, parts, n * sizeof *whole) != 0;
        free(whole);
        free(parts);
    }
    CHECK_MSG(bad == 0, "%d ranges disagree with the whole shard", bad);
    CHECK(memcmp(flat, back, flat_n * sizeof *flat) == 0); /* CATS has no gaps: every float came back */
    free(flat);
    free(back);
    dt_placement_free(&p);
}

static void test_refusals(void) {
    dt_param_view views[16];
    make_views(views, FASHION, NVARS(FASHION));
    dt_placement p;
    dt_error err = {0};
    CHECK(dt_placement_compute(&p, views, NVARS(FASHION), 0, DT_PLACE_GREEDY, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "ps tasks");
    views[2].offset = 100; /* overlaps conv1/kernel [0, 288) */
    CHECK(dt_placement_compute(&p, views, NVARS(FASHION), 2, DT_PLACE_GREEDY, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "conv2/kernel");
    dt_placement_free(&p); /* safe after a failure */
    dt_place_strategy s;
    CHECK(dt_place_strategy_parse("round_robin", &s, &err) == 0 && s == DT_PLACE_ROUND_ROBIN);
    CHECK(dt_place_strategy_parse("greedy", &s, &err) == 0 && s == DT_PLACE_GREEDY);
    CHECK(dt_place_strategy_parse("random", &s, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "--placement");
}

/* More ps tasks than floats, and no variables at all. */
static void test_edges(void) {
    const var vars[] = {{"a", 1}, {"empty", 0}, {"b", 1}};
    dt_param_view views[3];
    make_views(views, vars, 3);
    dt_placement p;
    CHECK(dt_placement_compute(&p, views, 3, 5, DT_PLACE_GREEDY, NULL) == 0);
    check_invariants(&p, views, 3);
    CHECK(p.n_slices == 2);
    CHECK(p.shard_count[0] == 1 && p.shard_count[1] == 1 && p.shard_count[4] == 0);
    dt_placement_free(&p);
    CHECK(dt_placement_compute(&p, views, 0, 2, DT_PLACE_GREEDY, NULL) == 0);
    CHECK(p.n_slices == 0 && p.total == 0);
    CHECK(dt_placement_imbalance(&p) == 1.0);
    dt_placement_free(&p);
}

/* Random models: the invariants and the documented bound max(share, total/k + (1-1/k)*s), s the
 * largest variable left whole, hold for every one. */
static void test_random_bound(void) {
    dt_rng r;
    dt_rng_seed(&r, 42);
    int violations = 0;
    for (int trial = 0; trial < 300; trial++) {
        int n = 1 + (int)dt_rng_below(&r, 12), k = 1 + (int)dt_rng_below(&r, 6);
        dt_param_view views[12];
        size_t off = 0;
        for (int i = 0; i < n; i++) {
            memset(&views[i], 0, sizeof views[i]);
            snprintf(views[i].name, sizeof views[i].name, "v%d", i);
            /* sizes spread over 1 .. 100000, one in four large */
            views[i].count = 1 + (size_t)dt_rng_below(&r, dt_rng_below(&r, 4) ? 1000 : 100000);
            views[i].offset = off;
            off += views[i].count + (size_t)dt_rng_below(&r, 3); /* small gaps */
        }
        dt_placement p;
        CHECK(dt_placement_compute(&p, views, n, k, DT_PLACE_GREEDY, NULL) == 0);
        check_invariants(&p, views, n);
        size_t s = 0;
        for (int i = 0; i < n; i++)
            if (views[i].count <= p.share && views[i].count > s) s = views[i].count;
        double bound = (double)p.total / k + (1.0 - 1.0 / k) * (double)s;
        if (bound < (double)p.share) bound = (double)p.share;
        for (int i = 0; i < k; i++) violations += (double)p.shard_count[i] > bound + 1e-9;
        dt_placement_free(&p);
    }
    CHECK_MSG(violations == 0, "%d shards above the bound", violations);
}

static void test_print(void) {
    dt_param_view views[16];
    make_views(views, CATS, NVARS(CATS));
    dt_placement p;
    CHECK(dt_placement_compute(&p, views, NVARS(CATS), 2, DT_PLACE_GREEDY, NULL) == 0);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    dt_placement_print(&p, f);
    fclose(f);
    CHECK_CONTAINS(text, "greedy over 2 ps tasks");
    CHECK_CONTAINS(text, "2126178 floats");
    CHECK_CONTAINS(text, "ps 1:");
    /* the large layer is split over both ps tasks: its line names both */
    const char *line = strstr(text, "dense1/kernel");
    CHECK(line != NULL);
    if (line) {
        const char *eol = strchr(line, '\n');
        const char *p0 = strstr(line, "ps 0 ["), *p1 = strstr(line, "ps 1 [");
        CHECK(p0 && p1 && p0 < eol && p1 < eol);
    }
    free(text);
    dt_placement_free(&p);
}

int main(void) {
    RUN(test_cats_balance);
    RUN(test_fashion_balance);
    RUN(test_round_robin);
    RUN(test_greedy_ties);
    RUN(test_split);
    RUN(test_deterministic);
    RUN(test_gather_scatter_locate);
    RUN(test_ranges);
    RUN(test_refusals);
    RUN(test_edges);
    RUN(test_random_bound);
    RUN(test_print);
    return test_summary();
}
