/* Sparse tables on the shard (docs/sparse.md): SPARSE_INIT declares them, SPARSE_PULL reads rows
 * (held until the table reaches the step asked for, as a PULL at the sync barrier), SPARSE_PUSH
 * updates them: applied at once when asynchronous, summed over the step's replicas in sync mode
 * (shard_sparse_sync.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/row_placement.h"
#include "core/error.h"
#include "ps/shard_impl.h"
#include "transport/compress.h"

static void release_free(void *p) { free(p); }

/* An id of a payload: u64 little-endian, maybe misaligned. */
static uint64_t id_at(const uint8_t *p, size_t i) {
    uint64_t v = 0;
    for (int b = 7; b >= 0; b--) v = v << 8 | p[8 * i + (size_t)b];
    return v;
}

/* The table `what` names (a section of a SPARSE_PULL or SPARSE_PUSH, or a SPARSE_EXPORT or
 * SPARSE_IMPORT), with the dim it says; else refused (NULL). */
shard_table *shard_table_named(const shard_req *r, uint64_t table, uint64_t dim, const char *what) {
    shard_table *st = r->s->tables && table < DT_WIRE_MAX_TABLES ? r->s->tables[table] : NULL;
    if (!st) {
        shard_refuse(r, DT_WIRE_E_BAD_VALUE, "%s for table %llu, which this ps does not hold (the chief's SPARSE_INIT "
                     "declared %d table(s))", what, (unsigned long long)table, r->s->n_tables);
        return NULL;
    }
    const int table_dim = dt_table_config_of(st->t)->dim;
    if (dim != (uint64_t)table_dim) {
        shard_refuse(r, DT_WIRE_E_BAD_VALUE, "%s for table %llu with rows of dim %llu, the table's dim is %d", what,
                     (unsigned long long)table, (unsigned long long)dim, table_dim);
        return NULL;
    }
    return st;
}

shard_table *shard_table_of(const shard_req *r) {
    return shard_table_named(r, r->h->sparse.table, r->h->sparse.dim, dt_wire_type_name(r->h->type));
}

/* Every id of ids [n] of table is one whose home is this ps (docs/sparse.md, "Placement"): a client
 * that spreads rows otherwise (another ps count, another hash) would make two ps tasks hold one row
 * apart; and, in a table of buckets, below its capacity (the share of rows this ps bounded at
 * SPARSE_INIT). 1 if so, else refused naming the first id that is not. */
int shard_ids_owned(const shard_req *r, uint64_t table, const uint8_t *ids, size_t n, const char *what) {
    const ps_shard *s = r->s;
    const uint64_t buckets = s->tables[table]->buckets ? dt_table_config_of(s->tables[table]->t)->capacity : 0;
    if (s->cfg.n_ps <= 1 && !buckets) return 1;
    for (size_t i = 0; i < n; i++) {
        uint64_t id = id_at(ids, i);
        if (buckets && id >= buckets) {
            shard_refuse(r, DT_WIRE_E_BAD_VALUE, "%s: id %llu of table %llu (id %zu of %zu) is beyond the table's "
                         "%llu buckets", what, (unsigned long long)id, (unsigned long long)table, i, n,
                         (unsigned long long)buckets);
            return 0;
        }
        int home = s->cfg.n_ps > 1 ? dt_row_ps((uint32_t)table, id, s->cfg.n_ps) : s->cfg.ps_index;
        if (home == s->cfg.ps_index) continue;
        shard_refuse(r, DT_WIRE_E_BAD_VALUE, "%s: id %llu of table %llu (id %zu of %zu) belongs to ps %d of %d "
                     "(dt_row_ps), not to this ps %d", what, (unsigned long long)id, (unsigned long long)table, i, n,
                     home, s->cfg.n_ps, s->cfg.ps_index);
        return 0;
    }
    return 1;
}

