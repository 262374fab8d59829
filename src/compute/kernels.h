/* The CPU kernels: every kernel dtrain's layers need, over host memory (OpenBLAS + OpenMP). A net
 * calls them through the CPU backend's table (backend.h, backend_cpu.c); the CUDA backend
 * (kernels_cuda.cu) has its own functions of the same shapes over device memory.
 *
 * Memory layout (see docs/memory-layout.md): activations are NHWC float32, row-major, contiguous;
 * convolution kernels are HWIO [KH, KW, C_in, C_out]; dense weights are [in, out]; biases [out].
 * This is TensorFlow's layout, so flattening NHWC gives the same feature order as the source.
 *
 * Conventions (llm.c style): outputs first, then inputs; shapes in comments; backward functions
 * OVERWRITE their outputs (parameter gradients are not accumulated); an input gradient pointer
 * may be NULL when it is not needed (the first layer), which skips that work. */
#ifndef DT_COMPUTE_KERNELS_H
#define DT_COMPUTE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain.h"

typedef enum { DT_PAD_VALID = 0, DT_PAD_SAME = 1 } dt_padding;

/* Geometry of a sliding window (convolution or pooling) over one NHWC example. */
typedef struct {
    int in_h, in_w, in_c;
    int out_h, out_w, out_c; /* pooling: out_c == in_c */
    int k_h, k_w, stride_h, stride_w;
    int pad_top, pad_left;   /* SAME splits padding as TensorFlow: the extra row/col goes bottom/right */
} dt_window;

/* Fills g; out_c is the number of filters (pass in_c for pooling). Fails with a message if the
 * window does not fit (kernel larger than a VALID input, non-positive sizes). */
int dt_window_init(dt_window *g, int in_h, int in_w, int in_c, int out_c, int k_h, int k_w,
                   int stride_h, int stride_w, dt_padding pad, dt_error *err);

/* The CPU backend's context: the OpenMP threads its kernels split their work over (OpenBLAS always
 * runs single-threaded, on cache-sized pieces). Each user has its own (a net: dt_net_set_threads),
 * so two nets of one process may use different counts; the kernels' results do not depend on it.
 * Every kernel that splits its work takes one, first. */
typedef struct dt_cpu {
    int threads;    /* 1 .. dt_cpu_cores() */
    int par_always; /* 1: a parallel region at any size, below the thresholds too (cpu.c, g_par_min):
                       what bench_par measures the thresholds with, and tests of the parallel paths */
    int bf16;       /* 1: the convolutions' and dense layers' products in bf16 with float32 accumulation
                       (dt_gemm_bf16; --precision bf16, compute/precision.h); every other kernel and
                       every buffer stays float32 */
} dt_cpu;

/* threads <= 0: every core; more than the cores: the cores (scratch is sized for them). float32. */
void dt_cpu_init(dt_cpu *cpu, int threads);
/* The cores there are (the cap, and the threads conv scratch is sized for), and OpenMP's default
 * (OMP_NUM_THREADS, else every core): what a net starts with. Constants of the process. */
int dt_cpu_cores(void);
int dt_cpu_default_threads(void);
/* Parallel regions the kernels have entered in this process so far (a count for tests: a step of
 * a small model enters none, cpu.h). */
uint64_t dt_cpu_regions(void);
/* Tests: read the machine's runnable tasks from this file instead of /proc/loadavg (NULL: back). */
void dt_cpu_set_loadavg_path(const char *path);

/* C[M,N] = alpha * op(A) @ op(B) + beta * C, row-major (cblas_sgemm). */
void dt_gemm(const dt_cpu *cpu, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
             const float *B, int ldb, float beta, float *C, int ldc);

/* C = alpha * op(A) op(B) + beta * C with A and B rounded to bf16 (round to nearest even) and the
 * products accumulated in fp32; the same arguments as dt_gemm. */
