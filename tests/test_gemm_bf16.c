/* dt_gemm_bf16 (compute/gemm_bf16.c): the rounding of its operands, and its products against a
 * float64 reference within the bounds of tests/bf16_bound.h (derived from bf16's and fp32's
 * precision and the reduction length, not fitted), over odd shapes, transposes, leading dimensions
 * and tails; the same for the emulation that runs on CPUs without AVX512_BF16; the same bits at any
 * thread count. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/cpu.h"
#include "compute/kernels.h"
#include "bf16_bound.h"
#include "core/rng.h"
#include "test.h"

typedef void (*gemm_fn)(const dt_cpu *, int, int, int, int, int, float, const float *, int, const float *, int,
                        float, float *, int);

static float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void test_round(void) {
    CHECK(dt_bf16_round(1.0f) == 1.0f);
    CHECK(dt_bf16_round(-3.0f) == -3.0f);
    /* ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 (odd last bit): to 1 */
    CHECK(dt_bf16_round(1.0f + 0x1p-8f) == 1.0f);
    /* 1 + 3 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): to 1 + 2^-6 */
    CHECK(dt_bf16_round(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);
    CHECK(dt_bf16_round(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f); /* above the tie: up */
    CHECK(dt_bf16_round(1.0f + 0x1p-8f - 0x1p-20f) == 1.0f);           /* below: down */
    CHECK(dt_bf16_round(-(1.0f + 3 * 0x1p-8f)) == -(1.0f + 0x1p-6f));
    CHECK(float_bits(dt_bf16_round(0x1p-130f)) == 0);                   /* subnormal: +0 */
    CHECK(float_bits(dt_bf16_round(-0x1p-130f)) == 0x80000000u);        /* -0 */
    CHECK(dt_bf16_round(0x1p-126f) == 0x1p-126f);                       /* smallest normal */
    CHECK(isinf(dt_bf16_round(3.4e38f)));                               /* past bf16's largest */
    CHECK(dt_bf16_round(3.0e38f) < 3.4e38f);
    float q = dt_bf16_round(bits_float(0x7f800001u)); /* a signalling NaN whose payload is in the low half */
    CHECK(isnan(q));
    CHECK(isinf(dt_bf16_round(INFINITY)) && dt_bf16_round(-INFINITY) < 0);
}

/* dt_bf16_store: the bits of dt_bf16_round for every length's tail, over random bit patterns (NaNs,
 * infinities, subnormals, ties included), and nothing written past n. */
static void test_storage(void) {
    enum { N = 100 };
    dt_rng r;
    dt_rng_seed(&r, 3);
    float src[N];
    uint16_t dst[N + 1];
    for (int i = 0; i < N; i++) {
        uint32_t u = (uint32_t)(dt_rng_uniform(&r) * 4294967296.0);
        if (i % 5 == 0) u = (u & 0xffff0000u) | 0x8000u;  /* a tie */
        if (i % 7 == 0) u &= 0x807fffffu;                 /* a subnormal */
        if (i % 11 == 0) u |= 0x7f800000u;                /* an infinity or a NaN */
        src[i] = bits_float(u);
    }
    int bad = 0, moved = 0;
    for (int n = 0; n <= N; n += n < 40 ? 1 : 29) {
        dst[n] = 0xabcd;
        dt_bf16_store(dst, src, (size_t)n);
        moved += dst[n] != 0xabcd;
        for (int i = 0; i < n; i++) bad += (uint32_t)dst[i] << 16 != float_bits(dt_bf16_round(src[i]));
    }
    CHECK_MSG(bad == 0 && moved == 0, "%d conversions differ from dt_bf16_round, %d writes past the end", bad, moved);
}

/* A random float of either sign with an exponent in [-e, e] (a spread of magnitudes, none subnormal). */
static float rand_spread(dt_rng *r, int e) {
    float m = 1.0f + dt_rng_uniform(r);
    int x = (int)(dt_rng_uniform(r) * (2 * e + 1)) - e;
    return (dt_rng_uniform(r) < 0.5f ? -m : m) * ldexpf(1.0f, x);
}

/* K = 1 and K = 2 with a zero partner: each product is a_bf * b_bf exactly, so every bit of the
 * operands' rounding shows, ties included (low halves of exactly 0x8000). */
static void check_rounding(gemm_fn f, const char *name) {
    enum { M = 29, N = 37 };
    dt_rng r;
    dt_rng_seed(&r, 11);
    float a[M * 2], b[2 * N], c[M * N];
    for (int i = 0; i < M; i++) {
        float x = rand_spread(&r, 30);
        uint32_t u = float_bits(x);
        if (i % 3 == 0) u = (u & 0xffff0000u) | 0x8000u; /* a tie */
        a[2 * i] = bits_float(u);
        a[2 * i + 1] = rand_spread(&r, 30);
    }
    for (int j = 0; j < N; j++) {
        uint32_t u = float_bits(rand_spread(&r, 30));
        if (j % 2 == 0) u = (u & 0xffff0000u) | 0x8000u;
        b[j] = bits_float(u);
        b[N + j] = 0.0f;
    }
    dt_cpu cpu;
    dt_cpu_init(&cpu, 1);
    int bad = 0;
    for (int k = 1; k <= 2; k++) {
        f(&cpu, 0, 0, M, N, k, 1.0f, a, 2, b, N, 0.0f, c, N);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++)
                if (c[i * N + j] != dt_bf16_round(a[2 * i]) * dt_bf16_round(b[j])) bad++;
    }
    CHECK_MSG(bad == 0, "%s: %d products differ from the rounded operands'", name, bad);
}

