#include "cluster/rendezvous.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"

enum {
    LINE_MAX_BYTES = 128, /* a hello: "dtrain-rendezvous 1 RANK SIZE PORT LOCAL\n" */
    EXTRA_CONNS = 16,     /* connections beyond the expected ranks (strays, retries) */
    SEND_MS = 5000,       /* the longest rank 0 waits for one rank to take its answer */
    HELLO_MS = 5000,      /* a connection's whole hello, from accept (a rank sends it at once) */
    ACCEPT_BURST = 64,    /* connections accepted per round, so a flood cannot starve reads */
    LOG_FIRST = 5,        /* connections closed without a hello logged one by one; then counted */
    RETRY_MS = 100,       /* a rank's first wait before trying rank 0 again, */
    RETRY_MAX_MS = 1000,  /* doubling up to this */
};

#define HELLO "dtrain-rendezvous 1"

static int ms_left(double deadline) {
    double left = (deadline - dt_seconds()) * 1000.0;
    return left <= 0 ? 0 : left > 1e9 ? 1000000000 : (int)left;
}

/* Sleeps for *backoff ms (at most until deadline), then doubles it up to RETRY_MAX_MS. */
static void back_off(int *backoff, double deadline) {
    struct pollfd none = {.fd = -1};
    int left = ms_left(deadline);
    poll(&none, 0, left < *backoff ? left : *backoff);
    *backoff = *backoff * 2 > RETRY_MAX_MS ? RETRY_MAX_MS : *backoff * 2;
}

