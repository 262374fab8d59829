/* dtrain train's flags: one table (train_args.c) that the CLI's train and launch parse and the
 * library's options object (dt_options_set) sets by name, into the options dt_train takes. */
#ifndef DT_TRAIN_TRAIN_ARGS_H
#define DT_TRAIN_TRAIN_ARGS_H

#include <stdio.h>

#include "core/flags.h"
#include "dtrain.h"
#include "train/train_debug.h"

#define TRAIN_MAX_FLAGS 96
typedef struct {
    dt_train_options o;
    dt_train_debug dbg;
    const char *bad_images, *auth, *progress; /* text flags turned into options by train_args_finish */
    double epochs, connect_timeout, heartbeat_timeout, ps_timeout, idle_timeout; /* seconds */
} train_args;
void train_args_init(train_args *a);
/* The table, pointing into a: out has room for TRAIN_MAX_FLAGS; returns how many. */
int train_args_flags(train_args *a, flag_def *out);
/* Parses argv into a (after train_args_init; fields set before parsing keep their value when the
 * flag is absent), then train_args_finish. Sets *help on --help. Errors name the flag. */
int train_args_parse(train_args *a, int argc, char **argv, int *help, dt_error *err);
/* The flags kept in other units or words (seconds, bad_images, auth, progress) into a->o. */
int train_args_finish(train_args *a, dt_error *err);
void train_args_help(FILE *f, train_args *a);

#endif
