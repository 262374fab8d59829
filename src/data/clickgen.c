/* The click-log generator (clickgen.h): Zipf draws, the true model derived from hashes, Criteo TSV
 * out through a buffered (optionally gzip) atomic file, and the Bayes-optimal figures per split. */
#include "data/clickgen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/error.h"
#include "io/fsutil.h"

#define OUT_BUFFER ((size_t)1 << 20)

/* ---- Zipf: rejection-inversion ---------------------------------------------------------------- */

static double helper1(double x) { return fabs(x) > 1e-8 ? log1p(x) / x : 1 - x * (0.5 - x * (1.0 / 3 - 0.25 * x)); }
static double helper2(double x) { return fabs(x) > 1e-8 ? expm1(x) / x : 1 + x * 0.5 * (1 + x * (1.0 / 3) * (1 + 0.25 * x)); }

/* H(x) = integral of x^-s: (x^(1-s) - 1) / (1 - s), log x when s = 1, computed without cancellation. */
static double h_integral(const dt_zipf *z, double x) {
    double lx = log(x);
    return helper2((1 - z->s) * lx) * lx;
}

static double h(const dt_zipf *z, double x) { return exp(-z->s * log(x)); }

static double h_integral_inverse(const dt_zipf *z, double x) {
    double t = x * (1 - z->s);
    if (t < -1) t = -1; /* rounding can push it just below */
    return exp(helper1(t) * x);
}

int dt_zipf_init(dt_zipf *z, uint64_t n, double s, dt_error *err) {
    if (n < 1 || n > DT_CLICKGEN_MAX_VOCAB)
        return dt_errorf(err, DT_EINVAL, "Zipf: %llu values, expected 1 to 2^32", (unsigned long long)n);
    if (!(s > 0 && s <= 100)) return dt_errorf(err, DT_EINVAL, "Zipf: exponent %g, expected > 0 and <= 100", s);
    z->s = s, z->n = (double)n;
    z->h_x1 = h_integral(z, 1.5) - 1;
    z->h_n = h_integral(z, z->n + 0.5);
    z->sval = 2 - h_integral_inverse(z, h_integral(z, 2.5) - h(z, 2));
    return 0;
}

static double uniform53(dt_rng *r) { return (double)(dt_rng_next(r) >> 11) * 0x1p-53; }

uint64_t dt_zipf_sample(const dt_zipf *z, dt_rng *r) {
    for (;;) {
        double u = z->h_n + uniform53(r) * (z->h_x1 - z->h_n); /* uniform in (h_x1, h_n] */
        double x = h_integral_inverse(z, u);
        double kd = floor(x + 0.5);
        if (kd < 1) kd = 1;
        else if (kd > z->n) kd = z->n;
        if (kd - x <= z->sval || u >= h_integral(z, kd + 0.5) - h(z, kd)) return (uint64_t)kd;
    }
}

/* ---- the true model --------------------------------------------------------------------------- */

void dt_clickgen_options_init(dt_clickgen_options *o) {
    memset(o, 0, sizeof *o);
    o->lines = 1000000;
    for (int f = 0; f < DT_CRITEO_FIELDS; f++) o->vocab[f] = 1000000;
    o->zipf = 1.1;
    o->model = DT_CLICKGEN_LR;
    o->fm_dim = 8;
    o->missing = 0.05;
    o->seed = 1;
    o->validation_fraction = 0.1, o->test_fraction = 0.1;
    o->bias = -0.85, o->weight_scale = 0.58, o->factor_scale = 0.28, o->dense_scale = 0.1, o->rank_decay = 0.5;
}

/* What a generator needs beyond the options: the fields' samplers and hash keys. */
typedef struct {
    const dt_clickgen_options *o;
    dt_zipf zipf[DT_CRITEO_FIELDS];
    uint32_t id_key[DT_CRITEO_FIELDS];
    uint64_t weight_seed, line_seed;
    double dense_w[DT_CRITEO_DENSE];
} model;

/* murmur3's 32-bit finaliser: a bijection of 32-bit values. */
static uint32_t fmix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    x *= 0xc2b2ae35u;
    return x ^ (x >> 16);
}

/* The id written for rank k of field f: a bijection of the ranks 1..2^32 onto the 32-bit ids. */
static uint32_t rank_id(const model *m, int f, uint64_t k) { return fmix32((uint32_t)(k - 1) ^ m->id_key[f]); }

