#include "supervisor/supervisor.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/error.h"
#include "io/fsutil.h"
#include "supervisor/summary.h"

struct dt_supervisor {
    dt_supervisor_config cfg;
    float *params, *state;     /* snapshot buffers [n], [slots * n] (also the restored state) */
    size_t n;
    int slots, restored, saves;
    int64_t restored_step, saved_step; /* saved_step: -1 before the first save */
    double next_save;          /* monotonic seconds */
    int64_t rate_step;         /* global step and time of the last training summary (or start) */
    double rate_time;
    char last[DT_PATH_MAX];
    dt_summary *summary;
    uint8_t *coord;            /* the restored checkpoint's coordinator state; NULL: none */
    size_t coord_len;
    dt_st_file *file;          /* the restored checkpoint, kept open when the net's tables live elsewhere
                                * (a compact net's: their rows are read from it later) */
    char file_path[DT_PATH_MAX];
};

static int checkpoints_on(const dt_supervisor *s) { return s->cfg.logdir && s->cfg.logdir[0]; }

/* Differences between the run and the checkpoint that change what "resuming" means. */
static void warn_differences(dt_supervisor *s, const dt_st_file *f, const char *path) {
    FILE *log = s->cfg.log;
    dt_ckpt_info info;
    if (!log || dt_ckpt_read_info(f, path, &info, NULL)) return;
    const dt_ckpt_run *run = &s->cfg.run;
    if (info.has_seed && info.seed != run->seed)
        fprintf(log, "warning: %s was trained with --seed %" PRIu64 ", this run uses %" PRIu64
                     ": the data order from here on differs\n", path, info.seed, run->seed);
    if ((info.batch_size && info.batch_size != run->batch_size) || (info.n_workers && info.n_workers != run->n_workers))
        fprintf(log, "warning: %s was trained with batch %d on %d worker(s), this run uses batch %d on %d: the data "
                     "position is carried over as global_step / workers batches\n",
                path, info.batch_size, info.n_workers, run->batch_size, run->n_workers);
    if (info.learning_rate > 0 && run->opt && info.learning_rate != run->opt->learning_rate)
        fprintf(log, "note: %s was trained with learning rate %g, this run uses %g\n", path, (double)info.learning_rate,
                (double)run->opt->learning_rate);
}

static int restore(dt_supervisor *s, dt_error *err) {
    dt_st_close(s->file); /* a reload's: the newest checkpoint is opened again */
    s->file = NULL;
    dt_st_file *f = NULL;
    char path[DT_PATH_MAX];
    /* The run is known: each candidate's table is checked against it before its data is read. */
    int found = dt_ckpt_open_latest_for(&f, path, sizeof path, s->cfg.logdir, dt_ckpt_fits_check, &s->cfg.run,
                                        s->cfg.log, err);
    if (found <= 0) return found;
    int rc = dt_ckpt_load(f, path, &s->cfg.run, s->params, s->state, &s->restored_step, err);
    free(s->coord);
    s->coord = NULL, s->coord_len = 0;
    if (!rc) rc = dt_ckpt_read_coord(f, path, &s->coord, &s->coord_len, err);
    if (!rc) {
        warn_differences(s, f, path);
        size_t cleared = dt_ckpt_clear_untrained_slots(&s->cfg.run, s->state);
        if (cleared && s->cfg.log)
            fprintf(s->cfg.log, "note: %s holds non-zero optimizer slots for batch norm's moving statistics (%zu "
                                "floats; an older dtrain's sync cluster wrote them): zeroed, as the statistics are "
                                "not trained\n", path, cleared);
        /* The chief owns the folder: the index names what was restored from now on, so the warnings
         * about it are given once and retention knows a checkpoint the index had missed. */
        const char *slash = strrchr(path, '/');
        dt_error e = {0};
        if (dt_ckpt_adopt(s->cfg.logdir, slash ? slash + 1 : path, s->cfg.log, &e) && s->cfg.log)
            fprintf(s->cfg.log, "warning: could not update the checkpoint index (the next save tries again): %s\n", e.msg);
        s->restored = 1;
        s->saved_step = s->restored_step;
        snprintf(s->last, sizeof s->last, "%s", path);
        if (s->cfg.log) {
            fprintf(s->cfg.log, "restored %s: global step %" PRId64 "\n", path, s->restored_step);
            fflush(s->cfg.log);
        }
        if (dt_net_compact_tables(s->cfg.run.net) && dt_net_num_tables(s->cfg.run.net)) {
            s->file = f, f = NULL;
            snprintf(s->file_path, sizeof s->file_path, "%s", path);
        }
    }
    dt_st_close(f);
    return rc;
}

