/* A network over the kernels of compute/: a stack of layers, or a graph whose layers take their
 * inputs from earlier layers (model/spec.h). Layers are planned in file order; since every input
 * comes from a layer above, that order is topological. Building a net makes its memory plan and
 * its execution plan (plan.c: the steps, some of which run two layers as one), and forward and
 * backward are plain loops over that plan's steps: bind each step's buffers and call the hooks
 * around its parameters, then run it.
 *
 * Memory: parameters live in one flat buffer, layer by layer, each layer's kernel then its bias
 * (batch norm: gamma, beta, moving mean, moving variance), with no gaps (a ps shards this buffer by
 * view); gradients mirror it. Each layer owns its output activation [max_batch, out] except where
 * an alias is free: flatten is a reshape of NHWC memory, and ReLU runs in place over its input when
 * that buffer is the net's own and nothing else reads it (plan_may_run_in_place). Output gradients
 * live in a few buffers handed from layer to layer by a plan made once at build (plan_gradients). */
#include "model/net.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/cuda.h"
#include "compute/optim.h"
#include "compute/precision.h"
#include "core/assert.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/net_impl.h"

#define MAX_BATCH_LIMIT (1 << 20)

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

/* An embedding layer's tables: one view "<layer>/embeddings" [buckets, dim] shared by its fields, or
 * one per field, "<layer>/embeddings_<field>" (0-based, as dt_ctr_hash), in field order. */
static int embedding_views(dt_net *net, layer *L, size_t *offset, dt_error *err) {
    const dt_layer_spec *ls = L->spec;
    emb_state *e = L->emb = dt_calloc(1, sizeof *e, "embedding", err);
    if (!e) return DT_ENOMEM;
    e->field = dt_calloc((size_t)ls->n_fields, sizeof *e->field, "embedding fields", err);
    e->base = dt_calloc((size_t)ls->n_fields, sizeof *e->base, "embedding fields", err);
    e->n_tables = ls->shared ? 1 : ls->n_fields;
    e->table_begin = dt_calloc((size_t)e->n_tables + 1, sizeof *e->table_begin, "embedding tables", err);
    if (!e->field || !e->base || !e->table_begin) return DT_ENOMEM;
    e->buckets = ls->buckets;
    e->table_view = net->n_views;
    /* Unbounded ids have no table of rows here: a compact net's block takes their rows from a hash table
     * (a cluster's ps tasks, or one process's: train/local_tables.h); a flat net cannot hold them. */
    if (!net->compact && !ls->buckets)
        return dt_errorf(err, DT_EINVAL, "%s:%d: embedding %s has unbounded ids (capacity=, no buckets=): its rows live "
                         "in a hash table, which a net of whole tables (ONNX export, the C API's dt_net_load) cannot "
                         "hold; give the layer buckets=N to hash its ids into N rows",
                         net->spec.source[0] ? net->spec.source : net->spec.name, ls->line, ls->name);
    /* compact: a block of the batch's rows, one per id a batch can hold (max_ids per example and field) */
    e->table_rows = net->compact ? (int64_t)net->max_batch * ls->max_ids * (ls->shared ? ls->n_fields : 1) : ls->buckets;
    if (net->compact && e->table_rows * ls->dim > INT32_MAX)
        return dt_errorf(err, DT_EINVAL, "%s:%d: embedding %s: a batch of %d examples with max_ids=%d ids a field needs a "
                         "block of %lld rows of %d, over 2^31 values: lower max_ids= or the batch size",
                         net->spec.source[0] ? net->spec.source : net->spec.name, ls->line, ls->name, net->max_batch,
                         ls->max_ids, (long long)e->table_rows, ls->dim);
    if (net->compact && !(e->uniq_ids = dt_calloc((size_t)e->n_tables, sizeof *e->uniq_ids, "table ids", err)))
        return DT_ENOMEM;
    for (int t = 0; e->uniq_ids && t < e->n_tables; t++) dt_rowsum_init(&e->uniq_ids[t], 0);
    int shape[2] = {(int)e->table_rows, ls->dim}, s = 0;
    for (int f = 0; f < DT_MODEL_MAX_FIELDS; f++) {
        if (!dt_layer_has_field(ls, f)) continue;
        e->field[s] = f;
        e->base[s] = ls->shared ? 0 : (int64_t)s * e->table_rows;
        if (!ls->shared || s == 0) {
            char what[16];
            if (ls->shared) snprintf(what, sizeof what, "embeddings");
            else snprintf(what, sizeof what, "embeddings_%d", f % 10000); /* f < 1024 */
            net->views[net->n_views].table = 1;
            add_view(net, ls->name, what, 2, shape, offset);
            net->n_tables++;
        }
        s++;
    }
    L->w_view = e->table_view;
    return DT_OK;
}

