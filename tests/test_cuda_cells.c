/* The CUDA backend's arithmetic on the CPU (src/compute/cuda_cells.h): the cells its kernels run per
 * element and the steps of its convolution and dense layers, over host loops and a plain
 * column-major sgemm standing in for cuBLAS, against the CPU kernels (themselves checked against
 * PyTorch). This runs in every build, GPU or not: what it cannot check is the launches, copies and
 * streams (test_fixtures_cuda and the test_gpu_* tests do, on a GPU). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compute/cuda_cells.h"
#include "compute/kernels.h"
#include "core/rng.h"
#include "test.h"

/* The CPU context the kernels here run on (its threads: OpenMP's default; some tests change it). */
static dt_cpu cpu;

/* ---- the host stand-ins of the device operations ---- */

static void h_im2col(void *ctx, float *col, const float *in, const dt_window *w, size_t p0, size_t R) {
    size_t n = R * w->k_h * w->k_w * w->in_c;
    for (size_t i = 0; i < n; i++) col[i] = im2col_cell(in, w, p0, i);
}

static void h_col2im(void *ctx, float *din, const float *dcol, const dt_window *w, size_t nb) {
    size_t n = nb * w->in_h * w->in_w * w->in_c;
    for (size_t i = 0; i < n; i++) din[i] = col2im_cell(dcol, w, i);
}

/* cublasSgemm's definition: C [m, n] column-major; with beta 0, C is not read (it may be garbage).
 * The leading dimensions must be what cuBLAS accepts, or it returns CUBLAS_STATUS_INVALID_VALUE. */
static void h_gemm(void *ctx, const dt_colmajor_gemm *g, float alpha, float beta, float *C) {
    CHECK_MSG(g->m > 0 && g->n > 0 && g->k > 0, "gemm %dx%dx%d", g->m, g->n, g->k);
    CHECK_MSG(g->lda >= (g->trans_a ? g->k : g->m) && g->ldb >= (g->trans_b ? g->n : g->k) && g->ldc >= g->m,
              "gemm leading dimensions cuBLAS refuses: lda %d ldb %d ldc %d for %c%c %dx%dx%d", g->lda, g->ldb,
              g->ldc, g->trans_a ? 'T' : 'N', g->trans_b ? 'T' : 'N', g->m, g->n, g->k);
    for (int j = 0; j < g->n; j++)
        for (int i = 0; i < g->m; i++) {
            double s = 0;
            for (int l = 0; l < g->k; l++) {
                double a = g->trans_a ? g->A[l + (size_t)i * g->lda] : g->A[i + (size_t)l * g->lda];
                double b = g->trans_b ? g->B[j + (size_t)l * g->ldb] : g->B[l + (size_t)j * g->ldb];
                s += a * b;
            }
            float *c = &C[i + (size_t)j * g->ldc];
            *c = (float)(alpha * s + (beta != 0.0f ? beta * *c : 0.0));
        }
}

static void h_column_sums(void *ctx, float *out, const float *m, size_t rows, int cols) {
    for (int c = 0; c < cols; c++) {
        double s = 0;
        for (size_t r = 0; r < rows; r++) s += m[r * cols + c];
        out[c] = (float)s;
    }
}

static void h_add_bias(void *ctx, float *out, const float *b, size_t rows, int cols) {
    for (size_t i = 0; i < rows * cols; i++) out[i] += b[i % cols];
}

static const dt_cuda_ops host_ops = {h_im2col, h_col2im, h_gemm, h_column_sums, h_add_bias};

/* ---- helpers ---- */

static float *randoms(size_t n, uint64_t seed) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    dt_rng r;
    dt_rng_seed(&r, seed);
    for (size_t i = 0; x && i < n; i++) x[i] = (float)(2.0 * dt_rng_uniform(&r) - 1.0);
    return x;
}

