#include "core/error.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dt_errorf(dt_error *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

int dt_error_wrap(dt_error *err, int code, const char *fmt, ...) {
    if (!err) return code;
    char prefix[256], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t lp = strnlen(prefix, sizeof prefix), lo = strnlen(old, sizeof old - 1);
    if (lp > sizeof err->msg - 1) lp = sizeof err->msg - 1;
    if (lo > sizeof err->msg - 1 - lp) lo = sizeof err->msg - 1 - lp;
    memcpy(err->msg, prefix, lp);
    memcpy(err->msg + lp, old, lo);
    err->msg[lp + lo] = 0;
    err->code = code;
    return code;
}

const char *dt_strerror(int code) {
    switch (code) {
    case DT_OK: return "ok";
    case DT_EINVAL: return "invalid argument";
    case DT_ENOMEM: return "out of memory";
    case DT_EIO: return "i/o error";
    case DT_EFORMAT: return "bad format";
    case DT_ESHAPE: return "shape mismatch";
    case DT_ENET: return "network error";
    case DT_ETIMEOUT: return "timed out";
    case DT_EPROTO: return "protocol error";
    case DT_EINTR: return "interrupted";
    default: return "unknown error";
    }
}

static atomic_long fail_countdown; /* dt_alloc_fail_after: allocations left before one fails */

void dt_alloc_fail_after(long n) { atomic_store(&fail_countdown, n > 0 ? n : 0); }

/* Whether this allocation is the one a test asked to fail. */
static int injected_failure(void) {
    return atomic_load_explicit(&fail_countdown, memory_order_relaxed) > 0 && atomic_fetch_sub(&fail_countdown, 1) == 1;
}

void *dt_malloc(size_t n, const char *what, dt_error *err) {
    void *p = injected_failure() ? NULL : malloc(n ? n : 1);
    if (!p) dt_errorf(err, DT_ENOMEM, "out of memory allocating %zu bytes for %s", n, what);
    return p;
}

void *dt_calloc(size_t count, size_t size, const char *what, dt_error *err) {
    if (size && count > (size_t)-1 / size) {
        dt_errorf(err, DT_ENOMEM, "size overflow allocating %zu x %zu bytes for %s", count, size, what);
        return NULL;
    }
    void *p = injected_failure() ? NULL : calloc(count ? count : 1, size ? size : 1);
    if (!p) dt_errorf(err, DT_ENOMEM, "out of memory allocating %zu x %zu bytes for %s", count, size, what);
    return p;
}

float *dt_alloc_floats(size_t count, const char *what, dt_error *err) {
    if (count > ((size_t)-1 - 63) / sizeof(float)) {
        dt_errorf(err, DT_ENOMEM, "size overflow allocating %zu floats for %s", count, what);
        return NULL;
    }
    size_t bytes = (count * sizeof(float) + 63) & ~(size_t)63;
    void *p = injected_failure() ? NULL : aligned_alloc(64, bytes ? bytes : 64);
    if (!p) {
        dt_errorf(err, DT_ENOMEM, "out of memory allocating %zu floats for %s", count, what);
        return NULL;
    }
    memset(p, 0, bytes);
    return p;
}
