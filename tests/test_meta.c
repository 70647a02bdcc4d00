/*
 * Redis metadata layer (store/redis/meta_*.c) against a real redis-server.
 *
 * Every test starts its own redis-server on a free port (tests/support) and
 * checks what the layer wrote with a raw hiredis connection.  Clocks passed to
 * ecs_meta_tick() are the test's own, so heartbeats and reconnects happen
 * exactly when a test says.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "store/core/net.h"
#include "store/redis/meta.h"
#include "store/redis/rds.h"
#include "support/ts.h"

#define NS "test"
#define MAXK 1200

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- fixture: one redis-server per test ------------------------------- */

typedef struct fx {
  ecs_ts_proc_t redis; /* this test's redis-server */
  char url[64];        /* "redis://127.0.0.1:PORT" */
  redisContext *raw;   /* a raw connection for checks */
} fx_t;

static void raw_connect(fx_t *f) {
  struct timeval tv = {2, 0};
  if (f->raw != NULL)
    redisFree(f->raw);
  f->raw = redisConnectWithTimeout("127.0.0.1", f->redis.port, tv);
  assert_non_null(f->raw);
  assert_int_equal(f->raw->err, 0);
  redisSetTimeout(f->raw, tv);
}

static int setup(void **state) {
  fx_t *f = calloc(1, sizeof *f);
  if (f == NULL || ecs_ts_redis_start(&f->redis) != 0)
    return -1;
  snprintf(f->url, sizeof f->url, "redis://127.0.0.1:%d", f->redis.port);
  raw_connect(f);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fx_t *f = *state;
  if (f->raw != NULL)
    redisFree(f->raw);
  ecs_ts_stop(&f->redis, 3000);
  free(f);
  return 0;
}

/* Runs a raw command (binary-safe via argv); the caller frees the reply. */
static redisReply *raw(fx_t *f, int argc, const char **argv, const size_t *lens) {
  redisReply *r = redisCommandArgv(f->raw, argc, argv, lens);
  assert_non_null(r);
  return r;
}

static long long raw_int(fx_t *f, const char *cmd, const char *key, size_t klen) {
  const char *argv[] = {cmd, key};
  size_t lens[] = {strlen(cmd), klen};
  redisReply *r = raw(f, 2, argv, lens);
  assert_int_equal(r->type, REDIS_REPLY_INTEGER);
  long long v = r->integer;
  freeReplyObject(r);
  return v;
}

/* Does the record key (prefix added) exist in Redis? */
static int raw_rec_exists(fx_t *f, const uint8_t *key, uint16_t len) {
  char buf[512];
  size_t pl = strlen("ecs:{" NS "}:obj:");
  memcpy(buf, "ecs:{" NS "}:obj:", pl);
  memcpy(buf + pl, key, len);
  return (int)raw_int(f, "EXISTS", buf, pl + len);
}

static long long raw_count_records(fx_t *f) {
  redisReply *r = redisCommand(f->raw, "EVAL %s 0", "return #redis.call('KEYS', 'ecs:{" NS "}:obj:*')");
  assert_non_null(r);
  assert_int_equal(r->type, REDIS_REPLY_INTEGER);
  long long v = r->integer;
  freeReplyObject(r);
  return v;
}

/* ---- keys and records ------------------------------------------------- */

typedef struct keyset {
  uint8_t k[MAXK][ECS_MAX_KEY]; /* key bytes */
  uint16_t len[MAXK];           /* key lengths */
  const uint8_t *ptr[MAXK];     /* pointers for batch calls */
  size_t n;                     /* number of keys */
} keyset_t;

/* Binary keys: NUL bytes in every key, lengths 1..256 (key 0 is 256 bytes). */
static keyset_t *keys_make(size_t n, uint32_t seed) {
  keyset_t *ks = calloc(1, sizeof *ks);
  assert_non_null(ks);
  assert_true(n <= MAXK);
  for (size_t i = 0; i < n; i++) {
    uint16_t len = i == 0 ? ECS_MAX_KEY : (uint16_t)(8 + (i * 37) % 120);
    if (i == 1)
      len = 1;
    for (uint16_t j = 0; j < len; j++)
      ks->k[i][j] = (uint8_t)((seed * 2654435761u + i * 131u + j * 7u) >> 3);
    if (len > 4)
      ks->k[i][len / 2] = 0;
    /* Unique prefix: seed and index. */
    if (len >= 6) {
      ks->k[i][0] = (uint8_t)seed;
      ks->k[i][1] = (uint8_t)(i >> 8);
      ks->k[i][2] = (uint8_t)i;
      ks->k[i][3] = 0;
    } else {
      ks->k[i][0] = (uint8_t)(0xF0 + seed);
    }
    ks->len[i] = len;
    ks->ptr[i] = ks->k[i];
  }
  ks->n = n;
  return ks;
}

static void rec_for(ecs_meta_rec_t *rec, const keyset_t *ks, size_t i) {
  memset(rec, 0, sizeof *rec);
  rec->key = ks->ptr[i];
  rec->key_len = ks->len[i];
  rec->off = 4096 * i;
  rec->nbytes = 1000 + i;
  rec->raw_nbytes = 2000 + i;
  rec->checksum = 0x0123456789abcdefull ^ i;
  rec->codec = (uint8_t)(i % 3);
  rec->desc.dtype = ECS_DTYPE_BF16;
  rec->desc.ndim = (uint8_t)(i % 4);
  for (unsigned d = 0; d < rec->desc.ndim; d++)
    rec->desc.shape[d] = 650 + d * 1398 + i;
  rec->t_ms = 1700000000000ull + i;
}

static ecs_meta_t *open_server(fx_t *f, const char *node, uint64_t epoch, int ttl_s) {
  ecs_meta_opts_t o;
  ecs_meta_opts_init(&o);
  o.redis_url = f->url;
  o.ns = NS;
  o.node_id = node;
  o.addr = "127.0.0.1:7000";
  o.pool_size = 64 << 20;
  o.epoch = epoch;
  o.timeout_ms = 300;
  if (ttl_s > 0)
    o.heartbeat_ttl_s = ttl_s;
  o.reconnect_ms = 200;
  ecs_meta_t *m = NULL;
  assert_int_equal(ecs_meta_open(&o, &m), ECS_OK);
  assert_non_null(m);
  return m;
}

static ecs_meta_t *open_client(fx_t *f, int timeout_ms) {
  ecs_meta_opts_t o;
  ecs_meta_opts_init(&o);
  o.redis_url = f->url;
  o.ns = NS;
  o.timeout_ms = timeout_ms;
  ecs_meta_t *m = NULL;
  assert_int_equal(ecs_meta_open(&o, &m), ECS_OK);
  return m;
}

static void put_range(ecs_meta_t *m, const keyset_t *ks, size_t lo, size_t hi) {
  for (size_t i = lo; i < hi; i++) {
    ecs_meta_rec_t rec;
    rec_for(&rec, ks, i);
    ecs_meta_queue_put(m, &rec);
  }
  assert_int_equal(ecs_meta_flush(m), ECS_OK);
}

/* ---- the test support itself ------------------------------------------ */

/* Start, SIGSTOP, stop, restart on the same port, a child that dies. */
static void test_ts_redis_lifecycle(void **state) {
  (void)state;
  ecs_ts_proc_t r;
  memset(&r, 0, sizeof r);
  assert_int_equal(ecs_ts_redis_start(&r), 0);
  assert_true(r.pid > 0);
  assert_true(r.port > 0);
  int port = r.port;
  char dir[256];
  strcpy(dir, r.dir);
  assert_int_equal(access(r.log, R_OK), 0);
  ecs_ts_kill9(&r);
  assert_int_equal(r.pid, 0);
  assert_int_equal(access(dir, F_OK), 0);      /* kill9 keeps the directory */
  assert_int_equal(ecs_ts_redis_start(&r), 0); /* same port, same dir */
  assert_int_equal(r.port, port);
  assert_string_equal(r.dir, dir);
  assert_int_equal(ecs_ts_signal(&r, SIGSTOP), 0);
  assert_int_equal(ecs_ts_stop(&r, 2000), 0); /* continued, then SIGTERM: clean exit */
  assert_int_equal(r.pid, 0);
  assert_int_not_equal(access(dir, F_OK), 0);
  /* A binary that is not there: spawn succeeds, wait_port sees it die. */
  ecs_ts_proc_t bad;
  memset(&bad, 0, sizeof bad);
  char *argv[] = {"/nonexistent/ecs-nothing", NULL};
  assert_int_equal(ecs_ts_spawn(&bad, argv), 0);
  assert_int_equal(ecs_ts_wait_port(&bad, ecs_ts_free_port(), 2000), -1);
  assert_int_equal(bad.pid, 0);
  ecs_ts_stop(&bad, 100);
}

/* ---- URLs and options ------------------------------------------------- */

