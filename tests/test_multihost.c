/*
 * test_multihost: servers discovered from Redis's node registry, puts placed
 * by policy, gets located in Redis and fetched from several servers at once
 * (issue 14; docs/multihost.md).  Loopback only: every server and Redis on
 * 127.0.0.1 (the network-namespace version is tests/multihost_netns.sh).
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "ecstore/ecstore.h"
#include "store/core/net.h"
#include "support/fixture.h"
#include "support/objset.h"
#include "support/raw.h"

#define NOBJ 96
#define OBJ_BYTES ECS_OBJSET_BYTES
#define MAXS 5

typedef ecs_mfx_t fx_t;
_Static_assert(MAXS <= ECS_MFX_MAX_SERVERS, "the shared fixture's servers");
#define fx_setup ecs_mfx_setup
#define fx_teardown ecs_mfx_teardown

/* A server with a short registry TTL, so a killed one leaves the registry
 * within the test. */
static void start_server(fx_t *f, int i, const char *pool) {
  const char *extra[] = {"--heartbeat-ttl", "2", "--pool-size", pool ? pool : "64M", NULL};
  assert_int_equal(ecs_ts_server_start(&f->srv[i], f->redis.port, extra), 0);
}

static ecs_client_t *discover_client(fx_t *f, const char *placement) {
  char url[64];
  snprintf(url, sizeof url, "127.0.0.1:%d", f->redis.port);
  ecs_client_config_t cfg;
  ecs_ts_client_config(&cfg, NULL, ecs_ts_transport());
  cfg.servers = NULL; /* only Redis: discovery */
  cfg.redis_url = url;
  cfg.placement = placement;
  cfg.registry_refresh_ms = 200;
  cfg.timeout_ms = 3000;
  cfg.connect_timeout_ms = 1000;
  return ecs_ts_connect(&cfg);
}

static void key_of(char *out, size_t cap, const char *pfx, int i) {
  ecs_objset_key(out, cap, pfx, i);
}

/* Puts n objects "pfx-i"; every status must be OK, or with
 * unpublished_ok also ECS_EREDIS: with Redis gone, an item stored but
 * whose record Redis did not acknowledge (docs/redis-schema.md, "Writes"). */
static void put_all_ex(ecs_client_t *c, const char *pfx, int n, uint32_t salt, int unpublished_ok) {
  int *st = calloc((size_t)n, sizeof *st);
  assert_non_null(st);
  assert_int_equal(ecs_objset_put(c, pfx, n, salt, st, 0), ECS_OK);
  for (int i = 0; i < n; i++)
    if (!(unpublished_ok && st[i] == ECS_EREDIS))
      assert_int_equal(st[i], ECS_OK);
  free(st);
}

static void put_all(ecs_client_t *c, const char *pfx, int n, uint32_t salt) {
  put_all_ex(c, pfx, n, salt, 0);
}

/* Gets n objects "pfx-i" in one batch; statuses into st; every OK one's
 * bytes are checked against its pattern (nothing wrong is ever returned). */
static int get_all(ecs_client_t *c, const char *pfx, int n, uint32_t salt, int *st) {
  return ecs_objset_get(c, pfx, n, salt, st);
}

/* The node id a key's Redis record names, into out ("" when none). */
static void holder(fx_t *f, const char *key, char *out, size_t cap) {
  redisReply *r = redisCommand(f->r, "HGET ecs:{test}:obj:%s node", key);
  assert_non_null(r);
  snprintf(out, cap, "%s", r->type == REDIS_REPLY_STRING ? r->str : "");
  freeReplyObject(r);
}

static void node_of(const fx_t *f, int i, char *out, size_t cap) {
  snprintf(out, cap, "127.0.0.1:%d", f->srv[i].port); /* the default node id: the listen address */
}

/* Waits (bounded) until the client sees want live servers. */
static void wait_servers(ecs_client_t *c, size_t want) {
  for (int t = 0; t < 100 && ecs_client_server_count(c) < want; t++) {
    usleep(50 * 1000);
    ecs_ping(c);
  }
  assert_int_equal(ecs_client_server_count(c), want);
}

