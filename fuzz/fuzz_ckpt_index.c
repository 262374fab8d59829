/* libFuzzer target: bytes as a `checkpoint` index file (logdir/checkpoint, TensorFlow's text
 * format). The parser must refuse with a message or accept; an accepted index must format back to
 * text that parses to the same paths. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "supervisor/ckpt_index.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dt_ckpt_index idx, again;
    dt_error err = {0};
    if (dt_ckpt_index_parse(&idx, (const char *)data, size, "checkpoint", &err) != 0) {
        if (err.msg[0] == '\0') __builtin_trap(); /* every refusal says why */
        return 0;
    }
    char *text = NULL;
    if (dt_ckpt_index_format(&idx, &text, &err) == 0) {
        if (dt_ckpt_index_parse(&again, text, strlen(text), "checkpoint", &err) != 0) __builtin_trap();
        if (again.n_paths != idx.n_paths) __builtin_trap();
        for (int i = 0; i < idx.n_paths; i++)
            if (strcmp(again.paths[i], idx.paths[i]) != 0) __builtin_trap();
        dt_ckpt_index_free(&again);
        free(text);
    }
    dt_ckpt_index_free(&idx);
    return 0;
}
