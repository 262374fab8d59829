#include "core/assert.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char sticky[256];
static atomic_int sticky_set; /* 0 none, 1 being written, 2 readable */

int dt_assert_aborts(void) {
#ifndef NDEBUG
    return 1;
#else
    const char *e = getenv("DTRAIN_ABORT_ON_ASSERT");
    return e != NULL && strcmp(e, "1") == 0;
#endif
}

int dt_assert_fail(const char *expr, const char *file, int line) {
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    if (dt_assert_aborts()) {
        fprintf(stderr, "%s:%d: invariant failed: %s\n", base, line, expr);
        abort();
    }
    int expected = 0;
    if (atomic_compare_exchange_strong(&sticky_set, &expected, 1)) {
        snprintf(sticky, sizeof sticky, "%s:%d: invariant failed: %s", base, line, expr);
        atomic_store(&sticky_set, 2);
        fprintf(stderr, "dtrain: %s (please report this; the operation was refused)\n", sticky);
    }
    return 0;
}

const char *dt_assert_sticky(void) {
    return atomic_load(&sticky_set) == 2 ? sticky : NULL;
}

const char *dt_assert_why(void) {
    const char *s = dt_assert_sticky();
    return s ? s : "broken invariant";
}
