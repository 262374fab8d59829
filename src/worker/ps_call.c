/* The ps client's call driver (worker/ps_client_impl.h): every call is one exchange of the core
 * (worker/exchange.h), begin, send, wait, end; this file sends, receives and gathers the replies,
 * owns the connections (one per ps, transport/conn.h, replaced when the transport still holds a
 * gradient payload on one) and asks again a request refused as busy. */
#include "worker/ps_client_impl.h"

/* This ps may have heard from us from `from` until `to` (a send or an answer: one moment; a wait
 * for its reply while running: the whole wait). A silence that ends at `from` is remembered: the
 * next request resets quiet_since, but a ps that timed us out during the silence is not brought
 * back by it (it may be gone, the send merely queued). */
static void heard(ps_conn *p, int64_t from, int64_t to) {
    if (to <= p->quiet_since) return;
    if (p->quiet_since && from - p->quiet_since > p->gap_us) p->gap_us = from - p->quiet_since, p->gap_end = from;
    p->quiet_since = to;
}

int psc_fail_ps(dt_ps_client *c, int ps, dt_error *err, int code, const char *what, const char *msg) {
    return dt_errorf(err, code, "ps %d at %s: %s%s%s", ps, c->ps[ps].endpoint, what, *what ? ": " : "", msg);
}

/* The call under way has failed (rc): its exchange awaits nothing more. */
static int fail_call(dt_ps_client *c, int rc) {
    dt_ex_state s = dt_ex_get_state(c->ex);
    if (s == DT_EX_OPEN || s == DT_EX_DONE) dt_ex_fail(c->ex);
    return rc;
}

/* Once this process is told to stop (a signal sets *stop), what it still asks (DONE, SHUTDOWN, the
 * step in flight) waits at most STOP_GRACE_MS more: its ps tasks are most likely stopping too, and
 * a stop must not wait out --heartbeat_timeout for them. */
int psc_stopping(const dt_ps_client *c) { return c->stop && *c->stop; }
                 
int64_t psc_stop_deadline(dt_ps_client *c) {
    if (!c->stopped_at) c->stopped_at = dt_clock_us();
    return c->stopped_at + STOP_GRACE_MS * 1000LL;
}

/* Sends one request to ps i for slot `chunk` of the exchange under way (a send blocks until
 * send_by at the latest), which then awaits its reply. h: type and the type-specific fields;
 * routing fields are filled here. payload is consumed. */
int psc_send_req(dt_ps_client *c, int i, int chunk, dt_wire_header *h, dt_bytes *payload, int64_t send_by,
                 dt_error *err) {
    ps_conn *p = &c->ps[i];
    h->role = (uint8_t)c->role;
    h->task = c->task;
    h->request_id = dt_ex_new_id(c->ex);
    h->shard = (uint32_t)i;
    size_t bytes = DT_WIRE_HEADER_SIZE + (payload ? payload->size : 0);
    dt_metric_add(c->m_tx, (double)bytes);
    c->stats.tx_bytes += bytes;
    if (dt_wire_type_is_sparse(h->type)) c->stats.sparse_tx_bytes += bytes;
    dt_error e = {0};
    int rc = dt_conn_send(p->conn, h, payload, send_by, &e);
    if (rc) return psc_fail_ps(c, i, err, rc, "", rc == DT_ETIMEOUT ? "send timed out (too many requests queued)" : e.msg);
    int64_t now = dt_clock_us();
    heard(p, now, now);
    rc = dt_ex_sent(c->ex, i, chunk, h->type, h->request_id, now);
    return rc ? dt_errorf(err, rc, "ps client: %s", dt_assert_why()) : DT_OK;
}

/* A request due a request timeout from now. */
int64_t psc_request_deadline(const dt_ps_client *c) { return dt_clock_us() + c->request_timeout_ms * 1000LL; }
                             
static void note_status(ps_conn *p, const dt_wire_header *h) {
    if (h->type != DT_MSG_PARAMS && h->type != DT_MSG_PUSH_ACK) p->st.global_step = h->global_step; /* a chunk's own */
    p->st.initialised = h->generation != 0;
    if (h->type == DT_MSG_WELCOME || h->type == DT_MSG_STATUS_REPLY) p->st.importing = (h->flags & DT_WIRE_F_IMPORTING) != 0;
    if (!p->st.initialised) p->st.importing = 0;
    p->st.generation = h->generation;
    if (h->chunks) p->chunks = h->chunks;
    if (h->chunks && h->generation) p->cut_known = 1;
}

