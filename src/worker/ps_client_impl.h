/* The ps client's insides (worker/ps_client.h), shared by its three files, bottom up:
 *   ps_call.c    the call driver: the connections, sending, receiving, waiting, gathering the replies,
 *                a call's begin and end, the release of gradient frames;
 *   ps_conn.c    the connections: configuration, open (connections, HELLO to every ps), close;
 *   ps_client.c  the calls: INIT, STATUS, wait_ready, push and pull, FETCH, DONE, SHUTDOWN, the
 *                sparse exchange and a request to one ps alone.
 * Which replies a call awaits and what each one means is the exchange core's (worker/exchange.h). */
#ifndef DT_WORKER_PS_CLIENT_IMPL_H
#define DT_WORKER_PS_CLIENT_IMPL_H

#include "worker/ps_client.h"

#include <errno.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/assert.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/finite.h"
#include "metrics/metrics.h"
#include "metrics/names.h"
#include "transport/conn.h"
#include "worker/codec.h"
#include "worker/exchange.h"


#define HELLO_RESEND_US 1000000 /* a HELLO lost with a dropped connection is sent again */
#define HELLO_POLL_MS 50        /* re-evaluate resends and the deadline */
#define READY_POLL_MS 100
#define STOP_GRACE_MS 2000      /* what a request may still wait once this process is stopped (stop_deadline) */
#define RELEASE_MS 2000         /* how long the transport may take to release the payloads of a closed connection */
#define LATE_WAKE_MS 250        /* a poll that returns this much later than asked: the process was stopped */
#define BUSY_PAUSE_MS 50        /* after ERROR 106 (ask again shortly): the first pause, doubling ... */
#define BUSY_PAUSE_MAX_MS 1000  /* ... up to this */
#define SCAN_BLOCK 8192         /* floats unpacked then checked for NaN/infinity while in cache (32 KiB) */

typedef struct {
    dt_conn *conn;            /* the transport's connection to this ps (transport/conn.h) */
    char *endpoint;
    size_t n;                 /* shard floats */
    dt_ps_shard_status st;
    int chunks;               /* how the ps cuts its shard: 1 until a reply says otherwise */
    int cut_known;            /* a reply of the initialised ps said so */
    float *recv;              /* [n] the shard as pulled, chunk by chunk (dt_ps_client_pull_views) */
    atomic_int inflight;      /* zero-copy gradient payloads to this ps the transport has not released */
    atomic_int wake_fd;       /* written when the transport releases one (dt_ps_client_set_wake_fd); -1: none */
    int64_t quiet_since;      /* since when (dt_clock_us) this ps may have heard nothing from us (silent_ms) */
    int64_t gap_us, gap_end;  /* the longest such silence that has ended, and when: until the ps answers a
                               * request sent after it, it may have declared us lost meanwhile */
} ps_conn;

/* What a per-ps request's call does with each reply (STATUS, FETCH, HELLO...). */
typedef int (*reply_fn)(dt_ps_client *c, int ps, dt_msg *in, void *user, dt_error *err);

/* The call under way: what its exchange (worker/exchange.h) is for and where its replies go. */
typedef struct {
    const char *what;         /* names it in messages: "PUSH+PULL", "STATUS"... */
    int push, pull;           /* per chunk: gradients go up (PUSH); parameters come down (PARAMS) */
    int64_t local_step;       /* the pushed gradients' step */
    uint32_t examples;        /* the examples they average (dt_ps_client_set_examples; 0: not said) */
    int64_t min_step;         /* PARAMS: the oldest step wanted */
    float *const *dst;        /* [n_ps] where each PARAMS chunk goes, at its offset */
    int repull;               /* sync pulls: make every chunk one step, at the newest (0) or oldest (1); -1: no */
    int repulled;             /* shards pulled again for that */
    reply_fn fn;              /* a per-ps request: what each reply does (NULL: nothing) */
    void *user;
    int alone, to_ps;         /* a request to ps to_ps alone (dt_ps_client_ask_one) */
    dt_ps_chunk_fn on_chunk;  /* streaming: told of each PARAMS chunk as it lands (set while polling) */
    void *chunk_user;
    double t0;                /* when it began (dt_seconds), for the latency metrics; 0: metrics off */
    const int *slots;         /* sparse tables: requests to each ps [n_ps] (the exchange's multi kind) */
    int reply_slot;           /* the slot the reply handed to fn answers */
    dt_sparse_reply_fn sparse_fn; /* sparse tables: the caller's handler of each reply */
    void *sparse_user;
} call_t;

