/* Click-log lines into batches: Criteo TSV and libffm parsing, the integer transform, the id hash
 * and the split rule (ctr.h; docs/ctr-data.md). The Criteo path is the hot one (over a million
 * lines a second per core, BENCHMARKS.md): one pass over the bytes, no allocation per line. */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "data/ctr.h"

struct dt_ctr_builder {
    dt_ctr_format format;
    int num_dense, fields, cap, n;
    float *labels, *dense;
    int64_t *offsets;          /* [cap * fields + 1] */
    int64_t *lines;
    uint64_t *ids;
    float *values;
    size_t nnz, nnz_cap;
    /* libffm: one line's tokens before they are grouped by field */
    uint32_t *tok_field;
    uint64_t *tok_id;
    float *tok_value;
    size_t tok_cap;
};

/* ---- small helpers ---------------------------------------------------------------------------- */

/* Up to 24 bytes of s[0..len) for a message: printable ASCII as is, other bytes as \xNN, "..." when
 * cut, so a message stays one printable line whatever the file holds. */
static void quote(char *out, size_t cap, const char *s, size_t len) {
    size_t o = 0;
    for (size_t i = 0; i < len && i < 24 && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\'') out[o++] = (char)c;
        else o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    }
    if (len > 24 && o + 4 < cap) memcpy(out + o, "...", 3), o += 3;
    out[o < cap ? o : cap - 1] = '\0';
}

static int bad(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(char *why, size_t cap, const char *fmt, ...) {
    if (why && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, cap, fmt, ap);
        va_end(ap);
    }
    return DT_EFORMAT;
}

/* A hex digit's value + 1, 0 for any other byte: a lookup, not a branch, because ids' digits and
 * letters alternate at random and a branch on them is mispredicted about every other byte. */
static const uint8_t hex1[256] = {
    ['0'] = 1,  ['1'] = 2,  ['2'] = 3,  ['3'] = 4,  ['4'] = 5,  ['5'] = 6,  ['6'] = 7,  ['7'] = 8,
    ['8'] = 9,  ['9'] = 10, ['a'] = 11, ['b'] = 12, ['c'] = 13, ['d'] = 14, ['e'] = 15, ['f'] = 16,
    ['A'] = 11, ['B'] = 12, ['C'] = 13, ['D'] = 14, ['E'] = 15, ['F'] = 16,
};

static int hex_digit(unsigned char c) { return hex1[c] - 1; }

/* Criteo's usual column: exactly 8 hex digits, then a tab or the end of the line. 1 and *v if so. */
static int hex8(const char *p, const char *end, uint64_t *v) {
    if (end - p < 8 || (end - p > 8 && p[8] != '\t')) return 0;
    uint32_t x = 0;
    unsigned miss = 0;
    for (int i = 0; i < 8; i++) {
        unsigned d = hex1[(unsigned char)p[i]];
        miss |= d == 0;
        x = x << 4 | (d - 1);
    }
    if (miss) return 0;
    *v = x;
    return 1;
}

/* log1p of the small integers most columns hold, computed once: a fifth of the time of a line went
 * to log1p. Entry x is exactly what log1p gives, so the table changes no value. */
#define LOG1P_TABLE 4096
static float log1p_table[LOG1P_TABLE];
static pthread_once_t log1p_once = PTHREAD_ONCE_INIT;

static void log1p_fill(void) {
    for (int x = 0; x < LOG1P_TABLE; x++) log1p_table[x] = (float)log1p((double)x);
}

float dt_ctr_dense_value(int64_t x) {
    if (x <= 0) return 0.0f;
    if (x < LOG1P_TABLE) {
        pthread_once(&log1p_once, log1p_fill);
        return log1p_table[x];
    }
    return (float)log1p((double)x);
}

