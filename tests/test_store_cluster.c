/*
 * test_store_cluster: Who may do what, and where: auth tokens and namespaces, and a client
 * routing keys over two servers (each test starts its own servers).
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
#include <sys/stat.h>
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

static void test_auth_and_namespace(void **state) {
  (void)state;
  char dir[256];
  assert_int_equal(ecs_ts_mkdtemp(dir, sizeof dir), 0);
  char tok[300];
  snprintf(tok, sizeof tok, "%s/token", dir);
  FILE *f = fopen(tok, "w");
  assert_non_null(f);
  fprintf(f, "s3cret-token\n");
  fclose(f);
  assert_int_equal(chmod(tok, 0600), 0); /* the server refuses a token others can read */
  ecs_ts_env_t e;
  memset(&e, 0, sizeof e);
  assert_int_equal(ecs_ts_redis_start(&e.redis), 0);
  const char *extra[] = {"--auth-token-file", tok, NULL};
  assert_int_equal(ecs_ts_server_start(&e.server, e.redis.port, extra), 0);
  snprintf(e.servers, sizeof e.servers, "127.0.0.1:%d", e.server.port);
  ecs_client_t *c = ecs_ts_client(e.servers, NULL, NULL, 2000);
  assert_null(c); /* no token */
  c = ecs_ts_client(e.servers, NULL, "wrong", 2000);
  assert_null(c);
  c = ecs_ts_client(e.servers, NULL, "s3cret-token", 2000);
  assert_non_null(c);
  assert_int_equal(ecs_ping(c), ECS_OK);
  ecs_client_close(c);
  /* another namespace is refused with a message that says so */
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.servers = e.servers;
  cfg.ns = "other-model";
  cfg.auth_token = "s3cret-token";
  char err[256];
  assert_int_equal(ecs_client_connect(&cfg, &c, err, sizeof err), ECS_EINVAL);
  assert_non_null(strstr(err, "namespace"));
  unlink(tok);
  rmdir(dir);
  assert_int_equal(ecs_ts_env_close(&e), 0);
}

static void test_two_servers(void **state) {
  (void)state;
  ecs_ts_env_t e;
  assert_int_equal(ecs_ts_env_open(&e, NULL, 5000), 0);
  ecs_ts_proc_t s2;
  memset(&s2, 0, sizeof s2);
  assert_int_equal(ecs_ts_server_start(&s2, e.redis.port, NULL), 0);
  char servers[96];
  snprintf(servers, sizeof servers, "127.0.0.1:%d,127.0.0.1:%d", e.server.port, s2.port);
  ecs_client_t *c = ecs_ts_client(servers, e.redis_url, NULL, 5000);
  assert_non_null(c);
  enum { N = 64 };
  char names[N][16];
  ecs_key_t keys[N];
  ecs_tensor_t ts[N];
  static uint8_t data[N][1024], out[N][1024];
  ecs_get_buf_t b[N];
  int st[N], ex[N];
  memset(ts, 0, sizeof ts);
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "two-%d", i);
    keys[i].data = names[i];
    keys[i].len = strlen(names[i]);
    ecs_ts_fill(data[i], 1024, (uint32_t)i + 77);
    ts[i].data = data[i];
    ts[i].nbytes = 1024;
    ts[i].desc.dtype = ECS_DTYPE_F16;
    ts[i].desc.ndim = 2;
    ts[i].desc.shape[0] = 2;
    ts[i].desc.shape[1] = 256;
    b[i].data = out[i];
    b[i].capacity = 1024;
  }
  assert_int_equal(ecs_put_batch(c, keys, ts, N, st), ECS_OK);
  for (int i = 0; i < N; i++)
    assert_int_equal(st[i], ECS_OK);
  assert_int_equal(ecs_get_batch(c, keys, b, N), ECS_OK);
  for (int i = 0; i < N; i++) {
    assert_int_equal(b[i].status, ECS_OK);
    assert_memory_equal(out[i], data[i], 1024);
  }
  assert_int_equal(ecs_exists_batch(c, keys, N, ex), ECS_OK);
  for (int i = 0; i < N; i++)
    assert_int_equal(ex[i], 1);
  ecs_server_stat_t s0, s1;
  assert_int_equal(ecs_stat(c, 0, &s0), ECS_OK);
  assert_int_equal(ecs_stat(c, 1, &s1), ECS_OK);
  assert_int_equal(s0.objects + s1.objects, N);
  assert_true(s0.objects > 0 && s1.objects > 0); /* both hold a share */
  ecs_client_close(c);
  assert_int_equal(ecs_ts_stop(&s2, 5000), 0);
  assert_int_equal(ecs_ts_env_close(&e), 0);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_auth_and_namespace),
      cmocka_unit_test(test_two_servers),
  };
  return cmocka_run_group_tests_name("store_cluster", tests, NULL, NULL) ? 1 : 0;
}
