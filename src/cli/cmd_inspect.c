/* dtrain inspect: what a file holds, without a cluster or data.
 *   a checkpoint (safetensors): global step, every tensor's dtype, shape and value range, a
 *   click-log model's embedding tables (rows, dim, optimizer, slots, rows trained), metadata;
 *   an event file: every record (offset, wall time, step, file version or scalars);
 *   a log folder: its index, then the newest good checkpoint;
 *   a model file (text): its size and the net's execution plans, training's and evaluation's. */
#include <inttypes.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commands.h"
#include "compute/lazy_optim.h"
#include "core/error.h"
#include "supervisor/checkpoint.h"
#include "supervisor/ckpt_index.h"
#include "io/events.h"
#include "io/fsutil.h"
#include "io/safetensors.h"
#include "model/net.h"
#include "model/spec.h"

static void print_indented(const char *text) {
    while (*text) {
        size_t l = strcspn(text, "\n");
        printf("    | %.*s\n", (int)l, text);
        text += l;
        if (*text) text++;
    }
}

/* Rows of a table [rows, dim] whose slots have moved from a new row's (an update touched them):
 * slot tensors slot[n_slots] read together, piece by piece (what is held does not grow with the
 * table); init[k]: slot k's initial value. -1 on error. */
static int64_t rows_trained(const dt_st_file *f, const dt_st_info *const *slot, int n_slots, const float *init,
                            int64_t rows, int64_t dim, dt_error *err) {
    enum { CHUNK = 16384 };
    static float buf[DT_LAZY_MAX_SLOTS][CHUNK];
    const int64_t per = CHUNK / dim; /* rows a piece: dim <= 1024 */
    int64_t n = 0;
    for (int64_t r = 0; r < rows; r += per) {
        const int64_t m = rows - r < per ? rows - r : per;
        for (int k = 0; k < n_slots; k++)
            if (dt_st_read_part(f, slot[k], (uint64_t)(r * dim) * 4, buf[k], (size_t)(m * dim) * 4, err)) return -1;
        for (int64_t i = 0; i < m; i++) {
            int moved = 0;
            for (int k = 0; k < n_slots && !moved; k++)
                for (int64_t j = 0; j < dim && !moved; j++) moved = buf[k][i * dim + j] != init[k];
            n += moved;
        }
    }
    return n;
}

/* A click-log model's embedding tables (its model text says which tensors they are): rows, dim, the
 * tables' optimizer and its slots, and how many rows an update touched. */
