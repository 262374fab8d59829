/* Batch loader: one background thread fills two batch slots in turn, so the next batch is being
 * assembled while the caller computes on the current one (double buffering).
 *
 * Training batches are a pure function of their index (epoch = index / batches_per_epoch, the
 * permutation comes from (seed, epoch)), so seeking is just changing the next index. Evaluation is a
 * single forward pass whose cursor moves past skipped bad images, so it is kept by the producer.
 *
 * Slot states: FREE (producer may fill) -> FILLING (producer writes, no lock held) -> READY
 * (waiting for the consumer) -> HELD (returned by dt_loader_next until the next call) -> FREE.
 * A seek bumps `gen`; a batch filled under an older generation is dropped instead of delivered. */
#include "data/loader.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"

enum { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_HELD };

typedef struct {
    float *x;          // [B, h, w, c]
    int32_t *labels;   // [B]
    size_t *ids;       // [B] the data set's example index of each row
    int n, state, rc;
    int64_t index, epoch;
    uint64_t gen;
    dt_error err;
} slot;

struct dt_loader {
    const dt_dataset *ds;
    dt_loader_options opt;
    size_t example_floats;   /* h*w*c */
    size_t shard_len;        /* examples of this shard per epoch (training) or in the pass (eval) */
    int64_t batches_per_epoch;
    int decode_threads;

    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* any state change; few waiters, so one condition is enough */
    atomic_int stop;
    slot slots[2];
    int64_t produce_next, consume_next;
    uint64_t gen;
    int64_t eval_reset;      /* >= 0: the producer moves the eval cursor to this shard position */

    /* producer-owned */
    uint32_t *perm;          /* [N] permutation of the epoch perm_epoch */
    int64_t perm_epoch;
    size_t eval_cursor;      /* next shard position of the evaluation pass */
    int *codes;              /* [B] per-example result of the current fill */
    float *scratch;          /* [B * example] augmentation's copies; NULL when it is off */
    int h, w, c;
    dt_error *errs;          /* [B] */
};

/* Example at shard position j of the current order. */
static size_t shard_example(const dt_loader *l, size_t j) {
    size_t p = (size_t)l->opt.shard_index + j * (size_t)l->opt.shard_count;
    return l->opt.shuffle ? l->perm[p] : p;
}

static int skippable(const dt_loader *l, int rc) {
    return (rc == DT_EFORMAT || rc == DT_EIO) && dt_dataset_bad_images(l->ds) == DT_BAD_IMAGES_SKIP;
}

/* Decodes shard positions first..first+m-1 into rows of s; codes/errs record each result. Under the
 * skip policy a training example that fails is replaced by the next good one of the shard (wrapping
 * within the epoch), so every row of a training batch is filled. */
static void decode_rows(dt_loader *l, slot *s, size_t first, int m, int row0, int replace) {
    const size_t D = l->example_floats;
    const int nt = l->decode_threads;
    #pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
    for (int k = 0; k < m; k++) {
        if (atomic_load(&l->stop)) {
            l->codes[k] = DT_EINTR;
            continue;
        }
        size_t j = first + (size_t)k;
        float *x = s->x + (size_t)(row0 + k) * D;
        int32_t *y = s->labels + row0 + k;
        size_t *id = s->ids + row0 + k;
        *id = shard_example(l, j);
        int rc = dt_dataset_get(l->ds, *id, x, y, &l->errs[k]);
        for (size_t tries = 1; rc && replace && skippable(l, rc) && tries < l->shard_len; tries++) {
            j = (j + 1) % l->shard_len;
            *id = shard_example(l, j);
            rc = dt_dataset_get(l->ds, *id, x, y, &l->errs[k]);
        }
        if (rc && replace && skippable(l, rc))
            rc = dt_errorf(&l->errs[k], DT_EFORMAT, "shard %d of %d: no decodable image among its %zu",
                           l->opt.shard_index, l->opt.shard_count, l->shard_len);
        /* Training rows only: the draw is the example's own (augment.h), whatever row it fills. */
        if (!rc && l->scratch)
            dt_augment_apply(&l->opt.augment, x, l->scratch + (size_t)(row0 + k) * D, l->h, l->w, l->c,
                             dt_augment_key(l->opt.seed, s->epoch, shard_example(l, j)));
        l->codes[k] = rc;
    }
}

static int first_error(dt_loader *l, slot *s, int m) {
    for (int k = 0; k < m; k++)
        if (l->codes[k]) {
            s->err = l->errs[k];
            return l->codes[k];
        }
    return 0;
}

