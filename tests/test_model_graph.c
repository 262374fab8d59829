/* Graph model files (name=, input=, add, concat) and the layers residual networks brought: the
 * shipped ResNet parses to the graph it describes, a file without names means what it always
 * meant (same layers, same parameter names and offsets, so old checkpoints restore), every graph
 * mistake is one message naming file:line, and the network built from a graph keeps its contract
 * with callers (which gradients are final after each layer's backward). Gradients themselves are
 * checked against PyTorch in test_fixtures.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/kernels.h"
#include "core/error.h"
#include "model/net.h"
#include "model/spec.h"
#include "spec_check.h"
#include "test.h"

/* The CPU context the kernels here run on (its threads: OpenMP's default; some tests change it). */
static dt_cpu cpu;

#define HEAD "model g\ninput 8 8 2\n"

static void test_resnet_parses(void) {
    dt_model_spec s;
    dt_error err = {0};
    int rc = dt_model_spec_load(&s, "models/resnet.model", &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc) return;
    int kinds[DT_LAYER_CONCAT + 1] = {0}, adds_checked = 0;
    for (int i = 0; i < s.n_layers; i++) {
        const dt_layer_spec *L = &s.layers[i];
        kinds[L->kind]++;
        if (L->kind == DT_LAYER_ADD) {
            /* a residual sum: the branch's batch norm and the block's input (a relu), or its
             * projection (a batch norm just above) */
            CHECK(L->n_inputs == 2 && L->inputs[0] < i && L->inputs[1] < i);
            CHECK(s.layers[L->inputs[0]].kind == DT_LAYER_BATCHNORM);
            CHECK(s.layers[L->inputs[1]].kind == DT_LAYER_RELU ||
                  (s.layers[L->inputs[1]].kind == DT_LAYER_BATCHNORM && L->inputs[1] == i - 1));
            adds_checked++;
        } else {
            CHECK(L->n_inputs == 1);
        }
        if (L->kind == DT_LAYER_CONV2D) CHECK(!L->use_bias); /* every conv feeds a batch norm */
    }
    CHECK(kinds[DT_LAYER_CONV2D] == 21 && kinds[DT_LAYER_BATCHNORM] == 21 && kinds[DT_LAYER_ADD] == 9);
    CHECK(kinds[DT_LAYER_GLOBAL_AVGPOOL] == 1 && kinds[DT_LAYER_DENSE] == 1 && adds_checked == 9);
    dt_layer_shape sh[DT_MODEL_MAX_LAYERS];
    size_t n = 0;
    CHECK(dt_model_spec_shapes(&s, sh, &n, &err) == 0);
    CHECK(sh[s.n_layers - 2].flat && sh[s.n_layers - 2].out_c == 64); /* global_avgpool: 7x7x64 -> 64 */
    /* 3x3 stem + 2 x 3 x 3x3 convs per stage + two 1x1 projections, 21 batch norms of 4 x C, dense */
    size_t conv = 9 * 16 + 6 * (9 * 16 * 16) + (9 * 16 * 32 + 5 * 9 * 32 * 32) + (9 * 32 * 64 + 5 * 9 * 64 * 64) +
                  16 * 32 + 32 * 64;
    size_t bn = 4 * (7 * 16 + 7 * 32 + 7 * 64);
    CHECK(n == conv + bn + 64 * 10 + 10);
    dt_model_spec_free(&s);
}

/* The parameter names and offsets of the shipped stacks are those checkpoints were written with. */
static void test_stack_unchanged(void) {
    static const struct {
        const char *name;
        size_t offset, count;
    } fashion[] = {{"conv1/kernel", 0, 288},      {"conv1/bias", 288, 32},       {"conv2/kernel", 320, 18432},
                   {"conv2/bias", 18752, 64},     {"dense1/kernel", 18816, 401408}, {"dense1/bias", 420224, 128},
                   {"dense2/kernel", 420352, 1280}, {"dense2/bias", 421632, 10}};
    dt_net *net = NULL;
    dt_error err = {0};
    int rc = dt_net_load(&net, "models/fashion.model", 4, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc) return;
    CHECK(dt_net_num_views(net) == 8 && dt_net_param_count(net) == 421642);
    CHECK(dt_net_num_grad_buffers(net) == 3); /* the logits' and the two a stack ping-pongs between */
    for (int v = 0; v < 8 && v < dt_net_num_views(net); v++) {
        const dt_param_view *pv = dt_net_view(net, v);
        CHECK_MSG(!strcmp(pv->name, fashion[v].name) && pv->offset == fashion[v].offset && pv->count == fashion[v].count,
                  "view %d: %s at %zu (%zu)", v, pv->name, pv->offset, pv->count);
        CHECK(!pv->not_trained);
    }
    const dt_model_spec *s = dt_net_spec(net);
    for (int i = 0; i < s->n_layers; i++) CHECK(s->layers[i].n_inputs == 1 && s->layers[i].inputs[0] == i - 1);
    dt_net_free(net);
}

