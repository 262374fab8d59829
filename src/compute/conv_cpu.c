/* Convolution on the CPU (compute/kernels.h): OpenBLAS sgemm for the matrix products, OpenMP for
 * everything else. One thread pool only: OpenBLAS always runs single-threaded and the kernels split work across
 * OpenMP threads themselves. Two spinning pools (OpenBLAS's pthreads and OpenMP's) on a small machine
 * steal each other's cores, and single-threaded sgemm on cache-sized chunks is as fast per core as
 * threaded sgemm on the whole matrix (see bench/bench_kernels.c).
 *
 * Convolution: 3x3 stride-1 layers with >= 8 channels run Winograd F(2x2, 3x3) (winograd_cpu.c; 2.25x fewer
 * multiplies, as 16 GEMMs per chunk of tiles); the others run chunked im2col + GEMM: each thread
 * gathers a block of R output positions into its own [R, KH*KW*C] scratch (sized to stay in L2)
 * and multiplies it by the HWIO kernel viewed as [KH*KW*C, OC]; the result lands directly in
 * NHWC. Backward recomputes the same chunks: dW += col^T @ dout, then dcol = dout @ W^T
 * overwrites col and is scattered back (col2im). Gradients are summed in fixed pieces, so they are
 * bit-identical for any thread count. docs/memory-layout.md has the details and measurements.
 * A context in bf16 (dt_cpu.bf16, --precision bf16) runs every product here through dt_gemm_bf16
 * instead of sgemm (cpu.h, gemm1), and im2col for Winograd's layers too (use_wino below); gathers,
 * scatters and sums stay float32. */
#include <cblas.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <omp.h>
#include <string.h>

#include "compute/cpu.h"
#include "compute/kernels.h"

/* ---- GEMM ---------------------------------------------------------------------------------- */

/* Pieces dt_gemm cuts the longer side of C into, whatever the thread count: OpenBLAS's result for
 * one element can depend on where it falls in the product it is part of (edge kernels sum in
 * another order; its Haswell kernels do, its SkylakeX ones did not), so pieces that depend only on
 * the shape keep results bit-identical for any --threads. */
#define GEMM_PIECES 8
#define GEMM_PIECE_MIN 64

