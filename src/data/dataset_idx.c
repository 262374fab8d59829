/* IDX data sets (Fashion-MNIST/MNIST files, plain or gzip), held in memory as uint8. Every size an
 * IDX header claims is checked against the bytes actually there before anything is allocated for
 * it, so a hostile or truncated file costs an error message, not memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/error.h"
#include "data/dataset_impl.h"
#include "data/listing.h"
#include "io/fsutil.h"

#define IDX_MAX_PIXELS ((uint64_t)1 << 24)  /* per image: refuses absurd rows x cols */
#define IDX_MAX_FILE ((size_t)1 << 32)      /* bytes read from one IDX file */
#define GZIP_MAX_RATIO 1032                 /* deflate cannot expand by more than this */

/* One parsed IDX file: dims from the header and the payload, either inside the caller's bytes
 * (plain file) or in `owned` (decompressed gzip). */
typedef struct {
    uint32_t dims[3];
    const uint8_t *data;
    size_t data_len;
    uint8_t *owned;
} idx_part;

/* Streaming gunzip over a memory buffer; several gzip members in a row are one stream (as gzip -d). */
typedef struct {
    z_stream zs;
    const uint8_t *in;
    size_t in_len;
    int ended;      /* all members ended cleanly */
    int truncated;  /* input ran out inside a member */
} gunzip;

static int gz_init(gunzip *g, const uint8_t *in, size_t len, const char *name, dt_error *err) {
    memset(g, 0, sizeof *g);
    g->in = in;
    g->in_len = len;
    if (len > UINT32_MAX) return dt_errorf(err, DT_EFORMAT, "%s: gzip file too large", name);
    if (inflateInit2(&g->zs, 16 + MAX_WBITS) != Z_OK)
        return dt_errorf(err, DT_ENOMEM, "%s: cannot start zlib", name);
    g->zs.next_in = (Bytef *)in;
    g->zs.avail_in = (uInt)len;
    return 0;
}

/* Decompresses up to n bytes into dst; *got says how many came. Stops early at the end of the
 * data (g->ended) or when the input runs out mid-stream (g->truncated). */
static int gz_read(gunzip *g, uint8_t *dst, size_t n, size_t *got, const char *name, dt_error *err) {
    *got = 0;
    while (*got < n && !g->ended && !g->truncated) {
        size_t want = n - *got;
        if (want > (1u << 30)) want = 1u << 30;
        g->zs.next_out = dst + *got;
        g->zs.avail_out = (uInt)want;
        int rc = inflate(&g->zs, Z_NO_FLUSH);
        *got += want - g->zs.avail_out;
        if (rc == Z_STREAM_END) {
            /* Another member may follow; trailing zero padding is tolerated, other bytes are not. */
            const uint8_t *rest = g->zs.next_in;
            size_t left = g->zs.avail_in;
            if (left >= 2 && rest[0] == 0x1f && rest[1] == 0x8b) {
                if (inflateReset(&g->zs) != Z_OK)
                    return dt_errorf(err, DT_EFORMAT, "%s: corrupt gzip data", name);
                continue;
            }
            for (size_t i = 0; i < left; i++)
                if (rest[i] != 0)
                    return dt_errorf(err, DT_EFORMAT, "%s: %zu unexpected bytes after the gzip data",
                                     name, left);
            g->ended = 1;
        } else if (rc == Z_BUF_ERROR || (rc == Z_OK && g->zs.avail_in == 0 && g->zs.avail_out > 0)) {
            /* No progress possible: the input ended inside a member. */
            if (g->zs.avail_in != 0)
                return dt_errorf(err, DT_EFORMAT, "%s: corrupt gzip data", name);
            g->truncated = 1;
        } else if (rc != Z_OK) {
            return dt_errorf(err, DT_EFORMAT, "%s: corrupt gzip data: %s", name,
                             g->zs.msg ? g->zs.msg : "inflate failed");
        }
    }
    return 0;
}

/* Checks an IDX header: magic 0x000008NN (unsigned bytes, NN dims), dims within limits.
 * hdr holds at least 4 + 4*ndims bytes. */
