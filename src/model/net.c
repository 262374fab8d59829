/* A network over the kernels in compute/kernels.h: a stack of layers, or a graph whose layers take
 * their inputs from earlier layers (model/spec.h). Layers run in file order forward and in reverse
 * order backward; since every input comes from a layer above, that order is topological.
 *
 * Memory: parameters live in one flat buffer, layer by layer, each layer's kernel then its bias
 * (batch norm: gamma, beta, moving mean, moving variance), with no gaps (a ps shards this buffer by
 * view); gradients mirror it. Each layer owns its output activation [max_batch, out] except where
 * an alias is free: flatten is a reshape of NHWC memory, and ReLU runs in place over its input when
 * that buffer is the net's own and nothing else reads it (see may_run_in_place). Output gradients
 * live in a few buffers handed from layer to layer by a plan made once at build (plan_backward):
 * for a stack that is the old ping-pong between two buffers; a residual sum keeps one more alive. */
#include "model/net.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/backend.h"
#include "compute/cuda.h"
#include "core/error.h"
#include "core/rng.h"

#define MAX_BATCH_LIMIT (1 << 20)
#define MAX_IN DT_LAYER_MAX_INPUTS
#define DLOGITS 0 /* gradient buffer 0 is dlogits; the others are the pool */

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
    int fold_into;              /* conv2d: the batchnorm folded into it in evaluation, or -1 */
    int folded;                 /* batchnorm: folded into its conv2d input in evaluation */
    int fuse_relu;              /* batchnorm, add: the ReLU after it runs in place over its output,
                                 * so it is applied in the same pass */
    int relu_done;              /* set by forward: this output already went through that ReLU */
    int relu_bwd;               /* batchnorm with fuse_relu: its backward also applies the ReLU's
                                 * (which then skips its own), set by plan_relu_backward */
    int bwd_in_input;           /* relu: its backward is done by its batchnorm input (relu_bwd) */
    int into_add;               /* batchnorm read only by an add, as its input 0: in training the add
                                 * applies the norm as it sums (its own output is not written) */
    float *own;                 /* [max_batch, out_size] unless in_place */
    int32_t *argmax;            /* maxpool [max_batch, out_size] */
    uint8_t *mask;              /* dropout [max_batch, out_size] */
    float *bn;                  /* batchnorm [5, C]: mean, var, inv_std of the last training batch,
                                 * then scale and shift (that batch's, or evaluation's) */
    float *fold_w;              /* conv2d with fold_into >= 0: [n_weights + out_c] folded kernel, bias */
    /* backward plan: gradient buffer ids (DLOGITS or pool), see plan_backward */
    int gbuf;                   /* holds the gradient of this layer's output */
    int dst[MAX_IN];            /* per input: where its gradient goes, -1 if not needed */
    int acc[MAX_IN];            /* per input: add to dst (another reader wrote it first) */
    int tmp;                    /* a spare buffer for those adds, or -1 */
    const float *in[MAX_IN];    /* set by forward */
    float *out;                 /* set by forward */
} layer;

struct dt_net {
    dt_model_spec spec;
    int max_batch, n_layers, fold_bn;
    layer *layers;
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
};

static void add_view(dt_net *net, const char *layer_name, const char *what, int ndim, const int *shape,
                     size_t *offset) {
    dt_param_view *v = &net->views[net->n_views++];
    snprintf(v->name, sizeof v->name, "%s/%s", layer_name, what);
    v->ndim = ndim;
    v->count = 1;
    for (int d = 0; d < 4; d++) {
        v->shape[d] = d < ndim ? shape[d] : 0;
        if (d < ndim) v->count *= (size_t)shape[d];
    }
    v->offset = *offset;
    *offset += v->count;
}

/* Gradient of a layer's input computed in place over the gradient of its output (element-wise
 * backward), so the output's gradient buffer can simply be handed down. */
static int backward_in_place(dt_layer_kind k) {
    return k == DT_LAYER_RELU || k == DT_LAYER_LEAKY_RELU || k == DT_LAYER_SIGMOID || k == DT_LAYER_TANH ||
           k == DT_LAYER_DROPOUT || k == DT_LAYER_FLATTEN || k == DT_LAYER_BATCHNORM || k == DT_LAYER_ADD;
}

/* ReLU (or leaky ReLU) may overwrite its input j when the buffer is the net's own, nothing but this
 * layer reads any layer aliasing it, and the layer owning it does not need its own output in
 * backward (sigmoid and tanh do; relu's sign test survives a second relu). */
static int may_run_in_place(const dt_net *net, int j) {
    while (j >= 0) {
        const layer *P = &net->layers[j];
        if (P->consumers != 1) return 0;
        if (!P->in_place) return P->spec->kind != DT_LAYER_SIGMOID && P->spec->kind != DT_LAYER_TANH;
        j = P->in_idx[0];
    }
    return 0; /* the caller's input */
}

/* Hands out gradient buffers in backward order, reusing those whose layer is done. Returns the
 * number of buffers (DLOGITS included). */
static int plan_backward(dt_net *net) {
    int free_ids[DT_MODEL_MAX_LAYERS + 2], n_free = 0, next = DLOGITS + 1; /* live buffers <= layers + 1 */
#define ACQUIRE() (n_free ? free_ids[--n_free] : next++)
#define RELEASE(b) ((b) != DLOGITS ? (void)(free_ids[n_free++] = (b)) : (void)0)
    for (int i = 0; i < net->n_layers; i++) net->layers[i].gbuf = -1;
    net->layers[net->n_layers - 1].gbuf = DLOGITS;
    for (int i = net->n_layers - 1; i >= 0; i--) {
        layer *L = &net->layers[i];
        L->tmp = -1;
        if (!L->wants_grad) continue;
        int cur = L->gbuf, handed = 0, inplace = backward_in_place(L->spec->kind);
        for (int k = 0; k < L->n_in; k++) {
            int j = L->in_idx[k];
            L->dst[k] = -1, L->acc[k] = 0;
            if (j < 0 || !net->layers[j].wants_grad) continue;
            layer *P = &net->layers[j];
            if (P->gbuf < 0) {
                if (inplace && !handed) P->gbuf = cur, handed = 1;
                else P->gbuf = ACQUIRE();
            } else {
                L->acc[k] = 1;
                /* element-wise layers compute into their own gradient, then add it */
                if (!inplace && L->tmp < 0) L->tmp = ACQUIRE();
            }
            L->dst[k] = P->gbuf;
        }
        if (L->tmp >= 0) RELEASE(L->tmp);
        if (!handed) RELEASE(cur);
    }
#undef ACQUIRE
#undef RELEASE
    return next;
}

