/* The tables' lazy optimizer from the run's options (table_optim.h). */
#include "train/table_optim.h"

#include <string.h>

#include "core/error.h"

int dt_table_optim_config(const dt_train_options *o, dt_lazy_config *out, dt_error *err) {
    const char *name = o->optimizer && *o->optimizer ? o->optimizer : "sgd";
    /* The dense optimizer's lazy form: sgd is the same update; adam becomes LazyAdam (moments of
     * untouched rows stay). Momentum's lazy form (TF's sparse_apply_momentum) is not one of the
     * ps's table optimizers. */
    if (strcmp(name, "sgd") && strcmp(name, "adam"))
        return dt_errorf(err, DT_EINVAL, "optimizer %s: the ps tasks update sparse tables with sgd or (lazy) adam "
                         "only; give --optimizer sgd or adam for a click-log model on a cluster", name);
    return dt_lazy_config_init(out, name, o->learning_rate, err);
}
