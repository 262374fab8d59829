#include "worker/ps_client.h"

#include <errno.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "core/error.h"
#include "transport/auth.h"
#include "transport/zmq_io.h"

#define MAX_AWAIT 2           /* outstanding requests per ps within one call */
#define HELLO_RESEND_MS 1000  /* a HELLO lost with a dropped connection is sent again */
#define READY_POLL_MS 100
#define LATE_WAKE_MS 250      /* a poll that returns this much later than asked: the process was stopped */

typedef struct {
    uint32_t id;              /* request id awaited */
    uint8_t req, want;        /* request type sent, reply type expected */
    int64_t sent_ms;          /* when (dt_clock_ms) */
} await_t;

typedef struct {
    void *sock;
    char *endpoint;
    size_t n;                 /* shard floats */
    dt_ps_shard_status st;
    await_t await[MAX_AWAIT];
    int n_await;
    int64_t quiet_since;      /* since when this ps may have heard nothing from us (dt_ps_client_silent_ms) */
    zmq_msg_t held;           /* the last PARAMS payload, kept for dt_ps_client_pull_views */
    float *aligned;           /* [n] copy of a PARAMS payload libzmq left misaligned (rare) */
} ps_conn;

struct dt_ps_client {
    void *ctx;
    int n_ps;
    ps_conn *ps;
    dt_wire_role role;
    uint16_t task;
    int connect_timeout_ms, request_timeout_ms;
    int curve;                /* --auth=curve (for the connect error's hint) */
    uint32_t next_id;
    atomic_int inflight;      /* zero-copy gradient frames libzmq still references */
    int aggregate, total, staleness; /* sync replicas; aggregate 0: asynchronous */
    int n_workers;            /* told to every ps in INIT; 0: not told */
    int liveness_ms, strict;
    int last_refusal;         /* DT_WIRE_E_* of the latest ERROR reply (dt_ps_client_last_refusal) */
    FILE *log;                /* NULL: quiet */
    dt_ps_client_stats stats;
};

/* What a gather call does with each expected reply. */
typedef int (*reply_fn)(dt_ps_client *c, int ps, dt_wire_in *in, void *user, dt_error *err);

static int fail_ps(dt_ps_client *c, int ps, dt_error *err, int code, const char *what, const char *msg) {
    return dt_errorf(err, code, "ps %d at %s: %s%s%s", ps, c->ps[ps].endpoint, what, *what ? ": " : "", msg);
}

static void set_send_timeout(ps_conn *p, int64_t deadline) {
    int64_t left = deadline - dt_clock_ms();
    int ms = left <= 0 ? 0 : left > INT32_MAX ? INT32_MAX : (int)left;
    zmq_setsockopt(p->sock, ZMQ_SNDTIMEO, &ms, sizeof ms);
}

/* Sends one request to ps i and records that its reply (want) is awaited. h: type and the
 * type-specific fields; routing fields are filled here. payload is consumed. */
static int send_req(dt_ps_client *c, int i, dt_wire_header *h, uint8_t want, zmq_msg_t *payload,
                    int64_t deadline, dt_error *err) {
    ps_conn *p = &c->ps[i];
    if (p->n_await >= MAX_AWAIT) {
        if (payload) zmq_msg_close(payload);
        return dt_errorf(err, DT_EINVAL, "ps %d: too many outstanding requests", i);
    }
    if (++c->next_id == 0) c->next_id = 1; /* 0 means "no id" in refusals */
    h->role = (uint8_t)c->role;
    h->task = c->task;
    h->request_id = c->next_id;
    h->shard = (uint32_t)i;
    set_send_timeout(p, deadline);
    dt_error e = {0};
    int rc = dt_wire_send(p->sock, NULL, h, payload, 0, &e);
    if (rc) return fail_ps(c, i, err, rc, "", rc == DT_ETIMEOUT ? "send timed out (too many requests queued)" : e.msg);
    p->quiet_since = dt_clock_ms();
    p->await[p->n_await++] = (await_t){.id = h->request_id, .req = h->type, .want = want, .sent_ms = p->quiet_since};
    return DT_OK;
}

static int take_await(ps_conn *p, uint32_t id, await_t *a) {
    for (int k = 0; k < p->n_await; k++) {
        if (p->await[k].id != id) continue;
        *a = p->await[k];
        p->await[k] = p->await[--p->n_await];
        return 1;
    }
    return 0;
}

static void clear_awaits(dt_ps_client *c) {
    for (int i = 0; i < c->n_ps; i++) c->ps[i].n_await = 0;
}

static void note_status(ps_conn *p, const dt_wire_header *h) {
    p->st.global_step = h->global_step;
    p->st.initialised = h->initialised != 0;
    p->st.generation = h->initialised;
}

/* Handles one received message from ps i: 1 if it answered an awaited request, 0 if it was a
 * stale reply (an earlier request that timed out), < 0 on error. */
