#include "worker/exchange.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/assert.h"
#include "core/error.h"

typedef struct {
    uint8_t state;            /* dt_ex_slot_state */
    uint8_t req;              /* the type of its latest request */
    uint8_t exact;            /* pulled again at exactly the exchange's target step (repull) */
    uint32_t id, first_id;    /* its latest request's id, and the first one still answering it */
    int64_t sent_us;          /* when the latest went out */
    int64_t step;             /* the step its reply reported; -1: none yet */
} slot_t;

struct dt_exchange {
    int n_ps;
    size_t *n;                /* [n_ps] shard floats */
    const char *const *names; /* [n_ps] for messages (the caller's) */
    dt_ex_state state;
    dt_ex_kind kind;
    int chunked;              /* a slot per chunk (PARAMS, PUSH_ACK), else one per ps */
    int *chunks;              /* [n_ps] slots of each ps in this exchange */
    slot_t *slots;            /* [n_ps * DT_WIRE_MAX_CHUNKS] */
    int *awaited_ps;          /* [n_ps] replies due from each */
    int awaited, unsent;      /* over every ps */
    uint32_t next_id;
    int64_t deadline_us;
    int64_t exact_step;       /* the target of a repull */
    uint8_t *stale;           /* [n_ps] a pushed chunk came back STALE */
    int stale_ref;            /* ps 0's chunk 0 came back STALE (dynamic sharding's verdict) */
    int64_t wait_us;          /* the longest a ps held a PULL */
    int refusal;
};

static slot_t *slot_at(const dt_exchange *x, int ps, int chunk) {
    return &x->slots[(size_t)ps * DT_WIRE_MAX_CHUNKS + (size_t)chunk];
}

int dt_ex_open(dt_exchange **out, int n_ps, const size_t *shard_floats, const char *const *names, dt_error *err) {
    *out = NULL;
    if (n_ps <= 0) return dt_errorf(err, DT_EINVAL, "exchange: %d ps tasks", n_ps);
    dt_exchange *x = dt_calloc(1, sizeof *x, "exchange", err);
    if (!x) return DT_ENOMEM;
    x->n_ps = n_ps;
    x->names = names;
    if (!(x->n = dt_calloc((size_t)n_ps, sizeof *x->n, "exchange", err)) ||
        !(x->chunks = dt_calloc((size_t)n_ps, sizeof *x->chunks, "exchange", err)) ||
        !(x->awaited_ps = dt_calloc((size_t)n_ps, sizeof *x->awaited_ps, "exchange", err)) ||
        !(x->stale = dt_calloc((size_t)n_ps, 1, "exchange", err)) ||
        !(x->slots = dt_calloc((size_t)n_ps * DT_WIRE_MAX_CHUNKS, sizeof *x->slots, "exchange slots", err))) {
        dt_ex_close(x);
        return DT_ENOMEM;
    }
    for (int i = 0; i < n_ps; i++) x->n[i] = shard_floats[i];
    *out = x;
    return DT_OK;
}

void dt_ex_close(dt_exchange *x) {
    if (!x) return;
    free(x->n), free(x->chunks), free(x->awaited_ps), free(x->stale), free(x->slots);
    free(x);
}

int dt_ex_begin(dt_exchange *x, const dt_ex_kind *kind, const int *chunks, int64_t now_us) {
    if (!DT_ASSERT(x->state == DT_EX_IDLE)) return DT_EINVAL; /* one exchange at a time */
    int chunked = kind->want == DT_MSG_PARAMS || kind->want == DT_MSG_PUSH_ACK;
    if (!DT_ASSERT(!kind->alone || (!chunked && kind->ps >= 0 && kind->ps < x->n_ps))) return DT_EINVAL;
    x->kind = *kind;
    x->chunked = chunked;
    x->awaited = x->unsent = 0;
    for (int i = 0; i < x->n_ps; i++) {
        /* A ps without a slot awaits nothing: its chunk count is 0, so no id finds a slot there. */
        int k = kind->alone ? i == kind->ps : (x->chunked || kind->multi) && chunks ? chunks[i] : 1;
        if (!DT_ASSERT(k >= (kind->multi || kind->alone ? 0 : 1) && k <= (int)DT_WIRE_MAX_CHUNKS)) return DT_EINVAL;
        x->chunks[i] = k;
        x->awaited_ps[i] = 0;
        x->stale[i] = 0;
        for (int j = 0; j < k; j++) *slot_at(x, i, j) = (slot_t){.state = DT_EX_UNSENT, .step = -1};
        x->unsent += k;
    }
    x->deadline_us = now_us + kind->timeout_us;
    x->exact_step = -1;
    x->stale_ref = 0;
    x->wait_us = 0;
    x->refusal = 0;
    x->state = DT_EX_OPEN;
    return DT_OK;
}