/* Layer i's views in the flat buffer, from *offset on (Keras's names). */
static int layer_views(dt_net *net, layer *L, size_t *offset, dt_error *err) {
    const dt_layer_spec *ls = L->spec;
    const dt_layer_shape *s = &L->shape;
    L->w_view = L->b_view = L->mm_view = L->mv_view = -1;
    L->param_begin = *offset;
    if (ls->kind == DT_LAYER_EMBEDDING) return embedding_views(net, L, offset, err);
    int c1[1] = {s->out_c};
    if (s->n_weights) {
        int hwio[4] = {ls->k_h, ls->k_w, s->in_c, s->out_c}, io[2] = {s->in_c, s->out_c};
        L->w_view = net->n_views;
        if (ls->kind == DT_LAYER_CONV2D) add_view(net, ls->name, "kernel", 4, hwio, offset);
        else add_view(net, ls->name, "kernel", 2, io, offset);
        if (s->n_bias) {
            L->b_view = net->n_views;
            add_view(net, ls->name, "bias", 1, c1, offset);
        }
    }
    if (s->n_bn) {
        L->w_view = net->n_views;
        add_view(net, ls->name, "gamma", 1, c1, offset);
        L->b_view = net->n_views;
        add_view(net, ls->name, "beta", 1, c1, offset);
        L->mm_view = net->n_views;
        add_view(net, ls->name, "moving_mean", 1, c1, offset);
        L->mv_view = net->n_views;
        add_view(net, ls->name, "moving_variance", 1, c1, offset);
        net->views[L->mm_view].not_trained = net->views[L->mv_view].not_trained = 1;
    }
    return DT_OK;
}

/* What the build sizes once every layer is planned. */
typedef struct {
    size_t offset, max_grad, scratch, bn_work;
} build_sizes;

/* Layer i's views, gradient need, aliases and host buffers. */
static int plan_layer(dt_net *net, int i, build_sizes *z, dt_error *err) {
    layer *L = &net->layers[i];
    const dt_layer_spec *ls = L->spec;
    const dt_layer_shape *s = &L->shape;
    size_t mb = (size_t)net->max_batch;
    L->in_size = (size_t)s->in_h * (size_t)s->in_w * (size_t)s->in_c;
    L->out_size = (size_t)s->out_h * (size_t)s->out_w * (size_t)s->out_c;
    int rc = layer_views(net, L, &z->offset, err);
    if (rc) return rc;
    /* an unbounded embedding's rows are a compact block the spec does not count (n_weights 0) */
    L->wants_grad = s->n_weights || s->n_bias || s->n_bn || ls->kind == DT_LAYER_EMBEDDING;
    for (int k = 0; k < L->n_in; k++)
        if (L->in_idx[k] >= 0 && net->layers[L->in_idx[k]].wants_grad) L->wants_grad = 1;
    if (L->wants_grad && L->out_size > z->max_grad) z->max_grad = L->out_size;
    L->in_place = ls->kind == DT_LAYER_FLATTEN || ((ls->kind == DT_LAYER_RELU || ls->kind == DT_LAYER_LEAKY_RELU) &&
                                                   plan_may_run_in_place(net, L->in_idx[0]));
    if (!L->in_place && !(L->own = dt_alloc_floats(mb * L->out_size, ls->name, err))) return DT_ENOMEM;
    if (ls->kind == DT_LAYER_MAXPOOL &&
        !(L->argmax = dt_calloc(mb * L->out_size, sizeof *L->argmax, "maxpool argmax", err)))
        return DT_ENOMEM;
    if (ls->kind == DT_LAYER_DROPOUT && !(L->mask = dt_calloc(mb * L->out_size, 1, "dropout mask", err)))
        return DT_ENOMEM;
    if (ls->kind == DT_LAYER_CONV2D) {
        size_t sc = dt_conv2d_scratch_floats(&s->win, net->max_batch);
        if (sc > z->scratch) z->scratch = sc;
    }
    if (!s->n_bn) return DT_OK;
    if (!(L->bn = dt_alloc_floats(5 * (size_t)s->out_c, "batch norm statistics", err))) return DT_ENOMEM;
    size_t wd = dt_batchnorm_work_doubles(mb * (size_t)s->out_h * (size_t)s->out_w, s->out_c);
    if (wd > z->bn_work) z->bn_work = wd;
    /* Evaluation folds the norm into the conv before it when that conv's output goes nowhere else. */
    layer *C = L->in_idx[0] >= 0 ? &net->layers[L->in_idx[0]] : NULL;
    if (C && C->spec->kind == DT_LAYER_CONV2D && C->consumers == 1 &&
        !(C->fold_w = dt_alloc_floats(C->shape.n_weights + (size_t)C->shape.out_c, "folded kernel", err)))
        return DT_ENOMEM;
    return DT_OK;
}

