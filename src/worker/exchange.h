/* The ps client's exchange core: one exchange of requests with the ps tasks and the replies it
 * awaits, per ps and chunk, as a state machine without sockets. ps_client.c owns the sockets: it
 * takes each request's id from here, sends it, says that it went out, and hands every reply it
 * receives to dt_ex_reply, which says whether it was awaited and what it means;
 * tests/test_exchange.c drives the machine directly.
 *
 * An exchange is one call's requests, all of one kind: per chunk of every ps (a PUSH, answered
 * with PUSH_ACK; a PULL, or a PUSH asking for its chunk back, answered with PARAMS), one per ps
 * (HELLO, INIT, STATUS, FETCH, DONE, SHUTDOWN), or one to a single ps (the WORK messages go to
 * ps 0 alone, the work coordinator: kind.alone; every other ps has no slot, and a reply from it
 * is ignored as UNKNOWN). Its states:
 *
 *   IDLE --begin--> OPEN --the last planned reply is in--> DONE --end--> IDLE
 *                    ^                                       |
 *                    '-- repull (sync: exact PULLs of the ---'
 *                        chunks a step apart)
 *   OPEN or DONE --an ERROR or malformed reply, a timeout, a dropped ps, a caller's failure--> FAILED --end--> IDLE
 *
 * and each slot's (a chunk of a ps; the ps itself for a per-ps request):
 *
 *   UNSENT --sent--> AWAITED --its reply--> ARRIVED --repull--> UNSENT
 *                    AWAITED --sent again (a HELLO resent)--> AWAITED: the earlier ids still answer it
 *
 * A reply is taken only when it answers an AWAITED slot of the ps it came from; anything else is
 * ignored and says why: a reply to an earlier exchange (one that failed or timed out), a second
 * reply to one request, a reply once the exchange has failed. Request ids are unique across
 * exchanges. Time is passed in, in microseconds (the client reads core/clock.h's dt_clock_us).
 *
 * Not thread-safe: one per client. */
#ifndef DT_WORKER_EXCHANGE_H
#define DT_WORKER_EXCHANGE_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain.h"
#include "transport/wire.h"

typedef enum { DT_EX_IDLE, DT_EX_OPEN, DT_EX_DONE, DT_EX_FAILED } dt_ex_state;
typedef enum { DT_EX_UNUSED, DT_EX_UNSENT, DT_EX_AWAITED, DT_EX_ARRIVED } dt_ex_slot_state;

/* Why a reply was ignored (dt_ex_reply_info.ignored). */
typedef enum {
    DT_EX_NOT_IGNORED = 0,
    DT_EX_UNKNOWN,            /* no request of this exchange to this ps had its id: an earlier exchange's */
    DT_EX_DUPLICATE,          /* its request was answered already */
    DT_EX_LATE,               /* the exchange is not open (it failed, or every reply is in) */
} dt_ex_ignored;

/* What an exchange sends and awaits. */
typedef struct {
    uint8_t want;             /* the reply each request awaits: PARAMS and PUSH_ACK are per chunk */
    int64_t min_step;         /* PARAMS: the oldest step a chunk may come back at */
    int64_t timeout_us;       /* replies are due this long after the latest request */
    /* Sparse tables (SPARSE_PULL answered by SPARSE_ROWS, SPARSE_PUSH by ACK): chunks[ps] requests
     * to each ps (0..DT_WIRE_MAX_CHUNKS), one slot each, a reply matched to its slot by request id
     * alone (these replies name no chunk). */
    int multi;
    int alone;                /* a per-ps request to ps `ps` only (the WORK messages: ps 0) */
    int ps;
} dt_ex_kind;

typedef struct {
    int chunk;                /* the slot it answered */
    uint8_t req;              /* the type of the request it answered */
    int64_t sent_us;          /* when that request went out */
    int refused;              /* an ERROR reply (dt_ex_refusal has its status) */
    int accepted;             /* a chunk reply with status OK (a PUSH's gradient was taken, not stale) */
    dt_ex_ignored ignored;    /* DT_EX_IGNORED: why */
} dt_ex_reply_info;

enum { DT_EX_IGNORED = 0, DT_EX_TAKEN = 1 };

typedef struct dt_exchange dt_exchange;

