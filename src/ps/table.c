/* An embedding table's rows: blocks of rows, an open-addressing index, a recency list, a
 * count-min sketch for admission. table.h says what it promises. */
#include "ps/table.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/error.h"
#include "core/rng.h"
#include "transport/wire.h"

#define NONE UINT32_MAX /* no row (list links, free list); the index stores row + 1, 0 empty */
#define BLOCK_ROWS 4096u
#define SKETCH_DEPTH 4
#define INDEX_SEED UINT64_C(0x7ab1e5eed1de4a11)
#define SKETCH_SEED UINT64_C(0x5ce7c4c0a11b1a5e)

typedef struct {
    uint64_t id;
    int64_t last;             /* the step it was last touched */
    uint32_t prev, next;      /* recency list (prev: more recent); next also chains free rows */
} row_meta;

struct dt_table {
    dt_table_config c;
    int slots;                /* optimizer slots per value */
    size_t row_floats;        /* dim * (1 + slots) */
    uint32_t block_rows;
    uint64_t n_blocks, max_blocks;
    float **vals;             /* [max_blocks] blocks of block_rows * row_floats */
    row_meta **meta;          /* [max_blocks] */
    uint64_t used;            /* rows ever handed out (fresh ones come from here) */
    uint32_t free_head;       /* freed rows */
    uint32_t head, tail;      /* most and least recently touched */
    int lru;                  /* keeps the recency list and the steps touched: a row may be evicted */
    uint32_t *index;          /* [n_index] row number + 1, 0 empty */
    uint64_t n_index;         /* grows with the rows (load <= 80%) up to the capacity's slots */
    uint8_t *sketch;          /* [SKETCH_DEPTH * width] or NULL (min_count <= 1) */
    uint64_t width, sketch_adds;
    int64_t step;
    uint64_t layout;          /* counts the changes that move rows in the index (dt_table_layout) */
    dt_table_stats st;
    float *init;              /* [row_floats] scratch: a new row */
};

const char *dt_row_init_name(dt_row_init kind) {
    static const char *const names[DT_ROW_INIT_KINDS] = {"zeros", "uniform", "normal"};
    return (unsigned)kind < DT_ROW_INIT_KINDS ? names[kind] : "?";
}

int dt_table_config_check(const dt_table_config *c, dt_error *err) {
    if (c->dim < 1 || c->dim > (int)DT_TABLE_MAX_DIM)
        return dt_errorf(err, DT_EINVAL, "table %u: dim %d (must be 1..%u)", c->table, c->dim, DT_TABLE_MAX_DIM);
    if (c->capacity < 1 || c->capacity > DT_TABLE_MAX_ROWS)
        return dt_errorf(err, DT_EINVAL, "table %u: capacity %llu rows (must be 1..%llu)", c->table,
                         (unsigned long long)c->capacity, (unsigned long long)DT_TABLE_MAX_ROWS);
    if (c->min_count > DT_TABLE_MAX_MIN_COUNT)
        return dt_errorf(err, DT_EINVAL, "table %u: min_count %u (must be 0..%u)", c->table, c->min_count,
                         DT_TABLE_MAX_MIN_COUNT);
    if (c->sketch_width > DT_WIRE_MAX_SKETCH_WIDTH)
        return dt_errorf(err, DT_EINVAL, "table %u: sketch_width %u (at most 2^26)", c->table, c->sketch_width);
    if (c->expire_steps < 0)
        return dt_errorf(err, DT_EINVAL, "table %u: expire_steps %lld (must be >= 0)", c->table,
                         (long long)c->expire_steps);
    if ((unsigned)c->init >= DT_ROW_INIT_KINDS)
        return dt_errorf(err, DT_EINVAL, "table %u: unknown initialiser %d", c->table, (int)c->init);
    if (!(c->init_scale >= 0.0f && c->init_scale <= 1e6f))
        return dt_errorf(err, DT_EINVAL, "table %u: init_scale %g (must be 0..1e6)", c->table, (double)c->init_scale);
    int rc = dt_lazy_config_check(&c->opt, err);
    return rc ? dt_error_wrap(err, rc, "table %u: ", c->table) : DT_OK;
}

static uint64_t sketch_width_of(const dt_table_config *c) {
    uint64_t want = c->sketch_width ? c->sketch_width : 4 * c->capacity, w = 1024;
    if (!c->sketch_width && want > DT_WIRE_MAX_SKETCH_WIDTH) want = DT_WIRE_MAX_SKETCH_WIDTH;
    while (w < want) w *= 2;
    return w;
}

