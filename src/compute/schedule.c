#include "compute/schedule.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static const char *const kind_names[DT_LR_KINDS] = {"constant", "exponential", "piecewise", "cosine"};

int dt_lr_kind_parse(const char *name, dt_lr_kind *out, dt_error *err) {
    for (int k = 0; k < DT_LR_KINDS; k++)
        if (name && !strcmp(name, kind_names[k])) {
            *out = (dt_lr_kind)k;
            return DT_OK;
        }
    return dt_errorf(err, DT_EINVAL, "--lr_schedule: expected constant, exponential, piecewise or cosine, got '%s'",
                     name ? name : "");
}

const char *dt_lr_kind_name(dt_lr_kind kind) {
    return (unsigned)kind < DT_LR_KINDS ? kind_names[kind] : "?";
}

/* Splits a comma-separated list into items of at most 63 bytes; calls item() on each. An empty
 * list, an empty item or too many items is an error naming the flag. */
static int each_item(const char *flag, const char *text, int max_items, int (*item)(void *, int, const char *, dt_error *),
                     void *user, int *count, dt_error *err) {
    *count = 0;
    if (!text || !*text) return dt_errorf(err, DT_EINVAL, "%s: empty list", flag);
    const char *p = text;
    for (;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (*count == max_items) return dt_errorf(err, DT_EINVAL, "%s: more than %d items", flag, max_items);
        char buf[64];
        if (len == 0) return dt_errorf(err, DT_EINVAL, "%s: item %d is empty", flag, *count + 1);
        if (len >= sizeof buf) return dt_errorf(err, DT_EINVAL, "%s: item %d is too long", flag, *count + 1);
        memcpy(buf, p, len);
        buf[len] = '\0';
        int rc = item(user, *count, buf, err);
        if (rc) return rc;
        ++*count;
        if (!end) return DT_OK;
        p = end + 1;
    }
}

static int boundary_item(void *user, int i, const char *s, dt_error *err) {
    dt_lr_schedule *sc = user;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end || end == s || errno || v < 0 || v > DT_LR_MAX_STEPS)
        return dt_errorf(err, DT_EINVAL, "--lr_boundaries: '%s' is not a step count (0..2^50)", s);
    if (i > 0 && v <= sc->boundaries[i - 1])
        return dt_errorf(err, DT_EINVAL, "--lr_boundaries: not increasing: %lld after %lld", v,
                         (long long)sc->boundaries[i - 1]);
    sc->boundaries[i] = v;
    return DT_OK;
}

static int value_item(void *user, int i, const char *s, dt_error *err) {
    dt_lr_schedule *sc = user;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || end == s || errno || !(v > 0) || v > 100)
        return dt_errorf(err, DT_EINVAL, "--lr_values: '%s' is not a learning rate (a number in (0, 100])", s);
    sc->values[i] = (float)v;
    return DT_OK;
}

int dt_lr_parse_boundaries(dt_lr_schedule *s, const char *text, dt_error *err) {
    return each_item("--lr_boundaries", text, DT_LR_MAX_BOUNDARIES, boundary_item, s, &s->n_boundaries, err);
}

int dt_lr_parse_values(dt_lr_schedule *s, const char *text, dt_error *err) {
    int n = 0, rc = each_item("--lr_values", text, DT_LR_MAX_BOUNDARIES + 1, value_item, s, &n, err);
    if (rc) return rc;
    if (n != s->n_boundaries + 1)
        return dt_errorf(err, DT_EINVAL, "--lr_values: %d values for %d boundaries (--lr_boundaries), expected %d", n,
                         s->n_boundaries, s->n_boundaries + 1);
    return DT_OK;
}

