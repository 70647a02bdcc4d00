/*
 * test_replicas: replicas=N on a put stores N copies on distinct servers
 * (each recorded in Redis as a holder), and a get reads the nearest live
 * copy, falling back to another when that copy is gone, evicted or
 * corrupt (issue 14; docs/multihost.md "Replicas").  Loopback only: Redis
 * and three servers on 127.0.0.1, found through the registry.
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
#include "store/client/client_internal.h"
#include "store/core/net.h"
#include "support/fixture.h"
#include "support/objset.h"
#include "support/raw.h"

#define NOBJ 48
#define OBJ_BYTES ECS_OBJSET_BYTES
#define MAXS 3

typedef ecs_mfx_t fx_t;
_Static_assert(MAXS <= ECS_MFX_MAX_SERVERS, "the shared fixture's servers");
#define fx_setup ecs_mfx_setup
#define fx_teardown ecs_mfx_teardown

/* Servers with a short registry TTL (a killed one leaves within the test)
 * and debug ops (corrupting one copy). */
static void start_servers_sized(fx_t *f, int n, const char *const *pools) {
  for (int i = 0; i < n; i++) {
    const char *extra[] = {"--heartbeat-ttl",    "2", "--pool-size", pools ? pools[i] : "64M",
                           "--enable-debug-ops", NULL};
    assert_int_equal(ecs_ts_server_start(&f->srv[i], f->redis.port, extra), 0);
  }
}

static void start_servers(fx_t *f, int n) {
  start_servers_sized(f, n, NULL);
}

static ecs_client_t *client_placed(fx_t *f, int replicas, const char *placement) {
  char url[64];
  snprintf(url, sizeof url, "127.0.0.1:%d", f->redis.port);
  ecs_client_config_t cfg;
  ecs_ts_client_config(&cfg, NULL, ecs_ts_transport());
  cfg.servers = NULL; /* only Redis: discovery */
  cfg.redis_url = url;
  cfg.replicas = replicas;
  cfg.placement = placement;
  cfg.registry_refresh_ms = 200;
  cfg.timeout_ms = 3000;
  cfg.connect_timeout_ms = 1000;
  return ecs_ts_connect(&cfg);
}

static ecs_client_t *client(fx_t *f, int replicas) {
  return client_placed(f, replicas, NULL);
}

static void key_of(char *out, size_t cap, const char *pfx, int i) {
  ecs_objset_key(out, cap, pfx, i);
}

/* Puts (or upserts) n objects "pfx-i": returns the call's result,
 * statuses into st. */
static int put_or_upsert(ecs_client_t *c, const char *pfx, int n, uint32_t salt, int *st, int upsert) {
  return ecs_objset_put(c, pfx, n, salt, st, upsert);
}

static int put_all(ecs_client_t *c, const char *pfx, int n, uint32_t salt, int *st) {
  return put_or_upsert(c, pfx, n, salt, st, 0);
}

/* Gets n objects "pfx-i" in one batch; every OK one's bytes are checked. */
static int get_all(ecs_client_t *c, const char *pfx, int n, uint32_t salt, int *st) {
  return ecs_objset_get(c, pfx, n, salt, st);
}

/* The holders Redis lists for key (its "h:{node}" fields), into out[]. */
static int holders(fx_t *f, const char *key, char out[][64], int max) {
  redisReply *r = redisCommand(f->r, "HKEYS ecs:{test}:obj:%s", key);
  assert_non_null(r);
  int n = 0;
  for (size_t j = 0; r->type == REDIS_REPLY_ARRAY && j < r->elements; j++)
    if (!strncmp(r->element[j]->str, "h:", 2) && n < max)
      snprintf(out[n++], 64, "%s", r->element[j]->str + 2);
  freeReplyObject(r);
  return n;
}

static void node_of(const fx_t *f, int i, char *out, size_t cap) {
  snprintf(out, cap, "127.0.0.1:%d", f->srv[i].port); /* the default node id: the listen address */
}