static uint64_t index_slots(uint64_t capacity) { return capacity + capacity / 4 + 1; }
#define INDEX_FIRST 4096 /* rows the first index is sized for */

static uint32_t block_rows_of(const dt_table_config *c) {
    return c->capacity < BLOCK_ROWS ? (uint32_t)c->capacity : BLOCK_ROWS;
}

size_t dt_table_row_bytes(const dt_table_config *c) {
    size_t floats = (size_t)c->dim * (1 + (size_t)dt_lazy_slots(c->opt.kind));
    return floats * sizeof(float) + sizeof(row_meta) + 5; /* 1.25 index slots of 4 bytes */
}

size_t dt_table_fixed_bytes(const dt_table_config *c) {
    uint64_t blocks = (c->capacity + block_rows_of(c) - 1) / block_rows_of(c);
    size_t sketch = c->min_count > 1 ? SKETCH_DEPTH * sketch_width_of(c) : 0;
    return sizeof(dt_table) + sketch + blocks * 2 * sizeof(void *) + (size_t)block_rows_of(c) * dt_table_row_bytes(c) +
           (size_t)c->dim * (1 + DT_LAZY_MAX_SLOTS) * sizeof(float) + 8;
}

uint64_t dt_table_bytes_at(const dt_table_config *c, uint64_t rows) {
    const uint64_t block = block_rows_of(c), most = index_slots(c->capacity);
    const uint64_t row_floats = (uint64_t)c->dim * (1 + (uint64_t)dt_lazy_slots(c->opt.kind));
    if (rows > c->capacity) rows = c->capacity;
    uint64_t n_index = index_slots(c->capacity < INDEX_FIRST ? c->capacity : INDEX_FIRST);
    while (rows * 5 > n_index * 4 && n_index < most) n_index = 2 * n_index < most ? 2 * n_index : most; /* row_create */
    const uint64_t blocks = (rows + block - 1) / block, max_blocks = (c->capacity + block - 1) / block;
    return sizeof(dt_table) + n_index * sizeof(uint32_t) + (c->min_count > 1 ? SKETCH_DEPTH * sketch_width_of(c) : 0) +
           max_blocks * 2 * sizeof(void *) + blocks * block * (row_floats * sizeof(float) + sizeof(row_meta)) +
           row_floats * sizeof(float);
}

size_t dt_table_bytes(const dt_table *t) {
    return sizeof *t + t->n_index * sizeof *t->index + (t->sketch ? SKETCH_DEPTH * t->width : 0) +
           t->max_blocks * 2 * sizeof(void *) + t->n_blocks * t->block_rows * (t->row_floats * sizeof(float) +
           sizeof(row_meta)) + t->row_floats * sizeof(float);
}

void dt_table_free(dt_table *t) {
    if (!t) return;
    for (uint64_t b = 0; b < t->n_blocks; b++) free(t->vals[b]), free(t->meta[b]);
    free(t->vals), free(t->meta), free(t->index), free(t->sketch), free(t->init);
    free(t);
}

int dt_table_new(dt_table **out, const dt_table_config *c, dt_error *err) {
    *out = NULL;
    int rc = dt_table_config_check(c, err);
    if (rc) return rc;
    dt_table *t = dt_calloc(1, sizeof *t, "table", err);
    if (!t) return DT_ENOMEM;
    t->c = *c;
    t->slots = dt_lazy_slots(c->opt.kind);
    t->row_floats = (size_t)c->dim * (1 + (size_t)t->slots);
    t->block_rows = block_rows_of(c);
    t->lru = !c->bounded || c->expire_steps > 0;
    t->max_blocks = (c->capacity + t->block_rows - 1) / t->block_rows;
    t->n_index = index_slots(c->capacity < INDEX_FIRST ? c->capacity : INDEX_FIRST);
    t->free_head = t->head = t->tail = NONE;
    t->vals = dt_calloc(t->max_blocks, sizeof *t->vals, "table blocks", err);
    t->meta = dt_calloc(t->max_blocks, sizeof *t->meta, "table blocks", err);
    t->index = dt_calloc(t->n_index, sizeof *t->index, "table index", err);
    t->init = dt_malloc(t->row_floats * sizeof *t->init, "table row", err);
    if (c->min_count > 1) {
        t->width = sketch_width_of(c);
        t->sketch = dt_calloc(SKETCH_DEPTH, t->width, "table admission sketch", err);
    }
    if (!t->vals || !t->meta || !t->index || !t->init || (c->min_count > 1 && !t->sketch)) {
        dt_table_free(t);
        return dt_errorf(err, DT_ENOMEM, "table %u: out of memory for its index (%llu rows of capacity)", c->table,
                         (unsigned long long)c->capacity);
    }
    *out = t;
    return DT_OK;
}

