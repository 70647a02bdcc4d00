/*
 * Helpers shared by the wire-codec tests (test_proto_*.c): a reproducible
 * random source, exact heap copies for ASan, record builders and checks.
 * Included after <cmocka.h>.
 */
#ifndef ECS_TESTS_PROTO_UTIL_H
#define ECS_TESTS_PROTO_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ecstore/tensor.h"
#include "store/core/proto.h"

static uint64_t rng_state; /* rnd()'s state, per test binary */

/* splitmix64: small, fast and reproducible from the printed seed. */
static inline uint64_t rnd(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline uint8_t *dup_exact(const void *src, size_t n) {
  uint8_t *p = malloc(n != 0 ? n : 1);
  assert_non_null(p);
  if (n != 0)
    memcpy(p, src, n);
  return p;
}

static inline ecs_tensor_desc_t mkdesc(int dtype, unsigned ndim, const uint64_t *shape) {
  ecs_tensor_desc_t d;
  memset(&d, 0, sizeof d);
  d.dtype = (uint8_t)dtype;
  d.ndim = (uint8_t)ndim;
  for (unsigned i = 0; i < ndim && i < ECS_MAX_DIMS; i++)
    d.shape[i] = shape[i];
  return d;
}

static inline ecs_put_item_t mkput(const char *key, int codec, ecs_tensor_desc_t desc) {
  ecs_put_item_t it;
  memset(&it, 0, sizeof it);
  it.key = (const uint8_t *)key;
  it.key_len = (uint16_t)strlen(key);
  it.codec = (uint8_t)codec;
  it.desc = desc;
  uint64_t n = 0;
  assert_int_equal(ecs_tensor_nbytes(&desc, &n), ECS_OK);
  it.raw_nbytes = n;
  it.nbytes = codec == ECS_CODEC_NONE ? n : n / 3 + 1;
  it.checksum = 0x0123456789abcdefull ^ n;
  return it;
}

static inline void assert_desc_equal(const ecs_tensor_desc_t *a, const ecs_tensor_desc_t *b) {
  assert_int_equal(a->dtype, b->dtype);
  assert_int_equal(a->ndim, b->ndim);
  for (unsigned i = 0; i < a->ndim && i < ECS_MAX_DIMS; i++)
    assert_int_equal(a->shape[i], b->shape[i]);
}

static inline int in_buf(const ecs_rbuf_t *r, const uint8_t *p, size_t n) {
  return p != NULL && p >= r->p && (size_t)(p - r->p) <= r->len && n <= r->len - (size_t)(p - r->p);
}

static inline ecs_hdr_t good_hdr(void) {
  ecs_hdr_t h = {.magic = ECS_PROTO_MAGIC,
                 .version = ECS_PROTO_VERSION,
                 .opcode = ECS_OP_PUT,
                 .req_id = 77,
                 .count = 3,
                 .meta_len = 100,
                 .data_len = 1000};
  return h;
}

#endif
