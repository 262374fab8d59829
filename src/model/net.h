/* A network built from a model spec: shapes worked out, all parameters in ONE flat float buffer with
 * named views (llm.c style), gradients in a second buffer of the same layout, activations sized for
 * up to max_batch examples. A ps later holds slices of the flat buffer; views map names to slices. */
#ifndef DT_MODEL_NET_H
#define DT_MODEL_NET_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "compute/backend.h"
#include "compute/rowsum.h"
#include "model/ctr_batch.h"
#include "model/spec.h"

typedef struct {
    char name[48];      /* "conv1/kernel", "dense1/bias", ... */
    size_t offset;      /* in floats, into the flat parameter buffer */
    size_t count;
    int ndim;
    int shape[4];       /* conv kernels HWIO, dense kernels [in, out], biases [out] */
    int not_trained;    /* 1 for batch norm's moving mean and variance: the forward pass updates them
                         * and their gradient is always 0 (an optimizer must not decay them) */
    int table;          /* 1 for an embedding table [buckets, dim]: a backward touches a few of its rows,
                         * which dt_net_table_grad lists (the flat gradient is 0 in every other row) */
} dt_param_view;

/* dt_net, dt_net_load, dt_net_free, dt_net_param_count, dt_net_forward, dt_net_loss and
 * dt_net_backward are public: include/dtrain.h. */

/* Builds the network; the spec is copied. Fails naming the model line if a shape does not fit. */
int dt_net_build(dt_net **out, const dt_model_spec *spec, int max_batch, dt_error *err);

const dt_model_spec *dt_net_spec(const dt_net *net);
int dt_net_max_batch(const dt_net *net);
/* The examples of the last forward (what its gradient averages); 0 before the first. */
int dt_net_batch(const dt_net *net);
int dt_net_num_classes(const dt_net *net);
size_t dt_net_input_size(const dt_net *net);   /* floats per example: in_h * in_w * in_c */

float *dt_net_params(dt_net *net);             /* [param_count] */
float *dt_net_grads(dt_net *net);              /* [param_count], written by dt_net_backward */
int dt_net_num_views(const dt_net *net);
const dt_param_view *dt_net_view(const dt_net *net, int i);

/* Backward runs the layers from the last to the first; layer i writes the gradients of its own
 * parameters, which lie in the flat buffer after those of layers < i. So once dt_net_backward has
 * run layer i, gradients [dt_net_layer_param_begin(net, i), param_count) are final. A layer
 * without parameters has begin == the next layer's begin (nothing new becomes final). */
int dt_net_num_layers(const dt_net *net);
/* Activation-gradient buffers the backward plan uses, the logits' included (memory-layout.md). */
int dt_net_num_grad_buffers(const dt_net *net);
size_t dt_net_layer_param_begin(const dt_net *net, int layer);

/* Evaluation (training = 0) folds each batch norm into the convolution before it when nothing else
 * reads that convolution's output: one pass instead of two, the same function. On by default;
 * tests turn it off to compare (it remakes the evaluation plan). */
void dt_net_set_fold_batchnorm(dt_net *net, int on);
/* Evaluation's folding, for what rebuilds the net elsewhere (export/), so it computes what
 * evaluation here computes, bit for bit in the folded kernels. dt_net_folded_batchnorm: the batch
 * norm layer that evaluation folds into conv2d layer i, or -1 (none, not a conv2d, or folding
 * turned off). dt_net_fold_conv: that conv's folded kernel (HWIO, [n_weights]) and bias
 * ([out_c]); scratch [2 * out_c]; only where dt_net_folded_batchnorm(net, i) >= 0. */
int dt_net_folded_batchnorm(const dt_net *net, int i);
void dt_net_fold_conv(const dt_net *net, int i, float *w, float *b, float *scratch);
/* Off: every layer its own step in both plans, no fusion (folding included): what tests compare
 * each fused step against. On by default. */
void dt_net_set_fusion(dt_net *net, int on);
/* The net's two execution plans (model/plan.c), training's then evaluation's: one line per step,
 * its kind ("conv2d", "batchnorm+relu", "conv2d+batchnorm", ...) and the layers it runs. What
 * `dtrain inspect MODEL` prints. */
void dt_net_print_plan(const dt_net *net, FILE *f);
/* Layer i's parameters: the flat floats [*offset, *offset + *count), all of them (kernel and bias,
 * batch norm's scale, offset and moving statistics); 0 if it has none. */
int dt_net_layer_params(const dt_net *net, int i, size_t *offset, size_t *count);

/* Calls around the layers that have parameters (worker/overlap.c streams the exchange with them):
 * before_forward before a layer reads its parameters [offset, offset + count) of the flat buffer,
 * after_backward once its gradient there is final (backward runs the last layer first). Either may
 * be NULL. They see every forward (evaluation too) and every backward. */