static void test_urls(void **state) {
  (void)state;
  char host[256];
  int port, db;
  assert_int_equal(ecs__rds_parse_url("redis://10.0.0.1:7001/3", host, sizeof host, &port, &db), ECS_OK);
  assert_string_equal(host, "10.0.0.1");
  assert_int_equal(port, 7001);
  assert_int_equal(db, 3);
  assert_int_equal(ecs__rds_parse_url("localhost:7002", host, sizeof host, &port, &db), ECS_OK);
  assert_string_equal(host, "localhost");
  assert_int_equal(port, 7002);
  assert_int_equal(db, 0);
  assert_int_equal(ecs__rds_parse_url("redishost", host, sizeof host, &port, &db), ECS_OK);
  assert_int_equal(port, 6379);
  assert_int_equal(ecs__rds_parse_url("redis://h", host, sizeof host, &port, &db), ECS_OK);
  assert_int_equal(port, 6379);
  assert_int_equal(ecs__rds_parse_url("redis://[::1]:7003/1", host, sizeof host, &port, &db), ECS_OK);
  assert_string_equal(host, "::1");
  assert_int_equal(port, 7003);
  assert_int_equal(db, 1);
  static const char *const bad[] = {"",
                                    "redis://",
                                    "redis://:6379",
                                    "h:",
                                    "redis://h:",
                                    "h:0",
                                    "h:65536",
                                    "h:12a",
                                    "h:-1",
                                    "h:1:2",
                                    "redis://h:1/x",
                                    "redis://h:1/-1",
                                    "http://h:1",
                                    "@h:1",
                                    "redis://:@h:1",
                                    "redis://u:p%zz@h:1",
                                    "redis://u:p%00@h:1",
                                    "redis://u:p@",
                                    "[::1",
                                    "[::1]x",
                                    "h h:1",
                                    "h:99999999999999999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    if (ecs__rds_parse_url(bad[i], host, sizeof host, &port, &db) != ECS_EINVAL)
      fail_msg("accepted bad url '%s'", bad[i]);
    ecs_meta_opts_t o;
    ecs_meta_opts_init(&o);
    o.redis_url = bad[i];
    o.ns = NS;
    ecs_meta_t *m = (ecs_meta_t *)(uintptr_t)1; /* must be reset to NULL */
    assert_int_equal(ecs_meta_open(&o, &m), ECS_EINVAL);
    assert_null(m);
  }
  assert_int_equal(ecs__rds_parse_url(NULL, host, sizeof host, &port, &db), ECS_EINVAL);

  /* Credentials (Redis AUTH): USER:PASS, :PASS, USER; %XX escapes; the
   * last '@' ends them. */
  ecs__rds_url_t u;
  assert_int_equal(ecs__rds_url_parse("redis://alice:s3cr%40t@10.0.0.1:7001/3", &u), ECS_OK);
  assert_string_equal(u.user, "alice");
  assert_string_equal(u.pass, "s3cr@t");
  assert_string_equal(u.host, "10.0.0.1");
  assert_int_equal(u.port, 7001);
  assert_int_equal(u.db, 3);
  assert_int_equal(ecs__rds_url_parse("redis://:p@ss:w/rd@[::1]:7003", &u), ECS_OK);
  assert_string_equal(u.user, "");
  assert_string_equal(u.pass, "p@ss:w/rd");
  assert_string_equal(u.host, "::1");
  assert_int_equal(ecs__rds_url_parse("bob@h", &u), ECS_OK);
  assert_string_equal(u.user, "bob");
  assert_string_equal(u.pass, "");
  assert_int_equal(u.port, 6379);
  const char *av[3];
  size_t al[3];
  assert_int_equal(ecs__rds_auth_argv(&u, av, al), 0); /* no password: no AUTH */
  assert_int_equal(ecs__rds_url_parse("redis://alice:pw@h:1", &u), ECS_OK);
  assert_int_equal(ecs__rds_auth_argv(&u, av, al), 3);
  assert_string_equal(av[0], "AUTH");
  assert_string_equal(av[1], "alice");
  assert_string_equal(av[2], "pw");
  assert_int_equal(ecs__rds_url_parse("redis://:pw@h:1", &u), ECS_OK);
  assert_int_equal(ecs__rds_auth_argv(&u, av, al), 2);
  assert_string_equal(av[1], "pw");
  /* format round-trips, escaping what must be, and leaves the password out on request */
  char out[256];
  assert_int_equal(ecs__rds_url_parse("redis://a%3Ab:p%40%3A%2F%20x@[::1]:7/2", &u), ECS_OK);
  assert_int_equal(ecs__rds_url_format(&u, 1, out, sizeof out), ECS_OK);
  ecs__rds_url_t u2;
  assert_int_equal(ecs__rds_url_parse(out, &u2), ECS_OK);
  assert_string_equal(u2.user, "a:b");
  assert_string_equal(u2.pass, "p@:/ x");
  assert_string_equal(u2.host, "::1");
  assert_int_equal(u2.port, 7);
  assert_int_equal(u2.db, 2);
  assert_int_equal(ecs__rds_url_format(&u, 0, out, sizeof out), ECS_OK);
  assert_string_equal(out, "redis://a%3Ab@[::1]:7/2");
  assert_int_equal(ecs__rds_url_format(&u, 1, out, 12), ECS_EINVAL);
  /* messages show no password */
  assert_string_equal(ecs__rds_url_redact("redis://alice:hunter2@h:1/0", out, sizeof out),
                      "redis://alice:***@h:1/0");
  assert_string_equal(ecs__rds_url_redact(":hunter2@h", out, sizeof out), ":***@h");
  assert_string_equal(ecs__rds_url_redact("redis://bob@h", out, sizeof out), "redis://bob@h");
  assert_string_equal(ecs__rds_url_redact("h:1", out, sizeof out), "h:1");
  assert_int_equal(ecs__rds_url_has_password("redis://a:b@h"), 1);
  assert_int_equal(ecs__rds_url_has_password("redis://:b@h"), 1);
  assert_int_equal(ecs__rds_url_has_password("redis://a@h"), 0);
  assert_int_equal(ecs__rds_url_has_password("h:1"), 0);
  assert_int_equal(ecs__rds_url_has_password("a:b@h:x"), 1); /* bad, but still a secret */
  /* a user without a password anywhere is refused at init, naming where to put it */
  ecs__rds_t rl;
  unsetenv("ECSTORE_REDIS_PASSWORD");
  assert_int_equal(ecs__rds_init(&rl, "redis://bob@h:1", 100, 100), ECS_EINVAL);
  assert_non_null(strstr(ecs__rds_errmsg(&rl), "ECSTORE_REDIS_PASSWORD"));
  assert_int_equal(ecs__rds_init(&rl, "redis://bob:pw@h:x", 100, 100), ECS_EINVAL);
  assert_null(strstr(ecs__rds_errmsg(&rl), "pw@"));
  setenv("ECSTORE_REDIS_PASSWORD", "from-env", 1);
  assert_int_equal(ecs__rds_init(&rl, "redis://bob@h:1", 100, 100), ECS_OK);
  assert_string_equal(rl.pass, "from-env");
  assert_int_equal(ecs__rds_init(&rl, "redis://bob:url-wins@h:1", 100, 100), ECS_OK);
  assert_string_equal(rl.pass, "url-wins");
  unsetenv("ECSTORE_REDIS_PASSWORD");

  /* Options: ns required; a server needs a node id that fits and an epoch. */
  ecs_meta_opts_t o;
  ecs_meta_t *m = NULL;
  ecs_meta_opts_init(&o);
  o.redis_url = "127.0.0.1:1";
  assert_int_equal(ecs_meta_open(&o, &m), ECS_EINVAL);
  o.ns = "";
  assert_int_equal(ecs_meta_open(&o, &m), ECS_EINVAL);
  o.ns = NS;
  o.node_id = "n1";
  assert_int_equal(ecs_meta_open(&o, &m), ECS_EINVAL); /* epoch 0 */
  o.epoch = 1;
  o.node_id = "a-node-id-that-is-far-too-long-for-the-sixty-four-byte-registry-field";
  assert_int_equal(ecs_meta_open(&o, &m), ECS_EINVAL);
  assert_int_equal(ecs_meta_open(NULL, &m), ECS_EINVAL);
  ecs_meta_close(NULL);
}

/* A Redis that is not there: open succeeds, the handle is down, calls fail
 * fast with ECS_ECONN (what ecstore.h promises for an unreachable Redis)
 * and outputs cleared, never "exists". */