/* A batch norm whose only reader is an add (a residual block's last norm, as the add's input 0)
 * leaves its affine map to the add in training: one pass writes norm + shortcut, instead of the
 * norm writing its output and the add reading it back. */
static void plan_norm_into_add(dt_net *net) {
    for (int i = 0; i < net->n_layers; i++) {
        layer *L = &net->layers[i];
        if (L->spec->kind != DT_LAYER_ADD || L->in_idx[0] < 0) continue;
        layer *P = &net->layers[L->in_idx[0]];
        if (P->spec->kind == DT_LAYER_BATCHNORM && P->consumers == 1 && !P->fuse_relu) P->into_add = 1;
    }
}

/* A ReLU that ran inside its batch norm's forward (fuse_relu) and hands its gradient buffer down
 * in place leaves its backward to the norm too: the norm masks dout as it reads it, which saves a
 * pass over the gradient (docs/memory-layout.md). */
static void plan_relu_backward(dt_net *net) {
    for (int i = 0; i < net->n_layers; i++) {
        layer *L = &net->layers[i];
        if (L->spec->kind != DT_LAYER_RELU || !L->in_place || !L->wants_grad || L->in_idx[0] < 0) continue;
        layer *P = &net->layers[L->in_idx[0]];
        if (P->spec->kind == DT_LAYER_BATCHNORM && P->fuse_relu && L->dst[0] == L->gbuf && !L->acc[0])
            P->relu_bwd = L->bwd_in_input = 1;
    }
}

