/* A cluster's sparse tables in its checkpoints (docs/checkpoint-format.md, "Sparse tables"; docs/sparse.md,
 * "Checkpoints"). The chief saves each table as one process does, [rows, dim] and its optimizer's
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

typedef struct {
    uint64_t rows;            /* saving: rows fetched from the ps tasks; restoring: rows sent to them */
    int64_t step_lo, step_hi; /* saving: the tables' steps their pages came at (-1: no page) */
} dt_table_ckpt_stats;

/* Every table of net (a compact net, whose tables s declared) into the checkpoint being written. */
int dt_table_ckpt_save(dt_sparse_client *s, const dt_net *net, dt_ckpt_sink *sink, dt_table_ckpt_stats *st,
                       dt_error *err);
/* Every table of an open checkpoint that fits run (run->net: the compact net; run->tables: its
 * optimizer) into the ps tasks, after s declared the tables. */
int dt_table_ckpt_restore(dt_sparse_client *s, const dt_st_file *f, const char *label, const dt_ckpt_run *run,
                          dt_table_ckpt_stats *st, dt_error *err);

#endif
