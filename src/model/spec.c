/* Model-file parser (format: docs/model-format.md). One pass over the lines fills dt_model_spec;
 * dt_model_spec_shapes then walks the layers to check that every shape fits. Every message starts
 * with "<source>:<line>: " so a user can jump to the fault. */
#include "model/spec.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/fsutil.h"
#include "core/text.h"

#define MAX_TOKENS 32

static const char *const kind_names[] = {
    [DT_LAYER_CONV2D] = "conv2d", [DT_LAYER_MAXPOOL] = "maxpool", [DT_LAYER_RELU] = "relu",
    [DT_LAYER_DROPOUT] = "dropout", [DT_LAYER_FLATTEN] = "flatten", [DT_LAYER_DENSE] = "dense",
    [DT_LAYER_BATCHNORM] = "batchnorm", [DT_LAYER_AVGPOOL] = "avgpool",
    [DT_LAYER_GLOBAL_AVGPOOL] = "global_avgpool", [DT_LAYER_LEAKY_RELU] = "leaky_relu",
    [DT_LAYER_SIGMOID] = "sigmoid", [DT_LAYER_TANH] = "tanh", [DT_LAYER_ADD] = "add",
    [DT_LAYER_CONCAT] = "concat", [DT_LAYER_EMBEDDING] = "embedding", [DT_LAYER_FM] = "fm",
    [DT_LAYER_REDUCE_SUM] = "reduce_sum",
};
#define N_KINDS ((int)(sizeof kind_names / sizeof kind_names[0]))

/* Prefix of auto-numbered layer names: conv1, pool1, relu1, dropout1, flatten1, dense1, bn1, ... */
static const char *const name_prefix[] = {
    [DT_LAYER_CONV2D] = "conv", [DT_LAYER_MAXPOOL] = "pool", [DT_LAYER_RELU] = "relu",
    [DT_LAYER_DROPOUT] = "dropout", [DT_LAYER_FLATTEN] = "flatten", [DT_LAYER_DENSE] = "dense",
    [DT_LAYER_BATCHNORM] = "bn", [DT_LAYER_AVGPOOL] = "avgpool",
    [DT_LAYER_GLOBAL_AVGPOOL] = "global_avgpool", [DT_LAYER_LEAKY_RELU] = "leaky_relu",
    [DT_LAYER_SIGMOID] = "sigmoid", [DT_LAYER_TANH] = "tanh", [DT_LAYER_ADD] = "add",
    [DT_LAYER_CONCAT] = "concat", [DT_LAYER_EMBEDDING] = "embedding", [DT_LAYER_FM] = "fm",
    [DT_LAYER_REDUCE_SUM] = "reduce_sum",
};

/* Options each layer kind accepts, NULL-terminated. */
static const char *const conv_opts[] = {"filters", "kernel", "stride", "padding",
                                        "use_bias", "weight_init", "bias_init", NULL};
static const char *const pool_opts[] = {"size", "stride", "padding", NULL};
static const char *const dropout_opts[] = {"rate", NULL};
static const char *const dense_opts[] = {"units", "use_bias", "weight_init", "bias_init", NULL};
static const char *const bn_opts[] = {"momentum", "epsilon", NULL};
static const char *const leaky_opts[] = {"alpha", NULL};
static const char *const emb_opts[] = {"dim",         "buckets",   "fields",      "table", "combiner",
                                       "weight_init", "capacity", "min_count", "evict_after", "max_ids", NULL};
static const char *const no_opts[] = {NULL};
static const char *const *const kind_opts[] = {
    [DT_LAYER_CONV2D] = conv_opts, [DT_LAYER_MAXPOOL] = pool_opts, [DT_LAYER_RELU] = no_opts,
    [DT_LAYER_DROPOUT] = dropout_opts, [DT_LAYER_FLATTEN] = no_opts, [DT_LAYER_DENSE] = dense_opts,
    [DT_LAYER_BATCHNORM] = bn_opts, [DT_LAYER_AVGPOOL] = pool_opts, [DT_LAYER_GLOBAL_AVGPOOL] = no_opts,
    [DT_LAYER_LEAKY_RELU] = leaky_opts, [DT_LAYER_SIGMOID] = no_opts, [DT_LAYER_TANH] = no_opts,
    [DT_LAYER_ADD] = no_opts, [DT_LAYER_CONCAT] = no_opts, [DT_LAYER_EMBEDDING] = emb_opts,
    [DT_LAYER_FM] = no_opts, [DT_LAYER_REDUCE_SUM] = no_opts,
};
/* Options every layer takes: its name, and where its input comes from (docs/model-format.md). */
static const char *const graph_opts[] = {"name", "input", NULL};

static const char *const init_names[] = {"truncated_normal", "constant", "glorot_uniform",
                                         "he_uniform", NULL};
static const char *const padding_names[] = {"same", "valid", NULL};
static const char *const bool_names[] = {"true", "false", NULL};
static const char *const table_names[] = {"per_field", "shared", NULL};
static const char *const combiner_names[] = {"sum", "mean", NULL};

const char *dt_layer_kind_name(dt_layer_kind kind) {
    return (int)kind >= 0 && (int)kind < N_KINDS ? kind_names[kind] : "?";
}

/* ---- suggestions for misspelled words ---- */

/* Writes " (did you mean 'x'?)" for the closest candidate within reach, or " (expected one of:
 * a, b, c)" when nothing is close. */