const dt_table_config *dt_table_config_of(const dt_table *t) { return &t->c; }
uint64_t dt_table_layout(const dt_table *t) { return t->layout; }

void dt_table_config_from_wire(dt_table_config *c, const dt_wire_table *w) {
    *c = (dt_table_config){.table = w->table, .dim = (int)w->dim, .opt = w->opt, .capacity = w->capacity,
                           .min_count = w->min_count, .sketch_width = w->sketch_width,
                           .expire_steps = (int64_t)w->expire_steps, .init = (dt_row_init)w->init_kind,
                           .init_scale = w->init_scale, .seed = w->seed,
                           .bounded = (w->flags & DT_WIRE_TABLE_F_BUCKETS) != 0};
}
int64_t dt_table_step(const dt_table *t) { return t->step; }
void dt_table_set_step(dt_table *t, int64_t step) { t->step = step; }
void dt_table_get_stats(const dt_table *t, dt_table_stats *out) { *out = t->st; }

void dt_table_init_row(const dt_table_config *c, uint64_t id, float *value) {
    if (c->init == DT_ROW_INIT_ZEROS || c->init_scale == 0.0f) {
        memset(value, 0, (size_t)c->dim * sizeof *value);
        return;
    }
    dt_rng r;
    dt_rng_seed(&r, dt_hash64(dt_hash64(c->seed, c->table), id));
    for (int j = 0; j < c->dim; j++)
        value[j] = c->init == DT_ROW_INIT_UNIFORM ? (2.0f * dt_rng_uniform(&r) - 1.0f) * c->init_scale
                                                  : dt_rng_truncated_normal(&r, c->init_scale);
}

/* ---- Rows and their index --------------------------------------------------------------------- */

static float *row_vals(const dt_table *t, uint32_t r) {
    return t->vals[r / t->block_rows] + (size_t)(r % t->block_rows) * t->row_floats;
}

static row_meta *row_at(const dt_table *t, uint32_t r) { return &t->meta[r / t->block_rows][r % t->block_rows]; }

static uint64_t home_of(const dt_table *t, uint64_t id) {
    return (uint64_t)(((unsigned __int128)dt_hash64(INDEX_SEED, id) * t->n_index) >> 64);
}

/* The index slot holding id's row, or the empty slot where it would go. */
static uint64_t index_find(const dt_table *t, uint64_t id) {
    uint64_t k = home_of(t, id);
    while (t->index[k] && row_at(t, t->index[k] - 1)->id != id) k = k + 1 == t->n_index ? 0 : k + 1;
    return k;
}

/* A twice larger index (at most the capacity's slots), every row entered again; with no memory
 * for it the index stays as it is (fuller: still correct, its probes longer). */
static void index_grow(dt_table *t) {
    uint64_t most = index_slots(t->c.capacity), n = 2 * t->n_index < most ? 2 * t->n_index : most;
    uint32_t *fresh = n > t->n_index ? calloc(n, sizeof *fresh) : NULL;
    if (!fresh) return;
    uint32_t *old = t->index;
    uint64_t n_old = t->n_index;
    t->index = fresh;
    t->n_index = n;
    for (uint64_t j = 0; j < n_old; j++) {
        if (!old[j]) continue;
        uint64_t k = home_of(t, row_at(t, old[j] - 1)->id);
        while (t->index[k]) k = k + 1 == n ? 0 : k + 1;
        t->index[k] = old[j];
    }
    free(old);
    t->layout++;
}

/* Empties slot k, moving later entries of its probe run back (linear probing without tombstones). */
static void index_remove(dt_table *t, uint64_t k) {
    uint64_t hole = k, j = k;
    for (;;) {
        j = j + 1 == t->n_index ? 0 : j + 1;
        if (!t->index[j]) break;
        uint64_t h = home_of(t, row_at(t, t->index[j] - 1)->id);
        /* The entry at j may fill the hole unless its home lies cyclically in (hole, j]. */
        int stays = hole <= j ? (h > hole && h <= j) : (h > hole || h <= j);
        if (stays) continue;
        t->index[hole] = t->index[j];
        hole = j;
    }
    t->index[hole] = 0;
    t->layout++;
}