static int on_message(dt_ps_client *c, int i, dt_wire_in *in, reply_fn fn, void *user, dt_error *err) {
    ps_conn *p = &c->ps[i];
    await_t a;
    if (!take_await(p, in->hdr.request_id, &a)) return 0;
    /* The ps heard from us when it answered (a PULL it held: that much after we sent it), however
     * late we read the reply (this process may have been stopped meanwhile). */
    int64_t now = dt_clock_ms(), held_ms = in->hdr.type == DT_MSG_PARAMS ? (int64_t)(in->hdr.count_a / 1000) : 0;
    int64_t answered = held_ms < now - a.sent_ms ? a.sent_ms + held_ms : now;
    if (answered > p->quiet_since) p->quiet_since = answered;
    const uint8_t want = a.want;
    const char *tn = dt_wire_type_name(a.req);
    if (in->hdr.type == DT_MSG_ERROR) {
        c->last_refusal = in->hdr.status;
        char text[DT_WIRE_MAX_ERROR_TEXT + 1], what[32];
        dt_wire_error_text(text, sizeof text, zmq_msg_data(&in->payload), zmq_msg_size(&in->payload));
        snprintf(what, sizeof what, "%s refused", tn);
        return fail_ps(c, i, err, DT_EPROTO, what, text);
    }
    if (in->hdr.type != want || in->hdr.shard != (uint32_t)i || in->hdr.role != DT_ROLE_PS) {
        char msg[160];
        snprintf(msg, sizeof msg, "got %s from %s %u for shard %u, expected %s from ps %d",
                 dt_wire_type_name(in->hdr.type), dt_wire_role_name(in->hdr.role), in->hdr.task,
                 in->hdr.shard, tn, i);
        return fail_ps(c, i, err, DT_EPROTO, "unexpected reply", msg);
    }
    dt_error e = {0};
    if (dt_wire_check_payload(&in->hdr, p->n, &e)) return fail_ps(c, i, err, DT_EPROTO, tn, e.msg);
    note_status(p, &in->hdr);
    int rc = fn ? fn(c, i, in, user, err) : DT_OK;
    return rc ? rc : 1;
}

/* Waits until every awaited reply has arrived (calling fn on each) or the deadline passes. */
static int gather(dt_ps_client *c, int64_t deadline, const char *what, reply_fn fn, void *user,
                  dt_error *err) {
    zmq_pollitem_t items[c->n_ps];
    int idx[c->n_ps];
    for (;;) {
        int n = 0;
        for (int i = 0; i < c->n_ps; i++)
            if (c->ps[i].n_await) {
                items[n] = (zmq_pollitem_t){.socket = c->ps[i].sock, .events = ZMQ_POLLIN};
                idx[n++] = i;
            }
        if (n == 0) {
            c->last_refusal = 0;
            return DT_OK;
        }
        int64_t left = deadline - dt_clock_ms();
        if (left <= 0) {
            char msg[256];
            /* A sync PULL is the barrier: it waits for the other workers, not only for the ps. */
            snprintf(msg, sizeof msg, "no reply within %d ms (--heartbeat_timeout): %s", c->request_timeout_ms,
                     c->aggregate && strstr(what, "PULL")
                         ? "the ps is down, or the sync barrier waits for workers that are gone (the step "
                           "needs --replicas_to_aggregate gradients; backup workers let it lose some)"
                         : "the ps is down or overloaded");
            int rc = fail_ps(c, idx[0], err, DT_ETIMEOUT, what, msg);
            clear_awaits(c);
            return rc;
        }
        long wait_ms = left > 1000 ? 1000 : (long)left;
        int64_t before = dt_clock_ms();
        int r = zmq_poll(items, n, wait_ms);
        int64_t after = dt_clock_ms();
        /* Waiting for a reply, this worker counts as alive to the ps (a sync ps holding its PULL
         * does not count it silent), unless the process was not running: a wake far later than
         * asked means it was stopped (SIGSTOP, a paused machine), and its silence runs on. */
        if (after - before <= wait_ms + LATE_WAKE_MS)
            for (int k = 0; k < n; k++) c->ps[idx[k]].quiet_since = after;
        if (r < 0) {
            if (errno == EINTR) {
                clear_awaits(c);
                return dt_errorf(err, DT_EINTR, "%s interrupted by a signal", what);
            }
            clear_awaits(c);
            return dt_errorf(err, DT_ENET, "%s: zmq_poll: %s", what, zmq_strerror(errno));
        }
        for (int k = 0; k < n && r > 0; k++) {
            if (!(items[k].revents & ZMQ_POLLIN)) continue;
            int i = idx[k];
            while (c->ps[i].n_await) {
                dt_wire_in in;
                dt_error e = {0};
                int rc = dt_wire_recv(c->ps[i].sock, 0, &in, &e);
                if (rc == DT_ETIMEOUT) {
                    dt_wire_in_close(&in);
                    break;
                }
                if (rc == DT_OK) rc = on_message(c, i, &in, fn, user, err);
                else rc = fail_ps(c, i, err, rc, what, e.msg);
                dt_wire_in_close(&in);
                if (rc < 0) {
                    clear_awaits(c);
                    return rc;
                }
            }
        }
    }
}

