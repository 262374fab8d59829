/* Checkpoints of a training run (docs/checkpoint-format.md): a net's parameters, its optimizer's
 * state and the global step, in one safetensors file `<logdir>/model.ckpt-<step>.safetensors`, with
 * the `checkpoint` index beside it. This layer knows the tensor names (one per parameter view, one
 * per optimizer slot of each view, `global_step`) and the metadata keys; the file format, the
 * checksum, atomic writes and the index are the layers below (safetensors.h, ckpt_index.h).
 *
 * Training state is exchanged in the net's flat layout whatever the cluster looks like:
 *   params [n]          the flat parameter buffer (dt_net_params);
 *   state  [slots * n]  slot-major over the flat buffer: slot k of flat float i at state[k*n + i]
 *                       (the local optimizer's own layout; a ps shard's state maps to it slot by
 *                       slot with dt_placement_scatter). */
#ifndef DT_SUPERVISOR_CHECKPOINT_H
#define DT_SUPERVISOR_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "compute/lazy_optim.h"
#include "compute/optim.h"
#include "dtrain.h"
#include "model/net.h"
#include "supervisor/ckpt_index.h"
#include "io/safetensors.h"

#define DT_CKPT_STEP_TENSOR "global_step"
/* Dynamic data sharding: the work coordinator's state (docs/elastic.md, "Checkpoints"), a U8
 * vector of at most DT_CKPT_MAX_COORD_BYTES (the largest state: 2^18 units, each partly trained). */
#define DT_CKPT_COORD_TENSOR "elastic/coordinator"
#define DT_CKPT_MAX_COORD_BYTES 3178568u

struct dt_ckpt_sink;

/* What a run is, for the metadata of its checkpoints and to check a checkpoint fits it. */
typedef struct {
    const dt_net *net;              /* variables (views) and the model spec (its text is stored) */
    const dt_opt_config *opt;       /* NULL: parameters only (saving then stores no slots) */
    /* The embedding tables' optimizer (one process: update/local.c; a cluster: the ps tasks'); NULL:
     * opt trains them too. A table's slots are then its own, named by dt_ckpt_table_slot_name. */
    const dt_lazy_config *tables;
    uint64_t seed;                  /* everything random derives from it (core/rng.h) */
    int batch_size;                 /* per worker */
    int n_workers;                  /* 1 on a single machine */
    int sync;                       /* sync replicas: every worker takes one batch per global step */
    int64_t batches_per_epoch;      /* per worker */
    double validation_fraction;     /* as given (< 0: the data layer's default) */
    char *const *class_names;       /* [n_class_names] the data's names of classes 0.., recorded for
                                       dtrain predict; NULL (0): numbered only, nothing recorded */
    int n_class_names;
    /* Dynamic data sharding: the work coordinator's state at this save (the supervisor sets it
     * from the snapshot), saved as DT_CKPT_COORD_TENSOR; NULL: none. */
    const uint8_t *coord;
    size_t coord_len;
    /* A compact net's tables (model/net.h: a cluster's, whose rows live on the ps tasks): saved as one
     * process saves its tables, [rows, dim] and the slots of `tables` (which must be set), every row
     * written by table_rows through the sink (dt_ckpt_put_range, dt_ckpt_put_row; a row it does not
     * write holds zeros); restored by the caller (dt_ckpt_read_rows), dt_ckpt_load leaves the blocks. */
    int (*table_rows)(void *user, struct dt_ckpt_sink *sink, int64_t global_step, dt_error *err);
    /* Tables of unbounded ids (dt_net_table_rows 0) are saved as the rows the ps tasks hold: their ids
     * "<table>/ids" U64 [held], the rows [held, dim] and slots. table_prepare, called before the file
     * is begun, sets held[t] for each (the rows table_rows will then write: dt_ckpt_put_ids and
     * dt_ckpt_put_range over [0, held)); it may keep a spool in logdir meanwhile. */
    int (*table_prepare)(void *user, const char *logdir, uint64_t *held, dt_error *err);
    void *table_user;
} dt_ckpt_run;

/* Where table_rows writes a checkpoint's table rows: rows [first, first + n) of table t (rows
 * [n][(1 + slots) dim], each its values then its slots, as ps/table.h exports them), or row id. */
typedef struct dt_ckpt_sink dt_ckpt_sink;
int dt_ckpt_put_range(dt_ckpt_sink *s, int t, uint64_t first, size_t n, const float *rows, dt_error *err);
int dt_ckpt_put_row(dt_ckpt_sink *s, int t, uint64_t id, const float *row, dt_error *err);
/* An unbounded table's ids [first, first + n) (those of its rows at the same places). */
int dt_ckpt_put_ids(dt_ckpt_sink *s, int t, uint64_t first, size_t n, const uint64_t *ids, dt_error *err);
/* The rows a checkpoint that fits run holds of unbounded table t (its ids' length); DT_EINVAL for a
 * bounded table. dt_ckpt_read_ids: its ids [first, first + n) into ids [n]; its rows and slots are
 * read by dt_ckpt_read_rows, at the same places. */
