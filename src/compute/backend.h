/* Where a net's kernels run: a backend is {ops, buf, ctx}, as ggml's backend interface:
 *   - ops: the kernels a net calls (the kernels.h functions' shapes), whether it has an op
 *     (supports), its name, description, first failure and end;
 *   - buf: its memory and the copies between it and the host (a device's; the CPU's are plain);
 *   - ctx: its state, which every op and buffer call takes first: the CPU's thread count (dt_cpu,
 *     kernels.h), a CUDA device with its streams and cuBLAS handle (cuda.h). Nothing is
 *     process-wide, so two nets of one process may use two thread counts or two devices.
 * The CPU tables (backend_cpu.c) call the kernels.h functions; the CUDA ones (kernels_cuda.cu,
 * DTRAIN_CUDA builds) device versions whose pointer arguments are device memory (except
 * softmax_xent's labels: host memory, a few bytes). A net chooses its backend once
 * (dt_net_set_device) and calls through it once per step, so the CPU path costs one indirect call
 * per step and layer, nothing per element.
 *
 * A net asks supports() for every op its plan needs before it moves (and refuses the model naming
 * the layer); a slot may be NULL where supports says no. Device kernels report failures through
 * status: they return void like the CPU ones, and CUDA reports most errors later anyway. */
#ifndef DT_COMPUTE_BACKEND_H
#define DT_COMPUTE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "compute/kernels.h"

/* What a backend may have: one entry per kernel group (forward and backward). */
typedef enum {
    DT_OP_CONV2D,
    DT_OP_MAXPOOL,
    DT_OP_AVGPOOL,
    DT_OP_GLOBAL_AVGPOOL,
    DT_OP_RELU,
    DT_OP_LEAKY_RELU,
    DT_OP_SIGMOID,
    DT_OP_TANH,
    DT_OP_DROPOUT,
    DT_OP_DENSE,
    DT_OP_SOFTMAX_XENT,
    DT_OP_ADD,
    DT_OP_CONCAT,
    DT_OP_BATCHNORM,            /* batchnorm_forward, batchnorm_backward */
    DT_OP_CHANNEL_AFFINE,       /* channel_affine_forward (batch norm in evaluation) */
    DT_OP_CHANNEL_AFFINE_ADD,   /* channel_affine_add_forward (a norm applied by the sum it feeds) */
    DT_OP_EMBEDDING,            /* embedding_forward, embedding_backward (click-log models) */
    DT_OP_FM,                   /* fm_forward, fm_backward */
    DT_OP_REDUCE_SUM,           /* reduce_sum_forward, reduce_sum_backward */
    DT_OP_SIGMOID_LOGLOSS,      /* sigmoid_logloss: a binary model's loss (softmax_xent's counterpart) */
    DT_OP_COUNT
} dt_op;

