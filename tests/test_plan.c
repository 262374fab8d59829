/* The net's execution plan (src/model/plan.c): every fused step gives what its parts give one by one
 * (a net with fusion off runs each layer as its own step), in training (forward, loss, gradients,
 * moving statistics, over steps that update the parameters) and in evaluation; the plans hold the
 * steps they should; a backward after an evaluation forward is refused (an invariant: it would
 * use another batch's batch-norm statistics); a forward that cannot run says why. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/rng.h"
#include "model/net.h"
#include "net_batch.h"
#include "test.h"

/* tests/fixtures/fusions.model holds every fusion the plans make, in one small graph. */
#define FUSIONS "tests/fixtures/fusions.model"

static dt_net *load(const char *path, int max_batch) {
    dt_error err = {0};
    dt_net *net = NULL;
    CHECK_MSG(dt_net_load(&net, path, max_batch, &err) == 0, "%s", err.msg);
    return net;
}

/* What dt_net_print_plan prints, into buf. */
static void plan_text(const dt_net *net, char *buf, size_t cap) {
    FILE *f = fmemopen(buf, cap, "w");
    if (!f) {
        buf[0] = 0;
        return;
    }
    dt_net_print_plan(net, f);
    fclose(f);
}

/* Whether the plan `which` ("training plan" or "evaluation plan") of a printed pair has a step of
 * this kind whose layers start with `layers` ("  12  batchnorm+relu           bn1, r1"). */
static int has_step(const char *text, const char *which, const char *kind, const char *layers) {
    const char *p = strstr(text, which);
    if (!p) return 0;
    for (const char *line = strchr(p, '\n'); line && line[1] == ' '; line = strchr(line + 1, '\n')) {
        char k[25];
        const char *nl = strchr(line + 1, '\n');
        if ((nl ? (size_t)(nl - line) : strlen(line)) < 8 + 24) continue;
        snprintf(k, sizeof k, "%.24s", line + 8);
        for (size_t e = strlen(k); e > 0 && k[e - 1] == ' '; e--) k[e - 1] = 0;
        if (!strcmp(k, kind) && !strncmp(line + 8 + 25, layers, strlen(layers))) return 1;
    }
    return 0;
}

static void test_plans_hold_the_fusions(void) {
    dt_net *net = load(FUSIONS, 2);
    if (!net) return;
    static char text[16384];
    plan_text(net, text, sizeof text);
    const char *T = "training plan", *E = "evaluation plan";
    CHECK_MSG(has_step(text, T, "batchnorm+relu", "bn1, r1"), "%s", text);
    CHECK(has_step(text, T, "batchnorm (statistics)", "b2 (applied by add1)"));
    CHECK(has_step(text, T, "batchnorm+add+relu", "add1, r2 (applies b2)"));
    CHECK(has_step(text, T, "batchnorm+add", "add2 (applies b3)"));
    CHECK(has_step(text, T, "add+relu", "add3, r4"));
    CHECK(has_step(text, T, "batchnorm+relu", "b5, r5"));
    CHECK(has_step(text, T, "batchnorm", "b6"));
    CHECK(has_step(text, T, "batchnorm", "b7"));
    CHECK(has_step(text, E, "conv2d+batchnorm", "conv1, bn1 (folded)"));
    CHECK(has_step(text, E, "relu", "r1"));
    CHECK(has_step(text, E, "conv2d+batchnorm", "conv2, b2 (folded)"));
    CHECK(has_step(text, E, "add+relu", "add1, r2"));
    CHECK(has_step(text, E, "conv2d+batchnorm", "conv3, b3 (folded)"));
    CHECK(has_step(text, E, "add", "add2"));
    CHECK(has_step(text, E, "batchnorm+relu", "b5, r5"));
    CHECK(has_step(text, E, "conv2d", "conv4"));
    CHECK(has_step(text, E, "batchnorm", "b7"));
    /* fusion off: a step per layer, nothing fused */
    dt_net_set_fusion(net, 0);
    plan_text(net, text, sizeof text);
    CHECK_MSG(strstr(text, "+") == NULL && strstr(text, "(0 fused)") != NULL, "%s", text);
    CHECK(has_step(text, T, "relu", "r1") && has_step(text, E, "batchnorm", "b2"));
    dt_net_free(net);
}

static int close_to(const float *a, const float *b, size_t n, double tol, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)a[i] - b[i]) <= tol * (1.0 + fabs((double)b[i])))) {
            fprintf(stderr, "%s [%zu]: %.9g fused, %.9g apart\n", what, i, a[i], b[i]);
            return 0;
        }
    return 1;
}

