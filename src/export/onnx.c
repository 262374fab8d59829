/* A dtrain net as an ONNX graph in evaluation form (docs/export.md): one node (rarely two or three)
 * per layer, in file order, which is an order where every input comes first.
 *
 * Layouts. ONNX defines Conv, the pools and BatchNormalization on NCHW tensors only, while dtrain's
 * activations are NHWC and its model input is fed NHWC. Each value is therefore tagged with its
 * layout and transposed only where an operator needs the other one: the model input and any NHWC
 * value once (cached) before the first spatial operator that reads it, and an NCHW value back to
 * NHWC before a flatten, so that flattening gives dtrain's (TensorFlow's) feature order and every
 * dense kernel is written as it is stored. Element-wise layers keep their input's layout. */
#include "export/onnx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

typedef enum { LAYOUT_NHWC, LAYOUT_NCHW, LAYOUT_FLAT } layout;

typedef struct value value;
struct value {
    const char *name;   /* the ONNX value */
    layout lay;
    const char *nchw;   /* an NHWC value's NCHW copy, once made */
    value *same;        /* a layer that passes its input through (dropout, a folded batch norm, a flatten
                         * of a flat input) is that value: no node */
};

typedef struct {
    ox_graph *g;
    dt_net *net;
    const dt_model_spec *spec;
    dt_layer_shape *shapes;
    value *vals;        /* [n_layers + 1]: vals[0] the model input, vals[i + 1] layer i's output */
    const char *axes[4]; /* int64 initializers [k], the axes operand of Unsqueeze and ReduceSum, once made */
} ctx;

/* The value a layer reads as input k, passthroughs resolved. */
static value *input_value(ctx *c, int i, int k) {
    value *v = &c->vals[dt_layer_input(&c->spec->layers[i], i, k) + 1];
    while (v->same) v = v->same;
    return v;
}

/* Layer i's output value name: its layer name, "logits" for the last layer (the graph's output),
 * and a name with ':' (which dtrain's names never have) where a layer's own name would clash. */
static const char *output_name(ctx *c, int i) {
    const char *name = c->spec->layers[i].name;
    if (i == c->spec->n_layers - 1) return DT_ONNX_LOGITS;
    if (!strcmp(name, DT_ONNX_LOGITS) || !strcmp(name, DT_ONNX_PROBS)) return ox_strf(c->g, "%s:out", name);
    return name;
}

static void transpose(ctx *c, const char *out, const char *in, const int64_t perm[4]) {
    Onnx__NodeProto *n = ox_node(c->g, "Transpose", out, 1, &in);
    ox_attr_ints(c->g, n, "perm", 4, perm);
}

/* v as an NCHW value, transposed (once) if it is NHWC. */
static const char *as_nchw(ctx *c, value *v) {
    static const int64_t to_nchw[4] = {0, 3, 1, 2};
    if (v->lay == LAYOUT_NCHW) return v->name;
    if (!v->nchw) {
        v->nchw = ox_strf(c->g, "%s:nchw", v->name);
        if (v->nchw) transpose(c, v->nchw, v->name, to_nchw);
    }
    return v->nchw;
}

static void set_output(ctx *c, int i, const char *name, layout lay) {
    c->vals[i + 1] = (value){.name = name, .lay = lay};
}

/* ONNX's pads [top, left, bottom, right] from dtrain's window: TensorFlow's SAME puts the odd cell at
 * the bottom or right, so the pads are explicit (ONNX's SAME_UPPER is deprecated and not read alike
 * everywhere); VALID's uncovered last rows (floor) are no padding. */
static void window_attrs(ctx *c, Onnx__NodeProto *n, const dt_window *w) {
    int64_t bottom = (int64_t)(w->out_h - 1) * w->stride_h + w->k_h - w->in_h - w->pad_top;
    int64_t right = (int64_t)(w->out_w - 1) * w->stride_w + w->k_w - w->in_w - w->pad_left;
    int64_t kernel[2] = {w->k_h, w->k_w}, strides[2] = {w->stride_h, w->stride_w};
    int64_t pads[4] = {w->pad_top, w->pad_left, bottom > 0 ? bottom : 0, right > 0 ? right : 0};
    ox_attr_ints(c->g, n, "kernel_shape", 2, kernel);
    ox_attr_ints(c->g, n, "strides", 2, strides);
    ox_attr_ints(c->g, n, "pads", 4, pads);
}

