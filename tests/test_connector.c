/*
 * Integration tests of the EC connector: every role (save / wait_for_save,
 * has, start_load / wait / poll) run through the same table against each
 * backend (ecstore, disk, redis), with a real redis-server and a real
 * ecstore-server on free ports, plus the failures users hit: a server or
 * Redis down, a wait that must not hang, an item evicted between has and
 * load, corrupt objects, wrong sizes.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "ecstore/ec_connector.h"
#include "ecstore/ecstore.h"
#include "store/client/client_internal.h"
#include "store/core/log.h"
#include "store/core/net.h"
#include "support/raw.h"
#include "support/ts.h"

#define KIB 1024u
#define MIB (1024u * 1024u)

/* Processes shared by the backend tests of one group. */
typedef struct env {
  ecs_ts_proc_t redis;  /* redis-server */
  ecs_ts_proc_t server; /* ecstore-server, 64 MiB pool, debug ops */
  char dir[256];        /* disk backend root */
  int ndirs;            /* sub-directories handed out */
} env_t;

static env_t g_env;

/* One backend under test (the prestate of each test). */
typedef struct be {
  int backend;
} be_t;

static be_t be_ecstore = {ECS_EC_BACKEND_ECSTORE};
static be_t be_disk = {ECS_EC_BACKEND_DISK};
static be_t be_redis = {ECS_EC_BACKEND_REDIS};

/* ------------------------------------------------------------------ */
/* helpers                                                              */

/* A bf16 tensor [rows, cols] of fresh bytes (caller frees t->data). */
static ecs_tensor_t mk_tensor(uint64_t rows, uint64_t cols, uint32_t seed) {
  ecs_tensor_t t;
  memset(&t, 0, sizeof t);
  t.desc.dtype = ECS_DTYPE_BF16;
  t.desc.ndim = 2;
  t.desc.shape[0] = rows;
  t.desc.shape[1] = cols;
  t.nbytes = rows * cols * 2;
  void *p = malloc(t.nbytes ? t.nbytes : 1);
  ecs_ts_fill(p, t.nbytes, seed);
  t.data = p;
  return t;
}

/* Opens a connector of backend b over these processes.  extra holds JSON
 * members (", \"k\": v" form) applied on top as a second object, so they
 * may override the base keys. */
static ecs_ec_conn_t *open_at(int backend, int redis_port, int server_port, const char *dir,
                              const char *extra) {
  char js[2048], err[512] = "";
  snprintf(
      js, sizeof js,
      "{\"backend\": \"%s\", \"servers\": \"127.0.0.1:%d\", \"redis_url\": \"redis://127.0.0.1:%d\","
      " \"namespace\": \"test\", \"disk_path\": \"%s\", \"timeout_ms\": 2000, \"connect_timeout_ms\": 1000,"
      " \"staging_bytes\": \"8M\", \"queue_depth\": 64, \"batch_size\": 8, \"protocol\": \"tcp\"}",
      ecs_ec_backend_name(backend), server_port, redis_port, dir);
  ecs_ec_config_t cfg;
  ecs_ec_config_init(&cfg);
  assert_int_equal(ecs_ec_config_parse_json(&cfg, js, 0, err, sizeof err), ECS_OK);
  if (extra) {
    snprintf(js, sizeof js, "{%s}", extra + 1); /* drop the leading comma */
    assert_int_equal(ecs_ec_config_parse_json(&cfg, js, 0, err, sizeof err), ECS_OK);
  }
  ecs_ec_conn_t *c = NULL;
  int rc = ecs_ec_open(&cfg, &c, err, sizeof err);
  if (rc != ECS_OK)
    fprintf(stderr, "open %s: %s: %s\n", ecs_ec_backend_name(backend), ecs_strerror(rc), err);
  return c;
}

/* A fresh disk directory under the group's root. */
static void new_dir(char *out, size_t cap) {
  snprintf(out, cap, "%s/d%d", g_env.dir, g_env.ndirs++);
}

static ecs_ec_conn_t *open_be(const be_t *b, char *dir, size_t dircap, const char *extra) {
  new_dir(dir, dircap);
  return open_at(b->backend, g_env.redis.port, g_env.server.port, dir, extra);
}

/* A key unique to this backend and test. */
static void key(char *out, size_t cap, const be_t *b, const char *tag, int i) {
  snprintf(out, cap, "%s-%s-%d-%d", ecs_ec_backend_name(b->backend), tag, (int)getpid(), i);
}

static redisContext *redis_at(int port) {
  struct timeval tv = {2, 0};
  redisContext *r = redisConnectWithTimeout("127.0.0.1", port, tv);
  assert_non_null(r);
  assert_int_equal(r->err, 0);
  return r;
}

