/* dtrain train's flag table (the source's names where they apply) -> dt_train_options: one table for
 * the CLI (train, launch) and the library's options object (dt_options_set, api/options.c). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "train/train_args.h"

#include "cluster/cluster.h"
#include "core/error.h"
#include "train/progress.h"

/* Ranges of the numeric flags (the flag table refuses anything outside). */
#define DAY 86400.0           /* the longest timeout, in seconds */
#define MAX_STEPS 1e12        /* steps: far beyond any run, exact as a double */
#define MAX_TASKS DT_CLUSTER_MAX_TASKS /* workers in a cluster */
#define MAX_SCHED_STEPS 1125899906842624.0 /* 2^50: a schedule's step counts (compute/schedule.h) */

/* A duration flag in seconds (its range checked by the table) into milliseconds, at least 1 unless
 * it is zero. */
static int seconds_to_ms(double secs) {
    int ms = (int)(secs * 1000.0 + 0.5);
    return ms < 1 && secs > 0 ? 1 : ms;
}

void train_args_init(train_args *a) {
    memset(a, 0, sizeof *a);
    dt_train_options_init(&a->o);
    dt_train_debug_init(&a->dbg);
    a->bad_images = "skip", a->auth = "none", a->progress = "auto";
    a->epochs = a->o.epochs, a->connect_timeout = a->o.connect_timeout_ms / 1000.0, a->heartbeat_timeout = 60;
    a->ps_timeout = a->o.ps_timeout_ms / 1000.0, a->idle_timeout = a->o.idle_timeout_ms / 1000.0;
}

