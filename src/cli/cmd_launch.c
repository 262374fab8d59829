/* dtrain launch: a whole cluster on 127.0.0.1. Starts N ps and M worker processes running
 * `dtrain train` with the cluster flags filled in, prefixes each output line with the process's
 * role and index, and exits with the first failure's status after stopping the others. Ctrl-C
 * (SIGINT) or SIGTERM stops everything. With --sharding dynamic, SIGUSR1 starts one more worker
 * (up to --max_workers) and SIGUSR2 stops the newest one it started (SIGTERM: it leaves), and a
 * worker other than the chief that fails is lost to the job, which goes on without it. */
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
#include "core/flags.h"
#include "transport/auth.h"

#define MAX_PROCS 64

typedef struct {
    char label[24];
    pid_t pid;
    int fd[2];          /* stdout, stderr pipes (-1 once closed) */
    char buf[2][4096];  /* partial line per stream */
    size_t len[2];
    int status, exited;
    int removed;        /* stopped by SIGUSR2: its exit status is no failure */
    int lost;           /* --sharding dynamic, a worker but the chief that failed: the job goes on */
} child;

/* SIGUSR1 and SIGUSR2 (--sharding dynamic): a worker more, one less; counted by the handler. */
static volatile sig_atomic_t add_requests, remove_requests;
static void on_add(int sig) { (void)sig, add_requests++; }
static void on_remove(int sig) { (void)sig, remove_requests++; }

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
    printf("usage: dtrain launch [--ps N] [--workers M] [--metrics_port P] [train flags] [-- PROGRAM ARGS]\n\n"
           "Starts a cluster on 127.0.0.1: N parameter servers (default 1) and M workers\n"
           "(default 2), each running `dtrain train` with the given flags and the cluster\n"
           "flags (--ps_hosts, --worker_hosts, --job_name, --task_index) on free ports.\n"
           "Unless --threads is given, each worker gets cores/M compute threads, a ps one.\n"
           "Output lines are prefixed with [ps0], [worker1], ... The exit status is the\n"
           "first failure's, after the others are stopped; Ctrl-C stops everything.\n"
           "After a lone --, each process runs PROGRAM ARGS (e.g. python3 script.py) instead of\n"
           "`dtrain train`, with the train flags and the cluster flags after ARGS and its role in\n"
           "DTRAIN_JOB_NAME and DTRAIN_TASK_INDEX (docs/python.md).\n"
           "With --metrics_port P, process i (the ps tasks first, then the workers) serves\n"
           "its metrics on port P + i, and the chief's status page (http://127.0.0.1:P+N/,\n"
           "N ps tasks) shows the whole cluster (docs/metrics.md). When stderr is a\n"
           "terminal, the chief's progress line is drawn at the bottom (--progress=never: none).\n"
           "With --auth=curve and no --keys, launch makes a throwaway key set for the\n"
           "cluster in a private temp folder (removed at the end); with --keys=DIR every\n"
           "process uses DIR (docs/security.md).\n"
           "With --sharding dynamic --max_workers K (K > M), SIGUSR1 to launch starts one more\n"
           "worker, up to K, which joins the running job, and SIGUSR2 stops the newest one\n"
           "launch started (SIGTERM: it leaves, its units go back; docs/elastic.md).\n"
           "With --sharding dynamic, a worker other than the chief that fails (killed, or\n"
           "exiting non-zero) is lost to the job, which goes on without it: ps 0 gives its\n"
           "units to the others after --heartbeat_timeout / 2; it is not restarted (SIGUSR1\n"
           "starts a new one). Any other process failing stops the job.\n"
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

/* What launch starts, worked out before any process starts. */
typedef struct {
    int n_ps, n_workers, metrics_port, n;
    train_args ta;                  /* train's flags as given (-1 / NULL: not given) */
    char **pass;                    /* [n_pass] train's flags, passed on to every process */
    int n_pass;
    char keys_dir[4096], keys_arg[4200]; /* --auth=curve without --keys: the throwaway key set */
    int threads_given, relay, worker_threads;
    int max_workers;                /* --sharding dynamic: ports for this many workers (joiners) */
    int dynamic;                    /* --sharding dynamic: a failed worker but the chief is lost, not fatal */
    const char *metrics_host;       /* where the chief reaches the others' metrics */
    char ps_hosts[32 * 24], worker_hosts[32 * 24], all_workers[MAX_PROCS * 24];
    char self[4096];                /* this executable */
    char **cmd;                     /* after a lone "--": the user's program per task (NULL: dtrain train) */
} launch_plan;

static void plan_free(launch_plan *p) {
    if (p->keys_dir[0]) remove_keys(p->keys_dir);
    free(p->pass);
    p->pass = NULL;
}

/* launch's own flags (with a value as "--ps 2" or "--ps=2") apart from train's, which are passed
 * on; both checked here with the tables' messages. 0 to go on, else the exit status (0 for help
 * is returned as -1). */
static int plan_flags(launch_plan *p, int argc, char **argv) {
    const flag_def defs[] = {
        FLAG_NUM("ps", FLAG_INT, &p->n_ps, "parameter servers", 1, 32, 0),
        FLAG_NUM("workers", FLAG_INT, &p->n_workers, "workers (worker 0 is the chief)", 1, 32, 0),
        FLAG_NUM("metrics_port", FLAG_INT, &p->metrics_port, "process i serves its metrics on this port + i; 0: off",
                 0, 65535 - 2 * 32, 0),
    };
    const int n_defs = (int)(sizeof defs / sizeof defs[0]);
    char **own = calloc((size_t)argc + 1, sizeof *own);
    int n_own = 0, help = 0;
    if (!own || !(p->pass = calloc((size_t)argc + 8, sizeof *p->pass))) {
        fprintf(stderr, "dtrain launch: out of memory\n");
        free(own);
        return 1;
    }
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--") && i + 1 < argc) { /* `-- python3 script.py ARGS`: run that instead */
            p->cmd = argv + i + 1;
            break;
        }
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            launch_help();
            free(own);
            return -1;
        }
        if (is_flag_of(defs, n_defs, argv[i])) {
            own[n_own++] = argv[i];
            if (!strchr(argv[i], '=') && i + 1 < argc) own[n_own++] = argv[++i];
        } else {
            p->pass[p->n_pass++] = argv[i];
        }
    }
    train_args_init(&p->ta);
    p->ta.o.threads = -1;
    p->ta.progress = NULL;
    dt_error err = {0};
    int rc = flags_parse(defs, n_defs, n_own, own, &help, &err) ||
             train_args_parse(&p->ta, p->n_pass, p->pass, &help, &err);
    free(own);
    if (rc) {
        fprintf(stderr, "dtrain launch: %s\n", err.msg);
        return 2;
    }
    const dt_train_options *o = &p->ta.o;
    const char *set_by_launch = o->ps_hosts ? "--ps_hosts" : o->worker_hosts ? "--worker_hosts"
                                : o->job_name ? "--job_name" : o->task_index ? "--task_index"
                                : o->metrics_peers ? "--metrics_peers" : NULL;
    if (set_by_launch) {
        fprintf(stderr, "dtrain launch: %s is set by launch itself; use 'dtrain train' to join a cluster by hand\n",
                set_by_launch);
        return 2;
    }
    return 0;
}