/* Loads one key into a buffer of cap bytes; returns its result. */
static ecs_ec_load_result_t load1(ecs_ec_conn_t *c, const char *k, void *buf, uint64_t cap,
                                  uint64_t expected) {
  ecs_ec_load_item_t it = {k, buf, cap, expected};
  ecs_ec_load_t *ld = NULL;
  ecs_ec_load_result_t r;
  memset(&r, 0, sizeof r);
  assert_int_equal(ecs_ec_start_load(c, &it, 1, &ld), ECS_OK);
  assert_int_equal(ecs_ec_wait_for_load(ld, 5000, &r), ECS_OK);
  ecs_ec_load_release(ld);
  return r;
}

static void save_wait_ok(ecs_ec_conn_t *c, const char *k, const ecs_tensor_t *t) {
  assert_int_equal(ecs_ec_save(c, k, t), ECS_OK);
  size_t nf = 99;
  ecs_ec_save_result_t fr[4];
  assert_int_equal(ecs_ec_wait_for_save(c, 5000, fr, 4, &nf), ECS_OK);
  assert_int_equal(nf, 0);
}

/* ------------------------------------------------------------------ */
/* group setup                                                          */

static int group_setup(void **state) {
  (void)state;
  memset(&g_env, 0, sizeof g_env);
  ecs_log_set_level(ECS_LOG_ERROR);
  static const char *const extra[] = {"--enable-debug-ops", NULL};
  if (ecs_ts_redis_start(&g_env.redis) || ecs_ts_server_start(&g_env.server, g_env.redis.port, extra))
    return -1;
  if (ecs_ts_mkdtemp(g_env.dir, sizeof g_env.dir))
    return -1;
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  int st = ecs_ts_stop(&g_env.server, 5000);
  ecs_ts_stop(&g_env.redis, 5000);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_env.dir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", g_env.dir);
  if (st != 0)
    fprintf(stderr, "ecstore-server exited with status %d\n", st);
  return st == 0 ? 0 : -1;
}

/* ------------------------------------------------------------------ */
/* round trips                                                          */

static void test_roundtrip(void **state) {
  const be_t *b = *state;
  char dir[300];
  ecs_ec_conn_t *c = open_be(b, dir, sizeof dir, NULL);
  assert_non_null(c);
  assert_non_null(strstr(ecs_ec_describe(c), ecs_ec_backend_name(b->backend)));
  /* the data path the client took, never the "auto" that was asked for */
  if (b->backend == ECS_EC_BACKEND_ECSTORE)
    assert_null(strstr(ecs_ec_describe(c), "auto"));
  enum { N = 12 };
  char keys[N][96];
  ecs_tensor_t t[N];
  uint8_t *copy[N];
  for (int i = 0; i < N; i++) {
    key(keys[i], sizeof keys[i], b, "rt", i);
    /* a few shapes, one 1.3 MB like a small embedding */
    t[i] = i == 3 ? mk_tensor(650, 1024, (uint32_t)i) : mk_tensor((uint64_t)(1 + i * 7), 64, (uint32_t)i);
    if (i == 5) { /* another dtype and rank */
      t[i].desc.dtype = ECS_DTYPE_F32;
      t[i].desc.ndim = 3;
      t[i].desc.shape[0] = 2;
      t[i].desc.shape[1] = 3;
      t[i].desc.shape[2] = 16;
      t[i].nbytes = 2 * 3 * 16 * 4;
    }
    copy[i] = malloc(t[i].nbytes);
    memcpy(copy[i], t[i].data, t[i].nbytes);
    assert_int_equal(ecs_ec_save(c, keys[i], &t[i]), ECS_OK);
    /* the caller's buffer is free at once: scribble over it */
    memset((void *)t[i].data, 0xEE, t[i].nbytes);
    free((void *)t[i].data);
  }
  ecs_ec_save_result_t fr[N];
  size_t nf = 99;
  assert_int_equal(ecs_ec_wait_for_save(c, 10000, fr, N, &nf), ECS_OK);
  assert_int_equal(nf, 0);
  assert_int_equal(ecs_ec_save_pending(c), 0);

  /* has: hits and a miss, in one batch */
  const char *hk[N + 1];
  int out[N + 1];
  char miss[96];
  key(miss, sizeof miss, b, "rt-missing", 0);
  for (int i = 0; i < N; i++)
    hk[i] = keys[i];
  hk[N] = miss;
  assert_int_equal(ecs_ec_has(c, hk, N + 1, out), ECS_OK);
  for (int i = 0; i < N; i++)
    assert_int_equal(out[i], 1);
  assert_int_equal(out[N], 0);

  /* load all plus the miss; the miss does not fail its neighbours */
  ecs_ec_load_item_t it[N + 1];
  void *bufs[N + 1];
  for (int i = 0; i <= N; i++) {
    uint64_t cap = i < N ? t[i].nbytes : 4096;
    bufs[i] = malloc(cap);
    it[i].mm_hash = hk[i];
    it[i].dst = bufs[i];
    it[i].capacity = cap;
    it[i].expected_nbytes = i % 2 ? (i < N ? t[i].nbytes : 0) : 0;
  }
  ecs_ec_load_t *ld;
  assert_int_equal(ecs_ec_start_load(c, it, N + 1, &ld), ECS_OK);
  assert_int_equal(ecs_ec_load_size(ld), N + 1);
  ecs_ec_load_result_t res[N + 1];
  assert_int_equal(ecs_ec_wait_for_load(ld, 10000, res), ECS_OK);
  assert_int_equal(ecs_ec_poll_load(ld, res), ECS_OK);
  for (int i = 0; i < N; i++) {
    assert_int_equal(res[i].status, ECS_OK);
    assert_int_equal(res[i].nbytes, t[i].nbytes);
    assert_int_equal(res[i].desc.dtype, t[i].desc.dtype);
    assert_int_equal(res[i].desc.ndim, t[i].desc.ndim);
    for (int d = 0; d < t[i].desc.ndim; d++)
      assert_int_equal(res[i].desc.shape[d], t[i].desc.shape[d]);
    assert_memory_equal(bufs[i], copy[i], t[i].nbytes);
  }
  assert_int_equal(res[N].status, ECS_ENOTFOUND);
  ecs_ec_load_release(ld);

  ecs_ec_stats_t st;
  ecs_ec_stats(c, &st);
  assert_int_equal(st.saves, N);
  assert_int_equal(st.saves_stored, N);
  assert_int_equal(st.saves_failed, 0);
  assert_int_equal(st.load_hits, N);
  assert_int_equal(st.load_misses, 1);
  assert_int_equal(st.staging_in_use, 0);
  for (int i = 0; i <= N; i++) {
    free(bufs[i]);
    if (i < N)
      free(copy[i]);
  }
  ecs_ec_close(c);
}

