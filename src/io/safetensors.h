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
#define DT_ST_MAX_FILE ((size_t)1 << 36)      /* 64 GiB: the reader holds the file in memory */
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
 * atomically: "<path>.tmp.<pid>", fsync, rename, fsync of the folder. On failure path is untouched
 * and no temporary file is left. */
int dt_st_write(const char *path, const dt_st_tensor *tensors, int n_tensors, const dt_st_meta *meta,
                int n_meta, dt_error *err);

/* ---- Reading -------------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    dt_st_dtype dtype;
    int ndim;
    int64_t shape[DT_ST_MAX_DIMS];
    uint64_t count;           /* elements: product of shape (1 for a scalar) */
    size_t offset, nbytes;    /* within the data section */
    const uint8_t *data;      /* into the file image; NOT necessarily aligned: copy, don't cast */
} dt_st_info;

typedef struct dt_st_file dt_st_file;

/* Reads and validates the whole file; refuses, naming the file and the field or tensor at fault:
 * a header length beyond the file, JSON that is not an object of tensor entries, unknown dtypes,
 * shapes whose size differs from their data_offsets, offsets out of range, overlaps or gaps, non-string
 * metadata, and a data section whose CRC-32C differs from the stored "crc32c". */
int dt_st_open(dt_st_file **out, const char *path, dt_error *err);
/* As dt_st_open, for a file that must be a regular file at path itself: a symbolic link is refused,
 * not followed (dt_read_plain_file). The log folder's checkpoints are opened so. */
int dt_st_open_plain(dt_st_file **out, const char *path, dt_error *err);
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

#endif
