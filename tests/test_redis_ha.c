/*
 * test_redis_ha: Redis high availability (issue 14), against real Redis
 * processes started here on free loopback ports in temp directories.
 *
 * Sentinel failover: a master, a replica and three sentinels; an
 * ecstore-server and a discovering client (only a redis-sentinel:// URL
 * and a namespace) under a put/get loop.  The replica's link is cut and a
 * few more objects are put (so the replica misses their records), then
 * the master is killed with -9.  Asserted: no get ever returns wrong
 * bytes; puts and gets succeed again after the failover; every object,
 * the ones whose records the new master never received included, is
 * found again (the server's re-sync republished them).  The times until
 * puts and gets succeed again are printed (a report, not an assert).
 *
 * Cluster: three masters; two namespaces on different masters, each
 * served by an ecstore-server given only a third master's address: MOVED
 * followed by the sync and the async link, records on the right master,
 * exists true through Redis.
 *
 * Skipped (exit 77) when redis-server cannot run as a sentinel or
 * redis-cli is missing.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "ecstore/ec_connector.h"
#include "ecstore/ecstore.h"
#include "store/redis/meta.h"
#include "store/core/net.h"
#include "store/redis/rds.h"
#include "support/fixture.h"
#include "support/ts.h"

#define OBJ_BYTES 4096
#define NKEYS 5000 /* keys the loop may put */
#define MASTER "ecsmaster"

static char g_redis_bin[512];

static const char *redis_bin(void) {
  const char *path = getenv("PATH");
  while (path != NULL && *path != '\0') {
    const char *end = strchr(path, ':');
    size_t len = end ? (size_t)(end - path) : strlen(path);
    if (len > 0 && len < sizeof g_redis_bin - 16) {
      snprintf(g_redis_bin, sizeof g_redis_bin, "%.*s/redis-server", (int)len, path);
      if (access(g_redis_bin, X_OK) == 0)
        return g_redis_bin;
    }
    path = end ? end + 1 : NULL;
  }
  snprintf(g_redis_bin, sizeof g_redis_bin, "/usr/bin/redis-server");
  return g_redis_bin;
}

/* A redis-server on p->port (set) in p->dir (made) with extra arguments. */
static int redis_spawn(ecs_ts_proc_t *p, const char *const extra[]) {
  char port[16];
  char *argv[32];
  size_t k = 0;
  if (p->dir[0] == '\0' && ecs_ts_mkdtemp(p->dir, sizeof p->dir) != 0)
    return -1;
  snprintf(port, sizeof port, "%d", p->port);
  argv[k++] = (char *)redis_bin();
  const char *base[] = {"--port", port,           "--bind", "127.0.0.1", "--save",
                        "",       "--appendonly", "no",     "--dir",     p->dir};
  for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
    argv[k++] = (char *)base[i];
  for (size_t i = 0; extra != NULL && extra[i] != NULL && k < 30; i++)
    argv[k++] = (char *)extra[i];
  argv[k] = NULL;
  if (ecs_ts_spawn(p, argv) != 0)
    return -1;
  return ecs_ts_wait_port(p, p->port, 10000);
}

/* A hiredis connection to port, authenticated with pw when not NULL. */
static redisContext *redis_auth_at(int port, const char *pw) {
  redisContext *c = ecs_ts_redis_at(port);
  if (c == NULL || pw == NULL)
    return c;
  redisReply *r = redisCommand(c, "AUTH %s", pw);
  int ok = r != NULL && r->type == REDIS_REPLY_STATUS;
  if (r != NULL)
    freeReplyObject(r);
  if (!ok) {
    redisFree(c);
    return NULL;
  }
  return c;
}

/* A sentinel watching the master on mport (quorum 2, down after 1 s);
 * with spw, it requires that password (requirepass, which it also
 * presents to the other sentinels), and with mpw it authenticates to the
 * master and the replicas with it. */
static int sentinel_spawn_auth(ecs_ts_proc_t *p, int mport, const char *spw, const char *mpw) {
  if (ecs_ts_mkdtemp(p->dir, sizeof p->dir) != 0)
    return -1;
  p->port = ecs_ts_free_port();
  char conf[300];
  snprintf(conf, sizeof conf, "%s/sentinel.conf", p->dir);
  FILE *f = fopen(conf, "w");
  if (f == NULL)
    return -1;
  fprintf(f,
          "port %d\nbind 127.0.0.1\ndir %s\n"
          "sentinel monitor " MASTER " 127.0.0.1 %d 2\n"
          "sentinel down-after-milliseconds " MASTER " 1000\n"
          "sentinel failover-timeout " MASTER " 10000\n"
          "sentinel parallel-syncs " MASTER " 1\n",
          p->port, p->dir, mport);
  if (spw != NULL)
    fprintf(f, "requirepass %s\n", spw);
  if (mpw != NULL)
    fprintf(f, "sentinel auth-pass " MASTER " %s\n", mpw);
  fclose(f);
  char *argv[] = {(char *)redis_bin(), conf, "--sentinel", NULL};
  if (ecs_ts_spawn(p, argv) != 0)
    return -1;
  return ecs_ts_wait_port(p, p->port, 10000);
}

static int sentinel_spawn(ecs_ts_proc_t *p, int mport) {
  return sentinel_spawn_auth(p, mport, NULL, NULL);
}

/* An integer field of a reply that is a flat array of name/value pairs
 * (SENTINEL master NAME), or -1. */
static long long field_int(const redisReply *r, const char *name) {
  if (r == NULL || r->type != REDIS_REPLY_ARRAY)
    return -1;
  for (size_t i = 0; i + 1 < r->elements; i += 2)
    if (r->element[i]->type == REDIS_REPLY_STRING && strcmp(r->element[i]->str, name) == 0 &&
        r->element[i + 1]->type == REDIS_REPLY_STRING)
      return atoll(r->element[i + 1]->str);
  return -1;
}

/* Whether the sentinel on port (password pw, or NULL) sees the master,
 * one replica and the two other sentinels. */
static int sentinel_ready(int port, const char *pw) {
  redisContext *c = redis_auth_at(port, pw);
  if (c == NULL)
    return 0;
  redisReply *r = redisCommand(c, "SENTINEL master " MASTER);
  int ok = field_int(r, "num-slaves") >= 1 && field_int(r, "num-other-sentinels") >= 2;
  if (r != NULL)
    freeReplyObject(r);
  redisFree(c);
  return ok;
}

/* Whether the replica on port (password pw, or NULL) has its master
 * link up. */
static int replica_synced(int port, const char *pw) {
  redisContext *c = redis_auth_at(port, pw);
  if (c == NULL)
    return 0;
  redisReply *r = redisCommand(c, "INFO replication");
  int ok = r != NULL && r->type == REDIS_REPLY_STRING && strstr(r->str, "master_link_status:up") != NULL;
  if (r != NULL)
    freeReplyObject(r);
  redisFree(c);
  return ok;
}

static void fill(uint8_t *b, int i) {
  for (size_t k = 0; k < OBJ_BYTES; k++)
    b[k] = (uint8_t)(i * 131 + (int)k * 7 + (int)(k >> 8));
}

