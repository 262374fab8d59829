/* CPU costs of the ps and the worker per message and per byte, for the SimGrid model (sim/,
 * docs/testbed.md "A simulated training step"). One ps process and W worker processes on TCP
 * loopback, sync replicas (replicas_to_aggregate = W), Adam, each worker one fused push_pull per
 * step (every chunk a PUSH answered by its PARAMS at the next step): what a worker's step does on
 * the wire. Over shard sizes S, cuts into m chunks and W = 1, 2, it reads the CPU time of the ps
 * process (every thread: its loop and ZeroMQ's I/O thread; clock_getcpuclockid) and of each
 * worker over STEPS steps after a warm-up, and fits by least squares
 *   ps CPU per step     = W m ps_msg + W S ps_byte + m ps_apply_msg + S ps_apply_byte
 *   worker CPU per step = m worker_msg + S worker_byte
 * (ps_msg, ps_byte: a PUSH received and summed and its PARAMS sent, per message and per byte of
 * gradient; ps_apply_*: the optimizer's update of a chunk once per step, in sync mode; an async
 * push costs both). CPU time, not wall time: other load on the machine slows the run but hardly
 * moves these (caches aside).
 * usage: bench_simcost [STEPS [ROUNDS]]   (defaults 30, 3: every point once per round, the median fitted). Prints the points and the fit on stderr, and on
 * stdout the cost file sim/ reads (sim/costs.txt; the command is written in it). */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "compute/optim.h"
#include "core/error.h"
#include "ps/ps.h"
#include "transport/wire.h"
#include "worker/ps_client.h"

#define WARMUP 5
#define MAXW 2

static int read_full(int fd, void *buf, size_t n) {
    char *p = buf;
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r, n -= (size_t)r;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n) {
        ssize_t r = write(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r, n -= (size_t)r;
    }
    return 0;
}

static double cpu_of(clockid_t id) {
    struct timespec t;
    if (clock_gettime(id, &t)) return -1;
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static int ps_fd = -1;
static void on_bound(void *user, const char *ep) {
    (void)user;
    write_full(ps_fd, ep, strlen(ep) + 1);
    close(ps_fd);
}

static pid_t start_ps(size_t n, char *ep, size_t cap) {
    int fds[2];
    if (pipe(fds)) return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        ps_fd = fds[1];
        alarm(600);
        dt_ps_config cfg = {.endpoint = "tcp://127.0.0.1:*", .shard_floats = n, .on_bound = on_bound};
        dt_error e = {0};
        int rc = dt_ps_serve(&cfg, &e);
        if (rc) fprintf(stderr, "ps: %s\n", e.msg);
        _exit(rc ? 1 : 0);
    }
    close(fds[1]);
    size_t len = 0;
    while (len < cap - 1) {
        ssize_t r = read(fds[0], ep + len, 1);
        if (r <= 0 || ep[len] == '\0') break;
        len++;
    }
    ep[len] = '\0';
    close(fds[0]);
    return len ? pid : -1;
}

static dt_ps_client *open_client(const char *ep, size_t n, dt_wire_role role, int task, int w, int64_t chunk) {
    const char *eps[1] = {ep};
    size_t sizes[1] = {n};
    dt_ps_client_config cc = {.n_ps = 1, .endpoints = eps, .shard_floats = sizes, .role = role, .task = task,
                              .connect_timeout_ms = 10000, .request_timeout_ms = 60000,
                              .replicas_to_aggregate = w, .total_num_replicas = w, .n_workers = w,
                              .chunk_bytes = chunk};
    dt_ps_client *c = NULL;
    dt_error e = {0};
    if (dt_ps_client_open(&c, &cc, &e)) fprintf(stderr, "client: %s\n", e.msg);
    return c;
}

/* A worker: WARMUP steps, then "ready", waits for "go", STEPS timed steps; writes its CPU seconds
 * and wall seconds over those. */
static void worker(const char *ep, size_t n, int task, int w, int64_t chunk, int steps, int ready_fd, int go_fd,
                   int out_fd) {
    dt_ps_client *c = open_client(ep, n, DT_ROLE_WORKER, task, w, chunk);
    float *g = dt_alloc_floats(n, "grads", NULL), *p = dt_alloc_floats(n, "params", NULL);
    if (!c || !g || !p) _exit(1);
    for (size_t i = 0; i < n; i++) g[i] = 1e-6f * (float)(i % 100);
    const float *gs[1] = {g};
    dt_error e = {0};
    double cpu0 = 0, wall0 = 0;
    for (int k = 0; k < WARMUP + steps; k++) {
        if (k == WARMUP) {
            char b = 0;
            if (write_full(ready_fd, &b, 1) || read_full(go_fd, &b, 1)) _exit(1);
            cpu0 = cpu_of(CLOCK_PROCESS_CPUTIME_ID), wall0 = cpu_of(CLOCK_MONOTONIC);
        }
        const float *views[1];
        /* Sync: the gradient of step k, its parameters back at step k + 1 (the barrier). */
        if (dt_ps_client_push_pull(c, gs, k, k + 1, views, NULL, NULL, &e)) {
            fprintf(stderr, "worker %d: %s\n", task, e.msg);
            _exit(1);
        }
        memcpy(p, views[0], n * sizeof(float)); /* the copy into the net a worker makes */
    }
    double r[2] = {cpu_of(CLOCK_PROCESS_CPUTIME_ID) - cpu0, cpu_of(CLOCK_MONOTONIC) - wall0};
    write_full(out_fd, r, sizeof r);
    dt_ps_client_close(c);
    _exit(0);
}

