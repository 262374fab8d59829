/* libFuzzer target for the model-file parser: any bytes must give either a spec or one error
 * message naming the source, never a crash, leak or sanitizer report. A spec that parses and is
 * small is also built into a network (max_batch 1) and run forward and backward once, so the
 * shape walk and the buffers sized from it are exercised too: graphs (name=, input=, add,
 * concat) and every layer kind, with the backward plan that hands gradient buffers around; a
 * click-log model (input dense=N fields=M) runs on a one-example batch with an id in every field (with
 * unbounded ids, capacity=, as a compact net: a net of whole tables must refuse it). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/net.h"
#include "model/spec.h"

/* Keep each input cheap: the fuzzer's time goes to the parser, not to big convolutions. */
#define FUZZ_MAX_PARAMS 100000
#define FUZZ_MAX_ACT 100000

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dt_model_spec spec;
    dt_error err;
    err.msg[0] = 0;
    if (dt_model_spec_parse(&spec, (const char *)data, size, "fuzz.model", &err) != 0) {
        /* every failure names the source */
        if (strncmp(err.msg, "fuzz.model", 10) != 0 && err.code != DT_ENOMEM) __builtin_trap();
        return 0;
    }
    dt_layer_shape shapes[DT_MODEL_MAX_LAYERS];
    size_t params = 0, act = (size_t)spec.in_h * spec.in_w * spec.in_c;
    if (dt_model_spec_shapes(&spec, shapes, &params, &err) != 0) __builtin_trap(); /* parse checked it */
    for (int i = 0; i < spec.n_layers; i++) {
        size_t a = (size_t)shapes[i].out_h * shapes[i].out_w * shapes[i].out_c;
        if (a > act) act = a;
        if (spec.layers[i].kind == DT_LAYER_CONV2D) {
            size_t patch = (size_t)shapes[i].out_h * shapes[i].out_w * spec.layers[i].k_h * spec.layers[i].k_w *
                           shapes[i].in_c;
            if (patch > act) act = patch;
        }
    }
    if (params <= FUZZ_MAX_PARAMS && act <= FUZZ_MAX_ACT) {
        dt_net *net = NULL;
        /* unbounded ids: only a compact net holds them, a net of whole tables refuses them */
        const int compact = dt_model_spec_unbounded(&spec);
        if (compact && dt_net_build(&net, &spec, 1, &err) == 0) __builtin_trap();
        if ((compact ? dt_net_build_compact : dt_net_build)(&net, &spec, 1, &err) == 0) {
            if (!compact && dt_net_param_count(net) != params) __builtin_trap();
            dt_net_init_params(net, 1);
            size_t n = dt_net_input_size(net);
            float *x = dt_alloc_floats(n ? n : 1, "fuzz input", NULL);
            if (x && spec.ctr) { /* a click-log model: one example, an id in every field (two in field 0) */
                int F = spec.num_fields;
                int64_t *off = calloc((size_t)F + 1, sizeof *off);
                uint64_t *ids = calloc((size_t)F + 1, sizeof *ids);
                float *val = calloc((size_t)F + 1, sizeof *val), label = 1;
                for (size_t i = 0; i < n; i++) x[i] = (float)((i * 7) % 13) / 13.0f;
                for (int f = 0, k = 0; off && ids && val && f < F; f++) {
                    for (int r = 0; r < 1 + (f == 0); r++, k++) ids[k] = (uint64_t)f * 31 + (uint64_t)r, val[k] = 1;
                    off[f + 1] = k;
                }
                dt_ctr_batch b = {.n = 1, .num_dense = spec.num_dense, .num_fields = F, .labels = &label,
                                  .dense = x, .offsets = off, .ids = ids, .values = val};
                if (off && ids && val && dt_net_forward_ctr(net, &b, 1, 3, NULL)) {
                    dt_net_loss_binary(net, &label, NULL);
                    dt_net_backward(net, NULL);
                    (void)dt_net_forward_ctr(net, &b, 0, 0, NULL);
                }
                free(off), free(ids), free(val), free(x);
            } else if (x) {
                for (size_t i = 0; i < n; i++) x[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
                int32_t label = 0;
                if (dt_net_forward(net, x, 1, 1, 3, NULL)) {
                    dt_net_loss(net, &label, NULL);
                    dt_net_backward(net, NULL);
                }
                (void)dt_net_forward(net, x, 1, 0, 0, NULL); /* evaluation: batch norm folded into convs */
                free(x);
            }
            dt_net_free(net);
        }
    }
    dt_model_spec_free(&spec);
    return 0;
}