/* The flat buffers, scratch, backward's gradient buffers and both plans. */
static int plan_net(dt_net *net, const build_sizes *z, dt_error *err) {
    size_t mb = (size_t)net->max_batch, classes = (size_t)dt_net_num_classes(net);
    net->params = dt_alloc_floats(net->n_params, "parameters", err);
    net->grads = dt_alloc_floats(net->n_params, "gradients", err);
    net->scratch = dt_alloc_floats(z->scratch, "convolution scratch", err);
    net->bn_work = dt_calloc(z->bn_work ? z->bn_work : 1, sizeof *net->bn_work, "batch norm scratch", err);
    net->n_gbufs = plan_gradients(net);
    net->gbufs = dt_calloc((size_t)net->n_gbufs, sizeof *net->gbufs, "gradient buffers", err);
    for (int p = PLAN_EVAL; p <= PLAN_TRAIN; p++)
        net->plans[p].steps = dt_calloc((size_t)net->n_layers, sizeof *net->plans[p].steps, "plan", err);
    if (!net->params || !net->grads || !net->scratch || !net->bn_work || !net->gbufs || !net->plans[0].steps ||
        !net->plans[1].steps)
        return DT_ENOMEM;
    net->kparams = net->params;
    net->kgrads = net->grads;
    /* the tables' gradient rows are written where a backward touched them, the rest stays 0 */
    if (net->n_tables) memset(net->grads, 0, net->n_params * sizeof *net->grads);
    if (net->spec.ctr && !(net->label_buf = dt_alloc_floats(mb, "labels", err))) return DT_ENOMEM;
    for (int b = 0; b < net->n_gbufs; b++)
        if (!(net->gbufs[b] = dt_alloc_floats(mb * (b == DLOGITS ? classes : z->max_grad), "activation gradients",
                                              err)))
            return DT_ENOMEM;
    plan_build(net, PLAN_TRAIN);
    plan_build(net, PLAN_EVAL);
    return DT_OK;
}

/* The net's own copy of the spec, its layers linked to their inputs, its CPU backend. */
static int net_new(dt_net **out, const dt_model_spec *spec, int max_batch, size_t n_params, dt_error *err) {
    dt_net *net = dt_calloc(1, sizeof *net, "network", err);
    if (!net) return DT_ENOMEM;
    int rc = dt_model_spec_copy(&net->spec, spec, err);
    if (rc) {
        free(net);
        return rc;
    }
    *out = net;
    dt_cpu_init(&net->cpu, dt_cpu_default_threads());
    net->k = dt_backend_cpu(&net->cpu);
    net->max_batch = max_batch;
    net->n_layers = spec->n_layers;
    net->n_params = n_params;
    net->fold_bn = net->fuse = 1;
    net->layers = dt_calloc((size_t)net->n_layers, sizeof *net->layers, "layers", err);
    size_t n_views = 4 * (size_t)net->n_layers; /* kernel and bias, or batch norm's four */
    for (int i = 0; i < spec->n_layers; i++)
        if (spec->layers[i].kind == DT_LAYER_EMBEDDING) n_views += (size_t)spec->layers[i].n_fields;
    net->views = dt_calloc(n_views, sizeof *net->views, "parameter views", err);
    dt_layer_shape *shapes = dt_calloc((size_t)net->n_layers, sizeof *shapes, "layer shapes", err);
    rc = !net->layers || !net->views || !shapes ? DT_ENOMEM : dt_model_spec_shapes(&net->spec, shapes, NULL, err);
    for (int i = 0; !rc && i < net->n_layers; i++) {
        layer *L = &net->layers[i];
        L->spec = &net->spec.layers[i];
        L->shape = shapes[i];
        L->n_in = dt_layer_n_inputs(L->spec);
        for (int k = 0; k < L->n_in; k++) {
            L->in_idx[k] = dt_layer_input(L->spec, i, k);
            if (L->in_idx[k] >= 0) net->layers[L->in_idx[k]].consumers++;
        }
    }
    free(shapes);
    return rc;
}

static int net_build(dt_net **out, const dt_model_spec *spec, int max_batch, int compact, dt_error *err) {
    *out = NULL;
    const char *src = spec->source[0] ? spec->source : spec->name;
    if (max_batch < 1 || max_batch > MAX_BATCH_LIMIT)
        return dt_errorf(err, DT_EINVAL, "%s: batch size %d out of range [1, %d]", src, max_batch,
                         MAX_BATCH_LIMIT);
    size_t n_params = 0;
    int rc = dt_model_spec_shapes(spec, NULL, &n_params, err);
    if (rc) return rc;
    dt_net *net = NULL;
    build_sizes z = {0};
    rc = net_new(&net, spec, max_batch, n_params, err);
    if (net) net->compact = compact;
    for (int i = 0; !rc && i < net->n_layers; i++) rc = plan_layer(net, i, &z, err);
    if (!rc && compact) net->n_params = n_params = z.offset; /* the blocks in the tables' place */
    if (!rc && z.offset != n_params) /* the views must tile the buffer exactly */
        rc = dt_errorf(err, DT_EINVAL, "%s: internal error: views cover %zu of %zu parameters", src, z.offset,
                       n_params);
    if (!rc) rc = plan_net(net, &z, err);
    if (rc) {
        dt_net_free(net);
        return rc;
    }
    *out = net;
    return DT_OK;
}

int dt_net_build(dt_net **out, const dt_model_spec *spec, int max_batch, dt_error *err) {
    return net_build(out, spec, max_batch, 0, err);
}

int dt_model_spec_unbounded(const dt_model_spec *spec) {
    for (int i = 0; i < spec->n_layers; i++)
        if (spec->layers[i].kind == DT_LAYER_EMBEDDING && !spec->layers[i].buckets) return 1;
    return 0;
}

