/* Data sets: IDX files (plain, gzip, every refusal), the real Fashion-MNIST when installed, image
 * folders written here with libpng/libjpeg (both layouts, train/test, bad files under both
 * policies), decoding, and the bilinear resize against values worked out by hand. */
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <jpeglib.h> /* after stdio.h: it uses FILE */
#include <png.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "data/dataset.h"
#include "data/loader.h"
#include "test.h"
#include "tmpdir.h"

/* ---- helpers --------------------------------------------------------------------------------- */

static void mkdirs(const char *rel) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmp_root, rel);
    for (char *s = p + strlen(tmp_root) + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(p, 0755);
            *s = '/';
        }
    mkdir(p, 0755);
}

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

/* IDX images: pixel j of image i is (7*i + j) % 256. Caller frees. */
static uint8_t *idx_images(size_t *len, uint32_t n, uint32_t rows, uint32_t cols) {
    *len = 16 + (size_t)n * rows * cols;
    uint8_t *b = malloc(*len);
    put_be32(b, 0x803), put_be32(b + 4, n), put_be32(b + 8, rows), put_be32(b + 12, cols);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < rows * cols; j++) b[16 + (size_t)i * rows * cols + j] = (uint8_t)((7 * i + j) % 256);
    return b;
}

/* IDX labels: label of i is i % k. */
static uint8_t *idx_labels(size_t *len, uint32_t n, int k) {
    *len = 8 + n;
    uint8_t *b = malloc(*len);
    put_be32(b, 0x801), put_be32(b + 4, n);
    for (uint32_t i = 0; i < n; i++) b[8 + i] = (uint8_t)(i % (uint32_t)k);
    return b;
}

/* gzip of data (one member). Caller frees. */
static uint8_t *gzip_bytes(size_t *out_len, const uint8_t *data, size_t n) {
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
    size_t cap = deflateBound(&zs, (uLong)n) + 64;
    uint8_t *out = malloc(cap);
    zs.next_in = (Bytef *)data, zs.avail_in = (uInt)n;
    zs.next_out = out, zs.avail_out = (uInt)cap;
    deflate(&zs, Z_FINISH);
    *out_len = cap - zs.avail_out;
    deflateEnd(&zs);
    return out;
}

static void write_png(const char *path, int w, int h, int color_type, int depth, const uint8_t *rows_data,
                      size_t rowbytes, const png_color *palette, int npalette) {
    FILE *f = fopen(path, "wb");
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    if (setjmp(png_jmpbuf(png))) {
        fprintf(stderr, "png write failed\n");
        exit(1);
    }
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, depth, color_type, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (palette) png_set_PLTE(png, info, palette, npalette);
    png_write_info(png, info);
    for (int y = 0; y < h; y++) png_write_row(png, (png_bytep)(rows_data + (size_t)y * rowbytes));
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    fclose(f);
}

static void write_rgb_png(const char *path, int w, int h, const uint8_t *rgb) {
    write_png(path, w, h, PNG_COLOR_TYPE_RGB, 8, rgb, (size_t)w * 3, NULL, 0);
}

/* A solid-colour RGB PNG. */
static void write_solid_png(const char *path, int w, int h, uint8_t r, uint8_t g, uint8_t b) {
    uint8_t *px = malloc((size_t)w * h * 3);
    for (int i = 0; i < w * h; i++) px[3 * i] = r, px[3 * i + 1] = g, px[3 * i + 2] = b;
    write_rgb_png(path, w, h, px);
    free(px);
}

static void write_jpeg_opt(const char *path, int w, int h, int comps, const uint8_t *px, int quality,
                           int progressive) {
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    FILE *f = fopen(path, "wb");
    jpeg_stdio_dest(&c, f);
    c.image_width = (JDIMENSION)w, c.image_height = (JDIMENSION)h, c.input_components = comps;
    c.in_color_space = comps == 3 ? JCS_RGB : JCS_GRAYSCALE;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, quality, TRUE);
    if (progressive) jpeg_simple_progression(&c);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = (JSAMPROW)(px + (size_t)c.next_scanline * w * comps);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    fclose(f);
}

static void write_jpeg(const char *path, int w, int h, int comps, const uint8_t *px, int quality) {
    write_jpeg_opt(path, w, h, comps, px, quality, 0);
}

static void write_solid_jpeg(const char *path, int w, int h, uint8_t r, uint8_t g, uint8_t b) {
    uint8_t *px = malloc((size_t)w * h * 3);
    for (int i = 0; i < w * h; i++) px[3 * i] = r, px[3 * i + 1] = g, px[3 * i + 2] = b;
    write_jpeg(path, w, h, 3, px, 95);
    free(px);
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*n ? *n : 1);
    if (fread(b, 1, *n, f) != *n) exit(1);
    fclose(f);
    return b;
}

/* Writes the first `keep` bytes of src to dst. */
static void truncate_copy(const char *src, const char *dst, size_t keep) {
    size_t n;
    uint8_t *b = read_all(src, &n);
    write_bytes(dst, b, keep < n ? keep : n);
    free(b);
}


/* A PNG that claims w x h pixels (16-bit RGBA) but carries only a short IDAT: what the header says
 * is all a size check may look at. Small on disk, like the 480 KB PNG that inflates to 512 MB. */
static void write_png_claiming(const char *path, uint32_t w, uint32_t h) {
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    uint8_t ihdr[13];
    put_be32(ihdr, w);
    put_be32(ihdr + 4, h);
    ihdr[8] = 16, ihdr[9] = 6, ihdr[10] = ihdr[11] = ihdr[12] = 0; /* 16-bit RGBA, no interlace */
    uint8_t zeros[64] = {0}, idat[128];
    uLongf idat_len = sizeof idat;
    compress(idat, &idat_len, zeros, sizeof zeros);
    FILE *f = fopen(path, "wb");
    fwrite(sig, 1, 8, f);
    const char *types[3] = {"IHDR", "IDAT", "IEND"};
    const uint8_t *data[3] = {ihdr, idat, NULL};
    uint32_t lens[3] = {13, (uint32_t)idat_len, 0};
    for (int c = 0; c < 3; c++) {
        uint8_t hdr[8];
        put_be32(hdr, lens[c]);
        memcpy(hdr + 4, types[c], 4);
        fwrite(hdr, 1, 8, f);
        if (lens[c]) fwrite(data[c], 1, lens[c], f);
        uLong crc = crc32(crc32(0, hdr + 4, 4), data[c] ? data[c] : hdr, lens[c]);
        uint8_t cb[4];
        put_be32(cb, (uint32_t)crc);
        fwrite(cb, 1, 4, f);
    }
    fclose(f);
}

