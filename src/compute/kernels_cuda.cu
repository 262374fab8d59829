/* The CUDA backend (backend.h, cuda.h): the kernels.h functions over device memory, each op on a
 * context (a dt_cuda: one device, its streams, its cuBLAS handle, its first failure).
 * docs/gpu.md has the design; in short:
 *   - convolution is im2col + cuBLAS sgemm over chunks of whole examples (the CPU backend's method,
 *     which takes TensorFlow's SAME padding with its extra bottom/right cell and HWIO kernels as
 *     they are); backward scatters dcol back with a gather (each input cell sums the window
 *     positions that read it), so no atomics: results are deterministic;
 *   - dense layers are one sgemm each way; bias gradients are cuBLAS gemv against a vector of ones;
 *   - every other kernel is a grid-stride loop, one thread per output element.
 * The per-element work of the kernels and the sequence of the convolution and dense layers are in
 * cuda_cells.h, shared with tests/test_cuda_cells.c, which runs them on the CPU against the CPU
 * kernels; this file holds what only a GPU runs: launches, cuBLAS, memory, streams, failures.
 * Every CUDA and cuBLAS call is checked; the first failure is kept in the context with the call's
 * name (fail) and the backend's status returns it.
 * cuBLAS is opened with dlopen when a device is opened, not linked: a process that computes on the
 * CPU neither needs it installed nor pays for loading it (600 MB of libraries, 0.12 s per process).
 * The CUDA runtime is linked statically and opens the driver (libcuda.so.1) itself, on first use. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "compute/cuda.h"
#include "core/error.h"
}
#include "compute/cuda_cells.h"

#define MARKERS 64
/* im2col buffer of one convolution chunk: 32M floats (128 MiB), whole examples per chunk. */
#define CONV_COL_FLOATS ((size_t)32 << 20)

/* A context (cuda.h): one device and what computing on it needs. */
struct dt_cuda {
    int index, major, minor, tf32;
    int sync_each;        /* DTRAIN_CUDA_SYNC=1: wait after every kernel and cuBLAS call (debugging) */
    char name[256];
    size_t memory;
    cudaStream_t compute, copy;
    cublasHandle_t blas;
    cudaEvent_t slots[DT_CUDA_SLOTS], ordered, markers[MARKERS];
    float *ones;          /* [ones_n] of 1.0f: gemv against it sums columns */
    size_t ones_n;
    double *row_loss;     /* softmax_xent: per row loss, hit, label [rows_n] */
    int *row_hit;
    int32_t *labels;
    size_t rows_n;
    double *host_loss;    /* host copies of row_loss and row_hit */
    int *host_hit;
    pthread_mutex_t lock; /* guards failed and msg */
    int failed;           /* the first failure (fail) */
    char msg[sizeof(((dt_error *)0)->msg)];
};

/* ---- cuBLAS, opened at run time ---- */

static struct {
    void *lib;
    decltype(&cublasCreate) create;
    decltype(&cublasDestroy) destroy;
    decltype(&cublasSetStream) set_stream;
    decltype(&cublasSetMathMode) set_math_mode;
    decltype(&cublasSgemm) sgemm;
    decltype(&cublasSgemv) sgemv;
    decltype(&cublasGetStatusString) status_string;
} blas;

#define STR2(x) #x
#define STR(x) STR2(x)
#define CUBLAS_SONAME "libcublas.so." STR(CUBLAS_VER_MAJOR)

static pthread_mutex_t blas_lock = PTHREAD_MUTEX_INITIALIZER;

/* Loads cuBLAS once per process (never unloaded): by its soname (the loader's paths, LD_LIBRARY_PATH),
 * else from the toolkit the build used. Under blas_lock. */
