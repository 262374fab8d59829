#include "io/safetensors.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/crc32c.h"
#include "io/fsutil.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this writer and reader copy host bytes as they are"
#endif

static const struct {
    const char *name;
    size_t size;
} dtypes[DT_ST_NUM_DTYPES] = {
    [DT_ST_BOOL] = {"BOOL", 1}, [DT_ST_U8] = {"U8", 1},     [DT_ST_I8] = {"I8", 1},
    [DT_ST_U16] = {"U16", 2},   [DT_ST_I16] = {"I16", 2},   [DT_ST_F16] = {"F16", 2},
    [DT_ST_BF16] = {"BF16", 2}, [DT_ST_U32] = {"U32", 4},   [DT_ST_I32] = {"I32", 4},
    [DT_ST_F32] = {"F32", 4},   [DT_ST_U64] = {"U64", 8},   [DT_ST_I64] = {"I64", 8},
    [DT_ST_F64] = {"F64", 8},
};

const char *dt_st_dtype_name(dt_st_dtype d) {
    return (unsigned)d < DT_ST_NUM_DTYPES ? dtypes[d].name : "?";
}

size_t dt_st_dtype_size(dt_st_dtype d) {
    return (unsigned)d < DT_ST_NUM_DTYPES ? dtypes[d].size : 0;
}

static int dtype_from_name(const char *s) {
    for (int i = 0; i < DT_ST_NUM_DTYPES; i++)
        if (strcmp(s, dtypes[i].name) == 0) return i;
    return -1;
}

/* count = product of shape, nbytes = count * element size; 0 on overflow of either. */
static int shape_bytes(const int64_t *shape, int ndim, size_t elem, uint64_t *count, uint64_t *nbytes) {
    uint64_t c = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) return 0;
        if (shape[d] && c > UINT64_MAX / (uint64_t)shape[d]) return 0;
        c *= (uint64_t)shape[d];
    }
    if (elem && c > UINT64_MAX / elem) return 0;
    *count = c;
    *nbytes = c * elem;
    return 1;
}

/* ---- Writer --------------------------------------------------------------------------------- */

static int build_header(json_t **out, const char *path, const dt_st_tensor *t, int n, const dt_st_meta *meta,
                        int n_meta, uint32_t crc, dt_error *err) {
    json_t *root = json_object(), *md = json_object();
    int rc = 0;
    if (!root || !md || json_object_set_new(root, "__metadata__", md)) {
        if (!root) json_decref(md);
        json_decref(root);
        return dt_errorf(err, DT_ENOMEM, "%s: out of memory building the header", path);
    }
    for (int i = 0; i < n_meta && !rc; i++) {
        json_t *v = json_string(meta[i].value);
        if (!v || json_object_set_new(md, meta[i].key, v))
            rc = dt_errorf(err, DT_EINVAL, "%s: metadata \"%.64s\": key or value is not valid UTF-8", path, meta[i].key);
    }
    char hex[9];
    snprintf(hex, sizeof hex, "%08" PRIx32, crc);
    if (!rc && json_object_set_new(md, DT_ST_CHECKSUM_KEY, json_string(hex)))
        rc = dt_errorf(err, DT_ENOMEM, "%s: out of memory building the header", path);
    uint64_t offset = 0;
    for (int i = 0; i < n && !rc; i++) {
        uint64_t count = 0, nbytes = 0;
        shape_bytes(t[i].shape, t[i].ndim, dtypes[t[i].dtype].size, &count, &nbytes); /* checked before */
        json_t *e = json_object(), *shape = json_array(), *offs = json_array();
        int bad = !e || !shape || !offs;
        for (int d = 0; d < t[i].ndim && !bad; d++) bad |= json_array_append_new(shape, json_integer(t[i].shape[d]));
        bad = bad || json_array_append_new(offs, json_integer((json_int_t)offset)) ||
              json_array_append_new(offs, json_integer((json_int_t)(offset + nbytes)));
        bad = bad || json_object_set_new(e, "dtype", json_string(dtypes[t[i].dtype].name));
        if (!bad) bad = json_object_set_new(e, "shape", shape), shape = NULL;
        if (!bad) bad = json_object_set_new(e, "data_offsets", offs), offs = NULL;
        if (!bad) bad = json_object_set_new(root, t[i].name, e), e = NULL;
        json_decref(shape);
        json_decref(offs);
        json_decref(e);
        if (bad) rc = dt_errorf(err, DT_EINVAL, "%s: tensor \"%.64s\": cannot add to header (name not UTF-8?)", path, t[i].name);
        offset += nbytes;
    }
    if (rc) {
        json_decref(root);
        return rc;
    }
    *out = root;
    return 0;
}

