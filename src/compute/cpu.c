/* The CPU kernels' threads: how many OpenMP threads they use, and the cores (the cap, and what scratch is
 * sized for). OpenBLAS is pinned to one thread once per process (see conv_cpu.c). */
#include <cblas.h>
#include <omp.h>
#include <pthread.h>

#include "compute/cpu.h"
#include "compute/kernels.h"

static int g_threads;         /* OpenMP threads the kernels use; set once by init, then by the user */
static int g_max_threads;     /* cores: the cap, and what scratch is sized for */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void init_once(void) {
    g_max_threads = omp_get_num_procs();
    if (g_max_threads < 1) g_max_threads = 1;
    int t = omp_get_max_threads(); /* honours OMP_NUM_THREADS */
    g_threads = t < 1 ? 1 : t > g_max_threads ? g_max_threads : t;
    openblas_set_num_threads(1);
}

int dt_cpu_threads(void) {
    pthread_once(&g_once, init_once);
    return __atomic_load_n(&g_threads, __ATOMIC_RELAXED);
}

int dt_cpu_max_threads(void) {
    pthread_once(&g_once, init_once);
    return g_max_threads;
}

void dt_kernels_set_threads(int n) {
    pthread_once(&g_once, init_once);
    if (n <= 0 || n > g_max_threads) n = g_max_threads;
    __atomic_store_n(&g_threads, n, __ATOMIC_RELAXED);
}

int dt_kernels_get_threads(void) { return dt_cpu_threads(); }
