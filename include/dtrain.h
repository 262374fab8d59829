/* dtrain: data-parallel distributed training in C. Public API.
 *
 * Every fallible call returns 0 on success or a negative DT_E* code and, when err is non-NULL, fills
 * err->msg with a one-line message that names the file, line or field at fault. err may be NULL;
 * the code returned is the same either way. Nothing in the library exits or aborts on bad input. */
#ifndef DTRAIN_H
#define DTRAIN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* libdtrain is built with -fvisibility=hidden: what this header declares is all the shared library
 * exports (tests/test_symbols.sh checks it). */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

enum {
    DT_OK = 0,
    DT_EINVAL = -1,   /* bad argument, flag or config value */
    DT_ENOMEM = -2,   /* allocation failed */
    DT_EIO = -3,      /* file or socket i/o failed */
    DT_EFORMAT = -4,  /* malformed input file or message */
    DT_ESHAPE = -5,   /* shapes do not fit */
    DT_ENET = -6,     /* network failure */
    DT_ETIMEOUT = -7, /* a deadline passed */
    DT_EPROTO = -8,   /* peer speaks another protocol or broke it */
    DT_EINTR = -9,    /* stopped by a signal */
};

typedef struct dt_error {
    int code;
    char msg[1024];
} dt_error;

const char *dt_strerror(int code);
const char *dt_version(void);

/* ---- Building blocks of your own training program (examples/) --------------------------------
 * A single-machine program becomes distributed with three changes (examples/train_distributed.c):
 *   1. the cluster from the command line: dt_cluster_from_args (also picks this worker's data shard);
 *   2. a ps only serves: if (dt_cluster_is_ps(cluster)) return dt_serve(cluster, net, NULL, 600000, NULL, &err);
 *   3. the optimizer wrapped for the cluster: dt_optimizer_distribute. */

/* A network built from a model file (docs/model-format.md): parameters in one flat buffer. */
typedef struct dt_net dt_net;
int dt_net_load(dt_net **out, const char *model_path, int max_batch, dt_error *err);
void dt_net_free(dt_net *net);
size_t dt_net_param_count(const dt_net *net);
/* x [batch, height, width, channels] (NHWC), batch <= max_batch; training turns dropout on (mask
 * from seed) and makes batch norm use the batch's statistics and update its moving ones
 * (docs/batchnorm.md); evaluation uses the moving ones. Returns logits [batch, classes], owned by
 * net, valid until the next forward; NULL with err filled (DT_EINVAL) when batch is out of range. */
const float *dt_net_forward(dt_net *net, const float *x, int batch, int training, uint64_t seed, dt_error *err);
/* Mean softmax cross-entropy of the last forward; *correct = argmax matches. */
float dt_net_loss(dt_net *net, const int32_t *labels, int *correct);
/* Gradients of the last loss with respect to every parameter (0 for batch norm's moving
 * statistics). Refused (DT_EINVAL) without a loss, and after an evaluation forward: batch norm's
 * statistics would be another batch's. */
int dt_net_backward(dt_net *net, dt_error *err);

/* The cluster: the source's flags (--ps_hosts, --worker_hosts, --job_name, --task_index) or the
 * TF_CONFIG environment variable; neither means a single process. */
typedef struct dt_cluster dt_cluster;
/* Takes the four cluster flags out of argv (the rest stay, in order) and reads TF_CONFIG. */
int dt_cluster_from_args(dt_cluster **out, int *argc, char **argv, dt_error *err);
void dt_cluster_free(dt_cluster *c);
int dt_cluster_is_ps(const dt_cluster *c);
int dt_cluster_is_chief(const dt_cluster *c);
/* A ps task: holds its share of net's variables (and their optimizer state) and applies the
 * workers' updates until the chief ends training; then returns 0. It reports to log (NULL:
 * stdout). A ps that hears from nobody for idle_timeout_ms returns DT_ETIMEOUT (its chief is
 * gone; `dtrain train` waits 600000); 0: it waits for ever. stop (may be NULL): once *stop is set
 * (e.g. from a SIGINT handler) it returns DT_EINTR. No auth: dt_serve_opts takes a ps's every flag. */
int dt_serve(const dt_cluster *c, const dt_net *net, FILE *log, int idle_timeout_ms, const volatile int *stop,
             dt_error *err);

