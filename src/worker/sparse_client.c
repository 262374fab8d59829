/* A worker's side of the sparse tables (sparse_client.h): ids split by ps, messages built in one
 * buffer per call, replies written into the net's blocks. */
#include "worker/sparse_client.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cluster/row_placement.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/finite.h"
#include "io/bytes.h"
#include "transport/compress.h"
#include "transport/wire.h"

/* Where one message's ids came from: table t, its slots[count] in the block. */
typedef struct {
    int t;
    const size_t *slots;
    size_t count;
} msg_src;

struct dt_sparse_client {
    dt_sparse_config cfg;
    dt_net *net;
    int n_ps, n_tables;
    int64_t step;             /* sync: the step of the rows pulled for training (the push is for it) */
    int64_t want;             /* sync: the step the next pull waits for */
    int64_t reply_step;       /* the oldest step of a training pull's replies (-1: none yet) */
    int training;             /* the pull under way is a training batch's */
    int probing;              /* dt_sparse_wait_declared's pulls: their rows go nowhere */
    size_t cap;               /* ids the scratch below holds */
    uint64_t *ids;            /* [cap] a table's ids (push: of its touched rows) */
    int *ps_of;               /* [cap] */
    size_t *order;            /* [cap] positions grouped by ps (dt_row_split) */
    size_t *begin;            /* [n_ps + 1] */
    uint8_t *buf;             /* payloads of one round */
    size_t buf_cap;
    int *n_msgs;              /* [n_ps] messages of the round to each ps */
    dt_sparse_msg *msgs;      /* [n_ps * DT_WIRE_MAX_CHUNKS] */
    dt_sparse_msg **msg_rows; /* [n_ps] rows of msgs */
    msg_src *src;             /* [n_ps * DT_WIRE_MAX_CHUNKS] each message's ids */
    dt_sparse_stats stats;
};

static int fill_cb(void *user, dt_net *net, int training, dt_error *err) {
    (void)net;
    return dt_sparse_pull(user, training, err);
}

int dt_sparse_client_create(dt_sparse_client **out, const dt_sparse_config *cfg, dt_net *net, dt_error *err) {
    *out = NULL;
    if (!dt_net_compact_tables(net))
        return dt_errorf(err, DT_EINVAL, "sparse client: the net does not keep its tables elsewhere");
    if (!dt_enc_size(cfg->encoding))
        return dt_errorf(err, DT_EINVAL, "sparse client: unknown encoding %u", (unsigned)cfg->encoding);
    dt_sparse_client *s = dt_calloc(1, sizeof *s, "sparse client", err);
    if (!s) return DT_ENOMEM;
    s->cfg = *cfg;
    s->net = net;
    s->n_ps = dt_ps_client_n_ps(cfg->client);
    s->n_tables = dt_net_num_tables(net);
    s->reply_step = -1;
    size_t slots = (size_t)s->n_ps * DT_WIRE_MAX_CHUNKS;
    s->begin = dt_calloc((size_t)s->n_ps + 1, sizeof *s->begin, "sparse client", err);
    s->n_msgs = dt_calloc((size_t)s->n_ps, sizeof *s->n_msgs, "sparse client", err);
    s->msgs = dt_calloc(slots, sizeof *s->msgs, "sparse messages", err);
    s->msg_rows = dt_calloc((size_t)s->n_ps, sizeof *s->msg_rows, "sparse messages", err);
    s->src = dt_calloc(slots, sizeof *s->src, "sparse messages", err);
    if (!s->begin || !s->n_msgs || !s->msgs || !s->msg_rows || !s->src) {
        dt_sparse_client_free(s);
        return DT_ENOMEM;
    }
    for (int p = 0; p < s->n_ps; p++) s->msg_rows[p] = s->msgs + (size_t)p * DT_WIRE_MAX_CHUNKS;
    dt_net_set_table_fill(net, fill_cb, s);
    *out = s;
    return DT_OK;
}

void dt_sparse_client_free(dt_sparse_client *s) {
    if (!s) return;
    dt_net_set_table_fill(s->net, NULL, NULL);
    free(s->ids), free(s->ps_of), free(s->order), free(s->begin), free(s->buf);
    free(s->n_msgs), free(s->msgs), free(s->msg_rows), free(s->src);
    free(s);
}

void dt_sparse_reset(dt_sparse_client *s) { s->step = s->want = 0; }