/* Garbage where an output is expected to be overwritten entirely. */
static float *poisoned(size_t n) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    for (size_t i = 0; x && i < n; i++) x[i] = NAN;
    return x;
}

/* |ours - ref| <= tol * max(|ref|, 1e-2 max|ref|) everywhere (test_fixtures.c's rule). */
static void check_close(const char *what, const float *ours, const float *ref, size_t n, double tol) {
    double mx = 0, worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)ours[i] - ref[i]) / fmax(fmax(fabs(ref[i]), 1e-2 * mx), 1e-30);
        if (!(e <= worst)) worst = e, at = i;
    }
    CHECK_MSG(worst <= tol, "%s: relative error %.3g at [%zu]: %.9g vs %.9g", what, worst, at, (double)ours[at],
              (double)ref[at]);
}

static dt_window window(int h, int w, int c, int oc, int kh, int kw, int sh, int sw, dt_padding pad) {
    dt_window g;
    dt_error err = {0};
    int rc = dt_window_init(&g, h, w, c, oc, kh, kw, sh, sw, pad, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    return g;
}

/* ---- convolution and dense: the steps ---- */

static void conv_case(const char *name, dt_window g, int batch) {
    size_t in_n = (size_t)batch * g.in_h * g.in_w * g.in_c, out_n = (size_t)batch * g.out_h * g.out_w * g.out_c;
    size_t w_n = (size_t)g.k_h * g.k_w * g.in_c * g.out_c, per = (size_t)g.out_h * g.out_w * g.k_h * g.k_w * g.in_c;
    float *in = randoms(in_n, 1), *wt = randoms(w_n, 2), *b = randoms(g.out_c, 3), *dout = randoms(out_n, 4);
    float *ref_out = malloc(out_n * sizeof(float)), *ref_din = malloc(in_n * sizeof(float));
    float *ref_dw = malloc(w_n * sizeof(float)), *ref_db = malloc(g.out_c * sizeof(float));
    float *cpu_scratch = malloc((dt_conv2d_scratch_floats(&g, batch) + 1) * sizeof(float));
    dt_conv2d_forward(&cpu, ref_out, in, wt, b, batch, &g, cpu_scratch);
    dt_conv2d_backward(&cpu, ref_din, ref_dw, ref_db, dout, in, wt, batch, &g, cpu_scratch);
    /* one example per chunk (dW summed over chunks), then the whole batch in one */
    size_t col_sizes[2] = {per, per * (size_t)batch};
    for (int k = 0; k < 2; k++) {
        size_t col = col_sizes[k];
        CHECK(conv_chunk(&g, batch, col) == (k ? (size_t)batch : 1));
        float *scratch = poisoned(conv_scratch_floats_for(&g, batch, col));
        float *out = poisoned(out_n), *din = poisoned(in_n), *dw = poisoned(w_n), *db = poisoned(g.out_c);
        char what[96];
        conv_forward_steps(&host_ops, NULL, out, in, wt, b, batch, &g, scratch, col);
        snprintf(what, sizeof what, "%s (%s) out", name, k ? "one chunk" : "chunks of one");
        check_close(what, out, ref_out, out_n, 1e-4);
        conv_backward_steps(&host_ops, NULL, din, dw, db, dout, in, wt, batch, &g, scratch, col);
        snprintf(what, sizeof what, "%s (%s) din", name, k ? "one chunk" : "chunks of one");
        check_close(what, din, ref_din, in_n, 1e-4);
        snprintf(what, sizeof what, "%s (%s) dw", name, k ? "one chunk" : "chunks of one");
        check_close(what, dw, ref_dw, w_n, 1e-4);
        snprintf(what, sizeof what, "%s (%s) db", name, k ? "one chunk" : "chunks of one");
        check_close(what, db, ref_db, g.out_c, 1e-4);
        free(scratch), free(out), free(din), free(dw), free(db);
    }
    free(in), free(wt), free(b), free(dout), free(ref_out), free(ref_din), free(ref_dw), free(ref_db), free(cpu_scratch);
}

static void test_conv(void) {
    conv_case("fashion conv1 3x3 same", window(28, 28, 1, 32, 3, 3, 1, 1, DT_PAD_SAME), 3);
    conv_case("fashion conv2 3x3 same (Winograd on the CPU)", window(14, 14, 32, 64, 3, 3, 1, 1, DT_PAD_SAME), 2);
    conv_case("stride 2 same, padding at the bottom/right", window(10, 10, 3, 8, 3, 3, 2, 2, DT_PAD_SAME), 3);
    conv_case("5x3 stride 2x1 valid", window(9, 7, 4, 5, 5, 3, 2, 1, DT_PAD_VALID), 2);
    conv_case("1x1", window(6, 6, 5, 7, 1, 1, 1, 1, DT_PAD_SAME), 2);
}

static void test_dense(void) {
    const int B = 5, I = 37, O = 11;
    float *in = randoms((size_t)B * I, 5), *w = randoms((size_t)I * O, 6), *b = randoms(O, 7), *dout = randoms((size_t)B * O, 8);
    float ref_out[5 * 11], ref_din[5 * 37], ref_dw[37 * 11], ref_db[11];
    float *out = poisoned((size_t)B * O), *din = poisoned((size_t)B * I), *dw = poisoned((size_t)I * O), *db = poisoned(O);
    dt_dense_forward(&cpu, ref_out, in, w, b, B, I, O);
    dt_dense_backward(&cpu, ref_din, ref_dw, ref_db, dout, in, w, B, I, O);
    dense_forward_steps(&host_ops, NULL, out, in, w, b, B, I, O);
    dense_backward_steps(&host_ops, NULL, din, dw, db, dout, in, w, B, I, O);
    check_close("dense out", out, ref_out, (size_t)B * O, 1e-5);
    check_close("dense din", din, ref_din, (size_t)B * I, 1e-5);
    check_close("dense dw", dw, ref_dw, (size_t)I * O, 1e-5);
    check_close("dense db", db, ref_db, O, 1e-5);
    free(in), free(w), free(b), free(dout), free(out), free(din), free(dw), free(db);
}

/* ---- pooling: the cells ---- */

static void pool_case(const char *name, dt_window g, int batch) {
    size_t in_n = (size_t)batch * g.in_h * g.in_w * g.in_c, out_n = (size_t)batch * g.out_h * g.out_w * g.in_c;
    float *in = randoms(in_n, 9), *dout = randoms(out_n, 10);
    for (size_t i = 0; i + 2 * g.in_c < in_n; i += 7) in[i + g.in_c] = in[i]; /* ties: the first must win */
    float *ref = malloc(out_n * sizeof(float)), *out = malloc(out_n * sizeof(float));
    float *ref_din = malloc(in_n * sizeof(float)), *din = malloc(in_n * sizeof(float));
    int32_t *ref_am = malloc(out_n * sizeof(int32_t)), *am = malloc(out_n * sizeof(int32_t));
    dt_maxpool_forward(&cpu, ref, ref_am, in, batch, &g);
    dt_maxpool_backward(&cpu, ref_din, dout, ref_am, batch, &g);
    for (size_t i = 0; i < out_n; i++) out[i] = maxpool_cell(in, &g, i, &am[i]);
    for (size_t i = 0; i < in_n; i++) din[i] = pool_backward_cell(dout, am, &g, i);
    /* the same comparisons and sums in the same order: equal bit for bit */
    CHECK_MSG(memcmp(out, ref, out_n * sizeof *out) == 0, "%s: max pool values", name);
    CHECK_MSG(memcmp(am, ref_am, out_n * sizeof *am) == 0, "%s: max pool argmax", name);
    CHECK_MSG(memcmp(din, ref_din, in_n * sizeof *din) == 0, "%s: max pool backward", name);
    dt_avgpool_forward(&cpu, ref, in, batch, &g);
    dt_avgpool_backward(&cpu, ref_din, dout, batch, &g);
    for (size_t i = 0; i < out_n; i++) out[i] = avgpool_cell(in, &g, i);
    for (size_t i = 0; i < in_n; i++) din[i] = pool_backward_cell(dout, NULL, &g, i);
    char what[96];
    snprintf(what, sizeof what, "%s: average pool", name);
    check_close(what, out, ref, out_n, 1e-6);
    snprintf(what, sizeof what, "%s: average pool backward", name);
    check_close(what, din, ref_din, in_n, 1e-6);
    free(in), free(dout), free(ref), free(out), free(ref_din), free(din), free(ref_am), free(am);
}

static void test_pool(void) {
    pool_case("fashion 2x2 stride 2 same", window(28, 28, 32, 32, 2, 2, 2, 2, DT_PAD_SAME), 2);
    pool_case("2x2 stride 2 same, odd input", window(5, 5, 10, 10, 2, 2, 2, 2, DT_PAD_SAME), 3);
    pool_case("3x3 stride 2 same", window(5, 5, 10, 10, 3, 3, 2, 2, DT_PAD_SAME), 2);
    pool_case("3x3 stride 2 valid", window(7, 7, 3, 3, 3, 3, 2, 2, DT_PAD_VALID), 2);
    pool_case("3x2 stride 1 valid", window(6, 5, 2, 2, 3, 2, 1, 1, DT_PAD_VALID), 2);
}

static void test_global_avgpool(void) {
    const int B = 3, HW = 10, C = 6;
    float *in = randoms((size_t)B * HW * C, 11), ref[3 * 6], out[3 * 6];
    dt_global_avgpool_forward(&cpu, ref, in, B, HW, C);
    for (size_t i = 0; i < (size_t)B * C; i++) out[i] = global_avgpool_cell(in, HW, C, i);
    CHECK(memcmp(out, ref, sizeof out) == 0);
    free(in);
}

/* ---- the loss and the dropout hash ---- */

static void test_xent(void) {
    const int B = 6, K = 5;
    float *logits = randoms((size_t)B * K, 12), ref_d[6 * 5], d[6 * 5];
    for (int k = 0; k < K; k++) logits[K + k] = 0.25f; /* a row of ties: the first wins */
    int32_t labels[6] = {0, 0, 4, 2, 1, 3};
    int ref_hits = -1;
    float ref_loss = dt_softmax_xent(ref_d, logits, labels, B, K, &ref_hits);
    double sum = 0;
    int hits = 0;
    for (size_t n = 0; n < (size_t)B; n++) {
        double l;
        int h;
        xent_row(d, &l, &h, logits, labels, B, K, n);
        sum += l, hits += h;
    }
    /* summed in row order on the host, as kernels_cuda.cu does: the CPU's value bit for bit */
    CHECK((float)(sum / B) == ref_loss);
    CHECK(hits == ref_hits);
    CHECK(memcmp(d, ref_d, sizeof d) == 0);
    labels[2] = 9; /* outside [0, K): NaN, as the CPU */
    double l;
    int h;
    xent_row(NULL, &l, &h, logits, labels, B, K, 2);
    CHECK(isnan(l) && h == 0);
    free(logits);
}

static void test_hash(void) {
    int same = 1;
    for (uint64_t seed = 0; seed < 5; seed++)
        for (uint64_t i = 0; i < 1000; i++) same &= hash64_cell(seed * 0x9e3779b97f4a7c15ULL, i) == dt_hash64(seed * 0x9e3779b97f4a7c15ULL, i);
    CHECK(same);
}

int main(void) {
    dt_cpu_init(&cpu, dt_cpu_default_threads());
    RUN(test_conv);
    RUN(test_dense);
    RUN(test_pool);
    RUN(test_global_avgpool);
    RUN(test_xent);
    RUN(test_hash);
    return test_summary();
}
