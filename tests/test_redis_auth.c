/*
 * test_redis_auth: Redis with a password (requirepass) and with an ACL
 * user (issue 13).  One redis-server started here with both; then the
 * server registers and publishes with the password from a file and with
 * an ACL user from its config file's URL; the metadata layer of the client
 * library and the connector's redis backend work with the password and
 * with the user; a wrong password is a clear "authentication failed"; the
 * password is never in the server's command line, its log or a message;
 * and a password in a --redis URL on the command line is refused.
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
#include "support/raw.h"
#include "support/ts.h"

#define PW "s3cret-Redis-pw"         /* requirepass (the default user) */
#define ALICE_PW "alice:p@ss/word%!" /* ACL user alice: needs escaping in a URL */
#define ALICE_PW_URL "alice%3Ap%40ss%2Fword%25%21"
#define NS_PW "ns-pw-5b1c0e" /* the per-namespace users */

static ecs_ts_proc_t g_redis;
static char g_dir[256];

static const char *redis_path(void) {
  static char buf[512];
  const char *path = getenv("PATH");
  while (path != NULL && *path != '\0') {
    const char *end = strchr(path, ':');
    size_t len = end ? (size_t)(end - path) : strlen(path);
    if (len > 0 && len < sizeof buf - 16) {
      snprintf(buf, sizeof buf, "%.*s/redis-server", (int)len, path);
      if (access(buf, X_OK) == 0)
        return buf;
    }
    path = end ? end + 1 : NULL;
  }
  return "/usr/bin/redis-server";
}

static int setup(void **state) {
  (void)state;
  if (ecs_ts_mkdtemp(g_dir, sizeof g_dir) != 0)
    return -1;
  for (int attempt = 0; attempt < 5; attempt++) {
    memset(&g_redis, 0, sizeof g_redis);
    g_redis.port = ecs_ts_free_port();
    char port[16];
    snprintf(port, sizeof port, "%d", g_redis.port);
    char *argv[] = {(char *)redis_path(), "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly",
                    "no", "--daemonize", "no", "--requirepass", PW, "--user", "alice", "on", ">" ALICE_PW,
                    "~*", "&*", "+@all",
                    /* the registry-trust deployment (docs/security.md): a
                     * Redis user per namespace, its keys only */
                    "--user", "ns-test", "on", ">" NS_PW, "resetkeys", "~ecs:{test}:*", "&*", "+@all",
                    "-@dangerous", "--user", "ns-other", "on", ">" NS_PW, "resetkeys", "~ecs:{other}:*", "&*",
                    "+@all", "-@dangerous", NULL};
    if (ecs_ts_spawn(&g_redis, argv) != 0)
      return -1;
    if (ecs_ts_wait_port(&g_redis, g_redis.port, 5000) == 0)
      return 0;
    ecs_ts_kill9(&g_redis);
  }
  return -1;
}

static int teardown(void **state) {
  (void)state;
  ecs_ts_stop(&g_redis, 3000);
  rmdir(g_dir);
  return 0;
}

static void write_file(const char *path, const char *text, mode_t mode) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  assert_int_equal(chmod(path, mode), 0);
}

/* Whether the file at path holds needle (binary-safe: cmdline has NULs). */
static int file_has(const char *path, const char *needle) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return -1;
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  size_t nl = strlen(needle);
  for (size_t i = 0; i + nl <= n; i++)
    if (memcmp(buf + i, needle, nl) == 0)
      return 1;
  return 0;
}

/* A hiredis link authenticated as the default user. */
static redisContext *redis_admin(void) {
  redisContext *r = ecs_ts_redis_at(g_redis.port);
  assert_non_null(r);
  redisReply *rep = redisCommand(r, "AUTH %s", PW);
  assert_non_null(rep);
  assert_int_equal(rep->type, REDIS_REPLY_STATUS);
  freeReplyObject(rep);
  return r;
}

static long long redis_int(redisContext *r, const char *fmt, const char *arg) {
  redisReply *rep = redisCommand(r, fmt, arg);
  assert_non_null(rep);
  long long v = rep->type == REDIS_REPLY_INTEGER ? rep->integer : -1;
  freeReplyObject(rep);
  return v;
}

