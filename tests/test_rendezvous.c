/* The MPI rendezvous (src/cluster/rendezvous.c) under idle and slow connections: every rank runs
 * dt_rendezvous_gather in a thread of this process, at 127.0.0.1 on a port the kernel picked, while
 * other threads hold connections that never say hello (docs/security.md, "The rendezvous"). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cluster/rendezvous.h"
#include "core/clock.h"
#include "test.h"

enum { MAX_SIZE = 4, DEADLINE_MS = 8000 };

typedef struct {
    dt_rendezvous rv;
    dt_addr addrs[MAX_SIZE];
    dt_error err;
    int rc;
    double took; /* seconds in dt_rendezvous_gather */
    pthread_t th;
} rank_task;

static void *rank_main(void *arg) {
    rank_task *t = arg;
    double t0 = dt_seconds();
    t->rc = dt_rendezvous_gather(&t->rv, t->addrs, &t->err);
    t->took = dt_seconds() - t0;
    return NULL;
}

static void rank_start_log(rank_task *t, const char *at, int rank, int size, FILE *log) {
    memset(t, 0, sizeof *t);
    t->rv = (dt_rendezvous){.at = at, .rank = rank, .size = size, .port = 2222 + rank, .local = rank,
                            .rank_var = "OMPI_COMM_WORLD_RANK", .size_var = "OMPI_COMM_WORLD_SIZE",
                            .local_var = "OMPI_COMM_WORLD_LOCAL_RANK", .deadline_ms = DEADLINE_MS, .log = log};
    pthread_create(&t->th, NULL, rank_main, t);
}

static void rank_start(rank_task *t, const char *at, int rank, int size) { rank_start_log(t, at, rank, size, NULL); }

static int count_lines(const char *text, const char *needle) {
    int n = 0;
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        const char *end = strchr(l, '\n'), *hit = strstr(l, needle);
        n += hit && (!end || hit < end);
    }
    return n;
}

/* Every rank got the whole list: 127.0.0.1 at 2222 + rank. */
static void check_world(rank_task *t, int size) {
    for (int r = 0; r < size; r++) {
        pthread_join(t[r].th, NULL);
        CHECK_MSG(t[r].rc == 0, "rank %d: %s", r, t[r].err.msg);
        CHECK_MSG(t[r].took < DEADLINE_MS / 1000.0, "rank %d took %.1f s", r, t[r].took);
        for (int q = 0; q < size && t[r].rc == 0; q++)
            CHECK_MSG(!strcmp(t[r].addrs[q].host, "127.0.0.1") && t[r].addrs[q].port == 2222 + q,
                      "rank %d sees rank %d at %s:%d", r, q, t[r].addrs[q].host, t[r].addrs[q].port);
    }
}

static int free_port(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    bind(s, (struct sockaddr *)&a, sizeof a);
    getsockname(s, (struct sockaddr *)&a, &len);
    close(s);
    return ntohs(a.sin_port);
}

static int tcp_connect(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (s >= 0 && connect(s, (struct sockaddr *)&a, sizeof a)) close(s), s = -1;
    return s;
}

/* Rank 0 listening (a connection that goes through, closed at once). */
static void wait_listening(int port) {
    for (int i = 0; i < 200; i++) {
        int s = tcp_connect(port);
        if (s >= 0) {
            close(s);
            return;
        }
        usleep(10000);
    }
}

static void sleep_ms(int ms) { usleep((useconds_t)ms * 1000); }

/* The peer closed s (end of file or reset), without waiting. */
static int closed(int s) {
    struct pollfd p = {.fd = s, .events = POLLIN};
    char b[16];
    return poll(&p, 1, 0) == 1 && recv(s, b, sizeof b, MSG_DONTWAIT) <= 0;
}

/* ---- the flood: idle connections kept open, and slow lorises (a byte of a hello at a time) ---- */

enum { IDLE = 64, LORIS = 4 };

typedef struct {
    int port, idle, loris, refill; /* refill: reopen what rank 0 closes (the most pressure) */
    atomic_int stop, opened, reopened;
    atomic_int loris_life_ms;      /* how long the longest-lived loris lasted, closed by rank 0 */
    pthread_t th;
} flood;

