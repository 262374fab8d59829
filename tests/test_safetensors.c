/* safetensors: round trip through the writer and reader, the header read back here with jansson
 * (layout, alignment, offsets), every refusal of a damaged or malformed file, and atomic writes.
 * `test_safetensors --write PATH` writes the sample that tests/safetensors_load.py checks. */
#include <dirent.h>
#include <ftw.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/crc32c.h"
#include "io/fsutil.h"
#include "io/safetensors.h"
#include "test.h"

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(p);
}
static void rm_tree(const char *dir) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static char *make_tmpdir(void) {
    static char buf[64];
    strcpy(buf, "/tmp/dtrain_st_XXXXXX");
    return mkdtemp(buf);
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    if (d) closedir(d);
    return n;
}

/* ---- The sample (tests/safetensors_load.py computes the same values) -------------------------- */

#define K_N (3 * 3 * 1 * 4)
#define B_N 10
static float kernel[K_N], adam_m[K_N], bias[B_N];
static int64_t global_step = 1234567890123LL;
static const char *model_text = "# a model\nconv 3x3x4 \"same\" relu\ndense 10 # \xc3\xa9t\xc3\xa9\n";

static void fill_sample(void) {
    for (int i = 0; i < K_N; i++) kernel[i] = (float)(i % 17) * 0.5f - 3.0f;
    for (int i = 0; i < K_N; i++) adam_m[i] = (float)i * 1e-3f;
    for (int i = 0; i < B_N; i++) bias[i] = (float)i / 8.0f;
}

static int write_sample(const char *path, dt_error *err) {
    fill_sample();
    dt_st_tensor t[] = {
        {"conv1/kernel", DT_ST_F32, 4, {3, 3, 1, 4}, kernel},
        {"conv1/kernel/adam_m", DT_ST_F32, 4, {3, 3, 1, 4}, adam_m},
        {"dense1/bias", DT_ST_F32, 1, {B_N}, bias},
        {"global_step", DT_ST_I64, 0, {0}, &global_step},
        {"empty", DT_ST_F32, 2, {0, 3}, NULL},
    };
    dt_st_meta m[] = {{"dtrain_version", "0.1.0"}, {"model", model_text}};
    return dt_st_write(path, t, 5, m, 2, err);
}