/* Puts key through a client of the server at port (no Redis on the client)
 * and checks that the server published its record and registered. */
static void put_and_check_published(int port, const char *key) {
  char servers[64];
  snprintf(servers, sizeof servers, "127.0.0.1:%d", port);
  ecs_client_t *c = ecs_ts_client(servers, NULL, NULL, 5000);
  assert_non_null(c);
  uint8_t a[4096];
  ecs_ts_fill(a, sizeof a, 9);
  assert_int_equal(ecs_ts_put1(c, key, a, sizeof a, ECS_DTYPE_U8), ECS_OK);
  ecs_client_close(c);
  redisContext *r = redis_admin();
  assert_int_equal(redis_int(r, "EXISTS ecs:{test}:obj:%s", key), 1);
  assert_true(redis_int(r, "SCARD %s", "ecs:{test}:nodes") >= 1);
  redisFree(r);
}

/* Waits up to 5 s for needle to show in the log at path. */
static int log_wait(const char *path, const char *needle) {
  for (int i = 0; i < 100; i++) {
    if (file_has(path, needle) == 1)
      return 1;
    usleep(50 * 1000);
  }
  return 0;
}

static void assert_secret_hidden(const ecs_ts_proc_t *p, const char *secret) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/cmdline", (int)p->pid);
  assert_int_equal(file_has(path, secret), 0);
  assert_int_equal(file_has(p->log, secret), 0);
}

/* The server with --redis-password-file: registers and publishes; the
 * password is neither in its argv nor in its log. */
static void test_server_password_file(void **state) {
  (void)state;
  char pwf[300];
  snprintf(pwf, sizeof pwf, "%s/redis-pw", g_dir);
  write_file(pwf, PW "\n", 0600);
  const char *extra[] = {"--redis-password-file", pwf, "--log-level", "debug", NULL};
  ecs_ts_proc_t s;
  memset(&s, 0, sizeof s);
  assert_int_equal(ecs_ts_server_start(&s, g_redis.port, extra), 0);
  put_and_check_published(s.port, "pwfile-key");
  assert_secret_hidden(&s, PW);
  assert_int_equal(log_wait(s.log, "registered with Redis"), 1);
  assert_int_equal(ecs_ts_stop(&s, 5000), 0);
  unlink(pwf);
}

/* Spawns the server with only a config file (holding the --redis URL) and
 * the listen address on its command line. */
static int start_with_config(ecs_ts_proc_t *s, const char *cfg_text) {
  memset(s, 0, sizeof *s);
  if (ecs_ts_mkdtemp(s->dir, sizeof s->dir) != 0)
    return -1;
  char cfg[300], listen[32];
  snprintf(cfg, sizeof cfg, "%s/server.conf", s->dir);
  write_file(cfg, cfg_text, 0600);
  s->port = ecs_ts_free_port();
  snprintf(listen, sizeof listen, "127.0.0.1:%d", s->port);
  char bin[512];
  snprintf(bin, sizeof bin, "%s", ecs_ts_bin("ecstore-server"));
  char *argv[] = {bin, "--config", cfg, "--listen", listen, NULL};
  if (ecs_ts_spawn(s, argv) != 0)
    return -1;
  return ecs_ts_wait_port(s, s->port, 10000);
}

/* An ACL user in the URL of the server's config file (a URL there may hold
 * the password: the file is not world-readable, argv is). */
static void test_server_acl_user_from_config(void **state) {
  (void)state;
  char text[512];
  snprintf(text, sizeof text,
           "redis = redis://alice:%s@127.0.0.1:%d/0\n"
           "ns = test\npool-size = 64M\nshm-socket = off\n",
           ALICE_PW_URL, g_redis.port);
  ecs_ts_proc_t s;
  assert_int_equal(start_with_config(&s, text), 0);
  put_and_check_published(s.port, "acl-user-key");
  assert_secret_hidden(&s, ALICE_PW);
  assert_secret_hidden(&s, ALICE_PW_URL);
  assert_int_equal(log_wait(s.log, "alice"), 1); /* the user is no secret: it is named */
  assert_int_equal(ecs_ts_stop(&s, 5000), 0);
}

