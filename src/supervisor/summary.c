#include "supervisor/summary.h"

#include <stdlib.h>

#include "core/error.h"
#include "io/events.h"
#include "io/fsutil.h"

struct dt_summary {
    dt_event_writer *w[2]; /* train, test */
};

int dt_summary_open(dt_summary **out, const char *dir, dt_error *err) {
    *out = NULL;
    dt_summary *s = dt_calloc(1, sizeof *s, "summary writers", err);
    if (!s) return DT_ENOMEM;
    static const char *const sub[2] = {"train", "test"};
    double now = dt_wall_time();
    for (int i = 0; i < 2; i++) {
        char path[DT_PATH_MAX];
        int rc = dt_path_join(path, sizeof path, dir, sub[i], err);
        if (!rc) rc = dt_event_writer_open(&s->w[i], path, now, err);
        if (rc) {
            dt_summary_close(s, NULL);
            return rc;
        }
    }
    *out = s;
    return 0;
}

/* Each value is measured now; all of them share one wall time. */
static int scalars(dt_event_writer *w, int64_t step, const char *const *tags, const double *v, int n, dt_error *err) {
    double now = dt_wall_time();
    for (int i = 0; i < n; i++) {
        int rc = dt_event_add_scalar(w, tags[i], step, (float)v[i], now, err);
        if (rc) return rc;
    }
    return dt_event_writer_flush(w, err);
}

int dt_summary_train(dt_summary *s, int64_t global_step, double cost, double accuracy, double steps_per_sec,
                     double examples_per_sec, double learning_rate, dt_error *err) {
    static const char *const tags[] = {"cost", "accuracy", "global_step/sec", "examples/sec", "learning_rate"};
    double v[] = {cost, accuracy, steps_per_sec, examples_per_sec, learning_rate};
    return scalars(s->w[0], global_step, tags, v, 5, err);
}

int dt_summary_test(dt_summary *s, int64_t global_step, double cost, double accuracy, dt_error *err) {
    static const char *const tags[] = {"cost", "accuracy"};
    double v[] = {cost, accuracy};
    return scalars(s->w[1], global_step, tags, v, 2, err);
}

int dt_summary_binary(dt_summary *s, int64_t global_step, double auc, double logloss, dt_error *err) {
    static const char *const tags[] = {"auc", "logloss"};
    double v[] = {auc, logloss};
    return scalars(s->w[1], global_step, tags, v, 2, err);
}

const char *dt_summary_path(const dt_summary *s, int test) { return dt_event_writer_path(s->w[test ? 1 : 0]); }

int dt_summary_close(dt_summary *s, dt_error *err) {
    if (!s) return 0;
    int rc = 0;
    for (int i = 0; i < 2; i++) {
        int r = dt_event_writer_close(s->w[i], rc ? NULL : err);
        if (r && !rc) rc = r;
    }
    free(s);
    return rc;
}