/* A parameter view of layer i by its suffix ("kernel", "bias", "gamma", ...); NULL, recorded as an
 * internal error, if the net has none (model/net.c names every view so). */
static const float *param(ctx *c, int i, const char *what) {
    char name[sizeof ((dt_param_view *)0)->name];
    snprintf(name, sizeof name, "%s/%s", c->spec->layers[i].name, what);
    for (int v = 0; v < dt_net_num_views(c->net); v++) {
        const dt_param_view *pv = dt_net_view(c->net, v);
        if (!strcmp(pv->name, name)) return dt_net_params(c->net) + pv->offset;
    }
    if (!c->g->rc) c->g->rc = dt_errorf(c->g->err, DT_EINVAL, "internal error: the net has no parameter %s", name);
    return NULL;
}

/* A 1-D initializer [n] copied from src. */
static void vector_init(ctx *c, const char *name, const float *src, int n) {
    int64_t dims[1] = {n};
    float *d = src ? ox_initializer(c->g, name, 1, dims) : NULL;
    if (d) memcpy(d, src, (size_t)n * sizeof *d);
}

/* Conv's kernel is OIHW; dtrain's is HWIO. */
static void hwio_to_oihw(float *dst, const float *src, int kh, int kw, int ci, int co) {
    for (int h = 0; h < kh; h++)
        for (int w = 0; w < kw; w++)
            for (int i = 0; i < ci; i++)
                for (int o = 0; o < co; o++)
                    dst[(((size_t)o * ci + i) * kh + h) * kw + w] = src[(((size_t)h * kw + w) * ci + i) * co + o];
}

/* A conv2d, with the batch norm that evaluation folds into it (the same folded kernel and bias,
 * from model/net.c), named "<conv>+<bn>/kernel" then. */
static void emit_conv(ctx *c, int i) {
    const dt_layer_spec *L = &c->spec->layers[i];
    const dt_layer_shape *s = &c->shapes[i];
    int bn = dt_net_folded_batchnorm(c->net, i), co = s->out_c;
    const char *prefix = bn >= 0 ? ox_strf(c->g, "%s+%s", L->name, c->spec->layers[bn].name) : L->name;
    const float *w = param(c, i, "kernel"), *b = L->use_bias ? param(c, i, "bias") : NULL;
    if (bn >= 0) {
        float *fw = ox_alloc(c->g, (s->n_weights + 3 * (size_t)co) * sizeof *fw);
        if (!fw) return;
        dt_net_fold_conv(c->net, i, fw, fw + s->n_weights, fw + s->n_weights + co);
        w = fw, b = fw + s->n_weights;
    }
    const char *in[3] = {as_nchw(c, input_value(c, i, 0)), prefix ? ox_strf(c->g, "%s/kernel", prefix) : NULL,
                         b && prefix ? ox_strf(c->g, "%s/bias", prefix) : NULL};
    int64_t dims[4] = {co, s->in_c, L->k_h, L->k_w}, dil[2] = {1, 1};
    float *k = in[1] && w ? ox_initializer(c->g, in[1], 4, dims) : NULL;
    if (!k || !in[0]) return;
    hwio_to_oihw(k, w, L->k_h, L->k_w, s->in_c, co);
    if (b) vector_init(c, in[2], b, co);
    Onnx__NodeProto *n = ox_node(c->g, "Conv", output_name(c, i), b ? 3 : 2, in);
    window_attrs(c, n, &s->win);
    ox_attr_ints(c->g, n, "dilations", 2, dil);
    ox_attr_int(c->g, n, "group", 1);
    set_output(c, i, n ? n->output[0] : NULL, LAYOUT_NCHW);
}

/* Max-pool pads act as minus infinity in ONNX as in dtrain; average pools leave padded cells out of
 * the count (count_include_pad = 0), which is TensorFlow's rule and dtrain's. */
