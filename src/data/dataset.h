/* Data sets: labelled images, either IDX files (MNIST, Fashion-MNIST; plain or gzip) held in memory
 * as uint8, or image folders (JPEG/PNG) decoded on demand. Examples are always delivered as float32
 * NHWC scaled by 1/255, at the model's input size. See docs/data.md. */
#ifndef DT_DATA_DATASET_H
#define DT_DATA_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain.h"

typedef enum { DT_BAD_IMAGES_SKIP = 0, DT_BAD_IMAGES_FAIL = 1 } dt_bad_image_policy;

typedef struct {
    int h, w, c;                  /* the model's input; images are resized (bilinear) to h x w and
                                     converted to c channels (1 = grey, 3 = RGB); IDX must match */
    double validation_fraction;   /* image folders: held-out share (default 0.2); < 0: default.
                                     IDX: ignored, the test file is the validation set */
    uint64_t seed;                /* validation split shuffle */
    dt_bad_image_policy bad_images;
} dt_data_options;

typedef struct dt_dataset dt_dataset;

/* The splits a data path yields. validation and test may be the same object (IDX test file, or an
 * image folder without a test/ subfolder): free with dt_data_splits_free, which handles that. */
typedef struct {
    dt_dataset *train, *validation, *test;
} dt_data_splits;

/* path is either
 *  - a folder with train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz] and the t10k-* pair
 *    (the test pair becomes validation and test), or
 *  - an image folder: one subfolder per class (sorted names are classes 0..k-1), or Kaggle's flat
 *    cat.123.jpg / dog.456.jpg naming (class = text before the first '.'); if it holds train/ and
 *    test/ subfolders those are used, else the folder is split train/validation and test =
 *    validation. */
int dt_data_open(dt_data_splits *out, const char *path, const dt_data_options *opt, dt_error *err);
void dt_data_splits_free(dt_data_splits *s);

/* A single IDX pair (images idx3, labels idx1), plain or gzip (detected from the bytes). */
int dt_dataset_open_idx(dt_dataset **out, const char *images_path, const char *labels_path,
                        dt_error *err);
/* Parses IDX bytes already in memory (the fuzz target's entry point). On success *out owns copies. */
int dt_dataset_from_idx_bytes(dt_dataset **out, const uint8_t *images, size_t images_len,
                              const uint8_t *labels, size_t labels_len, const char *source,
                              dt_error *err);
void dt_dataset_free(dt_dataset *ds);
/* Examples in the caller's memory (a binding's arrays; docs/python.md), not copied: the caller keeps
 * them alive and unchanged while the data set lives. x [n, h, w, c]: float32 delivered as is, or
 * uint8 (x_u8) delivered / 255 as IDX pixels are. labels [n] in 0..DT_DS_MAX_CLASSES-1, their
 * largest + 1 the classes (as IDX); NULL: unlabelled (prediction). source names it in messages. */
#define DT_DS_MAX_CLASSES 65536
int dt_dataset_from_memory(dt_dataset **out, const void *x, int x_u8, const int32_t *labels, size_t n, int h, int w,
                           int c, const char *source, dt_error *err);

/* Unlabelled data sets, for prediction (labels are -1, there are no classes):
 * dt_dataset_from_paths: the image files paths[0..n) (copied), decoded on demand exactly as an image
 * folder's (opt: the model's input size and the bad-image policy);
 * dt_dataset_open_idx_images: one IDX images file (plain or gzip), whose images must be the model's
 * input size when opt gives one (DT_ESHAPE naming the file and both shapes). */
int dt_dataset_from_paths(dt_dataset **out, char *const *paths, size_t n, const dt_data_options *opt,
                          dt_error *err);
int dt_dataset_open_idx_images(dt_dataset **out, const char *images_path, const dt_data_options *opt,
                               dt_error *err);
/* The images of the inputs a user names for prediction (docs/data.md, "Inputs for prediction"):
 * each of inputs[0..n) is a folder (its image files, then those of its sub-folders, each sorted by
 * name), an image file, or an IDX images file (recognised by its first bytes; then it must be the
 * only input). list_file (may be NULL) names a text file of more inputs, one per line. */
int dt_data_open_inputs(dt_dataset **out, char *const *inputs, size_t n, const char *list_file,
                        const dt_data_options *opt, dt_error *err);
/* The file example i was read from; NULL for IDX data. */
const char *dt_dataset_path(const dt_dataset *ds, size_t i);
/* An IDX data set's images file (as named when opened); NULL for image files. */
const char *dt_dataset_source(const dt_dataset *ds);

size_t dt_dataset_size(const dt_dataset *ds);
int dt_dataset_num_classes(const dt_dataset *ds);
const char *dt_dataset_class_name(const dt_dataset *ds, int k);   /* "0".."9" for IDX */
/* The class names the data gave ([num_classes]: an image folder's sub-folder names or flat-name
 * prefixes), for checkpoints to record; NULL when the classes are only numbered (IDX). */
char *const *dt_dataset_class_names(const dt_dataset *ds);
void dt_dataset_dims(const dt_dataset *ds, int *h, int *w, int *c); /* delivered size */

/* Decodes example i into x [h*w*c] floats and *label. Thread-safe for distinct outputs.
 * Returns 0, or DT_EFORMAT naming the file if an image cannot be decoded. */
int dt_dataset_get(const dt_dataset *ds, size_t i, float *x, int32_t *label, dt_error *err);

/* Images that failed to decode so far (counted by dt_dataset_get). */
size_t dt_dataset_bad_count(const dt_dataset *ds);

/* How the loader treats examples that fail to decode (see dt_data_options.bad_images). IDX: FAIL. */
dt_bad_image_policy dt_dataset_bad_images(const dt_dataset *ds);

/* Image decoding and resizing, used by image folders; exposed for tests and fuzzing.
 * dt_image_decode: a JPEG or PNG (recognised by its first bytes, not its name) into 8-bit pixels
 * *pixels [*h, *w, channels] (channels 1 = grey, 3 = RGB; alpha is dropped), malloc'ed, free with
 * free(). min_h x min_w is the size the caller resizes to: a JPEG is decoded at the smallest DCT
 * scale of 1/8, 1/4, 1/2 whose result is still at least that large (0, 0: full size), so *h, *w may
 * be smaller than the file's own size. At most max_pixels (0: DT_IMAGE_MAX_PIXELS) are decoded; from
 * the header, before anything is allocated, a PNG over it is refused, and a JPEG whose scaled size is
 * over it, whose header claims over 4 x max_pixels, or which needs more than 8 bytes per max_pixels
 * of libjpeg memory (progressive) (docs/data.md). A truncated or corrupt file, or one over a limit,
 * is an error (DT_EFORMAT naming source, and the dimensions for a limit), never a partly grey image. */
#define DT_IMAGE_MAX_PIXELS ((size_t)1 << 24)
int dt_image_decode(uint8_t **pixels, int *h, int *w, const uint8_t *bytes, size_t len, int channels,
                    int min_h, int min_w, size_t max_pixels, const char *source, dt_error *err);
/* Bilinear resize with half-pixel centres (OpenCV INTER_LINEAR, torch interpolate with
 * align_corners=False, no antialiasing), each result divided by divisor (255: values in [0, 1]):
 * out [oh, ow, c] from in [ih, iw, c]. Returns 0 or DT_ENOMEM. */
int dt_resize_bilinear(float *out, int oh, int ow, const uint8_t *in, int ih, int iw, int c,
                       float divisor, dt_error *err);

#endif
