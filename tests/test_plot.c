/* Curves read back from event files (src/plot/curves.c) and drawn (src/plot/svg.c): files read in
 * name order, points sorted by step with the value read last winning at a repeated step (a resumed
 * run logs again the steps it lost), NaN and infinities left out and counted, other tags ignored,
 * and the SVG's lines carrying the counts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plot/curves.h"
#include "plot/svg.h"
#include "io/events.h"
#include "test.h"

static char dir[] = "/tmp/dtrain_test_plot_XXXXXX";

/* One event file in dir/<split> stamped `wall` (the name orders files), with the given scalars. */
static void write_file(const char *split, double wall, const char *tag, const int64_t *steps, const float *v, int n) {
    char sub[256];
    snprintf(sub, sizeof sub, "%s/%s", dir, split);
    dt_event_writer *w = NULL;
    dt_error err;
    CHECK(dt_event_writer_open(&w, sub, wall, &err) == 0);
    for (int i = 0; w && i < n; i++) {
        CHECK(dt_event_add_scalar(w, tag, steps[i], v[i], wall + i, &err) == 0);
        CHECK(dt_event_add_scalar(w, "examples/sec", steps[i], 1000.0f, wall + i, &err) == 0);
    }
    CHECK(dt_event_writer_close(w, &err) == 0);
}

static void test_read_sort_dedupe(void) {
    CHECK(mkdtemp(dir) != NULL);
    /* The first run wrote steps 10, 20, 30; restarted from step 20's checkpoint, it logs 30 and 40
     * again in a later file. A NaN cost and an infinite one are dropped. */
    int64_t s1[] = {10, 20, 30}, s2[] = {30, 40, 50, 60};
    float c1[] = {2.0f, 1.5f, 1.4f}, c2[] = {1.2f, 1.0f, NAN, INFINITY};
    write_file("train", 1500000000.0, "cost", s1, c1, 3);
    write_file("train", 1500000100.0, "cost", s2, c2, 4);
    int64_t t[] = {20, 40};
    float a[] = {0.5f, 0.75f};
    write_file("test", 1500000000.0, "accuracy", t, a, 2);

    dt_run_curves c;
    dt_error err;
    CHECK(dt_curves_read(&c, "run one", dir, NULL, &err) == 0);
    const dt_series *cost = &c.s[DT_SPLIT_TRAIN][DT_TAG_COST];
    CHECK(c.files == 2 + 1);
    CHECK(c.non_finite == 2);
    CHECK_MSG(cost->n == 4, "%zu training cost points", cost->n);
    int64_t want_s[] = {10, 20, 30, 40};
    double want_v[] = {2.0, 1.5, 1.2, 1.0}; /* step 30: the later file's value */
    for (size_t i = 0; i < 4 && i < cost->n; i++) {
        CHECK(cost->step[i] == want_s[i]);
        CHECK_NEAR(cost->value[i], want_v[i], 1e-6);
    }
    CHECK(c.s[DT_SPLIT_TRAIN][DT_TAG_ACCURACY].n == 0);
    CHECK(c.s[DT_SPLIT_TEST][DT_TAG_ACCURACY].n == 2);
    CHECK(c.s[DT_SPLIT_TEST][DT_TAG_COST].n == 0);

    char *svg = NULL;
    size_t len = 0;
    CHECK(dt_plot_svg(&svg, &len, &c, 1, "t", &err) == 0);
    CHECK(svg && strlen(svg) == len);
    CHECK(svg && strstr(svg, "data-run=\"run one\" data-split=\"train\" data-tag=\"cost\" data-points=\"4\""));
    CHECK(svg && strstr(svg, "data-split=\"validation\" data-tag=\"accuracy\" data-points=\"2\""));
    CHECK(svg && strstr(svg, "class=\"run-name\"") && strstr(svg, ">run one</text>"));
    free(svg);
    dt_curves_free(&c);

    /* A folder without event files is refused, naming it. */
    char empty[300];
    snprintf(empty, sizeof empty, "%s/train", dir);
    CHECK(dt_curves_read(&c, "x", empty, NULL, &err) == DT_EINVAL && strstr(err.msg, empty));
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

/* Values no real run has (negative, huge, one point) still give a picture whose points are numbers. */
static void test_extremes(void) {
    dt_run_curves c;
    dt_error err;
    CHECK(dt_curves_init(&c, "<&\">", &err) == 0);
    int64_t steps[] = {INT64_MAX, INT64_MIN};
    double v[] = {-3e38, 3e38};
    for (int i = 0; i < 2; i++) {
        dt_series *s = &c.s[DT_SPLIT_TEST][DT_TAG_COST];
        s->step = realloc(s->step, (s->n + 1) * sizeof *s->step);
        s->value = realloc(s->value, (s->n + 1) * sizeof *s->value);
        s->step[s->n] = steps[i];
        s->value[s->n++] = v[i];
    }
    /* One point far from 0, where step + 1 rounds back to step in a double (found by fuzz_plot). */
    dt_series *one = &c.s[DT_SPLIT_TRAIN][DT_TAG_ACCURACY];
    one->step = malloc(sizeof *one->step);
    one->value = malloc(sizeof *one->value);
    one->step[0] = (int64_t)1 << 62, one->value[0] = 0.5, one->n = 1;
    CHECK(dt_curves_finish(&c, &err) == 0);
    CHECK(c.s[DT_SPLIT_TEST][DT_TAG_COST].step[0] == INT64_MIN);
    char *svg = NULL;
    size_t len = 0;
    CHECK(dt_plot_svg(&svg, &len, &c, 1, NULL, &err) == 0);
    CHECK(svg && !strstr(svg, "nan") && !strstr(svg, "inf"));
    CHECK(svg && strstr(svg, "&lt;&amp;&quot;&gt;"));
    free(svg);
    dt_curves_free(&c);
}

int main(void) {
    RUN(test_read_sort_dedupe);
    RUN(test_extremes);
    return test_summary();
}