static void test_graph_syntax(void) {
    dt_model_spec s;
    dt_error err;
    const char *t = HEAD "conv2d name=a filters=4 kernel=3 padding=same use_bias=false\n"
                         "batchnorm momentum=0.9 epsilon=1e-5\n"
                         "leaky_relu name=r alpha=0.1\n"
                         "conv2d input=a filters=2 kernel=1\n"     /* conv2, from a */
                         "tanh name=t\n"
                         "concat input=r,t,input\n"                /* 4 + 2 + 2 channels */
                         "avgpool size=2 padding=same\n"
                         "sigmoid\n"
                         "global_avgpool\n"
                         "dense units=3\n";
    int rc = parse(t, &err, &s);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc) return;
    CHECK(!strcmp(s.layers[0].name, "a") && !strcmp(s.layers[1].name, "bn1") && !strcmp(s.layers[3].name, "conv2"));
    CHECK(s.layers[1].momentum == 0.9f && s.layers[1].epsilon == 1e-5f && s.layers[2].alpha == 0.1f);
    CHECK(s.layers[3].inputs[0] == 0 && s.layers[5].n_inputs == 3 && s.layers[5].inputs[2] == -1);
    CHECK(s.layers[6].stride_h == 2); /* avgpool's stride defaults to its size */
    dt_layer_shape sh[10];
    size_t n;
    CHECK(dt_model_spec_shapes(&s, sh, &n, &err) == 0);
    CHECK(sh[5].out_c == 8 && sh[6].out_h == 4 && sh[8].flat && sh[8].out_c == 8);
    CHECK(n == 9 * 2 * 4 + 4 * 4 + (4 * 2 + 2) + 8 * 3 + 3);
    dt_model_spec_free(&s);
    /* defaults: Keras's */
    rc = parse(HEAD "batchnorm\nleaky_relu\nflatten\ndense units=2\n", &err, &s);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc == 0) {
        CHECK(s.layers[0].momentum == 0.99f && s.layers[0].epsilon == 1e-3f && s.layers[1].alpha == 0.3f);
        dt_model_spec_free(&s);
    }
}

