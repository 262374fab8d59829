#include "transport/peers.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <malloc.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "core/clock.h"
#include "core/error.h"

#define LOG_CUTS 10                 /* cuts logged one by one for each reason; later ones only counted */

/* Why a connection is cut (each reason's first LOG_CUTS are logged). */
enum { CUT_SILENT, CUT_PARTIAL, CUT_SLOW, CUT_BUDGET, CUT_LIMIT, CUT_QUIET, CUT_UNREAD, CUT_LOCAL, CUT_REASONS };
#define PARTIAL_SLACK (256u << 10)  /* bytes of ZMTP framing and heartbeats not in any message */
#define STRIKES 2                   /* checks in a row past the size bound before a cut */
#define REPLY_STALL_US (2 * INT64_C(1000000)) /* replies unread this long, with nothing read meanwhile: a stuck reader */
#define LOCAL_SENDING_US INT64_C(1000000)     /* ipc: bytes waiting in the socket and no whole message for this long */
#define LOCAL_BUSY_CHECKS 10                  /* ipc: ... or bytes seen waiting at this many checks since the latest one */
#define HEAP_EVERY_US INT64_C(20000)          /* the heap is asked at most this often (mallinfo2 walks every arena: ~0.1 ms) */
#define HEAP_GRACE_US INT64_C(100000)         /* after a cut for the heap: libzmq's I/O threads free what it held */
#define HEAP_CALM_US INT64_C(1000000)         /* ... and at most this often when no connection could be cut for it */
#define TRIM_EVERY_US INT64_C(200000)         /* freed pages are given back at most this often */

/* The bytes of large replies libzmq holds for all connections, shared by the table and each peer
 * (a reply may outlive both: it is freed by libzmq's I/O thread). */
typedef struct {
    atomic_int refs;
    atomic_llong bytes;
} reply_total;

static void reply_total_unref(reply_total *t) {
    if (t && atomic_fetch_sub(&t->refs, 1) == 1) free(t);
}

struct dt_peer {
    atomic_int refs;        /* the table's (while open) + each holder's */
    atomic_llong reply_bytes; /* large replies libzmq still holds for this peer */
    atomic_llong reply_moved_us; /* while it holds some: when the latest began from none or one was released */
    reply_total *total;     /* all peers' reply bytes (a reference) */
    int fd, open, cut, tcp, valid, strikes;
    int early;              /* met in a message before its ACCEPTED event was heard (dt_peers_of) */
    uint64_t serial;
    struct sockaddr_storage addr; /* getpeername at accept: tells a reused descriptor apart */
    socklen_t addr_len;
    char name[64];          /* address for the log */
    int64_t accepted_us, useful_us; /* accept time; latest valid message (or accept) */
    int64_t big_since_us;   /* when the unfinished message passed PARTIAL_SLACK (0: it has not) */
    uint64_t base;          /* kernel-received bytes, less unread, when the latest message arrived */
    uint64_t partial;       /* at the latest check: bytes of an unfinished message */
    uint64_t delivered;     /* whole messages since the latest check */
    int local_busy;         /* same-host: checks that saw bytes waiting in its socket since its latest message */
};

struct dt_peers {
    dt_peers_config cfg;
    void *mon;              /* PAIR connected to the router's monitor */
    void *router;           /* the socket watched (its monitor is stopped at close) */
    dt_peer **by_fd;
    int cap, n_open;
    uint64_t serial, cuts, cuts_by[CUT_REASONS];
    uint64_t budget;        /* everything peers make the ps hold, together (peers.h) */
    uint64_t held;          /* at the latest check: unfinished messages, replies, others */
    uint64_t unfinished_cost, other;
    uint64_t own;           /* the ps's own growing memory (dt_peers_set_own) */
    int64_t heap_base;      /* the least heap in use seen beyond what is counted (-1: not yet) */
    int64_t heap_next_us;   /* when the heap is asked next (a cut pushes it past HEAP_GRACE_US) */
    int64_t heap_calm_next_us; /* ... if nothing suspect (check_heap) */
    reply_total *total;
    int warned_limit;
    int64_t trim_next_us;   /* freed pages are given back at most this often (check_heap) */
};