static void emit_pool(ctx *c, int i, const char *op) {
    const char *in = as_nchw(c, input_value(c, i, 0));
    Onnx__NodeProto *n = in ? ox_node(c->g, op, output_name(c, i), 1, &in) : NULL;
    window_attrs(c, n, &c->shapes[i].win);
    if (!strcmp(op, "AveragePool")) ox_attr_int(c->g, n, "count_include_pad", 0);
    set_output(c, i, n ? n->output[0] : NULL, LAYOUT_NCHW);
}

/* GlobalAveragePool gives [N, C, 1, 1]; dtrain's global_avgpool a flat [C]. */
static void emit_global_avgpool(ctx *c, int i) {
    const char *in = as_nchw(c, input_value(c, i, 0));
    const char *pooled = ox_strf(c->g, "%s:pooled", c->spec->layers[i].name);
    Onnx__NodeProto *n = in && pooled ? ox_node(c->g, "GlobalAveragePool", pooled, 1, &in) : NULL;
    if (n) n = ox_node(c->g, "Flatten", output_name(c, i), 1, &pooled);
    ox_attr_int(c->g, n, "axis", 1);
    set_output(c, i, n ? n->output[0] : NULL, LAYOUT_FLAT);
}

/* relu, leaky_relu, sigmoid, tanh: any layout. */
static void emit_unary(ctx *c, int i, const char *op) {
    value *v = input_value(c, i, 0);
    const char *in = v->name;
    Onnx__NodeProto *n = ox_node(c->g, op, output_name(c, i), 1, &in);
    if (c->spec->layers[i].kind == DT_LAYER_LEAKY_RELU) ox_attr_float(c->g, n, "alpha", c->spec->layers[i].alpha);
    set_output(c, i, n ? n->output[0] : NULL, v->lay);
}

/* flatten: an NCHW input goes back to NHWC first unless the two orders agree (1x1 or one channel). */
static void emit_flatten(ctx *c, int i) {
    static const int64_t to_nhwc[4] = {0, 2, 3, 1};
    const dt_layer_shape *s = &c->shapes[i];
    value *v = input_value(c, i, 0);
    if (v->lay == LAYOUT_FLAT) {
        c->vals[i + 1].same = v;
        return;
    }
    const char *in = v->name;
    if (v->lay == LAYOUT_NCHW && s->in_h * s->in_w > 1 && s->in_c > 1) {
        in = ox_strf(c->g, "%s:nhwc", v->name);
        if (in) transpose(c, in, v->name, to_nhwc);
    }
    Onnx__NodeProto *n = in ? ox_node(c->g, "Flatten", output_name(c, i), 1, &in) : NULL;
    ox_attr_int(c->g, n, "axis", 1);
    set_output(c, i, n ? n->output[0] : NULL, LAYOUT_FLAT);
}

/* dense: Gemm with the kernel as B, stored [out, in] with transB = 1 (PyTorch's Linear form, the one
 * every reader takes: OpenCV 4.6 reads a Gemm without transB as if it were 1), the bias as C. */
static void emit_dense(ctx *c, int i) {
    const dt_layer_spec *L = &c->spec->layers[i];
    const dt_layer_shape *s = &c->shapes[i];
    const float *w = param(c, i, "kernel"), *b = L->use_bias ? param(c, i, "bias") : NULL;
    const char *in[3] = {input_value(c, i, 0)->name, ox_strf(c->g, "%s/kernel", L->name),
                         b ? ox_strf(c->g, "%s/bias", L->name) : NULL};
    int64_t dims[2] = {s->out_c, s->in_c};
    float *k = in[1] && w ? ox_initializer(c->g, in[1], 2, dims) : NULL;
    if (!k) return;
    for (size_t r = 0; r < (size_t)s->in_c; r++)
        for (size_t o = 0; o < (size_t)s->out_c; o++) k[o * (size_t)s->in_c + r] = w[r * (size_t)s->out_c + o];
    if (b && in[2]) vector_init(c, in[2], b, s->out_c);
    Onnx__NodeProto *n = ox_node(c->g, "Gemm", output_name(c, i), b ? 3 : 2, in);
    ox_attr_int(c->g, n, "transB", 1);
    set_output(c, i, n ? n->output[0] : NULL, LAYOUT_FLAT);
}

