/* The public building blocks (include/dtrain.h) over the internal modules: what a user's own
 * training program calls. Each object owns what it allocates; every failure fills err. */
#include <stdlib.h>
#include <string.h>

#include "api/api_impl.h"
#include "cluster/cluster.h"
#include "cluster/placement.h"
#include "core/error.h"
#include "data/loader.h"
#include "model/net.h"
#include "train/evaluate.h"
#include "train/serve.h"
#include "train/table_optim.h"
#include "train/train_ex.h"
#include "update/updater.h"
#include "worker/remote.h"

/* ---- Cluster ---- */

int dt_cluster_from_args(dt_cluster **out, int *argc, char **argv, dt_error *err) {
    *out = NULL;
    dt_cluster *c = dt_calloc(1, sizeof *c, "cluster", err);
    if (!c) return DT_ENOMEM;
    int rc = dt_cluster_parse_args(c, argc, argv, err);
    if (rc) {
        free(c);
        return rc;
    }
    *out = c;
    return DT_OK;
}

void dt_cluster_free(dt_cluster *c) {
    if (!c) return;
    dt_cluster_clear(c);
    free(c);
}

int dt_cluster_is_ps(const dt_cluster *c) { return c && c->job == DT_JOB_PS; }
int dt_cluster_is_chief(const dt_cluster *c) { return !c || c->is_chief; }

/* A ps task as `dtrain train`'s serves: the dense placement of its --placement, --auth's keys,
 * --bind, --idle_timeout, --ps_table_memory. */
static int serve_with(const dt_cluster *c, const dt_net *net, const dt_train_options *o, const volatile int *stop,
                      FILE *log, dt_error *err) {
    if (!dt_cluster_is_ps(c)) return dt_errorf(err, DT_EINVAL, "dt_serve: this process is not a ps task");
    if (o->idle_timeout_ms < 0)
        return dt_errorf(err, DT_EINVAL, "dt_serve: idle_timeout_ms must not be negative, got %d", o->idle_timeout_ms);
    dt_place_strategy strategy;
    dt_placement pl = {0};
    dt_auth auth = {0};
    int rc = dt_train_check_cluster(o, err);
    if (!rc) rc = dt_place_strategy_parse(o->placement ? o->placement : "greedy", &strategy, err);
    if (!rc) rc = dt_train_load_auth(&auth, o, c, err);
    if (!rc) rc = dt_placement_compute_dense(&pl, net, c->n_ps, strategy, err);
    if (!rc) {
        const dt_serve_options so = {.auth = auth.curve ? &auth : NULL, .bind = o->bind,
                                     .idle_timeout_ms = o->idle_timeout_ms, .stop = stop,
                                     .table_memory = (uint64_t)(o->ps_table_memory_gib * 1073741824.0)};
        rc = dt_serve_task_opts(c, &pl, &so, log ? log : stdout, err);
    }
    dt_placement_free(&pl);
    dt_auth_free(&auth);
    return rc;
}

int dt_serve(const dt_cluster *c, const dt_net *net, FILE *log, int idle_timeout_ms, const volatile int *stop,
             dt_error *err) {
    dt_train_options o;
    dt_train_options_init(&o);
    o.idle_timeout_ms = idle_timeout_ms;
    return serve_with(c, net, &o, stop, log, err);
}

int dt_serve_opts(const dt_cluster *c, const dt_net *net, const dt_options *opts, FILE *log, dt_error *err) {
    if (!opts) return dt_errorf(err, DT_EINVAL, "dt_serve_opts: no options");
    dt_train_options o;
    int rc = dt_options_resolve(opts, &o, err);
    return rc ? rc : serve_with(c, net, &o, dt_options_stop_flag(opts), log, err);
}

/* ---- Batches ---- */

struct dt_batches {
    dt_data_splits data;
    dt_loader *loader;
};