static void test_load_sizes_and_keys(void **state) {
  const be_t *b = *state;
  char dir[300], k[96];
  ecs_ec_conn_t *c = open_be(b, dir, sizeof dir, NULL);
  assert_non_null(c);
  key(k, sizeof k, b, "sz", 0);
  ecs_tensor_t t = mk_tensor(100, 64, 7); /* 12800 bytes */
  save_wait_ok(c, k, &t);
  uint8_t *buf = malloc(t.nbytes * 2);

  /* exact fit, expected given */
  ecs_ec_load_result_t r = load1(c, k, buf, t.nbytes, t.nbytes);
  assert_int_equal(r.status, ECS_OK);
  assert_memory_equal(buf, t.data, t.nbytes);
  /* bigger buffer, no expectation */
  r = load1(c, k, buf, t.nbytes * 2, 0);
  assert_int_equal(r.status, ECS_OK);
  assert_int_equal(r.nbytes, t.nbytes);
  /* buffer too small: a miss that says how much is needed, with the shape */
  r = load1(c, k, buf, t.nbytes - 1, 0);
  assert_int_equal(r.status, ECS_EBUFSMALL);
  assert_int_equal(r.nbytes, t.nbytes);
  assert_int_equal(r.desc.shape[0], 100);
  /* wrong expected size, smaller or larger: a miss, never data */
  r = load1(c, k, buf, t.nbytes * 2, t.nbytes + 2);
  assert_int_equal(r.status, ECS_EDTYPE);
  r = load1(c, k, buf, t.nbytes * 2, t.nbytes - 2);
  assert_int_equal(r.status, ECS_EDTYPE);

  /* invalid keys are per-item misses; valid neighbours still load */
  char longk[ECS_MAX_KEY + 10];
  memset(longk, 'k', sizeof longk - 1);
  longk[sizeof longk - 1] = '\0';
  ecs_ec_load_item_t it[3] = {{"", buf, 16, 0}, {k, buf, t.nbytes, 0}, {longk, buf, 16, 0}};
  ecs_ec_load_t *ld;
  ecs_ec_load_result_t res[3];
  assert_int_equal(ecs_ec_start_load(c, it, 3, &ld), ECS_OK);
  assert_int_equal(ecs_ec_wait_for_load(ld, 5000, res), ECS_OK);
  assert_int_equal(res[0].status, ECS_EKEY);
  assert_int_equal(res[1].status, ECS_OK);
  assert_int_equal(res[2].status, ECS_EKEY);
  ecs_ec_load_release(ld);
  /* a load of only bad keys completes at once */
  assert_int_equal(ecs_ec_start_load(c, it, 1, &ld), ECS_OK);
  assert_int_equal(ecs_ec_poll_load(ld, res), ECS_OK);
  assert_int_equal(res[0].status, ECS_EKEY);
  ecs_ec_load_release(ld);

  /* bad arguments change nothing */
  ecs_ec_load_item_t bad = {k, NULL, 10, 0};
  assert_int_equal(ecs_ec_start_load(c, &bad, 1, &ld), ECS_EINVAL);
  assert_null(ld);
  assert_int_equal(ecs_ec_start_load(c, it, 0, &ld), ECS_EINVAL);
  assert_int_equal(ecs_ec_save(c, "", &t), ECS_EKEY);
  assert_int_equal(ecs_ec_save(c, longk, &t), ECS_EKEY);
  ecs_tensor_t lie = t;
  lie.nbytes = t.nbytes - 1; /* shape says otherwise */
  assert_int_equal(ecs_ec_save(c, k, &lie), ECS_EINVAL);
  ecs_tensor_t huge = t;
  huge.desc.shape[0] = 1 << 20; /* 128 MiB > 8 MiB staging */
  huge.nbytes = (uint64_t)(1 << 20) * 64 * 2;
  assert_int_equal(ecs_ec_save(c, k, &huge), ECS_ETOOBIG);
  /* has() with an invalid key: 0 for it, the batch goes on */
  const char *hk[2] = {"", k};
  int out[2] = {7, 7};
  assert_int_equal(ecs_ec_has(c, hk, 2, out), ECS_OK);
  assert_int_equal(out[0], 0);
  assert_int_equal(out[1], 1);
  free((void *)t.data);
  free(buf);
  ecs_ec_close(c);
}

