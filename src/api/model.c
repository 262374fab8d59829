/* A model trained step by step on the caller's arrays (include/dtrain.h, dt_model): the net, the
 * local updater and the counters of one process of dtrain train, so a step here is one of its
 * steps (the same dropout seeds, clipping, optimizer and schedule), and its checkpoints are the
 * supervisor's files. A click-log model steps on click arrays, built into a batch as the reader
 * builds one (its tables of unbounded ids held here, as dtrain train holds them); predict and
 * evaluate are dtrain predict's pass. dt_model_distribute swaps the local updater for a cluster
 * worker's remote one, configured as dtrain train's workers are (train_ex.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_impl.h"
#include "cluster/placement.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/net.h"
#include "supervisor/checkpoint.h"
#include "train/evaluate_ctr.h"
#include "train/local_tables.h"
#include "train/table_ckpt.h"
#include "train/table_optim.h"
#include "train/train_ex.h"
#include "update/updater.h"

struct dt_model {
    dt_train_options o;          /* resolved; its text flags point into the dt_options' strings */
    char *model_path;            /* owned copy */
    dt_net *net;
    dt_updater *updater;
    dt_opt_config opt;
    dt_lazy_config table_opt;
    int64_t local_step, global_step;
    float *xbuf;                 /* [max batch * example]: uint8 batches scaled */
    size_t example;              /* floats per example */
    /* A click-log model: */
    dt_ctr_builder *rows;        /* a step's batch, built from the caller's rows as the reader builds one */
    dt_local_tables *tables;     /* unbounded ids: the tables a ps would hold, here (as dtrain train's) */
    dt_table_spool *spool;       /* a save's tables of unbounded ids, between prepare and write */
    FILE *log, *log_own;         /* the options' log function's stream (owned), else stdout */
    /* A cluster worker (dt_model_distribute): the updater is the remote one over these. */
    int distributed, finished;
    dt_cluster cluster;
    dt_placement placement;
    dt_auth auth;
};

static int apply_tables(void *user, dt_error *err) { return dt_local_tables_apply(user, err); }

void dt_model_free(dt_model *m) {
    if (!m) return;
    if (m->updater) m->updater->free(m->updater);
    dt_local_tables_free(m->tables);
    dt_table_spool_free(m->spool);
    dt_ctr_builder_free(m->rows);
    dt_net_free(m->net);
    dt_placement_free(&m->placement);
    dt_auth_free(&m->auth);
    dt_cluster_clear(&m->cluster);
    if (m->log_own) fclose(m->log_own);
    free(m->xbuf);
    free(m->model_path);
    free(m);
}

int dt_model_new(dt_model **out, const dt_options *opts, dt_error *err) {
    *out = NULL;
    if (!opts) return dt_errorf(err, DT_EINVAL, "dt_model_new: no options");
    dt_model *m = dt_calloc(1, sizeof *m, "model", err);
    if (!m) return DT_ENOMEM;
    dt_cluster_single(&m->cluster);
    int rc = dt_options_resolve(opts, &m->o, err);
    const dt_train_options *o = &m->o;
    m->o.stop = dt_options_stop_flag(opts);
    if (!rc) rc = dt_options_open_log(opts, &m->log_own, err);
    m->log = m->log_own ? m->log_own : stdout;
    if (!rc && (!o->model_path || !*o->model_path)) rc = dt_errorf(err, DT_EINVAL, "--model: no model file given");
    if (!rc && !(m->model_path = strdup(o->model_path))) rc = dt_errorf(err, DT_ENOMEM, "out of memory");
    if (!rc) rc = dt_net_load_opts(&m->net, o->model_path, o->batch_size, DT_NET_TABLES_AUTO, err);
    if (!rc) {
        dt_net_set_threads(m->net, o->threads);
        rc = dt_net_set_precision(m->net, o->precision, err);
        if (!rc && o->device && *o->device && strcmp(o->device, "cpu")) rc = dt_net_set_device(m->net, o->device, err);
    }
    /* The schedule spans --train_steps (a cosine decay without --lr_decay_steps needs them). */
    if (!rc) rc = dt_train_opt_config(o, o->train_steps, &m->opt, err);
    if (!rc) rc = dt_table_optim_config(o, &m->table_opt, err);
    if (!rc) rc = dt_local_updater_create(&m->updater, &m->opt, &m->table_opt, m->net, err);
    /* unbounded ids in one process: the tables a ps would hold, here, as dtrain train holds them */
    if (!rc && dt_net_compact_tables(m->net) &&
        !(rc = dt_local_tables_create(&m->tables, m->net, &m->table_opt, o->seed, 0, err)))
        dt_local_updater_set_tables(m->updater, apply_tables, m->tables);
    if (!rc) rc = m->updater->start(m->updater, m->net, o->seed, &m->global_step, err);
    if (!rc && dt_net_is_ctr(m->net)) {
        const dt_model_spec *s = dt_net_spec(m->net);
        dt_ctr_memory shape = {.num_dense = s->num_dense, .num_fields = s->num_fields};
        rc = dt_ctr_builder_create_memory(&m->rows, &shape, o->batch_size, err);
    } else if (!rc) {
        const dt_model_spec *s = dt_net_spec(m->net);
        m->example = (size_t)s->in_h * (size_t)s->in_w * (size_t)s->in_c;
        m->xbuf = dt_malloc((size_t)o->batch_size * m->example * sizeof(float), "batch", err);
        if (!m->xbuf) rc = DT_ENOMEM;
    }
    if (rc) {
        dt_model_free(m);
        return rc;
    }
    m->o.model_path = m->model_path;
    *out = m;
    return DT_OK;
}

