/* Click-log reading speed (src/data/ctr.h): one pass over FILE (Criteo TSV or libffm, plain or gzip)
 * by a reader of shard 0 of SHARDS, every line of the file in its split (split all), batches of
 * 4096, parsed into batches exactly as training would get them. A first untimed pass brings the file
 * into the page cache; then ROUNDS timed passes. Prints one JSON line: lines and bytes of the pass,
 * the median wall and CPU seconds, and lines per second of CPU (per core: the reader is one thread).
 * usage: bench_ctr FILE [SHARDS] [ROUNDS]     (make the file with dtrain gen-clicks) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

#include "data/ctr.h"

static double now(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One pass; *rows: examples delivered. Returns 0 or the error's code. */
static int pass(const char *path, int shards, int64_t *rows, uint64_t *bad) {
    dt_ctr_options o;
    dt_ctr_options_init(&o);
    o.split = DT_CTR_ALL, o.training = 0, o.batch_size = 4096, o.shard_count = shards;
    dt_ctr_reader *r = NULL;
    dt_error err = {0};
    int rc = dt_ctr_open(&r, path, &o, &err);
    dt_ctr_batch b;
    *rows = 0;
    while (!rc && (rc = dt_ctr_next(r, &b, &err)) == 0 && b.n > 0) *rows += b.n;
    if (rc) fprintf(stderr, "bench_ctr: %s\n", err.msg);
    *bad = r ? dt_ctr_bad_count(r) : 0;
    dt_ctr_close(r);
    return rc;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: bench_ctr FILE [SHARDS] [ROUNDS]\n");
        return 2;
    }
    const char *path = argv[1];
    int shards = argc > 2 ? atoi(argv[2]) : 1, rounds = argc > 3 ? atoi(argv[3]) : 3;
    if (shards < 1 || rounds < 1 || rounds > 99) return 2;
    struct stat st;
    if (stat(path, &st)) {
        perror(path);
        return 1;
    }
    int64_t rows = 0;
    uint64_t bad = 0;
    if (pass(path, shards, &rows, &bad)) return 1; /* the page cache */
    double wall[99], cpu[99];
    for (int k = 0; k < rounds; k++) {
        double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
        if (pass(path, shards, &rows, &bad)) return 1;
        wall[k] = now(CLOCK_MONOTONIC) - w0, cpu[k] = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
    }
    qsort(wall, (size_t)rounds, sizeof *wall, cmp);
    qsort(cpu, (size_t)rounds, sizeof *cpu, cmp);
    double w = wall[rounds / 2], c = cpu[rounds / 2];
    printf("{\"bench\": \"ctr_read\", \"file\": \"%s\", \"file_bytes\": %lld, \"shards\": %d, \"rows\": %lld, "
           "\"bad\": %llu, \"wall_s\": %.3f, \"cpu_s\": %.3f, \"rows_per_cpu_s\": %.0f, \"file_mb_per_cpu_s\": %.1f}\n",
           path, (long long)st.st_size, shards, (long long)rows, (unsigned long long)bad, w, c, (double)rows / c,
           (double)st.st_size / c / 1e6);
    return 0;
}
