/*
 * test_store_faults: Failures: a stopped server (deadlines, then reconnection), Redis down,
 * kill -9 and restart (stale records cleaned), SIGTERM (records removed);
 * each test starts its own server.
 * Over the transport ECS_TEST_TRANSPORT names (ctest runs tcp and shm).
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "ecstore/ecstore.h"
#include "store/client/client_internal.h"
#include "store/core/net.h"
#include "store/core/proto.h"
#include "support/fixture.h"
#include "support/raw.h"

#define MIB (1024u * 1024u)

static void test_deadline_server_stopped(void **state) {
  (void)state;
  ecs_ts_env_t e;
  assert_int_equal(ecs_ts_env_open(&e, NULL, 5000), 0);
  ecs_client_t *c = ecs_ts_client(e.servers, NULL, NULL, 800);
  assert_non_null(c);
  uint8_t buf[4096];
  assert_int_equal(ecs_ts_signal(&e.server, SIGSTOP), 0);
  uint64_t t0 = ecs_now_ms();
  assert_int_equal(ecs_ts_get1(c, "anything", buf, sizeof buf, NULL), ECS_ETIMEDOUT);
  uint64_t dt = ecs_now_ms() - t0;
  assert_true(dt >= 700 && dt < 3000);
  /* a put times out too, even with more bytes than the socket buffers hold */
  uint8_t *big = calloc(1, 8 * MIB);
  t0 = ecs_now_ms();
  assert_int_equal(ecs_ts_put1(c, "stalled", big, 8 * MIB, ECS_DTYPE_U8), ECS_ETIMEDOUT);
  assert_true(ecs_now_ms() - t0 < 3000);
  free(big);
  assert_int_equal(ecs_ts_signal(&e.server, SIGCONT), 0);
  /* the client reconnects by itself */
  assert_int_equal(ecs_ping(c), ECS_OK);
  ecs_client_close(c);
  /* a server that is gone: connection refused quickly */
  ecs_ts_kill9(&e.server);
  c = ecs_ts_client(e.servers, NULL, NULL, 800);
  assert_null(c);
  assert_int_equal(ecs_ts_env_close(&e), 0);
}

static void test_redis_down(void **state) {
  (void)state;
  ecs_ts_env_t e;
  static const char *const extra[] = {"--redis-timeout-ms", "200", NULL};
  assert_int_equal(ecs_ts_env_open(&e, extra, 5000), 0);
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.servers = e.servers;
  cfg.redis_url = e.redis_url;
  cfg.ns = "test";
  cfg.transport = ecs_ts_transport();
  cfg.timeout_ms = 600;
  ecs_client_t *cr;
  assert_int_equal(ecs_client_connect(&cfg, &cr, NULL, 0), ECS_OK);
  uint8_t a[4096];
  ecs_ts_fill(a, sizeof a, 11);
  assert_int_equal(ecs_ts_put1(e.c, "before-outage", a, sizeof a, ECS_DTYPE_U8), ECS_OK);

  assert_int_equal(ecs_ts_signal(&e.redis, SIGSTOP), 0);
  ecs_key_t k = {"before-outage", 13};
  int ex = 1;
  uint64_t t0 = ecs_now_ms();
  /* Redis frozen: exists is answered by the server that holds the key,
   * after one bounded Redis attempt */
  int rc = ecs_exists_batch(cr, &k, 1, &ex);
  assert_int_equal(rc, ECS_OK);
  assert_int_equal(ex, 1);
  assert_true(ecs_now_ms() - t0 < 3000);
  /* ...and for the next second the servers answer at once, without waiting
   * on the frozen Redis again */
  t0 = ecs_now_ms();
  ex = 0;
  assert_int_equal(ecs_exists_batch(cr, &k, 1, &ex), ECS_OK);
  assert_int_equal(ex, 1);
  assert_true(ecs_now_ms() - t0 < 300);
  /* the server keeps serving what it holds, and takes new puts: stored,
   * but not published while Redis is frozen (ECS_EREDIS, answered within
   * the Redis timeout; docs/redis-schema.md, "Writes") */
  uint8_t out[4096];
  assert_int_equal(ecs_ts_get1(e.c, "before-outage", out, sizeof out, NULL), ECS_OK);
  assert_int_equal(ecs_ts_put1(e.c, "during-outage", a, 2048, ECS_DTYPE_U8), ECS_EREDIS);
  assert_int_equal(ecs_ts_get1(e.c, "during-outage", out, sizeof out, NULL), ECS_OK);
  assert_int_equal(ecs_ts_signal(&e.redis, SIGCONT), 0);
  /* once Redis answers again, the records are re-synced (looked at in
   * Redis itself: exists may still be answered by the server) */
  redisContext *r = ecs_ts_redis_at(e.redis.port);
  assert_non_null(r);
  long long rec = 0;
  for (int i = 0; i < 100 && rec != 1; i++) {
    usleep(50000);
    rec = ecs_ts_redis_exists(r, "during-outage");
  }
  assert_int_equal(rec, 1);
  redisFree(r);
  ecs_key_t k2 = {"during-outage", 13};
  ex = 0;
  assert_int_equal(ecs_exists_batch(cr, &k2, 1, &ex), ECS_OK);
  assert_int_equal(ex, 1);
  ecs_client_close(cr);
  assert_int_equal(ecs_ts_env_close(&e), 0);
}

