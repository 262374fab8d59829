#include "export/onnx_graph.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/fsutil.h"

/* Attributes one node may carry: Conv has the most (kernel_shape, strides, pads, dilations, group). */
#define OX_MAX_ATTRS 8

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ONNX's raw_data is little-endian; initializers are written as the host's floats"
#endif

void ox_init(ox_graph *g, dt_error *err) {
    memset(g, 0, sizeof *g);
    g->err = err;
}

void ox_free(ox_graph *g) {
    for (size_t i = 0; i < g->pool.n; i++) free(g->pool.v[i]);
    free(g->pool.v);
    free(g->nodes.v);
    free(g->inits.v);
    free(g->inputs.v);
    free(g->outputs.v);
    free(g->meta.v);
    memset(g, 0, sizeof *g);
}

int ox_status(const ox_graph *g) { return g->rc; }

static int fail_oom(ox_graph *g, const char *what) {
    if (!g->rc) g->rc = dt_errorf(g->err, DT_ENOMEM, "out of memory for the ONNX graph (%s)", what);
    return g->rc;
}

static int list_push(ox_graph *g, ox_list *l, void *p) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        void **v = realloc(l->v, cap * sizeof *v);
        if (!v) return fail_oom(g, "a list");
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = p;
    return 0;
}

void *ox_alloc(ox_graph *g, size_t n) {
    if (g->rc) return NULL;
    void *p = dt_calloc(1, n ? n : 1, "the ONNX graph", g->err); /* checked, and failed on purpose in tests */
    if (!p) {
        g->rc = DT_ENOMEM;
        return NULL;
    }
    if (list_push(g, &g->pool, p)) {
        free(p);
        return NULL;
    }
    return p;
}

char *ox_strdup(ox_graph *g, const char *s) {
    if (!s) { /* a name that could not be made: its failure is already recorded */
        if (!g->rc) g->rc = dt_errorf(g->err, DT_EINVAL, "internal error: an ONNX name is missing");
        return NULL;
    }
    size_t n = strlen(s) + 1;
    char *d = ox_alloc(g, n);
    if (d) memcpy(d, s, n);
    return d;
}