/* The arguments describe a file: names unique, known dtypes, sizes within DT_ST_MAX_FILE, data for
 * every tensor that has bytes unless deferred (data NULL allowed), metadata keys unique and not the
 * checksum's. *total: the data section's bytes. */
static int check_args(const char *path, const dt_st_tensor *t, int n, const dt_st_meta *meta, int n_meta,
                      int deferred_ok, uint64_t *total, dt_error *err) {
    if (n < 0 || n_meta < 0 || (n && !t) || (n_meta && !meta))
        return dt_errorf(err, DT_EINVAL, "%s: bad tensor or metadata list", path);
    *total = 0;
    for (int i = 0; i < n; i++) {
        const char *name = t[i].name;
        if (!name || !name[0] || strlen(name) > DT_ST_MAX_NAME || strcmp(name, "__metadata__") == 0)
            return dt_errorf(err, DT_EINVAL, "%s: tensor %d: name is empty, too long or reserved", path, i);
        for (int j = 0; j < i; j++)
            if (strcmp(t[j].name, name) == 0)
                return dt_errorf(err, DT_EINVAL, "%s: tensor \"%.64s\" given twice", path, name);
        if ((unsigned)t[i].dtype >= DT_ST_NUM_DTYPES)
            return dt_errorf(err, DT_EINVAL, "%s: tensor \"%.64s\": unknown dtype %d", path, name, (int)t[i].dtype);
        if (t[i].ndim < 0 || t[i].ndim > DT_ST_MAX_DIMS)
            return dt_errorf(err, DT_EINVAL, "%s: tensor \"%.64s\": %d dimensions (0..%d allowed)", path, name,
                             t[i].ndim, DT_ST_MAX_DIMS);
        uint64_t count = 0, nbytes = 0;
        if (!shape_bytes(t[i].shape, t[i].ndim, dtypes[t[i].dtype].size, &count, &nbytes) ||
            nbytes > DT_ST_MAX_FILE || *total + nbytes > DT_ST_MAX_FILE)
            return dt_errorf(err, DT_EINVAL, "%s: tensor \"%.64s\": negative or too large shape", path, name);
        if (nbytes && !t[i].data && !deferred_ok)
            return dt_errorf(err, DT_EINVAL, "%s: tensor \"%.64s\": no data", path, name);
        *total += nbytes;
    }
    for (int i = 0; i < n_meta; i++) {
        if (!meta[i].key || !meta[i].value || !meta[i].key[0] || strlen(meta[i].key) > DT_ST_MAX_NAME)
            return dt_errorf(err, DT_EINVAL, "%s: metadata entry %d: key empty or too long, or value missing", path, i);
        if (strcmp(meta[i].key, DT_ST_CHECKSUM_KEY) == 0)
            return dt_errorf(err, DT_EINVAL, "%s: metadata \"%s\" is reserved for the writer's checksum", path,
                             DT_ST_CHECKSUM_KEY);
        for (int j = 0; j < i; j++)
            if (strcmp(meta[j].key, meta[i].key) == 0)
                return dt_errorf(err, DT_EINVAL, "%s: metadata \"%.64s\" given twice", path, meta[i].key);
    }
    return 0;
}

/* The 8-byte length and the JSON header padded with spaces to 8-byte alignment, the checksum crc in
 * it (8 hex digits: the same length whatever crc is), into *out (malloc'd), *len. */
