/* The dtrain wire protocol (docs/protocol.md documents every byte).
 *
 * A message is one ZeroMQ multipart message: a fixed 104-byte little-endian header frame, then at
 * most one payload frame (raw float32 for INIT/PARAMS/PUSH, UTF-8 text for ERROR). The header
 * carries every field any message needs at a fixed offset; a type leaves the fields it does not
 * use at zero. The format is independent of the socket security (CURVE) and of ZMTP heartbeats, so
 * both can be switched on without touching it.
 *
 * This module is pure (no sockets): encode, decode and the bounds checks, so the decoder can be
 * fuzzed and every refusal tested without a network. Decoding checks the header's size, magic and
 * version first (a peer of another version gets a message naming both versions), then every field;
 * dt_wire_check_payload bounds the payload from the shard size the receiver already knows, before
 * anything is allocated or copied for it. */
#ifndef DT_TRANSPORT_WIRE_H
#define DT_TRANSPORT_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "compute/lazy_optim.h"
#include "compute/schedule.h"
#include "dtrain.h"
#include "transport/compress.h"

#define DT_WIRE_MAGIC "DTRN"          /* bytes 0..3 of every header */
#define DT_WIRE_VERSION 9u              /* 9: one sparse message per ps for all tables (docs/protocol.md) */
#define DT_WIRE_HEADER_SIZE 104u
#define DT_WIRE_MAX_ERROR_TEXT 1000u  /* ERROR payload bytes, at most */
#define DT_WIRE_MAX_SLOTS 2u          /* optimizer state floats per parameter (Adam) */
/* Largest shard a header may describe: 2^32 floats (16 GiB). Bounds every payload size product. */
#define DT_WIRE_MAX_SHARD_FLOATS (UINT64_C(1) << 32)
/* Sync mode (INIT): at most this many replicas (worker task indices are u16) and this staleness
 * bound; a ps holds at most (staleness + 1) * replicas_to_aggregate gradients of each chunk, at most
 * DT_WIRE_MAX_HELD_GRADIENTS (65,536 workers with staleness 0, 1,008 with staleness 64). */
#define DT_WIRE_MAX_REPLICAS 65536u
#define DT_WIRE_MAX_STALENESS 64u
#define DT_WIRE_MAX_HELD_GRADIENTS 65536u
/* The largest global_step or local_step a header may carry: 2^62, far enough below 2^63 that a ps's
 * step arithmetic (step + staleness + 2, step + 1024, a step applied) cannot overflow: 2^62 more
 * steps, at a billion a second, take 146 years. */
#define DT_WIRE_MAX_STEP (INT64_C(1) << 62)
/* PUSH: the most examples one gradient may say it averages (push.examples): the net's largest
 * batch (model/net.c) and the work plan's (DT_COORD_MAX_BATCH_SIZE). */
#define DT_WIRE_MAX_EXAMPLES (UINT64_C(1) << 20)

/* header.flags (other bits must be 0) */
#define DT_WIRE_F_EXACT 0x01u  /* PULL: global_step is the exact step wanted, not a minimum */
#define DT_WIRE_F_SYNC 0x02u   /* PUSH: a sync-mode gradient; local_step = the step it is for */
#define DT_WIRE_F_STRICT 0x04u /* INIT: a lost worker stops the job instead of lowering the replicas */
#define DT_WIRE_F_PULL 0x08u   /* PUSH: answer with this chunk's PARAMS (at least step global_step,
                                * the push's outcome in status) instead of PUSH_ACK */
#define DT_WIRE_F_ELASTIC 0x80u /* INIT, sync: workers join and leave (dynamic sharding): a worker counts
                                 * toward steps from its first message, not from INIT on */
#define DT_WIRE_F_JOIN 0x40u   /* WORK_ASK: this process has just started (what its task index held
                                * from an earlier life goes back to the pool) */
#define DT_WIRE_F_IMPORT 0x01u /* SPARSE_INIT: the chief restores the tables from a checkpoint: their rows
                                * follow (SPARSE_IMPORT); the ps holds every SPARSE_PULL until LAST */
#define DT_WIRE_F_LAST 0x01u   /* SPARSE_IMPORT: the chief's last to this ps (its rows may be none): the
                                * tables are whole, the held SPARSE_PULLs are answered */