/* A batch norm evaluation folded into the conv before it is that conv's output; any other runs as
 * BatchNormalization with the moving statistics, on NCHW (per channel) or flat (per feature) input. */
static void emit_batchnorm(ctx *c, int i) {
    const dt_layer_spec *L = &c->spec->layers[i];
    int j = dt_layer_input(L, i, 0), C = c->shapes[i].out_c;
    if (j >= 0 && dt_net_folded_batchnorm(c->net, j) == i) {
        c->vals[i + 1].same = input_value(c, i, 0);
        return;
    }
    static const char *const parts[4] = {"gamma", "beta", "moving_mean", "moving_variance"};
    value *v = input_value(c, i, 0);
    const char *in[5] = {v->lay == LAYOUT_FLAT ? v->name : as_nchw(c, v)};
    for (int k = 0; k < 4; k++) {
        in[k + 1] = ox_strf(c->g, "%s/%s", L->name, parts[k]);
        if (in[k + 1]) vector_init(c, in[k + 1], param(c, i, parts[k]), C);
    }
    Onnx__NodeProto *n = in[0] ? ox_node(c->g, "BatchNormalization", output_name(c, i), 5, in) : NULL;
    ox_attr_float(c->g, n, "epsilon", L->epsilon);
    set_output(c, i, n ? n->output[0] : NULL, v->lay == LAYOUT_FLAT ? LAYOUT_FLAT : LAYOUT_NCHW);
}

/* add and concat: inputs in one layout (NCHW unless all share another); an add of more than two is a
 * chain of Adds in input order, which sums in dtrain's order. */
static void emit_join(ctx *c, int i) {
    const dt_layer_spec *L = &c->spec->layers[i];
    int n_in = dt_layer_n_inputs(L), mixed = 0;
    layout lay = input_value(c, i, 0)->lay;
    for (int k = 1; k < n_in; k++) mixed |= input_value(c, i, k)->lay != lay;
    if (mixed) lay = LAYOUT_NCHW;
    const char *in[DT_LAYER_MAX_INPUTS];
    for (int k = 0; k < n_in; k++) {
        value *v = input_value(c, i, k);
        in[k] = lay == LAYOUT_NCHW ? as_nchw(c, v) : v->name;
    }
    const char *out = output_name(c, i);
    Onnx__NodeProto *n = NULL;
    if (L->kind == DT_LAYER_CONCAT) {
        n = ox_node(c->g, "Concat", out, n_in, in);
        ox_attr_int(c->g, n, "axis", lay == LAYOUT_NHWC ? 3 : 1);
    }
    for (int k = 1; L->kind == DT_LAYER_ADD && k < n_in; k++) {
        const char *pair[2] = {k == 1 ? in[0] : n ? n->output[0] : NULL, in[k]};
        const char *sum = k == n_in - 1 ? out : ox_strf(c->g, "%s:sum%d", L->name, k);
        n = pair[0] && sum ? ox_node(c->g, "Add", sum, 2, pair) : NULL;
    }
    set_output(c, i, n ? n->output[0] : NULL, lay);
}

/* ---- click-log layers (docs/export.md, "Click-log models") ---------------------------------------- */

/* The int64 initializer [axis] (":axis<k>"), made once: ReduceSum's and Unsqueeze's axes are inputs
 * since opset 13. */
static const char *axis_const(ctx *c, int k) {
    if (!c->axes[k]) {
        int64_t v[1] = {k};
        c->axes[k] = ox_strf(c->g, ":axis%d", k);
        if (c->axes[k]) ox_initializer_i64(c->g, c->axes[k], 1, v);
    }
    return c->axes[k];
}

/* A float scalar initializer. */
static const char *scalar_const(ctx *c, const char *name, float v) {
    float *d = ox_initializer(c->g, name, 0, NULL);
    if (d) *d = v;
    return name;
}