/* A chunk reply the exchange took: the push's outcome goes to the codec's error feedback; a PARAMS
 * chunk goes into the call's dst at its offset (checked: finite values), and to the streaming
 * caller. */
static int on_chunk(dt_ps_client *c, int i, dt_msg *in, const dt_ex_reply_info *r, dt_error *err) {
    const dt_wire_header *h = &in->hdr;
    if (c->codec && r->req == DT_MSG_PUSH) dt_codec_settle(c->codec, i, h->chunk, r->accepted);
    if (h->type != DT_MSG_PARAMS) return DT_OK;
    uint64_t off, len;
    dt_wire_chunk(c->ps[i].n, h->chunks, h->chunk, &off, &len); /* its size and cut were checked by the exchange */
    float *dst = c->call.dst[i] + off;
    /* A non-finite value is caught here, where it enters, and named by its source; left alone it
     * would surface only later as a NaN loss. Unpacked and scanned a block at a time, so the scan
     * reads what the copy just wrote from cache instead of a whole chunk again from memory. */
    const unsigned char *src = in->data; /* the transport promises no alignment */
    size_t esize = dt_enc_size(h->encoding), bad = (size_t)len;
    for (size_t at = 0; at < (size_t)len && bad == (size_t)len; at += SCAN_BLOCK) {
        size_t k = (size_t)len - at < SCAN_BLOCK ? (size_t)len - at : SCAN_BLOCK;
        dt_unpack(h->encoding, dst + at, src + at * esize, k);
        size_t b = dt_first_nonfinite(dst + at, k);
        if (b < k) bad = at + b;
    }
    if (bad < len) {
        char name[96], msg[320];
        if (c->name_float) c->name_float(c->name_user, i, (size_t)off + bad, name, sizeof name);
        else snprintf(name, sizeof name, "float %zu of its shard", (size_t)off + bad);
        snprintf(msg, sizeof msg, "served a non-finite parameter (%s = %g) at step %lld: training diverged (lower "
                 "--learning_rate) or the ps is damaged", name, (double)dst[bad], (long long)h->global_step);
        return psc_fail_ps(c, i, err, DT_EFORMAT, "", msg);
    }
    if (c->call.on_chunk) c->call.on_chunk(c->call.chunk_user, i, h->chunk, c->call.dst[i]);
    return DT_OK;
}

/* Handles one message received from ps i: 1 if it answered an awaited request, 0 if the exchange
 * ignored it (a late reply to an earlier request), < 0 on error (the exchange has failed). */
static int on_message(dt_ps_client *c, int i, dt_msg *in, dt_error *err) {
    ps_conn *p = &c->ps[i];
    size_t bytes = DT_WIRE_HEADER_SIZE + in->size;
    dt_metric_add(c->m_rx, (double)bytes);
    c->stats.rx_bytes += bytes;
    if (c->call.slots) c->stats.sparse_rx_bytes += bytes;
    dt_ex_reply_info r;
    int rc = dt_ex_reply(c->ex, i, &in->hdr, in->data, in->size, &r, err);
    if (rc == DT_EX_IGNORED) return 0;
    /* The ps heard from us when it answered (a PULL it held: that much after we sent it), however
     * late we read the reply (this process may have been stopped meanwhile). */
    uint64_t waited = in->hdr.type == DT_MSG_PARAMS ? in->hdr.params.waited_us : 0;
    int64_t now = dt_clock_us(), held = waited > INT64_MAX ? INT64_MAX : (int64_t)waited;
    int64_t answered = held < now - r.sent_us ? r.sent_us + held : now;
    if (r.chunk >= 0) heard(p, answered, answered);
    if (r.refused) {
        c->last_refusal = dt_ex_refusal(c->ex);
        note_status(p, &in->hdr); /* a refusal for another cut teaches the cut */
    }
    if (rc < 0) return rc;
    if (r.sent_us >= p->gap_end) p->gap_us = 0; /* it answered after our last silence: it kept us */
    note_status(p, &in->hdr);
    if (c->call.push || c->call.pull) rc = on_chunk(c, i, in, &r, err);
    else {
        c->call.reply_slot = r.chunk;
        rc = c->call.fn ? c->call.fn(c, i, in, c->call.user, err) : DT_OK;
    }
    return rc ? fail_call(c, rc) : 1;
}