#define DT_WIRE_F_IMPORTING 0x01u /* WELCOME, STATUS_REPLY: the ps waits for the chief's LAST (its tables are
                                   * not whole): a chief starting now initialises it again */
#define DT_WIRE_F_WAITING 0x40u /* DONE: the worker sits steps out until ps 0 has work for it (sync,
                                 * dynamic sharding): it has not ended, and stays a member */
/* Bits 4-5 of the flags byte: the encoding (dt_encoding: 0 float32, 1 bf16, 2 fp16; 3 is refused)
 * of a PUSH's or PARAMS' payload, and of the PARAMS a PULL or a PUSH with the PULL flag asks for.
 * Decoded into dt_wire_header.encoding, not flags. */
#define DT_WIRE_ENC_SHIFT 4u
#define DT_WIRE_ENC_MASK 0x30u
#define DT_WIRE_MAX_CHUNKS 255u /* a shard is cut into at most this many chunks */
#define DT_WIRE_CHUNK_BYTES_DEFAULT (64u << 10) /* the chief's default cut: parts of about 64 KiB (BENCHMARKS.md, "Eight workers") */

typedef enum {
    DT_MSG_HELLO = 1,      /* client -> ps: version and role check; shard_floats = expected (0 any) */
    DT_MSG_WELCOME = 2,    /* ps -> client: shard_floats, initialised, global_step, optimizer */
    DT_MSG_INIT = 3,       /* chief -> ps: payload params[n] ++ state[slots*n] ++ options ++ decay bits;
                            * optimizer in header */
    DT_MSG_ACK = 4,        /* ps -> client: INIT or SHUTDOWN done; global_step */
    DT_MSG_PULL = 5,       /* client -> ps: global_step = oldest step wanted (0: current) */
    DT_MSG_PARAMS = 6,     /* ps -> client: payload params[chunk]; global_step = their step */
    DT_MSG_PUSH = 7,       /* client -> ps: payload grads[chunk]; local_step = the worker's step */
    DT_MSG_PUSH_ACK = 8,   /* ps -> client: status OK or STALE; global_step after the push */
    DT_MSG_STATUS = 9,     /* client -> ps */
    DT_MSG_STATUS_REPLY = 10, /* ps -> client: initialised, global_step, counters */
    DT_MSG_SHUTDOWN = 11,  /* chief -> ps: training is over; ps replies ACK and exits 0 */
    DT_MSG_ERROR = 12,     /* either way: status = DT_WIRE_E_*, payload = text */
    DT_MSG_TOKEN = 13,     /* reserved, unused: the sync barrier is a held PULL; a ps answers UNSUPPORTED */
    DT_MSG_HEARTBEAT = 14, /* either way: liveness probe, answered with HEARTBEAT + global_step */
    DT_MSG_DONE = 15,      /* worker -> ps: this worker has finished training; ps replies ACK */
    DT_MSG_FETCH = 16,     /* client -> ps: the whole shard state, for a checkpoint */
    DT_MSG_STATE = 17,     /* ps -> client: payload params[n] ++ state[slots*n]; optimizer, global_step */
    /* Sparse tables (docs/sparse.md): SPARSE_INIT's header says how many tables (sparse.ids); a
     * SPARSE_PULL, _ROWS or _PUSH carries sections, one per table, and its header says how many, the
     * ids and the floats of them all (sections.*), each bounded below. */
    DT_MSG_SPARSE_INIT = 18, /* chief -> ps: payload sparse.ids table records (dt_wire_table); ACK */
    DT_MSG_SPARSE_PULL = 19, /* client -> ps: payload section records[sections] ++ ids u64[ids];
                              * global_step = oldest step wanted of every table named */
    DT_MSG_SPARSE_ROWS = 20, /* ps -> client: payload rows[floats] in the encoding asked for, every
                              * section's in order; global_step = the least step of its tables */
    DT_MSG_SPARSE_PUSH = 21, /* client -> ps: payload section records ++ ids u64[ids] ++ grads[floats];
                              * local_step; part chunk of chunks; ACK with status OK or STALE (some
                              * section stale) and push_ack.stale_count */
    /* Dynamic data sharding (docs/elastic.md): ps 0 coordinates; other ps answer UNSUPPORTED. */
    DT_MSG_WORK_ASK = 22,  /* worker -> ps 0: a unit, please (flag JOIN); its data plan in work_ask */
    DT_MSG_WORK_GRANT = 23, /* ps 0 -> worker: status OK (work_grant), WORK_WAIT or WORK_FINISHED */
    DT_MSG_WORK_DONE = 24, /* worker -> ps 0: claims batch work_done.batch of work_done.epoch for its
                            * gradient of step local_step (sent before that push); ps 0 answers ACK
                            * with status OK or STALE */
    DT_MSG_WORK_STATE = 25, /* chief -> ps 0: with a payload, install that coordinator state (ACK);
                             * without, fetch it; ps 0 -> chief: payload = the state */
    /* Sparse tables in checkpoints (docs/sparse.md, "Checkpoints"): a table's rows out of a ps page by
     * page, and into it; rows carry their optimizer slots (opt_kind: the table's dt_lazy_kind). */
    DT_MSG_SPARSE_EXPORT = 26, /* client -> ps: the rows of sparse.table from `cursor` on, at most sparse.ids */
    DT_MSG_SPARSE_PAGE = 27,   /* ps -> client: payload ids u64[n] ++ rows[n][(1 + slots) dim]; cursor: the
                                * next request's (0: no row left); global_step: the table's step */
    DT_MSG_SPARSE_IMPORT = 28, /* chief -> ps: payload as SPARSE_PAGE's, rows this ps owns; ACK */
} dt_msg_type;
#define DT_MSG_TYPE_MAX 28
/* The largest WORK_STATE payload: the coordinator's largest state (src/ps/coord.h checks that they
 * agree): a 72-byte header, a bit per unit and 12 bytes per partial unit, 2^18 units. */