int dt_model_distribute(dt_model *m, int *role, dt_error *err) {
    if (role) *role = 0;
    if (m->distributed) return dt_errorf(err, DT_EINVAL, "dt_model_distribute: this model is a cluster worker already");
    const dt_train_options *o = &m->o;
    dt_cluster *c = &m->cluster;
    dt_cluster_clear(c); /* a failed call's */
    int rc = dt_train_cluster(c, o, m->log, err);
    if (rc || !c->distributed) return rc; /* alone: the local updater stays */
    if (c->job == DT_JOB_PS) {
        if (role) *role = 2;
        return DT_OK; /* the caller serves (dt_options_train) */
    }
    if (m->rows)
        return dt_errorf(err, DT_EINVAL, "%s is a click-log model: on a cluster it trains with dt_options_train (the step "
                         "API's cluster worker trains image models)", m->model_path);
    if (o->sharding && !strcmp(o->sharding, "dynamic"))
        return dt_errorf(err, DT_EINVAL, "sharding dynamic: the step API's worker shards its own batches (fixed)");
    dt_place_strategy strategy;
    dt_remote_config cfg;
    dt_updater *remote = NULL;
    rc = dt_place_strategy_parse(o->placement ? o->placement : "greedy", &strategy, err);
    if (!rc) rc = dt_train_load_auth(&m->auth, o, c, err);
    if (!rc) rc = dt_placement_compute_dense(&m->placement, m->net, c->n_ps, strategy, err);
    if (!rc) rc = dt_train_remote_config(o, c, m->net, &cfg, m->log, err);
    if (!rc) {
        cfg.placement = &m->placement;
        cfg.opt = m->opt;
        cfg.auth = m->auth.curve ? &m->auth : NULL;
        rc = dt_remote_updater_create(&remote, &cfg, err);
    }
    /* The chief initialises the ps tasks from the seed (or finds them trained: a restarted chief);
     * every worker then trains from the parameters they hold. */
    int64_t step = 0;
    if (!rc) rc = remote->start(remote, m->net, o->seed, &step, err);
    if (rc) {
        if (remote) remote->free(remote);
        dt_placement_free(&m->placement);
        dt_auth_free(&m->auth);
        return rc;
    }
    m->updater->free(m->updater);
    m->updater = remote;
    m->distributed = 1;
    m->global_step = step;
    /* Resuming a running job: each worker has taken global_step (sync) or global_step / workers
     * batches of its shard (train.c, restore_or_start). */
    m->local_step = o->issync ? step : step / c->n_workers;
    if (role) *role = c->is_chief ? 1 : 3;
    return DT_OK;
}

int dt_model_finish(dt_model *m, dt_error *err) {
    if (!m->distributed || m->finished) return DT_OK;
    m->finished = 1;
    /* An overlapping exchange's last parameters first (train.c's settle), then the end. */
    int rc = m->updater->settle ? m->updater->settle(m->updater, m->net, &m->global_step, err) : DT_OK;
    dt_error ferr = {0};
    int frc = m->updater->finish(m->updater, &ferr);
    if (frc && !rc) {
        if (err) *err = ferr;
        rc = frc;
    }
    return rc;
}

