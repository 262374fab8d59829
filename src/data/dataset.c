/* Data sets: IDX pairs held in memory as uint8, and image folders decoded on demand.
 * Every size an IDX header claims is checked against the bytes actually there before anything is
 * allocated for it, so a hostile or truncated file costs an error message, not memory. */
#include "data/dataset.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "core/error.h"
#include "core/rng.h"
#include "data/listing.h"
#include "io/fsutil.h"

enum { DS_IDX = 1, DS_FOLDER = 2 };

#define IDX_MAX_PIXELS ((uint64_t)1 << 24)  /* per image: refuses absurd rows x cols */
#define IDX_MAX_COUNT ((uint64_t)1 << 31)   /* examples: the loader permutes uint32 indices */
#define IDX_MAX_FILE ((size_t)1 << 32)      /* bytes read from one IDX file */
#define IMAGE_MAX_FILE ((size_t)256 << 20)  /* bytes read from one image file */
#define GZIP_MAX_RATIO 1032                 /* deflate cannot expand by more than this */

struct dt_dataset {
    int kind;
    size_t n;
    int h, w, c;                 /* delivered example shape */
    int num_classes;
    char **class_names;          /* [num_classes], owned */
    char *source;                /* IDX: the images file's name, owned */
    dt_bad_image_policy bad_images;
    /* IDX */
    uint8_t *pix_block, *lab_block; /* owned storage the two pointers below point into */
    const uint8_t *pixels;       /* [n, h*w] */
    const uint8_t *labels8;      /* [n] */
    /* image folder */
    char **paths;                /* [n], owned */
    int32_t *labels;             /* [n] */
    atomic_uchar *bad;           /* [n] 1 once example i failed to decode */
    atomic_size_t bad_count;
};

/* ---- small helpers --------------------------------------------------------------------------- */

