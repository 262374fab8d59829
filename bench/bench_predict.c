/* Input for the predict benchmark (bench/run predict): DIR/cat and DIR/dog each get N/2 synthetic
 * Kaggle-sized JPEGs (300-500 x 250-500 pixels, quality 90: smooth gradients plus noise, about as
 * costly to decode as the Kaggle photos), so the catdog model's throughput includes JPEG decoding
 * and resizing, as predicting test1/ does.
 * usage: bench_predict DIR N */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <jpeglib.h> /* after stdio.h: it uses FILE and size_t */

#include "core/rng.h"

static int write_jpeg(const char *path, int w, int h, const uint8_t *px) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    jpeg_stdio_dest(&c, f);
    c.image_width = (JDIMENSION)w, c.image_height = (JDIMENSION)h, c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 90, TRUE);
    jpeg_start_compress(&c, TRUE);
    for (JSAMPROW row; c.next_scanline < c.image_height;) {
        row = (JSAMPROW)(px + (size_t)c.next_scanline * w * 3);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    return fclose(f);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: bench_predict DIR N\n");
        return 2;
    }
    const char *dir = argv[1];
    int n = atoi(argv[2]);
    static const char *const cls[2] = {"cat", "dog"};
    char path[4096];
    mkdir(dir, 0755);
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, cls[k]);
        mkdir(path, 0755);
    }
    dt_rng r;
    dt_rng_seed(&r, 7);
    uint8_t *px = malloc(500 * 500 * 3);
    if (!px) return 1;
    for (int i = 0; i < n; i++) {
        int w = 300 + (int)dt_rng_below(&r, 201), h = 250 + (int)dt_rng_below(&r, 251);
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++)
                for (int ch = 0; ch < 3; ch++) {
                    int v = (x * (ch + 1) + y * (3 - ch)) * 255 / (w + h) + (int)dt_rng_below(&r, 40) - 20;
                    px[((size_t)y * w + x) * 3 + ch] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
                }
        snprintf(path, sizeof path, "%s/%s/%s.%d.jpg", dir, cls[i % 2], cls[i % 2], i);
        if (write_jpeg(path, w, h, px)) {
            fprintf(stderr, "bench_predict: cannot write %s\n", path);
            return 1;
        }
    }
    free(px);
    return 0;
}
