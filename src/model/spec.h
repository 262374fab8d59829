/* Model files: a small line-oriented text format for sequential models (docs/model-format.md).
 * Parsing is separate from building (model/net.h) so the parser can be fuzzed on its own. */
#ifndef DT_MODEL_SPEC_H
#define DT_MODEL_SPEC_H

#include <stddef.h>

#include "compute/kernels.h"
#include "dtrain.h"

typedef enum {
    DT_LAYER_CONV2D,
    DT_LAYER_MAXPOOL,
    DT_LAYER_RELU,
    DT_LAYER_DROPOUT,
    DT_LAYER_FLATTEN,
    DT_LAYER_DENSE,
} dt_layer_kind;

typedef enum {
    DT_INIT_CONSTANT,       /* value */
    DT_INIT_TRUNC_NORMAL,   /* value = stddev */
    DT_INIT_GLOROT_UNIFORM, /* limit sqrt(6 / (fan_in + fan_out)) */
    DT_INIT_HE_UNIFORM,     /* limit sqrt(6 / fan_in) */
} dt_init_kind;

typedef struct {
    dt_init_kind kind;
    float value;
} dt_init;

typedef struct {
    dt_layer_kind kind;
    int line;                   /* line in the model file, for messages */
    char name[32];              /* e.g. "conv1", "dense2": parameter names are "<name>/kernel|bias" */
    int filters;                /* conv2d */
    int units;                  /* dense */
    int k_h, k_w;               /* conv2d kernel, maxpool size */
    int stride_h, stride_w;     /* conv2d, maxpool */
    dt_padding padding;         /* conv2d, maxpool */
    float rate;                 /* dropout */
    int use_bias;               /* conv2d, dense */
    dt_init weight_init, bias_init;
} dt_layer_spec;

typedef struct {
    char name[64];              /* from the `model NAME` line, or the file name */
    int in_h, in_w, in_c;       /* the `input` line */
    int n_layers;
    dt_layer_spec *layers;      /* owned */
    char *text;                 /* the model file's text, owned (stored in checkpoints) */
} dt_model_spec;

/* Parses text (len bytes, need not be NUL-terminated). source names the file in messages, which
 * read "<source>:<line>: <what is wrong>". On success *spec owns its memory: dt_model_spec_free. */
int dt_model_spec_parse(dt_model_spec *spec, const char *text, size_t len, const char *source,
                        dt_error *err);
int dt_model_spec_load(dt_model_spec *spec, const char *path, dt_error *err);
void dt_model_spec_free(dt_model_spec *spec);

#endif