uint32_t dt_ex_new_id(dt_exchange *x) {
    if (++x->next_id == 0) x->next_id = 1; /* 0 means "no id" in refusals */
    return x->next_id;
}

int dt_ex_sent(dt_exchange *x, int ps, int chunk, uint8_t req, uint32_t id, int64_t now_us) {
    if (!DT_ASSERT(x->state == DT_EX_OPEN && ps >= 0 && ps < x->n_ps && chunk >= 0 && chunk < x->chunks[ps]))
        return DT_EINVAL;
    slot_t *s = slot_at(x, ps, chunk);
    if (s->state == DT_EX_UNSENT) {
        if (!DT_ASSERT(x->unsent > 0)) return DT_EINVAL;
        x->unsent--;
        x->awaited++;
        x->awaited_ps[ps]++;
        s->first_id = id;
    } else if (!DT_ASSERT(s->state == DT_EX_AWAITED)) { /* sent again: the earlier ids still answer it */
        return DT_EINVAL;
    }
    s->state = DT_EX_AWAITED;
    s->req = req;
    s->id = id;
    s->sent_us = now_us;
    x->deadline_us = now_us + x->kind.timeout_us;
    return DT_OK;
}

/* id is one of the requests s stands for (first_id .. id, ids wrapping around). */
static int answers(const slot_t *s, uint32_t id) {
    return (s->state == DT_EX_AWAITED || s->state == DT_EX_ARRIVED) && id - s->first_id <= s->id - s->first_id;
}

/* The slot of ps that request id was sent for: a chunk reply names its chunk, so that one is
 * looked at first. */
static int find_slot(const dt_exchange *x, int ps, uint32_t id, unsigned chunk_hint) {
    if (chunk_hint < (unsigned)x->chunks[ps] && answers(slot_at(x, ps, (int)chunk_hint), id)) return (int)chunk_hint;
    for (int k = 0; k < x->chunks[ps]; k++)
        if (answers(slot_at(x, ps, k), id)) return k;
    return -1;
}

static int fail(dt_exchange *x, int ps, dt_error *err, const char *what, const char *msg) {
    dt_ex_fail(x);
    return dt_errorf(err, DT_EPROTO, "ps %d at %s: %s%s%s", ps, x->names[ps], what, *what ? ": " : "", msg);
}

/* The reply is of the type, sender and size its request awaits (a chunk reply: of its chunk). */
static int check_reply(dt_exchange *x, int ps, int k, const dt_wire_header *h, const char *tn, dt_error *err) {
    if (h->type != x->kind.want || h->shard != (uint32_t)ps || h->role != DT_ROLE_PS ||
        (x->chunked && (h->chunk != k || h->chunks != x->chunks[ps]))) {
        char msg[200], got[40] = "", want[40] = "";
        if (x->chunked) {
            snprintf(got, sizeof got, " (chunk %u of %u)", h->chunk, h->chunks);
            snprintf(want, sizeof want, " (chunk %d of %d)", k, x->chunks[ps]);
        }
        snprintf(msg, sizeof msg, "got %s from %s %u for shard %u%s, expected %s answering %s from ps %d%s",
                 dt_wire_type_name(h->type), dt_wire_role_name(h->role), h->task, h->shard, got,
                 dt_wire_type_name(x->kind.want), tn, ps, want);
        return fail(x, ps, err, "unexpected reply", msg);
    }
    dt_error e = {0};
    return dt_wire_check_payload(h, x->n[ps], &e) ? fail(x, ps, err, tn, e.msg) : DT_OK;
}

