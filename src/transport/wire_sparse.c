/* The sparse tables' messages (docs/protocol.md, "Sparse tables"): the bounds of their header
 * fields, their payload sizes, and SPARSE_INIT's table records. */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "io/bytes.h"
#include "transport/wire.h"

int dt_wire_type_is_sparse(uint8_t type) {
    return (type >= DT_MSG_SPARSE_INIT && type <= DT_MSG_SPARSE_PUSH) ||
           (type >= DT_MSG_SPARSE_EXPORT && type <= DT_MSG_SPARSE_IMPORT);
}

int dt_wire_type_has_sections(uint8_t type) { return type >= DT_MSG_SPARSE_PULL && type <= DT_MSG_SPARSE_PUSH; }

/* SPARSE_EXPORT, SPARSE_PAGE, SPARSE_IMPORT: rows with their optimizer slots. */
static int rows_type(uint8_t type) { return type >= DT_MSG_SPARSE_EXPORT && type <= DT_MSG_SPARSE_IMPORT; }

/* The optimizer of a message of rows with slots: a table optimizer and its slot count. */
static int check_row_optimizer(const dt_wire_header *h, const char *tn, dt_error *err) {
    if (h->opt_kind >= DT_LAZY_KINDS || h->opt_slots != dt_lazy_slots((dt_lazy_kind)h->opt_kind))
        return dt_errorf(err, DT_EFORMAT, "%s header: table optimizer %u with %u slots (bytes 56-57: a kind 0..%d and "
                         "its slot count)", tn, h->opt_kind, h->opt_slots, DT_LAZY_KINDS - 1);
    return DT_OK;
}

/* A SPARSE_PULL's, _ROWS' or _PUSH's totals: 1..DT_WIRE_MAX_SPARSE_SECTIONS sections, the ids within
 * DT_WIRE_MAX_SPARSE_IDS (none only in a push: a sync worker without ids still says so), at least
 * one id a section in a pull, the floats 1..DT_WIRE_MAX_SPARSE_DIM a row and within
 * DT_WIRE_MAX_SPARSE_FLOATS. The records are checked against them (dt_wire_sections_decode). */
static int check_sections(const dt_wire_header *h, dt_error *err) {
    const char *tn = dt_wire_type_name(h->type);
    const unsigned long long n = h->sections.count, ids = h->sections.ids, floats = h->sections.floats;
    if (n < 1 || n > DT_WIRE_MAX_SPARSE_SECTIONS)
        return dt_errorf(err, DT_EFORMAT, "%s header: %llu sections, must be 1..%u, the limit of sections per message "
                         "(DT_WIRE_MAX_SPARSE_SECTIONS)", tn, n, DT_WIRE_MAX_SPARSE_SECTIONS);
    const unsigned long long least = h->type == DT_MSG_SPARSE_PUSH ? 0 : n;
    if (ids > DT_WIRE_MAX_SPARSE_IDS || ids < least)
        return dt_errorf(err, DT_EFORMAT, "%s header: %llu ids in %llu sections, must be %llu..%u, the limit of ids "
                         "per message (DT_WIRE_MAX_SPARSE_IDS)", tn, ids, n, least, DT_WIRE_MAX_SPARSE_IDS);
    if (floats > DT_WIRE_MAX_SPARSE_FLOATS)
        return dt_errorf(err, DT_EFORMAT, "%s header: %llu floats, beyond the limit of %u per message "
                         "(DT_WIRE_MAX_SPARSE_FLOATS)", tn, floats, DT_WIRE_MAX_SPARSE_FLOATS);
    if (floats < ids || floats > ids * DT_WIRE_MAX_SPARSE_DIM)
        return dt_errorf(err, DT_EFORMAT, "%s header: %llu floats for %llu ids, must be 1..%u a row "
                         "(DT_WIRE_MAX_SPARSE_DIM)", tn, floats, ids, DT_WIRE_MAX_SPARSE_DIM);
    return DT_OK;
}

