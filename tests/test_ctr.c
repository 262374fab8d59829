/* Click logs (src/data/ctr.h): Criteo and libffm lines (empties, negatives, multi-valued fields,
 * every kind of bad line), files plain and gzip (several members, cut short, junk after), bad lines
 * under both policies naming file:line, the split rule and the id hash against the documented
 * formulas' values, sharding (every line exactly once across n workers; n workers with batch B see
 * what one process with batch n*B sees), epochs, seeking, lines longer than the buffer. */
#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "data/ctr.h"
#include "hash32.h"
#include "test.h"
#include "tmpdir.h"

/* ---- helpers --------------------------------------------------------------------------------- */

/* gzip of text as `members` gzip members (split evenly), or cut to `cut` bytes when cut > 0. */
static void write_gzip(const char *path, const char *text, size_t n, int members, size_t cut) {
    size_t cap = n + 4096 * (size_t)members, len = 0;
    unsigned char *out = malloc(cap);
    for (int m = 0; m < members; m++) {
        size_t a = n * (size_t)m / (size_t)members, b = n * (size_t)(m + 1) / (size_t)members;
        z_stream zs = {0};
        deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
        zs.next_in = (unsigned char *)text + a, zs.avail_in = (uInt)(b - a);
        zs.next_out = out + len, zs.avail_out = (uInt)(cap - len);
        deflate(&zs, Z_FINISH);
        len = cap - zs.avail_out;
        deflateEnd(&zs);
    }
    write_bytes(path, (const char *)out, cut ? cut : len);
    free(out);
}

/* Line L (from 1) of the synthetic Criteo file: label, integers (some empty, some negative) and
 * hex ids (some empty, some short) from a formula the checks recompute. */
static int row_label(int64_t L) { return h32((uint32_t)L) % 3 == 0; }
static int int_empty(int64_t L, int j) { return (L + j) % 11 == 0; }
static int64_t int_value(int64_t L, int j) { return (int64_t)(h32((uint32_t)(L * 13 + j)) % 1000) - (j == 1 ? 3 : 0); }
static int cat_empty(int64_t L, int f) { return (L + f) % 13 == 0; }
static uint32_t cat_value(int64_t L, int f) { return h32((uint32_t)(L * 31 + f)) >> (f % 4 * 8); }

static size_t criteo_line(char *out, int64_t L) {
    size_t o = (size_t)sprintf(out, "%d", row_label(L));
    for (int j = 0; j < 13; j++) {
        out[o++] = '\t';
        if (!int_empty(L, j)) o += (size_t)sprintf(out + o, "%lld", (long long)int_value(L, j));
    }
    for (int f = 0; f < 26; f++) {
        out[o++] = '\t';
        if (!cat_empty(L, f)) o += (size_t)sprintf(out + o, f % 2 ? "%x" : "%08X", cat_value(L, f));
    }
    out[o++] = '\n';
    return o;
}

/* A Criteo file of `lines` lines (malloc'ed text). */
static char *criteo_text(int64_t lines, size_t *n) {
    char *t = malloc((size_t)lines * 400 + 1);
    size_t o = 0;
    for (int64_t L = 1; L <= lines; L++) o += criteo_line(t + o, L);
    *n = o;
    return t;
}

/* Row i of b holds what line L of the synthetic file holds. */
static int row_is_line_data(const dt_ctr_batch *b, int i, int64_t L) {
    if (b->labels[i] != (float)row_label(L)) return 0;
    for (int j = 0; j < 13; j++) {
        float want = int_empty(L, j) ? 0.0f : dt_ctr_dense_value(int_value(L, j));
        if (b->dense[i * 13 + j] != want) return 0;
    }
    for (int f = 0; f < 26; f++) {
        int64_t a = b->offsets[i * 26 + f], e = b->offsets[i * 26 + f + 1];
        if (cat_empty(L, f) ? e != a : (e != a + 1 || b->ids[a] != cat_value(L, f) || b->values[a] != 1.0f)) return 0;
    }
    return 1;
}

