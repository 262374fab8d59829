/* Winograd F(2x2, 3x3) convolution for the CPU backend; conv_cpu.c calls it for the layers
 * dt_wino_applies accepts and runs im2col + GEMM for the rest. */
#include <omp.h>
#include <string.h>

#include "compute/cpu.h"

/* ---- Winograd F(2x2, 3x3) ------------------------------------------------------------------ */
/* 3x3 stride-1 convolutions with enough channels use Winograd's minimal filtering (Lavin & Gray
 * 2015): each 2x2 block of outputs costs 16 multiplies per (c, oc) instead of 36, so the GEMM work
 * drops 2.25x; the transforms are additions over data that stay in cache.
 *   forward   out = A^T [ (G g G^T) . (B^T d B) ] A  per 4x4 input patch d, as 16 GEMMs
 *             M_xi [tiles, OC] = V_xi [tiles, C] @ U_xi [C, OC], xi over the 4x4 transform domain
 *   din       the same forward on dout with the kernel rotated 180 degrees and C/OC swapped
 *             (a stride-1 "full" correlation), so it overwrites din without a scatter
 *   dW        the adjoint in g: dW = G^T [ sum_tiles (A dY A^T) . (B^T d B) ] G, again 16 GEMMs
 *             (C x OC each, summed over tiles) and one small transform at the end.
 * Rounding error stays within a few float ulps of the direct sum (coefficients are 0, +-1, 1/2). */

#ifndef WINO_CHUNK_FLOATS
#define WINO_CHUNK_FLOATS (128 * 1024) /* per thread: transformed inputs + GEMM results */
#endif
#define WINO_MIN_CHANNELS 8 /* below this the GEMMs' K (= C) is too short to pay for transforms */

int dt_wino_applies(const dt_window *g) {
    return g->k_h == 3 && g->k_w == 3 && g->stride_h == 1 && g->stride_w == 1 &&
           g->in_c >= WINO_MIN_CHANNELS && g->out_c >= WINO_MIN_CHANNELS;
}

/* A stride-1 3x3 correlation: in [N, ih, iw, ic] -> out [N, oh, ow, oc]. */
typedef struct {
    int ih, iw, ic, oh, ow, oc, pad_top, pad_left;
} wino_geom;

/* Scratch layout (floats, 16-aligned parts), T = max threads, P = CONV_BWD_PIECES, K = max(C, OC),
 * W = the widest row of the forward or the din pass (max(in_w, out_w)) + 4:
 *   u     [16][C][OC]    transformed kernel (forward) or rotated kernel (din)
 *   zeros [W][K]         one row of zeros: what rows above or below the image read
 *   per thread [T]: v [16][tiles][K], m [16][tiles][K]  transformed inputs and GEMM results,
 *                   rb [4][W][K]  one tile row's input rows after the rows' half of B^T d B
 *   gw    [P][16][C][OC] per-piece dW partials in the transform domain
 *   db    [P][OC]        per-piece db partials */
typedef struct {
    size_t tiles, u_base, zeros_base, thr_base, thr, v, rb, gw_base, gw, db_base, db, total;
} wino_scratch;

/* The stride between the 16 streams of a chunk's transformed data (floats): ld tiles of k floats,
 * plus one cache line, so that the streams, which the transforms write side by side, fall in
 * different cache sets instead of evicting each other (a power-of-two stride maps them all to one). */
static inline size_t wino_xs(size_t ld, int k) { return ld * (size_t)k + 16; }

static wino_scratch wino_scratch_layout(const dt_window *g, int batch) {
    size_t T = (size_t)dt_cpu_cores(), C = (size_t)g->in_c, OC = (size_t)g->out_c;
    size_t K = C > OC ? C : OC, W = (size_t)(g->in_w > g->out_w ? g->in_w : g->out_w) + 4;
    size_t P = batch < CONV_BWD_PIECES ? (size_t)(batch > 0 ? batch : 1) : CONV_BWD_PIECES;
    wino_scratch s;
    s.tiles = WINO_CHUNK_FLOATS / (32 * K); /* v and m together fill one chunk */
    if (s.tiles < 16) s.tiles = 16;
    s.u_base = 0;
    s.zeros_base = round16(16 * C * OC);
    s.thr_base = s.zeros_base + round16(W * K);
    s.v = round16(16 * wino_xs(s.tiles, (int)K));
    s.rb = round16(4 * W * K);
    s.thr = 2 * s.v + s.rb;
    s.gw_base = s.thr_base + T * s.thr;
    s.gw = round16(16 * C * OC);
    s.db_base = s.gw_base + P * s.gw;
    s.db = round16(OC);
    s.total = s.db_base + P * s.db;
    return s;
}

