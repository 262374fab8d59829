/* libFuzzer target: click-log lines (src/data/ctr.h). The first byte picks what is fuzzed:
 *   bit 0 clear: the rest, cut at each '\n', is parsed line by line as Criteo and as libffm (1 + the
 *     byte's top 4 bits fields): every line is accepted or refused with a reason, a refused line leaves
 *     the batch as it was, and an accepted batch is self-consistent (offsets non-decreasing and within
 *     the ids, fields in range, labels 0 or 1, dense values and id values finite, dense >= 0);
 *   bit 0 set: the rest is a whole file (plain, or gzip if it starts 1f 8b) read by the streaming
 *     reader with a 4 KiB buffer, in training order or one pass, 1 or 2 shards, split all: it must
 *     deliver consistent batches or stop with an error naming the file, never crash or loop. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "data/ctr.h"

static void check_batch(const dt_ctr_batch *b) {
    if (b->n < 0) __builtin_trap();
    int64_t nnz = b->offsets[(size_t)b->n * b->num_fields];
    for (int i = 0; i < b->n; i++) {
        if (b->labels[i] != 0.0f && b->labels[i] != 1.0f) __builtin_trap();
        for (int j = 0; j < b->num_dense; j++) {
            float d = b->dense[(size_t)i * b->num_dense + j];
            if (!(d >= 0.0f && isfinite(d))) __builtin_trap();
        }
    }
    for (size_t k = 0; k < (size_t)b->n * b->num_fields; k++)
        if (b->offsets[k] > b->offsets[k + 1] || b->offsets[k] < 0) __builtin_trap();
    for (int64_t k = 0; k < nnz; k++)
        if (!isfinite(b->values[k])) __builtin_trap();
    if (b->num_dense == DT_CRITEO_DENSE)
        for (int64_t k = 0; k < nnz; k++)
            if (b->ids[k] > 0xffffffffu || b->values[k] != 1.0f) __builtin_trap();
}

static void lines(const uint8_t *data, size_t size, dt_ctr_format format, int fields) {
    dt_ctr_builder *b = NULL;
    dt_error err = {0};
    if (dt_ctr_builder_create(&b, format, fields, 4, &err)) __builtin_trap();
    const char *p = (const char *)data, *end = p + size;
    for (int64_t line = 1; p <= end; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = (size_t)((nl ? nl : end) - p);
        if (dt_ctr_builder_rows(b) == 4) dt_ctr_builder_clear(b);
        int before = dt_ctr_builder_rows(b);
        char why[256];
        int rc = dt_ctr_builder_add(b, p, len, line, why, sizeof why, &err);
        if (rc == DT_EFORMAT ? (why[0] == '\0' || dt_ctr_builder_rows(b) != before)
                             : (rc != 0 || dt_ctr_builder_rows(b) != before + 1))
            __builtin_trap();
        dt_ctr_batch bt;
        dt_ctr_builder_batch(b, &bt);
        check_batch(&bt);
        if (!nl) break;
        p = nl + 1;
    }
    dt_ctr_builder_free(b);
}

static void file(const uint8_t *data, size_t size, uint8_t mode) {
    int fd = memfd_create("fuzz_ctr", 0);
    if (fd < 0) return;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    dt_ctr_options o;
    dt_ctr_options_init(&o);
    o.split = DT_CTR_ALL;
    o.batch_size = 1 + (mode >> 5 & 3);
    o.training = mode >> 1 & 1;
    o.shard_count = 1 + (mode >> 2 & 1);
    o.shard_index = o.shard_count - 1;
    o.bad_lines = mode >> 3 & 1 ? DT_BAD_IMAGES_FAIL : DT_BAD_IMAGES_SKIP;
    o.fields = 1 + (mode >> 4 & 1) * 7;
    o.buffer_bytes = 4096;
    dt_ctr_reader *r = NULL;
    dt_error err = {0};
    int rc = dt_ctr_open(&r, path, &o, &err);
    dt_ctr_batch b;
    /* Training order loops for ever over a good file: a few epochs' worth of batches is enough. */
    for (int k = 0; !rc && k < 64; k++) {
        if ((rc = dt_ctr_next(r, &b, &err)) || b.n == 0) break;
        if (b.n > o.batch_size) __builtin_trap();
        check_batch(&b);
    }
    if (rc && (err.msg[0] == '\0' || !strstr(err.msg, path))) __builtin_trap();
    dt_ctr_close(r);
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (data[0] & 1) {
        file(data + 1, size - 1, data[0]);
        return 0;
    }
    lines(data + 1, size - 1, DT_CTR_CRITEO, 0);
    lines(data + 1, size - 1, DT_CTR_LIBFFM, 1 + (data[0] >> 4));
    return 0;
}