/* After a copy's removal from gone: Redis lists one holder, not gone. */
static int settled(fx_t *f, const char *key, const char *gone) {
  char h[4][64];
  return holders(f, key, h, 4) == 1 && strcmp(h[0], gone) != 0;
}

/* Objects each server holds, by its STAT, with a servers-list client. */
static uint64_t objects_on(const fx_t *f, int i, uint64_t *misses) {
  char addr[64];
  node_of(f, i, addr, sizeof addr);
  ecs_client_t *c = ecs_ts_client(addr, NULL, NULL, 3000);
  assert_non_null(c);
  ecs_server_stat_t st;
  assert_int_equal(ecs_stat(c, 0, &st), ECS_OK);
  ecs_client_close(c);
  if (misses)
    *misses = st.misses;
  return st.objects;
}

/* replicas=2 over three servers: two copies of every object, on two
 * distinct servers, both listed in Redis; each server's STAT agrees. */
static void test_two_copies_on_distinct_servers(void **state) {
  fx_t *f = *state;
  start_servers(f, 3);
  ecs_client_t *c = client(f, 2);
  assert_non_null(c);
  assert_int_equal(ecs_client_server_count(c), 3);
  int st[NOBJ];
  assert_int_equal(put_all(c, "d", NOBJ, 1, st), ECS_OK);
  for (int i = 0; i < NOBJ; i++)
    assert_int_equal(st[i], ECS_OK);
  size_t stored = 0, wanted = 0;
  ecs_client_put_copies(c, &stored, &wanted);
  assert_int_equal(stored, 2 * NOBJ);
  assert_int_equal(wanted, 2 * NOBJ);
  char key[32], h[4][64], nodes[MAXS][64];
  int per[MAXS] = {0};
  for (int s = 0; s < MAXS; s++)
    node_of(f, s, nodes[s], sizeof nodes[s]);
  for (int i = 0; i < NOBJ; i++) {
    key_of(key, sizeof key, "d", i);
    assert_int_equal(holders(f, key, h, 4), 2);
    assert_string_not_equal(h[0], h[1]);
    for (int k = 0; k < 2; k++)
      for (int s = 0; s < MAXS; s++)
        per[s] += !strcmp(h[k], nodes[s]);
  }
  uint64_t total = 0;
  for (int s = 0; s < MAXS; s++) {
    assert_int_equal(objects_on(f, s, NULL), per[s]); /* Redis and the servers agree */
    assert_true(per[s] > 0);                          /* rendezvous spreads the copies */
    total += (uint64_t)per[s];
  }
  assert_int_equal(total, 2 * NOBJ);
  assert_int_equal(get_all(c, "d", NOBJ, 1, st), ECS_OK);
  for (int i = 0; i < NOBJ; i++)
    assert_int_equal(st[i], ECS_OK);
  /* A reader with replicas=1 (the default) reads them just the same. */
  ecs_client_t *r = client(f, 1);
  assert_non_null(r);
  assert_int_equal(get_all(r, "d", NOBJ, 1, st), ECS_OK);
  for (int i = 0; i < NOBJ; i++)
    assert_int_equal(st[i], ECS_OK);
  ecs_client_close(r);
  ecs_client_close(c);
}

/* A holder killed: every object is still read, with the right bytes,
 * both while the dead server is still in the registry (its connection is
 * refused: the next copy) and after its entry expired. */
