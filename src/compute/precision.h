/* The precision a net computes in (--precision, docs/memory-layout.md "Precision"): float32, or bf16
 * products (the convolutions' and dense layers', dt_gemm_bf16) with float32 accumulation, on a CPU
 * with AVX512_BF16. Parameters, gradients, optimizer slots, batch norm, softmax, the loss and
 * checkpoints stay float32 either way. */
#ifndef DT_COMPUTE_PRECISION_H
#define DT_COMPUTE_PRECISION_H

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

#endif