/* Keys, threads, metrics addresses, ports and this executable: 0, or the exit status. */
static int plan_cluster(launch_plan *p) {
    if (!strcmp(p->ta.o.auth, "curve") && !p->ta.o.keys) {
        if (make_keys(p->keys_dir, sizeof p->keys_dir)) return 1;
        snprintf(p->keys_arg, sizeof p->keys_arg, "--keys=%s", p->keys_dir);
        p->pass[p->n_pass++] = p->keys_arg;
    }
    /* Several processes share this machine's cores: unless told otherwise, each worker gets its
     * share of them and a ps one thread (OpenMP's threads wait passively in every dtrain process
     * unless the environment says otherwise: main.c). */
    p->threads_given = p->ta.o.threads >= 0;
    p->relay = !p->ta.progress && isatty(STDERR_FILENO);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    p->worker_threads = (int)(cores / p->n_workers) > 1 ? (int)(cores / p->n_workers) : 1;
    /* the chief reaches the others' metrics where they bind them (any address: this host's loopback) */
    p->metrics_host = p->ta.o.metrics_addr ? p->ta.o.metrics_addr : "127.0.0.1";
    if (!strcmp(p->metrics_host, "0.0.0.0")) p->metrics_host = "127.0.0.1";
    else if (!strcmp(p->metrics_host, "::") || !strcmp(p->metrics_host, "[::]")) p->metrics_host = "[::1]";
    p->n = p->n_ps + p->n_workers;
    /* Dynamic sharding: ports for every worker that may join, named only in a joiner's own list. */
    int dynamic = p->ta.o.sharding && !strcmp(p->ta.o.sharding, "dynamic");
    p->max_workers = dynamic && p->ta.o.max_workers > p->n_workers ? p->ta.o.max_workers : p->n_workers;
    p->dynamic = dynamic;
    int ports[MAX_PROCS], all = p->n_ps + p->max_workers;
    if (all > MAX_PROCS || free_ports(ports, all) != 0) {
        fprintf(stderr, "dtrain launch: could not find %d free ports on 127.0.0.1 (at most %d processes): %s\n", all,
                MAX_PROCS, strerror(errno));
        return 1;
    }
    for (int i = 0; i < all; i++) {
        char *list = i < p->n_ps ? p->ps_hosts : p->all_workers;
        size_t len = strlen(list), cap = i < p->n_ps ? sizeof p->ps_hosts : sizeof p->all_workers;
        snprintf(list + len, cap - len, "%s127.0.0.1:%d", len ? "," : "", ports[i]);
        if (i == p->n - 1) snprintf(p->worker_hosts, sizeof p->worker_hosts, "%s", p->all_workers);
    }
    ssize_t sl = readlink("/proc/self/exe", p->self, sizeof p->self - 1);
    if (sl <= 0) {
        fprintf(stderr, "dtrain launch: cannot find its own executable: %s\n", strerror(errno));
        return 1;
    }
    p->self[sl] = 0;
    return 0;
}

