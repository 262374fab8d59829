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
    .conv2d_scratch_floats = conv2d_scratch_floats,
    .conv2d_forward = conv2d_forward,
    .conv2d_backward = conv2d_backward,
    .maxpool_forward = maxpool_forward,
    .maxpool_backward = maxpool_backward,
    .avgpool_forward = avgpool_forward,
    .avgpool_backward = avgpool_backward,
    .global_avgpool_forward = global_avgpool_forward,
    .global_avgpool_backward = global_avgpool_backward,
    .relu_forward = relu_forward,
    .relu_backward = relu_backward,
    .leaky_relu_forward = leaky_relu_forward,
    .leaky_relu_backward = leaky_relu_backward,
    .sigmoid_forward = sigmoid_forward,
    .sigmoid_backward = sigmoid_backward,
    .tanh_forward = tanh_forward,
    .tanh_backward = tanh_backward,
    .dropout_forward = dropout_forward,
    .dropout_backward = dropout_backward,
    .dense_forward = dense_forward,
    .dense_backward = dense_backward,
    .softmax_xent = softmax_xent,
    .add_forward = add_forward,
    .concat_forward = concat_forward,
    .concat_backward = concat_backward,
    .batchnorm_work_doubles = batchnorm_work_doubles,
    .batchnorm_forward = batchnorm_forward,
    .batchnorm_backward = batchnorm_backward,
    .channel_affine_forward = channel_affine_forward,
    .channel_affine_add_forward = channel_affine_add_forward,
};
