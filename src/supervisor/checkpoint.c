#include "supervisor/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/finite.h"
#include "supervisor/ckpt_index.h"
#include "io/bytes.h"
#include "io/fsutil.h"
#include "update/updater.h"

#define MAX_SLOTS 2
#define NAME_CAP 80 /* a view name (< 48) + "/" + a slot name */

const char *dt_ckpt_slot_name(dt_opt_kind kind, int slot) {
    static const char *const momentum[] = {"momentum"}, *const adam[] = {"adam_m", "adam_v"};
    if (kind == DT_OPT_MOMENTUM && slot == 0) return momentum[0];
    if (kind == DT_OPT_ADAM && slot >= 0 && slot < 2) return adam[slot];
    return "?";
}

void dt_ckpt_file_name(char *out, size_t cap, int64_t global_step) {
    snprintf(out, cap, DT_CKPT_PREFIX "%" PRId64 DT_CKPT_SUFFIX, global_step);
}

const char *dt_ckpt_table_slot_name(dt_lazy_kind kind, int slot) {
    static const char *const adagrad[] = {"adagrad_accumulator"}, *const ftrl[] = {"ftrl_accumulator", "ftrl_linear"};
    if (kind == DT_LAZY_ADAGRAD && slot == 0) return adagrad[0];
    if (kind == DT_LAZY_FTRL && slot >= 0 && slot < 2) return ftrl[slot];
    if (kind == DT_LAZY_ADAM) return dt_ckpt_slot_name(DT_OPT_ADAM, slot);
    return "?";
}

/* The slots of a variable (update/updater.h, the updaters' count) and their names: the tables'
 * optimizer's for a table (when the run has one), run->opt's otherwise; none without run->opt. */
static int view_slots(const dt_ckpt_run *run, const dt_param_view *pv) {
    return dt_view_state_slots(pv, run->opt, run->tables);
}

static void slot_tensor_name(char *out, const dt_ckpt_run *run, const dt_param_view *pv, int k) {
    snprintf(out, NAME_CAP, "%s/%s", pv->name,
             pv->table && run->tables ? dt_ckpt_table_slot_name(run->tables->kind, k)
                                      : dt_ckpt_slot_name(run->opt->kind, k));
}

/* A compact net's table (model/net.h): its rows live elsewhere (a cluster's ps tasks). It is saved in
 * the table's own shape [rows, dim], as one process saves it, from run->table_rows, and restored by
 * the caller (dt_ckpt_read_rows), not into the block. */
static int remote_table(const dt_ckpt_run *run, const dt_param_view *pv) {
    return pv->table && dt_net_compact_tables(run->net);
}

/* A remote table of unbounded ids (model/net.h: dt_net_table_rows 0): saved as the rows the ps tasks
 * hold, [held, dim] and its slots, with their ids "<table>/ids" U64 [held]. */
static int unbounded_table(const dt_ckpt_run *run, int v) {
    return remote_table(run, dt_net_view(run->net, v)) && dt_net_table_rows(run->net, dt_net_view_table(run->net, v)) == 0;
}

/* The ids tensor of an unbounded table in file f: a U64 vector; NULL if there is none such. */
static const dt_st_info *held_ids(const dt_st_file *f, const dt_param_view *pv) {
    char name[NAME_CAP];
    snprintf(name, sizeof name, "%s/ids", pv->name);
    const dt_st_info *ti = f ? dt_st_find(f, name) : NULL;
    return ti && ti->dtype == DT_ST_U64 && ti->ndim == 1 ? ti : NULL;
}

/* The shape view v has in a checkpoint (its own; a remote table's [rows, dim]; an unbounded table's
 * [held, dim], held from the save's counts or from file f's ids) into shape [4], and its elements. */
static uint64_t saved_shape(const dt_ckpt_run *run, int v, int64_t *shape, const dt_st_file *f, const uint64_t *held) {
    const dt_param_view *pv = dt_net_view(run->net, v);
    uint64_t count = 1;
    for (int d = 0; d < pv->ndim; d++) shape[d] = pv->shape[d];
    if (remote_table(run, pv)) shape[0] = dt_net_table_rows(run->net, dt_net_view_table(run->net, v));
    if (unbounded_table(run, v)) {
        const dt_st_info *ids = held_ids(f, pv);
        shape[0] = held ? (int64_t)held[dt_net_view_table(run->net, v)] : ids ? (int64_t)ids->count : 0;
    }
    for (int d = 0; d < pv->ndim; d++) count *= (uint64_t)shape[d];
    return count;
}

int dt_ckpt_state_slots(const dt_ckpt_run *run) { return dt_state_slots(run->net, run->opt, run->tables); }

/* ---- Metadata ------------------------------------------------------------------------------- */

/* JSON text of obj (malloc'd), consuming obj. */
static char *dump(json_t *obj) {
    char *s = obj ? json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(obj);
    return s;
}

/* The tables' optimizer, for the record (docs/checkpoint-format.md): its name and hyperparameters. */
static json_t *tables_json(const dt_lazy_config *t) {
    json_t *j = json_pack("{s:s, s:f}", "name", dt_lazy_name(t->kind), "learning_rate", (double)t->learning_rate);
    if (j && (t->kind == DT_LAZY_ADAGRAD || t->kind == DT_LAZY_FTRL))
        json_object_set_new(j, "initial_accumulator", json_real(t->initial_accumulator));
    if (j && t->kind == DT_LAZY_FTRL) {
        json_object_set_new(j, "l1", json_real(t->l1));
        json_object_set_new(j, "l2", json_real(t->l2));
        json_object_set_new(j, "lr_power", json_real(t->lr_power));
    }
    return j;
}

static char *optimizer_json(const dt_opt_config *o, const dt_lazy_config *tables) {
    json_t *j = json_pack("{s:s, s:f}", "name", dt_opt_name(o->kind), "learning_rate", (double)o->learning_rate);
    if (j && tables) json_object_set_new(j, "tables", tables_json(tables));
    if (j && o->kind == DT_OPT_MOMENTUM) json_object_set_new(j, "momentum", json_real(o->momentum));
    if (j && o->kind == DT_OPT_ADAM) {
        json_object_set_new(j, "beta1", json_real(o->beta1));
        json_object_set_new(j, "beta2", json_real(o->beta2));
        json_object_set_new(j, "epsilon", json_real(o->epsilon));
    }
    return dump(j);
}

/* Where the data stream stands after global_step updates: each worker has consumed about
 * global_step / n_workers batches of its shard when asynchronous (exactly that on one machine),
 * global_step with sync replicas. */
static char *data_position_json(const dt_ckpt_run *run, int64_t global_step) {
    int n = run->n_workers > 0 ? run->n_workers : 1;
    int64_t batches = run->sync ? global_step : global_step / n, per = run->batches_per_epoch;
    json_t *j = json_pack("{s:I, s:I, s:I, s:I, s:i, s:i, s:b, s:f}", "batches_per_worker", (json_int_t)batches,
                          "epoch", (json_int_t)(per > 0 ? batches / per : 0), "batch_in_epoch",
                          (json_int_t)(per > 0 ? batches % per : batches), "batches_per_epoch", (json_int_t)per,
                          "batch_size", run->batch_size, "workers", n, "sync", run->sync ? 1 : 0,
                          "validation_fraction",
                          run->validation_fraction);
    return dump(j);
}

/* dtrain draws nothing from a running generator: initialisation, shuffles and dropout masks are
 * functions of (seed, counter), so the seed and the data position are the whole RNG state. */
