/* Speaking ZMTP by hand to a ps (tests/test_ps_bounds.c, tests/hostile_peer.c): what libzmq would
 * never send, such as a message that never ends or a frame announced and left unfinished. */
#ifndef DT_TESTS_RAW_ZMTP_H
#define DT_TESTS_RAW_ZMTP_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

/* A plain TCP connection to 127.0.0.1:port whose sends give up after send_timeout_s; -1 if none. */
static inline int raw_tcp_connect(int port, int send_timeout_s) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {send_timeout_s, 0};
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
        close(s);
        return -1;
    }
    return s;
}

static inline int raw_send_all(int s, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        ssize_t k = send(s, p, len, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        p += k, len -= (size_t)k;
    }
    return 0;
}

/* The ZMTP 3.0 greeting and READY of a DEALER with the NULL mechanism: after this the ps takes
 * frames from the connection. */
static inline int zmtp_hello(int s) {
    uint8_t g[64] = {0xFF, 0, 0, 0, 0, 0, 0, 0, 0, 0x7F, 3, 0, 'N', 'U', 'L', 'L'};
    uint8_t ready[2 + 28] = {0x04, 28, 5, 'R', 'E', 'A', 'D', 'Y', 11};
    memcpy(ready + 9, "Socket-Type", 11);
    memcpy(ready + 20, "\0\0\0\6DEALER", 10);
    return raw_send_all(s, g, sizeof g) || raw_send_all(s, ready, sizeof ready) ? -1 : 0;
}

/* A long frame header: flags (MORE or not) and an 8-byte big-endian size. */
static inline int zmtp_frame_header(int s, uint64_t size, int more) {
    uint8_t h[9] = {(uint8_t)(0x02 | (more ? 0x01 : 0))};
    for (int i = 0; i < 8; i++) h[1 + i] = (uint8_t)(size >> (56 - 8 * i));
    return raw_send_all(s, h, sizeof h);
}

#endif
