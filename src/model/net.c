/* A sequential network over the kernels in compute/kernels.h.
 *
 * Memory: parameters live in one flat buffer, layer by layer, each layer's kernel then its bias,
 * with no gaps (a ps shards this buffer by view); gradients mirror it. Each layer owns its output
 * activation [max_batch, out] except where an alias is free: flatten is a reshape of NHWC memory,
 * and ReLU runs in place over its input when that input is the net's own buffer (no layer's
 * backward needs its own output, only its input, argmax or mask). Input gradients ping-pong
 * between two buffers sized for the largest layer input. */
#include "model/net.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"

#define MAX_BATCH_LIMIT (1 << 20)

typedef struct {
    const dt_layer_spec *spec;  /* into net->spec.layers */
    dt_layer_shape shape;
    size_t in_size, out_size;   /* floats per example */
    int w_view, b_view;         /* indices into net->views, or -1 */
    int in_place;               /* output aliases the input (flatten; relu over an owned buffer) */
    float *own;                 /* [max_batch, out_size] unless in_place */
    int32_t *argmax;            /* maxpool [max_batch, out_size] */
    uint8_t *mask;              /* dropout [max_batch, out_size] */
    const float *in;            /* set by forward */
    float *out;                 /* set by forward */
} layer;

struct dt_net {
    dt_model_spec spec;
    int max_batch, n_layers, first_param_layer;
    layer *layers;
    int n_views;
    dt_param_view *views;
    size_t n_params;
    float *params, *grads;      /* [n_params] */
    float *scratch;             /* conv im2col, [scratch_floats] */
    float *dbuf[2];             /* input gradients, [max_batch, max in_size] each */
    float *dlogits;             /* [max_batch, classes] */
    int batch, training, have_loss;
    dt_net_hooks hooks;         /* around each layer with parameters (dt_net_set_hooks) */
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
    net->max_batch = max_batch;
    net->n_layers = spec->n_layers;
    net->n_params = n_params;
    rc = DT_ENOMEM;
    net->layers = dt_calloc((size_t)net->n_layers, sizeof *net->layers, "layers", err);
    dt_layer_shape *shapes = dt_calloc((size_t)net->n_layers, sizeof *shapes, "layer shapes", err);
    net->views = dt_calloc(2 * (size_t)net->n_layers, sizeof *net->views, "parameter views", err);
    if (!net->layers || !shapes || !net->views) goto fail;
    if ((rc = dt_model_spec_shapes(&net->spec, shapes, NULL, err))) goto fail;
    rc = DT_ENOMEM;