static int make_header(uint8_t **out, size_t *len, const char *path, const dt_st_tensor *t, int n,
                       const dt_st_meta *meta, int n_meta, uint32_t crc, dt_error *err) {
    json_t *root = NULL;
    int rc = build_header(&root, path, t, n, meta, n_meta, crc, err);
    if (rc) return rc;
    char *json = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!json) return dt_errorf(err, DT_ENOMEM, "%s: out of memory serialising the header", path);
    size_t jn = strlen(json), hn = (jn + 7) & ~(size_t)7;
    if (hn > DT_ST_MAX_HEADER) {
        free(json);
        return dt_errorf(err, DT_EINVAL, "%s: header of %zu bytes exceeds the %zu allowed", path, hn, DT_ST_MAX_HEADER);
    }
    uint8_t *head = dt_malloc(8 + hn, "safetensors header", err);
    if (!head) {
        free(json);
        return DT_ENOMEM;
    }
    uint64_t hn64 = hn;
    memcpy(head, &hn64, 8);
    memcpy(head + 8, json, jn);
    memset(head + 8 + jn, ' ', hn - jn);
    free(json);
    *out = head, *len = 8 + hn;
    return 0;
}

struct dt_st_writer {
    dt_atomic_file af;
    dt_st_tensor *t;          /* a copy of the list (names and data not owned) */
    int n, n_meta;
    dt_st_meta *meta;
    uint64_t *offset, *nbytes; /* [n] each tensor's place in the data section */
    uint64_t data_at;         /* the data section's offset in the file */
    int recompute;            /* the checksum must be read back from the file at commit */
};

void dt_st_writer_abort(dt_st_writer *w) {
    if (!w) return;
    dt_atomic_abort(&w->af);
    free(w->t), free(w->meta), free(w->offset), free(w->nbytes);
    free(w);
}

/* The tensors' places and the checksum of what is in memory (when nothing is deferred). */
static uint32_t writer_layout(dt_st_writer *w) {
    uint32_t crc = 0;
    uint64_t at = 0, count;
    for (int i = 0; i < w->n; i++) {
        shape_bytes(w->t[i].shape, w->t[i].ndim, dtypes[w->t[i].dtype].size, &count, &w->nbytes[i]);
        w->offset[i] = at;
        at += w->nbytes[i];
        if (w->nbytes[i] && !w->t[i].data) w->recompute = 1;
        else if (!w->recompute) crc = dt_crc32c(crc, w->t[i].data, (size_t)w->nbytes[i]);
    }
    return crc;
}

int dt_st_writer_begin(dt_st_writer **out, const char *path, const dt_st_tensor *t, int n, const dt_st_meta *meta,
                       int n_meta, dt_error *err) {
    *out = NULL;
    uint64_t total = 0;
    int rc = check_args(path, t, n, meta, n_meta, 1, &total, err);
    if (rc) return rc;
    dt_st_writer *w = dt_calloc(1, sizeof *w, "safetensors writer", err);
    if (!w) return DT_ENOMEM;
    w->af.fd = -1;
    w->n = n, w->n_meta = n_meta;
    w->t = dt_calloc((size_t)n + 1, sizeof *w->t, "safetensors writer", err);
    w->meta = dt_calloc((size_t)n_meta + 1, sizeof *w->meta, "safetensors writer", err);
    w->offset = dt_calloc((size_t)n + 1, sizeof *w->offset, "safetensors writer", err);
    w->nbytes = dt_calloc((size_t)n + 1, sizeof *w->nbytes, "safetensors writer", err);
    if (!w->t || !w->meta || !w->offset || !w->nbytes) {
        dt_st_writer_abort(w);
        return DT_ENOMEM;
    }
    if (n) memcpy(w->t, t, (size_t)n * sizeof *t);
    if (n_meta) memcpy(w->meta, meta, (size_t)n_meta * sizeof *meta);
    uint32_t crc = writer_layout(w);
    uint8_t *head = NULL;
    size_t head_len = 0;
    rc = make_header(&head, &head_len, path, w->t, n, w->meta, n_meta, w->recompute ? 0 : crc, err);
    if (!rc) rc = dt_atomic_open(&w->af, path, err);
    w->data_at = head_len;
    /* every byte written through pwrite at its place; deferred tensors are holes (zeros) until put */
    if (!rc) rc = dt_atomic_pwrite(&w->af, head, head_len, 0, err);
    if (!rc) rc = dt_atomic_resize(&w->af, head_len + total, err);
    for (int i = 0; i < n && !rc; i++)
        if (w->nbytes[i] && w->t[i].data)
            rc = dt_atomic_pwrite(&w->af, w->t[i].data, (size_t)w->nbytes[i], w->data_at + w->offset[i], err);
    free(head);
    if (rc) {
        dt_st_writer_abort(w);
        return rc;
    }
    *out = w;
    return 0;
}