#define DT_CKPT_MAX_HELD_ROWS (UINT64_C(1) << 40)
int dt_ckpt_held_rows(const dt_st_file *f, const dt_ckpt_run *run, int t, uint64_t *rows);
int dt_ckpt_read_ids(const dt_st_file *f, const char *label, const dt_ckpt_run *run, int t, uint64_t first, size_t n,
                     uint64_t *ids, dt_error *err);
/* Rows [first, first + n) of table t of a checkpoint that fits run (dt_ckpt_check_fits), into rows
 * [n][(1 + slots) dim] (values, then run->tables' slots), read from the file piece by piece. */
int dt_ckpt_read_rows(const dt_st_file *f, const char *label, const dt_ckpt_run *run, int t, uint64_t first, size_t n,
                      float *rows, dt_error *err);

/* The metadata of a checkpoint, parsed (fields from files without them keep the defaults shown). */
typedef struct {
    char optimizer[16];             /* "" when absent */
    float learning_rate;            /* 0 */
    uint64_t seed;                  /* 0; has_seed says whether it was there */
    int has_seed;
    int batch_size, n_workers;      /* 0 */
    int64_t batches_per_epoch;      /* 0 */
    double validation_fraction;     /* -1 */
    int64_t global_step;            /* the global_step tensor; -1 if absent */
    char table_optimizer[16];       /* the embedding tables' ("tables" in "optimizer"); "" when absent */
    float table_learning_rate;      /* 0 */
    float table_initial_accumulator; /* adagrad, ftrl; 0 */
} dt_ckpt_info;

/* Slot tensor name suffix of optimizer slot k ("momentum"; "adam_m", "adam_v"). */
const char *dt_ckpt_slot_name(dt_opt_kind kind, int slot);

/* The tables' slot names: "adagrad_accumulator"; "ftrl_accumulator", "ftrl_linear"; LazyAdam's
 * "adam_m", "adam_v" (the moments of dense adam). */
const char *dt_ckpt_table_slot_name(dt_lazy_kind kind, int slot);

/* Slots per float of the flat state layout (above) for a run: the most slots of any variable's
 * optimizer (run->opt's, or run->tables' for a table). A variable with fewer leaves the rest of its
 * floats' slots unused. */
int dt_ckpt_state_slots(const dt_ckpt_run *run);

/* "model.ckpt-<step>.safetensors" into out. */
void dt_ckpt_file_name(char *out, size_t cap, int64_t global_step);

/* Writes <logdir>/model.ckpt-<step>.safetensors (atomic; logdir created with its parents), then the
 * index naming it as the newest, then deletes the files that retention (max_to_keep, <= 0: keep
 * all) dropped; in that order, so the index never names an incomplete file. Before adding it, the
 * index adopts the regular checkpoint files of logdir newer than its newest that it does not list
 * (left by an earlier save whose index write failed), so retention deletes them in their turn.
 * Entries the index's path rule ignores (ckpt_index.h) get a warning and are left out; an index that
 * cannot be parsed is replaced by one built from the folder's checkpoint files (a warning). log may
 * be NULL. global_step: 0 to DT_CKPT_MAX_STEP. params [n], state [slots * n] (NULL if run->opt is
 * NULL or has no slots). name_out (may be NULL) receives the file's name. */
int dt_ckpt_save(const char *logdir, const dt_ckpt_run *run, const float *params, const float *state,
                 int64_t global_step, int max_to_keep, FILE *log, char *name_out, size_t name_cap,
                 dt_error *err);

/* Opens the newest checkpoint of logdir that reads back whole, passes its checksum and holds a
 * possible global_step (an I64 scalar from 0 to DT_CKPT_MAX_STEP, the step of its file name).
 * Candidates: the checkpoint files of logdir that the index does not list and that are newer than its
 * newest (a save whose index write failed; "checkpoint: X is newer than the index's newest (Y);
 * using it" on log when one is used), highest step first, then the index's entries, newest first;
 * without a readable index (a warning if it is damaged), every model.ckpt-<step>.safetensors file
 * of logdir, highest step first. Entries the index's path rule ignores get one warning each and are
 * never opened; a symbolic link is never followed. A candidate that is missing, truncated, fails its
 * checksum, holds an impossible step or a NaN or infinity in a float tensor (naming the tensor and
 * the index) gets a warning on log naming it and why, and the one before it
 * is tried. Returns 1 with *out open and its path in path_out; 0 when logdir holds no checkpoint (or
 * does not exist); DT_EFORMAT when there are checkpoints but none is usable (naming them). Writes
 * nothing (eval and inspect use it too). */
