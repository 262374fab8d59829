#include "worker/overlap.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/assert.h"
#include "core/error.h"
#include "transport/wire.h"

#define POLL_MS 1000 /* the thread's longest wait: it also wakes on its eventfd */

/* The exchange, as the training thread sees it: IDLE --begin--> RUNNING --the thread ends it
 * (every chunk back, a failure, abandoned)--> DONE --finish--> IDLE. */
enum { IDLE, RUNNING, DONE };
/* A chunk's gradient: WAITING (floats not final yet) --ready--> QUEUED --pushed--> SENT; its
 * parameters then arrive once (arrived[k]). */
enum { WAITING, QUEUED, SENT };

struct dt_overlap {
    dt_overlap_config cfg;
    int n_ps, n_chunks;                        /* chunks of every ps together */
    int *base;                                 /* [n_ps + 1] ps p's chunks are base[p] .. base[p+1]-1 */
    size_t *off, *len;                         /* [n_chunks] in its shard */
    size_t *left;                              /* [n_chunks] floats not final yet */
    uint8_t *state, *arrived;                  /* [n_chunks] */
    int *order, head, tail;                    /* [n_chunks] queued chunks in the order they were ready */
    int n_arrived;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int efd;                                   /* wakes the thread (a chunk ready, a frame let go, quit) */
    int phase, quit, abandon;
    int open;                                  /* the training thread's own: begun, not finished */
    int rc;                                    /* the exchange's outcome (DONE) */
    dt_error err;
    int64_t *steps;                            /* [n_ps] */
    dt_push_result res;
};

int dt_overlap_parse(const char *name, dt_overlap_mode *out, dt_error *err) {
    static const char *names[] = {"none", "fifo", "priority"};
    for (int i = 0; i < 3; i++)
        if (name && !strcmp(name, names[i])) {
            *out = (dt_overlap_mode)i;
            return DT_OK;
        }
    return dt_errorf(err, DT_EINVAL, "--overlap: expected none, fifo or priority, got '%s'", name ? name : "");
}

const char *dt_overlap_name(dt_overlap_mode mode) {
    return mode == DT_OVERLAP_FIFO ? "fifo" : mode == DT_OVERLAP_PRIORITY ? "priority" : "none";
}

static void wake(dt_overlap *o) {
    uint64_t one = 1;
    ssize_t w = write(o->efd, &one, sizeof one);
    (void)w;
}

/* The part [*a, *b) of the flat floats [offset, end) that slice sl holds; 0 when there is none. */
static int slice_part(const dt_slice *sl, size_t offset, size_t end, size_t *a, size_t *b) {
    *a = sl->offset > offset ? sl->offset : offset;
    *b = sl->offset + sl->count < end ? sl->offset + sl->count : end;
    return *a < *b;
}

/* Calls fn(o, chunk, overlap) for every chunk holding part of the flat floats [offset, offset +
 * count): overlap is how many of its floats the range covers. */
static void for_chunks(dt_overlap *o, size_t offset, size_t count, void (*fn)(dt_overlap *, int, size_t)) {
    const dt_placement *pl = o->cfg.placement;
    size_t end = offset + count, a, b;
    for (int s = 0; s < pl->n_slices; s++) {
        const dt_slice *sl = &pl->slices[s];
        if (!slice_part(sl, offset, end, &a, &b)) continue;
        size_t sa = sl->shard_offset + (a - sl->offset), sb = sa + (b - a); /* in the shard */
        for (int k = o->base[sl->ps]; k < o->base[sl->ps + 1]; k++) {
            size_t ca = o->off[k] > sa ? o->off[k] : sa;
            size_t cb = o->off[k] + o->len[k] < sb ? o->off[k] + o->len[k] : sb;
            if (ca < cb) fn(o, k, cb - ca);
        }
    }
}

static int ps_of(const dt_overlap *o, int k) {
    int p = 0;
    while (k >= o->base[p + 1]) p++;
    return p;
}

