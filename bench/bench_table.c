/* One ps's share of a sync step of the FM model (models/fm.model) on its embedding tables
 * (src/ps/table.h), no sockets: for each of 26 fields, a weights table (2^20 buckets, dim 1) and a
 * factors table (2^18 buckets, dim 8), Adagrad, hold the ids one step names here (Zipf 1.1 draws,
 * unique); each step reads their rows (what SPARSE_PULL's reply costs the ps) and applies a gradient
 * to them (what a step's SPARSE_PUSHes cost once summed). The first steps create rows; later ones
 * mostly find them, as a long run does. Prints one JSON line: nanoseconds per row read and applied,
 * over the steps after WARM.
 * usage: bench_table [STEPS [IDS_PER_FIELD [WARM [BUCKETS_FLAG [MIN_COUNT]]]]] (defaults 300, 150,
 * 100, 1, 0): BUCKETS_FLAG 1 declares the tables as tables of buckets (ids below the capacity), as
 * the ps does for models with buckets=; 0 as unbounded ids (capacity=), MIN_COUNT their admission
 * (min_count=: 2 counts every new id in the admission sketch). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/rng.h"
#include "ps/table.h"

#define FIELDS 26

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A Zipf(s) rank in [0, n) by inverting the continuous approximation of its CDF, scattered over the
 * buckets by a hash (as dt_ctr_key spreads raw ids). */
static uint64_t zipf_id(dt_rng *r, uint64_t n, double s, uint64_t field) {
    double u = dt_rng_uniform(r), a = 1.0 - s, hmax = (pow((double)n, a) - 1.0) / a;
    uint64_t k = (uint64_t)pow(u * hmax * a + 1.0, 1.0 / a);
    return dt_hash64(field, k) % n;
}

static int unique_ids(dt_rng *r, uint64_t n, uint64_t field, int want, uint64_t *ids) {
    int got = 0;
    for (int tries = 0; got < want && tries < 20 * want; tries++) {
        uint64_t id = zipf_id(r, n, 1.1, field);
        int dup = 0;
        for (int j = 0; j < got && !dup; j++) dup = ids[j] == id;
        if (!dup) ids[got++] = id;
    }
    return got;
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 300, per = argc > 2 ? atoi(argv[2]) : 150;
    int warm = argc > 3 ? atoi(argv[3]) : 100, flag = argc > 4 ? atoi(argv[4]) : 1;
    int min_count = argc > 5 ? atoi(argv[5]) : 0;
    if (steps < 1 || per < 1 || per > 100000 || warm < 0 || warm >= steps || min_count < 0 || min_count > 255)
        return fprintf(stderr, "usage: bench_table [STEPS [IDS_PER_FIELD [WARM [BUCKETS_FLAG [MIN_COUNT]]]]]\n"), 2;
    dt_table *t[2 * FIELDS];
    for (int k = 0; k < 2 * FIELDS; k++) {
        int factors = k >= FIELDS;
        dt_wire_table w = {.table = (uint32_t)k, .dim = factors ? 8 : 1, .capacity = factors ? 1u << 18 : 1u << 20,
                           .init_kind = factors ? DT_ROW_INIT_NORMAL : DT_ROW_INIT_ZEROS, .init_scale = 0.01f,
                           .seed = 1, .flags = flag ? DT_WIRE_TABLE_F_BUCKETS : 0, .min_count = (uint32_t)min_count};
        dt_error e;
        if (dt_lazy_config_init(&w.opt, "adagrad", 0.05f, &e)) return fprintf(stderr, "%s\n", e.msg), 1;
        dt_table_config c;
        dt_table_config_from_wire(&c, &w);
        dt_error err;
        if (dt_table_new(&t[k], &c, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    }
    uint64_t *ids = malloc((size_t)per * sizeof *ids);
    float *rows = malloc((size_t)per * 8 * sizeof *rows);
    dt_rng r;
    dt_rng_seed(&r, 7);
    double read_s = 0, apply_s = 0;
    uint64_t n_rows = 0;
    for (int s = 0; s < steps; s++) {
        for (int k = 0; k < 2 * FIELDS; k++) {
            const dt_table_config *c = dt_table_config_of(t[k]);
            int n = unique_ids(&r, c->capacity, (uint64_t)(k % FIELDS), per, ids);
            double t0 = now_s();
            dt_table_read_n(t[k], ids, (size_t)n, rows);
            double t1 = now_s();
            for (int i = 0; i < n * c->dim; i++) rows[i] = 1e-3f * (float)((i % 7) - 3);
            double t2 = now_s();
            dt_table_apply(t[k], ids, rows, (size_t)n);
            double t3 = now_s();
            if (s >= warm) read_s += t1 - t0, apply_s += t3 - t2, n_rows += (uint64_t)n;
        }
    }
    printf("{\"steps\": %d, \"rows_per_step\": %.0f, \"read_ns_per_row\": %.1f, \"apply_ns_per_row\": %.1f}\n",
           steps - warm, (double)n_rows / (steps - warm), 1e9 * read_s / (double)n_rows,
           1e9 * apply_s / (double)n_rows);
    uint64_t rows_held = 0, admitted = 0;
    for (int k = 0; k < 2 * FIELDS; k++) {
        dt_table_stats st;
        dt_table_get_stats(t[k], &st);
        rows_held += st.rows, admitted += st.admitted;
    }
    printf("{\"rows_held\": %llu, \"rows_created_per_step\": %.0f}\n", (unsigned long long)rows_held,
           (double)admitted / steps);
    for (int k = 0; k < 2 * FIELDS; k++) dt_table_free(t[k]);
    free(ids), free(rows);
    return 0;
}
