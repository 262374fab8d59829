/* dtrain train: flags (the source's names where they apply) -> dt_train_options -> dt_train. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "flags.h"

int cmd_train(int argc, char **argv) {
    dt_train_options o;
    dt_train_options_init(&o);
    const char *bad_images = "skip";
    double epochs = o.epochs;
    flag_def defs[] = {
        {"model", FLAG_STRING, &o.model_path, "model file (see docs/model-format.md)"},
        {"data", FLAG_STRING, &o.data_path, "IDX folder or image folder (see docs/data.md)"},
        {"optimizer", FLAG_STRING, &o.optimizer, "sgd, momentum or adam"},
        {"learning_rate", FLAG_FLOAT, &o.learning_rate, "learning rate"},
        {"batch_size", FLAG_INT, &o.batch_size, "examples per step"},
        {"train_steps", FLAG_INT64, &o.train_steps, "steps to train; 0: use --epochs"},
        {"epochs", FLAG_DOUBLE, &epochs, "epochs to train when --train_steps is 0"},
        {"steps_to_validate", FLAG_INT64, &o.steps_to_validate, "log and validate every N steps"},
        {"seed", FLAG_UINT64, &o.seed, "seed for initialisation, shuffling and dropout"},
        {"threads", FLAG_INT, &o.threads, "compute threads; 0: all cores"},
        {"validation_fraction", FLAG_DOUBLE, &o.validation_fraction,
         "held-out share of an image folder; negative: 0.2 (IDX uses its test file)"},
        {"bad_images", FLAG_STRING, &bad_images, "skip (count and report) or fail on undecodable images"},
    };
    int n = (int)(sizeof defs / sizeof defs[0]), help = 0;
    dt_error err = {0};
    if (flags_parse(defs, n, argc, argv, &help, &err)) {
        fprintf(stderr, "dtrain train: %s\n", err.msg);
        return 2;
    }
    if (help) {
        printf("usage: dtrain train --model FILE --data PATH [flags]\n\n"
               "Trains a model on this machine and prints step, loss, training and validation\n"
               "accuracy every --steps_to_validate steps, then the test accuracy.\n\nflags:\n");
        flags_print_help(stdout, defs, n);
        return 0;
    }
    if (!strcmp(bad_images, "fail")) o.fail_on_bad_images = 1;
    else if (strcmp(bad_images, "skip")) {
        fprintf(stderr, "dtrain train: --bad_images: expected skip or fail, got '%s'\n", bad_images);
        return 2;
    }
    o.epochs = epochs;
    o.progress = isatty(STDERR_FILENO);
    o.stop = &cli_stop;
    cli_install_signal_handlers();
    dt_train_result res;
    int rc = dt_train(&o, stdout, &res, &err);
    if (rc) {
        fprintf(stderr, "dtrain train: %s\n", err.msg);
        return rc == DT_EINTR ? 130 : 1;
    }
    return 0;
}
