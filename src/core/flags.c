#include "core/flags.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/text.h"

static int is_numeric(flag_type t) { return t != FLAG_STRING && t != FLAG_BOOL; }

/* The range as text: "1..65536" for integers, "(0, 86400]" for reals. */
static void format_range(char *out, size_t cap, const flag_def *f) {
    if (f->type == FLAG_FLOAT || f->type == FLAG_DOUBLE) {
        snprintf(out, cap, "%c%.15g, %.15g%c", (f->open & FLAG_LO_OPEN) ? '(' : '[', f->lo, f->hi,
                 (f->open & FLAG_HI_OPEN) ? ')' : ']');
    } else if (f->type == FLAG_UINT64 && f->hi >= 18446744073709551615.0) {
        snprintf(out, cap, "%.0f..%llu", f->lo, (unsigned long long)UINT64_MAX);
    } else {
        snprintf(out, cap, "%lld..%lld", (long long)f->lo, (long long)f->hi);
    }
}

static int out_of_range(const flag_def *f, const char *v, dt_error *err) {
    char range[96];
    format_range(range, sizeof range, f);
    return dt_errorf(err, DT_EINVAL, "--%s: %s is out of range %s", f->name, v, range);
}

static int in_range(const flag_def *f, double x) {
    int lo_ok = (f->open & FLAG_LO_OPEN) ? x > f->lo : x >= f->lo;
    int hi_ok = (f->open & FLAG_HI_OPEN) ? x < f->hi : x <= f->hi;
    return lo_ok && hi_ok;
}

/* Errors quote the value as given: a number too large for any type is still "out of range", not
 * cut to what fitted. */
static int set_value(const flag_def *f, const char *v, dt_error *err) {
    char *end = NULL;
    errno = 0;
    switch (f->type) {
    case FLAG_STRING: *(const char **)f->value = v; return 0;
    case FLAG_BOOL:
        if (!strcmp(v, "1") || !strcmp(v, "true")) *(int *)f->value = 1;
        else if (!strcmp(v, "0") || !strcmp(v, "false")) *(int *)f->value = 0;
        else return dt_errorf(err, DT_EINVAL, "--%s: expected true/false or 1/0, got '%s'", f->name, v);
        return 0;
    case FLAG_INT: case FLAG_INT64: {
        long long x = strtoll(v, &end, 10);
        if (!*v || *end || (errno && errno != ERANGE))
            return dt_errorf(err, DT_EINVAL, "--%s: '%s' is not an integer", f->name, v);
        if (errno == ERANGE || x < (long long)f->lo || x > (long long)f->hi) return out_of_range(f, v, err);
        if (f->type == FLAG_INT) *(int *)f->value = (int)x; /* the range is within int (checked) */
        else *(int64_t *)f->value = x;
        return 0;
    }
    case FLAG_UINT64: {
        const char *d = v;
        while (*d == ' ' || *d == '\t') d++;
        if (*d == '-') return dt_errorf(err, DT_EINVAL, "--%s: '%s' must not be negative", f->name, v);
        unsigned long long x = strtoull(v, &end, 10);
        if (!*v || *end || (errno && errno != ERANGE))
            return dt_errorf(err, DT_EINVAL, "--%s: '%s' is not an integer", f->name, v);
        if (errno == ERANGE || (double)x < f->lo || (f->hi < 18446744073709551615.0 && (double)x > f->hi))
            return out_of_range(f, v, err);
        *(uint64_t *)f->value = x;
        return 0;
    }
    case FLAG_FLOAT: case FLAG_DOUBLE: {
        double x = strtod(v, &end);
        if (!*v || *end || (errno && errno != ERANGE) || isnan(x))
            return dt_errorf(err, DT_EINVAL, "--%s: '%s' is not a number", f->name, v);
        /* ERANGE: overflow (out of any range) or underflow to about 0 (in range only if 0 is). A
         * float flag is checked as the float it becomes (1e-50 would be 0). */
        if (f->type == FLAG_FLOAT) x = (float)x;
        if ((errno == ERANGE && fabs(x) > 1) || !isfinite(x) || !in_range(f, x)) return out_of_range(f, v, err);
        if (f->type == FLAG_FLOAT) *(float *)f->value = (float)x;
        else *(double *)f->value = x;
        return 0;
    }
    }
    return dt_errorf(err, DT_EINVAL, "--%s: unsupported flag type", f->name);
}

/* The table itself: a numeric flag without a range, or one an int cannot hold, is a bug that
 * would let any value through; refused on every run, so no test can miss it. */
static int check_table(const flag_def *defs, int n_defs, dt_error *err) {
    for (int k = 0; k < n_defs; k++) {
        const flag_def *f = &defs[k];
        if (!is_numeric(f->type)) continue;
        if (!(f->lo < f->hi) || (f->type == FLAG_INT && (f->lo < -2147483647.0 || f->hi > 2147483647.0)))
            return dt_errorf(err, DT_EINVAL, "--%s: internal error: the flag table gives it no valid range", f->name);
    }
    return 0;
}

/* The index of flag name[0..len) in defs, or DT_EINVAL naming it with the nearest flag's name. */
static int find_flag(const flag_def *defs, int n_defs, const char *name, size_t len, dt_error *err) {
    for (int j = 0; j < n_defs; j++)
        if (strlen(defs[j].name) == len && !strncmp(defs[j].name, name, len)) return j;
    char given[64];
    snprintf(given, sizeof given, "%.*s", (int)(len < 63 ? len : 63), name);
    const char *best = NULL;
    int best_d = 3;
    for (int j = 0; j < n_defs; j++) {
        int d = dt_edit_distance(given, defs[j].name);
        if (d < best_d) best_d = d, best = defs[j].name;
    }
    if (best) return dt_errorf(err, DT_EINVAL, "unknown flag --%s (did you mean --%s?)", given, best);
    return dt_errorf(err, DT_EINVAL, "unknown flag --%s (see --help)", given);
}