static int load_cublas_locked(int index, dt_error *err) {
    if (blas.lib) return DT_OK;
    void *h = dlopen(CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
#ifdef DTRAIN_CUBLAS_DIR
    if (!h) h = dlopen(DTRAIN_CUBLAS_DIR "/" CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
#endif
    if (!h)
        return dt_errorf(err, DT_EINVAL, "--device cuda:%d: cannot load cuBLAS (" CUBLAS_SONAME "): %s", index,
                         dlerror());
    struct {
        void **fn;
        const char *name;
    } syms[] = {{(void **)&blas.create, "cublasCreate_v2"},       {(void **)&blas.destroy, "cublasDestroy_v2"},
                {(void **)&blas.set_stream, "cublasSetStream_v2"}, {(void **)&blas.set_math_mode, "cublasSetMathMode"},
                {(void **)&blas.sgemm, "cublasSgemm_v2"},         {(void **)&blas.sgemv, "cublasSgemv_v2"},
                {(void **)&blas.status_string, "cublasGetStatusString"}};
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
        if (!(*syms[i].fn = dlsym(h, syms[i].name))) {
            dlclose(h);
            return dt_errorf(err, DT_EINVAL, "--device cuda:%d: " CUBLAS_SONAME " has no %s", index, syms[i].name);
        }
    blas.lib = h;
    return DT_OK;
}

static int load_cublas(int index, dt_error *err) {
    pthread_mutex_lock(&blas_lock);
    int rc = load_cublas_locked(index, err);
    pthread_mutex_unlock(&blas_lock);
    return rc;
}

/* ---- failures -------------------------------------------------------------------------------- */

static void fail(dt_cuda *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(dt_cuda *c, const char *fmt, ...) {
    pthread_mutex_lock(&c->lock);
    if (!c->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->msg, sizeof c->msg, fmt, ap);
        va_end(ap);
        c->failed = 1;
    }
    pthread_mutex_unlock(&c->lock);
}

static int ck(dt_cuda *c, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 1;
    fail(c, "cuda:%d: %s failed: %s (%s)", c->index, what, cudaGetErrorString(e), cudaGetErrorName(e));
    return 0;
}

/* With DTRAIN_CUDA_SYNC=1, a fault inside a kernel or cuBLAS call is reported as that call's, not
 * as the next synchronisation's. */
static int synced(dt_cuda *c, const char *what) {
    return !c->sync_each || ck(c, cudaStreamSynchronize(c->compute), what);
}

static int ckb(dt_cuda *c, cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return synced(c, what);
    fail(c, "cuda:%d: %s failed: %s (cuBLAS status %d)", c->index, what, blas.status_string(s), (int)s);
    return 0;
}

/* After a kernel launch on context c: a bad configuration shows at once; faults inside show at the
 * next sync (at once with DTRAIN_CUDA_SYNC=1). */
#define LAUNCHED(name) (ck(c, cudaGetLastError(), "kernel " name) && synced(c, "kernel " name))

/* The runtime keeps the current device per thread; the net may run on any thread. */
static void use(dt_cuda *c) { ck(c, cudaSetDevice(c->index), "cudaSetDevice"); }

static int cu_status(void *ctx, dt_error *err) {
    dt_cuda *c = (dt_cuda *)ctx;
    use(c);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) ck(c, e, "an earlier asynchronous call");
    pthread_mutex_lock(&c->lock);
    int failed = c->failed;
    if (failed) dt_errorf(err, DT_EIO, "%s", c->msg);
    pthread_mutex_unlock(&c->lock);
    return failed ? DT_EIO : DT_OK;
}

/* ---- launch helpers ------------------------------------------------------------------------- */

#define THREADS 256
static unsigned blocks_for(size_t n) {
    size_t b = (n + THREADS - 1) / THREADS;
    if (b < 1) b = 1;
    return b > (1u << 20) ? (1u << 20) : (unsigned)b; /* grid-stride loops cover the rest */
}
#define LOOP(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)blockDim.x * gridDim.x)

/* cuda_cells.h's gemm op: the column-major product, as cuBLAS takes it. */
static void dev_gemm(void *ctx, const dt_colmajor_gemm *m, float alpha, float beta, float *C) {
    dt_cuda *c = (dt_cuda *)ctx;
    ckb(c, blas.sgemm(c->blas, m->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, m->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, m->m, m->n,
                   m->k, &alpha, m->A, m->lda, m->B, m->ldb, &beta, C, m->ldc),
        "cublasSgemm");
}

__global__ void k_fill(float *p, size_t n, float v) {
    LOOP(i, n) p[i] = v;
}

/* out [cols] = sum over rows of m [rows, cols] (row-major), by gemv against ones (fixed order). */
static void column_sums(void *ctx, float *out, const float *m, size_t rows, int cols) {
    dt_cuda *c = (dt_cuda *)ctx;
    if (rows > c->ones_n) {
        /* grows on the first steps only; freeing waits for the kernels that read the old one */
        ck(c, cudaStreamSynchronize(c->compute), "cudaStreamSynchronize (ones)");
        if (c->ones) ck(c, cudaFree(c->ones), "cudaFree (ones)");
        c->ones = NULL, c->ones_n = 0;
        if (!ck(c, cudaMalloc((void **)&c->ones, rows * sizeof(float)), "cudaMalloc (ones)")) return;
        c->ones_n = rows;
        k_fill<<<blocks_for(rows), THREADS, 0, c->compute>>>(c->ones, rows, 1.0f);
        if (!LAUNCHED("fill")) return;
    }
    if (rows > (size_t)INT32_MAX) {
        fail(c, "cuda:%d: column sums over %zu rows (more than 2^31)", c->index, rows);
        return;
    }
    const float one = 1.0f, zero = 0.0f;
    ckb(c, blas.sgemv(c->blas, CUBLAS_OP_N, cols, (int)rows, &one, m, cols, c->ones, 1, &zero, out, 1), "cublasSgemv");
}

__global__ void k_add_bias(float *out, const float *b, size_t rows, int C) {
    LOOP(i, rows * C) out[i] += b[i % C];
}

static void dev_add_bias(void *ctx, float *out, const float *b, size_t rows, int C) {
    dt_cuda *c = (dt_cuda *)ctx;
    k_add_bias<<<blocks_for(rows * C), THREADS, 0, c->compute>>>(out, b, rows, C);
    LAUNCHED("add_bias");
}

/* ---- memory --------------------------------------------------------------------------------- */

static void *cu_alloc(void *ctx, size_t bytes, const char *what, dt_error *err) {
    dt_cuda *c = (dt_cuda *)ctx;
    use(c);
    void *p = NULL;
    if (bytes == 0) bytes = 256;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* an out-of-memory is not sticky: the caller reports it */
        dt_errorf(err, DT_ENOMEM, "cuda:%d: cudaMalloc of %zu bytes for %s failed: %s", c->index, bytes, what,
                  cudaGetErrorString(e));
        return NULL;
    }
    /* cudaMemset is asynchronous on the legacy stream, which the two non-blocking streams do not
     * wait for: wait here (buffers are made once, when a net moves to the device). */
    if (!ck(c, cudaMemset(p, 0, bytes), "cudaMemset (new buffer)") ||
        !ck(c, cudaDeviceSynchronize(), "cudaDeviceSynchronize (new buffer)")) {
        cudaFree(p);
        dt_errorf(err, DT_EIO, "cuda:%d: clearing %zu bytes for %s failed", c->index, bytes, what);
        return NULL;
    }
    return p;
}

