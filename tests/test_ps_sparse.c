/* Sparse tables through a real ps (its ZeroMQ loop, tests/ps_harness.h) and a raw DEALER: the
 * largest sparse messages of one table (65536 ids of dim 16, 4.5 MiB) pass the ps's frame bound, rows come back
 * as initial values, a push updates them, and a header beyond a bound, or a 16-bit push sized for
 * float32 rows, is refused with its name while the ps serves on. */
#include "compute/lazy_optim.h"
#include "ps/table.h"

#include "ps_harness.h"

enum { N = 4, DIM = 16, IDS = DT_WIRE_MAX_SPARSE_FLOATS / DIM };

static uint32_t next_id = 100;

/* Sends h with payload [size] (copied) and waits for the reply. */
static int ask(void *s, dt_wire_header *h, const void *payload, size_t size, dt_wire_in *in) {
    h->request_id = next_id++;
    zmq_msg_t m;
    zmq_msg_init_size(&m, size);
    if (size) memcpy(zmq_msg_data(&m), payload, size);
    dt_error e = {0};
    if (dt_wire_send(s, NULL, h, size ? &m : NULL, 0, &e)) {
        fprintf(stderr, "  send: %s\n", e.msg);
        return DT_ENET;
    }
    if (!size) zmq_msg_close(&m);
    return raw_reply(s, in);
}

