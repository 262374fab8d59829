/* The ps's embedding table (src/ps/table.h): deterministic initial rows, admission after a minimum
 * count, eviction of rows not touched for a number of steps and of the least recently used when
 * full, the counters, and memory under an id stream ten times the capacity (the table's own byte
 * accounting, with the index checked against a shadow of what must be there). */
#include <stdint.h>

#include "core/error.h"
#include "cluster/row_placement.h"
#include "core/rng.h"
#include "ps/table.h"
#include "test.h"

enum { DIM = 4 };

static dt_table_config config(uint64_t capacity, uint32_t min_count, int64_t expire, const char *opt) {
    dt_table_config c = {.table = 3, .dim = DIM, .capacity = capacity, .min_count = min_count,
                         .expire_steps = expire, .init = DT_ROW_INIT_NORMAL, .init_scale = 0.5f, .seed = 99};
    CHECK(dt_lazy_config_init(&c.opt, opt, 0.5f, NULL) == DT_OK);
    return c;
}

static dt_table *table_new(const dt_table_config *c) {
    dt_table *t = NULL;
    CHECK(dt_table_new(&t, c, NULL) == DT_OK);
    return t;
}

/* One update of one id with a gradient of g everywhere. */
static void update(dt_table *t, uint64_t id, float g) {
    float grad[DIM];
    for (int j = 0; j < DIM; j++) grad[j] = g;
    dt_table_apply(t, &id, grad, 1);
}

/* id's row, if any, is sgd's init - lr * updates * g (g = 1): true if as expected. */
static int row_is(const dt_table *t, uint64_t id, int updates) {
    const float *v = dt_table_find(t, id);
    float init[DIM];
    dt_table_init_row(dt_table_config_of(t), id, init);
    if (!v) return updates == 0;
    for (int j = 0; j < DIM; j++)
        if (v[j] != init[j] - 0.5f * (float)updates) return 0;
    return 1;
}

static void test_init_deterministic(void) {
    dt_table_config c = config(8, 0, 0, "sgd");
    float a[DIM], b[DIM], x[DIM];
    dt_table_init_row(&c, 12345, a);
    dt_table_init_row(&c, 12345, b);
    CHECK(!memcmp(a, b, sizeof a));
    int spread = 0;
    for (int j = 0; j < DIM; j++) {
        spread |= a[j] != 0;
        CHECK(fabsf(a[j]) <= 1.0f); /* truncated at 2 stddev */
    }
    CHECK(spread);
    dt_table_init_row(&c, 12346, x);
    CHECK(memcmp(a, x, sizeof a) != 0);
    c.table = 4; /* another table: other rows */
    dt_table_init_row(&c, 12345, x);
    CHECK(memcmp(a, x, sizeof a) != 0);
    c.table = 3;
    c.init = DT_ROW_INIT_UNIFORM;
    dt_table_init_row(&c, 12345, x);
    for (int j = 0; j < DIM; j++) CHECK(x[j] >= -0.5f && x[j] < 0.5f);
    /* A row read before it exists reads as its initial value; evicted and admitted again, it starts
     * from it again, slots included. */
    dt_table_config ca = config(2, 0, 0, "adagrad");
    dt_table *t = table_new(&ca);
    float r[DIM], init[DIM];
    dt_table_init_row(&ca, 7, init);
    dt_table_read(t, 7, r);
    CHECK(!memcmp(r, init, sizeof r) && dt_table_find(t, 7) == NULL);
    update(t, 7, 1.0f);
    dt_table_read(t, 7, r);
    CHECK(memcmp(r, init, sizeof r) != 0);
    update(t, 8, 1.0f), update(t, 9, 1.0f); /* capacity 2: 7 is evicted */
    CHECK(dt_table_find(t, 7) == NULL);
    dt_table_read(t, 7, r);
    CHECK(!memcmp(r, init, sizeof r));
    update(t, 7, 1.0f);
    dt_table *fresh = table_new(&ca);
    update(fresh, 7, 1.0f);
    CHECK(!memcmp(dt_table_find(t, 7), dt_table_find(fresh, 7), 2 * DIM * sizeof(float))); /* values and slots */
    dt_table_free(t);
    dt_table_free(fresh);
}