static void list_unlink(dt_table *t, uint32_t r) {
    row_meta *m = row_at(t, r);
    if (m->prev != NONE) row_at(t, m->prev)->next = m->next;
    else t->head = m->next;
    if (m->next != NONE) row_at(t, m->next)->prev = m->prev;
    else t->tail = m->prev;
}

static void list_push_front(dt_table *t, uint32_t r) {
    row_meta *m = row_at(t, r);
    m->prev = NONE;
    m->next = t->head;
    if (t->head != NONE) row_at(t, t->head)->prev = r;
    t->head = r;
    if (t->tail == NONE) t->tail = r;
}

static void touch(dt_table *t, uint32_t r) {
    if (!t->lru) return;
    row_at(t, r)->last = t->step;
    if (t->head == r) return;
    list_unlink(t, r);
    list_push_front(t, r);
}

/* Removes row r (least recently used, or expired): its index entry, its place in the list. */
static void evict(dt_table *t, uint32_t r) {
    index_remove(t, index_find(t, row_at(t, r)->id));
    list_unlink(t, r);
    row_at(t, r)->next = t->free_head;
    t->free_head = r;
    t->st.rows--;
}

/* A row number for a new row: a freed one, a fresh one (a new block if needed), or, full, the
 * least recently used row evicted. NONE without memory for a block. */
static uint32_t row_claim(dt_table *t) {
    if (t->st.rows >= t->c.capacity) {
        if (!t->lru) return NONE; /* a bounded table's ids are below its capacity: never met */
        t->st.evicted++;
        evict(t, t->tail);
    }
    uint32_t r = t->free_head;
    if (r != NONE) {
        t->free_head = row_at(t, r)->next;
        return r;
    }
    uint64_t b = t->used / t->block_rows;
    if (b == t->n_blocks) {
        if (!DT_ASSERT(b < t->max_blocks)) return NONE;
        t->vals[b] = dt_alloc_floats((size_t)t->block_rows * t->row_floats, "table block", NULL);
        t->meta[b] = malloc((size_t)t->block_rows * sizeof(row_meta));
        if (!t->vals[b] || !t->meta[b]) {
            free(t->vals[b]), free(t->meta[b]);
            t->vals[b] = NULL, t->meta[b] = NULL;
            return NONE;
        }
        t->n_blocks++;
    }
    return (uint32_t)t->used++;
}

/* ---- Admission -------------------------------------------------------------------------------- */

/* Counts one update of id in the sketch (conservative update: only the smallest counters grow) and
 * returns its estimate. Every `width` counts all counters are halved, so ids seen long ago fade
 * and at most about one id per counter is counted between two halvings (TinyLFU's reset): an id
 * seen once is then taken for one seen twice with a probability of (1 - 1/e)^4 = 16% at worst,
 * under 5% on average. */
static unsigned sketch_count(dt_table *t, uint64_t id) {
    uint64_t pos[SKETCH_DEPTH];
    unsigned least = 255;
    for (int d = 0; d < SKETCH_DEPTH; d++) {
        pos[d] = (uint64_t)d * t->width + (dt_hash64(SKETCH_SEED + (uint64_t)d, id) & (t->width - 1));
        if (t->sketch[pos[d]] < least) least = t->sketch[pos[d]];
    }
    if (least < 255) least++;
    for (int d = 0; d < SKETCH_DEPTH; d++)
        if (t->sketch[pos[d]] < least) t->sketch[pos[d]] = (uint8_t)least;
    if (++t->sketch_adds >= t->width) {
        for (uint64_t i = 0; i < SKETCH_DEPTH * t->width; i++) t->sketch[i] >>= 1;
        t->sketch_adds = 0;
    }
    return least;
}

/* A new row for id (not in the table), at its initial values: NONE without memory. */
static uint32_t row_create(dt_table *t, uint64_t id) {
    uint32_t r = row_claim(t);
    if (r == NONE) return NONE;
    if ((t->st.rows + 1) * 5 > t->n_index * 4) index_grow(t); /* above 80% load */
    t->index[index_find(t, id)] = r + 1; /* an eviction may have moved the index's entries */
    row_meta *m = row_at(t, r);
    m->id = id;
    m->last = t->step;
    if (t->lru) list_push_front(t, r);
    float *v = row_vals(t, r);
    dt_table_init_row(&t->c, id, v);
    dt_lazy_init_slots(&t->c.opt, v + t->c.dim, t->c.dim);
    t->st.rows++;
    t->st.admitted++;
    return r;
}