/* Rewrites the frame size in a JPEG's SOF0/SOF2 header, as a hostile file would claim. */
static void patch_jpeg_size(uint8_t *b, size_t n, int w, int h) {
    for (size_t i = 2; i + 9 < n; i++)
        if (b[i] == 0xff && (b[i + 1] == 0xc0 || b[i + 1] == 0xc2)) {
            b[i + 5] = (uint8_t)(h >> 8), b[i + 6] = (uint8_t)h;
            b[i + 7] = (uint8_t)(w >> 8), b[i + 8] = (uint8_t)w;
            return;
        }
}

/* ---- IDX ------------------------------------------------------------------------------------- */

static void check_idx_contents(dt_dataset *ds, uint32_t n, int rows, int cols, int k) {
    CHECK(dt_dataset_size(ds) == n);
    CHECK(dt_dataset_num_classes(ds) == k);
    int h, w, c;
    dt_dataset_dims(ds, &h, &w, &c);
    CHECK(h == rows && w == cols && c == 1);
    char last[16];
    snprintf(last, sizeof last, "%d", k - 1);
    CHECK(strcmp(dt_dataset_class_name(ds, k - 1), last) == 0);
    CHECK(dt_dataset_class_name(ds, k) == NULL);
    float *x = malloc(sizeof(float) * (size_t)rows * cols);
    int bad = 0;
    for (uint32_t i = 0; i < n; i++) {
        int32_t y = -1;
        CHECK(dt_dataset_get(ds, i, x, &y, NULL) == 0);
        if (y != (int32_t)(i % (uint32_t)k)) bad++;
        for (int j = 0; j < rows * cols; j++)
            if (x[j] != (float)((7 * i + (uint32_t)j) % 256) / 255.0f) bad++;
    }
    CHECK(bad == 0);
    free(x);
}

static void test_idx_plain_and_gzip(void) {
    size_t il, ll;
    uint8_t *img = idx_images(&il, 11, 3, 5), *lab = idx_labels(&ll, 11, 3);
    write_bytes(tpath("a-images"), img, il);
    write_bytes(tpath("a-labels"), lab, ll);
    dt_dataset *ds = NULL;
    dt_error e = {0};
    CHECK(dt_dataset_open_idx(&ds, tpath("a-images"), tpath("a-labels"), &e) == 0);
    if (ds) check_idx_contents(ds, 11, 3, 5, 3);
    CHECK(dt_dataset_bad_images(ds) == DT_BAD_IMAGES_FAIL);
    dt_dataset_free(ds);

    size_t gil, gll;
    uint8_t *gimg = gzip_bytes(&gil, img, il), *glab = gzip_bytes(&gll, lab, ll);
    write_bytes(tpath("a-images.gz"), gimg, gil);
    write_bytes(tpath("a-labels.gz"), glab, gll);
    ds = NULL;
    CHECK(dt_dataset_open_idx(&ds, tpath("a-images.gz"), tpath("a-labels.gz"), &e) == 0);
    if (ds) check_idx_contents(ds, 11, 3, 5, 3);
    dt_dataset_free(ds);

    /* Mixed, and from memory. */
    ds = NULL;
    CHECK(dt_dataset_from_idx_bytes(&ds, gimg, gil, lab, ll, "mem", &e) == 0);
    if (ds) check_idx_contents(ds, 11, 3, 5, 3);
    dt_dataset_free(ds);

    /* Two gzip members in a row are one stream, as gzip -d reads them. */
    size_t g1, g2;
    uint8_t *m1 = gzip_bytes(&g1, img, 20), *m2 = gzip_bytes(&g2, img + 20, il - 20);
    uint8_t *cat = malloc(g1 + g2);
    memcpy(cat, m1, g1), memcpy(cat + g1, m2, g2);
    ds = NULL;
    CHECK(dt_dataset_from_idx_bytes(&ds, cat, g1 + g2, lab, ll, "mem", &e) == 0);
    if (ds) check_idx_contents(ds, 11, 3, 5, 3);
    dt_dataset_free(ds);
    free(m1), free(m2), free(cat);
    free(img), free(lab), free(gimg), free(glab);
}

/* Expects opening (images, labels) to fail with code and a message holding each needle. */
static void expect_idx_fail(const char *images, const char *labels, int code, const char *n1,
                            const char *n2) {
    dt_dataset *ds = (dt_dataset *)1;
    dt_error e = {0};
    int rc = dt_dataset_open_idx(&ds, images, labels, &e);
    CHECK_MSG(rc == code, "rc %d, expected %d (%s)", rc, code, e.msg);
    CHECK(ds == NULL);
    CHECK(e.code == code);
    if (n1) CHECK_CONTAINS(e.msg, n1);
    if (n2) CHECK_CONTAINS(e.msg, n2);
}

