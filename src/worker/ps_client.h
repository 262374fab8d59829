/* The worker's side of the parameter servers: one connection (transport/conn.h) per ps task, requests
 * sent to all shards at once and their replies gathered, every wait bounded by a deadline.
 *
 * Shards: ps i holds shard_floats[i] parameters. The caller passes one buffer per shard (for a
 * placement that gives each ps one contiguous range of the flat parameter buffer, these are just
 * pointers into it, and nothing is copied twice). Gradients are sent zero-copy from the caller's
 * buffers: they must stay unchanged while a call that sends them (push_all, push_pull) runs, and
 * are the caller's again when it returns, whether it succeeded or failed: the transport then holds
 * none of them (a failed call closes the connection of any ps whose gradient is still queued or
 * half sent, so the transport drops it, and connects a fresh one). Should the transport not let go
 * within a bound (never seen), the call fails with DT_EIO, dt_ps_client_buffers_held says so, the buffers must stay
 * untouched until dt_ps_client_close, and every later request fails. Parameters are received
 * straight into the caller's buffers.
 *
 * Not thread-safe: one client per worker thread. */
#ifndef DT_WORKER_PS_CLIENT_H
#define DT_WORKER_PS_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "compute/optim.h"
#include "dtrain.h"
#include "transport/wire.h"

typedef struct dt_ps_client dt_ps_client;

typedef struct {
    int n_ps;
    const char *const *endpoints; /* [n_ps] connect endpoints, "tcp://host:port", ps task order */
    const size_t *shard_floats;   /* [n_ps] floats each ps holds (> 0) */
    dt_wire_role role;            /* DT_ROLE_CHIEF (may INIT and SHUTDOWN) or DT_ROLE_WORKER */
    int task;                     /* worker task index, sent in every message (the ps logs it) */
    int connect_timeout_ms;       /* open: how long to retry each ps; <= 0: 10000 */
    int request_timeout_ms;       /* any other call: how long to wait for all replies; <= 0: 60000 */
    /* Sync replicas; replicas_to_aggregate 0: asynchronous. The chief sends this configuration to
     * every ps in INIT; every client tags its pushes as sync gradients, and each of its pulls
     * returns every shard at one step (shards that come back at different steps are pulled again
     * at the newest of them, exactly). */
    int replicas_to_aggregate, total_num_replicas, staleness;
    int n_workers;                /* worker tasks in the cluster, told to every ps in INIT (a ps
                                   * refuses messages from other tasks); 0: not told */
    /* Chief: INIT cuts each shard into chunks of about this many bytes (at most 255 chunks), which
     * travel and are applied one by one, so the parameters of the first come back while the later
     * ones are still on their way up (docs/protocol.md, "Chunks"). 0: one chunk per shard; < 0:
     * DT_WIRE_CHUNK_BYTES_DEFAULT. Every client learns the cut from the ps's replies. */
    int64_t chunk_bytes;
    /* Sync mode, sent in INIT: a worker silent this long is lost to the ps, which then waits for
     * the live workers only (0: never); strict: a lost worker stops the job instead. */
    int liveness_ms, strict;
    /* Sync, sent in INIT: workers join and leave (dynamic sharding): none counts toward steps until
     * the ps hears from it, so a declared worker that never starts is not waited for. */
    int elastic;
    const struct dt_auth_s *auth; /* CURVE keys (transport/auth.h, copied); NULL: no security */
    /* Gradients up and parameters down in this encoding (docs/protocol.md, "Encodings"): 16-bit
     * gradients carry error feedback (worker/codec.h), parameters are unpacked into float32. The
     * ps keeps float32; INIT and FETCH stay float32. DT_ENC_FP32 (0): as they are. */
    dt_encoding compression;
    /* Names float `index` of shard `ps` in messages, e.g. "conv2/kernel[123]" (the parameters a pull
     * refuses as non-finite); NULL: "float 123 of its shard". */
    void (*name_float)(void *user, int ps, size_t index, char *out, size_t cap);
    void *name_user;
    FILE *log;                    /* NULL: quiet; else open says once whom it waits for (a ps not up yet) */
    struct dt_metrics *metrics;   /* Prometheus series (push/pull latency, bytes, stale; docs/metrics.md); NULL: none */
    /* SO_SNDBUF of each connection (0: the kernel's, which grows to MBs): a streaming client that
     * orders its chunks keeps it small, so what it sends next is not queued behind MBs already
     * handed to the kernel. */
    int sndbuf_bytes;
    /* Set by a signal handler (may be NULL). Once set, open and dt_ps_client_wait_ready end with
     * DT_EINTR, and any other request (DONE, SHUTDOWN, the step in flight) waits at most 2 s more
     * for its replies, not the request timeout: the ps tasks are most likely stopping too. */
    const volatile int *stop;
} dt_ps_client_config;