static void test_round_trip(void) {
    char *dir = make_tmpdir(), path[256];
    if (!dir) return;
    snprintf(path, sizeof path, "%s/model.ckpt-7.safetensors", dir);
    dt_error err = {0};
    CHECK_MSG(write_sample(path, &err) == 0, "%s", err.msg);
    CHECK(count_entries(dir) == 1); /* no temporary file left behind */

    dt_st_file *f;
    CHECK_MSG(dt_st_open(&f, path, &err) == 0, "%s", err.msg);
    if (!f) return;
    CHECK(dt_st_num_tensors(f) == 5);
    CHECK(dt_st_has_checksum(f));
    const dt_st_info *k = dt_st_find(f, "conv1/kernel");
    CHECK(k && k->dtype == DT_ST_F32 && k->ndim == 4 && k->shape[0] == 3 && k->shape[1] == 3 && k->shape[2] == 1 &&
          k->shape[3] == 4 && k->count == K_N && k->nbytes == 4 * K_N);
    /* Data-section order is the writer's order. */
    CHECK(dt_st_tensor_at(f, 0) && strcmp(dt_st_tensor_at(f, 0)->name, "conv1/kernel") == 0);
    CHECK(dt_st_tensor_at(f, 1) && strcmp(dt_st_tensor_at(f, 1)->name, "conv1/kernel/adam_m") == 0);
    CHECK(dt_st_find(f, "nope") == NULL);
    float got[K_N];
    CHECK(dt_st_read(f, "conv1/kernel", DT_ST_F32, got, K_N, &err) == 0);
    CHECK(memcmp(got, kernel, sizeof got) == 0);
    CHECK(dt_st_read(f, "conv1/kernel/adam_m", DT_ST_F32, got, K_N, &err) == 0);
    CHECK(memcmp(got, adam_m, sizeof got) == 0);
    float b[B_N];
    CHECK(dt_st_read(f, "dense1/bias", DT_ST_F32, b, B_N, &err) == 0);
    CHECK(memcmp(b, bias, sizeof b) == 0);
    int64_t step = 0;
    CHECK(dt_st_read(f, "global_step", DT_ST_I64, &step, 1, &err) == 0);
    CHECK(step == global_step);
    const dt_st_info *e = dt_st_find(f, "empty");
    CHECK(e && e->count == 0 && e->nbytes == 0 && e->ndim == 2);
    /* Wrong dtype or count is refused, naming the file and tensor. */
    CHECK(dt_st_read(f, "global_step", DT_ST_F32, got, 1, &err) == DT_EFORMAT);
    CHECK_CONTAINS(err.msg, "global_step");
    CHECK_CONTAINS(err.msg, path);
    CHECK(dt_st_read(f, "dense1/bias", DT_ST_F32, b, B_N - 1, &err) == DT_ESHAPE);
    CHECK(dt_st_read(f, "missing", DT_ST_F32, b, 1, &err) == DT_EFORMAT);
    CHECK_CONTAINS(err.msg, "missing");
    CHECK(dt_st_meta_get(f, "model") && strcmp(dt_st_meta_get(f, "model"), model_text) == 0);
    CHECK(dt_st_meta_get(f, "dtrain_version") && strcmp(dt_st_meta_get(f, "dtrain_version"), "0.1.0") == 0);
    CHECK(dt_st_num_meta(f) == 3);
    dt_st_close(f);

    /* The header, read back independently: 8-byte aligned, space-padded, offsets contiguous in the
     * writer's order, checksum = CRC-32C of everything after the header. */
    uint8_t *bytes;
    size_t n;
    CHECK(dt_read_file(&bytes, &n, path, 1 << 20, &err) == 0);
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--) hn = hn << 8 | bytes[i];
    CHECK(hn % 8 == 0 && 8 + hn <= n);
    CHECK(bytes[8] == '{');
    json_error_t je;
    json_t *root = json_loadb((const char *)bytes + 8, hn, 0, &je);
    CHECK(root != NULL);
    const char *names[] = {"conv1/kernel", "conv1/kernel/adam_m", "dense1/bias", "global_step", "empty"};
    long long want_end[] = {144, 288, 328, 336, 336}, prev = 0;
    for (int i = 0; root && i < 5; i++) {
        json_t *offs = json_object_get(json_object_get(root, names[i]), "data_offsets");
        CHECK(json_integer_value(json_array_get(offs, 0)) == prev);
        CHECK(json_integer_value(json_array_get(offs, 1)) == want_end[i]);
        prev = want_end[i];
    }
    CHECK(n == 8 + hn + 336);
    json_t *md = json_object_get(root, "__metadata__");
    char hex[16];
    snprintf(hex, sizeof hex, "%08x", dt_crc32c(0, bytes + 8 + hn, n - 8 - hn));
    CHECK(json_is_string(json_object_get(md, "crc32c")) && strcmp(json_string_value(json_object_get(md, "crc32c")), hex) == 0);
    CHECK(strcmp(json_string_value(json_object_get(json_object_get(root, "global_step"), "dtype")), "I64") == 0);
    CHECK(json_array_size(json_object_get(json_object_get(root, "global_step"), "shape")) == 0);
    json_decref(root);
    free(bytes);
    rm_tree(dir);
}

/* ---- Refusals ------------------------------------------------------------------------------- */

/* A file image: 8-byte length, the header text as given (unpadded), then `data` bytes. */
static uint8_t *craft(const char *header, const void *data, size_t data_len, size_t *n) {
    size_t hn = strlen(header);
    *n = 8 + hn + data_len;
    uint8_t *b = malloc(*n);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hn >> (8 * i));
    memcpy(b + 8, header, hn);
    if (data_len) memcpy(b + 8 + hn, data, data_len);
    return b;
}

