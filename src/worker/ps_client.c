/* The ps client's calls (worker/ps_client.h): every call is one exchange of the core
 * (worker/exchange.h), driven by ps_call.c (begin, send, wait, end) over the connections that
 * ps_conn.c opens. The streaming calls are that core as it is (overlap.c sends each chunk when it
 * is ready); push_all, pull_all, push_pull and the pulls wrap it (begin, send every chunk, wait for
 * every reply, end), the per-ps requests (INIT, STATUS, FETCH, DONE, SHUTDOWN) are exchanges of one
 * slot per ps, and a request to one ps alone (the WORK messages to ps 0) is an exchange of one slot.
 * The insides the three files share: worker/ps_client_impl.h. */
#include "worker/ps_client_impl.h"


static void release_free(void *hint) { free(hint); }

/* A bounded sleep (a signal ends it early: the caller's loop looks at its stop flag). */
static void pause_ms(int64_t ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ps i's INIT: header h and payload m (parameters, optimizer state, options, decay mask). */
static int init_message(dt_ps_client *c, int i, const dt_opt_config *opt, const float *params, const float *state,
                        const uint8_t *decay, dt_wire_header *h, dt_bytes *m, dt_error *err) {
    int slots = dt_opt_slots(opt);
    size_t n = c->ps[i].n, pbytes = n * sizeof(float), sbytes = (size_t)slots * pbytes;
    size_t total = (size_t)dt_wire_init_bytes((unsigned)slots, n);
    uint8_t *d = malloc(total);
    if (!d) return dt_errorf(err, DT_ENOMEM, "out of memory for the INIT of ps %d (%zu bytes)", i, total);
    *m = (dt_bytes){.data = d, .size = total, .release = release_free, .hint = d};
    memcpy(d, params, pbytes);
    if (state) memcpy(d + pbytes, state, sbytes);
    else memset(d + pbytes, 0, sbytes);
    /* The options block, then the decay mask as bits (docs/protocol.md, "INIT options"). */
    uint8_t *o = d + pbytes + sbytes, *bits = o + DT_WIRE_OPTS_BYTES;
    dt_wire_opts_encode(o, &opt->schedule, opt->weight_decay);
    memset(bits, 0, (n + 7) / 8);
    for (size_t k = 0; decay && k < n; k++)
        if (decay[k]) bits[k >> 3] |= (uint8_t)(1u << (k & 7));
    *h = dt_wire_header_make(DT_MSG_INIT, 0, 0, 0);
    h->shard_floats = n;
    h->opt_kind = (uint8_t)opt->kind;
    h->opt_slots = (uint8_t)slots;
    h->learning_rate = opt->learning_rate;
    h->momentum = opt->momentum;
    h->beta1 = opt->beta1;
    h->beta2 = opt->beta2;
    h->epsilon = opt->epsilon;
    h->init.replicas_to_aggregate = (uint64_t)c->aggregate;
    h->init.total_num_replicas = (uint64_t)(c->aggregate ? c->total : c->n_workers);
    h->init.staleness = (uint64_t)c->staleness;
    unsigned k = dt_wire_chunks_for(n, c->chunk_bytes);
    h->chunks = (uint8_t)(k > n ? n : k);
    h->liveness_ms = c->liveness_ms;
    if (c->strict) h->flags = DT_WIRE_F_STRICT;
    if (c->elastic) h->flags |= DT_WIRE_F_ELASTIC;
    return DT_OK;
}

int dt_ps_client_init(dt_ps_client *c, const dt_opt_config *opt, const float *const *params,
                      const float *const *state, const uint8_t *const *decay, int64_t global_step, dt_error *err) {
    if (c->role != DT_ROLE_CHIEF) return dt_errorf(err, DT_EINVAL, "only the chief initialises the ps tasks");
    if (global_step < 0) return dt_errorf(err, DT_EINVAL, "initial global step %lld < 0", (long long)global_step);
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
    int rc = psc_call_begin(c, &(call_t){.what = "INIT", .repull = -1}, DT_MSG_ACK, err);
    if (rc) return rc;
    for (int i = 0; i < c->n_ps && !rc; i++) {
        dt_wire_header h;
        dt_bytes m;
        rc = init_message(c, i, opt, params[i], state ? state[i] : NULL, decay ? decay[i] : NULL, &h, &m, err);
        h.global_step = global_step;
        h.generation = (uint8_t)gen;
        if (!rc) rc = psc_send_req(c, i, 0, &h, &m, psc_request_deadline(c), err);
    }
    if (!rc) rc = psc_gather(c, err);
    return psc_call_end(c, rc, NULL, NULL, err);
}

static int on_status(dt_ps_client *c, int i, dt_msg *in, void *user, dt_error *err) {
    (void)user, (void)err;
    c->ps[i].st.pushes = in->hdr.status_reply.updates;
    c->ps[i].st.pulls = in->hdr.status_reply.params_replies;
    c->ps[i].st.workers_done = in->hdr.status_reply.workers_done;
    c->ps[i].st.workers_busy = in->hdr.workers_busy;
    return DT_OK;
}

int dt_ps_client_status(dt_ps_client *c, dt_ps_shard_status *out, dt_error *err) {
    int rc = psc_ask_every_ps(c, DT_MSG_STATUS, DT_MSG_STATUS_REPLY, "STATUS", on_status, NULL, err);
    if (!rc && out)
        for (int i = 0; i < c->n_ps; i++) out[i] = c->ps[i].st;
    return rc;
}

int dt_ps_client_wait_ready(dt_ps_client *c, int timeout_ms, dt_error *err) {
    int64_t deadline = dt_clock_us() + (timeout_ms > 0 ? timeout_ms : 0) * 1000LL;
    for (;;) {
        if (psc_stopping(c))
            return dt_errorf(err, DT_EINTR, "interrupted by a signal");
        int rc = dt_ps_client_status(c, NULL, err), waiting = -1;
        if (rc) return rc;
        for (int i = 0; i < c->n_ps && waiting < 0; i++)
            if (!c->ps[i].st.initialised || c->ps[i].st.importing) waiting = i;
        if (waiting < 0) return DT_OK;
        int64_t left = (deadline - dt_clock_us()) / 1000;
        if (left <= 0) {
            char msg[160];
            snprintf(msg, sizeof msg, "not initialised after %d ms: the chief (worker 0) has not sent the model (is it running?)",
                     timeout_ms);
            return psc_fail_ps(c, waiting, err, DT_ETIMEOUT, "", msg);
        }
        pause_ms(left < READY_POLL_MS ? left : READY_POLL_MS);
    }
}

/* ---- push and pull: the streaming calls are the core, the whole-shard calls wrap them ---- */


/* A client learns how a ps cuts its shard from the ps's replies. One that has not heard from an
 * initialised ps yet (it only said HELLO before the chief's INIT) asks every ps first: a push sent
 * with a wrong cut would be refused at that ps while another applied it, and could not simply be
 * sent again. */
static int learn_cut(dt_ps_client *c, dt_error *err) {
    for (int i = 0; i < c->n_ps; i++)
        if (!c->ps[i].cut_known) return dt_ps_client_status(c, NULL, err);
    return DT_OK;
}

/* The receive buffers pull_views and streaming hand out. */
static int recv_buffers(dt_ps_client *c, float **dst, dt_error *err) {
    for (int i = 0; i < c->n_ps; i++) {
        if (!c->ps[i].recv && !(c->ps[i].recv = dt_alloc_floats(c->ps[i].n, "pulled shard", err))) return DT_ENOMEM;
        dst[i] = c->ps[i].recv;
    }
    return DT_OK;
}

/* Begins a push, a pull or both (call: what and where), once the cut is known. */
static int xfer_begin(dt_ps_client *c, call_t *call, dt_error *err) {
    if (dt_ex_get_state(c->ex) != DT_EX_IDLE)
        return dt_errorf(err, DT_EINVAL, "ps client: an exchange is already under way");
    if (c->unusable[0]) return dt_errorf(err, DT_EIO, "ps client: %s", c->unusable);
    if (call->push && call->local_step < 0)
        return dt_errorf(err, DT_EINVAL, "push: local_step %lld < 0", (long long)call->local_step);
    if (call->min_step < 0) return dt_errorf(err, DT_EINVAL, "pull: min_step %lld < 0", (long long)call->min_step);
    call->what = call->push && call->pull ? "PUSH+PULL" : call->push ? "PUSH" : "PULL";
    call->examples = call->push ? c->examples : 0;
    int rc = learn_cut(c, err);
    return rc ? rc : psc_call_begin(c, call, call->pull ? DT_MSG_PARAMS : DT_MSG_PUSH_ACK, err);
}

/* A whole push, pull or both: begin, send every chunk of every ps at once, chunk by chunk across
 * the ps tasks (chunk 0 of every ps first), so every link is busy from the start and each ps can
 * apply and answer its first chunks while the later ones are still on the wire (docs/protocol.md,
 * "Chunks"); wait for every reply; end. */
static int xfer_once(dt_ps_client *c, call_t *call, const float *const *grads, int64_t *steps, dt_push_result *res,
                     dt_error *err) {
    int rc = xfer_begin(c, call, err);
    if (rc) return rc;
    int most = 0;
    for (int i = 0; i < c->n_ps; i++)
        if (dt_ex_chunks(c->ex, i) > most) most = dt_ex_chunks(c->ex, i);
    for (int k = 0; k < most && !rc; k++)
        for (int i = 0; i < c->n_ps && !rc; i++)
            if (k < dt_ex_chunks(c->ex, i)) rc = psc_send_chunk(c, i, k, grads ? grads[i] : NULL, err);
    if (!rc) rc = psc_gather(c, err);
    /* Whatever happened, the caller gets its gradient buffers back. */
    return psc_call_end(c, rc, steps, res, err);
}

/* ... a pull asked again while a ps says it is busy (psc_ask_again). */
static int xfer(dt_ps_client *c, call_t *call, const float *const *grads, int64_t *steps, dt_push_result *res,
                dt_error *err) {
    const int64_t first = dt_clock_us();
    int pause = BUSY_PAUSE_MS, rc;
    while ((rc = xfer_once(c, call, grads, steps, res, err)) && !call->push && psc_ask_again(c, rc, first, &pause)) {
    }
    return rc;
}

/* A pull into the receive buffers, handed out as views (valid until the next call). */
static int xfer_views(dt_ps_client *c, call_t *call, const float *const *grads, const float **views, int64_t *steps,
                      dt_push_result *res, dt_error *err) {
    float *dst[c->n_ps];
    int rc = recv_buffers(c, dst, err);
    call->dst = dst;
    if (!rc) rc = xfer(c, call, grads, steps, res, err);
    for (int i = 0; i < c->n_ps && !rc; i++) views[i] = dst[i];
    return rc;
}

int dt_ps_client_pull_views(dt_ps_client *c, int64_t min_step, const float **views, int64_t *steps,
                            dt_error *err) {
    return dt_ps_client_push_pull(c, NULL, 0, min_step, views, steps, NULL, err);
}

int dt_ps_client_pull_resume(dt_ps_client *c, const float **views, int64_t *steps, dt_error *err) {
    call_t call = {.pull = 1, .repull = c->aggregate ? 1 : -1};
    return xfer_views(c, &call, NULL, views, steps, NULL, err);
}

int dt_ps_client_pull_all(dt_ps_client *c, float *const *params, int64_t min_step, int64_t *steps,
                          dt_error *err) {
    call_t call = {.pull = 1, .min_step = min_step, .dst = params, .repull = c->aggregate ? 0 : -1};
    return xfer(c, &call, NULL, steps, NULL, err);
}

int dt_ps_client_push_all(dt_ps_client *c, const float *const *grads, int64_t local_step,
                          dt_push_result *res, dt_error *err) {
    call_t call = {.push = 1, .local_step = local_step, .repull = -1};
    return xfer(c, &call, grads, NULL, res, err);
}

int dt_ps_client_push_pull(dt_ps_client *c, const float *const *grads, int64_t local_step,
                           int64_t min_step, const float **views, int64_t *steps, dt_push_result *res,
                           dt_error *err) {
    call_t call = {.push = grads != NULL, .pull = 1, .local_step = local_step, .min_step = min_step,
                   .repull = c->aggregate ? 0 : -1};
    return xfer_views(c, &call, grads, views, steps, res, err);
}

int dt_ps_client_set_examples(dt_ps_client *c, uint64_t examples, dt_error *err) {
    if (examples > DT_WIRE_MAX_EXAMPLES)
        return dt_errorf(err, DT_EINVAL, "ps client: a gradient of %llu examples, beyond the bound "
                         "DT_WIRE_MAX_EXAMPLES = %llu", (unsigned long long)examples,
                         (unsigned long long)DT_WIRE_MAX_EXAMPLES);
    c->examples = (uint32_t)examples;
    return DT_OK;
}

/* ---- streaming: one exchange whose chunks are pushed one by one (worker/overlap.c) ---- */

int dt_ps_client_stream_begin(dt_ps_client *c, int64_t local_step, int64_t min_step, dt_error *err) {
    if (!c->s_dst && !(c->s_dst = dt_calloc((size_t)c->n_ps, sizeof *c->s_dst, "receive buffers", err)))
        return DT_ENOMEM;
    int rc = recv_buffers(c, c->s_dst, err);
    call_t call = {.push = 1, .pull = 1, .local_step = local_step, .min_step = min_step, .dst = c->s_dst,
                   .repull = -1};
    return rc ? rc : xfer_begin(c, &call, err);
}

int dt_ps_client_chunks(const dt_ps_client *c, int ps) { return c->ps[ps].chunks; }

int dt_ps_client_inflight(const dt_ps_client *c, int ps) { return atomic_load(&c->ps[ps].inflight); }

void dt_ps_client_set_wake_fd(dt_ps_client *c, int fd) {
    for (int i = 0; i < c->n_ps; i++) atomic_store(&c->ps[i].wake_fd, fd);
}

int dt_ps_client_stream_push(dt_ps_client *c, int ps, int chunk, const float *grad, dt_error *err) {
    if (dt_ex_get_state(c->ex) != DT_EX_OPEN || !c->call.push || dt_ex_slot(c->ex, ps, chunk) != DT_EX_UNSENT)
        return dt_errorf(err, DT_EINVAL, "ps client: no exchange under way, or chunk %d of ps %d is not due", chunk,
                         ps);
    return psc_send_push(c, ps, chunk, grad, err);
}

int dt_ps_client_stream_poll(dt_ps_client *c, int fd, int max_ms, dt_ps_chunk_fn fn, void *user, dt_error *err) {
    dt_ex_state s = dt_ex_get_state(c->ex);
    if (s != DT_EX_OPEN && s != DT_EX_DONE) return dt_errorf(err, DT_EINVAL, "ps client: no exchange under way");
    c->call.on_chunk = fn, c->call.chunk_user = user;
    int rc = psc_wait_round(c, max_ms, fd, err);
    c->call.on_chunk = NULL, c->call.chunk_user = NULL;
    return rc;
}

int dt_ps_client_stream_end(dt_ps_client *c, int rc, int64_t *steps, dt_push_result *res, dt_error *err) {
    if (dt_ex_get_state(c->ex) == DT_EX_IDLE)
        return rc ? rc : dt_errorf(err, DT_EINVAL, "ps client: no exchange under way");
    /* Sync mode: with every replica's gradient in each step every chunk comes back at one step. While
     * a ps waits for fewer (a worker lost), a chunk can come back a step ahead of another; the
     * caller has already computed on it as it came (it cannot be pulled again under a forward that
     * read it), the shard's step is its oldest chunk's, and the chunks ahead drop the next gradient
     * as stale, so the worker is back in step after one exchange: no repull here. */
    return psc_call_end(c, rc, steps, res, err);
}

/* ---- sparse tables: messages built by the caller (worker/sparse_client.h) ---- */

static int on_sparse(dt_ps_client *c, int i, dt_msg *in, void *user, dt_error *err) {
    (void)user;
    return c->call.sparse_fn(c->call.sparse_user, i, c->call.reply_slot, &in->hdr, in->data, in->size, err);
}

int dt_ps_client_sparse_send(dt_ps_client *c, const int *n_msgs, dt_sparse_msg *const *msgs, dt_sparse_reply_fn fn,
                             void *user, int *sent, dt_error *err) {
    uint8_t type = 0;
    *sent = 0;
    for (int i = 0; i < c->n_ps; i++) {
        if (n_msgs[i] < 0 || n_msgs[i] > (int)DT_WIRE_MAX_CHUNKS)
            return dt_errorf(err, DT_EINVAL, "ps client: %d sparse messages to ps %d (at most %u per call)", n_msgs[i],
                             i, DT_WIRE_MAX_CHUNKS);
        for (int k = 0; k < n_msgs[i]; k++) {
            if (!type) type = msgs[i][k].h.type;
            if (msgs[i][k].h.type != type || !dt_wire_type_is_sparse(type) || type == DT_MSG_SPARSE_ROWS ||
                type == DT_MSG_SPARSE_PAGE)
                return dt_errorf(err, DT_EINVAL, "ps client: a sparse call sends requests of one kind (SPARSE_INIT, "
                                 "_PULL, _PUSH, _EXPORT or _IMPORT)");
        }
    }
    if (!type) return DT_OK; /* nothing to send */
    call_t call = {.what = dt_wire_type_name(type), .fn = on_sparse, .repull = -1, .slots = n_msgs,
                   .sparse_fn = fn, .sparse_user = user};
    const uint8_t want = type == DT_MSG_SPARSE_PULL     ? DT_MSG_SPARSE_ROWS
                         : type == DT_MSG_SPARSE_EXPORT ? DT_MSG_SPARSE_PAGE
                                                        : DT_MSG_ACK;
    int rc = psc_call_begin(c, &call, want, err);
    if (rc) return rc;
    *sent = 1;
    for (int i = 0; i < c->n_ps && !rc; i++)
        for (int k = 0; k < n_msgs[i] && !rc; k++) {
            const dt_sparse_msg *m = &msgs[i][k];
            dt_bytes z = {.data = m->payload, .size = m->bytes}; /* borrowed: the transport copies it */
            dt_wire_header h = m->h;
            rc = psc_send_req(c, i, k, &h, &z, psc_request_deadline(c), err);
        }
    /* the call stays under way: dt_ps_client_sparse_end takes its replies, or ends its failure */
    return rc;
}

int dt_ps_client_sparse_end(dt_ps_client *c, int rc, dt_error *err) {
    if (!rc) rc = psc_gather(c, err);
    return psc_call_end(c, rc, NULL, NULL, err);
}

int dt_ps_client_sparse(dt_ps_client *c, const int *n_msgs, dt_sparse_msg *const *msgs, dt_sparse_reply_fn fn,
                        void *user, dt_error *err) {
    int sent, rc = dt_ps_client_sparse_send(c, n_msgs, msgs, fn, user, &sent, err);
    return sent ? dt_ps_client_sparse_end(c, rc, err) : rc;
}

/* ---- checkpoints and the end of training ---- */

/* Where STATE replies go. */
typedef struct {
    const dt_opt_config *opt;
    float *const *params, *const *state;
    int64_t *steps_max;
} fetch_ctx;

static int on_state(dt_ps_client *c, int i, dt_msg *in, void *user, dt_error *err) {
    fetch_ctx *f = user;
    const dt_wire_header *h = &in->hdr;
    if (h->opt_kind != (uint8_t)f->opt->kind) {
        char msg[160];
        snprintf(msg, sizeof msg, "holds %s optimizer state, the caller expects %s (same --optimizer everywhere?)",
                 dt_opt_name((dt_opt_kind)h->opt_kind), dt_opt_name(f->opt->kind));
        return psc_fail_ps(c, i, err, DT_EPROTO, "FETCH", msg);
    }
    /* The slot count matches the kind (checked by decode) and the size the slots (by the exchange). */
    const char *d = in->data;
    size_t pbytes = c->ps[i].n * sizeof(float);
    memcpy(f->params[i], d, pbytes);
    if (f->state && h->opt_slots) memcpy(f->state[i], d + pbytes, (size_t)h->opt_slots * pbytes);
    if (f->steps_max) f->steps_max[i] = h->state.step_max > INT64_MAX ? INT64_MAX : (int64_t)h->state.step_max;
    return DT_OK;
}

int dt_ps_client_fetch_state(dt_ps_client *c, const dt_opt_config *opt, float *const *params,
                             float *const *state, int64_t *steps, int64_t *steps_max, dt_error *err) {
    fetch_ctx f = {.opt = opt, .params = params, .state = state, .steps_max = steps_max};
    int rc = psc_ask_every_ps(c, DT_MSG_FETCH, DT_MSG_STATE, "FETCH", on_state, &f, err);
    if (!rc && steps)
        for (int i = 0; i < c->n_ps; i++) steps[i] = c->ps[i].st.global_step;
    return rc;
}

int dt_ps_client_shutdown(dt_ps_client *c, dt_error *err) {
    if (c->role != DT_ROLE_CHIEF) return dt_errorf(err, DT_EINVAL, "only the chief shuts the ps tasks down");
    return psc_ask_every_ps(c, DT_MSG_SHUTDOWN, DT_MSG_ACK, "SHUTDOWN", NULL, NULL, err);
}

int dt_ps_client_done(dt_ps_client *c, int waiting, dt_error *err) {
    return psc_ask_every_ps_flagged(c, DT_MSG_DONE, waiting ? DT_WIRE_F_WAITING : 0, DT_MSG_ACK, "DONE", NULL, NULL, err);
}

/* The first ps the chief's end of a job still waits for (-1: none): a member of ps 0's work plan
 * still training (a joiner that left must not stand in for one), or too few DONE. */
static int end_behind(const dt_ps_client *c, int n_workers) {
    for (int i = 0; i < c->n_ps; i++)
        if (c->ps[i].st.workers_busy > 0 || c->ps[i].st.workers_done < (uint64_t)(n_workers > 0 ? n_workers : 0))
            return i;
    return -1;
}

int dt_ps_client_wait_done(dt_ps_client *c, int n_workers, int timeout_ms, dt_error *err) {
    int64_t deadline = dt_clock_us() + (timeout_ms > 0 ? timeout_ms : 0) * 1000LL;
    for (;;) { /* asked even when n_workers <= 0: joiners of a work plan may be training */
        int rc = dt_ps_client_status(c, NULL, err), behind;
        if (rc) return rc;
        if ((behind = end_behind(c, n_workers)) < 0) return DT_OK;
        int stopped = psc_stopping(c);
        int64_t until = stopped && psc_stop_deadline(c) < deadline ? psc_stop_deadline(c) : deadline;
        int64_t left = (until - dt_clock_us()) / 1000;
        if (left <= 0) {
            const dt_ps_shard_status *st = &c->ps[behind].st;
            char msg[240];
            snprintf(msg, sizeof msg, "only %llu of %d worker(s) finished, %lld still training on the work plan, within "
                     "%d ms%s (still training, or gone?)", (unsigned long long)st->workers_done, n_workers,
                     (long long)st->workers_busy, stopped ? STOP_GRACE_MS : timeout_ms,
                     stopped ? " of this process being stopped by a signal" : "");
            return psc_fail_ps(c, behind, err, DT_ETIMEOUT, "", msg);
        }
        pause_ms(left < READY_POLL_MS ? left : READY_POLL_MS);
    }
}

/* ---- one request to one ps (the WORK messages to ps 0, worker/work_client.h) ---- */

static int on_one(dt_ps_client *c, int i, dt_msg *in, void *user, dt_error *err) {
    (void)i, (void)user;
    size_t len = in->size; /* bounded by the connection's frame limit and dt_wire_check_payload */
    if (len > c->one_cap) {
        uint8_t *b = realloc(c->one_buf, len);
        if (!b) return dt_errorf(err, DT_ENOMEM, "ps client: out of memory for a %zu-byte reply", len);
        c->one_buf = b, c->one_cap = len;
    }
    if (len) memcpy(c->one_buf, in->data, len);
    c->one_reply = in->hdr;
    c->one_len = len;
    return DT_OK;
}

int dt_ps_client_ask_one(dt_ps_client *c, int ps, dt_wire_header *h, const void *payload, size_t len, uint8_t want,
                         const char *what, dt_error *err) {
    if (ps < 0 || ps >= c->n_ps) return dt_errorf(err, DT_EINVAL, "ps client: %s to ps %d of %d", what, ps, c->n_ps);
    call_t call = {.what = what, .fn = on_one, .repull = -1, .alone = 1, .to_ps = ps};
    int rc = psc_call_begin(c, &call, want, err);
    if (rc) return rc;
    dt_bytes m = {.data = payload, .size = len}; /* borrowed: the transport copies it */
    h->payload_bytes = len;
    rc = psc_send_req(c, ps, 0, h, len ? &m : NULL, psc_request_deadline(c), err);
    if (rc) return psc_call_end(c, rc, NULL, NULL, err);
    c->one_len = 0;
    return DT_OK;
}

int dt_ps_client_ask_one_end(dt_ps_client *c, dt_wire_header *reply, const void **payload, size_t *len,
                             dt_error *err) {
    if (dt_ex_get_state(c->ex) == DT_EX_IDLE || !c->call.alone)
        return dt_errorf(err, DT_EINVAL, "ps client: no request to one ps under way");
    int rc = psc_gather(c, err);
    rc = psc_call_end(c, rc, NULL, NULL, err);
    if (rc) return rc;
    if (reply) *reply = c->one_reply;
    if (payload) *payload = c->one_len ? c->one_buf : NULL;
    if (len) *len = c->one_len;
    return DT_OK;
}

int dt_ps_client_asking_one(const dt_ps_client *c) {
    return dt_ex_get_state(c->ex) != DT_EX_IDLE && c->call.alone;
}
