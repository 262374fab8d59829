/* The own transport's pieces (docs/transport.md, "The project's own transport"), not yet behind the
 * seam: counted buffers, the frame reader and the writer.
 *
 * Budgets: every byte a peer makes a process hold is counted where it is allocated, against the
 * peer's account (its share) and the one budget all accounts draw from (B). A count is taken
 * before the allocation and refused when it would pass either; a refused reader stops reading its
 * descriptor (the loop mutes it: TCP pushes back on the peer) until bytes are given back.
 *
 * Framing: a message on the stream is one wire header (DT_WIRE_HEADER_SIZE bytes, docs/protocol.md)
 * followed by exactly its payload_bytes. The reader takes a stream in any splits: the header is
 * kept in the reader, decoded and checked (dt_wire_decode, then the largest frame) before anything
 * is allocated for the payload, which is then read straight into its own counted buffer and handed
 * over whole as dt_bytes; its release gives the count back.
 *
 * An account's counts are atomic: a payload may be released on any thread. Everything else is the
 * reading thread's. */
#ifndef DT_TRANSPORT_FRAME_H
#define DT_TRANSPORT_FRAME_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dtrain.h"
#include "transport/bytes.h"
#include "transport/wire.h"

/* B: what all accounts together may hold. */
typedef struct {
    uint64_t limit;
    atomic_ullong held;
} dt_budget;

void dt_budget_init(dt_budget *b, uint64_t limit);

/* One peer's account: its share of B. Referenced by its connection and by every payload it still
 * holds (a payload may outlive its connection, not its budget). */
typedef struct dt_account dt_account;

/* NULL when out of memory. */
dt_account *dt_account_new(dt_budget *b, uint64_t share);
void dt_account_unref(dt_account *a);
/* Counts bytes before they are allocated: 0 counted, -1 refused (past the account's share, or B
 * reached), nothing counted. */
int dt_account_take(dt_account *a, uint64_t bytes);
void dt_account_give(dt_account *a, uint64_t bytes);
uint64_t dt_account_held(const dt_account *a);
/* Whether the peer may be read from now: under its share and B not reached. */
int dt_account_may_read(const dt_account *a);

typedef struct {
    dt_account *acct;         /* a reference */
    uint64_t max_frame;       /* the largest payload accepted */
    uint8_t head[DT_WIRE_HEADER_SIZE];
    size_t head_got;
    dt_wire_header hdr;       /* decoded once head is whole */
    uint8_t *block;           /* the payload's counted buffer (its holder, then the bytes) */
    size_t payload_got;
    int state;                /* frame.c: header, payload, whole, failed */
} dt_frame_reader;

/* acct: referenced for the reader's life (NULL: nothing counted, nothing refused). */
void dt_frame_init(dt_frame_reader *r, dt_account *acct, uint64_t max_frame);
/* Frees a partial message (its count given back) and drops the account's reference. */
void dt_frame_close(dt_frame_reader *r);

/* What a read or feed left the reader with. */
typedef enum {
    DT_FRAME_MORE = 0,        /* needs more bytes */
    DT_FRAME_WHOLE = 1,       /* a message is whole: dt_frame_take it before reading on */
    DT_FRAME_MUTED = 2,       /* its payload cannot be counted now: stop reading until bytes are given back */
} dt_frame_state;

/* Feeds n bytes of the stream; *used gets how many were taken (it stops at a whole message and
 * when muted). A dt_frame_state, or < 0: DT_EPROTO (another protocol version) or DT_EFORMAT (a
 * header that does not decode, or a payload over max_frame: refused before any allocation); the
 * reader is then failed and the connection should be closed. */
int dt_frame_feed(dt_frame_reader *r, const void *data, size_t n, size_t *used, dt_error *err);

/* Reads from a non-blocking descriptor what the next message still needs: the header into the
 * reader, the payload straight into its buffer (no copy). A dt_frame_state (DT_FRAME_MORE once the
 * descriptor has nothing more now), or < 0 as dt_frame_feed, and DT_ENET for an error or the end of
 * the stream (within a message: named). */
int dt_frame_read(dt_frame_reader *r, int fd, dt_error *err);

/* The whole message: its header, and its payload handed over (NULL data and size 0: none; else a
 * release that frees it and gives its count back, from any thread). The reader starts the next. */
void dt_frame_take(dt_frame_reader *r, dt_wire_header *h, dt_bytes *payload);

/* ---- the writer: a connection's messages out ---- */

/* A message queued whole (its header encoded in its entry, its payload by reference) and written
 * with writev from where it lies: no gather copy. Each entry is counted in the account while it
 * waits; the payload's own bytes are its owner's to count (a ps admits a large reply before it
 * builds it: ps.c). A payload's release runs once its last byte is in the kernel, or when the
 * writer is closed with it unsent: the send's completion, on the writing thread. */
typedef struct dt_frame_out dt_frame_out;
typedef struct {
    dt_account *acct;         /* a reference (NULL: nothing counted) */
    dt_frame_out *first, *last;
    size_t queued;            /* messages not yet written whole */
} dt_frame_writer;

void dt_frame_writer_init(dt_frame_writer *w, dt_account *acct);
/* Releases every payload still queued (unsent) and drops the account's reference. */
void dt_frame_writer_close(dt_frame_writer *w);
/* Queues h (payload_bytes set here) and payload (consumed: NULL or empty for none). DT_OK, or
 * DT_ENOMEM (the payload released): out of memory, or the account cannot count the entry (the
 * peer's share or B reached: the message says which; the caller drops it or closes the peer). */
int dt_frame_queue(dt_frame_writer *w, dt_wire_header *h, dt_bytes *payload, dt_error *err);
/* Writes what the non-blocking descriptor takes now: DT_OK when the queue is empty, DT_FRAME_MORE
 * (1) when the descriptor is full (watch it for writing), DT_ENET on an error (the queue kept: the
 * caller closes the writer). */
int dt_frame_write(dt_frame_writer *w, int fd, dt_error *err);

/* Bytes this reader has counted for a message not yet whole: its payload's buffer, allocated whole
 * once its header is checked. */
uint64_t dt_frame_partial(const dt_frame_reader *r);

#endif
