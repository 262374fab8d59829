/* JPEG (libjpeg-turbo) and PNG (libpng) decoding into 8-bit grey or RGB, and the bilinear resize.
 * Both libraries report fatal errors through a callback that must not return; we longjmp back to
 * the decode call, so a corrupt file becomes a DT_EFORMAT error instead of exit(). Variables that
 * change between setjmp and longjmp are volatile.
 * Sizes are checked from the header before anything is allocated: a small file can claim a huge
 * image (deflate packs 512 MB of zeros into 500 KB), so the limits bound memory and time per image
 * (docs/data.md). */
#include "data/dataset.h"

#include <jpeglib.h>
#include <jerror.h>
#include <limits.h>
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* ---- channel conversion ---------------------------------------------------------------------- */

/* BT.601 luma, as OpenCV's RGB2GRAY and libjpeg's Y channel. */
static inline uint8_t luma(int r, int g, int b) {
    return (uint8_t)((299 * r + 587 * g + 114 * b + 500) / 1000);
}

/* out [n, out_c] from in [n, in_c]; in_c 2 and 4 carry alpha in the last channel, which is dropped.
 * out_c is 1 or 3. out may be in when out_c <= in_c: pixel i is read before it is written, and
 * writes land at or before the pixel being read. */
static void convert_channels(uint8_t *out, int out_c, const uint8_t *in, int in_c, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const uint8_t *p = in + i * (size_t)in_c;
        uint8_t *q = out + i * (size_t)out_c;
        int grey_in = in_c <= 2;
        if (out_c == 1) {
            q[0] = grey_in ? p[0] : luma(p[0], p[1], p[2]);
        } else if (grey_in) {
            q[0] = q[1] = q[2] = p[0];
        } else {
            q[0] = p[0], q[1] = p[1], q[2] = p[2];
        }
    }
}

/* native [n, nc] -> *pixels [n, channels], taking ownership of native. In place when the result is
 * not larger, so a decode needs one image-sized buffer, not two. */
static int to_channels(uint8_t **pixels, uint8_t *native, int nc, int channels, size_t n, const char *source,
                       dt_error *err) {
    if (nc == channels) {
        *pixels = native;
        return 0;
    }
    if (channels < nc) {
        convert_channels(native, channels, native, nc, n);
        uint8_t *shrunk = realloc(native, n * (size_t)channels);
        *pixels = shrunk ? shrunk : native; /* a failed shrink leaves the larger block, still valid */
        return 0;
    }
    uint8_t *conv = malloc(n * (size_t)channels);
    if (!conv) {
        free(native);
        return dt_errorf(err, DT_ENOMEM, "%s: out of memory converting %zu pixels to %d channels", source, n,
                         channels);
    }
    convert_channels(conv, channels, native, nc, n);
    free(native);
    *pixels = conv;
    return 0;
}

/* ---- JPEG ------------------------------------------------------------------------------------ */

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX];
} jpeg_err;

static void jpeg_fail(j_common_ptr cinfo) {
    jpeg_err *e = (jpeg_err *)cinfo->err;
    e->pub.format_message(cinfo, e->msg);
    longjmp(e->jump, 1);
}

/* Warnings (level -1) about damaged data would otherwise yield a partly grey image; they are fatal
 * here so that a truncated or corrupt file counts as bad. Benign ones, such as the stray bytes
 * before a marker that a few Kaggle photos have, are ignored. Trace messages (level >= 0) too. */
static void jpeg_message(j_common_ptr cinfo, int level) {
    if (level >= 0) return;
    switch (cinfo->err->msg_code) {
    case JWRN_EXTRANEOUS_DATA:
    case JWRN_JFIF_MAJOR:
    case JWRN_ADOBE_XFORM:
    case JWRN_BOGUS_ICC:
        return;
    default:
        jpeg_fail(cinfo);
    }
}

static void jpeg_silent(j_common_ptr cinfo) { (void)cinfo; }

/* The DCT scales libjpeg-turbo decodes fast (SIMD reduced IDCTs for 1/2 and 1/4; 1/8 keeps the DC
 * coefficient only), largest reduction first. Other eighths would run plain C. */
static const int jpeg_denoms[] = {8, 4, 2};

/* Sets cinfo's output scale to the smallest fast one still at least min_h x min_w (1 when either
 * is 0), with the output dimensions calculated. */