int dt_wire_check_sparse(const dt_wire_header *h, dt_error *err) {
    const char *tn = dt_wire_type_name(h->type);
    const unsigned long long table = h->sparse.table, ids = h->sparse.ids, dim = h->sparse.dim;
    if (dt_wire_type_has_sections(h->type)) return check_sections(h, err);
    if (h->type == DT_MSG_SPARSE_INIT) {
        if (ids < 1 || ids > DT_WIRE_MAX_TABLES || table || dim)
            return dt_errorf(err, DT_EFORMAT, "SPARSE_INIT header: %llu tables (must be 1..%u, the limit of tables "
                             "per ps, DT_WIRE_MAX_TABLES), table %llu and dim %llu (must be 0)", ids,
                             DT_WIRE_MAX_TABLES, table, dim);
        return DT_OK;
    }
    if (table >= DT_WIRE_MAX_TABLES)
        return dt_errorf(err, DT_EFORMAT, "%s header: table %llu, beyond the limit of %u tables (DT_WIRE_MAX_TABLES)",
                         tn, table, DT_WIRE_MAX_TABLES);
    if (dim < 1 || dim > DT_WIRE_MAX_SPARSE_DIM)
        return dt_errorf(err, DT_EFORMAT, "%s header: dim %llu, must be 1..%u (DT_WIRE_MAX_SPARSE_DIM)", tn, dim,
                         DT_WIRE_MAX_SPARSE_DIM);
    /* a PAGE: no row left; the chief's LAST IMPORT to a ps may have none */
    const int none_ok = h->type == DT_MSG_SPARSE_PAGE || (h->type == DT_MSG_SPARSE_IMPORT && (h->flags & DT_WIRE_F_LAST));
    if (ids > DT_WIRE_MAX_SPARSE_IDS || (ids == 0 && !none_ok))
        return dt_errorf(err, DT_EFORMAT, "%s header: %llu ids, must be %d..%u, the limit of ids per message "
                         "(DT_WIRE_MAX_SPARSE_IDS)", tn, ids, !none_ok, DT_WIRE_MAX_SPARSE_IDS);
    if (rows_type(h->type)) {
        int rc = check_row_optimizer(h, tn, err);
        if (rc) return rc;
    }
    const unsigned long long floats = ids * dim * (rows_type(h->type) ? 1u + h->opt_slots : 1u);
    if (floats > DT_WIRE_MAX_SPARSE_FLOATS)
        return dt_errorf(err, DT_EFORMAT, "%s header: %llu ids of dim %llu%s are %llu floats, beyond the limit of %u "
                         "per message (DT_WIRE_MAX_SPARSE_FLOATS)", tn, ids, dim,
                         rows_type(h->type) && h->opt_slots ? " with their optimizer slots" : "", floats,
                         DT_WIRE_MAX_SPARSE_FLOATS);
    return DT_OK;
}

size_t dt_wire_sections_ids_at(const dt_wire_header *h) { return DT_WIRE_SECTION_BYTES * h->sections.count; }

size_t dt_wire_sections_rows_at(const dt_wire_header *h) { return dt_wire_sections_ids_at(h) + 8 * h->sections.ids; }

uint64_t dt_wire_sparse_bytes(const dt_wire_header *h) {
    const uint64_t ids = h->sparse.ids, rows = h->sections.floats * dt_enc_size(h->encoding);
    switch (h->type) {
    case DT_MSG_SPARSE_INIT: return ids * DT_WIRE_TABLE_BYTES;
    case DT_MSG_SPARSE_PULL: return dt_wire_sections_rows_at(h);
    case DT_MSG_SPARSE_ROWS: return rows;
    case DT_MSG_SPARSE_PUSH: return dt_wire_sections_rows_at(h) + rows;
    case DT_MSG_SPARSE_PAGE:
    case DT_MSG_SPARSE_IMPORT: return 8 * ids + 4 * ids * h->sparse.dim * (1 + (uint64_t)h->opt_slots);
    }
    return 0; /* SPARSE_EXPORT */
}