/* Training batches of a data path (docs/data.md) for net's input: shuffled per epoch from seed;
 * with a cluster (non-NULL), only this worker's shard. */
typedef struct dt_batches dt_batches;
int dt_batches_open(dt_batches **out, const char *data_path, const dt_net *net, int batch_size,
                    uint64_t seed, const dt_cluster *cluster, dt_error *err);
int dt_batches_next(dt_batches *b, const float **x, const int32_t **labels, int *n, dt_error *err);
/* Accuracy of net on the data path's test split. */
int dt_batches_test_accuracy(dt_batches *b, dt_net *net, double *accuracy, dt_error *err);
void dt_batches_free(dt_batches *b);

/* An optimizer ("sgd", "momentum", "adam": TensorFlow's formulas) over net's parameters. */
typedef struct dt_optimizer dt_optimizer;
int dt_optimizer_new(dt_optimizer **out, const char *name, float learning_rate, const dt_net *net,
                     dt_error *err);
/* Makes opt work for the cluster (a single process: nothing changes): the variables and the
 * optimizer's state live on the ps tasks, each update is pushed there and the new parameters
 * pulled back. issync: 0 asynchronous, 1 synchronous replicas (each step applies the mean of every
 * worker's gradient: docs/protocol.md). The worker reports waits and faults to log (NULL: stdout).
 * The exchange is uncompressed, uncut and between steps, without auth: dt_optimizer_distribute_opts
 * takes a worker's every flag. */
int dt_optimizer_distribute(dt_optimizer *opt, const dt_cluster *c, const dt_net *net, int issync, FILE *log,
                            dt_error *err);
/* Sets net's starting parameters: initialised from seed (the chief, or a single process), or
 * pulled once the chief has initialised them. *global_step: where training starts. */
int dt_optimizer_start(dt_optimizer *o, dt_net *net, uint64_t seed, int64_t *global_step, dt_error *err);
/* Applies the gradients of the last dt_net_backward; *global_step: the step after the update. */
int dt_optimizer_apply(dt_optimizer *o, dt_net *net, int64_t *global_step, dt_error *err);
/* Training is over for this process (on a cluster the chief then ends it: the ps tasks exit). */
int dt_optimizer_finish(dt_optimizer *o, dt_error *err);
void dt_optimizer_free(dt_optimizer *o);

/* ---- Training as `dtrain train` does it -------------------------------------------------------- */

