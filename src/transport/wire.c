#include "transport/wire.h"

#include <math.h>
#include <string.h>

#include "core/error.h"
#include "io/bytes.h"

/* Byte offsets of the header fields (docs/protocol.md has the same table). */
enum {
    OFF_MAGIC = 0, OFF_VERSION = 4, OFF_TYPE = 6, OFF_FLAGS = 7, OFF_ROLE = 8, OFF_CHUNK = 9,
    OFF_TASK = 10, OFF_REQUEST = 12, OFF_GSTEP = 16, OFF_LSTEP = 24, OFF_PAYLOAD = 32,
    OFF_SHARD = 40, OFF_STATUS = 44, OFF_SHARD_FLOATS = 48, OFF_OPT_KIND = 56, OFF_OPT_SLOTS = 57,
    OFF_GENERATION = 58, OFF_CHUNKS = 59, OFF_LR = 60, OFF_MOMENTUM = 64, OFF_BETA1 = 68, OFF_BETA2 = 72,
    OFF_EPSILON = 76, OFF_COUNTERS = 80, /* 3 x u64 */
};
_Static_assert(OFF_COUNTERS + 24 == DT_WIRE_HEADER_SIZE, "header layout and size disagree");

#define OPT_KINDS 3 /* sgd, momentum, adam: dt_opt_kind values 0..2 */

dt_wire_header dt_wire_header_make(dt_msg_type type, dt_wire_role role, uint16_t task,
                                   uint32_t request_id) {
    dt_wire_header h;
    memset(&h, 0, sizeof h);
    h.version = DT_WIRE_VERSION;
    h.type = (uint8_t)type;
    h.role = (uint8_t)role;
    h.task = task;
    h.request_id = request_id;
    /* A message about a chunk, or an INIT: one chunk (the whole shard) unless the caller says. */
    if (type == DT_MSG_PUSH || type == DT_MSG_PULL || type == DT_MSG_PARAMS || type == DT_MSG_PUSH_ACK ||
        type == DT_MSG_INIT || type == DT_MSG_SPARSE_PUSH)
        h.chunks = 1;
    return h;
}

void dt_wire_encode(uint8_t *out, const dt_wire_header *h) {
    memset(out, 0, DT_WIRE_HEADER_SIZE);
    memcpy(out + OFF_MAGIC, DT_WIRE_MAGIC, 4);
    dt_put_u16(out + OFF_VERSION, DT_WIRE_VERSION);
    out[OFF_TYPE] = h->type;
    out[OFF_FLAGS] = (uint8_t)(h->flags | (h->encoding << DT_WIRE_ENC_SHIFT));
    out[OFF_ROLE] = h->role;
    dt_put_u16(out + OFF_TASK, h->task);
    dt_put_u32(out + OFF_REQUEST, h->request_id);
    dt_put_u64(out + OFF_GSTEP, (uint64_t)h->global_step);
    dt_put_u64(out + OFF_LSTEP, (uint64_t)h->local_step);
    dt_put_u64(out + OFF_PAYLOAD, h->payload_bytes);
    dt_put_u32(out + OFF_SHARD, h->shard);
    dt_put_u32(out + OFF_STATUS, (uint32_t)h->status);
    dt_put_u64(out + OFF_SHARD_FLOATS, h->shard_floats);
    out[OFF_OPT_KIND] = h->opt_kind;
    out[OFF_OPT_SLOTS] = h->opt_slots;
    out[OFF_GENERATION] = h->generation;
    out[OFF_CHUNK] = h->chunk;
    out[OFF_CHUNKS] = h->chunks;
    dt_put_f32(out + OFF_LR, h->learning_rate);
    dt_put_f32(out + OFF_MOMENTUM, h->momentum);
    dt_put_f32(out + OFF_BETA1, h->beta1);
    dt_put_f32(out + OFF_BETA2, h->beta2);
    dt_put_f32(out + OFF_EPSILON, h->epsilon);
    for (int i = 0; i < 3; i++) dt_put_u64(out + OFF_COUNTERS + 8 * i, h->counters[i]);
}

int dt_wire_type_has_payload(uint8_t type) {
    return type == DT_MSG_INIT || type == DT_MSG_PARAMS || type == DT_MSG_PUSH || type == DT_MSG_ERROR ||
           type == DT_MSG_STATE || dt_wire_type_is_sparse(type) || type == DT_MSG_WORK_STATE;
}