void dt_gemm_bf16(const dt_cpu *cpu, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc);
int dt_cpu_has_bf16(void); /* 1 where the CPU has AVX512_BF16 (cpuid), else 0 */
/* An op(B) [K, N] used by many products (a layer's weights: Winograd's 16 transformed kernels, the
 * im2col chunks' w) packed once into dt_bf16_packed_b_words(K, N) words; dt_gemm_bf16_packed then
 * gives dt_gemm_bf16's bits without packing B on each call (trans_b is the packing's). */
size_t dt_bf16_packed_b_words(int K, int N);
void dt_bf16_pack_b(uint32_t *packed, int trans_b, int K, int N, const float *B, int ldb);
void dt_gemm_bf16_packed(const dt_cpu *cpu, int trans_a, int M, int N, int K, float alpha, const float *A, int lda,
                         const uint32_t *packed_b, float beta, float *C, int ldc);

/* x rounded to the nearest bf16 (ties to even), as a float: what dt_gemm_bf16 multiplies. As
 * AVX512_BF16's conversion (vcvtne2ps2bf16): a subnormal becomes a zero of its sign, a NaN stays a
 * (quiet) NaN, a finite value past bf16's largest becomes an infinity. */
static inline float dt_bf16_round(float x) {
    union {
        float f;
        uint32_t u;
    } v = {x};
    if ((v.u & 0x7f800000u) == 0) v.u &= 0x80000000u;              /* zero or subnormal */
    else if ((v.u & 0x7fffffffu) > 0x7f800000u) v.u |= 0x00400000u; /* NaN: quiet */
    else v.u += 0x7fffu + ((v.u >> 16) & 1u);                        /* to nearest, ties to even */
    v.u &= 0xffff0000u;
    return v.f;
}

/* dst[i] = the bf16 of src[i] (the high half of dt_bf16_round's bits), n elements, by AVX512_BF16's
 * conversion where the CPU has it: operands stored in bf16 ahead of dt_gemm_bf16 (or oneDNN's) round
 * as it would. Not the wire's dt_pack (transport/compress.h), which keeps subnormals; widening back
 * is exact either way (a bf16 is a float's high half: dt_unpack, or a shift by 16). */
void dt_bf16_store(uint16_t *dst, const float *src, size_t n);

/* Scratch floats dt_conv2d_forward/backward need for a batch of `batch` examples. */
size_t dt_conv2d_scratch_floats(const dt_window *g, int batch);

/* out [N,OH,OW,OC] = conv(in [N,H,W,C], w [KH,KW,C,OC]) + b [OC] (b may be NULL) */
void dt_conv2d_forward(const dt_cpu *cpu, float *out, const float *in, const float *w, const float *b, int batch,
                       const dt_window *g, float *scratch);
/* din [N,H,W,C] (or NULL), dw [KH,KW,C,OC], db [OC] (or NULL) from dout [N,OH,OW,OC] */
void dt_conv2d_backward(const dt_cpu *cpu, float *din, float *dw, float *db, const float *dout, const float *in,
                        const float *w, int batch, const dt_window *g, float *scratch);

/* out [N,OH,OW,C] = max over window of in [N,H,W,C]; padding cells never win (SAME pads with -inf).
 * argmax [N,OH,OW,C] records the winning input index within its example, for backward. */
void dt_maxpool_forward(const dt_cpu *cpu, float *out, int32_t *argmax, const float *in, int batch, const dt_window *g);
/* din [N,H,W,C] (overwritten) from dout [N,OH,OW,C] */
void dt_maxpool_backward(const dt_cpu *cpu, float *din, const float *dout, const int32_t *argmax, int batch,
                         const dt_window *g);

/* Fused conv2d + maxpool (optional; a net may always run the two separately). The conv output
 * [N,OH,OW,OC] is never stored: each chunk of conv rows is pooled while in cache, and backward
 * rebuilds the conv gradient chunk by chunk from the pooled gradient and argmax. Results equal
 * conv2d_* followed by maxpool_* (to float rounding); argmax indexes the conv output within its
 * example exactly as dt_maxpool_forward's does. Allowed when dt_conv2d_maxpool_fusable says so: the pool
 * reads the conv output, its windows do not overlap (k <= stride), and the conv runs as im2col
 * (a first layer with few channels, where the saving is largest). */