static void suggest(char *out, size_t cap, const char *word, const char *const *cands) {
    const char *best = NULL;
    int best_d = INT_MAX;
    for (int i = 0; cands[i]; i++) {
        int d = dt_edit_distance(word, cands[i]);
        if (d < best_d) best_d = d, best = cands[i];
    }
    size_t lw = strlen(word);
    if (best && best_d <= 1 + (int)(lw / 4) && (size_t)best_d < lw) {
        snprintf(out, cap, " (did you mean '%s'?)", best);
        return;
    }
    size_t n = (size_t)snprintf(out, cap, " (expected one of:");
    for (int i = 0; cands[i] && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s %s", i ? "," : "", cands[i]);
    if (n < cap) snprintf(out + n, cap - n, ")");
}

/* The dt_layer_kind whose name is word, or -1. */
static int layer_kind_of(const char *word) {
    for (int k = 0; k < N_KINDS; k++)
        if (kind_names[k] && strcmp(word, kind_names[k]) == 0) return k;
    return -1;
}

static int find_word(const char *word, const char *const *list) {
    for (int i = 0; list[i]; i++)
        if (strcmp(word, list[i]) == 0) return i;
    return -1;
}

/* ---- values ---- */

/* Messages quote user text; keep quotes short so a huge token cannot crowd out the location. */
#define Q(s) 40, (s)

typedef struct {
    const char *src;
    int line;
    dt_error *err;
} ctx;

#define FAIL(c, code, ...) fail_at((c), (code), __VA_ARGS__)
__attribute__((format(printf, 3, 4))) static int fail_at(const ctx *c, int code, const char *fmt, ...) {
    char what[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return dt_errorf(c->err, code, "%s:%d: %s", c->src, c->line, what);
}

/* Decimal integer in [lo, hi], nothing else. */
static int parse_int(const char *s, long lo, long hi, long *out) {
    if (!isdigit((unsigned char)*s)) return -1;
    errno = 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || errno || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_float(const char *s, double *out) {
    if (!*s || isspace((unsigned char)*s)) return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    /* strtod accepts "nan", "inf" and hex floats; only finite decimal numbers are wanted. */
    if (*end || errno || !isfinite(v) || strpbrk(s, "xXnN")) return -1;
    *out = v;
    return 0;
}

/* "3" or "3x5" (height x width) */
static int parse_pair(const ctx *c, const char *key, const char *v, long lo, int *h, int *w) {
    char buf[64];
    const char *x = strchr(v, 'x');
    long a, b;
    if (!x) {
        if (parse_int(v, lo, DT_MODEL_MAX_DIM, &a) == 0) {
            *h = *w = (int)a;
            return 0;
        }
    } else if ((size_t)(x - v) < sizeof buf) {
        memcpy(buf, v, (size_t)(x - v));
        buf[x - v] = 0;
        if (parse_int(buf, lo, DT_MODEL_MAX_DIM, &a) == 0 &&
            parse_int(x + 1, lo, DT_MODEL_MAX_DIM, &b) == 0) {
            *h = (int)a, *w = (int)b;
            return 0;
        }
    }
    return FAIL(c, DT_EFORMAT, "bad value '%.*s' for %s: expected N or HxW with integers from %ld to %d",
                Q(v), key, lo, DT_MODEL_MAX_DIM);
}

static int parse_count(const ctx *c, const char *key, const char *v, int *out) {
    long a;
    if (parse_int(v, 1, DT_MODEL_MAX_DIM, &a) == 0) {
        *out = (int)a;
        return 0;
    }
    return FAIL(c, DT_EFORMAT, "bad value '%.*s' for %s: expected an integer from 1 to %d", Q(v), key,
                DT_MODEL_MAX_DIM);
}

static int parse_choice(const ctx *c, const char *key, const char *v, const char *const *names, int *out) {
    int i = find_word(v, names);
    if (i >= 0) {
        *out = i;
        return 0;
    }
    char hint[256];
    suggest(hint, sizeof hint, v, names);
    return FAIL(c, DT_EFORMAT, "bad value '%.*s' for %s%s", Q(v), key, hint);
}

/* truncated_normal(STDDEV) | constant(VALUE) | glorot_uniform | he_uniform */
static int parse_init(const ctx *c, const char *key, const char *v, dt_init *out) {
    char name[64];
    const char *open = strchr(v, '(');
    size_t n = open ? (size_t)(open - v) : strlen(v);
    if (n >= sizeof name) n = sizeof name - 1;
    memcpy(name, v, n);
    name[n] = 0;
    int i = find_word(name, init_names);
    if (i < 0) {
        char hint[256];
        suggest(hint, sizeof hint, name, init_names);
        return FAIL(c, DT_EFORMAT, "unknown initialiser '%.*s' for %s%s", Q(name), key, hint);
    }
    static const dt_init_kind kinds[] = {DT_INIT_TRUNC_NORMAL, DT_INIT_CONSTANT, DT_INIT_GLOROT_UNIFORM,
                                         DT_INIT_HE_UNIFORM};
    out->kind = kinds[i];
    out->value = 0;
    int wants_arg = out->kind == DT_INIT_TRUNC_NORMAL || out->kind == DT_INIT_CONSTANT;
    if (!wants_arg) {
        if (open) return FAIL(c, DT_EFORMAT, "%s takes no argument: write '%s=%s'", name, key, name);
        return 0;
    }
    const char *arg_name = out->kind == DT_INIT_TRUNC_NORMAL ? "STDDEV" : "VALUE";
    size_t len = strlen(v);
    if (!open || len < 2 || v[len - 1] != ')' || open >= v + len - 1)
        return FAIL(c, DT_EFORMAT, "bad value '%.*s' for %s: write %s(%s)", Q(v), key, name, arg_name);
    char num[64];
    size_t an = (size_t)(v + len - 1 - (open + 1));
    double x;
    if (an >= sizeof num)
        return FAIL(c, DT_EFORMAT, "bad number in '%.*s' for %s", Q(v), key);
    memcpy(num, open + 1, an);
    num[an] = 0;
    if (parse_float(num, &x) != 0)
        return FAIL(c, DT_EFORMAT, "bad number '%.*s' in %s(...) for %s", Q(num), name, key);
    if (out->kind == DT_INIT_TRUNC_NORMAL && !(x > 0 && x <= 1e3))
        return FAIL(c, DT_EFORMAT, "truncated_normal stddev %g out of range (0, 1000] for %s", x, key);
    if (out->kind == DT_INIT_CONSTANT && !(fabs(x) <= 1e6))
        return FAIL(c, DT_EFORMAT, "constant %g out of range [-1e6, 1e6] for %s", x, key);
    out->value = (float)x;
    return 0;
}

/* ---- one layer line ---- */

/* A layer name: a letter or '_', then letters, digits, '_', '-', '.'; "input" is the model input. */
static int valid_layer_name(const char *s) {
    if (!isalpha((unsigned char)*s) && *s != '_') return 0;
    if (strlen(s) >= sizeof ((dt_layer_spec *)0)->name) return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr("_-.", *s)) return 0;
    return 1;
}

/* input=NAME[,NAME...]: checks the names; they are resolved once the whole file is read. */
static int check_input_list(const ctx *c, const char *v) {
    char buf[64];
    int n = 0;
    for (const char *p = v;; p++) {
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof buf)
            return FAIL(c, DT_EFORMAT, "bad value '%.*s' for input: expected layer names separated by commas", Q(v));
        memcpy(buf, p, len);
        buf[len] = 0;
        if (!valid_layer_name(buf))
            return FAIL(c, DT_EFORMAT, "bad layer name '%.*s' in input=", Q(buf));
        if (++n > DT_LAYER_MAX_INPUTS)
            return FAIL(c, DT_EFORMAT, "too many inputs (at most %d)", DT_LAYER_MAX_INPUTS);
        p += len;
        if (!*p) return 0;
    }
}

/* name= or input=: *input_ref gets input='s raw value (resolved once the whole file is read). */
static int parse_graph_opt(const ctx *c, int go, const char *key, const char *v, dt_layer_spec *L,
                           const char **input_ref, unsigned *seen) {
    if (*seen & (1u << go)) return FAIL(c, DT_EFORMAT, "duplicate option '%s'", key);
    *seen |= 1u << go;
    if (!*v) return FAIL(c, DT_EFORMAT, "missing value for '%s'", key);
    if (go == 1) {
        int rc = check_input_list(c, v);
        if (!rc) *input_ref = v;
        return rc;
    }
    if (!valid_layer_name(v) || !strcmp(v, "input"))
        return FAIL(c, DT_EFORMAT, "bad layer name '%.*s': a letter or '_', then at most %zu letters, "
                    "digits, '_', '-' or '.' ('input' names the model input)", Q(v), sizeof L->name - 2);
    strcpy(L->name, v);
    return 0;
}

/* An option the kind does not take: the closest one it does, or all of them. */
static int unknown_option(const ctx *c, const char *key, const char *const *opts, const char *kname) {
    char hint[256];
    if (!opts[0])
        return FAIL(c, DT_EFORMAT, "unknown option '%.*s': %s takes no options but name= and input=", Q(key), kname);
    const char *all[16]; /* the kind's options (at most 7), name and input */
    int na = 0;
    for (int i = 0; opts[i] && na < 13; i++) all[na++] = opts[i];
    all[na++] = "name", all[na++] = "input", all[na] = NULL;
    suggest(hint, sizeof hint, key, all);
    return FAIL(c, DT_EFORMAT, "unknown option '%.*s' for %s%s", Q(key), kname, hint);
}

/* A number in [0, 1) for key (dropout's rate, leaky ReLU's alpha, batch norm's momentum). */
static int parse_fraction(const ctx *c, const char *key, const char *v, float *out) {
    double r;
    if (parse_float(v, &r) != 0 || !(r >= 0 && r < 1))
        return FAIL(c, DT_EFORMAT, "bad value '%.*s' for %s: expected a number in [0, 1)", Q(v), key);
    *out = (float)r;
    return 0;
}

/* embedding's fields=: "all", or field numbers and ranges "0-12,20" (0-based, as dt_ctr_hash). "all"
 * leaves n_fields -1: the input line's fields, filled in once the layer is read. */
static int parse_fields(const ctx *c, const char *v, dt_layer_spec *L) {
    memset(L->fields, 0, sizeof L->fields);
    L->n_fields = 0;
    if (!strcmp(v, "all")) return L->n_fields = -1, 0;
    for (const char *p = v;;) {
        char buf[32];
        size_t len = strcspn(p, ",");
        const char *dash = memchr(p, '-', len);
        long a = -1, b = -1;
        if (len > 0 && len < sizeof buf) {
            memcpy(buf, p, len);
            buf[len] = 0;
            if (dash) buf[dash - p] = 0;
            if (parse_int(buf, 0, DT_MODEL_MAX_FIELDS - 1, &a) != 0) a = -1;
            else if (!dash) b = a;
            else if (parse_int(buf + (dash - p) + 1, 0, DT_MODEL_MAX_FIELDS - 1, &b) != 0 || b < a) b = -1;
        }
        if (a < 0 || b < 0)
            return FAIL(c, DT_EFORMAT, "bad value '%.*s' for fields: expected 'all' or field numbers and ranges "
                        "such as 0-12,20 (0-based, each below %d, ranges low-high)", Q(v), DT_MODEL_MAX_FIELDS);
        for (long f = a; f <= b; f++) {
            if (dt_layer_has_field(L, (int)f))
                return FAIL(c, DT_EFORMAT, "bad value '%.*s' for fields: field %ld is listed twice", Q(v), f);
            L->fields[f >> 6] |= (uint64_t)1 << (f & 63);
            L->n_fields++;
        }
        p += len;
        if (!*p++) return 0;
    }
}

/* embedding's own options. */
static int parse_embedding_opt(const ctx *c, const char *key, const char *v, dt_layer_spec *L) {
    int choice = 0, rc;
    long n;
    if (!strcmp(key, "dim")) return parse_count(c, key, v, &L->dim);
    if (!strcmp(key, "fields")) return parse_fields(c, v, L);
    if (!strcmp(key, "buckets")) {
        if (parse_int(v, 1, (long)DT_MODEL_MAX_BUCKETS, &n) != 0)
            return FAIL(c, DT_EFORMAT, "bad value '%.*s' for buckets: expected an integer from 1 to %lld (rows "
                        "of each table)", Q(v), (long long)DT_MODEL_MAX_BUCKETS);
        L->buckets = n;
        return 0;
    }
    if (!strcmp(key, "capacity") || !strcmp(key, "evict_after")) {
        const int cap = key[0] == 'c';
        const long lo = cap ? 1 : 0, hi = (long)(cap ? DT_MODEL_MAX_CAPACITY : DT_MODEL_MAX_EVICT_AFTER);
        if (parse_int(v, lo, hi, &n) != 0)
            return FAIL(c, DT_EFORMAT, "bad value '%.*s' for %s: expected an integer from %ld to %ld (%s)", Q(v), key, lo,
                        hi, cap ? "rows of each table a ps task holds" : "table steps a row may go untouched; 0: never");
        *(cap ? &L->capacity : &L->evict_after) = n;
        return 0;
    }
    if (!strcmp(key, "max_ids")) {
        if (parse_int(v, 1, DT_MODEL_MAX_IDS, &n) != 0)
            return FAIL(c, DT_EFORMAT, "bad value '%.*s' for max_ids: expected an integer from 1 to %d (distinct ids one "
                        "example may name in one field)", Q(v), DT_MODEL_MAX_IDS);
        L->max_ids = (int)n;
        return 0;
    }
    if (!strcmp(key, "min_count")) {
        if (parse_int(v, 0, DT_MODEL_MAX_MIN_COUNT, &n) != 0)
            return FAIL(c, DT_EFORMAT, "bad value '%.*s' for min_count: expected an integer from 0 to %d (updates of an "
                        "id before it gets a row)", Q(v), DT_MODEL_MAX_MIN_COUNT);
        L->min_count = (int)n;
        return 0;
    }
    if (!strcmp(key, "table")) {
        rc = parse_choice(c, key, v, table_names, &choice);
        L->shared = choice == 1;
        return rc;
    }
    rc = parse_choice(c, key, v, combiner_names, &choice);
    L->mean = choice == 1;
    return rc;
}

/* The value of one of the kind's own options. */
static int parse_kind_opt(const ctx *c, const char *key, const char *v, dt_layer_spec *L, int *stride_given) {
    int choice = 0, rc = 0;
    if (L->kind == DT_LAYER_EMBEDDING && strcmp(key, "weight_init")) return parse_embedding_opt(c, key, v, L);
    if (!strcmp(key, "filters")) return parse_count(c, key, v, &L->filters);
    if (!strcmp(key, "units")) return parse_count(c, key, v, &L->units);
    if (!strcmp(key, "kernel") || !strcmp(key, "size")) return parse_pair(c, key, v, 1, &L->k_h, &L->k_w);
    if (!strcmp(key, "stride")) return *stride_given = 1, parse_pair(c, key, v, 1, &L->stride_h, &L->stride_w);
    if (!strcmp(key, "padding")) {
        rc = parse_choice(c, key, v, padding_names, &choice);
        L->padding = choice == 0 ? DT_PAD_SAME : DT_PAD_VALID;
        return rc;
    }
    if (!strcmp(key, "use_bias")) {
        rc = parse_choice(c, key, v, bool_names, &choice);
        L->use_bias = choice == 0;
        return rc;
    }
    if (!strcmp(key, "weight_init")) return parse_init(c, key, v, &L->weight_init);
    if (!strcmp(key, "bias_init")) return parse_init(c, key, v, &L->bias_init);
    if (!strcmp(key, "epsilon")) {
        double r;
        if (parse_float(v, &r) != 0 || !(r >= 1e-12 && r <= 1))
            return FAIL(c, DT_EFORMAT, "bad value '%.*s' for epsilon: expected a number in [1e-12, 1]", Q(v));
        L->epsilon = (float)r;
        return 0;
    }
    return parse_fraction(c, key, v, key[0] == 'r' ? &L->rate : key[0] == 'a' ? &L->alpha : &L->momentum);
}

/* A layer's defaults (Keras's where Keras has one). */
static void layer_defaults(dt_layer_spec *L, dt_layer_kind kind, int line) {
    memset(L, 0, sizeof *L);
    L->kind = kind;
    L->line = line;
    L->stride_h = L->stride_w = 1;
    L->padding = DT_PAD_VALID;
    L->use_bias = 1;
    L->weight_init.kind = DT_INIT_GLOROT_UNIFORM;
    L->bias_init.kind = DT_INIT_CONSTANT;
    L->alpha = 0.3f;      /* Keras's LeakyReLU */
    L->momentum = 0.99f;  /* Keras's BatchNormalization */
    L->epsilon = 1e-3f;
    if (kind != DT_LAYER_EMBEDDING) return;
    L->n_fields = -1;     /* all of the input's */
    L->mean = 1;          /* TensorFlow's embedding_column and embedding_lookup_sparse */
    L->max_ids = 1;
    L->use_bias = 0;
}

/* An embedding's rows: hashed (buckets=) or unbounded (capacity=, with its admission and eviction). */
static int finish_embedding(const ctx *c, const dt_layer_spec *L, unsigned seen) {
    const char *const *opts = kind_opts[DT_LAYER_EMBEDDING];
    const int buckets = (seen >> find_word("buckets", opts)) & 1, capacity = (seen >> find_word("capacity", opts)) & 1;
    if (!buckets && !capacity)
        return FAIL(c, DT_EFORMAT, "embedding needs buckets=N (ids hashed into N rows per table) or capacity=N (unbounded "
                    "ids: a row per raw id, at most N rows of each table per ps task)");
    if (buckets && capacity)
        return FAIL(c, DT_EFORMAT, "embedding takes buckets=N (hashed ids) or capacity=N (unbounded ids), not both");
    const char *only[2] = {"min_count", "evict_after"};
    for (int k = 0; k < 2 && buckets; k++)
        if ((seen >> find_word(only[k], opts)) & 1)
            return FAIL(c, DT_EFORMAT, "%s is for unbounded ids (capacity=N, no buckets=): a hashed table has a row for "
                        "every bucket", only[k]);
    return 0;
}

/* What the options given leave to check: the required ones, pooling's stride, the bias. */
static int finish_layer(const ctx *c, dt_layer_spec *L, unsigned seen, int stride_given) {
    const char *const *opts = kind_opts[L->kind];
    for (int o = 0; opts[o]; o++) {
        int required = !strcmp(opts[o], "filters") || !strcmp(opts[o], "units") ||
                       !strcmp(opts[o], "kernel") || !strcmp(opts[o], "size") || !strcmp(opts[o], "rate") ||
                       !strcmp(opts[o], "dim");
        if (required && !(seen & (1u << o)))
            return FAIL(c, DT_EFORMAT, "%s needs %s=", kind_names[L->kind], opts[o]);
        /* TensorFlow's embedding_column: truncated normal of stddev 1/sqrt(dim) */
        if (!strcmp(opts[o], "weight_init") && L->kind == DT_LAYER_EMBEDDING && !(seen & (1u << o)))
            L->weight_init = (dt_init){DT_INIT_TRUNC_NORMAL, (float)(1.0 / sqrt((double)L->dim))};
    }
    if (L->kind == DT_LAYER_EMBEDDING) {
        int rc = finish_embedding(c, L, seen);
        if (rc) return rc;
    }
    if ((L->kind == DT_LAYER_MAXPOOL || L->kind == DT_LAYER_AVGPOOL) && !stride_given)
        L->stride_h = L->k_h, L->stride_w = L->k_w;
    int bias_o = find_word("bias_init", opts);
    if (!L->use_bias && bias_o >= 0 && (seen & (1u << bias_o)))
        return FAIL(c, DT_EFORMAT, "bias_init given but use_bias=false");
    return 0;
}

/* *input_ref: the raw input= value (NULL if absent), resolved by resolve_inputs. */
static int parse_layer(const ctx *c, dt_layer_kind kind, char **tok, int ntok, dt_layer_spec *L,
                       const char **input_ref) {
    layer_defaults(L, kind, c->line);
    *input_ref = NULL;
    const char *const *opts = kind_opts[kind];
    const char *kname = kind_names[kind];
    unsigned seen = 0, graph_seen = 0;
    int stride_given = 0;
    for (int t = 1; t < ntok; t++) {
        char *key = tok[t], *eq = strchr(key, '=');
        if (!eq) return FAIL(c, DT_EFORMAT, "expected key=value after '%s', got '%.*s'", kname, Q(key));
        *eq = 0;
        const char *v = eq + 1;
        if (!*key) return FAIL(c, DT_EFORMAT, "missing option name before '=%.*s'", Q(v));
        int go = find_word(key, graph_opts), o = go >= 0 ? -1 : find_word(key, opts), rc;
        if (go >= 0) rc = parse_graph_opt(c, go, key, v, L, input_ref, &graph_seen);
        else if (o < 0) rc = unknown_option(c, key, opts, kname);
        else if (seen & (1u << o)) rc = FAIL(c, DT_EFORMAT, "duplicate option '%s'", key);
        else if (!*v) rc = FAIL(c, DT_EFORMAT, "missing value for '%s'", key);
        else seen |= 1u << o, rc = parse_kind_opt(c, key, v, L, &stride_given);
        if (rc) return rc;
    }
    return finish_layer(c, L, seen, stride_given);
}

/* ---- the whole file ---- */

static void default_name(char *name, size_t cap, const char *source) {
    const char *base = strrchr(source, '/');
    base = base ? base + 1 : source;
    size_t n = strcspn(base, ".");
    if (n == 0) base = "model", n = 5;
    if (n >= cap) n = cap - 1;
    memcpy(name, base, n);
    name[n] = 0;
}

static int valid_name(const char *s) {
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr("_-.", *s)) return 0;
    return 1;
}

