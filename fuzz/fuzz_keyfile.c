/* libFuzzer target: bytes as a CURVE key file (--keys). The parser must refuse or accept without
 * crashing or reading past the input; an accepted key is exactly 40 Z85 characters, which libzmq
 * decodes into 32 bytes. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <zmq.h>

#include "transport/auth.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char key[DT_Z85_KEY_LEN + 1];
    dt_error err = {0};
    if (dt_auth_parse_key(key, (const char *)data, size, "fuzz.key", &err) == 0) {
        uint8_t raw[32];
        if (strlen(key) != DT_Z85_KEY_LEN || !zmq_z85_decode(raw, key)) __builtin_trap();
    } else if (err.msg[0] == '\0' || !strstr(err.msg, "fuzz.key")) {
        __builtin_trap(); /* every refusal names the file */
    }
    return 0;
}
