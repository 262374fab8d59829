/* File helpers for the supervisor's outputs: atomic replacement (temporary file, fsync, rename,
 * fsync of the folder), creating a folder with its parents, and reading a whole file with a size
 * bound. A reader never sees a half-written checkpoint or index: either the old file or the new. */
#ifndef DT_IO_FSUTIL_H
#define DT_IO_FSUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain.h"

#define DT_PATH_MAX 4096

/* One file being replaced atomically: bytes go to "<path>.tmp.<pid>" until commit renames it. */
typedef struct {
    int fd;                     /* -1 when not open */
    char path[DT_PATH_MAX];
    char tmp[DT_PATH_MAX + 32];
} dt_atomic_file;

/* Creates "<path>.tmp.<pid>" (replacing a stale one left by a crashed process of the same pid). */
int dt_atomic_open(dt_atomic_file *f, const char *path, dt_error *err);
int dt_atomic_write(dt_atomic_file *f, const void *data, size_t n, dt_error *err);
/* fsync, close, rename over path, fsync the folder. On any failure the temporary file is removed
 * and path is untouched. */
int dt_atomic_commit(dt_atomic_file *f, dt_error *err);
/* Closes and removes the temporary file; harmless after commit or on a never-opened file. */
void dt_atomic_abort(dt_atomic_file *f);

/* Writes n bytes to path atomically (open + write + commit). */
int dt_atomic_write_file(const char *path, const void *data, size_t n, dt_error *err);

/* mkdir -p: creates dir and its missing parents (mode 0755); an existing folder is fine. */
int dt_mkdirs(const char *dir, dt_error *err);

/* Reads the whole file into a malloc'd buffer (*out, with a NUL after the last byte, not counted
 * in *len). Refuses files larger than max_len. The file must not change size while read. */
int dt_read_file(uint8_t **out, size_t *len, const char *path, size_t max_len, dt_error *err);
/* The same for a file that must be a regular file at path itself: a symbolic link there is refused,
 * not followed (O_NOFOLLOW), and a FIFO is refused without blocking. */
int dt_read_plain_file(uint8_t **out, size_t *len, const char *path, size_t max_len, dt_error *err);

/* Joins dir and name into out ("dir/name"; name alone if it is absolute or dir is empty). */
int dt_path_join(char *out, size_t cap, const char *dir, const char *name, dt_error *err);
/* The same into a malloc'd string (NULL on error: too long, or out of memory), for paths kept. */
char *dt_path_join_dup(const char *dir, const char *name, dt_error *err);

#endif