static int fill_training(dt_loader *l, slot *s, int64_t index) {
    int B = l->opt.batch_size;
    int64_t epoch = index / l->batches_per_epoch, step = index % l->batches_per_epoch;
    if (epoch != l->perm_epoch) {
        uint32_t N = (uint32_t)dt_dataset_size(l->ds);
        for (uint32_t i = 0; i < N; i++) l->perm[i] = i;
        dt_shuffle_u32(l->perm, N, dt_hash64(l->opt.seed, (uint64_t)epoch));
        l->perm_epoch = epoch;
    }
    s->epoch = epoch;
    size_t first = (size_t)step * (size_t)B;
    if (l->opt.whole_epoch && l->shard_len - first < (size_t)B) B = (int)(l->shard_len - first); /* the short last */
    decode_rows(l, s, first, B, 0, 1);
    s->n = B;
    return first_error(l, s, B);
}

/* Fills up to B rows from the cursor on, in shard order; bad images under the skip policy are
 * left out and the rows after them move up. */
static int fill_eval(dt_loader *l, slot *s) {
    const int B = l->opt.batch_size;
    const size_t D = l->example_floats;
    int filled = 0;
    s->epoch = 0;
    while (filled < B && l->eval_cursor < l->shard_len) {
        size_t left = l->shard_len - l->eval_cursor;
        int m = (size_t)(B - filled) < left ? B - filled : (int)left;
        decode_rows(l, s, l->eval_cursor, m, filled, 0);
        l->eval_cursor += (size_t)m;
        int dst = filled;
        for (int k = 0; k < m; k++) {
            int rc = l->codes[k];
            if (rc && skippable(l, rc)) continue;
            if (rc) {
                s->err = l->errs[k];
                s->n = dst;
                return rc;
            }
            int src = filled + k;
            if (dst != src) { /* close the gap left by skipped rows */
                memcpy(s->x + (size_t)dst * D, s->x + (size_t)src * D, D * sizeof(float));
                s->labels[dst] = s->labels[src];
                s->ids[dst] = s->ids[src];
            }
            dst++;
        }
        filled = dst;
    }
    s->n = filled;
    return 0;
}

