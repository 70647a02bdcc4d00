/*
 * Integration tests of ecstore-server and libecstore over TCP, with a real
 * redis-server and real server processes on free ports in temp dirs.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "ecstore/ecstore.h"
#include "store/client_internal.h"
#include "store/net.h"
#include "store/proto.h"
#include "support/ts.h"

#define MIB (1024u * 1024u)

typedef struct env {
  ecs_ts_proc_t redis;
  ecs_ts_proc_t server;
  ecs_client_t *c;  /* no Redis: exists goes to the server */
  ecs_client_t *cr; /* with Redis */
  char servers[64];
  char redis_url[64];
} env_t;

/* ------------------------------------------------------------------ */
/* helpers                                                              */

static void fill(void *p, size_t n, uint32_t seed) {
  uint8_t *b = p;
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b[i] = (uint8_t)x;
  }
}

/* The transport under test: ECS_TEST_TRANSPORT=tcp (default) or shm; ctest
 * runs this binary once for each. */
static const char *transport(void) {
  const char *t = getenv("ECS_TEST_TRANSPORT");
  return t && *t ? t : "tcp";
}

static ecs_client_t *connect_to(const char *servers, const char *redis_url, const char *token,
                                int timeout_ms) {
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.transport = transport();
  cfg.servers = servers;
  cfg.redis_url = redis_url;
  cfg.ns = "test";
  cfg.auth_token = token;
  cfg.timeout_ms = timeout_ms;
  cfg.connect_timeout_ms = timeout_ms < 2000 ? timeout_ms : 2000;
  ecs_client_t *c = NULL;
  char err[256];
  int rc = ecs_client_connect(&cfg, &c, err, sizeof err);
  if (rc)
    fprintf(stderr, "connect: %s: %s\n", ecs_strerror(rc), err);
  return c;
}

static int start_env(env_t *e, const char *const extra[]) {
  memset(e, 0, sizeof *e);
  if (ecs_ts_redis_start(&e->redis))
    return -1;
  if (ecs_ts_server_start(&e->server, e->redis.port, extra))
    return -1;
  snprintf(e->servers, sizeof e->servers, "127.0.0.1:%d", e->server.port);
  snprintf(e->redis_url, sizeof e->redis_url, "127.0.0.1:%d", e->redis.port);
  e->c = connect_to(e->servers, NULL, NULL, 5000);
  e->cr = connect_to(e->servers, e->redis_url, NULL, 5000);
  if (!e->c || !e->cr)
    return -1;
  /* the path under test is the path taken */
  if (strcmp(ecs_client_transport(e->c), transport()) != 0) {
    fprintf(stderr, "client took %s, not %s\n", ecs_client_transport(e->c), transport());
    return -1;
  }
  return 0;
}

/* Stops everything; returns the server's exit status, so that a crash or a
 * sanitizer report inside the server fails the test (0 when it was not
 * running any more). */
static int stop_env(env_t *e) {
  ecs_client_close(e->c);
  ecs_client_close(e->cr);
  e->c = e->cr = NULL;
  int st = 0;
  if (e->server.pid)
    st = ecs_ts_stop(&e->server, 5000);
  if (e->redis.pid)
    ecs_ts_stop(&e->redis, 5000);
  return st;
}

static int group_setup(void **state) {
  env_t *e = calloc(1, sizeof *e);
  static const char *const extra[] = {"--enable-debug-ops", NULL};
  if (!e || start_env(e, extra)) {
    if (e)
      stop_env(e);
    free(e);
    return -1;
  }
  *state = e;
  return 0;
}

static int group_teardown(void **state) {
  env_t *e = *state;
  if (!e) /* setup failed and cleaned up after itself */
    return -1;
  int st = stop_env(e);
  free(e);
  if (st != 0)
    fprintf(stderr, "ecstore-server exited with status %d\n", st);
  return st == 0 ? 0 : -1;
}

static int put1(ecs_client_t *c, const char *key, const void *data, uint64_t n, int dtype) {
  ecs_key_t k = {key, strlen(key)};
  ecs_tensor_t t = {.data = data, .nbytes = n};
  t.desc.dtype = (uint8_t)dtype;
  t.desc.ndim = 1;
  t.desc.shape[0] = n / ecs_dtype_size(dtype);
  int st = -999;
  int rc = ecs_put_batch(c, &k, &t, 1, &st);
  return rc ? rc : st;
}

static int get1(ecs_client_t *c, const char *key, void *buf, uint64_t cap, uint64_t *nbytes) {
  ecs_key_t k = {key, strlen(key)};
  ecs_get_buf_t b = {.data = buf, .capacity = cap};
  int rc = ecs_get_batch(c, &k, &b, 1);
  if (nbytes)
    *nbytes = b.nbytes;
  return rc ? rc : b.status;
}

static redisContext *redis_at(int port) {
  struct timeval tv = {2, 0};
  redisContext *r = redisConnectWithTimeout("127.0.0.1", port, tv);
  assert_non_null(r);
  assert_int_equal(r->err, 0);
  return r;
}

static long long redis_exists(redisContext *r, const char *key) {
  redisReply *rep = redisCommand(r, "EXISTS ecs:test:obj:%s", key);
  assert_non_null(rep);
  long long v = rep->type == REDIS_REPLY_INTEGER ? rep->integer : -1;
  freeReplyObject(rep);
  return v;
}

static ecs_server_stat_t stat0(ecs_client_t *c) {
  ecs_server_stat_t st;
  assert_int_equal(ecs_stat(c, 0, &st), ECS_OK);
  return st;
}

/* ------------------------------------------------------------------ */
/* round trips                                                          */

static void test_every_dtype(void **state) {
  env_t *e = *state;
  for (int dt = ECS_DTYPE_F32; dt < ECS_DTYPE__COUNT; dt++) {
    char key[64];
    snprintf(key, sizeof key, "dtype-%s", ecs_dtype_name(dt));
    size_t es = ecs_dtype_size(dt);
    ecs_tensor_t t;
    memset(&t, 0, sizeof t);
    t.desc.dtype = (uint8_t)dt;
    t.desc.ndim = 3;
    t.desc.shape[0] = 3;
    t.desc.shape[1] = 17;
    t.desc.shape[2] = 129;
    t.nbytes = 3 * 17 * 129 * es;
    void *src = malloc(t.nbytes);
    fill(src, t.nbytes, (uint32_t)dt);
    t.data = src;
    ecs_key_t k = {key, strlen(key)};
    int st;
    assert_int_equal(ecs_put_batch(e->c, &k, &t, 1, &st), ECS_OK);
    assert_int_equal(st, ECS_OK);

    ecs_get_buf_t b = {.data = malloc(t.nbytes), .capacity = t.nbytes};
    assert_int_equal(ecs_get_batch(e->c, &k, &b, 1), ECS_OK);
    assert_int_equal(b.status, ECS_OK);
    assert_int_equal(b.nbytes, t.nbytes);
    assert_int_equal(b.desc.dtype, dt);
    assert_int_equal(b.desc.ndim, 3);
    assert_int_equal(b.desc.shape[1], 17);
    assert_memory_equal(b.data, src, t.nbytes);
    free(b.data);

    ecs_get_buf_t a;
    memset(&a, 0, sizeof a);
    assert_int_equal(ecs_get_batch_alloc(e->c, &k, &a, 1), ECS_OK);
    assert_int_equal(a.status, ECS_OK);
    assert_memory_equal(a.data, src, t.nbytes);
    assert_int_equal(a.desc.shape[2], 129);
    ecs_free(a.data);
    free(src);
  }
}

