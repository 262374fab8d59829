/* Checkpoints (src/supervisor/checkpoint.h): round trip of parameters, optimizer state, step and
 * metadata; retention and the index; damaged newest checkpoints; another model or optimizer
 * refused; a writer killed at random moments never leaves an index naming an incomplete file. */
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "compute/lazy_optim.h"
#include "core/rng.h"
#include "model/net.h"
#include "supervisor/checkpoint.h"
#include "supervisor/ckpt_index.h"
#include "io/fsutil.h"
#include "supervisor/supervisor.h"
#include "test.h"

static const char *MODEL_A = "model small\ninput 6 6 1\nconv2d filters=3 kernel=3\nrelu\nflatten\ndense units=4\n";
/* Same layer names, another conv width: conv1/kernel differs, and dense1/kernel with it. */
static const char *MODEL_B = "model small\ninput 6 6 1\nconv2d filters=5 kernel=3\nrelu\nflatten\ndense units=4\n";

static char tmpdir[256];

static dt_net *build(const char *text) {
    dt_model_spec spec;
    dt_error err = {0};
    dt_net *net = NULL;
    CHECK(dt_model_spec_parse(&spec, text, strlen(text), "small.model", &err) == 0);
    CHECK(dt_net_build(&net, &spec, 4, &err) == 0);
    dt_model_spec_free(&spec);
    return net;
}

static void fill(float *x, size_t n, uint64_t seed) {
    dt_rng r;
    dt_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = dt_rng_uniform(&r) - 0.5f;
}

static void subdir(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", tmpdir, name);
}

