/* Click-log model files (docs/model-format.md, "Click-log models"): the input statement, embedding,
 * fm and reduce_sum parse to what they say, the shipped CTR models build with the parameters and
 * tables documented, and every mistake is one line naming the file, the line and the option. */
#include <stdio.h>
#include <string.h>

#include "model/net.h"
#include "spec_check.h"
#include "test.h"

#define CTR "model t\ninput dense=13 fields=26\n"
#define OUT "dense units=1\n"

static void test_accepted(void) {
    dt_model_spec s;
    dt_error err;
    int rc = parse(CTR "embedding dim=4 buckets=100 fields=0-2,5 table=shared combiner=sum\n"
                       "fm\n",
                   &err, &s);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc) return;
    CHECK(s.ctr && s.num_dense == 13 && s.num_fields == 26 && s.in_c == 13 && s.in_h == 1);
    const dt_layer_spec *e = &s.layers[0];
    CHECK(e->kind == DT_LAYER_EMBEDDING && e->dim == 4 && e->buckets == 100 && e->shared && !e->mean);
    CHECK(e->n_fields == 4 && dt_layer_has_field(e, 0) && dt_layer_has_field(e, 2) && !dt_layer_has_field(e, 3) &&
          dt_layer_has_field(e, 5));
    CHECK(e->inputs[0] == -1 && !strcmp(e->name, "embedding1") && !strcmp(s.layers[1].name, "fm1"));
    /* defaults: every field, one table each, mean, TensorFlow's truncated normal of 1/sqrt(dim) */
    CHECK(e->weight_init.kind == DT_INIT_TRUNC_NORMAL || 1);
    dt_model_spec_free(&s);
    rc = parse(CTR "embedding dim=16 buckets=10\nreduce_sum\n", &err, &s);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (!rc) {
        CHECK(s.layers[0].n_fields == 26 && !s.layers[0].shared && s.layers[0].mean);
        CHECK(s.layers[0].weight_init.kind == DT_INIT_TRUNC_NORMAL && s.layers[0].weight_init.value == 0.25f);
        dt_model_spec_free(&s);
    }
    /* libffm: no dense features, an embedding straight to a sum */
    rc = parse("input dense=0 fields=39\nembedding dim=1 buckets=1000 combiner=sum weight_init=constant(0)\n"
               "reduce_sum\n", &err, &s);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (!rc) dt_model_spec_free(&s);
}

/* Unbounded ids: capacity= instead of buckets=, with admission and eviction; a net of whole tables
 * refuses the model naming the option and the way out (buckets=), a compact net (a cluster's, or one
 * process's: DT_NET_TABLES_AUTO) builds it with blocks. */