/* u [16][ic][oc] = G g G^T for each (ic, oc); g[kh][kw] = w[kh][kw][c][o] of the HWIO kernel, or
 * for the input gradient (flip) w[2-kh][2-kw][o][c]: the rotated kernel seen from dout's side.
 * Vectorised over oc, which u stores contiguously (and w too, unless flipped): it runs twice per
 * layer and step, and as scalar code it took 2.5% of the resnet model's step, most of it on one
 * thread while the others waited (a 64x64 layer: ~60 us; now a few, too short to share out). */
DT_HOT static void wino_transform_kernel(float *u, const float *w, int C, int OC, int flip) {
    const int ic = flip ? OC : C, oc = flip ? C : OC;
    const size_t xs = (size_t)ic * oc; /* stride between transform points */
    const size_t tap = (size_t)C * OC; /* stride between the kernel's taps k = kh * 3 + kw */
    for (int i = 0; i < ic; i++) {
        const float *wi = flip ? w + i : w + (size_t)i * OC;
        float *ui = u + (size_t)i * oc;
#pragma omp simd
        for (int o = 0; o < oc; o++) {
            float gk[3][3], t[4][3];
            /* the rotated kernel's tap k is the kernel's tap 8 - k, and its (i, o) the kernel's (o, i) */
            for (int k = 0; k < 9; k++)
                gk[k / 3][k % 3] = flip ? wi[(size_t)(8 - k) * tap + (size_t)o * OC] : wi[(size_t)k * tap + o];
            for (int j = 0; j < 3; j++) {
                t[0][j] = gk[0][j];
                t[1][j] = 0.5f * (gk[0][j] + gk[1][j] + gk[2][j]);
                t[2][j] = 0.5f * (gk[0][j] - gk[1][j] + gk[2][j]);
                t[3][j] = gk[2][j];
            }
            for (int r = 0; r < 4; r++) {
                float *d = ui + (size_t)(r * 4) * xs + o;
                d[0] = t[r][0];
                d[xs] = 0.5f * (t[r][0] + t[r][1] + t[r][2]);
                d[2 * xs] = 0.5f * (t[r][0] - t[r][1] + t[r][2]);
                d[3 * xs] = t[r][2];
            }
        }
    }
}

/* The transforms work on runs: consecutive tiles along one row of tiles (image n, tile row ty,
 * tiles tx .. tx + count - 1). Within a run every stream is contiguous, so the loops run over whole
 * rows of floats instead of 16 scattered pointers per tile: with 16 to 64 channels, a tile's own
 * work is a few vectors and the per-tile bookkeeping used to cost more than the arithmetic. */
typedef struct {
    size_t n;
    int ty, tx, count;
} wino_run;

/* The run that starts at tile t and ends at the row's end or at t_end. */
static wino_run wino_run_at(const wino_geom *g, size_t t, size_t t_end) {
    const size_t tw_n = (size_t)(g->ow + 1) / 2, th_n = (size_t)(g->oh + 1) / 2, r = t % (th_n * tw_n);
    wino_run run = {t / (th_n * tw_n), (int)(r / tw_n), (int)(r % tw_n), 0};
    size_t left = tw_n - (size_t)run.tx;
    run.count = (int)(left < t_end - t ? left : t_end - t);
    return run;
}

/* v (16 streams xs floats apart, tile r's C floats at r * C) rows tl ..: B^T d B of the 4x4
 * patches under the run's tiles (zeros outside the image). First the rows' half, t = B^T d, over
 * the run's whole width into rb [4][cols][C]; then the columns' half, t B, tile by tile, four
 * output streams at a time. */
