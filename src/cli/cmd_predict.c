/* dtrain predict: apply a trained model to new images. Restores the newest good checkpoint (or
 * --checkpoint FILE), reads images from folders, files, a --list file or one IDX file, decodes them
 * exactly as training does, and writes one CSV line per image: the file, the predicted class and
 * the softmax probability of every class; or, with --format kaggle, the cats-vs-dogs submission
 * (id,label = the probability of dog). Output goes to stdout, or to --out FILE, which appears only
 * complete (written aside and renamed at the end). --logits FILE also writes each image's logits
 * exactly (9 significant digits: a float32 reads back bit for bit), for comparisons such as the
 * ONNX export's tests. */
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "commands.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/text.h"
#include "data/dataset.h"
#include "core/flags.h"
#include "io/fsutil.h"
#include "model/net.h"
#include "train/evaluate_ctr.h"
#include "train/predict.h"
#include "train/restore.h"

/* One CSV being written, a batch's text at a time. */
typedef struct {
    dt_atomic_file *file;      /* --out (or stdout when NULL), --logits */
    char *buf;                 /* one batch's text */
    size_t len, cap;
} text_out;

typedef struct {
    const dt_dataset *ds;
    const char *idx_path;      /* IDX input: rows are named "<path>[<index>]" */
    char **names;              /* [classes] class names (the checkpoint's, else the numbers) */
    int kaggle, dog;           /* --format kaggle: the class whose probability is written */
    text_out csv;              /* the predictions */
    text_out logits;           /* --logits: used when its file is set */
} sink;

