/* A click-log reader read one batch ahead (ctr_ahead.h). */
#include "train/ctr_ahead.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* A batch's arrays, owned, grown as needed. */
typedef struct {
    dt_ctr_batch b;
    void *mem;
    size_t cap;
} held;

struct dt_ctr_ahead {
    held h[2];
    int cur;                  /* h[cur]: the batch handed out last */
    int have_next;            /* h[1 - cur] holds the one after it */
};

int dt_ctr_ahead_create(dt_ctr_ahead **out, dt_error *err) {
    *out = dt_calloc(1, sizeof **out, "click-log lookahead", err);
    return *out ? DT_OK : DT_ENOMEM;
}

void dt_ctr_ahead_free(dt_ctr_ahead *a) {
    if (!a) return;
    free(a->h[0].mem), free(a->h[1].mem);
    free(a);
}

/* Copies src into h (its arrays into h's memory, 8-byte aligned each). */
static int hold(held *h, const dt_ctr_batch *src, dt_error *err) {
    const size_t n = (size_t)src->n, cells = n * (size_t)src->num_fields;
    const size_t nnz = src->n > 0 ? (size_t)src->offsets[cells] : 0;
    const size_t sz[6] = {n * sizeof(float), n * (size_t)src->num_dense * sizeof(float),
                          (cells + 1) * sizeof(int64_t), nnz * sizeof(uint64_t), nnz * sizeof(float),
                          n * sizeof(int64_t)};
    size_t total = 0;
    for (int i = 0; i < 6; i++) total += (sz[i] + 7) & ~(size_t)7;
    if (total > h->cap) {
        free(h->mem);
        h->cap = 0;
        if (!(h->mem = dt_malloc(total, "click-log lookahead", err))) return DT_ENOMEM;
        h->cap = total;
    }
    const void *from[6] = {src->labels, src->dense, src->offsets, src->ids, src->values, src->lines};
    void *to[6] = {0};
    char *at = h->mem;
    for (int i = 0; i < 6; i++) {
        to[i] = from[i] ? at : NULL; /* an array the reader does not give stays absent */
        if (sz[i] && from[i]) memcpy(at, from[i], sz[i]);
        at += (sz[i] + 7) & ~(size_t)7;
    }
    h->b = *src;
    if (src->n > 0)
        h->b.labels = to[0], h->b.dense = to[1], h->b.offsets = to[2], h->b.ids = to[3], h->b.values = to[4],
        h->b.lines = to[5];
    return DT_OK;
}

/* The reader's next batch into h. */
static int read_into(dt_ctr_reader *r, held *h, dt_error *err) {
    dt_ctr_batch b;
    int rc = dt_ctr_next(r, &b, err);
    return rc ? rc : hold(h, &b, err);
}

int dt_ctr_ahead_next(dt_ctr_ahead *a, dt_ctr_reader *r, dt_ctr_batch *cur, const dt_ctr_batch **next,
                      dt_error *err) {
    *next = NULL;
    int rc = DT_OK;
    if (a->have_next) a->cur = 1 - a->cur;
    else rc = read_into(r, &a->h[a->cur], err);
    a->have_next = 0;
    if (rc) return rc;
    *cur = a->h[a->cur].b;
    if (cur->n == 0) return DT_OK; /* a one-pass reader is done: nothing after it */
    if ((rc = read_into(r, &a->h[1 - a->cur], err))) return rc;
    a->have_next = 1;
    if (a->h[1 - a->cur].b.n > 0) *next = &a->h[1 - a->cur].b;
    return DT_OK;
}