/* A wrong password: the server says "authentication failed" (and keeps
 * serving, retrying), without the password it tried. */
static void test_server_wrong_password(void **state) {
  (void)state;
  char pwf[300];
  snprintf(pwf, sizeof pwf, "%s/wrong-pw", g_dir);
  write_file(pwf, "not-the-password\n", 0600);
  const char *extra[] = {"--redis-password-file", pwf, NULL};
  ecs_ts_proc_t s;
  memset(&s, 0, sizeof s);
  assert_int_equal(ecs_ts_server_start(&s, g_redis.port, extra), 0);
  assert_int_equal(log_wait(s.log, "authentication failed"), 1);
  assert_secret_hidden(&s, "not-the-password");
  assert_int_equal(ecs_ts_stop(&s, 5000), 0);
  unlink(pwf);
}

/* A password in a --redis URL on the command line is refused at once,
 * saying where to put it; and a token-file-like permission check holds
 * for the password file. */
static void test_password_on_command_line_refused(void **state) {
  (void)state;
  char url[128];
  snprintf(url, sizeof url, "redis://:%s@127.0.0.1:%d", PW, g_redis.port);
  const char *bin = ecs_ts_bin("ecstore-server");
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "'%s' --listen 127.0.0.1:0 --redis '%s' --pool-size 64M 2>&1", bin, url);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  char out[2048] = "";
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 2);
  assert_non_null(strstr(out, "--redis-password-file"));
  assert_non_null(strstr(out, "ECSTORE_REDIS_PASSWORD"));
  assert_null(strstr(out, PW));
  /* a password file others may read is refused */
  char pwf[300];
  snprintf(pwf, sizeof pwf, "%s/open-pw", g_dir);
  write_file(pwf, PW "\n", 0644);
  snprintf(cmd, sizeof cmd, "'%s' --listen 127.0.0.1:0 --redis 127.0.0.1:%d --redis-password-file '%s' 2>&1",
           bin, g_redis.port, pwf);
  p = popen(cmd, "r");
  assert_non_null(p);
  n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  st = pclose(p);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 2);
  assert_non_null(strstr(out, "chmod 600"));
  unlink(pwf);
  /* the CLI refuses one in its --redis too, without echoing it */
  snprintf(cmd, sizeof cmd, "'%s' --server 127.0.0.1:1 --redis '%s' stat 2>&1", ecs_ts_bin("ecstore-cli"),
           url);
  p = popen(cmd, "r");
  assert_non_null(p);
  n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  st = pclose(p);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 2);
  assert_non_null(strstr(out, "ECSTORE_REDIS_PASSWORD"));
  assert_null(strstr(out, PW));
}

/* The Redis link and the metadata layer the client library uses: the
 * password in the URL, from the environment, an ACL user; a wrong one is
 * ECS_EAUTH with a clear message that does not hold it. */