static void release_inflight(void *data, void *hint) {
    (void)data;
    atomic_fetch_sub(&((dt_ps_client *)hint)->inflight, 1);
}

/* Zero-copy frames are released by libzmq's I/O thread once written; a reply proves the ps has
 * them, so this wait is almost always zero, but the caller may reuse its buffer only after it. */
static int wait_inflight(dt_ps_client *c, int64_t deadline, dt_error *err) {
    while (atomic_load(&c->inflight) > 0) {
        if (dt_clock_ms() > deadline)
            return dt_errorf(err, DT_ETIMEOUT, "gradient buffers still held by the transport after the replies");
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    return DT_OK;
}

int dt_ps_client_n_ps(const dt_ps_client *c) { return c->n_ps; }

int dt_ps_client_last_refusal(const dt_ps_client *c) { return c->last_refusal; }

int64_t dt_ps_client_silent_ms(const dt_ps_client *c) {
    int64_t oldest = INT64_MAX;
    for (int i = 0; i < c->n_ps; i++)
        if (c->ps[i].quiet_since < oldest) oldest = c->ps[i].quiet_since;
    return c->n_ps ? dt_clock_ms() - oldest : 0;
}

const dt_ps_client_stats *dt_ps_client_get_stats(const dt_ps_client *c) { return &c->stats; }

const dt_ps_shard_status *dt_ps_client_shard(const dt_ps_client *c, int ps) {
    return ps >= 0 && ps < c->n_ps ? &c->ps[ps].st : NULL;
}

void dt_ps_client_close(dt_ps_client *c) {
    if (!c) return;
    for (int i = 0; i < c->n_ps && c->ps; i++) {
        if (c->ps[i].sock) zmq_close(c->ps[i].sock);
        zmq_msg_close(&c->ps[i].held);
        free(c->ps[i].endpoint);
        free(c->ps[i].aligned);
    }
    /* Terminating the context releases every zero-copy frame still queued (linger is 0). */
    if (c->ctx) zmq_ctx_term(c->ctx);
    free(c->ps);
    free(c);
}

static int on_welcome(dt_ps_client *c, int i, dt_wire_in *in, void *user, dt_error *err) {
    if (in->hdr.shard_floats == c->ps[i].n) return DT_OK;
    char msg[160];
    snprintf(msg, sizeof msg, "holds %llu floats, this worker expects %zu (same model and --ps_hosts everywhere?)",
             (unsigned long long)in->hdr.shard_floats, c->ps[i].n);
    return fail_ps(c, i, err, DT_EPROTO, "", msg);
}

/* HELLO to every ps. A DEALER queues messages until its connection is up (ZeroMQ reconnects with
 * backoff), so one HELLO per ps would do; it is resent every HELLO_RESEND_MS in case a connection
 * dropped with it, and replies to the duplicates are discarded by request id. */
static int hello_all(dt_ps_client *c, dt_error *err) {
    int64_t start = dt_clock_ms(), deadline = start + c->connect_timeout_ms;
    int n = c->n_ps;
    int64_t sent_at[n];
    int welcomed[n], told[n], left = n;
    for (int i = 0; i < n; i++) sent_at[i] = -1, welcomed[i] = 0, told[i] = 0;
    zmq_pollitem_t items[n];
    while (left > 0) {
        int64_t now = dt_clock_ms();
        /* A ps silent for a second is most likely not up yet: say once whom this worker waits for,
         * and how long it will, rather than nothing until the deadline. */
        for (int i = 0; i < n && c->log && now - start >= HELLO_RESEND_MS; i++) {
            if (welcomed[i] || told[i]) continue;
            fprintf(c->log, "worker %u: waiting for ps %d at %s (not up yet?); retrying for up to %g s "
                    "(--connect_timeout)\n", c->task, i, c->ps[i].endpoint, c->connect_timeout_ms / 1000.0);
            fflush(c->log);
            told[i] = 1;
        }
        for (int i = 0; i < n && now >= deadline; i++) {
            if (welcomed[i]) continue;
            char msg[320];
            snprintf(msg, sizeof msg, "no answer to HELLO within %d ms (is the ps running, and do all processes "
                     "use the same --ps_hosts and --auth?%s)", c->connect_timeout_ms,
                     c->curve ? " With --auth=curve a ps refuses a client whose key is not in its authorized "
                                "folder, or that has another server.key; the ps logs the refusal" : "");
            clear_awaits(c);
            return fail_ps(c, i, err, DT_ETIMEOUT, "", msg);
        }
        for (int i = 0; i < n; i++) {
            ps_conn *p = &c->ps[i];
            items[i] = (zmq_pollitem_t){.socket = p->sock, .events = welcomed[i] ? 0 : ZMQ_POLLIN};
            if (welcomed[i] || (sent_at[i] >= 0 && now - sent_at[i] < HELLO_RESEND_MS)) continue;
            dt_wire_header h = dt_wire_header_make(DT_MSG_HELLO, c->role, c->task, 0);
            h.shard_floats = p->n;
            if (p->n_await == MAX_AWAIT) p->n_await = 0; /* forget the oldest HELLOs */
            int rc = send_req(c, i, &h, DT_MSG_WELCOME, NULL, deadline, err);
            /* A ps that refuses the handshake (--auth) leaves no connection to queue on, so the
             * resend blocks until the deadline: reported as no answer, like a ps that is down. */
            if (rc == DT_ETIMEOUT) break;
            if (rc) {
                clear_awaits(c);
                return rc;
            }
            sent_at[i] = now;
        }
        int64_t wait = deadline - now;
        if (wait > 50) wait = 50; /* re-evaluate resends and the deadline */
        if (zmq_poll(items, n, (long)wait) < 0) {
            clear_awaits(c);
            if (errno == EINTR) return dt_errorf(err, DT_EINTR, "connecting to the ps tasks interrupted by a signal");
            return dt_errorf(err, DT_ENET, "zmq_poll: %s", zmq_strerror(errno));
        }
        for (int i = 0; i < n; i++) {
            ps_conn *p = &c->ps[i];
            if (!(items[i].revents & ZMQ_POLLIN)) continue;
            for (;;) {
                dt_wire_in in;
                dt_error e = {0};
                int rc = dt_wire_recv(p->sock, 0, &in, &e);
                if (rc == DT_ETIMEOUT) {
                    dt_wire_in_close(&in);
                    break;
                }
                if (rc == DT_OK) rc = on_message(c, i, &in, on_welcome, NULL, err);
                else rc = fail_ps(c, i, err, rc, "HELLO", e.msg);
                dt_wire_in_close(&in);
                if (rc < 0) {
                    clear_awaits(c);
                    return rc;
                }
                if (rc == 1) {
                    welcomed[i] = 1;
                    left--;
                    p->n_await = 0; /* later replies to duplicate HELLOs are discarded as stale */
                    break;
                }
            }
        }
    }
    return DT_OK;
}

int dt_ps_client_open(dt_ps_client **out, const dt_ps_client_config *cfg, dt_error *err) {
    *out = NULL;
    if (cfg->n_ps <= 0 || !cfg->endpoints || !cfg->shard_floats)
        return dt_errorf(err, DT_EINVAL, "ps client: no ps tasks given");
    if (cfg->role != DT_ROLE_WORKER && cfg->role != DT_ROLE_CHIEF)
        return dt_errorf(err, DT_EINVAL, "ps client: role must be worker or chief");
    if (cfg->task < 0 || cfg->task > UINT16_MAX)
        return dt_errorf(err, DT_EINVAL, "ps client: task index %d out of range", cfg->task);
    dt_ps_client *c = dt_calloc(1, sizeof *c, "ps client", err);
    if (!c) return DT_ENOMEM;
    c->n_ps = cfg->n_ps;
    c->role = cfg->role;
    c->task = (uint16_t)cfg->task;
    c->connect_timeout_ms = cfg->connect_timeout_ms > 0 ? cfg->connect_timeout_ms : 10000;
    c->request_timeout_ms = cfg->request_timeout_ms > 0 ? cfg->request_timeout_ms : 60000;
    if (cfg->replicas_to_aggregate < 0 || cfg->total_num_replicas < 0 || cfg->staleness < 0 ||
        (cfg->replicas_to_aggregate > 0 &&
         (cfg->total_num_replicas < cfg->replicas_to_aggregate || cfg->total_num_replicas > (int)DT_WIRE_MAX_REPLICAS ||
          cfg->staleness > (int)DT_WIRE_MAX_STALENESS))) {
        free(c);
        return dt_errorf(err, DT_EINVAL, "ps client: sync configuration aggregate %d, total %d, staleness %d "
                         "(need 1 <= aggregate <= total <= %u, staleness <= %u)", cfg->replicas_to_aggregate,
                         cfg->total_num_replicas, cfg->staleness, DT_WIRE_MAX_REPLICAS, DT_WIRE_MAX_STALENESS);
    }
    if (cfg->replicas_to_aggregate > 0) {
        c->aggregate = cfg->replicas_to_aggregate;
        c->total = cfg->total_num_replicas;
        c->staleness = cfg->staleness;
        c->liveness_ms = cfg->liveness_ms > 0 ? cfg->liveness_ms : 0;
        c->strict = cfg->strict != 0;
    }
    c->n_workers = cfg->n_workers > 0 && cfg->n_workers <= (int)DT_WIRE_MAX_REPLICAS ? cfg->n_workers : 0;
    atomic_init(&c->inflight, 0);
    c->curve = cfg->auth && cfg->auth->curve;
    c->log = cfg->log;
    int rc = DT_OK;
    if (!(c->ps = dt_calloc((size_t)cfg->n_ps, sizeof *c->ps, "ps client connections", err))) {
        rc = DT_ENOMEM;
        goto fail;
    }
    if (!(c->ctx = zmq_ctx_new())) {
        rc = dt_errorf(err, DT_ENET, "zmq_ctx_new: %s", zmq_strerror(errno));
        goto fail;
    }
    for (int i = 0; i < c->n_ps; i++) zmq_msg_init(&c->ps[i].held);
    for (int i = 0; i < c->n_ps; i++) {
        ps_conn *p = &c->ps[i];
        const char *ep = cfg->endpoints[i];
        size_t n = cfg->shard_floats[i];
        if (!ep || !*ep) {
            rc = dt_errorf(err, DT_EINVAL, "ps %d: empty endpoint", i);
            goto fail;
        }
        if (n == 0 || n > DT_WIRE_MAX_SHARD_FLOATS) {
            rc = dt_errorf(err, DT_EINVAL, "ps %d at %s: shard of %zu floats (must be 1..%llu)", i, ep, n,
                           (unsigned long long)DT_WIRE_MAX_SHARD_FLOATS);
            goto fail;
        }
        p->n = n;
        if (!(p->endpoint = dt_malloc(strlen(ep) + 1, "ps endpoint", err))) {
            rc = DT_ENOMEM;
            goto fail;
        }
        strcpy(p->endpoint, ep);
        /* The largest reply is STATE (parameters and up to 2 optimizer slots). */
        if (!(p->sock = dt_zsock_open(c->ctx, ZMQ_DEALER, dt_wire_max_frame(n), 0, c->request_timeout_ms, err))) {
            rc = dt_error_prefix(err, "ps %d at %s: ", i, ep);
            goto fail;
        }
        if ((rc = dt_zsock_heartbeat(p->sock, c->request_timeout_ms, err))) {
            dt_error_prefix(err, "ps %d at %s: ", i, ep);
            goto fail;
        }
        if ((rc = dt_auth_client_socket(p->sock, cfg->auth, err))) {
            dt_error_prefix(err, "ps %d at %s: ", i, ep);
            goto fail;
        }
        if (dt_zsock_connect(p->sock, ep) != 0) {
            rc = dt_errorf(err, DT_EINVAL, "ps %d: cannot connect to '%s': %s", i, ep, zmq_strerror(errno));
            goto fail;
        }
    }
    if ((rc = hello_all(c, err))) goto fail;
    *out = c;
    return DT_OK;
fail:
    dt_ps_client_close(c);
    return rc;
}

int dt_ps_client_init(dt_ps_client *c, const dt_opt_config *opt, const float *const *params,
                      const float *const *state, int64_t global_step, dt_error *err) {
    if (c->role != DT_ROLE_CHIEF) return dt_errorf(err, DT_EINVAL, "only the chief initialises the ps tasks");
    if (global_step < 0) return dt_errorf(err, DT_EINVAL, "initial global step %lld < 0", (long long)global_step);
    int slots = dt_opt_slots(opt);
    int64_t deadline = dt_clock_ms() + c->request_timeout_ms;
    /* A generation no shard reported last: after the newest one, skipping any in use (1..255). */
    int gen = 0;
    for (int i = 0; i < c->n_ps; i++)
        if (c->ps[i].st.generation > gen) gen = c->ps[i].st.generation;
    /* At most 255 tries: with fewer than 255 shards some value is free. */
    for (int clash = 1, tries = 0; clash && tries < 255; tries++) {
        gen = gen % 255 + 1;
        clash = 0;
        for (int i = 0; i < c->n_ps; i++) clash |= c->ps[i].st.generation == gen;
    }
    for (int i = 0; i < c->n_ps; i++) {
        size_t n = c->ps[i].n, pbytes = n * sizeof(float), sbytes = (size_t)slots * pbytes;
        zmq_msg_t m;
        if (zmq_msg_init_size(&m, pbytes + sbytes) != 0) {
            clear_awaits(c);
            return dt_errorf(err, DT_ENOMEM, "out of memory for the INIT of ps %d (%zu bytes)", i, pbytes + sbytes);
        }
        char *d = zmq_msg_data(&m);
        memcpy(d, params[i], pbytes);
        if (state) memcpy(d + pbytes, state[i], sbytes);
        else memset(d + pbytes, 0, sbytes);
        dt_wire_header h = dt_wire_header_make(DT_MSG_INIT, 0, 0, 0);
        h.global_step = global_step;
        h.shard_floats = n;
        h.opt_kind = (uint8_t)opt->kind;
        h.opt_slots = (uint8_t)slots;
        h.learning_rate = opt->learning_rate;
        h.momentum = opt->momentum;
        h.beta1 = opt->beta1;
        h.beta2 = opt->beta2;
        h.epsilon = opt->epsilon;
        h.count_a = (uint64_t)c->aggregate;
        h.count_b = (uint64_t)(c->aggregate ? c->total : c->n_workers);
        h.count_c = (uint64_t)c->staleness;
        h.initialised = (uint8_t)gen;
        h.local_step = c->liveness_ms;
        if (c->strict) h.flags = DT_WIRE_F_STRICT;
        int rc = send_req(c, i, &h, DT_MSG_ACK, &m, deadline, err);
        if (rc) {
            clear_awaits(c);
            return rc;
        }
    }
    return gather(c, deadline, "INIT", NULL, NULL, err);
}

static int on_status(dt_ps_client *c, int i, dt_wire_in *in, void *user, dt_error *err) {
    c->ps[i].st.pushes = in->hdr.count_a;
    c->ps[i].st.pulls = in->hdr.count_b;
    c->ps[i].st.workers_done = in->hdr.count_c;
    return DT_OK;
}

int dt_ps_client_status(dt_ps_client *c, dt_ps_shard_status *out, dt_error *err) {
    int64_t deadline = dt_clock_ms() + c->request_timeout_ms;
    for (int i = 0; i < c->n_ps; i++) {
        dt_wire_header h = dt_wire_header_make(DT_MSG_STATUS, 0, 0, 0);
        int rc = send_req(c, i, &h, DT_MSG_STATUS_REPLY, NULL, deadline, err);
        if (rc) {
            clear_awaits(c);
            return rc;
        }
    }
    int rc = gather(c, deadline, "STATUS", on_status, NULL, err);
    if (!rc && out)
        for (int i = 0; i < c->n_ps; i++) out[i] = c->ps[i].st;
    return rc;
}

int dt_ps_client_wait_ready(dt_ps_client *c, int timeout_ms, dt_error *err) {
    int64_t deadline = dt_clock_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        int rc = dt_ps_client_status(c, NULL, err), waiting = -1;
        if (rc) return rc;
        for (int i = 0; i < c->n_ps && waiting < 0; i++)
            if (!c->ps[i].st.initialised) waiting = i;
        if (waiting < 0) return DT_OK;
        int64_t left = deadline - dt_clock_ms();
        if (left <= 0) {
            char msg[160];
            snprintf(msg, sizeof msg, "not initialised after %d ms: the chief (worker 0) has not sent the model (is it running?)",
                     timeout_ms);
            return fail_ps(c, waiting, err, DT_ETIMEOUT, "", msg);
        }
        zmq_poll(NULL, 0, left < READY_POLL_MS ? (long)left : READY_POLL_MS); /* a bounded sleep */
    }
}

