/* Kernels against naive double-precision references written here (obvious loops), and every
 * backward against central finite differences of its own forward. */
#include <float.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <stdint.h>

#include "compute/kernels.h"
#include "core/error.h"
#include "core/rng.h"
#include "test.h"

/* The CPU context the kernels here run on (its threads: OpenMP's default; some tests change it). */
static dt_cpu cpu;

/* ---- helpers ------------------------------------------------------------------------------- */

static float *randn(size_t n, dt_rng *r, float scale) {
    float *x = dt_alloc_floats(n, "test", NULL);
    for (size_t i = 0; i < n; i++) x[i] = (float)dt_rng_normal(r) * scale;
    return x;
}

/* Largest |a-b| / (1 + |b|): a relative error that tolerates values near zero. */
static double max_rel_err(const float *a, const double *b, size_t n) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]) / (1.0 + fabs(b[i]));
        if (!(e <= worst)) worst = e; /* NaN counts as worst */
    }
    return worst;
}

static double max_abs_diff_f(const float *a, const float *b, size_t n) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (!(e <= worst)) worst = e;
    }
    return worst;
}

static double dot_fd(const float *out, const float *r, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)out[i] * r[i];
    return s;
}

/* ---- window geometry ----------------------------------------------------------------------- */

static void test_window_same_padding(void) {
    dt_window g;
    dt_error err = {0};
    /* TF: out = ceil(in/s), pad_total = max((out-1)*s + k - in, 0), top = total/2. */
    struct { int in, k, s, out, top; } cases[] = {
        {28, 3, 1, 28, 1}, {7, 2, 2, 4, 0}, {6, 3, 2, 3, 0}, {5, 4, 1, 5, 1},
        {128, 2, 2, 64, 0}, {2, 5, 1, 2, 2}, {9, 3, 3, 3, 0}, {10, 1, 3, 4, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(dt_window_init(&g, cases[i].in, cases[i].in + 1, 3, 8, cases[i].k, cases[i].k,
                             cases[i].s, cases[i].s, DT_PAD_SAME, &err) == 0);
        CHECK_MSG(g.out_h == cases[i].out && g.pad_top == cases[i].top, "case %zu: out %d top %d",
                  i, g.out_h, g.pad_top);
        int out_w = (cases[i].in + 1 + cases[i].s - 1) / cases[i].s;
        int tw = (out_w - 1) * cases[i].s + cases[i].k - (cases[i].in + 1);
        CHECK(g.out_w == out_w && g.pad_left == (tw > 0 ? tw / 2 : 0));
        CHECK(g.in_c == 3 && g.out_c == 8);
    }
}

static void test_window_valid_and_errors(void) {
    dt_window g;
    dt_error err = {0};
    CHECK(dt_window_init(&g, 7, 6, 3, 2, 2, 3, 2, 1, DT_PAD_VALID, &err) == 0);
    CHECK(g.out_h == 3 && g.out_w == 4 && g.pad_top == 0 && g.pad_left == 0);
    CHECK(dt_window_init(&g, 3, 3, 1, 1, 5, 5, 1, 1, DT_PAD_VALID, &err) == DT_ESHAPE);
    CHECK_CONTAINS(err.msg, "larger");
    CHECK_CONTAINS(err.msg, "5x5");
    CHECK(dt_window_init(&g, 3, 3, 1, 1, 3, 3, 0, 1, DT_PAD_SAME, &err) == DT_ESHAPE);
    CHECK_CONTAINS(err.msg, "stride");
    CHECK(dt_window_init(&g, 0, 3, 1, 1, 3, 3, 1, 1, DT_PAD_SAME, &err) == DT_ESHAPE);
    CHECK_CONTAINS(err.msg, "input");
    CHECK(dt_window_init(&g, 3, 3, 1, 0, 3, 3, 1, 1, DT_PAD_SAME, &err) == DT_ESHAPE);
    CHECK_CONTAINS(err.msg, "output channels");
    CHECK(dt_window_init(&g, 3, 3, 1, 1, 0, 3, 1, 1, DT_PAD_SAME, &err) == DT_ESHAPE);
    CHECK_CONTAINS(err.msg, "kernel");
    CHECK(dt_window_init(&g, 3, 3, 1, 1, 3, 3, 1, 1, (dt_padding)7, &err) == DT_EINVAL);
    CHECK(dt_window_init(&g, 65536, 65536, 1, 1, 3, 3, 1, 1, DT_PAD_SAME, &err) == DT_ESHAPE);
    CHECK(dt_window_init(&g, 3, 3, 1, 1, 5, 5, 1, 1, DT_PAD_VALID, NULL) == DT_ESHAPE); /* NULL err ok */
}

/* A context's threads: capped at the cores, every core for 0; two contexts keep their own counts. */
static void test_threads(void) {
    dt_cpu one, all, many;
    dt_cpu_init(&one, 1);
    dt_cpu_init(&all, 0);
    dt_cpu_init(&many, 100000);
    CHECK(one.threads == 1);
    CHECK(all.threads == dt_cpu_cores() && dt_cpu_cores() >= 1);
    CHECK(many.threads == dt_cpu_cores()); /* capped at the cores scratch is sized for */
    CHECK(dt_cpu_default_threads() >= 1 && dt_cpu_default_threads() <= dt_cpu_cores());
    CHECK(one.threads == 1); /* the others did not change it */
}

/* Points dt_cpu at a stand-in for /proc/loadavg whose fourth field says `running` tasks are
 * runnable now; returns its path (freed by the caller after dt_cpu_set_loadavg_path(NULL)). */
static char *fake_loadavg(int running) {
    char *path = strdup("/tmp/dtrain_loadavgXXXXXX");
    int fd = path ? mkstemp(path) : -1;
    CHECK(fd >= 0);
    if (fd < 0) return path;
    dprintf(fd, "3.10 2.90 2.50 %d/812 4242\n", running);
    close(fd);
    dt_cpu_set_loadavg_path(path);
    return path;
}

static void drop_fake_loadavg(char *path) {
    dt_cpu_set_loadavg_path(NULL);
    if (path) unlink(path);
    free(path);
}

/* The parallel regions one step of the shipped click-log models' loops enters (models/lr, fm,
 * deepfm: 26 fields of dim 8, a 221 -> 200 dense layer) at batch B. */
static uint64_t click_step_regions(const dt_cpu *two, int B) {
    enum { F = 26, D = 8, ROWS = 4096 };
    dt_rng r;
    dt_rng_seed(&r, 5);
    float *table = randn((size_t)ROWS * D, &r, 1), *emb = dt_alloc_floats((size_t)B * F * D, "t", NULL);
    float *demb = randn((size_t)B * F * D, &r, 1), *grad = dt_alloc_floats((size_t)B * F * D, "t", NULL);
    float *x = randn((size_t)B * 221, &r, 1), *w = randn(221 * 200, &r, 1), *h = dt_alloc_floats((size_t)B * 200, "t", NULL);
    float *dh = randn((size_t)B * 200, &r, 1), *dx = dt_alloc_floats((size_t)B * 221, "t", NULL);
    float *dw = dt_alloc_floats(221 * 200, "t", NULL), *o = dt_alloc_floats(B, "t", NULL), *dout = randn(B, &r, 1);
    int64_t *offsets = malloc(((size_t)B * F + 1) * sizeof *offsets), *rows = malloc((size_t)B * F * sizeof *rows);
    int64_t *uniq = malloc((size_t)B * F * sizeof *uniq);
    uint64_t *scratch = malloc(((size_t)3 * B * F + 1) * sizeof *scratch);
    int32_t fields[F];
    for (int f = 0; f < F; f++) fields[f] = f;
    for (int i = 0; i <= B * F; i++) offsets[i] = i;
    for (int i = 0; i < B * F; i++) rows[i] = (int64_t)dt_rng_below(&r, ROWS);
    dt_bags bags = {.offsets = offsets, .num_fields = F, .field = fields, .n_fields = F, .rows = rows, .batch = B, .dim = D};
    uint64_t before = dt_cpu_regions();
    dt_embedding_forward(two, emb, table, &bags);
    dt_fm_forward(two, o, emb, B, F, D);
    dt_reduce_sum_forward(two, o, emb, B, F * D);
    dt_concat_forward(two, x, emb, B, F * D, 221, 13);
    dt_dense_forward(two, h, x, w, NULL, B, 221, 200);
    dt_relu_forward(two, h, h, (size_t)B * 200);
    dt_relu_backward(two, dh, dh, h, (size_t)B * 200);
    dt_dense_backward(two, dx, dw, NULL, dh, x, w, B, 221, 200);
    dt_concat_backward(two, demb, dx, B, F * D, 221, 13);
    dt_fm_backward(two, demb, dout, emb, B, F, D);
    dt_reduce_sum_backward(two, demb, dout, B, F * D);
    dt_sigmoid_forward(two, o, o, B);
    dt_embedding_backward(two, uniq, grad, demb, &bags, scratch);
    uint64_t entered = dt_cpu_regions() - before;
    free(table), free(emb), free(demb), free(grad), free(x), free(w), free(h), free(dh), free(dx), free(dw), free(o);
    free(dout), free(offsets), free(rows), free(uniq), free(scratch);
    return entered;
}

/* Loops below their kind's threshold (compute/cpu.h: about 4x the idle machine's break-even in
 * bench/bench_par) stay on one thread even on an idle machine: a click-log step at batch 16
 * enters no region. The counter itself counts: the same loops with every region entered
 * (par_always) count. */
static void test_small_loops_stay_on_one_thread(void) {
    if (dt_cpu_cores() < 2) return;
    char *path = fake_loadavg(1); /* idle: only this thread runs */
    dt_cpu two;
    dt_cpu_init(&two, 2);
    CHECK(click_step_regions(&two, 16) == 0);
    two.par_always = 1;
    CHECK(click_step_regions(&two, 16) >= 10);
    drop_fake_loadavg(path);
}

/* With every core held by other work, a second thread only waits for a core (2 threads 16-20x
 * slower than 1 for click-log models, issue 36): a click-log step at batch 1024 enters no region
 * then, and does on an idle machine, where its loops are above their thresholds. */
static void test_busy_machine_stays_on_one_thread(void) {
    if (dt_cpu_cores() < 2) return;
    dt_cpu two;
    dt_cpu_init(&two, 2);
    for (int busy = 0; busy < 2; busy++) {
        char *path = fake_loadavg(busy ? dt_cpu_cores() + 1 : 1); /* busy: every core besides this thread */
        uint64_t entered = click_step_regions(&two, 1024);
        CHECK(busy ? entered == 0 : entered >= 5);
        drop_fake_loadavg(path);
    }
}

/* This process's own runnable threads are not other work: OpenMP's workers spin after a region,
 * and counting them kept an idle machine's image models on one thread (issue 36: fashion 2
 * threads 1.20x of 1 instead of 1.84x). A thread of ours spinning beside this one, with the
 * machine's runnable count saying exactly these two: a region is still entered. */
static volatile int g_spin_stop, g_spinning;
static void *spin(void *arg) {
    (void)arg;
    __atomic_store_n(&g_spinning, 1, __ATOMIC_SEQ_CST);
    while (!__atomic_load_n(&g_spin_stop, __ATOMIC_RELAXED)) {
    }
    return NULL;
}

static void test_own_threads_are_not_load(void) {
    if (dt_cpu_cores() < 2) return;
    pthread_t t;
    g_spin_stop = 0, g_spinning = 0;
    CHECK(pthread_create(&t, NULL, spin, NULL) == 0);
    while (!__atomic_load_n(&g_spinning, __ATOMIC_SEQ_CST)) {
    }
    size_t n = (size_t)4 << 20; /* above DT_PAR_STREAM's threshold under either wait policy */
    float *x = dt_alloc_floats(n, "t", NULL);
    for (size_t i = 0; i < n; i++) x[i] = (float)i - 1e5f;
    dt_cpu two;
    dt_cpu_init(&two, 2);
    char *path = fake_loadavg(2); /* this thread and the spinning one */
    uint64_t before = dt_cpu_regions();
    dt_relu_forward(&two, x, x, n);
    CHECK(dt_cpu_regions() - before == 1u);
    drop_fake_loadavg(path);
    __atomic_store_n(&g_spin_stop, 1, __ATOMIC_RELAXED);
    pthread_join(t, NULL);
    free(x);
}

/* ---- GEMM ---------------------------------------------------------------------------------- */

static void test_gemm(void) {
    dt_rng r;
    dt_rng_seed(&r, 1);
    /* Big enough to be split across threads, both along M and along N; padded leading dims. */
    int shapes[][3] = {{100, 70, 150}, {37, 200, 160}, {5, 3, 7}, {64, 64, 64}};
    for (int s = 0; s < 4; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 5;
                float *A = randn((size_t)(ta ? K : M) * lda, &r, 1.0f);
                float *B = randn((size_t)(tb ? N : K) * ldb, &r, 1.0f);
                float *C = randn((size_t)M * ldc, &r, 1.0f);
                double *ref = malloc(sizeof(double) * M * ldc);
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < ldc; j++) {
                        double acc = 0.0;
                        if (j < N)
                            for (int k = 0; k < K; k++)
                                acc += (double)(ta ? A[k * lda + i] : A[i * lda + k]) *
                                       (tb ? B[j * ldb + k] : B[k * ldb + j]);
                        ref[i * ldc + j] = j < N ? 0.5 * acc - 2.0 * C[i * ldc + j] : C[i * ldc + j];
                    }
                dt_gemm(&cpu, ta, tb, M, N, K, 0.5f, A, lda, B, ldb, -2.0f, C, ldc);
                CHECK_MSG(max_rel_err(C, ref, (size_t)M * ldc) < 1e-5, "shape %d ta %d tb %d", s, ta, tb);
                free(A), free(B), free(C), free(ref);
            }
}