/* Many loads in flight at once, polled without blocking, while saves go
 * on from two threads. */
typedef struct saver_arg {
  ecs_ec_conn_t *c;
  const be_t *b;
  int id, ok;
} saver_arg_t;

static void *saver_thread(void *p) {
  saver_arg_t *a = p;
  for (int i = 0; i < 40; i++) {
    char k[96];
    key(k, sizeof k, a->b, a->id ? "par1" : "par0", i);
    ecs_tensor_t t = mk_tensor(16, 64, (uint32_t)(a->id * 1000 + i));
    a->ok += ecs_ec_save(a->c, k, &t) == ECS_OK;
    free((void *)t.data);
  }
  return NULL;
}

static void test_concurrent_roles(void **state) {
  const be_t *b = *state;
  char dir[300];
  ecs_ec_conn_t *c = open_be(b, dir, sizeof dir, NULL);
  assert_non_null(c);
  saver_arg_t a[2] = {{c, b, 0, 0}, {c, b, 1, 0}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_create(&th[i], NULL, saver_thread, &a[i]), 0);
  for (int i = 0; i < 2; i++)
    pthread_join(th[i], NULL);
  assert_int_equal(a[0].ok + a[1].ok, 80);
  assert_int_equal(ecs_ec_wait_for_save(c, 10000, NULL, 0, NULL), ECS_OK);

  /* four loads in flight, polled */
  enum { L = 4, PER = 20 };
  ecs_ec_load_t *ld[L];
  char keys[L][PER][96];
  uint8_t *bufs = malloc((size_t)L * PER * 2048);
  for (int l = 0; l < L; l++) {
    ecs_ec_load_item_t it[PER];
    for (int i = 0; i < PER; i++) {
      key(keys[l][i], sizeof keys[l][i], b, l % 2 ? "par1" : "par0", i + (l / 2) * PER);
      it[i] = (ecs_ec_load_item_t){keys[l][i], bufs + ((size_t)l * PER + (size_t)i) * 2048, 2048, 2048};
    }
    assert_int_equal(ecs_ec_start_load(c, it, PER, &ld[l]), ECS_OK);
  }
  int done = 0;
  ecs_ec_load_result_t res[PER];
  uint64_t t0 = ecs_now_ms();
  while (done < L && ecs_now_ms() - t0 < 10000) {
    done = 0;
    for (int l = 0; l < L; l++)
      done += ecs_ec_poll_load(ld[l], res) == ECS_OK;
    if (done < L) /* the test polls; the connector itself never does */
      usleep(1000);
  }
  assert_int_equal(done, L);
  for (int l = 0; l < L; l++) {
    assert_int_equal(ecs_ec_wait_for_load(ld[l], 0, res), ECS_OK);
    for (int i = 0; i < PER; i++) {
      assert_int_equal(res[i].status, ECS_OK);
      ecs_tensor_t want = mk_tensor(16, 64, (uint32_t)((l % 2) * 1000 + i + (l / 2) * PER));
      assert_memory_equal(bufs + ((size_t)l * PER + (size_t)i) * 2048, want.data, 2048);
      free((void *)want.data);
    }
    ecs_ec_load_release(ld[l]);
  }
  free(bufs);
  ecs_ec_close(c);
}

/* ------------------------------------------------------------------ */
/* failures                                                             */

/* The backend goes away after open: every save fails and is reported per
 * item, none dropped; failures hold their queue slot until reported, so
 * memory stays bounded and save() says EBUSY instead of growing. */