typedef struct {
    int initialised;
    int importing;                /* the ps waits for the chief's import of the tables to end (its
                                   * WELCOME or STATUS_REPLY said so): not ready, whatever initialised says */
    int generation;               /* of the INIT that set the shard (1..255; 0: not initialised) */
    int64_t global_step;          /* the shard's step (updates applied) */
    uint64_t pushes, pulls;       /* served by that ps so far */
    uint64_t workers_done;        /* distinct workers that told it they finished (DONE); ps 0 with
                                   * a work plan adds the members it lost */
    int64_t workers_busy;         /* ps 0 with a work plan: members still training, the asker not
                                   * counted; 0 elsewhere */
} dt_ps_shard_status;

typedef struct {
    int64_t global_step;          /* ps 0's step after this push: the cluster's global step */
    int n_stale;                  /* shards that dropped the gradient as stale (sync mode) */
    int stale_ref;                /* ps 0's chunk 0 did: ps 0 does not count its batch (dynamic
                                   * sharding), whatever the other chunks did */
    int repulled;                 /* shards pulled again to get one step (sync mode, several ps) */
    int64_t wait_us;              /* longest time a ps held this call's PULL (the barrier) */
} dt_push_result;

/* Totals over a client's life. */
typedef struct {
    uint64_t pushes, stale_pushes;/* pushes; those that at least one ps dropped as stale */
    uint64_t pulls, repulls;      /* pull calls; shards pulled again at a common step */
    int64_t wait_us;              /* sum over pulls of the longest time a ps held the PULL */
    uint64_t tx_bytes, rx_bytes;  /* every message sent and received, headers included */
    uint64_t sparse_tx_bytes, sparse_rx_bytes; /* of which sparse tables' (dt_ps_client_sparse) */
    uint64_t busy_retries;        /* requests asked again after ERROR 106 (the ps said: ask again shortly) */
} dt_ps_client_stats;

/* Connects to every ps and checks it with HELLO (protocol version, shard size). A ps that is not
 * up yet is retried (the transport reconnects with backoff from 50 ms doubling to 1 s; HELLO is resent
 * every second) until connect_timeout_ms; then fails naming the address. Every ps is tried in
 * parallel. One that has not answered after a second is named once in cfg->log. */
int dt_ps_client_open(dt_ps_client **out, const dt_ps_client_config *cfg, dt_error *err);
void dt_ps_client_close(dt_ps_client *c);

int dt_ps_client_n_ps(const dt_ps_client *c);
const dt_ps_client_stats *dt_ps_client_get_stats(const dt_ps_client *c);
/* What the latest reply from ps i said (WELCOME after open, then STATUS/PUSH/PULL replies). */
const dt_ps_shard_status *dt_ps_client_shard(const dt_ps_client *c, int ps);

/* Chief only: sends every ps its initial parameters (params[i], shard_floats[i] floats), optimizer
 * state (state[i], slots * shard_floats[i] floats slot-major; state == NULL: zeros), the
 * optimizer configuration (its schedule and weight decay too) and the decay mask (decay[i],
 * shard_floats[i] bytes, non-zero where weight decay applies; NULL: nowhere); global_step is the starting step (0, or a restored checkpoint's). Each
 * INIT is a new generation, one that no shard reported last (every shard gets the same one), so a
 * client seeing every shard at one generation knows they come from one initialisation. */