/* --rendezvous resolved: its first IPv4 address, else its first IPv6 one (as a ps binds). */
static int resolve(const dt_addr *a, struct sockaddr_storage *ss, socklen_t *len, dt_error *err) {
    char host[DT_HOST_MAX], port[8];
    size_t n = strlen(a->host);
    if (a->host[0] == '[') snprintf(host, sizeof host, "%.*s", (int)n - 2, a->host + 1);
    else snprintf(host, sizeof host, "%s", a->host);
    snprintf(port, sizeof port, "%d", a->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL, *pick = NULL;
    int gai = getaddrinfo(host, port, &hints, &res);
    if (gai)
        return dt_errorf(err, DT_ENET, "--rendezvous: cannot resolve %s: %s", a->host,
                         gai == EAI_SYSTEM ? strerror(errno) : gai_strerror(gai));
    for (struct addrinfo *ai = res; ai && !pick; ai = ai->ai_next)
        if (ai->ai_family == AF_INET) pick = ai;
    for (struct addrinfo *ai = res; ai && !pick; ai = ai->ai_next)
        if (ai->ai_family == AF_INET6) pick = ai;
    if (pick) memcpy(ss, pick->ai_addr, pick->ai_addrlen), *len = pick->ai_addrlen;
    freeaddrinfo(res);
    return pick ? 0 : dt_errorf(err, DT_ENET, "--rendezvous: %s has no IPv4 or IPv6 address", a->host);
}

/* An address as a host for the cluster: IPv4 as is, IPv6 in brackets. */
static void host_of(const struct sockaddr_storage *ss, socklen_t len, char out[DT_HOST_MAX]) {
    char text[NI_MAXHOST] = "?";
    getnameinfo((const struct sockaddr *)ss, len, text, sizeof text, NULL, 0, NI_NUMERICHOST);
    char *pct = strchr(text, '%'); /* a link-local zone is this host's name for it, not the peers' */
    if (pct) *pct = '\0';
    snprintf(out, DT_HOST_MAX, ss->ss_family == AF_INET6 ? "[%s]" : "%s", text);
}

/* Writes all of buf before deadline. */
static int send_all(int fd, const char *buf, size_t len, double deadline) {
    while (len) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        if (poll(&p, 1, ms_left(deadline)) <= 0) return -1;
        ssize_t w = send(fd, buf, len, MSG_NOSIGNAL);
        if (w < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (w <= 0) return -1;
        buf += w, len -= (size_t)w;
    }
    return 0;
}

/* ---- rank 0 ---- */

typedef struct {
    int fd;
    char line[LINE_MAX_BYTES];
    size_t len;
    int rank;                /* -1: not yet said hello */
    char host[DT_HOST_MAX];  /* where its connection comes from */
    int port, local;
    double since;            /* accepted at (dt_seconds): its hello is due by since + HELLO_MS */
} conn;

typedef struct {
    const dt_rendezvous *rv;
    conn *c;
    int n, cap;
    int *by_rank;            /* [size]: index into c, or -1 */
    int arrived;             /* ranks registered (rank 0 not counted) */
    int told;                /* ranks refused and told so at once */
    int failed;              /* err holds why; every rank that says hello is told */
    int unheard;             /* connections closed for no hello in time, or evicted when full */
    dt_error *err;
    dt_addr self;
} server;

/* Logs a connection closed without a hello: the first LOG_FIRST, then only counted (a flood must
 * not flood the log too); serve() logs the count at the end. */
static void log_unheard(server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_unheard(server *s, const char *fmt, ...) {
    if (++s->unheard > LOG_FIRST || !s->rv->log) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(s->rv->log, "rendezvous: ");
    vfprintf(s->rv->log, fmt, ap);
    va_end(ap);
    fprintf(s->rv->log, "%s\n", s->unheard == LOG_FIRST ? " (further ones are counted, not logged)" : "");
    fflush(s->rv->log);
}

static void drop(server *s, int i) {
    close(s->c[i].fd);
    if (s->c[i].rank >= 0 && s->by_rank[s->c[i].rank] == i) s->by_rank[s->c[i].rank] = -1, s->arrived--;
    s->c[i] = s->c[--s->n];
    if (s->c[i].rank >= 0 && i < s->n) s->by_rank[s->c[i].rank] = i;
}

/* Refuses the job: records why (the first reason only) in err. */
static void refuse(server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void refuse(server *s, const char *fmt, ...) {
    if (s->failed) return;
    s->failed = 1;
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    dt_errorf(s->err, DT_EINVAL, "%s", msg);
}

/* Answers connection i with the error (and drops it). */
static void tell_error(server *s, int i, double deadline) {
    char line[1100];
    int w = snprintf(line, sizeof line, "error %s\n", s->err ? s->err->msg : "the rendezvous failed");
    send_all(s->c[i].fd, line, w > 0 && (size_t)w < sizeof line ? (size_t)w : sizeof line - 1,
             dt_seconds() + SEND_MS / 1000.0 < deadline ? dt_seconds() + SEND_MS / 1000.0 : deadline);
}

/* A hello from connection i: checks it against rank 0's view and the ranks so far. 0: garbage
 * (drop it unanswered); 1: a rank (registered, or told the job is refused). */
static int hello(server *s, int i) {
    const dt_rendezvous *rv = s->rv;
    conn *c = &s->c[i];
    long rank, size, port, local;
    char tail;
    c->line[c->len] = '\0';
    if (sscanf(c->line, HELLO " %ld %ld %ld %ld%c", &rank, &size, &port, &local, &tail) != 5 || tail != '\n' ||
        port < 1 || port > 65535 || local < 0 || local > 65535)
        return 0;
    if (size != rv->size) {
        refuse(s, "%s: %ld at rank %ld (from %s), but %d at rank 0", rv->size_var, size, rank, c->host, rv->size);
        return 1;
    }
    if (rank < 0 || rank >= rv->size) return 0; /* no rank of this world speaks so */
    if (rank == 0 || s->by_rank[rank] >= 0) {
        refuse(s, "%s: %ld claimed by two tasks (at %s and %s)", rv->rank_var, rank,
               rank == 0 ? s->self.host : s->c[s->by_rank[rank]].host, c->host);
        return 1;
    }
    c->port = (int)port;
    c->local = (int)local;
    if (!strcmp(c->host, s->self.host) && port == s->self.port) {
        refuse(s, "%s: %ld at ranks 0 and %ld alike, both at %s:%ld", rv->local_var, local, rank, c->host, port);
        return 1;
    }
    for (int r = 1; r < rv->size; r++) {
        int j = s->by_rank[r];
        if (j >= 0 && !strcmp(s->c[j].host, c->host) && s->c[j].port == port) {
            refuse(s, "%s: %ld at ranks %ld and %ld alike, both at %s:%ld", rv->local_var, local,
                   r < rank ? (long)r : rank, r < rank ? rank : (long)r, c->host, port);
            return 1;
        }
    }
    c->rank = (int)rank;
    s->by_rank[rank] = i;
    s->arrived++;
    return 1;
}

/* Reads what connection i sent; drops it on garbage or end of file. */
static void on_readable(server *s, int i, double deadline) {
    conn *c = &s->c[i];
    char scratch[64]; /* nothing more is expected from a rank before the answer */
    ssize_t r = c->rank >= 0 ? recv(c->fd, scratch, sizeof scratch, 0)
                             : recv(c->fd, c->line + c->len, sizeof c->line - 1 - c->len, 0);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (r <= 0) {
        if (c->rank >= 0 && !s->failed)
            refuse(s, "%s: rank %d (at %s) left before every rank arrived", s->rv->rank_var, c->rank, c->host);
        drop(s, i);
        return;
    }
    if (c->rank >= 0) return;
    c->len += (size_t)r;
    if (!memchr(c->line, '\n', c->len)) {
        if (c->len == sizeof c->line - 1) drop(s, i); /* a line this long is nobody's hello */
        return;
    }
    if (!hello(s, i)) {
        drop(s, i);
    } else if (s->failed && c->rank < 0) { /* a rank refused at its hello hears why at once */
        tell_error(s, i, deadline);
        s->told++;
        drop(s, i);
    }
}

/* Closes every connection whose hello is overdue: HELLO_MS from its accept, however it trickles in
 * (a slow loris sending a byte at a time is no later than one that sends nothing). Returns the ms
 * until the next is due, or the deadline, for poll. */
static int expire(server *s, double deadline) {
    double now = dt_seconds(), next = deadline;
    for (int i = s->n - 1; i >= 0; i--) { /* backwards: drop moves the last connection into i */
        if (s->c[i].rank >= 0) continue;
        double due = s->c[i].since + HELLO_MS / 1000.0;
        if (due <= now) {
            log_unheard(s, "closed the connection from %s: no hello within %.0f s of connecting (%zu bytes)",
                        s->c[i].host, HELLO_MS / 1000.0, s->c[i].len);
            drop(s, i);
        } else if (due < next) {
            next = due;
        }
    }
    double ms = (next - now) * 1000.0 + 1; /* + 1: poll's timeout rounds down */
    return ms <= 0 ? 0 : ms > 1e9 ? 1000000000 : (int)ms;
}

/* The table is full: closes the connection that has waited longest without a complete hello. A
 * rank sends its hello right after connecting, so the newest connections are the likeliest ranks;
 * refusing newcomers instead would let idle connections opened first lock every rank out. There is
 * always one to close: the table holds size - 1 + EXTRA_CONNS, registered ranks at most size - 1. */
static void evict(server *s) {
    int oldest = -1;
    for (int i = 0; i < s->n; i++)
        if (s->c[i].rank < 0 && (oldest < 0 || s->c[i].since < s->c[oldest].since)) oldest = i;
    if (oldest < 0) return;
    log_unheard(s, "%d connections open, the most rank 0 holds: closed the one from %s waiting longest without a "
                "hello (%.1f s)", s->n, s->c[oldest].host, dt_seconds() - s->c[oldest].since);
    drop(s, oldest);
}

/* The answer every rank gets: "ok SIZE" then each rank's "HOST PORT", rank 0 first. */
static int answer(server *s, dt_addr *addrs, double deadline) {
    const dt_rendezvous *rv = s->rv;
    size_t cap = (size_t)rv->size * (DT_HOST_MAX + 8) + 32, used = 0;
    char *text = dt_malloc(cap, "the rendezvous answer", s->err);
    if (!text) return DT_ENOMEM;
    addrs[0] = s->self;
    for (int r = 1; r < rv->size; r++) {
        const conn *c = &s->c[s->by_rank[r]];
        snprintf(addrs[r].host, sizeof addrs[r].host, "%s", c->host);
        addrs[r].port = c->port;
    }
    used += (size_t)snprintf(text, cap, "ok %d\n", rv->size);
    for (int r = 0; r < rv->size; r++)
        used += (size_t)snprintf(text + used, cap - used, "%s %d\n", addrs[r].host, addrs[r].port);
    for (int r = 1; r < rv->size; r++) {
        double by = dt_seconds() + SEND_MS / 1000.0;
        if (send_all(s->c[s->by_rank[r]].fd, text, used, by < deadline ? by : deadline)) {
            free(text);
            return dt_errorf(s->err, DT_ENET, "--rendezvous %s: rank %d (at %s) did not take the list of ranks",
                             rv->at, r, s->c[s->by_rank[r]].host);
        }
    }
    free(text);
    return 0;
}

/* The listening socket at rank 0's address: its descriptor, or a negative DT_E* code. */
static int listen_at(const dt_rendezvous *rv, const struct sockaddr_storage *ss, socklen_t len, const char *host,
                     dt_error *err) {
    int one = 1, lfd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd < 0) return dt_errorf(err, DT_ENET, "--rendezvous %s: socket: %s", rv->at, strerror(errno));
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lfd, (const struct sockaddr *)ss, len) || listen(lfd, 256)) {
        int e = errno;
        close(lfd);
        if (e == EADDRNOTAVAIL)
            return dt_errorf(err, DT_ENET, "--rendezvous %s: %s is not an address of this host, where rank 0 (%s=0) "
                             "runs: give rank 0's host", rv->at, host, rv->rank_var);
        return dt_errorf(err, DT_ENET, "--rendezvous %s: cannot listen there: %s", rv->at, strerror(e));
    }
    return lfd;
}

