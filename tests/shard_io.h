/* Shared by the shard tests (test_shard.c, test_shard_sparse.c): a ps_io that records every reply
 * (its header, the first floats or the text of its payload), admits and holds as told, and the
 * chief's INIT of a shard of n floats, all 1, sgd with learning rate 1. No sockets. */
#ifndef DT_TESTS_SHARD_IO_H
#define DT_TESTS_SHARD_IO_H

#include <stdlib.h>
#include <string.h>

#include "compute/optim.h"
#include "ps/shard.h"
#include "test.h"

enum { REC_FLOATS = 64, MAX_REPLIES = 512 };

/* ---- A recording ps_io ------------------------------------------------------------------------ */

typedef struct {
    const void *conn;
    dt_wire_header h;
    size_t size;
    float first[REC_FLOATS];  /* the payload's first floats (PARAMS, SPARSE_ROWS) */
    char text[256];
} reply;

typedef struct {
    reply r[MAX_REPLIES];
    int n;
    int refuse_admit;         /* admit says no */
    long admitted, held;      /* bytes admitted and not yet released; origins held */
    int released;             /* payloads released */
} recorder;

typedef struct {
    recorder *rec;
    size_t admitted;
} release_ctx;

/* Called with every reply's whole payload before it is released, when set (a test that reads more
 * than its first floats). */
static void (*rec_capture)(const dt_wire_header *h, const void *payload, size_t size);

static void rec_send(void *user, const ps_origin *to, dt_wire_header *h, dt_bytes *payload, size_t admitted) {
    recorder *rec = user;
    if (rec_capture && payload) rec_capture(h, payload->data, payload->size);
    CHECK(rec->n < MAX_REPLIES);
    if (rec->n >= MAX_REPLIES) return;
    reply *r = &rec->r[rec->n++];
    memset(r, 0, sizeof *r);
    r->conn = to->conn;
    r->h = *h;
    if (!payload) return;
    r->size = payload->size;
    if (h->type == DT_MSG_ERROR)
        snprintf(r->text, sizeof r->text, "%.*s", (int)payload->size, (const char *)payload->data);
    else
        memcpy(r->first, payload->data, payload->size < sizeof r->first ? payload->size : sizeof r->first);
    rec->admitted -= (long)admitted; /* sent at once: the "kernel" has it */
    if (payload->release) rec->released++;
    dt_bytes_release(payload);
}

static int rec_admit(void *user, const ps_origin *to, size_t bytes, char *why, size_t len) {
    recorder *rec = user;
    if (rec->refuse_admit) {
        snprintf(why, len, "busy: test says no");
        return 1;
    }
    rec->admitted += (long)bytes;
    return 0;
}

static void rec_unadmit(void *user, const ps_origin *to, size_t bytes) { ((recorder *)user)->admitted -= (long)bytes; }

static int rec_hold(void *user, const ps_origin *from, ps_origin *kept) {
    ((recorder *)user)->held++;
    *kept = *from;
    kept->addr = NULL;
    return 0;
}

static void rec_drop(void *user, ps_origin *kept) { ((recorder *)user)->held--; }

static recorder rec;
static const ps_io io = {.user = &rec, .send = rec_send, .admit = rec_admit, .unadmit = rec_unadmit,
                         .hold = rec_hold, .drop = rec_drop};
static int conns[8]; /* their addresses are the connections */

static ps_origin from(int conn) { return (ps_origin){.conn = &conns[conn], .serial = (uint64_t)conn + 1, .addr = "test"}; }

static reply *last(void) { return rec.n ? &rec.r[rec.n - 1] : NULL; }

static dt_wire_header hdr(dt_msg_type type, dt_wire_role role, uint16_t task) {
    dt_wire_header h = dt_wire_header_make(type, role, task, 7);
    h.shard = 0;
    return h;
}

/* The global step shard_init_n's INIT starts at (and test_shard_sparse.c's SPARSE_INIT): 0 unless a
 * test sets it. */
static int64_t init_step;

/* INIT of n floats all 1, sgd lr 1, cut into `chunks`; sync with aggregate of total replicas
 * (aggregate 0: async). */
static void shard_init_n(ps_shard *s, size_t n, int chunks, int aggregate, int total, int staleness,
                         int64_t liveness_ms, int strict, int64_t now) {
    size_t size = n * 4 + DT_WIRE_OPTS_BYTES + (n + 7) / 8;
    uint8_t *payload = calloc(1, size);
    for (size_t i = 0; i < n; i++) {
        float v = 1.0f;
        memcpy(payload + 4 * i, &v, 4);
    }
    dt_lr_schedule sched = {0};
    dt_wire_opts_encode(payload + n * 4, &sched, 0.0f);
    dt_wire_header h = hdr(DT_MSG_INIT, DT_ROLE_CHIEF, 0);
    h.shard_floats = n;
    h.chunks = (uint8_t)chunks;
    h.generation = 1;
    h.opt_kind = DT_OPT_SGD;
    h.learning_rate = 1.0f;
    h.init.replicas_to_aggregate = (uint64_t)aggregate;
    h.init.total_num_replicas = (uint32_t)total;
    h.init.staleness = (uint64_t)staleness;
    h.liveness_ms = liveness_ms;
    h.global_step = init_step;
    if (strict & 1) h.flags |= DT_WIRE_F_STRICT;
    if (strict & 2) h.flags |= DT_WIRE_F_ELASTIC; /* strict 2: INIT's ELASTIC flag (dynamic sharding) */
    h.payload_bytes = size;
    ps_origin o = from(0);
    dt_bytes b = {.data = payload, .size = size, .release = free, .hint = payload};
    ps_shard_request(s, &o, &h, &b, now, &io);
}

static ps_shard *shard_new_n(size_t n) {
    memset(&rec, 0, sizeof rec);
    ps_shard *s = NULL;
    ps_shard_config cfg = {.ps_index = 0, .shard_floats = n, .log = getenv("DT_TEST_VERBOSE") ? stderr : NULL};
    CHECK(ps_shard_new(&s, &cfg, NULL) == DT_OK);
    return s;
}

/* Frees the shard: every origin it held dropped, every admitted byte given back. */
static void shard_done(ps_shard *s) {
    ps_shard_free(s, &io);
    CHECK_MSG(rec.held == 0, "%ld origins still held", rec.held);
    CHECK_MSG(rec.admitted == 0, "%ld admitted bytes not given back", rec.admitted);
}

#endif
