/* Per-layer speed of the CPU kernels at the shipped models' shapes.
 *
 *   bench_kernels [fashion|catdog|all] [batch...] [--threads N] [--reps N]
 *   bench_kernels gemm [--threads N] [--reps N]
 *
 * For each model, batch (default 64 and 32) and thread count (default 1 and 2) it times forward +
 * backward of every layer (best of --reps, default 5: other people share the CPU), and prints
 * milliseconds, GFLOP/s and the fraction of the 2-thread sgemm peak measured at the start of the
 * same run with a large square sgemm. FLOPs are those of the direct convolution (2 per multiply-
 * add of forward, dW and din), so a layer that runs Winograd (3x3 stride 1, >= 8 channels) can show
 * more than 100% of the sgemm peak: it does fewer multiplies for the same result. The per-model
 * total is what the kernels alone allow (no data loading, no optimizer), in images/s.
 *
 * `gemm`: the bf16 products (fp32 accumulation) on the shapes the models' layers give dt_gemm and
 * their convolutions' single-threaded products (bench_gemm_shapes below), by dt_gemm_bf16 (the
 * project's AVX512_BF16 kernel), by oneDNN's dnnl_gemm_bf16bf16f32 and LIBXSMM's JIT kernels where
 * the build found them (optional, never linked into the library), beside fp32 dt_gemm (OpenBLAS);
 * the implementations take turns within each repetition (the best of --reps, default 20), and the
 * bf16 peak (2048^3) against the fp32 one. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compute/kernels.h"
#include "core/error.h"
#ifdef DT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif
#ifdef DT_HAVE_XSMM
#include <libxsmm.h>
#endif
#include <omp.h>
#include "core/rng.h"

static dt_cpu cpu; /* the kernels' context: its threads */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
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

/* ---- bf16 products ------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    int ta, tb, M, N, K;
} gemm_shape;

/* The products of a training step at batch 64 (1 thread; LD_PRELOAD logging of cblas_sgemm, the
 * share of the step's product FLOPs in brackets): Winograd's 16 products per chunk of tiles
 * (forward [tiles, C] x [C, OC], din the same with C and OC swapped, dW [C, tiles] x [tiles, OC]),
 * im2col's per chunk of rows, and the dense layers' whole products (dt_gemm, before its pieces). */
static const gemm_shape bench_gemm_shapes[] = {
    {"fashion wino fwd [25%]", 0, 0, 64, 64, 32},
    {"fashion wino din [25%]", 0, 0, 64, 32, 64},
    {"fashion wino dW [24%]", 1, 0, 32, 64, 64},
    {"fashion conv1 fwd [3%]", 0, 0, 3472, 32, 9},
    {"fashion conv1 dW [3%]", 1, 0, 9, 32, 3136},
    {"fashion dense1 fwd [6%]", 0, 0, 64, 128, 3136},
    {"fashion dense1 dW [6%]", 1, 0, 3136, 128, 64},
    {"fashion dense1 din [6%]", 0, 1, 64, 3136, 128},
    {"catdog wino fwd [30%]", 0, 0, 128, 32, 32},
    {"catdog wino dW [15%]", 1, 0, 32, 32, 128},
    {"catdog conv1 fwd [13%]", 0, 0, 1157, 32, 27},
    {"catdog conv1 dW [13%]", 1, 0, 27, 32, 1157},
    {"catdog dense1 fwd [2%]", 0, 0, 64, 128, 16384},
    {"catdog dense1 dW [2%]", 1, 0, 16384, 128, 64},
    {"catdog dense1 din [2%]", 0, 1, 64, 16384, 128},
    {"resnet wino64 fwd [22%]", 0, 0, 64, 64, 64},
    {"resnet wino64 dW [11%]", 1, 0, 64, 64, 64},
    {"resnet wino16 fwd [20%]", 0, 0, 256, 16, 16},
    {"resnet wino16 dW [10%]", 1, 0, 16, 16, 256},
    {"resnet wino32 fwd [16%]", 0, 0, 128, 32, 32},
    {"resnet wino32 dW [5%]", 1, 0, 32, 32, 128},
    {"resnet s2 fwd [2%]", 0, 0, 392, 64, 288},
    {"resnet s2 dW [2%]", 1, 0, 288, 64, 196},
    {"resnet s2 din [2%]", 0, 1, 196, 288, 64},
};