static void test_host_loss(void **state) {
  fx_t *f = *state;
  start_servers(f, 3);
  ecs_client_t *c = client(f, 2);
  assert_non_null(c);
  int st[NOBJ];
  assert_int_equal(put_all(c, "k", NOBJ, 2, st), ECS_OK);
  ecs_client_t *r = client(f, 1); /* a reader that never put anything */
  assert_non_null(r);
  assert_int_equal(get_all(r, "k", NOBJ, 2, st), ECS_OK);
  uint64_t on1 = objects_on(f, 1, NULL);
  assert_true(on1 > 0);
  ecs_ts_kill9(&f->srv[1]);
  for (int round = 0; round < 10; round++) {
    int rc = get_all(r, "k", NOBJ, 2, st);
    if (rc != ECS_OK)
      fprintf(stderr, "round %d: %s: %s\n", round, ecs_strerror(rc), ecs_client_errmsg(r));
    assert_int_equal(rc, ECS_OK);
    for (int i = 0; i < NOBJ; i++)
      assert_int_equal(st[i], ECS_OK);
    usleep(300 * 1000); /* the rounds span the registry TTL (2 s) */
  }
  /* puts go on, two copies each, on the two servers left */
  assert_int_equal(put_all(c, "after", 16, 3, st), ECS_OK);
  size_t stored = 0, wanted = 0;
  ecs_client_put_copies(c, &stored, &wanted);
  assert_int_equal(stored, 32);
  assert_int_equal(wanted, 32);
  ecs_client_close(r);
  ecs_client_close(c);
}

/* A copy gone from its server while Redis still lists it (evicted, and
 * the record's delete not yet in Redis), or corrupt there: the get falls
 * back to the other copy within the same call. */
