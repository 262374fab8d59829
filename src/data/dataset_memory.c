/* A data set over a caller's arrays (a binding's numpy arrays): nothing copied, the loader reads
 * each example as it reads an IDX one, so the same pixels give the same batches. */
#include <stdlib.h>

#include "core/error.h"
#include "data/dataset_impl.h"

#define MEM_MAX_EXAMPLE ((uint64_t)1 << 26) /* floats per example: refuses absurd shapes */

int dt_dataset_from_memory(dt_dataset **out, const void *x, int x_u8, const int32_t *labels, size_t n, int h, int w,
                           int c, const char *source, dt_error *err) {
    *out = NULL;
    const char *name = source && *source ? source : "arrays";
    if (!x && n) return dt_errorf(err, DT_EINVAL, "%s: no examples given (x is NULL)", name);
    if (h < 1 || w < 1 || c < 1 || (uint64_t)h * (uint64_t)w * (uint64_t)c > MEM_MAX_EXAMPLE)
        return dt_errorf(err, DT_ESHAPE, "%s: example shape %d x %d x %d is out of range", name, h, w, c);
    if (n < 1 || n > DT_DS_MAX_COUNT)
        return dt_errorf(err, DT_EINVAL, "%s: %zu examples, out of range 1..%llu", name, n,
                         (unsigned long long)DT_DS_MAX_COUNT);
    int32_t maxl = -1;
    for (size_t i = 0; labels && i < n; i++) {
        if (labels[i] < 0 || labels[i] >= DT_DS_MAX_CLASSES)
            return dt_errorf(err, DT_EINVAL, "%s: label %zu is %d, out of range 0..%d", name, i, (int)labels[i],
                             DT_DS_MAX_CLASSES - 1);
        if (labels[i] > maxl) maxl = labels[i];
    }
    dt_dataset *ds = dt_ds_new(DS_MEMORY, err);
    if (!ds) return DT_ENOMEM;
    ds->n = n, ds->h = h, ds->w = w, ds->c = c;
    ds->mem_x = x, ds->mem_u8 = x_u8 != 0, ds->mem_labels = labels;
    ds->bad_images = DT_BAD_IMAGES_FAIL;
    if (labels) ds->num_classes = (int)maxl + 1; /* before the names: dt_dataset_free counts them by it */
    if (!(ds->source = dt_ds_str_dup(name, err)) ||
        (labels && !(ds->class_names = dt_ds_numeric_names(ds->num_classes, err)))) {
        dt_dataset_free(ds);
        return DT_ENOMEM;
    }
    *out = ds;
    return DT_OK;
}