/* Takes up to ACCEPT_BURST new connections (the one waiting longest without a hello makes room
 * when the table is full). */
static void accept_burst(server *s, int lfd, double deadline) {
    for (int k = 0; k < ACCEPT_BURST && s->arrived + s->told < s->rv->size - 1; k++) {
        struct sockaddr_storage peer;
        socklen_t plen = sizeof peer;
        int fd = accept4(lfd, (struct sockaddr *)&peer, &plen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return; /* none left (or none to be had now: the next round tries again) */
        if (s->n == s->cap) evict(s);
        if (s->n == s->cap) { /* not reached (evict always finds one), but the table stays bounded */
            close(fd);
            continue;
        }
        s->c[s->n] = (conn){.fd = fd, .rank = -1, .since = dt_seconds()};
        host_of(&peer, plen, s->c[s->n].host);
        s->n++;
        /* A rank's hello is usually in already: read it now, so the rank is registered (and never
         * evicted) before the next accept could make room at its expense. */
        on_readable(s, s->n - 1, deadline);
    }
}

/* The end of the wait: the answer to every rank, or (a refusal, or ranks missing at the deadline)
 * why not, told to every rank that came. */
static int conclude(server *s, dt_addr *addrs, double deadline) {
    const dt_rendezvous *rv = s->rv;
    int rc;
    if (s->failed) {
        rc = DT_EINVAL;
    } else if (s->arrived < rv->size - 1) {
        char missing[256] = "";
        size_t used = 0;
        for (int r = 1, shown = 0; r < rv->size && used + 16 < sizeof missing; r++)
            if (s->by_rank[r] < 0)
                used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d", shown++ ? "," : "", r);
        rc = dt_errorf(s->err, DT_ETIMEOUT, "%s: %d, but only %d rank%s arrived at --rendezvous %s within %.0f s "
                       "(missing: %s)", rv->size_var, rv->size, s->arrived + 1, s->arrived ? "s" : "", rv->at,
                       rv->deadline_ms / 1000.0, missing);
        s->failed = 1;
    } else {
        rc = answer(s, addrs, deadline + SEND_MS / 1000.0);
    }
    if (s->failed) /* every rank that came is told why */
        for (int i = 0; i < s->n; i++)
            if (s->c[i].rank >= 0) tell_error(s, i, dt_seconds() + SEND_MS / 1000.0);
    return rc;
}

static int serve(const dt_rendezvous *rv, const dt_addr *at, dt_addr *addrs, double deadline, dt_error *err) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    int rc = resolve(at, &ss, &len, err);
    if (rc) return rc;
    server s = {.rv = rv, .err = err, .cap = rv->size - 1 + EXTRA_CONNS};
    host_of(&ss, len, s.self.host);
    s.self.port = rv->port;
    int lfd = listen_at(rv, &ss, len, s.self.host, err);
    if (lfd < 0) return lfd;
    s.c = dt_calloc((size_t)s.cap, sizeof *s.c, "the rendezvous connections", err);
    s.by_rank = dt_calloc((size_t)rv->size, sizeof *s.by_rank, "the rendezvous ranks", err);
    struct pollfd *p = dt_calloc((size_t)s.cap + 1, sizeof *p, "the rendezvous poll set", err);
    if (!s.c || !s.by_rank || !p) {
        rc = DT_ENOMEM;
        goto out;
    }
    for (int r = 0; r < rv->size; r++) s.by_rank[r] = -1;
    /* Until every other rank has arrived (or, refused, has been told so) or the deadline. */
    while (s.arrived + s.told < rv->size - 1 && ms_left(deadline) > 0) {
        int wait = expire(&s, deadline);
        p[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
        for (int i = 0; i < s.n; i++) p[i + 1] = (struct pollfd){.fd = s.c[i].fd, .events = POLLIN};
        int n = s.n, ready = poll(p, (nfds_t)n + 1, wait);
        if (ready < 0 && errno != EINTR) {
            rc = dt_errorf(err, DT_ENET, "--rendezvous %s: poll: %s", rv->at, strerror(errno));
            goto out;
        }
        if (ready <= 0) continue;
        for (int i = n - 1; i >= 0; i--) /* backwards: drop moves the last connection into i */
            if (p[i + 1].revents) on_readable(&s, i, deadline);
        if (p[0].revents & POLLIN) accept_burst(&s, lfd, deadline);
    }
    rc = conclude(&s, addrs, deadline);
out:
    if (s.unheard > LOG_FIRST && rv->log) {
        fprintf(rv->log, "rendezvous: %d connections closed without a hello in all\n", s.unheard);
        fflush(rv->log);
    }
    for (int i = 0; s.c && i < s.n; i++) close(s.c[i].fd);
    free(s.c);
    free(s.by_rank);
    free(p);
    close(lfd);
    return rc;
}

/* ---- every other rank ---- */

/* A connected socket to rank 0, retrying with back-off until the deadline (rank 0 may start
 * later); *last: why the latest try failed. */
static int reach(const dt_rendezvous *rv, const struct sockaddr_storage *ss, socklen_t len, double deadline,
                 int *backoff, int *out, char last[64], dt_error *err) {
    while (ms_left(deadline) > 0) {
        int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) return dt_errorf(err, DT_ENET, "--rendezvous %s: socket: %s", rv->at, strerror(errno));
        int rc = connect(fd, (const struct sockaddr *)ss, len);
        if (rc && errno == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int soerr = ETIMEDOUT;
            socklen_t sl = sizeof soerr;
            if (poll(&p, 1, ms_left(deadline)) > 0) getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
            rc = soerr ? -1 : 0;
            errno = soerr;
        }
        if (rc == 0) {
            *out = fd;
            return 0;
        }
        snprintf(last, 64, "%s", strerror(errno));
        close(fd);
        back_off(backoff, deadline);
    }
    return DT_ETIMEOUT;
}

