/* cuda.h in a build without CUDA (-DDTRAIN_CUDA=OFF, or no nvcc found): opening a device fails
 * with one line saying so; nothing else can be reached without an open device. */
#ifndef DTRAIN_HAVE_CUDA
#include <stdio.h>

#include "compute/cuda.h"
#include "core/error.h"

int dt_cuda_built(void) { return 0; }

int dt_cuda_open(int index, dt_error *err) {
    return dt_errorf(err, DT_EINVAL,
                     "--device cuda:%d: built without CUDA: rebuild with -DDTRAIN_CUDA=ON and the CUDA toolkit "
                     "(docs/gpu.md)",
                     index);
}
void dt_cuda_close(void) {}
const dt_backend *dt_cuda_backend(void) { return NULL; }
void dt_cuda_describe(char *buf, size_t len) { snprintf(buf, len, "no CUDA in this build"); }
int dt_cuda_status(dt_error *err) { return DT_OK; }
int dt_cuda_pin(void *p, size_t bytes) { return -1; }
void dt_cuda_unpin(void *p) {}
void dt_cuda_upload_params(float *dev, const float *host, size_t n) {}
void dt_cuda_download_grads(float *host, const float *dev, size_t n, int slot) {}
void dt_cuda_wait_slot(int slot) {}
void dt_cuda_upload(void *dev, const void *host, size_t bytes) {}
void dt_cuda_download(void *host, const void *dev, size_t bytes) {}
void dt_cuda_sync(void) {}
void dt_cuda_mark(int marker) {}
float dt_cuda_elapsed_ms(int from, int to) { return 0.0f; }
#endif
