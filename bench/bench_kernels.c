/* Per-layer speed of the CPU kernels at the shipped models' shapes.
 *
 *   bench_kernels [fashion|catdog|all] [batch...] [--threads N] [--reps N]
 *
 * For each model, batch (default 64 and 32) and thread count (default 1 and 2) it times forward +
 * backward of every layer (best of --reps, default 5: other people share the CPU), and prints
 * milliseconds, GFLOP/s and the fraction of the 2-thread sgemm peak measured at the start of the
 * same run with a large square sgemm. FLOPs are those of the direct convolution (2 per multiply-
 * add of forward, dW and din), so a layer that runs Winograd (3x3 stride 1, >= 8 channels) can show
 * more than 100% of the sgemm peak: it does fewer multiplies for the same result. The per-model
 * total is what the kernels alone allow (no data loading, no optimizer), in images/s. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compute/kernels.h"
#include "core/error.h"
#include "core/rng.h"

static dt_cpu cpu; /* the kernels' context: its threads */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static float *rand_floats(size_t n, uint64_t seed) {
    float *x = dt_alloc_floats(n, "bench", NULL);
    if (!x) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    dt_rng r;
    dt_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = dt_rng_uniform(&r) - 0.5f;
    return x;
}

/* 2-thread sgemm peak: the better of dt_gemm (OpenMP split) and OpenBLAS's own threading. */
static double sgemm_peak(int threads) {
    const int n = 2048;
    float *a = rand_floats((size_t)n * n, 1), *b = rand_floats((size_t)n * n, 2);
    float *c = rand_floats((size_t)n * n, 3);
    double best = 1e30;
    dt_cpu peak_cpu;
    dt_cpu_init(&peak_cpu, threads);
    for (int r = 0; r < 5; r++) {
        double t = now();
        dt_gemm(&peak_cpu, 0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        t = now() - t;
        if (t < best) best = t;
    }
    openblas_set_num_threads(threads);
    for (int r = 0; r < 5; r++) {
        double t = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        t = now() - t;
        if (t < best) best = t;
    }
    openblas_set_num_threads(1); /* the kernels' invariant */
    free(a), free(b), free(c);
    return 2.0 * n * n * n / best / 1e9;
}

typedef enum { L_CONV, L_POOL, L_RELU, L_DENSE, L_XENT, L_CONVPOOL } layer_kind;

typedef struct {
    const char *name;
    layer_kind kind;
    int h, w, c, oc, k, s; /* conv/pool: input h,w,c; oc; kernel; stride. dense: c = in, oc = out */
    int first;             /* first layer: no input gradient */
    int pk, ps;            /* L_CONVPOOL: the 2x2 stride-2 SAME pool after the conv */
} layer;

static const layer fashion[] = {
    {"conv1 3x3 1->32", L_CONV, 28, 28, 1, 32, 3, 1, 1, 0, 0},
    {"relu1", L_RELU, 28, 28, 32, 32, 0, 0, 0, 0, 0},
    {"pool1 2x2", L_POOL, 28, 28, 32, 32, 2, 2, 0, 0, 0},
    {"conv2 3x3 32->64", L_CONV, 14, 14, 32, 64, 3, 1, 0, 0, 0},
    {"relu2", L_RELU, 14, 14, 64, 64, 0, 0, 0, 0, 0},
    {"pool2 2x2", L_POOL, 14, 14, 64, 64, 2, 2, 0, 0, 0},
    {"dense1 3136->128", L_DENSE, 1, 1, 3136, 128, 0, 0, 0, 0, 0},
    {"relu3", L_RELU, 1, 1, 128, 128, 0, 0, 0, 0, 0},
    {"dense2 128->10", L_DENSE, 1, 1, 128, 10, 0, 0, 0, 0, 0},
    {"softmax xent", L_XENT, 1, 1, 10, 10, 0, 0, 0, 0, 0},
};

static const layer catdog[] = {
    {"conv1 3x3 3->32", L_CONV, 128, 128, 3, 32, 3, 1, 1, 0, 0},
    {"pool1 2x2", L_POOL, 128, 128, 32, 32, 2, 2, 0, 0, 0},
    {"relu1", L_RELU, 64, 64, 32, 32, 0, 0, 0, 0, 0},
    {"conv2 3x3 32->32", L_CONV, 64, 64, 32, 32, 3, 1, 0, 0, 0},
    {"pool2 2x2", L_POOL, 64, 64, 32, 32, 2, 2, 0, 0, 0},
    {"relu2", L_RELU, 32, 32, 32, 32, 0, 0, 0, 0, 0},
    {"conv3 3x3 32->64", L_CONV, 32, 32, 32, 64, 3, 1, 0, 0, 0},
    {"pool3 2x2", L_POOL, 32, 32, 64, 64, 2, 2, 0, 0, 0},
    {"relu3", L_RELU, 16, 16, 64, 64, 0, 0, 0, 0, 0},
    {"dense1 16384->128", L_DENSE, 1, 1, 16384, 128, 0, 0, 0, 0, 0},
    {"relu4", L_RELU, 1, 1, 128, 128, 0, 0, 0, 0, 0},
    {"dense2 128->2", L_DENSE, 1, 1, 128, 2, 0, 0, 0, 0, 0},
    {"softmax xent", L_XENT, 1, 1, 2, 2, 0, 0, 0, 0, 0},
};

/* What the fused conv + maxpool kernels save on the first block (not part of the totals above). */
static const layer fashion_fused[] = {
    {"conv1+pool1 fused", L_CONVPOOL, 28, 28, 1, 32, 3, 1, 1, 2, 2},
};
static const layer catdog_fused[] = {
    {"conv1+pool1 fused", L_CONVPOOL, 128, 128, 3, 32, 3, 1, 1, 2, 2},
};

typedef struct {
    double fwd_s, bwd_s, flops; /* per batch */
} layer_time;

/* Times forward and backward of one layer separately (best of reps). */
static layer_time bench_layer(const layer *L, int batch, int reps) {
    layer_time res = {1e30, 1e30, 0};
    dt_window g, pg;
    dt_error err = {0};
    size_t nin = (size_t)batch * L->h * L->w * L->c, nout = nin, nw = 0;
    if (L->kind == L_CONV || L->kind == L_POOL || L->kind == L_CONVPOOL) {
        int oc = L->kind == L_POOL ? L->c : L->oc;
        if (dt_window_init(&g, L->h, L->w, L->c, oc, L->k, L->k, L->s, L->s, DT_PAD_SAME, &err)) {
            fprintf(stderr, "%s: %s\n", L->name, err.msg);
            exit(1);
        }
        nout = (size_t)batch * g.out_h * g.out_w * oc;
        if (L->kind != L_POOL) nw = (size_t)L->k * L->k * L->c * oc;
        if (L->kind == L_CONVPOOL) {
            if (dt_window_init(&pg, g.out_h, g.out_w, oc, oc, L->pk, L->pk, L->ps, L->ps, DT_PAD_SAME, &err) ||
                !dt_conv2d_maxpool_fusable(&g, &pg)) {
                fprintf(stderr, "%s: cannot fuse %s\n", L->name, err.msg);
                exit(1);
            }
            nout = (size_t)batch * pg.out_h * pg.out_w * oc;
        }
    } else if (L->kind == L_DENSE) {
        nout = (size_t)batch * L->oc;
        nw = (size_t)L->c * L->oc;
    }
    float *in = rand_floats(nin, 1), *out = rand_floats(nout, 2), *dout = rand_floats(nout, 3);
    float *din = rand_floats(nin, 4), *w = rand_floats(nw + 1, 5), *dw = rand_floats(nw + 1, 6);
    float *b = rand_floats((size_t)L->oc, 7), *db = rand_floats((size_t)L->oc, 8);
    int32_t *idx = malloc(sizeof(int32_t) * (nout > (size_t)batch ? nout : (size_t)batch));
    float *scratch = NULL;
    if (L->kind == L_CONV) scratch = rand_floats(dt_conv2d_scratch_floats(&g, batch), 9);
    if (L->kind == L_CONVPOOL) scratch = rand_floats(dt_conv2d_maxpool_scratch_floats(&g, &pg, batch), 9);
    for (int i = 0; i < batch; i++) idx[i] = i % L->oc;
    float *dinp = L->first ? NULL : din;
    for (int r = 0; r < reps + 1; r++) { /* the first round warms caches and thread pools */
        double t0 = now();
        switch (L->kind) {
        case L_CONV: dt_conv2d_forward(&cpu, out, in, w, b, batch, &g, scratch); break;
        case L_POOL: dt_maxpool_forward(&cpu, out, idx, in, batch, &g); break;
        case L_RELU: dt_relu_forward(&cpu, out, in, nin); break;
        case L_DENSE: dt_dense_forward(&cpu, out, in, w, b, batch, L->c, L->oc); break;
        case L_XENT: dt_softmax_xent(dout, in, idx, batch, L->c, NULL); break;
        case L_CONVPOOL: dt_conv2d_maxpool_forward(&cpu, out, idx, in, w, b, batch, &g, &pg, scratch); break;
        }
        double t1 = now();
        switch (L->kind) {
        case L_CONV: dt_conv2d_backward(&cpu, dinp, dw, db, dout, in, w, batch, &g, scratch); break;
        case L_POOL: dt_maxpool_backward(&cpu, din, dout, idx, batch, &g); break;
        case L_RELU: dt_relu_backward(&cpu, din, dout, out, nin); break;
        case L_DENSE: dt_dense_backward(&cpu, dinp, dw, db, dout, in, w, batch, L->c, L->oc); break;
        case L_XENT: break;
        case L_CONVPOOL:
            dt_conv2d_maxpool_backward(&cpu, dinp, dw, db, dout, idx, in, w, batch, &g, &pg, scratch);
            break;
        }
        double t2 = now();
        if (r > 0 && t1 - t0 < res.fwd_s) res.fwd_s = t1 - t0;
        if (r > 0 && t2 - t1 < res.bwd_s) res.bwd_s = t2 - t1;
    }
    if (L->kind == L_CONVPOOL) nout = (size_t)batch * g.out_h * g.out_w * L->oc; /* conv FLOPs */
    if (L->kind == L_CONV || L->kind == L_DENSE || L->kind == L_CONVPOOL) {
        double macs = L->kind != L_DENSE ? (double)nout * L->k * L->k * L->c : (double)batch * L->c * L->oc;
        res.flops = 2.0 * macs * (L->first ? 2 : 3); /* forward, dW, and din unless first */
    }
    free(in), free(out), free(dout), free(din), free(w), free(dw), free(b), free(db), free(idx);
    free(scratch);
    return res;
}

static void bench_model(const char *name, const layer *layers, int nl, const layer *fused, int nf,
                        int batch, int threads, int reps, double peak) {
    dt_cpu_init(&cpu, threads);
    printf("\n%s  batch %d  threads %d\n", name, batch, cpu.threads);
    printf("  %-20s %9s %9s %9s %9s %7s\n", "layer", "fwd ms", "bwd ms", "total ms", "GFLOP/s", "%peak");
    double total = 0, flops = 0;
    for (int i = 0; i < nl; i++) {
        layer_time t = bench_layer(&layers[i], batch, reps);
        double s = t.fwd_s + t.bwd_s;
        total += s;
        flops += t.flops;
        if (t.flops > 0)
            printf("  %-20s %9.3f %9.3f %9.3f %9.1f %6.1f%%\n", layers[i].name, t.fwd_s * 1e3,
                   t.bwd_s * 1e3, s * 1e3, t.flops / s / 1e9, 100.0 * t.flops / s / 1e9 / peak);
        else
            printf("  %-20s %9.3f %9.3f %9.3f\n", layers[i].name, t.fwd_s * 1e3, t.bwd_s * 1e3, s * 1e3);
    }
    printf("  %-20s %29.3f %9.1f %6.1f%%   => %.0f images/s (kernels only)\n", "TOTAL", total * 1e3,
           flops / total / 1e9, 100.0 * flops / total / 1e9 / peak, batch / total);
    for (int i = 0; i < nf; i++) {
        layer_time t = bench_layer(&fused[i], batch, reps);
        printf("  %-20s %9.3f %9.3f %9.3f   (instead of conv1 + pool1)\n", fused[i].name, t.fwd_s * 1e3,
               t.bwd_s * 1e3, (t.fwd_s + t.bwd_s) * 1e3);
    }
}

int main(int argc, char **argv) {
    const char *which = "all";
    int batches[8], nb = 0, threads = 0, reps = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (argv[i][0] >= '0' && argv[i][0] <= '9' && nb < 8) batches[nb++] = atoi(argv[i]);
        else if (!strcmp(argv[i], "fashion") || !strcmp(argv[i], "catdog") || !strcmp(argv[i], "all"))
            which = argv[i];
        else {
            fprintf(stderr, "usage: %s [fashion|catdog|all] [batch...] [--threads N] [--reps N]\n", argv[0]);
            return 2;
        }
    }
    if (!nb) batches[nb++] = 64, batches[nb++] = 32;
    if (reps < 1) reps = 1;
    int cores = dt_cpu_cores();
    double peak = sgemm_peak(cores < 2 ? cores : 2);
    printf("sgemm peak (2048^3, %d threads): %.1f GFLOP/s\n", cores < 2 ? cores : 2, peak);
    printf("GFLOP/s below count direct-convolution FLOPs (Winograd layers can pass 100%%)\n");
    int tlist[2] = {1, 2}, nt = 2;
    if (threads > 0) tlist[0] = threads, nt = 1;
    for (int bi = 0; bi < nb; bi++)
        for (int ti = 0; ti < nt; ti++) {
            if (!strcmp(which, "all") || !strcmp(which, "fashion"))
                bench_model("fashion", fashion, sizeof fashion / sizeof fashion[0], fashion_fused, 1,
                            batches[bi], tlist[ti], reps, peak);
            if (!strcmp(which, "all") || !strcmp(which, "catdog"))
                bench_model("catdog", catdog, sizeof catdog / sizeof catdog[0], catdog_fused, 1,
                            batches[bi], tlist[ti], reps, peak);
        }
    return 0;
}
