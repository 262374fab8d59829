/* The CUDA device of this process: its memory, its two streams and the kernels' failures. A C header
 * over kernels_cuda.cu (DTRAIN_CUDA builds); cuda_none.c answers every call of a build without
 * CUDA with "built without CUDA". docs/gpu.md describes the design.
 *
 * One device per process (`--device cuda:N`), opened once and shared by every net of the process
 * (reference counted). Two streams: compute, where every kernel runs in order, and copy, where
 * parameters go up and gradients come down, so those transfers overlap the kernels; events order
 * the two. Kernels return void as the CPU ones do; the first failure of any CUDA, cuBLAS or kernel
 * call is kept with the call's name (sticky: the context is not to be trusted after one) and
 * dt_cuda_status returns it. Every function here may be called from any thread: each sets the
 * device on the calling thread first (the CUDA runtime keeps the current device per thread). */
#ifndef DT_COMPUTE_CUDA_H
#define DT_COMPUTE_CUDA_H

#include <stddef.h>

#include "compute/backend.h"
#include "dtrain.h"

/* "cpu" -> *index = -1; "cuda" -> 0; "cuda:N" -> N (0 <= N < 64). Anything else fails naming the
 * value. NULL or "" is "cpu". Parsing needs no CUDA. */
int dt_device_parse(const char *spec, int *index, dt_error *err);

/* Whether this build has the CUDA backend. */
int dt_cuda_built(void);

/* Opens device `index` (once per process; a second open of the same index adds a reference,
 * another index fails). Fails with the driver's reason when there is no usable device ("built
 * without CUDA: ..." in a build without it). */
int dt_cuda_open(int index, dt_error *err);
void dt_cuda_close(void);
/* The kernels table over device memory (valid while the device is open). */
const dt_backend *dt_cuda_backend(void);
/* "NVIDIA H200 (cuda:0, sm_90, 139.8 GiB)" into buf. */
void dt_cuda_describe(char *buf, size_t len);

/* The first failure since the device was opened (0: none); also polls CUDA for an asynchronous one. */
int dt_cuda_status(dt_error *err);

/* Pins host memory [p, p + bytes) so that copies of it are asynchronous (cudaHostRegister);
 * unpin before freeing it. A failure only makes the copies synchronous: returns 0 or -1. */
int dt_cuda_pin(void *p, size_t bytes);
void dt_cuda_unpin(void *p);

/* Copy stream: dev [n floats] = host, after the kernels enqueued so far have finished reading dev,
 * and before any kernel enqueued afterwards runs (a layer's parameters). */
void dt_cuda_upload_params(float *dev, const float *host, size_t n);
/* Copy stream: host = dev after the kernels enqueued so far; event `slot` (0 <= slot <
 * DT_CUDA_SLOTS) marks its end for dt_cuda_wait_slot (a layer's gradient). */
#define DT_CUDA_SLOTS 1024
void dt_cuda_download_grads(float *host, const float *dev, size_t n, int slot);
void dt_cuda_wait_slot(int slot);
/* Compute stream, in order with the kernels: dev = host (an input batch); host = dev, waiting for
 * it (logits). */
void dt_cuda_upload(void *dev, const void *host, size_t bytes);
void dt_cuda_download(void *host, const void *dev, size_t bytes);
/* Waits for both streams. */
void dt_cuda_sync(void);

/* The time of both streams' work, for the benchmark: a marker now on the compute stream, and the
 * milliseconds between two markers (after dt_cuda_sync). 0 <= marker < 64. */
void dt_cuda_mark(int marker);
float dt_cuda_elapsed_ms(int from, int to);

#endif
