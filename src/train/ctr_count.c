/* The training lines of a click log counted on a thread (ctr_count.h). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/error.h"
#include "train/ctr_count.h"

struct dt_ctr_counter {
    dt_ctr_reader *reader;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t lines;   /* counted so far (under mu) */
    int done, rc;     /* the count is over; its result (under mu) */
    int stop;         /* free asks the thread to end (under mu) */
    double t0, seconds;
    dt_error err;     /* the count's error, when rc is one */
};

static int progress(void *user, uint64_t so_far) {
    dt_ctr_counter *c = user;
    pthread_mutex_lock(&c->mu);
    c->lines = so_far;
    int stop = c->stop;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return stop;
}

static void *count_main(void *arg) {
    dt_ctr_counter *c = arg;
    uint64_t n = 0;
    dt_error err = {0};
    int rc = dt_ctr_count(c->reader, &n, progress, c, &err);
    pthread_mutex_lock(&c->mu);
    if (!rc) c->lines = n;
    c->rc = rc, c->err = err, c->done = 1;
    c->seconds = dt_seconds() - c->t0;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int dt_ctr_counter_start(dt_ctr_counter **out, const char *path, const dt_ctr_options *o, dt_error *err) {
    *out = NULL;
    dt_ctr_counter *c = dt_calloc(1, sizeof *c, "line counter", err);
    if (!c) return DT_ENOMEM;
    dt_ctr_options co = *o;
    co.shard_index = 0, co.shard_count = 1; /* counting reads every shard's lines */
    int rc = dt_ctr_open(&c->reader, path, &co, err);
    if (rc) {
        free(c);
        return rc;
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->t0 = dt_seconds();
    if (pthread_create(&c->thread, NULL, count_main, c)) {
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
        dt_ctr_close(c->reader);
        free(c);
        return dt_errorf(err, DT_ENOMEM, "%s: cannot start the thread that counts its lines", path);
    }
    *out = c;
    return DT_OK;
}

int dt_ctr_counter_get(dt_ctr_counter *c, int64_t wait_beyond, uint64_t *lines, dt_error *err) {
    pthread_mutex_lock(&c->mu);
    while (wait_beyond >= 0 && !c->done && c->lines <= (uint64_t)wait_beyond) pthread_cond_wait(&c->cv, &c->mu);
    int rc = c->done ? (c->rc ? c->rc : 1) : 0;
    *lines = c->lines;
    if (rc < 0 && err) *err = c->err;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

double dt_ctr_counter_seconds(const dt_ctr_counter *c) { return c->seconds; }

void dt_ctr_counter_free(dt_ctr_counter *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    dt_ctr_close(c->reader);
    free(c);
}
