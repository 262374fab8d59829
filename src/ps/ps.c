/* The ps's event loop: the transport's server (transport/conn.h) read into the shard state machine
 * (shard.h), as Redis's aeProcessEvents + serverCron: poll, drain the server (each request handed
 * to the shard), then cron(now), which owns every deadline (the stop flag, strict mode's stop, the
 * idle deadline, liveness, deferred-PULL expiry, the connection checks, the metrics). The shard's
 * replies go out through ps_io (zero-copy where the shard hands over a snapshot), counted against
 * the peers' budget (transport/peers.h). */
#include "ps/ps.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"
#include "metrics/metrics.h"
#include "metrics/names.h"
#include "ps/mem_limit.h"
#include "ps/shard.h"
#include "transport/conn.h"
#include "transport/wire.h"

#define SEND_HWM (2 * (int)DT_WIRE_MAX_CHUNKS + 16) /* replies queued per connection: more than a client ever awaits (a push and a pull of every chunk) */
#define QUEUED_ASSUMED 4      /* for peers.c's looser check while not drained: whole messages assumed queued */
#define FIRST_MESSAGE_US (10 * INT64_C(1000000))  /* a new connection's first message, at the latest */
#define MESSAGE_US (120 * INT64_C(1000000))       /* a large message, once begun, must finish */
#define MAX_CONNECTIONS 1024
#define PEER_SILENCE_MS 30000 /* a connection with no traffic at all for this long is cut */
#define DRAIN_US 20000        /* reading the server at most this long before cron */
#define SHUTDOWN_LINGER_MS 1000
#define MAX_IO_THREADS 4      /* the transport's I/O threads of a ps: one per core up to this */
#define SPARSE_METRICS 3     /* the sparse messages' series (SPARSE_SERIES) */
#define TABLE_METRICS 6      /* each sparse table's series (TABLE_SERIES), labelled table="N" */
#define HELD_ORIGIN_BYTES 96  /* a deferred PULL's kept route, as peers.c counts it */

typedef struct {
    const dt_ps_config *cfg;
    size_t n;                 /* shard floats */
    dt_server *srv;           /* the transport's (transport/conn.h) */
    dt_peers *peers;          /* its connections, watched and bounded (transport/peers.h) */
    ps_shard *shard;
    ps_io io;                 /* the shard's way out: replies through srv, admissions through peers */
    uint64_t budget;          /* everything peers may make this ps hold (the shard's, as INIT declared) */
    int64_t peers_checked_us;
    int64_t last_message_us;  /* any client's latest message (the idle deadline) */
    int64_t sparse_pulls_in;  /* SPARSE_PULLs workers sent (cfg->debug_stop_at_sparse_pull) */
    /* Time in the shard per request type: its wall time and the CPU it used, logged at the end (where
     * a ps's time goes; a request also answers what it completes: a sync step's last push applies
     * the step and serves the pulls held for it). */
    struct {
        uint64_t n;
        int64_t wall_us, cpu_us;
    } spent[DT_MSG_TYPE_MAX + 1];
    /* Metrics (NULL series when off): the shard's counts, published once per loop. */
    struct {
        dt_metric *step, *pushes, *updates, *pulls, *refused, *live, *rx, *tx, *wait;
        dt_metric *sparse[SPARSE_METRICS]; /* SPARSE_SERIES' */
        dt_metric *(*tables)[TABLE_METRICS]; /* [DT_WIRE_MAX_TABLES] TABLE_SERIES' per table, made when it is
                                              * first held (NULL until a table is) */
        uint64_t stale_seen;
        dt_metric *work[13];  /* ps 0: the work coordinator's series (ps_publish_work's order) */
        int work_open;
    } m;
} ps_t;