static void peers_log(dt_peers *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void peers_log(dt_peers *p, const char *fmt, ...) {
    if (!p->cfg.log) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(p->cfg.log, "ps %d: ", p->cfg.ps_index);
    vfprintf(p->cfg.log, fmt, ap);
    fputc('\n', p->cfg.log);
    fflush(p->cfg.log);
    va_end(ap);
}

void dt_peer_ref(dt_peer *peer) {
    if (peer) atomic_fetch_add(&peer->refs, 1);
}

void dt_peer_unref(dt_peer *peer) {
    if (!peer || atomic_fetch_sub(&peer->refs, 1) != 1) return;
    reply_total_unref(peer->total);
    free(peer);
}

/* A reply of 0 bytes holds nothing: no accounting and no reference (its release gives none back). */
int dt_peer_reply_begin(dt_peers *p, dt_peer *peer, uint64_t bytes, uint64_t max) {
    if (!peer || !bytes) return 1;
    uint64_t held = (uint64_t)atomic_load(&peer->reply_bytes);
    if (held && held + bytes > max) return 0; /* one reply always goes, however large */
    if (p && dt_peers_over_budget(p, bytes)) return -1;
    if (!held) atomic_store(&peer->reply_moved_us, dt_clock_us());
    atomic_fetch_add(&peer->reply_bytes, (long long)bytes);
    if (peer->total) atomic_fetch_add(&peer->total->bytes, (long long)bytes);
    dt_peer_ref(peer);
    return 1;
}

void dt_peer_reply_done(dt_peer *peer, uint64_t bytes) {
    if (!peer || !bytes) return;
    atomic_fetch_sub(&peer->reply_bytes, (long long)bytes);
    if (peer->total) atomic_fetch_sub(&peer->total->bytes, (long long)bytes);
    atomic_store(&peer->reply_moved_us, dt_clock_us()); /* the peer reads: progress */
    dt_peer_unref(peer);
}

int dt_peer_gone(const dt_peer *peer) { return peer && (peer->cut || !peer->open); }

uint64_t dt_peer_serial(const dt_peer *peer) { return peer ? peer->serial : 0; }

uint64_t dt_peers_held(const dt_peers *p) {
    return p->unfinished_cost + (uint64_t)atomic_load(&p->total->bytes) + p->other;
}

void dt_peers_held_phrase(const dt_peers *p, char *buf, size_t n) {
    snprintf(buf, n, "%llu bytes in unfinished messages, %llu in replies, %llu in deferred requests",
             (unsigned long long)p->unfinished_cost, (unsigned long long)atomic_load(&p->total->bytes),
             (unsigned long long)p->other);
}

int dt_peers_over_budget(const dt_peers *p, uint64_t more) { return dt_peers_held(p) + more > p->budget; }

void dt_peers_set_other(dt_peers *p, uint64_t bytes) { p->other = bytes; }
void dt_peers_set_own(dt_peers *p, uint64_t bytes) { p->own = bytes; }

int dt_peers_open(dt_peers **out, void *ctx, void *router, const dt_peers_config *cfg, dt_error *err) {
    *out = NULL;
    dt_peers *p = dt_calloc(1, sizeof *p, "ps connection table", err);
    if (!p) return DT_ENOMEM;
    p->cfg = *cfg;
    p->budget = cfg->budget_bytes;
    p->heap_base = -1;
    if (!(p->total = calloc(1, sizeof *p->total))) {
        free(p);
        return dt_errorf(err, DT_ENOMEM, "out of memory for the ps connection table");
    }
    atomic_init(&p->total->refs, 1);
    atomic_init(&p->total->bytes, 0);
    /* Connections cost a descriptor each: take the hard limit, so the bound below is ours. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rlim_t want = rl.rlim_max > 1048576 ? 1048576 : rl.rlim_max;
        if (want > rl.rlim_cur) {
            rl.rlim_cur = want;
            setrlimit(RLIMIT_NOFILE, &rl); /* best effort: the bound below follows what we got */
        }
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        /* Keep a quarter of the descriptors (at least 32) for files and libzmq's own. */
        long usable = (long)rl.rlim_cur - ((long)rl.rlim_cur / 4 > 32 ? (long)rl.rlim_cur / 4 : 32);
        if (usable < 8) usable = 8;
        if (p->cfg.max_connections <= 0 || p->cfg.max_connections > usable) p->cfg.max_connections = (int)usable;
    }
    if (p->cfg.max_connections <= 0) p->cfg.max_connections = 1024;
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://dtrain-ps-peers-%p", (void *)p);
    /* The socket's one monitor (a second would replace it): failed handshakes too, for the ZAP
     * handler's log (cfg->handshake_failed). */
    int events = ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED |
                 (cfg->handshake_failed ? ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL : 0);
    if (zmq_socket_monitor(router, ep, events) != 0) {
        int rc = dt_errorf(err, DT_ENET, "zmq_socket_monitor: %s", zmq_strerror(errno));
        reply_total_unref(p->total);
        free(p);
        return rc;
    }
    p->router = router;
    int zero = 0, linger = 0;
    p->mon = zmq_socket(ctx, ZMQ_PAIR);
    /* RCVHWM 0: no event is dropped however many connections arrive at once. */
    if (!p->mon || zmq_setsockopt(p->mon, ZMQ_RCVHWM, &zero, sizeof zero) != 0 ||
        zmq_setsockopt(p->mon, ZMQ_LINGER, &linger, sizeof linger) != 0 || zmq_connect(p->mon, ep) != 0) {
        int rc = dt_errorf(err, DT_ENET, "connection monitor: %s", zmq_strerror(errno));
        dt_peers_close(p);
        return rc;
    }
    *out = p;
    return DT_OK;
}

