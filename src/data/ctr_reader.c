/* Streaming click logs (ctr.h): bytes from a plain or gzip file through one fixed buffer, split into
 * lines, each line assigned to a split by its number and to a shard by its position in the split,
 * and this reader's lines parsed into batches. Nothing grows with the file: a line longer than the
 * buffer is a bad line, skipped to its end without being kept. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "core/error.h"
#include "data/ctr.h"
#include "io/fsutil.h"

#define GZ_IN_BYTES (64 * 1024)
#define DEFAULT_BUFFER ((size_t)1 << 20)

struct dt_ctr_reader {
    char *path;
    dt_ctr_options opt;
    int fd, gz;
    /* gzip */
    z_stream zs;
    int zs_ready, member_done, in_eof;
    uint8_t *zin;
    /* text: bytes [beg, end) of buf not yet split into lines */
    char *buf;
    size_t cap, beg, end;
    int eof, discarding;
    /* where the pass is */
    int64_t line_no;             /* physical lines read in this pass */
    uint64_t pos;                /* lines of the split so far in this pass (its position counter) */
    int64_t epoch, index;        /* training: pass number, next global batch number */
    int64_t epoch_batches;       /* training: global batches completed in this pass */
    int64_t epoch_used;          /* training: of those, handed out or passed over by a seek */
    int64_t skip;                /* seek: global batches (training) or own positions (one pass) to pass over */
    int64_t count_epoch;         /* the pass whose bad lines are counted (-1: none parsed yet) */
    int done, emitted;
    dt_ctr_builder *b;
    uint64_t bad;
    char first_bad[512];
    uint64_t text_bytes;         /* text read so far, every pass (dt_ctr_bytes) */
};

/* ---- bytes in --------------------------------------------------------------------------------- */

static int read_plain(dt_ctr_reader *r, void *dst, size_t cap, size_t *got, dt_error *err) {
    for (;;) {
        ssize_t n = read(r->fd, dst, cap);
        if (n >= 0) {
            *got = (size_t)n;
            return 0;
        }
        if (errno != EINTR) return dt_errorf(err, DT_EIO, "%s: read error: %s", r->path, strerror(errno));
    }
}

static int gz_fill_input(dt_ctr_reader *r, dt_error *err) {
    if (r->zs.avail_in || r->in_eof) return 0;
    size_t got = 0;
    int rc = read_plain(r, r->zin, GZ_IN_BYTES, &got, err);
    if (rc) return rc;
    r->zs.next_in = r->zin, r->zs.avail_in = (uInt)got;
    r->in_eof = got == 0;
    return 0;
}

/* After a gzip member: another member (1f 8b) follows, or the file ends, or the bytes are junk. */
static int gz_next_member(dt_ctr_reader *r, int *finished, dt_error *err) {
    int rc = gz_fill_input(r, err);
    if (rc) return rc;
    if (!r->zs.avail_in) return *finished = 1, 0;
    if (r->zs.avail_in < 2 && !r->in_eof) {
        /* one byte left in the buffer: move it to the front and read more after it */
        r->zin[0] = r->zs.next_in[0];
        size_t got = 0;
        if ((rc = read_plain(r, r->zin + 1, GZ_IN_BYTES - 1, &got, err))) return rc;
        r->zs.next_in = r->zin, r->zs.avail_in = (uInt)(1 + got);
        r->in_eof = got == 0;
    }
    if (r->zs.avail_in < 2 || r->zs.next_in[0] != 0x1f || r->zs.next_in[1] != 0x8b)
        return dt_errorf(err, DT_EFORMAT, "%s: unexpected bytes after the gzip data (after line %lld)", r->path,
                         (long long)r->line_no);
    if (inflateReset(&r->zs) != Z_OK) return dt_errorf(err, DT_EFORMAT, "%s: corrupt gzip data", r->path);
    r->member_done = 0;
    return 0;
}