/* The command line of process i (the ps tasks first, then the workers): `dtrain train`, the
 * user's flags, then the cluster flags in bufs (each 4 KiB). Never returns on success. */
static void exec_process(const launch_plan *p, int i, char bufs[][MAX_PROCS * 80 + 32]) {
    const int is_ps = i < p->n_ps, idx = is_ps ? i : i - p->n_ps, chief = !is_ps && idx == 0;
    char **args = calloc((size_t)p->n_pass + 12, sizeof *args);
    if (!args) _exit(127);
    int k = 0, n_cmd = 0;
    while (p->cmd && p->cmd[n_cmd]) n_cmd++;
    if (n_cmd) { /* the user's program: its arguments, then train's flags; its role also in the environment */
        free(args);
        if (!(args = calloc((size_t)(n_cmd + p->n_pass) + 12, sizeof *args))) _exit(127);
        for (int j = 0; j < n_cmd; j++) args[k++] = p->cmd[j];
        setenv("DTRAIN_JOB_NAME", is_ps ? "ps" : "worker", 1);
        char index[16];
        snprintf(index, sizeof index, "%d", idx);
        setenv("DTRAIN_TASK_INDEX", index, 1);
    } else {
        args[k++] = (char *)p->self;
        args[k++] = "train";
    }
    for (int j = 0; j < p->n_pass; j++) args[k++] = p->pass[j];
    snprintf(bufs[0], sizeof bufs[0], "--ps_hosts=%s", p->ps_hosts);
    if (i < p->n) {
        snprintf(bufs[1], sizeof bufs[1], "--worker_hosts=%s", p->worker_hosts);
    } else { /* a joiner: the list up to its own address */
        const char *end = p->all_workers;
        for (int j = 0; j <= idx && end; j++) end = strchr(end + (j > 0), ',');
        int len = end ? (int)(end - p->all_workers) : (int)strlen(p->all_workers);
        snprintf(bufs[1], sizeof bufs[1], "--worker_hosts=%.*s", len, p->all_workers);
    }
    snprintf(bufs[2], sizeof bufs[2], "--job_name=%s", is_ps ? "ps" : "worker");
    snprintf(bufs[3], sizeof bufs[3], "--task_index=%d", idx);
    for (int b = 0; b < 4; b++) args[k++] = bufs[b];
    snprintf(bufs[4], sizeof bufs[4], "--threads=%d", is_ps ? 1 : p->worker_threads);
    if (!p->threads_given) args[k++] = bufs[4];
    snprintf(bufs[5], sizeof bufs[5], "--metrics_port=%d", p->metrics_port + i);
    if (p->metrics_port) args[k++] = bufs[5];
    if (p->metrics_port && chief && p->n > 1) { /* the chief: every other process's metrics */
        size_t len = (size_t)snprintf(bufs[6], sizeof bufs[6], "--metrics_peers=");
        for (int j = 0, first = 1; j < p->n; j++) {
            if (j == i) continue;
            len += (size_t)snprintf(bufs[6] + len, sizeof bufs[6] - len, "%s%s:%d", first ? "" : ",", p->metrics_host,
                                    p->metrics_port + j);
            first = 0;
        }
        args[k++] = bufs[6];
    }
    if (p->relay && chief) args[k++] = "--progress=relay";
    args[k] = NULL;
    if (n_cmd) execvp(args[0], args);
    else execv(p->self, args);
    fprintf(stderr, "exec %s: %s\n", args[0], strerror(errno));
    _exit(127);
}

