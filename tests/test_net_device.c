/* The net's device path (model/net.c with a device backend) on any machine: a stand-in device whose
 * "device memory" is separate host memory, whose copies are memcpy and whose kernels are the CPU's.
 * A net on it must give the CPU net's logits, loss and gradients bit for bit, so every parameter
 * range must go up before its layer runs (after the before_forward hook, which may have just
 * written it), every gradient range must come down, the hooks must see the same ranges in the same
 * order, and the input and logits must travel. The CUDA backend plugs its copies and streams into
 * the same places (docs/gpu.md). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compute/backend.h"
#include "compute/kernels.h"
#include "core/rng.h"
#include "model/net.h"
#include "net_batch.h"
#include "test.h"

/* ---- the stand-in device ---- */

/* Its context: the CPU's (its kernels run on the CPU, so it comes first: the CPU's ops read it
 * there) and what the test counts. Each net of a test gets its own. */
typedef struct {
    dt_cpu cpu;
    int upload_params, download_grads, closed, pinned, synced;
    int waited[DT_MODEL_MAX_LAYERS], n_waited;
} fake_ctx;

static void fake_upload_params(void *ctx, float *dev, const float *host, size_t n) {
    memcpy(dev, host, n * sizeof *dev);
    ((fake_ctx *)ctx)->upload_params++;
}
static void fake_download_grads(void *ctx, float *host, const float *dev, size_t n, int slot) {
    memcpy(host, dev, n * sizeof *dev);
    ((fake_ctx *)ctx)->download_grads++;
}
static void fake_wait_slot(void *ctx, int slot) {
    fake_ctx *f = ctx;
    if (f->n_waited < DT_MODEL_MAX_LAYERS) f->waited[f->n_waited++] = slot;
}
static void fake_upload(void *ctx, void *dev, const void *host, size_t bytes) { memcpy(dev, host, bytes); }
static void fake_download(void *ctx, void *host, const void *dev, size_t bytes) { memcpy(host, dev, bytes); }
static void fake_sync(void *ctx) { ((fake_ctx *)ctx)->synced++; }
static int fake_pin(void *ctx, void *p, size_t bytes) { return ((fake_ctx *)ctx)->pinned++, 0; }
static void fake_unpin(void *ctx, void *p) { ((fake_ctx *)ctx)->pinned--; }
static void fake_close(void *ctx) { ((fake_ctx *)ctx)->closed++; }

/* The CPU's kernels and memory under another name, with a device's copies. */
static dt_backend fake_device(fake_ctx *f) {
    static dt_backend_ops ops;
    static dt_buffer_ops buf;
    ops = dt_cpu_ops;
    ops.name = "fake";
    ops.close = fake_close;
    buf = dt_cpu_buffers;
    buf.on_device = 1;
    buf.upload_params = fake_upload_params;
    buf.download_grads = fake_download_grads;
    buf.wait_slot = fake_wait_slot;
    buf.upload = fake_upload;
    buf.download = fake_download;
    buf.sync = fake_sync;
    buf.pin = fake_pin;
    buf.unpin = fake_unpin;
    memset(f, 0, sizeof *f);
    dt_cpu_init(&f->cpu, 0);
    return (dt_backend){&ops, &buf, f};
}

/* ---- hooks that record, and one that writes the parameters it is told about ---- */

typedef struct {
    int n, kind[512];
    size_t off[512], cnt[512];
    float *params; /* if set, before_forward writes this range (as the overlap engine does) */
    float value;
} record;

static void rec(record *r, int kind, size_t off, size_t cnt) {
    if (r->n < 512) r->kind[r->n] = kind, r->off[r->n] = off, r->cnt[r->n] = cnt, r->n++;
}
static void before(void *u, size_t off, size_t cnt) {
    record *r = u;
    rec(r, 0, off, cnt);
    if (r->params) r->params[off] = r->value;
}
static void after(void *u, size_t off, size_t cnt) { rec(u, 1, off, cnt); }

/* ---- the comparison ---- */

static void same_floats(const char *what, const float *a, const float *b, size_t n) {
    CHECK_MSG(a && b && memcmp(a, b, n * sizeof *a) == 0, "%s differs", what);
}