/* Counters per row of a sparse table's admission sketch (4 rows of 1 byte: the sketch is at most
 * 256 MiB, allocated when SPARSE_INIT declares the table). */
#define DT_WIRE_MAX_SKETCH_WIDTH (UINT32_C(1) << 26)
#define DT_WIRE_MAX_WORK_STATE (72u + (1u << 18) / 8 + 12u * (1u << 18))

/* The sender's role. Only the chief may INIT or SHUTDOWN a ps. */
typedef enum { DT_ROLE_NONE = 0, DT_ROLE_PS = 1, DT_ROLE_WORKER = 2, DT_ROLE_CHIEF = 3 } dt_wire_role;
#define DT_ROLE_MAX 3

/* header.status: a reply's outcome (PUSH_ACK) or an ERROR's cause. */
enum {
    DT_WIRE_OK = 0,
    DT_WIRE_STALE = 1,           /* PUSH_ACK: gradient older than the ps's step, dropped and counted;
                                  * ACK of WORK_DONE: the claim's step is applied already */
    DT_WIRE_WORK_WAIT = 2,       /* WORK_GRANT: no unit now (every unit of the epoch is granted): ask again */
    DT_WIRE_WORK_FINISHED = 3,   /* WORK_GRANT: the last epoch is done */
    DT_WIRE_E_VERSION = 100,     /* other protocol version */
    DT_WIRE_E_MALFORMED = 101,   /* bad header or payload */
    DT_WIRE_E_NOT_READY = 102,   /* ps not initialised by the chief yet */
    DT_WIRE_E_SHARD = 103,       /* shard size differs from what the peer expects */
    DT_WIRE_E_ROLE = 104,        /* only the chief may do this */
    DT_WIRE_E_UNSUPPORTED = 105, /* known type this peer does not serve */
    DT_WIRE_E_BUSY = 106,        /* too many deferred requests */
    DT_WIRE_E_BAD_VALUE = 107,   /* a field's value is refused (optimizer config, step) */
    DT_WIRE_E_SHUTDOWN = 108,    /* ps is shutting down: deferred requests are answered with this */
    DT_WIRE_E_GONE = 109,        /* PULL of an exact step the ps no longer keeps */
    DT_WIRE_E_RESYNC = 110,      /* the ps's step is not what the request assumes (the chief
                                  * re-initialised it: a rollback): pull again */
    DT_WIRE_E_LOST = 111,        /* strict mode: a worker was lost, the job stops */
    DT_WIRE_E_NOMEM = 112,       /* the ps is out of memory for this request (nothing changed) */
};

