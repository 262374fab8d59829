/* The inside of a data set, shared by its three files: dataset.c (the type, opening a folder of
 * either kind, reading an example), dataset_idx.c (IDX files), dataset_folder.c (image folders) and
 * dataset_memory.c (a caller's arrays).
 * Not for use outside src/data/. */
#ifndef DT_DATA_DATASET_IMPL_H
#define DT_DATA_DATASET_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "data/dataset.h"

enum { DS_IDX = 1, DS_FOLDER = 2, DS_MEMORY = 3 };

#define DT_DS_MAX_COUNT ((uint64_t)1 << 31)   /* examples: the loader permutes uint32 indices */

struct dt_dataset {
    int kind;
    size_t n;
    int h, w, c;                 /* delivered example shape */
    int num_classes;
    char **class_names;          /* [num_classes], owned */
    char *source;                /* IDX: the images file's name, owned */
    dt_bad_image_policy bad_images;
    /* IDX */
    uint8_t *pix_block, *lab_block; /* owned storage the two pointers below point into */
    const uint8_t *pixels;       /* [n, h*w] */
    const uint8_t *labels8;      /* [n] */
    /* memory (dataset_memory.c): the caller's arrays, not owned */
    const void *mem_x;           /* [n, h, w, c] float32, or uint8 when mem_u8 */
    int mem_u8;
    const int32_t *mem_labels;   /* [n]; NULL: unlabelled */
    /* image folder */
    char **paths;                /* [n], owned */
    int32_t *labels;             /* [n] */
    atomic_uchar *bad;           /* [n] 1 once example i failed to decode */
    atomic_size_t bad_count;
};

dt_dataset *dt_ds_new(int kind, dt_error *err);
char *dt_ds_str_dup(const char *s, dt_error *err);
int dt_ds_is_dir(const char *path);
int dt_ds_is_file(const char *path);
void dt_ds_free_strings(char **v, size_t n);
/* Class names "0".."k-1" (NULL when out of memory). */
char **dt_ds_numeric_names(int k, dt_error *err);

/* dataset_idx.c: whether dir holds any of the four IDX files; the train/test pair of such a folder. */
int dt_ds_idx_folder_has_any(const char *dir);
int dt_ds_open_idx_folder(dt_data_splits *out, const char *dir, const dt_data_options *opt, dt_error *err);
/* dataset_folder.c: an image folder (class sub-folders, or train/ and test/ of them). */
int dt_ds_open_image_folder(dt_data_splits *out, const char *path, const dt_data_options *opt, dt_error *err);

#endif
