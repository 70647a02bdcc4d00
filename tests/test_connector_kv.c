/*
 * Integration tests of the P -> D KV handoff (ecs_kv_*): registration
 * (idempotent, conflicts refused), lookups (tp size mismatch refused,
 * missing ranks, retries bounded), and publish / fetch through each
 * backend, with every failure ending the request with a reason.  Real
 * redis-server and ecstore-server processes.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "ecstore/ec_connector.h"
#include "store/core/log.h"
#include "store/core/net.h"
#include "support/ts.h"

typedef struct env {
  ecs_ts_proc_t redis, server;
  char dir[256];
} env_t;

static env_t g;

/* extra: JSON members (", \"k\": v") applied on top of the base keys. */
static ecs_ec_conn_t *open_kv(int backend, int redis_port, const char *extra) {
  char js[1024], err[512] = "";
  snprintf(js, sizeof js,
           "{\"backend\": \"%s\", \"servers\": \"127.0.0.1:%d\", \"redis_url\": \"127.0.0.1:%d\","
           " \"namespace\": \"test\", \"disk_path\": \"%s/kv\", \"timeout_ms\": 2000,"
           " \"connect_timeout_ms\": 500, \"staging_bytes\": \"1M\", \"protocol\": \"tcp\"}",
           ecs_ec_backend_name(backend), g.server.port, redis_port, g.dir);
  ecs_ec_config_t cfg;
  ecs_ec_config_init(&cfg);
  assert_int_equal(ecs_ec_config_parse_json(&cfg, js, 0, err, sizeof err), ECS_OK);
  if (extra) {
    snprintf(js, sizeof js, "{%s}", extra + 1);
    assert_int_equal(ecs_ec_config_parse_json(&cfg, js, 0, err, sizeof err), ECS_OK);
  }
  ecs_ec_conn_t *c = NULL;
  int rc = ecs_ec_open(&cfg, &c, err, sizeof err);
  if (rc != ECS_OK)
    fprintf(stderr, "open: %s: %s\n", ecs_strerror(rc), err);
  return c;
}

static ecs_kv_worker_t worker(const char *id, int role, int dp, int tp, int tp_size, const char *addr) {
  ecs_kv_worker_t w;
  memset(&w, 0, sizeof w);
  snprintf(w.instance_id, sizeof w.instance_id, "%s", id);
  w.role = role;
  w.dp_rank = dp;
  w.tp_rank = tp;
  w.tp_size = tp_size;
  snprintf(w.address, sizeof w.address, "%s", addr);
  return w;
}

static int group_setup(void **state) {
  (void)state;
  ecs_log_set_level(ECS_LOG_ERROR);
  memset(&g, 0, sizeof g);
  if (ecs_ts_redis_start(&g.redis) || ecs_ts_server_start(&g.server, g.redis.port, NULL))
    return -1;
  return ecs_ts_mkdtemp(g.dir, sizeof g.dir);
}

static int group_teardown(void **state) {
  (void)state;
  int st = ecs_ts_stop(&g.server, 5000);
  ecs_ts_stop(&g.redis, 5000);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g.dir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", g.dir);
  return st == 0 ? 0 : -1;
}

/* ------------------------------------------------------------------ */