static void test_idx_refusals(void) {
    size_t il, ll;
    uint8_t *img = idx_images(&il, 10, 4, 4), *lab = idx_labels(&ll, 10, 2);
    write_bytes(tpath("r-images"), img, il);
    write_bytes(tpath("r-labels"), lab, ll);

    expect_idx_fail(tpath("missing-images"), tpath("r-labels"), DT_EIO, "missing-images", NULL);
    expect_idx_fail(tpath("r-images"), tpath("missing-labels"), DT_EIO, "missing-labels", NULL);

    /* labels given as images: wrong magic, named */
    expect_idx_fail(tpath("r-labels"), tpath("r-labels"), DT_EFORMAT, "r-labels", "magic");
    uint8_t bad[16];
    memcpy(bad, img, 16);
    bad[2] = 0x0d; /* float data */
    write_bytes(tpath("magic-images"), bad, 16);
    expect_idx_fail(tpath("magic-images"), tpath("r-labels"), DT_EFORMAT, "magic-images", "0x00000d03");

    /* truncated plain: expected and actual sizes in the message */
    write_bytes(tpath("trunc-images"), img, il - 5);
    char want[64], got[64];
    snprintf(want, sizeof want, "%zu bytes", il);
    snprintf(got, sizeof got, "has %zu", il - 5);
    expect_idx_fail(tpath("trunc-images"), tpath("r-labels"), DT_EFORMAT, "trunc-images", want);
    expect_idx_fail(tpath("trunc-images"), tpath("r-labels"), DT_EFORMAT, "truncated", got);
    write_bytes(tpath("short-header"), img, 10);
    expect_idx_fail(tpath("short-header"), tpath("r-labels"), DT_EFORMAT, "short-header", "truncated");
    write_bytes(tpath("empty"), img, 0);
    expect_idx_fail(tpath("empty"), tpath("r-labels"), DT_EFORMAT, "empty", "truncated");

    /* longer than the header says */
    uint8_t *longer = malloc(il + 3);
    memcpy(longer, img, il);
    memset(longer + il, 0, 3);
    write_bytes(tpath("long-images"), longer, il + 3);
    expect_idx_fail(tpath("long-images"), tpath("r-labels"), DT_EFORMAT, "long-images", "longer");
    free(longer);

    /* truncated gzip: the compressed stream cut in the middle */
    size_t gl;
    uint8_t *gz = gzip_bytes(&gl, img, il);
    write_bytes(tpath("gz-trunc-images.gz"), gz, gl / 2);
    expect_idx_fail(tpath("gz-trunc-images.gz"), tpath("r-labels"), DT_EFORMAT, "gz-trunc-images.gz",
                    "truncated");
    /* gzip whose trailer (checksum) is missing */
    write_bytes(tpath("gz-notrailer.gz"), gz, gl - 4);
    expect_idx_fail(tpath("gz-notrailer.gz"), tpath("r-labels"), DT_EFORMAT, "gz-notrailer.gz", "truncated");
    /* corrupt deflate data */
    uint8_t *gzc = malloc(gl);
    memcpy(gzc, gz, gl);
    for (size_t i = 12; i < gl - 8; i++) gzc[i] ^= 0x5a;
    write_bytes(tpath("gz-corrupt.gz"), gzc, gl);
    expect_idx_fail(tpath("gz-corrupt.gz"), tpath("r-labels"), DT_EFORMAT, "gz-corrupt.gz", NULL);
    free(gzc);
    free(gz);
    /* gzip of a file shorter than its header says */
    gz = gzip_bytes(&gl, img, il - 16);
    write_bytes(tpath("gz-short.gz"), gz, gl);
    snprintf(want, sizeof want, "%zu bytes", il);
    expect_idx_fail(tpath("gz-short.gz"), tpath("r-labels"), DT_EFORMAT, "gz-short.gz", want);
    free(gz);

    /* count mismatch: both files named */
    size_t l2;
    uint8_t *lab9 = idx_labels(&l2, 9, 2);
    write_bytes(tpath("nine-labels"), lab9, l2);
    expect_idx_fail(tpath("r-images"), tpath("nine-labels"), DT_EFORMAT, "r-images", "nine-labels");
    free(lab9);

    /* absurd sizes: refused from the header, before allocating */
    uint8_t huge[16];
    put_be32(huge, 0x803), put_be32(huge + 4, 60000), put_be32(huge + 8, 100000), put_be32(huge + 12, 100000);
    write_bytes(tpath("huge-images"), huge, 16);
    expect_idx_fail(tpath("huge-images"), tpath("r-labels"), DT_EFORMAT, "huge-images", "100000x100000");
    put_be32(huge + 8, 0);
    write_bytes(tpath("zero-images"), huge, 16);
    expect_idx_fail(tpath("zero-images"), tpath("r-labels"), DT_EFORMAT, "zero-images", "pixels");
    put_be32(huge + 4, 0xffffffffu), put_be32(huge + 8, 28), put_be32(huge + 12, 28);
    write_bytes(tpath("many-images"), huge, 16);
    expect_idx_fail(tpath("many-images"), tpath("r-labels"), DT_EFORMAT, "many-images", "limit");
    /* gzip claiming far more than its compressed size can hold */
    put_be32(huge + 4, 1000000);
    gz = gzip_bytes(&gl, huge, 16);
    write_bytes(tpath("bomb-images.gz"), gz, gl);
    expect_idx_fail(tpath("bomb-images.gz"), tpath("r-labels"), DT_EFORMAT, "bomb-images.gz", "compressed");
    free(gz);

    /* a folder given as a file */
    expect_idx_fail(tmp_root, tpath("r-labels"), DT_EIO, tmp_root, NULL);
    free(img), free(lab);
}

static void test_idx_folder(void) {
    mkdirs("idxdir");
    size_t il, ll, tl, tll;
    uint8_t *img = idx_images(&il, 12, 2, 3), *lab = idx_labels(&ll, 12, 4);
    uint8_t *timg = idx_images(&tl, 5, 2, 3), *tlab = idx_labels(&tll, 5, 3); /* test lacks class 3 */
    write_bytes(tpath("idxdir/train-images-idx3-ubyte"), img, il);
    write_bytes(tpath("idxdir/train-labels-idx1-ubyte"), lab, ll);
    size_t g1, g2;
    uint8_t *gt = gzip_bytes(&g1, timg, tl), *gtl = gzip_bytes(&g2, tlab, tll);
    write_bytes(tpath("idxdir/t10k-images-idx3-ubyte.gz"), gt, g1);

    dt_data_splits s;
    dt_error e = {0};
    dt_data_options o = {.h = 2, .w = 3, .c = 1, .validation_fraction = -1};
    int rc = dt_data_open(&s, tpath("idxdir"), &o, &e);
    CHECK(rc == DT_EIO);
    CHECK_CONTAINS(e.msg, "t10k-labels-idx1-ubyte");
    CHECK(s.train == NULL);

    write_bytes(tpath("idxdir/t10k-labels-idx1-ubyte.gz"), gtl, g2);
    rc = dt_data_open(&s, tpath("idxdir"), &o, &e);
    CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc == 0) {
        CHECK(dt_dataset_size(s.train) == 12);
        CHECK(dt_dataset_size(s.test) == 5);
        CHECK(s.validation == s.test);
        CHECK(dt_dataset_num_classes(s.train) == 4);
        CHECK(dt_dataset_num_classes(s.test) == 4); /* one class count for both files */
        CHECK(strcmp(dt_dataset_class_name(s.test, 3), "3") == 0);
        dt_data_splits_free(&s);
    }
    /* the model's input must match */
    dt_data_options o2 = {.h = 28, .w = 28, .c = 1};
    rc = dt_data_open(&s, tpath("idxdir"), &o2, &e);
    CHECK(rc == DT_ESHAPE);
    CHECK_CONTAINS(e.msg, "train-images-idx3-ubyte");
    CHECK_CONTAINS(e.msg, "2x3x1");
    free(img), free(lab), free(timg), free(tlab), free(gt), free(gtl);
}

/* The Debian package's Fashion-MNIST; its own ctest test (test_data_fashion, `test_data
 * fashion_mnist`), which reports a skip when the data set is absent. */
static const char *fashion_dir = "/usr/share/datasets/fashion-mnist";

static void test_fashion_mnist(void) {
    const char *dir = fashion_dir;
    dt_data_splits s;
    dt_error e = {0};
    dt_data_options o = {.h = 28, .w = 28, .c = 1, .validation_fraction = -1};
    int rc = dt_data_open(&s, dir, &o, &e);
    CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc) return;
    CHECK(dt_dataset_size(s.train) == 60000);
    CHECK(dt_dataset_size(s.test) == 10000);
    CHECK(dt_dataset_num_classes(s.train) == 10);
    /* Balanced: 6000 of each class in train; values in [0, 1] with both ends reached. */
    int count[10] = {0};
    float *x = malloc(sizeof(float) * 784);
    float lo = 1, hi = 0;
    for (size_t i = 0; i < 60000; i++) {
        int32_t y;
        dt_dataset_get(s.train, i, x, &y, NULL);
        if (y >= 0 && y < 10) count[y]++;
        if (i < 100)
            for (int j = 0; j < 784; j++) lo = x[j] < lo ? x[j] : lo, hi = x[j] > hi ? x[j] : hi;
    }
    for (int k = 0; k < 10; k++) CHECK(count[k] == 6000);
    CHECK(lo == 0.0f && hi == 1.0f);
    free(x);
    dt_data_splits_free(&s);
}