DT_HOT static void wino_input_run(float *v, size_t xs, size_t tl, const float *in, const wino_geom *g,
                                  wino_run run, float *rb, const float *zrow) {
    const int C = g->ic, cols = 2 * run.count + 2;
    const int y0 = 2 * run.ty - g->pad_top, x0 = 2 * run.tx - g->pad_left;
    const float *img = in + run.n * g->ih * g->iw * (size_t)C, *d[4];
    for (int i = 0; i < 4; i++)
        d[i] = (y0 + i >= 0 && y0 + i < g->ih) ? img + (size_t)(y0 + i) * g->iw * C : zrow;
    /* The run's columns [xa, xb) are inside the image; the rest are padding: zero after B^T too. */
    const int xa = x0 < 0 ? (-x0 < cols ? -x0 : cols) : 0;
    const int xb = g->iw - x0 < cols ? (g->iw - x0 > xa ? g->iw - x0 : xa) : cols;
    const size_t rs = (size_t)cols * C, a = (size_t)xa * C, e = (size_t)xb * C;
    const size_t src = (size_t)(x0 + xa) * C; /* where column xa is in an input row */
    float *t0 = rb, *t1 = rb + rs, *t2 = rb + 2 * rs, *t3 = rb + 3 * rs;
    for (int i = 0; i < 4; i++) {
        memset(rb + i * rs, 0, a * sizeof(float));
        memset(rb + i * rs + e, 0, (rs - e) * sizeof(float));
    }
    const float *d0 = d[0] + src, *d1 = d[1] + src, *d2 = d[2] + src, *d3 = d[3] + src;
#pragma omp simd
    for (size_t k = 0; k < e - a; k++) {
        t0[a + k] = d0[k] - d2[k];
        t1[a + k] = d1[k] + d2[k];
        t2[a + k] = d2[k] - d1[k];
        t3[a + k] = d1[k] - d3[k];
    }
    for (int i = 0; i < 4; i++) {
        const float *t = rb + i * rs;
        float *o = v + 4 * i * xs + tl * C;
        for (int k = 0; k < run.count; k++) {
            const float *p = t + (size_t)2 * k * C;
            float *q = o + (size_t)k * C;
#pragma omp simd
            for (int c = 0; c < C; c++) {
                float p0 = p[c], p1 = p[C + c], p2 = p[2 * C + c], p3 = p[3 * C + c];
                q[c] = p0 - p2;
                q[xs + c] = p1 + p2;
                q[2 * xs + c] = p2 - p1;
                q[3 * xs + c] = p1 - p3;
            }
        }
    }
}

/* The rows' half of A^T m A for tiles [0, count) of m [16][xs], in place: m[j] <- x[j] + x[4+j]
 * + x[8+j] and m[4+j] <- x[4+j] - x[8+j] - x[12+j] for each column j of the 4x4 domain. */
DT_HOT static void wino_output_rows(float *m, size_t xs, size_t count, int OC) {
    const size_t len = count * OC;
    for (int j = 0; j < 4; j++) {
        float *x0 = m + j * xs, *x1 = x0 + 4 * xs, *x2 = x0 + 8 * xs, *x3 = x0 + 12 * xs;
#pragma omp simd
        for (size_t k = 0; k < len; k++) {
            float a = x0[k], b = x1[k], c = x2[k], d = x3[k];
            x0[k] = a + b + c;
            x1[k] = b - c - d;
        }
    }
}

/* out (+ b) under the run's tiles from m rows tl .. after wino_output_rows: the columns' half,
 * clipped to the image (the last row or column of tiles may be half outside). */
DT_HOT static void wino_output_run(float *out, const float *b, const float *m, size_t xs, size_t tl,
                                   const wino_geom *g, wino_run run) {
    const int OC = g->oc, oh0 = 2 * run.ty, ow0 = 2 * run.tx;
    const int rows = oh0 + 1 < g->oh ? 2 : 1;
    const int full = ow0 + 2 * run.count <= g->ow ? run.count : run.count - 1; /* tiles with 2 columns */
    for (int i = 0; i < rows; i++) {
        const float *s = m + (4 * i * xs) + tl * OC; /* row i: columns j at s + j * xs */
        float *dst = out + ((run.n * g->oh + (size_t)(oh0 + i)) * g->ow + (size_t)ow0) * OC;
        for (int k = 0; k < run.count; k++) {
            const float *x = s + (size_t)k * OC;
            float *y = dst + (size_t)2 * k * OC;
            if (k < full) {
#pragma omp simd
                for (int c = 0; c < OC; c++) {
                    float bias = b ? b[c] : 0.0f, x1 = x[xs + c], x2 = x[2 * xs + c];
                    y[c] = x[c] + x1 + x2 + bias;
                    y[OC + c] = x1 - x2 - x[3 * xs + c] + bias;
                }
            } else {
#pragma omp simd
                for (int c = 0; c < OC; c++) y[c] = x[c] + x[xs + c] + x[2 * xs + c] + (b ? b[c] : 0.0f);
            }
        }
    }
}