static void key_of(char *out, size_t cap, int i) {
  snprintf(out, cap, "ha-%d", i);
}

static int put_one(ecs_client_t *c, int i) {
  static uint8_t buf[OBJ_BYTES];
  char name[32];
  key_of(name, sizeof name, i);
  fill(buf, i);
  ecs_key_t k = {name, strlen(name)};
  ecs_tensor_t t = {.data = buf, .nbytes = OBJ_BYTES};
  t.desc.dtype = ECS_DTYPE_U8;
  t.desc.ndim = 1;
  t.desc.shape[0] = OBJ_BYTES;
  int st = ECS_EINVAL;
  int rc = ecs_put_batch(c, &k, &t, 1, &st);
  return rc != ECS_OK ? rc : st;
}

/* ECS_OK with the right bytes, or the item's error.  Wrong bytes fail
 * the test at once. */
static int get_one(ecs_client_t *c, int i) {
  static uint8_t want[OBJ_BYTES], got[OBJ_BYTES];
  char name[32];
  key_of(name, sizeof name, i);
  ecs_key_t k = {name, strlen(name)};
  ecs_get_buf_t b = {.data = got, .capacity = OBJ_BYTES};
  int rc = ecs_get_batch(c, &k, &b, 1);
  if (rc != ECS_OK)
    return rc;
  if (b.status != ECS_OK)
    return b.status;
  fill(want, i);
  if (b.nbytes != OBJ_BYTES || memcmp(got, want, OBJ_BYTES) != 0) {
    fprintf(stderr, "WRONG BYTES for %s (%llu bytes)\n", name, (unsigned long long)b.nbytes);
    fail();
  }
  return ECS_OK;
}

static void test_sentinel_failover(void **state) {
  (void)state;
  ecs_ts_proc_t master = {0}, replica = {0}, sent[3] = {{0}}, server = {0};
  master.port = ecs_ts_free_port();
  assert_int_equal(redis_spawn(&master, NULL), 0);
  char mport[16];
  snprintf(mport, sizeof mport, "%d", master.port);
  replica.port = ecs_ts_free_port();
  const char *rextra[] = {"--replicaof", "127.0.0.1", mport, NULL};
  assert_int_equal(redis_spawn(&replica, rextra), 0);
  for (int i = 0; i < 3; i++)
    assert_int_equal(sentinel_spawn(&sent[i], master.port), 0);
  uint64_t t_end = ecs_now_ms() + 60000;
  int ready = 0;
  while (!ready && ecs_now_ms() < t_end) {
    ready = replica_synced(replica.port, NULL);
    for (int i = 0; i < 3 && ready; i++)
      ready = sentinel_ready(sent[i].port, NULL);
    if (!ready)
      usleep(200 * 1000);
  }
  assert_true(ready);

  char url[300];
  snprintf(url, sizeof url, "redis-sentinel://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d/" MASTER, sent[0].port,
           sent[1].port, sent[2].port);
  const char *sextra[] = {"--redis", url, "--heartbeat-ttl", "3", "--redis-timeout-ms", "500", NULL};
  assert_int_equal(ecs_ts_server_start(&server, 0, sextra), 0);

  ecs_client_config_t cfg;
  ecs_ts_client_config(&cfg, NULL, "tcp");
  cfg.servers = NULL;
  cfg.redis_url = url;
  cfg.timeout_ms = 2000;
  cfg.connect_timeout_ms = 500;
  ecs_client_t *c = NULL;
  /* the server registers within a moment: retry the discovery */
  for (int i = 0; i < 100 && c == NULL; i++) {
    char err[256];
    if (ecs_client_connect(&cfg, &c, err, sizeof err) != ECS_OK) {
      c = NULL;
      usleep(100 * 1000);
    }
  }
  assert_non_null(c);

  /* Before: puts and gets work through the sentinels' master. */
  int n = 0;
  for (; n < 20; n++)
    assert_int_equal(put_one(c, n), ECS_OK);
  for (int i = 0; i < n; i++)
    assert_int_equal(get_one(c, i), ECS_OK);

  /* The replica misses what follows: it is stopped, its link is cut (the
   * master drops what it had not sent), a few more objects are put, and
   * the master dies before the replica runs again. */
  assert_int_equal(ecs_ts_signal(&replica, SIGSTOP), 0);
  redisContext *mr = ecs_ts_redis_at(master.port);
  assert_non_null(mr);
  redisReply *r = redisCommand(mr, "CLIENT KILL TYPE replica");
  assert_non_null(r);
  freeReplyObject(r);
  redisFree(mr);
  int late_first = n;
  for (; n < late_first + 5; n++)
    assert_int_equal(put_one(c, n), ECS_OK);
  ecs_ts_kill9(&master);
  uint64_t t0 = ecs_now_ms();
  assert_int_equal(ecs_ts_signal(&replica, SIGCONT), 0);
  /* How many of those records the replica lacks (all, unless the cut
   * raced a write): the re-sync must restore them. */
  redisContext *rr = ecs_ts_redis_at(replica.port);
  int lacking = 0;
  for (int i = late_first; rr != NULL && i < n; i++) {
    redisReply *e = redisCommand(rr, "EXISTS ecs:{test}:obj:ha-%d", i);
    lacking += e != NULL && e->type == REDIS_REPLY_INTEGER && e->integer == 0;
    if (e != NULL)
      freeReplyObject(e);
  }
  if (rr != NULL)
    redisFree(rr);
  printf("failover: the replica lacks %d of the %d records written after its link was cut\n", lacking,
         n - late_first);

  double put_ok_s = -1, get_ok_s = -1;
  int bad_puts = 0, bad_gets = 0;
  t_end = t0 + 90000;
  while (ecs_now_ms() < t_end && n < NKEYS) {
    int rc = put_one(c, n);
    double t = (double)(ecs_now_ms() - t0) / 1000.0;
    /* "ok again": the first success after the last failure */
    if (rc == ECS_OK) {
      if (put_ok_s < 0)
        put_ok_s = t;
      n++;
    } else {
      bad_puts++;
      put_ok_s = -1;
    }
    rc = get_one(c, (int)((unsigned)rand() % (unsigned)late_first)); /* replicated before the cut */
    t = (double)(ecs_now_ms() - t0) / 1000.0;
    if (rc == ECS_OK) {
      if (get_ok_s < 0)
        get_ok_s = t;
    } else {
      bad_gets++;
      get_ok_s = -1;
    }
    if (bad_gets > 0 && put_ok_s >= 0 && get_ok_s >= 0 && t > put_ok_s + 2 && t > get_ok_s + 2)
      break;
    usleep(rc != ECS_OK ? 50 * 1000 : 5 * 1000);
  }
  printf(
      "failover: puts ok again after %.2f s, gets after %.2f s (%d failed puts, %d failed gets meanwhile)\n",
      put_ok_s, get_ok_s, bad_puts, bad_gets);
  assert_true(put_ok_s >= 0);
  assert_true(get_ok_s >= 0);

  /* Every object is found again: the records the new master never got
   * were republished by the server's re-sync. */
  int missing = 0;
  t_end = ecs_now_ms() + 30000;
  do {
    missing = 0;
    for (int i = 0; i < n; i++)
      missing += get_one(c, i) != ECS_OK;
    if (missing)
      usleep(300 * 1000);
  } while (missing && ecs_now_ms() < t_end);
  printf("failover: %d objects, %d not found after the re-sync\n", n, missing);
  assert_int_equal(missing, 0);

  ecs_client_close(c);
  assert_int_equal(ecs_ts_stop(&server, 5000), 0);
  for (int i = 0; i < 3; i++)
    ecs_ts_stop(&sent[i], 3000);
  ecs_ts_stop(&replica, 3000);
  ecs_ts_stop(&master, 3000);
}

