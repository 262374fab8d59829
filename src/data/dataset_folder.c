/* Image-folder data sets: class sub-folders of JPEG/PNG files (or train/ and test/ of them, or
 * one flat folder of <class>.<id>.<ext> files), listed in a fixed order and split by a seeded
 * shuffle; the images themselves are decoded on demand by dataset.c. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/rng.h"
#include "data/dataset_impl.h"
#include "data/listing.h"
#include "io/fsutil.h"

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted names of the non-hidden entries of dir that are folders (want_dirs) or regular files;
 * entries that cannot be looked at (stat fails) count as files. */
int dt_data_list_dir(char ***names, size_t *count, const char *dir, int want_dirs, dt_error *err) {
    *names = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return dt_errorf(err, DT_EIO, "%s: cannot open folder: %s", dir, strerror(errno));
    char **v = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    while (!rc && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        int isdir, isfile;
        if (e->d_type == DT_DIR || e->d_type == DT_REG) {
            isdir = e->d_type == DT_DIR;
            isfile = !isdir;
        } else { /* links and file systems without d_type */
            char *p = dt_path_join_dup(dir, e->d_name, err);
            if (!p) {
                rc = JOIN_FAILED(err);
                break;
            }
            struct stat st;
            if (stat(p, &st) == 0) {
                isdir = S_ISDIR(st.st_mode);
                isfile = S_ISREG(st.st_mode);
            } else {
                /* A link that loops or dangles, or an entry we may not look at: listed as a file,
                 * so that reading it makes it a bad image, counted or fatal by name, instead of
                 * leaving it out without a word. */
                isdir = 0;
                isfile = 1;
            }
            free(p);
        }
        if (want_dirs ? !isdir : !isfile) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **nv = realloc(v, cap * sizeof *v);
            if (!nv) {
                rc = dt_errorf(err, DT_ENOMEM, "%s: out of memory listing the folder", dir);
                break;
            }
            v = nv;
        }
        if (!(v[n] = dt_ds_str_dup(e->d_name, err))) rc = DT_ENOMEM;
        else n++;
    }
    closedir(d);
    if (rc) {
        dt_ds_free_strings(v, n);
        return rc;
    }
    if (n) qsort(v, n, sizeof *v, cmp_str);
    *names = v;
    *count = n;
    return 0;
}

/* Labelled files of one root folder. */
typedef struct {
    char **paths;
    int32_t *labels;
    size_t n, cap;
    size_t off_pattern; /* flat-layout files without the <class>.<id>.<ext> form, skipped */
} listing;

static void listing_free(listing *L) {
    dt_ds_free_strings(L->paths, L->n);
    free(L->labels);
    memset(L, 0, sizeof *L);
}

static int listing_add(listing *L, const char *dir, const char *name, int32_t label, dt_error *err) {
    if (L->n == L->cap) {
        size_t cap = L->cap ? 2 * L->cap : 256;
        char **np = realloc(L->paths, cap * sizeof *np);
        if (!np) return dt_errorf(err, DT_ENOMEM, "%s: out of memory listing images", dir);
        L->paths = np;
        int32_t *nl = realloc(L->labels, cap * sizeof *nl);
        if (!nl) return dt_errorf(err, DT_ENOMEM, "%s: out of memory listing images", dir);
        L->labels = nl;
        L->cap = cap;
    }
    char *p = dt_path_join_dup(dir, name, err);
    if (!p) return JOIN_FAILED(err);
    L->paths[L->n] = p;
    L->labels[L->n] = label;
    L->n++;
    return 0;
}

static int find_class(char **classes, int k, const char *name) {
    char *const *hit = bsearch(&name, classes, (size_t)k, sizeof *classes, cmp_str);
    return hit ? (int)(hit - classes) : -1;
}

/* Class of a flat-layout name "cat.123.jpg": the text before the first '.', which must be followed
 * by more text with another '.'. Returns the prefix length, or 0 when the name does not fit. */
static size_t flat_prefix(const char *name) {
    const char *dot = strchr(name, '.');
    if (!dot || dot == name || !strchr(dot + 1, '.')) return 0;
    return (size_t)(dot - name);
}