static void test_link_and_meta(void **state) {
  (void)state;
  char url[256];
  ecs__rds_t r;
  redisReply *rep;
  const char *ping[] = {"PING"};
  /* no password: Redis refuses the commands, not the connect */
  snprintf(url, sizeof url, "127.0.0.1:%d", g_redis.port);
  unsetenv("ECSTORE_REDIS_PASSWORD");
  assert_int_equal(ecs__rds_init(&r, url, 2000, 2000), ECS_OK);
  assert_int_equal(ecs__rds_cmd(&r, &rep, 1, ping, NULL), ECS_EREDIS);
  assert_non_null(strstr(ecs__rds_errmsg(&r), "NOAUTH"));
  ecs__rds_close(&r);
  /* from the environment */
  setenv("ECSTORE_REDIS_PASSWORD", PW, 1);
  assert_int_equal(ecs__rds_init(&r, url, 2000, 2000), ECS_OK);
  assert_int_equal(ecs__rds_cmd(&r, &rep, 1, ping, NULL), ECS_OK);
  freeReplyObject(rep);
  ecs__rds_close(&r);
  unsetenv("ECSTORE_REDIS_PASSWORD");
  /* the ACL user, with a db */
  snprintf(url, sizeof url, "redis://alice:%s@127.0.0.1:%d/2", ALICE_PW_URL, g_redis.port);
  assert_int_equal(ecs__rds_init(&r, url, 2000, 2000), ECS_OK);
  assert_int_equal(ecs__rds_cmd(&r, &rep, 1, ping, NULL), ECS_OK);
  freeReplyObject(rep);
  ecs__rds_close(&r);
  /* wrong passwords */
  snprintf(url, sizeof url, "redis://alice:wrong-pw@127.0.0.1:%d", g_redis.port);
  assert_int_equal(ecs__rds_init(&r, url, 2000, 2000), ECS_OK);
  assert_int_equal(ecs__rds_connect(&r), ECS_EAUTH);
  assert_non_null(strstr(ecs__rds_errmsg(&r), "authentication failed as user alice"));
  assert_null(strstr(ecs__rds_errmsg(&r), "wrong-pw"));
  assert_int_equal(ecs__rds_up(&r), 0);
  snprintf(url, sizeof url, "redis://:wrong-pw@127.0.0.1:%d", g_redis.port);
  assert_int_equal(ecs__rds_init(&r, url, 2000, 2000), ECS_OK);
  assert_int_equal(ecs__rds_connect(&r), ECS_EAUTH);
  assert_non_null(strstr(ecs__rds_errmsg(&r), "authentication failed"));
  /* the metadata layer */
  ecs_meta_opts_t o;
  ecs_meta_opts_init(&o);
  o.ns = "test";
  o.redis_url = url; /* wrong */
  ecs_meta_t *m = NULL;
  assert_int_equal(ecs_meta_open(&o, &m), ECS_OK); /* a client starts with Redis down */
  assert_int_equal(ecs_meta_is_up(m), 0);
  assert_non_null(strstr(ecs_meta_errstr(m), "authentication failed"));
  assert_null(strstr(ecs_meta_errstr(m), "wrong-pw"));
  ecs_meta_close(m);
  snprintf(url, sizeof url, "redis://:" PW "@127.0.0.1:%d", g_redis.port);
  assert_int_equal(ecs_meta_open(&o, &m), ECS_OK);
  assert_int_equal(ecs_meta_is_up(m), 1);
  ecs_meta_close(m);
}

/* The client library with a password in its redis_url: exists through
 * Redis sees what the server published. */
static void test_client_library(void **state) {
  (void)state;
  char pwf[300];
  snprintf(pwf, sizeof pwf, "%s/redis-pw2", g_dir);
  write_file(pwf, PW "\n", 0600);
  const char *extra[] = {"--redis-password-file", pwf, NULL};
  ecs_ts_proc_t s;
  memset(&s, 0, sizeof s);
  assert_int_equal(ecs_ts_server_start(&s, g_redis.port, extra), 0);
  char servers[64], url[256];
  snprintf(servers, sizeof servers, "127.0.0.1:%d", s.port);
  snprintf(url, sizeof url, "redis://alice:%s@127.0.0.1:%d", ALICE_PW_URL, g_redis.port);
  ecs_client_t *c = ecs_ts_client(servers, url, NULL, 5000);
  assert_non_null(c);
  uint8_t a[4096];
  ecs_ts_fill(a, sizeof a, 11);
  assert_int_equal(ecs_ts_put1(c, "client-key", a, sizeof a, ECS_DTYPE_U8), ECS_OK);
  ecs_key_t k[2] = {{"client-key", 10}, {"no-such-key", 11}};
  int ex[2] = {-1, -1};
  assert_int_equal(ecs_exists_batch(c, k, 2, ex), ECS_OK);
  assert_int_equal(ex[0], 1);
  assert_int_equal(ex[1], 0);
  ecs_client_close(c);
  assert_int_equal(ecs_ts_stop(&s, 5000), 0);
  unlink(pwf);
}