static void test_register_idempotent_and_conflicts(void **state) {
  (void)state;
  ecs_ec_conn_t *c = open_kv(ECS_EC_BACKEND_ECSTORE, g.redis.port, NULL);
  assert_non_null(c);
  char why[ECS_KV_REASON_MAX];
  ecs_kv_worker_t p0 = worker("reg-p", ECS_KV_PREFILL, 0, 0, 2, "10.0.0.1:8100");
  ecs_kv_worker_t p1 = worker("reg-p", ECS_KV_PREFILL, 0, 1, 2, "10.0.0.1:8101");
  assert_int_equal(ecs_kv_register(c, &p0, why, sizeof why), ECS_OK);
  /* a retry after a network blip: the same values succeed */
  assert_int_equal(ecs_kv_register(c, &p0, why, sizeof why), ECS_OK);
  assert_int_equal(ecs_kv_register(c, &p1, why, sizeof why), ECS_OK);
  assert_int_equal(ecs_kv_register(c, &p1, why, sizeof why), ECS_OK);

  /* the same rank with another address */
  ecs_kv_worker_t moved = p0;
  snprintf(moved.address, sizeof moved.address, "10.0.0.9:8100");
  assert_int_equal(ecs_kv_register(c, &moved, why, sizeof why), ECS_ECONFLICT);
  assert_non_null(strstr(why, "10.0.0.1:8100"));
  assert_non_null(strstr(why, "10.0.0.9:8100"));
  /* another rank of the instance claiming another tp size or role */
  ecs_kv_worker_t odd = worker("reg-p", ECS_KV_PREFILL, 1, 0, 4, "10.0.0.1:8102");
  assert_int_equal(ecs_kv_register(c, &odd, why, sizeof why), ECS_ECONFLICT);
  assert_non_null(strstr(why, "tp_size=2"));
  odd = worker("reg-p", ECS_KV_DECODE, 1, 0, 2, "10.0.0.1:8102");
  assert_int_equal(ecs_kv_register(c, &odd, why, sizeof why), ECS_ECONFLICT);
  assert_non_null(strstr(why, "role=prefill"));

  /* bad values are refused before Redis sees them */
  ecs_kv_worker_t bad = worker("reg p", ECS_KV_PREFILL, 0, 0, 1, "a:1");
  assert_int_equal(ecs_kv_register(c, &bad, why, sizeof why), ECS_EINVAL);
  assert_non_null(strstr(why, "instance_id"));
  bad = worker("x", ECS_KV_PREFILL, 0, 2, 2, "a:1");
  assert_int_equal(ecs_kv_register(c, &bad, why, sizeof why), ECS_EINVAL);
  assert_non_null(strstr(why, "tp_rank 2"));
  bad = worker("x", 7, 0, 0, 1, "a:1");
  assert_int_equal(ecs_kv_register(c, &bad, why, sizeof why), ECS_EINVAL);
  bad = worker("x", ECS_KV_DECODE, 0, 0, 1, "");
  assert_int_equal(ecs_kv_register(c, &bad, why, sizeof why), ECS_EINVAL);
  assert_non_null(strstr(why, "address"));

  /* list */
  ecs_kv_worker_t d0 = worker("reg-d", ECS_KV_DECODE, 0, 0, 2, "10.0.0.2:8200");
  assert_int_equal(ecs_kv_register(c, &d0, why, sizeof why), ECS_OK);
  ecs_kv_worker_t ws[8];
  size_t n = 0;
  assert_int_equal(ecs_kv_list(c, ECS_KV_PREFILL, ws, 8, &n, why, sizeof why), ECS_OK);
  assert_int_equal(n, 2);
  assert_int_equal(ecs_kv_list(c, 0, ws, 8, &n, why, sizeof why), ECS_OK);
  assert_int_equal(n, 3);

  /* unregistering every rank frees the instance for new values */
  assert_int_equal(ecs_kv_unregister(c, &p0, why, sizeof why), ECS_OK);
  assert_int_equal(ecs_kv_unregister(c, &p0, why, sizeof why), ECS_ENOTFOUND);
  assert_int_equal(ecs_kv_unregister(c, &p1, why, sizeof why), ECS_OK);
  ecs_kv_worker_t p4 = worker("reg-p", ECS_KV_PREFILL, 0, 0, 4, "10.0.0.1:8100");
  assert_int_equal(ecs_kv_register(c, &p4, why, sizeof why), ECS_OK);
  ecs_ec_close(c);
}