static void test_empty_and_scalar(void **state) {
  env_t *e = *state;
  ecs_tensor_t t[2];
  memset(t, 0, sizeof t);
  t[0].desc.dtype = ECS_DTYPE_BF16; /* shape (0, 2048): no bytes */
  t[0].desc.ndim = 2;
  t[0].desc.shape[1] = 2048;
  float one = 1.0f;
  t[1].desc.dtype = ECS_DTYPE_F32; /* a scalar */
  t[1].data = &one;
  t[1].nbytes = 4;
  ecs_key_t k[2] = {{"empty", 5}, {"scalar", 6}};
  int st[2];
  assert_int_equal(ecs_put_batch(e->c, k, t, 2, st), ECS_OK);
  assert_int_equal(st[0], ECS_OK);
  assert_int_equal(st[1], ECS_OK);
  float out = 0;
  ecs_get_buf_t b[2] = {{.data = NULL, .capacity = 0}, {.data = &out, .capacity = 4}};
  assert_int_equal(ecs_get_batch(e->c, k, b, 2), ECS_OK);
  assert_int_equal(b[0].status, ECS_OK);
  assert_int_equal(b[0].nbytes, 0);
  assert_int_equal(b[0].desc.shape[1], 2048);
  assert_int_equal(b[1].status, ECS_OK);
  assert_true(out == 1.0f);
}

static void test_batch_hits_misses_and_bad_items(void **state) {
  env_t *e = *state;
  enum { N = 40 };
  static uint8_t data[N][4096];
  char names[N][32];
  ecs_key_t keys[N];
  ecs_tensor_t ts[N];
  int st[N];
  memset(ts, 0, sizeof ts);
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "mix-%d", i);
    keys[i].data = names[i];
    keys[i].len = strlen(names[i]);
    fill(data[i], sizeof data[i], 1000 + (uint32_t)i);
    ts[i].data = data[i];
    ts[i].nbytes = sizeof data[i];
    ts[i].desc.dtype = ECS_DTYPE_U8;
    ts[i].desc.ndim = 1;
    ts[i].desc.shape[0] = sizeof data[i];
  }
  /* put the even ones; item 2 has a shape that disagrees with its size */
  ecs_key_t ek[N / 2];
  ecs_tensor_t et[N / 2];
  for (int i = 0; i < N / 2; i++) {
    ek[i] = keys[2 * i];
    et[i] = ts[2 * i];
  }
  et[1].desc.shape[0] = 99;
  assert_int_equal(ecs_put_batch(e->c, ek, et, N / 2, st), ECS_OK);
  for (int i = 0; i < N / 2; i++)
    assert_int_equal(st[i], i == 1 ? ECS_EDTYPE : ECS_OK);

  /* get all: evens hit (but 2), odds miss; one buffer too small; one bad key */
  static uint8_t out[N][4096];
  ecs_get_buf_t b[N + 1];
  ecs_key_t gk[N + 1];
  for (int i = 0; i < N; i++) {
    gk[i] = keys[i];
    b[i].data = out[i];
    b[i].capacity = i == 4 ? 100 : sizeof out[i];
  }
  gk[N].data = "";
  gk[N].len = 0;
  b[N].data = NULL;
  b[N].capacity = 0;
  assert_int_equal(ecs_get_batch(e->c, gk, b, N + 1), ECS_OK);
  for (int i = 0; i < N; i++) {
    if (i == 4) {
      assert_int_equal(b[i].status, ECS_EBUFSMALL);
      assert_int_equal(b[i].nbytes, 4096); /* says the needed size */
    } else if (i % 2 == 0 && i != 2) {
      assert_int_equal(b[i].status, ECS_OK);
      assert_memory_equal(out[i], data[i], 4096);
    } else {
      assert_int_equal(b[i].status, ECS_ENOTFOUND);
    }
  }
  assert_int_equal(b[N].status, ECS_EKEY);

  int ex[N];
  assert_int_equal(ecs_exists_batch(e->c, keys, N, ex), ECS_OK);
  for (int i = 0; i < N; i++)
    assert_int_equal(ex[i], i % 2 == 0 && i != 2);
  /* and the same answer from Redis alone */
  assert_int_equal(ecs_exists_batch(e->cr, keys, N, ex), ECS_OK);
  for (int i = 0; i < N; i++)
    assert_int_equal(ex[i], i % 2 == 0 && i != 2);
}

static void test_idempotent_and_conflicting_put(void **state) {
  env_t *e = *state;
  uint8_t a[8192], b[8192];
  fill(a, sizeof a, 7);
  fill(b, sizeof b, 8);
  assert_int_equal(put1(e->c, "immutable", a, sizeof a, ECS_DTYPE_U8), ECS_OK);
  assert_int_equal(put1(e->c, "immutable", a, sizeof a, ECS_DTYPE_U8), ECS_OK); /* a retry */
  assert_int_equal(put1(e->c, "immutable", b, sizeof b, ECS_DTYPE_U8), ECS_ECONFLICT);
  assert_int_equal(put1(e->c, "immutable", a, sizeof a, ECS_DTYPE_I8), ECS_ECONFLICT); /* other dtype */
  uint8_t out[8192];
  assert_int_equal(get1(e->c, "immutable", out, sizeof out, NULL), ECS_OK);
  assert_memory_equal(out, a, sizeof a);

  /* the same key twice in one batch: identical content is fine */
  ecs_key_t k[2] = {{"twice", 5}, {"twice", 5}};
  ecs_tensor_t t[2];
  memset(t, 0, sizeof t);
  for (int i = 0; i < 2; i++) {
    t[i].data = a;
    t[i].nbytes = sizeof a;
    t[i].desc.dtype = ECS_DTYPE_U8;
    t[i].desc.ndim = 1;
    t[i].desc.shape[0] = sizeof a;
  }
  int st[2];
  assert_int_equal(ecs_put_batch(e->c, k, t, 2, st), ECS_OK);
  assert_int_equal(st[0], ECS_OK);
  assert_int_equal(st[1], ECS_OK);
}

static int upsert1(ecs_client_t *c, const char *key, const void *data, uint64_t n) {
  ecs_key_t k = {key, strlen(key)};
  ecs_tensor_t t = {.data = data, .nbytes = n};
  t.desc.dtype = ECS_DTYPE_U8;
  t.desc.ndim = 1;
  t.desc.shape[0] = n;
  int st = -999;
  int rc = ecs_upsert_batch(c, &k, &t, 1, &st);
  return rc ? rc : st;
}