const dt_sparse_stats *dt_sparse_get_stats(const dt_sparse_client *s) { return &s->stats; }

/* Room for n ids in the scratch arrays and `bytes` of payloads. */
static int reserve(dt_sparse_client *s, size_t n, size_t bytes, dt_error *err) {
    if (n > s->cap) {
        free(s->ids), free(s->ps_of), free(s->order);
        s->ids = dt_calloc(n, sizeof *s->ids, "sparse ids", err);
        s->ps_of = dt_calloc(n, sizeof *s->ps_of, "sparse ids", err);
        s->order = dt_calloc(n, sizeof *s->order, "sparse ids", err);
        s->cap = 0;
        if (!s->ids || !s->ps_of || !s->order) return DT_ENOMEM;
        s->cap = n;
    }
    if (bytes > s->buf_cap) {
        free(s->buf);
        s->buf_cap = 0;
        if (!(s->buf = dt_malloc(bytes, "sparse payloads", err))) return DT_ENOMEM;
        s->buf_cap = bytes;
    }
    return DT_OK;
}

/* Ids one message may carry for rows of dim floats (docs/protocol.md, "Bounds"). */
static size_t ids_per_msg(int dim) {
    size_t by_floats = DT_WIRE_MAX_SPARSE_FLOATS / (size_t)dim;
    return by_floats < DT_WIRE_MAX_SPARSE_IDS ? by_floats : DT_WIRE_MAX_SPARSE_IDS;
}

/* ---- rounds: messages to every ps, at most DT_WIRE_MAX_CHUNKS to each per exchange ---- */

typedef struct {
    int push;                 /* SPARSE_PUSH (else SPARSE_PULL) */
    int64_t step;             /* pull: the oldest step wanted; push: the step it is for */
    size_t at;                /* bytes of s->buf used */
} round_t;

static int on_reply(void *user, int ps, int k, const dt_wire_header *h, const void *payload, size_t len,
                    dt_error *err);

static int flush(dt_sparse_client *s, round_t *r, dt_error *err) {
    int rc = dt_ps_client_sparse(s->cfg.client, s->n_msgs, s->msg_rows, on_reply, s, err);
    memset(s->n_msgs, 0, (size_t)s->n_ps * sizeof *s->n_msgs);
    r->at = 0;
    return rc;
}

/* Messages of a part of table t for ps p: each message's ids are ids[order[i]] (its slots, for a
 * push the positions of rows in grad [.., dim]); a sync push goes even with no id. */
static void add_part(dt_sparse_client *s, round_t *r, int t, int dim, int p, const uint64_t *ids, const size_t *order,
                     size_t count, const float *grad) {
    const size_t per = ids_per_msg(dim);
    int parts = count ? (int)((count + per - 1) / per) : 1;
    for (int part = 0; part < parts; part++) {
        size_t lo = (size_t)part * per, n = count - lo < per ? count - lo : per;
        uint8_t *pay = s->buf + r->at;
        for (size_t i = 0; i < n; i++) dt_put_u64(pay + 8 * i, ids[order[lo + i]]);
        size_t bytes = 8 * n;
        if (r->push) {
            const size_t row = (size_t)dim * dt_enc_size(s->cfg.encoding);
            for (size_t i = 0; i < n; i++)
                s->stats.saturated += dt_pack(s->cfg.encoding, pay + bytes + i * row, grad + order[lo + i] * (size_t)dim,
                                              (size_t)dim);
            bytes += n * row;
        }
        r->at += bytes;
        int k = s->n_msgs[p]++;
        s->stats.messages++;
        dt_sparse_msg *m = &s->msg_rows[p][k];
        m->h = dt_wire_header_make(r->push ? DT_MSG_SPARSE_PUSH : DT_MSG_SPARSE_PULL, 0, 0, 0);
        m->h.sparse.table = (uint64_t)t, m->h.sparse.ids = n, m->h.sparse.dim = (uint64_t)dim;
        m->h.encoding = (uint8_t)s->cfg.encoding; /* of the rows pushed, or of the rows wanted */
        if (r->push) {
            m->h.local_step = r->step;
            m->h.flags = s->cfg.sync ? DT_WIRE_F_SYNC : 0;
            m->h.chunk = (uint8_t)part, m->h.chunks = (uint8_t)parts;
        } else {
            m->h.global_step = r->step;
        }
        m->payload = pay, m->bytes = bytes;
        s->src[(size_t)p * DT_WIRE_MAX_CHUNKS + (size_t)k] = (msg_src){t, order + lo, n};
    }
}

