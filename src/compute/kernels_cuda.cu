/* CUDA backend of the compute seam (backend.h, cuda.h): the kernels.h functions over device memory.
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
 * Every CUDA and cuBLAS call is checked; the first failure is kept with the call's name (fail) and
 * dt_cuda_status returns it.
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

static struct {
    int open_count, index, major, minor, tf32;
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
    int failed;           /* the first failure (fail), under g_lock */
    char msg[sizeof(((dt_error *)0)->msg)];
} g;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

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

/* Loads cuBLAS once per process (never unloaded): by its soname (the loader's paths, LD_LIBRARY_PATH),
 * else from the toolkit the build used. */
static int load_cublas(int index, dt_error *err) {
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

/* ---- failures -------------------------------------------------------------------------------- */

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
    pthread_mutex_lock(&g_lock);
    if (!g.failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g.msg, sizeof g.msg, fmt, ap);
        va_end(ap);
        g.failed = 1;
    }
    pthread_mutex_unlock(&g_lock);
}

static int ck(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 1;
    fail("cuda:%d: %s failed: %s (%s)", g.index, what, cudaGetErrorString(e), cudaGetErrorName(e));
    return 0;
}

/* With DTRAIN_CUDA_SYNC=1, a fault inside a kernel or cuBLAS call is reported as that call's, not
 * as the next synchronisation's. */
static int synced(const char *what) {
    return !g.sync_each || ck(cudaStreamSynchronize(g.compute), what);
}

static int ckb(cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return synced(what);
    fail("cuda:%d: %s failed: %s (cuBLAS status %d)", g.index, what, blas.status_string(s), (int)s);
    return 0;
}

/* After a kernel launch: a bad configuration shows at once; faults inside show at the next sync
 * (at once with DTRAIN_CUDA_SYNC=1). */
#define LAUNCHED(name) (ck(cudaGetLastError(), "kernel " name) && synced("kernel " name))

/* The runtime keeps the current device per thread; the net may run on any thread. */
static void use(void) { ck(cudaSetDevice(g.index), "cudaSetDevice"); }

extern "C" int dt_cuda_status(dt_error *err) {
    if (!g.open_count) return DT_OK;
    use();
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) ck(e, "an earlier asynchronous call");
    pthread_mutex_lock(&g_lock);
    int failed = g.failed;
    if (failed) dt_errorf(err, DT_EIO, "%s", g.msg);
    pthread_mutex_unlock(&g_lock);
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
static void dev_gemm(const dt_colmajor_gemm *m, float alpha, float beta, float *C) {
    ckb(blas.sgemm(g.blas, m->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, m->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, m->m, m->n,
                   m->k, &alpha, m->A, m->lda, m->B, m->ldb, &beta, C, m->ldc),
        "cublasSgemm");
}

__global__ void k_fill(float *p, size_t n, float v) {
    LOOP(i, n) p[i] = v;
}

/* out [cols] = sum over rows of m [rows, cols] (row-major), by gemv against ones (fixed order). */
static void column_sums(float *out, const float *m, size_t rows, int cols) {
    if (rows > g.ones_n) {
        /* grows on the first steps only; freeing waits for the kernels that read the old one */
        ck(cudaStreamSynchronize(g.compute), "cudaStreamSynchronize (ones)");
        if (g.ones) ck(cudaFree(g.ones), "cudaFree (ones)");
        g.ones = NULL, g.ones_n = 0;
        if (!ck(cudaMalloc((void **)&g.ones, rows * sizeof(float)), "cudaMalloc (ones)")) return;
        g.ones_n = rows;
        k_fill<<<blocks_for(rows), THREADS, 0, g.compute>>>(g.ones, rows, 1.0f);
        if (!LAUNCHED("fill")) return;
    }
    if (rows > (size_t)INT32_MAX) {
        fail("cuda:%d: column sums over %zu rows (more than 2^31)", g.index, rows);
        return;
    }
    const float one = 1.0f, zero = 0.0f;
    ckb(blas.sgemv(g.blas, CUBLAS_OP_N, cols, (int)rows, &one, m, cols, g.ones, 1, &zero, out, 1), "cublasSgemv");
}