/* Under the lock: the chunk's gradient is complete. */
static void queue(dt_overlap *o, int k) {
    if (!DT_ASSERT(o->state[k] == WAITING && o->tail < o->n_chunks)) return;
    o->state[k] = QUEUED;
    o->order[o->tail++] = k;
}

static void count_final(dt_overlap *o, int k, size_t n) {
    o->left[k] -= n < o->left[k] ? n : o->left[k];
    if (!o->left[k] && o->state[k] == WAITING) queue(o, k);
}

void dt_overlap_ready(dt_overlap *o, size_t offset, size_t count) {
    if (!o->open) return;
    const dt_placement *pl = o->cfg.placement;
    /* The shards' copies first (the thread reads a chunk only once it is queued). */
    size_t end = offset + count, a, b;
    for (int s = 0; s < pl->n_slices; s++) {
        const dt_slice *sl = &pl->slices[s];
        if (slice_part(sl, offset, end, &a, &b))
            memcpy(o->cfg.grads[sl->ps] + sl->shard_offset + (a - sl->offset), o->cfg.flat_grads + a,
                   (b - a) * sizeof(float));
    }
    pthread_mutex_lock(&o->mu);
    for_chunks(o, offset, count, count_final);
    pthread_mutex_unlock(&o->mu);
    wake(o);
}

void dt_overlap_ready_rest(dt_overlap *o) {
    if (!o->open) return;
    pthread_mutex_lock(&o->mu);
    for (int k = 0; k < o->n_chunks; k++) {
        if (o->state[k] != WAITING) continue;
        int p = ps_of(o, k);
        dt_placement_gather_range(o->cfg.placement, p, o->off[k], o->len[k], o->cfg.grads[p], o->cfg.flat_grads);
        o->left[k] = 0;
        queue(o, k);
    }
    pthread_mutex_unlock(&o->mu);
    wake(o);
}

static void wait_arrived(dt_overlap *o, int k, size_t n) {
    (void)n;
    while (!o->arrived[k] && o->phase == RUNNING) pthread_cond_wait(&o->cv, &o->mu);
}

void dt_overlap_need(dt_overlap *o, size_t offset, size_t count) {
    pthread_mutex_lock(&o->mu);
    if (o->phase == RUNNING) for_chunks(o, offset, count, wait_arrived);
    pthread_mutex_unlock(&o->mu);
}

int dt_overlap_begin(dt_overlap *o, int64_t local_step, int64_t min_step, dt_error *err) {
    if (o->phase != IDLE) return dt_errorf(err, DT_EINVAL, "overlap: an exchange is already under way");
    int rc = dt_ps_client_stream_begin(o->cfg.client, local_step, min_step, err);
    if (rc) return rc;
    /* The cut is known now (it may change between exchanges: a chief's new INIT). */
    int n = 0;
    for (int p = 0; p < o->n_ps; p++) n += dt_ps_client_chunks(o->cfg.client, p);
    if (n > o->n_chunks) {
        dt_error e = {0};
        free(o->off), free(o->len), free(o->left), free(o->state), free(o->arrived), free(o->order);
        o->off = dt_calloc((size_t)n, sizeof *o->off, "chunk offsets", &e);
        o->len = dt_calloc((size_t)n, sizeof *o->len, "chunk lengths", &e);
        o->left = dt_calloc((size_t)n, sizeof *o->left, "chunk counts", &e);
        o->state = dt_calloc((size_t)n, 1, "chunk states", &e);
        o->arrived = dt_calloc((size_t)n, 1, "chunk states", &e);
        o->order = dt_calloc((size_t)n, sizeof *o->order, "chunk order", &e);
        if (!o->off || !o->len || !o->left || !o->state || !o->arrived || !o->order) {
            o->n_chunks = 0;
            if (err) *err = e;
            return dt_ps_client_stream_end(o->cfg.client, DT_ENOMEM, NULL, NULL, err);
        }
    }
    o->n_chunks = n;
    n = 0;
    for (int p = 0; p < o->n_ps; p++) {
        int chunks = dt_ps_client_chunks(o->cfg.client, p);
        o->base[p] = n;
        for (int k = 0; k < chunks; k++, n++) {
            uint64_t off, len;
            dt_wire_chunk(o->cfg.placement->shard_count[p], (unsigned)chunks, (unsigned)k, &off, &len);
            o->off[n] = (size_t)off, o->len[n] = o->left[n] = (size_t)len;
            o->state[n] = WAITING, o->arrived[n] = 0;
        }
    }
    o->base[o->n_ps] = n;
    pthread_mutex_lock(&o->mu);
    o->head = o->tail = o->n_arrived = 0;
    o->abandon = 0;
    o->rc = DT_OK;
    o->phase = RUNNING;
    o->open = 1;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    return DT_OK;
}