/* z [16][xs] rows tl ..: A dY A^T of the 2x2 blocks of dout under the run's tiles (zeros
 * outside). The rows' half of row i is a combination of dout's two rows (r0, r1 below): i = 0: r0,
 * 1: r0 + r1, 2: r0 - r1, 3: -r1; each i writes its 4 streams. */
static inline float wino_dout_mix(float r0, float r1, int i) {
    return i == 0 ? r0 : i == 1 ? r0 + r1 : i == 2 ? r0 - r1 : -r1;
}

static inline void wino_dout_row(float *o, size_t xs, const float *r0, const float *r1, int i, int count,
                                 int full, int OC) {
    for (int k = 0; k < count; k++) {
        const float *p0 = r0 + (size_t)2 * k * OC, *p1 = r1 + (size_t)2 * k * OC;
        float *q = o + (size_t)k * OC;
        if (k < full) {
#pragma omp simd
            for (int c = 0; c < OC; c++) {
                float ta = wino_dout_mix(p0[c], p1[c], i), tb = wino_dout_mix(p0[OC + c], p1[OC + c], i);
                q[c] = ta;
                q[xs + c] = ta + tb;
                q[2 * xs + c] = ta - tb;
                q[3 * xs + c] = -tb;
            }
        } else {
#pragma omp simd
            for (int c = 0; c < OC; c++) {
                float ta = wino_dout_mix(p0[c], p1[c], i);
                q[c] = ta;
                q[xs + c] = ta;
                q[2 * xs + c] = ta;
                q[3 * xs + c] = 0.0f;
            }
        }
    }
}

DT_HOT static void wino_dout_run(float *z, size_t xs, size_t tl, const float *dout, const wino_geom *g,
                                 wino_run run, const float *zrow) {
    const int OC = g->oc, oh0 = 2 * run.ty, ow0 = 2 * run.tx;
    const int full = ow0 + 2 * run.count <= g->ow ? run.count : run.count - 1;
    const float *r0 = dout + ((run.n * g->oh + (size_t)oh0) * g->ow + (size_t)ow0) * OC;
    const float *r1 = oh0 + 1 < g->oh ? r0 + (size_t)g->ow * OC : zrow;
    /* i as a literal in each call, so each inlined copy folds its coefficients */
    wino_dout_row(z + 0 * xs + tl * OC, xs, r0, r1, 0, run.count, full, OC);
    wino_dout_row(z + 4 * xs + tl * OC, xs, r0, r1, 1, run.count, full, OC);
    wino_dout_row(z + 8 * xs + tl * OC, xs, r0, r1, 2, run.count, full, OC);
    wino_dout_row(z + 12 * xs + tl * OC, xs, r0, r1, 3, run.count, full, OC);
}

/* v and z (either may be NULL) for tiles [t0, t1), rows 0 .. t1 - t0 - 1 of the chunk. */
static void wino_transform_chunk(float *v, float *z, size_t xv, size_t xz, const float *in, const float *dout,
                                 const wino_geom *g, size_t t0, size_t t1, float *rb, const float *zrow) {
    for (size_t t = t0; t < t1;) {
        wino_run run = wino_run_at(g, t, t1);
        if (v) wino_input_run(v, xv, t - t0, in, g, run, rb, zrow);
        if (z) wino_dout_run(z, xz, t - t0, dout, g, run, zrow);
        t += (size_t)run.count;
    }
}

