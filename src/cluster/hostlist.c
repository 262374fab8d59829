#include "cluster/hostlist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

enum {
    MAX_GROUPS = 8,  /* bracket groups in one host: bounds the expansion's recursion */
    MAX_DIGITS = 9,  /* a range bound below 10^9: no overflow, and wider than any real node name */
};

static int is_blank(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; }

static int is_name_char(char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
           ch == '-' || ch == '_';
}

static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }

/* What every refusal starts with: the variable and its value, quoted. */
#define BAD(fmt, ...)                                                                                           \
    dt_errorf(p->err, DT_EINVAL, "%s: %s: " fmt, p->field, dt_text_quote((char[80]){0}, p->all, p->all_len),   \
              __VA_ARGS__)

typedef struct {
    const char *all;  /* the whole value, for messages */
    size_t all_len;
    const char *field;
    dt_error *err;
    dt_hostlist *out; /* NULL: count only */
    int max;
    long long count;  /* hosts so far (counting pass) */
} parser;

/* One number of a range at s[*i]: at most MAX_DIGITS digits. */
static int number(parser *p, const char *s, size_t len, size_t *i, long *value, int *width) {
    size_t start = *i;
    long v = 0;
    while (*i < len && is_digit(s[*i])) {
        if (*i - start == MAX_DIGITS) return BAD("a number in brackets has more than %d digits", MAX_DIGITS);
        v = v * 10 + (s[*i] - '0');
        (*i)++;
    }
    if (*i == start) return BAD("expected a number in brackets at offset %zu", (size_t)(s + start - p->all));
    *value = v;
    *width = (int)(*i - start);
    return 0;
}

/* The ranges of the bracket group s[0..len) (without brackets), each [lo, hi] with lo's width.
 * Calls back once per value, in order; counts when cb is NULL. */
typedef int (*value_fn)(parser *p, long value, int width, void *ctx);

static int each_value(parser *p, const char *s, size_t len, long long *n_values, value_fn cb, void *ctx) {
    size_t i = 0;
    *n_values = 0;
    if (len == 0) return BAD("%s", "empty brackets");
    for (;;) {
        long lo, hi;
        int width, hi_width, rc;
        if ((rc = number(p, s, len, &i, &lo, &width))) return rc;
        hi = lo;
        if (i < len && s[i] == '-') {
            i++;
            if ((rc = number(p, s, len, &i, &hi, &hi_width))) return rc;
            if (hi < lo) return BAD("range %ld-%ld goes down", lo, hi);
        }
        *n_values += hi - lo + 1;
        if (*n_values > p->max) return BAD("more than %d hosts", p->max);
        for (long v = lo; cb && v <= hi; v++)
            if ((rc = cb(p, v, width, ctx))) return rc;
        if (i == len) return 0;
        if (s[i] != ',') return BAD("bad character '%c' in brackets", (s[i] >= 32 && s[i] < 127) ? s[i] : '?');
        i++;
    }
}

/* Expansion of one host entry: the text still to expand, and the name built so far. */
typedef struct {
    const char *rest;
    size_t rest_len;
    char name[DT_HOST_MAX];
    size_t name_len;
} expansion;

static int expand(parser *p, expansion *e);

static int with_value(parser *p, long value, int width, void *ctx) {
    expansion *e = ctx, next = *e;
    int w = snprintf(next.name + next.name_len, sizeof next.name - next.name_len, "%0*ld", width, value);
    if (w < 0 || (size_t)w >= sizeof next.name - next.name_len)
        return BAD("a host name is longer than %d characters", DT_HOST_MAX - 1);
    next.name_len += (size_t)w;
    return expand(p, &next);
}

/* Appends literal characters up to the next '[', then each value of that group (recursively); at
 * the end of the entry, one host. Text was checked by the counting pass. */
static int expand(parser *p, expansion *e) {
    size_t i = 0;
    while (i < e->rest_len && e->rest[i] != '[') {
        if (e->name_len + 1 >= DT_HOST_MAX) return BAD("a host name is longer than %d characters", DT_HOST_MAX - 1);
        e->name[e->name_len++] = e->rest[i++];
    }
    if (i == e->rest_len) {
        dt_hostlist *l = p->out;
        memcpy(l->host[l->n], e->name, e->name_len);
        l->host[l->n][e->name_len] = '\0';
        l->n++;
        return 0;
    }
    const char *close = memchr(e->rest + i, ']', e->rest_len - i);
    expansion next = *e;
    next.rest = close + 1;
    next.rest_len = e->rest_len - (size_t)(close + 1 - e->rest);
    long long n;
    return each_value(p, e->rest + i + 1, (size_t)(close - e->rest - i - 1), &n, with_value, &next);
}