static int file_exists(const char *dir, const char *name) {
    char p[DT_PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat st;
    return stat(p, &st) == 0;
}

/* A run description over net with optimizer opt. */
static dt_ckpt_run run_of(const dt_net *net, const dt_opt_config *opt) {
    return (dt_ckpt_run){.net = net, .opt = opt, .seed = 77, .batch_size = 4, .n_workers = 1,
                         .batches_per_epoch = 10, .validation_fraction = -1};
}

static void save_steps(const char *dir, const dt_ckpt_run *run, const float *p, const float *s, int from, int to,
                       int keep) {
    dt_error err = {0};
    for (int step = from; step <= to; step++)
        CHECK_MSG(dt_ckpt_save(dir, run, p, s, step, keep, NULL, NULL, 0, &err) == 0, "%s", err.msg);
}

static void test_round_trip(void) {
    dt_net *net = build(MODEL_A);
    dt_opt_config opt;
    dt_error err = {0};
    CHECK(dt_opt_config_init(&opt, "adam", 0.01f, &err) == 0);
    size_t n = dt_net_param_count(net);
    float *p = dt_alloc_floats(n, "p", NULL), *s = dt_alloc_floats(2 * n, "s", NULL);
    float *p2 = dt_alloc_floats(n, "p2", NULL), *s2 = dt_alloc_floats(2 * n, "s2", NULL);
    fill(p, n, 1), fill(s, 2 * n, 2);
    char dir[512], name[64];
    subdir(dir, sizeof dir, "rt/nested");
    dt_ckpt_run run = run_of(net, &opt);
    CHECK_MSG(dt_ckpt_save(dir, &run, p, s, 1234, 5, NULL, name, sizeof name, &err) == 0, "%s", err.msg);
    CHECK(strcmp(name, "model.ckpt-1234.safetensors") == 0);

    dt_st_file *f = NULL;
    char path[DT_PATH_MAX];
    CHECK(dt_ckpt_open_latest(&f, path, sizeof path, dir, NULL, &err) == 1);
    if (!f) return;
    CHECK_CONTAINS(path, "model.ckpt-1234.safetensors");
    /* One tensor per view, two slots each, and the step. */
    CHECK(dt_st_num_tensors(f) == 3 * 4 + 1);
    const dt_st_info *k = dt_st_find(f, "conv1/kernel");
    CHECK(k && k->ndim == 4 && k->shape[0] == 3 && k->shape[1] == 3 && k->shape[2] == 1 && k->shape[3] == 3);
    const dt_st_info *v = dt_st_find(f, "dense1/kernel/adam_v");
    CHECK(v && v->ndim == 2 && v->shape[0] == 4 * 4 * 3 && v->shape[1] == 4);
    const dt_st_info *g = dt_st_find(f, "global_step");
    CHECK(g && g->dtype == DT_ST_I64 && g->ndim == 0);
    CHECK(dt_st_has_checksum(f));
    CHECK(strcmp(dt_ckpt_model_text(f), MODEL_A) == 0);
    CHECK_CONTAINS(dt_st_meta_get(f, "dtrain_version"), dt_version());

    dt_ckpt_info info;
    CHECK(dt_ckpt_read_info(f, path, &info, &err) == 0);
    CHECK(info.global_step == 1234 && info.seed == 77 && info.has_seed && info.batch_size == 4);
    CHECK(info.n_workers == 1 && info.batches_per_epoch == 10 && strcmp(info.optimizer, "adam") == 0);
    CHECK(info.learning_rate == 0.01f);
    CHECK_CONTAINS(dt_st_meta_get(f, "data_position"), "\"epoch\":123");
    CHECK_CONTAINS(dt_st_meta_get(f, "data_position"), "\"batch_in_epoch\":4");

    int64_t step = -1;
    CHECK_MSG(dt_ckpt_load(f, path, &run, p2, s2, &step, &err) == 0, "%s", err.msg);
    CHECK(step == 1234);
    CHECK(memcmp(p, p2, n * sizeof *p) == 0);
    CHECK(memcmp(s, s2, 2 * n * sizeof *s) == 0);
    /* Slot k of a view sits at k*n + offset: the adam_v tensor is the second half's slice. */
    const dt_param_view *dv = NULL;
    for (int i = 0; i < dt_net_num_views(net); i++)
        if (!strcmp(dt_net_view(net, i)->name, "dense1/kernel")) dv = dt_net_view(net, i);
    float first = NAN;
    CHECK(dt_st_read_part(f, v, 0, &first, 4, &err) == 0);
    CHECK(dv && first == s[n + dv->offset]);
    dt_st_close(f);

    /* The index names it, as the newest. */
    dt_ckpt_index idx;
    CHECK(dt_ckpt_index_read(&idx, dir, &err) == 0);
    CHECK(idx.n_paths == 1 && strcmp(idx.model_checkpoint_path, "model.ckpt-1234.safetensors") == 0);
    dt_ckpt_index_free(&idx);

    /* Parameters only (sgd: no slots; eval: no state). */
    dt_opt_config sgd;
    dt_opt_config_init(&sgd, "sgd", 0.1f, &err);
    dt_ckpt_run r2 = run_of(net, &sgd);
    char dir2[512];
    subdir(dir2, sizeof dir2, "rt_sgd");
    CHECK(dt_ckpt_save(dir2, &r2, p, NULL, 5, 5, NULL, NULL, 0, &err) == 0);
    CHECK(dt_ckpt_open_latest(&f, path, sizeof path, dir2, NULL, &err) == 1);
    CHECK(f && dt_st_num_tensors(f) == 4 + 1);
    memset(p2, 0, n * sizeof *p2);
    dt_ckpt_run eval = {.net = net};
    CHECK(f && dt_ckpt_load(f, path, &eval, p2, NULL, &step, &err) == 0 && step == 5);
    CHECK(memcmp(p, p2, n * sizeof *p) == 0);
    dt_st_close(f);
    free(p), free(s), free(p2), free(s2);
    dt_net_free(net);
}

static void test_retention(void) {
    dt_net *net = build(MODEL_A);
    dt_opt_config opt;
    dt_opt_config_init(&opt, "momentum", 0.01f, NULL);
    size_t n = dt_net_param_count(net);
    float *p = dt_alloc_floats(n, "p", NULL), *s = dt_alloc_floats(n, "s", NULL);
    fill(p, n, 3), fill(s, n, 4);
    char dir[512];
    subdir(dir, sizeof dir, "keep");
    dt_ckpt_run run = run_of(net, &opt);
    save_steps(dir, &run, p, s, 0, 6, 3);
    dt_ckpt_index idx;
    dt_error err = {0};
    CHECK(dt_ckpt_index_read(&idx, dir, &err) == 0);
    CHECK(idx.n_paths == 3);
    for (int i = 0; i < idx.n_paths; i++) {
        char want[64];
        dt_ckpt_file_name(want, sizeof want, 4 + i);
        CHECK(strcmp(idx.paths[i], want) == 0);
        CHECK(file_exists(dir, want));
    }
    dt_ckpt_index_free(&idx);
    CHECK(!file_exists(dir, "model.ckpt-3.safetensors") && !file_exists(dir, "model.ckpt-0.safetensors"));
    /* Re-saving a kept step moves it to the end without dropping anything. */
    save_steps(dir, &run, p, s, 5, 5, 3);
    CHECK(dt_ckpt_index_read(&idx, dir, &err) == 0);
    CHECK(idx.n_paths == 3 && strcmp(idx.model_checkpoint_path, "model.ckpt-5.safetensors") == 0);
    dt_ckpt_index_free(&idx);
    free(p), free(s);
    dt_net_free(net);
}

/* Flips one byte of a file at offset from its end, or truncates it to keep bytes. */
static void damage(const char *dir, const char *name, long flip_from_end, long keep) {
    char path[DT_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (keep >= 0) {
        CHECK(truncate(path, keep) == 0);
        return;
    }
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    if (!f) return;
    fseek(f, -flip_from_end, SEEK_END);
    int c = fgetc(f);
    fseek(f, -flip_from_end, SEEK_END);
    fputc(c ^ 0x10, f);
    fclose(f);
}

/* Reads what open_latest printed as warnings. */
static int latest_with_log(const char *dir, char *path, size_t cap, char *logbuf, size_t logcap, dt_error *err) {
    FILE *log = tmpfile();
    dt_st_file *f = NULL;
    int rc = dt_ckpt_open_latest(&f, path, cap, dir, log, err);
    dt_st_close(f);
    rewind(log);
    size_t got = fread(logbuf, 1, logcap - 1, log);
    logbuf[got] = 0;
    fclose(log);
    return rc;
}

static void test_damaged_newest(void) {
    dt_net *net = build(MODEL_A);
    dt_opt_config opt;
    dt_opt_config_init(&opt, "adam", 0.01f, NULL);
    size_t n = dt_net_param_count(net);
    float *p = dt_alloc_floats(n, "p", NULL), *s = dt_alloc_floats(2 * n, "s", NULL);
    fill(p, n, 5), fill(s, 2 * n, 6);
    dt_ckpt_run run = run_of(net, &opt);
    char dir[512], path[DT_PATH_MAX], log[4096];
    dt_error err = {0};

    subdir(dir, sizeof dir, "flip");
    save_steps(dir, &run, p, s, 10, 12, 5);
    damage(dir, "model.ckpt-12.safetensors", 100, -1);  /* a byte inside a tensor */
    CHECK(latest_with_log(dir, path, sizeof path, log, sizeof log, &err) == 1);
    CHECK_CONTAINS(path, "model.ckpt-11.safetensors");
    CHECK_CONTAINS(log, "warning");
    CHECK_CONTAINS(log, "model.ckpt-12.safetensors");
    CHECK_CONTAINS(log, "checksum");

    subdir(dir, sizeof dir, "trunc");
    save_steps(dir, &run, p, s, 10, 12, 5);
    damage(dir, "model.ckpt-12.safetensors", 0, 1000);
    CHECK(latest_with_log(dir, path, sizeof path, log, sizeof log, &err) == 1);
    CHECK_CONTAINS(path, "model.ckpt-11.safetensors");
    CHECK_CONTAINS(log, "model.ckpt-12.safetensors");

    /* The two newest damaged: the third is used, with a warning for each. */
    damage(dir, "model.ckpt-11.safetensors", 3, -1);
    CHECK(latest_with_log(dir, path, sizeof path, log, sizeof log, &err) == 1);
    CHECK_CONTAINS(path, "model.ckpt-10.safetensors");
    CHECK_CONTAINS(log, "model.ckpt-11.safetensors");

    /* A listed file that is gone: skipped too. */
    subdir(dir, sizeof dir, "gone");
    save_steps(dir, &run, p, s, 1, 2, 5);
    char gone[DT_PATH_MAX];
    snprintf(gone, sizeof gone, "%s/model.ckpt-2.safetensors", dir);
    unlink(gone);
    CHECK(latest_with_log(dir, path, sizeof path, log, sizeof log, &err) == 1);
    CHECK_CONTAINS(path, "model.ckpt-1.safetensors");

    /* None usable: an error naming the folder, not a silent fresh start. */
    damage(dir, "model.ckpt-1.safetensors", 0, 7);
    CHECK(latest_with_log(dir, path, sizeof path, log, sizeof log, &err) == DT_EFORMAT);
    CHECK_CONTAINS(err.msg, dir);
    CHECK_CONTAINS(err.msg, "none of its 2 checkpoint(s)");

    /* No folder, or an empty one: nothing to restore. */
    subdir(dir, sizeof dir, "absent");
    CHECK(latest_with_log(dir, path, sizeof path, log, sizeof log, &err) == 0);

    /* No index (lost, or never written): the files themselves, highest step first. A damaged index
     * is the same, with a warning. */
    subdir(dir, sizeof dir, "noindex");
    save_steps(dir, &run, p, s, 8, 9, 5);
    save_steps(dir, &run, p, s, 10, 10, 5);
    char ip[DT_PATH_MAX];
    snprintf(ip, sizeof ip, "%s/checkpoint", dir);
    unlink(ip);
    CHECK(latest_with_log(dir, path, sizeof path, log, sizeof log, &err) == 1);
    CHECK_CONTAINS(path, "model.ckpt-10.safetensors");
    FILE *fi = fopen(ip, "w");
    fputs("model_checkpoint_path: \"model.ckpt-9.safetensors\"\nbogus_field: 1\n", fi);
    fclose(fi);
    CHECK(latest_with_log(dir, path, sizeof path, log, sizeof log, &err) == 1);
    CHECK_CONTAINS(path, "model.ckpt-10.safetensors");
    CHECK_CONTAINS(log, "checkpoint:2");
    /* Saving over a damaged index replaces it, with a warning; the new index lists the folder's
     * checkpoint files too, so that retention still covers them. */
    FILE *wl = tmpfile();
    CHECK(dt_ckpt_save(dir, &run, p, s, 11, 5, wl, NULL, 0, &err) == 0);
    rewind(wl);
    size_t got = fread(log, 1, sizeof log - 1, wl);
    log[got] = 0;
    fclose(wl);
    CHECK_CONTAINS(log, "writing a new index");
    dt_ckpt_index idx;
    CHECK(dt_ckpt_index_read(&idx, dir, &err) == 0 && idx.n_paths == 4);
    CHECK(idx.n_paths == 4 && !strcmp(idx.paths[0], "model.ckpt-8.safetensors") &&
          !strcmp(idx.paths[3], "model.ckpt-11.safetensors"));
    dt_ckpt_index_free(&idx);
    free(p), free(s);
    dt_net_free(net);
}

static void test_refusals(void) {
    dt_net *a = build(MODEL_A), *b = build(MODEL_B);
    dt_opt_config adam, mom;
    dt_opt_config_init(&adam, "adam", 0.01f, NULL);
    dt_opt_config_init(&mom, "momentum", 0.01f, NULL);
    size_t na = dt_net_param_count(a), nb = dt_net_param_count(b);
    float *p = dt_alloc_floats(na, "p", NULL), *s = dt_alloc_floats(2 * na, "s", NULL);
    float *pb = dt_alloc_floats(nb, "pb", NULL), *sb = dt_alloc_floats(2 * nb, "sb", NULL);
    fill(p, na, 7), fill(s, 2 * na, 8);
    memset(pb, 0, nb * sizeof *pb);
    char dir[512], path[DT_PATH_MAX];
    subdir(dir, sizeof dir, "refuse");
    dt_ckpt_run ra = run_of(a, &adam), rb = run_of(b, &adam), rm = run_of(a, &mom);
    dt_error err = {0};
    CHECK(dt_ckpt_save(dir, &ra, p, s, 3, 5, NULL, NULL, 0, &err) == 0);
    dt_st_file *f = NULL;
    CHECK(dt_ckpt_open_latest(&f, path, sizeof path, dir, NULL, &err) == 1);
    if (!f) return;

    /* Another model: says which variable differs, how, and the model line. */
    CHECK(dt_ckpt_load(f, path, &rb, pb, sb, NULL, &err) == DT_ESHAPE);
    CHECK_CONTAINS(err.msg, "another model");
    CHECK_CONTAINS(err.msg, "conv1/kernel is F32 [3,3,1,3] in the checkpoint, F32 [3,3,1,5] here");
    CHECK_CONTAINS(err.msg, "model line 3");
    CHECK_CONTAINS(err.msg, "conv2d filters=5");
    for (size_t i = 0; i < nb; i++)
        if (pb[i] != 0) { CHECK(!"a refused checkpoint wrote parameters"); break; }

    /* Another optimizer: says which. */
    CHECK(dt_ckpt_load(f, path, &rm, p, s, NULL, &err) == DT_EINVAL);
    CHECK_CONTAINS(err.msg, "optimizer adam");
    CHECK_CONTAINS(err.msg, "momentum");
    dt_st_close(f);
    free(p), free(s), free(pb), free(sb);
    dt_net_free(a), dt_net_free(b);
}

/* A child saves checkpoints as fast as it can (retention 2) and is SIGKILLed at a random moment;
 * every time, every checkpoint the index names opens whole with a good checksum. */
static void test_killed_writer(void) {
    dt_net *net = build(MODEL_A);
    dt_opt_config opt;
    dt_opt_config_init(&opt, "adam", 0.01f, NULL);
    size_t n = dt_net_param_count(net);
    float *p = dt_alloc_floats(n, "p", NULL), *s = dt_alloc_floats(2 * n, "s", NULL);
    fill(p, n, 9), fill(s, 2 * n, 10);
    dt_ckpt_run run = run_of(net, &opt);
    char dir[512];
    subdir(dir, sizeof dir, "killed");
    srand((unsigned)time(NULL));
    for (int round = 0; round < 6; round++) {
        pid_t pid = fork();
        if (pid == 0) {
            for (int step = round * 100000;; step++)
                if (dt_ckpt_save(dir, &run, p, s, step, 2, NULL, NULL, 0, NULL)) _exit(3);
        }
        /* Kill at a random moment once the first save of this round is in the index (a loaded
         * machine may take a while to get there). */
        char want[64], ip[DT_PATH_MAX];
        dt_ckpt_file_name(want, sizeof want, round * 100000);
        snprintf(ip, sizeof ip, "%s/checkpoint", dir);
        for (int i = 0; i < 3000; i++) {
            uint8_t *text = NULL;
            size_t len = 0;
            int seen = dt_read_file(&text, &len, ip, 1 << 20, NULL) == 0 && strstr((char *)text, want);
            free(text);
            if (seen) break;
            usleep(2000);
        }
        usleep((useconds_t)(rand() % 60000));
        kill(pid, SIGKILL);
        int st;
        waitpid(pid, &st, 0);
        CHECK(WIFSIGNALED(st));
        dt_ckpt_index idx;
        dt_error err = {0};
        CHECK_MSG(dt_ckpt_index_read(&idx, dir, &err) == 0, "%s", err.msg);
        CHECK(idx.n_paths >= 1 && idx.n_paths <= 2);
        for (int i = 0; i < idx.n_paths; i++) {
            char path[DT_PATH_MAX];
            snprintf(path, sizeof path, "%s/%s", dir, idx.paths[i]);
            dt_st_file *f = NULL;
            CHECK_MSG(dt_st_open(&f, path, &err) == 0, "round %d: %s", round, err.msg);
            dt_st_close(f);
        }
        dt_ckpt_index_free(&idx);
    }
    free(p), free(s);
    dt_net_free(net);
}

/* The supervisor: restore, save at start unless just restored, periodic saves, final save. */
typedef struct {
    float *p, *s;
    size_t n;
    int64_t step;
    int calls, finals;
} fake_state;

static int fake_snapshot(void *user, float *params, float *state, int64_t *step, int final, dt_error *err) {
    fake_state *f = user;
    memcpy(params, f->p, f->n * sizeof(float));
    if (state) memcpy(state, f->s, 2 * f->n * sizeof(float));
    *step = f->step;
    f->calls++;
    f->finals += final;
    return 0;
}

static void test_supervisor(void) {
    dt_net *net = build(MODEL_A);
    dt_opt_config opt;
    dt_opt_config_init(&opt, "adam", 0.01f, NULL);
    size_t n = dt_net_param_count(net);
    fake_state fs = {dt_alloc_floats(n, "p", NULL), dt_alloc_floats(2 * n, "s", NULL), n, 0, 0, 0};
    fill(fs.p, n, 11), fill(fs.s, 2 * n, 12);
    char dir[512], sum[512];
    subdir(dir, sizeof dir, "sv/ckpt");
    subdir(sum, sizeof sum, "sv/summary");
    dt_supervisor_config cfg = {.logdir = dir, .save_secs = 0.5, .max_to_keep = 5, .summary_dir = sum,
                                .run = run_of(net, &opt), .snapshot = fake_snapshot, .user = &fs};
    dt_supervisor *sv = NULL;
    dt_error err = {0};
    const float *rp, *rs;
    int64_t rstep;
    CHECK_MSG(dt_supervisor_open(&sv, &cfg, &err) == 0, "%s", err.msg);
    if (!sv) return;
    CHECK(dt_supervisor_restored(sv, &rp, &rs, &rstep) == 0);
    CHECK(dt_supervisor_started(sv, 0, &err) == 0 && dt_supervisor_saves(sv) == 1);
    fs.step = 7;
    CHECK(dt_supervisor_step(sv, 7, &err) == 0 && dt_supervisor_saves(sv) == 1); /* not due yet */
    usleep(600000);
    CHECK(dt_supervisor_step(sv, 7, &err) == 0 && dt_supervisor_saves(sv) == 2);
    fs.step = 9;
    fs.p[0] = 42.0f;
    float *out = dt_alloc_floats(n, "out", NULL);
    int64_t fstep = 0;
    CHECK(dt_supervisor_final(sv, out, &fstep, &err) == 0 && fstep == 9 && out[0] == 42.0f);
    CHECK(dt_supervisor_saves(sv) == 3 && fs.finals == 1);
    CHECK_CONTAINS(dt_supervisor_last_checkpoint(sv), "model.ckpt-9.safetensors");
    dt_supervisor_summary_train(sv, 9, 0.5, 0.75);
    dt_supervisor_summary_test(sv, 9, 0.6, 0.7);
    dt_supervisor_close(sv);
    CHECK(file_exists(dir, "model.ckpt-0.safetensors") && file_exists(dir, "model.ckpt-7.safetensors"));

    /* Reopened: restores step 9 with its state, and does not save that step again at start. */
    CHECK(dt_supervisor_open(&sv, &cfg, &err) == 0);
    CHECK(dt_supervisor_restored(sv, &rp, &rs, &rstep) == 1 && rstep == 9);
    CHECK(rp && rp[0] == 42.0f && memcmp(rp + 1, fs.p + 1, (n - 1) * sizeof(float)) == 0);
    CHECK(rs && memcmp(rs, fs.s, 2 * n * sizeof(float)) == 0);
    CHECK(dt_supervisor_started(sv, 9, &err) == 0 && dt_supervisor_saves(sv) == 0);
    dt_supervisor_close(sv);

    /* Both summary folders got an event file. */
    char sub[600];
    snprintf(sub, sizeof sub, "%s/train", sum);
    DIR *d = opendir(sub);
    int found = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, "events.out.tfevents.")) found++;
    if (d) closedir(d);
    CHECK(found >= 1);
    free(fs.p), free(fs.s), free(out);
    dt_net_free(net);
}

