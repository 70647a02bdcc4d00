/* The integration tests' fixture; see fixture.h. */
#include "support/fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <hiredis/hiredis.h>

int ecs_ts_env_start(ecs_ts_env_t *e, const char *const extra[]) {
  memset(e, 0, sizeof *e);
  if (ecs_ts_redis_start(&e->redis) || ecs_ts_server_start(&e->server, e->redis.port, extra)) {
    ecs_ts_env_stop(e);
    return -1;
  }
  snprintf(e->servers, sizeof e->servers, "127.0.0.1:%d", e->server.port);
  snprintf(e->redis_url, sizeof e->redis_url, "127.0.0.1:%d", e->redis.port);
  /* ecs_ts_server_start puts the socket in the server's directory */
  snprintf(e->shm_path, sizeof e->shm_path, "%.100s/shm.sock", e->server.dir);
  return 0;
}

int ecs_ts_env_stop(ecs_ts_env_t *e) {
  int st = e->server.pid ? ecs_ts_stop(&e->server, 5000) : 0;
  if (e->redis.pid)
    ecs_ts_stop(&e->redis, 5000);
  return st;
}

int ecs_ts_env_open(ecs_ts_env_t *e, const char *const extra[], int timeout_ms) {
  if (ecs_ts_env_start(e, extra))
    return -1;
  e->c = ecs_ts_client(e->servers, NULL, NULL, timeout_ms);
  e->cr = ecs_ts_client(e->servers, e->redis_url, NULL, timeout_ms);
  if (!e->c || !e->cr) {
    ecs_ts_env_close(e);
    return -1;
  }
  if (strcmp(ecs_client_transport(e->c), ecs_ts_transport()) != 0) {
    fprintf(stderr, "client took %s, not %s\n", ecs_client_transport(e->c), ecs_ts_transport());
    ecs_ts_env_close(e);
    return -1;
  }
  return 0;
}

int ecs_ts_env_close(ecs_ts_env_t *e) {
  ecs_client_close(e->c);
  ecs_client_close(e->cr);
  e->c = e->cr = NULL;
  return ecs_ts_env_stop(e);
}

int ecs_ts_group_open(void **state, const char *const extra[], int timeout_ms) {
  ecs_ts_env_t *e = calloc(1, sizeof *e);
  if (!e || ecs_ts_env_open(e, extra, timeout_ms)) {
    free(e);
    *state = NULL;
    return -1;
  }
  *state = e;
  return 0;
}

int ecs_ts_group_close(void **state) {
  ecs_ts_env_t *e = *state;
  if (!e) /* setup failed and cleaned up after itself */
    return -1;
  int st = ecs_ts_env_close(e);
  free(e);
  *state = NULL;
  if (st != 0)
    fprintf(stderr, "ecstore-server exited with status %d\n", st);
  return st == 0 ? 0 : -1;
}

int ecs_ts_group_open_debug(void **state) {
  static const char *const extra[] = {"--enable-debug-ops", NULL};
  return ecs_ts_group_open(state, extra, 5000);
}

ecs_server_stat_t ecs_ts_stat0(ecs_client_t *c) {
  ecs_server_stat_t st;
  int rc = ecs_stat(c, 0, &st);
  if (rc != ECS_OK) {
    fprintf(stderr, "STAT of server 0 failed: %s (%s)\n", ecs_strerror(rc), ecs_client_errmsg(c));
    abort();
  }
  return st;
}

const char *ecs_ts_transport(void) {
  const char *t = getenv("ECS_TEST_TRANSPORT");
  return t && *t ? t : "tcp";
}

void ecs_ts_client_config(ecs_client_config_t *cfg, const char *servers, const char *transport) {
  ecs_client_config_init(cfg);
  cfg->servers = servers;
  cfg->ns = "test";
  cfg->transport = transport;
  cfg->timeout_ms = 5000;
}

ecs_client_t *ecs_ts_connect(const ecs_client_config_t *cfg) {
  ecs_client_t *c = NULL;
  char err[256];
  int rc = ecs_client_connect(cfg, &c, err, sizeof err);
  if (rc)
    fprintf(stderr, "connect(%s): %s: %s\n", cfg->transport ? cfg->transport : "auto", ecs_strerror(rc), err);
  return c;
}

ecs_client_t *ecs_ts_client(const char *servers, const char *redis_url, const char *token, int timeout_ms) {
  ecs_client_config_t cfg;
  ecs_ts_client_config(&cfg, servers, ecs_ts_transport());
  cfg.redis_url = redis_url;
  cfg.auth_token = token;
  cfg.timeout_ms = timeout_ms;
  cfg.connect_timeout_ms = timeout_ms < 2000 ? timeout_ms : 2000;
  return ecs_ts_connect(&cfg);
}

redisContext *ecs_ts_redis_at(int port) {
  struct timeval tv = {2, 0};
  redisContext *r = redisConnectWithTimeout("127.0.0.1", port, tv);
  if (r && r->err) {
    fprintf(stderr, "redis at %d: %s\n", port, r->errstr);
    redisFree(r);
    r = NULL;
  }
  return r;
}

long long ecs_ts_redis_exists(redisContext *r, const char *key) {
  redisReply *rep = redisCommand(r, "EXISTS ecs:{test}:obj:%s", key);
  if (!rep)
    return -1;
  long long v = rep->type == REDIS_REPLY_INTEGER ? rep->integer : -1;
  freeReplyObject(rep);
  return v;
}

int ecs_ts_put1(ecs_client_t *c, const char *key, const void *data, uint64_t n, int dtype) {
  ecs_key_t k = {key, strlen(key)};
  ecs_tensor_t t = {.data = data, .nbytes = n};
  t.desc.dtype = (uint8_t)dtype;
  t.desc.ndim = 1;
  t.desc.shape[0] = n / ecs_dtype_size(dtype);
  int st = -999;
  int rc = ecs_put_batch(c, &k, &t, 1, &st);
  return rc ? rc : st;
}

int ecs_ts_get1(ecs_client_t *c, const char *key, void *buf, uint64_t cap, uint64_t *nbytes) {
  ecs_key_t k = {key, strlen(key)};
  ecs_get_buf_t b = {.data = buf, .capacity = cap};
  int rc = ecs_get_batch(c, &k, &b, 1);
  if (nbytes)
    *nbytes = b.nbytes;
  return rc ? rc : b.status;
}
