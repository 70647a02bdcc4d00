/*
 * What the libFuzzer targets in tests/fuzz share: an invariant check that
 * names the broken invariant and aborts (libFuzzer then saves the input as
 * a crash), and a cursor over the fuzz input.
 *
 * Checks use FUZZ_CHECK, not assert(): they must hold in every build type.
 */
#ifndef ECS_FUZZ_H
#define ECS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define FUZZ_CHECK(cond)                                                                                     \
  do {                                                                                                       \
    if (!(cond)) {                                                                                           \
      fprintf(stderr, "fuzz invariant broken: %s:%d: %s\n", __FILE__, __LINE__, #cond);                      \
      abort();                                                                                               \
    }                                                                                                        \
  } while (0)

/* The libFuzzer entry point (every target defines it). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A cursor over the input: take() hands out the next n bytes, or NULL when
 * fewer are left (the input is then used up). */
typedef struct fuzz_in {
  const uint8_t *p; /* the input */
  size_t len;       /* its size */
  size_t pos;       /* bytes used */
} fuzz_in_t;

static inline const uint8_t *fuzz_take(fuzz_in_t *in, size_t n) {
  if (n > in->len - in->pos) {
    in->pos = in->len;
    return NULL;
  }
  const uint8_t *s = in->p + in->pos;
  in->pos += n;
  return s;
}

static inline uint8_t fuzz_u8(fuzz_in_t *in) {
  const uint8_t *s = fuzz_take(in, 1);
  return s ? s[0] : 0;
}

/* 1 when [p, p+n) lies inside [base, base+len). */
static inline int fuzz_inside(const void *p, size_t n, const void *base, size_t len) {
  const uint8_t *q = p, *b = base;
  if (n == 0)
    return 1;
  return q != NULL && q >= b && n <= len && (size_t)(q - b) <= len - n;
}

#endif