static void test_rounding(void) {
    check_rounding(dt_gemm_bf16_emulated, "emulated");
    if (dt_cpu_has_bf16()) check_rounding(dt_gemm_bf16, "AVX512_BF16");
}

typedef struct {
    int ta, tb, M, N, K, pad; /* pad: extra columns of every leading dimension */
    float alpha, beta;
} shape;

/* Runs f on one shape with random operands and checks bounds (1) and (2) for every element of C, and
 * that nothing of C's padding moved. Returns the worst error / bound of (1) and of (2). */
static void check_shape(gemm_fn f, const char *name, const shape *s, int threads, double worst[2]) {
    const int M = s->M, N = s->N, K = s->K;
    const int ar = s->ta ? K : M, ac = s->ta ? M : K, br = s->tb ? N : K, bc = s->tb ? K : N;
    const int lda = ac + s->pad, ldb = bc + s->pad, ldc = N + s->pad;
    float *A = malloc(sizeof(float) * ((size_t)ar * lda + 1)), *B = malloc(sizeof(float) * ((size_t)br * ldb + 1));
    float *C = malloc(sizeof(float) * (size_t)M * ldc), *C0 = malloc(sizeof(float) * (size_t)M * ldc);
    dt_rng r;
    dt_rng_seed(&r, (uint64_t)(M * 7919 + N * 104729 + K * 31 + s->ta * 2 + s->tb));
    for (size_t i = 0; i < (size_t)ar * lda; i++) A[i] = rand_spread(&r, 4);
    for (size_t i = 0; i < (size_t)br * ldb; i++) B[i] = rand_spread(&r, 4);
    for (size_t i = 0; i < (size_t)M * ldc; i++) C0[i] = C[i] = rand_spread(&r, 2);
    dt_cpu cpu;
    dt_cpu_init(&cpu, threads);
    cpu.par_always = threads > 1;
    f(&cpu, s->ta, s->tb, M, N, K, s->alpha, A, lda, B, ldb, s->beta, C, ldc);
    int bad1 = 0, bad2 = 0, pad_moved = 0;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            double ref = 0, ref_bf = 0, s_abs = 0, s_bf = 0;
            for (int k = 0; k < K; k++) {
                double a = s->ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                double b = s->tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                double abf = dt_bf16_round((float)a), bbf = dt_bf16_round((float)b);
                ref += a * b, ref_bf += abf * bbf;
                s_abs += fabs(a * b), s_bf += fabs(abf * bbf);
            }
            const double c0 = s->beta == 0.0f ? 0.0 : (double)s->beta * C0[(size_t)i * ldc + j];
            const double got = C[(size_t)i * ldc + j], al = fabs((double)s->alpha);
            const double e1 = fabs(got - (s->alpha * ref_bf + c0)), b1 = bf16_bound_rounded(K, al * s_bf + fabs(c0));
            const double e2 = fabs(got - (s->alpha * ref + c0));
            const double b2 = bf16_bound_exact(K, al * s_abs, fabs(c0));
            if (!(e1 <= b1)) bad1++;
            if (!(e2 <= b2)) bad2++;
            if (e1 / b1 > worst[0]) worst[0] = e1 / b1;
            if (e2 / b2 > worst[1]) worst[1] = e2 / b2;
        }
        for (int j = N; j < ldc; j++) pad_moved += C[(size_t)i * ldc + j] != C0[(size_t)i * ldc + j];
    }
    CHECK_MSG(bad1 == 0 && bad2 == 0 && pad_moved == 0,
              "%s ta=%d tb=%d M=%d N=%d K=%d pad=%d alpha=%g beta=%g threads=%d: %d outside bound (1), "
              "%d outside (2), %d padding elements written",
              name, s->ta, s->tb, M, N, K, s->pad, s->alpha, s->beta, threads, bad1, bad2, pad_moved);
    free(A), free(B), free(C), free(C0);
}