/* One sub-folder per class: its files, labelled (discover: the sorted sub-folder names become the
 * classes, and *subdirs moves into *classes). */
static int list_subdirs(listing *L, char ***classes, int *nclasses, const char *root, char ***subdirs, size_t nsub,
                        int discover, dt_error *err) {
    if (discover) {
        *classes = *subdirs;
        *nclasses = (int)(nsub > INT32_MAX ? INT32_MAX : nsub);
        *subdirs = NULL;
    }
    char **names = discover ? *classes : *subdirs, **files = NULL;
    size_t nfiles = 0;
    int rc = DT_OK;
    for (size_t s = 0; !rc && s < nsub; s++) {
        int label = discover ? (int)s : find_class(*classes, *nclasses, names[s]);
        if (label < 0)
            return dt_errorf(err, DT_EFORMAT, "%s/%s: class folder not among the training classes", root, names[s]);
        char *dir = dt_path_join_dup(root, names[s], err);
        if (!dir) rc = JOIN_FAILED(err);
        if (!rc) rc = dt_data_list_dir(&files, &nfiles, dir, 0, err);
        for (size_t f = 0; !rc && f < nfiles; f++) rc = listing_add(L, dir, files[f], label, err);
        dt_ds_free_strings(files, nfiles);
        files = NULL;
        free(dir);
    }
    return rc;
}

/* A flat folder's classes: the distinct texts before the first '.' of its files, sorted. */
static int flat_classes(char ***classes, int *nclasses, const char *root, char **files, size_t nfiles,
                        dt_error *err) {
    char **pre = dt_calloc(nfiles ? nfiles : 1, sizeof *pre, "class names", err);
    if (!pre) return DT_ENOMEM;
    size_t np = 0;
    int rc = DT_OK;
    for (size_t f = 0; !rc && f < nfiles; f++) {
        size_t k = flat_prefix(files[f]);
        if (!k) continue;
        if (!(pre[np] = dt_malloc(k + 1, "a class name", err))) {
            rc = DT_ENOMEM;
            break;
        }
        memcpy(pre[np], files[f], k);
        pre[np++][k] = 0;
    }
    if (!rc && np) { /* sort, then keep the distinct names */
        qsort(pre, np, sizeof *pre, cmp_str);
        size_t u = 0;
        for (size_t i = 0; i < np; i++) {
            if (u && strcmp(pre[u - 1], pre[i]) == 0) free(pre[i]);
            else pre[u++] = pre[i];
        }
        np = u;
    }
    if (rc || np > INT32_MAX) {
        dt_ds_free_strings(pre, np);
        return rc ? rc : dt_errorf(err, DT_EFORMAT, "%s: too many classes", root);
    }
    *classes = pre;
    *nclasses = (int)np;
    return DT_OK;
}

/* A flat folder's files, labelled by the class their name starts with. */
static int list_flat(listing *L, char **classes, int nclasses, const char *root, char **files, size_t nfiles,
                     const dt_data_options *opt, dt_error *err) {
    int rc = DT_OK;
    for (size_t f = 0; !rc && f < nfiles; f++) {
        size_t k = flat_prefix(files[f]);
        if (!k) {
            if (opt->bad_images == DT_BAD_IMAGES_FAIL)
                rc = dt_errorf(err, DT_EFORMAT,
                               "%s/%s: not named <class>.<id>.<ext> as files in a flat image folder must be",
                               root, files[f]);
            L->off_pattern++;
            continue;
        }
        char cls[256];
        snprintf(cls, sizeof cls, "%.*s", (int)(k < 255 ? k : 255), files[f]);
        int label = find_class(classes, nclasses, cls);
        if (label < 0)
            rc = dt_errorf(err, DT_EFORMAT, "%s/%s: class '%s' not among the training classes", root, files[f],
                           cls);
        else
            rc = listing_add(L, root, files[f], label, err);
    }
    return rc;
}

