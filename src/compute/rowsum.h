/* Rows summed by id: the unique ids of a list in first-seen order, each with the sum of the rows
 * given for it and how many there were. A ps sums the duplicate ids of a sparse push before the
 * lazy optimizer applies them (TensorFlow sums an IndexedSlices' duplicate indices the same way),
 * and the replicas' pushes of a sync step; a worker uniques a batch's ids (dim 0: no rows).
 *
 * Sums are float32, added in the order the rows are given: the caller fixes the order (the ps
 * adds replicas in worker-index order), so the result does not depend on arrival order. */
#ifndef DT_COMPUTE_ROWSUM_H
#define DT_COMPUTE_ROWSUM_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain.h"

typedef struct {
    int dim;                  /* floats per row (0: ids only) */
    size_t n;                 /* unique ids so far */
    size_t cap;               /* room in ids, count and rows */
    uint64_t *ids;            /* [cap] in first-seen order */
    uint32_t *count;          /* [cap] rows summed into each */
    float *rows;              /* [cap * dim] the sums */
    uint32_t *index;          /* [mask + 1] open addressing: position + 1, 0 empty */
    size_t mask;
} dt_rowsum;

void dt_rowsum_init(dt_rowsum *s, int dim);
/* Room for `more` further unique ids: after it, that many dt_rowsum_add calls cannot fail. */
int dt_rowsum_reserve(dt_rowsum *s, size_t more, dt_error *err);
/* Adds row [dim] (NULL: counts the id only, its sum unchanged) to id's sum; returns id's position
 * (0..n-1). Needs room (dt_rowsum_reserve): the position of a new id beyond it is (size_t)-1. */
size_t dt_rowsum_add(dt_rowsum *s, uint64_t id, const float *row);
/* Position of id, or (size_t)-1. */
size_t dt_rowsum_find(const dt_rowsum *s, uint64_t id);
/* Empties it, keeping its memory. */
void dt_rowsum_clear(dt_rowsum *s);
void dt_rowsum_free(dt_rowsum *s);
/* Bytes it holds. */
size_t dt_rowsum_bytes(const dt_rowsum *s);

#endif