/* The section records of a SPARSE_PULL or SPARSE_PUSH (payload: its own, or a deferred pull's
 * copy) into s->sec: their count, or -1 (refused: a record out of its bounds, ERROR 101 naming the
 * section, its table and the bound). */
static int sections_decode(const shard_req *r, const uint8_t *payload, size_t len) {
    ps_shard *s = r->s;
    if (!s->sec && !(s->sec = dt_calloc(DT_WIRE_MAX_SPARSE_SECTIONS, sizeof *s->sec, "ps sections", NULL))) {
        shard_refuse(r, DT_WIRE_E_NOMEM, "out of memory for a message's sections");
        return -1;
    }
    dt_error e = {0};
    if (dt_wire_sections_decode(s->sec, r->h, payload, len, &e)) {
        shard_refuse(r, DT_WIRE_E_MALFORMED, "%s", e.msg);
        return -1;
    }
    return (int)r->h->sections.count;
}

/* The sections (as sections_decode), each also a table this ps holds, with its dim, and ids this ps
 * owns (else ERROR 107 naming the section and its table): their count, or -1. */
int shard_sections(const shard_req *r, const uint8_t *payload, size_t len) {
    const int n = sections_decode(r, payload, len);
    const uint8_t *ids = payload + dt_wire_sections_ids_at(r->h);
    for (int k = 0; k < n; k++) {
        const dt_wire_section *c = &r->s->sec[k];
        char what[64];
        snprintf(what, sizeof what, "%s section %d", dt_wire_type_name(r->h->type), k);
        if (!shard_table_named(r, c->table, c->dim, what) ||
            !shard_ids_owned(r, c->table, ids + 8 * c->first, c->ids, what))
            return -1;
    }
    return n;
}

/* ---- SPARSE_INIT ------------------------------------------------------------------------------ */

void shard_table_free(shard_table *t, int staleness, int aggregate) {
    if (!t) return;
    for (int i = 0; t->acc && i <= staleness; i++) {
        /* NULL: its allocation failed (shard_table_accumulators stops there; the rest are NULL too) */
        for (int k = 0; t->acc[i].e && k < aggregate; k++) dt_rowsum_free(&t->acc[i].e[k].rows);
        free(t->acc[i].e);
    }
    free(t->acc);
    dt_table_free(t->t);
    free(t);
}

static void tables_free(shard_table **tables, int staleness, int aggregate) {
    for (int i = 0; tables && i < (int)DT_WIRE_MAX_TABLES; i++) shard_table_free(tables[i], staleness, aggregate);
    free(tables);
}

/* One record of SPARSE_INIT's payload as a table: 0, or a refusal's text in msg. */
static int table_from_record(const ps_shard *s, const uint8_t *rec, shard_table **out, char *msg, size_t len) {
    dt_wire_table w;
    dt_error e = {0};
    *out = NULL;
    if (dt_wire_table_decode(&w, rec, DT_WIRE_TABLE_BYTES, &e)) return snprintf(msg, len, "%.250s", e.msg), 1;
    dt_table_config c;
    dt_table_config_from_wire(&c, &w);
    shard_table *t = dt_calloc(1, sizeof *t, "ps table", NULL);
    if (!t || dt_table_new(&t->t, &c, &e) ||
        (s->aggregate && shard_table_accumulators(t, s->aggregate, s->staleness))) {
        if (t && t->t) snprintf(msg, len, "table %u: out of memory for its accumulators", w.table);
        else snprintf(msg, len, "%.250s", t ? e.msg : "out of memory for a table");
        shard_table_free(t, s->staleness, s->aggregate);
        return 1;
    }
    t->row_mean = (w.flags & DT_WIRE_TABLE_F_ROW_MEAN) != 0;
    t->buckets = (w.flags & DT_WIRE_TABLE_F_BUCKETS) != 0;
    *out = t;
    return 0;
}