uint64_t dt_wire_sparse_max_frame(void) {
    uint64_t push = (uint64_t)DT_WIRE_SECTION_BYTES * DT_WIRE_MAX_SPARSE_SECTIONS +
                    8 * (uint64_t)DT_WIRE_MAX_SPARSE_IDS + 4 * (uint64_t)DT_WIRE_MAX_SPARSE_FLOATS,
             init = (uint64_t)DT_WIRE_MAX_TABLES * DT_WIRE_TABLE_BYTES;
    return push > init ? push : init;
}

/* ---- Sections: SPARSE_PULL and SPARSE_PUSH ------------------------------------------------------ */

void dt_wire_section_encode(uint8_t *out, uint32_t table, uint32_t dim, uint32_t ids) {
    dt_put_u16(out, (uint16_t)table);
    dt_put_u16(out + 2, (uint16_t)dim);
    dt_put_u32(out + 4, ids);
}

/* Record k: its table known and new (seen: a bit per table), its dim, its ids (a pull's at least 1). */
static int section_read(dt_wire_section *o, const uint8_t *p, size_t k, int pull, uint8_t *seen, const char *tn,
                        dt_error *err) {
    o->table = dt_get_u16(p), o->dim = dt_get_u16(p + 2), o->ids = dt_get_u32(p + 4);
    if (o->table >= DT_WIRE_MAX_TABLES)
        return dt_errorf(err, DT_EFORMAT, "%s section %zu: table %u, beyond the limit of %u tables "
                         "(DT_WIRE_MAX_TABLES)", tn, k, o->table, DT_WIRE_MAX_TABLES);
    if (seen[o->table >> 3] & (1u << (o->table & 7)))
        return dt_errorf(err, DT_EFORMAT, "%s section %zu: table %u named twice (a message names a table in one "
                         "section)", tn, k, o->table);
    seen[o->table >> 3] |= (uint8_t)(1u << (o->table & 7));
    if (o->dim < 1 || o->dim > DT_WIRE_MAX_SPARSE_DIM)
        return dt_errorf(err, DT_EFORMAT, "%s section %zu (table %u): dim %u, must be 1..%u (DT_WIRE_MAX_SPARSE_DIM)",
                         tn, k, o->table, o->dim, DT_WIRE_MAX_SPARSE_DIM);
    if (o->ids > DT_WIRE_MAX_SPARSE_IDS || (pull && o->ids == 0))
        return dt_errorf(err, DT_EFORMAT, "%s section %zu (table %u): %u ids, must be %d..%u (DT_WIRE_MAX_SPARSE_IDS)",
                         tn, k, o->table, o->ids, pull, DT_WIRE_MAX_SPARSE_IDS);
    return DT_OK;
}

int dt_wire_sections_decode(dt_wire_section *out, const dt_wire_header *h, const void *payload, size_t len,
                            dt_error *err) {
    const char *tn = dt_wire_type_name(h->type);
    if (h->type != DT_MSG_SPARSE_PULL && h->type != DT_MSG_SPARSE_PUSH)
        return dt_errorf(err, DT_EFORMAT, "%s carries no section records", tn);
    int rc = dt_wire_check_sparse(h, err); /* decode checked it; a hand-made header must not overflow */
    if (rc) return rc;
    if (len != dt_wire_sparse_bytes(h))
        return dt_errorf(err, DT_EFORMAT, "%s payload of %zu bytes, expected %llu (%llu sections, %llu ids, %llu "
                         "floats)", tn, len, (unsigned long long)dt_wire_sparse_bytes(h),
                         (unsigned long long)h->sections.count, (unsigned long long)h->sections.ids,
                         (unsigned long long)h->sections.floats);
    uint8_t seen[DT_WIRE_MAX_TABLES / 8] = {0};
    uint64_t ids = 0, floats = 0; /* at most 1024 x 2^32 x 1024: no overflow */
    for (size_t k = 0; k < h->sections.count; k++) {
        dt_wire_section *o = &out[k];
        if ((rc = section_read(o, (const uint8_t *)payload + DT_WIRE_SECTION_BYTES * k, k,
                               h->type == DT_MSG_SPARSE_PULL, seen, tn, err)))
            return rc;
        o->first = (size_t)ids, o->at = (size_t)floats;
        ids += o->ids, floats += (uint64_t)o->ids * o->dim;
        if (ids > h->sections.ids || floats > h->sections.floats)
            return dt_errorf(err, DT_EFORMAT, "%s section %zu (table %u): the sections so far hold %llu ids and %llu "
                             "floats, beyond the header's %llu and %llu", tn, k, o->table, (unsigned long long)ids,
                             (unsigned long long)floats, (unsigned long long)h->sections.ids,
                             (unsigned long long)h->sections.floats);
    }
    if (ids != h->sections.ids || floats != h->sections.floats)
        return dt_errorf(err, DT_EFORMAT, "%s: the %llu sections hold %llu ids and %llu floats, the header says %llu "
                         "and %llu", tn, (unsigned long long)h->sections.count, (unsigned long long)ids,
                         (unsigned long long)floats, (unsigned long long)h->sections.ids,
                         (unsigned long long)h->sections.floats);
    return DT_OK;
}

