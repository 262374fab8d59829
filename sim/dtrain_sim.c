/* dtrain_sim: a SimGrid model of dtrain's training step (docs/testbed.md, "A simulated training
 * step"). The bed's hosts, each with its own full-duplex link of the bed's rate, ps tasks on hosts
 * 0..P-1 and workers on P..P+W-1; a worker's step is the emulated compute of
 * --debug_emulate_compute_ms spread over the model's layers as src/train/emulate.c spreads it, the
 * dense exchange in the chunks of docs/protocol.md ("Chunks") over the greedy placement of
 * cluster/placement.h, streamed as --overlap priority streams it (each chunk up as backward makes
 * it final, lowest first, one frame in flight per ps; each layer of the next forward waits for its
 * chunks), or after backward (--overlap none); at the ps a per-chunk barrier (sync) or an update per
 * push (async); a click-log model's sparse rows pulled (prefetched one batch ahead) and pushed. CPU
 * time per message and per byte, of the ps and of the worker, comes from a cost file made by
 * bench/bench_simcost (sim/costs.txt). --cores N: every host's cores for the exchange (a ps then
 * runs N appliers on one queue, a worker's streams to the ps tasks spread over them; dtrain's ps
 * has one loop today: N > 1 is a design the simulator prices, not the code). Prints one line of
 * key=value: the mean step time and what bounds it, beside the BytePS closed form
 * max(M/B, W M / (P B)).
 *
 * usage: dtrain_sim --model FILE --ps P --workers W [--gbit G] [--compute_ms C] [--sync 1|0]
 *        [--overlap priority|none] [--chunk_kb K] [--steps N] [--costs FILE] [--cores N] [--streams N]
 *        [--jitter F] [--sparse_ids N] [--encoding_bytes 4|2] [--first_chunk_kb K] [--verbose] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <simgrid/actor.h>
#include <simgrid/comm.h>
#include <simgrid/engine.h>
#include <simgrid/exec.h>
#include <simgrid/host.h>
#include <simgrid/mailbox.h>
#include <simgrid/semaphore.h>

#include "cluster/placement.h"
#include "core/error.h"
#include "model/net.h"
#include "model/spec.h"
#include "transport/wire.h"

/* A message's bytes besides its payload: dtrain's 104-byte header, ZeroMQ's frame headers. */
#define MSG_OVERHEAD 120.0
/* TCP payload per byte on the wire at full segments: 1448 of 1514 (docs/testbed.md, "Measured
 * throughput"); the bed's tbf counts frames from the Ethernet header on. */
#define TCP_EFFICIENCY (1448.0 / 1514.0)
#define FLOPS 1e9 /* a host's speed: CPU costs in seconds are charged as seconds x FLOPS */

typedef struct {
    double ps_msg, ps_byte, ps_apply_msg, ps_apply_byte, worker_msg, worker_byte;
    double ps_row; /* sparse: per row looked up or updated (0: per byte only) */
} costs;

typedef struct {
    int ps, chunk;
} chunk_ref;

enum { MSG_PUSH, MSG_PARAMS, MSG_SPULL, MSG_SROWS, MSG_SPUSH, MSG_SACK };

typedef struct {
    int kind, worker, ps, chunk;
    long step;
    double bytes; /* payload */
} msg;

/* The run's configuration and the model's layout. */
static struct {
    int P, W, steps, warm, sync, overlap, cores, verbose, streams;
    double gbit, compute_ms, chunk_bytes, jitter, enc, first_chunk_bytes;
    costs c;
    /* layers: forward and backward sleep (s), the chunks each needs / makes ready */
    int n_layers;
    double *fwd_s, *bwd_s;
    int *need_begin, *ready_begin;
    chunk_ref *need, *ready;
    int *m;           /* [P] chunks of each ps */
    double **cbytes;  /* [P][m] float32 payload bytes of each chunk */
    double model_bytes;
    /* sparse: distinct ids per worker per step, tables, floats per id over all tables */
    double sparse_ids;
    int sparse_tables;
    double sparse_floats;
} cfg = {.steps = 6, .warm = 2, .sync = 1, .overlap = 1, .cores = 1, .streams = 4096, .gbit = 1, .chunk_bytes = 65536, .enc = 4};

typedef struct {
    int id;
    unsigned char **arrived; /* [P][m]: this chunk's parameters are in for the next forward */
    unsigned char **ready;   /* [P][m]: gradient final, not yet sent */
    sg_sem_t arrival;        /* released at every arrival; the forward waits on it */
    sg_sem_t *to_send;       /* [streams] ready chunks per stream */
    int sparse_wait;         /* sparse replies still due */
    double *step_end, end;
    double bytes_out, cpu;
} worker_state;

struct ring {
    msg **q; /* a ring of cap */
    int head, n, cap;
    sg_sem_t sem;
};

