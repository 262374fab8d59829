/* The chief's view of the other tasks: a thread that fetches each one's /status.json (libcurl,
 * every second, each fetch bounded in time and size) and hands what it says to the status page
 * (dt_status_peer). A task that stops answering shows as lost there. */
#ifndef DT_METRICS_STATUS_POLL_H
#define DT_METRICS_STATUS_POLL_H

#include "dtrain.h"
#include "metrics/status.h"

#define DT_PEERS_MAX 256

typedef struct dt_peer_poll dt_peer_poll;

/* list: comma-separated host:port of the other tasks' metrics servers (IPv6 in brackets), as
 * --metrics_peers gives them; an empty list starts nothing (*out NULL). */
int dt_peer_poll_start(dt_peer_poll **out, const char *list, dt_status *s, dt_error *err);
/* Stops the thread (within a fetch's timeout) and frees. NULL: nothing. */
void dt_peer_poll_stop(dt_peer_poll *p);

#endif