static void test_no_redis(void **state) {
  (void)state;
  char url[64];
  snprintf(url, sizeof url, "127.0.0.1:%d", ecs_ts_free_port());
  ecs_meta_opts_t o;
  ecs_meta_opts_init(&o);
  o.redis_url = url;
  o.ns = NS;
  ecs_meta_t *m = NULL;
  assert_int_equal(ecs_meta_open(&o, &m), ECS_OK);
  assert_false(ecs_meta_is_up(m));
  assert_true(strlen(ecs_meta_errstr(m)) > 0);
  const uint8_t *k[] = {(const uint8_t *)"abc"};
  uint16_t l[] = {3};
  int ex[1] = {1};
  assert_int_equal(ecs_meta_exists_batch(m, k, l, 1, ex), ECS_ECONN);
  assert_int_equal(ex[0], 0);
  ecs_meta_close(m);

  o.node_id = "n1";
  o.epoch = 5;
  assert_int_equal(ecs_meta_open(&o, &m), ECS_OK);
  assert_false(ecs_meta_is_up(m));
  ecs_meta_rec_t rec;
  memset(&rec, 0, sizeof rec);
  rec.key = k[0];
  rec.key_len = 3;
  ecs_meta_queue_put(m, &rec);
  assert_int_equal(ecs_meta_flush(m), ECS_ECONN);
  assert_true(ecs_meta_resync_pending(m));
  assert_int_not_equal(ecs_meta_tick(m, 0, NULL), ECS_OK);
  assert_int_equal(ecs_meta_tick(m, 10, NULL), ECS_ENOTCONN); /* within reconnect_ms */
  ecs_meta_close(m);
}

/* ---- server: registry ------------------------------------------------- */

/* What a server holds, for the re-sync callbacks. */
typedef struct held {
  const keyset_t *ks; /* the keys */
  int on[MAXK];       /* held? */
  int published;      /* publish_all calls */
} held_t;

static void held_publish(void *ctx, ecs_meta_t *m) {
  held_t *h = ctx;
  h->published++;
  for (size_t i = 0; i < h->ks->n; i++)
    if (h->on[i]) {
      ecs_meta_rec_t rec;
      rec_for(&rec, h->ks, i);
      ecs_meta_queue_put(m, &rec);
    }
}

static int held_has(void *ctx, const void *key, uint16_t len) {
  held_t *h = ctx;
  for (size_t i = 0; i < h->ks->n; i++)
    if (h->on[i] && h->ks->len[i] == len && memcmp(h->ks->k[i], key, len) == 0)
      return 1;
  return 0;
}

/* Suspicion marks (meta_suspect.c): a client's mark is SET with the
 * node's epoch and a TTL, without waiting for its reply (the link stays
 * in step: the next command reads its own); ecs_meta_nodes reports a mark
 * only with a TTL and the node's current epoch; DEL withdraws it; with the
 * link down nothing is sent and nothing waits. */
static void test_suspect_marks(void **state) {
  fx_t *f = *state;
  ecs_meta_t *srv = open_server(f, "node-s", 4242, 10);
  assert_int_equal(ecs_meta_register(srv), ECS_OK);
  ecs_meta_t *c = open_client(f, 300);
  assert_true(ecs_meta_is_up(c));
  assert_int_equal(ecs_meta_mark_suspect(c, "node-s", 4242, 5000), ECS_OK);
  assert_int_equal(ecs_meta_mark_suspect(c, "node s", 4242, 5000), ECS_EINVAL);
  ecs_meta_node_t nodes[4];
  size_t nn = 0;
  assert_int_equal(ecs_meta_nodes(c, nodes, 4, &nn), ECS_OK); /* drops the SET's reply first */
  assert_int_equal(nn, 1);
  assert_true(nodes[0].suspect_ms > 4000 && nodes[0].suspect_ms <= 5000);
  redisReply *r = redisCommand(f->raw, "GET ecs:{" NS "}:suspect:node-s");
  assert_string_equal(r->str, "4242");
  freeReplyObject(r);
  /* no TTL, or another epoch: no mark */
  freeReplyObject(redisCommand(f->raw, "SET ecs:{" NS "}:suspect:node-s 4242"));
  assert_int_equal(ecs_meta_nodes(c, nodes, 4, &nn), ECS_OK);
  assert_int_equal(nodes[0].suspect_ms, 0);
  freeReplyObject(redisCommand(f->raw, "SET ecs:{" NS "}:suspect:node-s 4241 PX 5000"));
  assert_int_equal(ecs_meta_nodes(c, nodes, 4, &nn), ECS_OK);
  assert_int_equal(nodes[0].suspect_ms, 0);
  /* withdrawn */
  assert_int_equal(ecs_meta_mark_suspect(c, "node-s", 4242, 5000), ECS_OK);
  assert_int_equal(ecs_meta_clear_suspect(c, "node-s"), ECS_OK);
  assert_int_equal(ecs_meta_nodes(c, nodes, 4, &nn), ECS_OK);
  assert_int_equal(nn, 1);
  assert_int_equal(nodes[0].suspect_ms, 0);
  assert_int_equal(raw_int(f, "EXISTS", "ecs:{" NS "}:suspect:node-s", strlen("ecs:{" NS "}:suspect:node-s")),
                   0);
  ecs_meta_close(c);
  /* a link that is down: nothing is sent, nothing waits */
  ecs_meta_opts_t o;
  ecs_meta_opts_init(&o);
  char dead[64];
  snprintf(dead, sizeof dead, "127.0.0.1:%d", ecs_ts_free_port());
  o.redis_url = dead;
  o.ns = NS;
  o.timeout_ms = 300;
  assert_int_equal(ecs_meta_open(&o, &c), ECS_OK);
  uint64_t t0 = ecs_now_ms();
  assert_int_equal(ecs_meta_mark_suspect(c, "node-s", 4242, 5000), ECS_ENOTCONN);
  assert_true(ecs_now_ms() - t0 < 50);
  ecs_meta_close(c);
  ecs_meta_close(srv);
}

static void test_register_heartbeat_ttl(void **state) {
  fx_t *f = *state;
  ecs_meta_t *m = open_server(f, "node-a", 1111, 1);
  assert_true(ecs_meta_is_up(m));
  assert_int_equal(ecs_meta_register(m), ECS_OK);
  assert_int_equal(ecs_meta_register(m), ECS_OK); /* idempotent */

  redisReply *r = redisCommand(f->raw, "HGETALL ecs:{" NS "}:node:node-a");
  assert_non_null(r);
  assert_int_equal(r->type, REDIS_REPLY_ARRAY);
  assert_int_equal(r->elements, 12); /* addr port pool epoch started free */
  freeReplyObject(r);
  r = redisCommand(f->raw, "HMGET ecs:{" NS "}:node:node-a addr port pool epoch");
  assert_string_equal(r->element[0]->str, "127.0.0.1:7000");
  assert_string_equal(r->element[1]->str, "7000");
  assert_string_equal(r->element[2]->str, "67108864");
  assert_string_equal(r->element[3]->str, "1111");
  freeReplyObject(r);
  r = redisCommand(f->raw, "PTTL ecs:{" NS "}:node:node-a");
  assert_true(r->integer > 0 && r->integer <= 1000);
  freeReplyObject(r);
  assert_int_equal(raw_int(f, "SCARD", "ecs:{" NS "}:nodes", strlen("ecs:{" NS "}:nodes")), 1);

  ecs_meta_node_t nodes[4];
  size_t nn = 0;
  assert_int_equal(ecs_meta_nodes(m, nodes, 4, &nn), ECS_OK);
  assert_int_equal(nn, 1);
  assert_string_equal(nodes[0].node_id, "node-a");
  assert_string_equal(nodes[0].addr, "127.0.0.1:7000");
  assert_int_equal(nodes[0].epoch, 1111);
  assert_int_equal(nodes[0].pool_size, 64 << 20);
  assert_int_equal(nodes[0].free_bytes, 64 << 20); /* registered: the whole pool */

  /* A record, then heartbeats keep the entry (and the record) alive past
   * the TTL.  (The start-up re-sync stays owed: these ticks pass no
   * callbacks.) */
  keyset_t *ks = keys_make(4, 1);
  put_range(m, ks, 0, 4);
  uint64_t t = 0;
  assert_int_equal(ecs_meta_tick(m, t, NULL), ECS_OK);
  for (int i = 0; i < 6; i++) {
    sleep_ms(300);
    t += 340; /* > ttl/3 */
    assert_int_equal(ecs_meta_tick(m, t, NULL), ECS_OK);
  }
  int ex[4];
  assert_int_equal(ecs_meta_exists_batch(m, ks->ptr, ks->len, 4, ex), ECS_OK);
  for (int i = 0; i < 4; i++)
    assert_int_equal(ex[i], 1);
  /* The free bytes a heartbeat publishes (least-loaded placement reads them). */
  ecs_meta_set_free(m, 12345);
  t += 340;
  assert_int_equal(ecs_meta_tick(m, t, NULL), ECS_OK);
  assert_int_equal(ecs_meta_nodes(m, nodes, 4, &nn), ECS_OK);
  assert_int_equal(nn, 1);
  assert_int_equal(nodes[0].free_bytes, 12345);

  /* No heartbeat: the entry expires, the records read as misses and are
   * deleted, the node disappears from the list. */
  sleep_ms(1150);
  assert_int_equal(raw_int(f, "EXISTS", "ecs:{" NS "}:node:node-a", strlen("ecs:{" NS "}:node:node-a")), 0);
  assert_int_equal(raw_rec_exists(f, ks->ptr[0], ks->len[0]), 1);
  assert_int_equal(ecs_meta_exists_batch(m, ks->ptr, ks->len, 2, ex), ECS_OK);
  assert_int_equal(ex[0], 0);
  assert_int_equal(ex[1], 0);
  assert_int_equal(raw_rec_exists(f, ks->ptr[0], ks->len[0]), 0);
  assert_int_equal(ecs_meta_nodes(m, nodes, 4, &nn), ECS_OK);
  assert_int_equal(nn, 0);
  assert_int_equal(raw_int(f, "SCARD", "ecs:{" NS "}:nodes", strlen("ecs:{" NS "}:nodes")), 0); /* tidied */

  /* The next heartbeat notices, registers again and owes a re-sync, which
   * re-publishes what the server holds (here: keys 0..3). */
  held_t h = {.ks = ks};
  for (size_t i = 0; i < 4; i++)
    h.on[i] = 1;
  ecs_meta_resync_t rs = {held_publish, held_has, &h};
  assert_int_equal(ecs_meta_tick(m, t + 400, &rs), ECS_OK);
  assert_int_equal(h.published, 1);
  assert_false(ecs_meta_resync_pending(m));
  assert_int_equal(ecs_meta_exists_batch(m, ks->ptr, ks->len, 4, ex), ECS_OK);
  for (int i = 0; i < 4; i++)
    assert_int_equal(ex[i], 1);
  assert_int_equal(ecs_meta_nodes(m, nodes, 4, &nn), ECS_OK);
  assert_int_equal(nn, 1);
  ecs_meta_close(m);
  free(ks);
}

