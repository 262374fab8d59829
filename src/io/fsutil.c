#include "io/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

int dt_atomic_open(dt_atomic_file *f, const char *path, dt_error *err) {
    f->fd = -1;
    f->tmp[0] = 0;
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof f->path)
        return dt_errorf(err, DT_EINVAL, "%s: path is empty or too long (%zu bytes)", path, n);
    memcpy(f->path, path, n + 1);
    /* A random name created with O_EXCL|O_NOFOLLOW: whoever can write the folder cannot plant a link
     * (or a file) at a name known in advance and have the bytes written through it elsewhere. The
     * rename in commit replaces a link at path itself rather than following it. */
    int e = EEXIST;
    for (int tries = 0; tries < 16 && e == EEXIST; tries++) {
        uint64_t r;
        if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) {
            e = errno;
            break;
        }
        snprintf(f->tmp, sizeof f->tmp, "%s.tmp.%016llx", path, (unsigned long long)r);
        f->fd = open(f->tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        e = f->fd < 0 ? errno : 0;
    }
    if (f->fd < 0) {
        f->tmp[0] = 0;
        return dt_errorf(err, DT_EIO, "%s: cannot create temporary file: %s", path, strerror(e));
    }
    return 0;
}

int dt_atomic_write(dt_atomic_file *f, const void *data, size_t n, dt_error *err) {
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(f->fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return dt_errorf(err, DT_EIO, "%s: write failed: %s", f->tmp, w < 0 ? strerror(errno) : "no progress");
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int dt_atomic_pwrite(dt_atomic_file *f, const void *data, size_t n, uint64_t offset, dt_error *err) {
    const char *p = data;
    while (n > 0) {
        ssize_t w = pwrite(f->fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n, (off_t)offset);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return dt_errorf(err, DT_EIO, "%s: write failed: %s", f->tmp, w < 0 ? strerror(errno) : "no progress");
        p += w;
        n -= (size_t)w;
        offset += (uint64_t)w;
    }
    return 0;
}

int dt_atomic_resize(dt_atomic_file *f, uint64_t size, dt_error *err) {
    if (ftruncate(f->fd, (off_t)size) != 0)
        return dt_errorf(err, DT_EIO, "%s: cannot make it %llu bytes: %s", f->tmp, (unsigned long long)size,
                         strerror(errno));
    return 0;
}

/* The folder holding path: fsync it so the rename itself is durable. */
static int fsync_parent(const char *path, dt_error *err) {
    char dir[DT_PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash) {
        strcpy(dir, ".");
    } else if (slash == path) {
        strcpy(dir, "/");
    } else {
        size_t n = (size_t)(slash - path);
        memcpy(dir, path, n);
        dir[n] = 0;
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return dt_errorf(err, DT_EIO, "%s: cannot open folder to sync: %s", dir, strerror(errno));
    int rc = 0;
    if (fsync(fd) != 0 && errno != EINVAL) /* some file systems cannot sync folders */
        rc = dt_errorf(err, DT_EIO, "%s: fsync of folder failed: %s", dir, strerror(errno));
    close(fd);
    return rc;
}

int dt_atomic_commit(dt_atomic_file *f, dt_error *err) {
    if (f->fd < 0) return dt_errorf(err, DT_EINVAL, "%s: commit of a file that is not open", f->path);
    if (fsync(f->fd) != 0) {
        int e = errno;
        dt_atomic_abort(f);
        return dt_errorf(err, DT_EIO, "%s: fsync failed: %s", f->path, strerror(e));
    }
    int rc = close(f->fd);
    f->fd = -1;
    if (rc != 0) {
        int e = errno;
        dt_atomic_abort(f);
        return dt_errorf(err, DT_EIO, "%s: close failed: %s", f->path, strerror(e));
    }
    if (rename(f->tmp, f->path) != 0) {
        /* the message first: dt_atomic_abort forgets the temporary name */
        rc = dt_errorf(err, DT_EIO, "%s: rename from %s failed: %s", f->path, f->tmp, strerror(errno));
        dt_atomic_abort(f);
        return rc;
    }
    f->tmp[0] = 0;
    return fsync_parent(f->path, err);
}

void dt_atomic_abort(dt_atomic_file *f) {
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    if (f->tmp[0]) unlink(f->tmp);
    f->tmp[0] = 0;
}

int dt_atomic_write_file(const char *path, const void *data, size_t n, dt_error *err) {
    dt_atomic_file f;
    int rc = dt_atomic_open(&f, path, err);
    if (!rc) rc = dt_atomic_write(&f, data, n, err);
    if (!rc) return dt_atomic_commit(&f, err);
    dt_atomic_abort(&f);
    return rc;
}

int dt_mkdirs(const char *dir, dt_error *err) {
    char buf[DT_PATH_MAX];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof buf)
        return dt_errorf(err, DT_EINVAL, "folder path is empty or too long (%zu bytes)", n);
    memcpy(buf, dir, n + 1);
    /* Create each prefix ending before a '/', then the whole path. */
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != 0) continue;
        char saved = buf[i];
        buf[i] = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
            int e = errno;
            return dt_errorf(err, DT_EIO, "%s: cannot create folder %s: %s", dir, buf, strerror(e));
        }
        buf[i] = saved;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return dt_errorf(err, DT_EIO, "%s: exists and is not a folder", dir);
    return 0;
}

