/* libFuzzer target: bytes as TF_CONFIG text. The parser must refuse or accept without crashing,
 * leaking or reading past the input, and an accepted cluster must be self-consistent. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cluster/cluster.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dt_cluster c;
    dt_error err = {0};
    if (dt_cluster_from_tf_config(&c, (const char *)data, size, &err) == 0) {
        char line[512], ep[DT_ENDPOINT_MAX];
        dt_cluster_describe(&c, line, sizeof line);
        const dt_addr *self = dt_cluster_self(&c);
        if (self && (dt_addr_connect_endpoint(self, ep, sizeof ep) || dt_addr_bind_endpoint(self, ep, sizeof ep)))
            __builtin_trap(); /* an accepted address always fits an endpoint */
        if (c.distributed && (c.n_workers < 1 || (c.is_chief != (c.job == DT_JOB_WORKER && c.task_index == 0))))
            __builtin_trap();
    } else if (err.msg[0] == '\0' || memchr(err.msg, '\0', sizeof err.msg) == NULL) {
        __builtin_trap(); /* every refusal says why */
    }
    dt_cluster_clear(&c);
    return 0;
}
