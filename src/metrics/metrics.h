/* Prometheus metrics of one process: counters, gauges and histograms, each a series of a family
 * (`dtrain_*`, base units), every series labelled with the process's job and task (plus labels of
 * its own, e.g. ps="1"). Served as the text exposition format by metrics/http.h; listed in
 * docs/metrics.md.
 *
 * Cost: a series is registered once (a mutex, a short list walk); updating one is an atomic add or
 * store, no lock, and every update of a NULL series does nothing, so code that updates its series
 * unconditionally costs a pointer test when metrics are off (a NULL registry gives NULL series). */
#ifndef DT_METRICS_METRICS_H
#define DT_METRICS_METRICS_H

#include <stddef.h>

#include "dtrain.h"

typedef struct dt_metrics dt_metrics;
typedef struct dt_metric dt_metric;

#define DT_METRICS_MAX_BUCKETS 16

/* A registry for the process of this job ("ps", "worker") and task index. */
int dt_metrics_create(dt_metrics **out, const char *job, int task, dt_error *err);
/* Only once nothing updates or renders any more (the HTTP server stopped). NULL: nothing. */
void dt_metrics_free(dt_metrics *m);

/* The series of family `name` with the extra labels `labels` (NULL or "": none; else like
 * `ps="1"`), created on first use; the same name and labels give the same series again (a
 * reconnecting client keeps counting where it was). name must be a new family or one of this
 * kind. NULL registry: NULL. Out of memory: NULL, and the registry renders an error from then on
 * (dt_metrics_render) rather than a silently incomplete page. */
dt_metric *dt_metrics_counter(dt_metrics *m, const char *name, const char *help, const char *labels);
dt_metric *dt_metrics_gauge(dt_metrics *m, const char *name, const char *help, const char *labels);
/* bounds: upper bounds of the buckets, increasing, at most DT_METRICS_MAX_BUCKETS (+Inf is added). */
dt_metric *dt_metrics_histogram(dt_metrics *m, const char *name, const char *help, const char *labels,
                                const double *bounds, int n_bounds);
/* A gauge whose value is the seconds since the latest dt_metric_touch (NaN before any). */
dt_metric *dt_metrics_age(dt_metrics *m, const char *name, const char *help, const char *labels);

/* Updates: lock-free, any thread; x may be NULL (metrics off). */
void dt_metric_add(dt_metric *x, double v);      /* counters (v >= 0) and gauges */
void dt_metric_set(dt_metric *x, double v);      /* gauges */
void dt_metric_observe(dt_metric *x, double v);  /* histograms */
void dt_metric_touch(dt_metric *x);              /* ages: now */
/* A counter's or gauge's value, a histogram's count, an age's seconds; NaN for NULL. */
double dt_metric_value(const dt_metric *x);

/* The value (as dt_metric_value) of the series of family name with exactly these extra labels
 * (NULL: none), NaN if there is none: for the status page, which shows some series as figures. */
double dt_metrics_lookup(dt_metrics *m, const char *name, const char *labels);

/* Bucket bounds shared by the latency histograms (seconds, 100 us .. 60 s). */
extern const double dt_metrics_latency_bounds[];
extern const int dt_metrics_latency_n;

/* The whole registry in Prometheus' text exposition format (version 0.0.4), families in the order
 * they were first registered, into a malloc'ed string (*out, *len; the caller frees). Fails with
 * DT_ENOMEM if a registration failed earlier. */
int dt_metrics_render(dt_metrics *m, char **out, size_t *len, dt_error *err);

/* The job and task the registry was made for. */
const char *dt_metrics_job(const dt_metrics *m);
int dt_metrics_task(const dt_metrics *m);

#endif