static void ps_log(ps_t *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ps_log(ps_t *ps, const char *fmt, ...) {
    FILE *f = ps->cfg->log;
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(f, "ps %d: ", ps->cfg->ps_index);
    vfprintf(f, fmt, ap);
    fputc('\n', f);
    fflush(f);
    va_end(ap);
}

/* ---- The shard's way out (ps_io) -------------------------------------------------------------- */

/* A reply payload the transport sends zero-copy: what releases it, and its admission to give back. */
typedef struct {
    dt_bytes b;
    dt_peer *peer;
    size_t admitted;
} reply_hold;

/* The transport is done with a reply (from its own thread, maybe). */
static void reply_release(void *hint) {
    reply_hold *h = hint;
    dt_bytes_release(&h->b);
    if (h->admitted) dt_peer_reply_done(h->peer, h->admitted);
    free(h);
}

/* The payload as the transport takes it: handed over with the admission to give back when it is
 * done, or borrowed (copied there). DT_ENOMEM (the payload released, its admission given back) or
 * DT_OK. */
static int reply_bytes(dt_bytes *out, const ps_origin *to, dt_bytes *payload, size_t admitted) {
    if (!payload->release) {
        *out = *payload;
        return DT_OK;
    }
    reply_hold *h = malloc(sizeof *h);
    if (!h) {
        dt_bytes_release(payload);
        if (admitted) dt_peer_reply_done((dt_peer *)to->conn, admitted);
        return DT_ENOMEM;
    }
    *h = (reply_hold){.b = *payload, .peer = (dt_peer *)to->conn, .admitted = admitted};
    *out = (dt_bytes){.data = payload->data, .size = payload->size, .release = reply_release, .hint = h};
    return DT_OK;
}

static void io_send(void *user, const ps_origin *to, dt_wire_header *h, dt_bytes *payload, size_t admitted) {
    ps_t *ps = user;
    dt_bytes out;
    int rc = payload ? reply_bytes(&out, to, payload, admitted) : DT_OK;
    size_t bytes = payload && !rc ? out.size : 0;
    if (!rc) rc = dt_server_send(ps->srv, to->route, h, payload ? &out : NULL, NULL);
    if (rc == DT_ENOMEM) {
        dt_wire_header e = *h;
        dt_server_send_error(ps->srv, to->route, e, DT_WIRE_E_NOMEM, "ps %d: out of memory for a %s reply",
                             ps->cfg->ps_index, dt_wire_type_name(h->type));
        return;
    }
    if (h->type == DT_MSG_PARAMS) {
        if (h->params.waited_us > 0) dt_metric_observe(ps->m.wait, (double)h->params.waited_us * 1e-6);
        dt_metric_add(ps->m.tx, (double)(DT_WIRE_HEADER_SIZE + bytes));
    }
}

/* What one connection may have in large replies not yet handed to the kernel: two of the largest
 * messages (a step's chunks of PARAMS fit many times). */
static uint64_t peer_reply_budget(const ps_t *ps) { return 2 * ps_max_frame(ps->cfg->ps_index, ps->n); }

/* The part of the budget a stranger's large reply may not take: kept for the declared workers'
 * (docs/security.md), so strangers holding the ps at its budget refuse no worker its PARAMS. */
static uint64_t workers_reserve(const ps_t *ps) { return ps->budget / 4; }

static int io_admit(void *user, const ps_origin *to, size_t bytes, char *why, size_t len) {
    ps_t *ps = user;
    const uint64_t strangers = ps->budget - workers_reserve(ps);
    int r = !to->declared && dt_peers_held(ps->peers) + bytes > strangers
                ? -1
                : dt_peer_reply_begin(ps->peers, (dt_peer *)to->conn, bytes, peer_reply_budget(ps));
    if (r > 0) return 0;
    if (r < 0) {
        char parts[160];
        dt_peers_held_phrase(ps->peers, parts, sizeof parts);
        snprintf(why, len, "ps %d: its peers hold %llu bytes of its memory (%s), at its budget of %llu%s: ask again "
                 "shortly", ps->cfg->ps_index, (unsigned long long)dt_peers_held(ps->peers), parts,
                 (unsigned long long)(to->declared ? ps->budget : strangers),
                 to->declared ? "" : " for a connection that pushes as no worker (the rest is kept for the workers')");
    } else
        snprintf(why, len, "ps %d: earlier replies to this connection (%llu bytes at most) are still unread: read "
                 "them first", ps->cfg->ps_index, (unsigned long long)peer_reply_budget(ps));
    return 1;
}

static void io_unadmit(void *user, const ps_origin *to, size_t bytes) {
    (void)user;
    dt_peer_reply_done((dt_peer *)to->conn, bytes);
}

/* A deferred PULL keeps its route (dt_route_hold) and a reference to its connection. */
static int io_hold(void *user, const ps_origin *from, ps_origin *kept) {
    (void)user;
    dt_route *r = dt_route_hold(from->route);
    if (!r) return DT_ENOMEM;
    dt_peer_ref((dt_peer *)from->conn);
    *kept = (ps_origin){.conn = from->conn, .serial = from->serial, .route = r, .addr = NULL};
    return DT_OK;
}

static void io_drop(void *user, ps_origin *kept) {
    (void)user;
    dt_route_drop(kept->route);
    dt_peer_unref((dt_peer *)kept->conn);
    *kept = (ps_origin){0};
}

/* ---- Metrics ---------------------------------------------------------------------------------- */

/* The sparse messages' series (docs/metrics.md), in the order ps_publish_sparse sets them. */
static const struct {
    const char *name, *help;
} SPARSE_SERIES[SPARSE_METRICS] = {
    {"dtrain_ps_sparse_pushes_total", "SPARSE_PUSH messages this ps accepted."},
    {"dtrain_ps_sparse_pulls_total", "SPARSE_ROWS replies this ps sent."},
    {"dtrain_ps_sparse_stale_total", "Sync mode: sparse pushes this ps dropped as stale."},
};

/* Each table's series (label table="N"), in the order ps_publish_tables sets them. */
static const struct {
    const char *name, *help;
    int gauge;
} TABLE_SERIES[TABLE_METRICS] = {
    {"dtrain_ps_sparse_rows", "Rows this ps holds in a sparse table.", 1},
    {"dtrain_ps_sparse_admitted_total", "Rows created (ids admitted) in a table of this ps.", 0},
    {"dtrain_ps_sparse_evicted_total", "Rows evicted from a table of this ps: not touched for expire_steps, or the "
     "least recently used of a full table.", 0},
    {"dtrain_ps_sparse_hits_total", "Ids read or updated in a table of this ps that had a row.", 0},
    {"dtrain_ps_sparse_misses_total", "Ids read or updated in a table of this ps that had no row.", 0},
    {"dtrain_ps_sparse_not_admitted_total", "Row updates dropped: ids below their table's min_count.", 0},
};

/* Table t's series, made the first time this ps holds a table t; NULL when out of memory (the
 * registry then renders an error, as for any series it could not make). */
static dt_metric **table_series(ps_t *ps, int t) {
    if (!ps->m.tables && !(ps->m.tables = calloc(DT_WIRE_MAX_TABLES, sizeof *ps->m.tables))) return NULL;
    dt_metric **m = ps->m.tables[t];
    if (m[0]) return m;
    char label[32];
    snprintf(label, sizeof label, "table=\"%d\"", t);
    for (int i = 0; i < TABLE_METRICS; i++)
        m[i] = TABLE_SERIES[i].gauge ? dt_metrics_gauge(ps->cfg->metrics, TABLE_SERIES[i].name, TABLE_SERIES[i].help,
                                                        label)
                                     : dt_metrics_counter(ps->cfg->metrics, TABLE_SERIES[i].name, TABLE_SERIES[i].help,
                                                          label);
    return m[0] ? m : NULL;
}

/* Every table's counts (dt_table_get_stats); a table once held and no longer declared reads 0
 * (its counters start again with it, as a restarted process's do). At most DT_WIRE_MAX_TABLES
 * tables, so at most 6144 series. */
static void ps_publish_tables(ps_t *ps) {
    for (int t = 0; t < (int)DT_WIRE_MAX_TABLES; t++) {
        dt_table_stats st;
        int held = ps_shard_table_stats(ps->shard, t, &st);
        if (!held && (!ps->m.tables || !ps->m.tables[t][0])) continue;
        dt_metric **m = table_series(ps, t);
        if (!m) return;
        const double v[TABLE_METRICS] = {(double)st.rows, (double)st.admitted, (double)(st.evicted + st.expired),
                                         (double)st.hits, (double)st.misses, (double)st.not_admitted};
        for (int i = 0; i < TABLE_METRICS; i++) dt_metric_set(m[i], v[i]);
    }
}

static void ps_publish_sparse(ps_t *ps, const ps_shard_stats *st) {
    const double v[SPARSE_METRICS] = {(double)st->sparse.pushes, (double)st->sparse.pulls, (double)st->sparse.stale};
    for (int i = 0; i < SPARSE_METRICS; i++) dt_metric_set(ps->m.sparse[i], v[i]);
    if (st->sparse.tables || ps->m.tables) ps_publish_tables(ps);
}

static void ps_metrics_open(ps_t *ps) {
    struct dt_metrics *r = ps->cfg->metrics;
    ps->m.step = dt_metrics_gauge(r, DT_M_GLOBAL_STEP, "Global step: updates this ps has applied to its shard.", NULL);
    ps->m.pushes = dt_metrics_counter(r, DT_M_PS_PUSHES, "Gradients this ps accepted.", NULL);
    ps->m.updates = dt_metrics_counter(r, "dtrain_ps_updates_total", "Optimizer updates this ps applied.", NULL);
    ps->m.pulls = dt_metrics_counter(r, DT_M_PS_PULLS, "Parameter replies this ps sent.", NULL);
    ps->m.refused = dt_metrics_counter(r, "dtrain_ps_refused_total", "Requests this ps refused (ERROR replies).", NULL);
    ps->m.live = dt_metrics_gauge(r, DT_M_PS_LIVE_WORKERS, "Workers this ps counts as alive: sync mode, those not "
                                  "lost; asynchronous, those declared that have not finished.", NULL);
    ps->m.rx = dt_metrics_counter(r, DT_M_RECEIVED, DT_M_RECEIVED_HELP, NULL);
    ps->m.tx = dt_metrics_counter(r, DT_M_SENT, DT_M_SENT_HELP, NULL);
    ps->m.wait = dt_metrics_histogram(r, "dtrain_ps_barrier_wait_seconds", "How long this ps held a PULL until its "
                                      "step was reached (the sync barrier).", NULL, dt_metrics_latency_bounds,
                                      dt_metrics_latency_n);
    for (int i = 0; i < SPARSE_METRICS; i++)
        ps->m.sparse[i] = dt_metrics_counter(r, SPARSE_SERIES[i].name, SPARSE_SERIES[i].help, NULL);
}

/* ps 0's work coordinator's series (docs/elastic.md), made once the chief has sent its plan. */
static void work_metrics_open(ps_t *ps) {
    struct dt_metrics *r = ps->cfg->metrics;
    dt_metric **m = ps->m.work;
    m[0] = dt_metrics_gauge(r, "dtrain_work_live_workers", "Workers holding or asking for work units (dynamic "
                            "data sharding).", NULL);
    m[1] = dt_metrics_gauge(r, "dtrain_work_epoch", "The epoch the work coordinator hands out.", NULL);
    static const char *help_units = "Units of the current epoch: done, held by workers, returned and waiting in "
                                    "the pool, waiting for a departed holder's claims.";
    static const char *states[4] = {"state=\"done\"", "state=\"held\"", "state=\"pool\"", "state=\"orphaned\""};
    for (int k = 0; k < 4; k++) m[2 + k] = dt_metrics_gauge(r, "dtrain_work_units", help_units, states[k]);
    static const char *names[7] = {"dtrain_work_joins_total", "dtrain_work_leaves_total", "dtrain_work_losses_total",
                                   "dtrain_work_units_returned_total", "dtrain_work_batches_counted_total",
                                   "dtrain_work_claims_voided_total", "dtrain_work_refused_total"};
    static const char *helps[7] = {"Workers that joined.", "Workers that left (DONE).", "Workers lost (silent).",
                                   "Units given back by departed workers.", "Batches whose gradient was applied.",
                                   "Claims whose gradient was not applied.", "Work requests refused."};
    for (int k = 0; k < 7; k++) m[6 + k] = dt_metrics_counter(r, names[k], helps[k], NULL);
    ps->m.work_open = 1;
}

static void ps_publish_work(ps_t *ps) {
    dt_coord_stats w;
    if (!ps_shard_work_stats(ps->shard, &w)) return;
    if (!ps->m.work_open) work_metrics_open(ps);
    const double v[13] = {w.live, (double)w.epoch, w.done, w.held, w.pool, w.orphaned, (double)w.joins,
                          (double)w.leaves, (double)w.losses, (double)w.returned, (double)w.committed,
                          (double)w.voided, (double)w.refused};
    for (int k = 0; k < 13; k++) dt_metric_set(ps->m.work[k], v[k]);
}

/* The shard's counts into its series; per worker stale counts only when one changed. */
static void ps_publish(ps_t *ps, const ps_shard_stats *st) {
    if (!ps->cfg->metrics) return;
    dt_metric_set(ps->m.step, (double)st->step);
    dt_metric_set(ps->m.pushes, (double)st->pushes);
    dt_metric_set(ps->m.updates, (double)st->updates);
    dt_metric_set(ps->m.pulls, (double)st->pulls);
    dt_metric_set(ps->m.refused, (double)st->refused);
    dt_metric_set(ps->m.live, st->live);
    ps_publish_sparse(ps, st);
    ps_publish_work(ps);
    int total;
    const uint64_t *stale = ps_shard_stale_counts(ps->shard, &total);
    if (!stale || st->stale == ps->m.stale_seen) return;
    for (int w = 0; w < total; w++) {
        char label[32];
        snprintf(label, sizeof label, "worker=\"%d\"", w);
        dt_metric_set(dt_metrics_counter(ps->cfg->metrics, "dtrain_ps_stale_gradients_total",
                                         "Sync mode: gradients this ps dropped as stale, per worker.", label),
                      (double)stale[w]);
    }
    ps->m.stale_seen = st->stale;
}

/* The transport's server, with one I/O thread per core (up to MAX_IO_THREADS): the transport
 * spreads connections over its I/O threads, so the workers' transfers are copied on several cores
 * at once instead of queueing behind one thread (1 by default); its connections bounded (peers.h)
 * with the ps's bounds, and authentication in place, before it binds. */
static int open_server(ps_t *ps, dt_error *err) {
    const dt_ps_config *cfg = ps->cfg;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "ps %d: ", cfg->ps_index);
    const int first_ms = cfg->first_message_ms > 0 ? cfg->first_message_ms : (int)(FIRST_MESSAGE_US / 1000);
    dt_server_config sc = {
        .max_frame = ps_max_frame(cfg->ps_index, ps->n),
        .io_threads = cores < 1 ? 1 : cores > MAX_IO_THREADS ? MAX_IO_THREADS : (int)cores,
        .linger_ms = SHUTDOWN_LINGER_MS, .send_queue = SEND_HWM, .handshake_ms = first_ms,
        .auth = cfg->auth, .log_prefix = prefix,
        .peers = {.max_partial_bytes = ps_max_frame(cfg->ps_index, ps->n) + DT_WIRE_HEADER_SIZE,
                  .first_message_us = first_ms * INT64_C(1000),
                  .message_us = MESSAGE_US,
                  .max_connections = cfg->max_connections > 0 ? cfg->max_connections : MAX_CONNECTIONS,
                  .queued_messages = QUEUED_ASSUMED,
                  .silence_us = PEER_SILENCE_MS * INT64_C(1000),
                  .log = cfg->log, .ps_index = cfg->ps_index}};
    sc.peers.budget_bytes = ps->budget = ps_shard_budget(ps->shard);
    int rc = dt_server_open(&ps->srv, &sc, err);
    if (rc) return dt_error_wrap(err, rc, "%s", prefix);
    ps->peers = dt_server_peers(ps->srv);
    return DT_OK;
}