/* ---- A hostile or damaged log folder ------------------------------------------------------------ */

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* Occurrences of needle in haystack. */
static int count_of(const char *haystack, const char *needle) {
    int n = 0;
    for (const char *p = strstr(haystack, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

/* What a FILE opened with tmpfile() holds, into buf; closes it. */
static void drain(FILE *f, char *buf, size_t cap) {
    rewind(f);
    size_t got = fread(buf, 1, cap - 1, f);
    buf[got] = 0;
    fclose(f);
}

static void save_logged(const char *dir, const dt_ckpt_run *run, const float *p, const float *s, int64_t step,
                        int keep, char *logbuf, size_t logcap) {
    FILE *log = tmpfile();
    dt_error err = {0};
    CHECK_MSG(dt_ckpt_save(dir, run, p, s, step, keep, log, NULL, 0, &err) == 0, "%s", err.msg);
    drain(log, logbuf, logcap);
}

/* An index naming files outside the log folder (through "..", an absolute path) is never read from
 * there, and retention never deletes them: the entries are ignored with one warning each, naming the
 * index file and line. */
static void test_index_outside_logdir(void) {
    dt_net *net = build(MODEL_A);
    dt_opt_config opt;
    dt_opt_config_init(&opt, "adam", 0.01f, NULL);
    size_t n = dt_net_param_count(net);
    float *p = dt_alloc_floats(n, "p", NULL), *s = dt_alloc_floats(2 * n, "s", NULL);
    fill(p, n, 21), fill(s, 2 * n, 22);
    dt_ckpt_run run = run_of(net, &opt);
    char dir[512], out[512], victim[600], ip[600], text[4096], log[8192], path[DT_PATH_MAX];
    subdir(dir, sizeof dir, "escape/L");
    subdir(out, sizeof out, "escape/out");
    save_steps(dir, &run, p, s, 1, 2, 5);
    save_steps(out, &run, p, s, 99, 99, 5); /* a good, newer checkpoint a path-following reader would take */
    snprintf(victim, sizeof victim, "%s/escape/victim.txt", tmpdir);
    write_text(victim, "precious\n");
    snprintf(ip, sizeof ip, "%s/checkpoint", dir);
    snprintf(text, sizeof text,
             "model_checkpoint_path: \"../out/model.ckpt-99.safetensors\"\n"
             "all_model_checkpoint_paths: \"../victim.txt\"\n"
             "all_model_checkpoint_paths: \"%s/model.ckpt-99.safetensors\"\n"
             "all_model_checkpoint_paths: \"model.ckpt-1.safetensors\"\n"
             "all_model_checkpoint_paths: \"model.ckpt-2.safetensors\"\n"
             "all_model_checkpoint_paths: \"../out/model.ckpt-99.safetensors\"\n",
             out);
    write_text(ip, text);

    dt_error err = {0};
    CHECK(latest_with_log(dir, path, sizeof path, log, sizeof log, &err) == 1);
    CHECK_MSG(strstr(path, "escape/L/model.ckpt-2.safetensors") != NULL, "opened %s", path);
    CHECK_CONTAINS(log, "checkpoint:1: ignoring checkpoint path \"../out/model.ckpt-99.safetensors\"");
    CHECK_CONTAINS(log, "checkpoint:2: ignoring checkpoint path \"../victim.txt\"");
    CHECK_CONTAINS(log, "checkpoint:3: ignoring checkpoint path \"/");
    CHECK_MSG(count_of(log, "../out/model.ckpt-99") == 1, "one warning per path:\n%s", log); /* lines 1 and 6 */
    CHECK(strstr(log, "skipping") == NULL); /* nothing outside was even opened */

    /* Retention with max_to_keep 2 over that index: the victim survives, the outside checkpoint too. */
    save_logged(dir, &run, p, s, 3, 2, log, sizeof log);
    CHECK_CONTAINS(log, "../victim.txt");
    save_logged(dir, &run, p, s, 4, 2, log, sizeof log);
    CHECK_MSG(strstr(log, "victim") == NULL, "the rewritten index no longer names it:\n%s", log);
    struct stat st;
    CHECK_MSG(stat(victim, &st) == 0, "%s was deleted", victim);
    CHECK(file_exists(out, "model.ckpt-99.safetensors"));
    dt_ckpt_index idx;
    CHECK(dt_ckpt_index_read(&idx, dir, &err) == 0);
    CHECK(idx.n_paths == 2 && !strcmp(idx.paths[0], "model.ckpt-3.safetensors") &&
          !strcmp(idx.paths[1], "model.ckpt-4.safetensors"));
    dt_ckpt_index_free(&idx);
    CHECK(!file_exists(dir, "model.ckpt-1.safetensors") && !file_exists(dir, "model.ckpt-2.safetensors"));
    free(p), free(s);
    dt_net_free(net);
}

/* A symbolic link in the log folder named like a checkpoint is never followed: not read (whatever it
 * points to), not adopted; retention removes the link itself (it is in the log folder), never its
 * target. */
static void test_symlink_not_followed(void) {
    dt_net *net = build(MODEL_A);
    dt_opt_config opt;
    dt_opt_config_init(&opt, "adam", 0.01f, NULL);
    size_t n = dt_net_param_count(net);
    float *p = dt_alloc_floats(n, "p", NULL), *s = dt_alloc_floats(2 * n, "s", NULL);
    fill(p, n, 23), fill(s, 2 * n, 24);
    dt_ckpt_run run = run_of(net, &opt);
    char dir[512], out[512], target[600], link[600], path[DT_PATH_MAX], log[8192];
    subdir(dir, sizeof dir, "link/L");
    subdir(out, sizeof out, "link/out");
    save_steps(dir, &run, p, s, 1, 2, 5);
    save_steps(out, &run, p, s, 3, 3, 5);
    snprintf(target, sizeof target, "%s/model.ckpt-3.safetensors", out);
    snprintf(link, sizeof link, "%s/model.ckpt-3.safetensors", dir);
    CHECK(symlink(target, link) == 0);

    /* Not listed: newer than the index's newest, but a link, so not used. */
    dt_error err = {0};
    CHECK(latest_with_log(dir, path, sizeof path, log, sizeof log, &err) == 1);
    CHECK_MSG(strstr(path, "model.ckpt-2.safetensors") != NULL, "opened %s", path);
    /* Listed as the newest: skipped with a warning naming it. */
    dt_ckpt_index idx = {0};
    char **dropped;
    int nd;
    for (int i = 1; i <= 3; i++) {
        char name[64];
        dt_ckpt_file_name(name, sizeof name, i);
        CHECK(dt_ckpt_index_add(&idx, name, 5, &dropped, &nd, &err) == 0);
        dt_ckpt_free_paths(dropped, nd);
    }
    CHECK(dt_ckpt_index_write(&idx, dir, &err) == 0);
    dt_ckpt_index_free(&idx);
    CHECK(latest_with_log(dir, path, sizeof path, log, sizeof log, &err) == 1);
    CHECK_MSG(strstr(path, "model.ckpt-2.safetensors") != NULL, "opened %s", path);
    CHECK_CONTAINS(log, "model.ckpt-3.safetensors");
    CHECK_CONTAINS(log, "symbolic link");

    /* Retention drops it: the link goes, the file it pointed to stays whole. */
    save_steps(dir, &run, p, s, 4, 5, 2);
    struct stat st;
    CHECK(lstat(link, &st) != 0);
    dt_st_file *f = NULL;
    CHECK_MSG(dt_st_open(&f, target, &err) == 0, "%s", err.msg);
    dt_st_close(f);
    free(p), free(s);
    dt_net_free(net);
}

/* Makes the index's own name a folder (the index file kept aside), so the next index write fails
 * at its rename as a full disk would make it fail: after the checkpoint file is complete. (The
 * temporary name is random now, so it cannot be blocked in advance: that is the point.) */
static void block_index_write(const char *dir, int on) {
    char t[DT_PATH_MAX], saved[DT_PATH_MAX + 8];
    snprintf(t, sizeof t, "%s/checkpoint", dir);
    snprintf(saved, sizeof saved, "%s.saved", t);
    if (on) CHECK(rename(t, saved) == 0 && mkdir(t, 0755) == 0);
    else CHECK(rmdir(t) == 0 && rename(saved, t) == 0);
}

/* Links planted in the log folder at the temporary names the writer used to use (<name>.tmp.<pid>)
 * and at the index's final name: saving writes through none of them, the files they point to
 * outside keep their bytes, and no temporary file is left. */
static void test_planted_links_not_written_through(void) {
    dt_net *net = build(MODEL_A);
    dt_opt_config opt;
    dt_opt_config_init(&opt, "adam", 0.01f, NULL);
    size_t n = dt_net_param_count(net);
    float *p = dt_alloc_floats(n, "p", NULL), *s = dt_alloc_floats(2 * n, "s", NULL);
    fill(p, n, 31), fill(s, 2 * n, 32);
    dt_ckpt_run run = run_of(net, &opt);
    char dir[512], out_dir[512], victim[3][600], link[3][700];
    subdir(dir, sizeof dir, "planted/L");
    subdir(out_dir, sizeof out_dir, "planted/outside");
    dt_error err = {0};
    CHECK(dt_mkdirs(dir, &err) == 0 && dt_mkdirs(out_dir, &err) == 0);
    const char *names[3] = {"checkpoint.tmp.%ld", "model.ckpt-7.safetensors.tmp.%ld", "checkpoint"};
    for (int i = 0; i < 3; i++) {
        char leaf[128];
        snprintf(leaf, sizeof leaf, names[i], (long)getpid());
        snprintf(victim[i], sizeof victim[i], "%s/victim%d.txt", out_dir, i);
        snprintf(link[i], sizeof link[i], "%s/%s", dir, leaf);
        write_text(victim[i], "precious\n");
        CHECK(symlink(victim[i], link[i]) == 0);
    }
    char log[8192] = "";
    FILE *lf = tmpfile();
    CHECK_MSG(dt_ckpt_save(dir, &run, p, s, 7, 5, lf, NULL, 0, &err) == 0, "%s", err.msg);
    drain(lf, log, sizeof log);
    for (int i = 0; i < 3; i++) {
        uint8_t *text = NULL;
        size_t len = 0;
        CHECK(dt_read_file(&text, &len, victim[i], 1 << 20, &err) == 0);
        CHECK_MSG(text && !strcmp((char *)text, "precious\n"), "%s was written through a link: %zu bytes", victim[i], len);
        free(text);
    }
    /* The links at the old temporary names are left alone; the index's name is a file now (the
     * rename replaced the link, it did not follow it), and it names the new checkpoint. */
    struct stat st;
    CHECK(lstat(link[0], &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(lstat(link[1], &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(lstat(link[2], &st) == 0 && S_ISREG(st.st_mode));
    /* The planted index link was refused when read, not followed (its target's text is not shown). */
    CHECK_CONTAINS(log, "symbolic link");
    CHECK(strstr(log, "precious") == NULL);
    dt_ckpt_index idx;
    CHECK(dt_ckpt_index_read(&idx, dir, &err) == 0 && idx.model_checkpoint_path &&
          !strcmp(idx.model_checkpoint_path, "model.ckpt-7.safetensors"));
    dt_ckpt_index_free(&idx);
    /* No temporary file is left: only the two planted links carry ".tmp.". */
    DIR *d = opendir(dir);
    int tmps = 0;
    for (struct dirent *e; d && (e = readdir(d));) tmps += strstr(e->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    CHECK_MSG(tmps == 2, "%d .tmp. names in the folder", tmps);
    free(p), free(s);
    dt_net_free(net);
}

/* A checkpoint whose index write failed (model.ckpt-300 complete, the index still naming 200 as its
 * newest) is found and used at the next start, and retention then deletes it in its turn. */
static void test_orphan_of_failed_index_write(void) {
    dt_net *net = build(MODEL_A);
    dt_opt_config opt;
    dt_opt_config_init(&opt, "adam", 0.01f, NULL);
    size_t n = dt_net_param_count(net);
    float *p = dt_alloc_floats(n, "p", NULL), *s = dt_alloc_floats(2 * n, "s", NULL);
    fill(p, n, 25), fill(s, 2 * n, 26);
    dt_ckpt_run run = run_of(net, &opt);
    char dir[512], path[DT_PATH_MAX], log[8192];
    dt_error err = {0};
    subdir(dir, sizeof dir, "orphan");
    save_steps(dir, &run, p, s, 100, 100, 5);
    save_steps(dir, &run, p, s, 200, 200, 5);
    block_index_write(dir, 1);
    CHECK(dt_ckpt_save(dir, &run, p, s, 300, 5, NULL, NULL, 0, &err) != 0);
    block_index_write(dir, 0);
    CHECK(file_exists(dir, "model.ckpt-300.safetensors"));
    dt_ckpt_index idx;
    CHECK(dt_ckpt_index_read(&idx, dir, &err) == 0 && idx.model_checkpoint_path &&
          !strcmp(idx.model_checkpoint_path, "model.ckpt-200.safetensors"));
    dt_ckpt_index_free(&idx);

    CHECK(latest_with_log(dir, path, sizeof path, log, sizeof log, &err) == 1);
    CHECK_MSG(strstr(path, "model.ckpt-300.safetensors") != NULL, "opened %s", path);
    CHECK_CONTAINS(log, "checkpoint: model.ckpt-300.safetensors is newer than the index's newest "
                        "(model.ckpt-200.safetensors); using it");

    /* Retention knows it: two more saves with max_to_keep 2 delete it. */
    save_steps(dir, &run, p, s, 400, 400, 2);
    CHECK(dt_ckpt_index_read(&idx, dir, &err) == 0);
    CHECK_MSG(idx.n_paths == 2 && !strcmp(idx.paths[0], "model.ckpt-300.safetensors"), "%d paths", idx.n_paths);
    dt_ckpt_index_free(&idx);
    save_steps(dir, &run, p, s, 500, 500, 2);
    CHECK(!file_exists(dir, "model.ckpt-300.safetensors"));
    CHECK(!file_exists(dir, "model.ckpt-100.safetensors") && !file_exists(dir, "model.ckpt-200.safetensors"));

    /* A damaged orphan is skipped like any damaged checkpoint. */
    subdir(dir, sizeof dir, "orphan_bad");
    save_steps(dir, &run, p, s, 100, 100, 5);
    save_steps(dir, &run, p, s, 200, 200, 5);
    block_index_write(dir, 1);
    CHECK(dt_ckpt_save(dir, &run, p, s, 300, 5, NULL, NULL, 0, &err) != 0);
    block_index_write(dir, 0);
    damage(dir, "model.ckpt-300.safetensors", 100, -1);
    CHECK(latest_with_log(dir, path, sizeof path, log, sizeof log, &err) == 1);
    CHECK_MSG(strstr(path, "model.ckpt-200.safetensors") != NULL, "opened %s", path);
    CHECK_CONTAINS(log, "model.ckpt-300.safetensors: checksum mismatch");
    free(p), free(s);
    dt_net_free(net);
}

/* Copies checkpoint `from` of dir to `to` with its global_step tensor replaced: mode 0 an I64 of
 * value step, 1 an F32, 2 none. The checksum is recomputed, so only the step is wrong. */
static void forge_step(const char *dir, const char *from, const char *to, int mode, int64_t step) {
    char src[DT_PATH_MAX], dst[DT_PATH_MAX];
    snprintf(src, sizeof src, "%s/%s", dir, from);
    snprintf(dst, sizeof dst, "%s/%s", dir, to);
    dt_st_file *f = NULL;
    dt_error err = {0};
    CHECK_MSG(dt_st_open(&f, src, &err) == 0, "%s", err.msg);
    if (!f) return;
    int nt = dt_st_num_tensors(f), k = 0, nm = 0;
    dt_st_tensor t[32];
    dt_st_meta meta[16];
    float fstep = (float)step;
    void *bytes[32] = {0};
    for (int i = 0; i < nt && k < 32; i++) {
        const dt_st_info *x = dt_st_tensor_at(f, i);
        bytes[i] = malloc(x->nbytes ? x->nbytes : 1);
        CHECK(bytes[i] && dt_st_read_part(f, x, 0, bytes[i], x->nbytes, &err) == 0);
        dt_st_tensor y = {.name = x->name, .dtype = x->dtype, .ndim = x->ndim, .data = bytes[i]};
        memcpy(y.shape, x->shape, sizeof y.shape);
        if (!strcmp(x->name, "global_step")) {
            if (mode == 2) continue;
            y.data = mode == 0 ? (const void *)&step : (const void *)&fstep;
            y.dtype = mode == 0 ? DT_ST_I64 : DT_ST_F32;
        }
        t[k++] = y;
    }
    for (int i = 0; i < dt_st_num_meta(f) && nm < 16; i++) {
        const char *key, *value;
        dt_st_meta_at(f, i, &key, &value);
        if (strcmp(key, DT_ST_CHECKSUM_KEY)) meta[nm++] = (dt_st_meta){key, value};
    }
    CHECK_MSG(dt_st_write(dst, t, k, meta, nm, &err) == 0, "%s", err.msg);
    for (int i = 0; i < 32; i++) free(bytes[i]);
    dt_st_close(f);
}

/* A checkpoint with a good checksum but an impossible global_step (negative, not its name's step,
 * not an I64 scalar, missing) is damaged: skipped with a warning, the one before it used, at start
 * too (the supervisor restores the previous one instead of stopping the run). */
static void test_impossible_step(void) {
    dt_net *net = build(MODEL_A);
    dt_opt_config opt;
    dt_opt_config_init(&opt, "adam", 0.01f, NULL);
    size_t n = dt_net_param_count(net);
    float *p = dt_alloc_floats(n, "p", NULL), *s = dt_alloc_floats(2 * n, "s", NULL);
    fill(p, n, 27), fill(s, 2 * n, 28);
    dt_ckpt_run run = run_of(net, &opt);
    const struct {
        int mode;
        int64_t step;
        const char *says;
    } bad[] = {{0, -5, "-5"}, {0, INT64_MIN, "-9223372036854775808"}, {0, 7, "7"}, {0, INT64_MAX, "9223372036854775807"},
               {1, 12, "F32"}, {2, 0, "no"}};
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        char dir[512], name[32], path[DT_PATH_MAX], log[8192];
        snprintf(name, sizeof name, "step%zu", b);
        subdir(dir, sizeof dir, name);
        save_steps(dir, &run, p, s, 11, 11, 5);
        save_steps(dir, &run, p, s, 12, 12, 5); /* in the index as the newest; replaced below */
        forge_step(dir, "model.ckpt-11.safetensors", "model.ckpt-12.safetensors", bad[b].mode, bad[b].step);
        dt_error err = {0};
        CHECK(latest_with_log(dir, path, sizeof path, log, sizeof log, &err) == 1);
        CHECK_MSG(strstr(path, "model.ckpt-11.safetensors") != NULL, "case %zu opened %s", b, path);
        CHECK_CONTAINS(log, "skipping checkpoint");
        CHECK_CONTAINS(log, "model.ckpt-12.safetensors");
        CHECK_CONTAINS(log, "global_step");
        CHECK_CONTAINS(log, bad[b].says);

        FILE *lf = tmpfile();
        dt_supervisor_config cfg = {.logdir = dir, .max_to_keep = 5, .run = run, .log = lf};
        dt_supervisor *sv = NULL;
        const float *rp, *rs;
        int64_t rstep = -1;
        CHECK_MSG(dt_supervisor_open(&sv, &cfg, &err) == 0, "case %zu: %s", b, err.msg);
        CHECK(sv && dt_supervisor_restored(sv, &rp, &rs, &rstep) == 1 && rstep == 11);
        dt_supervisor_close(sv);
        fclose(lf);
    }
    free(p), free(s);
    dt_net_free(net);
}

/* The supervisor over a hostile index and an orphan: restores the orphan, warns about an ignored
 * entry once in the whole run (the index is put right at restore, so saves do not warn again), and
 * retention leaves the file outside alone. */
static void test_supervisor_index_repair(void) {
    dt_net *net = build(MODEL_A);
    dt_opt_config opt;
    dt_opt_config_init(&opt, "adam", 0.01f, NULL);
    size_t n = dt_net_param_count(net);
    fake_state fs = {dt_alloc_floats(n, "p", NULL), dt_alloc_floats(2 * n, "s", NULL), n, 0, 0, 0};
    fill(fs.p, n, 29), fill(fs.s, 2 * n, 30);
    dt_ckpt_run run = run_of(net, &opt);
    char dir[512], victim[600], ip[600], log[16384];
    subdir(dir, sizeof dir, "sv2/ckpt");
    save_steps(dir, &run, fs.p, fs.s, 1, 2, 5);
    dt_error err = {0};
    block_index_write(dir, 1);
    CHECK(dt_ckpt_save(dir, &run, fs.p, fs.s, 3, 5, NULL, NULL, 0, &err) != 0);
    block_index_write(dir, 0);
    snprintf(victim, sizeof victim, "%s/sv2/victim.txt", tmpdir);
    write_text(victim, "precious\n");
    snprintf(ip, sizeof ip, "%s/checkpoint", dir);
    write_text(ip, "model_checkpoint_path: \"model.ckpt-2.safetensors\"\n"
                   "all_model_checkpoint_paths: \"../victim.txt\"\n"
                   "all_model_checkpoint_paths: \"model.ckpt-1.safetensors\"\n"
                   "all_model_checkpoint_paths: \"model.ckpt-2.safetensors\"\n");

    FILE *lf = tmpfile();
    dt_supervisor_config cfg = {.logdir = dir, .save_secs = 0, .max_to_keep = 2, .run = run,
                                .snapshot = fake_snapshot, .user = &fs, .log = lf};
    dt_supervisor *sv = NULL;
    const float *rp, *rs;
    int64_t rstep = -1;
    CHECK_MSG(dt_supervisor_open(&sv, &cfg, &err) == 0, "%s", err.msg);
    if (!sv) return;
    CHECK(dt_supervisor_restored(sv, &rp, &rs, &rstep) == 1 && rstep == 3);
    /* The index names the orphan at once (nothing deleted at restore). */
    dt_ckpt_index idx;
    CHECK(dt_ckpt_index_read(&idx, dir, &err) == 0 && idx.model_checkpoint_path &&
          !strcmp(idx.model_checkpoint_path, "model.ckpt-3.safetensors") && idx.n_paths == 3);
    dt_ckpt_index_free(&idx);
    fs.step = 3;
    CHECK(dt_supervisor_started(sv, 3, &err) == 0);
    fs.step = 4;
    CHECK(dt_supervisor_final(sv, NULL, NULL, &err) == 0);
    dt_supervisor_close(sv);
    drain(lf, log, sizeof log);
    CHECK_MSG(count_of(log, "victim.txt") == 1, "one warning about the entry in the run:\n%s", log);
    CHECK_CONTAINS(log, "checkpoint:2: ignoring checkpoint path \"../victim.txt\"");
    CHECK_CONTAINS(log, "model.ckpt-3.safetensors is newer than the index's newest (model.ckpt-2.safetensors)");
    struct stat st;
    CHECK_MSG(stat(victim, &st) == 0, "%s was deleted", victim);
    CHECK(file_exists(dir, "model.ckpt-3.safetensors") && file_exists(dir, "model.ckpt-4.safetensors"));
    CHECK(!file_exists(dir, "model.ckpt-1.safetensors") && !file_exists(dir, "model.ckpt-2.safetensors"));
    free(fs.p), free(fs.s);
    dt_net_free(net);
}

/* A NaN or infinity in a parameter or in optimizer state is damage: the checkpoint is skipped,
 * naming the tensor and the index, and the supervisor restores the one before it. */
static void test_nonfinite_is_damage(void) {
    dt_net *net = build(MODEL_A);
    dt_opt_config opt;
    dt_opt_config_init(&opt, "adam", 0.01f, NULL);
    size_t n = dt_net_param_count(net);
    float *p = dt_alloc_floats(n, "p", NULL), *s = dt_alloc_floats(2 * n, "s", NULL);
    fill(p, n, 13), fill(s, 2 * n, 14);
    for (size_t i = 0; i < 2 * n; i++) s[i] = fabsf(s[i]);
    dt_ckpt_run run = run_of(net, &opt);
    const dt_param_view *v = dt_net_view(net, dt_net_num_views(net) - 1);
    char dir[512], path[DT_PATH_MAX], log[4096], want[128];
    dt_error err = {0};

    /* A parameter. */
    subdir(dir, sizeof dir, "nan_param");
    save_steps(dir, &run, p, s, 10, 10, 5);
    float keep = p[v->offset + 2];
    p[v->offset + 2] = NAN;
    save_steps(dir, &run, p, s, 20, 20, 5);
    p[v->offset + 2] = keep;
    CHECK(latest_with_log(dir, path, sizeof path, log, sizeof log, &err) == 1);
    CHECK_CONTAINS(path, "model.ckpt-10.safetensors");
    CHECK_CONTAINS(log, "model.ckpt-20.safetensors");
    snprintf(want, sizeof want, "tensor %s holds nan at index 2", v->name);
    CHECK_CONTAINS(log, want);
    CHECK_CONTAINS(log, "trying the one before it");

    /* The supervisor restores the good one, and says why it skipped the newest. */
    fake_state fs = {p, s, n, 0, 0, 0};
    FILE *slog = tmpfile();
    dt_supervisor_config cfg = {.logdir = dir, .max_to_keep = 5, .run = run, .snapshot = fake_snapshot, .user = &fs,
                                .log = slog};
    dt_supervisor *sv = NULL;
    const float *rp, *rs;
    int64_t rstep = -1;
    CHECK_MSG(dt_supervisor_open(&sv, &cfg, &err) == 0, "%s", err.msg);
    CHECK(sv && dt_supervisor_restored(sv, &rp, &rs, &rstep) == 1 && rstep == 10);
    CHECK(sv && memcmp(rp, p, n * sizeof *p) == 0);
    dt_supervisor_close(sv);
    rewind(slog);
    size_t got = fread(log, 1, sizeof log - 1, slog);
    log[got] = 0;
    fclose(slog);
    CHECK_CONTAINS(log, want);
    CHECK_CONTAINS(log, "restored");

    /* Optimizer state: an infinity in the second Adam slot. */
    subdir(dir, sizeof dir, "inf_state");
    save_steps(dir, &run, p, s, 30, 30, 5);
    s[n + v->offset + 1] = -INFINITY;
    save_steps(dir, &run, p, s, 40, 40, 5);
    CHECK(latest_with_log(dir, path, sizeof path, log, sizeof log, &err) == 1);
    CHECK_CONTAINS(path, "model.ckpt-30.safetensors");
    snprintf(want, sizeof want, "tensor %s/adam_v holds -inf at index 1", v->name);
    CHECK_CONTAINS(log, want);

    /* The only checkpoint holds one: none is usable, as with other damage (not a silent fresh start). */
    subdir(dir, sizeof dir, "all_nan");
    save_steps(dir, &run, p, s, 50, 50, 5);
    CHECK(latest_with_log(dir, path, sizeof path, log, sizeof log, &err) == DT_EFORMAT);
    CHECK_CONTAINS(err.msg, "none of its 1 checkpoint(s)");
    free(p), free(s);
    dt_net_free(net);
}

/* The "classes" metadata: written from the run's names, read back; absent is no names; a value a
 * hand-edited or hostile file could hold is refused naming the file. */
static void test_class_names(void) {
    char path[512];
    subdir(path, sizeof path, "classes.safetensors");
    int64_t step = 3;
    dt_st_tensor t = {.name = DT_CKPT_STEP_TENSOR, .dtype = DT_ST_I64, .ndim = 0, .data = &step};
    static const char *const cases[][2] = {
        /* value, NULL when accepted */
        {"[\"cat\",\"dog\"]", NULL},
        {"[\"a, \\\"b\\\"\"]", NULL},
        {"{\"cat\":0}", "not a list"},
        {"[]", "not a list"},
        {"[\"a\",\"b\",\"c\"]", "not a list"}, /* more names than the model's 2 classes */
        {"[\"a\",\"a\"]", "entry 1"},
        {"[\"\",\"b\"]", "entry 0"},
        {"[\"a\\nb\"]", "entry 0"},
        {"[\"a\",7]", "entry 1"},
        {"[\"a\\u0000b\"]", "not a list"}, /* jansson refuses a NUL inside a string */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dt_st_meta m = {"classes", cases[i][0]};
        dt_error err = {0};
        CHECK(dt_st_write(path, &t, 1, &m, 1, &err) == 0);
        dt_st_file *f = NULL;
        CHECK(dt_st_open(&f, path, &err) == 0);
        char **names = NULL;
        int n = -1;
        int rc = f ? dt_ckpt_read_classes(f, path, 2, &names, &n, &err) : -1;
        if (!cases[i][1]) {
            CHECK_MSG(rc == 0 && n >= 1, "case %zu refused: %s", i, err.msg);
        } else {
            CHECK_MSG(rc == DT_EFORMAT && strstr(err.msg, cases[i][1]) && strstr(err.msg, "classes.safetensors") &&
                      n == 0 && !names, "case %zu: rc %d, '%s'", i, rc, err.msg);
        }
        if (i == 0) CHECK(n == 2 && !strcmp(names[0], "cat") && !strcmp(names[1], "dog"));
        if (i == 1) CHECK(n == 1 && !strcmp(names[0], "a, \"b\""));
        for (int k = 0; k < n; k++) free(names[k]);
        free(names);
        dt_st_close(f);
    }
    /* No "classes": no names, no error (checkpoints written before they were recorded). */
    dt_error err = {0};
    CHECK(dt_st_write(path, &t, 1, NULL, 0, &err) == 0);
    dt_st_file *f = NULL;
    CHECK(dt_st_open(&f, path, &err) == 0);
    char **names = (char **)1;
    int n = -1;
    CHECK(f && dt_ckpt_read_classes(f, path, 2, &names, &n, &err) == 0 && n == 0 && names == NULL);
    dt_st_close(f);
}

/* Dynamic sharding's coordinator state rides along as a U8 vector: saved, fitted, read back byte
 * for byte; a checkpoint without it reads as none; one of another dtype is refused naming it. */
static void test_coordinator_tensor(void) {
    dt_net *net = build(MODEL_A);
    size_t n = dt_net_param_count(net);
    float *p = dt_alloc_floats(n, "p", NULL);
    fill(p, n, 4);
    char dir[512], path[DT_PATH_MAX];
    subdir(dir, sizeof dir, "coord");
    dt_ckpt_run run = run_of(net, NULL);
    uint8_t state[85];
    for (size_t i = 0; i < sizeof state; i++) state[i] = (uint8_t)(i * 7);
    run.coord = state, run.coord_len = sizeof state;
    dt_error err = {0};
    CHECK_MSG(dt_ckpt_save(dir, &run, p, NULL, 9, 5, NULL, NULL, 0, &err) == 0, "%s", err.msg);
    dt_st_file *f = NULL;
    CHECK(dt_ckpt_open_latest_for(&f, path, sizeof path, dir, dt_ckpt_fits_check, &run, NULL, &err) == 1);
    uint8_t *got = NULL;
    size_t len = 0;
    CHECK(f && dt_ckpt_load(f, path, &run, p, NULL, NULL, &err) == 0);
    CHECK(f && dt_ckpt_read_coord(f, path, &got, &len, &err) == 0 && len == sizeof state && got &&
          memcmp(got, state, len) == 0);
    free(got);
    dt_st_close(f);
    /* Another dtype under that name (a damaged or forged file). */
    float bogus[3] = {1, 2, 3};
    int64_t step = 9;
    dt_st_tensor t[2] = {{.name = DT_CKPT_COORD_TENSOR, .dtype = DT_ST_F32, .ndim = 1, .shape = {3}, .data = bogus},
                         {.name = DT_CKPT_STEP_TENSOR, .dtype = DT_ST_I64, .ndim = 0, .data = &step}};
    snprintf(path, sizeof path, "%s/forged.safetensors", dir);
    CHECK(dt_st_write(path, t, 2, NULL, 0, &err) == 0);
    CHECK(dt_st_open(&f, path, &err) == 0);
    CHECK(f && dt_ckpt_read_coord(f, path, &got, &len, &err) == DT_EFORMAT);
    CHECK_CONTAINS(err.msg, "elastic/coordinator must be a U8 vector");
    dt_st_close(f);
    free(p);
    dt_net_free(net);
}

/* A compact net's tables (a cluster's, whose rows live on the ps tasks): saved in the table's own
 * shape with the tables' optimizer's slots, every row from the run's table_rows through the sink
 * (ranges, then rows over them), so one process reads the file as its own; restored by the caller
 * (dt_ckpt_read_rows), the dense variables by dt_ckpt_load. */
static const char *MODEL_CTR = "model t\ninput dense=1 fields=2\nembedding name=e dim=3 buckets=10 combiner=sum "
                               "weight_init=truncated_normal(0.1)\nfm name=p input=e\ndense name=d input=input "
                               "units=1\nadd input=p,d\n";

/* Table t's row id, values then Adagrad's accumulator: a value of its own per float. */
static void table_row(int t, uint64_t id, float *row) {
    for (int j = 0; j < 6; j++) row[j] = (float)(100 * t + 10 * (int)id + j) * (j < 3 ? 0.01f : 1.0f) + (j < 3 ? 0 : 1);
}

static int put_tables(void *user, dt_ckpt_sink *sink, int64_t step, dt_error *err) {
    (void)user;
    CHECK(step == 5);
    float rows[10 * 6], one[6];
    for (int t = 0; t < 2; t++) {
        for (int i = 0; i < 10; i++) table_row(t, (uint64_t)i, rows + 6 * i);
        int rc = dt_ckpt_put_range(sink, t, 0, 4, rows, err); /* in two ranges, the second over a row */
        if (!rc) rc = dt_ckpt_put_range(sink, t, 4, 6, rows + 24, err);
        table_row(t, 7, one);
        if (!rc) rc = dt_ckpt_put_row(sink, t, 7, one, err);
        if (rc) return rc;
    }
    CHECK(dt_ckpt_put_row(sink, 0, 10, one, err) == DT_EINVAL);
    CHECK_CONTAINS(err->msg, "row 10 of table 0, beyond its 10 rows");
    CHECK(dt_ckpt_put_range(sink, 2, 0, 1, one, err) == DT_EINVAL);
    return DT_OK;
}

static void test_compact_tables(void) {
    dt_model_spec spec;
    dt_net *compact = NULL, *full = NULL;
    dt_error err = {0};
    CHECK(dt_model_spec_parse(&spec, MODEL_CTR, strlen(MODEL_CTR), "t.model", &err) == 0);
    CHECK(dt_net_build_compact(&compact, &spec, 4, &err) == 0 && dt_net_build(&full, &spec, 4, &err) == 0);
    dt_model_spec_free(&spec);
    if (!compact || !full) return;
    dt_opt_config sgd = {.kind = DT_OPT_SGD, .learning_rate = 0.1f};
    dt_lazy_config adagrad;
    dt_lazy_config_init(&adagrad, "adagrad", 0.1f, NULL);
    dt_ckpt_run run = run_of(compact, &sgd);
    run.tables = &adagrad;
    size_t n = dt_net_param_count(compact), nf = dt_net_param_count(full);
    float *p = dt_alloc_floats(n, "p", NULL), *state = dt_alloc_floats(n, "s", NULL);
    fill(p, n, 8), fill(state, n, 9);
    char dir[512], path[DT_PATH_MAX];
    subdir(dir, sizeof dir, "compact");
    CHECK(dt_ckpt_save(dir, &run, p, state, 5, 5, NULL, NULL, 0, &err) == DT_EINVAL); /* no way to read the rows */
    run.table_rows = put_tables;
    CHECK_MSG(dt_ckpt_save(dir, &run, p, state, 5, 5, NULL, NULL, 0, &err) == 0, "%s", err.msg);
    /* one process: its tables [10, 3] and their accumulators, as saved */
    dt_ckpt_run one = run_of(full, &sgd);
    one.tables = &adagrad;
    float *fp = dt_alloc_floats(nf, "fp", NULL), *fs = dt_alloc_floats(nf, "fs", NULL), row[6], got[4 * 6];
    dt_st_file *f = NULL;
    CHECK(dt_ckpt_open_latest_for(&f, path, sizeof path, dir, dt_ckpt_fits_check, &one, NULL, &err) == 1);
    CHECK_MSG(f && dt_ckpt_load(f, path, &one, fp, fs, NULL, &err) == 0, "%s", err.msg);
    const dt_param_view *e1 = dt_net_view(full, 1);
    CHECK(!strcmp(e1->name, "e/embeddings_1") && e1->count == 30);
    int same = 1;
    for (int i = 0; i < 10; i++) {
        table_row(1, (uint64_t)i, row);
        same &= !memcmp(fp + e1->offset + 3 * i, row, 12) && !memcmp(fs + e1->offset + 3 * i, row + 3, 12);
    }
    CHECK(same);
    CHECK(!memcmp(fp + dt_net_view(full, 2)->offset, p + dt_net_view(compact, 2)->offset, 4)); /* d/kernel */
    dt_st_close(f);
    /* the cluster's chief: the dense variables into the flat buffer, the rows read range by range */
    float *q = dt_alloc_floats(n, "q", NULL);
    memcpy(q, p, n * sizeof *q);
    q[dt_net_view(compact, 2)->offset] = 42;
    CHECK(dt_ckpt_open_latest_for(&f, path, sizeof path, dir, dt_ckpt_fits_check, &run, NULL, &err) == 1);
    CHECK_MSG(f && dt_ckpt_load(f, path, &run, q, state, NULL, &err) == 0, "%s", err.msg);
    CHECK(!memcmp(q, p, n * sizeof *q));
    CHECK_MSG(f && dt_ckpt_read_rows(f, path, &run, 0, 6, 4, got, &err) == 0, "%s", err.msg);
    for (int i = 0; i < 4; i++) {
        table_row(0, (uint64_t)(6 + i), row);
        CHECK(!memcmp(got + 6 * i, row, sizeof row));
    }
    CHECK(f && dt_ckpt_read_rows(f, path, &run, 0, 8, 3, got, &err) == DT_EFORMAT);
    CHECK_CONTAINS(err.msg, "has no rows 8..11 of dim 3");
    dt_st_close(f);
    free(p), free(state), free(fp), free(fs), free(q);
    dt_net_free(compact), dt_net_free(full);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dtrain_test_checkpoint.XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_round_trip);
    RUN(test_coordinator_tensor);
    RUN(test_compact_tables);
    RUN(test_retention);
    RUN(test_damaged_newest);
    RUN(test_refusals);
    RUN(test_killed_writer);
    RUN(test_supervisor);
    RUN(test_index_outside_logdir);
    RUN(test_symlink_not_followed);
    RUN(test_orphan_of_failed_index_write);
    RUN(test_planted_links_not_written_through);
    RUN(test_impossible_step);
    RUN(test_supervisor_index_repair);
    RUN(test_class_names);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    RUN(test_nonfinite_is_damage);
    return test_summary();
}