/* Receives what ps i has queued while its replies are due. */
static int drain(dt_ps_client *c, int i, dt_error *err) {
    while (dt_ex_awaiting(c->ex, i)) {
        dt_msg in;
        dt_error e = {0};
        int rc = dt_conn_recv(c->ps[i].conn, &in, &e);
        if (rc == DT_ETIMEOUT) {
            dt_msg_close(&in);
            return DT_OK;
        }
        if (rc == DT_OK) rc = on_message(c, i, &in, err);
        else rc = fail_call(c, psc_fail_ps(c, i, err, rc, c->call.what, e.msg));
        dt_msg_close(&in);
        if (rc < 0) return rc;
    }
    return DT_OK;
}

/* The replies of ps first_due are overdue (the deadline passed with some missing). */
static int timed_out(dt_ps_client *c, int first_due, int stopped, dt_error *err) {
    char msg[256];
    /* A sync PULL is the barrier: it waits for the other workers, not only for the ps. */
    snprintf(msg, sizeof msg, "no reply within %d ms (%s): %s", stopped ? STOP_GRACE_MS : c->request_timeout_ms,
             stopped ? "of this process being stopped by a signal" : "--heartbeat_timeout",
             c->aggregate && strstr(c->call.what, "PULL")
                 ? "the ps is down, or the sync barrier waits for workers that are gone (the step "
                   "needs --replicas_to_aggregate gradients; backup workers let it lose some)"
                 : "the ps is down or overloaded");
    return fail_call(c, psc_fail_ps(c, first_due, err, DT_ETIMEOUT, c->call.what, msg));
}

/* One wait of at most max_ms for the replies due (each handed to on_message) and, fd >= 0, for fd
 * to become readable: DT_OK, or < 0 on error (the deadline passed with replies missing, a bad
 * reply): the exchange has then failed. */
int psc_wait_round(dt_ps_client *c, long max_ms, int fd, dt_error *err) {
    dt_conn *conns[c->n_ps];
    int idx[c->n_ps], ready[c->n_ps + 1];
    int n = 0;
    for (int i = 0; i < c->n_ps; i++)
        if (dt_ex_awaiting(c->ex, i)) {
            conns[n] = c->ps[i].conn;
            idx[n++] = i;
        }
    if (n == 0 && fd < 0) return DT_OK;
    int stopped = psc_stopping(c);
    if (stopped) dt_ex_cap_deadline(c->ex, psc_stop_deadline(c));
    int64_t before = dt_clock_us();
    int late = dt_ex_overdue(c->ex, before);
    if (late >= 0) return timed_out(c, late, stopped, err);
    int64_t left_ms = (dt_ex_deadline(c->ex) - before + 999) / 1000;
    long wait_ms = n && left_ms < max_ms ? (long)left_ms : max_ms;
    dt_error pe = {0};
    int r = dt_conn_poll(conns, n, fd, wait_ms, ready, &pe);
    int64_t after = dt_clock_us();
    /* Waiting for a reply, this worker counts as alive to the ps (a sync ps holding its PULL
     * does not count it silent), unless the process was not running: a wake far later than
     * asked means it was stopped (SIGSTOP, a paused machine), and its silence runs on. */
    if (after - before <= (wait_ms + LATE_WAKE_MS) * 1000LL)
        for (int k = 0; k < n; k++) heard(&c->ps[idx[k]], before, after);
    if (r < 0) {
        if (r == DT_EINTR) return fail_call(c, dt_errorf(err, DT_EINTR, "%s interrupted by a signal", c->call.what));
        return fail_call(c, dt_errorf(err, r, "%s: %s", c->call.what, pe.msg));
    }
    for (int k = 0; k < n && r > 0; k++) {
        int rc = ready[k] ? drain(c, idx[k], err) : DT_OK;
        if (rc < 0) return rc;
    }
    return DT_OK;
}

/* Waits until every reply of the exchange under way is in (DONE) or it fails. Every request has
 * gone out. */