/* The flags a type may carry. */
static uint8_t allowed_flags(uint8_t type) {
    switch (type) {
    case DT_MSG_PULL: return DT_WIRE_F_EXACT;
    case DT_MSG_PUSH: return DT_WIRE_F_SYNC | DT_WIRE_F_PULL;
    case DT_MSG_INIT: return DT_WIRE_F_STRICT | DT_WIRE_F_ELASTIC;
    case DT_MSG_SPARSE_PUSH: return DT_WIRE_F_SYNC;
    case DT_MSG_SPARSE_INIT: return DT_WIRE_F_IMPORT;
    case DT_MSG_WELCOME:
    case DT_MSG_STATUS_REPLY: return DT_WIRE_F_IMPORTING;
    case DT_MSG_SPARSE_IMPORT: return DT_WIRE_F_LAST;
    case DT_MSG_WORK_ASK: return DT_WIRE_F_JOIN;
    case DT_MSG_DONE: return DT_WIRE_F_WAITING;
    default: return 0;
    }
}

/* INIT's sync configuration: asynchronous (aggregate 0, staleness 0, total = the workers, 0 if
 * not told), or 1 <= aggregate <= total <= the replica limit and a staleness within its limit. */
static int check_sync_config(const dt_wire_header *h, dt_error *err) {
    if (h->init.replicas_to_aggregate == 0) {
        if (h->init.staleness)
            return dt_errorf(err, DT_EFORMAT, "INIT header: asynchronous (replicas_to_aggregate 0) with "
                             "staleness %llu (must be 0)", (unsigned long long)h->init.staleness);
        if (h->init.total_num_replicas > DT_WIRE_MAX_REPLICAS)
            return dt_errorf(err, DT_EFORMAT, "INIT header: %llu workers, beyond the limit %u",
                             (unsigned long long)h->init.total_num_replicas, DT_WIRE_MAX_REPLICAS);
        return DT_OK;
    }
    if (h->init.total_num_replicas < h->init.replicas_to_aggregate || h->init.total_num_replicas > DT_WIRE_MAX_REPLICAS)
        return dt_errorf(err, DT_EFORMAT, "INIT header: total_num_replicas %llu must be in %llu..%u "
                         "(replicas_to_aggregate..limit)", (unsigned long long)h->init.total_num_replicas,
                         (unsigned long long)h->init.replicas_to_aggregate, DT_WIRE_MAX_REPLICAS);
    if (h->init.staleness > DT_WIRE_MAX_STALENESS)
        return dt_errorf(err, DT_EFORMAT, "INIT header: staleness %llu beyond the limit %u",
                         (unsigned long long)h->init.staleness, DT_WIRE_MAX_STALENESS);
    if ((h->init.staleness + 1) * h->init.replicas_to_aggregate > DT_WIRE_MAX_HELD_GRADIENTS)
        return dt_errorf(err, DT_EFORMAT, "INIT header: (staleness %llu + 1) x replicas_to_aggregate %llu gradients "
                         "held per chunk, beyond the limit %u", (unsigned long long)h->init.staleness,
                         (unsigned long long)h->init.replicas_to_aggregate, DT_WIRE_MAX_HELD_GRADIENTS);
    return DT_OK;
}

/* The optimizer fields of INIT and WELCOME: a known kind, its slot count, finite values. */
static int check_optimizer(const dt_wire_header *h, dt_error *err) {
    static const uint8_t slots[OPT_KINDS] = {0, 1, 2};
    if (h->opt_kind >= OPT_KINDS)
        return dt_errorf(err, DT_EFORMAT, "%s header: unknown optimizer kind %u (byte %d)",
                         dt_wire_type_name(h->type), h->opt_kind, OFF_OPT_KIND);
    if (h->opt_slots != slots[h->opt_kind])
        return dt_errorf(err, DT_EFORMAT, "%s header: optimizer kind %u has %u state slots, header says %u",
                         dt_wire_type_name(h->type), h->opt_kind, slots[h->opt_kind], h->opt_slots);
    const float v[5] = {h->learning_rate, h->momentum, h->beta1, h->beta2, h->epsilon};
    static const char *names[5] = {"learning_rate", "momentum", "beta1", "beta2", "epsilon"};
    for (int i = 0; i < 5; i++)
        if (!isfinite(v[i]))
            return dt_errorf(err, DT_EFORMAT, "%s header: %s is not a finite number",
                             dt_wire_type_name(h->type), names[i]);
    return DT_OK;
}