static void *flood_main(void *arg) {
    flood *f = arg;
    int fd[IDLE + LORIS];
    double born[IDLE + LORIS];
    size_t sent[IDLE + LORIS] = {0};
    const char *hello = "dtrain-rendezvous 1 1 3 2223 1"; /* never the newline */
    int n = f->idle + f->loris;
    for (int i = 0; i < n; i++) {
        fd[i] = tcp_connect(f->port);
        born[i] = dt_seconds();
        atomic_fetch_add(&f->opened, fd[i] >= 0);
    }
    double next_byte = dt_seconds();
    while (!atomic_load(&f->stop)) {
        int byte = dt_seconds() >= next_byte;
        if (byte) next_byte += 0.1;
        for (int i = 0; i < n; i++) {
            int loris = i >= f->idle;
            if (fd[i] >= 0 && loris && byte) {
                if (send(fd[i], hello + sent[i] % strlen(hello), 1, MSG_NOSIGNAL) == 1) sent[i]++;
            }
            if (fd[i] >= 0 && closed(fd[i])) {
                int ms = (int)((dt_seconds() - born[i]) * 1000);
                if (loris && ms > atomic_load(&f->loris_life_ms)) atomic_store(&f->loris_life_ms, ms);
                close(fd[i]);
                fd[i] = -1;
            }
            if (fd[i] < 0 && f->refill) {
                fd[i] = tcp_connect(f->port), born[i] = dt_seconds(), sent[i] = 0;
                atomic_fetch_add(&f->reopened, fd[i] >= 0);
            }
        }
        sleep_ms(5);
    }
    for (int i = 0; i < n; i++)
        if (fd[i] >= 0) close(fd[i]);
    return NULL;
}

static void flood_start(flood *f, int port, int idle, int loris, int refill) {
    memset(f, 0, sizeof *f);
    f->port = port, f->idle = idle, f->loris = loris, f->refill = refill;
    pthread_create(&f->th, NULL, flood_main, f);
    for (int i = 0; i < 500 && atomic_load(&f->opened) < idle + loris; i++) sleep_ms(10);
}

static void flood_stop(flood *f) {
    atomic_store(&f->stop, 1);
    pthread_join(f->th, NULL);
}

/* 64 idle connections and 4 slow lorises open before ranks 1 and 2 come (rank 0 holds at most
 * size - 1 + 16 = 18): both still get the list, long before the deadline. */
static void test_idle_connections_first(void) {
    char at[32];
    int port = free_port();
    snprintf(at, sizeof at, "127.0.0.1:%d", port);
    rank_task t[3];
    char *log = NULL;
    size_t log_len = 0;
    FILE *logf = open_memstream(&log, &log_len);
    rank_start_log(&t[0], at, 0, 3, logf);
    wait_listening(port);
    flood f;
    flood_start(&f, port, IDLE, LORIS, 0);
    CHECK(atomic_load(&f.opened) == IDLE + LORIS);
    sleep_ms(300); /* rank 0 has taken them all in */
    double t0 = dt_seconds();
    rank_start(&t[1], at, 1, 3);
    rank_start(&t[2], at, 2, 3);
    check_world(t, 3);
    double took = dt_seconds() - t0;
    CHECK_MSG(took < 3.0, "the ranks met %.1f s after ranks 1 and 2 started", took);
    flood_stop(&f);
    fprintf(stderr, "  64 idle + 4 slow connections first: the ranks met in %.2f s\n", took);
    /* Rank 0 held 18 of the 68: 50 evicted, the first 5 logged, then one count. */
    fclose(logf);
    CHECK_MSG(count_lines(log, "rendezvous: ") == 6, "%s", log);
    CHECK_MSG(count_lines(log, "connections open, the most rank 0 holds: closed the one from 127.0.0.1") == 5, "%s", log);
    CHECK_MSG(count_lines(log, "(further ones are counted, not logged)") == 1, "%s", log);
    int total = 0;
    for (const char *l = log; l && *l && !total; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        int used = 0; /* %n: the whole line matched, not just the number */
        sscanf(l, "rendezvous: %d connections closed without a hello in all%n", &total, &used);
        if (!used) total = 0;
    }
    CHECK_MSG(total >= 50, "%s", log);
    if (getenv("DTRAIN_SHOW_LOG")) fputs(log, stderr);
    free(log);
}

