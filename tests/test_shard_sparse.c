/* Sparse tables on the ps shard (src/ps/shard_sparse*.c), driven through the shard API as
 * test_shard.c does (no sockets): SPARSE_INIT's conditions and refusals, a pull of rows never
 * pushed (their initial values), an asynchronous push applied lazily (duplicates summed, other rows
 * untouched), sync mode summing two replicas' pushes (in parts) once per step, the per-row mean,
 * deferred pulls answered at the step and dropped with their connection, stale and far-ahead
 * pushes, 16-bit rows, and hostile messages refused with the bound they break named; a restore's
 * pulls held until the chief's import ends. */
#include <stdint.h>

#include "cluster/row_placement.h"
#include "compute/lazy_optim.h"
#include "core/error.h"
#include "ps/shard_impl.h"
#include "ps/table.h"
#include "transport/compress.h"

#include "shard_io.h"

enum { N = 4, TABLE = 5, DIM = 3 };
#define SEC INT64_C(1000000)

/* The table every test declares: sgd at 0.5, normal initial rows (stddev 0.1, seed 7). */
static dt_table_config table_config(void) {
    dt_table_config c = {.table = TABLE, .dim = DIM, .capacity = 1000, .init = DT_ROW_INIT_NORMAL, .init_scale = 0.1f,
                         .seed = 7};
    dt_lazy_config_init(&c.opt, "sgd", 0.5f, NULL);
    return c;
}

static void put_ids(uint8_t *p, const uint64_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 8; b++) p[8 * i + (size_t)b] = (uint8_t)(ids[i] >> (8 * b));
}

/* SPARSE_INIT of the records given (raw), from the chief (role), at step 0. */
static void sparse_init_raw(ps_shard *s, dt_wire_role role, const uint8_t *records, size_t n) {
    dt_wire_header h = hdr(DT_MSG_SPARSE_INIT, role, 0);
    h.sparse.ids = n;
    h.global_step = init_step;
    h.payload_bytes = n * DT_WIRE_TABLE_BYTES;
    ps_origin o = from(0);
    dt_bytes b = {.data = records, .size = h.payload_bytes};
    ps_shard_request(s, &o, &h, &b, 0, &io);
}

static void sparse_init(ps_shard *s, uint8_t flags) {
    dt_table_config c = table_config();
    dt_wire_table w = {.table = TABLE, .dim = DIM, .init_kind = DT_ROW_INIT_NORMAL, .flags = flags, .opt = c.opt,
                       .init_scale = c.init_scale, .capacity = c.capacity, .seed = c.seed};
    uint8_t rec[DT_WIRE_TABLE_BYTES];
    dt_wire_table_encode(rec, &w);
    sparse_init_raw(s, DT_ROLE_CHIEF, rec, 1);
}

/* A section of a message built here: table, dim, ids [n], a push's rows [n * dim]. */
typedef struct {
    uint32_t table, dim;
    size_t n;
    const uint64_t *ids;
    const float *rows;
} sec_in;

/* The payload of a SPARSE_PULL or SPARSE_PUSH of sections [k] into h (its totals and size set): the
 * records, the ids, a push's rows (float32). Freed by the caller. */
static uint8_t *sections_payload(dt_wire_header *h, const sec_in *sec, size_t k) {
    size_t ids = 0, floats = 0;
    for (size_t i = 0; i < k; i++) ids += sec[i].n, floats += sec[i].n * sec[i].dim;
    const int push = h->type == DT_MSG_SPARSE_PUSH;
    h->sections.count = k, h->sections.ids = ids, h->sections.floats = floats;
    h->payload_bytes = 8 * k + 8 * ids + (push ? 4 * floats : 0);
    uint8_t *p = malloc(h->payload_bytes + 1), *at = p + 8 * k, *rows = at + 8 * ids;
    for (size_t i = 0; i < k; i++) {
        dt_wire_section_encode(p + 8 * i, sec[i].table, sec[i].dim, (uint32_t)sec[i].n);
        put_ids(at, sec[i].ids, sec[i].n);
        at += 8 * sec[i].n;
        if (push && sec[i].n) memcpy(rows, sec[i].rows, 4 * sec[i].n * sec[i].dim), rows += 4 * sec[i].n * sec[i].dim;
    }
    return p;
}

/* Sends h with the payload of sections [k] from connection conn at `now`. */
static void ssend(ps_shard *s, int conn, dt_wire_header h, const sec_in *sec, size_t k, int64_t now) {
    uint8_t *p = sections_payload(&h, sec, k);
    ps_origin o = from(conn);
    dt_bytes b = {.data = p, .size = h.payload_bytes, .release = free, .hint = p};
    ps_shard_request(s, &o, &h, &b, now, &io);
}

/* SPARSE_PULL of ids [n] of TABLE at `min_step` (encoding enc) from worker task on connection conn. */
static void spull(ps_shard *s, int conn, uint16_t task, const uint64_t *ids, size_t n, int64_t min_step, uint8_t enc,
                  int64_t now) {
    dt_wire_header h = hdr(DT_MSG_SPARSE_PULL, task ? DT_ROLE_WORKER : DT_ROLE_CHIEF, task);
    h.global_step = min_step;
    h.encoding = enc;
    const sec_in one = {TABLE, DIM, n, ids, NULL};
    ssend(s, conn, h, &one, 1, now);
}

/* SPARSE_PUSH of ids [n] and float32 rows [n * DIM] of TABLE for `step`, part `part` of `parts`. */
static void spush(ps_shard *s, int conn, uint16_t task, const uint64_t *ids, size_t n, const float *grads, int64_t step,
                  int sync, int part, int parts) {
    dt_wire_header h = hdr(DT_MSG_SPARSE_PUSH, task ? DT_ROLE_WORKER : DT_ROLE_CHIEF, task);
    h.local_step = step;
    h.flags = sync ? DT_WIRE_F_SYNC : 0;
    h.chunk = (uint8_t)part, h.chunks = (uint8_t)parts;
    const sec_in one = {TABLE, DIM, n, ids, grads};
    ssend(s, conn, h, &one, 1, 0);
}

/* The last reply is SPARSE_ROWS with want [n * DIM] (float32), at table step `step`. */
static int rows_are(const float *want, size_t n, int64_t step) {
    const reply *r = last();
    if (!r || r->h.type != DT_MSG_SPARSE_ROWS || r->size != n * DIM * 4 || r->h.global_step != step ||
        r->h.sections.ids != n || r->h.sections.count != 1 || r->h.sections.floats != n * DIM)
        return 0;
    for (size_t i = 0; i < n * DIM; i++)
        if (fabsf(r->first[i] - want[i]) > 1e-7f) return 0;
    return 1;
}

static void initial(uint64_t id, float *out) {
    dt_table_config c = table_config();
    dt_table_init_row(&c, id, out);
}

