/* 16-bit encodings of float32 on the wire (docs/protocol.md, "Encodings"): `--compression bf16|fp16`
 * halves the bytes of every PUSH and PARAMS payload.
 *
 * bf16 is the upper 16 bits of a float32, rounded to nearest, ties to even: the same range as
 * float32, 8 bits of precision. NaN stays NaN (made quiet, sign and top payload bits kept) and
 * infinities stay; a finite value beyond bf16's largest (3.3895e38) rounds to infinity, as IEEE
 * rounding says (and as PyTorch does).
 *
 * fp16 is IEEE binary16, rounded to nearest, ties to even, subnormals included (down to 2^-24;
 * below 2^-25 a value is 0): 11 bits of precision but a range of only +-65504. A finite value
 * beyond it saturates to +-65504 instead of becoming infinite, and the pack reports how many did:
 * a gradient sent with error feedback carries the remainder over to later steps (nothing is lost);
 * a parameter has no such remainder, so the ps refuses to send parameters that do not fit.
 *
 * Error feedback (Seide et al. 2014, Karimireddy et al. 2019): the sender keeps e, one float per
 * value, sends c = Q(g + e) and keeps e' = (g + e) - c, so what was rounded away is sent later and
 * the sum of what was sent tracks the sum of the true values to within one rounding unit. A
 * non-finite g + e is sent as it is (the receiver sees the NaN or infinity, as without
 * compression) and leaves e' = 0, so one bad value cannot poison the later steps.
 *
 * Every loop is one pass of integer and float operations without branches, so the compiler
 * vectorises it; none depends on the floating-point environment (rounding mode, flush to zero).
 * Packed data is little-endian, like the rest of the wire; it may be unaligned (a frame as libzmq
 * received it). */
#ifndef DT_TRANSPORT_COMPRESS_H
#define DT_TRANSPORT_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain.h"

/* The encoding of a message's floats; the values are what the wire carries (wire.h). */
typedef enum { DT_ENC_FP32 = 0, DT_ENC_BF16 = 1, DT_ENC_FP16 = 2 } dt_encoding;
#define DT_ENC_COUNT 3

#define DT_FP16_MAX 65504.0f

/* Bytes per value: 4, 2, 2 (0 for a value outside the enum). */
size_t dt_enc_size(unsigned enc);
/* "none" (float32), "bf16", "fp16"; "unknown" otherwise. */
const char *dt_enc_name(unsigned enc);
/* The --compression flag: "none", "bf16" or "fp16" (NULL or "": none). DT_EINVAL naming the flag
 * otherwise. */
int dt_enc_parse(const char *text, dt_encoding *out, dt_error *err);

/* One value. */
uint16_t dt_bf16_from_f32(float x);
float dt_f32_from_bf16(uint16_t h);
uint16_t dt_fp16_from_f32(float x); /* saturates finite values beyond +-65504 */
float dt_f32_from_fp16(uint16_t h);

/* n floats into n values of encoding enc at out (fp32: a copy). Returns how many finite values
 * saturated (fp16 only; always 0 otherwise). */
size_t dt_pack(unsigned enc, void *out, const float *in, size_t n);

/* n values of encoding enc at in into n floats (exact: every 16-bit value is a float32). */
void dt_unpack(unsigned enc, float *out, const void *in, size_t n);

/* Error feedback, fused into one pass: v = g + e; out = Q(v) in encoding enc (bf16 or fp16);
 * e_next = v - unpack(out), or 0 where that is not finite. e_next may be e (in place). Returns how
 * many finite values saturated (fp16). enc must not be fp32 (nothing to feed back: out = g, e_next = 0). */
size_t dt_pack_ef(unsigned enc, void *out, float *e_next, const float *g, const float *e, size_t n);

#endif
