/*
 * The integration tests' fixture: a redis-server and an ecstore-server,
 * started together on free ports and stopped together, and clients of
 * them.  Every test file that needs "a Redis, a server, a client" uses
 * this instead of its own copy of that setup.  No cmocka here (the
 * benchmarks link it too): functions return a status and tests assert.
 */
#ifndef ECS_TS_FIXTURE_H
#define ECS_TS_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "ecstore/ecstore.h"
#include "support/ts.h"

typedef struct ecs_ts_env {
  ecs_ts_proc_t redis;  /* redis-server */
  ecs_ts_proc_t server; /* ecstore-server */
  char servers[64];     /* "127.0.0.1:PORT" of the server */
  char redis_url[64];   /* "127.0.0.1:PORT" of Redis */
  char shm_path[128];   /* the server's Unix socket (in its temp directory) */
  ecs_client_t *c;      /* ecs_ts_env_open: a client without Redis (exists asks the server) */
  ecs_client_t *cr;     /* ecs_ts_env_open: a client with Redis (exists asks Redis) */
} ecs_ts_env_t;

/* Starts Redis, then an ecstore-server against it with the extra
 * arguments (NULL-terminated; NULL for none).  0, or -1 with whatever had
 * started stopped again. */
int ecs_ts_env_start(ecs_ts_env_t *e, const char *const extra[]);

/* Stops the server and Redis (either may already be gone).  Returns the
 * server's exit status, so that a crash or a sanitizer report inside the
 * server fails the test (0 when it was not running any more). */
int ecs_ts_env_stop(ecs_ts_env_t *e);

/* ecs_ts_env_start, then connects e->c and e->cr over the transport under
 * test with a deadline of timeout_ms, and checks that they took it (the
 * path under test is the path taken).  0, or -1 with everything closed. */
int ecs_ts_env_open(ecs_ts_env_t *e, const char *const extra[], int timeout_ms);

/* Closes e->c and e->cr, then ecs_ts_env_stop. */
int ecs_ts_env_close(ecs_ts_env_t *e);

/* A cmocka group's setup and teardown over one env (*state): a file's
 * setup is `return ecs_ts_group_open(state, extra, timeout_ms);`.  The
 * teardown fails the group when the server did not exit cleanly. */
int ecs_ts_group_open(void **state, const char *const extra[], int timeout_ms);
int ecs_ts_group_close(void **state);
/* The group setup most store tests share: one server with debug ops
 * (corruption on demand), clients over the transport under test. */
int ecs_ts_group_open_debug(void **state);

/* Server 0's counters.  STAT failing means the server is gone and the
 * test cannot go on: it says so and aborts the test binary. */
ecs_server_stat_t ecs_ts_stat0(ecs_client_t *c);

/* The transport under test: ECS_TEST_TRANSPORT (tcp when unset); ctest
 * runs such a binary once per transport. */
const char *ecs_ts_transport(void);

/* A client configuration for the tests: servers, namespace "test", the
 * given transport, a 5 s deadline.  Callers change what they test. */
void ecs_ts_client_config(ecs_client_config_t *cfg, const char *servers, const char *transport);

/* Connects with cfg; on failure prints why and returns NULL. */
ecs_client_t *ecs_ts_connect(const ecs_client_config_t *cfg);

/* A client over the transport under test, with Redis (redis_url) or
 * without (NULL), an auth token or none (NULL), and a deadline of
 * timeout_ms (the connect timeout at most 2 s).  NULL on failure. */
ecs_client_t *ecs_ts_client(const char *servers, const char *redis_url, const char *token, int timeout_ms);

/* A hiredis connection to the test Redis on port, or NULL. */
struct redisContext *ecs_ts_redis_at(int port);

/* Whether Redis holds the object record of key in namespace "test": 1, 0,
 * or -1 on an error. */
long long ecs_ts_redis_exists(struct redisContext *r, const char *key);

/* One-item put of n bytes as a 1-d tensor of dtype; the item's status (or
 * the call's error). */
int ecs_ts_put1(ecs_client_t *c, const char *key, const void *data, uint64_t n, int dtype);

/* One-item get into buf (cap bytes); *nbytes (may be NULL) gets the size.
 * The item's status (or the call's error). */
int ecs_ts_get1(ecs_client_t *c, const char *key, void *buf, uint64_t cap, uint64_t *nbytes);

#endif
