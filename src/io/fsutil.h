/* File helpers for the supervisor's outputs: atomic replacement (temporary file, fsync, rename,
 * fsync of the folder), creating a folder with its parents, and reading a whole file with a size
 * bound. A reader never sees a half-written checkpoint or index: either the old file or the new. */
#ifndef DT_IO_FSUTIL_H
#define DT_IO_FSUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain.h"

#define DT_PATH_MAX 4096

/* One file being replaced atomically: bytes go to "<path>.tmp.<16 random hex digits>" until commit
 * renames it. */
typedef struct {
    int fd;                     /* -1 when not open */
    char path[DT_PATH_MAX];
    char tmp[DT_PATH_MAX + 32];
} dt_atomic_file;

/* Creates the temporary file with O_CREAT|O_EXCL|O_NOFOLLOW under a random name (another is drawn if
 * it exists): nothing planted in the folder in advance, a symbolic link included, is written through. */
int dt_atomic_open(dt_atomic_file *f, const char *path, dt_error *err);
int dt_atomic_write(dt_atomic_file *f, const void *data, size_t n, dt_error *err);
/* n bytes at offset (the file grows as needed); the file is open for reading too (dt_pread_full). */
int dt_atomic_pwrite(dt_atomic_file *f, const void *data, size_t n, uint64_t offset, dt_error *err);
/* The file made exactly size bytes long (a part never written reads as zeros). */
int dt_atomic_resize(dt_atomic_file *f, uint64_t size, dt_error *err);
/* fsync, close, rename over path, fsync the folder. On any failure the temporary file is removed
 * and path is untouched. */
int dt_atomic_commit(dt_atomic_file *f, dt_error *err);
/* Closes and removes the temporary file; harmless after commit or on a never-opened file. */
void dt_atomic_abort(dt_atomic_file *f);

/* Writes n bytes to path atomically (open + write + commit). */
int dt_atomic_write_file(const char *path, const void *data, size_t n, dt_error *err);

/* mkdir -p: creates dir and its missing parents (mode 0755); an existing folder is fine. */
int dt_mkdirs(const char *dir, dt_error *err);

/* Opens path for reading, refusing without blocking what is not a regular file (a FIFO, a device, a
 * folder: one line naming the file and what it is); nofollow: a symbolic link at path itself is
 * refused too (O_NOFOLLOW). Returns the descriptor (O_CLOEXEC, blocking) with *st filled (st may be
 * NULL), or a negative dt error code. Every file dtrain reads goes through here. */
struct stat;
int dt_open_regular(const char *path, int nofollow, struct stat *st, dt_error *err);
/* Reads exactly n bytes at offset (retrying short reads); 0, or -1 at end of file or on an error. */
int dt_pread_full(int fd, void *buf, size_t n, uint64_t offset);

/* Bytes [at, at + n) of a file that readers either hold in memory (mem, not NULL) or read with
 * pread (fd): 0, or DT_EIO with a message naming label. The caller checks the range. */
int dt_read_at(int fd, const uint8_t *mem, uint64_t at, void *out, size_t n, const char *label, dt_error *err);

/* Reads the whole file into a malloc'd buffer (*out, with a NUL after the last byte, not counted
 * in *len). Refuses files larger than max_len (from fstat, before reading anything) and anything
 * but a regular file (dt_open_regular). The file must not change size while read. */
int dt_read_file(uint8_t **out, size_t *len, const char *path, size_t max_len, dt_error *err);
/* The same, with the file's fstat (mode, owner) in *st. */
int dt_read_file_stat(uint8_t **out, size_t *len, const char *path, size_t max_len, struct stat *st, dt_error *err);
/* The same for a file that must be a regular file at path itself: a symbolic link there is refused,
 * not followed (O_NOFOLLOW). Files of the log folder are read so. */
int dt_read_plain_file(uint8_t **out, size_t *len, const char *path, size_t max_len, dt_error *err);

/* Joins dir and name into out ("dir/name"; name alone if it is absolute or dir is empty). */
int dt_path_join(char *out, size_t cap, const char *dir, const char *name, dt_error *err);
/* The same into a malloc'd string (NULL on error: too long, or out of memory), for paths kept. */
char *dt_path_join_dup(const char *dir, const char *name, dt_error *err);

#endif
