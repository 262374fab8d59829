/* dtrain subcommands. Each takes the arguments after its name and returns the process exit status;
 * errors are printed as one line "dtrain <cmd>: <message>". */
#ifndef DT_CLI_COMMANDS_H
#define DT_CLI_COMMANDS_H

#include <stdio.h>

#include "dtrain.h"
#include "train/train_args.h"
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


/* Set by SIGINT/SIGTERM; long-running commands poll it and stop cleanly. */
extern volatile int cli_stop;
void cli_install_signal_handlers(void);

#endif
