/*
 * Tensor descriptions, content keys and checksums.
 *
 * A stored value is a tensor: contiguous bytes plus a dtype and a shape of
 * up to ECS_MAX_DIMS dimensions.  Keys are opaque byte strings of 1 to
 * ECS_MAX_KEY bytes (vLLM's mm_hash, a 64-character hex sha256, fits).
 *
 * Thread safety: all functions are pure and thread-safe.
 */
#ifndef ECSTORE_TENSOR_H
#define ECSTORE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "ecstore/export.h"
#include "ecstore/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ECS_MAX_DIMS 8
#define ECS_MAX_KEY 256
/* Content keys are xxh3-128 as 32 lowercase hex digits (+ NUL). */
#define ECS_CONTENT_KEY_LEN 32

/* Wire values: stable, never renumbered. */
typedef enum ecs_dtype {
  ECS_DTYPE_INVALID = 0,
  ECS_DTYPE_F32 = 1,
  ECS_DTYPE_F16 = 2,
  ECS_DTYPE_BF16 = 3,
  ECS_DTYPE_F8E4M3 = 4,
  ECS_DTYPE_F8E5M2 = 5,
  ECS_DTYPE_I8 = 6,
  ECS_DTYPE_U8 = 7,
  ECS_DTYPE_I32 = 8,
  ECS_DTYPE_I64 = 9,
  ECS_DTYPE_F64 = 10,
  ECS_DTYPE_I16 = 11,
  ECS_DTYPE_U16 = 12,
  ECS_DTYPE_U32 = 13,
  ECS_DTYPE_U64 = 14,
  ECS_DTYPE_BOOL = 15, /* one byte per element, 0 or 1 (torch.bool, numpy bool_) */
  ECS_DTYPE__COUNT
} ecs_dtype_t;

typedef struct ecs_tensor_desc {
  uint8_t dtype;                /* an ecs_dtype_t */
  uint8_t ndim;                 /* 0..ECS_MAX_DIMS (0: a scalar, one element) */
  uint64_t shape[ECS_MAX_DIMS]; /* shape[0..ndim) */
} ecs_tensor_desc_t;

/* Bytes per element (1, 2, 4 or 8), or 0 for an unknown dtype. */
ECS_API size_t ecs_dtype_size(int dtype);

/* "f32", "f16", "bf16", "f8e4m3", "f8e5m2", "i8", "u8", "i32", "i64",
 * "f64", "i16", "u16", "u32", "u64", "bool". */
ECS_API const char *ecs_dtype_name(int dtype);

/* Parses a name above (also "float32", "float16", "bfloat16", "int8",
 * "uint8", "int32", "int64", "float8_e4m3fn", "float8_e5m2", "float64",
 * "int16", "uint16", "uint32", "uint64"; "bool" has no long name).  Returns
 * ECS_OK or ECS_EDTYPE. */
ECS_API int ecs_dtype_parse(const char *name, ecs_dtype_t *out);

/* Checks dtype and ndim and computes prod(shape) * dtype size into *out
 * (a dimension of 0 gives 0 bytes; ndim 0 is a scalar), refusing overflow.
 * Returns ECS_OK, ECS_EDTYPE or ECS_EOVERFLOW. */
ECS_API int ecs_tensor_nbytes(const ecs_tensor_desc_t *desc, uint64_t *out);

/* Parses "650,2048" into desc->shape/ndim.  Returns ECS_OK or ECS_EDTYPE. */
ECS_API int ecs_shape_parse(const char *s, ecs_tensor_desc_t *desc);

/* Checks a key: 1..ECS_MAX_KEY bytes.  Returns ECS_OK or ECS_EKEY. */
ECS_API int ecs_key_check(const void *key, size_t len);

/* The content key of bytes: xxh3-128 as 32 lowercase hex digits + NUL. */
ECS_API void ecs_content_key(const void *data, size_t len, char out[ECS_CONTENT_KEY_LEN + 1]);

/* The object checksum: xxh3-64 of the stored bytes. */
ECS_API uint64_t ecs_checksum(const void *data, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* ECSTORE_TENSOR_H */