static void test_discovery_and_join(void **state) {
  fx_t *f = *state;
  start_server(f, 0, NULL);
  ecs_client_t *c = discover_client(f, "hash");
  assert_non_null(c);
  assert_int_equal(ecs_client_server_count(c), 1);
  put_all(c, "a", 32, 1);
  int st[NOBJ];
  assert_int_equal(get_all(c, "a", 32, 1, st), ECS_OK);
  for (int i = 0; i < 32; i++)
    assert_int_equal(st[i], ECS_OK);
  /* A second server joins: the same client sees it without a restart,
   * new puts reach it, and a second client (a reader) finds both. */
  start_server(f, 1, NULL);
  wait_servers(c, 2);
  put_all(c, "b", NOBJ, 2);
  char node1[64], who[64], key[32];
  node_of(f, 1, node1, sizeof node1);
  int on1 = 0;
  for (int i = 0; i < NOBJ; i++) {
    key_of(key, sizeof key, "b", i);
    holder(f, key, who, sizeof who);
    on1 += !strcmp(who, node1);
  }
  assert_true(on1 > NOBJ / 5 && on1 < NOBJ * 4 / 5); /* about half */
  ecs_client_t *r = discover_client(f, NULL);
  assert_non_null(r);
  assert_int_equal(get_all(r, "b", NOBJ, 2, st), ECS_OK);
  for (int i = 0; i < NOBJ; i++)
    assert_int_equal(st[i], ECS_OK);
  assert_int_equal(get_all(r, "a", 32, 1, st), ECS_OK);
  for (int i = 0; i < 32; i++)
    assert_int_equal(st[i], ECS_OK);
  /* views: located the same way, leased on each holder (shm only) */
  ecs_key_t vk[NOBJ];
  ecs_view_t views[NOBJ];
  char vnames[NOBJ][32];
  for (int i = 0; i < NOBJ; i++) {
    key_of(vnames[i], sizeof vnames[i], "b", i);
    vk[i] = (ecs_key_t){vnames[i], strlen(vnames[i])};
  }
  int shm = !strcmp(ecs_ts_transport(), "shm");
  assert_int_equal(ecs_get_view_batch(r, vk, views, NOBJ), ECS_OK);
  uint8_t want[OBJ_BYTES];
  for (int i = 0; i < NOBJ; i++) {
    assert_int_equal(views[i].status, shm ? ECS_OK : ECS_ENOTSUP);
    if (shm) {
      ecs_objset_fill(want, i, 2);
      assert_int_equal(views[i].nbytes, OBJ_BYTES);
      assert_memory_equal(views[i].data, want, OBJ_BYTES);
    }
  }
  assert_int_equal(ecs_view_release(r, views, NOBJ), ECS_OK);
  /* exists and remove find the holders too */
  ecs_key_t k = {"b-0003", 6};
  int ex = 0, rs = 0;
  assert_int_equal(ecs_exists_batch(r, &k, 1, &ex), ECS_OK);
  assert_int_equal(ex, 1);
  assert_int_equal(ecs_remove_batch(r, &k, 1, &rs), ECS_OK);
  assert_int_equal(rs, ECS_OK);
  assert_int_equal(ecs_exists_batch(r, &k, 1, &ex), ECS_OK);
  assert_int_equal(ex, 0);
  ecs_client_close(r);
  ecs_client_close(c);
  /* the CLI with only --redis and --ns, as a shell user runs it */
  char dir[256], cmd[1600], in[300], out[300];
  assert_int_equal(ecs_ts_mkdtemp(dir, sizeof dir), 0);
  snprintf(in, sizeof in, "%s/in", dir);
  snprintf(out, sizeof out, "%s/out", dir);
  uint8_t blob[5000];
  ecs_ts_fill(blob, sizeof blob, 77);
  FILE *fp = fopen(in, "wb");
  assert_non_null(fp);
  assert_int_equal(fwrite(blob, 1, sizeof blob, fp), sizeof blob);
  fclose(fp);
  const char *cli = ecs_ts_bin("ecstore-cli");
  snprintf(cmd, sizeof cmd,
           "env -u ECSTORE_SERVERS %s --redis 127.0.0.1:%d --ns test --placement least-loaded put cli-k %s "
           ">/dev/null && env -u ECSTORE_SERVERS %s --redis 127.0.0.1:%d --ns test get cli-k %s >/dev/null",
           cli, f->redis.port, in, cli, f->redis.port, out);
  assert_int_equal(system(cmd), 0);
  uint8_t back[sizeof blob + 1];
  fp = fopen(out, "rb");
  assert_non_null(fp);
  assert_int_equal(fread(back, 1, sizeof back, fp), sizeof blob);
  fclose(fp);
  assert_memory_equal(back, blob, sizeof blob);
  unlink(in);
  unlink(out);
  rmdir(dir);
}

/* Rendezvous hashing: a fourth server takes about a quarter of the keys,
 * and every key that moves, moves to it. */
static void test_hash_join_moves_its_share(void **state) {
  fx_t *f = *state;
  for (int i = 0; i < 3; i++)
    start_server(f, i, NULL);
  ecs_client_t *c = discover_client(f, "hash");
  assert_non_null(c);
  assert_int_equal(ecs_client_server_count(c), 3);
  enum { N = 400 };
  put_all(c, "h", N, 3);
  static char before[N][64];
  char key[32], who[64], node3[64];
  for (int i = 0; i < N; i++) {
    key_of(key, sizeof key, "h", i);
    holder(f, key, before[i], sizeof before[i]);
    assert_true(before[i][0] != '\0');
  }
  start_server(f, 3, NULL);
  wait_servers(c, 4);
  node_of(f, 3, node3, sizeof node3);
  put_all(c, "h", N, 3); /* same keys, same bytes: each goes where hash says now */
  int moved = 0;
  for (int i = 0; i < N; i++) {
    key_of(key, sizeof key, "h", i);
    holder(f, key, who, sizeof who);
    if (strcmp(who, before[i]) != 0) {
      assert_string_equal(who, node3); /* nothing moves between the old three */
      moved++;
    }
  }
  fprintf(stderr, "hash: a 4th server took %d of %d keys (1/N = %d)\n", moved, N, N / 4);
  assert_true(moved > N / 8 && moved < N * 3 / 8);
  ecs_client_close(c);
}