static Onnx__NodeProto *reduce_sum(ctx *c, const char *out, const char *in, int axis, int keepdims) {
    const char *ins[2] = {in, axis_const(c, axis)};
    Onnx__NodeProto *n = in ? ox_node(c->g, "ReduceSum", out, 2, ins) : NULL;
    ox_attr_int(c->g, n, "keepdims", keepdims);
    return n;
}

static const char *binary(ctx *c, const char *op, const char *out, const char *a, const char *b) {
    const char *ins[2] = {a, b};
    Onnx__NodeProto *n = a && b && out ? ox_node(c->g, op, out, 2, ins) : NULL;
    return n ? n->output[0] : NULL;
}

/* embedding: the graph inputs "<layer>:rows" (int64 [batch, fields, ids], each id's row after hashing:
 * dt_ctr_bucket) and "<layer>:values" (float [batch, fields, ids], each id's value, 0 where a field
 * has fewer ids than the tensor's ids dimension: padding). Each field's rows are gathered from its
 * table (the checkpoint's own array, not a copy), weighted by the values and summed over the ids;
 * a mean divides by the values' sum, 0 where that is 0 (dtrain's and TensorFlow's empty bag). The
 * output is [batch, fields * dim], field after field, as dtrain's. */
static void emit_embedding(ctx *c, int i) {
    const dt_layer_spec *L = &c->spec->layers[i];
    const char *nm = L->name;
    const char *rows = ox_strf(c->g, "%s" DT_ONNX_ROWS, nm), *vals = ox_strf(c->g, "%s" DT_ONNX_VALUES, nm);
    int F = L->n_fields, s = 0;
    int64_t dims[2] = {L->buckets, L->dim};
    /* a table of unbounded ids, or a compact net's block of one batch's rows, is not the table */
    if (!L->buckets || dt_net_compact_tables(c->net)) {
        if (!c->g->rc)
            c->g->rc = dt_errorf(c->g->err, DT_EINVAL, "%s:%d: embedding %s: %s", c->spec->source, L->line, nm,
                                 L->buckets ? "the net holds blocks of a batch's rows (a compact net), not its tables"
                                            : "unbounded ids (capacity=) have no table of rows to export");
        return;
    }
    const char *gathered = ox_strf(c->g, "%s:gathered", nm);
    if (L->shared) {
        const char *table = ox_strf(c->g, "%s/embeddings", nm), *in[2] = {table, rows};
        if (table) ox_initializer_ref(c->g, table, 2, dims, param(c, i, "embeddings"));
        if (gathered && rows) ox_node(c->g, "Gather", gathered, 2, in);
    } else {
        /* one table per field: the rows split per field ([batch, 1, ids] each), a Gather from each
         * field's table ([batch, 1, ids, dim]), concatenated along the fields */
        const char **parts = ox_alloc(c->g, (size_t)F * sizeof *parts);
        const char **got = ox_alloc(c->g, (size_t)F * sizeof *got);
        const char **tables = ox_alloc(c->g, (size_t)F * sizeof *tables);
        int64_t *ones = ox_alloc(c->g, (size_t)F * sizeof *ones);
        if (!parts || !got || !tables || !ones) return;
        for (int f = 0; f < DT_MODEL_MAX_FIELDS && s < F; f++) {
            if (!dt_layer_has_field(L, f)) continue;
            const char *what = ox_strf(c->g, "embeddings_%d", f);
            tables[s] = ox_strf(c->g, "%s/%s", nm, what);
            if (tables[s]) ox_initializer_ref(c->g, tables[s], 2, dims, what ? param(c, i, what) : NULL);
            parts[s] = F == 1 ? rows : ox_strf(c->g, "%s:rows_%d", nm, f);
            got[s] = F == 1 ? gathered : ox_strf(c->g, "%s:gathered_%d", nm, f);
            ones[s++] = 1;
        }
        if (F > 1) {
            const char *split = ox_strf(c->g, "%s:split", nm), *in[2] = {rows, split};
            if (split) ox_initializer_i64(c->g, split, F, ones);
            Onnx__NodeProto *n = rows && split ? ox_node_n(c->g, "Split", F, parts, 2, in) : NULL;
            ox_attr_int(c->g, n, "axis", 1);
        }
        for (s = 0; s < F && !ox_status(c->g); s++) {
            const char *gin[2] = {tables[s], parts[s]};
            ox_node(c->g, "Gather", got[s], 2, gin);
        }
        if (F > 1) {
            Onnx__NodeProto *n = ox_node(c->g, "Concat", gathered, F, got);
            ox_attr_int(c->g, n, "axis", 1);
        }
    }
    /* [batch, fields, ids, dim] x [batch, fields, ids, 1], summed over the ids */
    const char *uin[2] = {vals, axis_const(c, 3)}, *wcol = ox_strf(c->g, "%s:values_col", nm);
    if (vals && wcol) ox_node(c->g, "Unsqueeze", wcol, 2, uin);
    const char *weighted = binary(c, "Mul", ox_strf(c->g, "%s:weighted", nm), gathered, wcol);
    const char *bag = ox_strf(c->g, "%s:bags", nm);
    Onnx__NodeProto *n = bag ? reduce_sum(c, bag, weighted, 2, 0) : NULL;
    if (L->mean && n) {
        const char *total = ox_strf(c->g, "%s:value_sums", nm);  /* [batch, fields, 1] */
        reduce_sum(c, total, vals, 2, 1);
        const char *q = binary(c, "Div", ox_strf(c->g, "%s:means", nm), bag, total);
        const char *zero = scalar_const(c, ox_strf(c->g, "%s:zero", nm), 0.0f);
        const char *empty = binary(c, "Equal", ox_strf(c->g, "%s:empty", nm), total, zero);
        const char *win[3] = {empty, zero, q};
        bag = ox_strf(c->g, "%s:bags_mean", nm);
        n = empty && q && bag ? ox_node(c->g, "Where", bag, 3, win) : NULL;
    }
    n = n ? ox_node(c->g, "Flatten", output_name(c, i), 1, &bag) : NULL;
    ox_attr_int(c->g, n, "axis", 1);
    set_output(c, i, n ? n->output[0] : NULL, LAYOUT_FLAT);
}

