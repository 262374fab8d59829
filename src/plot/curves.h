/* Training curves read back from a run's TensorBoard event files (docs/summaries.md): the scalars
 * `cost` and `accuracy` of <dir>/train (training batches) and <dir>/test (validation), against the
 * global step, for dtrain plot. */
#ifndef DT_PLOT_CURVES_H
#define DT_PLOT_CURVES_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dtrain.h"

enum { DT_SPLIT_TRAIN = 0, DT_SPLIT_TEST = 1 };
enum { DT_TAG_COST = 0, DT_TAG_ACCURACY = 1 };

typedef struct {
    int64_t *step;    /* [n] increasing after dt_curves_finish */
    double *value;    /* [n] finite */
    size_t n, cap;
} dt_series;

typedef struct {
    char *name;              /* the run's name in the legend */
    dt_series s[2][2];       /* [DT_SPLIT_*][DT_TAG_*] */
    size_t non_finite;       /* NaN or infinite values left out */
    int damaged;             /* files whose reading stopped at a damaged record (earlier ones kept) */
    int files;               /* event files read */
} dt_run_curves;

/* Reads every event file (names containing "tfevents", in name order, which is the order they were
 * started in) of dir/train and dir/test. A damaged or truncated record ends that file's reading
 * with a warning on log (may be NULL), keeping the records before it, as TensorBoard does. dir
 * without any event file is an error naming it. The points are then sorted by step (at equal steps
 * the value read last wins: a run resumed from a checkpoint logs again the steps it lost). */
int dt_curves_read(dt_run_curves *out, const char *name, const char *dir, FILE *log, dt_error *err);

/* The pieces dt_curves_read is made of, for the fuzz target: start with a zeroed dt_run_curves and
 * dt_curves_init; add the records of one file image buf[0..n) to a split; finish sorts. */
int dt_curves_init(dt_run_curves *c, const char *name, dt_error *err);
int dt_curves_add_events(dt_run_curves *c, int split, const uint8_t *buf, size_t n, const char *label, FILE *log,
                         dt_error *err);
/* The records of the event file at path, read record by record (never held whole). */
int dt_curves_add_file(dt_run_curves *c, int split, const char *path, FILE *log, dt_error *err);
int dt_curves_finish(dt_run_curves *c, dt_error *err);
void dt_curves_free(dt_run_curves *c);

#endif