static void jpeg_pick_scale(struct jpeg_decompress_struct *cinfo, int min_h, int min_w) {
    cinfo->scale_num = cinfo->scale_denom = 1;
    if (min_h > 0 && min_w > 0)
        for (size_t k = 0; k < sizeof jpeg_denoms / sizeof jpeg_denoms[0]; k++) {
            cinfo->scale_num = 1;
            cinfo->scale_denom = (unsigned)jpeg_denoms[k];
            jpeg_calc_output_dimensions(cinfo);
            if (cinfo->output_width >= (JDIMENSION)min_w && cinfo->output_height >= (JDIMENSION)min_h) break;
            cinfo->scale_denom = 1;
        }
    jpeg_calc_output_dimensions(cinfo);
}

/* n CMYK pixels to RGB in place. Adobe writes inverted CMYK, which is what nearly every CMYK JPEG
 * is: R = C*K/255. */
static void cmyk_to_rgb(uint8_t *px, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int k = px[4 * i + 3];
        px[3 * i + 0] = (uint8_t)((px[4 * i + 0] * k + 127) / 255);
        px[3 * i + 1] = (uint8_t)((px[4 * i + 1] * k + 127) / 255);
        px[3 * i + 2] = (uint8_t)((px[4 * i + 2] * k + 127) / 255);
    }
}

static int decode_jpeg(uint8_t **pixels, int *h, int *w, const uint8_t *bytes, size_t len, int channels,
                       int min_h, int min_w, size_t max_pixels, const char *source, dt_error *err) {
    struct jpeg_decompress_struct cinfo;
    jpeg_err je;
    uint8_t *volatile native = NULL; /* as decoded: 1, 3 or 4 (CMYK) channels */
    volatile size_t iw = 0, ih = 0;
    memset(&cinfo, 0, sizeof cinfo);
    cinfo.err = jpeg_std_error(&je.pub);
    je.pub.error_exit = jpeg_fail;
    je.pub.emit_message = jpeg_message;
    je.pub.output_message = jpeg_silent;
    je.msg[0] = 0;
    /* libjpeg's own working memory; in practice the coefficients a progressive JPEG keeps for the
     * whole image (2 bytes per pixel and colour component, whatever the scale). */
    const size_t work_limit = max_pixels > SIZE_MAX / 8 ? SIZE_MAX : 8 * max_pixels;
    const size_t header_limit = max_pixels > SIZE_MAX / 4 ? SIZE_MAX : 4 * max_pixels;
    if (setjmp(je.jump)) {
        int no_room = je.pub.msg_code == JERR_NO_BACKING_STORE;
        jpeg_destroy_decompress(&cinfo);
        free(native);
        if (no_room)
            return dt_errorf(err, DT_EFORMAT, "%s: JPEG of %zux%zu pixels needs more than %.1f MiB to decode "
                             "(a progressive JPEG keeps every coefficient)", source, (size_t)iw, (size_t)ih,
                             (double)work_limit / (1 << 20));
        return dt_errorf(err, DT_EFORMAT, "%s: not a valid JPEG image: %s", source, je.msg);
    }
    jpeg_create_decompress(&cinfo);
    cinfo.mem->max_memory_to_use = work_limit > LONG_MAX ? LONG_MAX : (long)work_limit;
    jpeg_mem_src(&cinfo, bytes, (unsigned long)len);
    jpeg_read_header(&cinfo, TRUE);
    iw = cinfo.image_width, ih = cinfo.image_height;
    /* Entropy decoding visits every block whatever the scale, so the header is bounded too. */
    if (iw == 0 || ih == 0 || iw * ih > header_limit) {
        jpeg_destroy_decompress(&cinfo);
        return dt_errorf(err, DT_EFORMAT, "%s: JPEG of %zux%zu pixels is empty or over the limit of %zu pixels",
                         source, (size_t)iw, (size_t)ih, header_limit);
    }
    int cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
    /* Let libjpeg produce grey or RGB itself when it can: grey output skips the chroma planes. */
    cinfo.out_color_space = cmyk ? JCS_CMYK : channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    /* The smallest fast scale still at least the size it will be resized to: a 4000x3000 photo for
     * a 128x128 input decodes at 1/8, 64 times fewer pixels to produce and resize. */
    jpeg_pick_scale(&cinfo, min_h, min_w);
    size_t ow = cinfo.output_width, oh = cinfo.output_height;
    if (ow * oh > max_pixels) {
        jpeg_destroy_decompress(&cinfo);
        return dt_errorf(err, DT_EFORMAT, "%s: JPEG of %zux%zu pixels decodes to %zux%zu (scale 1/%u), over the "
                         "limit of %zu pixels", source, (size_t)iw, (size_t)ih, ow, oh, cinfo.scale_denom,
                         max_pixels);
    }
    jpeg_start_decompress(&cinfo);
    int nc = cinfo.output_components;
    size_t stride = ow * (size_t)nc;
    native = malloc(stride * oh);
    if (!native) {
        jpeg_destroy_decompress(&cinfo);
        return dt_errorf(err, DT_ENOMEM, "%s: out of memory decoding a %zux%zu JPEG", source, ow, oh);
    }
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW row = native + (size_t)cinfo.output_scanline * stride;
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    size_t n = ow * oh;
    uint8_t *px = native;
    native = NULL;
    if (cmyk) {
        cmyk_to_rgb(px, n);
        nc = 3;
    }
    int rc = to_channels(pixels, px, nc, channels, n, source, err);
    if (rc) return rc;
    *w = (int)ow;
    *h = (int)oh;
    return 0;
}

