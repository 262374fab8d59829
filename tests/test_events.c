/* TensorBoard event files: CRC-32C against published check values, the writer's bytes against the
 * known-good record in REFERENCE.md, and every record of a written file decoded twice: by a minimal
 * protobuf wire reader here (so field numbers and wire types are really checked) and by the
 * library's reader. Damaged files must be refused with the offset at fault. */
#include <dirent.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/crc32c.h"
#include "io/events.h"
#include "io/fsutil.h"
#include "test.h"

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(p);
}
static void rm_tree(const char *dir) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static char *make_tmpdir(void) {
    static char buf[64];
    strcpy(buf, "/tmp/dtrain_events_XXXXXX");
    return mkdtemp(buf);
}

/* Bit-at-a-time CRC-32C: the definition, to check the table-driven one against. */
static uint32_t crc_ref(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}

static void test_crc32c(void) {
    CHECK(dt_crc32c(0, "123456789", 9) == 0xE3069283u);
    /* RFC 3720 (iSCSI) appendix B.4 vectors. */
    uint8_t buf[32];
    memset(buf, 0, 32);
    CHECK(dt_crc32c(0, buf, 32) == 0x8A9136AAu);
    memset(buf, 0xff, 32);
    CHECK(dt_crc32c(0, buf, 32) == 0x62A8AB43u);
    for (int i = 0; i < 32; i++) buf[i] = (uint8_t)i;
    CHECK(dt_crc32c(0, buf, 32) == 0x46DD794Eu);
    CHECK(dt_crc32c(0, "", 0) == 0);
    /* Every length and alignment up to 200 bytes agrees with the bitwise definition, and
     * extending a CRC piece by piece equals the CRC of the whole. */
    uint8_t big[256];
    for (int i = 0; i < 256; i++) big[i] = (uint8_t)(i * 131 + 7);
    int bad = 0;
    for (size_t off = 0; off < 9; off++)
        for (size_t n = 0; n < 200; n++) {
            uint32_t want = crc_ref(big + off, n);
            if (dt_crc32c(0, big + off, n) != want) bad++;
            size_t cut = n / 3;
            if (dt_crc32c(dt_crc32c(0, big + off, cut), big + off + cut, n - cut) != want) bad++;
        }
    CHECK_MSG(bad == 0, "%d mismatches against the bitwise CRC", bad);
    /* TensorFlow's mask, by its formula, and its inverse. */
    uint32_t c = 0xE3069283u;
    CHECK(dt_crc32c_mask(c) == (uint32_t)(((c >> 15) | (c << 17)) + 0xa282ead8u));
    CHECK(dt_crc32c_unmask(dt_crc32c_mask(c)) == c);
    CHECK(dt_crc32c_unmask(dt_crc32c_mask(0)) == 0);
}

/* The only file in dir whose name starts with prefix; returns its path in out. */
static int find_file(const char *dir, const char *prefix, char *out, size_t cap) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int found = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
            found++;
            snprintf(out, cap, "%s/%s", dir, e->d_name);
        }
    closedir(d);
    return found;
}

static void test_known_good_bytes(void) {
    static const uint8_t want[40] = {0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xa3, 0x7f,
                                     0x4b, 0x22, 0x09, 0x00, 0x00, 0x00, 0xc0, 0x0b, 0x5a, 0xd6,
                                     0x41, 0x1a, 0x0d, 0x62, 0x72, 0x61, 0x69, 0x6e, 0x2e, 0x45,
                                     0x76, 0x65, 0x6e, 0x74, 0x3a, 0x32, 0x4c, 0xa9, 0xa4, 0x64};
    char *dir = make_tmpdir();
    CHECK(dir != NULL);
    if (!dir) return;
    dt_event_writer *w;
    dt_error err = {0};
    CHECK(dt_event_writer_open(&w, dir, 1500000000.0, &err) == 0);
    if (!w) return;
    char host[256] = {0}, expect[600];
    gethostname(host, sizeof host - 1);
    snprintf(expect, sizeof expect, "%s/events.out.tfevents.1500000000.%s", dir, host);
    CHECK_MSG(strcmp(dt_event_writer_path(w), expect) == 0, "path %s, expected %s", dt_event_writer_path(w), expect);
    /* The first record is on disk as soon as open returns (TensorBoard can pick the file up). */
    uint8_t *bytes;
    size_t n;
    CHECK(dt_read_file(&bytes, &n, dt_event_writer_path(w), 1 << 20, &err) == 0);
    CHECK(n == sizeof want && memcmp(bytes, want, sizeof want) == 0);
    free(bytes);
    CHECK(dt_event_writer_close(w, &err) == 0);
    rm_tree(dir);
}

