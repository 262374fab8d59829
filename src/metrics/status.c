#include "metrics/status.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"
#include "metrics/names.h"

#define POINT_SECS 0.5    /* a curve point (and the rates) at most this often */
#define PEER_LOST_SECS 5.0 /* a peer that has not answered for this long is lost */

typedef struct {
    double step, loss, acc;
    double auc;                   /* validation of a binary (click-log) model; NAN otherwise */
} point;

typedef struct {
    point *p;
    int n;
} curve;

typedef struct {
    char address[DT_HOST_MAX + 8];
    dt_status_self self;
    double last_ok;               /* dt_seconds() of its latest answer; 0: never */
} task_view;

struct dt_status {
    pthread_mutex_t lock;
    dt_metrics *m;
    int chief;
    task_view *ps, *workers;
    int n_ps, n_workers;
    /* The training (the loop's figures; everything below under lock). */
    int training, finished;
    int64_t total, start_step, global_step;
    double t_start, examples_per_step;
    curve train, val;
    double w_loss, w_t;           /* the window since the latest point */
    int64_t w_correct, w_n, w_steps0;
    double steps_per_sec, examples_per_sec, loss, acc;
    dt_metric *g_loss, *g_acc, *g_vloss, *g_vacc, *g_vauc, *g_eps, *g_sps, *g_total, *g_mem;
};

static void clear_self(dt_status_self *x) {
    memset(x, 0, sizeof *x);
    x->global_step = x->total_steps = x->steps_per_sec = x->examples_per_sec = x->loss = x->accuracy = x->stale = NAN;
    x->live_workers = x->memory_bytes = x->pushes = x->pulls = NAN;
    x->work_epoch = x->work_live = x->units_done = x->units_held = x->units_pool = NAN;
    x->work_joins = x->work_leaves = x->work_losses = NAN;
}

/* The work coordinator's figures, where its series are (ps 0 with a plan); NaN elsewhere. */
static void work_self(dt_status *s, dt_status_self *x) {
    x->work_epoch = dt_metrics_lookup(s->m, "dtrain_work_epoch", NULL);
    x->work_live = dt_metrics_lookup(s->m, "dtrain_work_live_workers", NULL);
    x->units_done = dt_metrics_lookup(s->m, "dtrain_work_units", "state=\"done\"");
    x->units_held = dt_metrics_lookup(s->m, "dtrain_work_units", "state=\"held\"");
    x->units_pool = dt_metrics_lookup(s->m, "dtrain_work_units", "state=\"pool\"");
    x->work_joins = dt_metrics_lookup(s->m, "dtrain_work_joins_total", NULL);
    x->work_leaves = dt_metrics_lookup(s->m, "dtrain_work_leaves_total", NULL);
    x->work_losses = dt_metrics_lookup(s->m, "dtrain_work_losses_total", NULL);
}

static void set_address(task_view *t, const dt_addr *a) { snprintf(t->address, sizeof t->address, "%s:%d", a->host, a->port); }

