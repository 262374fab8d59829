/* The model-file parser: the shipped models parse to the layers they describe, and every kind of
 * mistake gives one message that names file:line and what is wrong. */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "model/spec.h"
#include "spec_check.h"
#include "test.h"

#define HEAD "model t\ninput 8 8 1\n"
#define TAIL "flatten\ndense units=3\n"

static void test_fashion(void) {
    dt_model_spec s;
    dt_error err = {0};
    int rc = dt_model_spec_load(&s, "models/fashion.model", &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc) return;
    CHECK(strcmp(s.name, "fashion") == 0);
    CHECK(s.in_h == 28 && s.in_w == 28 && s.in_c == 1);
    static const dt_layer_kind kinds[] = {DT_LAYER_CONV2D, DT_LAYER_RELU,    DT_LAYER_MAXPOOL,
                                          DT_LAYER_CONV2D, DT_LAYER_RELU,    DT_LAYER_MAXPOOL,
                                          DT_LAYER_FLATTEN, DT_LAYER_DENSE,  DT_LAYER_RELU,
                                          DT_LAYER_DENSE};
    CHECK(s.n_layers == 10);
    for (int i = 0; i < s.n_layers && i < 10; i++) CHECK(s.layers[i].kind == kinds[i]);
    CHECK(s.layers[0].filters == 32 && s.layers[0].k_h == 3 && s.layers[0].k_w == 3);
    CHECK(s.layers[0].padding == DT_PAD_SAME && s.layers[0].use_bias);
    CHECK(s.layers[0].weight_init.kind == DT_INIT_GLOROT_UNIFORM);
    CHECK(s.layers[0].bias_init.kind == DT_INIT_CONSTANT && s.layers[0].bias_init.value == 0);
    CHECK(s.layers[3].filters == 64);
    CHECK(s.layers[2].k_h == 2 && s.layers[2].stride_h == 2 && s.layers[2].stride_w == 2);
    CHECK(s.layers[7].units == 128 && s.layers[9].units == 10);
    CHECK(strcmp(s.layers[0].name, "conv1") == 0 && strcmp(s.layers[3].name, "conv2") == 0);
    CHECK(strcmp(s.layers[7].name, "dense1") == 0 && strcmp(s.layers[9].name, "dense2") == 0);
    CHECK(strcmp(s.layers[2].name, "pool1") == 0 && strcmp(s.layers[4].name, "relu2") == 0);
    CHECK(s.layers[9].line > s.layers[0].line);
    CHECK(s.text && s.text_len > 0 && strstr(s.text, "model fashion"));

    dt_layer_shape sh[10];
    size_t count = 0;
    CHECK(dt_model_spec_shapes(&s, sh, &count, &err) == 0);
    CHECK(sh[2].out_h == 14 && sh[2].out_w == 14 && sh[2].out_c == 32);
    CHECK(sh[5].out_h == 7 && sh[5].out_c == 64);
    CHECK(sh[6].flat && sh[6].out_c == 7 * 7 * 64);
    CHECK(count == (size_t)(9 * 32 + 32 + 9 * 32 * 64 + 64 + 3136 * 128 + 128 + 128 * 10 + 10));
    dt_model_spec_free(&s);
}

static void test_catdog(void) {
    dt_model_spec s;
    dt_error err = {0};
    int rc = dt_model_spec_load(&s, "models/catdog.model", &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc) return;
    CHECK(s.in_h == 128 && s.in_w == 128 && s.in_c == 3);
    size_t count = 0;
    dt_layer_shape sh[16];
    CHECK(s.n_layers == 13);
    CHECK(dt_model_spec_shapes(&s, sh, &count, &err) == 0);
    CHECK(count == 2126178);
    /* conv -> pool -> relu per block, as in the source */
    for (int b = 0; b < 3; b++) {
        const dt_layer_spec *c = &s.layers[3 * b];
        CHECK(c->kind == DT_LAYER_CONV2D && s.layers[3 * b + 1].kind == DT_LAYER_MAXPOOL &&
              s.layers[3 * b + 2].kind == DT_LAYER_RELU);
        CHECK(c->filters == (b == 2 ? 64 : 32));
        CHECK(c->weight_init.kind == DT_INIT_TRUNC_NORMAL && c->weight_init.value == 0.05f);
        CHECK(c->bias_init.kind == DT_INIT_CONSTANT && c->bias_init.value == 0.05f);
        CHECK(s.layers[3 * b + 1].padding == DT_PAD_SAME);
    }
    CHECK(sh[8].out_h == 16 && sh[8].out_w == 16 && sh[8].out_c == 64);
    CHECK(sh[9].out_c == 16384);
    CHECK(s.layers[12].units == 2);
    dt_model_spec_free(&s);
}