/* ---- A minimal protobuf wire reader ---------------------------------------------------------- */

typedef struct {
    const uint8_t *p, *end;
    int bad;
} wire;

static uint64_t varint(wire *w) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (w->p >= w->end) break;
        uint8_t b = *w->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return v;
    }
    w->bad = 1;
    return 0;
}

/* Next field: returns 0 at the end; sets field number and wire type. */
static int next_field(wire *w, int *field, int *type) {
    if (w->p >= w->end || w->bad) return 0;
    uint64_t key = varint(w);
    *field = (int)(key >> 3);
    *type = (int)(key & 7);
    return !w->bad;
}

static const uint8_t *take(wire *w, size_t n) {
    if ((size_t)(w->end - w->p) < n) {
        w->bad = 1;
        return NULL;
    }
    const uint8_t *q = w->p;
    w->p += n;
    return q;
}

typedef struct {
    double wall_time;
    int64_t step;
    int has_version, n_values;
    char version[64], tag[8][64];
    float value[8];
    int unexpected;          /* a field number or wire type TensorFlow does not use here */
} decoded;

static void decode_value(const uint8_t *p, size_t n, decoded *d) {
    wire w = {p, p + n, 0};
    int f, t, i = d->n_values < 8 ? d->n_values : 7;
    d->n_values++;
    while (next_field(&w, &f, &t)) {
        if (f == 1 && t == 2) { /* tag: string */
            size_t len = (size_t)varint(&w);
            const uint8_t *s = take(&w, len);
            if (s && len < 64) memcpy(d->tag[i], s, len), d->tag[i][len] = 0;
        } else if (f == 2 && t == 5) { /* simple_value: float, fixed32 LE */
            const uint8_t *s = take(&w, 4);
            uint32_t bits = s ? (uint32_t)s[0] | (uint32_t)s[1] << 8 | (uint32_t)s[2] << 16 | (uint32_t)s[3] << 24 : 0;
            memcpy(&d->value[i], &bits, 4);
        } else {
            d->unexpected++;
            return;
        }
    }
    if (w.bad) d->unexpected++;
}

static void decode_event(const uint8_t *p, size_t n, decoded *d) {
    memset(d, 0, sizeof *d);
    wire w = {p, p + n, 0};
    int f, t;
    while (next_field(&w, &f, &t)) {
        if (f == 1 && t == 1) { /* wall_time: double, fixed64 LE */
            const uint8_t *s = take(&w, 8);
            uint64_t bits = 0;
            for (int k = 7; s && k >= 0; k--) bits = bits << 8 | s[k];
            memcpy(&d->wall_time, &bits, 8);
        } else if (f == 2 && t == 0) { /* step: int64 varint */
            d->step = (int64_t)varint(&w);
        } else if (f == 3 && t == 2) { /* file_version: string */
            size_t len = (size_t)varint(&w);
            const uint8_t *s = take(&w, len);
            if (s && len < 64) memcpy(d->version, s, len), d->version[len] = 0, d->has_version = 1;
        } else if (f == 5 && t == 2) { /* summary: Summary { repeated Value value = 1; } */
            size_t len = (size_t)varint(&w);
            const uint8_t *s = take(&w, len);
            if (!s) break;
            wire sw = {s, s + len, 0};
            int sf, st;
            while (next_field(&sw, &sf, &st)) {
                if (sf != 1 || st != 2) {
                    d->unexpected++;
                    break;
                }
                size_t vl = (size_t)varint(&sw);
                const uint8_t *v = take(&sw, vl);
                if (v) decode_value(v, vl, d);
            }
            if (sw.bad) d->unexpected++;
        } else {
            d->unexpected++;
            return;
        }
    }
    if (w.bad) d->unexpected++;
}

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--) v = v << 8 | p[k];
    return v;
}
static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static const struct {
    const char *tag;
    int64_t step;
    float value;
    double wall;
} scalars[] = {
    {"cost", 0, 2.3025851f, 1700000000.25},
    {"accuracy", 100, 0.8125f, 1700000001.5},
    {"global_step/sec", 100, 41.5f, 1700000001.5},
    {"examples/sec", 4611686018427387904LL, -0.0f, 1700000002.0},
    {"cost", 1, -1e-30f, 1700000003.0},
};
#define N_SCALARS ((int)(sizeof scalars / sizeof scalars[0]))

