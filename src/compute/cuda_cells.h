/* The CUDA backend's arithmetic, written once for the GPU and the host (C and CUDA C++ alike):
 *   - cells: the work of one output element of each hand-written kernel; kernels_cuda.cu's kernels
 *     are grid-stride loops calling them;
 *   - steps: the sequence of a convolution or dense layer (im2col, products, col2im, sums) over a
 *     table of primitive operations: kernels_cuda.cu passes kernel launches and cuBLAS, and
 *     tests/test_cuda_cells.c passes loops over the same cells and a plain column-major sgemm.
 * So the index arithmetic, the chunking and the row-major-to-cuBLAS argument mapping are tested on
 * any machine against the CPU kernels; what only a GPU can test is the launches, copies and streams.
 * Not part of the seam (kernels.h); see docs/gpu.md. */
#ifndef DT_COMPUTE_CUDA_CELLS_H
#define DT_COMPUTE_CUDA_CELLS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "compute/kernels.h"

#ifdef __CUDACC__
#define DT_CELL __host__ __device__ static inline
#else
#define DT_CELL static inline
#endif

/* ---- cells ---------------------------------------------------------------------------------- */

/* col[i] of col [R, KH*KW*C], the windows of output positions p0 .. p0 + R (p = (n*OH + oh)*OW + ow)
 * of in [N, H, W, C]; padding cells are 0. */
DT_CELL float im2col_cell(const float *in, const dt_window *w, size_t p0, size_t i) {
    const size_t kkc = (size_t)w->k_h * w->k_w * w->in_c, ohw = (size_t)w->out_h * w->out_w;
    size_t r = i / kkc, e = i % kkc, p = p0 + r;
    int c = (int)(e % w->in_c), kw = (int)(e / w->in_c % w->k_w), kh = (int)(e / ((size_t)w->in_c * w->k_w));
    size_t n = p / ohw, q = p % ohw;
    int oh = (int)(q / w->out_w), ow = (int)(q % w->out_w);
    int ih = oh * w->stride_h - w->pad_top + kh, iw = ow * w->stride_w - w->pad_left + kw;
    if (ih < 0 || ih >= w->in_h || iw < 0 || iw >= w->in_w) return 0.0f;
    return in[((n * w->in_h + ih) * w->in_w + iw) * w->in_c + c];
}

/* Output rows [*lo, *hi] whose windows (size k, stride s, padding p before) contain input row i. */
DT_CELL void windows_over(int i, int p, int k, int s, int n_out, int *lo, int *hi) {
    int t = i + p - k + 1;
    *lo = t <= 0 ? 0 : (t + s - 1) / s;
    *hi = (i + p) / s;
    if (*hi > n_out - 1) *hi = n_out - 1;
}

/* Input element i of [N, H, W, C] under a window: its example n, channel c, and the output rows
 * [oh0, oh1] and columns [ow0, ow1] whose windows contain it (a backward gathers over those). */
typedef struct {
    size_t n;
    int c, ih, iw, oh0, oh1, ow0, ow1;
} dt_in_cell;

DT_CELL dt_in_cell in_cell(const dt_window *w, size_t i) {
    const size_t img = (size_t)w->in_h * w->in_w * w->in_c, e = i % img;
    dt_in_cell q;
    q.n = i / img;
    q.c = (int)(e % w->in_c), q.iw = (int)(e / w->in_c % w->in_w), q.ih = (int)(e / ((size_t)w->in_c * w->in_w));
    windows_over(q.ih, w->pad_top, w->k_h, w->stride_h, w->out_h, &q.oh0, &q.oh1);
    windows_over(q.iw, w->pad_left, w->k_w, w->stride_w, w->out_w, &q.ow0, &q.ow1);
    return q;
}

/* din[i] of din [nb, H, W, C]: the adjoint of im2col over dcol [nb*OH*OW, KH*KW*C] (positions
 * counted from the chunk's first example): the entries of the windows that read cell i, in
 * (oh, ow) order. */
DT_CELL float col2im_cell(const float *dcol, const dt_window *w, size_t i) {
    const size_t kkc = (size_t)w->k_h * w->k_w * w->in_c;
    const dt_in_cell q = in_cell(w, i);
    float sum = 0.0f;
    for (int oh = q.oh0; oh <= q.oh1; oh++)
        for (int ow = q.ow0; ow <= q.ow1; ow++) {
            int kh = q.ih + w->pad_top - oh * w->stride_h, kw = q.iw + w->pad_left - ow * w->stride_w;
            sum += dcol[((q.n * w->out_h + oh) * w->out_w + ow) * kkc + ((size_t)kh * w->k_w + kw) * w->in_c + q.c];
        }
    return sum;
}

