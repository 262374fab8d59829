#include "io/events.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "event.pb-c.h"
#include "io/crc32c.h"
#include "io/fsutil.h"
#include "io/bytes.h"

double dt_wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- Writer --------------------------------------------------------------------------------- */

struct dt_event_writer {
    FILE *f;
    int failed;               /* a write failed: later calls report it instead of writing more */
    char path[DT_PATH_MAX];
};

const char *dt_event_writer_path(const dt_event_writer *w) { return w->path; }

static int write_event(dt_event_writer *w, const Dtrain__Tb__Event *ev, dt_error *err) {
    if (w->failed) return dt_errorf(err, DT_EIO, "%s: an earlier write failed", w->path);
    size_t n = dtrain__tb__event__get_packed_size(ev);
    uint8_t *buf = dt_malloc(n + DT_RECORD_OVERHEAD, "event record", err);
    if (!buf) return DT_ENOMEM;
    dt_put_u64(buf, n);
    dt_put_u32(buf + 8, dt_crc32c_mask(dt_crc32c(0, buf, 8)));
    dtrain__tb__event__pack(ev, buf + 12);
    dt_put_u32(buf + 12 + n, dt_crc32c_mask(dt_crc32c(0, buf + 12, n)));
    size_t wrote = fwrite(buf, 1, n + DT_RECORD_OVERHEAD, w->f);
    free(buf);
    if (wrote != n + DT_RECORD_OVERHEAD) {
        w->failed = 1;
        return dt_errorf(err, DT_EIO, "%s: write failed: %s", w->path, strerror(errno));
    }
    return 0;
}

int dt_event_writer_flush(dt_event_writer *w, dt_error *err) {
    if (w->failed) return dt_errorf(err, DT_EIO, "%s: an earlier write failed", w->path);
    if (fflush(w->f) != 0) {
        w->failed = 1;
        return dt_errorf(err, DT_EIO, "%s: write failed: %s", w->path, strerror(errno));
    }
    return 0;
}

int dt_event_writer_close(dt_event_writer *w, dt_error *err) {
    if (!w) return 0;
    int rc = w->failed ? dt_errorf(err, DT_EIO, "%s: an earlier write failed", w->path) : 0;
    if (fclose(w->f) != 0 && !rc) rc = dt_errorf(err, DT_EIO, "%s: write failed: %s", w->path, strerror(errno));
    free(w);
    return rc;
}

int dt_event_writer_open(dt_event_writer **out, const char *dir, double wall_time, dt_error *err) {
    *out = NULL;
    if (!(wall_time >= 0 && wall_time < 1e10))
        return dt_errorf(err, DT_EINVAL, "%s: wall time %g is outside 0..9999999999 seconds", dir, wall_time);
    int rc = dt_mkdirs(dir, err);
    if (rc) return rc;
    char host[256];
    if (gethostname(host, sizeof host) != 0 || !host[0]) strcpy(host, "localhost");
    host[sizeof host - 1] = 0;
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';
    char name[512];
    snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s", (long long)wall_time, host);

    dt_event_writer *w = dt_calloc(1, sizeof *w, "event writer", err);
    if (!w) return DT_ENOMEM;
    /* O_EXCL: never append to or truncate another writer's file that got the same second. */
    int fd = -1;
    for (int k = 0; k < 100 && fd < 0; k++) {
        char leaf[560];
        if (k == 0) snprintf(leaf, sizeof leaf, "%s", name);
        else snprintf(leaf, sizeof leaf, "%s.%d", name, k);
        if ((rc = dt_path_join(w->path, sizeof w->path, dir, leaf, err))) {
            free(w);
            return rc;
        }
        fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0 || !(w->f = fdopen(fd, "wb"))) {
        rc = dt_errorf(err, DT_EIO, "%s: cannot create event file: %s", w->path, strerror(errno));
        if (fd >= 0) close(fd);
        free(w);
        return rc;
    }
    Dtrain__Tb__Event ev = DTRAIN__TB__EVENT__INIT;
    ev.wall_time = wall_time;
    ev.what_case = DTRAIN__TB__EVENT__WHAT_FILE_VERSION;
    ev.file_version = (char *)DT_EVENT_FILE_VERSION;
    if ((rc = write_event(w, &ev, err)) || (rc = dt_event_writer_flush(w, err))) {
        dt_event_writer_close(w, NULL);
        return rc;
    }
    *out = w;
    return 0;
}

int dt_event_add_scalar(dt_event_writer *w, const char *tag, int64_t step, float value, double wall_time,
                        dt_error *err) {
    size_t tn = tag ? strlen(tag) : 0;
    if (tn == 0 || tn > DT_EVENT_MAX_TAG)
        return dt_errorf(err, DT_EINVAL, "%s: summary tag is empty or longer than %d bytes", w->path, DT_EVENT_MAX_TAG);
    Dtrain__Tb__Summary__Value val = DTRAIN__TB__SUMMARY__VALUE__INIT;
    val.tag = (char *)tag;
    val.value_case = DTRAIN__TB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
    val.simple_value = value;
    Dtrain__Tb__Summary__Value *vals[1] = {&val};
    Dtrain__Tb__Summary sum = DTRAIN__TB__SUMMARY__INIT;
    sum.n_value = 1;
    sum.value = vals;
    Dtrain__Tb__Event ev = DTRAIN__TB__EVENT__INIT;
    ev.wall_time = wall_time;
    ev.step = step;
    ev.what_case = DTRAIN__TB__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    return write_event(w, &ev, err);
}