/* The rows a table may come to hold here: its capacity; a table of buckets, this ps's share of them
 * (ids spread evenly by dt_row_ps: capacity / ps tasks, plus 4 binomial standard deviations, which
 * tests/test_row_placement.c measured none to pass). */
static uint64_t rows_here(const ps_shard *s, const dt_wire_table *w) {
    if (!(w->flags & DT_WIRE_TABLE_F_BUCKETS) || s->cfg.n_ps <= 1) return w->capacity;
    const double mean = (double)w->capacity / s->cfg.n_ps, most = mean + 4.0 * sqrt(mean) + 1.0;
    return most < (double)w->capacity ? (uint64_t)most : w->capacity;
}

/* Whether the tables of SPARSE_INIT's payload fit in the ps's table memory at their capacities, with
 * their sync accumulators and beside INIT's (s->sync_bytes), before any is built: 0, or the
 * refusal's text naming the bound and the figures (a record out of range is table_from_record's to
 * refuse). */
static int tables_fit(const shard_req *r, uint64_t *bytes_out, char *msg, size_t len) {
    const ps_shard *s = r->s;
    const uint64_t acc = shard_table_acc_bytes(s->aggregate, s->staleness) * r->h->sparse.ids;
    uint64_t total = acc, most = 0, most_rows = 0;
    dt_wire_table big = {0};
    for (uint64_t k = 0; k < r->h->sparse.ids; k++) {
        dt_wire_table w;
        dt_table_config c;
        if (dt_wire_table_decode(&w, (const uint8_t *)r->payload->data + k * DT_WIRE_TABLE_BYTES, DT_WIRE_TABLE_BYTES,
                                 NULL))
            return 0;
        dt_table_config_from_wire(&c, &w);
        const uint64_t rows = rows_here(s, &w), bytes = dt_table_bytes_at(&c, rows);
        total += bytes;
        if (bytes > most) most = bytes, most_rows = rows, big = w;
    }
    *bytes_out = total;
    if (!s->cfg.table_memory || total + s->sync_bytes <= s->cfg.table_memory) return 0;
    const double mib = 1024.0 * 1024.0;
    int at = snprintf(msg, len, "the %llu table(s) would hold up to %.1f MiB on this ps (ps %d of %d) at their "
                      "capacities, over its table memory of %.1f MiB (--ps_table_memory)",
                      (unsigned long long)r->h->sparse.ids, (double)(total + s->sync_bytes) / mib, s->cfg.ps_index,
                      s->cfg.n_ps > 1 ? s->cfg.n_ps : 1, (double)s->cfg.table_memory / mib);
    if (s->aggregate && at > 0 && (size_t)at < len)
        at += snprintf(msg + at, len - (size_t)at, ", %.1f MiB of it sync accumulators (%d replicas to aggregate, "
                       "staleness %d: %.1f MiB for each table, %.1f MiB for INIT's chunks and workers)",
                       (double)(acc + s->sync_bytes) / mib, s->aggregate, s->staleness,
                       (double)shard_table_acc_bytes(s->aggregate, s->staleness) / mib, (double)s->sync_bytes / mib);
    if (at > 0 && (size_t)at < len)
        snprintf(msg + at, len - (size_t)at, "; the largest, table %u: %llu rows of dim %u, %.1f MiB: use more ps "
                 "tasks, smaller capacities or more memory", big.table, (unsigned long long)most_rows, big.dim,
                 (double)most / mib);
    return 1;
}

/* Every table of SPARSE_INIT's payload, built whole before anything changes: 0, or the refusal's
 * text (and *tables NULL). */