static void cu_release(void *ctx, void *p) {
    dt_cuda *c = (dt_cuda *)ctx;
    if (!p) return;
    use(c);
    ck(c, cudaFree(p), "cudaFree");
}

static void cu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    dt_cuda *c = (dt_cuda *)ctx;
    if (dst == src || !bytes) return;
    use(c);
    ck(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->compute), "cudaMemcpyAsync (device to device)");
}

static void cu_zero(void *ctx, void *dst, size_t bytes) {
    dt_cuda *c = (dt_cuda *)ctx;
    if (!bytes) return;
    use(c);
    ck(c, cudaMemsetAsync(dst, 0, bytes, c->compute), "cudaMemsetAsync");
}

/* ---- convolution ---------------------------------------------------------------------------- */

__global__ void k_im2col(float *col, const float *in, dt_window w, size_t p0, size_t R) {
    LOOP(i, R * w.k_h * w.k_w * w.in_c) col[i] = im2col_cell(in, &w, p0, i);
}

__global__ void k_col2im(float *din, const float *dcol, dt_window w, size_t nb) {
    LOOP(i, nb * w.in_h * w.in_w * w.in_c) din[i] = col2im_cell(dcol, &w, i);
}

static void dev_im2col(void *ctx, float *col, const float *in, const dt_window *w, size_t p0, size_t R) {
    dt_cuda *c = (dt_cuda *)ctx;
    k_im2col<<<blocks_for(R * w->k_h * w->k_w * w->in_c), THREADS, 0, c->compute>>>(col, in, *w, p0, R);
    LAUNCHED("im2col");
}

static void dev_col2im(void *ctx, float *din, const float *dcol, const dt_window *w, size_t nb) {
    dt_cuda *c = (dt_cuda *)ctx;
    k_col2im<<<blocks_for(nb * w->in_h * w->in_w * w->in_c), THREADS, 0, c->compute>>>(din, dcol, *w, nb);
    LAUNCHED("col2im");
}

/* The layers' steps (cuda_cells.h) over kernel launches and cuBLAS. */
static const dt_cuda_ops device_ops = {dev_im2col, dev_col2im, dev_gemm, column_sums, dev_add_bias};

static size_t cu_conv2d_scratch_floats(void *ctx, const dt_window *w, int batch) {
    return conv_scratch_floats_for(w, batch, CONV_COL_FLOATS);
}

static void cu_conv2d_forward(void *ctx, float *out, const float *in, const float *wt, const float *b, int batch,
                              const dt_window *w, float *scratch) {
    dt_cuda *c = (dt_cuda *)ctx;
    use(c);
    conv_forward_steps(&device_ops, c, out, in, wt, b, batch, w, scratch, CONV_COL_FLOATS);
}

static void cu_conv2d_backward(void *ctx, float *din, float *dw, float *db, const float *dout, const float *in,
                               const float *wt, int batch, const dt_window *w, float *scratch) {
    dt_cuda *c = (dt_cuda *)ctx;
    use(c);
    conv_backward_steps(&device_ops, c, din, dw, db, dout, in, wt, batch, w, scratch, CONV_COL_FLOATS);
}

/* ---- pooling ------------------------------------------------------------------------------- */

__global__ void k_maxpool_fwd(float *out, int32_t *argmax, const float *in, dt_window w, size_t total) {
    LOOP(i, total) out[i] = maxpool_cell(in, &w, i, &argmax[i]);
}

__global__ void k_avgpool_fwd(float *out, const float *in, dt_window w, size_t total) {
    LOOP(i, total) out[i] = avgpool_cell(in, &w, i);
}

/* argmax NULL: average pooling's */
__global__ void k_pool_bwd(float *din, const float *dout, const int32_t *argmax, dt_window w, size_t total) {
    LOOP(i, total) din[i] = pool_backward_cell(dout, argmax, &w, i);
}

__global__ void k_gap_fwd(float *out, const float *in, int batch, int hw, int C) {
    LOOP(i, (size_t)batch * C) out[i] = global_avgpool_cell(in, hw, C, i);
}

__global__ void k_gap_bwd(float *din, const float *dout, int batch, int hw, int C) {
    LOOP(i, (size_t)batch * hw * C) din[i] = dout[i / ((size_t)hw * C) * C + i % C] / (float)hw;
}

static void cu_maxpool_forward(void *ctx, float *out, int32_t *argmax, const float *in, int batch, const dt_window *w) {
    dt_cuda *c = (dt_cuda *)ctx;
    use(c);
    size_t total = (size_t)batch * w->out_h * w->out_w * w->in_c;
    k_maxpool_fwd<<<blocks_for(total), THREADS, 0, c->compute>>>(out, argmax, in, *w, total);
    LAUNCHED("maxpool_forward");
}

