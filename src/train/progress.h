/* A live progress line (step, percent, examples/s, loss, ETA) on stderr, redrawn at most a few
 * times a second. Only drawn when enabled: DT_PROGRESS_TTY redraws in place (the CLI's choice when
 * stderr is a terminal); DT_PROGRESS_RELAY writes each state as a line of its own starting with
 * '\r', which `dtrain launch` redraws in place on its terminal (the chief's line for the cluster). */
#ifndef DT_TRAIN_PROGRESS_H
#define DT_TRAIN_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

enum { DT_PROGRESS_OFF = 0, DT_PROGRESS_TTY = 1, DT_PROGRESS_RELAY = 2 };

typedef struct {
    int enabled, shown;           /* enabled: DT_PROGRESS_* */
    int64_t total, first;         /* first: the step the rate counts from (a resumed run's) */
    double examples_per_step;
    double t_start, t_last;
} dt_progress;

void dt_progress_init(dt_progress *p, int enabled, int64_t total);
/* The rate counts from step first; examples_per_step turns steps/s into examples/s (0: steps/s). */
void dt_progress_start(dt_progress *p, int64_t first, double examples_per_step);
/* done: the global step; loss: the mean training loss lately (NaN: not shown). */
void dt_progress_update(dt_progress *p, int64_t done, double epoch, double loss);
/* Erases the line so a log line can be printed in its place. */
void dt_progress_clear(dt_progress *p);

/* A stream for the log while the line may be drawn: whatever is written to it (a warning from deep
 * inside the supervisor or the remote updater included) first erases the line, so it starts on a
 * line of its own instead of after the progress text. Line-buffered; each line goes on to out,
 * flushed. Returns out itself when p is not enabled or the stream cannot be made. p must outlive
 * the stream; dt_progress_unwrap(stream, out) closes it. */
FILE *dt_progress_wrap(dt_progress *p, FILE *out);
void dt_progress_unwrap(FILE *stream, FILE *out);

#endif