dt_ctr_split dt_ctr_line_split(int64_t line_no, double validation_fraction, double test_fraction) {
    double u = (double)(dt_ctr_mix64((uint64_t)line_no ^ 0x43545253504c4954ULL) >> 11) * 0x1p-53;
    if (u < test_fraction) return DT_CTR_TEST;
    if (u < test_fraction + validation_fraction) return DT_CTR_VALIDATION;
    return DT_CTR_TRAIN;
}

/* ---- the builder ------------------------------------------------------------------------------ */

static int create(dt_ctr_builder **out, dt_ctr_format format, int num_dense, int fields, int capacity, dt_error *err);

int dt_ctr_builder_create(dt_ctr_builder **out, dt_ctr_format format, int fields, int capacity, dt_error *err) {
    *out = NULL;
    if (format != DT_CTR_CRITEO && format != DT_CTR_LIBFFM)
        return dt_errorf(err, DT_EINVAL, "click-log batch: unknown format %d", (int)format);
    if (format == DT_CTR_CRITEO) fields = DT_CRITEO_FIELDS;
    if (fields < 1 || fields > DT_CTR_MAX_FIELDS)
        return dt_errorf(err, DT_EINVAL, "libffm: %d fields, expected 1 to %d", fields, DT_CTR_MAX_FIELDS);
    return create(out, format, format == DT_CTR_CRITEO ? DT_CRITEO_DENSE : 0, fields, capacity, err);
}

int dt_ctr_builder_create_memory(dt_ctr_builder **out, const dt_ctr_memory *m, int capacity, dt_error *err) {
    *out = NULL;
    if (m->num_fields < 1 || m->num_fields > DT_CTR_MAX_FIELDS || m->num_dense < 0 || m->num_dense > DT_CTR_MAX_FIELDS)
        return dt_errorf(err, DT_EINVAL, "click arrays: %d dense features and %d fields, expected 0 to %d and 1 to %d",
                         m->num_dense, m->num_fields, DT_CTR_MAX_FIELDS, DT_CTR_MAX_FIELDS);
    return create(out, DT_CTR_MEMORY, m->num_dense, m->num_fields, capacity, err);
}

static int create(dt_ctr_builder **out, dt_ctr_format format, int num_dense, int fields, int capacity, dt_error *err) {
    if (capacity < 1 || (int64_t)capacity * fields > DT_CTR_MAX_OFFSETS)
        return dt_errorf(err, DT_EINVAL, "click-log batch: %d rows of %d fields, expected 1 to %lld rows x fields",
                         capacity, fields, (long long)DT_CTR_MAX_OFFSETS);
    dt_ctr_builder *b = dt_calloc(1, sizeof *b, "click-log batch", err);
    if (!b) return DT_ENOMEM;
    b->format = format, b->fields = fields, b->cap = capacity;
    b->num_dense = num_dense;
    b->nnz_cap = format == DT_CTR_LIBFFM ? (size_t)capacity * 4 : (size_t)capacity * (size_t)fields;
    int ok = (b->labels = dt_malloc((size_t)capacity * sizeof *b->labels, "click-log labels", err)) &&
             (b->dense = dt_malloc(((size_t)capacity * b->num_dense + 1) * sizeof *b->dense, "dense features", err)) &&
             (b->offsets = dt_malloc(((size_t)capacity * fields + 1) * sizeof *b->offsets, "id offsets", err)) &&
             (b->lines = dt_malloc((size_t)capacity * sizeof *b->lines, "line numbers", err)) &&
             (b->ids = dt_malloc(b->nnz_cap * sizeof *b->ids, "categorical ids", err)) &&
             (b->values = dt_malloc(b->nnz_cap * sizeof *b->values, "categorical values", err));
    if (!ok) {
        dt_ctr_builder_free(b);
        return DT_ENOMEM;
    }
    b->offsets[0] = 0;
    *out = b;
    return 0;
}

