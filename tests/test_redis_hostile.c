/*
 * A hostile Redis gets nowhere (issue 13): hiredis 0.14 puts no bound on a
 * reply, so a Redis, or anyone on the cleartext path to it, answering
 * "*300000000\r\n" (then elements) or "$1000000000\r\n" (then bytes) made
 * every Redis link of the project allocate or buffer what the header
 * announced.  Each test is the attack against one link: the blocking link
 * itself (ecs__rds_cmd), a client's exists with redis_url, the connector's
 * redis backend and the server's asynchronous link.  The victim must
 * refuse at the header ("reply too large", ECS_EREDIS, link dropped),
 * stay up and keep its memory: the peak RSS (VmHWM) may grow by a few MB
 * at most, where believing the header costs hundreds.
 *
 * Redis is tests/support/fakeredis.c in hostile mode: the point is a
 * hostile peer, which a real redis-server is not.  The data servers are
 * real ecstore-servers on free ports.
 */
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

#include "ecstore/ec_connector.h"
#include "ecstore/ecstore.h"
#include "store/core/net.h"
#include "store/redis/rds.h"
#include "support/fakeredis.h"
#include "support/fixture.h"
#include "support/ts.h"

#define FILLER (48ull << 20) /* what the peer streams after the header */
#define RSS_SLACK_KB 8192    /* growth allowed: a few MB */

/* The attacks: a header, and what it announces, as the peer streams it. */
typedef struct attack {
  const char *name;  /* for messages */
  const char *reply; /* the header */
  const char *unit;  /* the filler repeats this */
  const char *says;  /* the refusal names this */
} attack_t;

static const attack_t attacks[] = {
    {"array", "*300000000\r\n", ":1\r\n", "reply too large (300000000 elements, limit 1048576)"},
    {"bulk", "$1000000000\r\n", "xxxxxxxx", "reply too large (1000000000-byte string"},
    {"line", "-ERR ", "xxxxxxxx", "reply too large (a line of more than"},
};

/* VmHWM or VmRSS ("VmHWM:") of pid in kB, or -1. */
static long proc_kb(pid_t pid, const char *field) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *fp = fopen(path, "r");
  long kb = -1;
  while (fp != NULL && fgets(line, sizeof line, fp) != NULL)
    if (strncmp(line, field, strlen(field)) == 0)
      kb = strtol(line + strlen(field), NULL, 10);
  if (fp != NULL)
    fclose(fp);
  return kb;
}

/* Resets pid's VmHWM to its VmRSS (Linux >= 4.0), so that a peak left by
 * an earlier case does not hide this one's.  Best effort. */
static void reset_hwm(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/clear_refs", (int)pid);
  FILE *fp = fopen(path, "w");
  if (fp != NULL) {
    fputs("5", fp);
    fclose(fp);
  }
}

static ecs_ts_fakeredis_t *hostile(const attack_t *a) {
  ecs_ts_fakeredis_t *f = NULL;
  assert_int_equal(ecs_ts_fakeredis_start_hostile(a->reply, strlen(a->reply), a->unit, FILLER, &f), ECS_OK);
  return f;
}

/* ---- the blocking link ------------------------------------------------ */

static void test_blocking_link(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof attacks / sizeof attacks[0]; i++) {
    const attack_t *a = &attacks[i];
    ecs_ts_fakeredis_t *f = hostile(a);
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", ecs_ts_fakeredis_port(f));
    ecs__rds_t r;
    assert_int_equal(ecs__rds_init(&r, url, 2000, 5000), ECS_OK);
    reset_hwm(getpid());
    long hwm0 = proc_kb(getpid(), "VmHWM:");
    redisReply *rep = NULL;
    const char *argv[] = {"GET", "k"};
    int rc = ecs__rds_cmd(&r, &rep, 2, argv, NULL);
    long hwm1 = proc_kb(getpid(), "VmHWM:");
    printf("# %s: rc %s, \"%s\", VmHWM %ld -> %ld kB, filler taken %llu\n", a->name, ecs_strerror(rc),
           ecs__rds_errmsg(&r), hwm0, hwm1, (unsigned long long)ecs_ts_fakeredis_filler_taken(f));
    assert_int_equal(rc, ECS_EREDIS);
    assert_null(rep);
    assert_non_null(strstr(ecs__rds_errmsg(&r), a->says));
    assert_false(ecs__rds_up(&r)); /* dropped: the stream is out of step */
    assert_true(hwm1 - hwm0 < RSS_SLACK_KB);
    ecs__rds_close(&r);
    ecs_ts_fakeredis_stop(f);
  }
}