static void test_syntax_accepted(void) {
    dt_model_spec s;
    dt_error err;
    /* comments, blank lines, CRLF, tabs, HxW pairs, options in any order, no model line */
    const char *t = "# a comment\r\n\r\ninput\t6 8 2   # trailing\r\n"
                    "conv2d padding=valid kernel=3x1 filters=4 stride=1x2 use_bias=false weight_init=he_uniform\r\n"
                    "dropout rate=0.25\nmaxpool size=2\nflatten\n"
                    "dense units=5 bias_init=constant(-0.5) weight_init=truncated_normal(1e-2)\ndense units=2";
    int rc = parse(t, &err, &s);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc) return;
    CHECK(strcmp(s.name, "t") == 0); /* from the file name t.model */
    CHECK(s.in_h == 6 && s.in_w == 8 && s.in_c == 2);
    CHECK(s.layers[0].k_h == 3 && s.layers[0].k_w == 1 && s.layers[0].stride_h == 1 && s.layers[0].stride_w == 2);
    CHECK(!s.layers[0].use_bias && s.layers[0].weight_init.kind == DT_INIT_HE_UNIFORM);
    CHECK(s.layers[1].rate == 0.25f);
    /* maxpool stride defaults to its size, padding to valid (as Keras) */
    CHECK(s.layers[2].stride_h == 2 && s.layers[2].stride_w == 2 && s.layers[2].padding == DT_PAD_VALID);
    CHECK(s.layers[4].bias_init.value == -0.5f && s.layers[4].weight_init.value == 0.01f);
    CHECK(s.layers[0].line == 4 && s.layers[5].line == 9);
    size_t count;
    dt_layer_shape sh[6];
    CHECK(dt_model_spec_shapes(&s, sh, &count, &err) == 0);
    /* 6x8 conv 3x1 valid stride 1x2 -> 4x4x4; pool 2 -> 2x2x4 = 16 */
    CHECK(sh[0].out_h == 4 && sh[0].out_w == 4 && sh[3].out_c == 16);
    CHECK(count == (size_t)(3 * 1 * 2 * 4 + 16 * 5 + 5 + 5 * 2 + 2));

    dt_model_spec copy;
    CHECK(dt_model_spec_copy(&copy, &s, &err) == 0);
    CHECK(copy.layers != s.layers && copy.text != s.text && copy.n_layers == s.n_layers);
    CHECK(memcmp(copy.layers, s.layers, sizeof *s.layers * (size_t)s.n_layers) == 0);
    CHECK(strcmp(copy.text, s.text) == 0);
    dt_model_spec_free(&s);
    dt_model_spec_free(&copy);
}

