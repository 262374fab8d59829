/* ZeroMQ helpers shared by the parameter server and its clients: socket setup with bounded frames,
 * sending and receiving one wire message (header frame + optional payload frame). Nothing here
 * blocks without a deadline: receives are non-blocking (callers zmq_poll with a timeout first) and
 * blocking sends carry ZMQ_SNDTIMEO. Deadlines are read on core/clock.h's clock.
 *
 * Endpoints are ZeroMQ strings ("tcp://127.0.0.1:2222"); cluster/cluster.h turns host:port into
 * them. */
#ifndef DT_TRANSPORT_ZMQ_IO_H
#define DT_TRANSPORT_ZMQ_IO_H

#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "dtrain.h"
#include "transport/wire.h"

/* A new ZMQ_ROUTER (ps) or ZMQ_DEALER (client) socket. Frames larger than max_frame bytes make
 * libzmq drop the connection before it allocates them (ZMQ_MAXMSGSIZE); linger_ms bounds how long
 * zmq_close keeps unsent messages. DEALERs reconnect with backoff from 50 ms doubling to 1 s and
 * queue messages while disconnected (up to the high-water mark). send_timeout_ms bounds blocking
 * sends (-1: never block). Returns NULL on failure, which is always DT_ENET. */
void *dt_zsock_open(void *ctx, int type, uint64_t max_frame, int linger_ms, int send_timeout_ms,
                    dt_error *err);

/* zmq_bind / zmq_connect (0, or -1 with errno set, as they do) that first set ZMQ_IPV6 where the
 * endpoint needs it: "tcp://[v6]:port", or, to connect, a host name with IPv6 addresses only. Off
 * otherwise, as libzmq's default: with it a name resolves to its IPv6 addresses first, and a ps
 * binds a name's IPv4 address when it has one (cluster.h: dt_addr_bind_resolve). Connecting to a
 * name looks it up once here (blocking); libzmq looks it up again on each reconnect. */
int dt_zsock_bind(void *sock, const char *endpoint);
int dt_zsock_connect(void *sock, const char *endpoint);

/* ZeroMQ's own heartbeats (ZMTP PING/PONG, answered by the peer's I/O thread, so a busy peer still
 * answers): a connection silent for timeout_ms is closed (and a DEALER reconnects), and the peer
 * drops it after the same time without traffic from here (TTL). Catches what a request deadline
 * cannot see between requests: a peer host that vanished without closing its TCP connections. */
int dt_zsock_heartbeat(void *sock, int timeout_ms, dt_error *err);

/* A received message. Frames are owned by the struct: dt_wire_in_close releases them. */
typedef struct {
    zmq_msg_t identity;   /* ROUTER only: the peer's routing id (reply with it) */
    zmq_msg_t payload;    /* the payload frame; empty (size 0) when there is none */
    dt_wire_header hdr;   /* valid when dt_wire_recv returned 0 */
    int has_identity;
    char peer[64];        /* peer IP address (for logs), "?" if unknown */
    int srcfd;            /* the descriptor of the connection it came on (ZMQ_SRCFD), -1 if unknown */
} dt_wire_in;

/* Receives one whole multipart message without blocking (DT_ETIMEOUT if none is queued).
 * with_identity: the socket is a ROUTER (first frame is the routing id). Checks the frame count
 * (extra frames are drained and refused), decodes the header and checks that a payload frame is
 * present exactly when the header announces one, with exactly payload_bytes bytes. On a refusal
 * (DT_EFORMAT / DT_EPROTO) the identity is still valid, so a ps can answer with an ERROR.
 * The payload bound for the receiver's shard is the caller's job (dt_wire_check_payload); libzmq
 * has already refused frames beyond the socket's max_frame. */
int dt_wire_recv(void *sock, int with_identity, dt_wire_in *in, dt_error *err);
void dt_wire_in_close(dt_wire_in *in);

/* Sends a header and, if payload is non-NULL, its payload frame (payload_bytes is set from it;
 * the message is consumed either way: zero-copy buffers are released through their free
 * function when libzmq is done). identity: ROUTER replies (copied, not consumed), NULL otherwise.
 * zmq_flags: 0 (block up to the socket's send timeout) or ZMQ_DONTWAIT. */
int dt_wire_send(void *sock, zmq_msg_t *identity, dt_wire_header *h, zmq_msg_t *payload,
                 int zmq_flags, dt_error *err);

/* Sends an ERROR reply: h is the reply header as the caller would send it (request id, role,
 * shard...); its type, status and payload are set here, the text is a printf message. */
int dt_wire_send_error(void *sock, zmq_msg_t *identity, dt_wire_header h, int32_t status,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#endif