/* ---- PNG ------------------------------------------------------------------------------------- */

typedef struct {
    jmp_buf jump;
    char msg[256];
    const uint8_t *bytes;
    size_t len, pos;
} png_ctx;

static void png_fail(png_structp png, png_const_charp msg) {
    png_ctx *c = png_get_error_ptr(png);
    snprintf(c->msg, sizeof c->msg, "%s", msg);
    longjmp(c->jump, 1);
}

static void png_warn(png_structp png, png_const_charp msg) { (void)png, (void)msg; }

static void png_read_mem(png_structp png, png_bytep data, png_size_t n) {
    png_ctx *c = png_get_io_ptr(png);
    if (n > c->len - c->pos) png_error(png, "file ends early (truncated)");
    memcpy(data, c->bytes + c->pos, n);
    c->pos += n;
}

static int decode_png(uint8_t **pixels, int *h, int *w, const uint8_t *bytes, size_t len,
                      int channels, size_t max_pixels, const char *source, dt_error *err) {
    png_ctx ctx;
    ctx.bytes = bytes, ctx.len = len, ctx.pos = 0, ctx.msg[0] = 0;
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &ctx, png_fail, png_warn);
    if (!png) return dt_errorf(err, DT_ENOMEM, "%s: out of memory starting the PNG decoder", source);
    png_infop info = png_create_info_struct(png);
    if (!info) {
        png_destroy_read_struct(&png, NULL, NULL);
        return dt_errorf(err, DT_ENOMEM, "%s: out of memory starting the PNG decoder", source);
    }
    uint8_t *volatile native = NULL;
    png_bytep *volatile rows = NULL;
    if (setjmp(ctx.jump)) {
        png_destroy_read_struct(&png, &info, NULL);
        free(native);
        free(rows);
        return dt_errorf(err, DT_EFORMAT, "%s: not a valid PNG image: %s", source, ctx.msg);
    }
    png_set_read_fn(png, &ctx, png_read_mem);
    png_set_chunk_malloc_max(png, 8u << 20); /* bounds text/ICC chunks a hostile file could claim */
    png_read_info(png, info);
    png_uint_32 iw, ih;
    int depth, color, interlace;
    png_get_IHDR(png, info, &iw, &ih, &depth, &color, &interlace, NULL, NULL);
    /* PNG has no reduced decode: every pixel of the header's size is inflated and kept. */
    if ((size_t)iw * ih > max_pixels) {
        png_destroy_read_struct(&png, &info, NULL);
        return dt_errorf(err, DT_EFORMAT, "%s: PNG of %ux%u pixels is over the limit of %zu pixels", source,
                         (unsigned)iw, (unsigned)ih, max_pixels);
    }
    /* Normalise to 8-bit grey, grey+alpha, RGB or RGBA; alpha is dropped in convert_channels. */
    png_set_strip_16(png);
    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    int nc = png_get_channels(png, info);
    size_t rowbytes = png_get_rowbytes(png, info);
    if (nc < 1 || nc > 4 || rowbytes != (size_t)iw * (size_t)nc)
        png_error(png, "unsupported pixel layout");
    native = malloc(rowbytes * ih);
    rows = malloc(sizeof(png_bytep) * ih);
    if (!native || !rows) {
        png_destroy_read_struct(&png, &info, NULL);
        free(native);
        free(rows);
        return dt_errorf(err, DT_ENOMEM, "%s: out of memory decoding a %ux%u PNG", source,
                         (unsigned)iw, (unsigned)ih);
    }
    for (png_uint_32 y = 0; y < ih; y++) rows[y] = native + (size_t)y * rowbytes;
    png_read_image(png, rows);
    png_read_end(png, NULL);
    png_destroy_read_struct(&png, &info, NULL);
    free(rows);
    uint8_t *px = native;
    native = NULL;
    int rc = to_channels(pixels, px, nc, channels, (size_t)iw * ih, source, err);
    if (rc) return rc;
    *w = (int)iw;
    *h = (int)ih;
    return 0;
}