static void drop(dt_peers *p, int fd, void (*gone)(void *, dt_peer *), void *user) {
    if (fd < 0 || fd >= p->cap || !p->by_fd[fd]) return;
    dt_peer *peer = p->by_fd[fd];
    p->by_fd[fd] = NULL;
    peer->open = 0;
    p->n_open--;
    if (gone) gone(user, peer);
    dt_peer_unref(peer);
}

void dt_peers_close(dt_peers *p) {
    if (!p) return;
    for (int fd = 0; fd < p->cap; fd++) drop(p, fd, NULL, NULL);
    free(p->by_fd);
    /* Stopped before its reader closes: libzmq's I/O threads raise events (a disconnect while the
     * context terminates) and would queue them for a reader that is gone, where nothing frees them
     * (seen as a 78-byte leak under ASan: the event's ipc address). */
    if (p->router) zmq_socket_monitor(p->router, NULL, 0);
    if (p->mon) zmq_close(p->mon);
    reply_total_unref(p->total);
    free(p);
}

void *dt_peers_socket(dt_peers *p) { return p->mon; }

static dt_peer *add(dt_peers *p, int fd, void (*gone)(void *, dt_peer *), void *user) {
    if (fd < 0) return NULL;
    if (fd >= p->cap) {
        int cap = p->cap ? p->cap : 256;
        while (cap <= fd) cap *= 2;
        dt_peer **t = realloc(p->by_fd, (size_t)cap * sizeof *t);
        if (!t) return NULL; /* not watched: the socket limits still apply */
        memset(t + p->cap, 0, (size_t)(cap - p->cap) * sizeof *t);
        p->by_fd = t, p->cap = cap;
    }
    drop(p, fd, gone, user); /* a close we did not hear of: that descriptor was reused */
    dt_peer *peer = calloc(1, sizeof *peer);
    if (!peer) return NULL;
    atomic_init(&peer->refs, 1);
    atomic_init(&peer->reply_bytes, 0);
    atomic_init(&peer->reply_moved_us, 0);
    peer->total = p->total;
    atomic_fetch_add(&p->total->refs, 1);
    peer->fd = fd;
    peer->open = 1;
    peer->serial = ++p->serial;
    peer->accepted_us = peer->useful_us = dt_clock_us();
    peer->addr_len = sizeof peer->addr;
    if (getpeername(fd, (struct sockaddr *)&peer->addr, &peer->addr_len) != 0) peer->addr_len = 0;
    snprintf(peer->name, sizeof peer->name, "a local client");
    if (peer->addr.ss_family == AF_INET || peer->addr.ss_family == AF_INET6) {
        char host[INET6_ADDRSTRLEN] = "?";
        int port = 0;
        if (peer->addr.ss_family == AF_INET) {
            struct sockaddr_in *a = (struct sockaddr_in *)&peer->addr;
            inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
            port = ntohs(a->sin_port);
        } else {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&peer->addr;
            inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
            port = ntohs(a->sin6_port);
        }
        snprintf(peer->name, sizeof peer->name, "%s:%d", host, port);
        struct tcp_info ti;
        socklen_t len = sizeof ti;
        peer->tcp = getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 &&
                    len >= offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received;
    }
    p->by_fd[fd] = peer;
    p->n_open++;
    return peer;
}

/* Bytes libzmq has read from the connection: received by the kernel less what is still unread.
 * above: the caller only needs to know more than this; the unread count (a second system call) is
 * asked only when the received bytes alone pass it. */