int dt_net_build_compact(dt_net **out, const dt_model_spec *spec, int max_batch, dt_error *err) {
    return net_build(out, spec, max_batch, 1, err);
}

int dt_net_load(dt_net **out, const char *model_path, int max_batch, dt_error *err) {
    return dt_net_load_opts(out, model_path, max_batch, 0, err);
}

int dt_net_load_opts(dt_net **out, const char *model_path, int max_batch, int compact_tables, dt_error *err) {
    dt_model_spec spec;
    *out = NULL;
    int rc = dt_model_spec_load(&spec, model_path, err);
    if (rc) return rc;
    if (compact_tables == DT_NET_TABLES_AUTO) compact_tables = dt_model_spec_unbounded(&spec);
    rc = net_build(out, &spec, max_batch, compact_tables, err);
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
            emb_state *e = net->layers[i].emb;
            if (e) {
                free(e->field), free(e->base), free(e->rows), free(e->uniq), free(e->trows), free(e->ugrad);
                for (int t = 0; e->uniq_ids && t < e->n_tables; t++) dt_rowsum_free(&e->uniq_ids[t]);
                free(e->uniq_ids);
                free(e->table_begin), free(e->scratch), free(e);
            }
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
    free(net->plans[PLAN_EVAL].steps), free(net->plans[PLAN_TRAIN].steps);
    free(net->layers);
    free(net->views);
    free(net->params);
    free(net->grads);
    free(net->bn_work);
    free(net->label_buf);
    dt_model_spec_free(&net->spec);
    if (k->ops->close) k->ops->close(k->ctx);
    free(net);
}

const dt_model_spec *dt_net_spec(const dt_net *net) { return &net->spec; }
int dt_net_max_batch(const dt_net *net) { return net->max_batch; }
int dt_net_batch(const dt_net *net) { return net->batch; }
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
void dt_net_set_fold_batchnorm(dt_net *net, int on) {
    net->fold_bn = on != 0;
    plan_build(net, PLAN_EVAL);
}
void dt_net_set_fusion(dt_net *net, int on) {
    net->fuse = on != 0;
    plan_build(net, PLAN_TRAIN);
    plan_build(net, PLAN_EVAL);
}
int dt_net_num_grad_buffers(const dt_net *net) { return net->n_gbufs; }


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
        if (L->argmax && !(d->argmax[i] = k->buf->alloc(k->ctx, n * sizeof(int32_t), "maxpool argmax", err)))
            return DT_ENOMEM;
        if (L->mask && !(d->mask[i] = k->buf->alloc(k->ctx, n, "dropout mask", err))) return DT_ENOMEM;
        if (L->spec->kind == DT_LAYER_CONV2D) {
            size_t sc = k->ops->conv2d_scratch_floats(k->ctx, &L->shape.win, net->max_batch);
            if (sc > scratch) scratch = sc;
        }
    }
    for (int b = 0; b < net->n_gbufs; b++)
        if (!(d->gbufs[b] = k->buf->alloc(k->ctx, mb * (b == DLOGITS ? classes : max_grad) * sizeof(float),
                                          "activation gradients", err)))
            return DT_ENOMEM;
    size_t np = net->n_params ? net->n_params : 1;
    if (!(d->scratch = k->buf->alloc(k->ctx, scratch * sizeof(float), "convolution scratch", err)) ||
        !(d->params = k->buf->alloc(k->ctx, np * sizeof(float), "parameters", err)) ||
        !(d->grads = k->buf->alloc(k->ctx, np * sizeof(float), "gradients", err)) ||
        !(d->input = k->buf->alloc(k->ctx, mb * dt_net_input_size(net) * sizeof(float), "input batch", err)))
        return DT_ENOMEM;
    return DT_OK;
}

/* ---- device ---- */

/* A bf16 net stays on the CPU: the devices' backends compute in float32. */
static int refuse_bf16_device(const dt_net *net, const char *device, dt_error *err) {
    if (!net->cpu.bf16) return DT_OK;
    return dt_errorf(err, DT_EINVAL, "--device %s: precision bf16 is for the CPU only (a device computes in float32)",
                     device);
}

