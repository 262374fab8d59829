/* Raw TCP loopback baseline for bench/run pushpull: the floor under any push + pull round trip.
 * usage: bench_tcp [SECONDS_PER_CASE] [SIZE...]   SIZE: fashion, catdog or a byte count
 * A server thread per connection plays the ps: receive S bytes (the push), then send S bytes back (the
 * pull). 1 and 2 clients (the workers) run that round trip concurrently for SECONDS; then one stream
 * sends as fast as it can for SECONDS to measure loopback throughput.
 * Prints JSON lines: per size and client count the median/p90 round trip in ms; the stream's GB/s.
 * Sockets: TCP_NODELAY, SO_SNDBUF/SO_RCVBUF of $BENCH_TCP_SOCKBUF bytes (default 4 MiB; 0 leaves the
 * kernel's autotuning), send/recv loops that handle partial transfers. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CLIENTS 2
#define MAX_ITERS 200000
#define STREAM_CHUNK (1 << 20)

enum { MODE_ECHO = 1, MODE_SINK = 2 };

static int g_sockbuf = 4 << 20;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int send_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k, n -= (size_t)k;
    }
    return 0;
}

/* 0 when n bytes arrived, 1 on a clean end of stream before any byte, -1 on error or a short read. */
static int recv_all(int fd, void *buf, size_t n) {
    char *p = buf;
    size_t got = 0;
    while (got < n) {
        ssize_t k = recv(fd, p + got, n - got, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k == 0) return got == 0 ? 1 : -1;
        if (k < 0) return -1;
        got += (size_t)k;
    }
    return 0;
}

static void tune(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (g_sockbuf > 0) {
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &g_sockbuf, sizeof g_sockbuf);
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &g_sockbuf, sizeof g_sockbuf);
    }
}

/* ---- server: one thread per connection ---- */

/* A connection starts with {mode, size}: echo round trips of size bytes, or sink until the client
 * shuts down its side, then answer with the byte count (so the client's clock covers delivery). */
static void *serve_conn(void *arg) {
    int fd = (int)(intptr_t)arg;
    uint64_t hdr[2];
    char *buf = NULL;
    if (recv_all(fd, hdr, sizeof hdr) != 0) goto out;
    size_t size = hdr[0] == MODE_SINK ? STREAM_CHUNK : (size_t)hdr[1];
    if (!(buf = malloc(size))) goto out;
    memset(buf, 1, size);
    if (hdr[0] == MODE_ECHO) {
        while (recv_all(fd, buf, size) == 0 && send_all(fd, buf, size) == 0) {}
    } else if (hdr[0] == MODE_SINK) {
        uint64_t total = 0;
        for (;;) {
            ssize_t k = recv(fd, buf, size, 0);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) break;
            total += (uint64_t)k;
        }
        send_all(fd, &total, sizeof total);
    }
out:
    free(buf);
    close(fd);
    return NULL;
}

static void *accept_loop(void *arg) {
    int lfd = (int)(intptr_t)arg;
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            return NULL;  // the listening socket was shut down: the benchmark is over
        }
        tune(fd);
        pthread_t t;
        if (pthread_create(&t, NULL, serve_conn, (void *)(intptr_t)fd) != 0) close(fd);
        else pthread_detach(t);
    }
}

static int connect_to(int port, uint64_t mode, uint64_t size) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    tune(fd);  // before connect, so the window scale covers the large buffers
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    uint64_t hdr[2] = {mode, size};
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 || send_all(fd, hdr, sizeof hdr) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* ---- clients ---- */

typedef struct {
    int port;
    size_t size;
    double seconds;
    pthread_barrier_t *start;
    double *times;  // seconds per round trip
    int n, failed;
} client;

