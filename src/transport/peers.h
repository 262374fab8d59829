/* A ps's connections, watched and bounded (docs/security.md, "What a peer can make a ps hold"):
 * the peer handles and the budget hooks of the transport seam's server (transport/conn.h,
 * docs/transport.md). What the ps calls (the ps's side of the seam): references, gone, serial,
 * delivered, the replies' admission (reply_begin/done), the budget and what is counted in it
 * (set_budget, set_other, set_own, held), the checks and their interval, the counts. The libzmq
 * transport (conn_zmq.c) alone calls open, close, socket, events and of: how it hears of
 * connections. A transport of the project's own would count each byte where it allocates it
 * instead of the estimates below.
 *
 * ZeroMQ hides a ps's connections behind one ROUTER socket and hands over a message only when all
 * of its frames are in. ZMQ_MAXMSGSIZE bounds each frame and the high-water marks count whole
 * messages, so nothing in libzmq bounds what a peer makes it hold before a message is complete: an
 * endless multipart message, a frame header announcing megabytes followed by silence, or
 * connections that never send a message at all, up to the descriptor limit. This module sees what
 * libzmq does not show:
 *   - a socket monitor reports each connection as it opens and closes, with its descriptor;
 *   - every message carries the descriptor of the connection it came on (ZMQ_SRCFD);
 *   - the kernel counts the bytes each TCP connection received (TCP_INFO) and those not yet read
 *     (FIONREAD).
 * Received minus unread minus what the ps got as whole messages is what libzmq holds for that peer.
 * A connection past a bound is cut with shutdown(2) on its descriptor (checked to still be the
 * same connection): libzmq sees the connection end and frees what it held, the ps logs it once,
 * and the cluster goes on. One budget covers everything peers make the ps hold: unfinished
 * messages, large replies not yet sent, what the ps reports as its own (deferred PULLs), and the
 * heap beyond all of those, which shows what no counter does: the real cost of tiny frames,
 * same-host (ipc) connections' messages (no byte counters) and requests queued in libzmq.
 *
 * One thread (the ps's) calls everything here, except dt_peer_reply_done (libzmq's I/O thread). */
#ifndef DT_TRANSPORT_PEERS_H
#define DT_TRANSPORT_PEERS_H

#include <stdint.h>
#include <stdio.h>

#include "dtrain.h"

typedef struct dt_peer dt_peer;
typedef struct dt_peers dt_peers;

typedef struct {
    uint64_t max_partial_bytes; /* a connection may hold at most this much of an unfinished message */
    int64_t first_message_us;   /* a new connection must send a valid message within this */
    int64_t message_us;         /* a message, once past 256 KiB, must be complete within this */
    uint64_t budget_bytes;      /* everything peers make the ps hold, together (dt_peers_set_budget) */
    int64_t silence_us;         /* a TCP connection that receives nothing for this long is cut; 0: never */
    int max_connections;        /* beyond: the least recently useful connection is cut */
    int queued_messages;        /* whole messages libzmq queues per connection (the router's ZMQ_RCVHWM) */
    FILE *log;                  /* NULL: quiet */
    int ps_index;               /* for the log lines */
    /* The libzmq transport's: told of each failed handshake (the ZAP handler logs it: auth.h),
     * since the socket's one monitor is this watch's. NULL: not told. */
    void (*handshake_failed)(void *user, const char *endpoint);
    void *hook_user;
} dt_peers_config;

/* The libzmq transport's: watches router (a ROUTER not yet bound: the monitor must see every
 * connection). */
int dt_peers_open(dt_peers **out, void *ctx, void *router, const dt_peers_config *cfg, dt_error *err);
void dt_peers_close(dt_peers *p);

/* The monitor socket, to poll for ZMQ_POLLIN beside the router. */
void *dt_peers_socket(dt_peers *p);

/* Applies the connection events queued so far; gone(user, peer) is called for each connection
 * that closed (the peer pointer stays valid until the caller drops the references it took). */
void dt_peers_events(dt_peers *p, void (*gone)(void *user, dt_peer *peer), void *user);

/* The connection with this descriptor (a received message's ZMQ_SRCFD); NULL if unknown. */
dt_peer *dt_peers_of(dt_peers *p, int fd);

/* A whole message from peer was handed to the ps; valid: it decoded and was from a cluster role. */
void dt_peers_delivered(dt_peers *p, dt_peer *peer, int valid);

/* Enforces the bounds. Call with the router drained (drained = 1), every
 * dt_peers_check_interval_us: 10 ms up to 500 connections, up to 100 ms with more (each check
 * reads a kernel counter per connection). A peer can get at most what its link carries in two
 * intervals past a bound. A ps that cannot drain its router (a flood faster than it handles
 * messages) calls it anyway (drained = 0): whole messages may then wait in libzmq too, so the
 * bound for an unfinished message grows by queued_messages of the largest, and the budget counts
 * those queued messages as unfinished ones (they hold memory alike). */
void dt_peers_check(dt_peers *p, int drained);
int64_t dt_peers_check_interval_us(const dt_peers *p);

/* A new budget (the ps knows its workers after INIT). */
void dt_peers_set_budget(dt_peers *p, uint64_t bytes);
/* What the ps itself holds for peers beyond replies (deferred PULLs), counted in the budget. */
void dt_peers_set_other(dt_peers *p, uint64_t bytes);
/* What the ps holds for itself and may grow while it runs (its sparse tables, each bounded by its
 * declared capacity): not counted in the budget, and taken off the heap before the heap is compared
 * with it, or a table filling up would read as memory no counter shows and get connections cut. */
void dt_peers_set_own(dt_peers *p, uint64_t bytes);
/* Everything counted now, and whether `more` bytes would take it past the budget. */
uint64_t dt_peers_held(const dt_peers *p);
/* The same as a phrase for an error, by kind ("12 bytes in unfinished messages, 0 in replies, 4 in
 * deferred requests"), into buf. */
void dt_peers_held_phrase(const dt_peers *p, char *buf, size_t n);
int dt_peers_over_budget(const dt_peers *p, uint64_t more);
/* The connection closed or was cut: its requests still queued are not worth an answer. */
int dt_peer_gone(const dt_peer *peer);
/* A number for the connection, never reused within a ps (0 for NULL). */
uint64_t dt_peer_serial(const dt_peer *peer);

/* Open connections now, and connections cut so far. */
int dt_peers_count(const dt_peers *p);
uint64_t dt_peers_cut_count(const dt_peers *p);

/* References: a holder of a dt_peer pointer beyond the current message (a deferred PULL, a reply
 * libzmq still sends) takes one; the last release frees it. */
void dt_peer_ref(dt_peer *peer);
void dt_peer_unref(dt_peer *peer);

/* Large replies (PARAMS, STATE) libzmq still holds for a peer, in bytes: begin returns 0 (and
 * counts nothing) when this reply would take the peer past max (a first reply always goes), -1
 * when it would take everything held past the budget of p (NULL: not checked), 1 when counted;
 * done is called by the reply's free function with the same bytes (and drops the reference begin
 * took). Call begin before building the reply, so a refusal costs no copy. */
int dt_peer_reply_begin(dt_peers *p, dt_peer *peer, uint64_t bytes, uint64_t max);
void dt_peer_reply_done(dt_peer *peer, uint64_t bytes);

#endif
