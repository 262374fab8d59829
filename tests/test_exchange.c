/* The ps client's exchange core (src/worker/exchange.h) driven directly, without ZeroMQ or a ps:
 * which replies an exchange awaits per ps and chunk and what each reply does to it. Replies out
 * of order, a duplicate, a reply for an earlier exchange, an ERROR reply, a ps lost mid-exchange
 * (its socket replaced), a timeout, a resent request, the sync repull, the protocol checks, and
 * the invariants (an exchange begun while one is under way aborts the test build). */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "child.h"
#include "core/assert.h"
#include "test.h"
#include "worker/exchange.h"

#define NP 2
static const size_t SIZES[NP] = {1000, 600};
static const char *const NAMES[NP] = {"tcp://ps0:2222", "tcp://ps1:2223"};
static const int CHUNKS[NP] = {3, 2};
#define T_US 5000000 /* the request timeout */

typedef struct {
    dt_exchange *x;
    uint32_t id[NP][4];   /* the request id sent for each slot */
    dt_ex_reply_info info; /* what the latest reply was */
    dt_error e;            /* why it failed the exchange */
} bed;

static void bed_open(bed *b) {
    memset(b, 0, sizeof *b);
    CHECK_MSG(dt_ex_open(&b->x, NP, SIZES, NAMES, &b->e) == DT_OK, "%s", b->e.msg);
}

/* Begins an exchange awaiting `want` (min_step for PARAMS) at time now. */
static void begin(bed *b, uint8_t want, int64_t min_step, int64_t now) {
    dt_ex_kind k = {.want = want, .min_step = min_step, .timeout_us = T_US};
    CHECK(dt_ex_begin(b->x, &k, CHUNKS, now) == DT_OK);
    CHECK(dt_ex_get_state(b->x) == DT_EX_OPEN);
}

/* The exchange is in state `want`; it ends, and the bed closes. */
static void bed_close(bed *b, dt_ex_state want) {
    CHECK(dt_ex_get_state(b->x) == want);
    dt_ex_end(b->x);
    CHECK(dt_ex_get_state(b->x) == DT_EX_IDLE);
    dt_ex_close(b->x);
}

/* begin, and every slot sent (a request of type req). */
static void begin_all(bed *b, uint8_t req, uint8_t want, int64_t min_step, int64_t now) {
    begin(b, want, min_step, now);
    for (int i = 0; i < NP; i++)
        for (int c = 0; c < dt_ex_chunks(b->x, i); c++) {
            CHECK(dt_ex_slot(b->x, i, c) == DT_EX_UNSENT);
            b->id[i][c] = dt_ex_new_id(b->x);
            CHECK(dt_ex_sent(b->x, i, c, req, b->id[i][c], now) == DT_OK);
            CHECK(dt_ex_slot(b->x, i, c) == DT_EX_AWAITED);
        }
}

/* A ps reply of type to request id about chunk c of ps i, at step. */
static dt_wire_header reply(uint8_t type, int i, int c, uint32_t id, int64_t step) {
    dt_wire_header h = dt_wire_header_make((dt_msg_type)type, DT_ROLE_PS, (uint16_t)i, id);
    h.shard = (uint32_t)i;
    h.generation = 1;
    h.global_step = step;
    if (type == DT_MSG_PARAMS || type == DT_MSG_PUSH_ACK) {
        h.chunk = (uint8_t)c;
        h.chunks = (uint8_t)CHUNKS[i];
    }
    if (type == DT_MSG_PARAMS) {
        uint64_t off, len;
        dt_wire_chunk(SIZES[i], (unsigned)CHUNKS[i], (unsigned)c, &off, &len);
        h.payload_bytes = len * 4;
    }
    return h;
}

/* Reply h comes from ps i (no payload is looked at). */
static int give(bed *b, int i, const dt_wire_header *h) {
    return dt_ex_reply(b->x, i, h, NULL, 0, &b->info, &b->e);
}

/* Every request still awaited is answered (type, at step): each reply is taken. */
static void answer_all(bed *b, uint8_t type, int64_t step) {
    for (int i = 0; i < NP; i++)
        for (int c = 0; c < CHUNKS[i]; c++) {
            if (dt_ex_slot(b->x, i, c) != DT_EX_AWAITED) continue;
            dt_wire_header h = reply(type, i, c, b->id[i][c], step);
            CHECK_MSG(give(b, i, &h) == DT_EX_TAKEN, "%s", b->e.msg);
        }
}