/* Where the replies of a push and/or pull go. */
typedef struct {
    dt_push_result res;
    const float **views;      /* [n_ps] */
} xfer_ctx;

/* PARAMS: keeps the payload (no copy) and points views[i] at it. PUSH_ACK: counts the outcome. */
static int on_xfer(dt_ps_client *c, int i, dt_wire_in *in, void *user, dt_error *err) {
    xfer_ctx *x = user;
    ps_conn *p = &c->ps[i];
    if (in->hdr.type == DT_MSG_PUSH_ACK) {
        if (i == 0) x->res.global_step = in->hdr.global_step;
        if (in->hdr.status == DT_WIRE_STALE) x->res.n_stale++;
        else if (in->hdr.status != DT_WIRE_OK)
            return fail_ps(c, i, err, DT_EPROTO, "PUSH", dt_wire_status_name(in->hdr.status));
        return DT_OK;
    }
    int64_t waited = in->hdr.count_a > INT64_MAX ? INT64_MAX : (int64_t)in->hdr.count_a;
    if (waited > x->res.wait_us) x->res.wait_us = waited;
    zmq_msg_close(&p->held);
    zmq_msg_init(&p->held);
    zmq_msg_move(&p->held, &in->payload); /* size checked against the shard by on_message */
    const float *data = zmq_msg_data(&p->held);
    if ((uintptr_t)data % alignof(float) != 0) { /* libzmq promises no alignment: copy if needed */
        if (!p->aligned && !(p->aligned = dt_alloc_floats(p->n, "aligned parameter shard", err))) return DT_ENOMEM;
        memcpy(p->aligned, data, p->n * sizeof(float));
        data = p->aligned;
    }
    x->views[i] = data;
    return DT_OK;
}

