/* ROC AUC and logloss of binary predictions (binary.h says what and how exactly). */
#include "stats/binary.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* Histogram bins: a probability's float32 bits shifted right by 11 keep its 8 exponent bits and the
 * top 12 of its mantissa, so bins are 2^-12 of their value wide and in the order of the values
 * (non-negative floats order like their bits). Keys at or below 2^-40's share bin 0; 1.0 is the
 * last bin. */
#define HIST_SHIFT 11
#define HIST_LO ((uint32_t)(127 - 40) << (23 - HIST_SHIFT))
#define HIST_BINS ((size_t)((uint32_t)127 << (23 - HIST_SHIFT)) - HIST_LO + 1)

struct dt_binary_eval {
    size_t cap;
    float *pos, *neg;          /* kept probabilities by label (exact mode) */
    size_t npos, nneg, pos_room, neg_room;
    uint64_t *hist;            /* [2 * HIST_BINS]: positives' counts, then negatives'; NULL while exact */
    uint64_t total_pos, total_neg;
    double loss_sum, p_sum;
};

static uint32_t float_bits(float p) {
    uint32_t u;
    memcpy(&u, &p, sizeof u);
    return u;
}

static size_t hist_bin(float p) {
    if (!(p > 0.0f)) return 0; /* 0 and -0 */
    uint32_t key = float_bits(p) >> HIST_SHIFT;
    return key <= HIST_LO ? 0 : (size_t)(key - HIST_LO);
}

int dt_binary_eval_create(dt_binary_eval **out, size_t exact_cap, dt_error *err) {
    *out = NULL;
    if (exact_cap > DT_AUC_MAX_CAP)
        return dt_errorf(err, DT_EINVAL, "AUC: exact_cap %zu is over the limit of %zu examples", exact_cap,
                         DT_AUC_MAX_CAP);
    dt_binary_eval *e = dt_calloc(1, sizeof *e, "AUC accumulator", err);
    if (!e) return DT_ENOMEM;
    e->cap = exact_cap ? exact_cap : DT_AUC_DEFAULT_CAP;
    *out = e;
    return 0;
}

void dt_binary_eval_reset(dt_binary_eval *e) {
    e->npos = e->nneg = 0;
    e->total_pos = e->total_neg = 0;
    e->loss_sum = e->p_sum = 0;
    /* Exact mode again: a new pass under the cap is exact again. */
    free(e->hist);
    e->hist = NULL;
}

void dt_binary_eval_free(dt_binary_eval *e) {
    if (!e) return;
    free(e->pos);
    free(e->neg);
    free(e->hist);
    free(e);
}

static int check_rows(const float *prob, const float *label, size_t n, dt_error *err) {
    for (size_t i = 0; i < n; i++) {
        if (!(prob[i] >= 0.0f && prob[i] <= 1.0f))
            return dt_errorf(err, DT_EINVAL, "AUC: row %zu: probability %g is not in [0, 1]", i, (double)prob[i]);
        if (label[i] != 0.0f && label[i] != 1.0f)
            return dt_errorf(err, DT_EINVAL, "AUC: row %zu: label %g is not 0 or 1", i, (double)label[i]);
    }
    return 0;
}

/* Grows *v (room *room) to hold need floats, doubling, never past cap. */
static int reserve(float **v, size_t *room, size_t need, size_t cap, dt_error *err) {
    if (need <= *room) return 0;
    size_t r = *room ? *room : 4096;
    while (r < need) r *= 2;
    if (r > cap) r = cap;
    float *p = realloc(*v, r * sizeof *p);
    if (!p) return dt_errorf(err, DT_ENOMEM, "AUC: out of memory keeping %zu probabilities", r);
    *v = p, *room = r;
    return 0;
}

/* Leaves exact mode: the kept probabilities go into a new histogram, and their lists are freed. */
static int to_histogram(dt_binary_eval *e, dt_error *err) {
    e->hist = dt_calloc(2 * HIST_BINS, sizeof *e->hist, "AUC histogram", err);
    if (!e->hist) return DT_ENOMEM;
    for (size_t i = 0; i < e->npos; i++) e->hist[hist_bin(e->pos[i])]++;
    for (size_t i = 0; i < e->nneg; i++) e->hist[HIST_BINS + hist_bin(e->neg[i])]++;
    free(e->pos);
    free(e->neg);
    e->pos = e->neg = NULL;
    e->npos = e->nneg = e->pos_room = e->neg_room = 0;
    return 0;
}

static int keep(dt_binary_eval *e, const float *prob, const float *label, size_t n, dt_error *err) {
    size_t np = 0;
    for (size_t i = 0; i < n; i++) np += label[i] != 0.0f;
    if (e->npos + e->nneg + n > e->cap) return to_histogram(e, err);
    int rc = reserve(&e->pos, &e->pos_room, e->npos + np, e->cap, err);
    if (!rc) rc = reserve(&e->neg, &e->neg_room, e->nneg + (n - np), e->cap, err);
    if (rc) return rc;
    for (size_t i = 0; i < n; i++) {
        float p = prob[i] > 0.0f ? prob[i] : 0.0f; /* -0 as +0: the sort orders bits */
        if (label[i] != 0.0f) e->pos[e->npos++] = p;
        else e->neg[e->nneg++] = p;
    }
    return 0;
}

