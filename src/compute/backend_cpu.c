/* The CPU backend: kernels.h as a table (backend.h), over host memory. */
#include "compute/backend.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static void *cpu_alloc(size_t bytes, const char *what, dt_error *err) {
    return dt_calloc(bytes ? bytes : 1, 1, what, err);
}
static void cpu_copy(void *dst, const void *src, size_t bytes) {
    if (dst != src) memcpy(dst, src, bytes);
}
static void cpu_zero(void *dst, size_t bytes) { memset(dst, 0, bytes); }

const dt_backend dt_backend_cpu = {
    .name = "cpu",
    .on_device = 0,
    .alloc = cpu_alloc,
    .release = free,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .conv2d_scratch_floats = dt_conv2d_scratch_floats,
    .conv2d_forward = dt_conv2d_forward,
    .conv2d_backward = dt_conv2d_backward,
    .maxpool_forward = dt_maxpool_forward,
    .maxpool_backward = dt_maxpool_backward,
    .avgpool_forward = dt_avgpool_forward,
    .avgpool_backward = dt_avgpool_backward,
    .global_avgpool_forward = dt_global_avgpool_forward,
    .global_avgpool_backward = dt_global_avgpool_backward,
    .relu_forward = dt_relu_forward,
    .relu_backward = dt_relu_backward,
    .leaky_relu_forward = dt_leaky_relu_forward,
    .leaky_relu_backward = dt_leaky_relu_backward,
    .sigmoid_forward = dt_sigmoid_forward,
    .sigmoid_backward = dt_sigmoid_backward,
    .tanh_forward = dt_tanh_forward,
    .tanh_backward = dt_tanh_backward,
    .dropout_forward = dt_dropout_forward,
    .dropout_backward = dt_dropout_backward,
    .dense_forward = dt_dense_forward,
    .dense_backward = dt_dense_backward,
    .softmax_xent = dt_softmax_xent,
    .add_forward = dt_add_forward,
    .concat_forward = dt_concat_forward,
    .concat_backward = dt_concat_backward,
    .batchnorm_work_doubles = dt_batchnorm_work_doubles,
    .batchnorm_forward = dt_batchnorm_forward,
    .batchnorm_backward = dt_batchnorm_backward,
    .channel_affine_forward = dt_channel_affine_forward,
    .channel_affine_add_forward = dt_channel_affine_add_forward,
};
