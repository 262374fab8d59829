/* dtrain train: flags (the source's names where they apply) -> dt_train_options -> dt_train. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "flags.h"

/* A duration flag in seconds, at most a day, into milliseconds (at least 1 unless zero is allowed). */
static int seconds_flag(const char *name, double secs, int zero_ok, int *ms) {
    if (!(secs > 0 || (zero_ok && secs == 0)) || secs > 86400) {
        fprintf(stderr, "dtrain train: --%s must be in %s, 86400] seconds, got %g\n", name, zero_ok ? "[0" : "(0", secs);
        return -1;
    }
    *ms = (int)(secs * 1000.0 + 0.5);
    if (*ms < 1 && secs > 0) *ms = 1;
    return 0;
}

int cmd_train(int argc, char **argv) {
    dt_train_options o;
    dt_train_options_init(&o);
    const char *bad_images = "skip", *auth = "none";
    double epochs = o.epochs, connect_timeout = o.connect_timeout_ms / 1000.0, heartbeat_timeout = 60,
           ps_timeout = o.ps_timeout_ms / 1000.0, idle_timeout = o.idle_timeout_ms / 1000.0;
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
        {"ps_hosts", FLAG_STRING, &o.ps_hosts, "cluster: comma-separated host:port of the ps tasks"},
        {"worker_hosts", FLAG_STRING, &o.worker_hosts, "cluster: comma-separated host:port of the workers"},
        {"job_name", FLAG_STRING, &o.job_name, "cluster: this process's job, ps or worker"},
        {"task_index", FLAG_STRING, &o.task_index, "cluster: this process's index in its job (default 0)"},
        {"bind", FLAG_STRING, &o.bind,
         "ps: address to bind instead of its own in --ps_hosts (0.0.0.0: every IPv4 interface, [::]: every "
         "interface; behind NAT or a service address)"},
        {"issync", FLAG_INT, &o.issync, "0: asynchronous updates, 1: synchronous replicas"},
        {"replicas_to_aggregate", FLAG_INT, &o.replicas_to_aggregate,
         "sync: gradients averaged per step; 0: the number of workers"},
        {"total_num_replicas", FLAG_INT, &o.total_num_replicas,
         "sync: workers pushing (the number of workers; more than --replicas_to_aggregate: backup workers); "
         "0: --replicas_to_aggregate"},
        {"staleness", FLAG_INT, &o.staleness, "sync: steps a worker may run ahead of the slowest; 0: fully synchronous"},
        {"debug_step_delay_ms", FLAG_INT, &o.debug_step_delay_ms, "testing: sleep this long before each update"},
        {"debug_delay_worker", FLAG_INT, &o.debug_delay_worker, "testing: only this worker sleeps; -1: every worker"},
        {"debug_dump_params", FLAG_STRING, &o.debug_dump_params,
         "testing: the chief writes its final parameters to this file (raw float32)"},
        {"placement", FLAG_STRING, &o.placement, "variables over ps tasks: greedy or round_robin"},
        {"connect_timeout", FLAG_DOUBLE, &connect_timeout, "seconds a worker retries its ps tasks"},
        {"heartbeat_timeout", FLAG_DOUBLE, &heartbeat_timeout,
         "seconds a worker waits for any ps reply (a sync barrier included) before giving up naming the ps"},
        {"ps_timeout", FLAG_DOUBLE, &ps_timeout,
         "seconds a worker waits for a lost ps to come back (the chief then rolls every ps back to the newest "
         "checkpoint); 0: give up at once"},
        {"strict", FLAG_BOOL, &o.strict,
         "sync: a lost worker stops the job (default: each step waits for the live workers only)"},
        {"idle_timeout", FLAG_DOUBLE, &idle_timeout,
         "ps: seconds without any message after which it exits with an error (its chief is gone); 0: never"},
        {"dry_run", FLAG_BOOL, &o.dry_run, "print the cluster and the placement of variables, then exit"},
        {"logdir", FLAG_STRING, &o.logdir, "checkpoints: restored from at start, saved to by the chief; '' for none"},
        {"save_model_secs", FLAG_DOUBLE, &o.save_model_secs, "seconds between checkpoints (also at start and end); 0: only those"},
        {"max_to_keep", FLAG_INT, &o.max_to_keep, "checkpoints kept in --logdir; 0: all"},
        {"summary_dir", FLAG_STRING, &o.summary_dir, "TensorBoard event files in <dir>/train and <dir>/test; '' for none"},
        {"auth", FLAG_STRING, &auth, "cluster: none (trusted networks only) or curve (authenticated, encrypted)"},
        {"keys", FLAG_STRING, &o.keys, "--auth=curve: keys folder (ps: server.secret, authorized/*.key; worker: "
                                       "client.secret, server.key; see dtrain keygen)"},
    };
    int n = (int)(sizeof defs / sizeof defs[0]), help = 0;
    dt_error err = {0};
    if (flags_parse(defs, n, argc, argv, &help, &err)) {
        fprintf(stderr, "dtrain train: %s\n", err.msg);
        return 2;
    }
    if (help) {
        printf("usage: dtrain train --model FILE --data PATH [flags]\n\n"
               "Trains a model and prints step, loss, training and validation accuracy every\n"
               "--steps_to_validate steps, then the test accuracy. Alone on this machine by default;\n"
               "with --ps_hosts/--worker_hosts/--job_name/--task_index (or TF_CONFIG) as one task of\n"
               "a cluster: a ps serves its share of the variables until the chief (worker 0) ends\n"
               "training. By default the cluster's traffic is neither authenticated nor encrypted: use\n"
               "it on trusted networks only, or --auth=curve with --keys (docs/security.md).\n"
               "The chief (or the single process) restores the newest good checkpoint in --logdir and\n"
               "resumes at its global step; it saves checkpoints and TensorBoard summaries as it goes.\n\n"
               "flags:\n");
        flags_print_help(stdout, defs, n);
        return 0;
    }
    if (!strcmp(bad_images, "fail")) o.fail_on_bad_images = 1;
    else if (strcmp(bad_images, "skip")) {
        fprintf(stderr, "dtrain train: --bad_images: expected skip or fail, got '%s'\n", bad_images);
        return 2;
    }
    o.epochs = epochs;
    o.auth = auth;
    if (seconds_flag("connect_timeout", connect_timeout, 0, &o.connect_timeout_ms) ||
        seconds_flag("heartbeat_timeout", heartbeat_timeout, 0, &o.heartbeat_timeout_ms) ||
        seconds_flag("ps_timeout", ps_timeout, 1, &o.ps_timeout_ms) ||
        seconds_flag("idle_timeout", idle_timeout, 1, &o.idle_timeout_ms))
        return 2;
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