/* Index of the layer named `name`, -1 for "input", -2 if none. */
static int find_layer(const dt_model_spec *spec, const char *name) {
    if (!strcmp(name, "input")) return -1;
    for (int j = 0; j < spec->n_layers; j++)
        if (!strcmp(spec->layers[j].name, name)) return j;
    return -2;
}

/* Names every layer is known by are unique; then each input= (refs[i], or NULL for the layer
 * above) becomes layer indices. Inputs must come from layers above, which also rules out cycles. */
static int resolve_inputs(const dt_model_spec *spec, const char *const *refs, dt_error *err) {
    ctx c = {spec->source, 0, err};
    for (int i = 0; i < spec->n_layers; i++)
        for (int j = 0; j < i; j++)
            if (!strcmp(spec->layers[i].name, spec->layers[j].name)) {
                c.line = spec->layers[i].line;
                return FAIL(&c, DT_EFORMAT, "layer name '%s' is already used by the %s at line %d", spec->layers[i].name,
                            kind_names[spec->layers[j].kind], spec->layers[j].line);
            }
    for (int i = 0; i < spec->n_layers; i++) {
        dt_layer_spec *L = &spec->layers[i];
        c.line = L->line;
        int multi = L->kind == DT_LAYER_ADD || L->kind == DT_LAYER_CONCAT;
        if (L->kind == DT_LAYER_EMBEDDING) { /* it reads the batch's ids, not a layer */
            if (refs[i] && strcmp(refs[i], "input"))
                return FAIL(&c, DT_EFORMAT, "embedding reads the click log's categorical fields (fields=), not a "
                            "layer: input=%.*s is not allowed", Q(refs[i]));
            L->n_inputs = 1;
            L->inputs[0] = -1;
            continue;
        }
        if (!refs[i]) {
            if (multi)
                return FAIL(&c, DT_EFORMAT, "%s needs input=NAME,NAME,...: the layers it %s", kind_names[L->kind],
                            L->kind == DT_LAYER_ADD ? "sums" : "concatenates");
            L->n_inputs = 1;
            L->inputs[0] = i - 1;
            continue;
        }
        char buf[64];
        L->n_inputs = 0;
        for (const char *p = refs[i];; p++) {
            size_t len = strcspn(p, ","); /* check_input_list checked the lengths */
            memcpy(buf, p, len);
            buf[len] = 0;
            int j = find_layer(spec, buf);
            if (j == -2) {
                const char *names[DT_MODEL_MAX_LAYERS + 2];
                int n = 0;
                names[n++] = "input";
                for (int k = 0; k < i; k++) names[n++] = spec->layers[k].name;
                names[n] = NULL;
                char hint[256];
                suggest(hint, sizeof hint, buf, names);
                if (!strstr(hint, "did you mean")) hint[0] = 0; /* the whole list would be noise */
                return FAIL(&c, DT_EFORMAT, "input '%.*s' names no layer%s", Q(buf), hint);
            }
            if (j == i)
                return FAIL(&c, DT_EFORMAT, "input '%s' is this layer itself: a layer cannot take its own output (a cycle)", buf);
            if (j > i)
                return FAIL(&c, DT_EFORMAT, "input '%s' is the %s at line %d, below this one: inputs must come from "
                            "layers above (so the graph has no cycles)", buf, kind_names[spec->layers[j].kind],
                            spec->layers[j].line);
            for (int k = 0; k < L->n_inputs; k++)
                if (L->inputs[k] == j) return FAIL(&c, DT_EFORMAT, "input '%s' is given twice", buf);
            L->inputs[L->n_inputs++] = j;
            p += len;
            if (!*p) break;
        }
        if (multi && L->n_inputs < 2)
            return FAIL(&c, DT_EFORMAT, "%s needs at least two inputs, got input=%.*s", kind_names[L->kind], Q(refs[i]));
        if (!multi && L->n_inputs != 1)
            return FAIL(&c, DT_EFORMAT, "%s takes one input, got input=%.*s", kind_names[L->kind], Q(refs[i]));
    }
    return 0;
}