/* ---- image decoding and resizing --------------------------------------------------------------- */

static void test_resize_by_hand(void) {
    /* 2x2 -> 4x4 upscale. Output coordinate o maps to src = (o + 0.5)/2 - 0.5 = -0.25, 0.25, 0.75,
     * 1.25: clamped to 0, weights 0.25 and 0.75 between the two pixels, then the last pixel. */
    const uint8_t in[4] = {0, 100, 200, 40};
    float out[16];
    CHECK(dt_resize_bilinear(out, 4, 4, in, 2, 2, 1, 1.0f, NULL) == 0);
    const float row_w[4][2] = {{1, 0}, {0.75f, 0.25f}, {0.25f, 0.75f}, {0, 1}};
    const float expect_top[4] = {0, 25, 75, 100}, expect_bottom[4] = {200, 160, 80, 40};
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 4; x++) {
            float v = row_w[y][0] * expect_top[x] + row_w[y][1] * expect_bottom[x];
            CHECK_NEAR(out[y * 4 + x], v, 1e-4);
        }
    CHECK_NEAR(out[5], 0.75 * 25 + 0.25 * 160, 1e-4); /* = 58.75 */

    /* 4x4 -> 2x2 downscale: src = (o + 0.5)*2 - 0.5 = 0.5, 2.5, the mean of each 2x2 block. */
    uint8_t in4[16];
    for (int i = 0; i < 16; i++) in4[i] = (uint8_t)(i * 10);
    float out2[4];
    CHECK(dt_resize_bilinear(out2, 2, 2, in4, 4, 4, 1, 255.0f, NULL) == 0);
    CHECK_NEAR(out2[0], (0 + 10 + 40 + 50) / 4.0 / 255.0, 1e-6);
    CHECK_NEAR(out2[1], (20 + 30 + 60 + 70) / 4.0 / 255.0, 1e-6);
    CHECK_NEAR(out2[2], (80 + 90 + 120 + 130) / 4.0 / 255.0, 1e-6);
    CHECK_NEAR(out2[3], (100 + 110 + 140 + 150) / 4.0 / 255.0, 1e-6);

    /* Channels are interpolated independently; same size is the identity. */
    uint8_t rgb[2 * 2 * 3] = {10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120};
    float same[12];
    dt_resize_bilinear(same, 2, 2, rgb, 2, 2, 3, 1.0f, NULL);
    int bad = 0;
    for (int i = 0; i < 12; i++) bad += same[i] != rgb[i];
    CHECK(bad == 0);
    /* 1x3 -> 1x2 (width 1.5x down): src x = 0.25 and 1.75. */
    uint8_t line[3] = {0, 100, 200};
    float two[2];
    dt_resize_bilinear(two, 1, 2, line, 1, 3, 1, 1.0f, NULL);
    CHECK_NEAR(two[0], 25, 1e-4);
    CHECK_NEAR(two[1], 175, 1e-4);
}

