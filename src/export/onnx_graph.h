/* Building an ONNX graph (proto/onnx.proto, via protobuf-c) and writing it to a file: nodes with
 * attributes, float initializers, typed inputs and outputs, metadata. Every piece is allocated from
 * the graph's own pool and freed with it, and the first failure is kept (sticky): a builder call
 * after it does nothing and returns NULL, so a translation can chain calls and check ox_status once. */
#ifndef DT_EXPORT_ONNX_GRAPH_H
#define DT_EXPORT_ONNX_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain.h"
#include "onnx.pb-c.h"

typedef struct {
    void **v;
    size_t n, cap;
} ox_list;

typedef struct {
    ox_list pool;         /* every allocation, freed by ox_free */
    ox_list nodes;        /* Onnx__NodeProto *, in order: the graph's nodes are topologically sorted */
    ox_list inits;        /* Onnx__TensorProto * */
    ox_list inputs, outputs, meta;
    size_t init_bytes;    /* raw bytes of the initializers */
    dt_error *err;
    int rc;               /* the first failure, 0 while none */
} ox_graph;

void ox_init(ox_graph *g, dt_error *err);
void ox_free(ox_graph *g);
int ox_status(const ox_graph *g);

/* A NUL-terminated copy, or a formatted string, in the pool. */
char *ox_strdup(ox_graph *g, const char *s);
char *ox_strf(ox_graph *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* n zeroed bytes in the pool. */
void *ox_alloc(ox_graph *g, size_t n);

/* A node op(inputs) -> out, named after its output (outputs are unique, so node names are too). */
Onnx__NodeProto *ox_node(ox_graph *g, const char *op, const char *out, int n_in, const char *const *in);
/* The same with n_out outputs (Split), named after the first. */
Onnx__NodeProto *ox_node_n(ox_graph *g, const char *op, int n_out, const char *const *out, int n_in,
                           const char *const *in);
void ox_attr_int(ox_graph *g, Onnx__NodeProto *node, const char *name, int64_t v);
void ox_attr_float(ox_graph *g, Onnx__NodeProto *node, const char *name, float v);
void ox_attr_ints(ox_graph *g, Onnx__NodeProto *node, const char *name, int n, const int64_t *v);

/* A float32 initializer of the given dims; returns its data (zeroed) to fill, row-major. */
float *ox_initializer(ox_graph *g, const char *name, int ndim, const int64_t *dims);
/* A float32 initializer whose values are data itself, not a copy (an embedding table of gigabytes is
 * not held twice): data must stay unchanged until the graph is written. Returns 0 or the status. */
int ox_initializer_ref(ox_graph *g, const char *name, int ndim, const int64_t *dims, const float *data);
/* A 1-D int64 initializer (axes, split sizes, shapes: the operators' inputs since opset 13). */
int ox_initializer_i64(ox_graph *g, const char *name, int n, const int64_t *values);

/* A float32 graph input or output; dims < 0 are the symbolic dimension named sym (the batch). */
void ox_io(ox_graph *g, int output, const char *name, int ndim, const int64_t *dims, const char *sym,
           const char *doc);
/* The same of element type elem_type (ONNX__TENSOR_PROTO__DATA_TYPE__*); dims[k] = -1 - j is the
 * symbolic dimension syms[j]. */
void ox_io_typed(ox_graph *g, int output, const char *name, int elem_type, int ndim, const int64_t *dims,
                 const char *const *syms, const char *doc);
void ox_meta(ox_graph *g, const char *key, const char *value);

/* The model around the graph. */
typedef struct {
    int64_t ir_version, opset;
    const char *producer, *producer_version, *graph_name, *doc;
    /* A file that would be over this many bytes keeps its initializers' values in ONNX's external
     * data instead, the file "<path>.data" beside it; 0: protobuf's 2 GiB (OX_MAX_FILE). */
    size_t external_above;
} ox_model_info;

/* protobuf's limit on one message, so on an ONNX file without external data. */
#define OX_MAX_FILE ((size_t)INT32_MAX)
/* Each tensor's values in the external data file start at a multiple of this (a page: a reader may
 * map them), as onnx's own convert_model_to_external_data aligns them. */
#define OX_EXTERNAL_ALIGN 4096
/* Smaller initializers stay in the model file: axes, shapes and split sizes must be there for
 * readers' shape inference (onnxruntime refuses a Split whose sizes are external), and onnx's own
 * convert_model_to_external_data keeps those under 1 KiB too. */
#define OX_EXTERNAL_MIN 1024

/* What ox_write wrote. */
typedef struct {
    size_t bytes;            /* the model file's size */
    size_t external_bytes;   /* the external data file's size; 0: none written */
} ox_written;

/* Writes the model to path atomically (io/fsutil.h): all of it, or nothing and path untouched; with
 * external data, "<path>.data" first, then the model (a model file never names data not yet there).
 * out (may be NULL) gets the sizes. Refuses a graph over protobuf's 2 GiB without its initializers. */
int ox_write(ox_graph *g, const ox_model_info *info, const char *path, ox_written *out);

#endif
