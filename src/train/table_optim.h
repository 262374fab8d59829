/* The embedding tables' optimizer of a run, from its options (docs/sparse.md, "Lazy optimizers";
 * README, "Training options"): the one mapping from dt_train_options to a dt_lazy_config, for the
 * local updater's tables and the ps tasks' sparse tables alike, so both apply the same update. */
#ifndef DT_TRAIN_TABLE_OPTIM_H
#define DT_TRAIN_TABLE_OPTIM_H

#include "compute/lazy_optim.h"
#include "dtrain.h"

/* table_optimizer (NULL or "": DT_TABLE_OPTIMIZER_DEFAULT), table_learning_rate (0: learning_rate),
 * table_initial_accumulator (adagrad, ftrl), table_l1, table_l2, table_lr_power (ftrl); adam takes
 * TensorFlow's beta1, beta2 and epsilon. A value out of its range, or one set away from its default
 * for an optimizer that does not use it (table_l1 with adagrad, ...), is DT_EINVAL naming the flag. */
#define DT_TABLE_OPTIMIZER_DEFAULT "adagrad"
int dt_table_optim_config(const dt_train_options *o, dt_lazy_config *out, dt_error *err);

#endif
