/* Deterministic random numbers. Everything random in dtrain (initialisers, shuffles, dropout) derives
 * from an explicit 64-bit seed, so runs are reproducible. Counter-based helpers let threads draw
 * reproducible streams without sharing state. */
#ifndef DT_CORE_RNG_H
#define DT_CORE_RNG_H

#include <stdint.h>

typedef struct { uint64_t s[4]; } dt_rng; /* xoshiro256** */

void dt_rng_seed(dt_rng *r, uint64_t seed);
uint64_t dt_rng_next(dt_rng *r);
/* Uniform in [0, 1) with 24 bits of precision. */
float dt_rng_uniform(dt_rng *r);
/* Uniform integer in [0, n), unbiased. n > 0. */
uint64_t dt_rng_below(dt_rng *r, uint64_t n);
/* Standard normal (Box-Muller, float64 internally). */
double dt_rng_normal(dt_rng *r);
/* Normal(0, stddev) redrawn until within 2 stddev (TensorFlow's truncated_normal). */
float dt_rng_truncated_normal(dt_rng *r, float stddev);
/* Stateless mix of (seed, counter): a well-spread 64-bit value (splitmix64 finaliser). */
uint64_t dt_hash64(uint64_t seed, uint64_t counter);
/* Fisher-Yates shuffle of idx[0..n) with a stream seeded from seed. */
void dt_shuffle_u32(uint32_t *idx, uint32_t n, uint64_t seed);

#endif