static char *rng_json(const dt_ckpt_run *run) {
    char seed[24];
    snprintf(seed, sizeof seed, "%" PRIu64, run->seed);
    json_t *j = json_pack("{s:s, s:s}", "seed", seed, "scheme",
                          "counter-based: init (seed, variable), shuffle (seed, epoch), dropout (seed, "
                          "batch number); resumes from the data position");
    return dump(j);
}

char *dt_ckpt_classes_json(char *const *names, int n) {
    json_t *a = json_array();
    for (int k = 0; a && k < n; k++)
        if (json_array_append_new(a, json_string(names[k]))) {
            json_decref(a);
            return NULL;
        }
    return dump(a);
}

/* ---- Saving --------------------------------------------------------------------------------- */

static void warn(FILE *log, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn(FILE *log, const char *fmt, ...) {
    if (!log) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(log, fmt, ap);
    va_end(ap);
    fflush(log);
}

static int update_index(const char *logdir, const char *name, int max_to_keep, FILE *log, int repair,
                        dt_error *err);

/* The sink run->table_rows writes a compact net's tables through (dt_ckpt_put_range, dt_ckpt_put_row):
 * the file being written, and where each table's tensors are in it. */
struct dt_ckpt_sink {
    dt_st_writer *w;
    const dt_ckpt_run *run;
    int n_tables;
    const int *tensor;        /* [n_tables] the index of table t's values tensor; its slots follow it, then
                               * an unbounded table's ids */
    const uint64_t *held;     /* [n_tables] an unbounded table's rows in this file (run->table_prepare's) */
    float *scratch;           /* [cap] one slot's floats of a range of rows */
    size_t cap;
};

/* The tensors of a checkpoint into t (names in names): each variable followed by its slots, as
 * TensorFlow lists a variable's slots beside it (a remote table's without data: the sink writes them,
 * tensor_of_table[t] says where), then global_step and the coordinator's state. Returns how many. */
static int list_tensors(const dt_ckpt_run *run, const float *params, const float *state, const int64_t *global_step,
                        dt_st_tensor *t, char *names, int *tensor_of_table, const uint64_t *held) {
    const size_t n = dt_net_param_count(run->net);
    int nt = 0;
    for (int v = 0; v < dt_net_num_views(run->net); v++) {
        const dt_param_view *pv = dt_net_view(run->net, v);
        if (pv->count == 0) continue;
        const int remote = remote_table(run, pv);
        if (remote) tensor_of_table[dt_net_view_table(run->net, v)] = nt;
        for (int s = -1; s < view_slots(run, pv); s++) {
            char *name = names + (size_t)nt * NAME_CAP;
            if (s < 0) snprintf(name, NAME_CAP, "%s", pv->name);
            else slot_tensor_name(name, run, pv, s);
            dt_st_tensor *x = &t[nt++];
            x->name = name;
            x->dtype = DT_ST_F32;
            x->ndim = pv->ndim;
            saved_shape(run, v, x->shape, NULL, held);
            x->data = remote ? NULL : s < 0 ? params + pv->offset : state + (size_t)s * n + pv->offset;
        }
        if (unbounded_table(run, v)) { /* its rows' ids, after the values and slots */
            char *name = names + (size_t)nt * NAME_CAP;
            snprintf(name, NAME_CAP, "%s/ids", pv->name);
            t[nt++] = (dt_st_tensor){.name = name, .dtype = DT_ST_U64, .ndim = 1,
                                     .shape = {(int64_t)held[dt_net_view_table(run->net, v)]}};
        }
    }
    t[nt++] = (dt_st_tensor){.name = DT_CKPT_STEP_TENSOR, .dtype = DT_ST_I64, .ndim = 0, .data = global_step};
    if (run->coord)
        t[nt++] = (dt_st_tensor){.name = DT_CKPT_COORD_TENSOR, .dtype = DT_ST_U8, .ndim = 1,
                                 .shape = {(int64_t)run->coord_len}, .data = run->coord};
    return nt;
}

/* The file: at once, or, with a compact net's tables, in parts, their rows from run->table_rows. */
static int write_file(const char *path, const dt_ckpt_run *run, const dt_st_tensor *t, int nt, const dt_st_meta *meta,
                      int nm, const int *tensor_of_table, const uint64_t *held, int64_t global_step, dt_error *err) {
    const int n_tables = dt_net_compact_tables(run->net) ? dt_net_num_tables(run->net) : 0;
    if (!n_tables) return dt_st_write(path, t, nt, meta, nm, err);
    if (!run->table_rows || !run->tables)
        return dt_errorf(err, DT_EINVAL, "checkpoint: the net's %d tables live elsewhere, and the run says neither how "
                         "to read them nor their optimizer", n_tables);
    dt_ckpt_sink sink = {.run = run, .n_tables = n_tables, .tensor = tensor_of_table, .held = held};
    int rc = dt_st_writer_begin(&sink.w, path, t, nt, meta, nm, err);
    if (!rc) rc = run->table_rows(run->table_user, &sink, global_step, err);
    free(sink.scratch);
    if (rc) {
        dt_st_writer_abort(sink.w);
        return rc;
    }
    return dt_st_writer_commit(sink.w, err);
}

/* The rows each unbounded table of a compact net will have in the file (run->table_prepare) into
 * *held [tables] (allocated; zeros for the other tables). */
static int prepare_held(const dt_ckpt_run *run, const char *logdir, uint64_t **held, dt_error *err) {
    const int n_tables = dt_net_num_tables(run->net);
    if (!(*held = dt_calloc((size_t)n_tables + 1, sizeof **held, "checkpoint tables", err))) return DT_ENOMEM;
    int unbounded = 0;
    for (int t = 0; t < n_tables; t++) unbounded |= dt_net_table_rows(run->net, t) == 0;
    if (!unbounded || !dt_net_compact_tables(run->net)) return DT_OK;
    if (!run->table_prepare)
        return dt_errorf(err, DT_EINVAL, "checkpoint: the net has tables of unbounded ids, and the run says not how to "
                         "count their rows");
    return run->table_prepare(run->table_user, logdir, *held, err);
}

int dt_ckpt_save(const char *logdir, const dt_ckpt_run *run, const float *params, const float *state,
                 int64_t global_step, int max_to_keep, FILE *log, char *name_out, size_t name_cap,
                 dt_error *err) {
    if (!logdir || !logdir[0]) return dt_errorf(err, DT_EINVAL, "checkpoint: no log folder given");
    if (global_step < 0 || global_step > DT_CKPT_MAX_STEP)
        return dt_errorf(err, DT_EINVAL, "checkpoint: global step %" PRId64 " out of range (0 to %lld)", global_step,
                         DT_CKPT_MAX_STEP);
    int slots = dt_ckpt_state_slots(run), n_views = dt_net_num_views(run->net);
    if (slots > MAX_SLOTS) return dt_errorf(err, DT_EINVAL, "checkpoint: %d optimizer slots", slots);
    if (slots && !state) return dt_errorf(err, DT_EINVAL, "checkpoint: optimizer state missing");
    int rc = dt_mkdirs(logdir, err);
    if (rc) return rc;

    if (run->coord && (!run->coord_len || run->coord_len > DT_CKPT_MAX_COORD_BYTES))
        return dt_errorf(err, DT_EINVAL, "checkpoint: a coordinator state of %zu bytes", run->coord_len);
    int cap = n_views * (2 + slots) + 2; /* each variable, its slots, an unbounded table's ids */
    uint64_t *held = NULL;               /* [tables] an unbounded table's rows (prepare_held) */
    dt_st_tensor *t = dt_calloc((size_t)cap, sizeof *t, "checkpoint tensor list", err);
    char *names = dt_calloc((size_t)cap, NAME_CAP, "checkpoint tensor names", err);
    int *tensor_of_table = dt_calloc((size_t)dt_net_num_tables(run->net) + 1, sizeof(int), "checkpoint tables", err);
    char *meta_opt = run->opt ? optimizer_json(run->opt, dt_net_num_tables(run->net) ? run->tables : NULL) : NULL, *meta_data = data_position_json(run, global_step),
         *meta_rng = rng_json(run), *meta_classes = run->n_class_names > 0 ? dt_ckpt_classes_json(run->class_names, run->n_class_names) : NULL;
    if (!t || !names || !tensor_of_table || (run->opt && !meta_opt) || !meta_data || !meta_rng ||
        (run->n_class_names > 0 && !meta_classes)) {
        rc = t && names && tensor_of_table ? dt_errorf(err, DT_ENOMEM, "checkpoint: out of memory for the metadata")
                                           : DT_ENOMEM;
        goto out;
    }
    if ((rc = prepare_held(run, logdir, &held, err))) goto out;
    int nt = list_tensors(run, params, state, &global_step, t, names, tensor_of_table, held);

    const dt_model_spec *spec = dt_net_spec(run->net);
    dt_st_meta meta[6];
    int nm = 0;
    meta[nm++] = (dt_st_meta){"dtrain_version", dt_version()};
    meta[nm++] = (dt_st_meta){"model", spec->text ? spec->text : ""};
    if (meta_opt) meta[nm++] = (dt_st_meta){"optimizer", meta_opt};
    meta[nm++] = (dt_st_meta){"data_position", meta_data};
    meta[nm++] = (dt_st_meta){"rng_state", meta_rng};
    if (meta_classes) meta[nm++] = (dt_st_meta){"classes", meta_classes};

    char name[64], path[DT_PATH_MAX];
    dt_ckpt_file_name(name, sizeof name, global_step);
    if ((rc = dt_path_join(path, sizeof path, logdir, name, err))) goto out;
    if ((rc = write_file(path, run, t, nt, meta, nm, tensor_of_table, held, global_step, err))) goto out;

    /* Only now, with the file complete, does the index name it. */
    rc = update_index(logdir, name, max_to_keep, log, 0, err);
    if (!rc && name_out) snprintf(name_out, name_cap, "%s", name);
out:
    free(t);
    free(names);
    free(tensor_of_table);
    free(held);
    free(meta_opt);
    free(meta_data);
    free(meta_rng);
    free(meta_classes);
    return rc;
}

/* Table t of the sink's run: its view, dim, slots and rows; DT_EINVAL without it. */
static int sink_table(const dt_ckpt_sink *s, int t, int *dim, int *slots, uint64_t *rows, dt_error *err) {
    dt_table_grad g;
    if (t < 0 || t >= s->n_tables || dt_net_table_grad(s->run->net, t, &g))
        return dt_errorf(err, DT_EINVAL, "checkpoint: no table %d (the net has %d)", t, s->n_tables);
    *dim = g.dim;
    *slots = view_slots(s->run, dt_net_view(s->run->net, g.view));
    *rows = (uint64_t)dt_net_table_rows(s->run->net, t);
    if (*rows == 0) *rows = s->held ? s->held[t] : 0; /* unbounded ids: the rows held */
    return DT_OK;
}

int dt_ckpt_put_ids(dt_ckpt_sink *s, int t, uint64_t first, size_t n, const uint64_t *ids, dt_error *err) {
    int dim, slots;
    uint64_t total;
    int rc = sink_table(s, t, &dim, &slots, &total, err);
    if (rc) return rc;
    if (dt_net_table_rows(s->run->net, t) != 0 || first > total || n > total - first)
        return dt_errorf(err, DT_EINVAL, "checkpoint: ids %" PRIu64 "..%" PRIu64 " of table %d, which holds %" PRIu64
                         " rows of unbounded ids", first, first + n, t, dt_net_table_rows(s->run->net, t) ? 0 : total);
    uint8_t buf[8 * 512];
    for (size_t done = 0; done < n && !rc;) { /* little-endian, as safetensors stores integers */
        size_t m = n - done < 512 ? n - done : 512;
        for (size_t i = 0; i < m; i++) dt_put_u64(buf + 8 * i, ids[done + i]);
        rc = dt_st_writer_put(s->w, s->tensor[t] + 1 + slots, (first + done) * 8, buf, m * 8, err);
        done += m;
    }
    return rc;
}

int dt_ckpt_put_range(dt_ckpt_sink *s, int t, uint64_t first, size_t n, const float *rows, dt_error *err) {
    int dim, slots;
    uint64_t total;
    int rc = sink_table(s, t, &dim, &slots, &total, err);
    if (rc) return rc;
    if (first > total || n > total - first)
        return dt_errorf(err, DT_EINVAL, "checkpoint: rows %" PRIu64 "..%" PRIu64 " of table %d, beyond its %" PRIu64
                         " rows", first, first + n, t, total);
    const size_t d = (size_t)dim, k = d * (1 + (size_t)slots);
    if (n * d > s->cap) {
        free(s->scratch);
        s->cap = 0;
        if (!(s->scratch = dt_alloc_floats(n * d, "checkpoint rows", err))) return DT_ENOMEM;
        s->cap = n * d;
    }
    for (int j = 0; j <= slots && !rc; j++) { /* the values, then each slot: a tensor each */
        for (size_t i = 0; i < n; i++) memcpy(s->scratch + i * d, rows + i * k + (size_t)j * d, d * sizeof(float));
        rc = dt_st_writer_put(s->w, s->tensor[t] + j, first * d * sizeof(float), s->scratch, n * d * sizeof(float), err);
    }
    return rc;
}

int dt_ckpt_put_row(dt_ckpt_sink *s, int t, uint64_t id, const float *row, dt_error *err) {
    int dim, slots;
    uint64_t total;
    int rc = sink_table(s, t, &dim, &slots, &total, err);
    if (rc) return rc;
    if (id >= total)
        return dt_errorf(err, DT_EINVAL, "checkpoint: row %" PRIu64 " of table %d, beyond its %" PRIu64 " rows", id, t,
                         total);
    const size_t d = (size_t)dim;
    for (int j = 0; j <= slots && !rc; j++)
        rc = dt_st_writer_put(s->w, s->tensor[t] + j, id * d * sizeof(float), row + (size_t)j * d, d * sizeof(float),
                              err);
    return rc;
}

/* ---- The index and the folder -------------------------------------------------------------- */

typedef struct {
    int64_t step;
    char *name;
    int orphan;   /* not listed by the index, newer than its newest */
} candidate;

static void free_candidates(candidate *c, int n) {
    for (int i = 0; i < n; i++) free(c[i].name);
    free(c);
}

static int cmp_step_desc(const void *a, const void *b) {
    const candidate *x = a, *y = b;
    return x->step < y->step ? 1 : x->step > y->step ? -1 : 0;
}

static int is_listed(const dt_ckpt_index *idx, const char *name) {
    for (int i = 0; i < idx->n_paths; i++)
        if (strcmp(idx->paths[i], name) == 0) return 1;
    return 0;
}

/* The checkpoint files of logdir (names the index's path rule accepts) with a step above `above` that
 * idx does not list, newest first. regular_only: regular files only (lstat, so a symbolic link is not
 * followed), for adding to the index; readers get links too, and refuse them with a warning. */
static int scan_folder(candidate **out, int *n_out, const char *logdir, int64_t above, const dt_ckpt_index *idx,
                       int regular_only, dt_error *err) {
    *out = NULL;
    *n_out = 0;
    DIR *d = opendir(logdir);
    if (!d) return 0;
    candidate *c = NULL;
    int n = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t step = dt_ckpt_name_step(e->d_name);
        if (step < 0 || step <= above || is_listed(idx, e->d_name)) continue;
        if (regular_only) {
            char path[DT_PATH_MAX];
            struct stat st;
            if (dt_path_join(path, sizeof path, logdir, e->d_name, NULL) || lstat(path, &st) != 0 ||
                !S_ISREG(st.st_mode))
                continue;
        }
        candidate *g = realloc(c, (size_t)(n + 1) * sizeof *g);
        char *name = g ? strdup(e->d_name) : NULL;
        if (!g || !name) {
            if (g) c = g;
            rc = dt_errorf(err, DT_ENOMEM, "out of memory listing %s", logdir);
            break;
        }
        c = g;
        c[n++] = (candidate){step, name, 0};
        if (n >= DT_CKPT_MAX_PATHS) break;
    }
    closedir(d);
    if (rc) {
        free_candidates(c, n);
        return rc;
    }
    if (n) qsort(c, (size_t)n, sizeof *c, cmp_step_desc);
    *out = c;
    *n_out = n;
    return 0;
}