static int tcp_info_of(const dt_peer *peer, struct tcp_info *ti) {
    socklen_t len = sizeof *ti;
    return getsockopt(peer->fd, IPPROTO_TCP, TCP_INFO, ti, &len);
}

static int libzmq_read(const dt_peer *peer, const struct tcp_info *ti, uint64_t above, uint64_t *out) {
    int unread = 0;
    if (ti->tcpi_bytes_received > above && ioctl(peer->fd, SIOCINQ, &unread) != 0) return -1;
    *out = ti->tcpi_bytes_received - (uint64_t)(unread > 0 ? unread : 0);
    return 0;
}

/* Whether peer's descriptor is still its connection (not one that reused the number): the same
 * remote address as at accept. */
static int same_connection(const dt_peer *peer) {
    struct sockaddr_storage now;
    socklen_t len = sizeof now;
    return getpeername(peer->fd, (struct sockaddr *)&now, &len) == 0 && len == peer->addr_len &&
           memcmp(&now, &peer->addr, len) == 0;
}

/* A connection accepted: new, unless its first message was read before this event (dt_peers_of
 * met it then): the same connection, kept (dropping it would tell the ps it was gone, and the
 * request it was reading, a FETCH that hears the events, would go unanswered). A peer met early
 * on a descriptor since reused by another connection is dropped as before. */
static void accepted(dt_peers *p, int fd, void (*gone)(void *, dt_peer *), void *user) {
    dt_peer *met = fd >= 0 && fd < p->cap ? p->by_fd[fd] : NULL;
    if (met && met->early && same_connection(met)) {
        met->early = 0;
        return;
    }
    add(p, fd, gone, user);
}

void dt_peers_events(dt_peers *p, void (*gone)(void *, dt_peer *), void *user) {
    for (;;) {
        zmq_msg_t ev, addr;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, p->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return;
        }
        int more = zmq_msg_more(&ev);
        uint16_t event = 0;
        int32_t value = -1;
        if (zmq_msg_size(&ev) >= 6) {
            const uint8_t *d = zmq_msg_data(&ev);
            memcpy(&event, d, 2);
            memcpy(&value, d + 2, 4);
        }
        zmq_msg_close(&ev);
        char where[64] = "";
        while (more) { /* the endpoint frame: only for a failed handshake's log */
            zmq_msg_init(&addr);
            more = zmq_msg_recv(&addr, p->mon, ZMQ_DONTWAIT) >= 0 && zmq_msg_more(&addr);
            size_t n = zmq_msg_size(&addr) < sizeof where - 1 ? zmq_msg_size(&addr) : sizeof where - 1;
            memcpy(where, zmq_msg_data(&addr), n);
            where[n] = '\0';
            zmq_msg_close(&addr);
        }
        if ((event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL || event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) &&
            p->cfg.handshake_failed)
            p->cfg.handshake_failed(p->cfg.hook_user, where);
        if (event == ZMQ_EVENT_ACCEPTED) accepted(p, value, gone, user);
        else if (event == ZMQ_EVENT_DISCONNECTED) drop(p, value, gone, user);
    }
}

dt_peer *dt_peers_of(dt_peers *p, int fd) {
    if (fd < 0) return NULL;
    if (fd < p->cap && p->by_fd[fd]) return p->by_fd[fd];
    dt_peer *peer = add(p, fd, NULL, NULL); /* its ACCEPTED event is still on the way */
    if (peer) peer->early = 1;
    return peer;
}

void dt_peers_delivered(dt_peers *p, dt_peer *peer, int valid) {
    (void)p;
    if (!peer) return;
    peer->delivered++;
    if (valid) {
        peer->valid = 1;
        peer->useful_us = dt_clock_us();
    }
    uint64_t got;
    struct tcp_info ti;
    if (peer->tcp && tcp_info_of(peer, &ti) == 0 && libzmq_read(peer, &ti, 0, &got) == 0) peer->base = got;
    peer->big_since_us = 0;
    peer->strikes = 0;
    peer->local_busy = 0;
}

/* Cuts a connection: shutdown(2) makes libzmq see it end and free what it holds. The descriptor
 * is libzmq's; it is checked to still be this connection (not one that reused the number). */
static void cut(dt_peers *p, dt_peer *peer, int reason, const char *why) {
    if (peer->cut || !same_connection(peer)) return;
    if (shutdown(peer->fd, SHUT_RDWR) != 0) return;
    peer->cut = 1;
    p->cuts++;
    uint64_t k = ++p->cuts_by[reason];
    if (k <= LOG_CUTS)
        peers_log(p, "cut off the connection from %s: %s%s", peer->name, why,
                  k == LOG_CUTS ? " (further ones for this reason are counted, not logged)" : "");
}

