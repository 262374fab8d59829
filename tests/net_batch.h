/* A batch for a net, shared by the tests that run two nets side by side (test_net.c, test_plan.c,
 * test_net_device.c): inputs drawn uniform in [lo, lo + 1) and labels below the net's classes, from
 * one seed. */
#ifndef DT_TESTS_NET_BATCH_H
#define DT_TESTS_NET_BATCH_H

#include <stdint.h>
#include <stdlib.h>

#include "core/rng.h"
#include "model/net.h"

typedef struct {
    int n;
    float *x;    /* [n, input size] */
    int32_t *y;  /* [n] */
} test_batch;

/* 0 when memory ran out (x and y NULL). */
static inline int test_batch_make(test_batch *b, const dt_net *net, int n, float lo, uint64_t seed) {
    size_t in = (size_t)n * dt_net_input_size(net);
    b->n = n;
    b->x = malloc(in * sizeof *b->x);
    b->y = malloc((size_t)n * sizeof *b->y);
    if (!b->x || !b->y) {
        free(b->x), free(b->y);
        b->x = NULL, b->y = NULL;
        return 0;
    }
    dt_rng r;
    dt_rng_seed(&r, seed);
    for (size_t i = 0; i < in; i++) b->x[i] = lo + (float)dt_rng_uniform(&r);
    for (int i = 0; i < n; i++) b->y[i] = (int32_t)dt_rng_below(&r, (uint64_t)dt_net_num_classes(net));
    return 1;
}

static inline void test_batch_free(test_batch *b) { free(b->x), free(b->y); }

#endif