typedef struct {
    int id;
    int *acc; /* [m] gradients of the current step per chunk (sync) */
    int sparse_acc;
    long sparse_applied; /* sync: sparse steps applied */
    msg **held;          /* [2 W] sync: pulls waiting for their step */
    struct ring *out;    /* [n_streams_ps()] replies queued for each of the ps's send streams */
    int n_held;
    double bytes_in, cpu;
} ps_state;

static worker_state *workers;
static ps_state *pss;
static sg_mailbox_t *ps_mb, *worker_mb;

static unsigned long long rng_state = 88172645463325252ull;
static double urand(void) { /* xorshift64: a deterministic jitter */
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static double wire(double payload) { return payload + MSG_OVERHEAD; }

static void charge(double seconds, double *acc) {
    if (seconds <= 0) return;
    *acc += seconds;
    sg_actor_execute(seconds * FLOPS);
}

/* The ps's replies leave in one stream per worker (a connection), each in the order queued
 * (--streams N: at most N, worker w's in stream w % N). */
static int n_streams_ps(void) { return cfg.streams < cfg.W ? cfg.streams : cfg.W; }

static void reply(ps_state *s, msg *m) {
    struct ring *r = &s->out[m->worker % n_streams_ps()];
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 64;
        msg **o = malloc(sizeof *o * (size_t)cap);
        for (int k = 0; k < r->n; k++) o[k] = r->q[(r->head + k) % r->cap];
        free(r->q);
        r->q = o, r->head = 0, r->cap = cap;
    }
    r->q[(r->head + r->n++) % r->cap] = m;
    sg_sem_release(r->sem);
}

static void send_async(sg_mailbox_t mb, msg *m) {
    sg_comm_t c = sg_mailbox_put_init(mb, m, wire(m->bytes)); /* detach starts it */
    sg_comm_detach(c, NULL);
}

/* ---- the ps ---------------------------------------------------------------------------------- */

static void serve_pull(ps_state *s, msg *m) {
    double rows = cfg.sparse_ids / cfg.P * cfg.sparse_tables;
    double out = cfg.sparse_ids / cfg.P * cfg.sparse_floats * cfg.enc;
    charge(cfg.c.ps_msg + cfg.c.ps_byte * (m->bytes + out) + cfg.c.ps_row * rows, &s->cpu);
    m->kind = MSG_SROWS, m->bytes = out;
    reply(s, m);
}

static void ps_main(int argc, char **argv) {
    ps_state *s = &pss[atoi(argv[0])];
    (void)argc;
    if (atoi(argv[1]) == 0) sg_mailbox_set_receiver(sg_mailbox_get_name(ps_mb[s->id]));
    for (;;) {
        msg *m = sg_mailbox_get(ps_mb[s->id]);
        if (cfg.verbose) fprintf(stderr, "%.6f ps %d: kind %d from worker %d chunk %d\n", simgrid_get_clock(), s->id, m->kind, m->worker, m->chunk);
        s->bytes_in += wire(m->bytes);
        if (m->kind == MSG_PUSH) {
            /* floats on the wire in their encoding; the ps's sums and updates are on float32 */
            double f32 = cfg.cbytes[s->id][m->chunk];
            charge(cfg.c.ps_msg + cfg.c.ps_byte * f32, &s->cpu);
            if (!cfg.sync) {
                charge(cfg.c.ps_apply_msg + cfg.c.ps_apply_byte * f32, &s->cpu);
                m->kind = MSG_PARAMS, m->bytes = f32 / 4 * cfg.enc;
                reply(s, m);
                continue;
            }
            int c = m->chunk;
            free(m);
            if (++s->acc[c] < cfg.W) continue;
            s->acc[c] = 0;
            charge(cfg.c.ps_apply_msg + cfg.c.ps_apply_byte * f32, &s->cpu);
            for (int k = 0; k < cfg.W; k++) {
                int w = (k + s->id) % cfg.W; /* ps tasks start on different workers */
                msg *r = malloc(sizeof *r);
                *r = (msg){.kind = MSG_PARAMS, .worker = w, .ps = s->id, .chunk = c, .bytes = f32 / 4 * cfg.enc};
                reply(s, r);
            }
        } else if (m->kind == MSG_SPULL) {
            /* sync: held until the step before the one it asks for is applied (docs/sparse.md,
             * "Prefetch": the next batch's pull goes out before this worker's push) */
            if (cfg.sync && m->step > s->sparse_applied) {
                s->held[s->n_held++] = m;
                continue;
            }
            serve_pull(s, m);
        } else if (m->kind == MSG_SPUSH) {
            double rows = cfg.sparse_ids / cfg.P * cfg.sparse_tables;
            charge(cfg.c.ps_msg + cfg.c.ps_byte * m->bytes + cfg.c.ps_row * rows, &s->cpu);
            int w = m->worker;
            m->kind = MSG_SACK, m->bytes = 0;
            reply(s, m);
            (void)w;
            if (!cfg.sync) {
                charge(cfg.c.ps_row * rows, &s->cpu);
                continue;
            }
            if (++s->sparse_acc < cfg.W) continue;
            s->sparse_acc = 0;
            /* the summed rows applied: at most W x the rows of one worker, fewer where ids repeat */
            charge(cfg.c.ps_row * rows, &s->cpu);
            s->sparse_applied++;
            int n = s->n_held;
            s->n_held = 0;
            for (int k = 0; k < n; k++) {
                if (s->held[k]->step > s->sparse_applied) s->held[s->n_held++] = s->held[k];
                else serve_pull(s, s->held[k]);
            }
        } else {
            free(m);
        }
    }
}