/* out = correlation of in with the kernel transformed into u (+ b), tiles handed out dynamically. */
static void wino_run_forward(const dt_cpu *cpu, float *out, const float *in, const float *b, int batch,
                             const wino_geom *g, const wino_scratch *s, float *scratch) {
    const float *u = scratch + s->u_base, *zeros = scratch + s->zeros_base;
    const size_t total = (size_t)batch * ((g->oh + 1) / 2) * ((g->ow + 1) / 2);
    /* chunks sized for the cores, not the context's threads: the same bits at any thread count */
    const size_t pieces = (size_t)dt_cpu_cores() * PIECES_PER_THREAD;
    int nt = 1;
    size_t per = (total + pieces - 1) / pieces;
    size_t tiles = per < s->tiles ? (per < 16 ? 16 : per) : s->tiles;
    if (tiles > s->tiles) tiles = s->tiles;
    const size_t nchunks = (total + tiles - 1) / tiles, xv = wino_xs(tiles, g->ic), xm = wino_xs(tiles, g->oc);
    nt = dt_cpu_par(cpu, 2.0 * 9 * total * 4 * g->ic * g->oc, DT_PAR_FLOPS, par_cap(nchunks)); /* direct conv's FLOPs */
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (size_t k = 0; k < nchunks; k++) {
        float *v = scratch + s->thr_base + (size_t)omp_get_thread_num() * s->thr, *m = v + s->v;
        float *rb = m + s->v;
        size_t t0 = k * tiles, t1 = t0 + tiles < total ? t0 + tiles : total;
        wino_transform_chunk(v, NULL, xv, 0, in, NULL, g, t0, t1, rb, zeros);
        for (int x = 0; x < 16; x++)
            gemm1(cpu, 0, 0, (int)(t1 - t0), g->oc, g->ic, 1.0f, v + x * xv, g->ic,
                  u + (size_t)x * g->ic * g->oc, g->oc, 0.0f, m + x * xm, g->oc);
        wino_output_rows(m, xm, t1 - t0, g->oc);
        for (size_t t = t0; t < t1;) {
            wino_run run = wino_run_at(g, t, t1);
            wino_output_run(out, b, m, xm, t - t0, g, run);
            t += (size_t)run.count;
        }
    }
}

static wino_geom wino_geom_of(const dt_window *g) {
    return (wino_geom){g->in_h, g->in_w, g->in_c, g->out_h, g->out_w, g->out_c, g->pad_top, g->pad_left};
}

void dt_wino_forward(const dt_cpu *cpu, float *out, const float *in, const float *w, const float *b, int batch,
                     const dt_window *g, float *scratch) {
    const wino_scratch s = wino_scratch_layout(g, batch);
    const wino_geom wg = wino_geom_of(g);
    memset(scratch + s.zeros_base, 0, sizeof(float) * (s.thr_base - s.zeros_base));
    wino_transform_kernel(scratch + s.u_base, w, g->in_c, g->out_c, 0);
    wino_run_forward(cpu, out, in, b, batch, &wg, &s, scratch);
}