/* ---- Sentinels with AUTH ------------------------------------------------ */

#define MPW "master-secret-7f3a"
#define SPW "sentinel-secret-91c2"

static void write_secret(const char *path, const char *pw) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "%s\n", pw);
  fclose(f);
  assert_int_equal(chmod(path, 0600), 0);
}

/* Whether the file at path holds s. */
static int file_holds(const char *path, const char *s) {
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return 0;
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  for (size_t i = 0; i < n; i++)
    if (buf[i] == '\0')
      buf[i] = ' '; /* /proc/PID/cmdline */
  return strstr(buf, s) != NULL;
}

/* One blocking link's PING through url: its code, its message in msg. */
static int ping_through(const char *url, char *msg, size_t cap) {
  ecs__rds_t r;
  int rc = ecs__rds_init(&r, url, 500, 500);
  if (rc == ECS_OK) {
    redisReply *rep = NULL;
    const char *argv[] = {"PING"};
    rc = ecs__rds_cmd(&r, &rep, 1, argv, NULL);
    if (rep != NULL)
      freeReplyObject(rep);
  }
  snprintf(msg, cap, "%s", ecs__rds_errmsg(&r));
  ecs__rds_close(&r);
  memset(&r, 0, sizeof r);
  return rc;
}

/* Three sentinels with requirepass, a master and a replica with
 * requirepass too: a server given the passwords in files
 * (--redis-password-file, --sentinel-password-file), a client given them
 * in the environment, and the connector given them in files
 * (redis_password_file, sentinel_password_file), all through a
 * redis-sentinel:// URL; the master killed: the failover is followed.  A
 * wrong or missing sentinel password: ECS_EAUTH at once, naming the
 * sentinel, never the password. */
/* Opens a connector from the JSON config js, registers worker
 * "prefill-TAG" at addr and looks it up as "decode-TAG" (what: the
 * context of a failure); returns the open connector. */
static ecs_ec_conn_t *kv_handoff(const char *js, const char *tag, const char *addr, const char *what) {
  char err[512] = "";
  ecs_ec_config_t ecfg;
  ecs_ec_config_init(&ecfg);
  assert_int_equal(ecs_ec_config_parse_json(&ecfg, js, 0, err, sizeof err), ECS_OK);
  ecs_ec_conn_t *ec = NULL;
  int rc = ecs_ec_open(&ecfg, &ec, err, sizeof err);
  if (rc != ECS_OK)
    fprintf(stderr, "connector open: %s: %s\n", ecs_strerror(rc), err);
  assert_int_equal(rc, ECS_OK);
  ecs_kv_worker_t w, self, got;
  memset(&w, 0, sizeof w);
  snprintf(w.instance_id, sizeof w.instance_id, "prefill-%s", tag);
  w.role = ECS_KV_PREFILL;
  w.tp_size = 1;
  snprintf(w.address, sizeof w.address, "%s", addr);
  self = w;
  snprintf(self.instance_id, sizeof self.instance_id, "decode-%s", tag);
  self.role = ECS_KV_DECODE;
  char why[256] = "";
  rc = ecs_kv_register(ec, &w, why, sizeof why);
  if (rc != ECS_OK)
    fprintf(stderr, "%s: %s: %s\n", what, ecs_strerror(rc), why);
  assert_int_equal(rc, ECS_OK);
  assert_int_equal(ecs_kv_lookup(ec, &self, w.instance_id, 0, 0, &got, why, sizeof why), ECS_OK);
  assert_string_equal(got.address, addr);
  return ec;
}

