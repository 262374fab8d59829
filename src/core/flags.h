/* Table-driven command-line flags: `--name=value` or `--name value`, help text from the table,
 * unknown flags refused with a suggestion, a flag given twice refused, and every numeric flag
 * checked against its range. Used by every dtrain subcommand, and by the library's options object
 * (dt_options_set: the same table as dtrain train's). */
#ifndef DT_CORE_FLAGS_H
#define DT_CORE_FLAGS_H

#include <stdint.h>
#include <stdio.h>

#include "dtrain.h"

typedef enum { FLAG_STRING, FLAG_INT, FLAG_INT64, FLAG_UINT64, FLAG_FLOAT, FLAG_DOUBLE, FLAG_BOOL } flag_type;

/* flag_def.open: which ends of a numeric range are excluded */
enum { FLAG_LO_OPEN = 1, FLAG_HI_OPEN = 2 };

typedef struct {
    const char *name;   /* without the leading dashes */
    flag_type type;
    void *value;        /* const char **, int *, int64_t *, uint64_t *, float *, double *, int * */
    const char *help;   /* one line; the default is printed from *value */
    /* Numeric flags: the values accepted, lo..hi (integers: exact up to 2^53; UINT64 may use
     * UINT64_MAX as hi). Every numeric flag must have one (lo < hi): a table without is refused. */
    double lo, hi;
    int open;           /* FLAG_LO_OPEN, FLAG_HI_OPEN: that end is excluded */
} flag_def;

/* Table entries: a string or boolean flag; a numeric flag with its range lo..hi, `open` saying which
 * ends are excluded (0: none). */
#define FLAG_TEXT(name, value, help) {(name), FLAG_STRING, (value), (help), 0, 0, 0}
#define FLAG_SWITCH(name, value, help) {(name), FLAG_BOOL, (value), (help), 0, 0, 0}
#define FLAG_NUM(name, type, value, help, lo, hi, open) {(name), (type), (value), (help), (lo), (hi), (open)}

/* The flags of a command that restores a checkpoint for inference (eval, predict: restore.h). */
#define FLAGS_RESTORE(logdir, file, model, batch_size, threads, device)                                           \
    FLAG_TEXT("logdir", (logdir), "folder of checkpoints; the newest good one is restored"),                      \
        FLAG_TEXT("checkpoint", (file), "use this checkpoint file instead of the newest in --logdir"),             \
        FLAG_TEXT("model", (model), "model file; default: the model stored in the checkpoint"),                  \
        FLAG_NUM("batch_size", FLAG_INT, (batch_size), "examples per forward pass; 0: the training batch size", 0, \
                 65536, 0),                                                                                         \
        FLAG_NUM("threads", FLAG_INT, (threads), "compute threads (at most the cores there are); 0: all cores", 0, \
                 1024, 0),                                                                                          \
        FLAG_TEXT("device", (device), "where to compute: cpu, cuda or cuda:N (a CUDA build; docs/gpu.md)")

/* Parses argv[0..argc) against defs. Positional arguments are refused, and so
 * is a flag given twice. Sets *help if --help or -h was given. */
int flags_parse(const flag_def *defs, int n_defs, int argc, char **argv, int *help, dt_error *err);
/* The same for a command that takes arguments besides its flags (dtrain predict's images, dtrain
 * plot's runs): they go to args (room for argc entries, pointers into argv) in order, *n_args
 * counting them; everything after a lone "--" is an argument. */
int flags_parse_args(const flag_def *defs, int n_defs, int argc, char **argv, int *help, char **args, int *n_args,
                     dt_error *err);
/* One flag by name (without dashes), value as on the command line; setting it again replaces it
 * (a binding's setter). Strings are not copied: value must outlive the table's target. */
int flags_set(const flag_def *defs, int n_defs, const char *name, const char *value, dt_error *err);
/* A flag's current value as text into out (a string flag never set: ""). */
int flags_get(const flag_def *defs, int n_defs, const char *name, char *out, size_t cap, dt_error *err);
void flags_print_help(FILE *f, const flag_def *defs, int n_defs);

#endif