typedef struct dt_train_options {
    const char *model_path;      /* model file (docs/model-format.md) */
    const char *data_path;       /* IDX folder or image folder (docs/data.md) */
    const char *optimizer;       /* "sgd", "momentum" or "adam" */
    float learning_rate;
    int batch_size;
    int64_t train_steps;         /* > 0: stop after this many steps; else run `epochs` */
    double epochs;
    int64_t steps_to_validate;   /* log + validate every this many steps (and at every epoch end) */
    uint64_t seed;               /* initialisation, shuffling, dropout */
    int threads;                 /* compute threads; <= 0: all cores */
    double validation_fraction;  /* image folders; < 0: default 0.2 */
    int fail_on_bad_images;      /* 0: count and skip undecodable images; 1: stop with an error */
    int progress;                /* 1: a live progress line with ETA on stderr (a terminal); 2: the same as
                                  * whole lines starting with '\r', for `dtrain launch` to redraw; 0: none */

    /* Training options, the same on one machine and on the ps tasks (README, "Training options").
     * The learning rate of each update follows the global step: lr_schedule "constant" (NULL, the
     * default), "exponential" (learning_rate * lr_decay_rate ^ (step / lr_decay_steps), floored
     * with lr_staircase), "piecewise" (lr_values "v0,...,vn" between lr_boundaries "b1,...,bn") or
     * "cosine" (warmup_steps linear warmup from 0, then down to lr_alpha * learning_rate over
     * lr_decay_steps; 0: the rest of the run). weight_decay (0..10): L2 for sgd and momentum,
     * decoupled (AdamW) for adam, on kernels only unless weight_decay_biases (then also rank-1
     * variables: biases, batch norm's scale and offset). clip_gradient_norm > 0: each gradient is
     * scaled to at most this global L2 norm before it is applied or pushed. augment: "crop=P",
     * "flip" or both, comma-separated, for training batches only (NULL or "": none). */
    const char *lr_schedule, *lr_boundaries, *lr_values;
    int64_t lr_decay_steps, warmup_steps;
    double lr_decay_rate, lr_alpha;
    int lr_staircase;
    double weight_decay;
    int weight_decay_biases;
    double clip_gradient_norm;
    const char *augment;
    /* The embedding tables of a click-log model (docs/sparse.md, "Lazy optimizers"): updated
     * lazily, only the rows a batch touched, by table_optimizer ("sgd", "adagrad", "ftrl" or "adam";
     * NULL: adagrad) at table_learning_rate (0: learning_rate), constant (the schedule and
     * weight_decay are the dense variables'). TensorFlow's defaults: table_initial_accumulator 0.1
     * (adagrad, ftrl), table_l1 0, table_l2 0, table_lr_power -0.5 (ftrl). */
    const char *table_optimizer;
    double table_learning_rate, table_initial_accumulator, table_l1, table_l2, table_lr_power;
    const volatile int *stop;    /* if non-NULL and set (e.g. from SIGINT), training stops early */

    /* The cluster, as the source's flags (docs/cluster.md). All NULL: the TF_CONFIG environment
     * variable if set, else this machine alone. job_name "ps" serves until the chief ends
     * training; "worker" trains its shard of the data (worker 0 is the chief). */
    const char *ps_hosts, *worker_hosts, *job_name, *task_index;
    /* Or, num_ps > 0 (none of the four above given): the cluster from the cluster manager that
     * started this task (Open MPI, Slurm, a PMI launcher; docs/cluster.md): its first num_ps ranks
     * are ps tasks, the rest workers; every task's port is base_port (default 2222) + its local id
     * on its node; under MPI across hosts the ranks meet at rendezvous ("host:port" where rank 0
     * runs, NULL: every rank on this host) within connect_timeout_ms. TF_CONFIG is then ignored. */
    int num_ps, base_port;
    const char *rendezvous;
    /* A ps binds its own address (a name resolved), or bind instead if set (NULL or "": none):
     * "0.0.0.0" (every IPv4 interface), "[::]" (every interface) or an interface address, with an
     * optional ":PORT", for a host whose listed name resolves to another address (NAT, a
     * Kubernetes service). Workers ignore it. */
    const char *bind;
    int issync;                  /* 0: asynchronous (the source's default); 1: sync replicas */
    /* Sync replicas (issync 1): each step applies the mean of replicas_to_aggregate workers'
     * gradients (0: every worker); total_num_replicas (0: replicas_to_aggregate) must be the number
     * of workers, more than replicas_to_aggregate means backup workers whose late gradients are
     * dropped and counted; a worker may run at most staleness steps ahead (0: fully synchronous). */
    int replicas_to_aggregate, total_num_replicas, staleness;
    const char *placement;       /* "greedy" (default) or "round_robin" */
    /* The chief cuts each ps shard into chunks of about chunk_kb KiB (default 128; 0: one chunk),
     * which travel, are applied and come back one by one, so both directions of the wire work at
     * once (docs/protocol.md, "Chunks"). At most 255 chunks per shard. */
    int chunk_kb;
    /* Cluster: "none" (NULL, the default), "bf16" or "fp16": each worker sends its gradients and
     * pulls the parameters in 16 bits, half the bytes, with error feedback on the gradients; the ps
     * tasks keep float32 values and optimizer state, checkpoints stay float32. Per worker: workers
     * with and without it can share a cluster (docs/protocol.md, "Encodings"). */
    const char *compression;
    /* Cluster: "priority" (NULL: the default), "fifo" or "none". A worker pushes each layer's
     * gradient as soon as backward has made it and starts each layer of the next forward as soon
     * as its parameters are back, so the exchange runs under the compute; priority sends first
     * what the next forward needs first, fifo in the order backward makes it; none exchanges
     * between steps. Results are the same either way (sync mode: bit for bit). Sync mode with
     * backup workers or staleness exchanges between steps (docs/protocol.md, "Overlap"). */
    const char *overlap;
    /* Cluster, a click-log model's sparse tables: 1 (the default) pulls the next batch's rows under
     * the current step's compute, on a connection of its own; 0: each batch's rows when its forward
     * starts. Sync mode: the same rows either way; async: rows one step staler (docs/sparse.md,
     * "Prefetch"). */
    int sparse_prefetch;
    /* Cluster: "fixed" (NULL, the default) cuts every epoch into one shard per worker task;
     * "dynamic" hands each epoch out from ps 0 in units of unit_batches batches (default 4, at
     * most 64), so every example is trained once per epoch while workers die and join, and any
     * task index below max_workers (0: the cluster's workers) may join a running job
     * (docs/elastic.md). */
    const char *sharding;
    int unit_batches, max_workers;
    int connect_timeout_ms;      /* how long a worker retries the ps tasks (default 60000) */
    int heartbeat_timeout_ms;    /* the longest a worker waits for any ps reply (a sync barrier
                                  * included) before it gives up naming the ps; <= 0: 60000. In
                                  * sync mode a worker silent for half of it is lost to the ps */
    /* Faults (docs/faults.md): a worker waits up to ps_timeout_ms (default 120000; 0: not at all)
     * for a lost ps to come back, and the chief then rolls every shard back to the newest
     * checkpoint; strict (sync mode): a lost worker stops the job instead of lowering the replicas
     * each step waits for; a ps that hears from nobody for idle_timeout_ms (default 600000; 0:
     * never) exits with an error (its chief is gone). */
    int ps_timeout_ms, strict, idle_timeout_ms;
    int dry_run;                 /* print the cluster and the placement, then return */

    /* The supervisor (the chief, or the single process; docs/checkpoint-format.md): restores the
     * newest good checkpoint of logdir if there is one, saves one at start, every save_model_secs
     * and at the end, keeping max_to_keep; TensorBoard summaries in summary_dir/{train,test}. */
    const char *logdir;          /* default "./checkpoint"; NULL or "": no checkpoints, no restore */
    double save_model_secs;      /* default 60; <= 0: only at start and at the end */
    int max_to_keep;             /* default 5; <= 0: keep all */
    const char *summary_dir;     /* default "./summary_log"; NULL or "": no summaries */

    /* Security (docs/security.md): auth "none" (NULL, the default: trusted networks only) or
     * "curve" (ZeroMQ CURVE, authenticated and encrypted) with the keys folder `keys`. */
    const char *auth, *keys;

    /* Metrics (docs/metrics.md): with metrics_port 1..65535, or metrics_addr "ADDR:PORT", this
     * process serves Prometheus metrics (/metrics), its figures (/status.json) and the status page
     * (/) over HTTP on metrics_addr (NULL or "": 127.0.0.1); a port in use fails at start.
     * metrics_peers (the chief): comma-separated host:port of the other tasks' metrics servers,
     * fetched every second for the status page's view of the cluster. 0 and no port: off. */
    int metrics_port;
    const char *metrics_addr, *metrics_peers;

    /* Where a worker (or the single process) computes (docs/gpu.md): "cpu" (NULL, the default),
     * "cuda" or "cuda:N" in a build with CUDA. Parameters stay on the host for the updater, the ps
     * tasks and checkpoints; a ps task computes nothing and ignores it. */
    const char *device;
    /* What a worker (or the single process) computes in (docs/memory-layout.md, "Precision"):
     * "float32" (NULL, the default) or "bf16": the convolutions' and dense layers' products in bf16
     * with float32 accumulation, on a CPU with AVX512_BF16 (else training fails at start, naming it).
     * Parameters, gradients, optimizer slots, batch norm, softmax, the loss and checkpoints stay
     * float32 (a checkpoint resumes in either precision); a ps task checks the name and keeps
     * float32. */
    const char *precision;
    /* A ps task (docs/sparse.md, "Memory"): the most GiB the sparse tables the chief declares may grow
     * to on it together, at their capacities (a table of buckets counts its share of the rows); a
     * declaration past it is refused, naming the figures. 0 (the default): three quarters of the
     * machine's physical memory. */
    double ps_table_memory_gib;
} dt_train_options;