int dt_net_build(dt_net **out, const dt_model_spec *spec, int max_batch, dt_error *err) {
    *out = NULL;
    const char *src = spec->source[0] ? spec->source : spec->name;
    if (max_batch < 1 || max_batch > MAX_BATCH_LIMIT)
        return dt_errorf(err, DT_EINVAL, "%s: batch size %d out of range [1, %d]", src, max_batch,
                         MAX_BATCH_LIMIT);
    size_t n_params = 0;
    int rc = dt_model_spec_shapes(spec, NULL, &n_params, err);
    if (rc) return rc;
    dt_net *net = dt_calloc(1, sizeof *net, "network", err);
    if (!net) return DT_ENOMEM;
    if ((rc = dt_model_spec_copy(&net->spec, spec, err))) {
        free(net);
        return rc;
    }
    dt_cpu_init(&net->cpu, dt_cpu_default_threads());
    net->k = dt_backend_cpu(&net->cpu);
    net->max_batch = max_batch;
    net->n_layers = spec->n_layers;
    net->n_params = n_params;
    net->fold_bn = 1;
    rc = DT_ENOMEM;
    net->layers = dt_calloc((size_t)net->n_layers, sizeof *net->layers, "layers", err);
    dt_layer_shape *shapes = dt_calloc((size_t)net->n_layers, sizeof *shapes, "layer shapes", err);
    net->views = dt_calloc(4 * (size_t)net->n_layers, sizeof *net->views, "parameter views", err);
    if (!net->layers || !shapes || !net->views) goto fail;
    if ((rc = dt_model_spec_shapes(&net->spec, shapes, NULL, err))) goto fail;
    rc = DT_ENOMEM;

    size_t offset = 0, max_grad = 0, scratch = 0, bn_work = 0, mb = (size_t)max_batch;
    for (int i = 0; i < net->n_layers; i++) {
        layer *L = &net->layers[i];
        const dt_layer_spec *ls = &net->spec.layers[i];
        L->spec = ls;
        L->shape = shapes[i];
        L->n_in = dt_layer_n_inputs(ls);
        for (int k = 0; k < L->n_in; k++) {
            L->in_idx[k] = dt_layer_input(ls, i, k);
            if (L->in_idx[k] >= 0) net->layers[L->in_idx[k]].consumers++;
        }
        L->fold_into = -1;
    }
    for (int i = 0; i < net->n_layers; i++) {
        layer *L = &net->layers[i];
        const dt_layer_spec *ls = L->spec;
        const dt_layer_shape *s = &L->shape;
        L->in_size = (size_t)s->in_h * (size_t)s->in_w * (size_t)s->in_c;
        L->out_size = (size_t)s->out_h * (size_t)s->out_w * (size_t)s->out_c;
        L->w_view = L->b_view = L->mm_view = L->mv_view = -1;
        L->param_begin = offset;
        if (s->n_weights) {
            L->w_view = net->n_views;
            if (ls->kind == DT_LAYER_CONV2D) {
                int shp[4] = {ls->k_h, ls->k_w, s->in_c, s->out_c}; /* HWIO */
                add_view(net, ls->name, "kernel", 4, shp, &offset);
            } else {
                int shp[2] = {s->in_c, s->out_c}; /* [in, out] */
                add_view(net, ls->name, "kernel", 2, shp, &offset);
            }
            if (s->n_bias) {
                L->b_view = net->n_views;
                int shp[1] = {s->out_c};
                add_view(net, ls->name, "bias", 1, shp, &offset);
            }
        }
        if (s->n_bn) { /* Keras's names */
            int shp[1] = {s->out_c};
            L->w_view = net->n_views;
            add_view(net, ls->name, "gamma", 1, shp, &offset);
            L->b_view = net->n_views;
            add_view(net, ls->name, "beta", 1, shp, &offset);
            L->mm_view = net->n_views;
            add_view(net, ls->name, "moving_mean", 1, shp, &offset);
            L->mv_view = net->n_views;
            add_view(net, ls->name, "moving_variance", 1, shp, &offset);
            net->views[L->mm_view].not_trained = net->views[L->mv_view].not_trained = 1;
            L->bn = dt_alloc_floats(5 * (size_t)s->out_c, "batch norm statistics", err);
            if (!L->bn) goto fail;
            size_t wd = dt_batchnorm_work_doubles(mb * (size_t)s->out_h * (size_t)s->out_w, s->out_c);
            if (wd > bn_work) bn_work = wd;
            /* Folded into the conv before it when that conv's output goes nowhere else. */
            int j = L->in_idx[0];
            if (j >= 0 && net->layers[j].spec->kind == DT_LAYER_CONV2D && net->layers[j].consumers == 1) {
                net->layers[j].fold_into = i;
                L->folded = 1;
                const dt_layer_shape *cs = &net->layers[j].shape;
                net->layers[j].fold_w = dt_alloc_floats(cs->n_weights + (size_t)cs->out_c, "folded kernel", err);
                if (!net->layers[j].fold_w) goto fail;
            }
        }
        int has_params = s->n_weights || s->n_bias || s->n_bn;
        L->wants_grad = has_params;
        for (int k = 0; k < L->n_in; k++)
            if (L->in_idx[k] >= 0 && net->layers[L->in_idx[k]].wants_grad) L->wants_grad = 1;
        if (L->wants_grad && L->out_size > max_grad) max_grad = L->out_size;
        L->in_place = ls->kind == DT_LAYER_FLATTEN ||
                      ((ls->kind == DT_LAYER_RELU || ls->kind == DT_LAYER_LEAKY_RELU) &&
                       may_run_in_place(net, L->in_idx[0]));
        if (L->in_place && ls->kind == DT_LAYER_RELU && L->in_idx[0] >= 0) {
            layer *P = &net->layers[L->in_idx[0]];
            if (P->spec->kind == DT_LAYER_BATCHNORM || P->spec->kind == DT_LAYER_ADD) P->fuse_relu = 1;
        }
        if (!L->in_place) {
            L->own = dt_alloc_floats(mb * L->out_size, ls->name, err);
            if (!L->own) goto fail;
        }
        if (ls->kind == DT_LAYER_MAXPOOL) {
            L->argmax = dt_calloc(mb * L->out_size, sizeof *L->argmax, "maxpool argmax", err);
            if (!L->argmax) goto fail;
        } else if (ls->kind == DT_LAYER_DROPOUT) {
            L->mask = dt_calloc(mb * L->out_size, 1, "dropout mask", err);
            if (!L->mask) goto fail;
        } else if (ls->kind == DT_LAYER_CONV2D) {
            size_t sc = dt_conv2d_scratch_floats(&s->win, max_batch);
            if (sc > scratch) scratch = sc;
        }
    }
    if (offset != n_params) { /* the views must tile the buffer exactly */
        rc = dt_errorf(err, DT_EINVAL, "%s: internal error: views cover %zu of %zu parameters", src, offset,
                       n_params);
        goto fail;
    }
    rc = DT_ENOMEM;
    int classes = net->layers[net->n_layers - 1].shape.out_c;
    net->params = dt_alloc_floats(n_params, "parameters", err);
    net->grads = dt_alloc_floats(n_params, "gradients", err);
    net->scratch = dt_alloc_floats(scratch, "convolution scratch", err);
    net->bn_work = dt_calloc(bn_work ? bn_work : 1, sizeof *net->bn_work, "batch norm scratch", err);
    net->n_gbufs = plan_backward(net);
    plan_relu_backward(net);
    plan_norm_into_add(net);
    net->gbufs = dt_calloc((size_t)net->n_gbufs, sizeof *net->gbufs, "gradient buffers", err);
    if (!net->params || !net->grads || !net->scratch || !net->bn_work || !net->gbufs) goto fail;
    net->kparams = net->params;
    net->kgrads = net->grads;
    for (int b = 0; b < net->n_gbufs; b++) {
        net->gbufs[b] = dt_alloc_floats(mb * (b == DLOGITS ? (size_t)classes : max_grad), "activation gradients", err);
        if (!net->gbufs[b]) goto fail;
    }
    free(shapes);
    *out = net;
    return 0;
fail:
    free(shapes);
    dt_net_free(net);
    return rc;
}

int dt_net_load(dt_net **out, const char *model_path, int max_batch, dt_error *err) {
    dt_model_spec spec;
    *out = NULL;
    int rc = dt_model_spec_load(&spec, model_path, err);
    if (rc) return rc;
    rc = dt_net_build(out, &spec, max_batch, err);
    dt_model_spec_free(&spec);
    return rc;
}

void dt_net_free(dt_net *net) {
    if (!net) return;
    const dt_backend *k = &net->k;
    if (net->layers)
        for (int i = 0; i < net->n_layers; i++) {
            k->buf->release(k->ctx, net->layers[i].own);
            k->buf->release(k->ctx, net->layers[i].argmax);
            k->buf->release(k->ctx, net->layers[i].mask);
            free(net->layers[i].bn);
            free(net->layers[i].fold_w);
        }
    if (net->gbufs)
        for (int b = 0; b < net->n_gbufs; b++) k->buf->release(k->ctx, net->gbufs[b]);
    k->buf->release(k->ctx, net->scratch);
    if (k->buf->on_device) {
        k->buf->release(k->ctx, net->kparams);
        k->buf->release(k->ctx, net->kgrads);
        k->buf->release(k->ctx, net->kinput);
        free(net->logits_host);
        k->buf->unpin(k->ctx, net->params);
        k->buf->unpin(k->ctx, net->grads);
    }
    free(net->gbufs);
    free(net->layers);
    free(net->views);
    free(net->params);
    free(net->grads);
    free(net->bn_work);
    dt_model_spec_free(&net->spec);
    if (k->ops->close) k->ops->close(k->ctx);
    free(net);
}