/* Up to cap decompressed bytes; *got == 0 only at the end of the data. */
static int read_gzip(dt_ctr_reader *r, void *dst, size_t cap, size_t *got, dt_error *err) {
    r->zs.next_out = dst, r->zs.avail_out = (uInt)(cap < UINT32_MAX ? cap : UINT32_MAX);
    while (r->zs.next_out == dst) {
        int rc, finished = 0;
        if (r->member_done) {
            if ((rc = gz_next_member(r, &finished, err))) return rc;
            if (finished) break;
        }
        if ((rc = gz_fill_input(r, err))) return rc;
        int z = inflate(&r->zs, Z_NO_FLUSH);
        if (z == Z_STREAM_END) r->member_done = 1;
        else if (z == Z_BUF_ERROR && !r->zs.avail_in && r->in_eof)
            return dt_errorf(err, DT_EFORMAT, "%s: the gzip stream is cut short (after line %lld)", r->path,
                             (long long)r->line_no);
        else if (z != Z_OK && z != Z_BUF_ERROR)
            return dt_errorf(err, DT_EFORMAT, "%s: corrupt gzip data after line %lld: %s", r->path,
                             (long long)r->line_no, r->zs.msg ? r->zs.msg : "inflate failed");
    }
    *got = (size_t)((uint8_t *)r->zs.next_out - (uint8_t *)dst);
    return 0;
}

static int read_text(dt_ctr_reader *r, char *dst, size_t cap, size_t *got, dt_error *err) {
    int rc = r->gz ? read_gzip(r, dst, cap, got, err) : read_plain(r, dst, cap, got, err);
    if (!rc) r->text_bytes += *got;
    return rc;
}

/* Back to the first byte of the file, for another pass. */
static int rewind_source(dt_ctr_reader *r, dt_error *err) {
    if (r->opt.memory) return r->line_no = 0, r->pos = 0, 0;
    if (lseek(r->fd, 0, SEEK_SET) != 0) return dt_errorf(err, DT_EIO, "%s: cannot seek: %s", r->path, strerror(errno));
    if (r->gz) {
        if (inflateReset(&r->zs) != Z_OK) return dt_errorf(err, DT_EFORMAT, "%s: corrupt gzip data", r->path);
        r->zs.avail_in = 0;
        r->member_done = r->in_eof = 0;
    }
    r->beg = r->end = 0;
    r->eof = r->discarding = 0;
    r->line_no = 0;
    r->pos = 0;
    return 0;
}

/* ---- lines ------------------------------------------------------------------------------------ */

/* Drops bytes up to and including the next '\n' (the rest of a line longer than the buffer). */
static int discard_to_newline(dt_ctr_reader *r, dt_error *err) {
    while (r->discarding) {
        char *nl = memchr(r->buf + r->beg, '\n', r->end - r->beg);
        if (nl) {
            r->beg = (size_t)(nl + 1 - r->buf);
            r->discarding = 0;
            break;
        }
        r->beg = r->end = 0;
        size_t got = 0;
        int rc = read_text(r, r->buf, r->cap, &got, err);
        if (rc) return rc;
        if (!got) r->eof = 1, r->discarding = 0;
        r->end = got;
    }
    return 0;
}

/* The next line (without its '\n') in *line, *len; returns 1, or 0 at the end of the file. A line
 * longer than the buffer comes back once with *too_long set, and its bytes are skipped. */
static int next_line(dt_ctr_reader *r, const char **line, size_t *len, int *too_long, dt_error *err) {
    if (r->opt.memory) { /* a row: its number is line_no's next value, nothing to read */
        *line = NULL, *len = 0, *too_long = 0;
        return r->line_no < r->opt.memory->n;
    }
    int rc = discard_to_newline(r, err);
    if (rc) return rc;
    *too_long = 0;
    for (;;) {
        char *s = r->buf + r->beg, *nl = memchr(s, '\n', r->end - r->beg);
        if (nl || (r->eof && r->end > r->beg)) {
            *line = s, *len = nl ? (size_t)(nl - s) : r->end - r->beg;
            r->beg = nl ? (size_t)(nl + 1 - r->buf) : r->end;
            return 1;
        }
        if (r->eof) return 0;
        if (r->beg) {
            memmove(r->buf, s, r->end - r->beg);
            r->end -= r->beg, r->beg = 0;
        }
        if (r->end == r->cap) {
            r->beg = r->end = 0;
            r->discarding = 1;
            *line = r->buf, *len = 0, *too_long = 1;
            return 1;
        }
        size_t got = 0;
        if ((rc = read_text(r, r->buf + r->end, r->cap - r->end, &got, err))) return rc;
        if (!got) r->eof = 1;
        r->end += got;
    }
}

static int blank(const char *s, size_t len) { return s && (len == 0 || (len == 1 && s[0] == '\r')); }

