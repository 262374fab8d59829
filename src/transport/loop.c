#include "transport/loop.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "core/error.h"

#define MAX_EVENTS 64 /* ready descriptors handled per wait; the rest stay ready for the next */

typedef struct {
    dt_loop_fn fn;
    void *user;
    unsigned events;
    int used;
} watch;

struct dt_loop {
    int ep;
    watch *by_fd;             /* [cap], indexed by descriptor */
    int cap;
};

int dt_loop_open(dt_loop **out, dt_error *err) {
    *out = NULL;
    dt_loop *l = dt_calloc(1, sizeof *l, "event loop", err);
    if (!l) return DT_ENOMEM;
    if ((l->ep = epoll_create1(EPOLL_CLOEXEC)) < 0) {
        int rc = dt_errorf(err, DT_ENET, "epoll_create1: %s", strerror(errno));
        free(l);
        return rc;
    }
    *out = l;
    return DT_OK;
}

void dt_loop_close(dt_loop *l) {
    if (!l) return;
    close(l->ep);
    free(l->by_fd);
    free(l);
}

static uint32_t epoll_bits(unsigned events) {
    return (events & DT_LOOP_IN ? EPOLLIN : 0u) | (events & DT_LOOP_OUT ? EPOLLOUT : 0u);
}

static int ctl(dt_loop *l, int op, int fd, unsigned events, dt_error *err) {
    struct epoll_event ev = {.events = epoll_bits(events), .data.fd = fd};
    if (epoll_ctl(l->ep, op, fd, &ev) == 0) return DT_OK;
    return dt_errorf(err, DT_ENET, "epoll_ctl(fd %d): %s", fd, strerror(errno));
}

int dt_loop_add(dt_loop *l, int fd, unsigned events, dt_loop_fn fn, void *user, dt_error *err) {
    if (fd < 0 || (fd < l->cap && l->by_fd[fd].used))
        return dt_errorf(err, DT_EINVAL, "descriptor %d: negative or already watched", fd);
    if (fd >= l->cap) {
        int cap = l->cap ? l->cap : 64;
        while (cap <= fd) cap *= 2;
        watch *t = realloc(l->by_fd, (size_t)cap * sizeof *t);
        if (!t) return dt_errorf(err, DT_ENOMEM, "out of memory for the event loop's table");
        memset(t + l->cap, 0, (size_t)(cap - l->cap) * sizeof *t);
        l->by_fd = t, l->cap = cap;
    }
    int rc = ctl(l, EPOLL_CTL_ADD, fd, events, err);
    if (!rc) l->by_fd[fd] = (watch){.fn = fn, .user = user, .events = events, .used = 1};
    return rc;
}

int dt_loop_set(dt_loop *l, int fd, unsigned events, dt_error *err) {
    if (fd < 0 || fd >= l->cap || !l->by_fd[fd].used)
        return dt_errorf(err, DT_EINVAL, "descriptor %d is not watched", fd);
    if (l->by_fd[fd].events == events) return DT_OK;
    int rc = ctl(l, EPOLL_CTL_MOD, fd, events, err);
    if (!rc) l->by_fd[fd].events = events;
    return rc;
}

int dt_loop_events(const dt_loop *l, int fd) {
    return fd >= 0 && fd < l->cap && l->by_fd[fd].used ? (int)l->by_fd[fd].events : -1;
}

void dt_loop_del(dt_loop *l, int fd) {
    if (fd < 0 || fd >= l->cap || !l->by_fd[fd].used) return;
    epoll_ctl(l->ep, EPOLL_CTL_DEL, fd, NULL);
    l->by_fd[fd] = (watch){0};
}

int dt_loop_wait(dt_loop *l, int timeout_ms, dt_error *err) {
    struct epoll_event ev[MAX_EVENTS];
    int n = epoll_wait(l->ep, ev, MAX_EVENTS, timeout_ms);
    if (n < 0) {
        if (errno == EINTR) return dt_errorf(err, DT_EINTR, "wait interrupted by a signal");
        return dt_errorf(err, DT_ENET, "epoll_wait: %s", strerror(errno));
    }
    int called = 0;
    for (int k = 0; k < n; k++) {
        int fd = ev[k].data.fd;
        /* An earlier callback of this round may have removed or muted it. */
        if (fd >= l->cap || !l->by_fd[fd].used) continue;
        watch w = l->by_fd[fd];
        unsigned ready = (ev[k].events & EPOLLIN ? DT_LOOP_IN : 0u) | (ev[k].events & EPOLLOUT ? DT_LOOP_OUT : 0u) |
                         (ev[k].events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP) ? DT_LOOP_HUP : 0u);
        ready &= w.events | DT_LOOP_HUP;
        if (!ready) continue;
        w.fn(w.user, fd, ready);
        called++;
    }
    return called;
}
