/* libFuzzer target: bytes as a stream into the own transport's frame reader (transport/frame.h),
 * fed in splits the input chooses (its first byte seeds them), with a budget of a few KiB so that
 * muting, taking and releasing interleave. The reader must never allocate a payload past its
 * largest frame or count past its budget, must hand over whole messages whose payload has exactly
 * the announced size, and must give every count back. */
#include <stddef.h>
#include <stdint.h>

#include "transport/frame.h"

#define MAX_FRAME 4096u
#define LIMIT 6000u /* more than one largest payload with its holder: muted only while one is held */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint32_t seed = data[0] * 2654435761u + 1;
    data++, size--;
    dt_budget b;
    dt_budget_init(&b, LIMIT);
    dt_account *a = dt_account_new(&b, 3000);
    if (!a) return 0;
    dt_frame_reader r;
    dt_frame_init(&r, a, MAX_FRAME);
    dt_bytes held = {0};
    for (size_t off = 0; off < size;) {
        seed = seed * 1103515245u + 12345u;
        size_t piece = 1 + (seed >> 16) % 300, used = 0;
        if (piece > size - off) piece = size - off;
        dt_error e = {0};
        int rc = dt_frame_feed(&r, data + off, piece, &used, &e);
        off += used;
        if (atomic_load(&b.held) > LIMIT || dt_frame_partial(&r) > MAX_FRAME + 64) __builtin_trap();
        if (rc < 0) {
            if (e.msg[0] == '\0') __builtin_trap(); /* every refusal says why */
            break;
        }
        if (rc == DT_FRAME_WHOLE) {
            dt_wire_header h;
            dt_bytes p;
            dt_frame_take(&r, &h, &p);
            if (p.size != h.payload_bytes || p.size > MAX_FRAME) __builtin_trap();
            dt_bytes_release(&held);
            held = p; /* kept until the next one: a count outstanding while reading on */
        } else if (rc == DT_FRAME_MUTED) {
            /* Muted only while a count is out: a payload is waiting for its buffer, never half read. */
            if (dt_frame_partial(&r) != 0 || held.size == 0) __builtin_trap();
            dt_bytes_release(&held);
            if (atomic_load(&b.held) != 0 || dt_frame_feed(&r, data + off, 0, &used, &e) == DT_FRAME_MUTED)
                __builtin_trap(); /* everything given back: reading goes on */
        } else if (used != piece) {
            __builtin_trap(); /* more wanted, yet not all taken */
        }
    }
    dt_bytes_release(&held);
    dt_frame_close(&r);
    dt_account_unref(a);
    if (atomic_load(&b.held) != 0) __builtin_trap();
    return 0;
}