static void list_tables(const dt_st_file *f, const char *path, dt_error *err) {
    const char *text = dt_ckpt_model_text(f);
    dt_ckpt_info info;
    dt_model_spec spec;
    dt_net *net = NULL;
    if (!text || dt_ckpt_read_info(f, path, &info, NULL) || dt_model_spec_parse(&spec, text, strlen(text), path, NULL))
        return;
    int built = dt_net_build_compact(&net, &spec, 1, NULL) == 0; /* blocks of one row: the views' names and dims */
    dt_model_spec_free(&spec);
    if (!built || !dt_net_num_tables(net)) {
        dt_net_free(net);
        return;
    }
    dt_lazy_config opt = {0};
    int known = info.table_optimizer[0] && dt_lazy_config_init(&opt, info.table_optimizer, 1.0f, NULL) == 0;
    opt.initial_accumulator = info.table_initial_accumulator;
    printf("tables: %d; optimizer %s", dt_net_num_tables(net), known ? info.table_optimizer : "not recorded");
    if (known) printf(", learning rate %g", (double)info.table_learning_rate);
    printf("; rows trained: rows whose optimizer slots moved from a new row's\n");
    for (int t = 0; t < dt_net_num_tables(net); t++) {
        dt_table_grad g;
        dt_net_table_grad(net, t, &g);
        const char *name = dt_net_view(net, g.view)->name;
        int64_t rows = dt_net_table_rows(net, t);
        const int slots = known ? dt_lazy_slots(opt.kind) : 0;
        const dt_st_info *slot[DT_LAZY_MAX_SLOTS];
        float init[DT_LAZY_MAX_SLOTS * 1];
        dt_lazy_init_slots(&opt, init, 1);
        if (rows == 0) { /* unbounded ids: the rows the ps tasks held, with their ids */
            char in[96];
            snprintf(in, sizeof in, "%s/ids", name);
            const dt_st_info *ids = dt_st_find(f, in);
            rows = ids && ids->dtype == DT_ST_U64 && ids->ndim == 1 ? (int64_t)ids->count : -1;
            printf("  %-30s unbounded ids, %lld rows held", name, (long long)rows);
        } else {
            printf("  %-30s %lld rows", name, (long long)rows);
        }
        printf(" x dim %d", g.dim);
        const dt_st_info *values = dt_st_find(f, name);
        int have = values && values->count == (uint64_t)rows * (uint64_t)g.dim;
        for (int k = 0; k < slots; k++) {
            char sn[96];
            snprintf(sn, sizeof sn, "%s/%s", name, dt_ckpt_table_slot_name(opt.kind, k));
            slot[k] = dt_st_find(f, sn);
            have &= slot[k] && slot[k]->dtype == DT_ST_F32 && slot[k]->count == (uint64_t)rows * (uint64_t)g.dim;
            printf("%s%s", k ? ", " : ", slots ", dt_ckpt_table_slot_name(opt.kind, k));
        }
        int64_t trained = have && slots ? rows_trained(f, slot, slots, init, rows, g.dim, err) : -1;
        if (!have) printf(": not in the checkpoint in this shape\n");
        else if (trained >= 0) printf(": %lld rows trained\n", (long long)trained);
        else printf("%s\n", slots ? ": (could not read the slots)" : "");
    }
    dt_net_free(net);
}

static void list_checkpoint(const dt_st_file *f, const char *path, dt_error *err) {
    size_t bytes = 0;
    for (int i = 0; i < dt_st_num_tensors(f); i++) bytes += dt_st_tensor_at(f, i)->nbytes;
    printf("%s: safetensors, %d tensors, %zu data bytes, %s\n", path, dt_st_num_tensors(f), bytes,
           dt_st_has_checksum(f) ? "crc32c checksum verified" : "no checksum");
    dt_ckpt_info info;
    if (dt_ckpt_read_info(f, path, &info, NULL) == 0 && info.global_step >= 0)
        printf("global_step: %" PRId64 "\n", info.global_step);
    printf("%-32s %-5s %-16s %10s %12s %12s %12s\n", "tensor", "dtype", "shape", "elements", "min", "max", "mean");
    for (int i = 0; i < dt_st_num_tensors(f); i++) {
        const dt_st_info *t = dt_st_tensor_at(f, i);
        char shape[64];
        size_t k = (size_t)snprintf(shape, sizeof shape, "[");
        for (int d = 0; d < t->ndim && k < sizeof shape; d++)
            k += (size_t)snprintf(shape + k, sizeof shape - k, "%s%" PRId64, d ? "," : "", t->shape[d]);
        if (k < sizeof shape) snprintf(shape + k, sizeof shape - k, "]");
        printf("%-32s %-5s %-16s %10" PRIu64, t->name, dt_st_dtype_name(t->dtype), shape, t->count);
        if (t->dtype == DT_ST_F32 && t->count > 0) {
            /* Read piece by piece from the file: what is held does not grow with the tensor. */
            enum { CHUNK = 16384 };
            static float buf[CHUNK];
            double lo = INFINITY, hi = -INFINITY, sum = 0;
            int bad = 0;
            for (uint64_t j = 0; j < t->count && !bad; j += CHUNK) {
                size_t m = t->count - j < CHUNK ? (size_t)(t->count - j) : CHUNK;
                if ((bad = dt_st_read_part(f, t, j * 4, buf, m * 4, err) != 0)) break;
                for (size_t k = 0; k < m; k++) {
                    lo = buf[k] < lo ? buf[k] : lo;
                    hi = buf[k] > hi ? buf[k] : hi;
                    sum += buf[k];
                }
            }
            if (bad) printf(" (%s)", err->msg);
            else printf(" %12.5g %12.5g %12.5g", lo, hi, sum / (double)t->count);
        } else if (t->dtype == DT_ST_I64 && t->count == 1) {
            int64_t v;
            if (dt_st_read_part(f, t, 0, &v, 8, err) == 0) printf(" %12" PRId64, v);
        }
        printf("\n");
    }
    list_tables(f, path, err);
    if (dt_st_num_meta(f)) printf("metadata:\n");
    for (int i = 0; i < dt_st_num_meta(f); i++) {
        const char *key, *value;
        dt_st_meta_at(f, i, &key, &value);
        if (strchr(value, '\n')) {
            printf("  %s:\n", key);
            print_indented(value);
        } else {
            printf("  %s: %s\n", key, value);
        }
    }
}

