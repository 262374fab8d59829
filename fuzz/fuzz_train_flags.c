/* libFuzzer target for the training options' text parsers: --lr_boundaries / --lr_values
 * (compute/schedule.h) and --augment (data/augment.h). Input: [selector byte][text]; selector bit 0
 * picks the parser; for the schedule the text is "BOUNDARIES\nVALUES". Each must refuse (saying
 * why) or accept a value that passes its own check; an accepted schedule gives a positive finite
 * rate at any step. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compute/schedule.h"
#include "data/augment.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 4096) return 0;
    char *text = malloc(size);
    if (!text) return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    dt_error err = {0};
    if (data[0] & 1) {
        dt_augment a;
        if (dt_augment_parse(&a, text, &err) == DT_OK) {
            if (a.crop < 0 || a.crop > DT_AUGMENT_MAX_CROP || (a.flip != 0 && a.flip != 1)) __builtin_trap();
        } else if (!err.msg[0]) {
            __builtin_trap();
        }
    } else {
        char *values = strchr(text, '\n');
        if (values) *values++ = '\0';
        dt_lr_schedule s = {.kind = DT_LR_PIECEWISE};
        int rc = dt_lr_parse_boundaries(&s, text, &err);
        if (!rc && values) rc = dt_lr_parse_values(&s, values, &err);
        if (!rc && values) {
            if (dt_lr_schedule_check(&s, &err) != DT_OK) __builtin_trap(); /* parsed means valid */
            for (int i = 0; i < s.n_boundaries; i++) {
                float lr = dt_lr_at(&s, 1.0f, s.boundaries[i] + (int64_t)(data[0] >> 1));
                if (!(lr > 0) || !isfinite(lr)) __builtin_trap();
            }
        } else if (rc && !err.msg[0]) {
            __builtin_trap();
        }
    }
    free(text);
    return 0;
}