static void test_missing_or_corrupt_copy_falls_back(void **state) {
  fx_t *f = *state;
  start_servers(f, 2);
  ecs_client_t *c = client(f, 2);
  assert_non_null(c);
  int st[NOBJ];
  assert_int_equal(put_all(c, "e", NOBJ, 4, st), ECS_OK);
  char key[32], node[64];
  char h[4][64];
  uint64_t t0 = ecs_now_ms();
  for (int i = 0; i < NOBJ; i++) { /* both copies listed (a late record is re-sent by the re-sync) */
    key_of(key, sizeof key, "e", i);
    while (holders(f, key, h, 4) != 2 && ecs_now_ms() - t0 < 15000)
      usleep(20 * 1000);
    assert_int_equal(holders(f, key, h, 4), 2);
  }
  /* Remove object i from server i % 2 alone (a client with that server as
   * its list), then put its holder entry back by hand, listed first (a
   * get tries holders in the record's order when none is nearer): Redis
   * now names first a copy that is not there. */
  ecs_client_t *one[2];
  for (int s = 0; s < 2; s++) {
    node_of(f, s, node, sizeof node);
    one[s] = ecs_ts_client(node, NULL, NULL, 3000);
    assert_non_null(one[s]);
  }
  for (int i = 0; i < NOBJ; i++) {
    key_of(key, sizeof key, "e", i);
    ecs_key_t k = {key, strlen(key)};
    int rs = -1;
    assert_int_equal(ecs_remove_batch(one[i % 2], &k, 1, &rs), ECS_OK);
    assert_int_equal(rs, ECS_OK);
  }
  /* The servers' deletes reach Redis on their next flush.  Under load a
   * record write can also land late (sent on a Redis link that timed out
   * and was replaced), naming the server the copy was just removed from;
   * that server's re-sync sweep then deletes it.  So wait for the settled
   * state, not the first one-holder moment: one holder, the other server. */
  t0 = ecs_now_ms();
  for (int i = 0; i < NOBJ; i++) {
    key_of(key, sizeof key, "e", i);
    node_of(f, i % 2, node, sizeof node);
    while (!settled(f, key, node) && ecs_now_ms() - t0 < 15000)
      usleep(20 * 1000);
    assert_true(settled(f, key, node));
  }
  /* Each object's record now names first a holder that lacks it (made up
   * below), then the real one.  A server's re-sync sweep (owed after a
   * Redis timeout or a NOSCRIPT under load) rightly deletes made-up
   * entries naming it, perhaps between the make-up and the get: so the
   * round is tried up to 5 times.  Every get must succeed in every round;
   * some first tries must miss in at least one. */
  ecs_client_t *r = client(f, 1);
  assert_non_null(r);
  uint64_t missed = 0;
  for (int round = 0; round < 5 && missed == 0; round++) {
    for (int i = 0; i < NOBJ; i++) {
      key_of(key, sizeof key, "e", i);
      node_of(f, i % 2, node, sizeof node);
      while (!settled(f, key, node) && ecs_now_ms() - t0 < 15000)
        usleep(20 * 1000);
      assert_true(settled(f, key, node)); /* h[0]: the copy still there */
      assert_int_equal(holders(f, key, h, 4), 1);
      ecs_server_stat_t ss;
      assert_int_equal(ecs_stat(one[i % 2], 0, &ss), ECS_OK);
      redisReply *rr = redisCommand(f->r, "HGET ecs:{test}:obj:%s h:%s", key, h[0]);
      assert_non_null(rr);
      assert_int_equal(rr->type, REDIS_REPLY_STRING);
      char other_epoch[32];
      snprintf(other_epoch, sizeof other_epoch, "%s", rr->str);
      freeReplyObject(rr);
      /* one MULTI, so no reader sees the record without its real holder */
      freeReplyObject(redisCommand(f->r, "MULTI"));
      freeReplyObject(redisCommand(f->r, "HDEL ecs:{test}:obj:%s h:%s", key, h[0]));
      freeReplyObject(
          redisCommand(f->r, "HSET ecs:{test}:obj:%s h:%s %llu", key, node, (unsigned long long)ss.epoch));
      freeReplyObject(redisCommand(f->r, "HSET ecs:{test}:obj:%s h:%s %s", key, h[0], other_epoch));
      freeReplyObject(redisCommand(f->r, "EXEC"));
    }
    uint64_t miss0 = 0, miss1 = 0, m0 = 0, m1 = 0;
    objects_on(f, 0, &miss0);
    objects_on(f, 1, &miss1);
    assert_int_equal(get_all(r, "e", NOBJ, 4, st), ECS_OK);
    for (int i = 0; i < NOBJ; i++)
      assert_int_equal(st[i], ECS_OK);
    objects_on(f, 0, &m0);
    objects_on(f, 1, &m1);
    missed = m0 - miss0 + m1 - miss1;
    fprintf(stderr, "fallback round %d: %llu misses on the servers, every object read from its other copy\n",
            round, (unsigned long long)missed);
    /* the get does not repair the record: drop the made-up entries, so
     * that the next round starts from "one holder, not node" again */
    for (int i = 0; i < NOBJ; i++) {
      key_of(key, sizeof key, "e", i);
      node_of(f, i % 2, node, sizeof node);
      freeReplyObject(redisCommand(f->r, "HDEL ecs:{test}:obj:%s h:%s", key, node));
    }
  }
  assert_true(missed > 0); /* some first tries did miss */
  /* A corrupt nearest copy: the checksum fails there, the other copy is read. */
  assert_int_equal(put_all(c, "x", 4, 5, st), ECS_OK);
  for (int i = 0; i < 4; i++) {
    key_of(key, sizeof key, "x", i);
    assert_int_equal(ecs__client_debug_corrupt(r, key, strlen(key)), ECS_OK);
  }
  assert_int_equal(get_all(r, "x", 4, 5, st), ECS_OK);
  for (int i = 0; i < 4; i++)
    assert_int_equal(st[i], ECS_OK);
  ecs_client_close(r);
  for (int s = 0; s < 2; s++)
    ecs_client_close(one[s]);
  ecs_client_close(c);
}

