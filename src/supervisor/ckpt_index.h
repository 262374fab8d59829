/* The checkpoint index, `<logdir>/checkpoint`, in TensorFlow's text format (a CheckpointState):
 *   model_checkpoint_path: "model.ckpt-1200.safetensors"
 *   all_model_checkpoint_paths: "model.ckpt-800.safetensors"
 *   all_model_checkpoint_paths: "model.ckpt-1200.safetensors"
 * one all_model_checkpoint_paths line per kept checkpoint, oldest first, the newest also last; paths
 * relative to logdir. The parser also accepts what TensorFlow writes (timestamps, comments, single
 * quotes, escapes) and refuses anything else naming the line. Writes are atomic, so the index never
 * names a file the caller has not finished writing: save the checkpoint, then write the index, then
 * delete the files retention dropped. */
#ifndef DT_SUPERVISOR_CKPT_INDEX_H
#define DT_SUPERVISOR_CKPT_INDEX_H

#include <stddef.h>

#include "dtrain.h"

#define DT_CKPT_INDEX_FILE "checkpoint"
#define DT_CKPT_MAX_TO_KEEP 5               /* TensorFlow's Saver default */
#define DT_CKPT_INDEX_MAX_BYTES ((size_t)1 << 20)
#define DT_CKPT_MAX_PATHS 10000

typedef struct {
    char *model_checkpoint_path;   /* the newest; NULL when the index is empty */
    char **paths;                  /* all kept checkpoints, oldest first; the newest is last */
    int n_paths;
} dt_ckpt_index;

/* Parses index text; label (the file name) prefixes messages, "label:LINE: ...". The newest path is
 * made the last entry of paths (added if missing), as TensorFlow does when it writes the index. */
int dt_ckpt_index_parse(dt_ckpt_index *out, const char *text, size_t len, const char *label, dt_error *err);
/* Reads <logdir>/checkpoint; a missing file gives 0 and an empty index. */
int dt_ckpt_index_read(dt_ckpt_index *out, const char *logdir, dt_error *err);
/* Text of the index (malloc'd, NUL-terminated). Refuses an empty index and absolute paths. */
int dt_ckpt_index_format(const dt_ckpt_index *idx, char **text, dt_error *err);
/* Writes <logdir>/checkpoint atomically (temporary file, fsync, rename, fsync of logdir). */
int dt_ckpt_index_write(const dt_ckpt_index *idx, const char *logdir, dt_error *err);
void dt_ckpt_index_free(dt_ckpt_index *idx);

/* Retention: makes path the newest checkpoint (moved to the end if already listed) and removes the
 * oldest entries beyond max_to_keep (<= 0 keeps all). The removed names, oldest first, are handed to
 * the caller in *dropped (free with dt_ckpt_free_paths): delete those files only after the new index
 * is written. */
int dt_ckpt_index_add(dt_ckpt_index *idx, const char *path, int max_to_keep, char ***dropped, int *n_dropped,
                      dt_error *err);
void dt_ckpt_free_paths(char **paths, int n);

#endif
