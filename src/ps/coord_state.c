/* The coordinator's state as bytes (docs/elastic.md, "Checkpoints"): the plan, the epoch, a bit per
 * unit done and the batches counted of the units partly trained. Saved by ps 0 for the chief's
 * checkpoint; loaded from a checkpoint file or the wire, so the loader takes nothing on trust: the
 * whole state is checked, canonical, before anything but the coordinator is allocated. */
#include <inttypes.h>
#include <string.h>

#include "core/error.h"
#include "io/bytes.h"
#include "ps/coord.h"
#include "ps/coord_impl.h"

#define MAGIC "DTCOORD2"    /* version 2: epochs in 32 bits, then the last epoch's batches */
#define MAGIC_V1 "DTCOORD1" /* version 1: epochs in 64 bits (read: a checkpoint from before) */

/* Byte offsets of the header (docs/elastic.md has the same table). */
enum {
    OFF_MAGIC = 0, OFF_EXAMPLES = 8, OFF_SEED = 16, OFF_EPOCH = 24, OFF_EPOCHS = 32, OFF_LAST = 36, OFF_BATCH = 40,
    OFF_UNIT = 44,
    OFF_WORKERS = 48, OFF_HELD = 52, OFF_LIVENESS = 56, OFF_FLAGS = 60, OFF_UNITS = 64, OFF_PARTIAL = 68,
};
_Static_assert(OFF_PARTIAL + 4 == DT_COORD_HEADER_BYTES, "coordinator state header layout and size disagree");
#define FLAG_SYNC 1u
#define PARTIAL_BYTES 12u

/* Units partly trained: not done, some batches counted. */
static uint32_t partial_count(const dt_coord *c) {
    uint32_t n = 0;
    for (uint32_t u = 0; u < c->units; u++) n += c->state[u] != UNIT_DONE && c->done_mask[u] != 0;
    return n;
}

size_t dt_coord_state_size(const dt_coord *c) {
    return DT_COORD_HEADER_BYTES + (c->units + 7) / 8 + (size_t)PARTIAL_BYTES * partial_count(c);
}

void dt_coord_save(const dt_coord *c, uint8_t *out) {
    const dt_coord_plan *p = &c->plan;
    memset(out, 0, DT_COORD_HEADER_BYTES + (c->units + 7) / 8);
    memcpy(out + OFF_MAGIC, MAGIC, 8);
    dt_put_u64(out + OFF_EXAMPLES, p->examples);
    dt_put_u64(out + OFF_SEED, p->seed);
    dt_put_u64(out + OFF_EPOCH, c->epoch);
    dt_put_u32(out + OFF_EPOCHS, (uint32_t)p->epochs); /* at most DT_COORD_MAX_EPOCHS */
    dt_put_u32(out + OFF_LAST, p->last_batches);
    dt_put_u32(out + OFF_BATCH, p->batch_size);
    dt_put_u32(out + OFF_UNIT, p->unit_batches);
    dt_put_u32(out + OFF_WORKERS, p->max_workers);
    dt_put_u32(out + OFF_HELD, p->max_held);
    dt_put_u32(out + OFF_LIVENESS, p->liveness_ms);
    dt_put_u32(out + OFF_FLAGS, p->sync ? FLAG_SYNC : 0);
    dt_put_u32(out + OFF_UNITS, c->units);
    dt_put_u32(out + OFF_PARTIAL, partial_count(c));
    uint8_t *bits = out + DT_COORD_HEADER_BYTES, *e = bits + (c->units + 7) / 8;
    for (uint32_t u = 0; u < c->units; u++) {
        if (c->state[u] == UNIT_DONE) bits[u >> 3] |= (uint8_t)(1u << (u & 7));
        else if (c->done_mask[u]) {
            dt_put_u32(e, u);
            dt_put_u64(e + 4, c->done_mask[u]);
            e += PARTIAL_BYTES;
        }
    }
}

/* The header's plan, checked by dt_coord_new; the fields dt_coord_new does not check. */
static int load_header(const uint8_t *p, size_t len, dt_coord_plan *plan, uint64_t *epoch, dt_error *err) {
    if (len < DT_COORD_HEADER_BYTES)
        return dt_errorf(err, DT_EFORMAT, "coordinator state: %zu bytes, the header alone is %u", len,
                         DT_COORD_HEADER_BYTES);
    int v1 = memcmp(p + OFF_MAGIC, MAGIC_V1, 8) == 0;
    if (!v1 && memcmp(p + OFF_MAGIC, MAGIC, 8) != 0)
        return dt_errorf(err, DT_EFORMAT, "coordinator state: bad magic (bytes 0..7 must be \"%s\", or \"%s\")",
                         MAGIC, MAGIC_V1);
    /* Version 1's epochs were a u64: its high half, where version 2 has last_batches, must be 0. */
    if (v1 && dt_get_u32(p + OFF_LAST))
        return dt_errorf(err, DT_EFORMAT, "coordinator state (version 1): %" PRIu64 " epochs (byte %d; at most %u)",
                         dt_get_u64(p + OFF_EPOCHS), OFF_EPOCHS, DT_COORD_MAX_EPOCHS);
    uint32_t flags = dt_get_u32(p + OFF_FLAGS);
    if (flags & ~FLAG_SYNC)
        return dt_errorf(err, DT_EFORMAT, "coordinator state: unknown flags 0x%x (byte %d)", flags, OFF_FLAGS);
    *plan = (dt_coord_plan){.examples = dt_get_u64(p + OFF_EXAMPLES), .seed = dt_get_u64(p + OFF_SEED),
                            .epochs = dt_get_u32(p + OFF_EPOCHS), .last_batches = dt_get_u32(p + OFF_LAST),
                            .batch_size = dt_get_u32(p + OFF_BATCH),
                            .unit_batches = dt_get_u32(p + OFF_UNIT), .max_workers = dt_get_u32(p + OFF_WORKERS),
                            .max_held = dt_get_u32(p + OFF_HELD), .liveness_ms = dt_get_u32(p + OFF_LIVENESS),
                            .sync = (flags & FLAG_SYNC) != 0};
    *epoch = dt_get_u64(p + OFF_EPOCH);
    if (plan->epochs && *epoch > plan->epochs)
        return dt_errorf(err, DT_EFORMAT, "coordinator state: epoch %" PRIu64 " beyond the %" PRIu64 " epoch(s) of the "
                         "plan (byte %d)", *epoch, plan->epochs, OFF_EPOCH);
    return DT_OK;
}