/* least-loaded follows the free bytes the heartbeats publish. */
static void test_least_loaded(void **state) {
  fx_t *f = *state;
  start_server(f, 0, "64M");
  start_server(f, 1, "256M");
  ecs_client_t *c = discover_client(f, "least-loaded");
  assert_non_null(c);
  assert_int_equal(ecs_client_server_count(c), 2);
  put_all(c, "l", 32, 4);
  char key[32], who[64], big[64];
  node_of(f, 1, big, sizeof big);
  for (int i = 0; i < 32; i++) {
    key_of(key, sizeof key, "l", i);
    holder(f, key, who, sizeof who);
    assert_string_equal(who, big);
  }
  ecs_client_close(c);
}

/* Gets over three servers in batches while one is killed: its objects
 * become misses, every other item is OK with the right bytes, and no batch
 * fails.  Then a put places around the dead server at once. */
static void test_server_killed_mid_run(void **state) {
  fx_t *f = *state;
  for (int i = 0; i < 3; i++)
    start_server(f, i, NULL);
  ecs_client_t *c = discover_client(f, "hash");
  assert_non_null(c);
  put_all(c, "k", NOBJ, 5);
  static char where[NOBJ][64];
  char key[32], dead[64];
  for (int i = 0; i < NOBJ; i++) {
    key_of(key, sizeof key, "k", i);
    holder(f, key, where[i], sizeof where[i]);
  }
  node_of(f, 1, dead, sizeof dead);
  int st[NOBJ], ndead = 0;
  for (int i = 0; i < NOBJ; i++)
    ndead += !strcmp(where[i], dead);
  assert_true(ndead > 0 && ndead < NOBJ);
  for (int round = 0; round < 12; round++) {
    if (round == 4)
      ecs_ts_kill9(&f->srv[1]);
    int rc = get_all(c, "k", NOBJ, 5, st);
    if (rc != ECS_OK)
      fprintf(stderr, "round %d: %s: %s\n", round, ecs_strerror(rc), ecs_client_errmsg(c));
    assert_int_equal(rc, ECS_OK);
    for (int i = 0; i < NOBJ; i++) {
      if (strcmp(where[i], dead) != 0 || round < 4)
        assert_int_equal(st[i], ECS_OK);
      else
        assert_int_equal(st[i], ECS_ENOTFOUND);
    }
  }
  /* A fresh client still finds the dead server in the registry (its entry
   * lives until the TTL runs out): its puts there fail to connect and are
   * placed again on the servers left. */
  ecs_client_t *c2 = discover_client(f, "hash");
  assert_non_null(c2);
  put_all(c2, "fresh", 32, 7);
  assert_int_equal(get_all(c2, "fresh", 32, 7, st), ECS_OK);
  for (int i = 0; i < 32; i++)
    assert_int_equal(st[i], ECS_OK);
  ecs_client_close(c2);
  put_all(c, "after", 32, 6); /* none may go to the dead server */
  assert_int_equal(get_all(c, "after", 32, 6, st), ECS_OK);
  for (int i = 0; i < 32; i++)
    assert_int_equal(st[i], ECS_OK);
  /* The server comes back on the same address (same node id, a new epoch,
   * an empty pool): the same client, not restarted, counts its old objects
   * as misses and stores on it again. */
  start_server(f, 1, NULL);
  usleep(300 * 1000); /* past a registry refresh (registry_refresh_ms 200) */
  for (int t = 0; t < 5; t++) {
    assert_int_equal(get_all(c, "k", NOBJ, 5, st), ECS_OK);
    for (int i = 0; i < NOBJ; i++)
      assert_int_equal(st[i], strcmp(where[i], dead) ? ECS_OK : ECS_ENOTFOUND);
    usleep(100 * 1000);
  }
  /* a new epoch in the registry lifts the back-off from the failed connections at once */
  put_all(c, "back", NOBJ, 8);
  int on_back = 0;
  char who[64];
  for (int i = 0; i < NOBJ; i++) {
    key_of(key, sizeof key, "back", i);
    holder(f, key, who, sizeof who);
    on_back += !strcmp(who, dead);
  }
  assert_true(on_back > 0);
  assert_int_equal(get_all(c, "back", NOBJ, 8, st), ECS_OK);
  for (int i = 0; i < NOBJ; i++)
    assert_int_equal(st[i], ECS_OK);
  ecs_client_close(c);
}