/* The header's fields as the bytes say, nothing checked (the caller checked the size). */
static void read_fields(dt_wire_header *h, const uint8_t *p, uint16_t version) {
    h->version = version;
    h->type = p[OFF_TYPE];
    h->flags = (uint8_t)(p[OFF_FLAGS] & ~DT_WIRE_ENC_MASK);
    h->encoding = (uint8_t)((p[OFF_FLAGS] & DT_WIRE_ENC_MASK) >> DT_WIRE_ENC_SHIFT);
    h->role = p[OFF_ROLE];
    h->task = dt_get_u16(p + OFF_TASK);
    h->request_id = dt_get_u32(p + OFF_REQUEST);
    h->global_step = (int64_t)dt_get_u64(p + OFF_GSTEP);
    h->local_step = (int64_t)dt_get_u64(p + OFF_LSTEP);
    h->payload_bytes = dt_get_u64(p + OFF_PAYLOAD);
    h->shard = dt_get_u32(p + OFF_SHARD);
    h->status = (int32_t)dt_get_u32(p + OFF_STATUS);
    h->shard_floats = dt_get_u64(p + OFF_SHARD_FLOATS);
    h->opt_kind = p[OFF_OPT_KIND];
    h->opt_slots = p[OFF_OPT_SLOTS];
    h->generation = p[OFF_GENERATION];
    h->chunk = p[OFF_CHUNK];
    h->chunks = p[OFF_CHUNKS];
    h->learning_rate = dt_get_f32(p + OFF_LR);
    h->momentum = dt_get_f32(p + OFF_MOMENTUM);
    h->beta1 = dt_get_f32(p + OFF_BETA1);
    h->beta2 = dt_get_f32(p + OFF_BETA2);
    h->epsilon = dt_get_f32(p + OFF_EPSILON);
    for (int i = 0; i < 3; i++) h->counters[i] = dt_get_u64(p + OFF_COUNTERS + 8 * i);
}

/* Type, flags, encoding and role: known, and allowed together. */
static int check_kind(const dt_wire_header *h, dt_error *err) {
    if (h->type < 1 || h->type > DT_MSG_TYPE_MAX)
        return dt_errorf(err, DT_EFORMAT, "unknown message type %u (byte %d)", h->type, OFF_TYPE);
    const char *tn = dt_wire_type_name(h->type);
    if (h->flags & ~allowed_flags(h->type))
        return dt_errorf(err, DT_EFORMAT, "%s header: unknown flags 0x%02x (byte %d)", tn, h->flags, OFF_FLAGS);
    /* Only a message that carries the shard's values, or asks for them, has an encoding. */
    int encoded = h->type == DT_MSG_PUSH || h->type == DT_MSG_PULL || h->type == DT_MSG_PARAMS ||
                  h->type == DT_MSG_SPARSE_PULL || h->type == DT_MSG_SPARSE_ROWS || h->type == DT_MSG_SPARSE_PUSH;
    if (!encoded && h->encoding)
        return dt_errorf(err, DT_EFORMAT, "%s header: encoding %u on a message without one (byte %d, bits 4-5 must "
                         "be 0)", tn, h->encoding, OFF_FLAGS);
    if (h->encoding >= DT_ENC_COUNT)
        return dt_errorf(err, DT_EFORMAT, "%s header: unknown encoding %u (byte %d, bits 4-5)", tn, h->encoding,
                         OFF_FLAGS);
    if (h->role > DT_ROLE_MAX)
        return dt_errorf(err, DT_EFORMAT, "%s header: unknown sender role %u (byte %d)", tn, h->role, OFF_ROLE);
    return DT_OK;
}

