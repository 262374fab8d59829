/* Data augmentation of training examples, on the loader's thread (docs/data.md, "Augmentation"):
 * a random crop after zero padding (crop=P: the image padded by P pixels on every side, then an
 * h x w window at a uniform offset in 0..2P on each axis) and a horizontal flip (flip: half the
 * examples mirrored left to right). Each example's draw comes from (seed, epoch, the example's index
 * in the data set) alone, so it is the same whatever the number of workers, decode threads or the
 * batch it lands in. Off unless asked for: a flip changes the class of digits. */
#ifndef DT_DATA_AUGMENT_H
#define DT_DATA_AUGMENT_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain.h"

#define DT_AUGMENT_MAX_CROP 1024

typedef struct {
    int crop;   /* padding P of the random crop; 0: none */
    int flip;   /* 1: random horizontal flip */
} dt_augment;

/* "crop=P", "flip" or both comma-separated ("crop=4,flip"); "" or "none": nothing. Errors name
 * --augment and the item. */
int dt_augment_parse(dt_augment *a, const char *text, dt_error *err);
/* The crop must be smaller than the h x w image (a larger one could cut out nothing but padding). */
int dt_augment_check(const dt_augment *a, int h, int w, dt_error *err);
int dt_augment_on(const dt_augment *a);

/* The draw of one example: hash of (seed, epoch, example). */
uint64_t dt_augment_key(uint64_t seed, int64_t epoch, size_t example);
/* x [h, w, c] in place; scratch [h * w * c] (only the crop uses it). */
void dt_augment_apply(const dt_augment *a, float *x, float *scratch, int h, int w, int c, uint64_t key);

#endif
