/* The CPU backend (backend.h): kernels.h over host memory, its context a dt_cpu (the threads). Each
 * op passes the context to its kernel; the tables below are the whole backend. */
#include "compute/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#define CPU(ctx) ((const dt_cpu *)(ctx))

static int cpu_supports(void *ctx, dt_op op) { return op >= 0 && op < DT_OP_COUNT; }

static void cpu_describe(void *ctx, char *buf, size_t len) {
    snprintf(buf, len, "cpu (%d thread%s)", CPU(ctx)->threads, CPU(ctx)->threads == 1 ? "" : "s");
}

static int cpu_status(void *ctx, dt_error *err) { return DT_OK; }

/* ---- kernels ---- */

static size_t conv2d_scratch_floats(void *c, const dt_window *g, int batch) {
    return dt_conv2d_scratch_floats(g, batch);
}
static void conv2d_forward(void *c, float *out, const float *in, const float *w, const float *b, int batch,
                           const dt_window *g, float *scratch) {
    dt_conv2d_forward(CPU(c), out, in, w, b, batch, g, scratch);
}
static void conv2d_backward(void *c, float *din, float *dw, float *db, const float *dout, const float *in,
                            const float *w, int batch, const dt_window *g, float *scratch) {
    dt_conv2d_backward(CPU(c), din, dw, db, dout, in, w, batch, g, scratch);
}
static void maxpool_forward(void *c, float *out, int32_t *argmax, const float *in, int batch, const dt_window *g) {
    dt_maxpool_forward(CPU(c), out, argmax, in, batch, g);
}
static void maxpool_backward(void *c, float *din, const float *dout, const int32_t *argmax, int batch,
                             const dt_window *g) {
    dt_maxpool_backward(CPU(c), din, dout, argmax, batch, g);
}
static void avgpool_forward(void *c, float *out, const float *in, int batch, const dt_window *g) {
    dt_avgpool_forward(CPU(c), out, in, batch, g);
}
static void avgpool_backward(void *c, float *din, const float *dout, int batch, const dt_window *g) {
    dt_avgpool_backward(CPU(c), din, dout, batch, g);
}
static void global_avgpool_forward(void *c, float *out, const float *in, int batch, int hw, int C) {
    dt_global_avgpool_forward(CPU(c), out, in, batch, hw, C);
}
static void global_avgpool_backward(void *c, float *din, const float *dout, int batch, int hw, int C) {
    dt_global_avgpool_backward(CPU(c), din, dout, batch, hw, C);
}
static void relu_forward(void *c, float *out, const float *in, size_t n) { dt_relu_forward(CPU(c), out, in, n); }
static void relu_backward(void *c, float *din, const float *dout, const float *out, size_t n) {
    dt_relu_backward(CPU(c), din, dout, out, n);
}
static void leaky_relu_forward(void *c, float *out, const float *in, size_t n, float alpha) {
    dt_leaky_relu_forward(CPU(c), out, in, n, alpha);
}
static void leaky_relu_backward(void *c, float *din, const float *dout, const float *out, size_t n, float alpha) {
    dt_leaky_relu_backward(CPU(c), din, dout, out, n, alpha);
}
static void sigmoid_forward(void *c, float *out, const float *in, size_t n) {
    dt_sigmoid_forward(CPU(c), out, in, n);
}
static void sigmoid_backward(void *c, float *din, const float *dout, const float *out, size_t n) {
    dt_sigmoid_backward(CPU(c), din, dout, out, n);
}
static void tanh_forward(void *c, float *out, const float *in, size_t n) { dt_tanh_forward(CPU(c), out, in, n); }
static void tanh_backward(void *c, float *din, const float *dout, const float *out, size_t n) {
    dt_tanh_backward(CPU(c), din, dout, out, n);
}
static void dropout_forward(void *c, float *out, uint8_t *mask, const float *in, size_t n, float rate,
                            uint64_t seed) {
    dt_dropout_forward(CPU(c), out, mask, in, n, rate, seed);
}
static void dropout_backward(void *c, float *din, const float *dout, const uint8_t *mask, size_t n, float rate) {
    dt_dropout_backward(CPU(c), din, dout, mask, n, rate);
}
static void dense_forward(void *c, float *out, const float *in, const float *w, const float *b, int batch,
                          int in_dim, int out_dim) {
    dt_dense_forward(CPU(c), out, in, w, b, batch, in_dim, out_dim);
}
static void dense_backward(void *c, float *din, float *dw, float *db, const float *dout, const float *in,
                           const float *w, int batch, int in_dim, int out_dim) {
    dt_dense_backward(CPU(c), din, dw, db, dout, in, w, batch, in_dim, out_dim);
}
static void embedding_forward(void *c, float *out, const float *table, const dt_bags *b) {
    dt_embedding_forward(CPU(c), out, table, b);
}
static size_t embedding_backward(void *c, int64_t *uniq, float *grad, const float *dout, const dt_bags *b,
                                 uint64_t *scratch) {
    return dt_embedding_backward(CPU(c), uniq, grad, dout, b, scratch);
}
static void fm_forward(void *c, float *out, const float *v, int batch, int F, int D) {
    dt_fm_forward(CPU(c), out, v, batch, F, D);
}
static void fm_backward(void *c, float *dv, const float *dout, const float *v, int batch, int F, int D) {
    dt_fm_backward(CPU(c), dv, dout, v, batch, F, D);
}
static void reduce_sum_forward(void *c, float *out, const float *in, int batch, int n) {
    dt_reduce_sum_forward(CPU(c), out, in, batch, n);
}
static void reduce_sum_backward(void *c, float *din, const float *dout, int batch, int n) {
    dt_reduce_sum_backward(CPU(c), din, dout, batch, n);
}
static float sigmoid_logloss(void *c, float *dlogits, const float *logits, const float *labels, int batch,
                             int *correct) {
    return dt_sigmoid_logloss(dlogits, logits, labels, batch, correct);
}
static float softmax_xent(void *c, float *dlogits, const float *logits, const int32_t *labels, int batch,
                          int classes, int *correct) {
    return dt_softmax_xent(dlogits, logits, labels, batch, classes, correct);
}
static void add_forward(void *c, float *out, const float *a, const float *b, size_t n, int relu) {
    dt_add_forward(CPU(c), out, a, b, n, relu);
}
static void concat_forward(void *c, float *out, const float *in, size_t rows, int in_c, int out_c, int off) {
    dt_concat_forward(CPU(c), out, in, rows, in_c, out_c, off);
}
static void concat_backward(void *c, float *din, const float *dout, size_t rows, int in_c, int out_c, int off) {
    dt_concat_backward(CPU(c), din, dout, rows, in_c, out_c, off);
}
static size_t batchnorm_work_doubles(void *c, size_t rows, int C) { return dt_batchnorm_work_doubles(rows, C); }
static void batchnorm_forward(void *c, float *out, float *mean, float *var, float *inv_std, float *scale,
                              float *shift, const float *in, const float *gamma, const float *beta, size_t rows,
                              int C, float eps, int relu, double *work) {
    dt_batchnorm_forward(CPU(c), out, mean, var, inv_std, scale, shift, in, gamma, beta, rows, C, eps, relu, work);
}
static void batchnorm_backward(void *c, float *din, float *dgamma, float *dbeta, const float *dout, const float *in,
                               const float *mean, const float *inv_std, const float *gamma, const float *scale,
                               const float *shift, size_t rows, int C, double *work) {
    dt_batchnorm_backward(CPU(c), din, dgamma, dbeta, dout, in, mean, inv_std, gamma, scale, shift, rows, C, work);
}
static void channel_affine_forward(void *c, float *out, const float *in, const float *scale, const float *shift,
                                   size_t rows, int C, int relu) {
    dt_channel_affine_forward(CPU(c), out, in, scale, shift, rows, C, relu);
}
static void channel_affine_add_forward(void *c, float *out, const float *in, const float *scale, const float *shift,
                                       const float *b, size_t rows, int C, int relu) {
    dt_channel_affine_add_forward(CPU(c), out, in, scale, shift, b, rows, C, relu);
}

