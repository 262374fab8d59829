/* The metrics HTTP server of a process (libmicrohttpd, its own thread): GET /metrics (Prometheus
 * text format), / (the status page: HTML and a small script, nothing fetched from elsewhere),
 * /status.json (what the page shows); anything else 404, a method other than GET or HEAD 405.
 * It serves figures only, never parameters or files (docs/security.md), and bounds what a client
 * can make it hold: connections (in all and per address), their memory and idle time. */
#ifndef DT_METRICS_HTTP_H
#define DT_METRICS_HTTP_H

#include "dtrain.h"
#include "metrics/metrics.h"
#include "metrics/status.h"

typedef struct dt_http dt_http;

/* Binds addr (an IPv4 or IPv6 literal, brackets allowed: "127.0.0.1", "0.0.0.0", "[::1]"; NULL or
 * "": 127.0.0.1) and port (0: the kernel picks one; dt_http_port tells which) and serves m and s
 * until dt_http_stop. A port in use, or an address that is not this machine's, fails here with a
 * message naming it. */
int dt_http_start(dt_http **out, const char *addr, int port, dt_metrics *m, dt_status *s, dt_error *err);
int dt_http_port(const dt_http *h);
/* --metrics_addr and --metrics_port into the address and port to serve on: addr "ADDR" or
 * "ADDR:PORT" ("[V6]:PORT"; NULL or "": 127.0.0.1); a port in both must be the same. *port_out 0:
 * metrics are off. */
int dt_http_listen_spec(const char *addr, int port, char *host, size_t cap, int *port_out, dt_error *err);
/* Stops serving (waits for the thread) and frees. NULL: nothing. */
void dt_http_stop(dt_http *h);

#endif