/* The same training steps and evaluations on a net with every fusion and one with none. */
static void compare_fused(const char *path, int batch) {
    dt_net *fused = load(path, batch), *parts = load(path, batch);
    if (!fused || !parts) {
        dt_net_free(fused), dt_net_free(parts);
        return;
    }
    dt_net_set_fusion(parts, 0);
    size_t np = dt_net_param_count(fused);
    int classes = dt_net_num_classes(fused);
    dt_net_init_params(fused, 3);
    dt_net_init_params(parts, 3);
    test_batch tb;
    int ok = test_batch_make(&tb, fused, batch, -0.5f, 11);
    const float *x = tb.x;
    const int32_t *y = tb.y;
    for (int step = 0; ok && step < 3; step++) {
        const float *lf = dt_net_forward(fused, x, batch, 1, 9, NULL);
        const float *lp = dt_net_forward(parts, x, batch, 1, 9, NULL);
        CHECK(lf && lp && close_to(lf, lp, (size_t)batch * classes, 1e-5, "training logits"));
        float loss_f = dt_net_loss(fused, y, NULL), loss_p = dt_net_loss(parts, y, NULL);
        CHECK_NEAR(loss_f, loss_p, 1e-5 * (1 + fabs(loss_p)));
        CHECK(dt_net_backward(fused, NULL) == 0 && dt_net_backward(parts, NULL) == 0);
        CHECK(close_to(dt_net_grads(fused), dt_net_grads(parts), np, 1e-4, "gradients"));
        CHECK(close_to(dt_net_params(fused), dt_net_params(parts), np, 1e-5, "moving statistics"));
        for (size_t i = 0; i < np; i++) dt_net_params(fused)[i] -= 0.05f * dt_net_grads(fused)[i];
        memcpy(dt_net_params(parts), dt_net_params(fused), np * sizeof(float));
        const float *ef = dt_net_forward(fused, x, batch, 0, 0, NULL);
        const float *ep = dt_net_forward(parts, x, batch, 0, 0, NULL);
        CHECK(ef && ep && close_to(ef, ep, (size_t)batch * classes, 1e-4, "evaluation logits"));
    }
    if (ok) test_batch_free(&tb);
    dt_net_free(fused), dt_net_free(parts);
}

static void test_fused_steps_against_their_parts(void) {
    compare_fused(FUSIONS, 5);
    compare_fused("tests/fixtures/layers.model", 3); /* every layer kind */
    compare_fused("models/resnet.model", 2);         /* the shipped residual network */
}

/* Backward after an evaluation forward: the batch-norm statistics would be the last training
 * batch's. An invariant of the net: DT_ASSERT aborts where the process is set to (the tests are),
 * and a release build refuses it with an error, the gradients untouched. Run in a child process
 * of its own: this program again, started afresh (a fork of a process that has run OpenMP can hang
 * in it). */
static int backward_after_evaluation_child(void) {
    dt_net *net = load(FUSIONS, 2);
    if (!net) return 2;
    dt_net_init_params(net, 1);
    float x[2 * 8 * 8 * 3] = {0};
    int32_t y[2] = {0, 1};
    dt_error err = {0};
    dt_net_forward(net, x, 2, 1, 0, NULL);
    dt_net_loss(net, y, NULL);
    dt_net_backward(net, NULL);
    memset(dt_net_grads(net), 0x7f, dt_net_param_count(net) * sizeof(float));
    dt_net_forward(net, x, 2, 0, 0, NULL);
    dt_net_loss(net, y, NULL);
    int rc = dt_net_backward(net, &err), untouched = 1;
    for (size_t i = 0; i < dt_net_param_count(net); i++) {
        uint32_t bits;
        memcpy(&bits, &dt_net_grads(net)[i], 4);
        untouched &= bits == 0x7f7f7f7fu;
    }
    fprintf(stderr, "rc %d: %s\n", rc, err.msg);
    dt_net_free(net);
    return rc == DT_EINVAL && untouched && strstr(err.msg, "evaluation") ? 42 : 1;
}

/* Runs that child (this program again) with DTRAIN_ABORT_ON_ASSERT as given: its wait status and
 * what it wrote. */
static int backward_after_evaluation(const char *env, char *out, size_t cap) {
    char self[4096], cmd[4200];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return -1;
    self[n] = 0;
    snprintf(cmd, sizeof cmd, "env %s%s '%s' backward_after_evaluation 2>&1",
             env ? "DTRAIN_ABORT_ON_ASSERT=" : "-u DTRAIN_ABORT_ON_ASSERT", env ? env : "", self);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t got = fread(out, 1, cap - 1, p);
    out[got] = 0;
    return pclose(p);
}

static void test_backward_after_evaluation(void) {
    char out[2048];
    int st = backward_after_evaluation("1", out, sizeof out);
    /* the child aborted (or the shell that waited for it says 128 + SIGABRT) */
    int aborted = (WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT) || (WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGABRT);
    CHECK_MSG(aborted, "status %d: %s", st, out);
    CHECK_CONTAINS(out, "net.c:");
    CHECK_CONTAINS(out, "invariant failed: net->training");
#ifdef NDEBUG
    st = backward_after_evaluation(NULL, out, sizeof out); /* release: refused, with an error */
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 42, "status %d: %s", st, out);
#endif
}

/* A call out of order is an error, not an invariant: said, and refused. */
static void test_calls_that_cannot_run(void) {
    dt_net *net = load(FUSIONS, 2);
    if (!net) return;
    dt_error err = {0};
    float x[3 * 8 * 8 * 3] = {0};
    CHECK(dt_net_backward(net, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "no loss");
    CHECK(dt_net_forward(net, x, 3, 1, 0, &err) == NULL);
    CHECK_CONTAINS(err.msg, "batch 3 out of range [1, 2]");
    CHECK(dt_net_forward(net, x, 0, 0, 0, NULL) == NULL); /* err may be NULL */
    CHECK(dt_net_forward(net, x, 2, 0, 0, &err) != NULL);
    dt_net_free(net);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "backward_after_evaluation")) return backward_after_evaluation_child();
    RUN(test_plans_hold_the_fusions);
    RUN(test_fused_steps_against_their_parts);
    RUN(test_backward_after_evaluation);
    RUN(test_calls_that_cannot_run);
    return test_summary();
}