/* ---- Reader --------------------------------------------------------------------------------- */

/* The 12 framing bytes of the record at offset at, left bytes from there to the end: its data
 * length, or an error naming the record. */
static int check_frame(const uint8_t *hdr, size_t at, uint64_t left, uint64_t *ln, const char *label, dt_error *err) {
    uint64_t n = dt_get_u64(hdr);
    uint32_t want = dt_crc32c_unmask(dt_get_u32(hdr + 8)), got = dt_crc32c(0, hdr, 8);
    if (want != got)
        return dt_errorf(err, DT_EFORMAT, "%s: record at offset %zu: length CRC mismatch (stored %08" PRIx32
                         ", computed %08" PRIx32 ")", label, at, want, got);
    if (n > DT_RECORD_MAX_DATA)
        return dt_errorf(err, DT_EFORMAT, "%s: record at offset %zu: length %" PRIu64 " exceeds the %zu allowed", label, at,
                         n, DT_RECORD_MAX_DATA);
    if (n + DT_RECORD_OVERHEAD > left)
        return dt_errorf(err, DT_EFORMAT, "%s: record at offset %zu: truncated (needs %" PRIu64 " bytes, %" PRIu64 " left)",
                         label, at, n + DT_RECORD_OVERHEAD, left);
    *ln = n;
    return 0;
}

static int data_crc_mismatch(size_t at, uint32_t want, uint32_t got, const char *label, dt_error *err) {
    return dt_errorf(err, DT_EFORMAT, "%s: record at offset %zu: data CRC mismatch (stored %08" PRIx32
                     ", computed %08" PRIx32 ")", label, at, want, got);
}

int dt_record_next(const uint8_t *buf, size_t n, size_t *pos, const uint8_t **data, size_t *len,
                   const char *label, dt_error *err) {
    size_t at = *pos;
    if (at >= n) return 0;
    size_t left = n - at;
    if (left < 12)
        return dt_errorf(err, DT_EFORMAT, "%s: record at offset %zu: truncated framing (%zu of 12 bytes)", label, at, left);
    uint64_t ln = 0;
    int rc = check_frame(buf + at, at, left, &ln, label, err);
    if (rc) return rc;
    const uint8_t *d = buf + at + 12;
    uint32_t want = dt_crc32c_unmask(dt_get_u32(d + ln)), got = dt_crc32c(0, d, (size_t)ln);
    if (want != got) return data_crc_mismatch(at, want, got, label, err);
    *data = d;
    *len = (size_t)ln;
    *pos = at + (size_t)ln + DT_RECORD_OVERHEAD;
    return 1;
}

/* ---- Record by record from a file ------------------------------------------------------------ */

#define STREAM_CRC_ABOVE ((size_t)1 << 20) /* records larger than this: CRC checked before they are held */

struct dt_record_reader {
    int fd;                   /* -1: mem */
    const uint8_t *mem;
    uint64_t size, pos;
    uint8_t *buf;             /* the current record's data (grown to the largest one) */
    size_t cap;
    char *label;
};

static int reader_new(dt_record_reader **out, const char *label, dt_error *err) {
    dt_record_reader *r = dt_calloc(1, sizeof *r, "record reader", err);
    if (!r) return DT_ENOMEM;
    r->fd = -1;
    if (!(r->label = strdup(label))) {
        free(r);
        return dt_errorf(err, DT_ENOMEM, "out of memory for a file name");
    }
    *out = r;
    return 0;
}

int dt_record_reader_open(dt_record_reader **out, const char *path, dt_error *err) {
    *out = NULL;
    struct stat st;
    int fd = dt_open_regular(path, 0, &st, err);
    if (fd < 0) return fd;
    int rc = reader_new(out, path, err);
    if (rc) {
        close(fd);
        return rc;
    }
    (*out)->fd = fd;
    (*out)->size = (uint64_t)st.st_size; /* a file still being written is read as it was here */
    return 0;
}

int dt_record_reader_open_memory(dt_record_reader **out, const uint8_t *buf, size_t n, const char *label,
                                 dt_error *err) {
    *out = NULL;
    int rc = reader_new(out, label, err);
    if (rc) return rc;
    (*out)->mem = buf;
    (*out)->size = n;
    return 0;
}

void dt_record_reader_close(dt_record_reader *r) {
    if (!r) return;
    if (r->fd >= 0) close(r->fd);
    free(r->buf);
    free(r->label);
    free(r);
}

