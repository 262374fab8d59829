/* The checkpoint index, `<logdir>/checkpoint`, in TensorFlow's text format (a CheckpointState):
 *   model_checkpoint_path: "model.ckpt-1200.safetensors"
 *   all_model_checkpoint_paths: "model.ckpt-800.safetensors"
 *   all_model_checkpoint_paths: "model.ckpt-1200.safetensors"
 * one all_model_checkpoint_paths line per kept checkpoint, oldest first, the newest also last. The
 * parser also accepts what TensorFlow writes (timestamps, comments, single quotes, escapes) and
 * refuses anything else naming the line. Writes are atomic, so the index never names a file the
 * caller has not finished writing: save the checkpoint, then write the index, then delete the files
 * retention dropped.
 *
 * The path rule: an entry must be a checkpoint file name, model.ckpt-<step>.safetensors, with no
 * folder in it (no '/', so no "..", no absolute path). Everything that reads the index or deletes
 * what it names (restore, eval, inspect, retention) goes through this parser, so a hostile or
 * hand-edited index can make dtrain open or delete only checkpoint files directly in the log folder.
 * Other entries are ignored, with one warning each (dt_ckpt_index.ignored), and dropped when the
 * index is next written. Symbolic links are the reader's and the deleter's business
 * (checkpoint.c): never followed. */
#ifndef DT_SUPERVISOR_CKPT_INDEX_H
#define DT_SUPERVISOR_CKPT_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain.h"

#define DT_CKPT_INDEX_FILE "checkpoint"
#define DT_CKPT_PREFIX "model.ckpt-"
#define DT_CKPT_SUFFIX ".safetensors"
/* The largest step a checkpoint may hold or be named by: 18 decimal digits, so the name's step and
 * step + 1 never overflow an int64. */
#define DT_CKPT_MAX_STEP 999999999999999999LL
#define DT_CKPT_MAX_IGNORED 8               /* warnings kept per parse; more are counted in one line */
#define DT_CKPT_MAX_TO_KEEP 5               /* TensorFlow's Saver default */
#define DT_CKPT_INDEX_MAX_BYTES ((size_t)1 << 20)
#define DT_CKPT_MAX_PATHS 10000

typedef struct {
    char *model_checkpoint_path;   /* the newest; NULL when the index is empty */
    char **paths;                  /* all kept checkpoints, oldest first; the newest is last */
    int n_paths;
    char **ignored;                /* warnings, one per distinct path the rule refused (the first
                                    * DT_CKPT_MAX_IGNORED, then one line counting the rest):
                                    * "LABEL:LINE: ignoring checkpoint path \"...\": why" */
    int n_ignored;
} dt_ckpt_index;

/* The step a checkpoint file name stands for, or -1 if name is not one: "model.ckpt-<step>.safetensors"
 * exactly, <step> in decimal without sign or leading zero ("0" itself is fine), at most
 * DT_CKPT_MAX_STEP. One spelling per step, the one dt_ckpt_file_name writes. */
int64_t dt_ckpt_name_step(const char *name);

/* Parses index text; label (the file name) prefixes messages, "label:LINE: ...". Entries that break
 * the path rule are left out, each noted in ignored. The newest path is made the last entry of paths
 * (added if missing), as TensorFlow does when it writes the index; if model_checkpoint_path itself
 * is ignored, the last accepted list entry is the newest, and with none accepted the index is empty
 * (model_checkpoint_path NULL, no paths: as if there were no index). */
int dt_ckpt_index_parse(dt_ckpt_index *out, const char *text, size_t len, const char *label, dt_error *err);
/* Reads <logdir>/checkpoint; a missing file gives 0 and an empty index. */
int dt_ckpt_index_read(dt_ckpt_index *out, const char *logdir, dt_error *err);
/* Text of the index (malloc'd, NUL-terminated). Refuses an empty index and paths the rule refuses. */
int dt_ckpt_index_format(const dt_ckpt_index *idx, char **text, dt_error *err);
/* Writes <logdir>/checkpoint atomically (temporary file, fsync, rename, fsync of logdir). */
int dt_ckpt_index_write(const dt_ckpt_index *idx, const char *logdir, dt_error *err);
void dt_ckpt_index_free(dt_ckpt_index *idx);

/* Retention: makes path (a name the path rule accepts, else DT_EINVAL) the newest checkpoint (moved
 * to the end if already listed) and removes the oldest entries beyond max_to_keep (<= 0 keeps all).
 * The removed names, oldest first, are handed to the caller in *dropped (free with
 * dt_ckpt_free_paths): delete those files only after the new index is written. */
int dt_ckpt_index_add(dt_ckpt_index *idx, const char *path, int max_to_keep, char ***dropped, int *n_dropped,
                      dt_error *err);
void dt_ckpt_free_paths(char **paths, int n);

#endif
