/* The own transport's pieces (transport/frame.h, transport/loop.h; docs/transport.md): the frame
 * reader fed a stream in every split, a payload over the largest frame refused before anything is
 * allocated, counted buffers (a peer's share, the one budget B) whose limit mutes the reader, and
 * over a real socket pair the muted descriptor pushing back on its writer (the kernel's buffer
 * fills, the writer's send would block) until bytes are given back; the writer's partial writes
 * and its releases (the send's completion). */
#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "test.h"
#include "transport/frame.h"
#include "transport/loop.h"

/* A message as it travels: the header, then the payload of `bytes` bytes (byte k is seed + k). */
static size_t message(uint8_t *out, dt_msg_type type, uint32_t id, size_t bytes, uint8_t seed) {
    dt_wire_header h = dt_wire_header_make(type, DT_ROLE_WORKER, 3, id);
    h.payload_bytes = bytes;
    dt_wire_encode(out, &h);
    for (size_t k = 0; k < bytes; k++) out[DT_WIRE_HEADER_SIZE + k] = (uint8_t)(seed + k);
    return DT_WIRE_HEADER_SIZE + bytes;
}

static int payload_ok(const dt_bytes *b, size_t bytes, uint8_t seed) {
    if (b->size != bytes || (bytes && !b->data)) return 0;
    for (size_t k = 0; k < bytes; k++)
        if (((const uint8_t *)b->data)[k] != (uint8_t)(seed + k)) return 0;
    return 1;
}

/* Two messages in one stream, fed in pieces of every size from 1 byte to the whole: each arrives
 * whole and equal, the feed stops at a whole message, and every count is given back. */
static void test_every_split(void) {
    static uint8_t stream[2 * DT_WIRE_HEADER_SIZE + 3000];
    size_t n1 = message(stream, DT_MSG_PUSH, 11, 2000, 1);
    size_t n = n1 + message(stream + n1, DT_MSG_STATUS, 12, 0, 0);
    dt_budget b;
    dt_budget_init(&b, 1 << 20);
    dt_account *a = dt_account_new(&b, 1 << 20);
    int bad = 0;
    for (size_t piece = 1; piece <= n; piece += piece < 130 ? 1 : 97) {
        dt_frame_reader r;
        dt_frame_init(&r, a, 4096);
        int got = 0;
        for (size_t off = 0; off < n;) {
            size_t len = n - off < piece ? n - off : piece, used = 0;
            dt_error e = {0};
            int rc = dt_frame_feed(&r, stream + off, len, &used, &e);
            off += used;
            if (rc == DT_FRAME_WHOLE) {
                dt_wire_header h;
                dt_bytes p;
                dt_frame_take(&r, &h, &p);
                if (got == 0) bad += !(h.type == DT_MSG_PUSH && h.request_id == 11 && payload_ok(&p, 2000, 1));
                else bad += !(h.type == DT_MSG_STATUS && h.request_id == 12 && p.size == 0 && p.release == NULL);
                if (got == 0) bad += dt_account_held(a) < 2000 || dt_frame_partial(&r) != 0;
                got++;
                dt_bytes_release(&p);
            } else if (rc != DT_FRAME_MORE || used != len) {
                bad++;
                break;
            }
        }
        bad += got != 2;
        bad += dt_account_held(a) != 0 || atomic_load(&b.held) != 0;
        dt_frame_close(&r);
    }
    CHECK(bad == 0);
    dt_account_unref(a);
}

/* A payload past the largest frame is refused once its header is in, nothing allocated (2^40
 * bytes: an allocation would fail, and abort under ASan), nothing counted; the request id is kept
 * to answer the refusal, and the reader stays failed. Other protocol versions and bad headers too. */
static void test_refusals(void) {
    uint8_t hb[DT_WIRE_HEADER_SIZE];
    dt_wire_header h = dt_wire_header_make(DT_MSG_PUSH, DT_ROLE_WORKER, 0, 99);
    h.payload_bytes = UINT64_C(1) << 40;
    dt_wire_encode(hb, &h);
    dt_budget b;
    dt_budget_init(&b, UINT64_MAX);
    dt_account *a = dt_account_new(&b, UINT64_MAX);
    dt_frame_reader r;
    dt_frame_init(&r, a, 1 << 20);
    size_t used;
    dt_error e = {0};
    CHECK(dt_frame_feed(&r, hb, sizeof hb, &used, &e) == DT_EFORMAT && used == sizeof hb);
    CHECK_CONTAINS(e.msg, "largest frame");
    CHECK(r.hdr.request_id == 99 && dt_account_held(a) == 0 && dt_frame_partial(&r) == 0);
    CHECK(dt_frame_feed(&r, hb, 1, &used, &e) == DT_EFORMAT && used == 0); /* failed for good */
    dt_frame_close(&r);

    dt_wire_header ok = dt_wire_header_make(DT_MSG_STATUS, DT_ROLE_WORKER, 0, 5);
    dt_wire_encode(hb, &ok);
    hb[4] = DT_WIRE_VERSION - 1;
    dt_frame_init(&r, a, 1 << 20);
    CHECK(dt_frame_feed(&r, hb, sizeof hb, &used, &e) == DT_EPROTO && r.hdr.request_id == 5);
    dt_frame_close(&r);
    dt_wire_encode(hb, &ok);
    hb[0] = 'X';
    dt_frame_init(&r, a, 1 << 20);
    CHECK(dt_frame_feed(&r, hb, sizeof hb, &used, &e) == DT_EFORMAT);
    dt_frame_close(&r);
    dt_account_unref(a);
}