static void warn_ignored(FILE *log, const dt_ckpt_index *idx) {
    for (int i = 0; i < idx->n_ignored; i++) warn(log, "warning: %s\n", idx->ignored[i]);
}

/* Makes name (a checkpoint file of logdir) the index's newest and writes the index. First it adds
 * the regular checkpoint files newer than the index's newest that the index does not list (all of
 * them without a readable index), oldest first: a checkpoint whose index write failed (a full disk)
 * is complete, and only listed files are ever deleted by retention. Then deletes what retention
 * (max_to_keep) dropped: names the path rule accepted, unlinked in logdir (a symbolic link is removed
 * itself, its target never). repair: the supervisor after a restore: no warnings about the index
 * (dt_ckpt_open_latest gave them), nothing written if the index already says this. */
static int update_index(const char *logdir, const char *name, int max_to_keep, FILE *log, int repair,
                        dt_error *err) {
    dt_ckpt_index idx;
    dt_error ierr = {0};
    int changed = !repair;
    if (dt_ckpt_index_read(&idx, logdir, &ierr)) {
        if (!repair) warn(log, "warning: %s; writing a new index from the checkpoint files in the folder\n", ierr.msg);
        memset(&idx, 0, sizeof idx);
        changed = 1;
    }
    if (!repair) warn_ignored(log, &idx);
    if (idx.n_ignored || !idx.model_checkpoint_path || strcmp(idx.model_checkpoint_path, name) != 0) changed = 1;
    char old_newest[64];
    snprintf(old_newest, sizeof old_newest, "%s", idx.model_checkpoint_path ? idx.model_checkpoint_path : "");

    candidate *c = NULL;
    int n = 0, rc, n_dropped = 0, adopted = 0;
    char **dropped = NULL, names[256] = "";
    rc = scan_folder(&c, &n, logdir, idx.model_checkpoint_path ? dt_ckpt_name_step(idx.model_checkpoint_path) : -1,
                     &idx, 1, err);
    for (int i = n - 1; i >= 0 && !rc; i--) {
        if (strcmp(c[i].name, name) == 0) continue;
        if ((rc = dt_ckpt_index_add(&idx, c[i].name, 0, &dropped, &n_dropped, err))) break;
        dt_ckpt_free_paths(dropped, n_dropped);
        dropped = NULL;
        n_dropped = 0;
        if (adopted++ < 3) {
            size_t l = strlen(names);
            snprintf(names + l, sizeof names - l, "%s%s", l ? ", " : "", c[i].name);
        }
    }
    free_candidates(c, n);
    if (!rc && adopted) {
        changed = 1;
        if (old_newest[0])
            warn(log, "checkpoint: %d file(s) newer than the index's newest (%s) were not in it: %s%s; adding them, so "
                      "that max_to_keep covers them\n", adopted, old_newest, names, adopted > 3 ? ", ..." : "");
        else
            warn(log, "checkpoint: adding the folder's %d checkpoint file(s) to the new index: %s%s\n", adopted, names,
                 adopted > 3 ? ", ..." : "");
    }
    if (!rc) rc = dt_ckpt_index_add(&idx, name, max_to_keep, &dropped, &n_dropped, err);
    if (!rc && (changed || n_dropped)) rc = dt_ckpt_index_write(&idx, logdir, err);
    dt_ckpt_index_free(&idx);
    for (int i = 0; i < n_dropped && !rc; i++) {
        char old[DT_PATH_MAX];
        if (strcmp(dropped[i], name) == 0 || dt_path_join(old, sizeof old, logdir, dropped[i], NULL)) continue;
        if (unlink(old) != 0 && errno != ENOENT) warn(log, "warning: could not delete old checkpoint %s: %s\n", old, strerror(errno));
    }
    dt_ckpt_free_paths(dropped, n_dropped);
    return rc;
}

