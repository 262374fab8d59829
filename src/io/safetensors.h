/* safetensors files (docs/checkpoint-format.md): `uint64 LE N`, N bytes of JSON header padded with
 * spaces to 8-byte alignment, then the tensors' bytes, row-major, little-endian, contiguous, in the
 * order given to the writer. The writer stores CRC-32C of the whole data section in the metadata
 * under "crc32c" (8 lowercase hex digits); the reader validates every header field against the file
 * before trusting it and then verifies that checksum when present. Readable by Python's safetensors,
 * numpy or torch without dtrain. */
#ifndef DT_IO_SAFETENSORS_H
#define DT_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain.h"

#define DT_ST_MAX_DIMS 8
#define DT_ST_MAX_HEADER ((size_t)100 << 20)  /* as the reference implementation: 100 MB */
#define DT_ST_MAX_FILE ((size_t)1 << 36)      /* 64 GiB: the largest data section (read on demand) */
#define DT_ST_MAX_NAME 1024                  /* bytes in a tensor name or metadata key */
#define DT_ST_CHECKSUM_KEY "crc32c"          /* metadata key the writer reserves */

/* The standard safetensors dtypes (dtrain writes F32 and I64; the reader knows them all so it can
 * inspect files from elsewhere). */
typedef enum {
    DT_ST_BOOL, DT_ST_U8, DT_ST_I8, DT_ST_U16, DT_ST_I16, DT_ST_F16, DT_ST_BF16,
    DT_ST_U32, DT_ST_I32, DT_ST_F32, DT_ST_U64, DT_ST_I64, DT_ST_F64,
    DT_ST_NUM_DTYPES
} dt_st_dtype;

const char *dt_st_dtype_name(dt_st_dtype d);   /* "F32", ...; "?" if out of range */
size_t dt_st_dtype_size(dt_st_dtype d);        /* bytes per element; 0 if out of range */

/* ---- Writing -------------------------------------------------------------------------------- */

typedef struct {
    const char *name;         /* unique, non-empty, not "__metadata__" */
    dt_st_dtype dtype;
    int ndim;                 /* 0 (scalar) .. DT_ST_MAX_DIMS */
    int64_t shape[DT_ST_MAX_DIMS];
    const void *data;         /* product(shape) elements, contiguous, host (= little-endian) order */
} dt_st_tensor;

typedef struct {
    const char *key, *value;  /* UTF-8; key unique and not DT_ST_CHECKSUM_KEY */
} dt_st_meta;

/* Writes the tensors, in the given order, and the metadata plus the "crc32c" checksum to path
 * atomically: "<path>.tmp.<random>", fsync, rename, fsync of the folder. On failure path is untouched
 * and no temporary file is left. */
int dt_st_write(const char *path, const dt_st_tensor *tensors, int n_tensors, const dt_st_meta *meta,
                int n_meta, dt_error *err);

/* The same in parts, for tensors too large to hold (a cluster's sparse tables, written as they come
 * from the ps tasks): begin writes the header and every tensor whose data is given, and leaves each
 * tensor with data NULL as zeros; put writes bytes anywhere in any tensor; commit reads the data
 * section back once (1 MiB at a time) for the checksum, writes the header with it (the same length:
 * 8 hex digits) and renames the file into place. Commit and abort free the writer; a failure at any
 * point leaves path untouched and no temporary file (once aborted or failed to commit). */
typedef struct dt_st_writer dt_st_writer;
int dt_st_writer_begin(dt_st_writer **out, const char *path, const dt_st_tensor *tensors, int n_tensors,
                       const dt_st_meta *meta, int n_meta, dt_error *err);
/* n bytes at byte `offset` of tensor `tensor` (its index in the list given to begin); refuses a range
 * beyond the tensor. */
int dt_st_writer_put(dt_st_writer *w, int tensor, uint64_t offset, const void *data, size_t n, dt_error *err);
int dt_st_writer_commit(dt_st_writer *w, dt_error *err);
void dt_st_writer_abort(dt_st_writer *w);

/* ---- Reading -------------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    dt_st_dtype dtype;
    int ndim;
    int64_t shape[DT_ST_MAX_DIMS];
    uint64_t count;           /* elements: product of shape (1 for a scalar) */
    size_t offset, nbytes;    /* within the data section; the bytes are read on demand (dt_st_read) */
} dt_st_info;

typedef struct dt_st_file dt_st_file;

/* Opens and validates a file without holding it: the 8-byte length and the header are checked
 * against the file's size (fstat) before anything else is read, the header is parsed, the tensor
 * table is checked against the data section's size, then the data section is streamed once through
 * a fixed buffer to verify the stored "crc32c"; tensor bytes are read from the file (pread) when
 * asked. Refuses, naming the file and the field or tensor at fault: anything but a regular file (a
 * FIFO or device without blocking), a header length beyond the file, JSON that is not an object of
 * tensor entries, unknown dtypes, shapes whose size differs from their data_offsets, offsets out of
 * range, overlaps or gaps, non-string metadata, and a data section whose CRC-32C differs from the
 * stored "crc32c". The file must not be changed in place while open (dtrain replaces its files by
 * rename, which leaves an open one as it was). */
int dt_st_open(dt_st_file **out, const char *path, dt_error *err);
/* As dt_st_open, for a file that must be a regular file at path itself: a symbolic link is refused,
 * not followed (O_NOFOLLOW). The log folder's checkpoints are opened so. */
int dt_st_open_plain(dt_st_file **out, const char *path, dt_error *err);
/* A caller's check of a file whose header and table are valid, before any of its data is read
 * (a checkpoint's tensors against the model: a file claiming gigabytes is refused at once). A
 * non-zero return is the open's result (the file is closed). */
typedef int (*dt_st_check_fn)(const dt_st_file *f, const char *label, void *ctx, dt_error *err);
#define DT_ST_NOFOLLOW 1
/* dt_st_open (flags 0) or dt_st_open_plain (DT_ST_NOFOLLOW), with check (may be NULL) run between
 * the header and the checksum. */
int dt_st_open_ex(dt_st_file **out, const char *path, int flags, dt_st_check_fn check, void *ctx, dt_error *err);
/* The same checks on bytes in memory (copied); label names them in messages. */
int dt_st_open_memory(dt_st_file **out, const void *bytes, size_t n, const char *label, dt_error *err);
void dt_st_close(dt_st_file *f);

int dt_st_num_tensors(const dt_st_file *f);
const dt_st_info *dt_st_tensor_at(const dt_st_file *f, int i);   /* in data-section order */
const dt_st_info *dt_st_find(const dt_st_file *f, const char *name);  /* NULL if absent */

int dt_st_num_meta(const dt_st_file *f);
void dt_st_meta_at(const dt_st_file *f, int i, const char **key, const char **value);
const char *dt_st_meta_get(const dt_st_file *f, const char *key);   /* NULL if absent */
/* 1 if the file carried a "crc32c" (and it matched, or open would have failed). */
int dt_st_has_checksum(const dt_st_file *f);

/* Copies tensor `name` into out, which holds count elements of dtype; refuses (naming the file and
 * tensor) a missing tensor, another dtype or another element count. */
int dt_st_read(const dt_st_file *f, const char *name, dt_st_dtype dtype, void *out, uint64_t count,
               dt_error *err);
/* Copies n bytes of tensor t's data from byte offset within it (for reading a large tensor piece by
 * piece); refuses a range beyond the tensor. */
int dt_st_read_part(const dt_st_file *f, const dt_st_info *t, uint64_t offset, void *out, size_t n, dt_error *err);

#endif