/* exists and remove reach every copy. */
static void test_exists_remove(void **state) {
  fx_t *f = *state;
  start_servers(f, 3);
  ecs_client_t *c = client(f, 2);
  assert_non_null(c);
  int st[NOBJ];
  assert_int_equal(put_all(c, "r", 8, 6, st), ECS_OK);
  uint64_t before = 0;
  for (int s = 0; s < 3; s++)
    before += objects_on(f, s, NULL);
  assert_int_equal(before, 16);
  ecs_key_t k[8];
  char names[8][32];
  int ex[8], rs[8];
  for (int i = 0; i < 8; i++) {
    key_of(names[i], sizeof names[i], "r", i);
    k[i] = (ecs_key_t){names[i], strlen(names[i])};
  }
  assert_int_equal(ecs_exists_batch(c, k, 8, ex), ECS_OK);
  for (int i = 0; i < 8; i++)
    assert_int_equal(ex[i], 1);
  assert_int_equal(ecs_remove_batch(c, k, 4, rs), ECS_OK);
  for (int i = 0; i < 4; i++)
    assert_int_equal(rs[i], ECS_OK);
  uint64_t after = 0;
  for (int s = 0; s < 3; s++)
    after += objects_on(f, s, NULL);
  assert_int_equal(after, 8); /* both copies of each removed object went */
  uint64_t t0 = ecs_now_ms();
  for (;;) { /* the servers' record deletes reach Redis on their next flush */
    assert_int_equal(ecs_exists_batch(c, k, 8, ex), ECS_OK);
    if (!(ex[0] | ex[1] | ex[2] | ex[3]) || ecs_now_ms() - t0 > 3000)
      break;
    usleep(20 * 1000);
  }
  for (int i = 0; i < 8; i++)
    assert_int_equal(ex[i], i >= 4);
  for (int i = 0; i < 8; i++) { /* no holder left: the record itself is gone */
    assert_int_equal(ecs_ts_redis_exists(f->r, names[i]), i >= 4);
  }
  assert_int_equal(get_all(c, "r", 8, 6, st), ECS_OK);
  for (int i = 0; i < 8; i++)
    assert_int_equal(st[i], i < 4 ? ECS_ENOTFOUND : ECS_OK);
  ecs_client_close(c);
}

/* An upsert replaces every copy: put with replicas 2, then upserted with
 * replicas 1 (one server written), the other copy, which still held the
 * old bytes, is removed, so no get can read the old version. */
static void test_upsert_replaces_every_copy(void **state) {
  fx_t *f = *state;
  start_servers(f, 3);
  ecs_client_t *c2 = client(f, 2), *c1 = client(f, 1);
  assert_non_null(c2);
  assert_non_null(c1);
  int st[NOBJ];
  assert_int_equal(put_all(c2, "u", NOBJ, 8, st), ECS_OK);
  assert_int_equal(put_or_upsert(c1, "u", NOBJ, 9, st, 1), ECS_OK);
  for (int i = 0; i < NOBJ; i++)
    assert_int_equal(st[i], ECS_OK);
  char key[32], h[4][64];
  for (int i = 0; i < NOBJ; i++) {
    key_of(key, sizeof key, "u", i);
    assert_int_equal(holders(f, key, h, 4), 1);
  }
  uint64_t total = 0;
  for (int s = 0; s < 3; s++)
    total += objects_on(f, s, NULL);
  assert_int_equal(total, NOBJ);
  ecs_client_t *r = client(f, 1);
  assert_non_null(r);
  for (int round = 0; round < 2; round++) {
    assert_int_equal(get_all(round ? r : c2, "u", NOBJ, 9, st), ECS_OK); /* the new bytes only */
    for (int i = 0; i < NOBJ; i++)
      assert_int_equal(st[i], ECS_OK);
  }
  ecs_client_close(r);
  ecs_client_close(c1);
  ecs_client_close(c2);
}

/* least-loaded with replicas 2: the two servers with the most free bytes. */
static void test_least_loaded_copies(void **state) {
  fx_t *f = *state;
  static const char *const pools[] = {"64M", "256M", "512M"};
  start_servers_sized(f, 3, pools);
  ecs_client_t *c = client_placed(f, 2, "least-loaded");
  assert_non_null(c);
  int st[NOBJ];
  assert_int_equal(put_all(c, "ll", 8, 10, st), ECS_OK);
  char key[32], h[4][64], big[2][64];
  node_of(f, 1, big[0], sizeof big[0]);
  node_of(f, 2, big[1], sizeof big[1]);
  for (int i = 0; i < 8; i++) {
    key_of(key, sizeof key, "ll", i);
    assert_int_equal(holders(f, key, h, 4), 2);
    for (int k = 0; k < 2; k++)
      assert_true(!strcmp(h[k], big[0]) || !strcmp(h[k], big[1]));
  }
  assert_int_equal(objects_on(f, 0, NULL), 0);
  ecs_client_close(c);
}

