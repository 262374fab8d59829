/* Element-wise layers on the CPU (compute/kernels.h): activations (ReLU, leaky ReLU, sigmoid, tanh),
 * dropout, the residual sum and channel concatenation. Memory-bound loops split over OpenMP
 * threads; loops too short to pay for waking threads run on one. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "compute/cpu.h"
#include "compute/kernels.h"
#include "core/rng.h"

/* ---- element-wise -------------------------------------------------------------------------- */

void dt_relu_forward(const dt_cpu *cpu, float *out, const float *in, size_t n) {
    int nt = dt_cpu_par(cpu, (double)(n), DT_PAR_STREAM, DT_PAR_ANY);
#pragma omp parallel for simd num_threads(nt) schedule(static) if (parallel: nt > 1)
    for (size_t i = 0; i < n; i++) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
}

void dt_relu_backward(const dt_cpu *cpu, float *din, const float *dout, const float *out, size_t n) {
    int nt = dt_cpu_par(cpu, (double)(n), DT_PAR_STREAM, DT_PAR_ANY);
#pragma omp parallel for simd num_threads(nt) schedule(static) if (parallel: nt > 1)
    for (size_t i = 0; i < n; i++) {
        float d = dout[i]; /* read unconditionally: a conditional load keeps SSE2 from vectorising */
        din[i] = out[i] > 0.0f ? d : 0.0f;
    }
}

void dt_dropout_forward(const dt_cpu *cpu, float *out, uint8_t *mask, const float *in, size_t n, float rate,
                        uint64_t seed) {
    /* keep iff uniform [0,1) >= rate, the uniform built exactly as dt_rng_uniform builds it. */
    float scale = rate < 1.0f ? 1.0f / (1.0f - rate) : 0.0f;
    int nt = dt_cpu_par(cpu, (double)(n), DT_PAR_STREAM, DT_PAR_ANY);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (size_t i = 0; i < n; i++) {
        float u = (float)(dt_hash64(seed, i) >> 40) * (1.0f / 16777216.0f);
        int keep = rate < 1.0f && u >= rate;
        mask[i] = (uint8_t)keep;
        out[i] = in[i] * (keep ? scale : 0.0f);
    }
}

void dt_dropout_backward(const dt_cpu *cpu, float *din, const float *dout, const uint8_t *mask, size_t n, float rate) {
    float scale = rate < 1.0f ? 1.0f / (1.0f - rate) : 0.0f;
    int nt = dt_cpu_par(cpu, (double)(n), DT_PAR_STREAM, DT_PAR_ANY);
#pragma omp parallel for simd num_threads(nt) schedule(static) if (parallel: nt > 1)
    for (size_t i = 0; i < n; i++) din[i] = dout[i] * (mask[i] ? scale : 0.0f);
}

void dt_leaky_relu_forward(const dt_cpu *cpu, float *out, const float *in, size_t n, float alpha) {
    int nt = dt_cpu_par(cpu, (double)(n), DT_PAR_STREAM, DT_PAR_ANY);
#pragma omp parallel for simd num_threads(nt) schedule(static) if (parallel: nt > 1)
    for (size_t i = 0; i < n; i++) out[i] = in[i] > 0.0f ? in[i] : alpha * in[i];
}

void dt_leaky_relu_backward(const dt_cpu *cpu, float *din, const float *dout, const float *out, size_t n, float alpha) {
    int nt = dt_cpu_par(cpu, (double)(n), DT_PAR_STREAM, DT_PAR_ANY);
#pragma omp parallel for simd num_threads(nt) schedule(static) if (parallel: nt > 1)
    for (size_t i = 0; i < n; i++) din[i] = out[i] > 0.0f ? dout[i] : alpha * dout[i];
}

void dt_sigmoid_forward(const dt_cpu *cpu, float *out, const float *in, size_t n) {
    int nt = dt_cpu_par(cpu, (double)(n), DT_PAR_STREAM, DT_PAR_ANY);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (size_t i = 0; i < n; i++) out[i] = 1.0f / (1.0f + expf(-in[i]));
}

void dt_sigmoid_backward(const dt_cpu *cpu, float *din, const float *dout, const float *out, size_t n) {
    int nt = dt_cpu_par(cpu, (double)(n), DT_PAR_STREAM, DT_PAR_ANY);
#pragma omp parallel for simd num_threads(nt) schedule(static) if (parallel: nt > 1)
    for (size_t i = 0; i < n; i++) din[i] = dout[i] * out[i] * (1.0f - out[i]);
}

void dt_tanh_forward(const dt_cpu *cpu, float *out, const float *in, size_t n) {
    int nt = dt_cpu_par(cpu, (double)(n), DT_PAR_STREAM, DT_PAR_ANY);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (size_t i = 0; i < n; i++) out[i] = tanhf(in[i]);
}

void dt_tanh_backward(const dt_cpu *cpu, float *din, const float *dout, const float *out, size_t n) {
    int nt = dt_cpu_par(cpu, (double)(n), DT_PAR_STREAM, DT_PAR_ANY);
#pragma omp parallel for simd num_threads(nt) schedule(static) if (parallel: nt > 1)
    for (size_t i = 0; i < n; i++) din[i] = dout[i] * (1.0f - out[i] * out[i]);
}

void dt_add_forward(const dt_cpu *cpu, float *out, const float *a, const float *b, size_t n, int relu) {
    int nt = dt_cpu_par(cpu, (double)(n), DT_PAR_STREAM, DT_PAR_ANY);
    if (relu) {
#pragma omp parallel for simd num_threads(nt) schedule(static) if (parallel: nt > 1)
        for (size_t i = 0; i < n; i++) {
            float v = a[i] + b[i];
            out[i] = v > 0.0f ? v : 0.0f;
        }
        return;
    }
#pragma omp parallel for simd num_threads(nt) schedule(static) if (parallel: nt > 1)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void dt_concat_forward(const dt_cpu *cpu, float *out, const float *in, size_t rows, int in_c, int out_c, int off) {
    int nt = dt_cpu_par(cpu, (double)(rows * (size_t)in_c), DT_PAR_STREAM, DT_PAR_ANY);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (size_t r = 0; r < rows; r++)
        memcpy(out + r * (size_t)out_c + off, in + r * (size_t)in_c, (size_t)in_c * sizeof(float));
}

void dt_concat_backward(const dt_cpu *cpu, float *din, const float *dout, size_t rows, int in_c, int out_c, int off) {
    int nt = dt_cpu_par(cpu, (double)(rows * (size_t)in_c), DT_PAR_STREAM, DT_PAR_ANY);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (size_t r = 0; r < rows; r++)
        memcpy(din + r * (size_t)in_c, dout + r * (size_t)out_c + off, (size_t)in_c * sizeof(float));
}