/* ---- server: re-sync -------------------------------------------------- */

/* Redis emptied under a live link (FLUSHALL, or a restart the link did not
 * notice): the heartbeat finds the entry gone, registers again and the
 * re-sync publishes everything again. */
static void test_registry_vanished(void **state) {
  fx_t *f = *state;
  keyset_t *ks = keys_make(50, 2);
  held_t h = {.ks = ks};
  ecs_meta_resync_t rs = {held_publish, held_has, &h};
  ecs_meta_t *m = open_server(f, "node-a", 77, 10);
  assert_true(ecs_meta_resync_pending(m)); /* the start-up sweep */
  assert_int_equal(ecs_meta_tick(m, 0, &rs), ECS_OK);
  assert_false(ecs_meta_resync_pending(m));
  assert_int_equal(h.published, 1);
  for (size_t i = 0; i < 50; i++)
    h.on[i] = 1;
  put_range(m, ks, 0, 50);
  assert_int_equal(raw_count_records(f), 50);

  redisReply *r = redisCommand(f->raw, "FLUSHALL");
  freeReplyObject(r);
  assert_int_equal(ecs_meta_tick(m, 500, &rs), ECS_OK); /* not due (1 s at most): nothing seen */
  assert_int_equal(raw_count_records(f), 0);
  assert_int_equal(ecs_meta_tick(m, 4000, &rs), ECS_OK); /* heartbeat due */
  assert_false(ecs_meta_resync_pending(m));
  assert_int_equal(h.published, 2);
  assert_int_equal(raw_count_records(f), 50);
  int ex[50];
  assert_int_equal(ecs_meta_exists_batch(m, ks->ptr, ks->len, 50, ex), ECS_OK);
  for (int i = 0; i < 50; i++)
    assert_int_equal(ex[i], 1);
  ecs_meta_close(m);
  free(ks);
}

/* ---- client reads ----------------------------------------------------- */

static void test_put_exists_lookup(void **state) {
  fx_t *f = *state;
  keyset_t *ks = keys_make(1000, 3);
  ecs_meta_t *srv = open_server(f, "node-a", 42, 10);
  assert_int_equal(ecs_meta_register(srv), ECS_OK);
  /* Even keys are published, odd ones are not. */
  for (size_t i = 0; i < ks->n; i += 2) {
    ecs_meta_rec_t rec;
    rec_for(&rec, ks, i);
    ecs_meta_queue_put(srv, &rec);
  }
  assert_int_equal(ecs_meta_flush(srv), ECS_OK);
  assert_int_equal(raw_count_records(f), 500);
  assert_int_equal(raw_rec_exists(f, ks->ptr[0], ECS_MAX_KEY), 1); /* 256-byte key, binary */

  ecs_meta_t *cl = open_client(f, 500);
  assert_true(ecs_meta_is_up(cl));
  int *ex = calloc(ks->n, sizeof *ex);
  assert_int_equal(ecs_meta_exists_batch(cl, ks->ptr, ks->len, ks->n, ex), ECS_OK);
  for (size_t i = 0; i < ks->n; i++)
    if (ex[i] != (i % 2 == 0))
      fail_msg("exists[%zu] = %d", i, ex[i]);

  ecs_meta_rec_t *recs = calloc(ks->n, sizeof *recs);
  int *st = calloc(ks->n, sizeof *st);
  assert_int_equal(ecs_meta_lookup_batch(cl, ks->ptr, ks->len, ks->n, recs, st), ECS_OK);
  for (size_t i = 0; i < ks->n; i++) {
    assert_ptr_equal(recs[i].key, ks->ptr[i]);
    assert_int_equal(recs[i].key_len, ks->len[i]);
    if (i % 2) {
      assert_int_equal(st[i], ECS_ENOTFOUND);
      continue;
    }
    assert_int_equal(st[i], ECS_OK);
    ecs_meta_rec_t want;
    rec_for(&want, ks, i);
    assert_string_equal(recs[i].node_id, "node-a");
    assert_int_equal(recs[i].epoch, 42);
    assert_int_equal(recs[i].off, want.off);
    assert_int_equal(recs[i].nbytes, want.nbytes);
    assert_int_equal(recs[i].raw_nbytes, want.raw_nbytes);
    assert_int_equal(recs[i].checksum, want.checksum);
    assert_int_equal(recs[i].codec, want.codec);
    assert_int_equal(recs[i].t_ms, want.t_ms);
    assert_int_equal(recs[i].desc.dtype, want.desc.dtype);
    assert_int_equal(recs[i].desc.ndim, want.desc.ndim);
    for (unsigned d = 0; d < want.desc.ndim; d++)
      assert_int_equal(recs[i].desc.shape[d], want.desc.shape[d]);
  }
  /* The stored form: decimal strings, "650,2048"-style shape, hex csum. */
  char key[512];
  size_t pl = strlen("ecs:{" NS "}:obj:");
  memcpy(key, "ecs:{" NS "}:obj:", pl);
  memcpy(key + pl, ks->k[2], ks->len[2]);
  const char *argv[] = {"HMGET", key, "shape", "csum", "len", "dtype"};
  size_t lens[] = {5, pl + ks->len[2], 5, 4, 3, 5};
  redisReply *r = raw(f, 6, argv, lens);
  assert_string_equal(r->element[0]->str, "652,2050");
  assert_string_equal(r->element[1]->str, "0123456789abcded");
  assert_string_equal(r->element[2]->str, "1002");
  assert_string_equal(r->element[3]->str, "3");
  freeReplyObject(r);

  /* Bad keys fail alone: empty and 257-byte keys are misses / EKEY. */
  uint8_t big[ECS_MAX_KEY + 1];
  memset(big, 'x', sizeof big);
  const uint8_t *mk[] = {ks->ptr[0], big, ks->ptr[2], ks->ptr[1]};
  uint16_t ml[] = {ks->len[0], ECS_MAX_KEY + 1, ks->len[2], 0};
  int mex[4];
  assert_int_equal(ecs_meta_exists_batch(cl, mk, ml, 4, mex), ECS_OK);
  assert_int_equal(mex[0], 1);
  assert_int_equal(mex[1], 0);
  assert_int_equal(mex[2], 1);
  assert_int_equal(mex[3], 0);
  assert_int_equal(ecs_meta_lookup_batch(cl, mk, ml, 4, recs, st), ECS_OK);
  assert_int_equal(st[0], ECS_OK);
  assert_int_equal(st[1], ECS_EKEY);
  assert_int_equal(st[2], ECS_OK);
  assert_int_equal(st[3], ECS_EKEY);
  assert_int_equal(ecs_meta_exists_batch(cl, NULL, NULL, 0, NULL), ECS_OK);

  /* The script cache flushed under us: EVAL takes over. */
  r = redisCommand(f->raw, "SCRIPT FLUSH");
  freeReplyObject(r);
  assert_int_equal(ecs_meta_exists_batch(cl, ks->ptr, ks->len, ks->n, ex), ECS_OK);
  for (size_t i = 0; i < ks->n; i++)
    assert_int_equal(ex[i], i % 2 == 0);

  /* Delete: only the record, and only while it names this node. */
  ecs_meta_queue_del(srv, ks->ptr[0], ks->len[0]);
  assert_int_equal(ecs_meta_flush(srv), ECS_OK);
  assert_int_equal(raw_rec_exists(f, ks->ptr[0], ks->len[0]), 0);
  ecs_meta_t *other = open_server(f, "node-b", 9, 10);
  assert_int_equal(ecs_meta_register(other), ECS_OK);
  put_range(other, ks, 2, 3); /* node-b now holds key 2 too: last writer wins */
  ecs_meta_queue_del(srv, ks->ptr[2], ks->len[2]);
  assert_int_equal(ecs_meta_flush(srv), ECS_OK);
  assert_int_equal(ecs_meta_lookup_batch(cl, &ks->ptr[2], &ks->len[2], 1, recs, st), ECS_OK);
  assert_int_equal(st[0], ECS_OK);
  assert_string_equal(recs[0].node_id, "node-b");

  ecs_meta_close(other);
  ecs_meta_close(cl);
  ecs_meta_close(srv);
  free(ex);
  free(recs);
  free(st);
  free(ks);
}

