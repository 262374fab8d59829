/* dtrain predict: apply a trained model to new images. Restores the newest good checkpoint (or
 * --checkpoint FILE), reads images from folders, files, a --list file or one IDX file, decodes them
 * exactly as training does, and writes one CSV line per image: the file, the predicted class and
 * the softmax probability of every class; or, with --format kaggle, the cats-vs-dogs submission
 * (id,label = the probability of dog). Output goes to stdout, or to --out FILE, which appears only
 * complete (written aside and renamed at the end). */
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "commands.h"
#include "core/clock.h"
#include "core/error.h"
#include "data/dataset.h"
#include "flags.h"
#include "io/fsutil.h"
#include "model/net.h"
#include "train/predict.h"
#include "train/restore.h"

typedef struct {
    const dt_dataset *ds;
    const char *idx_path;      /* IDX input: rows are named "<path>[<index>]" */
    char **names;              /* [classes] class names (the checkpoint's, else the numbers) */
    int kaggle, dog;           /* --format kaggle: the class whose probability is written */
    dt_atomic_file *file;      /* --out, else stdout */
    char *buf;                 /* one batch's text */
    size_t len, cap;
} sink;

static int put(sink *s, dt_error *err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int put(sink *s, dt_error *err, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(s->buf ? s->buf + s->len : NULL, s->cap - s->len, fmt, ap);
        va_end(ap);
        if (n < 0) return dt_errorf(err, DT_EINVAL, "cannot format an output line");
        if ((size_t)n < s->cap - s->len) {
            s->len += (size_t)n;
            return 0;
        }
        size_t cap = (s->cap + (size_t)n + 1) * 2;
        char *nb = realloc(s->buf, cap);
        if (!nb) return dt_errorf(err, DT_ENOMEM, "out of memory for the output");
        s->buf = nb;
        s->cap = cap;
    }
}

/* A CSV field: quoted (quotes doubled) when it holds a comma, quote or line break (RFC 4180). */
static int put_field(sink *s, const char *v, dt_error *err) {
    if (!v[strcspn(v, ",\"\r\n")]) return put(s, err, "%s", v);
    int rc = put(s, err, "\"");
    for (const char *p = v; !rc && *p; p++) rc = *p == '"' ? put(s, err, "\"\"") : put(s, err, "%c", *p);
    return rc ? rc : put(s, err, "\"");
}

static int flush_sink(sink *s, dt_error *err) {
    int rc = 0;
    if (s->file) rc = dt_atomic_write(s->file, s->buf, s->len, err);
    else if (fwrite(s->buf, 1, s->len, stdout) != s->len || fflush(stdout))
        rc = dt_errorf(err, DT_EIO, "standard output: write failed");
    s->len = 0;
    return rc;
}

/* Kaggle's id of a file: its name without folders and extension, and for "<class>.<id>.<ext>"
 * names (the labelled set's) the part after the class: "test1/123.jpg" and "dog.123.jpg" give 123. */
static void kaggle_id(char *out, size_t cap, const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *ext = strrchr(base, '.');
    size_t len = ext && ext != base ? (size_t)(ext - base) : strlen(base);
    const char *dot = memchr(base, '.', len);
    if (dot) {
        len -= (size_t)(dot + 1 - base);
        base = dot + 1;
    }
    snprintf(out, cap, "%.*s", (int)len, base);
}