typedef struct dt_train_result {
    int64_t steps;
    double final_loss;           /* mean training loss over the last logging interval */
    double validation_accuracy;
    double test_accuracy, test_loss;
    int64_t test_examples;
    double seconds, examples_per_sec;
    int64_t bad_images;
    int64_t start_step;          /* global step training started at (a restored checkpoint's, or 0) */
    /* A click-log model (docs/ctr-data.md): the test split's AUC and logloss (test_loss: the mean
     * training loss formula, unclipped; test_accuracy: at a threshold of 0.5). NaN otherwise. */
    double test_auc, test_logloss;
} dt_train_result;

/* Fills o with dtrain's defaults (adam, 0.002, batch 64, 1 epoch, steps_to_validate 1000, seed 1,
 * asynchronous, greedy placement, checkpoints in ./checkpoint every 60 s keeping 5, summaries in
 * ./summary_log). */
void dt_train_options_init(dt_train_options *o);
/* Trains on this machine, logging to `log` (NULL: stdout); returns DT_EINTR if *stop was set. */
int dt_train(const dt_train_options *o, FILE *log, dt_train_result *result, dt_error *err);

/* ---- Options by flag name, arrays in memory, a model step by step (bindings: docs/python.md) ----
 * A binding (python/dtrain) mirrors no struct: it sets `dtrain train`'s flags by name, hands its
 * arrays over as pointers and calls these functions; every struct it reads is opaque. */