/* What a chunk reply says: the push's outcome (OK or STALE), the chunk's step (PARAMS: at least
 * the step asked for; a repull's exactly its target), how long the ps held it. */
static int chunk_reply(dt_exchange *x, int ps, slot_t *s, int k, const dt_wire_header *h, dt_error *err) {
    if (h->status == DT_WIRE_STALE) x->stale[ps] = 1, x->stale_ref |= ps == 0 && k == 0;
    else if (h->status != DT_WIRE_OK)
        return fail(x, ps, err, dt_wire_type_name(s->req), dt_wire_status_name(h->status));
    s->step = h->global_step;
    if (h->type == DT_MSG_PUSH_ACK) return DT_OK;
    int64_t min = s->exact ? x->exact_step : x->kind.min_step;
    char msg[160];
    if (h->global_step < min || (s->exact && h->global_step != x->exact_step)) {
        if (s->exact && h->global_step > min)
            snprintf(msg, sizeof msg, "answered an exact pull of step %lld with step %lld (chunk %d)", (long long)min,
                     (long long)h->global_step, k);
        else
            snprintf(msg, sizeof msg, "answered a pull for step >= %lld with step %lld (chunk %d)", (long long)min,
                     (long long)h->global_step, k);
        return fail(x, ps, err, "PULL", msg);
    }
    int64_t waited = h->params.waited_us > INT64_MAX ? INT64_MAX : (int64_t)h->params.waited_us;
    if (waited > x->wait_us) x->wait_us = waited;
    return DT_OK;
}

static int take(dt_exchange *x, int ps, slot_t *s) {
    if (!DT_ASSERT(x->awaited_ps[ps] > 0 && x->awaited > 0)) return DT_EINVAL;
    s->state = DT_EX_ARRIVED;
    x->awaited_ps[ps]--;
    x->awaited--;
    return DT_OK;
}

int dt_ex_reply(dt_exchange *x, int ps, const dt_wire_header *h, const void *payload, size_t len,
                dt_ex_reply_info *info, dt_error *err) {
    *info = (dt_ex_reply_info){.chunk = -1};
    if (!DT_ASSERT(ps >= 0 && ps < x->n_ps)) return DT_EINVAL;
    if (x->state != DT_EX_OPEN) {
        info->ignored = DT_EX_LATE;
        return DT_EX_IGNORED;
    }
    int k = find_slot(x, ps, h->request_id, h->chunk);
    slot_t *s = k >= 0 ? slot_at(x, ps, k) : NULL;
    if (!s || s->state != DT_EX_AWAITED) {
        info->ignored = s ? DT_EX_DUPLICATE : DT_EX_UNKNOWN;
        return DT_EX_IGNORED;
    }
    *info = (dt_ex_reply_info){.chunk = k, .req = s->req, .sent_us = s->sent_us};
    if (take(x, ps, s)) return DT_EINVAL;
    const char *tn = dt_wire_type_name(s->req);
    if (h->type == DT_MSG_ERROR) {
        char text[DT_WIRE_MAX_ERROR_TEXT + 1], what[32];
        dt_wire_error_text(text, sizeof text, payload, len);
        snprintf(what, sizeof what, "%s refused", tn);
        x->refusal = h->status;
        info->refused = 1;
        return fail(x, ps, err, what, text);
    }
    int rc = check_reply(x, ps, k, h, tn, err);
    if (!rc && x->chunked) rc = chunk_reply(x, ps, s, k, h, err);
    if (rc) return rc;
    info->accepted = h->status == DT_WIRE_OK;
    if (x->awaited == 0 && x->unsent == 0) x->state = DT_EX_DONE;
    return DT_EX_TAKEN;
}

void dt_ex_fail(dt_exchange *x) {
    if (!DT_ASSERT(x->state != DT_EX_IDLE)) return;
    for (int i = 0; i < x->n_ps; i++) x->awaited_ps[i] = 0;
    x->awaited = 0;
    x->state = DT_EX_FAILED;
}