/* The open connection, not yet cut, that best(a, b) prefers; NULL if none. */
static dt_peer *pick(dt_peers *p, int (*better)(const dt_peer *a, const dt_peer *b, int64_t now), int64_t now) {
    dt_peer *best = NULL;
    for (int fd = 0; fd < p->cap; fd++) {
        dt_peer *peer = p->by_fd[fd];
        if (peer && !peer->cut && (!best || better(peer, best, now))) best = peer;
    }
    return best;
}

/* For the descriptor limit: the connection that sent a valid message longest ago (one that never
 * did before one that did). */
static int less_useful(const dt_peer *a, const dt_peer *b, int64_t now) {
    (void)now;
    if (a->valid != b->valid) return !a->valid;
    return a->useful_us < b->useful_us;
}

/* For the memory budget: the largest unfinished message that has been large for over a second
 * (a healthy transfer finishes; one that does not is the one holding memory). */
static int holds_more(const dt_peer *a, const dt_peer *b, int64_t now) {
    int a_old = a->big_since_us && now - a->big_since_us > 1000000;
    int b_old = b->big_since_us && now - b->big_since_us > 1000000;
    if (a_old != b_old) return a_old;
    return a->partial > b->partial;
}

/* For the budget: the connection whose large replies have waited longest unread, past
 * REPLY_STALL_US (a worker reads its replies as they come; one that does not holds memory). */
static int stuck_longer(const dt_peer *a, const dt_peer *b, int64_t now) {
    (void)now;
    int64_t ma = atomic_load(&a->reply_bytes) > 0 ? atomic_load(&a->reply_moved_us) : INT64_MAX;
    int64_t mb = atomic_load(&b->reply_bytes) > 0 ? atomic_load(&b->reply_moved_us) : INT64_MAX;
    return ma < mb;
}

/* Whether a same-host connection has bytes waiting in the kernel: its peer is sending now. */
static int local_sending(const dt_peer *a) {
    int unread = 0;
    return !a->tcp && ioctl(a->fd, SIOCINQ, &unread) == 0 && unread > 0;
}

/* For the budget, same-host connections (no byte counters): one still sending a message that it
 * began over LOCAL_SENDING_US ago, or that kept bytes waiting at LOCAL_BUSY_CHECKS checks (a real
 * message takes milliseconds over a Unix socket, a check or two; a worker waiting at the barrier
 * sends nothing, so the time alone, since its latest message, says little: at 750 MB/s, a second
 * let an endless message hold 750 MiB). The busiest first, then the longest. */
static int local_stuck(const dt_peer *a, int64_t now) {
    return !a->tcp && (now - a->useful_us > LOCAL_SENDING_US || a->local_busy >= LOCAL_BUSY_CHECKS) &&
           local_sending(a);
}

static int local_quieter(const dt_peer *a, const dt_peer *b, int64_t now) {
    int sa = local_stuck(a, now), sb = local_stuck(b, now);
    if (sa != sb) return sa;
    if (a->local_busy != b->local_busy) return a->local_busy > b->local_busy;
    return a->useful_us < b->useful_us;
}

/* Bytes the process's allocator has handed out and not taken back (not its resident size, which
 * keeps freed pages). Only for what no counter shows: same-host connections' unfinished messages. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DT_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define DT_ASAN 1
#endif
#ifdef DT_ASAN
/* Declared here rather than from <sanitizer/allocator_interface.h>, which clang ships and gcc 12
 * does not; both compilers' ASan runtimes export it. */
size_t __sanitizer_get_current_allocated_bytes(void);
static int64_t heap_in_use(int64_t *kept) {
    *kept = 0; /* the sanitizer's allocator returns and quarantines on its own */
    return (int64_t)__sanitizer_get_current_allocated_bytes();
}
#else
/* ... and *kept: bytes freed but still held by the allocator (resident, most of them). */
static int64_t heap_in_use(int64_t *kept) {
    struct mallinfo2 mi = mallinfo2();
    *kept = (int64_t)mi.fordblks;
    return (int64_t)(mi.uordblks + mi.hblkhd);
}
#endif