/* `dtrain train`'s flags, the same table (names without dashes, values as on the command line,
 * ranges checked, unknown names refused with the nearest one), starting at dtrain's defaults. */
typedef struct dt_options dt_options;
int dt_options_new(dt_options **out, dt_error *err);
void dt_options_free(dt_options *o);
/* Sets flag to value (copied); setting a flag again replaces its value. DT_EINVAL naming the flag. */
int dt_options_set(dt_options *o, const char *flag, const char *value, dt_error *err);
/* A flag's current value as text (an unset text flag: ""). */
int dt_options_get(const dt_options *o, const char *flag, char *out, size_t cap, dt_error *err);

/* Example arrays in the caller's memory, not copied: they must stay alive and unchanged while they
 * are in use (dt_options_train: until it returns). x [n, h, w, c] row-major (NHWC), float32 as is
 * or uint8 scaled by 1/255 as dtrain scales IDX and image pixels; labels [n] in 0..classes-1 (NULL:
 * unlabelled). */
enum { DT_FLOAT32 = 0, DT_UINT8 = 1 };
/* The training data instead of --data (split 0), or the test split (1: validation and test; none:
 * the training arrays again). n 0 removes the split. */
int dt_options_set_arrays(dt_options *o, int split, const void *x, int dtype, const int32_t *labels, int64_t n,
                          int h, int w, int c, dt_error *err);
/* A click log's rows in the caller's memory, not copied (docs/ctr-data.md, docs/python.md): n rows
 * (n >= 1), row i read as a click log's line i + 1. labels [n] 0 or 1; dense [n * num_dense] (as the
 * model takes them: a file's integers go through log(1 + x), these do not); categorical ids [nnz]
 * with offsets [n * num_fields + 1] (the ids of row i, field f: ids[offsets[i*F + f] ..
 * offsets[i*F + f + 1]), several for a multi-valued field, none for a missing one), or offsets NULL
 * and ids [n * num_fields], one per field; values [nnz] each id's weight (NULL: 1). The shapes are
 * checked here; a row breaking the rest is a bad line where it is read. The arrays must stay alive
 * and unchanged while the handle is in use; freeing the handle frees nothing of the caller's. */
typedef struct dt_clicks dt_clicks;
int dt_clicks_new(dt_clicks **out, int64_t n, const float *labels, int num_dense, const float *dense, int num_fields,
                  const int64_t *offsets, const uint64_t *ids, const float *values, int64_t nnz, dt_error *err);
void dt_clicks_free(dt_clicks *c);
/* A click-log model's data instead of --data: c's rows split into training, validation and test,
 * and shard over workers, as the lines of a file do (a bad row is a bad line: skipped and counted,
 * or the error under --bad_images fail). The arrays must stay alive until dt_options_train returns;
 * the handle may go. c NULL removes them. */
int dt_options_set_clicks(dt_options *o, const dt_clicks *c, dt_error *err);
/* Training batches from a caller's source (an iterator of a binding's) instead of arrays or --data:
 * fn(user, max, &x, &dtype, &labels, &n) gives n (1..max) examples x [n, h, w, c] (DT_FLOAT32, used
 * in place, or DT_UINT8, scaled by 1/255) and labels [n], which must stay alive and unchanged until
 * fn's next call or dt_options_train's return; non-zero: no more (training fails, DT_EINVAL). Needs
 * test arrays (dt_options_set_arrays split 1: validation and test), --train_steps (a source has no
 * epochs) and fixed sharding; each worker's source is its shard; a restored run goes on from the
 * source where it is. fn NULL: none. */
