/* Sync replicas for sparse tables (docs/sparse.md, "Sync mode"): each worker's push of a step of a
 * table (in parts) is summed by id as it arrives; once replicas_to_aggregate workers' pushes are
 * complete (or the live workers', as for the dense chunks), their rows are summed in worker-index
 * order, divided as the table says, and applied as one update. Stale pushes are dropped and
 * counted, as dense gradients are. */
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/error.h"
#include "ps/shard_impl.h"

/* Beyond this a held push's row sums are freed after its step, not kept for the next. */
#define ENTRY_KEEP_BYTES (UINT64_C(1) << 20)

int shard_table_accumulators(shard_table *t, int aggregate, int staleness) {
    const int dim = dt_table_config_of(t->t)->dim;
    if (!(t->acc = dt_calloc((size_t)staleness + 1, sizeof *t->acc, "ps sparse accumulators", NULL))) return DT_ENOMEM;
    for (int i = 0; i <= staleness; i++) {
        t->acc[i].step = -1;
        if (!(t->acc[i].e = dt_calloc((size_t)aggregate, sizeof *t->acc[i].e, "ps sparse accumulator", NULL)))
            return DT_ENOMEM;
        for (int k = 0; k < aggregate; k++) dt_rowsum_init(&t->acc[i].e[k].rows, dim);
    }
    return DT_OK;
}

uint64_t shard_table_acc_bytes(int aggregate, int staleness) {
    if (!aggregate) return 0;
    return (uint64_t)(staleness + 1) * (sizeof(sparse_acc) + (uint64_t)aggregate * sizeof(sparse_entry));
}

uint64_t shard_table_sums_bytes(const shard_table *t, int staleness, int aggregate) {
    uint64_t n = 0;
    for (int i = 0; t->acc && i <= staleness; i++)
        for (int k = 0; k < aggregate; k++) n += dt_rowsum_bytes(&t->acc[i].e[k].rows);
    return n;
}

static void entry_clear(ps_shard *s, sparse_entry *e) {
    s->sparse_held -= DT_ASSERT(e->held <= s->sparse_held) ? e->held : s->sparse_held; /* never below 0 */
    e->held = 0;
    if (dt_rowsum_bytes(&e->rows) > ENTRY_KEEP_BYTES) dt_rowsum_free(&e->rows);
    dt_rowsum_clear(&e->rows);
    e->got = 0;
    memset(e->seen, 0, sizeof e->seen);
}

static int entry_complete(const sparse_entry *e) { return e->chunks && e->got == e->chunks; }

/* Sums a step's complete pushes in worker-index order, applies them as one update, empties it. */
static void apply_sync_step(ps_shard *s, shard_table *st, sparse_acc *a) {
    for (int i = 1; i < a->n; i++) /* insertion sort by worker: a->n is small */
        for (int j = i; j > 0 && a->e[j - 1].worker > a->e[j].worker; j--) {
            sparse_entry t = a->e[j];
            a->e[j] = a->e[j - 1], a->e[j - 1] = t;
        }
    const int dim = dt_table_config_of(st->t)->dim;
    if (s->rsum.dim != dim) dt_rowsum_free(&s->rsum), dt_rowsum_init(&s->rsum, dim);
    dt_rowsum_clear(&s->rsum);
    size_t rows = 0;
    int used = 0;
    for (int k = 0; k < a->n; k++) rows += entry_complete(&a->e[k]) ? a->e[k].rows.n : 0;
    /* Without room for the sum the step is applied without its rows (counted by the table's step
     * alone): never seen in practice, and a half-applied step would differ between ps tasks. */
    int room = dt_rowsum_reserve(&s->rsum, rows, NULL) == DT_OK;
    for (int k = 0; k < a->n; k++) {
        const sparse_entry *e = &a->e[k];
        if (!entry_complete(e)) continue;
        used++;
        for (size_t u = 0; room && u < e->rows.n; u++)
            dt_rowsum_add(&s->rsum, e->rows.ids[u], e->rows.rows + u * (size_t)dim);
    }
    if (!room) dt_rowsum_clear(&s->rsum);
    shard_sparse_apply(s, st->t, &s->rsum, (float)(used ? used : 1), st->row_mean);
    for (int k = 0; k < a->n; k++) entry_clear(s, &a->e[k]);
    a->n = 0;
    a->step = -1;
}