/* The chunk, steps, payload and shard size, and the fields of INIT, WELCOME and STATE. */
static int check_values(const dt_wire_header *h, dt_error *err) {
    const char *tn = dt_wire_type_name(h->type);
    /* Chunked messages name their chunk of the shard cut into `chunks` parts; INIT sets the cut;
     * a ps's other replies report it (0 before INIT); other requests carry neither. */
    /* A SPARSE_PUSH is part `chunk` of the `chunks` a worker sends for one table and step. */
    int chunked = h->type == DT_MSG_PUSH || h->type == DT_MSG_PULL || h->type == DT_MSG_PARAMS ||
                  h->type == DT_MSG_PUSH_ACK || h->type == DT_MSG_SPARSE_PUSH;
    if ((chunked || h->type == DT_MSG_INIT) && h->chunks == 0)
        return dt_errorf(err, DT_EFORMAT, "%s header: chunks 0 (byte %d must be 1..255)", tn, OFF_CHUNKS);
    if (h->chunks ? h->chunk >= h->chunks : h->chunk != 0)
        return dt_errorf(err, DT_EFORMAT, "%s header: chunk %u of %u (bytes %d, %d)", tn, h->chunk, h->chunks,
                         OFF_CHUNK, OFF_CHUNKS);
    if (!chunked && h->chunk != 0)
        return dt_errorf(err, DT_EFORMAT, "%s header: chunk %u on a message that is not cut (byte %d must be 0)", tn,
                         h->chunk, OFF_CHUNK);
    if (h->global_step < 0 || h->local_step < 0)
        return dt_errorf(err, DT_EFORMAT, "%s header: negative step (global %lld, local %lld)", tn,
                         (long long)h->global_step, (long long)h->local_step);
    if (h->global_step > DT_WIRE_MAX_STEP || h->local_step > DT_WIRE_MAX_STEP)
        return dt_errorf(err, DT_EFORMAT, "%s header: step beyond the limit %lld (global %lld, local %lld, bytes %d "
                         "and %d)", tn, (long long)DT_WIRE_MAX_STEP, (long long)h->global_step,
                         (long long)h->local_step, OFF_GSTEP, OFF_LSTEP);
    if (!dt_wire_type_has_payload(h->type) && h->payload_bytes != 0)
        return dt_errorf(err, DT_EFORMAT, "%s header: claims a payload of %llu bytes, this type has none", tn,
                         (unsigned long long)h->payload_bytes);
    if (h->shard_floats > DT_WIRE_MAX_SHARD_FLOATS)
        return dt_errorf(err, DT_EFORMAT, "%s header: shard of %llu floats is beyond the limit %llu", tn,
                         (unsigned long long)h->shard_floats, (unsigned long long)DT_WIRE_MAX_SHARD_FLOATS);
    if (h->type == DT_MSG_PUSH && h->push.examples > DT_WIRE_MAX_EXAMPLES)
        return dt_errorf(err, DT_EFORMAT, "PUSH header: a gradient of %llu examples (bytes 80..87), beyond the bound "
                         "DT_WIRE_MAX_EXAMPLES = %llu", (unsigned long long)h->push.examples,
                         (unsigned long long)DT_WIRE_MAX_EXAMPLES);
    if (h->type == DT_MSG_WORK_DONE && h->counters[2] != 0)
        return dt_errorf(err, DT_EFORMAT, "WORK_DONE header: bytes 96..103 must be 0");
    if (h->type == DT_MSG_INIT && h->generation == 0)
        return dt_errorf(err, DT_EFORMAT, "INIT header: generation 0 (byte %d must be 1..255)", OFF_GENERATION);
    int rc = DT_OK;
    if (h->type == DT_MSG_INIT || h->type == DT_MSG_WELCOME || h->type == DT_MSG_STATE) rc = check_optimizer(h, err);
    if (!rc && h->type == DT_MSG_INIT) rc = check_sync_config(h, err);
    if (!rc && dt_wire_type_is_sparse(h->type)) rc = dt_wire_check_sparse(h, err);
    return rc;
}