typedef int (*dt_batch_source)(void *user, int max, const void **x, int *dtype, const int32_t **labels, int *n);
void dt_options_set_batches(dt_options *o, dt_batch_source fn, void *user);
/* fn(user, global_step, batch loss, batch accuracy) every `every` steps of this process during
 * dt_options_train (on its thread); a non-zero return stops training (DT_EINTR). fn NULL: none. */
typedef int (*dt_step_callback)(void *user, int64_t step, double loss, double accuracy);
void dt_options_set_callback(dt_options *o, dt_step_callback fn, void *user, int64_t every);
/* The chief's (or the single process's) final parameters [n] are copied to out at the end of
 * dt_options_train (n must be the model's parameter count: else DT_ESHAPE then); NULL: not wanted. */
void dt_options_set_params_out(dt_options *o, float *out, size_t n);
/* Asks a dt_options_train call running on o (a worker, a ps or one process) (in another thread, or a signal
 * handler) to stop at its next step: it returns DT_EINTR, checkpoint saved as on Ctrl-C. Cleared by
 * the next dt_options_train. */
void dt_options_stop(dt_options *o);
/* The log's lines (what dt_train writes to its `log`) to fn(user, line) instead, each whole line with
 * its newline, as it ends, on the thread that wrote it (the training thread, or another of
 * dt_options_train's; never two at once); fn NULL: the FILE dt_options_train is given. */
typedef void (*dt_log_fn)(void *user, const char *line);
void dt_options_set_log(dt_options *o, dt_log_fn fn, void *user);
/* dt_train with these options: alone, or this task's role in the cluster the flags, TF_CONFIG or a
 * cluster manager give (a ps serves until the chief ends training). */
int dt_options_train(dt_options *o, FILE *log, dt_train_result *result, dt_error *err);

/* The building blocks with `dtrain train`'s flags of opts, so that a program of the building blocks
 * runs in a cluster with `dtrain train` tasks (one placement, the same exchange):
 * dt_serve with a ps task's (--auth and --keys, --bind, --idle_timeout, --ps_table_memory,
 * --placement; dt_options_stop ends it, DT_EINTR); dt_optimizer_distribute with a worker's
 * (--issync with --replicas_to_aggregate, --total_num_replicas and --staleness, --compression,
 * --chunk_kb, --overlap, --auth and --keys, --placement, the timeouts and faults; dt_options_stop
 * ends its waits). */
int dt_serve_opts(const dt_cluster *c, const dt_net *net, const dt_options *opts, FILE *log, dt_error *err);
int dt_optimizer_distribute_opts(dt_optimizer *o, const dt_cluster *c, const dt_net *net, const dt_options *opts,
                                 FILE *log, dt_error *err);

/* A model trained step by step on one machine, from the options' --model, --optimizer and its
 * schedule (--table_optimizer and its flags for a click-log model's tables), --seed, --threads,
 * --clip_gradient_norm and --batch_size (the most examples per call): initialised from the seed as
 * `dtrain train` does, or restored by dt_model_restore. An image model steps on images
 * (dt_model_train_step), a click-log model on click arrays (dt_model_train_step_clicks); each refuses
 * the other's (DT_EINVAL). */
typedef struct dt_model dt_model;
int dt_model_new(dt_model **out, const dt_options *o, dt_error *err);
void dt_model_free(dt_model *m);
void dt_model_input_shape(const dt_model *m, int *h, int *w, int *c);
int dt_model_num_classes(const dt_model *m);
int dt_model_max_batch(const dt_model *m);
int64_t dt_model_global_step(const dt_model *m);
size_t dt_model_param_count(const dt_model *m);
/* The step API on a cluster: this task of the cluster the options give (the cluster flags, TF_CONFIG
 * or a cluster manager's environment, as dt_options_train reads them). A worker joins it as a
 * `dtrain train` worker does (--issync with --replicas_to_aggregate, --total_num_replicas and
 * --staleness; --compression, --chunk_kb, --overlap, --auth and --keys, the timeouts and faults),
 * each dt_model_train_step then pushes its gradient to the ps tasks and takes their parameters (a
 * sync step waits for the others), its dropout seeded as that worker's; the chief (worker 0)
 * initialises the ps tasks from the seed. *role: 0 alone (nothing changes), 1 the chief, 3 another
 * worker, 2 a ps task (nothing joined: it serves through dt_options_train). An image model, fixed
 * sharding: each worker's batches are its own shard, which the caller picks. No checkpoints here
 * (dt_model_save and _restore refuse: a lost ps comes back from the seed), nor set_params. */