/* Remove after a holder's kill -9 (issue 24): per-item statuses, never a
 * whole-call error.  The dead holder's items are misses (its copies went
 * with it: a restart has a new epoch), the live holders' items are removed,
 * before and after the dead one's registry entry expires. */
static void test_remove_after_holder_killed(void **state) {
  fx_t *f = *state;
  for (int i = 0; i < 3; i++)
    start_server(f, i, NULL);
  ecs_client_t *c = discover_client(f, "hash");
  assert_non_null(c);
  static char where[NOBJ][64], names[NOBJ][32];
  ecs_key_t keys[NOBJ];
  char dead[64];
  put_all(c, "rm", NOBJ, 11);
  for (int i = 0; i < NOBJ; i++) {
    key_of(names[i], sizeof names[i], "rm", i);
    keys[i] = (ecs_key_t){names[i], strlen(names[i])};
    holder(f, names[i], where[i], sizeof where[i]);
  }
  node_of(f, 2, dead, sizeof dead);
  ecs_ts_kill9(&f->srv[2]);
  int st[NOBJ], ex[NOBJ];
  for (int half = 0; half < 2; half++) { /* the first half of the keys, then the rest */
    ecs_key_t *k = keys + half * (NOBJ / 2);
    int *s = st + half * (NOBJ / 2);
    uint64_t t0 = ecs_now_ms();
    int rc = ecs_remove_batch(c, k, NOBJ / 2, s);
    if (rc != ECS_OK)
      fprintf(stderr, "remove: %s: %s\n", ecs_strerror(rc), ecs_client_errmsg(c));
    assert_int_equal(rc, ECS_OK);
    assert_true(ecs_now_ms() - t0 < 3000 + 500);
  }
  int on_dead = 0;
  for (int i = 0; i < NOBJ; i++) {
    int is_dead = !strcmp(where[i], dead);
    on_dead += is_dead;
    assert_int_equal(st[i], is_dead ? ECS_ENOTFOUND : ECS_OK);
  }
  assert_true(on_dead > 0 && on_dead < NOBJ);
  /* the live holders' copies are gone (the dead one's record lives on
   * until its registry entry expires, as for gets) */
  assert_int_equal(ecs_exists_batch(c, keys, NOBJ, ex), ECS_OK);
  for (int i = 0; i < NOBJ; i++)
    if (strcmp(where[i], dead) != 0)
      assert_int_equal(ex[i], 0);
  ecs_client_close(c);
}

/* exists with discovery while Redis is unreachable (issue 24): the servers
 * the client last saw in the registry answer, item by item, within the
 * call's deadline; a frozen Redis sends exists to them after the client's
 * Redis timeout. */
static void test_exists_redis_down(void **state) {
  fx_t *f = *state;
  start_server(f, 0, NULL);
  start_server(f, 1, NULL);
  ecs_client_t *c = discover_client(f, "hash");
  assert_non_null(c);
  wait_servers(c, 2);
  put_all(c, "ex", 32, 12);
  static char names[40][32];
  ecs_key_t keys[40];
  for (int i = 0; i < 40; i++) {
    key_of(names[i], sizeof names[i], i < 32 ? "ex" : "never", i);
    keys[i] = (ecs_key_t){names[i], strlen(names[i])};
  }
  int ex[40];
  for (int frozen = 1; frozen >= 0; frozen--) {
    if (frozen) {
      assert_int_equal(ecs_ts_signal(&f->redis, SIGSTOP), 0);
    } else {
      ecs_ts_kill9(&f->redis);
      usleep(1200 * 1000); /* past the client's pause after a Redis failure: it tries Redis again */
    }
    uint64_t t0 = ecs_now_ms();
    int rc = ecs_exists_batch(c, keys, 40, ex);
    uint64_t dt = ecs_now_ms() - t0;
    fprintf(stderr, "exists with Redis %s: %s after %llu ms\n", frozen ? "frozen" : "killed",
            ecs_strerror(rc), (unsigned long long)dt);
    if (rc != ECS_OK)
      fprintf(stderr, "  %s\n", ecs_client_errmsg(c));
    assert_int_equal(rc, ECS_OK);
    for (int i = 0; i < 40; i++)
      assert_int_equal(ex[i], i < 32);
    assert_true(dt < (frozen ? 500 + 300 : 3000 + 50 + 300));
    if (frozen)
      assert_int_equal(ecs_ts_signal(&f->redis, SIGCONT), 0);
  }
  ecs_client_close(c);
  assert_int_equal(ecs_ts_redis_start(&f->redis), 0); /* for the teardown */
}

