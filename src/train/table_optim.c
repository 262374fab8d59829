#include "train/table_optim.h"

#include <math.h>
#include <string.h>

#include "core/error.h"

/* A hyperparameter set for an optimizer that ignores it: refused, as a flag that changes nothing
 * would hide a mistake (FTRL's l1 given to adagrad trains without it). */
static int unused(const char *flag, double value, double dflt, const char *opt, const char *users, dt_error *err) {
    if (value == dflt) return DT_OK;
    return dt_errorf(err, DT_EINVAL, "--%s %g: table_optimizer %s does not use it (%s only)", flag, value, opt, users);
}

static int in_range(const char *flag, double value, double lo, int lo_open, double hi, dt_error *err) {
    if (isfinite(value) && (lo_open ? value > lo : value >= lo) && value <= hi) return DT_OK;
    return dt_errorf(err, DT_EINVAL, "--%s %g: must be %s %g and at most %g", flag, value, lo_open ? "above" : "at least",
                     lo, hi);
}

int dt_table_optim_config(const dt_train_options *o, dt_lazy_config *out, dt_error *err) {
    const char *name = o->table_optimizer && *o->table_optimizer ? o->table_optimizer : DT_TABLE_OPTIMIZER_DEFAULT;
    double lr = o->table_learning_rate > 0 ? o->table_learning_rate : o->learning_rate;
    int rc;
    if ((rc = in_range("table_learning_rate", o->table_learning_rate, 0, 0, 100, err)) ||
        (rc = in_range("table_learning_rate", lr, 0, 1, 100, err)))
        return rc;
    dt_error e = {0};
    if (dt_lazy_config_init(out, name, (float)lr, &e))
        return dt_errorf(err, DT_EINVAL, "table_optimizer '%.64s': expected sgd, adagrad, ftrl or adam", name);
    const int ftrl = out->kind == DT_LAZY_FTRL, accum = ftrl || out->kind == DT_LAZY_ADAGRAD;
    if ((rc = in_range("table_initial_accumulator", o->table_initial_accumulator, 0, !ftrl, 1e6, err)) ||
        (rc = in_range("table_l1", o->table_l1, 0, 0, 1e6, err)) ||
        (rc = in_range("table_l2", o->table_l2, 0, 0, 1e6, err)) ||
        (rc = in_range("table_lr_power", o->table_lr_power, -1e3, 0, 0, err)))
        return rc;
    if (!ftrl && ((rc = unused("table_l1", o->table_l1, 0, name, "ftrl", err)) ||
                  (rc = unused("table_l2", o->table_l2, 0, name, "ftrl", err)) ||
                  (rc = unused("table_lr_power", o->table_lr_power, -0.5, name, "ftrl", err))))
        return rc;
    if (!accum && (rc = unused("table_initial_accumulator", o->table_initial_accumulator, 0.1, name,
                               "adagrad and ftrl", err)))
        return rc;
    out->initial_accumulator = (float)o->table_initial_accumulator;
    out->l1 = (float)o->table_l1;
    out->l2 = (float)o->table_l2;
    out->lr_power = (float)o->table_lr_power;
    return dt_lazy_config_check(out, err);
}
