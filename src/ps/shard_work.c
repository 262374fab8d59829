/* The work coordinator's requests on ps 0 (docs/elastic.md): WORK_ASK, WORK_DONE (a claim),
 * WORK_STATE (the chief installs or fetches the coordinator's state), through the shard's dispatch
 * table; the shard's hooks that settle claims where gradients are applied, and its liveness. The
 * coordinator itself is coord.h. */
#include <string.h>

#include "core/error.h"
#include "ps/coord.h"
#include "ps/shard_impl.h"

/* The coordinator for a WORK request: NULL (refused) on another ps, or before the chief's plan. */
static dt_coord *coordinator(const shard_req *r) {
    if (r->s->cfg.ps_index != 0) {
        shard_refuse(r, DT_WIRE_E_UNSUPPORTED, "%s: the work coordinator is ps 0, this is ps %d",
                     dt_wire_type_name(r->h->type), r->s->cfg.ps_index);
        return NULL;
    }
    if (!r->s->coord)
        shard_refuse(r, DT_WIRE_E_NOT_READY, "%s: no work plan yet: the chief has not sent WORK_STATE (is it using "
                     "--sharding fixed?)", dt_wire_type_name(r->h->type));
    return r->s->coord;
}

void shard_on_work_ask(const shard_req *r) {
    dt_coord *c = coordinator(r);
    if (!c) return;
    const dt_wire_header *h = r->h;
    char why[DT_WIRE_MAX_ERROR_TEXT];
    int32_t st = dt_coord_check_plan(c, h->task, h->work_ask.examples, h->work_ask.batch_size, h->work_ask.seed, why,
                                     sizeof why);
    dt_coord_grant g;
    if (st == DT_WIRE_OK)
        st = dt_coord_ask(c, h->task, (h->flags & DT_WIRE_F_JOIN) != 0, r->from->serial, r->now, &g, why, sizeof why);
    if (st != DT_WIRE_OK && st != DT_WIRE_WORK_WAIT && st != DT_WIRE_WORK_FINISHED) {
        shard_refuse(r, st, "%s", why);
        return;
    }
    dt_wire_header a = shard_reply_to(r->s, DT_MSG_WORK_GRANT, h);
    a.status = st;
    if (st == DT_WIRE_OK) a.work_grant.epoch = g.epoch, a.work_grant.unit = g.unit, a.work_grant.mask = g.mask;
    shard_send(r, &a);
}

void shard_on_work_done(const shard_req *r) {
    dt_coord *c = coordinator(r);
    if (!c) return;
    const dt_wire_header *h = r->h;
    char why[DT_WIRE_MAX_ERROR_TEXT];
    int32_t st = dt_coord_claim(c, h->task, r->from->serial, h->work_done.epoch, h->work_done.batch, h->local_step,
                                r->now, why, sizeof why);
    if (st != DT_WIRE_OK && st != DT_WIRE_STALE) {
        shard_refuse(r, st, "%s", why);
        return;
    }
    dt_wire_header a = shard_reply_to(r->s, DT_MSG_ACK, h);
    a.status = st;
    shard_send(r, &a);
}

/* The coordinator's state for the chief's checkpoint. */
static void work_state_fetch(const shard_req *r, dt_coord *c) {
    size_t bytes = dt_coord_state_size(c);
    uint8_t *d = shard_reply_buffer(r, bytes);
    if (!d) return;
    dt_coord_save(c, d);
    dt_wire_header h = shard_reply_to(r->s, DT_MSG_WORK_STATE, r->h);
    shard_send_buffer(r, &h, d, bytes);
}

/* A state from the chief (a fresh plan, or a checkpoint's): checked whole, then it replaces the
 * coordinator. Sync claims are taken from the shard's next step on. */
static void work_state_install(const shard_req *r) {
    ps_shard *s = r->s;
    dt_coord *c = NULL;
    dt_error err = {0};
    int rc = dt_coord_load(&c, r->payload->data, r->payload->size, s->cfg.log, &err);
    if (rc) {
        shard_refuse(r, rc == DT_ENOMEM ? DT_WIRE_E_NOMEM : DT_WIRE_E_BAD_VALUE, "%s", err.msg);
        return;
    }
    if (s->initialised && dt_coord_get_plan(c)->sync != (s->aggregate > 0)) {
        shard_refuse(r, DT_WIRE_E_BAD_VALUE, "WORK_STATE for %s training, but the chief initialised this ps for %s",
                     dt_coord_get_plan(c)->sync ? "sync" : "asynchronous", s->aggregate ? "sync replicas" : "asynchronous");
        dt_coord_free(c);
        return;
    }
    dt_coord_free(s->coord);
    s->coord = c;
    dt_coord_reset_step(c, s->n_parts ? s->parts[0].step : 0);
    dt_coord_stats st;
    dt_coord_get_stats(c, &st);
    shard_log(s, "work plan from the chief: epoch %llu, %u unit(s) of %u batch(es) of %u, %u done, %llu batch(es) "
              "of the epoch counted", (unsigned long long)st.epoch, st.units, dt_coord_get_plan(c)->unit_batches,
              dt_coord_get_plan(c)->batch_size, st.done, (unsigned long long)dt_coord_counted(c));
    dt_wire_header a = shard_reply_to(s, DT_MSG_ACK, r->h);
    shard_send(r, &a);
}

void shard_on_work_state(const shard_req *r) {
    if (r->s->cfg.ps_index != 0) {
        coordinator(r);
        return;
    }
    if (r->payload->size) {
        work_state_install(r);
        return;
    }
    dt_coord *c = coordinator(r);
    if (c) work_state_fetch(r, c);
}

/* ---- Hooks ------------------------------------------------------------------------------------ */

void shard_work_seen(ps_shard *s, const dt_wire_header *h, int64_t now) {
    if (s->coord && (h->role == DT_ROLE_WORKER || h->role == DT_ROLE_CHIEF)) dt_coord_seen(s->coord, h->task, now);
}

/* Liveness: a worker waiting at the barrier (a PULL held) is not silent; the others past the
 * timeout are lost. */
void shard_work_cron(ps_shard *s, int64_t now) {
    if (!s->coord) return;
    for (int i = 0; i < s->n_pending; i++)
        if (s->pending[i].req.role != DT_ROLE_PS) dt_coord_seen(s->coord, s->pending[i].req.task, now);
    dt_coord_cron(s->coord, now);
}

int ps_shard_work_stats(const ps_shard *s, dt_coord_stats *out) {
    if (!s->coord) return 0;
    dt_coord_get_stats(s->coord, out);
    return 1;
}