/* Freed pages back to the kernel once the allocator keeps more than the budget of them. libzmq's
 * I/O threads free a cut connection's frames into their own malloc arenas, whose pages glibc keeps
 * for later blocks of the same thread, while the next flood lands on another thread and takes
 * fresh pages: a same-host endless message cut at 150 MiB held left the ps's resident size 574 MiB
 * up, and after all the attacks of tests/test_hostile_round2_slow.sh it stayed at 539 MiB (65 MiB
 * with this; it began at 54).
 * Not more often than TRIM_EVERY_US (malloc_trim walks every arena; pages given back are faulted
 * in again when reused). */
static void give_back(dt_peers *p, int64_t kept, int64_t now) {
    if (kept <= (int64_t)p->budget || now < p->trim_next_us) return;
    p->trim_next_us = now + TRIM_EVERY_US;
#ifdef __GLIBC__
    (void)malloc_trim(0);
#endif
}

/* For the budget, what no counter shows: the connection that sent the most whole messages since
 * the latest check (requests queued in libzmq faster than the ps answers them). */
static int sent_more(const dt_peer *a, const dt_peer *b, int64_t now) {
    (void)now;
    return a->delivered > b->delivered;
}

/* For the heap: the largest unfinished message over a TCP connection. */
static int larger_partial(const dt_peer *a, const dt_peer *b, int64_t now) {
    (void)now;
    return a->partial > b->partial;
}

/* What the heap holds beyond every counted holding (and beyond the least seen so: the ps's own)
 * is what no counter shows: what unfinished messages really cost (libzmq keeps each frame as a
 * 64-byte msg_t, and a 0-byte frame is 2 bytes on the wire: 33 times their count; real messages
 * have 2 or 3 frames), same-host connections' unfinished messages (no byte counters), and
 * requests queued in libzmq (the router's receive queue has no limit: peers.h). Past the budget,
 * one connection is cut per check: a same-host one still sending a message begun over a second
 * ago, else the TCP one with the largest unfinished message (past 256 KiB), else, while the ps
 * cannot drain its socket, the one that sent the most messages since the latest check. */
static void check_heap(dt_peers *p, int drained, int64_t now, char *why, size_t n) {
    if (now < p->heap_next_us) return; /* delivered counts go on adding up: still "since the last check" */
    p->heap_next_us = now + HEAP_EVERY_US;
    int locals = 0;
    for (int fd = 0; fd < p->cap && !locals; fd++) locals = p->by_fd[fd] && !p->by_fd[fd]->cut && !p->by_fd[fd]->tcp;
    dt_peer *big = pick(p, larger_partial, now);
    /* Drained, no same-host connection, no unfinished message past the slack: nobody below could be
     * cut, and the heap would only refresh its baseline. That once a second, then: mallinfo2 holds
     * each arena's lock while it walks it and the I/O threads wait on it (asked every 20 ms, an
     * 8-worker sync cluster on 2 cores stepped 10-40% slower: BENCHMARKS.md). */
    if (drained && !locals && !(big && big->partial > PARTIAL_SLACK) && now < p->heap_calm_next_us) goto done;
    p->heap_calm_next_us = now + HEAP_CALM_US;
    int64_t kept;
    int64_t beyond = heap_in_use(&kept) - (int64_t)p->held - (int64_t)p->own;
    give_back(p, kept, now);
    if (p->heap_base < 0 || beyond < p->heap_base) p->heap_base = beyond;
    if (beyond - p->heap_base <= (int64_t)p->budget) goto done;
    dt_peer *q = locals ? pick(p, local_quieter, now) : NULL;
    if (q && !local_stuck(q, now)) q = NULL;
    if (!q && big && big->partial > PARTIAL_SLACK) {
        snprintf(why, n, "the ps holds %lld MiB more than it can account for, over its budget of %llu MiB, and this "
                 "connection's unfinished message is the largest (%llu bytes received: in frames of a few bytes each "
                 "they cost 33 times that)", (long long)((beyond - p->heap_base) >> 20),
                 (unsigned long long)(p->budget >> 20), (unsigned long long)big->partial);
        cut(p, big, CUT_BUDGET, why);
        p->heap_next_us = now + HEAP_GRACE_US;
        goto done;
    }
    if (!q) {
        /* A flood: only while the ps cannot drain its socket (a worker sends a step's chunks at once). */
        dt_peer *f = drained ? NULL : pick(p, sent_more, now);
        if (!f || f->delivered < 16) goto done;
        snprintf(why, n, "the ps holds %lld MiB more than it can account for, over its budget of %llu MiB, and this "
                 "connection sent the most messages (%llu) since the last check: requests queued faster than they "
                 "are answered", (long long)((beyond - p->heap_base) >> 20), (unsigned long long)(p->budget >> 20),
                 (unsigned long long)f->delivered);
        cut(p, f, CUT_LOCAL, why);
        p->heap_next_us = now + HEAP_GRACE_US;
        goto done;
    }
    snprintf(why, n, "the ps holds %lld MiB more than it can account for, over its budget of %llu MiB, and this "
             "same-host connection (whose unfinished messages cannot be counted) has been sending a message for %.1f s "
             "(bytes waiting at %d checks)", (long long)((beyond - p->heap_base) >> 20),
             (unsigned long long)(p->budget >> 20), (double)(now - q->useful_us) / 1e6, q->local_busy);
    cut(p, q, CUT_LOCAL, why);
    /* Its memory is freed by libzmq's I/O thread, later: no other cut for the heap until then. */
    p->heap_next_us = now + HEAP_GRACE_US;
done:
    for (int fd = 0; fd < p->cap; fd++)
        if (p->by_fd[fd]) p->by_fd[fd]->delivered = 0;
}

