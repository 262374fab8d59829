/* The shard's state, shared by its files, which stand in three floors and call only down (the
 * declarations below are in that order, bottom first):
 *   core      shard_core.c: replies, refusals, the log, the chunks (snapshots, a step applied), the
 *             workers a step waits for, a table's rows applied;
 *   handlers  shard_sparse_sync.c < shard_sparse.c < shard_sparse_ckpt.c, shard_pull.c (PARAMS and
 *             deferred PULLs) < shard_update.c (INIT, PUSH, FETCH); shard_work.c (WORK messages);
 *   top       shard_requests.c: the dispatch table, the lifecycle (shard.h), liveness and cron,
 *             which alone sees every part at once.
 * Nothing outside src/ps/shard*.c includes this. */
#ifndef DT_PS_SHARD_IMPL_H
#define DT_PS_SHARD_IMPL_H

#include "compute/optim.h"
#include "compute/rowsum.h"
#include "ps/coord.h"
#include "ps/shard.h"
#include "ps/snapshots.h"
#include "ps/table.h"

#define SHARD_MAX_PENDING 4096 /* deferred PULLs of strangers; each worker task has its own quota */
#define SHARD_ASYNC_AHEAD 1024 /* async: a deferred PULL may wait for at most this many steps ahead */
#define SHARD_PENDING_MAX_WAIT_US (600 * INT64_C(1000000)) /* no deferred PULL is held longer */
#define SHARD_SNAP_KEEP 4      /* sync mode: steps whose snapshot is kept for EXACT pulls */
#define SHARD_LOG_REFUSALS 20  /* refusals logged one by one; later ones only counted */
#define SHARD_LOG_STALE 3      /* stale gradients logged one by one per worker; later ones counted */
#define SHARD_LOG_DONE 20      /* DONE lines from tasks not (yet) declared: one by one, then counted */
#define SHARD_LOG_WEIGHTED 3   /* sync steps weighted by examples logged one by one; later ones counted */
#define SHARD_NEVER_HEARD 2     /* lost[w] of an elastic worker not heard from yet (1: lost) */

/* Sparse tables (shard_sparse.c, shard_sparse_sync.c; docs/sparse.md). */
#define SHARD_SPARSE_PENDING 1024        /* deferred SPARSE_PULLs held in all */
#define SHARD_SPARSE_PENDING_PER_PEER 64 /* ... per connection */
#define SHARD_SPARSE_HELD_MAX (UINT64_C(1) << 30) /* sync: bytes of rows held for steps not yet applied */

/* Sync mode: one worker's push of one step of one table, summed by id over its parts. */
typedef struct {
    uint16_t worker;
    uint8_t chunks;           /* the parts it announced */
    uint16_t got;             /* the parts received */
    uint8_t seen[32];         /* which (bit per part) */
    uint64_t held;            /* bytes its parts count in sparse_held */
    dt_rowsum rows;
} sparse_entry;

/* Sync mode: the pushes of one step of one table. */
typedef struct {
    int64_t step;             /* -1: empty */
    int n;                    /* entries in use (at most replicas_to_aggregate) */
    sparse_entry *e;          /* [aggregate] */
} sparse_acc;

typedef struct {
    dt_table *t;
    int row_mean;             /* DT_WIRE_TABLE_F_ROW_MEAN */
    int buckets;              /* DT_WIRE_TABLE_F_BUCKETS: ids below the capacity, others refused */
    sparse_acc *acc;          /* sync: [staleness + 1], step t in acc[t % (staleness + 1)] */
} shard_table;

/* A SPARSE_PULL waiting for every table it names to reach the step it asks for. */
typedef struct {
    ps_origin from;           /* held through io.hold */
    dt_wire_header req;
    dt_bytes ids;             /* its payload (section records, ids), a copy of its own */
    int64_t since_us;
} sparse_pending;

/* A PULL waiting for a later step of its chunk (the sync barrier), or the pull half of a PUSH
 * that asked for PARAMS. */
typedef struct {
    ps_origin from;           /* held through io.hold */
    dt_wire_header req;
    int owned;                /* from the connection that pushes as its worker task (that task's quota) */
    int64_t since_us;         /* when it arrived (its barrier wait is reported in the reply) */
    int32_t status;           /* a PUSH's outcome (OK, STALE), reported with the PARAMS */
    uint64_t stale;           /* that worker's stale gradients so far */
} pending_pull;

/* Sync mode: the gradients received for one step of one chunk, held as received (no copy) until
 * replicas_to_aggregate of them are in; then summed in worker-index order. */
