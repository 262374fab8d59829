/* Pooling on the CPU (compute/kernels.h): max pooling (its rows shared with the fused conv + pool of
 * conv_cpu.c), average pooling with TensorFlow's SAME count, global average pooling. */
#include <stdint.h>
#include <string.h>

#include "compute/cpu.h"
#include "compute/kernels.h"

/* ---- max pooling --------------------------------------------------------------------------- */

/* One output row oh of one example: o/am [OW, C]. src holds the example's input from element
 * src_off on (element idx of the example is src[idx - src_off]), so the fused conv + pool can pass
 * a chunk of conv rows. argmax is always the index within the whole example. */
DT_HOT void dt_maxpool_row(float *o, int32_t *am, const float *src, size_t src_off, const dt_window *g,
                           int oh) {
    const int H = g->in_h, W = g->in_w, C = g->in_c, OW = g->out_w;
    const int ih0 = oh * g->stride_h - g->pad_top;
    const int kh_lo = ih0 < 0 ? -ih0 : 0, kh_hi = ih0 + g->k_h > H ? H - ih0 : g->k_h;
    for (int ow = 0; ow < OW; ow++, o += C, am += C) {
        int iw0 = ow * g->stride_w - g->pad_left;
        int kw_lo = iw0 < 0 ? -iw0 : 0, kw_hi = iw0 + g->k_w > W ? W - iw0 : g->k_w;
        /* SAME padding cells are never read, which is the same as padding with -inf. The first
         * in-image cell seeds the max; later cells win only if strictly larger (or NaN, which
         * propagates as in PyTorch). */
        int32_t first = ((ih0 + kh_lo) * W + iw0 + kw_lo) * C;
        const float *f = src + (first - src_off);
        for (int c = 0; c < C; c++) o[c] = f[c], am[c] = first + c;
        for (int kh = kh_lo; kh < kh_hi; kh++)
            for (int kw = kw_lo; kw < kw_hi; kw++) {
                if (kh == kh_lo && kw == kw_lo) continue;
                int32_t idx = ((ih0 + kh) * W + iw0 + kw) * C;
                const float *v = src + (idx - src_off);
                for (int c = 0; c < C; c++) {
                    int win = v[c] > o[c] || v[c] != v[c];
                    o[c] = win ? v[c] : o[c];
                    am[c] = win ? idx + c : am[c];
                }
            }
    }
}

void dt_maxpool_forward(const dt_cpu *cpu, float *out, int32_t *argmax, const float *in, int batch,
                        const dt_window *g) {
    const int OH = g->out_h;
    const size_t img_size = (size_t)g->in_h * g->in_w * g->in_c, rows = (size_t)batch * OH;
    const size_t row_size = (size_t)g->out_w * g->in_c;
    int nt = dt_cpu_par(cpu, (double)(rows * row_size), DT_PAR_STREAM, DT_PAR_ANY);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (size_t row = 0; row < rows; row++)
        dt_maxpool_row(out + row * row_size, argmax + row * row_size, in + (row / OH) * img_size, 0, g,
                    (int)(row % OH));
}

void dt_maxpool_backward(const dt_cpu *cpu, float *din, const float *dout, const int32_t *argmax, int batch,
                         const dt_window *g) {
    const size_t img_size = (size_t)g->in_h * g->in_w * g->in_c;
    const size_t out_size = (size_t)g->out_h * g->out_w * g->in_c;
    int nt = dt_cpu_par(cpu, (double)(batch * img_size), DT_PAR_STREAM, DT_PAR_ANY);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int n = 0; n < batch; n++) {
        float *d = din + (size_t)n * img_size;
        const float *go = dout + (size_t)n * out_size;
        const int32_t *am = argmax + (size_t)n * out_size;
        memset(d, 0, img_size * sizeof(float));
        for (size_t i = 0; i < out_size; i++) d[am[i]] += go[i];
    }
}

/* ---- average pooling ----------------------------------------------------------------------- */

