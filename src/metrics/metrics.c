#include "metrics/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/error.h"

typedef enum { KIND_COUNTER, KIND_GAUGE, KIND_HISTOGRAM, KIND_AGE } kind_t;
static const char *const kind_names[] = {"counter", "gauge", "histogram", "gauge"};

/* Doubles kept as their bits in an atomic 64-bit word: a store is one atomic store, an add a
 * compare-and-swap loop that succeeds at once unless two threads add at the same moment. */
typedef _Atomic uint64_t atomic_double;

static double load_d(const atomic_double *a) {
    uint64_t b = atomic_load_explicit(a, memory_order_relaxed);
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

static void store_d(atomic_double *a, double d) {
    uint64_t b;
    memcpy(&b, &d, sizeof b);
    atomic_store_explicit(a, b, memory_order_relaxed);
}

static void add_d(atomic_double *a, double v) {
    uint64_t old = atomic_load_explicit(a, memory_order_relaxed), new;
    do {
        double d;
        memcpy(&d, &old, sizeof d);
        d += v;
        memcpy(&new, &d, sizeof new);
    } while (!atomic_compare_exchange_weak_explicit(a, &old, new, memory_order_relaxed, memory_order_relaxed));
}

struct dt_metric {
    kind_t kind;
    char *labels;                 /* extra labels, "" for none */
    atomic_double value;          /* counter, gauge; age: the dt_seconds() of the last touch (NaN: never) */
    int n_bounds;                 /* histogram */
    const double *bounds;         /* the family's */
    _Atomic uint64_t buckets[DT_METRICS_MAX_BUCKETS + 1]; /* per bucket, not cumulative; the last: +Inf */
    atomic_double sum;
    struct dt_metric *next;
};

typedef struct family {
    char *name, *help;
    kind_t kind;
    double bounds[DT_METRICS_MAX_BUCKETS];
    int n_bounds;
    dt_metric *series, **tail;
    struct family *next;
} family;

struct dt_metrics {
    pthread_mutex_t lock;         /* registration and rendering; never taken by updates */
    char job[32];
    int task;
    family *families, **tail;
    int failed;                   /* a registration ran out of memory */
};

const double dt_metrics_latency_bounds[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                            0.05,   0.1,     0.25,   0.5,   1,      2.5,   10,    60};
const int dt_metrics_latency_n = (int)(sizeof dt_metrics_latency_bounds / sizeof dt_metrics_latency_bounds[0]);

int dt_metrics_create(dt_metrics **out, const char *job, int task, dt_error *err) {
    *out = NULL;
    dt_metrics *m = dt_calloc(1, sizeof *m, "metrics registry", err);
    if (!m) return DT_ENOMEM;
    if (pthread_mutex_init(&m->lock, NULL) != 0) {
        free(m);
        return dt_errorf(err, DT_ENOMEM, "metrics registry: cannot create its mutex");
    }
    snprintf(m->job, sizeof m->job, "%s", job ? job : "");
    m->task = task;
    m->tail = &m->families;
    *out = m;
    return DT_OK;
}

void dt_metrics_free(dt_metrics *m) {
    if (!m) return;
    for (family *f = m->families, *fn; f; f = fn) {
        fn = f->next;
        for (dt_metric *s = f->series, *sn; s; s = sn) {
            sn = s->next;
            free(s->labels);
            free(s);
        }
        free(f->name);
        free(f->help);
        free(f);
    }
    pthread_mutex_destroy(&m->lock);
    free(m);
}

static family *find_family(dt_metrics *m, const char *name, const char *help, kind_t kind, const double *bounds,
                           int n_bounds) {
    for (family *f = m->families; f; f = f->next)
        if (!strcmp(f->name, name)) return f->kind == kind ? f : NULL; /* a name of two kinds: a bug, no series */
    family *f = calloc(1, sizeof *f);
    if (!f || !(f->name = strdup(name)) || !(f->help = strdup(help ? help : ""))) {
        if (f) free(f->name);
        free(f);
        m->failed = 1;
        return NULL;
    }
    f->kind = kind;
    f->n_bounds = n_bounds;
    if (n_bounds) memcpy(f->bounds, bounds, (size_t)n_bounds * sizeof *bounds);
    f->tail = &f->series;
    *m->tail = f;
    m->tail = &f->next;
    return f;
}

static dt_metric *series(dt_metrics *m, const char *name, const char *help, const char *labels, kind_t kind,
                         const double *bounds, int n_bounds) {
    if (!m || !name) return NULL;
    if (n_bounds < 0 || n_bounds > DT_METRICS_MAX_BUCKETS) return NULL;
    if (!labels) labels = "";
    pthread_mutex_lock(&m->lock);
    dt_metric *s = NULL;
    family *f = find_family(m, name, help, kind, bounds, n_bounds);
    if (f) for (s = f->series; s && strcmp(s->labels, labels); s = s->next) {}
    if (f && !s) {
        if ((s = calloc(1, sizeof *s)) && (s->labels = strdup(labels))) {
            s->kind = kind;
            s->n_bounds = f->n_bounds;
            s->bounds = f->bounds;
            if (kind == KIND_AGE) store_d(&s->value, NAN);
            *f->tail = s;
            f->tail = &s->next;
        } else {
            free(s);
            s = NULL;
            m->failed = 1;
        }
    }
    pthread_mutex_unlock(&m->lock);
    return s;
}

dt_metric *dt_metrics_counter(dt_metrics *m, const char *name, const char *help, const char *labels) {
    return series(m, name, help, labels, KIND_COUNTER, NULL, 0);
}

dt_metric *dt_metrics_gauge(dt_metrics *m, const char *name, const char *help, const char *labels) {
    return series(m, name, help, labels, KIND_GAUGE, NULL, 0);
}

dt_metric *dt_metrics_histogram(dt_metrics *m, const char *name, const char *help, const char *labels,
                                const double *bounds, int n_bounds) {
    for (int i = 1; i < n_bounds; i++)
        if (!(bounds[i] > bounds[i - 1])) return NULL;
    return series(m, name, help, labels, KIND_HISTOGRAM, bounds, n_bounds);
}

dt_metric *dt_metrics_age(dt_metrics *m, const char *name, const char *help, const char *labels) {
    return series(m, name, help, labels, KIND_AGE, NULL, 0);
}

void dt_metric_add(dt_metric *x, double v) {
    if (x) add_d(&x->value, v);
}

void dt_metric_set(dt_metric *x, double v) {
    if (x) store_d(&x->value, v);
}

void dt_metric_observe(dt_metric *x, double v) {
    if (!x || x->kind != KIND_HISTOGRAM) return;
    int b = 0;
    while (b < x->n_bounds && v > x->bounds[b]) b++;
    atomic_fetch_add_explicit(&x->buckets[b], 1, memory_order_relaxed);
    add_d(&x->sum, v);
}

void dt_metric_touch(dt_metric *x) {
    if (x) store_d(&x->value, dt_seconds());
}

static uint64_t hist_count(const dt_metric *x) {
    uint64_t n = 0;
    for (int b = 0; b <= x->n_bounds; b++) n += atomic_load_explicit(&x->buckets[b], memory_order_relaxed);
    return n;
}

double dt_metric_value(const dt_metric *x) {
    if (!x) return NAN;
    if (x->kind == KIND_HISTOGRAM) return (double)hist_count(x);
    double v = load_d(&x->value);
    return x->kind == KIND_AGE ? (isnan(v) ? NAN : dt_seconds() - v) : v;
}

double dt_metrics_lookup(dt_metrics *m, const char *name, const char *labels) {
    if (!m) return NAN;
    if (!labels) labels = "";
    double v = NAN;
    pthread_mutex_lock(&m->lock);
    for (const family *f = m->families; f; f = f->next)
        if (!strcmp(f->name, name))
            for (const dt_metric *s = f->series; s; s = s->next)
                if (!strcmp(s->labels, labels)) v = dt_metric_value(s);
    pthread_mutex_unlock(&m->lock);
    return v;
}

const char *dt_metrics_job(const dt_metrics *m) { return m ? m->job : ""; }
int dt_metrics_task(const dt_metrics *m) { return m ? m->task : 0; }

/* A sample value as the exposition format spells it. */
static void put_value(FILE *f, double v) {
    if (isnan(v)) fputs("NaN", f);
    else if (isinf(v)) fputs(v > 0 ? "+Inf" : "-Inf", f);
    else fprintf(f, "%.17g", v);
}

static void put_labels(FILE *f, const dt_metrics *m, const dt_metric *s, const char *le) {
    fprintf(f, "{job=\"%s\",task=\"%d\"", m->job, m->task);
    if (s->labels[0]) fprintf(f, ",%s", s->labels);
    if (le) fprintf(f, ",le=\"%s\"", le);
    fputc('}', f);
}

int dt_metrics_render(dt_metrics *m, char **out, size_t *len, dt_error *err) {
    *out = NULL;
    *len = 0;
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return dt_errorf(err, DT_ENOMEM, "metrics: out of memory for the page");
    pthread_mutex_lock(&m->lock);
    int failed = m->failed;
    for (const family *fa = m->families; fa && !failed; fa = fa->next) {
        fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", fa->name, fa->help, fa->name, kind_names[fa->kind]);
        for (const dt_metric *s = fa->series; s; s = s->next) {
            if (fa->kind != KIND_HISTOGRAM) {
                fputs(fa->name, f);
                put_labels(f, m, s, NULL);
                fputc(' ', f);
                put_value(f, dt_metric_value(s));
                fputc('\n', f);
                continue;
            }
            uint64_t cum = 0;
            for (int b = 0; b <= s->n_bounds; b++) {
                cum += atomic_load_explicit(&s->buckets[b], memory_order_relaxed);
                char le[32];
                if (b < s->n_bounds) snprintf(le, sizeof le, "%g", s->bounds[b]);
                else snprintf(le, sizeof le, "+Inf");
                fprintf(f, "%s_bucket", fa->name);
                put_labels(f, m, s, le);
                fprintf(f, " %llu\n", (unsigned long long)cum);
            }
            fprintf(f, "%s_sum", fa->name);
            put_labels(f, m, s, NULL);
            fputc(' ', f);
            put_value(f, load_d(&s->sum));
            fprintf(f, "\n%s_count", fa->name);
            put_labels(f, m, s, NULL);
            fprintf(f, " %llu\n", (unsigned long long)cum);
        }
    }
    pthread_mutex_unlock(&m->lock);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad || failed) {
        free(buf);
        return failed ? dt_errorf(err, DT_ENOMEM, "metrics: a series could not be registered (out of memory)")
                      : dt_errorf(err, DT_ENOMEM, "metrics: out of memory for the page");
    }
    *out = buf;
    *len = n;
    return DT_OK;
}
