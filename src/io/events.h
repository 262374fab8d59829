/* TensorBoard event files (docs/summaries.md). A file is a sequence of records:
 *   uint64 length (LE) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
 * and each record's data is an Event protobuf (proto/event.proto, TensorFlow's field numbers). The
 * first record carries file_version "brain.Event:2"; the rest carry Summary scalars. */
#ifndef DT_IO_EVENTS_H
#define DT_IO_EVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain.h"

#define DT_EVENT_FILE_VERSION "brain.Event:2"
#define DT_EVENT_MAX_TAG 1024                 /* bytes in a summary tag */
#define DT_RECORD_MAX_DATA ((size_t)64 << 20)  /* the reader refuses larger records */
#define DT_RECORD_OVERHEAD 16                 /* framing bytes around each record's data */

/* Seconds since the epoch, with sub-second precision, as TensorFlow stores wall_time. */
double dt_wall_time(void);

/* ---- Writing -------------------------------------------------------------------------------- */

typedef struct dt_event_writer dt_event_writer;

/* Creates dir (with parents) and "dir/events.out.tfevents.<10-digit seconds of wall_time>.<hostname>"
 * (".1", ".2", ... appended if that name exists), and writes and flushes the file_version record
 * stamped wall_time. Pass dt_wall_time() unless a test needs fixed bytes. */
int dt_event_writer_open(dt_event_writer **out, const char *dir, double wall_time, dt_error *err);
const char *dt_event_writer_path(const dt_event_writer *w);

/* Appends one Event {wall_time, step, summary {value {tag, simple_value}}} (buffered). */
int dt_event_add_scalar(dt_event_writer *w, const char *tag, int64_t step, float value, double wall_time,
                        dt_error *err);
/* Pushes buffered records to the file (TensorBoard sees them after this). */
int dt_event_writer_flush(dt_event_writer *w, dt_error *err);
/* Flushes, closes and frees (w may be NULL). Returns the first write error, if any. */
int dt_event_writer_close(dt_event_writer *w, dt_error *err);

/* ---- Reading -------------------------------------------------------------------------------- */

/* Steps through the records of buf[0..n). *pos is the offset of the next record (0 to start).
 * Returns 1 and sets *data and *len to the next record's data, 0 at a clean end, or DT_EFORMAT naming
 * label and the record's offset when a length is out of bounds, a record is truncated, or
 * either CRC does not match. */
int dt_record_next(const uint8_t *buf, size_t n, size_t *pos, const uint8_t **data, size_t *len,
                   const char *label, dt_error *err);

/* The same, record by record from a file that is never held whole: each record's framing and CRCs
 * are checked as it is read (a record over 1 MiB is CRC-checked through a fixed buffer before it is
 * held), and only the current record's data is held, in a buffer reused from one to the next. The
 * file is read as long as it was when opened; it must be a regular file (a FIFO is refused without
 * blocking). */
typedef struct dt_record_reader dt_record_reader;
int dt_record_reader_open(dt_record_reader **out, const char *path, dt_error *err);
/* Over buf[0..n) (not copied: it must outlive the reader); label names it in messages. */
int dt_record_reader_open_memory(dt_record_reader **out, const uint8_t *buf, size_t n, const char *label,
                                 dt_error *err);
/* 1 with the next record's data in *data[0..*len) (valid until the next call) and its offset in
 * *offset (may be NULL); 0 at a clean end; DT_EFORMAT (as dt_record_next) or DT_EIO. */
int dt_record_reader_next(dt_record_reader *r, const uint8_t **data, size_t *len, uint64_t *offset, dt_error *err);
void dt_record_reader_close(dt_record_reader *r);

typedef enum { DT_EVENT_KIND_OTHER, DT_EVENT_KIND_FILE_VERSION, DT_EVENT_KIND_SUMMARY } dt_event_kind;

typedef struct {
    char *tag;
    int has_simple_value;     /* 0 for other value kinds (histograms, images, ...) */
    float simple_value;
} dt_event_value;

typedef struct {
    double wall_time;
    int64_t step;
    dt_event_kind kind;       /* OTHER: graph, session log, ... (not decoded further) */
    char *file_version;       /* kind FILE_VERSION */
    dt_event_value *values;   /* kind SUMMARY */
    int n_values;
} dt_event;

/* Decodes one record's data (fields unknown to dtrain are skipped). Free with dt_event_free. */
int dt_event_decode(dt_event *out, const uint8_t *data, size_t len, dt_error *err);
void dt_event_free(dt_event *e);

#endif
