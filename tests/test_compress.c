/* 16-bit encodings (src/transport/compress.h) and the worker's gradient codec (src/worker/codec.h):
 * exact bit patterns (nearest-even ties, NaN, infinities, the largest values, subnormals), every
 * fp16 value and a sweep of float32 bit patterns against a reference that finds the nearest value
 * by search, unaligned buffers, and error feedback: what is sent tracks the true gradients' sum to
 * within one rounding unit, however many steps. */
#include <float.h>
#include <stdint.h>

#include "test.h"
#include "transport/compress.h"
#include "worker/codec.h"

static float f_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t u_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

typedef struct {
    uint32_t in;
    uint16_t want;
    const char *what;
} bits_case;

static void test_bf16_bits(void) {
    static const bits_case cases[] = {
        {0x3f800000u, 0x3f80, "1"},
        {0x3f807fffu, 0x3f80, "below half: down"},
        {0x3f808000u, 0x3f80, "tie, even below: down"},
        {0x3f808001u, 0x3f81, "above half: up"},
        {0x3f818000u, 0x3f82, "tie, odd below: up to even"},
        {0xbf818000u, 0xbf82, "negative tie: up in magnitude to even"},
        {0x3fffffffu, 0x4000, "carry into the exponent"},
        {0x00000000u, 0x0000, "+0"},
        {0x80000000u, 0x8000, "-0"},
        {0x00000001u, 0x0000, "smallest subnormal: down"},
        {0x00008000u, 0x0000, "subnormal tie, even: down"},
        {0x00018000u, 0x0002, "subnormal tie, odd: up"},
        {0x00008001u, 0x0001, "subnormal above half: up"},
        {0x00800000u, 0x0080, "smallest normal"},
        {0x7f7f7fffu, 0x7f7f, "largest bf16"},
        {0x7f7f8000u, 0x7f80, "tie above the largest: infinity (IEEE)"},
        {0x7f7fffffu, 0x7f80, "FLT_MAX: infinity (IEEE)"},
        {0xff7fffffu, 0xff80, "-FLT_MAX: -infinity"},
        {0x7f800000u, 0x7f80, "+infinity"},
        {0xff800000u, 0xff80, "-infinity"},
        {0x7fc00000u, 0x7fc0, "quiet NaN"},
        {0x7f800001u, 0x7fc0, "signalling NaN, low payload: quiet, not infinity"},
        {0xff800001u, 0xffc0, "negative signalling NaN"},
        {0x7fa00000u, 0x7fe0, "NaN: top payload bits kept"},
        {0x7fffffffu, 0x7fff, "NaN, all ones: no carry"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint16_t got = dt_bf16_from_f32(f_of(cases[i].in));
        CHECK_MSG(got == cases[i].want, "bf16 of 0x%08x (%s): 0x%04x, want 0x%04x", cases[i].in, cases[i].what, got,
                  cases[i].want);
    }
    /* Unpacking is exact: the bits move up. */
    CHECK(u_of(dt_f32_from_bf16(0x3f82)) == 0x3f820000u);
    CHECK(u_of(dt_f32_from_bf16(0xff80)) == 0xff800000u);
    CHECK(isnan(dt_f32_from_bf16(0x7fc1)));
}

static void test_fp16_bits(void) {
    static const bits_case cases[] = {
        {0x3f800000u, 0x3c00, "1"},
        {0x3f801000u, 0x3c00, "1 + 2^-11: tie, even below: down"},
        {0x3f803000u, 0x3c02, "1 + 3 * 2^-11: tie, odd below: up to even"},
        {0x3f801001u, 0x3c01, "above half: up"},
        {0x3dcccccdu, 0x2e66, "0.1"},
        {0xc0490fdbu, 0xc248, "-pi"},
        {0x477fe000u, 0x7bff, "65504, the largest"},
        {0x477fefffu, 0x7bff, "just below 65520: rounds to 65504"},
        {0x477ff000u, 0x7bff, "65520 (IEEE: infinity): saturates"},
        {0x49742400u, 0x7bff, "1e6: saturates"},
        {0xc9742400u, 0xfbff, "-1e6: saturates"},
        {0x7f7fffffu, 0x7bff, "FLT_MAX: saturates"},
        {0x7f800000u, 0x7c00, "+infinity stays"},
        {0xff800000u, 0xfc00, "-infinity stays"},
        {0x7fc00000u, 0x7e00, "quiet NaN"},
        {0x7f800001u, 0x7e00, "signalling NaN: quiet, not infinity"},
        {0x7fa00000u, 0x7f00, "NaN: top payload bits kept"},
        {0xffc00000u, 0xfe00, "negative NaN"},
        {0x38800000u, 0x0400, "2^-14, the smallest normal"},
        {0x387fffffu, 0x0400, "just below 2^-14: rounds up to the smallest normal"},
        {0x38000000u, 0x0200, "2^-15: subnormal"},
        {0x33800000u, 0x0001, "2^-24, the smallest subnormal"},
        {0x33000000u, 0x0000, "2^-25: tie, even: 0"},
        {0x33000001u, 0x0001, "just above 2^-25: the smallest subnormal"},
        {0x33c00000u, 0x0002, "1.5 * 2^-24: tie, odd below: up to 2"},
        {0x34200000u, 0x0002, "2.5 * 2^-24: tie, even below: down to 2"},
        {0xb3c00000u, 0x8002, "-1.5 * 2^-24"},
        {0x32ffffffu, 0x0000, "below 2^-25: 0"},
        {0x00000001u, 0x0000, "float32 subnormal: 0"},
        {0x80000000u, 0x8000, "-0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint16_t got = dt_fp16_from_f32(f_of(cases[i].in));
        CHECK_MSG(got == cases[i].want, "fp16 of 0x%08x (%s): 0x%04x, want 0x%04x", cases[i].in, cases[i].what, got,
                  cases[i].want);
    }
    CHECK(dt_f32_from_fp16(0x0001) == 0x1p-24f);
    CHECK(dt_f32_from_fp16(0x03ff) == 1023 * 0x1p-24f);
    CHECK(dt_f32_from_fp16(0x0400) == 0x1p-14f);
    CHECK(dt_f32_from_fp16(0x7bff) == 65504.0f);
    CHECK(dt_f32_from_fp16(0xfbff) == -65504.0f);
    CHECK(u_of(dt_f32_from_fp16(0x8000)) == 0x80000000u);
    CHECK(u_of(dt_f32_from_fp16(0xfc00)) == 0xff800000u);
    CHECK(u_of(dt_f32_from_fp16(0x7e00)) == 0x7fc00000u);
    CHECK(isnan(dt_f32_from_fp16(0x7c01)));
}

/* fp16's value of h by arithmetic (not the code under test). */
static double fp16_value(uint16_t h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return h & 0x8000 ? -v : v;
}

/* The nearest fp16 to a finite x by search over the 31744 finite magnitudes, ties to the even
 * pattern; beyond 65504 saturated, as the packer does. */
static uint16_t fp16_reference(float x) {
    double a = fabs((double)x);
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    if (a >= 65520.0) return sign | 0x7bff;
    int lo = 0, hi = 0x7bff;
    while (hi - lo > 1) { /* fp16_value is increasing in the pattern for non-negative ones */
        int mid = (lo + hi) / 2;
        if (fp16_value((uint16_t)mid) <= a) lo = mid;
        else hi = mid;
    }
    if (fp16_value((uint16_t)hi) <= a) lo = hi;
    double dl = a - fp16_value((uint16_t)lo), dh = lo < 0x7bff ? fp16_value((uint16_t)(lo + 1)) - a : INFINITY;
    uint16_t h = (uint16_t)(dl < dh ? lo : dh < dl ? lo + 1 : (lo & 1 ? lo + 1 : lo));
    return sign | h;
}

/* The nearest bf16 to a finite x: the truncation or the next pattern up, ties to even; IEEE
 * overflow to infinity. */
static uint16_t bf16_reference(float x) {
    uint32_t u = u_of(x);
    uint16_t t = (uint16_t)(u >> 16);
    double a = fabs((double)x), lo = fabs((double)f_of((uint32_t)t << 16));
    double hi = (t & 0x7fff) == 0x7f7f ? ldexp(1.0, 128) : fabs((double)f_of((uint32_t)(t + 1) << 16));
    if (a - lo < hi - a || (a - lo == hi - a && !(t & 1))) return t;
    return (uint16_t)(t + 1);
}

/* A sweep of float32 patterns (a stride over all 2^32, plus every low-bit pattern around
 * fp16's and bf16's rounding points), each against the references. */
static void test_against_reference(void) {
    int bad16 = 0, badbf = 0;
    size_t tried = 0;
    for (uint64_t v = 0; v < (UINT64_C(1) << 32); v += 4099) {
        for (int low = 0; low < 3; low++) {
            uint32_t u = (uint32_t)v ^ (low == 1 ? 0x1000u : low == 2 ? 0x0fffu : 0); /* near the rounding points */
            float x = f_of(u);
            if (!isfinite(x)) continue;
            tried++;
            uint16_t got = dt_fp16_from_f32(x), want = fp16_reference(x);
            if (got != want && bad16++ < 5) fprintf(stderr, "  fp16 0x%08x: 0x%04x, want 0x%04x\n", u, got, want);
            got = dt_bf16_from_f32(x), want = bf16_reference(x);
            if (got != want && badbf++ < 5) fprintf(stderr, "  bf16 0x%08x: 0x%04x, want 0x%04x\n", u, got, want);
        }
    }
    CHECK(tried > 2000000);
    CHECK(bad16 == 0);
    CHECK(badbf == 0);
    /* Every fp16 value unpacks to its value and packs back to itself (NaN: made quiet). */
    int round = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dt_f32_from_fp16((uint16_t)h);
        int nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (!nan && (double)f != ((h & 0x7fff) == 0x7c00 ? (h & 0x8000 ? -INFINITY : INFINITY) : fp16_value((uint16_t)h)))
            round++;
        uint16_t back = dt_fp16_from_f32(f);
        if (back != (nan ? (uint16_t)(h | 0x200) : (uint16_t)h)) round++;
        /* bf16: every pattern survives the trip through float32 (NaN made quiet) */
        uint16_t b = dt_bf16_from_f32(dt_f32_from_bf16((uint16_t)h));
        int bnan = (h & 0x7f80) == 0x7f80 && (h & 0x7f);
        if (b != (bnan ? (uint16_t)(h | 0x40) : (uint16_t)h)) round++;
    }
    CHECK(round == 0);
}

/* The bulk loops agree with the one-value functions, at any length and alignment, and count the
 * saturated values. */
static void test_bulk_unaligned(void) {
    enum { N = 1000 };
    static float x[N], back[N];
    static unsigned char raw[2 * N + 1];
    for (int i = 0; i < N; i++) x[i] = (float)((i * 7919) % 2001 - 1000) * (i % 5 == 0 ? 100.0f : 0.013f);
    x[3] = NAN, x[4] = -INFINITY, x[5] = 1e30f;
    const unsigned encs[] = {DT_ENC_BF16, DT_ENC_FP16};
    for (int k = 0; k < 2; k++) {
        for (int len = 0; len <= N; len += len < 40 ? 1 : 97) {
            size_t sat = dt_pack(encs[k], raw + 1, x, (size_t)len); /* odd address */
            size_t want_sat = 0;
            int bad = 0;
            for (int i = 0; i < len; i++) {
                uint16_t h;
                memcpy(&h, raw + 1 + 2 * i, 2);
                uint16_t one = encs[k] == DT_ENC_BF16 ? dt_bf16_from_f32(x[i]) : dt_fp16_from_f32(x[i]);
                bad += h != one;
                want_sat += encs[k] == DT_ENC_FP16 && isfinite(x[i]) && fabsf(x[i]) >= 65520.0f;
            }
            CHECK_MSG(bad == 0 && sat == want_sat, "%s, %d values: %d differ, %zu saturated (want %zu)",
                      dt_enc_name(encs[k]), len, bad, sat, want_sat);
            dt_unpack(encs[k], back, raw + 1, (size_t)len);
            for (int i = 0; i < len; i++) {
                uint16_t h;
                memcpy(&h, raw + 1 + 2 * i, 2);
                float one = encs[k] == DT_ENC_BF16 ? dt_f32_from_bf16(h) : dt_f32_from_fp16(h);
                bad += memcmp(&back[i], &one, 4) != 0;
            }
            CHECK_MSG(bad == 0, "%s unpack, %d values", dt_enc_name(encs[k]), len);
        }
    }
    CHECK(dt_pack(DT_ENC_FP16, raw, x, N) > 0); /* x[5] and the large ones */
    /* float32 is a copy */
    dt_pack(DT_ENC_FP32, back, x, N);
    CHECK(memcmp(back, x, sizeof x) == 0);
    CHECK(dt_enc_size(DT_ENC_FP32) == 4 && dt_enc_size(DT_ENC_BF16) == 2 && dt_enc_size(DT_ENC_FP16) == 2 &&
          dt_enc_size(3) == 0);
    dt_encoding e;
    dt_error err = {0};
    CHECK(dt_enc_parse("bf16", &e, &err) == DT_OK && e == DT_ENC_BF16);
    CHECK(dt_enc_parse("fp16", &e, &err) == DT_OK && e == DT_ENC_FP16);
    CHECK(dt_enc_parse("none", &e, &err) == DT_OK && e == DT_ENC_FP32);
    CHECK(dt_enc_parse(NULL, &e, &err) == DT_OK && e == DT_ENC_FP32);
    CHECK(dt_enc_parse("fp8", &e, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "--compression");
    CHECK_CONTAINS(err.msg, "fp8");
}

/* The unit of the encoding's last place at |v| (half of it is the largest rounding error). */
static double ulp_at(unsigned enc, double v) {
    int e;
    frexp(fabs(v), &e); /* |v| in [2^(e-1), 2^e) */
    if (enc == DT_ENC_BF16) return ldexp(1.0, e - 1 - 7);
    return e - 1 < -14 ? 0x1p-24 : ldexp(1.0, e - 1 - 10);
}

/* Error feedback: over many steps, sum(sent) = sum(g) - e_final up to float32 rounding of g + e,
 * and |e| stays within half a unit in the last place of g + e: nothing is lost. The same gradients
 * sent without feedback drift by many units. */
static void check_feedback(unsigned enc) {
    enum { N = 257, T = 2000 };
    static float g[N], e[N], v[N], sent[N];
    static double sum_g[N], sum_sent[N];
    static uint16_t wire[N];
    const double bias = 0.4 * ldexp(1.0, enc == DT_ENC_BF16 ? -7 : -10); /* 0.4 units at 1: rounded away */
    memset(e, 0, sizeof e);
    memset(sum_g, 0, sizeof sum_g);
    memset(sum_sent, 0, sizeof sum_sent);
    int big_residual = 0;
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < N; i++) {
            double scale = ldexp(1.0, (i % 24) - 20); /* 2^-20 .. 2^3: fp16 subnormals included */
            g[i] = (float)(scale * (1.0 + bias + 0.25 * sin(0.37 * t + i)));
            v[i] = g[i] + e[i];
        }
        dt_pack_ef(enc, wire, e, g, e, N); /* in place */
        dt_unpack(enc, sent, wire, N);
        for (int i = 0; i < N; i++) {
            sum_g[i] += g[i];
            sum_sent[i] += sent[i];
            big_residual += fabs(e[i]) > ulp_at(enc, v[i]) / 2;
        }
    }
    int off = 0;
    for (int i = 0; i < N; i++) {
        double mean = sum_g[i] / T, tol = T * mean * 0x1p-23;
        /* what is still owed is the residual, and it is within a unit */
        off += fabs(sum_g[i] - sum_sent[i] - e[i]) > tol || fabs(sum_g[i] - sum_sent[i]) > ulp_at(enc, mean) + tol;
    }
    double drift = 0;
    for (int i = 0; i < N; i++) {
        float x = (float)(ldexp(1.0, (i % 24) - 20) * (1.0 + bias)), y;
        uint16_t h;
        dt_pack(enc, &h, &x, 1);
        dt_unpack(enc, &y, &h, 1);
        drift = fmax(drift, 50.0 * fabs((double)x - y) / ulp_at(enc, x)); /* 50 steps without feedback */
    }
    CHECK_MSG(off == 0, "%s: %d sums off by more than a unit", dt_enc_name(enc), off);
    CHECK_MSG(big_residual == 0, "%s: %d residuals beyond half a unit", dt_enc_name(enc), big_residual);
    CHECK_MSG(drift > 10, "%s: without feedback 50 steps drift %.3g units (expected > 10)", dt_enc_name(enc), drift);
}
static void test_feedback_bf16(void) { check_feedback(DT_ENC_BF16); }
static void test_feedback_fp16(void) { check_feedback(DT_ENC_FP16); }

