/* Time per step of sync replicas on loopback, and where it goes: 1 ps process and W worker
 * processes, each worker training the model on a fixed synthetic batch (no data loading: this
 * measures compute and the exchange) through the real remote updater, every step averaged over
 * all W workers (replicas_to_aggregate = W).
 * usage: bench_sync MODEL BATCH WORKERS STEPS [THREADS_PER_WORKER [EMULATE_MS]]
 * Prints one JSON line per worker: wall time per step, compute, exchange, and within the exchange
 * the barrier wait (PULLs held at the ps, as the ps reports it) and the rest (transfer, the
 * placement copies, the ps's sum and optimizer update). Compare WORKERS=2 with WORKERS=1 at the same
 * BATCH: the overhead of synchronising is the difference in time per step.
 * EMULATE_MS > 0 replaces each step's forward and backward by a sleep that long (after one real
 * backward, whose gradient is pushed every step): on a machine with fewer cores than workers + ps
 * the workers' compute would otherwise compete for cores, a slowdown separate machines do not have;
 * emulated, the difference is the synchronisation alone. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cluster/cluster.h"
#include "cluster/placement.h"
#include "compute/kernels.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/net.h"
#include "train/serve.h"
#include "worker/remote.h"

#define WARMUP 3

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int free_port(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(s, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (s >= 0) close(s);
    return port;
}

static int fail(const char *who, const dt_error *e) {
    fprintf(stderr, "bench_sync %s: %s\n", who, e->msg);
    return 1;
}

static int run_ps(const char *model, int workers, const int *ports) {
    dt_error e = {0};
    dt_net *net;
    dt_cluster c;
    dt_placement pl;
    if (dt_net_load(&net, model, 1, &e) || dt_cluster_local(&c, 1, workers, ports, DT_JOB_PS, 0, &e) ||
        dt_placement_compute(&pl, dt_net_view(net, 0), dt_net_num_views(net), 1, DT_PLACE_GREEDY, &e))
        return fail("ps", &e);
    FILE *devnull = fopen("/dev/null", "w");
    int rc = dt_serve_task(&c, &pl, NULL, 0, NULL, devnull ? devnull : stderr, &e);
    if (devnull) fclose(devnull);
    return rc ? fail("ps", &e) : 0;
}

static int run_worker(const char *model, int batch, int workers, int index, int steps, int threads, int emulate_ms,
                      const int *ports) {
    dt_error e = {0};
    dt_net *net;
    dt_cluster c;
    dt_placement pl;
    if (dt_net_load(&net, model, batch, &e) || dt_cluster_local(&c, 1, workers, ports, DT_JOB_WORKER, index, &e) ||
        dt_placement_compute(&pl, dt_net_view(net, 0), dt_net_num_views(net), 1, DT_PLACE_GREEDY, &e))
        return fail("worker", &e);
    dt_net_set_threads(net, threads);
    size_t in = dt_net_input_size(net);
    float *x = malloc(sizeof(float) * in * (size_t)batch);
    int32_t *y = malloc(sizeof(int32_t) * (size_t)batch);
    if (!x || !y) return 1;
    dt_rng r;
    dt_rng_seed(&r, 7 + (uint64_t)index);
    for (size_t i = 0; i < in * (size_t)batch; i++) x[i] = dt_rng_uniform(&r);
    for (int i = 0; i < batch; i++) y[i] = (int32_t)dt_rng_below(&r, dt_net_num_classes(net));
    dt_opt_config opt;
    dt_opt_config_init(&opt, "adam", 1e-4f, NULL);
    dt_remote_config rc_cfg = {.cluster = &c, .placement = &pl, .opt = opt, .connect_timeout_ms = 30000,
                               .n_workers_to_wait = workers - 1, .replicas_to_aggregate = workers,
                               .total_num_replicas = workers};
    dt_updater *u;
    if (dt_remote_updater_create(&u, &rc_cfg, &e)) return fail("worker", &e);
    int64_t step = 0;
    if (u->start(u, net, 1, &step, &e)) return fail("worker", &e);
    dt_remote_timing t0 = {0}, t1;
    double start = 0;
    for (int s = 0; s < WARMUP + steps; s++) {
        if (s == WARMUP) {
            dt_remote_get_timing(u, &t0);
            start = now();
        }
        if (emulate_ms > 0 && s > 0) {
            struct timespec ts = {emulate_ms / 1000, (long)(emulate_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        } else {
            int correct;
            dt_net_forward(net, x, batch, 1, (uint64_t)s, NULL);
            dt_net_loss(net, y, &correct);
            dt_net_backward(net, NULL);
        }
        if (u->apply(u, net, step, &step, &e)) return fail("worker", &e);
    }
    double wall = now() - start;
    dt_remote_get_timing(u, &t1);
    double n = t1.updates - t0.updates, ex = t1.exchange_s - t0.exchange_s, wait = t1.wait_s - t0.wait_s;
    printf("{\"bench\": \"sync\", \"model\": \"%s\", \"batch\": %d, \"workers\": %d, \"worker\": %d, \"threads\": %d, "
           "\"steps\": %.0f, \"step_ms\": %.2f, \"compute_ms\": %.2f, \"exchange_ms\": %.2f, \"wait_ms\": %.2f, "
           "\"transfer_ms\": %.2f, \"param_mb\": %.2f, \"emulated_compute_ms\": %d}\n",
           dt_net_spec(net)->name, batch, workers, index, dt_net_threads(net), n, 1e3 * wall / n,
           1e3 * (t1.compute_s - t0.compute_s) / n, 1e3 * ex / n, 1e3 * wait / n, 1e3 * (ex - wait) / n,
           dt_net_param_count(net) * 4e-6, emulate_ms);
    fflush(stdout);
    int rc = u->finish(u, &e);
    if (rc) fail("worker", &e);
    u->free(u);
    dt_placement_free(&pl);
    dt_cluster_clear(&c);
    dt_net_free(net);
    free(x), free(y);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: bench_sync MODEL BATCH WORKERS STEPS [THREADS_PER_WORKER [EMULATE_MS]]\n");
        return 2;
    }
    const char *model = argv[1];
    int batch = atoi(argv[2]), workers = atoi(argv[3]), steps = atoi(argv[4]);
    int threads = argc > 5 ? atoi(argv[5]) : 1, emulate_ms = argc > 6 ? atoi(argv[6]) : 0;
    if (batch < 1 || workers < 1 || workers > 16 || steps < 1) {
        fprintf(stderr, "bench_sync: bad arguments\n");
        return 2;
    }
    int ports[17];
    for (int i = 0; i <= workers; i++)
        if ((ports[i] = free_port()) < 0) return 1;
    pid_t pids[17];
    fflush(stdout);
    for (int i = 0; i <= workers; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            alarm(600); /* never outlive a broken run */
            _exit(i == 0 ? run_ps(model, workers, ports) : run_worker(model, batch, workers, i - 1, steps, threads, emulate_ms, ports));
        }
    }
    int rc = 0, left = 0;
    for (int i = 0; i <= workers; i++) left += pids[i] > 0, rc |= pids[i] < 0;
    while (left > 0) { /* the first failure stops the others */
        int st = 0;
        pid_t p = waitpid(-1, &st, 0);
        if (p < 0) break;
        for (int i = 0; i <= workers; i++)
            if (pids[i] == p) pids[i] = 0, left--;
        if ((!WIFEXITED(st) || WEXITSTATUS(st)) && !rc) {
            rc = 1;
            for (int i = 0; i <= workers; i++)
                if (pids[i] > 0) kill(pids[i], SIGTERM);
        }
    }
    if (rc) fprintf(stderr, "bench_sync: a process failed\n");
    return rc;
}
