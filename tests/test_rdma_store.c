/*
 * The store over RDMA, end to end: the real server loop (in a thread) and
 * the real client library, talking TCP for control, with the verbs calls
 * of both going to the in-process emulation (tests/support/verbs_emu.h) through
 * the ops override.  What a device would do with the bytes, the emulation
 * does with memcpy, including injected error completions.
 */
#include <pthread.h>
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

#include "ecstore/ecstore.h"
#include "store/client/client_internal.h"
#include "store/core/net.h"
#include "store/rdma/rdma.h"
#include "store/server/server.h"
#include "support/verbs_emu.h"
#include "support/fixture.h"
#include "support/raw.h"

#define MIB (1024u * 1024u)

typedef struct env {
  ecs_verbs_emu *emu;
  ecs_server_t *srv;
  pthread_t th;
  char servers[64];
} env_t;

static void *serve(void *p) {
  ecs_server_run(p);
  return NULL;
}

/* A server in this process; ndevices emulated devices; rdma "on"/"auto"/"off". */
static int start(env_t *e, int ndevices, const char *rdma) {
  memset(e, 0, sizeof *e);
  if (ecs_verbs_emu_create(ndevices, &e->emu))
    return -1;
  ecs__rdma_set_ops_override(ecs_verbs_emu_ops(e->emu));
  ecs_server_opts_t o;
  ecs_server_opts_init(&o);
  o.listen_port = 0;
  o.pool_size = 64 * MIB;
  o.lock_pool = 0;
  snprintf(o.redis_url, sizeof o.redis_url, "none");
  snprintf(o.ns, sizeof o.ns, "test");
  snprintf(o.shm_socket, sizeof o.shm_socket, "off");
  snprintf(o.rdma, sizeof o.rdma, "%s", rdma);
  int rc = ecs_server_create(&o, &e->srv);
  if (rc)
    return rc;
  snprintf(e->servers, sizeof e->servers, "127.0.0.1:%d", ecs_server_port(e->srv));
  return pthread_create(&e->th, NULL, serve, e->srv) ? -1 : 0;
}

static void stop(env_t *e) {
  if (e->srv) {
    ecs_server_stop(e->srv);
    pthread_join(e->th, NULL);
    ecs_server_destroy(e->srv);
  }
  ecs_verbs_emu_counts cnt;
  ecs_verbs_emu_get_counts(e->emu, &cnt);
  ecs__rdma_set_ops_override(NULL);
  ecs_verbs_emu_destroy(e->emu);
  /* every QP, MR, CQ and PD was released by the store */
  assert_int_equal(cnt.qps, 0);
  assert_int_equal(cnt.mrs, 0);
}

static ecs_client_t *client(const env_t *e, const char *transport) {
  ecs_client_config_t cfg;
  ecs_ts_client_config(&cfg, e->servers, transport);
  cfg.timeout_ms = 3000;
  return ecs_ts_connect(&cfg);
}

static ecs_tensor_t tensor(const void *p, uint64_t n) {
  ecs_tensor_t t;
  memset(&t, 0, sizeof t);
  t.data = p;
  t.nbytes = n;
  t.desc.dtype = ECS_DTYPE_U8;
  t.desc.ndim = 1;
  t.desc.shape[0] = n;
  return t;
}

static uint64_t in_use(ecs_client_t *c) {
  ecs_server_stat_t st;
  assert_int_equal(ecs_stat(c, 0, &st), ECS_OK);
  return st.bytes_in_use;
}

/* ------------------------------------------------------------------ */

