/* libFuzzer target: bytes as a safetensors file. The reader must refuse (saying why) or accept
 * without crashing, leaking or reading past the input; an accepted file must be self-consistent:
 * tensors tile the data section exactly, lookups find every tensor, and reads (whole or in parts)
 * return the bytes of the input and stay in bounds; its
 * checkpoint metadata (info, class names) is parsed within its bounds or refused. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "supervisor/checkpoint.h"

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
    dt_st_close(f);
    return 0;
}
