/* bf16 matrix products with fp32 accumulation (kernels.h, dt_gemm_bf16): the project's own
 * AVX512_BF16 kernel, and the same numbers' emulation for CPUs without the instruction.
 *
 * vdpbf16ps (_mm512_dpbf16_ps) adds to each of 16 fp32 lanes the products of one pair of bf16
 * values from each operand: twice the multiply-adds of an fp32 FMA per instruction. So both
 * operands are packed as pairs along K (one 32-bit word: element k in the low half, k+1 in the
 * high half), converted with round to nearest even (vcvtne2ps2bf16):
 *   B: a block of KC rows of op(B) by up to NC columns, in tiles of 32 columns, [k pair][32 columns];
 *   A: one micro-panel of MR rows of op(A) by KC, [row][k pair] (op(A) = A: a plain conversion of
 *      each row), or the panels of 2 tiles, [k pair][row] (op(A) = A^T: a conversion of two rows of
 *      A at a time).
 * The micro-kernel keeps an MR x 32 (or MR x 16) tile of C in 28 (14) registers, broadcasting one
 * pair of A per row and loading 2 (1) vectors of B per k pair. The A panel (7-16 KB) stays in L1
 * across the tiles of the block, the B block (up to 512 KB) in L2.
 *
 * Each element of C is the same chain of operations whatever the tile it falls in or the thread
 * that computes it (K in KC blocks in order, each block's pairs in order), so results do not depend
 * on the thread count or on how the work is cut: as dt_gemm, bit for bit. */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compute/cpu.h"
#include "compute/kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define BF16_X86 1
/* Compiled for AVX512_BF16 whatever the build's -march, run only where dt_cpu_has_bf16() says. */
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define BF16_INLINE static inline __attribute__((always_inline)) BF16_TARGET
#endif

int dt_cpu_has_bf16(void) {
#ifdef BF16_X86
    static int known = -1; /* a constant of the machine: a race writes the same value */
    int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (k >= 0) return k;
    unsigned a, b, c, d;
    k = 0;
    /* The OS must save the AVX-512 state (XCR0: SSE, AVX, opmask, both halves of the zmm file). */
    if (__get_cpuid(1, &a, &b, &c, &d) && (c & bit_OSXSAVE)) {
        uint32_t lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        if ((lo & 0xe6) == 0xe6 && __get_cpuid_count(7, 0, &a, &b, &c, &d) && a >= 1 &&
            (b & (1u << 16)) && (b & (1u << 30)) && (b & (1u << 31)) && (b & (1u << 17))) {
            /* avx512f, avx512bw, avx512vl, avx512dq; AVX512_BF16 is leaf 7 subleaf 1, EAX bit 5 */
            if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) k = (a >> 5) & 1;
        }
    }
    __atomic_store_n(&known, k, __ATOMIC_RELAXED);
    return k;
#else
    return 0;
#endif
}

/* C = beta * C (K == 0), beta 0 writes zeros whatever C held (NaN included), as BLAS does. */
static void scale_c(int M, int N, float beta, float *C, int ldc) {
    for (int i = 0; i < M; i++) {
        float *c = C + (size_t)i * ldc;
        for (int j = 0; j < N; j++) c[j] = beta == 0.0f ? 0.0f : beta * c[j];
    }
}

#define MR 14       /* rows of a micro-tile */
#define KC 256      /* K per block (elements) */
#define KCP (KC / 2) /* ... in pairs: the row stride of a packed A micro-panel */
#define NC 1024     /* columns of op(B) per packed block (512 KB of bf16 pairs: half a Zen 4 L2) */
#define NT 32       /* columns of a B tile */
#define TG 32       /* the stride of pairs of op(A) = A^T, packed 2 tiles (2 * MR rows) at a time */
#define A_WORDS ((size_t)TG * KCP) /* an A panel, either way (MR <= TG) */

/* Packed op(B) (the kernel's blocks, and dt_bf16_pack_b's whole matrix): blocks of NC columns, each
 * holding its K blocks of KC rows in order; a block's tiles of NT columns, [pair][NT] words (a last
 * tile of <= 16 columns: [pair][16]) at a stride of kcp * NT, every word written: past the ends, zeros. */