#ifdef DT_HAVE_DNNL
/* oneDNN's matmul primitive (what PyTorch's CPU bf16 runs): bf16 operands as stored, with their
 * strides (a transposed operand is a stride), fp32 C. */
typedef struct {
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
    const char *impl;
} dnnl_mm;
static dnnl_engine_t dn_engine;
static dnnl_stream_t dn_stream;

static void dnnl_mm_init(dnnl_mm *m, const gemm_shape *s, void *a16, int lda, void *b16, int ldb, float *c, int threads) {
    memset(m, 0, sizeof *m);
    if (!dn_engine && (dnnl_engine_create(&dn_engine, dnnl_cpu, 0) != dnnl_success ||
                       dnnl_stream_create(&dn_stream, dn_engine, dnnl_stream_default_flags) != dnnl_success))
        return;
    dnnl_memory_desc_t ad, bd, cd;
    dnnl_dims_t adim = {s->M, s->K}, bdim = {s->K, s->N}, cdim = {s->M, s->N};
    dnnl_dims_t astr = {s->ta ? 1 : lda, s->ta ? lda : 1}, bstr = {s->tb ? 1 : ldb, s->tb ? ldb : 1},
                cstr = {s->N, 1};
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd;
    omp_set_num_threads(threads);
    if (dnnl_memory_desc_init_by_strides(&ad, 2, adim, dnnl_bf16, astr) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&bd, 2, bdim, dnnl_bf16, bstr) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&cd, 2, cdim, dnnl_f32, cstr) != dnnl_success ||
        dnnl_matmul_desc_init(&md, &ad, &bd, NULL, &cd) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &md, NULL, dn_engine, NULL) != dnnl_success)
        return;
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &m->impl);
    if (dnnl_primitive_create(&m->prim, pd) != dnnl_success || dnnl_memory_create(&m->a, &ad, dn_engine, a16) ||
        dnnl_memory_create(&m->b, &bd, dn_engine, b16) || dnnl_memory_create(&m->c, &cd, dn_engine, c))
        m->prim = NULL;
}
#endif

/* "own packedB": dt_gemm_bf16_packed with B packed ahead (dt_bf16_pack_b, not timed: a layer's weights,
 * packed once per step). "+cvt": the call with the conversion of both fp32 operands to what the library takes counted in
 * (dt_bf16_store; LIBXSMM's VNNI layout of B interleaves two rows), as dt_gemm_bf16 counts its own
 * packing; without it, the operands as if the layers had stored them in bf16 already. */
enum { G_F32, G_OWN, G_OWN_PACKED, G_DNNL, G_DNNL_CVT, G_XSMM, G_XSMM_CVT, G_N };
static const char *const gemm_names[G_N] = {"fp32 sgemm", "own bf16", "own packedB", "oneDNN",
                                            "oneDNN+cvt", "LIBXSMM",  "LIBXSMM+cvt"};

typedef struct {
    const gemm_shape *s;
    const float *a, *b;
    float *c;
    uint16_t *a16, *b16; /* the operands in bf16, as stored (oneDNN and LIBXSMM take bf16) */
    uint32_t *bpk;       /* op(B) packed for dt_gemm_bf16_packed */
    int lda, ldb, threads;
#ifdef DT_HAVE_DNNL
    dnnl_mm dn;
#endif
#ifdef DT_HAVE_XSMM
    libxsmm_bsmmfunction xk; /* NULL: no kernel for this shape (transposed operands) */
    uint16_t *b16v, *a16x;   /* B in LIBXSMM's VNNI layout [Kp / 2][N][2], A with K padded to Kp even */
#endif
} gemm_case;