static void *round_trips(void *arg) {
    client *c = arg;
    char *buf = malloc(c->size);
    int fd = buf ? connect_to(c->port, MODE_ECHO, c->size) : -1;
    c->failed = fd < 0;
    if (buf) memset(buf, 1, c->size);
    for (int i = 0; i < 10 && !c->failed; i++)  // warm up: slow start, page faults
        c->failed = send_all(fd, buf, c->size) || recv_all(fd, buf, c->size);
    pthread_barrier_wait(c->start);  // every client starts timing together, and stops together
    double end = now() + c->seconds;
    while (!c->failed && c->n < MAX_ITERS) {
        double t0 = now();
        if (t0 >= end) break;
        c->failed = send_all(fd, buf, c->size) || recv_all(fd, buf, c->size);
        c->times[c->n++] = now() - t0;
    }
    if (fd >= 0) close(fd);
    free(buf);
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int bench_round_trip(int port, const char *name, size_t size, int nclients, double seconds) {
    static double times[MAX_CLIENTS * MAX_ITERS];
    client cs[MAX_CLIENTS];
    pthread_t th[MAX_CLIENTS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)nclients);
    for (int i = 0; i < nclients; i++) {
        cs[i] = (client){.port = port, .size = size, .seconds = seconds, .start = &start,
                         .times = times + (size_t)i * MAX_ITERS};
        pthread_create(&th[i], NULL, round_trips, &cs[i]);
    }
    int n = 0, failed = 0;
    for (int i = 0; i < nclients; i++) {
        pthread_join(th[i], NULL);
        failed |= cs[i].failed;
    }
    pthread_barrier_destroy(&start);
    if (failed) {
        fprintf(stderr, "bench_tcp: round trip of %zu bytes failed: %s\n", size, strerror(errno));
        return -1;
    }
    for (int i = 0; i < nclients; i++)  // pool every client's round trips
        for (int j = 0; j < cs[i].n; j++) times[n++] = times[(size_t)i * MAX_ITERS + j];
    qsort(times, (size_t)n, sizeof *times, cmp_double);
    printf("{\"impl\": \"tcp\", \"op\": \"round_trip\", \"size\": \"%s\", \"bytes\": %zu, \"clients\": %d, "
           "\"iters\": %d, \"median_ms\": %.3f, \"p90_ms\": %.3f}\n",
           name, size, nclients, n, times[n / 2] * 1e3, times[(int)(n * 0.9)] * 1e3);
    fflush(stdout);
    return 0;
}

static int bench_stream(int port, double seconds) {
    char *buf = malloc(STREAM_CHUNK);
    int fd = buf ? connect_to(port, MODE_SINK, 0) : -1;
    uint64_t sent = 0, got = 0;
    double t0 = now(), t1 = t0;
    int rc = fd < 0 ? -1 : 0;
    if (buf) memset(buf, 1, STREAM_CHUNK);
    while (rc == 0 && (t1 = now()) - t0 < seconds) {
        rc = send_all(fd, buf, STREAM_CHUNK);
        sent += STREAM_CHUNK;
    }
    if (rc == 0) {
        shutdown(fd, SHUT_WR);
        rc = recv_all(fd, &got, sizeof got) != 0 || got != sent ? -1 : 0;
        t1 = now();
    }
    if (fd >= 0) close(fd);
    free(buf);
    if (rc) {
        fprintf(stderr, "bench_tcp: stream failed (%llu of %llu bytes)\n", (unsigned long long)got,
                (unsigned long long)sent);
        return -1;
    }
    printf("{\"impl\": \"tcp\", \"op\": \"stream\", \"bytes\": %llu, \"seconds\": %.3f, "
           "\"gbytes_per_s\": %.3f}\n",
           (unsigned long long)sent, t1 - t0, (double)sent / (t1 - t0) * 1e-9);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    const char *env = getenv("BENCH_TCP_SOCKBUF");
    if (env) g_sockbuf = atoi(env);
    if (seconds <= 0 || seconds > 60) {
        fprintf(stderr, "usage: bench_tcp [SECONDS_PER_CASE (0-60]] [fashion|catdog|BYTES...]\n");
        return 2;
    }
    const char *dflt[] = {"fashion", "catdog"};
    int nsizes = argc > 2 ? argc - 2 : 2;
    const char **names = argc > 2 ? (const char **)argv + 2 : dflt;

    alarm((unsigned)(60 + seconds * (2 * MAX_CLIENTS * nsizes + 1) * 2));  // bounded, whatever happens
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    if (lfd >= 0) tune(lfd);  // before listen: accepted sockets inherit the buffer sizes
    if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        bind(lfd, (struct sockaddr *)&a, sizeof a) || listen(lfd, 16) ||
        getsockname(lfd, (struct sockaddr *)&a, &alen)) {
        perror("bench_tcp: listen on 127.0.0.1");
        return 1;
    }
    pthread_t acceptor;
    if (pthread_create(&acceptor, NULL, accept_loop, (void *)(intptr_t)lfd) != 0) return 1;
    int port = ntohs(a.sin_port), rc = 0;

    for (int i = 0; i < nsizes && rc == 0; i++) {
        size_t size = !strcmp(names[i], "fashion") ? 1686568  // float32 parameters of models/*.model
                      : !strcmp(names[i], "catdog") ? 8504712
                                                    : strtoull(names[i], NULL, 10);
        if (size == 0 || size > (1u << 30)) {
            fprintf(stderr, "bench_tcp: size '%s': want fashion, catdog or 1..2^30 bytes\n", names[i]);
            rc = 2;
            break;
        }
        for (int c = 1; c <= MAX_CLIENTS && rc == 0; c++)
            rc = bench_round_trip(port, names[i], size, c, seconds);
    }
    if (rc == 0) rc = bench_stream(port, seconds);
    shutdown(lfd, SHUT_RDWR);  // wakes the acceptor
    pthread_join(acceptor, NULL);
    close(lfd);
    return rc ? 1 : 0;
}