static long long redis_len(redisContext *r, const char *key) {
  redisReply *rep = redisCommand(r, "HGET ecs:test:obj:%s len", key);
  assert_non_null(rep);
  long long v = rep->type == REDIS_REPLY_STRING ? atoll(rep->str) : -1;
  freeReplyObject(rep);
  return v;
}

/* Upsert replaces a key's bytes; a plain put still refuses to.  A zero-copy
 * view (shm lease) taken on the old version keeps reading the old bytes
 * while the upsert replaces them, and the Redis record follows. */
static void test_upsert_replaces_under_a_lease(void **state) {
  env_t *e = *state;
  static uint8_t a[8192], b[3 * 8192], out[3 * 8192];
  fill(a, sizeof a, 31);
  fill(b, sizeof b, 32);
  redisContext *r = redis_at(e->redis.port);
  assert_int_equal(upsert1(e->c, "ver", a, sizeof a), ECS_OK); /* an insert */
  assert_int_equal(redis_len(r, "ver"), (long long)sizeof a);

  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.transport = "shm";
  cfg.servers = e->servers;
  cfg.ns = "test";
  ecs_client_t *cv = NULL;
  char err[256];
  assert_int_equal(ecs_client_connect(&cfg, &cv, err, sizeof err), ECS_OK);
  ecs_key_t k = {"ver", 3};
  ecs_view_t v;
  memset(&v, 0, sizeof v);
  assert_int_equal(ecs_get_view_batch(cv, &k, &v, 1), ECS_OK);
  assert_int_equal(v.status, ECS_OK);
  assert_int_equal(v.nbytes, sizeof a);

  assert_int_equal(put1(e->c, "ver", b, sizeof b, ECS_DTYPE_U8), ECS_ECONFLICT);
  assert_int_equal(upsert1(e->c, "ver", b, sizeof b), ECS_OK);
  uint64_t got = 0;
  assert_int_equal(get1(e->c, "ver", out, sizeof out, &got), ECS_OK);
  assert_int_equal(got, sizeof b);
  assert_memory_equal(out, b, sizeof b);
  assert_int_equal(redis_len(r, "ver"), (long long)sizeof b);
  int ex = 0;
  assert_int_equal(ecs_exists_batch(e->cr, &k, 1, &ex), ECS_OK);
  assert_int_equal(ex, 1);
  /* The leased old version is intact under its reader. */
  assert_memory_equal(v.data, a, sizeof a);
  assert_int_equal(ecs_view_release(cv, &v, 1), ECS_OK);

  /* Idempotent with the same content; back to the first version; a plain
   * put of the current content is still fine. */
  assert_int_equal(upsert1(e->c, "ver", b, sizeof b), ECS_OK);
  assert_int_equal(upsert1(cv, "ver", a, sizeof a), ECS_OK); /* over the shm path (RESERVE/COMMIT) */
  assert_int_equal(get1(e->c, "ver", out, sizeof out, &got), ECS_OK);
  assert_int_equal(got, sizeof a);
  assert_memory_equal(out, a, sizeof a);
  assert_int_equal(put1(e->c, "ver", a, sizeof a, ECS_DTYPE_U8), ECS_OK);
  assert_int_equal(redis_len(r, "ver"), (long long)sizeof a);
  ecs_client_close(cv);
  redisFree(r);
}

typedef struct flip_arg {
  const char *servers;
  const uint8_t *a, *b; /* the two versions */
  size_t n;             /* bytes of each */
  atomic_int stop;      /* set by the test */
  int ok, bad;          /* gets that saw one whole version / anything else */
} flip_arg_t;

static void *flip_reader(void *p) {
  flip_arg_t *fa = p;
  ecs_client_t *c = connect_to(fa->servers, NULL, NULL, 5000);
  uint8_t *buf = malloc(fa->n);
  if (!c || !buf) {
    fa->bad++;
    free(buf);
    ecs_client_close(c);
    return NULL;
  }
  while (!atomic_load(&fa->stop)) {
    uint64_t got = 0;
    int st = get1(c, "flip", buf, fa->n, &got);
    if (st == ECS_OK && got == fa->n && (memcmp(buf, fa->a, fa->n) == 0 || memcmp(buf, fa->b, fa->n) == 0))
      fa->ok++;
    else
      fa->bad++; /* a miss, an error or mixed bytes */
  }
  free(buf);
  ecs_client_close(c);
  return NULL;
}

/* Readers never see a miss or a mix while upserts flip a key between two
 * versions: the new version becomes visible in one step. */
static void test_upsert_atomic_for_readers(void **state) {
  env_t *e = *state;
  size_t n = 256 * 1024;
  uint8_t *a = malloc(n), *b = malloc(n);
  assert_non_null(a);
  assert_non_null(b);
  fill(a, n, 41);
  fill(b, n, 42);
  assert_int_equal(upsert1(e->c, "flip", a, n), ECS_OK);
  flip_arg_t fa = {.servers = e->servers, .a = a, .b = b, .n = n};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, flip_reader, &fa), 0);
  for (int i = 0; i < 200; i++)
    assert_int_equal(upsert1(e->c, "flip", (i & 1) ? a : b, n), ECS_OK);
  atomic_store(&fa.stop, 1);
  pthread_join(th, NULL);
  assert_int_equal(fa.bad, 0);
  assert_true(fa.ok > 0);
  ecs_server_stat_t st = stat0(e->c);
  assert_true(st.objects >= 1);
  free(a);
  free(b);
}

static void test_remove_and_redis_records(void **state) {
  env_t *e = *state;
  uint8_t a[4096];
  fill(a, sizeof a, 99);
  assert_int_equal(put1(e->c, "to-remove", a, sizeof a, ECS_DTYPE_U8), ECS_OK);
  redisContext *r = redis_at(e->redis.port);
  assert_int_equal(redis_exists(r, "to-remove"), 1);
  ecs_key_t k[2] = {{"to-remove", 9}, {"never-there", 11}};
  int st[2];
  assert_int_equal(ecs_remove_batch(e->c, k, 2, st), ECS_OK);
  assert_int_equal(st[0], ECS_OK);
  assert_int_equal(st[1], ECS_ENOTFOUND);
  assert_int_equal(redis_exists(r, "to-remove"), 0);
  int ex[2];
  assert_int_equal(ecs_exists_batch(e->cr, k, 2, ex), ECS_OK);
  assert_int_equal(ex[0], 0);
  redisFree(r);
}

