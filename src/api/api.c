/* The public building blocks (include/dtrain.h) over the internal modules: what a user's own
 * training program calls. Each object owns what it allocates; every failure fills err. */
#include <stdlib.h>
#include <string.h>

#include "cluster/cluster.h"
#include "cluster/placement.h"
#include "core/error.h"
#include "data/loader.h"
#include "model/net.h"
#include "train/evaluate.h"
#include "train/serve.h"
#include "train/table_optim.h"
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

int dt_serve(const dt_cluster *c, const dt_net *net, FILE *log, int idle_timeout_ms, const volatile int *stop,
             dt_error *err) {
    if (!dt_cluster_is_ps(c)) return dt_errorf(err, DT_EINVAL, "dt_serve: this process is not a ps task");
    if (idle_timeout_ms < 0)
        return dt_errorf(err, DT_EINVAL, "dt_serve: idle_timeout_ms must not be negative, got %d", idle_timeout_ms);
    dt_placement pl;
    int rc = dt_placement_compute(&pl, dt_net_view(net, 0), dt_net_num_views(net), c->n_ps, DT_PLACE_GREEDY, err);
    if (rc) return rc;
    /* The public API has no --auth yet. */
    rc = dt_serve_task(c, &pl, NULL, idle_timeout_ms, stop, log ? log : stdout, err);
    dt_placement_free(&pl);
    return rc;
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
    int64_t local_step, global_step;
};

void dt_optimizer_free(dt_optimizer *o) {
    if (!o) return;
    if (o->updater) o->updater->free(o->updater);
    dt_placement_free(&o->placement);
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

int dt_optimizer_distribute(dt_optimizer *o, const dt_cluster *c, const dt_net *net, int issync, FILE *log,
                            dt_error *err) {
    if (!c || !c->distributed) return DT_OK; /* a single process keeps its local optimizer */
    if (c->job != DT_JOB_WORKER) return dt_errorf(err, DT_EINVAL, "dt_optimizer_distribute: this process is not a worker");
    dt_updater *remote = NULL;
    dt_placement pl;
    int rc = dt_placement_compute(&pl, dt_net_view(net, 0), dt_net_num_views(net), c->n_ps, DT_PLACE_GREEDY, err);
    if (rc) return rc;
    dt_remote_config cfg = {.cluster = c, .placement = &o->placement, .opt = o->config,
                            .connect_timeout_ms = 60000, .n_workers_to_wait = c->n_workers - 1, .log = log ? log : stdout,
                            /* A lost ps is waited for as by dtrain train (no checkpoints here: a
                             * ps that lost its shard restarts the model from the seed). */
                            .ps_timeout_ms = 120000,
                            /* Sync: every worker's gradient is aggregated each step (no backups). */
                            .replicas_to_aggregate = issync ? c->n_workers : 0,
                            .total_num_replicas = issync ? c->n_workers : 0};
    /* The placement must outlive the remote updater: it moves into the optimizer first. */
    dt_placement_free(&o->placement);
    o->placement = pl;
    if ((rc = dt_remote_updater_create(&remote, &cfg, err))) return rc;
    o->updater->free(o->updater);
    o->updater = remote;
    return DT_OK;
}

int dt_optimizer_start(dt_optimizer *o, dt_net *net, uint64_t seed, int64_t *global_step, dt_error *err) {
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

int dt_optimizer_finish(dt_optimizer *o, dt_error *err) { return o->updater->finish(o->updater, err); }