static void test_lookup(void **state) {
  (void)state;
  ecs_ec_conn_t *c = open_kv(ECS_EC_BACKEND_DISK, g.redis.port, NULL);
  assert_non_null(c);
  char why[ECS_KV_REASON_MAX];
  ecs_kv_worker_t p0 = worker("look-p", ECS_KV_PREFILL, 0, 0, 2, "10.1.0.1:8100");
  assert_int_equal(ecs_kv_register(c, &p0, why, sizeof why), ECS_OK);
  ecs_kv_worker_t d = worker("look-d", ECS_KV_DECODE, 0, 0, 2, "10.1.0.2:8200");
  ecs_kv_worker_t got;
  assert_int_equal(ecs_kv_lookup(c, &d, "look-p", 0, 0, &got, why, sizeof why), ECS_OK);
  assert_string_equal(got.address, "10.1.0.1:8100");
  assert_string_equal(got.instance_id, "look-p");
  assert_int_equal(got.role, ECS_KV_PREFILL);
  assert_int_equal(got.tp_size, 2);

  /* tp size mismatch between P and D: refused explicitly */
  ecs_kv_worker_t d4 = worker("look-d4", ECS_KV_DECODE, 0, 0, 4, "10.1.0.3:8200");
  assert_int_equal(ecs_kv_lookup(c, &d4, "look-p", 0, 0, &got, why, sizeof why), ECS_EINVAL);
  assert_non_null(strstr(why, "tp size mismatch"));
  assert_non_null(strstr(why, "tp_size 2"));
  assert_non_null(strstr(why, "tp_size 4"));
  /* nested lookups check that the ranks exist */
  assert_int_equal(ecs_kv_lookup(c, &d, "look-p", 0, 1, &got, why, sizeof why), ECS_ENOTFOUND);
  assert_non_null(strstr(why, "no worker at dp rank 0, tp rank 1"));
  assert_int_equal(ecs_kv_lookup(c, &d, "look-p", 0, 2, &got, why, sizeof why), ECS_EINVAL);
  assert_int_equal(ecs_kv_lookup(c, &d, "look-p", 3, 0, &got, why, sizeof why), ECS_ENOTFOUND);
  assert_int_equal(ecs_kv_lookup(c, &d, "nobody", 0, 0, &got, why, sizeof why), ECS_ENOTFOUND);
  assert_non_null(strstr(why, "not registered"));
  ecs_ec_close(c);
}

/* Redis down: lookups retry with backoff, then fail with a reason, within
 * a bound. */
static void test_lookup_redis_down(void **state) {
  (void)state;
  ecs_ts_proc_t redis;
  memset(&redis, 0, sizeof redis);
  assert_int_equal(ecs_ts_redis_start(&redis), 0);
  ecs_ec_conn_t *c = open_kv(ECS_EC_BACKEND_DISK, redis.port,
                             ", \"lookup_retries\": 3, \"retry_backoff_ms\": 20, \"timeout_ms\": 300");
  assert_non_null(c);
  char why[ECS_KV_REASON_MAX];
  ecs_kv_worker_t p0 = worker("down-p", ECS_KV_PREFILL, 0, 0, 1, "10.2.0.1:1");
  assert_int_equal(ecs_kv_register(c, &p0, why, sizeof why), ECS_OK);
  ecs_ts_kill9(&redis);
  ecs_kv_worker_t got;
  uint64_t t0 = ecs_now_ms();
  int rc = ecs_kv_lookup(c, &p0, "down-p", 0, 0, &got, why, sizeof why);
  uint64_t el = ecs_now_ms() - t0;
  assert_int_equal(rc, ECS_ECONN);
  assert_true(el >= 20 + 40 + 80 - 10); /* three backoffs */
  assert_true(el < 3000);
  assert_non_null(strstr(why, "lookup"));
  /* a fetch fails with a reason too, never hangs */
  uint8_t buf[64];
  ecs_get_buf_t b = {.data = buf, .capacity = sizeof buf};
  size_t nb = 9;
  t0 = ecs_now_ms();
  assert_true(ecs_kv_fetch(c, "req-down", 5000, &b, 1, &nb, why, sizeof why) < 0);
  assert_true(ecs_now_ms() - t0 < 3000);
  assert_int_equal(nb, 0);
  assert_non_null(strstr(why, "req-down"));
  ecs_ec_close(c);
  ecs_ts_stop(&redis, 5000);
}

/* ------------------------------------------------------------------ */
/* publish / fetch                                                      */

typedef struct pub_arg {
  ecs_ec_conn_t *c;
  const char *req;
  ecs_tensor_t *blocks;
  size_t n;
  int delay_ms, rc;
} pub_arg_t;

static void *publisher(void *p) {
  pub_arg_t *a = p;
  usleep((useconds_t)a->delay_ms * 1000);
  char why[ECS_KV_REASON_MAX];
  a->rc = ecs_kv_publish(a->c, a->req, a->blocks, a->n, why, sizeof why);
  return NULL;
}

