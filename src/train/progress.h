/* A live progress line (step, percent, rate, ETA) on stderr, redrawn at most a few times a second.
 * Only drawn when enabled (the CLI enables it when stderr is a terminal). */
#ifndef DT_TRAIN_PROGRESS_H
#define DT_TRAIN_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

typedef struct {
    int enabled, shown;
    int64_t total;
    double t_start, t_last;
} dt_progress;

void dt_progress_init(dt_progress *p, int enabled, int64_t total);
void dt_progress_update(dt_progress *p, int64_t done, double epoch);
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