static void test_save_backend_down(void **state) {
  const be_t *b = *state;
  ecs_ts_proc_t redis, server;
  memset(&redis, 0, sizeof redis);
  memset(&server, 0, sizeof server);
  assert_int_equal(ecs_ts_redis_start(&redis), 0);
  assert_int_equal(ecs_ts_server_start(&server, redis.port, NULL), 0);
  char dir[300];
  new_dir(dir, sizeof dir);
  ecs_ec_conn_t *c = open_at(b->backend, redis.port, server.port, dir,
                             ", \"queue_depth\": 6, \"save_timeout_ms\": 0, \"timeout_ms\": 800,"
                             " \"connect_timeout_ms\": 300");
  assert_non_null(c);
  /* take the backend away */
  if (b->backend == ECS_EC_BACKEND_ECSTORE)
    ecs_ts_kill9(&server);
  else if (b->backend == ECS_EC_BACKEND_REDIS)
    ecs_ts_kill9(&redis);
  else
    assert_int_equal(rmdir(dir), 0);

  ecs_tensor_t t = mk_tensor(8, 64, 1);
  char k[96];
  for (int i = 0; i < 6; i++) {
    key(k, sizeof k, b, "down", i);
    assert_int_equal(ecs_ec_save(c, k, &t), ECS_OK);
  }
  /* six failures, reported in two calls of three: none is lost */
  ecs_ec_save_result_t fr[3];
  size_t nf = 0;
  uint64_t t0 = ecs_now_ms();
  assert_int_equal(ecs_ec_wait_for_save(c, 10000, fr, 3, &nf), ECS_EIO);
  assert_true(ecs_now_ms() - t0 < 5000);
  assert_int_equal(nf, 3);
  for (size_t i = 0; i < nf; i++) {
    assert_true(fr[i].status < 0);
    assert_non_null(strstr(fr[i].mm_hash, "-down-"));
  }
  /* three failures still hold their slots: 3 free of 6 */
  for (int i = 0; i < 3; i++) {
    key(k, sizeof k, b, "down2", i);
    assert_int_equal(ecs_ec_save(c, k, &t), ECS_OK);
  }
  key(k, sizeof k, b, "down3", 0);
  assert_int_equal(ecs_ec_save(c, k, &t), ECS_EBUSY); /* bounded: no slot left */
  ecs_ec_save_result_t all[16];
  size_t total = 0;
  for (int round = 0; round < 4 && total < 6; round++) {
    int rc = ecs_ec_wait_for_save(c, 10000, all + total, 16 - total, &nf);
    assert_true(rc == ECS_EIO || rc == ECS_OK);
    total += nf;
  }
  assert_int_equal(total, 6);
  assert_int_equal(ecs_ec_wait_for_save(c, 0, all, 16, &nf), ECS_OK);
  assert_int_equal(nf, 0);
  ecs_ec_stats_t st;
  ecs_ec_stats(c, &st);
  assert_int_equal(st.saves, 9);
  assert_int_equal(st.saves_failed, 9);
  assert_int_equal(st.staging_in_use, 0);

  /* loads fail as misses, has() fails as an error, never "exists" */
  uint8_t buf[1024];
  ecs_ec_load_result_t r = load1(c, k, buf, sizeof buf, 0);
  assert_true(r.status < 0);
  if (b->backend != ECS_EC_BACKEND_DISK) {
    const char *hk[1] = {k};
    int out[1] = {1};
    if (b->backend == ECS_EC_BACKEND_ECSTORE) /* Redis is still up: has() asks Redis only */
      assert_int_equal(ecs_ec_has(c, hk, 1, out), ECS_OK);
    else
      assert_true(ecs_ec_has(c, hk, 1, out) < 0);
    assert_int_equal(out[0], 0);
  }
  ecs_ec_close(c);
  free((void *)t.data);
  ecs_ts_stop(&server, 5000);
  ecs_ts_stop(&redis, 5000);
}

/* A stalled backend (SIGSTOP): wait_for_save returns at its timeout, the
 * save then fails within timeout_ms and is reported. */
static void test_wait_bounded(void **state) {
  const be_t *b = *state;
  if (b->backend == ECS_EC_BACKEND_DISK) {
    printf("skip: test_wait_bounded: backend disk: a local directory cannot be stalled from here\n");
    skip();
    return;
  }
  ecs_ts_proc_t redis, server;
  memset(&redis, 0, sizeof redis);
  memset(&server, 0, sizeof server);
  assert_int_equal(ecs_ts_redis_start(&redis), 0);
  assert_int_equal(ecs_ts_server_start(&server, redis.port, NULL), 0);
  char dir[300];
  new_dir(dir, sizeof dir);
  ecs_ec_conn_t *c = open_at(b->backend, redis.port, server.port, dir, ", \"timeout_ms\": 700");
  assert_non_null(c);
  ecs_ts_proc_t *victim = b->backend == ECS_EC_BACKEND_ECSTORE ? &server : &redis;
  assert_int_equal(ecs_ts_signal(victim, SIGSTOP), 0);
  ecs_tensor_t t = mk_tensor(8, 64, 2);
  char k[96];
  key(k, sizeof k, b, "stall", 0);
  assert_int_equal(ecs_ec_save(c, k, &t), ECS_OK);
  uint64_t t0 = ecs_now_ms();
  size_t nf = 9;
  assert_int_equal(ecs_ec_wait_for_save(c, 150, NULL, 0, &nf), ECS_ETIMEDOUT);
  uint64_t el = ecs_now_ms() - t0;
  assert_true(el >= 140 && el < 600);
  assert_int_equal(ecs_ec_save_pending(c), 1);
  /* the backend's own deadline ends it */
  ecs_ec_save_result_t fr[2];
  assert_int_equal(ecs_ec_wait_for_save(c, 5000, fr, 2, &nf), ECS_EIO);
  assert_int_equal(nf, 1);
  assert_int_equal(fr[0].status, ECS_ETIMEDOUT);
  assert_string_equal(fr[0].mm_hash, k);
  assert_true(ecs_now_ms() - t0 < 3000);
  /* a load is bounded the same way */
  uint8_t buf[2048];
  t0 = ecs_now_ms();
  ecs_ec_load_result_t r = load1(c, k, buf, sizeof buf, 0);
  assert_int_equal(r.status, ECS_ETIMEDOUT);
  assert_true(ecs_now_ms() - t0 < 3000);
  /* and has(): Redis stalled is an error, never "exists" */
  if (b->backend == ECS_EC_BACKEND_REDIS) {
    const char *hk[1] = {k};
    int out[1] = {1};
    assert_int_equal(ecs_ec_has(c, hk, 1, out), ECS_ETIMEDOUT);
    assert_int_equal(out[0], 0);
  }
  assert_int_equal(ecs_ts_signal(victim, SIGCONT), 0);
  /* it recovers: the next save is stored */
  key(k, sizeof k, b, "stall", 1);
  save_wait_ok(c, k, &t);
  ecs_ec_close(c);
  free((void *)t.data);
  ecs_ts_stop(&server, 5000);
  ecs_ts_stop(&redis, 5000);
}

