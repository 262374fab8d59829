/* Bytes handed from one owner to the next with their release: received payloads (transport/conn.h,
 * dt_msg_take), a ps's replies and the gradients it keeps (ps/shard.h), a worker's zero-copy sends.
 * Whoever holds a dt_bytes with a release calls it exactly once (dt_bytes_release), from any thread. */
#ifndef DT_TRANSPORT_BYTES_H
#define DT_TRANSPORT_BYTES_H

#include <stddef.h>

/* release NULL: borrowed for the call only; a receiver that keeps them copies. */
typedef struct {
    const void *data;
    size_t size;
    void (*release)(void *hint);
    void *hint;
} dt_bytes;

/* Releases b (if it has a release) and empties it. */
void dt_bytes_release(dt_bytes *b);

#endif
