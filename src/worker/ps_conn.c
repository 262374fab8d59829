/* The ps client's connections (worker/ps_client_impl.h): its configuration checked and kept, a
 * connection per ps (transport/conn.h), HELLO to every ps until each answers, and close. */
#include "worker/ps_client_impl.h"

int dt_ps_client_n_ps(const dt_ps_client *c) { return c->n_ps; }

int dt_ps_client_last_refusal(const dt_ps_client *c) { return c->last_refusal; }

int dt_ps_client_buffers_held(const dt_ps_client *c) { return c->buffers_held; }

int64_t dt_ps_client_silent_ms(const dt_ps_client *c) {
    int64_t now = dt_clock_us(), longest = 0;
    for (int i = 0; i < c->n_ps; i++) {
        int64_t q = now - c->ps[i].quiet_since;
        if (q > longest) longest = q;
        if (c->ps[i].gap_us > longest) longest = c->ps[i].gap_us;
    }
    return longest / 1000;
}

const dt_ps_client_stats *dt_ps_client_get_stats(const dt_ps_client *c) { return &c->stats; }

const dt_ps_shard_status *dt_ps_client_shard(const dt_ps_client *c, int ps) {
    return ps >= 0 && ps < c->n_ps ? &c->ps[ps].st : NULL;
}

void dt_ps_client_close(dt_ps_client *c) {
    if (!c) return;
    for (int i = 0; i < c->n_ps && c->ps; i++) {
        dt_conn_close(c->ps[i].conn);
        free(c->ps[i].endpoint);
        free(c->ps[i].recv);
    }
    /* Returns once every zero-copy payload still queued is released. */
    dt_transport_close(c->tr);
    dt_codec_free(c->codec); /* after: the transport may have held packed gradients till then */
    dt_ex_close(c->ex);
    free(c->s_dst), free(c->names), free(c->one_buf);
    free(c->ps);
    free(c);
}

/* ---- open: connect, then HELLO to every ps ---- */

static int on_welcome(dt_ps_client *c, int i, dt_msg *in, void *user, dt_error *err) {
    (void)user;
    if (in->hdr.shard_floats == c->ps[i].n) return DT_OK;
    char msg[160];
    snprintf(msg, sizeof msg, "holds %llu floats, this worker expects %zu (same model and --ps_hosts everywhere?)",
             (unsigned long long)in->hdr.shard_floats, c->ps[i].n);
    return psc_fail_ps(c, i, err, DT_EPROTO, "", msg);
}

typedef struct {
    int64_t start, deadline;  /* dt_clock_us */
    int64_t *sent_at;         /* [n_ps] the latest HELLO (-1: none yet) */
    uint8_t *told;            /* [n_ps] the log said whom this worker waits for */
} hello_t;

/* A ps silent for a second is most likely not up yet: say once whom this worker waits for, and
 * how long it will, rather than nothing until the deadline. Past the deadline, fail naming the
 * first ps that has not answered. */
static int hello_check(dt_ps_client *c, hello_t *h, int64_t now, dt_error *err) {
    for (int i = 0; i < c->n_ps && c->log && now - h->start >= HELLO_RESEND_US; i++) {
        if (dt_ex_slot(c->ex, i, 0) == DT_EX_ARRIVED || h->told[i]) continue;
        fprintf(c->log, "worker %u: waiting for ps %d at %s (not up yet?); retrying for up to %g s "
                "(--connect_timeout)\n", c->task, i, c->ps[i].endpoint, c->connect_timeout_ms / 1000.0);
        fflush(c->log);
        h->told[i] = 1;
    }
    for (int i = 0; i < c->n_ps && now >= h->deadline; i++) {
        if (dt_ex_slot(c->ex, i, 0) == DT_EX_ARRIVED) continue;
        char msg[320];
        snprintf(msg, sizeof msg, "no answer to HELLO within %d ms (is the ps running, and do all processes "
                 "use the same --ps_hosts and --auth?%s)", c->connect_timeout_ms,
                 c->curve ? " With --auth=curve a ps refuses a client whose key is not in its authorized "
                            "folder, or that has another server.key; the ps logs the refusal" : "");
        return psc_fail_ps(c, i, err, DT_ETIMEOUT, "", msg);
    }
    return DT_OK;
}

/* A connection queues messages until it is up (the transport reconnects with backoff), so one
 * HELLO per ps would do; it is sent again every HELLO_RESEND_US in case a connection dropped with
 * it. Any of a ps's HELLOs may be answered (the exchange awaits them all as one); the replies to
 * the others are ignored. */
static int hello_send(dt_ps_client *c, hello_t *h, int64_t now, dt_error *err) {
    for (int i = 0; i < c->n_ps; i++) {
        if (dt_ex_slot(c->ex, i, 0) == DT_EX_ARRIVED || (h->sent_at[i] >= 0 && now - h->sent_at[i] < HELLO_RESEND_US))
            continue;
        dt_wire_header hd = dt_wire_header_make(DT_MSG_HELLO, c->role, c->task, 0);
        hd.shard_floats = c->ps[i].n;
        int rc = psc_send_req(c, i, 0, &hd, NULL, h->deadline, err);
        /* A ps that refuses the handshake (--auth) leaves no connection to queue on, so the resend
         * blocks until the deadline: reported as no answer, like a ps that is down. */
        if (rc == DT_ETIMEOUT) break;
        if (rc) return rc;
        h->sent_at[i] = now;
    }
    return DT_OK;
}