/* Lists root. With *classes NULL the classes are discovered (sorted sub-folder names, or sorted
 * flat-name prefixes) and returned; otherwise names are mapped onto the given classes and an
 * unknown one is an error (a test/ folder must use train/'s classes). */
static int list_root(listing *L, char ***classes, int *nclasses, const char *root,
                     const dt_data_options *opt, dt_error *err) {
    memset(L, 0, sizeof *L);
    int discover = *classes == NULL;
    char **subdirs = NULL, **files = NULL;
    size_t nsub = 0, nfiles = 0;
    int rc = dt_data_list_dir(&subdirs, &nsub, root, 1, err);
    if (!rc && nsub > 0) { /* one sub-folder per class */
        rc = list_subdirs(L, classes, nclasses, root, &subdirs, nsub, discover, err);
    } else if (!rc) { /* flat: class = text before the first '.' */
        rc = dt_data_list_dir(&files, &nfiles, root, 0, err);
        if (!rc && discover) rc = flat_classes(classes, nclasses, root, files, nfiles, err);
        if (!rc) rc = list_flat(L, *classes, *nclasses, root, files, nfiles, opt, err);
    }
    dt_ds_free_strings(subdirs, nsub);
    dt_ds_free_strings(files, nfiles);
    if (!rc && L->n == 0)
        rc = dt_errorf(err, DT_EFORMAT, "%s: no image files found (expected one sub-folder per class, "
                                        "or files named <class>.<id>.jpg)", root);
    if (!rc && L->n > DT_DS_MAX_COUNT) rc = dt_errorf(err, DT_EFORMAT, "%s: too many files", root);
    if (rc) listing_free(L);
    return rc;
}

