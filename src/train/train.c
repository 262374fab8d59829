/* Single-machine training loop: the C counterpart of the source's single-machine script. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "compute/kernels.h"
#include "compute/optim.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/loader.h"
#include "model/net.h"
#include "train/evaluate.h"
#include "train/progress.h"

void dt_train_options_init(dt_train_options *o) {
    memset(o, 0, sizeof *o);
    o->optimizer = "adam";
    o->learning_rate = 0.001f;
    o->batch_size = 64;
    o->epochs = 1.0;
    o->steps_to_validate = 1000;
    o->seed = 1;
    o->validation_fraction = -1.0;
}

static double now_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int check_options(const dt_train_options *o, dt_error *err) {
    if (!o->model_path || !*o->model_path) return dt_errorf(err, DT_EINVAL, "--model: no model file given");
    if (!o->data_path || !*o->data_path) return dt_errorf(err, DT_EINVAL, "--data: no data path given");
    if (o->batch_size < 1 || o->batch_size > 65536)
        return dt_errorf(err, DT_EINVAL, "--batch_size must be in 1..65536, got %d", o->batch_size);
    if (o->train_steps <= 0 && !(o->epochs > 0 && isfinite(o->epochs)))
        return dt_errorf(err, DT_EINVAL, "--epochs must be positive when --train_steps is not given");
    if (o->steps_to_validate < 1)
        return dt_errorf(err, DT_EINVAL, "--steps_to_validate must be at least 1, got %lld",
                         (long long)o->steps_to_validate);
    if (o->validation_fraction >= 1.0)
        return dt_errorf(err, DT_EINVAL, "--validation_fraction must be below 1, got %g",
                         o->validation_fraction);
    return DT_OK;
}

/* Everything a run owns, so one cleanup path frees it whatever failed. */
typedef struct {
    dt_net *net;
    dt_data_splits data;
    dt_loader *loader;
    float *opt_state;
} run_state;

static void run_free(run_state *r) {
    dt_loader_free(r->loader);
    dt_data_splits_free(&r->data);
    dt_net_free(r->net);
    free(r->opt_state);
}

