/* Winograd F(2x2, 3x3) convolution for the CPU backend; kernels_cpu.c calls it for the layers
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

/* Scratch layout (floats, 16-aligned parts), T = max threads, P = CONV_BWD_PIECES, K = max(C, OC):
 *   u     [16][C][OC]    transformed kernel (forward) or rotated kernel (din)
 *   zeros [K]            what out-of-image patch cells point at
 *   per thread [T]: v [16][tiles][K], m [16][tiles][K]  transformed inputs and GEMM results
 *   gw    [P][16][C][OC] per-piece dW partials in the transform domain
 *   db    [P][OC]        per-piece db partials */
typedef struct {
    size_t tiles, u_base, zeros_base, thr_base, thr, v, gw_base, gw, db_base, db, total;
} wino_scratch;

static wino_scratch wino_scratch_layout(const dt_window *g, int batch) {
    size_t T = (size_t)dt_cpu_max_threads(), C = (size_t)g->in_c, OC = (size_t)g->out_c;
    size_t K = C > OC ? C : OC;
    size_t P = batch < CONV_BWD_PIECES ? (size_t)(batch > 0 ? batch : 1) : CONV_BWD_PIECES;
    wino_scratch s;
    s.tiles = WINO_CHUNK_FLOATS / (32 * K); /* v and m together fill one chunk */
    if (s.tiles < 16) s.tiles = 16;
    s.u_base = 0;
    s.zeros_base = round16(16 * C * OC);
    s.thr_base = s.zeros_base + round16(K);
    s.v = round16(16 * s.tiles * K);
    s.thr = 2 * s.v;
    s.gw_base = s.thr_base + T * s.thr;
    s.gw = round16(16 * C * OC);
    s.db_base = s.gw_base + P * s.gw;
    s.db = round16(OC);
    s.total = s.db_base + P * s.db;
    return s;
}

/* u [16][ic][oc] = G g G^T for each (ic, oc); g[kh][kw] = w[kh][kw][c][o] of the HWIO kernel, or
 * for the input gradient (flip) w[2-kh][2-kw][o][c]: the rotated kernel seen from dout's side. */
static void wino_transform_kernel(float *u, const float *w, int C, int OC, int flip) {
    const int ic = flip ? OC : C, oc = flip ? C : OC;
    int nt = dt_cpu_threads();
#pragma omp parallel for num_threads(nt) schedule(static) if ((size_t)C * OC >= 4096)
    for (int i = 0; i < ic; i++)
        for (int o = 0; o < oc; o++) {
            float gk[3][3], t[4][3];
            for (int kh = 0; kh < 3; kh++)
                for (int kw = 0; kw < 3; kw++)
                    gk[kh][kw] = flip ? w[(((2 - kh) * 3 + (2 - kw)) * C + o) * OC + i]
                                      : w[((kh * 3 + kw) * C + i) * OC + o];
            for (int j = 0; j < 3; j++) {
                t[0][j] = gk[0][j];
                t[1][j] = 0.5f * (gk[0][j] + gk[1][j] + gk[2][j]);
                t[2][j] = 0.5f * (gk[0][j] - gk[1][j] + gk[2][j]);
                t[3][j] = gk[2][j];
            }
            for (int r = 0; r < 4; r++) {
                float *d = u + ((size_t)(r * 4) * ic + i) * oc + o;
                size_t xs = (size_t)ic * oc; /* stride between transform points */
                d[0] = t[r][0];
                d[xs] = 0.5f * (t[r][0] + t[r][1] + t[r][2]);
                d[2 * xs] = 0.5f * (t[r][0] - t[r][1] + t[r][2]);
                d[3 * xs] = t[r][2];
            }
        }
}

/* v [16][ld][C] rows tl..: B^T d B of the 4x4 patch under output tile `tile` (zeros outside). */
DT_HOT static void wino_input_tile(float *v, size_t ld, size_t tl, const float *in, const wino_geom *g,
                                   size_t tile, const float *zeros) {
    const size_t tw_n = (size_t)(g->ow + 1) / 2, th_n = (size_t)(g->oh + 1) / 2;
    const size_t n = tile / (th_n * tw_n), r = tile % (th_n * tw_n);
    const int ih0 = (int)(r / tw_n) * 2 - g->pad_top, iw0 = (int)(r % tw_n) * 2 - g->pad_left;
    const int C = g->ic;
    const float *img = in + n * g->ih * g->iw * (size_t)C;
    const float *p[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            int y = ih0 + i, x = iw0 + j;
            p[i][j] = (y >= 0 && y < g->ih && x >= 0 && x < g->iw) ? img + ((size_t)y * g->iw + x) * C : zeros;
        }
    float *o = v + tl * C;
    const size_t xs = ld * C;
#pragma omp simd
    for (int c = 0; c < C; c++) {
        float t[4][4];
        for (int j = 0; j < 4; j++) { /* B^T d: rows */
            t[0][j] = p[0][j][c] - p[2][j][c];
            t[1][j] = p[1][j][c] + p[2][j][c];
            t[2][j] = p[2][j][c] - p[1][j][c];
            t[3][j] = p[1][j][c] - p[3][j][c];
        }
        for (int i = 0; i < 4; i++) { /* (B^T d) B: columns */
            o[(4 * i + 0) * xs + c] = t[i][0] - t[i][2];
            o[(4 * i + 1) * xs + c] = t[i][1] + t[i][2];
            o[(4 * i + 2) * xs + c] = t[i][2] - t[i][1];
            o[(4 * i + 3) * xs + c] = t[i][1] - t[i][3];
        }
    }
}

