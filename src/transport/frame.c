#include "transport/frame.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "core/error.h"

struct dt_account {
    atomic_int refs;
    atomic_ullong held;
    dt_budget *budget;
    uint64_t share;
};

void dt_budget_init(dt_budget *b, uint64_t limit) {
    b->limit = limit;
    atomic_init(&b->held, 0);
}

dt_account *dt_account_new(dt_budget *b, uint64_t share) {
    dt_account *a = malloc(sizeof *a);
    if (!a) return NULL;
    atomic_init(&a->refs, 1);
    atomic_init(&a->held, 0);
    a->budget = b;
    a->share = share;
    return a;
}

static void account_ref(dt_account *a) {
    if (a) atomic_fetch_add(&a->refs, 1);
}

void dt_account_unref(dt_account *a) {
    if (a && atomic_fetch_sub(&a->refs, 1) == 1) free(a);
}

/* Only the reading thread takes; any thread gives. So the account's check-then-add cannot be
 * overtaken by another take; B is shared by every reader, hence its compare-and-swap. One message
 * always goes to an account that holds nothing, however large (a share smaller than the largest
 * message would otherwise never read it); B is never passed. */
int dt_account_take(dt_account *a, uint64_t bytes) {
    if (!a || !bytes) return 0;
    uint64_t mine = atomic_load(&a->held);
    if (mine && (mine + bytes < mine || mine + bytes > a->share)) return -1;
    if (a->budget) {
        unsigned long long all = atomic_load(&a->budget->held);
        do {
            if (all + bytes < all || all + bytes > a->budget->limit) return -1;
        } while (!atomic_compare_exchange_weak(&a->budget->held, &all, all + bytes));
    }
    atomic_fetch_add(&a->held, bytes);
    return 0;
}

void dt_account_give(dt_account *a, uint64_t bytes) {
    if (!a || !bytes) return;
    atomic_fetch_sub(&a->held, bytes);
    if (a->budget) atomic_fetch_sub(&a->budget->held, bytes);
}

uint64_t dt_account_held(const dt_account *a) { return a ? atomic_load(&a->held) : 0; }

int dt_account_may_read(const dt_account *a) {
    if (!a) return 1;
    return atomic_load(&a->held) < a->share && (!a->budget || atomic_load(&a->budget->held) < a->budget->limit);
}

/* ---- the frame reader ---- */

enum { S_HEADER, S_PAYLOAD, S_WHOLE, S_FAILED };

/* A payload's buffer: its account and count, then the bytes (16-byte aligned, as malloc's). */
typedef struct {
    dt_account *acct;
    uint64_t counted;
} block_hold;
#define HOLD_BYTES ((sizeof(block_hold) + 15) & ~(size_t)15)

static void release_block(void *hint) {
    block_hold *h = hint;
    dt_account_give(h->acct, h->counted);
    dt_account_unref(h->acct);
    free(h);
}

void dt_frame_init(dt_frame_reader *r, dt_account *acct, uint64_t max_frame) {
    memset(r, 0, sizeof *r);
    account_ref(acct);
    r->acct = acct;
    r->max_frame = max_frame;
    r->state = S_HEADER;
}

void dt_frame_close(dt_frame_reader *r) {
    if (r->block) release_block(r->block);
    r->block = NULL;
    dt_account_unref(r->acct);
    r->acct = NULL;
    r->state = S_FAILED;
}

uint64_t dt_frame_partial(const dt_frame_reader *r) {
    return r->block && r->state == S_PAYLOAD ? ((const block_hold *)(const void *)r->block)->counted : 0;
}

static int fail(dt_frame_reader *r, int code) {
    r->state = S_FAILED;
    return code;
}

