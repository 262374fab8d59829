/* A worker's side of the sparse tables on the ps tasks (docs/sparse.md, "On a worker"): a compact
 * net's embedding tables (model/net.h, dt_net_build_compact) live on the ps tasks, each row on the
 * ps dt_row_ps names. Per step the net lists each table's unique ids in the batch; this client
 * pulls exactly those rows (SPARSE_PULL, split by ps: one message per ps for all tables, a section
 * per table) into the net's blocks before the forward, and after the backward pushes each touched
 * row's summed gradient with its id (SPARSE_PUSH, the same way). The chief declares the tables
 * (SPARSE_INIT) after every INIT.
 *
 * Sync replicas: the rows are pulled at the tables' step t (the pull waits until the ps has applied
 * step t - 1), the push is for step t, sent to every ps naming every table in each of its parts (a
 * section without ids where the batch had none there: the ps counts a replica's push whole).
 * Async: pulls take the rows as they are, each section of a push is one update of its table.
 *
 * It shares the dense updater's ps client (one exchange at a time): its calls go between the dense
 * exchanges, never under one (--overlap is refused with sparse tables). The next batch's rows are
 * pulled ahead by a second, detached client on a connection of its own (worker/sparse_prefetch.h).
 * Not thread-safe. */
#ifndef DT_WORKER_SPARSE_CLIENT_H
#define DT_WORKER_SPARSE_CLIENT_H

#include <stdint.h>

#include "compute/lazy_optim.h"
#include "model/net.h"
#include "worker/ps_client.h"

typedef struct dt_sparse_client dt_sparse_client;

typedef struct {
    dt_ps_client *client;     /* the updater's; not owned */
    int sync;                 /* sync replicas: pushes carry SYNC and the tables' step */
    dt_lazy_config opt;       /* every table's optimizer (train/table_optim.h) */
    uint64_t seed;            /* the tables' initial rows (a function of seed, table, id) */
    /* --compression: rows pulled and gradient rows pushed in this 16-bit encoding (ids stay u64),
     * packed and unpacked by transport/compress.h as the dense path's are; DT_ENC_FP32: float32.
     * The gradient rows carry no error feedback: its residual would be one row per id ever pushed,
     * memory that follows the table, which a worker never holds (docs/sparse.md). */
    dt_encoding encoding;
    /* A client of prefetched pulls (worker/sparse_prefetch.h): it leaves the net's fill callback
     * alone and pulls only with dt_sparse_pull_send into the caller's buffers. */
    int detached;
} dt_sparse_config;

/* Totals over the client's life. */
typedef struct {
    uint64_t pulls, pushes;           /* calls (training and evaluation pulls) */
    uint64_t rows_pulled, rows_pushed;/* ids sent in SPARSE_PULLs, in SPARSE_PUSHes */
    uint64_t messages;                /* SPARSE_PULLs and SPARSE_PUSHes sent (each answered once; one per
                                       * ps and call for all tables, more only at a message's bounds) */
    uint64_t sections;                /* their sections (8 bytes of record each, up) */
    uint64_t stale;                   /* SPARSE_PUSHes a sync ps answered STALE (some section stale) */
    uint64_t saturated;               /* fp16: finite gradient values beyond +-65504 sent as +-65504 */
} dt_sparse_stats;

/* For a compact net (its tables: dt_net_num_tables); sets the net's fill callback to pull. */
int dt_sparse_client_create(dt_sparse_client **out, const dt_sparse_config *cfg, dt_net *net, dt_error *err);
void dt_sparse_client_free(dt_sparse_client *s); /* also unsets the net's fill callback */

/* Chief, after INIT: SPARSE_INIT of every table to every ps, the tables at step `step` (INIT's: 0, or
 * a checkpoint's, whose tables are then imported). importing: a checkpoint's rows follow
 * (dt_sparse_import, then dt_sparse_import_end), and until then every ps holds every SPARSE_PULL, so
 * no worker reads a table before it is whole. Refuses (DT_EINVAL, naming the layer) an embedding
 * whose initialiser the ps cannot draw. */
int dt_sparse_declare(dt_sparse_client *s, int64_t step, int importing, dt_error *err);
/* A worker other than the chief, once the ps tasks are initialised: waits (up to timeout_ms) until
 * every ps holds the tables (the chief declares them just after its INIT). */
