/* The WORK messages (docs/protocol.md, types 22-25) as requests to ps 0 alone. */
#include "worker/work_client.h"

#include "core/error.h"
#include "transport/wire.h"

/* One request to ps 0 and its reply. */
static int ask_ps0(dt_ps_client *c, dt_wire_header *h, const void *payload, size_t len, uint8_t want, const char *what,
                   dt_wire_header *reply, const void **rp, size_t *rlen, dt_error *err) {
    int rc = dt_ps_client_ask_one(c, 0, h, payload, len, want, what, err);
    return rc ? rc : dt_ps_client_ask_one_end(c, reply, rp, rlen, err);
}

int dt_work_ask_send(dt_ps_client *c, const dt_work_data *d, int join, dt_error *err) {
    dt_wire_header h = dt_wire_header_make(DT_MSG_WORK_ASK, 0, 0, 0);
    h.work_ask.examples = d->examples, h.work_ask.batch_size = d->batch_size, h.work_ask.seed = d->seed;
    if (join) h.flags = DT_WIRE_F_JOIN;
    return dt_ps_client_ask_one(c, 0, &h, NULL, 0, DT_MSG_WORK_GRANT, "WORK_ASK", err);
}

int dt_work_ask_answer(dt_ps_client *c, dt_work_grant *g, dt_error *err) {
    dt_wire_header a;
    int rc = dt_ps_client_ask_one_end(c, &a, NULL, NULL, err);
    if (rc) return rc;
    *g = (dt_work_grant){.global_step = a.global_step};
    switch (a.status) {
    case DT_WIRE_OK:
        if (!a.work_grant.mask)
            return dt_errorf(err, DT_EPROTO, "ps 0: WORK_GRANT of unit %llu with no batch to train",
                             (unsigned long long)a.work_grant.unit);
        g->answer = DT_WORK_GRANTED;
        g->epoch = a.work_grant.epoch, g->unit = a.work_grant.unit, g->mask = a.work_grant.mask;
        return DT_OK;
    case DT_WIRE_WORK_WAIT: g->answer = DT_WORK_WAIT; return DT_OK;
    case DT_WIRE_WORK_FINISHED: g->answer = DT_WORK_FINISHED; return DT_OK;
    default: return dt_errorf(err, DT_EPROTO, "ps 0: WORK_GRANT with status %d", a.status);
    }
}

int dt_work_ask(dt_ps_client *c, const dt_work_data *d, int join, dt_work_grant *g, dt_error *err) {
    int rc = dt_work_ask_send(c, d, join, err);
    return rc ? rc : dt_work_ask_answer(c, g, err);
}

int dt_work_claim_send(dt_ps_client *c, uint64_t epoch, uint64_t batch, int64_t step, dt_error *err) {
    dt_wire_header h = dt_wire_header_make(DT_MSG_WORK_DONE, 0, 0, 0);
    h.work_done.epoch = epoch, h.work_done.batch = batch, h.local_step = step;
    return dt_ps_client_ask_one(c, 0, &h, NULL, 0, DT_MSG_ACK, "WORK_DONE (claim)", err);
}

int dt_work_claim_answer(dt_ps_client *c, int *stale, dt_error *err) {
    dt_wire_header a;
    int rc = dt_ps_client_ask_one_end(c, &a, NULL, NULL, err);
    if (rc) return rc;
    if (a.status != DT_WIRE_OK && a.status != DT_WIRE_STALE)
        return dt_errorf(err, DT_EPROTO, "ps 0: ACK of a claim with status %d", a.status);
    *stale = a.status == DT_WIRE_STALE;
    return DT_OK;
}

int dt_work_state_put(dt_ps_client *c, const void *state, size_t len, dt_error *err) {
    if (!len) return dt_errorf(err, DT_EINVAL, "WORK_STATE: an empty state");
    dt_wire_header h = dt_wire_header_make(DT_MSG_WORK_STATE, 0, 0, 0), a;
    return ask_ps0(c, &h, state, len, DT_MSG_ACK, "WORK_STATE", &a, NULL, NULL, err);
}

int dt_work_state_get(dt_ps_client *c, const void **state, size_t *len, int64_t *step, dt_error *err) {
    dt_wire_header h = dt_wire_header_make(DT_MSG_WORK_STATE, 0, 0, 0), a;
    int rc = ask_ps0(c, &h, NULL, 0, DT_MSG_WORK_STATE, "WORK_STATE", &a, state, len, err);
    if (!rc && step) *step = a.global_step;
    if (!rc && !*len) rc = dt_errorf(err, DT_EPROTO, "ps 0: WORK_STATE reply without a state");
    return rc;
}