int dt_wire_decode(dt_wire_header *out, const void *buf, size_t len, dt_error *err) {
    const uint8_t *p = buf;
    memset(out, 0, sizeof *out);
    /* Magic and version first, at offsets fixed for every version, so a peer of another version
     * is told so even if its header has another size. */
    if (len < OFF_VERSION + 2)
        return dt_errorf(err, DT_EFORMAT, "message header truncated: %zu bytes, expected %u", len,
                         DT_WIRE_HEADER_SIZE);
    if (memcmp(p + OFF_MAGIC, DT_WIRE_MAGIC, 4) != 0)
        return dt_errorf(err, DT_EFORMAT,
                         "not a dtrain message: bad magic %02x %02x %02x %02x (expected \"DTRN\")",
                         p[0], p[1], p[2], p[3]);
    uint16_t version = dt_get_u16(p + OFF_VERSION);
    if (version != DT_WIRE_VERSION)
        return dt_errorf(err, DT_EPROTO,
                         "peer speaks dtrain protocol version %u, this program speaks version %u",
                         version, DT_WIRE_VERSION);
    if (len != DT_WIRE_HEADER_SIZE)
        return dt_errorf(err, DT_EFORMAT, "message header %s: %zu bytes, expected %u",
                         len < DT_WIRE_HEADER_SIZE ? "truncated" : "too long", len, DT_WIRE_HEADER_SIZE);
    dt_wire_header h;
    memset(&h, 0, sizeof h);
    read_fields(&h, p, version);
    int rc = check_kind(&h, err);
    if (!rc) rc = check_values(&h, err);
    if (rc) return rc;
    *out = h;
    return DT_OK;
}

uint32_t dt_wire_peek_request_id(const void *buf, size_t len) {
    const uint8_t *p = buf;
    if (len < OFF_REQUEST + 4 || memcmp(p + OFF_MAGIC, DT_WIRE_MAGIC, 4) != 0) return 0;
    return dt_get_u32(p + OFF_REQUEST);
}

int dt_wire_check_payload(const dt_wire_header *h, uint64_t shard_floats, dt_error *err) {
    const char *tn = dt_wire_type_name(h->type);
    if (shard_floats > DT_WIRE_MAX_SHARD_FLOATS)
        return dt_errorf(err, DT_EINVAL, "shard of %llu floats is beyond the protocol limit",
                         (unsigned long long)shard_floats);
    uint64_t want, off, len;
    switch (h->type) {
    case DT_MSG_PUSH:
    case DT_MSG_PARAMS:
        if (!dt_enc_size(h->encoding))
            return dt_errorf(err, DT_EFORMAT, "%s header: unknown encoding %u", tn, h->encoding);
        dt_wire_chunk(shard_floats, h->chunks, h->chunk, &off, &len);
        want = len * dt_enc_size(h->encoding);
        break;
    case DT_MSG_INIT:
    case DT_MSG_STATE:
        /* opt_slots <= 2 was checked by decode; recheck so a hand-made header cannot overflow. */
        if (h->opt_slots > DT_WIRE_MAX_SLOTS)
            return dt_errorf(err, DT_EFORMAT, "%s header: %u optimizer slots, at most %u", tn, h->opt_slots,
                             DT_WIRE_MAX_SLOTS);
        want = h->type == DT_MSG_INIT ? dt_wire_init_bytes(h->opt_slots, shard_floats)
                                      : (1 + (uint64_t)h->opt_slots) * shard_floats * 4;
        break;
    case DT_MSG_SPARSE_INIT:
    case DT_MSG_SPARSE_PULL:
    case DT_MSG_SPARSE_ROWS:
    case DT_MSG_SPARSE_PUSH:
    case DT_MSG_SPARSE_EXPORT:
    case DT_MSG_SPARSE_PAGE:
    case DT_MSG_SPARSE_IMPORT: {
        int rc = dt_wire_check_sparse(h, err); /* decode checked it; a hand-made header must not overflow */
        if (rc) return rc;
        want = dt_wire_sparse_bytes(h);
        if (h->payload_bytes == want) return DT_OK;
        const char *enc = h->encoding ? dt_enc_name(h->encoding) : "", *sep = h->encoding ? ", encoding " : "";
        if (dt_wire_type_has_sections(h->type))
            return dt_errorf(err, DT_EFORMAT, "%s payload of %llu bytes, expected %llu (%llu sections, %llu ids, %llu "
                             "floats%s%s)", tn, (unsigned long long)h->payload_bytes, (unsigned long long)want,
                             (unsigned long long)h->sections.count, (unsigned long long)h->sections.ids,
                             (unsigned long long)h->sections.floats, sep, enc);
        return dt_errorf(err, DT_EFORMAT, "%s payload of %llu bytes, expected %llu (%llu ids, dim %llu%s%s)", tn,
                         (unsigned long long)h->payload_bytes, (unsigned long long)want,
                         (unsigned long long)h->sparse.ids, (unsigned long long)h->sparse.dim, sep, enc);
    }
    case DT_MSG_WORK_STATE: /* a request to fetch has none; a state is checked whole by its loader */
        if (h->payload_bytes > DT_WIRE_MAX_WORK_STATE)
            return dt_errorf(err, DT_EFORMAT, "WORK_STATE payload of %llu bytes is beyond the limit %u",
                             (unsigned long long)h->payload_bytes, DT_WIRE_MAX_WORK_STATE);
        return DT_OK;
    case DT_MSG_ERROR:
        if (h->payload_bytes > DT_WIRE_MAX_ERROR_TEXT)
            return dt_errorf(err, DT_EFORMAT, "ERROR text of %llu bytes is beyond the limit %u",
                             (unsigned long long)h->payload_bytes, DT_WIRE_MAX_ERROR_TEXT);
        return DT_OK;
    default: want = 0; break;
    }
    if (h->payload_bytes != want)
        return dt_errorf(err, DT_EFORMAT, "%s payload of %llu bytes, expected %llu (shard of %llu floats%s%s)",
                         tn, (unsigned long long)h->payload_bytes, (unsigned long long)want,
                         (unsigned long long)shard_floats, h->encoding ? ", encoding " : "",
                         h->encoding ? dt_enc_name(h->encoding) : "");
    return DT_OK;
}