/* has() with Redis down or stalled: the ecstore backend asks its servers
 * instead (they hold the object, so it is there); the redis backend, whose
 * bytes live in Redis, fails with all 0. */
static void test_has_redis_down(void **state) {
  const be_t *b = *state;
  if (b->backend == ECS_EC_BACKEND_DISK) {
    printf("skip: test_has_redis_down: backend disk: its has() touches no Redis\n");
    skip();
    return;
  }
  ecs_ts_proc_t redis, server;
  memset(&redis, 0, sizeof redis);
  memset(&server, 0, sizeof server);
  assert_int_equal(ecs_ts_redis_start(&redis), 0);
  assert_int_equal(ecs_ts_server_start(&server, redis.port, NULL), 0);
  char dir[300], k[96];
  new_dir(dir, sizeof dir);
  ecs_ec_conn_t *c = open_at(b->backend, redis.port, server.port, dir, ", \"timeout_ms\": 500");
  assert_non_null(c);
  key(k, sizeof k, b, "hasdown", 0);
  ecs_tensor_t t = mk_tensor(8, 64, 3);
  save_wait_ok(c, k, &t);
  const char *hk[2] = {k, k};
  int out[2] = {0, 0};
  assert_int_equal(ecs_ec_has(c, hk, 2, out), ECS_OK);
  assert_true(out[0] && out[1]);
  int servers_answer = b->backend == ECS_EC_BACKEND_ECSTORE;
  int want = servers_answer ? 1 : 0;
  /* stalled */
  assert_int_equal(ecs_ts_signal(&redis, SIGSTOP), 0);
  out[0] = out[1] = !want;
  uint64_t t0 = ecs_now_ms();
  assert_int_equal(ecs_ec_has(c, hk, 2, out) < 0, !servers_answer);
  assert_true(ecs_now_ms() - t0 < 3000);
  assert_int_equal(out[0], want);
  assert_int_equal(out[1], want);
  assert_int_equal(ecs_ts_signal(&redis, SIGCONT), 0);
  /* gone */
  ecs_ts_kill9(&redis);
  out[0] = out[1] = !want;
  assert_int_equal(ecs_ec_has(c, hk, 2, out) < 0, !servers_answer);
  assert_int_equal(out[0], want);
  assert_int_equal(out[1], want);
  ecs_ec_stats_t st;
  ecs_ec_stats(c, &st);
  assert_int_equal(st.has_errors, servers_answer ? 0 : 2);
  ecs_ec_close(c);
  free((void *)t.data);
  ecs_ts_stop(&server, 5000);
  ecs_ts_stop(&redis, 5000);
}

/* An item that has() saw and that disappears before the load: a miss, not
 * an error or garbage.  ecstore evicts for real (a 16 MiB pool filled with
 * later saves); disk and redis lose it the way they can (file removed,
 * key expired/evicted by Redis). */
