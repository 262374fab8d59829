/* Error bounds of a product with bf16 operands and fp32 sums (dt_gemm_bf16, its emulation, and the
 * layers built on it), against a float64 reference: derived, not fitted. For tests of the kernel
 * (tests/test_gemm_bf16.c) and of the layers' bf16 forward and backward against the fixtures.
 *
 * Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., sec. 3.1 and 4.2:
 *   u32 = 2^-24 (fp32's unit roundoff), gamma(n) = n u32 / (1 - n u32);
 *   ub = 2^-8: bf16 keeps 8 significant bits, so round to nearest moves x by at most 2^-8 |x|.
 * A product of two bf16 values is exact in fp32 (8 + 8 significant bits <= 24), so the only fp32
 * errors are the sums'. Whatever their order (vdpbf16ps adds a pair's two products with at most two
 * roundings; the kernel's K blocks of 256 add one rounding each where they are summed into C; alpha
 * and beta one each), each of the K terms passes through at most n = K + ceil(K / 256) + 2
 * roundings, so with s_bf = sum |alpha a_bf b_bf| + |beta c0|:
 *   (1) |C - C64(a_bf, b_bf)| <= gamma(n) s_bf + n 2^-126
 * (the last term: AVX512_BF16 flushes subnormal results to zero, 2^-126 at most per operation).
 * Against the unrounded operands, |a_bf b_bf - a b| <= (2 ub + ub^2) |a b| adds, with
 * s = sum |alpha a b|:
 *   (2) |C - C64(a, b)| <= (2 ub + ub^2) s + gamma(n) ((1 + ub)^2 s + |beta c0|) + n 2^-126.
 * A layer made of one such product (dense, im2col convolution: K = KH KW C forward) adds its own
 * fp32 roundings (a bias: one more); Winograd's transforms add theirs, which these do not cover. */
#ifndef DT_TEST_BF16_BOUND_H
#define DT_TEST_BF16_BOUND_H

/* n above: the roundings any of the K terms of one element passes through. */
static inline double bf16_roundings(int K) { return (double)K + (K + 255) / 256 + 2; }

static inline double bf16_gamma(int K) {
    const double n = bf16_roundings(K), u = 0x1p-24;
    return n * u / (1 - n * u);
}

/* (1): against the float64 product of the bf16-rounded operands; s_bf = sum |alpha a_bf b_bf| + |beta c0|. */
static inline double bf16_bound_rounded(int K, double s_bf) {
    return bf16_gamma(K) * s_bf + bf16_roundings(K) * 0x1p-126;
}

/* (2): against the float64 product of the unrounded operands; s = sum |alpha a b|, bc = |beta c0|. */
static inline double bf16_bound_exact(int K, double s, double bc) {
    const double ub = 0x1p-8;
    return (2 * ub + ub * ub) * s + bf16_gamma(K) * ((1 + ub) * (1 + ub) * s + bc) + bf16_roundings(K) * 0x1p-126;
}

#endif
