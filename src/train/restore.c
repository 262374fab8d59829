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

int dt_restore_net(dt_restored *out, const char *logdir, const char *file, const char *model_path, int batch_size,
                   FILE *log, dt_error *err) {
    memset(out, 0, sizeof *out);
    dt_st_file *f = NULL;
    int rc;
    if (file) {
        snprintf(out->path, sizeof out->path, "%s", file);
        rc = dt_st_open(&f, out->path, err);
    } else {
        rc = dt_ckpt_open_latest(&f, out->path, sizeof out->path, logdir, log, err);
        if (rc == 0)
            rc = dt_errorf(err, DT_EINVAL, "%s: no checkpoint found (train with --logdir %s first)", logdir, logdir);
    }
    if (rc < 0) return rc;
    dt_model_spec spec;
    if ((rc = dt_ckpt_read_info(f, out->path, &out->info, err))) goto out;
    if (model_path) {
        rc = dt_model_spec_load(&spec, model_path, err);
    } else {
        const char *text = dt_ckpt_model_text(f);
        if (!text) {
            rc = dt_errorf(err, DT_EINVAL, "%s holds no model text: pass --model", out->path);
            goto out;
        }
        char label[DT_PATH_MAX + 16];
        snprintf(label, sizeof label, "%s (model)", out->path);
        rc = dt_model_spec_parse(&spec, text, strlen(text), label, err);
    }
    if (rc) goto out;
    int batch = batch_size > 0 ? batch_size : out->info.batch_size > 0 ? out->info.batch_size : 64;
    rc = dt_net_build(&out->net, &spec, batch, err);
    dt_model_spec_free(&spec);
    if (rc) goto out;
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