typedef struct {
    void (*before_forward)(void *user, size_t offset, size_t count);
    void (*after_backward)(void *user, size_t offset, size_t count);
    void *user;
} dt_net_hooks;
void dt_net_set_hooks(dt_net *net, const dt_net_hooks *hooks); /* NULL: none */
const dt_net_hooks *dt_net_get_hooks(const dt_net *net);

/* Moves the kernels of the net to a device: "cpu" (or NULL, "": nothing to do), "cuda" or "cuda:N"
 * (compute/cuda.h; docs/gpu.md). Activations then live on the device; dt_net_params and dt_net_grads
 * stay host buffers with the same contract: forward reads the parameters from them layer by layer
 * (after the before_forward hook), and when backward returns (each layer's after_backward hook
 * included) the gradients are in them. Fails, leaving the net on the CPU, when the build has no
 * CUDA, the device cannot be opened (the driver's reason), memory runs out, or a layer has no
 * kernel there ("not supported on cuda yet: layer X"). At most once per net. */
int dt_net_set_device(dt_net *net, const char *device, dt_error *err);
const char *dt_net_device(const dt_net *net); /* "cpu" or "cuda" */
/* The precision its kernels compute in (compute/precision.h; --precision): "float32" (NULL, "": the
 * default) or "bf16", the convolutions' and dense layers' products in bf16 with float32
 * accumulation; parameters, gradients, activations, batch norm, softmax and the loss stay float32.
 * Fails (the net unchanged) for an unknown name, bf16 on a CPU without AVX512_BF16 (one line naming
 * it), or bf16 on a device (the CUDA backend computes in float32; dt_net_set_device refuses a bf16
 * net likewise). */
int dt_net_set_precision(dt_net *net, const char *precision, dt_error *err);
const char *dt_net_precision(const dt_net *net); /* "float32" or "bf16" */
/* dt_net_set_device with the backend given (compute/backend.h; it is copied): a device context
 * already opened (its ops->close is called when the net is freed), or a test's. */
int dt_net_set_backend(dt_net *net, const dt_backend *b, dt_error *err);
/* The backend the net calls (the CPU's over its own context until it moves). */
const dt_backend *dt_net_backend(const dt_net *net);
/* "cpu (4 threads)", "NVIDIA H200 (cuda:0, ...)": the backend's description. */
void dt_net_describe_device(const dt_net *net, char *buf, size_t len);
/* The threads of the net's CPU context (compute/kernels.h, dt_cpu): each net has its own, so two
 * nets of one process may use different counts; results do not depend on it. threads <= 0: every
 * core; more than the cores: the cores. A new net has OpenMP's default (dt_cpu_default_threads). */
void dt_net_set_threads(dt_net *net, int threads);
int dt_net_threads(const dt_net *net);
/* A device's first failure (a kernel, a copy, cuBLAS), which forward, loss and backward cannot
 * return: callers check it after each step. Always 0 on the CPU. */
int dt_net_status(const dt_net *net, dt_error *err);

/* ---- click-log models (spec.ctr: `input dense=N fields=M`, docs/model-format.md) ---- */

/* 1 for a click-log model; 1 for a model ending in one logit (sigmoid and logloss: every click-log
 * model), whose logits are [batch, 1] and whose dt_net_num_classes is 1. */
int dt_net_is_ctr(const dt_net *net);
int dt_net_is_binary(const dt_net *net);
/* dt_net_forward for a click-log model: the dense features of b are the model input, the embedding
 * layers read its ids; b must stay valid until the backward after it. Fails (NULL, err) when b's
 * dense features or fields differ from the model's input line, for an image model, or when memory
 * for the batch's ids runs out. Returns the logits [b->n]. (dt_net_forward refuses a click-log
 * model.) */
const float *dt_net_forward_ctr(dt_net *net, const dt_ctr_batch *b, int training, uint64_t seed, dt_error *err);
/* The mean logloss of the last forward of a binary model (labels [batch] 0 or 1); *correct: rows
 * whose probability is on the label's side of 0.5. dt_net_loss takes int32 labels to the same. */
float dt_net_loss_binary(dt_net *net, const float *labels, int *correct);

/* The embedding tables (views with `table` set), in view order, and what the last backward made of
 * each: the rows it touched, each with its gradient summed over the batch's ids (the unique ids of
 * a sparse update). The flat gradient (dt_net_grads) holds the same rows and 0 in every other row
 * of the table, so anything that reads the whole gradient sees the same thing; a lazy optimizer
 * reads only these rows. Valid until the next backward. */