__global__ void k_add_bias(float *out, const float *b, size_t rows, int C) {
    LOOP(i, rows * C) out[i] += b[i % C];
}

static void dev_add_bias(float *out, const float *b, size_t rows, int C) {
    k_add_bias<<<blocks_for(rows * C), THREADS, 0, g.compute>>>(out, b, rows, C);
    LAUNCHED("add_bias");
}

/* ---- memory --------------------------------------------------------------------------------- */

static void *cu_alloc(size_t bytes, const char *what, dt_error *err) {
    use();
    void *p = NULL;
    if (bytes == 0) bytes = 256;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* an out-of-memory is not sticky: the caller reports it */
        dt_errorf(err, DT_ENOMEM, "cuda:%d: cudaMalloc of %zu bytes for %s failed: %s", g.index, bytes, what,
                  cudaGetErrorString(e));
        return NULL;
    }
    /* cudaMemset is asynchronous on the legacy stream, which the two non-blocking streams do not
     * wait for: wait here (buffers are made once, when a net moves to the device). */
    if (!ck(cudaMemset(p, 0, bytes), "cudaMemset (new buffer)") ||
        !ck(cudaDeviceSynchronize(), "cudaDeviceSynchronize (new buffer)")) {
        cudaFree(p);
        dt_errorf(err, DT_EIO, "cuda:%d: clearing %zu bytes for %s failed", g.index, bytes, what);
        return NULL;
    }
    return p;
}

static void cu_release(void *p) {
    if (!p) return;
    use();
    ck(cudaFree(p), "cudaFree");
}

static void cu_copy(void *dst, const void *src, size_t bytes) {
    if (dst == src || !bytes) return;
    use();
    ck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g.compute), "cudaMemcpyAsync (device to device)");
}

static void cu_zero(void *dst, size_t bytes) {
    if (!bytes) return;
    use();
    ck(cudaMemsetAsync(dst, 0, bytes, g.compute), "cudaMemsetAsync");
}

/* ---- convolution ---------------------------------------------------------------------------- */

__global__ void k_im2col(float *col, const float *in, dt_window w, size_t p0, size_t R) {
    LOOP(i, R * w.k_h * w.k_w * w.in_c) col[i] = im2col_cell(in, &w, p0, i);
}

__global__ void k_col2im(float *din, const float *dcol, dt_window w, size_t nb) {
    LOOP(i, nb * w.in_h * w.in_w * w.in_c) din[i] = col2im_cell(dcol, &w, i);
}

static void dev_im2col(float *col, const float *in, const dt_window *w, size_t p0, size_t R) {
    k_im2col<<<blocks_for(R * w->k_h * w->k_w * w->in_c), THREADS, 0, g.compute>>>(col, in, *w, p0, R);
    LAUNCHED("im2col");
}

static void dev_col2im(float *din, const float *dcol, const dt_window *w, size_t nb) {
    k_col2im<<<blocks_for(nb * w->in_h * w->in_w * w->in_c), THREADS, 0, g.compute>>>(din, dcol, *w, nb);
    LAUNCHED("col2im");
}

/* The layers' steps (cuda_cells.h) over kernel launches and cuBLAS. */
static const dt_cuda_ops device_ops = {dev_im2col, dev_col2im, dev_gemm, column_sums, dev_add_bias};

static size_t cu_conv2d_scratch_floats(const dt_window *w, int batch) {
    return conv_scratch_floats_for(w, batch, CONV_COL_FLOATS);
}

static void cu_conv2d_forward(float *out, const float *in, const float *wt, const float *b, int batch,
                              const dt_window *w, float *scratch) {
    use();
    conv_forward_steps(&device_ops, out, in, wt, b, batch, w, scratch, CONV_COL_FLOATS);
}

