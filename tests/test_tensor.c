/* Tensor helpers: dtype table, byte sizes, shape parsing, keys, hashes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <xxhash.h>

#include "ecstore/tensor.h"
#include "proto_util.h" /* mkdesc */
#include "store/core/checksum.h"

static void test_dtype_sizes_and_names(void **state) {
  (void)state;
  static const struct {
    int dtype;
    size_t size;
    const char *name;
    const char *alias;
  } rows[] = {
      {ECS_DTYPE_F32, 4, "f32", "float32"},
      {ECS_DTYPE_F16, 2, "f16", "float16"},
      {ECS_DTYPE_BF16, 2, "bf16", "bfloat16"},
      {ECS_DTYPE_F8E4M3, 1, "f8e4m3", "float8_e4m3fn"},
      {ECS_DTYPE_F8E5M2, 1, "f8e5m2", "float8_e5m2"},
      {ECS_DTYPE_I8, 1, "i8", "int8"},
      {ECS_DTYPE_U8, 1, "u8", "uint8"},
      {ECS_DTYPE_I32, 4, "i32", "int32"},
      {ECS_DTYPE_I64, 8, "i64", "int64"},
      {ECS_DTYPE_F64, 8, "f64", "float64"},
      {ECS_DTYPE_I16, 2, "i16", "int16"},
      {ECS_DTYPE_U16, 2, "u16", "uint16"},
      {ECS_DTYPE_U32, 4, "u32", "uint32"},
      {ECS_DTYPE_U64, 8, "u64", "uint64"},
      {ECS_DTYPE_BOOL, 1, "bool", "bool"},
  };
  assert_int_equal(sizeof rows / sizeof rows[0], ECS_DTYPE__COUNT - 1);
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    ecs_dtype_t d = ECS_DTYPE_INVALID;
    assert_int_equal(ecs_dtype_size(rows[i].dtype), rows[i].size);
    assert_string_equal(ecs_dtype_name(rows[i].dtype), rows[i].name);
    assert_int_equal(ecs_dtype_parse(rows[i].name, &d), ECS_OK);
    assert_int_equal(d, rows[i].dtype);
    d = ECS_DTYPE_INVALID;
    assert_int_equal(ecs_dtype_parse(rows[i].alias, &d), ECS_OK);
    assert_int_equal(d, rows[i].dtype);
  }
  /* Wire values are stable. */
  assert_int_equal(ECS_DTYPE_F32, 1);
  assert_int_equal(ECS_DTYPE_I64, 9);
  assert_int_equal(ECS_DTYPE_F64, 10);
  assert_int_equal(ECS_DTYPE_BOOL, 15);
}

static void test_dtype_unknown(void **state) {
  (void)state;
  static const int bad[] = {ECS_DTYPE_INVALID, ECS_DTYPE__COUNT, -1, 255, 1000};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(ecs_dtype_size(bad[i]), 0);
    assert_non_null(ecs_dtype_name(bad[i]));
    assert_string_equal(ecs_dtype_name(bad[i]), "invalid");
  }
  ecs_dtype_t d = ECS_DTYPE_F16;
  static const char *names[] = {"", "F32", "f32 ", "float", "invalid", "float8", "f8e4m3fnuz", "BOOL"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    assert_int_equal(ecs_dtype_parse(names[i], &d), ECS_EDTYPE);
  assert_int_equal(d, ECS_DTYPE_F16); /* untouched on failure */
  assert_int_equal(ecs_dtype_parse(NULL, &d), ECS_EDTYPE);
}

