/* The images a user names for prediction: folders, image files, a list file of them, or one IDX
 * images file, turned into an unlabelled data set that decodes exactly as training does. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "data/dataset.h"
#include "data/listing.h"
#include "io/fsutil.h"

#define LIST_MAX_FILE ((size_t)64 << 20) /* bytes of a --list file */
#define INPUTS_MAX ((size_t)1 << 31)     /* as for any data set: the loader indexes with uint32 */

typedef struct {
    char **v;
    size_t n, cap;
} path_list;

static void path_list_free(path_list *P) {
    for (size_t i = 0; i < P->n; i++) free(P->v[i]);
    free(P->v);
    memset(P, 0, sizeof *P);
}

/* Takes ownership of p (freed on failure). */
static int path_list_add(path_list *P, char *p, dt_error *err) {
    if (!p) return JOIN_FAILED(err);
    if (P->n >= INPUTS_MAX) {
        free(p);
        return dt_errorf(err, DT_EINVAL, "more than %zu images named", INPUTS_MAX);
    }
    if (P->n == P->cap) {
        size_t cap = P->cap ? 2 * P->cap : 256;
        char **nv = realloc(P->v, cap * sizeof *nv);
        if (!nv) {
            free(p);
            return dt_errorf(err, DT_ENOMEM, "out of memory listing %zu images", P->n);
        }
        P->v = nv;
        P->cap = cap;
    }
    P->v[P->n++] = p;
    return 0;
}

/* The files of dir, joined to it, appended in name order. */
static int add_files_of(path_list *P, const char *dir, dt_error *err) {
    char **names = NULL;
    size_t n = 0;
    int rc = dt_data_list_dir(&names, &n, dir, 0, err);
    for (size_t i = 0; !rc && i < n; i++) rc = path_list_add(P, dt_path_join_dup(dir, names[i], err), err);
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return rc;
}

/* A folder: its own files, then each sub-folder's (one level, as an image folder's classes), so a
 * labelled test folder is read in the order dtrain eval reads it. */
static int add_folder(path_list *P, const char *dir, dt_error *err) {
    size_t before = P->n;
    int rc = add_files_of(P, dir, err);
    char **subs = NULL;
    size_t ns = 0;
    if (!rc) rc = dt_data_list_dir(&subs, &ns, dir, 1, err);
    for (size_t i = 0; !rc && i < ns; i++) {
        char *sub = dt_path_join_dup(dir, subs[i], err);
        rc = sub ? add_files_of(P, sub, err) : JOIN_FAILED(err);
        free(sub);
    }
    for (size_t i = 0; i < ns; i++) free(subs[i]);
    free(subs);
    if (!rc && P->n == before)
        rc = dt_errorf(err, DT_EINVAL, "%s: no files in this folder or its sub-folders", dir);
    return rc;
}

/* What the first bytes of a file say it is: 1 an IDX images file (or gzip, which no image is), 0
 * anything else (an image, or a bad image the decoder will name). An IDX labels file is refused. */
static int idx_images_kind(const char *path, int *is_idx, dt_error *err) {
    *is_idx = 0;
    /* Not a regular file (a FIFO would block here) or unreadable: a bad image, counted or fatal by
     * policy when decoded (the decoder's reader refuses it with one line). */
    int fd = dt_open_regular(path, 0, NULL, NULL);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        return 0;
    }
    unsigned char b[4] = {0};
    size_t got = fread(b, 1, 4, f);
    fclose(f);
    if (got >= 2 && b[0] == 0x1f && b[1] == 0x8b) *is_idx = 1;
    if (got == 4 && b[0] == 0 && b[1] == 0 && b[2] == 8) {
        if (b[3] == 3) *is_idx = 1;
        else return dt_errorf(err, DT_EINVAL, "%s: an IDX file of %d dimensions, not images (idx3)", path, b[3]);
    }
    return 0;
}

/* One input as named: a folder, or a file (image or IDX). *idx gets an IDX file's path. */
static int add_input(path_list *P, const char **idx, const char *in, dt_error *err) {
    struct stat st;
    if (stat(in, &st) != 0) return dt_errorf(err, DT_EIO, "%s: %s", in, strerror(errno));
    if (S_ISDIR(st.st_mode)) return add_folder(P, in, err);
    int is_idx = 0, rc = idx_images_kind(in, &is_idx, err);
    if (rc) return rc;
    if (is_idx) {
        if (*idx) return dt_errorf(err, DT_EINVAL, "%s: only one IDX file at a time (%s was named too)", in, *idx);
        *idx = in;
        return 0;
    }
    size_t n = strlen(in) + 1;
    char *p = dt_malloc(n, "a path", err);
    if (p) memcpy(p, in, n);
    return path_list_add(P, p, err);
}

/* Each non-empty line of list_file is an input (relative paths from the current folder). */
static int add_list_file(path_list *P, const char **idx, char **idx_owned, const char *list_file, dt_error *err) {
    /* Streamed line by line (bounded by LIST_MAX_FILE); a FIFO or device is refused, not waited on. */
    int fd = dt_open_regular(list_file, 0, NULL, err);
    if (fd < 0) return fd;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return dt_errorf(err, DT_EIO, "%s: cannot open: %s", list_file, strerror(errno));
    }
    char *line = NULL;
    size_t cap = 0, total = 0;
    ssize_t len;
    int rc = 0, lineno = 0;
    while (!rc && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        total += (size_t)len;
        if (total > LIST_MAX_FILE) {
            rc = dt_errorf(err, DT_EINVAL, "%s: longer than the limit of %zu bytes", list_file, LIST_MAX_FILE);
            break;
        }
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0) continue;
        if (strlen(line) != (size_t)len) {
            rc = dt_errorf(err, DT_EINVAL, "%s:%d: a NUL byte inside a path", list_file, lineno);
            break;
        }
        const char *was = *idx;
        rc = add_input(P, idx, line, err);
        if (!rc && *idx != was) { /* the line buffer is reused: keep the IDX path */
            if (!(*idx_owned = strdup(line))) rc = dt_errorf(err, DT_ENOMEM, "out of memory");
            *idx = *idx_owned;
        }
        if (rc) dt_error_wrap(err, rc, "%s:%d: ", list_file, lineno);
    }
    if (!rc && ferror(f)) rc = dt_errorf(err, DT_EIO, "%s: read error", list_file);
    free(line);
    fclose(f);
    return rc;
}

int dt_data_open_inputs(dt_dataset **out, char *const *inputs, size_t n, const char *list_file,
                        const dt_data_options *opt, dt_error *err) {
    *out = NULL;
    path_list P = {0};
    const char *idx = NULL;
    char *idx_owned = NULL;
    int rc = 0;
    for (size_t i = 0; !rc && i < n; i++) rc = add_input(&P, &idx, inputs[i], err);
    if (!rc && list_file) rc = add_list_file(&P, &idx, &idx_owned, list_file, err);
    if (!rc && idx && P.n)
        rc = dt_errorf(err, DT_EINVAL, "%s: an IDX file cannot be mixed with image files (%s)", idx, P.v[0]);
    if (!rc && !idx && P.n == 0) rc = dt_errorf(err, DT_EINVAL, "no images named (give folders, files or --list)");
    if (!rc) rc = idx ? dt_dataset_open_idx_images(out, idx, opt, err) : dt_dataset_from_paths(out, P.v, P.n, opt, err);
    path_list_free(&P);
    free(idx_owned);
    return rc;
}
