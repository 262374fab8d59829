/* libFuzzer target: bytes as a TensorBoard event file. The record reader must step through valid
 * records, stop with a reason at the first bad one, and never read past the input; each record's
 * data is decoded as an Event, which may be refused but must not crash or leak; so is the whole
 * input. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "io/events.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t pos = 0, len;
    const uint8_t *rec;
    dt_error err = {0};
    int rc;
    while ((rc = dt_record_next(data, size, &pos, &rec, &len, "fuzz", &err)) == 1) {
        if (pos > size || rec < data || rec + len > data + size || len > DT_RECORD_MAX_DATA) __builtin_trap();
        dt_event ev;
        if (dt_event_decode(&ev, rec, len, &err) == 0) {
            if (ev.kind == DT_EVENT_KIND_FILE_VERSION && !ev.file_version) __builtin_trap();
            for (int i = 0; i < ev.n_values; i++)
                if (!ev.values[i].tag) __builtin_trap();
            dt_event_free(&ev);
        } else if (err.msg[0] == '\0') {
            __builtin_trap();
        }
    }
    if (rc < 0 && (err.msg[0] == '\0' || memchr(err.msg, '\0', sizeof err.msg) == NULL)) __builtin_trap();
    if (rc == 0 && pos != size) __builtin_trap();
    /* The record-by-record reader (what dtrain plot and inspect use on files) must agree with the
     * in-memory one, record for record, and stop where it stops. */
    dt_record_reader *r = NULL;
    if (dt_record_reader_open_memory(&r, data, size, "fuzz", &err) == 0) {
        size_t p2 = 0, l2;
        const uint8_t *d2;
        int rc2, rc1;
        uint64_t at;
        do {
            size_t before = p2;
            rc1 = dt_record_next(data, size, &p2, &rec, &len, "fuzz", &err);
            rc2 = dt_record_reader_next(r, &d2, &l2, &at, &err);
            if ((rc1 > 0) != (rc2 > 0) || (rc1 < 0) != (rc2 < 0)) __builtin_trap();
            if (rc1 > 0 && (at != before || l2 != len || memcmp(d2, rec, len) != 0)) __builtin_trap();
        } while (rc1 > 0);
        dt_record_reader_close(r);
    }
    /* The decoder directly too: random bytes rarely carry valid CRCs, so framing alone would
     * shield it from the fuzzer. */
    dt_event ev;
    if (dt_event_decode(&ev, data, size, &err) == 0) dt_event_free(&ev);
    return 0;
}
