/* The memory this process may use: physical memory and cgroup limits (mem_limit.h). */
#include "ps/mem_limit.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The number in file path (a limit in bytes), or UINT64_MAX: absent, "max", or not a number. */
static uint64_t read_limit(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return UINT64_MAX;
    char line[64] = {0};
    const int got = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (!got || line[0] < '0' || line[0] > '9') return UINT64_MAX;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(line, &end, 10);
    if (errno || (*end && *end != '\n')) return UINT64_MAX;
    return v ? (uint64_t)v : UINT64_MAX;
}

static uint64_t least(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* cgroup v2: memory.max of the cgroup at rel (a path from /proc/self/cgroup) and of its ancestors. */
static uint64_t v2_limit(const char *root, const char *rel) {
    char dir[1024];
    if (snprintf(dir, sizeof dir, "%s/sys/fs/cgroup%s", root, rel) >= (int)sizeof dir) return UINT64_MAX;
    const size_t base = strlen(root) + strlen("/sys/fs/cgroup");
    uint64_t most = UINT64_MAX;
    for (;;) {
        char path[1100];
        snprintf(path, sizeof path, "%s/memory.max", dir);
        most = least(most, read_limit(path));
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < base) break;
        *slash = '\0';
    }
    return most;
}

uint64_t dt_mem_limit(const char *root, uint64_t physical) {
    char path[1024];
    snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
    FILE *f = fopen(path, "r");
    if (!f) return physical;
    uint64_t most = physical;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        /* hierarchy-id:controllers:path; v2 is "0::/path" */
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2 || c2[1] != '/' || strstr(c2, "/..")) continue;
        *c1 = '\0', *c2 = '\0';
        const char *controllers = c1 + 1, *rel = c2 + 1;
        if (!strcmp(line, "0") && !*controllers) {
            most = least(most, v2_limit(root, strcmp(rel, "/") ? rel : ""));
        } else if (strstr(controllers, "memory")) {
            snprintf(path, sizeof path, "%s/sys/fs/cgroup/memory%s/memory.limit_in_bytes", root,
                     strcmp(rel, "/") ? rel : "");
            most = least(most, read_limit(path));
        }
    }
    fclose(f);
    return most;
}
