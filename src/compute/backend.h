/* Where a net's kernels run. A backend is a table of the kernels.h functions a net calls, with the
 * same signatures, plus memory for its buffers: the CPU table (backend_cpu.c) points at kernels.h
 * itself; the CUDA one (kernels_cuda.cu, DTRAIN_CUDA builds) at device versions whose pointer
 * arguments are device memory (except dt_softmax_xent's labels: host memory, a few bytes).
 * A net chooses its backend once (dt_net_set_device) and calls through the table once per layer,
 * so the CPU path costs one indirect call per layer and step, nothing per element.
 *
 * A NULL entry is a kernel the backend does not have yet; dt_net_set_device refuses a model that
 * needs one, naming the layer. Device kernels report failures through dt_cuda_status (cuda.h):
 * they return void like the CPU ones, and CUDA reports most errors later anyway. */
#ifndef DT_COMPUTE_BACKEND_H
#define DT_COMPUTE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "compute/kernels.h"

typedef struct dt_backend {
    const char *name;   /* "cpu", "cuda" */
    int on_device;      /* buffers are device memory: the net copies parameters, inputs, logits */
    /* zeroed memory for n bytes (NULL with err set when it fails), and its release */
    void *(*alloc)(size_t bytes, const char *what, dt_error *err);
    void (*release)(void *p);
    /* dst = src (n bytes, both the backend's memory); dst = 0 */
    void (*copy)(void *dst, const void *src, size_t bytes);
    void (*zero)(void *dst, size_t bytes);

    size_t (*conv2d_scratch_floats)(const dt_window *g, int batch);
    void (*conv2d_forward)(float *out, const float *in, const float *w, const float *b, int batch,
                           const dt_window *g, float *scratch);
    void (*conv2d_backward)(float *din, float *dw, float *db, const float *dout, const float *in,
                            const float *w, int batch, const dt_window *g, float *scratch);
    void (*maxpool_forward)(float *out, int32_t *argmax, const float *in, int batch, const dt_window *g);
    void (*maxpool_backward)(float *din, const float *dout, const int32_t *argmax, int batch,
                             const dt_window *g);
    void (*avgpool_forward)(float *out, const float *in, int batch, const dt_window *g);
    void (*avgpool_backward)(float *din, const float *dout, int batch, const dt_window *g);
    void (*global_avgpool_forward)(float *out, const float *in, int batch, int hw, int C);
    void (*global_avgpool_backward)(float *din, const float *dout, int batch, int hw, int C);
    void (*relu_forward)(float *out, const float *in, size_t n);
    void (*relu_backward)(float *din, const float *dout, const float *out, size_t n);
    void (*leaky_relu_forward)(float *out, const float *in, size_t n, float alpha);
    void (*leaky_relu_backward)(float *din, const float *dout, const float *out, size_t n, float alpha);
    void (*sigmoid_forward)(float *out, const float *in, size_t n);
    void (*sigmoid_backward)(float *din, const float *dout, const float *out, size_t n);
    void (*tanh_forward)(float *out, const float *in, size_t n);
    void (*tanh_backward)(float *din, const float *dout, const float *out, size_t n);
    void (*dropout_forward)(float *out, uint8_t *mask, const float *in, size_t n, float rate, uint64_t seed);
    void (*dropout_backward)(float *din, const float *dout, const uint8_t *mask, size_t n, float rate);
    void (*dense_forward)(float *out, const float *in, const float *w, const float *b, int batch, int in_dim,
                          int out_dim);
    void (*dense_backward)(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                           int batch, int in_dim, int out_dim);
    float (*softmax_xent)(float *dlogits, const float *logits, const int32_t *labels, int batch, int classes,
                          int *correct);
    void (*add_forward)(float *out, const float *a, const float *b, size_t n, int relu);
    void (*concat_forward)(float *out, const float *in, size_t rows, int in_c, int out_c, int off);
    void (*concat_backward)(float *din, const float *dout, size_t rows, int in_c, int out_c, int off);
    /* batch norm: host-side statistics and folding in the net; NULL on a device backend for now */
    size_t (*batchnorm_work_doubles)(size_t rows, int C);
    void (*batchnorm_forward)(float *out, float *mean, float *var, float *inv_std, float *scale, float *shift,
                              const float *in, const float *gamma, const float *beta, size_t rows, int C,
                              float eps, int relu, double *work);
    void (*batchnorm_backward)(float *din, float *dgamma, float *dbeta, const float *dout, const float *in,
                               const float *mean, const float *inv_std, const float *gamma, const float *scale,
                               const float *shift, size_t rows, int C, double *work);
    void (*channel_affine_forward)(float *out, const float *in, const float *scale, const float *shift,
                                   size_t rows, int C, int relu);
    void (*channel_affine_add_forward)(float *out, const float *in, const float *scale, const float *shift,
                                       const float *b, size_t rows, int C, int relu);

    /* A device backend's copies between host memory and its own, its failures and its end (cuda.h
     * describes them for CUDA: dt_cuda_upload_params and the rest); NULL on the CPU. */
    void (*upload_params)(float *dev, const float *host, size_t n);
    void (*download_grads)(float *host, const float *dev, size_t n, int slot);
    void (*wait_slot)(int slot);
    void (*upload)(void *dev, const void *host, size_t bytes);
    void (*download)(void *host, const void *dev, size_t bytes);
    void (*sync)(void);
    int (*status)(dt_error *err);
    int (*pin)(void *p, size_t bytes);
    void (*unpin)(void *p);
    void (*close)(void); /* the net that used it is gone (dt_cuda_close) */
} dt_backend;

/* kernels.h on the host (OpenBLAS + OpenMP). */
extern const dt_backend dt_backend_cpu;

#endif