int dt_sparse_wait_declared(dt_sparse_client *s, int timeout_ms, dt_error *err);
/* The net's blocks, as its last dt_net_forward_ctr listed them, from the ps tasks (the fill
 * callback; training 0: an evaluation batch, which does not set the step a push is for). */
int dt_sparse_pull(dt_sparse_client *s, int training, dt_error *err);
/* A pull in two halves, its rows travelling while the caller computes (worker/sparse_prefetch.h):
 * tabs[t] (every table) names ids and the rows [n, dim] they go to; step: the oldest step wanted
 * (sync: the rows' step, the ps holding the pull until every table it names is there; async 0).
 * send returns once the messages are out (its client then has the call under way: no other call
 * on that client until end); end waits for the rows (abandon: does not, and drops them) and gives
 * the oldest step a reply reported (-1: none). One pull under way at a time. */
typedef struct {
    const uint64_t *ids;
    size_t n;
    float *rows;
} dt_sparse_rows;
int dt_sparse_pull_send(dt_sparse_client *s, const dt_sparse_rows *tabs, int64_t step, dt_error *err);
int dt_sparse_pull_end(dt_sparse_client *s, int abandon, int64_t *reply_step, dt_error *err);
/* The net's blocks were filled with rows another client prefetched, whose replies reported
 * reply_step at the oldest: the step the next push is for, as dt_sparse_pull would set it. */
void dt_sparse_prefetched(dt_sparse_client *s, int64_t reply_step);
/* The step a pull of the next training batch must ask for (sync: one past the rows just pulled,
 * which this worker's next push is for; async 0). */
int64_t dt_sparse_next_want(const dt_sparse_client *s);
/* The last backward's table gradients (dt_net_table_grad) to the ps tasks. */
int dt_sparse_push(dt_sparse_client *s, dt_error *err);
/* Checkpoints (docs/sparse.md, "Checkpoints"). Table t's record as dt_sparse_declare sends it (dim,
 * optimizer, initialiser, capacity: the table's rows, seed). */
int dt_sparse_table_record(const dt_sparse_client *s, int t, dt_wire_table *w, dt_error *err);
/* The same record from the model alone: table t of spec, with every table's optimizer opt and the
 * rows' seed (one process's tables are made from it too: train/local_tables.h). */
int dt_table_record_of(const dt_model_spec *spec, int t, const dt_lazy_config *opt, uint64_t seed, dt_wire_table *w,
                       dt_error *err);
/* A page of table t's rows from one ps (ids below the table's rows, values finite, slots in range:
 * dt_wire_rows_check), at the table's step on that ps. */
typedef int (*dt_sparse_page_fn)(void *user, int t, const dt_wire_rows *page, int64_t step, dt_error *err);
/* Every row table t's ps tasks hold, to put page by page: each ps walked from cursor 0 (SPARSE_EXPORT)
 * until it says none is left, all ps at once. A page holds at most 2^18 floats of rows and their ids
 * (1.5 MiB): the caller holds at most one per ps at a time. A walk the ps starts again (its rows
 * moved: ps/table.h, dt_table_layout) sends rows again, the later copy the newer; at most 64 times, and no ps
 * sends more pages than its share of the table allows, else DT_EPROTO naming the ps. */
int dt_sparse_export(dt_sparse_client *s, int t, dt_sparse_page_fn put, void *user, dt_error *err);
/* Rows of table t to their homes under this client's ps count (dt_row_ps; SPARSE_IMPORT, answered
 * ACK): ids [n], rows [n][(1 + slots) dim] (values, then each slot), n at most
 * dt_wire_rows_per_msg x DT_WIRE_MAX_CHUNKS; one exchange. */
int dt_sparse_import(dt_sparse_client *s, int t, const uint64_t *ids, const float *rows, size_t n, dt_error *err);
/* Chief: the import that dt_sparse_declare(importing 1) began is over (SPARSE_IMPORT with LAST and no
 * row to every ps): the pulls the ps tasks held are answered. */
int dt_sparse_import_end(dt_sparse_client *s, dt_error *err);
/* The ps tasks were initialised again (the tables declared anew, at step 0). */
void dt_sparse_reset(dt_sparse_client *s);
const dt_sparse_stats *dt_sparse_get_stats(const dt_sparse_client *s);

#endif
