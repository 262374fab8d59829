/* Push + pull round trip through a parameter server on loopback: 1 ps process and 2 worker
 * processes pushing and pulling at the same time, for the fashion (421,642 floats, 1.7 MB) and
 * cats-vs-dogs (2,126,178 floats, 8.5 MB) parameter sizes, with both client calls a worker may
 * use (one fused push_pull exchange; push_all then pull_all). Beside it, in the same run, the
 * time plain TCP on loopback needs to move the same bytes there and back (one client, one echo
 * server: what one worker's traffic costs without any protocol; the ps serves two).
 *
 * With AUTH curve, only the fused exchange runs, over ZeroMQ CURVE (authenticated and encrypted,
 * docs/security.md; keys made in memory): the cost of encryption against the rows without it.
 *
 * usage: bench_pushpull [ITERS] [OPTIMIZER] [MODEL|all] [none|curve]   (defaults: 50 sgd all none)
 * Prints a table on stderr and one JSON line per measurement on stdout. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "compute/optim.h"
#include "core/error.h"
#include "ps/ps.h"
#include "transport/auth.h"
#include "transport/zmq_io.h"
#include "worker/ps_client.h"

#define WORKERS 2
#define WARMUP 5

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double quantile(double *v, int n, double q) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)(q * (n - 1) + 0.5);
    return v[i];
}

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

/* --auth=curve in memory: one server pair, one client pair (every worker uses it), authorized. */
static dt_auth server_auth, client_auth;
static const dt_auth *ps_auth, *cl_auth;
static char allowed[1][DT_Z85_KEY_LEN + 1];

static int make_curve_keys(void) {
    if (zmq_curve_keypair(server_auth.public_key, server_auth.secret_key) ||
        zmq_curve_keypair(client_auth.public_key, client_auth.secret_key))
        return -1;
    memcpy(client_auth.server_key, server_auth.public_key, sizeof client_auth.server_key);
    memcpy(allowed[0], client_auth.public_key, sizeof allowed[0]);
    server_auth.allowed = allowed;
    server_auth.n_allowed = 1;
    server_auth.curve = client_auth.curve = 1;
    ps_auth = &server_auth, cl_auth = &client_auth;
    return 0;
}

static int ps_fd = -1;
static void on_bound(void *user, const char *ep) {
    (void)user;
    write_full(ps_fd, ep, strlen(ep) + 1);
    close(ps_fd);
}

static int use_ipc; /* the ps listens on a Unix socket instead of TCP loopback */