int dt_st_writer_put(dt_st_writer *w, int tensor, uint64_t offset, const void *data, size_t n, dt_error *err) {
    if (tensor < 0 || tensor >= w->n || offset > w->nbytes[tensor] || n > w->nbytes[tensor] - offset)
        return dt_errorf(err, DT_EINVAL, "%s: %zu bytes at %llu of tensor %d are beyond it", w->af.path, n,
                         (unsigned long long)offset, tensor);
    w->recompute = 1;
    return dt_atomic_pwrite(&w->af, data, n, w->data_at + w->offset[tensor] + offset, err);
}

/* The CRC-32C of the data section as the temporary file holds it, read 1 MiB at a time. */
static int read_back_crc(dt_st_writer *w, uint32_t *crc, dt_error *err) {
    enum { PIECE = 1 << 20 };
    uint8_t *buf = dt_malloc(PIECE, "checksum buffer", err);
    if (!buf) return DT_ENOMEM;
    uint64_t total = w->n ? w->offset[w->n - 1] + w->nbytes[w->n - 1] : 0;
    *crc = 0;
    int rc = 0;
    for (uint64_t at = 0; at < total && !rc; at += PIECE) {
        size_t m = total - at < PIECE ? (size_t)(total - at) : PIECE;
        if (dt_pread_full(w->af.fd, buf, m, w->data_at + at))
            rc = dt_errorf(err, DT_EIO, "%s: cannot read back %zu bytes at %llu", w->af.tmp, m,
                           (unsigned long long)(w->data_at + at));
        else
            *crc = dt_crc32c(*crc, buf, m);
    }
    free(buf);
    return rc;
}

int dt_st_writer_commit(dt_st_writer *w, dt_error *err) {
    int rc = 0;
    if (w->recompute) {
        uint32_t crc;
        uint8_t *head = NULL;
        size_t head_len = 0;
        rc = read_back_crc(w, &crc, err);
        if (!rc) rc = make_header(&head, &head_len, w->af.path, w->t, w->n, w->meta, w->n_meta, crc, err);
        if (!rc && head_len != w->data_at)
            rc = dt_errorf(err, DT_EINVAL, "%s: the header changed length (%zu, was %llu)", w->af.path, head_len,
                           (unsigned long long)w->data_at);
        if (!rc) rc = dt_atomic_pwrite(&w->af, head, head_len, 0, err);
        free(head);
    }
    if (!rc) rc = dt_atomic_commit(&w->af, err);
    dt_st_writer_abort(w); /* after a commit: only frees */
    return rc;
}

int dt_st_write(const char *path, const dt_st_tensor *t, int n, const dt_st_meta *meta, int n_meta, dt_error *err) {
    uint64_t total;
    int rc = check_args(path, t, n, meta, n_meta, 0, &total, err);
    dt_st_writer *w = NULL;
    if (!rc) rc = dt_st_writer_begin(&w, path, t, n, meta, n_meta, err);
    return rc ? rc : dt_st_writer_commit(w, err);
}

/* ---- Reader --------------------------------------------------------------------------------- */

struct dt_st_file {
    int fd;                   /* the file, read with pread when asked (-1: bytes in memory) */
    uint8_t *mem;             /* dt_st_open_memory's copy of the bytes (NULL for a file) */
    uint64_t size;            /* of the whole file */
    uint64_t data_start;      /* 8 + header length: where tensor offsets count from */
    json_t *root;             /* owns the name and metadata strings */
    dt_st_info *tensors;      /* data-section order */
    int n;
    const dt_st_info **by_name; /* sorted by name, for lookup */
    char *label;              /* the path, for messages */
    const char **meta_keys, **meta_values;
    int n_meta;
    int has_checksum;
};

void dt_st_close(dt_st_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    free(f->mem);
    json_decref(f->root);
    free(f->tensors);
    free(f->by_name);
    free(f->label);
    free(f->meta_keys);
    free(f->meta_values);
    free(f);
}

