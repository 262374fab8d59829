/* Click logs: Criteo's display-ads TSV and libffm lines, plain or gzip, streamed in batches of
 * tabular examples (labels, dense floats, categorical ids per field). docs/ctr-data.md says what
 * each format may hold, how integers are transformed, which lines are validation and test, and how
 * workers share a file.
 *
 * Formats (one example a line):
 *   Criteo:  label \t I1 .. I13 \t C1 .. C26        label 0|1; I: decimal integers, C: 1-8 hex
 *            digits (a 32-bit id); any I or C may be empty (missing). 40 tab-separated fields.
 *   libffm:  label field:id:value field:id:value ...   separated by spaces or tabs; label 0, 1, -1
 *            (= 0) or +1; field < the number of fields; id a decimal integer < 2^64; value a finite
 *            decimal number. A field may appear any number of times (a multi-valued field) or not.
 * A trailing '\r' is ignored; a blank line is no example (it takes no position, below). */
#ifndef DT_DATA_CTR_H
#define DT_DATA_CTR_H

#include <stddef.h>
#include <stdint.h>

#include "data/dataset.h"
#include "model/ctr_batch.h"
#include "dtrain.h"

#define DT_CRITEO_DENSE 13
#define DT_CRITEO_FIELDS 26
#define DT_LIBFFM_DEFAULT_FIELDS 39 /* Criteo as the libffm conversions lay it out: 13 + 26 */
#define DT_CTR_MAX_FIELDS 1024
#define DT_CTR_MAX_OFFSETS ((int64_t)1 << 24) /* batch rows x fields: 128 MiB of offsets */

/* dt_ctr_batch, the batch (model/ctr_batch.h, as the embedding and dense layers consume it). */

/* DT_CTR_MEMORY: rows from a caller's arrays (dt_ctr_memory), no text. */
typedef enum { DT_CTR_AUTO = 0, DT_CTR_CRITEO = 1, DT_CTR_LIBFFM = 2, DT_CTR_MEMORY = 3 } dt_ctr_format;

/* A click log as arrays in a caller's memory (a binding's, docs/python.md), not copied: row i is the
 * file's line i + 1 for the split rule, shards and messages. labels [n] 0 or 1; dense [n * num_dense];
 * ids [nnz] with offsets [n * num_fields + 1] in the batch's CSR form (dt_ctr_batch), or offsets
 * NULL: ids [n * num_fields], one id per field; values [nnz] (NULL: every value 1). A row that breaks
 * these (a label not 0/1, a value not finite, offsets decreasing or past nnz) is a bad line. */
typedef struct {
    int64_t n, nnz;
    int num_dense, num_fields;
    const float *labels, *dense;
    const int64_t *offsets;
    const uint64_t *ids;
    const float *values;
} dt_ctr_memory;
typedef enum { DT_CTR_TRAIN = 0, DT_CTR_VALIDATION = 1, DT_CTR_TEST = 2, DT_CTR_ALL = 3 } dt_ctr_split;

/* ---- line parsing: a batch builder ------------------------------------------------------------ */

/* Assembles parsed lines into a batch it owns (the reader's inside, exposed for tests, the fuzz
 * target and benchmarks). */
typedef struct dt_ctr_builder dt_ctr_builder;

/* format: DT_CTR_CRITEO or DT_CTR_LIBFFM; fields: libffm's number of fields (1..DT_CTR_MAX_FIELDS;
 * ignored for Criteo); capacity: rows (>= 1; capacity x fields at most DT_CTR_MAX_OFFSETS). */
int dt_ctr_builder_create(dt_ctr_builder **out, dt_ctr_format format, int fields, int capacity, dt_error *err);
/* A builder of rows from m (dt_ctr_builder_add_row), m's dense and field counts. */
int dt_ctr_builder_create_memory(dt_ctr_builder **out, const dt_ctr_memory *m, int capacity, dt_error *err);
/* Row `row` (< m->n) of m as one more row, its line number row + 1; DT_EFORMAT with why as
 * dt_ctr_builder_add for a row that breaks dt_ctr_memory's rules. */
int dt_ctr_builder_add_row(dt_ctr_builder *b, const dt_ctr_memory *m, int64_t row, char *why, size_t why_cap,
                           dt_error *err);
void dt_ctr_builder_free(dt_ctr_builder *b);
/* Parses line[0..len) (no '\n'; a trailing '\r' is ignored; it may hold any bytes) as one more row.
 * Returns 0, DT_EFORMAT for a bad line (the batch unchanged; why[0..why_cap) says what is wrong, one
 * line, without the file and line number), DT_ENOMEM, or DT_EINVAL when the batch is full. */
int dt_ctr_builder_add(dt_ctr_builder *b, const char *line, size_t len, int64_t line_no, char *why, size_t why_cap,
                       dt_error *err);