int dt_ckpt_adopt(const char *logdir, const char *name, FILE *log, dt_error *err) {
    if (!logdir || !logdir[0] || !name || dt_ckpt_name_step(name) < 0)
        return dt_errorf(err, DT_EINVAL, "checkpoint: \"%.64s\" is not a checkpoint file name", name ? name : "");
    return update_index(logdir, name, 0, log, 1, err);
}

/* ---- Finding the newest good checkpoint ----------------------------------------------------- */

/* A checkpoint's global_step must be one it can hold: an I64 scalar from 0 to DT_CKPT_MAX_STEP, and
 * the step its file name says (the index's order, retention and the folder scan go by the name). A
 * file can pass its checksum and still fail this (a writer's bug, another tool, a hand-made file):
 * it is then as damaged as a truncated one, and the one before it is used. */
static int check_step(const dt_st_file *f, const char *path, int64_t name_step, dt_error *err) {
    const dt_st_info *gs = dt_st_find(f, DT_CKPT_STEP_TENSOR);
    if (!gs) return dt_errorf(err, DT_EFORMAT, "%s: no %s tensor (the file is damaged)", path, DT_CKPT_STEP_TENSOR);
    if (gs->dtype != DT_ST_I64 || gs->count != 1)
        return dt_errorf(err, DT_EFORMAT, "%s: %s is %s with %" PRIu64 " element(s), not an I64 scalar (the file is "
                         "damaged)", path, DT_CKPT_STEP_TENSOR, dt_st_dtype_name(gs->dtype), gs->count);
    int64_t step;
    int rc = dt_st_read(f, DT_CKPT_STEP_TENSOR, DT_ST_I64, &step, 1, err);
    if (rc) return rc;
    if (step < 0 || step > DT_CKPT_MAX_STEP)
        return dt_errorf(err, DT_EFORMAT, "%s: %s %" PRId64 " is out of range (0 to %lld; the file is damaged)", path,
                         DT_CKPT_STEP_TENSOR, step, DT_CKPT_MAX_STEP);
    if (step != name_step)
        return dt_errorf(err, DT_EFORMAT, "%s: %s %" PRId64 " is not the step its name says (%" PRId64 "; the file is "
                         "damaged)", path, DT_CKPT_STEP_TENSOR, step, name_step);
    return 0;
}