typedef struct {
    int64_t step;             /* -1: empty */
    int count;
    uint16_t *worker;         /* [aggregate] */
    dt_bytes *grad;           /* [aggregate] payloads */
    uint8_t *enc;             /* [aggregate] their encodings (workers may differ) */
    uint32_t *examples;       /* [aggregate] the examples each averages (PUSH's push.examples; 0: not said) */
} accum;

/* Sync mode: the gradient a worker is pushing, chunk by chunk: every chunk must say the examples
 * its first chunk said. */
typedef struct {
    int64_t step;             /* -1: none yet */
    uint32_t examples;
    int chunks;               /* chunks of it heard (all of them: the next one for this step is a new gradient) */
} push_count;

/* One chunk of the shard: its own values, optimizer state, step, snapshots and (sync) gradient
 * accumulators, so each chunk is applied and sent back as soon as its gradients are in. */
typedef struct {
    size_t off, n;            /* floats [off, off + n) of the shard */
    float *params;            /* [n] the current values: own, or the current step's snapshot */
    float *own;               /* [n] the private copy, when no snapshot buffer is free (and after INIT) */
    float *state;             /* [slots * n], slot-major as dt_opt_apply wants */
    uint8_t *decay;           /* [n] 1 where weight decay applies (INIT's mask); NULL: no weight decay */
    dt_snap_pool snaps;
    int64_t step;             /* updates applied to this chunk */
    accum *acc;               /* sync: [staleness + 1], step t in acc[t % (staleness + 1)] */
} part_t;

struct ps_shard {
    ps_shard_config cfg;
    size_t n;                 /* shard floats */
    int workers;              /* from INIT: worker tasks in the cluster (0: not told) */
    part_t *parts;            /* [n_parts], the shard cut as INIT said; NULL before INIT */
    int n_parts;
    float *scratch;           /* [largest part] aligned float32 copy of a misaligned or 16-bit gradient */
    float *sum;               /* sync: [largest part] the mean gradient of a step */
    dt_opt_config opt;
    int slots, initialised, shutdown;
    uint8_t generation;       /* of the INIT that set the shard (1..255), reported in every reply */
    uint64_t pushes, updates, pulls, refused; /* pushes and updates counted on chunk 0: whole gradients */
    pending_pull *pending;    /* [cap_pending]: strangers' share, plus a quota per worker task */
    int n_pending, cap_pending;
    uint64_t *owner;          /* [workers] serial of the connection that latest pushed as each task */
    uint64_t n_done_logged;
    uint8_t *done;            /* [65536 / 8] worker tasks that sent DONE (allocated at the first) */
    uint64_t n_done;
    /* Sync replicas (INIT's configuration): aggregate == 0 means asynchronous. */
    int aggregate, total, staleness;
    uint64_t *stale;          /* [total] stale gradients per worker */
    uint64_t n_stale;
    push_count *counts;       /* [total] each worker's gradient being pushed */
    uint64_t n_weighted;      /* steps (chunk 0) whose mean was weighted by examples */
    /* Worker liveness (sync mode): the traffic is the heartbeat. A worker that sends nothing for
     * liveness_us is lost, and each step then waits for at most the live workers' gradients (or,
     * strict, the job stops). A lost worker that speaks again is back. */
    int64_t liveness_us;      /* 0: workers are never lost */
    int strict;
    int64_t *last_seen;       /* [total] time of each worker's latest message */
    uint8_t *lost;            /* [total] 1: lost; SHARD_NEVER_HEARD: elastic, not heard from yet */
    int n_lost;
    /* [total] sync: a worker that became live (back, or training again) while a step was part
     * applied (some chunks past it) counts for steps from this one on (0: for every step); n_late
     * such workers. The chunks behind apply their step with the workers they waited for: the one
     * back cannot send a gradient that counts for it (chunk 0 may have applied it already). */
    int64_t *count_from;
    int n_late;
    /* sync: declared workers that sent DONE and have not pushed or pulled since (a worker without
     * work sits steps out: dynamic sharding's epoch end, docs/elastic.md): steps do not wait for them */
    int n_sitting;
    /* INIT's ELASTIC flag (dynamic sharding): total - aggregate backup workers stay a count as
     * workers join and leave, so a step waits for all the live workers but that many
     * (shard_needed). Without it, a step waits for min(aggregate, live). */
    int elastic;
    char failed[320];         /* strict mode after a loss: why every request is now refused */
    int64_t failed_at_us;
    /* Sparse tables: declared by SPARSE_INIT after INIT (an INIT drops them). */
    shard_table **tables;     /* [DT_WIRE_MAX_TABLES] by table id, NULL: none */
    int n_tables;
    /* SPARSE_INIT with IMPORT: the chief's checkpoint rows are on their way, so every SPARSE_PULL is
     * held until its SPARSE_IMPORT with LAST (a pull now would read the tables' initial rows). */
    int importing;
    uint64_t tables_most;     /* the bytes the declared tables may grow to here (tables_fit) */
    uint64_t sync_bytes;      /* what INIT's sync configuration allocated (shard_sync_bytes) */
    dt_rowsum rsum;           /* scratch: a push's or a step's rows summed by id */
    float *rows;              /* [DT_WIRE_MAX_SPARSE_FLOATS] scratch: a message's rows as float32 */
    dt_wire_section *sec;     /* [DT_WIRE_MAX_SPARSE_SECTIONS] scratch: a message's sections */
    sparse_pending *sp;       /* [SHARD_SPARSE_PENDING] */
    int n_sp;
    uint64_t *sparse_stale;   /* [total] sync: stale sparse pushes per worker */
    uint64_t n_sparse_stale, sparse_pulls, sparse_pushes, sparse_updates, sparse_held;
    /* ps 0: the work coordinator of dynamic data sharding, once the chief sent WORK_STATE (docs/elastic.md) */
    dt_coord *coord;
};