/* Table t's ids [n] into the round, split by ps (its scratch from `base` on); flushes first when a
 * ps has no room for its messages. */
static int add_table(dt_sparse_client *s, round_t *r, int t, int dim, const uint64_t *ids, size_t n, size_t base,
                     const float *grad, dt_error *err) {
    size_t *order = s->order + base;
    dt_row_split((uint32_t)t, ids, n, s->n_ps, s->ps_of + base, s->begin, order);
    const size_t per = ids_per_msg(dim);
    int flushed = 0;
    for (int p = 0; p < s->n_ps; p++) {
        size_t count = s->begin[p + 1] - s->begin[p];
        int parts = count ? (int)((count + per - 1) / per) : r->push && s->cfg.sync;
        if (parts > (int)DT_WIRE_MAX_CHUNKS)
            return dt_errorf(err, DT_EINVAL, "table %d: %zu rows for ps %d in one step, more than %u messages of %zu",
                             t, count, p, DT_WIRE_MAX_CHUNKS, per);
        if (!flushed && s->n_msgs[p] + parts > (int)DT_WIRE_MAX_CHUNKS) {
            int rc = flush(s, r, err);
            if (rc) return rc;
            flushed = 1;
        }
    }
    for (int p = 0; p < s->n_ps; p++) {
        size_t count = s->begin[p + 1] - s->begin[p];
        if (count || (r->push && s->cfg.sync)) add_part(s, r, t, dim, p, ids, order + s->begin[p], count, grad);
    }
    return DT_OK;
}

/* A SPARSE_ROWS reply: the rows of its message's slots, as asked (table, ids, dim, step), finite;
 * an ACK: its push taken or, sync, stale. */
static int on_reply(void *user, int ps, int k, const dt_wire_header *h, const void *payload, size_t len,
                    dt_error *err) {
    dt_sparse_client *s = user;
    if (h->type == DT_MSG_ACK) {
        s->stats.stale += h->status == DT_WIRE_STALE;
        return DT_OK;
    }
    if (s->probing) return DT_OK;
    const msg_src *m = &s->src[(size_t)ps * DT_WIRE_MAX_CHUNKS + (size_t)k];
    dt_table_block b;
    if (dt_net_table_block(s->net, m->t, &b)) return dt_errorf(err, DT_EINVAL, "sparse client: no table %d", m->t);
    const size_t dim = (size_t)b.dim, esize = dt_enc_size(s->cfg.encoding);
    if (h->sparse.table != (uint64_t)m->t || h->sparse.ids != m->count || h->sparse.dim != dim ||
        h->encoding != s->cfg.encoding || len != m->count * dim * esize)
        return dt_errorf(err, DT_EPROTO, "ps %d: SPARSE_ROWS of table %llu, %llu ids of dim %llu in %s, answering a "
                         "pull of table %d, %zu ids of dim %zu in %s", ps, (unsigned long long)h->sparse.table,
                         (unsigned long long)h->sparse.ids, (unsigned long long)h->sparse.dim,
                         dt_enc_name(h->encoding), m->t, m->count, dim, dt_enc_name(s->cfg.encoding));
    const uint8_t *src = payload;
    for (size_t i = 0; i < m->count; i++) {
        float *row = b.rows + m->slots[i] * dim;
        dt_unpack(s->cfg.encoding, row, src + i * dim * esize, dim);
        if (dt_first_nonfinite(row, dim) < dim)
            return dt_errorf(err, DT_EFORMAT, "ps %d: served a non-finite value in row %llu of table %d (%s) at step "
                             "%lld: training diverged (lower --learning_rate) or the ps is damaged", ps,
                             (unsigned long long)b.ids[m->slots[i]], m->t, dt_net_view(s->net, b.view)->name,
                             (long long)h->global_step);
    }
    if (s->training && (s->reply_step < 0 || h->global_step < s->reply_step)) s->reply_step = h->global_step;
    return DT_OK;
}