static void test_evicted_between_has_and_load(void **state) {
  const be_t *b = *state;
  ecs_ts_proc_t server;
  memset(&server, 0, sizeof server);
  static const char *const tiny[] = {"--pool-size", "16M", "--high-watermark", "1.0", "--low-watermark",
                                     "1.0",         NULL};
  int port = g_env.server.port;
  if (b->backend == ECS_EC_BACKEND_ECSTORE) {
    assert_int_equal(ecs_ts_server_start(&server, g_env.redis.port, tiny), 0);
    port = server.port;
  }
  char dir[300], k[96];
  new_dir(dir, sizeof dir);
  ecs_ec_conn_t *c = open_at(b->backend, g_env.redis.port, port, dir, ", \"staging_bytes\": \"16M\"");
  assert_non_null(c);
  key(k, sizeof k, b, "evict", 0);
  ecs_tensor_t first = mk_tensor(512, 1024, 40); /* 1 MiB */
  save_wait_ok(c, k, &first);
  const char *hk[1] = {k};
  int out[1] = {0};
  assert_int_equal(ecs_ec_has(c, hk, 1, out), ECS_OK);
  assert_int_equal(out[0], 1);

  if (b->backend == ECS_EC_BACKEND_ECSTORE) {
    /* later saves push the first object out (FIFO) */
    for (int i = 1; i <= 24; i++) {
      char k2[96];
      key(k2, sizeof k2, b, "evict", i);
      ecs_tensor_t t = mk_tensor(512, 1024, 40 + (uint32_t)i);
      assert_int_equal(ecs_ec_save(c, k2, &t), ECS_OK);
      free((void *)t.data);
    }
    assert_int_equal(ecs_ec_wait_for_save(c, 10000, NULL, 0, NULL), ECS_OK);
  } else if (b->backend == ECS_EC_BACKEND_DISK) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s.ect", dir, k);
    assert_int_equal(unlink(path), 0);
  } else {
    redisContext *r = redis_at(g_env.redis.port);
    redisReply *rep = redisCommand(r, "DEL ecs:{test}:ect:%s", k);
    assert_non_null(rep);
    assert_int_equal(rep->integer, 1);
    freeReplyObject(rep);
    redisFree(r);
  }
  uint8_t *buf = malloc(first.nbytes);
  memset(buf, 0xAB, first.nbytes);
  ecs_ec_load_result_t res = load1(c, k, buf, first.nbytes, first.nbytes);
  assert_int_equal(res.status, ECS_ENOTFOUND);
  /* and has() agrees now */
  assert_int_equal(ecs_ec_has(c, hk, 1, out), ECS_OK);
  assert_int_equal(out[0], 0);
  free(buf);
  free((void *)first.data);
  ecs_ec_close(c);
  if (server.pid)
    assert_int_equal(ecs_ts_stop(&server, 5000), 0);
}

/* Corrupt objects are misses (ECS_ECHECKSUM), never data. */
static void test_corrupt_is_miss(void **state) {
  const be_t *b = *state;
  char dir[300], k[96];
  ecs_ec_conn_t *c = open_be(b, dir, sizeof dir, NULL);
  assert_non_null(c);
  ecs_tensor_t t = mk_tensor(32, 64, 50);
  uint8_t *buf = malloc(t.nbytes);
  key(k, sizeof k, b, "corrupt", 0);
  save_wait_ok(c, k, &t);
  if (b->backend == ECS_EC_BACKEND_ECSTORE) {
    ecs_client_config_t cc;
    ecs_client_config_init(&cc);
    char servers[64];
    snprintf(servers, sizeof servers, "127.0.0.1:%d", g_env.server.port);
    cc.servers = servers;
    cc.ns = "test";
    ecs_client_t *cl = NULL;
    assert_int_equal(ecs_client_connect(&cc, &cl, NULL, 0), ECS_OK);
    assert_int_equal(ecs__client_debug_corrupt(cl, k, strlen(k)), ECS_OK);
    ecs_client_close(cl);
    assert_int_equal(load1(c, k, buf, t.nbytes, 0).status, ECS_ECHECKSUM);
  } else if (b->backend == ECS_EC_BACKEND_DISK) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s.ect", dir, k);
    /* one flipped byte in the data */
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t x;
    assert_int_equal(pread(fd, &x, 1, 128 + 100), 1);
    x ^= 0x5A;
    assert_int_equal(pwrite(fd, &x, 1, 128 + 100), 1);
    assert_int_equal(load1(c, k, buf, t.nbytes, 0).status, ECS_ECHECKSUM);
    /* truncated */
    assert_int_equal(ftruncate(fd, 128 + 10), 0);
    assert_int_equal(load1(c, k, buf, t.nbytes, 0).status, ECS_ECHECKSUM);
    /* a header of junk */
    assert_int_equal(pwrite(fd, "JUNKJUNK", 8, 0), 8);
    assert_int_equal(load1(c, k, buf, t.nbytes, 0).status, ECS_ECHECKSUM);
    /* an empty file */
    assert_int_equal(ftruncate(fd, 0), 0);
    assert_int_equal(load1(c, k, buf, t.nbytes, 0).status, ECS_ECHECKSUM);
    close(fd);
  } else {
    redisContext *r = redis_at(g_env.redis.port);
    redisReply *rep = redisCommand(r, "SETRANGE ecs:{test}:ect:%s 300 Z", k);
    assert_non_null(rep);
    freeReplyObject(rep);
    assert_int_equal(load1(c, k, buf, t.nbytes, 0).status, ECS_ECHECKSUM);
    rep = redisCommand(r, "SET ecs:{test}:ect:%s short", k);
    freeReplyObject(rep);
    assert_int_equal(load1(c, k, buf, t.nbytes, 0).status, ECS_ECHECKSUM);
    redisFree(r);
  }
  /* saving it again heals it */
  save_wait_ok(c, k, &t);
  ecs_ec_load_result_t r = load1(c, k, buf, t.nbytes, t.nbytes);
  if (b->backend == ECS_EC_BACKEND_ECSTORE && r.status != ECS_OK) {
    /* the server keeps the (corrupted) first copy for the same key */
    assert_int_equal(r.status, ECS_ECHECKSUM);
  } else {
    assert_int_equal(r.status, ECS_OK);
    assert_memory_equal(buf, t.data, t.nbytes);
  }
  free(buf);
  free((void *)t.data);
  ecs_ec_close(c);
}