const dt_model_spec *dt_net_spec(const dt_net *net) { return &net->spec; }
int dt_net_max_batch(const dt_net *net) { return net->max_batch; }
int dt_net_num_classes(const dt_net *net) { return net->layers[net->n_layers - 1].shape.out_c; }
size_t dt_net_input_size(const dt_net *net) {
    return (size_t)net->spec.in_h * (size_t)net->spec.in_w * (size_t)net->spec.in_c;
}
size_t dt_net_param_count(const dt_net *net) { return net->n_params; }
float *dt_net_params(dt_net *net) { return net->params; }
float *dt_net_grads(dt_net *net) { return net->grads; }
int dt_net_num_views(const dt_net *net) { return net->n_views; }
const dt_param_view *dt_net_view(const dt_net *net, int i) {
    return i >= 0 && i < net->n_views ? &net->views[i] : NULL;
}
int dt_net_num_layers(const dt_net *net) { return net->n_layers; }
size_t dt_net_layer_param_begin(const dt_net *net, int layer) {
    return layer >= 0 && layer < net->n_layers ? net->layers[layer].param_begin : net->n_params;
}
void dt_net_set_fold_batchnorm(dt_net *net, int on) { net->fold_bn = on != 0; }
int dt_net_num_grad_buffers(const dt_net *net) { return net->n_gbufs; }

/* ---- device ---- */

/* The ops a layer of this kind calls (forward, backward, evaluation), DT_OP_COUNT-terminated. */
static const dt_op *layer_ops(dt_layer_kind kind) {
    static const dt_op none[] = {DT_OP_COUNT}, conv[] = {DT_OP_CONV2D, DT_OP_COUNT},
                       maxpool[] = {DT_OP_MAXPOOL, DT_OP_COUNT}, avgpool[] = {DT_OP_AVGPOOL, DT_OP_COUNT},
                       gap[] = {DT_OP_GLOBAL_AVGPOOL, DT_OP_COUNT}, relu[] = {DT_OP_RELU, DT_OP_COUNT},
                       leaky[] = {DT_OP_LEAKY_RELU, DT_OP_COUNT}, sigmoid[] = {DT_OP_SIGMOID, DT_OP_COUNT},
                       tanh_[] = {DT_OP_TANH, DT_OP_COUNT}, dropout[] = {DT_OP_DROPOUT, DT_OP_COUNT},
                       dense[] = {DT_OP_DENSE, DT_OP_COUNT}, add[] = {DT_OP_ADD, DT_OP_COUNT},
                       concat[] = {DT_OP_CONCAT, DT_OP_COUNT},
                       bn[] = {DT_OP_BATCHNORM, DT_OP_CHANNEL_AFFINE, DT_OP_COUNT};
    switch (kind) {
    case DT_LAYER_CONV2D: return conv;
    case DT_LAYER_MAXPOOL: return maxpool;
    case DT_LAYER_AVGPOOL: return avgpool;
    case DT_LAYER_GLOBAL_AVGPOOL: return gap;
    case DT_LAYER_RELU: return relu;
    case DT_LAYER_LEAKY_RELU: return leaky;
    case DT_LAYER_SIGMOID: return sigmoid;
    case DT_LAYER_TANH: return tanh_;
    case DT_LAYER_DROPOUT: return dropout;
    case DT_LAYER_FLATTEN: return none;
    case DT_LAYER_DENSE: return dense;
    case DT_LAYER_BATCHNORM: return bn;
    case DT_LAYER_ADD: return add;
    case DT_LAYER_CONCAT: return concat;
    }
    return none;
}

/* Whether backend k runs every op a layer of this kind calls. */
static int backend_has(const dt_backend *k, dt_layer_kind kind) {
    /* batch norm's statistics, their moving averages and the folding are host code in this file */
    if (kind == DT_LAYER_BATCHNORM && k->buf->on_device) return 0;
    for (const dt_op *op = layer_ops(kind); *op != DT_OP_COUNT; op++)
        if (!k->ops->supports(k->ctx, *op)) return 0;
    return 1;
}

/* The device buffers of a net, allocated all before any host one is given up. */
typedef struct {
    float **own, **gbufs, *scratch, *params, *grads, *input, *logits;
    int32_t **argmax;
    uint8_t **mask;
} device_buffers;

static void device_buffers_free(const dt_net *net, const dt_backend *k, device_buffers *d) {
    for (int i = 0; i < net->n_layers; i++) {
        if (d->own) k->buf->release(k->ctx, d->own[i]);
        if (d->argmax) k->buf->release(k->ctx, d->argmax[i]);
        if (d->mask) k->buf->release(k->ctx, d->mask[i]);
    }
    for (int b = 0; d->gbufs && b < net->n_gbufs; b++) k->buf->release(k->ctx, d->gbufs[b]);
    k->buf->release(k->ctx, d->scratch);
    k->buf->release(k->ctx, d->params);
    k->buf->release(k->ctx, d->grads);
    k->buf->release(k->ctx, d->input);
    free(d->own), free(d->argmax), free(d->mask), free(d->gbufs), free(d->logits);
}

