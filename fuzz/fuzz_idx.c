/* libFuzzer target: an IDX images file and an IDX labels file (plain or gzip) from one input.
 * Layout: 4-byte little-endian length L, then L bytes of images (clipped to what is there), then
 * the labels. The reader must accept or refuse without crashing, leaking or over-allocating, and an
 * accepted data set must be self-consistent. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4) return 0;
    size_t ilen = (size_t)data[0] | (size_t)data[1] << 8 | (size_t)data[2] << 16 | (size_t)data[3] << 24;
    const uint8_t *images = data + 4;
    if (ilen > size - 4) ilen = size - 4;
    const uint8_t *labels = images + ilen;
    size_t llen = size - 4 - ilen;
    dt_dataset *ds = NULL;
    dt_error err = {0};
    if (dt_dataset_from_idx_bytes(&ds, images, ilen, labels, llen, "fuzz", &err) == 0) {
        int h, w, c, k = dt_dataset_num_classes(ds);
        dt_dataset_dims(ds, &h, &w, &c);
        size_t n = dt_dataset_size(ds);
        if (n == 0 || h <= 0 || w <= 0 || c != 1 || k < 1 || k > 256) __builtin_trap();
        float *x = malloc(sizeof(float) * (size_t)h * (size_t)w);
        size_t picks[2] = {0, n - 1};
        for (int p = 0; x && p < 2; p++) {
            int32_t y = -1;
            if (dt_dataset_get(ds, picks[p], x, &y, &err) != 0 || y < 0 || y >= k) __builtin_trap();
            for (size_t j = 0; j < (size_t)h * (size_t)w; j++)
                if (!(x[j] >= 0.0f && x[j] <= 1.0f)) __builtin_trap();
        }
        free(x);
        dt_dataset_free(ds);
    } else if (err.msg[0] == '\0' || strstr(err.msg, "fuzz") == NULL || ds != NULL) {
        __builtin_trap(); /* every refusal says why and names the input */
    }
    return 0;
}