/* Bytes [at, at + n) of the file, from the memory copy or with pread. */
static int file_read(const dt_st_file *f, uint64_t at, void *out, size_t n, dt_error *err) {
    if (at > f->size || n > f->size - at)
        return dt_errorf(err, DT_EFORMAT, "%s: read of %zu bytes at %" PRIu64 " beyond the file's %" PRIu64, f->label, n,
                         at, f->size);
    return n ? dt_read_at(f->fd, f->mem, at, out, n, f->label, err) : 0;
}

static int cmp_offset(const void *a, const void *b) {
    const dt_st_info *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const dt_st_info *const *)a)->name, (*(const dt_st_info *const *)b)->name);
}

/* A JSON integer in [0, max]; jansson keeps integers and reals apart, so 1.0 is refused. */
static int get_uint(json_t *v, uint64_t max, uint64_t *out) {
    if (!json_is_integer(v)) return 0;
    json_int_t x = json_integer_value(v);
    if (x < 0 || (uint64_t)x > max) return 0;
    *out = (uint64_t)x;
    return 1;
}

static int parse_entry(dt_st_info *ti, const char *label, const char *name, json_t *e, size_t data_len,
                       dt_error *err) {
    if (!json_is_object(e))
        return dt_errorf(err, DT_EFORMAT, "%s: tensor \"%.64s\": entry is not a JSON object", label, name);
    const char *key;
    json_t *v;
    json_object_foreach(e, key, v) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return dt_errorf(err, DT_EFORMAT, "%s: tensor \"%.64s\": unknown field \"%.64s\"", label, name, key);
    }
    json_t *dt = json_object_get(e, "dtype"), *shape = json_object_get(e, "shape"),
           *offs = json_object_get(e, "data_offsets");
    if (!json_is_string(dt))
        return dt_errorf(err, DT_EFORMAT, "%s: tensor \"%.64s\": dtype missing or not a string", label, name);
    int d = dtype_from_name(json_string_value(dt));
    if (d < 0)
        return dt_errorf(err, DT_EFORMAT, "%s: tensor \"%.64s\": unknown dtype \"%.16s\"", label, name,
                         json_string_value(dt));
    if (!json_is_array(shape))
        return dt_errorf(err, DT_EFORMAT, "%s: tensor \"%.64s\": shape missing or not an array", label, name);
    size_t nd = json_array_size(shape);
    if (nd > DT_ST_MAX_DIMS)
        return dt_errorf(err, DT_EFORMAT, "%s: tensor \"%.64s\": %zu dimensions, at most %d supported", label, name,
                         nd, DT_ST_MAX_DIMS);
    ti->name = name;
    ti->dtype = (dt_st_dtype)d;
    ti->ndim = (int)nd;
    for (size_t k = 0; k < nd; k++) {
        uint64_t x;
        if (!get_uint(json_array_get(shape, k), INT64_MAX, &x))
            return dt_errorf(err, DT_EFORMAT, "%s: tensor \"%.64s\": shape[%zu] is not a non-negative integer",
                             label, name, k);
        ti->shape[k] = (int64_t)x;
    }
    uint64_t begin, end, nbytes = 0;
    if (!json_is_array(offs) || json_array_size(offs) != 2 || !get_uint(json_array_get(offs, 0), INT64_MAX, &begin) ||
        !get_uint(json_array_get(offs, 1), INT64_MAX, &end))
        return dt_errorf(err, DT_EFORMAT, "%s: tensor \"%.64s\": data_offsets is not [begin, end] of non-negative integers",
                         label, name);
    if (begin > end || end > data_len)
        return dt_errorf(err, DT_EFORMAT,
                         "%s: tensor \"%.64s\": data_offsets [%" PRIu64 ", %" PRIu64 "] outside the data section of %zu bytes%s",
                         label, name, begin, end, data_len, begin <= end ? " (truncated file?)" : "");
    if (!shape_bytes(ti->shape, ti->ndim, dtypes[d].size, &ti->count, &nbytes))
        return dt_errorf(err, DT_EFORMAT, "%s: tensor \"%.64s\": shape has more than 2^64 bytes", label, name);
    if (nbytes != end - begin)
        return dt_errorf(err, DT_EFORMAT,
                         "%s: tensor \"%.64s\": shape and dtype %s need %" PRIu64 " bytes but data_offsets span %" PRIu64,
                         label, name, dtypes[d].name, nbytes, end - begin);
    ti->offset = (size_t)begin;
    ti->nbytes = (size_t)nbytes;
    return 0;
}