/* A PULL to ps i: step is the minimum wanted, or with exact the very step (sync mode). */
static int send_pull(dt_ps_client *c, int i, int64_t step, int exact, int64_t deadline, dt_error *err) {
    dt_wire_header h = dt_wire_header_make(DT_MSG_PULL, 0, 0, 0);
    h.global_step = step;
    if (exact) h.flags = DT_WIRE_F_EXACT;
    return send_req(c, i, &h, DT_MSG_PARAMS, NULL, deadline, err);
}

static int send_pulls(dt_ps_client *c, int64_t min_step, int64_t deadline, dt_error *err) {
    if (min_step < 0) return dt_errorf(err, DT_EINVAL, "pull: min_step %lld < 0", (long long)min_step);
    for (int i = 0; i < c->n_ps; i++) {
        int rc = send_pull(c, i, min_step, 0, deadline, err);
        if (rc) return rc;
    }
    return DT_OK;
}

/* Gradients go zero-copy: libzmq sends straight from the caller's buffers and release_inflight
 * tells when it is done with them. */
static int send_pushes(dt_ps_client *c, const float *const *grads, int64_t local_step, int64_t deadline,
                       dt_error *err) {
    if (local_step < 0) return dt_errorf(err, DT_EINVAL, "push: local_step %lld < 0", (long long)local_step);
    for (int i = 0; i < c->n_ps; i++) {
        zmq_msg_t m;
        atomic_fetch_add(&c->inflight, 1);
        if (zmq_msg_init_data(&m, (void *)grads[i], c->ps[i].n * sizeof(float), release_inflight, c) != 0) {
            atomic_fetch_sub(&c->inflight, 1);
            return dt_errorf(err, DT_ENOMEM, "zmq_msg_init_data: %s", zmq_strerror(errno));
        }
        dt_wire_header h = dt_wire_header_make(DT_MSG_PUSH, 0, 0, 0);
        h.local_step = local_step;
        if (c->aggregate) h.flags = DT_WIRE_F_SYNC;
        int rc = send_req(c, i, &h, DT_MSG_PUSH_ACK, &m, deadline, err);
        if (rc) return rc;
    }
    return DT_OK;
}

