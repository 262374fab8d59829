#include "train/restore.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/spec.h"
#include "train/table_ckpt.h"
#include "train/table_optim.h"

void dt_restored_free(dt_restored *r) {
    if (!r) return;
    dt_local_tables_free(r->tables); /* before the net: it unsets the net's fill callback */
    dt_net_free(r->net);
    for (int k = 0; k < r->n_class_names; k++) free(r->class_names[k]);
    free(r->class_names);
    memset(r, 0, sizeof *r);
}

/* dt_st_open_ex's check: the model (--model, or the text the checkpoint carries) is built as soon as
 * the header is read, and the tensor table checked against it before any data is read, so a file
 * claiming tensors larger than its model is refused at once. The net is kept for the load. */
typedef struct {
    dt_restored *out;
    const char *model_path;
    int batch_size;
} restore_ctx;

/* The table optimizer a checkpoint records (info), whose slots its tables' rows carry. */
static int table_optimizer(const dt_ckpt_info *info, const char *label, dt_lazy_config *out, dt_error *err) {
    dt_train_options o = {.table_optimizer = info->table_optimizer[0] ? info->table_optimizer : NULL,
                          .learning_rate = info->learning_rate > 0 ? info->learning_rate : 0.01,
                          .table_learning_rate = info->table_learning_rate,
                          .table_initial_accumulator = info->table_initial_accumulator > 0
                                                           ? info->table_initial_accumulator : 0.1,
                          .table_lr_power = -0.5};
    int rc = dt_table_optim_config(&o, out, err);
    return rc ? dt_error_wrap(err, rc, "%s: its table optimizer: ", label) : DT_OK;
}

static int build_and_check(const dt_st_file *f, const char *label, void *arg, dt_error *err) {
    restore_ctx *c = arg;
    dt_restored *out = c->out;
    dt_net_free(out->net);
    out->net = NULL;
    dt_model_spec spec;
    int rc = dt_ckpt_read_info(f, label, &out->info, err);
    if (rc) return rc;
    if (c->model_path) {
        rc = dt_model_spec_load(&spec, c->model_path, err);
    } else {
        const char *text = dt_ckpt_model_text(f);
        if (!text) return dt_errorf(err, DT_EINVAL, "%s holds no model text: give model_path", label);
        char mlabel[DT_PATH_MAX + 16];
        snprintf(mlabel, sizeof mlabel, "%s (model)", label);
        rc = dt_model_spec_parse(&spec, text, strlen(text), mlabel, err);
    }
    if (rc) return rc;
    int batch = c->batch_size > 0 ? c->batch_size : out->info.batch_size > 0 ? out->info.batch_size : 64;
    /* unbounded ids: a compact net, its tables held here (local_tables.h) */
    rc = dt_model_spec_unbounded(&spec) ? dt_net_build_compact(&out->net, &spec, batch, err)
                                        : dt_net_build(&out->net, &spec, batch, err);
    dt_model_spec_free(&spec);
    if (!rc && dt_net_compact_tables(out->net)) rc = table_optimizer(&out->info, label, &out->table_opt, err);
    if (rc) return rc;
    dt_ckpt_run run = {.net = out->net, .tables = dt_net_compact_tables(out->net) ? &out->table_opt : NULL};
    return dt_ckpt_check_fits(f, label, &run, err);
}

/* A compact net's tables: made as the training run made them (its seed, its table optimizer, whose
 * slots the rows carry), at the checkpoint's step, and its rows imported. */
static int restore_tables(dt_restored *out, const dt_st_file *f, dt_error *err) {
    int rc = dt_local_tables_create(&out->tables, out->net, &out->table_opt, out->info.seed, out->step, err);
    if (rc) return rc;
    /* the rows are read with their slots, which the run's optimizers name: the tables' from the
     * checkpoint, and a dense one whose slots are not read here (any does) */
    dt_opt_config dense;
    if ((rc = dt_opt_config_init(&dense, "sgd", 0.01f, err))) return rc;
    const dt_table_io io = dt_local_tables_io(out->tables);
    dt_ckpt_run run = {.net = out->net, .opt = &dense, .tables = &out->table_opt};
    dt_table_ckpt_stats st;
    return dt_table_ckpt_restore(&io, f, out->path, &run, &st, err);
}

int dt_restore_net(dt_restored *out, const char *logdir, const char *file, const char *model_path, int batch_size,
                   FILE *log, dt_error *err) {
    memset(out, 0, sizeof *out);
    dt_st_file *f = NULL;
    restore_ctx ctx = {out, model_path, batch_size};
    int rc;
    if (file) {
        snprintf(out->path, sizeof out->path, "%s", file);
        rc = dt_st_open_ex(&f, out->path, 0, build_and_check, &ctx, err);
    } else {
        rc = dt_ckpt_open_latest_for(&f, out->path, sizeof out->path, logdir, build_and_check, &ctx, log, err);
        if (rc == 0)
            rc = dt_errorf(err, DT_EINVAL, "%s: no checkpoint found (train with logdir %s first)", logdir, logdir);
    }
    if (rc < 0) goto out;
    dt_ckpt_run run = {.net = out->net};
    run.tables = dt_net_compact_tables(out->net) ? &out->table_opt : NULL;
    if ((rc = dt_ckpt_load(f, out->path, &run, dt_net_params(out->net), NULL, &out->step, err))) goto out;
    if (run.tables && (rc = restore_tables(out, f, err))) goto out;
    rc = dt_ckpt_read_classes(f, out->path, dt_net_num_classes(out->net), &out->class_names, &out->n_class_names, err);
out:
    dt_st_close(f);
    if (rc) {
        char keep[DT_PATH_MAX];
        memcpy(keep, out->path, sizeof keep);
        dt_restored_free(out);
        memcpy(out->path, keep, sizeof keep);
    }
    return rc;
}