/* One connection's own bounds: its first message, silence, an unfinished message too large or
 * too slow. Cut (0), or alive (1) with its unfinished bytes added to *held. */
static int check_one(dt_peers *p, dt_peer *peer, int drained, int64_t now, uint64_t *held) {
    char why[320];
    if (!peer->valid && now - peer->accepted_us > p->cfg.first_message_us) {
        snprintf(why, sizeof why, "no valid message within %lld s of connecting",
                 (long long)(p->cfg.first_message_us / 1000000));
        cut(p, peer, CUT_SILENT, why);
        return 0;
    }
    if (!peer->tcp && local_sending(peer)) peer->local_busy++;
    struct tcp_info ti;
    int have_ti = peer->tcp && tcp_info_of(peer, &ti) == 0;
    /* Silence: not a byte (not even a ZMTP heartbeat: clients send one every few seconds) for
     * this long. Seen in the kernel's counters, not with libzmq's heartbeats on this socket: a
     * heartbeat timer firing on a connection whose peer reset while its queue was full aborts
     * libzmq 4.3 (stream_engine_base.cpp, !_io_error). */
    if (have_ti && p->cfg.silence_us > 0 && (int64_t)ti.tcpi_last_data_recv * 1000 > p->cfg.silence_us) {
        snprintf(why, sizeof why, "nothing received for %u s", ti.tcpi_last_data_recv / 1000);
        cut(p, peer, CUT_QUIET, why);
        return 0;
    }
    uint64_t got;
    peer->partial = 0;
    if (!have_ti || libzmq_read(peer, &ti, peer->base + PARTIAL_SLACK, &got) != 0 || got <= peer->base) {
        peer->big_since_us = 0;
        return 1;
    }
    uint64_t partial = peer->partial = got - peer->base;
    /* Two checks in a row: between draining the router and reading the counters, libzmq may
     * have finished one more message that the ps has not taken yet. Not drained, whole messages
     * may wait here too: at most the router's high-water mark of them (libzmq then stops reading
     * the connection), each at most the largest message. */
    uint64_t bound = p->cfg.max_partial_bytes * (drained ? 1 : (uint64_t)p->cfg.queued_messages + 1) + PARTIAL_SLACK;
    peer->strikes = partial > bound ? peer->strikes + 1 : 0;
    if (peer->strikes >= STRIKES) {
        snprintf(why, sizeof why, "%llu bytes of an unfinished message, more than the largest this ps accepts (%llu)",
                 (unsigned long long)partial, (unsigned long long)p->cfg.max_partial_bytes);
        cut(p, peer, CUT_PARTIAL, why);
        return 0;
    }
    if (partial <= PARTIAL_SLACK) {
        peer->big_since_us = 0;
    } else if (!peer->big_since_us) {
        peer->big_since_us = now;
    } else if (now - peer->big_since_us > p->cfg.message_us) {
        snprintf(why, sizeof why, "a message still unfinished after %lld s (%llu bytes so far)",
                 (long long)(p->cfg.message_us / 1000000), (unsigned long long)partial);
        cut(p, peer, CUT_SLOW, why);
        return 0;
    }
    *held += partial;
    return 1;
}

/* The budget: unfinished messages first (the largest that has been large for over a second: a
 * healthy transfer finishes; one that does not is the one holding memory). Returns the cuts. */