static void test_graph_errors(void) {
    /* an add of two shapes */
    expect_error(5, HEAD "conv2d name=a filters=4 kernel=3 padding=same\nconv2d name=b input=input filters=3 kernel=3 padding=same\n"
                         "add input=a,b\nflatten\ndense units=2\n",
                 "add: input 'a' is [8,8,4]", "'b' is [8,8,3]");
    /* concat needs one height and width */
    expect_error(5, HEAD "conv2d name=a filters=4 kernel=3\nconv2d name=b input=input filters=3 kernel=3 padding=same\n"
                         "concat input=a,b\nflatten\ndense units=2\n",
                 "concat: input 'a' is [6,6,4]", "one height and width");
    /* input= naming a later layer, a cycle through two layers, and one through itself */
    expect_error(3, HEAD "relu name=a input=b\nrelu name=b input=a\nflatten\ndense units=2\n",
                 "input 'b' is the relu at line 4, below this one", "no cycles");
    expect_error(3, HEAD "relu name=a input=a\nflatten\ndense units=2\n", "its own output", "cycle");
    /* a name used twice, also against an automatic name */
    expect_error(4, HEAD "relu name=a\nrelu name=a\nflatten\ndense units=2\n", "layer name 'a' is already used by the relu at line 3",
                 NULL);
    expect_error(4, HEAD "relu name=relu2\nrelu\nflatten\ndense units=2\n", "layer name 'relu2' is already used", NULL);
    /* unknown names, with a suggestion when one is close */
    expect_error(4, HEAD "relu name=branch\nrelu input=brunch\nflatten\ndense units=2\n", "input 'brunch' names no layer",
                 "did you mean 'branch'?");
    expect_error(3, HEAD "relu input=nowhere\nflatten\ndense units=2\n", "input 'nowhere' names no layer", NULL);
    /* inputs per kind */
    expect_error(3, HEAD "add\nflatten\ndense units=2\n", "add needs input=NAME,NAME", NULL);
    expect_error(4, HEAD "relu name=a\nadd input=a\nflatten\ndense units=2\n", "at least two inputs", NULL);
    expect_error(4, HEAD "relu name=a\nrelu input=a,input\nflatten\ndense units=2\n", "relu takes one input", NULL);
    expect_error(4, HEAD "relu name=a\nadd input=a,a\nflatten\ndense units=2\n", "input 'a' is given twice", NULL);
    expect_error(3, HEAD "relu input=a,,b\nflatten\ndense units=2\n", "bad value 'a,,b' for input", NULL);
    /* names */
    expect_error(3, HEAD "relu name=9lives\nflatten\ndense units=2\n", "bad layer name '9lives'", NULL);
    expect_error(3, HEAD "relu name=input\nflatten\ndense units=2\n", "bad layer name 'input'", NULL);
    expect_error(3, HEAD "relu name=a/b\nflatten\ndense units=2\n", "bad layer name", NULL);
    expect_error(3, HEAD "relu name=a name=b\nflatten\ndense units=2\n", "duplicate option 'name'", NULL);
    /* a branch whose output nobody reads */
    expect_error(3, HEAD "conv2d name=lost filters=2 kernel=1\nflatten input=input\ndense units=2\n",
                 "the output of 'lost' is never used", NULL);
    /* new layers' options and shapes */
    expect_error(3, HEAD "leaky_relu alpha=1.5\nflatten\ndense units=2\n", "bad value '1.5' for alpha", NULL);
    expect_error(3, HEAD "batchnorm momentum=-0.1\nflatten\ndense units=2\n", "bad value '-0.1' for momentum", NULL);
    expect_error(3, HEAD "batchnorm epsilon=0\nflatten\ndense units=2\n", "bad value '0' for epsilon", NULL);
    expect_error(3, HEAD "batchnorm momentun=0.9\nflatten\ndense units=2\n", "unknown option 'momentun'",
                 "did you mean 'momentum'?");
    expect_error(3, HEAD "sigmoid rate=1\nflatten\ndense units=2\n", "sigmoid takes no options but name= and input=", NULL);
    expect_error(4, HEAD "flatten\nglobal_avgpool\ndense units=2\n", "global_avgpool needs an [H,W,C] input", "line 3");
    expect_error(4, HEAD "flatten\navgpool size=2\ndense units=2\n", "avgpool needs an [H,W,C] input", NULL);
    expect_error(3, HEAD "avgpool size=9\nflatten\ndense units=2\n", "avgpool: window", NULL);
    expect_error(3, HEAD "tanhh\nflatten\ndense units=2\n", "unknown layer 'tanhh'", "did you mean 'tanh'?");
}

/* After layer i's backward, gradients from dt_net_layer_param_begin(i) on are final: the begins
 * rise with the layers and meet the views of each layer's parameters. */
static void test_param_ranges(void) {
    dt_net *net = NULL;
    dt_error err = {0};
    int rc = dt_net_load(&net, "models/resnet.model", 2, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc) return;
    const dt_model_spec *s = dt_net_spec(net);
    CHECK(dt_net_num_layers(net) == s->n_layers);
    if (getenv("SHOW_BUFFERS")) fprintf(stderr, "  resnet: %d gradient buffers\n", dt_net_num_grad_buffers(net));
    CHECK(dt_net_num_grad_buffers(net) <= 4); /* a residual's shortcut keeps one more alive */
    int v = 0;
    for (int i = 0; i < s->n_layers; i++) {
        size_t begin = dt_net_layer_param_begin(net, i);
        CHECK(i == 0 ? begin == 0 : begin >= dt_net_layer_param_begin(net, i - 1));
        /* this layer's views start at its begin and lie before the next layer's */
        size_t next = i + 1 < s->n_layers ? dt_net_layer_param_begin(net, i + 1) : dt_net_param_count(net);
        size_t at = begin;
        while (v < dt_net_num_views(net) && dt_net_view(net, v)->offset < next) {
            const dt_param_view *pv = dt_net_view(net, v);
            CHECK_MSG(pv->offset == at && strncmp(pv->name, s->layers[i].name, strlen(s->layers[i].name)) == 0,
                      "view %s at %zu, layer %s begins at %zu", pv->name, pv->offset, s->layers[i].name, at);
            at += pv->count;
            v++;
        }
        CHECK(at == next);
    }
    CHECK(v == dt_net_num_views(net));
    CHECK(dt_net_layer_param_begin(net, s->n_layers) == dt_net_param_count(net));
    /* moving statistics: not trainable, named as Keras names them */
    int moving = 0;
    for (int k = 0; k < dt_net_num_views(net); k++) {
        const dt_param_view *pv = dt_net_view(net, k);
        int is_moving = strstr(pv->name, "/moving_mean") || strstr(pv->name, "/moving_variance");
        CHECK(pv->not_trained == is_moving);
        moving += is_moving;
    }
    CHECK(moving == 42);
    dt_net_free(net);
}