/* For n_ps ps tasks holding shard_floats[i] floats (copied); names[i] (kept, not copied: they must
 * outlive the exchange) names ps i in messages ("ps 1 at tcp://host:port: ..."). */
int dt_ex_open(dt_exchange **out, int n_ps, const size_t *shard_floats, const char *const *names, dt_error *err);
void dt_ex_close(dt_exchange *x);

/* Begins an exchange (from IDLE only: a client refuses a call while one is under way): chunks[ps]
 * slots per ps (its cut) for PARAMS and PUSH_ACK, one per ps otherwise (chunks may be NULL), or
 * one for kind->ps alone (kind->alone; not with PARAMS or PUSH_ACK), every one UNSENT. Returns
 * DT_OK, or DT_EINVAL on a broken invariant (dt_ex_begin from another state, a ps out of range). */
int dt_ex_begin(dt_exchange *x, const dt_ex_kind *kind, const int *chunks, int64_t now_us);

/* The id the next request carries (never 0, which means "no id"). */
uint32_t dt_ex_new_id(dt_exchange *x);

/* Request id, of type req, for slot (ps, chunk) went out at now: awaited, due a timeout after
 * the latest request. An UNSENT slot, or an AWAITED one sent again. DT_EINVAL on a broken
 * invariant. */
int dt_ex_sent(dt_exchange *x, int ps, int chunk, uint8_t req, uint32_t id, int64_t now_us);

/* A reply h (payload of len bytes) came from ps. DT_EX_TAKEN when it answered an awaited request
 * and means what the request asked for (info: which), DT_EX_IGNORED when it answered nothing
 * awaited (info->ignored: why), or an error code when it breaks the protocol or refuses the
 * request: the exchange has FAILED and err names the ps, its address and the cause. A PARAMS
 * payload is the caller's to use: its size and its chunk were checked here. */
int dt_ex_reply(dt_exchange *x, int ps, const dt_wire_header *h, const void *payload, size_t len,
                dt_ex_reply_info *info, dt_error *err);

/* The caller failed the exchange (a send failed, a reply it could not use, a timeout): FAILED, no
 * reply is awaited any more. */
void dt_ex_fail(dt_exchange *x);

/* ps's connection was replaced: the replies it awaited will never come (the exchange FAILS if
 * there were any). */
void dt_ex_drop_ps(dt_exchange *x, int ps);

/* The first ps with a reply still due at now_us past the deadline, or -1. */
int dt_ex_overdue(const dt_exchange *x, int64_t now_us);
int64_t dt_ex_deadline(const dt_exchange *x);
/* The replies are due by cap at the latest (this process is being stopped). */
void dt_ex_cap_deadline(dt_exchange *x, int64_t cap_us);

/* DONE, in sync mode: when chunks came back at different steps, those not at the target step
 * (the newest; oldest: the oldest) are UNSENT again, to be pulled with the EXACT flag at it, and the
 * exchange is OPEN again. Returns how many shards have such chunks (0: every chunk is at one step,
 * still DONE), and the target step. */
int dt_ex_repull(dt_exchange *x, int oldest, int64_t *target);

/* DONE: each shard's step (its oldest chunk's) into steps[n_ps] (may be NULL), the shards that
 * dropped a pushed chunk as stale, the longest time a ps held a PULL (microseconds). */
void dt_ex_result(const dt_exchange *x, int64_t *steps, int *n_stale, int64_t *wait_us);
/* Whether ps 0's chunk 0, where ps 0 counts whole gradients (and dynamic sharding's coordinator
 * settles claims), dropped the pushed gradient as stale. */
int dt_ex_stale_ref(const dt_exchange *x);

/* Ends the exchange, in any state but IDLE: IDLE. */
void dt_ex_end(dt_exchange *x);

dt_ex_state dt_ex_get_state(const dt_exchange *x);
dt_ex_slot_state dt_ex_slot(const dt_exchange *x, int ps, int chunk);
int dt_ex_chunks(const dt_exchange *x, int ps);   /* slots of ps in this exchange */
int dt_ex_awaiting(const dt_exchange *x, int ps); /* replies of ps still due */
int dt_ex_refusal(const dt_exchange *x);          /* status of the latest ERROR reply (DT_WIRE_E_*), 0: none */

#endif