int psc_gather(dt_ps_client *c, dt_error *err) {
    while (dt_ex_get_state(c->ex) == DT_EX_OPEN) {
        int due = 0;
        for (int i = 0; i < c->n_ps; i++) due += dt_ex_awaiting(c->ex, i);
        if (!DT_ASSERT(due > 0)) /* open with nothing due: a request was never sent */
            return fail_call(c, dt_errorf(err, DT_EINVAL, "ps client: %s: %s", c->call.what, dt_assert_why()));
        int rc = psc_wait_round(c, 1000, -1, err);
        if (rc) return rc;
    }
    if (!DT_ASSERT(dt_ex_get_state(c->ex) == DT_EX_DONE))
        return dt_errorf(err, DT_EINVAL, "ps client: %s", dt_assert_why());
    return DT_OK;
}

/* ---- the connections: one per ps, replaced when the transport still holds a gradient on it ---- */

/* The transport calls this (from its own thread, maybe) when it is done with a zero-copy gradient
 * payload (hint: its ps): the send's completion. */
static void release_inflight(void *hint) {
    ps_conn *p = hint;
    int before = atomic_fetch_sub(&p->inflight, 1);
    if (!DT_ASSERT(before > 0)) atomic_fetch_add(&p->inflight, 1); /* never below 0 */
    int fd = atomic_load(&p->wake_fd);
    if (fd >= 0) {
        uint64_t one = 1;
        ssize_t w = write(fd, &one, sizeof one); /* an eventfd: never blocks for long */
        (void)w;
    }
}