/* The size the counts imply, against the bytes there: before anything is allocated or read past
 * the header. */
static int load_sizes(const dt_coord_plan *plan, uint64_t epoch, const uint8_t *p, size_t len, uint32_t *partial,
                      dt_error *err) {
    uint32_t units, batches;
    int rc = coord_check_plan(plan, &units, &batches, err);
    if (rc) return dt_error_wrap(err, DT_EFORMAT, "coordinator state: ");
    coord_epoch_size(plan, epoch, &units, &batches); /* the last epoch may be shorter */
    uint32_t claimed = dt_get_u32(p + OFF_UNITS);
    *partial = dt_get_u32(p + OFF_PARTIAL);
    if (claimed != units)
        return dt_errorf(err, DT_EFORMAT, "coordinator state: %u units (byte %d), the plan makes %u", claimed, OFF_UNITS,
                         units);
    if (*partial > units)
        return dt_errorf(err, DT_EFORMAT, "coordinator state: %u partial units (byte %d), more than its %u units",
                         *partial, OFF_PARTIAL, units);
    size_t want = DT_COORD_HEADER_BYTES + (units + 7) / 8 + (size_t)PARTIAL_BYTES * *partial;
    if (len != want)
        return dt_errorf(err, DT_EFORMAT, "coordinator state: %zu bytes, its counts make %zu", len, want);
    return DT_OK;
}

/* The done bits: padding zero, not every unit (the epoch would have ended), none after the end. */
static int load_done(dt_coord *c, const uint8_t *bits, dt_error *err) {
    if (c->units % 8 && bits[c->units / 8] >> (c->units % 8))
        return dt_errorf(err, DT_EFORMAT, "coordinator state: padding bits after unit %u are not 0", c->units - 1);
    for (uint32_t u = 0; u < c->units; u++) {
        if (!(bits[u >> 3] >> (u & 7) & 1)) continue;
        c->state[u] = UNIT_DONE;
        c->done_mask[u] = c->claimed[u] = coord_full_mask(c, u);
        c->n_done++;
    }
    if (c->n_done == c->units)
        return dt_errorf(err, DT_EFORMAT, "coordinator state: every unit of epoch %" PRIu64 " is done (the epoch would "
                         "have ended)", c->epoch);
    if (c->n_done && c->plan.epochs && c->epoch == c->plan.epochs)
        return dt_errorf(err, DT_EFORMAT, "coordinator state: units done after the last epoch");
    return DT_OK;
}

/* The partial units: ascending, not done, some but not all of their batches; into the pool. */
static int load_partial(dt_coord *c, const uint8_t *e, uint32_t n, dt_error *err) {
    for (uint32_t i = 0; i < n; i++, e += PARTIAL_BYTES) {
        uint32_t u = dt_get_u32(e);
        uint64_t mask = dt_get_u64(e + 4);
        if (u >= c->units || (i && u <= dt_get_u32(e - PARTIAL_BYTES)))
            return dt_errorf(err, DT_EFORMAT, "coordinator state: partial entry %u names unit %u (units ascending, "
                             "below %u)", i, u, c->units);
        uint64_t full = coord_full_mask(c, u);
        if (c->state[u] == UNIT_DONE || !mask || (mask & ~full) || mask == full)
            return dt_errorf(err, DT_EFORMAT, "coordinator state: partial entry %u: unit %u with batch mask 0x%" PRIx64
                             " (must be some, not all, of 0x%" PRIx64 ", and the unit not done)", i, u, mask, full);
        c->done_mask[u] = c->claimed[u] = mask;
        coord_pool_push(c, u);
    }
    return DT_OK;
}

int dt_coord_load(dt_coord **out, const void *buf, size_t len, FILE *log, dt_error *err) {
    *out = NULL;
    const uint8_t *p = buf;
    dt_coord_plan plan;
    uint64_t epoch = 0;
    uint32_t partial = 0;
    int rc = load_header(p, len, &plan, &epoch, err);
    if (!rc) rc = load_sizes(&plan, epoch, p, len, &partial, err);
    dt_coord *c = NULL;
    if (!rc) rc = dt_coord_new(&c, &plan, log, err);
    if (!rc) {
        c->epoch = epoch;
        coord_epoch_size(&c->plan, epoch, &c->units, &c->batches);
        rc = load_done(c, p + DT_COORD_HEADER_BYTES, err);
    }
    if (!rc) rc = load_partial(c, p + DT_COORD_HEADER_BYTES + (c->units + 7) / 8, partial, err);
    if (rc) {
        dt_coord_free(c);
        return rc == DT_ENOMEM ? rc : DT_EFORMAT;
    }
    *out = c;
    return DT_OK;
}