/* A bed whose first exchange has begun and sent every slot (begin_all). */
static void bed_start(bed *b, uint8_t req, uint8_t want, int64_t min_step, int64_t now) {
    bed_open(b);
    begin_all(b, req, want, min_step, now);
}

/* Chunks answered in reverse order, ps 1 before ps 0: each taken once, DONE with the last. */
static void test_out_of_order(void) {
    bed b;
    bed_start(&b, DT_MSG_PUSH, DT_MSG_PARAMS, 4, 100);
    int n = 0, total = CHUNKS[0] + CHUNKS[1];
    for (int i = NP - 1; i >= 0; i--)
        for (int c = CHUNKS[i] - 1; c >= 0; c--) {
            CHECK(dt_ex_get_state(b.x) == DT_EX_OPEN);
            dt_wire_header h = reply(DT_MSG_PARAMS, i, c, b.id[i][c], 4 + c);
            h.params.waited_us = (uint64_t)(100 * (c + 1));
            CHECK_MSG(give(&b, i, &h) == DT_EX_TAKEN, "%s", b.e.msg);
            CHECK(b.info.chunk == c && b.info.req == DT_MSG_PUSH && b.info.sent_us == 100 && b.info.accepted);
            CHECK(dt_ex_slot(b.x, i, c) == DT_EX_ARRIVED);
            CHECK(dt_ex_awaiting(b.x, i) == c);
            n++;
        }
    CHECK(n == total);
    CHECK(dt_ex_get_state(b.x) == DT_EX_DONE);
    int64_t steps[NP];
    int stale = -1;
    int64_t wait = -1;
    dt_ex_result(b.x, steps, &stale, &wait);
    CHECK(steps[0] == 4 && steps[1] == 4); /* a shard's step is its oldest chunk's */
    CHECK(stale == 0 && wait == 300);
    bed_close(&b, DT_EX_DONE);
}

/* Streaming: chunks sent one by one as they become ready, each answered before the next goes;
 * the exchange is DONE only once every chunk has been sent and answered. */
static void test_streamed(void) {
    bed b;
    bed_open(&b);
    begin(&b, DT_MSG_PARAMS, 1, 0);
    int order[][2] = {{1, 1}, {0, 2}, {1, 0}, {0, 1}, {0, 0}}; /* backward: last layers first */
    for (int n = 0; n < 5; n++) {
        int i = order[n][0], c = order[n][1];
        uint32_t id = dt_ex_new_id(b.x);
        CHECK(dt_ex_sent(b.x, i, c, DT_MSG_PUSH, id, n) == DT_OK);
        CHECK(dt_ex_get_state(b.x) == DT_EX_OPEN);
        dt_wire_header h = reply(DT_MSG_PARAMS, i, c, id, 1);
        CHECK(give(&b, i, &h) == DT_EX_TAKEN);
        CHECK(dt_ex_get_state(b.x) == (n == 4 ? DT_EX_DONE : DT_EX_OPEN));
        CHECK(dt_ex_overdue(b.x, 1 << 30) == -1); /* nothing due between chunks */
    }
    bed_close(&b, DT_EX_DONE);
}

/* A second reply to one request, and a reply once every reply is in: ignored, nothing counted twice. */
static void test_duplicate(void) {
    bed b;
    bed_start(&b, DT_MSG_PUSH, DT_MSG_PUSH_ACK, 0, 0);
    dt_wire_header h = reply(DT_MSG_PUSH_ACK, 0, 1, b.id[0][1], 7);
    CHECK(give(&b, 0, &h) == DT_EX_TAKEN);
    CHECK(give(&b, 0, &h) == DT_EX_IGNORED && b.info.ignored == DT_EX_DUPLICATE);
    CHECK(dt_ex_awaiting(b.x, 0) == CHUNKS[0] - 1);
    /* The same id on the other ps's socket answers nothing there. */
    CHECK(give(&b, 1, &h) == DT_EX_IGNORED && b.info.ignored == DT_EX_UNKNOWN);
    answer_all(&b, DT_MSG_PUSH_ACK, 7);
    CHECK(give(&b, 0, &h) == DT_EX_IGNORED && b.info.ignored == DT_EX_LATE);
    bed_close(&b, DT_EX_DONE);
}

