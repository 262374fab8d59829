/* The embedding tables' optimizer in one process: dt_table_optim_config (the flags into a
 * dt_lazy_config, bad values refused naming the flag) and the local updater's wiring. A small
 * click-log model (tests/fixtures/ctr.model: per-field and shared tables, repeated ids in a bag and
 * across bags, empty fields) trains four steps with each table optimizer, on batches that touch
 * different rows, while a float64 reference written here applies TensorFlow's formulas
 * (docs/sparse.md) to a copy of every table with the same gradients: the touched rows must follow
 * it, the rows never touched, and their slots, must stay bit for bit, and the state a checkpoint
 * saves must hold the tables' own slots under their own names. (test_lazy_optim.c checks the
 * formulas against numpy; this checks that training uses them, with the right rate, slots and
 * step.) */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compute/lazy_optim.h"
#include "io/safetensors.h"
#include "model/net.h"
#include "supervisor/checkpoint.h"
#include "test.h"
#include "train/table_optim.h"
#include "update/updater.h"

#define FIXTURE "tests/fixtures/ctr.safetensors"
#define MODEL "tests/fixtures/ctr.model"

static void *read_tensor(const dt_st_file *f, const char *name, dt_st_dtype dt, size_t *n) {
    const dt_st_info *t = dt_st_find(f, name);
    void *out = t ? malloc(t->count * 8 + 8) : NULL;
    if (!out || dt_st_read(f, name, dt, out, t->count, NULL)) {
        free(out);
        return NULL;
    }
    if (n) *n = (size_t)t->count;
    return out;
}

static void refusal(const char *what, dt_train_options o, const char *needle) {
    dt_lazy_config c;
    dt_error err = {0};
    CHECK_MSG(dt_table_optim_config(&o, &c, &err) == DT_EINVAL, "%s accepted", what);
    CHECK_CONTAINS(err.msg, needle);
}

static void test_config(void) {
    dt_train_options o;
    dt_train_options_init(&o);
    o.learning_rate = 0.25f;
    dt_lazy_config c;
    dt_error err = {0};
    CHECK(dt_table_optim_config(&o, &c, &err) == 0);
    CHECK(c.kind == DT_LAZY_ADAGRAD && c.learning_rate == 0.25f && c.initial_accumulator == 0.1f);
    o.table_optimizer = "ftrl", o.table_learning_rate = 0.05, o.table_l1 = 0.5, o.table_l2 = 2, o.table_lr_power = -1;
    o.table_initial_accumulator = 0;
    CHECK(dt_table_optim_config(&o, &c, &err) == 0);
    CHECK(c.kind == DT_LAZY_FTRL && c.learning_rate == 0.05f && c.l1 == 0.5f && c.l2 == 2.0f && c.lr_power == -1.0f &&
          c.initial_accumulator == 0.0f);

    dt_train_options d;
    dt_train_options_init(&d);
    dt_train_options x = d;
    x.table_optimizer = "adagard";
    refusal("a misspelt name", x, "table_optimizer 'adagard'");
    x = d, x.table_l1 = 0.1;
    refusal("l1 for adagrad", x, "--table_l1 0.1: table_optimizer adagrad does not use it");
    x = d, x.table_optimizer = "adam", x.table_initial_accumulator = 1;
    refusal("an accumulator for adam", x, "--table_initial_accumulator 1");
    x = d, x.table_optimizer = "sgd", x.table_lr_power = -1;
    refusal("lr_power for sgd", x, "--table_lr_power");
    x = d, x.table_optimizer = "ftrl", x.table_l2 = -1;
    refusal("a negative l2", x, "--table_l2 -1");
    x = d, x.table_optimizer = "ftrl", x.table_lr_power = 0.5;
    refusal("a positive lr_power", x, "--table_lr_power 0.5");
    x = d, x.table_initial_accumulator = 0;
    refusal("adagrad's accumulator at 0", x, "--table_initial_accumulator 0");
    x = d, x.table_learning_rate = NAN;
    refusal("a NaN rate", x, "--table_learning_rate");
    x = d, x.table_learning_rate = 0, x.learning_rate = 0;
    refusal("no rate at all", x, "--table_learning_rate");
}

