/* One process's sparse tables (docs/sparse.md, "Unbounded ids"): a compact net (model/net.h,
 * dt_net_build_compact) whose tables live in this process, each a dt_table (ps/table.h) made from the
 * record SPARSE_INIT would declare (worker/sparse_client.h, dt_table_record_of), so one process trains
 * exactly as a cluster of one ps: before each forward the batch's unique ids read their rows (an id
 * without a row: its initial values) into the net's blocks, and each step's touched rows, their
 * gradients summed over the batch, are one dt_table_apply of each table, every table each step (a
 * sync push names every table).
 *
 * Memory: each table is bounded by its capacity as on a ps (dt_table_bytes_at); there is no
 * --ps_table_memory here, the process's memory is its own. Not thread-safe. */
#ifndef DT_TRAIN_LOCAL_TABLES_H
#define DT_TRAIN_LOCAL_TABLES_H

#include <stdint.h>
#include <stdio.h>

#include "ps/table.h"
#include "train/table_ckpt.h"

typedef struct dt_local_tables dt_local_tables;

/* Every table of a compact net, at step `step`, with optimizer opt and the rows' seed; sets the net's
 * fill callback to read them. DT_EINVAL naming the layer for an initialiser a table cannot draw. */
int dt_local_tables_create(dt_local_tables **out, dt_net *net, const dt_lazy_config *opt, uint64_t seed, int64_t step,
                           dt_error *err);
void dt_local_tables_free(dt_local_tables *lt); /* also unsets the net's fill callback */
/* The last backward's table gradients (dt_net_table_grad), one update of every table. */
int dt_local_tables_apply(dt_local_tables *lt, dt_error *err);
/* Every table's step (a restore: the checkpoint's). */
void dt_local_tables_set_step(dt_local_tables *lt, int64_t step);
/* The tables as a checkpoint's rows' place (train/table_ckpt.h). */
dt_table_io dt_local_tables_io(dt_local_tables *lt);
/* One line of the tables' totals (rows held, admitted, expired + evicted, not admitted, bytes) to log. */
void dt_local_tables_report(const dt_local_tables *lt, FILE *log);

#endif
