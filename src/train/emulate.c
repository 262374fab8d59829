#include "train/emulate.h"

#include <stdlib.h>
#include <time.h>

#include "core/clock.h"
#include "model/spec.h"

/* Multiply-adds of one layer per example (elementwise layers: one per output). */
static double layer_cost(const dt_layer_spec *s, const dt_layer_shape *sh) {
    double out = (double)sh->out_h * sh->out_w * sh->out_c;
    switch (s->kind) {
    case DT_LAYER_CONV2D: return out * s->k_h * s->k_w * sh->in_c;
    case DT_LAYER_DENSE: return (double)sh->n_weights;
    case DT_LAYER_MAXPOOL: return out * s->k_h * s->k_w;
    default: return out;
    }
}

/* Sleeps until `until` (monotonic seconds, as dt_seconds); deadlines, not durations, so the small
 * oversleep of each call does not add up over the layers. */
static void sleep_until(double until) {
    struct timespec t = {(time_t)until, (long)((until - (double)(time_t)until) * 1e9)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) != 0) {}
}

void dt_emulate_step(dt_net *net, int ms) {
    const dt_model_spec *spec = dt_net_spec(net);
    int n = dt_net_num_layers(net);
    const dt_net_hooks *h = dt_net_get_hooks(net);
    dt_layer_shape *shapes = malloc((size_t)n * sizeof *shapes);
    double *cost = malloc((size_t)n * sizeof *cost), total = 0;
    if (!shapes || !cost || dt_model_spec_shapes(spec, shapes, NULL, NULL)) {
        /* Out of memory (or a spec the net was built from refused): one sleep, no hooks. */
        free(shapes), free(cost);
        sleep_until(dt_seconds() + ms / 1e3);
        return;
    }
    for (int i = 0; i < n; i++) total += cost[i] = layer_cost(&spec->layers[i], &shapes[i]);
    double per = total > 0 ? ms / 1e3 / total : 0, t = dt_seconds();
    size_t off, count;
    for (int i = 0; i < n; i++) {
        if (h->before_forward && dt_net_layer_params(net, i, &off, &count)) {
            h->before_forward(h->user, off, count);
            double after = dt_seconds();
            if (after > t) t = after; /* waited: the layer starts now */
        }
        sleep_until(t += per * cost[i] / 3);
    }
    for (int i = n - 1; i >= 0; i--) {
        sleep_until(t += per * cost[i] * 2 / 3);
        if (h->after_backward && dt_net_layer_params(net, i, &off, &count)) h->after_backward(h->user, off, count);
    }
    free(shapes), free(cost);
}

void dt_emulate_until(double since, int ms) {
    if (dt_seconds() < since + ms / 1e3) sleep_until(since + ms / 1e3);
}
