/* Batch norm on the CPU (compute/kernels.h): training statistics and their backward, summed in a
 * fixed order so results do not depend on the thread count; the affine map of evaluation (and of a
 * norm whose output goes straight into a residual sum). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "compute/cpu.h"
#include "compute/kernels.h"

/* Rows per batch-norm piece: a piece's partial sums are C doubles, its rows stay in cache. */
#define BN_PIECE 256

/* ---- batch norm ---------------------------------------------------------------------------- */

/* Each piece's sums (double: dbeta and the conv bias before a norm are sums that cancel) go into
 * work [2][C] per piece, and the pieces are combined in piece order: the same result for any
 * thread count. */
static size_t bn_pieces(size_t rows) { return (rows + BN_PIECE - 1) / BN_PIECE; }

size_t dt_batchnorm_work_doubles(size_t rows, int C) { return bn_pieces(rows) * 2 * (size_t)C; }

static double *bn_piece_sums(double *work, size_t p, int C) { return work + p * 2 * (size_t)C; }

/* Channels in blocks of BN_BLOCK when C is a multiple of it: a block's sums then stay in registers
 * over a piece's rows. Summed into work directly, each row stored and reloaded the sums and waited
 * for the previous row's store (batch norm was 15% of the resnet model's step). The order of the
 * additions is the same either way. */
#define BN_BLOCK 16

/* Sums and sums of squares of rows [r0, r1) shifted by k, channels [0, BN_BLOCK) of x (rows C apart). */
static inline void bn_stats_block(double *s, double *q, const float *x, const float *k, size_t r0, size_t r1,
                                  int C) {
    double sa[BN_BLOCK] = {0}, qa[BN_BLOCK] = {0};
    for (size_t r = r0; r < r1; r++) {
        const float *xr = x + r * (size_t)C;
#pragma omp simd
        for (int c = 0; c < BN_BLOCK; c++) {
            double d = (double)xr[c] - k[c];
            sa[c] += d;
            qa[c] += d * d;
        }
    }
    for (int c = 0; c < BN_BLOCK; c++) s[c] = sa[c], q[c] = qa[c];
}

void dt_batchnorm_forward(const dt_cpu *cpu, float *out, float *mean, float *var, float *inv_std, float *scale,
                          float *shift, const float *in, const float *gamma, const float *beta, size_t rows, int C,
                          float eps, int relu, double *work) {
    const size_t np = bn_pieces(rows), n = rows * (size_t)C;
    int nt = dt_cpu_par(cpu, (double)(n), DT_PAR_STREAM, DT_PAR_ANY);
    /* One pass: sums and sums of squares per piece, in double. Each piece is shifted by its first
     * row, so the squares do not cancel even when the mean is far larger than the spread. */
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (size_t p = 0; p < np; p++) {
        double *s = bn_piece_sums(work, p, C), *q = s + C;
        size_t r0 = p * BN_PIECE, r1 = (p + 1) * BN_PIECE < rows ? (p + 1) * BN_PIECE : rows;
        const float *k = in + r0 * (size_t)C;
        if (C % BN_BLOCK == 0) {
            for (int c0 = 0; c0 < C; c0 += BN_BLOCK) bn_stats_block(s + c0, q + c0, in + c0, k + c0, r0, r1, C);
            continue;
        }
        for (int c = 0; c < C; c++) s[c] = q[c] = 0;
        for (size_t r = r0; r < r1; r++) {
            const float *x = in + r * (size_t)C;
#pragma omp simd
            for (int c = 0; c < C; c++) {
                double d = (double)x[c] - k[c];
                s[c] += d;
                q[c] += d * d;
            }
        }
    }
    /* Pieces combined in order (Chan et al.): count, mean and squared deviations M2. */
    for (int c = 0; c < C; c++) {
        double cnt = 0, m = 0, m2 = 0;
        for (size_t p = 0; p < np; p++) {
            size_t r0 = p * BN_PIECE, r1 = (p + 1) * BN_PIECE < rows ? (p + 1) * BN_PIECE : rows;
            const double *sd = bn_piece_sums(work, p, C);
            double nb = (double)(r1 - r0), sb = sd[c], qb = sd[C + c];
            double mb = in[r0 * (size_t)C + c] + sb / nb, m2b = qb - sb * sb / nb;
            double delta = mb - m, tot = cnt + nb;
            m += delta * nb / tot;
            m2 += m2b + delta * delta * cnt * nb / tot;
            cnt = tot;
        }
        double v = m2 / (double)rows;
        if (v < 0) v = 0; /* rounding can leave a constant channel's M2 a hair below zero */
        mean[c] = (float)m;
        var[c] = (float)v;
        inv_std[c] = (float)(1.0 / sqrt(v + eps));
    }
    for (int c = 0; c < C; c++) {
        scale[c] = gamma[c] * inv_std[c];
        shift[c] = beta[c] - mean[c] * scale[c];
    }
    if (out) dt_channel_affine_forward(cpu, out, in, scale, shift, rows, C, relu);
}