/* Training updates the moving statistics (and nothing else in the forward pass); evaluation reads
 * them and changes nothing; the same input in evaluation gives the same logits twice. */
static void test_moving_statistics(void) {
    dt_net *net = NULL;
    dt_error err = {0};
    int rc = dt_net_load(&net, "tests/fixtures/layers.model", 3, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc) return;
    dt_net_init_params(net, 5);
    size_t n = dt_net_param_count(net), in = 3 * dt_net_input_size(net);
    float *before = malloc(n * sizeof *before), *x = malloc(in * sizeof *x), logits[9];
    for (size_t i = 0; i < in; i++) x[i] = (float)((i * 37) % 23) / 23.0f - 0.4f;
    memcpy(before, dt_net_params(net), n * sizeof *before);
    const float *l = dt_net_forward(net, x, 3, 0, 0, NULL);
    CHECK(l && memcmp(before, dt_net_params(net), n * sizeof *before) == 0);
    if (l) memcpy(logits, l, sizeof logits);
    l = dt_net_forward(net, x, 3, 0, 0, NULL);
    CHECK(l && memcmp(logits, l, sizeof logits) == 0);
    CHECK(dt_net_forward(net, x, 3, 1, 0, NULL) != NULL);
    for (int v = 0; v < dt_net_num_views(net); v++) {
        const dt_param_view *pv = dt_net_view(net, v);
        int changed = memcmp(before + pv->offset, dt_net_params(net) + pv->offset, pv->count * sizeof(float)) != 0;
        CHECK_MSG(changed == pv->not_trained, "%s %s", pv->name, changed ? "changed" : "did not change");
    }
    free(before);
    free(x);
    dt_net_free(net);
}

/* Batch-norm statistics in one pass stay exact when the mean dwarfs the spread (1000 +- 0.01,
 * where a plain sum of squares in float would lose everything), over many pieces of rows, and do
 * not depend on the thread count. C = 3 takes the channel-by-channel path, C = 32 the blocks of
 * 16 channels (batchnorm_cpu.c); the backward sums of both paths are checked against a sum in
 * double. */
