/* What metrics cost the threads that train, measured apart from the training (which on a shared
 * machine swings by more than the cost itself): the updates a worker makes per step and per
 * exchange with the ps tasks, with metrics on and off, and what a scrape of /metrics and of the
 * chief's /status.json (full curves) takes the HTTP thread.
 * usage: bench_metrics [ITERATIONS]   Prints one line per case: nanoseconds per call (median of 5). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cluster/cluster.h"
#include "core/clock.h"
#include "metrics/metrics.h"
#include "metrics/names.h"
#include "metrics/status.h"

typedef struct {
    dt_metric *step, *local, *examples, *step_s, *push_pull, *wait, *tx, *rx;
    dt_status *status;
} worker_series;

static void make(worker_series *w, dt_metrics *m, const dt_cluster *c) {
    const double *b = dt_metrics_latency_bounds;
    int n = dt_metrics_latency_n;
    w->step = dt_metrics_gauge(m, DT_M_GLOBAL_STEP, "", NULL);
    w->local = dt_metrics_counter(m, DT_M_LOCAL_STEPS, "", NULL);
    w->examples = dt_metrics_counter(m, DT_M_EXAMPLES, "", NULL);
    w->step_s = dt_metrics_histogram(m, "dtrain_step_seconds", "", NULL, b, n);
    w->push_pull = dt_metrics_histogram(m, "dtrain_push_pull_seconds", "", NULL, b, n);
    w->wait = dt_metrics_histogram(m, "dtrain_barrier_wait_seconds", "", NULL, b, n);
    w->tx = dt_metrics_counter(m, DT_M_SENT, DT_M_SENT_HELP, NULL);
    w->rx = dt_metrics_counter(m, DT_M_RECEIVED, DT_M_RECEIVED_HELP, NULL);
    w->status = NULL;
    if (m) dt_status_create(&w->status, m, c, NULL);
    if (w->status) dt_status_start(w->status, 1 << 30, 0, 64);
}

/* What train.c and ps_client.c do per step when metrics are on (all of it a no-op when off). */
static void one_step(worker_series *w, int64_t i) {
    double t0 = w->status ? dt_seconds() : 0;
    dt_metric_add(w->tx, 1700000); /* the exchange: one push and one pull reply per chunk */
    dt_metric_add(w->rx, 1700000);
    if (w->status) {
        double t = dt_seconds();
        dt_metric_observe(w->push_pull, t - t0);
        dt_metric_observe(w->wait, 0);
        dt_metric_observe(w->step_s, t - t0);
        dt_metric_set(w->step, (double)i);
        dt_metric_add(w->local, 1);
        dt_metric_add(w->examples, 64);
        dt_status_step(w->status, i, 0.5, 40, 64);
    }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median5(double *v) {
    qsort(v, 5, sizeof *v, cmp);
    return v[2];
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 2000000;
    dt_cluster c;
    if (dt_cluster_from_flags(&c, "127.0.0.1:1", "127.0.0.1:2,127.0.0.1:3", "worker", "0", NULL)) return 1;
    dt_metrics *m;
    if (dt_metrics_create(&m, "worker", 0, NULL)) return 1;
    worker_series on, off;
    make(&on, m, &c);
    make(&off, NULL, &c);
    double t[5];
    for (int mode = 0; mode < 2; mode++) {
        worker_series *w = mode ? &on : &off;
        for (int r = 0; r < 5; r++) {
            double t0 = dt_seconds();
            for (long i = 0; i < iters; i++) one_step(w, i);
            t[r] = (dt_seconds() - t0) / (double)iters * 1e9;
        }
        printf("{\"case\": \"per step, metrics %s\", \"ns\": %.1f}\n", mode ? "on" : "off", median5(t));
    }
    /* A full registry and status, as a chief after a long run: every curve at its bound. */
    for (int i = 0; i < 3 * DT_STATUS_MAX_POINTS; i++) dt_status_validation(on.status, i, 0.5, 0.9, NAN);
    for (int k = 0; k < 2; k++) {
        for (int r = 0; r < 5; r++) {
            int n = 200;
            double t0 = dt_seconds();
            for (int i = 0; i < n; i++) {
                char *text;
                size_t len;
                if ((k ? dt_status_json(on.status, &text, &len, NULL) : dt_metrics_render(m, &text, &len, NULL)) == 0)
                    free(text);
            }
            t[r] = (dt_seconds() - t0) / n * 1e9;
        }
        printf("{\"case\": \"%s\", \"ns\": %.0f}\n", k ? "render /status.json (1000-point curves)" : "render /metrics",
               median5(t));
    }
    dt_status_free(on.status);
    dt_metrics_free(m);
    dt_cluster_free(&c);
    return 0;
}