static void *producer(void *arg) {
    dt_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        slot *s = NULL;
        while (!atomic_load(&l->stop)) {
            for (int k = 0; k < 2 && !s; k++)
                if (l->slots[k].state == SLOT_FREE) s = &l->slots[k];
            if (s) break;
            pthread_cond_wait(&l->cv, &l->mu);
        }
        if (atomic_load(&l->stop)) break;
        s->state = SLOT_FILLING;
        s->index = l->produce_next++;
        s->gen = l->gen;
        if (l->eval_reset >= 0) {
            l->eval_cursor = (size_t)l->eval_reset < l->shard_len ? (size_t)l->eval_reset : l->shard_len;
            l->eval_reset = -1;
        }
        pthread_mutex_unlock(&l->mu);

        s->n = 0;
        s->rc = l->opt.shuffle ? fill_training(l, s, s->index) : fill_eval(l, s);

        pthread_mutex_lock(&l->mu);
        s->state = s->gen == l->gen ? SLOT_READY : SLOT_FREE;
        pthread_cond_broadcast(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

int dt_loader_create(dt_loader **out, const dt_dataset *ds, const dt_loader_options *opt,
                     dt_error *err) {
    *out = NULL;
    if (!ds || !opt) return dt_errorf(err, DT_EINVAL, "loader: no data set or options");
    if (opt->batch_size <= 0)
        return dt_errorf(err, DT_EINVAL, "loader: batch size %d must be positive", opt->batch_size);
    if (opt->shard_count <= 0 || opt->shard_index < 0 || opt->shard_index >= opt->shard_count)
        return dt_errorf(err, DT_EINVAL, "loader: shard %d of %d is not a valid shard", opt->shard_index,
                         opt->shard_count);
    if (opt->whole_epoch && (!opt->shuffle || opt->shard_count != 1))
        return dt_errorf(err, DT_EINVAL, "loader: whole epochs are a training order of one shard (dynamic data "
                         "sharding hands batches out instead)");
    size_t N = dt_dataset_size(ds);
    size_t si = (size_t)opt->shard_index, sc = (size_t)opt->shard_count;
    int64_t bpe;
    if (opt->shuffle) {
        /* All shards take the same number of full batches, so they stay in step across epochs. */
        bpe = (int64_t)(N / (sc * (size_t)opt->batch_size));
        if (opt->whole_epoch) bpe = (int64_t)((N + (size_t)opt->batch_size - 1) / (size_t)opt->batch_size);
        if (bpe == 0)
            return dt_errorf(err, DT_EINVAL,
                             "loader: %zu examples do not fill one batch of %d for each of %d shards", N,
                             opt->batch_size, opt->shard_count);
    } else {
        size_t len = N > si ? (N - si + sc - 1) / sc : 0;
        bpe = (int64_t)((len + (size_t)opt->batch_size - 1) / (size_t)opt->batch_size);
    }
    dt_loader *l = dt_calloc(1, sizeof *l, "loader", err);
    if (!l) return DT_ENOMEM;
    l->ds = ds;
    l->opt = *opt;
    l->batches_per_epoch = bpe;
    l->shard_len = N > si ? (N - si + sc - 1) / sc : 0;
    l->perm_epoch = -1;
    l->eval_reset = -1;
    l->decode_threads = opt->decode_threads > 0 ? opt->decode_threads : 1;
    atomic_init(&l->stop, 0);
    int h, w, c;
    dt_dataset_dims(ds, &h, &w, &c);
    l->h = h, l->w = w, l->c = c;
    l->example_floats = (size_t)h * (size_t)w * (size_t)c;
    size_t B = (size_t)opt->batch_size;
    int rc = opt->shuffle ? dt_augment_check(&opt->augment, h, w, err) : 0;
    if (!rc && opt->shuffle && dt_augment_on(&opt->augment) &&
        !(l->scratch = dt_alloc_floats(B * l->example_floats, "augmentation scratch", err)))
        rc = DT_ENOMEM;
    for (int k = 0; k < 2 && !rc; k++) {
        l->slots[k].x = dt_alloc_floats(B * l->example_floats, "batch", err);
        l->slots[k].labels = dt_calloc(B, sizeof(int32_t), "batch labels", err);
        l->slots[k].ids = dt_calloc(B, sizeof(size_t), "batch example ids", err);
        if (!l->slots[k].x || !l->slots[k].labels || !l->slots[k].ids) rc = DT_ENOMEM;
    }
    if (!rc && !(l->codes = dt_calloc(B, sizeof(int), "loader", err))) rc = DT_ENOMEM;
    if (!rc && !(l->errs = dt_calloc(B, sizeof(dt_error), "loader", err))) rc = DT_ENOMEM;
    if (!rc && opt->shuffle && !(l->perm = dt_calloc(N, sizeof(uint32_t), "permutation", err)))
        rc = DT_ENOMEM;
    if (rc) {
        dt_loader_free(l);
        return rc;
    }
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    /* Signals go to the caller's threads, not the loader's (the CLI handles SIGINT itself). */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int prc = pthread_create(&l->thread, NULL, producer, l);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (prc != 0) {
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
        l->thread_started = 0;
        dt_loader_free(l);
        return dt_errorf(err, DT_ENOMEM, "loader: cannot start its thread");
    }
    l->thread_started = 1;
    *out = l;
    return 0;
}

int dt_loader_next(dt_loader *l, dt_batch *b, dt_error *err) {
    pthread_mutex_lock(&l->mu);
    for (int k = 0; k < 2; k++)
        if (l->slots[k].state == SLOT_HELD) l->slots[k].state = SLOT_FREE;
    pthread_cond_broadcast(&l->cv);
    slot *s = NULL;
    for (;;) {
        for (int k = 0; k < 2 && !s; k++)
            if (l->slots[k].state == SLOT_READY && l->slots[k].index == l->consume_next) s = &l->slots[k];
        if (s) break;
        pthread_cond_wait(&l->cv, &l->mu);
    }
    s->state = SLOT_HELD;
    l->consume_next++;
    pthread_mutex_unlock(&l->mu);
    b->n = s->n;
    b->x = s->x;
    b->labels = s->labels;
    b->ids = s->ids;
    b->epoch = s->epoch;
    b->index = s->index;
    if (s->rc) {
        if (err) *err = s->err;
        return s->rc;
    }
    return 0;
}

int64_t dt_loader_batches_per_epoch(const dt_loader *l) { return l->batches_per_epoch; }

int dt_loader_seek(dt_loader *l, int64_t index, dt_error *err) {
    if (index < 0) return dt_errorf(err, DT_EINVAL, "loader: cannot seek to batch %lld", (long long)index);
    pthread_mutex_lock(&l->mu);
    l->gen++;
    for (int k = 0; k < 2; k++) /* a slot being filled is dropped by the producer (old gen) */
        if (l->slots[k].state == SLOT_READY || l->slots[k].state == SLOT_HELD)
            l->slots[k].state = SLOT_FREE;
    l->produce_next = l->consume_next = index;
    if (!l->opt.shuffle) l->eval_reset = index * l->opt.batch_size;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    return 0;
}

void dt_loader_free(dt_loader *l) {
    if (!l) return;
    if (l->thread_started) {
        pthread_mutex_lock(&l->mu);
        atomic_store(&l->stop, 1);
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
    }
    for (int k = 0; k < 2; k++) {
        free(l->slots[k].x);
        free(l->slots[k].labels);
        free(l->slots[k].ids);
    }
    free(l->codes);
    free(l->errs);
    free(l->scratch);
    free(l->perm);
    free(l);
}