typedef struct {
    int view;                 /* dt_net_view(net, view): the table, [buckets, dim] */
    int dim;
    size_t n;                 /* rows touched */
    const int64_t *rows;      /* [n] ascending: rows of this table (an id's bucket) */
    const float *grad;        /* [n, dim]: their gradients */
} dt_table_grad;
int dt_net_num_tables(const dt_net *net);
int dt_net_table_grad(const dt_net *net, int t, dt_table_grad *out);
/* The model's rows of table t (its buckets: [rows, dim] in one process, whatever a compact net's block
 * holds); 0 for unbounded ids (capacity=: a row per raw id, held by a cluster's ps tasks only); -1
 * without table t. */
int64_t dt_net_table_rows(const dt_net *net, int t);
/* The table (0..dt_net_num_tables-1) a view is, or -1. */
int dt_net_view_table(const dt_net *net, int view);
/* Clips the last backward's gradient to a global L2 norm of at most max_norm, as
 * dt_clip_global_norm over dt_net_grads does, but reading the tables' touched rows only (the table
 * rows dt_net_table_grad lists are scaled too). Returns the norm before clipping. */
double dt_net_clip_gradients(dt_net *net, float max_norm);

/* ---- compact tables: the rows live elsewhere (a cluster's ps tasks, worker/sparse_client.h) ----
 *
 * dt_net_build_compact builds a net whose embedding tables are blocks of one batch's rows, not
 * whole tables: each table's view is [block, dim] with block = max_batch x the fields that share
 * the table (1 for a per-field table), whatever its buckets, so a worker's memory grows with the
 * batch, never with the table. Before each forward, dt_net_forward_ctr lists each table's unique
 * ids (buckets) in the batch, in first-seen order, and gives each the next slot of the block; the
 * fill callback then writes each id's row into its slot, and the kernels read the block as they
 * read a table. dt_net_table_grad's rows are then slots (the ids: dt_net_table_block's ids[slot]).
 * A batch with more distinct ids of a table than its block (libffm fields holding several ids)
 * fails naming the table. Views, placement and checkpoints see the blocks as the tables. */
int dt_net_build_compact(dt_net **out, const dt_model_spec *spec, int max_batch, dt_error *err);
/* dt_net_load, compact (compact_tables 1) or not (0), or DT_NET_TABLES_AUTO: compact when the model
 * has a table of unbounded ids (one process then holds its tables: train/local_tables.h). */
#define DT_NET_TABLES_AUTO (-1)
int dt_net_load_opts(dt_net **out, const char *model_path, int max_batch, int compact_tables, dt_error *err);
/* 1 when an embedding of spec has unbounded ids (capacity=, no buckets=): only a compact net holds it. */
int dt_model_spec_unbounded(const dt_model_spec *spec);
int dt_net_compact_tables(const dt_net *net);
typedef struct {
    int view, dim;            /* dt_net_view(net, view): the block [cap, dim] */
    uint64_t buckets;         /* the model's rows of the table (ids are 0..buckets-1); 0: unbounded ids
                               * (any 64-bit key: model/ctr_batch.h, dt_ctr_key) */
    size_t n, cap;            /* slots used by the last batch; the block's rows */
    const uint64_t *ids;      /* [n]: slot k holds row ids[k] of the table */
    float *rows;              /* [cap, dim]: the block, in the net's flat parameters */
} dt_table_block;
/* Table t (0..dt_net_num_tables-1) of a compact net, as the last dt_net_forward_ctr prepared it. */
int dt_net_table_block(dt_net *net, int t, dt_table_block *out);
/* Called by dt_net_forward_ctr of a compact net once the blocks' ids are known, before any layer
 * runs: it must fill every block's n rows (training: 1 for a training batch). An error fails the
 * forward with its message. NULL: the blocks keep what they hold. */
typedef int (*dt_net_fill_fn)(void *user, dt_net *net, int training, dt_error *err);
void dt_net_set_table_fill(dt_net *net, dt_net_fill_fn fn, void *user);
/* Each table's unique ids (row keys) in batch b, in the order dt_net_forward_ctr would list them
 * into its block, into uniq[t] (dt_net_num_tables rowsums of dim 0, initialised by the caller), without
 * touching the net: the rows a later forward of b will need (worker/sparse_prefetch.h). */
int dt_net_table_keys(const dt_net *net, const dt_ctr_batch *b, dt_rowsum *uniq, dt_error *err);
/* The training loop tells a compact net its next training batch before the current one's forward
 * (NULL: not known), so that the fill callback may fetch its rows under the current step's compute.
 * b must stay valid until the next call. */
void dt_net_set_lookahead(dt_net *net, const dt_ctr_batch *next);
const dt_ctr_batch *dt_net_lookahead(const dt_net *net);

/* Initialises every parameter from its layer's initialiser, drawing from a stream seeded by
 * (seed, view index), so the result does not depend on thread count or build order. */
void dt_net_init_params(dt_net *net, uint64_t seed);

#endif
