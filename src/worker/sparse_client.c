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

/* A section of a message: table t's share of ids for the message's ps, positions [lo, lo + n) of
 * that table's order (its ids grouped by ps). */
typedef struct {
    int t;
    size_t lo, n;
} sec_plan;

/* A message: its sections plan[first .. first + count), and their ids and floats. */
typedef struct {
    size_t first, count, ids, floats;
} msg_plan;

/* A table in the call under way: its rows' dim, its ids (a pull: the block's slots; a push: its
 * gradient's rows), and where its positions start in the scratch (order, ps_of). */
typedef struct {
    int dim;
    const uint64_t *ids;
    const float *grad;        /* a push: [n, dim] */
    float *dst;               /* a pull: where the rows go, [n, dim] (the net's block, or a prefetch's) */
    size_t base;
} tab_view;

struct dt_sparse_client {
    dt_sparse_config cfg;
    dt_net *net;
    int n_ps, n_tables;
    int64_t step;             /* sync: the step of the rows pulled for training (the push is for it) */
    int64_t want;             /* sync: the step the next pull waits for */
    int64_t reply_step;       /* the oldest step of a training pull's replies (-1: none yet) */
    int training;             /* the pull under way is a training batch's */
    int probing;              /* dt_sparse_wait_declared's pulls: their rows go nowhere */
    int open;                 /* dt_sparse_pull_send's call is under way on the client */
    size_t cap;               /* ids the scratch below holds */
    uint64_t *ids;            /* [cap] the tables' ids (push: of their touched rows), table after table */
    int *ps_of;               /* [cap] */
    size_t *order;            /* [cap] each table's positions grouped by ps (dt_row_split) */
    size_t *begin;            /* [n_tables][n_ps + 1] where each ps's group starts in its table's order */
    tab_view *tab;            /* [n_tables] */
    sec_plan *plan;           /* [plan_cap] the call's sections, message after message */
    size_t plan_n, plan_cap;
    msg_plan *mp;             /* [n_ps * DT_WIRE_MAX_CHUNKS] the call's messages */
    uint8_t *buf;             /* payloads of one call */
    size_t buf_cap;
    int *n_msgs;              /* [n_ps] messages of the call to each ps */
    dt_sparse_msg *msgs;      /* [n_ps * DT_WIRE_MAX_CHUNKS] */
    dt_sparse_msg **msg_rows; /* [n_ps] rows of msgs */
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
    if (dt_net_num_tables(net) > (int)DT_WIRE_MAX_SPARSE_SECTIONS)
        return dt_errorf(err, DT_EINVAL, "sparse client: %d tables, more than a message's %u sections "
                         "(DT_WIRE_MAX_SPARSE_SECTIONS)", dt_net_num_tables(net), DT_WIRE_MAX_SPARSE_SECTIONS);
    for (int t = 0; t < dt_net_num_tables(net); t++) { /* a sync push of a step names a block's rows at most */
        dt_table_block b;
        if (!dt_net_table_block(net, t, &b) && b.cap > DT_WIRE_MAX_SPARSE_STEP_ROWS)
            return dt_errorf(err, DT_EINVAL, "%s: a batch may name %zu rows of it (the batch size x the embedding's "
                             "max_ids= x its fields), more than a ps takes of one table in a step (%u, "
                             "DT_WIRE_MAX_SPARSE_STEP_ROWS): lower max_ids= or the batch size",
                             dt_net_view(net, b.view)->name, b.cap, DT_WIRE_MAX_SPARSE_STEP_ROWS);
    }
    dt_sparse_client *s = dt_calloc(1, sizeof *s, "sparse client", err);
    if (!s) return DT_ENOMEM;
    s->cfg = *cfg;
    s->net = net;
    s->n_ps = dt_ps_client_n_ps(cfg->client);
    s->n_tables = dt_net_num_tables(net);
    s->reply_step = -1;
    size_t slots = (size_t)s->n_ps * DT_WIRE_MAX_CHUNKS, tables = s->n_tables > 0 ? (size_t)s->n_tables : 1;
    s->begin = dt_calloc(tables * ((size_t)s->n_ps + 1), sizeof *s->begin, "sparse client", err);
    s->tab = dt_calloc(tables, sizeof *s->tab, "sparse client", err);
    s->n_msgs = dt_calloc((size_t)s->n_ps, sizeof *s->n_msgs, "sparse client", err);
    s->msgs = dt_calloc(slots, sizeof *s->msgs, "sparse messages", err);
    s->msg_rows = dt_calloc((size_t)s->n_ps, sizeof *s->msg_rows, "sparse messages", err);
    s->mp = dt_calloc(slots, sizeof *s->mp, "sparse messages", err);
    if (!s->begin || !s->tab || !s->n_msgs || !s->msgs || !s->msg_rows || !s->mp) {
        dt_sparse_client_free(s);
        return DT_ENOMEM;
    }
    for (int p = 0; p < s->n_ps; p++) s->msg_rows[p] = s->msgs + (size_t)p * DT_WIRE_MAX_CHUNKS;
    if (!cfg->detached) dt_net_set_table_fill(net, fill_cb, s);
    *out = s;
    return DT_OK;
}

