/* The wire protocol: byte layout, round trip of every message type, and every refusal (magic,
 * version, size, type, fields, payload bounds), in memory and through real ZeroMQ sockets. */
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include <math.h>

#include "compute/lazy_optim.h"
#include "core/clock.h"
#include "io/bytes.h"
#include "test.h"
#include "transport/wire.h"
#include "transport/zmq_io.h"

/* A header with every field set to a distinct value valid for its type. */
static dt_wire_header sample(uint8_t type) {
    dt_wire_header h = dt_wire_header_make((dt_msg_type)type, DT_ROLE_WORKER, 513, 0xA1B2C3D4u);
    h.global_step = 0x0102030405060708LL;
    h.local_step = 77;
    h.shard = 3;
    h.status = -5;
    h.shard_floats = 1000;
    h.generation = 1;
    h.counters[0] = 0xFFFFFFFFFFull + type;
    h.counters[1] = 42;
    h.counters[2] = 0x1122334455667788ull;
    if (type == DT_MSG_INIT) { /* sync: aggregate 2 of 3 replicas, staleness 1 */
        h.init.replicas_to_aggregate = 2;
        h.init.total_num_replicas = 3;
        h.init.staleness = 1;
    }
    if (type == DT_MSG_PULL) h.flags = DT_WIRE_F_EXACT;
    if (type == DT_MSG_PUSH) h.flags = DT_WIRE_F_SYNC;
    if (type == DT_MSG_WORK_ASK) h.flags = DT_WIRE_F_JOIN;
    if (type == DT_MSG_WORK_DONE) h.counters[2] = 0;
    if (type == DT_MSG_PUSH) h.push.examples = DT_WIRE_MAX_EXAMPLES;
    if (type == DT_MSG_PULL) h.encoding = DT_ENC_FP16;
    if (type == DT_MSG_PUSH || type == DT_MSG_PARAMS) h.encoding = DT_ENC_BF16;
    if (type == DT_MSG_INIT || type == DT_MSG_WELCOME || type == DT_MSG_STATE) {
        h.opt_kind = 2;
        h.opt_slots = 2;
        h.learning_rate = 1e-4f;
        h.momentum = 0.9f;
        h.beta1 = 0.9f;
        h.beta2 = 0.999f;
        h.epsilon = 1e-8f;
    }
    if (dt_wire_type_has_payload(type)) h.payload_bytes = type == DT_MSG_ERROR ? 17 : 4000;
    if (dt_wire_type_is_sparse(type)) { /* within the sparse bounds */
        h.sparse.table = type == DT_MSG_SPARSE_INIT ? 0 : 3;
        h.sparse.ids = type == DT_MSG_SPARSE_INIT ? 2 : 10;
        h.sparse.dim = type == DT_MSG_SPARSE_INIT ? 0 : 4;
        if (dt_wire_type_has_sections(type)) h.sections.count = 2, h.sections.ids = 10, h.sections.floats = 40;
        h.encoding = type == DT_MSG_SPARSE_INIT || type >= DT_MSG_SPARSE_EXPORT ? 0 : DT_ENC_BF16;
        if (type == DT_MSG_SPARSE_PUSH) h.flags = DT_WIRE_F_SYNC, h.chunk = 1, h.chunks = 3;
        if (type >= DT_MSG_SPARSE_EXPORT) h.opt_kind = DT_LAZY_ADAM, h.opt_slots = 2; /* rows with their slots */
        h.payload_bytes = dt_wire_sparse_bytes(&h);
    }
    return h;
}

static int same(const dt_wire_header *a, const dt_wire_header *b) {
    return a->type == b->type && a->flags == b->flags && a->encoding == b->encoding && a->role == b->role && a->task == b->task &&
           a->request_id == b->request_id && a->global_step == b->global_step &&
           a->local_step == b->local_step && a->payload_bytes == b->payload_bytes && a->shard == b->shard &&
           a->status == b->status && a->shard_floats == b->shard_floats && a->opt_kind == b->opt_kind &&
           a->opt_slots == b->opt_slots && a->generation == b->generation &&
           a->learning_rate == b->learning_rate && a->momentum == b->momentum && a->beta1 == b->beta1 &&
           a->beta2 == b->beta2 && a->epsilon == b->epsilon && a->counters[0] == b->counters[0] &&
           a->counters[1] == b->counters[1] && a->counters[2] == b->counters[2] && b->version == DT_WIRE_VERSION;
}

static void test_round_trip_every_type(void) {
    for (int t = 1; t <= DT_MSG_TYPE_MAX; t++) {
        dt_wire_header h = sample((uint8_t)t), d;
        uint8_t buf[DT_WIRE_HEADER_SIZE];
        dt_wire_encode(buf, &h);
        dt_error e = {0};
        int rc = dt_wire_decode(&d, buf, sizeof buf, &e);
        CHECK_MSG(rc == DT_OK, "type %d: %s", t, e.msg);
        CHECK_MSG(same(&h, &d), "type %s did not round-trip", dt_wire_type_name((uint8_t)t));
        CHECK(strcmp(dt_wire_type_name((uint8_t)t), "unknown") != 0);
    }
}

/* The documented offsets (docs/protocol.md), checked byte by byte. */
static void test_byte_layout(void) {
    dt_wire_header h = sample(DT_MSG_PUSH);
    uint8_t b[DT_WIRE_HEADER_SIZE];
    dt_wire_encode(b, &h);
    CHECK(memcmp(b, "DTRN", 4) == 0);
    CHECK(b[4] == DT_WIRE_VERSION && b[5] == 0);
    CHECK(b[6] == DT_MSG_PUSH && b[7] == (DT_WIRE_F_SYNC | DT_ENC_BF16 << 4) && b[8] == DT_ROLE_WORKER && b[9] == 0);
    CHECK(b[10] == 0x01 && b[11] == 0x02);                       /* task 513, little endian */
    CHECK(b[12] == 0xD4 && b[13] == 0xC3 && b[14] == 0xB2 && b[15] == 0xA1);
    CHECK(b[16] == 0x08 && b[23] == 0x01);                       /* global step */
    CHECK(b[24] == 77);
    CHECK(b[32] == 0xA0 && b[33] == 0x0F);                       /* payload 4000 */
    CHECK(b[40] == 3);
    CHECK(b[44] == 0xFB && b[47] == 0xFF);                       /* status -5 */
    CHECK(b[48] == 0xE8 && b[49] == 0x03);                       /* shard floats 1000 */
    CHECK(b[58] == 1);
    CHECK(b[88] == 42);
    CHECK(b[96] == 0x88 && b[103] == 0x11);
    dt_wire_header init = sample(DT_MSG_INIT);
    dt_wire_encode(b, &init);
    float lr;
    memcpy(&lr, b + 60, 4); /* little-endian host: the IEEE bits as written */
    CHECK(b[56] == 2 && b[57] == 2 && lr == 1e-4f);
}

/* Each message's named fields sit where docs/protocol.md puts them: INIT's liveness timeout in
 * bytes 24-31, its sync configuration in 80-103, STATUS_REPLY's counters and PARAMS' barrier wait
 * there too, the generation in byte 58. */