static char *str_dup(const char *s, dt_error *err) {
    size_t n = strlen(s) + 1;
    char *d = dt_malloc(n, "a string", err);
    if (d) memcpy(d, s, n);
    return d;
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static void free_strings(char **v, size_t n) {
    if (!v) return;
    for (size_t i = 0; i < n; i++) free(v[i]);
    free(v);
}

static dt_dataset *dataset_new(int kind, dt_error *err) {
    dt_dataset *ds = dt_calloc(1, sizeof *ds, "data set", err);
    if (!ds) return NULL;
    ds->kind = kind;
    atomic_init(&ds->bad_count, 0);
    return ds;
}

void dt_dataset_free(dt_dataset *ds) {
    if (!ds) return;
    free_strings(ds->class_names, (size_t)ds->num_classes);
    free(ds->source);
    free(ds->pix_block);
    free(ds->lab_block);
    free_strings(ds->paths, ds->n);
    free(ds->labels);
    free(ds->bad);
    free(ds);
}

void dt_data_splits_free(dt_data_splits *s) {
    if (!s) return;
    if (s->test != s->validation) dt_dataset_free(s->test);
    dt_dataset_free(s->validation);
    dt_dataset_free(s->train);
    s->train = s->validation = s->test = NULL;
}

/* ---- IDX ------------------------------------------------------------------------------------- */

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
    if (p->dims[0] > IDX_MAX_COUNT)
        return dt_errorf(err, DT_EFORMAT, "%s: header says %u examples, over the limit of %llu", name,
                         p->dims[0], (unsigned long long)IDX_MAX_COUNT);
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
static char **numeric_names(int k, dt_error *err) {
    char **names = dt_calloc((size_t)k, sizeof(char *), "class names", err);
    for (int i = 0; names && i < k; i++) {
        char num[16];
        snprintf(num, sizeof num, "%d", i);
        if (!(names[i] = str_dup(num, err))) {
            free_strings(names, (size_t)k);
            names = NULL;
        }
    }
    return names;
}

/* Builds a data set from a parsed pair. Storage: a part's decompressed buffer is adopted; a plain
 * part is adopted from *file_buf when the caller hands its file buffer over, else copied. */
static int idx_make(dt_dataset **out, idx_part *img, uint8_t **img_file, idx_part *lab,
                    uint8_t **lab_file, const char *img_name, const char *lab_name, dt_error *err) {
    if (lab && img->dims[0] != lab->dims[0])
        return dt_errorf(err, DT_EFORMAT, "%s holds %u images but %s holds %u labels", img_name,
                         img->dims[0], lab_name, lab->dims[0]);
    dt_dataset *ds = dataset_new(DS_IDX, err);
    if (!ds) return DT_ENOMEM;
    ds->n = img->dims[0];
    ds->h = (int)img->dims[1];
    ds->w = (int)img->dims[2];
    ds->c = 1;
    ds->bad_images = DT_BAD_IMAGES_FAIL;
    if (!(ds->source = str_dup(img_name, err))) {
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
    if (!(ds->class_names = numeric_names(maxl + 1, err))) {
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
    if (is_file(p)) {
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
    if (!is_file(gz)) {
        free(gz);
        return dt_errorf(err, DT_EIO, "%s: missing %s[.gz] (an IDX folder needs the train-* and t10k-* pairs)",
                         dir, stem);
    }
    *out = gz;
    return 0;
}

static int idx_folder_has_any(const char *dir) {
    static const char *stems[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                  "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    for (int k = 0; k < 4; k++)
        for (int gz = 0; gz < 2; gz++) {
            char name[64];
            snprintf(name, sizeof name, "%s%s", stems[k], gz ? ".gz" : "");
            char *p = dt_path_join_dup(dir, name, NULL);
            int found = p && is_file(p);
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

static int open_idx_folder(dt_data_splits *out, const char *dir, const dt_data_options *opt,
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
        char **names = numeric_names(k, err);
        if (!names) {
            rc = DT_ENOMEM;
        } else {
            free_strings(small->class_names, (size_t)small->num_classes);
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

/* ---- image folders --------------------------------------------------------------------------- */

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted names of the non-hidden entries of dir that are folders (want_dirs) or regular files;
 * entries that cannot be looked at (stat fails) count as files. */
int dt_data_list_dir(char ***names, size_t *count, const char *dir, int want_dirs, dt_error *err) {
    *names = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return dt_errorf(err, DT_EIO, "%s: cannot open folder: %s", dir, strerror(errno));
    char **v = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    while (!rc && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        int isdir, isfile;
        if (e->d_type == DT_DIR || e->d_type == DT_REG) {
            isdir = e->d_type == DT_DIR;
            isfile = !isdir;
        } else { /* links and file systems without d_type */
            char *p = dt_path_join_dup(dir, e->d_name, err);
            if (!p) {
                rc = JOIN_FAILED(err);
                break;
            }
            struct stat st;
            if (stat(p, &st) == 0) {
                isdir = S_ISDIR(st.st_mode);
                isfile = S_ISREG(st.st_mode);
            } else {
                /* A link that loops or dangles, or an entry we may not look at: listed as a file,
                 * so that reading it makes it a bad image, counted or fatal by name, instead of
                 * leaving it out without a word. */
                isdir = 0;
                isfile = 1;
            }
            free(p);
        }
        if (want_dirs ? !isdir : !isfile) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **nv = realloc(v, cap * sizeof *v);
            if (!nv) {
                rc = dt_errorf(err, DT_ENOMEM, "%s: out of memory listing the folder", dir);
                break;
            }
            v = nv;
        }
        if (!(v[n] = str_dup(e->d_name, err))) rc = DT_ENOMEM;
        else n++;
    }
    closedir(d);
    if (rc) {
        free_strings(v, n);
        return rc;
    }
    if (n) qsort(v, n, sizeof *v, cmp_str);
    *names = v;
    *count = n;
    return 0;
}

/* Labelled files of one root folder. */
typedef struct {
    char **paths;
    int32_t *labels;
    size_t n, cap;
    size_t off_pattern; /* flat-layout files without the <class>.<id>.<ext> form, skipped */
} listing;

static void listing_free(listing *L) {
    free_strings(L->paths, L->n);
    free(L->labels);
    memset(L, 0, sizeof *L);
}

static int listing_add(listing *L, const char *dir, const char *name, int32_t label, dt_error *err) {
    if (L->n == L->cap) {
        size_t cap = L->cap ? 2 * L->cap : 256;
        char **np = realloc(L->paths, cap * sizeof *np);
        if (!np) return dt_errorf(err, DT_ENOMEM, "%s: out of memory listing images", dir);
        L->paths = np;
        int32_t *nl = realloc(L->labels, cap * sizeof *nl);
        if (!nl) return dt_errorf(err, DT_ENOMEM, "%s: out of memory listing images", dir);
        L->labels = nl;
        L->cap = cap;
    }
    char *p = dt_path_join_dup(dir, name, err);
    if (!p) return JOIN_FAILED(err);
    L->paths[L->n] = p;
    L->labels[L->n] = label;
    L->n++;
    return 0;
}

static int find_class(char **classes, int k, const char *name) {
    char *const *hit = bsearch(&name, classes, (size_t)k, sizeof *classes, cmp_str);
    return hit ? (int)(hit - classes) : -1;
}

/* Class of a flat-layout name "cat.123.jpg": the text before the first '.', which must be followed
 * by more text with another '.'. Returns the prefix length, or 0 when the name does not fit. */
static size_t flat_prefix(const char *name) {
    const char *dot = strchr(name, '.');
    if (!dot || dot == name || !strchr(dot + 1, '.')) return 0;
    return (size_t)(dot - name);
}

/* Lists root. With *classes NULL the classes are discovered (sorted sub-folder names, or sorted
 * flat-name prefixes) and returned; otherwise names are mapped onto the given classes and an
 * unknown one is an error (a test/ folder must use train/'s classes). */
static int list_root(listing *L, char ***classes, int *nclasses, const char *root,
                     const dt_data_options *opt, dt_error *err) {
    memset(L, 0, sizeof *L);
    int discover = *classes == NULL;
    char **subdirs = NULL, **files = NULL;
    size_t nsub = 0, nfiles = 0;
    int rc = dt_data_list_dir(&subdirs, &nsub, root, 1, err);
    if (!rc && nsub > 0) { /* one sub-folder per class */
        if (discover) {
            if (nsub > INT32_MAX) nsub = INT32_MAX;
            *classes = subdirs;
            *nclasses = (int)nsub;
            subdirs = NULL;
        }
        char **names = discover ? *classes : subdirs;
        for (size_t s = 0; !rc && s < nsub; s++) {
            int label = discover ? (int)s : find_class(*classes, *nclasses, names[s]);
            if (label < 0) {
                rc = dt_errorf(err, DT_EFORMAT, "%s/%s: class folder not among the training classes",
                               root, names[s]);
                break;
            }
            char *dir = dt_path_join_dup(root, names[s], err);
            if (!dir) rc = JOIN_FAILED(err);
            if (!rc) rc = dt_data_list_dir(&files, &nfiles, dir, 0, err);
            for (size_t f = 0; !rc && f < nfiles; f++) rc = listing_add(L, dir, files[f], label, err);
            free_strings(files, nfiles);
            files = NULL;
            free(dir);
        }
    } else if (!rc) { /* flat: class = text before the first '.' */
        rc = dt_data_list_dir(&files, &nfiles, root, 0, err);
        if (!rc && discover) {
            char **pre = dt_calloc(nfiles ? nfiles : 1, sizeof *pre, "class names", err);
            size_t np = 0;
            if (!pre) rc = DT_ENOMEM;
            for (size_t f = 0; !rc && f < nfiles; f++) {
                size_t k = flat_prefix(files[f]);
                if (!k) continue;
                if (!(pre[np] = dt_malloc(k + 1, "a class name", err))) {
                    rc = DT_ENOMEM;
                    break;
                }
                memcpy(pre[np], files[f], k);
                pre[np++][k] = 0;
            }
            if (!rc && np) { /* sort, then keep the distinct names */
                qsort(pre, np, sizeof *pre, cmp_str);
                size_t u = 0;
                for (size_t i = 0; i < np; i++) {
                    if (u && strcmp(pre[u - 1], pre[i]) == 0) free(pre[i]);
                    else pre[u++] = pre[i];
                }
                np = u;
            }
            if (rc || np > INT32_MAX) {
                free_strings(pre, np);
                if (!rc) rc = dt_errorf(err, DT_EFORMAT, "%s: too many classes", root);
            } else {
                *classes = pre;
                *nclasses = (int)np;
            }
        }
        for (size_t f = 0; !rc && f < nfiles; f++) {
            size_t k = flat_prefix(files[f]);
            if (!k) {
                if (opt->bad_images == DT_BAD_IMAGES_FAIL)
                    rc = dt_errorf(err, DT_EFORMAT,
                                   "%s/%s: not named <class>.<id>.<ext> as files in a flat image folder must be",
                                   root, files[f]);
                L->off_pattern++;
                continue;
            }
            char cls[256];
            snprintf(cls, sizeof cls, "%.*s", (int)(k < 255 ? k : 255), files[f]);
            int label = find_class(*classes, *nclasses, cls);
            if (label < 0)
                rc = dt_errorf(err, DT_EFORMAT, "%s/%s: class '%s' not among the training classes", root,
                               files[f], cls);
            else
                rc = listing_add(L, root, files[f], label, err);
        }
    }
    free_strings(subdirs, nsub);
    free_strings(files, nfiles);
    if (!rc && L->n == 0)
        rc = dt_errorf(err, DT_EFORMAT, "%s: no image files found (expected one sub-folder per class, "
                                        "or files named <class>.<id>.jpg)", root);
    if (!rc && L->n > IDX_MAX_COUNT) rc = dt_errorf(err, DT_EFORMAT, "%s: too many files", root);
    if (rc) listing_free(L);
    return rc;
}

/* A folder data set over the listed entries idx[0..n) (moved out of L). */
static int folder_make(dt_dataset **out, listing *L, const uint32_t *idx, size_t n, char **classes,
                       int nclasses, const dt_data_options *opt, size_t off_pattern, dt_error *err) {
    dt_dataset *ds = dataset_new(DS_FOLDER, err);
    if (!ds) return DT_ENOMEM;
    ds->h = opt->h, ds->w = opt->w, ds->c = opt->c;
    ds->bad_images = opt->bad_images;
    ds->class_names = dt_calloc((size_t)nclasses, sizeof(char *), "class names", err);
    ds->paths = dt_calloc(n, sizeof(char *), "image paths", err);
    ds->labels = dt_calloc(n, sizeof(int32_t), "labels", err);
    ds->bad = dt_calloc(n, sizeof(atomic_uchar), "bad-image flags", err);
    if (!ds->class_names || !ds->paths || !ds->labels || !ds->bad) {
        dt_dataset_free(ds);
        return DT_ENOMEM;
    }
    ds->num_classes = nclasses;
    for (int k = 0; k < nclasses; k++)
        if (!(ds->class_names[k] = str_dup(classes[k], err))) {
            dt_dataset_free(ds);
            return DT_ENOMEM;
        }
    for (size_t i = 0; i < n; i++) {
        ds->paths[i] = L->paths[idx[i]];
        L->paths[idx[i]] = NULL;
        ds->labels[i] = L->labels[idx[i]];
        atomic_init(&ds->bad[i], 0);
    }
    ds->n = n;
    atomic_store(&ds->bad_count, off_pattern);
    *out = ds;
    return 0;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Images are decoded to the model's input: its size must be one they can be resized to. */
static int check_image_input(const char *path, const dt_data_options *opt, dt_error *err) {
    if (opt->h <= 0 || opt->w <= 0 || opt->h > 16384 || opt->w > 16384 || (opt->c != 1 && opt->c != 3))
        return dt_errorf(err, DT_EINVAL, "%s: images need the model's input size (got %dx%dx%d; "
                                         "channels 1 or 3)", path, opt->h, opt->w, opt->c);
    return 0;
}

int dt_dataset_from_paths(dt_dataset **out, char *const *paths, size_t n, const dt_data_options *opt,
                          dt_error *err) {
    *out = NULL;
    int rc = check_image_input(n ? paths[0] : "images", opt, err);
    if (rc) return rc;
    if (n == 0) return dt_errorf(err, DT_EINVAL, "no image files given");
    if (n > IDX_MAX_COUNT) return dt_errorf(err, DT_EINVAL, "%zu image files, over the limit of %llu", n,
                                            (unsigned long long)IDX_MAX_COUNT);
    listing L = {0};
    uint32_t *idx = dt_malloc(n * sizeof *idx, "image indices", err);
    if (!idx) return DT_ENOMEM;
    for (size_t i = 0; !rc && i < n; i++) {
        idx[i] = (uint32_t)i;
        rc = listing_add(&L, "", paths[i], -1, err); /* no label: -1 */
    }
    if (!rc) rc = folder_make(out, &L, idx, n, NULL, 0, opt, 0, err);
    free(idx);
    listing_free(&L);
    return rc;
}

static int open_image_folder(dt_data_splits *out, const char *path, const dt_data_options *opt,
                             dt_error *err) {
    int rc0 = check_image_input(path, opt, err);
    if (rc0) return rc0;
    double frac = opt->validation_fraction < 0 ? 0.2 : opt->validation_fraction;
    if (!(frac < 1.0))
        return dt_errorf(err, DT_EINVAL, "validation fraction %g must be below 1", frac);
    char *train_dir = dt_path_join_dup(path, "train", err), *test_dir = dt_path_join_dup(path, "test", err);
    if (!train_dir || !test_dir) {
        free(train_dir);
        free(test_dir);
        return JOIN_FAILED(err);
    }
    int split_layout = is_dir(train_dir);
    const char *root = split_layout ? train_dir : path;
    int has_test = split_layout && is_dir(test_dir);

    char **classes = NULL;
    int nclasses = 0;
    listing L, T = {0};
    uint32_t *idx = NULL;
    dt_dataset *train = NULL, *val = NULL, *test = NULL;
    int rc = list_root(&L, &classes, &nclasses, root, opt, err);
    if (!rc) {
        size_t n = L.n;
        size_t nval = (size_t)floor((double)n * frac + 0.5);
        if (nval >= n)
            rc = dt_errorf(err, DT_EINVAL, "%s: %zu images leave none for training with validation fraction %g",
                           root, n, frac);
        if (!rc && !(idx = dt_malloc(n * sizeof *idx, "split indices", err))) rc = DT_ENOMEM;
        if (!rc) {
            for (size_t i = 0; i < n; i++) idx[i] = (uint32_t)i;
            dt_shuffle_u32(idx, (uint32_t)n, opt->seed);
            /* Each split keeps file order; the loader shuffles the training split per epoch. */
            qsort(idx, nval, sizeof *idx, cmp_u32);
            qsort(idx + nval, n - nval, sizeof *idx, cmp_u32);
            rc = folder_make(&val, &L, idx, nval, classes, nclasses, opt, 0, err);
            if (!rc)
                rc = folder_make(&train, &L, idx + nval, n - nval, classes, nclasses, opt, L.off_pattern, err);
        }
    }
    if (!rc && has_test) {
        rc = list_root(&T, &classes, &nclasses, test_dir, opt, err);
        uint32_t *tidx = rc ? NULL : realloc(idx, T.n * sizeof *idx);
        if (!rc && !tidx) rc = dt_errorf(err, DT_ENOMEM, "out of memory listing %s", test_dir);
        if (tidx) idx = tidx;
        if (!rc) {
            for (size_t i = 0; i < T.n; i++) idx[i] = (uint32_t)i;
            rc = folder_make(&test, &T, idx, T.n, classes, nclasses, opt, T.off_pattern, err);
        }
    }
    free(idx);
    listing_free(&L);
    listing_free(&T);
    free_strings(classes, (size_t)nclasses);
    free(train_dir);
    free(test_dir);
    if (rc) {
        dt_dataset_free(train);
        dt_dataset_free(val);
        dt_dataset_free(test);
        return rc;
    }
    out->train = train;
    out->validation = val;
    out->test = has_test ? test : val;
    return 0;
}

int dt_data_open(dt_data_splits *out, const char *path, const dt_data_options *opt, dt_error *err) {
    memset(out, 0, sizeof *out);
    dt_data_options defaults = {.validation_fraction = -1};
    if (!opt) opt = &defaults;
    struct stat st;
    if (!path || !*path) return dt_errorf(err, DT_EINVAL, "no data path given");
    if (stat(path, &st) != 0) return dt_errorf(err, DT_EIO, "%s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return dt_errorf(err, DT_EINVAL, "%s: not a folder (expected IDX files or an image folder)", path);
    if (idx_folder_has_any(path)) return open_idx_folder(out, path, opt, err);
    return open_image_folder(out, path, opt, err);
}

/* ---- access ---------------------------------------------------------------------------------- */

size_t dt_dataset_size(const dt_dataset *ds) { return ds->n; }
int dt_dataset_num_classes(const dt_dataset *ds) { return ds->num_classes; }
dt_bad_image_policy dt_dataset_bad_images(const dt_dataset *ds) { return ds->bad_images; }

const char *dt_dataset_class_name(const dt_dataset *ds, int k) {
    return k >= 0 && k < ds->num_classes ? ds->class_names[k] : NULL;
}

char *const *dt_dataset_class_names(const dt_dataset *ds) {
    return ds->kind == DS_FOLDER && ds->num_classes > 0 ? ds->class_names : NULL;
}

const char *dt_dataset_source(const dt_dataset *ds) { return ds->source; }

const char *dt_dataset_path(const dt_dataset *ds, size_t i) {
    return ds->kind == DS_FOLDER && i < ds->n ? ds->paths[i] : NULL;
}

void dt_dataset_dims(const dt_dataset *ds, int *h, int *w, int *c) {
    if (h) *h = ds->h;
    if (w) *w = ds->w;
    if (c) *c = ds->c;
}

size_t dt_dataset_bad_count(const dt_dataset *ds) {
    return atomic_load(&((dt_dataset *)ds)->bad_count);
}

static void mark_bad(const dt_dataset *ds, size_t i) {
    dt_dataset *m = (dt_dataset *)ds; /* the flags and the count are the mutable part */
    if (atomic_exchange(&m->bad[i], 1) == 0) atomic_fetch_add(&m->bad_count, 1);
}

int dt_dataset_get(const dt_dataset *ds, size_t i, float *x, int32_t *label, dt_error *err) {
    // x [h, w, c]
    if (i >= ds->n)
        return dt_errorf(err, DT_EINVAL, "example %zu out of range (data set has %zu)", i, ds->n);
    if (ds->kind == DS_IDX) {
        size_t d = (size_t)ds->h * (size_t)ds->w;
        const uint8_t *p = ds->pixels + i * d;
        for (size_t j = 0; j < d; j++) x[j] = (float)p[j] / 255.0f;
        *label = ds->labels8 ? ds->labels8[i] : -1;
        return 0;
    }
    const char *path = ds->paths[i];
    if (atomic_load(&ds->bad[i]))
        return dt_errorf(err, DT_EFORMAT, "%s: not a decodable image (failed before)", path);
    uint8_t *bytes = NULL, *pix = NULL;
    size_t len = 0;
    int ih = 0, iw = 0;
    int rc = dt_read_file(&bytes, &len, path, IMAGE_MAX_FILE, err);
    if (!rc) rc = dt_image_decode(&pix, &ih, &iw, bytes, len, ds->c, ds->h, ds->w, 0, path, err);
    free(bytes);
    if (!rc) rc = dt_resize_bilinear(x, ds->h, ds->w, pix, ih, iw, ds->c, 255.0f, err);
    free(pix);
    if (rc == DT_EFORMAT || rc == DT_EIO) mark_bad(ds, i);
    if (rc) return rc;
    *label = ds->labels[i];
    return 0;
}