/* More replicas than live servers: every item is stored (one copy per
 * server), and the shortfall is counted and said. */
static void test_more_replicas_than_servers(void **state) {
  fx_t *f = *state;
  start_servers(f, 2);
  ecs_client_t *c = client(f, 3);
  assert_non_null(c);
  int st[NOBJ];
  assert_int_equal(put_all(c, "m", 10, 7, st), ECS_OK);
  for (int i = 0; i < 10; i++)
    assert_int_equal(st[i], ECS_OK);
  size_t stored = 0, wanted = 0;
  ecs_client_put_copies(c, &stored, &wanted);
  assert_int_equal(stored, 20);
  assert_int_equal(wanted, 30);
  fprintf(stderr, "replicas 3 on 2 servers: %s\n", ecs_client_errmsg(c));
  assert_non_null(strstr(ecs_client_errmsg(c), "10 of 10 items stored fewer than 3 copies"));
  assert_int_equal(get_all(c, "m", 10, 7, st), ECS_OK);
  for (int i = 0; i < 10; i++)
    assert_int_equal(st[i], ECS_OK);
  ecs_client_close(c);
  /* the CLI's --replicas: stored on both servers, the shortfall said, exit 0 */
  char dir[256], cmd[1600], in[300], err[300];
  assert_int_equal(ecs_ts_mkdtemp(dir, sizeof dir), 0);
  snprintf(in, sizeof in, "%s/in", dir);
  snprintf(err, sizeof err, "%s/err", dir);
  FILE *fp = fopen(in, "wb");
  assert_non_null(fp);
  assert_int_equal(fwrite("0123456789", 1, 10, fp), 10);
  fclose(fp);
  const char *cli = ecs_ts_bin("ecstore-cli");
  snprintf(cmd, sizeof cmd,
           "env -u ECSTORE_SERVERS %s --redis 127.0.0.1:%d --ns test --replicas 3 put cli-r %s 2>%s", cli,
           f->redis.port, in, err);
  assert_int_equal(system(cmd), 0);
  char said[300] = "";
  fp = fopen(err, "r");
  assert_non_null(fp);
  size_t got = fread(said, 1, sizeof said - 1, fp);
  said[got] = '\0';
  fclose(fp);
  assert_non_null(strstr(said, "2 of 3 copies stored"));
  char h[4][64];
  assert_int_equal(holders(f, "cli-r", h, 4), 2);
  snprintf(cmd, sizeof cmd,
           "env -u ECSTORE_SERVERS %s --redis 127.0.0.1:%d --ns test --replicas 9 put cli-r %s 2>/dev/null",
           cli, f->redis.port, in);
  int rc = system(cmd);
  assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 2); /* bad usage */
  unlink(in);
  unlink(err);
  rmdir(dir);
}

static void test_config_errors(void **state) {
  fx_t *f = *state;
  char url[64];
  snprintf(url, sizeof url, "127.0.0.1:%d", f->redis.port);
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  assert_int_equal(cfg.replicas, 1);
  cfg.redis_url = url;
  cfg.ns = "test";
  cfg.servers = "127.0.0.1:1";
  cfg.replicas = 2;
  ecs_client_t *c = NULL;
  char err[256] = "";
  assert_int_equal(ecs_client_connect(&cfg, &c, err, sizeof err), ECS_EINVAL);
  assert_null(c);
  assert_non_null(strstr(err, "replicas 2 needs the servers from Redis"));
  cfg.servers = NULL;
  cfg.replicas = ECS_MAX_REPLICAS + 1;
  assert_int_equal(ecs_client_connect(&cfg, &c, err, sizeof err), ECS_EINVAL);
  assert_non_null(strstr(err, "at most 8 copies"));
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_two_copies_on_distinct_servers, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_host_loss, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_missing_or_corrupt_copy_falls_back, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_exists_remove, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_upsert_replaces_every_copy, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_least_loaded_copies, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_more_replicas_than_servers, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_config_errors, fx_setup, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