/* The same while the flood reopens every connection rank 0 closes, as fast as it can. */
static void test_idle_connections_refilled(void) {
    char at[32];
    int port = free_port();
    snprintf(at, sizeof at, "127.0.0.1:%d", port);
    rank_task t[4];
    rank_start(&t[0], at, 0, 4);
    wait_listening(port);
    flood f;
    flood_start(&f, port, IDLE, LORIS, 1);
    sleep_ms(300);
    double t0 = dt_seconds();
    for (int r = 1; r < 4; r++) rank_start(&t[r], at, r, 4);
    check_world(t, 4);
    double took = dt_seconds() - t0;
    CHECK_MSG(took < 4.0, "the ranks met %.1f s after ranks 1-3 started", took);
    flood_stop(&f);
    fprintf(stderr, "  64 idle + 4 slow connections, reopened %d times: the ranks met in %.2f s\n",
            atomic_load(&f.reopened), took);
}

/* A slow loris (a byte of a hello every 100 ms) is closed by the hello deadline counted from
 * accept, not from its latest byte. */
static void test_slow_loris_deadline(void) {
    char at[32];
    int port = free_port();
    snprintf(at, sizeof at, "127.0.0.1:%d", port);
    rank_task t[2];
    char *log = NULL;
    size_t log_len = 0;
    FILE *logf = open_memstream(&log, &log_len);
    rank_start_log(&t[0], at, 0, 2, logf);
    wait_listening(port);
    flood f;
    flood_start(&f, port, 0, 1, 0);
    for (int i = 0; i < 70 && !atomic_load(&f.loris_life_ms); i++) sleep_ms(100); /* at most 7 s */
    flood_stop(&f);
    double life = atomic_load(&f.loris_life_ms) / 1000.0;
    CHECK_MSG(life > 4.0 && life < 6.5, "the slow loris lasted %.1f s", life);
    fprintf(stderr, "  a slow loris lasted %.2f s\n", life);
    rank_start(&t[1], at, 1, 2);
    check_world(t, 2);
    fclose(logf);
    CHECK_MSG(count_lines(log, "rendezvous: closed the connection from 127.0.0.1: no hello within 5 s of "
                               "connecting (") == 1, "%s", log);
    free(log);
}

/* Something at the port closes every connection at once for 1 s (as a full rendezvous did), then
 * rank 0 starts there: ranks that came first retry rather than fail. */
static void test_retry_after_early_close(void) {
    char at[32];
    int port = free_port();
    snprintf(at, sizeof at, "127.0.0.1:%d", port);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(bind(l, (struct sockaddr *)&a, sizeof a) == 0 && listen(l, 64) == 0);
    rank_task t[3];
    rank_start(&t[1], at, 1, 3);
    rank_start(&t[2], at, 2, 3);
    int closes = 0;
    for (double end = dt_seconds() + 1.0; dt_seconds() < end;) {
        struct pollfd p = {.fd = l, .events = POLLIN};
        if (poll(&p, 1, 50) == 1) {
            int c = accept(l, NULL, NULL);
            if (c >= 0) close(c), closes++;
        }
    }
    close(l);
    rank_start(&t[0], at, 0, 3);
    check_world(t, 3);
    CHECK_MSG(closes >= 2, "%d connections closed at once", closes);
    fprintf(stderr, "  %d connections closed before rank 0 came\n", closes);
}

static void test_plain_world(void) {
    char at[32];
    snprintf(at, sizeof at, "127.0.0.1:%d", free_port());
    rank_task t[3];
    for (int r = 0; r < 3; r++) rank_start(&t[r], at, r, 3);
    check_world(t, 3);
}

int main(void) {
    RUN(test_plain_world);
    RUN(test_idle_connections_first);
    RUN(test_idle_connections_refilled);
    RUN(test_slow_loris_deadline);
    RUN(test_retry_after_early_close);
    return test_summary();
}
