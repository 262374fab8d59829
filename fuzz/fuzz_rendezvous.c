/* libFuzzer target: bytes as rank 0's rendezvous answer, read by rank 1 of a world of 3
 * (docs/protocol.md, "Rendezvous"). Each must be refused with a one-line message or give three
 * addresses with this rank's own port, without crashing or reading past the answer. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/rendezvous.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0; /* a rank reads at most its buffer (read_answer) */
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    dt_rendezvous rv = {.at = "127.0.0.1:2221", .rank = 1, .size = 3, .port = 2223, .local = 1,
                        .rank_var = "OMPI_COMM_WORLD_RANK", .size_var = "OMPI_COMM_WORLD_SIZE",
                        .local_var = "OMPI_COMM_WORLD_LOCAL_RANK", .deadline_ms = 1000};
    dt_addr addrs[3];
    memset(addrs, 0, sizeof addrs);
    dt_error err = {0};
    if (dt_rendezvous_parse_answer(&rv, buf, size, addrs, &err) == 0) {
        if (addrs[1].port != 2223) __builtin_trap();
        for (int r = 0; r < 3; r++)
            if (addrs[r].port < 1 || addrs[r].port > 65535 || !memchr(addrs[r].host, '\0', sizeof addrs[r].host))
                __builtin_trap();
    } else if (err.msg[0] == '\0' || !memchr(err.msg, '\0', sizeof err.msg)) {
        __builtin_trap();
    }
    free(buf);
    return 0;
}
