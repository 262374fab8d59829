/* libFuzzer target for the sparse tables' messages: the wire decoder of their headers, table records
 * and section records, and the ps shard's handling of their payloads (sections, ids, rows, parts,
 * steps; a checkpoint's
 * SPARSE_EXPORT pages and SPARSE_IMPORT rows with their slots: fuzz_sparse_rows.c fuzzes the rows'
 * check alone).
 * Input: [1 byte: selector][header frame, 104 bytes][payload...]. The selector's bit 0 makes the
 * shard sync (2 replicas, staleness 1) rather than async, bit 1 declares a table with admission
 * and a capacity of 4 rows (evictions), bit 2 repeats the message (a second part, a duplicate), bit 3
 * makes table 0 a table of 1000 buckets (ids beyond refused), bit 4 makes the shard sync with 64
 * replicas and staleness 64 (each table's accumulators 65 x 64 entries). The shard's table memory is
 * 256 MiB (a SPARSE_INIT of larger tables, their accumulators counted, is refused before any is
 * built): what a SPARSE_INIT declares stays within it.
 * Every decoded header is re-encoded to the same bytes; a payload passing the bound is within the
 * largest sparse frame; a table record that decodes is re-encoded to the same bytes; section records
 * that decode name each table once, below the bound, and lie end to end within the header's ids and
 * floats; the shard answers every request once and holds nothing after it is freed. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compute/lazy_optim.h"
#include "ps/shard.h"
#include "transport/wire.h"

static int replies, held;

static void io_send(void *user, const ps_origin *to, dt_wire_header *h, dt_bytes *payload, size_t admitted) {
    replies++;
    if (payload) dt_bytes_release(payload);
}
static int io_admit(void *user, const ps_origin *to, size_t bytes, char *why, size_t len) { return 0; }
static void io_unadmit(void *user, const ps_origin *to, size_t bytes) {}
static int io_hold(void *user, const ps_origin *from, ps_origin *kept) {
    held++;
    *kept = *from;
    return 0;
}
static void io_drop(void *user, ps_origin *kept) { held--; }
static const ps_io io = {.send = io_send, .admit = io_admit, .unadmit = io_unadmit, .hold = io_hold, .drop = io_drop};
static int conn;

static void request(ps_shard *s, const dt_wire_header *h, const void *payload, size_t size) {
    ps_origin o = {.conn = &conn, .serial = 1, .addr = "fuzz"};
    dt_bytes b = {.data = payload, .size = size};
    int before = replies;
    ps_shard_request(s, &o, h, &b, 0, &io);
    /* A request is answered once, or held (a deferred pull, answered later). */
    if (replies - before > 2) __builtin_trap();
}

/* A shard of 4 floats, INIT as the selector says, tables 0 (dim 2, adagrad) and 1 (dim 4, ftrl). */
static ps_shard *shard_for(uint8_t sel) {
    ps_shard *s = NULL;
    ps_shard_config cfg = {.ps_index = 0, .shard_floats = 4, .table_memory = UINT64_C(256) << 20};
    if (ps_shard_new(&s, &cfg, NULL)) __builtin_trap();
    uint8_t init[4 * 4 + DT_WIRE_OPTS_BYTES + 1] = {0};
    dt_lr_schedule sched = {0};
    dt_wire_opts_encode(init + 16, &sched, 0.0f);
    dt_wire_header h = dt_wire_header_make(DT_MSG_INIT, DT_ROLE_CHIEF, 0, 1);
    h.shard_floats = 4, h.generation = 1, h.learning_rate = 0.1f, h.payload_bytes = sizeof init;
    h.init.total_num_replicas = 2;
    if (sel & 1) h.init.replicas_to_aggregate = 2, h.init.staleness = 1;
    if (sel & 16) h.init.replicas_to_aggregate = h.init.total_num_replicas = 64, h.init.staleness = 64;
    request(s, &h, init, sizeof init);
    uint8_t rec[2 * DT_WIRE_TABLE_BYTES];
    for (int t = 0; t < 2; t++) {
        dt_wire_table w = {.table = (uint32_t)t, .dim = t ? 4 : 2, .init_kind = 2, .init_scale = 0.1f,
                           .capacity = (sel & 2) ? 4 : 1000, .min_count = (sel & 2) ? 2 : 0, .seed = 3,
                           .flags = (sel & 8) && !t ? DT_WIRE_TABLE_F_BUCKETS : 0};
        dt_lazy_config_init(&w.opt, t ? "ftrl" : "adagrad", 0.1f, NULL);
        dt_wire_table_encode(rec + t * DT_WIRE_TABLE_BYTES, &w);
    }
    dt_wire_header si = dt_wire_header_make(DT_MSG_SPARSE_INIT, DT_ROLE_CHIEF, 0, 2);
    si.sparse.ids = 2, si.payload_bytes = sizeof rec;
    request(s, &si, rec, sizeof rec);
    return s;
}

