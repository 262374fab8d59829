#include "cluster/row_placement.h"

#include "core/rng.h"

int dt_row_ps(uint32_t table, uint64_t id, int n_ps) {
    uint64_t h = dt_hash64(dt_hash64(DT_ROW_PLACE_SEED, table), id);
    return (int)(((unsigned __int128)h * (unsigned)n_ps) >> 64);
}

void dt_row_split(uint32_t table, const uint64_t *ids, size_t n, int n_ps, int *ps_of, size_t *begin, size_t *order) {
    for (int p = 0; p <= n_ps; p++) begin[p] = 0;
    for (size_t i = 0; i < n; i++) {
        ps_of[i] = dt_row_ps(table, ids[i], n_ps);
        begin[ps_of[i] + 1]++;
    }
    for (int p = 0; p < n_ps; p++) begin[p + 1] += begin[p];
    /* A counting sort: begin[p] walks ps p's part, then is moved back. */
    for (size_t i = 0; i < n; i++) order[begin[ps_of[i]]++] = i;
    for (int p = n_ps; p > 0; p--) begin[p] = begin[p - 1];
    begin[0] = 0;
}