void dt_gemm(const dt_cpu *cpu, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
             const float *B, int ldb, float beta, float *C, int ldc) {
    double flops = 2.0 * M * N * K;
    if (flops < 2e6 || (M < 32 && N < 32)) {
        sgemm1(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    /* Pieces of the longer side, multiples of 16 (whole SIMD tiles), each an independent sgemm
     * on a sub-matrix. */
    const int split_m = M >= N, len = split_m ? M : N;
    int blk = (len + GEMM_PIECES - 1) / GEMM_PIECES;
    blk = (blk + 15) & ~15;
    if (blk < GEMM_PIECE_MIN) blk = GEMM_PIECE_MIN;
    const int pieces = (len + blk - 1) / blk;
    const int nt = dt_cpu_par(cpu, flops, DT_PAR_FLOPS, pieces); /* the pieces depend on the shape only */
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int p = 0; p < pieces; p++) {
        int lo = p * blk, hi = lo + blk < len ? lo + blk : len;
        if (split_m) {
            const float *a = trans_a ? A + lo : A + (size_t)lo * lda;
            sgemm1(trans_a, trans_b, hi - lo, N, K, alpha, a, lda, B, ldb, beta, C + (size_t)lo * ldc, ldc);
        } else {
            const float *b = trans_b ? B + (size_t)lo * ldb : B + lo;
            sgemm1(trans_a, trans_b, M, hi - lo, K, alpha, A, lda, b, ldb, beta, C + lo, ldc);
        }
    }
}

/* ---- convolution --------------------------------------------------------------------------- */

/* Floats of col scratch one thread aims for: 128K floats = 512 KB, half a Zen 4 L2 (measured). */
#ifndef CONV_CHUNK_FLOATS
#define CONV_CHUNK_FLOATS (128 * 1024)
#endif

static inline int is_pointwise(const dt_window *g) {
    return g->k_h == 1 && g->k_w == 1 && g->stride_h == 1 && g->stride_w == 1;
}

/* OpenBLAS (0.3.21, SkylakeX/Cooperlake kernels) multiplies matrices with M*N*K up to 1e6 with
 * unpacked "small matrix" kernels: 100-110 GFLOP/s per core for the short K of a first layer
 * (9 or 27), against 45-80 for the packed path on the same rows (bench/bench_kernels). */
#define SMALL_GEMM_MNK 1000000

/* Output positions per im2col chunk. */
static size_t conv_chunk_rows(const dt_window *g, int batch) {
    size_t kkc = (size_t)g->k_h * g->k_w * g->in_c;
    size_t rows = CONV_CHUNK_FLOATS / kkc;
    size_t small = SMALL_GEMM_MNK / (kkc * g->out_c);
    if (small >= 256 && small < rows) rows = small; /* short K: stay on the small-matrix kernels */
    if (rows < 32) rows = 32; /* a huge kernel: keep GEMM's M dimension useful */
    size_t total = (size_t)(batch > 0 ? batch : 1) * g->out_h * g->out_w;
    return rows < total ? rows : total;
}

/* Scratch layout (floats, each part 16-aligned), T = max threads, P = CONV_BWD_PIECES:
 *   col [T][R*KKC]    per-thread im2col / dcol chunk (absent for pointwise convs)
 *   dw  [P][KKC*OC]   per-piece dW partials
 *   db  [P][OC]       per-piece db partials */
typedef struct {
    size_t rows, col, dw, db; /* rows per chunk; size of one thread's / piece's part */
    size_t dw_base, db_base, total;
} conv_scratch;

static conv_scratch conv_scratch_layout(const dt_window *g, int batch) {
    size_t T = (size_t)dt_cpu_cores(), kkc = (size_t)g->k_h * g->k_w * g->in_c;
    size_t P = batch < CONV_BWD_PIECES ? (size_t)(batch > 0 ? batch : 1) : CONV_BWD_PIECES;
    conv_scratch s;
    s.rows = conv_chunk_rows(g, batch);
    s.col = is_pointwise(g) ? 0 : round16(s.rows * kkc + 16); /* + slack for copy_floats_over */
    s.dw = round16(kkc * g->out_c);
    s.db = round16((size_t)g->out_c);
    s.dw_base = T * s.col;
    s.db_base = s.dw_base + P * s.dw;
    s.total = s.db_base + P * s.db;
    return s;
}

/* Short copies and adds for im2col/col2im: a window row is KW*C floats (3 for a 3x3 kernel on one
 * channel, 96 on 32), too short for memcpy's call and dispatch to pay off. With AVX-512 a masked
 * load covers the tail, so 3 or 9 floats are one instruction. */
static inline void add_floats(float *restrict d, const float *restrict s, size_t n) {
#if defined(__AVX512F__)
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(d + i, _mm512_add_ps(_mm512_loadu_ps(d + i), _mm512_loadu_ps(s + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, d + i), _mm512_maskz_loadu_ps(m, s + i));
        _mm512_mask_storeu_ps(d + i, m, v);
    }
#else
    for (size_t i = 0; i < n; i++) d[i] += s[i];
#endif
}

/* Copy / zero n floats, possibly writing up to 15 floats past d + n (never reading past s + n):
 * im2col fills col strictly in order, so whatever lands past the end is overwritten by the next
 * copy, and the col scratch has 16 floats of slack. Full-width stores avoid masked stores, which
 * are slow on AMD (im2col 20-30% faster than with masked stores). */
static inline void copy_floats_over(float *d, const float *s, size_t n) {
#if defined(__AVX512F__)
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(d + i, _mm512_loadu_ps(s + i));
    if (i < n) _mm512_storeu_ps(d + i, _mm512_maskz_loadu_ps((__mmask16)((1u << (n - i)) - 1), s + i));
#else
    memcpy(d, s, n * sizeof(float));
#endif
}

static inline void zero_floats_over(float *d, size_t n) {
#if defined(__AVX512F__)
    for (size_t i = 0; i < n; i += 16) _mm512_storeu_ps(d + i, _mm512_setzero_ps());
#else
    memset(d, 0, n * sizeof(float));
#endif
}

/* Output columns ow in [lo, hi) have their whole window inside the image horizontally. */
static inline void inside_cols(const dt_window *g, int *lo, int *hi) {
    const int sw = g->stride_w, pl = g->pad_left, span = g->in_w - g->k_w + pl;
    *lo = (pl + sw - 1) / sw;
    *hi = span >= 0 ? span / sw + 1 : 0;
    if (*hi > g->out_w) *hi = g->out_w;
    if (*lo > *hi) *lo = *hi;
}

/* col [p1-p0, KH*KW*C] = the input windows of output positions p0..p1 (p = (n*OH + oh)*OW + ow).
 * Padding cells are zeros. One window row (KW*C floats) is contiguous in NHWC, so inside the image
 * it is one copy. Walks one output row at a time (bounds worked out once per row) and writes col
 * strictly in order (see copy_floats_over). */
DT_HOT static void im2col(float *col, const float *in, const dt_window *g, size_t p0, size_t p1) {
    const int H = g->in_h, W = g->in_w, C = g->in_c, KH = g->k_h, KW = g->k_w, OW = g->out_w;
    const size_t ohw = (size_t)g->out_h * OW, kwc = (size_t)KW * C, kkc = KH * kwc;
    const size_t img_size = (size_t)H * W * C, step = (size_t)g->stride_w * C;
    int lo, hi;
    inside_cols(g, &lo, &hi);
    for (size_t p = p0; p < p1;) {
        const size_t n = p / ohw, r = p % ohw;
        const int oh = (int)(r / OW), ow_a = (int)(r % OW);
        const int ow_b = (size_t)(OW - ow_a) < p1 - p ? OW : ow_a + (int)(p1 - p);
        const int ih0 = oh * g->stride_h - g->pad_top;
        /* kernel rows [kh_lo, kh_hi) fall inside the image */
        const int kh_lo = ih0 < 0 ? (-ih0 < KH ? -ih0 : KH) : 0;
        const int kh_hi = ih0 + KH > H ? (H - ih0 > kh_lo ? H - ih0 : kh_lo) : KH;
        const float *img = in + n * img_size;
        float *d = col + (p - p0) * kkc;
        for (int ow = ow_a; ow < ow_b; ow++) {
            if (kh_lo > 0) zero_floats_over(d, (size_t)kh_lo * kwc);
            if (ow >= lo && ow < hi) {
                const float *src = img + (size_t)ow * step - (size_t)g->pad_left * C; /* iw0 >= 0 */
                for (int kh = kh_lo; kh < kh_hi; kh++)
                    copy_floats_over(d + (size_t)kh * kwc, src + (size_t)(ih0 + kh) * W * C, kwc);
            } else {
                const int iw0 = ow * g->stride_w - g->pad_left;
                for (int kh = kh_lo; kh < kh_hi; kh++) {
                    const float *row = img + (size_t)(ih0 + kh) * W * C;
                    for (int kw = 0; kw < KW; kw++) {
                        const int iw = iw0 + kw;
                        float *dk = d + (size_t)kh * kwc + (size_t)kw * C;
                        if (iw < 0 || iw >= W) zero_floats_over(dk, C);
                        else copy_floats_over(dk, row + (size_t)iw * C, C);
                    }
                }
            }
            if (kh_hi < KH) zero_floats_over(d + (size_t)kh_hi * kwc, (size_t)(KH - kh_hi) * kwc);
            d += kkc;
        }
        p += (size_t)(ow_b - ow_a);
    }
}

/* din += scatter of dcol [p1-p0, KH*KW*C] (the adjoint of im2col; padding cells are dropped).
 * Position by position: consecutive windows overlap, and interleaving kernel rows keeps the
 * read-modify-writes of one din cell apart. */
DT_HOT static void col2im(float *din, const float *dcol, const dt_window *g, size_t p0, size_t p1) {
    const int H = g->in_h, W = g->in_w, C = g->in_c, KH = g->k_h, KW = g->k_w;
    const size_t ohw = (size_t)g->out_h * g->out_w, kwc = (size_t)KW * C, kkc = KH * kwc;
    const size_t img_size = (size_t)H * W * C;
    size_t n = p0 / ohw, r = p0 % ohw;
    int oh = (int)(r / g->out_w), ow = (int)(r % g->out_w);
    for (size_t p = p0; p < p1; p++) {
        float *img = din + n * img_size;
        const float *src = dcol + (p - p0) * kkc;
        int ih0 = oh * g->stride_h - g->pad_top, iw0 = ow * g->stride_w - g->pad_left;
        int kw_lo = iw0 < 0 ? -iw0 : 0, kw_hi = iw0 + KW > W ? W - iw0 : KW;
        for (int kh = 0; kh < KH; kh++, src += kwc) {
            int ih = ih0 + kh;
            if (ih < 0 || ih >= H) continue;
            /* window column kw maps to image column iw0 + kw; only in-image columns receive */
            float *d = img + ((size_t)ih * W + iw0 + kw_lo) * C;
            const float *s = src + (size_t)kw_lo * C;
            add_floats(d, s, (size_t)(kw_hi - kw_lo) * C);
        }
        if (++ow == g->out_w) {
            ow = 0;
            if (++oh == g->out_h) oh = 0, n++;
        }
    }
}

static void im2col_forward(const dt_cpu *cpu, float *out, const float *in, const float *w, const float *b, int batch,
                           const dt_window *g, float *scratch) {
    const int KKC = g->k_h * g->k_w * g->in_c, OC = g->out_c;
    const size_t total = (size_t)batch * g->out_h * g->out_w;
    const conv_scratch s = conv_scratch_layout(g, batch);
    const int pointwise = is_pointwise(g);
    /* Chunks sized for the cores, not for this context's threads: OpenBLAS may round a row of a
     * product by where it falls in it, so chunks that depend on the shape (and the machine) only
     * give the same bits at any thread count. */
    const size_t pieces = (size_t)dt_cpu_cores() * PIECES_PER_THREAD;
    int nt = 1;
    size_t rows = (total + pieces - 1) / pieces;
    if (rows < 64) rows = 64;
    if (rows > s.rows) rows = s.rows;
    const size_t nchunks = (total + rows - 1) / rows;
    nt = dt_cpu_par(cpu, conv_flops(g, batch), DT_PAR_FLOPS, par_cap(nchunks));
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (size_t k = 0; k < nchunks; k++) {
        size_t p0 = k * rows, p1 = p0 + rows < total ? p0 + rows : total;
        int R = (int)(p1 - p0);
        const float *A = in + p0 * g->in_c;
        if (!pointwise) {
            float *col = scratch + (size_t)omp_get_thread_num() * s.col;
            im2col(col, in, g, p0, p1);
            A = col;
        }
        float *o = out + p0 * OC;
        gemm1(cpu, 0, 0, R, OC, KKC, 1.0f, A, KKC, w, OC, 0.0f, o, OC);
        if (b)
            for (int r = 0; r < R; r++)
                for (int c = 0; c < OC; c++) o[(size_t)r * OC + c] += b[c];
    }
}

static void im2col_backward(const dt_cpu *cpu, float *din, float *dw, float *db, const float *dout, const float *in,
                            const float *w, int batch, const dt_window *g, float *scratch) {
    const int KKC = g->k_h * g->k_w * g->in_c, OC = g->out_c;
    const size_t ohw = (size_t)g->out_h * g->out_w, img_size = (size_t)g->in_h * g->in_w * g->in_c;
    const conv_scratch s = conv_scratch_layout(g, batch);
    const int pointwise = is_pointwise(g);
    const size_t ndw = (size_t)KKC * OC;
    /* Pieces are groups of whole examples, so the scatters (col2im) of different threads never
     * touch the same din. */
    const size_t npieces = batch < CONV_BWD_PIECES ? (size_t)(batch > 0 ? batch : 0) : CONV_BWD_PIECES;
    int nt = dt_cpu_par(cpu, conv_flops(g, batch), DT_PAR_FLOPS, par_cap(npieces));
#pragma omp parallel num_threads(nt)
    {
        float *col = scratch + (size_t)omp_get_thread_num() * s.col;
#pragma omp for schedule(dynamic, 1)
        for (size_t piece = 0; piece < npieces; piece++) {
            float *dwp = scratch + s.dw_base + piece * s.dw, *dbp = scratch + s.db_base + piece * s.db;
            memset(dwp, 0, ndw * sizeof(float));
            memset(dbp, 0, OC * sizeof(float));
            size_t n0 = (size_t)batch * piece / npieces, n1 = (size_t)batch * (piece + 1) / npieces;
            if (din && !pointwise) memset(din + n0 * img_size, 0, (n1 - n0) * img_size * sizeof(float));
            for (size_t p0 = n0 * ohw; p0 < n1 * ohw; p0 += s.rows) {
                size_t p1 = p0 + s.rows < n1 * ohw ? p0 + s.rows : n1 * ohw;
                int R = (int)(p1 - p0);
                const float *dout_c = dout + p0 * OC;
                if (db)
                    for (int r = 0; r < R; r++)
                        for (int c = 0; c < OC; c++) dbp[c] += dout_c[(size_t)r * OC + c];
                if (pointwise) {
                    /* col is the input itself, dcol is din itself (no overlap to scatter). */
                    gemm1(cpu, 1, 0, KKC, OC, R, 1.0f, in + p0 * KKC, KKC, dout_c, OC, 1.0f, dwp, OC);
                    if (din)
                        gemm1(cpu, 0, 1, R, KKC, OC, 1.0f, dout_c, OC, w, OC, 0.0f, din + p0 * KKC, KKC);
                    continue;
                }
                im2col(col, in, g, p0, p1);
                gemm1(cpu, 1, 0, KKC, OC, R, 1.0f, col, KKC, dout_c, OC, 1.0f, dwp, OC); /* dW += col^T dout */
                if (din) {
                    gemm1(cpu, 0, 1, R, KKC, OC, 1.0f, dout_c, OC, w, OC, 0.0f, col, KKC); /* dcol = dout W^T */
                    col2im(din, col, g, p0, p1);
                }
            }
        }
        /* Sum the partials in piece order (the implicit barrier above has them all ready). */
#pragma omp for schedule(static)
        for (size_t i = 0; i < ndw; i++) {
            float sum = 0.0f;
            for (size_t piece = 0; piece < npieces; piece++) sum += scratch[s.dw_base + piece * s.dw + i];
            dw[i] = sum;
        }
    }
    if (db)
        for (int c = 0; c < OC; c++) {
            float sum = 0.0f;
            for (size_t piece = 0; piece < npieces; piece++) sum += scratch[s.db_base + piece * s.db + c];
            db[c] = sum;
        }
}


/* ---- convolution entry points -------------------------------------------------------------- */

/* Winograd where it applies, in float32 only. Its products multiply transformed tiles (sums and
 * differences of inputs, and of kernel taps) that the output transform combines again with
 * cancellation: rounded to bf16, they left the layer 1.35-1.53x the root-mean-square error of PyTorch's
 * bf16 autocast (which rounds im2col's operands and the output), and im2col's bf16 products 0.72-0.84x
 * (tests/fixtures/gen_bf16_fixtures.py prints both per layer; docs/memory-layout.md, "Precision"). */
static int use_wino(const dt_cpu *cpu, const dt_window *g) { return !cpu->bf16 && dt_wino_applies(g); }

size_t dt_conv2d_scratch_floats(const dt_window *g, int batch) {
    size_t s = conv_scratch_layout(g, batch).total; /* im2col's: every layer in bf16 */
    if (dt_wino_applies(g) && dt_wino_scratch_floats(g, batch) > s) s = dt_wino_scratch_floats(g, batch);
    return s;
}

void dt_conv2d_forward(const dt_cpu *cpu, float *out, const float *in, const float *w, const float *b, int batch,
                       const dt_window *g, float *scratch) {
    if (use_wino(cpu, g)) dt_wino_forward(cpu, out, in, w, b, batch, g, scratch);
    else im2col_forward(cpu, out, in, w, b, batch, g, scratch);
}

void dt_conv2d_backward(const dt_cpu *cpu, float *din, float *dw, float *db, const float *dout, const float *in,
                        const float *w, int batch, const dt_window *g, float *scratch) {
    if (use_wino(cpu, g)) dt_wino_backward(cpu, din, dw, db, dout, in, w, batch, g, scratch);
    else im2col_backward(cpu, din, dw, db, dout, in, w, batch, g, scratch);
}

/* ---- fused convolution + max pooling ------------------------------------------------------ */
/* The conv output of a first layer is the biggest tensor of a step (cats-vs-dogs: 128x128x32 per
 * example, 134 MB at batch 64); pooling it right after it is computed, a few rows at a time, keeps
 * it in cache: it is never written to or read back from memory, and backward rebuilds each chunk of
 * the conv gradient from the pooled gradient and argmax in cache too. */

int dt_conv2d_maxpool_fusable(const dt_window *conv, const dt_window *pool) {
    return pool->in_h == conv->out_h && pool->in_w == conv->out_w && pool->in_c == conv->out_c &&
           pool->out_c == pool->in_c && pool->k_h <= pool->stride_h && pool->k_w <= pool->stride_w &&
           !dt_wino_applies(conv);
}

/* Work unit: pooled rows [r0, r1) of one example, computed from conv rows [cr0, cr1). Groups
 * hold about one GEMM chunk of conv positions; with pool k <= stride their conv rows never
 * overlap. Scratch: the conv scratch, then per thread a cbuf [group conv rows * OW * OC]. */
typedef struct {
    conv_scratch cs;
    int prows, groups;
    size_t cbuf, cbuf_base, total;
} fused_scratch;

static fused_scratch fused_layout(const dt_window *cg, const dt_window *pg, int batch) {
    fused_scratch f;
    f.cs = conv_scratch_layout(cg, batch);
    size_t per_prow = (size_t)pg->stride_h * cg->out_w; /* conv positions per pooled row */
    size_t prows = f.cs.rows / per_prow;
    if (prows < 1) prows = 1;
    if (prows > (size_t)pg->out_h) prows = (size_t)pg->out_h;
    f.prows = (int)prows;
    f.groups = (pg->out_h + f.prows - 1) / f.prows;
    size_t crows = prows * pg->stride_h;
    if (crows > (size_t)cg->out_h) crows = (size_t)cg->out_h;
    f.cbuf = round16(crows * cg->out_w * cg->out_c);
    f.cbuf_base = f.cs.total;
    f.total = f.cbuf_base + (size_t)dt_cpu_cores() * f.cbuf;
    return f;
}

size_t dt_conv2d_maxpool_scratch_floats(const dt_window *conv, const dt_window *pool, int batch) {
    return fused_layout(conv, pool, batch).total;
}

/* Conv rows [cr0, cr1) that pooled rows [r0, r1) read. */
static inline void fused_conv_rows(const dt_window *cg, const dt_window *pg, int r0, int r1, int *cr0,
                                   int *cr1) {
    int a = r0 * pg->stride_h - pg->pad_top, z = (r1 - 1) * pg->stride_h - pg->pad_top + pg->k_h;
    *cr0 = a < 0 ? 0 : a;
    *cr1 = z > cg->out_h ? cg->out_h : z;
}

void dt_conv2d_maxpool_forward(const dt_cpu *cpu, float *out, int32_t *argmax, const float *in, const float *w,
                               const float *b, int batch, const dt_window *cg, const dt_window *pg, float *scratch) {
    const int KKC = cg->k_h * cg->k_w * cg->in_c, OC = cg->out_c, OW = cg->out_w, PH = pg->out_h;
    const fused_scratch f = fused_layout(cg, pg, batch);
    const int pointwise = is_pointwise(cg);
    const size_t units = (size_t)batch * f.groups, prow_size = (size_t)pg->out_w * OC;
    int nt = dt_cpu_par(cpu, conv_flops(cg, batch), DT_PAR_FLOPS, par_cap(units));
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (size_t u = 0; u < units; u++) {
        const int t = omp_get_thread_num();
        float *col = scratch + (size_t)t * f.cs.col, *cbuf = scratch + f.cbuf_base + (size_t)t * f.cbuf;
        const size_t n = u / f.groups;
        const int r0 = (int)(u % f.groups) * f.prows, r1 = r0 + f.prows < PH ? r0 + f.prows : PH;
        int cr0, cr1;
        fused_conv_rows(cg, pg, r0, r1, &cr0, &cr1);
        const size_t p0 = (n * cg->out_h + cr0) * OW, p1 = (n * cg->out_h + cr1) * OW;
        for (size_t q0 = p0; q0 < p1; q0 += f.cs.rows) {
            size_t q1 = q0 + f.cs.rows < p1 ? q0 + f.cs.rows : p1;
            const float *A = in + q0 * cg->in_c;
            if (!pointwise) {
                im2col(col, in, cg, q0, q1);
                A = col;
            }
            float *o = cbuf + (q0 - p0) * OC;
            gemm1(cpu, 0, 0, (int)(q1 - q0), OC, KKC, 1.0f, A, KKC, w, OC, 0.0f, o, OC);
            if (b)
                for (size_t r = 0; r < q1 - q0; r++)
                    for (int c = 0; c < OC; c++) o[r * OC + c] += b[c];
        }
        for (int r = r0; r < r1; r++) {
            size_t o_off = (n * PH + r) * prow_size;
            dt_maxpool_row(out + o_off, argmax + o_off, cbuf, (size_t)cr0 * OW * OC, pg, r);
        }
    }
}

void dt_conv2d_maxpool_backward(const dt_cpu *cpu, float *din, float *dw, float *db, const float *dout,
                                const int32_t *argmax, const float *in, const float *w, int batch,
                                const dt_window *cg, const dt_window *pg, float *scratch) {
    const int KKC = cg->k_h * cg->k_w * cg->in_c, OC = cg->out_c, OW = cg->out_w, PH = pg->out_h;
    const fused_scratch f = fused_layout(cg, pg, batch);
    const conv_scratch *s = &f.cs;
    const int pointwise = is_pointwise(cg);
    const size_t img_size = (size_t)cg->in_h * cg->in_w * cg->in_c, ndw = (size_t)KKC * OC;
    const size_t prow_size = (size_t)pg->out_w * OC;
    const size_t npieces = batch < CONV_BWD_PIECES ? (size_t)(batch > 0 ? batch : 0) : CONV_BWD_PIECES;
    int nt = dt_cpu_par(cpu, conv_flops(cg, batch), DT_PAR_FLOPS, par_cap(npieces));
#pragma omp parallel num_threads(nt)
    {
        const int t = omp_get_thread_num();
        float *col = scratch + (size_t)t * s->col, *cbuf = scratch + f.cbuf_base + (size_t)t * f.cbuf;
#pragma omp for schedule(dynamic, 1)
        for (size_t piece = 0; piece < npieces; piece++) {
            float *dwp = scratch + s->dw_base + piece * s->dw, *dbp = scratch + s->db_base + piece * s->db;
            memset(dwp, 0, ndw * sizeof(float));
            memset(dbp, 0, OC * sizeof(float));
            size_t n0 = (size_t)batch * piece / npieces, n1 = (size_t)batch * (piece + 1) / npieces;
            /* conv rows no pool window reads get no gradient: zero all, then accumulate */
            if (din) memset(din + n0 * img_size, 0, (n1 - n0) * img_size * sizeof(float));
            for (size_t n = n0; n < n1; n++)
                for (int gi = 0; gi < f.groups; gi++) {
                    const int r0 = gi * f.prows, r1 = r0 + f.prows < PH ? r0 + f.prows : PH;
                    int cr0, cr1;
                    fused_conv_rows(cg, pg, r0, r1, &cr0, &cr1);
                    const size_t p0 = (n * cg->out_h + cr0) * OW, p1 = (n * cg->out_h + cr1) * OW;
                    const size_t off = (size_t)cr0 * OW * OC;
                    /* dconv for these rows: the pooled gradient routed through argmax */
                    memset(cbuf, 0, (p1 - p0) * OC * sizeof(float));
                    for (int r = r0; r < r1; r++) {
                        const size_t o_off = (n * PH + r) * prow_size;
                        const float *go = dout + o_off;
                        const int32_t *am = argmax + o_off;
                        for (size_t j = 0; j < prow_size; j++) cbuf[am[j] - off] += go[j];
                        if (db)
                            for (size_t j = 0; j < prow_size; j += OC)
                                for (int c = 0; c < OC; c++) dbp[c] += go[j + c];
                    }
                    for (size_t q0 = p0; q0 < p1; q0 += s->rows) {
                        const size_t q1 = q0 + s->rows < p1 ? q0 + s->rows : p1;
                        const int R = (int)(q1 - q0);
                        const float *dc = cbuf + (q0 - p0) * OC;
                        if (pointwise) {
                            gemm1(cpu, 1, 0, KKC, OC, R, 1.0f, in + q0 * KKC, KKC, dc, OC, 1.0f, dwp, OC);
                            if (din) gemm1(cpu, 0, 1, R, KKC, OC, 1.0f, dc, OC, w, OC, 1.0f, din + q0 * KKC, KKC);
                            continue;
                        }
                        im2col(col, in, cg, q0, q1);
                        gemm1(cpu, 1, 0, KKC, OC, R, 1.0f, col, KKC, dc, OC, 1.0f, dwp, OC);
                        if (din) {
                            gemm1(cpu, 0, 1, R, KKC, OC, 1.0f, dc, OC, w, OC, 0.0f, col, KKC);
                            col2im(din, col, cg, q0, q1);
                        }
                    }
                }
        }
#pragma omp for schedule(static)
        for (size_t i = 0; i < ndw; i++) {
            float sum = 0.0f;
            for (size_t piece = 0; piece < npieces; piece++) sum += scratch[s->dw_base + piece * s->dw + i];
            dw[i] = sum;
        }
    }
    if (db)
        for (int c = 0; c < OC; c++) {
            float sum = 0.0f;
            for (size_t piece = 0; piece < npieces; piece++) sum += scratch[s->db_base + piece * s->db + c];
            db[c] = sum;
        }
}