static void cu_conv2d_backward(float *din, float *dw, float *db, const float *dout, const float *in,
                               const float *wt, int batch, const dt_window *w, float *scratch) {
    use();
    conv_backward_steps(&device_ops, din, dw, db, dout, in, wt, batch, w, scratch, CONV_COL_FLOATS);
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

static void cu_maxpool_forward(float *out, int32_t *argmax, const float *in, int batch, const dt_window *w) {
    use();
    size_t total = (size_t)batch * w->out_h * w->out_w * w->in_c;
    k_maxpool_fwd<<<blocks_for(total), THREADS, 0, g.compute>>>(out, argmax, in, *w, total);
    LAUNCHED("maxpool_forward");
}

static void cu_maxpool_backward(float *din, const float *dout, const int32_t *argmax, int batch, const dt_window *w) {
    use();
    size_t total = (size_t)batch * w->in_h * w->in_w * w->in_c;
    k_pool_bwd<<<blocks_for(total), THREADS, 0, g.compute>>>(din, dout, argmax, *w, total);
    LAUNCHED("maxpool_backward");
}

static void cu_avgpool_forward(float *out, const float *in, int batch, const dt_window *w) {
    use();
    size_t total = (size_t)batch * w->out_h * w->out_w * w->in_c;
    k_avgpool_fwd<<<blocks_for(total), THREADS, 0, g.compute>>>(out, in, *w, total);
    LAUNCHED("avgpool_forward");
}

static void cu_avgpool_backward(float *din, const float *dout, int batch, const dt_window *w) {
    use();
    size_t total = (size_t)batch * w->in_h * w->in_w * w->in_c;
    k_pool_bwd<<<blocks_for(total), THREADS, 0, g.compute>>>(din, dout, NULL, *w, total);
    LAUNCHED("avgpool_backward");
}

static void cu_global_avgpool_forward(float *out, const float *in, int batch, int hw, int C) {
    use();
    k_gap_fwd<<<blocks_for((size_t)batch * C), THREADS, 0, g.compute>>>(out, in, batch, hw, C);
    LAUNCHED("global_avgpool_forward");
}

static void cu_global_avgpool_backward(float *din, const float *dout, int batch, int hw, int C) {
    use();
    k_gap_bwd<<<blocks_for((size_t)batch * hw * C), THREADS, 0, g.compute>>>(din, dout, batch, hw, C);
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

#define ELEMENTWISE(name, kernel, n, ...)                                        \
    do {                                                                         \
        if ((n) == 0) return;                                                    \
        use();                                                                   \
        kernel<<<blocks_for(n), THREADS, 0, g.compute>>>(__VA_ARGS__);           \
        LAUNCHED(name);                                                          \
    } while (0)

static void cu_relu_forward(float *out, const float *in, size_t n) { ELEMENTWISE("relu_forward", k_relu_fwd, n, out, in, n); }
static void cu_relu_backward(float *din, const float *dout, const float *out, size_t n) {
    ELEMENTWISE("relu_backward", k_relu_bwd, n, din, dout, out, n);
}
static void cu_leaky_relu_forward(float *out, const float *in, size_t n, float alpha) {
    ELEMENTWISE("leaky_relu_forward", k_leaky_fwd, n, out, in, n, alpha);
}
static void cu_leaky_relu_backward(float *din, const float *dout, const float *out, size_t n, float alpha) {
    ELEMENTWISE("leaky_relu_backward", k_leaky_bwd, n, din, dout, out, n, alpha);
}
static void cu_sigmoid_forward(float *out, const float *in, size_t n) {
    ELEMENTWISE("sigmoid_forward", k_sigmoid_fwd, n, out, in, n);
}
static void cu_sigmoid_backward(float *din, const float *dout, const float *out, size_t n) {
    ELEMENTWISE("sigmoid_backward", k_sigmoid_bwd, n, din, dout, out, n);
}
static void cu_tanh_forward(float *out, const float *in, size_t n) { ELEMENTWISE("tanh_forward", k_tanh_fwd, n, out, in, n); }
static void cu_tanh_backward(float *din, const float *dout, const float *out, size_t n) {
    ELEMENTWISE("tanh_backward", k_tanh_bwd, n, din, dout, out, n);
}
static void cu_dropout_forward(float *out, uint8_t *mask, const float *in, size_t n, float rate, uint64_t seed) {
    float scale = rate < 1.0f ? 1.0f / (1.0f - rate) : 0.0f;
    ELEMENTWISE("dropout_forward", k_dropout_fwd, n, out, mask, in, n, rate, scale, seed);
}
static void cu_dropout_backward(float *din, const float *dout, const uint8_t *mask, size_t n, float rate) {
    float scale = rate < 1.0f ? 1.0f / (1.0f - rate) : 0.0f;
    ELEMENTWISE("dropout_backward", k_dropout_bwd, n, din, dout, mask, n, scale);
}
static void cu_add_forward(float *out, const float *a, const float *b, size_t n, int relu) {
    ELEMENTWISE("add_forward", k_add, n, out, a, b, n, relu);
}
static void cu_concat_forward(float *out, const float *in, size_t rows, int in_c, int out_c, int off) {
    ELEMENTWISE("concat_forward", k_concat_fwd, rows * in_c, out, in, rows, in_c, out_c, off);
}
static void cu_concat_backward(float *din, const float *dout, size_t rows, int in_c, int out_c, int off) {
    ELEMENTWISE("concat_backward", k_concat_bwd, rows * in_c, din, dout, rows, in_c, out_c, off);
}

/* ---- dense ---------------------------------------------------------------------------------- */

static void cu_dense_forward(float *out, const float *in, const float *w, const float *b, int batch, int in_dim,
                             int out_dim) {
    use();
    dense_forward_steps(&device_ops, out, in, w, b, batch, in_dim, out_dim);
}

static void cu_dense_backward(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                              int batch, int in_dim, int out_dim) {
    use();
    dense_backward_steps(&device_ops, din, dw, db, dout, in, w, batch, in_dim, out_dim);
}

/* ---- loss ----------------------------------------------------------------------------------- */

__global__ void k_xent(float *dlogits, double *row_loss, int *row_hit, const float *logits, const int32_t *labels,
                       int batch, int classes) {
    LOOP(n, (size_t)batch) xent_row(dlogits, &row_loss[n], &row_hit[n], logits, labels, batch, classes, n);
}

/* Labels are host memory. The per-row losses come back and are summed on the host in row order,
 * as the CPU sums them. */
static float cu_softmax_xent(float *dlogits, const float *logits, const int32_t *labels, int batch, int classes,
                             int *correct) {
    if (correct) *correct = 0;
    if (batch <= 0) return 0.0f;
    use();
    if ((size_t)batch > g.rows_n) {
        ck(cudaStreamSynchronize(g.compute), "cudaStreamSynchronize (loss buffers)");
        cudaFree(g.row_loss), cudaFree(g.row_hit), cudaFree(g.labels);
        free(g.host_loss), free(g.host_hit);
        g.row_loss = NULL, g.row_hit = NULL, g.labels = NULL, g.host_loss = NULL, g.host_hit = NULL, g.rows_n = 0;
        g.host_loss = (double *)malloc((size_t)batch * sizeof(double));
        g.host_hit = (int *)malloc((size_t)batch * sizeof(int));
        if (!g.host_loss || !g.host_hit) {
            fail("cuda:%d: out of host memory for the loss of %d rows", g.index, batch);
            return NAN;
        }
        if (!ck(cudaMalloc((void **)&g.row_loss, (size_t)batch * sizeof(double)), "cudaMalloc (loss rows)") ||
            !ck(cudaMalloc((void **)&g.row_hit, (size_t)batch * sizeof(int)), "cudaMalloc (loss hits)") ||
            !ck(cudaMalloc((void **)&g.labels, (size_t)batch * sizeof(int32_t)), "cudaMalloc (labels)"))
            return NAN;
        g.rows_n = (size_t)batch;
    }
    if (!ck(cudaMemcpyAsync(g.labels, labels, (size_t)batch * sizeof(int32_t), cudaMemcpyHostToDevice, g.compute),
            "cudaMemcpyAsync (labels)"))
        return NAN;
    k_xent<<<blocks_for((size_t)batch), THREADS, 0, g.compute>>>(dlogits, g.row_loss, g.row_hit, logits, g.labels, batch,
                                                                 classes);
    if (!LAUNCHED("softmax_xent")) return NAN;
    if (!ck(cudaMemcpyAsync(g.host_loss, g.row_loss, (size_t)batch * sizeof(double), cudaMemcpyDeviceToHost, g.compute),
            "cudaMemcpyAsync (loss rows)") ||
        !ck(cudaMemcpyAsync(g.host_hit, g.row_hit, (size_t)batch * sizeof(int), cudaMemcpyDeviceToHost, g.compute),
            "cudaMemcpyAsync (loss hits)") ||
        !ck(cudaStreamSynchronize(g.compute), "cudaStreamSynchronize (loss)"))
        return NAN;
    double loss = 0.0;
    int hits = 0;
    for (int n = 0; n < batch; n++) loss += g.host_loss[n], hits += g.host_hit[n];
    if (correct) *correct = hits;
    return (float)(loss / batch);
}

/* ---- the table ------------------------------------------------------------------------------ */

static dt_backend make_backend(void) {
    dt_backend k;
    memset(&k, 0, sizeof k);
    k.name = "cuda";
    k.on_device = 1;
    k.alloc = cu_alloc;
    k.release = cu_release;
    k.copy = cu_copy;
    k.zero = cu_zero;
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
    /* batch norm: not yet (its statistics and folding run on the host in model/net.c) */
    k.upload_params = dt_cuda_upload_params;
    k.download_grads = dt_cuda_download_grads;
    k.wait_slot = dt_cuda_wait_slot;
    k.upload = dt_cuda_upload;
    k.download = dt_cuda_download;
    k.sync = dt_cuda_sync;
    k.status = dt_cuda_status;
    k.pin = dt_cuda_pin;
    k.unpin = dt_cuda_unpin;
    k.close = dt_cuda_close;
    return k;
}
static const dt_backend cuda_backend = make_backend();

/* ---- the device ----------------------------------------------------------------------------- */

extern "C" int dt_cuda_built(void) { return 1; }

extern "C" const dt_backend *dt_cuda_backend(void) { return g.open_count ? &cuda_backend : NULL; }

static void teardown(void) {
    for (int i = 0; i < DT_CUDA_SLOTS; i++)
        if (g.slots[i]) cudaEventDestroy(g.slots[i]);
    for (int i = 0; i < MARKERS; i++)
        if (g.markers[i]) cudaEventDestroy(g.markers[i]);
    if (g.ordered) cudaEventDestroy(g.ordered);
    if (g.blas) blas.destroy(g.blas);
    if (g.compute) cudaStreamDestroy(g.compute);
    if (g.copy) cudaStreamDestroy(g.copy);
    cudaFree(g.ones), cudaFree(g.row_loss), cudaFree(g.row_hit), cudaFree(g.labels);
    free(g.host_loss), free(g.host_hit);
    memset(g.slots, 0, sizeof g.slots), memset(g.markers, 0, sizeof g.markers);
    g.ordered = NULL, g.blas = NULL, g.compute = g.copy = NULL;
    g.ones = NULL, g.ones_n = 0, g.row_loss = NULL, g.row_hit = NULL, g.labels = NULL, g.rows_n = 0;
    g.host_loss = NULL, g.host_hit = NULL;
    cudaGetLastError();
}

extern "C" int dt_cuda_open(int index, dt_error *err) {
    if (g.open_count) {
        if (index != g.index)
            return dt_errorf(err, DT_EINVAL, "--device cuda:%d: this process already uses cuda:%d (one device per process)",
                             index, g.index);
        g.open_count++;
        return DT_OK;
    }
    /* cuBLAS first: a machine without a GPU still shows whether the library would load */
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
    cudaDeviceProp p;
    if ((e = cudaGetDeviceProperties(&p, index)) != cudaSuccess || (e = cudaSetDevice(index)) != cudaSuccess) {
        cudaGetLastError();
        return dt_errorf(err, DT_EINVAL, "--device cuda:%d: %s", index, cudaGetErrorString(e));
    }
    /* The build carries sm_90 code and compute_90 PTX (CMakeLists.txt): older GPUs cannot run it. */
    if (p.major < 9)
        return dt_errorf(err, DT_EINVAL,
                         "--device cuda:%d: %s is sm_%d%d; this build has code for sm_90 and newer only "
                         "(set CMAKE_CUDA_ARCHITECTURES to build for it)",
                         index, p.name, p.major, p.minor);
    g.index = index, g.major = p.major, g.minor = p.minor, g.memory = p.totalGlobalMem, g.failed = 0;
    snprintf(g.name, sizeof g.name, "%s", p.name);
    const char *tf32 = getenv("DTRAIN_CUDA_TF32"), *sync_each = getenv("DTRAIN_CUDA_SYNC");
    g.tf32 = tf32 && !strcmp(tf32, "1");
    g.sync_each = sync_each && !strcmp(sync_each, "1");
    const char *what = "cudaStreamCreate";
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    if ((e = cudaStreamCreateWithFlags(&g.compute, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&g.copy, cudaStreamNonBlocking)) != cudaSuccess)
        goto fail;
    what = "cudaEventCreate";
    if ((e = cudaEventCreateWithFlags(&g.ordered, cudaEventDisableTiming)) != cudaSuccess) goto fail;
    for (int i = 0; i < DT_CUDA_SLOTS; i++)
        if ((e = cudaEventCreateWithFlags(&g.slots[i], cudaEventDisableTiming)) != cudaSuccess) goto fail;
    for (int i = 0; i < MARKERS; i++)
        if ((e = cudaEventCreate(&g.markers[i])) != cudaSuccess) goto fail;
    what = "cublasCreate";
    if ((s = blas.create(&g.blas)) != CUBLAS_STATUS_SUCCESS) goto fail_blas;
    what = "cublasSetStream";
    if ((s = blas.set_stream(g.blas, g.compute)) != CUBLAS_STATUS_SUCCESS) goto fail_blas;
    /* Plain fp32 unless DTRAIN_CUDA_TF32=1 (faster, but about 1e-3 relative: the fixtures fail) */
    what = "cublasSetMathMode";
    if ((s = blas.set_math_mode(g.blas, g.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH)) !=
        CUBLAS_STATUS_SUCCESS)
        goto fail_blas;
    g.open_count = 1;
    return DT_OK;
fail:
    teardown();
    return dt_errorf(err, DT_EIO, "--device cuda:%d: %s failed: %s", index, what, cudaGetErrorString(e));
fail_blas:
    teardown();
    return dt_errorf(err, DT_EIO, "--device cuda:%d: %s failed: %s", index, what, blas.status_string(s));
}

extern "C" void dt_cuda_close(void) {
    if (!g.open_count || --g.open_count) return;
    use();
    cudaDeviceSynchronize();
    teardown();
}

extern "C" void dt_cuda_describe(char *buf, size_t len) {
    if (!g.open_count) {
        snprintf(buf, len, "no CUDA device open");
        return;
    }
    snprintf(buf, len, "%s (cuda:%d, sm_%d%d, %.1f GiB, %s)", g.name, g.index, g.major, g.minor,
             (double)g.memory / (1024.0 * 1024 * 1024), g.tf32 ? "TF32 matrix products" : "fp32");
}

extern "C" int dt_cuda_pin(void *p, size_t bytes) {
    if (!g.open_count || !p || !bytes) return -1;
    use();
    if (cudaHostRegister(p, bytes, cudaHostRegisterDefault) != cudaSuccess) {
        cudaGetLastError(); /* not sticky: the copies are merely synchronous */
        return -1;
    }
    return 0;
}

extern "C" void dt_cuda_unpin(void *p) {
    if (!g.open_count || !p) return;
    use();
    cudaHostUnregister(p);
    cudaGetLastError(); /* it was never pinned: nothing to undo */
}

extern "C" void dt_cuda_upload_params(float *dev, const float *host, size_t n) {
    if (!n) return;
    use();
    /* Nothing still reads dev: forward and backward both end with the streams idle (dt_cuda_download,
     * dt_cuda_sync), so the uploads of all layers stream in while the first layers compute. */
    if (ck(cudaMemcpyAsync(dev, host, n * sizeof(float), cudaMemcpyHostToDevice, g.copy), "cudaMemcpyAsync (parameters)") &&
        ck(cudaEventRecord(g.ordered, g.copy), "cudaEventRecord (parameters)"))
        ck(cudaStreamWaitEvent(g.compute, g.ordered, 0), "cudaStreamWaitEvent (parameters)");
}

extern "C" void dt_cuda_download_grads(float *host, const float *dev, size_t n, int slot) {
    if (slot < 0 || slot >= DT_CUDA_SLOTS) {
        fail("cuda:%d: copy slot %d out of range", g.index, slot);
        return;
    }
    use();
    if (ck(cudaEventRecord(g.ordered, g.compute), "cudaEventRecord (gradients)") &&
        ck(cudaStreamWaitEvent(g.copy, g.ordered, 0), "cudaStreamWaitEvent (gradients)") &&
        ck(cudaMemcpyAsync(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost, g.copy), "cudaMemcpyAsync (gradients)"))
        ck(cudaEventRecord(g.slots[slot], g.copy), "cudaEventRecord (gradient slot)");
}

extern "C" void dt_cuda_wait_slot(int slot) {
    if (slot < 0 || slot >= DT_CUDA_SLOTS) return;
    use();
    ck(cudaEventSynchronize(g.slots[slot]), "cudaEventSynchronize (gradients)");
}

extern "C" void dt_cuda_upload(void *dev, const void *host, size_t bytes) {
    if (!bytes) return;
    use();
    ck(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, g.compute), "cudaMemcpyAsync (input batch)");
}

extern "C" void dt_cuda_download(void *host, const void *dev, size_t bytes) {
    use();
    if (bytes) ck(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, g.compute), "cudaMemcpyAsync (logits)");
    ck(cudaStreamSynchronize(g.compute), "cudaStreamSynchronize (logits)");
}

extern "C" void dt_cuda_sync(void) {
    use();
    ck(cudaStreamSynchronize(g.compute), "cudaStreamSynchronize (compute)");
    ck(cudaStreamSynchronize(g.copy), "cudaStreamSynchronize (copy)");
}

extern "C" void dt_cuda_mark(int marker) {
    if (marker < 0 || marker >= MARKERS) return;
    use();
    ck(cudaEventRecord(g.markers[marker], g.compute), "cudaEventRecord (marker)");
}

extern "C" float dt_cuda_elapsed_ms(int from, int to) {
    if (from < 0 || to < 0 || from >= MARKERS || to >= MARKERS) return 0.0f;
    use();
    float ms = 0.0f;
    return ck(cudaEventElapsedTime(&ms, g.markers[from], g.markers[to]), "cudaEventElapsedTime") ? ms : 0.0f;
}