static void ps_sender_main(int argc, char **argv) {
    (void)argc;
    ps_state *s = &pss[atoi(argv[0])];
    struct ring *r = &s->out[atoi(argv[1])];
    sg_comm_t prev = NULL;
    for (;;) {
        sg_sem_acquire(r->sem);
        msg *m = r->q[r->head];
        r->head = (r->head + 1) % r->cap, r->n--;
        if (prev) sg_comm_wait(prev);
        prev = sg_mailbox_put_async(worker_mb[m->worker], m, wire(m->bytes));
    }
}

/* ---- a worker ---------------------------------------------------------------------------------- */

/* A worker's streams: one per ps, as dtrain's connections (--streams N: at most N, stream k then
 * carrying the ps p with p % N == k, a cheaper and slower approximation), one chunk at a time, the
 * lowest chunk ready first (priority), ties to the ps next after this worker's own offset. */
static int n_streams(void) { return cfg.streams < cfg.P ? cfg.streams : cfg.P; }

static void sender_main(int argc, char **argv) {
    (void)argc;
    worker_state *w = &workers[atoi(argv[0])];
    int k = atoi(argv[1]), ns = n_streams(), maxm = 0;
    for (int p = k; p < cfg.P; p += ns) maxm = cfg.m[p] > maxm ? cfg.m[p] : maxm;
    /* a connection is a FIFO stream: one chunk on the wire at a time, the next one's copies made
     * meanwhile (ZeroMQ holds one frame per ps, the kernel a small buffer: docs/protocol.md
     * "Overlap"); links carry no latency, so the stream has no gaps between its chunks */
    sg_comm_t prev = NULL;
    for (;;) {
        sg_sem_acquire(w->to_send[k]);
        int p = -1, c;
        for (c = 0; c < maxm && p < 0; c++)
            for (int i = 0; i < cfg.P; i++) {
                int q = (w->id + i) % cfg.P;
                if (q % ns == k && c < cfg.m[q] && w->ready[q][c]) {
                    p = q;
                    break;
                }
            }
        if (p < 0) continue;
        c--;
        w->ready[p][c] = 0;
        double payload = cfg.cbytes[p][c] / 4 * cfg.enc;
        /* half the worker's cost per chunk here (the gradient copied and sent), half where its
         * parameters land (received and copied into the net), on the same core */
        charge((cfg.c.worker_msg + cfg.c.worker_byte * cfg.cbytes[p][c]) / 2, &w->cpu);
        msg *m = malloc(sizeof *m);
        *m = (msg){.kind = MSG_PUSH, .worker = w->id, .ps = p, .chunk = c, .bytes = payload};
        w->bytes_out += wire(payload);
        if (prev) sg_comm_wait(prev);
        prev = sg_mailbox_put_async(ps_mb[p], m, wire(payload));
    }
}

static void receiver_main(int argc, char **argv) {
    (void)argc;
    worker_state *w = &workers[atoi(argv[0])];
    sg_mailbox_set_receiver(sg_mailbox_get_name(worker_mb[w->id]));
    for (;;) {
        msg *m = sg_mailbox_get(worker_mb[w->id]);
        if (cfg.verbose) fprintf(stderr, "%.6f worker %d: reply kind %d ps %d chunk %d\n", simgrid_get_clock(), w->id, m->kind, m->ps, m->chunk);
        if (m->kind == MSG_PARAMS) {
            charge((cfg.c.worker_msg + cfg.c.worker_byte * cfg.cbytes[m->ps][m->chunk]) / 2, &w->cpu);
            w->arrived[m->ps][m->chunk] = 1;
        }
        else w->sparse_wait--;
        free(m);
        sg_sem_release(w->arrival);
    }
}

static void make_ready(worker_state *w, int layer) {
    for (int k = cfg.ready_begin[layer]; k < cfg.ready_begin[layer + 1]; k++) {
        chunk_ref r = cfg.ready[k];
        w->arrived[r.ps][r.chunk] = 0;
        w->ready[r.ps][r.chunk] = 1;
        sg_sem_release(w->to_send[r.ps % n_streams()]);
    }
}

