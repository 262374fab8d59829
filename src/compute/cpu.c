/* The CPU backend's context (kernels.h, dt_cpu): a thread count between 1 and the cores. The cores and
 * OpenMP's default are read once per process, when OpenBLAS is also pinned to one thread (the kernels
 * split the work themselves, conv_cpu.c). */
#include <cblas.h>
#include <fcntl.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
    cpu->bf16 = 0;
}

/* The cores other work leaves free: the cores less the runnable tasks of the whole machine
 * (/proc/loadavg's fourth field, this thread left out), read at most every 50 ms. A region waits
 * for its slowest thread, and a thread without a core waits a scheduler's slice: with every core
 * busy, 2 threads lost to 1 at any size measured (bench/bench_par). Where the file cannot be read:
 * every core. */
static const char *g_loadavg = "/proc/loadavg";
static int64_t g_free_next; /* CLOCK_MONOTONIC_COARSE ns of the next read */
static int g_free = -1;

void dt_cpu_set_loadavg_path(const char *path) {
    g_loadavg = path ? path : "/proc/loadavg";
    __atomic_store_n(&g_free_next, 0, __ATOMIC_RELAXED);
}

static int free_cores(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    int64_t now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    if (now < __atomic_load_n(&g_free_next, __ATOMIC_RELAXED)) return __atomic_load_n(&g_free, __ATOMIC_RELAXED);
    int cores = dt_cpu_cores(), free_now = cores;
    char buf[128];
    int fd = open(g_loadavg, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0) close(fd);
    if (n > 0) {
        buf[n] = 0;
        const char *p = buf; /* "0.50 0.40 0.30 R/T last_pid": R runnable now, this thread included */
        for (int field = 0; field < 3 && p; field++) p = strchr(p, ' '), p = p ? p + 1 : NULL;
        long running = p ? strtol(p, NULL, 10) : 0;
        if (running >= 1) free_now = cores - (int)(running - 1);
    }
    if (free_now < 1) free_now = 1;
    __atomic_store_n(&g_free, free_now, __ATOMIC_RELAXED);
    __atomic_store_n(&g_free_next, now + 50000000, __ATOMIC_RELAXED);
    return free_now;
}

int dt_cpu_par(const dt_cpu *cpu, double work, double min_work, int max_threads) {
    int nt = cpu->threads < max_threads ? cpu->threads : max_threads;
    if (nt <= 1 || omp_in_parallel()) return 1;
    if (!cpu->par_always) {
        if (work < min_work) return 1;
        int free_now = free_cores();
        if (nt > free_now) nt = free_now;
        if (nt <= 1) return 1;
    }
    __atomic_add_fetch(&g_regions, 1, __ATOMIC_RELAXED);
    return nt;
}

uint64_t dt_cpu_regions(void) { return __atomic_load_n(&g_regions, __ATOMIC_RELAXED); }
