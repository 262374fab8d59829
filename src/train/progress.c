#include "train/progress.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

#include "core/clock.h"

void dt_progress_init(dt_progress *p, int enabled, int64_t total) {
    p->enabled = enabled;
    p->shown = 0;
    p->total = total > 0 ? total : 1;
    p->first = 0;
    p->examples_per_step = 0;
    p->t_start = p->t_last = dt_seconds();
}

void dt_progress_start(dt_progress *p, int64_t first, double examples_per_step) {
    p->first = first;
    p->examples_per_step = examples_per_step;
    p->t_start = p->t_last = dt_seconds();
}

void dt_progress_update(dt_progress *p, int64_t done, double epoch, double loss) {
    if (!p->enabled) return;
    double t = dt_seconds();
    if (t - p->t_last < (p->enabled == DT_PROGRESS_RELAY ? 1.0 : 0.25) && done < p->total) return;
    p->t_last = t;
    double rate = (double)(done - p->first) / (t - p->t_start + 1e-9); /* steps/s */
    long eta = rate > 0 ? (long)((double)(p->total - done) / rate) : 0;
    char fig[48], los[32] = "";
    if (p->examples_per_step > 0) snprintf(fig, sizeof fig, "%.0f examples/s", rate * p->examples_per_step);
    else snprintf(fig, sizeof fig, "%.1f steps/s", rate);
    if (loss == loss) snprintf(los, sizeof los, "  loss %.4f", loss);
    char ep[32] = "?"; /* NAN: not known yet (a click log's lines still being counted) */
    if (epoch == epoch) snprintf(ep, sizeof ep, "%.2f", epoch);
    /* Relayed: one whole line per state, for dtrain launch to draw in place. */
    fprintf(stderr, "\r  step %lld/%lld  %3.0f%%  epoch %s  %s%s  ETA %ld:%02ld:%02ld %s", (long long)done,
            (long long)p->total, 100.0 * (double)done / (double)p->total, ep, fig, los, eta / 3600, eta / 60 % 60,
            eta % 60, p->enabled == DT_PROGRESS_RELAY ? "\n" : "");
    fflush(stderr);
    p->shown = p->enabled == DT_PROGRESS_TTY;
}

void dt_progress_clear(dt_progress *p) {
    if (!p->shown) return;
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
    p->shown = 0;
}

typedef struct {
    dt_progress *p;
    FILE *out;
} wrapped_log;

static ssize_t wrapped_write(void *cookie, const char *buf, size_t n) {
    wrapped_log *w = cookie;
    dt_progress_clear(w->p);
    size_t k = fwrite(buf, 1, n, w->out);
    fflush(w->out); /* before the line is drawn again on the other stream */
    return k > 0 || n == 0 ? (ssize_t)k : -1;
}

static int wrapped_close(void *cookie) {
    free(cookie);
    return 0;
}

FILE *dt_progress_wrap(dt_progress *p, FILE *out) {
    if (p->enabled != DT_PROGRESS_TTY) return out; /* relayed lines are whole: nothing to erase */
    wrapped_log *w = malloc(sizeof *w);
    if (!w) return out; /* the log still works, only a warning may land after the progress text */
    w->p = p;
    w->out = out;
    cookie_io_functions_t io = {.write = wrapped_write, .close = wrapped_close};
    FILE *f = fopencookie(w, "w", io);
    if (!f) {
        free(w);
        return out;
    }
    setvbuf(f, NULL, _IOLBF, BUFSIZ); /* whole lines: a line is never split by a redraw */
    return f;
}

void dt_progress_unwrap(FILE *stream, FILE *out) {
    if (stream && stream != out) fclose(stream);
}
