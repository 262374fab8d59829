/* The click-log layers against PyTorch: tests/fixtures/ctr.model (embedding bags, sum and mean,
 * per-field and shared tables, repeated ids, multi-valued, weighted and empty fields; fm;
 * reduce_sum; concat with the dense features; sigmoid with logloss) run forward and backward in
 * float32 and compared, element by element, with tests/fixtures/ctr.safetensors, which
 * tests/fixtures/gen_ctr_fixtures.py made in float64 with torch's embedding_bag. Also: the touched
 * rows backward lists (dt_net_table_grad) against the flat gradient, a second backward leaving no
 * stale rows, thread counts, clipping, and the refusals between image and click-log models. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/backend.h"
#include "compute/optim.h"
#include "io/safetensors.h"
#include "model/net.h"
#include "test.h"

#define FIXTURE "tests/fixtures/ctr.safetensors"
#define MODEL "tests/fixtures/ctr.model"
#define TOL 1e-4

typedef struct {
    dt_st_file *f;
    float *dense, *values, *labels, *logits, loss;
    int64_t *offsets;
    uint64_t *ids;
    size_t n_off, nnz;
    dt_ctr_batch b;
} fixture;

static void *read_tensor(const dt_st_file *f, const char *name, dt_st_dtype dt, size_t *n) {
    const dt_st_info *t = dt_st_find(f, name);
    if (!t) return NULL;
    void *out = malloc(t->count * 8 + 8);
    dt_error err;
    if (dt_st_read(f, name, dt, out, t->count, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        free(out);
        return NULL;
    }
    if (n) *n = (size_t)t->count;
    return out;
}

static int fixture_open(fixture *x) {
    memset(x, 0, sizeof *x);
    dt_error err;
    if (dt_st_open(&x->f, FIXTURE, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    size_t n;
    x->dense = read_tensor(x->f, "dense", DT_ST_F32, &n);
    x->offsets = read_tensor(x->f, "offsets", DT_ST_I64, &x->n_off);
    x->ids = read_tensor(x->f, "ids", DT_ST_I64, &x->nnz);
    x->values = read_tensor(x->f, "values", DT_ST_F32, NULL);
    x->labels = read_tensor(x->f, "labels", DT_ST_F32, &n);
    x->logits = read_tensor(x->f, "logits", DT_ST_F32, NULL);
    float *loss = read_tensor(x->f, "loss", DT_ST_F32, NULL);
    if (!x->dense || !x->offsets || !x->ids || !x->values || !x->labels || !x->logits || !loss) return -1;
    x->loss = *loss;
    free(loss);
    x->b = (dt_ctr_batch){.n = (int)n, .num_dense = 3, .num_fields = 4, .labels = x->labels, .dense = x->dense,
                          .offsets = x->offsets, .ids = x->ids, .values = x->values};
    return 0;
}

static void fixture_close(fixture *x) {
    free(x->dense), free(x->offsets), free(x->ids), free(x->values), free(x->labels), free(x->logits);
    dt_st_close(x->f);
}

static dt_net *build(int batch) {
    dt_net *net = NULL;
    dt_error err;
    if (dt_net_load(&net, MODEL, batch, &err)) fprintf(stderr, "%s\n", err.msg);
    return net;
}

/* The fixture's "<kind>/<view name>" of view pv, or NULL (said on stderr) if absent or sized otherwise. */
static float *view_tensor(const fixture *x, const char *kind, const dt_param_view *pv) {
    char name[80];
    snprintf(name, sizeof name, "%s/%s", kind, pv->name);
    size_t n = 0;
    float *p = read_tensor(x->f, name, DT_ST_F32, &n);
    if (p && n == pv->count) return p;
    fprintf(stderr, "fixture lacks %s (or its size differs)\n", name);
    free(p);
    return NULL;
}

/* The fixture's parameters into net, by view name. */
static int load_params(dt_net *net, const fixture *x) {
    for (int v = 0; v < dt_net_num_views(net); v++) {
        const dt_param_view *pv = dt_net_view(net, v);
        size_t n = pv->count;
        float *p = view_tensor(x, "param", pv);
        if (!p) return -1;
        memcpy(dt_net_params(net) + pv->offset, p, n * sizeof *p);
        free(p);
    }
    return 0;
}

static double worst_rel(const float *a, const float *ref, size_t n) {
    double mx = 0, worst = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - ref[i]) / fmax(fmax(fabs(ref[i]), 1e-2 * mx), 1e-30);
        if (e > worst) worst = e;
    }
    return worst;
}