int dt_supervisor_open(dt_supervisor **out, const dt_supervisor_config *cfg, dt_error *err) {
    *out = NULL;
    dt_supervisor *s = dt_calloc(1, sizeof *s, "supervisor", err);
    if (!s) return DT_ENOMEM;
    s->cfg = *cfg;
    s->saved_step = -1;
    s->n = dt_net_param_count(cfg->run.net);
    s->slots = dt_ckpt_state_slots(&cfg->run);
    int rc = 0;
    if (checkpoints_on(s)) {
        size_t ns = s->n * (size_t)s->slots;
        if (!(s->params = dt_alloc_floats(s->n ? s->n : 1, "checkpoint parameters", err)) ||
            !(s->state = dt_alloc_floats(ns ? ns : 1, "checkpoint optimizer state", err))) {
            rc = DT_ENOMEM;
            goto fail;
        }
        if ((rc = restore(s, err))) goto fail;
    }
    if (cfg->summary_dir && cfg->summary_dir[0] && (rc = dt_summary_open(&s->summary, cfg->summary_dir, err)))
        goto fail;
    *out = s;
    return 0;
fail:
    dt_supervisor_close(s);
    return rc;
}

int dt_supervisor_restored(const dt_supervisor *s, const float **params, const float **state, int64_t *global_step) {
    if (!s || !s->restored) return 0;
    *params = s->params;
    *state = s->state;
    *global_step = s->restored_step;
    return 1;
}

int dt_supervisor_restored_file(const dt_supervisor *s, const dt_st_file **f, const char **path) {
    if (!s || !s->restored || !s->file) return 0;
    *f = s->file, *path = s->file_path;
    return 1;
}

int dt_supervisor_restored_coord(const dt_supervisor *s, const uint8_t **state, size_t *len) {
    if (!s || !s->restored || !s->coord) return 0;
    *state = s->coord, *len = s->coord_len;
    return 1;
}

int dt_supervisor_reload(dt_supervisor *s, const float **params, const float **state, int64_t *global_step,
                         dt_error *err) {
    if (!s || !checkpoints_on(s)) return 0;
    s->restored = 0;
    int rc = restore(s, err);
    if (rc) return rc;
    return dt_supervisor_restored(s, params, state, global_step);
}

/* Snapshot and save; *step gets the snapshot's step. */
static int save(dt_supervisor *s, int final, int64_t *step, dt_error *err) {
    int64_t at = 0;
    int rc = s->cfg.snapshot(s->cfg.user, s->params, s->slots ? s->state : NULL, &at, final, err);
    if (rc) return rc;
    *step = at;
    if (at == s->saved_step) return 0;
    double t0 = dt_seconds();
    char name[64];
    dt_ckpt_run run = s->cfg.run;
    if (s->cfg.coord) s->cfg.coord(s->cfg.user, &run.coord, &run.coord_len);
    rc = dt_ckpt_save(s->cfg.logdir, &run, s->params, s->slots ? s->state : NULL, at, s->cfg.max_to_keep,
                      s->cfg.log, name, sizeof name, err);
    if (rc) return rc;
    s->saved_step = at;
    s->saves++;
    dt_path_join(s->last, sizeof s->last, s->cfg.logdir, name, NULL);
    if (s->cfg.log) {
        fprintf(s->cfg.log, "saved checkpoint %s (global step %" PRId64 ", %.0f ms)\n", s->last, at,
                (dt_seconds() - t0) * 1e3);
        fflush(s->cfg.log);
    }
    return 0;
}