/* Reads rank 0's whole answer (it closes after it) into a bounded buffer. *cut: rank 0 closed (or
 * reset) the connection before a byte of it, as it does to a connection it evicts: worth a retry
 * (*last says which). */
static int read_answer(const dt_rendezvous *rv, int fd, double deadline, char *buf, size_t cap, size_t *len,
                       int *cut, char last[64], dt_error *err) {
    *len = 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, ms_left(deadline)) <= 0)
            return dt_errorf(err, DT_ETIMEOUT, "--rendezvous %s: rank 0 gave no answer within %.0f s (%s=%d: are "
                             "all the ranks running?)", rv->at, rv->deadline_ms / 1000.0, rv->size_var, rv->size);
        ssize_t r = recv(fd, buf + *len, cap - 1 - *len, 0);
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (r <= 0 && *len == 0) {
            *cut = 1;
            snprintf(last, 64, "%s", r ? strerror(errno) : "closed unanswered");
        }
        if (r < 0) return dt_errorf(err, DT_ENET, "--rendezvous %s: %s", rv->at, strerror(errno));
        if (r == 0) break;
        *len += (size_t)r;
        if (*len == cap - 1) return dt_errorf(err, DT_EPROTO, "--rendezvous %s: answer too long", rv->at);
    }
    buf[*len] = '\0';
    return *cut ? dt_errorf(err, DT_ENET, "--rendezvous %s: rank 0 closed the connection before answering", rv->at)
                : 0;
}

