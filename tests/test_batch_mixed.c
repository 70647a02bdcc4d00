/*
 * "One bad item never fails its neighbours" (ARCHITECTURE.md, principle 1),
 * batch by batch: put, get, get_alloc, view, exists and remove with a
 * conflicting, missing, too-big, malformed or corrupt item in the middle of
 * good ones.  Each item's own status is asserted, and the good items are
 * stored and returned byte for byte.  Also: a conflicting put is refused
 * when the conflict is only seen after the batch commits (the same key
 * twice in one batch), and on the shm reserve path.
 *
 * ctest runs this binary over tcp and over shm (ECS_TEST_TRANSPORT), against
 * one real redis-server and ecstore-server.  The server's pool (16 MiB)
 * and request limit (4 MiB) are small so that "too big" is cheap: a 17 MiB
 * item is over both, and good items of 3 + 1 MiB together are over the
 * request limit, so a TCP client must split them into requests that fit.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ecstore/ecstore.h"
#include "store/client/client_internal.h"
#include "support/raw.h"
#include "support/fixture.h"
#include "support/ts.h"

#define KIB 1024u
#define MIB (1024u * 1024u)

/* e->c: exists asks the server; e->cr: exists asks Redis */
typedef ecs_ts_env_t env_t;

static int is_shm(void) {
  return strcmp(ecs_ts_transport(), "shm") == 0;
}

static int setup(void **state) {
  static const char *const extra[] = {"--pool-size",        "16M", "--max-request", "4M",
                                      "--enable-debug-ops", NULL};
  return ecs_ts_group_open(state, extra, 10000);
}

/* One item of a test batch: a key and (for puts) its bytes. */
typedef struct item {
  char key[48];
  uint8_t *data; /* owned */
  uint64_t nbytes;
} item_t;

static void item_make(item_t *it, const char *key, uint64_t nbytes, uint32_t seed) {
  snprintf(it->key, sizeof it->key, "%s-%s", ecs_ts_transport(), key);
  it->nbytes = nbytes;
  it->data = malloc(nbytes ? nbytes : 1);
  assert_non_null(it->data);
  ecs_ts_fill(it->data, nbytes, seed);
}

static ecs_key_t key_of(const item_t *it) {
  return (ecs_key_t){it->key, strlen(it->key)};
}

static ecs_tensor_t tensor_of(const item_t *it) {
  ecs_tensor_t t;
  memset(&t, 0, sizeof t);
  t.data = it->data;
  t.nbytes = it->nbytes;
  t.desc.dtype = ECS_DTYPE_U8;
  t.desc.ndim = 1;
  t.desc.shape[0] = it->nbytes;
  return t;
}

static int put_items(ecs_client_t *c, const item_t *items, size_t n, int *st) {
  ecs_key_t k[16];
  ecs_tensor_t t[16];
  assert_true(n <= 16);
  for (size_t i = 0; i < n; i++) {
    k[i] = key_of(&items[i]);
    t[i] = tensor_of(&items[i]);
  }
  return ecs_put_batch(c, k, t, n, st);
}

/* Gets it into a fresh buffer and checks it byte for byte. */
static void assert_stored(ecs_client_t *c, const item_t *it) {
  ecs_key_t k = key_of(it);
  ecs_get_buf_t b = {.data = malloc(it->nbytes + 1), .capacity = it->nbytes};
  assert_int_equal(ecs_get_batch(c, &k, &b, 1), ECS_OK);
  assert_int_equal(b.status, ECS_OK);
  assert_int_equal(b.nbytes, it->nbytes);
  if (it->nbytes)
    assert_memory_equal(b.data, it->data, it->nbytes);
  free(b.data);
}

static void assert_absent(ecs_client_t *c, const item_t *it) {
  ecs_key_t k = key_of(it);
  int ex = -1;
  assert_int_equal(ecs_exists_batch(c, &k, 1, &ex), ECS_OK);
  assert_int_equal(ex, 0);
}