static size_t kp_total(int K) { return (size_t)(K / KC) * KCP + (size_t)(K % KC + 1) / 2; }
static size_t cols16(int n) { return (size_t)(n + 15) / 16 * 16; } /* full tiles and the last one */
static size_t packed_block(int N, int K, int n0, int k0) {
    const int nc = N - n0 < NC ? N - n0 : NC;
    return (size_t)(n0 / NC) * NC * kp_total(K) + cols16(nc) * (size_t)(k0 / KC) * KCP;
}
size_t dt_bf16_packed_b_words(int K, int N) {
    if (K <= 0 || N <= 0) return 0;
    return (size_t)(N / NC) * NC * kp_total(K) + (N % NC ? cols16(N % NC) * kp_total(K) : 0);
}
/* The word of element (k, n) of op(B), and which half (k odd: the high one). */
static size_t packed_index(int N, int K, int k, int n, int *high) {
    const int n0 = n / NC * NC, k0 = k / KC * KC, nc = N - n0 < NC ? N - n0 : NC;
    const int kc = K - k0 < KC ? K - k0 : KC, kcp = (kc + 1) / 2, t0 = (n - n0) / NT * NT;
    const int w = nc - t0 > 16 ? NT : 16;
    *high = (k - k0) & 1;
    return packed_block(N, K, n0, k0) + (size_t)(t0 / NT) * kcp * NT + (size_t)((k - k0) / 2) * w + (n - n0 - t0);
}

static uint16_t bf16_bits(float x) {
    union {
        float f;
        uint32_t u;
    } v = {dt_bf16_round(x)};
    return (uint16_t)(v.u >> 16);
}

static float packed_value(const uint32_t *pb, int N, int K, int k, int n) {
    int high;
    const uint32_t w = pb[packed_index(N, K, k, n, &high)];
    union {
        uint32_t u;
        float f;
    } v = {high ? w & 0xffff0000u : w << 16};
    return v.f;
}

static void from_f32_scalar(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = bf16_bits(src[i]);
}

/* C = alpha A op(B) + beta C from a packed op(B) without AVX512_BF16: its values (bf16 already)
 * unpacked, then the emulation. */
void dt_gemm_bf16_packed_emulated(const dt_cpu *cpu, int trans_a, int M, int N, int K, float alpha, const float *A,
                                  int lda, const uint32_t *pb, float beta, float *C, int ldc) {
    float *b = malloc(sizeof(float) * (size_t)K * N);
    if (b) {
        for (int k = 0; k < K; k++)
            for (int n = 0; n < N; n++) b[(size_t)k * N + n] = packed_value(pb, N, K, k, n);
        dt_gemm_bf16_emulated(cpu, trans_a, 0, M, N, K, alpha, A, lda, b, N, beta, C, ldc);
        free(b);
        return;
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = 0.0f;
            for (int k = 0; k < K; k++)
                s += dt_bf16_round(trans_a ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) * packed_value(pb, N, K, k, j);
            float *c = C + (size_t)i * ldc + j;
            *c = alpha * s + (beta == 0.0f ? 0.0f : beta * *c);
        }
}

/* dt_bf16_pack_b without AVX512_BF16: the same words, element by element. */
void dt_bf16_pack_b_emulated(uint32_t *packed, int trans_b, int K, int N, const float *B, int ldb) {
    memset(packed, 0, dt_bf16_packed_b_words(K, N) * sizeof(uint32_t));
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++) {
            int high;
            const size_t i = packed_index(N, K, k, n, &high);
            const uint32_t h = bf16_bits(trans_b ? B[(size_t)n * ldb + k] : B[(size_t)k * ldb + n]);
            packed[i] |= high ? h << 16 : h;
        }
}

/* ---- the emulation: the same rounding, fp32 products and sums through dt_gemm --------------- */

