#include "train/restore.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/spec.h"

void dt_restored_free(dt_restored *r) {
    if (!r) return;
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
        if (!text) return dt_errorf(err, DT_EINVAL, "%s holds no model text: pass --model", label);
        char mlabel[DT_PATH_MAX + 16];
        snprintf(mlabel, sizeof mlabel, "%s (model)", label);
        rc = dt_model_spec_parse(&spec, text, strlen(text), mlabel, err);
    }
    if (rc) return rc;
    int batch = c->batch_size > 0 ? c->batch_size : out->info.batch_size > 0 ? out->info.batch_size : 64;
    rc = dt_net_build(&out->net, &spec, batch, err);
    dt_model_spec_free(&spec);
    if (rc) return rc;
    dt_ckpt_run run = {.net = out->net};
    return dt_ckpt_check_fits(f, label, &run, err);
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
            rc = dt_errorf(err, DT_EINVAL, "%s: no checkpoint found (train with --logdir %s first)", logdir, logdir);
    }
    if (rc < 0) goto out;
    dt_ckpt_run run = {.net = out->net};
    if ((rc = dt_ckpt_load(f, out->path, &run, dt_net_params(out->net), NULL, &out->step, err))) goto out;
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