static pid_t start_ps(size_t n, char *ep, size_t cap) {
    int fds[2];
    if (pipe(fds)) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        ps_fd = fds[1];
        alarm(600);
        /* ipc: the same-host fast path a loopback ps also offers (cluster.h: dt_addr_ipc_endpoint). */
        char ipc[128];
        snprintf(ipc, sizeof ipc, "ipc:///tmp/dtrain-bench-%d.sock", (int)getpid());
        dt_ps_config cfg = {.endpoint = use_ipc ? ipc : "tcp://127.0.0.1:*", .shard_floats = n, .on_bound = on_bound,
                            .auth = ps_auth};
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

static dt_ps_client *open_client(const char *ep, size_t n, dt_wire_role role, int task) {
    const char *eps[1] = {ep};
    size_t sizes[1] = {n};
    dt_ps_client_config cc = {.n_ps = 1, .endpoints = eps, .shard_floats = sizes, .role = role, .task = task,
                              .connect_timeout_ms = 10000, .request_timeout_ms = 30000,
                              .auth = cl_auth};
    dt_ps_client *c = NULL;
    dt_error e = {0};
    if (dt_ps_client_open(&c, &cc, &e)) fprintf(stderr, "client: %s\n", e.msg);
    return c;
}

/* A worker process: waits for "go", then times ITERS push+pull round trips and writes them
 * (doubles, ms) to fd. fused: one dt_ps_client_push_pull exchange (then the copy into the
 * worker's buffer, which a worker makes anyway); else push_all then pull_all. */
static void worker(const char *ep, size_t n, int task, int iters, int fused, int go_fd, int out_fd) {
    dt_ps_client *c = open_client(ep, n, DT_ROLE_WORKER, task);
    float *g = dt_alloc_floats(n, "grads", NULL), *p = dt_alloc_floats(n, "params", NULL);
    double *t = calloc((size_t)iters, sizeof *t);
    if (!c || !g || !p || !t) _exit(1);
    for (size_t i = 0; i < n; i++) g[i] = 1e-6f * (float)(i % 100);
    char go;
    if (read_full(go_fd, &go, 1)) _exit(1);
    dt_error e = {0};
    const float *gs[1] = {g};
    float *ps[1] = {p};
    for (int k = -WARMUP; k < iters; k++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        int rc;
        if (fused) {
            const float *views[1];
            rc = dt_ps_client_push_pull(c, gs, k + WARMUP, 0, views, NULL, NULL, &e);
            if (!rc) memcpy(p, views[0], n * sizeof(float));
        } else {
            rc = dt_ps_client_push_all(c, gs, k + WARMUP, NULL, &e) || dt_ps_client_pull_all(c, ps, 0, NULL, &e);
        }
        if (rc) {
            fprintf(stderr, "worker %d: %s\n", task, e.msg);
            _exit(1);
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        if (k >= 0) t[k] = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) * 1e-6;
    }
    write_full(out_fd, t, sizeof *t * (size_t)iters);
    dt_ps_client_close(c);
    _exit(0);
}

static int run_pushpull(const char *label, size_t n, int iters, const char *opt_name, int fused) {
    char ep[256];
    pid_t ps = start_ps(n, ep, sizeof ep);
    if (ps < 0) return 1;
    dt_ps_client *chief = open_client(ep, n, DT_ROLE_CHIEF, 0);
    float *p0 = dt_alloc_floats(n, "params", NULL);
    dt_opt_config opt;
    dt_error e = {0};
    if (!chief || !p0 || dt_opt_config_init(&opt, opt_name, 1e-4f, &e)) {
        fprintf(stderr, "bench: %s\n", e.msg);
        kill(ps, SIGKILL);
        return 1;
    }
    const float *src[1] = {p0};
    if (dt_ps_client_init(chief, &opt, src, NULL, NULL, 0, &e)) {
        fprintf(stderr, "bench: init: %s\n", e.msg);
        kill(ps, SIGKILL);
        return 1;
    }
    int go[2], res[WORKERS][2];
    pid_t w[WORKERS];
    if (pipe(go)) return 1;
    for (int k = 0; k < WORKERS; k++) {
        if (pipe(res[k])) return 1;
        fflush(NULL);
        if ((w[k] = fork()) == 0) {
            close(go[1]);
            close(res[k][0]);
            alarm(600);
            worker(ep, n, k + 1, iters, fused, go[0], res[k][1]);
        }
        close(res[k][1]);
    }
    close(go[0]);
    char gobytes[WORKERS] = {0};
    write_full(go[1], gobytes, WORKERS);
    close(go[1]);
    double *all = calloc((size_t)(WORKERS * iters), sizeof *all);
    int ok = all != NULL;
    for (int k = 0; k < WORKERS; k++) {
        if (ok && read_full(res[k][0], all + k * iters, sizeof *all * (size_t)iters)) ok = 0;
        close(res[k][0]);
        int st;
        waitpid(w[k], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) ok = 0;
    }
    if (dt_ps_client_shutdown(chief, &e)) fprintf(stderr, "bench: shutdown: %s\n", e.msg);
    dt_ps_client_close(chief);
    int st;
    waitpid(ps, &st, 0);
    if (ok) {
        int m = WORKERS * iters;
        double med = quantile(all, m, 0.5), p90 = quantile(all, m, 0.9);
        double bytes = 2.0 * (double)n * 4; /* pushed + pulled per worker */
        /* Both workers move their bytes in the median time: aggregate through the ps. */
        double gbs = WORKERS * bytes / (med * 1e-3) / 1e9;
        const char *how = fused ? "push_pull" : "push_all+pull_all", *auth = ps_auth ? "curve" : "none";
        fprintf(stderr, "%-8s %6.2f MB  %-17s %d workers, %s, auth %s: median %7.3f ms  p90 %7.3f ms  (%.2f GB/s through the ps)\n",
                label, n * 4 / 1e6, how, WORKERS, opt_name, auth, med, p90, gbs);
        printf("{\"bench\":\"pushpull\",\"api\":\"%s\",\"model\":\"%s\",\"bytes\":%zu,\"workers\":%d,"
               "\"optimizer\":\"%s\",\"auth\":\"%s\",\"transport\":\"%s\",\"iters\":%d,\"median_ms\":%.4f,"
               "\"p90_ms\":%.4f,\"gbytes_per_s\":%.3f}\n",
               how, label, n * 4, WORKERS, opt_name, auth, use_ipc ? "ipc" : "tcp", iters, med, p90, gbs);
    } else {
        fprintf(stderr, "bench: a worker failed\n");
    }
    free(all);
    free(p0);
    return ok ? 0 : 1;
}

/* Plain TCP on loopback: send bytes, the server echoes them back, per round trip. */
static int run_tcp(const char *label, size_t bytes, int iters) {
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1) ||
        getsockname(ls, (struct sockaddr *)&a, &len))
        return 1;
    char *buf = malloc(bytes);
    if (!buf) return 1;
    memset(buf, 1, bytes);
    int total = iters + WARMUP;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(600);
        int s = accept(ls, NULL, NULL);
        for (int k = 0; k < total; k++)
            if (read_full(s, buf, bytes) || write_full(s, buf, bytes)) _exit(1);
        _exit(0);
    }
    close(ls);
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(s, (struct sockaddr *)&a, sizeof a)) return 1;
    double *t = calloc((size_t)iters, sizeof *t);
    int ok = t != NULL;
    for (int k = 0; ok && k < total; k++) {
        struct timespec x, y;
        clock_gettime(CLOCK_MONOTONIC, &x);
        /* A sender thread would let both directions overlap; a plain echo is what one worker's
         * push-then-pull amounts to. */
        if (write_full(s, buf, bytes) || read_full(s, buf, bytes)) ok = 0;
        clock_gettime(CLOCK_MONOTONIC, &y);
        if (k >= WARMUP) t[k - WARMUP] = (double)(y.tv_sec - x.tv_sec) * 1e3 + (double)(y.tv_nsec - x.tv_nsec) * 1e-6;
    }
    close(s);
    int st;
    waitpid(pid, &st, 0);
    if (ok) {
        double med = quantile(t, iters, 0.5), p90 = quantile(t, iters, 0.9);
        double gbs = 2.0 * bytes / (med * 1e-3) / 1e9;
        fprintf(stderr, "%-8s %6.2f MB  plain TCP echo    1 client:       median %7.3f ms  p90 %7.3f ms  (%.2f GB/s)\n",
                label, bytes / 1e6, med, p90, gbs);
        printf("{\"bench\":\"tcp_loopback\",\"model\":\"%s\",\"bytes\":%zu,\"iters\":%d,\"median_ms\":%.4f,"
               "\"p90_ms\":%.4f,\"gbytes_per_s\":%.3f}\n", label, bytes, iters, med, p90, gbs);
    }
    free(t);
    free(buf);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 50;
    const char *opt = argc > 2 ? argv[2] : "sgd", *only = argc > 3 ? argv[3] : NULL;
    int curve = argc > 4 && !strcmp(argv[4], "curve");
    use_ipc = argc > 4 && !strcmp(argv[4], "ipc");
    if (only && (!*only || !strcmp(only, "all"))) only = NULL;
    if (iters < 1) iters = 1;
    if (curve && make_curve_keys()) {
        fprintf(stderr, "bench: zmq_curve_keypair failed (libzmq without CURVE?)\n");
        return 1;
    }
    static const struct { const char *label; size_t floats; } sizes[] = {
        {"fashion", 421642}, {"catdog", 2126178}};
    int rc = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        if (only && strcmp(only, sizes[i].label) != 0) continue;
        rc |= run_pushpull(sizes[i].label, sizes[i].floats, iters, opt, 1);
        if (curve || use_ipc) continue;
        rc |= run_pushpull(sizes[i].label, sizes[i].floats, iters, opt, 0);
        rc |= run_tcp(sizes[i].label, sizes[i].floats * 4, iters);
    }
    return rc;
}