static void test_round_trips(void **state) {
  (void)state;
  env_t e;
  assert_int_equal(start(&e, 1, "on"), 0);
  ecs_client_t *c = client(&e, "rdma");
  assert_non_null(c);
  assert_string_equal(ecs_client_transport(c), "rdma");
  /* a small object, a large one that the transport slices, an empty one */
  size_t big = 9 * MIB + 13;
  uint8_t *a = malloc(1000), *b = malloc(big), *oa = malloc(1000), *ob = malloc(big);
  ecs_ts_fill(a, 1000, 1);
  ecs_ts_fill(b, big, 2);
  assert_int_equal(ecs_register_buffer(c, b, big), ECS_OK); /* registered source */
  assert_int_equal(ecs_register_buffer(c, b, big), ECS_EBUSY);
  ecs_key_t k[3] = {{"small", 5}, {"big", 3}, {"empty", 5}};
  ecs_tensor_t t[3] = {tensor(a, 1000), tensor(b, big), tensor(NULL, 0)};
  int st[3];
  assert_int_equal(ecs_put_batch(c, k, t, 3, st), ECS_OK);
  for (int i = 0; i < 3; i++)
    assert_int_equal(st[i], ECS_OK);
  assert_int_equal(ecs_put_batch(c, k, t, 3, st), ECS_OK); /* idempotent */
  assert_int_equal(st[1], ECS_OK);
  assert_int_equal(ecs_register_buffer(c, ob, big), ECS_OK); /* registered destination */
  ecs_key_t gk[4] = {k[0], k[1], k[2], {"missing", 7}};
  ecs_get_buf_t g[4] = {{.data = oa, .capacity = 1000},
                        {.data = ob, .capacity = big},
                        {.data = NULL},
                        {.data = oa, .capacity = 1000}};
  assert_int_equal(ecs_get_batch(c, gk, g, 4), ECS_OK);
  assert_int_equal(g[0].status, ECS_OK);
  assert_memory_equal(oa, a, 1000);
  assert_int_equal(g[1].status, ECS_OK);
  assert_int_equal(g[1].nbytes, big);
  assert_memory_equal(ob, b, big);
  assert_int_equal(g[2].status, ECS_OK);
  assert_int_equal(g[2].nbytes, 0);
  assert_int_equal(g[3].status, ECS_ENOTFOUND);
  /* unregistered destinations work too (registered for the call) */
  uint8_t *tmp = malloc(big);
  ecs_get_buf_t u = {.data = tmp, .capacity = big};
  assert_int_equal(ecs_get_batch(c, &k[1], &u, 1), ECS_OK);
  assert_int_equal(u.status, ECS_OK);
  assert_memory_equal(tmp, b, big);
  /* too small a buffer says what it needs; alloc gets it all */
  u.capacity = 10;
  assert_int_equal(ecs_get_batch(c, &k[1], &u, 1), ECS_OK);
  assert_int_equal(u.status, ECS_EBUFSMALL);
  assert_int_equal(u.nbytes, big);
  ecs_get_buf_t al;
  memset(&al, 0, sizeof al);
  assert_int_equal(ecs_get_batch_alloc(c, &k[0], &al, 1), ECS_OK);
  assert_int_equal(al.status, ECS_OK);
  assert_memory_equal(al.data, a, 1000);
  ecs_free(al.data);
  /* views need shared memory */
  ecs_view_t v;
  assert_int_equal(ecs_get_view_batch(c, &k[0], &v, 1), ECS_OK);
  assert_int_equal(v.status, ECS_ENOTSUP);
  assert_int_equal(ecs_unregister_buffer(c, ob), ECS_OK);
  assert_int_equal(ecs_unregister_buffer(c, ob), ECS_ENOTFOUND);
  /* leases are all released: only the two stored objects use the pool */
  assert_int_equal(in_use(c), 4096 + ((big + 4095) / 4096) * 4096);
  ecs_client_close(c);
  free(a);
  free(b);
  free(oa);
  free(ob);
  free(tmp);
  stop(&e);
}

