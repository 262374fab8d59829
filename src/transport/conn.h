/* The transport seam (docs/transport.md): what the ps (src/ps) and the worker's ps client
 * (src/worker) ask of the layer that moves wire messages (transport/wire.h) between processes.
 * Nothing above this header names the library underneath; today that is libzmq (conn_zmq.c,
 * with peers.h's connection watch); a transport of the project's own can take its place behind
 * the same calls.
 *
 * The contract, in short (docs/transport.md says it in full):
 *   - A message is one wire header and an optional payload of exactly payload_bytes bytes; the
 *     transport checks both before handing the message over, and refuses a payload past the
 *     largest frame its endpoint was opened with before it holds it.
 *   - Received bytes belong to the message (dt_msg) until dt_msg_take hands them over as dt_bytes
 *     with their release; the receiver keeps them as long as it likes and releases them once.
 *   - Bytes sent are consumed: with a release, the transport reads them in place (no copy) and
 *     calls the release once it no longer needs them, from any thread (send completion); without
 *     one, they are copied before the send returns.
 *   - Endpoints are "tcp://host:port" (IPv4, "[v6]" or a name) and "ipc:///path" (a Unix socket).
 *   - A ps replies along a dt_route, an opaque handle of the connection a request came on; a reply
 *     to a connection that is gone is dropped. Routes are borrowed from their message unless held.
 *   - Every wait has a deadline; receives never block.
 *
 * One thread uses a dt_server or a dt_conn (the ps's loop, the worker's client); releases may run
 * on the transport's own threads. */
#ifndef DT_TRANSPORT_CONN_H
#define DT_TRANSPORT_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dtrain.h"
#include "transport/auth.h"
#include "transport/bytes.h"
#include "transport/peers.h"
#include "transport/wire.h"

/* Where a reply goes: the connection a request came on (opaque). */
typedef struct dt_route dt_route;

/* A received message. The payload is the message's until dt_msg_take; dt_msg_close frees what
 * is left (always call it, whatever the receive returned). */
typedef struct {
    dt_wire_header hdr;       /* valid when the receive returned DT_OK */
    const void *data;         /* the payload, never NULL once received (an empty one points at no bytes:
                                 pointer arithmetic on it stays defined); no alignment promised */
    size_t size;
    dt_route *route;          /* dt_server's: the reply route, borrowed (dt_route_hold keeps one); else NULL */
    dt_peer *peer;            /* dt_server's: the connection's watch and budget (peers.h); NULL if unknown */
    char addr[64];            /* the peer's address, for logs; "?" if unknown */
    _Alignas(16) unsigned char impl[176]; /* the transport's own (conn_zmq.c checks it fits) */
} dt_msg;

/* The payload handed over (*out; the message keeps none of it), or lent when there is no memory
 * for its holder (out->release NULL: valid until dt_msg_close, the receiver copies what it keeps).
 * NULL when there is none. */
dt_bytes *dt_msg_take(dt_msg *m, dt_bytes *out);
void dt_msg_close(dt_msg *m);

/* ---- a ps: one server with many connections ---- */

typedef struct dt_server dt_server;

typedef struct {
    uint64_t max_frame;       /* the largest payload accepted and sent */
    int io_threads;           /* threads moving bytes (a hint; at least 1) */
    int linger_ms;            /* how long closing the server may still send the last replies */
    int send_queue;           /* replies queued per connection: past it, a reply is dropped */
    int handshake_ms;         /* a connection's handshake (and first message) must finish within this */
    const dt_auth *auth;      /* --auth=curve: the server's keys and the clients it accepts; NULL: none */
    const char *log_prefix;   /* "ps 3: ", for the log lines */
    dt_peers_config peers;    /* the connections' bounds and the budget (peers.h) */
} dt_server_config;

/* A server, not yet listening. */
int dt_server_open(dt_server **out, const dt_server_config *cfg, dt_error *err);
/* Listens on endpoint; bound (n bytes) gets the endpoint as bound (the port chosen for ":0"). A
 * Unix socket is made owner-only. Fails naming the endpoint. */
int dt_server_bind(dt_server *s, const char *endpoint, char *bound, size_t n, dt_error *err);
/* Closes every connection (replies still queued get linger_ms to go) and frees the server. */
void dt_server_close(dt_server *s);

/* The connection watch and budget (peers.h) of this server. */
dt_peers *dt_server_peers(dt_server *s);