/* Sync mode with several ps: a shard may come back a step ahead of another (with backup workers a
 * ps can move on while this worker's PULLs are in flight). The shards behind are pulled again at
 * exactly the newest step seen: a ps answers an EXACT pull when it reaches that step, or from its
 * snapshot if it has passed it, so one round makes every shard the same step. */
static int same_step(dt_ps_client *c, int64_t deadline, xfer_ctx *x, dt_error *err) {
    int64_t newest = 0;
    for (int i = 0; i < c->n_ps; i++)
        if (c->ps[i].st.global_step > newest) newest = c->ps[i].st.global_step;
    int behind = 0;
    for (int i = 0; i < c->n_ps; i++) {
        if (c->ps[i].st.global_step == newest) continue;
        int rc = send_pull(c, i, newest, 1, deadline, err);
        if (rc) {
            clear_awaits(c);
            return rc;
        }
        behind++;
    }
    if (!behind) return DT_OK;
    x->res.repulled += behind;
    c->stats.repulls += (uint64_t)behind;
    int rc = gather(c, deadline, "PULL (exact step)", on_xfer, x, err);
    if (rc) return rc;
    for (int i = 0; i < c->n_ps; i++)
        if (c->ps[i].st.global_step != newest) {
            char msg[128];
            snprintf(msg, sizeof msg, "answered an exact pull of step %lld with step %lld", (long long)newest,
                     (long long)c->ps[i].st.global_step);
            return fail_ps(c, i, err, DT_EPROTO, "PULL", msg);
        }
    return DT_OK;
}