/* Arrays nested deeper than hiredis 0.14 parses (7): refused, not a
 * crash.  hiredis refuses them itself; this pins that down. */
static void test_blocking_link_nesting(void **state) {
  (void)state;
  static const char deep[] = "*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n";
  ecs_ts_fakeredis_t *f = NULL;
  assert_int_equal(ecs_ts_fakeredis_start_hostile(deep, sizeof deep - 1, "", 0, &f), ECS_OK);
  char url[64];
  snprintf(url, sizeof url, "127.0.0.1:%d", ecs_ts_fakeredis_port(f));
  ecs__rds_t r;
  assert_int_equal(ecs__rds_init(&r, url, 2000, 5000), ECS_OK);
  redisReply *rep = NULL;
  const char *argv[] = {"GET", "k"};
  assert_int_equal(ecs__rds_cmd(&r, &rep, 2, argv, NULL), ECS_EREDIS);
  assert_non_null(strstr(ecs__rds_errmsg(&r), "nested"));
  assert_false(ecs__rds_up(&r));
  ecs__rds_close(&r);
  ecs_ts_fakeredis_stop(f);
}

/* Arrays each under the element bound, nested: 8 headers of 10 bytes
 * would make the reader calloc 8 MiB each.  The bound on one reply's
 * bytes refuses them (the reader alone, with the async link's bounds). */
static void test_reader_reply_bound(void **state) {
  (void)state;
  redisReader *rd = redisReaderCreate();
  assert_non_null(rd);
  ecs__rds_bound_reader(rd, 1);
  for (int i = 0; i < 8; i++)
    assert_int_equal(redisReaderFeed(rd, "*1048576\r\n", 10), REDIS_OK);
  ecs__rds_reader_guard(rd); /* each header alone is within bounds */
  assert_int_equal(rd->err, 0);
  void *rep = NULL;
  assert_int_equal(redisReaderGetReply(rd, &rep), REDIS_ERR);
  const char *es = ecs__rds_reader_errstr(rd->err, rd->errstr);
  printf("# nested arrays: \"%s\"\n", es);
  assert_non_null(strstr(es, "reply too large (more than"));
  redisReaderFree(rd);

  /* a legitimate reply within the bounds still parses */
  rd = redisReaderCreate();
  ecs__rds_bound_reader(rd, 1);
  static const char ok[] = "*2\r\n$3\r\nfoo\r\n*2\r\n:1\r\n$-1\r\n";
  assert_int_equal(redisReaderFeed(rd, ok, sizeof ok - 1), REDIS_OK);
  ecs__rds_reader_guard(rd);
  assert_int_equal(redisReaderGetReply(rd, &rep), REDIS_OK);
  assert_non_null(rep);
  assert_int_equal(((redisReply *)rep)->elements, 2);
  freeReplyObject(rep);
  redisReaderFree(rd);
}

/* ---- a client's exists with redis_url --------------------------------- */

typedef struct env {
  ecs_ts_env_t env; /* a real Redis and server for the data path */
} env_t;

static int setup(void **state) {
  env_t *e = calloc(1, sizeof *e);
  if (e == NULL || ecs_ts_env_start(&e->env, NULL) != 0) {
    free(e);
    return -1;
  }
  *state = e;
  return 0;
}

static int teardown(void **state) {
  env_t *e = *state;
  int st = ecs_ts_env_stop(&e->env);
  free(e);
  return st == 0 ? 0 : -1;
}