static void test_sentinel_auth(void **state) {
  (void)state;
  unsetenv("ECSTORE_REDIS_PASSWORD");
  unsetenv("ECSTORE_SENTINEL_PASSWORD");
  ecs_ts_proc_t master = {0}, replica = {0}, sent[3] = {{0}}, server = {0};
  master.port = ecs_ts_free_port();
  const char *mextra[] = {"--requirepass", MPW, "--masterauth", MPW, NULL};
  assert_int_equal(redis_spawn(&master, mextra), 0);
  char mport[16];
  snprintf(mport, sizeof mport, "%d", master.port);
  replica.port = ecs_ts_free_port();
  const char *rextra[] = {"--replicaof", "127.0.0.1", mport, "--requirepass", MPW, "--masterauth", MPW, NULL};
  assert_int_equal(redis_spawn(&replica, rextra), 0);
  for (int i = 0; i < 3; i++)
    assert_int_equal(sentinel_spawn_auth(&sent[i], master.port, SPW, MPW), 0);
  uint64_t t_end = ecs_now_ms() + 60000;
  int ready = 0;
  while (!ready && ecs_now_ms() < t_end) {
    ready = replica_synced(replica.port, MPW);
    for (int i = 0; i < 3 && ready; i++)
      ready = sentinel_ready(sent[i].port, SPW);
    if (!ready)
      usleep(200 * 1000);
  }
  assert_true(ready);

  char url[300], msg[512];
  snprintf(url, sizeof url, "redis-sentinel://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d/" MASTER, sent[0].port,
           sent[1].port, sent[2].port);

  /* No sentinel password: the sentinels' NOAUTH, named, at once. */
  setenv("ECSTORE_REDIS_PASSWORD", MPW, 1);
  uint64_t t0 = ecs_now_ms();
  assert_int_equal(ping_through(url, msg, sizeof msg), ECS_EAUTH);
  printf("no sentinel password: %s\n", msg);
  assert_true(ecs_now_ms() - t0 < 5000);
  char named[64];
  snprintf(named, sizeof named, "sentinel 127.0.0.1:%d: NOAUTH", sent[0].port);
  assert_non_null(strstr(msg, named));
  /* The master's password is not tried on the sentinels (docs/redis-ha.md). */
  /* A wrong one: refused, named, the password never in the message. */
  setenv("ECSTORE_SENTINEL_PASSWORD", "wrong-pw-5d1e", 1);
  t0 = ecs_now_ms();
  assert_int_equal(ping_through(url, msg, sizeof msg), ECS_EAUTH);
  printf("wrong sentinel password: %s\n", msg);
  assert_true(ecs_now_ms() - t0 < 5000);
  snprintf(named, sizeof named, "sentinel 127.0.0.1:%d: authentication failed", sent[0].port);
  assert_non_null(strstr(msg, named));
  assert_null(strstr(msg, "wrong-pw-5d1e"));
  /* The right one: through. */
  setenv("ECSTORE_SENTINEL_PASSWORD", SPW, 1);
  assert_int_equal(ping_through(url, msg, sizeof msg), ECS_OK);
  unsetenv("ECSTORE_REDIS_PASSWORD");
  unsetenv("ECSTORE_SENTINEL_PASSWORD");

  /* The server: both passwords from files, neither in its argv nor log. */
  char dir[256], mpwf[300], spwf[300];
  assert_int_equal(ecs_ts_mkdtemp(dir, sizeof dir), 0);
  snprintf(mpwf, sizeof mpwf, "%s/master-pw", dir);
  snprintf(spwf, sizeof spwf, "%s/sentinel-pw", dir);
  write_secret(mpwf, MPW);
  write_secret(spwf, SPW);
  const char *sextra[] = {"--redis",
                          url,
                          "--redis-password-file",
                          mpwf,
                          "--sentinel-password-file",
                          spwf,
                          "--heartbeat-ttl",
                          "3",
                          "--redis-timeout-ms",
                          "500",
                          "--log-level",
                          "debug",
                          NULL};
  assert_int_equal(ecs_ts_server_start(&server, 0, sextra), 0);

  /* The client: both passwords from the environment. */
  setenv("ECSTORE_REDIS_PASSWORD", MPW, 1);
  setenv("ECSTORE_SENTINEL_PASSWORD", SPW, 1);
  ecs_client_config_t cfg;
  ecs_ts_client_config(&cfg, NULL, "tcp");
  cfg.servers = NULL;
  cfg.redis_url = url;
  cfg.timeout_ms = 2000;
  cfg.connect_timeout_ms = 500;
  ecs_client_t *c = NULL;
  char err[256] = "";
  for (int i = 0; i < 100 && c == NULL; i++) {
    if (ecs_client_connect(&cfg, &c, err, sizeof err) != ECS_OK) {
      c = NULL;
      usleep(100 * 1000);
    }
  }
  if (c == NULL)
    fprintf(stderr, "client: %s\n", err);
  assert_non_null(c);
  unsetenv("ECSTORE_REDIS_PASSWORD");
  unsetenv("ECSTORE_SENTINEL_PASSWORD");
  int n = 0;
  for (; n < 10; n++)
    assert_int_equal(put_one(c, n), ECS_OK);
  for (int i = 0; i < n; i++)
    assert_int_equal(get_one(c, i), ECS_OK);

  /* The connector: both passwords from files (no environment). */
  {
    char js[1400];
    snprintf(
        js, sizeof js,
        "{\"backend\": \"redis\", \"redis_url\": \"%s\", \"namespace\": \"sauth\", \"timeout_ms\": 2000,"
        " \"connect_timeout_ms\": 1000, \"redis_password_file\": \"%s\", \"sentinel_password_file\": \"%s\"}",
        url, mpwf, spwf);
    ecs_ec_conn_t *ec = kv_handoff(js, "s", "10.0.0.7:8100", "kv register through authenticated sentinels");
    ecs_ec_close(ec);
    /* a wrong sentinel password in the file: the connector refuses to
     * open, naming the sentinel */
    char wpwf[300];
    snprintf(wpwf, sizeof wpwf, "%s/wrong-pw", dir);
    write_secret(wpwf, "wrong-pw-77ab");
    snprintf(
        js, sizeof js,
        "{\"backend\": \"redis\", \"redis_url\": \"%s\", \"namespace\": \"sauth\", \"timeout_ms\": 2000,"
        " \"connect_timeout_ms\": 1000, \"redis_password_file\": \"%s\", \"sentinel_password_file\": \"%s\"}",
        url, mpwf, wpwf);
    ecs_ec_config_t ecfg;
    ecs_ec_config_init(&ecfg);
    assert_int_equal(ecs_ec_config_parse_json(&ecfg, js, 0, err, sizeof err), ECS_OK);
    assert_int_equal(ecs_ec_open(&ecfg, &ec, err, sizeof err), ECS_EAUTH);
    printf("connector, wrong sentinel password: %s\n", err);
    snprintf(named, sizeof named, "sentinel 127.0.0.1:%d: authentication failed", sent[0].port);
    assert_non_null(strstr(err, named));
    assert_null(strstr(err, "wrong-pw-77ab"));
    unlink(wpwf);
  }

  /* The failover, followed by the server and the client. */
  ecs_ts_kill9(&master);
  t0 = ecs_now_ms();
  double put_ok_s = -1;
  t_end = t0 + 60000;
  while (ecs_now_ms() < t_end) {
    int rc = put_one(c, n);
    if (rc == ECS_OK && get_one(c, 0) == ECS_OK) {
      put_ok_s = (double)(ecs_now_ms() - t0) / 1000.0;
      n++;
      break;
    }
    usleep(100 * 1000);
  }
  printf("sentinel auth failover: puts and gets ok again after %.2f s\n", put_ok_s);
  assert_true(put_ok_s >= 0);
  /* the new master (the replica) holds the new record: the server's link
   * followed the sentinels there */
  redisContext *nr = redis_auth_at(replica.port, MPW);
  assert_non_null(nr);
  int found = 0;
  for (int i = 0; i < 100 && !found; i++) {
    redisReply *e = redisCommand(nr, "EXISTS ecs:{test}:obj:ha-%d", n - 1);
    found = e != NULL && e->type == REDIS_REPLY_INTEGER && e->integer == 1;
    if (e != NULL)
      freeReplyObject(e);
    if (!found)
      usleep(100 * 1000);
  }
  redisFree(nr);
  assert_true(found);

  char cmdline[64];
  snprintf(cmdline, sizeof cmdline, "/proc/%d/cmdline", (int)server.pid);
  assert_int_equal(file_holds(cmdline, SPW), 0);
  assert_int_equal(file_holds(server.log, SPW), 0);
  assert_int_equal(file_holds(server.log, MPW), 0);

  ecs_client_close(c);
  assert_int_equal(ecs_ts_stop(&server, 5000), 0);
  for (int i = 0; i < 3; i++)
    ecs_ts_stop(&sent[i], 3000);
  ecs_ts_stop(&replica, 3000);
  ecs_ts_stop(&master, 3000);
  unlink(mpwf);
  unlink(spwf);
  rmdir(dir);
}

/* ---- Redis Cluster ------------------------------------------------------ */

static long long cmd_int(int port, const char *fmt, const char *arg) {
  redisContext *c = ecs_ts_redis_at(port);
  if (c == NULL)
    return -1;
  redisReply *r = redisCommand(c, fmt, arg);
  long long v = r != NULL && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
  if (r != NULL)
    freeReplyObject(r);
  redisFree(c);
  return v;
}