/* Objects compressed by a TCP writer come back raw over RDMA. */
static void test_compressed_over_rdma(void **state) {
  (void)state;
  env_t e;
  assert_int_equal(start(&e, 1, "on"), 0);
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.servers = e.servers;
  cfg.ns = "test";
  cfg.transport = "tcp";
  cfg.compression = "zstd";
  ecs_client_t *w;
  assert_int_equal(ecs_client_connect(&cfg, &w, NULL, 0), ECS_OK);
  size_t n = MIB;
  uint8_t *z = calloc(1, n), *out = malloc(n);
  for (size_t i = 0; i < n; i += 7)
    z[i] = (uint8_t)i; /* compressible */
  ecs_key_t k = {"zipped", 6};
  ecs_tensor_t t = tensor(z, n);
  int st;
  assert_int_equal(ecs_put_batch(w, &k, &t, 1, &st), ECS_OK);
  assert_int_equal(st, ECS_OK);
  assert_true(in_use(w) < n / 2);
  ecs_client_t *r = client(&e, "rdma");
  assert_non_null(r);
  ecs_get_buf_t b = {.data = out, .capacity = n};
  assert_int_equal(ecs_get_batch(r, &k, &b, 1), ECS_OK);
  assert_int_equal(b.status, ECS_OK);
  assert_int_equal(b.nbytes, n);
  assert_memory_equal(out, z, n);
  ecs_client_close(r);
  ecs_client_close(w);
  free(z);
  free(out);
  stop(&e);
}

/* An error completion fails its item, never returns garbage, and the next
 * call works on a rebuilt QP; the pins are released either way. */
static void test_error_completions(void **state) {
  (void)state;
  env_t e;
  assert_int_equal(start(&e, 1, "on"), 0);
  ecs_client_t *c = client(&e, "rdma");
  assert_non_null(c);
  enum { N = 3, SZ = 300000 };
  static uint8_t data[N][SZ], out[N][SZ];
  char names[N][8];
  ecs_key_t k[N];
  ecs_tensor_t t[N];
  ecs_get_buf_t g[N];
  int st[N];
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "e%d", i);
    k[i].data = names[i];
    k[i].len = strlen(names[i]);
    ecs_ts_fill(data[i], SZ, 10 + (uint32_t)i);
    t[i] = tensor(data[i], SZ);
  }
  assert_int_equal(ecs_put_batch(c, k, t, N, st), ECS_OK);
  uint64_t base = in_use(c);
  static const ecs_emu_fail fails[] = {ECS_EMU_FAIL_RETRY_EXC, ECS_EMU_FAIL_QP_ERR};
  for (size_t f = 0; f < 2; f++) {
    uint32_t qpn;
    assert_int_equal(ecs__client_rdma_qpn(c, 0, &qpn), ECS_OK);
    assert_int_equal(ecs_verbs_emu_inject(e.emu, qpn, fails[f], 0), ECS_OK);
    memset(out, 0, sizeof out);
    for (int i = 0; i < N; i++) {
      g[i].data = out[i];
      g[i].capacity = SZ;
    }
    assert_int_equal(ecs_get_batch(c, k, g, N), ECS_OK);
    for (int i = 0; i < N; i++) {
      if (g[i].status == ECS_OK)
        assert_memory_equal(out[i], data[i], SZ); /* what succeeds is right */
      else
        assert_int_equal(g[i].nbytes, 0); /* a failure is an error, never bytes */
    }
    /* the error completion happened: the endpoint rebuilt its QP (and the
     * call retried on it, so items may all have succeeded) */
    uint32_t qpn2;
    assert_int_equal(ecs__client_rdma_qpn(c, 0, &qpn2), ECS_OK);
    assert_int_not_equal(qpn2, qpn);
    /* the next call runs on a fresh QP */
    assert_int_equal(ecs_get_batch(c, k, g, N), ECS_OK);
    for (int i = 0; i < N; i++) {
      assert_int_equal(g[i].status, ECS_OK);
      assert_memory_equal(out[i], data[i], SZ);
    }
    assert_int_equal(in_use(c), base); /* no pin left behind */
  }
  /* a stalled NIC: the call ends at its deadline with per-item timeouts,
   * and the next call works on a rebuilt QP */
  uint32_t sq;
  assert_int_equal(ecs__client_rdma_qpn(c, 0, &sq), ECS_OK);
  assert_int_equal(ecs_verbs_emu_inject(e.emu, sq, ECS_EMU_FAIL_STALL, 0), ECS_OK);
  for (int i = 0; i < N; i++) {
    g[i].data = out[i];
    g[i].capacity = SZ;
  }
  uint64_t t0 = ecs_now_ms();
  assert_int_equal(ecs_get_batch(c, k, g, N), ECS_OK);
  uint64_t dt = ecs_now_ms() - t0;
  assert_true(dt < 3000 + 1000); /* the client's 3 s deadline, plus the drain */
  for (int i = 0; i < N; i++)
    assert_int_equal(g[i].status, ECS_ETIMEDOUT);
  assert_int_equal(ecs_get_batch(c, k, g, N), ECS_OK);
  for (int i = 0; i < N; i++)
    assert_int_equal(g[i].status, ECS_OK);
  assert_int_equal(in_use(c), base);
  /* a put whose WRITE fails is aborted: nothing stored, nothing leaked */
  uint32_t qpn;
  assert_int_equal(ecs__client_rdma_qpn(c, 0, &qpn), ECS_OK);
  assert_int_equal(ecs_verbs_emu_inject(e.emu, qpn, ECS_EMU_FAIL_RETRY_EXC, 0), ECS_OK);
  ecs_key_t nk = {"never", 5};
  assert_int_equal(ecs_put_batch(c, &nk, &t[0], 1, st), ECS_OK);
  if (st[0] != ECS_OK) { /* failed: it must not exist, and its block is back */
    int ex = 1;
    assert_int_equal(ecs_exists_batch(c, &nk, 1, &ex), ECS_OK);
    assert_int_equal(ex, 0);
    assert_int_equal(in_use(c), base);
  } else { /* retried on a rebuilt QP: then it must be intact */
    ecs_get_buf_t one = {.data = out[0], .capacity = SZ};
    assert_int_equal(ecs_get_batch(c, &nk, &one, 1), ECS_OK);
    assert_int_equal(one.status, ECS_OK);
    assert_memory_equal(out[0], data[0], SZ);
  }
  ecs_client_close(c);
  stop(&e);
}

