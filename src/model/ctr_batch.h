/* What a click-log model reads (data/ctr.h makes it; model/ consumes it): a batch of tabular
 * examples, and the stable hash an embedding layer maps raw ids to rows with. Here, below data/ in
 * the layer order, so that the net can take a batch without knowing the reader; data/ctr.h
 * includes this header, and docs/ctr-data.md documents both. */
#ifndef DT_MODEL_CTR_BATCH_H
#define DT_MODEL_CTR_BATCH_H

#include <stdint.h>

/* A batch of tabular examples, as the embedding and dense layers consume it. Row-major; every
 * pointer stays valid until the next call on the reader (or builder) that returned it.
 *
 *   labels [n]                 0 or 1
 *   dense  [n * num_dense]     integer features after the transform (dt_ctr_dense_value): row i's
 *                              feature j at i * num_dense + j. Criteo: 13; libffm: 0
 *   offsets [n * num_fields + 1], ids [nnz], values [nnz]
 *                              categorical features in CSR form: the ids of row i, field f are
 *                              ids[offsets[i * num_fields + f] .. offsets[i * num_fields + f + 1]),
 *                              each with its value (Criteo: 1; libffm: the line's value), in the
 *                              order the line gave them. An empty range is a missing field (Criteo:
 *                              an empty column); the embedding layer decides what a missing field
 *                              becomes. Criteo fields hold at most one id; libffm fields any number.
 *                              ids are the raw ids (Criteo: the 32-bit hex value); hashing them to
 *                              buckets is the embedding layer's (dt_ctr_bucket).
 *   lines  [n]                 each row's line number in the file (from 1), for messages and
 *                              predictions. */
typedef struct {
    int n;
    int num_dense, num_fields;
    const float *labels;
    const float *dense;
    const int64_t *offsets;
    const uint64_t *ids;
    const float *values;
    const int64_t *lines;
    int64_t epoch;  /* training order: the pass over the file this batch belongs to (from 0) */
    int64_t index;  /* training order: the global batch number t (epoch * batches per epoch + t) */
} dt_ctr_batch;

/* splitmix64's finaliser: a bijection of 64-bit values that spreads every input bit over every
 * output bit. */
uint64_t dt_ctr_mix64(uint64_t z);
/* The stable hash of a categorical id (docs/ctr-data.md gives it in Python):
 *   dt_ctr_hash(field, id) = mix64(id ^ mix64(field ^ 0x4354524841534831))   ("CTRHASH1")
 * For a fixed field it is a bijection of the ids (no two ids of one field collide before the
 * reduction), and fields are independent. The embedding layer's bucket of an id is
 *   dt_ctr_bucket(field, id, buckets) = dt_ctr_hash(field, id) % buckets
 * (field: the field's number for per-field tables; for a table shared by several fields, still each
 * id's own field, so equal raw ids of different fields land apart). */
uint64_t dt_ctr_hash(uint32_t field, uint64_t id);
uint64_t dt_ctr_bucket(uint32_t field, uint64_t id, uint64_t buckets);
/* The key of an id's row in its table: its bucket (buckets > 0), or, unbounded (buckets 0), the raw id
 * itself in a per-field table and dt_ctr_hash(field, id) in a shared one, so equal raw ids of two
 * fields sharing a table stay apart (docs/sparse.md, "Unbounded ids"). */
uint64_t dt_ctr_key(uint32_t field, uint64_t id, uint64_t buckets, int shared);

#endif