/* B reached: the next payload cannot be counted, so the reader stops right after its header
 * (muted) and takes nothing more until the first payload is released. A peer at its share is muted
 * before it reads a byte of the next message; one message always goes to an account holding
 * nothing, however large its share. */
static void test_budget_mutes(void) {
    static uint8_t stream[2 * (DT_WIRE_HEADER_SIZE + 800)];
    size_t n1 = message(stream, DT_MSG_PUSH, 1, 800, 7);
    size_t n = n1 + message(stream + n1, DT_MSG_PUSH, 2, 800, 9);
    dt_budget b;
    dt_budget_init(&b, 1200); /* one 800-byte payload with its holder, not two */
    dt_account *a = dt_account_new(&b, 1 << 20);
    dt_frame_reader r;
    dt_frame_init(&r, a, 4096);
    size_t used, off = 0;
    dt_error e = {0};
    CHECK(dt_frame_feed(&r, stream, n, &used, &e) == DT_FRAME_WHOLE && used == n1);
    off += used;
    dt_wire_header h;
    dt_bytes p1;
    dt_frame_take(&r, &h, &p1);
    CHECK(payload_ok(&p1, 800, 7));
    uint64_t one = atomic_load(&b.held);
    CHECK(one >= 800 && one <= 1200 && dt_account_held(a) == one);
    CHECK(dt_frame_feed(&r, stream + off, n - off, &used, &e) == DT_FRAME_MUTED && used == DT_WIRE_HEADER_SIZE);
    off += used;
    CHECK(dt_frame_feed(&r, stream + off, n - off, &used, &e) == DT_FRAME_MUTED && used == 0);
    CHECK(atomic_load(&b.held) == one && dt_frame_partial(&r) == 0); /* nothing allocated meanwhile */
    dt_bytes_release(&p1);
    CHECK(atomic_load(&b.held) == 0);
    CHECK(dt_frame_feed(&r, stream + off, n - off, &used, &e) == DT_FRAME_WHOLE && off + used == n);
    dt_bytes p2;
    dt_frame_take(&r, &h, &p2);
    CHECK(h.request_id == 2 && payload_ok(&p2, 800, 9));
    dt_frame_close(&r);
    dt_account_unref(a); /* the payload holds the account: released after it, still counted right */
    dt_bytes_release(&p2);
    CHECK(atomic_load(&b.held) == 0);

    /* A share of 100 bytes: the first 800-byte message goes; while it is held, nothing is read. */
    a = dt_account_new(&b, 100);
    dt_frame_init(&r, a, 4096);
    CHECK(dt_frame_feed(&r, stream, n, &used, &e) == DT_FRAME_WHOLE && used == n1);
    dt_frame_take(&r, &h, &p1);
    CHECK(!dt_account_may_read(a));
    CHECK(dt_frame_feed(&r, stream + n1, n - n1, &used, &e) == DT_FRAME_MUTED && used == 0);
    dt_bytes_release(&p1);
    CHECK(dt_account_may_read(a));
    CHECK(dt_frame_feed(&r, stream + n1, n - n1, &used, &e) == DT_FRAME_WHOLE && used == n - n1);
    dt_frame_take(&r, &h, &p2);
    dt_bytes_release(&p2);
    dt_frame_close(&r);
    dt_account_unref(a);
    CHECK(atomic_load(&b.held) == 0);
}

/* ---- over a socket pair, through the loop ---- */

typedef struct {
    dt_loop *loop;
    dt_frame_reader r;
    dt_bytes held[64];        /* payloads received and not yet released */
    int n_held, got, failed, muted_seen;
} sink;

