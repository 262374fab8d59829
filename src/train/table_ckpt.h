/* A compact net's sparse tables in its checkpoints, a cluster's or one process's (docs/checkpoint-format.md,
 * "Sparse tables"; docs/sparse.md, "Checkpoints"). The chief saves each table as one process does, [rows, dim] and its optimizer's
 * slots: every row its initial values and slots first (a function of the seed, the table and the id:
 * ps/table.h), then the rows the ps tasks hold over them, fetched page by page (SPARSE_EXPORT). A
 * restore sends each row of the file that differs from its initial values and slots to its home under
 * the current ps count (SPARSE_IMPORT), once the tables are declared: a row left out reads on the ps
 * as exactly what the file holds.
 *
 * Memory: the chief holds at most 1 MiB of rows read or written at a time, and, saving, one page per
 * ps task (at most 1.5 MiB each); never a whole table. */
#ifndef DT_TRAIN_TABLE_CKPT_H
#define DT_TRAIN_TABLE_CKPT_H

#include <stdint.h>

#include "supervisor/checkpoint.h"
#include "worker/sparse_client.h"

/* Where the tables' rows live: a cluster's ps tasks (dt_table_io_remote: SPARSE_EXPORT, SPARSE_IMPORT) or
 * one process's own tables (train/local_tables.h); the record is table t's as SPARSE_INIT declares it,
 * export hands every row held to put page by page (at most 2^18 floats a page), import sets n rows
 * (n at most dt_wire_rows_per_msg: one message's). */
typedef struct {
    int (*record)(void *user, int t, dt_wire_table *w, dt_error *err);
    int (*export_rows)(void *user, int t, dt_sparse_page_fn put, void *put_user, dt_error *err);
    int (*import_rows)(void *user, int t, const uint64_t *ids, const float *rows, size_t n, dt_error *err);
    void *user;
} dt_table_io;
dt_table_io dt_table_io_remote(dt_sparse_client *s);

typedef struct {
    uint64_t rows;            /* saving: rows fetched from the ps tasks; restoring: rows sent to them */
    int64_t step_lo, step_hi; /* saving: the tables' steps their pages came at (-1: no page) */
} dt_table_ckpt_stats;

/* Tables of unbounded ids (dt_net_table_rows 0) are saved as the rows the ps tasks hold (ids, rows,
 * slots), a number the checkpoint's header needs first: dt_table_ckpt_prepare exports them into a
 * spool file in logdir (unlinked at once: it goes when freed, or with the process) and sets held[t],
 * before the file is begun (dt_ckpt_run.table_prepare); dt_table_ckpt_save then copies them from it.
 * The spool holds each row once per walk of its ps (a walk the ps starts again sends rows again: the
 * later copy, the newer, wins at a restore, which imports rows in file order). */
typedef struct dt_table_spool dt_table_spool;
int dt_table_ckpt_prepare(const dt_table_io *s, const dt_net *net, const char *logdir, uint64_t *held,
                          dt_table_spool **out, dt_error *err);
void dt_table_spool_free(dt_table_spool *sp);
/* Every table of net (a compact net, whose tables s declared) into the checkpoint being written;
 * spool: dt_table_ckpt_prepare's (NULL without tables of unbounded ids). */
int dt_table_ckpt_save(const dt_table_io *s, const dt_net *net, dt_ckpt_sink *sink, dt_table_spool *spool,
                       dt_table_ckpt_stats *st, dt_error *err);
/* Every table of an open checkpoint that fits run (run->net: the compact net; run->tables: its
 * optimizer) into the ps tasks, after s declared the tables: a bounded table's rows that differ from
 * their initial values, an unbounded table's every row, each to its home under s's ps count. */
int dt_table_ckpt_restore(const dt_table_io *s, const dt_st_file *f, const char *label, const dt_ckpt_run *run,
                          dt_table_ckpt_stats *st, dt_error *err);

#endif
