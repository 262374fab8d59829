/* The CUDA backend's context: one device, its memory, its two streams, its cuBLAS handle and its
 * first failure. A C header over kernels_cuda.cu (DTRAIN_CUDA builds); cuda_none.c answers every call
 * of a build without CUDA with "built without CUDA". docs/gpu.md describes the design.
 *
 * Each context is its own: a net opens one when it moves to a device (dt_net_set_device) and closes
 * it when it is freed, so a process may hold several, on one device or on several. Two streams per
 * context: compute, where every kernel runs in order, and copy, where parameters go up and gradients
 * come down, so those transfers overlap the kernels; events order the two. Kernels return void as
 * the CPU ones do; the first failure of any CUDA, cuBLAS or kernel call is kept with the call's name
 * (sticky: the context is not to be trusted after one) and the backend's status returns it. Every
 * call may come from any thread: each sets its device on the calling thread first (the CUDA runtime
 * keeps the current device per thread). The kernels and copies themselves are the backend's tables
 * (backend.h): dt_cuda_backend. */
#ifndef DT_COMPUTE_CUDA_H
#define DT_COMPUTE_CUDA_H

#include <stddef.h>

#include "compute/backend.h"
#include "dtrain.h"

typedef struct dt_cuda dt_cuda;

/* "cpu" -> *index = -1; "cuda" -> 0; "cuda:N" -> N (0 <= N < 64). Anything else fails naming the
 * value. NULL or "" is "cpu". Parsing needs no CUDA. */
int dt_device_parse(const char *spec, int *index, dt_error *err);

/* Whether this build has the CUDA backend. */
int dt_cuda_built(void);

/* A new context on device `index`: its own streams, events and cuBLAS handle. Fails with the
 * driver's reason when there is no usable device ("built without CUDA: ..." in a build without
 * it). */
int dt_cuda_open(dt_cuda **out, int index, dt_error *err);
/* Waits for its work, then releases it (NULL: nothing). */
void dt_cuda_close(dt_cuda *c);
/* The kernels and copies over c's device memory ({ops, buf, c}; backend.h): the backend's close is
 * dt_cuda_close. Slots of download_grads: 0 <= slot < DT_CUDA_SLOTS. */
#define DT_CUDA_SLOTS 1024
dt_backend dt_cuda_backend(dt_cuda *c);

/* The time of a context's work, for benchmarks: a marker now on the compute stream, and the
 * milliseconds between two markers (after the backend's sync). 0 <= marker < 64. */
void dt_cuda_mark(dt_cuda *c, int marker);
float dt_cuda_elapsed_ms(dt_cuda *c, int from, int to);

#endif