int dt_conv2d_maxpool_fusable(const dt_window *conv, const dt_window *pool);
size_t dt_conv2d_maxpool_scratch_floats(const dt_window *conv, const dt_window *pool, int batch);
/* out [N,PH,PW,OC], argmax [N,PH,PW,OC] from in [N,H,W,C], w [KH,KW,C,OC], b [OC] (or NULL) */
void dt_conv2d_maxpool_forward(const dt_cpu *cpu, float *out, int32_t *argmax, const float *in, const float *w,
                               const float *b, int batch, const dt_window *conv, const dt_window *pool, float *scratch);
/* din [N,H,W,C] (or NULL), dw [KH,KW,C,OC], db [OC] (or NULL) from dout [N,PH,PW,OC] */
void dt_conv2d_maxpool_backward(const dt_cpu *cpu, float *din, float *dw, float *db, const float *dout,
                                const int32_t *argmax, const float *in, const float *w, int batch,
                                const dt_window *conv, const dt_window *pool, float *scratch);

/* out[n] = max(in[n], 0); out may alias in. */
void dt_relu_forward(const dt_cpu *cpu, float *out, const float *in, size_t n);
/* din[n] = out[n] > 0 ? dout[n] : 0; din may alias dout. */
void dt_relu_backward(const dt_cpu *cpu, float *din, const float *dout, const float *out, size_t n);

/* Inverted dropout: out = in * keep / (1 - rate), keep drawn from dt_hash64(seed, i) so the mask
 * is the same for any thread count. mask [n] records keep (1) or drop (0). */
void dt_dropout_forward(const dt_cpu *cpu, float *out, uint8_t *mask, const float *in, size_t n, float rate,
                        uint64_t seed);
void dt_dropout_backward(const dt_cpu *cpu, float *din, const float *dout, const uint8_t *mask, size_t n, float rate);

/* out [N,O] = in [N,I] @ w [I,O] + b [O] (b may be NULL) */
void dt_dense_forward(const dt_cpu *cpu, float *out, const float *in, const float *w, const float *b, int batch,
                      int in_dim, int out_dim);
/* din [N,I] (or NULL), dw [I,O], db [O] (or NULL) from dout [N,O] */
void dt_dense_backward(const dt_cpu *cpu, float *din, float *dw, float *db, const float *dout, const float *in,
                       const float *w, int batch, int in_dim, int out_dim);

/* Fused, numerically stable softmax cross-entropy, mean over the batch.
 * logits [N,K], labels [N] in [0,K). Writes dlogits [N,K] = (softmax - onehot) / N (dlogits may be
 * NULL for evaluation), returns the mean loss; *correct = number of argmax matches (first max wins). */
float dt_softmax_xent(float *dlogits, const float *logits, const int32_t *labels, int batch, int classes,
                      int *correct);

/* ---- layers of residual networks (batchnorm_cpu.c, pool_cpu.c, elementwise_cpu.c) ---------- */
/* Activations of these layers are [rows, C] with rows = N*H*W (NHWC): a channel is a column. */

/* Batch norm sums run in double over fixed pieces of rows, each piece summed on one thread and the
 * pieces added in order, so results do not depend on the thread count; work holds the pieces'
 * partial sums. */
size_t dt_batchnorm_work_doubles(size_t rows, int C);
/* Training: mean [C], var [C] (biased: divided by rows) and inv_std [C] = 1/sqrt(var + eps) of
 * in [rows, C] over its rows, scale [C] = gamma * inv_std and shift [C] = beta - mean * scale;
 * out [rows, C] = in * scale + shift, then max(out, 0) if relu (a ReLU after the norm, in the
 * same pass). out NULL: the statistics only (dt_channel_affine_add_forward applies them). */
void dt_batchnorm_forward(const dt_cpu *cpu, float *out, float *mean, float *var, float *inv_std, float *scale,
                          float *shift, const float *in, const float *gamma, const float *beta, size_t rows, int C,
                          float eps, int relu, double *work);