int dt_sparse_pull(dt_sparse_client *s, int training, dt_error *err) {
    size_t total = 0;
    dt_table_block b;
    for (int t = 0; t < s->n_tables; t++) {
        if (dt_net_table_block(s->net, t, &b)) return dt_errorf(err, DT_EINVAL, "sparse client: no table %d", t);
        total += b.n;
    }
    int rc = reserve(s, total ? total : 1, 8 * (total ? total : 1), err);
    if (rc) return rc;
    round_t r = {.push = 0, .step = s->cfg.sync ? s->want : 0};
    s->training = training;
    s->reply_step = -1;
    size_t base = 0;
    for (int t = 0; t < s->n_tables && !rc; t++) {
        dt_net_table_block(s->net, t, &b);
        rc = add_table(s, &r, t, b.dim, b.ids, b.n, base, NULL, err);
        base += b.n;
        s->stats.rows_pulled += b.n;
    }
    if (!rc) rc = flush(s, &r, err);
    if (rc) return rc;
    s->stats.pulls++;
    /* the step the push of this batch is for: the rows' (sync mode: every table at one step) */
    if (training) s->step = s->reply_step >= 0 && s->reply_step > s->want ? s->reply_step : s->want;
    return DT_OK;
}

int dt_sparse_push(dt_sparse_client *s, dt_error *err) {
    size_t total = 0, bytes = 0;
    dt_table_grad g;
    for (int t = 0; t < s->n_tables; t++) {
        if (dt_net_table_grad(s->net, t, &g)) return dt_errorf(err, DT_EINVAL, "sparse client: no table %d", t);
        total += g.n;
        bytes += g.n * (8 + dt_enc_size(s->cfg.encoding) * (size_t)g.dim);
    }
    int rc = reserve(s, total ? total : 1, bytes ? bytes : 1, err);
    if (rc) return rc;
    round_t r = {.push = 1, .step = s->step};
    size_t base = 0;
    for (int t = 0; t < s->n_tables && !rc; t++) {
        dt_table_block b;
        dt_net_table_grad(s->net, t, &g);
        dt_net_table_block(s->net, t, &b);
        /* the gradient's rows are slots of the block: their ids, in the gradient's order */
        for (size_t i = 0; i < g.n; i++) s->ids[base + i] = b.ids[g.rows[i]];
        rc = add_table(s, &r, t, g.dim, s->ids + base, g.n, base, g.grad, err);
        base += g.n;
        s->stats.rows_pushed += g.n;
    }
    if (!rc) rc = flush(s, &r, err);
    if (rc) return rc;
    s->stats.pushes++;
    s->want = s->step + 1;
    return DT_OK;
}

/* ---- SPARSE_INIT ---- */

/* Table t's record: its layer's dim, rows (the capacity: every bucket can have one; unbounded ids: the
 * layer's capacity=, min_count= and evict_after=) and initialiser. */
int dt_sparse_table_record(const dt_sparse_client *s, int t, dt_wire_table *w, dt_error *err) {
    const dt_model_spec *spec = dt_net_spec(s->net);
    for (int i = 0, seen = 0; i < spec->n_layers; i++) {
        const dt_layer_spec *L = &spec->layers[i];
        if (L->kind != DT_LAYER_EMBEDDING) continue;
        int n = L->shared ? 1 : L->n_fields;
        if (t >= seen + n) {
            seen += n;
            continue;
        }
        *w = (dt_wire_table){.table = (uint32_t)t, .dim = (uint32_t)L->dim, .opt = s->cfg.opt, .seed = s->cfg.seed};
        w->capacity = (uint64_t)L->buckets < (UINT64_C(1) << 31) ? (uint64_t)L->buckets : UINT64_C(1) << 31;
        if (!L->buckets) {
            w->capacity = (uint64_t)L->capacity;
            w->min_count = (uint8_t)L->min_count;
            w->expire_steps = (uint64_t)L->evict_after;
        }
        /* TensorFlow's embedding initialisers the ps draws per row: zeros and truncated normal */
        if (L->weight_init.kind == DT_INIT_CONSTANT && L->weight_init.value == 0.0f) {
            w->init_kind = 0; /* zeros (docs/protocol.md, "Table records") */
        } else if (L->weight_init.kind == DT_INIT_TRUNC_NORMAL) {
            w->init_kind = 2; /* normal, truncated at 2 stddev */
            w->init_scale = L->weight_init.value;
        } else {
            return dt_errorf(err, DT_EINVAL, "%s:%d: embedding %s: the ps tasks draw a table's rows as "
                             "constant(0) or truncated_normal(stddev) only; give one of them as weight_init",
                             spec->source[0] ? spec->source : spec->name, L->line, L->name);
        }
        return DT_OK;
    }
    return dt_errorf(err, DT_EINVAL, "sparse client: no table %d in the model", t);
}

