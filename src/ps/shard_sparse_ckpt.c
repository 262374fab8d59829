/* Sparse tables in checkpoints, the ps's side (docs/sparse.md, "Checkpoints"): SPARSE_EXPORT answers
 * a page of a table's rows (values and optimizer slots) from a cursor on, SPARSE_IMPORT sets rows
 * this ps owns. The ps keeps nothing between pages: the cursor says where the walk stands. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/bytes.h"
#include "ps/shard_impl.h"

/* A cursor: the table's layout (dt_table_layout, 31 bits, so the cursor stays a non-negative i64) in
 * its high 32 bits, the next index position in its low 32 (an index has fewer than 2^32 slots). A
 * walk whose layout changed starts again from the first position: rows moved in the index. */
#define LAYOUT_MASK UINT64_C(0x7fffffff)

static uint64_t cursor_of(const dt_table *t, uint64_t pos) { return (dt_table_layout(t) & LAYOUT_MASK) << 32 | pos; }

static uint64_t cursor_pos(const dt_table *t, uint64_t cursor) {
    return cursor >> 32 == (dt_table_layout(t) & LAYOUT_MASK) ? cursor & UINT32_MAX : 0;
}

/* The table a SPARSE_EXPORT or SPARSE_IMPORT names, with the dim and the optimizer it says; else
 * refused (NULL). */
static shard_table *table_with_slots(const shard_req *r) {
    shard_table *st = shard_table_of(r);
    if (!st) return NULL;
    const dt_lazy_kind kind = dt_table_config_of(st->t)->opt.kind;
    if (r->h->opt_kind != (uint8_t)kind) {
        shard_refuse(r, DT_WIRE_E_BAD_VALUE, "%s for table %llu trained by %s, but the table's optimizer is %s (the "
                     "chief's SPARSE_INIT)", dt_wire_type_name(r->h->type), (unsigned long long)r->h->sparse.table,
                     dt_lazy_name((dt_lazy_kind)r->h->opt_kind), dt_lazy_name(kind));
        return NULL;
    }
    return st;
}

/* A page: up to sparse.ids rows from the cursor on, ids then rows (values then slots), packed into a
 * reply of their size. The table's step rides along (LazyAdam's bias correction counts it). */
void shard_on_sparse_export(const shard_req *r) {
    ps_shard *s = r->s;
    const dt_wire_header *h = r->h;
    shard_table *st = table_with_slots(r);
    if (!st) return;
    const dt_table *t = st->t;
    const size_t max = h->sparse.ids, k = dt_table_row_floats(dt_table_config_of(t));
    uint64_t *ids = malloc(max * sizeof *ids), pos = cursor_pos(t, (uint64_t)h->cursor);
    if (!ids) {
        shard_refuse(r, DT_WIRE_E_NOMEM, "out of memory for a SPARSE_PAGE's ids");
        return;
    }
    /* s->rows holds DT_WIRE_MAX_SPARSE_FLOATS, and max * k is within it (dt_wire_check_sparse) */
    const size_t n = dt_table_export(t, &pos, max, ids, s->rows);
    dt_wire_header a = shard_reply_to(s, DT_MSG_SPARSE_PAGE, h);
    a.sparse.table = h->sparse.table, a.sparse.ids = n, a.sparse.dim = h->sparse.dim;
    a.opt_kind = h->opt_kind, a.opt_slots = h->opt_slots;
    a.global_step = dt_table_step(t);
    a.cursor = n < max ? 0 : (int64_t)cursor_of(t, pos); /* fewer than asked: the walk reached the end */
    const size_t bytes = n * (8 + 4 * k);
    uint8_t *d = n ? shard_reply_buffer(r, bytes) : NULL; /* no row left: a reply without payload */
    if (d) {
        for (size_t i = 0; i < n; i++) dt_put_u64(d + 8 * i, ids[i]);
        memcpy(d + 8 * n, s->rows, 4 * n * k);
        shard_send_buffer(r, &a, d, bytes);
    } else if (!n) {
        shard_send(r, &a);
    }
    free(ids);
}

/* Rows of a checkpoint: each this ps's (as a SPARSE_PUSH's), finite, its slots in range, then set
 * whole (values and slots, created if absent). Checked before anything changes. The chief's LAST
 * ends the import: the SPARSE_PULLs held since its SPARSE_INIT with IMPORT are answered. */
void shard_on_sparse_import(const shard_req *r) {
    ps_shard *s = r->s;
    const dt_wire_header *h = r->h;
    shard_table *st = table_with_slots(r);
    if (!st || !shard_ids_owned(r, h->sparse.table, r->payload->data, h->sparse.ids, "SPARSE_IMPORT")) return;
    dt_wire_rows rows = {0};
    dt_error e = {0};
    /* the LAST one may carry no row */
    if (h->sparse.ids && dt_wire_rows_check(&rows, h, r->payload->data, r->payload->size, 0, &e)) {
        shard_refuse(r, DT_WIRE_E_BAD_VALUE, "%s", e.msg);
        return;
    }
    for (size_t i = 0; i < rows.n; i++) {
        dt_wire_rows_get(&rows, i, s->rows); /* s->rows: at least one row's floats */
        if (dt_table_import(st->t, dt_wire_rows_id(&rows, i), s->rows)) {
            shard_refuse(r, DT_WIRE_E_NOMEM, "out of memory for the rows of table %llu: %zu of %zu imported",
                         (unsigned long long)h->sparse.table, i, rows.n);
            return;
        }
    }
    dt_wire_header a = shard_reply_to(s, DT_MSG_ACK, h);
    shard_send(r, &a);
    if (h->flags & DT_WIRE_F_LAST) { /* the tables are whole: the pulls held meanwhile are answered */
        s->importing = 0;
        shard_sparse_serve(s, r->now, r->io);
    }
}
