/*
 * test_store_eviction: Eviction with readers: FIFO order when the pool is full, and background
 * eviction between the watermarks, while other clients read and check
 * every byte they get (each test starts its own server).
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

typedef struct reader_arg {
  const char *servers;
  atomic_int stop;
  atomic_long ok, miss, bad;
} reader_arg_t;

/* Reads random keys of the eviction test and checks every byte it gets. */
static void *reader(void *p) {
  reader_arg_t *ra = p;
  ecs_client_t *c = ecs_ts_client(ra->servers, NULL, NULL, 5000);
  if (!c) {
    ra->bad++;
    return NULL;
  }
  size_t n = MIB;
  uint8_t *buf = malloc(n), *want = malloc(n);
  unsigned seed = 1;
  while (!ra->stop) {
    int i = (int)(rand_r(&seed) % 60);
    char key[32];
    snprintf(key, sizeof key, "ev-%d", i);
    uint64_t got = 0;
    int st = ecs_ts_get1(c, key, buf, n, &got);
    if (st == ECS_ENOTFOUND) {
      ra->miss++;
      continue;
    }
    ecs_ts_fill(want, n, 5000 + (uint32_t)i);
    if (st == ECS_OK && got == n && memcmp(buf, want, n) == 0)
      ra->ok++;
    else
      ra->bad++;
  }
  free(buf);
  free(want);
  ecs_client_close(c);
  return NULL;
}

static void test_fifo_eviction(void **state) {
  (void)state;
  ecs_ts_env_t e;
  /* 16 MiB pool, 1 MiB objects: no background eviction (high watermark 1.0) */
  static const char *const extra[] = {"--pool-size", "16M", "--high-watermark", "1.0", "--low-watermark",
                                      "1.0",         NULL};
  assert_int_equal(ecs_ts_env_open(&e, extra, 5000), 0);
  redisContext *r = ecs_ts_redis_at(e.redis.port);
  assert_non_null(r);
  reader_arg_t ra = {.servers = e.servers};
  pthread_t th;
  uint8_t *obj = malloc(MIB);
  /* the reader starts once a few objects exist */
  for (int i = 0; i < 60; i++) {
    char key[32];
    snprintf(key, sizeof key, "ev-%d", i);
    ecs_ts_fill(obj, MIB, 5000 + (uint32_t)i);
    assert_int_equal(ecs_ts_put1(e.c, key, obj, MIB, ECS_DTYPE_U8), ECS_OK);
    if (i == 4)
      assert_int_equal(pthread_create(&th, NULL, reader, &ra), 0);
  }
  ra.stop = 1;
  pthread_join(th, NULL);
  free(obj);
  /* concurrent readers never saw a freed or reused block */
  assert_int_equal(ra.bad, 0);
  assert_true(ra.ok > 0);

  /* FIFO: a prefix of the oldest objects is gone, the newest remain */
  int present[60];
  int first_present = -1;
  for (int i = 0; i < 60; i++) {
    char key[32];
    snprintf(key, sizeof key, "ev-%d", i);
    ecs_key_t k = {key, strlen(key)};
    assert_int_equal(ecs_exists_batch(e.c, &k, 1, &present[i]), ECS_OK);
    if (present[i] && first_present < 0)
      first_present = i;
    /* Redis agrees: evicted objects left Redis too */
    assert_int_equal(ecs_ts_redis_exists(r, key), present[i]);
  }
  assert_true(first_present > 40); /* at most ~16 of 60 fit */
  for (int i = first_present; i < 60; i++)
    assert_true(present[i]);
  ecs_server_stat_t st = ecs_ts_stat0(e.c);
  assert_true(st.evictions >= 40);
  /* an object larger than the pool is refused clearly */
  uint8_t *big = calloc(1, 17 * MIB);
  assert_int_equal(ecs_ts_put1(e.c, "too-big", big, 17 * MIB, ECS_DTYPE_U8), ECS_ETOOBIG);
  free(big);
  redisFree(r);
  assert_int_equal(ecs_ts_env_close(&e), 0);
}

static void test_background_eviction(void **state) {
  (void)state;
  ecs_ts_env_t e;
  static const char *const extra[] = {"--pool-size", "16M", "--high-watermark", "0.5", "--low-watermark",
                                      "0.25",        NULL};
  assert_int_equal(ecs_ts_env_open(&e, extra, 5000), 0);
  /* 7 MiB, under the high watermark (8 MiB): nothing is evicted */
  uint8_t *obj = calloc(5, MIB);
  assert_non_null(obj);
  for (int i = 0; i < 7; i++) {
    char key[16];
    snprintf(key, sizeof key, "bg-%d", i);
    assert_int_equal(ecs_ts_put1(e.c, key, obj, MIB, ECS_DTYPE_U8), ECS_OK);
  }
  ecs_server_stat_t st = ecs_ts_stat0(e.c);
  assert_int_equal(st.evictions, 0);
  /* then one 5 MiB object, one request (the client splits a batch into
   * requests, but never an item): the fill jumps above the high watermark
   * in one commit and the loop must bring it to the low one (4 MiB),
   * evicting FIFO: the seven, then the big one */
  assert_int_equal(ecs_ts_put1(e.c, "big", obj, 5 * MIB, ECS_DTYPE_U8), ECS_OK);
  free(obj);
  for (int i = 0; i < 250; i++) { /* the loop evicts within a tick or two */
    st = ecs_ts_stat0(e.c);
    if (st.bytes_in_use <= 4 * MIB)
      break;
    usleep(20000);
  }
  if (st.bytes_in_use > 4 * MIB)
    fprintf(stderr, "background eviction stopped short: %llu bytes in use, %llu objects, %llu evicted\n",
            (unsigned long long)st.bytes_in_use, (unsigned long long)st.objects,
            (unsigned long long)st.evictions);
  assert_true(st.bytes_in_use <= 4 * MIB);
  assert_true(st.evictions >= 8);
  assert_int_equal(ecs_ts_env_close(&e), 0);
}