/* An exchange that timed out leaves replies in flight: they reach the next exchange, which
 * ignores them (request ids are never reused). The deadline runs from the latest request. */
static void test_timeout_then_old_replies(void) {
    bed b;
    bed_start(&b, DT_MSG_PULL, DT_MSG_PARAMS, 0, 1000);
    CHECK(dt_ex_overdue(b.x, 1000 + T_US - 1) == -1);
    CHECK(dt_ex_slot(b.x, 0, 0) == DT_EX_AWAITED);
    dt_wire_header h = reply(DT_MSG_PARAMS, 0, 0, b.id[0][0], 0);
    CHECK(give(&b, 0, &h) == DT_EX_TAKEN);
    CHECK(dt_ex_overdue(b.x, 1000 + T_US) == 0); /* ps 0 still owes chunks 1 and 2 */
    dt_ex_cap_deadline(b.x, 2000);               /* this process is being stopped */
    CHECK(dt_ex_overdue(b.x, 2000) == 0 && dt_ex_deadline(b.x) == 2000);
    dt_ex_fail(b.x);
    CHECK(dt_ex_get_state(b.x) == DT_EX_FAILED && dt_ex_awaiting(b.x, 0) == 0 && dt_ex_overdue(b.x, 1 << 30) == -1);
    dt_wire_header old = reply(DT_MSG_PARAMS, 1, 1, b.id[1][1], 0);
    CHECK(give(&b, 1, &old) == DT_EX_IGNORED && b.info.ignored == DT_EX_LATE);
    dt_ex_end(b.x);

    uint32_t before[NP][4];
    memcpy(before, b.id, sizeof before);
    begin_all(&b, DT_MSG_PULL, DT_MSG_PARAMS, 0, 9000);
    CHECK(b.id[0][0] > before[NP - 1][CHUNKS[NP - 1] - 1]);
    for (int i = 0; i < NP; i++)
        for (int c = 0; c < CHUNKS[i]; c++) {
            dt_wire_header r = reply(DT_MSG_PARAMS, i, c, before[i][c], 0);
            CHECK(give(&b, i, &r) == DT_EX_IGNORED && b.info.ignored == DT_EX_UNKNOWN);
        }
    CHECK(dt_ex_awaiting(b.x, 0) == CHUNKS[0] && dt_ex_awaiting(b.x, 1) == CHUNKS[1]);
    answer_all(&b, DT_MSG_PARAMS, 0);
    CHECK(dt_ex_overdue(b.x, 1 << 30) == -1);
    bed_close(&b, DT_EX_DONE);
}

/* The streaming rule: each request sent renews the deadline (the replies are due a timeout after
 * the latest one). */
static void test_deadline_follows_latest_request(void) {
    bed b;
    bed_open(&b);
    begin(&b, DT_MSG_PARAMS, 0, 0);
    CHECK(dt_ex_overdue(b.x, 2 * T_US) == -1); /* nothing sent, nothing due */
    CHECK(dt_ex_sent(b.x, 0, 0, DT_MSG_PUSH, dt_ex_new_id(b.x), 10) == DT_OK);
    CHECK(dt_ex_sent(b.x, 1, 1, DT_MSG_PUSH, dt_ex_new_id(b.x), 3 * T_US) == DT_OK);
    CHECK(dt_ex_overdue(b.x, 10 + T_US) == -1);
    CHECK(dt_ex_overdue(b.x, 4 * T_US) == 0); /* the first ps owing a reply */
    dt_ex_fail(b.x);
    bed_close(&b, DT_EX_FAILED);
}

/* An ERROR reply fails the exchange, says who refused what, and keeps the refusal's status;
 * replies still in flight are then ignored. */