void dt_sparse_client_free(dt_sparse_client *s) {
    if (!s) return;
    if (s->open) dt_ps_client_sparse_end(s->cfg.client, DT_EINTR, NULL);
    if (!s->cfg.detached) dt_net_set_table_fill(s->net, NULL, NULL);
    free(s->ids), free(s->ps_of), free(s->order), free(s->begin), free(s->tab), free(s->plan), free(s->buf);
    free(s->n_msgs), free(s->msgs), free(s->msg_rows), free(s->mp);
    free(s);
}

void dt_sparse_reset(dt_sparse_client *s) { s->step = s->want = 0; }

const dt_sparse_stats *dt_sparse_get_stats(const dt_sparse_client *s) { return &s->stats; }

/* Room for n ids in the scratch arrays. */
static int reserve_ids(dt_sparse_client *s, size_t n, dt_error *err) {
    if (n <= s->cap) return DT_OK;
    free(s->ids), free(s->ps_of), free(s->order);
    s->ids = dt_calloc(n, sizeof *s->ids, "sparse ids", err);
    s->ps_of = dt_calloc(n, sizeof *s->ps_of, "sparse ids", err);
    s->order = dt_calloc(n, sizeof *s->order, "sparse ids", err);
    s->cap = 0;
    if (!s->ids || !s->ps_of || !s->order) return DT_ENOMEM;
    s->cap = n;
    return DT_OK;
}

/* Room for `bytes` of payloads. */
static int reserve_buf(dt_sparse_client *s, size_t bytes, dt_error *err) {
    if (bytes <= s->buf_cap) return DT_OK;
    free(s->buf);
    s->buf_cap = 0;
    if (!(s->buf = dt_malloc(bytes, "sparse payloads", err))) return DT_ENOMEM;
    s->buf_cap = bytes;
    return DT_OK;
}

/* Table t's ids [n] (from `base` on in the scratch) grouped by ps. */
static void split_table(dt_sparse_client *s, int t, int dim, const uint64_t *ids, size_t n, size_t base,
                        const float *grad, float *dst) {
    s->tab[t] = (tab_view){.dim = dim, .ids = ids, .grad = grad, .dst = dst, .base = base};
    dt_row_split((uint32_t)t, ids, n, s->n_ps, s->ps_of + base, s->begin + (size_t)t * ((size_t)s->n_ps + 1),
                 s->order + base);
}

static const size_t *begin_of(const dt_sparse_client *s, int t) {
    return s->begin + (size_t)t * ((size_t)s->n_ps + 1);
}

/* ---- a call: one message to each ps for every table (sections), more where a bound is reached ---- */

typedef struct {
    int push;                 /* SPARSE_PUSH (else SPARSE_PULL) */
    int64_t step;             /* pull: the oldest step wanted; push: the step it is for */
} round_t;

static int add_sec(dt_sparse_client *s, int t, size_t lo, size_t n, dt_error *err) {
    if (s->plan_n == s->plan_cap) {
        size_t cap = s->plan_cap ? 2 * s->plan_cap : 256;
        sec_plan *p = realloc(s->plan, cap * sizeof *p);
        if (!p) return dt_errorf(err, DT_ENOMEM, "out of memory for a sparse call's sections");
        s->plan = p, s->plan_cap = cap;
    }
    s->plan[s->plan_n++] = (sec_plan){t, lo, n};
    return DT_OK;
}