static void wait_layer(worker_state *w, int layer) {
    for (;;) {
        int all = 1;
        for (int k = cfg.need_begin[layer]; all && k < cfg.need_begin[layer + 1]; k++)
            all = w->arrived[cfg.need[k].ps][cfg.need[k].chunk];
        if (all) return;
        sg_sem_acquire(w->arrival);
    }
}

static void sparse_exchange(worker_state *w, int kind, long step) {
    double ids = cfg.sparse_ids / cfg.P;
    w->sparse_wait += cfg.P;
    for (int p = 0; p < cfg.P; p++) {
        msg *m = malloc(sizeof *m);
        double b = kind == MSG_SPULL ? ids * cfg.sparse_tables * 8
                                     : ids * (cfg.sparse_tables * 8 + cfg.sparse_floats * cfg.enc);
        *m = (msg){.kind = kind, .worker = w->id, .ps = p, .step = step, .bytes = b};
        charge(cfg.c.worker_msg + cfg.c.worker_byte * b, &w->cpu);
        w->bytes_out += wire(b);
        send_async(ps_mb[p], m);
    }
}

static void sparse_wait(worker_state *w) {
    while (w->sparse_wait > 0) sg_sem_acquire(w->arrival);
}

static void worker_main(int argc, char **argv) {
    (void)argc;
    worker_state *w = &workers[atoi(argv[0])];
    int sparse = cfg.sparse_ids > 0;
    if (sparse) sparse_exchange(w, MSG_SPULL, 0); /* the first batch pulls for itself */
    for (int t = 0; t < cfg.steps; t++) {
        double scale = 1 + cfg.jitter * (2 * urand() - 1);
        if (sparse) {
            /* batch t's rows (prefetched under t - 1 and, sync, held by the ps until step t - 1 is
             * applied) and the acks of the push of t - 1 */
            sparse_wait(w);
            double since = simgrid_get_clock();
            /* the next batch's pull goes out once this forward has its rows */
            sparse_exchange(w, MSG_SPULL, t + 1);
            for (int i = 0; i < cfg.n_layers; i++) {
                wait_layer(w, i);
                sg_actor_sleep_for(cfg.fwd_s[i] * scale);
            }
            /* real compute, then a sleep until C has passed since the rows were in (emulate.c) */
            double left = since + cfg.compute_ms * 1e-3 * scale - simgrid_get_clock();
            if (left > 0) sg_actor_sleep_for(left);
            for (int i = cfg.n_layers - 1; i >= 0; i--) make_ready(w, i);
            sparse_exchange(w, MSG_SPUSH, t);
            w->step_end[t] = simgrid_get_clock();
            continue;
        }
        for (int i = 0; i < cfg.n_layers; i++) {
            wait_layer(w, i);
            sg_actor_sleep_for(cfg.fwd_s[i] * scale);
        }
        for (int i = cfg.n_layers - 1; i >= 0; i--) {
            sg_actor_sleep_for(cfg.bwd_s[i] * scale);
            if (cfg.overlap) make_ready(w, i);
        }
        if (!cfg.overlap) {
            for (int i = cfg.n_layers - 1; i >= 0; i--) make_ready(w, i);
            for (int i = 0; i < cfg.n_layers; i++) wait_layer(w, i); /* the exchange ends before the next step */
        }
        /* a step ends with its backward (and, without overlap, its exchange): the time between two
         * ends is a whole step, whichever part waited */
        w->step_end[t] = simgrid_get_clock();
    }
    /* the last step's exchange */
    for (int i = 0; i < cfg.n_layers; i++) wait_layer(w, i);
    if (sparse) sparse_wait(w);
    w->end = simgrid_get_clock();
}

/* ---- the model's layout ------------------------------------------------------------------------ */

/* emulate.c's per-layer multiply-adds per example */
static double layer_cost(const dt_layer_spec *s, const dt_layer_shape *sh) {
    double out = (double)sh->out_h * sh->out_w * sh->out_c;
    switch (s->kind) {
    case DT_LAYER_CONV2D: return out * s->k_h * s->k_w * sh->in_c;
    case DT_LAYER_DENSE: return (double)sh->n_weights;
    case DT_LAYER_MAXPOOL: return out * s->k_h * s->k_w;
    default: return out;
    }
}

static int die(const char *what) {
    fprintf(stderr, "dtrain_sim: %s\n", what);
    exit(2);
}

