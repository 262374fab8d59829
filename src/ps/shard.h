/* One ps shard as a state machine: no sockets, no clock, no threads of its own.
 *
 * The shard holds its part of the parameters and their optimizer state, cut into chunks
 * (docs/protocol.md, "Chunks"); it applies gradients (asynchronously, or sync replicas with a
 * per-chunk barrier and counted stale gradients), holds PULLs for a later step (the barrier), and
 * counts silent workers as lost. Every input is a call: a request (ps_shard_request), a deadline
 * check (ps_shard_cron), a connection that closed (ps_shard_forget); the time is an argument.
 * Every output goes through the caller's ps_io: replies, and the admission of large replies
 * against the caller's memory budget. The event loop (ps.c) feeds it from the transport; the
 * unit tests (tests/test_shard.c) feed it directly.
 *
 * Requests are dispatched by a table of message kinds, each with the conditions it needs (the
 * shard initialised, the chunk cut as INIT said, a payload of the right size, the chief as
 * sender), checked before its handler runs (shard_requests.c). */
#ifndef DT_PS_SHARD_H
#define DT_PS_SHARD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dtrain.h"
#include "ps/coord.h"
#include "ps/table.h"
#include "transport/bytes.h"
#include "transport/wire.h"

typedef struct ps_shard ps_shard;

/* Deferred PULLs one connection may hold: every chunk of a step, and a few more. */
#define DT_PS_PENDING_PER_PEER ((int)DT_WIRE_MAX_CHUNKS + 4)

/* Who sent a request, as far as the shard cares. The caller owns it; the shard keeps a copy only
 * through ps_io.hold. */
typedef struct {
    const void *conn;         /* the connection (compared by address; NULL: unknown) */
    uint64_t serial;          /* its serial number: which connection pushes as which worker task */
    void *route;              /* the caller's: how to reach it (the transport's dt_route) */
    const char *addr;         /* its address for logs (borrowed; "?" or NULL when unknown) */
    int declared;             /* set by the shard for io.admit: the connection that latest pushed a
                               * gradient as one of the declared worker tasks (not a stranger) */
} ps_origin;

/* What the shard asks of its caller. */
typedef struct {
    void *user;
    /* A reply to `to`. payload: NULL for none; else consumed (released by the callee when done
     * with it, at once on failure). admitted: bytes of it counted by admit, to be given back when
     * it is released. h is the callee's to change (payload size). */
    void (*send)(void *user, const ps_origin *to, dt_wire_header *h, dt_bytes *payload, size_t admitted);
    /* Counts a large reply of `bytes` to `to` before it is built: 0 admitted, else refused (that
     * connection has too much unread, or the ps is at its memory budget: a stranger's reply, not
     * to->declared, at a smaller share of it) with why's text, which the shard sends as ERROR 106. */
    int (*admit)(void *user, const ps_origin *to, size_t bytes, char *why, size_t why_len);
    void (*unadmit)(void *user, const ps_origin *to, size_t bytes); /* gives back an admission unused */
    /* A copy of an origin kept for a later reply (a deferred PULL), and its release. */
    int (*hold)(void *user, const ps_origin *from, ps_origin *kept);
    void (*drop)(void *user, ps_origin *kept);
} ps_io;

typedef struct {
    int ps_index;             /* sent in every reply */
    int n_ps;                 /* ps tasks in the cluster: a sparse table's rows here are those whose
                               * dt_row_ps is ps_index (cluster/row_placement.h); 0: not checked */
    /* The most bytes what the chief declares may make the shard hold beyond its own values: the
     * sparse tables SPARSE_INIT declares, together, at their capacities (docs/sparse.md, "Memory"),
     * with their sync accumulators, and INIT's sync accumulators and per-worker counts; an INIT or
     * SPARSE_INIT past it is refused before anything is allocated. 0: not checked. */
    uint64_t table_memory;
    size_t shard_floats;      /* > 0 */
    const size_t *state_ranges; /* dt_ps_config's: floats that are state, not trained */
    int n_state_ranges;
    FILE *log;                /* one line per notable event; NULL: quiet */
} ps_shard_config;