static int tables_build(const shard_req *r, shard_table ***tables, char *msg, size_t len) {
    ps_shard *s = r->s;
    const uint8_t *p = r->payload->data;
    uint64_t most = 0;
    if (tables_fit(r, &most, msg, len)) return *tables = NULL, 1;
    shard_table **t = dt_calloc(DT_WIRE_MAX_TABLES, sizeof *t, "ps tables", NULL);
    int rc = t ? 0 : (snprintf(msg, len, "out of memory for the tables"), 1);
    for (uint64_t k = 0; !rc && k < r->h->sparse.ids; k++) {
        shard_table *one;
        if ((rc = table_from_record(s, p + k * DT_WIRE_TABLE_BYTES, &one, msg, len))) break;
        uint32_t id = dt_table_config_of(one->t)->table;
        if (t[id]) {
            snprintf(msg, len, "SPARSE_INIT declares table %u twice", id);
            shard_table_free(one, s->staleness, s->aggregate);
            rc = 1;
            break;
        }
        t[id] = one;
    }
    if (!rc && !s->rows && !(s->rows = dt_alloc_floats(DT_WIRE_MAX_SPARSE_FLOATS, "ps sparse rows", NULL)))
        rc = (snprintf(msg, len, "out of memory for the rows of a message"), 1);
    if (!rc && s->aggregate && !s->sparse_stale &&
        !(s->sparse_stale = dt_calloc((size_t)s->total, sizeof *s->sparse_stale, "ps stale counts", NULL)))
        rc = (snprintf(msg, len, "out of memory for the stale counts"), 1);
    if (rc) tables_free(t, s->staleness, s->aggregate), t = NULL;
    else s->tables_most = most;
    *tables = t;
    return rc;
}

/* Drops every table, every held sync push and every deferred SPARSE_PULL (answered RESYNC): an
 * INIT, a new SPARSE_INIT, or the shard's end. */
void shard_sparse_drop(ps_shard *s, const ps_io *io) {
    if (s->n_sp) shard_sparse_fail(s, io, DT_WIRE_E_RESYNC, "the chief declared the tables again: pull again");
    tables_free(s->tables, s->staleness, s->aggregate);
    s->tables = NULL;
    s->n_tables = 0;
    s->sparse_held = 0;
    s->importing = 0;
}

static int keep_silently(ps_shard *s, const ps_io *io, sparse_pending *q, void *user) { return 0; }
static void sparse_filter(ps_shard *s, const ps_io *io, int (*keep)(ps_shard *, const ps_io *, sparse_pending *, void *),
                          void *user);

void shard_sparse_free(ps_shard *s, const ps_io *io) {
    if (s->n_sp) sparse_filter(s, io, keep_silently, NULL);
    tables_free(s->tables, s->staleness, s->aggregate);
    free(s->sp), free(s->rows), free(s->sec), free(s->sparse_stale);
    dt_rowsum_free(&s->rsum);
}

/* The chief's tables (the dispatch table checked its role, INIT and the payload's size). */
void shard_on_sparse_init(const shard_req *r) {
    ps_shard *s = r->s;
    char msg[640];
    shard_table **tables;
    if (tables_build(r, &tables, msg, sizeof msg)) {
        shard_refuse(r, strstr(msg, "out of memory") ? DT_WIRE_E_NOMEM : DT_WIRE_E_BAD_VALUE, "%s", msg);
        return;
    }
    shard_sparse_drop(s, r->io);
    s->tables = tables;
    s->n_tables = (int)r->h->sparse.ids;
    s->importing = (r->h->flags & DT_WIRE_F_IMPORT) != 0;
    const dt_lazy_config *opt = NULL; /* the first table's, for the log: a run gives all the same */
    for (int i = 0; i < (int)DT_WIRE_MAX_TABLES; i++)
        if (tables[i]) {
            dt_table_set_step(tables[i]->t, r->h->global_step);
            if (!opt) opt = &dt_table_config_of(tables[i]->t)->opt;
        }
    shard_log(s, "%d sparse table(s) declared by the chief (worker %u) at step %lld (%s, learning rate %g); up to "
              "%.1f MiB here at their capacities, of %.1f MiB (--ps_table_memory)%s", s->n_tables, r->h->task,
              (long long)r->h->global_step, opt ? dt_lazy_name(opt->kind) : "-", opt ? (double)opt->learning_rate : 0.0,
              (double)s->tables_most / 1048576.0, (double)s->cfg.table_memory / 1048576.0,
              s->importing ? "; their rows follow from a checkpoint: pulls wait for them" : "");
    dt_wire_header a = shard_reply_to(s, DT_MSG_ACK, r->h);
    shard_send(r, &a);
}