/* Applies connection events heard so far: gone(user, peer) for each connection that closed. */
void dt_server_events(dt_server *s, void (*gone)(void *user, dt_peer *peer), void *user);

/* Waits at most timeout_ms for a message or a connection event (events applied, as above):
 * *readable 1 when a message may be waiting. DT_OK, DT_EINTR (a signal), or DT_ENET. */
int dt_server_wait(dt_server *s, long timeout_ms, void (*gone)(void *user, dt_peer *peer), void *user,
                   int *readable, dt_error *err);

/* The next message, without waiting: DT_OK; DT_ETIMEOUT (none) or DT_EINTR; DT_EFORMAT or DT_EPROTO
 * (a message that could not be decoded: m->route is still valid, to answer with an ERROR, and
 * m->hdr.request_id is read where it could be); DT_ENET (the server failed). */
int dt_server_recv(dt_server *s, dt_msg *m, dt_error *err);

/* A reply along `to`, never waiting (past send_queue, or the connection gone: dropped). h's
 * payload_bytes is set here; payload: NULL for none, else consumed (released by the transport
 * when done with it, at once on failure). DT_OK, DT_ENOMEM, DT_ETIMEOUT (dropped) or DT_ENET. */
int dt_server_send(dt_server *s, dt_route *to, dt_wire_header *h, dt_bytes *payload, dt_error *err);
/* An ERROR reply: h as the caller would send its reply (request id, role, shard...); its type,
 * status and payload are set here, the text is a printf message. */
int dt_server_send_error(dt_server *s, dt_route *to, dt_wire_header h, int32_t status, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* A route kept beyond its message (a deferred reply): NULL when out of memory. */
dt_route *dt_route_hold(const dt_route *r);
void dt_route_drop(dt_route *r);

/* ---- a worker: one connection per ps ---- */

/* What a process's connections share (threads, for libzmq); one per dt_ps_client. */
typedef struct dt_transport dt_transport;
int dt_transport_open(dt_transport **out, dt_error *err);
/* After every dt_conn of it is closed: returns once the transport holds no payload of theirs
 * (every release has run). */
void dt_transport_close(dt_transport *t);

typedef struct dt_conn dt_conn;

typedef struct {
    uint64_t max_frame;       /* the largest payload accepted */
    int heartbeat_ms;         /* a connection silent this long is closed and made again; 0: none */
    int send_timeout_ms;      /* until a send's deadline is given (dt_conn_send) */
    int sndbuf;               /* SO_SNDBUF; 0: the kernel's */
    const dt_auth *auth;      /* --auth=curve: the client's keys; NULL: none */
} dt_conn_config;

/* A connection to endpoint, made in the background: it connects again after a loss (with backoff,
 * 50 ms doubling to 1 s) and messages sent meanwhile wait for it (a bounded queue). Fails naming
 * the endpoint only when it cannot be used at all (DT_EINVAL: a bad endpoint; DT_ENET). */
int dt_conn_open(dt_conn **out, dt_transport *t, const char *endpoint, const dt_conn_config *cfg, dt_error *err);
/* Closes at once: what it still queues is dropped (a ps discards a message cut short), and the
 * release of every payload it held runs soon after (libzmq: from its I/O thread, bounded in
 * practice by milliseconds; docs/transport.md). */
void dt_conn_close(dt_conn *c);

/* Sends a header and payload (consumed, as dt_server_send's), waiting until deadline_us at the
 * latest for room in the queue: DT_OK, DT_ETIMEOUT, DT_EINTR, DT_ENOMEM or DT_ENET. */
int dt_conn_send(dt_conn *c, dt_wire_header *h, dt_bytes *payload, int64_t deadline_us, dt_error *err);
/* The next message, without waiting: DT_OK; DT_ETIMEOUT (none); DT_EINTR; DT_EFORMAT/DT_EPROTO (a
 * message that could not be decoded); DT_ENET. */
int dt_conn_recv(dt_conn *c, dt_msg *m, dt_error *err);

/* Waits at most timeout_ms until one of conns[0..n-1] may have a message (ready[k] = 1) or fd (>= 0)
 * is readable (ready[n] = 1): the number ready, 0 on timeout, or DT_EINTR / DT_ENET (< 0). */
int dt_conn_poll(dt_conn *const *conns, int n, int fd, long timeout_ms, int *ready, dt_error *err);

#endif