static void test_sparse_through_the_loop(void) {
    ps_thread ps;
    ps_start(&ps, 0, N, NULL, 0);
    const size_t sizes[1] = {N};
    dt_ps_client *chief = client(1, &ps, sizes, DT_ROLE_CHIEF, 0);
    float p[N] = {0};
    const float *src[1] = {p};
    dt_opt_config opt;
    dt_opt_config_init(&opt, "sgd", 0.1f, NULL);
    dt_error e = {0};
    CHECK(chief && dt_ps_client_init(chief, &opt, src, NULL, NULL, 0, &e) == DT_OK);
    void *ctx = zmq_ctx_new();
    void *s = dt_zsock_open(ctx, ZMQ_DEALER, dt_wire_max_frame(N), 0, 3000, NULL);
    zmq_connect(s, ps.endpoint);
    dt_wire_in in;
    /* The table: dim 16, adagrad at 0.5, uniform initial rows. */
    dt_table_config c = {.table = 2, .dim = DIM, .capacity = 2 * IDS, .init = DT_ROW_INIT_UNIFORM, .init_scale = 0.2f,
                         .seed = 5};
    dt_lazy_config_init(&c.opt, "adagrad", 0.5f, NULL);
    dt_wire_table w = {.table = 2, .dim = DIM, .init_kind = DT_ROW_INIT_UNIFORM, .opt = c.opt, .init_scale = 0.2f,
                       .capacity = c.capacity, .seed = 5};
    uint8_t rec[DT_WIRE_TABLE_BYTES];
    dt_wire_table_encode(rec, &w);
    dt_wire_header h = dt_wire_header_make(DT_MSG_SPARSE_INIT, DT_ROLE_CHIEF, 0, 0);
    h.sparse.ids = 1;
    CHECK(ask(s, &h, rec, sizeof rec, &in) == DT_OK && in.hdr.type == DT_MSG_ACK);
    dt_wire_in_close(&in);
    /* The largest push of one table: 65536 ids (every 7th), a gradient of 1 everywhere; its one section
     * record first. */
    const size_t bytes = 8 + 8 * (size_t)IDS + 4 * (size_t)IDS * DIM;
    uint8_t *msg = malloc(bytes), *ids = msg + 8;
    dt_wire_section_encode(msg, 2, DIM, IDS);
    for (size_t i = 0; i < IDS; i++)
        for (int b = 0; b < 8; b++) ids[8 * i + (size_t)b] = (uint8_t)((7 * i) >> (8 * b));
    const float one = 1.0f;
    for (size_t i = 0; i < (size_t)IDS * DIM; i++) memcpy(ids + 8 * (size_t)IDS + 4 * i, &one, 4);
    h = dt_wire_header_make(DT_MSG_SPARSE_PUSH, DT_ROLE_WORKER, 0, 0);
    h.sections.count = 1, h.sections.ids = IDS, h.sections.floats = (uint64_t)IDS * DIM;
    CHECK(bytes + 8 * (DT_WIRE_MAX_SPARSE_SECTIONS - 1) == dt_wire_sparse_max_frame());
    CHECK(ask(s, &h, msg, bytes, &in) == DT_OK && in.hdr.type == DT_MSG_ACK && in.hdr.status == DT_WIRE_OK);
    dt_wire_in_close(&in);
    /* Pull them all back (4 MiB of rows) and one never pushed (id 1). */
    ids[8] = 1; /* the second id, 7, becomes 1 */
    h = dt_wire_header_make(DT_MSG_SPARSE_PULL, DT_ROLE_WORKER, 0, 0);
    h.sections.count = 1, h.sections.ids = IDS, h.sections.floats = (uint64_t)IDS * DIM;
    CHECK(ask(s, &h, msg, 8 + 8 * (size_t)IDS, &in) == DT_OK && in.hdr.type == DT_MSG_SPARSE_ROWS);
    CHECK(zmq_msg_size(&in.payload) == 4 * (size_t)IDS * DIM);
    if (in.hdr.type == DT_MSG_SPARSE_ROWS && zmq_msg_size(&in.payload) == 4 * (size_t)IDS * DIM) {
        const float *rows = zmq_msg_data(&in.payload);
        float init[DIM];
        int right = 0;
        for (size_t i = 0; i < IDS; i += 97) {
            dt_table_init_row(&c, i == 1 ? 1 : 7 * i, init);
            /* adagrad: a = 0.1 + 1, w -= 0.5 * 1 / sqrt(a) */
            float want = i == 1 ? init[3] : init[3] - 0.5f * 1.0f / sqrtf(0.1f + 1.0f);
            right += fabsf(rows[i * DIM + 3] - want) < 1e-6f;
        }
        dt_table_init_row(&c, 1, init);
        CHECK(rows[DIM + 5] == init[5]);
        CHECK_MSG(right == (IDS + 96) / 97, "%d rows right", right);
        CHECK(in.hdr.global_step == 1);
    }
    dt_wire_in_close(&in);
    /* Beyond a bound: refused by the decoder before the payload, and the ps serves on. */
    h = dt_wire_header_make(DT_MSG_SPARSE_PULL, DT_ROLE_WORKER, 0, 0);
    h.sections.count = 1, h.sections.ids = 1, h.sections.floats = DT_WIRE_MAX_SPARSE_DIM + 1;
    uint8_t head[DT_WIRE_HEADER_SIZE];
    h.request_id = next_id++, h.payload_bytes = 0;
    dt_wire_encode(head, &h);
    zmq_send(s, head, sizeof head, 0);
    CHECK(raw_reply(s, &in) == DT_OK && raw_error_says(&in, DT_WIRE_E_MALFORMED, "DT_WIRE_MAX_SPARSE_DIM"));
    dt_wire_in_close(&in);
    h.sections.floats = DIM;
    dt_wire_section_encode(msg, 2, DIM, 1);
    CHECK(ask(s, &h, msg, 16, &in) == DT_OK && in.hdr.type == DT_MSG_SPARSE_ROWS);
    dt_wire_in_close(&in);
    /* 16-bit rows (--compression bf16): a push whose payload is sized for float32 rows is refused
     * naming the size its sections, ids, floats and encoding make; one of 8 + ids x (8 + 2 dim) bytes
     * is taken. */
    h = dt_wire_header_make(DT_MSG_SPARSE_PUSH, DT_ROLE_WORKER, 0, 0);
    h.sections.count = 1, h.sections.ids = 2, h.sections.floats = 2 * DIM, h.encoding = DT_ENC_BF16;
    dt_wire_section_encode(msg, 2, DIM, 2);
    memset(msg + 24, 0, 4 * DIM * 2);
    CHECK(ask(s, &h, msg, 24 + 4 * DIM * 2, &in) == DT_OK &&
          raw_error_says(&in, DT_WIRE_E_MALFORMED, "expected 88 (1 sections, 2 ids, 32 floats, encoding bf16)"));
    dt_wire_in_close(&in);
    CHECK(ask(s, &h, msg, 24 + 2 * DIM * 2, &in) == DT_OK && in.hdr.type == DT_MSG_ACK && in.hdr.status == DT_WIRE_OK);
    dt_wire_in_close(&in);
    free(msg);
    zmq_close(s);
    zmq_ctx_term(ctx);
    dt_ps_client_close(chief);
    CHECK(ps_stop(&ps) == DT_EINTR);
}

/* Where the split call's replies go: the step and the first value of the row. */
typedef struct {
    int rows;
    int64_t step;
    float v;
} got_rows;

static int on_rows(void *user, int ps, int k, const dt_wire_header *h, const void *payload, size_t len, dt_error *err) {
    (void)ps, (void)k, (void)err;
    got_rows *g = user;
    if (h->type == DT_MSG_SPARSE_ROWS && len >= 4) g->rows++, g->step = h->global_step, memcpy(&g->v, payload, 4);
    return DT_OK;
}

/* One sparse message: table 0 of dim 1, id 5; a push carries a gradient of 1 for step `step`. */
static dt_sparse_msg sparse_msg(uint8_t *buf, int push, int64_t step) {
    dt_wire_section_encode(buf, 0, 1, 1);
    for (int b = 0; b < 8; b++) buf[8 + b] = b ? 0 : 5;
    const float one = 1.0f;
    memcpy(buf + 16, &one, 4);
    dt_sparse_msg m = {.h = dt_wire_header_make(push ? DT_MSG_SPARSE_PUSH : DT_MSG_SPARSE_PULL, 0, 0, 0),
                       .payload = buf, .bytes = push ? 20 : 16};
    m.h.sections.count = 1, m.h.sections.ids = 1, m.h.sections.floats = 1;
    if (push) m.h.local_step = step, m.h.flags = DT_WIRE_F_SYNC, m.h.chunks = 1;
    else m.h.global_step = step;
    return m;
}