/* A node restarted (same id, new epoch): its old records are stale. */
static void test_stale_epoch(void **state) {
  fx_t *f = *state;
  keyset_t *ks = keys_make(3, 4);
  ecs_meta_t *old = open_server(f, "node-a", 100, 10);
  assert_int_equal(ecs_meta_register(old), ECS_OK);
  put_range(old, ks, 0, 3);
  ecs_meta_t *cl = open_client(f, 500);
  int ex[3];
  assert_int_equal(ecs_meta_exists_batch(cl, ks->ptr, ks->len, 3, ex), ECS_OK);
  assert_int_equal(ex[0] + ex[1] + ex[2], 3);
  ecs_meta_close(old); /* crashed: no unregister */

  ecs_meta_t *neu = open_server(f, "node-a", 200, 10);
  assert_int_equal(ecs_meta_register(neu), ECS_OK);
  assert_int_equal(ecs_meta_exists_batch(cl, ks->ptr, ks->len, 1, ex), ECS_OK);
  assert_int_equal(ex[0], 0);
  assert_int_equal(raw_rec_exists(f, ks->ptr[0], ks->len[0]), 0); /* deleted */
  ecs_meta_rec_t recs[2];
  int st[2];
  assert_int_equal(ecs_meta_lookup_batch(cl, &ks->ptr[1], &ks->len[1], 1, recs, st), ECS_OK);
  assert_int_equal(st[0], ECS_ESTALE);
  assert_int_equal(raw_rec_exists(f, ks->ptr[1], ks->len[1]), 0);
  /* The new process's start-up sweep clears the rest. */
  assert_int_equal(raw_rec_exists(f, ks->ptr[2], ks->len[2]), 1);
  held_t h = {.ks = ks};
  ecs_meta_resync_t rs = {held_publish, held_has, &h};
  assert_int_equal(ecs_meta_tick(neu, 0, &rs), ECS_OK);
  assert_int_equal(raw_rec_exists(f, ks->ptr[2], ks->len[2]), 0);
  /* And its own records are live. */
  put_range(neu, ks, 0, 1);
  assert_int_equal(ecs_meta_lookup_batch(cl, ks->ptr, ks->len, 1, recs, st), ECS_OK);
  assert_int_equal(st[0], ECS_OK);
  assert_int_equal(recs[0].epoch, 200);
  ecs_meta_close(neu);
  ecs_meta_close(cl);
  free(ks);
}

/* ---- replicas: several holders of one record -------------------------- */

static long long raw_hexists(fx_t *f, const uint8_t *key, uint16_t len, const char *field) {
  redisReply *r = redisCommand(f->raw, "HEXISTS ecs:{" NS "}:obj:%b %s", key, (size_t)len, field);
  assert_non_null(r);
  long long v = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
  freeReplyObject(r);
  return v;
}

/* Two nodes hold the same keys: a lookup lists both; a node's delete
 * drops only its own entry (the record goes with the last holder); a dead
 * holder is dropped by the read check while the live one keeps the
 * record; a record without holder fields (written before replicas) still
 * reads, and is deleted only by the node it names. */
static void test_replica_holders(void **state) {
  fx_t *f = *state;
  keyset_t *ks = keys_make(4, 5);
  ecs_meta_t *a = open_server(f, "node-a", 100, 10);
  ecs_meta_t *b = open_server(f, "node-b", 200, 10);
  assert_int_equal(ecs_meta_register(a), ECS_OK);
  assert_int_equal(ecs_meta_register(b), ECS_OK);
  put_range(a, ks, 0, 3);
  put_range(b, ks, 0, 3);
  ecs_meta_t *cl = open_client(f, 500);
  ecs_meta_rec_t recs[4];
  int st[4], ex[4];
  assert_int_equal(ecs_meta_lookup_batch(cl, ks->ptr, ks->len, 3, recs, st), ECS_OK);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(st[i], ECS_OK);
    assert_int_equal(recs[i].nholders, 2);
    int seen_a = 0, seen_b = 0;
    for (size_t h = 0; h < 2; h++) {
      seen_a |= !strcmp(recs[i].holders[h].node_id, "node-a") && recs[i].holders[h].epoch == 100;
      seen_b |= !strcmp(recs[i].holders[h].node_id, "node-b") && recs[i].holders[h].epoch == 200;
    }
    assert_true(seen_a && seen_b);
    assert_string_equal(recs[i].node_id, "node-b");       /* the last writer, as before replicas */
    assert_int_equal(recs[i].nbytes, 1000 + (uint64_t)i); /* the fields as before */
  }
  /* node-a evicts key 0: node-b's copy stays listed */
  ecs_meta_queue_del(a, ks->ptr[0], ks->len[0]);
  assert_int_equal(ecs_meta_flush(a), ECS_OK);
  assert_int_equal(ecs_meta_lookup_batch(cl, ks->ptr, ks->len, 1, recs, st), ECS_OK);
  assert_int_equal(st[0], ECS_OK);
  assert_int_equal(recs[0].nholders, 1);
  assert_string_equal(recs[0].node_id, "node-b");
  assert_int_equal(recs[0].epoch, 200);
  ecs_meta_queue_del(b, ks->ptr[0], ks->len[0]); /* the last holder: the record goes */
  assert_int_equal(ecs_meta_flush(b), ECS_OK);
  assert_int_equal(raw_rec_exists(f, ks->ptr[0], ks->len[0]), 0);
  /* node-a dies (its registry entry gone): its entries are dropped on
   * read, node-b's keep the records alive */
  assert_int_equal(raw_int(f, "DEL", "ecs:{" NS "}:node:node-a", strlen("ecs:{" NS "}:node:node-a")), 1);
  assert_int_equal(ecs_meta_exists_batch(cl, &ks->ptr[1], &ks->len[1], 2, ex), ECS_OK);
  assert_int_equal(ex[0] + ex[1], 2); /* answered by node-b, the last writer: the cheap path */
  assert_int_equal(ecs_meta_lookup_batch(cl, &ks->ptr[1], &ks->len[1], 1, recs, st), ECS_OK);
  assert_int_equal(st[0], ECS_OK);
  assert_int_equal(recs[0].nholders, 1);
  assert_int_equal(raw_hexists(f, ks->ptr[1], ks->len[1], "h:node-a"), 0); /* the full read dropped it */
  assert_int_equal(raw_hexists(f, ks->ptr[1], ks->len[1], "h:node-b"), 1);
  assert_int_equal(ecs_meta_lookup_batch(cl, &ks->ptr[2], &ks->len[2], 1, recs, st), ECS_OK);
  assert_int_equal(st[0], ECS_OK);
  assert_int_equal(recs[0].nholders, 1);
  assert_string_equal(recs[0].node_id, "node-b");
  /* the last writer dead, another holder live: exists reads the whole
   * record and still says yes */
  put_range(b, ks, 2, 3);
  put_range(a, ks, 2, 3); /* node-a writes last... */
  assert_int_equal(raw_int(f, "DEL", "ecs:{" NS "}:node:node-a", strlen("ecs:{" NS "}:node:node-a")), 0);
  assert_int_equal(ecs_meta_exists_batch(cl, &ks->ptr[2], &ks->len[2], 1, ex), ECS_OK);
  assert_int_equal(ex[0], 1);
  assert_int_equal(raw_hexists(f, ks->ptr[2], ks->len[2], "h:node-a"), 0); /* ...and is dropped */
  /* A record as written before replicas: node and epoch, no holders. */
  redisReply *r = redisCommand(f->raw,
                               "HSET ecs:{" NS "}:obj:%b node node-b epoch 200 off 0 len 8 raw_len 8 dtype 3 "
                               "shape 4 csum 0123456789abcdef codec 0 t 1",
                               ks->ptr[3], (size_t)ks->len[3]);
  assert_non_null(r);
  freeReplyObject(r);
  assert_int_equal(ecs_meta_lookup_batch(cl, &ks->ptr[3], &ks->len[3], 1, recs, st), ECS_OK);
  assert_int_equal(st[0], ECS_OK);
  assert_int_equal(recs[0].nholders, 1);
  assert_string_equal(recs[0].node_id, "node-b");
  ecs_meta_queue_del(a, ks->ptr[3], ks->len[3]); /* not node-a's: kept */
  assert_int_equal(ecs_meta_flush(a), ECS_OK);
  assert_int_equal(raw_rec_exists(f, ks->ptr[3], ks->len[3]), 1);
  ecs_meta_queue_del(b, ks->ptr[3], ks->len[3]);
  assert_int_equal(ecs_meta_flush(b), ECS_OK);
  assert_int_equal(raw_rec_exists(f, ks->ptr[3], ks->len[3]), 0);
  ecs_meta_close(a);
  ecs_meta_close(b);
  ecs_meta_close(cl);
  free(ks);
}