void dt_ctr_builder_free(dt_ctr_builder *b) {
    if (!b) return;
    free(b->labels);
    free(b->dense);
    free(b->offsets);
    free(b->lines);
    free(b->ids);
    free(b->values);
    free(b->tok_field);
    free(b->tok_id);
    free(b->tok_value);
    free(b);
}

int dt_ctr_builder_rows(const dt_ctr_builder *b) { return b->n; }

void dt_ctr_builder_clear(dt_ctr_builder *b) {
    b->n = 0;
    b->nnz = 0;
}

void dt_ctr_builder_batch(const dt_ctr_builder *b, dt_ctr_batch *out) {
    memset(out, 0, sizeof *out);
    out->n = b->n;
    out->num_dense = b->num_dense, out->num_fields = b->fields;
    out->labels = b->labels, out->dense = b->dense, out->offsets = b->offsets;
    out->ids = b->ids, out->values = b->values, out->lines = b->lines;
}

/* ---- Criteo ----------------------------------------------------------------------------------- */

static int criteo_columns(const char *s, size_t len) {
    int k = 1;
    for (size_t i = 0; i < len; i++) k += s[i] == '\t';
    return k;
}

static int criteo_count_error(const char *s, size_t len, char *why, size_t cap) {
    return bad(why, cap, "%d tab-separated columns, expected 40 (label, I1-I13, C1-C26)", criteo_columns(s, len));
}

/* An integer column [p, end-of-column): empty (*missing), or -?[0-9]{1,18}. Returns the byte after. */
static const char *criteo_int(const char *p, const char *end, int64_t *x, int *ok) {
    int neg = p < end && *p == '-';
    const char *q = p + neg, *digits = q;
    int64_t v = 0;
    while (q < end && (unsigned)(*q - '0') < 10u && q - digits < 18) v = v * 10 + (*q++ - '0');
    *ok = (q == end || *q == '\t') && (q > digits || !neg);
    *x = neg ? -v : v;
    return q;
}

static const char *column_end(const char *p, const char *end) {
    const char *t = memchr(p, '\t', (size_t)(end - p));
    return t ? t : end;
}

/* Row b->n from a Criteo line; on failure the batch is unchanged. */
static int parse_criteo(dt_ctr_builder *b, const char *s, size_t len, char *why, size_t cap) {
    const char *p = s, *end = s + len;
    char q[128];
    if (!(len >= 1 && (*p == '0' || *p == '1') && (len == 1 || p[1] == '\t'))) {
        const char *e = column_end(p, end);
        if (e == end && len == 0) return criteo_count_error(s, len, why, cap);
        quote(q, sizeof q, p, (size_t)(e - p));
        return bad(why, cap, "label '%s' is not 0 or 1", q);
    }
    int row = b->n;
    float label = (float)(*p++ - '0');
    float *dense = b->dense + (size_t)row * DT_CRITEO_DENSE;
    for (int j = 0; j < DT_CRITEO_DENSE; j++) {
        if (p == end) return criteo_count_error(s, len, why, cap);
        p++; /* the tab */
        int64_t x;
        int ok;
        const char *e = criteo_int(p, end, &x, &ok);
        if (!ok) {
            e = column_end(p, end);
            quote(q, sizeof q, p, (size_t)(e - p));
            return bad(why, cap, "I%d: '%s' is not an integer of at most 18 digits", j + 1, q);
        }
        dense[j] = dt_ctr_dense_value(x);
        p = e;
    }
    int64_t *off = b->offsets + (size_t)row * DT_CRITEO_FIELDS;
    size_t nnz = b->nnz;
    for (int f = 0; f < DT_CRITEO_FIELDS; f++) {
        if (p == end) return criteo_count_error(s, len, why, cap);
        p++;
        off[f] = (int64_t)nnz;
        const char *c = p;
        uint64_t v = 0;
        int d;
        if (hex8(p, end, &v)) p += 8;
        else
            while (p < end && p - c < 8 && (d = hex_digit((unsigned char)*p)) >= 0) v = v << 4 | (uint64_t)d, p++;
        if (p < end && *p != '\t') {
            const char *e = column_end(c, end);
            quote(q, sizeof q, c, (size_t)(e - c));
            if (p - c == 8 && hex_digit((unsigned char)*p) >= 0)
                return bad(why, cap, "C%d: '%s' has more than 8 hex digits (ids are 32-bit)", f + 1, q);
            return bad(why, cap, "C%d: '%s' is not a hex id", f + 1, q);
        }
        if (p > c) b->ids[nnz] = v, b->values[nnz] = 1.0f, nnz++;
    }
    if (p != end) return criteo_count_error(s, len, why, cap);
    b->labels[row] = label;
    b->nnz = nnz;
    b->offsets[(size_t)(row + 1) * DT_CRITEO_FIELDS] = (int64_t)nnz;
    return 0;
}

