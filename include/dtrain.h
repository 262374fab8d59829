/* dtrain: data-parallel distributed training in C. Public API.
 *
 * Every fallible call returns 0 on success or a negative DT_E* code and, when err is non-NULL, fills
 * err->msg with a one-line message that names the file, line or field at fault. Nothing in the
 * library exits or aborts on bad input. */
#ifndef DTRAIN_H
#define DTRAIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    DT_OK = 0,
    DT_EINVAL = -1,   /* bad argument, flag or config value */
    DT_ENOMEM = -2,   /* allocation failed */
    DT_EIO = -3,      /* file or socket i/o failed */
    DT_EFORMAT = -4,  /* malformed input file or message */
    DT_ESHAPE = -5,   /* shapes do not fit */
    DT_ENET = -6,     /* network failure */
    DT_ETIMEOUT = -7, /* a deadline passed */
    DT_EPROTO = -8,   /* peer speaks another protocol or broke it */
    DT_EINTR = -9,    /* stopped by a signal */
};

typedef struct dt_error {
    int code;
    char msg[1024];
} dt_error;

const char *dt_strerror(int code);
const char *dt_version(void);

#ifdef __cplusplus
}
#endif
#endif