/* din [rows, C] (or NULL), dgamma [C], dbeta [C] from dout [rows, C], the forward's in, mean, inv_std.
 * scale and shift (forward's, or NULL): dout is the gradient of the ReLU after the norm (forward
 * ran with relu); it is masked here where forward's output was not positive, recomputed from in
 * with forward's very floats. */
void dt_batchnorm_backward(const dt_cpu *cpu, float *din, float *dgamma, float *dbeta, const float *dout,
                           const float *in, const float *mean, const float *inv_std, const float *gamma,
                           const float *scale, const float *shift, size_t rows, int C, double *work);
/* out [rows, C] = in * scale [C] + shift [C] (then max(out, 0) if relu): batch norm in
 * evaluation, with the moving statistics folded into scale and shift. out may alias in. */
void dt_channel_affine_forward(const dt_cpu *cpu, float *out, const float *in, const float *scale, const float *shift,
                               size_t rows, int C, int relu);
/* out [rows, C] = in * scale [C] + shift [C] + b [rows, C], then max(out, 0) if relu: a batch
 * norm's output added to a residual without writing the norm's output first. out may alias b. */
void dt_channel_affine_add_forward(const dt_cpu *cpu, float *out, const float *in, const float *scale,
                                   const float *shift, const float *b, size_t rows, int C, int relu);

/* out [N,OH,OW,C] = mean over the window of in [N,H,W,C], counting only cells inside the image
 * (TensorFlow's SAME average pooling: padding cells are left out of the count, not averaged in). */
void dt_avgpool_forward(const dt_cpu *cpu, float *out, const float *in, int batch, const dt_window *g);
/* din [N,H,W,C] (overwritten) from dout [N,OH,OW,C] */
void dt_avgpool_backward(const dt_cpu *cpu, float *din, const float *dout, int batch, const dt_window *g);

/* out [N,C] = mean of in [N,HW,C] over its HW positions */
void dt_global_avgpool_forward(const dt_cpu *cpu, float *out, const float *in, int batch, int hw, int C);
/* din [N,HW,C] = dout [N,C] / HW at every position */
void dt_global_avgpool_backward(const dt_cpu *cpu, float *din, const float *dout, int batch, int hw, int C);

/* out = in > 0 ? in : alpha * in, 0 <= alpha < 1 (out may alias in); backward reads the sign of
 * out, which is the sign of in, so it may run over an in-place output. din may alias dout. */
void dt_leaky_relu_forward(const dt_cpu *cpu, float *out, const float *in, size_t n, float alpha);
void dt_leaky_relu_backward(const dt_cpu *cpu, float *din, const float *dout, const float *out, size_t n, float alpha);
/* out = 1 / (1 + exp(-in)); din = dout * out * (1 - out). din may alias dout. */
void dt_sigmoid_forward(const dt_cpu *cpu, float *out, const float *in, size_t n);
void dt_sigmoid_backward(const dt_cpu *cpu, float *din, const float *dout, const float *out, size_t n);
/* out = tanh(in); din = dout * (1 - out^2). din may alias dout. */
void dt_tanh_forward(const dt_cpu *cpu, float *out, const float *in, size_t n);
void dt_tanh_backward(const dt_cpu *cpu, float *din, const float *dout, const float *out, size_t n);

/* out [n] = a [n] + b [n], then max(out, 0) if relu (out may alias a or b): the residual sum, one
 * input at a time, and gradients summed. */
void dt_add_forward(const dt_cpu *cpu, float *out, const float *a, const float *b, size_t n, int relu);
/* Concatenation along channels: out [rows, out_c] gets in [rows, in_c] at channels off..off+in_c. */
void dt_concat_forward(const dt_cpu *cpu, float *out, const float *in, size_t rows, int in_c, int out_c, int off);
/* din [rows, in_c] = channels off..off+in_c of dout [rows, out_c] */
void dt_concat_backward(const dt_cpu *cpu, float *din, const float *dout, size_t rows, int in_c, int out_c, int off);

/* ---- layers of click-through-rate models (tabular_cpu.c) ------------------------------------- */

