/* Model-spec helpers shared by test_model_spec.c and test_model_graph.c: parse a text as the file
 * "t.model", and expect a refusal naming its line, with a one-line message. */
#ifndef DT_TESTS_SPEC_CHECK_H
#define DT_TESTS_SPEC_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/spec.h"
#include "test.h"

/* Parses text; returns the return code, message in err; the spec goes to spec_out (or is freed). */
static int parse(const char *text, dt_error *err, dt_model_spec *spec_out) {
    dt_model_spec spec;
    memset(err, 0, sizeof *err);
    int rc = dt_model_spec_parse(&spec, text, strlen(text), "t.model", err);
    if (rc == 0) {
        if (spec_out) *spec_out = spec;
        else dt_model_spec_free(&spec);
    }
    return rc;
}

/* The text must fail with one line containing "t.model:<line>: " and every needle. */
static void expect_error(int line, const char *text, const char *needle1, const char *needle2) {
    dt_error err;
    int rc = parse(text, &err, NULL);
    CHECK_MSG(rc < 0, "accepted: %s", text);
    char where[32];
    snprintf(where, sizeof where, "t.model:%d: ", line);
    CHECK_CONTAINS(err.msg, where);
    if (needle1) CHECK_CONTAINS(err.msg, needle1);
    if (needle2) CHECK_CONTAINS(err.msg, needle2);
    CHECK(err.code == rc);
    CHECK(strchr(err.msg, '\n') == NULL);
    if (getenv("SHOW_ERRORS")) fprintf(stderr, "  %s\n", err.msg);
}

#endif
