/* The work coordinator's cost (src/ps/coord.h, docs/elastic.md): W sync workers train epochs of a
 * plan, each asking for units, claiming every batch and having it committed when its step is
 * applied, as ps 0 drives the state machine; no sockets. Prints one JSON line: coordinator calls
 * per second and nanoseconds per batch counted (a claim, its share of the step's settling and of
 * the unit's grant), to set against what ps 0 spends on the same batch's gradient.
 * usage: bench_coord [WORKERS [UNIT_BATCHES [SECONDS]]] (defaults 8, 4, 2) */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ps/coord.h"
#include "transport/wire.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    uint32_t unit;
    uint64_t todo, epoch;
} held;

int main(int argc, char **argv) {
    int W = argc > 1 ? atoi(argv[1]) : 8, U = argc > 2 ? atoi(argv[2]) : 4;
    double secs = argc > 3 ? atof(argv[3]) : 2.0;
    if (W < 1 || W > 1024 || U < 1 || U > 64) return fprintf(stderr, "usage: bench_coord [WORKERS [UNIT_BATCHES [SECONDS]]]\n"), 2;
    dt_coord_plan p = {.examples = 60000, .seed = 1, .batch_size = 64, .unit_batches = (uint32_t)U,
                       .max_workers = (uint32_t)W, .max_held = 2, .liveness_ms = 30000, .sync = 1};
    dt_coord *c = NULL;
    dt_error err;
    if (dt_coord_new(&c, &p, NULL, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    held *h = calloc((size_t)W, sizeof *h);
    uint16_t *in = calloc((size_t)W, sizeof *in);
    char why[256];
    uint64_t calls = 0, step = 0;
    double t0 = now_s(), t = t0;
    while (t - t0 < secs) {
        for (int k = 0; k < 1000; k++, step++) {
            int n = 0;
            for (int w = 0; w < W; w++) {
                if (!h[w].todo) {
                    dt_coord_grant g;
                    calls++;
                    if (dt_coord_ask(c, w, 0, 0, (int64_t)step, &g, why, sizeof why) != DT_WIRE_OK) continue;
                    h[w] = (held){.unit = g.unit, .todo = g.mask, .epoch = g.epoch};
                }
                uint64_t b = (uint64_t)h[w].unit * (uint64_t)U + (uint64_t)__builtin_ctzll(h[w].todo);
                calls++;
                if (dt_coord_claim(c, w, 0, h[w].epoch, b, (int64_t)step, (int64_t)step, why, sizeof why) != DT_WIRE_OK)
                    return fprintf(stderr, "claim refused: %s\n", why), 1;
                h[w].todo &= h[w].todo - 1;
                in[n++] = (uint16_t)w;
            }
            dt_coord_applied(c, (int64_t)step, in, n);
            calls++;
        }
        t = now_s();
    }
    dt_coord_stats st;
    dt_coord_get_stats(c, &st);
    printf("{\"workers\": %d, \"unit_batches\": %d, \"seconds\": %.2f, \"calls_per_s\": %.0f, \"batches\": %llu, "
           "\"ns_per_batch\": %.1f, \"epochs\": %llu}\n", W, U, t - t0, (double)calls / (t - t0),
           (unsigned long long)st.committed, 1e9 * (t - t0) / (double)st.committed, (unsigned long long)st.epochs_done);
    dt_coord_free(c);
    free(h), free(in);
    return 0;
}
