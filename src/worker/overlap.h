/* Overlapping the exchange with compute (--overlap): a step's gradient chunks go to the ps tasks
 * while backward is still running, and the next forward starts each layer as soon as the chunks
 * holding its parameters are back (docs/architecture.md, "Overlap"; docs/protocol.md, "Overlap").
 *
 * A communication thread owns the ps client while an exchange is under way: the training thread
 * says which flat gradient ranges are final (dt_overlap_ready, from the net's after-backward
 * hook), and which parameter ranges it needs (dt_overlap_need, from the before-forward hook,
 * which blocks until they have arrived). The thread pushes every chunk whose floats are all final,
 * each asking for its parameters back, and scatters each parameter chunk into the net's flat
 * buffer as it lands. Order (--overlap): fifo sends each chunk the moment it is ready (last layer
 * first, as backward makes them); priority holds ready chunks back and keeps one in the transport per ps,
 * sending the ready chunk the next forward needs first (the lowest: flat order is forward order),
 * as ByteScheduler and P3 do, so the first layers' parameters are not queued behind the last
 * layers' bulk.
 *
 * Between exchanges (begin .. finish) the caller's thread owns the client again. */
#ifndef DT_WORKER_OVERLAP_H
#define DT_WORKER_OVERLAP_H

#include <stddef.h>
#include <stdint.h>

#include "cluster/placement.h"
#include "dtrain.h"
#include "worker/ps_client.h"

typedef enum {
    DT_OVERLAP_NONE = 0,      /* exchange after backward, before the next forward (push_pull) */
    DT_OVERLAP_FIFO,          /* stream chunks as backward makes them */
    DT_OVERLAP_PRIORITY,      /* stream them, what the next forward needs first (default) */
} dt_overlap_mode;

/* "none", "fifo" or "priority" (the --overlap flag). */
int dt_overlap_parse(const char *name, dt_overlap_mode *out, dt_error *err);
const char *dt_overlap_name(dt_overlap_mode mode);

/* SO_SNDBUF for a client streaming with priority: each connection then keeps at most about this
 * much (the kernel doubles it) between the ordered queue and the wire. What a worker has in flight
 * to a ps queues, first come first served, at that ps's link with every other worker's, ahead of
 * the chunk the next forward waits for: 8 workers at 128 KiB (256 in the kernel) make up to 17 ms
 * of queue at 1 Gbit (BENCHMARKS.md, "Eight workers"). */
#define DT_OVERLAP_SNDBUF (32 << 10)

typedef struct dt_overlap dt_overlap;

typedef struct {
    dt_ps_client *client;
    const dt_placement *placement;
    float *const *grads;          /* [n_ps] gradient shards, sent zero-copy */
    float *params;                /* the net's flat parameters: arrived chunks are scattered here */
    const float *flat_grads;      /* the net's flat gradients: ready ranges are gathered from here */
    dt_overlap_mode mode;         /* FIFO or PRIORITY */
} dt_overlap_config;

int dt_overlap_create(dt_overlap **out, const dt_overlap_config *cfg, dt_error *err);
/* Abandons an exchange under way (its replies are dropped) and stops the thread. */
void dt_overlap_free(dt_overlap *o);

/* Starts an exchange (dt_ps_client_stream_begin): the client goes to the thread. */
int dt_overlap_begin(dt_overlap *o, int64_t local_step, int64_t min_step, dt_error *err);
/* Flat gradient floats [offset, offset + count) are final: copied into the shards now, and every
 * chunk they complete is queued. Each float once per exchange. */
void dt_overlap_ready(dt_overlap *o, size_t offset, size_t count);
/* Every float not reported yet is final too (the rest of the gradient). */
void dt_overlap_ready_rest(dt_overlap *o);
/* Blocks until the chunks holding flat parameters [offset, offset + count) have arrived, or the
 * exchange failed (then finish says why). */
void dt_overlap_need(dt_overlap *o, size_t offset, size_t count);
/* Waits for the exchange to end (every chunk was reported ready): its outcome as
 * dt_ps_client_push_pull's. abandon: end it now instead, with DT_EINTR (not every chunk was
 * ready: training stopped mid-step). The client is the caller's again. */
int dt_overlap_finish(dt_overlap *o, int abandon, int64_t *steps, dt_push_result *res, dt_error *err);

#endif