static void test_error_reply(void) {
    bed b;
    bed_start(&b, DT_MSG_PUSH, DT_MSG_PARAMS, 0, 0);
    const char text[] = "the ps's step is not what the request assumes";
    dt_wire_header h = dt_wire_header_make(DT_MSG_ERROR, DT_ROLE_PS, 1, b.id[1][1]);
    h.shard = 1;
    h.status = DT_WIRE_E_RESYNC;
    h.payload_bytes = sizeof text - 1;
    CHECK(dt_ex_reply(b.x, 1, &h, text, sizeof text - 1, &b.info, &b.e) == DT_EPROTO);
    CHECK(b.info.refused && b.info.chunk == 1 && dt_ex_refusal(b.x) == DT_WIRE_E_RESYNC);
    CHECK_CONTAINS(b.e.msg, "ps 1 at tcp://ps1:2223: PUSH refused: the ps's step is not what the request assumes");
    dt_wire_header r = reply(DT_MSG_PARAMS, 0, 0, b.id[0][0], 0);
    CHECK(give(&b, 0, &r) == DT_EX_IGNORED && b.info.ignored == DT_EX_LATE);
    bed_close(&b, DT_EX_FAILED);
}

/* A ps lost mid-exchange: its socket is replaced (ps_client.c's replace_socket), so what it owed
 * will never come and the exchange fails; replies the other ps sent meanwhile are not taken by
 * the next exchange, which goes through on the new socket. */
static void test_ps_lost_socket_replaced(void) {
    bed b;
    bed_start(&b, DT_MSG_PUSH, DT_MSG_PARAMS, 0, 0);
    for (int c = 0; c < CHUNKS[1]; c++) {
        dt_wire_header r = reply(DT_MSG_PARAMS, 1, c, b.id[1][c], 0);
        CHECK(give(&b, 1, &r) == DT_EX_TAKEN);
    }
    dt_ex_drop_ps(b.x, 1); /* owed nothing: nothing changes */
    CHECK(dt_ex_get_state(b.x) == DT_EX_OPEN);
    dt_ex_drop_ps(b.x, 0);
    CHECK(dt_ex_get_state(b.x) == DT_EX_FAILED);
    dt_ex_end(b.x);
    uint32_t old = b.id[1][0];
    begin_all(&b, DT_MSG_PUSH, DT_MSG_PARAMS, 0, 0);
    dt_wire_header r = reply(DT_MSG_PARAMS, 1, 0, old, 0);
    CHECK(give(&b, 1, &r) == DT_EX_IGNORED && b.info.ignored == DT_EX_UNKNOWN);
    answer_all(&b, DT_MSG_PARAMS, 0);
    bed_close(&b, DT_EX_DONE);
}

/* A request sent again (a HELLO resent every second): a reply to any of its ids answers it, the
 * others are then duplicates. A per-ps exchange has one slot per ps. */
static void test_resent_request(void) {
    bed b;
    bed_open(&b);
    begin(&b, DT_MSG_WELCOME, 0, 0);
    CHECK(dt_ex_chunks(b.x, 0) == 1 && dt_ex_chunks(b.x, 1) == 1);
    uint32_t first = dt_ex_new_id(b.x), other = dt_ex_new_id(b.x), second = dt_ex_new_id(b.x);
    CHECK(dt_ex_sent(b.x, 0, 0, DT_MSG_HELLO, first, 0) == DT_OK);
    CHECK(dt_ex_sent(b.x, 1, 0, DT_MSG_HELLO, other, 0) == DT_OK);
    CHECK(dt_ex_sent(b.x, 0, 0, DT_MSG_HELLO, second, 1000) == DT_OK);
    CHECK(dt_ex_awaiting(b.x, 0) == 1); /* still one reply due */
    dt_wire_header h = reply(DT_MSG_WELCOME, 0, 0, first, 0);
    h.shard_floats = SIZES[0];
    CHECK_MSG(give(&b, 0, &h) == DT_EX_TAKEN, "%s", b.e.msg);
    CHECK(b.info.sent_us == 1000);
    h.request_id = second;
    CHECK(give(&b, 0, &h) == DT_EX_IGNORED && b.info.ignored == DT_EX_DUPLICATE);
    h = reply(DT_MSG_WELCOME, 1, 0, other, 0);
    CHECK(give(&b, 1, &h) == DT_EX_TAKEN);
    bed_close(&b, DT_EX_DONE);
}

