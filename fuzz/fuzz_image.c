/* libFuzzer target: bytes as an image file (JPEG or PNG by content). Decoding must succeed or fail
 * with a message, never crash, leak or read past the input; a decoded image is resized as an image
 * folder would, to 8x8 (so JPEGs of 16 pixels and more take the reduced DCT scales). The pixel limit
 * is kept small so that a tiny header claiming a huge image is refused quickly instead of timing out. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (int channels = 1; channels <= 3; channels += 2) {
        uint8_t *px = NULL;
        int h = 0, w = 0;
        dt_error err = {0};
        if (dt_image_decode(&px, &h, &w, data, size, channels, 8, 8, (size_t)1 << 20, "fuzz", &err) == 0) {
            if (!px || h <= 0 || w <= 0 || (size_t)h * (size_t)w > ((size_t)1 << 20)) __builtin_trap();
            float out[8 * 8 * 3];
            if (dt_resize_bilinear(out, 8, 8, px, h, w, channels, 255.0f, &err) != 0) __builtin_trap();
            for (int i = 0; i < 8 * 8 * channels; i++)
                if (!(out[i] >= 0.0f && out[i] <= 1.0f)) __builtin_trap();
            free(px);
        } else if (px != NULL || strstr(err.msg, "fuzz") == NULL) {
            __builtin_trap();
        }
    }
    return 0;
}