void shard_sparse_stats(const ps_shard *s, ps_shard_stats *o) {
    o->sparse.tables = s->n_tables;
    o->sparse.pulls = s->sparse_pulls, o->sparse.pushes = s->sparse_pushes, o->sparse.updates = s->sparse_updates;
    o->sparse.stale = s->n_sparse_stale;
    for (int i = 0; s->n_tables && i < (int)DT_WIRE_MAX_TABLES; i++) {
        if (!s->tables[i]) continue;
        dt_table_stats t;
        dt_table_get_stats(s->tables[i]->t, &t);
        o->sparse.rows += t.rows, o->sparse.admitted += t.admitted, o->sparse.expired += t.expired;
        o->sparse.evicted += t.evicted, o->sparse.hits += t.hits, o->sparse.misses += t.misses;
        o->sparse.not_admitted += t.not_admitted;
        o->sparse.bytes += dt_table_bytes(s->tables[i]->t) + shard_table_acc_bytes(s->aggregate, s->staleness) +
                           shard_table_sums_bytes(s->tables[i], s->staleness, s->aggregate);
    }
}

int ps_shard_table_stats(const ps_shard *s, int t, dt_table_stats *out) {
    memset(out, 0, sizeof *out);
    if (!s->tables || t < 0 || t >= (int)DT_WIRE_MAX_TABLES || !s->tables[t]) return 0;
    dt_table_get_stats(s->tables[t]->t, out);
    return 1;
}

/* ---- SPARSE_PULL ------------------------------------------------------------------------------ */

/* The least step of the tables of sections [n] (s->sec, checked), and which table has it. */
static int64_t sections_step(const ps_shard *s, int n, uint32_t *table) {
    int64_t least = INT64_MAX;
    for (int k = 0; k < n; k++) {
        const int64_t step = dt_table_step(s->tables[s->sec[k].table]->t);
        if (step < least) least = step, *table = s->sec[k].table;
    }
    return least;
}

/* A section's rows (stored, or initial for ids without one) packed into out in the encoding asked
 * for; else refused (a value beyond fp16's range). */
static int pack_section(const shard_req *r, const dt_wire_section *c, const uint8_t *ids, uint8_t *out) {
    ps_shard *s = r->s;
    dt_table *t = s->tables[c->table]->t;
    uint64_t batch[256]; /* the section's ids decoded, a batch at a time, for dt_table_read_n */
    for (size_t i = 0; i < c->ids; i += 256) {
        const size_t n = c->ids - i < 256 ? c->ids - i : 256;
        for (size_t j = 0; j < n; j++) batch[j] = id_at(ids, c->first + i + j);
        dt_table_read_n(t, batch, n, s->rows + c->at + i * c->dim);
    }
    if (!dt_pack(r->h->encoding, out + c->at * dt_enc_size(r->h->encoding), s->rows + c->at, (size_t)c->ids * c->dim))
        return DT_OK;
    shard_refuse(r, DT_WIRE_E_BAD_VALUE, "SPARSE_PULL section %zu: table %u holds a value beyond fp16's range "
                 "(+-65504): pull in bf16 or float32", (size_t)(c - s->sec), c->table);
    return DT_EINVAL;
}

/* Answers a SPARSE_PULL of n sections (s->sec, checked) with one SPARSE_ROWS: every section's rows in
 * order, at the least step of its tables. */