/* Binds the endpoints (and the same-host one), after authentication is in place. */
static int bind_endpoints(ps_t *ps, dt_error *err) {
    const dt_ps_config *cfg = ps->cfg;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "ps %d: ", cfg->ps_index);
    char bound[256] = "";
    int rc = dt_server_bind(ps->srv, cfg->endpoint, bound, sizeof bound, err);
    if (rc) return dt_error_wrap(err, rc, "%s", prefix);
    dt_error e = {0};
    if (cfg->ipc_endpoint && (rc = dt_server_bind(ps->srv, cfg->ipc_endpoint, NULL, 0, &e)))
        return dt_errorf(err, rc, "%s%s%s", prefix, e.msg,
                         strncmp(e.msg, "cannot bind", 11) ? "" : " (DTRAIN_IPC=0 turns the same-host path off)");
    if (cfg->ipc_endpoint) ps_log(ps, "same-host workers connect on %s", cfg->ipc_endpoint);
    ps_metrics_open(ps);
    ps_log(ps, "serving %zu floats on %s", ps->n, bound);
    if (cfg->on_bound) cfg->on_bound(cfg->user, bound);
    return DT_OK;
}

static int ps_open(ps_t *ps, const dt_ps_config *cfg, dt_error *err) {
    ps->cfg = cfg;
    ps->n = cfg->shard_floats;
    ps->io = (ps_io){.user = ps, .send = io_send, .admit = io_admit, .unadmit = io_unadmit, .hold = io_hold,
                     .drop = io_drop};
    if (!cfg->endpoint || !*cfg->endpoint)
        return dt_errorf(err, DT_EINVAL, "ps %d: no endpoint to bind", cfg->ps_index);
    ps_shard_config sc = {.ps_index = cfg->ps_index, .n_ps = cfg->n_ps, .shard_floats = cfg->shard_floats,
                          .state_ranges = cfg->state_ranges, .n_state_ranges = cfg->n_state_ranges, .log = cfg->log,
                          .table_memory = cfg->table_memory ? cfg->table_memory : dt_ps_table_memory_default()};
    int rc = ps_shard_new(&ps->shard, &sc, err);
    if (!rc) rc = open_server(ps, err);
    if (!rc) rc = bind_endpoints(ps, err);
    return rc;
}