int dt_binary_eval_add(dt_binary_eval *e, const float *prob, const float *label, size_t n, dt_error *err) {
    int rc = check_rows(prob, label, n, err);
    if (rc) return rc;
    if (!e->hist && (rc = keep(e, prob, label, n, err))) return rc;
    double loss = 0, psum = 0;
    uint64_t np = 0;
    for (size_t i = 0; i < n; i++) {
        double p = prob[i], pc = p < DT_LOGLOSS_EPS ? DT_LOGLOSS_EPS : p > 1 - DT_LOGLOSS_EPS ? 1 - DT_LOGLOSS_EPS : p;
        int y = label[i] != 0.0f;
        loss -= y ? log(pc) : log1p(-pc);
        psum += p;
        np += (uint64_t)y;
        /* keep() switched to the histogram for this call when the cap was reached. */
        if (e->hist) e->hist[(y ? 0 : HIST_BINS) + hist_bin(prob[i])]++;
    }
    e->loss_sum += loss, e->p_sum += psum;
    e->total_pos += np, e->total_neg += n - np;
    return 0;
}

/* LSD radix sort of non-negative floats by their bits (3 passes of 11 bits); tmp holds n. */
static void radix_sort(float *v, float *tmp, size_t n) {
    float *src = v, *dst = tmp;
    for (int shift = 0; shift < 33; shift += 11) {
        size_t count[2048] = {0};
        for (size_t i = 0; i < n; i++) count[(float_bits(src[i]) >> shift) & 2047]++;
        size_t sum = 0;
        for (int b = 0; b < 2048; b++) {
            size_t c = count[b];
            count[b] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++) dst[count[(float_bits(src[i]) >> shift) & 2047]++] = src[i];
        float *t = src;
        src = dst, dst = t;
    }
    if (src != v) memcpy(v, src, n * sizeof *v); /* an odd number of passes ends in tmp */
}

/* Twice the Mann-Whitney U of the sorted lists: 2 per pair ranking the positive higher, 1 per tie. */
static uint64_t twice_u(const float *pos, size_t np, const float *neg, size_t nn) {
    uint64_t u2 = 0;
    size_t lo = 0; /* positives below the current negative */
    for (size_t i = 0; i < nn;) {
        float s = neg[i];
        size_t j = i;
        while (j < nn && neg[j] == s) j++;
        while (lo < np && pos[lo] < s) lo++;
        size_t hi = lo;
        while (hi < np && pos[hi] == s) hi++;
        u2 += (uint64_t)(j - i) * (2 * (uint64_t)(np - hi) + (uint64_t)(hi - lo));
        i = j;
    }
    return u2;
}

static int exact_auc(dt_binary_eval *e, double *auc, dt_error *err) {
    size_t big = e->npos > e->nneg ? e->npos : e->nneg;
    float *tmp = dt_malloc((big ? big : 1) * sizeof *tmp, "AUC sort buffer", err);
    if (!tmp) return DT_ENOMEM;
    radix_sort(e->pos, tmp, e->npos);
    radix_sort(e->neg, tmp, e->nneg);
    free(tmp);
    *auc = (double)twice_u(e->pos, e->npos, e->neg, e->nneg) / (2.0 * (double)e->npos * (double)e->nneg);
    return 0;
}

static void histogram_auc(const dt_binary_eval *e, double *auc, double *bound) {
    const uint64_t *pos = e->hist, *neg = e->hist + HIST_BINS;
    double above = 0, wins = 0, ties = 0; /* counts can pass 2^64 as products: float64 */
    for (size_t b = HIST_BINS; b-- > 0;) {
        wins += (double)neg[b] * above;
        ties += (double)neg[b] * (double)pos[b];
        above += (double)pos[b];
    }
    double pairs = (double)e->total_pos * (double)e->total_neg;
    *auc = (wins + 0.5 * ties) / pairs;
    *bound = 0.5 * ties / pairs;
}

int dt_binary_eval_result(dt_binary_eval *e, dt_binary_result *r, dt_error *err) {
    memset(r, 0, sizeof *r);
    r->examples = e->total_pos + e->total_neg;
    r->positives = e->total_pos;
    r->exact = e->hist == NULL;
    r->logloss = r->examples ? e->loss_sum / (double)r->examples : NAN;
    r->mean_p = r->examples ? e->p_sum / (double)r->examples : NAN;
    r->auc = NAN;
    if (!e->total_pos || !e->total_neg) return 0;
    if (e->hist) {
        histogram_auc(e, &r->auc, &r->auc_error_bound);
        return 0;
    }
    return exact_auc(e, &r->auc, err);
}