static int idx_check_header(idx_part *p, const uint8_t *hdr, int ndims, const char *name,
                            dt_error *err) {
    uint32_t magic = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
    uint32_t want = 0x800u | (uint32_t)ndims;
    if (magic != want) {
        const char *hint = magic == 0x801 ? " (this is a labels file)"
                           : magic == 0x803 ? " (this is an images file)"
                           : (hdr[0] == 0x1f && hdr[1] == 0x8b) ? " (gzip inside gzip?)"
                                                                 : "";
        return dt_errorf(err, DT_EFORMAT, "%s: wrong magic number 0x%08x, expected 0x%08x (IDX %s)%s",
                         name, magic, want, ndims == 3 ? "images" : "labels", hint);
    }
    for (int d = 0; d < ndims; d++) {
        const uint8_t *q = hdr + 4 + 4 * d;
        p->dims[d] = (uint32_t)q[0] << 24 | (uint32_t)q[1] << 16 | (uint32_t)q[2] << 8 | q[3];
    }
    if (p->dims[0] == 0) return dt_errorf(err, DT_EFORMAT, "%s: header says 0 examples", name);
    if (p->dims[0] > DT_DS_MAX_COUNT)
        return dt_errorf(err, DT_EFORMAT, "%s: header says %u examples, over the limit of %llu", name,
                         p->dims[0], (unsigned long long)DT_DS_MAX_COUNT);
    if (ndims == 3) {
        uint64_t px = (uint64_t)p->dims[1] * p->dims[2];
        if (px == 0 || px > IDX_MAX_PIXELS)
            return dt_errorf(err, DT_EFORMAT, "%s: header says images of %ux%u pixels (allowed: 1 to %llu)",
                             name, p->dims[1], p->dims[2], (unsigned long long)IDX_MAX_PIXELS);
    }
    return 0;
}

static uint64_t idx_payload_size(const idx_part *p, int ndims) {
    return ndims == 3 ? (uint64_t)p->dims[0] * p->dims[1] * p->dims[2] : p->dims[0];
}

static void idx_describe(char *buf, size_t n, const idx_part *p, int ndims) {
    if (ndims == 3)
        snprintf(buf, n, "%u images of %ux%u", p->dims[0], p->dims[1], p->dims[2]);
    else
        snprintf(buf, n, "%u labels", p->dims[0]);
}

/* Parses one IDX file (ndims 3: images, 1: labels), plain or gzip by its first two bytes. */
static int idx_parse(idx_part *p, const uint8_t *bytes, size_t len, int ndims, const char *name,
                     dt_error *err) {
    memset(p, 0, sizeof *p);
    size_t hlen = 4 + 4 * (size_t)ndims;
    char what[128];
    if (len >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b) {
        gunzip g;
        int rc = gz_init(&g, bytes, len, name, err);
        if (rc) return rc;
        uint8_t hdr[16];
        size_t got;
        rc = gz_read(&g, hdr, hlen, &got, name, err);
        if (!rc && got < hlen)
            rc = dt_errorf(err, DT_EFORMAT, "%s: truncated: %zu bytes after decompression, an IDX header needs %zu",
                           name, got, hlen);
        if (!rc) rc = idx_check_header(p, hdr, ndims, name, err);
        uint64_t need = rc ? 0 : idx_payload_size(p, ndims);
        idx_describe(what, sizeof what, p, ndims);
        if (!rc && need + hlen > (uint64_t)len * GZIP_MAX_RATIO + 64)
            rc = dt_errorf(err, DT_EFORMAT,
                           "%s: truncated or corrupt: header says %s (%llu bytes), more than %zu compressed bytes can hold",
                           name, what, (unsigned long long)(need + hlen), len);
        if (!rc && (p->owned = dt_malloc((size_t)need, name, err)) == NULL) rc = DT_ENOMEM;
        if (!rc) rc = gz_read(&g, p->owned, (size_t)need, &got, name, err);
        if (!rc && got < need)
            rc = dt_errorf(err, DT_EFORMAT,
                           "%s: truncated: header says %s, so %llu bytes after decompression, but there are %zu%s",
                           name, what, (unsigned long long)(need + hlen), got + hlen,
                           g.truncated ? " (the gzip stream is cut short)" : "");
        if (!rc) { /* the stream must end here, with its checksum verified */
            uint8_t extra[64];
            size_t more = 0, total = 0;
            do {
                rc = gz_read(&g, extra, sizeof extra, &more, name, err);
                total += more;
            } while (!rc && more == sizeof extra && total < ((size_t)1 << 20));
            if (!rc && total > 0)
                rc = dt_errorf(err, DT_EFORMAT,
                               "%s: longer than its header says: %s need %llu bytes, decompressed data has more",
                               name, what, (unsigned long long)(need + hlen));
            else if (!rc && g.truncated)
                rc = dt_errorf(err, DT_EFORMAT, "%s: truncated: the gzip stream is cut short", name);
        }
        inflateEnd(&g.zs);
        if (rc) {
            free(p->owned);
            p->owned = NULL;
            return rc;
        }
        p->data = p->owned;
        p->data_len = (size_t)need;
        return 0;
    }
    if (len < hlen)
        return dt_errorf(err, DT_EFORMAT, "%s: truncated: %zu bytes, an IDX header needs %zu", name, len, hlen);
    int rc = idx_check_header(p, bytes, ndims, name, err);
    if (rc) return rc;
    uint64_t need = idx_payload_size(p, ndims);
    idx_describe(what, sizeof what, p, ndims);
    if (need + hlen != len)
        return dt_errorf(err, DT_EFORMAT, "%s: %s: header says %s, so %llu bytes, but the file has %zu",
                         name, need + hlen > len ? "truncated" : "longer than its header says", what,
                         (unsigned long long)(need + hlen), len);
    p->data = bytes + hlen;
    p->data_len = (size_t)need;
    return 0;
}

