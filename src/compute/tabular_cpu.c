/* The layers of click-through-rate models on the CPU (compute/kernels.h): embedding bags (a gather
 * forward, a sort-and-sum backward that yields the touched rows), the factorisation machine's
 * second-order term, the sum of a flat input, and the binary output's sigmoid with logloss.
 * Sums run in double in a fixed order, so results do not depend on the thread count. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "compute/cpu.h"
#include "compute/kernels.h"

/* ---- embedding ------------------------------------------------------------------------------ */

/* Examples ahead whose rows the forward asks the memory for: a table of millions of rows is far
 * larger than the caches, and each bag's rows are random, so without it each one is a wait on
 * memory (the gather was the largest part of a step, perf). */
#define PREFETCH_AHEAD 2

void dt_embedding_forward(const dt_cpu *cpu, float *out, const float *table, const dt_bags *b) {
    const int F = b->n_fields, D = b->dim;
    const int nt = dt_cpu_par(cpu, (double)b->batch * F * D, DT_PAR_GATHER, DT_PAR_ANY);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int i = 0; i < b->batch; i++) {
        if (i + PREFETCH_AHEAD < b->batch)
            for (int s = 0; s < F; s++) {
                const int64_t *o = b->offsets + (int64_t)(i + PREFETCH_AHEAD) * b->num_fields + b->field[s];
                for (int64_t j = o[0]; j < o[1]; j++) __builtin_prefetch(table + (size_t)b->rows[j] * (size_t)D);
            }
        double acc[64];
        for (int s = 0; s < F; s++) {
            const int64_t *o = b->offsets + (int64_t)i * b->num_fields + b->field[s];
            float *y = out + ((size_t)i * F + (size_t)s) * (size_t)D;
            double wsum = 0;
            /* dimensions in blocks of 64, so the accumulator stays on the stack */
            for (int k0 = 0; k0 < D; k0 += 64) {
                int kn = D - k0 < 64 ? D - k0 : 64;
                for (int k = 0; k < kn; k++) acc[k] = 0;
                wsum = 0;
                for (int64_t j = o[0]; j < o[1]; j++) {
                    double w = b->weights ? (double)b->weights[j] : 1.0;
                    const float *e = table + (size_t)b->rows[j] * (size_t)D + k0;
                    for (int k = 0; k < kn; k++) acc[k] += w * (double)e[k];
                    wsum += w;
                }
                double scale = b->mean ? (wsum != 0 ? 1.0 / wsum : 0.0) : 1.0;
                for (int k = 0; k < kn; k++) y[k0 + k] = (float)(acc[k] * scale);
            }
        }
    }
}

size_t dt_embedding_pairs(const dt_bags *b) {
    size_t n = 0;
    for (int i = 0; i < b->batch; i++)
        for (int s = 0; s < b->n_fields; s++) {
            const int64_t *o = b->offsets + (int64_t)i * b->num_fields + b->field[s];
            n += (size_t)(o[1] - o[0]);
        }
    return n;
}

/* LSD radix sort of keys [n] on bits [lo, hi) (8 at a time), stable; tmp [n]. The result ends in
 * keys. Passes whose byte is the same in every key are skipped. */
static void radix_sort(uint64_t *keys, uint64_t *tmp, size_t n, int lo, int hi) {
    for (int shift = lo; shift < hi; shift += 8) {
        size_t count[257] = {0};
        for (size_t i = 0; i < n; i++) count[((keys[i] >> shift) & 255) + 1]++;
        int trivial = 0;
        for (int d = 1; d <= 256; d++) trivial |= count[d] == n;
        if (trivial) continue;
        for (int d = 1; d <= 256; d++) count[d] += count[d - 1];
        for (size_t i = 0; i < n; i++) tmp[count[(keys[i] >> shift) & 255]++] = keys[i];
        memcpy(keys, tmp, n * sizeof *keys);
    }
}

