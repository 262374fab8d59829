#include "export/export.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "export/onnx.h"
#include "supervisor/checkpoint.h"
#include "train/restore.h"

/* The IR version that goes with an opset (onnx's VERSION_TABLE): the oldest that reads it, so older
 * runtimes still load the file. */
static int64_t ir_version(int opset) {
    if (opset <= 14) return 7;
    if (opset <= 18) return 8;
    if (opset <= 20) return 9;
    return 10;
}

/* metadata_props: what a user of the file needs besides the graph (docs/export.md, "Metadata"). */
static void add_metadata(ox_graph *g, const dt_model_spec *spec, const dt_onnx_meta *m) {
    ox_meta(g, "dtrain_version", dt_version());
    ox_meta(g, "model_name", spec->name);
    if (m->global_step >= 0) ox_meta(g, "global_step", ox_strf(g, "%" PRId64, m->global_step));
    ox_meta(g, "input_layout", "NHWC");
    ox_meta(g, "input_normalisation", "pixel / 255");
    ox_meta(g, "input_size", ox_strf(g, "%dx%dx%d", spec->in_h, spec->in_w, spec->in_c));
    if (m->checkpoint) {
        const char *base = strrchr(m->checkpoint, '/');
        ox_meta(g, "checkpoint", base ? base + 1 : m->checkpoint);
    }
    if (m->n_class_names > 0) {
        char *json = dt_ckpt_classes_json(m->class_names, m->n_class_names);
        if (!json && !ox_status(g)) g->rc = dt_errorf(g->err, DT_ENOMEM, "out of memory for the class names");
        if (json) ox_meta(g, "classes", json);
        free(json);
    }
}

static void declare_io(ox_graph *g, const dt_model_spec *spec, int classes) {
    int64_t in[4] = {-1, spec->in_h, spec->in_w, spec->in_c}, out[2] = {-1, classes};
    ox_io(g, 0, DT_ONNX_INPUT, 4, in, DT_ONNX_BATCH, "images, NHWC, float32 pixels / 255");
    ox_io(g, 1, DT_ONNX_LOGITS, 2, out, DT_ONNX_BATCH, "logits, one per class (dtrain's last dense layer)");
    ox_io(g, 1, DT_ONNX_PROBS, 2, out, DT_ONNX_BATCH, "softmax of the logits");
}

int dt_onnx_export_net(dt_net *net, int opset, const dt_onnx_meta *meta, const char *path, dt_onnx_stats *stats,
                       dt_error *err) {
    if (opset < DT_ONNX_OPSET_MIN || opset > DT_ONNX_OPSET_MAX)
        return dt_errorf(err, DT_EINVAL, "opset %d is not supported: from %d to %d", opset, DT_ONNX_OPSET_MIN,
                         DT_ONNX_OPSET_MAX);
    const dt_model_spec *spec = dt_net_spec(net);
    size_t param_bytes = dt_net_param_count(net) * sizeof(float);
    /* refused before the initializers are copied: they could not be written anyway */
    if (param_bytes > (size_t)INT32_MAX)
        return dt_errorf(err, DT_EINVAL, "%s: %zu bytes of parameters, over the 2 GiB protobuf allows in one "
                         "ONNX file (dtrain does not write ONNX's external data)", spec->name, param_bytes);
    ox_graph g;
    ox_init(&g, err);
    declare_io(&g, spec, dt_net_num_classes(net));
    int rc = ox_status(&g) ? ox_status(&g) : dt_onnx_graph(&g, net);
    if (!rc) add_metadata(&g, spec, meta);
    ox_model_info info = {.ir_version = ir_version(opset), .opset = opset, .producer = "dtrain",
                          .producer_version = dt_version(), .graph_name = spec->name, .doc = spec->text};
    size_t bytes = 0;
    if (!rc) rc = ox_write(&g, &info, path, &bytes);
    if (!rc && stats)
        *stats = (dt_onnx_stats){.bytes = bytes, .param_bytes = param_bytes, .init_bytes = g.init_bytes,
                                 .nodes = g.nodes.n, .initializers = g.inits.n};
    ox_free(&g);
    return rc;
}

/* Writing over the checkpoint being read would lose it: refused. */
static int same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* ONNX has no hash table: a layer of unbounded ids cannot be exported. */
static int unbounded_refusal(const dt_restored *r, dt_error *err) {
    const dt_model_spec *spec = dt_net_spec(r->net);
    int i = 0;
    while (i < spec->n_layers - 1 && !(spec->layers[i].kind == DT_LAYER_EMBEDDING && !spec->layers[i].buckets)) i++;
    return dt_errorf(err, DT_EINVAL, "%s: embedding %s has unbounded ids (capacity=), whose rows live in a hash table, "
                     "which ONNX cannot express: the model cannot be exported (docs/export.md lists the layers that "
                     "can)", r->path, spec->layers[i].name);
}

int dt_export_onnx(const char *source, const char *model_path, const char *path, int opset, dt_export_result *res,
                   FILE *log, dt_error *err) {
    struct stat st;
    int is_dir = stat(source, &st) == 0 && S_ISDIR(st.st_mode);
    dt_restored r;
    /* batch 1: the net is only read for its parameters, its activations are never used */
    int rc = dt_restore_net(&r, is_dir ? source : NULL, is_dir ? NULL : source, model_path, 1, log, err);
    if (rc) return rc;
    if (r.tables) {
        rc = unbounded_refusal(&r, err);
    } else if (same_file(r.path, path)) {
        rc = dt_errorf(err, DT_EINVAL, "%s: the output is the checkpoint being exported", path);
    } else {
        dt_onnx_meta meta = {.global_step = r.step, .class_names = r.class_names,
                             .n_class_names = r.n_class_names, .checkpoint = r.path};
        dt_onnx_stats stats;
        rc = dt_onnx_export_net(r.net, opset, &meta, path, &stats, err);
        if (!rc && res) {
            memcpy(res->checkpoint, r.path, sizeof res->checkpoint);
            res->step = r.step;
            res->stats = stats;
        }
    }
    dt_restored_free(&r);
    return rc;
}
