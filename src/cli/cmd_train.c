/* dtrain train: flags (train/train_args.c's table) -> dt_train_options -> dt_train. */
#include <stdio.h>

#include "commands.h"
#include "train/train_debug.h"

int cmd_train(int argc, char **argv) {
    train_args a;
    train_args_init(&a);
    int help = 0;
    dt_error err = {0};
    if (train_args_parse(&a, argc, argv, &help, &err)) {
        fprintf(stderr, "dtrain train: %s\n", err.msg);
        return 2;
    }
    if (help) {
        printf("usage: dtrain train --model FILE --data PATH [flags]\n\n"
               "Trains a model and prints step, loss, training and validation accuracy every\n"
               "--steps_to_validate steps, then the test accuracy. Alone on this machine by default;\n"
               "with --ps_hosts/--worker_hosts/--job_name/--task_index (or TF_CONFIG, or --num_ps under\n"
               "mpirun or srun) as one task of\n"
               "a cluster: a ps serves its share of the variables until the chief (worker 0) ends\n"
               "training. By default the cluster's traffic is neither authenticated nor encrypted: use\n"
               "it on trusted networks only, or --auth=curve with --keys (docs/security.md).\n"
               "The chief (or the single process) restores the newest good checkpoint in --logdir and\n"
               "resumes at its global step; it saves checkpoints and TensorBoard summaries as it goes.\n\n"
               "flags:\n");
        train_args_help(stdout, &a);
        return 0;
    }
    dt_train_options o = a.o;
    o.stop = &cli_stop;
    cli_install_signal_handlers();
    dt_train_result res;
    int rc = dt_train_hooked(&o, &a.dbg, stdout, &res, &err);
    if (rc) {
        fprintf(stderr, "dtrain train: %s\n", err.msg);
        return rc == DT_EINTR ? 130 : 1;
    }
    return 0;
}
