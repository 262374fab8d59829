/* Batches from a data set, assembled by a background thread so decoding overlaps compute.
 *
 * Training order (shuffle = 1): epoch e visits a permutation of all examples drawn from
 * (seed, e). With shard_count = n, shard i takes positions i, i+n, i+2n, ... of that permutation,
 * so at step t the n shards' batches together are exactly positions [t*n*B, (t+1)*n*B): n workers
 * with batch B see the same examples as one process with batch n*B. Training batches are always
 * full (a short tail of an epoch is dropped); the stream runs on across epochs.
 * Evaluation order (shuffle = 0): one pass in file order over the shard, the last batch may be
 * short; dt_loader_next then reports 0 examples at the end.
 * Whole epochs (shuffle = 1, whole_epoch = 1; dynamic data sharding, docs/elastic.md): not sharded;
 * batch b of epoch e is positions [b*B, min((b+1)*B, N)) of that epoch's permutation, so an epoch
 * is ceil(N/B) batches, every example once, the last one short when B does not divide N. Batch
 * index e * ceil(N/B) + b; a worker seeks to the batches of the units it is granted. A bad image
 * skipped is replaced by the next good example of the epoch, which is then trained twice. */
#ifndef DT_DATA_LOADER_H
#define DT_DATA_LOADER_H

#include "data/augment.h"
#include "data/dataset.h"

typedef struct {
    int batch_size;
    int shuffle;             /* 1: training order (looping), 0: one evaluation pass */
    uint64_t seed;
    int shard_index, shard_count; /* 0 and 1 when not sharded */
    int whole_epoch;         /* training order: every example once per epoch, a short last batch
                                (shard_count must be 1) */
    int decode_threads;      /* threads decoding one batch of an image folder; <= 0: 1 (the loader
                                thread alone; see docs/data.md for the measurements) */
    dt_augment augment;      /* training order only (data/augment.h); evaluation passes never */
} dt_loader_options;

typedef struct {
    int n;                   /* examples in this batch (0: evaluation pass finished) */
    const float *x;          /* [n, h, w, c], valid until the next dt_loader_next */
    const int32_t *labels;   /* [n] */
    const size_t *ids;       /* [n] the data set's index of each example (bad images left out of an
                                evaluation pass leave gaps; prediction names each row's file by it) */
    int64_t epoch;           /* epoch the batch's first example belongs to */
    int64_t index;           /* batch number since the loader started (or was last reset) */
} dt_batch;

typedef struct dt_loader dt_loader;

int dt_loader_create(dt_loader **out, const dt_dataset *ds, const dt_loader_options *opt,
                     dt_error *err);
/* Blocks until the next batch is ready. A bad image under DT_BAD_IMAGES_SKIP is replaced by the next
 * good example of the same shard (and counted); under FAIL the error is returned here. */
int dt_loader_next(dt_loader *l, dt_batch *b, dt_error *err);
/* Full batches per epoch for this shard in training order (whole_epoch: batches, the last one
 * maybe short). */
int64_t dt_loader_batches_per_epoch(const dt_loader *l);
/* Repositions the training stream at batch `index` (resume from a checkpoint): the next batch is
 * the one that would have been number `index`. Invalidates the batch last returned. In evaluation
 * order it moves to shard position index * batch_size. */
int dt_loader_seek(dt_loader *l, int64_t index, dt_error *err);
void dt_loader_free(dt_loader *l);

#endif