int dt_overlap_finish(dt_overlap *o, int abandon, int64_t *steps, dt_push_result *res, dt_error *err) {
    pthread_mutex_lock(&o->mu);
    if (o->phase == IDLE) {
        pthread_mutex_unlock(&o->mu);
        return DT_OK;
    }
    if (abandon && o->phase == RUNNING) o->abandon = 1;
    pthread_mutex_unlock(&o->mu);
    wake(o);
    pthread_mutex_lock(&o->mu);
    while (o->phase == RUNNING) pthread_cond_wait(&o->cv, &o->mu);
    if (!DT_ASSERT(o->phase == DONE)) {
        pthread_mutex_unlock(&o->mu);
        return dt_errorf(err, DT_EINVAL, "overlap: the exchange ended in no known way: %s", dt_assert_why());
    }
    o->phase = IDLE;
    o->open = 0;
    int rc = o->rc;
    if (rc && err) *err = o->err;
    if (!rc) {
        if (steps) memcpy(steps, o->steps, (size_t)o->n_ps * sizeof *steps);
        if (res) *res = o->res;
    }
    pthread_mutex_unlock(&o->mu);
    return rc;
}

/* The chunk to push next, under the lock (-1: none now). fifo: the oldest ready. priority: per ps,
 * while the transport holds none of its payloads, the lowest ready chunk: the next forward needs it first. */
static int next_chunk(dt_overlap *o) {
    if (o->cfg.mode == DT_OVERLAP_FIFO) return o->head < o->tail ? o->order[o->head++] : -1;
    for (int p = 0; p < o->n_ps; p++) {
        if (dt_ps_client_inflight(o->cfg.client, p) > 0) continue;
        for (int k = o->base[p]; k < o->base[p + 1]; k++)
            if (o->state[k] == QUEUED) return k;
    }
    return -1;
}