static void send_rows(const shard_req *r, int n, const uint8_t *payload) {
    ps_shard *s = r->s;
    const dt_wire_header *h = r->h;
    const size_t bytes = h->sections.floats * dt_enc_size(h->encoding);
    const uint8_t *ids = payload + dt_wire_sections_ids_at(h);
    char why[320];
    if (shard_admit(r, bytes, why, sizeof why)) {
        shard_refuse(r, DT_WIRE_E_BUSY, "%s", why);
        return;
    }
    uint8_t *out = malloc(bytes ? bytes : 1);
    int rc = out ? DT_OK : DT_ENOMEM;
    for (int k = 0; !rc && k < n; k++) rc = pack_section(r, &s->sec[k], ids, out);
    if (rc) {
        r->io->unadmit(r->io->user, r->from, bytes);
        if (!out) shard_refuse(r, DT_WIRE_E_NOMEM, "out of memory for a SPARSE_ROWS reply");
        free(out);
        return;
    }
    dt_wire_header a = shard_reply_to(s, DT_MSG_SPARSE_ROWS, h);
    a.sections = h->sections;
    a.encoding = h->encoding;
    uint32_t table;
    a.global_step = sections_step(s, n, &table);
    s->sparse_pulls++;
    dt_bytes b = {.data = out, .size = bytes, .release = release_free, .hint = out};
    r->io->send(r->io->user, r->from, &a, &b, bytes);
}

/* Whether the deferred-pull list has room for r's (its connection's share, the total, the bytes). */
static int sparse_pending_room(const shard_req *r) {
    ps_shard *s = r->s;
    int mine = 0;
    size_t bytes = r->payload->size;
    for (int i = 0; i < s->n_sp; i++) {
        mine += r->from->conn && s->sp[i].from.conn == r->from->conn;
        bytes += s->sp[i].ids.size;
    }
    if (mine >= SHARD_SPARSE_PENDING_PER_PEER || s->n_sp >= SHARD_SPARSE_PENDING ||
        bytes > (size_t)SHARD_SPARSE_PENDING * 8 * 1024) {
        shard_refuse(r, DT_WIRE_E_BUSY, "too many SPARSE_PULLs waiting for a later step (%d of this connection, %d "
                     "in all, %zu bytes of ids; at most %d, %d, %d)", mine, s->n_sp, bytes,
                     SHARD_SPARSE_PENDING_PER_PEER, SHARD_SPARSE_PENDING, SHARD_SPARSE_PENDING * 8 * 1024);
        return 0;
    }
    if (!s->sp && !(s->sp = dt_calloc(SHARD_SPARSE_PENDING, sizeof *s->sp, "ps sparse pulls", NULL))) {
        shard_refuse(r, DT_WIRE_E_NOMEM, "out of memory for a deferred SPARSE_PULL");
        return 0;
    }
    return 1;
}

/* Holds a SPARSE_PULL of n sections until every table it names reaches the step it asks for (a copy
 * of its payload kept). */
static void sparse_defer(const shard_req *r, int n) {
    ps_shard *s = r->s;
    uint32_t table = 0;
    const int64_t step = sections_step(s, n, &table);
    const int64_t horizon = step + (s->aggregate ? s->staleness + 2 : SHARD_ASYNC_AHEAD);
    if (r->h->global_step > horizon) {
        shard_refuse(r, DT_WIRE_E_BAD_VALUE, "SPARSE_PULL waits for step %lld, but table %u is at step %lld and "
                     "pulls wait for at most step %lld", (long long)r->h->global_step, table, (long long)step,
                     (long long)horizon);
        return;
    }
    if (!sparse_pending_room(r)) return;
    sparse_pending *q = &s->sp[s->n_sp];
    void *ids = malloc(r->payload->size);
    if (!ids || r->io->hold(r->io->user, r->from, &q->from)) {
        free(ids);
        shard_refuse(r, DT_WIRE_E_NOMEM, "out of memory for a deferred SPARSE_PULL");
        return;
    }
    memcpy(ids, r->payload->data, r->payload->size);
    q->ids = (dt_bytes){.data = ids, .size = r->payload->size, .release = release_free, .hint = ids};
    q->req = *r->h;
    q->since_us = r->now;
    s->n_sp++;
}