/* The connector's redis backend: the password from redis_password_file,
 * the ACL user from the URL; a wrong password refuses the open clearly. */
static void connector_roundtrip(const char *json) {
  ecs_ec_conn_t *c = NULL;
  char err[512] = "";
  int rc = ecs_ec_open_json(json, &c, err, sizeof err);
  if (rc != ECS_OK)
    fail_msg("open: %s: %s", ecs_strerror(rc), err);
  uint8_t a[8192], b[8192];
  ecs_ts_fill(a, sizeof a, 13);
  ecs_tensor_t t = {.data = a, .nbytes = sizeof a};
  t.desc.dtype = ECS_DTYPE_U8;
  t.desc.ndim = 1;
  t.desc.shape[0] = sizeof a;
  assert_int_equal(ecs_ec_save(c, "mm-auth", &t), ECS_OK);
  size_t nf = 99;
  ecs_ec_save_result_t fr[4];
  assert_int_equal(ecs_ec_wait_for_save(c, 5000, fr, 4, &nf), ECS_OK);
  assert_int_equal(nf, 0);
  ecs_ec_load_item_t it = {"mm-auth", b, sizeof b, sizeof a};
  ecs_ec_load_t *ld = NULL;
  ecs_ec_load_result_t res;
  assert_int_equal(ecs_ec_start_load(c, &it, 1, &ld), ECS_OK);
  assert_int_equal(ecs_ec_wait_for_load(ld, 5000, &res), ECS_OK);
  ecs_ec_load_release(ld);
  assert_int_equal(res.status, ECS_OK);
  assert_memory_equal(a, b, sizeof a);
  ecs_ec_close(c);
}

static void test_connector_redis_backend(void **state) {
  (void)state;
  char pwf[300], json[1024];
  snprintf(pwf, sizeof pwf, "%s/conn-pw", g_dir);
  write_file(pwf, PW "\n", 0600);
  snprintf(
      json, sizeof json,
      "{\"backend\": \"redis\", \"redis_url\": \"redis://127.0.0.1:%d\", \"redis_password_file\": \"%s\","
      " \"namespace\": \"test\", \"connect_timeout_ms\": 2000}",
      g_redis.port, pwf);
  connector_roundtrip(json);
  snprintf(json, sizeof json,
           "{\"backend\": \"redis\", \"redis_url\": \"redis://alice:%s@127.0.0.1:%d\","
           " \"namespace\": \"test\", \"connect_timeout_ms\": 2000}",
           ALICE_PW_URL, g_redis.port);
  connector_roundtrip(json);
  /* wrong password */
  write_file(pwf, "wrong-pw\n", 0600);
  snprintf(
      json, sizeof json,
      "{\"backend\": \"redis\", \"redis_url\": \"redis://127.0.0.1:%d\", \"redis_password_file\": \"%s\","
      " \"namespace\": \"test\", \"connect_timeout_ms\": 2000}",
      g_redis.port, pwf);
  ecs_ec_conn_t *c = NULL;
  char err[512] = "";
  assert_int_equal(ecs_ec_open_json(json, &c, err, sizeof err), ECS_EAUTH);
  assert_non_null(strstr(err, "authentication failed"));
  assert_null(strstr(err, "wrong-pw"));
  /* a password file others may read */
  assert_int_equal(chmod(pwf, 0644), 0);
  assert_int_equal(ecs_ec_open_json(json, &c, err, sizeof err), ECS_EINVAL);
  assert_non_null(strstr(err, "redis_password_file"));
  assert_non_null(strstr(err, "chmod 600"));
  unlink(pwf);
}

/* Registry trust (issue 23, N1 and N9): with a Redis user per namespace
 * (keys ~ecs:{NS}:*, no dangerous commands), the servers and clients of
 * namespace test work as user ns-test, and another namespace's user
 * cannot write a rogue registry entry there, nor delete a server's, nor
 * flush the database.  (Without it, any Redis user could: test_trust has
 * what the token proof and the heartbeat still bound then.) */