int dt_net_set_backend(dt_net *net, const dt_backend *k, dt_error *err) {
    if (net->k.buf->on_device) return dt_errorf(err, DT_EINVAL, "the net is already on %s", net->k.ops->name);
    if (!k->buf->on_device) return DT_OK; /* the CPU: where every net starts */
    if (refuse_bf16_device(net, k->ops->name, err)) return DT_EINVAL;
    const char *src = net->spec.source[0] ? net->spec.source : net->spec.name;
    int at = net->n_layers - 1;
    if (dt_net_is_binary(net) && !k->ops->supports(k->ctx, DT_OP_SIGMOID_LOGLOSS))
        return dt_errorf(err, DT_EINVAL, "%s: not supported on %s yet: the binary output (sigmoid with logloss) of "
                         "layer %s; use --device cpu", src, k->ops->name, net->layers[at].spec->name);
    if (!k->ops->supports(k->ctx, DT_OP_SOFTMAX_XENT) || !k->ops->supports(k->ctx, DT_OP_ADD) ||
        plan_unsupported(net, k, &at))
        return dt_errorf(err, DT_EINVAL, "%s: not supported on %s yet: layer %s (%s); use --device cpu", src,
                         k->ops->name, net->layers[at].spec->name, dt_layer_kind_name(net->layers[at].spec->kind));
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
    if ((rc = refuse_bf16_device(net, device, err))) return rc; /* before a device opens */
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
void dt_net_set_threads(dt_net *net, int threads) {
    const int bf16 = net->cpu.bf16;
    dt_cpu_init(&net->cpu, threads);
    net->cpu.bf16 = bf16;
}

int dt_net_set_precision(dt_net *net, const char *precision, dt_error *err) {
    dt_precision p;
    int rc = dt_precision_parse(precision, &p, err);
    if (!rc && p == DT_PRECISION_BF16 && net->k.buf->on_device)
        rc = dt_errorf(err, DT_EINVAL, "precision bf16 is for the CPU only: the net is on %s (its backend computes in "
                       "float32)", net->k.ops->name);
    if (!rc) rc = dt_precision_check_cpu(p, err);
    if (!rc) net->cpu.bf16 = p == DT_PRECISION_BF16;
    return rc;
}

const char *dt_net_precision(const dt_net *net) {
    return dt_precision_name(net->cpu.bf16 ? DT_PRECISION_BF16 : DT_PRECISION_FLOAT32);
}
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
        for (int t = 0; L->emb && t < L->emb->n_tables; t++) {
            int w = L->emb->table_view + t;
            init_view(net->params + net->views[w].offset, &net->views[w], &L->spec->weight_init,
                      dt_hash64(seed, (uint64_t)w));
        }
        if (L->w_view >= 0 && !L->emb) {
            const dt_param_view *v = &net->views[L->w_view];
            init_view(net->params + v->offset, v, &L->spec->weight_init, dt_hash64(seed, (uint64_t)L->w_view));
        }
        if (L->b_view >= 0) {
            const dt_param_view *v = &net->views[L->b_view];
            init_view(net->params + v->offset, v, &L->spec->bias_init, dt_hash64(seed, (uint64_t)L->b_view));
        }
    }
}

/* ---- forward / backward: loops over the plan ---- */

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

/* Before layer i runs: its inputs and output bound (an in-place layer writes only into the net's
 * own buffers, dt_net_build), and its parameters ready (the hook may wait for them; a device
 * copies them up). */
static void enter_layer(dt_net *net, int i, const float *x) {
    layer *L = &net->layers[i];
    for (int q = 0; q < L->n_in; q++) L->in[q] = L->in_idx[q] < 0 ? x : net->layers[L->in_idx[q]].out;
    L->out = L->in_place ? (float *)L->in[0] : L->own;
    size_t po, pc;
    if (!dt_net_layer_params(net, i, &po, &pc)) return;
    if (net->hooks.before_forward) net->hooks.before_forward(net->hooks.user, po, pc);
    if (net->k.buf->on_device) net->k.buf->upload_params(net->k.ctx, net->kparams + po, net->params + po, pc);
}

static const float *net_forward(dt_net *net, const float *x, int batch, int training, uint64_t seed,
                                dt_error *err);

const float *dt_net_forward(dt_net *net, const float *x, int batch, int training, uint64_t seed, dt_error *err) {
    if (net->spec.ctr) {
        dt_errorf(err, DT_EINVAL, "%s: a click-log model (input dense=%d fields=%d) reads batches of click logs "
                  "(dt_net_forward_ctr), not an array of images", net->spec.source[0] ? net->spec.source : net->spec.name,
                  net->spec.num_dense, net->spec.num_fields);
        return NULL;
    }
    return net_forward(net, x, batch, training, seed, err);
}

static const float *net_forward(dt_net *net, const float *x, int batch, int training, uint64_t seed,
                                dt_error *err) {
    if (batch < 1 || batch > net->max_batch) {
        dt_errorf(err, DT_EINVAL, "dt_net_forward: batch %d out of range [1, %d] (the net's batch size)", batch,
                  net->max_batch);
        return NULL;
    }
    const dt_backend *k = &net->k;
    if (k->buf->on_device) {
        k->buf->upload(k->ctx, net->kinput, x, (size_t)batch * dt_net_input_size(net) * sizeof *x);
        x = net->kinput;
    }
    net->batch = batch, net->training = training != 0, net->seed = seed, net->have_loss = 0;
    const net_plan *p = &net->plans[training ? PLAN_TRAIN : PLAN_EVAL];
    for (int i = 0; i < p->n; i++) {
        const dt_net_step *s = &p->steps[i];
        layer *F = s->fused >= 0 ? &net->layers[s->fused] : NULL;
        enter_layer(net, s->layer, x);
        if (F) enter_layer(net, s->fused, x);
        if (s->kind->forward) s->kind->forward(net, &net->layers[s->layer], F);
    }
    const layer *last = &net->layers[net->n_layers - 1];
    if (!k->buf->on_device) return last->out;
    k->buf->download(k->ctx, net->logits_host, last->out, (size_t)batch * last->shape.out_c * sizeof(float));
    return net->logits_host;
}