void dt_wire_chunk(uint64_t shard_floats, unsigned chunks, unsigned chunk, uint64_t *off, uint64_t *len) {
    if (chunks == 0) chunks = 1;
    if (chunk >= chunks) chunk = chunks - 1;
    /* shard_floats <= 2^32 and chunks <= 255: no product overflows. */
    uint64_t begin = shard_floats * chunk / chunks, end = shard_floats * (chunk + 1) / chunks;
    *off = begin;
    *len = end - begin;
}

unsigned dt_wire_chunks_for(uint64_t shard_floats, uint64_t chunk_bytes) {
    if (chunk_bytes == 0) return 1;
    uint64_t bytes = shard_floats * 4, k = (bytes + chunk_bytes - 1) / chunk_bytes;
    return k < 1 ? 1 : k > DT_WIRE_MAX_CHUNKS ? DT_WIRE_MAX_CHUNKS : (unsigned)k;
}

uint64_t dt_wire_init_bytes(unsigned opt_slots, uint64_t shard_floats) {
    return (1 + (uint64_t)opt_slots) * shard_floats * 4 + DT_WIRE_OPTS_BYTES + (shard_floats + 7) / 8;
}

/* Offsets in the INIT options block (docs/protocol.md has the same table). */
enum {
    OPT_KIND = 0, OPT_STAIRCASE = 1, OPT_NBOUND = 2, OPT_RESERVED0 = 3, OPT_WD = 4, OPT_DECAY_STEPS = 8,
    OPT_DECAY_RATE = 16, OPT_ALPHA = 20, OPT_WARMUP = 24, OPT_BOUNDARIES = 32,
    OPT_VALUES = OPT_BOUNDARIES + 8 * DT_LR_MAX_BOUNDARIES, OPT_RESERVED1 = OPT_VALUES + 4 * (DT_LR_MAX_BOUNDARIES + 1),
};
_Static_assert(OPT_RESERVED1 + 4 == DT_WIRE_OPTS_BYTES, "INIT options layout and size disagree");

void dt_wire_opts_encode(uint8_t *out, const dt_lr_schedule *s, float weight_decay) {
    memset(out, 0, DT_WIRE_OPTS_BYTES);
    out[OPT_KIND] = (uint8_t)s->kind;
    out[OPT_STAIRCASE] = (uint8_t)(s->staircase != 0);
    out[OPT_NBOUND] = (uint8_t)s->n_boundaries;
    dt_put_f32(out + OPT_WD, weight_decay);
    dt_put_u64(out + OPT_DECAY_STEPS, (uint64_t)s->decay_steps);
    dt_put_f32(out + OPT_DECAY_RATE, s->decay_rate);
    dt_put_f32(out + OPT_ALPHA, s->alpha);
    dt_put_u64(out + OPT_WARMUP, (uint64_t)s->warmup_steps);
    for (int i = 0; i < DT_LR_MAX_BOUNDARIES; i++) dt_put_u64(out + OPT_BOUNDARIES + 8 * i, (uint64_t)s->boundaries[i]);
    for (int i = 0; i <= DT_LR_MAX_BOUNDARIES; i++) dt_put_f32(out + OPT_VALUES + 4 * i, s->values[i]);
}