int dt_ps_client_init(dt_ps_client *c, const dt_opt_config *opt, const float *const *params,
                      const float *const *state, const uint8_t *const *decay, int64_t global_step, dt_error *err);

/* Reads every ps's whole shard for a checkpoint: parameters into params[i] (shard_floats[i]
 * floats), optimizer state into state[i] (dt_opt_slots(opt) * shard_floats[i] floats, slot-major as
 * INIT takes it; state may be NULL) and each shard's global step into steps[i] (may be NULL).
 * opt is the optimizer the caller expects: a ps holding another kind is refused (DT_EPROTO), and
 * so is one not initialised yet. Any role may fetch. Restoring is dt_ps_client_init with the same
 * buffers and step. Each shard is read at one step, but shards may be at different steps (async
 * mode, or sync with backup workers or staleness): compare steps[] and fetch again if they must agree. In sync
 * mode with replicas_to_aggregate == total_num_replicas, a worker calling this between its steps
 * and staleness 0 always gets one step, since no ps can move on without that worker's gradient. */
int dt_ps_client_fetch_state(dt_ps_client *c, const dt_opt_config *opt, float *const *params,
                             float *const *state, int64_t *steps, int64_t *steps_max, dt_error *err);

/* Polls STATUS until every ps is initialised or timeout_ms passes (then fails naming the first ps
 * still waiting). */
int dt_ps_client_wait_ready(dt_ps_client *c, int timeout_ms, dt_error *err);

/* Pulls every shard into params[i]. min_step > 0 asks each ps to answer once its step reaches
 * min_step (bounded by the request timeout). steps (may be NULL) receives each shard's step [n_ps];
 * every step is checked (>= min_step; in sync mode all equal). A shard holding a NaN or an infinity
 * is refused (DT_EFORMAT) naming the ps, its address, the step and the parameter: training
 * diverged, or the ps is damaged. */
int dt_ps_client_pull_all(dt_ps_client *c, float *const *params, int64_t min_step, int64_t *steps,
                          dt_error *err);

/* The same without the copy: views[i] points at shard i as received (shard_floats[i] floats),
 * valid until the next call on this client. For a caller that scatters the shards into its own
 * layout anyway (one copy instead of two). */
int dt_ps_client_pull_views(dt_ps_client *c, int64_t min_step, const float **views, int64_t *steps,
                            dt_error *err);

/* pull_views for a worker resuming (min_step 0): in sync mode, chunks found a step apart are all
 * taken at the oldest of their steps (the ones ahead from the ps's snapshots), not the newest: a
 * worker that was lost is counted live again by its pull, so the chunks behind wait for its
 * gradient, which it sends only after this pull. */
int dt_ps_client_pull_resume(dt_ps_client *c, const float **views, int64_t *steps, dt_error *err);

/* The examples the gradients of the next pushes average (1..DT_WIRE_MAX_EXAMPLES; 0: not said),
 * sent in every PUSH: a sync ps weights each gradient of a step by them, so the update is the mean
 * over the examples the step trained (docs/protocol.md). Taken when a push begins. */
int dt_ps_client_set_examples(dt_ps_client *c, uint64_t examples, dt_error *err);

/* Pushes grads[i] (shard_floats[i] floats) to every ps, tagged with local_step (sync mode: the step
 * the gradient is for); waits for every acknowledgement. res may be NULL. */
int dt_ps_client_push_all(dt_ps_client *c, const float *const *grads, int64_t local_step,
                          dt_push_result *res, dt_error *err);

/* A push and the following pull in one exchange: every PUSH and then every PULL are sent before
 * any reply is awaited, saving a round trip per step. Each ps handles one connection's requests
 * in order, so the parameters reflect this push (and, with min_step, wait for that step: the
 * barrier of sync mode). views as for dt_ps_client_pull_views; steps, res may be NULL. */