static void test_namespace_acl_user_cannot_forge(void **state) {
  (void)state;
  char pwf[300], url[256];
  snprintf(pwf, sizeof pwf, "%s/ns-pw", g_dir);
  write_file(pwf, NS_PW "\n", 0600);
  snprintf(url, sizeof url, "redis://ns-test@127.0.0.1:%d", g_redis.port);
  const char *extra[] = {"--redis", url, "--redis-password-file", pwf, NULL};
  ecs_ts_proc_t s;
  memset(&s, 0, sizeof s);
  assert_int_equal(ecs_ts_server_start(&s, g_redis.port, extra), 0);
  /* a discovery client as ns-test: puts, finds, reads */
  snprintf(url, sizeof url, "redis://ns-test:%s@127.0.0.1:%d", NS_PW, g_redis.port);
  ecs_client_t *c = ecs_ts_client(NULL, url, NULL, 5000);
  assert_non_null(c);
  uint8_t a[4096], b[4096];
  ecs_ts_fill(a, sizeof a, 12);
  assert_int_equal(ecs_ts_put1(c, "acl-key", a, sizeof a, ECS_DTYPE_U8), ECS_OK);
  ecs_key_t k = {"acl-key", 7};
  int ex = -1;
  assert_int_equal(ecs_exists_batch(c, &k, 1, &ex), ECS_OK);
  assert_int_equal(ex, 1);
  assert_int_equal(ecs_ts_get1(c, "acl-key", b, sizeof b, NULL), ECS_OK);
  assert_memory_equal(a, b, sizeof a);
  /* another namespace's user */
  redisContext *r = ecs_ts_redis_at(g_redis.port);
  assert_non_null(r);
  redisReply *rep = redisCommand(r, "AUTH ns-other %s", NS_PW);
  assert_true(rep && rep->type == REDIS_REPLY_STATUS);
  freeReplyObject(rep);
  static const char *const forge[] = {
      "HSET ecs:{test}:node:rogue addr 127.0.0.1:1 port 1 pool 1 epoch 1 started 1",
      "SADD ecs:{test}:nodes rogue",
      "DEL the-servers-entry",
      "HSET ecs:{test}:obj:acl-key node rogue",
      "FLUSHALL",
  };
  for (size_t i = 0; i < sizeof forge / sizeof forge[0]; i++) {
    char cmd[256], *argv[16], *save = NULL;
    int argc = 0;
    snprintf(cmd, sizeof cmd, "%s", forge[i]);
    for (char *t = strtok_r(cmd, " ", &save); t && argc < 16; t = strtok_r(NULL, " ", &save))
      argv[argc++] = t;
    char node[96];
    if (!strcmp(argv[0], "DEL")) { /* the server's own entry */
      snprintf(node, sizeof node, "ecs:{test}:node:127.0.0.1:%d", s.port);
      argv[1] = node;
    }
    rep = redisCommandArgv(r, argc, (const char **)argv, NULL);
    assert_non_null(rep);
    if (rep->type != REDIS_REPLY_ERROR || strncmp(rep->str, "NOPERM", 6) != 0)
      fail_msg("'%s' was not refused: type %d", forge[i], rep->type);
    freeReplyObject(rep);
  }
  /* its own namespace it may write */
  rep = redisCommand(r, "SET ecs:{other}:probe 1");
  assert_true(rep && rep->type == REDIS_REPLY_STATUS);
  freeReplyObject(rep);
  redisFree(r);
  assert_int_equal(ecs_ts_get1(c, "acl-key", b, sizeof b, NULL), ECS_OK);
  ecs_client_close(c);
  assert_int_equal(ecs_ts_stop(&s, 5000), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_server_password_file),    cmocka_unit_test(test_server_acl_user_from_config),
      cmocka_unit_test(test_server_wrong_password),   cmocka_unit_test(test_password_on_command_line_refused),
      cmocka_unit_test(test_link_and_meta),           cmocka_unit_test(test_client_library),
      cmocka_unit_test(test_connector_redis_backend), cmocka_unit_test(test_namespace_acl_user_cannot_forge),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
