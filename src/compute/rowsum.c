#include "compute/rowsum.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"

#define ROWSUM_SEED UINT64_C(0x5eed0f5a1e5bcafe)

void dt_rowsum_init(dt_rowsum *s, int dim) {
    memset(s, 0, sizeof *s);
    s->dim = dim;
}

void dt_rowsum_free(dt_rowsum *s) {
    free(s->ids), free(s->count), free(s->rows), free(s->index);
    dt_rowsum_init(s, s->dim);
}

void dt_rowsum_clear(dt_rowsum *s) {
    if (s->index) memset(s->index, 0, (s->mask + 1) * sizeof *s->index);
    s->n = 0;
}

size_t dt_rowsum_bytes(const dt_rowsum *s) {
    return s->cap * (sizeof *s->ids + sizeof *s->count + (size_t)s->dim * sizeof(float)) +
           (s->index ? (s->mask + 1) * sizeof *s->index : 0);
}

static size_t slot_of(const dt_rowsum *s, uint64_t id) { return (size_t)dt_hash64(ROWSUM_SEED, id) & s->mask; }

/* A new index of 2^k >= 2 * cap slots, the ids re-entered. */
static int rehash(dt_rowsum *s, size_t cap, dt_error *err) {
    size_t slots = 16;
    while (slots < 2 * cap) slots *= 2;
    if (slots <= s->mask + 1 && s->index) return DT_OK;
    uint32_t *index = dt_calloc(slots, sizeof *index, "row sums' index", err);
    if (!index) return DT_ENOMEM;
    free(s->index);
    s->index = index;
    s->mask = slots - 1;
    for (size_t i = 0; i < s->n; i++) {
        size_t k = slot_of(s, s->ids[i]);
        while (s->index[k]) k = (k + 1) & s->mask;
        s->index[k] = (uint32_t)(i + 1);
    }
    return DT_OK;
}

int dt_rowsum_reserve(dt_rowsum *s, size_t more, dt_error *err) {
    if (more > UINT32_MAX - 1 - s->n) return dt_errorf(err, DT_EINVAL, "row sums: %zu ids are too many", s->n + more);
    size_t want = s->n + more;
    if (want <= s->cap) return DT_OK;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < want) cap *= 2;
    uint64_t *ids = realloc(s->ids, cap * sizeof *ids);
    if (ids) s->ids = ids;
    uint32_t *count = ids ? realloc(s->count, cap * sizeof *count) : NULL;
    if (count) s->count = count;
    float *rows = count && s->dim ? realloc(s->rows, cap * (size_t)s->dim * sizeof *rows) : NULL;
    if (rows) s->rows = rows;
    if (!ids || !count || (s->dim && !rows)) return dt_errorf(err, DT_ENOMEM, "out of memory for %zu row sums", cap);
    s->cap = cap;
    return rehash(s, cap, err);
}

size_t dt_rowsum_find(const dt_rowsum *s, uint64_t id) {
    if (!s->index) return (size_t)-1;
    for (size_t k = slot_of(s, id); s->index[k]; k = (k + 1) & s->mask)
        if (s->ids[s->index[k] - 1] == id) return s->index[k] - 1;
    return (size_t)-1;
}

size_t dt_rowsum_add(dt_rowsum *s, uint64_t id, const float *row) {
    const size_t d = (size_t)s->dim;
    if (!s->index) return (size_t)-1;
    size_t k = slot_of(s, id);
    for (; s->index[k]; k = (k + 1) & s->mask) {
        size_t i = s->index[k] - 1;
        if (s->ids[i] != id) continue;
        s->count[i]++;
        if (row)
            for (size_t j = 0; j < d; j++) s->rows[i * d + j] += row[j];
        return i;
    }
    if (s->n >= s->cap) return (size_t)-1;
    size_t i = s->n++;
    s->index[k] = (uint32_t)(i + 1);
    s->ids[i] = id;
    s->count[i] = 1;
    if (d) {
        if (row) memcpy(s->rows + i * d, row, d * sizeof *row);
        else memset(s->rows + i * d, 0, d * sizeof *row);
    }
    return i;
}