static float step(dt_net *net, const dt_ctr_batch *b) {
    dt_error err;
    if (!dt_net_forward_ctr(net, b, 1, 7, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return NAN;
    }
    float loss = dt_net_loss_binary(net, b->labels, NULL);
    if (dt_net_backward(net, &err)) fprintf(stderr, "%s\n", err.msg);
    return loss;
}

/* Every parameter's gradient against the reference. */
static void check_grads(dt_net *net, const fixture *x, const char *when) {
    for (int v = 0; v < dt_net_num_views(net); v++) {
        const dt_param_view *pv = dt_net_view(net, v);
        float *ref = view_tensor(x, "grad", pv);
        CHECK_MSG(ref != NULL, "grad/%s missing", pv->name);
        if (!ref) continue;
        double e = worst_rel(dt_net_grads(net) + pv->offset, ref, pv->count);
        CHECK_MSG(e <= TOL, "%s: grad/%s off by %.3g (relative)", when, pv->name, e);
        free(ref);
    }
}

static void test_against_pytorch(void) {
    fixture x;
    CHECK(fixture_open(&x) == 0);
    dt_net *net = build(x.b.n);
    CHECK(net && dt_net_is_ctr(net) && dt_net_is_binary(net) && dt_net_num_tables(net) == 6);
    if (!net || load_params(net, &x)) return;
    float loss = step(net, &x.b);
    const float *logits = dt_net_forward_ctr(net, &x.b, 0, 0, NULL); /* evaluation: the same function */
    CHECK(logits && worst_rel(logits, x.logits, (size_t)x.b.n) <= TOL);
    CHECK_NEAR(loss, x.loss, 1e-5 * fabs(x.loss));
    check_grads(net, &x, "first backward");

    /* The listed rows are exactly the flat gradient's non-zero rows of each table. */
    int listed_any_repeat = 0;
    for (int t = 0; t < dt_net_num_tables(net); t++) {
        dt_table_grad g;
        CHECK(dt_net_table_grad(net, t, &g) == 0);
        const dt_param_view *pv = dt_net_view(net, g.view);
        CHECK(pv->table && pv->ndim == 2 && pv->shape[1] == g.dim);
        const float *flat = dt_net_grads(net) + pv->offset;
        size_t k = 0;
        for (int r = 0; r < pv->shape[0]; r++) {
            int listed = k < g.n && g.rows[k] == r, nonzero = 0;
            for (int c = 0; c < g.dim; c++) nonzero |= flat[(size_t)r * g.dim + c] != 0;
            CHECK_MSG(listed || !nonzero, "%s row %d has a gradient but is not listed", pv->name, r);
            if (listed) {
                CHECK(memcmp(g.grad + k * g.dim, flat + (size_t)r * g.dim, (size_t)g.dim * sizeof(float)) == 0);
                k++;
            }
        }
        CHECK_MSG(k == g.n, "%s: %zu rows listed, %zu found in order", pv->name, g.n, k);
        listed_any_repeat |= g.n > 0 && g.n < (size_t)pv->shape[0];
    }
    CHECK(listed_any_repeat);

    /* Another batch (the first two examples), then this one again: nothing stale is left. */
    dt_ctr_batch half = x.b;
    half.n = 2;
    step(net, &half);
    step(net, &x.b);
    check_grads(net, &x, "after another batch");

    /* Clipping over the touched rows equals clipping the whole flat gradient. */
    size_t n = dt_net_param_count(net);
    float *copy = malloc(n * sizeof *copy);
    memcpy(copy, dt_net_grads(net), n * sizeof *copy);
    double na = dt_clip_global_norm(copy, n, 0.1f), nb = dt_net_clip_gradients(net, 0.1f);
    CHECK_NEAR(na, nb, 1e-6 * na);
    CHECK(na > 0.1);
    CHECK(worst_rel(dt_net_grads(net), copy, n) <= 1e-6);
    dt_table_grad g;
    dt_net_table_grad(net, 0, &g);
    CHECK(g.n > 0 && g.grad[0] == (dt_net_grads(net) + dt_net_view(net, g.view)->offset)[g.rows[0] * g.dim]);
    free(copy);
    dt_net_free(net);
    fixture_close(&x);
}

/* Results do not depend on the thread count. */
static void test_threads(void) {
    fixture x;
    CHECK(fixture_open(&x) == 0);
    dt_net *a = build(x.b.n), *b = build(x.b.n);
    if (!a || !b || load_params(a, &x) || load_params(b, &x)) return;
    dt_net_set_threads(a, 1);
    dt_net_set_threads(b, 2);
    float la = step(a, &x.b), lb = step(b, &x.b);
    CHECK(la == lb);
    CHECK(memcmp(dt_net_grads(a), dt_net_grads(b), dt_net_param_count(a) * sizeof(float)) == 0);
    dt_net_free(a), dt_net_free(b);
    fixture_close(&x);
}

/* A click-log model refuses images and another layout; an image model refuses click logs. */
static void test_refusals(void) {
    fixture x;
    CHECK(fixture_open(&x) == 0);
    dt_net *net = build(x.b.n), *img = NULL;
    dt_error err = {0};
    float img_x[784] = {0};
    CHECK(dt_net_forward(net, img_x, 1, 0, 0, &err) == NULL);
    CHECK_CONTAINS(err.msg, "click-log model");
    dt_ctr_batch other = x.b;
    other.num_fields = 26;
    CHECK(dt_net_forward_ctr(net, &other, 0, 0, &err) == NULL);
    CHECK_CONTAINS(err.msg, "26 categorical fields");
    CHECK(dt_net_load(&img, "models/fashion.model", 1, &err) == 0);
    CHECK(dt_net_forward_ctr(img, &x.b, 0, 0, &err) == NULL);
    CHECK_CONTAINS(err.msg, "image model");
    dt_net_free(img);
    dt_net_free(net);
    fixture_close(&x);
}

/* A device without the click-log kernels (as CUDA's backend: its supports() refuses them) refuses
 * the model, naming the layer; the embedding's step needs host memory on any device. */
static int cuda_like_supports(void *ctx, dt_op op) {
    return op != DT_OP_EMBEDDING && op != DT_OP_FM && op != DT_OP_REDUCE_SUM && op != DT_OP_SIGMOID_LOGLOSS;
}
static int all_supports(void *ctx, dt_op op) { return 1; }

static void test_device_refusal(void) {
    static dt_backend_ops ops;
    static dt_buffer_ops buf;
    dt_cpu cpu;
    dt_cpu_init(&cpu, 1);
    ops = dt_cpu_ops, ops.name = "cudalike", ops.supports = cuda_like_supports;
    buf = dt_cpu_buffers, buf.on_device = 1;
    dt_backend b = {&ops, &buf, &cpu};
    dt_net *net = build(2);
    dt_error err = {0};
    CHECK(dt_net_set_backend(net, &b, &err) != 0);
    CHECK_CONTAINS(err.msg, "not supported on cudalike yet: the binary output");
    ops.supports = all_supports;
    CHECK(dt_net_set_backend(net, &b, &err) != 0);
    CHECK_CONTAINS(err.msg, "not supported on cudalike yet: layer lin (embedding); use --device cpu");
    CHECK(!strcmp(dt_net_device(net), "cpu"));
    dt_net_free(net);
}

/* The embedding kernel alone: repeated rows, a mean bag, weights, an empty bag. */
static void test_kernel(void) {
    dt_cpu cpu;
    dt_cpu_init(&cpu, 1);
    /* 2 examples, 2 fields; rows 1,1,3 | 2 || (empty) | 1 */
    int64_t offsets[5] = {0, 3, 4, 4, 5}, rows[5] = {1, 1, 3, 2, 1};
    float w[5] = {1, 2, 0.5f, 1, 3};
    int32_t field[2] = {0, 1};
    float table[4 * 2] = {0, 0, 1, 10, 2, 20, 3, 30};
    dt_bags b = {offsets, 2, field, 2, rows, w, 2, 2, 1};
    float out[2 * 2 * 2];
    dt_embedding_forward(&cpu, out, table, &b);
    /* (1*e1 + 2*e1 + 0.5*e3) / 3.5 */
    CHECK_NEAR(out[0], (3 * 1 + 0.5 * 3) / 3.5, 1e-6);
    CHECK_NEAR(out[1], (3 * 10 + 0.5 * 30) / 3.5, 1e-5);
    CHECK(out[2] == 2 && out[3] == 20 && out[4] == 0 && out[5] == 0 && out[6] == 1 && out[7] == 10);
    CHECK(dt_embedding_pairs(&b) == 5);
    float dout[8] = {1, 1, 1, 1, 5, 5, 2, 2}, grad[5 * 2];
    int64_t uniq[5];
    uint64_t scratch[16];
    size_t n = dt_embedding_backward(&cpu, uniq, grad, dout, &b, scratch);
    CHECK(n == 3 && uniq[0] == 1 && uniq[1] == 2 && uniq[2] == 3);
    CHECK_NEAR(grad[0], 3 / 3.5 + 2, 1e-6); /* row 1: two ids of bag (0,0), the mean of bag (1,1) */
    CHECK_NEAR(grad[2], 1, 1e-6);
    CHECK_NEAR(grad[4], 0.5 / 3.5, 1e-6);
}

int main(void) {
    RUN(test_against_pytorch);
    RUN(test_threads);
    RUN(test_refusals);
    RUN(test_device_refusal);
    RUN(test_kernel);
    return test_summary();
}
