/* A worker's gradients in a 16-bit encoding, with error feedback (`--compression bf16|fp16`;
 * transport/compress.h has the arithmetic, docs/protocol.md "Encodings" the wire).
 *
 * For each ps shard the codec keeps the residual e (one float per value) and a buffer the packed
 * chunks are sent from, zero-copy. Encoding chunk k packs c = Q(g + e) and computes the next
 * residual (g + e) - c beside the current one; that next residual becomes the current one only when
 * the ps accepts the push (its reply says OK). A push that is lost (the call failed) or dropped as
 * stale leaves e as it was: its gradient is gone as it would be in float32, and what earlier steps
 * rounded away is still owed. Two residual buffers per shard and one bit per chunk saying which is
 * current: accepting a chunk copies nothing. Which reply answers which push is the exchange core's
 * (worker/exchange.h): the client settles a chunk with the one reply it takes to its latest push.
 *
 * Memory per worker: 2 floats and one 16-bit value per parameter. Not thread-safe (one per client). */
#ifndef DT_WORKER_CODEC_H
#define DT_WORKER_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain.h"
#include "transport/compress.h"

typedef struct dt_codec dt_codec;

/* A codec for n_ps shards of shard_floats[i] floats in encoding enc (bf16 or fp16; DT_EINVAL for
 * anything else). Residuals start at zero. */
int dt_codec_open(dt_codec **out, dt_encoding enc, int n_ps, const size_t *shard_floats, dt_error *err);
void dt_codec_free(dt_codec *c);

dt_encoding dt_codec_encoding(const dt_codec *c);

/* Packs chunk `chunk` of shard ps cut into `chunks` (dt_wire_chunk) from grad (the whole shard's
 * gradient) with error feedback. Returns the packed chunk (*bytes long) in the codec's buffer: it
 * must stay untouched while it is sent, i.e. until the call that sends it returns, and it is
 * rewritten by the next encode of that chunk. A cut other than the last one (the chief re-cut the
 * shard) keeps the residuals. */
const void *dt_codec_encode(dt_codec *c, int ps, unsigned chunks, unsigned chunk, const float *grad, size_t *bytes);

/* The reply to the latest push of chunk `chunk` of shard ps arrived: accepted (the ps applied or
 * holds the gradient) or not (dropped as stale). Once per encode (asserted). */
void dt_codec_settle(dt_codec *c, int ps, unsigned chunk, int accepted);

/* The current residual of shard ps (shard_floats[ps] floats), for tests. */
void dt_codec_residual(const dt_codec *c, int ps, float *out);

/* Finite gradient values that saturated (fp16 beyond +-65504; their remainder is carried over). */
uint64_t dt_codec_saturated(const dt_codec *c);

#endif
