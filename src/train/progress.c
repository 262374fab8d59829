#include "train/progress.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

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
    if (!p->enabled) return out;
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