static void ps_close(ps_t *ps) {
    /* Snapshots still in flight are freed by their last message, at the latest while the context
     * terminates; peers referenced by replies in flight likewise. */
    ps_shard_free(ps->shard, &ps->io);
    free(ps->m.tables); /* the series themselves are the registry's */
    dt_server_close(ps->srv); /* waits at most SHUTDOWN_LINGER_MS to flush the last replies */
}

/* ---- The loop --------------------------------------------------------------------------------- */

static void on_peer_gone(void *user, dt_peer *peer) {
    ps_t *ps = user;
    ps_shard_forget(ps->shard, peer, &ps->io);
}

/* One received message into the shard: a request, or a refusal of what could not be decoded.
 * A closed connection's requests are not answered (nobody would read the answer). */
static void deliver(ps_t *ps, dt_msg *in, int r, const dt_error *e) {
    dt_peer *peer = in->peer;
    dt_peer_ref(peer); /* held while handled: the table may drop it meanwhile */
    dt_peers_delivered(ps->peers, peer, r == DT_OK && in->hdr.role != DT_ROLE_NONE);
    /* A FETCH copies the whole shard: its connection may have closed while it waited here
     * (closes are heard on the monitor). */
    if (r == DT_OK && in->hdr.type == DT_MSG_FETCH) dt_server_events(ps->srv, on_peer_gone, ps);
    ps_origin from = {.conn = peer, .serial = dt_peer_serial(peer), .route = in->route, .addr = in->addr};
    if (!dt_peer_gone(peer) && r == DT_OK) {
        dt_bytes payload;
        const int64_t t0 = dt_clock_us(), c0 = dt_thread_cpu_us();
        /* A sync gradient stays where the transport put it until its step is applied; lent when
         * there is no memory for its holder (the shard copies what it keeps). */
        ps_shard_request(ps->shard, &from, &in->hdr, dt_msg_take(in, &payload), t0, &ps->io);
        if (in->hdr.type <= DT_MSG_TYPE_MAX) { /* a valid header's: always */
            ps->spent[in->hdr.type].n++;
            ps->spent[in->hdr.type].wall_us += dt_clock_us() - t0;
            ps->spent[in->hdr.type].cpu_us += dt_thread_cpu_us() - c0;
        }
    } else if (!dt_peer_gone(peer) && in->route) {
        ps_shard_refuse(ps->shard, &from, &in->hdr, r == DT_EPROTO ? DT_WIRE_E_VERSION : DT_WIRE_E_MALFORMED, e->msg,
                        &ps->io);
    }
    dt_peer_unref(peer);
}

