/*
 * "An error is never 'exists'" across a partial failure: a batch large
 * enough to go to Redis in several pipelined chunks, where Redis answers
 * the first chunk (every key there: 1) and then fails, by an error reply
 * or by closing the connection.  No layer a scheduler may call may then
 * report a key as 1 from Redis's partial answer: the metadata layer
 * (store/redis/meta_records.c) and the connector's redis backend fail the call with
 * every key 0; the client (ecs_exists_batch) and the connector's ecstore
 * backend either do the same or, since Redis holds metadata only, ask the
 * data servers instead, whose answer is the truth (only STORED is there).
 *
 * Redis here is tests/support/fakeredis.c, a RESP peer that fails after N
 * data replies: a real redis-server cannot be made to fail at an exact
 * reply.  A control run with enough budget shows that the same peer
 * answers every key 1 when it does not fail, so the zeros are the error
 * handling's doing.  The data servers are real (the client and the
 * connector connect to them first).
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ecstore/ec_connector.h"
#include "ecstore/ecstore.h"
#include "store/redis/meta.h"
#include "support/fakeredis.h"
#include "support/fixture.h"
#include "support/ts.h"

#define NKEYS 2500  /* three chunks of META_CHUNK (1000) keys */
#define STORED 2400 /* the one key the data server really holds (third chunk) */

typedef struct env {
  ecs_ts_env_t env; /* a real Redis and server for the data path */
  char *servers;    /* env.servers */
  char names[NKEYS][16];
} env_t;

static int teardown_env(env_t *e) {
  int st = ecs_ts_env_stop(&e->env);
  free(e);
  return st == 0 ? 0 : -1;
}

static int setup(void **state) {
  env_t *e = calloc(1, sizeof *e);
  if (!e || ecs_ts_env_start(&e->env, NULL)) {
    free(e);
    return -1;
  }
  e->servers = e->env.servers;
  for (int i = 0; i < NKEYS; i++)
    snprintf(e->names[i], sizeof e->names[i], "key-%d", i);
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.servers = e->servers;
  cfg.ns = "test";
  ecs_client_t *c = NULL;
  static const uint8_t byte = 42;
  ecs_tensor_t t = {.data = &byte, .nbytes = 1, .desc = {.dtype = ECS_DTYPE_U8, .ndim = 1, .shape = {1}}};
  ecs_key_t k = {e->names[STORED], strlen(e->names[STORED])};
  int st = -1;
  if (ecs_client_connect(&cfg, &c, NULL, 0) != ECS_OK || ecs_put_batch(c, &k, &t, 1, &st) != ECS_OK || st) {
    ecs_client_close(c);
    teardown_env(e);
    return -1;
  }
  ecs_client_close(c);
  *state = e;
  return 0;
}

static int teardown(void **state) {
  return teardown_env(*state);
}

/* The failures under test, and a control that does not fail. */
typedef struct fault {
  int budget; /* data replies per connection before failing */
  int mode;   /* ECS_TS_FAKE_ERROR or ECS_TS_FAKE_CLOSE */
} fault_t;

static const fault_t faults[] = {
    {1, ECS_TS_FAKE_ERROR}, /* chunk 1 answered, chunk 2 an error reply */
    {2, ECS_TS_FAKE_ERROR}, /* chunks 1-2 answered, chunk 3 an error reply */
    {1, ECS_TS_FAKE_CLOSE}, /* chunk 1 answered, then the link drops */
};

static ecs_ts_fakeredis_t *fake_start(int budget, int mode) {
  ecs_ts_fakeredis_t *f = NULL;
  assert_int_equal(ecs_ts_fakeredis_start(budget, mode, &f), ECS_OK);
  return f;
}

/* Every exists[i] is 0, and the peer did answer part of the batch first. */
static void assert_all_zero(const int *ex, size_t n, const ecs_ts_fakeredis_t *f) {
  assert_true(ecs_ts_fakeredis_answered(f) >= 1);
  assert_true(ecs_ts_fakeredis_failed(f) >= 1);
  for (size_t i = 0; i < n; i++)
    if (ex[i] != 0)
      fail_msg("exists[%zu] = %d alongside an error", i, ex[i]);
}

/* After the partial failure: an error with every key 0, or the data
 * servers' answer (only STORED), never a 1 from Redis's partial reply. */
static void assert_no_stale(int rc, const int *ex, const ecs_ts_fakeredis_t *f) {
  if (rc != ECS_OK) {
    assert_all_zero(ex, NKEYS, f);
    return;
  }
  assert_true(ecs_ts_fakeredis_failed(f) >= 1);
  for (size_t i = 0; i < NKEYS; i++)
    if (ex[i] != (i == STORED))
      fail_msg("exists[%zu] = %d after Redis failed (the server holds only key %d)", i, ex[i], STORED);
}

static void assert_all_one(const int *ex, size_t n) {
  for (size_t i = 0; i < n; i++)
    assert_int_equal(ex[i], 1);
}

/* ------------------------------------------------------------------ */

static int meta_exists(const env_t *e, ecs_ts_fakeredis_t *f, int *ex) {
  char url[64];
  snprintf(url, sizeof url, "127.0.0.1:%d", ecs_ts_fakeredis_port(f));
  ecs_meta_opts_t o;
  ecs_meta_opts_init(&o);
  o.redis_url = url;
  o.ns = "test";
  o.timeout_ms = 3000;
  ecs_meta_t *m = NULL;
  assert_int_equal(ecs_meta_open(&o, &m), ECS_OK);
  static const uint8_t *keys[NKEYS];
  static uint16_t lens[NKEYS];
  for (int i = 0; i < NKEYS; i++) {
    keys[i] = (const uint8_t *)e->names[i];
    lens[i] = (uint16_t)strlen(e->names[i]);
  }
  for (int i = 0; i < NKEYS; i++)
    ex[i] = 7; /* not 0 or 1: the call must write every one */
  int rc = ecs_meta_exists_batch(m, keys, lens, NKEYS, ex);
  ecs_meta_close(m);
  return rc;
}

