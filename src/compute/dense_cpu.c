/* Dense layers and the loss on the CPU (compute/kernels.h): one product each way through dt_gemm
 * (dt_gemm_bf16 in bf16: cpu.h, gemm_layer), and the fused softmax cross-entropy in double, in
 * example order (float32 in either precision). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "compute/cpu.h"
#include "compute/kernels.h"

/* ---- dense --------------------------------------------------------------------------------- */

void dt_dense_forward(const dt_cpu *cpu, float *out, const float *in, const float *w, const float *b, int batch,
                      int in_dim, int out_dim) {
    if (b)
        for (int n = 0; n < batch; n++) memcpy(out + (size_t)n * out_dim, b, out_dim * sizeof(float));
    gemm_layer(cpu, 0, 0, batch, out_dim, in_dim, 1.0f, in, in_dim, w, out_dim, b ? 1.0f : 0.0f, out, out_dim);
}

void dt_dense_backward(const dt_cpu *cpu, float *din, float *dw, float *db, const float *dout, const float *in,
                       const float *w, int batch, int in_dim, int out_dim) {
    gemm_layer(cpu, 1, 0, in_dim, out_dim, batch, 1.0f, in, in_dim, dout, out_dim, 0.0f, dw, out_dim);
    if (db) {
        memset(db, 0, out_dim * sizeof(float));
        for (int n = 0; n < batch; n++)
            for (int o = 0; o < out_dim; o++) db[o] += dout[(size_t)n * out_dim + o];
    }
    if (din) gemm_layer(cpu, 0, 1, batch, in_dim, out_dim, 1.0f, dout, out_dim, w, out_dim, 0.0f, din, in_dim);
}

/* ---- loss ---------------------------------------------------------------------------------- */

int dt_argmax_first(const float *x, int classes) {
    int best = 0;
    for (int k = 1; k < classes; k++)
        if (x[k] > x[best]) best = k;
    return best;
}

void dt_softmax_forward(float *probs, const float *logits, int batch, int classes) {
    for (int n = 0; n < batch; n++) {
        const float *x = logits + (size_t)n * classes;
        float *p = probs + (size_t)n * classes;
        float mx = x[dt_argmax_first(x, classes)];
        double sum = 0.0;
        for (int k = 0; k < classes; k++) sum += exp((double)x[k] - mx);
        double inv = 1.0 / sum;
        for (int k = 0; k < classes; k++) p[k] = (float)(exp((double)x[k] - mx) * inv);
    }
}

float dt_softmax_xent(float *dlogits, const float *logits, const int32_t *labels, int batch, int classes,
                      int *correct) {
    double loss = 0.0;
    int hits = 0;
    for (int n = 0; n < batch; n++) {
        const float *x = logits + (size_t)n * classes;
        int32_t y = labels[n];
        int best = dt_argmax_first(x, classes);
        /* log-sum-exp around the max: exp never overflows, the largest term is exactly 1. */
        float mx = x[best];
        double sum = 0.0;
        for (int k = 0; k < classes; k++) sum += exp((double)x[k] - mx);
        int valid = y >= 0 && y < classes;
        if (valid) {
            loss += log(sum) - ((double)x[y] - mx);
            hits += best == y;
        } else {
            loss = NAN; /* a label outside [0, classes): poison the loss rather than read out of bounds */
        }
        if (dlogits) {
            float *d = dlogits + (size_t)n * classes;
            double inv = 1.0 / (sum * batch);
            for (int k = 0; k < classes; k++)
                d[k] = (float)(exp((double)x[k] - mx) * inv - (k == y ? 1.0 / batch : 0.0));
        }
    }
    if (correct) *correct = hits;
    return batch > 0 ? (float)(loss / batch) : 0.0f;
}
