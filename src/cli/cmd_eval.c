/* dtrain eval: restore the newest good checkpoint of --logdir (no cluster needed) and print the
 * test loss, accuracy and confusion matrix, as the source's restore-and-test script did. The model
 * comes from the checkpoint's metadata unless --model is given. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "core/error.h"
#include "data/dataset.h"
#include "core/flags.h"
#include "model/net.h"
#include "train/evaluate.h"
#include "train/evaluate_ctr.h"
#include "train/restore.h"

/* Rows: true class; columns: predicted class. */
static void print_confusion(const int64_t *cm, int classes, const dt_dataset *ds) {
    int64_t max = 0;
    for (int i = 0; i < classes * classes; i++)
        if (cm[i] > max) max = cm[i];
    int w = snprintf(NULL, 0, "%" PRId64, max), lw = 4;
    for (int k = 0; k < classes; k++) {
        int l = (int)strlen(dt_dataset_class_name(ds, k));
        if (l > lw) lw = l;
        if (l > w) w = l < 12 ? l : 12;
    }
    printf("confusion matrix (rows: true class, columns: predicted)\n%*s", lw, "");
    for (int k = 0; k < classes; k++) printf(" %*.*s", w, w, dt_dataset_class_name(ds, k));
    printf("\n");
    for (int t = 0; t < classes; t++) {
        printf("%*s", lw, dt_dataset_class_name(ds, t));
        for (int p = 0; p < classes; p++) printf(" %*" PRId64, w, cm[(size_t)t * classes + p]);
        printf("\n");
    }
}

/* A click-log model: the test split of the click log, AUC and logloss. */
static int eval_ctr(dt_restored *r, const char *data, dt_error *err) {
    dt_ctr_options co;
    dt_ctr_eval_options(&co, r->net, DT_CTR_TEST, 0);
    if (r->info.validation_fraction >= 0 && r->info.validation_fraction < 1)
        co.validation_fraction = r->info.validation_fraction;
    dt_ctr_eval_result t;
    int rc = dt_evaluate_ctr(r->net, data, &co, &t, err);
    if (rc) return rc;
    printf("checkpoint %s: model %s, global step %" PRId64 "\n", r->path, dt_net_spec(r->net)->name, r->step);
    printf("test auc %.4f  test logloss %.4f  test accuracy %.4f  (%lld examples, click rate %.4f, mean prediction "
           "%.4f)\n", t.auc, t.logloss, t.accuracy, (long long)t.examples,
           t.examples ? (double)t.positives / (double)t.examples : 0.0, t.mean_p);
    if (t.auc_error_bound > 0) printf("auc within %.2g of the exact value (a histogram past 2^24 examples)\n",
                                      t.auc_error_bound);
    if (t.bad_lines) printf("skipped %llu bad lines\n", (unsigned long long)t.bad_lines);
    return DT_OK;
}

static int fail(const char *msg) {
    fprintf(stderr, "dtrain eval: %s\n", msg);
    return 1;
}

int cmd_eval(int argc, char **argv) {
    const char *logdir = "./checkpoint", *data = NULL, *model = NULL, *file = NULL, *device = NULL;
    int batch_size = 0, threads = 0;
    flag_def defs[] = {
        FLAGS_RESTORE(&logdir, &file, &model, &batch_size, &threads, &device),
        FLAG_TEXT("data", &data, "IDX folder or image folder, or a click log for a click-log model; its test split is "
                                 "evaluated"),
    };
    int n = (int)(sizeof defs / sizeof defs[0]), help = 0;
    dt_error err = {0};
    if (flags_parse(defs, n, argc, argv, &help, &err)) {
        fprintf(stderr, "dtrain eval: %s\n", err.msg);
        return 2;
    }
    if (help) {
        printf("usage: dtrain eval --logdir DIR --data PATH [--model FILE] [flags]\n\n"
               "Restores the newest good checkpoint of DIR (a damaged one is skipped with a warning)\n"
               "and prints its global step, the test loss and accuracy and a confusion matrix; for a\n"
               "click-log model (docs/ctr-data.md), the test AUC, logloss and accuracy.\n\n"
               "flags:\n");
        flags_print_help(stdout, defs, n);
        return 0;
    }
    if (!data || !*data) return fail("--data: no data path given");
    dt_restored r;
    if (dt_restore_net(&r, logdir, file, model, batch_size, stderr, &err)) return fail(err.msg);
    dt_net_set_threads(r.net, threads);
    if (dt_net_set_device(r.net, device, &err)) {
        dt_restored_free(&r);
        return fail(err.msg);
    }
    dt_net *net = r.net;
    if (dt_net_is_ctr(net)) {
        int rc = eval_ctr(&r, data, &err);
        if (rc) fprintf(stderr, "dtrain eval: %s\n", err.msg);
        dt_restored_free(&r);
        return rc ? 1 : 0;
    }
    dt_data_splits splits = {0};
    int64_t *cm = NULL;
    int status = 1, rc;
    const dt_model_spec *ms = dt_net_spec(net);
    dt_data_options dopt = {.h = ms->in_h, .w = ms->in_w, .c = ms->in_c,
                            .validation_fraction = r.info.validation_fraction,
                            .seed = r.info.has_seed ? r.info.seed : 1,
                            .bad_images = DT_BAD_IMAGES_SKIP};
    if ((rc = dt_data_open(&splits, data, &dopt, &err))) goto out;
    int classes = dt_net_num_classes(net);
    if (dt_dataset_num_classes(splits.test) > classes) {
        rc = dt_errorf(&err, DT_ESHAPE, "%s has %d classes but the model ends in %d units", data,
                       dt_dataset_num_classes(splits.test), classes);
        goto out;
    }
    if (!(cm = dt_calloc((size_t)classes * classes, sizeof *cm, "confusion matrix", &err))) goto out;
    dt_eval_result res;
    if ((rc = dt_evaluate(net, splits.test, cm, &res, &err))) goto out;
    printf("checkpoint %s: model %s, global step %" PRId64 "\n", r.path, ms->name, r.step);
    printf("test accuracy %.4f  test loss %.4f  (%lld examples)\n", res.accuracy, res.loss, (long long)res.examples);
    print_confusion(cm, classes, splits.test);
    if (dt_dataset_bad_count(splits.test))
        printf("skipped %zu undecodable images\n", dt_dataset_bad_count(splits.test));
    status = 0;
out:
    if (status) fprintf(stderr, "dtrain eval: %s\n", err.msg);
    free(cm);
    dt_data_splits_free(&splits);
    dt_restored_free(&r);
    return status;
}
