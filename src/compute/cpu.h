/* Internals shared by the CPU kernels' files (conv_cpu.c, winograd_cpu.c, pool_cpu.c, ...); not part
 * of kernels.h. */
#ifndef DT_COMPUTE_CPU_H
#define DT_COMPUTE_CPU_H

#include <cblas.h>
#include <stddef.h>
#include <stdint.h>

#include "compute/kernels.h"

/* The kinds of loop dt_cpu_par weighs, each with its own least work from which a kernel splits over
 * its threads (cpu.c, the thresholds): below it a second thread costs more than it saves. Units:
 *   STREAM: floats of a memory-bound loop (element-wise layers, pooling, batch norm, sums, concat);
 *   GATHER: floats gathered or summed through an embedding's rows (ids x dim);
 *   FM:     floats of the factorisation machine's input (batch x fields x dim);
 *   FLOPS:  floating-point operations of a matrix product or a convolution (direct, forward). */
enum { DT_PAR_STREAM, DT_PAR_GATHER, DT_PAR_FM, DT_PAR_FLOPS, DT_PAR_KINDS };

/* The threads for a loop of `work` units of kind `kind` (DT_PAR_*): 1 below the kind's threshold (or
 * inside a parallel region, or with one thread), else the context's threads, at most max_threads
 * (the loop's pieces) and at most the cores the machine's other runnable tasks leave free (cpu.c:
 * with every core busy, a second thread only waits). par_always: the context's threads whatever
 * the work and the load. Counts each region it lets through (dt_cpu_regions). */
int dt_cpu_par(const dt_cpu *cpu, double work, int kind, int max_threads);
#define DT_PAR_ANY 0x7fffffff

/* The threshold dt_cpu_par applies to a kind under this process's OpenMP wait policy (cpu.c). */
double dt_cpu_par_min(int kind);

/* A convolution's FLOPs (direct, forward: 2 per multiply-add), the work dt_cpu_par weighs. */
static inline double conv_flops(const dt_window *g, int batch) {
    return 2.0 * batch * g->out_h * g->out_w * g->k_h * g->k_w * g->in_c * g->out_c;
}
/* max_threads for dt_cpu_par from a count of pieces. */
static inline int par_cap(size_t pieces) { return pieces > 0x7fffffff ? 0x7fffffff : (int)pieces; }

/* One single-threaded sgemm (OpenBLAS is pinned to one thread once per process, cpu.c). */
static inline void sgemm1(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                          int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* A layer's product at the context's precision (kernels.h, dt_cpu.bf16): sgemm1, or dt_gemm_bf16 on
 * one thread, for the products inside a kernel's parallel region (the convolutions' chunks). */
static inline void gemm1(const dt_cpu *cpu, int trans_a, int trans_b, int M, int N, int K, float alpha,
                         const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (!cpu->bf16) {
        sgemm1(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    const dt_cpu one = {.threads = 1, .par_always = 0, .bf16 = 1};
    dt_gemm_bf16(&one, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* dt_gemm or dt_gemm_bf16, by the context's precision: a whole layer's product (dense layers). */
static inline void gemm_layer(const dt_cpu *cpu, int trans_a, int trans_b, int M, int N, int K, float alpha,
                              const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (cpu->bf16) dt_gemm_bf16(cpu, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else dt_gemm(cpu, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static inline size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

/* A build for any x86-64 (DTRAIN_NATIVE=OFF, no -march) still runs the loops marked DT_HOT with
 * AVX-512 or AVX2+FMA where the CPU has them: the compiler makes one copy per instruction set and
 * the loader picks one at start (target_clones, an ifunc). A native build needs none. Only
 * functions without an OpenMP parallel region: its body is outlined into a function that is not
 * cloned. BENCHMARKS.md, "Portable builds", says what this keeps and what it does not. */
#if defined(__x86_64__) && !defined(__AVX2__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define DT_HOT __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
#endif
#ifndef DT_HOT
#define DT_HOT
#endif

/* Backward splits the batch into this many pieces of whole examples (fewer if the batch is
 * smaller), whatever the thread count: each piece sums its own dW/db partial and the partials are
 * added in piece order, so gradients are bit-identical for any thread count and any timing. */
#define CONV_BWD_PIECES 16

/* Work is handed out dynamically in pieces (a core shared with another process falls behind
 * without stalling the rest); at least PIECES_PER_THREAD pieces per thread keep the last ones
 * short. */
#define PIECES_PER_THREAD 4

/* One output row oh of max pooling of one example (pool_cpu.c), shared with the fused conv + pool
 * (conv_cpu.c): o/am [OW, C]. src holds the example's input from element src_off on, so the fused
 * kernel can pass a chunk of conv rows; argmax is always the index within the whole example. */
void dt_maxpool_row(float *o, int32_t *am, const float *src, size_t src_off, const dt_window *g, int oh);

/* dt_gemm_bf16's numbers without AVX512_BF16 (gemm_bf16.c): the operands rounded by dt_bf16_round,
 * multiplied and summed in fp32 (dt_gemm); what dt_gemm_bf16 runs on a CPU without the instruction. */
void dt_gemm_bf16_emulated(const dt_cpu *cpu, int trans_a, int trans_b, int M, int N, int K, float alpha,
                           const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* dt_bf16_pack_b's words and dt_gemm_bf16_packed's numbers without AVX512_BF16 (the same words;
 * the packed values unpacked, then the emulation above). */
void dt_bf16_pack_b_emulated(uint32_t *packed, int trans_b, int K, int N, const float *B, int ldb);
void dt_gemm_bf16_packed_emulated(const dt_cpu *cpu, int trans_a, int M, int N, int K, float alpha, const float *A,
                                  int lda, const uint32_t *packed_b, float beta, float *C, int ldc);

/* Winograd F(2x2, 3x3) for 3x3 stride-1 convolutions with enough channels (winograd_cpu.c). */
int dt_wino_applies(const dt_window *g);
size_t dt_wino_scratch_floats(const dt_window *g, int batch);
void dt_wino_forward(const dt_cpu *cpu, float *out, const float *in, const float *w, const float *b, int batch,
                     const dt_window *g, float *scratch);
void dt_wino_backward(const dt_cpu *cpu, float *din, float *dw, float *db, const float *dout, const float *in,
                      const float *w, int batch, const dt_window *g, float *scratch);

#endif