static void test_init_conditions(void) {
    ps_shard *s = shard_new_n(N);
    sparse_init(s, 0);
    CHECK(last()->h.status == DT_WIRE_E_NOT_READY); /* the dense INIT first: it says sync or async */
    shard_init_n(s, N, 1, 0, 2, 0, 0, 0, 0);
    uint8_t rec[DT_WIRE_TABLE_BYTES];
    sparse_init_raw(s, DT_ROLE_WORKER, rec, 1);
    CHECK(last()->h.status == DT_WIRE_E_ROLE);
    sparse_init(s, 0);
    CHECK(last()->h.type == DT_MSG_ACK);
    /* A bad record, or a table declared twice: refused, the tables as they were. */
    dt_table_config c = table_config();
    dt_wire_table w = {.table = 9, .dim = 0, .opt = c.opt, .capacity = 10};
    dt_wire_table_encode(rec, &w);
    sparse_init_raw(s, DT_ROLE_CHIEF, rec, 1);
    CHECK(last()->h.status == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(last()->text, "table 9: dim 0");
    uint8_t two[2 * DT_WIRE_TABLE_BYTES];
    w.dim = 2;
    dt_wire_table_encode(two, &w), dt_wire_table_encode(two + DT_WIRE_TABLE_BYTES, &w);
    sparse_init_raw(s, DT_ROLE_CHIEF, two, 2);
    CHECK_CONTAINS(last()->text, "declares table 9 twice");
    uint64_t id = 4;
    float want[DIM];
    initial(id, want);
    spull(s, 1, 1, &id, 1, 0, 0, 0);
    CHECK(rows_are(want, 1, 0));
    shard_done(s);
}

/* Rows never pushed read as their initial values; a push sums duplicates and moves only its rows. */
static void test_async_pull_push(void) {
    ps_shard *s = shard_new_n(N);
    shard_init_n(s, N, 1, 0, 2, 0, 0, 0, 0);
    sparse_init(s, 0);
    uint64_t ids[3] = {10, 20, 10};
    float want[3 * DIM];
    for (int i = 0; i < 3; i++) initial(ids[i], want + i * DIM);
    spull(s, 1, 1, ids, 3, 0, 0, 0);
    CHECK(rows_are(want, 3, 0));
    uint64_t pids[3] = {10, 10, 30};
    const float g[3 * DIM] = {1, 2, 3, 0.5f, 0.5f, 0.5f, -1, 0, 1};
    spush(s, 1, 1, pids, 3, g, 0, 0, 0, 1);
    CHECK(last()->h.type == DT_MSG_ACK && last()->h.status == DT_WIRE_OK);
    uint64_t q[3] = {10, 30, 20};
    float w10[DIM], w30[DIM], w20[DIM];
    initial(10, w10), initial(30, w30), initial(20, w20);
    for (int j = 0; j < DIM; j++) {
        want[j] = w10[j] - 0.5f * (g[j] + g[DIM + j]);
        want[DIM + j] = w30[j] - 0.5f * g[2 * DIM + j];
        want[2 * DIM + j] = w20[j]; /* untouched: still its initial value */
    }
    spull(s, 2, 1, q, 3, 0, 0, 0);
    CHECK(rows_are(want, 3, 1));
    /* In bf16: half the bytes, the values rounded to bf16. */
    spull(s, 2, 1, q, 1, 0, DT_ENC_BF16, 0);
    CHECK(last()->h.type == DT_MSG_SPARSE_ROWS && last()->size == DIM * 2 && last()->h.encoding == DT_ENC_BF16);
    float back[DIM];
    dt_unpack(DT_ENC_BF16, back, last()->first, DIM);
    for (int j = 0; j < DIM; j++) CHECK(back[j] == dt_f32_from_bf16(dt_bf16_from_f32(want[j])));
    ps_shard_stats st; /* the counts the metrics publish */
    ps_shard_get_stats(s, &st);
    CHECK(st.sparse.tables == 1 && st.sparse.rows == 2 && st.sparse.admitted == 2 && st.sparse.pushes == 1);
    CHECK(st.sparse.pulls == 3 && st.sparse.updates == 1 && st.sparse.evicted == 0 && st.sparse.stale == 0);
    /* reads of 10 20 10 (misses), 10 30 20 (hits but 20), 10 (hit); the push of 10 and 30 (misses) */
    CHECK(st.sparse.hits == 3 && st.sparse.misses == 6);
    dt_table_stats ts; /* the one table's own counts (its metrics' series), another table none */
    CHECK(ps_shard_table_stats(s, TABLE, &ts) == 1 && ts.rows == 2 && ts.admitted == 2 && ts.hits == 3 &&
          ts.misses == 6);
    CHECK(ps_shard_table_stats(s, TABLE + 1, &ts) == 0 && ts.rows == 0);
    CHECK(ps_shard_table_stats(s, -1, &ts) == 0 && ps_shard_table_stats(s, (int)DT_WIRE_MAX_TABLES, &ts) == 0);
    shard_done(s);
}

/* Sync: two replicas' pushes (worker 0's in two parts) summed and applied once, as the mean over the
 * replicas (or, with the row-mean flag, over those that sent each row); a pull of the next step
 * waits for it; a stale push is dropped and counted; a push beyond staleness asks to pull again. */
static void sync_case(uint8_t flags) {
    ps_shard *s = shard_new_n(N);
    shard_init_n(s, N, 1, 2, 2, 0, 0, 0, 0);
    sparse_init(s, flags);
    const float a[2 * DIM] = {1, 1, 1, 2, 2, 2}, b[2 * DIM] = {4, 4, 4, 8, 8, 8};
    uint64_t ia[2] = {1, 2}, ib[2] = {2, 3};
    spush(s, 0, 0, ia, 1, a, 0, 1, 0, 2); /* worker 0, part 0 of 2: id 1 */
    CHECK(last()->h.type == DT_MSG_ACK && last()->h.status == DT_WIRE_OK);
    uint64_t q[3] = {1, 2, 3};
    const int before = rec.n;
    spull(s, 0, 0, q, 3, 1, 0, 0); /* waits for step 1 */
    CHECK(rec.n == before && rec.held == 1);
    spush(s, 1, 1, ib, 2, b, 0, 1, 0, 1); /* worker 1: complete; worker 0 is not yet */
    CHECK(last()->h.type == DT_MSG_ACK && rec.held == 1);
    spush(s, 0, 0, ia + 1, 1, a + DIM, 0, 1, 1, 2); /* worker 0's part 1: id 2; the step is complete */
    CHECK(rec.held == 0);
    const reply *rows = last(); /* the push's ACK, then the deferred pull's answer */
    CHECK(rows->h.type == DT_MSG_SPARSE_ROWS && rows->h.global_step == 1);
    CHECK(rec.r[rec.n - 2].h.type == DT_MSG_ACK && rec.r[rec.n - 2].h.status == DT_WIRE_OK);
    float w[3][DIM];
    for (int i = 0; i < 3; i++) initial(q[i], w[i]);
    const float d1 = flags ? 1.0f : 2.0f, d3 = d1; /* ids 1 and 3 came from one replica each */
    for (int j = 0; j < DIM; j++) {
        CHECK_NEAR(rows->first[j], w[0][j] - 0.5f * a[j] / d1, 1e-6);
        CHECK_NEAR(rows->first[DIM + j], w[1][j] - 0.5f * (a[DIM + j] + b[j]) / 2, 1e-6);
        CHECK_NEAR(rows->first[2 * DIM + j], w[2][j] - 0.5f * b[DIM + j] / d3, 1e-6);
    }
    spush(s, 1, 1, ib, 2, b, 0, 1, 0, 1); /* step 0 again: stale */
    CHECK(last()->h.type == DT_MSG_ACK && last()->h.status == DT_WIRE_STALE && last()->h.push_ack.stale_count == 1);
    spush(s, 1, 1, ib, 2, b, 3, 1, 0, 1); /* beyond staleness 0: pull again */
    CHECK(last()->h.status == DT_WIRE_E_RESYNC);
    spush(s, 1, 1, ib, 2, b, 1, 0, 0, 1); /* async push to a sync ps */
    CHECK(last()->h.status == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(last()->text, "same --issync");
    shard_done(s);
}

static void test_sync_two_replicas(void) { sync_case(0); }
static void test_sync_row_mean(void) { sync_case(DT_WIRE_TABLE_F_ROW_MEAN); }

/* Deferred pulls: dropped with their connection, answered at shutdown, expired after their wait;
 * an INIT drops the tables (pull again after SPARSE_INIT). */
static void test_deferred_pulls(void) {
    ps_shard *s = shard_new_n(N);
    shard_init_n(s, N, 1, 2, 2, 0, 0, 0, 0);
    sparse_init(s, 0);
    uint64_t id = 1;
    spull(s, 3, 1, &id, 1, 1, 0, 0);
    CHECK(rec.held == 1);
    ps_shard_forget(s, &conns[3], &io);
    CHECK(rec.held == 0);
    spull(s, 3, 1, &id, 1, 1, 0, 0);
    dt_error e = {0};
    CHECK(ps_shard_cron(s, 700 * SEC, &io, &e) == DT_OK);
    CHECK(rec.held == 0 && last()->h.status == DT_WIRE_E_BUSY);
    CHECK_CONTAINS(last()->text, "did not come within");
    spull(s, 3, 1, &id, 1, 5, 0, 0); /* a step that cannot come soon */
    CHECK(last()->h.status == DT_WIRE_E_BAD_VALUE);
    spull(s, 3, 1, &id, 1, 1, 0, 0);
    shard_init_n(s, N, 1, 2, 2, 0, 0, 0, 0); /* re-initialised: the tables are gone */
    CHECK(rec.held == 0);
    CHECK(rec.r[rec.n - 2].h.status == DT_WIRE_E_RESYNC);
    spull(s, 3, 1, &id, 1, 0, 0, 0);
    CHECK(last()->h.status == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(last()->text, "does not hold");
    shard_done(s);
}

/* Liveness (sync): a held pull of step t + 1 counts its worker as waiting at the barrier only once
 * the worker's push of step t is in. A prefetched pull (docs/sparse.md, "Prefetch") is sent before
 * that push: a worker silent past the liveness timeout with only such a pull held is lost, the step
 * goes on without it, and its pull is answered by that step. */
static void test_prefetched_pull_is_no_barrier_wait(void) {
    ps_shard *s = shard_new_n(N);
    shard_init_n(s, N, 1, 2, 2, 0, 1000, 0, 0); /* 2 replicas, a worker silent 1 s is lost */
    sparse_init(s, 0);
    uint64_t id = 1;
    const float g[DIM] = {2, 2, 2};
    spull(s, 3, 1, &id, 1, 1, 0, 0); /* worker 1's prefetch of step 1, before its push of step 0 */
    CHECK(rec.held == 1);
    spull(s, 0, 0, &id, 1, 0, 0, 1500 * 1000); /* worker 0 heard from at 1.5 s */
    dt_error e = {0};
    CHECK(ps_shard_cron(s, 2 * SEC, &io, &e) == DT_OK); /* worker 1: silent for 2 s, computing */
    spush(s, 0, 0, &id, 1, g, 0, 1, 0, 1); /* worker 0's push completes step 0 alone */
    CHECK(rec.held == 0);
    float w[DIM];
    initial(id, w);
    for (int j = 0; j < DIM; j++) w[j] -= 0.5f * g[j]; /* one live replica: the mean is its gradient */
    CHECK(rows_are(w, 1, 1));
    shard_done(s);
}

/* A ps of a cluster (here ps 0 of 3) holds the rows dt_row_ps gives it: a pull or push naming another ps's id is
 * refused naming the id, its home and the ps, and changes nothing; its own ids are served. */
static void test_ownership(void) {
    memset(&rec, 0, sizeof rec);
    ps_shard *s = NULL;
    ps_shard_config cfg = {.ps_index = 0, .n_ps = 3, .shard_floats = N};
    CHECK(ps_shard_new(&s, &cfg, NULL) == DT_OK);
    ps_shard_config bad = {.ps_index = 3, .n_ps = 3, .shard_floats = N};
    ps_shard *t = NULL;
    CHECK(ps_shard_new(&t, &bad, NULL) != DT_OK && !t);
    if (!s) return;
    shard_init_n(s, N, 1, 0, 2, 0, 0, 0, 0);
    sparse_init(s, 0);
    uint64_t mine = 0, other = 0;
    while (dt_row_ps(TABLE, mine, 3) != 0) mine++;
    while (dt_row_ps(TABLE, other, 3) != 2) other++;
    uint64_t ids[2] = {mine, other};
    spull(s, 1, 1, ids, 2, 0, DT_ENC_FP32, 0);
    CHECK(last()->h.type == DT_MSG_ERROR && last()->h.status == DT_WIRE_E_BAD_VALUE);
    char want[96];
    snprintf(want, sizeof want, "id %llu of table %d (id 1 of 2) belongs to ps 2 of 3", (unsigned long long)other, TABLE);
    CHECK_CONTAINS(last()->text, want);
    float g[2 * DIM] = {1, 1, 1, 1, 1, 1};
    spush(s, 1, 1, ids, 2, g, 0, 0, 0, 1);
    CHECK(last()->h.type == DT_MSG_ERROR);
    CHECK_CONTAINS(last()->text, "belongs to ps 2 of 3");
    float row[DIM];
    initial(mine, row);
    spull(s, 1, 1, ids, 1, 0, DT_ENC_FP32, 0); /* the refused push changed nothing */
    CHECK(rows_are(row, 1, 0));
    shard_done(s);
}

/* SPARSE_INIT of TABLE as a table of `buckets` buckets (ids below it, spread over the ps tasks) and
 * TABLE + 1, unbounded ids (capacity rows on every ps), dim 2, adagrad with admission at 2. */
static void sparse_init_sized(ps_shard *s, uint64_t buckets, uint64_t capacity) {
    dt_table_config c = table_config();
    dt_wire_table w[2] = {{.table = TABLE, .dim = DIM, .flags = DT_WIRE_TABLE_F_BUCKETS, .opt = c.opt,
                           .capacity = buckets, .seed = 7},
                          {.table = TABLE + 1, .dim = 2, .min_count = 2, .capacity = capacity, .seed = 7}};
    dt_lazy_config_init(&w[1].opt, "adagrad", 0.1f, NULL);
    uint8_t recs[2 * DT_WIRE_TABLE_BYTES];
    for (int t = 0; t < 2; t++) dt_wire_table_encode(recs + t * DT_WIRE_TABLE_BYTES, &w[t]);
    sparse_init_raw(s, DT_ROLE_CHIEF, recs, 2);
}

/* What those two tables may grow to on ps 0 of 4, computed here: the buckets' share is buckets / 4
 * plus 4 binomial standard deviations (and one); the unbounded table its whole capacity. */
static uint64_t sized_bytes(uint64_t buckets, uint64_t capacity, uint64_t *unbounded) {
    dt_table_config c = table_config(), u = {.table = TABLE + 1, .dim = 2, .min_count = 2, .capacity = capacity};
    c.capacity = buckets;
    dt_lazy_config_init(&u.opt, "adagrad", 0.1f, NULL);
    const double share = buckets / 4.0 + 4.0 * sqrt(buckets / 4.0) + 1.0;
    *unbounded = dt_table_bytes_at(&u, capacity);
    return dt_table_bytes_at(&c, (uint64_t)share) + *unbounded;
}

/* The tables a SPARSE_INIT declares must fit the ps's table memory at their capacities, together: at
 * the bound they are declared; a byte less, refused naming the figures, the old tables kept; a peer
 * declaring 1024 tables of 2^31 rows is refused before any is built. A table of buckets refuses ids
 * beyond them (its share of rows is what the ps counted). */
static void test_table_memory(void) {
    memset(&rec, 0, sizeof rec);
    enum { BUCKETS = 100000, CAPACITY = 50000 };
    uint64_t unbounded;
    const uint64_t need = sized_bytes(BUCKETS, CAPACITY, &unbounded);
    for (int less = 0; less < 2; less++) {
        ps_shard *s = NULL;
        ps_shard_config cfg = {.ps_index = 0, .n_ps = 4, .shard_floats = N, .table_memory = need - (uint64_t)less};
        CHECK(ps_shard_new(&s, &cfg, NULL) == DT_OK);
        if (!s) return;
        shard_init_n(s, N, 1, 0, 2, 0, 0, 0, 0);
        if (less) sparse_init(s, 0); /* a small table first: kept through the refusal */
        sparse_init_sized(s, BUCKETS, CAPACITY);
        if (!less) {
            CHECK_MSG(last()->h.type == DT_MSG_ACK, "at the bound: %s", last()->text);
        } else {
            CHECK(last()->h.type == DT_MSG_ERROR && last()->h.status == DT_WIRE_E_BAD_VALUE);
            char want[160];
            snprintf(want, sizeof want, "up to %.1f MiB on this ps (ps 0 of 4) at their capacities, over its table "
                     "memory of %.1f MiB (--ps_table_memory)", need / 1048576.0, (need - 1) / 1048576.0);
            CHECK_CONTAINS(last()->text, want);
            snprintf(want, sizeof want, "the largest, table %d: %d rows of dim 2, %.1f MiB", TABLE + 1, CAPACITY,
                     unbounded / 1048576.0);
            CHECK_CONTAINS(last()->text, want);
        }
        uint64_t mine = 0, beyond = BUCKETS;
        while (dt_row_ps(TABLE, mine, 4) != 0) mine++;
        while (dt_row_ps(TABLE, beyond, 4) != 0) beyond++;
        float row[DIM];
        initial(mine, row);
        if (less) {
            spull(s, 1, 1, &mine, 1, 0, DT_ENC_FP32, 0); /* the old table, as it was */
            CHECK(rows_are(row, 1, 0));
        } else {
            uint64_t ids[2] = {mine, beyond};
            spull(s, 1, 1, ids, 2, 0, DT_ENC_FP32, 0);
            CHECK(last()->h.type == DT_MSG_ERROR && last()->h.status == DT_WIRE_E_BAD_VALUE);
            char want[96];
            snprintf(want, sizeof want, "id %llu of table %d (id 1 of 2) is beyond the table's %d buckets",
                     (unsigned long long)beyond, TABLE, BUCKETS);
            CHECK_CONTAINS(last()->text, want);
            float g[2 * DIM] = {1, 1, 1, 1, 1, 1};
            spush(s, 1, 1, ids, 2, g, 0, 0, 0, 1);
            CHECK(last()->h.type == DT_MSG_ERROR);
            CHECK_CONTAINS(last()->text, "buckets");
        }
        shard_done(s);
    }
    /* 1024 tables of 2^31 rows of dim 1024 with Adam: some 2^55 bytes, refused up front */
    ps_shard *s = NULL;
    ps_shard_config cfg = {.ps_index = 0, .n_ps = 1, .shard_floats = N, .table_memory = UINT64_C(64) << 30};
    CHECK(ps_shard_new(&s, &cfg, NULL) == DT_OK);
    if (!s) return;
    shard_init_n(s, N, 1, 0, 2, 0, 0, 0, 0);
    static uint8_t recs[DT_WIRE_MAX_TABLES * DT_WIRE_TABLE_BYTES];
    for (uint32_t t = 0; t < DT_WIRE_MAX_TABLES; t++) {
        dt_wire_table w = {.table = t, .dim = DT_WIRE_MAX_SPARSE_DIM, .min_count = 2, .capacity = DT_TABLE_MAX_ROWS};
        dt_lazy_config_init(&w.opt, "adam", 0.1f, NULL);
        dt_wire_table_encode(recs + t * DT_WIRE_TABLE_BYTES, &w);
    }
    sparse_init_raw(s, DT_ROLE_CHIEF, recs, DT_WIRE_MAX_TABLES);
    CHECK(last()->h.type == DT_MSG_ERROR && last()->h.status == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(last()->text, "the 1024 table(s) would hold up to");
    ps_shard_stats st;
    ps_shard_get_stats(s, &st);
    CHECK(st.sparse.tables == 0);
    shard_done(s);
}

/* Tables TABLE (dim DIM) and TABLE + 1 (dim 2), both as table_config() says. */
static void sparse_init_two(ps_shard *s) {
    dt_table_config c = table_config();
    uint8_t recs[2 * DT_WIRE_TABLE_BYTES];
    for (int t = 0; t < 2; t++) {
        dt_wire_table w = {.table = TABLE + (uint32_t)t, .dim = t ? 2 : DIM, .init_kind = DT_ROW_INIT_NORMAL,
                           .opt = c.opt, .init_scale = c.init_scale, .capacity = c.capacity, .seed = c.seed};
        dt_wire_table_encode(recs + t * DT_WIRE_TABLE_BYTES, &w);
    }
    sparse_init_raw(s, DT_ROLE_CHIEF, recs, 2);
}

static void initial_of(uint32_t table, int dim, uint64_t id, float *out) {
    dt_table_config c = table_config();
    c.table = table, c.dim = dim;
    dt_table_init_row(&c, id, out);
}

static int rows_near(const float *want, size_t n, int64_t step) {
    const reply *r = last();
    if (!r || r->h.type != DT_MSG_SPARSE_ROWS || r->size != 4 * n || r->h.global_step != step) return 0;
    for (size_t i = 0; i < n; i++)
        if (fabsf(r->first[i] - want[i]) > 1e-6f) return 0;
    return 1;
}

/* Two tables in one message: a pull of both is answered by one SPARSE_ROWS (each section's rows in
 * order); a pull of a later step waits until both tables reach it; each section of an async push is
 * one update of its table; a sync push names every table, its parts each a part of every table's
 * push; a section refused is named, and changes nothing. */
static void test_sections(void) {
    ps_shard *s = shard_new_n(N);
    shard_init_n(s, N, 1, 0, 2, 0, 0, 0, 0);
    sparse_init_two(s);
    const uint64_t a[2] = {3, 4}, b[1] = {9};
    const float ga[2 * DIM] = {1, 1, 1, 1, 1, 1}, gb[2] = {2, 2};
    sec_in both[2] = {{TABLE, DIM, 2, a, ga}, {TABLE + 1, 2, 1, b, gb}};
    dt_wire_header pull = hdr(DT_MSG_SPARSE_PULL, DT_ROLE_WORKER, 1), push = hdr(DT_MSG_SPARSE_PUSH, DT_ROLE_WORKER, 1);
    push.chunks = 1;
    ssend(s, 1, pull, both, 2, 0);
    float want[2 * DIM + 2];
    initial_of(TABLE, DIM, 3, want), initial_of(TABLE, DIM, 4, want + DIM), initial_of(TABLE + 1, 2, 9, want + 2 * DIM);
    CHECK(rows_near(want, 2 * DIM + 2, 0) && last()->h.sections.count == 2 && last()->h.sections.ids == 3 &&
          last()->h.sections.floats == 2 * DIM + 2);
    pull.global_step = 1; /* waits for both tables */
    ssend(s, 2, pull, both, 2, 0);
    CHECK(rec.held == 1);
    ssend(s, 1, push, both, 1, 0); /* table 5 only: at step 1, table 6 still at 0 */
    CHECK(rec.held == 1 && last()->h.type == DT_MSG_ACK);
    ssend(s, 1, push, both + 1, 1, 0);
    for (int j = 0; j < 2 * DIM; j++) want[j] -= 0.5f;
    want[2 * DIM] -= 1.0f, want[2 * DIM + 1] -= 1.0f;
    CHECK(rec.held == 0 && rows_near(want, 2 * DIM + 2, 1));
    sec_in bad[2] = {{TABLE, DIM, 2, a, NULL}, {77, 2, 1, b, NULL}};
    pull.global_step = 0;
    ssend(s, 1, pull, bad, 2, 0);
    CHECK_CONTAINS(last()->text, "SPARSE_PULL section 1 for table 77, which this ps does not hold");
    bad[1].table = TABLE, bad[1].dim = DIM;
    ssend(s, 1, pull, bad, 2, 0);
    CHECK(last()->h.status == DT_WIRE_E_MALFORMED);
    CHECK_CONTAINS(last()->text, "SPARSE_PULL section 1: table 5 named twice");
    shard_done(s);

    s = shard_new_n(N);
    shard_init_n(s, N, 1, 2, 2, 0, 0, 0, 0); /* sync, 2 replicas */
    sparse_init_two(s);
    push.flags = DT_WIRE_F_SYNC;
    ssend(s, 1, push, both, 1, 0);
    CHECK(last()->h.status == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(last()->text, "sync SPARSE_PUSH names 1 of the 2 tables");
    pull.global_step = 1;
    ssend(s, 3, pull, both, 2, 0);
    dt_wire_header w0 = push;
    w0.task = 0, w0.role = DT_ROLE_CHIEF;
    ssend(s, 0, w0, both, 2, 0);
    sec_in part0[2] = {{TABLE, DIM, 2, a, ga}, {TABLE + 1, 2, 0, NULL, NULL}},
           part1[2] = {{TABLE, DIM, 0, NULL, NULL}, {TABLE + 1, 2, 1, b, gb}};
    push.chunks = 2;
    ssend(s, 1, push, part0, 2, 0);
    CHECK(rec.held == 1 && last()->h.type == DT_MSG_ACK && last()->h.status == DT_WIRE_OK);
    push.chunk = 1;
    ssend(s, 1, push, part1, 2, 0);
    initial_of(TABLE, DIM, 3, want), initial_of(TABLE, DIM, 4, want + DIM), initial_of(TABLE + 1, 2, 9, want + 2 * DIM);
    for (int j = 0; j < 2 * DIM; j++) want[j] -= 0.5f; /* the mean of two gradients of 1 */
    want[2 * DIM] -= 1.0f, want[2 * DIM + 1] -= 1.0f;
    CHECK(rec.held == 0 && rows_near(want, 2 * DIM + 2, 1));
    ps_shard_stats st;
    ps_shard_get_stats(s, &st);
    CHECK(st.sparse.updates == 2 && st.sparse.stale == 0);
    shard_done(s);
}

/* Hostile messages: each refused with the bound it breaks named, the shard serving on. */
static void test_hostile(void) {
    ps_shard *s = shard_new_n(N);
    shard_init_n(s, N, 1, 2, 2, 0, 0, 0, 0);
    sparse_init(s, 0);
    uint64_t id = 1;
    dt_wire_header h = hdr(DT_MSG_SPARSE_PULL, DT_ROLE_WORKER, 1);
    sec_in one = {77, DIM, 1, &id, NULL};
    ssend(s, 1, h, &one, 1, 0);
    CHECK_CONTAINS(last()->text, "SPARSE_PULL section 0 for table 77, which this ps does not hold");
    one.table = TABLE, one.dim = DIM + 1;
    ssend(s, 1, h, &one, 1, 0);
    CHECK_CONTAINS(last()->text, "section 0 for table 5 with rows of dim 4, the table's dim is 3");
    uint8_t raw[24] = {0}; /* claims more than it carries: the dispatch table's size check */
    dt_wire_section_encode(raw, TABLE, DIM, 1);
    h.sections.count = 1, h.sections.ids = 1, h.sections.floats = DIM, h.payload_bytes = 24;
    ps_origin o = from(1);
    dt_bytes b = {.data = raw, .size = 16};
    ps_shard_request(s, &o, &h, &b, 0, &io);
    CHECK(last()->h.status == DT_WIRE_E_MALFORMED);
    CHECK_CONTAINS(last()->text, "expected 16");
    /* Bounds the decoder enforces on the header, each named. */
    uint8_t buf[DT_WIRE_HEADER_SIZE];
    dt_wire_header d;
    dt_error e = {0};
    const struct {
        uint64_t count, ids, floats;
        const char *bound;
    } bad[] = {{1, DT_WIRE_MAX_SPARSE_IDS + 1, DT_WIRE_MAX_SPARSE_IDS + 1, "DT_WIRE_MAX_SPARSE_IDS"},
               {1, 2048, 2048 * 1024, "DT_WIRE_MAX_SPARSE_FLOATS"},
               {1, 1, DT_WIRE_MAX_SPARSE_DIM + 1, "DT_WIRE_MAX_SPARSE_DIM"},
               {0, 1, 1, "DT_WIRE_MAX_SPARSE_SECTIONS"},
               {DT_WIRE_MAX_SPARSE_SECTIONS + 1, 2000, 2000, "DT_WIRE_MAX_SPARSE_SECTIONS"},
               {3, 2, 2, "2 ids in 3 sections, must be 3..65536"}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        h.sections.count = bad[k].count, h.sections.ids = bad[k].ids, h.sections.floats = bad[k].floats;
        dt_wire_encode(buf, &h);
        CHECK(dt_wire_decode(&d, buf, sizeof buf, &e) == DT_EFORMAT);
        CHECK_CONTAINS(e.msg, bad[k].bound);
    }
    /* Rows per step: one worker's push of one step, over its parts, holds at most
     * DT_WIRE_MAX_SPARSE_STEP_ROWS rows: 16 parts of 65536 distinct ids fill it, one more id is refused. */
    const size_t per = DT_WIRE_MAX_SPARSE_IDS, parts = DT_WIRE_MAX_SPARSE_STEP_ROWS / per;
    uint64_t *ids = malloc(per * sizeof *ids);
    float *g = calloc(per * DIM, sizeof *g);
    for (size_t p = 0; p < parts; p++) {
        for (size_t i = 0; i < per; i++) ids[i] = p * per + i;
        spush(s, 1, 1, ids, per, g, 0, 1, (int)p, (int)parts + 1);
        CHECK(last()->h.type == DT_MSG_ACK && last()->h.status == DT_WIRE_OK);
    }
    ids[0] = UINT64_MAX;
    spush(s, 1, 1, ids, 1, g, 0, 1, (int)parts, (int)parts + 1);
    CHECK(last()->h.status == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(last()->text, "DT_WIRE_MAX_SPARSE_STEP_ROWS");
    free(ids), free(g);
    ps_shard_stats st;
    ps_shard_get_stats(s, &st);
    CHECK(st.refused == 4); /* refusals are counted as any other */
    shard_done(s);
}

/* ---- Checkpoints: SPARSE_EXPORT pages and SPARSE_IMPORT ------------------------------------------- */

/* TABLE with optimizer `kind` at 0.5, normal initial rows, a capacity of `capacity` rows. */
static void sparse_init_table(ps_shard *s, const char *kind, uint64_t capacity) {
    dt_table_config c = table_config();
    dt_wire_table w = {.table = TABLE, .dim = DIM, .init_kind = DT_ROW_INIT_NORMAL, .init_scale = c.init_scale,
                       .capacity = capacity, .seed = c.seed};
    dt_lazy_config_init(&w.opt, kind, 0.5f, NULL);
    uint8_t rec[DT_WIRE_TABLE_BYTES];
    dt_wire_table_encode(rec, &w);
    sparse_init_raw(s, DT_ROLE_CHIEF, rec, 1);
}

/* What the pages of an export brought: each row (id, its floats) in arrival order. */
enum { MAX_PAGE_ROWS = 8192, ROW = DIM * 3 };
static struct {
    size_t n;
    uint64_t ids[MAX_PAGE_ROWS];
    float rows[MAX_PAGE_ROWS][ROW];
} got;

static void capture_page(const dt_wire_header *h, const void *payload, size_t size) {
    if (h->type != DT_MSG_SPARSE_PAGE) return;
    dt_wire_rows r;
    dt_error e = {0};
    CHECK_MSG(dt_wire_rows_check(&r, h, payload, size, 0, &e) == DT_OK, "%s", e.msg);
    for (size_t i = 0; i < r.n && got.n < MAX_PAGE_ROWS; i++, got.n++) {
        got.ids[got.n] = dt_wire_rows_id(&r, i);
        dt_wire_rows_get(&r, i, got.rows[got.n]);
    }
}

/* SPARSE_EXPORT of TABLE (optimizer kind, dim) from `cursor`, at most max rows: the reply's cursor. */
static int64_t sexport(ps_shard *s, int64_t cursor, uint64_t max, uint8_t kind, uint64_t dim) {
    dt_wire_header h = hdr(DT_MSG_SPARSE_EXPORT, DT_ROLE_CHIEF, 0);
    h.sparse.table = TABLE, h.sparse.ids = max, h.sparse.dim = dim;
    h.opt_kind = kind, h.opt_slots = (uint8_t)dt_lazy_slots((dt_lazy_kind)kind);
    h.cursor = cursor;
    ps_origin o = from(1);
    ps_shard_request(s, &o, &h, NULL, 0, &io);
    return last()->h.type == DT_MSG_SPARSE_PAGE ? last()->h.cursor : -1;
}

/* A whole walk in pages of max rows; how many pages. */
static int walk(ps_shard *s, uint64_t max, uint8_t kind) {
    int pages = 0;
    int64_t c = 0;
    do {
        c = sexport(s, c, max, kind, DIM);
        pages++;
    } while (c > 0 && pages < 1000);
    return c == 0 ? pages : -1;
}

/* SPARSE_IMPORT of ids [n] with rows [n][ROW] (adagrad: 2 floats a value) from role. */
static void simport(ps_shard *s, dt_wire_role role, const uint64_t *ids, const float *rows, size_t n, uint8_t kind) {
    dt_wire_header h = hdr(DT_MSG_SPARSE_IMPORT, role, 0);
    const size_t k = DIM * (1 + (size_t)dt_lazy_slots((dt_lazy_kind)kind));
    h.sparse.table = TABLE, h.sparse.ids = n, h.sparse.dim = DIM;
    h.opt_kind = kind, h.opt_slots = (uint8_t)dt_lazy_slots((dt_lazy_kind)kind);
    h.payload_bytes = n * (8 + 4 * k);
    uint8_t *p = malloc(h.payload_bytes + 1);
    put_ids(p, ids, n);
    for (size_t i = 0; i < n; i++) memcpy(p + 8 * n + 4 * k * i, rows + ROW * i, 4 * k);
    ps_origin o = from(0);
    dt_bytes b = {.data = p, .size = h.payload_bytes, .release = free, .hint = p};
    ps_shard_request(s, &o, &h, &b, 0, &io);
}

static int seen_once(uint64_t lo, uint64_t hi) {
    static uint8_t seen[MAX_PAGE_ROWS];
    memset(seen, 0, sizeof seen);
    for (size_t i = 0; i < got.n; i++) {
        if (got.ids[i] < lo || got.ids[i] >= hi || seen[got.ids[i] - lo]) return 0;
        seen[got.ids[i] - lo] = 1;
    }
    return got.n == hi - lo;
}

/* Pages walk every row once (values, then Adagrad's accumulator), at the table's step; a walk whose
 * rows moved (the index grew under it) starts again and still brings every row. */
static void test_export_pages(void) {
    ps_shard *s = shard_new_n(N);
    shard_init_n(s, N, 1, 0, 2, 0, 0, 0, 0);
    sparse_init_table(s, "adagrad", 100000);
    static uint64_t ids[5000];
    static float g[5000 * DIM];
    for (int i = 0; i < 5000; i++) ids[i] = (uint64_t)i;
    for (int i = 0; i < 5000 * DIM; i++) g[i] = 1.0f;
    spush(s, 1, 1, ids, 3000, g, 0, 0, 0, 1); /* rows 0..2999, each updated once */
    rec_capture = capture_page;
    got.n = 0;
    CHECK(walk(s, 1000, DT_LAZY_ADAGRAD) == 4); /* 3 full pages, then an empty one */
    CHECK(seen_once(0, 3000));
    CHECK(last()->h.global_step == 1 && last()->h.opt_kind == DT_LAZY_ADAGRAD && last()->h.opt_slots == 1);
    float w[DIM];
    initial(ids[42], w);
    int found = 0;
    for (size_t i = 0; i < got.n; i++)
        for (int j = 0; j < DIM && got.ids[i] == 42 && ++found; j++) {
            CHECK_NEAR(got.rows[i][DIM + j], 1.1f, 1e-6);                              /* 0.1 + g^2 */
            CHECK_NEAR(got.rows[i][j], w[j] - 0.5f / sqrtf(1.1f), 1e-6);              /* w - lr g / sqrt(a) */
        }
    CHECK(found == DIM);
    got.n = 0; /* one page, then 2000 more rows: the index doubles, the walk goes on from the start */
    int64_t c = sexport(s, 0, 1000, DT_LAZY_ADAGRAD, DIM);
    spush(s, 1, 1, ids + 3000, 2000, g, 0, 0, 0, 1);
    c = sexport(s, c, 1000, DT_LAZY_ADAGRAD, DIM);
    CHECK(c > 0 && last()->h.sparse.ids == 1000);
    while (c > 0) c = sexport(s, c, 1000, DT_LAZY_ADAGRAD, DIM);
    CHECK(c == 0 && got.n == 6000); /* the first page's rows came twice */
    size_t all = got.n;
    got.n = 0;
    CHECK(walk(s, 4999, DT_LAZY_ADAGRAD) == 2 && seen_once(0, 5000) && all == 6000);
    rec_capture = NULL;
    shard_done(s);
}

/* Rows imported are the table's (values and slots, read back by a pull and an export); each refused
 * import, naming what it breaks, changes nothing: another ps's id, another optimizer, a non-finite
 * value, an accumulator at 0, a worker's. */
static void test_import(void) {
    memset(&rec, 0, sizeof rec);
    ps_shard *s = NULL;
    ps_shard_config cfg = {.ps_index = 0, .n_ps = 2, .shard_floats = N};
    CHECK(ps_shard_new(&s, &cfg, NULL) == DT_OK);
    if (!s) return;
    shard_init_n(s, N, 1, 0, 2, 0, 0, 0, 0);
    sparse_init_table(s, "adagrad", 1000);
    uint64_t ids[3] = {0, 0, 0}, other = 0;
    for (uint64_t id = 0, k = 0; k < 3; id++)
        if (dt_row_ps(TABLE, id, 2) == 0) ids[k++] = id;
    while (dt_row_ps(TABLE, other, 2) != 1) other++;
    static float rows[3][ROW];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < DIM; j++) rows[i][j] = (float)(10 * i + j), rows[i][DIM + j] = 0.5f + (float)i;
    simport(s, DT_ROLE_CHIEF, ids, rows[0], 3, DT_LAZY_ADAGRAD);
    CHECK(last()->h.type == DT_MSG_ACK && last()->h.status == DT_WIRE_OK);
    spull(s, 1, 1, ids, 3, 0, DT_ENC_FP32, 0);
    const float want[3 * DIM] = {0, 1, 2, 10, 11, 12, 20, 21, 22};
    CHECK(rows_are(want, 3, 0));
    rec_capture = capture_page, got.n = 0;
    CHECK(walk(s, 100, DT_LAZY_ADAGRAD) == 1 && got.n == 3);
    for (size_t i = 0; i < got.n; i++)
        for (int k = 0; k < 3; k++)
            if (got.ids[i] == ids[k]) CHECK(!memcmp(got.rows[i], rows[k], sizeof rows[k]));
    rec_capture = NULL;
    uint64_t bad_ids[2] = {ids[0], other};
    simport(s, DT_ROLE_CHIEF, bad_ids, rows[0], 2, DT_LAZY_ADAGRAD);
    CHECK(last()->h.status == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(last()->text, "SPARSE_IMPORT: id");
    CHECK_CONTAINS(last()->text, "belongs to ps 1 of 2 (dt_row_ps), not to this ps 0");
    simport(s, DT_ROLE_CHIEF, ids, rows[0], 1, DT_LAZY_ADAM);
    CHECK_CONTAINS(last()->text, "trained by adam, but the table's optimizer is adagrad");
    rows[1][2] = INFINITY;
    simport(s, DT_ROLE_CHIEF, ids, rows[0], 3, DT_LAZY_ADAGRAD);
    CHECK_CONTAINS(last()->text, "row 1 (id");
    CHECK_CONTAINS(last()->text, "values 0, value 2, inf is not finite");
    rows[1][2] = 12, rows[2][DIM] = 0;
    simport(s, DT_ROLE_CHIEF, ids, rows[0], 3, DT_LAZY_ADAGRAD);
    CHECK_CONTAINS(last()->text, "optimizer slot 0, value 0, 0 must be > 0");
    simport(s, DT_ROLE_WORKER, ids, rows[0], 1, DT_LAZY_ADAGRAD);
    CHECK(last()->h.status == DT_WIRE_E_ROLE);
    sexport(s, 0, 10, DT_LAZY_ADAGRAD, DIM + 1);
    CHECK_CONTAINS(last()->text, "the table's dim is 3");
    spull(s, 1, 1, ids, 3, 0, DT_ENC_FP32, 0); /* nothing changed */
    CHECK(rows_are(want, 3, 0));
    shard_done(s);
}

/* A chief restoring a checkpoint (SPARSE_INIT with IMPORT): every SPARSE_PULL is held, whatever its
 * step, until the chief's SPARSE_IMPORT with LAST, and then answered with the imported rows, not
 * the initial ones (issue 36: a worker's first step after a resume ran on the initial rows). A LAST
 * may carry no row; a SPARSE_IMPORT of no row without LAST is malformed. */
static void test_import_holds_pulls(void) {
    memset(&rec, 0, sizeof rec);
    ps_shard *s = shard_new_n(N);
    shard_init_n(s, N, 1, 2, 2, 0, 1000, 0, 0); /* sync, 2 workers, a worker silent 1 s is lost */
    dt_table_config c = table_config();
    dt_wire_table w = {.table = TABLE, .dim = DIM, .init_kind = DT_ROW_INIT_NORMAL, .init_scale = c.init_scale,
                       .capacity = 1000, .seed = c.seed};
    dt_lazy_config_init(&w.opt, "adagrad", 0.5f, NULL);
    uint8_t record[DT_WIRE_TABLE_BYTES];
    dt_wire_table_encode(record, &w);
    dt_wire_header h = hdr(DT_MSG_SPARSE_INIT, DT_ROLE_CHIEF, 0);
    h.flags = DT_WIRE_F_IMPORT;
    h.sparse.ids = 1;
    h.payload_bytes = DT_WIRE_TABLE_BYTES;
    ps_origin o = from(0);
    dt_bytes b = {.data = record, .size = h.payload_bytes};
    ps_shard_request(s, &o, &h, &b, 0, &io);
    CHECK(last()->h.type == DT_MSG_ACK && last()->h.status == DT_WIRE_OK);
    const uint64_t ids[3] = {4, 9, 700};
    const int before = rec.n;
    spull(s, 1, 1, ids, 3, 0, DT_ENC_FP32, 0); /* step 0: the table's own, answered at once before */
    CHECK(rec.held == 1 && rec.n == before);
    static float rows[3][ROW];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < DIM; j++) rows[i][j] = (float)(10 * i + j), rows[i][DIM + j] = 0.5f;
    simport(s, DT_ROLE_CHIEF, ids, rows[0], 3, DT_LAZY_ADAGRAD);
    CHECK(last()->h.type == DT_MSG_ACK && rec.held == 1);
    /* a held pull waits for the chief: its worker is not lost meanwhile (the chief, silent, is) */
    dt_error err = {0};
    CHECK(ps_shard_cron(s, 2 * SEC, &io, &err) == DT_OK);
    ps_shard_stats st;
    ps_shard_get_stats(s, &st);
    CHECK_MSG(st.live == 1, "%d workers live", st.live);
    simport(s, DT_ROLE_CHIEF, ids, rows[0], 0, DT_LAZY_ADAGRAD); /* no row, no LAST */
    CHECK(last()->h.status == DT_WIRE_E_MALFORMED && rec.held == 1);
    dt_wire_header e = hdr(DT_MSG_SPARSE_IMPORT, DT_ROLE_CHIEF, 0);
    e.flags = DT_WIRE_F_LAST;
    e.sparse.table = TABLE, e.sparse.ids = 0, e.sparse.dim = DIM;
    e.opt_kind = DT_LAZY_ADAGRAD, e.opt_slots = 1;
    ps_shard_request(s, &o, &e, NULL, 0, &io);
    CHECK(rec.held == 0);
    const float want[3 * DIM] = {0, 1, 2, 10, 11, 12, 20, 21, 22};
    CHECK(rows_are(want, 3, 0)); /* the held pull, after the LAST's ACK */
    CHECK(rec.r[rec.n - 2].h.type == DT_MSG_ACK);
    spull(s, 1, 1, ids, 3, 0, DT_ENC_FP32, 0); /* and the next at once */
    CHECK(rec.held == 0 && rows_are(want, 3, 0));
    shard_done(s);
}

/* ---- Seeds for fuzz/fuzz_sparse.c (--write-corpus DIR) ---------------------------------------- */

static int write_seed(const char *dir, const char *name, uint8_t sel, dt_wire_header *h, const uint8_t *payload,
                      size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    h->payload_bytes = n;
    uint8_t head[1 + DT_WIRE_HEADER_SIZE];
    head[0] = sel;
    dt_wire_encode(head + 1, h);
    FILE *f = fopen(path, "wb");
    int bad = !f || fwrite(head, 1, sizeof head, f) != sizeof head || (n && fwrite(payload, 1, n, f) != n);
    if (f) bad |= fclose(f) != 0;
    if (bad) fprintf(stderr, "test_shard_sparse: cannot write %s\n", path);
    return bad;
}

/* Checkpoints' messages for the fuzz target's tables: an export page of table 0 (Adagrad, dim 2) from
 * the start, and an import of two FTRL rows of table 1 (dim 4: values, n, z). */
static int write_ckpt_seeds(const char *dir) {
    dt_wire_header h = dt_wire_header_make(DT_MSG_SPARSE_EXPORT, DT_ROLE_CHIEF, 0, 9);
    h.sparse.table = 0, h.sparse.ids = 3, h.sparse.dim = 2, h.opt_kind = DT_LAZY_ADAGRAD, h.opt_slots = 1;
    int bad = write_seed(dir, "export", 2, &h, NULL, 0);
    uint8_t p[2 * 8 + 2 * 12 * 4];
    const uint64_t ids[2] = {3, 8};
    put_ids(p, ids, 2);
    for (int i = 0; i < 24; i++) {
        float v = i % 12 < 4 ? 0.5f * (float)(i - 6) : i % 12 < 8 ? 0.1f * (float)i : -0.25f;
        memcpy(p + 16 + 4 * i, &v, 4);
    }
    h = dt_wire_header_make(DT_MSG_SPARSE_IMPORT, DT_ROLE_CHIEF, 0, 9);
    h.sparse.table = 1, h.sparse.ids = 2, h.sparse.dim = 4, h.opt_kind = DT_LAZY_FTRL, h.opt_slots = 2;
    return bad | write_seed(dir, "import", 4, &h, p, sizeof p);
}

/* A seed of a SPARSE_PULL or SPARSE_PUSH of sections [k]; a push's rows packed in h's encoding. */
static int write_sections_seed(const char *dir, const char *name, uint8_t sel, dt_wire_header h, const sec_in *sec,
                               size_t k) {
    const uint8_t enc = h.encoding;
    h.encoding = 0;
    uint8_t *p = sections_payload(&h, sec, k);
    if (h.type == DT_MSG_SPARSE_PUSH && enc) { /* the rows again, 2 bytes a value */
        const size_t at = dt_wire_sections_rows_at(&h), n = h.sections.floats;
        float *f = malloc(4 * n + 4);
        memcpy(f, p + at, 4 * n);
        dt_pack(enc, p + at, f, n);
        free(f);
        h.payload_bytes = at + 2 * n;
    }
    h.encoding = enc;
    int bad = write_seed(dir, name, sel, &h, p, h.payload_bytes);
    free(p);
    return bad;
}

/* The fuzz target's shard has tables 0 (dim 2) and 1 (dim 4); the selector: bit 0 sync, bit 1
 * admission and a capacity of 4, bit 2 the message twice, bit 3 table 0 of 1000 buckets, bit 4 sync
 * with 64 replicas at staleness 64. */
static int write_corpus(const char *dir) {
    uint8_t rec[2 * DT_WIRE_TABLE_BYTES];
    const uint64_t ids[4] = {1, 1, 5, UINT64_MAX};
    float g[16];
    for (int i = 0; i < 16; i++) g[i] = 0.25f * (float)(i - 8);
    int bad = 0;
    dt_wire_header h = dt_wire_header_make(DT_MSG_SPARSE_PULL, DT_ROLE_WORKER, 1, 9);
    sec_in sec[2] = {{0, 2, 3, ids, g}, {1, 4, 2, ids + 2, g}};
    bad |= write_sections_seed(dir, "pull", 0, h, sec, 1);
    bad |= write_sections_seed(dir, "pull_two_tables", 0, h, sec, 2);
    h.encoding = DT_ENC_BF16, h.global_step = 1;
    bad |= write_sections_seed(dir, "pull_deferred_bf16", 1, h, sec + 1, 1);
    sec_in twice[2] = {{1, 4, 1, ids, NULL}, {1, 4, 1, ids, NULL}}; /* refused: table 1 named twice */
    bad |= write_sections_seed(dir, "pull_table_twice", 0, h, twice, 2);
    h = dt_wire_header_make(DT_MSG_SPARSE_PUSH, DT_ROLE_WORKER, 1, 9);
    sec[0].n = 4;
    bad |= write_sections_seed(dir, "push_async", 2, h, sec, 2);
    h.encoding = DT_ENC_FP16;
    bad |= write_sections_seed(dir, "push_async_fp16", 6, h, sec, 1);
    h = dt_wire_header_make(DT_MSG_SPARSE_PUSH, DT_ROLE_WORKER, 1, 9);
    h.flags = DT_WIRE_F_SYNC, h.chunk = 0, h.chunks = 2;
    bad |= write_sections_seed(dir, "push_sync_parts", 5, h, sec, 2);
    sec[0].n = sec[1].n = 0, h.chunks = 1;
    bad |= write_sections_seed(dir, "push_sync_empty", 1, h, sec, 2);
    h = dt_wire_header_make(DT_MSG_SPARSE_INIT, DT_ROLE_CHIEF, 0, 9);
    for (int t = 0; t < 2; t++) {
        dt_table_config c = table_config();
        dt_wire_table w = {.table = (uint32_t)t + 7, .dim = 3, .init_kind = 1, .flags = (uint8_t)t, .min_count = 3,
                           .opt = c.opt, .init_scale = 0.05f, .capacity = 100, .expire_steps = 5, .seed = 1};
        if (t) dt_lazy_config_init(&w.opt, "adam", 0.01f, NULL);
        dt_wire_table_encode(rec + t * DT_WIRE_TABLE_BYTES, &w);
    }
    h.sparse.ids = 2;
    bad |= write_seed(dir, "init", 0, &h, rec, sizeof rec);
    for (int t = 0; t < 2; t++) { /* past the fuzz shard's table memory: refused before any is built */
        dt_wire_table w = {.table = (uint32_t)t, .dim = 64, .flags = t ? DT_WIRE_TABLE_F_BUCKETS : 0,
                           .capacity = DT_TABLE_MAX_ROWS, .min_count = 2};
        dt_lazy_config_init(&w.opt, "adam", 0.01f, NULL);
        dt_wire_table_encode(rec + t * DT_WIRE_TABLE_BYTES, &w);
    }
    bad |= write_seed(dir, "init_past_memory", 0, &h, rec, sizeof rec);
    /* 1,024 tables of one row whose sync accumulators (65 x 64 entries each) pass the table memory:
     * refused before any is built (they were not counted: 477 MiB allocated) */
    static uint8_t many[DT_WIRE_MAX_TABLES * DT_WIRE_TABLE_BYTES];
    for (uint32_t t = 0; t < DT_WIRE_MAX_TABLES; t++) {
        dt_table_config c = table_config();
        dt_wire_table w = {.table = t, .dim = 1, .opt = c.opt, .capacity = 1, .seed = 1};
        dt_wire_table_encode(many + t * DT_WIRE_TABLE_BYTES, &w);
    }
    h.sparse.ids = DT_WIRE_MAX_TABLES;
    bad |= write_seed(dir, "init_sync_accumulators", 16, &h, many, sizeof many);
    h = dt_wire_header_make(DT_MSG_SPARSE_PULL, DT_ROLE_WORKER, 1, 9);
    const uint64_t beyond[2] = {999, 1000}; /* the second beyond table 0's buckets: refused */
    sec_in buckets = {0, 2, 2, beyond, NULL};
    bad |= write_sections_seed(dir, "pull_beyond_buckets", 8, h, &buckets, 1);
    h = dt_wire_header_make(DT_MSG_SPARSE_ROWS, DT_ROLE_PS, 0, 9);
    h.sections.count = 1, h.sections.ids = 2, h.sections.floats = 4;
    bad |= write_seed(dir, "rows", 0, &h, (const uint8_t *)g, 16);
    return bad | write_ckpt_seeds(dir);
}

static ps_shard *shard_with_memory(uint64_t table_memory) {
    memset(&rec, 0, sizeof rec);
    ps_shard *s = NULL;
    ps_shard_config cfg = {.ps_index = 0, .n_ps = 1, .shard_floats = N, .table_memory = table_memory,
                           .log = getenv("DT_TEST_VERBOSE") ? stderr : NULL};
    CHECK(ps_shard_new(&s, &cfg, NULL) == DT_OK);
    return s;
}

/* What a declaration makes the ps allocate counts against its table memory before it is made
 * (issue 40, item 4): SPARSE_INIT's sync accumulators (each table's (staleness + 1) x
 * replicas_to_aggregate entries) beside INIT's, at the bound declared and a byte less refused; a
 * forged INIT of 1,008 replicas at staleness 64 and 1,024 tables of one row (some 7 GiB of
 * accumulators: the ps took 459 MiB for one such table before, counting 0.0 MiB) refused before any
 * is built; an INIT whose accumulators alone pass the table memory refused, the old INIT kept. */
static void test_accumulators_counted(void) {
    const dt_table_config c = table_config();
    const uint64_t acc = shard_table_acc_bytes(2, 1), sync = shard_sync_bytes(1, 2, 2, 1);
    const uint64_t need = dt_table_bytes_at(&c, c.capacity) + acc + sync;
    /* not a figure taken on trust: at least the row sums of 2 x 2 entries and 2 x 2 gradients held */
    CHECK(acc >= 4 * sizeof(dt_rowsum) && sync >= 4 * sizeof(dt_bytes));
    for (int less = 0; less < 2; less++) {
        ps_shard *s = shard_with_memory(need - (uint64_t)less);
        if (!s) return;
        shard_init_n(s, N, 1, 2, 2, 1, 0, 0, 0);
        CHECK(last()->h.type == DT_MSG_ACK);
        sparse_init(s, 0);
        ps_shard_stats st;
        ps_shard_get_stats(s, &st);
        if (!less) {
            CHECK_MSG(last()->h.type == DT_MSG_ACK, "at the bound: %s", last()->text);
            CHECK(st.sparse.tables == 1 && st.sync_bytes == sync && st.sparse.bytes >= acc); /* the ps's own */
        } else {
            CHECK(last()->h.type == DT_MSG_ERROR && last()->h.status == DT_WIRE_E_BAD_VALUE);
            char want[160];
            snprintf(want, sizeof want, "of it sync accumulators (2 replicas to aggregate, staleness 1: %.1f MiB for "
                     "each table", acc / 1048576.0);
            CHECK_CONTAINS(last()->text, want);
            CHECK(st.sparse.tables == 0);
        }
        shard_done(s);
    }
    ps_shard *s = shard_with_memory(UINT64_C(256) << 20);
    if (!s) return;
    shard_init_n(s, N, 4, 1008, 1008, 64, 0, 0, 0);
    CHECK_MSG(last()->h.type == DT_MSG_ACK, "%s", last()->text);
    static uint8_t recs[DT_WIRE_MAX_TABLES * DT_WIRE_TABLE_BYTES];
    for (uint32_t t = 0; t < DT_WIRE_MAX_TABLES; t++) {
        dt_wire_table w = {.table = t, .dim = 1, .opt = c.opt, .capacity = 1, .seed = 7};
        dt_wire_table_encode(recs + t * DT_WIRE_TABLE_BYTES, &w);
    }
    sparse_init_raw(s, DT_ROLE_CHIEF, recs, DT_WIRE_MAX_TABLES);
    CHECK(last()->h.type == DT_MSG_ERROR && last()->h.status == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(last()->text, "the 1024 table(s) would hold up to");
    CHECK_CONTAINS(last()->text, "of it sync accumulators (1008 replicas to aggregate, staleness 64");
    ps_shard_stats st;
    ps_shard_get_stats(s, &st);
    CHECK(st.sparse.tables == 0 && st.sync_bytes >= (uint64_t)4 * 65 * 1008 * sizeof(dt_bytes));
    shard_done(s);
    /* INIT's own accumulators past the table memory: refused, the ps as it was */
    s = shard_with_memory(UINT64_C(1) << 20);
    if (!s) return;
    shard_init_n(s, N, 1, 0, 2, 0, 0, 0, 0);
    CHECK(last()->h.type == DT_MSG_ACK);
    shard_init_n(s, N, 4, 1008, 1008, 64, 0, 0, 0);
    CHECK(last()->h.type == DT_MSG_ERROR && last()->h.status == DT_WIRE_E_BAD_VALUE);
    CHECK_CONTAINS(last()->text, "INIT's sync configuration (1008 of 1008 workers, staleness 64, 4 chunks) would hold");
    CHECK_CONTAINS(last()->text, "over its table memory of 1.0 MiB (--ps_table_memory)");
    ps_shard_get_stats(s, &st);
    CHECK(st.workers == 2 && st.sync_bytes == 0);
    shard_done(s);
}

/* A SPARSE_INIT in sync mode whose allocations fail one after another, each place in turn: refused
 * with status 112 (out of memory) or declared, never a crash (a table whose accumulators failed part
 * way was freed through a NULL entry array: SIGSEGV in release, UB under the sanitizer), and the
 * shard takes a SPARSE_INIT after. */
static void test_sparse_init_allocation_failures(void) {
    ps_shard *s = shard_new_n(N);
    if (!s) return;
    shard_init_n(s, N, 1, 2, 2, 3, 0, 0, 0);
    int refused = 0, declared = 0;
    for (long k = 1; k <= 40; k++) {
        dt_alloc_fail_after(k);
        sparse_init(s, 0);
        dt_alloc_fail_after(0);
        if (last()->h.type == DT_MSG_ERROR) {
            CHECK_MSG(last()->h.status == DT_WIRE_E_NOMEM, "allocation %ld: %s", k, last()->text);
            refused++;
        } else {
            CHECK(last()->h.type == DT_MSG_ACK);
            declared++;
        }
        rec.n = 0;
    }
    CHECK_MSG(refused >= 5 && declared >= 1, "%d refused, %d declared", refused, declared);
    sparse_init(s, 0);
    CHECK(last()->h.type == DT_MSG_ACK);
    shard_done(s);
}

/* Tables declared just below the most a header carries (DT_WIRE_MAX_STEP, 2^62): a push applied
 * there (async, and sync with 1 of 1), the table one step on, a pull held up to step + staleness + 2
 * and refused beyond; the sanitizer build checks that none of it overflows (it did at 2^63 - 1, which
 * the decoder now refuses: test_wire.c). */
static void test_steps_at_the_bound(void) {
    const int64_t b = DT_WIRE_MAX_STEP - 8;
    uint64_t id = 10;
    const float g[DIM] = {1, 2, 3};
    float want[DIM];
    init_step = b;
    for (int sync = 0; sync < 2; sync++) {
        ps_shard *s = shard_new_n(N);
        shard_init_n(s, N, 1, sync, sync ? 1 : 2, sync, 0, 0, 0);
        sparse_init(s, 0);
        CHECK_MSG(last()->h.type == DT_MSG_ACK, "%s", last()->text);
        spush(s, 1, 0, &id, 1, g, b, sync, 0, 1);
        CHECK(last()->h.type == DT_MSG_ACK && last()->h.status == DT_WIRE_OK);
        initial(id, want);
        for (int j = 0; j < DIM; j++) want[j] -= 0.5f * g[j];
        spull(s, 1, 0, &id, 1, b + 1, DT_ENC_FP32, 0);
        CHECK(rows_are(want, 1, b + 1));
        if (sync) {
            const int replies = rec.n;
            spull(s, 2, 0, &id, 1, b + 4, DT_ENC_FP32, 0); /* step + staleness + 2: held */
            CHECK(rec.n == replies);
            spull(s, 3, 0, &id, 1, b + 5, DT_ENC_FP32, 0);
            CHECK(last()->h.type == DT_MSG_ERROR && last()->h.status == DT_WIRE_E_BAD_VALUE);
        }
        shard_done(s);
    }
    init_step = 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--write-corpus")) return write_corpus(argv[2]);
    RUN(test_init_conditions);
    RUN(test_async_pull_push);
    RUN(test_sync_two_replicas);
    RUN(test_sync_row_mean);
    RUN(test_deferred_pulls);
    RUN(test_prefetched_pull_is_no_barrier_wait);
    RUN(test_hostile);
    RUN(test_sections);
    RUN(test_ownership);
    RUN(test_table_memory);
    RUN(test_export_pages);
    RUN(test_import);
    RUN(test_steps_at_the_bound);
    RUN(test_accumulators_counted);
    RUN(test_sparse_init_allocation_failures);
    RUN(test_import_holds_pulls);
    return test_summary();
}