/* Output element i of a pooling [N, OH, OW, C]: its row, column and channel, and its example's input. */
DT_CELL const float *pool_cell(const float *in, const dt_window *w, size_t i, int *oh, int *ow, int *c) {
    *c = (int)(i % w->in_c);
    size_t t = i / w->in_c;
    *ow = (int)(t % w->out_w), *oh = (int)(t / w->out_w % w->out_h);
    return in + t / ((size_t)w->out_w * w->out_h) * ((size_t)w->in_h * w->in_w * w->in_c);
}

/* Max pooling as dt_maxpool_row (pool_cpu.c): the first in-image cell seeds the max, later ones win
 * if strictly larger or NaN; *argmax is the winner's index within the example. */
DT_CELL float maxpool_cell(const float *in, const dt_window *w, size_t i, int32_t *argmax) {
    int oh, ow, c;
    const float *x = pool_cell(in, w, i, &oh, &ow, &c);
    int ih0 = oh * w->stride_h - w->pad_top, iw0 = ow * w->stride_w - w->pad_left;
    int kh_lo = ih0 < 0 ? -ih0 : 0, kh_hi = ih0 + w->k_h > w->in_h ? w->in_h - ih0 : w->k_h;
    int kw_lo = iw0 < 0 ? -iw0 : 0, kw_hi = iw0 + w->k_w > w->in_w ? w->in_w - iw0 : w->k_w;
    int32_t best_i = ((ih0 + kh_lo) * w->in_w + iw0 + kw_lo) * w->in_c + c;
    float best = x[best_i];
    for (int kh = kh_lo; kh < kh_hi; kh++)
        for (int kw = kw_lo; kw < kw_hi; kw++) {
            int32_t idx = ((ih0 + kh) * w->in_w + iw0 + kw) * w->in_c + c;
            float v = x[idx];
            if (v > best || v != v) best = v, best_i = idx;
        }
    *argmax = best_i;
    return best;
}

/* The window of output (oh, ow) clipped to the image, as avg_window (pool_cpu.c). */
DT_CELL void avg_window(const dt_window *w, int oh, int ow, int *h0, int *h1, int *w0, int *w1) {
    int ih = oh * w->stride_h - w->pad_top, iw = ow * w->stride_w - w->pad_left;
    *h0 = ih < 0 ? 0 : ih;
    *h1 = ih + w->k_h > w->in_h ? w->in_h : ih + w->k_h;
    *w0 = iw < 0 ? 0 : iw;
    *w1 = iw + w->k_w > w->in_w ? w->in_w : iw + w->k_w;
}

/* Average pooling over the cells inside the image, summed in (h, w) order as the CPU does. */
DT_CELL float avgpool_cell(const float *in, const dt_window *w, size_t i) {
    int oh, ow, c, h0, h1, w0, w1;
    const float *x = pool_cell(in, w, i, &oh, &ow, &c);
    avg_window(w, oh, ow, &h0, &h1, &w0, &w1);
    float sum = 0.0f;
    for (int h = h0; h < h1; h++)
        for (int v = w0; v < w1; v++) sum += x[((size_t)h * w->in_w + v) * w->in_c + c];
    return sum * (1.0f / (float)((h1 - h0) * (w1 - w0)));
}

/* din[i] of a pooling's backward as a gather: over the windows containing input cell i, in output
 * order (as the CPU's scatter adds them), the gradient it earned: max pooling's (argmax given) when
 * the window's argmax is the cell, average pooling's (argmax NULL) times 1 / the window's cells. */
DT_CELL float pool_backward_cell(const float *dout, const int32_t *argmax, const dt_window *w, size_t i) {
    const dt_in_cell q = in_cell(w, i);
    const int32_t e = (int32_t)(i % ((size_t)w->in_h * w->in_w * w->in_c)); /* argmax's index within the example */
    float sum = 0.0f;
    for (int oh = q.oh0; oh <= q.oh1; oh++)
        for (int ow = q.ow0; ow <= q.ow1; ow++) {
            size_t o = ((q.n * w->out_h + oh) * w->out_w + ow) * w->in_c + q.c;
            if (argmax) {
                if (argmax[o] == e) sum += dout[o];
            } else {
                int h0, h1, w0, w1;
                avg_window(w, oh, ow, &h0, &h1, &w0, &w1);
                sum += dout[o] * (1.0f / (float)((h1 - h0) * (w1 - w0)));
            }
        }
    return sum;
}