static void test_decode_formats(void) {
    dt_error e = {0};
    uint8_t *px;
    int h, w;
    /* RGB PNG: exact pixels; grey output is BT.601 luma. */
    uint8_t rgb[2 * 3 * 3];
    for (int i = 0; i < 18; i++) rgb[i] = (uint8_t)(i * 13);
    write_rgb_png(tpath("rgb.png"), 3, 2, rgb);
    size_t n;
    uint8_t *b = read_all(tpath("rgb.png"), &n);
    CHECK(dt_image_decode(&px, &h, &w, b, n, 3, 0, 0, 0, "rgb.png", &e) == 0);
    CHECK(h == 2 && w == 3);
    CHECK(px && memcmp(px, rgb, 18) == 0);
    free(px);
    CHECK(dt_image_decode(&px, &h, &w, b, n, 1, 0, 0, 0, "rgb.png", &e) == 0);
    CHECK(px && px[1] == (uint8_t)((299 * 39 + 587 * 52 + 114 * 65 + 500) / 1000));
    free(px);
    /* pixel limit: refused before decoding */
    CHECK(dt_image_decode(&px, &h, &w, b, n, 3, 0, 0, 5, "rgb.png", &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "limit");
    CHECK(px == NULL);
    free(b);

    /* RGBA: alpha dropped, colour kept. Grey+alpha, 16-bit and palette PNGs too. */
    uint8_t rgba[2 * 4] = {10, 20, 30, 0, 200, 150, 100, 255};
    write_png(tpath("rgba.png"), 2, 1, PNG_COLOR_TYPE_RGB_ALPHA, 8, rgba, 8, NULL, 0);
    b = read_all(tpath("rgba.png"), &n);
    CHECK(dt_image_decode(&px, &h, &w, b, n, 3, 0, 0, 0, "rgba.png", &e) == 0);
    CHECK(px && px[0] == 10 && px[1] == 20 && px[2] == 30 && px[3] == 200 && px[5] == 100);
    free(px), free(b);
    uint8_t ga[4] = {77, 0, 99, 128};
    write_png(tpath("ga.png"), 2, 1, PNG_COLOR_TYPE_GRAY_ALPHA, 8, ga, 4, NULL, 0);
    b = read_all(tpath("ga.png"), &n);
    CHECK(dt_image_decode(&px, &h, &w, b, n, 3, 0, 0, 0, "ga.png", &e) == 0);
    CHECK(px && px[0] == 77 && px[1] == 77 && px[2] == 77 && px[3] == 99);
    free(px), free(b);
    uint8_t g16[4] = {0x12, 0x34, 0xff, 0xff}; /* two 16-bit grey pixels */
    write_png(tpath("g16.png"), 2, 1, PNG_COLOR_TYPE_GRAY, 16, g16, 4, NULL, 0);
    b = read_all(tpath("g16.png"), &n);
    CHECK(dt_image_decode(&px, &h, &w, b, n, 1, 0, 0, 0, "g16.png", &e) == 0);
    CHECK(px && px[0] == 0x12 && px[1] == 0xff);
    free(px), free(b);
    png_color pal[2] = {{1, 2, 3}, {250, 240, 230}};
    uint8_t idx[1] = {0x40}; /* 1-bit palette indices 0,1,0,0 */
    write_png(tpath("pal.png"), 4, 1, PNG_COLOR_TYPE_PALETTE, 1, idx, 1, pal, 2);
    b = read_all(tpath("pal.png"), &n);
    CHECK(dt_image_decode(&px, &h, &w, b, n, 3, 0, 0, 0, "pal.png", &e) == 0);
    CHECK(px && w == 4 && px[0] == 1 && px[3] == 250 && px[5] == 230 && px[6] == 1);
    free(px), free(b);

    /* JPEG, solid colour: lossy, but a flat block decodes within a few levels. */
    write_solid_jpeg(tpath("solid.jpg"), 16, 8, 200, 100, 50);
    b = read_all(tpath("solid.jpg"), &n);
    CHECK(dt_image_decode(&px, &h, &w, b, n, 3, 0, 0, 0, "solid.jpg", &e) == 0);
    CHECK(h == 8 && w == 16);
    CHECK(px && abs(px[0] - 200) <= 3 && abs(px[1] - 100) <= 3 && abs(px[2] - 50) <= 3);
    free(px);
    CHECK(dt_image_decode(&px, &h, &w, b, n, 1, 0, 0, 0, "solid.jpg", &e) == 0);
    CHECK(px && abs(px[0] - (299 * 200 + 587 * 100 + 114 * 50) / 1000) <= 3);
    free(px);
    /* truncated JPEG and PNG: errors naming the source, never a partly grey image */
    for (size_t keep = 0; keep < n; keep += n / 7 + 1) {
        int rc = dt_image_decode(&px, &h, &w, b, keep, 3, 0, 0, 0, "cut.jpg", &e);
        CHECK_MSG(rc == DT_EFORMAT, "keep %zu rc %d", keep, rc);
        CHECK_CONTAINS(e.msg, "cut.jpg");
        CHECK(px == NULL);
    }
    free(b);
    b = read_all(tpath("rgb.png"), &n);
    for (size_t keep = 0; keep < n; keep += 5) {
        int rc = dt_image_decode(&px, &h, &w, b, keep, 3, 0, 0, 0, "cut.png", &e);
        CHECK_MSG(rc == DT_EFORMAT, "keep %zu rc %d", keep, rc);
        CHECK_CONTAINS(e.msg, "cut.png");
    }
    free(b);
    const char *text = "hello, not an image\n";
    CHECK(dt_image_decode(&px, &h, &w, (const uint8_t *)text, strlen(text), 3, 0, 0, 0, "a.txt", &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "a.txt");
    CHECK_CONTAINS(e.msg, "not an image");
    CHECK(dt_image_decode(&px, &h, &w, (const uint8_t *)text, 3, 2, 0, 0, 0, "a.txt", &e) == DT_EINVAL);
}

/* ---- image folders --------------------------------------------------------------------------- */

/* Class-subfolder layout: cats solid red-ish, dogs solid blue-ish, 8x6 PNG/JPEG mixed. */
static void write_class_folders(const char *root, int ncat, int ndog) {
    char rel[256];
    snprintf(rel, sizeof rel, "%s/cat", root);
    mkdirs(rel);
    snprintf(rel, sizeof rel, "%s/dog", root);
    mkdirs(rel);
    for (int i = 0; i < ncat; i++) {
        snprintf(rel, sizeof rel, "%s/cat/c%02d.png", root, i);
        write_solid_png(tpath(rel), 8, 6, 255, (uint8_t)(10 * i), 0);
    }
    for (int i = 0; i < ndog; i++) {
        snprintf(rel, sizeof rel, "%s/dog/d%02d.jpg", root, i);
        write_solid_jpeg(tpath(rel), 8, 6, 0, 0, 255);
    }
}

static void test_class_folders(void) {
    write_class_folders("classes", 6, 4);
    mkdirs("classes/.hidden");
    write_bytes(tpath("classes/.DS_Store"), "x", 1);
    dt_data_splits s;
    dt_error e = {0};
    dt_data_options o = {.h = 4, .w = 4, .c = 3, .validation_fraction = 0.2, .seed = 7};
    int rc = dt_data_open(&s, tpath("classes"), &o, &e);
    CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc) return;
    CHECK(dt_dataset_size(s.train) == 8);
    CHECK(dt_dataset_size(s.validation) == 2);
    CHECK(s.test == s.validation);
    CHECK(dt_dataset_num_classes(s.train) == 2);
    CHECK(strcmp(dt_dataset_class_name(s.train, 0), "cat") == 0);
    CHECK(strcmp(dt_dataset_class_name(s.train, 1), "dog") == 0);
    int h, w, c;
    dt_dataset_dims(s.train, &h, &w, &c);
    CHECK(h == 4 && w == 4 && c == 3);
    /* Every example is a solid image, so the resized pixels equal the colour; the colour identifies
     * the file, so train and validation together hold each file exactly once. */
    int seen[6] = {0}, nlab[2] = {0};
    float x[4 * 4 * 3];
    dt_dataset *parts[2] = {s.train, s.validation};
    for (int p = 0; p < 2; p++)
        for (size_t i = 0; i < dt_dataset_size(parts[p]); i++) {
            int32_t y = -1;
            CHECK(dt_dataset_get(parts[p], i, x, &y, &e) == 0);
            CHECK(y == 0 || y == 1);
            if (y == 0) {
                int g = (int)(x[1] * 255.0f + 0.5f) / 10;
                CHECK(x[0] == 1.0f && x[2] == 0.0f && x[47] == 0.0f);
                if (g >= 0 && g < 6) seen[g]++;
            } else if (y == 1) {
                CHECK(x[2] > 0.98f && x[0] < 0.02f);
            }
            if (y == 0 || y == 1) nlab[y]++;
        }
    for (int i = 0; i < 6; i++) CHECK(seen[i] == 1);
    CHECK(nlab[0] == 6 && nlab[1] == 4);
    CHECK(dt_dataset_bad_count(s.train) == 0);
    dt_data_splits_free(&s);

    /* same seed, same split; the split depends on the seed */
    dt_data_splits s1, s2;
    int same_seed_same = 1, other_seed_differs = 0;
    for (uint64_t seed = 0; seed < 8; seed++) {
        o.seed = seed;
        dt_data_open(&s1, tpath("classes"), &o, NULL);
        dt_data_open(&s2, tpath("classes"), &o, NULL);
        dt_data_options o3 = o;
        o3.seed = seed + 100;
        dt_data_splits s3;
        dt_data_open(&s3, tpath("classes"), &o3, NULL);
        float a[48], bb[48];
        int32_t ya, yb;
        for (size_t i = 0; i < 2; i++) {
            dt_dataset_get(s1.validation, i, a, &ya, NULL);
            dt_dataset_get(s2.validation, i, bb, &yb, NULL);
            if (ya != yb || memcmp(a, bb, sizeof a) != 0) same_seed_same = 0;
            dt_dataset_get(s3.validation, i, bb, &yb, NULL);
            if (ya != yb || memcmp(a, bb, sizeof a) != 0) other_seed_differs = 1;
        }
        dt_data_splits_free(&s1), dt_data_splits_free(&s2), dt_data_splits_free(&s3);
    }
    CHECK(same_seed_same);
    CHECK(other_seed_differs);

    /* default fraction 0.2 when negative; 0 keeps everything for training (empty validation) */
    o.validation_fraction = -1;
    CHECK(dt_data_open(&s, tpath("classes"), &o, &e) == 0);
    CHECK(dt_dataset_size(s.validation) == 2);
    dt_data_splits_free(&s);
    o.validation_fraction = 0;
    CHECK(dt_data_open(&s, tpath("classes"), &o, &e) == 0);
    CHECK(dt_dataset_size(s.train) == 10 && dt_dataset_size(s.validation) == 0);
    dt_data_splits_free(&s);
    o.validation_fraction = 1;
    CHECK(dt_data_open(&s, tpath("classes"), &o, &e) == DT_EINVAL);
    /* an image folder needs the input size */
    dt_data_options none = {.validation_fraction = -1};
    CHECK(dt_data_open(&s, tpath("classes"), &none, &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "classes");
}

static void test_flat_layout_and_train_test(void) {
    /* Kaggle naming under train/, and a test/ folder with class sub-folders */
    mkdirs("kaggle/train");
    for (int i = 0; i < 5; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "kaggle/train/dog.%d.jpg", i);
        write_solid_jpeg(tpath(rel), 10, 10, 0, 0, 255);
        snprintf(rel, sizeof rel, "kaggle/train/cat.%d.png", i);
        write_solid_png(tpath(rel), 10, 10, 255, 0, 0);
    }
    write_class_folders("kaggle/test", 2, 3);
    dt_data_splits s;
    dt_error e = {0};
    dt_data_options o = {.h = 5, .w = 5, .c = 1, .validation_fraction = 0.3, .seed = 1};
    int rc = dt_data_open(&s, tpath("kaggle"), &o, &e);
    CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc) return;
    CHECK(dt_dataset_num_classes(s.train) == 2);
    CHECK(strcmp(dt_dataset_class_name(s.train, 0), "cat") == 0);
    CHECK(dt_dataset_size(s.train) == 7 && dt_dataset_size(s.validation) == 3);
    CHECK(s.test != s.validation);
    CHECK(dt_dataset_size(s.test) == 5);
    /* grey: red cat -> luma 76, blue dog -> 29 */
    float x[25];
    int ok = 1;
    for (size_t i = 0; i < dt_dataset_size(s.train); i++) {
        int32_t y;
        if (dt_dataset_get(s.train, i, x, &y, &e)) ok = 0;
        else if (y == 0 && fabsf(x[12] - 76 / 255.0f) > 1e-6f) ok = 0;
        else if (y == 1 && fabsf(x[12] - 29 / 255.0f) > 3 / 255.0f) ok = 0;
    }
    CHECK(ok);
    int32_t y;
    CHECK(dt_dataset_get(s.test, 0, x, &y, &e) == 0 && y == 0); /* test/cat/c00.png */
    CHECK(dt_dataset_get(s.test, 4, x, &y, &e) == 0 && y == 1);
    CHECK(dt_dataset_get(s.test, 5, x, &y, &e) == DT_EINVAL);
    dt_data_splits_free(&s);

    /* a test class that train does not have */
    mkdirs("kaggle/test/bird");
    rc = dt_data_open(&s, tpath("kaggle"), &o, &e);
    CHECK(rc == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "bird");
}

