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

/* The embedding layers as a JSON array, what a caller needs to make their inputs: for each, its
 * inputs, its fields in order, its rows per table (the hash's modulus), its dim, its tables (one per
 * field or shared) and its combiner. */
static const char *embeddings_json(ox_graph *g, const dt_model_spec *spec) {
    const char *json = "[";
    for (int i = 0; json && i < spec->n_layers; i++) {
        const dt_layer_spec *L = &spec->layers[i];
        if (L->kind != DT_LAYER_EMBEDDING) continue;
        const char *fields = "";
        for (int f = 0; fields && f < DT_MODEL_MAX_FIELDS; f++)
            if (dt_layer_has_field(L, f)) fields = ox_strf(g, "%s%s%d", fields, *fields ? "," : "", f);
        json = fields ? ox_strf(g, "%s%s{\"layer\":\"%s\",\"rows_input\":\"%s" DT_ONNX_ROWS "\",\"values_input\":\"%s"
                                DT_ONNX_VALUES "\",\"fields\":[%s],\"buckets\":%lld,\"dim\":%d,\"table\":\"%s\","
                                "\"combiner\":\"%s\"}", json, json[1] ? "," : "", L->name, L->name, L->name, fields,
                                (long long)L->buckets, L->dim, L->shared ? "shared" : "per_field",
                                L->mean ? "mean" : "sum")
                      : NULL;
    }
    return json ? ox_strf(g, "%s]", json) : NULL;
}

/* metadata_props: what a user of the file needs besides the graph (docs/export.md, "Metadata"). */
static void add_metadata(ox_graph *g, const dt_model_spec *spec, const dt_onnx_meta *m) {
    ox_meta(g, "dtrain_version", dt_version());
    ox_meta(g, "model_name", spec->name);
    if (m->global_step >= 0) ox_meta(g, "global_step", ox_strf(g, "%" PRId64, m->global_step));
    if (spec->ctr) {
        ox_meta(g, "input_kind", "click log");
        ox_meta(g, "dense_features", ox_strf(g, "%d", spec->num_dense));
        ox_meta(g, "dense_transform", "log(1 + x) in float64 for x >= 0, 0 for a negative or empty x, as float32");
        ox_meta(g, "fields", ox_strf(g, "%d", spec->num_fields));
        ox_meta(g, "hash", "row = ctr_hash(field, id) % buckets, ctr_hash(f, id) = mix64(id ^ mix64(f ^ "
                           "0x4354524841534831)), mix64 splitmix64's finaliser (docs/ctr-data.md)");
        ox_meta(g, "embeddings", embeddings_json(g, spec));
    } else {
        ox_meta(g, "input_layout", "NHWC");
        ox_meta(g, "input_normalisation", "pixel / 255");
        ox_meta(g, "input_size", ox_strf(g, "%dx%dx%d", spec->in_h, spec->in_w, spec->in_c));
    }
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
    if (spec->ctr) {
        static const char *const syms[2] = {DT_ONNX_BATCH, DT_ONNX_IDS};
        int64_t dense[2] = {-1, spec->num_dense}, out[2] = {-1, 1};
        if (spec->num_dense)
            ox_io(g, 0, DT_ONNX_INPUT, 2, dense, DT_ONNX_BATCH, "dense features after dtrain's transform, log(1 + x)");
        for (int i = 0; i < spec->n_layers; i++) {
            const dt_layer_spec *L = &spec->layers[i];
            if (L->kind != DT_LAYER_EMBEDDING) continue;
            int64_t bag[3] = {-1, L->n_fields, -2};
            ox_io_typed(g, 0, ox_strf(g, "%s" DT_ONNX_ROWS, L->name), ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 3, bag,
                        syms, "each id's row: ctr_hash(field, id) % buckets (docs/ctr-data.md); padding: any row");
            ox_io_typed(g, 0, ox_strf(g, "%s" DT_ONNX_VALUES, L->name), ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 3, bag,
                        syms, "each id's value (1 in Criteo); 0 for padding");
        }
        ox_io(g, 1, DT_ONNX_LOGITS, 2, out, DT_ONNX_BATCH, "the click's log-odds");
        ox_io(g, 1, DT_ONNX_PROBS, 2, out, DT_ONNX_BATCH, "the click's probability: sigmoid of the logit");
        return;
    }
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
    ox_graph g;
    ox_init(&g, err);
    declare_io(&g, spec, dt_net_num_classes(net));
    int rc = ox_status(&g) ? ox_status(&g) : dt_onnx_graph(&g, net);
    if (!rc) add_metadata(&g, spec, meta);
    ox_model_info info = {.ir_version = ir_version(opset), .opset = opset, .producer = "dtrain",
                          .producer_version = dt_version(), .graph_name = spec->name, .doc = spec->text,
                          .external_above = meta->external_above};
    ox_written w = {0};
    if (!rc) rc = ox_write(&g, &info, path, &w);
    if (!rc && stats)
        *stats = (dt_onnx_stats){.bytes = w.bytes, .param_bytes = param_bytes, .init_bytes = g.init_bytes,
                                 .nodes = g.nodes.n, .initializers = g.inits.n, .external_bytes = w.external_bytes};
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

int dt_export_onnx(const char *source, const char *model_path, const char *path, int opset, size_t external_above,
                   dt_export_result *res, FILE *log, dt_error *err) {
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
                             .n_class_names = r.n_class_names, .checkpoint = r.path,
                             .external_above = external_above};
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
