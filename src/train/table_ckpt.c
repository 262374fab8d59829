/* A cluster's sparse tables in its checkpoints (table_ckpt.h). */
#include "train/table_ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

static int plan_table(table_plan *p, const dt_table_io *s, const dt_net *net, int t, dt_error *err) {
    int rc = s->record(s->user, t, &p->w, err);
    if (rc) return rc;
    dt_table_config_from_wire(&p->c, &p->w);
    const int64_t rows = dt_net_table_rows(net, t); /* 0: unbounded ids */
    if (rows < 0) return dt_errorf(err, DT_EINVAL, "checkpoint: no table %d", t);
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

/* ---- A cluster's ps tasks as the rows' place ---------------------------------------------------- */

static int remote_record(void *user, int t, dt_wire_table *w, dt_error *err) {
    return dt_sparse_table_record(user, t, w, err);
}

static int remote_export(void *user, int t, dt_sparse_page_fn put, void *put_user, dt_error *err) {
    return dt_sparse_export(user, t, put, put_user, err);
}

static int remote_import(void *user, int t, const uint64_t *ids, const float *rows, size_t n, dt_error *err) {
    return dt_sparse_import(user, t, ids, rows, n, err);
}

dt_table_io dt_table_io_remote(dt_sparse_client *s) {
    return (dt_table_io){remote_record, remote_export, remote_import, s};
}

/* ---- Saving ------------------------------------------------------------------------------------- */

/* Unbounded tables, saved as the rows held: their pages spooled to a file (ids and rows, table after
 * table) before the checkpoint's header, which needs each table's row count, is written. */
struct dt_table_spool {
    FILE *f;                  /* unlinked at once: it goes when closed, or with the process */
    int n_tables;
    uint64_t *first, *rows;   /* [n_tables] each table's first byte in the file and rows */
    dt_table_ckpt_stats st;   /* the pages' steps and rows */
};

void dt_table_spool_free(dt_table_spool *sp) {
    if (!sp) return;
    if (sp->f) fclose(sp->f);
    free(sp->first), free(sp->rows), free(sp);
}

typedef struct {
    dt_ckpt_sink *sink;       /* bounded tables: the rows go there */
    dt_table_spool *spool;    /* unbounded ones: to the spool */
    size_t k;                 /* floats per row (spooling) */
    float *row;               /* [k] one row of a page */
    dt_table_ckpt_stats *st;
} save_ctx;

static int put_page(void *user, int t, const dt_wire_rows *page, int64_t step, dt_error *err) {
    save_ctx *x = user;
    for (size_t i = 0; i < page->n; i++) {
        dt_wire_rows_get(page, i, x->row);
        const uint64_t id = dt_wire_rows_id(page, i);
        int rc = DT_OK;
        if (!x->spool) rc = dt_ckpt_put_row(x->sink, t, id, x->row, err);
        else if (fwrite(&id, 8, 1, x->spool->f) != 1 || fwrite(x->row, 4, x->k, x->spool->f) != x->k)
            rc = dt_errorf(err, DT_EIO, "checkpoint: cannot spool table %d's rows (disk full?)", t);
        if (rc) return rc;
    }
    x->st->rows += page->n;
    if (x->st->step_lo < 0 || step < x->st->step_lo) x->st->step_lo = step;
    if (step > x->st->step_hi) x->st->step_hi = step;
    return DT_OK;
}

/* A spool file in logdir (the checkpoint's file system, which needs the room anyway), unlinked. */
static FILE *spool_open(const char *logdir, dt_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/.table-spool-XXXXXX", logdir);
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w+b") : NULL;
    if (fd >= 0) unlink(path);
    if (!f) {
        if (fd >= 0) close(fd);
        dt_errorf(err, DT_EIO, "checkpoint: cannot create a spool file in %s", logdir);
    }
    return f;
}

int dt_table_ckpt_prepare(const dt_table_io *s, const dt_net *net, const char *logdir, uint64_t *held,
                          dt_table_spool **out, dt_error *err) {
    const int n = dt_net_num_tables(net);
    dt_table_spool *sp = *out = dt_calloc(1, sizeof *sp, "table spool", err);
    if (!sp) return DT_ENOMEM;
    sp->n_tables = n;
    sp->st = (dt_table_ckpt_stats){.step_lo = -1, .step_hi = -1};
    sp->first = dt_calloc((size_t)n + 1, sizeof *sp->first, "table spool", err);
    sp->rows = dt_calloc((size_t)n + 1, sizeof *sp->rows, "table spool", err);
    float *row = dt_alloc_floats(DT_WIRE_MAX_SPARSE_DIM * (1 + DT_LAZY_MAX_SLOTS), "checkpoint row", err);
    int rc = sp->first && sp->rows && row ? DT_OK : DT_ENOMEM;
    if (!rc && !(sp->f = spool_open(logdir, err))) rc = DT_EIO;
    for (int t = 0; t < n && !rc; t++) {
        table_plan p;
        if ((rc = plan_table(&p, s, net, t, err)) || p.rows) continue;
        save_ctx x = {.spool = sp, .k = p.k, .row = row, .st = &sp->st};
        const uint64_t before = sp->st.rows;
        const off_t at = ftello(sp->f);
        sp->first[t] = at > 0 ? (uint64_t)at : 0;
        rc = s->export_rows(s->user, t, put_page, &x, err);
        held[t] = sp->rows[t] = sp->st.rows - before;
    }
    free(row);
    if (!rc && fflush(sp->f)) rc = dt_errorf(err, DT_EIO, "checkpoint: cannot spool the tables' rows (disk full?)");
    return rc;
}

/* Unbounded table t from the spool into the file: its ids and rows, a range at a time. */
static int unspool_table(dt_table_spool *sp, const table_plan *p, int t, dt_ckpt_sink *sink, float *buf,
                         uint64_t *ids, dt_error *err) {
    int rc = fseeko(sp->f, (off_t)sp->first[t], SEEK_SET) ? dt_errorf(err, DT_EIO, "checkpoint: cannot seek in the "
                                                                      "tables' spool file") : DT_OK;
    for (uint64_t first = 0; !rc && first < sp->rows[t]; first += p->per) {
        const size_t n = sp->rows[t] - first < p->per ? (size_t)(sp->rows[t] - first) : p->per;
        for (size_t i = 0; i < n && !rc; i++)
            if (fread(ids + i, 8, 1, sp->f) != 1 || fread(buf + i * p->k, 4, p->k, sp->f) != p->k)
                rc = dt_errorf(err, DT_EIO, "checkpoint: cannot read table %d's spooled rows back", t);
        if (!rc) rc = dt_ckpt_put_ids(sink, t, first, n, ids, err);
        if (!rc) rc = dt_ckpt_put_range(sink, t, first, n, buf, err);
    }
    return rc;
}

/* Table t: every row at its initial values, range by range, then the ps tasks' rows over them; an
 * unbounded table: its spooled rows. */
static int save_table(const dt_table_io *s, const dt_net *net, int t, save_ctx *x, dt_table_spool *spool, float *buf,
                      uint64_t *ids, dt_error *err) {
    table_plan p;
    int rc = plan_table(&p, s, net, t, err);
    if (!rc && !p.rows)
        return spool ? unspool_table(spool, &p, t, x->sink, buf, ids, err)
                     : dt_errorf(err, DT_EINVAL, "checkpoint: table %d of unbounded ids was not spooled", t);
    for (uint64_t first = 0; !rc && first < p.rows; first += p.per) {
        const size_t n = p.rows - first < p.per ? (size_t)(p.rows - first) : p.per;
        for (size_t i = 0; i < n; i++) initial_row(&p, first + i, buf + i * p.k);
        rc = dt_ckpt_put_range(x->sink, t, first, n, buf, err);
    }
    return rc ? rc : s->export_rows(s->user, t, put_page, x, err);
}

int dt_table_ckpt_save(const dt_table_io *s, const dt_net *net, dt_ckpt_sink *sink, dt_table_spool *spool,
                       dt_table_ckpt_stats *st, dt_error *err) {
    *st = spool ? spool->st : (dt_table_ckpt_stats){.step_lo = -1, .step_hi = -1};
    /* a range of RANGE_FLOATS, or one row when a row is larger */
    float *buf = dt_alloc_floats(RANGE_FLOATS + DT_WIRE_MAX_SPARSE_DIM * (1 + DT_LAZY_MAX_SLOTS), "checkpoint rows",
                                 err);
    float *row = dt_alloc_floats(DT_WIRE_MAX_SPARSE_DIM * (1 + DT_LAZY_MAX_SLOTS), "checkpoint row", err);
    uint64_t *ids = dt_calloc(RANGE_FLOATS, sizeof *ids, "checkpoint ids", err);
    save_ctx x = {.sink = sink, .row = row, .st = st}; /* bounded tables' pages: to the sink */
    int rc = buf && row && ids ? DT_OK : DT_ENOMEM;
    for (int t = 0; t < dt_net_num_tables(net) && !rc; t++) rc = save_table(s, net, t, &x, spool, buf, ids, err);
    free(buf), free(row), free(ids);
    return rc;
}

/* ---- Restoring ---------------------------------------------------------------------------------- */

typedef struct {
    float *rows, *sent, *init; /* [per * k] a range as read; [per * k] the rows that differ; [k] */
    uint64_t *ids;             /* [per] their ids */
} restore_bufs;

/* Unbounded table t: range by range, every row the file holds, to its ps task. */
static int restore_held(const dt_table_io *s, const dt_st_file *f, const char *label, const dt_ckpt_run *run, int t,
                        const table_plan *p, restore_bufs *b, dt_table_ckpt_stats *st, dt_error *err) {
    uint64_t held;
    int rc = dt_ckpt_held_rows(f, run, t, &held) ? dt_errorf(err, DT_EFORMAT, "%s: no ids of table %d", label, t) : DT_OK;
    for (uint64_t first = 0; !rc && first < held; first += p->per) {
        const size_t n = held - first < p->per ? (size_t)(held - first) : p->per;
        if (!(rc = dt_ckpt_read_ids(f, label, run, t, first, n, b->ids, err)) &&
            !(rc = dt_ckpt_read_rows(f, label, run, t, first, n, b->rows, err)))
            rc = s->import_rows(s->user, t, b->ids, b->rows, n, err);
        st->rows += n;
    }
    return rc;
}

/* Table t: range by range, the rows that are not their initial values, to their ps tasks. */
static int restore_table(const dt_table_io *s, const dt_st_file *f, const char *label, const dt_ckpt_run *run, int t,
                         restore_bufs *b, dt_table_ckpt_stats *st, dt_error *err) {
    table_plan p;
    int rc = plan_table(&p, s, run->net, t, err);
    /* a range is one SPARSE_IMPORT at most per ps */
    const size_t per_msg = dt_wire_rows_per_msg(p.w.dim, (size_t)dt_lazy_slots(p.w.opt.kind));
    if (!rc && p.per > per_msg) p.per = per_msg;
    if (!rc && !p.rows) return restore_held(s, f, label, run, t, &p, b, st, err);
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
        rc = s->import_rows(s->user, t, b->ids, b->sent, m, err);
        st->rows += m;
    }
    return rc;
}

int dt_table_ckpt_restore(const dt_table_io *s, const dt_st_file *f, const char *label, const dt_ckpt_run *run,
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
