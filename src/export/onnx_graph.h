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
void ox_attr_int(ox_graph *g, Onnx__NodeProto *node, const char *name, int64_t v);
void ox_attr_float(ox_graph *g, Onnx__NodeProto *node, const char *name, float v);
void ox_attr_ints(ox_graph *g, Onnx__NodeProto *node, const char *name, int n, const int64_t *v);

/* A float32 initializer of the given dims; returns its data (zeroed) to fill, row-major. */
float *ox_initializer(ox_graph *g, const char *name, int ndim, const int64_t *dims);

/* A float32 graph input or output; dims < 0 are the symbolic dimension named sym (the batch). */
void ox_io(ox_graph *g, int output, const char *name, int ndim, const int64_t *dims, const char *sym,
           const char *doc);
void ox_meta(ox_graph *g, const char *key, const char *value);

/* The model around the graph. */
typedef struct {
    int64_t ir_version, opset;
    const char *producer, *producer_version, *graph_name, *doc;
} ox_model_info;

/* Writes the model to path atomically (io/fsutil.h): all of it, or nothing and path untouched.
 * *bytes (may be NULL) gets the file's size. Refuses a model over protobuf's 2 GiB. */
int ox_write(ox_graph *g, const ox_model_info *info, const char *path, size_t *bytes);

#endif