static void refuse(const char *header, size_t data_len, const char *msg) {
    static uint8_t zeros[256];
    size_t n;
    uint8_t *b = craft(header, zeros, data_len, &n);
    dt_st_file *f = NULL;
    dt_error err = {0};
    int rc = dt_st_open_memory(&f, b, n, "crafted.safetensors", &err);
    CHECK_MSG(rc == DT_EFORMAT && f == NULL, "accepted: %s", header);
    if (rc) {
        CHECK_CONTAINS(err.msg, "crafted.safetensors");
        CHECK_CONTAINS(err.msg, msg);
    }
    dt_st_close(f);
    free(b);
}

static void test_refusals(void) {
    /* A valid crafted file first, so the refusals below differ from it in one thing only. */
    size_t n;
    uint8_t *b = craft("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", "\0\0\0\0\0\0\0\0", 8, &n);
    dt_st_file *f = NULL;
    dt_error err = {0};
    CHECK(dt_st_open_memory(&f, b, n, "ok", &err) == 0 && f && !dt_st_has_checksum(f));
    dt_st_close(f);
    free(b);

    refuse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 7, "outside the data section of 7 bytes (truncated");
    refuse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 9, "data section has 9");
    refuse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 12, "need 16 bytes but data_offsets span 12");
    refuse("{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype \"F33\"");
    refuse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlaps");
    refuse("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
           "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, "gap of 4 bytes");
    refuse("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "gap of 4 bytes before tensor \"a\"");
    refuse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "outside the data section");
    refuse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "outside the data section");
    refuse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, "shape[0] is not a non-negative integer");
    refuse("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "shape[0]");
    refuse("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
           "more than 2^64");
    refuse("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "9 dimensions");
    refuse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, "data_offsets is not [begin, end]");
    refuse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "data_offsets");
    refuse("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "dtype missing");
    refuse("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "shape missing");
    refuse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8, "unknown field \"x\"");
    refuse("{\"a\":[1,2]}", 0, "tensor \"a\": entry is not a JSON object");
    refuse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"__metadata__\":{\"k\":1}}", 8,
           "__metadata__ \"k\": value is not a string");
    refuse("{\"__metadata__\":[]}", 0, "__metadata__ is not a JSON object");
    refuse("{\"__metadata__\":{\"crc32c\":\"xyz\"}}", 0, "not 8 hex digits");
    refuse("{\"__metadata__\":{\"crc32c\":\"00000001\"}}", 0, "checksum mismatch");
    refuse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, "header JSON");
    refuse("{\"a\":1,\"a\":2}", 0, "duplicate");
    refuse("[1]", 0, "does not start with '{'");
    refuse("{\"\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, "empty");

    /* Header length beyond the file, too short a file, and a header length with the top bit set. */
    uint8_t shortf[12] = {200, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' '};
    CHECK(dt_st_open_memory(&f, shortf, sizeof shortf, "short", &err) == DT_EFORMAT);
    CHECK_CONTAINS(err.msg, "header length 200 goes beyond the end of the file (12 bytes)");
    CHECK(dt_st_open_memory(&f, shortf, 5, "tiny", &err) == DT_EFORMAT);
    CHECK_CONTAINS(err.msg, "too short");
    shortf[0] = 0, shortf[7] = 0x80;
    CHECK(dt_st_open_memory(&f, shortf, sizeof shortf, "top", &err) == DT_EFORMAT);
    CHECK_CONTAINS(err.msg, "beyond the end");
    /* An empty header object is a valid file with no tensors. */
    uint8_t emptyf[10] = {2, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    CHECK(dt_st_open_memory(&f, emptyf, sizeof emptyf, "empty", &err) == 0 && dt_st_num_tensors(f) == 0);
    dt_st_close(f);
}

/* Damage on disk: truncation and a flipped data byte are refused, naming the file. */
static void test_damaged_files(void) {
    char *dir = make_tmpdir(), path[256];
    if (!dir) return;
    snprintf(path, sizeof path, "%s/ck.safetensors", dir);
    dt_error err = {0};
    CHECK(write_sample(path, &err) == 0);
    uint8_t *bytes;
    size_t n;
    CHECK(dt_read_file(&bytes, &n, path, 1 << 20, &err) == 0);
    if (!bytes) return;
    dt_st_file *f = NULL;
    /* Every single flipped bit in the data section is caught by the checksum. */
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--) hn = hn << 8 | bytes[i];
    int missed = 0;
    for (size_t at = 8 + hn; at < n; at++) {
        bytes[at] ^= 0x10;
        if (dt_st_open_memory(&f, bytes, n, path, &err) != DT_EFORMAT || !strstr(err.msg, "checksum mismatch")) missed++;
        dt_st_close(f);
        f = NULL;
        bytes[at] ^= 0x10;
    }
    CHECK_MSG(missed == 0, "%d flipped data bytes not detected", missed);
    /* On disk: flip one byte of the last tensor's data. */
    bytes[n - 20] ^= 0xff;
    CHECK(dt_atomic_write_file(path, bytes, n, &err) == 0);
    CHECK(dt_st_open(&f, path, &err) == DT_EFORMAT && f == NULL);
    CHECK_CONTAINS(err.msg, "checksum mismatch");
    CHECK_CONTAINS(err.msg, path);
    bytes[n - 20] ^= 0xff;
    /* Truncated by one byte, and cut inside the header. */
    CHECK(dt_atomic_write_file(path, bytes, n - 1, &err) == 0);
    CHECK(dt_st_open(&f, path, &err) == DT_EFORMAT);
    CHECK_CONTAINS(err.msg, "truncated");
    CHECK(dt_atomic_write_file(path, bytes, 40, &err) == 0);
    CHECK(dt_st_open(&f, path, &err) == DT_EFORMAT);
    CHECK_CONTAINS(err.msg, "beyond the end of the file");
    /* Intact again: accepted. */
    CHECK(dt_atomic_write_file(path, bytes, n, &err) == 0);
    CHECK(dt_st_open(&f, path, &err) == 0);
    dt_st_close(f);
    CHECK(dt_st_open(&f, "/nonexistent/x.safetensors", &err) == DT_EIO);
    CHECK_CONTAINS(err.msg, "/nonexistent/x.safetensors");
    free(bytes);
    rm_tree(dir);
}