/* Lists every record, read one by one from the file; returns 1 (after printing the good ones) at a
 * damaged record. */
static int list_events(const char *path, dt_error *err) {
    dt_record_reader *r = NULL;
    if (dt_record_reader_open(&r, path, err)) return 1;
    int count = 0, status = 0;
    printf("%s: TensorBoard event file\n%-10s %-18s %10s  %s\n", path, "offset", "wall_time", "step", "record");
    for (;;) {
        uint64_t at = 0;
        size_t len;
        const uint8_t *data;
        int rc = dt_record_reader_next(r, &data, &len, &at, err);
        if (rc < 0) {
            status = 1;
            break;
        }
        if (rc == 0) break;
        dt_event ev;
        if ((rc = dt_event_decode(&ev, data, len, err))) {
            dt_error_wrap(err, rc, "%s: record at offset %" PRIu64 ": ", path, at);
            status = 1;
            break;
        }
        printf("%-10" PRIu64 " %-18.6f %10" PRId64 "  ", at, ev.wall_time, ev.step);
        if (ev.kind == DT_EVENT_KIND_FILE_VERSION) printf("file_version %s\n", ev.file_version);
        else if (ev.kind == DT_EVENT_KIND_SUMMARY) {
            for (int i = 0; i < ev.n_values; i++) {
                if (ev.values[i].has_simple_value) printf("%s%s = %.9g", i ? ", " : "", ev.values[i].tag, (double)ev.values[i].simple_value);
                else printf("%s%s (not a scalar)", i ? ", " : "", ev.values[i].tag);
            }
            printf("\n");
        } else printf("(other event)\n");
        dt_event_free(&ev);
        count++;
    }
    dt_record_reader_close(r);
    if (!status) printf("%d records\n", count);
    return status;
}

static int inspect_folder(const char *dir, dt_error *err) {
    dt_ckpt_index idx;
    int rc = dt_ckpt_index_read(&idx, dir, err);
    if (rc) {
        fprintf(stderr, "dtrain inspect: warning: %s\n", err->msg);
    } else {
        /* Entries the path rule ignored are warned about by dt_ckpt_open_latest below, once. */
        if (idx.n_paths) {
            printf("%s/%s: newest %s; kept, oldest first:\n", dir, DT_CKPT_INDEX_FILE, idx.model_checkpoint_path);
            for (int i = 0; i < idx.n_paths; i++) printf("  %s\n", idx.paths[i]);
        }
        dt_ckpt_index_free(&idx); /* an empty index can still hold the ignored entries' warnings */
    }
    dt_st_file *f = NULL;
    char path[DT_PATH_MAX];
    rc = dt_ckpt_open_latest(&f, path, sizeof path, dir, stderr, err);
    if (rc < 0) return 1;
    if (rc == 0) {
        dt_errorf(err, DT_EINVAL, "%s: no checkpoint in this folder", dir);
        return 1;
    }
    list_checkpoint(f, path, err);
    dt_st_close(f);
    return 0;
}

