/* The translation of a net into an ONNX graph (onnx.c); export.c wraps it in a model and a file. */
#ifndef DT_EXPORT_ONNX_H
#define DT_EXPORT_ONNX_H

#include "export/export.h"
#include "export/onnx_graph.h"

/* Adds net's layers to g in evaluation form: the input DT_ONNX_INPUT, float32 [batch, H, W, C], gives
 * DT_ONNX_LOGITS [batch, classes] and DT_ONNX_PROBS, their softmax; a click-log model reads its dense
 * features [batch, N] as DT_ONNX_INPUT and each embedding's "<layer>" DT_ONNX_ROWS and DT_ONNX_VALUES,
 * and DT_ONNX_PROBS is the sigmoid of its one logit. The graph's input and output declarations are
 * the caller's. A layer kind without an ONNX form is refused naming its line. */
int dt_onnx_graph(ox_graph *g, dt_net *net);

#endif