void dt_gemm_bf16_emulated(const dt_cpu *cpu, int trans_a, int trans_b, int M, int N, int K, float alpha,
                           const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        scale_c(M, N, beta, C, ldc);
        return;
    }
    /* Products of two bf16 values are exact in fp32 (8 + 8 significant bits), so an fp32 product of
     * the rounded operands differs from the instruction's only in the order of the sums. */
    float *a = malloc(sizeof(float) * (size_t)M * K), *b = malloc(sizeof(float) * (size_t)K * N);
    if (a && b) {
        for (int i = 0; i < M; i++)
            for (int k = 0; k < K; k++)
                a[(size_t)i * K + k] = dt_bf16_round(trans_a ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]);
        for (int k = 0; k < K; k++)
            for (int j = 0; j < N; j++)
                b[(size_t)k * N + j] = dt_bf16_round(trans_b ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
        dt_gemm(cpu, 0, 0, M, N, K, alpha, a, K, b, N, beta, C, ldc);
    } else {
        /* No memory for the rounded copies: the same sums, one element at a time (slow, never fails). */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                float s = 0.0f;
                for (int k = 0; k < K; k++)
                    s += dt_bf16_round(trans_a ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                         dt_bf16_round(trans_b ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
                float *c = C + (size_t)i * ldc + j;
                *c = alpha * s + (beta == 0.0f ? 0.0f : beta * *c);
            }
    }
    free(a);
    free(b);
}

#ifdef BF16_X86

/* 16 bf16 pairs (k, k+1) from 16 fp32 of row k (lo) and of row k + 1 (hi), lane i = column i. */
BF16_INLINE __m512i pair_rows(__m512 lo, __m512 hi) {
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

/* 16 consecutive bf16 pairs of one row: 32 fp32 from p, the first n valid (the rest are zeros). */
BF16_INLINE __m512i pair_run(const float *p, int n) {
    __mmask16 m0 = n >= 16 ? 0xffff : (__mmask16)((1u << (n > 0 ? n : 0)) - 1);
    __mmask16 m1 = n >= 32 ? 0xffff : n <= 16 ? 0 : (__mmask16)((1u << (n - 16)) - 1);
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, p + 16), _mm512_maskz_loadu_ps(m0, p));
}

/* In-register transpose of a 16 x 16 matrix of 32-bit words. */
BF16_INLINE void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 4; i++) {
            t[8 * h + i] = _mm512_shuffle_i32x4(r[8 * h + i], r[8 * h + 4 + i], 0x88);
            t[8 * h + 4 + i] = _mm512_shuffle_i32x4(r[8 * h + i], r[8 * h + 4 + i], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0x88);
        r[8 + i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0xdd);
    }
}

/* Packs rows k0 .. k0+kc of op(B), columns n0 .. n0+nc, into tiles of NT columns: tile t holds
 * [kcp pairs][NT] words from bp + t * kcp * NT (a last tile of <= 16 columns: [kcp][16]). Columns and
 * rows past the ends are zeros. */
BF16_TARGET static void pack_b(uint32_t *bp, const float *B, int ldb, int trans_b, int k0, int kc, int n0, int nc) {
    const int kcp = (kc + 1) / 2;
    for (int t0 = 0; t0 < nc; t0 += NT) {
        const int w = nc - t0 >= NT ? NT : nc - t0 > 16 ? NT : 16; /* the tile's width */
        uint32_t *tile = bp + (size_t)(t0 / NT) * kcp * NT;
        for (int g = 0; g < w; g += 16) { /* groups of 16 columns */
            const int cols = nc - t0 - g; /* valid columns from this group on */
            if (!trans_b) {
                const __mmask16 m = cols >= 16 ? 0xffff : cols > 0 ? (__mmask16)((1u << cols) - 1) : 0;
                for (int p = 0; p < kcp; p++) {
                    const float *r0 = B + (size_t)(k0 + 2 * p) * ldb + n0 + t0 + g;
                    __m512 lo = _mm512_maskz_loadu_ps(m, r0);
                    __m512 hi = 2 * p + 1 < kc ? _mm512_maskz_loadu_ps(m, r0 + ldb) : _mm512_setzero_ps();
                    _mm512_storeu_si512(tile + (size_t)p * w + g, pair_rows(lo, hi));
                }
            } else {
                /* op(B)[k][n] = B[n][k]: a row of B holds a column's pairs in order; 16 columns of 16
                 * pairs at a time, transposed. */
                for (int p0 = 0; p0 < kcp; p0 += 16) {
                    __m512i r[16];
                    for (int j = 0; j < 16; j++)
                        r[j] = j < cols ? pair_run(B + (size_t)(n0 + t0 + g + j) * ldb + k0 + 2 * p0, kc - 2 * p0)
                                        : _mm512_setzero_si512();
                    transpose16(r);
                    for (int j = 0; j < 16 && p0 + j < kcp; j++)
                        _mm512_storeu_si512(tile + (size_t)(p0 + j) * w + g, r[j]);
                }
            }
        }
    }
}