/* A NaN or infinity in a parameter or its optimizer state makes a checkpoint as useless as a bad
 * checksum does (restored, it would only show later as a NaN loss), so it is damage too. */
static int check_finite(const dt_st_file *f, const char *path, dt_error *err) {
    /* Piece by piece: what is held does not grow with the file. */
    enum { CHUNK = 16384 };
    float *buf = dt_malloc(CHUNK * sizeof *buf, "finite check buffer", err);
    if (!buf) return DT_ENOMEM;
    int rc = 0;
    for (int i = 0; i < dt_st_num_tensors(f) && !rc; i++) {
        const dt_st_info *t = dt_st_tensor_at(f, i);
        if (t->dtype != DT_ST_F32) continue;
        for (uint64_t at = 0; at < t->count && !rc; at += CHUNK) {
            size_t m = t->count - at < CHUNK ? (size_t)(t->count - at) : CHUNK;
            if ((rc = dt_st_read_part(f, t, at * sizeof *buf, buf, m * sizeof *buf, err))) break;
            size_t bad = dt_first_nonfinite(buf, m);
            if (bad == m) continue;
            rc = dt_errorf(err, DT_EFORMAT, "%s: tensor %s holds %g at index %" PRIu64 " (damaged, or saved after "
                           "training diverged)", path, t->name, (double)buf[bad], at + bad);
        }
    }
    free(buf);
    return rc;
}

/* dt_st_open_ex's check for dt_ckpt_open_latest_for: a refusal is not damage, it ends the search
 * (failed set) with the check's message. */
typedef struct {
    int64_t step;             /* the one the file's name says */
    dt_st_check_fn check;
    void *ctx;
    int failed;
} check_ctx;

/* Between a candidate's header and its data: its step (8 bytes read; damage, so the one before it is
 * tried), then the caller's check. */
static int run_check(const dt_st_file *f, const char *label, void *arg, dt_error *err) {
    check_ctx *c = arg;
    int rc = check_step(f, label, c->step, err);
    if (rc || !c->check) return rc;
    if ((rc = c->check(f, label, c->ctx, err))) c->failed = 1;
    return rc;
}

int dt_ckpt_fits_check(const dt_st_file *f, const char *label, void *run, dt_error *err) {
    return dt_ckpt_check_fits(f, label, run, err);
}

int dt_ckpt_open_latest(dt_st_file **out, char *path_out, size_t path_cap, const char *logdir, FILE *log,
                        dt_error *err) {
    return dt_ckpt_open_latest_for(out, path_out, path_cap, logdir, NULL, NULL, log, err);
}

int dt_ckpt_open_latest_for(dt_st_file **out, char *path_out, size_t path_cap, const char *logdir,
                            dt_st_check_fn check, void *ctx, FILE *log, dt_error *err) {
    *out = NULL;
    dt_ckpt_index idx;
    dt_error ierr = {0};
    if (dt_ckpt_index_read(&idx, logdir, &ierr)) {
        warn(log, "warning: %s; looking for checkpoint files in %s instead\n", ierr.msg, logdir);
        memset(&idx, 0, sizeof idx);
    }
    warn_ignored(log, &idx);
    /* Candidates: the files the index does not list that are newer than its newest (without an index,
     * every checkpoint file), highest step first, then the index's entries, newest first. A checkpoint
     * whose index write failed is complete and newer than anything listed. */
    candidate *c = NULL;
    int n = 0, rc;
    char newest[64];
    snprintf(newest, sizeof newest, "%s", idx.model_checkpoint_path ? idx.model_checkpoint_path : "");
    rc = scan_folder(&c, &n, logdir, newest[0] ? dt_ckpt_name_step(newest) : -1, &idx, 0, err);
    if (!rc && idx.n_paths) {
        candidate *g = realloc(c, (size_t)(n + idx.n_paths) * sizeof *g);
        if (!g) {
            rc = dt_errorf(err, DT_ENOMEM, "out of memory listing the checkpoints of %s", logdir);
        } else {
            c = g;
            for (int i = 0; i < n; i++) c[i].orphan = 1;
            for (int i = idx.n_paths - 1; i >= 0; i--) {
                c[n++] = (candidate){dt_ckpt_name_step(idx.paths[i]), idx.paths[i], 0};
                idx.paths[i] = NULL;
            }
        }
    }
    dt_ckpt_index_free(&idx);
    if (rc) {
        free_candidates(c, n);
        return rc;
    }

    int tried = 0;
    char first_bad[DT_PATH_MAX] = "";
    for (int i = 0; i < n && rc == 0; i++) {
        char path[DT_PATH_MAX];
        if (dt_path_join(path, sizeof path, logdir, c[i].name, NULL)) continue;
        tried++;
        dt_st_file *f = NULL;
        dt_error ferr = {0};
        /* Opened without following a symbolic link: the path rule keeps the name in the folder, and
         * this keeps the file there. */
        check_ctx cc = {c[i].step, check, ctx, 0};
        int orc = dt_st_open_ex(&f, path, DT_ST_NOFOLLOW, run_check, &cc, &ferr);
        if (orc && cc.failed) {
            free_candidates(c, n);
            *err = ferr;
            return orc;
        }
        if (!orc && (orc = check_finite(f, path, &ferr))) {
            dt_st_close(f);
            f = NULL;
        }
        if (!orc) {
            if (!dt_st_has_checksum(f))
                warn(log, "warning: %s carries no checksum (not written by dtrain); using it anyway\n", path);
            if (c[i].orphan)
                warn(log, "checkpoint: %s is newer than the index's newest (%s); using it\n", c[i].name, newest);
            *out = f;
            snprintf(path_out, path_cap, "%s", path);
            rc = 1;
            break;
        }
        dt_st_close(f);
        if (!first_bad[0]) snprintf(first_bad, sizeof first_bad, "%s", path);
        warn(log, "warning: skipping checkpoint: %s%s\n", ferr.msg, i + 1 < n ? "; trying the one before it" : "");
    }
    free_candidates(c, n);
    if (rc == 0 && tried > 0)
        return dt_errorf(err, DT_EFORMAT,
                         "%s: none of its %d checkpoint(s) is usable (newest: %s); move them away to start from scratch",
                         logdir, tried, first_bad);
    return rc;
}

/* ---- Reading and checking ------------------------------------------------------------------- */

const char *dt_ckpt_model_text(const dt_st_file *f) { return dt_st_meta_get(f, "model"); }