static void cu_maxpool_backward(void *ctx, float *din, const float *dout, const int32_t *argmax, int batch,
                                const dt_window *w) {
    dt_cuda *c = (dt_cuda *)ctx;
    use(c);
    size_t total = (size_t)batch * w->in_h * w->in_w * w->in_c;
    k_pool_bwd<<<blocks_for(total), THREADS, 0, c->compute>>>(din, dout, argmax, *w, total);
    LAUNCHED("maxpool_backward");
}

static void cu_avgpool_forward(void *ctx, float *out, const float *in, int batch, const dt_window *w) {
    dt_cuda *c = (dt_cuda *)ctx;
    use(c);
    size_t total = (size_t)batch * w->out_h * w->out_w * w->in_c;
    k_avgpool_fwd<<<blocks_for(total), THREADS, 0, c->compute>>>(out, in, *w, total);
    LAUNCHED("avgpool_forward");
}

static void cu_avgpool_backward(void *ctx, float *din, const float *dout, int batch, const dt_window *w) {
    dt_cuda *c = (dt_cuda *)ctx;
    use(c);
    size_t total = (size_t)batch * w->in_h * w->in_w * w->in_c;
    k_pool_bwd<<<blocks_for(total), THREADS, 0, c->compute>>>(din, dout, NULL, *w, total);
    LAUNCHED("avgpool_backward");
}

static void cu_global_avgpool_forward(void *ctx, float *out, const float *in, int batch, int hw, int C) {
    dt_cuda *c = (dt_cuda *)ctx;
    use(c);
    k_gap_fwd<<<blocks_for((size_t)batch * C), THREADS, 0, c->compute>>>(out, in, batch, hw, C);
    LAUNCHED("global_avgpool_forward");
}

static void cu_global_avgpool_backward(void *ctx, float *din, const float *dout, int batch, int hw, int C) {
    dt_cuda *c = (dt_cuda *)ctx;
    use(c);
    k_gap_bwd<<<blocks_for((size_t)batch * hw * C), THREADS, 0, c->compute>>>(din, dout, batch, hw, C);
    LAUNCHED("global_avgpool_backward");
}

/* ---- element-wise --------------------------------------------------------------------------- */