static void test_nbytes(void **state) {
  (void)state;
  uint64_t n = 99;
  ecs_tensor_desc_t d = mkdesc(ECS_DTYPE_BF16, 2, (const uint64_t[]){650, 2048});
  assert_int_equal(ecs_tensor_nbytes(&d, &n), ECS_OK);
  assert_int_equal(n, 650u * 2048u * 2u);

  d = mkdesc(ECS_DTYPE_I64, 0, NULL); /* a scalar: one element */
  assert_int_equal(ecs_tensor_nbytes(&d, &n), ECS_OK);
  assert_int_equal(n, 8);

  d = mkdesc(ECS_DTYPE_F32, 3, (const uint64_t[]){7, 0, 9});
  assert_int_equal(ecs_tensor_nbytes(&d, &n), ECS_OK);
  assert_int_equal(n, 0);

  /* A zero dimension wins over dimensions whose product would overflow. */
  d = mkdesc(ECS_DTYPE_F32, 3, (const uint64_t[]){UINT64_MAX, UINT64_MAX, 0});
  assert_int_equal(ecs_tensor_nbytes(&d, &n), ECS_OK);
  assert_int_equal(n, 0);

  const uint64_t all8[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  d = mkdesc(ECS_DTYPE_U8, 8, all8);
  assert_int_equal(ecs_tensor_nbytes(&d, &n), ECS_OK);
  assert_int_equal(n, 40320);
}

static void test_nbytes_errors(void **state) {
  (void)state;
  uint64_t n = 1234;
  ecs_tensor_desc_t d = mkdesc(ECS_DTYPE_INVALID, 1, (const uint64_t[]){4});
  assert_int_equal(ecs_tensor_nbytes(&d, &n), ECS_EDTYPE);
  d = mkdesc(ECS_DTYPE__COUNT, 1, (const uint64_t[]){4});
  assert_int_equal(ecs_tensor_nbytes(&d, &n), ECS_EDTYPE);
  d = mkdesc(ECS_DTYPE_F32, 1, (const uint64_t[]){4});
  d.ndim = ECS_MAX_DIMS + 1;
  assert_int_equal(ecs_tensor_nbytes(&d, &n), ECS_EDTYPE);
  assert_int_equal(ecs_tensor_nbytes(NULL, &n), ECS_EDTYPE);

  /* Element count fits, bytes do not. */
  d = mkdesc(ECS_DTYPE_F32, 1, (const uint64_t[]){UINT64_MAX / 2});
  assert_int_equal(ecs_tensor_nbytes(&d, &n), ECS_EOVERFLOW);
  /* The product of dimensions overflows. */
  d = mkdesc(ECS_DTYPE_U8, 2, (const uint64_t[]){1ull << 32, 1ull << 32});
  assert_int_equal(ecs_tensor_nbytes(&d, &n), ECS_EOVERFLOW);
  /* Exactly at the edge: 2^63 * 1 byte fits, 2^63 * 2 bytes does not. */
  d = mkdesc(ECS_DTYPE_U8, 2, (const uint64_t[]){1ull << 31, 1ull << 32});
  assert_int_equal(ecs_tensor_nbytes(&d, &n), ECS_OK);
  assert_int_equal(n, 1ull << 63);
  d.dtype = ECS_DTYPE_F16;
  assert_int_equal(ecs_tensor_nbytes(&d, &n), ECS_EOVERFLOW);
  d = mkdesc(ECS_DTYPE_U8, 1, (const uint64_t[]){UINT64_MAX});
  assert_int_equal(ecs_tensor_nbytes(&d, &n), ECS_OK);
  assert_int_equal(n, UINT64_MAX);
}

static void test_shape_parse(void **state) {
  (void)state;
  ecs_tensor_desc_t d;
  memset(&d, 0xee, sizeof d);
  d.dtype = ECS_DTYPE_F16;
  assert_int_equal(ecs_shape_parse("650,2048", &d), ECS_OK);
  assert_int_equal(d.dtype, ECS_DTYPE_F16); /* left alone */
  assert_int_equal(d.ndim, 2);
  assert_int_equal(d.shape[0], 650);
  assert_int_equal(d.shape[1], 2048);
  for (int i = 2; i < ECS_MAX_DIMS; i++)
    assert_int_equal(d.shape[i], 0);

  assert_int_equal(ecs_shape_parse("7", &d), ECS_OK);
  assert_int_equal(d.ndim, 1);
  assert_int_equal(d.shape[0], 7);

  assert_int_equal(ecs_shape_parse("0,3", &d), ECS_OK);
  assert_int_equal(d.ndim, 2);
  assert_int_equal(d.shape[0], 0);

  assert_int_equal(ecs_shape_parse("1,2,3,4,5,6,7,8", &d), ECS_OK);
  assert_int_equal(d.ndim, 8);
  assert_int_equal(d.shape[7], 8);

  assert_int_equal(ecs_shape_parse("18446744073709551615,007", &d), ECS_OK);
  assert_int_equal(d.shape[0], UINT64_MAX);
  assert_int_equal(d.shape[1], 7);
}

static void test_shape_parse_errors(void **state) {
  (void)state;
  static const char *bad[] = {
      "",
      ",",
      "1,",
      ",1",
      "1,,2",
      " 1",
      "1 ",
      "1, 2",
      "-1",
      "+1",
      "1x2",
      "1.5",
      "0x10",
      "abc",
      "1;2",
      "1,2,3,4,5,6,7,8,9",
      "18446744073709551616",
      "99999999999999999999999",
      "1,18446744073709551616",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ecs_tensor_desc_t d;
    memset(&d, 0, sizeof d);
    d.ndim = 3;
    d.shape[0] = 42;
    assert_int_equal(ecs_shape_parse(bad[i], &d), ECS_EDTYPE);
    assert_int_equal(d.ndim, 3); /* unchanged on failure */
    assert_int_equal(d.shape[0], 42);
  }
  ecs_tensor_desc_t d;
  assert_int_equal(ecs_shape_parse(NULL, &d), ECS_EDTYPE);
}

static void test_key_check(void **state) {
  (void)state;
  char key[ECS_MAX_KEY + 1];
  memset(key, 'k', sizeof key);
  assert_int_equal(ecs_key_check(key, 1), ECS_OK);
  assert_int_equal(ecs_key_check(key, ECS_MAX_KEY), ECS_OK);
  assert_int_equal(ecs_key_check(key, 0), ECS_EKEY);
  assert_int_equal(ecs_key_check(key, ECS_MAX_KEY + 1), ECS_EKEY);
  assert_int_equal(ecs_key_check(NULL, 5), ECS_EKEY);
  /* Keys are bytes: NULs and high bytes are fine. */
  assert_int_equal(ecs_key_check("\0\xff", 2), ECS_OK);
}

static void test_content_key(void **state) {
  (void)state;
  char out[ECS_CONTENT_KEY_LEN + 1];
  /* Reference vectors of XXH3-128 (high 64 bits first). */
  ecs_content_key("", 0, out);
  assert_string_equal(out, "99aa06d3014798d86001c324468d497f");
  ecs_content_key(NULL, 0, out);
  assert_string_equal(out, "99aa06d3014798d86001c324468d497f");
  ecs_content_key("abc", 3, out);
  assert_string_equal(out, "06b05ab6733a618578af5f94892f3950");
  assert_int_equal(strlen(out), ECS_CONTENT_KEY_LEN);

  /* Every character is lowercase hex and the key depends on every byte. */
  uint8_t buf[4096];
  for (size_t i = 0; i < sizeof buf; i++)
    buf[i] = (uint8_t)(i * 131 + 7);
  char a[ECS_CONTENT_KEY_LEN + 1], b[ECS_CONTENT_KEY_LEN + 1];
  ecs_content_key(buf, sizeof buf, a);
  for (int i = 0; i < ECS_CONTENT_KEY_LEN; i++)
    assert_non_null(strchr("0123456789abcdef", a[i]));
  buf[sizeof buf - 1] ^= 1;
  ecs_content_key(buf, sizeof buf, b);
  assert_string_not_equal(a, b);
  assert_int_equal(ecs_key_check(a, strlen(a)), ECS_OK);
}

static void test_checksum(void **state) {
  (void)state;
  assert_int_equal(ecs_checksum("", 0), 0x2d06800538d394c2ull);
  assert_int_equal(ecs_checksum(NULL, 0), 0x2d06800538d394c2ull);
  assert_int_equal(ecs_checksum("abc", 3), 0x78af5f94892f3950ull);
  uint8_t buf[1000] = {0};
  uint64_t c = ecs_checksum(buf, sizeof buf);
  buf[500] = 1;
  assert_int_not_equal(ecs_checksum(buf, sizeof buf), c);
}

/* The piece-by-piece checksums give ecs_checksum's value, whatever the
 * cut, around the slice boundaries too; and ecs_checksum (dispatched to
 * AVX2/AVX-512 where the library can) equals libxxhash's plain XXH3_64bits. */
static void test_checksum_pieces(void **state) {
  (void)state;
  const size_t S = ECS_SUM_SLICE;
  const size_t sizes[] = {0, 1, 63, 240, 241, 4096, S - 1, S, S + 1, 3 * S + 7};
  size_t max = 3 * S + 7;
  uint8_t *src = malloc(max), *dst = malloc(max);
  assert_non_null(src);
  assert_non_null(dst);
  uint32_t x = 12345;
  for (size_t i = 0; i < max; i++) {
    x = x * 1103515245u + 12345u;
    src[i] = (uint8_t)(x >> 16);
  }
  ecs_sum_t *sum = ecs_sum_new();
  assert_non_null(sum);
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i];
    uint64_t want = ecs_checksum(src, n);
    assert_int_equal(want, XXH3_64bits(src, n));
    memset(dst, 0, max);
    assert_int_equal(ecs_copy_checksum(dst, src, n), want);
    assert_memory_equal(dst, src, n);
    for (size_t cut = 1; cut <= 4097; cut = cut * 4 + 1) { /* uneven pieces */
      ecs_sum_reset(sum);
      for (size_t at = 0; at < n; at += cut)
        ecs_sum_update(sum, src + at, n - at < cut ? n - at : cut);
      assert_int_equal(ecs_sum_digest(sum), want);
    }
  }
  /* content keys over a long input: libxxhash's plain XXH3_128bits */
  char ck[ECS_CONTENT_KEY_LEN + 1], want_ck[ECS_CONTENT_KEY_LEN + 1];
  ecs_content_key(src, max, ck);
  XXH128_hash_t h = XXH3_128bits(src, max);
  snprintf(want_ck, sizeof want_ck, "%016llx%016llx", (unsigned long long)h.high64,
           (unsigned long long)h.low64);
  assert_string_equal(ck, want_ck);
  /* a flipped byte in the last slice changes the copy's checksum */
  uint64_t whole = ecs_checksum(src, max);
  src[max - 2] ^= 0x40;
  assert_int_not_equal(ecs_copy_checksum(dst, src, max), whole);
  ecs_sum_free(sum);
  ecs_sum_free(NULL);
  free(src);
  free(dst);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dtype_sizes_and_names),
      cmocka_unit_test(test_dtype_unknown),
      cmocka_unit_test(test_nbytes),
      cmocka_unit_test(test_nbytes_errors),
      cmocka_unit_test(test_shape_parse),
      cmocka_unit_test(test_shape_parse_errors),
      cmocka_unit_test(test_key_check),
      cmocka_unit_test(test_content_key),
      cmocka_unit_test(test_checksum),
      cmocka_unit_test(test_checksum_pieces),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
