/* The shard's requests: one table of message kinds, indexed by type, each with the conditions
 * checked before its handler runs (as Redis's command table with its flags); the small requests;
 * worker liveness and the shard's deadlines (ps_shard_cron). */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "ps/shard.h"
#include "ps/shard_impl.h"

/* ---- Lifecycle and counts --------------------------------------------------------------------- */

int ps_shard_new(ps_shard **out, const ps_shard_config *cfg, dt_error *err) {
    *out = NULL;
    if (cfg->shard_floats == 0 || cfg->shard_floats > DT_WIRE_MAX_SHARD_FLOATS)
        return dt_errorf(err, DT_EINVAL, "ps %d: shard of %zu floats (must be 1..%llu)", cfg->ps_index,
                         cfg->shard_floats, (unsigned long long)DT_WIRE_MAX_SHARD_FLOATS);
    if (cfg->ps_index < 0 || cfg->ps_index > UINT16_MAX)
        return dt_errorf(err, DT_EINVAL, "ps index %d out of range", cfg->ps_index);
    if (cfg->n_ps < 0 || (cfg->n_ps > 0 && cfg->ps_index >= cfg->n_ps))
        return dt_errorf(err, DT_EINVAL, "ps %d: n_ps %d does not include it", cfg->ps_index, cfg->n_ps);
    size_t end = 0;
    for (int r = 0; r < cfg->n_state_ranges; r++) {
        size_t off = cfg->state_ranges[2 * r], cnt = cfg->state_ranges[2 * r + 1];
        if (off < end || cnt > cfg->shard_floats || off > cfg->shard_floats - cnt)
            return dt_errorf(err, DT_EINVAL, "ps %d: state range %d [%zu, +%zu) out of order or outside the shard",
                             cfg->ps_index, r, off, cnt);
        end = off + cnt;
    }
    ps_shard *s = dt_calloc(1, sizeof *s, "ps shard", err);
    if (!s) return DT_ENOMEM;
    s->cfg = *cfg;
    s->n = cfg->shard_floats;
    *out = s;
    return DT_OK;
}

void ps_shard_free(ps_shard *s, const ps_io *io) {
    if (!s) return;
    for (int i = 0; i < s->n_pending; i++) io->drop(io->user, &s->pending[i].from);
    shard_sparse_free(s, io);
    free(s->pending);
    free(s->owner);
    shard_parts_free(s->parts, s->n_parts, s->staleness);
    free(s->scratch), free(s->sum), free(s->stale), free(s->last_seen), free(s->lost), free(s->done);
    free(s->count_from);
    free(s->counts);
    dt_coord_free(s->coord);
    free(s);
}

void ps_shard_get_stats(const ps_shard *s, ps_shard_stats *o) {
    int live = s->aggregate ? s->total - s->n_lost : s->workers - (int)s->n_done;
    *o = (ps_shard_stats){.step = shard_step(s), .pushes = s->pushes, .updates = s->updates, .pulls = s->pulls,
                          .refused = s->refused, .stale = s->n_stale, .weighted = s->n_weighted,
                          .pending = s->n_pending,
                          .pending_bytes = (uint64_t)s->n_pending * sizeof(pending_pull),
                          .initialised = s->initialised, .shutdown = s->shutdown, .live = live > 0 ? live : 0,
                          .workers = s->workers, .sync_bytes = s->sync_bytes};
    shard_sparse_stats(s, o);
}

int ps_shard_is_shut(const ps_shard *s) {
    return s->shutdown;
}

const uint64_t *ps_shard_stale_counts(const ps_shard *s, int *n) {
    *n = s->stale ? s->total : 0;
    return s->stale;
}

uint64_t ps_max_frame(int ps_index, size_t shard_floats) {
    return ps_index == 0 ? dt_wire_max_frame_ps0(shard_floats) : dt_wire_max_frame(shard_floats);
}

/* Everything peers may make the ps hold together (docs/security.md): unfinished messages, large
 * replies not yet sent, deferred PULLs. Room for every worker's pull and gradient of a step in
 * flight at once, four of the largest messages (an INIT, STATE replies) and 64 MiB to spare. */
uint64_t ps_shard_budget(const ps_shard *s) {
    uint64_t shard = (uint64_t)s->n * sizeof(float);
    return 4 * ps_max_frame(s->cfg.ps_index, s->n) + 2 * (uint64_t)(s->workers > 0 ? s->workers : 8) * shard +
           (UINT64_C(64) << 20);
}

