/* The training driver: the C counterpart of the source's script, single-machine or distributed.
 * It resolves the cluster, then either serves as a ps or trains with an updater: local (the
 * optimizer runs here) or remote (the ps tasks hold the variables). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/clock.h"
#include "cluster/cluster.h"
#include "cluster/manager.h"
#include "cluster/placement.h"
#include "compute/kernels.h"
#include "compute/optim.h"
#include "compute/precision.h"
#include "transport/wire.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/loader.h"
#include "metrics/http.h"
#include "metrics/metrics.h"
#include "metrics/names.h"
#include "metrics/status_poll.h"
#include "metrics/status.h"
#include "model/net.h"
#include "ps/coord.h"
#include "supervisor/supervisor.h"
#include "train/serve.h"
#include "train/ctr_ahead.h"
#include "train/ctr_count.h"
#include "train/emulate.h"
#include "train/evaluate.h"
#include "train/evaluate_ctr.h"
#include "train/progress.h"
#include "train/local_tables.h"
#include "train/table_ckpt.h"
#include "train/table_optim.h"
#include "train/train_debug.h"
#include "train/train_ex.h"
#include "train/work_loop.h"
#include "update/updater.h"
#include "transport/auth.h"
#include "worker/remote.h"

void dt_train_options_init(dt_train_options *o) {
    memset(o, 0, sizeof *o);
    o->optimizer = "adam";
    o->learning_rate = 0.002f;
    o->table_initial_accumulator = 0.1;
    o->table_lr_power = -0.5;
    o->batch_size = 64;
    o->epochs = 1.0;
    o->steps_to_validate = 1000;
    o->seed = 1;
    o->validation_fraction = -1.0;
    o->placement = "greedy";
    o->compression = "none";
    o->precision = "float32";
    o->overlap = "priority";
    o->sparse_prefetch = 1;
    o->chunk_kb = (int)(DT_WIRE_CHUNK_BYTES_DEFAULT >> 10);
    o->base_port = DT_BASE_PORT_DEFAULT;
    o->connect_timeout_ms = 60000;
    o->ps_timeout_ms = 120000;
    o->idle_timeout_ms = 600000;
    o->logdir = "./checkpoint";
    o->save_model_secs = 60;
    o->max_to_keep = 5;
    o->summary_dir = "./summary_log";
}

void dt_train_debug_init(dt_train_debug *d) {
    memset(d, 0, sizeof *d);
    d->delay_worker = -1;
    d->emulate_compute_ms = -1;
}

static int check_debug(const dt_train_debug *d, dt_error *err) {
    if (d->step_delay_ms < 0) return dt_errorf(err, DT_EINVAL, "step_delay_ms must not be negative");
    if (d->import_delay_ms < 0 || d->import_delay_ms > 600000)
        return dt_errorf(err, DT_EINVAL, "import_delay_ms must be in 0..600000, got %d", d->import_delay_ms);
    if (d->emulate_compute_ms > 600000)
        return dt_errorf(err, DT_EINVAL, "emulate_compute_ms must be at most 600000, got %d",
                         d->emulate_compute_ms);
    return DT_OK;
}

static int check_cluster_options(const dt_train_options *o, dt_error *err);
int dt_train_check_cluster(const dt_train_options *o, dt_error *err) { return check_cluster_options(o, err); }

static int check_options(const dt_train_options *o, dt_error *err) {
    if (!o->model_path || !*o->model_path) return dt_errorf(err, DT_EINVAL, "model_path: no model file given");
    if (o->batch_size < 1 || o->batch_size > 65536)
        return dt_errorf(err, DT_EINVAL, "batch_size must be in 1..65536, got %d", o->batch_size);
    if (o->train_steps <= 0 && !(o->epochs > 0 && isfinite(o->epochs)))
        return dt_errorf(err, DT_EINVAL, "epochs must be positive when train_steps is not given");
    if (o->steps_to_validate < 1)
        return dt_errorf(err, DT_EINVAL, "steps_to_validate must be at least 1, got %lld",
                         (long long)o->steps_to_validate);
    if (o->validation_fraction >= 1.0)
        return dt_errorf(err, DT_EINVAL, "validation_fraction must be below 1, got %g",
                         o->validation_fraction);
    return check_cluster_options(o, err);
}

/* The options of a task's role in a cluster (a worker's exchange, a ps's serving, sharding). */
static int check_cluster_options(const dt_train_options *o, dt_error *err) {
    if (o->issync != 0 && o->issync != 1)
        return dt_errorf(err, DT_EINVAL, "issync must be 0 or 1, got %d", o->issync);
    if (o->replicas_to_aggregate < 0 || o->total_num_replicas < 0)
        return dt_errorf(err, DT_EINVAL, "replicas_to_aggregate and total_num_replicas must not be negative");
    if (o->staleness < 0 || o->staleness > 64)
        return dt_errorf(err, DT_EINVAL, "staleness must be in 0..64, got %d", o->staleness);
    if (!o->issync && (o->replicas_to_aggregate || o->total_num_replicas || o->staleness))
        return dt_errorf(err, DT_EINVAL, "replicas_to_aggregate, total_num_replicas and staleness need "
                                         "issync=1 (asynchronous training is unbounded)");
    if (o->total_num_replicas && o->replicas_to_aggregate > o->total_num_replicas)
        return dt_errorf(err, DT_EINVAL, "replicas_to_aggregate=%d is more than total_num_replicas=%d",
                         o->replicas_to_aggregate, o->total_num_replicas);
    dt_encoding enc;
    int rc = dt_enc_parse(o->compression, &enc, err);
    if (rc) return rc;
    dt_overlap_mode overlap;
    if ((rc = dt_overlap_parse(o->overlap ? o->overlap : "priority", &overlap, err))) return rc;
    if (o->chunk_kb < 0 || o->chunk_kb > (1 << 22))
        return dt_errorf(err, DT_EINVAL, "chunk_kb=%d must be 0 (one chunk per shard) to %d", o->chunk_kb, 1 << 22);
    if (o->connect_timeout_ms < 1)
        return dt_errorf(err, DT_EINVAL, "connect_timeout must be positive");
    if (o->ps_timeout_ms < 0 || o->idle_timeout_ms < 0)
        return dt_errorf(err, DT_EINVAL, "ps_timeout and idle_timeout must not be negative");
    if (!(o->ps_table_memory_gib >= 0 && o->ps_table_memory_gib <= 1048576))
        return dt_errorf(err, DT_EINVAL, "ps_table_memory must be 0 (three quarters of the memory) to 1048576 GiB, "
                         "got %g", o->ps_table_memory_gib);
    if (dt_bind_check(o->bind, err)) return DT_EINVAL;
    if (o->sharding && strcmp(o->sharding, "fixed") && strcmp(o->sharding, "dynamic"))
        return dt_errorf(err, DT_EINVAL, "sharding: expected fixed or dynamic, got '%s'", o->sharding);
    if (o->unit_batches < 0 || o->unit_batches > (int)DT_COORD_MAX_UNIT_BATCHES)
        return dt_errorf(err, DT_EINVAL, "unit_batches must be in 0..%u, got %d", DT_COORD_MAX_UNIT_BATCHES,
                         o->unit_batches);
    if (o->max_workers < 0 || o->max_workers > (int)DT_COORD_MAX_WORKERS)
        return dt_errorf(err, DT_EINVAL, "max_workers must be in 0..%u, got %d", DT_COORD_MAX_WORKERS, o->max_workers);
    return DT_OK;
}

/* --sharding dynamic (docs/elastic.md); one process trains the permutation in order without it. */
static int dynamic_sharding(const dt_train_options *o) { return o->sharding && !strcmp(o->sharding, "dynamic"); }

/* The run's optimizer: kind and rate, the learning-rate schedule and weight decay (README,
 * "Training options"). total: the run's global steps, which cosine's decay spans after the warmup
 * unless --lr_decay_steps says otherwise. */
static int opt_from_options(const dt_train_options *o, int64_t total, dt_opt_config *c, dt_error *err) {
    int rc = dt_opt_config_init(c, o->optimizer, o->learning_rate, err);
    if (rc) return rc;
    dt_lr_schedule *s = &c->schedule;
    if ((rc = dt_lr_kind_parse(o->lr_schedule && *o->lr_schedule ? o->lr_schedule : "constant", &s->kind, err)))
        return rc;
    int lists = (o->lr_boundaries && *o->lr_boundaries) || (o->lr_values && *o->lr_values);
    if (s->kind == DT_LR_PIECEWISE) {
        if (!(o->lr_boundaries && *o->lr_boundaries && o->lr_values && *o->lr_values))
            return dt_errorf(err, DT_EINVAL, "lr_schedule piecewise needs lr_boundaries and lr_values");
        if ((rc = dt_lr_parse_boundaries(s, o->lr_boundaries, err)) || (rc = dt_lr_parse_values(s, o->lr_values, err)))
            return rc;
    } else if (lists) {
        return dt_errorf(err, DT_EINVAL, "lr_boundaries and lr_values need lr_schedule piecewise");
    }
    if (s->kind == DT_LR_EXPONENTIAL && (!o->lr_decay_steps || !o->lr_decay_rate))
        return dt_errorf(err, DT_EINVAL, "lr_schedule exponential needs lr_decay_steps and lr_decay_rate");
    s->staircase = o->lr_staircase;
    s->decay_steps = o->lr_decay_steps;
    s->decay_rate = (float)o->lr_decay_rate;
    s->alpha = (float)o->lr_alpha;
    s->warmup_steps = o->warmup_steps;
    if (s->kind == DT_LR_COSINE && !s->decay_steps) {
        if (s->warmup_steps >= total)
            return dt_errorf(err, DT_EINVAL, "warmup_steps %lld leaves nothing of the run's %lld steps to decay over "
                             "(give lr_decay_steps)", (long long)s->warmup_steps, (long long)total);
        s->decay_steps = total - s->warmup_steps;
    }
    if ((rc = dt_lr_schedule_check(s, err))) return rc;
    if (!(o->weight_decay >= 0 && o->weight_decay <= DT_WIRE_MAX_WEIGHT_DECAY))
        return dt_errorf(err, DT_EINVAL, "weight_decay must be in 0..%g, got %g", (double)DT_WIRE_MAX_WEIGHT_DECAY,
                         o->weight_decay);
    if (o->weight_decay_biases && !o->weight_decay)
        return dt_errorf(err, DT_EINVAL, "weight_decay_biases needs weight_decay");
    c->weight_decay = (float)o->weight_decay;
    c->decay_rank1 = o->weight_decay_biases;
    if (!(o->clip_gradient_norm >= 0 && o->clip_gradient_norm <= 1e30))
        return dt_errorf(err, DT_EINVAL, "clip_gradient_norm must be a non-negative number, got %g",
                         o->clip_gradient_norm);
    return DT_OK;
}