char *ox_strf(ox_graph *g, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *d = n >= 0 ? ox_alloc(g, (size_t)n + 1) : NULL;
    if (!d) return NULL;
    va_start(ap, fmt);
    vsnprintf(d, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return d;
}

Onnx__NodeProto *ox_node(ox_graph *g, const char *op, const char *out, int n_in, const char *const *in) {
    return ox_node_n(g, op, 1, &out, n_in, in);
}

Onnx__NodeProto *ox_node_n(ox_graph *g, const char *op, int n_out, const char *const *out, int n_in,
                           const char *const *in) {
    Onnx__NodeProto *node = ox_alloc(g, sizeof *node);
    char **ins = ox_alloc(g, (size_t)n_in * sizeof *ins), **outs = ox_alloc(g, (size_t)n_out * sizeof *outs);
    Onnx__AttributeProto **attrs = ox_alloc(g, OX_MAX_ATTRS * sizeof *attrs);
    if (!node || !ins || !outs || !attrs) return NULL;
    onnx__node_proto__init(node);
    for (int k = 0; k < n_in; k++) ins[k] = ox_strdup(g, in[k]);
    for (int k = 0; k < n_out; k++) outs[k] = ox_strdup(g, out[k]);
    node->name = outs[0];
    node->op_type = ox_strdup(g, op);
    node->n_input = (size_t)n_in, node->input = ins;
    node->n_output = (size_t)n_out, node->output = outs;
    node->attribute = attrs;
    if (g->rc || list_push(g, &g->nodes, node)) return NULL;
    return node;
}

static Onnx__AttributeProto *attr(ox_graph *g, Onnx__NodeProto *node, const char *name,
                                  Onnx__AttributeProto__AttributeType type) {
    if (!node || g->rc) return NULL;
    if (node->n_attribute == OX_MAX_ATTRS) {
        g->rc = dt_errorf(g->err, DT_EINVAL, "internal error: node %s has more than %d attributes", node->name,
                          OX_MAX_ATTRS);
        return NULL;
    }
    Onnx__AttributeProto *a = ox_alloc(g, sizeof *a);
    if (!a) return NULL;
    onnx__attribute_proto__init(a);
    a->name = ox_strdup(g, name);
    a->has_type = 1, a->type = type;
    node->attribute[node->n_attribute++] = a;
    return a;
}

void ox_attr_int(ox_graph *g, Onnx__NodeProto *node, const char *name, int64_t v) {
    Onnx__AttributeProto *a = attr(g, node, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
    if (a) a->has_i = 1, a->i = v;
}

void ox_attr_float(ox_graph *g, Onnx__NodeProto *node, const char *name, float v) {
    Onnx__AttributeProto *a = attr(g, node, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
    if (a) a->has_f = 1, a->f = v;
}

void ox_attr_ints(ox_graph *g, Onnx__NodeProto *node, const char *name, int n, const int64_t *v) {
    Onnx__AttributeProto *a = attr(g, node, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
    int64_t *d = a ? ox_alloc(g, (size_t)n * sizeof *d) : NULL;
    if (!d) return;
    memcpy(d, v, (size_t)n * sizeof *d);
    a->n_ints = (size_t)n, a->ints = d;
}

/* An initializer tensor named name of the given type and dims, its raw data data (n bytes), listed. */
static Onnx__TensorProto *tensor(ox_graph *g, const char *name, int type, int ndim, const int64_t *dims,
                                 const void *data, size_t n) {
    Onnx__TensorProto *t = ox_alloc(g, sizeof *t);
    int64_t *d = ox_alloc(g, (size_t)ndim * sizeof *d);
    if (!t || !d || !data) return NULL;
    onnx__tensor_proto__init(t);
    if (ndim) memcpy(d, dims, (size_t)ndim * sizeof *d);
    t->n_dims = (size_t)ndim, t->dims = d;
    t->has_data_type = 1, t->data_type = type;
    t->name = ox_strdup(g, name);
    t->has_raw_data = 1, t->raw_data.len = n, t->raw_data.data = (uint8_t *)data;
    g->init_bytes += n;
    if (g->rc || list_push(g, &g->inits, t)) return NULL;
    return t;
}

static size_t count_of(int ndim, const int64_t *dims) {
    size_t count = 1;
    for (int k = 0; k < ndim; k++) count *= (size_t)dims[k];
    return count;
}

float *ox_initializer(ox_graph *g, const char *name, int ndim, const int64_t *dims) {
    size_t count = count_of(ndim, dims);
    float *data = ox_alloc(g, count * sizeof *data);
    return tensor(g, name, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, ndim, dims, data, count * sizeof *data) ? data
                                                                                                         : NULL;
}

int ox_initializer_ref(ox_graph *g, const char *name, int ndim, const int64_t *dims, const float *data) {
    if (!data && !g->rc) g->rc = dt_errorf(g->err, DT_EINVAL, "internal error: initializer %s has no data", name);
    tensor(g, name, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, ndim, dims, data, count_of(ndim, dims) * sizeof *data);
    return g->rc;
}

int ox_initializer_i64(ox_graph *g, const char *name, int n, const int64_t *values) {
    int64_t dims[1] = {n};
    int64_t *data = ox_alloc(g, (size_t)n * sizeof *data);
    if (data) memcpy(data, values, (size_t)n * sizeof *data);
    tensor(g, name, ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 1, dims, data, (size_t)n * sizeof *data);
    return g->rc;
}

static Onnx__TypeProto *tensor_type(ox_graph *g, int elem_type, int ndim, const int64_t *dims,
                                    const char *const *syms) {
    Onnx__TypeProto *type = ox_alloc(g, sizeof *type);
    Onnx__TypeProto__Tensor *tt = ox_alloc(g, sizeof *tt);
    Onnx__TensorShapeProto *shape = ox_alloc(g, sizeof *shape);
    Onnx__TensorShapeProto__Dimension **dim = ox_alloc(g, (size_t)ndim * sizeof *dim);
    if (!type || !tt || !shape || !dim) return NULL;
    onnx__type_proto__init(type);
    onnx__type_proto__tensor__init(tt);
    onnx__tensor_shape_proto__init(shape);
    for (int k = 0; k < ndim; k++) {
        if (!(dim[k] = ox_alloc(g, sizeof *dim[k]))) return NULL;
        onnx__tensor_shape_proto__dimension__init(dim[k]);
        if (dims[k] < 0) {
            dim[k]->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
            dim[k]->dim_param = ox_strdup(g, syms[-1 - dims[k]]);
        } else {
            dim[k]->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            dim[k]->dim_value = dims[k];
        }
    }
    shape->n_dim = (size_t)ndim, shape->dim = dim;
    tt->has_elem_type = 1, tt->elem_type = elem_type;
    tt->shape = shape;
    type->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    type->tensor_type = tt;
    return type;
}

void ox_io(ox_graph *g, int output, const char *name, int ndim, const int64_t *dims, const char *sym,
           const char *doc) {
    int64_t d[8];
    for (int k = 0; k < ndim && k < 8; k++) d[k] = dims[k] < 0 ? -1 : dims[k];
    ox_io_typed(g, output, name, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, ndim < 8 ? ndim : 8, d, &sym, doc);
}

void ox_io_typed(ox_graph *g, int output, const char *name, int elem_type, int ndim, const int64_t *dims,
                 const char *const *syms, const char *doc) {
    Onnx__ValueInfoProto *v = ox_alloc(g, sizeof *v);
    if (!v) return;
    onnx__value_info_proto__init(v);
    v->name = ox_strdup(g, name);
    v->type = tensor_type(g, elem_type, ndim, dims, syms);
    v->doc_string = doc ? ox_strdup(g, doc) : NULL;
    if (!g->rc) list_push(g, output ? &g->outputs : &g->inputs, v);
}

void ox_meta(ox_graph *g, const char *key, const char *value) {
    Onnx__StringStringEntryProto *e = ox_alloc(g, sizeof *e);
    if (!e) return;
    onnx__string_string_entry_proto__init(e);
    e->key = ox_strdup(g, key);
    e->value = ox_strdup(g, value);
    if (!g->rc) list_push(g, &g->meta, e);
}

/* ---- writing ---------------------------------------------------------------------------------- */

/* protobuf-c packs through a ProtobufCBuffer: this one batches the small pieces and sends large
 * ones (the initializers' raw data) straight to the file, so the file is never held in memory twice. */
typedef struct {
    ProtobufCBuffer base;
    dt_atomic_file *f;
    uint8_t buf[1 << 16];
    size_t len;
    int rc;
    dt_error *err;
} file_sink;

static void sink_flush(file_sink *s) {
    if (!s->rc && s->len) s->rc = dt_atomic_write(s->f, s->buf, s->len, s->err);
    s->len = 0;
}

static void sink_append(ProtobufCBuffer *b, size_t len, const uint8_t *data) {
    file_sink *s = (file_sink *)b;
    if (s->rc) return;
    if (s->len + len > sizeof s->buf) sink_flush(s);
    if (len >= sizeof s->buf) {
        if (!s->rc) s->rc = dt_atomic_write(s->f, data, len, s->err);
        return;
    }
    memcpy(s->buf + s->len, data, len);
    s->len += len;
}

static void fill_model(ox_graph *g, const ox_model_info *info, Onnx__ModelProto *m, Onnx__GraphProto *gr,
                       Onnx__OperatorSetIdProto *opset, Onnx__OperatorSetIdProto **opsets) {
    onnx__graph_proto__init(gr);
    gr->name = (char *)info->graph_name;
    gr->n_node = g->nodes.n, gr->node = (Onnx__NodeProto **)g->nodes.v;
    gr->n_initializer = g->inits.n, gr->initializer = (Onnx__TensorProto **)g->inits.v;
    gr->n_input = g->inputs.n, gr->input = (Onnx__ValueInfoProto **)g->inputs.v;
    gr->n_output = g->outputs.n, gr->output = (Onnx__ValueInfoProto **)g->outputs.v;
    onnx__operator_set_id_proto__init(opset);
    opset->domain = "";
    opset->has_version = 1, opset->version = info->opset;
    opsets[0] = opset;
    onnx__model_proto__init(m);
    m->has_ir_version = 1, m->ir_version = info->ir_version;
    m->n_opset_import = 1, m->opset_import = opsets;
    m->producer_name = (char *)info->producer;
    m->producer_version = (char *)info->producer_version;
    m->doc_string = (char *)info->doc;
    m->graph = gr;
    m->n_metadata_props = g->meta.n, m->metadata_props = (Onnx__StringStringEntryProto **)g->meta.v;
}

/* Moves the values of every initializer of at least OX_EXTERNAL_MIN bytes to the external data file f
 * (opened), each at a multiple of OX_EXTERNAL_ALIGN, and names them in the tensor (ONNX's
 * external_data: location, offset, length; data_location EXTERNAL). *size gets the data file's size. */
static int write_external(ox_graph *g, dt_atomic_file *f, const char *location, size_t *size) {
    uint64_t at = 0;
    for (size_t i = 0; i < g->inits.n; i++) {
        Onnx__TensorProto *t = g->inits.v[i];
        size_t n = t->raw_data.len;
        if (n < OX_EXTERNAL_MIN) continue;
        at = (at + OX_EXTERNAL_ALIGN - 1) / OX_EXTERNAL_ALIGN * OX_EXTERNAL_ALIGN;
        int rc = n ? dt_atomic_pwrite(f, t->raw_data.data, n, at, g->err) : 0;
        if (rc) return g->rc = rc;
        Onnx__StringStringEntryProto *e = ox_alloc(g, 3 * sizeof *e), **ep = ox_alloc(g, 3 * sizeof *ep);
        if (!e || !ep) return g->rc;
        const char *keys[3] = {"location", "offset", "length"};
        const char *vals[3] = {location, ox_strf(g, "%llu", (unsigned long long)at), ox_strf(g, "%zu", n)};
        for (int k = 0; k < 3; k++) {
            onnx__string_string_entry_proto__init(&e[k]);
            e[k].key = (char *)keys[k], e[k].value = (char *)vals[k];
            ep[k] = &e[k];
        }
        if (!vals[1] || !vals[2]) return g->rc;
        t->n_external_data = 3, t->external_data = ep;
        t->has_data_location = 1, t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
        t->has_raw_data = 0, t->raw_data.len = 0, t->raw_data.data = NULL;
        at += n;
    }
    *size = at;
    return 0;
}

int ox_write(ox_graph *g, const ox_model_info *info, const char *path, ox_written *out) {
    if (g->rc) return g->rc;
    Onnx__ModelProto m;
    Onnx__GraphProto gr;
    Onnx__OperatorSetIdProto opset, *opsets[1];
    fill_model(g, info, &m, &gr, &opset, opsets);
    size_t size = protobuf_c_message_get_packed_size(&m.base);
    size_t above = info->external_above && info->external_above < OX_MAX_FILE ? info->external_above : OX_MAX_FILE;
    dt_atomic_file data = {.fd = -1};
    size_t data_bytes = 0;
    int rc = 0;
    if (size > above && g->inits.n) {
        /* the values go beside the model, named relative to its folder (ONNX's rule for location) */
        char *data_path = ox_strf(g, "%s.data", path);
        const char *base = data_path ? strrchr(data_path, '/') : NULL;
        rc = data_path ? dt_atomic_open(&data, data_path, g->err) : g->rc;
        if (!rc) rc = write_external(g, &data, base ? base + 1 : data_path, &data_bytes);
        if (!rc) size = protobuf_c_message_get_packed_size(&m.base);
    }
    if (!rc && size > OX_MAX_FILE)
        rc = dt_errorf(g->err, DT_EINVAL,
                       "%s: the graph would take %zu bytes without its initializers, over the 2 GiB protobuf allows "
                       "in one ONNX file", path, size);
    file_sink *s = rc ? NULL : dt_calloc(1, sizeof *s, "the ONNX file's buffer", g->err);
    dt_atomic_file f = {.fd = -1};
    if (!rc) rc = s ? dt_atomic_open(&f, path, g->err) : DT_ENOMEM;
    if (!rc) {
        s->base.append = sink_append;
        s->f = &f, s->err = g->err;
        size_t packed = protobuf_c_message_pack_to_buffer(&m.base, &s->base);
        sink_flush(s);
        rc = s->rc;
        if (!rc && packed != size)
            rc = dt_errorf(g->err, DT_EIO, "%s: internal error: packed %zu bytes of %zu", path, packed, size);
        /* the data first: a model file never names values that are not there */
        if (!rc && data_bytes) rc = dt_atomic_commit(&data, g->err);
        if (!rc) rc = dt_atomic_commit(&f, g->err);
    }
    dt_atomic_abort(&f);
    dt_atomic_abort(&data);
    free(s);
    if (!rc && out) *out = (ox_written){.bytes = size, .external_bytes = data_bytes};
    return g->rc = rc;
}