static void test_kill9_restart_stale_records(void **state) {
  (void)state;
  ecs_ts_env_t e;
  assert_int_equal(ecs_ts_env_open(&e, NULL, 5000), 0);
  uint8_t a[4096];
  ecs_ts_fill(a, sizeof a, 21);
  assert_int_equal(ecs_ts_put1(e.c, "pre-crash", a, sizeof a, ECS_DTYPE_U8), ECS_OK);
  ecs_key_t k = {"pre-crash", 9};
  int ex = 0;
  assert_int_equal(ecs_exists_batch(e.cr, &k, 1, &ex), ECS_OK);
  assert_int_equal(ex, 1);
  redisContext *r = ecs_ts_redis_at(e.redis.port);
  assert_non_null(r);
  assert_int_equal(ecs_ts_redis_exists(r, "pre-crash"), 1); /* the record outlives the crash */

  ecs_ts_kill9(&e.server);
  /* a new server process with the same node id and port: a new epoch */
  char port[16], redis[32], node[32];
  snprintf(port, sizeof port, "127.0.0.1:%d", e.server.port);
  snprintf(redis, sizeof redis, "127.0.0.1:%d", e.redis.port);
  snprintf(node, sizeof node, "127.0.0.1:%d", e.server.port);
  ecs_ts_proc_t s2;
  memset(&s2, 0, sizeof s2);
  char *argv[] = {(char *)ecs_ts_bin("ecstore-server"),
                  "--listen",
                  port,
                  "--redis",
                  redis,
                  "--pool-size",
                  "64M",
                  "--ns",
                  "test",
                  "--node-id",
                  node,
                  NULL};
  assert_int_equal(ecs_ts_spawn(&s2, argv), 0);
  assert_int_equal(ecs_ts_wait_port(&s2, e.server.port, 10000), 0);
  ex = 1;
  assert_int_equal(ecs_exists_batch(e.cr, &k, 1, &ex), ECS_OK);
  assert_int_equal(ex, 0);                                  /* stale: a miss */
  assert_int_equal(ecs_ts_redis_exists(r, "pre-crash"), 0); /* and cleaned */
  uint8_t out[4096];
  assert_int_equal(ecs_ts_get1(e.c, "pre-crash", out, sizeof out, NULL), ECS_ENOTFOUND);
  redisFree(r);
  assert_int_equal(ecs_ts_stop(&s2, 5000), 0);
  assert_int_equal(ecs_ts_env_close(&e), 0);
}

static void test_sigterm_removes_records(void **state) {
  (void)state;
  ecs_ts_env_t e;
  assert_int_equal(ecs_ts_env_open(&e, NULL, 5000), 0);
  uint8_t a[4096];
  ecs_ts_fill(a, sizeof a, 31);
  assert_int_equal(ecs_ts_put1(e.c, "graceful", a, sizeof a, ECS_DTYPE_U8), ECS_OK);
  redisContext *r = ecs_ts_redis_at(e.redis.port);
  assert_non_null(r);
  assert_int_equal(ecs_ts_redis_exists(r, "graceful"), 1);
  assert_int_equal(ecs_ts_stop(&e.server, 5000), 0); /* SIGTERM, clean exit */
  e.server.pid = 0;
  assert_int_equal(ecs_ts_redis_exists(r, "graceful"), 0);
  redisReply *rep = redisCommand(r, "SCARD ecs:{test}:nodes");
  assert_non_null(rep);
  assert_int_equal(rep->integer, 0);
  freeReplyObject(rep);
  redisFree(r);
  assert_int_equal(ecs_ts_env_close(&e), 0);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_deadline_server_stopped),
      cmocka_unit_test(test_redis_down),
      cmocka_unit_test(test_kill9_restart_stale_records),
      cmocka_unit_test(test_sigterm_removes_records),
  };
  return cmocka_run_group_tests_name("store_faults", tests, NULL, NULL) ? 1 : 0;
}