/* The parse of one file, line by line. */
typedef struct {
    dt_model_spec *spec;
    ctx c;
    const char **refs;           /* [cap]: each layer's input= value, pointing into the work copy */
    int cap, have_model, have_input, counters[N_KINDS];
} parser;

/* Splits line p (NUL-terminated, its comment cut) into words. */
static int split_words(const ctx *c, char *p, char **tok, int *ntok) {
    char *save = NULL;
    *ntok = 0;
    for (char *s = strtok_r(p, " \t\r\f\v", &save); s; s = strtok_r(NULL, " \t\r\f\v", &save)) {
        if (*ntok == MAX_TOKENS) return FAIL(c, DT_EFORMAT, "too many words on one line (at most %d)", MAX_TOKENS);
        tok[(*ntok)++] = s;
    }
    return 0;
}

/* model NAME */
static int parse_model_line(parser *ps, char **tok, int ntok) {
    const ctx *c = &ps->c;
    dt_model_spec *spec = ps->spec;
    if (ps->have_model) return FAIL(c, DT_EFORMAT, "duplicate 'model' line");
    if (ps->have_input || spec->n_layers)
        return FAIL(c, DT_EFORMAT, "the 'model' line must come before 'input' and the layers");
    if (ntok != 2) return FAIL(c, DT_EFORMAT, "expected 'model NAME'");
    if (strlen(tok[1]) >= sizeof spec->name || !valid_name(tok[1]))
        return FAIL(c, DT_EFORMAT, "bad model name '%.*s': use at most %zu letters, digits, '_', '-' or '.'",
                    Q(tok[1]), sizeof spec->name - 1);
    strcpy(spec->name, tok[1]);
    ps->have_model = 1;
    return 0;
}

