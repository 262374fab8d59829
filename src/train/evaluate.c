#include "train/evaluate.h"

#include <string.h>

#include "compute/kernels.h"
#include "core/error.h"
#include "data/loader.h"

int dt_evaluate(dt_net *net, const dt_dataset *ds, int64_t *confusion, dt_eval_result *out,
                dt_error *err) {
    memset(out, 0, sizeof *out);
    int classes = dt_net_num_classes(net);
    dt_loader_options lo = {.batch_size = dt_net_max_batch(net), .shuffle = 0, .shard_count = 1};
    dt_loader *loader = NULL;
    int rc = dt_loader_create(&loader, ds, &lo, err);
    if (rc) return rc;
    double loss_sum = 0;
    int64_t correct = 0;
    for (;;) {
        dt_batch b;
        if ((rc = dt_loader_next(loader, &b, err))) break;
        if (b.n == 0) break;
        const float *logits = dt_net_forward(net, b.x, b.n, 0, 0, err);
        if (!logits) {
            rc = DT_EINVAL; /* err says why */
            break;
        }
        int c = 0;
        loss_sum += (double)dt_net_loss(net, b.labels, &c) * b.n;
        if ((rc = dt_net_status(net, err))) break; /* a device's failure */
        correct += c;
        out->examples += b.n;
        if (confusion) {
            for (int i = 0; i < b.n; i++) {
                int best = dt_argmax_first(logits + (size_t)i * classes, classes);
                int y = b.labels[i];
                if (y >= 0 && y < classes) confusion[(size_t)y * classes + best]++;
            }
        }
    }
    dt_loader_free(loader);
    if (rc) return rc;
    if (out->examples > 0) {
        out->loss = loss_sum / (double)out->examples;
        out->accuracy = (double)correct / (double)out->examples;
    }
    return DT_OK;
}