/* ---- deadlines -------------------------------------------------------- */

static void test_deadline_stopped_redis(void **state) {
  fx_t *f = *state;
  keyset_t *ks = keys_make(10, 5);
  ecs_meta_t *srv = open_server(f, "node-a", 1, 10);
  assert_int_equal(ecs_meta_register(srv), ECS_OK);
  put_range(srv, ks, 0, 10);
  ecs_meta_t *cl = open_client(f, 200);
  int ex[10];
  assert_int_equal(ecs_meta_exists_batch(cl, ks->ptr, ks->len, 10, ex), ECS_OK);

  assert_int_equal(ecs_ts_signal(&f->redis, SIGSTOP), 0);
  for (int i = 0; i < 10; i++)
    ex[i] = 1;
  uint64_t t0 = mono_ms();
  assert_int_equal(ecs_meta_exists_batch(cl, ks->ptr, ks->len, 10, ex), ECS_ETIMEDOUT);
  uint64_t dt = mono_ms() - t0;
  assert_true(dt >= 150 && dt < 600);
  for (int i = 0; i < 10; i++)
    assert_int_equal(ex[i], 0);
  assert_false(ecs_meta_is_up(cl));

  /* A fresh connection to a stopped Redis: connect succeeds (the kernel
   * accepts), the first reply times out. */
  ecs_meta_rec_t recs[10];
  int st[10];
  t0 = mono_ms();
  int rc = ecs_meta_lookup_batch(cl, ks->ptr, ks->len, 10, recs, st);
  dt = mono_ms() - t0;
  assert_int_equal(rc, ECS_ETIMEDOUT);
  assert_true(dt < 600);
  for (int i = 0; i < 10; i++)
    assert_int_equal(st[i], ECS_ENOTFOUND);

  /* The server side: flush times out and takes the link down. */
  ecs_meta_rec_t rec;
  rec_for(&rec, ks, 0);
  ecs_meta_queue_put(srv, &rec);
  t0 = mono_ms();
  assert_int_equal(ecs_meta_flush(srv), ECS_ETIMEDOUT);
  assert_true(mono_ms() - t0 < 700);
  assert_false(ecs_meta_is_up(srv));
  assert_true(ecs_meta_resync_pending(srv));

  assert_int_equal(ecs_ts_signal(&f->redis, SIGCONT), 0);
  assert_int_equal(ecs_meta_exists_batch(cl, ks->ptr, ks->len, 10, ex), ECS_OK);
  for (int i = 0; i < 10; i++)
    assert_int_equal(ex[i], 1);
  ecs_meta_close(cl);
  ecs_meta_close(srv);
  free(ks);
}

static void test_killed_redis(void **state) {
  fx_t *f = *state;
  keyset_t *ks = keys_make(10, 6);
  ecs_meta_t *srv = open_server(f, "node-a", 1, 10);
  assert_int_equal(ecs_meta_register(srv), ECS_OK);
  put_range(srv, ks, 0, 10);
  ecs_meta_t *cl = open_client(f, 300);
  int ex[10];
  assert_int_equal(ecs_meta_exists_batch(cl, ks->ptr, ks->len, 10, ex), ECS_OK);
  ecs_ts_kill9(&f->redis);
  for (int i = 0; i < 10; i++)
    ex[i] = 1;
  uint64_t t0 = mono_ms();
  int rc = ecs_meta_exists_batch(cl, ks->ptr, ks->len, 10, ex);
  /* A killed Redis resets or refuses the link at once: ECS_ECONN, as
   * ecstore.h promises, not a timeout and not ECS_EREDIS (which means
   * Redis answered with an error). */
  assert_int_equal(rc, ECS_ECONN);
  assert_true(mono_ms() - t0 < 700);
  for (int i = 0; i < 10; i++)
    assert_int_equal(ex[i], 0);
  /* Back (empty) on the same port: the client reconnects by itself. */
  assert_int_equal(ecs_ts_redis_start(&f->redis), 0);
  assert_int_equal(ecs_meta_exists_batch(cl, ks->ptr, ks->len, 10, ex), ECS_OK);
  for (int i = 0; i < 10; i++)
    assert_int_equal(ex[i], 0);
  ecs_meta_close(cl);
  ecs_meta_close(srv);
  free(ks);
}

/* The one Redis link (store/redis/rds.h), which meta and the connector share,
 * maps every failure one way: an error reply is ECS_EREDIS and keeps the
 * link; a stopped Redis is ECS_ETIMEDOUT; a killed or absent one is
 * ECS_ECONN (what ecstore.h promises), and the next call reconnects. */
static void test_link_errors(void **state) {
  fx_t *f = *state;
  ecs__rds_t r;
  assert_int_equal(ecs__rds_init(&r, f->url, 300, 300), ECS_OK);
  redisReply *rep = NULL;
  const char *ping[] = {"PING"};
  assert_int_equal(ecs__rds_cmd(&r, &rep, 1, ping, NULL), ECS_OK);
  freeReplyObject(rep);
  const char *bad[] = {"NOSUCHCOMMAND"};
  assert_int_equal(ecs__rds_cmd(&r, &rep, 1, bad, NULL), ECS_EREDIS);
  assert_true(ecs__rds_up(&r));
  ecs_ts_signal(&f->redis, SIGSTOP);
  uint64_t t0 = mono_ms();
  assert_int_equal(ecs__rds_cmd(&r, &rep, 1, ping, NULL), ECS_ETIMEDOUT);
  assert_true(mono_ms() - t0 < 700);
  assert_false(ecs__rds_up(&r));
  ecs_ts_signal(&f->redis, SIGCONT);
  assert_int_equal(ecs__rds_cmd(&r, &rep, 1, ping, NULL), ECS_OK); /* reconnected */
  freeReplyObject(rep);
  ecs_ts_kill9(&f->redis);
  assert_int_equal(ecs__rds_cmd(&r, &rep, 1, ping, NULL), ECS_ECONN); /* reset or closed */
  assert_int_equal(ecs__rds_cmd(&r, &rep, 1, ping, NULL), ECS_ECONN); /* refused */
  assert_non_null(strstr(ecs__rds_errmsg(&r), "127.0.0.1"));
  ecs__rds_close(&r);
  assert_int_equal(ecs_ts_redis_start(&f->redis), 0); /* for teardown */
}

/* ---- the asynchronous link (store/redis/rds_async.c) ------------------------- */

typedef struct alink_obs {
  int ups, downs; /* on_up / on_down calls */
  int down_rc;    /* the last on_down code */
  int done;       /* replies (or failures) seen */
  int rc;         /* the last one's code */
} alink_obs_t;

static void alink_up(void *ctx) {
  ((alink_obs_t *)ctx)->ups++;
}

static void alink_down(void *ctx, int rc) {
  alink_obs_t *o = ctx;
  o->downs++;
  o->down_rc = rc;
}

static void alink_reply(void *ctx, int rc, redisReply *reply) {
  alink_obs_t *o = ctx;
  (void)reply;
  o->done++;
  o->rc = rc;
}

/* Runs the loop the way the server does (events, then what they queued
 * sent, then deadlines) until
 * *flag reaches want or ms pass; returns the flag. */
static int alink_pump(int epfd, ecs__rdsa_t *r, const int *flag, int want, int ms) {
  uint64_t end = mono_ms() + (uint64_t)ms;
  while (*flag < want && mono_ms() < end) {
    struct epoll_event ev[8];
    int n = epoll_wait(epfd, ev, 8, 10);
    for (int i = 0; i < n; i++)
      if (ecs__rdsa_owns(r, ev[i].data.ptr))
        ecs__rdsa_event(r, ev[i].events);
    ecs__rdsa_kick(r);
    ecs__rdsa_poll(r, mono_ms());
  }
  return *flag;
}