#ifdef DT_HAVE_XSMM
/* LIBXSMM's operands from the fp32 ones: A with K padded to even, B's rows k and k + 1 interleaved
 * (scratch: b16 holds B in bf16 first). */
static void xsmm_convert(gemm_case *g) {
    const gemm_shape *s = g->s;
    const int kp = (s->K + 1) & ~1;
    if (kp == s->K) dt_bf16_store(g->a16x, g->a, (size_t)s->M * s->K);
    else
        for (int i = 0; i < s->M; i++) dt_bf16_store(g->a16x + (size_t)i * kp, g->a + (size_t)i * s->K, (size_t)s->K);
    dt_bf16_store(g->b16, g->b, (size_t)s->K * s->N);
    for (int k = 0; k < s->K; k += 2) {
        const uint16_t *r0 = g->b16 + (size_t)k * s->N, *r1 = r0 + s->N;
        uint16_t *o = g->b16v + (size_t)k * s->N;
        if (k + 1 < s->K)
            for (int n = 0; n < s->N; n++) o[2 * n] = r0[n], o[2 * n + 1] = r1[n];
        else
            for (int n = 0; n < s->N; n++) o[2 * n] = r0[n], o[2 * n + 1] = 0;
    }
}
#endif

/* Runs implementation v once on the case; returns 0 where it has no kernel for it. */
static int gemm_run(int v, gemm_case *g) {
    const gemm_shape *s = g->s;
    dt_cpu c;
    dt_cpu_init(&c, g->threads);
    c.par_always = g->threads > 1; /* what 2 threads give, whatever the machine's load */
    switch (v) {
    case G_F32: dt_gemm(&c, s->ta, s->tb, s->M, s->N, s->K, 1.0f, g->a, g->lda, g->b, g->ldb, 0.0f, g->c, s->N); return 1;
    case G_OWN:
        dt_gemm_bf16(&c, s->ta, s->tb, s->M, s->N, s->K, 1.0f, g->a, g->lda, g->b, g->ldb, 0.0f, g->c, s->N);
        return 1;
    case G_OWN_PACKED:
        dt_gemm_bf16_packed(&c, s->ta, s->M, s->N, s->K, 1.0f, g->a, g->lda, g->bpk, 0.0f, g->c, s->N);
        return 1;
#ifdef DT_HAVE_DNNL
    case G_DNNL_CVT: /* the caller's conversion of fp32 operands to bf16 counted too */
        dt_bf16_store(g->a16, g->a, (size_t)s->M * s->K);
        dt_bf16_store(g->b16, g->b, (size_t)s->K * s->N);
        /* fall through */
    case G_DNNL: {
        if (!g->dn.prim) return 0;
        dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, g->dn.a}, {DNNL_ARG_WEIGHTS, g->dn.b}, {DNNL_ARG_DST, g->dn.c}};
        omp_set_num_threads(g->threads);
        return dnnl_primitive_execute(g->dn.prim, dn_stream, 3, args) == dnnl_success &&
               dnnl_stream_wait(dn_stream) == dnnl_success;
    }
#endif
#ifdef DT_HAVE_XSMM
    case G_XSMM_CVT:
        if (!g->xk || g->threads > 1) return 0;
        xsmm_convert(g);
        /* fall through */
    case G_XSMM:
        /* column-major C^T [N, M] = B^T [N, K] A^T [K, M]: LIBXSMM's A is our B in its VNNI layout */
        if (!g->xk || g->threads > 1) return 0;
        g->xk((const libxsmm_bfloat16 *)g->b16v, (const libxsmm_bfloat16 *)g->a16x, g->c);
        return 1;
#endif
    default: return 0;
    }
}

