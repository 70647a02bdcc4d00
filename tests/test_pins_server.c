/*
 * test_pins_server: pins through a real ecstore-server (issue 25), over the
 * transport under test (tcp: the flags ride the PUT; shm: the RESERVE).
 * Hard pins survive a pool filled several times over and the background
 * eviction; past --hard-pin-max an item fails alone with ECS_EPINQUOTA; a
 * remove gives the room back; a tenant with a quota hard-pins at most its
 * share of the cap, and its hard pins are never evicted to make room under
 * its quota.  A soft pin's own TTL (ecs_client_set_pin) rides the wire.
 * Real redis-server and ecstore-server (16 MiB pool, 4 MiB of hard pins).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "ecstore/ecstore.h"
#include "support/fixture.h"
#include "support/raw.h"

#define MiB (1u << 20)

static char g_dir[256], g_acl[300];
static uint8_t g_buf[MiB], g_got[MiB];

/* tok-q: a tenant with an 8 MiB quota, so a share of 8 * 4/16 = 2 MiB of hard pins. */
static const char acl_text[] = "tok-all  test  all\n"
                               "tok-q    test  read,write,remove  stored=8M\n";

static int setup(void **state) {
  if (ecs_ts_mkdtemp(g_dir, sizeof g_dir) != 0)
    return -1;
  snprintf(g_acl, sizeof g_acl, "%s/acl", g_dir);
  FILE *f = fopen(g_acl, "w");
  if (!f)
    return -1;
  fputs(acl_text, f);
  fclose(f);
  chmod(g_acl, 0600);
  static const char *extra[] = {
      "--acl-file", NULL, "--auth-fail-delay-ms", "0", "--pool-size", "16M", "--hard-pin-max", "4M", NULL};
  extra[1] = g_acl;
  ecs_ts_env_t *e = calloc(1, sizeof *e);
  if (!e || ecs_ts_env_start(e, extra) != 0) {
    free(e);
    return -1;
  }
  *state = e;
  return 0;
}

static int teardown(void **state) {
  ecs_ts_env_t *e = *state;
  if (e == NULL)
    return -1;
  int rc = ecs_ts_env_stop(e);
  free(e);
  unlink(g_acl);
  rmdir(g_dir);
  return rc == 0 ? 0 : -1;
}

static ecs_client_t *client(ecs_ts_env_t *e, const char *token) {
  ecs_client_t *c = ecs_ts_client(e->servers, NULL, token, 5000);
  assert_non_null(c);
  return c;
}

static int put1(ecs_client_t *c, const char *key, uint32_t seed) {
  ecs_ts_fill(g_buf, MiB, seed);
  return ecs_ts_put1(c, key, g_buf, MiB, ECS_DTYPE_U8);
}

/* The object under key holds seed's bytes. */
static void check(ecs_client_t *c, const char *key, uint32_t seed) {
  ecs_ts_fill(g_buf, MiB, seed);
  assert_int_equal(ecs_ts_get1(c, key, g_got, MiB, NULL), ECS_OK);
  assert_memory_equal(g_got, g_buf, MiB);
}

static int remove1(ecs_client_t *c, const char *key) {
  ecs_key_t k = {key, strlen(key)};
  int st = -999;
  int rc = ecs_remove_batch(c, &k, 1, &st);
  return rc ? rc : st;
}

/* Fills the 16 MiB pool n times over with plain 1 MiB objects. */
static void churn(ecs_client_t *c, const char *pfx, int n) {
  char key[32];
  assert_int_equal(ecs_client_set_pin(c, ECS_PIN_NONE, 0), ECS_OK);
  for (int i = 0; i < 16 * n; i++) {
    snprintf(key, sizeof key, "%s-%d", pfx, i);
    assert_int_equal(put1(c, key, 7000u + (uint32_t)i), ECS_OK);
  }
}