/* The table of dtrain train's flags, pointing into a; returns how many (at most TRAIN_MAX_FLAGS). */
int train_args_flags(train_args *a, flag_def *out) {
    dt_train_options *const o = &a->o;
    dt_train_debug *const dbg = &a->dbg;
    const flag_def defs[] = {
        FLAG_TEXT("model", &o->model_path, "model file (see docs/model-format.md)"),
        FLAG_TEXT("data", &o->data_path, "IDX folder or image folder (docs/data.md), or a click log (Criteo TSV or libffm, plain or gzip) for a click-log model (docs/ctr-data.md)"),
        FLAG_TEXT("optimizer", &o->optimizer,
                  "sgd, momentum or adam (a click-log model on a cluster: sgd or adam, which the ps tasks apply "
                  "lazily to its sparse tables, docs/sparse.md)"),
        FLAG_NUM("learning_rate", FLAG_FLOAT, &o->learning_rate, "learning rate", 0, 100, FLAG_LO_OPEN),
        FLAG_TEXT("lr_schedule", &o->lr_schedule,
                  "learning rate by the global step: constant, exponential, piecewise or cosine (TensorFlow's formulas)"),
        FLAG_NUM("lr_decay_steps", FLAG_INT64, &o->lr_decay_steps,
                 "exponential: steps per decay_rate factor; cosine: steps of the decay after warmup (0: the rest of "
                 "the run)", 0, MAX_SCHED_STEPS, 0),
        FLAG_NUM("lr_decay_rate", FLAG_DOUBLE, &o->lr_decay_rate, "exponential: factor per --lr_decay_steps", 0, 100, 0),
        FLAG_SWITCH("lr_staircase", &o->lr_staircase, "exponential: decay in whole steps of --lr_decay_steps"),
        FLAG_TEXT("lr_boundaries", &o->lr_boundaries, "piecewise: increasing global steps b1,...,bn"),
        FLAG_TEXT("lr_values", &o->lr_values,
                  "piecewise: the n+1 learning rates v0,...,vn (v0 until step b1 included; --learning_rate unused)"),
        FLAG_NUM("lr_alpha", FLAG_DOUBLE, &o->lr_alpha, "cosine: the final rate as a fraction of --learning_rate", 0, 1, 0),
        FLAG_NUM("warmup_steps", FLAG_INT64, &o->warmup_steps, "cosine: linear warmup from 0 over this many steps", 0,
                 MAX_SCHED_STEPS, 0),
        FLAG_NUM("weight_decay", FLAG_DOUBLE, &o->weight_decay,
                 "L2 for sgd and momentum, decoupled (AdamW) for adam; kernels only", 0, 10, 0),
        FLAG_SWITCH("weight_decay_biases", &o->weight_decay_biases,
                    "weight decay on rank-1 variables too (biases, batch norm's scale and offset)"),
        FLAG_TEXT("table_optimizer", &o->table_optimizer,
                  "click-log models' embedding tables, updated lazily (the touched rows only): sgd, adagrad, ftrl or "
                  "adam (LazyAdam); default adagrad (docs/sparse.md)"),
        FLAG_NUM("table_learning_rate", FLAG_DOUBLE, &o->table_learning_rate,
                 "the tables' learning rate, constant (adagrad: about 0.2 for click logs); 0: --learning_rate", 0, 100, 0),
        FLAG_NUM("table_initial_accumulator", FLAG_DOUBLE, &o->table_initial_accumulator,
                 "adagrad, ftrl: a new row's accumulator", 0, 1e6, 0),
        FLAG_NUM("table_l1", FLAG_DOUBLE, &o->table_l1, "ftrl: L1 regularisation strength", 0, 1e6, 0),
        FLAG_NUM("table_l2", FLAG_DOUBLE, &o->table_l2, "ftrl: L2 regularisation strength", 0, 1e6, 0),
        FLAG_NUM("table_lr_power", FLAG_DOUBLE, &o->table_lr_power,
                 "ftrl: the power of the accumulator in the step size (-0.5: 1/sqrt)", -1e3, 0, 0),
        FLAG_NUM("clip_gradient_norm", FLAG_DOUBLE, &o->clip_gradient_norm,
                 "scale each gradient to at most this global L2 norm before it is applied or pushed; 0: off", 0, 1e9,
                 0),
        FLAG_TEXT("augment", &o->augment,
                  "training batches only: crop=P (random crop after padding P pixels), flip (horizontal), or "
                  "crop=P,flip; not flip for digits"),
        FLAG_NUM("batch_size", FLAG_INT, &o->batch_size, "examples per step", 1, 65536, 0),
        FLAG_NUM("train_steps", FLAG_INT64, &o->train_steps, "steps to train; 0: use --epochs", 0, MAX_STEPS, 0),
        FLAG_NUM("epochs", FLAG_DOUBLE, &a->epochs, "epochs to train when --train_steps is 0", 0, 1e6, 0),
        FLAG_NUM("steps_to_validate", FLAG_INT64, &o->steps_to_validate, "log and validate every N steps", 1,
                 MAX_STEPS, 0),
        FLAG_NUM("seed", FLAG_UINT64, &o->seed, "seed for initialisation, shuffling and dropout", 0,
                 (double)UINT64_MAX, 0),
        FLAG_TEXT("device", &o->device,
                  "where this process computes: cpu, cuda or cuda:N (a CUDA build; docs/gpu.md)"),
        FLAG_TEXT("precision", &o->precision,
                  "float32, or bf16: the convolutions' and dense layers' products in bf16 with float32 accumulation, "
                  "on a CPU with AVX512_BF16; parameters, optimizer slots, batch norm, the loss and checkpoints stay "
                  "float32, and the ps tasks keep float32 (docs/memory-layout.md, \"Precision\")"),
        FLAG_NUM("threads", FLAG_INT, &o->threads,
                 "compute threads (at most the cores there are; a loop uses them only when its work pays for it and "
                 "other work leaves the cores free: docs/memory-layout.md); 0: all cores",
                 0, 1024, 0),
        FLAG_NUM("validation_fraction", FLAG_DOUBLE, &o->validation_fraction,
                 "held-out share of an image folder; -1: 0.2 (IDX uses its test file)", -1, 1, FLAG_HI_OPEN),
        FLAG_TEXT("bad_images", &a->bad_images, "skip (count and report) or fail on undecodable images"),
        FLAG_TEXT("ps_hosts", &o->ps_hosts, "cluster: comma-separated host:port of the ps tasks"),
        FLAG_TEXT("worker_hosts", &o->worker_hosts, "cluster: comma-separated host:port of the workers"),
        FLAG_TEXT("job_name", &o->job_name, "cluster: this process's job, ps or worker"),
        FLAG_TEXT("task_index", &o->task_index, "cluster: this process's index in its job (default 0)"),
        FLAG_NUM("num_ps", FLAG_INT, &o->num_ps,
                 "cluster from mpirun, srun or a PMI launcher: its first N ranks are ps tasks, the rest workers "
                 "(docs/cluster.md); 0: off", 0, MAX_TASKS, 0),
        FLAG_NUM("base_port", FLAG_INT, &o->base_port, "with --num_ps: each task listens on this + its local id",
                 1, 65535, 0),
        FLAG_TEXT("rendezvous", &o->rendezvous,
                  "with --num_ps under MPI across hosts: host:port where rank 0 runs, where the ranks exchange "
                  "addresses"),
        FLAG_NUM("issync", FLAG_INT, &o->issync, "0: asynchronous updates, 1: synchronous replicas", 0, 1, 0),
        FLAG_NUM("replicas_to_aggregate", FLAG_INT, &o->replicas_to_aggregate,
                 "sync: gradients averaged per step; 0: the number of workers", 0, MAX_TASKS, 0),
        FLAG_NUM("total_num_replicas", FLAG_INT, &o->total_num_replicas,
                 "sync: workers pushing (the number of workers; more than --replicas_to_aggregate: backup "
                 "workers); 0: --replicas_to_aggregate", 0, MAX_TASKS, 0),
        FLAG_NUM("staleness", FLAG_INT, &o->staleness,
                 "sync: steps a worker may run ahead of the slowest; 0: fully synchronous (--sharding dynamic: "
                 "at most 15)", 0, 64, 0),
        FLAG_TEXT("sharding", &o->sharding,
                  "cluster: fixed (the default: one shard per worker task, bit-exact runs) or dynamic (ps 0 hands "
                  "out units of batches: every example once per epoch while workers die and join; docs/elastic.md)"),
        FLAG_NUM("unit_batches", FLAG_INT, &o->unit_batches,
                 "--sharding dynamic: batches per unit of work; 0: 4", 0, 64, 0),
        FLAG_NUM("max_workers", FLAG_INT, &o->max_workers,
                 "--sharding dynamic: any worker task index below this may join the running job (its own "
                 "--worker_hosts names it); 0: the cluster's workers", 0, 65536, 0),
        FLAG_NUM("debug_step_delay_ms", FLAG_INT, &dbg->step_delay_ms,
                 "testing: sleep this long before each update", 0, 600000, 0),
        FLAG_NUM("debug_delay_worker", FLAG_INT, &dbg->delay_worker,
                 "testing: only this worker sleeps; -1: every worker", -1, MAX_TASKS - 1, 0),
        FLAG_TEXT("debug_dump_params", &dbg->dump_params,
                  "testing: the chief writes its final parameters to this file (raw float32)"),
        FLAG_TEXT("debug_dump_grads", &dbg->dump_grads,
                  "testing: this process writes its first step's gradient to this file (raw float32)"),
        FLAG_TEXT("debug_work_log", &dbg->work_log,
                  "testing, --sharding dynamic: append one line per batch of this worker that counted (its example "
                  "ids)"),
        FLAG_NUM("debug_emulate_compute_ms", FLAG_INT, &dbg->emulate_compute_ms,
                 "benchmarks: each step sleeps this long instead of computing, then pushes a full-size constant "
                 "gradient (a click-log model: its real step, padded to this long beside the wait for its rows; docs/testbed.md); -1: off", -1, 600000, 0),
        FLAG_NUM("debug_ps_stop_at_sparse_pull", FLAG_INT64, &dbg->ps_stop_at_sparse_pull,
                 "testing: a ps stops at the N-th SPARSE_PULL a worker sends it, unanswered, as if killed there (exit "
                 "status 130); 0: off",
                 0, MAX_STEPS, 0),
        FLAG_NUM("debug_log_data_bytes", FLAG_INT, &dbg->log_data_bytes,
                 "testing, click logs: 1 logs the bytes of text the first step read", 0, 1, 0),
        FLAG_NUM("debug_import_delay_ms", FLAG_INT, &dbg->import_delay_ms,
                 "testing: the chief restoring a checkpoint sleeps this long between declaring the sparse tables and "
                 "sending their rows to the ps tasks",
                 0, 600000, 0),
        FLAG_TEXT("placement", &o->placement, "variables over ps tasks: greedy or round_robin"),
        FLAG_TEXT("bind", &o->bind,
                  "ps: address to bind instead of its own in --ps_hosts (0.0.0.0: every IPv4 interface, [::]: every "
                  "interface; a host behind NAT)"),
        FLAG_NUM("chunk_kb", FLAG_INT, &o->chunk_kb,
                 "chief: each ps shard travels in chunks of about this many KiB, applied and sent back one by one; "
                 "0: one chunk", 0, 1 << 22, 0),
        FLAG_TEXT("compression", &o->compression,
                  "cluster: none, bf16 or fp16: gradients (with error feedback) and parameters travel in 16 bits, "
                  "half the bytes, and so do a click-log model's sparse rows (without error feedback); the ps tasks "
                  "keep float32"),
        FLAG_TEXT("overlap", &o->overlap,
                  "cluster: priority, fifo or none: each layer's gradient goes as soon as backward made it and the "
                  "next forward waits per layer for its parameters (priority: what it needs first goes first); not with a "
                  "click-log model's sparse tables (they have --sparse_prefetch)"),
        FLAG_NUM("sparse_prefetch", FLAG_INT, &o->sparse_prefetch,
                 "cluster, a click-log model's sparse tables: 1 pulls the next batch's rows while the current "
                 "batch computes (sync: the same rows; async: one step staler), 0 when its forward starts", 0, 1, 0),
        FLAG_NUM("connect_timeout", FLAG_DOUBLE, &a->connect_timeout, "seconds a worker retries its ps tasks", 0, DAY,
                 FLAG_LO_OPEN),
        FLAG_NUM("heartbeat_timeout", FLAG_DOUBLE, &a->heartbeat_timeout,
                 "seconds a worker waits for any ps reply (a sync barrier included) before giving up naming the ps",
                 0, DAY, FLAG_LO_OPEN),
        FLAG_NUM("ps_timeout", FLAG_DOUBLE, &a->ps_timeout,
                 "seconds a worker waits for a lost ps to come back (the chief then rolls every ps back to the "
                 "newest checkpoint); 0: give up at once", 0, DAY, 0),
        FLAG_SWITCH("strict", &o->strict,
                    "sync: a lost worker stops the job (default: each step waits for the live workers only)"),
        FLAG_NUM("ps_table_memory", FLAG_DOUBLE, &o->ps_table_memory_gib,
                 "ps: GiB the sparse tables may grow to on it together at their capacities (a table of buckets: its "
                 "share); past it the chief's declaration is refused; 0: three quarters of the physical memory, "
                 "or of a container's (cgroup) limit if lower",
                 0, 1048576, 0),
        FLAG_NUM("idle_timeout", FLAG_DOUBLE, &a->idle_timeout,
                 "ps: seconds without any message after which it exits with an error (its chief is gone); 0: never",
                 0, DAY, 0),
        FLAG_SWITCH("dry_run", &o->dry_run, "print the cluster and the placement of variables, then exit"),
        FLAG_TEXT("logdir", &o->logdir, "checkpoints: restored from at start, saved to by the chief; '' for none"),
        FLAG_NUM("save_model_secs", FLAG_DOUBLE, &o->save_model_secs,
                 "seconds between checkpoints (also at start and end); 0: only those", 0, 7 * DAY, 0),
        FLAG_NUM("max_to_keep", FLAG_INT, &o->max_to_keep, "checkpoints kept in --logdir; 0: all", 0, 1000000, 0),
        FLAG_TEXT("summary_dir", &o->summary_dir,
                  "TensorBoard event files in <dir>/train and <dir>/test; '' for none"),
        FLAG_TEXT("auth", &a->auth, "cluster: none (trusted networks only) or curve (authenticated, encrypted)"),
        FLAG_TEXT("keys", &o->keys,
                  "--auth=curve: keys folder (ps: server.secret, authorized/*.key; worker: client.secret, "
                  "server.key; see dtrain keygen)"),
        FLAG_NUM("metrics_port", FLAG_INT, &o->metrics_port,
                 "serve Prometheus metrics (/metrics) and the status page (/) on this port; 0: off (docs/metrics.md)",
                 0, 65535, 0),
        FLAG_TEXT("metrics_addr", &o->metrics_addr,
                  "address the metrics server binds (ADDR or ADDR:PORT; default 127.0.0.1; it shows training figures, "
                  "never parameters or files: docs/security.md)"),
        FLAG_TEXT("metrics_peers", &o->metrics_peers,
                  "chief: comma-separated host:port of the other tasks' metrics servers, for the status page's cluster "
                  "view (dtrain launch sets it)"),
        FLAG_TEXT("progress", &a->progress,
                  "progress line on stderr: auto (when stderr is a terminal), always, never, or relay (whole lines "
                  "that dtrain launch redraws in place)"),
    };
    int n = (int)(sizeof defs / sizeof defs[0]);
    _Static_assert(sizeof defs / sizeof defs[0] <= TRAIN_MAX_FLAGS, "raise TRAIN_MAX_FLAGS");
    memcpy(out, defs, sizeof defs);
    return n;
}

