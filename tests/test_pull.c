/*
 * test_pull: PULL (docs/protocol.md 6.12), a server fetching objects from
 * another server of its namespace straight into its own pool, against a
 * real Redis and real servers on loopback: the bytes arrive intact; an
 * address that is no registered server is never dialled; a stopped holder
 * costs its items the deadline while the server serves everyone else.
 * tests/python/test_pull.py covers the rest (rights, a lying holder); this
 * one runs under the sanitizer builds too.
 */
#include <poll.h>
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

#include "ecstore/ecstore.h"
#include "store/core/net.h"
#include "support/fixture.h"
#include "support/objset.h"

#define NOBJ 24

typedef ecs_mfx_t fx_t;

static ecs_client_t *client_of(fx_t *f, int i, int with_redis, int timeout_ms) {
  char srv[64], url[64];
  snprintf(srv, sizeof srv, "127.0.0.1:%d", f->srv[i].port);
  snprintf(url, sizeof url, "127.0.0.1:%d", f->redis.port);
  return ecs_ts_client(srv, with_redis ? url : NULL, NULL, timeout_ms);
}

static ecs_client_t *discovery(fx_t *f) {
  char url[64];
  snprintf(url, sizeof url, "127.0.0.1:%d", f->redis.port);
  ecs_client_config_t cfg;
  ecs_ts_client_config(&cfg, NULL, "tcp");
  cfg.servers = NULL;
  cfg.redis_url = url;
  cfg.timeout_ms = 3000;
  return ecs_ts_connect(&cfg);
}

static void start(fx_t *f, int n) {
  for (int i = 0; i < n; i++) {
    const char *extra[] = {"--pool-size", "64M", NULL};
    assert_int_equal(ecs_ts_server_start(&f->srv[i], f->redis.port, extra), 0);
  }
}

/* One key pulled into server `into`'s client c from holder addr. */
static int pull1(ecs_client_t *c, const char *key, const char *addr) {
  ecs_key_t k = {key, strlen(key)};
  int st = 12345;
  int rc = ecs_pull_batch(c, 0, &k, &addr, 1, &st);
  return rc ? rc : st;
}

/* Waits until c's server knows addr from the registry (read every second,
 * at once when asked for an address it lacks). */
static void settle(ecs_client_t *c, const char *addr) {
  int st = ECS_EPERM;
  for (int i = 0; i < 250 && (st == ECS_EPERM || st == ECS_EBUSY); i++) {
    st = pull1(c, "settle-probe", addr);
    if (st == ECS_EPERM || st == ECS_EBUSY) /* not in its copy yet; or no copy yet (just started) */
      usleep(20000);
  }
  assert_int_equal(st, ECS_ENOTFOUND);
}

static void test_pull_is_bit_identical(void **state) {
  fx_t *f = *state;
  start(f, 2);
  ecs_client_t *a = client_of(f, 0, 1, 5000), *b = client_of(f, 1, 0, 5000), *d = discovery(f);
  char addr_a[64];
  snprintf(addr_a, sizeof addr_a, "127.0.0.1:%d", f->srv[0].port);
  settle(b, addr_a);
  int st[NOBJ + 1];
  assert_int_equal(ecs_objset_put(a, "pl", NOBJ, 7, st, 0), ECS_OK);
  char names[NOBJ + 1][32];
  ecs_key_t keys[NOBJ + 1];
  for (int i = 0; i < NOBJ; i++)
    ecs_objset_key(names[i], sizeof names[i], "pl", i);
  snprintf(names[NOBJ], sizeof names[NOBJ], "pl-none");
  for (int i = 0; i <= NOBJ; i++)
    keys[i] = (ecs_key_t){names[i], strlen(names[i])};
  ecs_holder_t where[NOBJ + 1];
  assert_int_equal(ecs_locate_batch(d, keys, NOBJ + 1, where), ECS_OK);
  const char *holders[NOBJ + 1];
  for (int i = 0; i < NOBJ; i++) {
    assert_int_equal(where[i].status, ECS_OK);
    assert_string_equal(where[i].addr, addr_a);
    holders[i] = where[i].addr;
  }
  assert_int_equal(where[NOBJ].status, ECS_ENOTFOUND);
  holders[NOBJ] = addr_a;
  uint64_t gets0 = ecs_ts_stat0(a).gets;
  assert_int_equal(ecs_pull_batch(b, 0, keys, holders, NOBJ + 1, st), ECS_OK);
  for (int i = 0; i < NOBJ; i++)
    assert_int_equal(st[i], ECS_OK);
  assert_int_equal(st[NOBJ], ECS_ENOTFOUND);
  assert_int_equal(ecs_ts_stat0(a).gets - gets0, NOBJ + 1);       /* each object crossed once */
  assert_int_equal(ecs_objset_get(b, "pl", NOBJ, 7, st), ECS_OK); /* asserts every byte */
  for (int i = 0; i < NOBJ; i++)
    assert_int_equal(st[i], ECS_OK);
  assert_int_equal(ecs_ts_stat0(b).objects, NOBJ);
  ecs_client_close(a);
  ecs_client_close(b);
  ecs_client_close(d);
}