static int device_buffers_alloc(const dt_net *net, const dt_backend *k, device_buffers *d, dt_error *err) {
    size_t mb = (size_t)net->max_batch, classes = (size_t)dt_net_num_classes(net), scratch = 0, max_grad = 0;
    d->own = dt_calloc((size_t)net->n_layers, sizeof *d->own, "device activations", err);
    d->argmax = dt_calloc((size_t)net->n_layers, sizeof *d->argmax, "device activations", err);
    d->mask = dt_calloc((size_t)net->n_layers, sizeof *d->mask, "device activations", err);
    d->gbufs = dt_calloc((size_t)net->n_gbufs, sizeof *d->gbufs, "device gradient buffers", err);
    d->logits = dt_alloc_floats(mb * classes, "logits", err);
    if (!d->own || !d->argmax || !d->mask || !d->gbufs || !d->logits) return DT_ENOMEM;
    for (int i = 0; i < net->n_layers; i++) {
        const layer *L = &net->layers[i];
        size_t n = mb * L->out_size;
        if (L->wants_grad && L->out_size > max_grad) max_grad = L->out_size;
        if (L->own && !(d->own[i] = k->buf->alloc(k->ctx, n * sizeof(float), L->spec->name, err))) return DT_ENOMEM;
        if (L->argmax && !(d->argmax[i] = k->buf->alloc(k->ctx, n * sizeof(int32_t), "maxpool argmax", err))) return DT_ENOMEM;
        if (L->mask && !(d->mask[i] = k->buf->alloc(k->ctx, n, "dropout mask", err))) return DT_ENOMEM;
        if (L->spec->kind == DT_LAYER_CONV2D) {
            size_t sc = k->ops->conv2d_scratch_floats(k->ctx, &L->shape.win, net->max_batch);
            if (sc > scratch) scratch = sc;
        }
    }
    for (int b = 0; b < net->n_gbufs; b++)
        if (!(d->gbufs[b] = k->buf->alloc(k->ctx, mb * (b == DLOGITS ? classes : max_grad) * sizeof(float), "activation gradients",
                                     err)))
            return DT_ENOMEM;
    size_t np = net->n_params ? net->n_params : 1;
    if (!(d->scratch = k->buf->alloc(k->ctx, scratch * sizeof(float), "convolution scratch", err)) ||
        !(d->params = k->buf->alloc(k->ctx, np * sizeof(float), "parameters", err)) ||
        !(d->grads = k->buf->alloc(k->ctx, np * sizeof(float), "gradients", err)) ||
        !(d->input = k->buf->alloc(k->ctx, mb * dt_net_input_size(net) * sizeof(float), "input batch", err)))
        return DT_ENOMEM;
    return DT_OK;
}

int dt_net_set_backend(dt_net *net, const dt_backend *k, dt_error *err) {
    if (net->k.buf->on_device) return dt_errorf(err, DT_EINVAL, "the net is already on %s", net->k.ops->name);
    if (!k->buf->on_device) return DT_OK; /* the CPU: where every net starts */
    const char *src = net->spec.source[0] ? net->spec.source : net->spec.name;
    for (int i = 0; i < net->n_layers; i++)
        if (!backend_has(k, net->layers[i].spec->kind))
            return dt_errorf(err, DT_EINVAL, "%s: not supported on %s yet: layer %s (%s); use --device cpu", src,
                             k->ops->name, net->layers[i].spec->name, dt_layer_kind_name(net->layers[i].spec->kind));
    device_buffers d = {0};
    int rc = device_buffers_alloc(net, k, &d, err);
    if (rc) {
        device_buffers_free(net, k, &d);
        return rc;
    }
    /* From here nothing fails: the host activations go, the device ones take their place. */
    for (int i = 0; i < net->n_layers; i++) {
        layer *L = &net->layers[i];
        free(L->own), free(L->argmax), free(L->mask);
        L->own = d.own[i], L->argmax = d.argmax[i], L->mask = d.mask[i];
    }
    for (int b = 0; b < net->n_gbufs; b++) {
        free(net->gbufs[b]);
        net->gbufs[b] = d.gbufs[b];
    }
    free(net->scratch);
    net->scratch = d.scratch;
    net->kparams = d.params, net->kgrads = d.grads, net->kinput = d.input, net->logits_host = d.logits;
    free(d.own), free(d.argmax), free(d.mask), free(d.gbufs);
    net->k = *k;
    /* pinned, the parameter and gradient copies run on the copy stream without blocking the host */
    k->buf->pin(k->ctx, net->params, net->n_params * sizeof(float));
    k->buf->pin(k->ctx, net->grads, net->n_params * sizeof(float));
    return DT_OK;
}

int dt_net_set_device(dt_net *net, const char *device, dt_error *err) {
    int index, rc = dt_device_parse(device, &index, err);
    if (rc || index < 0) return rc; /* cpu: where every net starts */
    if (net->k.buf->on_device)
        return dt_errorf(err, DT_EINVAL, "--device %s: the net is already on %s", device, net->k.ops->name);
    dt_cuda *cuda = NULL;
    if ((rc = dt_cuda_open(&cuda, index, err))) return rc;
    dt_backend b = dt_cuda_backend(cuda);
    if ((rc = dt_net_set_backend(net, &b, err))) dt_cuda_close(cuda);
    return rc;
}

const char *dt_net_device(const dt_net *net) { return net->k.ops->name; }
const dt_backend *dt_net_backend(const dt_net *net) { return &net->k; }
void dt_net_describe_device(const dt_net *net, char *buf, size_t len) { net->k.ops->describe(net->k.ctx, buf, len); }
void dt_net_set_threads(dt_net *net, int threads) { dt_cpu_init(&net->cpu, threads); }
int dt_net_threads(const dt_net *net) { return net->cpu.threads; }

int dt_net_status(const dt_net *net, dt_error *err) { return net->k.ops->status(net->k.ctx, err); }

/* ---- initialisation ---- */

/* Fans as Keras computes them: conv kernels HWIO use the receptive field times channels. */
static void fans(const dt_param_view *v, double *fan_in, double *fan_out) {
    if (v->ndim == 1) *fan_in = *fan_out = v->shape[0];
    else if (v->ndim == 2) *fan_in = v->shape[0], *fan_out = v->shape[1];
    else {
        double receptive = (double)v->shape[0] * v->shape[1];
        *fan_in = receptive * v->shape[2];
        *fan_out = receptive * v->shape[3];
    }
}