static void test_admission(void) {
    dt_table_config c = config(16, 3, 0, "sgd");
    dt_table *t = table_new(&c);
    update(t, 5, 1.0f);
    update(t, 5, 1.0f);
    CHECK(dt_table_find(t, 5) == NULL); /* seen twice: not yet */
    dt_table_stats st;
    dt_table_get_stats(t, &st);
    CHECK(st.not_admitted == 2 && st.rows == 0 && st.admitted == 0 && st.misses == 2);
    update(t, 5, 1.0f); /* third: admitted, and this update applies */
    CHECK(row_is(t, 5, 1));
    update(t, 5, 1.0f);
    CHECK(row_is(t, 5, 2));
    dt_table_get_stats(t, &st);
    CHECK(st.admitted == 1 && st.rows == 1 && st.hits == 1 && st.misses == 3 && st.not_admitted == 2);
    CHECK(dt_table_step(t) == 4);
    update(t, 6, 1.0f); /* others still counted from zero */
    CHECK(dt_table_find(t, 6) == NULL);
    dt_table_free(t);
}

static void test_expiry_and_lru(void) {
    dt_table_config c = config(100, 0, 2, "sgd");
    dt_table *t = table_new(&c);
    update(t, 1, 1.0f); /* touched at step 0 */
    for (int s = 0; s < 3; s++) update(t, 2, 1.0f); /* steps 1..3: 1 untouched for 3 > 2 steps */
    CHECK(dt_table_find(t, 1) == NULL && row_is(t, 2, 3));
    dt_table_stats st;
    dt_table_get_stats(t, &st);
    CHECK(st.expired == 1 && st.evicted == 0 && st.rows == 1);
    update(t, 3, 1.0f);
    float r[DIM];
    dt_table_read(t, 3, r); /* a read touches */
    update(t, 2, 1.0f), update(t, 2, 1.0f);
    CHECK(dt_table_find(t, 3) != NULL);
    update(t, 2, 1.0f);
    CHECK(dt_table_find(t, 3) == NULL);
    dt_table_free(t);

    c = config(3, 0, 0, "sgd");
    t = table_new(&c);
    update(t, 1, 1.0f), update(t, 2, 1.0f), update(t, 3, 1.0f);
    dt_table_read(t, 1, r); /* 1 is now more recent than 2 */
    update(t, 4, 1.0f);
    CHECK(dt_table_find(t, 2) == NULL && row_is(t, 1, 1) && row_is(t, 3, 1) && row_is(t, 4, 1));
    dt_table_get_stats(t, &st);
    CHECK(st.evicted == 1 && st.rows == 3 && st.admitted == 4);
    dt_table_free(t);
}

/* An id stream of ten times the capacity: rows never above capacity, bytes within 1.2 x capacity x
 * row bytes + the fixed part at every step; the last `capacity` distinct ids updated are all there
 * with the right values (least recently used eviction through the index's deletions), older ones
 * not. Then the same with admission (the sketch's memory is fixed). */
