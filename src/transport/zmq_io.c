#include "transport/zmq_io.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"

static int set_int(void *s, int opt, int v, const char *name, dt_error *err) {
    if (zmq_setsockopt(s, opt, &v, sizeof v) != 0)
        return dt_errorf(err, DT_ENET, "zmq_setsockopt(%s=%d): %s", name, v, zmq_strerror(errno));
    return DT_OK;
}

void *dt_zsock_open(void *ctx, int type, uint64_t max_frame, int linger_ms, int send_timeout_ms,
                    dt_error *err) {
    void *s = zmq_socket(ctx, type);
    if (!s) {
        dt_errorf(err, DT_ENET, "zmq_socket: %s", zmq_strerror(errno));
        return NULL;
    }
    int64_t maxmsg = max_frame > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)max_frame;
    int rc = zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) == 0
                 ? DT_OK
                 : dt_errorf(err, DT_ENET, "zmq_setsockopt(ZMQ_MAXMSGSIZE): %s", zmq_strerror(errno));
    if (!rc) rc = set_int(s, ZMQ_LINGER, linger_ms, "ZMQ_LINGER", err);
    if (!rc) rc = set_int(s, ZMQ_SNDTIMEO, send_timeout_ms, "ZMQ_SNDTIMEO", err);
    if (!rc && type == ZMQ_DEALER) {
        /* Not ZMQ_IMMEDIATE: with it libzmq discards replies already received but not yet read
         * when the peer disconnects (a ps acknowledging SHUTDOWN and exiting). */
        rc = set_int(s, ZMQ_RECONNECT_IVL, 50, "ZMQ_RECONNECT_IVL", err);
        if (!rc) rc = set_int(s, ZMQ_RECONNECT_IVL_MAX, 1000, "ZMQ_RECONNECT_IVL_MAX", err);
    }
    if (rc) {
        zmq_close(s);
        return NULL;
    }
    return s;
}

/* The host of "tcp://host:port" into out (brackets kept); 0 if the endpoint is not tcp. */
static int tcp_host(const char *endpoint, char *out, size_t n) {
    if (strncmp(endpoint, "tcp://", 6) != 0) return 0;
    const char *host = endpoint + 6, *colon = strrchr(host, ':');
    if (!colon || (size_t)(colon - host) >= n) return 0;
    memcpy(out, host, (size_t)(colon - host));
    out[colon - host] = '\0';
    return 1;
}

/* A name with IPv6 addresses and no IPv4 one needs ZMQ_IPV6 to be reached at all. */
static int ipv6_only_name(const char *host) {
    struct in_addr v4;
    if (!strcmp(host, "*") || inet_pton(AF_INET, host, &v4) == 1) return 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0) return 0; /* libzmq retries the lookup itself */
    int v4_seen = 0, v6_seen = 0;
    for (const struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        v4_seen |= ai->ai_family == AF_INET;
        v6_seen |= ai->ai_family == AF_INET6;
    }
    freeaddrinfo(res);
    return v6_seen && !v4_seen;
}

static int set_ipv6(void *s, const char *endpoint, int resolve_names) {
    char host[300];
    if (!tcp_host(endpoint, host, sizeof host)) return 0;
    int on = host[0] == '[' || (resolve_names && ipv6_only_name(host));
    return on ? zmq_setsockopt(s, ZMQ_IPV6, &on, sizeof on) : 0;
}

int dt_zsock_bind(void *s, const char *endpoint) {
    return set_ipv6(s, endpoint, 0) ? -1 : zmq_bind(s, endpoint);
}

int dt_zsock_connect(void *s, const char *endpoint) {
    return set_ipv6(s, endpoint, 1) ? -1 : zmq_connect(s, endpoint);
}

int dt_zsock_heartbeat(void *s, int timeout_ms, dt_error *err) {
    int ivl = timeout_ms / 4;
    if (ivl < 250) ivl = 250;
    if (ivl > 10000) ivl = 10000;
    int ttl = timeout_ms > 6553500 ? 6553500 : timeout_ms; /* ZMTP carries the TTL in deciseconds, 16 bits */
    int rc = set_int(s, ZMQ_HEARTBEAT_IVL, ivl, "ZMQ_HEARTBEAT_IVL", err);
    if (!rc) rc = set_int(s, ZMQ_HEARTBEAT_TIMEOUT, timeout_ms, "ZMQ_HEARTBEAT_TIMEOUT", err);
    if (!rc) rc = set_int(s, ZMQ_HEARTBEAT_TTL, ttl, "ZMQ_HEARTBEAT_TTL", err);
    return rc;
}

/* Receives the next frame of a message already queued (libzmq delivers multipart messages
 * whole, so no wait is needed). */
static int recv_frame(zmq_msg_t *m, void *sock, dt_error *err) {
    if (zmq_msg_recv(m, sock, ZMQ_DONTWAIT) >= 0) return DT_OK;
    if (errno == EAGAIN) return dt_errorf(err, DT_ETIMEOUT, "no message queued");
    if (errno == EINTR) return dt_errorf(err, DT_EINTR, "receive interrupted by a signal");
    return dt_errorf(err, DT_ENET, "zmq_msg_recv: %s", zmq_strerror(errno));
}

