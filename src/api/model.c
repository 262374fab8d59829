/* A model trained step by step on the caller's arrays (include/dtrain.h, dt_model): the net, the
 * local updater and the counters of one process of dtrain train, so a step here is one of its
 * steps (the same dropout seeds, clipping, optimizer and schedule), and its checkpoints are the
 * supervisor's files. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_impl.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/net.h"
#include "supervisor/checkpoint.h"
#include "train/table_optim.h"
#include "train/train_ex.h"
#include "update/updater.h"

struct dt_model {
    dt_train_options o;          /* resolved; its text flags point into the dt_options' strings */
    char *model_path;            /* owned copy */
    dt_net *net;
    dt_updater *updater;
    dt_opt_config opt;
    dt_lazy_config tables;
    int64_t local_step, global_step;
    float *xbuf;                 /* [max batch * example]: uint8 batches scaled */
    size_t example;              /* floats per example */
};

void dt_model_free(dt_model *m) {
    if (!m) return;
    if (m->updater) m->updater->free(m->updater);
    dt_net_free(m->net);
    free(m->xbuf);
    free(m->model_path);
    free(m);
}

int dt_model_new(dt_model **out, const dt_options *opts, dt_error *err) {
    *out = NULL;
    if (!opts) return dt_errorf(err, DT_EINVAL, "dt_model_new: no options");
    dt_model *m = dt_calloc(1, sizeof *m, "model", err);
    if (!m) return DT_ENOMEM;
    int rc = dt_options_resolve(opts, &m->o, err);
    const dt_train_options *o = &m->o;
    if (!rc && (!o->model_path || !*o->model_path)) rc = dt_errorf(err, DT_EINVAL, "--model: no model file given");
    if (!rc && !(m->model_path = strdup(o->model_path))) rc = dt_errorf(err, DT_ENOMEM, "out of memory");
    if (!rc) rc = dt_net_load_opts(&m->net, o->model_path, o->batch_size, DT_NET_TABLES_AUTO, err);
    if (!rc && dt_net_is_ctr(m->net))
        rc = dt_errorf(err, DT_EINVAL, "%s is a click-log model: the step API trains image models only (train it "
                       "with dt_options_train and a click log as --data)", o->model_path);
    if (!rc) {
        dt_net_set_threads(m->net, o->threads);
        rc = dt_net_set_precision(m->net, o->precision, err);
        if (!rc && o->device && *o->device && strcmp(o->device, "cpu")) rc = dt_net_set_device(m->net, o->device, err);
    }
    /* The schedule spans --train_steps (a cosine decay without --lr_decay_steps needs them). */
    if (!rc) rc = dt_train_opt_config(o, o->train_steps, &m->opt, err);
    if (!rc) rc = dt_table_optim_config(o, &m->tables, err);
    if (!rc) rc = dt_local_updater_create(&m->updater, &m->opt, &m->tables, m->net, err);
    if (!rc) rc = m->updater->start(m->updater, m->net, o->seed, &m->global_step, err);
    if (!rc) {
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
    /* dtrain train's seed of this step: one process is worker 0 of 1 (train.c, run_steps). */
    uint64_t seed = dt_hash64(m->o.seed, (uint64_t)m->local_step);
    if (!dt_net_forward(m->net, xf, n, 1, seed, err)) return DT_EINVAL;
    int ok = 0;
    float l = dt_net_loss(m->net, labels, &ok);
    if ((rc = dt_net_status(m->net, err))) return rc;
    if (!isfinite(l))
        return dt_errorf(err, DT_EINVAL, "loss became %g at global step %lld: lower the learning_rate (or check x "
                         "for NaN)", (double)l, (long long)m->global_step + 1);
    if ((rc = dt_net_backward(m->net, err)) || (rc = dt_net_status(m->net, err))) return rc;
    if (m->o.clip_gradient_norm > 0) dt_net_clip_gradients(m->net, (float)m->o.clip_gradient_norm);
    if ((rc = m->updater->apply(m->updater, m->net, m->local_step, &m->global_step, err))) return rc;
    m->local_step++;
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

/* What a checkpoint of this model is (checkpoint.h): one process, no data of its own. */
static dt_ckpt_run ckpt_run(const dt_model *m) {
    return (dt_ckpt_run){.net = m->net, .opt = &m->opt, .tables = &m->tables, .seed = m->o.seed,
                         .batch_size = m->o.batch_size, .n_workers = 1, .validation_fraction = -1};
}

int dt_model_save(dt_model *m, const char *logdir, int max_to_keep, dt_error *err) {
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
    dt_st_close(f);
    if (!rc) {
        if (slots) dt_ckpt_clear_untrained_slots(&run, state);
        memcpy(dt_net_params(m->net), params, n * sizeof(float));
        rc = m->updater->restore(m->updater, m->net, state, step, &m->global_step, err);
    }
    /* One process resumes its data where the run left it: a step per batch. */
    if (!rc) m->local_step = m->global_step;
    free(params);
    free(state);
    return rc ? rc : 1;
}