static void bench_gemm(int threads, int reps) {
    dt_cpu c;
    dt_cpu_init(&c, threads);
    threads = c.threads;
    /* the peaks: 2048^3, fp32 and bf16, interleaved */
    {
        const int n = 2048;
        gemm_shape sq = {"2048^3", 0, 0, n, n, n};
        float *a = rand_floats((size_t)n * n, 1), *b = rand_floats((size_t)n * n, 2), *cc = rand_floats((size_t)n * n, 3);
        gemm_case g = {.s = &sq, .a = a, .b = b, .c = cc, .lda = n, .ldb = n, .threads = threads};
        /* Wall time, and the CPU time of the process (a second thread's counts too): on a shared machine
         * a run of half a second is rarely left alone, and the CPU time leaves out the time others held
         * the core (not what a sibling hyperthread takes). */
        double best[2] = {1e30, 1e30}, best_cpu[2] = {1e30, 1e30};
        for (int r = 0; r < 5; r++)
            for (int v = 0; v < 2; v++) {
                double t = now(), c0 = cpu_seconds();
                gemm_run(v, &g);
                double c1 = (cpu_seconds() - c0) / threads;
                t = now() - t;
                if (t < best[v]) best[v] = t;
                if (c1 < best_cpu[v]) best_cpu[v] = c1;
            }
        const double f = 2.0 * n * n * n / 1e9;
        printf("peak 2048^3, %d thread%s: fp32 sgemm %.1f GFLOP/s, own bf16 %.1f GFLOP/s (%.2fx); per CPU second "
               "(per thread) %.1f and %.1f (%.2fx)\n",
               threads, threads > 1 ? "s" : "", f / best[0], f / best[1], best[0] / best[1], f / best_cpu[0],
               f / best_cpu[1], best_cpu[0] / best_cpu[1]);
        free(a), free(b), free(cc);
    }
    printf("%-24s %5s %5s %5s %2s%2s", "shape", "M", "N", "K", "tA", "tB");
    for (int v = 0; v < G_N; v++) printf(" %11s", gemm_names[v]);
    printf("   GFLOP/s, %d thread%s\n", threads, threads > 1 ? "s" : "");
#ifdef DT_HAVE_DNNL
    printf("(oneDNN: its matmul primitive, brg:avx512_core_bf16 unless a row says otherwise)\n");
#endif
    for (size_t i = 0; i < sizeof bench_gemm_shapes / sizeof bench_gemm_shapes[0]; i++) {
        const gemm_shape *s = &bench_gemm_shapes[i];
        gemm_case g = {.s = s, .threads = threads};
        g.lda = s->ta ? s->M : s->K;
        g.ldb = s->tb ? s->K : s->N;
        float *a = rand_floats((size_t)s->M * s->K, 1), *b = rand_floats((size_t)s->K * s->N, 2);
        g.a = a, g.b = b, g.c = rand_floats((size_t)s->M * s->N, 3);
        g.a16 = malloc(sizeof(uint16_t) * s->M * s->K), g.b16 = malloc(sizeof(uint16_t) * s->K * s->N);
        dt_bf16_store(g.a16, a, (size_t)s->M * s->K);
        dt_bf16_store(g.b16, b, (size_t)s->K * s->N);
        g.bpk = malloc(sizeof(uint32_t) * dt_bf16_packed_b_words(s->K, s->N));
        dt_bf16_pack_b(g.bpk, s->tb, s->K, s->N, b, g.ldb);
#ifdef DT_HAVE_DNNL
        dnnl_mm_init(&g.dn, s, g.a16, g.lda, g.b16, g.ldb, g.c, threads);
#endif
#ifdef DT_HAVE_XSMM
        g.xk = NULL, g.b16v = g.a16x = NULL;
        if (!s->ta && !s->tb) {
            const int kp = (s->K + 1) & ~1;
            g.b16v = calloc((size_t)kp * s->N, sizeof(uint16_t));
            g.a16x = calloc((size_t)s->M * kp, sizeof(uint16_t));
            for (int k = 0; k < s->K; k++)
                for (int n = 0; n < s->N; n++) g.b16v[((size_t)(k / 2) * s->N + n) * 2 + k % 2] = g.b16[(size_t)k * s->N + n];
            for (int i = 0; i < s->M; i++) memcpy(g.a16x + (size_t)i * kp, g.a16 + (size_t)i * s->K, sizeof(uint16_t) * s->K);
            const float one = 1.0f, zero = 0.0f;
            const libxsmm_blasint xlda = s->N, xldb = kp, xldc = s->N;
            const int flags = LIBXSMM_GEMM_FLAG_VNNI_A;
            g.xk = libxsmm_bsmmdispatch(s->N, s->M, kp, &xlda, &xldb, &xldc, &one, &zero, &flags, NULL);
        }
#endif
        double best[G_N];
        int have[G_N];
        for (int v = 0; v < G_N; v++) best[v] = 1e30, have[v] = 1;
        /* calls per timing: about 2e7 FLOPs (a product of a microsecond is timed over dozens) */
        const int inner = 2.0 * s->M * s->N * s->K >= 2e7 ? 1 : (int)(2e7 / (2.0 * s->M * s->N * s->K)) + 1;
        for (int r = 0; r < reps + 1; r++)
            for (int v = 0; v < G_N; v++) {
                if (!have[v]) continue;
                double t = now();
                for (int i = 0; i < inner && have[v]; i++) have[v] = gemm_run(v, &g);
                t = (now() - t) / inner;
                if (r > 0 && t < best[v]) best[v] = t; /* the first round warms caches and thread pools */
            }
        printf("%-24s %5d %5d %5d %2d%2d", s->name, s->M, s->N, s->K, s->ta, s->tb);
        const double flops = 2.0 * s->M * s->N * s->K;
        for (int v = 0; v < G_N; v++)
            if (have[v]) printf(" %11.1f", flops / best[v] / 1e9);
            else printf(" %11s", "-");
        if (have[G_DNNL_CVT]) printf("  own/oneDNN+cvt %.2f", best[G_DNNL_CVT] / best[G_OWN]);
        if (have[G_XSMM_CVT]) printf("  own/LIBXSMM+cvt %.2f", best[G_XSMM_CVT] / best[G_OWN]);
        printf("\n");
        free(a), free(b), free(g.c), free(g.a16), free(g.b16), free(g.bpk);
#ifdef DT_HAVE_DNNL
        if (g.dn.impl && strcmp(g.dn.impl, "brg:avx512_core_bf16")) printf("%-24s oneDNN ran %s\n", "", g.dn.impl);
        if (g.dn.prim) dnnl_primitive_destroy(g.dn.prim), dnnl_memory_destroy(g.dn.a), dnnl_memory_destroy(g.dn.b),
            dnnl_memory_destroy(g.dn.c);
#endif
#ifdef DT_HAVE_XSMM
        free(g.b16v), free(g.a16x);
#endif
    }
    omp_set_num_threads(dt_cpu_default_threads());
}

int main(int argc, char **argv) {
    const char *which = "all";
    int batches[8], nb = 0, threads = 0, reps = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (argv[i][0] >= '0' && argv[i][0] <= '9' && nb < 8) batches[nb++] = atoi(argv[i]);
        else if (!strcmp(argv[i], "fashion") || !strcmp(argv[i], "catdog") || !strcmp(argv[i], "all") ||
                 !strcmp(argv[i], "gemm"))
            which = argv[i];
        else {
            fprintf(stderr, "usage: %s [fashion|catdog|all|gemm] [batch...] [--threads N] [--reps N]\n", argv[0]);
            return 2;
        }
    }
    if (!strcmp(which, "gemm")) {
        if (threads > 0) bench_gemm(threads, reps > 5 ? reps : 20);
        else bench_gemm(1, reps > 5 ? reps : 20), bench_gemm(2, reps > 5 ? reps : 20);
        return 0;
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
