/* Batch loader: training order (each example once per epoch, new order each epoch, reproducible
 * from the seed), sharding (n shards at step t == one process with batch n*B at step t, as sets),
 * evaluation order (one pass, short last batch, then n = 0), seek, and shutdown mid-stream.
 * The data set is an in-memory IDX whose pixels spell each example's number, so a batch row can be
 * traced back to the example it came from. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/loader.h"
#include "idx_fixture.h"
#include "test.h"

/* N examples of 2x2 pixels: pixel 0 = i % 256, pixel 1 = i / 256; label = i % 5. */
static uint8_t numbered_pixel(uint32_t i, uint32_t p) { return (uint8_t)(p == 0 ? i % 256 : p == 1 ? i / 256 : 0); }
static uint8_t numbered_label(uint32_t i) { return (uint8_t)(i % 5); }
static dt_dataset *numbered(uint32_t n) { return idx_dataset("numbered", n, 2, 2, numbered_pixel, numbered_label); }

/* Example number of row r of a batch (checks that the label agrees). */
static int example_of(const dt_batch *b, int r) {
    int i = (int)(b->x[4 * r] * 255.0f + 0.5f) + 256 * (int)(b->x[4 * r + 1] * 255.0f + 0.5f);
    return b->labels[r] == i % 5 ? i : -1;
}

static dt_loader *make(const dt_dataset *ds, int B, int shuffle, uint64_t seed, int si, int sc) {
    dt_loader *l = NULL;
    dt_loader_options o = {.batch_size = B, .shuffle = shuffle, .seed = seed, .shard_index = si, .shard_count = sc};
    dt_error e = {0};
    if (dt_loader_create(&l, ds, &o, &e) != 0) {
        fprintf(stderr, "loader: %s\n", e.msg);
        exit(1);
    }
    return l;
}