int dt_rendezvous_parse_answer(const dt_rendezvous *rv, char *buf, size_t len, dt_addr *addrs, dt_error *err) {
    if (!strncmp(buf, "error ", 6)) { /* rank 0's reason, one line, printable only */
        char *msg = buf + 6, *nl = strchr(msg, '\n');
        if (nl) *nl = '\0';
        for (char *q = msg; *q; q++)
            if (*q < 32 || *q > 126) *q = '?';
        return dt_errorf(err, DT_EINVAL, "%.900s (rank 0's answer at --rendezvous)", msg);
    }
    int n;
    char tail;
    char *line = buf, *nl = strchr(line, '\n');
    if (!nl || sscanf(line, "ok %d%c", &n, &tail) != 2 || tail != '\n' || n != rv->size)
        return dt_errorf(err, DT_EPROTO, "--rendezvous %s: not a rendezvous answer from rank 0", rv->at);
    for (int r = 0; r < n; r++) {
        line = nl + 1;
        nl = strchr(line, '\n');
        char *space = nl ? memchr(line, ' ', (size_t)(nl - line)) : NULL;
        if (!space) return dt_errorf(err, DT_EPROTO, "--rendezvous %s: the answer ends at rank %d", rv->at, r);
        *space = ':';
        char field[64];
        snprintf(field, sizeof field, "--rendezvous answer, rank %d", r);
        int rc = dt_addr_parse(&addrs[r], line, (size_t)(nl - line), field, err);
        if (rc) return rc;
    }
    if (addrs[rv->rank].port != rv->port)
        return dt_errorf(err, DT_EPROTO, "--rendezvous %s: the answer gives rank %d another port", rv->at, rv->rank);
    (void)len;
    return 0;
}

