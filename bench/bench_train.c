/* Training throughput of dtrain on synthetic batches (no data loading: this measures compute).
 * usage: bench_train MODEL BATCH THREADS [SECONDS]
 * Prints one JSON line: images/sec, the model's training FLOPs per image, and the achieved GFLOP/s. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "compute/kernels.h"
#include "compute/optim.h"
#include "core/rng.h"
#include "model/net.h"

/* Training FLOPs per example: forward 2*MACs of conv and dense layers (MACs = weights used per
 * output position x positions), backward twice that, except that the first layer computes no input
 * gradient. Pool/relu/loss are not counted. */
static double train_flops_per_example(const dt_model_spec *s) {
    dt_layer_shape *sh = calloc((size_t)s->n_layers, sizeof *sh);
    if (!sh || dt_model_spec_shapes(s, sh, NULL, NULL)) {
        free(sh);
        return 0;
    }
    double total = 0;
    int first = 1;
    for (int i = 0; i < s->n_layers; i++) {
        double macs = (double)sh[i].n_weights * sh[i].out_h * sh[i].out_w;
        if (macs > 0) {
            total += 2 * macs * (first ? 2 : 3);
            first = 0;
        }
    }
    free(sh);
    return total;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: bench_train MODEL BATCH THREADS [SECONDS]\n");
        return 2;
    }
    int batch = atoi(argv[2]), threads = atoi(argv[3]);
    double seconds = argc > 4 ? atof(argv[4]) : 5.0;
    dt_kernels_set_threads(threads);
    dt_error err = {0};
    dt_net *net;
    if (dt_net_load(&net, argv[1], batch, &err)) {
        fprintf(stderr, "bench_train: %s\n", err.msg);
        return 1;
    }
    dt_net_init_params(net, 1);
    size_t in = dt_net_input_size(net), n = dt_net_param_count(net);
    float *x = malloc(sizeof(float) * in * batch), *state = calloc(2 * n, sizeof(float));
    int32_t *y = malloc(sizeof(int32_t) * batch);
    if (!x || !state || !y) return 1;
    dt_rng r;
    dt_rng_seed(&r, 7);
    for (size_t i = 0; i < in * (size_t)batch; i++) x[i] = dt_rng_uniform(&r);
    for (int i = 0; i < batch; i++) y[i] = (int32_t)dt_rng_below(&r, dt_net_num_classes(net));
    dt_opt_config opt;
    dt_opt_config_init(&opt, "adam", 1e-4f, NULL);
    int64_t step = 0;
    double t0 = 0, best = 0;
    /* Warm up, then time rounds of steps and keep the best round (other processes share the CPU). */
    for (int round = -1; round < 5; round++) {
        int steps = 0;
        t0 = now();
        while (now() - t0 < (round < 0 ? 1.0 : seconds / 5)) {
            int correct;
            dt_net_forward(net, x, batch, 1, (uint64_t)step);
            dt_net_loss(net, y, &correct);
            dt_net_backward(net);
            dt_opt_apply(&opt, dt_net_params(net), dt_net_grads(net), state, NULL, n, step++);
            steps++;
        }
        double ips = steps * batch / (now() - t0);
        if (round >= 0 && ips > best) best = ips;
    }
    double flops = train_flops_per_example(dt_net_spec(net));
    printf("{\"impl\": \"dtrain\", \"model\": \"%s\", \"batch\": %d, \"threads\": %d, "
           "\"images_per_sec\": %.1f, \"train_flops_per_image\": %.0f, \"gflops\": %.1f}\n",
           dt_net_spec(net)->name, batch, threads, best, flops, best * flops * 1e-9);
    dt_net_free(net);
    free(x), free(state), free(y);
    return 0;
}