/* The bags an embedding layer reads from a batch of click logs (data/ctr.h's CSR): for example i and
 * the layer's s-th field, field[s], the ids j in [offsets[i * num_fields + field[s]],
 * offsets[i * num_fields + field[s] + 1]), each with its table row rows[j] (the id hashed to its
 * bucket, plus the field's table's first row) and its weight weights[j] (the id's value; NULL: 1). */
typedef struct {
    const int64_t *offsets;     /* [batch * num_fields + 1] */
    int num_fields;
    const int32_t *field;       /* [n_fields], ascending */
    int n_fields;
    const int64_t *rows;        /* [nnz]: only those of the layer's fields are read */
    const float *weights;       /* [nnz] or NULL */
    int batch, dim;
    int mean;                   /* combiner: 1 mean (sum of w e / sum of w), 0 sum (sum of w e) */
} dt_bags;

/* out [batch, n_fields * dim]: row i, slot s holds the combined rows of bag (i, s); an empty bag, or
 * a mean bag whose weights add up to 0, gives zeros (TensorFlow's embedding_lookup_sparse). Sums run
 * in double, in the bag's order. table [rows, dim]. */
void dt_embedding_forward(const dt_cpu *cpu, float *out, const float *table, const dt_bags *b);
/* Ids in the layer's bags: backward's scratch and outputs are sized by it. */
size_t dt_embedding_pairs(const dt_bags *b);
/* The table's gradient as its touched rows: uniq [*n] ascending, unique, and grad [*n, dim] each
 * row's gradient summed over every id of the batch that looked it up (in double, in batch order:
 * the same for any thread count). Rows no id touched have gradient 0 and are not listed. uniq and
 * grad hold at least dt_embedding_pairs(b) rows (fewer than 2^32); scratch [3 * pairs + 1] uint64. Returns
 * the number of rows. */
size_t dt_embedding_backward(const dt_cpu *cpu, int64_t *uniq, float *grad, const float *dout, const dt_bags *b,
                             uint64_t *scratch);

/* Second-order factorisation machine (Rendle 2010) over v [batch, F, D], the fields' vectors:
 * out [batch] = sum_{f<g} <v_f, v_g> = 0.5 * sum_k ((sum_f v_fk)^2 - sum_f v_fk^2), the O(F D) form,
 * in double. */
void dt_fm_forward(const dt_cpu *cpu, float *out, const float *v, int batch, int F, int D);
/* dv [batch, F, D] = dout[i] * (sum_g v_gk - v_fk) */
void dt_fm_backward(const dt_cpu *cpu, float *dv, const float *dout, const float *v, int batch, int F, int D);

/* out [batch] = sum of in [batch, n] (in double); din [batch, n] = dout[i] everywhere. */
void dt_reduce_sum_forward(const dt_cpu *cpu, float *out, const float *in, int batch, int n);
void dt_reduce_sum_backward(const dt_cpu *cpu, float *din, const float *dout, int batch, int n);

/* A binary output: p = sigmoid(logit) and the mean logloss over the batch, computed stably as
 * max(z, 0) - z y + log(1 + exp(-|z|)) (tf.nn.sigmoid_cross_entropy_with_logits) in double.
 * logits [N], labels [N] 0 or 1; dlogits [N] = (p - y) / N (NULL: evaluation); *correct = rows
 * with (z > 0) == (y == 1) (a probability above 0.5 predicts a click). */
float dt_sigmoid_logloss(float *dlogits, const float *logits, const float *labels, int batch, int *correct);
/* probs [N] = sigmoid(logits [N]), as dt_sigmoid_logloss computes it; probs may alias logits. */
void dt_sigmoid_probs(float *probs, const float *logits, int batch);

/* The predicted class of one row of logits x [K]: the index of the largest, the first on ties (a NaN
 * wins only in first place: comparisons with it are false). dt_softmax_xent's count of correct answers, dt_evaluate's confusion matrix and
 * prediction all use it, so they agree exactly. */
int dt_argmax_first(const float *x, int classes);
/* probs [N,K] = softmax of each row of logits [N,K], as dt_softmax_xent computes it (around the row's
 * max, sums in double). probs may alias logits. */
void dt_softmax_forward(float *probs, const float *logits, int batch, int classes);

#endif