/* N(0, 1) from a 64-bit hash: Box-Muller on its two 32-bit halves. */
static double normal_of(uint64_t h) {
    double u1 = ((double)(h >> 32) + 0.5) * 0x1p-32, u2 = (double)(uint32_t)h * 0x1p-32;
    return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

/* z for (field f, rank k, component c): c = 0 the weight, 1..fm_dim the factors. */
static double z_of(const model *m, int f, uint64_t k, int c) {
    uint64_t key = ((uint64_t)f << 40 | (k - 1)) * 128 + (uint64_t)c;
    return normal_of(dt_hash64(m->weight_seed, key));
}

static int model_init(model *m, const dt_clickgen_options *o, dt_error *err) {
    memset(m, 0, sizeof *m);
    m->o = o;
    for (int f = 0; f < DT_CRITEO_FIELDS; f++) {
        int rc = dt_zipf_init(&m->zipf[f], o->vocab[f], o->zipf, err);
        if (rc) return dt_error_wrap(err, rc, "field C%d: ", f + 1);
        m->id_key[f] = (uint32_t)dt_hash64(o->seed ^ 0x6964736b6579ULL, (uint64_t)f);
    }
    m->weight_seed = dt_hash64(o->seed, 0x776569676874ULL);
    m->line_seed = dt_hash64(o->seed, 0x6c696e6573ULL);
    for (int j = 0; j < DT_CRITEO_DENSE; j++) m->dense_w[j] = o->dense_scale * z_of(m, DT_CRITEO_FIELDS, (uint64_t)j + 1, 0);
    return 0;
}

/* One example: the integers (*empty set for missing ones), the ranks (0: missing) and p. */
typedef struct {
    int64_t x[DT_CRITEO_DENSE];
    uint8_t x_empty[DT_CRITEO_DENSE];
    uint64_t k[DT_CRITEO_FIELDS];
    float p;
    int label;
} example;

static void draw_dense(const model *m, dt_rng *r, example *e) {
    for (int j = 0; j < DT_CRITEO_DENSE; j++) {
        e->x_empty[j] = uniform53(r) < m->o->missing;
        double g = fabs(dt_rng_normal(r)) * (1 + (j % 4) * 0.5);
        if (g > 40) g = 40;
        e->x[j] = (int64_t)floor(expm1(g));
        if (j == 1 && uniform53(r) < 0.05) e->x[j] = -1 - (int64_t)dt_rng_below(r, 3);
    }
}

static double logit_of(const model *m, const example *e) {
    const dt_clickgen_options *o = m->o;
    double logit = o->bias, sum[DT_CLICKGEN_MAX_FM_DIM] = {0}, sumsq = 0;
    for (int j = 0; j < DT_CRITEO_DENSE; j++)
        if (!e->x_empty[j]) logit += m->dense_w[j] * dt_ctr_dense_value(e->x[j]);
    for (int f = 0; f < DT_CRITEO_FIELDS; f++) {
        if (!e->k[f]) continue;
        double scale = pow((double)e->k[f], -o->rank_decay);
        logit += o->weight_scale * scale * z_of(m, f, e->k[f], 0);
        if (o->model != DT_CLICKGEN_FM) continue;
        for (int c = 0; c < o->fm_dim; c++) {
            double v = o->factor_scale * scale * z_of(m, f, e->k[f], 1 + c);
            sum[c] += v, sumsq += v * v;
        }
    }
    if (o->model == DT_CLICKGEN_FM) { /* sum over pairs f < g = ((sum v)^2 - sum v^2) / 2 */
        double sq = 0;
        for (int c = 0; c < o->fm_dim; c++) sq += sum[c] * sum[c];
        logit += 0.5 * (sq - sumsq);
    }
    return logit;
}

static void draw_example(const model *m, int64_t line, example *e) {
    dt_rng r;
    dt_rng_seed(&r, dt_hash64(m->line_seed, (uint64_t)line));
    draw_dense(m, &r, e);
    for (int f = 0; f < DT_CRITEO_FIELDS; f++) {
        int empty = uniform53(&r) < m->o->missing;
        e->k[f] = empty ? 0 : dt_zipf_sample(&m->zipf[f], &r);
    }
    e->p = (float)(1 / (1 + exp(-logit_of(m, e))));
    e->label = uniform53(&r) < (double)e->p;
}

/* ---- output: a buffered atomic file, gzip by name --------------------------------------------- */

typedef struct {
    dt_atomic_file f;
    int gz, open;
    z_stream zs;
    char *buf;      /* text waiting */
    uint8_t *zbuf;  /* compressed bytes waiting */
    size_t len;
} sink;

static int ends_with_gz(const char *path) {
    size_t n = strlen(path);
    return n > 3 && !strcmp(path + n - 3, ".gz");
}

static int sink_open(sink *s, const char *path, dt_error *err) {
    memset(s, 0, sizeof *s);
    s->f.fd = -1;
    s->gz = ends_with_gz(path);
    if (!(s->buf = dt_malloc(OUT_BUFFER, "output buffer", err))) return DT_ENOMEM;
    if (s->gz) {
        if (!(s->zbuf = dt_malloc(OUT_BUFFER, "gzip output buffer", err))) return DT_ENOMEM;
        /* Level 1: a Criteo-sized file in minutes, not tens of minutes; 20% larger than level 6. */
        if (deflateInit2(&s->zs, 1, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK)
            return dt_errorf(err, DT_ENOMEM, "%s: cannot start gzip compression", path);
    }
    int rc = dt_atomic_open(&s->f, path, err);
    s->open = rc == 0;
    return rc;
}

static int sink_deflate(sink *s, int flush, dt_error *err) {
    s->zs.next_in = (Bytef *)s->buf, s->zs.avail_in = (uInt)s->len;
    do {
        s->zs.next_out = s->zbuf, s->zs.avail_out = (uInt)OUT_BUFFER;
        if (deflate(&s->zs, flush) == Z_STREAM_ERROR) return dt_errorf(err, DT_EIO, "%s: gzip failed", s->f.path);
        int rc = dt_atomic_write(&s->f, s->zbuf, OUT_BUFFER - s->zs.avail_out, err);
        if (rc) return rc;
    } while (s->zs.avail_out == 0);
    return 0;
}

static int sink_flush(sink *s, int final, dt_error *err) {
    int rc = s->gz ? sink_deflate(s, final ? Z_FINISH : Z_NO_FLUSH, err) : dt_atomic_write(&s->f, s->buf, s->len, err);
    s->len = 0;
    return rc;
}

/* Room for one more line of at most `need` bytes. */
static int sink_reserve(sink *s, size_t need, dt_error *err) {
    return s->len + need > OUT_BUFFER ? sink_flush(s, 0, err) : 0;
}

static int sink_close(sink *s, int commit, dt_error *err) {
    int rc = 0;
    if (s->open && commit) {
        rc = sink_flush(s, 1, err);
        if (!rc) rc = dt_atomic_commit(&s->f, err);
    }
    if (s->open && (rc || !commit)) dt_atomic_abort(&s->f);
    if (s->gz) deflateEnd(&s->zs);
    free(s->buf);
    free(s->zbuf);
    s->buf = NULL, s->zbuf = NULL, s->open = 0;
    return rc;
}

static char *put_int(char *o, int64_t x) {
    char tmp[24];
    int n = 0;
    uint64_t u = x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
    do tmp[n++] = (char)('0' + u % 10), u /= 10;
    while (u);
    if (x < 0) *o++ = '-';
    while (n) *o++ = tmp[--n];
    return o;
}

static char *put_hex8(char *o, uint32_t v) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 7; i >= 0; i--) o[7 - i] = digits[v >> (4 * i) & 15];
    return o + 8;
}