enum {
    NEED_CHIEF = 1 << 0,      /* only the chief may send it (ERROR 104) */
    NEED_WORKER = 1 << 1,     /* only workers send it (ERROR 104) */
    NEED_READY = 1 << 2,      /* the chief's INIT has come (ERROR 102) */
    NEED_SHARD = 1 << 3,      /* its shard_floats is this shard's (ERROR 103) */
    NEED_CUT = 1 << 4,        /* cuts the shard as INIT did (ERROR 110: the client asks again) */
    NEED_PAYLOAD = 1 << 5,    /* the payload its header announces, of the right size (ERROR 101) */
    STOPPED_WHEN_FAILED = 1 << 6, /* refused once strict mode stopped the job (ERROR 111) */
};

typedef struct {
    unsigned flags;
    void (*handle)(const shard_req *r);
} shard_command;

/* ---- The small requests ----------------------------------------------------------------------- */

static void on_hello(const shard_req *r) {
    ps_shard *s = r->s;
    if (r->h->shard_floats != 0 && r->h->shard_floats != s->n) {
        shard_refuse(r, DT_WIRE_E_SHARD, "this ps holds %zu floats, the client expects %llu (same model and "
                     "--ps_hosts everywhere?)", s->n, (unsigned long long)r->h->shard_floats);
        return;
    }
    dt_wire_header a = shard_reply_to(s, DT_MSG_WELCOME, r->h);
    a.flags = s->importing ? DT_WIRE_F_IMPORTING : 0;
    shard_put_optimizer(s, &a);
    shard_send(r, &a);
}

static void on_status(const shard_req *r) {
    dt_wire_header a = shard_reply_to(r->s, DT_MSG_STATUS_REPLY, r->h);
    a.flags = r->s->importing ? DT_WIRE_F_IMPORTING : 0;
    a.status_reply.updates = r->s->updates;
    a.status_reply.params_replies = r->s->pulls;
    /* ps 0 with a work plan: for the chief's end of a job (docs/elastic.md, "The end of a job") */
    const dt_coord *c = r->s->coord;
    a.status_reply.workers_done =
            c ? dt_coord_count_ended(c, r->s->done, r->s->done ? DT_COORD_MAX_WORKERS : 0) : r->s->n_done;
    a.workers_busy = c ? dt_coord_busy(c, r->h->task) : 0;
    shard_send(r, &a);
}

static void on_heartbeat(const shard_req *r) {
    dt_wire_header a = shard_reply_to(r->s, DT_MSG_HEARTBEAT, r->h);
    shard_send(r, &a);
}

/* One line: how many stale gradients each worker sent (TensorFlow drops them silently). */
static void log_stale_summary(const ps_shard *s) {
    if (!s->aggregate) return;
    char line[512];
    int len = snprintf(line, sizeof line, "stale gradients dropped: %llu", (unsigned long long)s->n_stale);
    for (int w = 0; w < s->total && len < (int)sizeof line - 40; w++)
        len += snprintf(line + len, sizeof line - (size_t)len, "%sworker %d: %llu", w ? ", " : " (", w,
                        (unsigned long long)s->stale[w]);
    if (len < (int)sizeof line - 2) snprintf(line + len, sizeof line - (size_t)len, ")");
    shard_log(s, "%s", line);
}

static void on_shutdown(const shard_req *r) {
    ps_shard *s = r->s;
    shard_log(s, "shutdown by the chief (worker %u) at global step %lld after %llu pushes, %llu updates, %llu pulls",
              r->h->task, (long long)shard_step(s), (unsigned long long)s->pushes, (unsigned long long)s->updates,
              (unsigned long long)s->pulls);
    log_stale_summary(s);
    dt_wire_header a = shard_reply_to(s, DT_MSG_ACK, r->h);
    shard_send(r, &a);
    s->shutdown = 1;
    shard_serve_pending(s, r->now, r->io);
}

static void apply_and_serve(ps_shard *s, int64_t now, const ps_io *io);

/* Sync: a worker that sent DONE (finished, or without work at a dynamic epoch's end) sits steps
 * out: they wait for the others only, until it pushes or pulls again (back_in). */
static void sit_out(const shard_req *r) {
    ps_shard *s = r->s;
    s->n_sitting++;
    shard_count_none(s, r->h->task);
    shard_log(s, "worker %u sits steps out (DONE): %d live worker(s), steps aggregate %d gradient(s)", r->h->task,
              s->total - s->n_lost - s->n_sitting, shard_needed(s));
    apply_and_serve(s, r->now, r->io);
}