void dt_model_input_shape(const dt_model *m, int *h, int *w, int *c) {
    const dt_model_spec *s = dt_net_spec(m->net);
    if (h) *h = s->in_h;
    if (w) *w = s->in_w;
    if (c) *c = s->in_c;
}
int dt_model_num_classes(const dt_model *m) { return dt_net_num_classes(m->net); }
int dt_model_max_batch(const dt_model *m) { return dt_net_max_batch(m->net); }
int64_t dt_model_global_step(const dt_model *m) { return m->global_step; }
size_t dt_model_param_count(const dt_model *m) { return dt_net_param_count(m->net); }

int dt_model_get_params(const dt_model *m, float *out, size_t n, dt_error *err) {
    size_t have = dt_net_param_count(m->net);
    if (!out || n != have)
        return dt_errorf(err, DT_ESHAPE, "params: the model has %zu parameters, the buffer %zu", have, n);
    memcpy(out, dt_net_params(m->net), have * sizeof(float));
    return DT_OK;
}

int dt_model_set_params(dt_model *m, const float *params, size_t n, dt_error *err) {
    if (m->distributed)
        return dt_errorf(err, DT_EINVAL, "params: a cluster worker's parameters are the ps tasks' (its next step pulls them)");
    size_t have = dt_net_param_count(m->net);
    if (!params || n != have)
        return dt_errorf(err, DT_ESHAPE, "params: the model has %zu parameters, %zu given", have, n);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(params[i])) return dt_errorf(err, DT_EINVAL, "params: element %zu is %g", i, (double)params[i]);
    memcpy(dt_net_params(m->net), params, n * sizeof(float));
    return DT_OK;
}

/* The batch as the net takes it: float32 as is, uint8 scaled into xbuf as the loader scales. */
static const float *batch_floats(dt_model *m, const void *x, int dtype, int n, dt_error *err) {
    if (!x) {
        dt_errorf(err, DT_EINVAL, "x: no examples given");
        return NULL;
    }
    if (dtype == DT_FLOAT32) return x;
    if (dtype != DT_UINT8) {
        dt_errorf(err, DT_EINVAL, "x: dtype must be DT_FLOAT32 or DT_UINT8, got %d", dtype);
        return NULL;
    }
    const uint8_t *p = x;
    size_t total = (size_t)n * m->example;
    for (size_t j = 0; j < total; j++) m->xbuf[j] = (float)p[j] / 255.0f;
    return m->xbuf;
}

/* dtrain train's seed of this step (train.c, run_steps): worker `shard` of n_workers at its local
 * step; one process is worker 0 of 1. */
static uint64_t step_seed(const dt_model *m) {
    int n = m->distributed ? m->cluster.n_workers : 1, shard = m->distributed ? m->cluster.task_index : 0;
    return dt_hash64(m->o.seed, (uint64_t)(m->local_step * n + shard));
}

/* The step's update, here or on the ps tasks (tagged with the global step there, as dtrain train's). */
static int apply(dt_model *m, dt_error *err) {
    if (m->finished) return dt_errorf(err, DT_EINVAL, "this worker has finished (dt_model_finish): it trains no more");
    int rc = m->updater->apply(m->updater, m->net, m->distributed ? m->global_step : m->local_step, &m->global_step, err);
    if (!rc) m->local_step++;
    return rc;
}

static int check_labels(const dt_model *m, const int32_t *labels, int64_t n, dt_error *err) {
    if (!labels) return dt_errorf(err, DT_EINVAL, "y: no labels given");
    int classes = dt_net_num_classes(m->net);
    for (int64_t i = 0; i < n; i++)
        if (labels[i] < 0 || labels[i] >= classes)
            return dt_errorf(err, DT_EINVAL, "y: label %lld is %d, out of range 0..%d", (long long)i, (int)labels[i],
                             classes - 1);
    return DT_OK;
}

static int check_batch(const dt_model *m, int64_t n, int limit, dt_error *err) {
    if (m->rows)
        return dt_errorf(err, DT_EINVAL, "%s is a click-log model: it takes click arrays, not images", m->model_path);
    if (n < 1 || (limit && n > dt_net_max_batch(m->net)))
        return dt_errorf(err, DT_EINVAL, "x: %lld examples, out of range 1..%d (the model's max batch, --batch_size)",
                         (long long)n, limit ? dt_net_max_batch(m->net) : INT32_MAX);
    return DT_OK;
}