/* One call for push, pull or both: sends everything, then gathers every reply. */
static int xfer(dt_ps_client *c, const float *const *grads, int64_t local_step, int64_t min_step,
                const float **views, int64_t *steps, dt_push_result *res, dt_error *err) {
    int64_t deadline = dt_clock_ms() + c->request_timeout_ms;
    xfer_ctx x = {.views = views};
    /* The previous views end here; freeing them first lets the allocator hand the same (already
     * mapped) memory to the next payload instead of fresh pages to fault in. */
    for (int i = 0; i < c->n_ps; i++) {
        zmq_msg_close(&c->ps[i].held);
        zmq_msg_init(&c->ps[i].held);
    }
    int rc = grads ? send_pushes(c, grads, local_step, deadline, err) : DT_OK;
    if (!rc && views) rc = send_pulls(c, min_step, deadline, err);
    if (rc) {
        clear_awaits(c);
        return rc;
    }
    const char *what = grads && views ? "PUSH+PULL" : grads ? "PUSH" : "PULL";
    if ((rc = gather(c, deadline, what, on_xfer, &x, err))) return rc;
    if (grads && (rc = wait_inflight(c, deadline, err))) return rc;
    if (views) {
        /* Every reply carries its shard's step: check it against what was asked. */
        for (int i = 0; i < c->n_ps; i++)
            if (c->ps[i].st.global_step < min_step) {
                char msg[128];
                snprintf(msg, sizeof msg, "answered a pull for step >= %lld with step %lld", (long long)min_step,
                         (long long)c->ps[i].st.global_step);
                return fail_ps(c, i, err, DT_EPROTO, "PULL", msg);
            }
        if (c->aggregate && c->n_ps > 1 && (rc = same_step(c, deadline, &x, err))) return rc;
        c->stats.pulls++;
        c->stats.wait_us += x.res.wait_us;
    }
    if (grads) {
        c->stats.pushes++;
        c->stats.stale_pushes += x.res.n_stale > 0;
    }
    if (steps)
        for (int i = 0; i < c->n_ps; i++) steps[i] = c->ps[i].st.global_step;
    if (res) *res = x.res;
    return DT_OK;
}

int dt_ps_client_pull_views(dt_ps_client *c, int64_t min_step, const float **views, int64_t *steps,
                            dt_error *err) {
    return xfer(c, NULL, 0, min_step, views, steps, NULL, err);
}

int dt_ps_client_pull_all(dt_ps_client *c, float *const *params, int64_t min_step, int64_t *steps,
                          dt_error *err) {
    const float *views[c->n_ps];
    int rc = dt_ps_client_pull_views(c, min_step, views, steps, err);
    for (int i = 0; i < c->n_ps; i++) {
        if (!rc) memcpy(params[i], views[i], c->ps[i].n * sizeof(float));
        zmq_msg_close(&c->ps[i].held); /* the copy is the caller's now */
        zmq_msg_init(&c->ps[i].held);
    }
    return rc;
}