/* The server's link maps failures as the blocking one does, without ever
 * blocking: an error reply is ECS_EREDIS and keeps the link; a stopped
 * Redis fails every pending command with ECS_ETIMEDOUT once the oldest is
 * timeout_ms old; a killed one is ECS_ECONN; a connect is never waited
 * for. */
static void test_async_link_errors(void **state) {
  fx_t *f = *state;
  int epfd = epoll_create1(EPOLL_CLOEXEC);
  assert_true(epfd >= 0);
  alink_obs_t o = {0};
  ecs__rdsa_t r;
  assert_int_equal(ecs__rdsa_init(&r, f->url, 300, epfd, alink_up, alink_down, &o), ECS_OK);
  const char *ping[] = {"PING"}, *bad[] = {"NOSUCHCOMMAND"};
  assert_int_equal(ecs__rdsa_command(&r, alink_reply, &o, 1, ping, NULL), ECS_ENOTCONN); /* down */
  assert_int_equal(ecs__rdsa_connect(&r), ECS_OK);
  assert_int_equal(alink_pump(epfd, &r, &o.ups, 1, 5000), 1);
  assert_true(ecs__rdsa_up(&r));
  assert_int_equal(ecs__rdsa_command(&r, alink_reply, &o, 1, ping, NULL), ECS_OK);
  assert_int_equal(alink_pump(epfd, &r, &o.done, 1, 5000), 1);
  assert_int_equal(o.rc, ECS_OK);
  assert_int_equal(ecs__rdsa_command(&r, alink_reply, &o, 1, bad, NULL), ECS_OK);
  assert_int_equal(alink_pump(epfd, &r, &o.done, 2, 5000), 2);
  assert_int_equal(o.rc, ECS_EREDIS);
  assert_true(ecs__rdsa_up(&r));

  /* stopped: both pending commands fail together, at the deadline */
  assert_int_equal(ecs_ts_signal(&f->redis, SIGSTOP), 0);
  uint64_t t0 = mono_ms();
  assert_int_equal(ecs__rdsa_command(&r, alink_reply, &o, 1, ping, NULL), ECS_OK);
  assert_int_equal(ecs__rdsa_command(&r, alink_reply, &o, 1, ping, NULL), ECS_OK);
  assert_int_equal(alink_pump(epfd, &r, &o.done, 4, 5000), 4);
  uint64_t dt = mono_ms() - t0;
  assert_int_equal(o.rc, ECS_ETIMEDOUT);
  assert_true(dt >= 250 && dt < 3000);
  assert_false(ecs__rdsa_up(&r));
  assert_int_equal(o.downs, 1);
  assert_int_equal(o.down_rc, ECS_ETIMEDOUT);
  /* a connect to the stopped Redis: the handshake times out, nothing waits */
  t0 = mono_ms();
  assert_int_equal(ecs__rdsa_connect(&r), ECS_OK);
  assert_true(mono_ms() - t0 < 100);
  assert_int_equal(alink_pump(epfd, &r, &o.downs, 2, 5000), 2);
  assert_int_equal(o.down_rc, ECS_ETIMEDOUT);
  assert_int_equal(ecs_ts_signal(&f->redis, SIGCONT), 0);
  assert_int_equal(ecs__rdsa_connect(&r), ECS_OK);
  assert_int_equal(alink_pump(epfd, &r, &o.ups, 2, 5000), 2);

  /* killed: pending commands fail with ECS_ECONN; so does a reconnect */
  ecs_ts_kill9(&f->redis);
  assert_int_equal(ecs__rdsa_command(&r, alink_reply, &o, 1, ping, NULL), ECS_OK);
  assert_int_equal(alink_pump(epfd, &r, &o.done, 5, 5000), 5);
  assert_int_equal(o.rc, ECS_ECONN);
  assert_int_equal(o.down_rc, ECS_ECONN);
  int downs = o.downs;
  int rc = ecs__rdsa_connect(&r);
  if (rc == ECS_OK) /* refused later, from the loop */
    assert_int_equal(alink_pump(epfd, &r, &o.downs, downs + 1, 5000), downs + 1);
  else
    assert_int_equal(rc, ECS_ECONN);
  assert_false(ecs__rdsa_up(&r));
  assert_non_null(strstr(ecs__rdsa_errmsg(&r), "127.0.0.1"));
  ecs__rdsa_close(&r, ECS_ECANCELED);
  close(epfd);
  assert_int_equal(ecs_ts_redis_start(&f->redis), 0); /* for teardown */
}

/* The deadline is the oldest command's (issue 24): a Redis that stops
 * answering fails the oldest outstanding command timeout_ms after it was
 * sent, even while new commands keep arriving (a deadline taken from the
 * newest command, or renewed by each send, would never pass while the
 * server keeps writing, and its puts would wait for ever). */
static void test_async_link_oldest_deadline(void **state) {
  fx_t *f = *state;
  int epfd = epoll_create1(EPOLL_CLOEXEC);
  assert_true(epfd >= 0);
  alink_obs_t o = {0}, first = {0};
  ecs__rdsa_t r;
  assert_int_equal(ecs__rdsa_init(&r, f->url, 300, epfd, alink_up, alink_down, &o), ECS_OK);
  assert_int_equal(ecs__rdsa_connect(&r), ECS_OK);
  assert_int_equal(alink_pump(epfd, &r, &o.ups, 1, 5000), 1);
  const char *ping[] = {"PING"};
  assert_int_equal(ecs_ts_signal(&f->redis, SIGSTOP), 0);
  uint64_t t0 = mono_ms();
  assert_int_equal(ecs__rdsa_command(&r, alink_reply, &first, 1, ping, NULL), ECS_OK);
  int sent = 0;
  /* a new command every ~10 ms, for up to 5 s or until the first fails */
  while (first.done == 0 && mono_ms() - t0 < 5000) {
    if (ecs__rdsa_up(&r) && ecs__rdsa_command(&r, alink_reply, &o, 1, ping, NULL) == ECS_OK)
      sent++;
    int never = 0;
    alink_pump(epfd, &r, &never, 1, 10);
  }
  uint64_t dt = mono_ms() - t0;
  assert_int_equal(ecs_ts_signal(&f->redis, SIGCONT), 0);
  fprintf(stderr, "oldest command failed after %llu ms, %d newer commands sent meanwhile\n",
          (unsigned long long)dt, sent);
  assert_int_equal(first.done, 1);
  assert_int_equal(first.rc, ECS_ETIMEDOUT);
  assert_true(sent >= 10); /* new commands did keep arriving */
  assert_true(dt >= 250 && dt < 300 + 1000);
  assert_int_equal(o.done, sent); /* the newer ones failed with it */
  ecs__rdsa_close(&r, ECS_ECANCELED);
  close(epfd);
}

/* ---- server outage and re-sync ---------------------------------------- */