/* A PUSH or PULL from a worker that sent DONE: it trains again (dynamic sharding gave it work). */
static void back_in(ps_shard *s, const dt_wire_header *h) {
    uint8_t bit = (uint8_t)(1u << (h->task & 7));
    if (!s->done || !(s->done[h->task >> 3] & bit)) return;
    s->done[h->task >> 3] &= (uint8_t)~bit;
    s->n_done--;
    if (h->task >= s->total) return;
    s->n_sitting--;
    shard_count_from_now(s, h->task);
    shard_log(s, "worker %u trains again: %d live worker(s), steps aggregate %d gradient(s)", h->task,
              s->total - s->n_lost - s->n_sitting, shard_needed(s));
}

/* Counted per distinct worker task, so a resent DONE is not counted twice. */
static void on_done(const shard_req *r) {
    ps_shard *s = r->s;
    const dt_wire_header *h = r->h;
    if (!s->done && !(s->done = dt_calloc(65536 / 8, 1, "ps done set", NULL))) {
        shard_refuse(r, DT_WIRE_E_NOMEM, "out of memory for the done set");
        return;
    }
    /* Its units go back to the pool; one waiting for work holds none and stays a member (the
     * chief's end of a job waits for it). */
    if (s->coord && !(h->flags & DT_WIRE_F_WAITING)) dt_coord_leave(s->coord, h->task);
    uint8_t bit = (uint8_t)(1u << (h->task & 7));
    if (!(s->done[h->task >> 3] & bit)) {
        s->done[h->task >> 3] |= bit;
        s->n_done++;
        if (h->task < s->total) sit_out(r);
        /* Every declared worker's line (a WAITING one is not finished: sit_out said so); from tasks
         * not (yet) declared, a few, then a count. */
        int known = s->workers && h->task < s->workers, waiting = (h->flags & DT_WIRE_F_WAITING) != 0;
        if (!waiting && (known || ++s->n_done_logged <= SHARD_LOG_DONE))
            shard_log(s, "worker %u finished (%llu done)%s", h->task, (unsigned long long)s->n_done,
                      !known && s->n_done_logged == SHARD_LOG_DONE ? "; further DONE from tasks the chief has not "
                      "declared are counted, not logged" : "");
    }
    dt_wire_header a = shard_reply_to(s, DT_MSG_ACK, h);
    shard_send(r, &a);
}

static void on_token(const shard_req *r) {
    shard_refuse(r, DT_WIRE_E_UNSUPPORTED, "TOKEN (sync mode) is not served by this ps");
}

/* Indexed by message type; a type without a handler (a reply) is refused. */
static const shard_command commands[DT_MSG_TYPE_MAX + 1] = {
    [DT_MSG_HELLO] = {0, on_hello},
    [DT_MSG_INIT] = {NEED_CHIEF | NEED_SHARD | NEED_PAYLOAD, shard_on_init},
    [DT_MSG_PULL] = {NEED_READY | NEED_CUT | STOPPED_WHEN_FAILED, shard_on_pull},
    [DT_MSG_PUSH] = {NEED_READY | NEED_CUT | NEED_PAYLOAD | STOPPED_WHEN_FAILED, shard_on_push},
    [DT_MSG_FETCH] = {NEED_READY, shard_on_fetch},
    [DT_MSG_STATUS] = {0, on_status},
    [DT_MSG_HEARTBEAT] = {0, on_heartbeat},
    [DT_MSG_SHUTDOWN] = {NEED_CHIEF, on_shutdown},
    [DT_MSG_DONE] = {NEED_WORKER, on_done},
    [DT_MSG_TOKEN] = {0, on_token},
    [DT_MSG_SPARSE_INIT] = {NEED_CHIEF | NEED_READY | NEED_PAYLOAD, shard_on_sparse_init},
    [DT_MSG_SPARSE_PULL] = {NEED_READY | NEED_PAYLOAD | STOPPED_WHEN_FAILED, shard_on_sparse_pull},
    [DT_MSG_SPARSE_PUSH] = {NEED_READY | NEED_PAYLOAD | STOPPED_WHEN_FAILED, shard_on_sparse_push},
    [DT_MSG_SPARSE_EXPORT] = {NEED_READY | NEED_PAYLOAD, shard_on_sparse_export},
    [DT_MSG_SPARSE_IMPORT] = {NEED_CHIEF | NEED_READY | NEED_PAYLOAD, shard_on_sparse_import},
    [DT_MSG_WORK_ASK] = {NEED_WORKER, shard_on_work_ask},
    [DT_MSG_WORK_DONE] = {NEED_WORKER | STOPPED_WHEN_FAILED, shard_on_work_done},
    [DT_MSG_WORK_STATE] = {NEED_CHIEF | NEED_PAYLOAD, shard_on_work_state},
};