static void check_records(const uint8_t *p, size_t n) {
    for (size_t k = 0; k < n; k++) {
        dt_wire_table t;
        dt_error err;
        if (dt_wire_table_decode(&t, p + k * DT_WIRE_TABLE_BYTES, DT_WIRE_TABLE_BYTES, &err) != DT_OK) continue;
        uint8_t back[DT_WIRE_TABLE_BYTES];
        dt_wire_table_encode(back, &t);
        if (memcmp(back, p + k * DT_WIRE_TABLE_BYTES, sizeof back) != 0) __builtin_trap();
    }
}

/* Sections that decoded: distinct tables below the bound, dims in range, each section's ids and
 * floats following the one before, adding up to the header's; each record re-encodes to its bytes. */
static void check_sections(const dt_wire_header *h, const uint8_t *payload, size_t len) {
    static dt_wire_section sec[DT_WIRE_MAX_SPARSE_SECTIONS];
    dt_error err;
    if (dt_wire_sections_decode(sec, h, payload, len, &err) != DT_OK) return;
    uint8_t seen[DT_WIRE_MAX_TABLES] = {0};
    size_t ids = 0, floats = 0;
    for (size_t k = 0; k < h->sections.count; k++) {
        const dt_wire_section *c = &sec[k];
        if (c->table >= DT_WIRE_MAX_TABLES || seen[c->table]++ || c->dim < 1 || c->dim > DT_WIRE_MAX_SPARSE_DIM ||
            c->first != ids || c->at != floats || (h->type == DT_MSG_SPARSE_PULL && c->ids == 0))
            __builtin_trap();
        uint8_t back[DT_WIRE_SECTION_BYTES];
        dt_wire_section_encode(back, c->table, c->dim, c->ids);
        if (memcmp(back, payload + DT_WIRE_SECTION_BYTES * k, sizeof back) != 0) __builtin_trap();
        ids += c->ids, floats += (size_t)c->ids * c->dim;
    }
    if (ids != h->sections.ids || floats != h->sections.floats || floats > DT_WIRE_MAX_SPARSE_FLOATS) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 + DT_WIRE_HEADER_SIZE) return 0;
    const uint8_t sel = data[0];
    data++, size--;
    dt_wire_header h;
    dt_error err;
    if (dt_wire_decode(&h, data, DT_WIRE_HEADER_SIZE, &err) != DT_OK || !dt_wire_type_is_sparse(h.type)) return 0;
    uint8_t again[DT_WIRE_HEADER_SIZE];
    dt_wire_encode(again, &h);
    if (memcmp(again, data, DT_WIRE_HEADER_SIZE) != 0) __builtin_trap();
    const uint8_t *payload = data + DT_WIRE_HEADER_SIZE;
    const size_t bytes = size - DT_WIRE_HEADER_SIZE;
    if (h.payload_bytes != bytes) return 0; /* the receiver refuses a frame of another size */
    if (dt_wire_check_payload(&h, 4, &err) != DT_OK) return 0;
    if (bytes > dt_wire_sparse_max_frame()) __builtin_trap();
    if (h.type == DT_MSG_SPARSE_INIT) check_records(payload, h.sparse.ids);
    /* The payload in a buffer of its own size, so that ASan sees any read beyond it. */
    uint8_t *copy = malloc(bytes ? bytes : 1);
    if (!copy) return 0;
    memcpy(copy, payload, bytes);
    if (h.type == DT_MSG_SPARSE_PULL || h.type == DT_MSG_SPARSE_PUSH) check_sections(&h, copy, bytes);
    ps_shard *s = shard_for(sel);
    h.shard = 0;
    request(s, &h, copy, bytes);
    if (sel & 4) request(s, &h, copy, bytes);
    ps_shard_stats st;
    ps_shard_get_stats(s, &st); /* the tables are new: their rows and sums at their least */
    if (h.type == DT_MSG_SPARSE_INIT && st.sparse.bytes + st.sync_bytes > (UINT64_C(256) << 20)) __builtin_trap();
    ps_shard_free(s, &io);
    if (held != 0) __builtin_trap();
    free(copy);
    return 0;
}
