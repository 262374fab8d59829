/* The click-log generator (src/data/clickgen.h): the Zipf sampler's frequencies against the law,
 * seeded reproducibility (plain and gzip alike), its file read back by the reader (no bad line, the
 * split sizes it reported), labels calibrated to the true probabilities, fm above lr, refusals, and
 * a stop leaving no file. The printed Bayes AUC against numpy: tests/test_gen_clicks.sh. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "data/clickgen.h"
#include "test.h"

static char dir[256];

static const char *tpath(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

/* A whole file, gunzipped when it is gzip (zlib's gzread reads plain files as they are). */
static char *slurp(const char *path, size_t *n) {
    gzFile f = gzopen(path, "rb");
    size_t cap = 1 << 20, len = 0;
    char *b = malloc(cap);
    int got;
    while (f && (got = gzread(f, b + len, (unsigned)(cap - len))) > 0)
        if ((len += (size_t)got) == cap) b = realloc(b, cap *= 2);
    if (f) gzclose(f);
    *n = len;
    return b;
}

/* Frequencies of 400,000 draws over 1..10 against k^-s / H(10, s), for several exponents: each
 * within 5 standard errors, and Pearson's chi-square (9 degrees of freedom) under 33 (p = 1e-4). */
static void test_zipf_matches_the_law(void) {
    const double exps[] = {0.5, 1.0, 1.1, 2.0, 3.5};
    const int n = 10, draws = 400000;
    for (size_t e = 0; e < sizeof exps / sizeof exps[0]; e++) {
        dt_zipf z;
        dt_error err = {0};
        CHECK(dt_zipf_init(&z, (uint64_t)n, exps[e], &err) == 0);
        dt_rng r;
        dt_rng_seed(&r, 42 + e);
        long count[11] = {0};
        for (int i = 0; i < draws; i++) {
            uint64_t k = dt_zipf_sample(&z, &r);
            CHECK(k >= 1 && k <= (uint64_t)n);
            if (k >= 1 && k <= (uint64_t)n) count[k]++;
        }
        double H = 0, chi2 = 0;
        for (int k = 1; k <= n; k++) H += pow(k, -exps[e]);
        for (int k = 1; k <= n; k++) {
            double p = pow(k, -exps[e]) / H, want = p * draws, se = sqrt(draws * p * (1 - p));
            CHECK_MSG(fabs((double)count[k] - want) <= 5 * se, "s %g, k %d: %ld draws, expected %.0f", exps[e], k, count[k], want);
            chi2 += ((double)count[k] - want) * ((double)count[k] - want) / want;
        }
        CHECK_MSG(chi2 < 33.0, "s %g: chi-square %.1f", exps[e], chi2);
    }
    /* The extremes: one value; 2^32 values (every draw in range, rank 1 the most frequent). */
    dt_zipf z;
    dt_rng r;
    dt_rng_seed(&r, 7);
    CHECK(dt_zipf_init(&z, 1, 1.1, NULL) == 0 && dt_zipf_sample(&z, &r) == 1);
    CHECK(dt_zipf_init(&z, DT_CLICKGEN_MAX_VOCAB, 1.1, NULL) == 0);
    long ones = 0, in_range = 1;
    for (int i = 0; i < 100000; i++) {
        uint64_t k = dt_zipf_sample(&z, &r);
        in_range &= k >= 1 && k <= DT_CLICKGEN_MAX_VOCAB;
        ones += k == 1;
    }
    CHECK(in_range && ones > 100000 / 20); /* P(1) = 1 / H(2^32, 1.1), about 1/9.8 */
    dt_error err = {0};
    CHECK(dt_zipf_init(&z, 0, 1.1, &err) == DT_EINVAL);
    CHECK(dt_zipf_init(&z, 10, 0, &err) == DT_EINVAL && strstr(err.msg, "exponent 0"));
    CHECK(dt_zipf_init(&z, DT_CLICKGEN_MAX_VOCAB + 1, 1.1, &err) == DT_EINVAL);
}

static dt_clickgen_options small(uint64_t lines, uint64_t seed) {
    dt_clickgen_options o;
    dt_clickgen_options_init(&o);
    o.lines = lines, o.seed = seed;
    for (int f = 0; f < DT_CRITEO_FIELDS; f++) o.vocab[f] = f < 13 ? 1000 : 100000000; /* 10^3 .. 10^8 */
    return o;
}

static void test_reproducible(void) {
    dt_clickgen_options o = small(3000, 5);
    dt_clickgen_report a, b;
    dt_error err = {0};
    CHECK(dt_clickgen_write(tpath("a.tsv"), tpath("a.p"), &o, NULL, &a, &err) == 0);
    CHECK(dt_clickgen_write(tpath("b.tsv.gz"), NULL, &o, NULL, &b, &err) == 0);
    o.seed = 6;
    CHECK(dt_clickgen_write(tpath("c.tsv"), NULL, &o, NULL, &b, &err) == 0);
    size_t na, nb, nc;
    char *ta = slurp(tpath("a.tsv"), &na), *tb = slurp(tpath("b.tsv.gz"), &nb), *tc = slurp(tpath("c.tsv"), &nc);
    CHECK(na > 3000 * 100 && na == nb && !memcmp(ta, tb, na)); /* gzip holds the same lines */
    CHECK(na != nc || memcmp(ta, tc, na));                      /* another seed, another file */
    FILE *f = fopen(tpath("b.tsv.gz"), "rb");
    CHECK(f && fgetc(f) == 0x1f && fgetc(f) == 0x8b);
    if (f) fclose(f);
    /* Line L does not depend on how many lines follow it. */
    o.seed = 5, o.lines = 1000;
    CHECK(dt_clickgen_write(tpath("d.tsv"), NULL, &o, NULL, &b, &err) == 0);
    size_t nd;
    char *td = slurp(tpath("d.tsv"), &nd);
    CHECK(nd < na && !memcmp(ta, td, nd));
    free(ta), free(tb), free(tc), free(td);
}

