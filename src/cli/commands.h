/* dtrain subcommands. Each takes the arguments after its name and returns the process exit status;
 * errors are printed as one line "dtrain <cmd>: <message>". */
#ifndef DT_CLI_COMMANDS_H
#define DT_CLI_COMMANDS_H

#include <stdio.h>

#include "dtrain.h"
#include "train/train_debug.h"

int cmd_train(int argc, char **argv);
int cmd_launch(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_predict(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_plot(int argc, char **argv);
int cmd_keygen(int argc, char **argv);
int cmd_gen_clicks(int argc, char **argv);

/* dtrain train's flags (cmd_train.c's table), parsed into the options dt_train takes; launch reads
 * them the same way before passing them on to its processes. */
#define TRAIN_MAX_FLAGS 96
typedef struct {
    dt_train_options o;
    dt_train_debug dbg;
    const char *bad_images, *auth, *progress; /* text flags turned into options by train_args_parse */
    double epochs, connect_timeout, heartbeat_timeout, ps_timeout, idle_timeout; /* seconds */
} train_args;
void train_args_init(train_args *a);
/* Parses argv into a (after train_args_init; fields set before parsing keep their value when the
 * flag is absent). Sets *help on --help. Errors name the flag. */
int train_args_parse(train_args *a, int argc, char **argv, int *help, dt_error *err);
void train_args_help(FILE *f, train_args *a);

/* Set by SIGINT/SIGTERM; long-running commands poll it and stop cleanly. */
extern volatile int cli_stop;
void cli_install_signal_handlers(void);

#endif
