/* --precision's names and the CPU's check (compute/precision.h). */
#include <stdlib.h>
#include <string.h>

#include "compute/kernels.h"
#include "compute/precision.h"
#include "core/error.h"

int dt_precision_parse(const char *name, dt_precision *out, dt_error *err) {
    if (!name || !*name || !strcmp(name, "float32")) *out = DT_PRECISION_FLOAT32;
    else if (!strcmp(name, "bf16")) *out = DT_PRECISION_BF16;
    else return dt_errorf(err, DT_EINVAL, "precision: expected float32 or bf16, got '%s'", name);
    return DT_OK;
}

const char *dt_precision_name(dt_precision p) { return p == DT_PRECISION_BF16 ? "bf16" : "float32"; }

int dt_precision_check_cpu(dt_precision p, dt_error *err) {
    if (p != DT_PRECISION_BF16) return DT_OK;
    const char *hide = getenv("DTRAIN_CPU_NO_BF16");
    if (dt_cpu_has_bf16() && !(hide && !strcmp(hide, "1"))) return DT_OK;
    return dt_errorf(err, DT_EINVAL,
                     "precision bf16: this CPU lacks AVX512_BF16 (the vdpbf16ps instruction); use precision float32");
}