typedef struct dt_backend_ops {
    const char *name; /* "cpu", "cuda" */
    int (*supports)(void *ctx, dt_op op);
    /* "cpu (4 threads)", "NVIDIA H200 (cuda:0, sm_90, 139.8 GiB, fp32)" */
    void (*describe)(void *ctx, char *buf, size_t len);
    /* The first failure of a kernel or copy since the context opened (0: none). */
    int (*status)(void *ctx, dt_error *err);
    /* The net that used the context is gone (a device context closes); NULL: nothing to do. */
    void (*close)(void *ctx);

    size_t (*conv2d_scratch_floats)(void *ctx, const dt_window *g, int batch);
    void (*conv2d_forward)(void *ctx, float *out, const float *in, const float *w, const float *b, int batch,
                           const dt_window *g, float *scratch);
    void (*conv2d_backward)(void *ctx, float *din, float *dw, float *db, const float *dout, const float *in,
                            const float *w, int batch, const dt_window *g, float *scratch);
    void (*maxpool_forward)(void *ctx, float *out, int32_t *argmax, const float *in, int batch, const dt_window *g);
    void (*maxpool_backward)(void *ctx, float *din, const float *dout, const int32_t *argmax, int batch,
                             const dt_window *g);
    void (*avgpool_forward)(void *ctx, float *out, const float *in, int batch, const dt_window *g);
    void (*avgpool_backward)(void *ctx, float *din, const float *dout, int batch, const dt_window *g);
    void (*global_avgpool_forward)(void *ctx, float *out, const float *in, int batch, int hw, int C);
    void (*global_avgpool_backward)(void *ctx, float *din, const float *dout, int batch, int hw, int C);
    void (*relu_forward)(void *ctx, float *out, const float *in, size_t n);
    void (*relu_backward)(void *ctx, float *din, const float *dout, const float *out, size_t n);
    void (*leaky_relu_forward)(void *ctx, float *out, const float *in, size_t n, float alpha);
    void (*leaky_relu_backward)(void *ctx, float *din, const float *dout, const float *out, size_t n, float alpha);
    void (*sigmoid_forward)(void *ctx, float *out, const float *in, size_t n);
    void (*sigmoid_backward)(void *ctx, float *din, const float *dout, const float *out, size_t n);
    void (*tanh_forward)(void *ctx, float *out, const float *in, size_t n);
    void (*tanh_backward)(void *ctx, float *din, const float *dout, const float *out, size_t n);
    void (*dropout_forward)(void *ctx, float *out, uint8_t *mask, const float *in, size_t n, float rate,
                            uint64_t seed);
    void (*dropout_backward)(void *ctx, float *din, const float *dout, const uint8_t *mask, size_t n, float rate);
    void (*dense_forward)(void *ctx, float *out, const float *in, const float *w, const float *b, int batch,
                          int in_dim, int out_dim);
    void (*dense_backward)(void *ctx, float *din, float *dw, float *db, const float *dout, const float *in,
                           const float *w, int batch, int in_dim, int out_dim);
    float (*softmax_xent)(void *ctx, float *dlogits, const float *logits, const int32_t *labels, int batch,
                          int classes, int *correct);
    void (*add_forward)(void *ctx, float *out, const float *a, const float *b, size_t n, int relu);
    void (*concat_forward)(void *ctx, float *out, const float *in, size_t rows, int in_c, int out_c, int off);
    void (*concat_backward)(void *ctx, float *din, const float *dout, size_t rows, int in_c, int out_c, int off);
    size_t (*batchnorm_work_doubles)(void *ctx, size_t rows, int C);
    void (*batchnorm_forward)(void *ctx, float *out, float *mean, float *var, float *inv_std, float *scale,
                              float *shift, const float *in, const float *gamma, const float *beta, size_t rows,
                              int C, float eps, int relu, double *work);
    void (*batchnorm_backward)(void *ctx, float *din, float *dgamma, float *dbeta, const float *dout,
                               const float *in, const float *mean, const float *inv_std, const float *gamma,
                               const float *scale, const float *shift, size_t rows, int C, double *work);
    void (*channel_affine_forward)(void *ctx, float *out, const float *in, const float *scale, const float *shift,
                                   size_t rows, int C, int relu);
    void (*channel_affine_add_forward)(void *ctx, float *out, const float *in, const float *scale,
                                       const float *shift, const float *b, size_t rows, int C, int relu);
    /* Click-log models (kernels.h). The embedding's bags and its gradient rows are host memory: its
     * step runs on the host (a backend whose buffers are on a device does not have it). */
    void (*embedding_forward)(void *ctx, float *out, const float *table, const dt_bags *b);
    size_t (*embedding_backward)(void *ctx, int64_t *uniq, float *grad, const float *dout, const dt_bags *b,
                                 uint64_t *scratch);
    void (*fm_forward)(void *ctx, float *out, const float *v, int batch, int F, int D);
    void (*fm_backward)(void *ctx, float *dv, const float *dout, const float *v, int batch, int F, int D);
    void (*reduce_sum_forward)(void *ctx, float *out, const float *in, int batch, int n);
    void (*reduce_sum_backward)(void *ctx, float *din, const float *dout, int batch, int n);
    float (*sigmoid_logloss)(void *ctx, float *dlogits, const float *logits, const float *labels, int batch,
                             int *correct);
} dt_backend_ops;

/* A backend's memory, and the copies between the host and it (ggml's buffer interface). */
typedef struct dt_buffer_ops {
    int on_device; /* its buffers are not host memory: the net copies parameters, inputs, logits */
    /* zeroed memory for n bytes (NULL with err set when it fails), and its release */
    void *(*alloc)(void *ctx, size_t bytes, const char *what, dt_error *err);
    void (*release)(void *ctx, void *p);
    /* dst = src (n bytes, both the backend's memory); dst = 0 */
    void (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
    void (*zero)(void *ctx, void *dst, size_t bytes);

    /* A device's copies (cuda.h describes them for CUDA); NULL on the CPU. */
    /* dev [n floats] = host, after the kernels enqueued so far have finished reading dev and before
     * any kernel enqueued afterwards runs (a layer's parameters). */
    void (*upload_params)(void *ctx, float *dev, const float *host, size_t n);
    /* host = dev after the kernels enqueued so far; slot (0 <= slot < the context's slots) marks its
     * end for wait_slot (a layer's gradient). */
    void (*download_grads)(void *ctx, float *host, const float *dev, size_t n, int slot);
    void (*wait_slot)(void *ctx, int slot);
    /* In order with the kernels: dev = host (an input batch); host = dev, waiting for it (logits). */
    void (*upload)(void *ctx, void *dev, const void *host, size_t bytes);
    void (*download)(void *ctx, void *host, const void *dev, size_t bytes);
    void (*sync)(void *ctx); /* waits for every copy and kernel */
    /* Pins host memory so that copies of it are asynchronous: 0 or -1 (the copies are then
     * synchronous); unpin before freeing it. */
    int (*pin)(void *ctx, void *p, size_t bytes);
    void (*unpin)(void *ctx, void *p);
} dt_buffer_ops;

typedef struct dt_backend {
    const dt_backend_ops *ops;
    const dt_buffer_ops *buf;
    void *ctx;
} dt_backend;

/* The CPU's tables (their ctx is a dt_cpu), for a backend built on them (a test's stand-in device). */
extern const dt_backend_ops dt_cpu_ops;
extern const dt_buffer_ops dt_cpu_buffers;

/* The CPU backend over cpu, which must outlive it. */
dt_backend dt_backend_cpu(dt_cpu *cpu);

#endif
