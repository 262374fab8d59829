#include "plot/curves.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "data/listing.h"
#include "io/events.h"
#include "io/fsutil.h"


int dt_curves_init(dt_run_curves *c, const char *name, dt_error *err) {
    memset(c, 0, sizeof *c);
    if (!(c->name = strdup(name ? name : ""))) return dt_errorf(err, DT_ENOMEM, "out of memory for a run name");
    return 0;
}

void dt_curves_free(dt_run_curves *c) {
    if (!c) return;
    free(c->name);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            free(c->s[i][j].step);
            free(c->s[i][j].value);
        }
    memset(c, 0, sizeof *c);
}

static int series_add(dt_series *s, int64_t step, double v, dt_error *err) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        int64_t *ns = realloc(s->step, cap * sizeof *ns);
        if (ns) s->step = ns;
        double *nv = ns ? realloc(s->value, cap * sizeof *nv) : NULL;
        if (!nv) return dt_errorf(err, DT_ENOMEM, "out of memory for %zu points", s->n);
        s->value = nv;
        s->cap = cap;
    }
    s->step[s->n] = step;
    s->value[s->n++] = v;
    return 0;
}

static int add_records(dt_run_curves *c, int split, dt_record_reader *r, const char *label, FILE *log,
                       dt_error *err) {
    for (;;) {
        const uint8_t *data;
        size_t len;
        uint64_t at = 0;
        dt_error rerr = {0};
        int rc = dt_record_reader_next(r, &data, &len, &at, &rerr);
        if (rc == 0) return 0;
        dt_event ev;
        if (rc > 0 && (rc = dt_event_decode(&ev, data, len, &rerr)) != 0)
            dt_error_wrap(&rerr, rc, "%s: record at offset %" PRIu64 ": ", label, at);
        if (rc < 0) { /* a writer killed mid-record leaves this: what came before is good */
            if (log) fprintf(log, "warning: %s; the records before it are used\n", rerr.msg);
            c->damaged++;
            return 0;
        }
        for (int i = 0; !rc && ev.kind == DT_EVENT_KIND_SUMMARY && i < ev.n_values; i++) {
            const dt_event_value *v = &ev.values[i];
            int tag = !v->has_simple_value ? -1 : !strcmp(v->tag, "cost") ? DT_TAG_COST
                                              : !strcmp(v->tag, "accuracy") ? DT_TAG_ACCURACY : -1;
            if (tag < 0) continue;
            if (!isfinite(v->simple_value)) c->non_finite++;
            else rc = series_add(&c->s[split][tag], ev.step, v->simple_value, err);
        }
        dt_event_free(&ev);
        if (rc) return rc;
    }
}

int dt_curves_add_events(dt_run_curves *c, int split, const uint8_t *buf, size_t n, const char *label, FILE *log,
                         dt_error *err) {
    dt_record_reader *r = NULL;
    int rc = dt_record_reader_open_memory(&r, buf, n, label, err);
    if (!rc) rc = add_records(c, split, r, label, log, err);
    dt_record_reader_close(r);
    return rc;
}

int dt_curves_add_file(dt_run_curves *c, int split, const char *path, FILE *log, dt_error *err) {
    dt_record_reader *r = NULL;
    int rc = dt_record_reader_open(&r, path, err);
    if (!rc) rc = add_records(c, split, r, path, log, err);
    dt_record_reader_close(r);
    return rc;
}

/* Sort by step, stable, so that among equal steps the value read last is the one kept. */
typedef struct {
    int64_t step;
    size_t seq;
    double v;
} point;

static int cmp_point(const void *a, const void *b) {
    const point *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int series_finish(dt_series *s, dt_error *err) {
    if (s->n < 2) return 0;
    point *p = dt_calloc(s->n, sizeof *p, "points to sort", err);
    if (!p) return DT_ENOMEM;
    for (size_t i = 0; i < s->n; i++) p[i] = (point){s->step[i], i, s->value[i]};
    qsort(p, s->n, sizeof *p, cmp_point);
    size_t m = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (m && s->step[m - 1] == p[i].step) m--; /* a later value of the same step replaces it */
        s->step[m] = p[i].step;
        s->value[m++] = p[i].v;
    }
    s->n = m;
    free(p);
    return 0;
}

int dt_curves_finish(dt_run_curves *c, dt_error *err) {
    int rc = 0;
    for (int i = 0; i < 2; i++)
        for (int j = 0; !rc && j < 2; j++) rc = series_finish(&c->s[i][j], err);
    return rc;
}

static int read_split(dt_run_curves *c, int split, const char *dir, FILE *log, dt_error *err) {
    char sub[DT_PATH_MAX];
    int rc = dt_path_join(sub, sizeof sub, dir, split == DT_SPLIT_TRAIN ? "train" : "test", err);
    if (rc) return rc;
    char **names = NULL;
    size_t n = 0;
    dt_error lerr = {0};
    if (dt_data_list_dir(&names, &n, sub, 0, &lerr)) return 0; /* no such folder: nothing from it */
    for (size_t i = 0; !rc && i < n; i++) {
        if (!strstr(names[i], "tfevents")) continue;
        char path[DT_PATH_MAX];
        if (!(rc = dt_path_join(path, sizeof path, sub, names[i], err)) &&
            !(rc = dt_curves_add_file(c, split, path, log, err)))
            c->files++;
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return rc;
}

int dt_curves_read(dt_run_curves *out, const char *name, const char *dir, FILE *log, dt_error *err) {
    int rc = dt_curves_init(out, name, err);
    if (!rc) rc = read_split(out, DT_SPLIT_TRAIN, dir, log, err);
    if (!rc) rc = read_split(out, DT_SPLIT_TEST, dir, log, err);
    if (!rc && out->files == 0)
        rc = dt_errorf(err, DT_EINVAL, "%s: no event files in %s/train or %s/test (expected a --summary_dir)", dir, dir,
                       dir);
    if (!rc) rc = dt_curves_finish(out, err);
    if (rc) dt_curves_free(out);
    return rc;
}
