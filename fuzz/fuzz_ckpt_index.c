/* libFuzzer target: bytes as a `checkpoint` index file (logdir/checkpoint, TensorFlow's text
 * format). The parser must refuse with a message or accept; an accepted index keeps the path rule
 * (every path it hands to a reader or to retention is a checkpoint file name directly in the log
 * folder: no '/', so no ".." and no absolute path), and formats back to text that parses to the same
 * paths with nothing ignored. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "supervisor/ckpt_index.h"

/* The rule, restated without the parser's own check: prefix, digits, suffix, nothing else (so no '/'
 * and no ".."); dt_ckpt_name_step must agree. */
static int inside_logdir(const char *p) {
    size_t lp = strlen(DT_CKPT_PREFIX), ls = strlen(DT_CKPT_SUFFIX), n = p ? strlen(p) : 0;
    if (n <= lp + ls || strncmp(p, DT_CKPT_PREFIX, lp) != 0 || strcmp(p + n - ls, DT_CKPT_SUFFIX) != 0) return 0;
    for (size_t i = lp; i < n - ls; i++)
        if (p[i] < '0' || p[i] > '9') return 0;
    return !strchr(p, '/') && dt_ckpt_name_step(p) >= 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dt_ckpt_index idx, again;
    dt_error err = {0};
    if (dt_ckpt_index_parse(&idx, (const char *)data, size, "checkpoint", &err) != 0) {
        if (err.msg[0] == '\0') __builtin_trap(); /* every refusal says why */
        return 0;
    }
    for (int i = 0; i < idx.n_paths; i++)
        if (!inside_logdir(idx.paths[i])) __builtin_trap();
    /* Empty (everything ignored) or a newest that is the last entry, inside too. */
    if (!idx.model_checkpoint_path != (idx.n_paths == 0)) __builtin_trap();
    if (idx.model_checkpoint_path && (!inside_logdir(idx.model_checkpoint_path) ||
                                      strcmp(idx.model_checkpoint_path, idx.paths[idx.n_paths - 1]) != 0))
        __builtin_trap();
    if (idx.n_ignored > DT_CKPT_MAX_IGNORED + 1) __builtin_trap();
    for (int i = 0; i < idx.n_ignored; i++)
        if (!idx.ignored[i] || strncmp(idx.ignored[i], "checkpoint", 10) != 0) __builtin_trap(); /* names the file */
    char *text = NULL;
    if (dt_ckpt_index_format(&idx, &text, &err) == 0) {
        if (dt_ckpt_index_parse(&again, text, strlen(text), "checkpoint", &err) != 0) __builtin_trap();
        if (again.n_paths != idx.n_paths || again.n_ignored != 0) __builtin_trap();
        for (int i = 0; i < idx.n_paths; i++)
            if (strcmp(again.paths[i], idx.paths[i]) != 0) __builtin_trap();
        dt_ckpt_index_free(&again);
        free(text);
    } else if (idx.n_paths) {
        __builtin_trap(); /* a non-empty accepted index always formats */
    }
    dt_ckpt_index_free(&idx);
    return 0;
}