static void test_bad_images(void) {
    /* class layout with a text file and a truncated JPEG */
    write_class_folders("bad", 5, 5);
    write_bytes(tpath("bad/cat/notes.txt"), "not an image", 12);
    write_bytes(tpath("bad/dog/fake.jpg"), "GIF89a....", 10);
    truncate_copy(tpath("bad/dog/d00.jpg"), tpath("bad/dog/cut.jpg"), 200);
    dt_data_splits s;
    dt_error e = {0};
    dt_data_options o = {.h = 4, .w = 4, .c = 3, .validation_fraction = 0, .bad_images = DT_BAD_IMAGES_SKIP};
    CHECK(dt_data_open(&s, tpath("bad"), &o, &e) == 0);
    CHECK(dt_dataset_size(s.train) == 13);
    float x[48];
    int32_t y;
    int fails = 0;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < 13; i++) {
            int rc = dt_dataset_get(s.train, i, x, &y, &e);
            if (rc) {
                fails++;
                CHECK(rc == DT_EFORMAT);
                CHECK(strstr(e.msg, "notes.txt") || strstr(e.msg, "cut.jpg") || strstr(e.msg, "fake.jpg"));
            }
        }
    CHECK(fails == 6);
    CHECK(dt_dataset_bad_count(s.train) == 3); /* each bad file counted once */

    /* The loader under SKIP: an evaluation pass yields the 10 good images only; training batches
     * stay full and hold no bad image. */
    dt_loader *l;
    dt_loader_options lo = {.batch_size = 4, .shuffle = 0, .shard_count = 1};
    CHECK(dt_loader_create(&l, s.train, &lo, &e) == 0);
    dt_batch b;
    int total = 0, batches = 0;
    while (dt_loader_next(l, &b, &e) == 0 && b.n > 0) total += b.n, batches++;
    CHECK(total == 10);
    CHECK(batches == 3);
    dt_loader_free(l);
    lo.shuffle = 1;
    lo.batch_size = 13;
    CHECK(dt_loader_create(&l, s.train, &lo, &e) == 0);
    for (int t = 0; t < 3; t++) {
        CHECK(dt_loader_next(l, &b, &e) == 0);
        CHECK(b.n == 13);
        int bad_rows = 0;
        for (int i = 0; i < b.n; i++) /* good images are solid red or blue */
            if (!(b.x[i * 48] > 0.98f || b.x[i * 48 + 2] > 0.98f)) bad_rows++;
        CHECK(bad_rows == 0);
    }
    dt_loader_free(l);

    /* Decoding a batch on several threads changes nothing: same rows, same order, both orders. */
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        dt_loader *one, *three;
        dt_loader_options a = {.batch_size = 6, .shuffle = shuffle, .seed = 4, .shard_count = 1};
        dt_loader_options c = a;
        c.decode_threads = 3;
        CHECK(dt_loader_create(&one, s.train, &a, &e) == 0);
        CHECK(dt_loader_create(&three, s.train, &c, &e) == 0);
        int same = 1;
        for (int t = 0; t < 4; t++) {
            dt_batch b1, b3;
            CHECK(dt_loader_next(one, &b1, &e) == 0);
            CHECK(dt_loader_next(three, &b3, &e) == 0);
            same &= b1.n == b3.n && memcmp(b1.labels, b3.labels, sizeof(int32_t) * (size_t)b1.n) == 0 &&
                    memcmp(b1.x, b3.x, sizeof(float) * 48 * (size_t)b1.n) == 0;
        }
        CHECK(same);
        dt_loader_free(one);
        dt_loader_free(three);
    }
    dt_data_splits_free(&s);

    /* under FAIL the loader's error names the file */
    o.bad_images = DT_BAD_IMAGES_FAIL;
    CHECK(dt_data_open(&s, tpath("bad"), &o, &e) == 0);
    lo.shuffle = 0;
    lo.batch_size = 20;
    CHECK(dt_loader_create(&l, s.train, &lo, &e) == 0);
    int rc = dt_loader_next(l, &b, &e);
    CHECK(rc == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "notes.txt"); /* the first bad file in order: cat/notes.txt */
    dt_loader_free(l);
    dt_data_splits_free(&s);

    /* flat layout: a name without <class>.<id>.<ext> is skipped and counted, or fatal */
    mkdirs("flatbad");
    write_solid_png(tpath("flatbad/cat.1.png"), 4, 4, 255, 0, 0);
    write_solid_png(tpath("flatbad/dog.1.png"), 4, 4, 0, 0, 255);
    write_solid_png(tpath("flatbad/dog.2.png"), 4, 4, 0, 0, 255);
    write_bytes(tpath("flatbad/readme.txt"), "hi", 2);
    write_bytes(tpath("flatbad/cat.2.jpg"), "hi", 2);
    o.bad_images = DT_BAD_IMAGES_SKIP;
    CHECK(dt_data_open(&s, tpath("flatbad"), &o, &e) == 0);
    CHECK(dt_dataset_num_classes(s.train) == 2);
    CHECK(dt_dataset_size(s.train) == 4);
    CHECK(dt_dataset_bad_count(s.train) == 1);
    CHECK(dt_dataset_get(s.train, 1, x, &y, &e) == DT_EFORMAT); /* cat.2.jpg */
    CHECK_CONTAINS(e.msg, "cat.2.jpg");
    CHECK(dt_dataset_bad_count(s.train) == 2);
    dt_data_splits_free(&s);
    o.bad_images = DT_BAD_IMAGES_FAIL;
    CHECK(dt_data_open(&s, tpath("flatbad"), &o, &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "readme.txt");
}

