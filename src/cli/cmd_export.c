/* dtrain export: a trained model as a file other runtimes run. --format onnx (the only one so far)
 * writes the model a checkpoint stores, with its parameters, as an ONNX graph (docs/export.md); the
 * work is the library's (export/export.h). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "core/clock.h"
#include "core/error.h"
#include "export/export.h"
#include "core/flags.h"

int cmd_export(int argc, char **argv) {
    const char *format = "onnx", *model = NULL;
    int opset = DT_ONNX_OPSET_DEFAULT, help = 0, n_args = 0;
    int64_t external_above = 0;
    flag_def defs[] = {
        FLAG_TEXT("format", &format, "the file format: onnx"),
        FLAG_NUM("opset", FLAG_INT, &opset, "ONNX operator set version the graph targets", DT_ONNX_OPSET_MIN,
                 DT_ONNX_OPSET_MAX, 0),
        FLAG_TEXT("model", &model, "model file; default: the model stored in the checkpoint"),
        FLAG_NUM("external_data_above", FLAG_INT64, &external_above,
                 "bytes: a larger file keeps its parameters in OUT.onnx.data (ONNX external data); 0: over 2 GiB", 0,
                 (double)INT32_MAX, 0),
    };
    int n = (int)(sizeof defs / sizeof defs[0]);
    dt_error err = {0};
    char **all = calloc(argc > 0 ? (size_t)argc : 1, sizeof *all); /* the arguments besides flags */
    if (!all) return fprintf(stderr, "dtrain export: out of memory\n"), 1;
    int rc = flags_parse_args(defs, n, argc, argv, &help, all, &n_args, &err);
    if (!rc && !help && n_args != 2)
        rc = dt_errorf(&err, DT_EINVAL, "expected CHECKPOINT_OR_LOGDIR and OUT.onnx, got %d argument%s", n_args,
                       n_args == 1 ? "" : "s");
    if (!rc && !help && strcmp(format, "onnx"))
        rc = dt_errorf(&err, DT_EINVAL, "--format: '%s' is not onnx", format);
    if (rc) {
        fprintf(stderr, "dtrain export: %s\n", err.msg);
        free(all);
        return 2;
    }
    if (help) {
        printf("usage: dtrain export [--format onnx] [--opset N] [--model FILE] [--external_data_above BYTES]\n"
               "       CHECKPOINT_OR_LOGDIR OUT.onnx\n\n"
               "Writes the model of a checkpoint (a file, or the newest good one of a log folder) as an\n"
               "ONNX graph in evaluation form: input 'input', float32 NHWC images of pixels / 255 with a\n"
               "symbolic batch; outputs 'logits' and 'probabilities' (their softmax). A click-log model\n"
               "takes its dense features and, for each embedding, the ids' rows after hashing and their\n"
               "values; its probabilities are the logit's sigmoid. The file appears only complete.\n"
               "Inputs, outputs and examples in onnxruntime: docs/export.md.\n\n"
               "flags:\n");
        flags_print_help(stdout, defs, n);
        free(all);
        return 0;
    }
    dt_export_result res;
    double t0 = dt_seconds();
    rc = dt_export_onnx(all[0], model, all[1], opset, (size_t)external_above, &res, stderr, &err);
    if (rc) {
        fprintf(stderr, "dtrain export: %s\n", err.msg);
        free(all);
        return 1;
    }
    char ext[64] = "";
    if (res.stats.external_bytes) snprintf(ext, sizeof ext, " + %zu bytes of external data", res.stats.external_bytes);
    printf("dtrain export: %s: %zu bytes%s (%zu of parameters, %zu nodes, opset %d) from %s, global step %" PRId64
           ", in %.3f s\n", all[1], res.stats.bytes, ext, res.stats.param_bytes, res.stats.nodes, opset, res.checkpoint,
           res.step, dt_seconds() - t0);
    free(all);
    return 0;
}