float dt_net_loss(dt_net *net, const int32_t *labels, int *correct) {
    const layer *last = &net->layers[net->n_layers - 1];
    const dt_backend *k = &net->k;
    if (dt_net_is_binary(net)) {
        for (int i = 0; i < net->batch; i++) net->label_buf[i] = labels[i] ? 1.0f : 0.0f;
        return dt_net_loss_binary(net, net->label_buf, correct);
    }
    net->have_loss = 1;
    return k->ops->softmax_xent(k->ctx, net->gbufs[DLOGITS], last->out, labels, net->batch, last->shape.out_c,
                                correct);
}

/* After layer i's backward: its gradient is final. On the CPU the after_backward hook hears it
 * now; a device copies it down on its copy stream while the layers below run (slot i marks the
 * end), and the hooks hear it in dt_net_backward's last loop. */
static void leave_layer(dt_net *net, int i) {
    size_t po, pc;
    if (!dt_net_layer_params(net, i, &po, &pc)) return;
    if (net->k.buf->on_device) net->k.buf->download_grads(net->k.ctx, net->grads + po, net->kgrads + po, pc, i);
    else if (net->hooks.after_backward) net->hooks.after_backward(net->hooks.user, po, pc);
}

int dt_net_backward(dt_net *net, dt_error *err) {
    if (!net->have_loss || net->batch < 1)
        return dt_errorf(err, DT_EINVAL, "dt_net_backward: no loss to differentiate (call dt_net_forward and "
                                         "dt_net_loss first)");
    /* Batch norm's statistics (and dropout's masks) are the last training forward's: a backward
     * after an evaluation forward would use another batch's. */
    if (!DT_ASSERT(net->training))
        return dt_errorf(err, DT_EINVAL, "dt_net_backward: the last forward was an evaluation (training = 0)");
    const net_plan *p = &net->plans[PLAN_TRAIN];
    for (int i = p->n - 1; i >= 0; i--) {
        const dt_net_step *s = &p->steps[i];
        if (!net->layers[s->layer].wants_grad) continue; /* nothing at or before it learns */
        layer *F = s->fused >= 0 ? &net->layers[s->fused] : NULL;
        s->kind->backward(net, &net->layers[s->layer], F);
        if (F) leave_layer(net, s->fused);
        leave_layer(net, s->layer);
    }
    const dt_backend *k = &net->k;
    if (!k->buf->on_device) return DT_OK;
    /* Each layer's gradient is final on the host once its copy has landed: the hooks see them in the
     * order the CPU gives them (the last layer first), each as soon as it is there. */
    for (int i = net->n_layers - 1; i >= 0; i--) {
        size_t po, pc;
        if (!net->layers[i].wants_grad || !dt_net_layer_params(net, i, &po, &pc)) continue;
        k->buf->wait_slot(k->ctx, i);
        if (net->hooks.after_backward) net->hooks.after_backward(net->hooks.user, po, pc);
    }
    k->buf->sync(k->ctx);
    return DT_OK;
}

/* ---- click-log models ---- */

int dt_net_is_ctr(const dt_net *net) { return net->spec.ctr; }
int dt_net_is_binary(const dt_net *net) { return net->spec.ctr; } /* every click-log model, and only they */

float dt_net_loss_binary(dt_net *net, const float *labels, int *correct) {
    const layer *last = &net->layers[net->n_layers - 1];
    const dt_backend *k = &net->k;
    net->have_loss = 1;
    return k->ops->sigmoid_logloss(k->ctx, net->gbufs[DLOGITS], last->out, labels, net->batch, correct);
}

/* Each embedding layer's buffers hold a batch of nnz ids. */
static int emb_reserve(dt_net *net, size_t nnz, dt_error *err) {
    for (int i = 0; i < net->n_layers; i++) {
        emb_state *e = net->layers[i].emb;
        if (!e || e->cap >= nnz) continue;
        /* at least a full batch with an id in every field (Criteo's most), so it rarely grows */
        size_t full = (size_t)net->max_batch * (size_t)net->spec.num_fields;
        size_t cap = nnz > 2 * e->cap ? nnz : 2 * e->cap, dim = (size_t)net->layers[i].spec->dim;
        if (cap < full) cap = full;
        free(e->rows), free(e->uniq), free(e->trows), free(e->ugrad), free(e->scratch);
        e->rows = dt_calloc(cap, sizeof *e->rows, "embedding rows", err);
        e->uniq = dt_calloc(cap, sizeof *e->uniq, "embedding rows", err);
        e->trows = dt_calloc(cap, sizeof *e->trows, "embedding rows", err);
        e->ugrad = dt_calloc(cap * dim, sizeof *e->ugrad, "embedding gradients", err);
        e->scratch = dt_calloc(3 * cap + 1, sizeof *e->scratch, "embedding scratch", err);
        e->cap = 0;
        if (!e->rows || !e->uniq || !e->trows || !e->ugrad || !e->scratch) return DT_ENOMEM;
        e->cap = cap;
        /* the flat gradient's touched rows were those of uniq, now gone: zero the tables again */
        for (int t = 0; t < e->n_tables; t++) {
            const dt_param_view *v = &net->views[e->table_view + t];
            memset(net->grads + v->offset, 0, v->count * sizeof(float));
        }
        e->n_uniq = 0;
        memset(e->table_begin, 0, ((size_t)e->n_tables + 1) * sizeof *e->table_begin);
    }
    return DT_OK;
}