/* dout with forward's ReLU applied if relu: zero where the norm's output was not positive. */
static inline float bn_relu_grad(const float *dy, const float *x, const float *scale, const float *shift, int c,
                                 const int relu) {
    float d = dy[c];
    if (!relu) return d;
    float v = x[c] * scale[c] + shift[c];
    uint32_t bits;
    memcpy(&bits, &d, sizeof bits);
    bits &= -(uint32_t)(v > 0.0f); /* a mask, not a branch: GCC keeps a ?: here scalar */
    memcpy(&d, &bits, sizeof d);
    return d;
}

/* One row of backward's first pass: sb += g, sg += g * xhat, with g = dout (masked if relu). */
static inline void bn_backward_sums_row(double *sb, double *sg, const float *x, const float *dy, const float *mean,
                                        const float *inv_std, const float *scale, const float *shift, int C,
                                        const int relu) {
#pragma omp simd
    for (int c = 0; c < C; c++) {
        float g = bn_relu_grad(dy, x, scale, shift, c, relu);
        sb[c] += g;
        sg[c] += (double)g * ((x[c] - mean[c]) * inv_std[c]);
    }
}

/* One row of backward's second pass: dx = gamma * inv_std * (g - mb - xhat * mg), in double and
 * rounded once: the bracket is a difference of nearly equal terms (docs/model-format.md). */
static inline void bn_backward_din_row(float *dx, const float *x, const float *dy, const float *mean,
                                       const float *inv_std, const float *gamma, const double *mb, const double *mg,
                                       const float *scale, const float *shift, int C, const int relu) {
#pragma omp simd
    for (int c = 0; c < C; c++) {
        double xh = ((double)x[c] - mean[c]) * inv_std[c];
        float g = bn_relu_grad(dy, x, scale, shift, c, relu);
        dx[c] = (float)((double)(gamma[c] * inv_std[c]) * ((double)g - mb[c] - xh * mg[c]));
    }
}

/* bn_backward_sums_row over rows [r0, r1) for channels [0, BN_BLOCK) (pointers offset to the
 * block), the sums in registers. */
static inline void bn_backward_sums_block(double *sb, double *sg, const float *x, const float *dy, const float *mean,
                                          const float *inv_std, const float *scale, const float *shift, size_t r0,
                                          size_t r1, int C, const int relu) {
    double ba[BN_BLOCK] = {0}, ga[BN_BLOCK] = {0};
    for (size_t r = r0; r < r1; r++) {
        const float *xr = x + r * (size_t)C, *dr = dy + r * (size_t)C;
#pragma omp simd
        for (int c = 0; c < BN_BLOCK; c++) {
            float g = bn_relu_grad(dr, xr, scale, shift, c, relu);
            ba[c] += g;
            ga[c] += (double)g * ((xr[c] - mean[c]) * inv_std[c]);
        }
    }
    for (int c = 0; c < BN_BLOCK; c++) sb[c] = ba[c], sg[c] = ga[c];
}