/* ... and is line L. */
static int row_is_line(const dt_ctr_batch *b, int i, int64_t L) { return b->lines[i] == L && row_is_line_data(b, i, L); }

static dt_ctr_options opts(dt_ctr_split split, int batch, int training, int shard, int shards) {
    dt_ctr_options o;
    dt_ctr_options_init(&o);
    o.split = split, o.batch_size = batch, o.training = training;
    o.shard_index = shard, o.shard_count = shards;
    return o;
}

/* Reads a one-pass reader to its end, checking every row against the formula; returns the rows,
 * with the line numbers seen in order in lines[] (room for max). */
static int64_t drain_as(const char *path, const dt_ctr_options *o, int64_t *lines, int64_t max, int by_order) {
    dt_ctr_reader *r = NULL;
    dt_error err = {0};
    CHECK_MSG(dt_ctr_open(&r, path, o, &err) == 0, "%s", err.msg);
    if (!r) return -1;
    int64_t rows = 0;
    dt_ctr_batch b;
    while (dt_ctr_next(r, &b, &err) == 0 && b.n > 0) {
        CHECK(b.n <= o->batch_size);
        for (int i = 0; i < b.n; i++) {
            int64_t L = by_order ? rows + 1 : b.lines[i]; /* by_order: blank lines shift the numbers */
            CHECK_MSG(row_is_line(&b, i, L) || (by_order && row_is_line_data(&b, i, L)), "row %d is not line %lld", i,
                      (long long)L);
            if (rows < max) lines[rows] = b.lines[i];
            rows++;
        }
    }
    CHECK_MSG(err.code == 0, "%s", err.msg);
    dt_ctr_close(r);
    return rows;
}

static int64_t drain(const char *path, const dt_ctr_options *o, int64_t *lines, int64_t max) {
    return drain_as(path, o, lines, max, 0);
}

/* ---- parsing ---------------------------------------------------------------------------------- */

static int add(dt_ctr_builder *b, const char *line, char *why) {
    dt_error err = {0};
    return dt_ctr_builder_add(b, line, strlen(line), 1, why, 256, &err);
}

static void test_criteo_line(void) {
    dt_ctr_builder *b = NULL;
    dt_error err = {0};
    CHECK(dt_ctr_builder_create(&b, DT_CTR_CRITEO, 0, 4, &err) == 0);
    char why[256];
    /* Kaggle's first line, then one with empties, negatives, short ids and CRLF */
    CHECK(add(b, "0\t1\t1\t5\t0\t1382\t4\t15\t2\t181\t1\t2\t\t2\t68fd1e64\t80e26c9b\tfb936136\t7b4723c4\t25c83c98"
                 "\t7e0ccccf\tde7995b8\t1f89b562\ta73ee510\ta8cd5504\tb2cb9c98\t37c9c164\t2824a5f6\t1adce6ef\t8ba8b39a"
                 "\t891b62e7\te5ba7672\tf54016b9\t21ddcdc9\tb1252a9d\t07b5194c\t\t3a171ecb\tc5c50484\te8b83407\t9727dd16",
              why) == 0);
    char second[256] = "1\t\t-2\t\t\t\t\t\t\t\t\t\t0\t"; /* I1 empty, I2 -2, I12 0, I13 empty */
    for (int f = 0; f < 26; f++) strcat(second, f == 21 ? "\tA" : f == 25 ? "\t1\r" : "\t");
    CHECK(add(b, second, why) == 0);
    dt_ctr_batch bt;
    dt_ctr_builder_batch(b, &bt);
    CHECK(bt.n == 2 && bt.num_dense == 13 && bt.num_fields == 26);
    CHECK(bt.labels[0] == 0 && bt.labels[1] == 1);
    CHECK(bt.dense[0] == (float)log1p(1.0) && bt.dense[4] == (float)log1p(1382.0) && bt.dense[11] == 0.0f);
    CHECK(bt.dense[3] == 0.0f); /* 0 -> log(1) */
    CHECK(bt.offsets[0] == 0 && bt.ids[0] == 0x68fd1e64u && bt.ids[1] == 0x80e26c9bu && bt.values[0] == 1.0f);
    CHECK(bt.offsets[22] - bt.offsets[21] == 0);          /* C22 empty */
    CHECK(bt.offsets[26] == 25 && bt.ids[24] == 0x9727dd16u);
    for (int j = 0; j < 13; j++) CHECK(bt.dense[13 + j] == 0.0f); /* empty, -2 and 0 all give 0 */
    CHECK(bt.offsets[52] - bt.offsets[26] == 2);                   /* C22 = A, C26 = 1 */
    CHECK(bt.offsets[26 + 21] == 25 && bt.ids[25] == 0xA && bt.ids[26] == 1);
    dt_ctr_builder_free(b);
}