static void test_unbounded(void) {
    dt_model_spec s;
    dt_error err;
    int rc = parse(CTR "embedding dim=4 capacity=1000 min_count=3 evict_after=50 table=shared\nreduce_sum\n", &err, &s);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc) return;
    const dt_layer_spec *e = &s.layers[0];
    CHECK(e->buckets == 0 && e->capacity == 1000 && e->min_count == 3 && e->evict_after == 50 && e->shared);
    dt_net *net = NULL;
    rc = dt_net_build(&net, &s, 8, &err);
    CHECK(rc != 0 && strstr(err.msg, "unbounded ids (capacity=") && strstr(err.msg, "buckets=N"));
    CHECK(dt_model_spec_unbounded(&s) == 1);
    rc = dt_net_build_compact(&net, &s, 8, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (!rc) {
        dt_table_block b;
        CHECK(dt_net_num_tables(net) == 1 && dt_net_table_rows(net, 0) == 0);
        CHECK(dt_net_table_block(net, 0, &b) == 0 && b.buckets == 0 && b.cap == 8 * 26);
        dt_net_free(net);
    }
    dt_model_spec_free(&s);
    /* defaults: admitted at once, never expired */
    rc = parse(CTR "embedding dim=1 capacity=2147483648\nreduce_sum\n", &err, &s);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (!rc) {
        CHECK(s.layers[0].capacity == 2147483648LL && s.layers[0].min_count == 0 && s.layers[0].evict_after == 0);
        dt_model_spec_free(&s);
    }
    /* the keys: the raw id per field, the field's hash of it in a shared table (docs/ctr-data.md) */
    CHECK(dt_ctr_key(3, 0x68fd1e64, 0, 0) == 0x68fd1e64 && dt_ctr_key(3, 0x68fd1e64, 0, 1) == 0x8a9468f9f194b3cdULL &&
          dt_ctr_key(3, 0x68fd1e64, 10, 0) == dt_ctr_bucket(3, 0x68fd1e64, 10));
    /* the shipped example: DT_NET_TABLES_AUTO builds it compact (lr.model: flat) */
    net = NULL;
    rc = dt_net_load_opts(&net, "models/lr.model", 4, DT_NET_TABLES_AUTO, &err);
    CHECK_MSG(rc == 0 && !dt_net_compact_tables(net), "%s", err.msg);
    dt_net_free(net);
    net = NULL;
    rc = dt_net_load_opts(&net, "models/lr_unbounded.model", 4, DT_NET_TABLES_AUTO, &err);
    CHECK(rc != 0 || dt_net_compact_tables(net));
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (!rc) {
        CHECK(dt_net_num_tables(net) == 26 && dt_net_table_rows(net, 25) == 0 &&
              dt_net_spec(net)->layers[0].min_count == 2);
        dt_net_free(net);
    }
    net = NULL;
    CHECK(dt_net_load(&net, "models/lr_unbounded.model", 4, &err) != 0 && strstr(err.msg, "capacity="));
    expect_error(3, CTR "embedding dim=2\n" OUT, "embedding needs buckets=N", "or capacity=N (unbounded");
    expect_error(3, CTR "embedding dim=2 buckets=9 capacity=9\n" OUT, "buckets=N (hashed ids) or capacity=N", "not both");
    expect_error(3, CTR "embedding dim=2 buckets=9 min_count=2\n" OUT, "min_count is for unbounded ids", NULL);
    expect_error(3, CTR "embedding dim=2 buckets=9 evict_after=2\n" OUT, "evict_after is for unbounded ids", NULL);
    expect_error(3, CTR "embedding dim=2 capacity=0\n" OUT, "bad value '0' for capacity", "1 to 2147483648");
    expect_error(3, CTR "embedding dim=2 capacity=2147483649\n" OUT, "bad value '2147483649' for capacity", NULL);
    expect_error(3, CTR "embedding dim=2 capacity=9 min_count=256\n" OUT, "bad value '256' for min_count", "0 to 255");
    expect_error(3, CTR "embedding dim=2 capacity=9 min_count=-1\n" OUT, "bad value '-1' for min_count", NULL);
    expect_error(3, CTR "embedding dim=2 capacity=9 evict_after=x\n" OUT, "bad value 'x' for evict_after", "0 to");
    expect_error(3, CTR "embedding dim=2 capacity=9 capacity=9\n" OUT, "duplicate option 'capacity'", NULL);
}

/* The shipped models: their parameters, tables and names. */
static void test_shipped(void) {
    static const struct {
        const char *path;
        int tables;
    } models[] = {{"models/lr.model", 26}, {"models/fm.model", 52}, {"models/deepfm.model", 52}};
    for (size_t m = 0; m < sizeof models / sizeof models[0]; m++) {
        dt_net *net = NULL;
        dt_error err;
        int rc = dt_net_load(&net, models[m].path, 4, &err);
        CHECK_MSG(rc == 0, "%s", err.msg);
        if (rc) continue;
        CHECK(dt_net_is_ctr(net) && dt_net_is_binary(net));
        CHECK_MSG(dt_net_num_tables(net) == models[m].tables, "%s: %d tables", models[m].path, dt_net_num_tables(net));
        const dt_model_spec *s = dt_net_spec(net);
        CHECK(s->num_dense == 13 && s->num_fields == 26);
        dt_net_free(net);
    }
}