/* ---- opening ---------------------------------------------------------------------------------- */

void dt_ctr_options_init(dt_ctr_options *o) {
    memset(o, 0, sizeof *o);
    o->format = DT_CTR_AUTO;
    o->validation_fraction = 0.1, o->test_fraction = 0.1;
    o->split = DT_CTR_TRAIN;
    o->batch_size = 1024;
    o->training = 1;
    o->shard_index = 0, o->shard_count = 1;
    o->bad_lines = DT_BAD_IMAGES_SKIP;
}

static int check_options(const dt_ctr_options *o, const char *path, dt_error *err) {
    const char *why = NULL;
    if (o->format < DT_CTR_AUTO || o->format > DT_CTR_LIBFFM) why = "unknown format";
    else if (o->split < DT_CTR_TRAIN || o->split > DT_CTR_ALL) why = "unknown split";
    else if (!(o->validation_fraction >= 0 && o->test_fraction >= 0 && o->validation_fraction + o->test_fraction <= 1))
        why = "validation and test fractions must be >= 0 and add up to at most 1";
    else if (o->batch_size < 1) why = "batch size must be at least 1";
    else if (o->shard_count < 1 || o->shard_index < 0 || o->shard_index >= o->shard_count)
        why = "shard index must be in [0, shard count)";
    else if (o->buffer_bytes && (o->buffer_bytes < 4096 || o->buffer_bytes > ((size_t)1 << 30)))
        why = "buffer must be 4 KiB to 1 GiB";
    else if (o->fields < 0 || o->fields > DT_CTR_MAX_FIELDS) why = "libffm fields must be 1 to 1024 (0: 39)";
    else if (o->memory && (o->memory->n < 0 || o->memory->nnz < 0 || (o->memory->n && (!o->memory->labels || !o->memory->ids ||
                                                                          (o->memory->num_dense && !o->memory->dense)))))
        why = "arrays missing or of a negative size";
    return why ? dt_errorf(err, DT_EINVAL, "%s: %s", path, why) : 0;
}

static int open_source(dt_ctr_reader *r, dt_error *err) {
    int fd = dt_open_regular(r->path, 0, NULL, err);
    if (fd < 0) return fd;
    r->fd = fd;
    uint8_t magic[2];
    r->gz = dt_pread_full(fd, magic, 2, 0) == 0 && magic[0] == 0x1f && magic[1] == 0x8b;
    if (!r->gz) return 0;
    r->zin = dt_malloc(GZ_IN_BYTES, "gzip input buffer", err);
    if (!r->zin) return DT_ENOMEM;
    if (inflateInit2(&r->zs, 16 + MAX_WBITS) != Z_OK)
        return dt_errorf(err, DT_ENOMEM, "%s: cannot start gzip decompression", r->path);
    r->zs_ready = 1;
    return 0;
}

/* DT_CTR_AUTO: libffm if the first non-blank line has a ':' (every field:id:value token does, no
 * Criteo column can), Criteo otherwise. Reads the start of the file, then goes back to its start. */
static int detect_format(dt_ctr_reader *r, dt_error *err) {
    const char *line;
    size_t len;
    int too_long, rc;
    r->opt.format = DT_CTR_CRITEO;
    while ((rc = next_line(r, &line, &len, &too_long, err)) == 1) {
        if (too_long || blank(line, len)) continue;
        if (memchr(line, ':', len)) r->opt.format = DT_CTR_LIBFFM;
        break;
    }
    if (rc < 0) return rc;
    return rewind_source(r, err);
}

