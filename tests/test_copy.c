/* store/core/copy.c: the one-pass copy and XXH3-64 against memcpy and
 * XXH3_64bits, on every length class of XXH3's long loop and any
 * alignment, with guard bytes around the destination. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <xxhash.h>

#include "store/core/copy.h"

#define GUARD 64

static uint64_t rng(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545F4914F6CDD1Dull;
}

/* Copies n bytes from src+soff to dst+doff and checks the copy, the hash
 * and that not one byte around the destination changed. */
static void check(size_t n, size_t soff, size_t doff, uint64_t *seed) {
  uint8_t *src = malloc(n + soff + 1), *dst = malloc(n + doff + 2 * GUARD);
  assert_non_null(src);
  assert_non_null(dst);
  for (size_t i = 0; i < n + soff + 1; i++)
    src[i] = (uint8_t)rng(seed);
  memset(dst, 0xa5, n + doff + 2 * GUARD);
  uint64_t h = ecs__copy_hash(dst + GUARD + doff, src + soff, n);
  if (h != XXH3_64bits(src + soff, n))
    fail_msg("n=%zu soff=%zu doff=%zu: hash %016llx, XXH3_64bits %016llx", n, soff, doff,
             (unsigned long long)h, (unsigned long long)XXH3_64bits(src + soff, n));
  if (n && memcmp(dst + GUARD + doff, src + soff, n) != 0)
    fail_msg("n=%zu soff=%zu doff=%zu: copy differs", n, soff, doff);
  for (size_t i = 0; i < GUARD + doff; i++)
    assert_int_equal(dst[i], 0xa5);
  for (size_t i = GUARD + doff + n; i < n + doff + 2 * GUARD; i++)
    assert_int_equal(dst[i], 0xa5);
  free(src);
  free(dst);
}

/* Every length from 0 to 3 blocks and a bit, where each of XXH3's cases
 * (short, mid, long with 0/1/2 blocks, partial blocks, tails of 0..63
 * bytes after the last stripe) has its boundary. */
static void test_small_lengths(void **state) {
  (void)state;
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  for (size_t n = 0; n <= 3 * 1024 + 130; n++)
    check(n, n % 7, n % 13, &seed);
}

/* Block and stripe boundaries of large sizes, at odd alignments. */
static void test_large_lengths(void **state) {
  (void)state;
  uint64_t seed = 42;
  static const size_t base[] = {4096, 65536, 256 << 10, 1 << 20, (4 << 20) + 3};
  for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
    for (size_t d = 0; d < 3; d++) {
      size_t deltas[] = {0, 1, 63};
      check(base[i] - deltas[d], d * 5, (d * 11) % 32, &seed);
      check(base[i] + deltas[d], (d * 3) % 64, d, &seed);
    }
}

/* Large enough for the non-temporal stores, with dst 16-byte aligned
 * (streamed) and not (plain stores). */
static void test_streamed(void **state) {
  (void)state;
  uint64_t seed = 99;
  check(ECS__COPY_NT_MIN, 0, 0, &seed);
  check(ECS__COPY_NT_MIN + 4096 + 17, 3, 16, &seed);
  check(2 * ECS__COPY_NT_MIN + 63, 1, 5, &seed);
  check(ECS__COPY_NT_MIN - 1, 0, 0, &seed);
}

/* Random lengths and alignments. */
static void test_random(void **state) {
  (void)state;
  uint64_t seed = 7;
  for (int k = 0; k < 300; k++) {
    size_t n = (size_t)(rng(&seed) % (300 << 10));
    check(n, (size_t)(rng(&seed) % 64), (size_t)(rng(&seed) % 64), &seed);
  }
}

int main(void) {
  printf("# one-pass path on this CPU: %s\n", ecs__copy_hash_fused() ? "yes (AVX2)" : "no (fallback)");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_small_lengths),
      cmocka_unit_test(test_large_lengths),
      cmocka_unit_test(test_streamed),
      cmocka_unit_test(test_random),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