/* input dense=N fields=M: a click log's examples (data/ctr.h), N dense features and M categorical
 * fields. The model input is the dense features, flat; embedding layers read the fields. */
static int parse_ctr_input(parser *ps, char **tok, int ntok) {
    const ctx *c = &ps->c;
    dt_model_spec *spec = ps->spec;
    static const char *const names[] = {"dense", "fields", NULL};
    int seen = 0;
    for (int t = 1; t < ntok; t++) {
        char *eq = strchr(tok[t], '=');
        if (!eq) return FAIL(c, DT_EFORMAT, "expected 'input dense=N fields=M' (a click log) or 'input HEIGHT WIDTH "
                             "CHANNELS' (images), got '%.*s'", Q(tok[t]));
        *eq = 0;
        int k = find_word(tok[t], names);
        long v;
        if (k < 0) {
            char hint[256];
            suggest(hint, sizeof hint, tok[t], names);
            return FAIL(c, DT_EFORMAT, "unknown option '%.*s' for a click-log input%s", Q(tok[t]), hint);
        }
        if (seen & (1 << k)) return FAIL(c, DT_EFORMAT, "duplicate option '%s'", names[k]);
        seen |= 1 << k;
        long lo = k == 0 ? 0 : 1, hi = k == 0 ? DT_MODEL_MAX_DIM : DT_MODEL_MAX_FIELDS;
        if (parse_int(eq + 1, lo, hi, &v) != 0)
            return FAIL(c, DT_EFORMAT, "bad value '%.*s' for %s: expected an integer from %ld to %ld", Q(eq + 1),
                        names[k], lo, hi);
        *(k == 0 ? &spec->num_dense : &spec->num_fields) = (int)v;
    }
    if (!(seen & 2))
        return FAIL(c, DT_EFORMAT, "a click-log input needs fields=M: its categorical fields (Criteo: 26)");
    spec->ctr = 1;
    spec->in_h = spec->in_w = 1, spec->in_c = spec->num_dense;
    ps->have_input = 1;
    spec->input_line = c->line;
    return 0;
}

/* input H W C, or a click log's input dense=N fields=M */
static int parse_input_line(parser *ps, char **tok, int ntok) {
    const ctx *c = &ps->c;
    dt_model_spec *spec = ps->spec;
    if (ps->have_input) return FAIL(c, DT_EFORMAT, "duplicate 'input' line");
    if (spec->n_layers) return FAIL(c, DT_EFORMAT, "the 'input' line must come before the layers");
    for (int t = 1; t < ntok; t++)
        if (strchr(tok[t], '=')) return parse_ctr_input(ps, tok, ntok);
    if (ntok != 4)
        return FAIL(c, DT_EFORMAT, "expected 'input HEIGHT WIDTH CHANNELS' (3 integers), got %d value%s", ntok - 1,
                    ntok == 2 ? "" : "s");
    int *dims[3] = {&spec->in_h, &spec->in_w, &spec->in_c}, rc;
    static const char *const dn[3] = {"height", "width", "channels"};
    for (int d = 0; d < 3; d++)
        if ((rc = parse_count(c, dn[d], tok[1 + d], dims[d]))) return rc;
    ps->have_input = 1;
    spec->input_line = c->line;
    return 0;
}

/* A layer line: its kind is tok[0]. */
static int parse_layer_line(parser *ps, char **tok, int ntok) {
    const ctx *c = &ps->c;
    dt_model_spec *spec = ps->spec;
    int k = layer_kind_of(tok[0]);
    if (k < 0) {
        /* The words a line may start with: the two header lines, then the layer kinds. */
        const char *words[N_KINDS + 3] = {"model", "input"};
        for (int i = 0; i < N_KINDS; i++) words[2 + i] = kind_names[i];
        char hint[256];
        suggest(hint, sizeof hint, tok[0], words);
        return FAIL(c, DT_EFORMAT, "unknown layer '%.*s'%s", Q(tok[0]), hint);
    }
    if (!ps->have_input) return FAIL(c, DT_EFORMAT, "%s before the 'input HEIGHT WIDTH CHANNELS' line", kind_names[k]);
    if (spec->n_layers == DT_MODEL_MAX_LAYERS)
        return FAIL(c, DT_EFORMAT, "too many layers (at most %d)", DT_MODEL_MAX_LAYERS);
    if (spec->n_layers == ps->cap) {
        int ncap = ps->cap ? ps->cap * 2 : 16;
        dt_layer_spec *nl = realloc(spec->layers, sizeof *nl * (size_t)ncap);
        if (nl) spec->layers = nl;
        const char **nr = nl ? realloc(ps->refs, sizeof *nr * (size_t)ncap) : NULL;
        if (!nr) return dt_errorf(c->err, DT_ENOMEM, "out of memory for model layers");
        ps->refs = nr, ps->cap = ncap;
    }
    dt_layer_spec *L = &spec->layers[spec->n_layers];
    int rc = parse_layer(c, (dt_layer_kind)k, tok, ntok, L, &ps->refs[spec->n_layers]);
    if (rc) return rc;
    if (L->kind == DT_LAYER_EMBEDDING && L->n_fields < 0) { /* fields=all: the input's */
        L->n_fields = spec->num_fields;
        for (int f = 0; f < spec->num_fields; f++) L->fields[f >> 6] |= (uint64_t)1 << (f & 63);
    }
    /* Unnamed layers are numbered per kind, named ones too, so naming a layer renames no other. */
    ++ps->counters[k];
    if (!L->name[0]) snprintf(L->name, sizeof L->name, "%s%d", name_prefix[k], ps->counters[k]);
    spec->n_layers++;
    return 0;
}