int dt_ctr_builder_rows(const dt_ctr_builder *b);
void dt_ctr_builder_clear(dt_ctr_builder *b);
/* A view of the rows so far (epoch and index 0). */
void dt_ctr_builder_batch(const dt_ctr_builder *b, dt_ctr_batch *out);

/* The integer transform of DLRM's Criteo recipe: log(1 + x) for x >= 0; a negative value and an
 * empty column both become 0. */
float dt_ctr_dense_value(int64_t x);

/* ---- hashing ids, and the split rule ---------------------------------------------------------- */

/* dt_ctr_mix64, dt_ctr_hash and dt_ctr_bucket: model/ctr_batch.h. */
/* Which split line `line_no` (from 1, every physical line counted) belongs to:
 *   u = (mix64(line_no ^ 0x43545253504c4954) >> 11) / 2^53      ("CTRSPLIT"), uniform in [0, 1)
 *   test if u < test_fraction, else validation if u < test_fraction + validation_fraction, else train.
 * It depends on nothing but the line number and the two fractions: not on the seed, the number of
 * workers, the bad-line policy or what the line holds. */
dt_ctr_split dt_ctr_line_split(int64_t line_no, double validation_fraction, double test_fraction);

/* ---- the streaming reader --------------------------------------------------------------------- */

typedef struct {
    dt_ctr_format format;       /* DT_CTR_AUTO: Criteo if the first non-blank line has a tab */
    int fields;                 /* libffm: number of fields (0: DT_LIBFFM_DEFAULT_FIELDS) */
    double validation_fraction; /* shares of the lines (dt_ctr_line_split); default 0.1 and 0.1 */
    double test_fraction;
    dt_ctr_split split;         /* the lines this reader delivers */
    int batch_size;
    int training;               /* 1: full global batches, looping over the file epoch after epoch;
                                   0: one pass, the last batch may be short, then n = 0 */
    int shard_index, shard_count;
    dt_bad_image_policy bad_lines; /* skip (count) or fail, as --bad_images */
    size_t buffer_bytes;        /* the text buffer: also the longest line (0: 1 MiB; >= 4 KiB) */
    const dt_ctr_memory *memory; /* non-NULL: rows from these arrays, path only names them (format,
                                    fields and buffer ignored); must outlive the reader */
} dt_ctr_options;

/* Defaults: auto format, 0.1/0.1 split, train split, batch 1024, training order, one shard, skip. */
void dt_ctr_options_init(dt_ctr_options *o);

typedef struct dt_ctr_reader dt_ctr_reader;

/* Opens path (plain or gzip, told apart by the first two bytes 1f 8b; several gzip members are one
 * stream, as gzip -d reads them). Nothing is read beyond the buffer, ever: memory is the buffer,
 * zlib's state and one batch, whatever the file's size. */
int dt_ctr_open(dt_ctr_reader **out, const char *path, const dt_ctr_options *o, dt_error *err);
/* The next batch (docs/ctr-data.md, "Batches and shards"). Returns 0 with b->n > 0, or b->n == 0
 * when a one-pass reader is done; DT_EFORMAT naming path:line for a bad line under the fail policy,
 * for a corrupt or cut gzip stream, or for a training split too small to make one global batch;
 * DT_EIO for a read error. */
int dt_ctr_next(dt_ctr_reader *r, dt_ctr_batch *b, dt_error *err);
/* Training order: repositions the stream so that the next batch is global batch `index` (resuming
 * from a checkpoint's step), reading the file without parsing it. One-pass order: restarts the pass. */
int dt_ctr_seek(dt_ctr_reader *r, int64_t index, dt_error *err);
/* Counts the positions of the reader's split (its lines, blank ones left out, every shard's) in one
 * pass over the file without parsing it, then starts again from the first batch (dt_ctr_seek(r, 0)).
 * Training learns the batches in an epoch from it, on a reader of its own, beside the steps
 * (train/ctr_count.h). progress (may be NULL) is told the count so far every 65536 lines and at
 * the end; a nonzero answer stops the count (DT_EINTR). */
int dt_ctr_count(dt_ctr_reader *r, uint64_t *positions, int (*progress)(void *user, uint64_t so_far), void *user,
                 dt_error *err);
/* The format in use (after DT_CTR_AUTO), the field counts of its batches. */
dt_ctr_format dt_ctr_reader_format(const dt_ctr_reader *r);
/* Bad lines skipped so far (each counted once per pass that met it), and the first one's message
 * ("path:line: why"; "" when none). */
uint64_t dt_ctr_bad_count(const dt_ctr_reader *r);
/* Bytes of text (decompressed) this reader has read, every pass and seek included: tests check
 * that training reads no more of a file than its first batches need before its first step. */
uint64_t dt_ctr_bytes(const dt_ctr_reader *r);
const char *dt_ctr_first_bad(const dt_ctr_reader *r);
void dt_ctr_close(dt_ctr_reader *r);

#endif