/* Load handles: release while items are queued, close with a handle still
 * live (freed at its release), canceled items. */
static void test_load_lifecycle(void **state) {
  const be_t *b = *state;
  char dir[300];
  ecs_ec_conn_t *c = open_be(b, dir, sizeof dir, ", \"batch_size\": 1");
  assert_non_null(c);
  enum { N = 50 };
  ecs_ec_load_item_t it[N];
  char keys[N][96];
  uint8_t buf[N][64];
  for (int i = 0; i < N; i++) {
    key(keys[i], sizeof keys[i], b, "life", i);
    it[i] = (ecs_ec_load_item_t){keys[i], buf[i], sizeof buf[i], 0};
  }
  ecs_ec_load_t *a, *z;
  assert_int_equal(ecs_ec_start_load(c, it, N, &a), ECS_OK);
  assert_int_equal(ecs_ec_start_load(c, it, N, &z), ECS_OK);
  ecs_ec_load_release(a); /* at once: the rest is canceled */
  ecs_ec_close(c);        /* z still live: canceled, freed at release */
  ecs_ec_load_result_t res[N];
  assert_int_equal(ecs_ec_wait_for_load(z, 1000, res), ECS_OK);
  for (int i = 0; i < N; i++)
    assert_true(res[i].status == ECS_ENOTFOUND || res[i].status == ECS_ECANCELED);
  ecs_ec_load_release(z);
  ecs_ec_close(NULL);
  ecs_ec_load_release(NULL);
}

/* Configuration errors at open say what is wrong. */
static void test_open_errors(void **state) {
  (void)state;
  char js[512], err[512];
  ecs_ec_conn_t *c = NULL;
  /* nothing listens there */
  snprintf(js, sizeof js,
           "{\"servers\": \"127.0.0.1:%d\", \"redis_url\": \"127.0.0.1:%d\", \"connect_timeout_ms\": 300}",
           ecs_ts_free_port(), g_env.redis.port);
  int rc = ecs_ec_open_json(js, &c, err, sizeof err);
  assert_true(rc < 0);
  assert_null(c);
  assert_true(strlen(err) > 0);
  /* RDMA, which this machine lacks (or this build): refused at open with the key named */
  snprintf(js, sizeof js,
           "{\"servers\": \"127.0.0.1:%d\", \"redis_url\": \"127.0.0.1:%d\", \"protocol\": \"rdma\"}",
           g_env.server.port, g_env.redis.port);
  rc = ecs_ec_open_json(js, &c, err, sizeof err);
  if (rc == ECS_OK) {
    ecs_ec_close(c); /* an RDMA device exists after all */
  } else {
    assert_null(c);
    if (rc == ECS_ENOTSUP)
      assert_non_null(strstr(err, "protocol"));
  }
  /* redis backend, Redis not there */
  snprintf(js, sizeof js,
           "{\"backend\": \"redis\", \"redis_url\": \"127.0.0.1:%d\", \"connect_timeout_ms\": 300}",
           ecs_ts_free_port());
  assert_true(ecs_ec_open_json(js, &c, err, sizeof err) < 0);
  assert_non_null(strstr(err, "redis_url"));
  /* disk backend on a path that is a file */
  assert_true(
      ecs_ec_open_json("{\"backend\": \"disk\", \"disk_path\": \"/etc/hostname\"}", &c, err, sizeof err) < 0);
  assert_non_null(strstr(err, "disk_path"));
}

#define PER_BACKEND(fn)                                                                                      \
  cmocka_unit_test_prestate(fn, &be_ecstore), cmocka_unit_test_prestate(fn, &be_disk),                       \
      cmocka_unit_test_prestate(fn, &be_redis)

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      PER_BACKEND(test_roundtrip),
      PER_BACKEND(test_load_sizes_and_keys),
      PER_BACKEND(test_concurrent_roles),
      PER_BACKEND(test_save_backend_down),
      PER_BACKEND(test_wait_bounded),
      PER_BACKEND(test_has_redis_down),
      PER_BACKEND(test_evicted_between_has_and_load),
      PER_BACKEND(test_corrupt_is_miss),
      PER_BACKEND(test_load_lifecycle),
      cmocka_unit_test(test_open_errors),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