/* A new message to ps p (at most DT_WIRE_MAX_CHUNKS in one call). */
static msg_plan *open_msg(dt_sparse_client *s, int p, dt_error *err) {
    if (s->n_msgs[p] == (int)DT_WIRE_MAX_CHUNKS) {
        dt_errorf(err, DT_EINVAL, "sparse client: more than %u messages to ps %d in one step (each at most %u ids "
                  "and %u floats)", DT_WIRE_MAX_CHUNKS, p, DT_WIRE_MAX_SPARSE_IDS, DT_WIRE_MAX_SPARSE_FLOATS);
        return NULL;
    }
    msg_plan *m = &s->mp[(size_t)p * DT_WIRE_MAX_CHUNKS + (size_t)s->n_msgs[p]++];
    *m = (msg_plan){.first = s->plan_n};
    return m;
}

/* Whether m has no room for a section of dim with ids (any: at least one). */
static int msg_full(const msg_plan *m, int dim, int ids) {
    return m->count == DT_WIRE_MAX_SPARSE_SECTIONS ||
           (ids && (m->ids == DT_WIRE_MAX_SPARSE_IDS || DT_WIRE_MAX_SPARSE_FLOATS - m->floats < (size_t)dim));
}

/* A sync push names every table in each of its parts (the ps counts each table's parts): the
 * tables a part of several lacks are added to it without ids; the parts are copied to the plan's end. */
static int name_every_table(dt_sparse_client *s, int p, dt_error *err) {
    msg_plan *m = &s->mp[(size_t)p * DT_WIRE_MAX_CHUNKS];
    for (int k = 0; k < s->n_msgs[p]; k++) {
        uint8_t has[DT_WIRE_MAX_TABLES / 8] = {0};
        const size_t first = s->plan_n, from = m[k].first, count = m[k].count;
        for (size_t i = 0; i < count; i++) {
            sec_plan c = s->plan[from + i];
            has[c.t >> 3] |= (uint8_t)(1u << (c.t & 7));
            if (add_sec(s, c.t, c.lo, c.n, err)) return DT_ENOMEM;
        }
        for (int t = 0; t < s->n_tables; t++)
            if (!(has[t >> 3] & (1u << (t & 7))) && add_sec(s, t, begin_of(s, t)[p], 0, err)) return DT_ENOMEM;
        m[k].first = first, m[k].count = s->plan_n - first;
    }
    return DT_OK;
}

/* ps p's messages: each table's share in sections (a pull or an async push: the tables with ids
 * there; a sync push: every table), a table cut where a message reaches a bound. */
static int plan_ps(dt_sparse_client *s, const round_t *r, int p, dt_error *err) {
    const int every = r->push && s->cfg.sync;
    msg_plan *m = NULL;
    for (int t = 0; t < s->n_tables; t++) {
        const size_t lo = begin_of(s, t)[p], count = begin_of(s, t)[p + 1] - lo;
        const int dim = s->tab[t].dim;
        if (!count && !every) continue;
        size_t done = 0;
        do {
            if ((!m || msg_full(m, dim, count > done)) && !(m = open_msg(s, p, err))) return DT_EINVAL;
            const size_t room = DT_WIRE_MAX_SPARSE_IDS - m->ids;
            const size_t by_floats = (DT_WIRE_MAX_SPARSE_FLOATS - m->floats) / (size_t)dim;
            size_t n = count - done;
            if (n > room) n = room;
            if (n > by_floats) n = by_floats;
            if (add_sec(s, t, lo + done, n, err)) return DT_ENOMEM;
            m->count++, m->ids += n, m->floats += n * (size_t)dim, done += n;
        } while (done < count);
    }
    return every && s->n_msgs[p] > 1 ? name_every_table(s, p, err) : DT_OK;
}

