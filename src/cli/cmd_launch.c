/* dtrain launch: a whole cluster on 127.0.0.1. Starts N ps and M worker processes running
 * `dtrain train` with the cluster flags filled in, prefixes each output line with the process's
 * role and index, and exits with the first failure's status after stopping the others. Ctrl-C
 * (SIGINT) or SIGTERM stops everything. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "commands.h"
#include "flags.h"
#include "transport/auth.h"

#define MAX_PROCS 64

typedef struct {
    char label[24];
    pid_t pid;
    int fd[2];          /* stdout, stderr pipes (-1 once closed) */
    char buf[2][4096];  /* partial line per stream */
    size_t len[2];
    int status, exited;
} child;

/* The chief's relayed progress line (train --progress=relay), drawn in place at the bottom of
 * launch's terminal: erased before any other line is printed, drawn again after it. */
static char progress_line[512];
static int progress_shown;

static void progress_erase(void) {
    if (!progress_shown) return;
    fputs("\r\033[K", stderr);
    progress_shown = 0;
}

static void progress_draw(void) {
    if (!progress_line[0]) return;
    fprintf(stderr, "\r\033[K%s", progress_line);
    fflush(stderr);
    progress_shown = 1;
}

/* n ports the kernel says are free now, all different (each socket stays bound until all are
 * chosen: one port closed before the next is asked for can come back twice); the children bind
 * them moments later. -1 with errno on failure. */
static int free_ports(int *ports, int n) {
    int rc = 0, *s = calloc((size_t)n, sizeof *s);
    if (!s) return -1;
    for (int i = 0; i < n; i++) s[i] = -1;
    for (int i = 0; i < n && !rc; i++) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof a;
        if ((s[i] = socket(AF_INET, SOCK_STREAM, 0)) < 0 || bind(s[i], (struct sockaddr *)&a, sizeof a) != 0 ||
            getsockname(s[i], (struct sockaddr *)&a, &len) != 0)
            rc = -1;
        else
            ports[i] = ntohs(a.sin_port);
    }
    int saved = errno;
    for (int i = 0; i < n; i++)
        if (s[i] >= 0) close(s[i]);
    free(s);
    errno = saved;
    return rc;
}

static void flush_line(child *c, int k, int force) {
    FILE *out = k == 0 ? stdout : stderr;
    char *start = c->buf[k];
    size_t left = c->len[k];
    int printed = 0;
    for (;;) {
        char *nl = memchr(start, '\n', left);
        if (!nl) break;
        if (k == 1 && start[0] == '\r') { /* a relayed progress state: drawn, not printed */
            snprintf(progress_line, sizeof progress_line, "[%s] %.*s", c->label, (int)(nl - start - 1), start + 1);
        } else {
            progress_erase();
            fprintf(out, "[%s] %.*s\n", c->label, (int)(nl - start), start);
            printed = 1;
        }
        left -= (size_t)(nl - start) + 1;
        start = nl + 1;
    }
    if (force && left) {
        progress_erase();
        fprintf(out, "[%s] %.*s\n", c->label, (int)left, start);
        left = 0;
        printed = 1;
    }
    memmove(c->buf[k], start, left);
    c->len[k] = left;
    fflush(out);
    if (printed || (k == 1 && progress_line[0] && !progress_shown)) progress_draw();
}

static void pump(child *cs, int n, int timeout_ms) {
    struct pollfd p[2 * MAX_PROCS];
    int map[2 * MAX_PROCS], np = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 2; k++)
            if (cs[i].fd[k] >= 0) {
                p[np] = (struct pollfd){.fd = cs[i].fd[k], .events = POLLIN};
                map[np++] = i * 2 + k;
            }
    if (np == 0) {
        usleep((useconds_t)timeout_ms * 1000);
        return;
    }
    if (poll(p, (nfds_t)np, timeout_ms) <= 0) return;
    for (int j = 0; j < np; j++) {
        if (!(p[j].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        child *c = &cs[map[j] / 2];
        int k = map[j] % 2;
        if (c->len[k] == sizeof c->buf[k]) flush_line(c, k, 1); /* overlong line: emit as is */
        ssize_t r = read(c->fd[k], c->buf[k] + c->len[k], sizeof c->buf[k] - c->len[k]);
        if (r > 0) {
            c->len[k] += (size_t)r;
            flush_line(c, k, 0);
        } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
            flush_line(c, k, 1);
            close(c->fd[k]);
            c->fd[k] = -1;
        }
    }
}

static int reap(child *cs, int n) {
    int newly = 0;
    for (int i = 0; i < n; i++) {
        if (cs[i].exited) continue;
        int st;
        if (waitpid(cs[i].pid, &st, WNOHANG) == cs[i].pid) {
            cs[i].exited = 1;
            cs[i].status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            newly++;
        }
    }
    return newly;
}