int dt_model_distribute(dt_model *m, int *role, dt_error *err);
/* A cluster worker's end: its last exchange settled, the ps tasks told (the chief waits for the
 * other workers' ends and shuts the ps tasks down, as dtrain train's chief does); afterwards the
 * model holds the final parameters and trains no more. Alone: nothing. */
int dt_model_finish(dt_model *m, dt_error *err);
/* The flat parameters [dt_model_param_count] (docs/checkpoint-format.md's order of variables). */
int dt_model_get_params(const dt_model *m, float *out, size_t n, dt_error *err);
int dt_model_set_params(dt_model *m, const float *params, size_t n, dt_error *err);
/* One step, as one of `dtrain train`'s: forward with dropout from the seed and the step, softmax
 * cross-entropy, backward, clipping, the optimizer; n in 1..max batch. *loss: the batch's mean loss,
 * *correct: examples whose argmax is the label. A loss that is not finite is refused (DT_EINVAL),
 * the parameters unchanged. */
int dt_model_train_step(dt_model *m, const void *x, int dtype, const int32_t *labels, int n, float *loss,
                        int *correct, dt_error *err);
/* Logits [n, classes] of evaluation forwards (batch norm's moving statistics, no dropout), in batches
 * of max batch, into the caller's buffer. */
int dt_model_predict(dt_model *m, const void *x, int dtype, int64_t n, float *logits, dt_error *err);
/* Mean loss and accuracy over n labelled examples. */
int dt_model_evaluate(dt_model *m, const void *x, int dtype, const int32_t *labels, int64_t n, double *loss,
                      double *accuracy, dt_error *err);
/* A checkpoint of the parameters, the optimizer's state and the global step in logdir, as `dtrain
 * train` saves them (model.ckpt-<step>.safetensors and the index; max_to_keep <= 0 keeps all);
 * restore: the newest good one of logdir (0: none there, nothing changed; 1: restored). */
/* A click-log model (input dense=N fields=M): 1 and its dense features and fields; 0 for an image
 * model (both 0). */
int dt_model_click_shape(const dt_model *m, int *num_dense, int *num_fields);
/* One step of `dtrain train` on c's rows (1..max batch, in order, as a batch of the click log's
 * lines): forward with dropout from the seed and the step, the mean logloss, backward, clipping, the
 * optimizer (the tables' sparsely, as dtrain train's). *loss: the batch's mean loss, *correct: rows
 * whose probability is on the label's side of 0.5. A bad row (dt_clicks_new) is DT_EFORMAT naming
 * it, the model unchanged; a loss that is not finite is DT_EINVAL, the parameters unchanged. */
int dt_model_train_step_clicks(dt_model *m, const dt_clicks *c, float *loss, int *correct, dt_error *err);
/* Evaluation forwards over every row of c in batches of max batch, as `dtrain predict` and the
 * validation and test of `dtrain train` run them (a bad row is DT_EFORMAT naming it): row i's logit
 * to logits[i] and its probability to probs[i] (either NULL: not wanted). */
int dt_model_predict_clicks(dt_model *m, const dt_clicks *c, float *logits, float *probs, dt_error *err);
/* The same pass's figures, as dtrain train reports its test split's: the mean training loss,
 * accuracy at 0.5, AUC and logloss (clipped at 1e-7); any pointer may be NULL. */
int dt_model_evaluate_clicks(dt_model *m, const dt_clicks *c, double *loss, double *accuracy, double *auc,
                             double *logloss, dt_error *err);
int dt_model_save(dt_model *m, const char *logdir, int max_to_keep, dt_error *err);
int dt_model_restore(dt_model *m, const char *logdir, dt_error *err);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif
