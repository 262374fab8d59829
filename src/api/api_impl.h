/* Between the files of src/api: not public. */
#ifndef DT_API_API_IMPL_H
#define DT_API_API_IMPL_H

#include <stdio.h>

#include "data/ctr.h"
#include "dtrain.h"

/* Click arrays in a caller's memory (dt_clicks_new checked their shapes; each row is checked again as
 * it is read). */
struct dt_clicks {
    dt_ctr_memory m;
};

/* The log stream of dt_options_set_log's function (closed with fclose), or *out NULL when none is set. */
int dt_options_open_log(const dt_options *o, FILE **out, dt_error *err);
/* The flag dt_options_stop sets (a model's waits on a cluster end on it). */
const volatile int *dt_options_stop_flag(const dt_options *o);
/* The options as dt_train takes them (the flags in other units converted). */
int dt_options_resolve(const dt_options *o, dt_train_options *out, dt_error *err);

#endif