/* A model file: what it builds, and the steps forward and backward run (model/plan.c). */
static int inspect_model(const char *path, dt_error *err) {
    dt_net *net = NULL;
    if (dt_net_load(&net, path, 1, err)) return 1;
    const dt_model_spec *spec = dt_net_spec(net);
    char in[64];
    if (spec->ctr) snprintf(in, sizeof in, "click logs (dense=%d fields=%d)", spec->num_dense, spec->num_fields);
    else snprintf(in, sizeof in, "%dx%dx%d", spec->in_h, spec->in_w, spec->in_c);
    printf("%s: model %s, input %s, %d layers, %zu parameters in %d variables", path, spec->name, in,
           dt_net_num_layers(net), dt_net_param_count(net), dt_net_num_views(net));
    if (dt_net_num_tables(net)) printf(" (%d embedding tables)", dt_net_num_tables(net));
    printf("\n");
    dt_net_print_plan(net, stdout);
    dt_net_free(net);
    return 0;
}

/* Text (a model file) rather than a binary header: every byte printable or white space. */
static int looks_like_text(const uint8_t *head, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!(head[i] >= 0x20 && head[i] < 0x7f) && head[i] != '\n' && head[i] != '\t' && head[i] != '\r') return 0;
    return n > 0;
}

int cmd_inspect(int argc, char **argv) {
    if (argc == 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"))) {
        printf("usage: dtrain inspect FILE\n\n"
               "FILE is a checkpoint (model.ckpt-<step>.safetensors: global step, tensors with dtype,\n"
               "shape and value range, a click-log model's embedding tables with their rows, dim,\n"
               "optimizer slots and rows trained, metadata), a TensorBoard event file (every record: offset,\n"
               "wall time, step, values), a log folder (its checkpoint index and newest checkpoint) or\n"
               "a model file (its layers and parameters, and the steps training and evaluation run:\n"
               "one layer, or two run as one, such as batchnorm+relu or a conv2d with its batch norm folded in).\n"
               "Both CRCs of every event record and a checkpoint's checksum are verified.\n");
        return 0;
    }
    if (argc != 1 || argv[0][0] == '-') {
        fprintf(stderr, "dtrain inspect: expected one FILE (run 'dtrain inspect --help')\n");
        return 2;
    }
    const char *path = argv[0];
    dt_error err = {0};
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "dtrain inspect: %s: %s\n", path, strerror(errno));
        return 1;
    }
    int status;
    if (S_ISDIR(st.st_mode)) {
        status = inspect_folder(path, &err);
    } else {
        /* Only the first 9 bytes tell what it is; each reader then validates what it reads before
         * reading on, and neither holds the file. A safetensors file starts with its header length,
         * then '{'; a record with its length, then a masked CRC: byte 8 tells them apart. */
        uint8_t head[9];
        struct stat fst;
        int fd = dt_open_regular(path, 0, &fst, &err);
        if (fd < 0) {
            fprintf(stderr, "dtrain inspect: %s\n", err.msg);
            return 1;
        }
        size_t n = fst.st_size < (off_t)sizeof head ? (size_t)fst.st_size : sizeof head;
        int bad = dt_pread_full(fd, head, n, 0);
        close(fd);
        if (bad) {
            dt_errorf(&err, DT_EIO, "%s: could not read its first bytes", path);
            status = 1;
        } else if (looks_like_text(head, n)) {
            status = inspect_model(path, &err);
        } else if (n >= 9 && head[8] == '{') {
            dt_st_file *f = NULL;
            status = dt_st_open(&f, path, &err) ? 1 : 0;
            if (!status) list_checkpoint(f, path, &err);
            dt_st_close(f);
        } else if ((uint64_t)fst.st_size >= DT_RECORD_OVERHEAD) {
            status = list_events(path, &err);
        } else {
            dt_errorf(&err, DT_EFORMAT, "%s: %lld bytes: neither a safetensors checkpoint nor an event file", path,
                      (long long)fst.st_size);
            status = 1;
        }
    }
    if (status) fprintf(stderr, "dtrain inspect: %s\n", err.msg);
    return status;
}
