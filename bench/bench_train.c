/* Training throughput of dtrain on synthetic batches (no data loading: this measures compute).
 * usage: bench_train MODEL BATCH THREADS [SECONDS] [DEVICE] [PRECISION]   (PRECISION: float32 or bf16)
 * Prints one JSON line: images/sec, the model's training FLOPs per image, and the achieved GFLOP/s.
 * With DEVICE cuda (docs/gpu.md) the step's parts too: forward + backward with their transfers, the
 * update (Adam, on the host, as `dtrain train --device cuda` runs it), and, timed on their own, the
 * host transfers of one step (the input batch up, the parameters up, the gradient down), with the
 * FLOP/s as a fraction of PEAK_TFLOPS (environment; default 67, the H200's fp32 peak). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* CPU seconds of the whole process (every thread). */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: bench_train MODEL BATCH THREADS [SECONDS] [DEVICE] [PRECISION]\n");
        return 2;
    }
    int batch = atoi(argv[2]), threads = atoi(argv[3]);
    double seconds = argc > 4 ? atof(argv[4]) : 5.0;
    const char *device = argc > 5 ? argv[5] : "cpu", *precision = argc > 6 ? argv[6] : "float32";
    dt_error err = {0};
    dt_net *net;
    if (dt_net_load(&net, argv[1], batch, &err)) {
        fprintf(stderr, "bench_train: %s\n", err.msg);
        return 1;
    }
    dt_net_set_threads(net, threads);
    if (dt_net_set_precision(net, precision, &err) || dt_net_set_device(net, device, &err)) {
        fprintf(stderr, "bench_train: %s\n", err.msg);
        dt_net_free(net);
        return 1;
    }
    int on_gpu = strcmp(dt_net_device(net), "cpu") != 0;
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
    double t0 = 0, best = 0, best_fb = 0, best_up = 0, best_cpu = 0;
    /* Warm up, then time rounds of steps and keep the best round (other processes share the CPU).
     * Images per CPU second too: with 1 thread it is the speed the code would have alone on its
     * core, a steadier figure than wall time when other processes share the machine. */
    for (int round = -1; round < 5; round++) {
        int steps = 0;
        double fb = 0, up = 0;
        t0 = now();
        double c0 = cpu_now();
        while (now() - t0 < (round < 0 ? 1.0 : seconds / 5)) {
            int correct;
            double ta = now();
            dt_net_forward(net, x, batch, 1, (uint64_t)step, NULL);
            dt_net_loss(net, y, &correct);
            dt_net_backward(net, NULL);
            double tb = now();
            dt_opt_apply(&opt, dt_net_params(net), dt_net_grads(net), state, NULL, n, step++);
            fb += tb - ta, up += now() - tb;
            steps++;
        }
        double ips = steps * batch / (now() - t0);
        double cps = steps * batch / (cpu_now() - c0);
        if (round >= 0 && ips > best) best = ips, best_fb = fb / steps, best_up = up / steps;
        if (round >= 0 && cps > best_cpu) best_cpu = cps;
    }
    if (dt_net_status(net, &err)) {
        fprintf(stderr, "bench_train: %s\n", err.msg);
        dt_net_free(net);
        return 1;
    }
    double flops = train_flops_per_example(dt_net_spec(net));
    printf("{\"impl\": \"%s\", \"precision\": \"%s\", \"model\": \"%s\", \"batch\": %d, \"threads\": %d, "
           "\"images_per_sec\": %.1f, \"images_per_cpu_sec\": %.1f, \"train_flops_per_image\": %.0f, \"gflops\": %.1f",
           on_gpu ? "dtrain-cuda" : "dtrain", dt_net_precision(net), dt_net_spec(net)->name, batch, threads, best,
           best_cpu, flops, best * flops * 1e-9);
    if (on_gpu) {
        /* The step's host transfers on their own, each waited for: what overlapping can hide at most. */
        const dt_backend *k = dt_net_backend(net);
        const dt_buffer_ops *buf = k->buf;
        size_t in_bytes = sizeof(float) * in * batch, p_bytes = sizeof(float) * n;
        void *d_in = buf->alloc(k->ctx, in_bytes, "input", &err), *d_p = buf->alloc(k->ctx, p_bytes, "parameters", &err);
        double t_in = 0, t_p = 0, t_g = 0;
        const int reps = 20;
        for (int i = 0; d_in && d_p && i < reps; i++) {
            double a = now();
            buf->upload(k->ctx, d_in, x, in_bytes);
            buf->sync(k->ctx);
            double b = now();
            buf->upload_params(k->ctx, d_p, dt_net_params(net), n);
            buf->sync(k->ctx);
            double c = now();
            buf->download_grads(k->ctx, dt_net_grads(net), d_p, n, 0);
            buf->wait_slot(k->ctx, 0);
            double d = now();
            t_in += b - a, t_p += c - b, t_g += d - c;
        }
        buf->release(k->ctx, d_in), buf->release(k->ctx, d_p);
        char desc[320];
        dt_net_describe_device(net, desc, sizeof desc);
        const char *pk = getenv("PEAK_TFLOPS");
        double peak = pk ? atof(pk) : 67.0;
        double xfer = (t_in + t_p + t_g) / reps;
        printf(", \"device\": \"%s\", \"math\": \"%s\", \"step_ms\": %.3f, \"fwd_bwd_ms\": %.3f, \"update_ms\": %.3f, "
               "\"input_up_ms\": %.3f, \"params_up_ms\": %.3f, \"grads_down_ms\": %.3f, "
               "\"compute_ms_est\": %.3f, \"peak_tflops\": %.1f, \"fraction_of_peak\": %.4f",
               desc, strstr(desc, "TF32") ? "tf32" : "fp32", 1e3 * batch / best, 1e3 * best_fb, 1e3 * best_up, 1e3 * t_in / reps, 1e3 * t_p / reps,
               1e3 * t_g / reps, 1e3 * (best_fb - xfer > 0 ? best_fb - xfer : 0), peak,
               peak > 0 ? best * flops * 1e-12 / peak : 0);
    }
    printf("}\n");
    dt_net_free(net);
    free(x), free(state), free(y);
    return 0;
}