/* out (+ b) for output tile `tile` from m [16][ld][OC] row tl: A^T m A, clipped to the image. */
DT_HOT static void wino_output_tile(float *out, const float *b, const float *m, size_t ld, size_t tl,
                                    const wino_geom *g, size_t tile) {
    const size_t tw_n = (size_t)(g->ow + 1) / 2, th_n = (size_t)(g->oh + 1) / 2;
    const size_t n = tile / (th_n * tw_n), r = tile % (th_n * tw_n);
    const int oh0 = (int)(r / tw_n) * 2, ow0 = (int)(r % tw_n) * 2, OC = g->oc;
    const int rows = oh0 + 1 < g->oh ? 2 : 1, cols = ow0 + 1 < g->ow ? 2 : 1;
    float *dst[2][2];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            dst[i][j] = out + ((n * g->oh + (size_t)(oh0 + (i < rows ? i : 0))) * g->ow +
                               (size_t)(ow0 + (j < cols ? j : 0))) * OC;
    const float *s = m + tl * OC;
    const size_t xs = ld * OC;
#pragma omp simd
    for (int c = 0; c < OC; c++) {
        float x[16], t[2][4];
        for (int k = 0; k < 16; k++) x[k] = s[k * xs + c];
        for (int j = 0; j < 4; j++) { /* A^T m: rows */
            t[0][j] = x[j] + x[4 + j] + x[8 + j];
            t[1][j] = x[4 + j] - x[8 + j] - x[12 + j];
        }
        float bias = b ? b[c] : 0.0f;
        float y00 = t[0][0] + t[0][1] + t[0][2] + bias, y01 = t[0][1] - t[0][2] - t[0][3] + bias;
        float y10 = t[1][0] + t[1][1] + t[1][2] + bias, y11 = t[1][1] - t[1][2] - t[1][3] + bias;
        /* clipped cells alias a kept cell; write those first so the kept value lands last */
        dst[1][1][c] = y11;
        dst[1][0][c] = y10;
        dst[0][1][c] = y01;
        dst[0][0][c] = y00;
    }
}

/* dz [16][ld][OC] row tl: A dY A^T of the 2x2 block of dout under tile `tile` (zeros outside). */
DT_HOT static void wino_dout_tile(float *z, size_t ld, size_t tl, const float *dout, const wino_geom *g,
                                  size_t tile, const float *zeros) {
    const size_t tw_n = (size_t)(g->ow + 1) / 2, th_n = (size_t)(g->oh + 1) / 2;
    const size_t n = tile / (th_n * tw_n), r = tile % (th_n * tw_n);
    const int oh0 = (int)(r / tw_n) * 2, ow0 = (int)(r % tw_n) * 2, OC = g->oc;
    const float *p[2][2];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            p[i][j] = (oh0 + i < g->oh && ow0 + j < g->ow)
                          ? dout + ((n * g->oh + (size_t)(oh0 + i)) * g->ow + (size_t)(ow0 + j)) * OC
                          : zeros;
    float *o = z + tl * OC;
    const size_t xs = ld * OC;
#pragma omp simd
    for (int c = 0; c < OC; c++) {
        float t[4][2];
        for (int j = 0; j < 2; j++) { /* A dY: rows */
            t[0][j] = p[0][j][c];
            t[1][j] = p[0][j][c] + p[1][j][c];
            t[2][j] = p[0][j][c] - p[1][j][c];
            t[3][j] = -p[1][j][c];
        }
        for (int i = 0; i < 4; i++) { /* (A dY) A^T: columns */
            o[(4 * i + 0) * xs + c] = t[i][0];
            o[(4 * i + 1) * xs + c] = t[i][0] + t[i][1];
            o[(4 * i + 2) * xs + c] = t[i][0] - t[i][1];
            o[(4 * i + 3) * xs + c] = -t[i][1];
        }
    }
}