/* ---- convolution --------------------------------------------------------------------------- */

static void ref_conv_forward(double *out, const float *in, const float *w, const float *b, int N,
                             const dt_window *g) {
    for (int n = 0; n < N; n++)
        for (int oh = 0; oh < g->out_h; oh++)
            for (int ow = 0; ow < g->out_w; ow++)
                for (int oc = 0; oc < g->out_c; oc++) {
                    double acc = b ? b[oc] : 0.0;
                    for (int kh = 0; kh < g->k_h; kh++)
                        for (int kw = 0; kw < g->k_w; kw++) {
                            int ih = oh * g->stride_h - g->pad_top + kh;
                            int iw = ow * g->stride_w - g->pad_left + kw;
                            if (ih < 0 || ih >= g->in_h || iw < 0 || iw >= g->in_w) continue;
                            for (int c = 0; c < g->in_c; c++)
                                acc += (double)in[((n * g->in_h + ih) * g->in_w + iw) * g->in_c + c] *
                                       w[((kh * g->k_w + kw) * g->in_c + c) * g->out_c + oc];
                        }
                    out[((n * g->out_h + oh) * g->out_w + ow) * g->out_c + oc] = acc;
                }
}

static void ref_conv_backward(double *din, double *dw, double *db, const float *dout, const float *in,
                              const float *w, int N, const dt_window *g) {
    size_t nin = (size_t)N * g->in_h * g->in_w * g->in_c;
    size_t nw = (size_t)g->k_h * g->k_w * g->in_c * g->out_c;
    memset(din, 0, nin * sizeof(double));
    memset(dw, 0, nw * sizeof(double));
    memset(db, 0, g->out_c * sizeof(double));
    for (int n = 0; n < N; n++)
        for (int oh = 0; oh < g->out_h; oh++)
            for (int ow = 0; ow < g->out_w; ow++)
                for (int oc = 0; oc < g->out_c; oc++) {
                    double go = dout[((n * g->out_h + oh) * g->out_w + ow) * g->out_c + oc];
                    db[oc] += go;
                    for (int kh = 0; kh < g->k_h; kh++)
                        for (int kw = 0; kw < g->k_w; kw++) {
                            int ih = oh * g->stride_h - g->pad_top + kh;
                            int iw = ow * g->stride_w - g->pad_left + kw;
                            if (ih < 0 || ih >= g->in_h || iw < 0 || iw >= g->in_w) continue;
                            for (int c = 0; c < g->in_c; c++) {
                                size_t ii = ((size_t)(n * g->in_h + ih) * g->in_w + iw) * g->in_c + c;
                                size_t wi = ((size_t)(kh * g->k_w + kw) * g->in_c + c) * g->out_c + oc;
                                din[ii] += go * w[wi];
                                dw[wi] += go * in[ii];
                            }
                        }
                }
}