int dt_ckpt_read_classes(const dt_st_file *f, const char *label, int max_classes, char ***names, int *n,
                         dt_error *err) {
    *names = NULL;
    *n = 0;
    const char *s = dt_st_meta_get(f, "classes");
    if (!s) return 0;
    json_error_t je;
    json_t *a = json_loads(s, 0, &je);
    size_t count = json_is_array(a) ? json_array_size(a) : 0;
    int rc = 0;
    if (!json_is_array(a) || count == 0 || count > (size_t)max_classes)
        rc = dt_errorf(err, DT_EFORMAT, "%s: metadata \"classes\" is not a list of 1 to %d class names (the model's "
                       "classes)", label, max_classes);
    char **v = rc ? NULL : dt_calloc(count, sizeof *v, "class names", err);
    if (!rc && !v) rc = DT_ENOMEM;
    for (size_t k = 0; !rc && k < count; k++) {
        json_t *e = json_array_get(a, k);
        const char *name = json_string_value(e);
        size_t len = name ? json_string_length(e) : 0;
        int ok = name && len > 0 && len <= DT_CKPT_MAX_CLASS_NAME && strlen(name) == len;
        for (size_t i = 0; ok && i < len; i++) ok = (unsigned char)name[i] >= 0x20 && name[i] != 0x7f;
        for (size_t j = 0; ok && j < k; j++) ok = strcmp(v[j], name) != 0;
        if (!ok) {
            rc = dt_errorf(err, DT_EFORMAT, "%s: metadata \"classes\": entry %zu is not a distinct name of 1 to %d "
                           "printable bytes", label, k, DT_CKPT_MAX_CLASS_NAME);
        } else if (!(v[k] = strdup(name))) {
            rc = dt_errorf(err, DT_ENOMEM, "%s: out of memory reading the class names", label);
        }
    }
    json_decref(a);
    if (rc) {
        for (size_t k = 0; v && k < count; k++) free(v[k]);
        free(v);
        return rc;
    }
    *names = v;
    *n = (int)count;
    return 0;
}

/* A metadata value that is a JSON object (NULL if absent); malformed JSON is an error. */
static int meta_object(json_t **out, const dt_st_file *f, const char *label, const char *key, dt_error *err) {
    *out = NULL;
    const char *s = dt_st_meta_get(f, key);
    if (!s) return 0;
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return dt_errorf(err, DT_EFORMAT, "%s: metadata \"%s\" is not a JSON object", label, key);
    }
    *out = j;
    return 0;
}

static int64_t get_int(json_t *o, const char *k, int64_t dflt) {
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : dflt;
}

int dt_ckpt_read_info(const dt_st_file *f, const char *label, dt_ckpt_info *info, dt_error *err) {
    memset(info, 0, sizeof *info);
    info->validation_fraction = -1;
    info->global_step = -1;
    const dt_st_info *gs = dt_st_find(f, DT_CKPT_STEP_TENSOR);
    if (gs) {
        int64_t step;
        int rc = dt_st_read(f, DT_CKPT_STEP_TENSOR, DT_ST_I64, &step, 1, err);
        if (rc) return rc;
        if (step < 0 || step > DT_CKPT_MAX_STEP)
            return dt_errorf(err, DT_EFORMAT, "%s: global_step %" PRId64 " out of range", label, step);
        info->global_step = step;
    }
    json_t *o = NULL;
    int rc = meta_object(&o, f, label, "optimizer", err);
    if (rc) return rc;
    if (o) {
        const char *name = json_string_value(json_object_get(o, "name"));
        if (name) snprintf(info->optimizer, sizeof info->optimizer, "%s", name);
        json_t *lr = json_object_get(o, "learning_rate");
        if (json_is_number(lr)) info->learning_rate = (float)json_number_value(lr);
        json_t *tables = json_object_get(o, "tables");
        const char *tname = json_string_value(json_object_get(tables, "name"));
        if (tname) snprintf(info->table_optimizer, sizeof info->table_optimizer, "%s", tname);
        json_t *tlr = json_object_get(tables, "learning_rate"), *acc = json_object_get(tables, "initial_accumulator");
        if (json_is_number(tlr)) info->table_learning_rate = (float)json_number_value(tlr);
        if (json_is_number(acc)) info->table_initial_accumulator = (float)json_number_value(acc);
        json_decref(o);
    }
    if ((rc = meta_object(&o, f, label, "data_position", err))) return rc;
    if (o) {
        int64_t bs = get_int(o, "batch_size", 0), nw = get_int(o, "workers", 0);
        info->batch_size = bs > 0 && bs <= 65536 ? (int)bs : 0;
        info->n_workers = nw > 0 && nw <= 65536 ? (int)nw : 0;
        info->batches_per_epoch = get_int(o, "batches_per_epoch", 0);
        json_t *vf = json_object_get(o, "validation_fraction");
        if (json_is_number(vf)) info->validation_fraction = json_number_value(vf);
        json_decref(o);
    }
    if ((rc = meta_object(&o, f, label, "rng_state", err))) return rc;
    if (o) {
        const char *s = json_string_value(json_object_get(o, "seed"));
        char *end;
        if (s && *s) {
            errno = 0;
            unsigned long long v = strtoull(s, &end, 10);
            if (*end || errno || s[0] == '-') {
                /* s lives in o: the message first, then o goes */
                rc = dt_errorf(err, DT_EFORMAT, "%s: metadata rng_state: seed \"%.40s\" is not a number", label, s);
                json_decref(o);
                return rc;
            }
            info->seed = v;
            info->has_seed = 1;
        }
        json_decref(o);
    }
    return 0;
}

static void shape_str(char *out, size_t cap, const int64_t *shape, int ndim) {
    size_t k = 0;
    k += (size_t)snprintf(out + k, cap - k, "[");
    for (int d = 0; d < ndim && k < cap; d++) k += (size_t)snprintf(out + k, cap - k, "%s%" PRId64, d ? "," : "", shape[d]);
    if (k < cap) snprintf(out + k, cap - k, "]");
}

/* The first line where two model texts differ, ignoring comments and trailing blanks, into out
 * ("" if they agree). */
static void first_model_difference(char *out, size_t cap, const char *a, const char *b) {
    out[0] = 0;
    if (!a || !b) return;
    int line = 1;
    for (;;) {
        const char *ea = a + strcspn(a, "\n"), *eb = b + strcspn(b, "\n");
        size_t la = strcspn(a, "#\n\r"), lb = strcspn(b, "#\n\r");
        while (la && (a[la - 1] == ' ' || a[la - 1] == '\t')) la--;
        while (lb && (b[lb - 1] == ' ' || b[lb - 1] == '\t')) lb--;
        if (la != lb || memcmp(a, b, la) != 0) {
            snprintf(out, cap, "; model line %d is '%.*s' in the checkpoint, '%.*s' here", line, (int)(la > 60 ? 60 : la),
                     a, (int)(lb > 60 ? 60 : lb), b);
            return;
        }
        if (!*ea && !*eb) return;
        a = *ea ? ea + 1 : ea;
        b = *eb ? eb + 1 : eb;
        line++;
    }
}

#define IDS_SLOT (-2) /* find_variable: an unbounded table's ids */

/* Is name a variable of the run, or one of its slots? Returns the view index or -1; *slot = -1
 * for the parameter itself, IDS_SLOT for an unbounded table's ids. */
static int find_variable(const dt_ckpt_run *run, const char *name, int *slot) {
    int nv = dt_net_num_views(run->net);
    for (int v = 0; v < nv; v++) {
        const char *vn = dt_net_view(run->net, v)->name;
        size_t l = strlen(vn);
        if (strncmp(name, vn, l) != 0) continue;
        if (name[l] == 0) {
            *slot = -1;
            return v;
        }
        if (name[l] != '/') continue;
        if (strcmp(name + l + 1, "ids") == 0 && unbounded_table(run, v)) {
            *slot = IDS_SLOT;
            return v;
        }
        for (int k = 0; k < MAX_SLOTS; k++) {
            const char *sn = name + l + 1;
            if (strcmp(sn, dt_ckpt_slot_name(DT_OPT_MOMENTUM, k)) == 0 || strcmp(sn, dt_ckpt_slot_name(DT_OPT_ADAM, k)) == 0 ||
                strcmp(sn, dt_ckpt_table_slot_name(DT_LAZY_ADAGRAD, k)) == 0 ||
                strcmp(sn, dt_ckpt_table_slot_name(DT_LAZY_FTRL, k)) == 0) {
                *slot = k;
                return v;
            }
        }
    }
    return -1;
}