/* Reads `steps` batches and writes the example numbers, row by row, into ids. */
static void take(dt_loader *l, int steps, int B, int *ids) {
    for (int t = 0; t < steps; t++) {
        dt_batch b;
        CHECK(dt_loader_next(l, &b, NULL) == 0);
        CHECK(b.n == B);
        for (int r = 0; r < B; r++) ids[t * B + r] = example_of(&b, r);
    }
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

static void test_epochs(void) {
    const int N = 103, B = 10;
    dt_dataset *ds = numbered(N);
    dt_loader *l = make(ds, B, 1, 42, 0, 1);
    CHECK(dt_loader_batches_per_epoch(l) == 10); /* the last 3 of each epoch are dropped */
    int ids[3][100];
    for (int ep = 0; ep < 3; ep++) {
        for (int t = 0; t < 10; t++) {
            dt_batch b;
            CHECK(dt_loader_next(l, &b, NULL) == 0);
            CHECK(b.n == B);
            CHECK(b.epoch == ep);
            CHECK(b.index == ep * 10 + t);
            for (int r = 0; r < B; r++) ids[ep][t * B + r] = example_of(&b, r);
        }
        int sorted[100];
        memcpy(sorted, ids[ep], sizeof sorted);
        qsort(sorted, 100, sizeof(int), cmp_int);
        int dup = 0, range = 0;
        for (int i = 0; i < 100; i++) {
            if (i && sorted[i] == sorted[i - 1]) dup++;
            if (sorted[i] < 0 || sorted[i] >= N) range++;
        }
        CHECK(dup == 0 && range == 0); /* each example at most once, all valid */
    }
    CHECK(memcmp(ids[0], ids[1], sizeof ids[0]) != 0);
    CHECK(memcmp(ids[1], ids[2], sizeof ids[0]) != 0);
    /* the order is shuffled, not file order */
    int in_order = 1;
    for (int i = 0; i < 100; i++) in_order &= ids[0][i] == i;
    CHECK(!in_order);
    dt_loader_free(l);

    /* With N a multiple of B every example is seen exactly once per epoch. */
    dt_dataset *ds100 = numbered(100);
    l = make(ds100, B, 1, 5, 0, 1);
    int all[100];
    take(l, 10, B, all);
    qsort(all, 100, sizeof(int), cmp_int);
    int exact = 1;
    for (int i = 0; i < 100; i++) exact &= all[i] == i;
    CHECK(exact);
    dt_loader_free(l);
    dt_dataset_free(ds100);

    /* same seed -> same stream; another seed -> another */
    dt_loader *a = make(ds, B, 1, 42, 0, 1), *c = make(ds, B, 1, 43, 0, 1);
    int ia[300], ic[300];
    take(a, 30, B, ia);
    take(c, 30, B, ic);
    CHECK(memcmp(ia, ids, sizeof ia) == 0);
    CHECK(memcmp(ia, ic, sizeof ia) != 0);
    dt_loader_free(a);
    dt_loader_free(c);
    dt_dataset_free(ds);
}

static void test_shards_match_big_batch(void) {
    const int N = 251, B = 4, n = 3;
    dt_dataset *ds = numbered(N);
    dt_loader *whole = make(ds, n * B, 1, 9, 0, 1);
    dt_loader *shard[3];
    for (int i = 0; i < n; i++) shard[i] = make(ds, B, 1, 9, i, n);
    int64_t bpe = dt_loader_batches_per_epoch(whole);
    CHECK(bpe == N / (n * B));
    for (int i = 0; i < n; i++) CHECK(dt_loader_batches_per_epoch(shard[i]) == bpe);
    int mismatched_steps = 0;
    for (int t = 0; t < 3 * bpe + 2; t++) { /* across epoch boundaries */
        int big[12], parts[12];
        take(whole, 1, n * B, big);
        for (int i = 0; i < n; i++) take(shard[i], 1, B, parts + i * B);
        qsort(big, 12, sizeof(int), cmp_int);
        qsort(parts, 12, sizeof(int), cmp_int);
        if (memcmp(big, parts, sizeof big) != 0) mismatched_steps++;
    }
    CHECK(mismatched_steps == 0);
    for (int i = 0; i < n; i++) dt_loader_free(shard[i]);
    dt_loader_free(whole);
    dt_dataset_free(ds);
}

static void test_eval_pass(void) {
    const int N = 23, B = 5;
    dt_dataset *ds = numbered(N);
    dt_loader *l = make(ds, B, 0, 0, 0, 1);
    CHECK(dt_loader_batches_per_epoch(l) == 5);
    int next = 0, batches = 0, order_ok = 1;
    dt_batch b;
    for (;;) {
        CHECK(dt_loader_next(l, &b, NULL) == 0);
        if (b.n == 0) break;
        CHECK(b.n == (batches < 4 ? 5 : 3));
        for (int r = 0; r < b.n; r++) order_ok &= example_of(&b, r) == next++;
        batches++;
        if (batches > 10) break;
    }
    CHECK(order_ok);
    CHECK(next == N && batches == 5);
    CHECK(dt_loader_next(l, &b, NULL) == 0 && b.n == 0); /* stays finished */
    /* seek back to the start runs the pass again */
    CHECK(dt_loader_seek(l, 0, NULL) == 0);
    CHECK(dt_loader_next(l, &b, NULL) == 0 && b.n == 5 && example_of(&b, 0) == 0);
    CHECK(dt_loader_seek(l, 4, NULL) == 0);
    CHECK(dt_loader_next(l, &b, NULL) == 0 && b.n == 3 && example_of(&b, 0) == 20);
    dt_loader_free(l);

    /* a sharded pass: shard 1 of 3 sees 1, 4, 7, ..., 22 */
    l = make(ds, 4, 0, 0, 1, 3);
    int seen = 0, expect = 1, ok = 1;
    while (dt_loader_next(l, &b, NULL) == 0 && b.n > 0)
        for (int r = 0; r < b.n; r++, seen++, expect += 3) ok &= example_of(&b, r) == expect;
    CHECK(ok && seen == 8);
    dt_loader_free(l);
    dt_dataset_free(ds);
}

static void test_seek(void) {
    const int N = 97, B = 8;
    dt_dataset *ds = numbered(N);
    dt_loader *a = make(ds, B, 1, 3, 0, 1);
    int ids[40 * 8];
    take(a, 40, B, ids); /* 12 batches per epoch: crosses three epoch boundaries */
    const int64_t targets[] = {7, 0, 25, 39, 13, 12, 11};
    for (size_t k = 0; k < sizeof targets / sizeof *targets; k++) {
        dt_loader *b = make(ds, B, 1, 3, 0, 1);
        CHECK(dt_loader_seek(b, targets[k], NULL) == 0);
        int got[16];
        take(b, 2, B, got);
        CHECK(memcmp(got, ids + targets[k] * B, sizeof(int) * (targets[k] == 39 ? 8 : 16)) == 0);
        dt_loader_free(b);
        /* seeking the loader that already ran ahead also works */
        CHECK(dt_loader_seek(a, targets[k], NULL) == 0);
        dt_batch bt;
        CHECK(dt_loader_next(a, &bt, NULL) == 0);
        CHECK(bt.index == targets[k]);
        CHECK(bt.epoch == targets[k] / 12);
        int same = 1;
        for (int r = 0; r < B; r++) same &= example_of(&bt, r) == ids[targets[k] * B + r];
        CHECK(same);
    }
    /* seek right after create and twice in a row */
    dt_loader *c = make(ds, B, 1, 3, 0, 1);
    dt_loader_seek(c, 30, NULL);
    dt_loader_seek(c, 5, NULL);
    int got[8];
    take(c, 1, B, got);
    CHECK(memcmp(got, ids + 5 * B, sizeof got) == 0);
    CHECK(dt_loader_seek(c, -1, NULL) == DT_EINVAL);
    dt_loader_free(c);
    dt_loader_free(a);
    dt_dataset_free(ds);
}

static void test_bad_options_and_shutdown(void) {
    dt_dataset *ds = numbered(10);
    dt_loader *l = NULL;
    dt_error e = {0};
    dt_loader_options o = {.batch_size = 0, .shuffle = 1, .shard_count = 1};
    CHECK(dt_loader_create(&l, ds, &o, &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "batch size");
    o.batch_size = 4, o.shard_index = 2, o.shard_count = 2;
    CHECK(dt_loader_create(&l, ds, &o, &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "shard");
    o.shard_index = 0, o.shard_count = 3; /* 10 examples < one batch of 4 for each of 3 shards */
    CHECK(dt_loader_create(&l, ds, &o, &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "10 examples");
    CHECK(l == NULL);

    /* Free right away, mid-stream, and mid-epoch in evaluation order: no leak, no hang (ASan). */
    l = make(ds, 2, 1, 1, 0, 1);
    dt_loader_free(l);
    l = make(ds, 2, 1, 1, 0, 1);
    dt_batch b;
    for (int t = 0; t < 7; t++) dt_loader_next(l, &b, NULL);
    dt_loader_free(l);
    l = make(ds, 3, 0, 1, 0, 1);
    dt_loader_next(l, &b, NULL);
    dt_loader_free(l);
    dt_loader_free(NULL);
    dt_dataset_free(ds);
}

/* Whole epochs (dynamic data sharding): batch b of epoch e is positions [b*B, (b+1)*B) of the
 * permutation a single process takes, the last one short; batches read in any order (as units are
 * granted) give every example exactly once per epoch; the loader refuses a sharded whole epoch. */
static void test_whole_epoch(void) {
    const int N = 103, B = 10;
    dt_dataset *ds = numbered(N);
    dt_loader *l = NULL, *ref = make(ds, 1, 1, 42, 0, 1); /* batch 1: the permutation, position by position */
    dt_loader_options o = {.batch_size = B, .shuffle = 1, .seed = 42, .shard_count = 1, .whole_epoch = 1};
    dt_error e = {0};
    CHECK(dt_loader_create(&l, ds, &o, &e) == 0);
    CHECK(dt_loader_batches_per_epoch(l) == 11);
    for (int ep = 0; ep < 2; ep++) {
        int perm[103];
        take(ref, N, 1, perm);
        int seen[103] = {0};
        for (int k = 0; k < 11; k++) {
            int b = (k * 7 + ep) % 11; /* out of order */
            CHECK(dt_loader_seek(l, ep * 11 + b, &e) == 0);
            dt_batch bt;
            CHECK(dt_loader_next(l, &bt, NULL) == 0);
            CHECK(bt.n == (b == 10 ? 3 : B) && bt.epoch == ep);
            for (int r = 0; r < bt.n; r++) {
                int i = example_of(&bt, r);
                CHECK(i >= 0 && i == perm[b * B + r] && (int)bt.ids[r] == i);
                if (i >= 0) seen[i]++;
            }
        }
        int once = 1;
        for (int i = 0; i < N; i++) once &= seen[i] == 1;
        CHECK(once);
    }
    dt_loader_free(l);
    dt_loader_free(ref);
    o.shard_count = 2;
    CHECK(dt_loader_create(&l, ds, &o, &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "whole epochs");
    dt_dataset_free(ds);
}

int main(void) {
    RUN(test_whole_epoch);
    RUN(test_epochs);
    RUN(test_shards_match_big_batch);
    RUN(test_eval_pass);
    RUN(test_seek);
    RUN(test_bad_options_and_shutdown);
    return test_summary();
}
