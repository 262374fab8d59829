/* The id hash of click-log models (model/ctr_batch.h; docs/ctr-data.md gives it in Python). */
#include "model/ctr_batch.h"

uint64_t dt_ctr_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t dt_ctr_hash(uint32_t field, uint64_t id) {
    return dt_ctr_mix64(id ^ dt_ctr_mix64((uint64_t)field ^ 0x4354524841534831ULL));
}

uint64_t dt_ctr_bucket(uint32_t field, uint64_t id, uint64_t buckets) {
    return buckets ? dt_ctr_hash(field, id) % buckets : 0;
}

uint64_t dt_ctr_key(uint32_t field, uint64_t id, uint64_t buckets, int shared) {
    if (buckets) return dt_ctr_hash(field, id) % buckets;
    return shared ? dt_ctr_hash(field, id) : id;
}