static void roundtrip(int backend) {
  ecs_ec_conn_t *pc = open_kv(backend, g.redis.port, NULL); /* prefill side */
  ecs_ec_conn_t *dc = open_kv(backend, g.redis.port, NULL); /* decode side */
  assert_non_null(pc);
  assert_non_null(dc);
  enum { NB = 5 };
  ecs_tensor_t blocks[NB];
  uint8_t *src[NB];
  for (int i = 0; i < NB; i++) {
    memset(&blocks[i], 0, sizeof blocks[i]);
    blocks[i].desc.dtype = ECS_DTYPE_BF16;
    blocks[i].desc.ndim = 3;
    blocks[i].desc.shape[0] = 2;  /* K and V */
    blocks[i].desc.shape[1] = 16; /* tokens */
    blocks[i].desc.shape[2] = (uint64_t)(64 + i);
    blocks[i].nbytes = 2 * 16 * (uint64_t)(64 + i) * 2;
    src[i] = malloc(blocks[i].nbytes);
    for (uint64_t j = 0; j < blocks[i].nbytes; j++)
      src[i][j] = (uint8_t)(j * 31 + (uint64_t)i);
    blocks[i].data = src[i];
  }
  char req[64];
  snprintf(req, sizeof req, "rt-%s-%d", ecs_ec_backend_name(backend), (int)getpid());
  /* decode waits first; prefill publishes 200 ms later: the wait wakes */
  pub_arg_t a = {pc, req, blocks, NB, 200, -1};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, publisher, &a), 0);
  ecs_get_buf_t bufs[8];
  uint8_t *dst[8];
  for (int i = 0; i < 8; i++) {
    dst[i] = malloc(8192);
    bufs[i] = (ecs_get_buf_t){.data = dst[i], .capacity = 8192};
  }
  char why[ECS_KV_REASON_MAX];
  size_t nb = 0;
  uint64_t t0 = ecs_now_ms();
  int rc = ecs_kv_fetch(dc, req, 5000, bufs, 8, &nb, why, sizeof why);
  if (rc != ECS_OK)
    fprintf(stderr, "fetch: %s\n", why);
  assert_int_equal(rc, ECS_OK);
  assert_true(ecs_now_ms() - t0 < 4000);
  pthread_join(th, NULL);
  assert_int_equal(a.rc, ECS_OK);
  assert_int_equal(nb, NB);
  for (int i = 0; i < NB; i++) {
    assert_int_equal(bufs[i].status, ECS_OK);
    assert_int_equal(bufs[i].nbytes, blocks[i].nbytes);
    assert_int_equal(bufs[i].desc.shape[2], 64 + i);
    assert_memory_equal(dst[i], src[i], blocks[i].nbytes);
  }
  /* a second reader (another tp rank) gets the same manifest */
  assert_int_equal(ecs_kv_fetch(dc, req, 1000, bufs, 8, &nb, why, sizeof why), ECS_OK);
  assert_int_equal(nb, NB);
  /* too little room: aborted with a reason */
  assert_int_equal(ecs_kv_fetch(dc, req, 1000, bufs, 2, &nb, why, sizeof why), ECS_EBUFSMALL);
  assert_non_null(strstr(why, "5 KV blocks"));
  /* released: the blocks and manifest are gone, a later fetch times out */
  assert_int_equal(ecs_kv_release(dc, req, NB), ECS_OK);
  assert_int_equal(ecs_kv_fetch(dc, req, 200, bufs, 8, &nb, why, sizeof why), ECS_ETIMEDOUT);
  for (int i = 0; i < 8; i++)
    free(dst[i]);
  for (int i = 0; i < NB; i++)
    free(src[i]);
  ecs_ec_close(pc);
  ecs_ec_close(dc);
}

static void test_roundtrip_ecstore(void **state) {
  (void)state;
  roundtrip(ECS_EC_BACKEND_ECSTORE);
}

static void test_roundtrip_disk(void **state) {
  (void)state;
  roundtrip(ECS_EC_BACKEND_DISK);
}

static void test_roundtrip_redis(void **state) {
  (void)state;
  roundtrip(ECS_EC_BACKEND_REDIS);
}