/* Waits until the transport has released every gradient payload (DT_OK) or the deadline passes (DT_ETIMEOUT). */
static int wait_released(dt_ps_client *c, int64_t deadline_us) {
    for (;;) {
        int held = 0;
        for (int i = 0; i < c->n_ps; i++) held += atomic_load(&c->ps[i].inflight);
        if (!held) return DT_OK;
        if (dt_clock_us() > deadline_us) return DT_ETIMEOUT;
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
}

/* ps i's connection, set up: at open, and again when one that held gradient payloads is replaced
 * (replace_conn), so both get the same options. */
int psc_conn_open(dt_ps_client *c, int i, dt_error *err) {
    ps_conn *p = &c->ps[i];
    dt_error e = {0};
    /* The largest reply is STATE (parameters and up to 2 optimizer slots). */
    /* ps 0 may also send the work coordinator's state (WORK_STATE). */
    dt_conn_config cc = {.max_frame = i == 0 ? dt_wire_max_frame_ps0(p->n) : dt_wire_max_frame(p->n),
                         .heartbeat_ms = c->request_timeout_ms, .send_timeout_ms = c->request_timeout_ms,
                         .sndbuf = c->sndbuf, .auth = c->curve ? &c->auth : NULL};
    int rc = dt_conn_open(&p->conn, c->tr, p->endpoint, &cc, &e);
    return rc ? dt_errorf(err, rc, "ps %d at %s: %s", i, p->endpoint, e.msg) : DT_OK;
}

/* ps i's connection is closed at once, so the transport drops what it still queues for it (a ps
 * discards a message cut short), and a fresh one connects in its place (to the same ps, or the
 * one restarted there). Replies due on the old connection never come: the exchange stops awaiting
 * them. A connection that cannot be replaced makes the client unusable. */
static void replace_conn(dt_ps_client *c, int i) {
    ps_conn *p = &c->ps[i];
    dt_conn_close(p->conn);
    p->conn = NULL;
    dt_ex_drop_ps(c->ex, i);
    dt_error e = {0};
    if (psc_conn_open(c, i, &e) && !c->unusable[0])
        snprintf(c->unusable, sizeof c->unusable, "could not replace a connection: %.200s", e.msg);
}

/* The header's contract: when a call that sent gradients returns, the transport holds none of them.
 * After the replies they are almost always released already (a reply proves the ps read them).
 * A payload still held sits in the queue of a ps that is down or not reading, or is half written
 * to it, and the transport would send it, or its rest, later from a buffer the caller has since
 * reused: a torn gradient. The connection that holds it is replaced. rc is the call's outcome so far, returned
 * unless the frames cannot be released. */
static int release_gradients(dt_ps_client *c, int rc, int64_t deadline_us, dt_error *err) {
    if (!rc && wait_released(c, deadline_us) == DT_OK) return DT_OK;
    for (int i = 0; i < c->n_ps; i++)
        if (atomic_load(&c->ps[i].inflight) && c->ps[i].conn) replace_conn(c, i);
    if (wait_released(c, dt_clock_us() + RELEASE_MS * 1000LL) != DT_OK) {
        /* Never seen; but then the caller must not touch its buffers, so nothing is sent again. */
        c->buffers_held = 1;
        snprintf(c->unusable, sizeof c->unusable, "the transport still holds gradient buffers %d ms after their "
                 "connections were closed: they must stay untouched, so this client sends nothing more (close it)",
                 RELEASE_MS);
        char before[512] = "";
        if (rc && err) snprintf(before, sizeof before, "%.500s; ", err->msg);
        return dt_errorf(err, DT_EIO, "%s%s", before, c->unusable);
    }
    return rc;
}

/* ---- calls: each one exchange (begin, send, wait, end) ---- */

/* ERROR 106 says a ps is at its memory budget, or its table of deferred requests is full, and to ask
 * again shortly (docs/protocol.md). A call that changes nothing on the ps (a pull, FETCH, STATUS) is
 * asked again after a pause, 50 ms doubling to 1 s, until its own timeout (--heartbeat_timeout) has
 * passed since it was first asked: 1 to ask again (the pause taken), 0 to end with rc. A push is not:
 * its gradient may have been applied before the refusal of the reply (the caller's recovery,
 * worker/remote.c, pulls again). */
int psc_ask_again(dt_ps_client *c, int rc, int64_t first_us, int *pause_ms) {
    if (rc != DT_EPROTO || c->last_refusal != DT_WIRE_E_BUSY || psc_stopping(c)) return 0;
    const int64_t left_ms = (first_us + c->request_timeout_ms * 1000LL - dt_clock_us()) / 1000;
    if (left_ms <= *pause_ms) return 0;
    if (++c->stats.busy_retries <= 3 && c->log) {
        fprintf(c->log, "worker %u: a ps is busy (ERROR 106: ask again shortly): asking again for up to %.1f s%s\n",
                c->task, left_ms / 1000.0, c->stats.busy_retries == 3 ? "; further ones are counted" : "");
        fflush(c->log);
    }
    struct timespec ts = {*pause_ms / 1000, (long)(*pause_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    *pause_ms = *pause_ms * 2 < BUSY_PAUSE_MAX_MS ? *pause_ms * 2 : BUSY_PAUSE_MAX_MS;
    return 1;
}

/* Begins the exchange of a call that awaits `want` replies (per chunk of every ps for PARAMS
 * and PUSH_ACK, else one per ps). */
int psc_call_begin(dt_ps_client *c, const call_t *call, uint8_t want, dt_error *err) {
    if (dt_ex_get_state(c->ex) != DT_EX_IDLE)
        return dt_errorf(err, DT_EINVAL, "ps client: %s while an exchange is already under way", call->what);
    if (c->unusable[0]) return dt_errorf(err, DT_EIO, "ps client: %s", c->unusable);
    int chunks[c->n_ps];
    for (int i = 0; i < c->n_ps; i++) chunks[i] = c->ps[i].chunks;
    dt_ex_kind kind = {.want = want, .min_step = call->min_step, .timeout_us = c->request_timeout_ms * 1000LL,
                       .multi = call->slots != NULL, .alone = call->alone, .ps = call->to_ps};
    for (int i = 0; call->slots && i < c->n_ps; i++) chunks[i] = call->slots[i];
    /* HELLO: hello_all's own deadline (the connect timeout) passes first. */
    if (want == DT_MSG_WELCOME) kind.timeout_us = (c->connect_timeout_ms + 1000) * 1000LL;
    if (dt_ex_begin(c->ex, &kind, chunks, dt_clock_us()))
        return dt_errorf(err, DT_EINVAL, "ps client: %s: %s", call->what, dt_assert_why());
    c->call = *call;
    c->call.t0 = c->m_push || c->m_pull ? dt_seconds() : 0;
    return DT_OK;
}

/* Sync mode: a chunk may come back a step ahead of another (with backup workers a ps can move a
 * chunk on while this worker's requests are in flight). The chunks behind are pulled again at
 * exactly the newest step seen: a ps answers an EXACT pull when the chunk reaches that step, or
 * from its snapshot if it has passed it, so one round makes every chunk of every ps one step.
 * oldest (a worker resuming, which pushes nothing for the step under way): the chunks ahead are
 * pulled again at the oldest step instead, from the ps's snapshots. Waiting for the newest would
 * wait for this worker's own gradient: a ps counts a worker that was lost as live again from its
 * first message, so the chunks behind now wait for its gradient of their step, which comes only
 * after the pull (the chief moving on alone streams its chunks one by one, so a resuming worker
 * often finds them a step apart). */
static int send_pull(dt_ps_client *c, int i, int k, int64_t step, int exact, dt_error *err);

static int same_step(dt_ps_client *c, dt_error *err) {
    int64_t target;
    int shards = dt_ex_repull(c->ex, c->call.repull, &target);
    if (!shards) return DT_OK;
    c->call.repulled += shards;
    c->stats.repulls += (uint64_t)shards;
    c->call.what = "PULL (exact step)";
    for (int i = 0; i < c->n_ps; i++)
        for (int k = 0; k < dt_ex_chunks(c->ex, i); k++) {
            int rc = dt_ex_slot(c->ex, i, k) == DT_EX_UNSENT ? send_pull(c, i, k, target, 1, err) : DT_OK;
            if (rc) return fail_call(c, rc);
        }
    return psc_gather(c, err);
}

/* After every reply of a push or pull: each shard's step (what every one of its chunks reached),
 * the counts. */
static void call_done(dt_ps_client *c, int64_t *steps, dt_push_result *res) {
    int64_t s[c->n_ps];
    dt_push_result r = {.repulled = c->call.repulled};
    dt_ex_result(c->ex, s, &r.n_stale, &r.wait_us);
    r.stale_ref = dt_ex_stale_ref(c->ex);
    for (int i = 0; i < c->n_ps; i++) {
        c->ps[i].st.global_step = s[i];
        if (steps) steps[i] = s[i];
    }
    r.global_step = c->ps[0].st.global_step;
    int pushed = c->call.push, pulled = c->call.pull;
    if (pulled) {
        c->stats.pulls++;
        c->stats.wait_us += r.wait_us;
    }
    if (pushed) {
        c->stats.pushes++;
        c->stats.stale_pushes += r.n_stale > 0;
    }
    if (c->call.t0) {
        dt_metric *m = pushed && pulled ? c->m_push_pull : pushed ? c->m_push : c->m_pull;
        dt_metric_observe(m, dt_seconds() - c->call.t0);
        if (pulled) dt_metric_observe(c->m_wait, (double)r.wait_us * 1e-6);
        if (pushed && r.n_stale > 0) dt_metric_add(c->m_stale, 1);
    }
    if (res) *res = r;
}

/* The caller ends an exchange that is not DONE, saying nothing went wrong. */
static int unfinished(dt_ps_client *c, dt_error *err) {
    for (int i = 0; i < c->n_ps; i++)
        for (int k = 0; k < dt_ex_chunks(c->ex, i); k++)
            if (dt_ex_slot(c->ex, i, k) != DT_EX_ARRIVED)
                return dt_errorf(err, DT_EINVAL, "ps client: exchange ended with chunk %d of ps %d not %s", k, i,
                                 dt_ex_slot(c->ex, i, k) == DT_EX_UNSENT ? "sent" : "answered");
    return dt_errorf(err, DT_EINVAL, "ps client: exchange ended as if it had not failed");
}

/* Ends the call under way, whatever its outcome so far (rc): the caller gets its gradient
 * buffers back, sync pulls are made one step, a push or pull is counted; the exchange is over. */
int psc_call_end(dt_ps_client *c, int rc, int64_t *steps, dt_push_result *res, dt_error *err) {
    if (!rc && dt_ex_get_state(c->ex) != DT_EX_DONE) rc = unfinished(c, err);
    if (rc) fail_call(c, rc);
    if (c->call.push) rc = release_gradients(c, rc, dt_ex_deadline(c->ex), err);
    if (!rc && c->call.pull && c->call.repull >= 0) rc = same_step(c, err);
    if (!rc && (c->call.push || c->call.pull)) call_done(c, steps, res);
    if (rc) fail_call(c, rc);
    else c->last_refusal = 0;
    dt_ex_end(c->ex);
    c->call = (call_t){.what = "no call"};
    return rc;
}

/* The same payload-less request to every ps, then every reply (each passed to fn, if any). */
static int ask_every_ps_once(dt_ps_client *c, dt_msg_type type, uint8_t flags, dt_msg_type reply, const char *what,
                             reply_fn fn, void *user, dt_error *err) {
    int rc = psc_call_begin(c, &(call_t){.what = what, .fn = fn, .user = user, .repull = -1}, reply, err);
    if (rc) return rc;
    for (int i = 0; i < c->n_ps && !rc; i++) {
        dt_wire_header h = dt_wire_header_make(type, 0, 0, 0);
        h.flags = flags;
        rc = psc_send_req(c, i, 0, &h, NULL, psc_request_deadline(c), err);
    }
    if (!rc) rc = psc_gather(c, err);
    return psc_call_end(c, rc, NULL, NULL, err);
}

/* ... asked again while a ps says it is busy, for the requests that change nothing (psc_ask_again). */
int psc_ask_every_ps_flagged(dt_ps_client *c, dt_msg_type type, uint8_t flags, dt_msg_type reply,
                             const char *what, reply_fn fn, void *user, dt_error *err) {
    const int64_t first = dt_clock_us();
    int pause = BUSY_PAUSE_MS, rc;
    while ((rc = ask_every_ps_once(c, type, flags, reply, what, fn, user, err)) &&
           (type == DT_MSG_FETCH || type == DT_MSG_STATUS) && psc_ask_again(c, rc, first, &pause)) {
    }
    return rc;
}

int psc_ask_every_ps(dt_ps_client *c, dt_msg_type type, dt_msg_type reply, const char *what, reply_fn fn,
                     void *user, dt_error *err) {
    return psc_ask_every_ps_flagged(c, type, 0, reply, what, fn, user, err);
}

/* A PULL of chunk k of ps i: step is the minimum wanted, or with exact the very step (sync mode). */
static int send_pull(dt_ps_client *c, int i, int k, int64_t step, int exact, dt_error *err) {
    dt_wire_header h = dt_wire_header_make(DT_MSG_PULL, 0, 0, 0);
    h.global_step = step;
    h.chunk = (uint8_t)k;
    h.chunks = (uint8_t)dt_ex_chunks(c->ex, i);
    h.encoding = c->encoding;
    if (exact) h.flags = DT_WIRE_F_EXACT;
    return psc_send_req(c, i, k, &h, NULL, psc_request_deadline(c), err);
}

/* A PUSH of chunk k of ps i, zero-copy from the caller's buffer (release_inflight tells when the
 * transport is done with it); when the call pulls too, the ps answers with that chunk's PARAMS at min_step or
 * later. */
int psc_send_push(dt_ps_client *c, int i, int k, const float *grad, dt_error *err) {
    ps_conn *p = &c->ps[i];
    unsigned chunks = (unsigned)dt_ex_chunks(c->ex, i);
    uint64_t off, len;
    dt_wire_chunk(p->n, chunks, (unsigned)k, &off, &len);
    const void *data = grad + off;
    size_t bytes = (size_t)len * sizeof(float);
    /* --compression: packed with error feedback into the codec's buffer, sent from there. */
    if (c->codec) data = dt_codec_encode(c->codec, i, chunks, (unsigned)k, grad, &bytes);
    atomic_fetch_add(&p->inflight, 1);
    dt_bytes m = {.data = data, .size = bytes, .release = release_inflight, .hint = p};
    int pull = c->call.pull;
    dt_wire_header h = dt_wire_header_make(DT_MSG_PUSH, 0, 0, 0);
    h.local_step = c->call.local_step;
    h.push.examples = c->call.examples;
    h.global_step = pull ? c->call.min_step : 0;
    h.chunk = (uint8_t)k;
    h.chunks = (uint8_t)chunks;
    h.flags = (uint8_t)((c->aggregate ? DT_WIRE_F_SYNC : 0) | (pull ? DT_WIRE_F_PULL : 0));
    h.encoding = c->encoding;
    return psc_send_req(c, i, k, &h, &m, psc_request_deadline(c), err);
}

/* One chunk of the call under way: its gradient (a PUSH, asking for its PARAMS when the call pulls
 * too), or a PULL. */
int psc_send_chunk(dt_ps_client *c, int i, int k, const float *grad, dt_error *err) {
    return c->call.push ? psc_send_push(c, i, k, grad, err) : send_pull(c, i, k, c->call.min_step, 0, err);
}