static int write_sample(const char *dir, char *path, size_t cap) {
    dt_event_writer *w;
    dt_error err = {0};
    if (dt_event_writer_open(&w, dir, 1700000000.0, &err)) return 0;
    int ok = 1;
    for (int i = 0; i < N_SCALARS; i++)
        ok &= dt_event_add_scalar(w, scalars[i].tag, scalars[i].step, scalars[i].value, scalars[i].wall, &err) == 0;
    ok &= dt_event_writer_flush(w, &err) == 0;
    snprintf(path, cap, "%s", dt_event_writer_path(w));
    ok &= dt_event_writer_close(w, &err) == 0;
    return ok;
}

static void test_decode_every_record(void) {
    char *dir = make_tmpdir(), sub[256], path[1024];
    if (!dir) return;
    snprintf(sub, sizeof sub, "%s/summary_log/train", dir); /* parents are created */
    CHECK(write_sample(sub, path, sizeof path));
    uint8_t *buf;
    size_t n;
    dt_error err = {0};
    CHECK(dt_read_file(&buf, &n, path, 1 << 20, &err) == 0);
    if (!buf) return;

    /* Framing, by hand: length, masked CRC of the 8 length bytes, data, masked CRC of the data. */
    size_t at = 0;
    int rec = 0;
    while (at + 12 <= n) {
        uint64_t len = le64(buf + at);
        CHECK(dt_crc32c_unmask(le32(buf + at + 8)) == crc_ref(buf + at, 8));
        CHECK(le32(buf + at + 8) == dt_crc32c_mask(crc_ref(buf + at, 8)));
        if (at + 16 + len > n) break;
        const uint8_t *data = buf + at + 12;
        CHECK(le32(data + len) == dt_crc32c_mask(crc_ref(data, len)));
        decoded d;
        decode_event(data, len, &d);
        CHECK_MSG(d.unexpected == 0, "record %d: unexpected field numbers or wire types", rec);
        if (rec == 0) {
            CHECK(d.has_version && strcmp(d.version, "brain.Event:2") == 0);
            CHECK(d.wall_time == 1700000000.0 && d.step == 0 && d.n_values == 0);
        } else if (rec <= N_SCALARS) {
            int i = rec - 1;
            CHECK(!d.has_version && d.n_values == 1);
            CHECK_MSG(strcmp(d.tag[0], scalars[i].tag) == 0, "record %d tag %s", rec, d.tag[0]);
            CHECK(d.step == scalars[i].step);
            CHECK(memcmp(&d.value[0], &scalars[i].value, 4) == 0); /* bit-exact, -0.0 included */
            CHECK(d.wall_time == scalars[i].wall);
        }
        at += 16 + len;
        rec++;
    }
    CHECK(at == n);
    CHECK(rec == 1 + N_SCALARS);

    /* The library's reader sees the same records. */
    size_t pos = 0;
    const uint8_t *data;
    size_t len;
    int k = 0, rc;
    while ((rc = dt_record_next(buf, n, &pos, &data, &len, path, &err)) == 1) {
        dt_event ev;
        CHECK(dt_event_decode(&ev, data, len, &err) == 0);
        if (k == 0) {
            CHECK(ev.kind == DT_EVENT_KIND_FILE_VERSION && strcmp(ev.file_version, DT_EVENT_FILE_VERSION) == 0);
        } else {
            int i = k - 1;
            CHECK(ev.kind == DT_EVENT_KIND_SUMMARY && ev.n_values == 1);
            CHECK(ev.n_values == 1 && strcmp(ev.values[0].tag, scalars[i].tag) == 0 && ev.values[0].has_simple_value &&
                  memcmp(&ev.values[0].simple_value, &scalars[i].value, 4) == 0);
            CHECK(ev.step == scalars[i].step && ev.wall_time == scalars[i].wall);
        }
        dt_event_free(&ev);
        k++;
    }
    CHECK(rc == 0 && k == 1 + N_SCALARS && pos == n);
    free(buf);
    rm_tree(dir);
}

/* Copies the sample, drops its last `cut` bytes and flips bit 0 of byte flip_at (if in range); the
 * reader must refuse the copy with a message containing msg. */
static void expect_refusal(const uint8_t *orig, size_t n, size_t cut, size_t flip_at, const char *msg) {
    uint8_t *b = malloc(n);
    memcpy(b, orig, n);
    if (flip_at < n) b[flip_at] ^= 0x01;
    size_t pos = 0, len;
    const uint8_t *data;
    dt_error err = {0};
    int rc, k = 0;
    while ((rc = dt_record_next(b, n - cut, &pos, &data, &len, "sample", &err)) == 1) k++;
    CHECK_MSG(rc == DT_EFORMAT, "damage at %zu (cut %zu) was accepted", flip_at, cut);
    if (rc == DT_EFORMAT) CHECK_CONTAINS(err.msg, msg);
    free(b);
}