/* Replies that break the protocol fail the exchange, each naming what was wrong. */
static void test_protocol_checks(void) {
    struct {
        const char *what, *says;
    } cases[] = {
        {"type", "unexpected reply: got PUSH_ACK"},
        {"shard", "for shard 1"},
        {"chunk", "(chunk 2 of 3), expected PARAMS answering PUSH from ps 0 (chunk 1 of 3)"},
        {"size", "PARAMS payload of"},
        {"step", "answered a pull for step >= 5 with step 4 (chunk 1)"},
        {"status", "PUSH: "},
    };
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        bed b;
        bed_start(&b, DT_MSG_PUSH, DT_MSG_PARAMS, 5, 0);
        dt_wire_header h = reply(DT_MSG_PARAMS, 0, 1, b.id[0][1], 5);
        switch (t) {
        case 0: h = reply(DT_MSG_PUSH_ACK, 0, 1, b.id[0][1], 5); break;
        case 1: h.shard = 1; break;
        case 2: h.chunk = 2; break;
        case 3: h.payload_bytes += 4; break;
        case 4: h.global_step = 4; break;
        case 5: h.status = DT_WIRE_E_BAD_VALUE; break;
        }
        CHECK_MSG(give(&b, 0, &h) == DT_EPROTO, "%s", cases[t].what);
        CHECK_CONTAINS(b.e.msg, "ps 0 at tcp://ps0:2222: ");
        CHECK_CONTAINS(b.e.msg, cases[t].says);
        bed_close(&b, DT_EX_FAILED);
    }
    /* STALE is an outcome, not an error: counted per ps, not accepted (no error feedback). */
    bed b;
    bed_start(&b, DT_MSG_PUSH, DT_MSG_PARAMS, 0, 0);
    for (int i = 0; i < NP; i++)
        for (int c = 0; c < CHUNKS[i]; c++) {
            dt_wire_header h = reply(DT_MSG_PARAMS, i, c, b.id[i][c], 3);
            if (i == 1) h.status = DT_WIRE_STALE;
            CHECK(give(&b, i, &h) == DT_EX_TAKEN);
            CHECK(b.info.accepted == (i == 0));
        }
    int stale = 0;
    dt_ex_result(b.x, NULL, &stale, NULL);
    CHECK(stale == 1);
    CHECK(!dt_ex_stale_ref(b.x)); /* ps 0's chunk 0 took it: ps 0 counts its batch */
    bed_close(&b, DT_EX_DONE);
    /* ps 0's chunk 0 alone STALE (ps 1 took it): that is the verdict dynamic sharding follows. */
    bed_start(&b, DT_MSG_PUSH, DT_MSG_PARAMS, 0, 0);
    for (int i = 0; i < NP; i++)
        for (int c = 0; c < CHUNKS[i]; c++) {
            dt_wire_header h = reply(DT_MSG_PARAMS, i, c, b.id[i][c], 3);
            if (i == 0 && c == 0) h.status = DT_WIRE_STALE;
            CHECK(give(&b, i, &h) == DT_EX_TAKEN);
        }
    dt_ex_result(b.x, NULL, &stale, NULL);
    CHECK(stale == 1 && dt_ex_stale_ref(b.x));
    bed_close(&b, DT_EX_DONE);
}

/* Sync mode: chunks that came back a step apart are pulled again, exactly at the newest step (or,
 * for a worker resuming, the oldest); a reply at another step fails the exchange. */