/* id's row for an update: its own, or a new one if id is admitted now; NONE otherwise. */
static uint32_t row_for_update(dt_table *t, uint64_t id) {
    uint64_t k = index_find(t, id);
    if (t->index[k]) {
        t->st.hits++;
        return t->index[k] - 1;
    }
    t->st.misses++;
    if (t->c.min_count > 1 && sketch_count(t, id) < t->c.min_count) {
        t->st.not_admitted++;
        return NONE;
    }
    uint32_t r = row_create(t, id);
    if (r == NONE) t->st.nomem++;
    return r;
}

/* ---- Reads and updates ------------------------------------------------------------------------ */

const float *dt_table_find(const dt_table *t, uint64_t id) {
    uint64_t k = index_find(t, id);
    return t->index[k] ? row_vals(t, t->index[k] - 1) : NULL;
}

/* Random rows of tables far larger than the caches: each id's index slot is asked for FAR ids ahead,
 * its row (meta and values) NEAR ids ahead, once the slot is in the cache. */
#define PREFETCH_FAR 16
#define PREFETCH_NEAR 8

static void prefetch_ahead(const dt_table *t, const uint64_t *ids, size_t n, size_t i) {
    if (i + PREFETCH_FAR < n) __builtin_prefetch(&t->index[home_of(t, ids[i + PREFETCH_FAR])]);
    if (i + PREFETCH_NEAR < n) {
        uint32_t e = t->index[home_of(t, ids[i + PREFETCH_NEAR])];
        if (e) __builtin_prefetch(row_at(t, e - 1)), __builtin_prefetch(row_vals(t, e - 1), 1);
    }
}

void dt_table_read(dt_table *t, uint64_t id, float *out) {
    uint64_t k = index_find(t, id);
    if (!t->index[k]) {
        t->st.misses++;
        dt_table_init_row(&t->c, id, out);
        return;
    }
    t->st.hits++;
    touch(t, t->index[k] - 1);
    memcpy(out, row_vals(t, t->index[k] - 1), (size_t)t->c.dim * sizeof *out);
}

void dt_table_read_n(dt_table *t, const uint64_t *ids, size_t n, float *out) {
    for (size_t i = 0; i < n; i++) {
        prefetch_ahead(t, ids, n, i);
        dt_table_read(t, ids[i], out + i * (size_t)t->c.dim);
    }
}

/* Rows not touched for more than expire_steps steps: the list's tail, oldest first. */
static void expire(dt_table *t) {
    if (!t->c.expire_steps) return;
    while (t->tail != NONE && t->step - row_at(t, t->tail)->last > t->c.expire_steps) {
        t->st.expired++;
        evict(t, t->tail);
    }
}

void dt_table_apply(dt_table *t, const uint64_t *ids, const float *grads, size_t n) {
    const dt_lazy_rates rates = dt_lazy_rates_at(&t->c.opt, t->step);
    const int d = t->c.dim;
    for (size_t i = 0; i < n; i++) {
        uint32_t r = row_for_update(t, ids[i]);
        if (r == NONE) continue;
        touch(t, r);
        float *v = row_vals(t, r);
        dt_lazy_apply_row(&t->c.opt, &rates, v, v + d, grads + i * (size_t)d, d);
    }
    t->step++;
    expire(t);
}

/* ---- Checkpoints ------------------------------------------------------------------------------ */

size_t dt_table_row_floats(const dt_table_config *c) {
    return (size_t)c->dim * (1 + (size_t)dt_lazy_slots(c->opt.kind));
}

size_t dt_table_export(const dt_table *t, uint64_t *cursor, size_t max, uint64_t *ids, float *rows) {
    size_t n = 0;
    uint64_t k = *cursor;
    for (; k < t->n_index && n < max; k++) {
        if (!t->index[k]) continue;
        uint32_t r = t->index[k] - 1;
        ids[n] = row_at(t, r)->id;
        memcpy(rows + n * t->row_floats, row_vals(t, r), t->row_floats * sizeof *rows);
        n++;
    }
    *cursor = k;
    return n;
}

int dt_table_import(dt_table *t, uint64_t id, const float *row) {
    uint64_t k = index_find(t, id);
    uint32_t r = t->index[k] ? t->index[k] - 1 : row_create(t, id);
    if (r == NONE) return DT_ENOMEM;
    touch(t, r);
    memcpy(row_vals(t, r), row, t->row_floats * sizeof *row);
    return DT_OK;
}