/* A holder that times out is suspect for the whole client (issue 24): one
 * get batch pays its deadline, the following ones answer its items as
 * misses at once (the other holders' items are served), removes answer
 * them ECS_ETIMEDOUT per item, no call overruns its deadline, and once the
 * holder answers again a probe finds it back within the back-off.  Its
 * registry entry lives on meanwhile (TTL 10 s), as under a partition. */
static void test_suspect_holder(void **state) {
  fx_t *f = *state;
  const char *extra[] = {"--heartbeat-ttl", "10", "--pool-size", "64M", NULL};
  for (int i = 0; i < 3; i++)
    assert_int_equal(ecs_ts_server_start(&f->srv[i], f->redis.port, extra), 0);
  char url[64];
  snprintf(url, sizeof url, "127.0.0.1:%d", f->redis.port);
  ecs_client_config_t cfg;
  ecs_ts_client_config(&cfg, NULL, ecs_ts_transport());
  cfg.servers = NULL;
  cfg.redis_url = url;
  cfg.registry_refresh_ms = 200;
  cfg.timeout_ms = 800;
  cfg.connect_timeout_ms = 400;
  ecs_client_t *c = ecs_ts_connect(&cfg);
  assert_non_null(c);
  wait_servers(c, 3);
  put_all(c, "sus", NOBJ, 13);
  static char where[NOBJ][64], names[NOBJ][32];
  ecs_key_t keys[NOBJ];
  char stopped[64];
  node_of(f, 2, stopped, sizeof stopped);
  int on_stopped = 0, st[NOBJ];
  for (int i = 0; i < NOBJ; i++) {
    key_of(names[i], sizeof names[i], "sus", i);
    keys[i] = (ecs_key_t){names[i], strlen(names[i])};
    holder(f, names[i], where[i], sizeof where[i]);
    on_stopped += !strcmp(where[i], stopped);
  }
  assert_true(on_stopped > 0 && on_stopped < NOBJ);
  assert_int_equal(ecs_ts_signal(&f->srv[2], SIGSTOP), 0);
  uint64_t worst = 0, later_worst = 0;
  for (int round = 0; round < 6; round++) {
    uint64_t t0 = ecs_now_ms();
    assert_int_equal(get_all(c, "sus", NOBJ, 13, st), ECS_OK);
    uint64_t dt = ecs_now_ms() - t0;
    worst = dt > worst ? dt : worst;
    if (round > 0)
      later_worst = dt > later_worst ? dt : later_worst;
    for (int i = 0; i < NOBJ; i++)
      assert_int_equal(st[i], strcmp(where[i], stopped) ? ECS_OK : ECS_ENOTFOUND);
  }
  /* a remove of the suspect holder's keys: per item, at once, nothing removed */
  ecs_key_t sk[NOBJ];
  int ns = 0;
  for (int i = 0; i < NOBJ; i++)
    if (!strcmp(where[i], stopped))
      sk[ns++] = keys[i];
  uint64_t t0 = ecs_now_ms();
  assert_int_equal(ecs_remove_batch(c, sk, (size_t)ns, st), ECS_OK);
  uint64_t rm_ms = ecs_now_ms() - t0;
  for (int i = 0; i < ns; i++)
    assert_int_equal(st[i], ECS_ETIMEDOUT);
  assert_true(rm_ms < 300);
  fprintf(stderr, "stopped holder: slowest get %llu ms, slowest after the first %llu ms (deadline 800)\n",
          (unsigned long long)worst, (unsigned long long)later_worst);
  assert_true(worst <= 800 + 200);
  assert_true(later_worst < 300); /* suspect: no wait for it */
  /* back: a probe after the back-off (3 s) finds it */
  assert_int_equal(ecs_ts_signal(&f->srv[2], SIGCONT), 0);
  int all_ok = 0;
  t0 = ecs_now_ms();
  while (!all_ok && ecs_now_ms() - t0 < 8000) {
    usleep(200 * 1000);
    if (get_all(c, "sus", NOBJ, 13, st) != ECS_OK)
      continue;
    all_ok = 1;
    for (int i = 0; i < NOBJ; i++)
      all_ok &= st[i] == ECS_OK;
  }
  fprintf(stderr, "found back after %llu ms\n", (unsigned long long)(ecs_now_ms() - t0));
  assert_true(all_ok);
  ecs_client_close(c);
}

/* The registry epoch of node i, as a string ("" when not registered). */
static void epoch_of(fx_t *f, int i, char *out, size_t cap) {
  char node[64];
  node_of(f, i, node, sizeof node);
  redisReply *r = redisCommand(f->r, "HGET ecs:{test}:node:%s epoch", node);
  assert_non_null(r);
  snprintf(out, cap, "%s", r->type == REDIS_REPLY_STRING ? r->str : "");
  freeReplyObject(r);
}

/* The suspicion mark of node i: its value into out ("" for none), its
 * PTTL returned (-2: no key, -1: no TTL). */