static void test_repull(void) {
    for (int oldest = 0; oldest <= 1; oldest++) {
        bed b;
        bed_start(&b, DT_MSG_PULL, DT_MSG_PARAMS, 0, 0);
        for (int i = 0; i < NP; i++)
            for (int c = 0; c < CHUNKS[i]; c++) {
                dt_wire_header h = reply(DT_MSG_PARAMS, i, c, b.id[i][c], i == 1 && c == 0 ? 8 : 7);
                CHECK(give(&b, i, &h) == DT_EX_TAKEN);
            }
        int64_t target = -1;
        CHECK(dt_ex_repull(b.x, oldest, &target) == (oldest ? 1 : 2));
        CHECK(target == (oldest ? 7 : 8));
        CHECK(dt_ex_get_state(b.x) == DT_EX_OPEN);
        int resend = 0;
        for (int i = 0; i < NP; i++)
            for (int c = 0; c < CHUNKS[i]; c++) {
                if (dt_ex_slot(b.x, i, c) != DT_EX_UNSENT) continue;
                resend++;
                b.id[i][c] = dt_ex_new_id(b.x);
                CHECK(dt_ex_sent(b.x, i, c, DT_MSG_PULL, b.id[i][c], 50) == DT_OK);
            }
        CHECK(resend == (oldest ? 1 : CHUNKS[0] + CHUNKS[1] - 1));
        answer_all(&b, DT_MSG_PARAMS, target);
        CHECK(dt_ex_get_state(b.x) == DT_EX_DONE);
        CHECK(dt_ex_repull(b.x, oldest, &target) == 0 && dt_ex_get_state(b.x) == DT_EX_DONE);
        int64_t steps[NP];
        dt_ex_result(b.x, steps, NULL, NULL);
        CHECK(steps[0] == target && steps[1] == target);
        dt_ex_end(b.x);

        /* An exact pull answered at another step. */
        begin_all(&b, DT_MSG_PULL, DT_MSG_PARAMS, 0, 0);
        for (int i = 0; i < NP; i++)
            for (int c = 0; c < CHUNKS[i]; c++) {
                dt_wire_header h = reply(DT_MSG_PARAMS, i, c, b.id[i][c], c == 0 ? 3 : 2);
                CHECK(give(&b, i, &h) == DT_EX_TAKEN);
            }
        CHECK(dt_ex_repull(b.x, 0, &target) == 2 && target == 3);
        uint32_t id = dt_ex_new_id(b.x);
        CHECK(dt_ex_sent(b.x, 0, 1, DT_MSG_PULL, id, 60) == DT_OK);
        dt_wire_header h = reply(DT_MSG_PARAMS, 0, 1, id, 4);
        CHECK(give(&b, 0, &h) == DT_EPROTO);
        CHECK_CONTAINS(b.e.msg, "answered an exact pull of step 3 with step 4 (chunk 1)");
        bed_close(&b, DT_EX_FAILED);
    }
}

/* Sparse tables (the multi kind): 3 SPARSE_PULLs to ps 0, none to ps 1; the SPARSE_ROWS replies name
 * no chunk and come in any order, each taken for its own request by id; a second reply to one is a
 * duplicate; the exchange is DONE once the three are in. */
static void test_sparse_multi(void) {
    bed b;
    bed_open(&b);
    const int slots[NP] = {3, 0};
    dt_ex_kind k = {.want = DT_MSG_SPARSE_ROWS, .timeout_us = T_US, .multi = 1};
    CHECK(dt_ex_begin(b.x, &k, slots, 0) == DT_OK);
    CHECK(dt_ex_chunks(b.x, 0) == 3 && dt_ex_chunks(b.x, 1) == 0 && !dt_ex_awaiting(b.x, 1));
    for (int c = 0; c < 3; c++) {
        b.id[0][c] = dt_ex_new_id(b.x);
        CHECK(dt_ex_sent(b.x, 0, c, DT_MSG_SPARSE_PULL, b.id[0][c], 10) == DT_OK);
    }
    const int order[3] = {2, 0, 1};
    for (int j = 0; j < 3; j++) {
        dt_wire_header h = dt_wire_header_make(DT_MSG_SPARSE_ROWS, DT_ROLE_PS, 0, b.id[0][order[j]]);
        h.sections.count = 1, h.sections.ids = 1, h.sections.floats = 1, h.payload_bytes = 4;
        int rc = dt_ex_reply(b.x, 0, &h, NULL, 4, &b.info, &b.e);
        CHECK_MSG(rc == DT_EX_TAKEN && b.info.chunk == order[j], "%s (slot %d)", b.e.msg, b.info.chunk);
        CHECK(dt_ex_get_state(b.x) == (j < 2 ? DT_EX_OPEN : DT_EX_DONE));
        if (j == 0) {
            CHECK(dt_ex_reply(b.x, 0, &h, NULL, 4, &b.info, &b.e) == DT_EX_IGNORED);
            CHECK(b.info.ignored == DT_EX_DUPLICATE);
        }
    }
    bed_close(&b, DT_EX_DONE);
}

static void begin_twice(void *unused) {
    (void)unused;
    bed b;
    bed_open(&b);
    dt_ex_kind k = {.want = DT_MSG_ACK, .timeout_us = T_US};
    dt_ex_begin(b.x, &k, NULL, 0);
    dt_ex_begin(b.x, &k, NULL, 0); /* an exchange begun while one is under way */
}