/* The master port that serves slot, from CLUSTER SLOTS at port, or -1. */
static int slot_owner(int port, long long slot) {
  redisContext *c = ecs_ts_redis_at(port);
  if (c == NULL)
    return -1;
  redisReply *r = redisCommand(c, "CLUSTER SLOTS");
  int owner = -1;
  for (size_t i = 0; r != NULL && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
    redisReply *e = r->element[i];
    if (e->type == REDIS_REPLY_ARRAY && e->elements >= 3 && e->element[0]->integer <= slot &&
        slot <= e->element[1]->integer && e->element[2]->type == REDIS_REPLY_ARRAY &&
        e->element[2]->elements >= 2)
      owner = (int)e->element[2]->element[1]->integer;
  }
  if (r != NULL)
    freeReplyObject(r);
  redisFree(c);
  return owner;
}

static int cluster_ok(int port) {
  redisContext *c = ecs_ts_redis_at(port);
  if (c == NULL)
    return 0;
  redisReply *r = redisCommand(c, "CLUSTER INFO");
  int ok = r != NULL && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok") != NULL;
  if (r != NULL)
    freeReplyObject(r);
  redisFree(c);
  return ok;
}

/* A three-master cluster; two namespaces whose slots live on the second
 * and the third master, each served by an ecstore-server given only the
 * first master (so every link must follow MOVED); puts through clients
 * pointed at the first master too; records published on the right
 * masters and exists true through Redis. */