static void test_damaged_records(void) {
    char *dir = make_tmpdir(), path[1024];
    if (!dir) return;
    CHECK(write_sample(dir, path, sizeof path));
    uint8_t *buf;
    size_t n;
    dt_error err = {0};
    CHECK(dt_read_file(&buf, &n, path, 1 << 20, &err) == 0);
    if (!buf) return;
    size_t second = 40; /* the first record is 40 bytes (24 bytes of data) */
    expect_refusal(buf, n, 0, second + 2, "length CRC mismatch");
    expect_refusal(buf, n, 0, second + 9, "length CRC mismatch");
    expect_refusal(buf, n, 0, second + 14, "data CRC mismatch");
    expect_refusal(buf, n, 0, n - 1, "data CRC mismatch");
    expect_refusal(buf, n, 1, (size_t)-1, "truncated");
    expect_refusal(buf, n, n - second - 5, (size_t)-1, "truncated framing");
    char at_msg[64];
    snprintf(at_msg, sizeof at_msg, "record at offset %zu", second);
    expect_refusal(buf, n, 0, second + 20, at_msg);

    /* A length with a valid CRC but beyond the bound is refused before anything is read. */
    uint8_t huge[16] = {0};
    uint64_t big = (uint64_t)1 << 40;
    for (int i = 0; i < 8; i++) huge[i] = (uint8_t)(big >> (8 * i));
    uint32_t m = dt_crc32c_mask(dt_crc32c(0, huge, 8));
    for (int i = 0; i < 4; i++) huge[8 + i] = (uint8_t)(m >> (8 * i));
    size_t pos = 0, len;
    const uint8_t *data;
    CHECK(dt_record_next(huge, sizeof huge, &pos, &data, &len, "huge", &err) == DT_EFORMAT);
    CHECK_CONTAINS(err.msg, "exceeds");

    /* An empty file has no records and is not an error. */
    pos = 0;
    CHECK(dt_record_next(buf, 0, &pos, &data, &len, "empty", &err) == 0);
    free(buf);
    rm_tree(dir);
}

static void test_writer_refusals_and_names(void) {
    char *dir = make_tmpdir();
    if (!dir) return;
    dt_error err = {0};
    dt_event_writer *a, *b;
    /* Two writers in the same second do not share (or truncate) one file. */
    CHECK(dt_event_writer_open(&a, dir, 1600000000.5, &err) == 0);
    CHECK(dt_event_writer_open(&b, dir, 1600000000.9, &err) == 0);
    CHECK(strcmp(dt_event_writer_path(a), dt_event_writer_path(b)) != 0);
    CHECK(strstr(dt_event_writer_path(b), "events.out.tfevents.1600000000.") != NULL);
    CHECK(dt_event_add_scalar(a, "", 1, 1.0f, 1.0, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "tag");
    char long_tag[DT_EVENT_MAX_TAG + 2];
    memset(long_tag, 'x', sizeof long_tag - 1);
    long_tag[sizeof long_tag - 1] = 0;
    CHECK(dt_event_add_scalar(a, long_tag, 1, 1.0f, 1.0, &err) == DT_EINVAL);
    CHECK(dt_event_writer_close(a, &err) == 0);
    CHECK(dt_event_writer_close(b, &err) == 0);
    char p[512];
    CHECK(find_file(dir, "events.out.tfevents.1600000000.", p, sizeof p) == 2);
    /* A folder that cannot be created (a file is in the way) is an error naming it. */
    char blocked[512];
    snprintf(blocked, sizeof blocked, "%s/file/sub", dir);
    snprintf(p, sizeof p, "%s/file", dir);
    FILE *f = fopen(p, "w");
    if (f) fclose(f);
    CHECK(dt_event_writer_open(&a, blocked, 1.0, &err) == DT_EIO);
    CHECK_CONTAINS(err.msg, "file/sub");
    CHECK(dt_event_writer_open(&a, dir, -5.0, &err) == DT_EINVAL);
    rm_tree(dir);
}

int main(void) {
    RUN(test_crc32c);
    RUN(test_known_good_bytes);
    RUN(test_decode_every_record);
    RUN(test_damaged_records);
    RUN(test_writer_refusals_and_names);
    return test_summary();
}
