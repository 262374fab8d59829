/* One embedding table on a ps: a hash table of rows keyed by 64-bit id, with a capacity,
 * admission after a minimum count, eviction of rows not touched for a number of steps and of the
 * least recently used row when full (docs/sparse.md, "Tables").
 *
 * A row is `dim` values and the lazy optimizer's slots (`slots * dim` floats), plus its id, the
 * step it was last touched and its place in the recency list. Rows live in blocks of up to 4096
 * rows allocated as the table fills (never more than capacity rows); the index is an open-
 * addressing array of 32-bit row numbers at most 80% full, doubled as rows come up to the
 * capacity's size; ids not yet admitted are counted in a count-min sketch of fixed size. So a table's memory is bounded by its capacity,
 * whatever the id stream: dt_table_bytes <= capacity * dt_table_row_bytes + dt_table_fixed_bytes.
 *
 * The recency list is kept only where a row may be evicted (not a bounded table without expiry).
 *
 * A row absent from the table reads as its initial value, a function of (seed, table, id) alone
 * (dt_table_init_row): a row evicted and admitted again, or restored on another ps, starts the same
 * way. No sockets, no clock: the table's step is the count of updates applied. */
#ifndef DT_PS_TABLE_H
#define DT_PS_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "compute/lazy_optim.h"
#include "dtrain.h"
#include "transport/wire.h"

#define DT_TABLE_MAX_DIM 1024u               /* floats per row */
#define DT_TABLE_MAX_ROWS (UINT64_C(1) << 31) /* capacity of one table, in rows */
#define DT_TABLE_MAX_MIN_COUNT 255u           /* admission: the sketch's counters are 8 bits */

typedef enum { DT_ROW_INIT_ZEROS = 0, DT_ROW_INIT_UNIFORM = 1, DT_ROW_INIT_NORMAL = 2 } dt_row_init;
#define DT_ROW_INIT_KINDS 3

typedef struct {
    uint32_t table;           /* the table's id (in the row seeds and the placement) */
    int dim;                  /* 1..DT_TABLE_MAX_DIM */
    dt_lazy_config opt;
    uint64_t capacity;        /* rows held at most, 1..DT_TABLE_MAX_ROWS */
    /* Admission: an id gets a row at its min_count-th update (0 or 1: at its first); until then its
     * gradients are dropped (counted) and it reads as its initial value. */
    uint32_t min_count;       /* 0..DT_TABLE_MAX_MIN_COUNT */
    uint32_t sketch_width;    /* counters per row of the sketch (rounded up to a power of two; 0: from
                               * the capacity, 2^10..2^26: DT_WIRE_MAX_SKETCH_WIDTH) */
    int64_t expire_steps;     /* a row not touched for more than this many steps is evicted (0: never) */
    dt_row_init init;
    float init_scale;         /* uniform: values in [-scale, scale); normal: stddev, truncated at 2 stddev */
    uint64_t seed;
    /* Its ids are below the capacity (a table of buckets, DT_WIRE_TABLE_F_BUCKETS): it never fills up
     * for a new id, so without expire_steps no row is ever evicted and no recency is kept. */
    int bounded;
} dt_table_config;

typedef struct {
    uint64_t rows;            /* held now */
    uint64_t admitted;        /* rows created */
    uint64_t expired, evicted; /* rows removed: not touched for expire_steps; least recently used when full */
    uint64_t hits, misses;    /* ids read or updated that had a row / had none */
    uint64_t not_admitted;    /* updates of ids below min_count (dropped) */
    uint64_t nomem;           /* updates dropped for want of memory for a new block of rows */
} dt_table_stats;

typedef struct dt_table dt_table;

/* Checks the configuration (DT_EINVAL naming the field), allocates the index and the sketch. */
int dt_table_new(dt_table **out, const dt_table_config *c, dt_error *err);
void dt_table_free(dt_table *t);
/* The configuration checks alone. */
int dt_table_config_check(const dt_table_config *c, dt_error *err);
const dt_table_config *dt_table_config_of(const dt_table *t);
/* The table SPARSE_INIT's record declares (dt_wire_table_decode checked it). */
void dt_table_config_from_wire(dt_table_config *c, const dt_wire_table *w);

/* The initial values [dim] of id's row: zeros, or drawn from a generator seeded by
 * hash(hash(seed, table), id) (core/rng.h). */
void dt_table_init_row(const dt_table_config *c, uint64_t id, float *value);

/* id's values into out [dim]: its row's (touching it: most recently used, last touched now) or,
 * without a row, its initial values. Reading admits nothing. */
void dt_table_read(dt_table *t, uint64_t id, float *out);
/* dt_table_read of ids [n] into out [n * dim], the rows fetched from memory a few ids ahead. */
void dt_table_read_n(dt_table *t, const uint64_t *ids, size_t n, float *out);

/* One update: ids [n] distinct (their rows summed already, dt_rowsum), grads [n * dim]. Ids with a
 * row, or admitted now, are updated by the lazy optimizer at the table's step; then the step
 * advances and rows not touched for expire_steps are evicted. */
void dt_table_apply(dt_table *t, const uint64_t *ids, const float *grads, size_t n);

int64_t dt_table_step(const dt_table *t);
void dt_table_set_step(dt_table *t, int64_t step);
/* The row's values and slots, if id has one (NULL otherwise); not a touch. */
const float *dt_table_find(const dt_table *t, uint64_t id);
void dt_table_get_stats(const dt_table *t, dt_table_stats *out);

/* Bytes the table holds now (its own accounting: blocks, index, sketch, itself). */
size_t dt_table_bytes(const dt_table *t);
/* What one row costs at capacity: its floats, its id, step and list links, its index share. */
size_t dt_table_row_bytes(const dt_table_config *c);
/* What does not grow with the rows: the table itself, the sketch, the block list, one block's slack. */
size_t dt_table_fixed_bytes(const dt_table_config *c);
/* What dt_table_bytes says once the table holds `rows` rows (at most its capacity), none evicted:
 * the blocks they fill, the index as it has grown for them, the sketch, the block list, itself. The
 * most a table of this configuration holds with that many rows (a ps's bound on its tables' total,
 * docs/sparse.md "Memory"). */
uint64_t dt_table_bytes_at(const dt_table_config *c, uint64_t rows);

/* ---- Checkpoints: a table's rows out and in (docs/sparse.md, "Checkpoints") ----
 * A row's floats: its values then its slots, dt_table_row_floats of them. */
size_t dt_table_row_floats(const dt_table_config *c);
/* Up to max rows, from index position *cursor on (0 at first; advanced past the rows returned):
 * their ids [max] and floats [max * row floats]. Returns how many; 0 once every row was returned.
 * Rows come in index order, each once, if the table does not change between calls. */
size_t dt_table_export(const dt_table *t, uint64_t *cursor, size_t max, uint64_t *ids, float *rows);
/* Sets id's row to row [row floats] (values and slots), creating it if needed (no admission count;
 * a full table evicts its least recently used row). DT_ENOMEM without memory for a new block. */
int dt_table_import(dt_table *t, uint64_t id, const float *row);
/* Changes whenever rows move in the index (it grew, or a row was evicted or expired): an export walk
 * started before must start again to see every row (rows created meanwhile may be missed either
 * way: they came after the walk began). Creating, updating or reading a row moves no other. */
uint64_t dt_table_layout(const dt_table *t);

const char *dt_row_init_name(dt_row_init kind); /* "zeros", "uniform", "normal"; "?" */

#endif