/* Message k of ps p into the payload at pay: the section records, the ids, a push's rows. */
static size_t build_msg(dt_sparse_client *s, const round_t *r, int p, int k, uint8_t *pay) {
    const msg_plan *m = &s->mp[(size_t)p * DT_WIRE_MAX_CHUNKS + (size_t)k];
    const size_t esize = dt_enc_size(s->cfg.encoding);
    uint8_t *ids = pay + DT_WIRE_SECTION_BYTES * m->count, *rows = ids + 8 * m->ids;
    for (size_t i = 0; i < m->count; i++) {
        const sec_plan *c = &s->plan[m->first + i];
        const tab_view *v = &s->tab[c->t];
        const size_t *order = s->order + v->base + c->lo;
        dt_wire_section_encode(pay + DT_WIRE_SECTION_BYTES * i, (uint32_t)c->t, (uint32_t)v->dim, (uint32_t)c->n);
        for (size_t j = 0; j < c->n; j++, ids += 8) dt_put_u64(ids, v->ids[order[j]]);
        for (size_t j = 0; r->push && j < c->n; j++, rows += (size_t)v->dim * esize)
            s->stats.saturated += dt_pack(s->cfg.encoding, rows, v->grad + order[j] * (size_t)v->dim, (size_t)v->dim);
    }
    dt_sparse_msg *out = &s->msg_rows[p][k];
    out->h = dt_wire_header_make(r->push ? DT_MSG_SPARSE_PUSH : DT_MSG_SPARSE_PULL, 0, 0, 0);
    out->h.sections.count = m->count, out->h.sections.ids = m->ids, out->h.sections.floats = m->floats;
    out->h.encoding = (uint8_t)s->cfg.encoding; /* of the rows pushed, or of the rows wanted */
    if (r->push) {
        out->h.local_step = r->step;
        out->h.flags = s->cfg.sync ? DT_WIRE_F_SYNC : 0;
        out->h.chunk = (uint8_t)k, out->h.chunks = (uint8_t)s->n_msgs[p];
    } else {
        out->h.global_step = r->step;
    }
    out->payload = pay;
    out->bytes = DT_WIRE_SECTION_BYTES * m->count + 8 * m->ids + (r->push ? m->floats * esize : 0);
    s->stats.messages++, s->stats.sections += m->count;
    return out->bytes;
}

static int on_reply(void *user, int ps, int k, const dt_wire_header *h, const void *payload, size_t len,
                    dt_error *err);

/* The messages of n_msgs, each answered (ROWS to on_reply, or an ACK); n_msgs emptied. */
static int exchange(dt_sparse_client *s, dt_error *err) {
    int rc = dt_ps_client_sparse(s->cfg.client, s->n_msgs, s->msg_rows, on_reply, s, err);
    memset(s->n_msgs, 0, (size_t)s->n_ps * sizeof *s->n_msgs);
    return rc;
}

/* The call of the tables split so far (s->tab, begin, order): planned and built (n_msgs, msg_rows). */
static int build_round(dt_sparse_client *s, const round_t *r, dt_error *err) {
    s->plan_n = 0;
    memset(s->n_msgs, 0, (size_t)s->n_ps * sizeof *s->n_msgs);
    int rc = DT_OK;
    size_t bytes = 0;
    const size_t esize = dt_enc_size(s->cfg.encoding);
    for (int p = 0; p < s->n_ps && !rc; p++) {
        rc = plan_ps(s, r, p, err);
        for (int k = 0; !rc && k < s->n_msgs[p]; k++) {
            const msg_plan *m = &s->mp[(size_t)p * DT_WIRE_MAX_CHUNKS + (size_t)k];
            bytes += DT_WIRE_SECTION_BYTES * m->count + 8 * m->ids + (r->push ? m->floats * esize : 0);
        }
    }
    if (!rc) rc = reserve_buf(s, bytes ? bytes : 1, err);
    size_t at = 0;
    for (int p = 0; p < s->n_ps && !rc; p++)
        for (int k = 0; k < s->n_msgs[p]; k++) at += build_msg(s, r, p, k, s->buf + at);
    if (rc) memset(s->n_msgs, 0, (size_t)s->n_ps * sizeof *s->n_msgs);
    return rc;
}

/* ... and exchanged. */
static int send_round(dt_sparse_client *s, const round_t *r, dt_error *err) {
    int rc = build_round(s, r, err);
    return rc ? rc : exchange(s, err);
}