int dt_model_train_step(dt_model *m, const void *x, int dtype, const int32_t *labels, int n, float *loss,
                        int *correct, dt_error *err) {
    int rc = check_batch(m, n, 1, err);
    if (!rc) rc = check_labels(m, labels, n, err);
    if (rc) return rc;
    const float *xf = batch_floats(m, x, dtype, n, err);
    if (!xf) return DT_EINVAL;
    if (!dt_net_forward(m->net, xf, n, 1, step_seed(m), err)) return DT_EINVAL;
    int ok = 0;
    float l = dt_net_loss(m->net, labels, &ok);
    if ((rc = dt_net_status(m->net, err))) return rc;
    if (!isfinite(l))
        return dt_errorf(err, DT_EINVAL, "loss became %g at global step %lld: lower the learning_rate (or check x "
                         "for NaN)", (double)l, (long long)m->global_step + 1);
    if ((rc = dt_net_backward(m->net, err)) || (rc = dt_net_status(m->net, err))) return rc;
    if (m->o.clip_gradient_norm > 0) dt_net_clip_gradients(m->net, (float)m->o.clip_gradient_norm);
    if ((rc = apply(m, err))) return rc;
    if (loss) *loss = l;
    if (correct) *correct = ok;
    return DT_OK;
}

/* Evaluation forwards over n examples in batches of the max batch; per batch, fn sees its logits. */
static int eval_batches(dt_model *m, const void *x, int dtype, int64_t n, const int32_t *labels, float *logits,
                        double *loss_sum, int64_t *correct, dt_error *err) {
    int rc = check_batch(m, n, 0, err);
    if (!rc && labels) rc = check_labels(m, labels, n, err);
    if (rc) return rc;
    int mb = dt_net_max_batch(m->net), classes = dt_net_num_classes(m->net);
    size_t bytes = dtype == DT_UINT8 ? 1 : sizeof(float);
    for (int64_t i = 0; i < n; i += mb) {
        int b = (int)(n - i < mb ? n - i : mb);
        const float *xf = batch_floats(m, (const char *)x + (size_t)i * m->example * bytes, dtype, b, err);
        if (!xf) return DT_EINVAL;
        const float *out = dt_net_forward(m->net, xf, b, 0, 0, err);
        if (!out) return DT_EINVAL;
        if ((rc = dt_net_status(m->net, err))) return rc;
        if (logits) memcpy(logits + (size_t)i * (size_t)classes, out, (size_t)b * (size_t)classes * sizeof(float));
        if (labels) {
            int ok = 0;
            *loss_sum += (double)dt_net_loss(m->net, labels + i, &ok) * b;
            *correct += ok;
        }
    }
    return DT_OK;
}

int dt_model_predict(dt_model *m, const void *x, int dtype, int64_t n, float *logits, dt_error *err) {
    if (!logits) return dt_errorf(err, DT_EINVAL, "logits: no output buffer");
    return eval_batches(m, x, dtype, n, NULL, logits, NULL, NULL, err);
}

int dt_model_evaluate(dt_model *m, const void *x, int dtype, const int32_t *labels, int64_t n, double *loss,
                      double *accuracy, dt_error *err) {
    double sum = 0;
    int64_t ok = 0;
    if (!labels) return dt_errorf(err, DT_EINVAL, "y: no labels given");
    int rc = eval_batches(m, x, dtype, n, labels, NULL, &sum, &ok, err);
    if (rc) return rc;
    if (loss) *loss = sum / (double)n;
    if (accuracy) *accuracy = (double)ok / (double)n;
    return DT_OK;
}

int dt_model_click_shape(const dt_model *m, int *num_dense, int *num_fields) {
    const dt_model_spec *s = dt_net_spec(m->net);
    int ctr = m->rows != NULL;
    if (num_dense) *num_dense = ctr ? s->num_dense : 0;
    if (num_fields) *num_fields = ctr ? s->num_fields : 0;
    return ctr;
}