static int put(text_out *s, dt_error *err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int put(text_out *s, dt_error *err, const char *fmt, ...) {
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

/* A CSV field (dt_csv_field: quoted where RFC 4180 needs it). */
static int put_field(text_out *s, const char *v, dt_error *err) {
    if (!v[strcspn(v, ",\"\r\n")]) return put(s, err, "%s", v); /* most fields: no copy */
    char *q = dt_csv_field(v);
    int rc = q ? put(s, err, "%s", q) : dt_errorf(err, DT_ENOMEM, "out of memory for the output");
    free(q);
    return rc;
}

static int flush_out(text_out *s, dt_error *err) {
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

/* One image's predicted class and probabilities (or Kaggle's id and p_dog) into the CSV. */
static int put_prediction(sink *s, const char *row, const char *path, size_t id, int predicted, const float *p,
                          int classes, dt_error *err) {
    text_out *o = &s->csv;
    if (s->kaggle) {
        char kid[DT_PATH_MAX];
        if (path) kaggle_id(kid, sizeof kid, path);
        else snprintf(kid, sizeof kid, "%zu", id);
        int rc = put_field(o, kid, err);
        return rc ? rc : put(o, err, ",%.6g\n", (double)p[s->dog]);
    }
    int rc = put_field(o, row, err);
    if (!rc) rc = put(o, err, ",");
    if (!rc) rc = put_field(o, s->names[predicted], err);
    for (int k = 0; !rc && k < classes; k++) rc = put(o, err, ",%.6g", (double)p[k]);
    return rc ? rc : put(o, err, "\n");
}

/* --logits: the row's name, then each logit with 9 significant digits (float32 round-trips). */
static int put_logits(text_out *o, const char *row, const float *l, int classes, dt_error *err) {
    int rc = put_field(o, row, err);
    for (int k = 0; !rc && k < classes; k++) rc = put(o, err, ",%.9g", (double)l[k]);
    return rc ? rc : put(o, err, "\n");
}

static int emit(void *user, const dt_predict_batch *b, dt_error *err) {
    sink *s = user;
    int rc = 0;
    for (int i = 0; !rc && i < b->n; i++) {
        char name[DT_PATH_MAX + 32];
        const char *path = dt_dataset_path(s->ds, b->ids[i]);
        if (!path) snprintf(name, sizeof name, "%s[%zu]", s->idx_path, b->ids[i]);
        const char *row = path ? path : name;
        size_t at = (size_t)i * (size_t)b->classes;
        rc = put_prediction(s, row, path, b->ids[i], b->predicted[i], b->probs + at, b->classes, err);
        if (!rc && s->logits.file) rc = put_logits(&s->logits, row, b->logits + at, b->classes, err);
    }
    if (!rc) rc = flush_out(&s->csv, err);
    return rc || !s->logits.file ? rc : flush_out(&s->logits, err);
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

/* The header lines: "file,class,p_<class>..." (or Kaggle's "id,label"), and "file,logit_<class>..."
 * for --logits. */
static int put_headers(sink *s, int classes, dt_error *err) {
    int rc = put(&s->csv, err, s->kaggle ? "id,label" : "file,class");
    if (!rc && s->logits.file) rc = put(&s->logits, err, "file");
    for (int k = 0; !rc && k < classes; k++) {
        char col[DT_CKPT_MAX_CLASS_NAME + 8];
        snprintf(col, sizeof col, "p_%s", s->names[k]);
        if (!s->kaggle) rc = put(&s->csv, err, ",");
        if (!rc && !s->kaggle) rc = put_field(&s->csv, col, err);
        snprintf(col, sizeof col, "logit_%s", s->names[k]);
        if (!rc && s->logits.file) rc = put(&s->logits, err, ",");
        if (!rc && s->logits.file) rc = put_field(&s->logits, col, err);
    }
    if (!rc) rc = put(&s->csv, err, "\n");
    return rc || !s->logits.file ? rc : put(&s->logits, err, "\n");
}

/* Every image's CSV row (and --logits row): to files written aside and renamed once complete, or the
 * CSV to stdout. */
static int write_outputs(sink *s, dt_net *net, const dt_dataset *ds, const char *out, const char *logits,
                         int classes, int64_t *count, dt_error *err) {
    dt_atomic_file af = {.fd = -1}, lf = {.fd = -1};
    int rc = out ? dt_atomic_open(&af, out, err) : 0;
    if (!rc && logits) rc = dt_atomic_open(&lf, logits, err);
    s->csv.file = out ? &af : NULL;
    s->logits.file = logits ? &lf : NULL;
    if (!rc) rc = put_headers(s, classes, err);
    if (!rc) rc = dt_predict(net, ds, emit, s, count, err);
    if (!rc && out) rc = dt_atomic_commit(&af, err);
    if (!rc && logits) rc = dt_atomic_commit(&lf, err);
    dt_atomic_abort(&af);
    dt_atomic_abort(&lf);
    s->csv.file = s->logits.file = NULL;
    return rc;
}

/* --format and --bad_images take one of two words: 1 (and the line) for anything else. */
static int bad_choice(const char *format, const char *bad) {
    if (strcmp(format, "kaggle") && strcmp(format, "csv"))
        return fprintf(stderr, "dtrain predict: --format: '%s' is not csv or kaggle\n", format), 1;
    if (strcmp(bad, "skip") && strcmp(bad, "fail"))
        return fprintf(stderr, "dtrain predict: --bad_images: '%s' is not skip or fail\n", bad), 1;
    return 0;
}

static int fail(const char *msg) {
    fprintf(stderr, "dtrain predict: %s\n", msg);
    return 1;
}

/* A click-log model: every line of each click log (its split ignored: these are new lines), as
 * "line,label,probability,file" (the label as the file gives it; the file as given, so rows of
 * several files say which they are from), one header for all, to --out (written aside, renamed at
 * the end) or standard output. */
static int predict_ctr(dt_restored *r, char **inputs, int n_inputs, const char *out, const char *bad, dt_error *err) {
    char tmp[4096];
    if (n_inputs < 1) return dt_errorf(err, DT_EINVAL, "no click log given (dtrain predict [flags] CLICKS.tsv[.gz])");
    if (out && snprintf(tmp, sizeof tmp, "%s.tmp", out) >= (int)sizeof tmp)
        return dt_errorf(err, DT_EINVAL, "--out: path too long");
    FILE *f = out ? fopen(tmp, "w") : stdout;
    if (!f) return dt_errorf(err, DT_EIO, "--out: cannot create %s", tmp);
    dt_ctr_options co;
    dt_ctr_eval_options(&co, r->net, DT_CTR_ALL, !strcmp(bad, "fail"));
    int rc = fputs(DT_PREDICT_CTR_HEADER, f) < 0 ? dt_errorf(err, DT_EIO, "cannot write the predictions") : DT_OK;
    int64_t total = 0;
    double t0 = dt_seconds();
    for (int i = 0; !rc && i < n_inputs; i++) {
        int64_t count = 0;
        dt_ctr_eval_result res;
        if ((rc = dt_predict_ctr(r->net, inputs[i], &co, f, &count, &res, err))) break;
        total += count;
        if (res.bad_lines) fprintf(stderr, "dtrain predict: %s: skipped %llu bad lines\n", inputs[i],
                                   (unsigned long long)res.bad_lines);
    }
    if (out) {
        int bad_close = fclose(f) != 0;
        if (!rc && bad_close) rc = dt_errorf(err, DT_EIO, "--out: cannot write %s", tmp);
        if (!rc && rename(tmp, out)) rc = dt_errorf(err, DT_EIO, "--out: cannot rename %s to %s", tmp, out);
        if (rc) remove(tmp);
    }
    if (!rc) fprintf(stderr, "dtrain predict: %" PRId64 " lines in %.2f s; checkpoint %s, global step %" PRId64 "\n",
                     total, dt_seconds() - t0, r->path, r->step);
    return rc;
}

static void print_help(const flag_def *defs, int n) {
    printf("usage: dtrain predict [--logdir DIR | --checkpoint FILE] [flags] IMAGES...\n\n"
           "Restores the newest good checkpoint of DIR (a damaged one is skipped with a warning) and\n"
           "writes one CSV line per image: file, predicted class, the probability of each class.\n"
           "IMAGES are folders (their images, then their sub-folders'), JPEG/PNG files, or one IDX\n"
           "images file; each is decoded and resized exactly as in training (docs/data.md).\n"
           "A click-log model (docs/ctr-data.md) reads click logs instead (Criteo TSV or libffm, plain\n"
           "or gzip) and writes line,label,probability,file for every line of each, under one header:\n"
           "line is the line's number in its file (from 1), file the click log as given: dtrain predict\n"
           "--logdir DIR day1.tsv day2.tsv.gz.\n\n"
           "flags:\n");
    flags_print_help(stdout, defs, n);
}

int cmd_predict(int argc, char **argv) {
    const char *logdir = "./checkpoint", *file = NULL, *model = NULL, *out = NULL, *format = "csv", *list = NULL,
               *bad = "skip", *device = NULL, *logits = NULL;
    int batch_size = 0, threads = 0;
    flag_def defs[] = {
        FLAGS_RESTORE(&logdir, &file, &model, &batch_size, &threads, &device),
        FLAG_TEXT("out", &out, "write the CSV to this file (default: standard output)"),
        FLAG_TEXT("format", &format, "csv (file,class,p_<class>...) or kaggle (id,label: the probability of dog)"),
        FLAG_TEXT("list", &list, "a text file naming more images (or folders), one per line"),
        FLAG_TEXT("bad_images", &bad, "skip (count and report) or fail on undecodable images"),
        FLAG_TEXT("logits", &logits, "also write each image's logits to this CSV (file,logit_<class>...), exactly"),
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
        print_help(defs, n);
        free(inputs);
        return 0;
    }
    int kaggle = !strcmp(format, "kaggle");
    if (bad_choice(format, bad)) {
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
    if (dt_net_is_ctr(r.net)) {
        int rc = predict_ctr(&r, inputs, n_inputs, out, bad, &err);
        if (rc) fprintf(stderr, "dtrain predict: %s\n", err.msg);
        dt_restored_free(&r);
        free(inputs);
        return rc ? 1 : 0;
    }
    const dt_model_spec *ms = dt_net_spec(r.net);
    int classes = dt_net_num_classes(r.net), status = 1, rc;
    dt_data_options dopt = {.h = ms->in_h, .w = ms->in_w, .c = ms->in_c,
                            .bad_images = strcmp(bad, "fail") ? DT_BAD_IMAGES_SKIP : DT_BAD_IMAGES_FAIL};
    dt_dataset *ds = NULL;
    sink s = {.kaggle = kaggle};
    int64_t count = 0;
    double t0 = dt_seconds();
    if ((rc = dt_data_open_inputs(&ds, inputs, (size_t)n_inputs, list, &dopt, &err))) goto done;
    s.ds = ds;
    s.idx_path = dt_dataset_source(ds);
    if (!(s.names = class_names(&r, classes, &err))) goto done;
    if (kaggle && (rc = find_dog(&r, s.names, classes, &s.dog, &err))) goto done;
    if ((rc = write_outputs(&s, r.net, ds, out, logits, classes, &count, &err))) goto done;
    double secs = dt_seconds() - t0;
    fprintf(stderr, "dtrain predict: %" PRId64 " images in %.2f s (%.1f images/s), %zu skipped as undecodable; "
                    "checkpoint %s, global step %" PRId64 "\n",
            count, secs, secs > 0 ? (double)count / secs : 0.0, dt_dataset_bad_count(ds), r.path, r.step);
    status = 0;
done:
    if (status) fprintf(stderr, "dtrain predict: %s\n", err.msg);
    for (int k = 0; s.names && k < classes; k++) free(s.names[k]);
    free(s.names);
    free(s.csv.buf);
    free(s.logits.buf);
    dt_dataset_free(ds);
    dt_restored_free(&r);
    free(inputs);
    return status;
}