int dt_train_opt_config(const dt_train_options *o, int64_t total, dt_opt_config *c, dt_error *err) {
    return opt_from_options(o, total, c, err);
}

/* --debug_dump_params, --debug_dump_grads: the final parameters or the first gradient as raw
 * little-endian float32, for tests that compare runs. */
static int dump_floats(const char *flag, const char *path, const float *x, size_t n, dt_error *err) {
    FILE *f = fopen(path, "wb");
    if (!f) return dt_errorf(err, DT_EIO, "--%s: cannot create %s", flag, path);
    int bad = fwrite(x, sizeof(float), n, f) != n;
    bad |= fclose(f) != 0;
    return bad ? dt_errorf(err, DT_EIO, "--%s: cannot write %s", flag, path) : DT_OK;
}

/* How a run is cut into steps, from the data, the cluster and the flags (open_data). */
typedef struct {
    int n_workers, shard;           /* this worker trains on shard `shard` of n_workers */
    int sync, aggregate, replicas;  /* sync replicas: gradients per step, workers pushing */
    int64_t per_epoch;              /* this worker's batches per epoch */
    int64_t global_per_epoch;       /* global steps per epoch */
    int64_t total;                  /* global steps of the run */
    double examples_per_step;       /* per global step, every worker's */
    int dynamic;                    /* --sharding dynamic: per_epoch is the whole epoch's batches */
    int counting;                   /* a click log's lines are still being counted: per_epoch, and
                                       total unless --train_steps, are lower bounds (ctr_settle) */
    int max_workers;                /* dynamic: worker task indices that may join */
} run_plan;

/* Everything a run owns, so one cleanup path frees it whatever failed. */
typedef struct {
    dt_cluster cluster;
    dt_placement placement;
    dt_net *net;
    dt_data_splits data;
    dt_loader *loader;
    float *it_x;                  /* a batch source's uint8 batch scaled (ex->next_batch) */
    dt_ctr_reader *ctr;           /* a click-log model's training lines (the loader's place) */
    dt_ctr_ahead *ahead;          /* ... read a batch ahead for the sparse prefetch (NULL: off) */
    dt_ctr_counter *counter;      /* ... its lines, counted beside the steps (ctr_count.h) */
    uint64_t ctr_lines;           /* ... how many so far (every shard's): all once plan.counting is 0 */
    dt_updater *updater;
    dt_opt_config opt;
    dt_lazy_config table_opt;     /* the embedding tables' (table_optim.h) */
    dt_supervisor *supervisor;    /* the chief's checkpoints and summaries; NULL elsewhere */
    dt_table_spool *spool;        /* a checkpoint's unbounded tables, between prepare_tables and save_tables */
    dt_local_tables *tables;      /* one process's tables of a compact net (unbounded ids); NULL elsewhere */
    dt_auth auth;                 /* --auth=curve: this task's keys */
    dt_progress prog;             /* the live progress line (a terminal) */
    FILE *log, *log_out;          /* training's log: log_out, through the progress line's stream */
    const dt_train_debug *dbg;    /* the test hooks (train_debug.h) */
    const dt_train_ex_args *ex;   /* a binding's arrays and callback (train_ex.h); NULL: none */
    run_plan plan;
    /* --metrics_port: the registry, the status page's figures, its server, the chief's peer poll */
    dt_metrics *metrics;
    dt_status *status;
    dt_http *http;
    dt_peer_poll *peers;
    dt_work_loop *work;           /* --sharding dynamic: the units ps 0 grants (NULL: fixed shards) */
    FILE *work_log;               /* --debug_work_log */
    struct {
        dt_metric *step, *local, *examples, *step_s, *ckpt_age, *ckpt_s, *ckpts;
    } m;
} run_state;

static void run_free(run_state *r) {
    dt_peer_poll_stop(r->peers);
    dt_http_stop(r->http); /* nothing reads the figures any more */
    dt_supervisor_close(r->supervisor);
    dt_table_spool_free(r->spool);
    dt_work_loop_free(r->work);
    if (r->work_log) fclose(r->work_log);
    if (r->updater) r->updater->free(r->updater);
    dt_local_tables_free(r->tables);
    dt_status_free(r->status); /* nothing updates them any more */
    dt_metrics_free(r->metrics);
    dt_loader_free(r->loader);
    free(r->it_x);
    dt_ctr_ahead_free(r->ahead);
    dt_ctr_counter_free(r->counter);
    dt_ctr_close(r->ctr);
    dt_data_splits_free(&r->data);
    dt_net_free(r->net);
    dt_placement_free(&r->placement);
    dt_cluster_clear(&r->cluster);
    dt_auth_free(&r->auth);
    dt_progress_unwrap(r->log, r->log_out); /* last: the frees above may still log */
}

/* --auth/--keys: a ps loads its server pair and the client keys it accepts, a worker its client
 * pair and the ps's public key (layout in transport/auth.h). Alone on a machine nothing is sent. */
int dt_train_load_auth(dt_auth *a, const dt_train_options *o, const dt_cluster *c, dt_error *err) {
    const char *mode = o->auth && *o->auth ? o->auth : "none";
    if (!strcmp(mode, "none")) {
        if (o->keys && *o->keys) return dt_errorf(err, DT_EINVAL, "keys needs auth=curve");
        return DT_OK;
    }
    if (strcmp(mode, "curve")) return dt_errorf(err, DT_EINVAL, "auth: expected none or curve, got '%s'", mode);
    if (!c->distributed) return DT_OK;
    int rc = dt_auth_load(a, o->keys, c->job == DT_JOB_PS, err);
    return rc ? dt_error_wrap(err, rc, "auth=curve: ") : DT_OK;
}

static int train_loop(run_state *r, const dt_train_options *o, FILE *log_out, dt_train_result *res,
                      dt_error *err);

/* The precedence (docs/cluster.md): the four cluster flags; else --num_ps, the cluster manager's
 * environment; else TF_CONFIG; else this process alone. */
static int resolve_cluster(dt_cluster *c, const dt_train_options *o, FILE *log, dt_error *err);

int dt_train_cluster(dt_cluster *c, const dt_train_options *o, FILE *log, dt_error *err) {
    dt_cluster_single(c);
    int rc = resolve_cluster(c, o, log, err);
    if (!rc && c->distributed && c->n_ps < 1) rc = dt_errorf(err, DT_EINVAL, "ps_hosts: a cluster needs at least one ps task");
    if (!rc && c->job == DT_JOB_EVALUATOR)
        rc = dt_errorf(err, DT_EINVAL, "TF_CONFIG: task type evaluator is not supported by 'dtrain train'");
    return rc;
}

static int resolve_cluster(dt_cluster *c, const dt_train_options *o, FILE *log, dt_error *err) {
    if (o->num_ps <= 0) {
        if (o->rendezvous && *o->rendezvous)
            return dt_errorf(err, DT_EINVAL, "rendezvous needs num_ps (the cluster from mpirun's environment)");
        const char *tf = getenv("TF_CONFIG");
        int rc = dt_cluster_resolve(c, o->ps_hosts, o->worker_hosts, o->job_name, o->task_index, tf, err);
        if (!rc && tf && *tf && !strcmp(c->source, "flags"))
            snprintf(c->origin, sizeof c->origin, "ps_hosts/worker_hosts/job_name/task_index; TF_CONFIG "
                     "ignored (the flags win)");
        return rc;
    }
    const char *given = o->ps_hosts ? "ps_hosts" : o->worker_hosts ? "worker_hosts" : o->job_name ? "job_name"
                        : o->task_index ? "task_index" : NULL;
    if (given)
        return dt_errorf(err, DT_EINVAL, "num_ps: derives the cluster from the cluster manager's environment, "
                         "but %s defines it too: give one or the other", given);
    dt_manager_options m = {.num_ps = o->num_ps, .base_port = o->base_port, .rendezvous = o->rendezvous,
                            .deadline_ms = o->connect_timeout_ms, .log = log};
    return dt_cluster_from_manager(c, &m, err);
}

/* --metrics_port / --metrics_addr: the registry and its HTTP server, started before anything else
 * is loaded so that a port in use stops the run at once; the chief also polls --metrics_peers. */
static int metrics_start(run_state *r, const dt_train_options *o, FILE *log, dt_error *err) {
    char host[64];
    int port, rc = dt_http_listen_spec(o->metrics_addr, o->metrics_port, host, sizeof host, &port, err);
    if (rc || !port) return rc;
    const dt_cluster *c = &r->cluster;
    if ((rc = dt_metrics_create(&r->metrics, c->job == DT_JOB_PS ? "ps" : "worker", c->distributed ? c->task_index : 0,
                                err)) ||
        (rc = dt_status_create(&r->status, r->metrics, c, err)) ||
        (rc = dt_http_start(&r->http, host, port, r->metrics, r->status, err)))
        return rc;
    if (c->is_chief && c->job != DT_JOB_PS && (rc = dt_peer_poll_start(&r->peers, o->metrics_peers, r->status, err)))
        return rc;
    const char *l = strchr(host, ':') && host[0] != '[' ? "[" : "", *rb = *l ? "]" : "";
    fprintf(log, "metrics: http://%s%s%s:%d/metrics, status page http://%s%s%s:%d/\n", l, host, rb, port, l, host, rb,
            port);
    fflush(log);
    dt_metrics *m = r->metrics;
    if (c->job == DT_JOB_PS) return DT_OK; /* its series are the ps's own (ps.c) */
    r->m.step = dt_metrics_gauge(m, DT_M_GLOBAL_STEP, "Global step after this worker's latest update.", NULL);
    r->m.local = dt_metrics_counter(m, DT_M_LOCAL_STEPS, "Steps this worker has trained (its updates).", NULL);
    r->m.examples = dt_metrics_counter(m, DT_M_EXAMPLES, "Training examples this worker has computed gradients on.", NULL);
    r->m.step_s = dt_metrics_histogram(m, "dtrain_step_seconds", "One step of this worker: batch, forward, backward "
                                       "and the exchange with the ps tasks.", NULL, dt_metrics_latency_bounds,
                                       dt_metrics_latency_n);
    if (c->is_chief && c->job != DT_JOB_PS) {
        r->m.ckpt_age = dt_metrics_age(m, "dtrain_checkpoint_age_seconds", "Seconds since the latest checkpoint was "
                                       "saved (NaN before the first).", NULL);
        r->m.ckpt_s = dt_metrics_gauge(m, "dtrain_checkpoint_duration_seconds", "How long saving the latest "
                                       "checkpoint took.", NULL);
        r->m.ckpts = dt_metrics_counter(m, "dtrain_checkpoints_total", "Checkpoints saved by this chief.", NULL);
    }
    return DT_OK;
}