/* Counts for the stats, the logs and the metrics. */
typedef struct {
    int64_t step;             /* updates every chunk has had */
    uint64_t pushes, updates, pulls, refused, stale;
    uint64_t weighted;        /* sync steps whose gradients differed in examples: a weighted mean */
    int pending;              /* deferred PULLs held */
    uint64_t pending_bytes;   /* what they hold of the shard's memory (not counting their origins) */
    int initialised, shutdown;
    int live;                 /* workers counted alive (sync: not lost; async: declared, not done) */
    int workers;              /* declared by INIT (0: not yet) */
    uint64_t sync_bytes;      /* INIT's sync accumulators and per-worker counts (shard_sync_bytes) */
    struct {                  /* sparse tables, all of this ps's together (docs/sparse.md) */
        int tables;
        uint64_t rows, admitted, expired, evicted, hits, misses, not_admitted;
        uint64_t pulls, pushes, updates, stale; /* SPARSE_ROWS sent, SPARSE_PUSHes taken, updates, stale pushes */
        uint64_t bytes;       /* the tables' memory (rows, index, sketch) and their sync accumulators and row sums */
    } sparse;
} ps_shard_stats;

int ps_shard_new(ps_shard **out, const ps_shard_config *cfg, dt_error *err);
/* Deferred PULLs are dropped unanswered (io.drop), held gradients released; snapshots still in
 * replies are freed by their last release. */
void ps_shard_free(ps_shard *s, const ps_io *io);

/* One request (its header decoded and checked by dt_wire_decode). The payload is consumed: kept
 * (a sync gradient, until its step is applied) or released before return. */
void ps_shard_request(ps_shard *s, const ps_origin *from, const dt_wire_header *h, dt_bytes *payload, int64_t now,
                      const ps_io *io);

/* A request that could not be decoded: refused with status and text, counted with the others. */
void ps_shard_refuse(ps_shard *s, const ps_origin *to, const dt_wire_header *h, int32_t status, const char *text,
                     const ps_io *io);

/* Every deadline of the shard at `now`: workers silent past the liveness timeout are lost (sync;
 * strict: the job stops), deferred PULLs past their longest wait are answered ERROR 106.
 * DT_ETIMEOUT (message in err) once strict mode's stop has been told for a liveness timeout:
 * the ps should exit. */
int ps_shard_cron(ps_shard *s, int64_t now, const ps_io *io, dt_error *err);

/* A connection closed: its deferred PULLs go unanswered. */
void ps_shard_forget(ps_shard *s, const void *conn, const ps_io *io);

void ps_shard_get_stats(const ps_shard *s, ps_shard_stats *out);
/* Table t's counts (ps/table.h, dt_table_get_stats) into *out: 1 if this ps holds a table t
 * (0..DT_WIRE_MAX_TABLES-1), else 0 and *out zeroed. */
int ps_shard_table_stats(const ps_shard *s, int t, dt_table_stats *out);
/* Whether the chief's SHUTDOWN was taken: the loop ends (cheap: read per message). */
int ps_shard_is_shut(const ps_shard *s);
/* Sync mode: stale gradients per worker ([*n]); NULL before a sync INIT. */
const uint64_t *ps_shard_stale_counts(const ps_shard *s, int *n);
/* ps 0: the work coordinator's counts (docs/elastic.md); 0 when there is none (another ps, or no
 * WORK_STATE from the chief yet), else 1. */
int ps_shard_work_stats(const ps_shard *s, dt_coord_stats *out);
/* What peers may make the ps hold (docs/security.md), for the shard as INIT declared it. */
uint64_t ps_shard_budget(const ps_shard *s);
/* The largest frame a ps accepts and sends: ps 0's may carry the work coordinator's state. */
uint64_t ps_max_frame(int ps_index, size_t shard_floats);

#endif
