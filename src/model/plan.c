/* A net's execution plan: the list of steps a forward runs in order and a backward runs last first
 * (dt_net_forward and dt_net_backward are plain loops over it, net.c). A step is one layer, or two
 * run as one where that saves a pass over memory:
 *
 *   conv2d+batchnorm     evaluation: the norm folded into the convolution's kernel and bias, when
 *                        nothing else reads the convolution's output (one pass instead of two);
 *   batchnorm+relu       the ReLU after a norm, run in place over its output, applied in the norm's
 *                        pass, and its mask applied as the norm's backward reads the gradient;
 *   add+relu             the same after a residual sum (the ReLU's backward runs just before the
 *                        sum's);
 *   batchnorm (stats) +  training: a norm read only by a sum, as its input 0, computes its
 *   batchnorm+add[+relu] statistics only, and the sum applies it as it adds (one pass writes norm
 *                        + shortcut, instead of the norm writing its output and the sum reading it).
 *
 * Evaluation and training have a plan each (net->plans): they differ by the folding, the norm
 * applied by the sum, batch norm's statistics and dropout. A ReLU's work moves to the step of the
 * layer it follows only when it runs in place and hands its gradient buffer down in place, so
 * nothing in between can touch either buffer (plan_gradients). Every fused step gives its parts'
 * results to float rounding (tests/test_plan.c), and `dtrain inspect MODEL` prints both plans.
 *
 * Also here: the memory plan's aliases (plan_may_run_in_place) and backward's gradient buffers
 * (plan_gradients), which the fusions depend on. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/assert.h"
#include "core/rng.h"
#include "model/net_impl.h"

/* ---- the memory plan ---- */

/* Gradient of a layer's input computed in place over the gradient of its output (element-wise
 * backward), so the output's gradient buffer can simply be handed down. */
static int backward_in_place(dt_layer_kind k) {
    return k == DT_LAYER_RELU || k == DT_LAYER_LEAKY_RELU || k == DT_LAYER_SIGMOID || k == DT_LAYER_TANH ||
           k == DT_LAYER_DROPOUT || k == DT_LAYER_FLATTEN || k == DT_LAYER_BATCHNORM || k == DT_LAYER_ADD;
}

/* ReLU (or leaky ReLU) may overwrite its input j when the buffer is the net's own, nothing but this
 * layer reads any layer aliasing it, and the layer owning it does not need its own output in
 * backward (sigmoid and tanh do; relu's sign test survives a second relu). */
int plan_may_run_in_place(const dt_net *net, int j) {
    while (j >= 0) {
        const layer *P = &net->layers[j];
        if (P->consumers != 1) return 0;
        if (!P->in_place) return P->spec->kind != DT_LAYER_SIGMOID && P->spec->kind != DT_LAYER_TANH;
        j = P->in_idx[0];
    }
    return 0; /* the caller's input */
}

/* Hands out gradient buffers in backward order, reusing those whose layer is done: for a stack
 * that is a ping-pong between two buffers; a residual sum keeps one more alive. */