/* Every line of work [0, len): each a header line or a layer. */
static int parse_lines(parser *ps, char *work, size_t len) {
    char *p = work, *end = work + len, *tok[MAX_TOKENS];
    while (p < end) {
        ps->c.line++;
        char *nl = memchr(p, '\n', (size_t)(end - p)), *eol = nl ? nl : end;
        if (memchr(p, 0, (size_t)(eol - p))) return FAIL(&ps->c, DT_EFORMAT, "NUL byte: this is not a text file");
        *eol = 0;
        char *hash = strchr(p, '#');
        if (hash) *hash = 0;
        int ntok, rc = split_words(&ps->c, p, tok, &ntok);
        p = eol + 1;
        if (!rc && ntok > 0) {
            if (!strcmp(tok[0], "model")) rc = parse_model_line(ps, tok, ntok);
            else if (!strcmp(tok[0], "input")) rc = parse_input_line(ps, tok, ntok);
            else rc = parse_layer_line(ps, tok, ntok);
        }
        if (rc) return rc;
    }
    if (ps->have_input) return 0;
    ps->c.line = ps->c.line ? ps->c.line : 1;
    return FAIL(&ps->c, DT_EFORMAT, "missing 'input HEIGHT WIDTH CHANNELS' line");
}

int dt_model_spec_parse(dt_model_spec *spec, const char *text, size_t len, const char *source,
                        dt_error *err) {
    memset(spec, 0, sizeof *spec);
    if (!source) source = "<model>";
    snprintf(spec->source, sizeof spec->source, "%s", source);
    if (len > DT_MODEL_MAX_TEXT)
        return dt_errorf(err, DT_EFORMAT, "%s: model file is %zu bytes, more than the limit of %zu",
                         source, len, DT_MODEL_MAX_TEXT);
    spec->text = dt_malloc(len + 1, "model text", err);
    if (!spec->text) return DT_ENOMEM;
    if (len) memcpy(spec->text, text, len);
    spec->text[len] = 0;
    spec->text_len = len;
    parser ps = {.spec = spec, .c = {spec->source, 0, err}};
    char *work = dt_malloc(len + 1, "model text", err);
    int rc = work ? DT_OK : DT_ENOMEM;
    if (work) memcpy(work, spec->text, len + 1);
    if (!rc) rc = parse_lines(&ps, work, len);
    if (!rc && !ps.have_model) default_name(spec->name, sizeof spec->name, source);
    if (!rc) rc = resolve_inputs(spec, ps.refs, err);
    if (!rc) rc = dt_model_spec_shapes(spec, NULL, NULL, err);
    free(ps.refs);
    free(work);
    if (rc) dt_model_spec_free(spec);
    return rc;
}

int dt_model_spec_load(dt_model_spec *spec, const char *path, dt_error *err) {
    memset(spec, 0, sizeof *spec);
    /* Whole, through the one reader that refuses a FIFO or device (which would hang) and a file
     * over the limit before reading it; one byte over so the parser names the limit as before. */
    uint8_t *buf = NULL;
    size_t n = 0;
    int rc = dt_read_file(&buf, &n, path, DT_MODEL_MAX_TEXT + 1, err);
    if (rc) {
        dt_error_wrap(err, rc, "model file: ");
        return rc;
    }
    rc = dt_model_spec_parse(spec, (const char *)buf, n, path, err); /* rejects n > DT_MODEL_MAX_TEXT */
    free(buf);
    return rc;
}

void dt_model_spec_free(dt_model_spec *spec) {
    if (!spec) return;
    free(spec->layers);
    free(spec->text);
    spec->layers = NULL;
    spec->text = NULL;
    spec->n_layers = 0;
    spec->text_len = 0;
}

int dt_model_spec_copy(dt_model_spec *dst, const dt_model_spec *src, dt_error *err) {
    *dst = *src;
    dst->layers = NULL;
    dst->text = NULL;
    if (src->n_layers > 0) {
        dst->layers = dt_calloc((size_t)src->n_layers, sizeof *dst->layers, "model layers", err);
        if (!dst->layers) return DT_ENOMEM;
        memcpy(dst->layers, src->layers, sizeof *dst->layers * (size_t)src->n_layers);
    }
    if (src->text) {
        dst->text = dt_malloc(src->text_len + 1, "model text", err);
        if (!dst->text) {
            free(dst->layers);
            dst->layers = NULL;
            return DT_ENOMEM;
        }
        memcpy(dst->text, src->text, src->text_len);
        dst->text[src->text_len] = 0;
    }
    return 0;
}

/* ---- shapes ---- */

static int in_range(int v) { return v >= 1 && v <= DT_MODEL_MAX_DIM; }

/* a * b, saturating at SIZE_MAX */
static size_t mul_sat(size_t a, size_t b) {
    size_t r;
    return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}

static int check_init(const ctx *c, const dt_init *in, const char *what) {
    int ok = 0;
    switch (in->kind) {
    case DT_INIT_TRUNC_NORMAL: ok = in->value > 0 && in->value <= 1e3f; break;
    case DT_INIT_CONSTANT: ok = fabsf(in->value) <= 1e6f; break;
    case DT_INIT_GLOROT_UNIFORM:
    case DT_INIT_HE_UNIFORM: ok = 1; break;
    }
    return ok ? 0 : FAIL(c, DT_EINVAL, "bad %s", what);
}

/* One layer's output as the walk sees it. */
typedef struct {
    int h, w, c, flat, flat_line;
} out_shape;

static const char *input_name(const dt_model_spec *spec, int j) { return j < 0 ? "input" : spec->layers[j].name; }

/* The walk over the layers: each one's output, and how many read it. */
typedef struct {
    const dt_model_spec *spec;
    ctx c;
    out_shape model_in, outs[DT_MODEL_MAX_LAYERS];
    int consumers[DT_MODEL_MAX_LAYERS];
} shape_walk;

/* Layer i's inputs: earlier layers only (a spec built in code is checked as strictly as a file). */
static int check_inputs(shape_walk *sw, int i) {
    const dt_layer_spec *L = &sw->spec->layers[i];
    const char *kn = dt_layer_kind_name(L->kind);
    int n_in = dt_layer_n_inputs(L), multi = L->kind == DT_LAYER_ADD || L->kind == DT_LAYER_CONCAT;
    if (n_in > DT_LAYER_MAX_INPUTS || (multi ? n_in < 2 : n_in != 1))
        return FAIL(&sw->c, DT_EINVAL, "%s: %d inputs", kn, n_in);
    for (int k = 0; k < n_in; k++) {
        int j = dt_layer_input(L, i, k);
        if (j < -1 || j >= i) return FAIL(&sw->c, DT_EINVAL, "%s: input %d is not a layer above this one", kn, j);
        if (j >= 0) sw->consumers[j]++;
    }
    return 0;
}

static const out_shape *input_shape(const shape_walk *sw, int j) { return j < 0 ? &sw->model_in : &sw->outs[j]; }

/* conv2d, maxpool, avgpool: a window over [H,W,C]. */
static int window_shape(shape_walk *sw, const dt_layer_spec *L, dt_layer_shape *s, out_shape *o) {
    const ctx *c = &sw->c;
    const char *kn = dt_layer_kind_name(L->kind);
    int conv = L->kind == DT_LAYER_CONV2D;
    if (o->flat && sw->spec->ctr && !o->flat_line)
        return FAIL(c, DT_ESHAPE, "%s needs an [H,W,C] input, but a click-log model's input is flat (its dense "
                    "features)", kn);
    if (o->flat)
        return FAIL(c, DT_ESHAPE, "%s needs an [H,W,C] input, but its input was flattened at line %d", kn,
                    o->flat_line);
    if (!in_range(L->k_h) || !in_range(L->k_w) || !in_range(L->stride_h) || !in_range(L->stride_w) ||
        (conv && !in_range(L->filters)) || (L->padding != DT_PAD_SAME && L->padding != DT_PAD_VALID))
        return FAIL(c, DT_EINVAL, "%s: sizes must be from 1 to %d", kn, DT_MODEL_MAX_DIM);
    int oc = conv ? L->filters : o->c;
    dt_error werr;
    if (dt_window_init(&s->win, o->h, o->w, o->c, oc, L->k_h, L->k_w, L->stride_h, L->stride_w, L->padding, &werr))
        return FAIL(c, DT_ESHAPE, "%s: %s", kn, werr.msg);
    o->h = s->win.out_h, o->w = s->win.out_w, o->c = oc;
    if (!conv) return 0;
    size_t patch = mul_sat(mul_sat(mul_sat((size_t)o->h, (size_t)o->w), mul_sat((size_t)L->k_h, (size_t)L->k_w)),
                           (size_t)s->in_c);
    if (patch > DT_MODEL_MAX_PATCH)
        return FAIL(c, DT_ESHAPE, "conv2d: %dx%d kernel over a %dx%dx%d input is too large (more than %zu patch "
                    "values per example)", L->k_h, L->k_w, s->in_h, s->in_w, s->in_c, DT_MODEL_MAX_PATCH);
    s->n_weights = mul_sat(mul_sat((size_t)L->k_h, (size_t)L->k_w), mul_sat((size_t)s->in_c, (size_t)oc));
    s->n_bias = L->use_bias ? (size_t)oc : 0;
    return 0;
}

