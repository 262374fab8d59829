/* Between the files of src/api: not public. */
#ifndef DT_API_API_IMPL_H
#define DT_API_API_IMPL_H

#include "dtrain.h"

/* The options as dt_train takes them (the flags in other units converted). */
int dt_options_resolve(const dt_options *o, dt_train_options *out, dt_error *err);

#endif