static void test_cluster(void **state) {
  (void)state;
  ecs_ts_proc_t node[3] = {{0}}, srv[2] = {{0}};
  for (int i = 0; i < 3; i++) {
    char bus[16]; /* the bus port defaults to port + 10000, which may not exist */
    snprintf(bus, sizeof bus, "%d", ecs_ts_free_port());
    const char *cextra[] = {"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                            "--cluster-node-timeout", "5000", "--cluster-port", bus,
                            /* the first seed is killed at the end: the
                             * others keep serving their own slots */
                            "--cluster-require-full-coverage", "no", NULL};
    node[i].port = ecs_ts_free_port();
    assert_int_equal(redis_spawn(&node[i], cextra), 0);
  }
  char cmd[600];
  snprintf(
      cmd, sizeof cmd,
      "redis-cli --cluster create 127.0.0.1:%d 127.0.0.1:%d 127.0.0.1:%d --cluster-yes >%s/create.log 2>&1",
      node[0].port, node[1].port, node[2].port, node[0].dir);
  assert_int_equal(system(cmd), 0);
  uint64_t t_end = ecs_now_ms() + 30000;
  int ok = 0;
  while (!ok && ecs_now_ms() < t_end) {
    ok = cluster_ok(node[0].port) && cluster_ok(node[1].port) && cluster_ok(node[2].port);
    if (!ok)
      usleep(200 * 1000);
  }
  assert_true(ok);

  /* Namespaces on node 1 and node 2 (never node 0, the one every URL names). */
  char ns[2][32];
  for (int want = 0; want < 2; want++) {
    ns[want][0] = '\0';
    for (int i = 0; i < 1000 && !ns[want][0]; i++) {
      char name[32], key[64];
      snprintf(name, sizeof name, "ns%d", i);
      snprintf(key, sizeof key, "ecs:{%s}:nodes", name);
      long long slot = cmd_int(node[0].port, "CLUSTER KEYSLOT %s", key);
      if (slot >= 0 && slot_owner(node[0].port, slot) == node[1 + want].port)
        snprintf(ns[want], sizeof ns[want], "%s", name);
    }
    assert_true(ns[want][0] != '\0');
  }
  printf("cluster: namespace %s on master :%d (redis-cluster:// URL), %s on master :%d (redis:// URL); every "
         "URL "
         "names :%d\n",
         ns[0], node[1].port, ns[1], node[2].port, node[0].port);

  /* The sync link: MOVED followed for one command, without a route key. */
  char seed[64];
  snprintf(seed, sizeof seed, "127.0.0.1:%d", node[0].port);
  ecs__rds_t r;
  assert_int_equal(ecs__rds_init(&r, seed, 2000, 2000), ECS_OK);
  char k0[64];
  snprintf(k0, sizeof k0, "ecs:{%s}:probe", ns[0]);
  const char *hset[] = {"SET", k0, "v"};
  redisReply *rep = NULL;
  assert_int_equal(ecs__rds_cmd(&r, &rep, 3, hset, NULL), ECS_OK);
  freeReplyObject(rep);
  assert_int_equal(r.port, node[1].port); /* the link followed the slot */
  ecs__rds_close(&r);

  /* ns[0] through a redis-cluster:// URL (slots probed from the first
   * connect), ns[1] through a plain one (cluster found from a MOVED) */
  char curl[80], *urls[2] = {curl, seed};
  snprintf(curl, sizeof curl, "redis-cluster://127.0.0.1:%d", node[0].port);
  for (int s = 0; s < 2; s++) {
    const char *sx[] = {"--redis", urls[s], "--ns", ns[s], NULL};
    assert_int_equal(ecs_ts_server_start(&srv[s], node[0].port, sx), 0);
  }
  for (int s = 0; s < 2; s++) {
    char servers[64];
    snprintf(servers, sizeof servers, "127.0.0.1:%d", srv[s].port);
    ecs_client_config_t cfg;
    ecs_ts_client_config(&cfg, servers, "tcp");
    cfg.ns = ns[s];
    cfg.redis_url = urls[s];
    ecs_client_t *c = ecs_ts_connect(&cfg);
    assert_non_null(c);
    /* the server's async link reaches the namespace's master through a
     * MOVED at its first connect: until then a put's record is not
     * acknowledged (ECS_EREDIS, stored but not published) */
    int rc0 = ECS_EREDIS;
    t_end = ecs_now_ms() + 20000;
    for (int w = 1000; (rc0 = put_one(c, w)) != ECS_OK && ecs_now_ms() < t_end; w++)
      usleep(50 * 1000);
    assert_int_equal(rc0, ECS_OK);
    for (int i = 0; i < 10; i++) {
      int rc = put_one(c, i);
      if (rc != ECS_OK)
        fprintf(stderr, "put %d: %s: %s\n", i, ecs_strerror(rc), ecs_client_errmsg(c));
      assert_int_equal(rc, ECS_OK);
    }
    ecs_key_t keys[10];
    char names[10][32];
    int ex[10];
    for (int i = 0; i < 10; i++) {
      key_of(names[i], sizeof names[i], i);
      keys[i] = (ecs_key_t){names[i], strlen(names[i])};
    }
    int found = 0;
    t_end = ecs_now_ms() + 20000;
    while (found < 10 && ecs_now_ms() < t_end) {
      found = 0;
      int rc = ecs_exists_batch(c, keys, 10, ex);
      for (int i = 0; rc == ECS_OK && i < 10; i++)
        found += ex[i] == 1;
      if (found < 10)
        usleep(100 * 1000);
    }
    assert_int_equal(found, 10);
    for (int i = 0; i < 10; i++)
      assert_int_equal(get_one(c, i), ECS_OK);
    /* the records are on the namespace's master */
    char rk[160];
    snprintf(rk, sizeof rk, "ecs:{%s}:obj:%s", ns[s], names[3]);
    assert_int_equal(cmd_int(node[1 + s].port, "EXISTS %s", rk), 1);
    ecs_client_close(c);
  }
  for (int s = 0; s < 2; s++)
    assert_int_equal(ecs_ts_stop(&srv[s], 5000), 0);

  /* A seed list whose first seed is dead: the blocking link, a server (its
   * async link) and a client start and work through the next seeds, and
   * follow MOVED from there. */
  {
    char surl[200];
    snprintf(surl, sizeof surl, "redis-cluster://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", ecs_ts_free_port(),
             node[0].port, node[2].port);
    assert_int_equal(ecs__rds_init(&r, surl, 2000, 2000), ECS_OK);
    assert_int_equal(ecs__rds_cmd(&r, &rep, 3, hset, NULL), ECS_OK);
    freeReplyObject(rep);
    assert_int_equal(r.port, node[1].port); /* a live seed, then the slot's master */
    ecs__rds_close(&r);
    ecs_ts_proc_t ss = {0};
    const char *sx[] = {"--redis", surl, "--ns", ns[0], NULL};
    assert_int_equal(ecs_ts_server_start(&ss, node[0].port, sx), 0);
    char servers[64];
    snprintf(servers, sizeof servers, "127.0.0.1:%d", ss.port);
    ecs_client_config_t cfg;
    ecs_ts_client_config(&cfg, servers, "tcp");
    cfg.ns = ns[0];
    cfg.redis_url = surl;
    ecs_client_t *c = ecs_ts_connect(&cfg);
    assert_non_null(c);
    int rc0 = ECS_EREDIS;
    t_end = ecs_now_ms() + 20000;
    for (int w = 2000; (rc0 = put_one(c, w)) != ECS_OK && ecs_now_ms() < t_end; w++)
      usleep(50 * 1000);
    assert_int_equal(rc0, ECS_OK);
    ecs_key_t keys[10];
    char names[10][32];
    int ex[10], found = 0;
    for (int i = 0; i < 10; i++) {
      assert_int_equal(put_one(c, 100 + i), ECS_OK);
      key_of(names[i], sizeof names[i], 100 + i);
      keys[i] = (ecs_key_t){names[i], strlen(names[i])};
    }
    t_end = ecs_now_ms() + 20000;
    while (found < 10 && ecs_now_ms() < t_end) {
      found = 0;
      int rc = ecs_exists_batch(c, keys, 10, ex);
      for (int i = 0; rc == ECS_OK && i < 10; i++)
        found += ex[i] == 1;
      if (found < 10)
        usleep(100 * 1000);
    }
    assert_int_equal(found, 10);
    for (int i = 0; i < 10; i++)
      assert_int_equal(get_one(c, 100 + i), ECS_OK);
    char rk[160];
    snprintf(rk, sizeof rk, "ecs:{%s}:obj:%s", ns[0], names[3]);
    assert_int_equal(cmd_int(node[1].port, "EXISTS %s", rk), 1);
    printf("cluster: seed list with a dead first seed: server, client and link through the others\n");
    ecs_client_close(c);
    assert_int_equal(ecs_ts_stop(&ss, 5000), 0);
  }

  /* The connector's KV handoff on the cluster: its registry script names
   * three keys, which must share the namespace's slot (ecs:{NS}:kv:...),
   * and the handoff's link follows ns[1]'s slot away from the URL's node. */
  {
    char js[512];
    snprintf(js, sizeof js,
             "{\"backend\": \"redis\", \"redis_url\": \"%s\", \"namespace\": \"%s\", \"timeout_ms\": 2000,"
             " \"connect_timeout_ms\": 1000}",
             curl, ns[1]);
    ecs_ec_conn_t *ec = kv_handoff(js, "a", "10.0.0.5:8100", "kv register on the cluster");
    char wk[128];
    snprintf(wk, sizeof wk, "ecs:{%s}:kv:inst:prefill-a", ns[1]);
    assert_int_equal(cmd_int(node[2].port, "EXISTS %s", wk), 1); /* on the namespace's master */
    ecs_ec_close(ec);
  }

  /* ASK: ns[0]'s slot migrating from node 1 to node 2; a key node 1 does
   * not hold is answered ASK, and ecs__rds_cmd retries it at node 2 after
   * ASKING.  (Last: the slot stays half-migrated.) */
  char id1[64] = "", id2[64] = "", slot[16];
  for (int i = 1; i <= 2; i++) {
    redisContext *nc = ecs_ts_redis_at(node[i].port);
    assert_non_null(nc);
    redisReply *id = redisCommand(nc, "CLUSTER MYID");
    assert_true(id != NULL && id->type == REDIS_REPLY_STRING && id->len < 64);
    snprintf(i == 1 ? id1 : id2, 64, "%s", id->str);
    freeReplyObject(id);
    redisFree(nc);
  }
  snprintf(slot, sizeof slot, "%lld", cmd_int(node[0].port, "CLUSTER KEYSLOT %s", k0));
  redisContext *n1 = ecs_ts_redis_at(node[1].port), *n2 = ecs_ts_redis_at(node[2].port);
  assert_true(n1 != NULL && n2 != NULL);
  redisReply *x = redisCommand(n2, "CLUSTER SETSLOT %s IMPORTING %s", slot, id1);
  assert_true(x != NULL && x->type == REDIS_REPLY_STATUS);
  freeReplyObject(x);
  x = redisCommand(n1, "CLUSTER SETSLOT %s MIGRATING %s", slot, id2);
  assert_true(x != NULL && x->type == REDIS_REPLY_STATUS);
  freeReplyObject(x);
  char k1[64];
  snprintf(k1, sizeof k1, "ecs:{%s}:askprobe", ns[0]);
  const char *set1[] = {"SET", k1, "w"};
  assert_int_equal(ecs__rds_init(&r, seed, 2000, 2000), ECS_OK);
  assert_int_equal(ecs__rds_cmd(&r, &rep, 3, set1, NULL), ECS_OK);
  freeReplyObject(rep);
  x = redisCommand(n2, "ASKING");
  freeReplyObject(x);
  x = redisCommand(n2, "GET %s", k1); /* it went to node 2 */
  assert_true(x != NULL && x->type == REDIS_REPLY_STRING && strcmp(x->str, "w") == 0);
  freeReplyObject(x);
  ecs__rds_close(&r);
  redisFree(n1);
  redisFree(n2);

  /* The first seed killed: a server and a client given all three seeds
   * start and work through the others (ns[1] lives on node 2). */
  ecs_ts_kill9(&node[0]);
  {
    char kurl[200];
    snprintf(kurl, sizeof kurl, "redis-cluster://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", node[0].port,
             node[1].port, node[2].port);
    ecs_ts_proc_t ks = {0};
    const char *sx[] = {"--redis", kurl, "--ns", ns[1], NULL};
    assert_int_equal(ecs_ts_server_start(&ks, node[0].port, sx), 0);
    char servers[64];
    snprintf(servers, sizeof servers, "127.0.0.1:%d", ks.port);
    ecs_client_config_t cfg;
    ecs_ts_client_config(&cfg, servers, "tcp");
    cfg.ns = ns[1];
    cfg.redis_url = kurl;
    ecs_client_t *c = ecs_ts_connect(&cfg);
    assert_non_null(c);
    int rc0 = ECS_EREDIS;
    t_end = ecs_now_ms() + 20000;
    for (int w = 3000; (rc0 = put_one(c, w)) != ECS_OK && ecs_now_ms() < t_end; w++)
      usleep(50 * 1000);
    assert_int_equal(rc0, ECS_OK);
    assert_int_equal(put_one(c, 300), ECS_OK);
    char name[32];
    key_of(name, sizeof name, 300);
    ecs_key_t key = {name, strlen(name)};
    int ex = 0;
    t_end = ecs_now_ms() + 20000;
    while (ex != 1 && ecs_now_ms() < t_end) {
      if (ecs_exists_batch(c, &key, 1, &ex) != ECS_OK || ex != 1)
        usleep(100 * 1000);
    }
    assert_int_equal(ex, 1);
    assert_int_equal(get_one(c, 300), ECS_OK);
    char rk[160];
    snprintf(rk, sizeof rk, "ecs:{%s}:obj:%s", ns[1], name);
    assert_int_equal(cmd_int(node[2].port, "EXISTS %s", rk), 1);
    printf("cluster: first seed killed: server and client through the other seeds\n");
    ecs_client_close(c);
    assert_int_equal(ecs_ts_stop(&ks, 5000), 0);
  }
  for (int i = 0; i < 3; i++)
    ecs_ts_stop(&node[i], 3000);
}