int flags_set(const flag_def *defs, int n_defs, const char *name, const char *value, dt_error *err) {
    int rc = check_table(defs, n_defs, err);
    if (rc) return rc;
    if (!name || !value) return dt_errorf(err, DT_EINVAL, "flags_set: a flag name and a value are needed");
    int k = find_flag(defs, n_defs, name, strlen(name), err);
    return k < 0 ? k : set_value(&defs[k], value, err);
}

/* The value as help prints the default: "" for an unset string. */
static void format_value(char *out, size_t cap, const flag_def *f) {
    out[0] = 0;
    switch (f->type) {
    case FLAG_STRING: {
        const char *s = *(const char **)f->value;
        if (s) snprintf(out, cap, "%s", s);
        break;
    }
    case FLAG_BOOL: snprintf(out, cap, "%s", *(int *)f->value ? "true" : "false"); break;
    case FLAG_INT: snprintf(out, cap, "%d", *(int *)f->value); break;
    case FLAG_INT64: snprintf(out, cap, "%lld", (long long)*(int64_t *)f->value); break;
    case FLAG_UINT64: snprintf(out, cap, "%llu", (unsigned long long)*(uint64_t *)f->value); break;
    case FLAG_FLOAT: snprintf(out, cap, "%.9g", (double)*(float *)f->value); break;
    case FLAG_DOUBLE: snprintf(out, cap, "%.17g", *(double *)f->value); break;
    }
}

int flags_get(const flag_def *defs, int n_defs, const char *name, char *out, size_t cap, dt_error *err) {
    if (!name || !out || cap < 2) return dt_errorf(err, DT_EINVAL, "flags_get: a flag name and room for its value are needed");
    int k = find_flag(defs, n_defs, name, strlen(name), err);
    if (k < 0) return k;
    format_value(out, cap, &defs[k]);
    return DT_OK;
}

int flags_parse(const flag_def *defs, int n_defs, int argc, char **argv, int *help, dt_error *err) {
    return flags_parse_args(defs, n_defs, argc, argv, help, NULL, NULL, err);
}

int flags_parse_args(const flag_def *defs, int n_defs, int argc, char **argv, int *help, char **args, int *n_args,
                     dt_error *err) {
    *help = 0;
    if (n_args) *n_args = 0;
    int rc = check_table(defs, n_defs, err);
    if (rc) return rc;
    unsigned char *seen = calloc(n_defs > 0 ? (size_t)n_defs : 1, 1);
    if (!seen) return dt_errorf(err, DT_ENOMEM, "out of memory parsing flags");
    for (int i = 0; i < argc && !rc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            *help = 1;
            continue;
        }
        if (args && !strcmp(a, "--")) { /* the rest are arguments, even those starting with -- */
            while (++i < argc) args[(*n_args)++] = argv[i];
            break;
        }
        if (args && strncmp(a, "--", 2) != 0) {
            args[(*n_args)++] = argv[i];
            continue;
        }
        if (strncmp(a, "--", 2) != 0 || !a[2]) {
            rc = dt_errorf(err, DT_EINVAL, "unexpected argument '%s' (flags look like --name=value)", a);
            break;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        int k = find_flag(defs, n_defs, name, len, err);
        if (k < 0) {
            rc = k;
            break;
        }
        const flag_def *f = &defs[k];
        /* Twice is a mistake either way: the last one winning would hide the first, silently. */
        if (seen[k]) {
            rc = dt_errorf(err, DT_EINVAL, "--%s: given twice", f->name);
            break;
        }
        seen[k] = 1;
        const char *v;
        if (eq) v = eq + 1;
        else if (f->type == FLAG_BOOL && (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0 ||
                                          (strcmp(argv[i + 1], "0") && strcmp(argv[i + 1], "1") &&
                                           strcmp(argv[i + 1], "true") && strcmp(argv[i + 1], "false"))))
            v = "1"; /* a bare boolean flag means true */
        else if (i + 1 < argc) v = argv[++i];
        else {
            rc = dt_errorf(err, DT_EINVAL, "--%s needs a value", f->name);
            break;
        }
        rc = set_value(f, v, err);
    }
    free(seen);
    return rc;
}

void flags_print_help(FILE *out, const flag_def *defs, int n_defs) {
    for (int k = 0; k < n_defs; k++) {
        const flag_def *f = &defs[k];
        char def[64] = "";
        switch (f->type) {
        case FLAG_STRING: {
            const char *s = *(const char **)f->value;
            if (s) snprintf(def, sizeof def, "%s", s);
            break;
        }
        case FLAG_BOOL: snprintf(def, sizeof def, "%s", *(int *)f->value ? "true" : "false"); break;
        case FLAG_INT: snprintf(def, sizeof def, "%d", *(int *)f->value); break;
        case FLAG_INT64: snprintf(def, sizeof def, "%lld", (long long)*(int64_t *)f->value); break;
        case FLAG_UINT64: snprintf(def, sizeof def, "%llu", (unsigned long long)*(uint64_t *)f->value); break;
        case FLAG_FLOAT: snprintf(def, sizeof def, "%g", (double)*(float *)f->value); break;
        case FLAG_DOUBLE: snprintf(def, sizeof def, "%g", *(double *)f->value); break;
        }
        fprintf(out, "  --%-22s %s", f->name, f->help);
        if (is_numeric(f->type)) {
            char range[96];
            format_range(range, sizeof range, f);
            fprintf(out, " (default: %s; range %s)", def, range);
        } else if (def[0]) {
            fprintf(out, " (default: %s)", def);
        }
        fputc('\n', out);
    }
}
