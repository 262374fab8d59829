/* dt_gemm_bf16 (kernels.h), the reference version: A and B rounded to bf16 values held in float32
 * (compute/precision.h, dt_round_bf16), then the float32 product (dt_gemm). A product of two bf16
 * values is exact in float32 (8 + 8 significant bits), so this gives what a bf16 kernel with float32
 * accumulation gives, up to the order of the additions. */
#include <cpuid.h>
#include <stdlib.h>

#include "compute/kernels.h"
#include "compute/precision.h"

/* rows x cols of a row-major matrix with leading dimension ld, rounded into dst [rows, cols]. */
static void round_matrix(float *dst, const float *src, int rows, int cols, int ld) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) dst[(size_t)r * cols + c] = dt_round_bf16(src[(size_t)r * ld + c]);
}

void dt_gemm_bf16(const dt_cpu *cpu, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    const int ar = trans_a ? K : M, ac = trans_a ? M : K, br = trans_b ? N : K, bc = trans_b ? K : N;
    dt_cpu fp32 = *cpu;
    fp32.bf16 = 0;
    float *a = K > 0 ? malloc(((size_t)ar * ac + (size_t)br * bc) * sizeof(float)) : NULL;
    if (!a) { /* K == 0, or no memory: element by element, nothing to allocate */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                float s = 0.0f;
                for (int k = 0; k < K; k++)
                    s += dt_round_bf16(trans_a ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                         dt_round_bf16(trans_b ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
                float *c = C + (size_t)i * ldc + j;
                *c = alpha * s + (beta == 0.0f ? 0.0f : beta * *c);
            }
        return;
    }
    float *b = a + (size_t)ar * ac;
    round_matrix(a, A, ar, ac, lda);
    round_matrix(b, B, br, bc, ldb);
    dt_gemm(&fp32, trans_a, trans_b, M, N, K, alpha, a, ac, b, bc, beta, C, ldc);
    free(a);
}

int dt_cpu_has_bf16(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
    return (a >> 5) & 1; /* CPUID.(EAX=7, ECX=1):EAX bit 5: AVX512_BF16 */
}
