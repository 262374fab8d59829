/* Synthetic click logs with a known answer (docs/ctr-data.md, "The generator"): Criteo TSV lines
 * drawn from a true model, so that a trained model's AUC and logloss have a ceiling to be measured
 * against. Each line is a pure function of (options, seed, line number): reproducible, and the same
 * whatever else the file holds.
 *
 * Line L: each of the 26 categorical fields holds, unless missing, the id of a popularity rank k
 * drawn from Zipf(s) over 1..vocab[f] (rejection-inversion sampling: O(1) memory and time per draw
 * for any vocabulary), written as the 8 hex digits of a seeded bijection of k, so ids of one field
 * never collide; each of the 13 integers is floor(exp(g) - 1) for g = |N(0, 1)| * (1 + (j mod 4) / 2),
 * and I2 is -1, -2 or -3 with probability 0.05 (as Criteo's I2 can be). Then
 *   logit = bias + sum_j u_j t(x_j) + sum_f w_f(k_f)                     (lr)
 *         + sum_{f < g} <v_f(k_f), v_g(k_g)>                             (fm, dimension fm_dim)
 * over the present columns, t the reader's transform (dt_ctr_dense_value: what a learner sees),
 *   w_f(k) = weight_scale * k^-rank_decay * z,  v_f(k)_c = factor_scale * k^-rank_decay * z_c,
 *   u_j = dense_scale * z,
 * each z an N(0, 1) value derived from a seeded hash of (field, rank, component): no table of the
 * vocabulary is ever stored. p = sigmoid(logit) (rounded to float32), and the label is 1 with
 * probability p. */
#ifndef DT_DATA_CLICKGEN_H
#define DT_DATA_CLICKGEN_H

#include <stdint.h>

#include "core/rng.h"
#include "data/ctr.h"
#include "dtrain.h"
#include "stats/binary.h"

#define DT_CLICKGEN_MAX_VOCAB ((uint64_t)1 << 32) /* ids are 32-bit */
#define DT_CLICKGEN_MAX_FM_DIM 64

typedef enum { DT_CLICKGEN_LR = 0, DT_CLICKGEN_FM = 1 } dt_clickgen_model;

typedef struct {
    uint64_t lines;
    uint64_t vocab[DT_CRITEO_FIELDS]; /* ids per field, 1 .. 2^32 */
    double zipf;                      /* the exponent s > 0 (1.1) */
    dt_clickgen_model model;
    int fm_dim;                       /* fm: factor dimension (8) */
    double missing;                   /* chance that a column is empty (0.05) */
    uint64_t seed;
    double validation_fraction, test_fraction; /* the reader's split (ctr.h), for the figures */
    /* The true model's scales (defaults: about a quarter of lines clicked, AUC about 0.8). */
    double bias, weight_scale, factor_scale, dense_scale, rank_decay;
} dt_clickgen_options;

/* Defaults: 1,000,000 lines, vocabulary 10^6 per field, Zipf 1.1, lr, fm_dim 8, missing 0.05,
 * seed 1, splits 0.1/0.1, and the scales given in docs/ctr-data.md. */
void dt_clickgen_options_init(dt_clickgen_options *o);

/* The Bayes-optimal figures of each split (dt_ctr_split order: train, validation, test): the AUC
 * and logloss of the true probabilities against the drawn labels. */
typedef struct {
    dt_binary_result split[3];
} dt_clickgen_report;

/* Writes the lines to path atomically (a temporary file renamed at the end; gzip when path ends in
 * ".gz"), and when probs_path is not NULL each line's true probability (%.9g, one a line, the same
 * line numbers; gzip likewise by name). stop (may be NULL): set it to end early with DT_EINTR,
 * leaving no file behind. */
int dt_clickgen_write(const char *path, const char *probs_path, const dt_clickgen_options *o,
                      const volatile int *stop, dt_clickgen_report *rep, dt_error *err);

/* Zipf's law over 1..n with exponent s: P(k) = k^-s / sum_{i=1..n} i^-s, by Hörmann and
 * Derflinger's rejection-inversion (1996), as Apache Commons RNG's sampler: a few log/exp per draw,
 * nothing stored. */
typedef struct {
    double s, n, h_x1, h_n, sval;
} dt_zipf;
int dt_zipf_init(dt_zipf *z, uint64_t n, double s, dt_error *err);
uint64_t dt_zipf_sample(const dt_zipf *z, dt_rng *r);

#endif