/* The first few differences between a checkpoint and this run's model, and how many in all. */
typedef struct {
    char text[768];
    size_t len;
    int n;
} diff_list;

static void diff_add(diff_list *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void diff_add(diff_list *d, const char *fmt, ...) {
    if (d->n++ >= 3 || d->len >= sizeof d->text) return;
    if (d->len) d->len += (size_t)snprintf(d->text + d->len, sizeof d->text - d->len, "; ");
    if (d->len >= sizeof d->text) return;
    va_list ap;
    va_start(ap, fmt);
    d->len += (size_t)vsnprintf(d->text + d->len, sizeof d->text - d->len, fmt, ap);
    va_end(ap);
}

/* Every variable of the model, in the checkpoint with its shape. */
static void diff_variables(const dt_st_file *f, const dt_ckpt_run *run, diff_list *d) {
    for (int v = 0; v < dt_net_num_views(run->net); v++) {
        const dt_param_view *pv = dt_net_view(run->net, v);
        if (pv->count == 0) continue;
        const dt_st_info *ti = dt_st_find(f, pv->name);
        char want[96], have[96] = "";
        int64_t sh[4];
        saved_shape(run, v, sh, f, NULL);
        shape_str(want, sizeof want, sh, pv->ndim);
        if (ti) shape_str(have, sizeof have, ti->shape, ti->ndim);
        if (ti && ti->dtype == DT_ST_F32 && strcmp(want, have) == 0) continue;
        if (!ti) diff_add(d, "%s %s is missing from the checkpoint", pv->name, want);
        else diff_add(d, "%s is %s %s in the checkpoint, F32 %s here", pv->name, dt_st_dtype_name(ti->dtype), have, want);
    }
}

/* Every tensor of the checkpoint, a variable of the model (or its optimizer state, of its size:
 * every tensor is then bounded by the model, and so is what the file can make a reader go
 * through). here: the model's name. */
static void diff_tensors(const dt_st_file *f, const dt_ckpt_run *run, const char *here, diff_list *d) {
    for (int i = 0; i < dt_st_num_tensors(f); i++) {
        const dt_st_info *ti = dt_st_tensor_at(f, i);
        int slot;
        if (strcmp(ti->name, DT_CKPT_STEP_TENSOR) == 0 || strcmp(ti->name, DT_CKPT_COORD_TENSOR) == 0)
            continue; /* checked where they are read */
        int v = find_variable(run, ti->name, &slot);
        if (v >= 0 && slot == IDS_SLOT) continue; /* an unbounded table's ids: check_held */
        int64_t sh[4];
        const uint64_t count = v >= 0 ? saved_shape(run, v, sh, f, NULL) : 0;
        if (v >= 0 && (slot < 0 || (ti->dtype == DT_ST_F32 && ti->count == count))) continue;
        if (v >= 0)
            diff_add(d, "the checkpoint's %s is %s with %" PRIu64 " elements, %" PRIu64 " here", ti->name,
                     dt_st_dtype_name(ti->dtype), ti->count, count);
        else
            diff_add(d, "the checkpoint has %s, which %s lacks", ti->name, here);
    }
}

/* A slot of variable pv missing: the first variable of its kind (table or not) says which optimizer
 * trained the checkpoint and what to pass to resume it. */
static int missing_slot(const dt_st_file *f, const char *label, const dt_ckpt_run *run, const dt_param_view *pv,
                        const char *name, dt_error *err) {
    if (pv->table && run->tables)
        return dt_errorf(err, DT_EINVAL, "%s has no %s: its tables were trained with another table optimizer than "
                         "this run's %s (pass the --table_optimizer it was trained with to resume it)", label, name,
                         dt_lazy_name(run->tables->kind));
    const char *had = "";
    dt_ckpt_info info;
    if (dt_ckpt_read_info(f, label, &info, NULL) == 0 && info.optimizer[0]) had = info.optimizer;
    return dt_errorf(err, DT_EINVAL, "%s was trained with optimizer %s, which has no %s state; this run uses %s "
                     "(pass --optimizer=%s to resume it)", label, had[0] ? had : "(unknown)", strchr(name, '/') + 1,
                     dt_opt_name(run->opt->kind), had[0] ? had : "...");
}

/* Optimizer state: every slot of the optimizer of each variable, of its size. */
static int check_slots(const dt_st_file *f, const char *label, const dt_ckpt_run *run, dt_error *err) {
    int first[2] = {1, 1}; /* the first variable of each kind (dense, table): a missing slot there is
                            * another optimizer; further on, damage */
    for (int v = 0; v < dt_net_num_views(run->net); v++) {
        const dt_param_view *pv = dt_net_view(run->net, v);
        if (pv->count == 0) continue;
        int *is_first = &first[pv->table && run->tables];
        int64_t sh[4];
        const uint64_t count = saved_shape(run, v, sh, f, NULL);
        for (int k = 0; k < view_slots(run, pv); k++) {
            char name[NAME_CAP];
            slot_tensor_name(name, run, pv, k);
            const dt_st_info *ti = dt_st_find(f, name);
            if (!ti && *is_first) return missing_slot(f, label, run, pv, name, err);
            if (!ti || ti->count != count)
                return dt_errorf(err, DT_EFORMAT, "%s: optimizer state %s is missing or not the size of %s", label, name,
                                 pv->name);
        }
        *is_first = 0;
    }
    return DT_OK;
}

/* Each unbounded table's ids: a U64 vector (its rows, and so its values' and slots' shapes, are its
 * length), at most DT_CKPT_MAX_HELD_ROWS. */
static int check_held(const dt_st_file *f, const char *label, const dt_ckpt_run *run, dt_error *err) {
    for (int v = 0; v < dt_net_num_views(run->net); v++) {
        if (!unbounded_table(run, v)) continue;
        const dt_param_view *pv = dt_net_view(run->net, v);
        char name[NAME_CAP];
        snprintf(name, sizeof name, "%s/ids", pv->name);
        const dt_st_info *ti = dt_st_find(f, name);
        if (!held_ids(f, pv) || ti->count > DT_CKPT_MAX_HELD_ROWS)
            return dt_errorf(err, DT_EFORMAT, "%s: %s must be a U64 vector of at most %llu ids (the rows of a table of "
                             "unbounded ids), not %s%s with %" PRIu64 " element(s)", label, name,
                             (unsigned long long)DT_CKPT_MAX_HELD_ROWS, ti ? dt_st_dtype_name(ti->dtype) : "missing",
                             ti && ti->ndim != 1 ? " of rank != 1" : "", ti ? ti->count : 0);
    }
    return DT_OK;
}

int dt_ckpt_check_fits(const dt_st_file *f, const char *label, const dt_ckpt_run *run, dt_error *err) {
    const dt_model_spec *spec = dt_net_spec(run->net);
    const char *here = spec->source[0] ? spec->source : spec->name;
    int rc = check_held(f, label, run, err);
    if (rc) return rc;
    /* Variables first: another model is the likeliest mistake, and the most useful to explain. */
    diff_list d = {.len = 0};
    diff_variables(f, run, &d);
    diff_tensors(f, run, here, &d);
    if (d.n) {
        char mdiff[200];
        first_model_difference(mdiff, sizeof mdiff, dt_ckpt_model_text(f), spec->text);
        return dt_errorf(err, DT_ESHAPE, "%s is a checkpoint of another model than %s: %s%s%s", label, here, d.text,
                         d.n > 3 ? " (and more)" : "", mdiff);
    }
    return check_slots(f, label, run, err);
}

int dt_ckpt_load(const dt_st_file *f, const char *label, const dt_ckpt_run *run, float *params, float *state,
                 int64_t *global_step, dt_error *err) {
    int nv = dt_net_num_views(run->net), slots = state ? dt_ckpt_state_slots(run) : 0;
    size_t n = dt_net_param_count(run->net);
    dt_ckpt_run fit = *run;
    if (!state) fit.opt = NULL; /* parameters only: slots are not asked for */
    int rc = dt_ckpt_check_fits(f, label, &fit, err);
    if (rc) return rc;
    const dt_st_info *gs = dt_st_find(f, DT_CKPT_STEP_TENSOR);
    if (!gs || gs->dtype != DT_ST_I64 || gs->count != 1)
        return dt_errorf(err, DT_EFORMAT, "%s: no I64 scalar \"%s\" tensor", label, DT_CKPT_STEP_TENSOR);
    int64_t step;
    if ((rc = dt_st_read(f, DT_CKPT_STEP_TENSOR, DT_ST_I64, &step, 1, err))) return rc;
    if (step < 0 || step > DT_CKPT_MAX_STEP)
        return dt_errorf(err, DT_EFORMAT, "%s: global_step %" PRId64 " out of range", label, step);
    for (int v = 0; v < nv; v++) {
        const dt_param_view *pv = dt_net_view(run->net, v);
        if (pv->count == 0 || remote_table(run, pv)) continue; /* a remote table: dt_ckpt_read_rows */
        if ((rc = dt_st_read(f, pv->name, DT_ST_F32, params + pv->offset, pv->count, err))) return rc;
        for (int k = 0; k < (slots ? view_slots(run, pv) : 0); k++) {
            char name[NAME_CAP];
            slot_tensor_name(name, run, pv, k);
            if ((rc = dt_st_read(f, name, DT_ST_F32, state + (size_t)k * n + pv->offset, pv->count, err))) return rc;
        }
    }
    if (global_step) *global_step = step;
    return 0;
}

int dt_ckpt_read_rows(const dt_st_file *f, const char *label, const dt_ckpt_run *run, int t, uint64_t first, size_t n,
                      float *rows, dt_error *err) {
    dt_table_grad g;
    if (dt_net_table_grad(run->net, t, &g) || !run->tables)
        return dt_errorf(err, DT_EINVAL, "%s: no table %d in the run, or no table optimizer", label, t);
    const dt_param_view *pv = dt_net_view(run->net, g.view);
    const int slots = view_slots(run, pv);
    const size_t d = (size_t)g.dim, k = d * (1 + (size_t)slots);
    float *part = dt_alloc_floats(n ? n * d : 1, "checkpoint rows", err);
    if (!part) return DT_ENOMEM;
    int rc = DT_OK;
    for (int j = 0; j <= slots && !rc; j++) { /* the values, then each slot: a tensor each */
        char name[NAME_CAP];
        if (j == 0) snprintf(name, sizeof name, "%s", pv->name);
        else slot_tensor_name(name, run, pv, j - 1);
        const dt_st_info *ti = dt_st_find(f, name);
        if (!ti || ti->dtype != DT_ST_F32 || ti->count / d <= first || n > ti->count / d - first) {
            rc = dt_errorf(err, DT_EFORMAT, "%s: %s has no rows %" PRIu64 "..%" PRIu64 " of dim %zu", label, name, first,
                           first + n, d);
            break;
        }
        if ((rc = dt_st_read_part(f, ti, first * d * sizeof(float), part, n * d * sizeof(float), err))) break;
        for (size_t i = 0; i < n; i++) memcpy(rows + i * k + (size_t)j * d, part + i * d, d * sizeof(float));
    }
    free(part);
    return rc;
}

int dt_ckpt_read_coord(const dt_st_file *f, const char *label, uint8_t **out, size_t *len, dt_error *err) {
    *out = NULL, *len = 0;
    const dt_st_info *ti = dt_st_find(f, DT_CKPT_COORD_TENSOR);
    if (!ti) return DT_OK;
    if (ti->dtype != DT_ST_U8 || ti->ndim != 1 || ti->count < 1 || ti->count > DT_CKPT_MAX_COORD_BYTES)
        return dt_errorf(err, DT_EFORMAT, "%s: %s must be a U8 vector of 1 to %u bytes, not %s with %" PRIu64
                         " element(s)", label, DT_CKPT_COORD_TENSOR, DT_CKPT_MAX_COORD_BYTES,
                         dt_st_dtype_name(ti->dtype), ti->count);
    uint8_t *b = dt_malloc((size_t)ti->count, "checkpoint coordinator state", err);
    if (!b) return DT_ENOMEM;
    int rc = dt_st_read(f, DT_CKPT_COORD_TENSOR, DT_ST_U8, b, (size_t)ti->count, err);
    if (rc) {
        free(b);
        return rc;
    }
    *out = b, *len = (size_t)ti->count;
    return DT_OK;
}

size_t dt_ckpt_clear_untrained_slots(const dt_ckpt_run *run, float *state) {
    size_t n = dt_net_param_count(run->net), cleared = 0;
    for (int v = 0; state && v < dt_net_num_views(run->net); v++) {
        const dt_param_view *pv = dt_net_view(run->net, v);
        if (!pv->not_trained) continue;
        for (int k = 0; k < view_slots(run, pv); k++) {
            float *x = state + (size_t)k * n + pv->offset;
            for (size_t i = 0; i < pv->count; i++) {
                cleared += x[i] != 0.0f;
                x[i] = 0.0f;
            }
        }
    }
    return cleared;
}

int dt_ckpt_held_rows(const dt_st_file *f, const dt_ckpt_run *run, int t, uint64_t *rows) {
    dt_table_grad g;
    *rows = 0;
    if (dt_net_table_grad(run->net, t, &g) || !unbounded_table(run, g.view)) return DT_EINVAL;
    const dt_st_info *ti = held_ids(f, dt_net_view(run->net, g.view));
    if (!ti) return DT_EINVAL;
    *rows = ti->count;
    return DT_OK;
}

int dt_ckpt_read_ids(const dt_st_file *f, const char *label, const dt_ckpt_run *run, int t, uint64_t first, size_t n,
                     uint64_t *ids, dt_error *err) {
    uint64_t held;
    dt_table_grad g;
    if (dt_ckpt_held_rows(f, run, t, &held) || first > held || n > held - first || dt_net_table_grad(run->net, t, &g))
        return dt_errorf(err, DT_EFORMAT, "%s: table %d has no ids %" PRIu64 "..%" PRIu64 " (it holds %" PRIu64 ")", label,
                         t, first, first + n, held);
    const dt_st_info *ti = held_ids(f, dt_net_view(run->net, g.view));
    int rc = n ? dt_st_read_part(f, ti, first * 8, ids, n * 8, err) : DT_OK;
    for (size_t i = 0; i < n && !rc; i++) ids[i] = dt_get_u64((const uint8_t *)&ids[i]); /* little-endian on disk */
    return rc;
}
