/* A trained net for inference (dtrain eval, dtrain predict): the newest good checkpoint of a log
 * folder, or a named checkpoint file, restored into a net built from the model the checkpoint
 * stores (or a model file), with the metadata that goes with it. */
#ifndef DT_TRAIN_RESTORE_H
#define DT_TRAIN_RESTORE_H

#include <stdint.h>
#include <stdio.h>

#include "compute/lazy_optim.h"
#include "model/net.h"
#include "supervisor/checkpoint.h"
#include "io/fsutil.h"
#include "train/local_tables.h"

typedef struct {
    dt_net *net;
    char path[DT_PATH_MAX];   /* the checkpoint restored */
    dt_ckpt_info info;        /* its metadata */
    int64_t step;             /* its global step */
    char **class_names;       /* [n_class_names] as the checkpoint records them; NULL, 0: none */
    int n_class_names;
    /* A model with tables of unbounded ids: the net is compact (model/net.h) and its tables, restored
     * from the checkpoint, are held here (an id without a row reads as its initial values); NULL else. */
    dt_local_tables *tables;
    dt_lazy_config table_opt;  /* the checkpoint's table optimizer (its rows' slots) */
} dt_restored;

/* file: a checkpoint file, or NULL for the newest good one of logdir (damaged ones skipped with a
 * warning on log; none at all is an error saying so). model_path: a model file, or NULL for the
 * model text the checkpoint holds. batch_size: the net's batch, 0 for the training batch size the
 * checkpoint records (64 without one): the same batches give the same sums, so figures match the
 * training run's. On failure everything is freed and err names the file at fault. */
int dt_restore_net(dt_restored *out, const char *logdir, const char *file, const char *model_path, int batch_size,
                   FILE *log, dt_error *err);
void dt_restored_free(dt_restored *r);

#endif
