/* The CPU backend's context (kernels.h, dt_cpu): a thread count between 1 and the cores. The cores and
 * OpenMP's default are read once per process, when OpenBLAS is also pinned to one thread (the kernels
 * split the work themselves, conv_cpu.c). */
#include <cblas.h>
#include <dirent.h>
#include <fcntl.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "compute/cpu.h"
#include "compute/kernels.h"

static uint64_t g_regions;     /* parallel regions entered (dt_cpu_regions) */
static int g_passive;          /* OpenMP's waiting threads sleep at once (OMP_WAIT_POLICY=passive) */
static int g_cores;           /* the cap, and what scratch is sized for */
static int g_default;         /* OpenMP's default thread count, capped */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void init_once(void) {
    g_cores = omp_get_num_procs();
    if (g_cores < 1) g_cores = 1;
    int t = omp_get_max_threads(); /* honours OMP_NUM_THREADS */
    g_default = t < 1 ? 1 : t > g_cores ? g_cores : t;
    const char *policy = getenv("OMP_WAIT_POLICY"), *spin = getenv("GOMP_SPINCOUNT");
    g_passive = (policy && !strcasecmp(policy, "passive")) || (spin && !strcmp(spin, "0"));
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
 * (/proc/loadavg's fourth field) that are not this process's own threads, read at most every
 * 50 ms. A region waits for its slowest thread, and a thread without a core waits a scheduler's
 * slice: with every core busy, 2 threads lost to 1 at any size measured (bench/bench_par). Our own
 * threads must not count: OpenMP's workers spin for a while after each region (libgomp's default
 * wait policy), and counting them kept the next regions on one thread on an idle machine (issue
 * 36: fashion 1.20x at 2 threads instead of 1.84x). Where the file cannot be read: every core. */
static const char *g_loadavg = "/proc/loadavg";
static int64_t g_free_next; /* CLOCK_MONOTONIC_COARSE ns of the next read */
static int g_free = -1;

void dt_cpu_set_loadavg_path(const char *path) {
    g_loadavg = path ? path : "/proc/loadavg";
    __atomic_store_n(&g_free_next, 0, __ATOMIC_RELAXED);
}

/* This process's runnable threads (state R in /proc/self/task/TID/stat), this one included. */
static int own_runnable(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return 1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        char path[64], buf[256];
        snprintf(path, sizeof path, "/proc/self/task/%.20s/stat", e->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t len = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (len <= 0) continue;
        buf[len] = 0;
        const char *p = strrchr(buf, ')'); /* "TID (comm) S ...": comm may hold spaces and ')' */
        if (p && p[1] == ' ' && p[2] == 'R') n++;
    }
    closedir(d);
    return n < 1 ? 1 : n;
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
        long others = running - own_runnable();
        if (others > 0) free_now = cores - (int)(others < cores ? others : cores);
    }
    if (free_now < 1) free_now = 1;
    __atomic_store_n(&g_free, free_now, __ATOMIC_RELAXED);
    __atomic_store_n(&g_free_next, now + 50000000, __ATOMIC_RELAXED);
    return free_now;
}

/* The least work per kind from which 2 threads beat 1 for good, on the idle 2-core machine
 * (bench/bench_par, BENCHMARKS.md "Threads"), by the cost of waking a thread, which OpenMP's wait
 * policy sets: a spinning worker (libgomp's default: C programs that link libdtrain) starts in a
 * microsecond, a sleeping one (passive: what `dtrain` and `import dtrain` set, so that threads
 * without work never hold a core another process needs, issue 36) in tens of microseconds.
 *   spinning (break-evens stream 8-32K, gather 0.8-6.7K, fm 1.7-6.7K, flops 0.35-2.8M);
 *   passive  (stream 2M, gather 53K, fm above 13M for the kernel alone (a whole click-log step
 *            measured no loss at 4M), flops 22.6M).
 * A single table at the passive figures cost the image models their 2-thread gain under the
 * spinning policy, and one at the spinning figures made click-log models slower at 2 threads
 * under the passive one (issue 36). The load check (free_cores) covers a busy machine for both. */
static const double g_par_min[2][DT_PAR_KINDS] = {
    [0] = {[DT_PAR_STREAM] = 32768, [DT_PAR_GATHER] = 8192, [DT_PAR_FM] = 8192, [DT_PAR_FLOPS] = 4e6},
    [1] = {[DT_PAR_STREAM] = 2097152, [DT_PAR_GATHER] = 1048576, [DT_PAR_FM] = 4194304, [DT_PAR_FLOPS] = 2.5e7},
};

double dt_cpu_par_min(int kind) {
    pthread_once(&g_once, init_once);
    return kind >= 0 && kind < DT_PAR_KINDS ? g_par_min[g_passive][kind] : 0.0;
}

int dt_cpu_par(const dt_cpu *cpu, double work, int kind, int max_threads) {
    double min_work = dt_cpu_par_min(kind);
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