/* The float64 reference of one row's update (docs/sparse.md), slots [k][dim] of this row. */
static void ref_row(const dt_lazy_config *c, int64_t step, double *w, double *s0, double *s1, const float *g, int dim) {
    const double lr = c->learning_rate;
    for (int j = 0; j < dim; j++) {
        double gj = g[j];
        switch (c->kind) {
        case DT_LAZY_SGD: w[j] -= lr * gj; break;
        case DT_LAZY_ADAGRAD:
            s0[j] += gj * gj;
            w[j] -= lr * gj / sqrt(s0[j]);
            break;
        case DT_LAZY_FTRL: {
            double p = -(double)c->lr_power, n1 = s0[j] + gj * gj;
            s1[j] += gj - (pow(n1, p) - pow(s0[j], p)) / lr * w[j];
            w[j] = fabs(s1[j]) > c->l1 ? (copysign(c->l1, s1[j]) - s1[j]) / (pow(n1, p) / lr + 2.0 * c->l2) : 0.0;
            s0[j] = n1;
            break;
        }
        case DT_LAZY_ADAM: {
            double t = (double)step + 1, b1 = c->beta1, b2 = c->beta2;
            double lr_t = lr * sqrt(1 - pow(b2, t)) / (1 - pow(b1, t));
            s0[j] = b1 * s0[j] + (1 - b1) * gj;
            s1[j] = b2 * s1[j] + (1 - b2) * gj * gj;
            w[j] -= lr_t * s0[j] / (sqrt(s1[j]) + c->epsilon);
            break;
        }
        }
    }
}

typedef struct {
    dt_net *net;
    dt_updater *u;
    size_t n;
    double *w, *s; /* the reference: every parameter, 2 slots of every parameter (flat layout) */
    float *w0;     /* the parameters at the start */
    uint8_t *touched;
} run;

static int train_step(run *r, const dt_lazy_config *c, const dt_ctr_batch *b, int64_t step) {
    dt_error err = {0};
    if (!dt_net_forward_ctr(r->net, b, 1, 7, &err)) return fprintf(stderr, "%s\n", err.msg), -1;
    dt_net_loss_binary(r->net, b->labels, NULL);
    if (dt_net_backward(r->net, &err)) return fprintf(stderr, "%s\n", err.msg), -1;
    for (int t = 0; t < dt_net_num_tables(r->net); t++) {
        dt_table_grad g;
        if (dt_net_table_grad(r->net, t, &g)) return -1;
        size_t off = dt_net_view(r->net, g.view)->offset;
        for (size_t k = 0; k < g.n; k++) {
            size_t at = off + (size_t)g.rows[k] * (size_t)g.dim;
            ref_row(c, step, r->w + at, r->s + at, r->s + r->n + at, g.grad + k * (size_t)g.dim, g.dim);
            memset(r->touched + at, 1, (size_t)g.dim);
        }
    }
    int64_t gs;
    return r->u->apply(r->u, r->net, step, &gs, &err) || gs != step + 1 ? -1 : 0;
}

/* Every table float against the reference: touched ones within 1e-5 (2e-4 for FTRL; relative to the larger of
 * themselves and 1% of the table's largest), untouched ones and their slots exactly as they started. */