/* The sparse call in two halves (the prefetch's, worker/sparse_prefetch.h), on a second connection
 * of a sync worker: a pull of step 1 sent before the push of step 0 is held by the ps until that
 * step is applied, and comes back with the updated row; the client refuses another call meanwhile;
 * a pull ended unanswered (abandoned) leaves the client usable, its late reply ignored. */
static void test_split_call_sync(void) {
    ps_thread ps;
    ps_start(&ps, 0, N, NULL, 0);
    const size_t sizes[1] = {N};
    dt_ps_client *chief = client_sync(1, &ps, sizes, DT_ROLE_CHIEF, 0, 1, 1, 0);
    dt_ps_client *ahead = client_sync(1, &ps, sizes, DT_ROLE_CHIEF, 0, 1, 1, 0);
    float p[N] = {0};
    const float *src[1] = {p};
    dt_opt_config opt;
    dt_opt_config_init(&opt, "sgd", 0.1f, NULL);
    dt_error e = {0};
    CHECK(chief && ahead && dt_ps_client_init(chief, &opt, src, NULL, NULL, 0, &e) == DT_OK);
    if (!chief || !ahead) goto out;
    dt_wire_table w = {.table = 0, .dim = 1, .init_kind = DT_ROW_INIT_ZEROS, .capacity = 100, .seed = 1};
    dt_lazy_config_init(&w.opt, "sgd", 0.5f, NULL);
    uint8_t rec[DT_WIRE_TABLE_BYTES], pull[20], push[20];
    dt_wire_table_encode(rec, &w);
    dt_sparse_msg init = {.h = dt_wire_header_make(DT_MSG_SPARSE_INIT, 0, 0, 0), .payload = rec, .bytes = sizeof rec};
    init.h.sparse.ids = 1;
    const int one[1] = {1};
    dt_sparse_msg *row[1] = {&init};
    got_rows g = {0};
    CHECK_MSG(dt_ps_client_sparse(chief, one, row, on_rows, &g, &e) == DT_OK, "%s", e.msg);
    dt_sparse_msg pm = sparse_msg(pull, 0, 1), um = sparse_msg(push, 1, 0);
    int sent = 0;
    row[0] = &pm;
    CHECK_MSG(dt_ps_client_sparse_send(ahead, one, row, on_rows, &g, &sent, &e) == DT_OK && sent, "%s", e.msg);
    got_rows other = {0};
    CHECK(dt_ps_client_sparse(ahead, one, row, on_rows, &other, &e) == DT_EINVAL); /* one call at a time */
    sleep_ms(50);
    row[0] = &um;
    CHECK_MSG(dt_ps_client_sparse(chief, one, row, on_rows, &other, &e) == DT_OK, "%s", e.msg); /* step 0 applied */
    CHECK(g.rows == 0); /* nothing read before the end */
    CHECK_MSG(dt_ps_client_sparse_end(ahead, DT_OK, &e) == DT_OK, "%s", e.msg);
    CHECK(g.rows == 1 && g.step == 1 && g.v == -0.5f); /* sgd at 0.5, a gradient of 1 from 0 */
    /* Abandoned: a pull of step 2 ended at once, unanswered; step 1 is then applied, which answers it
     * late; the next pull of step 2 takes its own reply only (-1: two gradients of 1). */
    pm = sparse_msg(pull, 0, 2);
    row[0] = &pm;
    g = (got_rows){0};
    CHECK(dt_ps_client_sparse_send(ahead, one, row, on_rows, &g, &sent, &e) == DT_OK && sent);
    CHECK(dt_ps_client_sparse_end(ahead, DT_EINTR, &e) == DT_EINTR && g.rows == 0);
    um = sparse_msg(push, 1, 1);
    row[0] = &um;
    CHECK_MSG(dt_ps_client_sparse(chief, one, row, on_rows, &other, &e) == DT_OK, "%s", e.msg);
    sleep_ms(50);
    row[0] = &pm;
    CHECK_MSG(dt_ps_client_sparse(ahead, one, row, on_rows, &g, &e) == DT_OK, "%s", e.msg);
    CHECK_MSG(g.rows == 1 && g.step == 2 && g.v == -1.0f, "%d replies taken, step %lld, value %g", g.rows,
              (long long)g.step, (double)g.v);
out:
    dt_ps_client_close(ahead);
    dt_ps_client_close(chief);
    CHECK(ps_stop(&ps) == DT_EINTR);
}

int main(void) {
    RUN(test_split_call_sync);
    RUN(test_sparse_through_the_loop);
    return test_summary();
}