/* No device, or a server without RDMA: one line, then tcp. */
static void test_fallbacks(void **state) {
  (void)state;
  env_t e;
  assert_int_equal(start(&e, 0, "on"), ECS_ENODEV); /* --rdma on refuses to start */
  ecs_server_destroy(e.srv);
  e.srv = NULL;
  stop(&e);
  assert_int_equal(start(&e, 0, "auto"), 0); /* auto serves tcp */
  ecs_client_t *c = client(&e, "rdma");
  assert_non_null(c);
  assert_string_equal(ecs_client_transport(c), "tcp");
  uint8_t a[100] = {1};
  ecs_key_t k = {"x", 1};
  ecs_tensor_t t = tensor(a, sizeof a);
  int st;
  assert_int_equal(ecs_put_batch(c, &k, &t, 1, &st), ECS_OK);
  assert_int_equal(st, ECS_OK);
  ecs_client_close(c);
  stop(&e);
  /* the client has a device, the server does not serve RDMA */
  assert_int_equal(start(&e, 1, "off"), 0);
  c = client(&e, "rdma");
  assert_non_null(c);
  assert_string_equal(ecs_client_transport(c), "tcp");
  assert_int_equal(ecs_ping(c), ECS_OK);
  ecs_client_close(c);
  stop(&e);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trips),
      cmocka_unit_test(test_compressed_over_rdma),
      cmocka_unit_test(test_error_completions),
      cmocka_unit_test(test_fallbacks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