static void init_view(float *p, const dt_param_view *v, const dt_init *in, uint64_t seed) {
    dt_rng r;
    dt_rng_seed(&r, seed);
    double fi, fo;
    fans(v, &fi, &fo);
    double limit = in->kind == DT_INIT_GLOROT_UNIFORM ? sqrt(6.0 / (fi + fo)) : sqrt(6.0 / fi);
    for (size_t i = 0; i < v->count; i++) {
        switch (in->kind) {
        case DT_INIT_CONSTANT: p[i] = in->value; break;
        case DT_INIT_TRUNC_NORMAL: p[i] = dt_rng_truncated_normal(&r, in->value); break;
        case DT_INIT_GLOROT_UNIFORM:
        case DT_INIT_HE_UNIFORM: p[i] = (float)((2.0 * dt_rng_uniform(&r) - 1.0) * limit); break;
        }
    }
}

void dt_net_init_params(dt_net *net, uint64_t seed) {
    for (int i = 0; i < net->n_layers; i++) {
        const layer *L = &net->layers[i];
        if (L->mm_view >= 0) { /* batch norm: gamma 1, beta 0, moving mean 0, moving variance 1 */
            static const float value[4] = {1, 0, 0, 1};
            for (int k = 0; k < 4; k++) {
                const dt_param_view *v = &net->views[L->w_view + k];
                for (size_t e = 0; e < v->count; e++) net->params[v->offset + e] = value[k];
            }
            continue;
        }
        if (L->w_view >= 0) {
            const dt_param_view *v = &net->views[L->w_view];
            init_view(net->params + v->offset, v, &L->spec->weight_init, dt_hash64(seed, (uint64_t)L->w_view));
        }
        if (L->b_view >= 0) {
            const dt_param_view *v = &net->views[L->b_view];
            init_view(net->params + v->offset, v, &L->spec->bias_init, dt_hash64(seed, (uint64_t)L->b_view));
        }
    }
}

/* ---- forward / backward ---- */

void dt_net_set_hooks(dt_net *net, const dt_net_hooks *hooks) {
    net->hooks = hooks ? *hooks : (dt_net_hooks){0};
}

const dt_net_hooks *dt_net_get_hooks(const dt_net *net) { return &net->hooks; }

/* A layer's parameters are adjacent in the flat buffer, in layer order (dt_net_build). */
int dt_net_layer_params(const dt_net *net, int i, size_t *offset, size_t *count) {
    size_t begin = dt_net_layer_param_begin(net, i), end = dt_net_layer_param_begin(net, i + 1);
    if (end <= begin) return 0;
    *offset = begin;
    *count = end - begin;
    return 1;
}

static const float *view_ptr(const float *base, const dt_net *net, int v) {
    return v >= 0 ? base + net->views[v].offset : NULL;
}

/* Batch norm in evaluation as y = x * scale + shift per channel, from the moving statistics. */
static void bn_eval_affine(const dt_net *net, const layer *B, float *scale, float *shift) {
    const float *gamma = view_ptr(net->params, net, B->w_view), *beta = view_ptr(net->params, net, B->b_view);
    const float *mm = view_ptr(net->params, net, B->mm_view), *mv = view_ptr(net->params, net, B->mv_view);
    for (int c = 0; c < B->shape.out_c; c++) {
        scale[c] = gamma[c] / sqrtf(mv[c] + B->spec->epsilon);
        shift[c] = beta[c] - mm[c] * scale[c];
    }
}

/* The conv's kernel and bias with batch norm B folded in: w' = w * scale, b' = b * scale + shift. */
static void fold_conv(const dt_net *net, layer *L, const layer *B) {
    int oc = L->shape.out_c;
    float *w = L->fold_w, *b = L->fold_w + L->shape.n_weights;
    float *scale = B->bn + 3 * oc, *shift = scale + oc;
    bn_eval_affine(net, B, scale, shift);
    const float *kw = view_ptr(net->params, net, L->w_view), *kb = view_ptr(net->params, net, L->b_view);
    for (size_t r = 0; r < L->shape.n_weights / (size_t)oc; r++)
        for (int c = 0; c < oc; c++) w[r * oc + c] = kw[r * oc + c] * scale[c];
    for (int c = 0; c < oc; c++) b[c] = (kb ? kb[c] : 0.0f) * scale[c] + shift[c];
}