static void test_writer_refusals_and_atomicity(void) {
    char *dir = make_tmpdir(), path[256];
    if (!dir) return;
    snprintf(path, sizeof path, "%s/ck.safetensors", dir);
    dt_error err = {0};
    CHECK(write_sample(path, &err) == 0);
    uint8_t *before;
    size_t nb;
    CHECK(dt_read_file(&before, &nb, path, 1 << 20, &err) == 0);

    float x[2] = {1, 2};
    dt_st_tensor dup[] = {{"a", DT_ST_F32, 1, {2}, x}, {"a", DT_ST_F32, 1, {2}, x}};
    CHECK(dt_st_write(path, dup, 2, NULL, 0, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "\"a\" given twice");
    dt_st_tensor neg[] = {{"a", DT_ST_F32, 1, {-2}, x}};
    CHECK(dt_st_write(path, neg, 1, NULL, 0, &err) == DT_EINVAL);
    dt_st_tensor dims[] = {{"a", DT_ST_F32, DT_ST_MAX_DIMS + 1, {2}, x}};
    CHECK(dt_st_write(path, dims, 1, NULL, 0, &err) == DT_EINVAL);
    dt_st_tensor reserved[] = {{"__metadata__", DT_ST_F32, 1, {2}, x}};
    CHECK(dt_st_write(path, reserved, 1, NULL, 0, &err) == DT_EINVAL);
    dt_st_tensor one[] = {{"a", DT_ST_F32, 1, {2}, x}};
    dt_st_meta sum[] = {{"crc32c", "00000000"}};
    CHECK(dt_st_write(path, one, 1, sum, 1, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "reserved");
    dt_st_meta badutf[] = {{"k", "\xff\xfe"}};
    CHECK(dt_st_write(path, one, 1, badutf, 1, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "UTF-8");
    /* None of the refused writes touched the existing file or left a temporary one. */
    uint8_t *after;
    size_t na;
    CHECK(dt_read_file(&after, &na, path, 1 << 20, &err) == 0);
    CHECK(na == nb && memcmp(before, after, nb) == 0);
    CHECK(count_entries(dir) == 1);
    free(after);
    /* A folder that does not exist: refused, nothing created. */
    char missing[300];
    snprintf(missing, sizeof missing, "%s/no/such/ck.safetensors", dir);
    CHECK(dt_st_write(missing, one, 1, NULL, 0, &err) == DT_EIO);
    CHECK_CONTAINS(err.msg, "no/such");
    CHECK(count_entries(dir) == 1);
    /* Overwriting replaces the file whole. */
    CHECK(dt_st_write(path, one, 1, NULL, 0, &err) == 0);
    dt_st_file *f;
    CHECK(dt_st_open(&f, path, &err) == 0 && dt_st_num_tensors(f) == 1 && dt_st_num_meta(f) == 1);
    dt_st_close(f);
    CHECK(count_entries(dir) == 1);
    free(before);
    rm_tree(dir);
}

/* In parts: a tensor without data is zeros until put writes it, in any order; commit checksums
 * what the file holds, so the file reads back as if written at once; a put beyond a tensor is
 * refused; an abort leaves neither the file nor a temporary one. */
static void test_writer_in_parts(void) {
    char *dir = make_tmpdir(), path[256], path2[256];
    if (!dir) return;
    snprintf(path, sizeof path, "%s/parts.safetensors", dir);
    snprintf(path2, sizeof path2, "%s/whole.safetensors", dir);
    float a[3] = {1, 2, 3}, b[8] = {0}, c[2] = {7, 8};
    dt_st_tensor t[] = {{"a", DT_ST_F32, 1, {3}, a}, {"b", DT_ST_F32, 2, {4, 2}, NULL}, {"c", DT_ST_F32, 1, {2}, c}};
    dt_st_meta m[] = {{"k", "v"}};
    dt_error err = {0};
    dt_st_writer *w = NULL;
    CHECK(dt_st_writer_begin(&w, path, t, 3, m, 1, &err) == 0);
    if (!w) return;
    const float hi[2] = {5, 6}, lo[2] = {1, 2};
    CHECK(dt_st_writer_put(w, 1, 24, hi, sizeof hi, &err) == 0);   /* row 3 first */
    CHECK(dt_st_writer_put(w, 1, 0, lo, sizeof lo, &err) == 0);    /* then row 0; rows 1, 2 stay 0 */
    CHECK(dt_st_writer_put(w, 1, 28, hi, sizeof hi, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "beyond it");
    CHECK(dt_st_writer_put(w, 3, 0, hi, 4, &err) == DT_EINVAL);
    CHECK(dt_st_writer_commit(w, &err) == 0);
    b[0] = 1, b[1] = 2, b[6] = 5, b[7] = 6;
    t[1].data = b;
    CHECK(dt_st_write(path2, t, 3, m, 1, &err) == 0);
    uint8_t *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    CHECK(dt_read_file(&x, &nx, path, 1 << 20, &err) == 0);
    CHECK(dt_read_file(&y, &ny, path2, 1 << 20, &err) == 0);
    CHECK(nx == ny && !memcmp(x, y, nx)); /* the same bytes, checksum included */
    free(x), free(y);
    dt_st_file *f;
    CHECK(dt_st_open(&f, path, &err) == 0 && dt_st_has_checksum(f));
    float got[8];
    CHECK(f && dt_st_read(f, "b", DT_ST_F32, got, 8, &err) == 0 && !memcmp(got, b, sizeof b));
    dt_st_close(f);
    t[1].data = NULL;
    snprintf(path, sizeof path, "%s/aborted.safetensors", dir);
    CHECK(dt_st_writer_begin(&w, path, t, 3, m, 1, &err) == 0);
    dt_st_writer_abort(w);
    CHECK(count_entries(dir) == 2);
    rm_tree(dir);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write") == 0) {
        dt_error err = {0};
        if (write_sample(argv[2], &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        return 0;
    }
    RUN(test_round_trip);
    RUN(test_refusals);
    RUN(test_damaged_files);
    RUN(test_writer_refusals_and_atomicity);
    RUN(test_writer_in_parts);
    return test_summary();
}
