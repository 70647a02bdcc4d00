/* The error table: every code has a distinct name and message. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "ecstore/error.h"

static void test_every_code_named(void **state) {
  (void)state;
  static const int codes[] = {
#define X(name, code, msg) code,
      ECS_ERRNO_MAP(X)
#undef X
  };
  size_t n = sizeof codes / sizeof codes[0];
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(codes[i], -(int)(i + 1)); /* dense, appended only */
    assert_string_not_equal(ecs_err_name(codes[i]), "UNKNOWN");
    assert_string_not_equal(ecs_strerror(codes[i]), "unknown error");
    for (size_t j = 0; j < i; j++)
      assert_string_not_equal(ecs_err_name(codes[i]), ecs_err_name(codes[j]));
  }
  assert_string_equal(ecs_err_name(0), "OK");
  assert_string_equal(ecs_err_name(-9999), "UNKNOWN");
  assert_string_equal(ecs_strerror(12345), "unknown error");
  assert_string_equal(ecs_strerror(ECS_ENOSPC), "no space left in the pool");
}

static void test_from_errno(void **state) {
  (void)state;
  assert_int_equal(ecs_from_errno(0), ECS_OK);
  assert_int_equal(ecs_from_errno(ETIMEDOUT), ECS_ETIMEDOUT);
  assert_int_equal(ecs_from_errno(-ECONNREFUSED), ECS_ECONN);
  assert_int_equal(ecs_from_errno(ENOMEM), ECS_ENOMEM);
  assert_int_equal(ecs_from_errno(EROFS), ECS_EIO);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_code_named),
      cmocka_unit_test(test_from_errno),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