static void test_client_exists(void **state) {
  env_t *e = *state;
  for (size_t i = 0; i < sizeof attacks / sizeof attacks[0]; i++) {
    ecs_ts_fakeredis_t *f = hostile(&attacks[i]);
    char url[64];
    snprintf(url, sizeof url, "127.0.0.1:%d", ecs_ts_fakeredis_port(f));
    ecs_client_config_t cfg;
    ecs_client_config_init(&cfg);
    cfg.servers = e->env.servers;
    cfg.redis_url = url;
    cfg.ns = "test";
    cfg.transport = "tcp";
    cfg.timeout_ms = 5000;
    reset_hwm(getpid());
    long hwm0 = proc_kb(getpid(), "VmHWM:");
    ecs_client_t *c = NULL;
    int rc = ecs_client_connect(&cfg, &c, NULL, 0);
    int ex[4] = {7, 7, 7, 7};
    if (rc == ECS_OK) {
      ecs_key_t keys[4] = {{"a", 1}, {"b", 1}, {"c", 1}, {"d", 1}};
      rc = ecs_exists_batch(c, keys, 4, ex);
    }
    long hwm1 = proc_kb(getpid(), "VmHWM:");
    printf("# client %s: rc %s, \"%s\", VmHWM %ld -> %ld kB, hostile replies %llu\n", attacks[i].name,
           ecs_strerror(rc), c ? ecs_client_errmsg(c) : "", hwm0, hwm1,
           (unsigned long long)ecs_ts_fakeredis_hostile_sent(f));
    assert_true(ecs_ts_fakeredis_hostile_sent(f) >= 1); /* the attack was made */
    for (int k = 0; k < 4; k++)                         /* never "exists" from it */
      assert_true(ex[k] == 0 || ex[k] == 7);
    assert_true(hwm1 - hwm0 < RSS_SLACK_KB);
    ecs_client_close(c);
    ecs_ts_fakeredis_stop(f);
  }
}

/* ---- the connector's redis backend ------------------------------------ */

static void test_connector_redis(void **state) {
  env_t *e = *state;
  for (size_t i = 0; i < sizeof attacks / sizeof attacks[0]; i++) {
    ecs_ts_fakeredis_t *f = hostile(&attacks[i]);
    char js[512], err[512] = "";
    snprintf(js, sizeof js,
             "{\"backend\": \"redis\", \"servers\": \"%s\", \"redis_url\": \"redis://127.0.0.1:%d\","
             " \"namespace\": \"test\", \"timeout_ms\": 5000, \"connect_timeout_ms\": 1000,"
             " \"staging_bytes\": \"1M\", \"protocol\": \"tcp\"}",
             e->env.servers, ecs_ts_fakeredis_port(f));
    reset_hwm(getpid());
    long hwm0 = proc_kb(getpid(), "VmHWM:");
    ecs_ec_conn_t *c = NULL;
    int rc = ecs_ec_open_json(js, &c, err, sizeof err);
    int ex[2] = {7, 7};
    if (rc == ECS_OK) {
      const char *hashes[2] = {"h1", "h2"};
      rc = ecs_ec_has(c, hashes, 2, ex);
    }
    long hwm1 = proc_kb(getpid(), "VmHWM:");
    printf("# connector %s: rc %s, \"%s\", VmHWM %ld -> %ld kB\n", attacks[i].name, ecs_strerror(rc), err,
           hwm0, hwm1);
    assert_true(ecs_ts_fakeredis_hostile_sent(f) >= 1);
    assert_int_equal(rc, ECS_EREDIS);
    assert_true(ex[0] != 1 && ex[1] != 1);
    assert_true(hwm1 - hwm0 < RSS_SLACK_KB);
    ecs_ec_close(c);
    ecs_ts_fakeredis_stop(f);
  }
}

/* ---- the server's asynchronous link ----------------------------------- */

