/* One process's sparse tables (local_tables.h): the ps's dt_table, driven as a ps of a one-worker
 * cluster drives it, without the wire. */
#include "train/local_tables.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/bytes.h"
#include "worker/sparse_client.h"

#define PAGE_FLOATS (1u << 18) /* an export's page: as a ps's SPARSE_PAGE at most */

struct dt_local_tables {
    dt_net *net;
    int n;
    dt_lazy_config opt;
    uint64_t seed;
    dt_table **t;             /* [n] */
    uint64_t *ids;            /* [cap] a table's touched rows' ids, one update's */
    size_t cap;
    uint8_t *buf;             /* [buf_cap] a restore's rows as a SPARSE_IMPORT's payload, to check */
    size_t buf_cap;
};

/* The fill callback: each block's ids' rows from their table (an id without a row: its initial values,
 * as a ps answers a pull). */
static int fill(void *user, dt_net *net, int training, dt_error *err) {
    (void)training, (void)err;
    dt_local_tables *lt = user;
    for (int t = 0; t < lt->n; t++) {
        dt_table_block b;
        dt_net_table_block(net, t, &b);
        dt_table_read_n(lt->t[t], b.ids, b.n, b.rows);
    }
    return DT_OK;
}

int dt_local_tables_create(dt_local_tables **out, dt_net *net, const dt_lazy_config *opt, uint64_t seed, int64_t step,
                           dt_error *err) {
    *out = NULL;
    if (!dt_net_compact_tables(net)) return dt_errorf(err, DT_EINVAL, "local tables: the net's tables are not compact");
    dt_local_tables *lt = dt_calloc(1, sizeof *lt, "tables", err);
    if (!lt) return DT_ENOMEM;
    lt->net = net, lt->n = dt_net_num_tables(net), lt->opt = *opt, lt->seed = seed;
    lt->t = dt_calloc(lt->n > 0 ? (size_t)lt->n : 1, sizeof *lt->t, "tables", err);
    int rc = lt->t ? DT_OK : DT_ENOMEM;
    for (int t = 0; t < lt->n && !rc; t++) {
        dt_wire_table w;
        dt_table_config c;
        if ((rc = dt_table_record_of(dt_net_spec(net), t, opt, seed, &w, err))) break;
        dt_table_config_from_wire(&c, &w);
        if (!(rc = dt_table_new(&lt->t[t], &c, err))) dt_table_set_step(lt->t[t], step);
    }
    if (rc) {
        dt_local_tables_free(lt);
        return rc;
    }
    dt_net_set_table_fill(net, fill, lt);
    *out = lt;
    return DT_OK;
}

void dt_local_tables_free(dt_local_tables *lt) {
    if (!lt) return;
    dt_net_set_table_fill(lt->net, NULL, NULL);
    for (int t = 0; lt->t && t < lt->n; t++) dt_table_free(lt->t[t]);
    free(lt->t), free(lt->ids), free(lt->buf), free(lt);
}

int dt_local_tables_apply(dt_local_tables *lt, dt_error *err) {
    for (int t = 0; t < lt->n; t++) {
        dt_table_grad g;
        dt_table_block b;
        dt_net_table_grad(lt->net, t, &g);
        dt_net_table_block(lt->net, t, &b);
        if (g.n > lt->cap) {
            free(lt->ids);
            lt->cap = 0;
            if (!(lt->ids = dt_calloc(g.n, sizeof *lt->ids, "table ids", err))) return DT_ENOMEM;
            lt->cap = g.n;
        }
        /* the gradient's rows are slots of the block: their ids, in the gradient's order (a push's) */
        for (size_t i = 0; i < g.n; i++) lt->ids[i] = b.ids[g.rows[i]];
        dt_table_apply(lt->t[t], lt->ids, g.grad, g.n);
    }
    return DT_OK;
}

void dt_local_tables_set_step(dt_local_tables *lt, int64_t step) {
    for (int t = 0; t < lt->n; t++) dt_table_set_step(lt->t[t], step);
}

void dt_local_tables_report(const dt_local_tables *lt, FILE *log) {
    dt_table_stats sum = {0};
    size_t bytes = 0;
    for (int t = 0; t < lt->n; t++) {
        dt_table_stats s;
        dt_table_get_stats(lt->t[t], &s);
        sum.rows += s.rows, sum.admitted += s.admitted, sum.expired += s.expired, sum.evicted += s.evicted;
        sum.not_admitted += s.not_admitted, sum.nomem += s.nomem;
        bytes += dt_table_bytes(lt->t[t]);
    }
    fprintf(log, "tables: %d, rows held %llu, admitted %llu, evicted %llu (expired %llu, least recently used %llu), "
            "not admitted %llu, dropped for want of memory %llu, %.1f MiB\n", lt->n, (unsigned long long)sum.rows,
            (unsigned long long)sum.admitted, (unsigned long long)(sum.expired + sum.evicted),
            (unsigned long long)sum.expired, (unsigned long long)sum.evicted, (unsigned long long)sum.not_admitted,
            (unsigned long long)sum.nomem, (double)bytes / 1048576.0);
}