static const shape shapes[] = {
    /* tails of M (14-row tiles), N (16/32-column tiles) and K (pairs, 16-pair runs, 256 blocks) */
    {0, 0, 1, 1, 1, 0, 1, 0},       {0, 0, 13, 15, 3, 0, 1, 0},      {0, 0, 14, 16, 16, 0, 1, 0},
    {0, 0, 15, 17, 17, 0, 1, 0},    {0, 0, 29, 31, 31, 0, 1, 0},     {0, 0, 28, 32, 32, 0, 1, 0},
    {0, 0, 30, 33, 33, 0, 1, 0},    {0, 0, 43, 48, 255, 0, 1, 0},    {0, 0, 17, 10, 256, 0, 1, 0},
    {0, 0, 20, 2, 257, 0, 1, 0},    {0, 0, 33, 100, 513, 0, 1, 0},   {0, 0, 9, 300, 70, 0, 1, 0},
    {0, 0, 70, 16, 144, 0, 1, 0},   {0, 0, 64, 64, 1000, 0, 1, 0},   {0, 0, 7, 1030, 20, 0, 1, 0},
    {1, 1, 5, 1041, 33, 1, 1, 0.5f},
    /* transposes, alone and together */
    {1, 0, 13, 15, 3, 0, 1, 0},     {1, 0, 29, 33, 257, 0, 1, 0},    {1, 0, 144, 16, 70, 0, 1, 0},
    {0, 1, 13, 15, 3, 0, 1, 0},     {0, 1, 29, 33, 257, 0, 1, 0},    {0, 1, 70, 144, 16, 0, 1, 0},
    {0, 1, 15, 300, 45, 0, 1, 0},   {1, 1, 13, 15, 3, 0, 1, 0},      {1, 1, 31, 47, 290, 0, 1, 0},
    /* leading dimensions past the rows, alpha and beta */
    {0, 0, 29, 33, 41, 5, 1, 0},    {1, 1, 29, 33, 41, 3, 1, 0},     {0, 1, 17, 20, 33, 7, 0.5f, 0.25f},
    {1, 0, 17, 20, 300, 1, -2, 1},  {0, 0, 15, 40, 600, 2, 1, 1},
};

static void test_bounds(void) {
    double worst[2][2] = {{0, 0}, {0, 0}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        check_shape(dt_gemm_bf16_emulated, "emulated", &shapes[i], 1, worst[0]);
        if (dt_cpu_has_bf16()) check_shape(dt_gemm_bf16, "AVX512_BF16", &shapes[i], 1, worst[1]);
    }
    fprintf(stderr, "  worst error / bound: emulated (1) %.3f (2) %.3f; AVX512_BF16 (1) %.3f (2) %.3f\n",
            worst[0][0], worst[0][1], worst[1][0], worst[1][1]);
}

