/* dtrain: command-line front end. A thin layer over libdtrain: parse flags, call, print. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "dtrain.h"

volatile int cli_stop = 0;

static void on_signal(int sig) {
    (void)sig;
    cli_stop = 1;
}

void cli_install_signal_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

static const struct {
    const char *name;
    int (*run)(int, char **);
    const char *summary;
} commands[] = {
    {"train", cmd_train, "train a model: on this machine, or as one task of a cluster"},
    {"launch", cmd_launch, "start a whole cluster (ps and workers) on this machine"},
    {"eval", cmd_eval, "restore the newest checkpoint and print test accuracy and a confusion matrix"},
    {"predict", cmd_predict, "apply the newest checkpoint to images: one CSV line per image with class probabilities"},
    {"export", cmd_export, "write a checkpoint's model as an ONNX file for other runtimes (docs/export.md)"},
    {"plot", cmd_plot, "draw runs' cost and accuracy against the step from their event files, as SVG"},
    {"inspect", cmd_inspect, "list a checkpoint's tensors and metadata, or an event file's records"},
    {"keygen", cmd_keygen, "write a CURVE key pair for --auth=curve (docs/security.md)"},
    {"gen-clicks", cmd_gen_clicks, "write a synthetic click log (Criteo TSV) from a known model, with its Bayes-optimal AUC"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: dtrain <command> [flags]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "  %-10s %s\n\n", "version", "print the version");
    fprintf(f, "Run 'dtrain <command> --help' for a command's flags.\n");
}

/* libgomp reads its wait policy once, as it is loaded, before main runs: by default a thread that
 * has done its share of a parallel region spins up to 300000 times (about 10 ms of a core,
 * measured) waiting for the next, and on a machine whose cores are all busy those spins take the
 * cores from the thread with the work, so 2 threads ran 16-20x slower than 1 (issue 36). Nothing
 * set later takes effect (libgomp has no call for it; a setenv from a .preinit_array function is
 * undone by libc's start), so unless the user chose a policy dtrain starts itself again with
 * OMP_WAIT_POLICY=passive: a waiting thread sleeps at once. And OPENBLAS_NUM_THREADS=1: OpenBLAS
 * runs single-threaded here anyway (compute/cpu.c), and would otherwise start a pool at load. */
static void passive_wait(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    if (setenv("OMP_WAIT_POLICY", "passive", 1) || setenv("OPENBLAS_NUM_THREADS", "1", 0)) return;
    execv("/proc/self/exe", argv); /* returns only if it failed (no /proc): libgomp's default then */
}

int main(int argc, char **argv) {
    passive_wait(argv);
    /* Logs go to files and pipes (launchers, log collectors) as much as to terminals: each line
     * as it is written, not when a 4 KiB buffer fills or the process exits. stderr is unbuffered. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        if (argc > 2) {
            for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
                if (!strcmp(argv[2], commands[i].name)) {
                    char *h[] = {"--help"};
                    return commands[i].run(1, h);
                }
        }
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("dtrain %s\n", dt_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(cmd, commands[i].name)) return commands[i].run(argc - 2, argv + 2);
    fprintf(stderr, "dtrain: unknown command '%s' (run 'dtrain --help')\n", cmd);
    return 2;
}
