/* Model files: a small line-oriented text format for networks (docs/model-format.md): a stack of
 * layers, or a graph when layers are named and take their inputs from earlier ones (residual sums,
 * concatenations).
 * Parsing is separate from building (model/net.h) so the parser can be fuzzed on its own. */
#ifndef DT_MODEL_SPEC_H
#define DT_MODEL_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "compute/kernels.h"
#include "dtrain.h"

typedef enum {
    DT_LAYER_CONV2D,
    DT_LAYER_MAXPOOL,
    DT_LAYER_RELU,
    DT_LAYER_DROPOUT,
    DT_LAYER_FLATTEN,
    DT_LAYER_DENSE,
    DT_LAYER_BATCHNORM,
    DT_LAYER_AVGPOOL,
    DT_LAYER_GLOBAL_AVGPOOL,
    DT_LAYER_LEAKY_RELU,
    DT_LAYER_SIGMOID,
    DT_LAYER_TANH,
    DT_LAYER_ADD,
    DT_LAYER_CONCAT,
    DT_LAYER_EMBEDDING,         /* click logs: a categorical field's ids -> rows of a table */
    DT_LAYER_FM,                /* second-order factorisation machine over an embedding's vectors */
    DT_LAYER_REDUCE_SUM,        /* the sum of a flat input's features: [n] -> [1] */
} dt_layer_kind;

/* Categorical fields a click-log input may have (data/ctr.h's DT_CTR_MAX_FIELDS). */
#define DT_MODEL_MAX_FIELDS 1024
/* Rows of one embedding table (buckets=). */
#define DT_MODEL_MAX_BUCKETS (((int64_t)1 << 31) - 1)
/* Unbounded ids (capacity= instead of buckets=): rows of a table each ps task holds at most (the ps
 * table's bound, ps/table.h), admission counts and steps before eviction (the wire's bounds). */
#define DT_MODEL_MAX_CAPACITY ((int64_t)1 << 31)
#define DT_MODEL_MAX_MIN_COUNT 255
#define DT_MODEL_MAX_EVICT_AFTER ((int64_t)1 << 50)
/* Ids one example may name in one field of an embedding (max_ids=): the block of rows a cluster's
 * worker holds for a batch (dt_net_build_compact) has max_batch x max_ids rows per field. */
#define DT_MODEL_MAX_IDS 4096

/* Inputs one add or concat layer may take. */
#define DT_LAYER_MAX_INPUTS 16

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
    char name[32];              /* name= or e.g. "conv1", "dense2": parameter names are "<name>/kernel|bias" */
    /* Inputs: indices of earlier layers, -1 for the model's input. n_inputs 0 (a spec built in
     * code) means the layer above; use dt_layer_input. The parser always fills them. */
    int n_inputs;
    int inputs[DT_LAYER_MAX_INPUTS];
    int filters;                /* conv2d */
    int units;                  /* dense */
    int k_h, k_w;               /* conv2d kernel, maxpool size */
    int stride_h, stride_w;     /* conv2d, maxpool */
    dt_padding padding;         /* conv2d, maxpool */
    float rate;                 /* dropout */
    float alpha;                /* leaky_relu: slope below 0 */
    float momentum, epsilon;    /* batchnorm: moving = momentum * moving + (1 - momentum) * batch */
    int use_bias;               /* conv2d, dense */
    dt_init weight_init, bias_init;
    /* embedding: each of its fields' ids is hashed into `buckets` rows (dt_ctr_bucket) of a table of
     * `dim` columns, one table per field or one shared; a field holding several ids gives their sum
     * or their mean (weighted by the ids' values). Its output is [n_fields * dim], field after field
     * in field order. Its input is always the model input (-1): it reads the batch's ids. */
    int dim;
    int64_t buckets;            /* 0: unbounded ids (capacity=): a row per raw id, keyed by dt_ctr_key */
    /* Unbounded ids (docs/sparse.md, "Unbounded ids"): the rows of each table a ps task holds at most,
     * the updates an id needs before it gets a row (0, 1: at once) and the table steps a row may go
     * untouched before it is evicted (0: never). */
    int64_t capacity;
    int min_count;
    int64_t evict_after;
    /* The most distinct ids one example may name in one field (libffm's several ids a field): with
     * compact tables (a cluster's workers) each table's block has max_batch x max_ids rows per field
     * (1 by default: one id per field, as Criteo's). */
    int max_ids;
    int shared, mean;
    int n_fields;
    uint64_t fields[DT_MODEL_MAX_FIELDS / 64]; /* bit f: field f (0-based, as dt_ctr_hash) is embedded */
} dt_layer_spec;