static int parse_metadata(dt_st_file *f, const char *label, json_t *md, dt_error *err) {
    if (!json_is_object(md))
        return dt_errorf(err, DT_EFORMAT, "%s: __metadata__ is not a JSON object", label);
    size_t n = json_object_size(md);
    f->meta_keys = dt_calloc(n, sizeof *f->meta_keys, "safetensors metadata", err);
    f->meta_values = dt_calloc(n, sizeof *f->meta_values, "safetensors metadata", err);
    if (!f->meta_keys || !f->meta_values) return DT_ENOMEM;
    const char *key;
    json_t *v;
    json_object_foreach(md, key, v) {
        if (!json_is_string(v))
            return dt_errorf(err, DT_EFORMAT, "%s: __metadata__ \"%.64s\": value is not a string", label, key);
        f->meta_keys[f->n_meta] = key;
        f->meta_values[f->n_meta++] = json_string_value(v);
    }
    return 0;
}

/* jansson reads the header from the file through this, in its own small buffer: no copy of the
 * header is held, and a header of zeros is refused at its first byte, not after reading it all. */
typedef struct {
    const dt_st_file *f;
    uint64_t at, end;
    int failed;
} header_source;

static size_t header_chunk(void *buf, size_t cap, void *arg) {
    header_source *h = arg;
    size_t n = h->end - h->at < cap ? (size_t)(h->end - h->at) : cap;
    if (n && file_read(h->f, h->at, buf, n, NULL)) {
        h->failed = 1;
        return (size_t)-1;
    }
    h->at += n;
    return n;
}

/* Validates the header and the tensor table against the file's size, and fills the tables. Reads
 * the 8-byte length and the header only, never the data section. */
static int parse_header(dt_st_file *f, const char *label, dt_error *err) {
    if (f->size < 8)
        return dt_errorf(err, DT_EFORMAT, "%s: %" PRIu64 " bytes: too short for the 8-byte header length", label, f->size);
    uint8_t head[9];
    int rc = file_read(f, 0, head, f->size >= 9 ? 9 : 8, err);
    if (rc) return rc;
    uint64_t hn;
    memcpy(&hn, head, 8);
    if (hn > f->size - 8)
        return dt_errorf(err, DT_EFORMAT, "%s: header length %" PRIu64 " goes beyond the end of the file (%" PRIu64 " bytes)",
                         label, hn, f->size);
    if (hn > DT_ST_MAX_HEADER)
        return dt_errorf(err, DT_EFORMAT, "%s: header length %" PRIu64 " exceeds the %zu allowed", label, hn,
                         DT_ST_MAX_HEADER);
    if (hn < 2 || head[8] != '{')
        return dt_errorf(err, DT_EFORMAT, "%s: header does not start with '{' (not a safetensors file?)", label);
    json_error_t je;
    if (f->mem) {
        f->root = json_loadb((const char *)f->mem + 8, (size_t)hn, JSON_REJECT_DUPLICATES, &je);
    } else {
        header_source h = {f, 8, 8 + hn, 0};
        f->root = json_load_callback(header_chunk, &h, JSON_REJECT_DUPLICATES, &je);
        if (!f->root && h.failed)
            return dt_errorf(err, DT_EIO, "%s: could not read the header (file changed or i/o error)", label);
    }
    if (!f->root)
        return dt_errorf(err, DT_EFORMAT, "%s: header JSON, byte %d of the header: %s", label, je.position, je.text);
    if (!json_is_object(f->root)) return dt_errorf(err, DT_EFORMAT, "%s: header is not a JSON object", label);
    f->data_start = 8 + hn;

    uint64_t data_len64 = f->size - f->data_start;
    if (data_len64 > DT_ST_MAX_FILE)
        return dt_errorf(err, DT_EFORMAT, "%s: data section of %" PRIu64 " bytes, more than the %zu allowed", label,
                         data_len64, DT_ST_MAX_FILE);
    size_t data_len = (size_t)data_len64;
    size_t n = json_object_size(f->root);
    f->tensors = dt_calloc(n ? n : 1, sizeof *f->tensors, "safetensors tensor table", err);
    if (!f->tensors) return DT_ENOMEM;
    const char *key;
    json_t *v;
    json_object_foreach(f->root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            if ((rc = parse_metadata(f, label, v, err))) return rc;
            continue;
        }
        if (!key[0] || strlen(key) > DT_ST_MAX_NAME)
            return dt_errorf(err, DT_EFORMAT, "%s: tensor name is empty or longer than %d bytes", label, DT_ST_MAX_NAME);
        if ((rc = parse_entry(&f->tensors[f->n], label, key, v, data_len, err))) return rc;
        f->n++;
    }

    /* The data section is exactly the tensors laid end to end. */
    qsort(f->tensors, (size_t)f->n, sizeof *f->tensors, cmp_offset);
    size_t at = 0;
    for (int i = 0; i < f->n; i++) {
        const dt_st_info *t = &f->tensors[i];
        if (t->offset < at)
            return dt_errorf(err, DT_EFORMAT, "%s: tensor \"%.64s\" (bytes %zu..%zu) overlaps the previous tensor \"%.64s\"",
                             label, t->name, t->offset, t->offset + t->nbytes, f->tensors[i - 1].name);
        if (t->offset > at)
            return dt_errorf(err, DT_EFORMAT, "%s: gap of %zu bytes before tensor \"%.64s\" at data offset %zu", label,
                             t->offset - at, t->name, at);
        at = t->offset + t->nbytes;
    }
    if (at != data_len)
        return dt_errorf(err, DT_EFORMAT, "%s: tensors cover %zu bytes but the data section has %zu (truncated or padded file)",
                         label, at, data_len);

    f->by_name = dt_calloc(f->n ? (size_t)f->n : 1, sizeof *f->by_name, "safetensors name index", err);
    if (!f->by_name) return DT_ENOMEM;
    for (int i = 0; i < f->n; i++) f->by_name[i] = &f->tensors[i];
    qsort(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_name);
    return 0;
}