void train_args_help(FILE *f, train_args *a) {
    flag_def defs[TRAIN_MAX_FLAGS];
    flags_print_help(f, defs, train_args_flags(a, defs));
}

int train_args_parse(train_args *a, int argc, char **argv, int *help, dt_error *err) {
    flag_def defs[TRAIN_MAX_FLAGS];
    int n = train_args_flags(a, defs);
    int rc = flags_parse(defs, n, argc, argv, help, err);
    if (rc || *help) return rc;
    return train_args_finish(a, err);
}

int train_args_finish(train_args *a, dt_error *err) {
    dt_train_options *o = &a->o;
    if (!strcmp(a->bad_images, "fail")) o->fail_on_bad_images = 1;
    else if (strcmp(a->bad_images, "skip"))
        return dt_errorf(err, DT_EINVAL, "bad_images: expected skip or fail, got '%s'", a->bad_images);
    o->epochs = a->epochs;
    o->auth = a->auth;
    o->connect_timeout_ms = seconds_to_ms(a->connect_timeout);
    o->heartbeat_timeout_ms = seconds_to_ms(a->heartbeat_timeout);
    o->ps_timeout_ms = seconds_to_ms(a->ps_timeout);
    o->idle_timeout_ms = seconds_to_ms(a->idle_timeout);
    const char *progress = a->progress ? a->progress : "auto"; /* NULL: launch asks whether it was given */
    if (!strcmp(progress, "auto")) o->progress = isatty(STDERR_FILENO) ? DT_PROGRESS_TTY : DT_PROGRESS_OFF;
    else if (!strcmp(progress, "always")) o->progress = DT_PROGRESS_TTY;
    else if (!strcmp(progress, "never")) o->progress = DT_PROGRESS_OFF;
    else if (!strcmp(progress, "relay")) o->progress = DT_PROGRESS_RELAY;
    else return dt_errorf(err, DT_EINVAL, "progress: expected auto, always, never or relay, got '%s'", progress);
    return DT_OK;
}