int dt_sparse_declare(dt_sparse_client *s, int64_t step, dt_error *err) {
    if (s->n_tables < 1 || s->n_tables > (int)DT_WIRE_MAX_TABLES)
        return dt_errorf(err, DT_EINVAL, "sparse client: %d tables (1..%u)", s->n_tables, DT_WIRE_MAX_TABLES);
    size_t bytes = (size_t)s->n_tables * DT_WIRE_TABLE_BYTES;
    int rc = reserve(s, 1, bytes, err);
    for (int t = 0; t < s->n_tables && !rc; t++) {
        dt_wire_table w;
        if (!(rc = dt_sparse_table_record(s, t, &w, err))) dt_wire_table_encode(s->buf + (size_t)t * DT_WIRE_TABLE_BYTES, &w);
    }
    if (rc) return rc;
    for (int p = 0; p < s->n_ps; p++) {
        dt_sparse_msg *m = &s->msg_rows[p][0];
        m->h = dt_wire_header_make(DT_MSG_SPARSE_INIT, 0, 0, 0);
        m->h.sparse.ids = (uint64_t)s->n_tables;
        m->h.global_step = step;
        m->payload = s->buf, m->bytes = bytes;
        s->n_msgs[p] = 1;
    }
    round_t r = {0};
    if ((rc = flush(s, &r, err))) return rc;
    s->step = s->want = step;
    return DT_OK;
}

/* One pull of one row of the last table from every ps: answered once the chief's SPARSE_INIT (all
 * tables at once) is in. */
static int probe(dt_sparse_client *s, dt_error *err) {
    const uint32_t last = (uint32_t)(s->n_tables - 1);
    dt_table_grad g;
    dt_net_table_grad(s->net, (int)last, &g);
    int rc = reserve(s, 1, 8 * (size_t)s->n_ps, err);
    for (int p = 0; p < s->n_ps && !rc; p++) {
        uint64_t id = 0; /* an id of p's: expected n_ps tries (ids spread evenly) */
        while (dt_row_ps(last, id, s->n_ps) != p) id++;
        dt_put_u64(s->buf + 8 * (size_t)p, id);
        dt_sparse_msg *m = &s->msg_rows[p][0];
        m->h = dt_wire_header_make(DT_MSG_SPARSE_PULL, 0, 0, 0);
        m->h.sparse.table = last, m->h.sparse.ids = 1, m->h.sparse.dim = (uint64_t)g.dim;
        m->payload = s->buf + 8 * (size_t)p, m->bytes = 8;
        s->n_msgs[p] = 1;
    }
    if (rc) return rc;
    s->probing = 1;
    round_t r = {0};
    rc = flush(s, &r, err);
    s->probing = 0;
    return rc;
}