/* A supervisor call that may save a checkpoint, timed for the metrics when it did. */
static int supervised(run_state *r, int (*call)(dt_supervisor *, int64_t, dt_error *), int64_t step, dt_error *err) {
    if (!r->m.ckpts) return call(r->supervisor, step, err);
    int saves = dt_supervisor_saves(r->supervisor);
    double t = dt_seconds();
    int rc = call(r->supervisor, step, err);
    if (dt_supervisor_saves(r->supervisor) != saves) {
        dt_metric_set(r->m.ckpt_s, dt_seconds() - t);
        dt_metric_touch(r->m.ckpt_age);
        dt_metric_add(r->m.ckpts, 1);
    }
    return rc;
}

/* The flags checked up front (a ps too); the run's length is known later, so cosine's default
 * decay is checked again then. */
static int check_up_front(const dt_train_options *o, const dt_train_debug *dbg, dt_place_strategy *strategy,
                          dt_error *err) {
    int rc = check_options(o, err);
    if (!rc) rc = check_debug(dbg, err);
    if (rc) return rc;
    dt_opt_config opt;
    if ((rc = opt_from_options(o, o->train_steps > 0 ? o->train_steps : o->warmup_steps + 1, &opt, err))) return rc;
    dt_lazy_config tables;
    if ((rc = dt_table_optim_config(o, &tables, err))) return rc;
    dt_augment aug;
    if ((rc = dt_augment_parse(&aug, o->augment, err))) return rc;
    dt_precision prec; /* every task checks the name; a worker also its CPU (a ps computes in float32) */
    if ((rc = dt_precision_parse(o->precision, &prec, err))) return rc;
    return dt_place_strategy_parse(o->placement ? o->placement : "greedy", strategy, err);
}

int dt_train(const dt_train_options *o, FILE *log, dt_train_result *res, dt_error *err) {
    return dt_train_hooked(o, NULL, log, res, err);
}

int dt_train_hooked(const dt_train_options *o, const dt_train_debug *dbg, FILE *log, dt_train_result *res,
                    dt_error *err) {
    return dt_train_ex(o, dbg, NULL, log, res, err);
}

int dt_train_ex(const dt_train_options *o, const dt_train_debug *dbg, const dt_train_ex_args *ex, FILE *log,
                dt_train_result *res, dt_error *err) {
    dt_train_result local_res;
    if (!res) res = &local_res;
    memset(res, 0, sizeof *res);
    res->test_auc = res->test_logloss = NAN;
    if (!log) log = stdout;
    dt_train_debug off;
    if (!dbg) {
        dt_train_debug_init(&off);
        dbg = &off;
    }
    dt_place_strategy strategy;
    int rc = check_up_front(o, dbg, &strategy, err);
    if (rc) return rc;

    run_state r = {.dbg = dbg, .ex = ex && (ex->train.n || ex->clicks.n || ex->next_batch) ? ex : NULL};
    if ((rc = dt_train_cluster(&r.cluster, o, log, err))) goto out;
    if (!o->dry_run && (rc = metrics_start(&r, o, log, err))) goto out;
    if ((rc = dt_train_load_auth(&r.auth, o, &r.cluster, err))) goto out;
    /* On a cluster a click-log model's tables live on the ps tasks as sparse tables: every task
     * builds the net with per-batch blocks in their place, left out of the dense placement. */
    if ((rc = dt_net_load_opts(&r.net, o->model_path, o->batch_size, r.cluster.distributed ? 1 : DT_NET_TABLES_AUTO,
                               err)))
        goto out;
    dt_net_set_threads(r.net, o->threads);
    if (r.cluster.distributed) {
        if ((rc = dt_placement_compute_dense(&r.placement, r.net, r.cluster.n_ps, strategy, err))) goto out;
        char desc[512];
        dt_cluster_describe(&r.cluster, desc, sizeof desc);
        fprintf(log, "cluster: %s\n", desc);
        if (r.cluster.origin[0]) fprintf(log, "cluster from %s: %s\n", r.cluster.source, r.cluster.origin);
    }
    if (o->dry_run) {
        fprintf(log, "model %s: %zu parameters in %d variables\n", dt_net_spec(r.net)->name,
                dt_net_param_count(r.net), dt_net_num_views(r.net));
        if (r.cluster.distributed) dt_placement_print(&r.placement, log);
        goto out;
    }
    if (r.cluster.job == DT_JOB_PS) {
        const dt_serve_options so = {.auth = r.auth.curve ? &r.auth : NULL, .bind = o->bind,
                                     .idle_timeout_ms = o->idle_timeout_ms, .stop = o->stop, .metrics = r.metrics,
                                     .table_memory = (uint64_t)(o->ps_table_memory_gib * 1073741824.0),
                                     .debug_stop_at_sparse_pull = dbg->ps_stop_at_sparse_pull};
        rc = dt_serve_task_opts(&r.cluster, &r.placement, &so, log, err);
        goto out;
    }
    if ((rc = dt_net_set_precision(r.net, o->precision, err))) goto out;
    if (o->device && *o->device && strcmp(o->device, "cpu")) {
        if ((rc = dt_net_set_device(r.net, o->device, err))) goto out;
        char desc[320];
        dt_net_describe_device(r.net, desc, sizeof desc);
        fprintf(log, "device: %s\n", desc);
    }
    rc = train_loop(&r, o, log, res, err);
    if (rc == 0 || rc == DT_EINTR) {
        /* End of training for this process; the chief also ends the cluster. */
        dt_error ferr = {0};
        int frc = r.updater ? r.updater->finish(r.updater, &ferr) : 0;
        if (frc && rc == 0) {
            if (err) *err = ferr;
            rc = frc;
        }
    }
out:
    run_free(&r);
    return rc;
}

/* The supervisor's view of the training state: whatever the updater holds, in the flat layout.
 * Dynamic sharding: ps 0's coordinator state first, so every batch it counts is in the model
 * fetched after it (docs/elastic.md, "Checkpoints"); sync: again until it is of the model's step.
 * The final one after the model: the final snapshot waits for the workers, and then nothing
 * trains any more. */
static int snapshot(void *user, float *params, float *state, int64_t *global_step, int final, dt_error *err) {
    run_state *r = user;
    if (!r->updater->snapshot) return dt_errorf(err, DT_EINVAL, "this updater cannot take checkpoints");
    for (int tries = 0;; tries++) {
        int64_t at = 0;
        int rc = r->work && !final ? dt_work_loop_fetch_state(r->work, &at, err) : DT_OK;
        if (!rc) rc = r->updater->snapshot(r->updater, r->net, params, state, global_step, final, err);
        if (!rc && r->work && final) rc = dt_work_loop_fetch_state(r->work, &at, err);
        if (rc || !r->work || final || !r->plan.sync || at == *global_step) return rc;
        if (tries == 20) {
            fprintf(r->log, "chief: warning: the work plan (step %lld) and the model (step %lld) still differ after 20 "
                    "fetches: the checkpoint may train a few batches twice\n", (long long)at, (long long)*global_step);
            return rc;
        }
    }
}

/* Where a compact net's table rows are: this process's tables, or the cluster's ps tasks. */
static dt_table_io tables_io(run_state *r) {
    return r->tables ? dt_local_tables_io(r->tables) : dt_table_io_remote(dt_remote_sparse(r->updater));
}

/* A compact net's sparse tables into the checkpoint being written (train/table_ckpt.h), after the
 * snapshot of the dense variables at global_step. Sync: the tables are at that step too unless
 * updates landed meanwhile (backup workers; a lost worker), which the log says. */
static int save_tables(void *user, dt_ckpt_sink *sink, int64_t global_step, dt_error *err) {
    run_state *r = user;
    dt_table_ckpt_stats st;
    const dt_table_io io = tables_io(r);
    int rc = dt_table_ckpt_save(&io, r->net, sink, r->spool, &st, err);
    dt_table_spool_free(r->spool);
    r->spool = NULL;
    if (!rc && r->plan.sync && st.step_lo >= 0 && (st.step_lo != global_step || st.step_hi != global_step))
        fprintf(r->log, "chief: warning: the sparse tables were read at steps %lld..%lld, the dense variables at step "
                "%lld: the checkpoint holds the updates that landed meanwhile\n", (long long)st.step_lo,
                (long long)st.step_hi, (long long)global_step);
    return rc;
}

/* Before the checkpoint's header: the tables of unbounded ids spooled, their row counts into held. */
static int prepare_tables(void *user, const char *logdir, uint64_t *held, dt_error *err) {
    run_state *r = user;
    dt_table_spool_free(r->spool); /* a save that failed before its rows were written */
    r->spool = NULL;
    const dt_table_io io = tables_io(r);
    return dt_table_ckpt_prepare(&io, r->net, logdir, held, &r->spool, err);
}

/* The checkpoint restored, if any, into the tables of io: their rows (the restored step's). */
static int tables_from_checkpoint(run_state *r, const dt_table_io *io, const char *where, dt_error *err) {
    const dt_st_file *f;
    const char *path;
    if (!dt_supervisor_restored_file(r->supervisor, &f, &path)) return DT_OK;
    dt_ckpt_run run = {.net = r->net, .opt = &r->opt, .tables = &r->table_opt};
    dt_table_ckpt_stats st;
    int rc = dt_table_ckpt_restore(io, f, path, &run, &st, err);
    if (!rc)
        fprintf(r->log, "%srestored the %d sparse table(s) of %s onto %s: %llu row(s) that differ from their initial "
                "values, or are held (unbounded ids)\n", r->tables ? "" : "chief: ", dt_net_num_tables(r->net), path,
                where, (unsigned long long)st.rows);
    return rc;
}