int dt_status_create(dt_status **out, dt_metrics *m, const dt_cluster *c, dt_error *err) {
    *out = NULL;
    dt_status *s = dt_calloc(1, sizeof *s, "status page", err);
    if (!s) return DT_ENOMEM;
    if (pthread_mutex_init(&s->lock, NULL) != 0) {
        free(s);
        return dt_errorf(err, DT_ENOMEM, "status page: cannot create its mutex");
    }
    s->m = m;
    s->chief = !c || (c->is_chief && c->job != DT_JOB_PS);
    int n_ps = c && c->distributed ? c->n_ps : 0, n_workers = c && c->distributed ? c->n_workers : 0;
    if ((n_ps && !(s->ps = dt_calloc((size_t)n_ps, sizeof *s->ps, "status page: ps tasks", err))) ||
        (n_workers && !(s->workers = dt_calloc((size_t)n_workers, sizeof *s->workers, "status page: workers", err))) ||
        !(s->train.p = dt_calloc(DT_STATUS_MAX_POINTS, sizeof(point), "status page: curve", err)) ||
        !(s->val.p = dt_calloc(DT_STATUS_MAX_POINTS, sizeof(point), "status page: curve", err))) {
        dt_status_free(s);
        return DT_ENOMEM;
    }
    s->n_ps = n_ps, s->n_workers = n_workers;
    for (int i = 0; i < n_ps; i++) set_address(&s->ps[i], &c->ps[i]), clear_self(&s->ps[i].self);
    for (int i = 0; i < n_workers; i++) set_address(&s->workers[i], &c->workers[i]), clear_self(&s->workers[i].self);
    s->loss = s->acc = s->steps_per_sec = s->examples_per_sec = NAN;
    s->g_mem = dt_metrics_gauge(m, DT_M_MEMORY, "Resident memory of this process, bytes.", NULL);
    *out = s;
    if (c && c->job == DT_JOB_PS) return DT_OK; /* a ps does not train: no training figures */
    s->g_loss = dt_metrics_gauge(m, DT_M_TRAIN_LOSS, "Mean training loss of this worker's latest steps (about half a second).", NULL);
    s->g_acc = dt_metrics_gauge(m, DT_M_TRAIN_ACC, "Training accuracy of this worker's latest steps.", NULL);
    s->g_eps = dt_metrics_gauge(m, DT_M_EXAMPLES_PER_SEC, "Examples per second this worker trained on lately.", NULL);
    s->g_sps = dt_metrics_gauge(m, DT_M_STEPS_PER_SEC, "Global steps per second lately, as this worker sees them.", NULL);
    s->g_total = dt_metrics_gauge(m, DT_M_TOTAL_STEPS, "Global steps the training runs to.", NULL);
    if (s->chief) {
        s->g_vloss = dt_metrics_gauge(m, DT_M_VAL_LOSS, "Validation loss at the latest validation (chief).", NULL);
        s->g_vacc = dt_metrics_gauge(m, DT_M_VAL_ACC, "Validation accuracy at the latest validation (chief).", NULL);
    }
    return DT_OK;
}