/* Offsets in a table record (docs/protocol.md has the same table). */
enum {
    T_TABLE = 0, T_DIM = 4, T_OPT = 8, T_INIT = 9, T_FLAGS = 10, T_MIN_COUNT = 11, T_SKETCH = 12, T_LR = 16,
    T_ACC = 20, T_LR_POWER = 24, T_L1 = 28, T_L2 = 32, T_BETA1 = 36, T_BETA2 = 40, T_EPSILON = 44, T_SCALE = 48,
    T_RESERVED = 52, T_CAPACITY = 56, T_EXPIRE = 64, T_SEED = 72,
};
_Static_assert(T_SEED + 8 == DT_WIRE_TABLE_BYTES, "table record layout and size disagree");
#define MAX_EXPIRE (UINT64_C(1) << 50)
#define MAX_CAPACITY (UINT64_C(1) << 31)

void dt_wire_table_encode(uint8_t *out, const dt_wire_table *t) {
    memset(out, 0, DT_WIRE_TABLE_BYTES);
    dt_put_u32(out + T_TABLE, t->table);
    dt_put_u32(out + T_DIM, t->dim);
    out[T_OPT] = (uint8_t)t->opt.kind;
    out[T_INIT] = t->init_kind;
    out[T_FLAGS] = t->flags;
    out[T_MIN_COUNT] = t->min_count;
    dt_put_u32(out + T_SKETCH, t->sketch_width);
    const float f[9] = {t->opt.learning_rate, t->opt.initial_accumulator, t->opt.lr_power, t->opt.l1, t->opt.l2,
                        t->opt.beta1, t->opt.beta2, t->opt.epsilon, t->init_scale};
    for (int i = 0; i < 9; i++) dt_put_f32(out + T_LR + 4 * i, f[i]);
    dt_put_u64(out + T_CAPACITY, t->capacity);
    dt_put_u64(out + T_EXPIRE, t->expire_steps);
    dt_put_u64(out + T_SEED, t->seed);
}

static void table_read(dt_wire_table *t, const uint8_t *p) {
    memset(t, 0, sizeof *t);
    t->table = dt_get_u32(p + T_TABLE);
    t->dim = dt_get_u32(p + T_DIM);
    t->opt.kind = (dt_lazy_kind)p[T_OPT];
    t->init_kind = p[T_INIT];
    t->flags = p[T_FLAGS];
    t->min_count = p[T_MIN_COUNT];
    t->sketch_width = dt_get_u32(p + T_SKETCH);
    float *f[9] = {&t->opt.learning_rate, &t->opt.initial_accumulator, &t->opt.lr_power, &t->opt.l1, &t->opt.l2,
                   &t->opt.beta1, &t->opt.beta2, &t->opt.epsilon, &t->init_scale};
    for (int i = 0; i < 9; i++) *f[i] = dt_get_f32(p + T_LR + 4 * i);
    t->capacity = dt_get_u64(p + T_CAPACITY);
    t->expire_steps = dt_get_u64(p + T_EXPIRE);
    t->seed = dt_get_u64(p + T_SEED);
}

