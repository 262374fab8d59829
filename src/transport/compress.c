#include "transport/compress.h"

#include <string.h>

#include "core/error.h"

/* Bits of a float32 and back (memcpy: no aliasing trouble, one move, vectorises). */
static inline uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static inline float float_of(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

#define ABS_MASK 0x7fffffffu
#define F32_INF 0x7f800000u     /* |bits| above: NaN; equal: infinity */
#define FP16_MIN_NORMAL 0x38800000u /* 2^-14 as float32 bits */
#define FP16_OVERFLOW 0x477ff000u   /* 65520: IEEE rounding would give infinity from here on */
#define FP16_MAX_BITS 0x7bffu       /* 65504 */

/* a where cond, else b: a mask rather than a branch, so the loops stay free of control flow and
 * vectorise. */
static inline uint32_t pick(int cond, uint32_t a, uint32_t b) { return b ^ ((a ^ b) & (0u - (uint32_t)cond)); }

/* Rounds to nearest, ties to even: adding 0x7fff plus the lowest kept bit carries into the kept
 * bits exactly when the dropped half is above one half, or is one half and the kept value is odd.
 * A NaN is made quiet instead (the carry could turn it into an infinity). */
static inline uint16_t bf16_of_bits(uint32_t u) {
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u;
    return (uint16_t)pick((u & ABS_MASK) > F32_INF, nan, rounded);
}

/* IEEE binary16 from float32 bits, nearest-even, saturating finite values at +-65504. */
static inline uint16_t fp16_of_bits(uint32_t u) {
    uint32_t sign = (u >> 16) & 0x8000u, a = u & ABS_MASK;
    /* Normal: rebias the exponent (127 - 15 = 112) and round off 13 mantissa bits; a carry out of
     * the mantissa moves into the exponent, as it should. */
    uint32_t normal = (a + 0xfffu + ((a >> 13) & 1u) - (112u << 23)) >> 13;
    /* Subnormal: the value in units of 2^-24 is m / 2^s (m with its implicit bit); the same
     * nearest-even rounding by adding half - 1 and the kept lowest bit. Values below 2^-25 give 0. */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    uint32_t s = pick(e >= 125u, 1u, pick(126u - e > 31u, 31u, 126u - e)); /* 14..24 where it is used */
    uint32_t sub = (m + (1u << (s - 1u)) - 1u + ((m >> s) & 1u)) >> s;
    uint32_t h = pick(a >= FP16_MIN_NORMAL, normal, sub);
    h = pick(a >= FP16_OVERFLOW, FP16_MAX_BITS, h);
    h = pick(a == F32_INF, 0x7c00u, h);
    h = pick(a > F32_INF, 0x7e00u | ((a >> 13) & 0x3ffu), h); /* a quiet NaN, its top payload bits kept */
    return (uint16_t)(sign | h);
}

/* Whether a finite value is beyond fp16's range (it saturates). */
static inline size_t fp16_saturates(uint32_t u) {
    uint32_t a = u & ABS_MASK;
    return (size_t)((a >= FP16_OVERFLOW) & (a < F32_INF));
}

static inline float f32_of_fp16(uint32_t h) {
    uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t normal = ((e + 112u) << 23) | (m << 13);
    uint32_t special = F32_INF | (m << 13); /* infinity, or NaN with its payload */
    uint32_t sub = bits_of((float)m * 0x1p-24f); /* exact: m < 2^10, the product is a normal float32 */
    return float_of(sign | pick(e == 0x1fu, special, pick(e != 0, normal, sub)));
}

static inline uint16_t load16(const unsigned char *p, size_t i) {
    uint16_t h;
    memcpy(&h, p + 2 * i, sizeof h); /* one (unaligned) load; the wire is little-endian, as this host */
    return h;
}
static inline void store16(unsigned char *p, size_t i, uint16_t h) { memcpy(p + 2 * i, &h, sizeof h); }

uint16_t dt_bf16_from_f32(float x) { return bf16_of_bits(bits_of(x)); }
float dt_f32_from_bf16(uint16_t h) { return float_of((uint32_t)h << 16); }
uint16_t dt_fp16_from_f32(float x) { return fp16_of_bits(bits_of(x)); }
float dt_f32_from_fp16(uint16_t h) { return f32_of_fp16(h); }

size_t dt_enc_size(unsigned enc) {
    switch (enc) {
    case DT_ENC_FP32: return 4;
    case DT_ENC_BF16:
    case DT_ENC_FP16: return 2;
    }
    return 0;
}

const char *dt_enc_name(unsigned enc) {
    switch (enc) {
    case DT_ENC_FP32: return "none";
    case DT_ENC_BF16: return "bf16";
    case DT_ENC_FP16: return "fp16";
    }
    return "unknown";
}

int dt_enc_parse(const char *text, dt_encoding *out, dt_error *err) {
    *out = DT_ENC_FP32;
    if (!text || !*text || !strcmp(text, "none")) return DT_OK;
    if (!strcmp(text, "bf16")) *out = DT_ENC_BF16;
    else if (!strcmp(text, "fp16")) *out = DT_ENC_FP16;
    else return dt_errorf(err, DT_EINVAL, "--compression: expected none, bf16 or fp16, got '%s'", text);
    return DT_OK;
}

size_t dt_pack(unsigned enc, void *out, const float *in, size_t n) {
    unsigned char *o = out;
    size_t saturated = 0;
    switch (enc) {
    case DT_ENC_BF16:
        for (size_t i = 0; i < n; i++) store16(o, i, bf16_of_bits(bits_of(in[i])));
        break;
    case DT_ENC_FP16:
        for (size_t i = 0; i < n; i++) {
            uint32_t u = bits_of(in[i]);
            store16(o, i, fp16_of_bits(u));
            saturated += fp16_saturates(u);
        }
        break;
    default: memcpy(out, in, n * sizeof(float)); break;
    }
    return saturated;
}

void dt_unpack(unsigned enc, float *out, const void *in, size_t n) {
    const unsigned char *p = in;
    switch (enc) {
    case DT_ENC_BF16:
        for (size_t i = 0; i < n; i++) out[i] = float_of((uint32_t)load16(p, i) << 16);
        break;
    case DT_ENC_FP16:
        for (size_t i = 0; i < n; i++) out[i] = f32_of_fp16(load16(p, i));
        break;
    default: memcpy(out, in, n * sizeof(float)); break;
    }
}

/* The residual kept for the next step: 0 where it is not finite (a NaN or infinity was sent as it
 * is; carrying it would poison every later step). */
static inline float residual(float v, float sent) {
    float r = v - sent;
    return float_of(pick((bits_of(r) & ABS_MASK) < F32_INF, bits_of(r), 0));
}

size_t dt_pack_ef(unsigned enc, void *out, float *e_next, const float *g, const float *e, size_t n) {
    unsigned char *o = out;
    size_t saturated = 0;
    if (enc == DT_ENC_BF16) {
        for (size_t i = 0; i < n; i++) {
            float v = g[i] + e[i];
            uint16_t c = bf16_of_bits(bits_of(v));
            store16(o, i, c);
            e_next[i] = residual(v, float_of((uint32_t)c << 16));
        }
    } else if (enc == DT_ENC_FP16) {
        for (size_t i = 0; i < n; i++) {
            float v = g[i] + e[i];
            uint32_t u = bits_of(v);
            uint16_t c = fp16_of_bits(u);
            store16(o, i, c);
            saturated += fp16_saturates(u);
            e_next[i] = residual(v, f32_of_fp16(c));
        }
    } else {
        memcpy(out, g, n * sizeof(float));
        memset(e_next, 0, n * sizeof(float));
    }
    return saturated;
}