int dt_supervisor_started(dt_supervisor *s, int64_t global_step, dt_error *err) {
    if (!s) return 0;
    s->rate_step = global_step;
    s->rate_time = dt_seconds();
    if (!checkpoints_on(s)) return 0;
    s->next_save = dt_seconds() + s->cfg.save_secs;
    if (s->restored && s->restored_step == global_step) return 0;
    int64_t at;
    return save(s, 0, &at, err);
}

int dt_supervisor_step(dt_supervisor *s, int64_t global_step, dt_error *err) {
    if (!s || !checkpoints_on(s) || s->cfg.save_secs <= 0 || global_step == s->saved_step) return 0;
    double now = dt_seconds();
    if (now < s->next_save) return 0;
    s->next_save = now + s->cfg.save_secs;
    int64_t at;
    dt_error e = {0};
    if (save(s, 0, &at, &e) && s->cfg.log) {
        fprintf(s->cfg.log, "warning: periodic checkpoint failed (training goes on): %s\n", e.msg);
        fflush(s->cfg.log);
    }
    return 0;
}

int dt_supervisor_final(dt_supervisor *s, float *params_out, int64_t *global_step, dt_error *err) {
    if (!s || !checkpoints_on(s)) return 0;
    int64_t at = 0;
    int rc = save(s, 1, &at, err);
    if (rc) return rc;
    if (params_out && params_out != s->params) memcpy(params_out, s->params, s->n * sizeof(float));
    if (global_step) *global_step = at;
    return 0;
}

static void summary_failed(dt_supervisor *s, const dt_error *e) {
    if (s->cfg.log) {
        fprintf(s->cfg.log, "warning: summaries turned off: %s\n", e->msg);
        fflush(s->cfg.log);
    }
    dt_summary_close(s->summary, NULL);
    s->summary = NULL;
}

void dt_supervisor_summary_train(dt_supervisor *s, int64_t global_step, double cost, double accuracy) {
    if (!s || !s->summary) return;
    double now = dt_seconds(), dt = now - s->rate_time;
    double steps_per_sec = dt > 0 ? (double)(global_step - s->rate_step) / dt : 0;
    s->rate_step = global_step;
    s->rate_time = now;
    /* The rate of the update at this global step, as every ps computes it (compute/schedule.h). */
    const dt_opt_config *o = s->cfg.run.opt;
    double lr = o ? (double)dt_lr_at(&o->schedule, o->learning_rate, global_step) : 0;
    dt_error e = {0};
    if (dt_summary_train(s->summary, global_step, cost, accuracy, steps_per_sec,
                         steps_per_sec * s->cfg.examples_per_step, lr, &e))
        summary_failed(s, &e);
}

void dt_supervisor_summary_test(dt_supervisor *s, int64_t global_step, double cost, double accuracy) {
    dt_error e = {0};
    if (s && s->summary && dt_summary_test(s->summary, global_step, cost, accuracy, &e)) summary_failed(s, &e);
}

void dt_supervisor_summary_binary(dt_supervisor *s, int64_t global_step, double auc, double logloss) {
    dt_error e = {0};
    if (s && s->summary && dt_summary_binary(s->summary, global_step, auc, logloss, &e)) summary_failed(s, &e);
}

const char *dt_supervisor_last_checkpoint(const dt_supervisor *s) { return s ? s->last : ""; }
int dt_supervisor_saves(const dt_supervisor *s) { return s ? s->saves : 0; }

void dt_supervisor_set_batches_per_epoch(dt_supervisor *s, int64_t per) {
    if (s) s->cfg.run.batches_per_epoch = per;
}

void dt_supervisor_close(dt_supervisor *s) {
    if (!s) return;
    dt_error e = {0};
    if (dt_summary_close(s->summary, &e) && s->cfg.log) fprintf(s->cfg.log, "warning: %s\n", e.msg);
    free(s->params);
    free(s->state);
    free(s->coord);
    dt_st_close(s->file);
    free(s);
}
