/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as used by TensorFlow's record framing and
 * by dtrain's checkpoint checksum. Check value: dt_crc32c(0, "123456789", 9) == 0xE3069283. */
#ifndef DT_IO_CRC32C_H
#define DT_IO_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 to start) over n bytes: dt_crc32c(dt_crc32c(0, a, na), b, nb) == crc of a||b. */
uint32_t dt_crc32c(uint32_t crc, const void *data, size_t n);

/* TensorFlow's masked CRC, stored in record framing so that a CRC of data containing CRCs is not
 * degenerate: ((crc >> 15) | (crc << 17)) + 0xa282ead8, in 32-bit unsigned arithmetic. */
static inline uint32_t dt_crc32c_mask(uint32_t crc) {
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}
static inline uint32_t dt_crc32c_unmask(uint32_t masked) {
    uint32_t rot = masked - 0xa282ead8u;
    return (rot >> 17) | (rot << 15);
}

#endif
