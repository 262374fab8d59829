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

int main(void) {
    RUN(test_sparse_through_the_loop);
    return test_summary();
}