/* Compact tables: each table's unique ids in batch b (row keys, first-seen order) into uniq[table]
 * and, rows != NULL, each id's row as its slot in the table's block (rows[j] for id j of the batch).
 * One function for the forward and for a lookahead's keys, so both list the same ids in one order. */
static int emb_keys(const dt_net *net, const layer *L, const dt_ctr_batch *b, dt_rowsum *uniq, int64_t *rows,
                    dt_error *err) {
    const emb_state *e = L->emb;
    for (int t = 0; t < e->n_tables; t++) {
        dt_rowsum_clear(&uniq[t]);
        if (dt_rowsum_reserve(&uniq[t], (size_t)e->table_rows, err)) return DT_ENOMEM;
    }
    for (int s = 0; s < L->spec->n_fields; s++) {
        int t = L->spec->shared ? 0 : s;
        for (int i = 0; i < b->n; i++) {
            const int64_t *o = b->offsets + (int64_t)i * b->num_fields + e->field[s];
            for (int64_t j = o[0]; j < o[1]; j++) {
                uint64_t id = dt_ctr_key((uint32_t)e->field[s], b->ids[j], (uint64_t)e->buckets, L->spec->shared);
                size_t slot = dt_rowsum_add(&uniq[t], id, NULL);
                if (slot == (size_t)-1 || slot >= (size_t)e->table_rows) /* the rowsum may hold more */
                    return dt_errorf(err, DT_ESHAPE, "%s: a batch names more than %lld distinct rows of table %d "
                                     "(its block holds max_ids=%d per example and field): raise max_ids= on the "
                                     "embedding's line to the most ids an example has in a field",
                                     net->views[e->table_view + t].name, (long long)e->table_rows, t,
                                     L->spec->max_ids);
                if (rows) rows[j] = e->base[s] + (int64_t)slot;
            }
        }
    }
    return DT_OK;
}

static int emb_prepare(dt_net *net, layer *L, const dt_ctr_batch *b, dt_error *err) {
    return emb_keys(net, L, b, L->emb->uniq_ids, L->emb->rows, err);
}

int dt_net_table_keys(const dt_net *net, const dt_ctr_batch *b, dt_rowsum *uniq, dt_error *err) {
    if (!net->compact) return dt_errorf(err, DT_EINVAL, "table keys: the net holds its tables itself");
    if (b->num_dense != net->spec.num_dense || b->num_fields != net->spec.num_fields || b->n < 1 ||
        b->n > net->max_batch)
        return dt_errorf(err, DT_ESHAPE, "table keys: a batch of %d examples, %d dense and %d fields, for a net of "
                         "batches up to %d, %d dense and %d fields", b->n, b->num_dense, b->num_fields, net->max_batch,
                         net->spec.num_dense, net->spec.num_fields);
    for (int i = 0, t = 0; i < net->n_layers; i++) {
        const layer *L = &net->layers[i];
        if (!L->emb) continue;
        int rc = emb_keys(net, L, b, uniq + t, NULL, err);
        if (rc) return rc;
        t += L->emb->n_tables;
    }
    return DT_OK;
}

void dt_net_set_lookahead(dt_net *net, const dt_ctr_batch *next) { net->ahead = next; }

const dt_ctr_batch *dt_net_lookahead(const dt_net *net) { return net->ahead; }

/* Compact tables: the blocks' ids for batch b, then their rows from the fill callback. */
static int tables_prepare(dt_net *net, const dt_ctr_batch *b, int training, dt_error *err) {
    for (int i = 0; i < net->n_layers; i++) {
        int rc = net->layers[i].emb ? emb_prepare(net, &net->layers[i], b, err) : DT_OK;
        if (rc) return rc;
    }
    return net->fill ? net->fill(net->fill_user, net, training, err) : DT_OK;
}

int dt_net_compact_tables(const dt_net *net) { return net->compact; }

void dt_net_set_table_fill(dt_net *net, dt_net_fill_fn fn, void *user) {
    net->fill = fn;
    net->fill_user = user;
}

int dt_net_table_block(dt_net *net, int t, dt_table_block *out) {
    memset(out, 0, sizeof *out);
    dt_table_grad g;
    if (!net->compact || dt_net_table_grad(net, t, &g)) return DT_EINVAL;
    for (int i = 0; i < net->n_layers; i++) {
        emb_state *e = net->layers[i].emb;
        if (!e || g.view < e->table_view || g.view >= e->table_view + e->n_tables) continue;
        const dt_rowsum *u = &e->uniq_ids[g.view - e->table_view];
        *out = (dt_table_block){.view = g.view, .dim = g.dim, .buckets = (uint64_t)e->buckets, .n = u->n,
                                .cap = (size_t)e->table_rows, .ids = u->ids,
                                .rows = net->params + net->views[g.view].offset};
        return DT_OK;
    }
    return DT_EINVAL;
}