void dt_status_free(dt_status *s) {
    if (!s) return;
    free(s->ps);
    free(s->workers);
    free(s->train.p);
    free(s->val.p);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

void dt_status_start(dt_status *s, int64_t total_steps, int64_t start_step, double examples_per_step) {
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    s->training = 1;
    s->examples_per_step = examples_per_step;
    s->total = total_steps;
    s->start_step = s->global_step = s->w_steps0 = start_step;
    s->t_start = s->w_t = dt_seconds();
    pthread_mutex_unlock(&s->lock);
    dt_metric_set(s->g_total, (double)total_steps);
}

/* Full: keep every other point, so the curve still spans the run at half the resolution. */
static void add_point(curve *c, point p) {
    if (c->n == DT_STATUS_MAX_POINTS) {
        for (int i = 0; i < c->n / 2; i++) c->p[i] = c->p[2 * i + 1];
        c->n /= 2;
    }
    c->p[c->n++] = p;
}

void dt_status_step(dt_status *s, int64_t global_step, double loss, int correct, int n) {
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    s->global_step = global_step;
    s->w_loss += loss * n;
    s->w_correct += correct;
    s->w_n += n;
    double t = dt_seconds(), dt = t - s->w_t;
    int emit = dt >= POINT_SECS || global_step >= s->total;
    if (emit && s->w_n > 0 && dt > 0) {
        s->loss = s->w_loss / (double)s->w_n;
        s->acc = (double)s->w_correct / (double)s->w_n;
        s->examples_per_sec = (double)s->w_n / dt;
        s->steps_per_sec = (double)(global_step - s->w_steps0) / dt;
        add_point(&s->train, (point){(double)global_step, s->loss, s->acc, NAN});
        s->w_loss = 0, s->w_correct = s->w_n = 0, s->w_t = t, s->w_steps0 = global_step;
    }
    pthread_mutex_unlock(&s->lock);
    if (emit) {
        dt_metric_set(s->g_loss, s->loss);
        dt_metric_set(s->g_acc, s->acc);
        dt_metric_set(s->g_eps, s->examples_per_sec);
        dt_metric_set(s->g_sps, s->steps_per_sec);
    }
}

void dt_status_validation(dt_status *s, int64_t global_step, double loss, double accuracy, double auc) {
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    add_point(&s->val, (point){(double)global_step, loss, accuracy, auc});
    pthread_mutex_unlock(&s->lock);
    dt_metric_set(s->g_vloss, loss);
    dt_metric_set(s->g_vacc, accuracy);
    /* Made at the first AUC, so an image model's chief has no series that is always NaN. */
    if (s->chief && isfinite(auc) && !s->g_vauc)
        s->g_vauc = dt_metrics_gauge(s->m, DT_M_VAL_AUC, "Validation AUC at the latest validation (chief; binary "
                                     "models).", NULL);
    if (isfinite(auc)) dt_metric_set(s->g_vauc, auc);
}

void dt_status_set_total(dt_status *s, int64_t total_steps) {
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    s->total = total_steps;
    pthread_mutex_unlock(&s->lock);
    dt_metric_set(s->g_total, (double)total_steps);
}

void dt_status_finished(dt_status *s) {
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    s->finished = 1;
    pthread_mutex_unlock(&s->lock);
}

void dt_status_peer(dt_status *s, const dt_status_self *self) {
    if (!s || !self) return;
    int ps = !strcmp(self->job, "ps");
    if (!ps && strcmp(self->job, "worker")) return;
    int n = ps ? s->n_ps : s->n_workers;
    if (self->task < 0 || self->task >= n) return; /* not a task of this cluster */
    task_view *t = ps ? &s->ps[self->task] : &s->workers[self->task];
    pthread_mutex_lock(&s->lock);
    t->self = *self;
    t->last_ok = dt_seconds();
    pthread_mutex_unlock(&s->lock);
}

/* Resident memory from /proc/self/statm (pages); NaN if unreadable. */
static double resident_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return NAN;
    unsigned long long size, rss;
    int ok = fscanf(f, "%llu %llu", &size, &rss) == 2;
    fclose(f);
    return ok ? (double)rss * (double)sysconf(_SC_PAGESIZE) : NAN;
}

void dt_status_refresh(dt_status *s) {
    if (s) dt_metric_set(s->g_mem, resident_bytes());
}

void dt_status_get_self(dt_status *s, dt_status_self *x) {
    clear_self(x);
    dt_status_refresh(s);
    snprintf(x->job, sizeof x->job, "%s", dt_metrics_job(s->m));
    x->task = dt_metrics_task(s->m);
    x->global_step = dt_metrics_lookup(s->m, DT_M_GLOBAL_STEP, NULL);
    x->stale = dt_metrics_lookup(s->m, DT_M_STALE, NULL);
    x->memory_bytes = dt_metrics_lookup(s->m, DT_M_MEMORY, NULL);
    x->live_workers = dt_metrics_lookup(s->m, DT_M_PS_LIVE_WORKERS, NULL);
    x->pushes = dt_metrics_lookup(s->m, DT_M_PS_PUSHES, NULL);
    x->pulls = dt_metrics_lookup(s->m, DT_M_PS_PULLS, NULL);
    work_self(s, x);
    pthread_mutex_lock(&s->lock);
    int ps = !strcmp(x->job, "ps");
    snprintf(x->state, sizeof x->state, "%s", ps ? "serving" : s->finished ? "finished" : s->training ? "training"
                                                                                                    : "starting");
    if (s->training) x->total_steps = (double)s->total;
    x->steps_per_sec = s->steps_per_sec;
    x->examples_per_sec = s->examples_per_sec;
    x->loss = s->loss;
    x->accuracy = s->acc;
    pthread_mutex_unlock(&s->lock);
}