void shard_on_sparse_pull(const shard_req *r) {
    const int n = shard_sections(r, r->payload->data, r->payload->size);
    if (n < 0) return;
    uint32_t table;
    if (!r->s->importing && r->h->global_step <= sections_step(r->s, n, &table)) send_rows(r, n, r->payload->data);
    else sparse_defer(r, n);
}

/* ---- Deferred SPARSE_PULLs -------------------------------------------------------------------- */

/* Keeps the deferred pulls keep() accepts, in order; the others are answered by keep or dropped. */
static void sparse_filter(ps_shard *s, const ps_io *io, int (*keep)(ps_shard *, const ps_io *, sparse_pending *, void *),
                          void *user) {
    int kept = 0;
    for (int i = 0; i < s->n_sp; i++) {
        sparse_pending *q = &s->sp[i];
        if (!keep(s, io, q, user)) {
            io->drop(io->user, &q->from);
            dt_bytes_release(&q->ids);
            continue;
        }
        if (kept != i) s->sp[kept] = *q;
        kept++;
    }
    s->n_sp = kept;
}

/* A deferred pull whose tables have all reached its step, and are whole (no import under way), is answered. Its sections were checked when
 * it came, and the tables stay until a SPARSE_INIT or INIT, which answer every deferred pull first:
 * checked again all the same (a refusal answers it). */
static int keep_unready(ps_shard *s, const ps_io *io, sparse_pending *q, void *now) {
    shard_req r = {.s = s, .from = &q->from, .h = &q->req, .payload = &q->ids, .now = *(int64_t *)now, .io = io};
    int n = sections_decode(&r, q->ids.data, q->ids.size);
    for (int k = 0; k < n; k++)
        if (!s->tables || !s->tables[s->sec[k].table]) {
            shard_refuse(&r, DT_WIRE_E_RESYNC, "table %u is gone", s->sec[k].table);
            n = -1;
        }
    uint32_t table;
    if (n >= 0 && (s->importing || q->req.global_step > sections_step(s, n, &table))) return 1;
    if (n >= 0) send_rows(&r, n, q->ids.data);
    shard_saw_worker(s, &q->req, r.now);
    return 0;
}

void shard_sparse_serve(ps_shard *s, int64_t now, const ps_io *io) {
    if (s->shutdown) shard_sparse_fail(s, io, DT_WIRE_E_SHUTDOWN, "shutting down (training is over)");
    else if (s->n_sp) sparse_filter(s, io, keep_unready, &now);
}

static int keep_none(ps_shard *s, const ps_io *io, sparse_pending *q, void *text) {
    shard_send_error(s, io, &q->from, &q->req, (int32_t)(intptr_t)((const void **)text)[1], "ps %d: %s",
                     s->cfg.ps_index, (const char *)((const void **)text)[0]);
    return 0;
}

void shard_sparse_fail(ps_shard *s, const ps_io *io, int32_t status, const char *text) {
    const void *args[2] = {text, (const void *)(intptr_t)status};
    if (s->n_sp) sparse_filter(s, io, keep_none, args);
}

static int keep_fresh(ps_shard *s, const ps_io *io, sparse_pending *q, void *now) {
    if (*(int64_t *)now - q->since_us <= SHARD_PENDING_MAX_WAIT_US) return 1;
    shard_send_error(s, io, &q->from, &q->req, DT_WIRE_E_BUSY, "ps %d: table step %lld did not come within %lld s",
                     s->cfg.ps_index, (long long)q->req.global_step, (long long)(SHARD_PENDING_MAX_WAIT_US / 1000000));
    return 0;
}