static void build_layout(const char *model_path) {
    dt_model_spec spec;
    dt_error e = {0};
    if (dt_model_spec_load(&spec, model_path, &e)) die(e.msg);
    dt_net *net = NULL;
    int compact = 0;
    for (int i = 0; i < spec.n_layers; i++) compact |= spec.layers[i].kind == DT_LAYER_EMBEDDING;
    if ((compact ? dt_net_build_compact(&net, &spec, 1, &e) : dt_net_build(&net, &spec, 1, &e))) die(e.msg);
    int n = dt_net_num_layers(net);
    dt_layer_shape *sh = calloc((size_t)n, sizeof *sh);
    if (!sh || dt_model_spec_shapes(dt_net_spec(net), sh, NULL, &e)) die(e.msg[0] ? e.msg : "out of memory");
    const dt_model_spec *sp = dt_net_spec(net);
    double *cost = calloc((size_t)n, sizeof *cost), total = 0;
    for (int i = 0; i < n; i++) total += cost[i] = compact ? 0 : layer_cost(&sp->layers[i], &sh[i]);
    cfg.n_layers = n;
    cfg.fwd_s = calloc((size_t)n, sizeof(double)), cfg.bwd_s = calloc((size_t)n, sizeof(double));
    for (int i = 0; i < n && total > 0; i++) {
        cfg.fwd_s[i] = cfg.compute_ms * 1e-3 * cost[i] / total / 3;
        cfg.bwd_s[i] = cfg.compute_ms * 1e-3 * cost[i] / total * 2 / 3;
    }
    dt_placement pl;
    int dense = 1;
    if (dt_placement_compute_dense(&pl, net, cfg.P, DT_PLACE_GREEDY, &e)) {
        /* a click-log model's few dense floats on fewer ps than P: left out, as small beside its rows */
        if (!compact) die(e.msg);
        dense = 0;
    }
    cfg.m = calloc((size_t)cfg.P, sizeof(int));
    cfg.cbytes = calloc((size_t)cfg.P, sizeof(double *));
    /* per chunk: the layers it touches -> ready after the lowest one's backward, needed by each */
    size_t *loff = calloc((size_t)n, sizeof(size_t)), *lcnt = calloc((size_t)n, sizeof(size_t));
    for (int i = 0; i < n; i++)
        if (!dt_net_layer_params(net, i, &loff[i], &lcnt[i])) lcnt[i] = 0;
    int cap = 1024, nn = 0, nr = 0;
    chunk_ref *need = malloc(sizeof *need * (size_t)cap * 4), *ready = malloc(sizeof *ready * (size_t)cap * 4);
    int *need_layer = malloc(sizeof(int) * (size_t)cap * 4), *ready_layer = malloc(sizeof(int) * (size_t)cap * 4);
    int ncap = cap * 4, rcap = cap * 4;
    cfg.model_bytes = 0;
    for (int p = 0; p < cfg.P && dense; p++) {
        uint64_t sf = pl.shard_count[p];
        unsigned m = dt_wire_chunks_for(sf, (uint64_t)cfg.chunk_bytes);
        /* --first_chunk_kb: a design, not the protocol: chunk 0 (the first layers' floats, final
         * last in backward and needed first by forward) cut short, the rest even */
        uint64_t first = (uint64_t)(cfg.first_chunk_bytes / 4);
        if (first && first < sf && m < DT_WIRE_MAX_CHUNKS) m++;
        else first = 0;
        cfg.m[p] = (int)m;
        cfg.cbytes[p] = calloc(m, sizeof(double));
        for (unsigned c = 0; c < m; c++) {
            uint64_t off, len;
            if (first) {
                if (c == 0) off = 0, len = first;
                else dt_wire_chunk(sf - first, m - 1, c - 1, &off, &len), off += first;
            } else {
                dt_wire_chunk(sf, m, c, &off, &len);
            }
            cfg.cbytes[p][c] = (double)len * 4;
            cfg.model_bytes += (double)len * 4;
            int lowest = -1;
            for (int k = pl.ps_begin[p]; k < pl.ps_begin[p + 1]; k++) {
                const dt_slice *s = &pl.slices[pl.ps_slices[k]];
                uint64_t a = off > s->shard_offset ? off : s->shard_offset;
                uint64_t b = off + len < s->shard_offset + s->count ? off + len : s->shard_offset + s->count;
                if (a >= b) continue;
                size_t fa = s->offset + (a - s->shard_offset), fb = s->offset + (b - s->shard_offset);
                for (int i = 0; i < n; i++) {
                    if (!lcnt[i] || loff[i] >= fb || loff[i] + lcnt[i] <= fa) continue;
                    int dup = 0;
                    for (int q = nn - 1; q >= 0 && need[q].ps == p && need[q].chunk == (int)c; q--)
                        dup |= need_layer[q] == i;
                    if (!dup) {
                        if (nn == ncap) {
                            ncap *= 2;
                            need = realloc(need, sizeof *need * (size_t)ncap);
                            need_layer = realloc(need_layer, sizeof(int) * (size_t)ncap);
                        }
                        need[nn] = (chunk_ref){p, (int)c}, need_layer[nn++] = i;
                    }
                    if (lowest < 0 || i < lowest) lowest = i;
                }
            }
            if (lowest < 0) lowest = 0;
            if (nr == rcap) {
                rcap *= 2;
                ready = realloc(ready, sizeof *ready * (size_t)rcap);
                ready_layer = realloc(ready_layer, sizeof(int) * (size_t)rcap);
            }
            ready[nr] = (chunk_ref){p, (int)c}, ready_layer[nr++] = lowest;
        }
    }
    /* bucket by layer (CSR) */
    cfg.need_begin = calloc((size_t)n + 1, sizeof(int)), cfg.ready_begin = calloc((size_t)n + 1, sizeof(int));
    cfg.need = malloc(sizeof *cfg.need * (size_t)(nn ? nn : 1)), cfg.ready = malloc(sizeof *cfg.ready * (size_t)(nr ? nr : 1));
    for (int q = 0; q < nn; q++) cfg.need_begin[need_layer[q] + 1]++;
    for (int q = 0; q < nr; q++) cfg.ready_begin[ready_layer[q] + 1]++;
    for (int i = 0; i < n; i++) cfg.need_begin[i + 1] += cfg.need_begin[i], cfg.ready_begin[i + 1] += cfg.ready_begin[i];
    int *fill = calloc((size_t)n, sizeof(int));
    for (int q = 0; q < nn; q++) cfg.need[cfg.need_begin[need_layer[q]] + fill[need_layer[q]]++] = need[q];
    memset(fill, 0, sizeof(int) * (size_t)n);
    for (int q = 0; q < nr; q++) cfg.ready[cfg.ready_begin[ready_layer[q]] + fill[ready_layer[q]]++] = ready[q];
    free(fill), free(need), free(ready), free(need_layer), free(ready_layer), free(loff), free(lcnt), free(cost),
        free(sh);
    if (dense) dt_placement_free(&pl);
    dt_net_free(net);
    dt_model_spec_free(&spec);
}