/* fm: sum_{f<g} <v_f, v_g> = 0.5 sum_k ((sum_f v_fk)^2 - sum_f v_fk^2) over its embedding's
 * [batch, fields * dim], reshaped to [batch, fields, dim]; [batch, 1]. dtrain sums in double, the
 * graph in float32 (docs/export.md gives the differences measured). */
static void emit_fm(ctx *c, int i) {
    const dt_layer_spec *L = &c->spec->layers[i];
    const dt_layer_spec *E = &c->spec->layers[dt_layer_input(L, i, 0)];
    const char *nm = L->name, *in = input_value(c, i, 0)->name;
    int64_t shape[3] = {-1, E->n_fields, E->dim};
    const char *sh = ox_strf(c->g, "%s:shape", nm), *v = ox_strf(c->g, "%s:vectors", nm);
    if (sh) ox_initializer_i64(c->g, sh, 3, shape);
    const char *rin[2] = {in, sh};
    if (in && sh && v) ox_node(c->g, "Reshape", v, 2, rin);
    const char *sum = ox_strf(c->g, "%s:sum", nm), *sq = ox_strf(c->g, "%s:squares", nm);
    const char *sumsq = ox_strf(c->g, "%s:sum_squares", nm);
    if (sum) reduce_sum(c, sum, v, 1, 0);                                 /* [batch, dim] */
    const char *sq_of_sum = binary(c, "Mul", ox_strf(c->g, "%s:square_of_sum", nm), sum, sum);
    binary(c, "Mul", sq, v, v);
    if (sumsq) reduce_sum(c, sumsq, sq, 1, 0);                            /* [batch, dim] */
    const char *diff = binary(c, "Sub", ox_strf(c->g, "%s:diff", nm), sq_of_sum, sumsq);
    const char *total = ox_strf(c->g, "%s:total", nm);
    if (total) reduce_sum(c, total, diff, 1, 1);                          /* [batch, 1] */
    const char *half = scalar_const(c, ox_strf(c->g, "%s:half", nm), 0.5f);
    const char *out = binary(c, "Mul", output_name(c, i), total, half);
    set_output(c, i, out, LAYOUT_FLAT);
}