static int check_clicks(const dt_model *m, const dt_clicks *c, dt_error *err) {
    if (!m->rows)
        return dt_errorf(err, DT_EINVAL, "%s is an image model: it takes images, not click arrays", m->model_path);
    if (!c) return dt_errorf(err, DT_EINVAL, "click arrays: none given");
    const dt_model_spec *s = dt_net_spec(m->net);
    if (c->m.num_dense != s->num_dense || c->m.num_fields != s->num_fields)
        return dt_errorf(err, DT_ESHAPE, "click arrays: %d dense features and %d fields, but %s takes %d and %d",
                         c->m.num_dense, c->m.num_fields, m->model_path, s->num_dense, s->num_fields);
    return DT_OK;
}

int dt_model_train_step_clicks(dt_model *m, const dt_clicks *c, float *loss, int *correct, dt_error *err) {
    int rc = check_clicks(m, c, err);
    if (rc) return rc;
    if (c->m.n > dt_net_max_batch(m->net))
        return dt_errorf(err, DT_EINVAL, "click arrays: %lld rows, out of range 1..%d (the model's max batch, "
                         "--batch_size)", (long long)c->m.n, dt_net_max_batch(m->net));
    /* The batch as the reader builds one from these rows (values 1 when none, offsets rebased). */
    dt_ctr_builder_clear(m->rows);
    char why[256];
    for (int64_t i = 0; i < c->m.n; i++)
        if ((rc = dt_ctr_builder_add_row(m->rows, &c->m, i, why, sizeof why, err)))
            return rc == DT_EFORMAT ? dt_errorf(err, DT_EFORMAT, "click arrays: row %lld: %s", (long long)i, why) : rc;
    dt_ctr_batch b;
    dt_ctr_builder_batch(m->rows, &b);
    if (!dt_net_forward_ctr(m->net, &b, 1, step_seed(m), err)) return DT_EINVAL; /* err says why */
    int ok = 0;
    float l = dt_net_loss_binary(m->net, b.labels, &ok);
    if ((rc = dt_net_status(m->net, err))) return rc;
    if (!isfinite(l))
        return dt_errorf(err, DT_EINVAL, "loss became %g at global step %lld: lower the learning_rate", (double)l,
                         (long long)m->global_step + 1);
    if ((rc = dt_net_backward(m->net, err)) || (rc = dt_net_status(m->net, err))) return rc;
    if (m->o.clip_gradient_norm > 0) dt_net_clip_gradients(m->net, (float)m->o.clip_gradient_norm);
    if ((rc = apply(m, err))) return rc;
    if (loss) *loss = l;
    if (correct) *correct = ok;
    return DT_OK;
}

/* Every row of c through dtrain predict's pass (evaluate_ctr.h): one pass of all the rows, a bad row
 * an error naming it. */
static int clicks_pass(dt_model *m, const dt_clicks *c, float *logits, float *probs, dt_ctr_eval_result *res,
                       dt_error *err) {
    int rc = check_clicks(m, c, err);
    if (rc) return rc;
    dt_ctr_options co;
    dt_ctr_eval_options(&co, m->net, DT_CTR_ALL, 1);
    co.memory = &c->m;
    return dt_evaluate_ctr_into(m->net, "click arrays", &co, logits, probs, c->m.n, res, err);
}

int dt_model_predict_clicks(dt_model *m, const dt_clicks *c, float *logits, float *probs, dt_error *err) {
    dt_ctr_eval_result res;
    return clicks_pass(m, c, logits, probs, &res, err);
}

int dt_model_evaluate_clicks(dt_model *m, const dt_clicks *c, double *loss, double *accuracy, double *auc,
                             double *logloss, dt_error *err) {
    dt_ctr_eval_result res;
    int rc = clicks_pass(m, c, NULL, NULL, &res, err);
    if (rc) return rc;
    if (loss) *loss = res.loss;
    if (accuracy) *accuracy = res.accuracy;
    if (auc) *auc = res.auc;
    if (logloss) *logloss = res.logloss;
    return DT_OK;
}

/* A compact net's tables, this process's (train/table_ckpt.h), into the checkpoint being written. */
static int save_tables(void *user, dt_ckpt_sink *sink, int64_t global_step, dt_error *err) {
    (void)global_step;
    dt_model *m = user;
    dt_table_ckpt_stats st;
    const dt_table_io io = dt_local_tables_io(m->tables);
    int rc = dt_table_ckpt_save(&io, m->net, sink, m->spool, &st, err);
    dt_table_spool_free(m->spool);
    m->spool = NULL;
    return rc;
}

