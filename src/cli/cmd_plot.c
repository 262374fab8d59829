/* dtrain plot: training and validation cost and accuracy against the global step, read from the
 * TensorBoard event files of one or more runs (their --summary_dir), drawn as one SVG picture with
 * the runs overlaid and named in a legend: a look at a run without TensorBoard. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "core/error.h"
#include "core/flags.h"
#include "plot/curves.h"
#include "plot/svg.h"
#include "io/fsutil.h"

/* A run's name: NAME in "NAME=DIR" (unless the whole argument is a folder), else the folder as
 * given, without trailing slashes and without a last "/summary_log" (the default folder's name,
 * which every run shares). */
static void split_run(const char *arg, char *name, size_t name_cap, char *dir, size_t dir_cap) {
    struct stat st;
    const char *eq = strchr(arg, '=');
    if (eq && eq != arg && !(stat(arg, &st) == 0 && S_ISDIR(st.st_mode))) {
        snprintf(name, name_cap, "%.*s", (int)(eq - arg), arg);
        snprintf(dir, dir_cap, "%s", eq + 1);
        return;
    }
    snprintf(dir, dir_cap, "%s", arg);
    snprintf(name, name_cap, "%s", arg);
    size_t l = strlen(name);
    while (l > 1 && name[l - 1] == '/') name[--l] = 0;
    static const char tail[] = "summary_log";
    size_t t = sizeof tail - 1;
    if (l > t && !strcmp(name + l - t, tail) && name[l - t - 1] == '/') name[l - t - 1] = 0;
}

int cmd_plot(int argc, char **argv) {
    const char *out = "plot.svg", *title = NULL;
    flag_def defs[] = {
        FLAG_TEXT("out", &out, "the SVG file to write"),
        FLAG_TEXT("title", &title, "the picture's title (default: cost and accuracy against the global step)"),
    };
    int n = (int)(sizeof defs / sizeof defs[0]), help = 0, n_runs = 0;
    dt_error err = {0};
    char **args = calloc(argc > 0 ? (size_t)argc : 1, sizeof *args);
    if (!args) {
        fprintf(stderr, "dtrain plot: out of memory\n");
        return 1;
    }
    if (flags_parse_args(defs, n, argc, argv, &help, args, &n_runs, &err)) {
        fprintf(stderr, "dtrain plot: %s\n", err.msg);
        free(args);
        return 2;
    }
    if (help) {
        printf("usage: dtrain plot [--out FILE.svg] [NAME=]DIR...\n\n"
               "Reads the TensorBoard event files of each run's summary folder DIR (the --summary_dir of\n"
               "dtrain train: DIR/train and DIR/test) and draws the training (solid) and validation\n"
               "(dashed) cost and accuracy against the global step, the runs overlaid in colours named\n"
               "in a legend (NAME, or DIR without a last /summary_log). Writes SVG; any browser shows it.\n\n"
               "flags:\n");
        flags_print_help(stdout, defs, n);
        free(args);
        return 0;
    }
    int status = 1, loaded = 0;
    dt_run_curves *runs = NULL;
    char *svg = NULL;
    size_t len = 0;
    size_t ol = strlen(out);
    if (ol < 4 || strcmp(out + ol - 4, ".svg")) {
        dt_errorf(&err, DT_EINVAL, "--out %s: dtrain plot writes SVG; name the file *.svg", out);
        goto done;
    }
    if (n_runs == 0) {
        dt_errorf(&err, DT_EINVAL, "no run given (dtrain plot [NAME=]DIR..., DIR a --summary_dir)");
        goto done;
    }
    if (!(runs = dt_calloc((size_t)n_runs, sizeof *runs, "runs", &err))) goto done;
    for (; loaded < n_runs; loaded++) {
        char name[256], dir[DT_PATH_MAX];
        split_run(args[loaded], name, sizeof name, dir, sizeof dir);
        if (dt_curves_read(&runs[loaded], name, dir, stderr, &err)) goto done;
        if (runs[loaded].non_finite)
            fprintf(stderr, "dtrain plot: warning: %s: %zu NaN or infinite values left out\n", dir,
                    runs[loaded].non_finite);
    }
    if (dt_plot_svg(&svg, &len, runs, n_runs, title, &err) || dt_atomic_write_file(out, svg, len, &err)) goto done;
    size_t points = 0;
    for (int r = 0; r < n_runs; r++)
        for (int s = 0; s < 2; s++)
            for (int t = 0; t < 2; t++) points += runs[r].s[s][t].n;
    fprintf(stderr, "dtrain plot: wrote %s (%d run%s, %zu points)\n", out, n_runs, n_runs == 1 ? "" : "s", points);
    status = 0;
done:
    if (status) fprintf(stderr, "dtrain plot: %s\n", err.msg);
    for (int r = 0; runs && r < loaded; r++) dt_curves_free(&runs[r]);
    free(runs);
    free(svg);
    free(args);
    return status;
}
