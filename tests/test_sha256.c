/* SHA-256 against the FIPS 180-2 examples and HMAC-SHA256 against every
 * case of RFC 4231 (store/core/sha256.c, the shm upgrade's proof). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "store/core/sha256.h"

static void hex(const uint8_t *p, size_t n, char *out) {
  for (size_t i = 0; i < n; i++)
    sprintf(out + 2 * i, "%02x", p[i]);
}

static void check_sha(const void *p, size_t n, const char *want) {
  uint8_t d[ECS_SHA256_SIZE];
  char got[2 * ECS_SHA256_SIZE + 1];
  ecs__sha256(p, n, d);
  hex(d, sizeof d, got);
  assert_string_equal(got, want);
}

static void test_sha256_fips(void **state) {
  (void)state;
  check_sha("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  check_sha("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  check_sha(m, strlen(m), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  /* a million 'a', fed in uneven pieces so every buffering branch runs */
  ecs_sha256_t s;
  ecs__sha256_init(&s);
  static uint8_t a[1024]; /* steps go up to 1009 bytes */
  memset(a, 'a', sizeof a);
  size_t done = 0, step = 1;
  while (done < 1000000) {
    size_t n = 1000000 - done < step ? 1000000 - done : step;
    ecs__sha256_update(&s, a, n);
    done += n;
    step = step % 997 + 13;
  }
  uint8_t d[ECS_SHA256_SIZE];
  char got[2 * ECS_SHA256_SIZE + 1];
  ecs__sha256_final(&s, d);
  hex(d, sizeof d, got);
  assert_string_equal(got, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

static void check_hmac(const uint8_t *key, size_t klen, const void *msg, size_t mlen, const char *want) {
  uint8_t d[ECS_SHA256_SIZE];
  char got[2 * ECS_SHA256_SIZE + 1];
  ecs__hmac_sha256(key, klen, msg, mlen, d);
  hex(d, sizeof d, got);
  got[strlen(want)] = '\0'; /* case 5 checks a truncated tag */
  assert_string_equal(got, want);
}

static void test_hmac_rfc4231(void **state) {
  (void)state;
  uint8_t k[131], m[50];
  memset(k, 0x0b, 20);
  check_hmac(k, 20, "Hi There", 8, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  const char *m2 = "what do ya want for nothing?";
  check_hmac((const uint8_t *)"Jefe", 4, m2, strlen(m2),
             "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  memset(k, 0xaa, 20);
  memset(m, 0xdd, 50);
  check_hmac(k, 20, m, 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  for (int i = 0; i < 25; i++)
    k[i] = (uint8_t)(i + 1);
  memset(m, 0xcd, 50);
  check_hmac(k, 25, m, 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  memset(k, 0x0c, 20);
  check_hmac(k, 20, "Test With Truncation", 20, "a3b6167473100ee06e0c796c2955552b");
  memset(k, 0xaa, 131);
  const char *m6 = "Test Using Larger Than Block-Size Key - Hash Key First";
  check_hmac(k, 131, m6, strlen(m6), "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  const char *m7 = "This is a test using a larger than block-size key and a larger than block-size data. "
                   "The key needs to be hashed before being used by the HMAC algorithm.";
  check_hmac(k, 131, m7, strlen(m7), "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sha256_fips),
      cmocka_unit_test(test_hmac_rfc4231),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