/* Before the checkpoint's header: the tables of unbounded ids spooled, their row counts into held. */
static int prepare_tables(void *user, const char *logdir, uint64_t *held, dt_error *err) {
    dt_model *m = user;
    dt_table_spool_free(m->spool); /* a save that failed before its rows were written */
    m->spool = NULL;
    const dt_table_io io = dt_local_tables_io(m->tables);
    return dt_table_ckpt_prepare(&io, m->net, logdir, held, &m->spool, err);
}

/* What a checkpoint of this model is (checkpoint.h): one process, no data of its own. */
static dt_ckpt_run ckpt_run(dt_model *m) {
    return (dt_ckpt_run){.net = m->net, .opt = &m->opt, .tables = &m->table_opt, .seed = m->o.seed,
                         .batch_size = m->o.batch_size, .n_workers = 1, .validation_fraction = -1,
                         .table_rows = m->tables ? save_tables : NULL, .table_prepare = m->tables ? prepare_tables : NULL,
                         .table_user = m};
}

/* The step API's checkpoints are one process's: a cluster's are its chief's dt_options_train. */
static int check_alone(const dt_model *m, const char *what, dt_error *err) {
    if (m->distributed)
        return dt_errorf(err, DT_EINVAL, "%s: a cluster worker's model (dt_model_distribute) has no checkpoints of its own "
                         "here: a cluster checkpoints through dt_options_train", what);
    return DT_OK;
}

int dt_model_save(dt_model *m, const char *logdir, int max_to_keep, dt_error *err) {
    if (check_alone(m, "dt_model_save", err)) return DT_EINVAL;
    if (!logdir || !*logdir) return dt_errorf(err, DT_EINVAL, "logdir: no folder given");
    dt_ckpt_run run = ckpt_run(m);
    size_t n = dt_net_param_count(m->net), slots = (size_t)dt_ckpt_state_slots(&run);
    float *params = dt_malloc(n * sizeof(float), "checkpoint parameters", err);
    float *state = slots ? dt_malloc(slots * n * sizeof(float), "checkpoint state", err) : NULL;
    int rc = !params || (slots && !state) ? DT_ENOMEM : 0;
    int64_t step = m->global_step;
    if (!rc) rc = m->updater->snapshot(m->updater, m->net, params, state, &step, 0, err);
    if (!rc) rc = dt_ckpt_save(logdir, &run, params, state, step, max_to_keep, NULL, NULL, 0, err);
    free(params);
    free(state);
    return rc;
}

int dt_model_restore(dt_model *m, const char *logdir, dt_error *err) {
    if (check_alone(m, "dt_model_restore", err)) return DT_EINVAL;
    if (!logdir || !*logdir) return dt_errorf(err, DT_EINVAL, "logdir: no folder given");
    dt_ckpt_run run = ckpt_run(m);
    dt_st_file *f = NULL;
    char path[4096];
    int found = dt_ckpt_open_latest_for(&f, path, sizeof path, logdir, dt_ckpt_fits_check, &run, NULL, err);
    if (found <= 0) return found;
    size_t n = dt_net_param_count(m->net), slots = (size_t)dt_ckpt_state_slots(&run);
    float *params = dt_malloc(n * sizeof(float), "checkpoint parameters", err);
    /* Never NULL: the updater's restore copies slots * n floats from it, none for sgd. */
    float *state = dt_malloc((slots ? slots * n : 1) * sizeof(float), "checkpoint state", err);
    int rc = !params || !state ? DT_ENOMEM : 0;
    int64_t step = 0;
    if (!rc) rc = dt_ckpt_load(f, path, &run, params, slots ? state : NULL, &step, err);
    if (!rc) {
        if (slots) dt_ckpt_clear_untrained_slots(&run, state);
        memcpy(dt_net_params(m->net), params, n * sizeof(float));
        rc = m->updater->restore(m->updater, m->net, state, step, &m->global_step, err);
    }
    if (!rc && m->tables) { /* this process's tables: at the checkpoint's step, its rows (as dtrain train's) */
        dt_local_tables_set_step(m->tables, step);
        const dt_table_io io = dt_local_tables_io(m->tables);
        dt_table_ckpt_stats st;
        rc = dt_table_ckpt_restore(&io, f, path, &run, &st, err);
    }
    dt_st_close(f);
    /* One process resumes its data where the run left it: a step per batch. */
    if (!rc) m->local_step = m->global_step;
    free(params);
    free(state);
    return rc ? rc : 1;
}