int dt_wire_recv(void *sock, int with_identity, dt_wire_in *in, dt_error *err) {
    memset(&in->hdr, 0, sizeof in->hdr);
    zmq_msg_init(&in->identity);
    zmq_msg_init(&in->payload);
    in->has_identity = 0;
    in->srcfd = -1;
    snprintf(in->peer, sizeof in->peer, "?");

    zmq_msg_t head;
    zmq_msg_init(&head);
    int rc;
    if (with_identity) {
        if ((rc = recv_frame(&in->identity, sock, err))) goto done;
        in->has_identity = 1;
        if (!zmq_msg_more(&in->identity)) {
            rc = dt_errorf(err, DT_EFORMAT, "empty message (routing id only)");
            goto done;
        }
        if ((rc = recv_frame(&head, sock, err))) goto done;
    } else if ((rc = recv_frame(&head, sock, err))) {
        goto done;
    }
    const char *addr = zmq_msg_gets(&head, "Peer-Address");
    if (addr) snprintf(in->peer, sizeof in->peer, "%s", addr);
    in->srcfd = zmq_msg_get(&head, ZMQ_SRCFD); /* only frames from a connection carry it, not the routing id */

    int frames = 1, has_payload = 0, more = zmq_msg_more(&head);
    if (more) {
        if ((rc = recv_frame(&in->payload, sock, err))) goto done;
        frames++;
        has_payload = 1;
        more = zmq_msg_more(&in->payload);
    }
    while (more) { /* drain a malformed message so the next one starts clean */
        zmq_msg_t extra;
        zmq_msg_init(&extra);
        rc = recv_frame(&extra, sock, err);
        more = rc == DT_OK && zmq_msg_more(&extra);
        zmq_msg_close(&extra);
        if (rc) goto done;
        frames++;
    }
    if ((rc = dt_wire_decode(&in->hdr, zmq_msg_data(&head), zmq_msg_size(&head), err))) {
        in->hdr.request_id = dt_wire_peek_request_id(zmq_msg_data(&head), zmq_msg_size(&head));
        goto done;
    }
    const char *tn = dt_wire_type_name(in->hdr.type);
    if (frames > 2) {
        rc = dt_errorf(err, DT_EFORMAT, "%s message has %d frames, at most 2 (header, payload)", tn, frames);
    } else if (has_payload != (in->hdr.payload_bytes != 0) ||
               (has_payload && zmq_msg_size(&in->payload) != in->hdr.payload_bytes)) {
        rc = dt_errorf(err, DT_EFORMAT, "%s header announces %llu payload bytes, the payload frame has %zu",
                       tn, (unsigned long long)in->hdr.payload_bytes,
                       has_payload ? zmq_msg_size(&in->payload) : (size_t)0);
    }
done:
    zmq_msg_close(&head);
    if (rc) {
        zmq_msg_close(&in->payload);
        zmq_msg_init(&in->payload);
    }
    return rc;
}

void dt_wire_in_close(dt_wire_in *in) {
    zmq_msg_close(&in->identity);
    zmq_msg_close(&in->payload);
    zmq_msg_init(&in->identity);
    zmq_msg_init(&in->payload);
    in->has_identity = 0;
}

static int send_errno(dt_error *err, const char *what) {
    if (errno == EAGAIN) return dt_errorf(err, DT_ETIMEOUT, "sending %s timed out (peer not reachable?)", what);
    if (errno == EINTR) return dt_errorf(err, DT_EINTR, "sending %s interrupted by a signal", what);
    return dt_errorf(err, DT_ENET, "sending %s: %s", what, zmq_strerror(errno));
}

int dt_wire_send(void *sock, zmq_msg_t *identity, dt_wire_header *h, zmq_msg_t *payload,
                 int zmq_flags, dt_error *err) {
    if (payload && zmq_msg_size(payload) == 0) { /* an empty payload is no payload */
        zmq_msg_close(payload);
        payload = NULL;
    }
    h->payload_bytes = payload ? zmq_msg_size(payload) : 0;
    uint8_t buf[DT_WIRE_HEADER_SIZE];
    dt_wire_encode(buf, h);
    const char *tn = dt_wire_type_name(h->type);
    if (identity) {
        zmq_msg_t id;
        zmq_msg_init(&id);
        zmq_msg_copy(&id, identity);
        if (zmq_msg_send(&id, sock, zmq_flags | ZMQ_SNDMORE) < 0) {
            int rc = send_errno(err, tn);
            zmq_msg_close(&id);
            if (payload) zmq_msg_close(payload);
            return rc;
        }
    }
    if (zmq_send(sock, buf, sizeof buf, zmq_flags | (payload ? ZMQ_SNDMORE : 0)) < 0) {
        int rc = send_errno(err, tn);
        if (payload) zmq_msg_close(payload);
        return rc;
    }
    /* Once the first frame of a message is queued the rest is always accepted. */
    if (payload && zmq_msg_send(payload, sock, zmq_flags) < 0) {
        int rc = send_errno(err, tn);
        zmq_msg_close(payload);
        return rc;
    }
    return DT_OK;
}

int dt_wire_send_error(void *sock, zmq_msg_t *identity, dt_wire_header h, int32_t status,
                       const char *fmt, ...) {
    char text[DT_WIRE_MAX_ERROR_TEXT + 1];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n >= sizeof text ? sizeof text - 1 : (size_t)n;
    h.type = DT_MSG_ERROR;
    h.status = status;
    zmq_msg_t payload;
    if (zmq_msg_init_size(&payload, len) != 0) return dt_errorf(NULL, DT_ENOMEM, "error text");
    memcpy(zmq_msg_data(&payload), text, len);
    return dt_wire_send(sock, identity, &h, &payload, ZMQ_DONTWAIT, NULL);
}