static int emit(void *user, const size_t *ids, const int *predicted, const float *probs, int n, int classes,
                dt_error *err) {
    sink *s = user;
    int rc = 0;
    for (int i = 0; !rc && i < n; i++) {
        char name[DT_PATH_MAX + 32];
        const char *path = dt_dataset_path(s->ds, ids[i]);
        if (!path) snprintf(name, sizeof name, "%s[%zu]", s->idx_path, ids[i]);
        const float *p = probs + (size_t)i * classes;
        if (s->kaggle) {
            char id[DT_PATH_MAX];
            if (path) kaggle_id(id, sizeof id, path);
            else snprintf(id, sizeof id, "%zu", ids[i]);
            rc = put_field(s, id, err);
            if (!rc) rc = put(s, err, ",%.6g\n", (double)p[s->dog]);
            continue;
        }
        rc = put_field(s, path ? path : name, err);
        if (!rc) rc = put(s, err, ",");
        if (!rc) rc = put_field(s, s->names[predicted[i]], err);
        for (int k = 0; !rc && k < classes; k++) rc = put(s, err, ",%.6g", (double)p[k]);
        if (!rc) rc = put(s, err, "\n");
    }
    return rc ? rc : flush_sink(s, err);
}

/* The class names of the output: the checkpoint's, the rest (or all) numbered. */
static char **class_names(const dt_restored *r, int classes, dt_error *err) {
    char **names = dt_calloc((size_t)classes, sizeof *names, "class names", err);
    for (int k = 0; names && k < classes; k++) {
        char num[16];
        snprintf(num, sizeof num, "%d", k);
        if (!(names[k] = strdup(k < r->n_class_names ? r->class_names[k] : num))) {
            for (int j = 0; j < k; j++) free(names[j]);
            free(names);
            names = NULL;
            dt_errorf(err, DT_ENOMEM, "out of memory for the class names");
        }
    }
    return names;
}

/* --format kaggle writes the probability of "dog". A checkpoint that records no names (trained
 * before they were recorded) of a 2-class model: the classes sorted, as the data layer sorts
 * them, put dog second. */
static int find_dog(const dt_restored *r, char **names, int classes, int *dog, dt_error *err) {
    for (int k = 0; k < r->n_class_names; k++)
        if (!strcasecmp(names[k], "dog")) {
            *dog = k;
            return 0;
        }
    if (r->n_class_names == 0 && classes == 2) {
        fprintf(stderr, "dtrain predict: warning: %s records no class names; taking class 1 as dog (cat, dog "
                        "in sorted order)\n", r->path);
        *dog = 1;
        return 0;
    }
    return dt_errorf(err, DT_EINVAL, "--format kaggle: %s has no class named dog (its %d classes: %s%s%s)", r->path,
                     classes, names[0], classes > 1 ? ", " : "", classes > 1 ? names[1] : "");
}

static int fail(const char *msg) {
    fprintf(stderr, "dtrain predict: %s\n", msg);
    return 1;
}