static void items_free(item_t *items, size_t n) {
  for (size_t i = 0; i < n; i++)
    free(items[i].data);
}

/* ------------------------------------------------------------------ */

enum { P_A, P_CONF, P_B, P_HUGE, P_BADSHAPE, P_C, P_EMPTY, P_N };

/* A put batch with a conflicting, a too-big and a malformed item among
 * good ones of 64 KiB, 3 MiB, 1 MiB and 0 bytes. */
static void test_put_mixed(void **state) {
  env_t *e = *state;
  item_t it[P_N], old;
  item_make(&it[P_A], "put-a", 64 * KIB, 1);
  item_make(&it[P_CONF], "put-conf", 8 * KIB, 2);
  item_make(&it[P_B], "put-b", 3 * MIB, 3);
  item_make(&it[P_HUGE], "put-huge", 17 * MIB, 4);
  item_make(&it[P_BADSHAPE], "put-badshape", 4 * KIB, 5);
  item_make(&it[P_C], "put-c", 1 * MIB, 6);
  item_make(&it[P_EMPTY], "put-empty", 0, 7);
  /* the conflicting key already holds other bytes */
  item_make(&old, "put-conf", 8 * KIB, 99);
  int st1;
  assert_int_equal(put_items(e->c, &old, 1, &st1), ECS_OK);
  assert_int_equal(st1, ECS_OK);

  ecs_key_t k[P_N];
  ecs_tensor_t t[P_N];
  for (int i = 0; i < P_N; i++) {
    k[i] = key_of(&it[i]);
    t[i] = tensor_of(&it[i]);
  }
  t[P_BADSHAPE].desc.shape[0] = 3; /* disagrees with nbytes */
  int st[P_N];
  assert_int_equal(ecs_put_batch(e->c, k, t, P_N, st), ECS_OK);
  const int want[P_N] = {ECS_OK, ECS_ECONFLICT, ECS_OK, ECS_ETOOBIG, ECS_EDTYPE, ECS_OK, ECS_OK};
  for (int i = 0; i < P_N; i++) {
    if (st[i] != want[i])
      fprintf(stderr, "item %d (%s): %s, want %s\n", i, it[i].key, ecs_err_name(st[i]),
              ecs_err_name(want[i]));
    assert_int_equal(st[i], want[i]);
  }
  assert_stored(e->c, &it[P_A]);
  assert_stored(e->c, &it[P_B]);
  assert_stored(e->c, &it[P_C]);
  assert_stored(e->c, &it[P_EMPTY]);
  assert_stored(e->c, &old); /* the conflict changed nothing */
  assert_absent(e->c, &it[P_HUGE]);
  assert_absent(e->c, &it[P_BADSHAPE]);
  /* Redis agrees, item by item */
  int ex[P_N];
  assert_int_equal(ecs_exists_batch(e->cr, k, P_N, ex), ECS_OK);
  for (int i = 0; i < P_N; i++)
    assert_int_equal(ex[i], want[i] == ECS_OK || i == P_CONF);
  items_free(it, P_N);
  items_free(&old, 1);
}

/* The same key twice in one batch with different bytes: the second is only
 * settled after the first commits (server side over tcp, client side over
 * shm), and must be a conflict, not a silent success. */