static int reader_read(dt_record_reader *r, uint64_t at, void *out, size_t n, dt_error *err) {
    return dt_read_at(r->fd, r->mem, at, out, n, r->label, err);
}

static int reader_reserve(dt_record_reader *r, size_t n, dt_error *err) {
    if (n <= r->cap) return 0;
    uint8_t *b = realloc(r->buf, n);
    if (!b) return dt_errorf(err, DT_ENOMEM, "%s: out of memory for a record of %zu bytes", r->label, n);
    r->buf = b;
    r->cap = n;
    return 0;
}

int dt_record_reader_next(dt_record_reader *r, const uint8_t **data, size_t *len, uint64_t *offset, dt_error *err) {
    uint64_t at = r->pos;
    if (at >= r->size) return 0;
    uint64_t left = r->size - at;
    if (left < 12)
        return dt_errorf(err, DT_EFORMAT, "%s: record at offset %" PRIu64 ": truncated framing (%" PRIu64 " of 12 bytes)",
                         r->label, at, left);
    uint8_t hdr[12], tail[4];
    uint64_t ln = 0;
    int rc = reader_read(r, at, hdr, 12, err);
    if (!rc) rc = check_frame(hdr, (size_t)at, left, &ln, r->label, err);
    if (!rc) rc = reader_read(r, at + 12 + ln, tail, 4, err);
    if (rc) return rc;
    uint32_t want = dt_crc32c_unmask(dt_get_u32(tail)), got = 0;
    if (ln > STREAM_CRC_ABOVE) {
        /* A large record is checked through a fixed buffer before it is held whole: a damaged or
         * hostile length costs reading, not memory. */
        if ((rc = reader_reserve(r, STREAM_CRC_ABOVE, err))) return rc;
        for (uint64_t k = 0; k < ln;) {
            size_t m = ln - k < STREAM_CRC_ABOVE ? (size_t)(ln - k) : STREAM_CRC_ABOVE;
            if ((rc = reader_read(r, at + 12 + k, r->buf, m, err))) return rc;
            got = dt_crc32c(got, r->buf, m);
            k += m;
        }
        if (want != got) return data_crc_mismatch((size_t)at, want, got, r->label, err);
    }
    if ((rc = reader_reserve(r, ln ? (size_t)ln : 1, err))) return rc;
    if ((rc = reader_read(r, at + 12, r->buf, (size_t)ln, err))) return rc;
    got = dt_crc32c(0, r->buf, (size_t)ln);
    if (want != got) return data_crc_mismatch((size_t)at, want, got, r->label, err);
    *data = r->buf;
    *len = (size_t)ln;
    if (offset) *offset = at;
    r->pos = at + ln + DT_RECORD_OVERHEAD;
    return 1;
}

static char *dup_str(const char *s, dt_error *err) {
    size_t n = strlen(s);
    char *d = dt_malloc(n + 1, "event string", err);
    if (d) memcpy(d, s, n + 1);
    return d;
}

void dt_event_free(dt_event *e) {
    if (!e) return;
    free(e->file_version);
    for (int i = 0; i < e->n_values; i++) free(e->values[i].tag);
    free(e->values);
    memset(e, 0, sizeof *e);
}

int dt_event_decode(dt_event *out, const uint8_t *data, size_t len, dt_error *err) {
    memset(out, 0, sizeof *out);
    Dtrain__Tb__Event *ev = dtrain__tb__event__unpack(NULL, len, data);
    if (!ev) return dt_errorf(err, DT_EFORMAT, "event record of %zu bytes is not a valid Event protobuf", len);
    int rc = 0;
    out->wall_time = ev->wall_time;
    out->step = ev->step;
    if (ev->what_case == DTRAIN__TB__EVENT__WHAT_FILE_VERSION) {
        out->kind = DT_EVENT_KIND_FILE_VERSION;
        if (!(out->file_version = dup_str(ev->file_version ? ev->file_version : "", err))) rc = DT_ENOMEM;
    } else if (ev->what_case == DTRAIN__TB__EVENT__WHAT_SUMMARY && ev->summary) {
        out->kind = DT_EVENT_KIND_SUMMARY;
        size_t nv = ev->summary->n_value;
        out->values = dt_calloc(nv ? nv : 1, sizeof *out->values, "event values", err);
        if (!out->values) rc = DT_ENOMEM;
        for (size_t i = 0; i < nv && !rc; i++) {
            const Dtrain__Tb__Summary__Value *v = ev->summary->value[i];
            dt_event_value *o = &out->values[out->n_values];
            if (!(o->tag = dup_str(v->tag ? v->tag : "", err))) {
                rc = DT_ENOMEM;
                break;
            }
            out->n_values++;
            o->has_simple_value = v->value_case == DTRAIN__TB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
            o->simple_value = o->has_simple_value ? v->simple_value : 0.0f;
        }
    }
    dtrain__tb__event__free_unpacked(ev, NULL);
    if (rc) dt_event_free(out);
    return rc;
}