int dt_open_regular(const char *path, int nofollow, struct stat *st, dt_error *err) {
    /* O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer: it is refused below, with
     * one line, instead of hanging. O_NOFOLLOW (nofollow) refuses a symbolic link as the last
     * component. Neither changes how a regular file reads, and O_NONBLOCK is cleared again anyway. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | (nofollow ? O_NOFOLLOW : 0));
    if (fd < 0 && nofollow && errno == ELOOP)
        return dt_errorf(err, DT_EIO, "%s: is a symbolic link (not followed: only files in the folder itself are read)",
                         path);
    if (fd < 0) return dt_errorf(err, DT_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (!st) st = &sb;
    if (fstat(fd, st) != 0) {
        int e = errno;
        close(fd);
        return dt_errorf(err, DT_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        return dt_errorf(err, DT_EIO, "%s: not a regular file (%s)", path,
                         S_ISDIR(st->st_mode) ? "a folder" : S_ISFIFO(st->st_mode) ? "a FIFO" :
                         S_ISSOCK(st->st_mode) ? "a socket" : S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode) ? "a device" :
                         "not a plain file");
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        return dt_errorf(err, DT_EIO, "%s: fcntl: %s", path, strerror(e));
    }
    return fd;
}

int dt_read_at(int fd, const uint8_t *mem, uint64_t at, void *out, size_t n, const char *label, dt_error *err) {
    if (mem) {
        memcpy(out, mem + at, n);
        return 0;
    }
    if (dt_pread_full(fd, out, n, at))
        return dt_errorf(err, DT_EIO, "%s: could not read %zu bytes at offset %" PRIu64 " (file changed or i/o error)",
                         label, n, at);
    return 0;
}

int dt_pread_full(int fd, void *buf, size_t n, uint64_t offset) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(offset + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    return got == n ? 0 : -1;
}

static int read_file(uint8_t **out, size_t *len, const char *path, size_t max_len, int plain, struct stat *st,
                     dt_error *err) {
    *out = NULL;
    *len = 0;
    struct stat sb;
    if (!st) st = &sb;
    int fd = dt_open_regular(path, plain, st, err);
    if (fd < 0) return fd;
    if ((uint64_t)st->st_size > (uint64_t)max_len) {
        close(fd);
        return dt_errorf(err, DT_EFORMAT, "%s: file is %lld bytes, more than the %zu allowed", path,
                         (long long)st->st_size, max_len);
    }
    size_t n = (size_t)st->st_size;
    uint8_t *buf = dt_malloc(n + 1, path, err);
    if (!buf) {
        close(fd);
        return DT_ENOMEM;
    }
    int bad = dt_pread_full(fd, buf, n, 0);
    close(fd);
    if (bad) {
        free(buf);
        return dt_errorf(err, DT_EIO, "%s: could not read its %zu bytes (file changed or i/o error)", path, n);
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}

int dt_read_file(uint8_t **out, size_t *len, const char *path, size_t max_len, dt_error *err) {
    return read_file(out, len, path, max_len, 0, NULL, err);
}

int dt_read_file_stat(uint8_t **out, size_t *len, const char *path, size_t max_len, struct stat *st, dt_error *err) {
    return read_file(out, len, path, max_len, 0, st, err);
}

int dt_read_plain_file(uint8_t **out, size_t *len, const char *path, size_t max_len, dt_error *err) {
    return read_file(out, len, path, max_len, 1, NULL, err);
}

int dt_path_join(char *out, size_t cap, const char *dir, const char *name, dt_error *err) {
    int n;
    if (name[0] == '/' || !dir || dir[0] == 0)
        n = snprintf(out, cap, "%s", name);
    else
        n = snprintf(out, cap, "%s%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", name);
    if (n < 0 || (size_t)n >= cap)
        return dt_errorf(err, DT_EINVAL, "path %s/%s is too long", dir ? dir : "", name);
    return 0;
}

char *dt_path_join_dup(const char *dir, const char *name, dt_error *err) {
    char buf[DT_PATH_MAX];
    if (dt_path_join(buf, sizeof buf, dir, name, err)) return NULL;
    size_t n = strlen(buf) + 1;
    char *p = dt_malloc(n, "a path", err);
    if (p) memcpy(p, buf, n);
    return p;
}