static void read_costs(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "dtrain_sim: %s: cannot open the cost file (make it with bench_simcost)\n", path);
        exit(2);
    }
    char line[512];
    int lineno = 0, seen = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char key[64];
        double v;
        if (line[0] == '#' || line[0] == '\n') continue;
        if (sscanf(line, "%63s %lf", key, &v) != 2 || !(v >= 0) || v > 1) {
            fprintf(stderr, "dtrain_sim: %s:%d: expected \"KEY SECONDS\" with 0 <= SECONDS <= 1\n", path, lineno);
            exit(2);
        }
        struct { const char *k; double *p; } keys[] = {
            {"ps_msg", &cfg.c.ps_msg}, {"ps_byte", &cfg.c.ps_byte}, {"ps_apply_msg", &cfg.c.ps_apply_msg},
            {"ps_apply_byte", &cfg.c.ps_apply_byte}, {"worker_msg", &cfg.c.worker_msg},
            {"worker_byte", &cfg.c.worker_byte}, {"ps_row", &cfg.c.ps_row}};
        int found = 0;
        for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
            if (!strcmp(key, keys[i].k)) *keys[i].p = v, found = 1, seen |= 1 << i;
        if (!found) {
            fprintf(stderr, "dtrain_sim: %s:%d: unknown key %s\n", path, lineno, key);
            exit(2);
        }
    }
    fclose(f);
    if ((seen & 63) != 63) {
        fprintf(stderr, "dtrain_sim: %s: needs ps_msg ps_byte ps_apply_msg ps_apply_byte worker_msg worker_byte\n", path);
        exit(2);
    }
}

static const char *write_platform(void) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/dtrain_sim_%d.xml", (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f) die("cannot write the platform file in /tmp");
    double bw = cfg.gbit * 1e9 / 8 * TCP_EFFICIENCY; /* payload bytes/s */
    /* Each host's link: full duplex (SPLITDUPLEX: up and down apart), no latency (the bed's round
     * trip, tens of microseconds, left out: SimGrid would add it to every chunk of a stream, which
     * TCP does not). No backbone: the bed's bridge is never the limit, and a backbone shared by every
     * flow makes SimGrid solve all of them at every event (5x slower at 32 workers). */
    fprintf(f, "<?xml version='1.0'?>\n<!DOCTYPE platform SYSTEM \"https://simgrid.org/simgrid.dtd\">\n"
               "<platform version=\"4.1\">\n"
               "<cluster id=\"bed\" prefix=\"h\" suffix=\"\" radical=\"0-%d\" speed=\"%.0ff\" core=\"%d\" "
               "bw=\"%.0fBps\" lat=\"0us\" sharing_policy=\"SPLITDUPLEX\" "
               "/>\n</platform>\n",
            cfg.P + cfg.W - 1, FLOPS, cfg.cores, bw);
    fclose(f);
    return path;
}