/* Calls Redis counted for command cmd since the last CONFIG RESETSTAT
 * (INFO commandstats), 0 when it has none, -1 on error. */
static long long redis_calls(redisContext *r, const char *cmd) {
  redisReply *rep = redisCommand(r, "INFO commandstats");
  if (rep == NULL || rep->type != REDIS_REPLY_STRING) {
    if (rep)
      freeReplyObject(rep);
    return -1;
  }
  char pat[64];
  snprintf(pat, sizeof pat, "cmdstat_%s:calls=", cmd);
  const char *p = strstr(rep->str, pat);
  long long n = p ? atoll(p + strlen(pat)) : 0;
  freeReplyObject(rep);
  return n;
}

/* Puts one object of n bytes (one request, one item). */
static void put_big(ecs_client_t *c, const char *key, size_t n) {
  uint8_t *a = malloc(n);
  assert_non_null(a);
  ecs_ts_fill(a, n, 77);
  assert_int_equal(ecs_ts_put1(c, key, a, n, ECS_DTYPE_U8), ECS_OK);
  free(a);
}

/* Polls Redis (at most ~5 s) until key's record is there (want 1) or not. */
static long long record_settles(redisContext *r, const char *key, long long want) {
  long long got = -1;
  for (int i = 0; i < 100 && (got = ecs_ts_redis_exists(r, key)) != want; i++)
    usleep(50000);
  return got;
}

/* The records of the first n "old-{i}" objects are gone from Redis. */
static void old_records_gone(redisContext *r, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) {
    char k[16];
    snprintf(k, sizeof k, "old-%d", (int)i);
    assert_int_equal(record_settles(r, k, 0), 0);
  }
}

/* The records of everything one put evicts are deleted by one script call
 * (EVALSHA of the delete script over all the keys), not one EVAL per key;
 * and after SCRIPT FLUSH (NOSCRIPT) the deletes still happen. */
static void test_eviction_deletes_batched(void **state) {
  (void)state;
  ecs_ts_env_t e;
  /* no background eviction: only the put's own reservations evict */
  static const char *const extra[] = {"--pool-size", "16M", "--high-watermark", "1", "--low-watermark",
                                      "1",           NULL};
  assert_int_equal(ecs_ts_env_open(&e, extra, 10000), 0);
  redisContext *r = ecs_ts_redis_at(e.redis.port);
  assert_non_null(r);
  for (int i = 0; i < 32; i++) { /* fills the pool, one put each */
    char k[16];
    snprintf(k, sizeof k, "old-%d", i);
    put_big(e.c, k, 512 * 1024);
  }
  uint64_t ev0 = ecs_ts_stat0(e.c).evictions;
  freeReplyObject(redisCommand(r, "CONFIG RESETSTAT"));
  put_big(e.c, "big-0", 4 * MIB); /* one request: evicts at least 8 old ones */
  uint64_t evicted = ecs_ts_stat0(e.c).evictions - ev0;
  assert_true(evicted >= 8 && evicted < 32);
  old_records_gone(r, evicted);
  assert_int_equal(ecs_ts_redis_exists(r, "old-31"), 1); /* not evicted: its record stays */
  long long sha_calls = redis_calls(r, "evalsha"), eval_calls = redis_calls(r, "eval");
  if (sha_calls != 1 || eval_calls > 1)
    fprintf(stderr, "%llu evictions: %lld EVALSHA and %lld EVAL calls (want 1 and 0)\n",
            (unsigned long long)evicted, sha_calls, eval_calls);
  assert_int_equal(sha_calls, 1);
  /* (the start-up re-sync sweep's check script may run meanwhile: one EVAL) */
  assert_true(eval_calls <= 1);

  /* Redis forgets the script: the next evictions' deletes still land */
  freeReplyObject(redisCommand(r, "SCRIPT FLUSH"));
  put_big(e.c, "big-1", 4 * MIB);
  uint64_t evicted2 = ecs_ts_stat0(e.c).evictions - ev0;
  assert_true(evicted2 > evicted && evicted2 < 32);
  old_records_gone(r, evicted2);
  /* ...and so does a REMOVE's, answered once it is acknowledged */
  freeReplyObject(redisCommand(r, "SCRIPT FLUSH"));
  ecs_key_t k = {"old-31", 6};
  int st = -1, ex = -1;
  assert_int_equal(ecs_remove_batch(e.c, &k, 1, &st), ECS_OK);
  assert_int_equal(st, ECS_OK);
  assert_int_equal(ecs_exists_batch(e.cr, &k, 1, &ex), ECS_OK);
  assert_int_equal(ex, 0);
  assert_int_equal(ecs_ts_redis_exists(r, "old-30"), 1);
  redisFree(r);
  assert_int_equal(ecs_ts_env_close(&e), 0);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fifo_eviction),
      cmocka_unit_test(test_background_eviction),
      cmocka_unit_test(test_eviction_deletes_batched),
  };
  return cmocka_run_group_tests_name("store_eviction", tests, NULL, NULL) ? 1 : 0;
}