/* The window of output (oh, ow) clipped to the image: rows [h0, h1), columns [w0, w1). */
static inline void avg_window(const dt_window *g, int oh, int ow, int *h0, int *h1, int *w0, int *w1) {
    int ih = oh * g->stride_h - g->pad_top, iw = ow * g->stride_w - g->pad_left;
    *h0 = ih < 0 ? 0 : ih;
    *h1 = ih + g->k_h > g->in_h ? g->in_h : ih + g->k_h;
    *w0 = iw < 0 ? 0 : iw;
    *w1 = iw + g->k_w > g->in_w ? g->in_w : iw + g->k_w;
}

void dt_avgpool_forward(const dt_cpu *cpu, float *out, const float *in, int batch, const dt_window *g) {
    const int OH = g->out_h, OW = g->out_w, C = g->in_c;
    const size_t img = (size_t)g->in_h * g->in_w * C, rows = (size_t)batch * OH;
    int nt = dt_cpu_par(cpu, (double)(rows * OW * C), DT_PAR_STREAM, DT_PAR_ANY);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (size_t row = 0; row < rows; row++) {
        const float *x = in + (row / OH) * img;
        int oh = (int)(row % OH);
        for (int ow = 0; ow < OW; ow++) {
            float *o = out + (row * OW + ow) * C;
            int h0, h1, w0, w1;
            avg_window(g, oh, ow, &h0, &h1, &w0, &w1);
            for (int c = 0; c < C; c++) o[c] = 0;
            for (int h = h0; h < h1; h++)
                for (int w = w0; w < w1; w++) {
                    const float *v = x + ((size_t)h * g->in_w + w) * C;
                    for (int c = 0; c < C; c++) o[c] += v[c];
                }
            float inv = 1.0f / (float)((h1 - h0) * (w1 - w0));
            for (int c = 0; c < C; c++) o[c] *= inv;
        }
    }
}

void dt_avgpool_backward(const dt_cpu *cpu, float *din, const float *dout, int batch, const dt_window *g) {
    const int OH = g->out_h, OW = g->out_w, C = g->in_c;
    const size_t img = (size_t)g->in_h * g->in_w * C, osz = (size_t)OH * OW * C;
    int nt = dt_cpu_par(cpu, (double)(batch * img), DT_PAR_STREAM, DT_PAR_ANY);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int n = 0; n < batch; n++) {
        float *d = din + (size_t)n * img;
        memset(d, 0, img * sizeof(float));
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++) {
                const float *go = dout + (size_t)n * osz + ((size_t)oh * OW + ow) * C;
                int h0, h1, w0, w1;
                avg_window(g, oh, ow, &h0, &h1, &w0, &w1);
                float inv = 1.0f / (float)((h1 - h0) * (w1 - w0));
                for (int h = h0; h < h1; h++)
                    for (int w = w0; w < w1; w++) {
                        float *v = d + ((size_t)h * g->in_w + w) * C;
                        for (int c = 0; c < C; c++) v[c] += go[c] * inv;
                    }
            }
    }
}

void dt_global_avgpool_forward(const dt_cpu *cpu, float *out, const float *in, int batch, int hw, int C) {
    for (int n = 0; n < batch; n++) {
        float *o = out + (size_t)n * C;
        const float *x = in + (size_t)n * hw * C;
        for (int c = 0; c < C; c++) o[c] = 0;
        for (int p = 0; p < hw; p++)
            for (int c = 0; c < C; c++) o[c] += x[(size_t)p * C + c];
        for (int c = 0; c < C; c++) o[c] /= (float)hw;
    }
}

void dt_global_avgpool_backward(const dt_cpu *cpu, float *din, const float *dout, int batch, int hw, int C) {
    int nt = dt_cpu_par(cpu, (double)((size_t)batch * hw * C), DT_PAR_STREAM, DT_PAR_ANY);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int n = 0; n < batch; n++)
        for (int p = 0; p < hw; p++) {
            float *d = din + ((size_t)n * hw + p) * C;
            const float *go = dout + (size_t)n * C;
            for (int c = 0; c < C; c++) d[c] = go[c] / (float)hw;
        }
}