/* fp16: a gradient beyond the range saturates and the remainder follows in later steps; a NaN or
 * infinity goes out as it is and leaves no residual. */
static void test_feedback_saturation_and_nonfinite(void) {
    float g[3] = {100000.0f, NAN, INFINITY}, e[3] = {0, 0.5f, 0.25f}, out[3];
    uint16_t w[3];
    CHECK(dt_pack_ef(DT_ENC_FP16, w, e, g, e, 3) == 1);
    CHECK(w[0] == 0x7bff && (w[1] & 0x7e00) == 0x7e00 && w[2] == 0x7c00);
    CHECK(e[0] == 100000.0f - 65504.0f && e[1] == 0 && e[2] == 0);
    float zero[3] = {0, 0, 0};
    dt_pack_ef(DT_ENC_FP16, w, e, zero, e, 3);
    dt_unpack(DT_ENC_FP16, out, w, 3);
    CHECK(out[0] == 34496.0f && e[0] == 0); /* 65504 + 34496 = 100000: all of it, one step later */
    CHECK(out[1] == 0 && out[2] == 0);
    /* bf16: FLT_MAX rounds to infinity (IEEE), sent as such, no residual */
    float big = FLT_MAX, eb = 0;
    uint16_t wb;
    dt_pack_ef(DT_ENC_BF16, &wb, &eb, &big, &eb, 1);
    CHECK(wb == 0x7f80 && eb == 0);
}