/* One request being handled. */
typedef struct {
    ps_shard *s;
    const ps_origin *from;
    const dt_wire_header *h;
    dt_bytes *payload;
    int64_t now;
    const ps_io *io;
} shard_req;

/* ---- The core (shard_core.c), the bottom: it calls none of the files declared after it ---- */
void shard_log(const ps_shard *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int64_t shard_step(const ps_shard *s);
int64_t shard_step_max(const ps_shard *s); /* the step of the chunk furthest on */
dt_wire_header shard_reply_to(const ps_shard *s, dt_msg_type type, const dt_wire_header *req);
/* ERROR replies: with a printf text (not counted), or refusing a request (counted, logged). */
void shard_send_error(const ps_shard *s, const ps_io *io, const ps_origin *to, const dt_wire_header *req,
                      int32_t status, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
void shard_refuse(const shard_req *r, int32_t status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void shard_send(const shard_req *r, dt_wire_header *h);
/* Whether a request comes from the connection that latest pushed a gradient as its worker task. */
int shard_owns_task(const ps_shard *s, const ps_origin *from, const dt_wire_header *h);
/* Asks io.admit for a large reply (saying whether it is for a declared worker's connection): DT_OK,
 * or 1 with the refusal's text in why. */
int shard_admit(const shard_req *r, size_t bytes, char *why, size_t why_len);
dt_snap *shard_snap_current(const ps_shard *s, part_t *p, int must_keep);
/* A large reply: its buffer of `bytes`, admitted first (NULL: refused, the refusal sent), and the
 * reply sent with it (handed over: freed when sent; the admission given back then). */
void *shard_reply_buffer(const shard_req *r, size_t bytes);
void shard_send_buffer(const shard_req *r, dt_wire_header *h, void *d, size_t bytes);
void shard_put_optimizer(const ps_shard *s, dt_wire_header *h);
int shard_apply_complete_steps(ps_shard *s, part_t *p);
void shard_parts_free(part_t *parts, int n, int staleness);
/* The step of a chunk advanced by one update of grads; a gradient payload as float32 (copied to
 * `into` when it must be); the release of a reply buffer that is freed when sent. */
void shard_advance(ps_shard *s, part_t *p, const float *grads);
const float *shard_grad_floats(float *into, const dt_bytes *m, uint8_t enc);
void shard_release_free(void *p);
/* The workers a step waits for: w counts again from the step of the chunk furthest on, or not at all. */
void shard_count_from_now(ps_shard *s, int w);
void shard_count_none(ps_shard *s, int w);
int shard_needed(const ps_shard *s);
/* The gradients a chunk's step `step` needs: shard_needed, less the workers that count only from
 * a later step (count_from); the late workers whose step every chunk has reached are forgotten. */
int shard_needed_at(ps_shard *s, int64_t step);
/* Whether worker w's gradient for `step` comes before the step it counts from (dropped as stale). */
int shard_too_early(const ps_shard *s, int w, int64_t step);
void shard_saw_worker(ps_shard *s, const dt_wire_header *h, int64_t now);
/* Summed rows applied to a table as one update (divided by `divisor`, or, row_mean, by their count). */
void shard_sparse_apply(ps_shard *s, dt_table *t, const dt_rowsum *sum, float divisor, int row_mean);

/* ---- The handlers, on the core; each file calls only those listed above it ---- */

/* shard_sparse_sync.c */
/* A sync SPARSE_PUSH of n sections (s->sec), its ids (after the records) and its rows as float32:
 * whether a step was applied. */
int shard_sparse_sync_push(const shard_req *r, int n, const uint8_t *ids, const float *rows);
int shard_sparse_apply_complete(ps_shard *s);
void shard_table_free(shard_table *t, int staleness, int aggregate);
int shard_table_accumulators(shard_table *t, int aggregate, int staleness);
/* What shard_table_accumulators allocates for one table (0 when asynchronous). */
uint64_t shard_table_acc_bytes(int aggregate, int staleness);
/* Bytes the sync row sums of table t hold (the ps's own memory: their bound is the held pushes'). */
uint64_t shard_table_sums_bytes(const shard_table *t, int staleness, int aggregate);

/* shard_sparse.c */
void shard_on_sparse_init(const shard_req *r);
void shard_on_sparse_pull(const shard_req *r);
void shard_on_sparse_push(const shard_req *r);
/* The table `what` names with its dim (shard_table_of: a SPARSE_EXPORT's or _IMPORT's), else r refused
 * naming it (NULL). */
shard_table *shard_table_named(const shard_req *r, uint64_t table, uint64_t dim, const char *what);
shard_table *shard_table_of(const shard_req *r);
/* Every id of ids [n] of table is this ps's (dt_row_ps), or r is refused naming the first that is not. */
int shard_ids_owned(const shard_req *r, uint64_t table, const uint8_t *ids, size_t n, const char *what);
/* A SPARSE_PULL's or SPARSE_PUSH's sections into s->sec, each checked (bounds, table, dim, ids' home):
 * their count, or -1 with r refused naming the section. */
int shard_sections(const shard_req *r, const uint8_t *payload, size_t len);
void shard_sparse_serve(ps_shard *s, int64_t now, const ps_io *io);
void shard_sparse_fail(ps_shard *s, const ps_io *io, int32_t status, const char *text);
void shard_sparse_expire(ps_shard *s, int64_t now, const ps_io *io);
void shard_sparse_forget(ps_shard *s, const void *conn, const ps_io *io);
int shard_sparse_has_pending(const ps_shard *s, int worker);
void shard_sparse_drop(ps_shard *s, const ps_io *io); /* every table, held push and deferred pull */
/* Sync: whether worker w's push of step t is whole at every table that has not passed t (a held pull
 * of step t + 1 then waits for the other workers: the barrier). */
int shard_sparse_pushed(const ps_shard *s, int w, int64_t t);
void shard_sparse_free(ps_shard *s, const ps_io *io);  /* the same, deferred pulls unanswered; the scratch */
void shard_sparse_stats(const ps_shard *s, ps_shard_stats *o);

/* shard_sparse_ckpt.c: a table's rows out (pages from a cursor) and in, for checkpoints */
void shard_on_sparse_export(const shard_req *r);
void shard_on_sparse_import(const shard_req *r);

/* shard_pull.c */
void shard_on_pull(const shard_req *r);
void shard_answer_pull(const shard_req *r, int32_t status, uint64_t stale);
void shard_serve_pending(ps_shard *s, int64_t now, const ps_io *io);
void shard_fail_pending(ps_shard *s, const ps_io *io, int32_t status, const char *text);
void shard_expire_pending(ps_shard *s, int64_t now, const ps_io *io);
int shard_has_pending(const ps_shard *s, int worker);

/* shard_update.c: INIT, PUSH, FETCH */
void shard_on_init(const shard_req *r);
void shard_on_push(const shard_req *r);
void shard_on_fetch(const shard_req *r);
/* What an INIT of this sync configuration allocates beyond the shard's values: the chunks'
 * accumulators and the per-worker counts (0 when asynchronous). */
uint64_t shard_sync_bytes(uint64_t chunks, uint64_t aggregate, uint64_t total, uint64_t staleness);

/* shard_work.c: the coordinator's requests, and the hooks that feed it */
void shard_on_work_ask(const shard_req *r);
void shard_on_work_done(const shard_req *r);
void shard_on_work_state(const shard_req *r);
void shard_work_seen(ps_shard *s, const dt_wire_header *h, int64_t now);
void shard_work_cron(ps_shard *s, int64_t now);

/* ---- The top (shard_requests.c): the dispatch table, the lifecycle (shard.h), liveness, cron ---- */

#endif