int dt_ps_client_push_all(dt_ps_client *c, const float *const *grads, int64_t local_step,
                          dt_push_result *res, dt_error *err) {
    return xfer(c, grads, local_step, 0, NULL, NULL, res, err);
}

int dt_ps_client_push_pull(dt_ps_client *c, const float *const *grads, int64_t local_step,
                           int64_t min_step, const float **views, int64_t *steps, dt_push_result *res,
                           dt_error *err) {
    return xfer(c, grads, local_step, min_step, views, steps, res, err);
}

/* Where STATE replies go. */
typedef struct {
    const dt_opt_config *opt;
    float *const *params, *const *state;
} fetch_ctx;

static int on_state(dt_ps_client *c, int i, dt_wire_in *in, void *user, dt_error *err) {
    fetch_ctx *f = user;
    const dt_wire_header *h = &in->hdr;
    if (h->opt_kind != (uint8_t)f->opt->kind) {
        char msg[160];
        snprintf(msg, sizeof msg, "holds %s optimizer state, the caller expects %s (same --optimizer everywhere?)",
                 dt_opt_name((dt_opt_kind)h->opt_kind), dt_opt_name(f->opt->kind));
        return fail_ps(c, i, err, DT_EPROTO, "FETCH", msg);
    }
    /* The slot count matches the kind (checked by decode) and the size the slots (by on_message). */
    const char *d = zmq_msg_data(&in->payload);
    size_t pbytes = c->ps[i].n * sizeof(float);
    memcpy(f->params[i], d, pbytes);
    if (f->state && h->opt_slots) memcpy(f->state[i], d + pbytes, (size_t)h->opt_slots * pbytes);
    return DT_OK;
}

int dt_ps_client_fetch_state(dt_ps_client *c, const dt_opt_config *opt, float *const *params,
                             float *const *state, int64_t *steps, dt_error *err) {
    int64_t deadline = dt_clock_ms() + c->request_timeout_ms;
    for (int i = 0; i < c->n_ps; i++) {
        dt_wire_header h = dt_wire_header_make(DT_MSG_FETCH, 0, 0, 0);
        int rc = send_req(c, i, &h, DT_MSG_STATE, NULL, deadline, err);
        if (rc) {
            clear_awaits(c);
            return rc;
        }
    }
    fetch_ctx f = {.opt = opt, .params = params, .state = state};
    int rc = gather(c, deadline, "FETCH", on_state, &f, err);
    if (!rc && steps)
        for (int i = 0; i < c->n_ps; i++) steps[i] = c->ps[i].st.global_step;
    return rc;
}

int dt_ps_client_shutdown(dt_ps_client *c, dt_error *err) {
    if (c->role != DT_ROLE_CHIEF) return dt_errorf(err, DT_EINVAL, "only the chief shuts the ps tasks down");
    int64_t deadline = dt_clock_ms() + c->request_timeout_ms;
    for (int i = 0; i < c->n_ps; i++) {
        dt_wire_header h = dt_wire_header_make(DT_MSG_SHUTDOWN, 0, 0, 0);
        int rc = send_req(c, i, &h, DT_MSG_ACK, NULL, deadline, err);
        if (rc) {
            clear_awaits(c);
            return rc;
        }
    }
    return gather(c, deadline, "SHUTDOWN", NULL, NULL, err);
}

int dt_ps_client_done(dt_ps_client *c, dt_error *err) {
    int64_t deadline = dt_clock_ms() + c->request_timeout_ms;
    for (int i = 0; i < c->n_ps; i++) {
        dt_wire_header h = dt_wire_header_make(DT_MSG_DONE, 0, 0, 0);
        int rc = send_req(c, i, &h, DT_MSG_ACK, NULL, deadline, err);
        if (rc) {
            clear_awaits(c);
            return rc;
        }
    }
    return gather(c, deadline, "DONE", NULL, NULL, err);
}

int dt_ps_client_wait_done(dt_ps_client *c, int n_workers, int timeout_ms, dt_error *err) {
    if (n_workers <= 0) return DT_OK;
    int64_t deadline = dt_clock_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        int rc = dt_ps_client_status(c, NULL, err), behind = -1;
        if (rc) return rc;
        for (int i = 0; i < c->n_ps && behind < 0; i++)
            if (c->ps[i].st.workers_done < (uint64_t)n_workers) behind = i;
        if (behind < 0) return DT_OK;
        int64_t left = deadline - dt_clock_ms();
        if (left <= 0) {
            char msg[200];
            snprintf(msg, sizeof msg, "only %llu of %d worker(s) finished within %d ms (still training, or gone?)",
                     (unsigned long long)c->ps[behind].st.workers_done, n_workers, timeout_ms);
            return fail_ps(c, behind, err, DT_ETIMEOUT, "", msg);
        }
        zmq_poll(NULL, 0, left < READY_POLL_MS ? (long)left : READY_POLL_MS); /* a bounded sleep */
    }
}