/* Line L as Criteo TSV into s (at most 40 + 13 * 20 + 26 * 8 bytes). */
static void format_line(const model *m, const example *e, sink *s) {
    char *o = s->buf + s->len;
    *o++ = (char)('0' + e->label);
    for (int j = 0; j < DT_CRITEO_DENSE; j++) {
        *o++ = '\t';
        if (!e->x_empty[j]) o = put_int(o, e->x[j]);
    }
    for (int f = 0; f < DT_CRITEO_FIELDS; f++) {
        *o++ = '\t';
        if (e->k[f]) o = put_hex8(o, rank_id(m, f, e->k[f]));
    }
    *o++ = '\n';
    s->len = (size_t)(o - s->buf);
}

/* ---- the whole file --------------------------------------------------------------------------- */

static int check_options(const dt_clickgen_options *o, dt_error *err) {
    if (o->lines < 1 || o->lines > ((uint64_t)1 << 40))
        return dt_errorf(err, DT_EINVAL, "generator: %llu lines, expected 1 to 2^40", (unsigned long long)o->lines);
    if (o->model != DT_CLICKGEN_LR && o->model != DT_CLICKGEN_FM)
        return dt_errorf(err, DT_EINVAL, "generator: unknown model %d", (int)o->model);
    if (o->model == DT_CLICKGEN_FM && (o->fm_dim < 1 || o->fm_dim > DT_CLICKGEN_MAX_FM_DIM))
        return dt_errorf(err, DT_EINVAL, "generator: fm dimension %d, expected 1 to %d", o->fm_dim, DT_CLICKGEN_MAX_FM_DIM);
    if (!(o->missing >= 0 && o->missing <= 1))
        return dt_errorf(err, DT_EINVAL, "generator: missing share %g, expected 0 to 1", o->missing);
    if (!(o->validation_fraction >= 0 && o->test_fraction >= 0 && o->validation_fraction + o->test_fraction <= 1))
        return dt_errorf(err, DT_EINVAL, "generator: validation and test fractions must be >= 0 and add up to at most 1");
    double scales[] = {o->bias, o->weight_scale, o->factor_scale, o->dense_scale, o->rank_decay};
    for (int i = 0; i < 5; i++)
        if (!isfinite(scales[i])) return dt_errorf(err, DT_EINVAL, "generator: a model scale is not finite");
    return 0;
}