static void test_named_fields(void) {
    uint8_t b[DT_WIRE_HEADER_SIZE];
    dt_wire_header init = dt_wire_header_make(DT_MSG_INIT, DT_ROLE_CHIEF, 0, 1);
    init.liveness_ms = 6000;
    init.generation = 9;
    init.init.replicas_to_aggregate = 3;
    init.init.total_num_replicas = 4;
    init.init.staleness = 2;
    dt_wire_encode(b, &init);
    CHECK(b[24] == (6000 & 255) && b[25] == 6000 >> 8 && b[58] == 9);
    CHECK(b[80] == 3 && b[88] == 4 && b[96] == 2);
    dt_wire_header st = dt_wire_header_make(DT_MSG_STATUS_REPLY, DT_ROLE_PS, 0, 1);
    st.status_reply.updates = 11;
    st.status_reply.params_replies = 12;
    st.status_reply.workers_done = 13;
    dt_wire_encode(b, &st);
    CHECK(b[80] == 11 && b[88] == 12 && b[96] == 13);
    dt_wire_header pa = dt_wire_header_make(DT_MSG_PARAMS, DT_ROLE_PS, 0, 1);
    pa.params.waited_us = 250000;
    pa.params.stale_count = 5;
    dt_wire_encode(b, &pa);
    CHECK(b[80] == (250000 & 255) && b[81] == ((250000 >> 8) & 255) && b[82] == 250000 >> 16 && b[88] == 5);
    dt_wire_header ack = dt_wire_header_make(DT_MSG_PUSH_ACK, DT_ROLE_PS, 0, 1), fs = ack;
    ack.push_ack.stale_count = 7;
    dt_wire_encode(b, &ack);
    CHECK(b[80] == 7);
    fs.type = DT_MSG_STATE;
    fs.state.step_max = 99;
    dt_wire_encode(b, &fs);
    CHECK(b[80] == 99);
    /* A PUSH says the examples its gradient averages, at most DT_WIRE_MAX_EXAMPLES. */
    dt_wire_header push = dt_wire_header_make(DT_MSG_PUSH, DT_ROLE_WORKER, 1, 1), d;
    push.push.examples = 300;
    dt_wire_encode(b, &push);
    dt_error e = {0};
    CHECK(b[80] == (300 & 255) && b[81] == 1 && dt_wire_decode(&d, b, sizeof b, &e) == DT_OK && d.push.examples == 300);
    push.push.examples = DT_WIRE_MAX_EXAMPLES + 1;
    dt_wire_encode(b, &push);
    CHECK(dt_wire_decode(&d, b, sizeof b, &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "PUSH header: a gradient of 1048577 examples (bytes 80..87), beyond the bound "
                   "DT_WIRE_MAX_EXAMPLES = 1048576");
}

static int decode_fails(const uint8_t *b, size_t len, int want_rc, const char *needle) {
    dt_wire_header d;
    dt_error e = {0};
    int rc = dt_wire_decode(&d, b, len, &e);
    if (rc != want_rc) {
        fprintf(stderr, "  decode rc %d, expected %d (%s)\n", rc, want_rc, e.msg);
        return 0;
    }
    if (needle && !strstr(e.msg, needle)) {
        fprintf(stderr, "  message \"%s\" lacks \"%s\"\n", e.msg, needle);
        return 0;
    }
    return 1;
}

static void test_refusals(void) {
    dt_wire_header h = sample(DT_MSG_PULL);
    uint8_t good[DT_WIRE_HEADER_SIZE], b[DT_WIRE_HEADER_SIZE + 8];
    dt_wire_encode(good, &h);

    memcpy(b, good, sizeof good);
    b[0] = 'X';
    CHECK(decode_fails(b, sizeof good, DT_EFORMAT, "magic"));

    memcpy(b, good, sizeof good);
    b[4] = 1; /* version 1, and another size: the version is what is reported */
    CHECK(decode_fails(b, 40, DT_EPROTO, "version 1"));
    char ours[48];
    snprintf(ours, sizeof ours, "this program speaks version %u", DT_WIRE_VERSION);
    CHECK(decode_fails(b, sizeof good, DT_EPROTO, ours));

    CHECK(decode_fails(good, 0, DT_EFORMAT, "truncated"));
    CHECK(decode_fails(good, 3, DT_EFORMAT, "truncated"));
    CHECK(decode_fails(good, DT_WIRE_HEADER_SIZE - 1, DT_EFORMAT, "truncated"));
    memcpy(b, good, sizeof good);
    CHECK(decode_fails(b, DT_WIRE_HEADER_SIZE + 8, DT_EFORMAT, "too long"));

    const uint8_t bad_types[] = {0, DT_MSG_TYPE_MAX + 1, 255};
    for (size_t i = 0; i < sizeof bad_types; i++) {
        memcpy(b, good, sizeof good);
        b[6] = bad_types[i];
        CHECK(decode_fails(b, sizeof good, DT_EFORMAT, "unknown message type"));
    }
    memcpy(b, good, sizeof good);
    b[7] = 0x80;
    CHECK(decode_fails(b, sizeof good, DT_EFORMAT, "flags"));
    memcpy(b, good, sizeof good);
    b[7] = DT_WIRE_F_SYNC; /* a PULL may be EXACT, not SYNC */
    CHECK(decode_fails(b, sizeof good, DT_EFORMAT, "flags 0x02"));
    dt_wire_header stat = sample(DT_MSG_STATUS);
    stat.flags = DT_WIRE_F_EXACT;
    uint8_t sb[DT_WIRE_HEADER_SIZE];
    dt_wire_encode(sb, &stat);
    CHECK(decode_fails(sb, sizeof sb, DT_EFORMAT, "STATUS header: unknown flags 0x01"));
    /* its reply (and WELCOME) may say the ps waits for the chief's import of the tables */
    dt_wire_header reply = sample(DT_MSG_STATUS_REPLY), got;
    reply.flags = DT_WIRE_F_IMPORTING;
    uint8_t rb[DT_WIRE_HEADER_SIZE];
    dt_wire_encode(rb, &reply);
    CHECK(dt_wire_decode(&got, rb, sizeof rb, NULL) == DT_OK && got.flags == DT_WIRE_F_IMPORTING);
    /* The encoding (flags bits 4-5): 0..2 on PUSH, PULL and PARAMS only. */
    memcpy(b, good, sizeof good);
    b[7] = DT_WIRE_F_EXACT | 3 << 4;
    CHECK(decode_fails(b, sizeof good, DT_EFORMAT, "PULL header: unknown encoding 3"));
    for (uint8_t enc = 0; enc < DT_ENC_COUNT; enc++) {
        b[7] = (uint8_t)(DT_WIRE_F_EXACT | enc << 4);
        dt_wire_header d;
        CHECK(dt_wire_decode(&d, b, sizeof good, NULL) == DT_OK && d.encoding == enc && d.flags == DT_WIRE_F_EXACT);
    }
    stat.flags = 0;
    stat.encoding = DT_ENC_BF16;
    dt_wire_encode(sb, &stat);
    CHECK(decode_fails(sb, sizeof sb, DT_EFORMAT, "STATUS header: encoding 1 on a message without one"));
    dt_wire_header ack = sample(DT_MSG_PUSH_ACK);
    ack.encoding = DT_ENC_FP16;
    dt_wire_encode(sb, &ack);
    CHECK(decode_fails(sb, sizeof sb, DT_EFORMAT, "without one"));
    memcpy(b, good, sizeof good);
    b[8] = 9;
    CHECK(decode_fails(b, sizeof good, DT_EFORMAT, "role"));
    memcpy(b, good, sizeof good);
    b[9] = 5, b[59] = 2;
    CHECK(decode_fails(b, sizeof good, DT_EFORMAT, "chunk 5 of 2"));
    memcpy(b, good, sizeof good);
    b[59] = 0; /* a PULL is always about a chunk */
    CHECK(decode_fails(b, sizeof good, DT_EFORMAT, "chunks 0"));
    dt_wire_encode(sb, &stat);
    sb[7] = 0, sb[9] = 1, sb[59] = 2; /* STATUS is not cut */
    CHECK(decode_fails(sb, sizeof sb, DT_EFORMAT, "not cut"));
    memcpy(b, good, sizeof good);
    b[23] = 0x80; /* global step negative */
    CHECK(decode_fails(b, sizeof good, DT_EFORMAT, "negative step"));
    /* Steps near 2^63 would overflow a ps's arithmetic (step + staleness + 2, a step applied):
     * 2^62 is the most a header carries, global or local. */
    for (int field = 16; field <= 24; field += 8) {
        const int64_t steps[3] = {DT_WIRE_MAX_STEP, DT_WIRE_MAX_STEP + 1, INT64_MAX};
        for (int k = 0; k < 3; k++) {
            memcpy(b, good, sizeof good);
            for (int i = 0; i < 8; i++) b[field + i] = (uint8_t)((uint64_t)steps[k] >> (8 * i));
            if (k == 0) {
                dt_wire_header d;
                CHECK(dt_wire_decode(&d, b, sizeof good, NULL) == DT_OK &&
                      (field == 16 ? d.global_step : d.local_step) == DT_WIRE_MAX_STEP);
            } else {
                CHECK(decode_fails(b, sizeof good, DT_EFORMAT,
                                   "PULL header: step beyond the limit 4611686018427387904"));
            }
        }
    }
    memcpy(b, good, sizeof good);
    b[32] = 4; /* a PULL with a payload */
    CHECK(decode_fails(b, sizeof good, DT_EFORMAT, "has none"));
    memcpy(b, good, sizeof good);
    b[55] = 0x01; /* shard floats 2^56 */
    CHECK(decode_fails(b, sizeof good, DT_EFORMAT, "beyond the limit"));

    dt_wire_header init = sample(DT_MSG_INIT);
    dt_wire_encode(good, &init);
    memcpy(b, good, sizeof good);
    b[56] = 7;
    CHECK(decode_fails(b, sizeof good, DT_EFORMAT, "optimizer kind"));
    memcpy(b, good, sizeof good);
    b[57] = 1; /* adam with 1 slot */
    CHECK(decode_fails(b, sizeof good, DT_EFORMAT, "state slots"));
    memcpy(b, good, sizeof good);
    b[63] = 0x7F, b[62] = 0xC0; /* learning rate NaN */
    CHECK(decode_fails(b, sizeof good, DT_EFORMAT, "learning_rate"));
    memcpy(b, good, sizeof good);
    b[58] = 0; /* INIT numbers its generation from 1 */
    CHECK(decode_fails(b, sizeof good, DT_EFORMAT, "generation 0"));
    memcpy(b, good, sizeof good);
    b[7] = DT_WIRE_F_STRICT;
    CHECK(decode_fails(b, sizeof good, DT_OK, NULL));

    /* INIT's sync configuration: aggregate <= total <= limit, staleness <= limit; async: staleness
     * zero and total (the workers) within the limit. */
    dt_wire_header bad = sample(DT_MSG_INIT);
    uint8_t ib[DT_WIRE_HEADER_SIZE];
    bad.init.total_num_replicas = 1; /* total below aggregate */
    dt_wire_encode(ib, &bad);
    CHECK(decode_fails(ib, sizeof ib, DT_EFORMAT, "total_num_replicas 1 must be in 2.."));
    bad.init.total_num_replicas = DT_WIRE_MAX_REPLICAS + 1;
    dt_wire_encode(ib, &bad);
    CHECK(decode_fails(ib, sizeof ib, DT_EFORMAT, "total_num_replicas"));
    bad = sample(DT_MSG_INIT);
    bad.init.staleness = DT_WIRE_MAX_STALENESS + 1;
    dt_wire_encode(ib, &bad);
    CHECK(decode_fails(ib, sizeof ib, DT_EFORMAT, "staleness"));
    /* (staleness + 1) x aggregate gradients held per chunk: 65,536 at most (65,536 replicas at
     * staleness 64 were 477 MiB of accumulators per chunk, before one gradient came) */
    bad = sample(DT_MSG_INIT);
    bad.init.replicas_to_aggregate = bad.init.total_num_replicas = DT_WIRE_MAX_REPLICAS;
    bad.init.staleness = DT_WIRE_MAX_STALENESS;
    dt_wire_encode(ib, &bad);
    CHECK(decode_fails(ib, sizeof ib, DT_EFORMAT, "(staleness 64 + 1) x replicas_to_aggregate 65536 gradients held "
                                                  "per chunk, beyond the limit 65536"));
    bad.init.staleness = 0;
    dt_wire_encode(ib, &bad);
    CHECK(decode_fails(ib, sizeof ib, DT_OK, NULL));
    bad.init.replicas_to_aggregate = DT_WIRE_MAX_HELD_GRADIENTS / (DT_WIRE_MAX_STALENESS + 1);
    bad.init.staleness = DT_WIRE_MAX_STALENESS;
    dt_wire_encode(ib, &bad);
    CHECK(decode_fails(ib, sizeof ib, DT_OK, NULL));
    bad.init.replicas_to_aggregate++;
    dt_wire_encode(ib, &bad);
    CHECK(decode_fails(ib, sizeof ib, DT_EFORMAT, "beyond the limit 65536"));
    bad = sample(DT_MSG_INIT);
    bad.init.replicas_to_aggregate = 0; /* asynchronous, yet a staleness */
    bad.init.staleness = 1;
    dt_wire_encode(ib, &bad);
    CHECK(decode_fails(ib, sizeof ib, DT_EFORMAT, "asynchronous"));
    bad.init.staleness = 0;
    bad.init.total_num_replicas = DT_WIRE_MAX_REPLICAS + 1;
    dt_wire_encode(ib, &bad);
    CHECK(decode_fails(ib, sizeof ib, DT_EFORMAT, "workers, beyond the limit"));
    bad.init.total_num_replicas = 3; /* asynchronous with 3 workers */
    dt_wire_encode(ib, &bad);
    CHECK(decode_fails(ib, sizeof ib, DT_OK, NULL));
    dt_wire_header state = sample(DT_MSG_STATE);
    state.opt_slots = 1; /* adam with 1 slot */
    dt_wire_encode(ib, &state);
    CHECK(decode_fails(ib, sizeof ib, DT_EFORMAT, "STATE header: optimizer kind 2 has 2 state slots"));

    CHECK(dt_wire_peek_request_id(good, sizeof good) == 0xA1B2C3D4u);
    CHECK(dt_wire_peek_request_id(good, 10) == 0);
}

/* Payload bounds come from the shard size the receiver knows, decided from the header alone. */
static void test_payload_bounds(void) {
    dt_error e = {0};
    dt_wire_header h = sample(DT_MSG_PUSH);
    h.encoding = DT_ENC_FP32;
    h.payload_bytes = 1000 * 4;
    CHECK(dt_wire_check_payload(&h, 1000, &e) == DT_OK);
    h.payload_bytes = 1000 * 4 + 4;
    CHECK(dt_wire_check_payload(&h, 1000, &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "expected 4000");
    h.payload_bytes = UINT64_C(1) << 62;
    CHECK(dt_wire_check_payload(&h, 1000, &e) == DT_EFORMAT);
    h.payload_bytes = 996;
    CHECK(dt_wire_check_payload(&h, 1000, &e) == DT_EFORMAT);
    /* 16-bit encodings: 2 bytes a value, per chunk; float32's size is refused */
    h.encoding = DT_ENC_BF16;
    h.payload_bytes = 2000;
    CHECK(dt_wire_check_payload(&h, 1000, &e) == DT_OK);
    h.payload_bytes = 4000;
    CHECK(dt_wire_check_payload(&h, 1000, &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "expected 2000");
    CHECK_CONTAINS(e.msg, "bf16");
    h.chunks = 3, h.chunk = 2; /* floats 666..999: 334 */
    h.payload_bytes = 668;
    CHECK(dt_wire_check_payload(&h, 1000, &e) == DT_OK);
    dt_wire_header pa = sample(DT_MSG_PARAMS);
    pa.encoding = DT_ENC_FP16;
    pa.payload_bytes = 2000;
    CHECK(dt_wire_check_payload(&pa, 1000, &e) == DT_OK);
    pa.encoding = DT_ENC_FP32;
    CHECK(dt_wire_check_payload(&pa, 1000, &e) == DT_EFORMAT);
    pa.encoding = 7; /* a hand-made header */
    CHECK(dt_wire_check_payload(&pa, 1000, &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "unknown encoding");

    dt_wire_header init = sample(DT_MSG_INIT); /* adam: params + 2 slots + options + decay bits */
    init.payload_bytes = 3 * 1000 * 4 + DT_WIRE_OPTS_BYTES + 125;
    CHECK(dt_wire_check_payload(&init, 1000, &e) == DT_OK);
    init.payload_bytes = 3 * 1000 * 4 + DT_WIRE_OPTS_BYTES + 126;
    CHECK(dt_wire_check_payload(&init, 1000, &e) == DT_EFORMAT);
    init.payload_bytes = 3 * 1000 * 4;
    CHECK(dt_wire_check_payload(&init, 1000, &e) == DT_EFORMAT); /* version 6's INIT */
    CHECK(dt_wire_init_bytes(0, 9) == 9 * 4 + DT_WIRE_OPTS_BYTES + 2);
    init.payload_bytes = 1000 * 4;
    CHECK(dt_wire_check_payload(&init, 1000, &e) == DT_EFORMAT);
    init.opt_slots = 200; /* a hand-made header: no overflow, refused */
    init.payload_bytes = 201 * 1000 * 4;
    CHECK(dt_wire_check_payload(&init, 1000, &e) == DT_EFORMAT);

    dt_wire_header state = sample(DT_MSG_STATE); /* as INIT */
    state.payload_bytes = 3 * 1000 * 4;
    CHECK(dt_wire_check_payload(&state, 1000, &e) == DT_OK);
    state.payload_bytes = 2 * 1000 * 4;
    CHECK(dt_wire_check_payload(&state, 1000, &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "STATE payload");
    dt_wire_header fetch = sample(DT_MSG_FETCH);
    CHECK(fetch.payload_bytes == 0 && dt_wire_check_payload(&fetch, 1000, &e) == DT_OK);

    dt_wire_header er = sample(DT_MSG_ERROR);
    er.payload_bytes = DT_WIRE_MAX_ERROR_TEXT;
    CHECK(dt_wire_check_payload(&er, 0, &e) == DT_OK);
    er.payload_bytes = DT_WIRE_MAX_ERROR_TEXT + 1;
    CHECK(dt_wire_check_payload(&er, 0, &e) == DT_EFORMAT);

    dt_wire_header st = sample(DT_MSG_STATUS);
    CHECK(dt_wire_check_payload(&st, 1000, &e) == DT_OK);
    h.payload_bytes = 4;
    CHECK(dt_wire_check_payload(&h, DT_WIRE_MAX_SHARD_FLOATS + 1, &e) == DT_EINVAL);

    /* A ps takes the largest sparse message whatever its shard (8 bytes per section, 8 per id, 4 per
     * float). */
    const uint64_t sparse = 8 * (uint64_t)DT_WIRE_MAX_SPARSE_SECTIONS + 8 * (uint64_t)DT_WIRE_MAX_SPARSE_IDS +
                            4 * (uint64_t)DT_WIRE_MAX_SPARSE_FLOATS;
    CHECK(dt_wire_max_frame(1000) == sparse && dt_wire_max_frame(1) == sparse);
    CHECK(dt_wire_max_frame(1000000) == 12000000 + DT_WIRE_OPTS_BYTES + 125000);
}

static void test_error_text(void) {
    char out[8];
    dt_wire_error_text(out, sizeof out, "ab\ncd\xff" "efgh", 10);
    CHECK(strcmp(out, "ab?cd?e") == 0);
    dt_wire_error_text(out, sizeof out, "", 0);
    CHECK(out[0] == '\0');
}

/* --- through sockets: dt_wire_send / dt_wire_recv over inproc and tcp --- */

static int wait_in(void *s, int ms) {
    zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
    return zmq_poll(&it, 1, ms) == 1;
}

static void send_raw(void *s, const void *a, size_t na, const void *b, size_t nb, int more_frames) {
    zmq_send(s, a, na, b || more_frames ? ZMQ_SNDMORE : 0);
    if (b) zmq_send(s, b, nb, more_frames ? ZMQ_SNDMORE : 0);
    if (more_frames) zmq_send(s, "x", 1, 0);
}

static void test_socket_round_trip_and_refusals(void) {
    void *ctx = zmq_ctx_new();
    dt_error e = {0};
    void *srv = dt_zsock_open(ctx, ZMQ_ROUTER, dt_wire_max_frame(1000), 0, -1, &e);
    void *cli = dt_zsock_open(ctx, ZMQ_DEALER, 4000, 0, 1000, &e);
    CHECK(srv && cli);
    CHECK(zmq_bind(srv, "inproc://wire") == 0);
    CHECK(zmq_connect(cli, "inproc://wire") == 0);

    /* A PUSH with its payload arrives whole, identity first. */
    float g[1000];
    for (int i = 0; i < 1000; i++) g[i] = (float)i * 0.5f;
    zmq_msg_t m;
    zmq_msg_init_size(&m, sizeof g);
    memcpy(zmq_msg_data(&m), g, sizeof g);
    dt_wire_header h = sample(DT_MSG_PUSH);
    CHECK(dt_wire_send(cli, NULL, &h, &m, 0, &e) == DT_OK);
    CHECK(h.payload_bytes == sizeof g);
    CHECK(wait_in(srv, 2000));
    dt_wire_in in;
    CHECK(dt_wire_recv(srv, 1, &in, &e) == DT_OK);
    CHECK(in.has_identity && same(&h, &in.hdr));
    CHECK(zmq_msg_size(&in.payload) == sizeof g && memcmp(zmq_msg_data(&in.payload), g, sizeof g) == 0);
    /* Reply through the identity. */
    dt_wire_header r = sample(DT_MSG_PUSH_ACK);
    CHECK(dt_wire_send(srv, &in.identity, &r, NULL, ZMQ_DONTWAIT, &e) == DT_OK);
    dt_wire_in_close(&in);
    CHECK(wait_in(cli, 2000));
    CHECK(dt_wire_recv(cli, 0, &in, &e) == DT_OK && in.hdr.type == DT_MSG_PUSH_ACK);
    dt_wire_in_close(&in);

    /* Nothing queued: a non-blocking receive says so. */
    CHECK(dt_wire_recv(cli, 0, &in, &e) == DT_ETIMEOUT);
    dt_wire_in_close(&in);

    uint8_t hb[DT_WIRE_HEADER_SIZE];
    /* Header claims 2^40 payload bytes, frame has 4: refused from the sizes, nothing allocated. */
    dt_wire_header big = sample(DT_MSG_PUSH);
    big.payload_bytes = UINT64_C(1) << 40;
    dt_wire_encode(hb, &big);
    send_raw(cli, hb, sizeof hb, "abcd", 4, 0);
    CHECK(wait_in(srv, 2000));
    CHECK(dt_wire_recv(srv, 1, &in, &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "payload frame has 4");
    CHECK(in.has_identity && in.hdr.request_id == 0xA1B2C3D4u); /* still answerable */
    dt_wire_in_close(&in);

    /* A payload announced but missing. */
    dt_wire_header nopay = sample(DT_MSG_PUSH);
    dt_wire_encode(hb, &nopay);
    send_raw(cli, hb, sizeof hb, NULL, 0, 0);
    CHECK(wait_in(srv, 2000));
    CHECK(dt_wire_recv(srv, 1, &in, &e) == DT_EFORMAT);
    dt_wire_in_close(&in);

    /* Three frames: refused, drained, and the next message is read cleanly. */
    dt_wire_header st = sample(DT_MSG_STATUS);
    dt_wire_encode(hb, &st);
    send_raw(cli, hb, sizeof hb, "pp", 2, 1);
    CHECK(dt_wire_send(cli, NULL, &st, NULL, 0, &e) == DT_OK);
    CHECK(wait_in(srv, 2000));
    CHECK(dt_wire_recv(srv, 1, &in, &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "frames");
    dt_wire_in_close(&in);
    CHECK(dt_wire_recv(srv, 1, &in, &e) == DT_OK && in.hdr.type == DT_MSG_STATUS);
    dt_wire_in_close(&in);

    /* Another version and a truncated header. */
    dt_wire_encode(hb, &st);
    hb[4] = DT_WIRE_VERSION - 1;
    send_raw(cli, hb, sizeof hb, NULL, 0, 0);
    send_raw(cli, hb, 5, NULL, 0, 0);
    CHECK(wait_in(srv, 2000));
    CHECK(dt_wire_recv(srv, 1, &in, &e) == DT_EPROTO);
    char older[32];
    snprintf(older, sizeof older, "version %u,", DT_WIRE_VERSION - 1);
    CHECK_CONTAINS(e.msg, older);
    dt_wire_in_close(&in);
    CHECK(dt_wire_recv(srv, 1, &in, &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "truncated");
    dt_wire_in_close(&in);

    /* An ERROR reply carries the text. */
    CHECK(dt_wire_send(cli, NULL, &st, NULL, 0, &e) == DT_OK);
    CHECK(wait_in(srv, 2000));
    CHECK(dt_wire_recv(srv, 1, &in, &e) == DT_OK);
    CHECK(dt_wire_send_error(srv, &in.identity, sample(DT_MSG_STATUS_REPLY), DT_WIRE_E_NOT_READY,
                             "not ready: %d", 7) == DT_OK);
    dt_wire_in_close(&in);
    CHECK(wait_in(cli, 2000));
    CHECK(dt_wire_recv(cli, 0, &in, &e) == DT_OK);
    CHECK(in.hdr.type == DT_MSG_ERROR && in.hdr.status == DT_WIRE_E_NOT_READY);
    char text[64];
    dt_wire_error_text(text, sizeof text, zmq_msg_data(&in.payload), zmq_msg_size(&in.payload));
    CHECK(strcmp(text, "not ready: 7") == 0);
    dt_wire_in_close(&in);

    zmq_close(cli);
    zmq_close(srv);
    zmq_ctx_term(ctx);
}

/* A frame beyond the socket's bound is dropped by libzmq before it is allocated (the connection
 * goes); the receiver keeps serving others. */
static void test_oversized_frame_dropped(void) {
    void *ctx = zmq_ctx_new();
    dt_error e = {0};
    void *srv = dt_zsock_open(ctx, ZMQ_ROUTER, 1024, 0, -1, &e);
    CHECK(zmq_bind(srv, "tcp://127.0.0.1:*") == 0);
    char ep[128];
    size_t len = sizeof ep;
    zmq_getsockopt(srv, ZMQ_LAST_ENDPOINT, ep, &len);
    void *bad = dt_zsock_open(ctx, ZMQ_DEALER, 1024, 0, 2000, &e);
    void *good = dt_zsock_open(ctx, ZMQ_DEALER, 1024, 0, 2000, &e);
    CHECK(zmq_connect(bad, ep) == 0 && zmq_connect(good, ep) == 0);
    static char huge[1 << 20];
    dt_wire_header h = sample(DT_MSG_PUSH);
    h.payload_bytes = sizeof huge;
    uint8_t hb[DT_WIRE_HEADER_SIZE];
    dt_wire_encode(hb, &h);
    zmq_send(bad, hb, sizeof hb, ZMQ_SNDMORE);
    zmq_send(bad, huge, sizeof huge, 0);
    dt_wire_header st = sample(DT_MSG_STATUS);
    CHECK(dt_wire_send(good, NULL, &st, NULL, 0, &e) == DT_OK);
    int got_status = 0, got_push = 0;
    int64_t end = (dt_clock_us() / 1000) + 1500;
    while ((dt_clock_us() / 1000) < end) {
        if (!wait_in(srv, 100)) continue;
        dt_wire_in in;
        if (dt_wire_recv(srv, 1, &in, &e) == DT_OK) {
            got_status += in.hdr.type == DT_MSG_STATUS;
            got_push += in.hdr.type == DT_MSG_PUSH;
        }
        dt_wire_in_close(&in);
    }
    CHECK(got_status == 1);
    CHECK(got_push == 0);
    zmq_close(bad);
    zmq_close(good);
    zmq_close(srv);
    zmq_ctx_term(ctx);
}

/* An IPv6 literal binds and connects (ZMQ_IPV6 set for it), and IPv4 still does alongside. Without
 * an IPv6 loopback (a kernel without IPv6) the IPv6 half is skipped, saying so. */
static int has_ipv6_loopback(void) {
    int s = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    int ok = s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0;
    if (s >= 0) close(s);
    return ok;
}

static void round_trip_on(const char *bind_ep) {
    void *ctx = zmq_ctx_new();
    dt_error e = {0};
    void *srv = dt_zsock_open(ctx, ZMQ_ROUTER, 1024, 0, -1, &e);
    void *cli = dt_zsock_open(ctx, ZMQ_DEALER, 1024, 0, 2000, &e);
    CHECK_MSG(dt_zsock_bind(srv, bind_ep) == 0, "%s: %s", bind_ep, zmq_strerror(errno));
    char ep[128];
    size_t len = sizeof ep;
    CHECK(zmq_getsockopt(srv, ZMQ_LAST_ENDPOINT, ep, &len) == 0);
    CHECK_MSG(dt_zsock_connect(cli, ep) == 0, "%s: %s", ep, zmq_strerror(errno));
    dt_wire_header h = sample(DT_MSG_STATUS);
    CHECK(dt_wire_send(cli, NULL, &h, NULL, 0, &e) == DT_OK);
    CHECK_MSG(wait_in(srv, 5000), "no message over %s", ep);
    dt_wire_in in;
    CHECK(dt_wire_recv(srv, 1, &in, &e) == DT_OK && in.hdr.type == DT_MSG_STATUS);
    dt_wire_in_close(&in);
    zmq_close(cli);
    zmq_close(srv);
    zmq_ctx_term(ctx);
}

static void test_ipv6_and_ipv4_endpoints(void) {
    round_trip_on("tcp://127.0.0.1:*");
    if (!has_ipv6_loopback()) {
        printf("  skipped the IPv6 half: this kernel has no IPv6 loopback (::1)\n");
        return;
    }
    round_trip_on("tcp://[::1]:*");
    /* Without ZMQ_IPV6 libzmq cannot even parse the address (the "No such device" of issue 12). */
    void *ctx = zmq_ctx_new();
    void *plain = zmq_socket(ctx, ZMQ_ROUTER);
    CHECK(zmq_bind(plain, "tcp://[::1]:*") != 0);
    zmq_close(plain);
    zmq_ctx_term(ctx);
}

/* `test_wire --write-corpus DIR` writes the fuzz seed corpus (fuzz/corpus/wire) for this protocol
 * version: one valid message of each type in the fuzz target's input format ([selector byte]
 * [header][payload]), and 16-bit PUSH and PARAMS, so the seeds follow the protocol when its version
 * changes. */
static int write_seed_with(const char *dir, const char *name, uint8_t selector, dt_wire_header *h, size_t payload,
                           const uint8_t *data) {
    uint8_t buf[1 + DT_WIRE_HEADER_SIZE + 4 * 16 + DT_WIRE_OPTS_BYTES];
    if (payload > sizeof buf - 1 - DT_WIRE_HEADER_SIZE) return 1;
    h->payload_bytes = payload;
    buf[0] = selector;
    dt_wire_encode(buf + 1, h);
    memset(buf + 1 + DT_WIRE_HEADER_SIZE, 0, payload);
    if (data) memcpy(buf + 1 + DT_WIRE_HEADER_SIZE, data, payload);
    if (h->type == DT_MSG_ERROR) memcpy(buf + 1 + DT_WIRE_HEADER_SIZE, "oops!", 5);
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, 1 + DT_WIRE_HEADER_SIZE + payload, f) != 1 + DT_WIRE_HEADER_SIZE + payload) {
        fprintf(stderr, "test_wire: cannot write %s\n", path);
        if (f) fclose(f);
        return 1;
    }
    return fclose(f) != 0;
}

static int write_seed(const char *dir, const char *name, uint8_t selector, dt_wire_header *h, size_t payload) {
    return write_seed_with(dir, name, selector, h, payload, NULL);
}

static int write_corpus(const char *dir) {
    for (int t = 1; t <= DT_MSG_TYPE_MAX; t++) {
        if (dt_wire_type_is_sparse((uint8_t)t)) continue; /* they have their own: fuzz/corpus/sparse */
        dt_wire_header h = dt_wire_header_make((dt_msg_type)t, t % 2 ? DT_ROLE_WORKER : DT_ROLE_PS, 1, 7);
        size_t payload = 0;
        h.shard_floats = 4;
        if (t == DT_MSG_INIT || t == DT_MSG_WELCOME || t == DT_MSG_STATE) {
            h.opt_kind = 2, h.opt_slots = 2, h.learning_rate = 0.001f, h.beta1 = 0.9f, h.beta2 = 0.999f,
            h.epsilon = 1e-8f, h.momentum = 0.9f;
        }
        if (t == DT_MSG_STATE) payload = 4 * 3 * sizeof(float);
        if (t == DT_MSG_INIT) payload = (size_t)dt_wire_init_bytes(2, 4);
        if (t == DT_MSG_PARAMS || t == DT_MSG_PUSH) payload = 4 * sizeof(float);
        if (t == DT_MSG_PULL) h.encoding = DT_ENC_BF16;
        if (t == DT_MSG_ERROR) payload = 5, h.status = DT_WIRE_E_NOT_READY;
        if (t == DT_MSG_WORK_STATE) payload = 80; /* a state's bytes: the loader checks them (fuzz_coord_state) */
        if (t == DT_MSG_WORK_ASK) h.flags = DT_WIRE_F_JOIN, h.work_ask.examples = 60000, h.work_ask.batch_size = 64;
        if (t == DT_MSG_WORK_GRANT) h.work_grant.unit = 3, h.work_grant.mask = 0xf, h.status = DT_WIRE_OK;
        if (t == DT_MSG_WORK_DONE) h.work_done.batch = 13, h.local_step = 40;
        char name[32];
        snprintf(name, sizeof name, "type%02d", t);
        if (write_seed(dir, name, 2 /* selector: shard of 1000 floats */, &h, payload)) return 1;
    }
    /* 16-bit payloads for a shard of one float (selector 1): 2 bytes each */
    dt_wire_header push = dt_wire_header_make(DT_MSG_PUSH, DT_ROLE_WORKER, 1, 7);
    push.encoding = DT_ENC_BF16;
    push.flags = DT_WIRE_F_PULL;
    dt_wire_header params = dt_wire_header_make(DT_MSG_PARAMS, DT_ROLE_PS, 0, 7);
    params.encoding = DT_ENC_FP16;
    /* An INIT of a shard of one float (selector 1) with a piecewise schedule, weight decay and the
     * float's decay bit set. */
    dt_wire_header init = dt_wire_header_make(DT_MSG_INIT, DT_ROLE_CHIEF, 0, 7);
    init.shard_floats = 1, init.opt_kind = 1, init.opt_slots = 1, init.learning_rate = 0.1f, init.momentum = 0.9f;
    init.generation = 1, init.init.total_num_replicas = 1;
    uint8_t data[2 * 4 + DT_WIRE_OPTS_BYTES + 1] = {0};
    dt_lr_schedule s = {.kind = DT_LR_PIECEWISE, .n_boundaries = 2, .boundaries = {100, 200}, .values = {0.1f, 0.01f, 0.001f}};
    dt_wire_opts_encode(data + 8, &s, 5e-4f);
    data[8 + DT_WIRE_OPTS_BYTES] = 1;
    return write_seed(dir, "type07_bf16", 1, &push, 2) || write_seed(dir, "type06_fp16", 1, &params, 2) ||
           write_seed_with(dir, "type03_piecewise", 1, &init, sizeof data, data);
}

/* A SPARSE_PULL or SPARSE_PUSH of records [k] (table, dim, ids), its header's totals as given (want:
 * the records' own), its payload (zeros after the records) of the header's size into p: whether
 * dt_wire_sections_decode takes it, else e.msg says why. */
typedef struct {
    uint32_t table, dim, ids;
} rec3;
static int sections_take(uint8_t type, const rec3 *r, size_t k, uint64_t ids, uint64_t floats, dt_wire_section *out,
                         dt_error *e) {
    dt_wire_header h = dt_wire_header_make((dt_msg_type)type, DT_ROLE_WORKER, 1, 1);
    if (type == DT_MSG_SPARSE_PUSH) h.chunks = 1;
    h.sections.count = k, h.sections.ids = ids, h.sections.floats = floats;
    h.payload_bytes = dt_wire_sparse_bytes(&h);
    static uint8_t p[1 << 16];
    if (h.payload_bytes > sizeof p) return 0;
    memset(p, 0, h.payload_bytes);
    for (size_t i = 0; i < k; i++) dt_wire_section_encode(p + 8 * i, r[i].table, r[i].dim, r[i].ids);
    uint8_t b[DT_WIRE_HEADER_SIZE];
    dt_wire_header d;
    dt_wire_encode(b, &h);
    return dt_wire_decode(&d, b, sizeof b, e) == DT_OK && dt_wire_check_payload(&d, 1, e) == DT_OK &&
           dt_wire_sections_decode(out, &d, p, h.payload_bytes, e) == DT_OK;
}

/* Section records: their offsets among the ids and floats; hostile records each refused naming the
 * section, its table and the bound: counts that do not add up (either way), a table named twice, a
 * table beyond DT_WIRE_MAX_TABLES, dim 0 or beyond, a count that overflows the message's, a pull's
 * empty section; a payload of another size. */
static void test_sections_decode(void) {
    dt_wire_section o[4];
    dt_error e = {0};
    const rec3 ok[3] = {{7, 2, 3}, {0, 1, 1}, {1023, 1024, 2}};
    CHECK_MSG(sections_take(DT_MSG_SPARSE_PULL, ok, 3, 6, 6 + 1 + 2048, o, &e), "%s", e.msg);
    CHECK(o[0].table == 7 && o[0].first == 0 && o[0].at == 0 && o[1].first == 3 && o[1].at == 6);
    CHECK(o[2].table == 1023 && o[2].dim == 1024 && o[2].first == 4 && o[2].at == 7);
    const rec3 empty[2] = {{7, 2, 0}, {8, 4, 0}}; /* a sync push without ids still names its tables */
    CHECK(sections_take(DT_MSG_SPARSE_PUSH, empty, 2, 0, 0, o, &e));
    CHECK(!sections_take(DT_MSG_SPARSE_PULL, empty, 2, 2, 6, o, &e));
    CHECK_CONTAINS(e.msg, "SPARSE_PULL section 0 (table 7): 0 ids, must be 1..65536 (DT_WIRE_MAX_SPARSE_IDS)");
    const struct {
        rec3 r[2];
        uint64_t ids, floats;
        const char *says;
    } bad[] = {
        {{{7, 2, 3}, {8, 1, 1}}, 5, 7, "the 2 sections hold 4 ids and 7 floats, the header says 5 and 7"},
        {{{7, 2, 3}, {8, 1, 1}}, 4, 8, "the 2 sections hold 4 ids and 7 floats, the header says 4 and 8"},
        {{{7, 2, 3}, {8, 1, 1}}, 3, 7, "section 1 (table 8): the sections so far hold 4 ids and 7 floats, beyond"},
        {{{7, 2, 3}, {7, 1, 1}}, 4, 7, "section 1: table 7 named twice"},
        {{{7, 2, 3}, {1024, 1, 1}}, 4, 7, "section 1: table 1024, beyond the limit of 1024 tables"},
        {{{7, 0, 3}, {8, 1, 1}}, 4, 7, "section 0 (table 7): dim 0, must be 1..1024 (DT_WIRE_MAX_SPARSE_DIM)"},
        {{{7, 1025, 3}, {8, 1, 1}}, 4, 7, "section 0 (table 7): dim 1025"},
        {{{7, 2, UINT32_MAX}, {8, 1, 1}}, 4, 7, "section 0 (table 7): 4294967295 ids, must be 1..65536"},
        {{{7, 1024, 65536}, {8, 1, 1}}, 4, 7, "section 0 (table 7): the sections so far hold 65536 ids"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        e.msg[0] = 0;
        CHECK_MSG(!sections_take(DT_MSG_SPARSE_PULL, bad[k].r, 2, bad[k].ids, bad[k].floats, o, &e), "case %zu", k);
        CHECK_CONTAINS(e.msg, bad[k].says);
    }
    dt_wire_header h = dt_wire_header_make(DT_MSG_SPARSE_PULL, DT_ROLE_WORKER, 1, 1);
    h.sections.count = 1, h.sections.ids = 1, h.sections.floats = 1;
    uint8_t p[24] = {0};
    dt_wire_section_encode(p, 1, 1, 1);
    CHECK(dt_wire_sections_decode(o, &h, p, 24, &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "payload of 24 bytes, expected 16 (1 sections, 1 ids, 1 floats)");
    h.type = DT_MSG_SPARSE_ROWS;
    CHECK(dt_wire_sections_decode(o, &h, p, 4, &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "SPARSE_ROWS carries no section records");
}

/* A table's rows with their slots (SPARSE_EXPORT, SPARSE_PAGE, SPARSE_IMPORT): the header's bounds,
 * each named, counting the slots in the floats; the payload's size; and a page's rows checked one by
 * one: ids below the table's rows, values finite, the slots an optimizer only grows within range. */
static dt_wire_header rows_header(uint8_t type, uint64_t ids, uint64_t dim, uint8_t kind) {
    dt_wire_header h = dt_wire_header_make((dt_msg_type)type, type == DT_MSG_SPARSE_PAGE ? DT_ROLE_PS : DT_ROLE_CHIEF,
                                           0, 5);
    h.sparse.table = 2, h.sparse.ids = ids, h.sparse.dim = dim;
    h.opt_kind = kind, h.opt_slots = (uint8_t)dt_lazy_slots((dt_lazy_kind)kind);
    h.payload_bytes = dt_wire_sparse_bytes(&h);
    return h;
}

static int rows_decode_fails(const dt_wire_header *h, const char *needle) {
    uint8_t b[DT_WIRE_HEADER_SIZE];
    dt_wire_header d;
    dt_error e = {0};
    dt_wire_encode(b, h);
    int rc = dt_wire_decode(&d, b, sizeof b, &e);
    CHECK_CONTAINS(e.msg, needle);
    return rc == DT_EFORMAT;
}

static void test_sparse_rows_headers(void) {
    dt_wire_header h = rows_header(DT_MSG_SPARSE_EXPORT, 100, 4, DT_LAZY_ADAGRAD);
    CHECK(h.payload_bytes == 0);
    h.sparse.ids = 0;
    CHECK(rows_decode_fails(&h, "DT_WIRE_MAX_SPARSE_IDS"));
    h = rows_header(DT_MSG_SPARSE_PAGE, 0, 4, DT_LAZY_ADAGRAD); /* a page may be empty: no row left */
    uint8_t b[DT_WIRE_HEADER_SIZE];
    dt_wire_header d;
    dt_error e = {0};
    dt_wire_encode(b, &h);
    CHECK(dt_wire_decode(&d, b, sizeof b, &e) == DT_OK && d.sparse.ids == 0);
    /* the chief's LAST SPARSE_IMPORT to a ps may carry no row (the import is over); another may not */
    h = rows_header(DT_MSG_SPARSE_IMPORT, 0, 4, DT_LAZY_ADAGRAD);
    CHECK(rows_decode_fails(&h, "SPARSE_IMPORT header: 0 ids, must be 1.."));
    h.flags = DT_WIRE_F_LAST;
    dt_wire_encode(b, &h);
    CHECK(dt_wire_decode(&d, b, sizeof b, &e) == DT_OK && d.sparse.ids == 0 && d.flags == DT_WIRE_F_LAST);
    CHECK(dt_wire_check_payload(&d, 1, &e) == DT_OK);
    h = rows_header(DT_MSG_SPARSE_EXPORT, 100, 4, DT_LAZY_ADAGRAD); /* LAST is SPARSE_IMPORT's alone */
    h.flags = DT_WIRE_F_LAST;
    CHECK(rows_decode_fails(&h, "SPARSE_EXPORT header: unknown flags 0x01"));
    h = rows_header(DT_MSG_SPARSE_IMPORT, 3, 2, DT_LAZY_FTRL);
    CHECK(h.payload_bytes == 3 * 8 + 3 * 2 * 3 * 4);
    /* 2^20 floats with the slots: 65536 ids of dim 16 alone would fit, not with FTRL's two slots */
    h.sparse.ids = 65536, h.sparse.dim = 16;
    CHECK(rows_decode_fails(&h, "with their optimizer slots are 3145728 floats"));
    h = rows_header(DT_MSG_SPARSE_IMPORT, 3, 2, DT_LAZY_FTRL);
    h.opt_slots = 1;
    CHECK(rows_decode_fails(&h, "table optimizer 2 with 1 slots"));
    h.opt_kind = DT_LAZY_KINDS, h.opt_slots = 0;
    CHECK(rows_decode_fails(&h, "table optimizer 4"));
    h = rows_header(DT_MSG_SPARSE_IMPORT, 3, 2, DT_LAZY_FTRL);
    h.encoding = DT_ENC_BF16; /* float32 only */
    CHECK(rows_decode_fails(&h, "encoding 1 on a message without one"));
    h = rows_header(DT_MSG_SPARSE_IMPORT, 3, 2, DT_LAZY_FTRL);
    h.payload_bytes += 4;
    CHECK(dt_wire_check_payload(&h, 1, &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "expected 96");
    CHECK(dt_wire_sparse_max_frame() >= 8 * (uint64_t)DT_WIRE_MAX_SPARSE_IDS + 4 * (uint64_t)DT_WIRE_MAX_SPARSE_FLOATS +
                                            8 * (uint64_t)DT_WIRE_MAX_SPARSE_SECTIONS);
    CHECK(dt_wire_rows_per_msg(16, 2) == DT_WIRE_MAX_SPARSE_FLOATS / 48 && dt_wire_rows_per_msg(1, 0) == 65536);
}

/* A page of three Adam rows of dim 2 (ids 7, 0, 9): values, m, v. */
static void make_page(uint8_t *p, const float *rows) {
    const uint64_t ids[3] = {7, 0, 9};
    for (int i = 0; i < 3; i++) dt_put_u64(p + 8 * i, ids[i]);
    for (int i = 0; i < 18; i++) dt_put_f32(p + 24 + 4 * i, rows[i]);
}

static void test_sparse_rows_payload(void) {
    float rows[18] = {1, 2, 0.1f, 0.2f, 0.01f, 0.02f, -1, -2, -0.1f, 0, 0, 0, 3, 4, 0.3f, 0.4f, 0.5f, 0.6f};
    uint8_t p[24 + 72];
    dt_wire_header h = rows_header(DT_MSG_SPARSE_PAGE, 3, 2, DT_LAZY_ADAM);
    make_page(p, rows);
    dt_wire_rows r;
    dt_error e = {0};
    CHECK(dt_wire_rows_check(&r, &h, p, sizeof p, 10, &e) == DT_OK);
    float got[6];
    dt_wire_rows_get(&r, 2, got);
    CHECK(r.n == 3 && dt_wire_rows_id(&r, 2) == 9 && !memcmp(got, rows + 12, sizeof got));
    CHECK(dt_wire_rows_check(&r, &h, p, sizeof p, 9, &e) == DT_EFORMAT); /* id 9 of a table of 9 rows */
    CHECK_CONTAINS(e.msg, "row 2: id 9 of table 2, beyond the table's 9 rows");
    CHECK(dt_wire_rows_check(&r, &h, p, sizeof p - 1, 0, &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "expected 96");
    rows[3] = NAN;
    make_page(p, rows);
    CHECK(dt_wire_rows_check(&r, &h, p, sizeof p, 0, &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "row 0 (id 7 of table 2): optimizer slot 0, value 1, nan is not finite");
    rows[3] = 0.2f, rows[11] = -1e-9f; /* Adam's v below 0 */
    make_page(p, rows);
    CHECK(dt_wire_rows_check(&r, &h, p, sizeof p, 0, &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "row 1 (id 0 of table 2): optimizer slot 1, value 1, -1e-09 must be >= 0");
    rows[11] = 0; /* Adagrad's accumulator must stay above 0 */
    dt_wire_header a = rows_header(DT_MSG_SPARSE_IMPORT, 3, 2, DT_LAZY_ADAGRAD);
    uint8_t q[24 + 48];
    memcpy(q, p, 24);
    const float ag[12] = {1, 2, 0.1f, 0.1f, 1, 2, 0.1f, 0, 1, 2, 0.1f, 0.1f};
    for (int i = 0; i < 12; i++) dt_put_f32(q + 24 + 4 * i, ag[i]);
    CHECK(dt_wire_rows_check(&r, &a, q, sizeof q, 0, &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "row 1 (id 0 of table 2): optimizer slot 0, value 1, 0 must be > 0");
    make_page(p, rows);
    CHECK(dt_wire_rows_check(&r, &h, p, sizeof p, 0, &e) == DT_OK);
    dt_wire_header x = rows_header(DT_MSG_SPARSE_EXPORT, 3, 2, DT_LAZY_ADAM);
    CHECK(dt_wire_rows_check(&r, &x, NULL, 0, 0, &e) == DT_EFORMAT); /* a request carries no rows */
}

/* The work coordinator's messages (docs/elastic.md): JOIN on WORK_ASK only, WORK_DONE's third
 * counter zero, WORK_STATE's payload at most the coordinator's largest state (ps 0's frames are
 * that large), and none on the others. */
static void test_work_messages(void) {
    dt_error e = {0};
    uint8_t b[DT_WIRE_HEADER_SIZE];
    dt_wire_header h = dt_wire_header_make(DT_MSG_WORK_DONE, DT_ROLE_WORKER, 2, 9), d;
    h.work_done.epoch = 3, h.work_done.batch = 17, h.local_step = 40;
    dt_wire_encode(b, &h);
    CHECK(dt_wire_decode(&d, b, sizeof b, &e) == DT_OK && d.work_done.batch == 17 && d.local_step == 40);
    CHECK(dt_get_u64(b + 88) == 17 && dt_get_u64(b + 80) == 3);
    h.counters[2] = 1;
    dt_wire_encode(b, &h);
    CHECK(decode_fails(b, sizeof b, DT_EFORMAT, "WORK_DONE header: bytes 96..103 must be 0"));
    h = dt_wire_header_make(DT_MSG_WORK_DONE, DT_ROLE_WORKER, 2, 9);
    h.flags = DT_WIRE_F_JOIN;
    dt_wire_encode(b, &h);
    CHECK(decode_fails(b, sizeof b, DT_EFORMAT, "WORK_DONE header: unknown flags 0x40"));
    h = dt_wire_header_make(DT_MSG_WORK_ASK, DT_ROLE_WORKER, 2, 9);
    h.flags = DT_WIRE_F_JOIN;
    h.payload_bytes = 1;
    dt_wire_encode(b, &h);
    CHECK(decode_fails(b, sizeof b, DT_EFORMAT, "claims a payload of 1 bytes"));
    h = dt_wire_header_make(DT_MSG_WORK_STATE, DT_ROLE_CHIEF, 0, 9);
    h.payload_bytes = DT_WIRE_MAX_WORK_STATE;
    CHECK(dt_wire_check_payload(&h, 10, &e) == DT_OK);
    h.payload_bytes = 0;
    CHECK(dt_wire_check_payload(&h, 10, &e) == DT_OK);
    h.payload_bytes = DT_WIRE_MAX_WORK_STATE + 1;
    CHECK(dt_wire_check_payload(&h, 10, &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "WORK_STATE payload");
    /* ps 0 takes the largest state whatever the shard (today every ps already takes the largest
     * sparse message, which is larger: both bounds are kept, as they may change apart). */
    CHECK(dt_wire_max_frame_ps0(10) >= DT_WIRE_MAX_WORK_STATE && dt_wire_max_frame_ps0(10) >= dt_wire_max_frame(10));
    CHECK(dt_wire_max_frame(10) == dt_wire_sparse_max_frame());
    CHECK(dt_wire_max_frame_ps0(1u << 24) == dt_wire_max_frame(1u << 24));
    CHECK(!strcmp(dt_wire_status_name(DT_WIRE_WORK_WAIT), "no work now"));
}

/* INIT's options block: every schedule survives encode and decode exactly; a block that is the
 * wrong size, names an unknown schedule, sets reserved bytes, has boundaries out of order, a
 * negative or non-finite weight decay, or a field another schedule uses, is refused by name. */
static void test_init_options(void) {
    uint8_t b[DT_WIRE_OPTS_BYTES];
    dt_lr_schedule in[4] = {
        {.kind = DT_LR_CONSTANT},
        {.kind = DT_LR_EXPONENTIAL, .staircase = 1, .decay_steps = 1000, .decay_rate = 0.96f},
        {.kind = DT_LR_PIECEWISE, .n_boundaries = 3, .boundaries = {10, 20, (int64_t)1 << 40},
         .values = {0.1f, 0.05f, 0.01f, 0.001f}},
        {.kind = DT_LR_COSINE, .decay_steps = 9000, .warmup_steps = 500, .alpha = 0.01f},
    };
    for (int k = 0; k < 4; k++) {
        dt_wire_opts_encode(b, &in[k], 0.25f * k);
        dt_lr_schedule out;
        float wd = -1;
        dt_error e = {0};
        CHECK_MSG(dt_wire_opts_decode(&out, &wd, b, sizeof b, &e) == DT_OK, "%s: %s", dt_lr_kind_name(in[k].kind), e.msg);
        int same = out.kind == in[k].kind && out.staircase == in[k].staircase && out.decay_steps == in[k].decay_steps &&
                   out.decay_rate == in[k].decay_rate && out.alpha == in[k].alpha &&
                   out.warmup_steps == in[k].warmup_steps && out.n_boundaries == in[k].n_boundaries;
        for (int i = 0; i < DT_LR_MAX_BOUNDARIES; i++) same &= out.boundaries[i] == in[k].boundaries[i];
        for (int i = 0; i <= DT_LR_MAX_BOUNDARIES; i++) same &= out.values[i] == in[k].values[i];
        CHECK_MSG(same && wd == 0.25f * k, "%s: decoded differently", dt_lr_kind_name(in[k].kind));
    }
    struct { int off; uint8_t v; const char *msg; } bad[] = {
        {0, 4, "unknown schedule"}, {1, 2, "staircase"}, {2, 17, "boundaries"}, {3, 1, "reserved"},
        {DT_WIRE_OPTS_BYTES - 1, 1, "reserved"},
        {7, 0x80, "weight decay"},   /* the sign bit of 0.25: -0.25 */
        {32, 30, "not increasing"},  /* boundaries[0] = 30 > boundaries[1] = 20 */
        {16, 0x3f, "lr_decay_rate"}, /* a decay rate on a piecewise schedule */
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        dt_wire_opts_encode(b, &in[2], 0.25f);
        b[bad[k].off] = bad[k].v;
        dt_lr_schedule out;
        float wd;
        dt_error e = {0};
        CHECK_MSG(dt_wire_opts_decode(&out, &wd, b, sizeof b, &e) == DT_EFORMAT, "byte %d", bad[k].off);
        CHECK_CONTAINS(e.msg, bad[k].msg);
        CHECK_CONTAINS(e.msg, "INIT options");
    }
    dt_wire_opts_encode(b, &in[0], 1.0f / 0.0f);
    dt_lr_schedule out;
    float wd;
    dt_error e = {0};
    CHECK(dt_wire_opts_decode(&out, &wd, b, sizeof b, &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "weight decay");
    CHECK(dt_wire_opts_decode(&out, &wd, b, sizeof b - 1, &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "bytes");
}

/* The cut tiles the shard exactly, in order and evenly; the count the chief asks for is the fewest
 * that keep every chunk within chunk_bytes. */
static void test_chunk_cut(void) {
    const uint64_t sizes[] = {1, 7, 100, 1000, 32768, 422146, UINT64_C(1) << 32};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        for (unsigned chunks = 1; chunks <= DT_WIRE_MAX_CHUNKS; chunks += chunks < 8 ? 1 : 37) {
            uint64_t n = sizes[i], next = 0, off, len;
            for (unsigned k = 0; k < chunks; k++) {
                dt_wire_chunk(n, chunks, k, &off, &len);
                CHECK_MSG(off == next, "n %llu, chunk %u of %u at %llu, want %llu", (unsigned long long)n, k, chunks,
                          (unsigned long long)off, (unsigned long long)next);
                CHECK(len == n / chunks || len == n / chunks + 1);
                next = off + len;
            }
            CHECK_MSG(next == n, "n %llu in %u chunks ends at %llu", (unsigned long long)n, chunks,
                      (unsigned long long)next);
        }
    uint64_t off, len;
    CHECK(dt_wire_chunks_for(1000, 0) == 1 && dt_wire_chunks_for(1000, 4000) == 1 && dt_wire_chunks_for(1000, 3999) == 2);
    for (uint64_t n = 2; n < 5000; n += 97)
        for (uint64_t cb = 8; cb < 4 * n; cb += 4 * n / 7 + 4) {
            unsigned c = dt_wire_chunks_for(n, cb);
            if (c == DT_WIRE_MAX_CHUNKS) continue;
            for (unsigned k = 0; k < c; k++) {
                dt_wire_chunk(n, c, k, &off, &len);
                CHECK_MSG(len * 4 <= cb + 4, "n %llu, %llu bytes: chunk of %llu floats", (unsigned long long)n,
                          (unsigned long long)cb, (unsigned long long)len);
            }
            if (c > 1) { /* one chunk fewer would overflow */
                dt_wire_chunk(n, c - 1, 0, &off, &len);
                CHECK(len * 4 > cb - 4);
            }
        }
}

/* `test_wire --write-rows-corpus DIR` writes fuzz/corpus/sparse_rows (fuzz/fuzz_sparse_rows.c): a
 * page of Adam rows for a table of 1000 rows (selector 2), an empty page, an Adagrad import (any id),
 * an FTRL page whose id is beyond a table of 1 row (selector 1: refused). */
static int write_rows_corpus(const char *dir) {
    float rows[18] = {1, 2, 0.1f, 0.2f, 0.01f, 0.02f, -1, -2, -0.1f, 0, 0, 0, 3, 4, 0.3f, 0.4f, 0.5f, 0.6f};
    uint8_t p[24 + 72];
    make_page(p, rows);
    dt_wire_header h = rows_header(DT_MSG_SPARSE_PAGE, 3, 2, DT_LAZY_ADAM);
    int bad = write_seed_with(dir, "page_adam", 2, &h, 96, p);
    h = rows_header(DT_MSG_SPARSE_PAGE, 0, 4, DT_LAZY_SGD);
    bad |= write_seed_with(dir, "page_empty", 0, &h, 0, p);
    h = rows_header(DT_MSG_SPARSE_IMPORT, 4, 3, DT_LAZY_ADAGRAD); /* 4 x (8 + 24) = 128 bytes: 4 rows of 6 floats */
    uint8_t q[128];
    for (int i = 0; i < 4; i++) dt_put_u64(q + 8 * i, (uint64_t)i * 1000003);
    for (int i = 0; i < 24; i++) dt_put_f32(q + 32 + 4 * i, i % 6 < 3 ? (float)i - 10.0f : 0.1f + (float)i);
    bad |= write_seed_with(dir, "import_adagrad", 0, &h, sizeof q, q);
    h = rows_header(DT_MSG_SPARSE_PAGE, 2, 2, DT_LAZY_FTRL); /* 2 x (8 + 24) = 64 bytes */
    bad |= write_seed_with(dir, "page_ftrl_beyond", 1, &h, 64, q);
    return bad;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--write-corpus")) return write_corpus(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "--write-rows-corpus")) return write_rows_corpus(argv[2]);
    RUN(test_work_messages);
    RUN(test_sections_decode);
    RUN(test_sparse_rows_headers);
    RUN(test_sparse_rows_payload);
    RUN(test_round_trip_every_type);
    RUN(test_byte_layout);
    RUN(test_named_fields);
    RUN(test_refusals);
    RUN(test_payload_bounds);
    RUN(test_chunk_cut);
    RUN(test_init_options);
    RUN(test_error_text);
    RUN(test_socket_round_trip_and_refusals);
    RUN(test_oversized_frame_dropped);
    RUN(test_ipv6_and_ipv4_endpoints);
    return test_summary();
}