static void test_checksum_mismatch_detected(void **state) {
  env_t *e = *state;
  uint8_t a[65536], out[65536];
  fill(a, sizeof a, 5);
  assert_int_equal(put1(e->c, "corrupt-me", a, sizeof a, ECS_DTYPE_U8), ECS_OK);
  assert_int_equal(ecs__client_debug_corrupt(e->c, "corrupt-me", 10), ECS_OK);
  uint64_t n = 1;
  assert_int_equal(get1(e->c, "corrupt-me", out, sizeof out, &n), ECS_ECHECKSUM);
  assert_int_equal(n, 0);
  /* with verification off, the (corrupt) bytes do arrive: the check is real */
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.servers = e->servers;
  cfg.ns = "test";
  cfg.transport = transport();
  cfg.verify_checksum = 0;
  ecs_client_t *nv;
  assert_int_equal(ecs_client_connect(&cfg, &nv, NULL, 0), ECS_OK);
  assert_int_equal(get1(nv, "corrupt-me", out, sizeof out, &n), ECS_OK);
  assert_memory_not_equal(out, a, sizeof a);
  ecs_client_close(nv);
  /* a retried put of the same content heals the corrupt object */
  assert_int_equal(put1(e->c, "corrupt-me", a, sizeof a, ECS_DTYPE_U8), ECS_OK);
  assert_int_equal(get1(e->c, "corrupt-me", out, sizeof out, &n), ECS_OK);
  assert_memory_equal(out, a, sizeof a);
}

/* Objects larger than the client's hashing slice (store/checksum.h) are
 * verified piece by piece as they land: a corrupt byte in the middle of
 * one fails that item alone, its neighbours in the batch arrive, and a
 * clean object of several slices (first, middle and last pieces) passes.
 * Into caller buffers, then with the allocating variant. */
static void test_checksum_mismatch_large_batch(void **state) {
  env_t *e = *state;
  enum { N = 5 };
  const size_t sz[N] = {300001, 1100001, 70000, 900001, 0};
  const char *names[N] = {"big-ok-1", "big-corrupt", "big-ok-2", "big-ok-3slices", "big-empty"};
  uint8_t *in[N], *out[N];
  ecs_key_t k[N];
  ecs_get_buf_t b[N];
  for (int i = 0; i < N; i++) {
    in[i] = malloc(sz[i] + 1);
    out[i] = malloc(sz[i] + 1);
    assert_non_null(in[i]);
    assert_non_null(out[i]);
    fill(in[i], sz[i], 40 + (uint32_t)i);
    assert_int_equal(put1(e->c, names[i], in[i], sz[i], ECS_DTYPE_U8), ECS_OK);
    k[i] = (ecs_key_t){names[i], strlen(names[i])};
  }
  assert_int_equal(ecs__client_debug_corrupt(e->c, names[1], strlen(names[1])), ECS_OK);
  for (int round = 0; round < 3; round++) { /* the connection stays usable */
    int alloc = round == 2;
    for (int i = 0; i < N; i++)
      b[i] = (ecs_get_buf_t){.data = alloc ? NULL : out[i], .capacity = sz[i]};
    assert_int_equal(alloc ? ecs_get_batch_alloc(e->c, k, b, N) : ecs_get_batch(e->c, k, b, N), ECS_OK);
    assert_int_equal(b[1].status, ECS_ECHECKSUM);
    assert_int_equal(b[1].nbytes, 0);
    for (int i = 0; i < N; i++) {
      if (i == 1)
        continue;
      assert_int_equal(b[i].status, ECS_OK);
      assert_int_equal(b[i].nbytes, sz[i]);
      if (sz[i])
        assert_memory_equal(b[i].data, in[i], sz[i]);
    }
    if (alloc) {
      assert_null(b[1].data);
      for (int i = 0; i < N; i++)
        ecs_free(b[i].data);
    }
  }
  for (int i = 0; i < N; i++) {
    free(in[i]);
    free(out[i]);
  }
}

/* Normal-like bf16 values (Box-Muller), as encoder outputs have. */
static void fill_bf16_normal(uint16_t *p, size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    double u1 = ((x >> 8) + 1.0) / 16777217.0;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    double u2 = (x >> 8) / 16777216.0;
    float f = (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    uint32_t bits;
    memcpy(&bits, &f, 4);
    p[i] = (uint16_t)(bits >> 16);
  }
}

static void test_compressed_objects(void **state) {
  env_t *e = *state;
  static const char *codecs[] = {"lz4", "zstd", "auto"};
  enum { TOK = 256, HID = 512 };
  size_t n = (size_t)TOK * HID * 2;
  uint16_t *emb = malloc(n);
  uint8_t *rnd = malloc(n), *out = malloc(n);
  fill_bf16_normal(emb, (size_t)TOK * HID, 42);
  fill(rnd, n, 43);
  for (size_t ci = 0; ci < 3; ci++) {
    ecs_client_config_t cfg;
    ecs_client_config_init(&cfg);
    cfg.servers = e->servers;
    cfg.ns = "test";
    cfg.transport = "tcp"; /* compression applies to TCP puts */
    cfg.compression = codecs[ci];
    ecs_client_t *z;
    assert_int_equal(ecs_client_connect(&cfg, &z, NULL, 0), ECS_OK);
    ecs_server_stat_t before = stat0(e->c);
    char k1[32], k2[32];
    snprintf(k1, sizeof k1, "z-emb-%s", codecs[ci]);
    snprintf(k2, sizeof k2, "z-rnd-%s", codecs[ci]);
    ecs_key_t keys[2] = {{k1, strlen(k1)}, {k2, strlen(k2)}};
    ecs_tensor_t t[2];
    memset(t, 0, sizeof t);
    t[0].data = emb;
    t[0].nbytes = n;
    t[0].desc.dtype = ECS_DTYPE_BF16;
    t[0].desc.ndim = 2;
    t[0].desc.shape[0] = TOK;
    t[0].desc.shape[1] = HID;
    t[1] = t[0];
    t[1].data = rnd;
    int st[2];
    assert_int_equal(ecs_put_batch(z, keys, t, 2, st), ECS_OK);
    assert_int_equal(st[0], ECS_OK);
    assert_int_equal(st[1], ECS_OK);
    assert_int_equal(ecs_put_batch(z, keys, t, 2, st), ECS_OK); /* idempotent when compressed */
    assert_int_equal(st[0], ECS_OK);
    ecs_server_stat_t after = stat0(e->c);
    /* the embedding took less pool than its raw size (zstd/auto; lz4 barely helps bf16) */
    if (ci != 0)
      assert_true(after.bytes_in_use - before.bytes_in_use < 2 * n - n / 8);
    /* read back through the transport under test: always the raw tensor */
    for (int i = 0; i < 2; i++) {
      ecs_get_buf_t b = {.data = out, .capacity = n};
      assert_int_equal(ecs_get_batch(e->c, &keys[i], &b, 1), ECS_OK);
      assert_int_equal(b.status, ECS_OK);
      assert_int_equal(b.nbytes, n);
      assert_int_equal(b.desc.dtype, ECS_DTYPE_BF16);
      assert_int_equal(b.desc.shape[1], HID);
      assert_memory_equal(out, i == 0 ? (const void *)emb : (const void *)rnd, n);
      ecs_get_buf_t a;
      memset(&a, 0, sizeof a);
      assert_int_equal(ecs_get_batch_alloc(e->c, &keys[i], &a, 1), ECS_OK);
      assert_int_equal(a.status, ECS_OK);
      assert_int_equal(a.nbytes, n);
      assert_memory_equal(a.data, i == 0 ? (const void *)emb : (const void *)rnd, n);
      ecs_free(a.data);
      /* a buffer big enough for the compressed bytes but not the tensor */
      b.capacity = n - 1;
      assert_int_equal(ecs_get_batch(e->c, &keys[i], &b, 1), ECS_OK);
      assert_int_equal(b.status, ECS_EBUFSMALL);
      assert_int_equal(b.nbytes, n);
    }
    ecs_client_close(z);
  }
  /* a bad codec name is refused at connect, naming it */
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.servers = e->servers;
  cfg.ns = "test";
  cfg.compression = "brotli";
  ecs_client_t *bad = NULL;
  char err[200];
  assert_int_equal(ecs_client_connect(&cfg, &bad, err, sizeof err), ECS_EINVAL);
  assert_non_null(strstr(err, "brotli"));
  free(emb);
  free(rnd);
  free(out);
}

