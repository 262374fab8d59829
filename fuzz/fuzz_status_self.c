/* libFuzzer target: bytes as a peer's /status.json (what the chief's poll reads from every other
 * task, metrics/status_poll.c). The parser must refuse or accept without crashing, leaking or
 * reading past the input; an accepted "self" has short NUL-terminated texts and a task in range,
 * and feeding it to a status page of a small cluster (which ignores tasks it does not have) must
 * be safe too. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "metrics/status.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dt_status_self self;
    dt_error err = {0};
    if (dt_status_parse_self((const char *)data, size, &self, &err) == 0) {
        if (!memchr(self.job, 0, sizeof self.job) || !memchr(self.state, 0, sizeof self.state) || self.task < 0 ||
            self.task >= DT_CLUSTER_MAX_TASKS)
            __builtin_trap();
        static dt_status *s;
        if (!s) {
            static dt_cluster c;
            dt_cluster_from_flags(&c, "127.0.0.1:1", "127.0.0.1:2,127.0.0.1:3", "worker", "0", NULL);
            dt_status_create(&s, NULL, &c, NULL);
        }
        dt_status_peer(s, &self);
        char *json;
        size_t len;
        if (s && dt_status_json(s, &json, &len, NULL) == 0) free(json);
    } else if (err.msg[0] == '\0' || memchr(err.msg, '\0', sizeof err.msg) == NULL) {
        __builtin_trap(); /* every refusal says why */
    }
    return 0;
}