/* Applies every complete step of every table; whether any was. */
int shard_sparse_apply_complete(ps_shard *s) {
    int any = 0;
    for (int i = 0; s->tables && i < (int)DT_WIRE_MAX_TABLES; i++) {
        shard_table *st = s->tables[i];
        while (st && st->acc) {
            const int64_t step = dt_table_step(st->t);
            sparse_acc *a = &st->acc[step % (s->staleness + 1)];
            int complete = 0;
            for (int k = 0; a->step == step && k < a->n; k++) complete += entry_complete(&a->e[k]);
            if (!a->n || a->step != step || complete < shard_needed(s)) break;
            apply_sync_step(s, st, a);
            any = 1;
        }
    }
    return any;
}

static void push_ack(const shard_req *r, int32_t status, uint64_t stale) {
    dt_wire_header a = shard_reply_to(r->s, DT_MSG_ACK, r->h);
    a.status = status;
    a.push_ack.stale_count = stale;
    shard_send(r, &a);
}

/* A stale push: a section's step has passed, or (full) the step already has replicas_to_aggregate
 * pushes. Counted once per push (on its part 0) and answered STALE with the worker's count. */
static void sparse_stale(const shard_req *r, uint32_t table, int full) {
    ps_shard *s = r->s;
    const dt_wire_header *h = r->h;
    uint64_t k = s->sparse_stale[h->task];
    if (h->chunk == 0) {
        k = ++s->sparse_stale[h->task];
        s->n_sparse_stale++;
        if (k <= SHARD_LOG_STALE)
            shard_log(s, "stale SPARSE_PUSH from worker %u for step %lld (table %u: %s): dropped%s", h->task,
                      (long long)h->local_step, table,
                      full ? "that step has its pushes already" : "the table is further",
                      k == SHARD_LOG_STALE ? "; further ones from it are counted" : "");
    }
    push_ack(r, DT_WIRE_STALE, k);
}

/* The worker's entry of a step, if it has one. */
static sparse_entry *entry_find(sparse_acc *a, int64_t t, uint16_t worker) {
    for (int k = 0; a->step == t && k < a->n; k++)
        if (a->e[k].worker == worker) return &a->e[k];
    return NULL;
}

int shard_sparse_pushed(const ps_shard *s, int w, int64_t t) {
    for (int i = 0; s->tables && i < (int)DT_WIRE_MAX_TABLES; i++) {
        shard_table *st = s->tables[i];
        if (!st || !st->acc || dt_table_step(st->t) > t) continue;
        const sparse_entry *e = entry_find(&st->acc[t % (s->staleness + 1)], t, (uint16_t)w);
        if (!e || !entry_complete(e)) return 0;
    }
    return 1;
}

/* The worker's entry of a step (a new one if it has none and there is room); NULL: the step is full. */
static sparse_entry *entry_of(ps_shard *s, sparse_acc *a, const dt_wire_header *h) {
    sparse_entry *e = entry_find(a, h->local_step, h->task);
    if (e) {
        /* A part seen twice, or another cut: the worker restarted the step; the new push replaces it. */
        if (e->chunks != h->chunks || (e->seen[h->chunk >> 3] & (1u << (h->chunk & 7)))) {
            entry_clear(s, e);
            e->chunks = h->chunks;
        }
        return e;
    }
    if (a->n >= s->aggregate) return NULL;
    e = &a->e[a->n++];
    entry_clear(s, e);
    e->worker = h->task;
    e->chunks = h->chunks;
    return e;
}

/* Refuses a sync push that would break a bound before any of its sections is taken: every table
 * named (a worker's push of a step is whole once each table has its parts), no section beyond the
 * staleness, the rows one worker's push of one step holds, the bytes all sync pushes hold. 1: refused. */