/* add (inputs of one shape) and concat (of one height and width: channels joined). */
static int sum_shape(shape_walk *sw, int i, out_shape *o) {
    const dt_layer_spec *L = &sw->spec->layers[i];
    int add = L->kind == DT_LAYER_ADD, j0 = dt_layer_input(L, i, 0);
    size_t sum_c = (size_t)o->c;
    for (int k = 1; k < dt_layer_n_inputs(L); k++) {
        int j = dt_layer_input(L, i, k);
        const out_shape *x = input_shape(sw, j);
        if (add ? (x->h != o->h || x->w != o->w || x->c != o->c || x->flat != o->flat)
                : (x->h != o->h || x->w != o->w || x->flat != o->flat))
            return FAIL(&sw->c, DT_ESHAPE, "%s: input '%s' is [%d,%d,%d]%s but '%s' is [%d,%d,%d]%s%s",
                        dt_layer_kind_name(L->kind), input_name(sw->spec, j0), o->h, o->w, o->c,
                        o->flat ? " (flat)" : "", input_name(sw->spec, j), x->h, x->w, x->c, x->flat ? " (flat)" : "",
                        add ? ": add sums inputs of one shape" : ": concat joins channels of inputs of one height and width");
        sum_c += (size_t)x->c;
    }
    if (mul_sat(mul_sat((size_t)o->h, (size_t)o->w), sum_c) > DT_MODEL_MAX_ACT)
        return FAIL(&sw->c, DT_ESHAPE, "concat output has more than %zu values per example", DT_MODEL_MAX_ACT);
    if (!add) o->c = (int)sum_c;
    return 0;
}

/* embedding: [n_fields * dim] of the click log's fields; fm: one value from an embedding's vectors;
 * reduce_sum: one value from a flat input. */
static int tabular_shape(shape_walk *sw, int i, dt_layer_shape *s, out_shape *o) {
    const dt_model_spec *spec = sw->spec;
    const dt_layer_spec *L = &spec->layers[i];
    const ctx *c = &sw->c;
    const char *kn = dt_layer_kind_name(L->kind);
    if (L->kind == DT_LAYER_EMBEDDING) {
        if (!spec->ctr)
            return FAIL(c, DT_ESHAPE, "embedding reads a click log's categorical fields: the model needs an 'input "
                        "dense=N fields=M' line, not an image input");
        const int unbounded = L->buckets == 0;
        if (!in_range(L->dim) || L->buckets < 0 || L->buckets > DT_MODEL_MAX_BUCKETS || L->n_fields < 1 ||
            (unbounded && (L->capacity < 1 || L->capacity > DT_MODEL_MAX_CAPACITY || L->min_count < 0 ||
                           L->min_count > DT_MODEL_MAX_MIN_COUNT || L->evict_after < 0 ||
                           L->evict_after > DT_MODEL_MAX_EVICT_AFTER)) ||
            L->max_ids < 1 || L->max_ids > DT_MODEL_MAX_IDS)
            return FAIL(c, DT_EINVAL, "embedding: dim, buckets, capacity, min_count, evict_after, max_ids or fields out of "
                        "range");
        int n = 0;
        for (int f = 0; f < DT_MODEL_MAX_FIELDS; f++)
            if (dt_layer_has_field(L, f)) {
                if (f >= spec->num_fields)
                    return FAIL(c, DT_ESHAPE, "embedding: field %d, but the input has %d fields (0 to %d)", f,
                                spec->num_fields, spec->num_fields - 1);
                n++;
            }
        if (n != L->n_fields) return FAIL(c, DT_EINVAL, "embedding: n_fields %d but %d fields marked", L->n_fields, n);
        size_t out = mul_sat((size_t)n, (size_t)L->dim);
        if (out > DT_MODEL_MAX_ACT)
            return FAIL(c, DT_ESHAPE, "embedding output (%d fields x dim %d) has more than %zu values per example", n,
                        L->dim, DT_MODEL_MAX_ACT);
        /* unbounded: no rows in the model's own buffer (the ps tasks hold them; a net holds a block) */
        s->n_weights = mul_sat(mul_sat(L->shared ? 1 : (size_t)n, (size_t)L->buckets), (size_t)L->dim);
        o->h = o->w = 1, o->c = (int)out, o->flat = 1, o->flat_line = L->line;
        return 0;
    }
    if (!o->flat)
        return FAIL(c, DT_ESHAPE, "%s needs a flat input but gets [%d,%d,%d]: add a 'flatten' line before it", kn, o->h,
                    o->w, o->c);
    if (L->kind == DT_LAYER_FM) {
        int j = dt_layer_input(L, i, 0);
        if (j < 0 || spec->layers[j].kind != DT_LAYER_EMBEDDING)
            return FAIL(c, DT_ESHAPE, "fm needs an embedding layer as its input (the fields' vectors), got '%s'%s%s",
                        input_name(spec, j), j < 0 ? "" : ", a ", j < 0 ? "" : dt_layer_kind_name(spec->layers[j].kind));
        if (spec->layers[j].n_fields < 2)
            return FAIL(c, DT_ESHAPE, "fm needs at least two fields to pair, '%s' embeds %d", spec->layers[j].name,
                        spec->layers[j].n_fields);
    }
    o->c = 1;
    return 0;
}

/* Layer i's shape from its input 0's output *o, which becomes its own output. */
static int layer_shape(shape_walk *sw, int i, dt_layer_shape *s, out_shape *o) {
    const dt_layer_spec *L = &sw->spec->layers[i];
    const ctx *c = &sw->c;
    switch (L->kind) {
    case DT_LAYER_CONV2D:
    case DT_LAYER_MAXPOOL:
    case DT_LAYER_AVGPOOL: return window_shape(sw, L, s, o);
    case DT_LAYER_RELU:
    case DT_LAYER_SIGMOID:
    case DT_LAYER_TANH: return 0;
    case DT_LAYER_LEAKY_RELU:
        if (!(L->alpha >= 0 && L->alpha < 1))
            return FAIL(c, DT_EINVAL, "leaky_relu alpha %g is not in [0, 1)", (double)L->alpha);
        return 0;
    case DT_LAYER_DROPOUT:
        if (!(L->rate >= 0 && L->rate < 1))
            return FAIL(c, DT_EINVAL, "dropout rate %g is not in [0, 1)", (double)L->rate);
        return 0;
    case DT_LAYER_BATCHNORM:
        if (!(L->momentum >= 0 && L->momentum < 1) || !(L->epsilon >= 1e-12f && L->epsilon <= 1))
            return FAIL(c, DT_EINVAL, "batchnorm momentum %g or epsilon %g out of range", (double)L->momentum,
                        (double)L->epsilon);
        s->n_bn = (size_t)o->c; /* per channel, or per feature of a flat input */
        return 0;
    case DT_LAYER_GLOBAL_AVGPOOL:
        if (o->flat)
            return FAIL(c, DT_ESHAPE, "global_avgpool needs an [H,W,C] input, but its input was flattened at line %d",
                        o->flat_line);
        o->h = o->w = 1, o->flat = 1, o->flat_line = L->line;
        return 0;
    case DT_LAYER_ADD:
    case DT_LAYER_CONCAT: return sum_shape(sw, i, o);
    case DT_LAYER_EMBEDDING:
    case DT_LAYER_FM:
    case DT_LAYER_REDUCE_SUM: return tabular_shape(sw, i, s, o);
    case DT_LAYER_FLATTEN:
        if (!o->flat) /* bounded by DT_MODEL_MAX_ACT, fits an int */
            o->c = o->h * o->w * o->c, o->h = o->w = 1, o->flat = 1, o->flat_line = L->line;
        return 0;
    case DT_LAYER_DENSE:
        if (!o->flat)
            return FAIL(c, DT_ESHAPE, "dense needs a flat input but gets [%d,%d,%d]: add a 'flatten' line before it",
                        o->h, o->w, o->c);
        if (!in_range(L->units)) return FAIL(c, DT_EINVAL, "dense: units must be from 1 to %d", DT_MODEL_MAX_DIM);
        s->n_weights = mul_sat((size_t)o->c, (size_t)L->units);
        s->n_bias = L->use_bias ? (size_t)L->units : 0;
        o->c = L->units;
        return 0;
    }
    return FAIL(c, DT_EINVAL, "unknown layer kind %d", (int)L->kind);
}

