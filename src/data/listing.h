/* Folder listing shared by the data module's files (dataset.c, inputs.c); paths are joined with
 * io/fsutil.h's dt_path_join_dup. */
#ifndef DT_DATA_LISTING_H
#define DT_DATA_LISTING_H

#include <stddef.h>

#include "dtrain.h"

/* The status of a dt_path_join_dup that returned NULL: too long (err says so) or out of memory. */
#define JOIN_FAILED(err) ((err) && (err)->code ? (err)->code : DT_ENOMEM)

/* Sorted (byte order) names of the non-hidden entries of dir that are folders (want_dirs) or
 * regular files; entries that cannot be looked at (a dangling or looping link) count as files, so
 * reading them makes them bad images rather than silently missing. Free each name and the array. */
int dt_data_list_dir(char ***names, size_t *count, const char *dir, int want_dirs, dt_error *err);

#endif