void dt_batchnorm_backward(const dt_cpu *cpu, float *din, float *dgamma, float *dbeta, const float *dout,
                           const float *in, const float *mean, const float *inv_std, const float *gamma,
                           const float *scale, const float *shift, size_t rows, int C, double *work) {
    const size_t np = bn_pieces(rows), n = rows * (size_t)C;
    const int relu = scale != NULL;
    int nt = dt_cpu_par(cpu, (double)(n), DT_PAR_STREAM, DT_PAR_ANY);
    /* dbeta = sum dout, dgamma = sum dout * xhat, xhat = (in - mean) * inv_std. The relu test is
     * outside the rows' loops, each with its own inlined copy: inside an OpenMP body it is a
     * variable, and a test in the loop would keep it from being vectorised. */
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (size_t p = 0; p < np; p++) {
        double *sb = bn_piece_sums(work, p, C), *sg = sb + C;
        size_t r0 = p * BN_PIECE, r1 = (p + 1) * BN_PIECE < rows ? (p + 1) * BN_PIECE : rows;
        if (C % BN_BLOCK == 0) {
            for (int c0 = 0; c0 < C; c0 += BN_BLOCK)
                if (relu)
                    bn_backward_sums_block(sb + c0, sg + c0, in + c0, dout + c0, mean + c0, inv_std + c0, scale + c0,
                                           shift + c0, r0, r1, C, 1);
                else
                    bn_backward_sums_block(sb + c0, sg + c0, in + c0, dout + c0, mean + c0, inv_std + c0, NULL,
                                           NULL, r0, r1, C, 0);
            continue;
        }
        for (int c = 0; c < C; c++) sb[c] = sg[c] = 0;
        if (relu)
            for (size_t r = r0; r < r1; r++)
                bn_backward_sums_row(sb, sg, in + r * (size_t)C, dout + r * (size_t)C, mean, inv_std, scale, shift,
                                     C, 1);
        else
            for (size_t r = r0; r < r1; r++)
                bn_backward_sums_row(sb, sg, in + r * (size_t)C, dout + r * (size_t)C, mean, inv_std, scale, shift,
                                     C, 0);
    }
    for (int c = 0; c < C; c++) {
        double tb = 0, tg = 0;
        for (size_t p = 0; p < np; p++) tb += bn_piece_sums(work, p, C)[c], tg += bn_piece_sums(work, p, C)[C + c];
        dbeta[c] = (float)tb;
        dgamma[c] = (float)tg;
    }
    if (!din) return;
    /* din = gamma * inv_std * (dout - dbeta / M - xhat * dgamma / M) */
    double *mb = work, *mg = work + C;
    for (int c = 0; c < C; c++) {
        mb[c] = (double)dbeta[c] / (double)rows;
        mg[c] = (double)dgamma[c] / (double)rows;
    }
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (size_t r = 0; r < rows; r++) {
        const float *x = in + r * (size_t)C, *dy = dout + r * (size_t)C;
        if (relu)
            bn_backward_din_row(din + r * (size_t)C, x, dy, mean, inv_std, gamma, mb, mg, scale, shift, C, 1);
        else
            bn_backward_din_row(din + r * (size_t)C, x, dy, mean, inv_std, gamma, mb, mg, scale, shift, C, 0);
    }
}

void dt_channel_affine_forward(const dt_cpu *cpu, float *out, const float *in, const float *scale, const float *shift,
                               size_t rows, int C, int relu) {
    int nt = dt_cpu_par(cpu, (double)(rows * (size_t)C), DT_PAR_STREAM, DT_PAR_ANY);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (size_t r = 0; r < rows; r++) {
        const float *x = in + r * (size_t)C;
        float *y = out + r * (size_t)C;
        if (relu)
#pragma omp simd
            for (int c = 0; c < C; c++) {
                float v = x[c] * scale[c] + shift[c];
                y[c] = v > 0.0f ? v : 0.0f;
            }
        else
#pragma omp simd
            for (int c = 0; c < C; c++) y[c] = x[c] * scale[c] + shift[c];
    }
}

void dt_channel_affine_add_forward(const dt_cpu *cpu, float *out, const float *in, const float *scale,
                                   const float *shift, const float *b, size_t rows, int C, int relu) {
    int nt = dt_cpu_par(cpu, (double)(rows * (size_t)C), DT_PAR_STREAM, DT_PAR_ANY);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (size_t r = 0; r < rows; r++) {
        const float *x = in + r * (size_t)C, *z = b + r * (size_t)C;
        float *y = out + r * (size_t)C;
        if (relu)
#pragma omp simd
            for (int c = 0; c < C; c++) {
                float v = x[c] * scale[c] + shift[c] + z[c];
                y[c] = v > 0.0f ? v : 0.0f;
            }
        else
#pragma omp simd
            for (int c = 0; c < C; c++) y[c] = x[c] * scale[c] + shift[c] + z[c];
    }
}