/* Class names "0".."k-1" of IDX labels. */
/* Builds a data set from a parsed pair. Storage: a part's decompressed buffer is adopted; a plain
 * part is adopted from *file_buf when the caller hands its file buffer over, else copied. */
static int idx_make(dt_dataset **out, idx_part *img, uint8_t **img_file, idx_part *lab,
                    uint8_t **lab_file, const char *img_name, const char *lab_name, dt_error *err) {
    if (lab && img->dims[0] != lab->dims[0])
        return dt_errorf(err, DT_EFORMAT, "%s holds %u images but %s holds %u labels", img_name,
                         img->dims[0], lab_name, lab->dims[0]);
    dt_dataset *ds = dt_ds_new(DS_IDX, err);
    if (!ds) return DT_ENOMEM;
    ds->n = img->dims[0];
    ds->h = (int)img->dims[1];
    ds->w = (int)img->dims[2];
    ds->c = 1;
    ds->bad_images = DT_BAD_IMAGES_FAIL;
    if (!(ds->source = dt_ds_str_dup(img_name, err))) {
        dt_dataset_free(ds);
        return DT_ENOMEM;
    }
    idx_part *parts[2] = {img, lab};
    uint8_t **files[2] = {img_file, lab_file};
    uint8_t **blocks[2] = {&ds->pix_block, &ds->lab_block};
    const uint8_t **views[2] = {&ds->pixels, &ds->labels8};
    for (int k = 0; k < (lab ? 2 : 1); k++) { /* images without labels: prediction's input */
        idx_part *p = parts[k];
        if (p->owned) {
            *blocks[k] = p->owned;
            p->owned = NULL;
            *views[k] = *blocks[k];
        } else if (files[k] && *files[k]) {
            *views[k] = p->data;
            *blocks[k] = *files[k];
            *files[k] = NULL;
        } else {
            *blocks[k] = dt_malloc(p->data_len, k ? lab_name : img_name, err);
            if (!*blocks[k]) {
                dt_dataset_free(ds);
                return DT_ENOMEM;
            }
            memcpy(*blocks[k], p->data, p->data_len);
            *views[k] = *blocks[k];
        }
    }
    if (!lab) {
        *out = ds;
        return 0;
    }
    int maxl = 0;
    for (size_t i = 0; i < ds->n; i++)
        if (ds->labels8[i] > maxl) maxl = ds->labels8[i];
    if (!(ds->class_names = dt_ds_numeric_names(maxl + 1, err))) {
        dt_dataset_free(ds);
        return DT_ENOMEM;
    }
    ds->num_classes = maxl + 1;
    *out = ds;
    return 0;
}

int dt_dataset_from_idx_bytes(dt_dataset **out, const uint8_t *images, size_t images_len,
                              const uint8_t *labels, size_t labels_len, const char *source,
                              dt_error *err) {
    *out = NULL;
    char img_name[600], lab_name[600];
    snprintf(img_name, sizeof img_name, "%s (images)", source ? source : "IDX data");
    snprintf(lab_name, sizeof lab_name, "%s (labels)", source ? source : "IDX data");
    idx_part img, lab;
    int rc = idx_parse(&img, images, images_len, 3, img_name, err);
    if (rc) return rc;
    rc = idx_parse(&lab, labels, labels_len, 1, lab_name, err);
    if (!rc) rc = idx_make(out, &img, NULL, &lab, NULL, img_name, lab_name, err);
    free(img.owned);
    free(lab.owned);
    return rc;
}

int dt_dataset_open_idx(dt_dataset **out, const char *images_path, const char *labels_path,
                        dt_error *err) {
    *out = NULL;
    uint8_t *ib = NULL, *lb = NULL;
    size_t il = 0, ll = 0;
    idx_part img = {0}, lab = {0};
    int rc = dt_read_file(&ib, &il, images_path, IDX_MAX_FILE, err);
    if (!rc) rc = dt_read_file(&lb, &ll, labels_path, IDX_MAX_FILE, err);
    if (!rc) rc = idx_parse(&img, ib, il, 3, images_path, err);
    if (!rc) rc = idx_parse(&lab, lb, ll, 1, labels_path, err);
    /* A gzip file's compressed bytes are no longer needed once parsed. */
    if (!rc && img.owned) free(ib), ib = NULL;
    if (!rc && lab.owned) free(lb), lb = NULL;
    if (!rc) rc = idx_make(out, &img, &ib, &lab, &lb, images_path, labels_path, err);
    free(img.owned);
    free(lab.owned);
    free(ib);
    free(lb);
    return rc;
}

