/* The machine's sgemm peak as OpenBLAS reaches it: a large square row-major sgemm.
 * usage: bench_sgemm THREADS [N] [PRECISION]  -> one JSON line with GFLOP/s (best of several runs)
 * and the kernels OpenBLAS runs ("core": its own pick for the CPU, or what OPENBLAS_CORETYPE
 * forces). PRECISION bf16: dt_gemm_bf16's peak instead (what --precision bf16's products run on). */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compute/kernels.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1, n = argc > 2 ? atoi(argv[2]) : 2048;
    const int bf16 = argc > 3 && !strcmp(argv[3], "bf16");
    dt_cpu cpu;
    dt_cpu_init(&cpu, threads);
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n),
          *c = malloc(sizeof(float) * n * n);
    if (!a || !b || !c) return 1;
    for (long i = 0; i < (long)n * n; i++) a[i] = (float)(i % 7) * 0.1f, b[i] = (float)(i % 5) * 0.1f;
    double best = 0;
    for (int r = 0; r < 6; r++) {
        double t = now();
        (bf16 ? dt_gemm_bf16 : dt_gemm)(&cpu, 0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double gf = 2.0 * n * n * (double)n / (now() - t) * 1e-9;
        if (r > 0 && gf > best) best = gf;
    }
    printf("{\"impl\": \"%s\", \"threads\": %d, \"n\": %d, \"gflops\": %.1f, \"core\": \"%s\"}\n",
           bf16 ? "gemm_bf16" : "sgemm", threads, n, best, openblas_get_corename());
    free(a), free(b), free(c);
    return 0;
}