typedef struct {
    size_t n;
    unsigned m;
    int w;
    double ps_cpu, worker_cpu, wall; /* per step; worker_cpu: mean over workers */
} point;

static int run_point(point *pt, int64_t chunk, int steps) {
    char ep[256];
    pid_t ps = start_ps(pt->n, ep, sizeof ep);
    if (ps < 0) return 1;
    clockid_t ps_clock;
    dt_ps_client *chief = open_client(ep, pt->n, DT_ROLE_CHIEF, 0, pt->w, chunk);
    float *p0 = dt_alloc_floats(pt->n, "params", NULL);
    dt_opt_config opt;
    dt_error e = {0};
    const float *src[1] = {p0};
    if (!chief || !p0 || clock_getcpuclockid(ps, &ps_clock) || dt_opt_config_init(&opt, "adam", 1e-4f, &e) ||
        dt_ps_client_init(chief, &opt, src, NULL, NULL, 0, &e)) {
        fprintf(stderr, "bench: %s\n", e.msg);
        kill(ps, SIGKILL);
        return 1;
    }
    memset(p0, 0, pt->n * sizeof *p0);
    int ready[2], go[2], res[MAXW][2];
    pid_t wp[MAXW];
    if (pipe(ready) || pipe(go)) return 1;
    for (int k = 0; k < pt->w; k++) {
        if (pipe(res[k])) return 1;
        fflush(NULL);
        if ((wp[k] = fork()) == 0) {
            close(go[1]), close(ready[0]), close(res[k][0]);
            alarm(600);
            worker(ep, pt->n, k, pt->w, chunk, steps, ready[1], go[0], res[k][1]);
        }
        close(res[k][1]);
    }
    close(go[0]), close(ready[1]);
    char b[MAXW] = {0};
    int ok = !read_full(ready[0], b, (size_t)pt->w);
    double ps0 = cpu_of(ps_clock);
    ok = ok && !write_full(go[1], b, (size_t)pt->w);
    close(go[1]), close(ready[0]);
    double wcpu = 0, wall = 0;
    for (int k = 0; k < pt->w; k++) {
        double r[2];
        if (ok && read_full(res[k][0], r, sizeof r)) ok = 0;
        if (ok) wcpu += r[0], wall = r[1] > wall ? r[1] : wall;
        close(res[k][0]);
    }
    double ps1 = cpu_of(ps_clock); /* before SHUTDOWN: the ps still runs */
    for (int k = 0; k < pt->w; k++) {
        int st;
        waitpid(wp[k], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) ok = 0;
    }
    pt->m = (unsigned)dt_ps_client_chunks(chief, 0);
    if (dt_ps_client_shutdown(chief, &e)) fprintf(stderr, "bench: shutdown: %s\n", e.msg);
    dt_ps_client_close(chief);
    int st;
    waitpid(ps, &st, 0);
    free(p0);
    pt->ps_cpu = (ps1 - ps0) / steps;
    pt->worker_cpu = wcpu / pt->w / steps;
    pt->wall = wall / steps;
    return ok ? 0 : 1;
}

/* Least squares x[k] minimising sum_i (A[i] . x - y[i])^2 over the columns in use (use[c]), by the
 * normal equations (k <= 4); unused columns get 0. */
static int lsq_cols(int rows, int k, const double (*a)[4], const double *y, const int *use, double *x) {
    double m[4][5] = {{0}};
    int col[4], n = 0;
    for (int c = 0; c < k; c++)
        if (use[c]) col[n++] = c;
    for (int i = 0; i < rows; i++)
        for (int r = 0; r < n; r++) {
            for (int c = 0; c < n; c++) m[r][c] += a[i][col[r]] * a[i][col[c]];
            m[r][n] += a[i][col[r]] * y[i];
        }
    for (int c = 0; c < n; c++) {
        int piv = c;
        for (int r = c + 1; r < n; r++)
            if (fabs(m[r][c]) > fabs(m[piv][c])) piv = r;
        if (m[piv][c] == 0) return -1;
        for (int j = 0; j <= n; j++) {
            double t = m[c][j];
            m[c][j] = m[piv][j], m[piv][j] = t;
        }
        for (int r = 0; r < n; r++) {
            if (r == c) continue;
            double f = m[r][c] / m[c][c];
            for (int j = c; j <= n; j++) m[r][j] -= f * m[c][j];
        }
    }
    for (int c = 0; c < k; c++) x[c] = 0;
    for (int c = 0; c < n; c++) x[col[c]] = m[c][n] / m[c][c];
    return 0;
}

