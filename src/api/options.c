/* The options object of include/dtrain.h: `dtrain train`'s flag table (train/train_args.c) set by
 * name, a binding's arrays and step callback, and dt_train over them (train/train_ex.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_impl.h"
#include "core/error.h"
#include "data/ctr.h"
#include "train/train_args.h"
#include "train/train_ex.h"

struct dt_options {
    train_args a;
    char **strings;              /* the values given to text flags, owned (the table keeps pointers) */
    size_t n_strings, cap_strings;
    dt_train_ex_args ex;
    dt_log_fn log_fn;            /* the log's lines to a caller instead of a FILE (dt_options_set_log) */
    void *log_user;
    volatile int stop;           /* dt_options_stop sets it, dt_train polls it (as a signal handler's) */
};

int dt_options_new(dt_options **out, dt_error *err) {
    *out = NULL;
    dt_options *o = dt_calloc(1, sizeof *o, "options", err);
    if (!o) return DT_ENOMEM;
    train_args_init(&o->a);
    *out = o;
    return DT_OK;
}

void dt_options_free(dt_options *o) {
    if (!o) return;
    for (size_t i = 0; i < o->n_strings; i++) free(o->strings[i]);
    free(o->strings);
    free(o);
}

int dt_options_set(dt_options *o, const char *flag, const char *value, dt_error *err) {
    if (!o || !flag || !value) return dt_errorf(err, DT_EINVAL, "dt_options_set: options, flag and value are needed");
    if (o->n_strings == o->cap_strings) {
        size_t cap = o->cap_strings ? 2 * o->cap_strings : 16;
        char **s = realloc(o->strings, cap * sizeof *s);
        if (!s) return dt_errorf(err, DT_ENOMEM, "--%s: out of memory", flag);
        o->strings = s, o->cap_strings = cap;
    }
    char *copy = strdup(value);
    if (!copy) return dt_errorf(err, DT_ENOMEM, "--%s: out of memory", flag);
    flag_def defs[TRAIN_MAX_FLAGS];
    int n = train_args_flags(&o->a, defs);
    int rc = flags_set(defs, n, flag, copy, err);
    /* Kept even when unused by a numeric flag: a text flag's table entry points to it. */
    o->strings[o->n_strings++] = copy;
    return rc;
}

int dt_options_get(const dt_options *o, const char *flag, char *out, size_t cap, dt_error *err) {
    if (!o) return dt_errorf(err, DT_EINVAL, "dt_options_get: no options");
    flag_def defs[TRAIN_MAX_FLAGS];
    int n = train_args_flags((train_args *)&o->a, defs); /* the table only reads through get */
    return flags_get(defs, n, flag, out, cap, err);
}

int dt_options_set_arrays(dt_options *o, int split, const void *x, int dtype, const int32_t *labels, int64_t n,
                          int h, int w, int c, dt_error *err) {
    if (!o) return dt_errorf(err, DT_EINVAL, "dt_options_set_arrays: no options");
    if (split != 0 && split != 1) return dt_errorf(err, DT_EINVAL, "dt_options_set_arrays: split must be 0 or 1, got %d", split);
    const char *name = split ? "test x" : "x";
    if (dtype != DT_FLOAT32 && dtype != DT_UINT8)
        return dt_errorf(err, DT_EINVAL, "%s: dtype must be DT_FLOAT32 or DT_UINT8, got %d", name, dtype);
    if (n < 0) return dt_errorf(err, DT_EINVAL, "%s: %lld examples", name, (long long)n);
    if (n > 0 && (!x || !labels)) return dt_errorf(err, DT_EINVAL, "%s: examples and labels are needed", name);
    if (n > 0 && (h < 1 || w < 1 || c < 1))
        return dt_errorf(err, DT_ESHAPE, "%s: example shape %d x %d x %d", name, h, w, c);
    dt_train_array *a = split ? &o->ex.test : &o->ex.train;
    *a = (dt_train_array){.x = x, .x_u8 = dtype == DT_UINT8, .labels = labels, .n = (size_t)n, .h = h, .w = w, .c = c};
    return DT_OK;
}