typedef struct {
    int N, H, W, C, OC, KH, KW, SH, SW;
    dt_padding pad;
} conv_case;

/* Forward and backward against the reference; din == NULL and b == NULL paths; optionally
 * finite differences of sum(out * R) for every input, weight and bias element. */
static void check_conv(conv_case cc, int finite_diff, uint64_t seed) {
    dt_window g;
    dt_error err = {0};
    if (dt_window_init(&g, cc.H, cc.W, cc.C, cc.OC, cc.KH, cc.KW, cc.SH, cc.SW, cc.pad, &err) != 0) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    dt_rng r;
    dt_rng_seed(&r, seed);
    size_t nin = (size_t)cc.N * cc.H * cc.W * cc.C, nw = (size_t)cc.KH * cc.KW * cc.C * cc.OC;
    size_t nout = (size_t)cc.N * g.out_h * g.out_w * cc.OC;
    float *in = randn(nin, &r, 1.0f), *w = randn(nw, &r, 0.5f), *b = randn(cc.OC, &r, 1.0f);
    float *R = randn(nout, &r, 1.0f), *out = dt_alloc_floats(nout, "t", NULL);
    float *din = dt_alloc_floats(nin, "t", NULL), *dw = dt_alloc_floats(nw, "t", NULL);
    float *db = dt_alloc_floats(cc.OC, "t", NULL), *dw2 = dt_alloc_floats(nw, "t", NULL);
    float *db2 = dt_alloc_floats(cc.OC, "t", NULL);
    float *scratch = dt_alloc_floats(dt_conv2d_scratch_floats(&g, cc.N), "t", NULL);
    double *rout = malloc(nout * sizeof(double)), *rdin = malloc(nin * sizeof(double));
    double *rdw = malloc(nw * sizeof(double)), *rdb = malloc(cc.OC * sizeof(double));
    char name[128];
    snprintf(name, sizeof name, "N%d %dx%dx%d->%d k%dx%d s%dx%d %s", cc.N, cc.H, cc.W, cc.C, cc.OC,
             cc.KH, cc.KW, cc.SH, cc.SW, cc.pad == DT_PAD_SAME ? "SAME" : "VALID");

    /* Each output and din element is a float sum of up to KH*KW*max(C, OC) products, summed in an
     * order that depends on OpenBLAS's kernels: allow rounding growing with that count, as for dW
     * below (576 products: 3.4e-5; OpenBLAS's Haswell kernels reach 1.3e-5 there). */
    int terms = cc.KH * cc.KW * (cc.C > cc.OC ? cc.C : cc.OC);
    double tol_sum = 1e-5 * (1.0 + sqrt(terms / 100.0));
    ref_conv_forward(rout, in, w, b, cc.N, &g);
    for (size_t i = 0; i < nout; i++) out[i] = NAN; /* outputs must be overwritten */
    dt_conv2d_forward(&cpu, out, in, w, b, cc.N, &g, scratch);
    CHECK_MSG(max_rel_err(out, rout, nout) < tol_sum, "%s forward %g", name, max_rel_err(out, rout, nout));
    ref_conv_forward(rout, in, w, NULL, cc.N, &g);
    dt_conv2d_forward(&cpu, out, in, w, NULL, cc.N, &g, scratch);
    CHECK_MSG(max_rel_err(out, rout, nout) < tol_sum, "%s forward without bias %g", name,
              max_rel_err(out, rout, nout));

    ref_conv_backward(rdin, rdw, rdb, R, in, w, cc.N, &g);
    for (size_t i = 0; i < nin; i++) din[i] = NAN;
    for (size_t i = 0; i < nw; i++) dw[i] = NAN;
    for (int i = 0; i < cc.OC; i++) db[i] = NAN;
    dt_conv2d_backward(&cpu, din, dw, db, R, in, w, cc.N, &g, scratch);
    CHECK_MSG(max_rel_err(din, rdin, nin) < tol_sum, "%s din %g", name, max_rel_err(din, rdin, nin));
    /* dW and db sum over every output position in float: allow rounding growing with the count. */
    double tol = 1e-5 * (1.0 + sqrt((double)nout / cc.OC / 100.0));
    CHECK_MSG(max_rel_err(dw, rdw, nw) < tol, "%s dw %g", name, max_rel_err(dw, rdw, nw));
    CHECK_MSG(max_rel_err(db, rdb, cc.OC) < tol, "%s db %g", name, max_rel_err(db, rdb, cc.OC));
    /* First layer: no din; the parameter gradients are unchanged. db == NULL is allowed too. */
    dt_conv2d_backward(&cpu, NULL, dw2, db2, R, in, w, cc.N, &g, scratch);
    CHECK_MSG(max_abs_diff_f(dw, dw2, nw) == 0.0 && max_abs_diff_f(db, db2, cc.OC) == 0.0,
              "%s din==NULL changes dw/db", name);
    dt_conv2d_backward(&cpu, NULL, dw2, NULL, R, in, w, cc.N, &g, scratch);
    CHECK_MSG(max_abs_diff_f(dw, dw2, nw) == 0.0, "%s db==NULL changes dw", name);

    if (finite_diff) {
        /* L(x) = sum(conv(x) * R) is linear in each argument, so central differences are exact up
         * to float rounding. */
        const float eps = 1e-2f;
        float *params[3] = {in, w, b};
        const float *grads[3] = {din, dw, db};
        size_t counts[3] = {nin, nw, (size_t)cc.OC};
        double worst = 0.0;
        for (int p = 0; p < 3; p++)
            for (size_t i = 0; i < counts[p]; i++) {
                float keep = params[p][i];
                params[p][i] = keep + eps;
                dt_conv2d_forward(&cpu, out, in, w, b, cc.N, &g, scratch);
                double lp = dot_fd(out, R, nout);
                params[p][i] = keep - eps;
                dt_conv2d_forward(&cpu, out, in, w, b, cc.N, &g, scratch);
                double lm = dot_fd(out, R, nout);
                params[p][i] = keep;
                double fd = (lp - lm) / (2.0 * eps);
                double e = fabs(fd - grads[p][i]) / (1.0 + fabs(fd));
                if (!(e <= worst)) worst = e;
            }
        CHECK_MSG(worst < 2e-3, "%s finite differences: worst relative error %g", name, worst);
    }
    free(in), free(w), free(b), free(R), free(out), free(din), free(dw), free(db), free(dw2);
    free(db2), free(scratch), free(rout), free(rdin), free(rdw), free(rdb);
}