/* The stored checksum against the data section, streamed through a 1 MiB buffer: what is held does
 * not grow with the file. */
static int verify_checksum(dt_st_file *f, const char *label, dt_error *err) {
    const char *sum = dt_st_meta_get(f, DT_ST_CHECKSUM_KEY);
    if (!sum) return 0;
    char *end;
    unsigned long want = strtoul(sum, &end, 16);
    if (strlen(sum) != 8 || *end || strspn(sum, "0123456789abcdefABCDEF") != 8)
        return dt_errorf(err, DT_EFORMAT, "%s: __metadata__ \"%s\" is \"%.16s\", not 8 hex digits", label,
                         DT_ST_CHECKSUM_KEY, sum);
    uint32_t got = 0;
    if (f->mem) {
        got = dt_crc32c(0, f->mem + f->data_start, (size_t)(f->size - f->data_start));
    } else {
        size_t cap = (size_t)1 << 20;
        uint8_t *buf = dt_malloc(cap, "checksum buffer", err);
        if (!buf) return DT_ENOMEM;
        for (uint64_t at = f->data_start; at < f->size;) {
            size_t n = f->size - at < cap ? (size_t)(f->size - at) : cap;
            int rc = file_read(f, at, buf, n, err);
            if (rc) {
                free(buf);
                return rc;
            }
            got = dt_crc32c(got, buf, n);
            at += n;
        }
        free(buf);
    }
    if (got != (uint32_t)want)
        return dt_errorf(err, DT_EFORMAT,
                         "%s: checksum mismatch: the tensor data has crc32c %08" PRIx32 " but the header says %s "
                         "(the file is corrupt)", label, got, sum);
    f->has_checksum = 1;
    return 0;
}

static dt_st_file *new_file(const char *label, dt_error *err) {
    dt_st_file *f = dt_calloc(1, sizeof *f, "safetensors file", err);
    if (!f) return NULL;
    f->fd = -1;
    size_t ln = strlen(label);
    f->label = dt_malloc(ln + 1, "safetensors file name", err);
    if (!f->label) {
        free(f);
        return NULL;
    }
    memcpy(f->label, label, ln + 1);
    return f;
}