uint64_t dt_ps_table_memory_default(void) {
    const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    const uint64_t m = dt_mem_limit("", pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : UINT64_MAX);
    return m == UINT64_MAX ? UINT64_C(4) << 30 : m / 4 * 3;
}

/* The test hook: whether this message is the SPARSE_PULL the ps stops at, unanswered (as if the
 * ps were killed while the pull was on its way). */
static int debug_stop_here(ps_t *ps, const dt_msg *in, int r) {
    if (ps->cfg->debug_stop_at_sparse_pull <= 0 || r != DT_OK || in->hdr.type != DT_MSG_SPARSE_PULL ||
        in->hdr.role == DT_ROLE_PS)
        return 0;
    return ++ps->sparse_pulls_in == ps->cfg->debug_stop_at_sparse_pull;
}

/* Reads the server until it is empty, for at most DRAIN_US (a flood faster than that waits for
 * the next round, so the deadlines are still kept): whether it was drained. */
static int drain(ps_t *ps, int *rc, dt_error *err) {
    for (int64_t until = dt_clock_us() + DRAIN_US; dt_clock_us() < until;) {
        if (ps_shard_is_shut(ps->shard)) return 0;
        dt_msg in;
        dt_error e = {0};
        int r = dt_server_recv(ps->srv, &in, &e);
        if (r == DT_ETIMEOUT || r == DT_EINTR) {
            dt_msg_close(&in);
            return 1;
        }
        if (r == DT_ENET) {
            dt_msg_close(&in);
            *rc = dt_errorf(err, DT_ENET, "ps %d: %s", ps->cfg->ps_index, e.msg);
            return 0;
        }
        ps->last_message_us = dt_clock_us();
        if (debug_stop_here(ps, &in, r)) {
            dt_msg_close(&in);
            ps_log(ps, "debug: stopping at SPARSE_PULL %lld, unanswered (--debug_ps_stop_at_sparse_pull)",
                   (long long)ps->sparse_pulls_in);
            *rc = dt_errorf(err, DT_EINTR, "ps %d: stopped at SPARSE_PULL %lld (--debug_ps_stop_at_sparse_pull)",
                            ps->cfg->ps_index, (long long)ps->sparse_pulls_in);
            return 0;
        }
        dt_metric_add(ps->m.rx, (double)(DT_WIRE_HEADER_SIZE + in.size));
        deliver(ps, &in, r, &e);
        dt_msg_close(&in);
        uint64_t budget = ps_shard_budget(ps->shard); /* an INIT declares the workers */
        if (budget != ps->budget) dt_peers_set_budget(ps->peers, ps->budget = budget);
    }
    return 0;
}