/* Where the next bytes go (*dst, at most *len), or why none can be taken now. */
static int next_room(dt_frame_reader *r, uint8_t **dst, size_t *len, dt_error *err) {
    switch (r->state) {
    case S_WHOLE:
        return DT_FRAME_WHOLE;
    case S_FAILED:
        return dt_errorf(err, DT_EFORMAT, "the stream failed earlier: no more messages from it");
    case S_HEADER:
        if (r->head_got == 0 && !dt_account_may_read(r->acct)) return DT_FRAME_MUTED;
        *dst = r->head + r->head_got;
        *len = sizeof r->head - r->head_got;
        return DT_FRAME_MORE;
    default:
        break;
    }
    if (!r->block) { /* its header was checked: counted, then allocated, whole */
        uint64_t counted = HOLD_BYTES + r->hdr.payload_bytes;
        if (dt_account_take(r->acct, counted)) return DT_FRAME_MUTED;
        block_hold *h = malloc((size_t)counted);
        if (!h) {
            dt_account_give(r->acct, counted);
            return fail(r, dt_errorf(err, DT_ENOMEM, "out of memory for a %llu-byte payload",
                                     (unsigned long long)r->hdr.payload_bytes));
        }
        account_ref(r->acct);
        *h = (block_hold){.acct = r->acct, .counted = counted};
        r->block = (uint8_t *)h;
    }
    *dst = r->block + HOLD_BYTES + r->payload_got;
    *len = (size_t)r->hdr.payload_bytes - r->payload_got;
    return DT_FRAME_MORE;
}

/* n bytes were written where next_room said. */
static int advance(dt_frame_reader *r, size_t n, dt_error *err) {
    if (r->state == S_PAYLOAD) {
        r->payload_got += n;
        if (r->payload_got == r->hdr.payload_bytes) r->state = S_WHOLE;
        return r->state == S_WHOLE ? DT_FRAME_WHOLE : DT_FRAME_MORE;
    }
    r->head_got += n;
    if (r->head_got < sizeof r->head) return DT_FRAME_MORE;
    int rc = dt_wire_decode(&r->hdr, r->head, sizeof r->head, err);
    if (rc) {
        r->hdr.request_id = dt_wire_peek_request_id(r->head, sizeof r->head); /* to answer the refusal */
        return fail(r, rc);
    }
    if (r->hdr.payload_bytes > r->max_frame || r->hdr.payload_bytes > SIZE_MAX - HOLD_BYTES)
        return fail(r, dt_errorf(err, DT_EFORMAT, "%s header announces %llu payload bytes, more than the largest "
                                 "frame here (%llu): refused before reading it", dt_wire_type_name(r->hdr.type),
                                 (unsigned long long)r->hdr.payload_bytes, (unsigned long long)r->max_frame));
    r->state = r->hdr.payload_bytes ? S_PAYLOAD : S_WHOLE;
    return r->state == S_WHOLE ? DT_FRAME_WHOLE : DT_FRAME_MORE;
}

int dt_frame_feed(dt_frame_reader *r, const void *data, size_t n, size_t *used, dt_error *err) {
    const uint8_t *in = data;
    *used = 0;
    for (;;) {
        uint8_t *dst = NULL;
        size_t len = 0;
        int rc = next_room(r, &dst, &len, err);
        if (rc != DT_FRAME_MORE || *used == n) return rc;
        size_t k = n - *used < len ? n - *used : len;
        memcpy(dst, in + *used, k);
        *used += k;
        if ((rc = advance(r, k, err)) != DT_FRAME_MORE) return rc;
    }
}