static void test_put_conflict_after_commit(void **state) {
  env_t *e = *state;
  item_t it[4];
  item_make(&it[0], "dup-good-1", 16 * KIB, 11);
  item_make(&it[1], "dup", 32 * KIB, 12);
  item_make(&it[2], "dup", 32 * KIB, 13); /* same key, other bytes */
  item_make(&it[3], "dup-good-2", 16 * KIB, 14);
  int st[4];
  assert_int_equal(put_items(e->c, it, 4, st), ECS_OK);
  assert_int_equal(st[0], ECS_OK);
  assert_int_equal(st[1], ECS_OK);
  assert_int_equal(st[2], ECS_ECONFLICT);
  assert_int_equal(st[3], ECS_OK);
  assert_stored(e->c, &it[0]);
  assert_stored(e->c, &it[1]);
  assert_stored(e->c, &it[3]);
  /* and again, now that the key is committed: conflict, retry is fine */
  int st2[3];
  item_t again[3] = {it[3], it[2], it[1]};
  assert_int_equal(put_items(e->c, again, 3, st2), ECS_OK);
  assert_int_equal(st2[0], ECS_OK);
  assert_int_equal(st2[1], ECS_ECONFLICT);
  assert_int_equal(st2[2], ECS_OK);
  assert_stored(e->c, &it[1]);
  items_free(it, 4);
}

enum { G_A, G_MISS, G_B, G_CORRUPT, G_C, G_BADKEY, G_SMALL, G_N };

/* Stores the good and the corrupt objects of the get tests. */
static void store_get_set(env_t *e, item_t *it, const char *tag) {
  char name[32];
  const uint64_t sizes[G_N] = {100 * KIB, 0, 2 * MIB, 256 * KIB, 4 * KIB, 0, 128 * KIB};
  for (int i = 0; i < G_N; i++) {
    snprintf(name, sizeof name, "%s-%d", tag, i);
    item_make(&it[i], name, sizes[i], 100 + (uint32_t)i);
    if (i == G_MISS || i == G_BADKEY)
      continue;
    int st;
    assert_int_equal(put_items(e->c, &it[i], 1, &st), ECS_OK);
    assert_int_equal(st, ECS_OK);
  }
  it[G_BADKEY].key[0] = '\0'; /* an empty key */
  assert_int_equal(ecs__client_debug_corrupt(e->c, it[G_CORRUPT].key, strlen(it[G_CORRUPT].key)), ECS_OK);
}

static void check_get(const item_t *it, const ecs_get_buf_t *b, int alloc) {
  const int want[G_N] = {
      ECS_OK, ECS_ENOTFOUND, ECS_OK, ECS_ECHECKSUM, ECS_OK, ECS_EKEY, alloc ? ECS_OK : ECS_EBUFSMALL};
  for (int i = 0; i < G_N; i++) {
    if (b[i].status != want[i])
      fprintf(stderr, "item %d: %s, want %s\n", i, ecs_err_name(b[i].status), ecs_err_name(want[i]));
    assert_int_equal(b[i].status, want[i]);
    if (want[i] == ECS_OK) {
      assert_int_equal(b[i].nbytes, it[i].nbytes);
      assert_memory_equal(b[i].data, it[i].data, it[i].nbytes);
    } else if (want[i] == ECS_EBUFSMALL) {
      assert_int_equal(b[i].nbytes, it[i].nbytes); /* the size needed */
    } else {
      assert_int_equal(b[i].nbytes, 0);
      if (alloc)
        assert_null(b[i].data);
    }
  }
}

static void test_get_mixed(void **state) {
  env_t *e = *state;
  item_t it[G_N];
  store_get_set(e, it, "get");
  ecs_key_t k[G_N];
  ecs_get_buf_t b[G_N];
  uint8_t *out[G_N];
  for (int round = 0; round < 2; round++) { /* the connection stays usable */
    for (int i = 0; i < G_N; i++) {
      k[i] = key_of(&it[i]);
      out[i] = malloc(it[i].nbytes + 1);
      b[i] = (ecs_get_buf_t){.data = out[i], .capacity = i == G_SMALL ? it[i].nbytes - 1 : it[i].nbytes};
    }
    assert_int_equal(ecs_get_batch(e->c, k, b, G_N), ECS_OK);
    check_get(it, b, 0);
    for (int i = 0; i < G_N; i++)
      free(out[i]);
    for (int i = 0; i < G_N; i++)
      b[i] = (ecs_get_buf_t){.data = NULL, .capacity = 0};
    assert_int_equal(ecs_get_batch_alloc(e->c, k, b, G_N), ECS_OK);
    check_get(it, b, 1);
    for (int i = 0; i < G_N; i++)
      ecs_free(b[i].data);
  }
  items_free(it, G_N);
}

