/* Table-driven command-line flags: `--name=value` or `--name value`, help text from the table,
 * unknown flags refused with a suggestion. Used by every dtrain subcommand. */
#ifndef DT_CLI_FLAGS_H
#define DT_CLI_FLAGS_H

#include <stdint.h>
#include <stdio.h>

#include "dtrain.h"

typedef enum { FLAG_STRING, FLAG_INT, FLAG_INT64, FLAG_UINT64, FLAG_FLOAT, FLAG_DOUBLE, FLAG_BOOL } flag_type;

typedef struct {
    const char *name;   /* without the leading dashes */
    flag_type type;
    void *value;        /* const char **, int *, int64_t *, uint64_t *, float *, double *, int * */
    const char *help;   /* one line; the default is printed from *value */
} flag_def;

/* Parses argv[0..argc) against defs. Positional arguments are refused (dtrain takes none).
 * Sets *help if --help or -h was given. */
int flags_parse(const flag_def *defs, int n_defs, int argc, char **argv, int *help, dt_error *err);
void flags_print_help(FILE *f, const flag_def *defs, int n_defs);

#endif