static int log_has(const ecs_ts_proc_t *p, const char *what) {
  FILE *fp = fopen(p->log, "r");
  char line[1024];
  int found = 0;
  while (fp != NULL && !found && fgets(line, sizeof line, fp) != NULL)
    found = strstr(line, what) != NULL;
  if (fp != NULL)
    fclose(fp);
  return found;
}

/* The server comes up against a well-behaved peer; then the peer turns
 * hostile and the server's next Redis command gets the attack. */
static void server_attack(const attack_t *a) {
  ecs_ts_fakeredis_t *f = hostile(a);
  ecs_ts_fakeredis_set_hostile(f, 0);
  ecs_ts_proc_t srv;
  memset(&srv, 0, sizeof srv);
  assert_int_equal(ecs_ts_server_start(&srv, ecs_ts_fakeredis_port(f), NULL), 0);
  char servers[64];
  snprintf(servers, sizeof servers, "127.0.0.1:%d", srv.port);
  ecs_client_t *c = ecs_ts_client(servers, NULL, NULL, 5000);
  assert_non_null(c);
  static uint8_t data[4096], back[4096];
  memset(data, 0x5a, sizeof data);
  int st0 = ecs_ts_put1(c, "before", data, sizeof data, ECS_DTYPE_U8);
  usleep(300 * 1000);
  reset_hwm(srv.pid);
  long hwm0 = proc_kb(srv.pid, "VmHWM:"), rss0 = proc_kb(srv.pid, "VmRSS:");
  ecs_ts_fakeredis_set_hostile(f, 1);
  /* puts make the server write records: commands on its async link */
  uint64_t t_end = ecs_now_ms() + 10000;
  int n = 0;
  while (ecs_now_ms() < t_end && !log_has(&srv, "reply too large")) {
    char key[32];
    snprintf(key, sizeof key, "k%d", n++);
    int st = ecs_ts_put1(c, key, data, sizeof data, ECS_DTYPE_U8);
    assert_true(st == ECS_OK || st == ECS_EREDIS || st == ECS_ECONN || st == ECS_ETIMEDOUT);
    usleep(100 * 1000);
  }
  usleep(500 * 1000);
  long hwm1 = proc_kb(srv.pid, "VmHWM:"), rss1 = proc_kb(srv.pid, "VmRSS:");
  printf("# server %s: %d puts, hostile replies %llu, filler taken %llu, VmRSS %ld -> %ld kB, "
         "VmHWM %ld -> %ld kB\n",
         a->name, n, (unsigned long long)ecs_ts_fakeredis_hostile_sent(f),
         (unsigned long long)ecs_ts_fakeredis_filler_taken(f), rss0, rss1, hwm0, hwm1);
  assert_true(ecs_ts_fakeredis_hostile_sent(f) >= 1);
  assert_true(log_has(&srv, a->says)); /* logged, in words */
  assert_true(hwm1 - hwm0 < RSS_SLACK_KB);
  /* still up and serving over TCP */
  assert_int_equal(ecs_ts_signal(&srv, 0), 0);
  uint64_t nb = 0;
  if (st0 == ECS_OK)
    assert_int_equal(ecs_ts_get1(c, "before", back, sizeof back, &nb), ECS_OK);
  else
    assert_int_equal(ecs_ts_get1(c, "before", back, sizeof back, &nb), ECS_ENOTFOUND);
  if (st0 == ECS_OK)
    assert_memory_equal(back, data, sizeof data);
  ecs_server_stat_t s = ecs_ts_stat0(c);
  (void)s;
  ecs_client_close(c);
  assert_int_equal(ecs_ts_stop(&srv, 5000), 0);
  ecs_ts_fakeredis_stop(f);
}

static void test_server_async_link(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof attacks / sizeof attacks[0]; i++)
    server_attack(&attacks[i]);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_blocking_link),      cmocka_unit_test(test_blocking_link_nesting),
      cmocka_unit_test(test_reader_reply_bound), cmocka_unit_test(test_client_exists),
      cmocka_unit_test(test_connector_redis),    cmocka_unit_test(test_server_async_link),
  };
  return cmocka_run_group_tests_name("redis_hostile", tests, setup, teardown);
}