int dt_clicks_new(dt_clicks **out, int64_t n, const float *labels, int num_dense, const float *dense, int num_fields,
                  const int64_t *offsets, const uint64_t *ids, const float *values, int64_t nnz, dt_error *err) {
    *out = NULL;
    if (n < 1 || nnz < 0) return dt_errorf(err, DT_EINVAL, "click arrays: %lld rows, %lld ids", (long long)n, (long long)nnz);
    if (num_dense < 0 || num_dense > DT_CTR_MAX_FIELDS || num_fields < 1 || num_fields > DT_CTR_MAX_FIELDS)
        return dt_errorf(err, DT_ESHAPE, "click arrays: %d dense features and %d fields, expected 0 to %d and 1 to %d",
                         num_dense, num_fields, DT_CTR_MAX_FIELDS, DT_CTR_MAX_FIELDS);
    if (!labels || !ids || (num_dense && !dense))
        return dt_errorf(err, DT_EINVAL, "click arrays: labels, ids%s are needed", num_dense ? " and dense" : "");
    /* row * fields (+ 1) and row * dense must not overflow anywhere the reader indexes */
    if (n > (INT64_MAX - 1) / num_fields || (num_dense && n > INT64_MAX / num_dense))
        return dt_errorf(err, DT_ESHAPE, "click arrays: %lld rows of %d fields overflow", (long long)n, num_fields);
    if (!offsets && nnz < n * num_fields)
        return dt_errorf(err, DT_ESHAPE, "click ids: %lld, but one per field needs %lld (%lld rows x %d fields)",
                         (long long)nnz, (long long)(n * num_fields), (long long)n, num_fields);
    dt_clicks *c = dt_calloc(1, sizeof *c, "click arrays", err);
    if (!c) return DT_ENOMEM;
    c->m = (dt_ctr_memory){.n = n, .nnz = nnz, .num_dense = num_dense, .num_fields = num_fields, .labels = labels,
                           .dense = dense, .offsets = offsets, .ids = ids, .values = values};
    *out = c;
    return DT_OK;
}

void dt_clicks_free(dt_clicks *c) { free(c); }

int dt_options_set_clicks(dt_options *o, const dt_clicks *c, dt_error *err) {
    if (!o) return dt_errorf(err, DT_EINVAL, "dt_options_set_clicks: no options");
    o->ex.clicks = c ? c->m : (dt_ctr_memory){0};
    return DT_OK;
}

void dt_options_set_batches(dt_options *o, dt_batch_source fn, void *user) {
    if (!o) return;
    /* DT_UINT8 is 1, as the source's x_u8 flag reads it */
    o->ex.next_batch = (dt_train_batch_fn)fn, o->ex.batch_user = user;
}

void dt_options_set_callback(dt_options *o, dt_step_callback fn, void *user, int64_t every) {
    if (!o) return;
    o->ex.on_step = fn, o->ex.user = user, o->ex.every = every;
}

void dt_options_set_params_out(dt_options *o, float *out, size_t n) {
    if (!o) return;
    o->ex.params_out = out, o->ex.params_n = n;
}

void dt_options_stop(dt_options *o) {
    if (!o) return;
    o->stop = 1;
}

void dt_options_set_log(dt_options *o, dt_log_fn fn, void *user) {
    if (!o) return;
    o->log_fn = fn, o->log_user = user;
}

/* The log as a stream whose whole lines go to a caller's function: glibc's stream lock serialises the
 * writers (the training thread, the updater's, the line counter's), so one line is never cut by
 * another's. */
typedef struct {
    dt_log_fn fn;
    void *user;
    char line[4096];             /* the line so far; a longer one goes out in pieces of this size */
    size_t len;
} log_lines;

static void log_emit(log_lines *l) {
    l->line[l->len] = '\0';
    l->fn(l->user, l->line);
    l->len = 0;
}

static ssize_t log_write(void *cookie, const char *buf, size_t n) {
    log_lines *l = cookie;
    for (size_t i = 0; i < n; i++) {
        l->line[l->len++] = buf[i];
        if (buf[i] == '\n' || l->len == sizeof l->line - 1) log_emit(l);
    }
    return (ssize_t)n;
}

static int log_close(void *cookie) {
    log_lines *l = cookie;
    if (l->len) log_emit(l); /* a last line without its newline */
    free(l);
    return 0;
}

int dt_options_open_log(const dt_options *o, FILE **out, dt_error *err) {
    *out = NULL;
    if (!o->log_fn) return DT_OK;
    log_lines *l = dt_calloc(1, sizeof *l, "log lines", err);
    if (!l) return DT_ENOMEM;
    l->fn = o->log_fn, l->user = o->log_user;
    FILE *f = fopencookie(l, "w", (cookie_io_functions_t){.write = log_write, .close = log_close});
    if (!f) {
        free(l);
        return dt_errorf(err, DT_ENOMEM, "out of memory for the log's stream");
    }
    setvbuf(f, NULL, _IOLBF, BUFSIZ); /* each line out as it ends, as a terminal's */
    *out = f;
    return DT_OK;
}

int dt_options_train(dt_options *o, FILE *log, dt_train_result *result, dt_error *err) {
    if (!o) return dt_errorf(err, DT_EINVAL, "dt_options_train: no options");
    train_args a = o->a;
    int rc = train_args_finish(&a, err);
    if (rc) return rc;
    o->stop = 0;
    a.o.stop = &o->stop;
    FILE *lines;
    if ((rc = dt_options_open_log(o, &lines, err))) return rc;
    rc = dt_train_ex(&a.o, &a.dbg, &o->ex, lines ? lines : log, result, err);
    if (lines) fclose(lines);
    return rc;
}

const volatile int *dt_options_stop_flag(const dt_options *o) { return &o->stop; }

int dt_options_resolve(const dt_options *o, dt_train_options *out, dt_error *err) {
    train_args a = o->a;
    int rc = train_args_finish(&a, err);
    if (!rc) *out = a.o;
    return rc;
}