const float *dt_net_forward(dt_net *net, const float *x, int batch, int training, uint64_t seed) {
    if (batch < 1 || batch > net->max_batch) return NULL;
    const dt_backend *k = &net->k;
    if (k->buf->on_device) {
        k->buf->upload(k->ctx, net->kinput, x, (size_t)batch * dt_net_input_size(net) * sizeof *x);
        x = net->kinput;
    }
    net->batch = batch;
    net->training = training;
    net->have_loss = 0;
    for (int i = 0; i < net->n_layers; i++) {
        layer *L = &net->layers[i];
        const dt_layer_spec *s = L->spec;
        size_t n = (size_t)batch * L->out_size, rows = (size_t)batch * L->shape.out_h * L->shape.out_w;
        for (int q = 0; q < L->n_in; q++) L->in[q] = L->in_idx[q] < 0 ? x : net->layers[L->in_idx[q]].out;
        const float *in = L->in[0];
        /* An in-place layer writes only into the net's own buffers (see dt_net_build). */
        L->out = L->in_place ? (float *)in : L->own;
        L->relu_done = 0;
        size_t po, pc;
        if (dt_net_layer_params(net, i, &po, &pc)) {
            if (net->hooks.before_forward)
                net->hooks.before_forward(net->hooks.user, po, pc); /* e.g. wait until they have arrived */
            if (k->buf->on_device) k->buf->upload_params(k->ctx, net->kparams + po, net->params + po, pc);
        }
        const float *w = view_ptr(net->kparams, net, L->w_view), *b = view_ptr(net->kparams, net, L->b_view);
        switch (s->kind) {
        case DT_LAYER_CONV2D:
            if (!training && net->fold_bn && L->fold_into >= 0) {
                fold_conv(net, L, &net->layers[L->fold_into]);
                w = L->fold_w, b = L->fold_w + L->shape.n_weights;
            }
            k->ops->conv2d_forward(k->ctx, L->out, in, w, b, batch, &L->shape.win, net->scratch);
            break;
        case DT_LAYER_MAXPOOL: k->ops->maxpool_forward(k->ctx, L->out, L->argmax, in, batch, &L->shape.win); break;
        case DT_LAYER_AVGPOOL: k->ops->avgpool_forward(k->ctx, L->out, in, batch, &L->shape.win); break;
        case DT_LAYER_GLOBAL_AVGPOOL:
            k->ops->global_avgpool_forward(k->ctx, L->out, in, batch, L->shape.in_h * L->shape.in_w, L->shape.in_c);
            break;
        case DT_LAYER_RELU:
            if (L->in_idx[0] < 0 || !net->layers[L->in_idx[0]].relu_done) k->ops->relu_forward(k->ctx, L->out, in, n);
            break;
        case DT_LAYER_LEAKY_RELU: k->ops->leaky_relu_forward(k->ctx, L->out, in, n, s->alpha); break;
        case DT_LAYER_SIGMOID: k->ops->sigmoid_forward(k->ctx, L->out, in, n); break;
        case DT_LAYER_TANH: k->ops->tanh_forward(k->ctx, L->out, in, n); break;
        case DT_LAYER_DROPOUT:
            if (training && s->rate > 0)
                k->ops->dropout_forward(k->ctx, L->out, L->mask, in, n, s->rate, dt_hash64(seed, (uint64_t)i));
            else
                k->buf->copy(k->ctx, L->out, in, n * sizeof *in);
            break;
        case DT_LAYER_BATCHNORM: {
            int C = L->shape.out_c;
            if (training) {
                float *mean = L->bn, *var = L->bn + C, *inv_std = L->bn + 2 * C;
                /* scale and shift go where evaluation keeps its own (it recomputes them): the add
                 * (into_add) and this norm's backward (relu_bwd) read them there */
                int skip = L->into_add && k->ops->supports(k->ctx, DT_OP_CHANNEL_AFFINE_ADD);
                k->ops->batchnorm_forward(k->ctx, skip ? NULL : L->out, mean, var, inv_std, L->bn + 3 * C, L->bn + 4 * C, in, w, b,
                                     rows, C, s->epsilon, L->fuse_relu, net->bn_work);
                L->relu_done = L->fuse_relu;
                /* moving = momentum * moving + (1 - momentum) * batch, with the unbiased variance
                 * (as Keras's fused batch norm and PyTorch) */
                float *mm = net->params + net->views[L->mm_view].offset, *mv = net->params + net->views[L->mv_view].offset;
                double unbias = rows > 1 ? (double)rows / (double)(rows - 1) : 1.0;
                for (int c = 0; c < C; c++) {
                    mm[c] = s->momentum * mm[c] + (1 - s->momentum) * mean[c];
                    mv[c] = s->momentum * mv[c] + (1 - s->momentum) * (float)(var[c] * unbias);
                }
            } else if (net->fold_bn && L->folded) {
                L->out = (float *)in; /* the conv before it already applied it */
            } else {
                float *scale = L->bn + 3 * C, *shift = L->bn + 4 * C;
                bn_eval_affine(net, L, scale, shift);
                k->ops->channel_affine_forward(k->ctx, L->out, in, scale, shift, rows, C, L->fuse_relu);
                L->relu_done = L->fuse_relu;
            }
            break;
        }
        case DT_LAYER_ADD: {
            const layer *N = L->in_idx[0] >= 0 ? &net->layers[L->in_idx[0]] : NULL;
            int j = 1, C = L->shape.out_c;
            if (training && N && N->into_add && k->ops->supports(k->ctx, DT_OP_CHANNEL_AFFINE_ADD)) { /* the norm's output, now */
                k->ops->channel_affine_add_forward(k->ctx, L->out, N->in[0], N->bn + 3 * C, N->bn + 4 * C, L->in[1], rows, C,
                                              L->fuse_relu && L->n_in == 2);
                j = 2;
            }
            for (; j < L->n_in; j++)
                k->ops->add_forward(k->ctx, L->out, j == 1 ? L->in[0] : L->out, L->in[j], n, L->fuse_relu && j == L->n_in - 1);
            L->relu_done = L->fuse_relu;
            break;
        }
        case DT_LAYER_CONCAT: {
            int off = 0;
            for (int q = 0; q < L->n_in; q++) {
                int j = L->in_idx[q], c = j < 0 ? net->spec.in_c : net->layers[j].shape.out_c;
                k->ops->concat_forward(k->ctx, L->out, L->in[q], rows, c, L->shape.out_c, off);
                off += c;
            }
            break;
        }
        case DT_LAYER_FLATTEN: break;
        case DT_LAYER_DENSE:
            k->ops->dense_forward(k->ctx, L->out, in, w, b, batch, L->shape.in_c, L->shape.out_c);
            break;
        }
    }
    const layer *last = &net->layers[net->n_layers - 1];
    if (!k->buf->on_device) return last->out;
    k->buf->download(k->ctx, net->logits_host, last->out, (size_t)batch * last->shape.out_c * sizeof(float));
    return net->logits_host;
}

float dt_net_loss(dt_net *net, const int32_t *labels, int *correct) {
    const layer *last = &net->layers[net->n_layers - 1];
    net->have_loss = 1;
    const dt_backend *k = &net->k;
    return k->ops->softmax_xent(k->ctx, net->gbufs[DLOGITS], last->out, labels, net->batch, last->shape.out_c,
                                correct);
}

/* Where layer i's backward writes the gradient of input k: straight into the input's buffer, or
 * into a spare one (acc) that is then added to it. */
static float *din_target(dt_net *net, const layer *L, int k, float *dcur) {
    if (L->dst[k] < 0) return NULL;
    if (!L->acc[k]) return net->gbufs[L->dst[k]];
    return backward_in_place(L->spec->kind) ? dcur : net->gbufs[L->tmp];
}

