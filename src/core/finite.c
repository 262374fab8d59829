#include "core/finite.h"

#include <stdint.h>
#include <string.h>

#define BLOCK 4096 /* floats per pass: after a hit, the search for its index stays in cache */
#define EXP_ALL_ONES 0x7f800000u /* a float is NaN or infinite iff |bits| >= this */

static uint32_t magnitude_bits(const unsigned char *b, size_t i) {
    uint32_t u;
    memcpy(&u, b + i * sizeof u, sizeof u); /* compiles to one (unaligned) load */
    return u & 0x7fffffffu;
}

/* The largest magnitude among k floats: an integer max, which vectorises (a float compare
 * reduction would not, without -ffast-math). */
static uint32_t top_bits(const unsigned char *b, size_t k) {
    uint32_t top = 0;
    for (size_t i = 0; i < k; i++) {
        uint32_t u = magnitude_bits(b, i);
        top = u > top ? u : top;
    }
    return top;
}

size_t dt_first_nonfinite(const void *x, size_t n) {
    const unsigned char *b = x;
    for (size_t start = 0; start < n; start += BLOCK) {
        size_t k = n - start < BLOCK ? n - start : BLOCK;
        const unsigned char *blk = b + start * sizeof(float);
        /* A constant trip count for whole blocks: GCC's -O2 vectorises only loops that need no
         * scalar remainder. */
        uint32_t top = k == BLOCK ? top_bits(blk, BLOCK) : top_bits(blk, k);
        if (top < EXP_ALL_ONES) continue;
        for (size_t i = 0; i < k; i++)
            if (magnitude_bits(blk, i) >= EXP_ALL_ONES) return start + i;
    }
    return n;
}
