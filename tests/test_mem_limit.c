/* The memory a ps sizes its default table memory from (src/ps/mem_limit.h): the physical memory, or
 * a cgroup's limit where lower, read from a fake /proc and /sys tree: cgroup v2 with the limit on
 * an ancestor, v2 "max", v1's memory controller, and files that are absent or not a number. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ps/mem_limit.h"
#include "test.h"

static char root[64];

static void put(const char *rel, const char *text) {
    char path[512], cmd[700];
    snprintf(path, sizeof path, "%s%s", root, rel);
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", path);
    CHECK(system(cmd) == 0);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(text, f);
    fclose(f);
}

static void reset(void) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'/proc '%s'/sys", root, root);
    CHECK(system(cmd) == 0);
}

static const uint64_t GiB = UINT64_C(1) << 30;

static void test_v2(void) {
    reset();
    put("/proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
    put("/sys/fs/cgroup/kubepods/pod1/ctr/memory.max", "max\n");
    put("/sys/fs/cgroup/kubepods/pod1/memory.max", "2147483648\n"); /* the pod's limit binds the container */
    put("/sys/fs/cgroup/kubepods/memory.max", "8589934592\n");
    CHECK(dt_mem_limit(root, 24 * GiB) == 2 * GiB);
    CHECK(dt_mem_limit(root, GiB) == GiB); /* physical below the limit */
    put("/sys/fs/cgroup/kubepods/pod1/memory.max", "max\n");
    CHECK(dt_mem_limit(root, 24 * GiB) == 8 * GiB);
    put("/sys/fs/cgroup/memory.max", "1073741824\n"); /* the root of a cgroup namespace */
    CHECK(dt_mem_limit(root, 24 * GiB) == GiB);
    reset();
    put("/proc/self/cgroup", "0::/\n");
    put("/sys/fs/cgroup/memory.max", "3221225472\n");
    CHECK(dt_mem_limit(root, 24 * GiB) == 3 * GiB);
}

static void test_v1_and_bad(void) {
    reset();
    put("/proc/self/cgroup", "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/docker/abc\n");
    put("/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "536870912\n");
    CHECK(dt_mem_limit(root, 24 * GiB) == GiB / 2);
    put("/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n"); /* v1's no limit */
    CHECK(dt_mem_limit(root, 24 * GiB) == 24 * GiB);
    const char *bad[] = {"", "-5\n", "12abc\n", "0\n", "99999999999999999999999\n"};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        put("/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", bad[k]);
        CHECK_MSG(dt_mem_limit(root, 24 * GiB) == 24 * GiB, "'%s' read as a limit", bad[k]);
    }
    put("/proc/self/cgroup", "garbage\n0:memory\n4:memory:/../../etc\n");
    CHECK(dt_mem_limit(root, 24 * GiB) == 24 * GiB);
    reset();
    CHECK(dt_mem_limit(root, 24 * GiB) == 24 * GiB); /* no /proc at all */
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/dt_mem_limit.XXXXXX");
    CHECK(mkdtemp(root) != NULL);
    RUN(test_v2);
    RUN(test_v1_and_bad);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
    return test_summary();
}
