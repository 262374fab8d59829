/* The inside of a net (model/net.h), shared by net.c (building it, its buffers and devices, and the
 * forward and backward loops) and plan.c (its execution plan: the steps and what each runs). Not
 * for other folders. */
#ifndef DT_MODEL_NET_IMPL_H
#define DT_MODEL_NET_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "compute/backend.h"
#include "compute/rowsum.h"
#include "model/net.h"
#include "model/ctr_batch.h"
#include "model/spec.h"

#define MAX_IN DT_LAYER_MAX_INPUTS
#define DLOGITS 0 /* gradient buffer 0 is dlogits; the others are the pool */

/* An embedding layer's tables and what its last forward and backward left (host memory). Its tables
 * are n_tables views from table_view on, adjacent in the flat buffer: taken as one table of
 * n_tables * buckets rows, field s's id lands in row base[s] + dt_ctr_bucket(field[s], id, buckets)
 * (base[s] = s * buckets per field, 0 shared). */
typedef struct {
    int table_view, n_tables;
    int32_t *field;             /* [n_fields]: the fields it embeds, ascending */
    int64_t *base;              /* [n_fields] */
    int64_t buckets;
    int64_t *rows;              /* [cap]: the batch's ids as rows (only its fields' ids are set) */
    size_t cap;                 /* ids the buffers below hold: the largest batch's */
    dt_bags bags;               /* the last forward's */
    /* the last backward's touched rows: uniq ascending (of the tables taken as one), their summed
     * gradients [n_uniq, dim]; trows: each as a row of its own table (uniq - base of its table) */
    int64_t *uniq, *trows;
    float *ugrad;
    size_t n_uniq;
    size_t *table_begin;        /* [n_tables + 1]: table t's rows are uniq[table_begin[t] .. table_begin[t + 1]) */
    uint64_t *scratch;          /* [3 * cap + 1] */
    int64_t table_rows;         /* rows of each table in the flat buffer: buckets, or (compact) its block's */
    /* Compact tables (dt_net_build_compact): per table, the unique ids (buckets) of the last batch in
     * slot order; rows[] then holds each id's slot, so the kernels read the block as they read a table. */
    dt_rowsum *uniq_ids;        /* [n_tables]; NULL: whole tables */
} emb_state;

typedef struct {
    const dt_layer_spec *spec;  /* into net->spec.layers */
    dt_layer_shape shape;
    size_t in_size, out_size;   /* floats per example (in: of input 0) */
    int n_in, in_idx[MAX_IN];   /* inputs: layer indices, -1 = the model input */
    int consumers;              /* layers that read this one's output */
    int w_view, b_view;         /* conv2d/dense kernel and bias, batchnorm gamma and beta, or -1 */
    int mm_view, mv_view;       /* batchnorm moving mean and variance, or -1 */
    size_t param_begin;         /* parameters of layers < this one */
    int in_place;               /* output aliases the input (flatten; relu over an owned buffer) */
    int wants_grad;             /* its output gradient is needed: it or a layer above it learns */
    float *own;                 /* [max_batch, out_size] unless in_place */
    int32_t *argmax;            /* maxpool [max_batch, out_size] */
    uint8_t *mask;              /* dropout [max_batch, out_size] */
    float *bn;                  /* batchnorm [5, C]: mean, var, inv_std of the last training batch,
                                 * then scale and shift (that batch's, or evaluation's) */
    float *fold_w;              /* conv2d a batch norm folds into: [n_weights + out_c] kernel, bias */
    emb_state *emb;             /* embedding */
    /* backward's gradient buffers: ids (DLOGITS or pool), see plan_gradients (plan.c) */
    int gbuf;                   /* holds the gradient of this layer's output */
    int dst[MAX_IN];            /* per input: where its gradient goes, -1 if not needed */
    int acc[MAX_IN];            /* per input: add to dst (another reader wrote it first) */
    int tmp;                    /* a spare buffer for those adds, or -1 */
    const float *in[MAX_IN];    /* set before each forward step */
    float *out;                 /* set before each forward step */
} layer;

typedef struct dt_net_step dt_net_step;