/* The chief, its ps tasks initialised from a checkpoint (or rolled back to one) and the tables
 * declared: the checkpoint's table rows to their ps tasks. */
static int restore_tables(void *user, dt_sparse_client *sparse, dt_error *err) {
    run_state *r = user;
    char where[32];
    snprintf(where, sizeof where, "%d ps task(s)", r->cluster.n_ps);
    if (r->dbg->import_delay_ms > 0) {
        struct timespec ts = {r->dbg->import_delay_ms / 1000, (long)(r->dbg->import_delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    const dt_table_io io = dt_table_io_remote(sparse);
    return tables_from_checkpoint(r, &io, where, err);
}

/* The coordinator state the latest snapshot fetched (dynamic sharding). */
static void coord_state(void *user, const uint8_t **state, size_t *len) {
    const run_state *r = user;
    dt_work_loop_saved_state(r->work, state, len);
}

/* A cluster rolling back after a ps lost its shard: the newest checkpoint, read again. */
static int reload(void *user, const float **params, const float **state, int64_t *step, dt_error *err) {
    run_state *r = user;
    return dt_supervisor_reload(r->supervisor, params, state, step, err);
}

static int plan_steps(run_state *r, const dt_train_options *o, dt_error *err);

/* Where a click-log model's lines come from: a binding's arrays (co->memory, named "click arrays"),
 * else the data path. Returns the name; co NULL: only that. */
static const char *ctr_source(const run_state *r, const dt_train_options *o, dt_ctr_options *co) {
    if (r->ex && r->ex->clicks.n) {
        if (co) co->memory = &r->ex->clicks;
        return "click arrays";
    }
    return o->data_path;
}

/* A click log's plan from its line count: the whole count, or while it goes on the lines counted
 * so far, which make lower bounds of the batches in an epoch and (without --train_steps) of the
 * run's steps. wait_beyond >= 0: first wait for more lines than that, or the end of the count. */
static int ctr_plan(run_state *r, const dt_train_options *o, int64_t wait_beyond, dt_error *err) {
    run_plan *p = &r->plan;
    int rc = dt_ctr_counter_get(r->counter, wait_beyond, &r->ctr_lines, err);
    if (rc < 0) return rc;
    p->per_epoch = (int64_t)(r->ctr_lines / ((uint64_t)o->batch_size * (uint64_t)p->n_workers));
    p->counting = rc == 0;
    if (!p->counting) {
        fprintf(r->log, "%s: %llu training lines (counted in %.1f s, beside training)\n", ctr_source(r, o, NULL),
                (unsigned long long)r->ctr_lines, dt_ctr_counter_seconds(r->counter));
        if (p->per_epoch < 1)
            return dt_errorf(err, DT_EINVAL, "%s: %llu training lines, fewer than one batch of %d for each of %d workers",
                             ctr_source(r, o, NULL), (unsigned long long)r->ctr_lines, o->batch_size, p->n_workers);
    }
    if ((rc = plan_steps(r, o, err))) return rc;
    if (!p->counting) {
        dt_supervisor_set_batches_per_epoch(r->supervisor, p->per_epoch);
        r->prog.total = p->total > 0 ? p->total : 1;
        dt_status_set_total(r->status, p->total);
    }
    return DT_OK;
}

/* While the count goes on: the plan from the lines counted so far, waiting for more only where
 * the lower bounds cannot tell whether the run is over or (epoch_too, after a step) whether its
 * local_step ended an epoch. Counting without parsing outruns training, so it hardly ever waits. */
static int ctr_settle(run_state *r, const dt_train_options *o, int64_t global_step, int64_t local_step, int epoch_too,
                      dt_error *err) {
    run_plan *p = &r->plan;
    for (int64_t wait = -1; p->counting; wait = (int64_t)r->ctr_lines) {
        int rc = ctr_plan(r, o, wait, err);
        if (rc) return rc;
        int ends = global_step >= p->total;
        if (!p->counting || (o->train_steps > 0 && ends)) break; /* known, or over whatever the epochs */
        if (!ends && (!epoch_too || local_step < p->per_epoch)) break;
    }
    return DT_OK;
}

/* The run's steps are needed before the first: a cosine schedule without lr_decay_steps decays
 * over them (opt_from_options). Then the count is waited for. */
static int total_needed_first(const dt_train_options *o) {
    return o->train_steps <= 0 && o->lr_schedule && !strcmp(o->lr_schedule, "cosine") && !o->lr_decay_steps;
}

/* A click-log model's data: the training lines of a click log (docs/ctr-data.md), counted on a
 * thread of their own for the steps of an epoch while training starts (ctr_count.h); validation
 * and test read the same file (dt_evaluate_ctr). */
static int open_ctr_data(run_state *r, const dt_train_options *o, dt_error *err) {
    const dt_cluster *c = &r->cluster;
    const dt_model_spec *spec = dt_net_spec(r->net);
    run_plan *p = &r->plan;
    struct stat st;
    if (!(r->ex && r->ex->clicks.n) && stat(o->data_path, &st) == 0 && S_ISDIR(st.st_mode))
        return dt_errorf(err, DT_EINVAL, "data_path %s is a folder (image data?), but %s is a click-log model (input "
                         "dense=%d fields=%d): give it a click log, Criteo TSV or libffm, plain or gzip "
                         "(docs/ctr-data.md)", o->data_path, o->model_path, spec->num_dense, spec->num_fields);
    p->n_workers = c->distributed ? c->n_workers : 1, p->shard = c->distributed ? c->task_index : 0;
    if (c->distributed && dynamic_sharding(o))
        return dt_errorf(err, DT_EINVAL, "sharding dynamic: a click log is a stream without a permutation; use "
                         "sharding fixed");
    dt_ctr_options co;
    dt_ctr_options_init(&co);
    co.fields = spec->num_fields;
    co.batch_size = o->batch_size;
    co.shard_index = p->shard, co.shard_count = p->n_workers;
    co.bad_lines = o->fail_on_bad_images ? DT_BAD_IMAGES_FAIL : DT_BAD_IMAGES_SKIP;
    if (o->validation_fraction >= 0) co.validation_fraction = o->validation_fraction;
    const char *name = ctr_source(r, o, &co);
    if (co.memory && (co.memory->num_dense != spec->num_dense || co.memory->num_fields != spec->num_fields))
        return dt_errorf(err, DT_ESHAPE, "click arrays: %d dense features and %d fields, but %s takes dense=%d fields=%d",
                         co.memory->num_dense, co.memory->num_fields, o->model_path, spec->num_dense, spec->num_fields);
    int rc = dt_ctr_open(&r->ctr, name, &co, err);
    if (!rc) rc = dt_ctr_counter_start(&r->counter, name, &co, err);
    /* a worker whose tables live on the ps tasks pulls the next batch's rows under this one's compute */
    if (!rc && o->sparse_prefetch && r->cluster.distributed && dt_net_compact_tables(r->net))
        rc = dt_ctr_ahead_create(&r->ahead, err);
    if (rc) return rc;
    return ctr_plan(r, o, total_needed_first(o) ? INT64_MAX : -1, err);
}

/* A binding's arrays as the splits: train, and test as validation and test (none: the training
 * arrays again, a second data set over the same memory). */
static int open_arrays(dt_data_splits *d, const dt_train_ex_args *ex, const dt_model_spec *spec, dt_error *err) {
    /* a batch source: the test arrays stand for the training set where one is asked about (its classes) */
    const dt_train_array *a[2] = {ex->next_batch ? &ex->test : &ex->train, ex->test.n ? &ex->test : &ex->train};
    const char *names[2] = {"x", ex->test.n ? "test x" : "x"};
    dt_dataset *ds[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        if (a[k]->h != spec->in_h || a[k]->w != spec->in_w || a[k]->c != spec->in_c) {
            dt_dataset_free(ds[0]);
            return dt_errorf(err, DT_ESHAPE, "%s: examples of %d x %d x %d but the model takes %d x %d x %d", names[k],
                             a[k]->h, a[k]->w, a[k]->c, spec->in_h, spec->in_w, spec->in_c);
        }
        int rc = dt_dataset_from_memory(&ds[k], a[k]->x, a[k]->x_u8, a[k]->labels, a[k]->n, a[k]->h, a[k]->w,
                                        a[k]->c, names[k], err);
        if (rc) {
            dt_dataset_free(ds[0]);
            return rc;
        }
    }
    d->train = ds[0], d->validation = d->test = ds[1];
    return DT_OK;
}

/* Opens the data, and works out from it and the cluster how the run is cut into steps (r->plan). */
static int open_data(run_state *r, const dt_train_options *o, dt_error *err) {
    const dt_cluster *c = &r->cluster;
    run_plan *p = &r->plan;
    const dt_model_spec *spec = dt_net_spec(r->net);
    if (r->ex && dt_net_is_ctr(r->net) != (r->ex->clicks.n > 0))
        return dt_errorf(err, DT_EINVAL, r->ex->clicks.n ? "%s is an image model: click arrays (ids, dense features) "
                         "train a click-log model (input dense=N fields=M)" : "%s is a click-log model: its arrays are "
                         "click arrays (ids per field, dense features, 0/1 labels), not images", o->model_path);
    if (r->ex && r->ex->clicks.n) return open_ctr_data(r, o, err);
    const char *data_name = r->ex ? "arrays" : o->data_path;
    int rc;
    if (r->ex && r->ex->next_batch && (!r->ex->test.n || o->train_steps < 1 || (c->distributed && dynamic_sharding(o))))
        return dt_errorf(err, DT_EINVAL, "a batch source needs test arrays (validation and test), train_steps (it has no "
                         "epochs) and fixed sharding (each worker's source is its own shard)");
    if (r->ex) {
        if ((rc = open_arrays(&r->data, r->ex, spec, err))) return rc;
        goto opened;
    }
    if (!o->data_path || !*o->data_path) return dt_errorf(err, DT_EINVAL, "data_path: no data path given");
    if (dt_net_is_ctr(r->net)) return open_ctr_data(r, o, err);
    struct stat st;
    if (stat(o->data_path, &st) == 0 && S_ISREG(st.st_mode))
        return dt_errorf(err, DT_EINVAL, "data_path %s is a file (a click log?), but %s is an image model (input %d %d %d) "
                         "that reads an IDX or image folder: a click log needs a click-log model (input dense=N "
                         "fields=M, docs/model-format.md)", o->data_path, o->model_path, spec->in_h, spec->in_w,
                         spec->in_c);
    dt_data_options dopt = {.h = spec->in_h, .w = spec->in_w, .c = spec->in_c,
                            .validation_fraction = o->validation_fraction, .seed = o->seed,
                            .bad_images = o->fail_on_bad_images ? DT_BAD_IMAGES_FAIL : DT_BAD_IMAGES_SKIP};
    rc = dt_data_open(&r->data, o->data_path, &dopt, err);
    if (rc) return rc;
opened:;
    int classes = dt_net_num_classes(r->net), data_classes = dt_dataset_num_classes(r->data.train);
    if (r->data.test != r->data.train && dt_dataset_num_classes(r->data.test) > data_classes)
        data_classes = dt_dataset_num_classes(r->data.test);
    if (data_classes > classes)
        return dt_errorf(err, DT_ESHAPE, "%s has %d classes but model %s ends in a dense layer of %d units",
                         data_name, data_classes, o->model_path, classes);

    /* Worker i of n trains on shard i of every epoch's permutation (docs/data.md); dynamic
     * sharding: any batch of the whole epoch, as ps 0 grants them. */
    p->n_workers = c->distributed ? c->n_workers : 1, p->shard = c->distributed ? c->task_index : 0;
    p->dynamic = c->distributed && dynamic_sharding(o);
    dt_loader_options lo = {.batch_size = o->batch_size, .shuffle = 1, .seed = o->seed,
                            .shard_index = p->dynamic ? 0 : p->shard, .shard_count = p->dynamic ? 1 : p->n_workers,
                            .whole_epoch = p->dynamic};
    if ((rc = dt_augment_parse(&lo.augment, o->augment, err))) return rc;
    if ((rc = dt_loader_create(&r->loader, r->data.train, &lo, err))) return rc;
    p->per_epoch = dt_loader_batches_per_epoch(r->loader);
    if (r->ex && r->ex->next_batch) { /* no epochs: the log's epoch counts the run */
        p->per_epoch = o->train_steps;
        size_t example = (size_t)spec->in_h * (size_t)spec->in_w * (size_t)spec->in_c;
        if (!(r->it_x = dt_alloc_floats((size_t)o->batch_size * example, "batch source buffer", err))) return DT_ENOMEM;
    }
    if (p->per_epoch < 1)
        return dt_errorf(err, DT_EINVAL, "%s: %zu training examples, fewer than one batch of %d for each of %d workers",
                         data_name, dt_dataset_size(r->data.train), o->batch_size, p->n_workers);
    return plan_steps(r, o, err);
}

/* Sync replicas from the flags: k = replicas_to_aggregate (default: every worker) of
 * n = total_num_replicas (default: k), which must be the cluster's workers; n - k are backups. */
static int sync_replicas(const dt_train_options *o, int n_workers, int *k, int *n, dt_error *err) {
    *k = o->replicas_to_aggregate ? o->replicas_to_aggregate : n_workers;
    *n = o->total_num_replicas ? o->total_num_replicas : *k;
    if (*n != n_workers)
        return dt_errorf(err, DT_EINVAL, "total_num_replicas=%d (default: replicas_to_aggregate) but the cluster has "
                         "%d workers: with backup workers set total_num_replicas=%d", *n, n_workers, n_workers);
    return DT_OK;
}

/* Dynamic sharding (docs/elastic.md): every task index below max_workers is declared; a sync step
 * aggregates the live workers' gradients but the b backup workers' (b = n - k of the starting
 * cluster; the ps counts the silent and the sitting-out ones out): INIT declares max_workers
 * replicas of which max_workers - b aggregate. The run ends when ps 0 says the last epoch is done;
 * total only paces the progress line. */
static int plan_dynamic(run_state *r, const dt_train_options *o, dt_error *err) {
    run_plan *p = &r->plan;
    p->max_workers = o->max_workers ? o->max_workers : p->n_workers;
    if (p->max_workers < p->n_workers)
        return dt_errorf(err, DT_EINVAL, "max_workers=%d is fewer than the cluster's %d workers", p->max_workers,
                         p->n_workers);
    /* A sync worker has staleness + 1 claims unsettled on ps 0 at most (its gradients of the steps
     * not yet applied), and ps 0 takes DT_COORD_MAX_CLAIMS. */
    if (o->staleness > DT_COORD_MAX_CLAIMS - 1)
        return dt_errorf(err, DT_EINVAL, "sharding dynamic: staleness=%d, at most %d (a worker's claims not yet "
                         "settled on ps 0 are staleness + 1, at most %d)", o->staleness, DT_COORD_MAX_CLAIMS - 1,
                         DT_COORD_MAX_CLAIMS);
    int k = 0, n = 0, rc = p->sync ? sync_replicas(o, p->n_workers, &k, &n, err) : DT_OK;
    if (rc) return rc;
    p->replicas = p->sync ? p->max_workers : 0;
    p->aggregate = p->sync ? p->max_workers - (n - k) : 0;
    /* Gradients a sync step applies while nobody joins or leaves: k = max(1, live - b). */
    int64_t busy = p->n_workers < p->per_epoch ? p->n_workers : p->per_epoch;
    int64_t per_step = busy - (n - k) > 1 ? busy - (n - k) : 1;
    p->global_per_epoch = p->sync ? (p->per_epoch + per_step - 1) / per_step : p->per_epoch;
    p->total = o->train_steps > 0 ? o->train_steps : (int64_t)ceil(o->epochs * (double)p->global_per_epoch);
    p->examples_per_step = p->sync ? (double)o->batch_size * (double)per_step : o->batch_size;
    return DT_OK;
}

/* The steps of the run, from the batches per epoch and the cluster. */
static int plan_steps(run_state *r, const dt_train_options *o, dt_error *err) {
    const dt_cluster *c = &r->cluster;
    run_plan *p = &r->plan;
    /* Sync replicas: every step averages replicas_to_aggregate gradients (default: every worker);
     * total_num_replicas counts the workers pushing, backup workers included. */
    p->sync = c->distributed && o->issync, p->aggregate = 0, p->replicas = 0;
    if (p->dynamic) return plan_dynamic(r, o, err);
    if (p->sync) {
        int rc = sync_replicas(o, p->n_workers, &p->aggregate, &p->replicas, err);
        if (rc) return rc;
    }
    /* Global steps per epoch: asynchronous workers each advance the global step once per batch;
     * a sync step takes one batch from every worker (n*B examples). */
    p->global_per_epoch = p->sync ? p->per_epoch : p->per_epoch * p->n_workers;
    p->total = o->train_steps > 0 ? o->train_steps : (int64_t)ceil(o->epochs * (double)p->global_per_epoch);
    p->examples_per_step = p->sync ? (double)o->batch_size * p->aggregate : o->batch_size;
    return DT_OK;
}

static int apply_tables(void *user, dt_error *err) { return dt_local_tables_apply(user, err); }

int dt_train_remote_config(const dt_train_options *o, const dt_cluster *c, const dt_net *net, dt_remote_config *cfg,
                           FILE *log, dt_error *err) {
    memset(cfg, 0, sizeof *cfg);
    int rc = check_cluster_options(o, err);
    if (rc) return rc;
    dt_encoding compression;
    if ((rc = dt_enc_parse(o->compression, &compression, err))) return rc;
    dt_overlap_mode overlap;
    if ((rc = dt_overlap_parse(o->overlap ? o->overlap : "priority", &overlap, err))) return rc;
    /* Clipping scales the whole gradient by its global norm, known only once backward is over: a
     * streamed exchange would have pushed most of it unclipped by then. */
    if (overlap != DT_OVERLAP_NONE && o->clip_gradient_norm > 0) {
        fprintf(log, "worker %d: overlap=%s pushes each layer's gradient as backward makes it, but "
                "clip_gradient_norm needs the whole gradient first: exchanging between steps instead\n",
                c->task_index, dt_overlap_name(overlap));
        overlap = DT_OVERLAP_NONE;
    }
    dt_lazy_config table_opt = {0};
    if (dt_net_num_tables(net) && (rc = dt_table_optim_config(o, &table_opt, err))) return rc;
    int aggregate = 0, replicas = 0;
    if (o->issync && (rc = sync_replicas(o, c->n_workers, &aggregate, &replicas, err))) return rc;
    *cfg = (dt_remote_config){.cluster = c,
                              .table_opt = table_opt,
                              .connect_timeout_ms = o->connect_timeout_ms,
                              .request_timeout_ms = o->heartbeat_timeout_ms,
                              .n_workers_to_wait = c->n_workers - 1,
                              .replicas_to_aggregate = aggregate,
                              .total_num_replicas = replicas,
                              .staleness = o->staleness,
                              .ps_timeout_ms = o->ps_timeout_ms,
                              .chunk_bytes = (int64_t)o->chunk_kb << 10,
                              .compression = compression,
                              .overlap = overlap,
                              .sparse_prefetch = o->sparse_prefetch,
                              .strict = o->strict,
                              .seed = o->seed,
                              .stop = o->stop,
                              .log = log};
    return DT_OK;
}

/* Where updates happen: on the ps tasks (the remote updater) or here (the local one). */
static int create_updater(run_state *r, const dt_train_options *o, dt_error *err) {
    const dt_cluster *c = &r->cluster;
    const run_plan *p = &r->plan;
    int rc = opt_from_options(o, p->total, &r->opt, err);
    if (rc) return rc;
    if ((rc = dt_table_optim_config(o, &r->table_opt, err))) return rc;
    if (!c->distributed) {
        if ((rc = dt_local_updater_create(&r->updater, &r->opt, &r->table_opt, r->net, err))) return rc;
        /* unbounded ids in one process: the tables a ps would hold, here (train/local_tables.h) */
        if (dt_net_compact_tables(r->net) &&
            !(rc = dt_local_tables_create(&r->tables, r->net, &r->table_opt, o->seed, 0, err)))
            dt_local_updater_set_tables(r->updater, apply_tables, r->tables);
        return rc;
    }
    dt_remote_config rc_cfg;
    if ((rc = dt_train_remote_config(o, c, r->net, &rc_cfg, r->log, err))) return rc;
    rc_cfg.placement = &r->placement;
    rc_cfg.opt = r->opt;
    rc_cfg.max_workers = p->dynamic ? p->max_workers : 0;
    rc_cfg.replicas_to_aggregate = p->aggregate; /* the plan's: dynamic sharding's differ */
    rc_cfg.total_num_replicas = p->replicas;
    rc_cfg.step_delay_ms = r->dbg->delay_worker < 0 || r->dbg->delay_worker == c->task_index ? r->dbg->step_delay_ms : 0;
    rc_cfg.reload = reload;
    rc_cfg.tables = restore_tables;
    rc_cfg.user = r;
    rc_cfg.auth = r->auth.curve ? &r->auth : NULL;
    rc_cfg.metrics = r->metrics;
    return dt_remote_updater_create(&r->updater, &rc_cfg, err);
}

/* The coordinator state of the checkpoint the supervisor restored (or reloaded for a rollback). */
static int restored_coord(void *user, const uint8_t **state, size_t *len) {
    const run_state *r = user;
    return dt_supervisor_restored_coord(r->supervisor, state, len);
}

/* A fractional --epochs under dynamic sharding: the last epoch trains the first ceil(f * nb) of
 * its nb batches, f the fraction (0: whole). The tolerance keeps a product like 0.3 * 10, which
 * is 3.0000000000000004 in doubles, at 3. */
static uint32_t last_epoch_batches(double epochs, int64_t nb) {
    double f = epochs - floor(epochs), last = ceil(f * (double)nb - 1e-9);
    return f > 0 && last < (double)nb ? (uint32_t)(last > 1 ? last : 1) : 0;
}

/* Dynamic sharding: the chief installs the work plan on ps 0; which batches come next is ps 0's. */
static int open_work(run_state *r, const dt_train_options *o, int64_t *local_step, dt_error *err) {
    const dt_cluster *c = &r->cluster;
    const run_plan *p = &r->plan;
    *local_step = 0;
    if (r->dbg->work_log && *r->dbg->work_log && !(r->work_log = fopen(r->dbg->work_log, "a")))
        return dt_errorf(err, DT_EIO, "work_log: cannot open %s", r->dbg->work_log);
    dt_work_config wc = {.updater = r->updater, .loader = r->loader, .task = c->task_index, .chief = c->is_chief,
                         .sync = p->sync, .examples = dt_dataset_size(r->data.train), .seed = o->seed,
                         .epochs = o->train_steps > 0 ? 0 : (uint64_t)ceil(o->epochs),
                         .last_batches = o->train_steps > 0 ? 0 : last_epoch_batches(o->epochs, p->per_epoch),
                         .batch_size = (uint32_t)o->batch_size,
                         .unit_batches = (uint32_t)(o->unit_batches ? o->unit_batches : 4),
                         .max_workers = (uint32_t)p->max_workers,
                         .liveness_ms = (uint32_t)((o->heartbeat_timeout_ms > 0 ? o->heartbeat_timeout_ms : 60000) / 2),
                         .wait_ms = o->connect_timeout_ms, .stop = o->stop, .log = r->log, .trained = r->work_log};
    if (c->is_chief) wc.restored = restored_coord, wc.user = r;
    return dt_work_loop_open(&r->work, &wc, err);
}

/* The chief's supervisor (checkpoints, summaries); then the newest good checkpoint is restored, or
 * the updater initialises, and the data stream resumes where the restored step left it. */
static int restore_or_start(run_state *r, const dt_train_options *o, int64_t *global_step, int64_t *local_step,
                            dt_error *err) {
    const dt_cluster *c = &r->cluster;
    const run_plan *p = &r->plan;
    int rc;
    if (c->is_chief) {
        dt_supervisor_config sc = {.logdir = o->logdir, .save_secs = o->save_model_secs, .max_to_keep = o->max_to_keep,
                                   .summary_dir = o->summary_dir, .snapshot = snapshot, .user = r, .log = r->log,
                                   .coord = p->dynamic ? coord_state : NULL,
                                   .examples_per_step = (int)p->examples_per_step,
                                   /* a cluster's tables: their rows from the ps tasks (table_ckpt.h) */
                                   .run = {.net = r->net, .opt = &r->opt, .tables = &r->table_opt,
                                           .table_rows = dt_net_compact_tables(r->net) ? save_tables : NULL,
                                           .table_prepare = dt_net_compact_tables(r->net) ? prepare_tables : NULL,
                                           .table_user = r,
                                           .seed = o->seed, .batch_size = o->batch_size,
                                           .n_workers = p->n_workers, .sync = p->sync, .batches_per_epoch = p->counting ? 0 : p->per_epoch,
                                           .validation_fraction = o->validation_fraction,
                                           .class_names = r->ctr ? NULL : dt_dataset_class_names(r->data.train),
                                           .n_class_names = !r->ctr && dt_dataset_class_names(r->data.train)
                                                                ? dt_dataset_num_classes(r->data.train) : 0}};
        if ((rc = dt_supervisor_open(&r->supervisor, &sc, err))) return rc;
    }
    *global_step = 0;
    int64_t restored_step;
    const float *restored_params, *restored_state;
    if (dt_supervisor_restored(r->supervisor, &restored_params, &restored_state, &restored_step) &&
        r->updater->restore) {
        memcpy(dt_net_params(r->net), restored_params, dt_net_param_count(r->net) * sizeof(float));
        rc = r->updater->restore(r->updater, r->net, restored_state, restored_step, global_step, err);
        if (!rc && r->tables) { /* this process's tables: at the checkpoint's step, its rows */
            dt_local_tables_set_step(r->tables, restored_step);
            const dt_table_io io = dt_local_tables_io(r->tables);
            rc = tables_from_checkpoint(r, &io, "this process's tables", err);
        }
    } else {
        rc = r->updater->start(r->updater, r->net, o->seed, global_step, err);
    }
    if (rc) return rc;
    if (p->dynamic) return open_work(r, o, local_step, err);
    /* Resuming: each worker has consumed global_step (sync) or global_step / n_workers batches of its shard (exactly so on
     * one machine, where data order and dropout then continue bit for bit). */
    *local_step = p->sync ? *global_step : *global_step / p->n_workers;
    if (*local_step > 0 && r->ex && r->ex->next_batch) {
        fprintf(r->log, "resuming at global step %lld: the batch source goes on where it is\n", (long long)*global_step);
    } else if (*local_step > 0) {
        if ((rc = r->ctr ? dt_ctr_seek(r->ctr, *local_step, err) : dt_loader_seek(r->loader, *local_step, err)))
            return rc;
        if (p->counting) /* a click log's epoch is not known yet: the reader's seek finds it */
            fprintf(r->log, "resuming the data stream at batch %lld\n", (long long)*local_step);
        else
            fprintf(r->log, "resuming the data stream at batch %lld (epoch %lld, batch %lld of %lld)\n",
                    (long long)*local_step, (long long)(*local_step / p->per_epoch),
                    (long long)(*local_step % p->per_epoch), (long long)p->per_epoch);
    }
    return DT_OK;
}

/* The run's opening lines: what trains, on what, how long, with which options. */
static void log_start(const run_state *r, const dt_train_options *o) {
    const dt_cluster *c = &r->cluster;
    const run_plan *p = &r->plan;
    FILE *log = r->log;
    char role[64] = "";
    if (c->distributed) snprintf(role, sizeof role, ", worker %d of %d%s", c->task_index, c->n_workers,
                                 c->is_chief ? " (chief)" : "");
    char sizes[128], steps[160];
    if (r->ctr && p->counting)
        snprintf(sizes, sizeof sizes, "training lines counted beside training (validation and test by line hash)");
    else if (r->ctr)
        snprintf(sizes, sizeof sizes, "%llu training lines (validation and test by line hash)",
                 (unsigned long long)r->ctr_lines);
    else
        snprintf(sizes, sizeof sizes, "%zu training / %zu validation / %zu test examples",
                 dt_dataset_size(r->data.train), dt_dataset_size(r->data.validation), dt_dataset_size(r->data.test));
    if (p->dynamic && o->train_steps <= 0) /* ps 0 grants the epochs' batches; the steps follow the workers */
        snprintf(steps, sizeof steps, "%.2f epochs of %lld batches granted by ps 0", o->epochs,
                 (long long)p->per_epoch);
    else if (p->counting && o->train_steps <= 0)
        snprintf(steps, sizeof steps, "%.2f epochs (steps once the lines are counted)", o->epochs);
    else if (p->counting)
        snprintf(steps, sizeof steps, "%lld global steps", (long long)p->total);
    else
        snprintf(steps, sizeof steps, "%lld global steps (%.2f epochs)", (long long)p->total,
                 (double)p->total / (double)p->global_per_epoch);
    const int bf16 = !strcmp(dt_net_precision(r->net), "bf16");
    fprintf(log, "dtrain %s: model %s (%zu parameters), %s, %s lr %g, batch %d, %s, %d threads%s%s\n", dt_version(),
            dt_net_spec(r->net)->name, dt_net_param_count(r->net), sizes, dt_opt_name(r->opt.kind),
            (double)r->opt.learning_rate, o->batch_size, steps, dt_net_threads(r->net),
            bf16 ? ", precision bf16 (bf16 products, float32 accumulation and parameters)" : "", role);
    char sched[160], clip[64] = "none";
    dt_lr_describe(&r->opt.schedule, sched, sizeof sched);
    if (o->clip_gradient_norm > 0) snprintf(clip, sizeof clip, "global norm %g", o->clip_gradient_norm);
    fprintf(log, "learning rate schedule %s, weight decay %g%s, gradient clipping %s, augmentation %s\n", sched,
            (double)r->opt.weight_decay, r->opt.weight_decay && !r->opt.decay_rank1 ? " (kernels only)" : "", clip,
            o->augment && *o->augment ? o->augment : "none");
    fflush(log);
}

/* Epochs done at a global step: dynamic sharding counts them by ps 0's grants (a global step is
 * no fixed share of an epoch while workers join and leave); else steps over steps per epoch. */
/* NAN while a click log's lines are still being counted: its epochs are not known yet. */
static double epochs_at(const run_state *r, int64_t global_step) {
    if (r->work) return dt_work_loop_epochs(r->work);
    return r->plan.counting ? NAN : (double)global_step / (double)r->plan.global_per_epoch;
}

/* Figures of the steps since the last log line. */
typedef struct {
    double loss_sum, t_interval;
    int64_t correct, seen, examples, last_log;
} interval;

/* Every --steps_to_validate global steps, at an epoch's end and at the last step: one log line (the
 * chief validates too) and the summaries; the interval starts again. */
static int log_interval(run_state *r, const dt_train_options *o, int evaluates, int64_t global_step, interval *iv,
                        dt_train_result *res, dt_error *err) {
    double t = dt_seconds();
    double ex_per_sec = iv->examples / (t - iv->t_interval);
    iv->last_log = global_step;
    double train_loss = iv->loss_sum / iv->seen, train_acc = (double)iv->correct / iv->seen;
    res->final_loss = train_loss;
    dt_eval_result val;
    dt_ctr_eval_result cval = {0};
    if (evaluates && r->ctr) {
        dt_ctr_options co;
        dt_ctr_eval_options(&co, r->net, DT_CTR_VALIDATION, o->fail_on_bad_images);
        if (o->validation_fraction >= 0) co.validation_fraction = o->validation_fraction;
        int rc = dt_evaluate_ctr(r->net, ctr_source(r, o, &co), &co, &cval, err);
        if (rc) return rc;
        val = (dt_eval_result){.examples = cval.examples, .loss = cval.loss, .accuracy = cval.accuracy};
        res->validation_accuracy = val.accuracy;
    } else if (evaluates) {
        int rc = dt_evaluate(r->net, r->data.validation, NULL, &val, err);
        if (rc) return rc;
        res->validation_accuracy = val.accuracy;
    }
    /* The whole line first, then the summaries: a warning they print (summaries turned off)
     * must not land in the middle of it. */
    dt_progress_clear(&r->prog);
    const double epoch = epochs_at(r, global_step);
    char ep[32] = "?"; /* still counting the click log's lines */
    if (epoch == epoch) snprintf(ep, sizeof ep, "%.2f", epoch);
    fprintf(r->log, "step %lld  epoch %s  loss %.4f  train_acc %.4f", (long long)global_step, ep, train_loss,
            train_acc);
    if (evaluates && r->ctr) fprintf(r->log, "  val_auc %.4f  val_logloss %.4f", cval.auc, cval.logloss);
    else if (evaluates) fprintf(r->log, "  val_loss %.4f  val_acc %.4f", val.loss, val.accuracy);
    fprintf(r->log, "  %.0f examples/sec\n", ex_per_sec);
    fflush(r->log);
    dt_supervisor_summary_train(r->supervisor, global_step, train_loss, train_acc);
    if (evaluates) dt_supervisor_summary_test(r->supervisor, global_step, val.loss, val.accuracy);
    if (evaluates && r->ctr) dt_supervisor_summary_binary(r->supervisor, global_step, cval.auc, cval.logloss);
    if (evaluates) dt_status_validation(r->status, global_step, val.loss, val.accuracy, r->ctr ? cval.auc : NAN);
    iv->loss_sum = 0;
    iv->correct = iv->seen = iv->examples = 0;
    iv->t_interval = dt_seconds(); /* validation time is not training time */
    return DT_OK;
}

/* The next batch of a binding's source (ex->next_batch), checked: float32 used in place, uint8 scaled
 * into r->it_x as the loader scales IDX pixels. */
static int source_batch(run_state *r, dt_batch *b, dt_error *err) {
    const dt_model_spec *spec = dt_net_spec(r->net);
    int max = dt_net_max_batch(r->net), n = 0, u8 = 0, classes = dt_net_num_classes(r->net);
    const void *x = NULL;
    const int32_t *labels = NULL;
    if (r->ex->next_batch(r->ex->batch_user, max, &x, &u8, &labels, &n))
        return dt_errorf(err, DT_EINVAL, "the batch source ended or failed (its caller says why)");
    if (n < 1 || n > max || !x || !labels)
        return dt_errorf(err, DT_EINVAL, "the batch source gave %d examples, expected 1 to %d with labels", n, max);
    for (int i = 0; i < n; i++)
        if (labels[i] < 0 || labels[i] >= classes)
            return dt_errorf(err, DT_EINVAL, "the batch source's label %d is %d, out of 0..%d", i, labels[i], classes - 1);
    size_t total = (size_t)n * (size_t)spec->in_h * (size_t)spec->in_w * (size_t)spec->in_c;
    if (u8) {
        const uint8_t *p = x;
        for (size_t j = 0; j < total; j++) r->it_x[j] = (float)p[j] / 255.0f;
        x = r->it_x;
    }
    *b = (dt_batch){.n = n, .x = x, .labels = labels};
    return DT_OK;
}

/* One training batch through the net and the loss: an image batch from the loader, or a click-log
 * batch (b->n set from it). */
static int forward_batch(run_state *r, uint64_t seed, dt_batch *b, float *loss, int *correct, dt_error *err) {
    int rc;
    if (r->ctr) {
        dt_ctr_batch cb;
        const dt_ctr_batch *next = NULL;
        if ((rc = r->ahead ? dt_ctr_ahead_next(r->ahead, r->ctr, &cb, &next, err) : dt_ctr_next(r->ctr, &cb, err)))
            return rc;
        if (r->ahead) dt_net_set_lookahead(r->net, next);
        b->n = cb.n;
        if (!dt_net_forward_ctr(r->net, &cb, 1, seed, err)) return DT_EINVAL; /* err says why */
        *loss = dt_net_loss_binary(r->net, cb.labels, correct);
    } else {
        if (r->ex && r->ex->next_batch) rc = source_batch(r, b, err);
        else rc = r->work ? DT_OK : dt_loader_next(r->loader, b, err); /* dynamic: loaded already */
        if (rc) return rc;
        if (!dt_net_forward(r->net, b->x, b->n, 1, seed, err)) return DT_EINVAL; /* err says why */
        *loss = dt_net_loss(r->net, b->labels, correct);
    }
    return dt_net_status(r->net, err); /* a device's failure, named */
}

/* Gradients this worker pushed that ps 0's chunk 0 dropped as stale (dynamic sharding: ps 0 did not
 * count that batch; another ps may have taken the gradient, as a backup worker's can be among the
 * first k at one ps and not at another). */
static int64_t stale_pushes(const run_state *r) {
    if (!r->work) return 0;
    dt_remote_timing t;
    dt_remote_get_timing(r->updater, &t);
    return t.stale_ref;
}

/* A cluster worker's time waiting for its sparse rows so far (the remote updater counts it as
 * exchange): an emulated step's compute leaves it out, as a real step's compute does not hold it. */
static double rows_wait(const run_state *r) {
    if (!r->cluster.distributed || !r->ctr || !dt_net_compact_tables(r->net)) return 0;
    dt_remote_timing t;
    dt_remote_get_timing(r->updater, &t);
    return t.rows_wait_s;
}

/* The steps: batch, forward, loss, backward, clipping, the update (here or on the ps tasks), the
 * figures, the supervisor, the log, until the plan's total or a stop. */
static int run_steps(run_state *r, const dt_train_options *o, int emulate, int64_t *global_step, int64_t *local_step,
                     dt_train_result *res, dt_error *err) {
    const dt_cluster *c = &r->cluster;
    const run_plan *p = &r->plan;
    /* Only the chief validates and tests: the others would repeat the same numbers. */
    int evaluates = c->is_chief && !emulate, rc = DT_OK;
    double t_step = dt_seconds();
    interval iv = {.t_interval = t_step, .last_log = *global_step};
    int finished = 0, push = 1, logged_bytes = 0; /* dynamic: every epoch done; this step's claim stands */
    for (;;) {
        /* a click log still being counted: is the run over? (ctr_count.h) */
        if (p->counting && (rc = ctr_settle(r, o, *global_step, *local_step, 0, err))) break;
        if (!(r->work && !o->train_steps ? !finished : *global_step < p->total)) break;
        if (o->stop && *o->stop) {
            rc = dt_errorf(err, DT_EINTR, "training stopped by a signal at global step %lld", (long long)*global_step);
            break;
        }
        dt_batch b = {.n = o->batch_size};
        int correct = 0;
        float loss = 0;
        double t_compute = dt_seconds(), waited = emulate ? rows_wait(r) : 0;
        if (emulate && !r->ctr) {
            dt_emulate_step(r->net, r->dbg->emulate_compute_ms);
        } else {
            uint64_t seed = dt_hash64(o->seed, (uint64_t)(*local_step * p->n_workers + p->shard));
            if (r->work && ((rc = dt_work_loop_next(r->work, r->net, global_step, &b, &finished, err)) || finished))
                break;
            if ((rc = forward_batch(r, seed, &b, &loss, &correct, err))) break;
            if (!isfinite(loss)) {
                rc = dt_errorf(err, DT_EINVAL, "loss became %g at global step %lld: lower the learning_rate",
                               (double)loss, (long long)*global_step + 1);
                break;
            }
            /* The claim's answer before backward: with --overlap each layer's gradient is pushed
             * as backward makes it, and ps 0 must hold the claim before the gradient arrives. */
            if (r->work && (rc = dt_work_loop_claim(r->work, r->net, global_step, &push, err))) break;
            if (!push) continue; /* its step went by, or the unit is not ours any more: the batch is dropped */
            if ((rc = dt_net_backward(r->net, err)) || (rc = dt_net_status(r->net, err))) break;
            if (*local_step == 0 && r->dbg->dump_grads && *r->dbg->dump_grads &&
                (rc = dump_floats("debug_dump_grads", r->dbg->dump_grads, dt_net_grads(r->net),
                                  dt_net_param_count(r->net), err)))
                break;
            /* The whole gradient, before it is applied here or cut into shards and pushed. */
            if (o->clip_gradient_norm > 0) dt_net_clip_gradients(r->net, (float)o->clip_gradient_norm);
            if (emulate) /* a click-log model's: compute padded, the wait for its rows beside it */
                dt_emulate_until(t_compute + rows_wait(r) - waited, r->dbg->emulate_compute_ms);
        }
        int64_t stale = stale_pushes(r);
        if ((rc = r->updater->apply(r->updater, r->net, c->distributed ? *global_step : *local_step, global_step,
                                    err)))
            break;
        int epoch_began = r->work && dt_work_loop_pushed(r->work, &b, stale_pushes(r) == stale);
        ++*local_step;
        if (r->dbg->log_data_bytes && r->ctr && !logged_bytes++)
            fprintf(r->log, "debug: the first step read %llu bytes of the click log's text\n",
                    (unsigned long long)dt_ctr_bytes(r->ctr));
        iv.loss_sum += loss * b.n;
        iv.correct += correct;
        iv.seen += b.n;
        iv.examples += b.n;
        res->steps = *global_step;
        if (r->metrics) {
            double t = dt_seconds();
            dt_metric_observe(r->m.step_s, t - t_step);
            t_step = t;
            dt_metric_set(r->m.step, (double)*global_step);
            dt_metric_add(r->m.local, 1);
            dt_metric_add(r->m.examples, b.n);
            dt_status_step(r->status, *global_step, loss, correct, b.n);
        }
        if ((rc = supervised(r, dt_supervisor_step, *global_step, err))) break;
        if (r->ex && r->ex->on_step && !emulate &&
            *local_step % (r->ex->every > 0 ? r->ex->every : 1) == 0 &&
            r->ex->on_step(r->ex->user, *global_step, loss, b.n ? (double)correct / b.n : 0)) {
            rc = dt_errorf(err, DT_EINTR, "training stopped by the step callback at global step %lld",
                           (long long)*global_step);
            break;
        }
        dt_progress_update(&r->prog, *global_step < p->total ? *global_step : p->total,
                           epochs_at(r, *global_step),
                           emulate || !iv.seen ? NAN : iv.loss_sum / (double)iv.seen);

        if (p->counting && (rc = ctr_settle(r, o, *global_step, *local_step, 1, err))) break;
        /* emulated: no epochs; still counting: local_step is below the epoch's batches (ctr_settle), or the last */
        int epoch_end = r->work ? epoch_began : !emulate && !p->counting && *local_step % p->per_epoch == 0;
        if (*global_step / o->steps_to_validate > iv.last_log / o->steps_to_validate || epoch_end ||
            (*global_step >= p->total && (!r->work || o->train_steps))) { /* dynamic: ps 0 says when it ends */
            if ((rc = log_interval(r, o, evaluates, *global_step, &iv, res, err))) break;
            t_step = iv.t_interval;
        }
    }
    if (!rc && finished && iv.seen) rc = log_interval(r, o, evaluates, *global_step, &iv, res, err);
    return rc;
}

/* The advice after a count of skipped bad lines or images: the CLI's flag, and the library's field. */
#define STOP_ON_BAD "to stop on them instead: --bad_images fail, or fail_on_bad_images in dt_train_options"

/* report's end for a click-log model: bad lines, the chief's test AUC and logloss, the last line. */
static int report_ctr(run_state *r, const dt_train_options *o, int evaluates, int64_t global_step, int64_t steps_here,
                      dt_train_result *res, dt_error *err) {
    FILE *log = r->log;
    int rc;
    res->bad_images = (int64_t)dt_ctr_bad_count(r->ctr);
    if (res->bad_images)
        fprintf(log, "skipped %lld bad lines (first: %s; " STOP_ON_BAD ")\n",
                (long long)res->bad_images, dt_ctr_first_bad(r->ctr));
    if (evaluates) {
        dt_ctr_options co;
        dt_ctr_eval_options(&co, r->net, DT_CTR_TEST, o->fail_on_bad_images);
        if (o->validation_fraction >= 0) co.validation_fraction = o->validation_fraction;
        dt_ctr_eval_result t;
        if ((rc = dt_evaluate_ctr(r->net, ctr_source(r, o, &co), &co, &t, err))) return rc;
        res->test_accuracy = t.accuracy, res->test_loss = t.loss, res->test_examples = t.examples;
        res->test_auc = t.auc, res->test_logloss = t.logloss;
        if (r->dbg->dump_params && *r->dbg->dump_params &&
            (rc = dump_floats("debug_dump_params", r->dbg->dump_params, dt_net_params(r->net),
                              dt_net_param_count(r->net), err)))
            return rc;
        fprintf(log, "test auc %.4f  test logloss %.4f  test accuracy %.4f  (%lld examples, click rate %.4f, mean "
                     "prediction %.4f)\n", t.auc, t.logloss, t.accuracy, (long long)t.examples,
                t.examples ? (double)t.positives / (double)t.examples : 0.0, t.mean_p);
    }
    fprintf(log, "trained %lld local steps in %.1f s (%.0f examples/sec); global step %lld\n", (long long)steps_here,
            res->seconds, res->examples_per_sec, (long long)global_step);
    fflush(log);
    return DT_OK;
}

/* After the steps: the final checkpoint, the bad images counted, the chief's test, the last line. */
static int report(run_state *r, const dt_train_options *o, int evaluates, int64_t global_step, int64_t steps_here,
                  dt_train_result *res, dt_error *err) {
    FILE *log = r->log;
    /* The final checkpoint (a cluster's after every worker finished) is what the test below sees. */
    int rc = dt_supervisor_final(r->supervisor, dt_net_params(r->net), &global_step, err);
    if (rc) return rc;
    if (r->ctr) return report_ctr(r, o, evaluates, global_step, steps_here, res, err);
    res->bad_images = (int64_t)dt_dataset_bad_count(r->data.train);
    if (r->data.validation != r->data.train) res->bad_images += (int64_t)dt_dataset_bad_count(r->data.validation);
    if (res->bad_images)
        fprintf(log, "skipped %lld undecodable images (" STOP_ON_BAD ")\n",
                (long long)res->bad_images);
    if (evaluates) {
        dt_eval_result test;
        if ((rc = dt_evaluate(r->net, r->data.test, NULL, &test, err))) return rc;
        res->test_accuracy = test.accuracy;
        res->test_loss = test.loss;
        res->test_examples = test.examples;
        if (r->ex && r->ex->params_out) {
            if (r->ex->params_n != dt_net_param_count(r->net))
                return dt_errorf(err, DT_ESHAPE, "params out: the model has %zu parameters, the buffer %zu",
                                 dt_net_param_count(r->net), r->ex->params_n);
            memcpy(r->ex->params_out, dt_net_params(r->net), r->ex->params_n * sizeof(float));
        }
        if (r->dbg->dump_params && *r->dbg->dump_params &&
            (rc = dump_floats("debug_dump_params", r->dbg->dump_params, dt_net_params(r->net),
                              dt_net_param_count(r->net), err)))
            return rc;
        fprintf(log, "test accuracy %.4f  test loss %.4f  (%lld examples)\n", test.accuracy, test.loss,
                (long long)test.examples);
    }
    fprintf(log, "trained %lld local steps in %.1f s (%.0f examples/sec); global step %lld\n", (long long)steps_here,
            res->seconds, res->examples_per_sec, (long long)global_step);
    fflush(log);
    return DT_OK;
}

/* A worker's (or a single process's) run, phase by phase. */
static int train_loop(run_state *r, const dt_train_options *o, FILE *log_out, dt_train_result *res,
                      dt_error *err) {
    /* Whatever logs during training (the loop, the supervisor's warnings, the remote updater) goes
     * through one stream that erases the progress line first, so every line starts on its own. */
    dt_progress_init(&r->prog, o->progress, 1);
    r->log_out = log_out;
    r->log = dt_progress_wrap(&r->prog, log_out);
    int64_t global_step, local_step;
    int rc = open_data(r, o, err);
    if (!rc) rc = create_updater(r, o, err);
    if (!rc) rc = restore_or_start(r, o, &global_step, &local_step, err);
    if (rc) return rc;
    const int64_t first_local_step = local_step;
    res->start_step = global_step;
    log_start(r, o);
    if ((rc = supervised(r, dt_supervisor_started, global_step, err))) return rc;

    /* Benchmarks of scale (--debug_emulate_compute_ms): a sleep stands in for the batch, forward
     * and backward, so many workers share few cores without slowing each other down, and a fixed
     * gradient of the model's full size is pushed, so the ps tasks and the network do the real
     * work. Its values are small and deterministic; nothing learns, so nothing is evaluated. */
    int emulate = r->dbg->emulate_compute_ms >= 0;
    if (emulate && r->ctr) {
        /* Click logs: the batch's ids decide which rows travel, so the batches, the forward and
         * the backward are real (cheap beside the sleep) and the step is padded to the time. */
        fprintf(r->log, "emulating compute: each step takes %d ms at least (real batches, forward and backward, "
                "then a sleep), no evaluation (benchmarks only)\n", r->dbg->emulate_compute_ms);
    } else if (emulate) {
        float *g = dt_net_grads(r->net);
        for (size_t i = 0, n = dt_net_param_count(r->net); i < n; i++) g[i] = (float)((int)(i % 7) - 3) * 1e-4f;
        fprintf(r->log, "emulating compute: %d ms per step, a constant gradient, no evaluation (benchmarks only)\n",
                r->dbg->emulate_compute_ms);
    }
    dt_progress_init(&r->prog, o->progress, r->plan.total);
    dt_progress_start(&r->prog, global_step, r->plan.examples_per_step);
    dt_status_start(r->status, r->plan.total, global_step, r->plan.examples_per_step);
    dt_metric_set(r->m.step, (double)global_step);
    double t_start = dt_seconds();
    rc = run_steps(r, o, emulate, &global_step, &local_step, res, err);
    dt_work_loop_end(r->work); /* an answer left due by a stop; the units granted ahead */
    /* An overlapping updater's last parameters are still on their way. */
    if (!rc && r->updater->settle && (rc = r->updater->settle(r->updater, r->net, &global_step, err)) == DT_OK)
        res->steps = global_step;
    dt_progress_clear(&r->prog);
    dt_status_finished(r->status);
    res->seconds = dt_seconds() - t_start;
    res->examples_per_sec = (double)(local_step - first_local_step) * o->batch_size / res->seconds;
    if (rc == DT_EINTR && !r->cluster.distributed) {
        /* Stopped on one machine: keep what was trained (a cluster is stopped as a whole, its ps
         * tasks too, so only its periodic checkpoints count). */
        dt_error serr = {0};
        if (dt_supervisor_final(r->supervisor, NULL, NULL, &serr)) fprintf(r->log, "warning: %s\n", serr.msg);
    }
    if (rc) return rc;
    if (r->tables) dt_local_tables_report(r->tables, r->log);
    return report(r, o, r->cluster.is_chief && !emulate, global_step, local_step - first_local_step, res, err);
}