static void test_stat_and_ping(void **state) {
  env_t *e = *state;
  assert_int_equal(ecs_ping(e->c), ECS_OK);
  ecs_server_stat_t st = stat0(e->c);
  assert_int_equal(st.pool_size, 64u * MIB);
  assert_true(st.objects > 0);
  assert_int_equal(st.redis_ok, 1);
  assert_true(st.connections >= 2);
}

/* ------------------------------------------------------------------ */
/* malformed input from a raw socket                                    */

static int raw_connect(int port) {
  int fd = -1;
  assert_int_equal(ecs_net_connect("127.0.0.1", port, 2000, &fd), ECS_OK);
  return fd;
}

static void raw_send(int fd, const void *p, size_t n) {
  struct iovec iov = {(void *)p, n};
  assert_int_equal(ecs_net_writev_all(fd, &iov, 1, ecs_now_ms() + 2000), ECS_OK);
}

static void raw_hello(int fd) {
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_hello_t h = {.ns = (const uint8_t *)"test", .ns_len = 4};
  ecs_proto_hello_write(&w, &h);
  ecs_hdr_t hd = {.magic = ECS_PROTO_MAGIC,
                  .version = 1,
                  .opcode = ECS_OP_HELLO,
                  .req_id = 1,
                  .meta_len = (uint32_t)w.len};
  uint8_t hb[32];
  ecs_proto_hdr_encode(&hd, hb);
  raw_send(fd, hb, 32);
  raw_send(fd, w.p, w.len);
  ecs_wbuf_free(&w);
  uint8_t rb[32];
  assert_int_equal(ecs_net_read_all(fd, rb, 32, ecs_now_ms() + 2000), ECS_OK);
  ecs_hdr_t rh;
  assert_int_equal(ecs_proto_hdr_decode(rb, UINT64_MAX, &rh), ECS_OK);
  assert_int_equal(rh.status, ECS_OK);
  uint8_t skip[512];
  assert_true(rh.meta_len <= sizeof skip);
  assert_int_equal(ecs_net_read_all(fd, skip, rh.meta_len, ecs_now_ms() + 2000), ECS_OK);
}

/* After garbage, the server answers with an error reply and/or closes. */
static void expect_error_or_close(int fd) {
  uint8_t rb[32];
  int rc = ecs_net_read_all(fd, rb, 32, ecs_now_ms() + 3000);
  if (rc == ECS_OK) {
    /* the reply may echo a bad opcode, so read the fields by hand */
    uint32_t magic = (uint32_t)rb[0] | (uint32_t)rb[1] << 8 | (uint32_t)rb[2] << 16 | (uint32_t)rb[3] << 24;
    uint16_t flags = (uint16_t)(rb[6] | rb[7] << 8);
    int32_t status =
        (int32_t)((uint32_t)rb[12] | (uint32_t)rb[13] << 8 | (uint32_t)rb[14] << 16 | (uint32_t)rb[15] << 24);
    assert_int_equal(magic, ECS_PROTO_MAGIC);
    assert_true(status < 0);
    assert_true(flags & ECS_FLAG_REPLY);
    /* and then the connection is closed */
    uint8_t x;
    assert_int_equal(ecs_net_read_all(fd, &x, 1, ecs_now_ms() + 3000), ECS_ECONN);
  } else {
    assert_int_equal(rc, ECS_ECONN);
  }
}

static void send_hdr(int fd, uint32_t magic, uint8_t op, uint32_t count, uint32_t meta_len,
                     uint64_t data_len) {
  ecs_hdr_t hd = {.magic = magic,
                  .version = 1,
                  .opcode = op,
                  .req_id = 9,
                  .count = count,
                  .meta_len = meta_len,
                  .data_len = data_len};
  uint8_t hb[32];
  ecs_proto_hdr_encode(&hd, hb);
  raw_send(fd, hb, 32);
}

static void test_malformed_frames(void **state) {
  env_t *e = *state;
  int port = e->server.port;
  int fd;
  /* bad magic */
  fd = raw_connect(port);
  send_hdr(fd, 0xdeadbeef, ECS_OP_PING, 0, 0, 0);
  expect_error_or_close(fd);
  close(fd);
  /* a request before HELLO */
  fd = raw_connect(port);
  send_hdr(fd, ECS_PROTO_MAGIC, ECS_OP_GET, 0, 0, 0);
  expect_error_or_close(fd);
  close(fd);
  /* oversized meta_len and count, data_len beyond the limit, unknown opcode */
  struct {
    uint8_t op;
    uint32_t count, meta;
    uint64_t data;
  } bad[] = {
      {ECS_OP_GET, 1, ECS_PROTO_MAX_META + 1, 0},
      {ECS_OP_GET, ECS_PROTO_MAX_ITEMS + 1, 16, 0},
      {ECS_OP_PUT, 1, 64, UINT64_MAX / 2},
      {0x55, 0, 0, 0},
      {ECS_OP_GET, 0, 0, 1024}, /* a data section on a GET */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    fd = raw_connect(port);
    raw_hello(fd);
    send_hdr(fd, ECS_PROTO_MAGIC, bad[i].op, bad[i].count, bad[i].meta, bad[i].data);
    expect_error_or_close(fd);
    close(fd);
  }
  /* records that lie about lengths: a key length past the end */
  fd = raw_connect(port);
  raw_hello(fd);
  uint8_t rec[8] = {0xff, 0x00, 'a', 'b'}; /* key_len 255 but 2 bytes */
  send_hdr(fd, ECS_PROTO_MAGIC, ECS_OP_EXISTS, 1, 4, 0);
  raw_send(fd, rec, 4);
  expect_error_or_close(fd);
  close(fd);
  /* a PUT whose item sizes disagree with data_len */
  fd = raw_connect(port);
  raw_hello(fd);
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_put_item_t it = {.key = (const uint8_t *)"liar", .key_len = 4, .nbytes = 16, .raw_nbytes = 16};
  it.desc.dtype = ECS_DTYPE_U8;
  it.desc.ndim = 1;
  it.desc.shape[0] = 16;
  ecs_proto_put_item_write(&w, &it);
  send_hdr(fd, ECS_PROTO_MAGIC, ECS_OP_PUT, 1, (uint32_t)w.len, 32);
  raw_send(fd, w.p, w.len);
  ecs_wbuf_free(&w);
  expect_error_or_close(fd);
  close(fd);
  /* pure garbage */
  fd = raw_connect(port);
  uint8_t junk[4096];
  fill(junk, sizeof junk, 77);
  (void)!write(fd, junk, sizeof junk);
  expect_error_or_close(fd);
  close(fd);

  /* the server is still up and serving */
  assert_int_equal(ecs_ping(e->c), ECS_OK);
  uint8_t a[1000];
  fill(a, sizeof a, 3);
  assert_int_equal(put1(e->c, "after-garbage", a, sizeof a, ECS_DTYPE_U8), ECS_OK);
}