/* ---- Dispatch --------------------------------------------------------------------------------- */

/* The conditions of a command, in this order; whether they hold (else refused). */
static int check_conditions(const shard_req *r, unsigned flags) {
    const ps_shard *s = r->s;
    const dt_wire_header *h = r->h;
    const int worker = h->role == DT_ROLE_WORKER || h->role == DT_ROLE_CHIEF;
    if (s->failed[0] && (flags & STOPPED_WHEN_FAILED)) {
        shard_refuse(r, DT_WIRE_E_LOST, "%s", s->failed);
        return 0;
    }
    if ((flags & NEED_CHIEF) && h->role != DT_ROLE_CHIEF) {
        shard_refuse(r, DT_WIRE_E_ROLE, "only the chief may send %s (sender is %s %u)", dt_wire_type_name(h->type),
                     dt_wire_role_name(h->role), h->task);
        return 0;
    }
    if ((flags & NEED_WORKER) && !worker) {
        shard_refuse(r, DT_WIRE_E_ROLE, "only workers send %s", dt_wire_type_name(h->type));
        return 0;
    }
    if ((flags & NEED_READY) && !s->initialised) {
        shard_refuse(r, DT_WIRE_E_NOT_READY, "not initialised yet: the chief (worker 0) has not sent INIT");
        return 0;
    }
    if ((flags & NEED_SHARD) && h->shard_floats != s->n) {
        shard_refuse(r, DT_WIRE_E_SHARD, "%s for a shard of %llu floats, this ps holds %zu (same model and "
                     "--ps_hosts everywhere?)", dt_wire_type_name(h->type), (unsigned long long)h->shard_floats, s->n);
        return 0;
    }
    if ((flags & NEED_CUT) && h->chunks != s->n_parts) {
        shard_refuse(r, DT_WIRE_E_RESYNC, "%s for chunk %u of %u, but this ps cuts its shard into %d chunk(s) (the "
                     "chief's --chunk_kb): ask again with that cut", dt_wire_type_name(h->type), h->chunk, h->chunks,
                     s->n_parts);
        return 0;
    }
    dt_error e = {0};
    if ((flags & NEED_PAYLOAD) && dt_wire_check_payload(h, s->n, &e) != DT_OK) {
        shard_refuse(r, DT_WIRE_E_MALFORMED, "%s", e.msg);
        return 0;
    }
    return 1;
}

/* Any message from a worker proves it alive; one that was lost is back (its steps count again). */
static void note_alive(ps_shard *s, const dt_wire_header *h, int64_t now) {
    shard_work_seen(s, h, now);
    if (h->type == DT_MSG_PUSH || h->type == DT_MSG_PULL || h->type == DT_MSG_SPARSE_PUSH) back_in(s, h);
    if (!s->last_seen || (h->role != DT_ROLE_WORKER && h->role != DT_ROLE_CHIEF) || h->task >= s->total) return;
    shard_saw_worker(s, h, now);
    if (!s->lost[h->task]) return;
    const int first = s->lost[h->task] == SHARD_NEVER_HEARD;
    s->lost[h->task] = 0;
    s->n_lost--;
    shard_count_from_now(s, h->task);
    shard_log(s, first ? "worker %u joined: steps wait for %d gradient(s)" : "worker %u is back: steps wait for %d "
              "gradient(s) again", h->task, shard_needed(s));
}

/* Checks every request needs (addressed to this shard, from a task of the cluster), then the
 * command's own conditions, then runs it. */