static int join(const dt_rendezvous *rv, const dt_addr *at, dt_addr *addrs, double deadline, dt_error *err) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    int rc = resolve(at, &ss, &len, err);
    if (rc) return rc;
    char line[LINE_MAX_BYTES], last[64] = "no attempt";
    int w = snprintf(line, sizeof line, HELLO " %d %d %d %d\n", rv->rank, rv->size, rv->port, rv->local);
    size_t cap = (size_t)rv->size * (DT_HOST_MAX + 8) + 1200, n = 0;
    char *buf = dt_malloc(cap, "the rendezvous answer", err);
    if (!buf) return DT_ENOMEM;
    /* A connection rank 0 closes before answering (evicted from a table full of idle connections,
     * or no rendezvous yet at the port) is tried again, with back-off, until the deadline: only
     * an answer, or the deadline, is final. */
    int backoff = RETRY_MS, cuts = 0;
    for (;;) {
        int fd = -1, cut = 0;
        if ((rc = reach(rv, &ss, len, deadline, &backoff, &fd, last, err))) {
            if (rc != DT_ETIMEOUT) break;
            if (cuts)
                rc = dt_errorf(err, DT_ETIMEOUT, "--rendezvous %s: rank 0 (%s=0) closed this rank's connection "
                               "before answering, %d time%s within %.0f s (last: %s): is the port flooded, or not "
                               "rank 0's?", rv->at, rv->rank_var, cuts, cuts > 1 ? "s" : "",
                               rv->deadline_ms / 1000.0, last);
            else
                rc = dt_errorf(err, DT_ETIMEOUT, "--rendezvous %s: rank 0 (%s=0) did not answer within %.0f s (%s): "
                               "is it running there?", rv->at, rv->rank_var, rv->deadline_ms / 1000.0, last);
            break;
        }
        /* Rank 0 answers by its own deadline, which may end a little after this one (it may have
         * started later): wait that little longer for its reason. */
        if (send_all(fd, line, (size_t)w, deadline + 2.0)) {
            cut = errno == EPIPE || errno == ECONNRESET;
            snprintf(last, sizeof last, "%s", strerror(errno));
            rc = dt_errorf(err, DT_ENET, "--rendezvous %s: rank 0 did not take this rank's hello", rv->at);
        } else if (!(rc = read_answer(rv, fd, deadline + 2.0, buf, cap, &n, &cut, last, err))) {
            rc = dt_rendezvous_parse_answer(rv, buf, n, addrs, err);
        }
        close(fd);
        if (!cut) break;
        cuts++;
        back_off(&backoff, deadline);
    }
    free(buf);
    return rc;
}

int dt_rendezvous_gather(const dt_rendezvous *rv, dt_addr *addrs, dt_error *err) {
    dt_addr at;
    if (!rv->at || !*rv->at) return dt_errorf(err, DT_EINVAL, "--rendezvous: no address given");
    int rc = dt_addr_parse(&at, rv->at, strlen(rv->at), "--rendezvous", err);
    if (rc) return rc;
    if (rv->size < 2 || rv->size > 2 * DT_CLUSTER_MAX_TASKS || rv->rank < 0 || rv->rank >= rv->size)
        return dt_errorf(err, DT_EINVAL, "%s: rank %d of %d", rv->rank_var, rv->rank, rv->size);
    double deadline = dt_seconds() + (rv->deadline_ms > 0 ? rv->deadline_ms : 60000) / 1000.0;
    return rv->rank == 0 ? serve(rv, &at, addrs, deadline, err) : join(rv, &at, addrs, deadline, err);
}