size_t dt_embedding_backward(const dt_cpu *cpu, int64_t *uniq, float *grad, const float *dout, const dt_bags *b,
                             uint64_t *scratch) {
    const int F = b->n_fields, D = b->dim;
    /* Pair p (in batch order: example, field, id) -> key (row << 32 | p); its output slot and
     * coefficient (the weight, over the bag's total for a mean) beside it. */
    size_t P = 0, pairs = dt_embedding_pairs(b);
    uint64_t *keys = scratch, *tmp = scratch + pairs, *info = tmp + pairs + 1;
    int64_t max_row = 0;
    for (int i = 0; i < b->batch; i++)
        for (int s = 0; s < F; s++) {
            const int64_t *o = b->offsets + (int64_t)i * b->num_fields + b->field[s];
            double wsum = 0;
            for (int64_t j = o[0]; j < o[1]; j++) wsum += b->weights ? (double)b->weights[j] : 1.0;
            double inv = b->mean ? (wsum != 0 ? 1.0 / wsum : 0.0) : 1.0;
            uint32_t slot = (uint32_t)((size_t)i * F + (size_t)s);
            for (int64_t j = o[0]; j < o[1]; j++) {
                float c = (float)((b->weights ? (double)b->weights[j] : 1.0) * inv);
                uint32_t cbits;
                memcpy(&cbits, &c, sizeof cbits);
                if (b->rows[j] > max_row) max_row = b->rows[j];
                keys[P] = (uint64_t)b->rows[j] << 32 | (uint64_t)P;
                info[P] = (uint64_t)slot << 32 | cbits;
                P++;
            }
        }
    int hi = 32;
    while (hi < 64 && (max_row >> (hi - 32)) != 0) hi += 8;
    radix_sort(keys, tmp, P, 32, hi); /* by row; pairs of one row stay in batch order */
    /* run starts: tmp is free now */
    size_t n = 0;
    for (size_t p = 0; p < P; p++)
        if (p == 0 || keys[p] >> 32 != keys[p - 1] >> 32) {
            uniq[n] = (int64_t)(keys[p] >> 32);
            tmp[n++] = p;
        }
    if (n) tmp[n] = P;
    const int nt = dt_cpu_par(cpu, (double)P * D, DT_PAR_GATHER, DT_PAR_ANY);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 64) if (nt > 1)
    for (size_t u = 0; u < n; u++) {
        float *g = grad + u * (size_t)D;
        for (int k0 = 0; k0 < D; k0 += 64) {
            int kn = D - k0 < 64 ? D - k0 : 64;
            double acc[64] = {0};
            for (uint64_t p = tmp[u]; p < tmp[u + 1]; p++) {
                uint64_t in = info[keys[p] & 0xffffffffu];
                uint32_t cbits = (uint32_t)in;
                float c;
                memcpy(&c, &cbits, sizeof c);
                const float *d = dout + (size_t)(in >> 32) * (size_t)D + k0;
                for (int k = 0; k < kn; k++) acc[k] += (double)c * (double)d[k];
            }
            for (int k = 0; k < kn; k++) g[k0 + k] = (float)acc[k];
        }
    }
    return n;
}

/* ---- factorisation machine ------------------------------------------------------------------ */

void dt_fm_forward(const dt_cpu *cpu, float *out, const float *v, int batch, int F, int D) {
    int nt = dt_cpu_par(cpu, (double)batch * F * D, DT_PAR_FM, DT_PAR_ANY);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int i = 0; i < batch; i++) {
        const float *x = v + (size_t)i * F * D;
        double y = 0;
        for (int k = 0; k < D; k++) {
            double s = 0, q = 0;
            for (int f = 0; f < F; f++) {
                double e = x[(size_t)f * D + k];
                s += e, q += e * e;
            }
            y += s * s - q;
        }
        out[i] = (float)(0.5 * y);
    }
}

void dt_fm_backward(const dt_cpu *cpu, float *dv, const float *dout, const float *v, int batch, int F, int D) {
    int nt = dt_cpu_par(cpu, (double)batch * F * D, DT_PAR_FM, DT_PAR_ANY);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int i = 0; i < batch; i++) {
        const float *x = v + (size_t)i * F * D;
        float *dx = dv + (size_t)i * F * D;
        double g = dout[i];
        for (int k = 0; k < D; k++) {
            double s = 0;
            for (int f = 0; f < F; f++) s += x[(size_t)f * D + k];
            for (int f = 0; f < F; f++) dx[(size_t)f * D + k] = (float)(g * (s - (double)x[(size_t)f * D + k]));
        }
    }
}

/* ---- reduce_sum ------------------------------------------------------------------------------ */

void dt_reduce_sum_forward(const dt_cpu *cpu, float *out, const float *in, int batch, int n) {
    int nt = dt_cpu_par(cpu, (double)batch * n, DT_PAR_STREAM, DT_PAR_ANY);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int i = 0; i < batch; i++) {
        double s = 0;
        for (int c = 0; c < n; c++) s += in[(size_t)i * n + c];
        out[i] = (float)s;
    }
}

void dt_reduce_sum_backward(const dt_cpu *cpu, float *din, const float *dout, int batch, int n) {
    int nt = dt_cpu_par(cpu, (double)batch * n, DT_PAR_STREAM, DT_PAR_ANY);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int i = 0; i < batch; i++)
        for (int c = 0; c < n; c++) din[(size_t)i * n + c] = dout[i];
}

/* ---- the binary output ------------------------------------------------------------------------ */

static double sigmoid(double z) { return z >= 0 ? 1.0 / (1.0 + exp(-z)) : exp(z) / (1.0 + exp(z)); }

float dt_sigmoid_logloss(float *dlogits, const float *logits, const float *labels, int batch, int *correct) {
    double loss = 0;
    int right = 0;
    for (int i = 0; i < batch; i++) {
        double z = logits[i], y = labels[i];
        loss += (z > 0 ? z : 0) - z * y + log1p(exp(-fabs(z)));
        right += (z > 0) == (y > 0.5);
        if (dlogits) dlogits[i] = (float)((sigmoid(z) - y) / batch);
    }
    if (correct) *correct = right;
    return batch > 0 ? (float)(loss / batch) : 0.0f;
}

void dt_sigmoid_probs(float *probs, const float *logits, int batch) {
    for (int i = 0; i < batch; i++) probs[i] = (float)sigmoid(logits[i]);
}