/* The reader takes every line, splits as the generator counted, and the labels follow p. */
static void test_read_back(void) {
    dt_clickgen_options o = small(3000, 5);
    dt_clickgen_report rep;
    dt_error err = {0};
    CHECK(dt_clickgen_write(tpath("a.tsv"), NULL, &o, NULL, &rep, &err) == 0);
    for (int split = DT_CTR_TRAIN; split <= DT_CTR_TEST; split++) {
        dt_ctr_options ro;
        dt_ctr_options_init(&ro);
        ro.split = (dt_ctr_split)split, ro.training = 0, ro.batch_size = 256, ro.bad_lines = DT_BAD_IMAGES_FAIL;
        dt_ctr_reader *r = NULL;
        CHECK_MSG(dt_ctr_open(&r, tpath("a.tsv"), &ro, &err) == 0, "%s", err.msg);
        dt_ctr_batch b;
        uint64_t rows = 0, pos = 0, missing = 0, cats = 0;
        while (r && dt_ctr_next(r, &b, &err) == 0 && b.n > 0) {
            rows += (uint64_t)b.n;
            for (int i = 0; i < b.n; i++) pos += b.labels[i] == 1.0f;
            for (int k = 0; k < b.n * b.num_fields; k++) missing += b.offsets[k + 1] == b.offsets[k], cats++;
        }
        CHECK_MSG(err.code == 0, "%s", err.msg);
        CHECK(rows == rep.split[split].examples && pos == rep.split[split].positives);
        CHECK(fabs((double)missing / (double)cats - 0.05) < 0.01);
        dt_ctr_close(r);
    }
    /* Labels are drawn from p: the click rate is the mean probability, within 4 standard errors. */
    const dt_binary_result *t = &rep.split[DT_CTR_TRAIN];
    double ctr = (double)t->positives / (double)t->examples, se = sqrt(t->mean_p * (1 - t->mean_p) / (double)t->examples);
    CHECK_MSG(fabs(ctr - t->mean_p) < 4 * se, "ctr %g, mean p %g", ctr, t->mean_p);
    CHECK(t->exact && t->auc > 0.6 && t->auc < 0.95 && t->logloss > 0.2 && t->logloss < 0.7);
}

static void test_fm_adds_signal(void) {
    dt_clickgen_options o = small(20000, 9);
    dt_clickgen_report lr, fm;
    dt_error err = {0};
    CHECK(dt_clickgen_write(tpath("lr.tsv"), NULL, &o, NULL, &lr, &err) == 0);
    o.model = DT_CLICKGEN_FM;
    CHECK(dt_clickgen_write(tpath("fm.tsv"), NULL, &o, NULL, &fm, &err) == 0);
    double a = lr.split[DT_CTR_TRAIN].auc, b = fm.split[DT_CTR_TRAIN].auc;
    CHECK_MSG(b > a + 0.005, "fm-true AUC %.4f, lr-true %.4f", b, a);
}

static void test_refusals_and_stop(void) {
    dt_clickgen_options o = small(100, 1);
    dt_clickgen_report rep;
    dt_error err = {0};
    o.vocab[3] = 0;
    CHECK(dt_clickgen_write(tpath("x.tsv"), NULL, &o, NULL, &rep, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "field C4");
    o = small(100, 1);
    o.model = DT_CLICKGEN_FM, o.fm_dim = 0;
    CHECK(dt_clickgen_write(tpath("x.tsv"), NULL, &o, NULL, &rep, &err) == DT_EINVAL);
    o = small(100, 1);
    o.test_fraction = 0.95;
    CHECK(dt_clickgen_write(tpath("x.tsv"), NULL, &o, NULL, &rep, &err) == DT_EINVAL);
    o = small(200000, 1);
    volatile int stop = 1;
    CHECK(dt_clickgen_write(tpath("x.tsv"), tpath("x.p"), &o, &stop, &rep, &err) == DT_EINTR);
    CHECK(access(tpath("x.tsv"), F_OK) != 0 && access(tpath("x.p"), F_OK) != 0);
    CHECK(dt_clickgen_write(tpath("nodir/x.tsv"), NULL, &o, NULL, &rep, &err) == DT_EIO);
    CHECK_CONTAINS(err.msg, "nodir/x.tsv");
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/dt_test_clickgen_XXXXXX");
    if (!mkdtemp(dir)) return 1;
    RUN(test_zipf_matches_the_law);
    RUN(test_reproducible);
    RUN(test_read_back);
    RUN(test_fm_adds_signal);
    RUN(test_refusals_and_stop);
    const char *names[] = {"a.tsv", "a.p", "b.tsv.gz", "c.tsv", "d.tsv", "lr.tsv", "fm.tsv"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unlink(tpath(names[i]));
    rmdir(dir);
    return test_summary();
}