static void test_disconnect_mid_put_leaks_nothing(void **state) {
  env_t *e = *state;
  ecs_server_stat_t before = stat0(e->c);
  int fd = raw_connect(e->server.port);
  raw_hello(fd);
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  uint64_t n = 8 * MIB;
  ecs_put_item_t it = {.key = (const uint8_t *)"half-put", .key_len = 8, .nbytes = n, .raw_nbytes = n};
  it.desc.dtype = ECS_DTYPE_U8;
  it.desc.ndim = 1;
  it.desc.shape[0] = n;
  ecs_proto_put_item_write(&w, &it);
  send_hdr(fd, ECS_PROTO_MAGIC, ECS_OP_PUT, 1, (uint32_t)w.len, n);
  raw_send(fd, w.p, w.len);
  ecs_wbuf_free(&w);
  uint8_t *chunk = calloc(1, MIB);
  raw_send(fd, chunk, MIB); /* 1 of 8 MiB, then vanish */
  free(chunk);
  /* the block is reserved while the put is in flight */
  ecs_server_stat_t mid = stat0(e->c);
  assert_true(mid.bytes_in_use >= before.bytes_in_use + n);
  close(fd);
  ecs_server_stat_t after;
  for (int i = 0; i < 100; i++) {
    after = stat0(e->c);
    if (after.bytes_in_use == before.bytes_in_use)
      break;
    usleep(20000);
  }
  assert_int_equal(after.bytes_in_use, before.bytes_in_use);
  assert_int_equal(after.objects, before.objects);
  int ex;
  ecs_key_t k = {"half-put", 8};
  assert_int_equal(ecs_exists_batch(e->cr, &k, 1, &ex), ECS_OK);
  assert_int_equal(ex, 0);
}

/* ------------------------------------------------------------------ */
/* eviction                                                             */

typedef struct reader_arg {
  const char *servers;
  atomic_int stop;
  atomic_long ok, miss, bad;
} reader_arg_t;

/* Reads random keys of the eviction test and checks every byte it gets. */
static void *reader(void *p) {
  reader_arg_t *ra = p;
  ecs_client_t *c = connect_to(ra->servers, NULL, NULL, 5000);
  if (!c) {
    ra->bad++;
    return NULL;
  }
  size_t n = MIB;
  uint8_t *buf = malloc(n), *want = malloc(n);
  unsigned seed = 1;
  while (!ra->stop) {
    int i = (int)(rand_r(&seed) % 60);
    char key[32];
    snprintf(key, sizeof key, "ev-%d", i);
    uint64_t got = 0;
    int st = get1(c, key, buf, n, &got);
    if (st == ECS_ENOTFOUND) {
      ra->miss++;
      continue;
    }
    fill(want, n, 5000 + (uint32_t)i);
    if (st == ECS_OK && got == n && memcmp(buf, want, n) == 0)
      ra->ok++;
    else
      ra->bad++;
  }
  free(buf);
  free(want);
  ecs_client_close(c);
  return NULL;
}

static void test_fifo_eviction(void **state) {
  (void)state;
  env_t e;
  /* 16 MiB pool, 1 MiB objects: no background eviction (high watermark 1.0) */
  static const char *const extra[] = {"--pool-size", "16M", "--high-watermark", "1.0", "--low-watermark",
                                      "1.0",         NULL};
  assert_int_equal(start_env(&e, extra), 0);
  redisContext *r = redis_at(e.redis.port);
  reader_arg_t ra = {.servers = e.servers};
  pthread_t th;
  uint8_t *obj = malloc(MIB);
  /* the reader starts once a few objects exist */
  for (int i = 0; i < 60; i++) {
    char key[32];
    snprintf(key, sizeof key, "ev-%d", i);
    fill(obj, MIB, 5000 + (uint32_t)i);
    assert_int_equal(put1(e.c, key, obj, MIB, ECS_DTYPE_U8), ECS_OK);
    if (i == 4)
      assert_int_equal(pthread_create(&th, NULL, reader, &ra), 0);
  }
  ra.stop = 1;
  pthread_join(th, NULL);
  free(obj);
  /* concurrent readers never saw a freed or reused block */
  assert_int_equal(ra.bad, 0);
  assert_true(ra.ok > 0);

  /* FIFO: a prefix of the oldest objects is gone, the newest remain */
  int present[60];
  int first_present = -1;
  for (int i = 0; i < 60; i++) {
    char key[32];
    snprintf(key, sizeof key, "ev-%d", i);
    ecs_key_t k = {key, strlen(key)};
    assert_int_equal(ecs_exists_batch(e.c, &k, 1, &present[i]), ECS_OK);
    if (present[i] && first_present < 0)
      first_present = i;
    /* Redis agrees: evicted objects left Redis too */
    assert_int_equal(redis_exists(r, key), present[i]);
  }
  assert_true(first_present > 40); /* at most ~16 of 60 fit */
  for (int i = first_present; i < 60; i++)
    assert_true(present[i]);
  ecs_server_stat_t st = stat0(e.c);
  assert_true(st.evictions >= 40);
  /* an object larger than the pool is refused clearly */
  uint8_t *big = calloc(1, 17 * MIB);
  assert_int_equal(put1(e.c, "too-big", big, 17 * MIB, ECS_DTYPE_U8), ECS_ETOOBIG);
  free(big);
  redisFree(r);
  assert_int_equal(stop_env(&e), 0);
}

static void test_background_eviction(void **state) {
  (void)state;
  env_t e;
  static const char *const extra[] = {"--pool-size", "16M", "--high-watermark", "0.5", "--low-watermark",
                                      "0.25",        NULL};
  assert_int_equal(start_env(&e, extra), 0);
  /* one batch of 12 MiB: committed at once, so the fill jumps above the
   * high watermark (8 MiB) and the loop must bring it to the low one */
  enum { N = 12 };
  uint8_t *obj = calloc(N, MIB);
  char names[N][16];
  ecs_key_t keys[N];
  ecs_tensor_t ts[N];
  int st_[N];
  memset(ts, 0, sizeof ts);
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "bg-%d", i);
    keys[i].data = names[i];
    keys[i].len = strlen(names[i]);
    obj[(size_t)i * MIB] = (uint8_t)i;
    ts[i].data = obj + (size_t)i * MIB;
    ts[i].nbytes = MIB;
    ts[i].desc.dtype = ECS_DTYPE_U8;
    ts[i].desc.ndim = 1;
    ts[i].desc.shape[0] = MIB;
  }
  assert_int_equal(ecs_put_batch(e.c, keys, ts, N, st_), ECS_OK);
  for (int i = 0; i < N; i++)
    assert_int_equal(st_[i], ECS_OK);
  free(obj);
  ecs_server_stat_t st;
  for (int i = 0; i < 100; i++) { /* the loop evicts within a tick or two */
    st = stat0(e.c);
    if (st.bytes_in_use <= 4 * MIB)
      break;
    usleep(20000);
  }
  assert_true(st.bytes_in_use <= 4 * MIB);
  assert_true(st.evictions >= 8);
  assert_int_equal(stop_env(&e), 0);
}

