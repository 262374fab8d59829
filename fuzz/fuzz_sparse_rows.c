/* libFuzzer target for the payload of rows with their optimizer slots (SPARSE_PAGE, SPARSE_IMPORT;
 * docs/protocol.md, "Sparse tables"): dt_wire_rows_check, the chief's check of a ps's page before it
 * writes a row into a checkpoint (ids below the table's rows) and the ps's before it imports one (any
 * id; fuzz_sparse.c goes on into the ps's handling).
 * Input: [1 byte: selector][header frame, 104 bytes][payload...]. The selector picks the table's rows
 * (0: any id, 1, 1000, 2^40). A header that decodes is re-encoded to the same bytes; a payload that
 * passes is exactly the header's size, within the largest sparse frame, and every row read back (from a
 * buffer of the payload's own size: ASan sees a read beyond it) has its id below the table's rows,
 * finite values and each slot within its optimizer's range. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compute/lazy_optim.h"
#include "transport/wire.h"

/* The least value slot k of a table optimizer may hold, as the check has it (docs/protocol.md). */
static int slot_ok(uint8_t kind, size_t k, float v) {
    if ((kind == DT_LAZY_ADAGRAD) && k == 0) return v > 0.0f;
    if ((kind == DT_LAZY_FTRL && k == 0) || (kind == DT_LAZY_ADAM && k == 1)) return v >= 0.0f;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const uint64_t rows_of[4] = {0, 1, 1000, UINT64_C(1) << 40};
    if (size < 1 + DT_WIRE_HEADER_SIZE) return 0;
    const uint64_t max_id = rows_of[data[0] & 3];
    data++, size--;
    dt_wire_header h;
    dt_error err;
    if (dt_wire_decode(&h, data, DT_WIRE_HEADER_SIZE, &err) != DT_OK) return 0;
    uint8_t again[DT_WIRE_HEADER_SIZE];
    dt_wire_encode(again, &h);
    if (memcmp(again, data, DT_WIRE_HEADER_SIZE) != 0) __builtin_trap();
    const size_t bytes = size - DT_WIRE_HEADER_SIZE;
    uint8_t *copy = malloc(bytes ? bytes : 1);
    if (!copy) return 0;
    memcpy(copy, data + DT_WIRE_HEADER_SIZE, bytes);
    dt_wire_rows r;
    if (dt_wire_rows_check(&r, &h, copy, bytes, max_id, &err) == DT_OK) {
        if (bytes != dt_wire_sparse_bytes(&h) || bytes > dt_wire_sparse_max_frame() || r.n != h.sparse.ids)
            __builtin_trap();
        float row[DT_WIRE_MAX_SPARSE_DIM * (1 + DT_LAZY_MAX_SLOTS)];
        for (size_t i = 0; i < r.n; i++) {
            if (max_id && dt_wire_rows_id(&r, i) >= max_id) __builtin_trap();
            dt_wire_rows_get(&r, i, row);
            for (size_t k = 0; k <= r.slots; k++)
                for (size_t j = 0; j < r.dim; j++) {
                    const float v = row[k * r.dim + j];
                    if (!isfinite(v) || (k && !slot_ok(h.opt_kind, k - 1, v))) __builtin_trap();
                }
        }
    }
    free(copy);
    return 0;
}
