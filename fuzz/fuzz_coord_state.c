/* libFuzzer target for the work coordinator's state (src/ps/coord_state.c, docs/elastic.md): bytes
 * from a checkpoint file or a WORK_STATE message. A state that loads is canonical: saved again it
 * gives the same bytes (a version 1 state: but its magic, as version 2 writes it). The loaded
 * coordinator then grants, takes claims and settles them, and its counts stay consistent; a
 * gradient dropped takes the unit from its worker. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ps/coord.h"
#include "transport/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dt_coord *c = NULL;
    dt_error err;
    if (dt_coord_load(&c, data, size, NULL, &err) != DT_OK) {
        if (c) __builtin_trap();
        return 0;
    }
    size_t n = dt_coord_state_size(c);
    if (n != size || n > DT_COORD_MAX_STATE_BYTES) __builtin_trap();
    uint8_t *again = malloc(n);
    if (!again) __builtin_trap();
    dt_coord_save(c, again);
    if (memcmp(again, "DTCOORD2", 8) != 0 || memcmp(again + 8, data + 8, n - 8) != 0) __builtin_trap();
    free(again);
    char why[256];
    dt_coord_grant g;
    dt_coord_stats st;
    dt_coord_get_stats(c, &st);
    uint32_t before = st.done;
    if (dt_coord_ask(c, 0, 1, 0, 0, &g, why, sizeof why) == DT_WIRE_OK) {
        if (g.unit >= st.units || !g.mask || g.epoch != st.epoch) __builtin_trap();
        uint64_t first;
        uint32_t count;
        dt_coord_unit_batches(c, g.unit, &first, &count);
        int64_t step = 0;
        for (uint32_t k = 0; k < count; k++) {
            if (!(g.mask >> k & 1)) continue;
            if (dt_coord_claim(c, 0, 0, g.epoch, first + k, step, 0, why, sizeof why) != DT_WIRE_OK) __builtin_trap();
            uint16_t w = 0;
            dt_coord_applied(c, step++, &w, 1);
        }
        dt_coord_get_stats(c, &st);
        if (st.epoch == g.epoch && st.done != before + 1) __builtin_trap();
        /* A step applied without worker 1's gradient: its claim is voided and its unit taken back,
         * not granted to it again while worker 0 is a member. */
        if (st.epoch == g.epoch && dt_coord_ask(c, 1, 0, 0, 0, &g, why, sizeof why) == DT_WIRE_OK) {
            dt_coord_unit_batches(c, g.unit, &first, &count);
            uint64_t b = first + (uint64_t)__builtin_ctzll(g.mask);
            if (dt_coord_claim(c, 1, 0, g.epoch, b, step, 0, why, sizeof why) != DT_WIRE_OK) __builtin_trap();
            dt_coord_applied(c, step, NULL, 0);
            dt_coord_get_stats(c, &st);
            dt_coord_grant h;
            if (st.dropped != 1 || (dt_coord_ask(c, 1, 0, 0, 0, &h, why, sizeof why) == DT_WIRE_OK && h.unit == g.unit))
                __builtin_trap();
        }
    }
    dt_coord_free(c);
    return 0;
}