/* A section's rows of a SPARSE_ROWS reply into their slots of the block, each finite. */
static int take_rows(dt_sparse_client *s, int ps, const sec_plan *c, const uint8_t *src, int64_t step,
                     dt_error *err) {
    const tab_view *v = &s->tab[c->t];
    const size_t dim = (size_t)v->dim, esize = dt_enc_size(s->cfg.encoding);
    const size_t *slots = s->order + v->base + c->lo;
    for (size_t i = 0; i < c->n; i++) {
        float *row = v->dst + slots[i] * dim;
        dt_unpack(s->cfg.encoding, row, src + i * dim * esize, dim);
        if (dt_first_nonfinite(row, dim) < dim) {
            dt_table_grad g;
            dt_net_table_grad(s->net, c->t, &g);
            return dt_errorf(err, DT_EFORMAT, "ps %d: served a non-finite value in row %llu of table %d (%s) at step "
                             "%lld: training diverged (lower --learning_rate) or the ps is damaged", ps,
                             (unsigned long long)v->ids[slots[i]], c->t, dt_net_view(s->net, g.view)->name,
                             (long long)step);
        }
    }
    return DT_OK;
}

/* A SPARSE_ROWS reply: the rows of its message's sections, as asked (sections, ids, floats, encoding),
 * in order; an ACK: its push taken or, sync, stale. */