static void stop_all(child *cs, int n, double grace_sec) {
    for (int i = 0; i < n; i++)
        if (!cs[i].exited) kill(cs[i].pid, SIGTERM);
    double deadline = dt_seconds() + grace_sec;
    for (;;) {
        reap(cs, n);
        int alive = 0;
        for (int i = 0; i < n; i++) alive += !cs[i].exited;
        if (!alive) break;
        if (dt_seconds() > deadline) {
            for (int i = 0; i < n; i++)
                if (!cs[i].exited) {
                    fprintf(stderr, "dtrain launch: %s did not stop after SIGTERM; killing it\n", cs[i].label);
                    kill(cs[i].pid, SIGKILL);
                }
            deadline = dt_seconds() + 5;
        }
        pump(cs, n, 50);
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 2; k++)
            if (cs[i].fd[k] >= 0) {
                flush_line(&cs[i], k, 1);
                close(cs[i].fd[k]);
                cs[i].fd[k] = -1;
            }
}

/* --auth=curve without --keys: a throwaway key set for this cluster in a private temp folder
 * (server and client pairs, the client's public key authorized), removed when launch ends. */
static int make_keys(char *dir, size_t cap) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, cap, "%s/dtrain-keys-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "dtrain launch: cannot create a keys folder %s: %s\n", dir, strerror(errno));
        return -1;
    }
    char auth_dir[4200], from[4300], to[4300], key[DT_Z85_KEY_LEN + 1];
    snprintf(auth_dir, sizeof auth_dir, "%s/authorized", dir);
    snprintf(from, sizeof from, "%s/client.key", dir);
    snprintf(to, sizeof to, "%s/client.key", auth_dir);
    dt_error err = {0};
    FILE *f = NULL;
    if (dt_auth_keygen(dir, "server", &err) || dt_auth_keygen(dir, "client", &err) ||
        dt_auth_read_key(key, from, 0, &err)) {
        fprintf(stderr, "dtrain launch: %s\n", err.msg);
        return -1;
    }
    if (mkdir(auth_dir, 0700) != 0 || !(f = fopen(to, "w")) || fprintf(f, "%s\n", key) < 0 || fclose(f) != 0) {
        fprintf(stderr, "dtrain launch: cannot authorize the client key in %s\n", auth_dir);
        return -1;
    }
    return 0;
}

static void remove_keys(const char *dir) {
    const char *files[] = {"server.key", "server.secret", "client.key", "client.secret", "authorized/client.key",
                           "authorized"};
    char p[4300];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        if (unlink(p) != 0) rmdir(p);
    }
    rmdir(dir);
}

static void launch_help(void) {
    printf("usage: dtrain launch [--ps N] [--workers M] [--metrics_port P] [train flags]\n\n"
           "Starts a cluster on 127.0.0.1: N parameter servers (default 1) and M workers\n"
           "(default 2), each running `dtrain train` with the given flags and the cluster\n"
           "flags (--ps_hosts, --worker_hosts, --job_name, --task_index) on free ports.\n"
           "Unless --threads is given, each worker gets cores/M compute threads, a ps one.\n"
           "Output lines are prefixed with [ps0], [worker1], ... The exit status is the\n"
           "first failure's, after the others are stopped; Ctrl-C stops everything.\n"
           "With --metrics_port P, process i (the ps tasks first, then the workers) serves\n"
           "its metrics on port P + i, and the chief's status page (http://127.0.0.1:P+N/,\n"
           "N ps tasks) shows the whole cluster (docs/metrics.md). When stderr is a\n"
           "terminal, the chief's progress line is drawn at the bottom (--progress=never: none).\n"
           "With --auth=curve and no --keys, launch makes a throwaway key set for the\n"
           "cluster in a private temp folder (removed at the end); with --keys=DIR every\n"
           "process uses DIR (docs/security.md).\n"
           "See 'dtrain train --help' for the training flags.\n");
}

/* Whether argv[i] is one of defs' flags ("--name" or "--name=value"). */
static int is_flag_of(const flag_def *defs, int n, const char *arg) {
    if (strncmp(arg, "--", 2)) return 0;
    const char *name = arg + 2, *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    for (int k = 0; k < n; k++)
        if (strlen(defs[k].name) == len && !strncmp(defs[k].name, name, len)) return 1;
    return 0;
}