int dt_ctr_open(dt_ctr_reader **out, const char *path, const dt_ctr_options *o, dt_error *err) {
    *out = NULL;
    int rc = check_options(o, path, err);
    if (rc) return rc;
    dt_ctr_reader *r = dt_calloc(1, sizeof *r, "click-log reader", err);
    if (!r) return DT_ENOMEM;
    r->fd = -1;
    r->opt = *o;
    r->count_epoch = -1;
    r->cap = o->memory ? 1 : o->buffer_bytes ? o->buffer_bytes : DEFAULT_BUFFER;
    if (!r->opt.fields) r->opt.fields = DT_LIBFFM_DEFAULT_FIELDS;
    if (!(r->path = strdup(path)) || !(r->buf = dt_malloc(r->cap, "click-log text buffer", err))) {
        rc = r->path ? DT_ENOMEM : dt_errorf(err, DT_ENOMEM, "out of memory opening %s", path);
    }
    if (o->memory) {
        r->opt.format = DT_CTR_MEMORY, r->opt.fields = o->memory->num_fields;
        if (!rc) rc = dt_ctr_builder_create_memory(&r->b, o->memory, o->batch_size, err);
    } else {
        if (!rc) rc = open_source(r, err);
        if (!rc && r->opt.format == DT_CTR_AUTO) rc = detect_format(r, err);
        if (!rc) rc = dt_ctr_builder_create(&r->b, r->opt.format, r->opt.fields, o->batch_size, err);
    }
    if (rc) {
        dt_ctr_close(r);
        return rc;
    }
    *out = r;
    return 0;
}

void dt_ctr_close(dt_ctr_reader *r) {
    if (!r) return;
    if (r->zs_ready) inflateEnd(&r->zs);
    if (r->fd >= 0) close(r->fd);
    dt_ctr_builder_free(r->b);
    free(r->zin);
    free(r->buf);
    free(r->path);
    free(r);
}

dt_ctr_format dt_ctr_reader_format(const dt_ctr_reader *r) { return r->opt.format; }
uint64_t dt_ctr_bad_count(const dt_ctr_reader *r) { return r->bad; }
uint64_t dt_ctr_bytes(const dt_ctr_reader *r) { return r->text_bytes; }
const char *dt_ctr_first_bad(const dt_ctr_reader *r) { return r->first_bad; }

/* ---- batches ---------------------------------------------------------------------------------- */

/* Parses one of this reader's lines into the batch; a bad line is counted and left out (skip) or
 * is the error (fail). Bad lines are counted in one pass only, the first this reader parses, so
 * each is counted once however many epochs meet it. */
static int take(dt_ctr_reader *r, const char *line, size_t len, int too_long, dt_error *err) {
    char why[256];
    int rc;
    if (r->count_epoch < 0) r->count_epoch = r->epoch;
    if (too_long) {
        snprintf(why, sizeof why, "line longer than the %zu-byte buffer", r->cap);
        rc = DT_EFORMAT;
    } else if (r->opt.memory) {
        rc = dt_ctr_builder_add_row(r->b, r->opt.memory, r->line_no - 1, why, sizeof why, err);
    } else {
        rc = dt_ctr_builder_add(r->b, line, len, r->line_no, why, sizeof why, err);
    }
    if (rc != DT_EFORMAT) return rc;
    if (r->opt.bad_lines == DT_BAD_IMAGES_FAIL)
        return dt_errorf(err, DT_EFORMAT, "%s:%lld: %s", r->path, (long long)r->line_no, why);
    if (r->epoch == r->count_epoch) {
        if (!r->bad++) snprintf(r->first_bad, sizeof r->first_bad, "%s:%lld: %s", r->path, (long long)r->line_no, why);
    }
    return 0;
}

static void emit(dt_ctr_reader *r, dt_ctr_batch *b) {
    dt_ctr_builder_batch(r->b, b);
    b->epoch = r->epoch, b->index = r->index++;
    r->emitted = 1;
}

/* Training order, a global batch just completed: 1 if it is handed out (this shard has rows). */
static int global_batch_done(dt_ctr_reader *r, dt_ctr_batch *b) {
    r->epoch_batches++;
    if (r->skip > 0 || dt_ctr_builder_rows(r->b) == 0) { /* sought past it, or all its lines bad */
        if (r->skip > 0) r->skip--, r->epoch_used++;
        r->index++;
        dt_ctr_builder_clear(r->b);
        return 0;
    }
    emit(r, b);
    r->epoch_used++;
    return 1;
}

/* The end of the file in training order: the unfinished global batch is dropped and the next epoch
 * starts from the first line. A pass that completed no global batch would loop forever: an error. */