/* Views (shm only; over tcp every item says ENOTSUP, never a wrong OK). */
static void test_view_mixed(void **state) {
  env_t *e = *state;
  item_t it[G_N];
  store_get_set(e, it, "view");
  ecs_key_t k[G_N];
  ecs_view_t v[G_N];
  for (int i = 0; i < G_N; i++)
    k[i] = key_of(&it[i]);
  assert_int_equal(ecs_get_view_batch(e->c, k, v, G_N), ECS_OK);
  for (int i = 0; i < G_N; i++) {
    int want = i == G_BADKEY    ? ECS_EKEY
               : !is_shm()      ? ECS_ENOTSUP
               : i == G_MISS    ? ECS_ENOTFOUND
               : i == G_CORRUPT ? ECS_ECHECKSUM
                                : ECS_OK;
    if (v[i].status != want)
      fprintf(stderr, "view %d: %s, want %s\n", i, ecs_err_name(v[i].status), ecs_err_name(want));
    assert_int_equal(v[i].status, want);
    if (want == ECS_OK) {
      assert_int_equal(v[i].nbytes, it[i].nbytes);
      assert_memory_equal(v[i].data, it[i].data, it[i].nbytes);
    } else {
      assert_null(v[i].data);
    }
  }
  assert_int_equal(ecs_view_release(e->c, v, G_N), ECS_OK);
  items_free(it, G_N);
}

/* exists (server and Redis) and remove, with missing and bad keys among
 * stored ones; a removal takes exactly its own items. */
static void test_exists_remove_mixed(void **state) {
  env_t *e = *state;
  item_t it[5];
  item_make(&it[0], "rm-a", 8 * KIB, 21);
  item_make(&it[1], "rm-missing", 8 * KIB, 22);
  item_make(&it[2], "rm-b", 8 * KIB, 23);
  item_make(&it[3], "rm-bad", 8 * KIB, 24);
  item_make(&it[4], "rm-c", 8 * KIB, 25);
  int st[5];
  for (int i = 0; i < 5; i += 2) {
    assert_int_equal(put_items(e->c, &it[i], 1, st), ECS_OK);
    assert_int_equal(st[0], ECS_OK);
  }
  it[3].key[0] = '\0';
  ecs_key_t k[5];
  for (int i = 0; i < 5; i++)
    k[i] = key_of(&it[i]);
  int ex[5];
  for (int r = 0; r < 2; r++) {
    assert_int_equal(ecs_exists_batch(r ? e->cr : e->c, k, 5, ex), ECS_OK);
    for (int i = 0; i < 5; i++)
      assert_int_equal(ex[i], i % 2 == 0);
  }
  /* remove a, missing, bad, c: b stays */
  ecs_key_t rk[4] = {k[0], k[1], k[3], k[4]};
  assert_int_equal(ecs_remove_batch(e->c, rk, 4, st), ECS_OK);
  assert_int_equal(st[0], ECS_OK);
  assert_int_equal(st[1], ECS_ENOTFOUND);
  assert_int_equal(st[2], ECS_EKEY);
  assert_int_equal(st[3], ECS_OK);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(ecs_exists_batch(r ? e->cr : e->c, k, 5, ex), ECS_OK);
    for (int i = 0; i < 5; i++)
      assert_int_equal(ex[i], i == 2);
  }
  assert_stored(e->c, &it[2]);
  items_free(it, 5);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_put_mixed),           cmocka_unit_test(test_put_conflict_after_commit),
      cmocka_unit_test(test_get_mixed),           cmocka_unit_test(test_view_mixed),
      cmocka_unit_test(test_exists_remove_mixed),
  };
  return cmocka_run_group_tests_name(ecs_ts_transport(), tests, setup, ecs_ts_group_close);
}