void dt_ex_drop_ps(dt_exchange *x, int ps) {
    if (x->state != DT_EX_IDLE && x->awaited_ps[ps] > 0) dt_ex_fail(x);
}

int dt_ex_overdue(const dt_exchange *x, int64_t now_us) {
    if (x->state != DT_EX_OPEN || !x->awaited || now_us < x->deadline_us) return -1;
    for (int i = 0; i < x->n_ps; i++)
        if (x->awaited_ps[i]) return i;
    /* Awaited from no ps: failed as overdue on ps 0 rather than waited on forever. */
    return DT_ASSERT(!"replies awaited from no ps") ? -1 : 0;
}

int64_t dt_ex_deadline(const dt_exchange *x) { return x->deadline_us; }

void dt_ex_cap_deadline(dt_exchange *x, int64_t cap_us) {
    if (cap_us < x->deadline_us) x->deadline_us = cap_us;
}

int dt_ex_repull(dt_exchange *x, int oldest, int64_t *target) {
    if (!DT_ASSERT(x->state == DT_EX_DONE && x->chunked)) return 0;
    int64_t t = oldest ? INT64_MAX : 0;
    for (int i = 0; i < x->n_ps; i++)
        for (int k = 0; k < x->chunks[i]; k++) {
            int64_t s = slot_at(x, i, k)->step;
            if (oldest ? s < t : s > t) t = s;
        }
    int shards = 0;
    for (int i = 0; i < x->n_ps; i++) {
        int any = 0;
        for (int k = 0; k < x->chunks[i]; k++) {
            slot_t *s = slot_at(x, i, k);
            if (s->step == t) continue;
            s->state = DT_EX_UNSENT;
            s->exact = 1;
            x->unsent++;
            any = 1;
        }
        shards += any;
    }
    *target = t;
    if (shards) {
        x->exact_step = t;
        x->state = DT_EX_OPEN;
    }
    return shards;
}

void dt_ex_result(const dt_exchange *x, int64_t *steps, int *n_stale, int64_t *wait_us) {
    if (!DT_ASSERT(x->state == DT_EX_DONE)) { /* no result: the steps read 0 (nothing pulled) */
        for (int i = 0; steps && i < x->n_ps; i++) steps[i] = 0;
        if (n_stale) *n_stale = 0;
        if (wait_us) *wait_us = 0;
        return;
    }
    int stale = 0;
    for (int i = 0; i < x->n_ps; i++) {
        int64_t s = slot_at(x, i, 0)->step;
        for (int k = 1; k < x->chunks[i]; k++)
            if (slot_at(x, i, k)->step < s) s = slot_at(x, i, k)->step;
        if (steps) steps[i] = s;
        stale += x->stale[i];
    }
    if (n_stale) *n_stale = stale;
    if (wait_us) *wait_us = x->wait_us;
}

int dt_ex_stale_ref(const dt_exchange *x) { return x->stale_ref; }

void dt_ex_end(dt_exchange *x) {
    if (!DT_ASSERT(x->state != DT_EX_IDLE)) return;
    /* Replies still counted as due: not idle, so the next exchange is refused too. */
    if (!DT_ASSERT(x->state != DT_EX_DONE || (x->awaited == 0 && x->unsent == 0))) return;
    x->state = DT_EX_IDLE;
}

dt_ex_state dt_ex_get_state(const dt_exchange *x) { return x->state; }

dt_ex_slot_state dt_ex_slot(const dt_exchange *x, int ps, int chunk) {
    if (x->state == DT_EX_IDLE || ps < 0 || ps >= x->n_ps || chunk < 0 || chunk >= x->chunks[ps]) return DT_EX_UNUSED;
    return (dt_ex_slot_state)slot_at(x, ps, chunk)->state;
}

int dt_ex_chunks(const dt_exchange *x, int ps) { return x->chunks[ps]; }

int dt_ex_awaiting(const dt_exchange *x, int ps) { return x->awaited_ps[ps]; }

int dt_ex_refusal(const dt_exchange *x) { return x->refusal; }