/* Decode's fetch times out: the request is aborted with its reason. */
static void test_fetch_timeout(void **state) {
  (void)state;
  ecs_ec_conn_t *c = open_kv(ECS_EC_BACKEND_ECSTORE, g.redis.port, NULL);
  assert_non_null(c);
  uint8_t buf[64];
  ecs_get_buf_t b = {.data = buf, .capacity = sizeof buf};
  char why[ECS_KV_REASON_MAX];
  size_t nb = 7;
  uint64_t t0 = ecs_now_ms();
  assert_int_equal(ecs_kv_fetch(c, "never-published", 300, &b, 1, &nb, why, sizeof why), ECS_ETIMEDOUT);
  uint64_t el = ecs_now_ms() - t0;
  assert_true(el >= 290 && el < 2000);
  assert_int_equal(nb, 0);
  assert_non_null(strstr(why, "never-published"));
  assert_non_null(strstr(why, "did not publish"));
  /* timeout 0 is "don't wait", never Redis' "forever" */
  t0 = ecs_now_ms();
  assert_int_equal(ecs_kv_fetch(c, "never-published", 0, &b, 1, &nb, why, sizeof why), ECS_ETIMEDOUT);
  assert_true(ecs_now_ms() - t0 < 1000);
  ecs_ec_close(c);
}

/* Prefill fails: the abort and its reason reach decode at once. */
static void test_abort_reaches_decode(void **state) {
  (void)state;
  ecs_ec_conn_t *c = open_kv(ECS_EC_BACKEND_REDIS, g.redis.port, NULL);
  assert_non_null(c);
  char why[ECS_KV_REASON_MAX];
  uint8_t buf[256];
  ecs_get_buf_t b[4] = {{.data = buf, .capacity = sizeof buf}};
  size_t nb;
  assert_int_equal(ecs_kv_abort(c, "req-ab", "prefill OOM"), ECS_OK);
  uint64_t t0 = ecs_now_ms();
  assert_int_equal(ecs_kv_fetch(c, "req-ab", 5000, b, 4, &nb, why, sizeof why), ECS_ECANCELED);
  assert_true(ecs_now_ms() - t0 < 1000);
  assert_non_null(strstr(why, "prefill OOM"));

  /* a block that cannot be stored aborts the request with which and why */
  ecs_tensor_t blocks[2];
  memset(blocks, 0, sizeof blocks);
  for (int i = 0; i < 2; i++) {
    blocks[i].desc.dtype = ECS_DTYPE_U8;
    blocks[i].desc.ndim = 1;
    blocks[i].desc.shape[0] = 16;
    blocks[i].nbytes = 16;
    blocks[i].data = buf;
  }
  blocks[1].nbytes = 15; /* disagrees with its shape */
  assert_int_equal(ecs_kv_publish(c, "req-bad", blocks, 2, why, sizeof why), ECS_EINVAL);
  assert_non_null(strstr(why, "block 1"));
  assert_int_equal(ecs_kv_fetch(c, "req-bad", 5000, b, 4, &nb, why, sizeof why), ECS_ECANCELED);
  assert_non_null(strstr(why, "block 1"));

  /* a block lost after the manifest (evicted): aborted, with the block named */
  blocks[1].nbytes = 16;
  assert_int_equal(ecs_kv_publish(c, "req-lost", blocks, 2, why, sizeof why), ECS_OK);
  redisContext *r = redisConnect("127.0.0.1", g.redis.port);
  assert_non_null(r);
  redisReply *rep = redisCommand(r, "DEL ecs:{test}:ect:kv:req-lost:1");
  assert_int_equal(rep->integer, 1);
  freeReplyObject(rep);
  redisFree(r);
  assert_int_equal(ecs_kv_fetch(c, "req-lost", 5000, b, 4, &nb, why, sizeof why), ECS_ENOTFOUND);
  assert_non_null(strstr(why, "KV block 1 of 2"));
  ecs_ec_close(c);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_register_idempotent_and_conflicts),
      cmocka_unit_test(test_lookup),
      cmocka_unit_test(test_lookup_redis_down),
      cmocka_unit_test(test_roundtrip_ecstore),
      cmocka_unit_test(test_roundtrip_disk),
      cmocka_unit_test(test_roundtrip_redis),
      cmocka_unit_test(test_fetch_timeout),
      cmocka_unit_test(test_abort_reaches_decode),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
