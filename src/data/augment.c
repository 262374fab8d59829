#include "data/augment.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"

int dt_augment_parse(dt_augment *a, const char *text, dt_error *err) {
    memset(a, 0, sizeof *a);
    if (!text || !*text || !strcmp(text, "none")) return DT_OK;
    const char *p = text;
    for (;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[32];
        if (len == 0 || len >= sizeof item)
            return dt_errorf(err, DT_EINVAL, "--augment: expected crop=N and/or flip, comma-separated, got '%.64s'", text);
        memcpy(item, p, len);
        item[len] = '\0';
        if (!strcmp(item, "flip")) {
            if (a->flip) return dt_errorf(err, DT_EINVAL, "--augment: flip given twice");
            a->flip = 1;
        } else if (!strncmp(item, "crop=", 5)) {
            char *e;
            errno = 0;
            long v = strtol(item + 5, &e, 10);
            if (a->crop) return dt_errorf(err, DT_EINVAL, "--augment: crop given twice");
            if (*e || e == item + 5 || errno || v < 1 || v > DT_AUGMENT_MAX_CROP)
                return dt_errorf(err, DT_EINVAL, "--augment: '%s': the crop's padding must be a whole number of pixels "
                                 "in 1..%d", item, DT_AUGMENT_MAX_CROP);
            a->crop = (int)v;
        } else {
            return dt_errorf(err, DT_EINVAL, "--augment: unknown item '%s' (expected crop=N or flip)", item);
        }
        if (!end) return DT_OK;
        p = end + 1;
    }
}

int dt_augment_check(const dt_augment *a, int h, int w, dt_error *err) {
    if (a->crop && (a->crop >= h || a->crop >= w))
        return dt_errorf(err, DT_EINVAL, "--augment: crop=%d is larger than the %dx%d image allows (at most %d)", a->crop,
                         h, w, (h < w ? h : w) - 1);
    return DT_OK;
}

int dt_augment_on(const dt_augment *a) { return a->crop > 0 || a->flip; }

uint64_t dt_augment_key(uint64_t seed, int64_t epoch, size_t example) {
    /* A stream of its own: the salt keeps it apart from shuffling's dt_hash64(seed, epoch). */
    return dt_hash64(dt_hash64(seed ^ 0x617567u /* "aug" */, (uint64_t)epoch), (uint64_t)example);
}

void dt_augment_apply(const dt_augment *a, float *x, float *scratch, int h, int w, int c, uint64_t key) {
    if (a->crop >= h || a->crop >= w) return; /* refused by dt_augment_check */
    uint64_t r = dt_hash64(key, 1);
    const size_t row = (size_t)w * (size_t)c;
    if (a->crop) {
        /* Window offset (dy, dx) in the padded image, 0..2P each: output (i, j) = input (i + dy - P,
         * j + dx - P), zero outside. */
        int span = 2 * a->crop + 1;
        int dy = (int)(r % (uint64_t)span) - a->crop, dx = (int)((r / (uint64_t)span) % (uint64_t)span) - a->crop;
        memcpy(scratch, x, (size_t)h * row * sizeof(float));
        for (int i = 0; i < h; i++) {
            float *out = x + (size_t)i * row;
            int si = i + dy;
            if (si < 0 || si >= h) {
                memset(out, 0, row * sizeof(float));
                continue;
            }
            const float *in = scratch + (size_t)si * row;
            /* Columns [j0, j1) have a source pixel (the check keeps |dx| < w, so 0 <= j0 < j1 <= w). */
            int j0 = dx < 0 ? -dx : 0, j1 = dx > 0 ? w - dx : w;
            memset(out, 0, (size_t)j0 * c * sizeof(float));
            memcpy(out + (size_t)j0 * c, in + (size_t)(j0 + dx) * c, (size_t)(j1 - j0) * c * sizeof(float));
            memset(out + (size_t)j1 * c, 0, (size_t)(w - j1) * c * sizeof(float));
        }
    }
    if (a->flip && (dt_hash64(key, 2) & 1)) {
        for (int i = 0; i < h; i++) {
            float *p = x + (size_t)i * row;
            for (int j = 0, k = w - 1; j < k; j++, k--)
                for (int ch = 0; ch < c; ch++) {
                    float t = p[(size_t)j * c + ch];
                    p[(size_t)j * c + ch] = p[(size_t)k * c + ch];
                    p[(size_t)k * c + ch] = t;
                }
        }
    }
}
