/* A test's own temporary folder under /tmp, its paths, and files written whole into it (each helper
 * exits the test on failure: a test that cannot write its fixtures has nothing to check). */
#ifndef DT_TESTS_TMPDIR_H
#define DT_TESTS_TMPDIR_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char tmp_root[256];

/* /tmp/dt_test_<name>_XXXXXX, made now. */
static inline void tmp_make(const char *name) {
    snprintf(tmp_root, sizeof tmp_root, "/tmp/dt_test_%s_XXXXXX", name);
    if (!mkdtemp(tmp_root)) {
        perror("mkdtemp");
        exit(1);
    }
}

static inline int tmp_rm_entry(const char *p, const struct stat *st, int flag, struct FTW *f) {
    (void)st, (void)flag, (void)f;
    return remove(p);
}

static inline void tmp_remove(void) { nftw(tmp_root, tmp_rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* tmp_root/rel, in one of 8 rotating buffers (so a call may take a few paths at once). */
static inline const char *tpath(const char *rel) {
    static char buf[8][512];
    static int k = 0;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmp_root, rel);
    return buf[k];
}

static inline void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

static inline void write_text(const char *path, const char *text) { write_bytes(path, text, strlen(text)); }

#endif