static void dispatch(const shard_req *r) {
    ps_shard *s = r->s;
    const dt_wire_header *h = r->h;
    if (h->shard != (uint32_t)s->cfg.ps_index) {
        shard_refuse(r, DT_WIRE_E_SHARD, "message for ps %u reached ps %d (do all processes list --ps_hosts in the "
                     "same order?)", h->shard, s->cfg.ps_index);
        return;
    }
    if ((h->role == DT_ROLE_WORKER || h->role == DT_ROLE_CHIEF) && s->workers && h->task >= s->workers) {
        shard_refuse(r, DT_WIRE_E_BAD_VALUE, "%s %u is not in this cluster (the chief declared %d worker task(s), "
                     "0..%d: its --worker_hosts, or --max_workers)", dt_wire_role_name(h->role), h->task, s->workers,
                     s->workers - 1);
        return;
    }
    note_alive(s, h, r->now);
    const shard_command *cmd = h->type <= DT_MSG_TYPE_MAX ? &commands[h->type] : NULL;
    if (cmd && cmd->handle) {
        if (check_conditions(r, cmd->flags)) cmd->handle(r);
        return;
    }
    shard_refuse(r, DT_WIRE_E_MALFORMED, "%s is a reply, not a request", dt_wire_type_name(h->type));
}

void ps_shard_request(ps_shard *s, const ps_origin *from, const dt_wire_header *h, dt_bytes *payload, int64_t now,
                      const ps_io *io) {
    dt_bytes none = {0};
    shard_req r = {.s = s, .from = from, .h = h, .payload = payload ? payload : &none, .now = now, .io = io};
    dispatch(&r);
    dt_bytes_release(r.payload); /* unless a handler kept it */
}

/* ---- Worker liveness and deadlines ------------------------------------------------------------ */

/* Worker w is lost: each step now waits for the live workers only, or, strict, the job stops
 * (every held and later request refused). Whether the job stopped. */
static int lose_worker(ps_shard *s, int w, int64_t now, const ps_io *io) {
    const int before = shard_needed(s);
    s->lost[w] = 1;
    s->n_lost++;
    shard_count_none(s, w);
    if (s->strict) {
        snprintf(s->failed, sizeof s->failed, "worker %d lost (no message for %lld ms, --heartbeat_timeout / 2) "
                 "and --strict is set: the job stops", w, (long long)(s->liveness_us / 1000));
        shard_log(s, "%s", s->failed);
        s->failed_at_us = now;
        shard_fail_pending(s, io, DT_WIRE_E_LOST, s->failed);
        return 1;
    }
    /* live: not lost and not sitting steps out; before: what steps waited for until now */
    shard_log(s, "worker %d lost (no message for %lld ms): steps now wait for %d gradient(s) from the %d live "
              "worker(s) instead of %d", w, (long long)(s->liveness_us / 1000), shard_needed(s),
              s->total - s->n_lost - s->n_sitting, before);
    return 0;
}

/* Sync mode: workers silent for the liveness timeout are lost (a finished worker, or one waiting
 * at the barrier, is not); steps complete with the live workers' gradients are applied. */
static void check_liveness(ps_shard *s, int64_t now, const ps_io *io) {
    if (!s->aggregate || !s->liveness_us || !s->initialised || s->failed[0]) return;
    for (int w = 0; w < s->total; w++) {
        if (s->lost[w] || now - s->last_seen[w] <= s->liveness_us) continue;
        if ((s->done && (s->done[w >> 3] & (1u << (w & 7)))) || shard_has_pending(s, w)) continue;
        if (lose_worker(s, w, now, io)) return;
    }
    apply_and_serve(s, now, io);
}

/* Steps that fewer workers now complete are applied, and the PULLs waiting for them answered. */
static void apply_and_serve(ps_shard *s, int64_t now, const ps_io *io) {
    if (!s->aggregate || !s->initialised) return;
    int applied = 0;
    for (int c = 0; c < s->n_parts; c++) applied |= shard_apply_complete_steps(s, &s->parts[c]);
    if (applied) shard_serve_pending(s, now, io);
    if (shard_sparse_apply_complete(s)) shard_sparse_serve(s, now, io);
}

int ps_shard_cron(ps_shard *s, int64_t now, const ps_io *io, dt_error *err) {
    shard_work_cron(s, now); /* first: a worker waiting at the barrier now is alive */
    check_liveness(s, now, io);
    /* strict: the ps exits one liveness timeout after the stop, so that workers hear why */
    if (s->failed[0] && now - s->failed_at_us > s->liveness_us)
        return dt_errorf(err, DT_ETIMEOUT, "ps %d: %s", s->cfg.ps_index, s->failed);
    shard_expire_pending(s, now, io);
    return DT_OK;
}