struct dt_ps_client {
    dt_transport *tr;
    int n_ps;
    ps_conn *ps;
    const char **names;       /* [n_ps] the endpoints, naming each ps in the exchange's messages */
    dt_exchange *ex;          /* the exchange core: the requests out and the replies awaited */
    call_t call;              /* what the exchange under way is for */
    dt_wire_role role;
    uint16_t task;
    int connect_timeout_ms, request_timeout_ms;
    int curve;                /* --auth=curve (for the connect error's hint) */
    dt_auth auth;             /* the client's keys (a copy): a replaced connection is set up as at open */
    char unusable[256];       /* why this client refuses every request ("" while it works) */
    int buffers_held;         /* the transport kept gradient payloads after a failed call (see the header) */
    int aggregate, total, staleness; /* sync replicas; aggregate 0: asynchronous */
    int n_workers;            /* told to every ps in INIT; 0: not told */
    uint64_t chunk_bytes;     /* the cut INIT asks for: chunks of about this size (0: one chunk) */
    int liveness_ms, strict;
    int elastic;              /* INIT says workers join and leave (dynamic sharding) */
    int last_refusal;         /* DT_WIRE_E_* of the latest ERROR reply (dt_ps_client_last_refusal) */
    uint8_t encoding;         /* --compression: of gradients up and parameters down */
    uint32_t examples;        /* the next pushes' (dt_ps_client_set_examples) */
    dt_codec *codec;          /* 16-bit gradients with error feedback; NULL: float32 */
    void (*name_float)(void *user, int ps, size_t index, char *out, size_t cap);
    void *name_user;
    FILE *log;                /* NULL: quiet */
    int sndbuf;               /* SO_SNDBUF of each connection; 0: the kernel's */
    const volatile int *stop; /* set by a signal handler: waits end (DT_EINTR); NULL: none */
    int64_t stopped_at;       /* when a wait first saw *stop set (dt_clock_us); 0: not yet */
    dt_ps_client_stats stats;
    /* Metrics (NULL series when off): latency of each kind of exchange, bytes, stale gradients. */
    dt_metric *m_push, *m_pull, *m_push_pull, *m_wait, *m_tx, *m_rx, *m_stale;
    float **s_dst;            /* [n_ps] a streaming exchange's receive buffers */
    /* dt_ps_client_ask_one: its reply, and a copy of the reply's payload (grown as needed) */
    dt_wire_header one_reply;
    uint8_t *one_buf;
    size_t one_cap, one_len;
};


/* ---- the call driver (ps_call.c), used by ps_conn.c and ps_client.c ---- */
int psc_fail_ps(dt_ps_client *c, int ps, dt_error *err, int code, const char *what, const char *msg);
int psc_stopping(const dt_ps_client *c);
int64_t psc_stop_deadline(dt_ps_client *c);
int64_t psc_request_deadline(const dt_ps_client *c);
int psc_send_req(dt_ps_client *c, int i, int chunk, dt_wire_header *h, dt_bytes *payload, int64_t send_by,
                 dt_error *err);
int psc_send_push(dt_ps_client *c, int i, int k, const float *grad, dt_error *err);
int psc_send_chunk(dt_ps_client *c, int i, int k, const float *grad, dt_error *err);
int psc_wait_round(dt_ps_client *c, long max_ms, int fd, dt_error *err);
int psc_gather(dt_ps_client *c, dt_error *err);
int psc_conn_open(dt_ps_client *c, int i, dt_error *err);
int psc_ask_again(dt_ps_client *c, int rc, int64_t first_us, int *pause_ms);
int psc_call_begin(dt_ps_client *c, const call_t *call, uint8_t want, dt_error *err);
int psc_call_end(dt_ps_client *c, int rc, int64_t *steps, dt_push_result *res, dt_error *err);
int psc_ask_every_ps_flagged(dt_ps_client *c, dt_msg_type type, uint8_t flags, dt_msg_type reply,
                             const char *what, reply_fn fn, void *user, dt_error *err);
int psc_ask_every_ps(dt_ps_client *c, dt_msg_type type, dt_msg_type reply, const char *what, reply_fn fn,
                     void *user, dt_error *err);

#endif