static inline int dt_layer_has_field(const dt_layer_spec *L, int f) {
    return f >= 0 && f < DT_MODEL_MAX_FIELDS && (L->fields[f >> 6] >> (f & 63) & 1);
}

typedef struct {
    char name[64];              /* from the `model NAME` line, or the file name */
    int in_h, in_w, in_c;       /* the `input` line */
    int n_layers;
    dt_layer_spec *layers;      /* owned */
    char *text;                 /* the model file's text, owned (stored in checkpoints) */
    size_t text_len;            /* bytes in text (text is also NUL-terminated) */
    char source[256];           /* file name used in messages ("<source>:<line>: ...") */
    int input_line;             /* line of the `input` line */
    /* A click-log model (`input dense=N fields=M`): its input is a batch of tabular examples
     * (data/ctr.h): num_dense dense features (the model input, flat: in_h = in_w = 1, in_c =
     * num_dense) and num_fields categorical fields, which embedding layers read. It ends in one
     * logit (a binary model: sigmoid and logloss). */
    int ctr, num_dense, num_fields;
} dt_model_spec;

/* Limits, so a hostile file cannot request absurd memory or compute (docs/model-format.md). */
#define DT_MODEL_MAX_DIM 65536                 /* any size, count, kernel, stride */
#define DT_MODEL_MAX_LAYERS 1024
#define DT_MODEL_MAX_PARAMS ((size_t)1 << 31)  /* total parameters */
#define DT_MODEL_MAX_ACT ((size_t)1 << 28)     /* floats per example of any layer's output */
#define DT_MODEL_MAX_PATCH ((size_t)1 << 28)   /* conv2d patch matrix per example: oh*ow*kh*kw*c */
#define DT_MODEL_MAX_TEXT ((size_t)1 << 20)    /* bytes in a model file */

/* Shapes of one layer for one example, worked out from the `input` line. A flat tensor is
 * [1, 1, n]. Conv2d and maxpool also carry their window geometry (compute/kernels.h). */
typedef struct {
    int in_h, in_w, in_c;
    int out_h, out_w, out_c;
    int flat;                   /* the output is a flat vector (after flatten or dense) */
    size_t n_weights, n_bias;   /* parameters of this layer (conv2d, dense) */
    size_t n_bn;                /* batchnorm: channels; 4 parameters each (gamma, beta, moving mean, var) */
    dt_window win;              /* conv2d, maxpool */
} dt_layer_shape;

/* Parses text (len bytes, need not be NUL-terminated). source names the file in messages, which
 * read "<source>:<line>: <what is wrong>". On success *spec owns its memory: dt_model_spec_free. */
int dt_model_spec_parse(dt_model_spec *spec, const char *text, size_t len, const char *source,
                        dt_error *err);
int dt_model_spec_load(dt_model_spec *spec, const char *path, dt_error *err);
void dt_model_spec_free(dt_model_spec *spec);

/* Deep copy; dst is overwritten (not freed first). */
int dt_model_spec_copy(dt_model_spec *dst, const dt_model_spec *src, dt_error *err);

/* Checks every layer's values and that the shapes fit, layer by layer, within the limits above;
 * fills shapes[n_layers] (may be NULL) and *param_count (may be NULL). Messages name
 * "<source>:<line>". dt_model_spec_parse already calls it; dt_net_build calls it again because a
 * spec may also be built in code. */
int dt_model_spec_shapes(const dt_model_spec *spec, dt_layer_shape *shapes, size_t *param_count,
                         dt_error *err);

/* Input k (0 <= k < dt_layer_n_inputs) of layer i: a layer index below i, or -1 (the model input). */
static inline int dt_layer_n_inputs(const dt_layer_spec *L) { return L->n_inputs > 0 ? L->n_inputs : 1; }
static inline int dt_layer_input(const dt_layer_spec *L, int i, int k) {
    return L->n_inputs > 0 ? L->inputs[k] : i - 1;
}

/* "conv2d", "maxpool", ... as written in model files. */
const char *dt_layer_kind_name(dt_layer_kind kind);

#endif