int dt_wire_table_decode(dt_wire_table *t, const void *buf, size_t len, dt_error *err) {
    const uint8_t *p = buf;
    if (len != DT_WIRE_TABLE_BYTES)
        return dt_errorf(err, DT_EFORMAT, "table record: %zu bytes, expected %u", len, DT_WIRE_TABLE_BYTES);
    dt_wire_table v;
    table_read(&v, p);
    const unsigned id = v.table;
    if (v.table >= DT_WIRE_MAX_TABLES)
        return dt_errorf(err, DT_EFORMAT, "table record: table %u, beyond the limit of %u tables (DT_WIRE_MAX_TABLES)",
                         id, DT_WIRE_MAX_TABLES);
    if (v.dim < 1 || v.dim > DT_WIRE_MAX_SPARSE_DIM)
        return dt_errorf(err, DT_EFORMAT, "table %u: dim %u, must be 1..%u (DT_WIRE_MAX_SPARSE_DIM)", id, v.dim,
                         DT_WIRE_MAX_SPARSE_DIM);
    if ((unsigned)v.opt.kind >= DT_LAZY_KINDS || v.init_kind > 2 || (v.flags & ~DT_WIRE_TABLE_FLAGS))
        return dt_errorf(err, DT_EFORMAT, "table %u: optimizer %u, initialiser %u or flags 0x%02x unknown (bytes %d-%d)",
                         id, (unsigned)v.opt.kind, v.init_kind, v.flags, T_OPT, T_FLAGS);
    if (v.sketch_width > DT_WIRE_MAX_SKETCH_WIDTH || dt_get_u32(p + T_RESERVED))
        return dt_errorf(err, DT_EFORMAT, "table %u: sketch_width %u beyond 2^26, or reserved bytes %d-%d not 0", id,
                         v.sketch_width, T_RESERVED, T_RESERVED + 3);
    if (v.capacity < 1 || v.capacity > MAX_CAPACITY || v.expire_steps > MAX_EXPIRE)
        return dt_errorf(err, DT_EFORMAT, "table %u: capacity %llu (must be 1..2^31 rows) or expire_steps %llu "
                         "(at most 2^50)", id, (unsigned long long)v.capacity, (unsigned long long)v.expire_steps);
    const float f[9] = {v.opt.learning_rate, v.opt.initial_accumulator, v.opt.lr_power, v.opt.l1, v.opt.l2,
                        v.opt.beta1, v.opt.beta2, v.opt.epsilon, v.init_scale};
    for (int i = 0; i < 9; i++)
        if (!isfinite(f[i]))
            return dt_errorf(err, DT_EFORMAT, "table %u: the float at byte %d is not finite", id, T_LR + 4 * i);
    if (!(v.init_scale >= 0.0f && v.init_scale <= 1e6f))
        return dt_errorf(err, DT_EFORMAT, "table %u: init_scale %g, must be 0..1e6", id, (double)v.init_scale);
    dt_error e = {0};
    if (dt_lazy_config_check(&v.opt, &e))
        return dt_errorf(err, DT_EFORMAT, "table %u: %s", id, e.msg);
    *t = v;
    return DT_OK;
}

/* ---- Rows with their slots: SPARSE_PAGE and SPARSE_IMPORT ----------------------------------------- */

size_t dt_wire_rows_per_msg(size_t dim, size_t slots) {
    size_t by_floats = DT_WIRE_MAX_SPARSE_FLOATS / (dim * (1 + slots));
    return by_floats < DT_WIRE_MAX_SPARSE_IDS ? by_floats : DT_WIRE_MAX_SPARSE_IDS;
}

uint64_t dt_wire_rows_id(const dt_wire_rows *r, size_t i) { return dt_get_u64(r->ids + 8 * i); }