/* Links that loop (a -> b -> a, a -> a) or dangle cannot be read: bad images like any other
 * unreadable file, counted under skip and fatal by name under fail, never silently left out. */
static void test_symlink_loops(void) {
    write_class_folders("loops", 3, 3);
    CHECK(symlink("loop_b.jpg", tpath("loops/cat/loop_a.jpg")) == 0);
    CHECK(symlink("loop_a.jpg", tpath("loops/cat/loop_b.jpg")) == 0);
    CHECK(symlink("self.png", tpath("loops/dog/self.png")) == 0);
    CHECK(symlink("nowhere.png", tpath("loops/dog/dangling.png")) == 0);
    CHECK(symlink("c00.png", tpath("loops/cat/good_link.png")) == 0); /* a working link is an image */
    dt_data_splits s;
    dt_error e = {0};
    dt_data_options o = {.h = 4, .w = 4, .c = 3, .validation_fraction = 0, .bad_images = DT_BAD_IMAGES_SKIP};
    int rc = dt_data_open(&s, tpath("loops"), &o, &e);
    CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc) return;
    CHECK(dt_dataset_size(s.train) == 11);
    dt_loader *l;
    dt_loader_options lo = {.batch_size = 4, .shuffle = 0, .shard_count = 1};
    CHECK(dt_loader_create(&l, s.train, &lo, &e) == 0);
    dt_batch b;
    int total = 0;
    while (dt_loader_next(l, &b, &e) == 0 && b.n > 0) total += b.n;
    dt_loader_free(l);
    CHECK(total == 7);
    CHECK(dt_dataset_bad_count(s.train) == 4);
    dt_data_splits_free(&s);

    o.bad_images = DT_BAD_IMAGES_FAIL;
    CHECK(dt_data_open(&s, tpath("loops"), &o, &e) == 0);
    lo.batch_size = 11;
    CHECK(dt_loader_create(&l, s.train, &lo, &e) == 0);
    rc = dt_loader_next(l, &b, &e);
    CHECK(rc == DT_EIO);
    CHECK_CONTAINS(e.msg, "loops/cat/loop_a.jpg"); /* the first in order */
    dt_loader_free(l);
    dt_data_splits_free(&s);

    /* flat layout: a looping cat.3.jpg is a bad cat; a looping name without a class is refused at
     * open under fail, as any such file */
    mkdirs("flatloops");
    write_solid_png(tpath("flatloops/cat.1.png"), 4, 4, 255, 0, 0);
    write_solid_png(tpath("flatloops/dog.1.png"), 4, 4, 0, 0, 255);
    CHECK(symlink("cat.3.jpg", tpath("flatloops/cat.3.jpg")) == 0);
    o.bad_images = DT_BAD_IMAGES_SKIP;
    CHECK(dt_data_open(&s, tpath("flatloops"), &o, &e) == 0);
    CHECK(dt_dataset_size(s.train) == 3);
    float x[48];
    int32_t y;
    CHECK(dt_dataset_get(s.train, 1, x, &y, &e) == DT_EIO); /* cat.3.jpg */
    CHECK_CONTAINS(e.msg, "cat.3.jpg");
    CHECK(dt_dataset_bad_count(s.train) == 1);
    dt_data_splits_free(&s);
    CHECK(symlink("loop", tpath("flatloops/loop")) == 0);
    o.bad_images = DT_BAD_IMAGES_FAIL;
    CHECK(dt_data_open(&s, tpath("flatloops"), &o, &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "flatloops/loop");
}

/* Sizes come from the header, before anything is allocated: a PNG over the pixel limit and a JPEG
 * claiming too much are refused naming the file and its dimensions; a large JPEG is decoded at the
 * smallest DCT scale that still covers the size it is resized to. */