static long long mark_of(fx_t *f, int i, char *out, size_t cap) {
  char node[64];
  node_of(f, i, node, sizeof node);
  redisReply *r = redisCommand(f->r, "GET ecs:{test}:suspect:%s", node);
  assert_non_null(r);
  snprintf(out, cap, "%s", r->type == REDIS_REPLY_STRING ? r->str : "");
  freeReplyObject(r);
  r = redisCommand(f->r, "PTTL ecs:{test}:suspect:%s", node);
  assert_non_null(r);
  long long ttl = r->type == REDIS_REPLY_INTEGER ? r->integer : -3;
  freeReplyObject(r);
  return ttl;
}

static ecs_client_t *suspect_client(fx_t *f) {
  char url[64];
  snprintf(url, sizeof url, "127.0.0.1:%d", f->redis.port);
  ecs_client_config_t cfg;
  ecs_ts_client_config(&cfg, NULL, ecs_ts_transport());
  cfg.servers = NULL;
  cfg.redis_url = url;
  cfg.registry_refresh_ms = 200;
  cfg.timeout_ms = 800;
  cfg.connect_timeout_ms = 400;
  return ecs_ts_connect(&cfg);
}

/* Published suspicion (issue 24): client A pays one deadline for a stopped
 * holder and marks it in Redis (ecs:{ns}:suspect:{id} = its epoch, TTL
 * A's back-off); client B, a handle that never met the holder, reads the
 * mark with its registry and answers the holder's items at once (misses
 * for gets, ETIMEDOUT per item for remove) instead of waiting its own
 * deadline, and its puts go elsewhere. */
static void test_published_suspicion(void **state) {
  fx_t *f = *state;
  const char *extra[] = {"--heartbeat-ttl", "10", "--pool-size", "64M", NULL};
  for (int i = 0; i < 3; i++)
    assert_int_equal(ecs_ts_server_start(&f->srv[i], f->redis.port, extra), 0);
  ecs_client_t *a = suspect_client(f);
  assert_non_null(a);
  wait_servers(a, 3);
  put_all(a, "pub", NOBJ, 17);
  static char where[NOBJ][64];
  char stopped[64], name[32], ep[32];
  node_of(f, 2, stopped, sizeof stopped);
  epoch_of(f, 2, ep, sizeof ep);
  int on_stopped = 0, st[NOBJ];
  for (int i = 0; i < NOBJ; i++) {
    key_of(name, sizeof name, "pub", i);
    holder(f, name, where[i], sizeof where[i]);
    on_stopped += !strcmp(where[i], stopped);
  }
  assert_true(on_stopped > 0 && on_stopped < NOBJ);
  assert_int_equal(ecs_ts_signal(&f->srv[2], SIGSTOP), 0);
  uint64_t t0 = ecs_now_ms();
  assert_int_equal(get_all(a, "pub", NOBJ, 17, st), ECS_OK);
  uint64_t a_ms = ecs_now_ms() - t0;
  char val[32];
  long long ttl = mark_of(f, 2, val, sizeof val);
  /* B: a fresh handle (as another process would be) */
  ecs_client_t *b = suspect_client(f);
  assert_non_null(b);
  t0 = ecs_now_ms();
  assert_int_equal(get_all(b, "pub", NOBJ, 17, st), ECS_OK);
  uint64_t b_ms = ecs_now_ms() - t0;
  fprintf(
      stderr,
      "A's get paid %llu ms (deadline 800); the mark: '%s' (epoch %s), PTTL %lld; B's first get: %llu ms\n",
      (unsigned long long)a_ms, val, ep, ttl, (unsigned long long)b_ms);
  assert_true(a_ms >= 300);
  assert_string_equal(val, ep);
  assert_true(ttl > 2000 && ttl <= 3000 + 800); /* A's first back-off, and one deadline */
  assert_true(b_ms < 300);                      /* B did not wait for the holder */
  for (int i = 0; i < NOBJ; i++)
    assert_int_equal(st[i], strcmp(where[i], stopped) ? ECS_OK : ECS_ENOTFOUND);
  /* A's link is still in step: its next lookup first drops the mark's
   * reply (fire-and-forget), then reads its own */
  assert_int_equal(get_all(a, "pub", NOBJ, 17, st), ECS_OK);
  for (int i = 0; i < NOBJ; i++)
    assert_int_equal(st[i], strcmp(where[i], stopped) ? ECS_OK : ECS_ENOTFOUND);
  /* remove: per item, at once */
  ecs_key_t sk[NOBJ];
  static char sn[NOBJ][32];
  int ns = 0;
  for (int i = 0; i < NOBJ; i++)
    if (!strcmp(where[i], stopped)) {
      key_of(sn[ns], sizeof sn[ns], "pub", i);
      sk[ns] = (ecs_key_t){sn[ns], strlen(sn[ns])};
      ns++;
    }
  t0 = ecs_now_ms();
  assert_int_equal(ecs_remove_batch(b, sk, (size_t)ns, st), ECS_OK);
  assert_true(ecs_now_ms() - t0 < 300);
  for (int i = 0; i < ns; i++)
    assert_int_equal(st[i], ECS_ETIMEDOUT);
  /* placement skips it: B's new puts land on the other two */
  put_all(b, "pub2", 32, 18);
  for (int i = 0; i < 32; i++) {
    char who[64];
    key_of(name, sizeof name, "pub2", i);
    holder(f, name, who, sizeof who);
    assert_string_not_equal(who, stopped);
  }
  assert_int_equal(ecs_ts_signal(&f->srv[2], SIGCONT), 0);
  ecs_client_close(a);
  ecs_client_close(b);
}