/* ---- libffm ----------------------------------------------------------------------------------- */

static int is_space(char c) { return c == ' ' || c == '\t'; }

/* Decimal digits [p, end) as a value < 2^64 and <= max; 0 if empty, too large or not all digits. */
static int decimal_u64(const char *p, const char *end, uint64_t max, uint64_t *out) {
    if (p == end) return 0;
    uint64_t v = 0;
    for (; p < end; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (d > 9 || d > max || v > (max - d) / 10) return 0;
        v = v * 10 + d;
    }
    *out = v;
    return 1;
}

/* A finite decimal number [p, end) that fits a float: [+-](digits[.digits]|.digits)([eE][+-]digits).
 * The grammar is checked here (no hex, inf or nan), the value read by strtod. */
static int decimal_float(const char *p, const char *end, float *out) {
    const char *s = p;
    size_t n = (size_t)(end - p), digits = 0;
    if (n == 0 || n > 64) return 0;
    if (*p == '+' || *p == '-') p++;
    for (; p < end && (unsigned)(*p - '0') < 10u; p++) digits++;
    if (p < end && *p == '.')
        for (p++; p < end && (unsigned)(*p - '0') < 10u; p++) digits++;
    if (!digits) return 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        const char *e = p;
        while (p < end && (unsigned)(*p - '0') < 10u) p++;
        if (p == e) return 0;
    }
    if (p != end) return 0;
    char buf[65];
    memcpy(buf, s, n);
    buf[n] = '\0';
    double v = strtod(buf, NULL);
    if (!(fabs(v) <= FLT_MAX)) return 0;
    *out = (float)v;
    return 1;
}

static int reserve_tokens(dt_ctr_builder *b, size_t need) {
    if (need <= b->tok_cap) return 0;
    size_t cap = b->tok_cap ? b->tok_cap : 64;
    while (cap < need) cap *= 2;
    uint32_t *f = realloc(b->tok_field, cap * sizeof *f);
    if (f) b->tok_field = f;
    uint64_t *i = realloc(b->tok_id, cap * sizeof *i);
    if (i) b->tok_id = i;
    float *v = realloc(b->tok_value, cap * sizeof *v);
    if (v) b->tok_value = v;
    if (!f || !i || !v) return DT_ENOMEM;
    b->tok_cap = cap;
    return 0;
}

static int reserve_ids(dt_ctr_builder *b, size_t need) {
    if (need <= b->nnz_cap) return 0;
    size_t cap = b->nnz_cap;
    while (cap < need) cap *= 2;
    uint64_t *i = realloc(b->ids, cap * sizeof *i);
    if (i) b->ids = i;
    float *v = realloc(b->values, cap * sizeof *v);
    if (v) b->values = v;
    if (!i || !v) return DT_ENOMEM;
    b->nnz_cap = cap;
    return 0;
}