static int training_pass_end(dt_ctr_reader *r, dt_error *err) {
    dt_ctr_builder_clear(r->b);
    int64_t F = r->epoch_batches;
    if (F == 0) {
        static const char *names[] = {"training", "validation", "test", "whole"};
        return dt_errorf(err, DT_EFORMAT,
                         "%s: the %s split has %llu lines, fewer than one global batch (%d shards x %d)", r->path,
                         names[r->opt.split], (unsigned long long)r->pos, r->opt.shard_count, r->opt.batch_size);
    }
    if (r->epoch_used == 0) /* every line of this shard bad: another pass would find none either */
        return dt_errorf(err, DT_EFORMAT, "%s: shard %d of %d has no good line in a whole pass (%llu bad lines; first: %s)",
                         r->path, r->opt.shard_index, r->opt.shard_count, (unsigned long long)r->bad, r->first_bad);
    r->epoch++;
    if (r->skip >= F) { /* a seek past whole epochs: no need to read them */
        r->epoch += r->skip / F;
        r->index += r->skip / F * F;
        r->skip %= F;
    }
    r->epoch_batches = r->epoch_used = 0;
    return rewind_source(r, err);
}

/* One line of the file: its split, its shard, and what its position completes. Returns 1 when a
 * batch is ready in *b. */
static int one_line(dt_ctr_reader *r, const char *line, size_t len, int too_long, dt_ctr_batch *b, dt_error *err) {
    const dt_ctr_options *o = &r->opt;
    r->line_no++;
    if (!too_long && blank(line, len)) return 0;
    if (o->split != DT_CTR_ALL && dt_ctr_line_split(r->line_no, o->validation_fraction, o->test_fraction) != o->split)
        return 0;
    uint64_t pos = r->pos++, n = (uint64_t)o->shard_count;
    int rc;
    if (pos % n == (uint64_t)o->shard_index) {
        if (!o->training && r->skip > 0) r->skip--;
        else if (!(o->training && r->skip > 0) && (rc = take(r, line, len, too_long, err))) return rc;
    }
    if (o->training) return (pos + 1) % (n * (uint64_t)o->batch_size) == 0 && global_batch_done(r, b);
    if (dt_ctr_builder_rows(r->b) == o->batch_size) return emit(r, b), 1;
    return 0;
}

int dt_ctr_next(dt_ctr_reader *r, dt_ctr_batch *b, dt_error *err) {
    if (r->emitted) dt_ctr_builder_clear(r->b), r->emitted = 0;
    memset(b, 0, sizeof *b);
    while (!r->done) {
        const char *line;
        size_t len;
        int too_long, rc = next_line(r, &line, &len, &too_long, err);
        if (rc < 0) return rc;
        if (rc == 1) {
            if ((rc = one_line(r, line, len, too_long, b, err))) return rc < 0 ? rc : 0;
            continue;
        }
        if (r->opt.training) {
            if ((rc = training_pass_end(r, err))) return rc;
            continue;
        }
        r->done = 1; /* one pass: the short last batch, then nothing */
        if (dt_ctr_builder_rows(r->b)) return emit(r, b), 0;
    }
    dt_ctr_builder_batch(r->b, b);
    b->n = 0;
    return 0;
}

int dt_ctr_count(dt_ctr_reader *r, uint64_t *positions, int (*progress)(void *user, uint64_t so_far), void *user,
                 dt_error *err) {
    int rc = rewind_source(r, err);
    uint64_t n = 0;
    while (!rc) {
        const char *line;
        size_t len;
        int too_long;
        if ((rc = next_line(r, &line, &len, &too_long, err)) <= 0) break;
        rc = 0;
        r->line_no++;
        if (progress && !(r->line_no & 0xffff) && progress(user, n))
            return dt_errorf(err, DT_EINTR, "%s: counting stopped", r->path);
        if (!too_long && blank(line, len)) continue;
        n += r->opt.split == DT_CTR_ALL ||
             dt_ctr_line_split(r->line_no, r->opt.validation_fraction, r->opt.test_fraction) == r->opt.split;
    }
    if (rc < 0) return rc;
    *positions = n;
    if (progress) progress(user, n);
    return dt_ctr_seek(r, 0, err);
}

int dt_ctr_seek(dt_ctr_reader *r, int64_t index, dt_error *err) {
    if (index < 0) return dt_errorf(err, DT_EINVAL, "%s: seek to batch %lld", r->path, (long long)index);
    dt_ctr_builder_clear(r->b);
    r->emitted = r->done = 0;
    r->epoch = r->index = r->epoch_batches = r->epoch_used = 0;
    /* One pass: the positions of `index` full batches (bad lines there are not seen again). */
    r->skip = r->opt.training ? index : index * r->opt.batch_size;
    return rewind_source(r, err);
}