void dt_wire_rows_get(const dt_wire_rows *r, size_t i, float *out) {
    const size_t k = r->dim * (1 + r->slots);
    memcpy(out, r->rows + 4 * k * i, 4 * k); /* float32, little-endian: the host's (as every float payload) */
}

/* The least value slot k of a table optimizer may hold (-INFINITY: any finite one), and whether it
 * must exceed it: Adagrad's accumulator only grows from initial_accumulator > 0, FTRL's n from >= 0,
 * Adam's v from 0 (a smaller one makes the next update divide by 0 or take a square root of < 0). */
static float slot_floor(uint8_t kind, size_t k, int *strict) {
    *strict = kind == DT_LAZY_ADAGRAD;
    if ((kind == DT_LAZY_ADAGRAD || kind == DT_LAZY_FTRL) && k == 0) return 0.0f;
    if (kind == DT_LAZY_ADAM && k == 1) return 0.0f;
    return -INFINITY;
}

/* Row i's floats (values, then slots) finite and each slot within its range; else refused. */
static int check_row(const dt_wire_rows *r, uint8_t kind, size_t i, const char *tn, uint64_t table, dt_error *err) {
    const uint8_t *p = r->rows + 4 * i * r->dim * (1 + r->slots);
    for (size_t k = 0; k <= r->slots; k++)
        for (size_t j = 0; j < r->dim; j++) {
            const float v = dt_get_f32(p + 4 * (k * r->dim + j));
            int strict;
            const float lo = k ? slot_floor(kind, k - 1, &strict) : -INFINITY;
            if (isfinite(v) && (k == 0 || (strict ? v > lo : v >= lo))) continue;
            const char *what = !isfinite(v) ? "is not finite" : strict ? "must be > 0" : "must be >= 0";
            return dt_errorf(err, DT_EFORMAT, "%s: row %zu (id %llu of table %llu): %s %zu, value %zu, %g %s", tn, i,
                             (unsigned long long)dt_wire_rows_id(r, i), (unsigned long long)table,
                             k ? "optimizer slot" : "values", k ? k - 1 : 0, j, (double)v, what);
        }
    return DT_OK;
}

int dt_wire_rows_check(dt_wire_rows *out, const dt_wire_header *h, const void *payload, size_t len, uint64_t max_id,
                       dt_error *err) {
    const char *tn = dt_wire_type_name(h->type);
    if (h->type != DT_MSG_SPARSE_PAGE && h->type != DT_MSG_SPARSE_IMPORT)
        return dt_errorf(err, DT_EFORMAT, "%s carries no rows with slots", tn);
    int rc = dt_wire_check_sparse(h, err); /* decode checked it; a hand-made header must not overflow */
    if (rc) return rc;
    if (len != dt_wire_sparse_bytes(h))
        return dt_errorf(err, DT_EFORMAT, "%s payload of %zu bytes, expected %llu (%llu ids, dim %llu, %u slots)", tn,
                         len, (unsigned long long)dt_wire_sparse_bytes(h), (unsigned long long)h->sparse.ids,
                         (unsigned long long)h->sparse.dim, h->opt_slots);
    dt_wire_rows r = {.n = h->sparse.ids, .dim = h->sparse.dim, .slots = h->opt_slots, .ids = payload};
    r.rows = r.n ? r.ids + 8 * r.n : r.ids; /* no arithmetic on an empty payload's pointer */
    for (size_t i = 0; i < r.n; i++) {
        const uint64_t id = dt_wire_rows_id(&r, i);
        if (max_id && id >= max_id)
            return dt_errorf(err, DT_EFORMAT, "%s: row %zu: id %llu of table %llu, beyond the table's %llu rows", tn, i,
                             (unsigned long long)id, (unsigned long long)h->sparse.table, (unsigned long long)max_id);
        if ((rc = check_row(&r, h->opt_kind, i, tn, h->sparse.table, err))) return rc;
    }
    *out = r;
    return DT_OK;
}