static void test_pull_never_dials_an_unregistered_address(void **state) {
  fx_t *f = *state;
  start(f, 2);
  ecs_client_t *b = client_of(f, 1, 0, 5000);
  char addr_a[64], addr_b[64], trap_addr[64];
  snprintf(addr_a, sizeof addr_a, "127.0.0.1:%d", f->srv[0].port);
  snprintf(addr_b, sizeof addr_b, "127.0.0.1:%d", f->srv[1].port);
  settle(b, addr_a);
  int trap;
  assert_int_equal(ecs_net_listen("127.0.0.1", 0, 8, &trap), ECS_OK);
  snprintf(trap_addr, sizeof trap_addr, "127.0.0.1:%d", ecs_net_local_port(trap));
  assert_int_equal(pull1(b, "k", trap_addr), ECS_EPERM);
  assert_int_equal(pull1(b, "k", "localhost:1"), ECS_EPERM);
  assert_int_equal(pull1(b, "k", addr_b), ECS_EINVAL); /* itself */
  struct pollfd p = {.fd = trap, .events = POLLIN};
  assert_int_equal(poll(&p, 1, 300), 0); /* nobody connected */
  close(trap);
  /* hostile arguments never reach the wire */
  char longaddr[300];
  memset(longaddr, 'x', sizeof longaddr - 1);
  longaddr[sizeof longaddr - 1] = '\0';
  assert_int_equal(pull1(b, "k", longaddr), ECS_EINVAL);
  assert_int_equal(pull1(b, "k", ""), ECS_EINVAL);
  ecs_key_t bad = {"", 0};
  const char *h = addr_a;
  int st;
  assert_int_equal(ecs_pull_batch(b, 0, &bad, &h, 1, &st), ECS_OK);
  assert_int_equal(st, ECS_EKEY);
  assert_int_equal(ecs_pull_batch(b, 1, &bad, &h, 1, &st), ECS_EINVAL); /* no server 1 */
  assert_int_equal(pull1(b, "k", addr_a), ECS_ENOTFOUND);
  ecs_client_close(b);
}

typedef struct stalled {
  ecs_client_t *c;
  const char *addr;
  int st;
  uint64_t ms;
} stalled_t;

static void *stalled_pull(void *arg) {
  stalled_t *s = arg;
  uint64_t t0 = ecs_now_ms();
  s->st = pull1(s->c, "stop-k", s->addr);
  s->ms = ecs_now_ms() - t0;
  return NULL;
}

static void test_stopped_holder_costs_its_items_only(void **state) {
  fx_t *f = *state;
  start(f, 3);
  ecs_client_t *a = client_of(f, 0, 1, 5000), *c = client_of(f, 2, 1, 5000);
  ecs_client_t *b = client_of(f, 1, 0, 1200), *other = client_of(f, 1, 0, 5000);
  char addr_a[64], addr_c[64];
  snprintf(addr_a, sizeof addr_a, "127.0.0.1:%d", f->srv[0].port);
  snprintf(addr_c, sizeof addr_c, "127.0.0.1:%d", f->srv[2].port);
  settle(other, addr_a);
  settle(other, addr_c);
  uint8_t buf[4096];
  memset(buf, 0x5a, sizeof buf);
  assert_int_equal(ecs_ts_put1(a, "stop-k", buf, sizeof buf, ECS_DTYPE_U8), ECS_OK);
  assert_int_equal(ecs_ts_put1(c, "live-k", buf, sizeof buf, ECS_DTYPE_U8), ECS_OK);
  assert_int_equal(ecs_ts_signal(&f->srv[0], SIGSTOP), 0);
  stalled_t s = {b, addr_a, 0, 0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, stalled_pull, &s), 0);
  usleep(200000);
  uint64_t t0 = ecs_now_ms();
  assert_int_equal(ecs_ts_put1(other, "side-k", buf, sizeof buf, ECS_DTYPE_U8), ECS_OK);
  assert_int_equal(pull1(other, "live-k", addr_c), ECS_OK);
  assert_true(ecs_now_ms() - t0 < 1000); /* served meanwhile */
  pthread_join(th, NULL);
  assert_int_equal(ecs_ts_signal(&f->srv[0], SIGCONT), 0);
  assert_int_equal(s.st, ECS_ETIMEDOUT);
  assert_true(s.ms >= 900 && s.ms < 2500); /* the call's own deadline */
  assert_int_equal(pull1(other, "stop-k", addr_a), ECS_OK);
  ecs_client_close(a);
  ecs_client_close(b);
  ecs_client_close(c);
  ecs_client_close(other);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_pull_is_bit_identical, ecs_mfx_setup, ecs_mfx_teardown),
      cmocka_unit_test_setup_teardown(test_pull_never_dials_an_unregistered_address, ecs_mfx_setup,
                                      ecs_mfx_teardown),
      cmocka_unit_test_setup_teardown(test_stopped_holder_costs_its_items_only, ecs_mfx_setup,
                                      ecs_mfx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