/* Every deadline, once per round: DT_OK to go on, else why the ps ends. */
static int cron(ps_t *ps, int64_t now, dt_error *err) {
    const dt_ps_config *cfg = ps->cfg;
    ps_shard_stats st;
    ps_shard_get_stats(ps->shard, &st);
    if (cfg->stop && *cfg->stop) {
        ps_log(ps, "stopped by a signal at global step %lld", (long long)st.step);
        return dt_errorf(err, DT_EINTR, "ps %d: stopped by a signal", cfg->ps_index);
    }
    int rc = ps_shard_cron(ps->shard, now, &ps->io, err);
    if (rc) return rc;
    if (cfg->idle_timeout_ms > 0 && now - ps->last_message_us > (int64_t)cfg->idle_timeout_ms * 1000)
        /* Nobody waits forever: a ps whose chief is gone (outside dtrain launch) ends too. */
        return dt_errorf(err, DT_ETIMEOUT, "ps %d: no message from any worker for %d s (--idle_timeout) at global "
                         "step %lld: the chief never ended training (is it gone?); exiting", cfg->ps_index,
                         cfg->idle_timeout_ms / 1000, (long long)st.step);
    return DT_OK;
}

/* After a round: the metrics, and the connection checks. Their counters are read with the server
 * drained, so a connection's unread bytes are its unfinished message, not whole ones waiting here;
 * a flood that keeps the server from draining gets the looser check (peers.h) rather than none. */