static void compare(const char *path, int batch) {
    dt_error err = {0};
    dt_net *cpu = NULL, *dev = NULL;
    CHECK_MSG(dt_net_load(&cpu, path, batch, &err) == 0, "%s", err.msg);
    CHECK_MSG(dt_net_load(&dev, path, batch, &err) == 0, "%s", err.msg);
    if (!cpu || !dev) {
        dt_net_free(cpu), dt_net_free(dev);
        return;
    }
    fake_ctx f;
    dt_backend k = fake_device(&f);
    CHECK_MSG(dt_net_set_backend(dev, &k, &err) == 0, "%s", err.msg);
    CHECK(strcmp(dt_net_device(dev), "fake") == 0);
    CHECK(f.pinned == 2);
    size_t np = dt_net_param_count(cpu);
    int classes = dt_net_num_classes(cpu);
    dt_net_init_params(cpu, 5);
    dt_net_init_params(dev, 5);
    test_batch tb;
    if (!test_batch_make(&tb, cpu, batch, 0.0f, 3)) {
        CHECK(!"out of memory");
        dt_net_free(cpu), dt_net_free(dev);
        return;
    }
    const float *x = tb.x;
    const int32_t *labels = tb.y;
    record rc_cpu = {0}, rc_dev = {0};
    dt_net_hooks hc = {before, after, &rc_cpu}, hd = {before, after, &rc_dev};
    dt_net_set_hooks(cpu, &hc);
    dt_net_set_hooks(dev, &hd);

    for (int round = 0; round < 3; round++) {
        /* round 1: the host parameters change between steps (an update); round 2: the hook writes
         * each layer's first parameter just before the layer runs (a chunk landing) */
        if (round == 1)
            for (size_t i = 0; i < np; i++) dt_net_params(cpu)[i] *= 0.5f, dt_net_params(dev)[i] *= 0.5f;
        if (round == 2) rc_cpu.params = dt_net_params(cpu), rc_dev.params = dt_net_params(dev);
        rc_cpu.value = rc_dev.value = 0.01f * (float)(round + 1);
        rc_cpu.n = rc_dev.n = 0, f.n_waited = 0;
        int ups = f.upload_params, downs = f.download_grads;
        const float *lc = dt_net_forward(cpu, x, batch, 1, 77, NULL), *ld = dt_net_forward(dev, x, batch, 1, 77, NULL);
        CHECK(ld != NULL && ld != lc);
        same_floats("training logits", lc, ld, (size_t)batch * classes);
        int cc = -1, cd = -2;
        float loss_c = dt_net_loss(cpu, labels, &cc), loss_d = dt_net_loss(dev, labels, &cd);
        CHECK(loss_c == loss_d && cc == cd);
        memset(dt_net_grads(dev), 0xff, np * sizeof(float)); /* NaN: what the device does not bring down shows */
        dt_net_backward(cpu, NULL);
        dt_net_backward(dev, NULL);
        same_floats("gradients", dt_net_grads(cpu), dt_net_grads(dev), np);
        same_floats("parameters", dt_net_params(cpu), dt_net_params(dev), np);
        /* the hooks: the same calls, ranges and order */
        CHECK(rc_cpu.n == rc_dev.n && rc_cpu.n > 0);
        int same = rc_cpu.n == rc_dev.n;
        for (int i = 0; same && i < rc_cpu.n; i++)
            same = rc_cpu.kind[i] == rc_dev.kind[i] && rc_cpu.off[i] == rc_dev.off[i] && rc_cpu.cnt[i] == rc_dev.cnt[i];
        CHECK_MSG(same, "%s round %d: the hooks differ", path, round);
        int layers_with_params = 0;
        for (int i = 0; i < rc_cpu.n; i++) layers_with_params += rc_cpu.kind[i] == 1;
        CHECK(f.upload_params - ups == layers_with_params && f.download_grads - downs == layers_with_params);
        CHECK(f.n_waited == layers_with_params);
        for (int i = 1; i < f.n_waited; i++) CHECK(f.waited[i] < f.waited[i - 1]); /* the last layer first */
    }
    /* evaluation */
    const float *ec = dt_net_forward(cpu, x, batch, 0, 0, NULL), *ed = dt_net_forward(dev, x, batch, 0, 0, NULL);
    same_floats("evaluation logits", ec, ed, (size_t)batch * classes);
    CHECK(dt_net_status(dev, &err) == 0);
    dt_net_free(cpu);
    dt_net_free(dev);
    CHECK(f.closed == 1);
    CHECK(f.pinned == 0); /* every pin undone */
    test_batch_free(&tb);
}

static void test_fashion(void) { compare("models/fashion.model", 4); }
static void test_catdog(void) { compare("models/catdog.model", 2); }
/* graph layers, dropout (the mask is made on the device side), concat, add, pools */
static void test_cuda_layers(void) { compare("tests/fixtures/cuda_layers.model", 5); }

/* A layer the device has no kernel for: refused naming it; the net stays on the CPU and works. */
static void test_refused(void) {
    dt_error err = {0};
    dt_net *net = NULL;
    CHECK_MSG(dt_net_load(&net, "tests/fixtures/layers.model", 2, &err) == 0, "%s", err.msg);
    if (!net) return;
    fake_ctx f;
    dt_backend k = fake_device(&f);
    CHECK(dt_net_set_backend(net, &k, &err) != 0);
    CHECK_CONTAINS(err.msg, "not supported on fake yet: layer bn1 (batchnorm)");
    CHECK(strcmp(dt_net_device(net), "cpu") == 0);
    float x[2 * 12 * 12 * 2] = {0};
    CHECK(dt_net_forward(net, x, 2, 0, 0, NULL) != NULL);
    dt_net_free(net);
}

/* A bf16 net (--precision bf16) stays on the CPU: a device computes in float32. */
static void test_refused_bf16(void) {
    if (!dt_cpu_has_bf16()) return; /* no bf16 net to refuse */
    dt_error err = {0};
    dt_net *net = NULL;
    CHECK_MSG(dt_net_load(&net, "models/fashion.model", 2, &err) == 0, "%s", err.msg);
    if (!net) return;
    CHECK_MSG(dt_net_set_precision(net, "bf16", &err) == 0, "%s", err.msg);
    fake_ctx f = {0};
    dt_backend k = fake_device(&f);
    CHECK(dt_net_set_backend(net, &k, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "--device fake: precision bf16 is for the CPU only");
    CHECK(strcmp(dt_net_device(net), "cpu") == 0 && f.pinned == 0);
    dt_net_free(net);
}

int main(void) {
    RUN(test_fashion);
    RUN(test_catdog);
    RUN(test_cuda_layers);
    RUN(test_refused);
    RUN(test_refused_bf16);
    return test_summary();
}
