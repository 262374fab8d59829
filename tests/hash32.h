/* The fixtures' 32-bit integer hash (lowbias32, Chris Wellons): the C tests and the Python scripts
 * that write their fixtures (tests/fixtures/gen_*.py) draw the same cases from it. */
#ifndef DT_TESTS_HASH32_H
#define DT_TESTS_HASH32_H

#include <stdint.h>

static inline uint32_t h32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    return x;
}

#endif