typedef struct {
    uint16_t version;       /* filled by decode; encode always writes DT_WIRE_VERSION */
    uint8_t type;           /* dt_msg_type */
    uint8_t flags;          /* DT_WIRE_F_* allowed for the type; others 0 */
    /* PUSH, PARAMS: the payload's dt_encoding; PULL, and a PUSH with the PULL flag: the encoding
     * the PARAMS are wanted in (a PUSH's gradient and its PARAMS share one). Other types: 0. On the
     * wire: bits 4-5 of the flags byte. */
    uint8_t encoding;
    uint8_t role;           /* dt_wire_role of the sender */
    uint16_t task;          /* sender's task index */
    uint32_t request_id;    /* chosen by the requester, echoed in the reply */
    int64_t global_step;    /* >= 0 */
    union {                 /* >= 0; bytes 24-31 */
        int64_t local_step; /* PUSH: the worker's step */
        int64_t liveness_ms; /* INIT: a sync-mode worker silent this long is lost (0: never) */
        int64_t workers_busy; /* STATUS_REPLY: members of ps 0's work plan besides the asker that
                               * joined and have neither left (DONE) nor been lost; 0 elsewhere */
        int64_t cursor;      /* SPARSE_EXPORT: where the walk of the table's rows stands (0: the start);
                              * SPARSE_PAGE: the next request's cursor (0: every row was sent) */
    };
    uint64_t payload_bytes; /* size of the payload frame; 0: no payload frame */
    uint32_t shard;         /* ps index the message is for / from */
    int32_t status;         /* DT_WIRE_OK / STALE / E_* */
    uint64_t shard_floats;  /* HELLO: expected (0 any); WELCOME, INIT: the shard size */
    uint8_t opt_kind;       /* INIT, WELCOME, STATE: dt_opt_kind; SPARSE_EXPORT, _PAGE, _IMPORT: the table's
                             * dt_lazy_kind */
    uint8_t opt_slots;      /* INIT, WELCOME, STATE: state floats per parameter, <= DT_WIRE_MAX_SLOTS;
                             * SPARSE_EXPORT, _PAGE, _IMPORT: the table's slots per value (dt_lazy_slots) */
    /* Every ps reply: 0 not initialised, else the generation 1..255 of the INIT that set the shard
     * (the chief numbers each (re-)initialisation, so a client can tell that every shard comes from
     * the same one). INIT: the generation it sets (1..255). */
    uint8_t generation;
    /* PUSH, PULL, PARAMS, PUSH_ACK: the chunk (0..chunks-1) of the shard cut into `chunks` even
     * parts (dt_wire_chunk). INIT: the cut the ps uses from now on. Other ps replies: the ps's cut
     * (0 before INIT). Other requests: 0, 0. */
    uint8_t chunk, chunks;
    float learning_rate, momentum, beta1, beta2, epsilon; /* INIT, WELCOME, STATE */
    /* Bytes 80-103: three u64 whose meaning depends on the type (docs/protocol.md), each named
     * here for what it carries; a type that uses none leaves them 0. */
    union {
        uint64_t counters[3]; /* the raw view, for encode and decode */
        struct {              /* INIT: the sync configuration */
            uint64_t replicas_to_aggregate; /* 0: asynchronous */
            uint64_t total_num_replicas;    /* the workers (async too) */
            uint64_t staleness;
        } init;
        struct { /* STATUS_REPLY */
            /* workers_done: distinct workers whose DONE stands, plus, on ps 0 with a work plan,
             * members lost (docs/elastic.md, "The end of a job") */
            uint64_t updates, params_replies, workers_done;
        } status_reply;
        struct { /* PARAMS */
            uint64_t waited_us;   /* how long the PULL was held at the ps (the sync barrier) */
            uint64_t stale_count; /* answering a PUSH with the PULL flag: this worker's stale gradients */
        } params;
        struct { /* PUSH: every chunk of one gradient says the same */
            uint64_t examples; /* the examples the gradient averages, 1..DT_WIRE_MAX_EXAMPLES: a sync ps
                                * weights each gradient of a step by them; 0: not said (unweighted) */
        } push;
        struct { /* PUSH_ACK */
            uint64_t stale_count; /* this worker's stale gradients so far */
        } push_ack;
        struct { /* STATE */
            uint64_t step_max; /* the step of the chunk furthest ahead (global_step: the one behind) */
        } state;
        struct { /* SPARSE_INIT (ids only: the tables it declares), SPARSE_EXPORT, _PAGE, _IMPORT */
            uint64_t table;    /* 0..DT_WIRE_MAX_TABLES-1 */
            uint64_t ids;      /* ids (rows) in the payload; SPARSE_EXPORT: the most rows wanted */
            uint64_t dim;      /* floats per row, 1..DT_WIRE_MAX_SPARSE_DIM */
        } sparse;
        struct { /* SPARSE_PULL, SPARSE_ROWS, SPARSE_PUSH: every section together (a reply: its request's) */
            uint64_t count;    /* sections, 1..DT_WIRE_MAX_SPARSE_SECTIONS */
            uint64_t ids;      /* ids of all sections */
            uint64_t floats;   /* values of all their rows: the sum of each section's ids x dim */
        } sections;
        struct { /* WORK_ASK: the worker's data plan, checked against ps 0's */
            uint64_t examples, batch_size, seed;
        } work_ask;
        struct { /* WORK_GRANT, status OK: the unit, and the mask of its batches to train (bit i:
                  * batch unit * unit_batches + i of the epoch) */
            uint64_t epoch, unit, mask;
        } work_grant;
        struct { /* WORK_DONE: the batch claimed (of the epoch), for the gradient of step local_step */
            uint64_t epoch, batch;
        } work_done;
    };
} dt_wire_header;