/* reduce_sum: [batch, n] -> [batch, 1]. */
static void emit_reduce_sum(ctx *c, int i) {
    Onnx__NodeProto *n = reduce_sum(c, output_name(c, i), input_value(c, i, 0)->name, 1, 1);
    set_output(c, i, n ? n->output[0] : NULL, LAYOUT_FLAT);
}

static int emit_layer(ctx *c, int i) {
    const dt_layer_spec *L = &c->spec->layers[i];
    switch (L->kind) {
    case DT_LAYER_CONV2D: emit_conv(c, i); break;
    case DT_LAYER_MAXPOOL: emit_pool(c, i, "MaxPool"); break;
    case DT_LAYER_AVGPOOL: emit_pool(c, i, "AveragePool"); break;
    case DT_LAYER_GLOBAL_AVGPOOL: emit_global_avgpool(c, i); break;
    case DT_LAYER_RELU: emit_unary(c, i, "Relu"); break;
    case DT_LAYER_LEAKY_RELU: emit_unary(c, i, "LeakyRelu"); break;
    case DT_LAYER_SIGMOID: emit_unary(c, i, "Sigmoid"); break;
    case DT_LAYER_TANH: emit_unary(c, i, "Tanh"); break;
    case DT_LAYER_DROPOUT: c->vals[i + 1].same = input_value(c, i, 0); break; /* evaluation passes through */
    case DT_LAYER_FLATTEN: emit_flatten(c, i); break;
    case DT_LAYER_DENSE: emit_dense(c, i); break;
    case DT_LAYER_BATCHNORM: emit_batchnorm(c, i); break;
    case DT_LAYER_ADD:
    case DT_LAYER_CONCAT: emit_join(c, i); break;
    case DT_LAYER_EMBEDDING: emit_embedding(c, i); break;
    case DT_LAYER_FM: emit_fm(c, i); break;
    case DT_LAYER_REDUCE_SUM: emit_reduce_sum(c, i); break;
    default:
        /* a layer kind added to model files without an ONNX form here is refused, by name */
        return dt_errorf(c->g->err, DT_EINVAL, "%s:%d: layer '%s' (%s) has no ONNX form in dtrain export yet",
                         c->spec->source, L->line, L->name, dt_layer_kind_name(L->kind));
    }
    if (ox_status(c->g)) return ox_status(c->g);
    const value *v = &c->vals[i + 1];
    if (!v->same && !v->name)
        return dt_errorf(c->g->err, DT_EINVAL, "internal error: layer '%s' gave no ONNX value", L->name);
    return 0;
}

int dt_onnx_graph(ox_graph *g, dt_net *net) {
    const dt_model_spec *spec = dt_net_spec(net);
    ctx c = {.g = g, .net = net, .spec = spec};
    c.shapes = dt_calloc((size_t)spec->n_layers, sizeof *c.shapes, "layer shapes", g->err);
    c.vals = dt_calloc((size_t)spec->n_layers + 1, sizeof *c.vals, "ONNX values", g->err);
    int rc = c.shapes && c.vals ? dt_model_spec_shapes(spec, c.shapes, NULL, g->err) : DT_ENOMEM;
    /* a click-log model's input is its dense features, flat */
    if (!rc) c.vals[0] = (value){.name = DT_ONNX_INPUT, .lay = spec->ctr ? LAYOUT_FLAT : LAYOUT_NHWC};
    for (int i = 0; !rc && i < spec->n_layers; i++) rc = emit_layer(&c, i);
    if (!rc) {
        /* one logit (click-log models): its sigmoid, as dtrain predict gives; classes: the softmax */
        const char *logits = DT_ONNX_LOGITS;
        Onnx__NodeProto *n = ox_node(g, dt_net_is_binary(net) ? "Sigmoid" : "Softmax", DT_ONNX_PROBS, 1, &logits);
        if (!dt_net_is_binary(net)) ox_attr_int(g, n, "axis", 1);
        rc = ox_status(g);
    }
    free(c.shapes);
    free(c.vals);
    return rc;
}
