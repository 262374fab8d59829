/* Errors: every fallible library call takes a dt_error * (may be NULL) as its last argument and
 * returns 0 on success or a negative DT_E* code. The message names the file, line or field at fault,
 * so the CLI can print it as one line. The library never exits or aborts on bad input. */
#ifndef DT_CORE_ERROR_H
#define DT_CORE_ERROR_H

#include "dtrain.h"

/* Records code and a printf-style message in err (if non-NULL); returns code, so callers can write
 * `return dt_errorf(err, DT_EINVAL, "model %s line %d: ...", ...);` */
int dt_errorf(dt_error *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Prefixes the message of a failure with code `code` with more context ("loading checkpoint: " +
 * old message), sets err->code and returns code. The caller passes the code it got rather than
 * reading err->code, so that the code returned is the same whether err is NULL or not. */
int dt_error_wrap(dt_error *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Checked allocation: on failure records DT_ENOMEM naming what was being allocated. */
void *dt_malloc(size_t n, const char *what, dt_error *err);
void *dt_calloc(size_t count, size_t size, const char *what, dt_error *err);
/* 64-byte aligned allocation for tensors (free with free()). */
float *dt_alloc_floats(size_t count, const char *what, dt_error *err);

/* Tests of out-of-memory paths: the n-th checked allocation from now (any thread) fails; 0: none. */
void dt_alloc_fail_after(long n);

#endif