/* One field:id:value token [p, end) into token slot t. */
static int ffm_token(dt_ctr_builder *b, size_t t, const char *p, const char *end, char *why, size_t cap) {
    const char *c1 = memchr(p, ':', (size_t)(end - p));
    const char *c2 = c1 ? memchr(c1 + 1, ':', (size_t)(end - c1 - 1)) : NULL;
    uint64_t field = 0, id = 0;
    int fault = !c2                                                        ? 1
                : !decimal_u64(p, c1, (uint64_t)b->fields - 1, &field)     ? 2
                : !decimal_u64(c1 + 1, c2, UINT64_MAX, &id)                ? 3
                : !decimal_float(c2 + 1, end, &b->tok_value[t])            ? 4
                                                                           : 0;
    if (!fault) {
        b->tok_field[t] = (uint32_t)field, b->tok_id[t] = id;
        return 0;
    }
    char q[128];
    quote(q, sizeof q, p, (size_t)(end - p));
    switch (fault) {
    case 1: return bad(why, cap, "'%s' is not field:id:value", q);
    case 2: return bad(why, cap, "'%s': the field is not a number below %d (the number of fields)", q, b->fields);
    case 3: return bad(why, cap, "'%s': the id is not a decimal number below 2^64", q);
    default: return bad(why, cap, "'%s': the value is not a finite decimal number", q);
    }
}

/* Tokens of one line in slots 0..T), sorted by field keeping the line's order within a field
 * (insertion sort: lines are short and usually sorted already). */
static void sort_tokens(dt_ctr_builder *b, size_t T) {
    for (size_t i = 1; i < T; i++) {
        uint32_t f = b->tok_field[i];
        if (f >= b->tok_field[i - 1]) continue;
        uint64_t id = b->tok_id[i];
        float v = b->tok_value[i];
        size_t j = i;
        for (; j > 0 && b->tok_field[j - 1] > f; j--) {
            b->tok_field[j] = b->tok_field[j - 1], b->tok_id[j] = b->tok_id[j - 1];
            b->tok_value[j] = b->tok_value[j - 1];
        }
        b->tok_field[j] = f, b->tok_id[j] = id, b->tok_value[j] = v;
    }
}

static int ffm_label(const char *p, const char *end, float *label) {
    size_t n = (size_t)(end - p);
    if (n == 1 && (*p == '0' || *p == '1')) return *label = (float)(*p - '0'), 1;
    if (n == 2 && p[1] == '1' && (*p == '-' || *p == '+')) return *label = *p == '+' ? 1.0f : 0.0f, 1;
    return 0;
}

static int parse_ffm(dt_ctr_builder *b, const char *s, size_t len, char *why, size_t cap) {
    const char *p = s, *end = s + len;
    while (p < end && is_space(*p)) p++;
    const char *e = p;
    while (e < end && !is_space(*e)) e++;
    float label;
    if (!ffm_label(p, e, &label)) {
        char q[128];
        quote(q, sizeof q, p, (size_t)(e - p));
        return e == p ? bad(why, cap, "no label") : bad(why, cap, "label '%s' is not 0, 1, -1 or +1", q);
    }
    if (reserve_tokens(b, len / 6 + 1)) return DT_ENOMEM; /* a token and its separator take 6 bytes */
    size_t T = 0;
    for (p = e;;) {
        while (p < end && is_space(*p)) p++;
        if (p == end) break;
        for (e = p; e < end && !is_space(*e);) e++;
        int rc = ffm_token(b, T++, p, e, why, cap);
        if (rc) return rc;
        p = e;
    }
    if (reserve_ids(b, b->nnz + T)) return DT_ENOMEM;
    sort_tokens(b, T);
    int row = b->n, F = b->fields;
    int64_t *off = b->offsets + (size_t)row * F;
    size_t t = 0, nnz = b->nnz;
    for (int f = 0; f < F; f++) {
        off[f] = (int64_t)nnz;
        for (; t < T && b->tok_field[t] == (uint32_t)f; t++) b->ids[nnz] = b->tok_id[t], b->values[nnz++] = b->tok_value[t];
    }
    b->labels[row] = label;
    b->nnz = nnz;
    b->offsets[(size_t)(row + 1) * F] = (int64_t)nnz;
    return 0;
}