int dt_ckpt_open_latest(dt_st_file **out, char *path_out, size_t path_cap, const char *logdir, FILE *log,
                        dt_error *err);

/* As dt_ckpt_open_latest, with check (may be NULL) run on each candidate as soon as its header is
 * read, before its data (dt_st_open_ex): with dt_ckpt_fits_check and a run, a file of another model
 * (or one claiming tensors larger than the model's) is refused without reading its data. A refusal by
 * check is not damage: it ends the search with check's error (no older checkpoint is tried). */
int dt_ckpt_open_latest_for(dt_st_file **out, char *path_out, size_t path_cap, const char *logdir,
                            dt_st_check_fn check, void *ctx, FILE *log, dt_error *err);
/* dt_ckpt_check_fits as a dt_st_check_fn: run is a const dt_ckpt_run *. */
int dt_ckpt_fits_check(const dt_st_file *f, const char *label, void *run, dt_error *err);

/* The chief, after restoring checkpoint `name` of logdir (dt_ckpt_open_latest's choice), puts the
 * index right at once rather than at the next save: name becomes its newest, the newer checkpoint
 * files it did not list are added (as dt_ckpt_save does), and the entries its path rule ignored are
 * dropped. Nothing is deleted (retention waits for the next save), nothing is written when the index
 * already says this, and the warnings dt_ckpt_open_latest gave about the index are not repeated. */
int dt_ckpt_adopt(const char *logdir, const char *name, FILE *log, dt_error *err);

/* The work coordinator's state an open checkpoint holds: *out (allocated, the caller frees it)
 * and its size; *out NULL when there is none. A tensor of that name that is not a U8 vector of 1
 * to DT_CKPT_MAX_COORD_BYTES is refused (DT_EFORMAT, naming label); its bytes are checked whole
 * where they are used (ps/coord.h's dt_coord_load). */
int dt_ckpt_read_coord(const dt_st_file *f, const char *label, uint8_t **out, size_t *len, dt_error *err);

/* Parses the metadata and global step of an open checkpoint. Fails (naming label) only on
 * malformed values; missing keys keep the defaults. */
int dt_ckpt_read_info(const dt_st_file *f, const char *label, dt_ckpt_info *info, dt_error *err);

/* The checks of dt_ckpt_load that need only the tensor table, not the data: run's variables with
 * their dtypes and shapes, no other tensor but global_step (checked apart, as damage) and optimizer
 * slots of their variable's size, and, if run->opt has slots, every slot of that optimizer. */
int dt_ckpt_check_fits(const dt_st_file *f, const char *label, const dt_ckpt_run *run, dt_error *err);

/* Checks that the checkpoint holds exactly run's variables (names, dtypes, shapes) and, if run->opt
 * has slots, that optimizer's state, then copies them: params [n] (views' offsets), state
 * [slots * n] (may be NULL to skip), *global_step (may be NULL). A checkpoint of another model is
 * refused with a message saying what differs (the first few variables, and the model text's first
 * differing line); one of another optimizer says which. label names the file in messages. */
int dt_ckpt_load(const dt_st_file *f, const char *label, const dt_ckpt_run *run, float *params, float *state,
                 int64_t *global_step, dt_error *err);

/* Zeroes the optimizer slots of the variables that are not trained (batch norm's moving statistics)
 * in state [slots * n] (the flat layout dt_ckpt_load fills): the optimizer never writes them
 * (compute/optim.h, dt_opt_skip), but a sync cluster's checkpoint from before dtrain skipped them
 * holds what their pushed changes built (issue 27), which a resumed run must not apply. Returns how
 * many floats were not 0 already (the caller says so once). */
size_t dt_ckpt_clear_untrained_slots(const dt_ckpt_run *run, float *state);

/* The class names a checkpoint records (metadata "classes", docs/checkpoint-format.md): *names
 * [*n] (malloc'ed, free each and the array), *n = 0 and NULL when it records none (older
 * checkpoints, IDX data). A value that is not a JSON array of 1 to max_classes distinct non-empty
 * strings of at most DT_CKPT_MAX_CLASS_NAME bytes without control characters is refused naming
 * label. */
#define DT_CKPT_MAX_CLASS_NAME 255
/* names [n] as the JSON array checkpoints record (also the ONNX export's "classes"): a malloc'd
 * string, NULL when out of memory or a name is not UTF-8. */
char *dt_ckpt_classes_json(char *const *names, int n);
int dt_ckpt_read_classes(const dt_st_file *f, const char *label, int max_classes, char ***names, int *n,
                         dt_error *err);

/* The model file text stored in the checkpoint (NULL if absent). */
const char *dt_ckpt_model_text(const dt_st_file *f);

#endif