/* Checks one entry (no top-level comma) and adds its number of hosts to p->count. */
static int count_entry(parser *p, const char *s, size_t len) {
    long long hosts = 1;
    int groups = 0;
    if (len == 0) return BAD("%s", "empty host");
    for (size_t i = 0; i < len;) {
        if (s[i] == '[') {
            const char *close = memchr(s + i, ']', len - i);
            if (!close) return BAD("%s", "missing ']'");
            if (++groups > MAX_GROUPS) return BAD("more than %d bracket groups in one host", MAX_GROUPS);
            long long n;
            int rc = each_value(p, s + i + 1, (size_t)(close - s - i - 1), &n, NULL, NULL);
            if (rc) return rc;
            hosts *= n; /* both factors <= max, so no overflow */
            if (hosts > p->max) return BAD("more than %d hosts", p->max);
            i = (size_t)(close - s) + 1;
        } else if (s[i] == ']') {
            return BAD("%s", "']' without '['");
        } else if (!is_name_char(s[i])) {
            return BAD("bad character '%c' in a host name", (s[i] >= 32 && s[i] < 127) ? s[i] : '?');
        } else {
            i++;
        }
    }
    p->count += hosts;
    if (p->count > p->max) return BAD("more than %d hosts", p->max);
    return 0;
}

/* Calls count_entry (out NULL) or expand on each top-level entry: commas inside brackets separate
 * ranges, not hosts. */
static int each_entry(parser *p, const char *s, size_t len) {
    size_t start = 0;
    int depth = 0, rc;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && s[i] == '[') depth++;
        if (i < len && s[i] == ']' && depth > 0) depth--;
        if (i < len && (s[i] != ',' || depth > 0)) continue;
        if (!p->out) {
            rc = count_entry(p, s + start, i - start);
        } else {
            expansion e = {.rest = s + start, .rest_len = i - start};
            rc = expand(p, &e);
        }
        if (rc) return rc;
        start = i + 1;
    }
    return 0;
}

int dt_hostlist_parse(dt_hostlist *l, const char *text, size_t len, int max, const char *field, dt_error *err) {
    memset(l, 0, sizeof *l);
    if (max < 1 || max > DT_HOSTLIST_MAX) max = DT_HOSTLIST_MAX;
    parser p = {.all = text, .all_len = len, .field = field, .err = err, .max = max};
    while (len && is_blank(*text)) text++, len--;
    while (len && is_blank(text[len - 1])) len--;
    if (len == 0) return dt_errorf(err, DT_EINVAL, "%s: empty host list", field);
    int rc = each_entry(&p, text, len);
    if (rc) return rc;
    l->host = dt_calloc((size_t)p.count, sizeof *l->host, "the host list", err);
    if (!l->host) return DT_ENOMEM;
    p.out = l;
    if ((rc = each_entry(&p, text, len))) dt_hostlist_free(l);
    return rc;
}

void dt_hostlist_free(dt_hostlist *l) {
    if (!l) return;
    free(l->host);
    l->host = NULL;
    l->n = 0;
}

/* ---- tasks per node ---- */

/* A count at s[*i] in 1..limit. */
static int count_at(const char *s, size_t len, size_t *i, long limit, long *out) {
    size_t start = *i;
    long v = 0;
    while (*i < len && is_digit(s[*i])) {
        if (*i - start == MAX_DIGITS) return -1;
        v = v * 10 + (s[(*i)++] - '0');
    }
    if (*i == start || v < 1 || v > limit) return -1;
    *out = v;
    return 0;
}

int dt_tasks_per_node_parse(int **counts, int *n, const char *text, size_t len, int max, const char *field,
                            dt_error *err) {
    char q[80];
    *counts = NULL;
    *n = 0;
    if (max < 1 || max > DT_HOSTLIST_MAX) max = DT_HOSTLIST_MAX;
    dt_text_quote(q, text, len);
    while (len && is_blank(*text)) text++, len--;
    while (len && is_blank(text[len - 1])) len--;
    if (len == 0) return dt_errorf(err, DT_EINVAL, "%s: empty list", field);
    int *out = dt_calloc((size_t)max, sizeof *out, "the tasks per node", err);
    if (!out) return DT_ENOMEM;
    int used = 0;
    size_t i = 0;
    for (;;) {
        long tasks, repeat = 1;
        if (count_at(text, len, &i, 2 * DT_CLUSTER_MAX_TASKS, &tasks)) goto bad;
        if (i < len && text[i] == '(') { /* "N(xM)": M nodes of N tasks */
            i++;
            if (i >= len || text[i++] != 'x' || count_at(text, len, &i, 999999999, &repeat) || i >= len ||
                text[i++] != ')')
                goto bad;
        }
        if (repeat > max - used) {
            free(out);
            return dt_errorf(err, DT_EINVAL, "%s: %s: more than %d nodes", field, q, max);
        }
        for (long r = 0; r < repeat; r++) out[used++] = (int)tasks;
        if (i == len) break;
        if (text[i++] != ',' || i == len) goto bad;
    }
    *counts = out;
    *n = used;
    return 0;
bad:
    free(out);
    return dt_errorf(err, DT_EINVAL, "%s: %s: not a tasks-per-node list (expected N or N(xM), comma-separated, "
                     "N in 1..%d; e.g. 2(x3),1)", field, q, 2 * DT_CLUSTER_MAX_TASKS);
}