/* redis-sentinel:// URLs: parsed, formatted without the password,
 * redacted; malformed ones refused. */
static void test_sentinel_url(void **state) {
  (void)state;
  ecs__rds_url_t u;
  assert_int_equal(ecs__rds_url_parse("redis-sentinel://alice:pw@h1:26379,[::1]:26380,h3/mymaster/2", &u),
                   ECS_OK);
  assert_string_equal(u.sentinels, "h1:26379,[::1]:26380,h3");
  assert_string_equal(u.master, "mymaster");
  assert_int_equal(u.db, 2);
  assert_string_equal(u.user, "alice");
  assert_string_equal(u.pass, "pw");
  assert_string_equal(u.host, "h1");
  assert_int_equal(u.port, 26379);
  char out[600];
  assert_int_equal(ecs__rds_url_format(&u, 0, out, sizeof out), ECS_OK);
  assert_string_equal(out, "redis-sentinel://alice@h1:26379,[::1]:26380,h3/mymaster/2");
  assert_string_equal(ecs__rds_url_redact("redis-sentinel://alice:pw@h1:1/m", out, sizeof out),
                      "redis-sentinel://alice:***@h1:1/m");
  assert_int_equal(ecs__rds_url_parse("redis-cluster://bob:pw@h:7000", &u), ECS_OK);
  assert_true(u.cluster && u.port == 7000 && !u.master[0]);
  assert_int_equal(ecs__rds_url_format(&u, 0, out, sizeof out), ECS_OK);
  assert_string_equal(out, "redis-cluster://bob@h:7000/0");
  assert_int_equal(ecs__rds_url_parse("redis-sentinel://h1:1/m", &u), ECS_OK);
  assert_int_equal(u.db, 0);
  const char *bad[] = {"redis-sentinel://h1:1",       "redis-sentinel://h1:1/",
                       "redis-sentinel:///m",         "redis-sentinel://h1:1,/m",
                       "redis-sentinel://,h1:1/m",    "redis-sentinel://h1:0/m",
                       "redis-sentinel://h1:1/m/x",   "redis-sentinel://h1:1/m n",
                       "redis-sentinel://h1:99999/m", "redis-sentinel://a,b,c,d,e,f,g,h,i/m",
                       "redis-sentinel://h1:1/a@b",   "redis-sentinel://h1:1/m:x"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    if (ecs__rds_url_parse(bad[i], &u) != ECS_EINVAL)
      fail_msg("accepted %s", bad[i]);
  }

  /* The sentinels' own credentials: a query, %XX-escaped, formatted back
   * (the password only on request), redacted. */
  assert_int_equal(ecs__rds_url_parse(
                       "redis-sentinel://:mp@h1:1,h2:2/m?sentinel_user=sam&sentinel_password=p%40s%26s", &u),
                   ECS_OK);
  assert_string_equal(u.suser, "sam");
  assert_string_equal(u.spass, "p@s&s");
  assert_string_equal(u.pass, "mp");
  assert_string_equal(u.master, "m");
  assert_string_equal(u.sentinels, "h1:1,h2:2");
  assert_int_equal(ecs__rds_url_format(&u, 0, out, sizeof out), ECS_OK);
  assert_string_equal(out, "redis-sentinel://h1:1,h2:2/m/0?sentinel_user=sam");
  assert_int_equal(ecs__rds_url_format(&u, 1, out, sizeof out), ECS_OK);
  assert_string_equal(out,
                      "redis-sentinel://:mp@h1:1,h2:2/m/0?sentinel_user=sam&sentinel_password=p%40s%26s");
  ecs__rds_url_t u2;
  assert_int_equal(ecs__rds_url_parse(out, &u2), ECS_OK);
  assert_string_equal(u2.spass, "p@s&s");
  assert_string_equal(
      ecs__rds_url_redact("redis-sentinel://:mp@h1:1/m?sentinel_password=sp@x&sentinel_user=a", out,
                          sizeof out),
      "redis-sentinel://:***@h1:1/m?sentinel_password=***&sentinel_user=a");
  assert_string_equal(ecs__rds_url_redact("redis-sentinel://h1:1/m?sentinel_password=sp", out, sizeof out),
                      "redis-sentinel://h1:1/m?sentinel_password=***");
  assert_int_equal(ecs__rds_url_has_password("redis-sentinel://h1:1/m?sentinel_password=sp"), 1);
  assert_int_equal(ecs__rds_url_has_password("redis-sentinel://h1:1/m?sentinel_user=sp"), 0);
  /* a '?' in the master's password is no query */
  assert_int_equal(ecs__rds_url_parse("redis-sentinel://:pa?ss@h1:1/m", &u), ECS_OK);
  assert_string_equal(u.pass, "pa?ss");
  assert_string_equal(u.spass, "");
  assert_string_equal(ecs__rds_url_redact("redis-sentinel://:pa?ss@h1:1/m", out, sizeof out),
                      "redis-sentinel://:***@h1:1/m");
  /* a sentinel user needs a password somewhere */
  unsetenv("ECSTORE_SENTINEL_PASSWORD");
  char err[300];
  assert_int_equal(ecs__rds_url_resolve("redis-sentinel://h1:1/m?sentinel_user=sam", &u, err, sizeof err),
                   ECS_EINVAL);
  assert_non_null(strstr(err, "ECSTORE_SENTINEL_PASSWORD"));
  setenv("ECSTORE_SENTINEL_PASSWORD", "from-env", 1);
  assert_int_equal(ecs__rds_url_resolve("redis-sentinel://h1:1/m?sentinel_user=sam", &u, err, sizeof err),
                   ECS_OK);
  assert_string_equal(u.spass, "from-env");
  assert_int_equal(ecs__rds_url_resolve("redis://h1:1", &u, err, sizeof err), ECS_OK);
  assert_string_equal(u.spass, ""); /* only a sentinel URL takes it */
  unsetenv("ECSTORE_SENTINEL_PASSWORD");

  /* redis-cluster:// seed lists */
  assert_int_equal(ecs__rds_url_parse("redis-cluster://bob:pw@h1:7000,h2:7001,[::1]:7002/0", &u), ECS_OK);
  assert_true(u.cluster && u.port == 7000);
  assert_string_equal(u.host, "h1");
  assert_string_equal(u.seeds, "h1:7000,h2:7001,[::1]:7002");
  assert_int_equal(ecs__rds_url_format(&u, 0, out, sizeof out), ECS_OK);
  assert_string_equal(out, "redis-cluster://bob@h1:7000,h2:7001,[::1]:7002/0");
  assert_int_equal(ecs__rds_url_parse("redis-cluster://h1:7000", &u), ECS_OK);
  assert_string_equal(u.seeds, "");
  const char *bad2[] = {"redis-sentinel://h1:1/m?sentinel_pass=x",
                        "redis-sentinel://h1:1/m?sentinel_password=",
                        "redis-sentinel://h1:1/m?sentinel_user=a&",
                        "redis-sentinel://h1:1/m?sentinel_password=%zz",
                        "redis-cluster://h1:1,",
                        "redis-cluster://h1:1,,h2:2",
                        "redis-cluster://,h1:1",
                        "redis-cluster://h1:1,h2:0",
                        "redis-cluster://a,b,c,d,e,f,g,h,i",
                        "redis://h1:1,h2:2"};
  for (size_t i = 0; i < sizeof bad2 / sizeof bad2[0]; i++) {
    if (ecs__rds_url_parse(bad2[i], &u) != ECS_EINVAL)
      fail_msg("accepted %s", bad2[i]);
  }
}