/* ------------------------------------------------------------------ */
/* deadlines and failures                                              */

static void test_deadline_server_stopped(void **state) {
  (void)state;
  env_t e;
  assert_int_equal(start_env(&e, NULL), 0);
  ecs_client_t *c = connect_to(e.servers, NULL, NULL, 800);
  assert_non_null(c);
  uint8_t buf[4096];
  assert_int_equal(ecs_ts_signal(&e.server, SIGSTOP), 0);
  uint64_t t0 = ecs_now_ms();
  assert_int_equal(get1(c, "anything", buf, sizeof buf, NULL), ECS_ETIMEDOUT);
  uint64_t dt = ecs_now_ms() - t0;
  assert_true(dt >= 700 && dt < 3000);
  /* a put times out too, even with more bytes than the socket buffers hold */
  uint8_t *big = calloc(1, 8 * MIB);
  t0 = ecs_now_ms();
  assert_int_equal(put1(c, "stalled", big, 8 * MIB, ECS_DTYPE_U8), ECS_ETIMEDOUT);
  assert_true(ecs_now_ms() - t0 < 3000);
  free(big);
  assert_int_equal(ecs_ts_signal(&e.server, SIGCONT), 0);
  /* the client reconnects by itself */
  assert_int_equal(ecs_ping(c), ECS_OK);
  ecs_client_close(c);
  /* a server that is gone: connection refused quickly */
  ecs_ts_kill9(&e.server);
  c = connect_to(e.servers, NULL, NULL, 800);
  assert_null(c);
  assert_int_equal(stop_env(&e), 0);
}

static void test_redis_down(void **state) {
  (void)state;
  env_t e;
  static const char *const extra[] = {"--redis-timeout-ms", "200", NULL};
  assert_int_equal(start_env(&e, extra), 0);
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.servers = e.servers;
  cfg.redis_url = e.redis_url;
  cfg.ns = "test";
  cfg.transport = transport();
  cfg.timeout_ms = 600;
  ecs_client_t *cr;
  assert_int_equal(ecs_client_connect(&cfg, &cr, NULL, 0), ECS_OK);
  uint8_t a[4096];
  fill(a, sizeof a, 11);
  assert_int_equal(put1(e.c, "before-outage", a, sizeof a, ECS_DTYPE_U8), ECS_OK);

  assert_int_equal(ecs_ts_signal(&e.redis, SIGSTOP), 0);
  ecs_key_t k = {"before-outage", 13};
  int ex = 1;
  uint64_t t0 = ecs_now_ms();
  /* Redis frozen: exists is answered by the server that holds the key,
   * after one bounded Redis attempt */
  int rc = ecs_exists_batch(cr, &k, 1, &ex);
  assert_int_equal(rc, ECS_OK);
  assert_int_equal(ex, 1);
  assert_true(ecs_now_ms() - t0 < 3000);
  /* ...and for the next second the servers answer at once, without waiting
   * on the frozen Redis again */
  t0 = ecs_now_ms();
  ex = 0;
  assert_int_equal(ecs_exists_batch(cr, &k, 1, &ex), ECS_OK);
  assert_int_equal(ex, 1);
  assert_true(ecs_now_ms() - t0 < 300);
  /* the server keeps serving what it holds, and takes new puts */
  uint8_t out[4096];
  assert_int_equal(get1(e.c, "before-outage", out, sizeof out, NULL), ECS_OK);
  assert_int_equal(put1(e.c, "during-outage", a, 2048, ECS_DTYPE_U8), ECS_OK);
  assert_int_equal(get1(e.c, "during-outage", out, sizeof out, NULL), ECS_OK);
  assert_int_equal(ecs_ts_signal(&e.redis, SIGCONT), 0);
  /* once Redis answers again, the records are re-synced (looked at in
   * Redis itself: exists may still be answered by the server) */
  redisContext *r = redis_at(e.redis.port);
  long long rec = 0;
  for (int i = 0; i < 100 && rec != 1; i++) {
    usleep(50000);
    rec = redis_exists(r, "during-outage");
  }
  assert_int_equal(rec, 1);
  redisFree(r);
  ecs_key_t k2 = {"during-outage", 13};
  ex = 0;
  assert_int_equal(ecs_exists_batch(cr, &k2, 1, &ex), ECS_OK);
  assert_int_equal(ex, 1);
  ecs_client_close(cr);
  assert_int_equal(stop_env(&e), 0);
}

static void test_kill9_restart_stale_records(void **state) {
  (void)state;
  env_t e;
  assert_int_equal(start_env(&e, NULL), 0);
  uint8_t a[4096];
  fill(a, sizeof a, 21);
  assert_int_equal(put1(e.c, "pre-crash", a, sizeof a, ECS_DTYPE_U8), ECS_OK);
  ecs_key_t k = {"pre-crash", 9};
  int ex = 0;
  assert_int_equal(ecs_exists_batch(e.cr, &k, 1, &ex), ECS_OK);
  assert_int_equal(ex, 1);
  redisContext *r = redis_at(e.redis.port);
  assert_int_equal(redis_exists(r, "pre-crash"), 1); /* the record outlives the crash */

  ecs_ts_kill9(&e.server);
  /* a new server process with the same node id and port: a new epoch */
  char port[16], redis[32], node[32];
  snprintf(port, sizeof port, "127.0.0.1:%d", e.server.port);
  snprintf(redis, sizeof redis, "127.0.0.1:%d", e.redis.port);
  snprintf(node, sizeof node, "127.0.0.1:%d", e.server.port);
  ecs_ts_proc_t s2;
  memset(&s2, 0, sizeof s2);
  char *argv[] = {(char *)ecs_ts_bin("ecstore-server"),
                  "--listen",
                  port,
                  "--redis",
                  redis,
                  "--pool-size",
                  "64M",
                  "--ns",
                  "test",
                  "--node-id",
                  node,
                  NULL};
  assert_int_equal(ecs_ts_spawn(&s2, argv), 0);
  assert_int_equal(ecs_ts_wait_port(&s2, e.server.port, 10000), 0);
  ex = 1;
  assert_int_equal(ecs_exists_batch(e.cr, &k, 1, &ex), ECS_OK);
  assert_int_equal(ex, 0);                           /* stale: a miss */
  assert_int_equal(redis_exists(r, "pre-crash"), 0); /* and cleaned */
  uint8_t out[4096];
  assert_int_equal(get1(e.c, "pre-crash", out, sizeof out, NULL), ECS_ENOTFOUND);
  redisFree(r);
  assert_int_equal(ecs_ts_stop(&s2, 5000), 0);
  assert_int_equal(stop_env(&e), 0);
}

