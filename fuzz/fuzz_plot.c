/* libFuzzer target: dtrain plot's reading and drawing. The input is cut into Event protobufs (each
 * preceded by a 1-byte length), framed here with valid CRCs (random bytes rarely carry them, which
 * would shield the curves layer from the fuzzer), read into a run's curves as training, then as
 * validation events, sorted, and drawn. Any steps and values (negative, huge, NaN, repeated) must
 * give a picture without NaN coordinates, never a crash or a leak. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plot/curves.h"
#include "plot/svg.h"
#include "io/crc32c.h"

static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *file = malloc(size * 17 + 16); /* a record per input byte at most, 16 bytes of framing each */
    if (!file) return 0;
    size_t n = 0, pos = 0;
    while (pos < size) {
        size_t len = data[pos++];
        if (len > size - pos) len = size - pos;
        put_le(file + n, len, 8);
        put_le(file + n + 8, dt_crc32c_mask(dt_crc32c(0, file + n, 8)), 4);
        memcpy(file + n + 12, data + pos, len);
        put_le(file + n + 12 + len, dt_crc32c_mask(dt_crc32c(0, data + pos, len)), 4);
        n += len + 16;
        pos += len;
    }
    dt_run_curves c;
    dt_error err = {0};
    if (dt_curves_init(&c, "fuzz <run> & \"name\"", &err) == 0) {
        for (int split = 0; split < 2; split++)
            if (dt_curves_add_events(&c, split, file, n, "fuzz", NULL, &err)) break;
        char *svg = NULL;
        size_t len = 0;
        if (dt_curves_finish(&c, &err) == 0 && dt_plot_svg(&svg, &len, &c, 1, NULL, &err) == 0) {
            if (strlen(svg) != len || strstr(svg, "nan") || strstr(svg, "inf")) __builtin_trap();
            for (int s = 0; s < 2; s++)
                for (int t = 0; t < 2; t++)
                    for (size_t i = 1; i < c.s[s][t].n; i++)
                        if (c.s[s][t].step[i - 1] >= c.s[s][t].step[i]) __builtin_trap();
        }
        free(svg);
        dt_curves_free(&c);
    }
    free(file);
    return 0;
}
