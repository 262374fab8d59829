/* A cluster's sparse tables in its checkpoints (table_ckpt.h). */
#include "train/table_ckpt.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "ps/table.h"

#define RANGE_FLOATS (1u << 18) /* rows read or written at a time: 1 MiB of floats */

/* Table t's record (as SPARSE_INIT declared it) and its rows, floats per row and rows per range. */
typedef struct {
    dt_wire_table w;
    dt_table_config c;
    uint64_t rows;
    size_t k, per;
} table_plan;

static int plan_table(table_plan *p, dt_sparse_client *s, const dt_net *net, int t, dt_error *err) {
    int rc = dt_sparse_table_record(s, t, &p->w, err);
    if (rc) return rc;
    dt_table_config_from_wire(&p->c, &p->w);
    const int64_t rows = dt_net_table_rows(net, t);
    if (rows < 1) return dt_errorf(err, DT_EINVAL, "checkpoint: table %d has no rows", t);
    p->rows = (uint64_t)rows;
    p->k = (size_t)p->w.dim * (1 + (size_t)dt_lazy_slots(p->w.opt.kind));
    p->per = RANGE_FLOATS / p->k ? RANGE_FLOATS / p->k : 1;
    return DT_OK;
}

/* Row id's initial values and slots into row [k]: what the ps reads for an id without a row. */
static void initial_row(const table_plan *p, uint64_t id, float *row) {
    dt_table_init_row(&p->c, id, row);
    dt_lazy_init_slots(&p->c.opt, row + p->w.dim, (int)p->w.dim);
}

/* ---- Saving ------------------------------------------------------------------------------------- */

typedef struct {
    dt_ckpt_sink *sink;
    float *row;               /* [k] one row of a page */
    dt_table_ckpt_stats *st;
} save_ctx;

static int put_page(void *user, int t, const dt_wire_rows *page, int64_t step, dt_error *err) {
    save_ctx *x = user;
    for (size_t i = 0; i < page->n; i++) {
        dt_wire_rows_get(page, i, x->row);
        int rc = dt_ckpt_put_row(x->sink, t, dt_wire_rows_id(page, i), x->row, err);
        if (rc) return rc;
    }
    x->st->rows += page->n;
    if (x->st->step_lo < 0 || step < x->st->step_lo) x->st->step_lo = step;
    if (step > x->st->step_hi) x->st->step_hi = step;
    return DT_OK;
}

/* Table t: every row at its initial values, range by range, then the ps tasks' rows over them. */
static int save_table(dt_sparse_client *s, const dt_net *net, int t, save_ctx *x, float *buf, dt_error *err) {
    table_plan p;
    int rc = plan_table(&p, s, net, t, err);
    for (uint64_t first = 0; !rc && first < p.rows; first += p.per) {
        const size_t n = p.rows - first < p.per ? (size_t)(p.rows - first) : p.per;
        for (size_t i = 0; i < n; i++) initial_row(&p, first + i, buf + i * p.k);
        rc = dt_ckpt_put_range(x->sink, t, first, n, buf, err);
    }
    return rc ? rc : dt_sparse_export(s, t, put_page, x, err);
}

int dt_table_ckpt_save(dt_sparse_client *s, const dt_net *net, dt_ckpt_sink *sink, dt_table_ckpt_stats *st,
                       dt_error *err) {
    *st = (dt_table_ckpt_stats){.step_lo = -1, .step_hi = -1};
    /* a range of RANGE_FLOATS, or one row when a row is larger */
    float *buf = dt_alloc_floats(RANGE_FLOATS + DT_WIRE_MAX_SPARSE_DIM * (1 + DT_LAZY_MAX_SLOTS), "checkpoint rows",
                                 err);
    float *row = dt_alloc_floats(DT_WIRE_MAX_SPARSE_DIM * (1 + DT_LAZY_MAX_SLOTS), "checkpoint row", err);
    save_ctx x = {.sink = sink, .row = row, .st = st};
    int rc = buf && row ? DT_OK : DT_ENOMEM;
    for (int t = 0; t < dt_net_num_tables(net) && !rc; t++) rc = save_table(s, net, t, &x, buf, err);
    free(buf), free(row);
    return rc;
}

/* ---- Restoring ---------------------------------------------------------------------------------- */

typedef struct {
    float *rows, *sent, *init; /* [per * k] a range as read; [per * k] the rows that differ; [k] */
    uint64_t *ids;             /* [per] their ids */
} restore_bufs;

/* Table t: range by range, the rows that are not their initial values, to their ps tasks. */
static int restore_table(dt_sparse_client *s, const dt_st_file *f, const char *label, const dt_ckpt_run *run, int t,
                         restore_bufs *b, dt_table_ckpt_stats *st, dt_error *err) {
    table_plan p;
    int rc = plan_table(&p, s, run->net, t, err);
    /* a range is one SPARSE_IMPORT at most per ps */
    const size_t per_msg = dt_wire_rows_per_msg(p.w.dim, (size_t)dt_lazy_slots(p.w.opt.kind));
    if (!rc && p.per > per_msg) p.per = per_msg;
    for (uint64_t first = 0; !rc && first < p.rows; first += p.per) {
        const size_t n = p.rows - first < p.per ? (size_t)(p.rows - first) : p.per;
        if ((rc = dt_ckpt_read_rows(f, label, run, t, first, n, b->rows, err))) break;
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            initial_row(&p, first + i, b->init);
            if (!memcmp(b->init, b->rows + i * p.k, p.k * sizeof(float))) continue; /* the ps reads it so */
            b->ids[m] = first + i;
            memcpy(b->sent + m * p.k, b->rows + i * p.k, p.k * sizeof(float));
            m++;
        }
        rc = dt_sparse_import(s, t, b->ids, b->sent, m, err);
        st->rows += m;
    }
    return rc;
}

int dt_table_ckpt_restore(dt_sparse_client *s, const dt_st_file *f, const char *label, const dt_ckpt_run *run,
                          dt_table_ckpt_stats *st, dt_error *err) {
    *st = (dt_table_ckpt_stats){.step_lo = -1, .step_hi = -1};
    const size_t most = RANGE_FLOATS + DT_WIRE_MAX_SPARSE_DIM * (1 + DT_LAZY_MAX_SLOTS);
    restore_bufs b = {.rows = dt_alloc_floats(most, "checkpoint rows", err),
                      .sent = dt_alloc_floats(most, "checkpoint rows", err),
                      .init = dt_alloc_floats(DT_WIRE_MAX_SPARSE_DIM * (1 + DT_LAZY_MAX_SLOTS), "checkpoint row", err),
                      .ids = dt_calloc(RANGE_FLOATS, sizeof(uint64_t), "checkpoint ids", err)};
    int rc = b.rows && b.sent && b.init && b.ids ? DT_OK : DT_ENOMEM;
    for (int t = 0; t < dt_net_num_tables(run->net) && !rc; t++) rc = restore_table(s, f, label, run, t, &b, st, err);
    free(b.rows), free(b.sent), free(b.init), free(b.ids);
    return rc;
}