static void test_criteo_bad_lines(void) {
    dt_ctr_builder *b = NULL;
    dt_error err = {0};
    CHECK(dt_ctr_builder_create(&b, DT_CTR_CRITEO, 0, 2, &err) == 0);
    char why[256], line[1024];
    char good[1024];
    size_t n = criteo_line(good, 5);
    good[n - 1] = '\0';
    static const struct {
        const char *from, *to, *msg;
    } cases[] = {
        {"", "", "1 tab-separated columns, expected 40"},
        {NULL, "\t", "41 tab-separated columns"},
        {NULL, "TRUNC", "39 tab-separated columns"},
        {"0", "2", "label '2' is not 0 or 1"},
        {"0", "x\ty", "label 'x' is not 0 or 1"},
        {"I", "12a", "I1: '12a' is not an integer"},
        {"I", "1234567890123456789", "I1: '1234567890123456789' is not an integer of at most 18 digits"},
        {"I", "-", "I1: '-' is not an integer"},
        {"C", "123456789", "C1: '123456789' has more than 8 hex digits"},
        {"C", "xyz", "C1: 'xyz' is not a hex id"},
        {"C", "ab\x01\xff", "C1: 'ab\\x01\\xff' is not a hex id"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        if (!strcmp(cases[k].to, "TRUNC")) snprintf(line, sizeof line, "%.*s", (int)(strrchr(good, '\t') - good), good);
        else if (!cases[k].from) snprintf(line, sizeof line, "%s%s", good, cases[k].to);
        else if (!*cases[k].from) line[0] = '\0';
        else if (cases[k].from[0] == '0' || cases[k].from[0] == '1') snprintf(line, sizeof line, "%s%s", cases[k].to, good + 1);
        else {
            /* replace I1 (column 2) or C1 (column 15) */
            int col = cases[k].from[0] == 'I' ? 1 : 14;
            const char *p = good;
            for (int c = 0; c < col; c++) p = strchr(p, '\t') + 1;
            const char *e = strchr(p, '\t');
            snprintf(line, sizeof line, "%.*s%s%s", (int)(p - good), good, cases[k].to, e);
        }
        CHECK(add(b, line, why) == DT_EFORMAT);
        CHECK_MSG(strstr(why, cases[k].msg) != NULL, "case %zu: '%s' does not contain '%s'", k, why, cases[k].msg);
        CHECK(dt_ctr_builder_rows(b) == 0);
    }
    CHECK(add(b, good, why) == 0 && add(b, good, why) == 0);
    CHECK(add(b, good, why) == DT_EINVAL); /* full */
    dt_ctr_builder_free(b);
}

static void test_libffm_line(void) {
    dt_ctr_builder *b = NULL;
    dt_error err = {0};
    CHECK(dt_ctr_builder_create(&b, DT_CTR_LIBFFM, 5, 4, &err) == 0);
    char why[256];
    CHECK(add(b, "1 0:7:1 3:18446744073709551615:0.5  2:9:-2.5e1\t0:8:1", why) == 0);
    CHECK(add(b, "-1", why) == 0);
    CHECK(add(b, " +1 4:1:.25 4:1:1e-3 ", why) == 0);
    dt_ctr_batch bt;
    dt_ctr_builder_batch(b, &bt);
    CHECK(bt.n == 3 && bt.num_dense == 0 && bt.num_fields == 5);
    CHECK(bt.labels[0] == 1 && bt.labels[1] == 0 && bt.labels[2] == 1);
    /* row 0: field 0 = {7, 8} (line order kept), field 2 = {9}, field 3 = {2^64-1}, 1 and 4 empty */
    CHECK(bt.offsets[0] == 0 && bt.offsets[1] == 2 && bt.ids[0] == 7 && bt.ids[1] == 8);
    CHECK(bt.offsets[2] == 2 && bt.offsets[3] == 3 && bt.ids[2] == 9 && bt.values[2] == -25.0f);
    CHECK(bt.offsets[4] == 4 && bt.ids[3] == UINT64_MAX && bt.values[3] == 0.5f && bt.offsets[5] == 4);
    CHECK(bt.offsets[10] == 4);                                        /* row 1: nothing */
    CHECK(bt.offsets[14] == 4 && bt.offsets[15] == 6 && bt.values[4] == 0.25f && bt.values[5] == 0.001f);
    static const struct {
        const char *line, *msg;
    } cases[] = {
        {"", "no label"},
        {"2 0:1:1", "label '2' is not 0, 1, -1 or +1"},
        {"1 0:1", "'0:1' is not field:id:value"},
        {"1 5:1:1", "'5:1:1': the field is not a number below 5"},
        {"1 x:1:1", "the field is not a number"},
        {"1 0:18446744073709551616:1", "the id is not a decimal number below 2^64"},
        {"1 0:-1:1", "the id is not"},
        {"1 0:1:nan", "the value is not a finite decimal number"},
        {"1 0:1:1e39", "the value is not"},
        {"1 0:1:0x10", "the value is not"},
        {"1 0:1:", "the value is not"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        CHECK(add(b, cases[k].line, why) == DT_EFORMAT);
        CHECK_MSG(strstr(why, cases[k].msg) != NULL, "'%s': '%s'", cases[k].line, why);
    }
    CHECK(dt_ctr_builder_rows(b) == 3);
    dt_ctr_builder_free(b);
}

/* The split rule and the hash give the values of the Python formulas in docs/ctr-data.md. */
static void test_documented_formulas(void) {
    CHECK(dt_ctr_hash(0, 0) == 0x1b909dc9472b629dULL);
    CHECK(dt_ctr_hash(3, 0x68fd1e64) == 0x8a9468f9f194b3cdULL);
    CHECK(dt_ctr_hash(25, 0xffffffff) == 0x19a6581308412389ULL);
    CHECK(dt_ctr_bucket(7, 123456789012345ULL, 1000003) == 633867);
    CHECK(dt_ctr_line_split(1, 0.1, 0.1) == DT_CTR_TRAIN);                         /* u = 0.59925 */
    CHECK(dt_ctr_line_split(1000000, 0.1, 0.33) == DT_CTR_TEST);                   /* u = 0.32486 */
    CHECK(dt_ctr_line_split(1000000, 0.1, 0.32) == DT_CTR_VALIDATION);
    CHECK(dt_ctr_line_split(3, 0.0, 0.7023) == DT_CTR_TRAIN && dt_ctr_line_split(3, 0.0, 0.7024) == DT_CTR_TEST);
    int count[3] = {0};
    for (int64_t L = 1; L <= 10000; L++) count[dt_ctr_line_split(L, 0.1, 0.1)]++;
    CHECK(count[DT_CTR_TRAIN] == 8004 && count[DT_CTR_VALIDATION] == 1011 && count[DT_CTR_TEST] == 985);
    CHECK(dt_ctr_dense_value(-3) == 0.0f && dt_ctr_dense_value(0) == 0.0f);
    CHECK(dt_ctr_dense_value(1000000) == (float)log(1000001.0));
}

/* ---- files ------------------------------------------------------------------------------------ */

static void test_plain_and_gzip_read_alike(void) {
    size_t n;
    char *text = criteo_text(500, &n);
    write_bytes(tpath("c.tsv"), text, n);
    write_gzip(tpath("c.tsv.gz"), text, n, 1, 0);
    write_gzip(tpath("c3.gz"), text, n, 3, 0);
    static int64_t lines[500];
    dt_ctr_options o = opts(DT_CTR_ALL, 7, 0, 0, 1);
    const char *files[] = {"c.tsv", "c.tsv.gz", "c3.gz"};
    for (int k = 0; k < 3; k++) {
        memset(lines, 0, sizeof lines);
        CHECK_MSG(drain(tpath(files[k]), &o, lines, 500) == 500, "%s", files[k]);
        int in_order = 1;
        for (int64_t L = 1; L <= 500; L++) in_order &= lines[L - 1] == L;
        CHECK_MSG(in_order, "%s: every line once, in order", files[k]);
    }
    /* A small buffer: lines straddle every refill. */
    o.buffer_bytes = 4096;
    CHECK(drain(tpath("c3.gz"), &o, lines, 500) == 500);
    /* No newline at the end, blank lines and CRLF: the same examples. */
    char *crlf = malloc(n * 2 + 16);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (text[i] == '\n') crlf[m++] = '\r';
        crlf[m++] = text[i];
        if (text[i] == '\n' && i % 7 == 0) crlf[m++] = '\n';
    }
    m -= 2; /* drop the last "\r\n" */
    write_bytes(tpath("crlf.tsv"), crlf, m);
    CHECK(drain_as(tpath("crlf.tsv"), &o, lines, 500, 1) == 500);
    free(crlf);
    free(text);
}

static void expect_open_or_next_error(const char *path, const dt_ctr_options *o, const char *msg) {
    dt_ctr_reader *r = NULL;
    dt_error err = {0};
    int rc = dt_ctr_open(&r, path, o, &err);
    dt_ctr_batch b;
    while (!rc && (rc = dt_ctr_next(r, &b, &err)) == 0 && b.n > 0) {}
    CHECK_MSG(rc != 0 && strstr(err.msg, msg) != NULL, "%s: rc %d, '%s' lacks '%s'", path, rc, err.msg, msg);
    dt_ctr_close(r);
}

static void test_broken_gzip(void) {
    size_t n;
    char *text = criteo_text(300, &n);
    write_gzip(tpath("cut.gz"), text, n, 1, 2000);
    dt_ctr_options o = opts(DT_CTR_ALL, 16, 0, 0, 1);
    expect_open_or_next_error(tpath("cut.gz"), &o, "the gzip stream is cut short");
    write_gzip(tpath("junk.gz"), text, n, 1, 0);
    FILE *f = fopen(tpath("junk.gz"), "ab");
    fputs("junk", f);
    fclose(f);
    expect_open_or_next_error(tpath("junk.gz"), &o, "unexpected bytes after the gzip data");
    write_gzip(tpath("corrupt.gz"), text, n, 1, 0);
    f = fopen(tpath("corrupt.gz"), "r+b");
    fseek(f, 200, SEEK_SET);
    fputs("\xff\xff\xff\xff\xff\xff\xff\xff", f);
    fclose(f);
    expect_open_or_next_error(tpath("corrupt.gz"), &o, "corrupt.gz: corrupt gzip data");
    expect_open_or_next_error(tpath("missing.tsv"), &o, "missing.tsv");
    expect_open_or_next_error(tmp_root, &o, tmp_root); /* a folder */
    free(text);
}

/* Lines 3 and 7 bad (and line 9 longer than the buffer): skipped and counted with the first one's
 * file:line, or the error under fail. */
static void test_bad_line_policies(void) {
    size_t n;
    char *text = criteo_text(12, &n), *out = malloc(n + 9000);
    size_t o = 0;
    for (int64_t L = 1; L <= 12; L++) {
        char line[512];
        size_t len = criteo_line(line, L);
        if (L == 3) memcpy(line, "7", 1);
        if (L == 7) len = (size_t)sprintf(line, "0\t1\t2\t3\t4\n");
        if (L == 9) {
            memset(out + o, 'x', 8000);
            o += 8000;
        }
        memcpy(out + o, line, len);
        o += len;
    }
    write_bytes(tpath("bad.tsv"), out, o);
    dt_ctr_options opt = opts(DT_CTR_ALL, 4, 0, 0, 1);
    opt.buffer_bytes = 4096;
    static int64_t lines[16];
    CHECK(drain(tpath("bad.tsv"), &opt, lines, 16) == 9);
    dt_ctr_reader *r = NULL;
    dt_error err = {0};
    CHECK(dt_ctr_open(&r, tpath("bad.tsv"), &opt, &err) == 0);
    dt_ctr_batch b;
    while (dt_ctr_next(r, &b, &err) == 0 && b.n > 0) {}
    CHECK(dt_ctr_bad_count(r) == 3);
    CHECK_CONTAINS(dt_ctr_first_bad(r), "bad.tsv:3: label '7' is not 0 or 1");
    dt_ctr_close(r);
    opt.bad_lines = DT_BAD_IMAGES_FAIL;
    expect_open_or_next_error(tpath("bad.tsv"), &opt, "bad.tsv:3: label '7'");
    memcpy(strchr(out, '\n') + 1 + strcspn(strchr(out, '\n') + 1, "\n") + 1, "1", 1); /* line 3 good again */
    write_bytes(tpath("bad.tsv"), out, o);
    expect_open_or_next_error(tpath("bad.tsv"), &opt, "bad.tsv:7: 5 tab-separated columns");
    free(text);
    free(out);
}

/* ---- splits, shards, epochs ------------------------------------------------------------------- */

/* Each split holds exactly the lines the rule gives it; one-pass shards of it cover each of its
 * lines exactly once, whatever the number of workers. */
static void test_splits_and_shards_cover_each_line_once(void) {
    const int64_t N = 2000;
    size_t n;
    char *text = criteo_text(N, &n);
    write_bytes(tpath("s.tsv"), text, n);
    static int64_t lines[2000];
    int seen[2001];
    for (int split = DT_CTR_TRAIN; split <= DT_CTR_TEST; split++) {
        for (int shards = 1; shards <= 4; shards++) {
            memset(seen, 0, sizeof seen);
            int64_t total = 0;
            for (int k = 0; k < shards; k++) {
                dt_ctr_options o = opts((dt_ctr_split)split, 5, 0, k, shards);
                int64_t rows = drain(tpath("s.tsv"), &o, lines, N);
                for (int64_t i = 0; i < rows; i++) seen[lines[i]]++;
                total += rows;
            }
            int exact = 1;
            int64_t want = 0;
            for (int64_t L = 1; L <= N; L++) {
                int in = dt_ctr_line_split(L, 0.1, 0.1) == (dt_ctr_split)split;
                want += in;
                exact &= seen[L] == in;
            }
            CHECK_MSG(exact && total == want, "split %d, %d shards: %lld rows, want %lld", split, shards,
                      (long long)total, (long long)want);
        }
    }
    free(text);
}

/* Training order: at global batch t the n workers' batches together are the lines one process with
 * batch n*B reads at t; the unfinished global batch at the end of a pass is dropped and the next
 * epoch starts again from line 1. */
static void test_training_order_matches_one_process(void) {
    const int64_t N = 700; /* train split: about 560 lines */
    size_t n;
    char *text = criteo_text(N, &n);
    write_bytes(tpath("t.tsv"), text, n);
    const int W = 3, B = 8;
    dt_ctr_reader *one = NULL, *w[3] = {NULL};
    dt_error err = {0};
    dt_ctr_options o = opts(DT_CTR_TRAIN, W * B, 1, 0, 1);
    CHECK(dt_ctr_open(&one, tpath("t.tsv"), &o, &err) == 0);
    for (int k = 0; k < W; k++) {
        o = opts(DT_CTR_TRAIN, B, 1, k, W);
        CHECK(dt_ctr_open(&w[k], tpath("t.tsv"), &o, &err) == 0);
    }
    int64_t train_lines = 0;
    for (int64_t L = 1; L <= N; L++) train_lines += dt_ctr_line_split(L, 0.1, 0.1) == DT_CTR_TRAIN;
    int64_t per_epoch = train_lines / (W * B);
    int same = 1;
    for (int64_t t = 0; t < 3 * per_epoch + 2; t++) {
        dt_ctr_batch a, b;
        CHECK(dt_ctr_next(one, &a, &err) == 0 && a.n == W * B);
        CHECK(a.index == t && a.epoch == t / per_epoch);
        for (int k = 0; k < W; k++) {
            CHECK(dt_ctr_next(w[k], &b, &err) == 0 && b.n == B && b.index == t && b.epoch == a.epoch);
            for (int i = 0; i < B; i++) same &= b.lines[i] == a.lines[k + i * W] && row_is_line(&b, i, b.lines[i]);
        }
        if (t == per_epoch) CHECK(a.lines[0] == 1 || dt_ctr_line_split(1, 0.1, 0.1) != DT_CTR_TRAIN);
    }
    CHECK(same);
    dt_ctr_close(one);
    for (int k = 0; k < W; k++) dt_ctr_close(w[k]);
    free(text);
}

/* Seeking to batch k gives what the k-th batch from the start is, across epochs too. */
static void test_seek(void) {
    dt_ctr_options o = opts(DT_CTR_TRAIN, 16, 1, 1, 2);
    dt_ctr_reader *a = NULL, *b = NULL;
    dt_error err = {0};
    CHECK(dt_ctr_open(&a, tpath("t.tsv"), &o, &err) == 0 && dt_ctr_open(&b, tpath("t.tsv"), &o, &err) == 0);
    static int64_t first[64][16];
    dt_ctr_batch x;
    for (int t = 0; t < 64; t++) {
        CHECK(dt_ctr_next(a, &x, &err) == 0 && x.n == 16);
        memcpy(first[t], x.lines, sizeof first[t]);
    }
    int ok = 1;
    for (int k = 0; k < 64; k += 9) {
        CHECK(dt_ctr_seek(b, k, &err) == 0);
        CHECK(dt_ctr_next(b, &x, &err) == 0 && x.index == k);
        ok &= x.n == 16 && !memcmp(x.lines, first[k], sizeof first[k]);
    }
    CHECK(ok);
    dt_ctr_close(a);
    dt_ctr_close(b);
    /* One pass: seek(k) restarts the pass at the shard's line k * B. */
    o = opts(DT_CTR_ALL, 10, 0, 0, 1);
    CHECK(dt_ctr_open(&a, tpath("t.tsv"), &o, &err) == 0);
    while (dt_ctr_next(a, &x, &err) == 0 && x.n > 0) {}
    CHECK(dt_ctr_seek(a, 3, &err) == 0 && dt_ctr_next(a, &x, &err) == 0 && x.n == 10 && x.lines[0] == 31);
    dt_ctr_close(a);
}

static void test_small_split_and_options(void) {
    size_t n;
    char *text = criteo_text(30, &n);
    write_bytes(tpath("small.tsv"), text, n);
    dt_ctr_options o = opts(DT_CTR_TRAIN, 16, 1, 0, 2);
    expect_open_or_next_error(tpath("small.tsv"), &o, "fewer than one global batch (2 shards x 16)");
    o = opts(DT_CTR_TRAIN, 16, 1, 2, 2);
    expect_open_or_next_error(tpath("small.tsv"), &o, "shard index");
    o = opts(DT_CTR_TRAIN, 16, 1, 0, 1);
    o.test_fraction = 0.95;
    expect_open_or_next_error(tpath("small.tsv"), &o, "add up to at most 1");
    /* Every line bad, skipped: training order stops after a pass instead of looping for ever. */
    for (char *p = text; (p = strchr(p, '\n')) != NULL; p++)
        if (p[1]) p[1] = '5';
    text[0] = '5';
    write_bytes(tpath("allbad.tsv"), text, n);
    o = opts(DT_CTR_ALL, 4, 1, 1, 2);
    expect_open_or_next_error(tpath("allbad.tsv"), &o, "shard 1 of 2 has no good line in a whole pass (15 bad lines; first: ");
    free(text);
}

static void test_libffm_file_and_detection(void) {
    const char *text = "1 0:5:1 1:7:0.5\n\n0 2:3:1 0:4:1 0:6:2\n-1\n+1 3:1:1\n";
    write_bytes(tpath("f.ffm"), text, strlen(text));
    dt_ctr_options o = opts(DT_CTR_ALL, 8, 0, 0, 1);
    o.fields = 4;
    dt_ctr_reader *r = NULL;
    dt_error err = {0};
    CHECK(dt_ctr_open(&r, tpath("f.ffm"), &o, &err) == 0);
    CHECK(dt_ctr_reader_format(r) == DT_CTR_LIBFFM);
    dt_ctr_batch b;
    CHECK(dt_ctr_next(r, &b, &err) == 0 && b.n == 4 && b.num_fields == 4);
    CHECK(b.lines[0] == 1 && b.lines[1] == 3 && b.lines[3] == 5); /* the blank line is no example */
    CHECK(b.offsets[4] == 2 && b.offsets[5] == 4 && b.ids[2] == 4 && b.ids[3] == 6 && b.values[3] == 2.0f);
    CHECK(b.offsets[6] == 4 && b.offsets[7] == 5 && b.ids[4] == 3);
    CHECK(b.labels[2] == 0 && b.labels[3] == 1);
    dt_ctr_close(r);
    o.fields = 0; /* 39 */
    o.format = DT_CTR_CRITEO;
    o.bad_lines = DT_BAD_IMAGES_FAIL;
    expect_open_or_next_error(tpath("f.ffm"), &o, "f.ffm:1: label '1 0:5:1 1:7:0.5' is not 0 or 1");
    o.format = DT_CTR_AUTO;
    o.bad_lines = DT_BAD_IMAGES_SKIP;
    CHECK(dt_ctr_open(&r, tpath("c.tsv"), &o, &err) == 0 && dt_ctr_reader_format(r) == DT_CTR_CRITEO);
    dt_ctr_close(r);
}

/* The hash's test vectors that scripts/ctr_features.py (the Python reference of docs/export.md)
 * writes, tests/fixtures/ctr_hash_vectors.txt, give the same values here: the C and the Python agree
 * (tests/test_export_ctr.sh checks that the Python still writes that file). */
static void test_hash_vectors_match_python(void) {
    FILE *f = fopen("tests/fixtures/ctr_hash_vectors.txt", "r");
    CHECK(f != NULL);
    if (!f) return;
    char line[256];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        unsigned field;
        unsigned long long id, buckets, hash, bucket;
        CHECK_MSG(sscanf(line, "%u %llx %llu %llx %llu", &field, &id, &buckets, &hash, &bucket) == 5, "%s", line);
        CHECK_MSG(dt_ctr_hash(field, id) == hash, "%s", line);
        CHECK_MSG(dt_ctr_bucket(field, id, buckets) == bucket, "%s", line);
        n++;
    }
    fclose(f);
    CHECK(n == 70);
}

int main(void) {
    tmp_make("ctr");
    RUN(test_criteo_line);
    RUN(test_criteo_bad_lines);
    RUN(test_libffm_line);
    RUN(test_documented_formulas);
    RUN(test_hash_vectors_match_python);
    RUN(test_plain_and_gzip_read_alike);
    RUN(test_broken_gzip);
    RUN(test_bad_line_policies);
    RUN(test_splits_and_shards_cover_each_line_once);
    RUN(test_training_order_matches_one_process);
    RUN(test_seek);
    RUN(test_small_split_and_options);
    RUN(test_libffm_file_and_detection);
    tmp_remove();
    return test_summary();
}
