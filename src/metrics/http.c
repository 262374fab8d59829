#include "metrics/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/error.h"

/* What one client can make the server hold: a scrape or a page load is one short request. */
#define MAX_CONNECTIONS 32
#define MAX_PER_ADDRESS 8
#define CONNECTION_MEMORY (32 * 1024) /* a request's headers must fit */
#define IDLE_TIMEOUT_S 10

/* The status page, compiled in from src/metrics/status.html (CMakeLists.txt). */
extern const unsigned char dt_status_page[];
extern const unsigned long dt_status_page_len;

struct dt_http {
    struct MHD_Daemon *d;
    int fd, port;
    dt_metrics *m;
    dt_status *s;
};

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned code, const char *type, void *body, size_t len,
                             enum MHD_ResponseMemoryMode mode) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE) free(body);
        return MHD_NO; /* out of memory: the connection is closed */
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    enum MHD_Result ok = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result text(struct MHD_Connection *conn, unsigned code, const char *msg) {
    return reply(conn, code, "text/plain; charset=utf-8", (void *)msg, strlen(msg), MHD_RESPMEM_PERSISTENT);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    dt_http *h = cls;
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
        return text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n");
    dt_error err = {0};
    char *body;
    size_t len;
    if (!strcmp(url, "/metrics")) {
        dt_status_refresh(h->s);
        if (dt_metrics_render(h->m, &body, &len, &err)) return text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "metrics: out of memory\n");
        return reply(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", body, len, MHD_RESPMEM_MUST_FREE);
    }
    if (!strcmp(url, "/status.json")) {
        if (!h->s || dt_status_json(h->s, &body, &len, &err))
            return text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "status: not available\n");
        return reply(conn, MHD_HTTP_OK, "application/json", body, len, MHD_RESPMEM_MUST_FREE);
    }
    if (!strcmp(url, "/"))
        return reply(conn, MHD_HTTP_OK, "text/html; charset=utf-8", (void *)dt_status_page, dt_status_page_len,
                     MHD_RESPMEM_PERSISTENT);
    return text(conn, MHD_HTTP_NOT_FOUND, "not found: this server has /, /metrics and /status.json\n");
}

/* addr as a socket address: an IPv4 or IPv6 literal (no names: the address to bind is this
 * machine's, and a name could resolve elsewhere). */
static int parse_addr(const char *addr, int port, struct sockaddr_storage *sa, socklen_t *len, dt_error *err) {
    char host[64];
    size_t n = strlen(addr);
    if (n >= 2 && addr[0] == '[' && addr[n - 1] == ']') addr++, n -= 2;
    if (n >= sizeof host) return dt_errorf(err, DT_EINVAL, "--metrics_addr: '%s' is not an IP address", addr);
    memcpy(host, addr, n);
    host[n] = 0;
    memset(sa, 0, sizeof *sa);
    struct sockaddr_in *v4 = (struct sockaddr_in *)sa;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)sa;
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
        *len = sizeof *v4;
    } else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        *len = sizeof *v6;
    } else {
        return dt_errorf(err, DT_EINVAL, "--metrics_addr: '%s' is not an IPv4 or IPv6 address (e.g. 127.0.0.1, "
                         "0.0.0.0, [::1])", host);
    }
    return DT_OK;
}

int dt_http_start(dt_http **out, const char *addr, int port, dt_metrics *m, dt_status *s, dt_error *err) {
    *out = NULL;
    if (!addr || !*addr) addr = "127.0.0.1";
    if (port < 0 || port > 65535) return dt_errorf(err, DT_EINVAL, "--metrics_port: %d is not a port (0..65535)", port);
    struct sockaddr_storage sa;
    socklen_t sa_len = 0;
    int rc = parse_addr(addr, port, &sa, &sa_len, err);
    if (rc) return rc;
    dt_http *h = dt_calloc(1, sizeof *h, "metrics server", err);
    if (!h) return DT_ENOMEM;
    h->m = m, h->s = s;
    /* Bound here rather than by libmicrohttpd, so a port in use is named as such. */
    int one = 1;
    h->fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (h->fd < 0) {
        rc = dt_errorf(err, DT_ENET, "metrics: socket: %s", strerror(errno));
        goto fail;
    }
    setsockopt(h->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); /* a restart need not wait out TIME_WAIT */
    if (sa.ss_family == AF_INET6) setsockopt(h->fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(h->fd, (struct sockaddr *)&sa, sa_len) != 0) {
        int e = errno;
        rc = dt_errorf(err, DT_ENET, "metrics: cannot listen on %s port %d: %s%s", addr, port, strerror(e),
                       e == EADDRINUSE ? " (another process has it: choose another --metrics_port)"
                       : e == EADDRNOTAVAIL ? " (not an address of this machine: see --metrics_addr)" : "");
        goto fail;
    }
    if (listen(h->fd, 64) != 0) {
        rc = dt_errorf(err, DT_ENET, "metrics: listen on %s port %d: %s", addr, port, strerror(errno));
        goto fail;
    }
    socklen_t l = sa_len;
    getsockname(h->fd, (struct sockaddr *)&sa, &l);
    h->port = ntohs(sa.ss_family == AF_INET ? ((struct sockaddr_in *)&sa)->sin_port
                                            : ((struct sockaddr_in6 *)&sa)->sin6_port);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | (sa.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    h->d = MHD_start_daemon(flags, 0, NULL, NULL, handler, h, MHD_OPTION_LISTEN_SOCKET, h->fd,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)MAX_CONNECTIONS, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            (unsigned)MAX_PER_ADDRESS, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONNECTION_MEMORY,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_TIMEOUT_S, MHD_OPTION_END);
    if (!h->d) {
        rc = dt_errorf(err, DT_ENET, "metrics: libmicrohttpd could not start serving %s port %d", addr, h->port);
        goto fail;
    }
    *out = h;
    return DT_OK;
fail:
    if (h->fd >= 0) close(h->fd);
    free(h);
    return rc;
}

int dt_http_listen_spec(const char *addr, int port, char *host, size_t cap, int *port_out, dt_error *err) {
    *port_out = 0;
    if (!addr || !*addr) addr = "127.0.0.1";
    const char *colon = strrchr(addr, ':'), *close = strrchr(addr, ']');
    /* a port: after "]:" for a bracketed IPv6 address, after the only colon otherwise */
    int has_port = colon && (addr[0] == '[' ? close && colon == close + 1 : strchr(addr, ':') == colon);
    size_t n = has_port ? (size_t)(colon - addr) : strlen(addr);
    if (n == 0 || n >= cap) return dt_errorf(err, DT_EINVAL, "--metrics_addr: '%s' is not ADDR or ADDR:PORT", addr);
    memcpy(host, addr, n);
    host[n] = 0;
    if (has_port) {
        char *end;
        long p = strtol(colon + 1, &end, 10);
        if (!colon[1] || *end || p < 1 || p > 65535)
            return dt_errorf(err, DT_EINVAL, "--metrics_addr: '%s': the port must be 1..65535", addr);
        if (port && port != p)
            return dt_errorf(err, DT_EINVAL, "--metrics_addr %s and --metrics_port %d name different ports", addr, port);
        port = (int)p;
    }
    if (port < 0 || port > 65535) return dt_errorf(err, DT_EINVAL, "--metrics_port: %d is not 1..65535", port);
    *port_out = port;
    return DT_OK;
}

int dt_http_port(const dt_http *h) { return h ? h->port : 0; }

void dt_http_stop(dt_http *h) {
    if (!h) return;
    MHD_stop_daemon(h->d); /* closes the listening socket too, though it was passed in */
    free(h);
}