static void compare(const run *r, const dt_lazy_config *c, const float *state, int slots, const char *name) {
    const float *p = dt_net_params(r->net);
    /* a new row's slots, as docs/sparse.md says (the accumulator first) */
    const float init[2] = {c->kind == DT_LAZY_ADAGRAD || c->kind == DT_LAZY_FTRL ? c->initial_accumulator : 0, 0};
    /* FTRL's linear slot sums g - sigma * w, nearly cancelling terms: float32 keeps fewer of its
     * digits (measured: 3e-5 after four updates). A wrong rate, slot or step is off by far more. */
    const double tol = c->kind == DT_LAZY_FTRL ? 2e-4 : 1e-5;
    int touched = 0, untouched = 0;
    for (int v = 0; v < dt_net_num_views(r->net); v++) {
        const dt_param_view *pv = dt_net_view(r->net, v);
        if (!pv->table) continue;
        double mx = 1e-6;
        for (size_t i = pv->offset; i < pv->offset + pv->count; i++) mx = fmax(mx, fabs(r->w[i]));
        for (size_t i = pv->offset; i < pv->offset + pv->count; i++) {
            for (int k = -1; k < dt_lazy_slots(c->kind); k++) {
                double want = k < 0 ? r->w[i] : r->s[(size_t)k * r->n + i];
                float got = k < 0 ? p[i] : state[(size_t)k * r->n + i];
                if (!r->touched[i]) {
                    CHECK_MSG(got == (k < 0 ? r->w0[i] : init[k]), "%s: %s[%zu] slot %d moved untouched",
                              name, pv->name, i - pv->offset, k);
                    continue;
                }
                double scale = k < 0 ? fmax(fabs(want), 1e-2 * mx) : fmax(fabs(want), 1e-6);
                CHECK_MSG(fabs(got - want) <= tol * scale, "%s: %s[%zu] slot %d: %.9g, reference %.9g", name, pv->name,
                          i - pv->offset, k, (double)got, want);
            }
            if (r->touched[i]) touched++;
            else untouched++;
        }
    }
    CHECK_MSG(touched > 20 && untouched > 20, "%s: %d touched, %d untouched", name, touched, untouched);
    CHECK(slots >= dt_lazy_slots(c->kind));
}

/* A checkpoint of the run holds each table's slots under the tables' optimizer's names (the dense
 * variables under adam's), reads back, and is refused by a run with another table optimizer. */