void dt_wino_backward(const dt_cpu *cpu, float *din, float *dw, float *db, const float *dout, const float *in,
                      const float *w, int batch, const dt_window *g, float *scratch) {
    const wino_scratch s = wino_scratch_layout(g, batch);
    const wino_geom wg = wino_geom_of(g);
    const int C = g->in_c, OC = g->out_c;
    const size_t total = (size_t)batch * ((g->out_h + 1) / 2) * ((g->out_w + 1) / 2);
    const size_t positions = (size_t)batch * g->out_h * g->out_w, ngw = (size_t)16 * C * OC;
    const size_t npieces = batch < CONV_BWD_PIECES ? (size_t)(batch > 0 ? batch : 0) : CONV_BWD_PIECES;
    const size_t xv = wino_xs(s.tiles, C), xz = wino_xs(s.tiles, OC);
    const float *zeros = scratch + s.zeros_base;
    memset(scratch + s.zeros_base, 0, sizeof(float) * (s.thr_base - s.zeros_base));
    int nt = dt_cpu_par(cpu, conv_flops(g, batch), DT_PAR_FLOPS, par_cap(npieces));
    /* dW (transform domain) and db: fixed pieces of tiles / positions, summed in piece order. */
#pragma omp parallel num_threads(nt)
    {
        float *v = scratch + s.thr_base + (size_t)omp_get_thread_num() * s.thr, *z = v + s.v, *rb = z + s.v;
#pragma omp for schedule(dynamic, 1)
        for (size_t piece = 0; piece < npieces; piece++) {
            float *gw = scratch + s.gw_base + piece * s.gw, *dbp = scratch + s.db_base + piece * s.db;
            size_t a = total * piece / npieces, e = total * (piece + 1) / npieces;
            if (a == e) memset(gw, 0, ngw * sizeof(float));
            /* The first chunk's GEMMs overwrite the partial (beta 0), the others add to it. */
            for (size_t t0 = a; t0 < e; t0 += s.tiles) {
                size_t t1 = t0 + s.tiles < e ? t0 + s.tiles : e;
                wino_transform_chunk(v, z, xv, xz, in, dout, &wg, t0, t1, rb, zeros);
                for (int x = 0; x < 16; x++)
                    gemm1(cpu, 1, 0, C, OC, (int)(t1 - t0), 1.0f, v + x * xv, C, z + x * xz, OC,
                          t0 == a ? 0.0f : 1.0f, gw + (size_t)x * C * OC, OC);
            }
            if (db) {
                memset(dbp, 0, OC * sizeof(float));
                size_t p0 = positions * piece / npieces, p1 = positions * (piece + 1) / npieces;
                for (size_t p = p0; p < p1; p++)
                    for (int c = 0; c < OC; c++) dbp[c] += dout[p * OC + c];
            }
        }
        /* Sum the pieces, then dW = G^T gw G per (c, oc). Piece 0's partial becomes the total; each
         * element still adds the pieces in piece order, but across a block of elements at a time,
         * in vectors (summed element by element, a chain of scalar adds 16 pieces long took ~5% of
         * the resnet model's step). */
        float *gsum = scratch + s.gw_base;
#pragma omp for schedule(static)
        for (size_t i0 = 0; i0 < ngw; i0 += 1024) {
            const size_t i1 = i0 + 1024 < ngw ? i0 + 1024 : ngw;
            for (size_t piece = 1; piece < npieces; piece++) {
                const float *part = scratch + s.gw_base + piece * s.gw;
#pragma omp simd
                for (size_t i = i0; i < i1; i++) gsum[i] += part[i];
            }
        }
#pragma omp for schedule(static)
        for (size_t co = 0; co < (size_t)C * OC; co++) {
            float x[4][4], t[3][4];
            for (int k = 0; k < 16; k++) x[k / 4][k % 4] = gsum[(size_t)k * C * OC + co];
            for (int j = 0; j < 4; j++) { /* G^T x: rows */
                t[0][j] = x[0][j] + 0.5f * (x[1][j] + x[2][j]);
                t[1][j] = 0.5f * (x[1][j] - x[2][j]);
                t[2][j] = 0.5f * (x[1][j] + x[2][j]) + x[3][j];
            }
            for (int i = 0; i < 3; i++) { /* (G^T x) G: columns */
                dw[(size_t)(i * 3 + 0) * C * OC + co] = t[i][0] + 0.5f * (t[i][1] + t[i][2]);
                dw[(size_t)(i * 3 + 1) * C * OC + co] = 0.5f * (t[i][1] - t[i][2]);
                dw[(size_t)(i * 3 + 2) * C * OC + co] = 0.5f * (t[i][1] + t[i][2]) + t[i][3];
            }
        }
    }
    if (db)
        for (int c = 0; c < OC; c++) {
            float acc = 0.0f;
            for (size_t piece = 0; piece < npieces; piece++) acc += scratch[s.db_base + piece * s.db + c];
            db[c] = acc;
        }
    if (din) {
        /* din = stride-1 correlation of dout with the rotated kernel; padding 2 - pad. */
        wino_geom dg = {g->out_h, g->out_w, OC, g->in_h, g->in_w, C, 2 - g->pad_top, 2 - g->pad_left};
        wino_transform_kernel(scratch + s.u_base, w, C, OC, 1);
        wino_run_forward(cpu, din, dout, NULL, batch, &dg, &s, scratch);
    }
}

size_t dt_wino_scratch_floats(const dt_window *g, int batch) { return wino_scratch_layout(g, batch).total; }