void dt_batches_free(dt_batches *b) {
    if (!b) return;
    dt_loader_free(b->loader);
    dt_data_splits_free(&b->data);
    free(b);
}

int dt_batches_open(dt_batches **out, const char *data_path, const dt_net *net, int batch_size, uint64_t seed,
                    const dt_cluster *cluster, dt_error *err) {
    *out = NULL;
    dt_batches *b = dt_calloc(1, sizeof *b, "batches", err);
    if (!b) return DT_ENOMEM;
    const dt_model_spec *spec = dt_net_spec(net);
    dt_data_options dopt = {.h = spec->in_h, .w = spec->in_w, .c = spec->in_c, .validation_fraction = -1,
                            .seed = seed, .bad_images = DT_BAD_IMAGES_SKIP};
    int distributed = cluster && cluster->distributed && cluster->job == DT_JOB_WORKER;
    dt_loader_options lo = {.batch_size = batch_size, .shuffle = 1, .seed = seed,
                            .shard_index = distributed ? cluster->task_index : 0,
                            .shard_count = distributed ? cluster->n_workers : 1};
    int rc = dt_data_open(&b->data, data_path, &dopt, err);
    if (!rc) rc = dt_loader_create(&b->loader, b->data.train, &lo, err);
    if (rc) {
        dt_batches_free(b);
        return rc;
    }
    *out = b;
    return DT_OK;
}

int dt_batches_next(dt_batches *b, const float **x, const int32_t **labels, int *n, dt_error *err) {
    dt_batch batch;
    int rc = dt_loader_next(b->loader, &batch, err);
    if (rc) return rc;
    *x = batch.x, *labels = batch.labels, *n = batch.n;
    return DT_OK;
}

int dt_batches_test_accuracy(dt_batches *b, dt_net *net, double *accuracy, dt_error *err) {
    dt_eval_result r;
    int rc = dt_evaluate(net, b->data.test, NULL, &r, err);
    if (!rc) *accuracy = r.accuracy;
    return rc;
}

/* ---- Optimizer: an updater (local or remote) and the step counters around it. ---- */

struct dt_optimizer {
    dt_updater *updater;
    dt_opt_config config;
    dt_placement placement;      /* distributed only */
    dt_auth auth;                /* distributed with --auth=curve: the keys */
    dt_net *net;                 /* dt_optimizer_start's: an overlapped exchange settles into it */
    int64_t local_step, global_step;
};

void dt_optimizer_free(dt_optimizer *o) {
    if (!o) return;
    if (o->updater) o->updater->free(o->updater);
    dt_placement_free(&o->placement);
    dt_auth_free(&o->auth);
    free(o);
}

int dt_optimizer_new(dt_optimizer **out, const char *name, float learning_rate, const dt_net *net, dt_error *err) {
    *out = NULL;
    dt_optimizer *o = dt_calloc(1, sizeof *o, "optimizer", err);
    if (!o) return DT_ENOMEM;
    /* The embedding tables (a click-log model) get dtrain train's default: Adagrad at this rate. */
    dt_train_options defaults;
    dt_train_options_init(&defaults);
    defaults.learning_rate = learning_rate;
    dt_lazy_config tables;
    int rc = dt_opt_config_init(&o->config, name, learning_rate, err);
    if (!rc) rc = dt_table_optim_config(&defaults, &tables, err);
    if (!rc) rc = dt_local_updater_create(&o->updater, &o->config, &tables, net, err);
    if (rc) {
        dt_optimizer_free(o);
        return rc;
    }
    *out = o;
    return DT_OK;
}

/* A worker's remote updater as `dtrain train`'s workers configure it from their options
 * (train_ex.h: sync replicas, compression, chunks, overlap, timeouts, faults) with the dense
 * placement of --placement and --auth's keys; stop: what ends its waits. */
