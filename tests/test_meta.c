/* Redis metadata layer (store/meta.c) against a real redis-server. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "support/ts.h"

/* The test support itself: start, SIGSTOP, stop, restart on the same port. */
static void test_ts_redis_lifecycle(void **state) {
  (void)state;
  ecs_ts_proc_t r;
  memset(&r, 0, sizeof r);
  assert_int_equal(ecs_ts_redis_start(&r), 0);
  assert_true(r.pid > 0);
  assert_true(r.port > 0);
  int port = r.port;
  char dir[256];
  strcpy(dir, r.dir);
  assert_int_equal(access(r.log, R_OK), 0);
  ecs_ts_kill9(&r);
  assert_int_equal(r.pid, 0);
  assert_int_equal(access(dir, F_OK), 0);      /* kill9 keeps the directory */
  assert_int_equal(ecs_ts_redis_start(&r), 0); /* same port, same dir */
  assert_int_equal(r.port, port);
  assert_string_equal(r.dir, dir);
  assert_int_equal(ecs_ts_signal(&r, SIGSTOP), 0);
  assert_int_equal(ecs_ts_stop(&r, 2000), 0); /* continued, then SIGTERM: clean exit */
  assert_int_equal(r.pid, 0);
  assert_int_not_equal(access(dir, F_OK), 0);
  /* A binary that is not there: spawn succeeds, wait_port sees it die. */
  ecs_ts_proc_t bad;
  memset(&bad, 0, sizeof bad);
  char *argv[] = {"/nonexistent/ecs-nothing", NULL};
  assert_int_equal(ecs_ts_spawn(&bad, argv), 0);
  assert_int_equal(ecs_ts_wait_port(&bad, ecs_ts_free_port(), 2000), -1);
  assert_int_equal(bad.pid, 0);
  ecs_ts_stop(&bad, 100);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ts_redis_lifecycle),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
