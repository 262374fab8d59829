/* Compact tables (model/net.h, dt_net_build_compact): a net whose embedding tables are per-batch
 * blocks, filled from elsewhere (on a cluster: the ps tasks), computes what the net with whole
 * tables computes: the same logits and loss, the same dense gradients, and table gradients for the
 * same rows with the same values, once the blocks hold those rows. The blocks list exactly the
 * batch's distinct rows of each table, their memory is the batch's, and a batch with more distinct
 * rows than a block is refused naming the table. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "model/net.h"
#include "model/spec.h"
#include "test.h"

#define N 16     /* examples, the nets' max batch */
#define F 3      /* fields */
static const char *const MODEL =
    "model t\ninput dense=2 fields=3\n"
    "embedding name=w dim=1 buckets=40 table=shared combiner=sum weight_init=truncated_normal(0.3)\n"
    "reduce_sum name=ids\n"
    "embedding name=v dim=2 buckets=50 combiner=sum weight_init=truncated_normal(0.5)\n"
    "fm name=pairs input=v\n"
    "dense name=linear input=input units=1\n"
    "add input=ids,pairs,linear\n";

typedef struct {
    float dense[N * 2], labels[N], values[N * F * 2];
    int64_t offsets[N * F + 1];
    uint64_t ids[N * F * 2];
    dt_ctr_batch b;
} batch;

/* per_field ids in each field of each row, drawn from few raw ids so rows repeat */
static void make_batch(batch *x, int per_field, uint64_t seed) {
    uint64_t c = 0;
    int64_t at = 0;
    for (int i = 0; i < N; i++) {
        x->labels[i] = (float)(dt_hash64(seed, c++) & 1);
        for (int j = 0; j < 2; j++) x->dense[i * 2 + j] = (float)(dt_hash64(seed, c++) % 100) / 50.0f;
        for (int f = 0; f < F; f++) {
            x->offsets[i * F + f] = at;
            for (int k = 0; k < per_field; k++, at++) {
                x->ids[at] = per_field > 1 ? (uint64_t)(i * per_field + k) : dt_hash64(seed, c++) % 7;
                x->values[at] = 1.0f;
            }
        }
    }
    x->offsets[N * F] = at;
    x->b = (dt_ctr_batch){.n = N, .num_dense = 2, .num_fields = F, .labels = x->labels, .dense = x->dense,
                          .offsets = x->offsets, .ids = x->ids, .values = x->values};
}

/* The fill callback: each block's rows from the whole-table net (what a ps would serve). */
static int fill_from(void *user, dt_net *net, int training, dt_error *err) {
    (void)training, (void)err;
    dt_net *full = user;
    for (int t = 0; t < dt_net_num_tables(net); t++) {
        dt_table_block b;
        CHECK(dt_net_table_block(net, t, &b) == 0);
        const dt_param_view *v = dt_net_view(full, b.view);
        CHECK(b.n <= b.cap && (int)v->shape[0] == (int)b.buckets);
        for (size_t k = 0; k < b.n; k++) {
            CHECK(b.ids[k] < b.buckets);
            for (size_t j = k + 1; j < b.n; j++) CHECK(b.ids[j] != b.ids[k]); /* distinct */
            memcpy(b.rows + k * (size_t)b.dim, dt_net_params(full) + v->offset + b.ids[k] * (size_t)b.dim,
                   (size_t)b.dim * sizeof(float));
        }
    }
    return 0;
}

static void nets(dt_net **full, dt_net **compact) {
    dt_model_spec spec;
    dt_error err;
    *full = *compact = NULL;
    CHECK_MSG(dt_model_spec_parse(&spec, MODEL, strlen(MODEL), "t.model", &err) == 0, "%s", err.msg);
    CHECK_MSG(dt_net_build(full, &spec, N, &err) == 0, "%s", err.msg);
    CHECK_MSG(dt_net_build_compact(compact, &spec, N, &err) == 0, "%s", err.msg);
    dt_model_spec_free(&spec);
    if (!*full || !*compact) return;
    dt_net_init_params(*full, 3);
    /* the dense variables as the full net has them; the blocks get their rows from fill_from */
    for (int v = 0; v < dt_net_num_views(*full); v++) {
        const dt_param_view *a = dt_net_view(*full, v), *c = dt_net_view(*compact, v);
        CHECK(!strcmp(a->name, c->name) && a->table == c->table);
        if (!a->table) memcpy(dt_net_params(*compact) + c->offset, dt_net_params(*full) + a->offset, a->count * 4);
    }
    dt_net_set_table_fill(*compact, fill_from, *full);
}