/* A zeroed header of the given type (version set). */
dt_wire_header dt_wire_header_make(dt_msg_type type, dt_wire_role role, uint16_t task,
                                   uint32_t request_id);

/* out [DT_WIRE_HEADER_SIZE] */
void dt_wire_encode(uint8_t *out, const dt_wire_header *h);

/* Decodes and validates one header frame of len bytes. Checks, in this order: at least the magic
 * and version are present, the magic, the version (message names both versions), the exact size,
 * the type, flags (per type), role, reserved bytes, steps >= 0, payload presence per type, the
 * optimizer fields, INIT's sync configuration. Returns DT_EPROTO for a version mismatch, DT_EFORMAT otherwise. */
int dt_wire_decode(dt_wire_header *out, const void *buf, size_t len, dt_error *err);

/* The request id of a header that failed to decode (so the refusal can be matched by the peer):
 * bytes 12..15 if the frame is long enough and starts with the magic, else 0. Every protocol
 * version keeps the magic, version and request id at these offsets. */
uint32_t dt_wire_peek_request_id(const void *buf, size_t len);

/* INIT's payload after the parameters and optimizer state (docs/protocol.md, "INIT options"): a
 * block of DT_WIRE_OPTS_BYTES with the learning-rate schedule and the weight decay, then the decay
 * mask, one bit per float of the shard (LSB first; 1: weight decay applies), ceil(n / 8) bytes. */
#define DT_WIRE_OPTS_BYTES 232u
#define DT_WIRE_MAX_WEIGHT_DECAY 10.0f /* --weight_decay's range: 0..10 */
uint64_t dt_wire_init_bytes(unsigned opt_slots, uint64_t shard_floats);
void dt_wire_opts_encode(uint8_t *out, const dt_lr_schedule *s, float weight_decay);
/* Decodes and checks a block of len bytes (must be DT_WIRE_OPTS_BYTES): known kind, flags 0 or 1,
 * reserved bytes zero, every field in range for its kind and unused ones zero, weight decay in
 * 0..DT_WIRE_MAX_WEIGHT_DECAY. */
int dt_wire_opts_decode(dt_lr_schedule *s, float *weight_decay, const void *buf, size_t len, dt_error *err);

/* ---- Sparse tables (wire_sparse.c; docs/protocol.md, "Sparse tables") ----------------------------
 * Bounds a peer cannot exceed, each named in the refusal: */