int dt_frame_read(dt_frame_reader *r, int fd, dt_error *err) {
    for (;;) {
        uint8_t *dst = NULL;
        size_t len = 0;
        int rc = next_room(r, &dst, &len, err);
        if (rc != DT_FRAME_MORE) return rc;
        ssize_t k = recv(fd, dst, len, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return DT_FRAME_MORE;
        if (k < 0) return fail(r, dt_errorf(err, DT_ENET, "receive: %s", strerror(errno)));
        if (k == 0) {
            int within = r->state == S_PAYLOAD || r->head_got > 0;
            return fail(r, within ? dt_errorf(err, DT_ENET, "the peer closed the connection within a message (%zu "
                                              "of its header's bytes, %zu of its payload's)", r->head_got,
                                              r->payload_got)
                                  : dt_errorf(err, DT_ENET, "the peer closed the connection"));
        }
        if ((rc = advance(r, (size_t)k, err)) != DT_FRAME_MORE) return rc;
    }
}

void dt_frame_take(dt_frame_reader *r, dt_wire_header *h, dt_bytes *payload) {
    if (r->state != S_WHOLE) { /* nothing whole to take */
        *h = (dt_wire_header){0};
        *payload = (dt_bytes){0};
        return;
    }
    *h = r->hdr;
    if (r->block)
        *payload = (dt_bytes){.data = r->block + HOLD_BYTES, .size = (size_t)r->hdr.payload_bytes,
                              .release = release_block, .hint = r->block};
    else
        *payload = (dt_bytes){0};
    r->block = NULL;
    r->head_got = r->payload_got = 0;
    r->state = S_HEADER;
}

/* ---- the writer ---- */

#define IOV_MAX_USED 64 /* iovecs per writev: two per message */

struct dt_frame_out {
    dt_frame_out *next;
    uint8_t head[DT_WIRE_HEADER_SIZE];
    size_t sent;              /* bytes of head, then payload, already written */
    dt_bytes payload;
};

void dt_frame_writer_init(dt_frame_writer *w, dt_account *acct) {
    memset(w, 0, sizeof *w);
    account_ref(acct);
    w->acct = acct;
}

/* The first entry is written whole, or dropped: its payload released, its count given back. */
static void pop_first(dt_frame_writer *w) {
    dt_frame_out *o = w->first;
    w->first = o->next;
    if (!w->first) w->last = NULL;
    w->queued--;
    dt_bytes_release(&o->payload);
    dt_account_give(w->acct, sizeof *o);
    free(o);
}

void dt_frame_writer_close(dt_frame_writer *w) {
    while (w->first) pop_first(w);
    dt_account_unref(w->acct);
    w->acct = NULL;
}

int dt_frame_queue(dt_frame_writer *w, dt_wire_header *h, dt_bytes *payload, dt_error *err) {
    dt_bytes p = payload ? *payload : (dt_bytes){0};
    if (payload) *payload = (dt_bytes){0};
    if (p.size == 0) dt_bytes_release(&p); /* an empty payload is no payload */
    if (dt_account_take(w->acct, sizeof(dt_frame_out))) {
        dt_bytes_release(&p);
        return dt_errorf(err, DT_ENOMEM, "%s not queued: this peer's share of the budget, or the budget, is reached",
                         dt_wire_type_name(h->type));
    }
    dt_frame_out *o = malloc(sizeof *o);
    if (!o) {
        dt_account_give(w->acct, sizeof(dt_frame_out));
        dt_bytes_release(&p);
        return dt_errorf(err, DT_ENOMEM, "out of memory for a %s to send", dt_wire_type_name(h->type));
    }
    h->payload_bytes = p.size;
    dt_wire_encode(o->head, h);
    o->next = NULL;
    o->sent = 0;
    o->payload = p;
    if (w->last) w->last->next = o;
    else w->first = o;
    w->last = o;
    w->queued++;
    return DT_OK;
}

int dt_frame_write(dt_frame_writer *w, int fd, dt_error *err) {
    while (w->first) {
        struct iovec iov[IOV_MAX_USED];
        int n = 0;
        for (dt_frame_out *o = w->first; o && n + 2 <= IOV_MAX_USED; o = o->next) {
            size_t at = o->sent;
            if (at < sizeof o->head) iov[n++] = (struct iovec){o->head + at, sizeof o->head - at}, at = sizeof o->head;
            size_t done = at - sizeof o->head;
            if (done < o->payload.size)
                iov[n++] = (struct iovec){(uint8_t *)o->payload.data + done, o->payload.size - done};
        }
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t k = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return DT_FRAME_MORE;
        if (k < 0) return dt_errorf(err, DT_ENET, "send: %s", strerror(errno));
        for (size_t left = (size_t)k; left > 0 && w->first;) {
            dt_frame_out *o = w->first;
            size_t whole = sizeof o->head + o->payload.size, step = whole - o->sent < left ? whole - o->sent : left;
            o->sent += step;
            left -= step;
            if (o->sent == whole) pop_first(w);
        }
    }
    return DT_OK;
}