static int distribute_with(dt_optimizer *o, const dt_cluster *c, const dt_net *net, const dt_train_options *to,
                           const volatile int *stop, FILE *log, dt_error *err) {
    if (!c || !c->distributed) return DT_OK; /* a single process keeps its local optimizer */
    if (c->job != DT_JOB_WORKER) return dt_errorf(err, DT_EINVAL, "dt_optimizer_distribute: this process is not a worker");
    if (o->placement.n_ps > 0) return dt_errorf(err, DT_EINVAL, "dt_optimizer_distribute: distributed already");
    dt_train_options opts = *to;
    opts.stop = stop;
    dt_place_strategy strategy;
    dt_remote_config cfg;
    dt_updater *remote = NULL;
    log = log ? log : stdout;
    int rc = dt_place_strategy_parse(opts.placement ? opts.placement : "greedy", &strategy, err);
    if (!rc) rc = dt_train_load_auth(&o->auth, &opts, c, err);
    /* The placement must outlive the remote updater: it lives in the optimizer. */
    if (!rc) rc = dt_placement_compute_dense(&o->placement, net, c->n_ps, strategy, err);
    if (!rc) rc = dt_train_remote_config(&opts, c, net, &cfg, log, err);
    if (!rc) {
        cfg.placement = &o->placement;
        cfg.opt = o->config;
        cfg.auth = o->auth.curve ? &o->auth : NULL;
        rc = dt_remote_updater_create(&remote, &cfg, err);
    }
    if (rc) {
        dt_placement_free(&o->placement);
        dt_auth_free(&o->auth);
        return rc;
    }
    o->updater->free(o->updater);
    o->updater = remote;
    return DT_OK;
}

int dt_optimizer_distribute(dt_optimizer *o, const dt_cluster *c, const dt_net *net, int issync, FILE *log,
                            dt_error *err) {
    /* dtrain train's defaults, but the exchange between steps and uncut as this call always made it; a lost ps
     * is waited for as by dtrain train (no checkpoints here: a ps that lost its shard restarts the
     * model from the seed); sync: every worker's gradient aggregated each step (no backups). */
    dt_train_options to;
    dt_train_options_init(&to);
    to.issync = issync != 0;
    to.overlap = "none";
    to.chunk_kb = 0; /* one chunk per shard */
    return distribute_with(o, c, net, &to, NULL, log, err);
}

int dt_optimizer_distribute_opts(dt_optimizer *o, const dt_cluster *c, const dt_net *net, const dt_options *opts,
                                 FILE *log, dt_error *err) {
    if (!opts) return dt_errorf(err, DT_EINVAL, "dt_optimizer_distribute_opts: no options");
    dt_train_options to;
    int rc = dt_options_resolve(opts, &to, err);
    return rc ? rc : distribute_with(o, c, net, &to, dt_options_stop_flag(opts), log, err);
}

int dt_optimizer_start(dt_optimizer *o, dt_net *net, uint64_t seed, int64_t *global_step, dt_error *err) {
    o->net = net;
    int rc = o->updater->start(o->updater, net, seed, &o->global_step, err);
    if (!rc && global_step) *global_step = o->global_step;
    return rc;
}

int dt_optimizer_apply(dt_optimizer *o, dt_net *net, int64_t *global_step, dt_error *err) {
    int64_t tag = o->placement.n_ps > 0 ? o->global_step : o->local_step;
    int rc = o->updater->apply(o->updater, net, tag, &o->global_step, err);
    if (rc) return rc;
    o->local_step++;
    if (global_step) *global_step = o->global_step;
    return DT_OK;
}

int dt_optimizer_finish(dt_optimizer *o, dt_error *err) {
    /* --overlap: the last exchange's parameters are still on their way (train.c's settle) */
    int rc = o->updater->settle && o->net ? o->updater->settle(o->updater, o->net, &o->global_step, err) : DT_OK;
    dt_error ferr = {0};
    int frc = o->updater->finish(o->updater, &ferr);
    if (frc && !rc) {
        if (err) *err = ferr;
        rc = frc;
    }
    return rc;
}
