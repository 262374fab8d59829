/* The picture dtrain plot writes: an SVG document with two panels, cost and accuracy against the
 * global step, one colour per run, training solid and validation dashed, and a legend naming the
 * runs. Hand-made SVG (docs/summaries.md, "Plots": why not a plotting library). Each line is a
 * <polyline class="series"> carrying data-run, data-split (train/validation), data-tag and
 * data-points, so a test or a script can read the numbers back. */
#ifndef DT_PLOT_SVG_H
#define DT_PLOT_SVG_H

#include <stddef.h>

#include "plot/curves.h"

/* *out (malloc'ed, NUL-terminated, *len bytes) gets the document. title may be NULL. */
int dt_plot_svg(char **out, size_t *len, const dt_run_curves *runs, int n_runs, const char *title, dt_error *err);

#endif
