/* The geometry of a sliding window (convolution, pooling), the same for every backend (kernels.h). */
#include <stdint.h>
#include <string.h>

#include "compute/kernels.h"
#include "core/error.h"

int dt_window_init(dt_window *g, int in_h, int in_w, int in_c, int out_c, int k_h, int k_w,
                   int stride_h, int stride_w, dt_padding pad, dt_error *err) {
    memset(g, 0, sizeof *g);
    if (in_h <= 0 || in_w <= 0 || in_c <= 0)
        return dt_errorf(err, DT_ESHAPE, "window: input %dx%dx%d must be positive", in_h, in_w, in_c);
    if (out_c <= 0) return dt_errorf(err, DT_ESHAPE, "window: %d output channels, need > 0", out_c);
    if (k_h <= 0 || k_w <= 0)
        return dt_errorf(err, DT_ESHAPE, "window: kernel %dx%d must be positive", k_h, k_w);
    if (stride_h <= 0 || stride_w <= 0)
        return dt_errorf(err, DT_ESHAPE, "window: stride %dx%d must be positive", stride_h, stride_w);
    if (pad != DT_PAD_VALID && pad != DT_PAD_SAME)
        return dt_errorf(err, DT_EINVAL, "window: unknown padding %d", (int)pad);
    /* argmax stores an index within one example as int32. */
    if ((int64_t)in_h * in_w * in_c > INT32_MAX)
        return dt_errorf(err, DT_ESHAPE, "window: input %dx%dx%d has more than 2^31 values", in_h,
                         in_w, in_c);
    int out_h, out_w, pad_top = 0, pad_left = 0;
    if (pad == DT_PAD_VALID) {
        if (k_h > in_h || k_w > in_w)
            return dt_errorf(err, DT_ESHAPE,
                             "window: kernel %dx%d is larger than the %dx%d input with VALID padding",
                             k_h, k_w, in_h, in_w);
        out_h = (in_h - k_h) / stride_h + 1;
        out_w = (in_w - k_w) / stride_w + 1;
    } else {
        /* TensorFlow's SAME: out = ceil(in / stride); the odd padding cell goes bottom/right. */
        out_h = (in_h + stride_h - 1) / stride_h;
        out_w = (in_w + stride_w - 1) / stride_w;
        int64_t ph = (int64_t)(out_h - 1) * stride_h + k_h - in_h;
        int64_t pw = (int64_t)(out_w - 1) * stride_w + k_w - in_w;
        pad_top = ph > 0 ? (int)(ph / 2) : 0;
        pad_left = pw > 0 ? (int)(pw / 2) : 0;
    }
    if ((int64_t)out_h * out_w * out_c > INT32_MAX)
        return dt_errorf(err, DT_ESHAPE, "window: output %dx%dx%d has more than 2^31 values", out_h,
                         out_w, out_c);
    *g = (dt_window){.in_h = in_h, .in_w = in_w, .in_c = in_c, .out_h = out_h, .out_w = out_w,
                     .out_c = out_c, .k_h = k_h, .k_w = k_w, .stride_h = stride_h,
                     .stride_w = stride_w, .pad_top = pad_top, .pad_left = pad_left};
    return 0;
}