void dt_net_backward(dt_net *net) {
    if (!net->have_loss || net->batch < 1) return;
    const dt_backend *k = &net->k;
    int batch = net->batch;
    for (int i = net->n_layers - 1; i >= 0; i--) {
        layer *L = &net->layers[i];
        if (!L->wants_grad) continue; /* nothing at or before it learns */
        const dt_layer_spec *s = L->spec;
        size_t n = (size_t)batch * L->out_size, rows = (size_t)batch * L->shape.out_h * L->shape.out_w;
        float *dcur = net->gbufs[L->gbuf];
        /* Input gradients are NULL where nothing before that input learns (the first conv). */
        float *din = din_target(net, L, 0, dcur);
        const float *w = view_ptr(net->kparams, net, L->w_view);
        float *dw = L->w_view >= 0 ? net->kgrads + net->views[L->w_view].offset : NULL;
        float *db = L->b_view >= 0 ? net->kgrads + net->views[L->b_view].offset : NULL;
        switch (s->kind) {
        case DT_LAYER_CONV2D:
            k->ops->conv2d_backward(k->ctx, din, dw, db, dcur, L->in[0], w, batch, &L->shape.win, net->scratch);
            break;
        case DT_LAYER_DENSE:
            k->ops->dense_backward(k->ctx, din, dw, db, dcur, L->in[0], w, batch, L->shape.in_c, L->shape.out_c);
            break;
        case DT_LAYER_MAXPOOL:
            if (din) k->ops->maxpool_backward(k->ctx, din, dcur, L->argmax, batch, &L->shape.win);
            break;
        case DT_LAYER_AVGPOOL:
            if (din) k->ops->avgpool_backward(k->ctx, din, dcur, batch, &L->shape.win);
            break;
        case DT_LAYER_GLOBAL_AVGPOOL:
            if (din) k->ops->global_avgpool_backward(k->ctx, din, dcur, batch, L->shape.in_h * L->shape.in_w, L->shape.in_c);
            break;
        case DT_LAYER_RELU:
            if (din && !L->bwd_in_input) k->ops->relu_backward(k->ctx, din, dcur, L->out, n);
            break;
        case DT_LAYER_LEAKY_RELU:
            if (din) k->ops->leaky_relu_backward(k->ctx, din, dcur, L->out, n, s->alpha);
            break;
        case DT_LAYER_SIGMOID:
            if (din) k->ops->sigmoid_backward(k->ctx, din, dcur, L->out, n);
            break;
        case DT_LAYER_TANH:
            if (din) k->ops->tanh_backward(k->ctx, din, dcur, L->out, n);
            break;
        case DT_LAYER_DROPOUT:
            if (din && net->training && s->rate > 0) k->ops->dropout_backward(k->ctx, din, dcur, L->mask, n, s->rate);
            else if (din && din != dcur) k->buf->copy(k->ctx, din, dcur, n * sizeof *din);
            break;
        case DT_LAYER_FLATTEN:
            if (din && din != dcur) k->buf->copy(k->ctx, din, dcur, n * sizeof *din);
            break;
        case DT_LAYER_BATCHNORM: {
            int C = L->shape.out_c;
            /* the ReLU's mask, if it is this norm's to apply, from the scale and shift forward used */
            const float *scale = L->relu_bwd ? L->bn + 3 * C : NULL, *shift = L->relu_bwd ? L->bn + 4 * C : NULL;
            k->ops->batchnorm_backward(k->ctx, din, dw, db, dcur, L->in[0], L->bn, L->bn + 2 * C, w, scale, shift, rows, C,
                                  net->bn_work);
            /* the moving statistics are not trained */
            k->buf->zero(k->ctx, net->kgrads + net->views[L->mm_view].offset, 2 * (size_t)C * sizeof(float));
            break;
        }
        case DT_LAYER_ADD:
            for (int q = 0; q < L->n_in; q++) {
                if (L->dst[q] < 0) continue;
                float *g = net->gbufs[L->dst[q]];
                if (L->acc[q]) k->ops->add_forward(k->ctx, g, g, dcur, n, 0);
                else if (g != dcur) k->buf->copy(k->ctx, g, dcur, n * sizeof *g);
            }
            break;
        case DT_LAYER_CONCAT: {
            int off = 0;
            for (int q = 0; q < L->n_in; q++) {
                int j = L->in_idx[q], c = j < 0 ? net->spec.in_c : net->layers[j].shape.out_c;
                float *d = din_target(net, L, q, dcur);
                if (d) {
                    k->ops->concat_backward(k->ctx, d, dcur, rows, c, L->shape.out_c, off);
                    if (L->acc[q])
                        k->ops->add_forward(k->ctx, net->gbufs[L->dst[q]], net->gbufs[L->dst[q]], d, rows * (size_t)c, 0);
                }
                off += c;
            }
            break;
        }
        }
        /* An input another layer already gave a gradient gets this one's added (concat and add
         * did their own). */
        if (din && L->acc[0] && s->kind != DT_LAYER_ADD && s->kind != DT_LAYER_CONCAT)
            k->ops->add_forward(k->ctx, net->gbufs[L->dst[0]], net->gbufs[L->dst[0]], din, (size_t)batch * L->in_size, 0);
        size_t po, pc;
        if (!dt_net_layer_params(net, i, &po, &pc)) continue;
        if (k->buf->on_device) /* down on the copy stream while the layers below run; slot i marks its end */
            k->buf->download_grads(k->ctx, net->grads + po, net->kgrads + po, pc, i);
        else if (net->hooks.after_backward)
            net->hooks.after_backward(net->hooks.user, po, pc); /* e.g. push this gradient now */
    }
    if (!k->buf->on_device) return;
    /* Each layer's gradient is final on the host once its copy has landed: the hooks see them in the
     * order the CPU gives them (the last layer first), each as soon as it is there. */
    for (int i = net->n_layers - 1; i >= 0; i--) {
        size_t po, pc;
        if (!net->layers[i].wants_grad || !dt_net_layer_params(net, i, &po, &pc)) continue;
        k->buf->wait_slot(k->ctx, i);
        if (net->hooks.after_backward) net->hooks.after_backward(net->hooks.user, po, pc);
    }
    k->buf->sync(k->ctx);
}