int dt_ps_client_push_pull(dt_ps_client *c, const float *const *grads, int64_t local_step,
                           int64_t min_step, const float **views, int64_t *steps, dt_push_result *res,
                           dt_error *err);

/* Streaming: one push-and-pull exchange whose chunks the caller sends one by one, in the order it
 * chooses, as their gradients become final; each PUSH asks for its chunk's PARAMS back (at
 * min_step or later, as dt_ps_client_push_pull), which land in the client's receive buffer of that
 * shard, chunk by chunk, each handed to fn as it arrives. The calls of one exchange: begin, push
 * (every chunk of every ps, once), poll until every reply is in, end (also after an error, with
 * its code: the gradient buffers are then released as the top of this file says). Pushed
 * gradients must stay unchanged until end returns. All from one thread at a time, and no other
 * call while the exchange is under way (it is refused, DT_EINVAL). This is the client's one
 * exchange (worker/exchange.h): push_all, pull_all and push_pull are the same, sent whole. */
typedef void (*dt_ps_chunk_fn)(void *user, int ps, int chunk, const float *shard);
int dt_ps_client_stream_begin(dt_ps_client *c, int64_t local_step, int64_t min_step, dt_error *err);
/* How ps cuts its shard (known once begin returned): chunk k is dt_wire_chunk(shard, chunks, k). */
int dt_ps_client_chunks(const dt_ps_client *c, int ps);
/* Sends chunk `chunk` of ps's gradient; grad is the whole shard. */
int dt_ps_client_stream_push(dt_ps_client *c, int ps, int chunk, const float *grad, dt_error *err);
/* Waits up to max_ms for replies (returning early when fd >= 0 becomes readable) and handles
 * those in; fails when replies are due longer than the request timeout after the latest push. */
int dt_ps_client_stream_poll(dt_ps_client *c, int fd, int max_ms, dt_ps_chunk_fn fn, void *user, dt_error *err);
/* Ends the exchange: rc 0 once every reply is in (steps, res as for push_pull: a shard's step is its
 * oldest chunk's; chunks a step apart are not pulled again), or an error code. */
int dt_ps_client_stream_end(dt_ps_client *c, int rc, int64_t *steps, dt_push_result *res, dt_error *err);
/* Gradient payloads of ps that the transport still holds (sent, not yet all handed to the kernel). */
int dt_ps_client_inflight(const dt_ps_client *c, int ps);
/* An eventfd written whenever the transport lets a gradient payload go (from its I/O thread); -1: none. */
void dt_ps_client_set_wake_fd(dt_ps_client *c, int fd);

/* Sparse tables (docs/protocol.md, "Sparse tables"): one exchange of n_msgs[i] messages to each ps
 * i (0..DT_WIRE_MAX_CHUNKS), all SPARSE_INITs, SPARSE_PULLs, SPARSE_PUSHes, SPARSE_EXPORTs or
 * SPARSE_IMPORTs, built by the caller (the header's type and type-specific fields, the payload:
 * copied); every reply (SPARSE_ROWS, SPARSE_PAGE, or ACK with status OK or STALE) goes to fn with the
 * message's index k, its header checked for type, sender and payload size. An ERROR reply fails the
 * call naming the ps. Nothing to send: returns at once. */
typedef struct {
    dt_wire_header h;
    const void *payload;
    size_t bytes;
} dt_sparse_msg;
typedef int (*dt_sparse_reply_fn)(void *user, int ps, int k, const dt_wire_header *h, const void *payload, size_t len,
                                  dt_error *err);
int dt_ps_client_sparse(dt_ps_client *c, const int *n_msgs, dt_sparse_msg *const *msgs, dt_sparse_reply_fn fn,
                        void *user, dt_error *err);
/* The same call in two halves, so that its replies travel while the caller computes (the sparse
 * prefetch: worker/sparse_prefetch.h): send sends every message (*sent 1 when a call began: it then
 * stays under way, whatever send returns, and no other call may begin) and returns; end waits for
 * the replies (each to fn, as above) and ends the call. end with rc != 0 ends it at once, failed
 * (replies still on their way are ignored by later calls, as an earlier exchange's), and returns rc.
 * fn and user must stay valid until end. */