static int on_reply(void *user, int ps, int k, const dt_wire_header *h, const void *payload, size_t len,
                    dt_error *err) {
    dt_sparse_client *s = user;
    if (h->type == DT_MSG_ACK) {
        s->stats.stale += h->status == DT_WIRE_STALE;
        return DT_OK;
    }
    if (s->probing) return DT_OK;
    const msg_plan *m = &s->mp[(size_t)ps * DT_WIRE_MAX_CHUNKS + (size_t)k];
    const size_t esize = dt_enc_size(s->cfg.encoding);
    if (h->sections.count != m->count || h->sections.ids != m->ids || h->sections.floats != m->floats ||
        h->encoding != s->cfg.encoding || len != m->floats * esize)
        return dt_errorf(err, DT_EPROTO, "ps %d: SPARSE_ROWS of %llu sections, %llu ids, %llu floats in %s, answering "
                         "a pull of %zu sections, %zu ids, %zu floats in %s", ps, (unsigned long long)h->sections.count,
                         (unsigned long long)h->sections.ids, (unsigned long long)h->sections.floats,
                         dt_enc_name(h->encoding), m->count, m->ids, m->floats, dt_enc_name(s->cfg.encoding));
    const uint8_t *src = payload;
    for (size_t i = 0; i < m->count; i++) {
        const sec_plan *c = &s->plan[m->first + i];
        int rc = take_rows(s, ps, c, src, h->global_step, err);
        if (rc) return rc;
        src += c->n * (size_t)s->tab[c->t].dim * esize;
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
    int rc = reserve_ids(s, total ? total : 1, err);
    if (rc) return rc;
    size_t base = 0;
    for (int t = 0; t < s->n_tables; t++) {
        dt_net_table_block(s->net, t, &b);
        split_table(s, t, b.dim, b.ids, b.n, base, NULL, b.rows);
        base += b.n;
        s->stats.rows_pulled += b.n;
    }
    round_t r = {.push = 0, .step = s->cfg.sync ? s->want : 0};
    s->training = training;
    s->reply_step = -1;
    if ((rc = send_round(s, &r, err))) return rc;
    s->stats.pulls++;
    /* the step the push of this batch is for: the rows' (sync mode: every table at one step) */
    if (training) s->step = s->reply_step >= 0 && s->reply_step > s->want ? s->reply_step : s->want;
    return DT_OK;
}

int dt_sparse_pull_send(dt_sparse_client *s, const dt_sparse_rows *tabs, int64_t step, dt_error *err) {
    if (s->open) return dt_errorf(err, DT_EINVAL, "sparse client: a pull is under way already");
    size_t total = 0, base = 0;
    for (int t = 0; t < s->n_tables; t++) total += tabs[t].n;
    int rc = reserve_ids(s, total ? total : 1, err);
    if (rc) return rc;
    for (int t = 0; t < s->n_tables; t++) {
        dt_table_grad g;
        dt_net_table_grad(s->net, t, &g); /* its dim */
        split_table(s, t, g.dim, tabs[t].ids, tabs[t].n, base, NULL, tabs[t].rows);
        base += tabs[t].n;
        s->stats.rows_pulled += tabs[t].n;
    }
    round_t r = {.push = 0, .step = step};
    s->training = 1;
    s->reply_step = -1;
    int sent = 0;
    if (!(rc = build_round(s, &r, err)))
        rc = dt_ps_client_sparse_send(s->cfg.client, s->n_msgs, s->msg_rows, on_reply, s, &sent, err);
    memset(s->n_msgs, 0, (size_t)s->n_ps * sizeof *s->n_msgs);
    if (rc && sent) dt_ps_client_sparse_end(s->cfg.client, rc, err);
    s->open = sent && !rc;
    if (!rc) s->stats.pulls++;
    return rc;
}

int dt_sparse_pull_end(dt_sparse_client *s, int abandon, int64_t *reply_step, dt_error *err) {
    int rc = DT_OK;
    if (s->open) rc = dt_ps_client_sparse_end(s->cfg.client, abandon ? DT_EINTR : DT_OK, err);
    s->open = 0;
    *reply_step = s->reply_step;
    return rc;
}

void dt_sparse_prefetched(dt_sparse_client *s, int64_t reply_step) {
    s->step = reply_step >= 0 && reply_step > s->want ? reply_step : s->want;
}

int64_t dt_sparse_next_want(const dt_sparse_client *s) { return s->cfg.sync ? s->step + 1 : 0; }

int dt_sparse_push(dt_sparse_client *s, dt_error *err) {
    size_t total = 0;
    dt_table_grad g;
    for (int t = 0; t < s->n_tables; t++) {
        if (dt_net_table_grad(s->net, t, &g)) return dt_errorf(err, DT_EINVAL, "sparse client: no table %d", t);
        total += g.n;
    }
    int rc = reserve_ids(s, total ? total : 1, err);
    if (rc) return rc;
    size_t base = 0;
    for (int t = 0; t < s->n_tables; t++) {
        dt_table_block b;
        dt_net_table_grad(s->net, t, &g);
        dt_net_table_block(s->net, t, &b);
        /* the gradient's rows are slots of the block: their ids, in the gradient's order */
        for (size_t i = 0; i < g.n; i++) s->ids[base + i] = b.ids[g.rows[i]];
        split_table(s, t, g.dim, s->ids + base, g.n, base, g.grad, NULL);
        base += g.n;
        s->stats.rows_pushed += g.n;
    }
    round_t r = {.push = 1, .step = s->step};
    if ((rc = send_round(s, &r, err))) return rc;
    s->stats.pushes++;
    s->want = s->step + 1;
    return DT_OK;
}

/* ---- SPARSE_INIT ---- */

/* Table t's record: its layer's dim, rows (the capacity: every bucket can have one; unbounded ids: the
 * layer's capacity=, min_count= and evict_after=) and initialiser. */
int dt_sparse_table_record(const dt_sparse_client *s, int t, dt_wire_table *w, dt_error *err) {
    return dt_table_record_of(dt_net_spec(s->net), t, &s->cfg.opt, s->cfg.seed, w, err);
}

int dt_table_record_of(const dt_model_spec *spec, int t, const dt_lazy_config *opt, uint64_t seed, dt_wire_table *w,
                       dt_error *err) {
    for (int i = 0, seen = 0; i < spec->n_layers; i++) {
        const dt_layer_spec *L = &spec->layers[i];
        if (L->kind != DT_LAYER_EMBEDDING) continue;
        int n = L->shared ? 1 : L->n_fields;
        if (t >= seen + n) {
            seen += n;
            continue;
        }
        *w = (dt_wire_table){.table = (uint32_t)t, .dim = (uint32_t)L->dim, .opt = *opt, .seed = seed};
        w->capacity = (uint64_t)L->buckets < (UINT64_C(1) << 31) ? (uint64_t)L->buckets : UINT64_C(1) << 31;
        /* ids below the capacity, spread over the ps tasks: each ps bounds its share (docs/sparse.md) */
        if (L->buckets && (uint64_t)L->buckets <= w->capacity) w->flags = DT_WIRE_TABLE_F_BUCKETS;
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
    return dt_errorf(err, DT_EINVAL, "no table %d in the model", t);
}

int dt_sparse_declare(dt_sparse_client *s, int64_t step, int importing, dt_error *err) {
    if (s->n_tables < 1 || s->n_tables > (int)DT_WIRE_MAX_TABLES)
        return dt_errorf(err, DT_EINVAL, "sparse client: %d tables (1..%u)", s->n_tables, DT_WIRE_MAX_TABLES);
    size_t bytes = (size_t)s->n_tables * DT_WIRE_TABLE_BYTES;
    int rc = reserve_buf(s, bytes, err);
    for (int t = 0; t < s->n_tables && !rc; t++) {
        dt_wire_table w;
        if (!(rc = dt_sparse_table_record(s, t, &w, err)))
            dt_wire_table_encode(s->buf + (size_t)t * DT_WIRE_TABLE_BYTES, &w);
    }
    if (rc) return rc;
    for (int p = 0; p < s->n_ps; p++) {
        dt_sparse_msg *m = &s->msg_rows[p][0];
        m->h = dt_wire_header_make(DT_MSG_SPARSE_INIT, 0, 0, 0);
        m->h.flags = importing ? DT_WIRE_F_IMPORT : 0;
        m->h.sparse.ids = (uint64_t)s->n_tables;
        m->h.global_step = step;
        m->payload = s->buf, m->bytes = bytes;
        s->n_msgs[p] = 1;
    }
    if ((rc = exchange(s, err))) return rc;
    s->step = s->want = step;
    return DT_OK;
}

/* One pull of one row of the last table from every ps: answered once the chief's SPARSE_INIT (all
 * tables at once) is in. */
static int probe(dt_sparse_client *s, dt_error *err) {
    const uint32_t last = (uint32_t)(s->n_tables - 1);
    dt_table_grad g;
    dt_net_table_grad(s->net, (int)last, &g);
    const size_t bytes = DT_WIRE_SECTION_BYTES + 8;
    int rc = reserve_buf(s, bytes * (size_t)s->n_ps, err);
    for (int p = 0; p < s->n_ps && !rc; p++) {
        uint64_t id = 0; /* an id of p's: expected n_ps tries (ids spread evenly) */
        while (dt_row_ps(last, id, s->n_ps) != p) id++;
        uint8_t *pay = s->buf + bytes * (size_t)p;
        dt_wire_section_encode(pay, last, (uint32_t)g.dim, 1);
        dt_put_u64(pay + DT_WIRE_SECTION_BYTES, id);
        dt_sparse_msg *m = &s->msg_rows[p][0];
        m->h = dt_wire_header_make(DT_MSG_SPARSE_PULL, 0, 0, 0);
        m->h.sections.count = 1, m->h.sections.ids = 1, m->h.sections.floats = (uint64_t)g.dim;
        m->payload = pay, m->bytes = bytes;
        s->n_msgs[p] = 1;
    }
    if (rc) return rc;
    s->probing = 1;
    rc = exchange(s, err);
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
    if ((rc = reserve_ids(s, n, err)) || (rc = reserve_buf(s, n * (8 + 4 * k), err))) return rc;
    dt_row_split((uint32_t)t, ids, n, s->n_ps, s->ps_of, s->begin, s->order);
    size_t at = 0;
    for (int p = 0; p < s->n_ps; p++)
        add_import(s, &at, t, &w, p, ids, s->order + s->begin[p], s->begin[p + 1] - s->begin[p], rows, per);
    rc = dt_ps_client_sparse(s->cfg.client, s->n_msgs, s->msg_rows, on_import_ack, s, err);
    memset(s->n_msgs, 0, (size_t)s->n_ps * sizeof *s->n_msgs);
    return rc;
}

int dt_sparse_import_end(dt_sparse_client *s, dt_error *err) {
    dt_wire_table w;
    int rc = dt_sparse_table_record(s, 0, &w, err); /* names table 0, with no row */
    if (rc) return rc;
    for (int p = 0; p < s->n_ps; p++) {
        dt_sparse_msg *m = &s->msg_rows[p][0];
        m->h = dt_wire_header_make(DT_MSG_SPARSE_IMPORT, 0, 0, 0);
        m->h.flags = DT_WIRE_F_LAST;
        m->h.sparse.table = 0, m->h.sparse.ids = 0, m->h.sparse.dim = w.dim;
        m->h.opt_kind = (uint8_t)w.opt.kind, m->h.opt_slots = (uint8_t)dt_lazy_slots(w.opt.kind);
        m->payload = NULL, m->bytes = 0;
        s->n_msgs[p] = 1;
    }
    rc = dt_ps_client_sparse(s->cfg.client, s->n_msgs, s->msg_rows, on_import_ack, s, err);
    memset(s->n_msgs, 0, (size_t)s->n_ps * sizeof *s->n_msgs);
    return rc;
}