/* A mark cannot blacklist a healthy server for long (docs/security.md): a
 * "rogue" mark with a 10-minute TTL on a server that answers makes a
 * client skip it for at most ECS_CLI_MARK_MAX_MS (8 s) from the first
 * time it followed it; then one call probes the server, finds it answers,
 * withdraws the mark, and ignores marks of it for ECS_CLI_TRUST_MS (24 s),
 * even when the rogue writes it again.  A mark without a TTL, or naming
 * another epoch, is no mark. */
static void test_rogue_mark_bounded(void **state) {
  fx_t *f = *state;
  const char *extra[] = {"--heartbeat-ttl", "10", "--pool-size", "64M", NULL};
  for (int i = 0; i < 3; i++)
    assert_int_equal(ecs_ts_server_start(&f->srv[i], f->redis.port, extra), 0);
  ecs_client_t *w = suspect_client(f);
  assert_non_null(w);
  wait_servers(w, 3);
  put_all(w, "rog", NOBJ, 19);
  ecs_client_close(w);
  static char where[NOBJ][64];
  char n0[64], n1[64], n2[64], e0[32], e2[32], name[32];
  node_of(f, 0, n0, sizeof n0);
  node_of(f, 1, n1, sizeof n1);
  node_of(f, 2, n2, sizeof n2);
  epoch_of(f, 0, e0, sizeof e0);
  epoch_of(f, 2, e2, sizeof e2);
  int on0 = 0, st[NOBJ];
  for (int i = 0; i < NOBJ; i++) {
    key_of(name, sizeof name, "rog", i);
    holder(f, name, where[i], sizeof where[i]);
    on0 += !strcmp(where[i], n0);
  }
  assert_true(on0 > 0 && on0 < NOBJ);
  redisReply *r = redisCommand(f->r, "SET ecs:{test}:suspect:%s %s PX 600000", n0, e0);
  freeReplyObject(r);
  r = redisCommand(f->r, "SET ecs:{test}:suspect:%s %s", n1, "1"); /* no TTL, wrong epoch */
  freeReplyObject(r);
  r = redisCommand(f->r, "SET ecs:{test}:suspect:%s %s5 PX 600000", n2, e2); /* another epoch */
  freeReplyObject(r);
  uint64_t t0 = ecs_now_ms();
  ecs_client_t *c = suspect_client(f);
  assert_non_null(c);
  assert_int_equal(get_all(c, "rog", NOBJ, 19, st), ECS_OK);
  for (int i = 0; i < NOBJ; i++) /* the TTL-less and other-epoch marks are ignored */
    assert_int_equal(st[i], strcmp(where[i], n0) ? ECS_OK : ECS_ENOTFOUND);
  int all_ok = 0;
  uint64_t back = 0;
  while (!all_ok && ecs_now_ms() - t0 < 15000) {
    usleep(200 * 1000);
    assert_int_equal(get_all(c, "rog", NOBJ, 19, st), ECS_OK);
    all_ok = 1;
    for (int i = 0; i < NOBJ; i++)
      all_ok &= st[i] == ECS_OK;
    back = ecs_now_ms() - t0;
  }
  char val[32];
  long long ttl = mark_of(f, 0, val, sizeof val);
  fprintf(stderr,
          "a 10-minute mark on a healthy server: followed for %llu ms (cap 8000), then '%s' PTTL %lld\n",
          (unsigned long long)back, val, ttl);
  assert_true(all_ok);
  assert_true(back >= 7000 && back <= 8000 + 2000);
  assert_int_equal(ttl, -2); /* the probe's answer withdrew it */
  /* the rogue writes it again: ignored while the server keeps answering */
  r = redisCommand(f->r, "SET ecs:{test}:suspect:%s %s PX 600000", n0, e0);
  freeReplyObject(r);
  for (int k = 0; k < 8; k++) {
    usleep(250 * 1000);
    assert_int_equal(get_all(c, "rog", NOBJ, 19, st), ECS_OK);
    for (int i = 0; i < NOBJ; i++)
      assert_int_equal(st[i], ECS_OK);
  }
  ecs_client_close(c);
}

/* --registry-ttl-ms (issue 24): a server that stops heart-beating leaves
 * the namespace after its TTL, here 1.5 s, instead of the 2 s minimum
 * of --heartbeat-ttl (10 s by default); under 1000 ms is refused. */