static void test_meta_layer(void **state) {
  env_t *e = *state;
  static int ex[NKEYS];
  ecs_ts_fakeredis_t *f = fake_start(3, ECS_TS_FAKE_ERROR); /* control */
  assert_int_equal(meta_exists(e, f, ex), ECS_OK);
  assert_all_one(ex, NKEYS);
  ecs_ts_fakeredis_stop(f);
  for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
    f = fake_start(faults[i].budget, faults[i].mode);
    assert_int_not_equal(meta_exists(e, f, ex), ECS_OK);
    assert_all_zero(ex, NKEYS, f);
    ecs_ts_fakeredis_stop(f);
  }
}

static int client_exists(const env_t *e, ecs_ts_fakeredis_t *f, int *ex) {
  char url[64];
  snprintf(url, sizeof url, "127.0.0.1:%d", ecs_ts_fakeredis_port(f));
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.servers = e->servers;
  cfg.redis_url = url;
  cfg.ns = "test";
  cfg.transport = "tcp";
  cfg.timeout_ms = 3000;
  ecs_client_t *c = NULL;
  assert_int_equal(ecs_client_connect(&cfg, &c, NULL, 0), ECS_OK);
  static ecs_key_t keys[NKEYS];
  for (int i = 0; i < NKEYS; i++)
    keys[i] = (ecs_key_t){e->names[i], strlen(e->names[i])};
  for (int i = 0; i < NKEYS; i++)
    ex[i] = 7;
  int rc = ecs_exists_batch(c, keys, NKEYS, ex);
  if (rc != ECS_OK)
    assert_true(ecs_client_errmsg(c)[0] != '\0'); /* says why */
  ecs_client_close(c);
  return rc;
}

static void test_client(void **state) {
  env_t *e = *state;
  static int ex[NKEYS];
  ecs_ts_fakeredis_t *f = fake_start(3, ECS_TS_FAKE_ERROR);
  assert_int_equal(client_exists(e, f, ex), ECS_OK);
  assert_all_one(ex, NKEYS);
  ecs_ts_fakeredis_stop(f);
  for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
    f = fake_start(faults[i].budget, faults[i].mode);
    int rc = client_exists(e, f, ex);
    assert_no_stale(rc, ex, f);
    ecs_ts_fakeredis_stop(f);
  }
}

static int connector_has(const env_t *e, int backend, ecs_ts_fakeredis_t *f, int *ex) {
  char js[512], err[512] = "";
  snprintf(js, sizeof js,
           "{\"backend\": \"%s\", \"servers\": \"%s\", \"redis_url\": \"redis://127.0.0.1:%d\","
           " \"namespace\": \"test\", \"timeout_ms\": 3000, \"connect_timeout_ms\": 1000,"
           " \"staging_bytes\": \"1M\", \"protocol\": \"tcp\"}",
           ecs_ec_backend_name(backend), e->servers, ecs_ts_fakeredis_port(f));
  ecs_ec_conn_t *c = NULL;
  int rc = ecs_ec_open_json(js, &c, err, sizeof err);
  if (rc != ECS_OK)
    fail_msg("open %s: %s: %s", ecs_ec_backend_name(backend), ecs_strerror(rc), err);
  static const char *hashes[NKEYS];
  for (int i = 0; i < NKEYS; i++)
    hashes[i] = e->names[i];
  for (int i = 0; i < NKEYS; i++)
    ex[i] = 7;
  rc = ecs_ec_has(c, hashes, NKEYS, ex);
  ecs_ec_close(c);
  return rc;
}

/* The ecstore backend asks Redis in chunks of keys; the redis backend
 * pipelines one EXISTS per key (its budget is counted in keys). */
static void test_connector_has(void **state) {
  env_t *e = *state;
  static int ex[NKEYS];
  const int backends[] = {ECS_EC_BACKEND_ECSTORE, ECS_EC_BACKEND_REDIS};
  for (size_t b = 0; b < 2; b++) {
    int unit = backends[b] == ECS_EC_BACKEND_REDIS ? 1000 : 1; /* data replies per chunk */
    ecs_ts_fakeredis_t *f = fake_start(3 * unit, ECS_TS_FAKE_ERROR);
    assert_int_equal(connector_has(e, backends[b], f, ex), ECS_OK);
    assert_all_one(ex, NKEYS);
    ecs_ts_fakeredis_stop(f);
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
      f = fake_start(faults[i].budget * unit, faults[i].mode);
      int rc = connector_has(e, backends[b], f, ex);
      if (backends[b] == ECS_EC_BACKEND_REDIS) { /* the objects live in Redis: no one else to ask */
        assert_int_not_equal(rc, ECS_OK);
        assert_all_zero(ex, NKEYS, f);
      } else {
        assert_no_stale(rc, ex, f);
      }
      ecs_ts_fakeredis_stop(f);
    }
  }
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_meta_layer),
      cmocka_unit_test(test_client),
      cmocka_unit_test(test_connector_has),
  };
  return cmocka_run_group_tests_name("exists_partial", tests, setup, teardown);
}