int cmd_predict(int argc, char **argv) {
    const char *logdir = "./checkpoint", *file = NULL, *model = NULL, *out = NULL, *format = "csv", *list = NULL,
               *bad = "skip", *device = NULL;
    int batch_size = 0, threads = 0;
    flag_def defs[] = {
        FLAGS_RESTORE(&logdir, &file, &model, &batch_size, &threads, &device),
        FLAG_TEXT("out", &out, "write the CSV to this file (default: standard output)"),
        FLAG_TEXT("format", &format, "csv (file,class,p_<class>...) or kaggle (id,label: the probability of dog)"),
        FLAG_TEXT("list", &list, "a text file naming more images (or folders), one per line"),
        FLAG_TEXT("bad_images", &bad, "skip (count and report) or fail on undecodable images"),
    };
    int n = (int)(sizeof defs / sizeof defs[0]), help = 0, n_inputs = 0;
    dt_error err = {0};
    char **inputs = calloc(argc > 0 ? (size_t)argc : 1, sizeof *inputs);
    if (!inputs) return fail("out of memory");
    if (flags_parse_args(defs, n, argc, argv, &help, inputs, &n_inputs, &err)) {
        fprintf(stderr, "dtrain predict: %s\n", err.msg);
        free(inputs);
        return 2;
    }
    if (help) {
        printf("usage: dtrain predict [--logdir DIR | --checkpoint FILE] [flags] IMAGES...\n\n"
               "Restores the newest good checkpoint of DIR (a damaged one is skipped with a warning) and\n"
               "writes one CSV line per image: file, predicted class, the probability of each class.\n"
               "IMAGES are folders (their images, then their sub-folders'), JPEG/PNG files, or one IDX\n"
               "images file; each is decoded and resized exactly as in training (docs/data.md).\n\n"
               "flags:\n");
        flags_print_help(stdout, defs, n);
        free(inputs);
        return 0;
    }
    int kaggle = !strcmp(format, "kaggle");
    if (!kaggle && strcmp(format, "csv")) {
        fprintf(stderr, "dtrain predict: --format: '%s' is not csv or kaggle\n", format);
        free(inputs);
        return 2;
    }
    if (strcmp(bad, "skip") && strcmp(bad, "fail")) {
        fprintf(stderr, "dtrain predict: --bad_images: '%s' is not skip or fail\n", bad);
        free(inputs);
        return 2;
    }
    dt_restored r;
    if (dt_restore_net(&r, logdir, file, model, batch_size, stderr, &err)) {
        free(inputs);
        return fail(err.msg);
    }
    dt_net_set_threads(r.net, threads);
    if (dt_net_set_device(r.net, device, &err)) {
        dt_restored_free(&r);
        free(inputs);
        return fail(err.msg);
    }
    const dt_model_spec *ms = dt_net_spec(r.net);
    int classes = dt_net_num_classes(r.net), status = 1, rc;
    dt_data_options dopt = {.h = ms->in_h, .w = ms->in_w, .c = ms->in_c,
                            .bad_images = strcmp(bad, "fail") ? DT_BAD_IMAGES_SKIP : DT_BAD_IMAGES_FAIL};
    dt_dataset *ds = NULL;
    dt_atomic_file af = {.fd = -1};
    sink s = {.kaggle = kaggle};
    int64_t count = 0;
    double t0 = dt_seconds();
    if ((rc = dt_data_open_inputs(&ds, inputs, (size_t)n_inputs, list, &dopt, &err))) goto done;
    s.ds = ds;
    s.idx_path = dt_dataset_source(ds);
    if (!(s.names = class_names(&r, classes, &err))) goto done;
    if (kaggle && (rc = find_dog(&r, s.names, classes, &s.dog, &err))) goto done;
    if (out && (rc = dt_atomic_open(&af, out, &err))) goto done;
    s.file = out ? &af : NULL;
    if (kaggle) rc = put(&s, &err, "id,label\n");
    else {
        rc = put(&s, &err, "file,class");
        for (int k = 0; !rc && k < classes; k++) {
            char col[DT_CKPT_MAX_CLASS_NAME + 8];
            snprintf(col, sizeof col, "p_%s", s.names[k]);
            rc = put(&s, &err, ",");
            if (!rc) rc = put_field(&s, col, &err);
        }
        if (!rc) rc = put(&s, &err, "\n");
    }
    if (rc || (rc = dt_predict(r.net, ds, emit, &s, &count, &err))) goto done;
    if (out && (rc = dt_atomic_commit(&af, &err))) goto done;
    double secs = dt_seconds() - t0;
    fprintf(stderr, "dtrain predict: %" PRId64 " images in %.2f s (%.1f images/s), %zu skipped as undecodable; "
                    "checkpoint %s, global step %" PRId64 "\n",
            count, secs, secs > 0 ? (double)count / secs : 0.0, dt_dataset_bad_count(ds), r.path, r.step);
    status = 0;
done:
    if (status) fprintf(stderr, "dtrain predict: %s\n", err.msg);
    dt_atomic_abort(&af);
    for (int k = 0; s.names && k < classes; k++) free(s.names[k]);
    free(s.names);
    free(s.buf);
    dt_dataset_free(ds);
    dt_restored_free(&r);
    free(inputs);
    return status;
}