__global__ void k_relu_fwd(float *out, const float *in, size_t n) {
    LOOP(i, n) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
}
__global__ void k_relu_bwd(float *din, const float *dout, const float *out, size_t n) {
    LOOP(i, n) din[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}
__global__ void k_leaky_fwd(float *out, const float *in, size_t n, float alpha) {
    LOOP(i, n) out[i] = in[i] > 0.0f ? in[i] : alpha * in[i];
}
__global__ void k_leaky_bwd(float *din, const float *dout, const float *out, size_t n, float alpha) {
    LOOP(i, n) din[i] = out[i] > 0.0f ? dout[i] : alpha * dout[i];
}
__global__ void k_sigmoid_fwd(float *out, const float *in, size_t n) {
    LOOP(i, n) out[i] = 1.0f / (1.0f + expf(-in[i]));
}
__global__ void k_sigmoid_bwd(float *din, const float *dout, const float *out, size_t n) {
    LOOP(i, n) din[i] = dout[i] * out[i] * (1.0f - out[i]);
}
__global__ void k_tanh_fwd(float *out, const float *in, size_t n) {
    LOOP(i, n) out[i] = tanhf(in[i]);
}
__global__ void k_tanh_bwd(float *din, const float *dout, const float *out, size_t n) {
    LOOP(i, n) din[i] = dout[i] * (1.0f - out[i] * out[i]);
}

__global__ void k_dropout_fwd(float *out, uint8_t *mask, const float *in, size_t n, float rate, float scale,
                              uint64_t seed) {
    LOOP(i, n) {
        float u = (float)(hash64_cell(seed, i) >> 40) * (1.0f / 16777216.0f);
        int keep = rate < 1.0f && u >= rate;
        mask[i] = (uint8_t)keep;
        out[i] = in[i] * (keep ? scale : 0.0f);
    }
}
__global__ void k_dropout_bwd(float *din, const float *dout, const uint8_t *mask, size_t n, float scale) {
    LOOP(i, n) din[i] = dout[i] * (mask[i] ? scale : 0.0f);
}

__global__ void k_add(float *out, const float *a, const float *b, size_t n, int relu) {
    LOOP(i, n) {
        float v = a[i] + b[i];
        out[i] = relu && !(v > 0.0f) ? 0.0f : v;
    }
}

__global__ void k_concat_fwd(float *out, const float *in, size_t rows, int in_c, int out_c, int off) {
    LOOP(i, rows * in_c) out[i / in_c * out_c + off + i % in_c] = in[i];
}
__global__ void k_concat_bwd(float *din, const float *dout, size_t rows, int in_c, int out_c, int off) {
    LOOP(i, rows * in_c) din[i] = dout[i / in_c * out_c + off + i % in_c];
}

/* The body of an element-wise op on context ctx: one launch over n elements. */
#define ELEMENTWISE(name, kernel, n, ...)                                        \
    do {                                                                         \
        dt_cuda *c = (dt_cuda *)ctx;                                             \
        if ((n) == 0) return;                                                    \
        use(c);                                                                  \
        kernel<<<blocks_for(n), THREADS, 0, c->compute>>>(__VA_ARGS__);          \
        LAUNCHED(name);                                                          \
    } while (0)

static void cu_relu_forward(void *ctx, float *out, const float *in, size_t n) {
    ELEMENTWISE("relu_forward", k_relu_fwd, n, out, in, n);
}
static void cu_relu_backward(void *ctx, float *din, const float *dout, const float *out, size_t n) {
    ELEMENTWISE("relu_backward", k_relu_bwd, n, din, dout, out, n);
}
static void cu_leaky_relu_forward(void *ctx, float *out, const float *in, size_t n, float alpha) {
    ELEMENTWISE("leaky_relu_forward", k_leaky_fwd, n, out, in, n, alpha);
}
static void cu_leaky_relu_backward(void *ctx, float *din, const float *dout, const float *out, size_t n, float alpha) {
    ELEMENTWISE("leaky_relu_backward", k_leaky_bwd, n, din, dout, out, n, alpha);
}
static void cu_sigmoid_forward(void *ctx, float *out, const float *in, size_t n) {
    ELEMENTWISE("sigmoid_forward", k_sigmoid_fwd, n, out, in, n);
}
static void cu_sigmoid_backward(void *ctx, float *din, const float *dout, const float *out, size_t n) {
    ELEMENTWISE("sigmoid_backward", k_sigmoid_bwd, n, din, dout, out, n);
}
static void cu_tanh_forward(void *ctx, float *out, const float *in, size_t n) {
    ELEMENTWISE("tanh_forward", k_tanh_fwd, n, out, in, n);
}
static void cu_tanh_backward(void *ctx, float *din, const float *dout, const float *out, size_t n) {
    ELEMENTWISE("tanh_backward", k_tanh_bwd, n, din, dout, out, n);
}
static void cu_dropout_forward(void *ctx, float *out, uint8_t *mask, const float *in, size_t n, float rate,
                               uint64_t seed) {
    float scale = rate < 1.0f ? 1.0f / (1.0f - rate) : 0.0f;
    ELEMENTWISE("dropout_forward", k_dropout_fwd, n, out, mask, in, n, rate, scale, seed);
}
static void cu_dropout_backward(void *ctx, float *din, const float *dout, const uint8_t *mask, size_t n, float rate) {
    float scale = rate < 1.0f ? 1.0f / (1.0f - rate) : 0.0f;
    ELEMENTWISE("dropout_backward", k_dropout_bwd, n, din, dout, mask, n, scale);
}
static void cu_add_forward(void *ctx, float *out, const float *a, const float *b, size_t n, int relu) {
    ELEMENTWISE("add_forward", k_add, n, out, a, b, n, relu);
}
static void cu_concat_forward(void *ctx, float *out, const float *in, size_t rows, int in_c, int out_c, int off) {
    ELEMENTWISE("concat_forward", k_concat_fwd, rows * in_c, out, in, rows, in_c, out_c, off);
}
static void cu_concat_backward(void *ctx, float *din, const float *dout, size_t rows, int in_c, int out_c, int off) {
    ELEMENTWISE("concat_backward", k_concat_bwd, rows * in_c, din, dout, rows, in_c, out_c, off);
}

/* ---- dense ---------------------------------------------------------------------------------- */

static void cu_dense_forward(void *ctx, float *out, const float *in, const float *w, const float *b, int batch,
                             int in_dim, int out_dim) {
    dt_cuda *c = (dt_cuda *)ctx;
    use(c);
    dense_forward_steps(&device_ops, c, out, in, w, b, batch, in_dim, out_dim);
}

static void cu_dense_backward(void *ctx, float *din, float *dw, float *db, const float *dout, const float *in,
                              const float *w, int batch, int in_dim, int out_dim) {
    dt_cuda *c = (dt_cuda *)ctx;
    use(c);
    dense_backward_steps(&device_ops, c, din, dw, db, dout, in, w, batch, in_dim, out_dim);
}

/* ---- loss ----------------------------------------------------------------------------------- */

__global__ void k_xent(float *dlogits, double *row_loss, int *row_hit, const float *logits, const int32_t *labels,
                       int batch, int classes) {
    LOOP(n, (size_t)batch) xent_row(dlogits, &row_loss[n], &row_hit[n], logits, labels, batch, classes, n);
}

/* Labels are host memory. The per-row losses come back and are summed on the host in row order,
 * as the CPU sums them. */
static float cu_softmax_xent(void *ctx, float *dlogits, const float *logits, const int32_t *labels, int batch,
                             int classes, int *correct) {
    dt_cuda *c = (dt_cuda *)ctx;
    if (correct) *correct = 0;
    if (batch <= 0) return 0.0f;
    use(c);
    if ((size_t)batch > c->rows_n) {
        ck(c, cudaStreamSynchronize(c->compute), "cudaStreamSynchronize (loss buffers)");
        cudaFree(c->row_loss), cudaFree(c->row_hit), cudaFree(c->labels);
        free(c->host_loss), free(c->host_hit);
        c->row_loss = NULL, c->row_hit = NULL, c->labels = NULL, c->host_loss = NULL, c->host_hit = NULL, c->rows_n = 0;
        c->host_loss = (double *)malloc((size_t)batch * sizeof(double));
        c->host_hit = (int *)malloc((size_t)batch * sizeof(int));
        if (!c->host_loss || !c->host_hit) {
            fail(c, "cuda:%d: out of host memory for the loss of %d rows", c->index, batch);
            return NAN;
        }
        if (!ck(c, cudaMalloc((void **)&c->row_loss, (size_t)batch * sizeof(double)), "cudaMalloc (loss rows)") ||
            !ck(c, cudaMalloc((void **)&c->row_hit, (size_t)batch * sizeof(int)), "cudaMalloc (loss hits)") ||
            !ck(c, cudaMalloc((void **)&c->labels, (size_t)batch * sizeof(int32_t)), "cudaMalloc (labels)"))
            return NAN;
        c->rows_n = (size_t)batch;
    }
    if (!ck(c, cudaMemcpyAsync(c->labels, labels, (size_t)batch * sizeof(int32_t), cudaMemcpyHostToDevice, c->compute),
            "cudaMemcpyAsync (labels)"))
        return NAN;
    k_xent<<<blocks_for((size_t)batch), THREADS, 0, c->compute>>>(dlogits, c->row_loss, c->row_hit, logits, c->labels, batch,
                                                                 classes);
    if (!LAUNCHED("softmax_xent")) return NAN;
    if (!ck(c, cudaMemcpyAsync(c->host_loss, c->row_loss, (size_t)batch * sizeof(double), cudaMemcpyDeviceToHost, c->compute),
            "cudaMemcpyAsync (loss rows)") ||
        !ck(c, cudaMemcpyAsync(c->host_hit, c->row_hit, (size_t)batch * sizeof(int), cudaMemcpyDeviceToHost, c->compute),
            "cudaMemcpyAsync (loss hits)") ||
        !ck(c, cudaStreamSynchronize(c->compute), "cudaStreamSynchronize (loss)"))
        return NAN;
    double loss = 0.0;
    int hits = 0;
    for (int n = 0; n < batch; n++) loss += c->host_loss[n], hits += c->host_hit[n];
    if (correct) *correct = hits;
    return (float)(loss / batch);
}

/* ---- copies between the host and the device ------------------------------------------------ */

static int cu_pin(void *ctx, void *p, size_t bytes) {
    dt_cuda *c = (dt_cuda *)ctx;
    if (!p || !bytes) return -1;
    use(c);
    if (cudaHostRegister(p, bytes, cudaHostRegisterDefault) != cudaSuccess) {
        cudaGetLastError(); /* not sticky: the copies are merely synchronous */
        return -1;
    }
    return 0;
}

static void cu_unpin(void *ctx, void *p) {
    dt_cuda *c = (dt_cuda *)ctx;
    if (!p) return;
    use(c);
    cudaHostUnregister(p);
    cudaGetLastError(); /* it was never pinned: nothing to undo */
}

static void cu_upload_params(void *ctx, float *dev, const float *host, size_t n) {
    dt_cuda *c = (dt_cuda *)ctx;
    if (!n) return;
    use(c);
    /* Nothing still reads dev: forward and backward both end with the streams idle (cu_download,
     * cu_sync), so the uploads of all layers stream in while the first layers compute. */
    if (ck(c, cudaMemcpyAsync(dev, host, n * sizeof(float), cudaMemcpyHostToDevice, c->copy),
           "cudaMemcpyAsync (parameters)") &&
        ck(c, cudaEventRecord(c->ordered, c->copy), "cudaEventRecord (parameters)"))
        ck(c, cudaStreamWaitEvent(c->compute, c->ordered, 0), "cudaStreamWaitEvent (parameters)");
}

static void cu_download_grads(void *ctx, float *host, const float *dev, size_t n, int slot) {
    dt_cuda *c = (dt_cuda *)ctx;
    if (slot < 0 || slot >= DT_CUDA_SLOTS) {
        fail(c, "cuda:%d: copy slot %d out of range", c->index, slot);
        return;
    }
    use(c);
    if (ck(c, cudaEventRecord(c->ordered, c->compute), "cudaEventRecord (gradients)") &&
        ck(c, cudaStreamWaitEvent(c->copy, c->ordered, 0), "cudaStreamWaitEvent (gradients)") &&
        ck(c, cudaMemcpyAsync(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost, c->copy),
           "cudaMemcpyAsync (gradients)"))
        ck(c, cudaEventRecord(c->slots[slot], c->copy), "cudaEventRecord (gradient slot)");
}

static void cu_wait_slot(void *ctx, int slot) {
    dt_cuda *c = (dt_cuda *)ctx;
    if (slot < 0 || slot >= DT_CUDA_SLOTS) return;
    use(c);
    ck(c, cudaEventSynchronize(c->slots[slot]), "cudaEventSynchronize (gradients)");
}

static void cu_upload(void *ctx, void *dev, const void *host, size_t bytes) {
    dt_cuda *c = (dt_cuda *)ctx;
    if (!bytes) return;
    use(c);
    ck(c, cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, c->compute), "cudaMemcpyAsync (input batch)");
}