/* HELLO to every ps until each has answered WELCOME (its shard size checked), or the connect
 * timeout passes. */
static int hello_all(dt_ps_client *c, dt_error *err) {
    int64_t sent_at[c->n_ps];
    uint8_t told[c->n_ps];
    hello_t h = {.start = dt_clock_us(), .sent_at = sent_at, .told = told};
    h.deadline = h.start + c->connect_timeout_ms * 1000LL;
    for (int i = 0; i < c->n_ps; i++) sent_at[i] = -1, told[i] = 0;
    int rc = psc_call_begin(c, &(call_t){.what = "HELLO", .fn = on_welcome, .repull = -1}, DT_MSG_WELCOME, err);
    if (rc) return rc;
    while (!rc && dt_ex_get_state(c->ex) == DT_EX_OPEN) {
        if (psc_stopping(c)) rc = DT_EINTR;
        if (!rc) rc = hello_send(c, &h, dt_clock_us(), err); /* may block until the deadline */
        int64_t now = dt_clock_us();
        if (!rc) rc = hello_check(c, &h, now, err);
        int64_t wait_ms = (h.deadline - now + 999) / 1000;
        if (!rc) rc = psc_wait_round(c, wait_ms < HELLO_POLL_MS ? (long)wait_ms : HELLO_POLL_MS, -1, err);
    }
    if (rc == DT_EINTR) /* a stop, or a signal during the wait */
        rc = dt_errorf(err, DT_EINTR, "connecting to the ps tasks interrupted by a signal");
    return psc_call_end(c, rc, NULL, NULL, err);
}

/* The client's series; one reopened after a fault continues the same ones. */
static void client_metrics(dt_ps_client *c, struct dt_metrics *m) {
    const double *b = dt_metrics_latency_bounds;
    int n = dt_metrics_latency_n;
    c->m_push = dt_metrics_histogram(m, "dtrain_push_seconds", "Pushing a gradient to every ps, until acknowledged.", NULL, b, n);
    c->m_pull = dt_metrics_histogram(m, "dtrain_pull_seconds", "Pulling the parameters from every ps.", NULL, b, n);
    c->m_push_pull = dt_metrics_histogram(m, "dtrain_push_pull_seconds", "A push and the following pull in one "
                                          "exchange (each step's), until every parameter is back.", NULL, b, n);
    c->m_wait = dt_metrics_histogram(m, "dtrain_barrier_wait_seconds", "Per pull, the longest a ps held it until its "
                                     "step was reached (the sync barrier).", NULL, b, n);
    c->m_tx = dt_metrics_counter(m, DT_M_SENT, DT_M_SENT_HELP, NULL);
    c->m_rx = dt_metrics_counter(m, DT_M_RECEIVED, DT_M_RECEIVED_HELP, NULL);
    c->m_stale = dt_metrics_counter(m, DT_M_STALE, "This worker's gradients that at least one ps dropped as stale.", NULL);
}

/* The configuration's checks that need no connection. */
static int check_config(const dt_ps_client_config *cfg, dt_error *err) {
    if (cfg->n_ps <= 0 || !cfg->endpoints || !cfg->shard_floats)
        return dt_errorf(err, DT_EINVAL, "ps client: no ps tasks given");
    if (cfg->role != DT_ROLE_WORKER && cfg->role != DT_ROLE_CHIEF)
        return dt_errorf(err, DT_EINVAL, "ps client: role must be worker or chief");
    if (cfg->task < 0 || cfg->task > UINT16_MAX)
        return dt_errorf(err, DT_EINVAL, "ps client: task index %d out of range", cfg->task);
    if (cfg->replicas_to_aggregate < 0 || cfg->total_num_replicas < 0 || cfg->staleness < 0 ||
        (cfg->replicas_to_aggregate > 0 &&
         (cfg->total_num_replicas < cfg->replicas_to_aggregate || cfg->total_num_replicas > (int)DT_WIRE_MAX_REPLICAS ||
          cfg->staleness > (int)DT_WIRE_MAX_STALENESS ||
          (uint64_t)(cfg->staleness + 1) * (uint64_t)cfg->replicas_to_aggregate > DT_WIRE_MAX_HELD_GRADIENTS)))
        return dt_errorf(err, DT_EINVAL, "ps client: sync configuration aggregate %d, total %d, staleness %d "
                         "(need 1 <= aggregate <= total <= %u, staleness <= %u, (staleness + 1) x aggregate <= %u)",
                         cfg->replicas_to_aggregate, cfg->total_num_replicas, cfg->staleness, DT_WIRE_MAX_REPLICAS,
                         DT_WIRE_MAX_STALENESS, DT_WIRE_MAX_HELD_GRADIENTS);
    if ((unsigned)cfg->compression >= DT_ENC_COUNT)
        return dt_errorf(err, DT_EINVAL, "ps client: compression %d is not an encoding", (int)cfg->compression);
    for (int i = 0; i < cfg->n_ps; i++) {
        const char *ep = cfg->endpoints[i];
        size_t n = cfg->shard_floats[i];
        if (!ep || !*ep) return dt_errorf(err, DT_EINVAL, "ps %d: empty endpoint", i);
        if (n == 0 || n > DT_WIRE_MAX_SHARD_FLOATS)
            return dt_errorf(err, DT_EINVAL, "ps %d at %s: shard of %zu floats (must be 1..%llu)", i, ep, n,
                             (unsigned long long)DT_WIRE_MAX_SHARD_FLOATS);
    }
    return DT_OK;
}