const float *dt_net_forward_ctr(dt_net *net, const dt_ctr_batch *b, int training, uint64_t seed, dt_error *err) {
    const char *src = net->spec.source[0] ? net->spec.source : net->spec.name;
    if (!net->spec.ctr) {
        dt_errorf(err, DT_EINVAL, "%s: an image model (input %d %d %d) cannot read click logs: a click-log model "
                  "starts with 'input dense=N fields=M'", src, net->spec.in_h, net->spec.in_w, net->spec.in_c);
        return NULL;
    }
    if (b->num_dense != net->spec.num_dense || b->num_fields != net->spec.num_fields) {
        dt_errorf(err, DT_ESHAPE, "%s: the click log has %d dense features and %d categorical fields, but the model's "
                  "input line says dense=%d fields=%d", src, b->num_dense, b->num_fields, net->spec.num_dense,
                  net->spec.num_fields);
        return NULL;
    }
    if (b->n >= 1 && b->n <= net->max_batch) {
        int64_t nnz = b->offsets[(size_t)b->n * (size_t)b->num_fields];
        if (emb_reserve(net, nnz > 0 ? (size_t)nnz : 1, err)) return NULL;
        if (net->compact && tables_prepare(net, b, training, err)) return NULL;
    }
    net->ctr = b;
    static const float none[1] = {0};
    return net_forward(net, b->num_dense ? b->dense : none, b->n, training, seed, err);
}

int dt_net_num_tables(const dt_net *net) { return net->n_tables; }

int64_t dt_net_table_rows(const dt_net *net, int t) {
    for (int i = 0, seen = 0; i < net->n_layers; i++) {
        const emb_state *e = net->layers[i].emb;
        if (!e) continue;
        if (t >= seen && t < seen + e->n_tables) return e->buckets;
        seen += e->n_tables;
    }
    return -1;
}

int dt_net_view_table(const dt_net *net, int view) {
    if (view < 0 || view >= net->n_views || !net->views[view].table) return -1;
    int t = 0;
    for (int v = 0; v < view; v++) t += net->views[v].table != 0;
    return t;
}

int dt_net_table_grad(const dt_net *net, int t, dt_table_grad *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0, seen = 0; i < net->n_layers; i++) {
        const emb_state *e = net->layers[i].emb;
        if (!e) continue;
        if (t < seen + e->n_tables) {
            int k = t - seen;
            size_t lo = e->table_begin[k], hi = e->table_begin[k + 1];
            out->view = e->table_view + k;
            out->dim = net->layers[i].spec->dim;
            out->n = hi - lo;
            out->rows = e->trows ? e->trows + lo : NULL;
            out->grad = e->ugrad ? e->ugrad + lo * (size_t)out->dim : NULL;
            return DT_OK;
        }
        seen += e->n_tables;
    }
    return DT_EINVAL;
}

double dt_net_clip_gradients(dt_net *net, float max_norm) {
    if (!net->n_tables) return dt_clip_global_norm(net->grads, net->n_params, max_norm);
    /* the floats outside the tables, then the tables' touched rows */
    double sum = 0;
    size_t at = 0;
    for (int v = 0; v <= net->n_views; v++) {
        size_t end = v < net->n_views ? net->views[v].offset : net->n_params;
        if (v < net->n_views && !net->views[v].table) continue;
        for (size_t i = at; i < end; i++) sum += (double)net->grads[i] * net->grads[i];
        if (v < net->n_views) at = end + net->views[v].count;
    }
    for (int i = 0; i < net->n_layers; i++) {
        const emb_state *e = net->layers[i].emb;
        for (size_t j = 0; e && j < e->n_uniq * (size_t)net->layers[i].spec->dim; j++)
            sum += (double)e->ugrad[j] * e->ugrad[j];
    }
    double norm = sqrt(sum);
    if (!(norm > (double)max_norm && max_norm > 0)) return norm;
    float scale = (float)((double)max_norm / norm);
    at = 0;
    for (int v = 0; v <= net->n_views; v++) {
        size_t end = v < net->n_views ? net->views[v].offset : net->n_params;
        if (v < net->n_views && !net->views[v].table) continue;
        for (size_t i = at; i < end; i++) net->grads[i] *= scale;
        if (v < net->n_views) at = end + net->views[v].count;
    }
    for (int i = 0; i < net->n_layers; i++) {
        emb_state *e = net->layers[i].emb;
        if (!e) continue;
        size_t dim = (size_t)net->layers[i].spec->dim;
        float *g = net->grads + net->views[e->table_view].offset;
        for (size_t u = 0; u < e->n_uniq; u++)
            for (size_t k = 0; k < dim; k++) g[(size_t)e->uniq[u] * dim + k] = e->ugrad[u * dim + k] *= scale;
    }
    return norm;
}