void shard_sparse_expire(ps_shard *s, int64_t now, const ps_io *io) {
    if (s->n_sp) sparse_filter(s, io, keep_fresh, &now);
}

static int keep_other_conn(ps_shard *s, const ps_io *io, sparse_pending *q, void *gone) { return q->from.conn != gone; }

void shard_sparse_forget(ps_shard *s, const void *conn, const ps_io *io) {
    if (s->n_sp && conn) sparse_filter(s, io, keep_other_conn, (void *)conn);
}

int shard_sparse_has_pending(const ps_shard *s, int w) {
    for (int i = 0; i < s->n_sp; i++) {
        const dt_wire_header *q = &s->sp[i].req;
        /* a pull of step t + 1 sent before the worker's push of step t (its prefetch) is no wait at
         * the barrier: the worker is computing, and silence then is silence; but while the chief
         * imports the tables every pull waits for it */
        if (q->task == w && q->role != DT_ROLE_PS &&
            (!s->aggregate || s->importing || shard_sparse_pushed(s, w, q->global_step - 1)))
            return 1;
    }
    return 0;
}

/* ---- SPARSE_PUSH ------------------------------------------------------------------------------ */

/* An asynchronous push's sections (s->sec [n], rows in s->rows): each section one update of its
 * table, its rows of an id named twice summed. */
static void async_push(const shard_req *r, int n, const uint8_t *ids) {
    ps_shard *s = r->s;
    for (int k = 0; k < n; k++) {
        const dt_wire_section *c = &s->sec[k];
        if (s->rsum.dim != (int)c->dim) dt_rowsum_free(&s->rsum), dt_rowsum_init(&s->rsum, (int)c->dim);
        dt_rowsum_clear(&s->rsum);
        if (dt_rowsum_reserve(&s->rsum, c->ids, NULL)) {
            shard_refuse(r, DT_WIRE_E_NOMEM, "out of memory for the rows of SPARSE_PUSH section %d (table %u): the "
                         "%d section(s) before it were applied", k, c->table, k);
            return;
        }
        for (size_t i = 0; i < c->ids; i++)
            dt_rowsum_add(&s->rsum, id_at(ids, c->first + i), s->rows + c->at + i * c->dim);
        shard_sparse_apply(s, s->tables[c->table]->t, &s->rsum, 1.0f, 0);
    }
    s->sparse_pushes++;
    dt_wire_header a = shard_reply_to(s, DT_MSG_ACK, r->h);
    shard_send(r, &a);
    if (s->n_sp) shard_sparse_serve(s, r->now, r->io);
}

/* A gradient of rows in sections (the dispatch table checked readiness and the payload's size):
 * summed by id and applied at once (async), or held for its step (sync). */
void shard_on_sparse_push(const shard_req *r) {
    ps_shard *s = r->s;
    const dt_wire_header *h = r->h;
    const int n = shard_sections(r, r->payload->data, r->payload->size);
    if (n < 0) return;
    const int sync = (h->flags & DT_WIRE_F_SYNC) != 0;
    if (sync != (s->aggregate > 0)) {
        shard_refuse(r, DT_WIRE_E_BAD_VALUE, "%s SPARSE_PUSH, but the chief initialised this ps for %s (give every "
                     "task the same --issync)", sync ? "synchronous" : "asynchronous",
                     sync ? "asynchronous training" : "sync replicas");
        return;
    }
    const uint8_t *p = r->payload->data;
    dt_unpack(h->encoding, s->rows, p + dt_wire_sections_rows_at(h), h->sections.floats);
    if (sync) {
        if (shard_sparse_sync_push(r, n, p + dt_wire_sections_ids_at(h), s->rows)) shard_sparse_serve(s, r->now, r->io);
    } else async_push(r, n, p + dt_wire_sections_ids_at(h));
}
