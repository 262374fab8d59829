/* The precision a net computes in (--precision, docs/memory-layout.md "Precision"): float32, or bf16
 * products (the convolutions' and dense layers', dt_gemm_bf16) with float32 accumulation, on a CPU
 * with AVX512_BF16. Parameters, gradients, optimizer slots, batch norm, softmax, the loss and
 * checkpoints stay float32 either way. */
#ifndef DT_COMPUTE_PRECISION_H
#define DT_COMPUTE_PRECISION_H

#include <stdint.h>
#include <string.h>

#include "dtrain.h"

typedef enum { DT_PRECISION_FLOAT32 = 0, DT_PRECISION_BF16 = 1 } dt_precision;

/* name: "float32" (NULL or "": the default) or "bf16". DT_EINVAL naming the option otherwise. */
int dt_precision_parse(const char *name, dt_precision *out, dt_error *err);
const char *dt_precision_name(dt_precision p);
/* Whether this CPU can compute in p: bf16 needs AVX512_BF16 (dt_cpu_has_bf16), else one line
 * naming the instruction set (DT_EINVAL). There is no emulated bf16: it would be slower than
 * float32 for the same model. The environment variable DTRAIN_CPU_NO_BF16=1 makes a CPU that has
 * it answer as one without (tests of the refusal). */
int dt_precision_check_cpu(dt_precision p, dt_error *err);

/* x rounded to the nearest bf16 value (ties to even), as a float: the upper 16 bits of the result
 * are the bf16 value, the lower 16 are zero. Infinities stay, NaN stays NaN (quiet), a finite x
 * beyond bf16's largest value rounds to infinity (as vcvtneps2bf16 and PyTorch's conversion do;
 * unlike vcvtneps2bf16, float32 subnormals are rounded, not flushed to zero). */
static inline float dt_round_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) u |= 0x00400000u; /* NaN: quiet, so truncating keeps it NaN */
    else u += 0x7fffu + ((u >> 16) & 1u);                    /* half an ulp, a tie going to the even one */
    u &= 0xffff0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

#endif