/* ---- memory ---- */

static void *cpu_alloc(void *ctx, size_t bytes, const char *what, dt_error *err) {
    return dt_calloc(bytes ? bytes : 1, 1, what, err);
}
static void cpu_release(void *ctx, void *p) { free(p); }
static void cpu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    if (dst != src) memcpy(dst, src, bytes);
}
static void cpu_zero(void *ctx, void *dst, size_t bytes) { memset(dst, 0, bytes); }

/* ---- the tables ---- */

const dt_backend_ops dt_cpu_ops = {
    .name = "cpu",
    .supports = cpu_supports,
    .describe = cpu_describe,
    .status = cpu_status,
    .conv2d_scratch_floats = conv2d_scratch_floats,
    .conv2d_forward = conv2d_forward,
    .conv2d_backward = conv2d_backward,
    .maxpool_forward = maxpool_forward,
    .maxpool_backward = maxpool_backward,
    .avgpool_forward = avgpool_forward,
    .avgpool_backward = avgpool_backward,
    .global_avgpool_forward = global_avgpool_forward,
    .global_avgpool_backward = global_avgpool_backward,
    .relu_forward = relu_forward,
    .relu_backward = relu_backward,
    .leaky_relu_forward = leaky_relu_forward,
    .leaky_relu_backward = leaky_relu_backward,
    .sigmoid_forward = sigmoid_forward,
    .sigmoid_backward = sigmoid_backward,
    .tanh_forward = tanh_forward,
    .tanh_backward = tanh_backward,
    .dropout_forward = dropout_forward,
    .dropout_backward = dropout_backward,
    .dense_forward = dense_forward,
    .dense_backward = dense_backward,
    .softmax_xent = softmax_xent,
    .embedding_forward = embedding_forward,
    .embedding_backward = embedding_backward,
    .fm_forward = fm_forward,
    .fm_backward = fm_backward,
    .reduce_sum_forward = reduce_sum_forward,
    .reduce_sum_backward = reduce_sum_backward,
    .sigmoid_logloss = sigmoid_logloss,
    .add_forward = add_forward,
    .concat_forward = concat_forward,
    .concat_backward = concat_backward,
    .batchnorm_work_doubles = batchnorm_work_doubles,
    .batchnorm_forward = batchnorm_forward,
    .batchnorm_backward = batchnorm_backward,
    .channel_affine_forward = channel_affine_forward,
    .channel_affine_add_forward = channel_affine_add_forward,
};

const dt_buffer_ops dt_cpu_buffers = {
    .on_device = 0,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .copy = cpu_copy,
    .zero = cpu_zero,
};

dt_backend dt_backend_cpu(dt_cpu *cpu) { return (dt_backend){&dt_cpu_ops, &dt_cpu_buffers, cpu}; }
