/* The CPU backend's context (kernels.h, dt_cpu): a thread count between 1 and the cores. The cores and
 * OpenMP's default are read once per process, when OpenBLAS is also pinned to one thread (the kernels
 * split the work themselves, conv_cpu.c). */
#include <cblas.h>
#include <omp.h>
#include <pthread.h>

#include "compute/cpu.h"
#include "compute/kernels.h"

static uint64_t g_regions;     /* parallel regions entered (dt_cpu_regions) */
static int g_cores;           /* the cap, and what scratch is sized for */
static int g_default;         /* OpenMP's default thread count, capped */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void init_once(void) {
    g_cores = omp_get_num_procs();
    if (g_cores < 1) g_cores = 1;
    int t = omp_get_max_threads(); /* honours OMP_NUM_THREADS */
    g_default = t < 1 ? 1 : t > g_cores ? g_cores : t;
    openblas_set_num_threads(1);
}

int dt_cpu_cores(void) {
    pthread_once(&g_once, init_once);
    return g_cores;
}

int dt_cpu_default_threads(void) {
    pthread_once(&g_once, init_once);
    return g_default;
}

void dt_cpu_init(dt_cpu *cpu, int threads) {
    int cores = dt_cpu_cores(); /* also pins OpenBLAS to one thread, before any kernel runs */
    cpu->threads = threads <= 0 || threads > cores ? cores : threads;
    cpu->par_always = 0;
}

int dt_cpu_par(const dt_cpu *cpu, double work, double min_work, int max_threads) {
    int nt = cpu->threads < max_threads ? cpu->threads : max_threads;
    if (nt <= 1 || omp_in_parallel() || (!cpu->par_always && work < min_work)) return 1;
    __atomic_add_fetch(&g_regions, 1, __ATOMIC_RELAXED);
    return nt;
}

uint64_t dt_cpu_regions(void) { return __atomic_load_n(&g_regions, __ATOMIC_RELAXED); }