static void after_round(ps_t *ps, int drained) {
    ps_shard_stats st;
    ps_shard_get_stats(ps->shard, &st);
    ps_publish(ps, &st);
    dt_peers_set_other(ps->peers, st.pending_bytes + (uint64_t)st.pending * HELD_ORIGIN_BYTES);
    dt_peers_set_own(ps->peers, st.sparse.bytes + st.sync_bytes);
    int64_t since = dt_clock_us() - ps->peers_checked_us, every = dt_peers_check_interval_us(ps->peers);
    if ((drained && since >= every) || since >= 4 * every) {
        dt_peers_check(ps->peers, drained);
        ps->peers_checked_us = dt_clock_us();
    }
}

static void fill_stats(const ps_t *ps, dt_ps_stats *out) {
    ps_shard_stats st = {0};
    if (ps->shard) ps_shard_get_stats(ps->shard, &st);
    *out = (dt_ps_stats){.global_step = st.step, .pushes = st.pushes, .updates = st.updates, .stale = st.stale,
                         .weighted = st.weighted, .pulls = st.pulls, .refused = st.refused,
                         .cut = ps->peers ? dt_peers_cut_count(ps->peers) : 0, .pending = st.pending,
                         .initialised = st.initialised};
}

/* One line: the request types that took the most time here, with their counts, their wall time and
 * the CPU they used (wall well above CPU: the ps waited for a core, or for memory it was given). */