/* The settings a client keeps from its (checked) configuration. */
static void take_config(dt_ps_client *c, const dt_ps_client_config *cfg) {
    c->n_ps = cfg->n_ps;
    c->role = cfg->role;
    c->task = (uint16_t)cfg->task;
    c->connect_timeout_ms = cfg->connect_timeout_ms > 0 ? cfg->connect_timeout_ms : 10000;
    c->request_timeout_ms = cfg->request_timeout_ms > 0 ? cfg->request_timeout_ms : 60000;
    c->stop = cfg->stop;
    if (cfg->replicas_to_aggregate > 0) {
        c->aggregate = cfg->replicas_to_aggregate;
        c->total = cfg->total_num_replicas;
        c->staleness = cfg->staleness;
        c->liveness_ms = cfg->liveness_ms > 0 ? cfg->liveness_ms : 0;
        c->strict = cfg->strict != 0;
        c->elastic = cfg->elastic != 0;
    }
    c->n_workers = cfg->n_workers > 0 && cfg->n_workers <= (int)DT_WIRE_MAX_REPLICAS ? cfg->n_workers : 0;
    c->chunk_bytes = cfg->chunk_bytes < 0 ? DT_WIRE_CHUNK_BYTES_DEFAULT : (uint64_t)cfg->chunk_bytes;
    c->name_float = cfg->name_float;
    c->name_user = cfg->name_user;
    c->encoding = (uint8_t)cfg->compression;
    c->curve = cfg->auth && cfg->auth->curve;
    if (c->curve) {
        c->auth = *cfg->auth;
        c->auth.n_allowed = 0; /* the server's list: not a client's */
        c->auth.allowed = NULL;
    }
    c->log = cfg->log;
    c->sndbuf = cfg->sndbuf_bytes > 0 ? cfg->sndbuf_bytes : 0;
}

/* Every ps's connection, made (HELLO not sent yet), and the exchange core. */
static int open_conns(dt_ps_client *c, const dt_ps_client_config *cfg, dt_error *err) {
    if (!(c->ps = dt_calloc((size_t)c->n_ps, sizeof *c->ps, "ps client connections", err)) ||
        !(c->names = dt_calloc((size_t)c->n_ps, sizeof *c->names, "ps client connections", err)))
        return DT_ENOMEM;
    int rc = dt_transport_open(&c->tr, err);
    if (rc) return rc;
    for (int i = 0; i < c->n_ps; i++) {
        atomic_init(&c->ps[i].inflight, 0);
        atomic_init(&c->ps[i].wake_fd, -1);
        c->ps[i].chunks = 1;
    }
    for (int i = 0; i < c->n_ps; i++) {
        ps_conn *p = &c->ps[i];
        p->n = cfg->shard_floats[i];
        if (!(p->endpoint = dt_malloc(strlen(cfg->endpoints[i]) + 1, "ps endpoint", err))) return DT_ENOMEM;
        strcpy(p->endpoint, cfg->endpoints[i]);
        c->names[i] = p->endpoint;
        rc = psc_conn_open(c, i, err);
        if (rc) return rc;
    }
    return dt_ex_open(&c->ex, c->n_ps, cfg->shard_floats, c->names, err);
}

int dt_ps_client_open(dt_ps_client **out, const dt_ps_client_config *cfg, dt_error *err) {
    *out = NULL;
    int rc = check_config(cfg, err);
    if (rc) return rc;
    dt_ps_client *c = dt_calloc(1, sizeof *c, "ps client", err);
    if (!c) return DT_ENOMEM;
    take_config(c, cfg);
    client_metrics(c, cfg->metrics);
    c->call.what = "no call";
    if (!(rc = open_conns(c, cfg, err)) && c->encoding != DT_ENC_FP32)
        rc = dt_codec_open(&c->codec, (dt_encoding)c->encoding, c->n_ps, cfg->shard_floats, err);
    if (!rc) rc = hello_all(c, err);
    if (rc) {
        dt_ps_client_close(c);
        return rc;
    }
    *out = c;
    return DT_OK;
}

/* ---- per-ps requests: INIT, STATUS, FETCH, DONE, SHUTDOWN ---- */
