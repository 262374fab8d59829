/* The sparse tables' messages (docs/protocol.md, "Sparse tables"): the bounds of their header
 * fields, their payload sizes, and SPARSE_INIT's table records. */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "io/bytes.h"
#include "transport/wire.h"

int dt_wire_type_is_sparse(uint8_t type) { return type >= DT_MSG_SPARSE_INIT && type <= DT_MSG_SPARSE_PUSH; }

int dt_wire_check_sparse(const dt_wire_header *h, dt_error *err) {
    const char *tn = dt_wire_type_name(h->type);
    const unsigned long long table = h->sparse.table, ids = h->sparse.ids, dim = h->sparse.dim;
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
    if (ids > DT_WIRE_MAX_SPARSE_IDS || (ids == 0 && h->type != DT_MSG_SPARSE_PUSH))
        return dt_errorf(err, DT_EFORMAT, "%s header: %llu ids, must be %d..%u, the limit of ids per message "
                         "(DT_WIRE_MAX_SPARSE_IDS)", tn, ids, h->type != DT_MSG_SPARSE_PUSH, DT_WIRE_MAX_SPARSE_IDS);
    if (ids * dim > DT_WIRE_MAX_SPARSE_FLOATS)
        return dt_errorf(err, DT_EFORMAT, "%s header: %llu ids of dim %llu are %llu floats, beyond the limit of %u "
                         "per message (DT_WIRE_MAX_SPARSE_FLOATS)", tn, ids, dim, ids * dim, DT_WIRE_MAX_SPARSE_FLOATS);
    return DT_OK;
}

uint64_t dt_wire_sparse_bytes(const dt_wire_header *h) {
    const uint64_t ids = h->sparse.ids, rows = ids * h->sparse.dim * dt_enc_size(h->encoding);
    switch (h->type) {
    case DT_MSG_SPARSE_INIT: return ids * DT_WIRE_TABLE_BYTES;
    case DT_MSG_SPARSE_PULL: return 8 * ids;
    case DT_MSG_SPARSE_ROWS: return rows;
    case DT_MSG_SPARSE_PUSH: return 8 * ids + rows;
    }
    return 0;
}

uint64_t dt_wire_sparse_max_frame(void) {
    uint64_t push = 8 * (uint64_t)DT_WIRE_MAX_SPARSE_IDS + 4 * (uint64_t)DT_WIRE_MAX_SPARSE_FLOATS,
             init = (uint64_t)DT_WIRE_MAX_TABLES * DT_WIRE_TABLE_BYTES;
    return push > init ? push : init;
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
    if ((unsigned)v.opt.kind >= DT_LAZY_KINDS || v.init_kind > 2 || (v.flags & ~DT_WIRE_TABLE_F_ROW_MEAN))
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