/* JSON has no NaN: a figure not known is null. */
static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *self_json(const dt_status_self *x) {
    json_t *o = json_pack("{s:s, s:i, s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "job", x->job, "task",
                     x->task, "state", x->state, "global_step", num(x->global_step), "total_steps",
                     num(x->total_steps), "steps_per_sec", num(x->steps_per_sec), "examples_per_sec",
                     num(x->examples_per_sec), "loss", num(x->loss), "accuracy", num(x->accuracy), "stale",
                     num(x->stale), "live_workers", num(x->live_workers), "memory_bytes", num(x->memory_bytes),
                     "pushes", num(x->pushes), "pulls", num(x->pulls));
    if (o && json_object_update_new(o, json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "work_epoch",
                                                 num(x->work_epoch), "work_live", num(x->work_live), "units_done",
                                                 num(x->units_done), "units_held", num(x->units_held), "units_pool",
                                                 num(x->units_pool), "work_joins", num(x->work_joins), "work_leaves",
                                                 num(x->work_leaves), "work_losses", num(x->work_losses)))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* [step, loss, accuracy] points; validation points of a binary model add their AUC (auc). */
static json_t *curve_json(const curve *c, int auc) {
    json_t *a = json_array();
    for (int i = 0; a && i < c->n; i++)
        if (json_array_append_new(a, auc ? json_pack("[f, o, o, o]", c->p[i].step, num(c->p[i].loss),
                                                     num(c->p[i].acc), num(c->p[i].auc))
                                         : json_pack("[f, o, o]", c->p[i].step, num(c->p[i].loss), num(c->p[i].acc)))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* A task of the cluster: what it said last, and whether it still answers. */
static json_t *task_json(const task_view *t, int index, int is_self, const dt_status_self *self, double now) {
    const char *state = "unknown";
    const dt_status_self *x = NULL;
    if (is_self) {
        x = self;
        state = self->state;
    } else if (t->last_ok > 0) {
        x = &t->self;
        int finished = !strcmp(t->self.state, "finished");
        state = now - t->last_ok <= PEER_LOST_SECS ? t->self.state : finished ? "finished" : "lost";
    }
    json_t *o = json_pack("{s:i, s:s, s:s}", "task", index, "address", t->address, "state", state);
    if (o && x && json_object_set_new(o, "figures", self_json(x))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *tasks_json(const task_view *ts, int n, int self_index, const dt_status_self *self, double now) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, task_json(&ts[i], i, i == self_index, self, now))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

int dt_status_json(dt_status *s, char **out, size_t *len, dt_error *err) {
    *out = NULL;
    *len = 0;
    dt_status_self self;
    dt_status_get_self(s, &self);
    json_t *root = json_pack("{s:o, s:b}", "self", self_json(&self), "chief", s->chief);
    int ps = !strcmp(self.job, "ps");
    pthread_mutex_lock(&s->lock);
    if (root && s->chief && !ps) {
        double now = dt_seconds(), elapsed = now - s->t_start, done = (double)(s->global_step - s->start_step);
        double rate = s->training && elapsed > 0 ? done / elapsed : NAN;
        double eta = rate > 0 ? (double)(s->total - s->global_step) / rate : NAN;
        json_t *training = json_pack(
            "{s:I, s:I, s:o, s:o, s:o, s:o, s:o, s:o}", "global_step", (json_int_t)s->global_step, "total_steps",
            (json_int_t)s->total, "progress", num(s->total > 0 ? (double)s->global_step / (double)s->total : NAN),
            "eta_seconds", num(s->finished ? 0 : eta), "elapsed_seconds", num(s->training ? elapsed : NAN),
            "examples_per_sec", num(s->steps_per_sec * s->examples_per_step), "train", curve_json(&s->train, 0),
            "validation", curve_json(&s->val, s->val.n > 0 && isfinite(s->val.p[s->val.n - 1].auc)));
        json_t *cluster = json_pack("{s:o, s:o}", "ps", tasks_json(s->ps, s->n_ps, -1, &self, now), "workers",
                                    tasks_json(s->workers, s->n_workers, self.task, &self, now));
        if (json_object_set_new(root, "training", training) || json_object_set_new(root, "cluster", cluster)) {
            json_decref(root);
            root = NULL;
        }
    }
    pthread_mutex_unlock(&s->lock);
    char *text = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (!text) return dt_errorf(err, DT_ENOMEM, "status page: out of memory for the JSON");
    *out = text;
    *len = strlen(text);
    return DT_OK;
}

/* A figure of a peer's self object: a number, null (unknown) or absent; anything else is refused. */
static int get_num(json_t *o, const char *key, double *v, dt_error *err) {
    json_t *x = json_object_get(o, key);
    *v = NAN;
    if (!x || json_is_null(x)) return DT_OK;
    if (!json_is_number(x)) return dt_errorf(err, DT_EFORMAT, "status \"self\".%s: not a number", key);
    *v = json_number_value(x);
    return DT_OK;
}

static int get_text(json_t *o, const char *key, char *out, size_t cap, dt_error *err) {
    const char *t = json_string_value(json_object_get(o, key));
    if (!t || strlen(t) >= cap) return dt_errorf(err, DT_EFORMAT, "status \"self\".%s: not a string of under %zu bytes", key, cap);
    memcpy(out, t, strlen(t) + 1);
    return DT_OK;
}

int dt_status_parse_self(const char *text, size_t len, dt_status_self *out, dt_error *err) {
    clear_self(out);
    if (len > DT_STATUS_MAX_SELF_BYTES)
        return dt_errorf(err, DT_EFORMAT, "status: %zu bytes, more than the %d a status may have", len,
                         DT_STATUS_MAX_SELF_BYTES);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return dt_errorf(err, DT_EFORMAT, "status: line %d: %s", je.line, je.text);
    int rc = DT_OK;
    json_t *self = json_object_get(root, "self"), *task = json_object_get(self, "task");
    if (!json_is_object(self)) rc = dt_errorf(err, DT_EFORMAT, "status: no \"self\" object");
    else if (!json_is_integer(task) || json_integer_value(task) < 0 || json_integer_value(task) >= DT_CLUSTER_MAX_TASKS)
        rc = dt_errorf(err, DT_EFORMAT, "status \"self\".task: not an integer in 0..%d", DT_CLUSTER_MAX_TASKS - 1);
    else {
        out->task = (int)json_integer_value(task);
        struct {
            const char *key;
            double *v;
        } nums[] = {{"global_step", &out->global_step},   {"total_steps", &out->total_steps},
                    {"steps_per_sec", &out->steps_per_sec}, {"examples_per_sec", &out->examples_per_sec},
                    {"loss", &out->loss},                 {"accuracy", &out->accuracy},
                    {"stale", &out->stale},               {"live_workers", &out->live_workers},
                    {"memory_bytes", &out->memory_bytes}, {"pushes", &out->pushes},
                    {"pulls", &out->pulls},               {"work_epoch", &out->work_epoch},
                    {"work_live", &out->work_live},       {"units_done", &out->units_done},
                    {"units_held", &out->units_held},     {"units_pool", &out->units_pool},
                    {"work_joins", &out->work_joins},     {"work_leaves", &out->work_leaves},
                    {"work_losses", &out->work_losses}};
        if (!(rc = get_text(self, "job", out->job, sizeof out->job, err)))
            rc = get_text(self, "state", out->state, sizeof out->state, err);
        for (size_t i = 0; !rc && i < sizeof nums / sizeof nums[0]; i++) rc = get_num(self, nums[i].key, nums[i].v, err);
    }
    json_decref(root);
    return rc;
}
