#include "core/rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t dt_hash64(uint64_t seed, uint64_t counter) {
    uint64_t x = seed ^ (counter * 0xd1342543de82ef95ULL);
    return splitmix64(&x);
}

void dt_rng_seed(dt_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t dt_rng_next(dt_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float dt_rng_uniform(dt_rng *r) { return (float)(dt_rng_next(r) >> 40) * (1.0f / 16777216.0f); }

uint64_t dt_rng_below(dt_rng *r, uint64_t n) {
    /* Rejection sampling removes modulo bias. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = dt_rng_next(r);
    while (x >= limit);
    return x % n;
}

double dt_rng_normal(dt_rng *r) {
    double u1 = ((double)(dt_rng_next(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0); /* (0, 1] */
    double u2 = (double)(dt_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

float dt_rng_truncated_normal(dt_rng *r, float stddev) {
    double z;
    do z = dt_rng_normal(r);
    while (z < -2.0 || z > 2.0);
    return (float)(z * stddev);
}

void dt_shuffle_u32(uint32_t *idx, uint32_t n, uint64_t seed) {
    dt_rng r;
    dt_rng_seed(&r, seed);
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = (uint32_t)dt_rng_below(&r, i);
        uint32_t t = idx[i - 1];
        idx[i - 1] = idx[j];
        idx[j] = t;
    }
}