static int idx_check_shape(const dt_dataset *ds, const char *file, const dt_data_options *opt,
                           dt_error *err);

int dt_dataset_open_idx_images(dt_dataset **out, const char *images_path, const dt_data_options *opt,
                               dt_error *err) {
    *out = NULL;
    uint8_t *ib = NULL;
    size_t il = 0;
    idx_part img = {0};
    int rc = dt_read_file(&ib, &il, images_path, IDX_MAX_FILE, err);
    if (!rc) rc = idx_parse(&img, ib, il, 3, images_path, err);
    if (!rc && img.owned) free(ib), ib = NULL;
    if (!rc) rc = idx_make(out, &img, &ib, NULL, NULL, images_path, NULL, err);
    if (!rc && (rc = idx_check_shape(*out, images_path, opt, err))) {
        dt_dataset_free(*out);
        *out = NULL;
    }
    free(img.owned);
    free(ib);
    return rc;
}

/* Finds "<dir>/<stem>" or "<dir>/<stem>.gz"; the plain file wins when both exist. Returns the code
 * itself (not through err, which may be NULL). */
static int idx_find(char **out, const char *dir, const char *stem, dt_error *err) {
    *out = NULL;
    char *p = dt_path_join_dup(dir, stem, err);
    if (!p) return JOIN_FAILED(err);
    if (dt_ds_is_file(p)) {
        *out = p;
        return 0;
    }
    size_t n = strlen(p);
    char *gz = dt_malloc(n + 4, "a path", err);
    if (gz) {
        memcpy(gz, p, n);
        memcpy(gz + n, ".gz", 4);
    }
    free(p);
    if (!gz) return DT_ENOMEM;
    if (!dt_ds_is_file(gz)) {
        free(gz);
        return dt_errorf(err, DT_EIO, "%s: missing %s[.gz] (an IDX folder needs the train-* and t10k-* pairs)",
                         dir, stem);
    }
    *out = gz;
    return 0;
}

int dt_ds_idx_folder_has_any(const char *dir) {
    static const char *stems[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                  "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    for (int k = 0; k < 4; k++)
        for (int gz = 0; gz < 2; gz++) {
            char name[64];
            snprintf(name, sizeof name, "%s%s", stems[k], gz ? ".gz" : "");
            char *p = dt_path_join_dup(dir, name, NULL);
            int found = p && dt_ds_is_file(p);
            free(p);
            if (found) return 1;
        }
    return 0;
}

static int idx_check_shape(const dt_dataset *ds, const char *file, const dt_data_options *opt,
                           dt_error *err) {
    if (!opt || (opt->h <= 0 && opt->w <= 0 && opt->c <= 0)) return 0;
    if (opt->h != ds->h || opt->w != ds->w || opt->c != ds->c)
        return dt_errorf(err, DT_ESHAPE, "%s holds %dx%dx%d images but the model's input is %dx%dx%d",
                         file, ds->h, ds->w, ds->c, opt->h, opt->w, opt->c);
    return 0;
}

int dt_ds_open_idx_folder(dt_data_splits *out, const char *dir, const dt_data_options *opt,
                           dt_error *err) {
    const char *stems[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                            "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    char *files[4] = {0};
    dt_dataset *train = NULL, *test = NULL;
    int rc = 0;
    for (int k = 0; k < 4 && !rc; k++) rc = idx_find(&files[k], dir, stems[k], err);
    if (!rc) rc = dt_dataset_open_idx(&train, files[0], files[1], err);
    if (!rc) rc = dt_dataset_open_idx(&test, files[2], files[3], err);
    if (!rc) rc = idx_check_shape(train, files[0], opt, err);
    if (!rc && (train->h != test->h || train->w != test->w))
        rc = dt_errorf(err, DT_ESHAPE, "%s holds %dx%d images but %s holds %dx%d", files[0], train->h,
                       train->w, files[2], test->h, test->w);
    if (!rc && train->num_classes != test->num_classes) {
        /* One class count for both: a test file without the highest label must not shrink it. */
        dt_dataset *small = train->num_classes < test->num_classes ? train : test;
        int k = train->num_classes > test->num_classes ? train->num_classes : test->num_classes;
        char **names = dt_ds_numeric_names(k, err);
        if (!names) {
            rc = DT_ENOMEM;
        } else {
            dt_ds_free_strings(small->class_names, (size_t)small->num_classes);
            small->class_names = names;
            small->num_classes = k;
        }
    }
    for (int k = 0; k < 4; k++) free(files[k]);
    if (rc) {
        dt_dataset_free(train);
        dt_dataset_free(test);
        return rc;
    }
    out->train = train;
    out->validation = out->test = test;
    return 0;
}