static void test_decode_limits(void) {
    dt_error e = {0};
    uint8_t *px = NULL, *b;
    int h, w;
    size_t n;
    /* 8000x8000 16-bit RGBA: 64 Mpx, under the old 2^26 limit, 457 MB and 47 s to decode */
    write_png_claiming(tpath("huge16.png"), 8000, 8000);
    b = read_all(tpath("huge16.png"), &n);
    CHECK(n < 200);
    CHECK(dt_image_decode(&px, &h, &w, b, n, 3, 128, 128, 0, "huge16.png", &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "huge16.png: PNG of 8000x8000 pixels is over the limit of 16777216 pixels");
    CHECK(px == NULL);
    free(b);
    /* at the limit is fine as far as the size goes (the data is missing, so it fails later) */
    write_png_claiming(tpath("edge.png"), 4096, 4096);
    b = read_all(tpath("edge.png"), &n);
    CHECK(dt_image_decode(&px, &h, &w, b, n, 3, 0, 0, 0, "edge.png", &e) == DT_EFORMAT);
    CHECK(strstr(e.msg, "limit") == NULL);
    free(b);

    /* A gradient JPEG, 1024x768: the scale is the smallest that still covers the target. */
    int W = 1024, H = 768;
    uint8_t *g = malloc((size_t)W * H * 3);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            uint8_t *p = g + ((size_t)y * W + x) * 3;
            p[0] = (uint8_t)(x / 4), p[1] = (uint8_t)(y / 3), p[2] = (uint8_t)((x + y) / 8);
        }
    write_jpeg(tpath("grad.jpg"), W, H, 3, g, 92);
    write_jpeg_opt(tpath("grad_prog.jpg"), W, H, 3, g, 92, 1);
    free(g);
    b = read_all(tpath("grad.jpg"), &n);
    const struct { int min_h, min_w, h, w; } cases[] = {
        {0, 0, 768, 1024}, {128, 128, 192, 256}, {1, 1, 96, 128}, {200, 200, 384, 512},
        {96, 128, 96, 128}, {97, 128, 192, 256}, {768, 1024, 768, 1024}, {2000, 2000, 768, 1024},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int rc = dt_image_decode(&px, &h, &w, b, n, 3, cases[k].min_h, cases[k].min_w, 0, "grad.jpg", &e);
        CHECK_MSG(rc == 0 && h == cases[k].h && w == cases[k].w, "min %dx%d: rc %d, got %dx%d, want %dx%d",
                  cases[k].min_h, cases[k].min_w, rc, h, w, cases[k].h, cases[k].w);
        free(px);
    }
    /* Decoded at 1/4 and resized to 128x128, or at full size and resized: the same picture. */
    float *scaled = malloc(sizeof(float) * 128 * 128 * 3), *full = malloc(sizeof(float) * 128 * 128 * 3);
    CHECK(dt_image_decode(&px, &h, &w, b, n, 3, 128, 128, 0, "grad.jpg", &e) == 0);
    CHECK(dt_resize_bilinear(scaled, 128, 128, px, h, w, 3, 255.0f, &e) == 0);
    free(px);
    CHECK(dt_image_decode(&px, &h, &w, b, n, 3, 0, 0, 0, "grad.jpg", &e) == 0);
    CHECK(dt_resize_bilinear(full, 128, 128, px, h, w, 3, 255.0f, &e) == 0);
    free(px);
    double worst = 0;
    for (int i = 0; i < 128 * 128 * 3; i++) worst = fmax(worst, fabs(scaled[i] - full[i]));
    CHECK_MSG(worst < 3.0 / 255, "worst difference %g levels", worst * 255);
    free(scaled), free(full);

    /* Headers claiming more: over 4 x the limit refused whatever the scale; over the limit at the
     * scale used refused; the same header with a small target passes the size checks. */
    patch_jpeg_size(b, n, 30000, 30000);
    CHECK(dt_image_decode(&px, &h, &w, b, n, 3, 128, 128, 0, "claims.jpg", &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "claims.jpg: JPEG of 30000x30000 pixels is empty or over the limit of 67108864 pixels");
    patch_jpeg_size(b, n, 6000, 6000);
    CHECK(dt_image_decode(&px, &h, &w, b, n, 3, 0, 0, 0, "claims.jpg", &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "claims.jpg: JPEG of 6000x6000 pixels decodes to 6000x6000 (scale 1/1), over the limit");
    CHECK(dt_image_decode(&px, &h, &w, b, n, 3, 4000, 4000, 0, "claims.jpg", &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "over the limit");
    /* at 1/2 (3000x3000) or 1/8 it passes the size checks; its data is a 1024x768 image's */
    CHECK(dt_image_decode(&px, &h, &w, b, n, 3, 2000, 2000, 0, "claims.jpg", &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "not a valid JPEG image");
    CHECK(dt_image_decode(&px, &h, &w, b, n, 3, 128, 128, 0, "claims.jpg", &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "not a valid JPEG image");
    CHECK(px == NULL);
    free(b);

    /* A progressive JPEG keeps every coefficient of the full image, whatever the scale: bounded by
     * 8 bytes per max_pixels (a baseline one of the same size decodes in a few rows). */
    b = read_all(tpath("grad_prog.jpg"), &n);
    CHECK(dt_image_decode(&px, &h, &w, b, n, 3, 96, 128, 0, "grad_prog.jpg", &e) == 0);
    CHECK(h == 96 && w == 128);
    free(px);
    CHECK(dt_image_decode(&px, &h, &w, b, n, 3, 96, 128, (size_t)1 << 18, "grad_prog.jpg", &e) == DT_EFORMAT);
    CHECK_CONTAINS(e.msg, "grad_prog.jpg: JPEG of 1024x768 pixels needs more than 2.0 MiB to decode");
    CHECK(px == NULL);
    free(b);
    b = read_all(tpath("grad.jpg"), &n);
    CHECK(dt_image_decode(&px, &h, &w, b, n, 3, 96, 128, (size_t)1 << 18, "grad.jpg", &e) == 0);
    free(px);
    free(b);

    /* In a data set the huge PNG is a bad image: counted under skip, fatal by name under fail. */
    write_class_folders("huge", 2, 2);
    write_png_claiming(tpath("huge/cat/huge16.png"), 8000, 8000);
    dt_data_splits s;
    dt_data_options o = {.h = 4, .w = 4, .c = 3, .validation_fraction = 0, .bad_images = DT_BAD_IMAGES_SKIP};
    CHECK(dt_data_open(&s, tpath("huge"), &o, &e) == 0);
    float x[48];
    int32_t y;
    int bad = 0;
    for (size_t i = 0; i < dt_dataset_size(s.train); i++)
        if (dt_dataset_get(s.train, i, x, &y, &e)) {
            bad++;
            CHECK_CONTAINS(e.msg, "huge/cat/huge16.png: PNG of 8000x8000 pixels");
        }
    CHECK(bad == 1 && dt_dataset_bad_count(s.train) == 1);
    dt_data_splits_free(&s);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "fashion_mnist")) {
        struct stat st;
        if (stat(fashion_dir, &st) != 0) {
            fprintf(stderr, "skipped: %s absent (Debian package dataset-fashion-mnist)\n", fashion_dir);
            return 77; /* SKIP_RETURN_CODE in CMakeLists.txt: ctest counts it as skipped */
        }
        RUN(test_fashion_mnist);
        return test_summary();
    }
    tmp_make("data");
    RUN(test_idx_plain_and_gzip);
    RUN(test_idx_refusals);
    RUN(test_idx_folder);
    RUN(test_resize_by_hand);
    RUN(test_decode_formats);
    RUN(test_decode_limits);
    RUN(test_class_folders);
    RUN(test_flat_layout_and_train_test);
    RUN(test_bad_images);
    RUN(test_symlink_loops);
    tmp_remove();
    return test_summary();
}
