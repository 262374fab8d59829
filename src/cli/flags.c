#include "flags.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* Levenshtein distance, for "did you mean" suggestions. */
static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
    return d[la][lb];
}

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
        if (!*v || *end || errno) return dt_errorf(err, DT_EINVAL, "--%s: '%s' is not an integer", f->name, v);
        if (f->type == FLAG_INT) {
            if (x < -2147483647LL || x > 2147483647LL)
                return dt_errorf(err, DT_EINVAL, "--%s: %s is out of range", f->name, v);
            *(int *)f->value = (int)x;
        } else {
            *(int64_t *)f->value = x;
        }
        return 0;
    }
    case FLAG_UINT64: {
        if (*v == '-') return dt_errorf(err, DT_EINVAL, "--%s: '%s' must not be negative", f->name, v);
        unsigned long long x = strtoull(v, &end, 10);
        if (!*v || *end || errno) return dt_errorf(err, DT_EINVAL, "--%s: '%s' is not an integer", f->name, v);
        *(uint64_t *)f->value = x;
        return 0;
    }
    case FLAG_FLOAT: case FLAG_DOUBLE: {
        double x = strtod(v, &end);
        if (!*v || *end || errno || !isfinite(x))
            return dt_errorf(err, DT_EINVAL, "--%s: '%s' is not a number", f->name, v);
        if (f->type == FLAG_FLOAT) *(float *)f->value = (float)x;
        else *(double *)f->value = x;
        return 0;
    }
    }
    return dt_errorf(err, DT_EINVAL, "--%s: unsupported flag type", f->name);
}

int flags_parse(const flag_def *defs, int n_defs, int argc, char **argv, int *help, dt_error *err) {
    *help = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            *help = 1;
            continue;
        }
        if (strncmp(a, "--", 2) != 0 || !a[2])
            return dt_errorf(err, DT_EINVAL, "unexpected argument '%s' (flags look like --name=value)", a);
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const flag_def *f = NULL;
        for (int k = 0; k < n_defs; k++)
            if (strlen(defs[k].name) == len && !strncmp(defs[k].name, name, len)) f = &defs[k];
        if (!f) {
            char given[64];
            snprintf(given, sizeof given, "%.*s", (int)(len < 63 ? len : 63), name);
            const char *best = NULL;
            int best_d = 3;
            for (int k = 0; k < n_defs; k++) {
                int d = edit_distance(given, defs[k].name);
                if (d < best_d) best_d = d, best = defs[k].name;
            }
            if (best) return dt_errorf(err, DT_EINVAL, "unknown flag --%s (did you mean --%s?)", given, best);
            return dt_errorf(err, DT_EINVAL, "unknown flag --%s (see --help)", given);
        }
        const char *v;
        if (eq) v = eq + 1;
        else if (f->type == FLAG_BOOL && (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0 ||
                                          (strcmp(argv[i + 1], "0") && strcmp(argv[i + 1], "1") &&
                                           strcmp(argv[i + 1], "true") && strcmp(argv[i + 1], "false"))))
            v = "1"; /* a bare boolean flag means true */
        else if (i + 1 < argc) v = argv[++i];
        else return dt_errorf(err, DT_EINVAL, "--%s needs a value", f->name);
        int rc = set_value(f, v, err);
        if (rc) return rc;
    }
    return 0;
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
        if (def[0]) fprintf(out, " (default: %s)", def);
        fputc('\n', out);
    }
}