static void test_conv_small_geometries(void) {
    conv_case cases[] = {
        {2, 5, 7, 1, 3, 3, 3, 1, 1, DT_PAD_SAME},   /* odd sizes, C = 1 */
        {2, 6, 5, 2, 4, 3, 3, 2, 2, DT_PAD_SAME},   /* stride 2, uneven padding (bottom only) */
        {3, 7, 6, 3, 2, 2, 3, 2, 1, DT_PAD_VALID},  /* VALID, non-square kernel and stride */
        {1, 5, 6, 2, 3, 4, 4, 1, 1, DT_PAD_SAME},   /* even kernel: pad 1 top, 2 bottom */
        {2, 2, 3, 2, 2, 5, 5, 1, 1, DT_PAD_SAME},   /* kernel larger than the input */
        {2, 4, 5, 3, 4, 1, 1, 1, 1, DT_PAD_VALID},  /* pointwise: no im2col */
        {2, 9, 8, 2, 3, 3, 3, 3, 2, DT_PAD_SAME},   /* stride 3 */
        {1, 5, 5, 2, 2, 5, 5, 1, 1, DT_PAD_VALID},  /* one output position */
        {2, 5, 5, 2, 3, 1, 1, 2, 2, DT_PAD_SAME},   /* 1x1 strided: im2col path */
        /* 3x3 stride 1 with >= 8 channels in and out: the Winograd path */
        {2, 5, 7, 8, 8, 3, 3, 1, 1, DT_PAD_SAME},   /* odd sizes: clipped 2x2 tiles */
        {1, 6, 5, 9, 10, 3, 3, 1, 1, DT_PAD_VALID}, /* VALID: din is a full correlation */
        {3, 1, 1, 8, 8, 3, 3, 1, 1, DT_PAD_SAME},   /* 1x1 image: one tile, mostly padding */
        {1, 3, 4, 8, 9, 3, 3, 1, 1, DT_PAD_VALID},  /* one output row */
        {2, 4, 4, 16, 8, 3, 3, 1, 1, DT_PAD_SAME},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_conv(cases[i], 1, 10 + i);
}

/* Shapes big enough for several im2col chunks per thread, chunks that straddle examples, and the
 * real models' layers (fashion conv2, cats-vs-dogs conv1 at a reduced size); both thread counts. */
static void test_conv_chunked(void) {
    dt_cpu saved = cpu;
    conv_case cases[] = {
        {3, 20, 21, 64, 5, 3, 3, 1, 1, DT_PAD_SAME},
        {3, 14, 14, 32, 64, 3, 3, 1, 1, DT_PAD_SAME},
        {2, 40, 40, 3, 32, 3, 3, 1, 1, DT_PAD_SAME},
        {5, 11, 13, 40, 7, 3, 3, 2, 2, DT_PAD_VALID},
        {3, 30, 30, 300, 3, 1, 1, 1, 1, DT_PAD_VALID},
    };
    for (int t = 1; t <= 2; t++) {
        dt_cpu_init(&cpu, t);
        cpu.par_always = 1; /* the split paths at these small sizes too */
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_conv(cases[i], 0, 50 + i);
    }
    cpu = saved;
}

/* Forward and backward of one convolution at 1 and 2 threads: the same bits. */
static void check_conv_threads(int N, int H, int W, int C, int OC, uint64_t seed) {
    dt_window g;
    CHECK(dt_window_init(&g, H, W, C, OC, 3, 3, 1, 1, DT_PAD_SAME, NULL) == 0);
    dt_rng r;
    dt_rng_seed(&r, seed);
    size_t nin = (size_t)N * H * W * C, nw = (size_t)9 * C * OC, nout = (size_t)N * H * W * OC;
    float *in = randn(nin, &r, 1), *w = randn(nw, &r, 1), *b = randn((size_t)OC, &r, 1), *dout = randn(nout, &r, 1);
    float *scratch = dt_alloc_floats(dt_conv2d_scratch_floats(&g, N), "t", NULL);
    float *din[2], *dw[2], *db[2], *out[2];
    for (int t = 0; t < 2; t++) {
        dt_cpu ctx;
        dt_cpu_init(&ctx, t + 1);
        ctx.par_always = 1; /* split below the thresholds too: the bits must not depend on it */
        din[t] = dt_alloc_floats(nin, "t", NULL), dw[t] = dt_alloc_floats(nw, "t", NULL);
        db[t] = dt_alloc_floats((size_t)OC, "t", NULL), out[t] = dt_alloc_floats(nout, "t", NULL);
        dt_conv2d_forward(&ctx, out[t], in, w, b, N, &g, scratch);
        dt_conv2d_backward(&ctx, din[t], dw[t], db[t], dout, in, w, N, &g, scratch);
    }
    const char *how = g.in_c >= 8 ? "winograd" : "im2col";
    CHECK_MSG(memcmp(out[0], out[1], nout * sizeof(float)) == 0, "%s forward", how);
    CHECK_MSG(memcmp(din[0], din[1], nin * sizeof(float)) == 0, "%s din", how);
    CHECK_MSG(memcmp(dw[0], dw[1], nw * sizeof(float)) == 0, "%s dw", how);
    CHECK_MSG(memcmp(db[0], db[1], (size_t)OC * sizeof(float)) == 0, "%s db", how);
    for (int t = 0; t < 2; t++) free(din[t]), free(dw[t]), free(db[t]), free(out[t]);
    free(in), free(w), free(b), free(dout), free(scratch);
}

/* Outputs and gradients are bit-identical for any thread count (chunks cut by the shape and the
 * cores, gradient pieces fixed and summed in order), so a training run is reproducible whatever
 * --threads says. Same for dense (dt_gemm splits rows or columns of C, never the summed
 * dimension). */
static void test_thread_count_independence(void) {
    check_conv_threads(37, 14, 15, 8, 16, 77); /* Winograd */
    check_conv_threads(16, 28, 28, 1, 32, 78); /* a first layer: im2col */
    check_conv_threads(37, 14, 14, 8, 16, 79); /* Winograd, another tile count */
    dt_rng r;
    dt_rng_seed(&r, 77);
    /* dense at a size dt_gemm splits */
    int B = 64, I = 500, O = 130;
    float *x = randn((size_t)B * I, &r, 1), *wd = randn((size_t)I * O, &r, 1), *go = randn((size_t)B * O, &r, 1);
    float *dx[2], *dwd[2], *y[2];
    for (int t = 0; t < 2; t++) {
        dt_cpu ctx;
        dt_cpu_init(&ctx, t + 1);
        ctx.par_always = 1;
        dx[t] = dt_alloc_floats((size_t)B * I, "t", NULL), dwd[t] = dt_alloc_floats((size_t)I * O, "t", NULL);
        y[t] = dt_alloc_floats((size_t)B * O, "t", NULL);
        dt_dense_forward(&ctx, y[t], x, wd, NULL, B, I, O);
        dt_dense_backward(&ctx, dx[t], dwd[t], NULL, go, x, wd, B, I, O);
    }
    CHECK(memcmp(y[0], y[1], (size_t)B * O * sizeof(float)) == 0);
    CHECK(memcmp(dx[0], dx[1], (size_t)B * I * sizeof(float)) == 0);
    CHECK(memcmp(dwd[0], dwd[1], (size_t)I * O * sizeof(float)) == 0);
    for (int t = 0; t < 2; t++) free(dx[t]), free(dwd[t]), free(y[t]);
    free(x), free(wd), free(go);
}

/* ---- max pooling --------------------------------------------------------------------------- */

/* -inf padding, scan order kh then kw, strictly greater wins (so the first max wins). */
static void ref_maxpool(double *out, int32_t *argmax, const float *in, int N, const dt_window *g) {
    for (int n = 0; n < N; n++)
        for (int oh = 0; oh < g->out_h; oh++)
            for (int ow = 0; ow < g->out_w; ow++)
                for (int c = 0; c < g->in_c; c++) {
                    double best = -INFINITY;
                    int32_t arg = -1;
                    for (int kh = 0; kh < g->k_h; kh++)
                        for (int kw = 0; kw < g->k_w; kw++) {
                            int ih = oh * g->stride_h - g->pad_top + kh;
                            int iw = ow * g->stride_w - g->pad_left + kw;
                            double v = -INFINITY;
                            int32_t idx = -1;
                            if (ih >= 0 && ih < g->in_h && iw >= 0 && iw < g->in_w) {
                                idx = (ih * g->in_w + iw) * g->in_c + c;
                                v = in[(size_t)n * g->in_h * g->in_w * g->in_c + idx];
                            }
                            if (arg < 0 ? idx >= 0 : v > best) best = v, arg = idx;
                        }
                    size_t o = (((size_t)n * g->out_h + oh) * g->out_w + ow) * g->in_c + c;
                    out[o] = best;
                    argmax[o] = arg;
                }
}

typedef struct {
    int N, H, W, C, KH, KW, SH, SW;
    dt_padding pad;
} pool_case;

static void check_maxpool(pool_case pc, uint64_t seed) {
    dt_window g;
    dt_error err = {0};
    if (dt_window_init(&g, pc.H, pc.W, pc.C, pc.C, pc.KH, pc.KW, pc.SH, pc.SW, pc.pad, &err) != 0) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    char name[128];
    snprintf(name, sizeof name, "pool N%d %dx%dx%d k%dx%d s%dx%d %s", pc.N, pc.H, pc.W, pc.C, pc.KH,
             pc.KW, pc.SH, pc.SW, pc.pad == DT_PAD_SAME ? "SAME" : "VALID");
    size_t nin = (size_t)pc.N * pc.H * pc.W * pc.C, nout = (size_t)pc.N * g.out_h * g.out_w * pc.C;
    /* Distinct values 0.1 apart (a shuffled ramp, all negative so a zero pad would be visible):
     * the max is unique and stays so under the finite-difference step. */
    uint32_t *perm = malloc(nin * sizeof(uint32_t));
    for (uint32_t i = 0; i < nin; i++) perm[i] = i;
    dt_shuffle_u32(perm, (uint32_t)nin, seed);
    float *in = dt_alloc_floats(nin, "t", NULL);
    for (size_t i = 0; i < nin; i++) in[i] = -1.0f - 0.1f * (float)perm[i];
    dt_rng r;
    dt_rng_seed(&r, seed);
    float *R = randn(nout, &r, 1.0f), *out = dt_alloc_floats(nout, "t", NULL);
    float *din = dt_alloc_floats(nin, "t", NULL);
    int32_t *am = malloc(nout * sizeof(int32_t)), *ram = malloc(nout * sizeof(int32_t));
    double *rout = malloc(nout * sizeof(double)), *rdin = calloc(nin, sizeof(double));

    ref_maxpool(rout, ram, in, pc.N, &g);
    dt_maxpool_forward(&cpu, out, am, in, pc.N, &g);
    CHECK_MSG(max_rel_err(out, rout, nout) == 0.0, "%s forward", name);
    CHECK_MSG(memcmp(am, ram, nout * sizeof(int32_t)) == 0, "%s argmax", name);

    size_t img = (size_t)pc.H * pc.W * pc.C;
    for (size_t i = 0; i < nout; i++) rdin[(i / (nout / pc.N)) * img + ram[i]] += R[i];
    for (size_t i = 0; i < nin; i++) din[i] = NAN;
    dt_maxpool_backward(&cpu, din, R, am, pc.N, &g);
    CHECK_MSG(max_rel_err(din, rdin, nin) < 1e-6, "%s backward", name);

    const float eps = 1e-2f;
    double worst = 0.0;
    for (size_t i = 0; i < nin; i++) {
        float keep = in[i];
        in[i] = keep + eps;
        dt_maxpool_forward(&cpu, out, am, in, pc.N, &g);
        double lp = dot_fd(out, R, nout);
        in[i] = keep - eps;
        dt_maxpool_forward(&cpu, out, am, in, pc.N, &g);
        double lm = dot_fd(out, R, nout);
        in[i] = keep;
        double fd = (lp - lm) / (2.0 * eps), e = fabs(fd - din[i]) / (1.0 + fabs(fd));
        if (!(e <= worst)) worst = e;
    }
    CHECK_MSG(worst < 2e-3, "%s finite differences: worst %g", name, worst);
    free(perm), free(in), free(R), free(out), free(din), free(am), free(ram), free(rout), free(rdin);
}

static void test_maxpool_geometries(void) {
    pool_case cases[] = {
        {2, 4, 6, 3, 2, 2, 2, 2, DT_PAD_VALID},
        {2, 7, 7, 2, 2, 2, 2, 2, DT_PAD_SAME},  /* odd: padding on the bottom/right only */
        {1, 7, 5, 3, 3, 3, 2, 2, DT_PAD_SAME},  /* overlapping windows, pad both sides */
        {2, 5, 6, 2, 3, 3, 1, 1, DT_PAD_SAME},  /* stride 1: each input in up to 9 windows */
        {1, 7, 8, 1, 3, 2, 2, 3, DT_PAD_VALID}, /* odd VALID drops the last row */
        {1, 6, 6, 2, 2, 2, 3, 3, DT_PAD_VALID}, /* stride > kernel: some inputs in no window */
        {3, 9, 9, 33, 2, 2, 2, 2, DT_PAD_SAME}, /* C not a multiple of the SIMD width */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_maxpool(cases[i], 100 + i);
}

static void test_maxpool_ties_and_padding(void) {
    dt_window g;
    CHECK(dt_window_init(&g, 3, 3, 1, 1, 2, 2, 2, 2, DT_PAD_SAME, NULL) == 0);
    CHECK(g.out_h == 2 && g.pad_top == 0);
    /* All equal: the first cell of each window wins. Negative: padding must not win as zero. */
    float in[9], out[4], din[9], dout[4] = {1, 2, 3, 4};
    int32_t am[4];
    for (int i = 0; i < 9; i++) in[i] = -5.0f;
    dt_maxpool_forward(&cpu, out, am, in, 1, &g);
    CHECK(out[0] == -5.0f && out[1] == -5.0f && out[2] == -5.0f && out[3] == -5.0f);
    CHECK(am[0] == 0 && am[1] == 2 && am[2] == 6 && am[3] == 8);
    dt_maxpool_backward(&cpu, din, dout, am, 1, &g);
    CHECK(din[0] == 1 && din[2] == 2 && din[6] == 3 && din[8] == 4 && din[1] == 0 && din[4] == 0);
    /* -inf inputs still produce an index inside the window. */
    for (int i = 0; i < 9; i++) in[i] = -INFINITY;
    dt_maxpool_forward(&cpu, out, am, in, 1, &g);
    CHECK(isinf(out[3]) && out[3] < 0 && am[3] == 8);
    /* A later equal value does not take over; a later larger one does. */
    float t[9] = {1, 7, 0, 7, 2, 0, 9, 9, 9};
    dt_maxpool_forward(&cpu, out, am, t, 1, &g);
    CHECK(out[0] == 7 && am[0] == 1 && out[2] == 9 && am[2] == 6 && out[3] == 9 && am[3] == 8);
}

/* ---- fused conv + max pool ----------------------------------------------------------------- */

typedef struct {
    conv_case c;
    int pk, ps;
    dt_padding ppad;
} fused_case;

/* The fused kernels against conv2d_* followed by maxpool_* (both checked above). */
static void check_fused(fused_case fc, uint64_t seed) {
    conv_case cc = fc.c;
    dt_window g, pg;
    CHECK(dt_window_init(&g, cc.H, cc.W, cc.C, cc.OC, cc.KH, cc.KW, cc.SH, cc.SW, cc.pad, NULL) == 0);
    CHECK(dt_window_init(&pg, g.out_h, g.out_w, cc.OC, cc.OC, fc.pk, fc.pk, fc.ps, fc.ps, fc.ppad, NULL) == 0);
    char name[160];
    snprintf(name, sizeof name, "fused N%d %dx%dx%d->%d k%d s%d, pool %d/%d %s", cc.N, cc.H, cc.W, cc.C,
             cc.OC, cc.KH, cc.SH, fc.pk, fc.ps, fc.ppad == DT_PAD_SAME ? "SAME" : "VALID");
    CHECK_MSG(dt_conv2d_maxpool_fusable(&g, &pg), "%s not fusable", name);
    dt_rng r;
    dt_rng_seed(&r, seed);
    size_t nin = (size_t)cc.N * cc.H * cc.W * cc.C, nw = (size_t)cc.KH * cc.KW * cc.C * cc.OC;
    size_t nconv = (size_t)cc.N * g.out_h * g.out_w * cc.OC, npool = (size_t)cc.N * pg.out_h * pg.out_w * cc.OC;
    float *in = randn(nin, &r, 1), *w = randn(nw, &r, 0.5f), *b = randn(cc.OC, &r, 1), *dout = randn(npool, &r, 1);
    size_t sc = dt_conv2d_scratch_floats(&g, cc.N), fsc = dt_conv2d_maxpool_scratch_floats(&g, &pg, cc.N);
    float *scratch = dt_alloc_floats(sc, "t", NULL), *fscratch = dt_alloc_floats(fsc, "t", NULL);
    float *conv = dt_alloc_floats(nconv, "t", NULL), *dconv = dt_alloc_floats(nconv, "t", NULL);
    float *pool = dt_alloc_floats(npool, "t", NULL), *fpool = dt_alloc_floats(npool, "t", NULL);
    int32_t *am = malloc(npool * sizeof(int32_t)), *fam = malloc(npool * sizeof(int32_t));
    float *din = dt_alloc_floats(nin, "t", NULL), *fdin = dt_alloc_floats(nin, "t", NULL);
    float *dw = dt_alloc_floats(nw, "t", NULL), *fdw = dt_alloc_floats(nw, "t", NULL), *fdw2 = dt_alloc_floats(nw, "t", NULL);
    float *db = dt_alloc_floats(cc.OC, "t", NULL), *fdb = dt_alloc_floats(cc.OC, "t", NULL);

    dt_conv2d_forward(&cpu, conv, in, w, b, cc.N, &g, scratch);
    dt_maxpool_forward(&cpu, pool, am, conv, cc.N, &pg);
    for (size_t i = 0; i < npool; i++) fpool[i] = NAN;
    dt_conv2d_maxpool_forward(&cpu, fpool, fam, in, w, b, cc.N, &g, &pg, fscratch);
    double worst = 0;
    for (size_t i = 0; i < npool; i++) {
        double e = fabs((double)fpool[i] - pool[i]) / (1 + fabs(pool[i]));
        if (!(e <= worst)) worst = e;
    }
    CHECK_MSG(worst < 1e-5, "%s forward %g", name, worst);
    CHECK_MSG(memcmp(am, fam, npool * sizeof(int32_t)) == 0, "%s argmax", name);

    dt_maxpool_backward(&cpu, dconv, dout, am, cc.N, &pg);
    dt_conv2d_backward(&cpu, din, dw, db, dconv, in, w, cc.N, &g, scratch);
    for (size_t i = 0; i < nin; i++) fdin[i] = NAN;
    dt_conv2d_maxpool_backward(&cpu, fdin, fdw, fdb, dout, fam, in, w, cc.N, &g, &pg, fscratch);
    double tol = 1e-5 * (1.0 + sqrt((double)nconv / cc.OC / 100.0));
    double e_in = 0, e_w = 0, e_b = 0;
    for (size_t i = 0; i < nin; i++) e_in = fmax(e_in, fabs((double)fdin[i] - din[i]) / (1 + fabs(din[i])));
    for (size_t i = 0; i < nw; i++) e_w = fmax(e_w, fabs((double)fdw[i] - dw[i]) / (1 + fabs(dw[i])));
    for (int i = 0; i < cc.OC; i++) e_b = fmax(e_b, fabs((double)fdb[i] - db[i]) / (1 + fabs(db[i])));
    int finite = 1;
    for (size_t i = 0; i < nin; i++) finite &= isfinite(fdin[i]);
    CHECK_MSG(finite && e_in < tol && e_w < tol && e_b < tol, "%s backward: din %g dw %g db %g", name,
              e_in, e_w, e_b);
    dt_conv2d_maxpool_backward(&cpu, NULL, fdw2, NULL, dout, fam, in, w, cc.N, &g, &pg, fscratch);
    CHECK_MSG(memcmp(fdw, fdw2, nw * sizeof(float)) == 0, "%s din==NULL changes dw", name);
    free(in), free(w), free(b), free(dout), free(scratch), free(fscratch), free(conv), free(dconv);
    free(pool), free(fpool), free(am), free(fam), free(din), free(fdin), free(dw), free(fdw), free(fdw2);
    free(db), free(fdb);
}

static void test_conv_maxpool_fused(void) {
    fused_case cases[] = {
        {{2, 20, 20, 3, 8, 3, 3, 1, 1, DT_PAD_SAME}, 2, 2, DT_PAD_SAME},   /* cats-vs-dogs block */
        {{3, 7, 9, 1, 4, 3, 3, 1, 1, DT_PAD_SAME}, 2, 2, DT_PAD_SAME},     /* odd: pool pads bottom/right */
        {{2, 7, 7, 2, 5, 3, 3, 1, 1, DT_PAD_SAME}, 2, 2, DT_PAD_VALID},    /* last conv row unread */
        {{2, 11, 10, 3, 6, 3, 3, 1, 1, DT_PAD_VALID}, 2, 3, DT_PAD_VALID}, /* pool k < stride: gaps */
        {{2, 10, 9, 2, 4, 3, 3, 2, 2, DT_PAD_SAME}, 2, 2, DT_PAD_SAME},    /* strided conv */
        {{2, 6, 6, 4, 4, 1, 1, 1, 1, DT_PAD_VALID}, 2, 2, DT_PAD_VALID},   /* pointwise conv */
        {{2, 64, 70, 3, 32, 3, 3, 1, 1, DT_PAD_SAME}, 2, 2, DT_PAD_SAME},  /* several groups per image */
        {{2, 9, 9, 3, 4, 3, 3, 1, 1, DT_PAD_SAME}, 3, 3, DT_PAD_SAME},     /* pool pad on top too */
    };
    dt_cpu saved = cpu;
    for (int t = 1; t <= 2; t++) {
        dt_cpu_init(&cpu, t);
        cpu.par_always = 1;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_fused(cases[i], 300 + i);
    }
    cpu = saved;
    /* Not fusable: overlapping pool windows, a Winograd conv, a pool over something else. */
    dt_window g, pg;
    CHECK(dt_window_init(&g, 8, 8, 3, 4, 3, 3, 1, 1, DT_PAD_SAME, NULL) == 0);
    CHECK(dt_window_init(&pg, 8, 8, 4, 4, 3, 3, 2, 2, DT_PAD_SAME, NULL) == 0);
    CHECK(!dt_conv2d_maxpool_fusable(&g, &pg));
    CHECK(dt_window_init(&pg, 8, 8, 5, 5, 2, 2, 2, 2, DT_PAD_SAME, NULL) == 0);
    CHECK(!dt_conv2d_maxpool_fusable(&g, &pg));
    CHECK(dt_window_init(&g, 8, 8, 16, 16, 3, 3, 1, 1, DT_PAD_SAME, NULL) == 0);
    CHECK(dt_window_init(&pg, 8, 8, 16, 16, 2, 2, 2, 2, DT_PAD_SAME, NULL) == 0);
    CHECK(!dt_conv2d_maxpool_fusable(&g, &pg));
}

/* ---- element-wise -------------------------------------------------------------------------- */

static void test_relu(void) {
    dt_rng r;
    dt_rng_seed(&r, 3);
    size_t n = 100003; /* above the parallel threshold, odd */
    float *x = randn(n, &r, 1.0f), *y = dt_alloc_floats(n, "t", NULL), *g = randn(n, &r, 1.0f);
    float *dx = dt_alloc_floats(n, "t", NULL);
    dt_relu_forward(&cpu, y, x, n);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= y[i] == (x[i] > 0 ? x[i] : 0.0f);
    CHECK(ok);
    dt_relu_backward(&cpu, dx, g, y, n);
    ok = 1;
    for (size_t i = 0; i < n; i++) ok &= dx[i] == (x[i] > 0 ? g[i] : 0.0f);
    CHECK(ok);
    /* Finite differences away from the kink. */
    double worst = 0.0;
    for (size_t i = 0; i < 200; i++) {
        if (fabsf(x[i]) < 0.05f) continue;
        float a = x[i] + 1e-2f, b = x[i] - 1e-2f, ya, yb;
        dt_relu_forward(&cpu, &ya, &a, 1);
        dt_relu_forward(&cpu, &yb, &b, 1);
        double fd = g[i] * ((double)ya - yb) / 2e-2;
        if (fabs(fd - dx[i]) > worst) worst = fabs(fd - dx[i]);
    }
    CHECK(worst < 1e-4);
    /* In place. */
    dt_relu_forward(&cpu, x, x, n);
    CHECK(max_abs_diff_f(x, y, n) == 0.0);
    dt_relu_backward(&cpu, g, g, y, n);
    CHECK(max_abs_diff_f(g, dx, n) == 0.0);
    free(x), free(y), free(g), free(dx);
}

static void test_dropout(void) {
    dt_rng r;
    dt_rng_seed(&r, 4);
    size_t n = 200001;
    float rate = 0.3f;
    float *x = randn(n, &r, 1.0f), *y1 = dt_alloc_floats(n, "t", NULL), *y2 = dt_alloc_floats(n, "t", NULL);
    uint8_t *m1 = malloc(n), *m2 = malloc(n);
    dt_cpu saved = cpu;
    dt_cpu_init(&cpu, 1);
    dt_dropout_forward(&cpu, y1, m1, x, n, rate, 99);
    dt_cpu_init(&cpu, 2);
    cpu.par_always = 1;
    dt_dropout_forward(&cpu, y2, m2, x, n, rate, 99);
    cpu = saved;
    CHECK(memcmp(m1, m2, n) == 0 && memcmp(y1, y2, n * sizeof(float)) == 0);

    /* The mask is the documented function of (seed, i); keep rate and scale are right. */
    size_t kept = 0;
    int formula = 1, values = 1;
    for (size_t i = 0; i < n; i++) {
        double u = (double)(dt_hash64(99, i) >> 40) / 16777216.0;
        formula &= m1[i] == (u >= rate);
        kept += m1[i];
        values &= m1[i] ? fabs(y1[i] - x[i] / (1.0 - rate)) <= 1e-6 * (1 + fabs(x[i])) : y1[i] == 0.0f;
    }
    CHECK(formula);
    CHECK(values);
    double keep_rate = (double)kept / n;
    CHECK_MSG(fabs(keep_rate - 0.7) < 0.01, "keep rate %g", keep_rate);
    /* Expected value is preserved: mean(y) ~ mean(x) for x = 1. */
    for (size_t i = 0; i < n; i++) x[i] = 1.0f;
    dt_dropout_forward(&cpu, y1, m1, x, n, rate, 7);
    double mean = 0.0;
    for (size_t i = 0; i < n; i++) mean += y1[i];
    CHECK_NEAR(mean / n, 1.0, 0.02);
    /* Another seed, another mask. */
    dt_dropout_forward(&cpu, y2, m2, x, n, rate, 8);
    CHECK(memcmp(m1, m2, n) != 0);
    /* rate 0 keeps everything unchanged; rate 1 drops everything without dividing by zero. */
    dt_dropout_forward(&cpu, y2, m2, x, n, 0.0f, 7);
    CHECK(max_abs_diff_f(y2, x, n) == 0.0);
    dt_dropout_forward(&cpu, y2, m2, x, 1000, 1.0f, 7);
    int zeros = 1;
    for (size_t i = 0; i < 1000; i++) zeros &= y2[i] == 0.0f && m2[i] == 0;
    CHECK(zeros);
    /* Backward = adjoint of the forward for the same seed: finite differences of
     * sum(dropout(x) * g) on a short vector (the mask depends only on (seed, i)). */
    float *g = randn(n, &r, 1.0f), *dx = dt_alloc_floats(n, "t", NULL);
    dt_dropout_backward(&cpu, dx, g, m1, n, rate);
    {
        enum { S = 64 };
        float xs[S], ys[S], ds[S];
        uint8_t ms[S];
        for (int i = 0; i < S; i++) xs[i] = (float)dt_rng_normal(&r);
        dt_dropout_forward(&cpu, ys, ms, xs, S, rate, 11);
        dt_dropout_backward(&cpu, ds, g, ms, S, rate);
        double worst = 0.0;
        for (int i = 0; i < S; i++) {
            float keep = xs[i];
            xs[i] = keep + 1e-2f;
            dt_dropout_forward(&cpu, ys, ms, xs, S, rate, 11);
            double lp = dot_fd(ys, g, S);
            xs[i] = keep - 1e-2f;
            dt_dropout_forward(&cpu, ys, ms, xs, S, rate, 11);
            double lm = dot_fd(ys, g, S);
            xs[i] = keep;
            double fd = (lp - lm) / 2e-2;
            if (fabs(fd - ds[i]) > worst) worst = fabs(fd - ds[i]);
        }
        CHECK_MSG(worst < 1e-4, "dropout finite differences: worst %g", worst);
    }
    int back = 1;
    for (size_t i = 0; i < n; i++)
        back &= fabs(dx[i] - (m1[i] ? g[i] / (1.0 - rate) : 0.0)) <= 1e-6 * (1 + fabs(g[i]));
    CHECK(back);
    free(x), free(y1), free(y2), free(m1), free(m2), free(g), free(dx);
}

/* ---- dense --------------------------------------------------------------------------------- */

static void check_dense(int N, int I, int O, uint64_t seed) {
    dt_rng r;
    dt_rng_seed(&r, seed);
    float *x = randn((size_t)N * I, &r, 1.0f), *w = randn((size_t)I * O, &r, 0.3f);
    float *b = randn(O, &r, 1.0f), *R = randn((size_t)N * O, &r, 1.0f);
    float *y = dt_alloc_floats((size_t)N * O, "t", NULL), *dx = dt_alloc_floats((size_t)N * I, "t", NULL);
    float *dw = dt_alloc_floats((size_t)I * O, "t", NULL), *db = dt_alloc_floats(O, "t", NULL);
    float *dw2 = dt_alloc_floats((size_t)I * O, "t", NULL), *db2 = dt_alloc_floats(O, "t", NULL);
    double *ry = malloc(sizeof(double) * N * O), *rdx = malloc(sizeof(double) * N * I);
    double *rdw = malloc(sizeof(double) * I * O), *rdb = malloc(sizeof(double) * O);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++) {
            double acc = b[o];
            for (int i = 0; i < I; i++) acc += (double)x[n * I + i] * w[i * O + o];
            ry[n * O + o] = acc;
        }
    for (size_t i = 0; i < (size_t)N * O; i++) y[i] = NAN;
    dt_dense_forward(&cpu, y, x, w, b, N, I, O);
    CHECK_MSG(max_rel_err(y, ry, (size_t)N * O) < 1e-5, "dense %dx%d->%d forward", N, I, O);
    for (int o = 0; o < O; o++)
        for (int n = 0; n < N; n++) ry[n * O + o] -= b[o];
    dt_dense_forward(&cpu, y, x, w, NULL, N, I, O);
    CHECK_MSG(max_rel_err(y, ry, (size_t)N * O) < 1e-5, "dense forward without bias");

    for (int i = 0; i < I; i++)
        for (int o = 0; o < O; o++) {
            double acc = 0.0;
            for (int n = 0; n < N; n++) acc += (double)x[n * I + i] * R[n * O + o];
            rdw[i * O + o] = acc;
        }
    for (int o = 0; o < O; o++) {
        double acc = 0.0;
        for (int n = 0; n < N; n++) acc += R[n * O + o];
        rdb[o] = acc;
    }
    for (int n = 0; n < N; n++)
        for (int i = 0; i < I; i++) {
            double acc = 0.0;
            for (int o = 0; o < O; o++) acc += (double)R[n * O + o] * w[i * O + o];
            rdx[n * I + i] = acc;
        }
    for (size_t i = 0; i < (size_t)I * O; i++) dw[i] = NAN;
    for (int o = 0; o < O; o++) db[o] = NAN;
    dt_dense_backward(&cpu, dx, dw, db, R, x, w, N, I, O);
    CHECK_MSG(max_rel_err(dx, rdx, (size_t)N * I) < 1e-5, "dense dx");
    CHECK_MSG(max_rel_err(dw, rdw, (size_t)I * O) < 1e-5, "dense dw");
    CHECK_MSG(max_rel_err(db, rdb, O) < 1e-5, "dense db");
    dt_dense_backward(&cpu, NULL, dw2, db2, R, x, w, N, I, O);
    CHECK(max_abs_diff_f(dw, dw2, (size_t)I * O) == 0.0 && max_abs_diff_f(db, db2, O) == 0.0);

    if ((size_t)N * I * O < 20000) {
        const float eps = 1e-2f;
        float *params[3] = {x, w, b};
        const float *grads[3] = {dx, dw, db};
        size_t counts[3] = {(size_t)N * I, (size_t)I * O, (size_t)O};
        double worst = 0.0;
        for (int p = 0; p < 3; p++)
            for (size_t i = 0; i < counts[p]; i++) {
                float keep = params[p][i];
                params[p][i] = keep + eps;
                dt_dense_forward(&cpu, y, x, w, b, N, I, O);
                double lp = dot_fd(y, R, (size_t)N * O);
                params[p][i] = keep - eps;
                dt_dense_forward(&cpu, y, x, w, b, N, I, O);
                double lm = dot_fd(y, R, (size_t)N * O);
                params[p][i] = keep;
                double fd = (lp - lm) / (2.0 * eps), e = fabs(fd - grads[p][i]) / (1.0 + fabs(fd));
                if (!(e <= worst)) worst = e;
            }
        CHECK_MSG(worst < 2e-3, "dense %dx%d->%d finite differences: worst %g", N, I, O, worst);
    }
    free(x), free(w), free(b), free(R), free(y), free(dx), free(dw), free(db), free(dw2), free(db2);
    free(ry), free(rdx), free(rdw), free(rdb);
}

static void test_dense(void) {
    check_dense(3, 7, 5, 20);
    check_dense(1, 4, 2, 21);
    check_dense(16, 30, 10, 22);
    check_dense(64, 300, 128, 23); /* big enough for the threaded GEMM split */
    check_dense(40, 20, 130, 24);
}

/* ---- softmax cross-entropy ----------------------------------------------------------------- */

static double ref_xent(double *dlogits, const float *x, const int32_t *y, int N, int K, int *correct) {
    double loss = 0.0;
    *correct = 0;
    for (int n = 0; n < N; n++) {
        const float *row = x + n * K;
        int best = 0;
        for (int k = 1; k < K; k++)
            if (row[k] > row[best]) best = k;
        double mx = row[best], s = 0.0;
        for (int k = 0; k < K; k++) s += exp(row[k] - mx);
        loss += log(s) + mx - row[y[n]];
        *correct += best == y[n];
        for (int k = 0; k < K; k++) dlogits[n * K + k] = (exp(row[k] - mx) / s - (k == y[n])) / N;
    }
    return loss / N;
}

static void test_softmax_xent(void) {
    dt_rng r;
    dt_rng_seed(&r, 5);
    int N = 7, K = 5;
    float *x = randn((size_t)N * K, &r, 2.0f), *d = dt_alloc_floats((size_t)N * K, "t", NULL);
    int32_t y[7];
    for (int n = 0; n < N; n++) y[n] = (int32_t)dt_rng_below(&r, K);
    double rd[35];
    int correct = -1, rcorrect = -1;
    double rl = ref_xent(rd, x, y, N, K, &rcorrect);
    float l = dt_softmax_xent(d, x, y, N, K, &correct);
    CHECK_NEAR(l, rl, 1e-6 * (1 + rl));
    CHECK(correct == rcorrect);
    CHECK(max_rel_err(d, rd, (size_t)N * K) < 1e-6);
    /* dlogits == NULL: same loss and count. */
    correct = -1;
    CHECK(dt_softmax_xent(NULL, x, y, N, K, &correct) == l && correct == rcorrect);
    /* Finite differences of the returned loss. */
    double worst = 0.0;
    for (int i = 0; i < N * K; i++) {
        float keep = x[i];
        x[i] = keep + 1e-2f;
        double lp = dt_softmax_xent(NULL, x, y, N, K, NULL);
        x[i] = keep - 1e-2f;
        double lm = dt_softmax_xent(NULL, x, y, N, K, NULL);
        x[i] = keep;
        double fd = (lp - lm) / 2e-2;
        if (fabs(fd - d[i]) > worst) worst = fabs(fd - d[i]);
    }
    CHECK_MSG(worst < 2e-4, "softmax_xent finite differences: worst %g", worst);
    free(x), free(d);
}

static void test_softmax_xent_stability_and_count(void) {
    /* Huge logits: a naive exp overflows. Row 0: label on the max -> loss log(1+e^-2e4) = 0.
     * Row 1: label 1e4 below the max -> loss 1e4 (exactly, to float precision). Row 2: a tie;
     * the first max counts as the prediction. */
    float x[9] = {1e4f, -1e4f, 0.0f, 1e4f, 0.0f, -1e4f, 3.0f, 3.0f, 1.0f};
    int32_t y[3] = {0, 1, 1};
    float d[9];
    int correct = -1;
    float l = dt_softmax_xent(d, x, y, 3, 3, &correct);
    CHECK(isfinite(l));
    CHECK_NEAR(l, (0.0 + 1e4 + (log(2.0 + exp(-2.0)))) / 3.0, 1e-2);
    CHECK(correct == 1); /* row 0 right, row 1 wrong, row 2 predicts class 0 (first max) */
    int finite = 1;
    for (int i = 0; i < 9; i++) finite &= isfinite(d[i]);
    CHECK(finite);
    CHECK_NEAR(d[3], 1.0 / 3.0, 1e-6);  /* softmax 1 on the max, not the label */
    CHECK_NEAR(d[4], -1.0 / 3.0, 1e-6); /* the label gets softmax ~0 - 1 */
    /* Each row of dlogits sums to zero. */
    for (int n = 0; n < 3; n++) CHECK_NEAR(d[3 * n] + d[3 * n + 1] + d[3 * n + 2], 0.0, 1e-6);
    /* Label 0 on the tie row: now a hit. */
    y[2] = 0;
    dt_softmax_xent(NULL, x, y, 3, 3, &correct);
    CHECK(correct == 2);
    /* A label out of range poisons the loss instead of reading out of bounds. */
    y[1] = 3;
    CHECK(isnan(dt_softmax_xent(d, x, y, 3, 3, &correct)));
}

/* dt_softmax_forward against the double reference, on rows dt_softmax_xent's gradient also gives (its
 * dlogits plus the one-hot, times N, is the softmax); huge logits stay finite; dt_argmax_first takes the
 * first of a tie, and a NaN only in first place. */
static void test_softmax_forward_and_argmax(void) {
    dt_rng r;
    dt_rng_seed(&r, 9);
    int N = 6, K = 4;
    float *x = randn((size_t)N * K, &r, 3.0f), p[24], d[24];
    double ref[24];
    int32_t y[6] = {0};
    dt_softmax_forward(p, x, N, K);
    dt_softmax_xent(d, x, y, N, K, NULL);
    double worst = 0;
    for (int n = 0; n < N; n++) {
        double mx = x[n * K], s = 0, sum = 0;
        for (int k = 1; k < K; k++) mx = x[n * K + k] > mx ? x[n * K + k] : mx;
        for (int k = 0; k < K; k++) s += exp(x[n * K + k] - mx);
        for (int k = 0; k < K; k++) {
            ref[n * K + k] = exp(x[n * K + k] - mx) / s;
            sum += p[n * K + k];
            double from_xent = (d[n * K + k] + (k == 0 ? 1.0 / N : 0.0)) * N;
            if (fabs(from_xent - p[n * K + k]) > worst) worst = fabs(from_xent - p[n * K + k]);
        }
        CHECK_NEAR(sum, 1.0, 1e-6);
        int best = dt_argmax_first(x + n * K, K);
        for (int k = 0; k < K; k++) CHECK(x[n * K + k] <= x[n * K + best]);
        CHECK(p[n * K + best] >= p[n * K + (best + 1) % K]);
    }
    CHECK(max_rel_err(p, ref, (size_t)N * K) < 1e-6);
    CHECK_MSG(worst < 1e-6, "softmax_forward vs dt_softmax_xent's gradient: worst %g", worst);
    float big[3] = {1e4f, -1e4f, 1e4f}, pb[3];
    dt_softmax_forward(pb, big, 1, 3);
    CHECK_NEAR(pb[0], 0.5, 1e-7);
    CHECK_NEAR(pb[1], 0.0, 1e-7);
    CHECK(dt_argmax_first(big, 3) == 0);
    float nan_row[3] = {NAN, 1.0f, 2.0f};
    CHECK(dt_argmax_first(nan_row, 3) == 0); /* comparisons with NaN are false: it keeps first place */
    float nan_later[3] = {1.0f, NAN, 0.5f};
    CHECK(dt_argmax_first(nan_later, 3) == 0);
    free(x);
}

int main(void) {
    dt_cpu_init(&cpu, dt_cpu_default_threads());
    RUN(test_window_same_padding);
    RUN(test_window_valid_and_errors);
    RUN(test_threads);
    RUN(test_small_loops_stay_on_one_thread);
    RUN(test_busy_machine_stays_on_one_thread);
    RUN(test_own_threads_are_not_load);
    RUN(test_gemm);
    RUN(test_conv_small_geometries);
    RUN(test_conv_chunked);
    RUN(test_thread_count_independence);
    RUN(test_maxpool_geometries);
    RUN(test_maxpool_ties_and_padding);
    RUN(test_conv_maxpool_fused);
    RUN(test_relu);
    RUN(test_dropout);
    RUN(test_dense);
    RUN(test_softmax_xent);
    RUN(test_softmax_xent_stability_and_count);
    RUN(test_softmax_forward_and_argmax);
    return test_summary();
}
