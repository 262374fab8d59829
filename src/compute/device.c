/* --device values, parsed the same way whether or not this build has CUDA (cuda.h). */
#include <stdlib.h>
#include <string.h>

#include "compute/cuda.h"
#include "core/error.h"

int dt_device_parse(const char *spec, int *index, dt_error *err) {
    *index = -1;
    if (!spec || !*spec || !strcmp(spec, "cpu")) return DT_OK;
    if (!strcmp(spec, "cuda")) {
        *index = 0;
        return DT_OK;
    }
    if (!strncmp(spec, "cuda:", 5) && spec[5] >= '0' && spec[5] <= '9') {
        char *end;
        long v = strtol(spec + 5, &end, 10);
        if (*end == '\0' && v >= 0 && v < 64) {
            *index = (int)v;
            return DT_OK;
        }
    }
    return dt_errorf(err, DT_EINVAL, "--device '%s': expected cpu, cuda or cuda:N (0 <= N < 64)", spec);
}