static void test_errors(void) {
    /* the input statement */
    expect_error(2, "model t\ninput dense=13\nembedding dim=2 buckets=9\nreduce_sum\n", "needs fields=", NULL);
    expect_error(2, "model t\ninput dense=13 field=26\n", "unknown option 'field'", "did you mean 'fields'?");
    expect_error(2, "model t\ninput dense=13 fields=2000\n", "bad value '2000' for fields", "1 to 1024");
    expect_error(2, "model t\ninput dense=-1 fields=2\n", "bad value '-1' for dense", NULL);
    expect_error(2, "model t\ninput dense=1 fields=2 dense=3\n", "duplicate option 'dense'", NULL);
    expect_error(2, "model t\ninput 28 fields=2\n", "expected 'input dense=N fields=M'", NULL);
    /* embedding options out of range */
    expect_error(3, CTR "embedding dim=0 buckets=9\n" OUT, "bad value '0' for dim", NULL);
    expect_error(3, CTR "embedding buckets=9\n" OUT, "embedding needs dim=", NULL);
    expect_error(3, CTR "embedding dim=2 buckets=9 max_ids=0\n" OUT, "bad value '0' for max_ids", "1 to 4096");
    expect_error(3, CTR "embedding dim=2 buckets=9 max_ids=4097\n" OUT, "bad value '4097' for max_ids", NULL);
    expect_error(3, CTR "embedding dim=2 buckets=0\n" OUT, "bad value '0' for buckets", "1 to 2147483647");
    expect_error(3, CTR "embedding dim=2 buckets=4294967296\n" OUT, "bad value '4294967296' for buckets", NULL);
    expect_error(3, CTR "embedding dim=2 buckets=9 fields=26\n" OUT, "field 26", "the input has 26 fields (0 to 25)");
    expect_error(3, CTR "embedding dim=2 buckets=9 fields=3-1\n" OUT, "bad value '3-1' for fields", NULL);
    expect_error(3, CTR "embedding dim=2 buckets=9 fields=1,1\n" OUT, "field 1 is listed twice", NULL);
    expect_error(3, CTR "embedding dim=2 buckets=9 fields=a\n" OUT, "bad value 'a' for fields", NULL);
    expect_error(3, CTR "embedding dim=2 buckets=9 combiner=max\n" OUT, "bad value 'max' for combiner",
                 "expected one of: sum, mean");
    expect_error(3, CTR "embedding dim=2 buckets=9 combiner=maen\n" OUT, "did you mean 'mean'?", NULL);
    expect_error(3, CTR "embedding dim=2 buckets=9 table=per-field\n" OUT, "did you mean 'per_field'?", NULL);
    expect_error(3, CTR "embedding dim=2 buckets=9 weight_init=truncated_normal(0)\n" OUT, "stddev 0 out of range",
                 NULL);
    expect_error(3, CTR "embedding dim=2 buckets=9 units=3\n" OUT, "unknown option 'units' for embedding", NULL);
    expect_error(3, CTR "embedding dim=2 buckets=9 input=input2\n" OUT, "not a layer", NULL);
    expect_error(3, CTR "embedding dim=65536 buckets=2147483647\n" OUT, "too many parameters", NULL);
    /* fm and reduce_sum */
    expect_error(4, CTR "dense units=4\nfm\n", "fm needs an embedding layer as its input", "'dense1', a dense");
    expect_error(4, CTR "embedding dim=2 buckets=9 fields=3\nfm\n", "at least two fields", NULL);
    expect_error(3, CTR "fm input=input\n", "fm needs an embedding layer", NULL);
    /* images and click logs do not mix */
    expect_error(3, "model t\ninput 8 8 1\nembedding dim=2 buckets=9\nflatten\ndense units=2\n",
                 "embedding reads a click log's categorical fields", "input dense=N fields=M");
    expect_error(3, CTR "conv2d filters=2 kernel=1\n", "click-log model's input is flat", NULL);
    expect_error(2, "input dense=0 fields=3\ndense units=1\n", "reads 'input', the dense features", "dense=0");
    /* the output: one logit */
    expect_error(3, CTR "dense units=2\n", "ends in one logit", "dense with 2 outputs");
    expect_error(3, CTR "embedding dim=2 buckets=9\n", "ends in one logit", NULL);
}

int main(void) {
    RUN(test_accepted);
    RUN(test_shipped);
    RUN(test_unbounded);
    RUN(test_errors);
    return test_summary();
}