static void on_chunk(void *user, int ps, int chunk, const float *shard) {
    dt_overlap *o = user;
    if (chunk >= o->base[ps + 1] - o->base[ps]) return; /* not of this cut (the client checked the size) */
    int k = o->base[ps] + chunk;
    /* The client hands each chunk of the exchange over once, and only one that was pushed. */
    if (!DT_ASSERT(o->state[k] == SENT && !o->arrived[k])) return;
    /* The thread writes parameters the training thread does not read now: a chunk is sent only
     * once every layer holding part of it has finished backward, and the next forward reads a
     * layer only after waiting for its chunks. */
    dt_placement_scatter_range(o->cfg.placement, ps, o->off[k], o->len[k], o->cfg.params, shard);
    pthread_mutex_lock(&o->mu);
    o->arrived[k] = 1;
    o->n_arrived++;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

/* Ends the exchange (rc: its error so far) and tells the training thread. Called unlocked. */
static void end_exchange(dt_overlap *o, int rc, dt_error *e) {
    dt_push_result res = {0};
    rc = dt_ps_client_stream_end(o->cfg.client, rc, o->steps, &res, e);
    pthread_mutex_lock(&o->mu);
    if (!DT_ASSERT(o->phase == RUNNING && (rc || o->n_arrived == o->n_chunks)) && !rc)
        rc = dt_errorf(e, DT_EINVAL, "overlap: the exchange ended with chunks missing: %s", dt_assert_why());
    o->rc = rc;
    o->err = *e;
    o->res = res;
    o->phase = DONE;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

static void *run(void *arg) {
    dt_overlap *o = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals are the training thread's (its stop flag) */
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (o->phase != RUNNING && !o->quit) pthread_cond_wait(&o->cv, &o->mu);
        if (o->phase != RUNNING) break; /* quit while idle */
        dt_error e = {0};
        if (o->quit || o->abandon) {
            pthread_mutex_unlock(&o->mu);
            dt_errorf(&e, DT_EINTR, "overlap: exchange abandoned before every chunk was ready");
            end_exchange(o, DT_EINTR, &e);
            pthread_mutex_lock(&o->mu);
            continue;
        }
        uint64_t v;
        ssize_t r = read(o->efd, &v, sizeof v); /* non-blocking: clears the wakes so far, before looking */
        (void)r;
        int rc = DT_OK, k;
        while (!rc && (k = next_chunk(o)) >= 0) {
            if (!DT_ASSERT(o->state[k] == QUEUED)) break;
            o->state[k] = SENT;
            int p = ps_of(o, k);
            pthread_mutex_unlock(&o->mu);
            rc = dt_ps_client_stream_push(o->cfg.client, p, k - o->base[p], o->cfg.grads[p], &e);
            pthread_mutex_lock(&o->mu);
        }
        int done = o->n_arrived == o->n_chunks;
        pthread_mutex_unlock(&o->mu);
        if (!rc && done) {
            end_exchange(o, DT_OK, &e);
        } else {
            if (!rc) rc = dt_ps_client_stream_poll(o->cfg.client, o->efd, POLL_MS, on_chunk, o, &e);
            if (rc) end_exchange(o, rc, &e);
        }
        pthread_mutex_lock(&o->mu);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

int dt_overlap_create(dt_overlap **out, const dt_overlap_config *cfg, dt_error *err) {
    *out = NULL;
    if (cfg->mode != DT_OVERLAP_FIFO && cfg->mode != DT_OVERLAP_PRIORITY)
        return dt_errorf(err, DT_EINVAL, "overlap: mode %d is not fifo or priority", (int)cfg->mode);
    dt_overlap *o = dt_calloc(1, sizeof *o, "overlap", err);
    if (!o) return DT_ENOMEM;
    o->cfg = *cfg;
    o->n_ps = cfg->placement->n_ps;
    o->efd = -1;
    if (!(o->base = dt_calloc((size_t)o->n_ps + 1, sizeof *o->base, "chunk bases", err)) ||
        !(o->steps = dt_calloc((size_t)o->n_ps, sizeof *o->steps, "shard steps", err))) {
        dt_overlap_free(o);
        return DT_ENOMEM;
    }
    if ((o->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
        int rc = dt_errorf(err, DT_EIO, "overlap: eventfd: %s", strerror(errno));
        dt_overlap_free(o);
        return rc;
    }
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    int e = pthread_create(&o->thread, NULL, run, o);
    if (e) {
        pthread_mutex_destroy(&o->mu);
        pthread_cond_destroy(&o->cv);
        close(o->efd);
        o->efd = -1;
        dt_overlap_free(o);
        return dt_errorf(err, DT_ENOMEM, "overlap: cannot start its thread: %s", strerror(e));
    }
    o->started = 1;
    dt_ps_client_set_wake_fd(cfg->client, o->efd);
    *out = o;
    return DT_OK;
}

void dt_overlap_free(dt_overlap *o) {
    if (!o) return;
    if (o->started) {
        dt_overlap_finish(o, 1, NULL, NULL, NULL);
        pthread_mutex_lock(&o->mu);
        o->quit = 1;
        pthread_cond_broadcast(&o->cv);
        pthread_mutex_unlock(&o->mu);
        wake(o);
        pthread_join(o->thread, NULL);
        pthread_mutex_destroy(&o->mu);
        pthread_cond_destroy(&o->cv);
        dt_ps_client_set_wake_fd(o->cfg.client, -1);
    }
    if (o->efd >= 0) close(o->efd);
    free(o->base), free(o->steps), free(o->off), free(o->len), free(o->left), free(o->state), free(o->arrived);
    free(o->order);
    free(o);
}
