/*
 * test_store_roundtrip: Round trips through a real server: every dtype, empty and scalar
 * tensors, mixed batches of hits, misses and bad items, idempotent and
 * conflicting puts, removal and its Redis record, compressed objects,
 * stat and ping.
 * Over the transport ECS_TEST_TRANSPORT names (ctest runs tcp and shm).
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
#include "store/client/client_internal.h"
#include "store/core/net.h"
#include "store/core/proto.h"
#include "support/fixture.h"
#include "support/raw.h"

#define MIB (1024u * 1024u)

static void test_every_dtype(void **state) {
  ecs_ts_env_t *e = *state;
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
    ecs_ts_fill(src, t.nbytes, (uint32_t)dt);
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
  ecs_ts_env_t *e = *state;
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
  ecs_ts_env_t *e = *state;
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
    ecs_ts_fill(data[i], sizeof data[i], 1000 + (uint32_t)i);
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
  ecs_ts_env_t *e = *state;
  uint8_t a[8192], b[8192];
  ecs_ts_fill(a, sizeof a, 7);
  ecs_ts_fill(b, sizeof b, 8);
  assert_int_equal(ecs_ts_put1(e->c, "immutable", a, sizeof a, ECS_DTYPE_U8), ECS_OK);
  assert_int_equal(ecs_ts_put1(e->c, "immutable", a, sizeof a, ECS_DTYPE_U8), ECS_OK); /* a retry */
  assert_int_equal(ecs_ts_put1(e->c, "immutable", b, sizeof b, ECS_DTYPE_U8), ECS_ECONFLICT);
  assert_int_equal(ecs_ts_put1(e->c, "immutable", a, sizeof a, ECS_DTYPE_I8),
                   ECS_ECONFLICT); /* other dtype */
  uint8_t out[8192];
  assert_int_equal(ecs_ts_get1(e->c, "immutable", out, sizeof out, NULL), ECS_OK);
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

static void test_remove_and_redis_records(void **state) {
  ecs_ts_env_t *e = *state;
  uint8_t a[4096];
  ecs_ts_fill(a, sizeof a, 99);
  assert_int_equal(ecs_ts_put1(e->c, "to-remove", a, sizeof a, ECS_DTYPE_U8), ECS_OK);
  redisContext *r = ecs_ts_redis_at(e->redis.port);
  assert_non_null(r);
  assert_int_equal(ecs_ts_redis_exists(r, "to-remove"), 1);
  ecs_key_t k[2] = {{"to-remove", 9}, {"never-there", 11}};
  int st[2];
  assert_int_equal(ecs_remove_batch(e->c, k, 2, st), ECS_OK);
  assert_int_equal(st[0], ECS_OK);
  assert_int_equal(st[1], ECS_ENOTFOUND);
  assert_int_equal(ecs_ts_redis_exists(r, "to-remove"), 0);
  int ex[2];
  assert_int_equal(ecs_exists_batch(e->cr, k, 2, ex), ECS_OK);
  assert_int_equal(ex[0], 0);
  redisFree(r);
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
  ecs_ts_env_t *e = *state;
  static const char *codecs[] = {"lz4", "zstd", "auto"};
  enum { TOK = 256, HID = 512 };
  size_t n = (size_t)TOK * HID * 2;
  uint16_t *emb = malloc(n);
  uint8_t *rnd = malloc(n), *out = malloc(n);
  fill_bf16_normal(emb, (size_t)TOK * HID, 42);
  ecs_ts_fill(rnd, n, 43);
  for (size_t ci = 0; ci < 3; ci++) {
    ecs_client_config_t cfg;
    ecs_client_config_init(&cfg);
    cfg.servers = e->servers;
    cfg.ns = "test";
    cfg.transport = "tcp"; /* compression applies to TCP puts */
    cfg.compression = codecs[ci];
    ecs_client_t *z;
    assert_int_equal(ecs_client_connect(&cfg, &z, NULL, 0), ECS_OK);
    ecs_server_stat_t before = ecs_ts_stat0(e->c);
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
    ecs_server_stat_t after = ecs_ts_stat0(e->c);
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
  ecs_ts_env_t *e = *state;
  assert_int_equal(ecs_ping(e->c), ECS_OK);
  ecs_server_stat_t st = ecs_ts_stat0(e->c);
  assert_int_equal(st.pool_size, 64u * MIB);
  assert_true(st.objects > 0);
  assert_int_equal(st.redis_ok, 1);
  assert_true(st.connections >= 2);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_dtype),
      cmocka_unit_test(test_empty_and_scalar),
      cmocka_unit_test(test_batch_hits_misses_and_bad_items),
      cmocka_unit_test(test_idempotent_and_conflicting_put),
      cmocka_unit_test(test_remove_and_redis_records),
      cmocka_unit_test(test_compressed_objects),
      cmocka_unit_test(test_stat_and_ping),
  };
  return cmocka_run_group_tests_name("store_roundtrip", tests, ecs_ts_group_open_debug, ecs_ts_group_close)
             ? 1
             : 0;
}