int dt_ctr_builder_add(dt_ctr_builder *b, const char *line, size_t len, int64_t line_no, char *why, size_t why_cap,
                       dt_error *err) {
    if (why && why_cap) why[0] = '\0';
    if (b->n >= b->cap) return dt_errorf(err, DT_EINVAL, "click-log batch: full at %d rows", b->cap);
    if (len && line[len - 1] == '\r') len--;
    int rc = b->format == DT_CTR_CRITEO ? parse_criteo(b, line, len, why, why_cap) : parse_ffm(b, line, len, why, why_cap);
    if (rc == DT_ENOMEM) return dt_errorf(err, DT_ENOMEM, "out of memory parsing line %lld", (long long)line_no);
    if (rc) return rc;
    b->lines[b->n++] = line_no;
    return 0;
}

int dt_ctr_builder_add_row(dt_ctr_builder *b, const dt_ctr_memory *m, int64_t row, char *why, size_t why_cap,
                           dt_error *err) {
    if (why && why_cap) why[0] = '\0';
    if (b->n >= b->cap) return dt_errorf(err, DT_EINVAL, "click-log batch: full at %d rows", b->cap);
    if (b->format != DT_CTR_MEMORY || m->num_dense != b->num_dense || m->num_fields != b->fields || row < 0 || row >= m->n)
        return dt_errorf(err, DT_EINVAL, "click arrays: row %lld of %lld, or arrays of another shape than the batch's",
                         (long long)row, (long long)m->n);
    float label = m->labels[row];
    if (label != 0.0f && label != 1.0f) return bad(why, why_cap, "label %g is not 0 or 1", (double)label);
    int F = b->fields, D = b->num_dense;
    const float *dense = D ? m->dense + (size_t)row * (size_t)D : NULL; /* none: dense may be NULL */
    for (int j = 0; j < D; j++)
        if (!isfinite(dense[j])) return bad(why, why_cap, "dense feature %d is %g", j, (double)dense[j]);
    const int64_t *o = m->offsets ? m->offsets + (size_t)row * (size_t)F : NULL;
    int64_t lo = o ? o[0] : row * F, hi = o ? o[F] : lo + F;
    for (int f = 0; o && f < F; f++)
        if (o[f] < 0 || o[f] > o[f + 1] || o[f + 1] > m->nnz)
            return bad(why, why_cap, "field %d's offsets %lld..%lld are not a range of the %lld ids", f, (long long)o[f],
                       (long long)o[f + 1], (long long)m->nnz);
    if (reserve_ids(b, b->nnz + (size_t)(hi - lo))) return dt_errorf(err, DT_ENOMEM, "out of memory for row %lld's ids", (long long)row);
    for (int64_t k = lo; m->values && k < hi; k++)
        if (!isfinite(m->values[k])) return bad(why, why_cap, "value %lld is %g", (long long)k, (double)m->values[k]);
    int64_t *off = b->offsets + (size_t)b->n * (size_t)F;
    size_t nnz = b->nnz;
    for (int f = 0; f < F; f++) off[f] = (int64_t)nnz + ((o ? o[f] : lo + f) - lo);
    memcpy(b->ids + nnz, m->ids + lo, (size_t)(hi - lo) * sizeof *b->ids);
    for (int64_t k = lo; k < hi; k++) b->values[nnz + (size_t)(k - lo)] = m->values ? m->values[k] : 1.0f;
    if (D) memcpy(b->dense + (size_t)b->n * (size_t)D, dense, (size_t)D * sizeof *dense);
    b->nnz = nnz + (size_t)(hi - lo);
    b->labels[b->n] = label;
    b->lines[b->n] = row + 1;
    b->n++;
    b->offsets[(size_t)b->n * (size_t)F] = (int64_t)b->nnz;
    return 0;
}