/* The same bits at 1 and 2 threads, the work cut along M and along N (and bounds at 2 threads). */
static void test_threads(void) {
    const shape big[] = {{0, 0, 300, 40, 200, 0, 1, 0}, {1, 1, 40, 300, 200, 0, 1, 0}, {0, 1, 257, 70, 33, 0, 1, 0}};
    for (size_t s = 0; s < sizeof big / sizeof big[0]; s++) {
        const shape *b = &big[s];
        const int ar = b->ta ? b->K : b->M, ac = b->ta ? b->M : b->K, br = b->tb ? b->N : b->K, bc = b->tb ? b->K : b->N;
        float *A = malloc(sizeof(float) * ar * ac), *B = malloc(sizeof(float) * br * bc);
        float *C1 = malloc(sizeof(float) * b->M * b->N), *C2 = malloc(sizeof(float) * b->M * b->N);
        dt_rng r;
        dt_rng_seed(&r, 5 + s);
        for (int i = 0; i < ar * ac; i++) A[i] = dt_rng_uniform(&r) - 0.5f;
        for (int i = 0; i < br * bc; i++) B[i] = dt_rng_uniform(&r) - 0.5f;
        dt_cpu one, two;
        dt_cpu_init(&one, 1);
        dt_cpu_init(&two, 2);
        two.par_always = 1;
        dt_gemm_bf16(&one, b->ta, b->tb, b->M, b->N, b->K, 1.0f, A, ac, B, bc, 0.0f, C1, b->N);
        dt_gemm_bf16(&two, b->ta, b->tb, b->M, b->N, b->K, 1.0f, A, ac, B, bc, 0.0f, C2, b->N);
        CHECK_MSG(!memcmp(C1, C2, sizeof(float) * b->M * b->N), "shape %zu: 1 and 2 threads differ", s);
        free(A), free(B), free(C1), free(C2);
        double worst[2] = {0, 0};
        check_shape(dt_gemm_bf16, "2 threads", b, 2, worst);
    }
}

/* dt_bf16_pack_b + dt_gemm_bf16_packed: the same words as the emulation's packer, and the same bits as
 * dt_gemm_bf16 (the emulation: as dt_gemm_bf16_emulated), over shapes that cross the packed blocks
 * (1024 columns, 256 rows of K), their tails, transposes and 1 or 2 threads cutting M or N. */