/* Header, then the caller's check of the table (nothing of the data read yet), then the checksum. */
static int finish_open(dt_st_file **out, dt_st_file *f, dt_st_check_fn check, void *ctx, dt_error *err) {
    int rc = parse_header(f, f->label, err);
    if (!rc && check) rc = check(f, f->label, ctx, err);
    if (!rc) rc = verify_checksum(f, f->label, err);
    if (rc) {
        dt_st_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

int dt_st_open_ex(dt_st_file **out, const char *path, int flags, dt_st_check_fn check, void *ctx, dt_error *err) {
    *out = NULL;
    struct stat st;
    int fd = dt_open_regular(path, (flags & DT_ST_NOFOLLOW) != 0, &st, err);
    if (fd < 0) return fd;
    dt_st_file *f = new_file(path, err);
    if (!f) {
        close(fd);
        return DT_ENOMEM;
    }
    f->fd = fd;
    f->size = (uint64_t)st.st_size;
    return finish_open(out, f, check, ctx, err);
}

int dt_st_open(dt_st_file **out, const char *path, dt_error *err) {
    return dt_st_open_ex(out, path, 0, NULL, NULL, err);
}

int dt_st_open_plain(dt_st_file **out, const char *path, dt_error *err) {
    return dt_st_open_ex(out, path, DT_ST_NOFOLLOW, NULL, NULL, err);
}

int dt_st_open_memory(dt_st_file **out, const void *src, size_t n, const char *label, dt_error *err) {
    *out = NULL;
    if (n > DT_ST_MAX_FILE) return dt_errorf(err, DT_EFORMAT, "%s: %zu bytes is too large", label, n);
    dt_st_file *f = new_file(label, err);
    if (!f) return DT_ENOMEM;
    if (!(f->mem = dt_malloc(n ? n : 1, label, err))) {
        dt_st_close(f);
        return DT_ENOMEM;
    }
    if (n) memcpy(f->mem, src, n);
    f->size = n;
    return finish_open(out, f, NULL, NULL, err);
}

int dt_st_num_tensors(const dt_st_file *f) { return f->n; }

const dt_st_info *dt_st_tensor_at(const dt_st_file *f, int i) {
    return i >= 0 && i < f->n ? &f->tensors[i] : NULL;
}

const dt_st_info *dt_st_find(const dt_st_file *f, const char *name) {
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(name, f->by_name[mid]->name);
        if (c == 0) return f->by_name[mid];
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

int dt_st_num_meta(const dt_st_file *f) { return f->n_meta; }

void dt_st_meta_at(const dt_st_file *f, int i, const char **key, const char **value) {
    *key = i >= 0 && i < f->n_meta ? f->meta_keys[i] : NULL;
    *value = i >= 0 && i < f->n_meta ? f->meta_values[i] : NULL;
}

const char *dt_st_meta_get(const dt_st_file *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

int dt_st_has_checksum(const dt_st_file *f) { return f->has_checksum; }

int dt_st_read(const dt_st_file *f, const char *name, dt_st_dtype dtype, void *out, uint64_t count, dt_error *err) {
    const dt_st_info *t = dt_st_find(f, name);
    const char *label = f->label;
    if (!t) return dt_errorf(err, DT_EFORMAT, "%s: no tensor \"%.64s\"", label, name);
    if (t->dtype != dtype)
        return dt_errorf(err, DT_EFORMAT, "%s: tensor \"%.64s\" is %s, expected %s", label, name, dt_st_dtype_name(t->dtype),
                         dt_st_dtype_name(dtype));
    if (t->count != count)
        return dt_errorf(err, DT_ESHAPE, "%s: tensor \"%.64s\" has %" PRIu64 " elements, expected %" PRIu64, label, name,
                         t->count, count);
    return file_read(f, f->data_start + t->offset, out, t->nbytes, err);
}

int dt_st_read_part(const dt_st_file *f, const dt_st_info *t, uint64_t offset, void *out, size_t n, dt_error *err) {
    if (offset > t->nbytes || n > t->nbytes - offset)
        return dt_errorf(err, DT_EINVAL, "%s: tensor \"%.64s\": bytes %" PRIu64 "..+%zu are beyond its %zu", f->label,
                         t->name, offset, n, t->nbytes);
    return file_read(f, f->data_start + t->offset + offset, out, n, err);
}