/* Layer i checked and shaped, its parameters counted into *total. */
static int walk_layer(shape_walk *sw, int i, dt_layer_shape *s, size_t *total) {
    const dt_layer_spec *L = &sw->spec->layers[i];
    const char *kn = dt_layer_kind_name(L->kind);
    sw->c.line = L->line;
    int rc = check_inputs(sw, i);
    if (rc) return rc;
    for (int k = 0; sw->spec->ctr && L->kind != DT_LAYER_EMBEDDING && k < dt_layer_n_inputs(L); k++)
        if (dt_layer_input(L, i, k) < 0 && sw->spec->num_dense == 0)
            return FAIL(&sw->c, DT_ESHAPE, "%s reads 'input', the dense features, but this click-log model has none "
                        "(dense=0)", kn);
    out_shape o = *input_shape(sw, dt_layer_input(L, i, 0));
    memset(s, 0, sizeof *s);
    s->in_h = o.h, s->in_w = o.w, s->in_c = o.c;
    if ((rc = layer_shape(sw, i, s, &o))) return rc;
    if (s->n_weights || s->n_bias) {
        if ((rc = check_init(&sw->c, &L->weight_init, "weight_init"))) return rc;
        if (L->use_bias && (rc = check_init(&sw->c, &L->bias_init, "bias_init"))) return rc;
    }
    s->out_h = o.h, s->out_w = o.w, s->out_c = o.c, s->flat = o.flat;
    sw->outs[i] = o;
    if (mul_sat(mul_sat((size_t)o.h, (size_t)o.w), (size_t)o.c) > DT_MODEL_MAX_ACT)
        return FAIL(&sw->c, DT_ESHAPE, "%s output %dx%dx%d has more than %zu values per example", kn, o.h, o.w, o.c,
                    DT_MODEL_MAX_ACT);
    *total += s->n_weights > DT_MODEL_MAX_PARAMS ? DT_MODEL_MAX_PARAMS + 1 : s->n_weights;
    *total += s->n_bias + 4 * s->n_bn;
    if (*total > DT_MODEL_MAX_PARAMS)
        return FAIL(&sw->c, DT_ESHAPE, "too many parameters: more than %zu by this %s layer", DT_MODEL_MAX_PARAMS, kn);
    return 0;
}

/* Every output but the last feeds some layer (an unused branch is almost always a typo), and the
 * last is a dense layer of at least two classes. */
static int check_graph_ends(shape_walk *sw) {
    const dt_model_spec *spec = sw->spec;
    for (int i = 0; i + 1 < spec->n_layers; i++)
        if (!sw->consumers[i]) {
            sw->c.line = spec->layers[i].line;
            return FAIL(&sw->c, DT_ESHAPE, "the output of '%s' is never used: no layer takes it as input",
                        spec->layers[i].name);
        }
    const dt_layer_spec *last = &spec->layers[spec->n_layers - 1];
    const out_shape *lo = &sw->outs[spec->n_layers - 1];
    sw->c.line = last->line;
    if (spec->ctr && lo->flat && lo->c == 1) return 0; /* one logit: a binary model (sigmoid and logloss) */
    if (spec->ctr)
        return FAIL(&sw->c, DT_ESHAPE, "a click-log model ends in one logit (the click's log-odds: dense units=1, fm, "
                    "reduce_sum, or an add of those), not %s with %d outputs", dt_layer_kind_name(last->kind),
                    lo->h * lo->w * lo->c);
    if (last->kind != DT_LAYER_DENSE)
        return FAIL(&sw->c, DT_ESHAPE,
                    "the model must end with a dense layer whose units are the classes, not %s "
                    "(softmax cross-entropy is applied to its output)",
                    dt_layer_kind_name(last->kind));
    if (last->units < 2)
        return FAIL(&sw->c, DT_ESHAPE, "the last dense layer gives the classes: it needs units >= 2, got %d",
                    last->units);
    return 0;
}

int dt_model_spec_shapes(const dt_model_spec *spec, dt_layer_shape *shapes, size_t *param_count,
                         dt_error *err) {
    ctx c = {spec->source[0] ? spec->source : spec->name, spec->input_line > 0 ? spec->input_line : 1, err};
    if (spec->ctr && (spec->in_h != 1 || spec->in_w != 1 || spec->in_c != spec->num_dense || spec->num_dense < 0 ||
                      spec->num_dense > DT_MODEL_MAX_DIM || spec->num_fields < 1 ||
                      spec->num_fields > DT_MODEL_MAX_FIELDS))
        return FAIL(&c, DT_EINVAL, "click-log input: dense=%d fields=%d out of range (dense 0 to %d, fields 1 to %d)",
                    spec->num_dense, spec->num_fields, DT_MODEL_MAX_DIM, DT_MODEL_MAX_FIELDS);
    if (!in_range(spec->in_h) || !in_range(spec->in_w) || (!in_range(spec->in_c) && !(spec->ctr && !spec->in_c)))
        return FAIL(&c, DT_EINVAL, "input %dx%dx%d: each size must be from 1 to %d", spec->in_h,
                    spec->in_w, spec->in_c, DT_MODEL_MAX_DIM);
    if (spec->n_layers <= 0 || !spec->layers)
        return FAIL(&c, DT_ESHAPE, "no layers: a model ends with a dense layer whose units are the classes");
    if (spec->n_layers > DT_MODEL_MAX_LAYERS)
        return FAIL(&c, DT_EINVAL, "too many layers (at most %d)", DT_MODEL_MAX_LAYERS);
    if (mul_sat(mul_sat((size_t)spec->in_h, (size_t)spec->in_w), (size_t)spec->in_c) > DT_MODEL_MAX_ACT)
        return FAIL(&c, DT_ESHAPE, "input %dx%dx%d has more than %zu values per example", spec->in_h, spec->in_w,
                    spec->in_c, DT_MODEL_MAX_ACT);
    shape_walk walk, *sw = &walk;
    memset(sw->consumers, 0, sizeof sw->consumers);
    sw->spec = spec, sw->c = c, sw->model_in = (out_shape){spec->in_h, spec->in_w, spec->in_c, spec->ctr, 0};
    size_t total = 0;
    int rc = 0;
    for (int i = 0; !rc && i < spec->n_layers; i++) {
        dt_layer_shape s;
        rc = walk_layer(sw, i, &s, &total);
        if (!rc && shapes) shapes[i] = s;
    }
    if (!rc) rc = check_graph_ends(sw);
    if (!rc && param_count) *param_count = total;
    return rc;
}