#define DT_WIRE_MAX_TABLES 1024u          /* table ids 0..1023; tables per SPARSE_INIT */
#define DT_WIRE_MAX_SPARSE_IDS 65536u     /* ids per message (SPARSE_PULL, _ROWS, _PUSH: all sections') */
#define DT_WIRE_MAX_SPARSE_DIM 1024u      /* floats per row */
#define DT_WIRE_MAX_SPARSE_FLOATS (1u << 20) /* ids x dim per message (4 MiB of float32 rows) */
#define DT_WIRE_MAX_SPARSE_SECTIONS 1024u /* sections (tables, each named once) per SPARSE_PULL, _ROWS, _PUSH */
#define DT_WIRE_SECTION_BYTES 8u          /* one section record: u16 table, u16 dim, u32 ids */
#define DT_WIRE_MAX_SPARSE_STEP_ROWS (1u << 20) /* sync: rows one worker's push of one step of one table
                                                 * may hold at a ps, over its parts */
#define DT_WIRE_TABLE_BYTES 80u           /* one table record of SPARSE_INIT */
#define DT_WIRE_TABLE_F_ROW_MEAN 0x01u    /* record flags: sync steps divide each row's sum by the replicas
                                           * that sent it (TF's SparseConditionalAccumulator), not by all */
#define DT_WIRE_TABLE_F_BUCKETS 0x02u     /* a table of buckets: its ids are below its capacity, spread over
                                           * the ps tasks (a ps refuses other ids and bounds its share) */
#define DT_WIRE_TABLE_FLAGS (DT_WIRE_TABLE_F_ROW_MEAN | DT_WIRE_TABLE_F_BUCKETS)

/* One table as SPARSE_INIT declares it (the ps's dt_table_config, and the sync rule). */
typedef struct {
    uint32_t table, dim;
    uint8_t init_kind;        /* 0 zeros, 1 uniform, 2 normal (truncated) */
    uint8_t flags;            /* DT_WIRE_TABLE_F_* */
    uint8_t min_count;        /* admission */
    uint32_t sketch_width;    /* 0: the default */
    dt_lazy_config opt;
    float init_scale;
    uint64_t capacity, expire_steps, seed;
} dt_wire_table;

void dt_wire_table_encode(uint8_t *out, const dt_wire_table *t);
/* len must be DT_WIRE_TABLE_BYTES; every field in range (the optimizer's by dt_lazy_config_check),
 * reserved bytes zero; DT_EFORMAT naming the field otherwise. */
int dt_wire_table_decode(dt_wire_table *t, const void *buf, size_t len, dt_error *err);
/* A section of a SPARSE_PULL or SPARSE_PUSH: its record, and where its ids and rows lie among the
 * message's (the sections' ids follow the records, in the records' order; a push's rows follow the
 * ids, in the same order). */
typedef struct {
    uint32_t table, dim, ids;
    size_t first;             /* its first id's index among the message's ids */
    size_t at;                /* its first value's index among the message's floats */
} dt_wire_section;
void dt_wire_section_encode(uint8_t *out, uint32_t table, uint32_t dim, uint32_t ids);
/* The section records of a SPARSE_PULL's or SPARSE_PUSH's payload of len bytes (its header decoded)
 * into out [h->sections.count]: the payload of the header's size, each table below
 * DT_WIRE_MAX_TABLES and named once, dim 1..DT_WIRE_MAX_SPARSE_DIM, at least one id a section in a
 * pull, the sections' ids adding up to sections.ids and their ids x dim to sections.floats. DT_EFORMAT
 * naming the section, its table and the bound otherwise. */
int dt_wire_sections_decode(dt_wire_section *out, const dt_wire_header *h, const void *payload, size_t len,
                            dt_error *err);
/* Where a SPARSE_PULL's or SPARSE_PUSH's ids start in its payload (after the section records), and a
 * push's rows (after the ids). */
size_t dt_wire_sections_ids_at(const dt_wire_header *h);
size_t dt_wire_sections_rows_at(const dt_wire_header *h);
/* The sparse fields of a SPARSE_* header within their bounds (called by dt_wire_decode). SPARSE_EXPORT,
 * _PAGE and _IMPORT: also the optimizer (a dt_lazy_kind and its slot count), and their rows' floats,
 * ids x dim x (1 + slots), within DT_WIRE_MAX_SPARSE_FLOATS. */
int dt_wire_check_sparse(const dt_wire_header *h, dt_error *err);
/* A SPARSE_* message's payload size from its header (which dt_wire_check_sparse bounded). */
uint64_t dt_wire_sparse_bytes(const dt_wire_header *h);
/* The largest SPARSE_* frame. */
uint64_t dt_wire_sparse_max_frame(void);
int dt_wire_type_is_sparse(uint8_t type); /* SPARSE_INIT..SPARSE_PUSH, SPARSE_EXPORT..SPARSE_IMPORT */
int dt_wire_type_has_sections(uint8_t type); /* SPARSE_PULL, SPARSE_ROWS, SPARSE_PUSH */

/* SPARSE_PAGE's and SPARSE_IMPORT's payload: ids u64[n], then rows[n][(1 + slots) dim] float32, each
 * row its values then slot 0 then slot 1 (dt_table_export's layout). */
typedef struct {
    size_t n, dim, slots;
    const uint8_t *ids, *rows;
} dt_wire_rows;
/* Checks such a payload of a header that decoded (its size from the header, every id below max_id
 * (0: any id), every value finite, and the slots an optimizer only grows within their range:
 * Adagrad's accumulator > 0, FTRL's n and Adam's v >= 0), and points *out into it. DT_EFORMAT
 * naming the row, its id and the bound otherwise. */
int dt_wire_rows_check(dt_wire_rows *out, const dt_wire_header *h, const void *payload, size_t len, uint64_t max_id,
                       dt_error *err);
uint64_t dt_wire_rows_id(const dt_wire_rows *r, size_t i);
/* Row i's (1 + slots) dim floats into out. */
void dt_wire_rows_get(const dt_wire_rows *r, size_t i, float *out);
/* Rows whose floats fit one message: ids x dim x (1 + slots) <= DT_WIRE_MAX_SPARSE_FLOATS, ids <=
 * DT_WIRE_MAX_SPARSE_IDS. */
size_t dt_wire_rows_per_msg(size_t dim, size_t slots);

/* Whether a message of this type carries a payload frame. */
int dt_wire_type_has_payload(uint8_t type);

/* Bounds h->payload_bytes for a receiver whose peer shard holds shard_floats floats: PUSH and
 * PARAMS exactly their chunk's floats times the encoding's size (4 or 2 bytes), STATE exactly
 * (1 + opt_slots)*shard_floats*4, INIT dt_wire_init_bytes, ERROR at most DT_WIRE_MAX_ERROR_TEXT,
 * others 0. Call before receiving or allocating anything for the payload. */
int dt_wire_check_payload(const dt_wire_header *h, uint64_t shard_floats, dt_error *err);

/* Chunk `chunk` of a shard of shard_floats cut into `chunks` even parts: floats [*off, *off + *len).
 * Both sides compute it, so a PUSH or PARAMS payload is bounded before it is read. */
void dt_wire_chunk(uint64_t shard_floats, unsigned chunks, unsigned chunk, uint64_t *off, uint64_t *len);

/* The cut for parts of about chunk_bytes (0: one part), 1..DT_WIRE_MAX_CHUNKS. */
unsigned dt_wire_chunks_for(uint64_t shard_floats, uint64_t chunk_bytes);

/* The largest frame a receiver with this shard size can legitimately get (for ZMQ_MAXMSGSIZE). */
uint64_t dt_wire_max_frame(uint64_t shard_floats);
/* The same for ps 0 and its clients, which may also carry the coordinator's state (WORK_STATE). */
uint64_t dt_wire_max_frame_ps0(uint64_t shard_floats);

/* Copies an ERROR payload into out (NUL-terminated, at most n-1 bytes), replacing bytes that are
 * not printable ASCII by '?', so a peer's text is safe to print. */
void dt_wire_error_text(char *out, size_t n, const void *payload, size_t len);

const char *dt_wire_type_name(uint8_t type);   /* "PUSH"; "unknown" for other values */
const char *dt_wire_role_name(uint8_t role);   /* "ps", "worker", "chief", "none" */
const char *dt_wire_status_name(int32_t status);

#endif
