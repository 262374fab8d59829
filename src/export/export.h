/* dtrain export: a trained model as an ONNX file that onnxruntime, OpenCV's dnn module and other
 * inference engines run (docs/export.md). The graph is the net in evaluation form (dropout gone,
 * batch norm with its moving statistics, folded where evaluation folds it), fed NHWC float32 pixels
 * scaled by 1/255 with a symbolic batch dimension, with two outputs: the logits and their softmax.
 * A click-log model's graph is fed its dense features and each embedding's rows (ids hashed by the
 * caller: dt_ctr_bucket) and values; its outputs are the logit and its sigmoid. */
#ifndef DT_EXPORT_EXPORT_H
#define DT_EXPORT_EXPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "io/fsutil.h"
#include "model/net.h"

/* The graph's input and outputs, and its batch dimension's name. */
#define DT_ONNX_INPUT "input"
#define DT_ONNX_LOGITS "logits"
#define DT_ONNX_PROBS "probabilities"
#define DT_ONNX_BATCH "batch"
/* A click-log model's inputs besides its dense features (DT_ONNX_INPUT, [batch, dense]): for each
 * embedding layer, "<layer>:rows" (int64 [batch, fields, ids]: each id's row after hashing) and
 * "<layer>:values" (float32, the same shape: each id's value, 0 for padding); "ids" is symbolic. */
#define DT_ONNX_ROWS ":rows"
#define DT_ONNX_VALUES ":values"
#define DT_ONNX_IDS "ids"

/* Opsets written: 13 is the oldest with every operator in the form used here (Softmax over one axis),
 * and what most runtimes read; up to 21, where the IR version is 10. */
#define DT_ONNX_OPSET_MIN 13
#define DT_ONNX_OPSET_MAX 21
#define DT_ONNX_OPSET_DEFAULT 13

/* What the file records besides the graph (its metadata_props; docs/export.md). */
typedef struct {
    int64_t global_step;           /* < 0: not recorded */
    char *const *class_names;      /* [n_class_names], NULL: not recorded */
    int n_class_names;
    const char *checkpoint;        /* the checkpoint exported (its file name is recorded), or NULL */
    /* Not metadata but how the file is written: a model file that would be over this many bytes keeps
     * its initializers in ONNX's external data, "<path>.data" beside it; 0: when over protobuf's 2 GiB. */
    size_t external_above;
} dt_onnx_meta;

typedef struct {
    size_t bytes;                  /* the file's size */
    size_t param_bytes;            /* the net's parameters, float32 */
    size_t init_bytes;             /* the initializers' data in the file (folding changes it a little) */
    size_t nodes, initializers;
    size_t external_bytes;         /* the external data file's size ("<path>.data"); 0: none */
} dt_onnx_stats;

/* Writes net as an ONNX model to path, atomically: the whole file or nothing. opset from
 * DT_ONNX_OPSET_MIN to DT_ONNX_OPSET_MAX. stats may be NULL. */
int dt_onnx_export_net(dt_net *net, int opset, const dt_onnx_meta *meta, const char *path, dt_onnx_stats *stats,
                       dt_error *err);

typedef struct {
    char checkpoint[DT_PATH_MAX];  /* the checkpoint exported */
    int64_t step;                  /* its global step */
    dt_onnx_stats stats;
} dt_export_result;

/* dtrain export --format onnx: source is a checkpoint file, or a log folder whose newest good
 * checkpoint is taken (damaged ones skipped with a warning on log, as eval and predict do); the net
 * is built from model_path, or when NULL from the model text the checkpoint stores. res may be NULL. */
int dt_export_onnx(const char *source, const char *model_path, const char *path, int opset, size_t external_above,
                   dt_export_result *res, FILE *log, dt_error *err);

#endif
