/* The shard's core, the bottom of its files: the helpers every request uses (replies, refusals,
 * the log), the chunks (values, snapshots, a step applied), the workers a step waits for, and a
 * table's rows applied. It calls no handler: shard_update.c (INIT, PUSH, FETCH), shard_pull.c,
 * shard_sparse*.c and shard_work.c stand on it, shard_requests.c (dispatch, lifecycle, cron) on
 * them. shard.h says what the shard is. */
#include "ps/shard.h"

#include <stdalign.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/error.h"
#include "core/finite.h"
#include "ps/shard_impl.h"
#include "transport/compress.h"

void shard_log(const ps_shard *s, const char *fmt, ...) {
    FILE *f = s->cfg.log;
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(f, "ps %d: ", s->cfg.ps_index);
    vfprintf(f, fmt, ap);
    fputc('\n', f);
    fflush(f);
    va_end(ap);
}

/* The shard's step: updates applied to every chunk (a chunk may be a step ahead while a gradient
 * is still arriving). */
int64_t shard_step(const ps_shard *s) {
    int64_t t = s->n_parts ? s->parts[0].step : 0;
    for (int c = 1; c < s->n_parts; c++)
        if (s->parts[c].step < t) t = s->parts[c].step;
    return t;
}

int64_t shard_step_max(const ps_shard *s) {
    int64_t t = 0;
    for (int c = 0; c < s->n_parts; c++)
        if (s->parts[c].step > t) t = s->parts[c].step;
    return t;
}

/* A reply header for a request: same request id, this ps's index, step and cut; a request about
 * one chunk gets that chunk's step. */
dt_wire_header shard_reply_to(const ps_shard *s, dt_msg_type type, const dt_wire_header *req) {
    dt_wire_header h = dt_wire_header_make(type, DT_ROLE_PS, (uint16_t)s->cfg.ps_index, req->request_id);
    h.shard = (uint32_t)s->cfg.ps_index;
    h.local_step = req->local_step;
    h.shard_floats = s->n;
    h.generation = s->initialised ? s->generation : 0;
    h.chunks = (uint8_t)s->n_parts;
    int chunked = type == DT_MSG_PARAMS || type == DT_MSG_PUSH_ACK;
    if (chunked && req->chunk < s->n_parts) {
        h.chunk = req->chunk;
        h.global_step = s->parts[req->chunk].step;
    } else {
        h.global_step = shard_step(s);
    }
    return h;
}

static void send_error_v(const ps_shard *s, const ps_io *io, const ps_origin *to, const dt_wire_header *req,
                         int32_t status, const char *fmt, va_list ap) {
    char text[DT_WIRE_MAX_ERROR_TEXT + 1];
    int n = vsnprintf(text, sizeof text, fmt, ap);
    size_t len = n < 0 ? 0 : (size_t)n >= sizeof text ? sizeof text - 1 : (size_t)n;
    dt_wire_header r = shard_reply_to(s, DT_MSG_ERROR, req);
    r.status = status;
    dt_bytes b = {.data = text, .size = len};
    io->send(io->user, to, &r, &b, 0);
}

void shard_send_error(const ps_shard *s, const ps_io *io, const ps_origin *to, const dt_wire_header *req,
                      int32_t status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    send_error_v(s, io, to, req, status, fmt, ap);
    va_end(ap);
}

static void refuse_text(ps_shard *s, const ps_origin *to, const dt_wire_header *h, int32_t status, const char *text,
                        const ps_io *io) {
    s->refused++;
    if (s->refused <= SHARD_LOG_REFUSALS)
        shard_log(s, "refused %s from %s (%s %u): %s", h->type ? dt_wire_type_name(h->type) : "message",
                  to->addr ? to->addr : "?", dt_wire_role_name(h->role), h->task, text);
    else if (s->refused == SHARD_LOG_REFUSALS + 1)
        shard_log(s, "further refusals are counted, not logged");
    shard_send_error(s, io, to, h, status, "%s", text);
}

