/* The own transport's event loop (docs/transport.md): epoll, level-triggered, one thread. A
 * descriptor is watched for reading, writing or both; watching it for neither mutes it (a peer
 * over its budget: TCP pushes back). Deadlines are the caller's (the ps's cron): a wait takes a
 * timeout. Not yet behind the seam. */
#ifndef DT_TRANSPORT_LOOP_H
#define DT_TRANSPORT_LOOP_H

#include <stdint.h>

#include "dtrain.h"

#define DT_LOOP_IN 1u
#define DT_LOOP_OUT 2u
#define DT_LOOP_HUP 4u        /* reported only: the peer hung up or the descriptor failed */

typedef struct dt_loop dt_loop;

/* fn(user, fd, events): events is what is ready (DT_LOOP_*). It may change or remove any watch,
 * its own included. */
typedef void (*dt_loop_fn)(void *user, int fd, unsigned events);

int dt_loop_open(dt_loop **out, dt_error *err);
/* Stops watching everything (the descriptors stay open: they are the caller's). */
void dt_loop_close(dt_loop *l);

/* Watches fd for events (DT_LOOP_IN and/or DT_LOOP_OUT; 0: muted). DT_EINVAL if fd is already
 * watched or negative, DT_ENET if epoll refuses it. */
int dt_loop_add(dt_loop *l, int fd, unsigned events, dt_loop_fn fn, void *user, dt_error *err);
/* What fd is watched for from now on (0: muted). */
int dt_loop_set(dt_loop *l, int fd, unsigned events, dt_error *err);
/* What fd is watched for now; -1 if it is not watched. */
int dt_loop_events(const dt_loop *l, int fd);
void dt_loop_del(dt_loop *l, int fd);

/* Waits at most timeout_ms (-1: no limit; 0: only what is ready) and calls each ready watch's fn
 * once: how many were called, DT_EINTR (a signal) or DT_ENET (< 0). */
int dt_loop_wait(dt_loop *l, int timeout_ms, dt_error *err);

#endif