static void log_spent(ps_t *ps) {
    char line[512];
    int len = snprintf(line, sizeof line, "time in requests (wall, of it CPU):"), shown = 0;
    int done[DT_MSG_TYPE_MAX + 1] = {0};
    for (int k = 0; k < 6; k++) {
        int best = -1;
        for (int t = 0; t <= DT_MSG_TYPE_MAX; t++)
            if (ps->spent[t].n && !done[t] && (best < 0 || ps->spent[t].wall_us > ps->spent[best].wall_us)) best = t;
        if (best < 0 || len >= (int)sizeof line - 80) break;
        len += snprintf(line + len, sizeof line - (size_t)len, "%s %s %llu: %.3f s (%.3f s)", shown++ ? "," : "",
                        dt_wire_type_name((uint8_t)best), (unsigned long long)ps->spent[best].n,
                        (double)ps->spent[best].wall_us * 1e-6, (double)ps->spent[best].cpu_us * 1e-6);
        done[best] = 1;
    }
    if (shown) ps_log(ps, "%s", line);
}

int dt_ps_serve(const dt_ps_config *cfg, dt_error *err) {
    ps_t ps;
    memset(&ps, 0, sizeof ps);
    int rc = ps_open(&ps, cfg, err);
    const int poll_ms = cfg->poll_ms > 0 ? cfg->poll_ms : 100;
    ps.last_message_us = dt_clock_us();
    while (rc == DT_OK && !(ps.shard && ps_shard_is_shut(ps.shard))) {
        dt_server_events(ps.srv, on_peer_gone, &ps);
        if ((rc = cron(&ps, dt_clock_us(), err))) break;
        int64_t check_ms = dt_peers_count(ps.peers) ? dt_peers_check_interval_us(ps.peers) / 1000 : poll_ms;
        int readable;
        dt_error we = {0};
        long wait_ms = check_ms < poll_ms ? (long)check_ms : poll_ms;
        int w = dt_server_wait(ps.srv, wait_ms, on_peer_gone, &ps, &readable, &we);
        if (w == DT_EINTR) continue;
        if (w) {
            rc = dt_errorf(err, w, "ps %d: %s", cfg->ps_index, we.msg);
            break;
        }
        /* Drained, as a rule: the connection checks need it, and reading is cheap next to what a
         * message costs to handle. */
        int drained = !readable || drain(&ps, &rc, err);
        if (rc) break;
        after_round(&ps, drained);
    }
    if (cfg->stats) fill_stats(&ps, cfg->stats);
    if (rc == DT_OK) log_spent(&ps);
    ps_close(&ps);
    return rc;
}
