#include "train/predict.h"

#include <stdlib.h>

#include "compute/kernels.h"
#include "core/error.h"
#include "data/loader.h"

int dt_predict(dt_net *net, const dt_dataset *ds, dt_predict_fn emit, void *user, int64_t *count, dt_error *err) {
    if (count) *count = 0;
    int classes = dt_net_num_classes(net), B = dt_net_max_batch(net);
    dt_loader_options lo = {.batch_size = B, .shuffle = 0, .shard_count = 1};
    float *probs = dt_alloc_floats((size_t)B * (size_t)classes, "class probabilities", err); // [B, classes]
    int *predicted = dt_calloc((size_t)B, sizeof *predicted, "predicted classes", err);
    dt_loader *loader = NULL;
    int rc = probs && predicted ? dt_loader_create(&loader, ds, &lo, err) : DT_ENOMEM;
    while (!rc) {
        dt_batch b;
        if ((rc = dt_loader_next(loader, &b, err)) || b.n == 0) break;
        const float *logits = dt_net_forward(net, b.x, b.n, 0, 0, err); // [n, classes]
        if (!logits) {
            rc = DT_EINVAL; /* err says why */
            break;
        }
        if ((rc = dt_net_status(net, err))) break; /* a device's failure */
        for (int i = 0; i < b.n; i++) predicted[i] = dt_argmax_first(logits + (size_t)i * classes, classes);
        dt_softmax_forward(probs, logits, b.n, classes);
        dt_predict_batch out = {b.ids, predicted, probs, logits, b.n, classes};
        rc = emit(user, &out, err);
        if (!rc && count) *count += b.n;
    }
    dt_loader_free(loader);
    free(probs);
    free(predicted);
    return rc;
}