typedef struct {
    sink data, probs;
    int has_probs;
    dt_binary_eval *eval[3];
} outputs;

static int outputs_open(outputs *out, const char *path, const char *probs_path, dt_error *err) {
    memset(out, 0, sizeof *out);
    out->data.f.fd = out->probs.f.fd = -1;
    for (int k = 0; k < 3; k++) {
        int rc = dt_binary_eval_create(&out->eval[k], 0, err);
        if (rc) return rc;
    }
    int rc = sink_open(&out->data, path, err);
    if (!rc && probs_path) out->has_probs = 1, rc = sink_open(&out->probs, probs_path, err);
    return rc;
}

static int outputs_close(outputs *out, int commit, dt_error *err) {
    int rc = sink_close(&out->data, commit, err);
    if (out->has_probs) {
        int rc2 = sink_close(&out->probs, commit && !rc, err);
        if (!rc) rc = rc2;
    }
    for (int k = 0; k < 3; k++) dt_binary_eval_free(out->eval[k]);
    return rc;
}

/* Lines of each split share one dt_binary_eval per split, fed line by line. */
static int one_line(const model *m, int64_t L, outputs *out, dt_error *err) {
    example e;
    draw_example(m, L, &e);
    int rc = sink_reserve(&out->data, 512, err);
    if (rc) return rc;
    format_line(m, &e, &out->data);
    if (out->has_probs) {
        if ((rc = sink_reserve(&out->probs, 32, err))) return rc;
        out->probs.len += (size_t)snprintf(out->probs.buf + out->probs.len, 32, "%.9g\n", (double)e.p);
    }
    dt_ctr_split sp = dt_ctr_line_split(L, m->o->validation_fraction, m->o->test_fraction);
    float y = (float)e.label;
    return dt_binary_eval_add(out->eval[sp], &e.p, &y, 1, err);
}

int dt_clickgen_write(const char *path, const char *probs_path, const dt_clickgen_options *o,
                      const volatile int *stop, dt_clickgen_report *rep, dt_error *err) {
    memset(rep, 0, sizeof *rep);
    model m;
    int rc = check_options(o, err);
    if (!rc) rc = model_init(&m, o, err);
    if (rc) return rc;
    outputs out;
    rc = outputs_open(&out, path, probs_path, err);
    for (uint64_t L = 1; !rc && L <= o->lines; L++) {
        if ((L & 0xffff) == 0 && stop && *stop) rc = dt_errorf(err, DT_EINTR, "%s: stopped", path);
        if (!rc) rc = one_line(&m, (int64_t)L, &out, err);
    }
    for (int k = 0; !rc && k < 3; k++) rc = dt_binary_eval_result(out.eval[k], &rep->split[k], err);
    int rc2 = outputs_close(&out, rc == 0, err);
    return rc ? rc : rc2;
}
