/* The optimizer the ps tasks apply to a click-log model's embedding tables when they hold them as
 * sparse tables (docs/sparse.md, "Lazy optimizers"): from the run's options. */
#ifndef DT_TRAIN_TABLE_OPTIM_H
#define DT_TRAIN_TABLE_OPTIM_H

#include "compute/lazy_optim.h"
#include "dtrain.h"

/* The dense optimizer's lazy counterpart at the dense learning rate: sgd -> sgd, adam -> lazy adam
 * (TensorFlow's LazyAdamOptimizer, beta1/beta2/epsilon as --beta1 etc. give them). momentum has no
 * lazy form on the ps: refused (DT_EINVAL naming --optimizer). */
int dt_table_optim_config(const dt_train_options *o, dt_lazy_config *out, dt_error *err);

#endif