static void sent_twice(void *unused) {
    (void)unused;
    bed b;
    bed_start(&b, DT_MSG_PUSH, DT_MSG_PUSH_ACK, 0, 0);
    dt_wire_header h = reply(DT_MSG_PUSH_ACK, 0, 0, b.id[0][0], 0);
    give(&b, 0, &h);
    dt_ex_sent(b.x, 0, 0, DT_MSG_PUSH, dt_ex_new_id(b.x), 0); /* a chunk sent again after its reply */
}

/* A request to ps 1 alone (the WORK messages go to ps 0 alone; here ps 1, so that the slot is not
 * merely the first): ps 0 has no slot, its replies are ignored as UNKNOWN; the one reply of ps 1
 * ends it, whatever its status (a WORK_GRANT saying WAIT is an answer). */
static void test_alone(void) {
    bed b;
    bed_open(&b);
    dt_ex_kind k = {.want = DT_MSG_WORK_GRANT, .timeout_us = T_US, .alone = 1, .ps = 1};
    CHECK(dt_ex_begin(b.x, &k, CHUNKS, 100) == DT_OK);
    CHECK(dt_ex_chunks(b.x, 0) == 0 && dt_ex_chunks(b.x, 1) == 1);
    CHECK(dt_ex_slot(b.x, 0, 0) == DT_EX_UNUSED && dt_ex_slot(b.x, 1, 0) == DT_EX_UNSENT);
    uint32_t id = dt_ex_new_id(b.x);
    CHECK(dt_ex_sent(b.x, 1, 0, DT_MSG_WORK_ASK, id, 100) == DT_OK);
    CHECK(dt_ex_awaiting(b.x, 0) == 0 && dt_ex_awaiting(b.x, 1) == 1);
    CHECK(dt_ex_overdue(b.x, 100 + T_US + 1) == 1);
    dt_wire_header h = reply(DT_MSG_WORK_GRANT, 0, 0, id, 7);
    CHECK(give(&b, 0, &h) == DT_EX_IGNORED && b.info.ignored == DT_EX_UNKNOWN);
    h = reply(DT_MSG_WORK_GRANT, 1, 0, id, 7);
    h.status = DT_WIRE_WORK_WAIT;
    CHECK_MSG(give(&b, 1, &h) == DT_EX_TAKEN, "%s", b.e.msg);
    CHECK(b.info.req == DT_MSG_WORK_ASK && !b.info.accepted);
    bed_close(&b, DT_EX_DONE);
}

static void alone_chunked(void *unused) {
    (void)unused;
    bed b;
    bed_open(&b);
    dt_ex_kind k = {.want = DT_MSG_PARAMS, .timeout_us = T_US, .alone = 1, .ps = 0};
    dt_ex_begin(b.x, &k, CHUNKS, 0); /* per chunk of every ps: never alone */
}

static void end_idle(void *unused) {
    (void)unused;
    bed b;
    bed_open(&b);
    dt_ex_end(b.x); /* no exchange to end */
}

static void test_invariants(void) {
    setenv("DTRAIN_ABORT_ON_ASSERT", "1", 1); /* as every test runs (ctest sets it) */
    void (*fns[])(void *) = {begin_twice, sent_twice, end_idle, alone_chunked};
    const char *says[] = {"x->state == DT_EX_IDLE", "s->state == DT_EX_AWAITED", "x->state != DT_EX_IDLE",
                          "!kind->alone || (!chunked"};
    for (int k = 0; k < 4; k++) {
        char out[1024];
        int st = run_child(fns[k], NULL, out, sizeof out);
        CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "case %d: status %d", k, st);
        CHECK_CONTAINS(out, "exchange.c:");
        CHECK_CONTAINS(out, says[k]);
    }
}

int main(void) {
    RUN(test_out_of_order);
    RUN(test_streamed);
    RUN(test_duplicate);
    RUN(test_timeout_then_old_replies);
    RUN(test_deadline_follows_latest_request);
    RUN(test_error_reply);
    RUN(test_ps_lost_socket_replaced);
    RUN(test_resent_request);
    RUN(test_protocol_checks);
    RUN(test_repull);
    RUN(test_sparse_multi);
    RUN(test_alone);
    RUN(test_invariants);
    return test_summary();
}