/* The worker's codec: the residual advances only for a chunk the ps accepted; a stale or
 * unanswered push leaves it, and a new cut keeps it. (Which reply settles which push, and that a
 * pull's reply or a duplicate settles nothing, is the exchange core's: tests/test_exchange.c.) */
static void test_codec_settles_per_chunk(void) {
    enum { N = 10 };
    size_t sizes[1] = {N};
    dt_codec *c = NULL;
    dt_error err = {0};
    CHECK(dt_codec_open(&c, DT_ENC_FP32, 1, sizes, &err) == DT_EINVAL);
    CHECK(dt_codec_open(&c, DT_ENC_BF16, 1, sizes, &err) == DT_OK);
    if (!c) return;
    float g[N], r[N];
    for (int i = 0; i < N; i++) g[i] = 1.0f + 0x1p-10f; /* bf16 keeps 1, owes 2^-10 */
    size_t bytes;
    /* two chunks of 5: [0,5) and [5,10) */
    CHECK(dt_codec_encode(c, 0, 2, 0, g, &bytes) != NULL && bytes == 10);
    dt_codec_encode(c, 0, 2, 1, g, &bytes);
    dt_codec_residual(c, 0, r);
    CHECK(r[0] == 0 && r[9] == 0); /* not before the replies */
    dt_codec_settle(c, 0, 0, 1); /* chunk 0 accepted */
    dt_codec_settle(c, 0, 1, 0); /* chunk 1 stale */
    dt_codec_residual(c, 0, r);
    CHECK(r[0] == 0x1p-10f && r[4] == 0x1p-10f && r[5] == 0 && r[9] == 0);
    /* Chunk 0 encoded again and its push lost (no reply): the residual stays. */
    dt_codec_encode(c, 0, 2, 0, g, &bytes);
    dt_codec_residual(c, 0, r);
    CHECK(r[0] == 0x1p-10f);
    /* A new cut (one chunk) keeps each value's residual. */
    const unsigned char *w = dt_codec_encode(c, 0, 1, 0, g, &bytes);
    CHECK(bytes == 20);
    uint16_t h0, h9;
    memcpy(&h0, w, 2), memcpy(&h9, w + 18, 2);
    CHECK(dt_f32_from_bf16(h0) == 1.0f && dt_f32_from_bf16(h9) == 1.0f); /* 1 + 2^-9 still rounds to 1 */
    dt_codec_settle(c, 0, 0, 1);
    dt_codec_residual(c, 0, r);
    CHECK(r[0] == 0x1p-9f && r[9] == 0x1p-10f);
    CHECK(dt_codec_saturated(c) == 0);
    dt_codec_free(c);
}

int main(void) {
    RUN(test_bf16_bits);
    RUN(test_fp16_bits);
    RUN(test_against_reference);
    RUN(test_bulk_unaligned);
    RUN(test_feedback_bf16);
    RUN(test_feedback_fp16);
    RUN(test_feedback_saturation_and_nonfinite);
    RUN(test_codec_settles_per_chunk);
    return test_summary();
}