static void test_sigterm_removes_records(void **state) {
  (void)state;
  env_t e;
  assert_int_equal(start_env(&e, NULL), 0);
  uint8_t a[4096];
  fill(a, sizeof a, 31);
  assert_int_equal(put1(e.c, "graceful", a, sizeof a, ECS_DTYPE_U8), ECS_OK);
  redisContext *r = redis_at(e.redis.port);
  assert_int_equal(redis_exists(r, "graceful"), 1);
  assert_int_equal(ecs_ts_stop(&e.server, 5000), 0); /* SIGTERM, clean exit */
  e.server.pid = 0;
  assert_int_equal(redis_exists(r, "graceful"), 0);
  redisReply *rep = redisCommand(r, "SCARD ecs:test:nodes");
  assert_non_null(rep);
  assert_int_equal(rep->integer, 0);
  freeReplyObject(rep);
  redisFree(r);
  assert_int_equal(stop_env(&e), 0);
}

static void test_auth_and_namespace(void **state) {
  (void)state;
  char dir[256];
  assert_int_equal(ecs_ts_mkdtemp(dir, sizeof dir), 0);
  char tok[300];
  snprintf(tok, sizeof tok, "%s/token", dir);
  FILE *f = fopen(tok, "w");
  assert_non_null(f);
  fprintf(f, "s3cret-token\n");
  fclose(f);
  env_t e;
  memset(&e, 0, sizeof e);
  assert_int_equal(ecs_ts_redis_start(&e.redis), 0);
  const char *extra[] = {"--auth-token-file", tok, NULL};
  assert_int_equal(ecs_ts_server_start(&e.server, e.redis.port, extra), 0);
  snprintf(e.servers, sizeof e.servers, "127.0.0.1:%d", e.server.port);
  ecs_client_t *c = connect_to(e.servers, NULL, NULL, 2000);
  assert_null(c); /* no token */
  c = connect_to(e.servers, NULL, "wrong", 2000);
  assert_null(c);
  c = connect_to(e.servers, NULL, "s3cret-token", 2000);
  assert_non_null(c);
  assert_int_equal(ecs_ping(c), ECS_OK);
  ecs_client_close(c);
  /* another namespace is refused with a message that says so */
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.servers = e.servers;
  cfg.ns = "other-model";
  cfg.auth_token = "s3cret-token";
  char err[256];
  assert_int_equal(ecs_client_connect(&cfg, &c, err, sizeof err), ECS_EINVAL);
  assert_non_null(strstr(err, "namespace"));
  unlink(tok);
  rmdir(dir);
  assert_int_equal(stop_env(&e), 0);
}

static void test_two_servers(void **state) {
  (void)state;
  env_t e;
  assert_int_equal(start_env(&e, NULL), 0);
  ecs_ts_proc_t s2;
  memset(&s2, 0, sizeof s2);
  assert_int_equal(ecs_ts_server_start(&s2, e.redis.port, NULL), 0);
  char servers[96];
  snprintf(servers, sizeof servers, "127.0.0.1:%d,127.0.0.1:%d", e.server.port, s2.port);
  ecs_client_t *c = connect_to(servers, e.redis_url, NULL, 5000);
  assert_non_null(c);
  enum { N = 64 };
  char names[N][16];
  ecs_key_t keys[N];
  ecs_tensor_t ts[N];
  static uint8_t data[N][1024], out[N][1024];
  ecs_get_buf_t b[N];
  int st[N], ex[N];
  memset(ts, 0, sizeof ts);
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "two-%d", i);
    keys[i].data = names[i];
    keys[i].len = strlen(names[i]);
    fill(data[i], 1024, (uint32_t)i + 77);
    ts[i].data = data[i];
    ts[i].nbytes = 1024;
    ts[i].desc.dtype = ECS_DTYPE_F16;
    ts[i].desc.ndim = 2;
    ts[i].desc.shape[0] = 2;
    ts[i].desc.shape[1] = 256;
    b[i].data = out[i];
    b[i].capacity = 1024;
  }
  assert_int_equal(ecs_put_batch(c, keys, ts, N, st), ECS_OK);
  for (int i = 0; i < N; i++)
    assert_int_equal(st[i], ECS_OK);
  assert_int_equal(ecs_get_batch(c, keys, b, N), ECS_OK);
  for (int i = 0; i < N; i++) {
    assert_int_equal(b[i].status, ECS_OK);
    assert_memory_equal(out[i], data[i], 1024);
  }
  assert_int_equal(ecs_exists_batch(c, keys, N, ex), ECS_OK);
  for (int i = 0; i < N; i++)
    assert_int_equal(ex[i], 1);
  ecs_server_stat_t s0, s1;
  assert_int_equal(ecs_stat(c, 0, &s0), ECS_OK);
  assert_int_equal(ecs_stat(c, 1, &s1), ECS_OK);
  assert_int_equal(s0.objects + s1.objects, N);
  assert_true(s0.objects > 0 && s1.objects > 0); /* both hold a share */
  ecs_client_close(c);
  assert_int_equal(ecs_ts_stop(&s2, 5000), 0);
  assert_int_equal(stop_env(&e), 0);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest shared[] = {
      cmocka_unit_test(test_every_dtype),
      cmocka_unit_test(test_empty_and_scalar),
      cmocka_unit_test(test_batch_hits_misses_and_bad_items),
      cmocka_unit_test(test_idempotent_and_conflicting_put),
      cmocka_unit_test(test_upsert_replaces_under_a_lease),
      cmocka_unit_test(test_upsert_atomic_for_readers),
      cmocka_unit_test(test_remove_and_redis_records),
      cmocka_unit_test(test_checksum_mismatch_detected),
      cmocka_unit_test(test_checksum_mismatch_large_batch),
      cmocka_unit_test(test_compressed_objects),
      cmocka_unit_test(test_stat_and_ping),
      cmocka_unit_test(test_malformed_frames),
      cmocka_unit_test(test_disconnect_mid_put_leaks_nothing),
  };
  const struct CMUnitTest own[] = {
      cmocka_unit_test(test_fifo_eviction),
      cmocka_unit_test(test_background_eviction),
      cmocka_unit_test(test_deadline_server_stopped),
      cmocka_unit_test(test_redis_down),
      cmocka_unit_test(test_kill9_restart_stale_records),
      cmocka_unit_test(test_sigterm_removes_records),
      cmocka_unit_test(test_auth_and_namespace),
      cmocka_unit_test(test_two_servers),
  };
  int fails = cmocka_run_group_tests_name("store_shared_server", shared, group_setup, group_teardown);
  fails += cmocka_run_group_tests_name("store_own_servers", own, NULL, NULL);
  return fails ? 1 : 0;
}