int dt_lr_schedule_check(const dt_lr_schedule *s, dt_error *err) {
    if ((unsigned)s->kind >= DT_LR_KINDS) return dt_errorf(err, DT_EINVAL, "--lr_schedule: unknown kind %d", (int)s->kind);
    const char *k = kind_names[s->kind];
    int exp = s->kind == DT_LR_EXPONENTIAL, cos_ = s->kind == DT_LR_COSINE, pw = s->kind == DT_LR_PIECEWISE;
    if (!exp && s->staircase) return dt_errorf(err, DT_EINVAL, "--lr_staircase needs --lr_schedule exponential, not %s", k);
    if (!exp && s->decay_rate != 0)
        return dt_errorf(err, DT_EINVAL, "--lr_decay_rate needs --lr_schedule exponential, not %s", k);
    if (!exp && !cos_ && s->decay_steps != 0)
        return dt_errorf(err, DT_EINVAL, "--lr_decay_steps needs --lr_schedule exponential or cosine, not %s", k);
    if (!cos_ && (s->warmup_steps != 0 || s->alpha != 0))
        return dt_errorf(err, DT_EINVAL, "--%s needs --lr_schedule cosine, not %s", s->warmup_steps ? "warmup_steps" : "lr_alpha",
                         k);
    if (!pw && s->n_boundaries != 0)
        return dt_errorf(err, DT_EINVAL, "--lr_boundaries and --lr_values need --lr_schedule piecewise, not %s", k);
    if ((exp || cos_) && !(s->decay_steps > 0 && s->decay_steps <= DT_LR_MAX_STEPS))
        return dt_errorf(err, DT_EINVAL, "--lr_decay_steps must be in 1..2^50 for --lr_schedule %s, got %lld", k,
                         (long long)s->decay_steps);
    if (exp && !(s->decay_rate > 0 && isfinite(s->decay_rate)))
        return dt_errorf(err, DT_EINVAL, "--lr_decay_rate must be a positive number, got %g", (double)s->decay_rate);
    if (cos_ && !(s->alpha >= 0 && s->alpha <= 1))
        return dt_errorf(err, DT_EINVAL, "--lr_alpha must be in 0..1, got %g", (double)s->alpha);
    if (cos_ && !(s->warmup_steps >= 0 && s->warmup_steps <= DT_LR_MAX_STEPS))
        return dt_errorf(err, DT_EINVAL, "--warmup_steps must be in 0..2^50, got %lld", (long long)s->warmup_steps);
    if (pw) {
        if (s->n_boundaries < 1 || s->n_boundaries > DT_LR_MAX_BOUNDARIES)
            return dt_errorf(err, DT_EINVAL, "--lr_boundaries: piecewise needs 1..%d boundaries, got %d",
                             DT_LR_MAX_BOUNDARIES, s->n_boundaries);
        for (int i = 0; i < s->n_boundaries; i++) {
            if (s->boundaries[i] < 0 || s->boundaries[i] > DT_LR_MAX_STEPS || (i && s->boundaries[i] <= s->boundaries[i - 1]))
                return dt_errorf(err, DT_EINVAL, "--lr_boundaries: not increasing (or out of 0..2^50) at item %d", i + 1);
        }
        for (int i = 0; i <= s->n_boundaries; i++)
            if (!(s->values[i] > 0 && s->values[i] <= 100))
                return dt_errorf(err, DT_EINVAL, "--lr_values: item %d (%g) is not in (0, 100]", i + 1, (double)s->values[i]);
    }
    for (int i = pw ? s->n_boundaries : 0; i < DT_LR_MAX_BOUNDARIES; i++)
        if (s->boundaries[i] != 0 || s->values[i + 1] != 0 || (!pw && i == 0 && s->values[0] != 0))
            return dt_errorf(err, DT_EINVAL, "--lr_boundaries/--lr_values: entries beyond the %d given are not zero",
                             s->n_boundaries);
    return DT_OK;
}

float dt_lr_at(const dt_lr_schedule *s, float lr0, int64_t step) {
    double st = (double)(step < 0 ? 0 : step);
    switch (s->kind) {
    case DT_LR_CONSTANT: return lr0;
    case DT_LR_EXPONENTIAL: {
        double p = st / (double)s->decay_steps;
        if (s->staircase) p = floor(p);
        return (float)((double)lr0 * pow((double)s->decay_rate, p));
    }
    case DT_LR_PIECEWISE: {
        int i = 0;
        while (i < s->n_boundaries && step > s->boundaries[i]) i++;
        return s->values[i];
    }
    case DT_LR_COSINE: {
        double w = (double)s->warmup_steps;
        if (st < w) return (float)((double)lr0 * st / w);
        double d = (double)s->decay_steps, t = fmin(st - w, d);
        double cosine = 0.5 * (1.0 + cos(M_PI * t / d));
        return (float)((double)lr0 * ((1.0 - (double)s->alpha) * cosine + (double)s->alpha));
    }
    }
    return lr0;
}

void dt_lr_describe(const dt_lr_schedule *s, char *out, int n) {
    switch (s->kind) {
    case DT_LR_EXPONENTIAL:
        snprintf(out, (size_t)n, "exponential (rate %g every %lld steps%s)", (double)s->decay_rate,
                 (long long)s->decay_steps, s->staircase ? ", staircase" : "");
        return;
    case DT_LR_PIECEWISE: {
        int len = snprintf(out, (size_t)n, "piecewise (%g", (double)s->values[0]);
        for (int i = 0; i < s->n_boundaries && len >= 0 && len < n; i++)
            len += snprintf(out + len, (size_t)(n - len), " after %lld: %g", (long long)s->boundaries[i],
                            (double)s->values[i + 1]);
        if (len >= 0 && len < n) snprintf(out + len, (size_t)(n - len), ")");
        return;
    }
    case DT_LR_COSINE:
        snprintf(out, (size_t)n, "cosine (warmup %lld, decay %lld steps, alpha %g)", (long long)s->warmup_steps,
                 (long long)s->decay_steps, (double)s->alpha);
        return;
    default: snprintf(out, (size_t)n, "constant"); return;
    }
}