static int cut_unfinished(dt_peers *p, int64_t now) {
    char why[320];
    int cuts = 0;
    while (p->held > p->budget) {
        dt_peer *big = pick(p, holds_more, now);
        if (!big || !big->big_since_us || now - big->big_since_us <= 1000000) break;
        snprintf(why, sizeof why, "peers make the ps hold %llu bytes, more than the budget of %llu, and this one's "
                 "unfinished message held the most (%llu) for over a second", (unsigned long long)p->held,
                 (unsigned long long)p->budget, (unsigned long long)big->partial);
        uint64_t cost = big->partial;
        cut(p, big, CUT_BUDGET, why);
        if (!big->cut) big->big_since_us = 0; /* could not be cut (already gone): do not pick it again */
        else cuts++;
        p->unfinished_cost -= cost < p->unfinished_cost ? cost : p->unfinished_cost;
        p->held = dt_peers_held(p);
    }
    return cuts;
}

/* Then replies nobody reads: the connection whose replies waited longest without progress, once
 * they hold half the budget (past the budget new replies are refused, workers' too). */
static int cut_unread(dt_peers *p, int64_t now) {
    char why[320];
    int cuts = 0;
    for (int guard = 0; p->held > p->budget / 2 && guard < p->cap; guard++) {
        dt_peer *stuck = pick(p, stuck_longer, now);
        long long bytes = stuck ? atomic_load(&stuck->reply_bytes) : 0;
        if (!stuck || bytes <= 0 || now - atomic_load(&stuck->reply_moved_us) <= REPLY_STALL_US) break;
        snprintf(why, sizeof why, "peers make the ps hold %llu bytes, over half its budget of %llu, and this one left "
                 "%lld bytes of replies unread for %.1f s", (unsigned long long)p->held, (unsigned long long)p->budget,
                 bytes, (double)(now - atomic_load(&stuck->reply_moved_us)) / 1e6);
        cut(p, stuck, CUT_UNREAD, why);
        if (!stuck->cut) stuck->cut = 1; /* gone already: libzmq drops its replies */
        else cuts++;
        p->held -= (uint64_t)bytes < p->held ? (uint64_t)bytes : p->held;
    }
    return cuts;
}

/* At most max_connections: the least recently useful ones go (a warning near the limit). */
static void cut_beyond_limit(dt_peers *p, int live, int64_t now) {
    char why[320];
    if (live > p->cfg.max_connections * 4 / 5 && !p->warned_limit) {
        p->warned_limit = 1;
        peers_log(p, "%d connections open, near the limit of %d: the least recently useful ones will be cut", live,
                  p->cfg.max_connections);
    } else if (live < p->cfg.max_connections / 2) {
        p->warned_limit = 0;
    }
    for (; live > p->cfg.max_connections; live--) {
        dt_peer *old = pick(p, less_useful, now);
        if (!old) break;
        snprintf(why, sizeof why, "%d connections open (limit %d), and this one was the least recently useful", live,
                 p->cfg.max_connections);
        cut(p, old, CUT_LIMIT, why);
        if (!old->cut) old->cut = 1; /* gone already: its close event is on the way */
    }
}

void dt_peers_check(dt_peers *p, int drained) {
    int64_t now = dt_clock_us();
    char why[320];
    uint64_t held = 0;
    int live = 0;
    for (int fd = 0; fd < p->cap; fd++) {
        dt_peer *peer = p->by_fd[fd];
        if (peer && !peer->cut) live += check_one(p, peer, drained, now, &held);
    }
    /* Not drained, whole requests still queued in libzmq count too: they hold memory as well (the
     * router's receive queue has no limit), and a flood that keeps the ps from draining must not
     * keep the budget from being enforced. */
    p->unfinished_cost = held;
    p->held = dt_peers_held(p);
    live -= cut_unfinished(p, now);
    live -= cut_unread(p, now);
    check_heap(p, drained, now, why, sizeof why);
    cut_beyond_limit(p, live, now);
}

void dt_peers_set_budget(dt_peers *p, uint64_t bytes) { p->budget = bytes; }

int dt_peers_count(const dt_peers *p) { return p->n_open; }

/* Often enough that a peer sending at loopback speed gets little past the bound between two
 * checks (a check is one system call per connection, two for one past the slack): every 10 ms
 * up to 500 connections, then 20 us more per connection, at most every 100 ms. */
int64_t dt_peers_check_interval_us(const dt_peers *p) {
    int64_t us = (int64_t)p->n_open * 20;
    return us < 10000 ? 10000 : us > 100000 ? 100000 : us;
}

uint64_t dt_peers_cut_count(const dt_peers *p) { return p->cuts; }