static void test_registry_ttl_ms(void **state) {
  fx_t *f = *state;
  const char *extra[] = {"--registry-ttl-ms", "1500", "--pool-size", "64M", NULL};
  assert_int_equal(ecs_ts_server_start(&f->srv[0], f->redis.port, extra), 0);
  char node[64];
  node_of(f, 0, node, sizeof node);
  redisReply *r = redisCommand(f->r, "PTTL ecs:{test}:node:%s", node);
  assert_non_null(r);
  long long ttl = r->type == REDIS_REPLY_INTEGER ? r->integer : -3;
  freeReplyObject(r);
  assert_true(ttl > 0 && ttl <= 1500);
  assert_int_equal(ecs_ts_signal(&f->srv[0], SIGSTOP), 0);
  uint64_t t0 = ecs_now_ms();
  int gone = 0;
  while (!gone && ecs_now_ms() - t0 < 12000) {
    usleep(20 * 1000);
    r = redisCommand(f->r, "EXISTS ecs:{test}:node:%s", node);
    assert_non_null(r);
    gone = r->type == REDIS_REPLY_INTEGER && r->integer == 0;
    freeReplyObject(r);
  }
  uint64_t dt = ecs_now_ms() - t0;
  assert_int_equal(ecs_ts_signal(&f->srv[0], SIGCONT), 0);
  fprintf(stderr, "a stopped server with --registry-ttl-ms 1500 left the registry after %llu ms\n",
          (unsigned long long)dt);
  assert_true(gone && dt <= 1500 + 200);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "'%s' --redis none --registry-ttl-ms 999 >/dev/null 2>&1",
           ecs_ts_bin("ecstore-server"));
  int st = system(cmd);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
}

/* Redis gone: puts still reach the servers the client knew (they serve on
 * without Redis); a get cannot locate anything and fails as a whole, at
 * once and saying why, never with a wrong or partial answer. */
static void test_redis_down(void **state) {
  fx_t *f = *state;
  start_server(f, 0, NULL);
  start_server(f, 1, NULL);
  ecs_client_t *c = discover_client(f, "hash");
  assert_non_null(c);
  put_all(c, "r", 16, 9);
  ecs_ts_kill9(&f->redis);
  usleep(300 * 1000);             /* past registry_refresh_ms: the next call tries Redis */
  put_all_ex(c, "r2", 16, 10, 1); /* stored; their records wait for Redis */
  int st[16];
  uint64_t t0 = ecs_now_ms();
  int rc = get_all(c, "r", 16, 9, st);
  assert_true(rc == ECS_ECONN || rc == ECS_ETIMEDOUT);
  assert_true(ecs_now_ms() - t0 < 3000 + 500);
  assert_non_null(strstr(ecs_client_errmsg(c), "Redis"));
  for (int i = 0; i < 16; i++)
    assert_int_equal(st[i], rc);
  ecs_client_close(c);
}

static void test_config_errors(void **state) {
  fx_t *f = *state;
  char url[64];
  snprintf(url, sizeof url, "127.0.0.1:%d", f->redis.port);
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.redis_url = url;
  cfg.ns = "test";
  cfg.placement = "nearest";
  ecs_client_t *c = NULL;
  char err[256] = "";
  assert_int_equal(ecs_client_connect(&cfg, &c, err, sizeof err), ECS_EINVAL);
  assert_non_null(strstr(err, "unknown placement 'nearest'"));
  /* discovery with no Redis: nothing to discover, said plainly */
  cfg.placement = NULL;
  char dead[32];
  snprintf(dead, sizeof dead, "127.0.0.1:%d", ecs_ts_free_port());
  cfg.redis_url = dead;
  cfg.connect_timeout_ms = 500;
  cfg.timeout_ms = 500;
  assert_int_not_equal(ecs_client_connect(&cfg, &c, err, sizeof err), ECS_OK);
  assert_null(c);
  assert_non_null(strstr(err, "node registry"));
  /* a namespace with no server: connect works, a put says why it cannot */
  cfg.redis_url = url;
  cfg.ns = "empty-ns";
  assert_int_equal(ecs_client_connect(&cfg, &c, err, sizeof err), ECS_OK);
  uint8_t b[4] = {0};
  assert_int_equal(ecs_ts_put1(c, "x", b, 4, ECS_DTYPE_U8), ECS_ECONN);
  assert_non_null(strstr(ecs_client_errmsg(c), "no live server"));
  ecs_client_close(c);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_discovery_and_join, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_hash_join_moves_its_share, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_least_loaded, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_server_killed_mid_run, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_redis_down, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_remove_after_holder_killed, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_exists_redis_down, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_suspect_holder, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_published_suspicion, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_rogue_mark_bounded, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_registry_ttl_ms, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_config_errors, fx_setup, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