static int sync_refused(const shard_req *r, int n, uint64_t *bytes) {
    ps_shard *s = r->s;
    const dt_wire_header *h = r->h;
    const int64_t t = h->local_step;
    if (h->task >= s->total)
        return shard_refuse(r, DT_WIRE_E_BAD_VALUE, "SPARSE_PUSH from worker %u, but the chief declared %d replicas",
                            h->task, s->total), 1;
    if (n != s->n_tables)
        return shard_refuse(r, DT_WIRE_E_BAD_VALUE, "sync SPARSE_PUSH names %d of the %d tables: each part of a sync "
                            "push names every table (a section without ids where the worker has none)", n,
                            s->n_tables), 1;
    *bytes = 0;
    for (int k = 0; k < n; k++) {
        const dt_wire_section *c = &s->sec[k];
        shard_table *st = s->tables[c->table];
        const int64_t step = dt_table_step(st->t);
        if (t < step) continue; /* stale */
        if (t > step + s->staleness)
            return shard_refuse(r, DT_WIRE_E_RESYNC, "SPARSE_PUSH section %d: step %lld, but table %u is at step %lld "
                                "and staleness %d allows at most %lld", k, (long long)t, c->table, (long long)step,
                                s->staleness, (long long)(step + s->staleness)), 1;
        /* what the worker's entry holds of the step, unless this part starts it again (entry_of) */
        const sparse_entry *e = entry_find(&st->acc[t % (s->staleness + 1)], t, h->task);
        const int again = e && (e->chunks != h->chunks || (e->seen[h->chunk >> 3] & (1u << (h->chunk & 7))));
        const size_t had = e && !again ? e->rows.n : 0;
        if (had + c->ids > DT_WIRE_MAX_SPARSE_STEP_ROWS)
            return shard_refuse(r, DT_WIRE_E_BAD_VALUE, "SPARSE_PUSH section %d: worker %u's push of step %lld to "
                                "table %u would hold %zu rows, beyond the limit of %u rows per step "
                                "(DT_WIRE_MAX_SPARSE_STEP_ROWS)", k, h->task, (long long)t, c->table, had + c->ids,
                                DT_WIRE_MAX_SPARSE_STEP_ROWS), 1;
        *bytes += c->ids * ((uint64_t)c->dim * sizeof(float) + sizeof(uint64_t) + sizeof(uint32_t)); /* at most */
    }
    if (s->sparse_held + *bytes > SHARD_SPARSE_HELD_MAX)
        return shard_refuse(r, DT_WIRE_E_BUSY, "sync pushes of sparse rows hold %llu bytes of this ps, at the limit of "
                            "%llu: ask again shortly", (unsigned long long)s->sparse_held,
                            (unsigned long long)SHARD_SPARSE_HELD_MAX), 1;
    return 0;
}

/* Section c of a sync push part into its table's step t: summed into the worker's entry (0); stale: 1
 * the table is past t, 2 its step t is full; -1: out of memory (refused). */
static int sync_section(const shard_req *r, const dt_wire_section *c, const uint8_t *ids, const float *rows) {
    ps_shard *s = r->s;
    const dt_wire_header *h = r->h;
    shard_table *st = s->tables[c->table];
    const int64_t t = h->local_step;
    if (t < dt_table_step(st->t)) return 1;
    sparse_acc *a = &st->acc[t % (s->staleness + 1)];
    if (!DT_ASSERT(a->n == 0 || a->step == t)) {
        shard_refuse(r, DT_WIRE_E_RESYNC, "SPARSE_PUSH for step %lld refused: %s", (long long)t, dt_assert_why());
        return -1;
    }
    sparse_entry *e = entry_of(s, a, h);
    if (!e) return 2;
    a->step = t;
    if (dt_rowsum_reserve(&e->rows, c->ids, NULL)) {
        shard_refuse(r, DT_WIRE_E_NOMEM, "out of memory for the rows of SPARSE_PUSH section %zu (table %u)",
                     (size_t)(c - s->sec), c->table);
        return -1;
    }
    for (size_t i = 0; i < c->ids; i++) {
        uint64_t id = 0;
        for (int b = 7; b >= 0; b--) id = id << 8 | ids[8 * (c->first + i) + (size_t)b];
        dt_rowsum_add(&e->rows, id, rows + c->at + i * c->dim);
    }
    const uint64_t bytes = c->ids * ((uint64_t)c->dim * sizeof(float) + sizeof(uint64_t) + sizeof(uint32_t));
    s->sparse_held += bytes;
    e->held += bytes;
    e->seen[h->chunk >> 3] |= (uint8_t)(1u << (h->chunk & 7));
    e->got++;
    return 0;
}

/* A sync SPARSE_PUSH part for step t = local_step, of n sections (s->sec, checked): each section
 * stale for its table (t below the table's step, or the step full) is dropped, the push then counted
 * stale once; the others are summed into the worker's entries; complete steps are applied. Whether
 * a step was (the caller serves the held pulls then). */
int shard_sparse_sync_push(const shard_req *r, int n, const uint8_t *ids, const float *rows) {
    ps_shard *s = r->s;
    uint64_t bytes;
    if (sync_refused(r, n, &bytes)) return 0;
    int stale = -1, why = 0;
    for (int k = 0; k < n; k++) {
        const int rc = sync_section(r, &s->sec[k], ids, rows);
        if (rc < 0) return 0;
        if (rc && stale < 0) stale = k, why = rc;
    }
    s->sparse_pushes += stale < 0;
    int applied = shard_sparse_apply_complete(s);
    if (stale >= 0) sparse_stale(r, s->sec[stale].table, why == 2);
    else push_ack(r, DT_WIRE_OK, s->sparse_stale[r->h->task]);
    return applied;
}