/* out[i] of global average pooling [N, C] over in [N, HW, C]. */
DT_CELL float global_avgpool_cell(const float *in, int hw, int C, size_t i) {
    size_t n = i / C;
    int c = (int)(i % C);
    float sum = 0.0f;
    for (int p = 0; p < hw; p++) sum += in[(n * hw + p) * C + c];
    return sum / (float)hw;
}

/* dt_hash64 (core/rng.c): splitmix64 of seed ^ counter * constant, so dropout masks are the CPU's. */
DT_CELL uint64_t hash64_cell(uint64_t seed, uint64_t counter) {
    uint64_t z = (seed ^ (counter * 0xd1342543de82ef95ULL)) + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Row n of dt_softmax_xent (dense_cpu.c): log-sum-exp around the first max in double; *loss is NaN
 * for a label outside [0, classes); dlogits row written unless dlogits is NULL. */
DT_CELL void xent_row(float *dlogits, double *loss, int *hit, const float *logits, const int32_t *labels, int batch,
                      int classes, size_t n) {
    const float *x = logits + n * classes;
    int y = labels[n], best = 0;
    for (int k = 1; k < classes; k++)
        if (x[k] > x[best]) best = k;
    float mx = x[best];
    double sum = 0.0;
    for (int k = 0; k < classes; k++) sum += exp((double)x[k] - mx);
    int valid = y >= 0 && y < classes;
    *loss = valid ? log(sum) - ((double)x[y] - mx) : nan("");
    *hit = valid && best == y;
    if (dlogits) {
        float *d = dlogits + n * classes;
        double inv = 1.0 / (sum * batch);
        for (int k = 0; k < classes; k++) d[k] = (float)(exp((double)x[k] - mx) * inv - (k == y ? 1.0 / batch : 0.0));
    }
}

/* ---- steps ---------------------------------------------------------------------------------- */

/* A column-major C = alpha op(A) op(B) + beta C (cublasSgemm's arguments; op = transpose if set). */
typedef struct {
    int trans_a, trans_b, m, n, k;
    const float *A, *B;
    int lda, ldb, ldc;
} dt_colmajor_gemm;

/* The primitive operations of the steps below, over one kind of memory; each takes the context the
 * steps are given (a CUDA context: its device, stream and cuBLAS handle). */
typedef struct {
    void (*im2col)(void *ctx, float *col, const float *in, const dt_window *w, size_t p0, size_t R); /* [R, KKC] */
    void (*col2im)(void *ctx, float *din, const float *dcol, const dt_window *w, size_t nb); /* din [nb, H, W, C] */
    void (*gemm)(void *ctx, const dt_colmajor_gemm *g, float alpha, float beta, float *C);
    void (*column_sums)(void *ctx, float *out, const float *m, size_t rows, int cols); /* out [cols] = row sum */
    void (*add_bias)(void *ctx, float *out, const float *b, size_t rows, int cols);    /* out [rows, cols] += b */
} dt_cuda_ops;

/* Row-major C [M,N] = alpha op(A) op(B) + beta C, as dt_gemm: a row-major matrix is its transpose in
 * column-major, so this is C^T = op(B)^T op(A)^T, B first. */
static inline void gemm_rm(const dt_cuda_ops *ops, void *ctx, int ta, int tb, int M, int N, int K, float alpha,
                           const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    dt_colmajor_gemm g = {tb, ta, N, M, K, B, A, ldb, lda, ldc};
    ops->gemm(ctx, &g, alpha, beta, C);
}

/* Examples per im2col chunk: as many as fit col_floats, at least one. */
static inline size_t conv_chunk(const dt_window *w, int batch, size_t col_floats) {
    size_t per = (size_t)w->out_h * w->out_w * w->k_h * w->k_w * w->in_c;
    size_t nb = per ? col_floats / per : 1, most = (size_t)(batch > 0 ? batch : 1);
    return nb < 1 ? 1 : nb > most ? most : nb;
}

static inline size_t conv_scratch_floats_for(const dt_window *w, int batch, size_t col_floats) {
    return conv_chunk(w, batch, col_floats) * w->out_h * w->out_w * w->k_h * w->k_w * w->in_c;
}

/* out [N,OH,OW,OC] = conv(in, wt [KH*KW*C, OC]) + b: im2col and one product per chunk of examples. */
static inline void conv_forward_steps(const dt_cuda_ops *ops, void *ctx, float *out, const float *in,
                                      const float *wt, const float *b, int batch, const dt_window *w, float *scratch,
                                      size_t col_floats) {
    const int KKC = w->k_h * w->k_w * w->in_c, OC = w->out_c;
    const size_t ohw = (size_t)w->out_h * w->out_w, nb = conv_chunk(w, batch, col_floats);
    for (size_t n0 = 0; n0 < (size_t)batch; n0 += nb) {
        size_t cnt = n0 + nb < (size_t)batch ? nb : (size_t)batch - n0, R = cnt * ohw;
        ops->im2col(ctx, scratch, in, w, n0 * ohw, R);
        gemm_rm(ops, ctx, 0, 0, (int)R, OC, KKC, 1.0f, scratch, KKC, wt, OC, 0.0f, out + n0 * ohw * OC, OC);
    }
    if (b) ops->add_bias(ctx, out, b, (size_t)batch * ohw, OC);
}

/* dW (+)= col^T dout chunk by chunk (the first overwrites), dcol = dout W^T scattered back by
 * col2im into that chunk's examples of din, db = the column sums of dout. */
static inline void conv_backward_steps(const dt_cuda_ops *ops, void *ctx, float *din, float *dw, float *db,
                                       const float *dout, const float *in, const float *wt, int batch,
                                       const dt_window *w, float *scratch, size_t col_floats) {
    const int KKC = w->k_h * w->k_w * w->in_c, OC = w->out_c;
    const size_t ohw = (size_t)w->out_h * w->out_w, nb = conv_chunk(w, batch, col_floats);
    const size_t img = (size_t)w->in_h * w->in_w * w->in_c;
    for (size_t n0 = 0; n0 < (size_t)batch; n0 += nb) {
        size_t cnt = n0 + nb < (size_t)batch ? nb : (size_t)batch - n0, R = cnt * ohw;
        const float *dout_c = dout + n0 * ohw * OC;
        ops->im2col(ctx, scratch, in, w, n0 * ohw, R);
        gemm_rm(ops, ctx, 1, 0, KKC, OC, (int)R, 1.0f, scratch, KKC, dout_c, OC, n0 ? 1.0f : 0.0f, dw, OC);
        if (din) {
            gemm_rm(ops, ctx, 0, 1, (int)R, KKC, OC, 1.0f, dout_c, OC, wt, OC, 0.0f, scratch, KKC);
            ops->col2im(ctx, din + n0 * img, scratch, w, cnt);
        }
    }
    if (db) ops->column_sums(ctx, db, dout, (size_t)batch * ohw, OC);
}

/* out [N,O] = in [N,I] @ w [I,O] + b */
static inline void dense_forward_steps(const dt_cuda_ops *ops, void *ctx, float *out, const float *in,
                                       const float *w, const float *b, int batch, int in_dim, int out_dim) {
    gemm_rm(ops, ctx, 0, 0, batch, out_dim, in_dim, 1.0f, in, in_dim, w, out_dim, 0.0f, out, out_dim);
    if (b) ops->add_bias(ctx, out, b, (size_t)batch, out_dim);
}

/* dw = in^T dout, db = column sums of dout, din = dout w^T */
static inline void dense_backward_steps(const dt_cuda_ops *ops, void *ctx, float *din, float *dw, float *db,
                                        const float *dout, const float *in, const float *w, int batch, int in_dim,
                                        int out_dim) {
    gemm_rm(ops, ctx, 1, 0, in_dim, out_dim, batch, 1.0f, in, in_dim, dout, out_dim, 0.0f, dw, out_dim);
    if (db) ops->column_sums(ctx, db, dout, (size_t)batch, out_dim);
    if (din) gemm_rm(ops, ctx, 0, 1, batch, in_dim, out_dim, 1.0f, dout, out_dim, w, out_dim, 0.0f, din, in_dim);
}

#endif
