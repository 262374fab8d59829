/* libFuzzer target for the wire decoder: the first bytes are a header frame, the rest its payload.
 * Input: [1 byte: selector][header frame][payload...]; the selector picks the receiver's shard size
 * and, with its high bit, a header frame length other than DT_WIRE_HEADER_SIZE. Every decoded
 * header is re-encoded and must decode to the same fields; the payload bound must hold before
 * the payload is touched (fuzz_sparse.c goes on into the sparse messages' payloads). A PUSH or
 * PARAMS payload that passes is unpacked from its encoding (as the ps and the client do) and
 * packed again: every 16-bit value survives the trip, NaN made quiet.
 * An INIT that passes has its options block decoded as the ps does; one that decodes is encoded
 * again to the same bytes. A WORK_STATE's payload is loaded as ps 0 would (fuzz_coord_state.c
 * fuzzes that loader on its own). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ps/coord.h"
#include "transport/compress.h"
#include "transport/wire.h"

/* Unpacks a 16-bit payload and packs it back: the same bits, but for NaN, which comes back quiet. */
static void unpack_repack(uint8_t enc, const uint8_t *p, size_t bytes) {
    size_t n = bytes / 2;
    float *f = malloc(n ? n * sizeof(float) : 1);
    uint16_t *back = malloc(n ? n * sizeof(uint16_t) : 1);
    if (!f || !back) __builtin_trap();
    dt_unpack(enc, f, p, n);
    dt_pack(enc, back, f, n);
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        uint16_t exp = enc == DT_ENC_BF16 ? 0x7f80 : 0x7c00, quiet = enc == DT_ENC_BF16 ? 0x40 : 0x200;
        int nan = (h & exp) == exp && (h & (uint16_t)~(exp | 0x8000));
        if (back[i] != (nan ? (uint16_t)(h | quiet) : h)) __builtin_trap();
    }
    free(f);
    free(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const uint64_t shards[4] = {0, 1, 1000, DT_WIRE_MAX_SHARD_FLOATS};
    uint64_t shard = shards[data[0] & 3];
    data++, size--;
    size_t head = DT_WIRE_HEADER_SIZE;
    if (data[-1] & 0x80) head = (size_t)((data[-1] >> 2) & 0x1f) * 4; /* 0..124 */
    if (head > size) head = size;
    dt_wire_header h;
    dt_error err;
    (void)dt_wire_peek_request_id(data, head);
    if (dt_wire_decode(&h, data, head, &err) != DT_OK) return 0;
    uint8_t again[DT_WIRE_HEADER_SIZE];
    dt_wire_encode(again, &h);
    if (memcmp(again, data, DT_WIRE_HEADER_SIZE) != 0) __builtin_trap(); /* decode is exact */
    size_t payload = size - head;
    if (h.payload_bytes != payload) return 0; /* dt_wire_recv refuses a size mismatch */
    if (dt_wire_check_payload(&h, shard, &err) != DT_OK) return 0;
    if (h.type == DT_MSG_ERROR) {
        char text[DT_WIRE_MAX_ERROR_TEXT + 1];
        dt_wire_error_text(text, sizeof text, data + head, payload);
        if (strlen(text) > DT_WIRE_MAX_ERROR_TEXT) __builtin_trap();
    } else if (h.type == DT_MSG_WORK_STATE) {
        if (payload > DT_WIRE_MAX_WORK_STATE) __builtin_trap();
        dt_coord *c = NULL; /* as ps 0 installs it: the loader checks it whole */
        if (payload && dt_coord_load(&c, data + head, payload, NULL, &err) == DT_OK) dt_coord_free(c);
    } else if (payload > dt_wire_max_frame(shard)) {
        __builtin_trap(); /* a payload beyond the largest legal one (an INIT, or a sparse message) passed the check */
    } else if (h.type == DT_MSG_INIT) {
        const uint8_t *o = data + head + (size_t)(1 + h.opt_slots) * shard * 4;
        dt_lr_schedule s;
        float wd;
        if (dt_wire_opts_decode(&s, &wd, o, DT_WIRE_OPTS_BYTES, &err) == DT_OK) {
            uint8_t back[DT_WIRE_OPTS_BYTES];
            dt_wire_opts_encode(back, &s, wd);
            if (memcmp(back, o, sizeof back) != 0) __builtin_trap();
            (void)dt_lr_at(&s, 1.0f, (int64_t)(o[5] | o[9] << 8) * 1000); /* any step: no trap */
        }
    } else if ((h.type == DT_MSG_PUSH || h.type == DT_MSG_PARAMS) && h.encoding != DT_ENC_FP32) {
        if (payload % 2) __builtin_trap(); /* 16-bit values: an even size */
        unpack_repack(h.encoding, data + head, payload);
    }
    return 0;
}
