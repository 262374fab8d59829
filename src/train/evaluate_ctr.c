#include "train/evaluate_ctr.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/kernels.h"
#include "core/error.h"
#include "core/text.h"
#include "stats/binary.h"

void dt_ctr_eval_options(dt_ctr_options *o, const dt_net *net, dt_ctr_split split, int fail_on_bad) {
    dt_ctr_options_init(o);
    o->split = split;
    o->training = 0;
    o->batch_size = dt_net_max_batch(net);
    o->fields = dt_net_spec(net)->num_fields;
    o->bad_lines = fail_on_bad ? DT_BAD_IMAGES_FAIL : DT_BAD_IMAGES_SKIP;
}

/* Where a pass writes each line's figures besides e: CSV rows to out (each ending in the CSV field
 * file), and the logit and probability of line L at logits[L - 1], probs[L - 1] (below cap). */
typedef struct {
    FILE *out;
    const char *file;
    float *logits, *probs;
    int64_t cap;
} sinks;

/* One pass; each batch's probabilities to e and to the sinks. */
static int pass(dt_net *net, dt_ctr_reader *rd, dt_binary_eval *e, const sinks *to, dt_ctr_eval_result *res,
                dt_error *err) {
    float *p = dt_alloc_floats((size_t)dt_net_max_batch(net), "probabilities", err);
    if (!p) return DT_ENOMEM;
    double loss = 0;
    int rc;
    for (;;) {
        dt_ctr_batch b;
        if ((rc = dt_ctr_next(rd, &b, err)) || b.n == 0) break;
        const float *logits = dt_net_forward_ctr(net, &b, 0, 0, err);
        if (!logits) {
            rc = DT_EINVAL; /* err says why */
            break;
        }
        int correct = 0;
        loss += (double)dt_net_loss_binary(net, b.labels, &correct) * b.n;
        dt_sigmoid_probs(p, logits, b.n);
        if ((rc = dt_binary_eval_add(e, p, b.labels, (size_t)b.n, err))) break;
        res->accuracy += correct;
        res->examples += b.n;
        for (int i = 0; to->out && i < b.n; i++)
            fprintf(to->out, "%lld,%d,%.9g,%s\n", (long long)b.lines[i], b.labels[i] > 0.5f, (double)p[i], to->file);
        for (int i = 0; (to->logits || to->probs) && i < b.n; i++) {
            if (b.lines[i] < 1 || b.lines[i] > to->cap) {
                rc = dt_errorf(err, DT_EINVAL, "line %lld: past the %lld rows asked for", (long long)b.lines[i],
                               (long long)to->cap);
                break;
            }
            if (to->logits) to->logits[b.lines[i] - 1] = logits[i];
            if (to->probs) to->probs[b.lines[i] - 1] = p[i];
        }
        if (rc) break;
    }
    free(p);
    if (!rc && res->examples) res->loss = loss / (double)res->examples, res->accuracy /= (double)res->examples;
    return rc;
}

static int run(dt_net *net, const char *path, const dt_ctr_options *o, const sinks *to, dt_ctr_eval_result *res,
               dt_error *err) {
    memset(res, 0, sizeof *res);
    res->auc = res->logloss = NAN;
    dt_ctr_reader *rd = NULL;
    dt_binary_eval *e = NULL;
    int rc = dt_ctr_open(&rd, path, o, err);
    if (!rc) rc = dt_binary_eval_create(&e, 0, err);
    if (!rc) rc = pass(net, rd, e, to, res, err);
    dt_binary_result br;
    if (!rc && res->examples && !(rc = dt_binary_eval_result(e, &br, err))) {
        res->auc = br.auc, res->auc_error_bound = br.auc_error_bound;
        res->logloss = br.logloss, res->mean_p = br.mean_p;
        res->positives = (int64_t)br.positives;
    }
    if (rd) res->bad_lines = dt_ctr_bad_count(rd);
    dt_binary_eval_free(e);
    dt_ctr_close(rd);
    return rc;
}

int dt_evaluate_ctr(dt_net *net, const char *path, const dt_ctr_options *o, dt_ctr_eval_result *out, dt_error *err) {
    return run(net, path, o, &(sinks){0}, out, err);
}

int dt_evaluate_ctr_into(dt_net *net, const char *path, const dt_ctr_options *o, float *logits, float *probs,
                         int64_t lines, dt_ctr_eval_result *out, dt_error *err) {
    return run(net, path, o, &(sinks){.logits = logits, .probs = probs, .cap = lines}, out, err);
}

int dt_predict_ctr(dt_net *net, const char *path, const dt_ctr_options *o, FILE *out, int64_t *count,
                   dt_ctr_eval_result *res, dt_error *err) {
    *count = 0;
    char *file = dt_csv_field(path);
    if (!file) return dt_errorf(err, DT_ENOMEM, "out of memory for the file column");
    int rc = run(net, path, o, &(sinks){.out = out, .file = file}, res, err);
    free(file);
    *count = res->examples;
    return rc;
}