static void test_memory_bounded(void) {
    enum { CAP = 5000, IDS = 10 * CAP, BATCH = 64 };
    dt_table_config c = config(CAP, 0, 0, "sgd");
    dt_table *t = table_new(&c);
    const double bound = 1.2 * CAP * (double)dt_table_row_bytes(&c) + (double)dt_table_fixed_bytes(&c);
    uint64_t *stream = malloc(IDS * sizeof *stream);
    for (uint64_t i = 0; i < IDS; i++) stream[i] = dt_hash64(7, i); /* distinct, scattered */
    float g[BATCH * DIM];
    for (int i = 0; i < BATCH * DIM; i++) g[i] = 1.0f;
    size_t peak = 0;
    for (size_t i = 0; i < IDS; i += BATCH) {
        size_t n = IDS - i < BATCH ? IDS - i : BATCH;
        dt_table_apply(t, stream + i, g, n);
        size_t b = dt_table_bytes(t);
        peak = b > peak ? b : peak;
    }
    dt_table_stats st;
    dt_table_get_stats(t, &st);
    CHECK(st.rows == CAP && st.admitted == IDS && st.evicted == IDS - CAP);
    CHECK_MSG((double)peak <= bound, "peak %zu bytes, bound %.0f", peak, bound);
    CHECK((double)peak >= 0.9 * CAP * (double)dt_table_row_bytes(&c)); /* the accounting counts the rows */
    int present = 0, absent = 0;
    for (size_t i = IDS - CAP; i < IDS; i++) present += row_is(t, stream[i], 1);
    for (size_t i = 0; i < IDS - CAP; i += 7) absent += dt_table_find(t, stream[i]) == NULL;
    CHECK_MSG(present == CAP, "%d of the last %d ids present", present, CAP);
    CHECK(absent == (IDS - CAP + 6) / 7);
    dt_table_free(t);

    /* Admission at 2 over a stream of ids seen once each (never admitted) and a few hot ones. */
    c = config(CAP, 2, 0, "adam");
    t = table_new(&c);
    const size_t before = dt_table_bytes(t);
    for (size_t i = 0; i < IDS; i++) {
        uint64_t ids[2] = {stream[i], i % 10};
        dt_table_apply(t, ids, g, 2);
    }
    dt_table_get_stats(t, &st);
    for (uint64_t i = 0; i < 10; i++) CHECK(dt_table_find(t, i) != NULL);
    /* The sketch takes a few ids seen once for ids seen twice (collisions): under 10%. */
    CHECK_MSG(st.not_admitted >= IDS - IDS / 10, "%llu of %d ids seen once not admitted",
              (unsigned long long)st.not_admitted, IDS);
    CHECK(st.rows == st.admitted && st.rows < IDS / 10);
    CHECK(dt_table_bytes(t) <= 1.2 * CAP * (double)dt_table_row_bytes(&c) + (double)dt_table_fixed_bytes(&c));
    CHECK(dt_table_bytes(t) - before <= 2 * 4096 * ((double)dt_table_row_bytes(&c) + 1)); /* rows admitted only */
    dt_table_free(t);
    free(stream);
}

/* dt_table_bytes_at(c, n) is what dt_table_bytes says once n rows are held, at every count (the
 * blocks, the index's doublings, the sketch): a ps bounds its declared tables by it. */
static void test_bytes_at(void) {
    const uint64_t caps[] = {1000, 20000};
    for (int k = 0; k < 2; k++) {
        dt_table_config c = config(caps[k], 2, 0, "adagrad");
        dt_table *t = table_new(&c);
        float row[DIM * 2];
        for (int j = 0; j < DIM * 2; j++) row[j] = 0.5f;
        for (uint64_t n = 0; n <= caps[k]; n++) {
            if (n % 97 == 0 || n == caps[k])
                CHECK_MSG((uint64_t)dt_table_bytes(t) == dt_table_bytes_at(&c, n),
                          "capacity %llu, %llu rows: %zu bytes held, %llu said", (unsigned long long)caps[k],
                          (unsigned long long)n, dt_table_bytes(t), (unsigned long long)dt_table_bytes_at(&c, n));
            if (n < caps[k]) CHECK(dt_table_import(t, dt_hash64(11, n), row) == DT_OK);
        }
        /* beyond the capacity nothing more: a full table evicts */
        CHECK(dt_table_bytes_at(&c, 10 * caps[k]) == dt_table_bytes_at(&c, caps[k]));
        CHECK(dt_table_bytes_at(&c, caps[k]) <= caps[k] * dt_table_row_bytes(&c) + dt_table_fixed_bytes(&c));
        dt_table_free(t);
    }
}