static void check_batchnorm_statistics(int C) {
    enum { ROWS = 3001 };
    const size_t n = (size_t)ROWS * C;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), *y2 = malloc(n * sizeof *y2);
    float *z = malloc(n * sizeof *z), *y3 = malloc(n * sizeof *y3), *dy = malloc(n * sizeof *dy);
    double *sum = calloc(C, sizeof *sum), *sq = calloc(C, sizeof *sq);
    float *pc = malloc(12 * C * sizeof *pc); /* per-channel vectors */
    float *gamma = pc, *beta = pc + C, *mean = pc + 2 * C, *var = pc + 3 * C, *inv = pc + 4 * C;
    float *mean2 = pc + 5 * C, *var2 = pc + 6 * C, *inv2 = pc + 7 * C, *sc = pc + 8 * C, *sh = pc + 9 * C;
    float *sc2 = pc + 10 * C, *sh2 = pc + 11 * C;
    double *work = calloc(dt_batchnorm_work_doubles(ROWS, C), sizeof *work);
    if (!x || !y || !y2 || !z || !y3 || !dy || !sum || !sq || !pc || !work) {
        CHECK(!"out of memory");
        return;
    }
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < C; c++) {
            x[r * C + c] = (c % 3 == 0 ? 1000.0f : c % 3 == 1 ? -3.0f : 0.0f) +
                           0.01f * (float)((r * 7919 + c * 31) % 201 - 100) / 100.0f;
            sum[c] += x[r * C + c];
        }
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < C; c++) sq[c] += (x[r * C + c] - sum[c] / ROWS) * (x[r * C + c] - sum[c] / ROWS);
    for (int c = 0; c < C; c++) gamma[c] = c % 3 == 0 ? 1 : c % 3 == 1 ? 2 : 0.5f, beta[c] = (float)(c % 3) - 1;
    dt_cpu saved = cpu;
    dt_cpu_init(&cpu, 1);
    dt_batchnorm_forward(&cpu, y, mean, var, inv, sc, sh, x, gamma, beta, ROWS, C, 1e-3f, 0, work);
    dt_cpu_init(&cpu, 2);
    dt_batchnorm_forward(&cpu, y2, mean2, var2, inv2, sc2, sh2, x, gamma, beta, ROWS, C, 1e-3f, 1, work);
    cpu = saved;
    for (int c = 0; c < C; c++) {
        double m = sum[c] / ROWS, v = sq[c] / ROWS;
        CHECK_MSG(fabs(mean[c] - m) <= 1e-6 * fabs(m) + 1e-9, "C %d channel %d: mean %.9g, want %.9g", C, c, mean[c], m);
        CHECK_MSG(fabs(var[c] - v) <= 1e-4 * v, "C %d channel %d: var %.9g, want %.9g", C, c, var[c], v);
        CHECK(mean[c] == mean2[c] && var[c] == var2[c] && inv[c] == inv2[c]);
    }
    for (size_t i = 0; i < n; i++) CHECK(y2[i] == (y[i] > 0 ? y[i] : 0)); /* the fused ReLU */
    /* The norm added to a residual in one pass (and its ReLU): y + z, within rounding. */
    for (int c = 0; c < C; c++) CHECK(sc[c] == sc2[c] && sh[c] == sh2[c]);
    for (size_t i = 0; i < n; i++) z[i] = (float)(i % 17) - 8.0f;
    dt_channel_affine_add_forward(&cpu, y3, x, sc, sh, z, ROWS, C, 1);
    for (size_t i = 0; i < n; i++) {
        float want = y[i] + z[i] > 0 ? y[i] + z[i] : 0;
        CHECK_MSG(fabsf(y3[i] - want) <= 1e-5f * (1 + fabsf(want)), "[%zu]: %.9g, want %.9g", i, y3[i], want);
    }
    /* Backward's sums, with the ReLU's mask and without: dbeta = sum g, dgamma = sum g * xhat. */
    for (size_t i = 0; i < n; i++) dy[i] = (float)((i * 37) % 23) / 11.0f - 1.0f;
    for (int relu = 0; relu <= 1; relu++) {
        float *dgamma = y3, *dbeta = y3 + C; /* y3 is free again */
        dt_batchnorm_backward(&cpu, NULL, dgamma, dbeta, dy, x, mean, inv, gamma, relu ? sc : NULL, relu ? sh : NULL,
                              ROWS, C, work);
        for (int c = 0; c < C; c++) {
            double sb = 0, sg = 0;
            for (int r = 0; r < ROWS; r++) {
                size_t i = (size_t)r * C + c;
                double g = relu && !(y2[i] > 0) ? 0.0 : dy[i];
                sb += g;
                sg += g * (((double)x[i] - mean[c]) * inv[c]);
            }
            CHECK_MSG(fabs(dbeta[c] - sb) <= 1e-5 * (1 + fabs(sb)), "C %d relu %d channel %d: dbeta %.9g, want %.9g", C,
                      relu, c, dbeta[c], sb);
            CHECK_MSG(fabs(dgamma[c] - sg) <= 1e-3 * (1 + fabs(sg)), "C %d relu %d channel %d: dgamma %.9g, want %.9g",
                      C, relu, c, dgamma[c], sg);
        }
    }
    free(x), free(y), free(y2), free(z), free(y3), free(dy), free(sum), free(sq), free(pc), free(work);
}

static void test_batchnorm_statistics(void) {
    check_batchnorm_statistics(3);
    check_batchnorm_statistics(32);
}

int main(void) {
    dt_cpu_init(&cpu, dt_cpu_default_threads());
    RUN(test_batchnorm_statistics);
    RUN(test_resnet_parses);
    RUN(test_stack_unchanged);
    RUN(test_graph_syntax);
    RUN(test_graph_errors);
    RUN(test_param_ranges);
    RUN(test_moving_statistics);
    return test_summary();
}