void shard_refuse(const shard_req *r, int32_t status, const char *fmt, ...) {
    char text[DT_WIRE_MAX_ERROR_TEXT + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    refuse_text(r->s, r->from, r->h, status, text, r->io);
}

void ps_shard_refuse(ps_shard *s, const ps_origin *to, const dt_wire_header *h, int32_t status, const char *text,
                     const ps_io *io) {
    refuse_text(s, to, h, status, text, io);
}

void shard_send(const shard_req *r, dt_wire_header *h) { r->io->send(r->io->user, r->from, h, NULL, 0); }

int shard_owns_task(const ps_shard *s, const ps_origin *from, const dt_wire_header *h) {
    return s->owner && from->serial && (h->role == DT_ROLE_WORKER || h->role == DT_ROLE_CHIEF) &&
           h->task < s->workers && s->owner[h->task] == from->serial;
}

int shard_admit(const shard_req *r, size_t bytes, char *why, size_t why_len) {
    why[0] = '\0';
    ps_origin to = *r->from;
    to.declared = shard_owns_task(r->s, r->from, r->h); /* a worker's replies before strangers' */
    return r->io->admit(r->io->user, &to, bytes, why, why_len) ? 1 : DT_OK;
}

/* ---- Chunks: values, snapshots, updates ------------------------------------------------------- */

/* Drops the snapshots a chunk no longer needs: steps before the keep window (async: all but the
 * current step). */
static void part_trim(const ps_shard *s, part_t *p) {
    dt_snap_trim(&p->snaps, p->step - (s->aggregate ? SHARD_SNAP_KEEP - 1 : 0));
}

/* The snapshot of a chunk's current step: the current values themselves after an update, else a
 * copy made now; NULL if every buffer is in flight. */
dt_snap *shard_snap_current(const ps_shard *s, part_t *p, int must_keep) {
    dt_snap *b = dt_snap_find(&p->snaps, p->step);
    if (b) return b;
    part_trim(s, p);
    if ((b = dt_snap_claim(&p->snaps, p->step, must_keep))) memcpy(b->data, p->params, p->n * sizeof(float));
    return b;
}

/* Applies one (mean) gradient to a chunk and moves it to the next step, writing the new values
 * into a free snapshot buffer (the next PULLs send it as is); the old values stay intact for
 * replies still holding them and, in sync mode, EXACT pulls. With every buffer in flight the
 * chunk's own copy takes the update. */
void shard_advance(ps_shard *s, part_t *p, const float *grads) {
    part_trim(s, p);
    dt_snap *b = dt_snap_claim(&p->snaps, p->step + 1, 0);
    float *out = b ? b->data : p->own;
    /* The optimizer skips the state floats (their slots stay 0); they take their change as it is. */
    dt_opt_skip skip = {s->cfg.state_ranges, s->cfg.n_state_ranges, p->off};
    dt_opt_apply_to(&s->opt, out, p->params, grads, p->state, p->decay, p->n, p->step, &skip);
    for (int r = 0; r < s->cfg.n_state_ranges; r++) {
        size_t lo = s->cfg.state_ranges[2 * r], hi = lo + s->cfg.state_ranges[2 * r + 1];
        if (lo < p->off) lo = p->off;
        if (hi > p->off + p->n) hi = p->off + p->n;
        for (size_t i = lo; i < hi; i++) out[i - p->off] = p->params[i - p->off] + grads[i - p->off];
    }
    p->params = out;
    p->step++;
    part_trim(s, p);
}

static void accum_clear(accum *a) {
    for (int k = 0; k < a->count; k++) dt_bytes_release(&a->grad[k]);
    a->count = 0;
    a->step = -1;
}

static void part_free(part_t *p, int accumulators) {
    dt_snap_pool_retire(&p->snaps);
    free(p->own);
    free(p->state);
    free(p->decay);
    for (int i = 0; p->acc && i < accumulators; i++) {
        accum_clear(&p->acc[i]);
        free(p->acc[i].worker);
        free(p->acc[i].grad);
        free(p->acc[i].enc);
        free(p->acc[i].examples);
    }
    free(p->acc);
    memset(p, 0, sizeof *p);
}

void shard_parts_free(part_t *parts, int n, int staleness) {
    for (int c = 0; parts && c < n; c++) part_free(&parts[c], parts[c].acc ? staleness + 1 : 0);
    free(parts);
}

/* The optimizer fields of WELCOME and STATE (all zero before INIT: sgd, 0 slots). */
void shard_put_optimizer(const ps_shard *s, dt_wire_header *r) {
    r->opt_kind = (uint8_t)s->opt.kind;
    r->opt_slots = (uint8_t)s->slots;
    r->learning_rate = s->opt.learning_rate;
    r->momentum = s->opt.momentum;
    r->beta1 = s->opt.beta1;
    r->beta2 = s->opt.beta2;
    r->epsilon = s->opt.epsilon;
}

/* ---- FETCH ------------------------------------------------------------------------------------ */

void shard_release_free(void *p) { free(p); }

void *shard_reply_buffer(const shard_req *r, size_t bytes) {
    char why[320];
    if (shard_admit(r, bytes, why, sizeof why)) { /* before the copy: a refused reply costs nothing */
        shard_refuse(r, DT_WIRE_E_BUSY, "%s", why);
        return NULL;
    }
    void *d = malloc(bytes ? bytes : 1);
    if (!d) {
        r->io->unadmit(r->io->user, r->from, bytes);
        shard_refuse(r, DT_WIRE_E_NOMEM, "out of memory for a %s reply", dt_wire_type_name(r->h->type));
    }
    return d;
}

void shard_send_buffer(const shard_req *r, dt_wire_header *h, void *d, size_t bytes) {
    dt_bytes b = {.data = d, .size = bytes, .release = shard_release_free, .hint = d};
    r->io->send(r->io->user, r->from, h, &b, bytes);
}

/* ---- Applying a step ---------------------------------------------------------------------------- */

/* A gradient's payload as aligned float32 (nothing promises alignment: copied if needed; a 16-bit
 * encoding is unpacked, exactly). into: where a copy goes (the scratch buffer, or the sum). */
const float *shard_grad_floats(float *into, const dt_bytes *m, uint8_t enc) {
    const float *g = m->data;
    if (enc == DT_ENC_FP32 && (uintptr_t)g % alignof(float) == 0) return g;
    dt_unpack(enc, into, g, m->size / dt_enc_size(enc));
    return into;
}

/* Sorts a step's gradients by worker index (insertion sort; count is small). */
static void accum_sort(accum *a) {
    for (int i = 1; i < a->count; i++)
        for (int j = i; j > 0 && a->worker[j - 1] > a->worker[j]; j--) {
            uint16_t w = a->worker[j];
            a->worker[j] = a->worker[j - 1], a->worker[j - 1] = w;
            dt_bytes g = a->grad[j];
            a->grad[j] = a->grad[j - 1], a->grad[j - 1] = g;
            uint8_t e = a->enc[j];
            a->enc[j] = a->enc[j - 1], a->enc[j - 1] = e;
            uint32_t x = a->examples[j];
            a->examples[j] = a->examples[j - 1], a->examples[j - 1] = x;
        }
}

/* Whether a step's gradients are weighted by their examples: when each says how many it averages
 * and they do not all say the same. Otherwise each weighs 1: the plain mean, bit for bit as before
 * gradients said their examples (x * 1 is exact), and an older client's gradients (0: not said). */
static int step_weighted(const accum *a, float *div) {
    int unequal = 0, unsaid = 0;
    uint64_t total = 0;
    for (int k = 0; k < a->count; k++) {
        unsaid |= a->examples[k] == 0;
        unequal |= a->examples[k] != a->examples[0];
        total += a->examples[k];
    }
    int weighted = unequal && !unsaid;
    *div = weighted ? (float)total : (float)a->count;
    return weighted;
}

static void log_weighted(ps_shard *s, const accum *a, float div) {
    if (++s->n_weighted > SHARD_LOG_WEIGHTED) return;
    char each[96] = ""; /* the first 8 counts: 8 x ", 1048576" fit */
    for (int k = 0, len = 0; k < a->count && k < 8; k++)
        len += snprintf(each + len, sizeof each - (size_t)len, "%s%u", k ? ", " : "", a->examples[k]);
    shard_log(s, "step %lld: the mean of %d gradient(s) weighted by their examples (%s%s; %.0f in all)%s",
              (long long)a->step, a->count, each, a->count > 8 ? "..." : "", (double)div,
              s->n_weighted == SHARD_LOG_WEIGHTED ? "; further weighted steps are counted" : "");
}

/* Applies the mean of a chunk's gradients of its current step, summed in worker-index order (so
 * the result does not depend on arrival order), each weighted by its examples when they differ
 * (step_weighted: the mean over the examples the step trained), and moves it to the next step. */
static int apply_sync_step(ps_shard *s, part_t *p) {
    accum *a = &p->acc[p->step % (s->staleness + 1)];
    if (!DT_ASSERT(a->count > 0 && a->step == p->step)) return 0;
    accum_sort(a);
    /* mean = ((w0 g0 + w1 g1) + w2 g2 ...) / div in count - 1 passes: the first reads g0 and g1
     * where they arrived, the division rides on the last; a single gradient is its own mean (no
     * copy). The later gradients may use the scratch buffer, so a misaligned or 16-bit g0 goes to sum. */
    const size_t n = p->n;
    const float *mean = s->sum;
    if (a->count == 1) {
        mean = shard_grad_floats(s->scratch, &a->grad[0], a->enc[0]);
    } else {
        float *sum = s->sum, div;
        const int weighted = step_weighted(a, &div);
        const float *g0 = shard_grad_floats(sum, &a->grad[0], a->enc[0]);
        for (int k = 1; k < a->count; k++) {
            const float *g = shard_grad_floats(s->scratch, &a->grad[k], a->enc[k]), *acc = k == 1 ? g0 : sum;
            const float wa = weighted && k == 1 ? (float)a->examples[0] : 1.0f;
            const float wk = weighted ? (float)a->examples[k] : 1.0f;
            if (k < a->count - 1)
                for (size_t i = 0; i < n; i++) sum[i] = wa * acc[i] + wk * g[i];
            else
                for (size_t i = 0; i < n; i++) sum[i] = (wa * acc[i] + wk * g[i]) / div;
        }
        if (weighted && p == &s->parts[0]) log_weighted(s, a, div);
    }
    shard_snap_current(s, p, 1); /* kept for EXACT pulls of this step from workers that see another chunk ahead */
    const int64_t t = p->step;
    shard_advance(s, p, mean);
    /* Chunk 0 counts whole gradients: the coordinator's claims for step t settle here. */
    if (p == &s->parts[0] && s->coord) dt_coord_applied(s->coord, t, a->worker, a->count);
    accum_clear(a);
    if (p == &s->parts[0]) s->updates++;
    return 1;
}

/* Applies every complete step of a chunk (with staleness, later steps may be complete already);
 * whether any was. */
int shard_apply_complete_steps(ps_shard *s, part_t *p) {
    int any = 0;
    for (;;) {
        accum *a = &p->acc[p->step % (s->staleness + 1)];
        if (a->count == 0 || a->step != p->step || a->count < shard_needed_at(s, p->step)) return any;
        if (!apply_sync_step(s, p)) return any;
        any = 1;
    }
}

/* ---- The workers a step waits for --------------------------------------------------------------- */

/* Worker w counts for steps again. While a step is part applied (chunks apply one by one as its
 * gradients come, so some may be past it), w counts only from the step of the chunk furthest on:
 * the chunks behind apply theirs with the workers they waited for. Counted at once, they would wait
 * for a gradient of w's for a step chunk 0 has applied already (w's claim is stale, its gradient
 * dropped there): a sync job froze so when a worker joined mid-step. */
void shard_count_from_now(ps_shard *s, int w) {
    if (!s->aggregate || w >= s->total || !s->count_from) return;
    const int64_t hi = shard_step_max(s);
    if (hi == shard_step(s)) return;
    if (!s->count_from[w]) s->n_late++;
    s->count_from[w] = hi;
}

/* Worker w does not count any more (lost, or sitting steps out): nor late. */
void shard_count_none(ps_shard *s, int w) {
    if (w >= s->total || !s->count_from || !s->count_from[w]) return;
    s->count_from[w] = 0;
    s->n_late--;
}

int shard_too_early(const ps_shard *s, int w, int64_t step) {
    return s->n_late && w < s->total && step < s->count_from[w];
}

/* Gradients a step needs: replicas_to_aggregate, or the live workers if fewer are left (those
 * sitting steps out after DONE are not live). Elastic: the live workers but the backup workers'
 * count, total - aggregate (docs/elastic.md: k = max(1, live - b)); at most aggregate, as live is
 * at most total. */
static int needed_of(const ps_shard *s, int live) {
    int k = s->elastic ? live - (s->total - s->aggregate) : live < s->aggregate ? live : s->aggregate;
    return k > 0 ? k : 1;
}

int shard_needed(const ps_shard *s) { return needed_of(s, s->total - s->n_lost - s->n_sitting); }

int shard_needed_at(ps_shard *s, int64_t step) {
    if (!s->n_late) return shard_needed(s);
    const int64_t lo = shard_step(s);
    int late = 0;
    for (int w = 0; s->n_late && w < s->total; w++) {
        if (!s->count_from[w]) continue;
        if (s->count_from[w] <= lo) shard_count_none(s, w); /* every chunk is there: it counts everywhere */
        else late += step < s->count_from[w];
    }
    return needed_of(s, s->total - s->n_lost - s->n_sitting - late);
}

/* Any message from a worker proves it alive, and so does the answer to its held PULL: it waited
 * at the barrier and will speak next, which the liveness check must not take for silence. */
void shard_saw_worker(ps_shard *s, const dt_wire_header *h, int64_t now) {
    if (!s->last_seen || (h->role != DT_ROLE_WORKER && h->role != DT_ROLE_CHIEF) || h->task >= s->total) return;
    s->last_seen[h->task] = now;
}

/* ---- A sparse table's rows applied ------------------------------------------------------------ */

/* Applies summed rows to a table as one update: each row divided by `divisor`, or (row_mean) by the
 * replicas that sent it. */
void shard_sparse_apply(ps_shard *s, dt_table *t, const dt_rowsum *sum, float divisor, int row_mean) {
    const size_t dim = (size_t)sum->dim;
    for (size_t i = 0; (row_mean || divisor != 1.0f) && i < sum->n; i++) {
        const float d = row_mean ? (float)sum->count[i] : divisor;
        for (size_t j = 0; j < dim; j++) sum->rows[i * dim + j] /= d;
    }
    dt_table_apply(t, sum->ids, sum->rows, sum->n);
    s->sparse_updates++;
}