int dt_sparse_wait_declared(dt_sparse_client *s, int timeout_ms, dt_error *err) {
    int64_t deadline = dt_clock_us() + (int64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000;
    for (;;) {
        int rc = probe(s, err);
        /* a table not declared yet is refused as a bad value; anything else is an answer */
        if (rc != DT_EPROTO || dt_ps_client_last_refusal(s->cfg.client) != DT_WIRE_E_BAD_VALUE) return rc;
        if (dt_clock_us() >= deadline)
            return dt_error_wrap(err, DT_ETIMEOUT, "the chief has not declared the sparse tables within %d ms: ",
                                 timeout_ms);
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* ---- Checkpoints: a table's rows out of the ps tasks and into them (SPARSE_EXPORT, SPARSE_IMPORT) ---- */

#define PAGE_FLOATS (1u << 18)  /* a page's rows: at most 1 MiB of floats (and 8 bytes an id) */
#define MAX_RESTARTS 64         /* walks a ps may start again (its rows moved) for one table */

/* One table's export: where each ps's walk stands. */
typedef struct {
    dt_sparse_client *s;
    int t;
    dt_wire_table w;
    uint64_t buckets;
    uint64_t *cursor;         /* [n_ps] the next request's; 0 once done (done[p] set) */
    uint8_t *done;            /* [n_ps] */
    uint64_t *pages, *restarts; /* [n_ps] */
    uint64_t max_pages;
    size_t per;               /* rows a page may hold, as asked */
    dt_sparse_page_fn put;
    void *user;
} export_ctx;

/* A SPARSE_PAGE: of the table asked for, its rows checked (ids below the table's rows, finite, slots
 * in range), handed to put; the ps's cursor moves on (a walk started again is counted). */
static int on_page(void *user, int ps, int k, const dt_wire_header *h, const void *payload, size_t len,
                   dt_error *err) {
    (void)k;
    export_ctx *x = user;
    const int t = x->t;
    if (h->sparse.table != (uint64_t)t || h->sparse.dim != x->w.dim || h->opt_kind != (uint8_t)x->w.opt.kind ||
        h->sparse.ids > x->per)
        return dt_errorf(err, DT_EPROTO, "ps %d: SPARSE_PAGE of table %llu, %llu rows of dim %llu, optimizer %u, "
                         "answering an export of table %d, at most %zu rows of dim %u, optimizer %u", ps,
                         (unsigned long long)h->sparse.table, (unsigned long long)h->sparse.ids,
                         (unsigned long long)h->sparse.dim, h->opt_kind, t, x->per, x->w.dim, (unsigned)x->w.opt.kind);
    dt_wire_rows page;
    int rc = dt_wire_rows_check(&page, h, payload, len, x->buckets, err);
    if (rc) return dt_error_wrap(err, DT_EPROTO, "ps %d: ", ps);
    const uint64_t was = x->cursor[ps], next = (uint64_t)h->cursor;
    if (was && next && next >> 32 != was >> 32 && ++x->restarts[ps] > MAX_RESTARTS)
        return dt_errorf(err, DT_EPROTO, "ps %d: table %d's rows moved under its export %d times (rows evicted, or "
                         "its index growing, while the chief read it)", ps, t, MAX_RESTARTS);
    if (++x->pages[ps] > x->max_pages)
        return dt_errorf(err, DT_EPROTO, "ps %d: more than %llu pages of table %d, whose %llu rows take %llu at most",
                         ps, (unsigned long long)x->max_pages, t, (unsigned long long)x->buckets,
                         (unsigned long long)x->max_pages);
    if ((rc = x->put(x->user, t, &page, h->global_step, err))) return rc;
    x->cursor[ps] = next;
    x->done[ps] = next == 0;
    return DT_OK;
}

/* One round: a SPARSE_EXPORT to each ps whose walk is not done, for up to per rows; 0 when every
 * walk is done (*more 0). */
static int export_round(export_ctx *x, int *more, dt_error *err) {
    dt_sparse_client *s = x->s;
    *more = 0;
    for (int p = 0; p < s->n_ps; p++) {
        s->n_msgs[p] = !x->done[p];
        if (x->done[p]) continue;
        *more = 1;
        dt_sparse_msg *m = &s->msg_rows[p][0];
        m->h = dt_wire_header_make(DT_MSG_SPARSE_EXPORT, 0, 0, 0);
        m->h.sparse.table = (uint64_t)x->t, m->h.sparse.ids = x->per, m->h.sparse.dim = x->w.dim;
        m->h.opt_kind = (uint8_t)x->w.opt.kind, m->h.opt_slots = (uint8_t)dt_lazy_slots(x->w.opt.kind);
        m->h.cursor = (int64_t)x->cursor[p];
        m->payload = NULL, m->bytes = 0;
    }
    int rc = *more ? dt_ps_client_sparse(s->cfg.client, s->n_msgs, s->msg_rows, on_page, x, err) : DT_OK;
    memset(s->n_msgs, 0, (size_t)s->n_ps * sizeof *s->n_msgs);
    return rc;
}

int dt_sparse_export(dt_sparse_client *s, int t, dt_sparse_page_fn put, void *user, dt_error *err) {
    export_ctx x = {.s = s, .t = t, .put = put, .user = user};
    dt_table_block b;
    int rc = dt_net_table_block(s->net, t, &b) ? dt_errorf(err, DT_EINVAL, "sparse client: no table %d", t)
                                                : dt_sparse_table_record(s, t, &x.w, err);
    if (rc) return rc;
    x.buckets = b.buckets;
    const size_t slots = (size_t)dt_lazy_slots(x.w.opt.kind), k = x.w.dim * (1 + slots);
    size_t per = dt_wire_rows_per_msg(x.w.dim, slots);
    if (per > PAGE_FLOATS / k) per = PAGE_FLOATS / k ? PAGE_FLOATS / k : 1;
    /* a ps holds at most the table's rows (buckets), or its capacity (unbounded ids) */
    x.max_pages = (MAX_RESTARTS + 1) * ((x.buckets ? x.buckets : x.w.capacity) / per + 2);
    x.per = per;
    const size_t n = (size_t)s->n_ps;
    x.cursor = dt_calloc(n, sizeof *x.cursor, "sparse export", err);
    x.done = dt_calloc(n, 1, "sparse export", err);
    x.pages = dt_calloc(n, sizeof *x.pages, "sparse export", err);
    x.restarts = dt_calloc(n, sizeof *x.restarts, "sparse export", err);
    rc = x.cursor && x.done && x.pages && x.restarts ? DT_OK : DT_ENOMEM;
    for (int more = 1; !rc && more;) rc = export_round(&x, &more, err);
    free(x.cursor), free(x.done), free(x.pages), free(x.restarts);
    return rc;
}

/* Messages of table t's rows for ps p: ids[order[i]] with their rows [.., k], up to per a message. */
static void add_import(dt_sparse_client *s, size_t *at, int t, const dt_wire_table *w, int p, const uint64_t *ids,
                       const size_t *order, size_t count, const float *rows, size_t per) {
    const size_t slots = (size_t)dt_lazy_slots(w->opt.kind), k = w->dim * (1 + slots);
    for (size_t lo = 0; lo < count; lo += per) {
        const size_t n = count - lo < per ? count - lo : per;
        uint8_t *pay = s->buf + *at;
        for (size_t i = 0; i < n; i++) {
            dt_put_u64(pay + 8 * i, ids[order[lo + i]]);
            memcpy(pay + 8 * n + 4 * k * i, rows + k * order[lo + i], 4 * k); /* host order: little-endian */
        }
        *at += n * (8 + 4 * k);
        dt_sparse_msg *m = &s->msg_rows[p][s->n_msgs[p]++];
        m->h = dt_wire_header_make(DT_MSG_SPARSE_IMPORT, 0, 0, 0);
        m->h.sparse.table = (uint64_t)t, m->h.sparse.ids = n, m->h.sparse.dim = w->dim;
        m->h.opt_kind = (uint8_t)w->opt.kind, m->h.opt_slots = (uint8_t)slots;
        m->payload = pay, m->bytes = n * (8 + 4 * k);
    }
}

static int on_import_ack(void *user, int ps, int k, const dt_wire_header *h, const void *payload, size_t len,
                         dt_error *err) {
    (void)user, (void)ps, (void)k, (void)h, (void)payload, (void)len, (void)err;
    return DT_OK; /* the exchange checked it is an ACK from that ps, without payload */
}

int dt_sparse_import(dt_sparse_client *s, int t, const uint64_t *ids, const float *rows, size_t n, dt_error *err) {
    dt_wire_table w;
    int rc = dt_sparse_table_record(s, t, &w, err);
    if (rc || n == 0) return rc;
    const size_t slots = (size_t)dt_lazy_slots(w.opt.kind), k = w.dim * (1 + slots);
    const size_t per = dt_wire_rows_per_msg(w.dim, slots);
    if (n > per * DT_WIRE_MAX_CHUNKS)
        return dt_errorf(err, DT_EINVAL, "sparse client: %zu rows of table %d in one import (at most %zu)", n, t,
                         per * DT_WIRE_MAX_CHUNKS);
    if ((rc = reserve(s, n, n * (8 + 4 * k), err))) return rc;
    dt_row_split((uint32_t)t, ids, n, s->n_ps, s->ps_of, s->begin, s->order);
    size_t at = 0;
    for (int p = 0; p < s->n_ps; p++)
        add_import(s, &at, t, &w, p, ids, s->order + s->begin[p], s->begin[p + 1] - s->begin[p], rows, per);
    rc = dt_ps_client_sparse(s->cfg.client, s->n_msgs, s->msg_rows, on_import_ack, s, err);
    memset(s->n_msgs, 0, (size_t)s->n_ps * sizeof *s->n_msgs);
    return rc;
}