/* No sentinel answers: a clear error naming each one, within the
 * deadlines (no wait forever). */
static void test_sentinel_unreachable(void **state) {
  (void)state;
  char url[200];
  snprintf(url, sizeof url, "redis-sentinel://127.0.0.1:%d,127.0.0.1:%d/nomaster", ecs_ts_free_port(),
           ecs_ts_free_port());
  ecs__rds_t r;
  assert_int_equal(ecs__rds_init(&r, url, 300, 300), ECS_OK);
  redisReply *rep = NULL;
  const char *argv[] = {"PING"};
  uint64_t t0 = ecs_now_ms();
  assert_int_equal(ecs__rds_cmd(&r, &rep, 1, argv, NULL), ECS_ECONN);
  assert_true(ecs_now_ms() - t0 < 10000);
  printf("%s\n", ecs__rds_errmsg(&r));
  assert_non_null(strstr(ecs__rds_errmsg(&r), "no sentinel knows master 'nomaster'"));
  ecs__rds_close(&r);
}

/* A namespace with braces would break its keys' hash tag: refused by
 * the metadata layer and by the server's command line. */
static void test_namespace_braces(void **state) {
  (void)state;
  ecs_meta_opts_t o;
  ecs_meta_opts_init(&o);
  o.redis_url = "127.0.0.1:1";
  o.ns = "a{b}";
  ecs_meta_t *m = NULL;
  assert_int_equal(ecs_meta_open(&o, &m), ECS_EINVAL);
  assert_null(m);
  char cmd[700];
  snprintf(cmd, sizeof cmd, "timeout 20 '%s' --redis none --ns 'x}y' >/dev/null 2>&1",
           ecs_ts_bin("ecstore-server"));
  int st = system(cmd); /* refused at once: 2 (a server that accepted it would be stopped: 124) */
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
}

/* The sentinels' password is kept off the server's command line as the
 * master's is: a URL holding one is refused there (without echoing it);
 * --sentinel-password-file needs a redis-sentinel:// URL and a file no
 * one else may read. */
static void test_sentinel_password_argv(void **state) {
  (void)state;
  char dir[256], pwf[300], out[300], cmd[1400];
  assert_int_equal(ecs_ts_mkdtemp(dir, sizeof dir), 0);
  snprintf(out, sizeof out, "%s/out", dir);
  snprintf(cmd, sizeof cmd,
           "timeout 20 '%s' --listen 127.0.0.1:0 --redis "
           "'redis-sentinel://127.0.0.1:1/m?sentinel_password=argv-pw-3c'"
           " >'%s' 2>&1",
           ecs_ts_bin("ecstore-server"), out);
  int st = system(cmd);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
  assert_int_equal(file_holds(out, "argv-pw-3c"), 0);
  assert_int_equal(file_holds(out, "password on the command line"), 1);
  snprintf(pwf, sizeof pwf, "%s/spw", dir);
  write_secret(pwf, "file-pw");
  snprintf(
      cmd, sizeof cmd,
      "timeout 20 '%s' --listen 127.0.0.1:0 --redis 127.0.0.1:1 --sentinel-password-file '%s' >'%s' 2>&1",
      ecs_ts_bin("ecstore-server"), pwf, out);
  st = system(cmd);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
  assert_int_equal(file_holds(out, "needs a redis-sentinel://"), 1);
  assert_int_equal(chmod(pwf, 0644), 0);
  snprintf(cmd, sizeof cmd,
           "timeout 20 '%s' --listen 127.0.0.1:0 --redis redis-sentinel://127.0.0.1:1/m "
           "--sentinel-password-file '%s' >'%s' 2>&1",
           ecs_ts_bin("ecstore-server"), pwf, out);
  st = system(cmd);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
  assert_int_equal(file_holds(out, "chmod 600"), 1);
  assert_int_equal(file_holds(out, "file-pw"), 0);
  unlink(pwf);
  unlink(out);
  rmdir(dir);
}

/* Whether this redis-server runs as a sentinel. */
static int have_sentinel(void) {
  char cmd[700];
  snprintf(cmd, sizeof cmd, "%s --help 2>&1 | grep -q -- --sentinel", redis_bin());
  return system(cmd) == 0;
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  if (!have_sentinel()) {
    printf("skip: %s has no sentinel mode (install redis-sentinel / redis-server)\n", redis_bin());
    return 77;
  }
  if (system("redis-cli --version >/dev/null 2>&1") != 0) {
    printf("skip: the cluster test needs redis-cli (redis-tools)\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_namespace_braces),       cmocka_unit_test(test_sentinel_url),
      cmocka_unit_test(test_sentinel_unreachable),   cmocka_unit_test(test_sentinel_failover),
      cmocka_unit_test(test_sentinel_auth),          cmocka_unit_test(test_cluster),
      cmocka_unit_test(test_sentinel_password_argv),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