static void cu_download(void *ctx, void *host, const void *dev, size_t bytes) {
    dt_cuda *c = (dt_cuda *)ctx;
    use(c);
    if (bytes) ck(c, cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, c->compute), "cudaMemcpyAsync (logits)");
    ck(c, cudaStreamSynchronize(c->compute), "cudaStreamSynchronize (logits)");
}

static void cu_sync(void *ctx) {
    dt_cuda *c = (dt_cuda *)ctx;
    use(c);
    ck(c, cudaStreamSynchronize(c->compute), "cudaStreamSynchronize (compute)");
    ck(c, cudaStreamSynchronize(c->copy), "cudaStreamSynchronize (copy)");
}

/* ---- the tables ----------------------------------------------------------------------------- */

/* Every op but batch norm's: its statistics and folding are host code in model/net.c. */
static int cu_supports(void *ctx, dt_op op) {
    /* no kernels yet: batch norm, and the click-log models' layers and loss */
    return op >= 0 && op < DT_OP_COUNT && op != DT_OP_BATCHNORM && op != DT_OP_CHANNEL_AFFINE &&
           op != DT_OP_CHANNEL_AFFINE_ADD && op != DT_OP_EMBEDDING && op != DT_OP_FM && op != DT_OP_REDUCE_SUM &&
           op != DT_OP_SIGMOID_LOGLOSS;
}

