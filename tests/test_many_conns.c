/*
 * Many connections over several server threads (--threads 4), every byte
 * verified, while eviction runs all the time: 16 client threads on their
 * own connections put (insert or replace) and get objects of random sizes
 * into a 16 MiB pool that holds a small part of what is written, and four
 * of them hold shm views (leases) across other clients' puts.
 *
 * Every object carries its own proof: its first 16 bytes name its key (a
 * hash) and the seed of the rest, so any reader can check any object it
 * gets, whoever wrote it and whenever: a block freed and reused under a
 * reader, a payload read into the wrong block, or a reply mixing two
 * objects all show as a mismatch.  Views must not change while held.
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
#include <sys/uio.h>
#include <unistd.h>

#include <cmocka.h>

#include "ecstore/error.h"
#include "ecstore/ecstore.h"
#include "store/core/net.h"
#include "support/fixture.h"
#include "support/ts.h"

#define NCLIENTS 16 /* client threads, one connection each (two for the view holders) */
#define NVIEWERS 4  /* of them, those that also hold shm views */
#define KEYS_PER 64 /* keys each client writes */
#define ITERS 600   /* operations per client */
#define MAX_OBJ (96u << 10)
#define HOLD 3 /* views held at once by a viewer */

static char g_servers[64];

static uint64_t mix(uint64_t x) { /* splitmix64 */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static uint64_t key_hash(const char *k) {
  uint64_t h = 1469598103934665603ull;
  for (; *k; k++)
    h = (h ^ (uint8_t)*k) * 1099511628211ull;
  return h;
}

/* The object of key k, version seed, n >= 16 bytes. */
static void make_obj(uint8_t *p, size_t n, const char *k, uint64_t seed) {
  uint64_t kh = key_hash(k);
  memcpy(p, &kh, 8);
  memcpy(p + 8, &seed, 8);
  uint64_t x = seed ^ n;
  for (size_t i = 16; i < n; i += 8) {
    x = mix(x);
    size_t m = n - i < 8 ? n - i : 8;
    memcpy(p + i, &x, m);
  }
}

/* Whether p[0..n) is an object make_obj wrote for key k. */
static int obj_ok(const uint8_t *p, size_t n, const char *k) {
  if (n < 16)
    return 0;
  uint64_t kh, seed;
  memcpy(&kh, p, 8);
  memcpy(&seed, p + 8, 8);
  if (kh != key_hash(k))
    return 0;
  uint64_t x = seed ^ n;
  for (size_t i = 16; i < n; i += 8) {
    x = mix(x);
    size_t m = n - i < 8 ? n - i : 8;
    if (memcmp(p + i, &x, m) != 0)
      return 0;
  }
  return 1;
}

typedef struct worker {
  int id;            /* 0..NCLIENTS-1 */
  pthread_t th;      /* its thread */
  uint64_t rng;      /* its random state */
  unsigned puts_ok;  /* puts answered OK */
  unsigned gets_ok;  /* gets that found (and verified) an object */
  unsigned views_ok; /* views held and verified */
  char err[256];     /* the first failure, or "" */
} worker_t;

static uint64_t rnd(worker_t *w) {
  return w->rng = mix(w->rng);
}

static ecs_client_t *client(const char *transport) {
  ecs_client_config_t cfg;
  ecs_ts_client_config(&cfg, g_servers, transport);
  cfg.timeout_ms = 20000;
  return ecs_ts_connect(&cfg);
}

static void key_of(char *buf, size_t cap, int owner, int i) {
  snprintf(buf, cap, "mc-%d-%d", owner, i);
}

static int put_one(worker_t *w, ecs_client_t *c, uint8_t *buf) {
  char k[32];
  key_of(k, sizeof k, w->id, (int)(rnd(w) % KEYS_PER));
  size_t n = 16 + (size_t)(rnd(w) % (MAX_OBJ - 16));
  make_obj(buf, n, k, rnd(w));
  ecs_key_t key = {k, strlen(k)};
  ecs_tensor_t t = {.data = buf, .nbytes = n};
  t.desc.dtype = ECS_DTYPE_U8;
  t.desc.ndim = 1;
  t.desc.shape[0] = n;
  int st = -999;
  int rc = ecs_upsert_batch(c, &key, &t, 1, &st);
  if (rc == ECS_OK && st == ECS_OK) {
    w->puts_ok++;
    return 0;
  }
  /* EBUSY: the pool is momentarily all pinned or being written; not a fault */
  if (rc == ECS_OK && (st == ECS_EBUSY || st == ECS_ENOSPC))
    return 0;
  snprintf(w->err, sizeof w->err, "upsert %s (%zu bytes): rc %s, status %s", k, n, ecs_strerror(rc),
           ecs_strerror(st));
  return -1;
}

static int get_one(worker_t *w, ecs_client_t *c, uint8_t *buf) {
  char k[32];
  key_of(k, sizeof k, (int)(rnd(w) % NCLIENTS), (int)(rnd(w) % KEYS_PER));
  ecs_key_t key = {k, strlen(k)};
  ecs_get_buf_t b = {.data = buf, .capacity = MAX_OBJ};
  int rc = ecs_get_batch(c, &key, &b, 1);
  if (rc != ECS_OK) {
    snprintf(w->err, sizeof w->err, "get %s: %s", k, ecs_strerror(rc));
    return -1;
  }
  if (b.status == ECS_ENOTFOUND)
    return 0; /* never written yet, or evicted */
  if (b.status != ECS_OK) {
    snprintf(w->err, sizeof w->err, "get %s: status %s", k, ecs_strerror(b.status));
    return -1;
  }
  if (!obj_ok(buf, (size_t)b.nbytes, k)) {
    snprintf(w->err, sizeof w->err, "get %s: %llu bytes that are not the object's", k,
             (unsigned long long)b.nbytes);
    return -1;
  }
  w->gets_ok++;
  return 0;
}

/* Holds views on HOLD random keys across a few of its own puts and gets
 * (other clients evict meanwhile), checking them before and after. */
static int view_round(worker_t *w, ecs_client_t *shm, ecs_client_t *c, uint8_t *buf) {
  char names[HOLD][32];
  ecs_key_t k[HOLD];
  ecs_view_t v[HOLD];
  for (int i = 0; i < HOLD; i++) {
    key_of(names[i], sizeof names[i], (int)(rnd(w) % NCLIENTS), (int)(rnd(w) % KEYS_PER));
    k[i] = (ecs_key_t){names[i], strlen(names[i])};
  }
  memset(v, 0, sizeof v);
  int rc = ecs_get_view_batch(shm, k, v, HOLD);
  if (rc != ECS_OK) {
    snprintf(w->err, sizeof w->err, "get_view_batch: %s", ecs_strerror(rc));
    return -1;
  }
  for (int i = 0; i < HOLD; i++)
    if (v[i].status == ECS_OK && !obj_ok(v[i].data, (size_t)v[i].nbytes, names[i])) {
      snprintf(w->err, sizeof w->err, "view of %s: not the object's bytes", names[i]);
      return -1;
    }
  for (int j = 0; j < 4; j++)
    if (put_one(w, c, buf) || get_one(w, c, buf))
      return -1;
  for (int i = 0; i < HOLD; i++) {
    if (v[i].status != ECS_OK)
      continue;
    if (!obj_ok(v[i].data, (size_t)v[i].nbytes, names[i])) {
      snprintf(w->err, sizeof w->err,
               "view of %s changed while held (evicted or overwritten under its reader)", names[i]);
      return -1;
    }
    w->views_ok++;
  }
  ecs_view_release(shm, v, HOLD);
  return 0;
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  uint8_t *buf = malloc(MAX_OBJ);
  ecs_client_t *c = client("tcp");
  ecs_client_t *shm = w->id < NVIEWERS ? client("shm") : NULL;
  if (!buf || !c || (w->id < NVIEWERS && !shm)) {
    snprintf(w->err, sizeof w->err, "client %d: cannot connect", w->id);
    goto out;
  }
  for (int i = 0; i < ITERS; i++) {
    uint64_t r = rnd(w) % 16;
    int bad = shm && r == 0 ? view_round(w, shm, c, buf) : r < 7 ? put_one(w, c, buf) : get_one(w, c, buf);
    if (bad)
      break;
  }
out:
  ecs_client_close(shm);
  ecs_client_close(c);
  free(buf);
  return NULL;
}

static void test_many_conns_under_eviction(void **state) {
  (void)state;
  ecs_ts_env_t env;
  static const char *const extra[] = {"--threads", "4", "--pool-size", "16M", NULL};
  assert_int_equal(ecs_ts_env_start(&env, extra), 0);
  snprintf(g_servers, sizeof g_servers, "%s", env.servers);
  static worker_t w[NCLIENTS];
  memset(w, 0, sizeof w);
  for (int i = 0; i < NCLIENTS; i++) {
    w[i].id = i;
    w[i].rng = 0x1234u + (uint64_t)i * 7919u;
    assert_int_equal(pthread_create(&w[i].th, NULL, worker_main, &w[i]), 0);
  }
  unsigned puts = 0, gets = 0, views = 0;
  for (int i = 0; i < NCLIENTS; i++) {
    pthread_join(w[i].th, NULL);
    if (w[i].err[0])
      fail_msg("client %d: %s", i, w[i].err);
    puts += w[i].puts_ok;
    gets += w[i].gets_ok;
    views += w[i].views_ok;
  }
  print_message("%u puts, %u verified gets, %u verified held views\n", puts, gets, views);
  ecs_client_t *c = client("tcp");
  assert_non_null(c);
  ecs_server_stat_t st;
  assert_int_equal(ecs_stat(c, 0, &st), ECS_OK);
  print_message("evictions %llu, objects %llu\n", (unsigned long long)st.evictions,
                (unsigned long long)st.objects);
  /* the pool really turned over, and the checks really ran */
  assert_true(st.evictions > 100);
  assert_true(gets > 100);
  assert_true(views > 0);
  ecs_client_close(c);
  assert_int_equal(ecs_ts_env_stop(&env), 0);
}

/* --threads reaches the server (its /metrics says how many loops run and
 * that the lock is taken), and a bad value is refused with the range. */
static void test_threads_option(void **state) {
  (void)state;
  ecs_ts_proc_t srv = {0};
  int mport = ecs_ts_free_port();
  char mlisten[32];
  snprintf(mlisten, sizeof mlisten, "127.0.0.1:%d", mport);
  assert_int_equal(ecs_ts_server_start(&srv, 1,
                                       (const char *const[]){"--redis", "none", "--threads", "3",
                                                             "--metrics-listen", mlisten, NULL}),
                   0);
  assert_true(ecs_ts_metric(mport, "ecstore_threads") == 3);
  assert_true(ecs_ts_metric(mport, "ecstore_lock_acquisitions_total") >= 0);
  assert_int_equal(ecs_ts_stop(&srv, 5000), 0);

  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "'%s' --threads 0 --redis none 2>&1 | grep -q -- \"--threads '0': expected 1..256\"",
           ecs_ts_bin("ecstore-server"));
  assert_int_equal(system(cmd), 0);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_many_conns_under_eviction),
      cmocka_unit_test(test_threads_option),
  };
  return cmocka_run_group_tests_name("many_conns", tests, NULL, NULL);
}