int dt_image_decode(uint8_t **pixels, int *h, int *w, const uint8_t *bytes, size_t len, int channels,
                    int min_h, int min_w, size_t max_pixels, const char *source, dt_error *err) {
    *pixels = NULL;
    *h = *w = 0;
    if (!source) source = "image";
    if (channels != 1 && channels != 3)
        return dt_errorf(err, DT_EINVAL, "%s: cannot decode to %d channels (1 or 3)", source, channels);
    if (max_pixels == 0) max_pixels = DT_IMAGE_MAX_PIXELS;
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (len >= 3 && bytes[0] == 0xff && bytes[1] == 0xd8 && bytes[2] == 0xff)
        return decode_jpeg(pixels, h, w, bytes, len, channels, min_h, min_w, max_pixels, source, err);
    if (len >= 8 && memcmp(bytes, png_sig, 8) == 0)
        return decode_png(pixels, h, w, bytes, len, channels, max_pixels, source, err);
    return dt_errorf(err, DT_EFORMAT, "%s: not an image (neither JPEG nor PNG by its content)", source);
}

/* ---- resize ---------------------------------------------------------------------------------- */

/* Source index and weight for each output coordinate: src = (o + 0.5) * in/out - 0.5, clamped at
 * 0 below; the right neighbour is clamped at the last pixel. This is torch's
 * area_pixel_compute_source_index for align_corners=False, and OpenCV's INTER_LINEAR. */
static void bilinear_taps(int *i0, int *i1, float *lambda, int out_n, int in_n) {
    float scale = (float)in_n / (float)out_n;
    for (int o = 0; o < out_n; o++) {
        float src = ((float)o + 0.5f) * scale - 0.5f;
        if (src < 0) src = 0;
        int a = (int)src;
        if (a > in_n - 1) a = in_n - 1;
        i0[o] = a;
        i1[o] = a < in_n - 1 ? a + 1 : a;
        lambda[o] = src - (float)a;
        if (lambda[o] > 1) lambda[o] = 1;
    }
}

int dt_resize_bilinear(float *out, int oh, int ow, const uint8_t *in, int ih, int iw, int c,
                       float divisor, dt_error *err) {
    // out [oh, ow, c], in [ih, iw, c]
    int *x0 = dt_malloc(sizeof(int) * 2 * (size_t)ow + sizeof(int) * 2 * (size_t)oh, "resize taps", err);
    float *lx = dt_alloc_floats((size_t)ow + (size_t)oh, "resize weights", err);
    if (!x0 || !lx) {
        free(x0);
        free(lx);
        return DT_ENOMEM;
    }
    int *x1 = x0 + ow, *y0 = x1 + ow, *y1 = y0 + oh;
    float *ly = lx + ow;
    bilinear_taps(x0, x1, lx, ow, iw);
    bilinear_taps(y0, y1, ly, oh, ih);
    size_t in_stride = (size_t)iw * (size_t)c;
    for (int y = 0; y < oh; y++) {
        const uint8_t *r0 = in + (size_t)y0[y] * in_stride, *r1 = in + (size_t)y1[y] * in_stride;
        float b = ly[y], a = 1.0f - b;
        float *o = out + (size_t)y * (size_t)ow * (size_t)c;
        for (int x = 0; x < ow; x++) {
            float q = lx[x], p = 1.0f - q;
            const uint8_t *p00 = r0 + (size_t)x0[x] * c, *p01 = r0 + (size_t)x1[x] * c;
            const uint8_t *p10 = r1 + (size_t)x0[x] * c, *p11 = r1 + (size_t)x1[x] * c;
            for (int k = 0; k < c; k++) {
                float v = a * (p * p00[k] + q * p01[k]) + b * (p * p10[k] + q * p11[k]);
                o[(size_t)x * c + k] = v / divisor;
            }
        }
    }
    free(x0);
    free(lx);
    return 0;
}