    size_t offset = 0, max_in = 0, scratch = 0, mb = (size_t)max_batch;
    int input_owned = 0; /* is the current activation a net-owned buffer (not the caller's x)? */
    net->first_param_layer = -1;
    for (int i = 0; i < net->n_layers; i++) {
        layer *L = &net->layers[i];
        const dt_layer_spec *ls = &net->spec.layers[i];
        const dt_layer_shape *s = &shapes[i];
        L->spec = ls;
        L->shape = *s;
        L->in_size = (size_t)s->in_h * (size_t)s->in_w * (size_t)s->in_c;
        L->out_size = (size_t)s->out_h * (size_t)s->out_w * (size_t)s->out_c;
        L->w_view = L->b_view = -1;
        if (s->n_weights) {
            if (net->first_param_layer < 0) net->first_param_layer = i;
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
        if (i > net->first_param_layer && net->first_param_layer >= 0 && L->in_size > max_in)
            max_in = L->in_size;
        L->in_place = ls->kind == DT_LAYER_FLATTEN || (ls->kind == DT_LAYER_RELU && input_owned);
        if (!L->in_place) {
            L->own = dt_alloc_floats(mb * L->out_size, ls->name, err);
            if (!L->own) goto fail;
            input_owned = 1;
        }
        if (ls->kind == DT_LAYER_MAXPOOL) {
            L->argmax = dt_calloc(mb * L->out_size, sizeof *L->argmax, "maxpool argmax", err);
            if (!L->argmax) goto fail;
        } else if (ls->kind == DT_LAYER_DROPOUT) {
            L->mask = dt_calloc(mb * L->out_size, 1, "dropout mask", err);
            if (!L->mask) goto fail;
        } else if (ls->kind == DT_LAYER_CONV2D) {
            size_t sc = conv2d_scratch_floats(&s->win, max_batch);
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
    net->dlogits = dt_alloc_floats(mb * (size_t)classes, "logit gradients", err);
    net->scratch = dt_alloc_floats(scratch, "convolution scratch", err);
    net->dbuf[0] = dt_alloc_floats(mb * max_in, "activation gradients", err);
    net->dbuf[1] = dt_alloc_floats(mb * max_in, "activation gradients", err);
    if (!net->params || !net->grads || !net->dlogits || !net->scratch || !net->dbuf[0] || !net->dbuf[1])
        goto fail;
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
    if (net->layers)
        for (int i = 0; i < net->n_layers; i++) {
            free(net->layers[i].own);
            free(net->layers[i].argmax);
            free(net->layers[i].mask);
        }
    free(net->layers);
    free(net->views);
    free(net->params);
    free(net->grads);
    free(net->scratch);
    free(net->dbuf[0]);
    free(net->dbuf[1]);
    free(net->dlogits);
    dt_model_spec_free(&net->spec);
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

int dt_net_num_layers(const dt_net *net) { return net->n_layers; }

/* A layer's kernel and bias are adjacent in the flat buffer (dt_net_build). */
int dt_net_layer_params(const dt_net *net, int i, size_t *offset, size_t *count) {
    const layer *L = &net->layers[i];
    int first = L->w_view >= 0 ? L->w_view : L->b_view, last = L->b_view >= 0 ? L->b_view : L->w_view;
    if (first < 0) return 0;
    *offset = net->views[first].offset;
    *count = net->views[last].offset + net->views[last].count - *offset;
    return 1;
}

static const float *view_ptr(const float *base, const dt_net *net, int v) {
    return v >= 0 ? base + net->views[v].offset : NULL;
}

const float *dt_net_forward(dt_net *net, const float *x, int batch, int training, uint64_t seed) {
    if (batch < 1 || batch > net->max_batch) return NULL;
    net->batch = batch;
    net->training = training;
    net->have_loss = 0;
    const float *in = x;
    for (int i = 0; i < net->n_layers; i++) {
        layer *L = &net->layers[i];
        const dt_layer_spec *s = L->spec;
        size_t n = (size_t)batch * L->out_size;
        L->in = in;
        /* An in-place layer writes only into the net's own buffers (see dt_net_build). */
        L->out = L->in_place ? (float *)in : L->own;
        size_t po, pc;
        if (net->hooks.before_forward && dt_net_layer_params(net, i, &po, &pc))
            net->hooks.before_forward(net->hooks.user, po, pc); /* e.g. wait until they have arrived */
        const float *w = view_ptr(net->params, net, L->w_view), *b = view_ptr(net->params, net, L->b_view);
        switch (s->kind) {
        case DT_LAYER_CONV2D: conv2d_forward(L->out, in, w, b, batch, &L->shape.win, net->scratch); break;
        case DT_LAYER_MAXPOOL: maxpool_forward(L->out, L->argmax, in, batch, &L->shape.win); break;
        case DT_LAYER_RELU: relu_forward(L->out, in, n); break;
        case DT_LAYER_DROPOUT:
            if (training && s->rate > 0)
                dropout_forward(L->out, L->mask, in, n, s->rate, dt_hash64(seed, (uint64_t)i));
            else
                memcpy(L->out, in, n * sizeof *in);
            break;
        case DT_LAYER_FLATTEN: break;
        case DT_LAYER_DENSE:
            dense_forward(L->out, in, w, b, batch, L->shape.in_c, L->shape.out_c);
            break;
        }
        in = L->out;
    }
    return in;
}

float dt_net_loss(dt_net *net, const int32_t *labels, int *correct) {
    const layer *last = &net->layers[net->n_layers - 1];
    net->have_loss = 1;
    return softmax_xent(net->dlogits, last->out, labels, net->batch, last->shape.out_c, correct);
}

void dt_net_backward(dt_net *net) {
    if (!net->have_loss || net->batch < 1) return;
    int batch = net->batch;
    float *dcur = net->dlogits;
    for (int i = net->n_layers - 1; i >= net->first_param_layer; i--) {
        layer *L = &net->layers[i];
        const dt_layer_spec *s = L->spec;
        size_t n = (size_t)batch * L->out_size;
        /* The first layer with parameters needs no input gradient: nothing before it learns. */
        float *din = i > net->first_param_layer ? (dcur == net->dbuf[0] ? net->dbuf[1] : net->dbuf[0]) : NULL;
        const float *w = view_ptr(net->params, net, L->w_view);
        float *dw = L->w_view >= 0 ? net->grads + net->views[L->w_view].offset : NULL;
        float *db = L->b_view >= 0 ? net->grads + net->views[L->b_view].offset : NULL;
        switch (s->kind) {
        case DT_LAYER_CONV2D:
            conv2d_backward(din, dw, db, dcur, L->in, w, batch, &L->shape.win, net->scratch);
            dcur = din;
            break;
        case DT_LAYER_DENSE:
            dense_backward(din, dw, db, dcur, L->in, w, batch, L->shape.in_c, L->shape.out_c);
            dcur = din;
            break;
        case DT_LAYER_MAXPOOL:
            maxpool_backward(din, dcur, L->argmax, batch, &L->shape.win);
            dcur = din;
            break;
        case DT_LAYER_RELU: relu_backward(dcur, dcur, L->out, n); break;
        case DT_LAYER_DROPOUT:
            if (net->training && s->rate > 0) {
                dropout_backward(din, dcur, L->mask, n, s->rate);
                dcur = din;
            }
            break;
        case DT_LAYER_FLATTEN: break;
        }
        size_t po, pc;
        if (net->hooks.after_backward && dt_net_layer_params(net, i, &po, &pc))
            net->hooks.after_backward(net->hooks.user, po, pc); /* e.g. push this gradient now */
    }
}
