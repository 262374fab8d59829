#include "transport/bytes.h"

void dt_bytes_release(dt_bytes *b) {
    if (b && b->release) b->release(b->hint);
    if (b) *b = (dt_bytes){0};
}