/* ---- the checkpoint's rows' place (table_ckpt.h) ---- */

static int io_record(void *user, int t, dt_wire_table *w, dt_error *err) {
    dt_local_tables *lt = user;
    return dt_table_record_of(dt_net_spec(lt->net), t, &lt->opt, lt->seed, w, err);
}

/* Table t's rows, page by page as a ps sends them (SPARSE_PAGE's layout: dt_wire_rows). */
static int io_export(void *user, int t, dt_sparse_page_fn put, void *put_user, dt_error *err) {
    dt_local_tables *lt = user;
    if (t < 0 || t >= lt->n) return dt_errorf(err, DT_EINVAL, "local tables: no table %d", t);
    const dt_table_config *c = dt_table_config_of(lt->t[t]);
    const size_t k = dt_table_row_floats(c), per = PAGE_FLOATS / k ? PAGE_FLOATS / k : 1;
    uint64_t *ids = dt_calloc(per, sizeof *ids, "table page", err);
    uint8_t *id_bytes = dt_malloc(per * 8, "table page", err);
    float *rows = dt_alloc_floats(per * k, "table page", err);
    int rc = ids && id_bytes && rows ? DT_OK : DT_ENOMEM;
    uint64_t cursor = 0;
    for (size_t n = per; !rc && n == per;) {
        if (!(n = dt_table_export(lt->t[t], &cursor, per, ids, rows))) break;
        for (size_t i = 0; i < n; i++) dt_put_u64(id_bytes + 8 * i, ids[i]);
        const dt_wire_rows page = {.n = n, .dim = (size_t)c->dim, .slots = (size_t)dt_lazy_slots(c->opt.kind),
                                   .ids = id_bytes, .rows = (const uint8_t *)rows};
        rc = put(put_user, t, &page, dt_table_step(lt->t[t]), err);
    }
    free(ids), free(id_bytes), free(rows);
    return rc;
}

/* Rows of a checkpoint: checked as a ps checks a SPARSE_IMPORT's (dt_wire_rows_check: ids below a
 * hashed table's rows, values finite, slots in their optimizer's range), then set whole. */
static int io_import(void *user, int t, const uint64_t *ids, const float *rows, size_t n, dt_error *err) {
    dt_local_tables *lt = user;
    if (t < 0 || t >= lt->n) return dt_errorf(err, DT_EINVAL, "local tables: no table %d", t);
    const dt_table_config *c = dt_table_config_of(lt->t[t]);
    const size_t k = dt_table_row_floats(c), bytes = n * (8 + 4 * k);
    if (bytes > lt->buf_cap) {
        free(lt->buf);
        lt->buf_cap = 0;
        if (!(lt->buf = dt_malloc(bytes, "checkpoint rows", err))) return DT_ENOMEM;
        lt->buf_cap = bytes;
    }
    for (size_t i = 0; i < n; i++) dt_put_u64(lt->buf + 8 * i, ids[i]);
    if (n) memcpy(lt->buf + 8 * n, rows, 4 * k * n); /* host order: little-endian, as on the wire */
    dt_wire_header h = dt_wire_header_make(DT_MSG_SPARSE_IMPORT, 0, 0, 0);
    h.sparse.table = (uint64_t)t, h.sparse.ids = n, h.sparse.dim = (uint64_t)c->dim;
    h.opt_kind = (uint8_t)c->opt.kind, h.opt_slots = (uint8_t)dt_lazy_slots(c->opt.kind);
    dt_wire_rows checked;
    const int64_t buckets = dt_net_table_rows(lt->net, t); /* 0: unbounded ids, any id */
    int rc = dt_wire_rows_check(&checked, &h, lt->buf, bytes, buckets > 0 ? (uint64_t)buckets : 0, err);
    if (rc) return dt_error_wrap(err, rc, "checkpoint rows of table %d: ", t);
    for (size_t i = 0; i < n; i++)
        if (dt_table_import(lt->t[t], ids[i], rows + i * k))
            return dt_errorf(err, DT_ENOMEM, "out of memory for the rows of table %d: %zu of %zu imported", t, i, n);
    return DT_OK;
}

dt_table_io dt_local_tables_io(dt_local_tables *lt) { return (dt_table_io){io_record, io_export, io_import, lt}; }
