#include "train/progress.h"

#include <stdio.h>
#include "core/clock.h"

void dt_progress_init(dt_progress *p, int enabled, int64_t total) {
    p->enabled = enabled;
    p->shown = 0;
    p->total = total;
    p->t_start = p->t_last = dt_seconds();
}

void dt_progress_update(dt_progress *p, int64_t done, double epoch) {
    if (!p->enabled) return;
    double t = dt_seconds();
    if (t - p->t_last < 0.25 && done < p->total) return;
    p->t_last = t;
    double rate = done / (t - p->t_start + 1e-9);
    long eta = rate > 0 ? (long)((p->total - done) / rate) : 0;
    fprintf(stderr, "\r  step %lld/%lld  %3.0f%%  epoch %.2f  %.1f steps/s  ETA %ld:%02ld:%02ld ",
            (long long)done, (long long)p->total, 100.0 * done / p->total, epoch, rate, eta / 3600,
            eta / 60 % 60, eta % 60);
    fflush(stderr);
    p->shown = 1;
}

void dt_progress_clear(dt_progress *p) {
    if (!p->shown) return;
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
    p->shown = 0;
}
