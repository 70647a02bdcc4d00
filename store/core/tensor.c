/*
 * Tensor descriptions, content keys and checksums (include/ecstore/tensor.h).
 *
 * Everything here is pure and keeps no global state; only the piece-by-piece
 * checksums at the end (store/core/checksum.h) allocate: libxxhash's XXH3 state.
 * The dtype table is indexed by the wire value, so a new dtype is one
 * appended row.
 */
#include "ecstore/tensor.h"
#include "store/core/checksum.h"

#include <string.h>

#include <xxhash.h>
#if defined(ECS_HAVE_XXH_DISPATCH)
/* The run-time dispatched XXH3 (AVX2/AVX-512 where the CPU has them): the
 * same hash values as XXH3_64bits/XXH3_128bits, two to three times faster
 * on long inputs than the SSE2 baseline. */
#define XXH_DISPATCH_DISABLE_REPLACE 1
#include <xxh_x86dispatch.h>
#define ecs_xxh3_64 XXH3_64bits_dispatch
#define ecs_xxh3_128 XXH3_128bits_dispatch
#define ecs_xxh3_64_update XXH3_64bits_update_dispatch
#else
#define ecs_xxh3_64 XXH3_64bits
#define ecs_xxh3_128 XXH3_128bits
#define ecs_xxh3_64_update XXH3_64bits_update
#endif

/* One row per dtype, indexed by its ecs_dtype_t wire value. */
static const struct {
  const char *name;  /* canonical short name, what ecs_dtype_name() returns */
  const char *alias; /* the long (numpy/torch style) name, also parsed */
  size_t size;       /* bytes per element */
} dtypes[ECS_DTYPE__COUNT] = {
    [ECS_DTYPE_INVALID] = {"invalid", NULL, 0},
    [ECS_DTYPE_F32] = {"f32", "float32", 4},
    [ECS_DTYPE_F16] = {"f16", "float16", 2},
    [ECS_DTYPE_BF16] = {"bf16", "bfloat16", 2},
    [ECS_DTYPE_F8E4M3] = {"f8e4m3", "float8_e4m3fn", 1},
    [ECS_DTYPE_F8E5M2] = {"f8e5m2", "float8_e5m2", 1},
    [ECS_DTYPE_I8] = {"i8", "int8", 1},
    [ECS_DTYPE_U8] = {"u8", "uint8", 1},
    [ECS_DTYPE_I32] = {"i32", "int32", 4},
    [ECS_DTYPE_I64] = {"i64", "int64", 8},
    [ECS_DTYPE_F64] = {"f64", "float64", 8},
    [ECS_DTYPE_I16] = {"i16", "int16", 2},
    [ECS_DTYPE_U16] = {"u16", "uint16", 2},
    [ECS_DTYPE_U32] = {"u32", "uint32", 4},
    [ECS_DTYPE_U64] = {"u64", "uint64", 8},
    [ECS_DTYPE_BOOL] = {"bool", "bool", 1},
};

static int dtype_known(int dtype) {
  return dtype > ECS_DTYPE_INVALID && dtype < ECS_DTYPE__COUNT;
}

size_t ecs_dtype_size(int dtype) {
  return dtype_known(dtype) ? dtypes[dtype].size : 0;
}

/* Unknown values map to "invalid" rather than NULL so that callers can print
 * the result of any wire value without a check. */
const char *ecs_dtype_name(int dtype) {
  return dtype_known(dtype) ? dtypes[dtype].name : dtypes[ECS_DTYPE_INVALID].name;
}

int ecs_dtype_parse(const char *name, ecs_dtype_t *out) {
  if (name == NULL || out == NULL)
    return ECS_EDTYPE;
  for (int d = ECS_DTYPE_INVALID + 1; d < ECS_DTYPE__COUNT; d++) {
    if (strcmp(name, dtypes[d].name) == 0 || strcmp(name, dtypes[d].alias) == 0) {
      *out = (ecs_dtype_t)d;
      return ECS_OK;
    }
  }
  return ECS_EDTYPE;
}

/* The product of the dimensions times the element size.  A zero dimension
 * makes the tensor empty whatever the other dimensions are, so it is looked
 * for first: {0, 2^40, 2^40} is 0 bytes, not an overflow. */
