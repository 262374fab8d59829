/* dtrain gen-clicks: a synthetic click log (Criteo TSV) drawn from a known true model, and the
 * Bayes-optimal AUC and logloss of each split, the ceiling a trained model is measured against
 * (docs/ctr-data.md, "The generator"). The logic is the library's (data/clickgen.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "core/error.h"
#include "data/clickgen.h"
#include "core/flags.h"

/* --vocab: one count for every field, or 26 comma-separated counts (C1..C26); each an integer
 * 1..2^32, written plainly or as 1e6. */
static int parse_vocab(const char *text, uint64_t *vocab, dt_error *err) {
    uint64_t v[DT_CRITEO_FIELDS];
    int n = 0;
    for (const char *p = text; n <= DT_CRITEO_FIELDS;) {
        char *end;
        double d = strtod(p, &end);
        if (end == p || (*end && *end != ',') || !(d >= 1 && d <= (double)DT_CLICKGEN_MAX_VOCAB) || d != floor(d))
            return dt_errorf(err, DT_EINVAL, "--vocab %s: each count must be an integer from 1 to 2^32 (4294967296)", text);
        if (n == DT_CRITEO_FIELDS) n++; /* one too many */
        else v[n++] = (uint64_t)d;
        if (!*end) break;
        p = end + 1;
    }
    if (n != 1 && n != DT_CRITEO_FIELDS)
        return dt_errorf(err, DT_EINVAL, "--vocab %s: give one count for every field, or 26 (C1..C26)", text);
    for (int f = 0; f < DT_CRITEO_FIELDS; f++) vocab[f] = v[n == 1 ? 0 : f];
    return 0;
}

static void print_report(const char *out, const dt_clickgen_options *o, const char *vocab, const dt_clickgen_report *r) {
    static const char *names[] = {"train", "validation", "test"};
    char kind[32] = "lr";
    if (o->model == DT_CLICKGEN_FM) snprintf(kind, sizeof kind, "fm (dim %d)", o->fm_dim);
    printf("wrote %s: %llu lines; model %s, zipf %g, vocab %s, missing %g, seed %llu\n", out,
           (unsigned long long)o->lines, kind, o->zipf, vocab, o->missing, (unsigned long long)o->seed);
    printf("%-10s %10s %10s %8s %10s %14s\n", "split", "lines", "positives", "ctr", "bayes_auc", "bayes_logloss");
    for (int k = 0; k < 3; k++) {
        const dt_binary_result *s = &r->split[k];
        double ctr = s->examples ? (double)s->positives / (double)s->examples : NAN;
        printf("%-10s %10llu %10llu %8.5f %10.6f %14.6f", names[k], (unsigned long long)s->examples,
               (unsigned long long)s->positives, ctr, s->auc, s->logloss);
        if (!s->exact) printf("  (auc within %.1e: histogram)", s->auc_error_bound);
        printf("\n");
    }
}

static void usage(const flag_def *defs, int n) {
    printf("usage: dtrain gen-clicks --out FILE[.gz] [--lines N] [--vocab V|V1,...,V26] [--zipf S]\n"
           "                         [--model lr|fm] [--seed S] [flags]\n\n"
           "Writes a synthetic click log in Criteo's TSV layout (label, I1-I13, C1-C26; gzip when FILE\n"
           "ends in .gz) drawn from a known true model: Zipf-distributed ids per field, a logistic\n"
           "model with per-id weights (lr) plus factorised pairwise interactions (fm), labels drawn\n"
           "from the true probability; the same seed gives the same file. Prints, per split (the\n"
           "reader's: a hash of the line number), the lines, the click rate and the Bayes-optimal\n"
           "AUC and logloss, computed from the true probabilities: the ceiling for a trained model.\n"
           "See docs/ctr-data.md.\n\nflags:\n");
    flags_print_help(stdout, defs, n);
}

int cmd_gen_clicks(int argc, char **argv) {
    dt_clickgen_options o;
    dt_clickgen_options_init(&o);
    const char *out = NULL, *probs = NULL, *vocab = "1000000", *model = "lr";
    flag_def defs[] = {
        FLAG_TEXT("out", &out, "the file to write (gzip when it ends in .gz)"),
        FLAG_NUM("lines", FLAG_UINT64, &o.lines, "lines to write", 1, 1099511627776.0, 0),
        FLAG_TEXT("vocab", &vocab, "ids per categorical field: one count for all, or 26 comma-separated (1 to 2^32)"),
        FLAG_NUM("zipf", FLAG_DOUBLE, &o.zipf, "exponent of the Zipf law of the ids' frequencies", 0, 100, FLAG_LO_OPEN),
        FLAG_TEXT("model", &model, "the true model: lr (logistic, per-id weights) or fm (plus pairwise factors)"),
        FLAG_NUM("fm_dim", FLAG_INT, &o.fm_dim, "fm: dimension of the true factors", 1, DT_CLICKGEN_MAX_FM_DIM, 0),
        FLAG_NUM("missing", FLAG_DOUBLE, &o.missing, "chance that a column is empty", 0, 1, 0),
        FLAG_NUM("seed", FLAG_UINT64, &o.seed, "seed of the model and of every draw", 0, (double)UINT64_MAX, 0),
        FLAG_NUM("validation_fraction", FLAG_DOUBLE, &o.validation_fraction, "share of lines the reader calls validation", 0, 1, 0),
        FLAG_NUM("test_fraction", FLAG_DOUBLE, &o.test_fraction, "share of lines the reader calls test", 0, 1, 0),
        FLAG_TEXT("probs", &probs, "also write each line's true probability to this file (one a line)"),
    };
    int n = (int)(sizeof defs / sizeof defs[0]), help = 0;
    dt_error err = {0};
    if (flags_parse(defs, n, argc, argv, &help, &err)) {
        fprintf(stderr, "dtrain gen-clicks: %s\n", err.msg);
        return 2;
    }
    if (help) return usage(defs, n), 0;
    int bad = !out || !*out ? dt_errorf(&err, DT_EINVAL, "--out: no file given")
              : strcmp(model, "lr") && strcmp(model, "fm")
                  ? dt_errorf(&err, DT_EINVAL, "--model %s: expected lr or fm", model)
                  : parse_vocab(vocab, o.vocab, &err);
    if (bad) {
        fprintf(stderr, "dtrain gen-clicks: %s\n", err.msg);
        return 2;
    }
    o.model = strcmp(model, "fm") ? DT_CLICKGEN_LR : DT_CLICKGEN_FM;
    cli_install_signal_handlers();
    dt_clickgen_report rep;
    if (dt_clickgen_write(out, probs, &o, &cli_stop, &rep, &err)) {
        fprintf(stderr, "dtrain gen-clicks: %s\n", err.msg);
        return err.code == DT_EINTR ? 130 : err.code == DT_EINVAL ? 2 : 1; /* EINVAL: the options */
    }
    print_report(out, &o, vocab, &rep);
    return 0;
}