int cmd_launch(int argc, char **argv) {
    int n_ps = 1, n_workers = 2, metrics_port = 0;
    const flag_def launch_defs[] = {
        FLAG_NUM("ps", FLAG_INT, &n_ps, "parameter servers", 1, 32, 0),
        FLAG_NUM("workers", FLAG_INT, &n_workers, "workers (worker 0 is the chief)", 1, 32, 0),
        FLAG_NUM("metrics_port", FLAG_INT, &metrics_port, "process i serves its metrics on this port + i; 0: off", 0,
                 65535 - 2 * 32, 0),
    };
    const int n_launch = (int)(sizeof launch_defs / sizeof launch_defs[0]);
    /* launch's own flags (with a value as "--ps 2" or "--ps=2") apart from train's, which are passed on */
    char **own = calloc((size_t)argc + 1, sizeof *own), **pass = calloc((size_t)argc + 8, sizeof *pass);
    int n_own = 0, n_pass = 0;
    if (!own || !pass) {
        fprintf(stderr, "dtrain launch: out of memory\n");
        free(own), free(pass);
        return 1;
    }
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            launch_help();
            free(own), free(pass);
            return 0;
        }
        if (is_flag_of(launch_defs, n_launch, argv[i])) {
            own[n_own++] = argv[i];
            if (!strchr(argv[i], '=') && i + 1 < argc) own[n_own++] = argv[++i];
        } else {
            pass[n_pass++] = argv[i];
        }
    }
    /* Both sets checked here, with the tables' messages, before any process starts; train's values
     * tell launch what the user set (-1 / NULL: not given). */
    train_args ta;
    train_args_init(&ta);
    ta.o.threads = -1;
    ta.progress = NULL;
    int help = 0;
    dt_error err = {0};
    if (flags_parse(launch_defs, n_launch, n_own, own, &help, &err) ||
        train_args_parse(&ta, n_pass, pass, &help, &err)) {
        fprintf(stderr, "dtrain launch: %s\n", err.msg);
        free(own), free(pass);
        return 2;
    }
    free(own);
    const char *set_by_launch = ta.o.ps_hosts ? "--ps_hosts" : ta.o.worker_hosts ? "--worker_hosts"
                                : ta.o.job_name ? "--job_name" : ta.o.task_index ? "--task_index"
                                : ta.o.metrics_peers ? "--metrics_peers" : NULL;
    if (set_by_launch) {
        fprintf(stderr, "dtrain launch: %s is set by launch itself; use 'dtrain train' to join a cluster by hand\n",
                set_by_launch);
        free(pass);
        return 2;
    }

    int curve = !strcmp(ta.o.auth, "curve"), keys_given = ta.o.keys != NULL;
    char keys_dir[4096] = "", keys_arg[4200];
    if (curve && !keys_given) {
        if (make_keys(keys_dir, sizeof keys_dir)) {
            if (keys_dir[0]) remove_keys(keys_dir);
            free(pass);
            return 1;
        }
        snprintf(keys_arg, sizeof keys_arg, "--keys=%s", keys_dir);
        pass[n_pass++] = keys_arg;
    }

    /* Several processes share this machine's cores: unless told otherwise, each worker gets its
     * share of them and a ps one thread, and OpenMP threads spin only briefly before sleeping
     * (libgomp's default spin wait starves the other processes; it reads this at start). */
    int threads_given = ta.o.threads >= 0, progress_given = ta.progress != NULL;
    /* the chief reaches the others' metrics where they bind them (any address: this host's loopback) */
    const char *metrics_host = ta.o.metrics_addr ? ta.o.metrics_addr : "127.0.0.1";
    if (!strcmp(metrics_host, "0.0.0.0")) metrics_host = "127.0.0.1";
    else if (!strcmp(metrics_host, "::") || !strcmp(metrics_host, "[::]")) metrics_host = "[::1]";
    int relay = !progress_given && isatty(STDERR_FILENO);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int worker_threads = (int)(cores / n_workers) > 1 ? (int)(cores / n_workers) : 1;
    setenv("GOMP_SPINCOUNT", "10000", 0);

    int n = n_ps + n_workers;
    char ps_hosts[32 * 24] = "", worker_hosts[32 * 24] = "";
    int ports[64];
    if (n > (int)(sizeof ports / sizeof *ports) || free_ports(ports, n) != 0) {
        fprintf(stderr, "dtrain launch: could not find %d free ports on 127.0.0.1: %s\n", n, strerror(errno));
        if (keys_dir[0]) remove_keys(keys_dir);
        free(pass);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        char *list = i < n_ps ? ps_hosts : worker_hosts;
        size_t len = strlen(list);
        snprintf(list + len, sizeof ps_hosts - len, "%s127.0.0.1:%d", len ? "," : "", ports[i]);
    }

    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) {
        fprintf(stderr, "dtrain launch: cannot find its own executable: %s\n", strerror(errno));
        if (keys_dir[0]) remove_keys(keys_dir);
        free(pass);
        return 1;
    }
    self[sl] = 0;

    cli_install_signal_handlers();
    child cs[MAX_PROCS];
    memset(cs, 0, sizeof cs);
    int started = 0, rc = 0;
    for (int i = 0; i < n; i++) {
        child *c = &cs[i];
        int is_ps = i < n_ps, idx = is_ps ? i : i - n_ps;
        snprintf(c->label, sizeof c->label, "%s%d", is_ps ? "ps" : "worker", idx);
        int out[2], errp[2];
        if (pipe(out) || pipe(errp)) {
            fprintf(stderr, "dtrain launch: pipe: %s\n", strerror(errno));
            rc = 1;
            break;
        }
        char a_ps[sizeof ps_hosts + 16], a_wk[sizeof worker_hosts + 16], a_job[32], a_idx[32], a_thr[32], a_mp[32];
        char a_peers[MAX_PROCS * 80 + 32] = "--metrics_peers=";
        snprintf(a_mp, sizeof a_mp, "--metrics_port=%d", metrics_port + i);
        if (metrics_port && !is_ps && idx == 0) /* the chief: every other process's metrics */
            for (int j = 0, first = 1; j < n; j++) {
                if (j == i) continue;
                size_t len = strlen(a_peers);
                snprintf(a_peers + len, sizeof a_peers - len, "%s%s:%d", first ? "" : ",", metrics_host, metrics_port + j);
                first = 0;
            }
        snprintf(a_thr, sizeof a_thr, "--threads=%d", is_ps ? 1 : worker_threads);
        snprintf(a_ps, sizeof a_ps, "--ps_hosts=%s", ps_hosts);
        snprintf(a_wk, sizeof a_wk, "--worker_hosts=%s", worker_hosts);
        snprintf(a_job, sizeof a_job, "--job_name=%s", is_ps ? "ps" : "worker");
        snprintf(a_idx, sizeof a_idx, "--task_index=%d", idx);
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "dtrain launch: fork: %s\n", strerror(errno));
            close(out[0]), close(out[1]), close(errp[0]), close(errp[1]);
            rc = 1;
            break;
        }
        if (pid == 0) {
            dup2(out[1], STDOUT_FILENO);
            dup2(errp[1], STDERR_FILENO);
            close(out[0]), close(out[1]), close(errp[0]), close(errp[1]);
            char **args = calloc((size_t)n_pass + 12, sizeof *args);
            if (!args) _exit(127);
            int k = 0;
            args[k++] = self;
            args[k++] = "train";
            for (int j = 0; j < n_pass; j++) args[k++] = pass[j];
            args[k++] = a_ps;
            args[k++] = a_wk;
            args[k++] = a_job;
            args[k++] = a_idx;
            if (!threads_given) args[k++] = a_thr;
            if (metrics_port) args[k++] = a_mp;
            if (metrics_port && !is_ps && idx == 0 && n > 1) args[k++] = a_peers;
            if (relay && !is_ps && idx == 0) args[k++] = "--progress=relay";
            args[k] = NULL;
            execv(self, args);
            fprintf(stderr, "exec %s: %s\n", self, strerror(errno));
            _exit(127);
        }
        close(out[1]), close(errp[1]);
        c->pid = pid;
        c->fd[0] = out[0], c->fd[1] = errp[0];
        started++;
    }
    free(pass);
    fprintf(stderr, "dtrain launch: %d ps (%s), %d workers (%s)\n", n_ps, ps_hosts, n_workers, worker_hosts);
    if (metrics_port)
        fprintf(stderr, "dtrain launch: metrics on ports %d..%d; the status page: http://%s:%d/\n", metrics_port,
                metrics_port + n - 1, metrics_host, metrics_port + n_ps);

    /* Run until every process has exited, or one fails, or we are told to stop. */
    while (rc == 0) {
        pump(cs, started, 100);
        reap(cs, started);
        int alive = 0;
        for (int i = 0; i < started; i++) {
            if (cs[i].exited && cs[i].status != 0 && rc == 0) {
                fprintf(stderr, "dtrain launch: %s exited with status %d; stopping the others\n", cs[i].label,
                        cs[i].status);
                rc = cs[i].status;
            }
            alive += !cs[i].exited;
        }
        if (!alive) break;
        if (cli_stop) {
            fprintf(stderr, "dtrain launch: stopping all processes\n");
            rc = 130;
        }
    }
    stop_all(cs, started, 10.0);
    progress_erase();
    if (keys_dir[0]) remove_keys(keys_dir);
    return rc;
}