int ecs_tensor_nbytes(const ecs_tensor_desc_t *desc, uint64_t *out) {
  if (desc == NULL || !dtype_known(desc->dtype) || desc->ndim > ECS_MAX_DIMS)
    return ECS_EDTYPE;
  uint64_t n = dtypes[desc->dtype].size;
  for (unsigned i = 0; i < desc->ndim; i++) {
    if (desc->shape[i] == 0) {
      n = 0;
      break;
    }
  }
  for (unsigned i = 0; n != 0 && i < desc->ndim; i++) {
    if (desc->shape[i] > UINT64_MAX / n)
      return ECS_EOVERFLOW;
    n *= desc->shape[i];
  }
  if (out != NULL)
    *out = n;
  return ECS_OK;
}

/* Accepts one or more comma-separated decimal numbers and nothing else: no
 * spaces, signs, empty parts or trailing comma.  desc is only written on
 * success; its dtype is left alone. */
int ecs_shape_parse(const char *s, ecs_tensor_desc_t *desc) {
  if (s == NULL || desc == NULL)
    return ECS_EDTYPE;
  uint64_t shape[ECS_MAX_DIMS];
  unsigned ndim = 0;
  const char *p = s;
  for (;;) {
    if (ndim == ECS_MAX_DIMS)
      return ECS_EDTYPE;
    if (*p < '0' || *p > '9')
      return ECS_EDTYPE; /* an empty part or a non-digit */
    uint64_t v = 0;
    while (*p >= '0' && *p <= '9') {
      unsigned digit = (unsigned)(*p - '0');
      if (v > (UINT64_MAX - digit) / 10)
        return ECS_EDTYPE;
      v = v * 10 + digit;
      p++;
    }
    shape[ndim++] = v;
    if (*p == '\0')
      break;
    if (*p != ',')
      return ECS_EDTYPE;
    p++;
  }
  desc->ndim = (uint8_t)ndim;
  memcpy(desc->shape, shape, ndim * sizeof shape[0]);
  for (unsigned i = ndim; i < ECS_MAX_DIMS; i++)
    desc->shape[i] = 0;
  return ECS_OK;
}

int ecs_key_check(const void *key, size_t len) {
  if (key == NULL || len == 0 || len > ECS_MAX_KEY)
    return ECS_EKEY;
  return ECS_OK;
}

/* xxhash reads nothing for len 0, but a NULL pointer there is still
 * undefined behaviour for memcpy-style sanitizer checks; give it a real one. */
static const void *nonnull(const void *data) {
  static const uint8_t empty;
  return data != NULL ? data : &empty;
}

void ecs_content_key(const void *data, size_t len, char out[ECS_CONTENT_KEY_LEN + 1]) {
  static const char hex[] = "0123456789abcdef";
  XXH128_hash_t h = ecs_xxh3_128(nonnull(data), len);
  for (int i = 0; i < 16; i++) {
    out[i] = hex[(h.high64 >> (60 - 4 * i)) & 0xf];
    out[16 + i] = hex[(h.low64 >> (60 - 4 * i)) & 0xf];
  }
  out[ECS_CONTENT_KEY_LEN] = '\0';
}

uint64_t ecs_checksum(const void *data, size_t len) {
  return ecs_xxh3_64(nonnull(data), len);
}

/* ---- checksums piece by piece (store/core/checksum.h) ---- */

/* ecs_sum_t is libxxhash's own streaming state. */
ecs_sum_t *ecs_sum_new(void) {
  XXH3_state_t *st = XXH3_createState();
  if (st)
    XXH3_64bits_reset(st);
  return st;
}

void ecs_sum_free(ecs_sum_t *s) {
  XXH3_freeState(s); /* NULL is a no-op */
}

void ecs_sum_reset(ecs_sum_t *s) {
  XXH3_64bits_reset(s);
}

void ecs_sum_update(ecs_sum_t *s, const void *p, size_t n) {
  if (n)
    ecs_xxh3_64_update(s, p, n);
}

uint64_t ecs_sum_digest(const ecs_sum_t *s) {
  return XXH3_64bits_digest(s);
}

uint64_t ecs_copy_checksum(void *dst, const void *src, size_t n) {
  ecs_sum_t *s = n > ECS_SUM_SLICE ? ecs_sum_new() : NULL;
  if (!s) { /* one slice, or no memory for the state: copy, then hash */
    if (n)
      memcpy(dst, src, n);
    return ecs_checksum(dst, n);
  }
  for (size_t at = 0; at < n; at += ECS_SUM_SLICE) {
    size_t k = n - at < ECS_SUM_SLICE ? n - at : ECS_SUM_SLICE;
    memcpy((uint8_t *)dst + at, (const uint8_t *)src + at, k);
    ecs_sum_update(s, (const uint8_t *)dst + at, k);
  }
  uint64_t h = ecs_sum_digest(s);
  ecs_sum_free(s);
  return h;
}
