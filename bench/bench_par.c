/* Where a second thread pays, per kind of loop (src/compute/cpu.c, g_par_min): each kind's kernel at
 * sizes doubling from small to large, timed with 1 thread and with 2 (every region entered, at any
 * size: dt_cpu.par_always), interleaved, the median of ROUNDS. Prints per size the work, one
 * thread's time and the ratio t(2)/t(1), and per kind the least work from which 2 threads are no
 * slower than 1 at every size above it (the break-even). Run it idle and beside a busy loop
 * (bench/threads.sh does both): the thresholds in cpu.h sit at or above the loaded break-evens.
 *
 *   bench_par [ROUNDS]      (default 15)
 *
 * Kinds, as cpu.h counts their work:
 *   stream  dt_relu_forward over n floats                        (floats)
 *   gather  dt_embedding_forward, 26 fields of dim 8, random rows (batch x 26 x 8 floats)
 *   fm      dt_fm_forward, 26 fields of dim 8                     (batch x 26 x 8 floats)
 *   flops   dt_gemm [batch, 221] x [221, 200] (deepfm's first dense layer) (2 x M x N x K) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compute/kernels.h"
#include "core/rng.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

enum { STREAM, GATHER, FM, FLOPS, KINDS };
static const char *names[KINDS] = {"stream", "gather", "fm", "flops"};

#define F 26
#define D 8
#define TABLE_ROWS (1 << 18)
#define MAX_BATCH 65536

static float *in, *out, *table, *w;
static int64_t *offsets, *rows;
static int32_t fields[F];

static void *must(void *p) {
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

/* The kernel of kind k at size s (its batch, or floats for stream); returns its work in cpu.h's units. */
static double run(int k, size_t s, const dt_cpu *cpu) {
    switch (k) {
    case STREAM:
        dt_relu_forward(cpu, out, in, s);
        return (double)s;
    case GATHER: {
        dt_bags b = {.offsets = offsets, .num_fields = F, .field = fields, .n_fields = F, .rows = rows,
                     .batch = (int)s, .dim = D};
        dt_embedding_forward(cpu, out, table, &b);
        return (double)s * F * D;
    }
    case FM:
        dt_fm_forward(cpu, out, in, (int)s, F, D);
        return (double)s * F * D;
    default:
        dt_gemm(cpu, 0, 0, (int)s, 200, 221, 1.0f, in, 221, w, 200, 0.0f, out, 200);
        return 2.0 * (double)s * 200 * 221;
    }
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 15;
    if (rounds < 1) rounds = 1;
    size_t nf = (size_t)MAX_BATCH * F * D * 4;
    in = must(malloc(nf * sizeof(float))), out = must(malloc(nf * sizeof(float)));
    table = must(malloc((size_t)TABLE_ROWS * D * sizeof(float))), w = must(malloc(221 * 200 * sizeof(float)));
    offsets = must(malloc(((size_t)MAX_BATCH * F + 1) * sizeof(int64_t)));
    rows = must(malloc((size_t)MAX_BATCH * F * sizeof(int64_t)));
    dt_rng r;
    dt_rng_seed(&r, 1);
    for (size_t i = 0; i < nf; i++) in[i] = dt_rng_uniform(&r) - 0.5f;
    for (size_t i = 0; i < (size_t)TABLE_ROWS * D; i++) table[i] = dt_rng_uniform(&r);
    for (size_t i = 0; i < 221 * 200; i++) w[i] = dt_rng_uniform(&r);
    for (size_t i = 0; i <= (size_t)MAX_BATCH * F; i++) offsets[i] = (int64_t)i;
    for (size_t i = 0; i < (size_t)MAX_BATCH * F; i++) rows[i] = (int64_t)(dt_rng_next(&r) % TABLE_ROWS);
    for (int f = 0; f < F; f++) fields[f] = f;
    dt_cpu one, two;
    dt_cpu_init(&one, 1), dt_cpu_init(&two, 2);
    one.par_always = two.par_always = 1;
    printf("%-6s %12s %12s %8s\n", "kind", "work", "1 thread us", "t2/t1");
    for (int k = 0; k < KINDS; k++) {
        size_t lo = k == STREAM ? 1024 : 4, hi = k == STREAM ? (size_t)MAX_BATCH * F * D * 4 : MAX_BATCH / (k == FLOPS ? 4 : 1);
        double even = -1; /* the least work from which 2 threads are no slower, at every size above */
        for (size_t s = lo; s <= hi; s *= 2) {
            double t[2][64], work = 0;
            int n = rounds < 64 ? rounds : 64;
            for (int i = 0; i < n; i++)
                for (int c = 0; c < 2; c++) {
                    const dt_cpu *cpu = (i + c) % 2 ? &two : &one; /* alternate which goes first */
                    int reps = 1;
                    double t0 = now(), dt;
                    while ((dt = now() - t0) < 2e-3 || reps < 2) { /* at least 2 ms a sample */
                        work = run(k, s, cpu);
                        reps++;
                    }
                    t[cpu == &two][i] = dt / (reps - 1);
                }
            qsort(t[0], (size_t)n, sizeof(double), cmp), qsort(t[1], (size_t)n, sizeof(double), cmp);
            double t1 = t[0][n / 2], t2 = t[1][n / 2], ratio = t2 / t1;
            printf("%-6s %12.0f %12.1f %8.2f\n", names[k], work, t1 * 1e6, ratio);
            fflush(stdout);
            if (ratio <= 1.0 && even < 0) even = work;
            if (ratio > 1.0) even = -1;
        }
        if (even < 0) printf("%-6s break-even: none up to the largest size\n", names[k]);
        else printf("%-6s break-even: %.0f\n", names[k], even);
    }
    return 0;
}