static void test_same_as_whole_tables(void) {
    dt_net *full, *compact;
    nets(&full, &compact);
    if (!full || !compact) goto out;
    CHECK(dt_net_compact_tables(compact) && !dt_net_compact_tables(full));
    /* 40 + 3 x 50 x 2 table floats in the full net; blocks of N x 3 (shared) + 3 x N x 2 */
    CHECK(dt_net_param_count(full) - dt_net_param_count(compact) == (40 + 300) - (N * 3 + 3 * N * 2));
    batch x;
    dt_error err;
    for (int round = 0; round < 3; round++) {
        make_batch(&x, 1, 11 + (uint64_t)round);
        const float *la = dt_net_forward_ctr(full, &x.b, 1, 0, &err);
        const float *lc = dt_net_forward_ctr(compact, &x.b, 1, 0, &err);
        CHECK_MSG(la && lc, "%s", err.msg);
        if (!la || !lc) break;
        for (int i = 0; i < N; i++) CHECK_NEAR(la[i], lc[i], 1e-6);
        CHECK_NEAR(dt_net_loss_binary(full, x.labels, NULL), dt_net_loss_binary(compact, x.labels, NULL), 1e-6);
        CHECK(dt_net_backward(full, &err) == 0 && dt_net_backward(compact, &err) == 0);
        for (int v = 0; v < dt_net_num_views(full); v++) {
            const dt_param_view *a = dt_net_view(full, v), *c = dt_net_view(compact, v);
            for (size_t k = 0; !a->table && k < a->count; k++)
                CHECK_NEAR(dt_net_grads(full)[a->offset + k], dt_net_grads(compact)[c->offset + k], 1e-6);
        }
        for (int t = 0; t < dt_net_num_tables(full); t++) {
            dt_table_grad ga, gc;
            dt_table_block b;
            CHECK(dt_net_table_grad(full, t, &ga) == 0 && dt_net_table_grad(compact, t, &gc) == 0);
            CHECK(dt_net_table_block(compact, t, &b) == 0);
            /* the block lists exactly the rows the batch touched */
            CHECK(ga.n == gc.n && gc.n == b.n && ga.n > 0);
            for (size_t k = 0; k < gc.n && ga.n == gc.n; k++) {
                uint64_t id = b.ids[gc.rows[k]];
                size_t j = 0;
                while (j < ga.n && (uint64_t)ga.rows[j] != id) j++;
                CHECK_MSG(j < ga.n, "table %d: row %llu not touched in the full net", t, (unsigned long long)id);
                for (int d = 0; j < ga.n && d < ga.dim; d++)
                    CHECK_NEAR(ga.grad[j * (size_t)ga.dim + (size_t)d], gc.grad[k * (size_t)gc.dim + (size_t)d], 1e-6);
            }
        }
    }
out:
    dt_net_free(full);
    dt_net_free(compact);
}

static void test_block_too_small(void) {
    dt_net *full, *compact;
    nets(&full, &compact);
    if (!full || !compact) goto out;
    batch x;
    dt_error err = {0};
    make_batch(&x, 2, 5); /* two distinct ids per field and row: 2 N rows of a per-field table */
    CHECK(dt_net_forward_ctr(compact, &x.b, 1, 0, &err) == NULL);
    CHECK_CONTAINS(err.msg, "distinct rows of table");
    CHECK(dt_net_forward_ctr(full, &x.b, 1, 0, &err) != NULL); /* whole tables take it */
    dt_table_block b;
    CHECK(dt_net_table_block(full, 0, &b) != 0); /* only a compact net has blocks */
out:
    dt_net_free(full);
    dt_net_free(compact);
}

/* The prefetch's listing (dt_net_table_keys) of a batch is the one its forward makes into the
 * blocks, the same ids in the same order, and it leaves the blocks of the batch before alone. */
static void test_keys_ahead(void) {
    dt_net *full, *compact;
    nets(&full, &compact);
    if (!full || !compact) goto out;
    batch x, y;
    dt_error err = {0};
    make_batch(&x, 1, 21);
    make_batch(&y, 1, 22);
    const int n = dt_net_num_tables(compact);
    dt_rowsum keys[8];
    CHECK(n == 4 && n <= 8);
    for (int t = 0; t < n; t++) dt_rowsum_init(&keys[t], 0);
    CHECK(dt_net_forward_ctr(compact, &x.b, 1, 0, &err) != NULL);
    dt_table_block b;
    CHECK(dt_net_table_block(compact, 0, &b) == 0);
    const size_t before = b.n;
    const uint64_t first = b.ids[0];
    CHECK_MSG(dt_net_table_keys(compact, &y.b, keys, &err) == 0, "%s", err.msg);
    CHECK(dt_net_table_block(compact, 0, &b) == 0 && b.n == before && b.ids[0] == first); /* x's, still */
    CHECK(dt_net_forward_ctr(compact, &y.b, 1, 0, &err) != NULL);
    int differ = 0;
    for (int t = 0; t < n; t++) {
        CHECK(dt_net_table_block(compact, t, &b) == 0);
        CHECK_MSG(b.n == keys[t].n && b.n > 0, "table %d: %zu ids listed ahead, %zu by the forward", t, keys[t].n, b.n);
        for (size_t k = 0; k < b.n && b.n == keys[t].n; k++) differ += b.ids[k] != keys[t].ids[k];
    }
    CHECK(differ == 0);
    CHECK(dt_net_table_keys(full, &y.b, keys, &err) != 0); /* a net holding its tables has no keys to fetch */
    for (int t = 0; t < n; t++) dt_rowsum_free(&keys[t]);
out:
    dt_net_free(full);
    dt_net_free(compact);
}

int main(void) {
    RUN(test_same_as_whole_tables);
    RUN(test_keys_ahead);
    RUN(test_block_too_small);
    return test_summary();
}