/* The same with every coefficient >= 0 (a cost is never negative; noise can make one so): the
 * most negative is fixed at 0 and the rest fitted again. */
static int lsq(int rows, int k, const double (*a)[4], const double *y, double *x) {
    int use[4] = {1, 1, 1, 1};
    for (;;) {
        if (lsq_cols(rows, k, a, y, use, x)) return -1;
        int worst = -1;
        for (int c = 0; c < k; c++)
            if (x[c] < 0 && (worst < 0 || x[c] < x[worst])) worst = c;
        if (worst < 0) return 0;
        use[worst] = 0;
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 30, rounds = argc > 2 ? atoi(argv[2]) : 3;
    if (steps < 3) steps = 3;
    if (rounds < 1 || rounds > 15) rounds = 3;
    static const size_t sizes[] = {262144, 1048576};        /* 1 MiB and 4 MiB shards */
    static const int64_t chunks[] = {16 << 10, 64 << 10, 256 << 10, 1 << 20};
    enum { NP = 2 * 4 * MAXW };
    point pts[NP];
    double ap[NP][4], yp[NP], aw[NP][4], yw[NP];
    double rp[NP][15], rw[NP][15];
    int np = 0;
    /* every point once per round, rounds interleaved, so a burst of other load on the machine
     * lands on one run of each point; the median of the rounds is fitted */
    for (int round = 0; round < rounds; round++) {
        np = 0;
        for (size_t s = 0; s < 2; s++)
            for (size_t c = 0; c < 4; c++)
                for (int w = 1; w <= MAXW; w++) {
                    point *pt = &pts[np];
                    *pt = (point){.n = sizes[s], .w = w};
                    if (run_point(pt, chunks[c], steps)) {
                        fprintf(stderr, "bench: the run of %zu floats, %lld-byte chunks, %d workers failed\n", pt->n,
                                (long long)chunks[c], w);
                        return 1;
                    }
                    rp[np][round] = pt->ps_cpu, rw[np][round] = pt->worker_cpu;
                    fprintf(stderr, "round %d: S %8.0f B  m %3u chunks  W %d: ps %7.3f ms CPU/step  worker %7.3f ms "
                            "CPU/step  wall %7.3f ms/step\n", round, (double)pt->n * 4, pt->m, w, pt->ps_cpu * 1e3,
                            pt->worker_cpu * 1e3, pt->wall * 1e3);
                    np++;
                }
    }
    for (int i = 0; i < np; i++) {
        point *pt = &pts[i];
        qsort(rp[i], (size_t)rounds, sizeof(double), cmp_double);
        qsort(rw[i], (size_t)rounds, sizeof(double), cmp_double);
        pt->ps_cpu = rp[i][rounds / 2], pt->worker_cpu = rw[i][rounds / 2];
        double S = (double)pt->n * 4, m = pt->m;
        int w = pt->w;
        ap[i][0] = w * m, ap[i][1] = w * S, ap[i][2] = m, ap[i][3] = S;
        yp[i] = pt->ps_cpu;
        aw[i][0] = m, aw[i][1] = S;
        yw[i] = pt->worker_cpu;
    }
    double xp[4], xw[4];
    if (lsq(np, 4, ap, yp, xp) || lsq(np, 2, aw, yw, xw)) {
        fprintf(stderr, "bench: the fit is singular\n");
        return 1;
    }
    time_t now = time(NULL);
    char when[32];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    double load[1] = {0};
    getloadavg(load, 1);
    printf("# CPU seconds per message and per byte of the ps and the worker, read by sim/dtrain_sim.\n");
    printf("# Made by: build/bench_simcost %d %d > sim/costs.txt   (%s, load average %.2f at the end, TCP\n"
           "# loopback; medians of %d interleaved rounds; a negative coefficient is fixed at 0 and the rest refitted)\n",
           steps, rounds, when, load[0], rounds);
    printf("# Fit of ps CPU/step = W m ps_msg + W S ps_byte + m ps_apply_msg + S ps_apply_byte and\n");
    printf("# worker CPU/step = m worker_msg + S worker_byte over these points (S bytes, m chunks, W workers):\n");
    printf("#        S    m  W   ps_ms  fit_ms  worker_ms  fit_ms\n");
    for (int i = 0; i < np; i++) {
        double fp = 0, fw = 0;
        for (int j = 0; j < 4; j++) fp += ap[i][j] * xp[j];
        for (int j = 0; j < 2; j++) fw += aw[i][j] * xw[j];
        printf("# %8.0f %4u %2d %7.3f %7.3f %10.3f %7.3f\n", (double)pts[i].n * 4, pts[i].m, pts[i].w,
               pts[i].ps_cpu * 1e3, fp * 1e3, pts[i].worker_cpu * 1e3, fw * 1e3);
    }
    printf("ps_msg %.4g\nps_byte %.4g\nps_apply_msg %.4g\nps_apply_byte %.4g\nworker_msg %.4g\nworker_byte %.4g\n",
           xp[0], xp[1], xp[2], xp[3], xw[0], xw[1]);
    return 0;
}