int dt_ps_client_sparse_send(dt_ps_client *c, const int *n_msgs, dt_sparse_msg *const *msgs, dt_sparse_reply_fn fn,
                             void *user, int *sent, dt_error *err);
int dt_ps_client_sparse_end(dt_ps_client *c, int rc, dt_error *err);

/* The status of the latest ERROR reply a ps sent this client (DT_WIRE_E_*), 0 if none since the
 * last call that succeeded: tells a refusal worth waiting out (a ps restarting: NOT_READY,
 * RESYNC, GONE) from one that is not. */
int dt_ps_client_last_refusal(const dt_ps_client *c);

/* 1 after a call failed with DT_EIO leaving gradient payloads with the transport (see the top of this file):
 * the caller must not write its gradient buffers before dt_ps_client_close. */
int dt_ps_client_buffers_held(const dt_ps_client *c);

/* How long the ps task that heard from this client longest ago may have heard nothing from it:
 * since the latest of the request last sent to it, its answer to one (a PULL it held: when it let
 * it go, by the hold time the reply reports), and the latest moment this process was waiting for
 * its reply while running (a sync ps holding a PULL counts the worker alive). Time this process
 * was stopped (SIGSTOP, a paused machine) while waiting counts as silence. A silence that has
 * ended counts too until the ps answers a request sent after it: a request sent after a long stop
 * may only have been queued for a ps that has declared the worker lost and exited. A sync ps
 * declares a worker silent for its liveness timeout lost. */
int64_t dt_ps_client_silent_ms(const dt_ps_client *c);

/* Fresh STATUS of every ps into out[n_ps] (may be NULL: only refreshes dt_ps_client_shard). */
int dt_ps_client_status(dt_ps_client *c, dt_ps_shard_status *out, dt_error *err);

/* A worker that has finished training tells every ps (so the chief knows when it may end the
 * cluster without cutting off a worker still pushing). waiting: not finished, it sits steps out
 * until ps 0 has work for it (dynamic sharding, sync): the DONE's WAITING flag. */
int dt_ps_client_done(dt_ps_client *c, int waiting, dt_error *err);

/* Chief: polls STATUS until every ps has heard DONE from at least n_workers workers and ps 0's
 * work plan (dynamic sharding) has no member still training, or timeout_ms passes (then fails
 * saying how many finished, or are busy). n_workers <= 0: only the work plan's members. */
int dt_ps_client_wait_done(dt_ps_client *c, int n_workers, int timeout_ms, dt_error *err);

/* Chief only: tells every ps that training is over; each acknowledges and exits. */
int dt_ps_client_shutdown(dt_ps_client *c, dt_error *err);

/* One request to ps `ps` alone, its reply awaited by a second call, so the caller can work in
 * between: a claim (WORK_DONE) goes to ps 0 while its batch is computed (worker/work_client.h).
 * h: the type and its own fields (the routing fields and payload_bytes are filled here); payload:
 * len bytes, copied (may be NULL); want: the reply type awaited (ACK, WORK_GRANT, WORK_STATE). No
 * other call may run until ask_one_end (it is refused, DT_EINVAL). */
int dt_ps_client_ask_one(dt_ps_client *c, int ps, dt_wire_header *h, const void *payload, size_t len, uint8_t want,
                         const char *what, dt_error *err);
/* Waits for that reply (bounded by the request timeout) and ends the request, whatever its
 * outcome: its header into *reply, its payload (valid until the next ask_one; NULL when none).
 * An ERROR reply fails it (DT_EPROTO, err naming the ps and the ps's text;
 * dt_ps_client_last_refusal has its status). */
int dt_ps_client_ask_one_end(dt_ps_client *c, dt_wire_header *reply, const void **payload, size_t *len,
                             dt_error *err);
/* 1 while a request to one ps awaits ask_one_end. */
int dt_ps_client_asking_one(const dt_ps_client *c);

#endif
