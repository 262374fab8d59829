/* The ONNX writer on its own (export/export.h), where the shell test cannot reach: every checked
 * allocation made to fail in turn leaves an error, no file and no temporary file (and, under the
 * sanitizers, no leak); the same net gives the same bytes twice; an opset out of range is refused.
 * Running the files in real runtimes is tests/test_export.sh's. */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "export/export.h"
#include "io/fsutil.h"
#include "model/net.h"
#include "test.h"

static char dir[] = "/tmp/dt_export_onnx_XXXXXX";
static char out_a[64], out_b[64]; /* files in dir */

static dt_net *load_net(const char *path) {
    dt_model_spec spec;
    dt_error e = {0};
    dt_net *net = NULL;
    CHECK(dt_model_spec_load(&spec, path, &e) == 0);
    CHECK(dt_net_build(&net, &spec, 1, &e) == 0);
    dt_model_spec_free(&spec);
    if (net) dt_net_init_params(net, 7);
    return net;
}

static dt_net *every_layer_net(void) { return load_net("tests/onnx/every_layer.model"); }

static int entries(const char *path) {
    DIR *d = opendir(path);
    int n = 0;
    for (struct dirent *de; d && (de = readdir(d));) n += de->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

static void test_same_bytes_twice(void) {
    dt_net *net = every_layer_net();
    if (!net) return;
    const char *a = out_a, *b = out_b;
    dt_onnx_meta meta = {.global_step = 5};
    dt_onnx_stats st;
    dt_error e = {0};
    CHECK(dt_onnx_export_net(net, 13, &meta, a, &st, &e) == 0);
    CHECK(dt_onnx_export_net(net, 13, &meta, b, NULL, &e) == 0);
    uint8_t *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    CHECK(dt_read_file(&x, &nx, a, 1 << 24, &e) == 0 && dt_read_file(&y, &ny, b, 1 << 24, &e) == 0);
    CHECK(nx == st.bytes && nx == ny && x && y && !memcmp(x, y, nx));
    CHECK(st.param_bytes == dt_net_param_count(net) * sizeof(float) && st.bytes > st.init_bytes);
    free(x);
    free(y);
    unlink(a);
    unlink(b);
    dt_net_free(net);
}

static void test_opset_range(void) {
    dt_net *net = every_layer_net();
    if (!net) return;
    const char *a = out_a;
    dt_onnx_meta meta = {.global_step = -1};
    dt_error e = {0};
    CHECK(dt_onnx_export_net(net, 12, &meta, a, NULL, &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "opset 12 is not supported: from 13 to 21");
    CHECK(dt_onnx_export_net(net, 22, &meta, a, NULL, &e) == DT_EINVAL);
    CHECK(access(a, F_OK) != 0);
    dt_net_free(net);
}

/* Each checked allocation of an export to path fails in turn, each leaving an error and no file in dir,
 * until an export goes through: the allocations failed, or -1 if none went through. */
static int fail_each_allocation(dt_net *net, const dt_onnx_meta *meta, const char *path) {
    int failed = 0;
    for (long n = 1; n < 10000; n++) {
        dt_error e = {0};
        dt_alloc_fail_after(n);
        int rc = dt_onnx_export_net(net, 13, meta, path, NULL, &e);
        dt_alloc_fail_after(0);
        if (rc == 0) return failed;
        failed++;
        CHECK_MSG(rc == DT_ENOMEM && strstr(e.msg, "out of memory"), "allocation %ld: rc %d, %s", n, rc, e.msg);
        CHECK_MSG(entries(dir) == 0, "allocation %ld left a file", n);
    }
    return -1;
}

/* Each checked allocation of an export fails in turn, until an export goes through. */
static void test_every_allocation_fails_cleanly(void) {
    dt_net *net = every_layer_net();
    if (!net) return;
    const char *a = out_a;
    char *names[2] = {"cat", "dog"};
    dt_onnx_meta meta = {.global_step = 1, .class_names = names, .n_class_names = 2};
    int failed = fail_each_allocation(net, &meta, a);
    CHECK(failed > 50); /* the every-layer graph makes a few hundred */
    fprintf(stderr, "  %d allocations failed in turn, each cleanly\n", failed);
    unlink(a);
    dt_net_free(net);
}

/* A click-log model (every embedding form, fm, a tower) with its larger initializers in external data
 * (forced: external_above 1): every allocation failing in turn leaves neither file; the export that
 * goes through writes both, the model naming its own data file, and the same data twice. */
static void test_ctr_external_data(void) {
    dt_net *net = load_net("tests/onnx/ctr_layers.model");
    if (!net) return;
    const char *a = out_a;
    char data[80];
    snprintf(data, sizeof data, "%s.data", a);
    dt_onnx_meta meta = {.global_step = 3, .external_above = 1};
    CHECK(fail_each_allocation(net, &meta, a) > 50);
    dt_onnx_stats st;
    dt_error e = {0};
    CHECK(dt_onnx_export_net(net, 13, &meta, out_b, &st, &e) == 0);
    /* the shared table v (101 x 4 floats) is the one initializer of 1 KiB or more */
    CHECK_MSG(st.external_bytes == 101 * 4 * sizeof(float), "%zu bytes of external data", st.external_bytes);
    uint8_t *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    CHECK(dt_read_file(&x, &nx, a, 1 << 24, &e) == 0 && dt_read_file(&y, &ny, out_b, 1 << 24, &e) == 0);
    CHECK(nx == st.bytes && nx == ny && x && y);
    CHECK(x && memmem(x, nx, "a.onnx.data", 11) && !memmem(x, nx, "b.onnx.data", 11)); /* its own data file */
    free(x);
    free(y);
    char data_b[80];
    snprintf(data_b, sizeof data_b, "%s.data", out_b);
    x = y = NULL;
    CHECK(dt_read_file(&x, &nx, data, 1 << 24, &e) == 0 && dt_read_file(&y, &ny, data_b, 1 << 24, &e) == 0);
    CHECK(nx == st.external_bytes && nx == ny && x && y && !memcmp(x, y, nx));
    free(x);
    free(y);
    unlink(a);
    unlink(data);
    unlink(out_b);
    unlink(data_b);
    dt_net_free(net);
}

/* A compact net (a cluster worker's: its tables are blocks of one batch's rows) is refused, not written
 * with blocks read as whole tables. */
static void test_compact_net_refused(void) {
    dt_model_spec spec;
    dt_error e = {0};
    dt_net *net = NULL;
    CHECK(dt_model_spec_load(&spec, "tests/onnx/ctr_layers.model", &e) == 0);
    CHECK(dt_net_build_compact(&net, &spec, 4, &e) == 0);
    dt_model_spec_free(&spec);
    if (!net) return;
    dt_onnx_meta meta = {.global_step = -1};
    CHECK(dt_onnx_export_net(net, 13, &meta, out_a, NULL, &e) == DT_EINVAL);
    CHECK_CONTAINS(e.msg, "ctr_layers.model:7: embedding lin: the net holds blocks of a batch's rows");
    CHECK(entries(dir) == 0);
    dt_net_free(net);
}

int main(void) {
    if (!mkdtemp(dir)) return 1;
    snprintf(out_a, sizeof out_a, "%s/a.onnx", dir);
    snprintf(out_b, sizeof out_b, "%s/b.onnx", dir);
    RUN(test_same_bytes_twice);
    RUN(test_opset_range);
    RUN(test_every_allocation_fails_cleanly);
    RUN(test_ctr_external_data);
    RUN(test_compact_net_refused);
    rmdir(dir);
    return test_summary();
}