static void on_readable(void *user, int fd, unsigned events) {
    sink *s = user;
    dt_error e = {0};
    for (;;) {
        int rc = dt_frame_read(&s->r, fd, &e);
        if (rc == DT_FRAME_WHOLE) {
            dt_wire_header h;
            dt_bytes p;
            dt_frame_take(&s->r, &h, &p);
            s->failed += !payload_ok(&p, 65536, (uint8_t)h.request_id);
            s->got++;
            if (s->n_held < 64) s->held[s->n_held++] = p;
            else dt_bytes_release(&p);
            continue;
        }
        if (rc == DT_FRAME_MUTED) { /* TCP (here: the socket) pushes back on the writer */
            s->muted_seen++;
            dt_loop_set(s->loop, fd, 0, NULL);
        } else if (rc != DT_FRAME_MORE) {
            s->failed++;
            dt_loop_del(s->loop, fd);
        }
        return;
    }
}

/* Writes as much of buf as the socket takes now. */
static size_t write_some(int fd, const uint8_t *buf, size_t n) {
    size_t off = 0;
    while (off < n) {
        ssize_t k = send(fd, buf + off, n - off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        off += (size_t)k;
    }
    return off;
}

static void test_backpressure_over_a_socket(void) {
    enum { MSGS = 48, BYTES = 65536 };
    static uint8_t stream[MSGS * (DT_WIRE_HEADER_SIZE + BYTES)];
    size_t n = 0;
    for (int k = 0; k < MSGS; k++) n += message(stream + n, DT_MSG_PUSH, (uint32_t)k, BYTES, (uint8_t)k);
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
    dt_budget b;
    dt_budget_init(&b, 4 * (BYTES + 64)); /* about 4 payloads */
    dt_account *a = dt_account_new(&b, UINT64_MAX);
    sink s = {0};
    dt_error e = {0};
    CHECK(dt_loop_open(&s.loop, &e) == DT_OK);
    dt_frame_init(&s.r, a, BYTES);
    CHECK(dt_loop_add(s.loop, sv[1], DT_LOOP_IN, on_readable, &s, &e) == DT_OK);
    CHECK(dt_loop_add(s.loop, sv[1], DT_LOOP_IN, on_readable, &s, &e) == DT_EINVAL); /* once */

    /* Write while the reader reads, until the writer can write no more: the reader is muted at B,
     * the socket's buffers fill, and the writer is pushed back, far from done. */
    size_t sent = 0;
    for (int round = 0; round < 1000; round++) {
        size_t k = write_some(sv[0], stream + sent, n - sent);
        sent += k;
        int called = dt_loop_wait(s.loop, 10, &e);
        if (k == 0 && called == 0 && s.muted_seen) break;
    }
    CHECK(s.muted_seen >= 1 && dt_loop_events(s.loop, sv[1]) == 0);
    CHECK(s.got >= 3 && s.got <= 5); /* what B holds */
    CHECK(sent < n / 2);
    CHECK(write_some(sv[0], stream + sent, n - sent) == 0); /* pushed back */
    CHECK(dt_loop_wait(s.loop, 20, &e) == 0); /* muted: not called, though bytes wait */
    CHECK(atomic_load(&b.held) <= b.limit);

    /* Bytes given back, the reader unmuted: everything arrives, intact, B never passed. */
    for (int round = 0; round < 5000 && (s.got < MSGS || sent < n); round++) {
        for (int k = 0; k < s.n_held; k++) dt_bytes_release(&s.held[k]);
        s.n_held = 0;
        if (dt_loop_events(s.loop, sv[1]) == 0) dt_loop_set(s.loop, sv[1], DT_LOOP_IN, &e);
        sent += write_some(sv[0], stream + sent, n - sent);
        dt_loop_wait(s.loop, 10, &e);
        if (atomic_load(&b.held) > b.limit) s.failed++;
    }
    CHECK(s.got == MSGS && sent == n && s.failed == 0);
    for (int k = 0; k < s.n_held; k++) dt_bytes_release(&s.held[k]);
    CHECK(atomic_load(&b.held) == 0);

    /* The writer hangs up within a message: named, and the reader fails. */
    uint8_t half[DT_WIRE_HEADER_SIZE + 10];
    message(half, DT_MSG_PUSH, 1, 10, 0);
    CHECK(write_some(sv[0], half, DT_WIRE_HEADER_SIZE + 4) == DT_WIRE_HEADER_SIZE + 4);
    close(sv[0]);
    dt_error r = {0};
    int rc = DT_FRAME_MORE;
    for (int k = 0; k < 100 && rc == DT_FRAME_MORE; k++) rc = dt_frame_read(&s.r, sv[1], &r);
    CHECK(rc == DT_ENET);
    CHECK_CONTAINS(r.msg, "within a message");
    CHECK(atomic_load(&b.held) > 0); /* the partial payload is counted ... */
    dt_frame_close(&s.r);
    CHECK(atomic_load(&b.held) == 0); /* ... and given back with the reader */
    dt_loop_close(s.loop);
    close(sv[1]);
    dt_account_unref(a);
}

static atomic_int released;

static void count_release(void *hint) {
    (void)hint;
    atomic_fetch_add(&released, 1);
}

/* The writer: messages written with writev from where their payloads lie, in any partial writes
 * the socket takes, each payload released once its last byte is written (not before), every one
 * read back intact by the reader; closing the writer releases what it still queues at once; an
 * entry the account cannot count is refused, its payload released. */
static void test_writer(void) {
    enum { MSGS = 40, BYTES = 65536 };
    static uint8_t data[MSGS][BYTES];
    for (int k = 0; k < MSGS; k++)
        for (int i = 0; i < BYTES; i++) data[k][i] = (uint8_t)(k + i);
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
    dt_budget b;
    dt_budget_init(&b, 1 << 20);
    dt_account *out = dt_account_new(&b, 1 << 20), *in = dt_account_new(NULL, UINT64_MAX);
    dt_frame_writer w;
    dt_frame_writer_init(&w, out);
    dt_error e = {0};
    atomic_store(&released, 0);
    for (int k = 0; k < MSGS; k++) {
        dt_wire_header h = dt_wire_header_make(DT_MSG_PUSH, DT_ROLE_WORKER, 1, (uint32_t)k);
        dt_bytes p = {.data = data[k], .size = BYTES, .release = count_release};
        CHECK(dt_frame_queue(&w, &h, &p, &e) == DT_OK && h.payload_bytes == BYTES && p.release == NULL);
    }
    CHECK(w.queued == MSGS && dt_account_held(out) > 0);
    /* The socket takes a part: the rest waits, and only payloads written whole are released. */
    CHECK(dt_frame_write(&w, sv[0], &e) == DT_FRAME_MORE);
    CHECK(w.queued > 0 && w.queued < MSGS);
    CHECK(atomic_load(&released) == MSGS - (int)w.queued);

    dt_frame_reader r;
    dt_frame_init(&r, in, BYTES);
    int got = 0, bad = 0;
    for (int round = 0; round < 10000 && got < MSGS; round++) {
        int wr = dt_frame_write(&w, sv[0], &e);
        bad += wr != DT_OK && wr != DT_FRAME_MORE;
        int rc;
        while ((rc = dt_frame_read(&r, sv[1], &e)) == DT_FRAME_WHOLE) {
            dt_wire_header h;
            dt_bytes p;
            dt_frame_take(&r, &h, &p);
            bad += h.request_id != (uint32_t)got || p.size != BYTES || memcmp(p.data, data[got], BYTES) != 0;
            got++;
            dt_bytes_release(&p);
        }
        bad += rc != DT_FRAME_MORE;
    }
    CHECK(got == MSGS && bad == 0);
    CHECK(w.queued == 0 && atomic_load(&released) == MSGS && dt_account_held(out) == 0);

    /* Closed with messages unsent: their payloads are released before close returns. */
    for (int k = 0; k < 3; k++) {
        dt_wire_header h = dt_wire_header_make(DT_MSG_PARAMS, DT_ROLE_PS, 0, 0);
        dt_bytes p = {.data = data[k], .size = BYTES, .release = count_release};
        CHECK(dt_frame_queue(&w, &h, &p, &e) == DT_OK);
    }
    CHECK(atomic_load(&released) == MSGS);
    dt_frame_writer_close(&w);
    CHECK(atomic_load(&released) == MSGS + 3 && atomic_load(&b.held) == 0);

    /* A share of one entry: the second is refused, its payload released at once. */
    dt_account *tight = dt_account_new(&b, 8);
    dt_frame_writer_init(&w, tight);
    dt_wire_header h = dt_wire_header_make(DT_MSG_PARAMS, DT_ROLE_PS, 0, 0);
    dt_bytes p = {.data = data[0], .size = BYTES, .release = count_release};
    CHECK(dt_frame_queue(&w, &h, &p, &e) == DT_OK);
    p = (dt_bytes){.data = data[1], .size = BYTES, .release = count_release};
    CHECK(dt_frame_queue(&w, &h, &p, &e) == DT_ENOMEM && atomic_load(&released) == MSGS + 4);
    CHECK_CONTAINS(e.msg, "budget");
    dt_frame_writer_close(&w);
    CHECK(atomic_load(&released) == MSGS + 5 && atomic_load(&b.held) == 0);
    dt_account_unref(tight);
    dt_frame_close(&r);
    dt_account_unref(out);
    dt_account_unref(in);
    close(sv[0]);
    close(sv[1]);
}

int main(void) {
    RUN(test_every_split);
    RUN(test_refusals);
    RUN(test_budget_mutes);
    RUN(test_backpressure_over_a_socket);
    RUN(test_writer);
    return test_summary();
}
