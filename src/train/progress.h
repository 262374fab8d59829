/* A live progress line (step, percent, rate, ETA) on stderr, redrawn at most a few times a second.
 * Only drawn when enabled (the CLI enables it when stderr is a terminal). */
#ifndef DT_TRAIN_PROGRESS_H
#define DT_TRAIN_PROGRESS_H

#include <stdint.h>

typedef struct {
    int enabled, shown;
    int64_t total;
    double t_start, t_last;
} dt_progress;

void dt_progress_init(dt_progress *p, int enabled, int64_t total);
void dt_progress_update(dt_progress *p, int64_t done, double epoch);
/* Erases the line so a log line can be printed in its place. */
void dt_progress_clear(dt_progress *p);

#endif
