/* Folder listing and path joining shared by the data module's files (dataset.c, inputs.c). */
#ifndef DT_DATA_LISTING_H
#define DT_DATA_LISTING_H

#include <stddef.h>

#include "dtrain.h"

/* "dir/name" (malloc'ed; name alone when dir is ""). */
char *dt_data_path_join(const char *dir, const char *name, dt_error *err);

/* Sorted (byte order) names of the non-hidden entries of dir that are folders (want_dirs) or
 * regular files; entries that cannot be looked at (a dangling or looping link) count as files, so
 * reading them makes them bad images rather than silently missing. Free each name and the array. */
int dt_data_list_dir(char ***names, size_t *count, const char *dir, int want_dirs, dt_error *err);

#endif