/* Packs rows m0 .. m0+mr of op(A), K from k0 to k0+kc: op(A) = A as one micro-panel, [row][KCP]
 * words (each row converted in place); op(A) = A^T as a group of mr <= 2 * MR rows, [kcp][TG], the
 * micro-panels of its (at most 2) tiles within. Pairs past kc are zeros. */
BF16_TARGET static void pack_a(uint32_t *ap, const float *A, int lda, int trans_a, int m0, int mr, int k0, int kc) {
    const int kcp = (kc + 1) / 2;
    if (!trans_a) {
        /* 16 pairs of every row at a time; the masks of a short K (9, 16, 27 in the models) once for
         * all rows, and 8 pairs from 16 floats by the half-width conversion. */
        const float *a0 = A + (size_t)m0 * lda + k0;
        for (int p = 0; p < kcp; p += 16) {
            const int n = kc - 2 * p; /* floats left in each row */
            if (n >= 32) {
                for (int r = 0; r < mr; r++) {
                    const float *x = a0 + (size_t)r * lda + 2 * p;
                    _mm512_storeu_si512(ap + (size_t)r * KCP + p,
                                        (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x)));
                }
            } else if (n > 16) {
                const __mmask16 m = (__mmask16)((1u << (n - 16)) - 1);
                for (int r = 0; r < mr; r++) {
                    const float *x = a0 + (size_t)r * lda + 2 * p;
                    _mm512_storeu_si512(ap + (size_t)r * KCP + p, (__m512i)_mm512_cvtne2ps_pbh(
                                                                      _mm512_maskz_loadu_ps(m, x + 16), _mm512_loadu_ps(x)));
                }
            } else {
                const __mmask16 m = n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1);
                for (int r = 0; r < mr; r++)
                    _mm256_storeu_si256((__m256i *)(ap + (size_t)r * KCP + p),
                                        (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, a0 + (size_t)r * lda + 2 * p)));
            }
        }
    } else {
        /* A group of up to 2 * MR rows of op(A) (columns of A): 16 pairs per conversion. */
        for (int g = 0; g < mr; g += 16) {
            const int n = mr - g < 16 ? mr - g : 16;
            const __mmask16 m = (__mmask16)((1u << n) - 1);
            for (int p = 0; p < kcp; p++) {
                const float *r0 = A + (size_t)(k0 + 2 * p) * lda + m0 + g;
                __m512 lo = _mm512_maskz_loadu_ps(m, r0);
                __m512 hi = 2 * p + 1 < kc ? _mm512_maskz_loadu_ps(m, r0 + lda) : _mm512_setzero_ps();
                _mm512_storeu_si512(ap + (size_t)p * TG + g, pair_rows(lo, hi));
            }
        }
    }
}

/* C[R rows, NV*16 columns (the last vector's columns masked by mlast)] (=, +=) alpha * A B over kcp
 * pairs. first: C = alpha * AB + beta * C (beta 0: C is not read); else C += alpha * AB. a_t: the
 * A panel is [kcp][TG] (else [R][KCP]). */
BF16_INLINE void ukern(const int R, const int NV, const int a_t, int kcp, const uint32_t *a, const uint32_t *b,
                       float *c, size_t ldc, __mmask16 mlast, float alpha, float beta, int first) {
    __m512 acc[MR][2];
#pragma GCC unroll 14
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int p = 0; p < kcp; p++) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + (size_t)p * 16 * NV);
        const __m512bh b1 = NV > 1 ? (__m512bh)_mm512_loadu_si512(b + (size_t)p * 32 + 16) : b0;
#pragma GCC unroll 14
        for (int r = 0; r < R; r++) {
            const __m512bh av = (__m512bh)_mm512_set1_epi32((int)(a_t ? a[(size_t)p * TG + r] : a[(size_t)r * KCP + p]));
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
            if (NV > 1) acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
        }
    }
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 14
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NV; j++) {
            const __mmask16 m = j == NV - 1 ? mlast : 0xffff;
            float *cp = c + (size_t)r * ldc + 16 * j;
            __m512 v = alpha == 1.0f ? acc[r][j] : _mm512_mul_ps(acc[r][j], va);
            if (!first) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, cp));
            else if (beta != 0.0f) v = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, cp), v);
            _mm512_mask_storeu_ps(cp, m, v);
        }
}