int dt_wire_opts_decode(dt_lr_schedule *s, float *weight_decay, const void *buf, size_t len, dt_error *err) {
    const uint8_t *p = buf;
    memset(s, 0, sizeof *s);
    if (len != DT_WIRE_OPTS_BYTES)
        return dt_errorf(err, DT_EFORMAT, "INIT options: %zu bytes, expected %u", len, DT_WIRE_OPTS_BYTES);
    if (p[OPT_KIND] >= DT_LR_KINDS)
        return dt_errorf(err, DT_EFORMAT, "INIT options: unknown schedule %u (byte %d)", p[OPT_KIND], OPT_KIND);
    if (p[OPT_STAIRCASE] > 1)
        return dt_errorf(err, DT_EFORMAT, "INIT options: staircase %u (byte %d must be 0 or 1)", p[OPT_STAIRCASE],
                         OPT_STAIRCASE);
    if (p[OPT_NBOUND] > DT_LR_MAX_BOUNDARIES)
        return dt_errorf(err, DT_EFORMAT, "INIT options: %u boundaries, at most %d (byte %d)", p[OPT_NBOUND],
                         DT_LR_MAX_BOUNDARIES, OPT_NBOUND);
    if (p[OPT_RESERVED0] || dt_get_u32(p + OPT_RESERVED1))
        return dt_errorf(err, DT_EFORMAT, "INIT options: reserved bytes %d and %d..%d must be 0", OPT_RESERVED0,
                         OPT_RESERVED1, OPT_RESERVED1 + 3);
    s->kind = (dt_lr_kind)p[OPT_KIND];
    s->staircase = p[OPT_STAIRCASE];
    s->n_boundaries = p[OPT_NBOUND];
    float wd = dt_get_f32(p + OPT_WD);
    uint64_t ds = dt_get_u64(p + OPT_DECAY_STEPS), ws = dt_get_u64(p + OPT_WARMUP);
    /* Beyond 2^50 a step count is refused by the schedule's check: keep the cast from wrapping. */
    s->decay_steps = ds > (uint64_t)DT_LR_MAX_STEPS ? DT_LR_MAX_STEPS + 1 : (int64_t)ds;
    s->warmup_steps = ws > (uint64_t)DT_LR_MAX_STEPS ? DT_LR_MAX_STEPS + 1 : (int64_t)ws;
    s->decay_rate = dt_get_f32(p + OPT_DECAY_RATE);
    s->alpha = dt_get_f32(p + OPT_ALPHA);
    for (int i = 0; i < DT_LR_MAX_BOUNDARIES; i++) {
        uint64_t b = dt_get_u64(p + OPT_BOUNDARIES + 8 * i);
        s->boundaries[i] = b > (uint64_t)DT_LR_MAX_STEPS ? DT_LR_MAX_STEPS + 1 : (int64_t)b;
    }
    for (int i = 0; i <= DT_LR_MAX_BOUNDARIES; i++) s->values[i] = dt_get_f32(p + OPT_VALUES + 4 * i);
    if (!(wd >= 0 && wd <= DT_WIRE_MAX_WEIGHT_DECAY))
        return dt_errorf(err, DT_EFORMAT, "INIT options: weight decay %g is not in 0..%g", (double)wd,
                         (double)DT_WIRE_MAX_WEIGHT_DECAY);
    int rc = dt_lr_schedule_check(s, err);
    if (rc) return dt_error_wrap(err, DT_EFORMAT, "INIT options: ");
    *weight_decay = wd;
    return DT_OK;
}

uint64_t dt_wire_max_frame(uint64_t shard_floats) {
    uint64_t init = dt_wire_init_bytes(DT_WIRE_MAX_SLOTS, shard_floats);
    uint64_t m = DT_WIRE_HEADER_SIZE > DT_WIRE_MAX_ERROR_TEXT ? DT_WIRE_HEADER_SIZE : DT_WIRE_MAX_ERROR_TEXT;
    if (dt_wire_sparse_max_frame() > m) m = dt_wire_sparse_max_frame();
    return init > m ? init : m;
}

