/* libFuzzer target: bytes as a safetensors file. The reader must refuse (saying why) or accept
 * without crashing, leaking or reading past the input; an accepted file must be self-consistent:
 * tensors tile the data section exactly, lookups find every tensor, and reads (whole or in parts)
 * return the bytes of the input and stay in bounds; its
 * checkpoint metadata (info, class names) is parsed within its bounds or refused; checked against a
 * cluster's model with tables of unbounded ids (their held rows: "<table>/ids" U64 [n], the rows and
 * slots [n, dim]), it is refused naming the tensor or, accepted, its ids and rows read within n. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "model/net.h"
#include "supervisor/checkpoint.h"

/* Two per-field tables of unbounded ids, dim 2, Adagrad (one slot): the run a cluster's chief checks
 * a checkpoint against (compact net). Built once. */
static const dt_ckpt_run *unbounded_run(void) {
    static dt_net *net;
    static dt_opt_config opt = {.kind = DT_OPT_SGD, .learning_rate = 0.1f};
    static dt_lazy_config tables;
    static dt_ckpt_run run;
    if (net) return &run;
    static const char text[] = "model f\ninput dense=0 fields=2\n"
                               "embedding name=e dim=2 capacity=8 combiner=sum weight_init=constant(0)\nreduce_sum\n";
    dt_model_spec spec;
    if (dt_model_spec_parse(&spec, text, sizeof text - 1, "fuzz.model", NULL) ||
        dt_net_build_compact(&net, &spec, 1, NULL) || dt_lazy_config_init(&tables, "adagrad", 0.1f, NULL))
        __builtin_trap();
    dt_model_spec_free(&spec);
    run = (dt_ckpt_run){.net = net, .opt = &opt, .tables = &tables};
    return &run;
}

/* A file that fits the run: every table's held rows readable, ids and rows, and nothing past them. */
static void check_unbounded(const dt_st_file *f) {
    const dt_ckpt_run *run = unbounded_run();
    dt_error err = {0};
    if (dt_ckpt_check_fits(f, "fuzz", run, &err) != 0) {
        if (err.msg[0] == '\0') __builtin_trap();
        return;
    }
    for (int t = 0; t < dt_net_num_tables(run->net); t++) {
        uint64_t held, ids[4];
        float rows[4 * 2 * 2];
        if (dt_ckpt_held_rows(f, run, t, &held) != 0) __builtin_trap();
        const size_t n = held < 4 ? (size_t)held : 4;
        if (n && (dt_ckpt_read_ids(f, "fuzz", run, t, held - n, n, ids, &err) != 0 ||
            dt_ckpt_read_rows(f, "fuzz", run, t, held - n, n, rows, &err) != 0))
            __builtin_trap();
        if (dt_ckpt_read_ids(f, "fuzz", run, t, held, 1, ids, &err) == 0) __builtin_trap();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dt_st_file *f = NULL;
    dt_error err = {0};
    if (dt_st_open_memory(&f, data, size, "fuzz", &err) != 0) {
        if (f || err.msg[0] == '\0' || memchr(err.msg, '\0', sizeof err.msg) == NULL) __builtin_trap();
        return 0;
    }
    size_t at = 0;
    uint64_t hn;
    memcpy(&hn, data, 8); /* accepted: at least 8 bytes, and the data section starts after the header */
    const uint8_t *section = data + 8 + hn;
    for (int i = 0; i < dt_st_num_tensors(f); i++) {
        const dt_st_info *t = dt_st_tensor_at(f, i);
        if (t->offset != at || t->nbytes != t->count * dt_st_dtype_size(t->dtype)) __builtin_trap();
        at += t->nbytes;
        if (dt_st_find(f, t->name) != t) __builtin_trap();
        if (t->nbytes <= 4096) {
            uint8_t buf[4096];
            if (dt_st_read(f, t->name, t->dtype, buf, t->count, &err) != 0) __builtin_trap();
            if (t->nbytes && memcmp(buf, section + t->offset, t->nbytes) != 0) __builtin_trap();
            /* Piece by piece: the last byte alone, and a range past the tensor refused. */
            if (t->nbytes && (dt_st_read_part(f, t, t->nbytes - 1, buf, 1, &err) != 0 ||
                              buf[0] != section[t->offset + t->nbytes - 1]))
                __builtin_trap();
            if (dt_st_read_part(f, t, t->nbytes, buf, 1, &err) == 0) __builtin_trap();
        }
    }
    if (at > size) __builtin_trap();
    for (int i = 0; i < dt_st_num_meta(f); i++) {
        const char *k, *v;
        dt_st_meta_at(f, i, &k, &v);
        if (!k || !v || dt_st_meta_get(f, k) != v) __builtin_trap();
    }
    /* The checkpoint metadata dtrain reads back: parsed or refused, never trusted. */
    dt_ckpt_info info;
    dt_ckpt_read_info(f, "fuzz", &info, &err);
    char **names = NULL;
    int n = 0;
    if (dt_ckpt_read_classes(f, "fuzz", 16, &names, &n, &err) == 0) {
        if (n < 0 || n > 16 || (n > 0) != (names != NULL)) __builtin_trap();
        for (int k = 0; k < n; k++) {
            if (!names[k][0] || strlen(names[k]) > DT_CKPT_MAX_CLASS_NAME) __builtin_trap();
            free(names[k]);
        }
        free(names);
    }
    check_unbounded(f);
    dt_st_close(f);
    return 0;
}