static void check_checkpoint(const run *r, const dt_opt_config *dense, const dt_lazy_config *c, const float *params,
                             const float *state, int slots) {
    char dir[] = "/tmp/dt_table_optim_XXXXXX", name[128], path[256];
    if (!mkdtemp(dir)) return;
    dt_ckpt_run cr = {.net = r->net, .opt = dense, .tables = c, .batch_size = 4, .n_workers = 1,
                      .validation_fraction = -1};
    CHECK(dt_ckpt_state_slots(&cr) == slots);
    dt_error err = {0};
    CHECK(dt_ckpt_save(dir, &cr, params, state, 4, 5, NULL, name, sizeof name, &err) == 0);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    dt_st_file *f = NULL;
    CHECK(dt_st_open(&f, path, &err) == 0);
    for (int v = 0; f && v < dt_net_num_views(r->net); v++) {
        const dt_param_view *pv = dt_net_view(r->net, v);
        char t[128];
        snprintf(t, sizeof t, "%s/%s", pv->name, dt_ckpt_slot_name(DT_OPT_ADAM, 1));
        if (!pv->table || c->kind == DT_LAZY_ADAM) CHECK_MSG(dt_st_find(f, t) != NULL, "%s missing", t);
        else CHECK_MSG(dt_st_find(f, t) == NULL, "%s: a table with adam's slot", t);
        if (!pv->table || c->kind == DT_LAZY_SGD) continue;
        snprintf(t, sizeof t, "%s/%s", pv->name, dt_ckpt_table_slot_name(c->kind, dt_lazy_slots(c->kind) - 1));
        CHECK_MSG(dt_st_find(f, t) != NULL, "%s missing", t);
    }
    float *p2 = calloc(r->n, sizeof *p2), *s2 = calloc(r->n * (size_t)slots, sizeof *s2);
    int64_t step = 0;
    CHECK(f && dt_ckpt_load(f, "ckpt", &cr, p2, s2, &step, &err) == 0 && step == 4);
    CHECK(memcmp(p2, params, r->n * sizeof *p2) == 0 && memcmp(s2, state, r->n * (size_t)slots * sizeof *s2) == 0);
    dt_lazy_config other = *c;
    other.kind = c->kind == DT_LAZY_FTRL ? DT_LAZY_ADAGRAD : DT_LAZY_FTRL;
    cr.tables = &other;
    CHECK(f && dt_ckpt_load(f, "ckpt", &cr, p2, s2, &step, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "--table_optimizer");
    free(p2), free(s2);
    dt_st_close(f);
    unlink(path);
    snprintf(path, sizeof path, "%s/checkpoint", dir);
    unlink(path);
    rmdir(dir);
}

static void train_with(const char *name, double lr, double l1, double l2, double lr_power, const dt_ctr_batch *b,
                       const dt_ctr_batch *half) {
    dt_train_options o;
    dt_train_options_init(&o);
    o.learning_rate = (float)lr;
    o.table_optimizer = name, o.table_l1 = l1, o.table_l2 = l2, o.table_lr_power = lr_power;
    dt_lazy_config c;
    dt_opt_config dense;
    dt_error err = {0};
    run r = {0};
    CHECK(dt_table_optim_config(&o, &c, &err) == 0 && dt_opt_config_init(&dense, "adam", 0.01f, &err) == 0);
    if (dt_net_load(&r.net, MODEL, b->n, &err) || dt_local_updater_create(&r.u, &dense, &c, r.net, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        goto out;
    }
    int64_t gs = -1;
    CHECK(r.u->start(r.u, r.net, 3, &gs, &err) == 0 && gs == 0);
    r.n = dt_net_param_count(r.net);
    r.w = calloc(r.n, sizeof *r.w), r.s = calloc(2 * r.n, sizeof *r.s), r.w0 = malloc(r.n * sizeof *r.w0);
    r.touched = calloc(r.n, 1);
    const float init[2] = {c.kind == DT_LAZY_ADAGRAD || c.kind == DT_LAZY_FTRL ? c.initial_accumulator : 0, 0};
    for (size_t i = 0; i < r.n; i++) {
        r.w[i] = r.w0[i] = dt_net_params(r.net)[i];
        for (int k = 0; k < dt_lazy_slots(c.kind); k++) r.s[(size_t)k * r.n + i] = init[k];
    }
    /* the whole batch, its first half (some rows absent), the whole, the half */
    for (int64_t step = 0; step < 4; step++) CHECK(train_step(&r, &c, step % 2 ? half : b, step) == 0);
    int slots = dt_opt_slots(&dense) > dt_lazy_slots(c.kind) ? dt_opt_slots(&dense) : dt_lazy_slots(c.kind);
    float *params = malloc(r.n * sizeof *params), *state = calloc(r.n * (size_t)slots, sizeof *state);
    CHECK(r.u->snapshot(r.u, r.net, params, state, &gs, 0, &err) == 0 && gs == 4);
    compare(&r, &c, state, slots, name);
    check_checkpoint(&r, &dense, &c, params, state, slots);
    free(params), free(state);
out:
    if (r.u) r.u->free(r.u);
    dt_net_free(r.net);
    free(r.w), free(r.s), free(r.w0), free(r.touched);
}

static void test_training(void) {
    dt_st_file *f = NULL;
    dt_error err = {0};
    if (dt_st_open(&f, FIXTURE, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    size_t n = 0, n_off = 0;
    float *dense = read_tensor(f, "dense", DT_ST_F32, NULL), *values = read_tensor(f, "values", DT_ST_F32, NULL),
          *labels = read_tensor(f, "labels", DT_ST_F32, &n);
    int64_t *offsets = read_tensor(f, "offsets", DT_ST_I64, &n_off);
    uint64_t *ids = read_tensor(f, "ids", DT_ST_I64, NULL);
    CHECK(dense && values && labels && offsets && ids && n >= 4);
    if (dense && values && labels && offsets && ids && n >= 4) {
        dt_ctr_batch b = {.n = (int)n, .num_dense = 3, .num_fields = 4, .labels = labels, .dense = dense,
                          .offsets = offsets, .ids = ids, .values = values};
        dt_ctr_batch half = b;
        half.n = (int)n / 2;
        train_with("sgd", 0.1, 0, 0, -0.5, &b, &half);
        train_with("adagrad", 0.1, 0, 0, -0.5, &b, &half);
        train_with("ftrl", 0.1, 0.001, 0.05, -0.5, &b, &half);
        train_with("ftrl", 0.2, 0, 0.01, -0.7, &b, &half);
        train_with("adam", 0.01, 0, 0, -0.5, &b, &half);
    }
    free(dense), free(values), free(labels), free(offsets), free(ids);
    dt_st_close(f);
}

int main(void) {
    RUN(test_config);
    RUN(test_training);
    return test_summary();
}