static void test_packed(void) {
    const shape sh[] = {{0, 0, 13, 15, 3, 0, 1, 0},   {1, 0, 29, 33, 257, 0, 1, 0}, {0, 1, 20, 300, 70, 0, 1, 0},
                        {0, 0, 9, 600, 515, 2, 0.5f, 0.25f}, {1, 1, 31, 17, 33, 1, 1, 1}, {0, 0, 300, 40, 64, 0, 1, 0},
                        {0, 0, 40, 1100, 30, 0, 1, 0}};
    for (size_t t = 0; t < sizeof sh / sizeof sh[0]; t++) {
        const shape *s = &sh[t];
        const int M = s->M, N = s->N, K = s->K;
        const int ac = s->ta ? M : K, ar = s->ta ? K : M, bc = s->tb ? K : N, br = s->tb ? N : K;
        const int lda = ac + s->pad, ldb = bc + s->pad, ldc = N + s->pad;
        float *A = malloc(sizeof(float) * (size_t)ar * lda), *B = malloc(sizeof(float) * (size_t)br * ldb);
        float *C0 = malloc(sizeof(float) * (size_t)M * ldc), *C1 = malloc(sizeof(float) * (size_t)M * ldc);
        float *C2 = malloc(sizeof(float) * (size_t)M * ldc);
        const size_t words = dt_bf16_packed_b_words(K, N);
        uint32_t *p1 = malloc(sizeof(uint32_t) * words), *p2 = malloc(sizeof(uint32_t) * words);
        dt_rng r;
        dt_rng_seed(&r, 77 + t);
        for (size_t i = 0; i < (size_t)ar * lda; i++) A[i] = rand_spread(&r, 3);
        for (size_t i = 0; i < (size_t)br * ldb; i++) B[i] = rand_spread(&r, 3);
        for (size_t i = 0; i < (size_t)M * ldc; i++) C0[i] = rand_spread(&r, 1);
        memset(p1, 0xff, sizeof(uint32_t) * words); /* every word must be written, the padding zeros too */
        dt_bf16_pack_b(p1, s->tb, K, N, B, ldb);
        dt_bf16_pack_b_emulated(p2, s->tb, K, N, B, ldb);
        CHECK_MSG(!memcmp(p1, p2, sizeof(uint32_t) * words), "shape %zu: packed words differ from the emulation's", t);
        for (int threads = 1; threads <= 2; threads++) {
            dt_cpu cpu;
            dt_cpu_init(&cpu, threads);
            cpu.par_always = threads > 1;
            memcpy(C1, C0, sizeof(float) * (size_t)M * ldc);
            memcpy(C2, C0, sizeof(float) * (size_t)M * ldc);
            dt_gemm_bf16(&cpu, s->ta, s->tb, M, N, K, s->alpha, A, lda, B, ldb, s->beta, C1, ldc);
            dt_gemm_bf16_packed(&cpu, s->ta, M, N, K, s->alpha, A, lda, p1, s->beta, C2, ldc);
            CHECK_MSG(!memcmp(C1, C2, sizeof(float) * (size_t)M * ldc), "shape %zu, %d threads: packed differs", t, threads);
            memcpy(C1, C0, sizeof(float) * (size_t)M * ldc);
            memcpy(C2, C0, sizeof(float) * (size_t)M * ldc);
            dt_gemm_bf16_emulated(&cpu, s->ta, s->tb, M, N, K, s->alpha, A, lda, B, ldb, s->beta, C1, ldc);
            dt_gemm_bf16_packed_emulated(&cpu, s->ta, M, N, K, s->alpha, A, lda, p2, s->beta, C2, ldc);
            CHECK_MSG(!memcmp(C1, C2, sizeof(float) * (size_t)M * ldc), "shape %zu: packed emulation differs", t);
        }
        free(A), free(B), free(C0), free(C1), free(C2), free(p1), free(p2);
    }
}

/* K = 0 scales C by beta (beta 0 clears it, NaN included); M or N = 0 touches nothing. */
static void test_empty(void) {
    dt_cpu cpu;
    dt_cpu_init(&cpu, 1);
    float c[4] = {1, 2, NAN, 4}, a = 1, b = 1;
    dt_gemm_bf16(&cpu, 0, 0, 2, 2, 0, 1.0f, &a, 1, &b, 2, 0.5f, c, 2);
    CHECK(c[0] == 0.5f && c[1] == 1.0f && isnan(c[2]) && c[3] == 2.0f);
    dt_gemm_bf16(&cpu, 0, 0, 2, 2, 0, 1.0f, &a, 1, &b, 2, 0.0f, c, 2);
    CHECK(c[0] == 0 && c[1] == 0 && c[2] == 0 && c[3] == 0);
    c[0] = 7;
    dt_gemm_bf16(&cpu, 0, 0, 0, 2, 3, 1.0f, &a, 1, &b, 2, 0.0f, c, 2);
    CHECK(c[0] == 7);
}

/* dt_cpu_has_bf16 reads cpuid: it must agree with the kernel's own flag list where there is one. */
static void test_detection(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[8192];
    int flag = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "flags", 5)) {
            flag = strstr(line, " avx512_bf16") != NULL;
            break;
        }
    fclose(f);
    if (flag >= 0) CHECK_MSG(dt_cpu_has_bf16() == flag, "cpuid says %d, /proc/cpuinfo %d", dt_cpu_has_bf16(), flag);
    fprintf(stderr, "  AVX512_BF16: %s\n", dt_cpu_has_bf16() ? "yes" : "no (only the emulation ran)");
}

int main(void) {
    RUN(test_round);
    RUN(test_detection);
    RUN(test_storage);
    RUN(test_rounding);
    RUN(test_bounds);
    RUN(test_threads);
    RUN(test_packed);
    RUN(test_empty);
    return test_summary();
}