static void test_errors(void) {
    /* misspelled keywords get a suggestion */
    expect_error(3, HEAD "conv filters=2 kernel=3\n" TAIL, "unknown layer 'conv'", "did you mean 'conv2d'?");
    expect_error(3, HEAD "dense unit=3\n", "unknown option 'unit' for dense", "did you mean 'units'?");
    expect_error(3, HEAD "conv2d filters=2 kernel=3 padding=smae\n" TAIL, "padding", "did you mean 'same'?");
    expect_error(3, HEAD "conv2d filters=2 kernel=3 weight_init=glorot_unifrom\n" TAIL, "glorot_unifrom",
                 "did you mean 'glorot_uniform'?");
    expect_error(1, "modle t\n", "unknown layer 'modle'", "did you mean 'model'?");
    expect_error(3, HEAD "softmax\n", "unknown layer 'softmax'", "expected one of:");
    /* missing input line */
    expect_error(2, "model t\nconv2d filters=2 kernel=3\n", "before the 'input", NULL);
    expect_error(1, "# nothing\n", "missing 'input", NULL);
    expect_error(1, "", "missing 'input", NULL);
    expect_error(2, "model t\ninput 8 8\n", "input HEIGHT WIDTH CHANNELS", NULL);
    /* bad numbers */
    expect_error(3, HEAD "conv2d filters=abc kernel=3\n" TAIL, "bad value 'abc' for filters", NULL);
    expect_error(3, HEAD "conv2d filters=0 kernel=3\n" TAIL, "filters", "from 1 to 65536");
    expect_error(3, HEAD "conv2d filters=-2 kernel=3\n" TAIL, "filters", NULL);
    expect_error(3, HEAD "conv2d filters=2.5 kernel=3\n" TAIL, "filters", NULL);
    expect_error(3, HEAD "conv2d filters=2 kernel=3x\n" TAIL, "kernel", NULL);
    expect_error(2, "model t\ninput 8 x 1\n", "bad value 'x' for width", NULL);
    expect_error(3, HEAD "dropout rate=1.5\n" TAIL, "rate", "[0, 1)");
    expect_error(3, HEAD "dropout rate=nan\n" TAIL, "rate", NULL);
    expect_error(3, HEAD "conv2d filters=2 kernel=3 weight_init=truncated_normal(-1)\n" TAIL, "stddev", NULL);
    expect_error(3, HEAD "conv2d filters=2 kernel=3 weight_init=truncated_normal(0.1\n" TAIL, "truncated_normal", NULL);
    expect_error(3, HEAD "conv2d filters=2 kernel=3 bias_init=constant(x)\n" TAIL, "bad number 'x'", NULL);
    expect_error(3, HEAD "conv2d filters=2 kernel=3 weight_init=he_uniform(2)\n" TAIL, "takes no argument", NULL);
    expect_error(3, HEAD "conv2d filters=2 kernel=3 use_bias=maybe\n" TAIL, "use_bias", NULL);
    /* unknown, duplicate, missing options */
    expect_error(3, HEAD "maxpool size=2 filters=3\n" TAIL, "unknown option 'filters' for maxpool", NULL);
    expect_error(3, HEAD "relu alpha=0.1\n" TAIL, "relu takes no options", NULL);
    expect_error(3, HEAD "conv2d filters=2 kernel=3 filters=4\n" TAIL, "duplicate option 'filters'", NULL);
    expect_error(3, HEAD "conv2d kernel=3\n" TAIL, "conv2d needs filters=", NULL);
    expect_error(3, HEAD "maxpool stride=2\n" TAIL, "maxpool needs size=", NULL);
    expect_error(3, HEAD "conv2d filters=2 kernel=3 same\n" TAIL, "expected key=value", NULL);
    expect_error(3, HEAD "conv2d filters=2 kernel=\n" TAIL, "missing value for 'kernel'", NULL);
    expect_error(3, HEAD "dense units=3 use_bias=false bias_init=constant(1)\n", "use_bias=false", NULL);
    expect_error(3, HEAD "input 8 8 1\n", "duplicate 'input'", NULL);
    expect_error(3, HEAD "model u\n", "duplicate 'model'", NULL);
    expect_error(2, "input 8 8 1\nmodel t\n" TAIL, "must come before", NULL);
    /* shapes that do not fit */
    expect_error(3, HEAD "conv2d filters=2 kernel=9\n" TAIL, "conv2d", "larger than");
    expect_error(4, HEAD "maxpool size=4\nconv2d filters=2 kernel=3\n" TAIL, "conv2d", "larger than");
    expect_error(3, HEAD "dense units=3\n", "add a 'flatten'", NULL);
    expect_error(4, HEAD "flatten\nconv2d filters=2 kernel=1\n" TAIL, "flattened at line 3", NULL);
    /* the end must be a dense layer with >= 2 units */
    expect_error(5, HEAD "flatten\ndense units=3\nrelu\n", "must end with a dense layer", NULL);
    expect_error(4, HEAD "flatten\ndense units=1\n", "units >= 2", NULL);
    expect_error(2, "model t\ninput 8 8 1\n", "no layers", NULL);
    /* too big */
    expect_error(2, "model t\ninput 65537 1 1\n", "height", "65536");
    expect_error(2, "model t\ninput 65536 65536 1\n" TAIL, "input", "values per example");
    expect_error(5, HEAD "flatten\ndense units=65536\ndense units=65536\ndense units=2\n", "too many parameters", NULL);
    expect_error(3, "model t\ninput 16384 16384 1\nconv2d filters=1 kernel=5 padding=same\n" TAIL, "too large", NULL);
    expect_error(3, "model t\ninput 8192 8192 1\nconv2d filters=8 kernel=1\n" TAIL, "values per example", NULL);
    /* not text */
    {
        const char bin[] = "model t\ninput 8 8 1\nre\0lu\n";
        dt_model_spec s;
        dt_error err = {0};
        CHECK(dt_model_spec_parse(&s, bin, sizeof bin - 1, "t.model", &err) < 0);
        CHECK_CONTAINS(err.msg, "t.model:3: NUL byte");
    }
}

static void test_limits_and_io(void) {
    dt_model_spec s;
    dt_error err = {0};
    CHECK(dt_model_spec_load(&s, "models/does-not-exist.model", &err) == DT_EIO);
    CHECK_CONTAINS(err.msg, "models/does-not-exist.model");
    /* too many layers */
    size_t cap = 64 + (DT_MODEL_MAX_LAYERS + 2) * 6;
    char *t = malloc(cap);
    size_t n = (size_t)snprintf(t, cap, "input 2 2 1\n");
    for (int i = 0; i < DT_MODEL_MAX_LAYERS + 1; i++) n += (size_t)snprintf(t + n, cap - n, "relu\n");
    memset(&err, 0, sizeof err);
    CHECK(dt_model_spec_parse(&s, t, n, "big.model", &err) < 0);
    char where[64];
    snprintf(where, sizeof where, "big.model:%d: too many layers", DT_MODEL_MAX_LAYERS + 2);
    CHECK_CONTAINS(err.msg, where);
    free(t);
    /* a name that does not fit the name field */
    expect_error(1, "model aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n",
                 "bad model name", NULL);
    /* the parser needs no NUL terminator: a length that cuts the text must be honoured */
    const char *text = "input 4 4 1\nflatten\ndense units=2\ndense units=1";
    memset(&err, 0, sizeof err);
    int rc = dt_model_spec_parse(&s, text, strlen(text) - strlen("\ndense units=1"), "cut.model", &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc == 0) {
        CHECK(s.n_layers == 2 && s.layers[1].units == 2);
        dt_model_spec_free(&s);
    }
}

int main(void) {
    RUN(test_fashion);
    RUN(test_catdog);
    RUN(test_syntax_accepted);
    RUN(test_errors);
    RUN(test_limits_and_io);
    return test_summary();
}