static void test_outage_resync(void **state) {
  fx_t *f = *state;
  keyset_t *ks = keys_make(20, 7);
  held_t h = {.ks = ks};
  ecs_meta_resync_t rs = {held_publish, held_has, &h};
  ecs_meta_t *m = open_server(f, "node-a", 5, 10);
  assert_int_equal(ecs_meta_register(m), ECS_OK);
  uint64_t t = 0;
  assert_int_equal(ecs_meta_tick(m, t, &rs), ECS_OK);
  for (size_t i = 0; i < 10; i++)
    h.on[i] = 1;
  put_range(m, ks, 0, 10);

  /* Outage 1: Redis stops (its data stays).  Key 10 arrives: its put times
   * out and takes the link down.  While down, key 3 is evicted: its delete
   * is dropped, so its record stays until the re-sync sweep. */
  ecs_ts_signal(&f->redis, SIGSTOP);
  h.on[10] = 1;
  ecs_meta_rec_t rec;
  rec_for(&rec, ks, 10);
  ecs_meta_queue_put(m, &rec);
  assert_int_equal(ecs_meta_flush(m), ECS_ETIMEDOUT);
  assert_false(ecs_meta_is_up(m));
  h.on[3] = 0;
  ecs_meta_queue_del(m, ks->ptr[3], ks->len[3]);
  assert_int_equal(ecs_meta_flush(m), ECS_ECONN); /* down: dropped */
  /* A reconnect while still stopped fails within the deadline; the next
   * attempt waits for reconnect_ms. */
  t += 1000;
  uint64_t t0 = mono_ms();
  assert_int_equal(ecs_meta_tick(m, t, &rs), ECS_ETIMEDOUT);
  assert_true(mono_ms() - t0 < 800);
  assert_int_equal(ecs_meta_tick(m, t + 50, &rs), ECS_ENOTCONN);

  ecs_ts_signal(&f->redis, SIGCONT);
  assert_int_equal(raw_rec_exists(f, ks->ptr[3], ks->len[3]), 1); /* still there */
  t += 1000;
  assert_int_equal(ecs_meta_tick(m, t, &rs), ECS_OK);
  assert_true(ecs_meta_is_up(m));
  assert_false(ecs_meta_resync_pending(m));
  int ex[20];
  assert_int_equal(ecs_meta_exists_batch(m, ks->ptr, ks->len, 20, ex), ECS_OK);
  for (size_t i = 0; i < 20; i++)
    if (ex[i] != h.on[i])
      fail_msg("after outage 1: exists[%zu] = %d, held %d", i, ex[i], h.on[i]);

  /* Outage 2: Redis dies and comes back empty on the same port. */
  ecs_ts_kill9(&f->redis);
  h.on[5] = 0;
  ecs_meta_queue_del(m, ks->ptr[5], ks->len[5]);
  assert_int_not_equal(ecs_meta_flush(m), ECS_OK);
  t += 1000;
  assert_int_not_equal(ecs_meta_tick(m, t, &rs), ECS_OK); /* refused */
  assert_int_equal(ecs_ts_redis_start(&f->redis), 0);
  raw_connect(f);
  assert_int_equal(raw_count_records(f), 0);
  t += 1000;
  assert_int_equal(ecs_meta_tick(m, t, &rs), ECS_OK);
  assert_false(ecs_meta_resync_pending(m));
  assert_int_equal(ecs_meta_exists_batch(m, ks->ptr, ks->len, 20, ex), ECS_OK);
  for (size_t i = 0; i < 20; i++)
    if (ex[i] != h.on[i])
      fail_msg("after outage 2: exists[%zu] = %d, held %d", i, ex[i], h.on[i]);
  assert_int_equal(raw_count_records(f), 9);
  assert_int_equal(raw_int(f, "EXISTS", "ecs:{" NS "}:node:node-a", strlen("ecs:{" NS "}:node:node-a")), 1);
  ecs_meta_close(m);
  free(ks);
}

/* Graceful shutdown removes this node and its records, nothing of others. */
static void test_unregister(void **state) {
  fx_t *f = *state;
  keyset_t *ka = keys_make(300, 8), *kb = keys_make(200, 9);
  ecs_meta_t *a = open_server(f, "node-a", 1, 10);
  ecs_meta_t *b = open_server(f, "node-b", 2, 10);
  assert_int_equal(ecs_meta_register(a), ECS_OK);
  assert_int_equal(ecs_meta_register(b), ECS_OK);
  put_range(a, ka, 0, 300);
  put_range(b, kb, 0, 200);
  assert_int_equal(raw_count_records(f), 500);
  ecs_meta_node_t nodes[4];
  size_t nn;
  assert_int_equal(ecs_meta_nodes(a, nodes, 4, &nn), ECS_OK);
  assert_int_equal(nn, 2);

  redisReply *r = redisCommand(f->raw, "HSET ecs:{other}:obj:x node node-a epoch 1");
  freeReplyObject(r);
  assert_int_equal(ecs_meta_unregister(a, 5000), ECS_OK);
  assert_int_equal(raw_count_records(f), 200);
  assert_int_equal(raw_int(f, "EXISTS", "ecs:{other}:obj:x", 17), 1); /* another namespace */
  assert_int_equal(raw_int(f, "EXISTS", "ecs:{" NS "}:node:node-a", strlen("ecs:{" NS "}:node:node-a")), 0);
  assert_int_equal(raw_int(f, "EXISTS", "ecs:{" NS "}:node:node-b", strlen("ecs:{" NS "}:node:node-b")), 1);
  assert_int_equal(ecs_meta_nodes(b, nodes, 4, &nn), ECS_OK);
  assert_int_equal(nn, 1);
  assert_string_equal(nodes[0].node_id, "node-b");
  int *ex = calloc(200, sizeof *ex);
  assert_int_equal(ecs_meta_exists_batch(b, kb->ptr, kb->len, 200, ex), ECS_OK);
  for (size_t i = 0; i < 200; i++)
    assert_int_equal(ex[i], 1);
  /* After unregister, tick does not bring the node back. */
  assert_int_equal(ecs_meta_tick(a, 100000, NULL), ECS_OK);
  assert_int_equal(raw_int(f, "EXISTS", "ecs:{" NS "}:node:node-a", strlen("ecs:{" NS "}:node:node-a")), 0);
  ecs_meta_close(a);
  ecs_meta_close(b);
  free(ex);
  free(ka);
  free(kb);
}

/* N8 (issue 23): records forged or junk, written into Redis by anyone who
 * may write the namespace's keys, naming a live node at its real epoch
 * (before: exists said yes, and the get then missed).  exists says no
 * whenever lookup would not find the record; a real record still exists. */
static void test_exists_checks_fields(void **state) {
  fx_t *f = *state;
  ecs_meta_t *srv = open_server(f, "node-a", 42, 10);
  assert_int_equal(ecs_meta_register(srv), ECS_OK);
  keyset_t *ks = keys_make(1, 9);
  ecs_meta_rec_t rec;
  rec_for(&rec, ks, 0);
  ecs_meta_queue_put(srv, &rec);
  assert_int_equal(ecs_meta_flush(srv), ECS_OK);
  static const char *const forged[][2] = {
      {"ecs:{" NS "}:obj:junk-1", "node node-a epoch 42 h:node-a 42"}, /* only the holder */
      {"ecs:{" NS "}:obj:junk-2",
       "node node-a epoch 42 h:node-a 42 off zz len 8 raw_len 8 dtype 7 shape 8 csum 0 codec 0 t 1"},
      {"ecs:{" NS "}:obj:junk-3",
       "node node-a epoch 42 h:node-a 42 off 0 len 8 raw_len 8 dtype 7 shape x,y csum 0 codec 0 t 1"},
      {"ecs:{" NS "}:obj:junk-4",
       "node node-a epoch 42 h:node-a 42 off 0 len 8 raw_len 8 dtype 999 shape 8 csum 0 codec 0 t 1"},
  };
  const size_t nf = sizeof forged / sizeof forged[0];
  for (size_t i = 0; i < nf; i++) {
    char cmd[512], *argv[40], *save = NULL;
    int argc = 0;
    argv[argc++] = "HSET";
    argv[argc++] = (char *)forged[i][0];
    snprintf(cmd, sizeof cmd, "%s", forged[i][1]);
    for (char *t = strtok_r(cmd, " ", &save); t && argc < 40; t = strtok_r(NULL, " ", &save))
      argv[argc++] = t;
    redisReply *r = redisCommandArgv(f->raw, argc, (const char **)argv, NULL);
    assert_true(r && r->type == REDIS_REPLY_INTEGER);
    freeReplyObject(r);
  }
  const uint8_t *keys[5] = {ks->ptr[0], (const uint8_t *)"junk-1", (const uint8_t *)"junk-2",
                            (const uint8_t *)"junk-3", (const uint8_t *)"junk-4"};
  uint16_t lens[5] = {ks->len[0], 6, 6, 6, 6};
  ecs_meta_t *cl = open_client(f, 500);
  int ex[5], st[5];
  ecs_meta_rec_t recs[5];
  assert_int_equal(ecs_meta_exists_batch(cl, keys, lens, 5, ex), ECS_OK);
  assert_int_equal(ecs_meta_lookup_batch(cl, keys, lens, 5, recs, st), ECS_OK);
  assert_int_equal(ex[0], 1);
  assert_int_equal(st[0], ECS_OK);
  for (size_t i = 1; i < 5; i++) {
    if (ex[i] != 0 || st[i] == ECS_OK)
      fail_msg("forged record %zu: exists %d, lookup %d", i, ex[i], st[i]);
  }
  ecs_meta_close(cl);
  ecs_meta_close(srv);
  free(ks);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ts_redis_lifecycle),
      cmocka_unit_test(test_urls),
      cmocka_unit_test(test_no_redis),
      cmocka_unit_test_setup_teardown(test_register_heartbeat_ttl, setup, teardown),
      cmocka_unit_test_setup_teardown(test_suspect_marks, setup, teardown),
      cmocka_unit_test_setup_teardown(test_registry_vanished, setup, teardown),
      cmocka_unit_test_setup_teardown(test_put_exists_lookup, setup, teardown),
      cmocka_unit_test_setup_teardown(test_exists_checks_fields, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stale_epoch, setup, teardown),
      cmocka_unit_test_setup_teardown(test_replica_holders, setup, teardown),
      cmocka_unit_test_setup_teardown(test_deadline_stopped_redis, setup, teardown),
      cmocka_unit_test_setup_teardown(test_killed_redis, setup, teardown),
      cmocka_unit_test_setup_teardown(test_link_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_async_link_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_async_link_oldest_deadline, setup, teardown),
      cmocka_unit_test_setup_teardown(test_outage_resync, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unregister, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