int dt_train(const dt_train_options *o, FILE *log, dt_train_result *res, dt_error *err) {
    dt_train_result local_res;
    if (!res) res = &local_res;
    memset(res, 0, sizeof *res);
    if (!log) log = stdout;
    int rc = check_options(o, err);
    if (rc) return rc;

    dt_opt_config opt;
    if ((rc = dt_opt_config_init(&opt, o->optimizer, o->learning_rate, err))) return rc;
    dt_kernels_set_threads(o->threads);

    run_state r = {0};
    if ((rc = dt_net_load(&r.net, o->model_path, o->batch_size, err))) goto out;
    const dt_model_spec *spec = dt_net_spec(r.net);
    dt_data_options dopt = {.h = spec->in_h, .w = spec->in_w, .c = spec->in_c,
                            .validation_fraction = o->validation_fraction, .seed = o->seed,
                            .bad_images = o->fail_on_bad_images ? DT_BAD_IMAGES_FAIL : DT_BAD_IMAGES_SKIP};
    if ((rc = dt_data_open(&r.data, o->data_path, &dopt, err))) goto out;
    int classes = dt_net_num_classes(r.net), data_classes = dt_dataset_num_classes(r.data.train);
    if (data_classes > classes) {
        rc = dt_errorf(err, DT_ESHAPE, "%s has %d classes but model %s ends in a dense layer of %d units",
                       o->data_path, data_classes, o->model_path, classes);
        goto out;
    }

    size_t n_params = dt_net_param_count(r.net);
    size_t n_state = n_params * (size_t)dt_opt_slots(&opt);
    if (!(r.opt_state = dt_alloc_floats(n_state ? n_state : 1, "optimizer state", err))) {
        rc = DT_ENOMEM;
        goto out;
    }
    dt_net_init_params(r.net, o->seed);

    dt_loader_options lo = {.batch_size = o->batch_size, .shuffle = 1, .seed = o->seed,
                            .shard_index = 0, .shard_count = 1};
    if ((rc = dt_loader_create(&r.loader, r.data.train, &lo, err))) goto out;
    int64_t per_epoch = dt_loader_batches_per_epoch(r.loader);
    if (per_epoch < 1) {
        rc = dt_errorf(err, DT_EINVAL, "%s: %zu training examples, fewer than one batch of %d",
                       o->data_path, dt_dataset_size(r.data.train), o->batch_size);
        goto out;
    }
    int64_t total = o->train_steps > 0 ? o->train_steps : (int64_t)ceil(o->epochs * (double)per_epoch);

    fprintf(log, "dtrain %s: model %s (%zu parameters), %zu training / %zu validation / %zu test examples, "
                 "%s lr %g, batch %d, %lld steps (%.2f epochs), %d threads\n",
            dt_version(), spec->name, n_params, dt_dataset_size(r.data.train),
            dt_dataset_size(r.data.validation), dt_dataset_size(r.data.test), dt_opt_name(opt.kind),
            (double)opt.learning_rate, o->batch_size, (long long)total, (double)total / (double)per_epoch,
            dt_kernels_get_threads());
    fflush(log);

    dt_progress prog;
    dt_progress_init(&prog, o->progress, total);
    double t_start = now_sec(), t_interval = t_start;
    double loss_sum = 0;
    int64_t correct_sum = 0, seen = 0, interval_examples = 0;
    for (int64_t step = 0; step < total; step++) {
        if (o->stop && *o->stop) {
            rc = dt_errorf(err, DT_EINTR, "training stopped by a signal at step %lld", (long long)step);
            break;
        }
        dt_batch b;
        if ((rc = dt_loader_next(r.loader, &b, err))) break;
        dt_net_forward(r.net, b.x, b.n, 1, dt_hash64(o->seed, (uint64_t)step));
        int correct = 0;
        float loss = dt_net_loss(r.net, b.labels, &correct);
        if (!isfinite(loss)) {
            rc = dt_errorf(err, DT_EINVAL, "loss became %g at step %lld: lower --learning_rate",
                           (double)loss, (long long)step + 1);
            break;
        }
        dt_net_backward(r.net);
        dt_opt_apply(&opt, dt_net_params(r.net), dt_net_grads(r.net), r.opt_state, n_params, step);
        loss_sum += loss * b.n;
        correct_sum += correct;
        seen += b.n;
        interval_examples += b.n;
        res->steps = step + 1;
        dt_progress_update(&prog, step + 1, (double)(step + 1) / (double)per_epoch);

        int epoch_end = (step + 1) % per_epoch == 0;
        if ((step + 1) % o->steps_to_validate == 0 || epoch_end || step + 1 == total) {
            double t = now_sec();
            double ex_per_sec = interval_examples / (t - t_interval);
            dt_eval_result val;
            if ((rc = dt_evaluate(r.net, r.data.validation, NULL, &val, err))) break;
            dt_progress_clear(&prog);
            fprintf(log, "step %lld  epoch %.2f  loss %.4f  train_acc %.4f  val_loss %.4f  val_acc %.4f  "
                         "%.0f examples/sec\n",
                    (long long)(step + 1), (double)(step + 1) / (double)per_epoch, loss_sum / seen,
                    (double)correct_sum / seen, val.loss, val.accuracy, ex_per_sec);
            fflush(log);
            res->final_loss = loss_sum / seen;
            res->validation_accuracy = val.accuracy;
            loss_sum = 0;
            correct_sum = seen = interval_examples = 0;
            t_interval = now_sec(); /* validation time is not training time */
        }
    }
    dt_progress_clear(&prog);
    res->seconds = now_sec() - t_start;
    res->examples_per_sec = (double)res->steps * o->batch_size / res->seconds;
    if (rc) goto out;

    dt_eval_result test;
    if ((rc = dt_evaluate(r.net, r.data.test, NULL, &test, err))) goto out;
    res->test_accuracy = test.accuracy;
    res->test_loss = test.loss;
    res->test_examples = test.examples;
    res->bad_images = (int64_t)dt_dataset_bad_count(r.data.train);
    if (r.data.validation != r.data.train) res->bad_images += (int64_t)dt_dataset_bad_count(r.data.validation);
    if (r.data.test != r.data.validation) res->bad_images += (int64_t)dt_dataset_bad_count(r.data.test);
    if (res->bad_images)
        fprintf(log, "skipped %lld undecodable images (use --bad_images=fail to stop on them)\n",
                (long long)res->bad_images);
    fprintf(log, "test accuracy %.4f  test loss %.4f  (%lld examples)\n", test.accuracy, test.loss,
            (long long)test.examples);
    fprintf(log, "trained %lld steps in %.1f s (%.0f examples/sec)\n", (long long)res->steps,
            res->seconds, res->examples_per_sec);
out:
    run_free(&r);
    return rc;
}
