/* An in-memory IDX data set for tests that must trace a batch row back to its example: n examples
 * of h x w grey pixels, pixel p of example i = pixel(i, p), label = label(i). Set-up, not a check:
 * it exits if the library refuses the bytes. */
#ifndef DT_TEST_IDX_FIXTURE_H
#define DT_TEST_IDX_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "data/dataset.h"

static void idx_put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

static dt_dataset *idx_dataset(const char *name, uint32_t n, uint32_t h, uint32_t w,
                               uint8_t (*pixel)(uint32_t i, uint32_t p), uint8_t (*label)(uint32_t i)) {
    size_t px = (size_t)h * w, il = 16 + (size_t)n * px, ll = 8 + (size_t)n;
    uint8_t *img = calloc(il, 1), *lab = calloc(ll, 1);
    if (!img || !lab) {
        fprintf(stderr, "%s: out of memory\n", name);
        exit(1);
    }
    idx_put_be32(img, 0x803), idx_put_be32(img + 4, n), idx_put_be32(img + 8, h), idx_put_be32(img + 12, w);
    idx_put_be32(lab, 0x801), idx_put_be32(lab + 4, n);
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t p = 0; p < px; p++) img[16 + i * px + p] = pixel(i, p);
        lab[8 + i] = label(i);
    }
    dt_dataset *ds = NULL;
    dt_error e = {0};
    if (dt_dataset_from_idx_bytes(&ds, img, il, lab, ll, name, &e) != 0) {
        fprintf(stderr, "%s: %s\n", name, e.msg);
        exit(1);
    }
    free(img), free(lab);
    return ds;
}

#endif
