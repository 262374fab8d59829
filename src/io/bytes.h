/* Little-endian integers and floats in byte buffers, for every format dtrain writes (wire header,
 * event records, safetensors): explicit bytes, so a file or message reads the same on any host. */
#ifndef DT_IO_BYTES_H
#define DT_IO_BYTES_H

#include <stdint.h>
#include <string.h>

static inline void dt_put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void dt_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void dt_put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void dt_put_f32(uint8_t *p, float f) {
    uint32_t v;
    memcpy(&v, &f, 4);
    dt_put_u32(p, v);
}
static inline uint16_t dt_get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t dt_get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t dt_get_u64(const uint8_t *p) {
    return (uint64_t)dt_get_u32(p) | (uint64_t)dt_get_u32(p + 4) << 32;
}
static inline float dt_get_f32(const uint8_t *p) {
    uint32_t v = dt_get_u32(p);
    float f;
    memcpy(&f, &v, 4);
    return f;
}

#endif