/* Starts process i with its output on pipes into c: 0, or 1 (said why). */
static int spawn(const launch_plan *p, int i, child *c) {
    const int is_ps = i < p->n_ps;
    snprintf(c->label, sizeof c->label, "%s%d", is_ps ? "ps" : "worker", is_ps ? i : i - p->n_ps);
    int out[2], errp[2];
    if (pipe(out) || pipe(errp)) {
        fprintf(stderr, "dtrain launch: pipe: %s\n", strerror(errno));
        return 1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "dtrain launch: fork: %s\n", strerror(errno));
        close(out[0]), close(out[1]), close(errp[0]), close(errp[1]);
        return 1;
    }
    if (pid == 0) {
        static char bufs[7][MAX_PROCS * 80 + 32];
        dup2(out[1], STDOUT_FILENO);
        dup2(errp[1], STDERR_FILENO);
        close(out[0]), close(out[1]), close(errp[0]), close(errp[1]);
        exec_process(p, i, bufs);
    }
    close(out[1]), close(errp[1]);
    c->pid = pid;
    c->fd[0] = out[0], c->fd[1] = errp[0];
    return 0;
}

/* SIGUSR1: one more worker, up to --max_workers; SIGUSR2: the newest one launch started and that
 * still runs is stopped (SIGTERM: it leaves the job, its units go back). 0, or 1 (said why). */
static int scale(const launch_plan *p, child *cs, int *started) {
    for (; add_requests > 0; add_requests--) {
        if (*started >= p->n_ps + p->max_workers) {
            fprintf(stderr, "dtrain launch: SIGUSR1: already %d workers, the most --max_workers allows (with "
                    "--sharding dynamic)\n", *started - p->n_ps);
            continue;
        }
        if (spawn(p, *started, &cs[*started])) return 1;
        fprintf(stderr, "dtrain launch: %s started: it joins the running job\n", cs[*started].label);
        ++*started;
    }
    for (; remove_requests > 0; remove_requests--) {
        int k = *started - 1;
        while (k > p->n_ps && (cs[k].exited || cs[k].removed)) k--;
        if (k <= p->n_ps) { /* never the chief */
            fprintf(stderr, "dtrain launch: SIGUSR2: no worker but the chief left to stop\n");
            continue;
        }
        cs[k].removed = 1;
        kill(cs[k].pid, SIGTERM);
        fprintf(stderr, "dtrain launch: %s stopped (SIGTERM): it leaves the job\n", cs[k].label);
    }
    return 0;
}

/* Runs until every process has exited, or one fails, or launch is told to stop: the exit status. */
static int supervise(const launch_plan *p, child *cs, int *n) {
    int rc = 0;
    while (rc == 0) {
        if (scale(p, cs, n)) rc = 1;
        int started = *n;
        pump(cs, started, 100);
        reap(cs, started);
        int alive = 0;
        for (int i = 0; i < started; i++) {
            /* Dynamic sharding: ps 0 takes a lost worker's units back (docs/elastic.md), so the job
             * goes on, as under Horovod's elastic mode; the chief checkpoints and ends the job. */
            if (p->dynamic && i > p->n_ps && cs[i].exited && cs[i].status != 0 && !cs[i].removed && !cs[i].lost) {
                cs[i].lost = 1;
                fprintf(stderr, "dtrain launch: %s exited with status %d; the job goes on without it (--sharding "
                        "dynamic: ps 0 gives its units to the others)\n", cs[i].label, cs[i].status);
            }
            if (cs[i].exited && cs[i].status != 0 && !cs[i].removed && !cs[i].lost && rc == 0) {
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
    return rc;
}

int cmd_launch(int argc, char **argv) {
    launch_plan p;
    memset(&p, 0, sizeof p);
    p.n_ps = 1, p.n_workers = 2;
    int rc = plan_flags(&p, argc, argv);
    if (!rc) rc = plan_cluster(&p);
    if (rc) {
        plan_free(&p);
        return rc < 0 ? 0 : rc;
    }
    cli_install_signal_handlers();
    static child cs[MAX_PROCS];
    memset(cs, 0, sizeof cs);
    int started = 0;
    for (; started < p.n && !rc; started += !rc) rc = spawn(&p, started, &cs[started]);
    fprintf(stderr, "dtrain launch: %d ps (%s), %d workers (%s)\n", p.n_ps, p.ps_hosts, p.n_workers, p.worker_hosts);
    if (p.metrics_port)
        fprintf(stderr, "dtrain launch: metrics on ports %d..%d; the status page: http://%s:%d/\n", p.metrics_port,
                p.metrics_port + p.n - 1, p.metrics_host, p.metrics_port + p.n_ps);
    if (p.max_workers > p.n_workers) { /* --sharding dynamic: SIGUSR1 adds a worker, SIGUSR2 removes one */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sigemptyset(&sa.sa_mask);
        sa.sa_handler = on_add;
        sigaction(SIGUSR1, &sa, NULL);
        sa.sa_handler = on_remove;
        sigaction(SIGUSR2, &sa, NULL);
    }
    if (!rc) rc = supervise(&p, cs, &started);
    stop_all(cs, started, 10.0);
    progress_erase();
    plan_free(&p);
    return rc;
}