static void test_config_refused(void) {
    dt_error e = {0};
    dt_table *t = NULL;
    dt_table_config c = config(10, 0, 0, "sgd");
    c.dim = 0;
    CHECK(dt_table_new(&t, &c, &e) == DT_EINVAL && t == NULL);
    CHECK_CONTAINS(e.msg, "dim 0");
    c = config(DT_TABLE_MAX_ROWS + 1, 0, 0, "sgd");
    CHECK(dt_table_new(&t, &c, &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "capacity");
    c = config(10, 256, 0, "sgd");
    CHECK(dt_table_new(&t, &c, &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "min_count");
    c = config(10, 0, 0, "ftrl");
    c.opt.l2 = -1;
    CHECK(dt_table_new(&t, &c, &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "table 3: ftrl: l2");
}

/* A table spread over 2 ps tasks, exported and imported onto 3 (each row to its new home by the
 * placement's hash): every row, values and slots, bit for bit; the same further updates then
 * give the same rows on both. */
static void test_export_rehash(void) {
    enum { IDS = 3000, FROM = 2, TO = 3 };
    dt_table_config c = config(IDS, 0, 0, "adam");
    dt_table *src[FROM], *dst[TO];
    for (int p = 0; p < FROM; p++) src[p] = table_new(&c);
    for (int p = 0; p < TO; p++) dst[p] = table_new(&c);
    float g[DIM];
    for (uint64_t i = 0; i < IDS; i++) {
        uint64_t id = dt_hash64(5, i);
        for (int j = 0; j < DIM; j++) g[j] = (float)((i + (uint64_t)j) % 7) - 3.0f;
        dt_table_apply(src[dt_row_ps(c.table, id, FROM)], &id, g, 1);
        if (i % 3 == 0) dt_table_apply(src[dt_row_ps(c.table, id, FROM)], &id, g, 1);
    }
    const size_t rf = dt_table_row_floats(&c);
    CHECK(rf == 3 * DIM);
    uint64_t ids[64];
    float *rows = malloc(64 * rf * sizeof *rows);
    size_t moved = 0;
    for (int p = 0; p < FROM; p++) {
        uint64_t cursor = 0;
        size_t n;
        while ((n = dt_table_export(src[p], &cursor, 64, ids, rows)) > 0)
            for (size_t i = 0; i < n; i++, moved++)
                CHECK(dt_table_import(dst[dt_row_ps(c.table, ids[i], TO)], ids[i], rows + i * rf) == DT_OK);
    }
    CHECK(moved == IDS);
    dt_table_stats st;
    uint64_t total = 0;
    for (int p = 0; p < TO; p++) dt_table_get_stats(dst[p], &st), total += st.rows;
    CHECK(total == IDS);
    int same = 0;
    for (uint64_t i = 0; i < IDS; i++) {
        uint64_t id = dt_hash64(5, i);
        dt_table *a = src[dt_row_ps(c.table, id, FROM)], *b = dst[dt_row_ps(c.table, id, TO)];
        dt_table_set_step(b, dt_table_step(a)); /* the step travels with the checkpoint */
        for (int j = 0; j < DIM; j++) g[j] = 0.25f * (float)j;
        dt_table_apply(a, &id, g, 1), dt_table_apply(b, &id, g, 1);
        same += dt_table_find(a, id) && dt_table_find(b, id) && !memcmp(dt_table_find(a, id), dt_table_find(b, id),
                                                                       rf * sizeof(float));
    }
    CHECK_MSG(same == IDS, "%d of %d rows the same after the move and an update", same, IDS);
    free(rows);
    for (int p = 0; p < FROM; p++) dt_table_free(src[p]);
    for (int p = 0; p < TO; p++) dt_table_free(dst[p]);
}

/* The layout (what an export walk checks) moves when rows move in the index: it grew, or a row was
 * evicted; not when rows are created in place, updated or read. */
static void test_layout(void) {
    dt_table_config c = config(20000, 0, 0, "sgd");
    dt_table *t = table_new(&c);
    const uint64_t l0 = dt_table_layout(t);
    update(t, 1, 1.0f);
    float out[DIM];
    dt_table_read(t, 1, out);
    CHECK(dt_table_layout(t) == l0);
    for (uint64_t id = 2; id < 5000; id++) update(t, id, 1.0f); /* past 80% of the first index: it grows */
    const uint64_t l1 = dt_table_layout(t);
    CHECK(l1 != l0);
    dt_table_config small = config(2, 0, 0, "sgd");
    dt_table *u = table_new(&small);
    update(u, 1, 1.0f), update(u, 2, 1.0f);
    const uint64_t before = dt_table_layout(u);
    update(u, 3, 1.0f); /* full: the least recently used row goes */
    CHECK(dt_table_layout(u) != before && row_is(u, 1, 0) && row_is(u, 3, 1));
    dt_table_free(t), dt_table_free(u);
}

/* A bounded table (ids below its capacity: a table of buckets) keeps no recency: the same updates
 * give it the same rows as an unbounded one, it holds every id of its capacity without evicting,
 * and with expire_steps it still expires. dt_table_read_n reads what dt_table_read does, rows
 * present or not, over more ids than it fetches ahead. */
static void test_bounded(void) {
    enum { CAP = 3000 };
    dt_table_config c = config(CAP, 0, 0, "adagrad"), b = c;
    b.bounded = 1;
    dt_table *u = table_new(&c), *t = table_new(&b);
    uint64_t ids[64];
    float g[64 * DIM];
    for (int step = 0; step < 200; step++) {
        for (int i = 0; i < 64; i++) ids[i] = (uint64_t)(step * 64 + i) % CAP; /* distinct within a step */
        for (int i = 0; i < 64 * DIM; i++) g[i] = 0.01f * (float)((i + step) % 5 - 2);
        dt_table_apply(u, ids, g, 64), dt_table_apply(t, ids, g, 64);
    }
    dt_table_stats st;
    dt_table_get_stats(t, &st);
    CHECK_MSG(st.rows == CAP && st.evicted == 0 && st.admitted == CAP, "rows %llu evicted %llu",
              (unsigned long long)st.rows, (unsigned long long)st.evicted);
    for (uint64_t id = 0; id < CAP; id++) CHECK(!memcmp(dt_table_find(t, id), dt_table_find(u, id), 2 * DIM * sizeof(float)));
    static uint64_t many[5000];
    static float one[5000 * DIM], all[5000 * DIM];
    for (int i = 0; i < 5000; i++) many[i] = dt_hash64(5, (uint64_t)i) % (2 * CAP); /* half absent */
    for (int i = 0; i < 5000; i++) dt_table_read(u, many[i], one + i * DIM);
    dt_table_read_n(t, many, 5000, all);
    CHECK(!memcmp(one, all, sizeof one));
    dt_table_free(t), dt_table_free(u);
    b = config(100, 0, 2, "sgd");
    b.bounded = 1;
    t = table_new(&b);
    update(t, 1, 1.0f);
    for (int s = 0; s < 3; s++) update(t, 2, 1.0f);
    CHECK(dt_table_find(t, 1) == NULL && row_is(t, 2, 3));
    dt_table_free(t);
}

int main(void) {
    RUN(test_init_deterministic);
    RUN(test_bounded);
    RUN(test_admission);
    RUN(test_expiry_and_lru);
    RUN(test_memory_bounded);
    RUN(test_bytes_at);
    RUN(test_config_refused);
    RUN(test_export_rehash);
    RUN(test_layout);
    return test_summary();
}