typedef void (*ukern_fn)(int kcp, const uint32_t *a, const uint32_t *b, float *c, size_t ldc, __mmask16 mlast,
                         float alpha, float beta, int first);

#define UK(R, NV, AT)                                                                                          \
    BF16_TARGET static void uk_##R##_##NV##_##AT(int kcp, const uint32_t *a, const uint32_t *b, float *c,       \
                                                 size_t ldc, __mmask16 mlast, float alpha, float beta,         \
                                                 int first) {                                                  \
        ukern(R, NV, AT, kcp, a, b, c, ldc, mlast, alpha, beta, first);                                        \
    }
#define UK_ROWS(NV, AT)                                                                                        \
    UK(1, NV, AT) UK(2, NV, AT) UK(3, NV, AT) UK(4, NV, AT) UK(5, NV, AT) UK(6, NV, AT) UK(7, NV, AT)           \
    UK(8, NV, AT) UK(9, NV, AT) UK(10, NV, AT) UK(11, NV, AT) UK(12, NV, AT) UK(13, NV, AT) UK(14, NV, AT)
UK_ROWS(1, 0)
UK_ROWS(2, 0)
UK_ROWS(1, 1)
UK_ROWS(2, 1)
#define UK_LIST(NV, AT)                                                                                        \
    {uk_1_##NV##_##AT, uk_2_##NV##_##AT, uk_3_##NV##_##AT, uk_4_##NV##_##AT, uk_5_##NV##_##AT,                 \
     uk_6_##NV##_##AT, uk_7_##NV##_##AT, uk_8_##NV##_##AT, uk_9_##NV##_##AT, uk_10_##NV##_##AT,                \
     uk_11_##NV##_##AT, uk_12_##NV##_##AT, uk_13_##NV##_##AT, uk_14_##NV##_##AT}
/* [a_t][NV - 1][rows - 1] */
static const ukern_fn ukerns[2][2][MR] = {{UK_LIST(1, 0), UK_LIST(2, 0)}, {UK_LIST(1, 1), UK_LIST(2, 1)}};

/* Words of packing one thread needs for a product with K and N: a B block (at most KCP pairs by NC
 * columns, in whole tiles) and an A micro-panel (MR x KCP either way). */
static size_t pack_words(int K, int N) {
    size_t kp = (size_t)(K + 1) / 2, n = (size_t)(N < NC ? N : NC);
    if (kp > KCP) kp = KCP;
    return kp * ((n + NT - 1) / NT * NT) + A_WORDS;
}

/* Where op(B) comes from: fp32 (B, ldb, trans_b), packed on the way; or packed already (pb, the whole
 * matrix's pb_n columns, this product's columns from pb_n0 on, a multiple of NC). */
typedef struct {
    const float *B;
    int ldb, trans_b;
    const uint32_t *pb;
    int pb_n, pb_n0;
} b_source;

/* One thread's product on the sub-matrix C[M, N] (A, C and an fp32 B already offset), with pack
 * (pack_words(K, N) words, or MR * KCP for a packed B; 64-byte aligned) for its packing. */
BF16_TARGET static void gemm_serial(uint32_t *pack, int trans_a, const b_source *src, int M, int N, int K,
                                    float alpha, const float *A, int lda, float beta, float *C, int ldc) {
    uint32_t *ap = pack, *bp = pack + A_WORDS;
    for (int n0 = 0; n0 < N; n0 += NC) {
        const int nc = N - n0 < NC ? N - n0 : NC;
        for (int k0 = 0; k0 < K; k0 += KC) {
            const int kc = K - k0 < KC ? K - k0 : KC, kcp = (kc + 1) / 2;
            if (src->pb) bp = (uint32_t *)src->pb + packed_block(src->pb_n, K, src->pb_n0 + n0, k0);
            else pack_b(bp, src->B, src->ldb, src->trans_b, k0, kc, n0, nc);
            /* Rows cut into tiles of equal size (16 rows: 8 + 8, not 14 + 2): a tile of few rows has few
             * independent sums, and with a long K it waits on vdpbf16ps's latency. op(A) = A^T packs the
             * rows of 2 tiles at once (a conversion per pair and 16 rows, not per tile) and cuts them. */
            const int group = trans_a ? 2 * MR : MR;
            const int tiles = (M + group - 1) / group, rows = (M + tiles - 1) / tiles;
            for (int m0 = 0; m0 < M; m0 += rows) {
                const int mg = M - m0 < rows ? M - m0 : rows; /* rows packed together */
                pack_a(ap, A, lda, trans_a, m0, mg, k0, kc);
                const int halves = mg > MR ? 2 : 1;
                for (int h = 0, r0 = 0; h < halves; h++) {
                    const int mr = halves == 1 ? mg : h == 0 ? (mg + 1) / 2 : mg / 2;
                    for (int t0 = 0; t0 < nc; t0 += NT) {
                        const int cols = nc - t0 < NT ? nc - t0 : NT, nv = cols > 16 ? 2 : 1;
                        const int last = cols - 16 * (nv - 1);
                        const __mmask16 mlast = last >= 16 ? 0xffff : (__mmask16)((1u << last) - 1);
                        ukerns[trans_a ? 1 : 0][nv - 1][mr - 1](kcp, ap + r0, bp + (size_t)(t0 / NT) * kcp * NT,
                                                                C + (size_t)(m0 + r0) * ldc + n0 + t0, (size_t)ldc,
                                                                mlast, alpha, beta, k0 == 0);
                    }
                    r0 += mr;
                }
            }
        }
    }
}

/* Pieces of C's longer side the threads share out (dynamically: a core shared with other work
 * falls behind without stalling the rest); how it is cut does not change a bit of the result. */
#define BF16_PIECES_PER_THREAD 4
#define BF16_PIECE_MIN 64

#define STACK_PACK_WORDS 8192 /* 32 KB */

static uint32_t *alloc_pack(size_t words) {
    return aligned_alloc(64, (words * sizeof(uint32_t) + 63) & ~(size_t)63);
}

/* The product on the CPU with AVX512_BF16, its pieces shared out by the threads. */
static void gemm_drive(const dt_cpu *cpu, int trans_a, const b_source *src, int M, int N, int K, float alpha,
                       const float *A, int lda, float beta, float *C, int ldc) {
    const int packed = src->pb != NULL;
    const int split_m = M >= N, len = split_m ? M : N;
    /* whole micro-tiles of rows; whole packed blocks (or tiles) of columns */
    const int unit = split_m ? MR : packed ? NC : NT;
    int nt = dt_cpu_par(cpu, 2.0 * M * N * K, DT_PAR_FLOPS, par_cap((size_t)(len + unit - 1) / unit));
    int pieces = 1, blk = len;
    if (nt > 1) {
        pieces = nt * BF16_PIECES_PER_THREAD;
        blk = (len + pieces - 1) / pieces;
        if (blk < BF16_PIECE_MIN) blk = BF16_PIECE_MIN;
        blk = (blk + unit - 1) / unit * unit;
        pieces = (len + blk - 1) / blk;
        if (pieces < 2) nt = 1;
    }
    /* Every thread's packing at once, before the region: without the memory, one thread does it all. */
    const size_t words = packed ? A_WORDS : pack_words(K, split_m ? N : blk);
    uint32_t *packs = nt > 1 ? alloc_pack(words * nt) : NULL;
    if (!packs) {
        /* Most of a step's products are small (Winograd's: 64 x 64 x 32, a microsecond or two): their
         * packing fits on the stack, and a malloc + free would cost a tenth of them. Without memory for
         * the packing: the emulation (element at a time if it finds none either). */
        uint32_t small[STACK_PACK_WORDS] __attribute__((aligned(64)));
        const size_t need = packed ? A_WORDS : pack_words(K, N);
        uint32_t *pack = need <= STACK_PACK_WORDS ? small : alloc_pack(need);
        if (pack) gemm_serial(pack, trans_a, src, M, N, K, alpha, A, lda, beta, C, ldc);
        else if (packed) dt_gemm_bf16_packed_emulated(cpu, trans_a, M, N, K, alpha, A, lda, src->pb, beta, C, ldc);
        else dt_gemm_bf16_emulated(cpu, trans_a, src->trans_b, M, N, K, alpha, A, lda, src->B, src->ldb, beta, C, ldc);
        if (pack != small) free(pack);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        uint32_t *pack = packs + words * (size_t)omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
        for (int p = 0; p < pieces; p++) {
            const int lo = p * blk, n = lo + blk < len ? blk : len - lo;
            const float *a = A;
            float *c = C;
            int m = M, nn = N;
            b_source s = *src;
            if (split_m) {
                a = trans_a ? A + lo : A + (size_t)lo * lda;
                c = C + (size_t)lo * ldc;
                m = n;
            } else {
                if (packed) s.pb_n0 = lo;
                else s.B = s.trans_b ? s.B + (size_t)lo * s.ldb : s.B + lo;
                c = C + lo;
                nn = n;
            }
            gemm_serial(pack, trans_a, &s, m, nn, K, alpha, a, lda, beta, c, ldc);
        }
    }
    free(packs);
}

void dt_gemm_bf16(const dt_cpu *cpu, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        scale_c(M, N, beta, C, ldc);
        return;
    }
    if (!dt_cpu_has_bf16()) {
        dt_gemm_bf16_emulated(cpu, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    const b_source src = {B, ldb, trans_b, NULL, 0, 0};
    gemm_drive(cpu, trans_a, &src, M, N, K, alpha, A, lda, beta, C, ldc);
}

void dt_bf16_pack_b(uint32_t *packed, int trans_b, int K, int N, const float *B, int ldb) {
    if (K <= 0 || N <= 0) return;
    if (!dt_cpu_has_bf16()) {
        dt_bf16_pack_b_emulated(packed, trans_b, K, N, B, ldb);
        return;
    }
    for (int n0 = 0; n0 < N; n0 += NC)
        for (int k0 = 0; k0 < K; k0 += KC)
            pack_b(packed + packed_block(N, K, n0, k0), B, ldb, trans_b, k0, K - k0 < KC ? K - k0 : KC, n0,
                   N - n0 < NC ? N - n0 : NC);
}

void dt_gemm_bf16_packed(const dt_cpu *cpu, int trans_a, int M, int N, int K, float alpha, const float *A, int lda,
                         const uint32_t *packed_b, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        scale_c(M, N, beta, C, ldc);
        return;
    }
    if (!dt_cpu_has_bf16()) {
        dt_gemm_bf16_packed_emulated(cpu, trans_a, M, N, K, alpha, A, lda, packed_b, beta, C, ldc);
        return;
    }
    const b_source src = {NULL, 0, 0, packed_b, N, 0};
    gemm_drive(cpu, trans_a, &src, M, N, K, alpha, A, lda, beta, C, ldc);
}

BF16_TARGET static void from_f32_avx(uint16_t *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        _mm512_storeu_si512(dst + i, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i)));
    if (i < n) {
        const __m512i v = pair_run(src + i, (int)(n - i));
        _mm512_mask_storeu_epi16(dst + i, (__mmask32)((1ull << (n - i)) - 1), v);
    }
}

void dt_bf16_store(uint16_t *dst, const float *src, size_t n) {
    if (dt_cpu_has_bf16()) from_f32_avx(dst, src, n);
    else from_f32_scalar(dst, src, n);
}

#else /* not x86-64: the emulation */

void dt_bf16_store(uint16_t *dst, const float *src, size_t n) { from_f32_scalar(dst, src, n); }


void dt_gemm_bf16(const dt_cpu *cpu, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    dt_gemm_bf16_emulated(cpu, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void dt_bf16_pack_b(uint32_t *packed, int trans_b, int K, int N, const float *B, int ldb) {
    if (K > 0 && N > 0) dt_bf16_pack_b_emulated(packed, trans_b, K, N, B, ldb);
}

void dt_gemm_bf16_packed(const dt_cpu *cpu, int trans_a, int M, int N, int K, float alpha, const float *A, int lda,
                         const uint32_t *packed_b, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) scale_c(M, N, beta, C, ldc);
    else dt_gemm_bf16_packed_emulated(cpu, trans_a, M, N, K, alpha, A, lda, packed_b, beta, C, ldc);
}

#endif

