/* cuda.h in a build without CUDA (-DDTRAIN_CUDA=OFF, or no nvcc found): opening a device fails
 * with one line saying so; nothing else can be reached without an open context. */
#ifndef DTRAIN_HAVE_CUDA
#include "compute/cuda.h"
#include "core/error.h"

int dt_cuda_built(void) { return 0; }

int dt_cuda_open(dt_cuda **out, int index, dt_error *err) {
    *out = NULL;
    return dt_errorf(err, DT_EINVAL,
                     "--device cuda:%d: built without CUDA: rebuild with -DDTRAIN_CUDA=ON and the CUDA toolkit "
                     "(docs/gpu.md)",
                     index);
}
void dt_cuda_close(dt_cuda *c) {}
dt_backend dt_cuda_backend(dt_cuda *c) { return (dt_backend){0}; }
void dt_cuda_mark(dt_cuda *c, int marker) {}
float dt_cuda_elapsed_ms(dt_cuda *c, int from, int to) { return 0.0f; }
#endif