uint64_t dt_wire_max_frame_ps0(uint64_t shard_floats) {
    uint64_t f = dt_wire_max_frame(shard_floats);
    return f > DT_WIRE_MAX_WORK_STATE ? f : DT_WIRE_MAX_WORK_STATE;
}

void dt_wire_error_text(char *out, size_t n, const void *payload, size_t len) {
    if (n == 0) return;
    const unsigned char *p = payload;
    size_t k = len < n - 1 ? len : n - 1;
    for (size_t i = 0; i < k; i++) out[i] = (p[i] >= 0x20 && p[i] < 0x7f) ? (char)p[i] : '?';
    out[k] = '\0';
}

const char *dt_wire_type_name(uint8_t type) {
    switch (type) {
    case DT_MSG_HELLO: return "HELLO";
    case DT_MSG_WELCOME: return "WELCOME";
    case DT_MSG_INIT: return "INIT";
    case DT_MSG_ACK: return "ACK";
    case DT_MSG_PULL: return "PULL";
    case DT_MSG_PARAMS: return "PARAMS";
    case DT_MSG_PUSH: return "PUSH";
    case DT_MSG_PUSH_ACK: return "PUSH_ACK";
    case DT_MSG_STATUS: return "STATUS";
    case DT_MSG_STATUS_REPLY: return "STATUS_REPLY";
    case DT_MSG_SHUTDOWN: return "SHUTDOWN";
    case DT_MSG_ERROR: return "ERROR";
    case DT_MSG_TOKEN: return "TOKEN";
    case DT_MSG_HEARTBEAT: return "HEARTBEAT";
    case DT_MSG_DONE: return "DONE";
    case DT_MSG_FETCH: return "FETCH";
    case DT_MSG_STATE: return "STATE";
    case DT_MSG_SPARSE_INIT: return "SPARSE_INIT";
    case DT_MSG_SPARSE_PULL: return "SPARSE_PULL";
    case DT_MSG_SPARSE_ROWS: return "SPARSE_ROWS";
    case DT_MSG_SPARSE_PUSH: return "SPARSE_PUSH";
    case DT_MSG_WORK_ASK: return "WORK_ASK";
    case DT_MSG_WORK_GRANT: return "WORK_GRANT";
    case DT_MSG_WORK_DONE: return "WORK_DONE";
    case DT_MSG_WORK_STATE: return "WORK_STATE";
    case DT_MSG_SPARSE_EXPORT: return "SPARSE_EXPORT";
    case DT_MSG_SPARSE_PAGE: return "SPARSE_PAGE";
    case DT_MSG_SPARSE_IMPORT: return "SPARSE_IMPORT";
    }
    return "unknown";
}

const char *dt_wire_role_name(uint8_t role) {
    switch (role) {
    case DT_ROLE_NONE: return "none";
    case DT_ROLE_PS: return "ps";
    case DT_ROLE_WORKER: return "worker";
    case DT_ROLE_CHIEF: return "chief";
    }
    return "unknown";
}

const char *dt_wire_status_name(int32_t status) {
    switch (status) {
    case DT_WIRE_OK: return "ok";
    case DT_WIRE_STALE: return "stale";
    case DT_WIRE_WORK_WAIT: return "no work now";
    case DT_WIRE_WORK_FINISHED: return "training finished";
    case DT_WIRE_E_VERSION: return "version mismatch";
    case DT_WIRE_E_MALFORMED: return "malformed message";
    case DT_WIRE_E_NOT_READY: return "not initialised";
    case DT_WIRE_E_SHARD: return "shard size mismatch";
    case DT_WIRE_E_ROLE: return "role not allowed";
    case DT_WIRE_E_UNSUPPORTED: return "unsupported";
    case DT_WIRE_E_BUSY: return "busy";
    case DT_WIRE_E_BAD_VALUE: return "bad value";
    case DT_WIRE_E_SHUTDOWN: return "shutting down";
    case DT_WIRE_E_GONE: return "step no longer kept";
    case DT_WIRE_E_RESYNC: return "re-initialised: pull again";
    case DT_WIRE_E_LOST: return "worker lost (strict)";
    case DT_WIRE_E_NOMEM: return "out of memory";
    }
    return "unknown status";
}