/* A folder data set over the listed entries idx[0..n) (moved out of L). */
static int folder_make(dt_dataset **out, listing *L, const uint32_t *idx, size_t n, char **classes,
                       int nclasses, const dt_data_options *opt, size_t off_pattern, dt_error *err) {
    dt_dataset *ds = dt_ds_new(DS_FOLDER, err);
    if (!ds) return DT_ENOMEM;
    ds->h = opt->h, ds->w = opt->w, ds->c = opt->c;
    ds->bad_images = opt->bad_images;
    ds->class_names = dt_calloc((size_t)nclasses, sizeof(char *), "class names", err);
    ds->paths = dt_calloc(n, sizeof(char *), "image paths", err);
    ds->labels = dt_calloc(n, sizeof(int32_t), "labels", err);
    ds->bad = dt_calloc(n, sizeof(atomic_uchar), "bad-image flags", err);
    if (!ds->class_names || !ds->paths || !ds->labels || !ds->bad) {
        dt_dataset_free(ds);
        return DT_ENOMEM;
    }
    ds->num_classes = nclasses;
    for (int k = 0; k < nclasses; k++)
        if (!(ds->class_names[k] = dt_ds_str_dup(classes[k], err))) {
            dt_dataset_free(ds);
            return DT_ENOMEM;
        }
    for (size_t i = 0; i < n; i++) {
        ds->paths[i] = L->paths[idx[i]];
        L->paths[idx[i]] = NULL;
        ds->labels[i] = L->labels[idx[i]];
        atomic_init(&ds->bad[i], 0);
    }
    ds->n = n;
    atomic_store(&ds->bad_count, off_pattern);
    *out = ds;
    return 0;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Images are decoded to the model's input: its size must be one they can be resized to. */
static int check_image_input(const char *path, const dt_data_options *opt, dt_error *err) {
    if (opt->h <= 0 || opt->w <= 0 || opt->h > 16384 || opt->w > 16384 || (opt->c != 1 && opt->c != 3))
        return dt_errorf(err, DT_EINVAL, "%s: images need the model's input size (got %dx%dx%d; "
                                         "channels 1 or 3)", path, opt->h, opt->w, opt->c);
    return 0;
}

int dt_dataset_from_paths(dt_dataset **out, char *const *paths, size_t n, const dt_data_options *opt,
                          dt_error *err) {
    *out = NULL;
    int rc = check_image_input(n ? paths[0] : "images", opt, err);
    if (rc) return rc;
    if (n == 0) return dt_errorf(err, DT_EINVAL, "no image files given");
    if (n > DT_DS_MAX_COUNT) return dt_errorf(err, DT_EINVAL, "%zu image files, over the limit of %llu", n,
                                            (unsigned long long)DT_DS_MAX_COUNT);
    listing L = {0};
    uint32_t *idx = dt_malloc(n * sizeof *idx, "image indices", err);
    if (!idx) return DT_ENOMEM;
    for (size_t i = 0; !rc && i < n; i++) {
        idx[i] = (uint32_t)i;
        rc = listing_add(&L, "", paths[i], -1, err); /* no label: -1 */
    }
    if (!rc) rc = folder_make(out, &L, idx, n, NULL, 0, opt, 0, err);
    free(idx);
    listing_free(&L);
    return rc;
}

int dt_ds_open_image_folder(dt_data_splits *out, const char *path, const dt_data_options *opt,
                             dt_error *err) {
    int rc0 = check_image_input(path, opt, err);
    if (rc0) return rc0;
    double frac = opt->validation_fraction < 0 ? 0.2 : opt->validation_fraction;
    if (!(frac < 1.0))
        return dt_errorf(err, DT_EINVAL, "validation fraction %g must be below 1", frac);
    char *train_dir = dt_path_join_dup(path, "train", err), *test_dir = dt_path_join_dup(path, "test", err);
    if (!train_dir || !test_dir) {
        free(train_dir);
        free(test_dir);
        return JOIN_FAILED(err);
    }
    int split_layout = dt_ds_is_dir(train_dir);
    const char *root = split_layout ? train_dir : path;
    int has_test = split_layout && dt_ds_is_dir(test_dir);

    char **classes = NULL;
    int nclasses = 0;
    listing L, T = {0};
    uint32_t *idx = NULL;
    dt_dataset *train = NULL, *val = NULL, *test = NULL;
    int rc = list_root(&L, &classes, &nclasses, root, opt, err);
    if (!rc) {
        size_t n = L.n;
        size_t nval = (size_t)floor((double)n * frac + 0.5);
        if (nval >= n)
            rc = dt_errorf(err, DT_EINVAL, "%s: %zu images leave none for training with validation fraction %g",
                           root, n, frac);
        if (!rc && !(idx = dt_malloc(n * sizeof *idx, "split indices", err))) rc = DT_ENOMEM;
        if (!rc) {
            for (size_t i = 0; i < n; i++) idx[i] = (uint32_t)i;
            dt_shuffle_u32(idx, (uint32_t)n, opt->seed);
            /* Each split keeps file order; the loader shuffles the training split per epoch. */
            qsort(idx, nval, sizeof *idx, cmp_u32);
            qsort(idx + nval, n - nval, sizeof *idx, cmp_u32);
            rc = folder_make(&val, &L, idx, nval, classes, nclasses, opt, 0, err);
            if (!rc)
                rc = folder_make(&train, &L, idx + nval, n - nval, classes, nclasses, opt, L.off_pattern, err);
        }
    }
    if (!rc && has_test) {
        rc = list_root(&T, &classes, &nclasses, test_dir, opt, err);
        uint32_t *tidx = rc ? NULL : realloc(idx, T.n * sizeof *idx);
        if (!rc && !tidx) rc = dt_errorf(err, DT_ENOMEM, "out of memory listing %s", test_dir);
        if (tidx) idx = tidx;
        if (!rc) {
            for (size_t i = 0; i < T.n; i++) idx[i] = (uint32_t)i;
            rc = folder_make(&test, &T, idx, T.n, classes, nclasses, opt, T.off_pattern, err);
        }
    }
    free(idx);
    listing_free(&L);
    listing_free(&T);
    dt_ds_free_strings(classes, (size_t)nclasses);
    free(train_dir);
    free(test_dir);
    if (rc) {
        dt_dataset_free(train);
        dt_dataset_free(val);
        dt_dataset_free(test);
        return rc;
    }
    out->train = train;
    out->validation = val;
    out->test = has_test ? test : val;
    return 0;
}