/* What a step runs (plan.c's table): forward, backward (NULL: nothing to do, evaluation's steps),
 * the backend ops they call, and whether they need host memory (batch norm's statistics and
 * folding are host code). L is the step's first layer, F the layer fused into it or NULL. */
typedef struct {
    const char *name;           /* as `dtrain inspect` prints it: "conv", "batchnorm+relu", ... */
    void (*forward)(dt_net *net, layer *L, layer *F);
    void (*backward)(dt_net *net, layer *L, layer *F);
    dt_op ops[4];               /* DT_OP_COUNT after the last */
    int host;                   /* needs the backend's buffers to be host memory */
} step_kind;

/* One entry of a plan: a layer, or two run as one (a conv and the batch norm folded into it, a
 * norm or a sum and the ReLU after it). */
struct dt_net_step {
    const step_kind *kind;
    int layer;                  /* L: the first layer (the plan runs steps in its order) */
    int fused;                  /* F, or -1 */
};

/* A plan: the steps of a forward (and, for training, the backward runs them last first). */
typedef struct {
    int n;
    dt_net_step *steps;         /* [n_layers] */
} net_plan;

enum { PLAN_EVAL = 0, PLAN_TRAIN = 1 };

struct dt_net {
    dt_model_spec spec;
    int max_batch, n_layers, fold_bn, fuse; /* fuse: the plans may fuse steps (dt_net_set_fusion) */
    layer *layers;
    net_plan plans[2];          /* PLAN_EVAL, PLAN_TRAIN (plan_build) */
    int n_views;
    dt_param_view *views;
    size_t n_params;
    float *params, *grads;      /* [n_params] */
    float *scratch;             /* conv im2col, [scratch_floats] */
    double *bn_work;            /* batch norm partial sums */
    int n_gbufs;
    float **gbufs;              /* [n_gbufs]: [0] = dlogits [max_batch, classes], the others
                                 * [max_batch, largest output that wants a gradient] */
    int batch, training, have_loss;
    uint64_t seed;              /* the last forward's (dropout masks) */
    dt_net_hooks hooks;         /* around each layer with parameters (dt_net_set_hooks) */
    /* Where the kernels run (dt_net_set_device). Activations, gradient buffers and scratch are the
     * backend's memory; params and grads above stay on the host (what the updater, the ps client
     * and checkpoints read), and kparams/kgrads are what the kernels read: the same buffers on the
     * CPU, device copies on a GPU, refreshed layer by layer each forward and backward. */
    dt_cpu cpu;                 /* the CPU context: its threads (dt_net_set_threads) */
    dt_backend k;               /* the CPU over cpu, or a device (dt_net_set_backend) */
    float *kparams, *kgrads;
    float *kinput;              /* device: the input batch [max_batch, input size] */
    float *logits_host;         /* device: the logits copied back [max_batch, classes] */
    /* Click-log models (spec.ctr): the batch of the last forward (its ids, read by the embedding
     * layers forward and backward), and labels as floats for dt_net_loss's int32 ones. */
    const dt_ctr_batch *ctr;
    float *label_buf;           /* [max_batch] */
    int n_tables;               /* embedding tables (views with table set) */
    int compact;                /* tables as per-batch blocks, their rows held elsewhere (dt_net_build_compact) */
    dt_net_fill_fn fill;        /* compact: fills the blocks before each forward */
    void *fill_user;
    const dt_ctr_batch *ahead;  /* compact: the next training batch, for the fill to prefetch (NULL: unknown) */
};

/* ---- plan.c ---- */

/* Whether layer j's output may be overwritten by a ReLU reading it (the memory plan's one alias
 * besides flatten): see plan.c. */
int plan_may_run_in_place(const dt_net *net, int j);
/* Hands out backward's gradient buffers; returns how many (DLOGITS included). */
int plan_gradients(dt_net *net);
/* Fills net->plans[which] (their steps allocated [n_layers] each) from the layers and their
 * buffers; evaluation folds batch norms into convolutions when net->fold_bn. */
void plan_build(dt_net *net, int which);
/* The first step of either plan that backend b cannot run (its ops, or host memory), or NULL;
 * *layer_out: the layer to name. */
const dt_net_step *plan_unsupported(const dt_net *net, const dt_backend *b, int *layer_out);

#endif
