/* Data sets: the type, opening a folder of either kind (IDX files: dataset_idx.c; image folders:
 * dataset_folder.c), and reading one example (IDX pixels held in memory as uint8; images decoded
 * on demand, a file that fails counted once as bad). */
#include "data/dataset.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "data/dataset_impl.h"
#include "io/fsutil.h"

#define IMAGE_MAX_FILE ((size_t)256 << 20)  /* bytes read from one image file */

/* ---- small helpers --------------------------------------------------------------------------- */

char *dt_ds_str_dup(const char *s, dt_error *err) {
    size_t n = strlen(s) + 1;
    char *d = dt_malloc(n, "a string", err);
    if (d) memcpy(d, s, n);
    return d;
}

int dt_ds_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int dt_ds_is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

void dt_ds_free_strings(char **v, size_t n) {
    if (!v) return;
    for (size_t i = 0; i < n; i++) free(v[i]);
    free(v);
}

char **dt_ds_numeric_names(int k, dt_error *err) {
    char **names = dt_calloc((size_t)k, sizeof(char *), "class names", err);
    for (int i = 0; names && i < k; i++) {
        char num[16];
        snprintf(num, sizeof num, "%d", i);
        if (!(names[i] = dt_ds_str_dup(num, err))) {
            dt_ds_free_strings(names, (size_t)k);
            names = NULL;
        }
    }
    return names;
}

dt_dataset *dt_ds_new(int kind, dt_error *err) {
    dt_dataset *ds = dt_calloc(1, sizeof *ds, "data set", err);
    if (!ds) return NULL;
    ds->kind = kind;
    atomic_init(&ds->bad_count, 0);
    return ds;
}

void dt_dataset_free(dt_dataset *ds) {
    if (!ds) return;
    dt_ds_free_strings(ds->class_names, (size_t)ds->num_classes);
    free(ds->source);
    free(ds->pix_block);
    free(ds->lab_block);
    dt_ds_free_strings(ds->paths, ds->n);
    free(ds->labels);
    free(ds->bad);
    free(ds);
}

void dt_data_splits_free(dt_data_splits *s) {
    if (!s) return;
    if (s->test != s->validation) dt_dataset_free(s->test);
    dt_dataset_free(s->validation);
    dt_dataset_free(s->train);
    s->train = s->validation = s->test = NULL;
}
int dt_data_open(dt_data_splits *out, const char *path, const dt_data_options *opt, dt_error *err) {
    memset(out, 0, sizeof *out);
    dt_data_options defaults = {.validation_fraction = -1};
    if (!opt) opt = &defaults;
    struct stat st;
    if (!path || !*path) return dt_errorf(err, DT_EINVAL, "no data path given");
    if (stat(path, &st) != 0) return dt_errorf(err, DT_EIO, "%s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return dt_errorf(err, DT_EINVAL, "%s: not a folder (expected IDX files or an image folder)", path);
    if (dt_ds_idx_folder_has_any(path)) return dt_ds_open_idx_folder(out, path, opt, err);
    return dt_ds_open_image_folder(out, path, opt, err);
}

/* ---- access ---------------------------------------------------------------------------------- */

size_t dt_dataset_size(const dt_dataset *ds) { return ds->n; }
int dt_dataset_num_classes(const dt_dataset *ds) { return ds->num_classes; }
dt_bad_image_policy dt_dataset_bad_images(const dt_dataset *ds) { return ds->bad_images; }

const char *dt_dataset_class_name(const dt_dataset *ds, int k) {
    return k >= 0 && k < ds->num_classes ? ds->class_names[k] : NULL;
}

char *const *dt_dataset_class_names(const dt_dataset *ds) {
    return ds->kind == DS_FOLDER && ds->num_classes > 0 ? ds->class_names : NULL;
}

const char *dt_dataset_source(const dt_dataset *ds) { return ds->source; }

const char *dt_dataset_path(const dt_dataset *ds, size_t i) {
    return ds->kind == DS_FOLDER && i < ds->n ? ds->paths[i] : NULL;
}

void dt_dataset_dims(const dt_dataset *ds, int *h, int *w, int *c) {
    if (h) *h = ds->h;
    if (w) *w = ds->w;
    if (c) *c = ds->c;
}

size_t dt_dataset_bad_count(const dt_dataset *ds) {
    return atomic_load(&((dt_dataset *)ds)->bad_count);
}

static void mark_bad(const dt_dataset *ds, size_t i) {
    dt_dataset *m = (dt_dataset *)ds; /* the flags and the count are the mutable part */
    if (atomic_exchange(&m->bad[i], 1) == 0) atomic_fetch_add(&m->bad_count, 1);
}

int dt_dataset_get(const dt_dataset *ds, size_t i, float *x, int32_t *label, dt_error *err) {
    // x [h, w, c]
    if (i >= ds->n)
        return dt_errorf(err, DT_EINVAL, "example %zu out of range (data set has %zu)", i, ds->n);
    if (ds->kind == DS_IDX) {
        size_t d = (size_t)ds->h * (size_t)ds->w;
        const uint8_t *p = ds->pixels + i * d;
        for (size_t j = 0; j < d; j++) x[j] = (float)p[j] / 255.0f;
        *label = ds->labels8 ? ds->labels8[i] : -1;
        return 0;
    }
    if (ds->kind == DS_MEMORY) {
        size_t d = (size_t)ds->h * (size_t)ds->w * (size_t)ds->c;
        if (ds->mem_u8) { /* scaled as IDX pixels are, so the same bytes train the same */
            const uint8_t *p = (const uint8_t *)ds->mem_x + i * d;
            for (size_t j = 0; j < d; j++) x[j] = (float)p[j] / 255.0f;
        } else {
            memcpy(x, (const float *)ds->mem_x + i * d, d * sizeof(float));
        }
        *label = ds->mem_labels ? ds->mem_labels[i] : -1;
        return 0;
    }
    const char *path = ds->paths[i];
    if (atomic_load(&ds->bad[i]))
        return dt_errorf(err, DT_EFORMAT, "%s: not a decodable image (failed before)", path);
    uint8_t *bytes = NULL, *pix = NULL;
    size_t len = 0;
    int ih = 0, iw = 0;
    int rc = dt_read_file(&bytes, &len, path, IMAGE_MAX_FILE, err);
    if (!rc) rc = dt_image_decode(&pix, &ih, &iw, bytes, len, ds->c, ds->h, ds->w, 0, path, err);
    free(bytes);
    if (!rc) rc = dt_resize_bilinear(x, ds->h, ds->w, pix, ih, iw, ds->c, 255.0f, err);
    free(pix);
    if (rc == DT_EFORMAT || rc == DT_EIO) mark_bad(ds, i);
    if (rc) return rc;
    *label = ds->labels[i];
    return 0;
}