int plan_gradients(dt_net *net) {
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

/* ---- what the steps share ---- */

static size_t elems(const dt_net *net, const layer *L) { return (size_t)net->batch * L->out_size; }
static size_t rows_of(const dt_net *net, const layer *L) {
    return (size_t)net->batch * L->shape.out_h * L->shape.out_w;
}
/* A view in what the kernels read (device copies on a device), its gradient, its host values. */
static const float *kview(const dt_net *net, int v) { return v >= 0 ? net->kparams + net->views[v].offset : NULL; }
static float *kgrad(const dt_net *net, int v) { return v >= 0 ? net->kgrads + net->views[v].offset : NULL; }
static float *host_view(const dt_net *net, int v) { return v >= 0 ? net->params + net->views[v].offset : NULL; }
static float *dout_of(const dt_net *net, const layer *L) { return net->gbufs[L->gbuf]; }

/* Where layer L's backward writes the gradient of input k: straight into the input's buffer, or
 * into a spare one (acc) that is then added to it; NULL where nothing before that input learns
 * (the first conv). */
static float *din_target(const dt_net *net, const layer *L, int k, float *dcur) {
    if (L->dst[k] < 0) return NULL;
    if (!L->acc[k]) return net->gbufs[L->dst[k]];
    return backward_in_place(L->spec->kind) ? dcur : net->gbufs[L->tmp];
}

/* An input another layer already gave a gradient gets this one's added (add and concat do their
 * own). */
static void accumulate(dt_net *net, const layer *L, float *din) {
    if (!din || !L->acc[0]) return;
    float *g = net->gbufs[L->dst[0]];
    net->k.ops->add_forward(net->k.ctx, g, g, din, (size_t)net->batch * L->in_size, 0);
}

/* ---- single layers ---- */

static void conv_fwd(dt_net *net, layer *L, layer *F) {
    net->k.ops->conv2d_forward(net->k.ctx, L->out, L->in[0], kview(net, L->w_view), kview(net, L->b_view),
                               net->batch, &L->shape.win, net->scratch);
}
static void conv_bwd(dt_net *net, layer *L, layer *F) {
    float *dcur = dout_of(net, L), *din = din_target(net, L, 0, dcur);
    net->k.ops->conv2d_backward(net->k.ctx, din, kgrad(net, L->w_view), kgrad(net, L->b_view), dcur, L->in[0],
                                kview(net, L->w_view), net->batch, &L->shape.win, net->scratch);
    accumulate(net, L, din);
}
static void dense_fwd(dt_net *net, layer *L, layer *F) {
    net->k.ops->dense_forward(net->k.ctx, L->out, L->in[0], kview(net, L->w_view), kview(net, L->b_view),
                              net->batch, L->shape.in_c, L->shape.out_c);
}
static void dense_bwd(dt_net *net, layer *L, layer *F) {
    float *dcur = dout_of(net, L), *din = din_target(net, L, 0, dcur);
    net->k.ops->dense_backward(net->k.ctx, din, kgrad(net, L->w_view), kgrad(net, L->b_view), dcur, L->in[0],
                               kview(net, L->w_view), net->batch, L->shape.in_c, L->shape.out_c);
    accumulate(net, L, din);
}
/* Pooling: forward, and the gradient spread back over the windows. */
static void pool_fwd(dt_net *net, layer *L, layer *F) {
    const dt_backend_ops *o = net->k.ops;
    const dt_window *g = &L->shape.win;
    int hw = L->shape.in_h * L->shape.in_w;
    switch (L->spec->kind) {
    case DT_LAYER_MAXPOOL: o->maxpool_forward(net->k.ctx, L->out, L->argmax, L->in[0], net->batch, g); break;
    case DT_LAYER_AVGPOOL: o->avgpool_forward(net->k.ctx, L->out, L->in[0], net->batch, g); break;
    default: o->global_avgpool_forward(net->k.ctx, L->out, L->in[0], net->batch, hw, L->shape.in_c); break;
    }
}
static void pool_bwd(dt_net *net, layer *L, layer *F) {
    const dt_backend_ops *o = net->k.ops;
    const dt_window *g = &L->shape.win;
    int hw = L->shape.in_h * L->shape.in_w;
    float *dcur = dout_of(net, L), *din = din_target(net, L, 0, dcur);
    if (!din) return;
    switch (L->spec->kind) {
    case DT_LAYER_MAXPOOL: o->maxpool_backward(net->k.ctx, din, dcur, L->argmax, net->batch, g); break;
    case DT_LAYER_AVGPOOL: o->avgpool_backward(net->k.ctx, din, dcur, net->batch, g); break;
    default: o->global_avgpool_backward(net->k.ctx, din, dcur, net->batch, hw, L->shape.in_c); break;
    }
    accumulate(net, L, din);
}

/* Activations, element by element: out = f(in); backward reads out (which is in's sign for the
 * ReLUs, so they may run in place). */
static void act_fwd(dt_net *net, layer *L, layer *F) {
    const dt_backend_ops *o = net->k.ops;
    size_t n = elems(net, L);
    switch (L->spec->kind) {
    case DT_LAYER_RELU: o->relu_forward(net->k.ctx, L->out, L->in[0], n); break;
    case DT_LAYER_LEAKY_RELU: o->leaky_relu_forward(net->k.ctx, L->out, L->in[0], n, L->spec->alpha); break;
    case DT_LAYER_SIGMOID: o->sigmoid_forward(net->k.ctx, L->out, L->in[0], n); break;
    default: o->tanh_forward(net->k.ctx, L->out, L->in[0], n); break;
    }
}
static void act_bwd(dt_net *net, layer *L, layer *F) {
    const dt_backend_ops *o = net->k.ops;
    size_t n = elems(net, L);
    float *dcur = dout_of(net, L), *din = din_target(net, L, 0, dcur);
    if (!din) return;
    switch (L->spec->kind) {
    case DT_LAYER_RELU: o->relu_backward(net->k.ctx, din, dcur, L->out, n); break;
    case DT_LAYER_LEAKY_RELU: o->leaky_relu_backward(net->k.ctx, din, dcur, L->out, n, L->spec->alpha); break;
    case DT_LAYER_SIGMOID: o->sigmoid_backward(net->k.ctx, din, dcur, L->out, n); break;
    default: o->tanh_backward(net->k.ctx, din, dcur, L->out, n); break;
    }
    accumulate(net, L, din);
}
static void dropout_fwd(dt_net *net, layer *L, layer *F) {
    net->k.ops->dropout_forward(net->k.ctx, L->out, L->mask, L->in[0], elems(net, L), L->spec->rate,
                                dt_hash64(net->seed, (uint64_t)(L - net->layers)));
}
static void dropout_bwd(dt_net *net, layer *L, layer *F) {
    float *dcur = dout_of(net, L), *din = din_target(net, L, 0, dcur);
    if (din) net->k.ops->dropout_backward(net->k.ctx, din, dcur, L->mask, elems(net, L), L->spec->rate);
    accumulate(net, L, din);
}
/* Dropout in evaluation (or at rate 0): its output is its input. */
static void copy_fwd(dt_net *net, layer *L, layer *F) {
    net->k.buf->copy(net->k.ctx, L->out, L->in[0], elems(net, L) * sizeof(float));
}
/* Flatten (its output aliases its input) and dropout off: the gradient passes through. */
static void pass_bwd(dt_net *net, layer *L, layer *F) {
    float *dcur = dout_of(net, L), *din = din_target(net, L, 0, dcur);
    if (din && din != dcur) net->k.buf->copy(net->k.ctx, din, dcur, elems(net, L) * sizeof(float));
    accumulate(net, L, din);
}
static void concat_fwd(dt_net *net, layer *L, layer *F) {
    for (int q = 0, off = 0; q < L->n_in; q++) {
        int j = L->in_idx[q], c = j < 0 ? net->spec.in_c : net->layers[j].shape.out_c;
        net->k.ops->concat_forward(net->k.ctx, L->out, L->in[q], rows_of(net, L), c, L->shape.out_c, off);
        off += c;
    }
}
static void concat_bwd(dt_net *net, layer *L, layer *F) {
    float *dcur = dout_of(net, L);
    size_t rows = rows_of(net, L);
    for (int q = 0, off = 0; q < L->n_in; q++) {
        int j = L->in_idx[q], c = j < 0 ? net->spec.in_c : net->layers[j].shape.out_c;
        float *d = din_target(net, L, q, dcur);
        if (d) {
            net->k.ops->concat_backward(net->k.ctx, d, dcur, rows, c, L->shape.out_c, off);
            if (L->acc[q]) {
                float *g = net->gbufs[L->dst[q]];
                net->k.ops->add_forward(net->k.ctx, g, g, d, rows * (size_t)c, 0);
            }
        }
        off += c;
    }
}

/* ---- batch norm ---- */

/* Training: the batch's statistics, the output (out NULL: none, a sum applies the norm), then the
 * moving averages: moving = momentum * moving + (1 - momentum) * batch, with the unbiased variance
 * (as Keras's fused batch norm and PyTorch). Scale and shift go where evaluation keeps its own (it
 * recomputes them): the sum and the backward's ReLU mask read them there. */
static void norm_train(dt_net *net, layer *L, float *out, int relu) {
    int C = L->shape.out_c;
    size_t rows = rows_of(net, L);
    float *mean = L->bn, *var = L->bn + C, *inv_std = L->bn + 2 * C;
    net->k.ops->batchnorm_forward(net->k.ctx, out, mean, var, inv_std, L->bn + 3 * C, L->bn + 4 * C, L->in[0],
                                  kview(net, L->w_view), kview(net, L->b_view), rows, C, L->spec->epsilon, relu,
                                  net->bn_work);
    float *mm = host_view(net, L->mm_view), *mv = host_view(net, L->mv_view), m = L->spec->momentum;
    double unbias = rows > 1 ? (double)rows / (double)(rows - 1) : 1.0;
    for (int c = 0; c < C; c++) {
        mm[c] = m * mm[c] + (1 - m) * mean[c];
        mv[c] = m * mv[c] + (1 - m) * (float)(var[c] * unbias);
    }
}

/* relu: the ReLU after the norm ran in its forward; its mask is applied to the gradient here,
 * recomputed from the input with forward's scale and shift. */
static void norm_backward(dt_net *net, layer *L, int relu) {
    int C = L->shape.out_c;
    float *dcur = dout_of(net, L), *din = din_target(net, L, 0, dcur);
    const float *scale = relu ? L->bn + 3 * C : NULL, *shift = relu ? L->bn + 4 * C : NULL;
    net->k.ops->batchnorm_backward(net->k.ctx, din, kgrad(net, L->w_view), kgrad(net, L->b_view), dcur, L->in[0],
                                   L->bn, L->bn + 2 * C, kview(net, L->w_view), scale, shift, rows_of(net, L), C,
                                   net->bn_work);
    net->k.buf->zero(net->k.ctx, kgrad(net, L->mm_view), 2 * (size_t)C * sizeof(float)); /* not trained */
    accumulate(net, L, din);
}

/* Evaluation as y = x * scale + shift per channel, from the moving statistics. */
static void norm_eval_affine(const dt_net *net, const layer *B, float *scale, float *shift) {
    const float *gamma = host_view(net, B->w_view), *beta = host_view(net, B->b_view);
    const float *mm = host_view(net, B->mm_view), *mv = host_view(net, B->mv_view);
    for (int c = 0; c < B->shape.out_c; c++) {
        scale[c] = gamma[c] / sqrtf(mv[c] + B->spec->epsilon);
        shift[c] = beta[c] - mm[c] * scale[c];
    }
}

static void norm_eval(dt_net *net, layer *L, int relu) {
    int C = L->shape.out_c;
    float *scale = L->bn + 3 * C, *shift = L->bn + 4 * C;
    norm_eval_affine(net, L, scale, shift);
    net->k.ops->channel_affine_forward(net->k.ctx, L->out, L->in[0], scale, shift, rows_of(net, L), C, relu);
}

static void bn_fwd(dt_net *net, layer *L, layer *F) { norm_train(net, L, L->out, 0); }
static void bn_relu_fwd(dt_net *net, layer *L, layer *F) { norm_train(net, L, L->out, 1); } /* F's out is L's */
static void bn_stats_fwd(dt_net *net, layer *L, layer *F) { norm_train(net, L, NULL, 0); }
static void bn_bwd(dt_net *net, layer *L, layer *F) { norm_backward(net, L, 0); }
static void bn_relu_bwd(dt_net *net, layer *L, layer *F) { norm_backward(net, L, 1); }
static void bn_eval_fwd(dt_net *net, layer *L, layer *F) { norm_eval(net, L, 0); }
static void bn_relu_eval_fwd(dt_net *net, layer *L, layer *F) { norm_eval(net, L, 1); }

/* Conv L's kernel and bias with batch norm F folded in: w' = w * scale, b' = b * scale + shift
 * (scale, shift: F's evaluation affine, computed into those [out_c] buffers). */
static void fold_into(const dt_net *net, const layer *L, const layer *F, float *w, float *b, float *scale,
                      float *shift) {
    int oc = L->shape.out_c;
    norm_eval_affine(net, F, scale, shift);
    const float *kw = host_view(net, L->w_view), *kb = host_view(net, L->b_view);
    for (size_t r = 0; r < L->shape.n_weights / (size_t)oc; r++)
        for (int c = 0; c < oc; c++) w[r * oc + c] = kw[r * oc + c] * scale[c];
    for (int c = 0; c < oc; c++) b[c] = (kb ? kb[c] : 0.0f) * scale[c] + shift[c];
}

/* Evaluation: conv L with batch norm F folded in; F's output is L's. */
static void conv_bn_fwd(dt_net *net, layer *L, layer *F) {
    int oc = L->shape.out_c;
    float *w = L->fold_w, *b = L->fold_w + L->shape.n_weights, *scale = F->bn + 3 * oc, *shift = scale + oc;
    fold_into(net, L, F, w, b, scale, shift);
    net->k.ops->conv2d_forward(net->k.ctx, L->out, L->in[0], w, b, net->batch, &L->shape.win, net->scratch);
    F->out = L->out;
}

/* ---- click-log layers ---- */

/* Embedding: the batch's ids of the layer's fields hashed to rows of its tables, then each bag's
 * rows combined. */
static void emb_fwd(dt_net *net, layer *L, layer *F) {
    emb_state *e = L->emb;
    const dt_ctr_batch *b = net->ctr;
    const int nf = L->spec->n_fields;
    for (int i = 0; !e->uniq_ids && i < b->n; i++) /* compact tables: rows are slots, set already */
        for (int s = 0; s < nf; s++) {
            const int64_t *o = b->offsets + (int64_t)i * b->num_fields + e->field[s];
            for (int64_t j = o[0]; j < o[1]; j++)
                e->rows[j] = e->base[s] + (int64_t)dt_ctr_bucket((uint32_t)e->field[s], b->ids[j], (uint64_t)e->buckets);
        }
    e->bags = (dt_bags){.offsets = b->offsets, .num_fields = b->num_fields, .field = e->field, .n_fields = nf,
                        .rows = e->rows, .weights = b->values, .batch = b->n, .dim = L->spec->dim,
                        .mean = L->spec->mean};
    net->k.ops->embedding_forward(net->k.ctx, L->out, kview(net, e->table_view), &e->bags);
}

/* The tables' gradient: the rows the last backward touched are zeroed in the flat gradient, the
 * kernel sums this batch's rows, which go in their place (the rest of the flat gradient stays 0);
 * dt_net_table_grad lists them per table. */
static void emb_bwd(dt_net *net, layer *L, layer *F) {
    emb_state *e = L->emb;
    size_t dim = (size_t)L->spec->dim;
    float *g = kgrad(net, e->table_view);
    /* random rows of a table far larger than the caches: each asked for a few rows ahead */
    for (size_t u = 0; u < e->n_uniq; u++) {
        if (u + 8 < e->n_uniq) __builtin_prefetch(g + (size_t)e->uniq[u + 8] * dim, 1);
        memset(g + (size_t)e->uniq[u] * dim, 0, dim * sizeof *g);
    }
    e->n_uniq = net->k.ops->embedding_backward(net->k.ctx, e->uniq, e->ugrad, dout_of(net, L), &e->bags, e->scratch);
    for (size_t u = 0; u < e->n_uniq; u++) {
        if (u + 8 < e->n_uniq) __builtin_prefetch(g + (size_t)e->uniq[u + 8] * dim, 1);
        memcpy(g + (size_t)e->uniq[u] * dim, e->ugrad + u * dim, dim * sizeof *g);
    }
    /* per table: its range of uniq, and its rows counted from its own first */
    size_t u = 0;
    for (int t = 0; t < e->n_tables; t++) {
        int64_t lo = L->spec->shared ? 0 : (int64_t)t * e->table_rows;
        int64_t hi = L->spec->shared ? INT64_MAX : lo + e->table_rows;
        e->table_begin[t] = u;
        for (; u < e->n_uniq && e->uniq[u] < hi; u++) e->trows[u] = e->uniq[u] - lo;
    }
    e->table_begin[e->n_tables] = e->n_uniq;
}

static int emb_dim_of(const dt_net *net, const layer *L) { return net->layers[L->in_idx[0]].spec->dim; }

static void fm_fwd(dt_net *net, layer *L, layer *F) {
    int D = emb_dim_of(net, L);
    net->k.ops->fm_forward(net->k.ctx, L->out, L->in[0], net->batch, L->shape.in_c / D, D);
}
static void fm_bwd(dt_net *net, layer *L, layer *F) {
    int D = emb_dim_of(net, L);
    float *dcur = dout_of(net, L), *din = din_target(net, L, 0, dcur);
    if (!din) return;
    net->k.ops->fm_backward(net->k.ctx, din, dcur, L->in[0], net->batch, L->shape.in_c / D, D);
    accumulate(net, L, din);
}
static void rsum_fwd(dt_net *net, layer *L, layer *F) {
    net->k.ops->reduce_sum_forward(net->k.ctx, L->out, L->in[0], net->batch, L->shape.in_c);
}
static void rsum_bwd(dt_net *net, layer *L, layer *F) {
    float *dcur = dout_of(net, L), *din = din_target(net, L, 0, dcur);
    if (!din) return;
    net->k.ops->reduce_sum_backward(net->k.ctx, din, dcur, net->batch, L->shape.in_c);
    accumulate(net, L, din);
}

/* ---- residual sums ---- */

/* out = in 0 + in 1 + ..., the ReLU after it in the last pass if relu; norm: input 0 is a batch
 * norm whose statistics only were computed (bn_stats_fwd), applied here to its own input. */
static void sum(dt_net *net, layer *L, int relu, int norm) {
    size_t n = elems(net, L);
    int j = 1, C = L->shape.out_c;
    if (norm) {
        const layer *N = &net->layers[L->in_idx[0]];
        net->k.ops->channel_affine_add_forward(net->k.ctx, L->out, N->in[0], N->bn + 3 * C, N->bn + 4 * C, L->in[1],
                                               rows_of(net, L), C, relu && L->n_in == 2);
        j = 2;
    }
    for (; j < L->n_in; j++)
        net->k.ops->add_forward(net->k.ctx, L->out, j == 1 ? L->in[0] : L->out, L->in[j], n, relu && j == L->n_in - 1);
}

static void add_fwd(dt_net *net, layer *L, layer *F) { sum(net, L, 0, 0); }
static void add_relu_fwd(dt_net *net, layer *L, layer *F) { sum(net, L, 1, 0); } /* F's out is L's */
static void bn_add_fwd(dt_net *net, layer *L, layer *F) { sum(net, L, 0, 1); }
static void bn_add_relu_fwd(dt_net *net, layer *L, layer *F) { sum(net, L, 1, 1); }

static void add_bwd(dt_net *net, layer *L, layer *F) {
    float *dcur = dout_of(net, L);
    size_t n = elems(net, L);
    for (int q = 0; q < L->n_in; q++) {
        if (L->dst[q] < 0) continue;
        float *g = net->gbufs[L->dst[q]];
        if (L->acc[q]) net->k.ops->add_forward(net->k.ctx, g, g, dcur, n, 0);
        else if (g != dcur) net->k.buf->copy(net->k.ctx, g, dcur, n * sizeof *g);
    }
}
/* The ReLU's backward (in place over the gradient it hands the sum), then the sum's. */
static void add_relu_bwd(dt_net *net, layer *L, layer *F) {
    act_bwd(net, F, NULL);
    add_bwd(net, L, NULL);
}

/* ---- the steps ---- */

/* Each kind's ops, besides DT_OP_ADD (any step may add its input's gradient to another reader's)
 * and DT_OP_SOFTMAX_XENT (the loss), which a net needs of every backend. */
#define OPS1(a) {a, DT_OP_COUNT}
#define OPS2(a, b) {a, b, DT_OP_COUNT}
static const step_kind
    K_CONV = {"conv2d", conv_fwd, conv_bwd, OPS1(DT_OP_CONV2D), 0},
    K_CONV_BN = {"conv2d+batchnorm", conv_bn_fwd, NULL, OPS1(DT_OP_CONV2D), 1},
    K_DENSE = {"dense", dense_fwd, dense_bwd, OPS1(DT_OP_DENSE), 0},
    K_MAXPOOL = {"maxpool", pool_fwd, pool_bwd, OPS1(DT_OP_MAXPOOL), 0},
    K_AVGPOOL = {"avgpool", pool_fwd, pool_bwd, OPS1(DT_OP_AVGPOOL), 0},
    K_GAP = {"global_avgpool", pool_fwd, pool_bwd, OPS1(DT_OP_GLOBAL_AVGPOOL), 0},
    K_RELU = {"relu", act_fwd, act_bwd, OPS1(DT_OP_RELU), 0},
    K_LEAKY = {"leaky_relu", act_fwd, act_bwd, OPS1(DT_OP_LEAKY_RELU), 0},
    K_SIGMOID = {"sigmoid", act_fwd, act_bwd, OPS1(DT_OP_SIGMOID), 0},
    K_TANH = {"tanh", act_fwd, act_bwd, OPS1(DT_OP_TANH), 0},
    K_DROPOUT = {"dropout", dropout_fwd, dropout_bwd, OPS1(DT_OP_DROPOUT), 0},
    K_IDENTITY = {"dropout (off: a copy)", copy_fwd, pass_bwd, OPS1(DT_OP_COUNT), 0},
    K_FLATTEN = {"flatten (an alias)", NULL, pass_bwd, OPS1(DT_OP_COUNT), 0},
    K_CONCAT = {"concat", concat_fwd, concat_bwd, OPS1(DT_OP_CONCAT), 0},
    K_EMBEDDING = {"embedding", emb_fwd, emb_bwd, OPS1(DT_OP_EMBEDDING), 1},
    K_FM = {"fm", fm_fwd, fm_bwd, OPS1(DT_OP_FM), 0},
    K_REDUCE_SUM = {"reduce_sum", rsum_fwd, rsum_bwd, OPS1(DT_OP_REDUCE_SUM), 0},
    K_ADD = {"add", add_fwd, add_bwd, OPS1(DT_OP_ADD), 0},
    K_ADD_RELU = {"add+relu", add_relu_fwd, add_relu_bwd, OPS2(DT_OP_ADD, DT_OP_RELU), 0},
    K_BN = {"batchnorm", bn_fwd, bn_bwd, OPS1(DT_OP_BATCHNORM), 1},
    K_BN_RELU = {"batchnorm+relu", bn_relu_fwd, bn_relu_bwd, OPS1(DT_OP_BATCHNORM), 1},
    K_BN_STATS = {"batchnorm (statistics)", bn_stats_fwd, bn_bwd, OPS1(DT_OP_BATCHNORM), 1},
    K_BN_ADD = {"batchnorm+add", bn_add_fwd, add_bwd, OPS1(DT_OP_CHANNEL_AFFINE_ADD), 1},
    K_BN_ADD_RELU = {"batchnorm+add+relu", bn_add_relu_fwd, add_relu_bwd,
                     OPS2(DT_OP_CHANNEL_AFFINE_ADD, DT_OP_RELU), 1},
    K_BN_EVAL = {"batchnorm", bn_eval_fwd, NULL, OPS1(DT_OP_CHANNEL_AFFINE), 1},
    K_BN_RELU_EVAL = {"batchnorm+relu", bn_relu_eval_fwd, NULL, OPS1(DT_OP_CHANNEL_AFFINE), 1};

/* The only layer reading layer i's output, or -1. */
static int only_reader(const dt_net *net, int i) {
    if (net->layers[i].consumers != 1) return -1;
    for (int r = i + 1; r < net->n_layers; r++)
        for (int q = 0; q < net->layers[r].n_in; q++)
            if (net->layers[r].in_idx[q] == i) return r;
    return -1;
}

/* The ReLU that runs in place over the output of norm or sum i, or -1. In training its backward
 * moves into i's step too, which needs it to hand its gradient buffer to i in place: then nothing
 * between the two can reuse that buffer. */
static int fused_relu(const dt_net *net, int i, int training) {
    int r = net->fuse ? only_reader(net, i) : -1;
    if (r < 0) return -1;
    const layer *R = &net->layers[r];
    if (R->spec->kind != DT_LAYER_RELU || !R->in_place || R->in_idx[0] != i) return -1;
    if (training && R->wants_grad && (R->dst[0] != R->gbuf || R->acc[0])) return -1;
    return r;
}

/* In training: a batch norm i read only by a sum, as its input 0 (the sum applies it). */
static int norm_into_sum(const dt_net *net, int i) {
    if (!net->fuse || i < 0 || net->layers[i].spec->kind != DT_LAYER_BATCHNORM) return 0;
    int r = only_reader(net, i);
    return r >= 0 && net->layers[r].spec->kind == DT_LAYER_ADD && net->layers[r].in_idx[0] == i;
}

/* Evaluation: the batch norm folded into conv i (the conv's only reader, when folding is on), or -1. */
static int folded_norm(const dt_net *net, int i) {
    int r = net->fuse && net->fold_bn ? only_reader(net, i) : -1;
    return r >= 0 && net->layers[r].spec->kind == DT_LAYER_BATCHNORM && net->layers[i].fold_w ? r : -1;
}

int dt_net_folded_batchnorm(const dt_net *net, int i) {
    if (i < 0 || i >= net->n_layers || net->layers[i].spec->kind != DT_LAYER_CONV2D) return -1;
    return folded_norm(net, i);
}

void dt_net_fold_conv(const dt_net *net, int i, float *w, float *b, float *scratch) {
    const layer *L = &net->layers[i];
    int f = folded_norm(net, i);
    if (!DT_ASSERT(f >= 0)) return;
    fold_into(net, L, &net->layers[f], w, b, scratch, scratch + L->shape.out_c);
}

static const step_kind *single_kind(dt_layer_kind kind) {
    switch (kind) {
    case DT_LAYER_CONV2D: return &K_CONV;
    case DT_LAYER_DENSE: return &K_DENSE;
    case DT_LAYER_MAXPOOL: return &K_MAXPOOL;
    case DT_LAYER_AVGPOOL: return &K_AVGPOOL;
    case DT_LAYER_GLOBAL_AVGPOOL: return &K_GAP;
    case DT_LAYER_RELU: return &K_RELU;
    case DT_LAYER_LEAKY_RELU: return &K_LEAKY;
    case DT_LAYER_SIGMOID: return &K_SIGMOID;
    case DT_LAYER_TANH: return &K_TANH;
    case DT_LAYER_DROPOUT: return &K_DROPOUT;
    case DT_LAYER_FLATTEN: return &K_FLATTEN;
    case DT_LAYER_CONCAT: return &K_CONCAT;
    case DT_LAYER_ADD: return &K_ADD;
    case DT_LAYER_BATCHNORM: return &K_BN;
    case DT_LAYER_EMBEDDING: return &K_EMBEDDING;
    case DT_LAYER_FM: return &K_FM;
    case DT_LAYER_REDUCE_SUM: return &K_REDUCE_SUM;
    }
    return NULL;
}

/* The step that starts at layer i (*fused: the layer it also runs, or -1). */
static const step_kind *choose(const dt_net *net, int i, int training, int *fused) {
    const layer *L = &net->layers[i];
    *fused = -1;
    switch (L->spec->kind) {
    case DT_LAYER_CONV2D:
        if (!training && (*fused = folded_norm(net, i)) >= 0) return &K_CONV_BN;
        return &K_CONV;
    case DT_LAYER_DROPOUT: return training && L->spec->rate > 0 ? &K_DROPOUT : &K_IDENTITY;
    case DT_LAYER_BATCHNORM:
        if (training && norm_into_sum(net, i)) return &K_BN_STATS;
        if ((*fused = fused_relu(net, i, training)) >= 0) return training ? &K_BN_RELU : &K_BN_RELU_EVAL;
        return training ? &K_BN : &K_BN_EVAL;
    case DT_LAYER_ADD: {
        int norm = training && norm_into_sum(net, L->in_idx[0]), relu = (*fused = fused_relu(net, i, training)) >= 0;
        return norm ? (relu ? &K_BN_ADD_RELU : &K_BN_ADD) : (relu ? &K_ADD_RELU : &K_ADD);
    }
    default: return single_kind(L->spec->kind);
    }
}

void plan_build(dt_net *net, int which) {
    net_plan *p = &net->plans[which];
    char covered[DT_MODEL_MAX_LAYERS] = {0};
    int broken = 0;
    p->n = 0;
    for (int i = 0; i < net->n_layers; i++) {
        if (covered[i]) continue;
        dt_net_step *s = &p->steps[p->n++];
        s->layer = i;
        s->kind = choose(net, i, which == PLAN_TRAIN, &s->fused);
        if (s->fused >= 0) covered[s->fused] = 1;
        /* a ReLU fused into a norm or sum gets its gradient buffer (backward reads the norm's) */
        if (!DT_ASSERT(s->fused < 0 || s->kind == &K_CONV_BN || net->layers[s->fused].gbuf == net->layers[i].gbuf ||
                       !net->layers[i].wants_grad))
            broken = 1;
    }
    if (broken && net->fuse) { /* the fusion is refused: every layer its own step */
        net->fuse = 0;
        plan_build(net, which);
    }
}

static int step_runs_on(const dt_net_step *s, const dt_backend *b) {
    if (s->kind->host && b->buf->on_device) return 0;
    for (const dt_op *op = s->kind->ops; *op != DT_OP_COUNT; op++)
        if (!b->ops->supports(b->ctx, *op)) return 0;
    return 1;
}

const dt_net_step *plan_unsupported(const dt_net *net, const dt_backend *b, int *layer_out) {
    for (int which = PLAN_TRAIN; which >= PLAN_EVAL; which--)
        for (int i = 0; i < net->plans[which].n; i++) {
            const dt_net_step *s = &net->plans[which].steps[i];
            if (step_runs_on(s, b)) continue;
            /* the layer at fault: a norm where the step holds one */
            int f = s->fused;
            *layer_out = f >= 0 && net->layers[f].spec->kind == DT_LAYER_BATCHNORM ? f : s->layer;
            return s;
        }
    return NULL;
}

/* ---- dtrain inspect ---- */

static void print_plan(const dt_net *net, int which, FILE *f) {
    const net_plan *p = &net->plans[which];
    int fused = 0;
    for (int i = 0; i < p->n; i++) fused += p->steps[i].fused >= 0 || p->steps[i].kind == &K_BN_ADD ||
                                            p->steps[i].kind == &K_BN_ADD_RELU;
    fprintf(f, "%s plan: %d steps for %d layers (%d fused)\n", which == PLAN_TRAIN ? "training" : "evaluation",
            p->n, net->n_layers, fused);
    for (int i = 0; i < p->n; i++) {
        const dt_net_step *s = &p->steps[i];
        const layer *L = &net->layers[s->layer];
        fprintf(f, "  %3d  %-24s %s", i + 1, s->kind->name, L->spec->name);
        if (s->fused >= 0) fprintf(f, ", %s", net->layers[s->fused].spec->name);
        if (s->kind == &K_BN_ADD || s->kind == &K_BN_ADD_RELU)
            fprintf(f, " (applies %s)", net->layers[L->in_idx[0]].spec->name);
        if (s->kind == &K_BN_STATS) fprintf(f, " (applied by %s)", net->layers[only_reader(net, s->layer)].spec->name);
        if (s->kind == &K_CONV_BN) fprintf(f, " (folded)");
        if (L->in_place && s->kind == &K_RELU) fprintf(f, " (in place)");
        fprintf(f, "\n");
    }
}

void dt_net_print_plan(const dt_net *net, FILE *f) {
    print_plan(net, PLAN_TRAIN, f);
    print_plan(net, PLAN_EVAL, f);
}