/* out = correlation of in with the kernel transformed into u (+ b), tiles handed out dynamically. */
static void wino_run_forward(float *out, const float *in, const float *b, int batch, const wino_geom *g,
                             const wino_scratch *s, float *scratch) {
    const float *u = scratch + s->u_base, *zeros = scratch + s->zeros_base;
    const size_t total = (size_t)batch * ((g->oh + 1) / 2) * ((g->ow + 1) / 2);
    int nt = dt_cpu_threads();
    size_t per = (total + (size_t)nt * PIECES_PER_THREAD - 1) / ((size_t)nt * PIECES_PER_THREAD);
    size_t tiles = per < s->tiles ? (per < 16 ? 16 : per) : s->tiles;
    if (tiles > s->tiles) tiles = s->tiles;
    const size_t nchunks = (total + tiles - 1) / tiles;
    if ((size_t)nt > nchunks) nt = nchunks > 0 ? (int)nchunks : 1;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (size_t k = 0; k < nchunks; k++) {
        float *v = scratch + s->thr_base + (size_t)omp_get_thread_num() * s->thr, *m = v + s->v;
        size_t t0 = k * tiles, t1 = t0 + tiles < total ? t0 + tiles : total;
        for (size_t t = t0; t < t1; t++) wino_input_tile(v, tiles, t - t0, in, g, t, zeros);
        for (int x = 0; x < 16; x++)
            sgemm1(0, 0, (int)(t1 - t0), g->oc, g->ic, 1.0f, v + (size_t)x * tiles * g->ic, g->ic,
                   u + (size_t)x * g->ic * g->oc, g->oc, 0.0f, m + (size_t)x * tiles * g->oc, g->oc);
        for (size_t t = t0; t < t1; t++) wino_output_tile(out, b, m, tiles, t - t0, g, t);
    }
}

static wino_geom wino_geom_of(const dt_window *g) {
    return (wino_geom){g->in_h, g->in_w, g->in_c, g->out_h, g->out_w, g->out_c, g->pad_top, g->pad_left};
}

void dt_wino_forward(float *out, const float *in, const float *w, const float *b, int batch,
                         const dt_window *g, float *scratch) {
    const wino_scratch s = wino_scratch_layout(g, batch);
    const wino_geom wg = wino_geom_of(g);
    memset(scratch + s.zeros_base, 0, sizeof(float) * (g->in_c > g->out_c ? g->in_c : g->out_c));
    wino_transform_kernel(scratch + s.u_base, w, g->in_c, g->out_c, 0);
    wino_run_forward(out, in, b, batch, &wg, &s, scratch);
}

void dt_wino_backward(float *din, float *dw, float *db, const float *dout, const float *in,
                          const float *w, int batch, const dt_window *g, float *scratch) {
    const wino_scratch s = wino_scratch_layout(g, batch);
    const wino_geom wg = wino_geom_of(g);
    const int C = g->in_c, OC = g->out_c;
    const size_t total = (size_t)batch * ((g->out_h + 1) / 2) * ((g->out_w + 1) / 2);
    const size_t positions = (size_t)batch * g->out_h * g->out_w, ngw = (size_t)16 * C * OC;
    const size_t npieces = batch < CONV_BWD_PIECES ? (size_t)(batch > 0 ? batch : 0) : CONV_BWD_PIECES;
    const float *zeros = scratch + s.zeros_base;
    memset(scratch + s.zeros_base, 0, sizeof(float) * (C > OC ? C : OC));
    int nt = dt_cpu_threads();
    if ((size_t)nt > npieces) nt = npieces > 0 ? (int)npieces : 1;
    /* dW (transform domain) and db: fixed pieces of tiles / positions, summed in piece order. */
#pragma omp parallel num_threads(nt)
    {
        float *v = scratch + s.thr_base + (size_t)omp_get_thread_num() * s.thr, *z = v + s.v;
#pragma omp for schedule(dynamic, 1)
        for (size_t piece = 0; piece < npieces; piece++) {
            float *gw = scratch + s.gw_base + piece * s.gw, *dbp = scratch + s.db_base + piece * s.db;
            memset(gw, 0, ngw * sizeof(float));
            size_t a = total * piece / npieces, e = total * (piece + 1) / npieces;
            for (size_t t0 = a; t0 < e; t0 += s.tiles) {
                size_t t1 = t0 + s.tiles < e ? t0 + s.tiles : e;
                for (size_t t = t0; t < t1; t++) {
                    wino_input_tile(v, s.tiles, t - t0, in, &wg, t, zeros);
                    wino_dout_tile(z, s.tiles, t - t0, dout, &wg, t, zeros);
                }
                for (int x = 0; x < 16; x++)
                    sgemm1(1, 0, C, OC, (int)(t1 - t0), 1.0f, v + (size_t)x * s.tiles * C, C,
                           z + (size_t)x * s.tiles * OC, OC, 1.0f, gw + (size_t)x * C * OC, OC);
            }
            if (db) {
                memset(dbp, 0, OC * sizeof(float));
                size_t p0 = positions * piece / npieces, p1 = positions * (piece + 1) / npieces;
                for (size_t p = p0; p < p1; p++)
                    for (int c = 0; c < OC; c++) dbp[c] += dout[p * OC + c];
            }
        }
        /* Sum the pieces, then dW = G^T gw G per (c, oc). */
        float *gsum = scratch + s.gw_base; /* piece 0's partial becomes the total */
#pragma omp for schedule(static)
        for (size_t i = 0; i < ngw; i++) {
            float acc = gsum[i];
            for (size_t piece = 1; piece < npieces; piece++) acc += scratch[s.gw_base + piece * s.gw + i];
            gsum[i] = acc;
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
        wino_run_forward(din, dout, NULL, batch, &dg, &s, scratch);
    }
}

size_t dt_wino_scratch_floats(const dt_window *g, int batch) { return wino_scratch_layout(g, batch).total; }