static void test_hard_pins_kept_and_bounded(void **state) {
  ecs_ts_env_t *e = *state;
  ecs_client_t *c = client(e, "tok-all");
  assert_int_equal(ecs_client_set_pin(c, ECS_PIN_HARD, 0), ECS_OK);
  /* five in one batch: the fifth is past the 4 MiB cap and fails alone */
  ecs_key_t keys[5];
  ecs_tensor_t t[5];
  char names[5][8];
  static uint8_t data[5][MiB];
  int st[5];
  for (int i = 0; i < 5; i++) {
    snprintf(names[i], sizeof names[i], "h%d", i);
    keys[i] = (ecs_key_t){names[i], strlen(names[i])};
    ecs_ts_fill(data[i], MiB, 100u + (uint32_t)i);
    t[i] = (ecs_tensor_t){.data = data[i], .nbytes = MiB};
    t[i].desc.dtype = ECS_DTYPE_U8;
    t[i].desc.ndim = 1;
    t[i].desc.shape[0] = MiB;
  }
  int rc = ecs_put_batch(c, keys, t, 5, st);
  assert_true(rc == ECS_OK || rc == ECS_EPINQUOTA);
  for (int i = 0; i < 4; i++)
    assert_int_equal(st[i], ECS_OK);
  assert_int_equal(st[4], ECS_EPINQUOTA);
  churn(c, "plain", 3);
  usleep(300 * 1000); /* the background eviction's ticks */
  churn(c, "plain2", 1);
  for (int i = 0; i < 4; i++)
    check(c, names[i], 100u + (uint32_t)i);
  assert_int_equal(ecs_ts_get1(c, "plain-0", g_got, MiB, NULL), ECS_ENOTFOUND); /* the plain ones went */
  /* a remove gives the room back */
  assert_int_equal(ecs_client_set_pin(c, ECS_PIN_HARD, 0), ECS_OK);
  assert_int_equal(put1(c, "h4", 104), ECS_EPINQUOTA);
  assert_int_equal(remove1(c, "h0"), ECS_OK);
  assert_int_equal(put1(c, "h4", 104), ECS_OK);
  churn(c, "plain3", 2);
  check(c, "h4", 104);
  for (int i = 1; i < 5; i++)
    assert_int_equal(remove1(c, names[i]), ECS_OK);
  ecs_client_close(c);
}

/* A tenant with a quota: 2 MiB of hard pins (its share), which count
 * against its 8 MiB and which its own later puts never evict. */
static void test_tenant_hard_share(void **state) {
  ecs_ts_env_t *e = *state;
  ecs_client_t *q = client(e, "tok-q");
  assert_int_equal(ecs_client_set_pin(q, ECS_PIN_HARD, 0), ECS_OK);
  assert_int_equal(put1(q, "q-h0", 200), ECS_OK);
  assert_int_equal(put1(q, "q-h1", 201), ECS_OK);
  assert_int_equal(put1(q, "q-h2", 202), ECS_EPINQUOTA);
  churn(q, "q-plain", 2); /* 32 MiB through a 6 MiB rest of the quota */
  check(q, "q-h0", 200);
  check(q, "q-h1", 201);
  /* 7 MiB: over what its unpinned objects (6 MiB at most) can free */
  uint8_t *big = calloc(7u * MiB, 1);
  assert_non_null(big);
  assert_int_equal(ecs_ts_put1(q, "q-big", big, 7u * MiB, ECS_DTYPE_U8), ECS_EQUOTA);
  free(big);
  check(q, "q-h0", 200);
  assert_int_equal(remove1(q, "q-h0"), ECS_OK);
  assert_int_equal(remove1(q, "q-h1"), ECS_OK);
  ecs_client_close(q);
}

/* A soft pin's own TTL: 1 s is over after 1.3 s and its object then goes
 * first; a 10 min one keeps its object through the same churn. */
static void test_soft_pin_own_ttl(void **state) {
  ecs_ts_env_t *e = *state;
  ecs_client_t *c = client(e, "tok-all");
  assert_int_equal(ecs_client_set_pin(c, ECS_PIN_HARD, 5), ECS_EINVAL); /* a TTL is a soft pin's */
  assert_int_equal(ecs_client_set_pin(c, 3, 0), ECS_EINVAL);
  assert_int_equal(ecs_client_set_pin(NULL, ECS_PIN_SOFT, 0), ECS_EINVAL);
  assert_int_equal(ecs_client_set_pin(c, ECS_PIN_SOFT, 1000), ECS_OK);
  assert_int_equal(put1(c, "s-short", 300), ECS_OK);
  assert_int_equal(ecs_client_set_pin(c, ECS_PIN_SOFT, 600000), ECS_OK);
  assert_int_equal(put1(c, "s-long", 301), ECS_OK);
  usleep(1300 * 1000);
  churn(c, "s-plain", 2);
  assert_int_equal(ecs_ts_get1(c, "s-short", g_got, MiB, NULL), ECS_ENOTFOUND);
  check(c, "s-long", 301);
  ecs_client_close(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hard_pins_kept_and_bounded),
      cmocka_unit_test(test_tenant_hard_share),
      cmocka_unit_test(test_soft_pin_own_ttl),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