static void usage(void) {
    fprintf(stderr, "usage: dtrain_sim --model FILE --ps P --workers W [--gbit G] [--compute_ms C] [--sync 1|0]\n"
                    "       [--overlap priority|none] [--chunk_kb K] [--steps N] [--costs FILE] [--cores N] [--streams N] [--first_chunk_kb K]\n"
                    "       [--jitter F] [--sparse_ids N] [--encoding_bytes 4|2] [--verbose]\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *model = NULL, *costs_path = "sim/costs.txt";
    char *sargv[32] = {argv[0], "--cfg=network/model:CM02", "--cfg=network/crosstraffic:0",
                       "--cfg=network/TCP-gamma:1e12", "--log=root.thres:critical",
                       /* tens of thousands of actors at 256 workers: small stacks, no guard pages (a
                        * mapping each; Linux allows 65,536 a process) */
                       "--cfg=contexts/stack-size:128", "--cfg=contexts/guard-size:0"};
    int sargc = 7;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--verbose")) { cfg.verbose = 1; continue; }
        if (!strncmp(a, "--cfg=", 6) && sargc < 31) { sargv[sargc++] = argv[i]; continue; } /* SimGrid's own */
        if (!v) usage();
        i++;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--ps")) cfg.P = atoi(v);
        else if (!strcmp(a, "--workers")) cfg.W = atoi(v);
        else if (!strcmp(a, "--gbit")) cfg.gbit = atof(v);
        else if (!strcmp(a, "--compute_ms")) cfg.compute_ms = atof(v);
        else if (!strcmp(a, "--sync")) cfg.sync = atoi(v);
        else if (!strcmp(a, "--overlap")) cfg.overlap = strcmp(v, "none") != 0;
        else if (!strcmp(a, "--chunk_kb")) cfg.chunk_bytes = atof(v) * 1024;
        else if (!strcmp(a, "--steps")) cfg.steps = atoi(v);
        else if (!strcmp(a, "--costs")) costs_path = v;
        else if (!strcmp(a, "--cores")) cfg.cores = atoi(v);
        else if (!strcmp(a, "--streams")) cfg.streams = atoi(v);
        else if (!strcmp(a, "--first_chunk_kb")) cfg.first_chunk_bytes = atof(v) * 1024;
        else if (!strcmp(a, "--jitter")) cfg.jitter = atof(v);
        else if (!strcmp(a, "--sparse_ids")) cfg.sparse_ids = atof(v);
        else if (!strcmp(a, "--encoding_bytes")) cfg.enc = atof(v);
        else usage();
    }
    if (!model || cfg.P < 1 || cfg.W < 1 || cfg.P > 4096 || cfg.W > 4096 || !(cfg.gbit > 0) ||
        !(cfg.compute_ms >= 0) || cfg.steps < 3 || cfg.cores < 1 || cfg.streams < 1 || !(cfg.jitter >= 0 && cfg.jitter < 1) ||
        !(cfg.sparse_ids >= 0) || (cfg.enc != 4 && cfg.enc != 2) || !(cfg.chunk_bytes >= 0) || !(cfg.first_chunk_bytes >= 0))
        usage();
    cfg.warm = cfg.steps / 3;
    read_costs(costs_path);
    build_layout(model);
    if (cfg.sparse_ids > 0) {
        /* a click-log model's tables: every id is in each table (fm: weights dim 1, factors dim 8) */
        dt_model_spec spec;
        dt_error e = {0};
        if (dt_model_spec_load(&spec, model, &e)) die(e.msg);
        cfg.sparse_tables = 0, cfg.sparse_floats = 0;
        for (int i = 0; i < spec.n_layers; i++)
            if (spec.layers[i].kind == DT_LAYER_EMBEDDING) cfg.sparse_tables++, cfg.sparse_floats += spec.layers[i].dim;
        dt_model_spec_free(&spec);
        if (!cfg.sparse_tables) die("--sparse_ids: the model has no embedding table");
    }

    simgrid_init(&sargc, sargv);
    const char *plat = write_platform();
    simgrid_load_platform(plat);
    unlink(plat);

    ps_mb = calloc((size_t)cfg.P, sizeof *ps_mb);
    worker_mb = calloc((size_t)cfg.W, sizeof *worker_mb);
    pss = calloc((size_t)cfg.P, sizeof *pss);
    workers = calloc((size_t)cfg.W, sizeof *workers);
    char name[64], arg0[16], arg1[16];
    for (int p = 0; p < cfg.P; p++) {
        snprintf(name, sizeof name, "ps%d", p);
        ps_mb[p] = sg_mailbox_by_name(name);
        pss[p].id = p;
        pss[p].acc = calloc((size_t)cfg.m[p], sizeof(int));
        snprintf(name, sizeof name, "h%d", p);
        sg_host_t h = sg_host_by_name(name);
        snprintf(arg0, sizeof arg0, "%d", p);
        pss[p].held = calloc((size_t)cfg.W * 2 + 2, sizeof(msg *));
        pss[p].out = calloc((size_t)n_streams_ps(), sizeof *pss[p].out);
        for (int k = 0; k < n_streams_ps(); k++) pss[p].out[k].sem = sg_sem_init(0);
        for (int k = 0; k < cfg.cores; k++) {
            snprintf(arg1, sizeof arg1, "%d", k);
            char *av[] = {arg0, arg1, NULL};
            sg_actor_t a = sg_actor_create("ps", h, ps_main, 2, av);
            sg_actor_daemonize(a);
        }
        for (int k = 0; k < n_streams_ps(); k++) {
            snprintf(arg1, sizeof arg1, "%d", k);
            char *av2[] = {arg0, arg1, NULL};
            sg_actor_daemonize(sg_actor_create("ps_sender", h, ps_sender_main, 2, av2));
        }
    }
    for (int j = 0; j < cfg.W; j++) {
        worker_state *w = &workers[j];
        w->id = j;
        w->arrived = calloc((size_t)cfg.P, sizeof *w->arrived);
        w->ready = calloc((size_t)cfg.P, sizeof *w->ready);
        w->to_send = calloc((size_t)n_streams(), sizeof *w->to_send);
        w->arrival = sg_sem_init(0);
        w->step_end = calloc((size_t)cfg.steps, sizeof(double));
        for (int p = 0; p < cfg.P; p++) {
            w->arrived[p] = malloc((size_t)cfg.m[p]);
            memset(w->arrived[p], 1, (size_t)cfg.m[p]);
            w->ready[p] = calloc((size_t)cfg.m[p], 1);
        }
        for (int k = 0; k < n_streams(); k++) w->to_send[k] = sg_sem_init(0);
        snprintf(name, sizeof name, "w%d", j);
        worker_mb[j] = sg_mailbox_by_name(name);
        snprintf(name, sizeof name, "h%d", cfg.P + j);
        sg_host_t h = sg_host_by_name(name);
        snprintf(arg0, sizeof arg0, "%d", j);
        char *av[] = {arg0, NULL};
        sg_actor_create("worker", h, worker_main, 1, av);
        sg_actor_daemonize(sg_actor_create("receiver", h, receiver_main, 1, av));
        for (int k = 0; k < n_streams(); k++) {
            snprintf(arg1, sizeof arg1, "%d", k);
            char *av2[] = {arg0, arg1, NULL};
            sg_actor_daemonize(sg_actor_create("sender", h, sender_main, 2, av2));
        }
    }
    simgrid_run();

    /* the mean step over the steps after the warm-up, over every worker */
    double step = 0;
    for (int j = 0; j < cfg.W; j++)
        step += (workers[j].step_end[cfg.steps - 1] - workers[j].step_end[cfg.warm]) / (cfg.steps - 1 - cfg.warm);
    step /= cfg.W;
    double T = 0;
    for (int j = 0; j < cfg.W; j++) T = fmax(T, workers[j].end);
    double B = cfg.gbit * 1e9 / 8 * TCP_EFFICIENCY;
    double ps_link = 0, ps_cpu = 0, w_link = 0;
    for (int p = 0; p < cfg.P; p++) {
        ps_link = fmax(ps_link, pss[p].bytes_in / (B * T));
        ps_cpu = fmax(ps_cpu, pss[p].cpu / (cfg.cores * T));
    }
    double w_cpu = 0;
    for (int j = 0; j < cfg.W; j++) {
        w_link = fmax(w_link, workers[j].bytes_out / (B * T));
        w_cpu = fmax(w_cpu, workers[j].cpu / (cfg.cores * T));
    }
    double compute = cfg.compute_ms * 1e-3 / step;
    /* the bound: compute where the step is within 5% of it; else the busiest resource of the
     * exchange (the one the step waits on most, its share of the time) */
    const char *bound = "compute";
    double top = compute >= 1 / 1.05 ? 2 : 0;
    if (ps_link > top) top = ps_link, bound = "ps_link";
    if (ps_cpu > top) top = ps_cpu, bound = "ps_cpu";
    if (w_link > top) top = w_link, bound = "worker_link";
    if (w_cpu > top) top = w_cpu, bound = "worker_cpu";
    /* BytePS, non-colocated ps: no exchange is shorter than max(M/B, W M / (P B)) (wire bytes). */
    double M = cfg.sparse_ids > 0 ? cfg.sparse_ids * (cfg.sparse_tables * 8 + cfg.sparse_floats * cfg.enc)
                                  : cfg.model_bytes / 4 * cfg.enc;
    double exch = fmax(M / B, cfg.W * M / (cfg.P * B));
    printf("workers=%d ps=%d gbit=%g compute_ms=%g sync=%d step_ms=%.3f closed_exchange_ms=%.3f "
           "closed_step_ms=%.3f model_bytes=%.0f bound=%s util_ps_link=%.3f util_ps_cpu=%.3f "
           "util_worker_link=%.3f util_worker_cpu=%.3f compute_share=%.3f\n",
           cfg.W, cfg.P, cfg.gbit, cfg.compute_ms, cfg.sync, step * 1e3, exch * 1e3,
           fmax(cfg.compute_ms * 1e-3, exch) * 1e3, M, bound, ps_link, ps_cpu, w_link, w_cpu, compute);
    return 0;
}