static void cu_describe(void *ctx, char *buf, size_t len) {
    dt_cuda *c = (dt_cuda *)ctx;
    snprintf(buf, len, "%s (cuda:%d, sm_%d%d, %.1f GiB, %s)", c->name, c->index, c->major, c->minor,
             (double)c->memory / (1024.0 * 1024 * 1024), c->tf32 ? "TF32 matrix products" : "fp32");
}

static void cu_close(void *ctx) { dt_cuda_close((dt_cuda *)ctx); }

static dt_backend_ops make_ops(void) {
    dt_backend_ops k;
    memset(&k, 0, sizeof k);
    k.name = "cuda";
    k.supports = cu_supports;
    k.describe = cu_describe;
    k.status = cu_status;
    k.close = cu_close;
    k.conv2d_scratch_floats = cu_conv2d_scratch_floats;
    k.conv2d_forward = cu_conv2d_forward;
    k.conv2d_backward = cu_conv2d_backward;
    k.maxpool_forward = cu_maxpool_forward;
    k.maxpool_backward = cu_maxpool_backward;
    k.avgpool_forward = cu_avgpool_forward;
    k.avgpool_backward = cu_avgpool_backward;
    k.global_avgpool_forward = cu_global_avgpool_forward;
    k.global_avgpool_backward = cu_global_avgpool_backward;
    k.relu_forward = cu_relu_forward;
    k.relu_backward = cu_relu_backward;
    k.leaky_relu_forward = cu_leaky_relu_forward;
    k.leaky_relu_backward = cu_leaky_relu_backward;
    k.sigmoid_forward = cu_sigmoid_forward;
    k.sigmoid_backward = cu_sigmoid_backward;
    k.tanh_forward = cu_tanh_forward;
    k.tanh_backward = cu_tanh_backward;
    k.dropout_forward = cu_dropout_forward;
    k.dropout_backward = cu_dropout_backward;
    k.dense_forward = cu_dense_forward;
    k.dense_backward = cu_dense_backward;
    k.softmax_xent = cu_softmax_xent;
    k.add_forward = cu_add_forward;
    k.concat_forward = cu_concat_forward;
    k.concat_backward = cu_concat_backward;
    /* batch norm: not yet (cu_supports says so) */
    return k;
}
static const dt_backend_ops cuda_ops = make_ops();

static dt_buffer_ops make_buffers(void) {
    dt_buffer_ops b;
    memset(&b, 0, sizeof b);
    b.on_device = 1;
    b.alloc = cu_alloc;
    b.release = cu_release;
    b.copy = cu_copy;
    b.zero = cu_zero;
    b.upload_params = cu_upload_params;
    b.download_grads = cu_download_grads;
    b.wait_slot = cu_wait_slot;
    b.upload = cu_upload;
    b.download = cu_download;
    b.sync = cu_sync;
    b.pin = cu_pin;
    b.unpin = cu_unpin;
    return b;
}
static const dt_buffer_ops cuda_buffers = make_buffers();

/* ---- the context ---------------------------------------------------------------------------- */

extern "C" int dt_cuda_built(void) { return 1; }

extern "C" dt_backend dt_cuda_backend(dt_cuda *c) {
    dt_backend b = {&cuda_ops, &cuda_buffers, c};
    return b;
}

/* Releases what a context holds (any part may be missing: a failed open). */
static void teardown(dt_cuda *c) {
    for (int i = 0; i < DT_CUDA_SLOTS; i++)
        if (c->slots[i]) cudaEventDestroy(c->slots[i]);
    for (int i = 0; i < MARKERS; i++)
        if (c->markers[i]) cudaEventDestroy(c->markers[i]);
    if (c->ordered) cudaEventDestroy(c->ordered);
    if (c->blas) blas.destroy(c->blas);
    if (c->compute) cudaStreamDestroy(c->compute);
    if (c->copy) cudaStreamDestroy(c->copy);
    cudaFree(c->ones), cudaFree(c->row_loss), cudaFree(c->row_hit), cudaFree(c->labels);
    free(c->host_loss), free(c->host_hit);
    cudaGetLastError();
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* The device's properties checked, then made current (cuBLAS is loaded first: a machine without
 * a GPU still shows whether the library would load). */
static int open_device(int index, cudaDeviceProp *p, dt_error *err) {
    int n = 0, rc = load_cublas(index, err);
    if (rc) return rc;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        /* Without the driver library the runtime says "driver version is insufficient": say why. */
        void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
        if (drv) dlclose(drv);
        return dt_errorf(err, DT_EINVAL, "--device cuda:%d: no usable CUDA device: %s (%s)%s", index,
                         cudaGetErrorString(e), cudaGetErrorName(e),
                         drv ? "" : "; no CUDA driver here (libcuda.so.1 not found)");
    }
    if (index >= n)
        return dt_errorf(err, DT_EINVAL, "--device cuda:%d: no such CUDA device (%d visible)", index, n);
    if ((e = cudaGetDeviceProperties(p, index)) != cudaSuccess || (e = cudaSetDevice(index)) != cudaSuccess) {
        cudaGetLastError();
        return dt_errorf(err, DT_EINVAL, "--device cuda:%d: %s", index, cudaGetErrorString(e));
    }
    /* The build carries sm_90 code and compute_90 PTX (CMakeLists.txt): older GPUs cannot run it. */
    if (p->major < 9)
        return dt_errorf(err, DT_EINVAL,
                         "--device cuda:%d: %s is sm_%d%d; this build has code for sm_90 and newer only "
                         "(set CMAKE_CUDA_ARCHITECTURES to build for it)",
                         index, p->name, p->major, p->minor);
    return DT_OK;
}

/* c's streams, events and cuBLAS handle; the failing call's name in *what. */
static int make_streams(dt_cuda *c, const char **what, cudaError_t *e, cublasStatus_t *s) {
    *what = "cudaStreamCreate";
    if ((*e = cudaStreamCreateWithFlags(&c->compute, cudaStreamNonBlocking)) != cudaSuccess ||
        (*e = cudaStreamCreateWithFlags(&c->copy, cudaStreamNonBlocking)) != cudaSuccess)
        return -1;
    *what = "cudaEventCreate";
    if ((*e = cudaEventCreateWithFlags(&c->ordered, cudaEventDisableTiming)) != cudaSuccess) return -1;
    for (int i = 0; i < DT_CUDA_SLOTS; i++)
        if ((*e = cudaEventCreateWithFlags(&c->slots[i], cudaEventDisableTiming)) != cudaSuccess) return -1;
    for (int i = 0; i < MARKERS; i++)
        if ((*e = cudaEventCreate(&c->markers[i])) != cudaSuccess) return -1;
    *what = "cublasCreate";
    if ((*s = blas.create(&c->blas)) != CUBLAS_STATUS_SUCCESS) return -1;
    *what = "cublasSetStream";
    if ((*s = blas.set_stream(c->blas, c->compute)) != CUBLAS_STATUS_SUCCESS) return -1;
    /* Plain fp32 unless DTRAIN_CUDA_TF32=1 (faster, but about 1e-3 relative: the fixtures fail) */
    *what = "cublasSetMathMode";
    *s = blas.set_math_mode(c->blas, c->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
    return *s == CUBLAS_STATUS_SUCCESS ? 0 : -1;
}

extern "C" int dt_cuda_open(dt_cuda **out, int index, dt_error *err) {
    *out = NULL;
    cudaDeviceProp p;
    int rc = open_device(index, &p, err);
    if (rc) return rc;
    dt_cuda *c = (dt_cuda *)calloc(1, sizeof *c);
    if (!c) return dt_errorf(err, DT_ENOMEM, "--device cuda:%d: out of memory for its context", index);
    pthread_mutex_init(&c->lock, NULL);
    c->index = index, c->major = p.major, c->minor = p.minor, c->memory = p.totalGlobalMem;
    snprintf(c->name, sizeof c->name, "%s", p.name);
    const char *tf32 = getenv("DTRAIN_CUDA_TF32"), *sync_each = getenv("DTRAIN_CUDA_SYNC");
    c->tf32 = tf32 && !strcmp(tf32, "1");
    c->sync_each = sync_each && !strcmp(sync_each, "1");
    const char *what = "";
    cudaError_t e = cudaSuccess;
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    if (make_streams(c, &what, &e, &s) == 0) {
        *out = c;
        return DT_OK;
    }
    teardown(c);
    return dt_errorf(err, DT_EIO, "--device cuda:%d: %s failed: %s", index, what,
                     e != cudaSuccess ? cudaGetErrorString(e) : blas.status_string(s));
}

extern "C" void dt_cuda_close(dt_cuda *c) {
    if (!c) return;
    use(c);
    cudaStreamSynchronize(c->compute); /* its own work only: other contexts may share the device */
    cudaStreamSynchronize(c->copy);
    teardown(c);
}

extern "C" void dt_cuda_mark(dt_cuda *c, int marker) {
    if (marker < 0 || marker >= MARKERS) return;
    use(c);
    ck(c, cudaEventRecord(c->markers[marker], c->compute), "cudaEventRecord (marker)");
}

extern "C" float dt_cuda_elapsed_ms(dt_cuda *c, int from, int to) {
    if (from < 0 || to < 0 || from >= MARKERS || to >= MARKERS) return 0.0f;
    use(c);
    float ms = 0.0f;
    return ck(c, cudaEventElapsedTime(&ms, c->markers[from], c->markers[to]), "cudaEventElapsedTime") ? ms : 0.0f;
}
