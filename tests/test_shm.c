/*
 * The shared-memory path: views, leases under eviction pressure, clients
 * that die holding leases or reservations, lease expiry, read-only maps,
 * peer credentials, and transport selection.  Real redis-server and
 * ecstore-server processes.
 */
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ecstore/ecstore.h"
#include "store/client/client_internal.h"
#include "store/core/net.h"
#include "store/core/proto.h"
#include "support/fixture.h"
#include "support/raw.h"
#include "support/ts.h"

#define MIB (1024u * 1024u)

typedef ecs_ts_env_t env_t; /* Redis and the server (support/fixture.h) */

static ecs_client_t *client(const env_t *e, const char *transport, int read_only) {
  ecs_client_config_t cfg;
  ecs_ts_client_config(&cfg, e->servers, transport);
  cfg.shm_read_only = read_only;
  return ecs_ts_connect(&cfg);
}

static int put1(ecs_client_t *c, const char *key, const void *data, uint64_t n) {
  return ecs_ts_put1(c, key, data, n, ECS_DTYPE_U8);
}

/* Waits (bounded) until the server's pool usage is back to bytes. */
static uint64_t wait_usage(ecs_client_t *c, uint64_t bytes) {
  ecs_server_stat_t st = ecs_ts_stat0(c);
  for (int i = 0; i < 150 && st.bytes_in_use != bytes; i++) {
    usleep(20000);
    st = ecs_ts_stat0(c);
  }
  return st.bytes_in_use;
}

/* ------------------------------------------------------------------ */

static void test_views_zero_copy(void **state) {
  (void)state;
  env_t e;
  assert_int_equal(ecs_ts_env_start(&e, NULL), 0);
  ecs_client_t *c = client(&e, "shm", 0);
  assert_non_null(c);
  assert_string_equal(ecs_client_transport(c), "shm");
  enum { N = 16 };
  static uint8_t data[N][100000];
  char names[N][16];
  ecs_key_t keys[N + 1];
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "view-%d", i);
    keys[i].data = names[i];
    keys[i].len = strlen(names[i]);
    ecs_ts_fill(data[i], sizeof data[i], (uint32_t)i);
    assert_int_equal(put1(c, names[i], data[i], sizeof data[i]), ECS_OK);
  }
  keys[N].data = "missing";
  keys[N].len = 7;
  ecs_view_t v[N + 1];
  assert_int_equal(ecs_get_view_batch(c, keys, v, N + 1), ECS_OK);
  for (int i = 0; i < N; i++) {
    assert_int_equal(v[i].status, ECS_OK);
    assert_int_equal(v[i].nbytes, sizeof data[i]);
    assert_int_equal(v[i].desc.shape[0], sizeof data[i]);
    assert_memory_equal(v[i].data, data[i], sizeof data[i]);
  }
  assert_int_equal(v[N].status, ECS_ENOTFOUND);
  /* a viewed object survives removal until its view is released */
  ecs_server_stat_t before = ecs_ts_stat0(c);
  int st;
  assert_int_equal(ecs_remove_batch(c, &keys[0], 1, &st), ECS_OK);
  assert_int_equal(st, ECS_OK);
  assert_memory_equal(v[0].data, data[0], sizeof data[0]);
  assert_int_equal(ecs_ts_stat0(c).bytes_in_use, before.bytes_in_use);
  assert_int_equal(ecs_view_release(c, v, N + 1), ECS_OK);
  assert_true(wait_usage(c, before.bytes_in_use - 25 * 4096) == before.bytes_in_use - 25 * 4096);
  ecs_client_close(c);
  assert_int_equal(ecs_ts_env_stop(&e), 0);
}

/* Readers hold views while a writer pushes the pool into eviction: a held
 * object is never freed, and its bytes never change while held. */
typedef struct holder {
  const char *servers;
  atomic_int stop;
  atomic_long checked, bad; /* shared by every holder thread */
} holder_t;

static void *holder_main(void *p) {
  holder_t *h = p;
  env_t e;
  memset(&e, 0, sizeof e);
  snprintf(e.servers, sizeof e.servers, "%s", h->servers);
  ecs_client_t *c = client(&e, "shm", 1);
  if (!c) {
    h->bad++;
    return NULL;
  }
  uint8_t *want = malloc(MIB);
  unsigned seed = 7;
  while (!h->stop) {
    int i = (int)(rand_r(&seed) % 48);
    char key[32];
    snprintf(key, sizeof key, "press-%d", i);
    ecs_key_t k = {key, strlen(key)};
    ecs_view_t v;
    if (ecs_get_view_batch(c, &k, &v, 1) != ECS_OK) {
      h->bad++;
      break;
    }
    if (v.status == ECS_OK) {
      ecs_ts_fill(want, MIB, 9000 + (uint32_t)i);
      for (int round = 0; round < 3; round++) { /* held across the writer's evictions */
        if (v.nbytes != MIB || memcmp(v.data, want, MIB) != 0)
          h->bad++;
        usleep(2000);
      }
      h->checked++;
    }
    ecs_view_release(c, &v, 1);
  }
  free(want);
  ecs_client_close(c);
  return NULL;
}

static void test_leases_under_eviction(void **state) {
  (void)state;
  env_t e;
  static const char *const extra[] = {"--pool-size", "16M", "--high-watermark", "1.0", "--low-watermark",
                                      "1.0",         NULL};
  assert_int_equal(ecs_ts_env_start(&e, extra), 0);
  ecs_client_t *w = client(&e, "shm", 0);
  assert_non_null(w);
  uint8_t *obj = malloc(MIB);
  holder_t h = {.servers = e.servers};
  pthread_t th[2];
  for (int i = 0; i < 48; i++) {
    char key[32];
    snprintf(key, sizeof key, "press-%d", i);
    ecs_ts_fill(obj, MIB, 9000 + (uint32_t)i);
    int rc = put1(w, key, obj, MIB);
    /* with views held, a put may find nothing evictable: a clear ENOSPC */
    assert_true(rc == ECS_OK || rc == ECS_ENOSPC);
    if (i == 6)
      for (int t = 0; t < 2; t++)
        assert_int_equal(pthread_create(&th[t], NULL, holder_main, &h), 0);
  }
  h.stop = 1;
  for (int t = 0; t < 2; t++)
    pthread_join(th[t], NULL);
  free(obj);
  assert_int_equal(h.bad, 0);
  assert_true(h.checked > 0);
  assert_true(ecs_ts_stat0(w).evictions > 0);
  ecs_client_close(w);
  assert_int_equal(ecs_ts_env_stop(&e), 0);
}

/* A child that holds a lease and a reservation, then dies by SIGKILL. */
static void child_hold_and_die(const env_t *e, const char *key, int ready_fd) {
  ecs_client_t *c = client(e, "shm", 0);
  if (!c)
    _exit(3);
  ecs_key_t k = {key, strlen(key)};
  ecs_view_t v;
  if (ecs_get_view_batch(c, &k, &v, 1) != ECS_OK || v.status != ECS_OK)
    _exit(4);
  /* a raw reservation on a second client's (upgraded) Unix socket:
   * RESERVE, never COMMIT */
  ecs_client_t *c2 = client(e, "shm", 0);
  int fd = c2 ? ecs__client_server_fd(c2, 0) : -1;
  if (fd < 0)
    _exit(5);
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_hdr_t hd = {.magic = ECS_PROTO_MAGIC, .version = ECS_PROTO_VERSION, .req_id = 1000};
  uint8_t hb[32];
  uint8_t rb[32 + 512];
  ecs_hdr_t rh;
  ecs_wbuf_reset(&w);
  ecs_put_item_t it = {
      .key = (const uint8_t *)"reserved-by-dead", .key_len = 16, .nbytes = 4 * MIB, .raw_nbytes = 4 * MIB};
  it.desc.dtype = ECS_DTYPE_U8;
  it.desc.ndim = 1;
  it.desc.shape[0] = 4 * MIB;
  ecs_proto_put_item_write(&w, &it);
  hd.opcode = ECS_OP_RESERVE;
  hd.count = 1;
  hd.meta_len = (uint32_t)w.len;
  ecs_proto_hdr_encode(&hd, hb);
  struct iovec iov2[2] = {{hb, 32}, {w.p, w.len}};
  if (ecs_net_writev_all(fd, iov2, 2, ecs_now_ms() + 2000) ||
      ecs_net_read_all(fd, rb, 32, ecs_now_ms() + 2000))
    _exit(9);
  if (ecs_proto_hdr_decode(rb, UINT64_MAX, &rh) || rh.status != ECS_OK || rh.meta_len > 512 ||
      ecs_net_read_all(fd, rb + 32, rh.meta_len, ecs_now_ms() + 2000))
    _exit(10);
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, rb + 32, rh.meta_len);
  ecs_reserve_reply_t rr;
  if (ecs_proto_reserve_reply_read(&r, &rr) || rr.status != ECS_OK)
    _exit(11);
  char ok = 1;
  if (write(ready_fd, &ok, 1) != 1)
    _exit(12);
  pause(); /* killed here, holding both */
  _exit(0);
}

static void test_client_killed_holding_pins(void **state) {
  (void)state;
  env_t e;
  assert_int_equal(ecs_ts_env_start(&e, NULL), 0);
  ecs_client_t *c = client(&e, "shm", 0);
  assert_non_null(c);
  ecs_server_stat_t base = ecs_ts_stat0(c);
  uint8_t *obj = malloc(MIB);
  ecs_ts_fill(obj, MIB, 1);
  assert_int_equal(put1(c, "leased-by-dead", obj, MIB), ECS_OK);
  free(obj);
  int p[2];
  assert_int_equal(pipe(p), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    child_hold_and_die(&e, "leased-by-dead", p[1]);
  }
  close(p[1]);
  char ok = 0;
  assert_int_equal(read(p[0], &ok, 1), 1);
  close(p[0]);
  /* held: the leased object (1 MiB) and the reservation (4 MiB) */
  ecs_key_t k = {"leased-by-dead", 14};
  int st;
  assert_int_equal(ecs_remove_batch(c, &k, 1, &st), ECS_OK); /* doomed, still pinned */
  assert_int_equal(ecs_ts_stat0(c).bytes_in_use, base.bytes_in_use + 5 * MIB);
  kill(pid, SIGKILL);
  int ws;
  waitpid(pid, &ws, 0);
  /* the server notices the closed sockets and unpins everything */
  assert_int_equal(wait_usage(c, base.bytes_in_use), base.bytes_in_use);
  assert_int_equal(ecs_ts_stat0(c).objects, base.objects);
  ecs_client_close(c);
  assert_int_equal(ecs_ts_env_stop(&e), 0);
}

static void test_lease_expiry(void **state) {
  (void)state;
  env_t e;
  static const char *const extra[] = {"--lease-timeout-ms", "300", NULL};
  assert_int_equal(ecs_ts_env_start(&e, extra), 0);
  ecs_client_t *c = client(&e, "shm", 0);
  assert_non_null(c);
  ecs_server_stat_t base = ecs_ts_stat0(c);
  uint8_t *obj = calloc(1, MIB);
  assert_int_equal(put1(c, "forgotten", obj, MIB), ECS_OK);
  free(obj);
  ecs_key_t k = {"forgotten", 9};
  ecs_view_t v;
  assert_int_equal(ecs_get_view_batch(c, &k, &v, 1), ECS_OK);
  assert_int_equal(v.status, ECS_OK);
  int st;
  assert_int_equal(ecs_remove_batch(c, &k, 1, &st), ECS_OK);
  /* never released: the server drops the pin after 300 ms */
  assert_int_equal(wait_usage(c, base.bytes_in_use), base.bytes_in_use);
  assert_int_equal(ecs_view_release(c, &v, 1), ECS_OK); /* late release is harmless */
  assert_int_equal(ecs_ping(c), ECS_OK);
  ecs_client_close(c);
  assert_int_equal(ecs_ts_env_stop(&e), 0);
}

static void test_read_only_and_copy_paths(void **state) {
  (void)state;
  env_t e;
  assert_int_equal(ecs_ts_env_start(&e, NULL), 0);
  ecs_client_t *ro = client(&e, "shm", 1);
  assert_non_null(ro);
  assert_string_equal(ecs_client_transport(ro), "shm");
  uint8_t a[70000], out[70000];
  ecs_ts_fill(a, sizeof a, 4);
  /* a read-only map: puts go through the socket, gets through the map */
  assert_int_equal(put1(ro, "ro-put", a, sizeof a), ECS_OK);
  ecs_key_t k = {"ro-put", 6};
  ecs_get_buf_t b = {.data = out, .capacity = sizeof out};
  assert_int_equal(ecs_get_batch(ro, &k, &b, 1), ECS_OK);
  assert_int_equal(b.status, ECS_OK);
  assert_memory_equal(out, a, sizeof a);
  /* a too-small buffer says what it needs */
  b.capacity = 10;
  assert_int_equal(ecs_get_batch(ro, &k, &b, 1), ECS_OK);
  assert_int_equal(b.status, ECS_EBUFSMALL);
  assert_int_equal(b.nbytes, sizeof a);
  ecs_get_buf_t al;
  memset(&al, 0, sizeof al);
  assert_int_equal(ecs_get_batch_alloc(ro, &k, &al, 1), ECS_OK);
  assert_int_equal(al.status, ECS_OK);
  assert_memory_equal(al.data, a, sizeof a);
  ecs_free(al.data);
  ecs_client_close(ro);
  /* the tcp client sees what the shm client wrote, and views need shm */
  ecs_client_t *tc = client(&e, "tcp", 0);
  assert_non_null(tc);
  assert_string_equal(ecs_client_transport(tc), "tcp");
  ecs_view_t v;
  assert_int_equal(ecs_get_view_batch(tc, &k, &v, 1), ECS_OK);
  assert_int_equal(v.status, ECS_ENOTSUP);
  ecs_client_close(tc);
  assert_int_equal(ecs_ts_env_stop(&e), 0);
}

static void test_transport_selection(void **state) {
  (void)state;
  env_t e;
  static const char *const extra[] = {"--shm-socket", "off", NULL};
  assert_int_equal(ecs_ts_env_start(&e, extra), 0);
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.servers = e.servers;
  cfg.ns = "test";
  cfg.transport = "shm";
  ecs_client_t *c = NULL;
  char err[256];
  assert_int_equal(ecs_client_connect(&cfg, &c, err, sizeof err), ECS_ENOTSUP);
  assert_non_null(strstr(err, "shared memory"));
  cfg.transport = "auto"; /* falls back to tcp */
  assert_int_equal(ecs_client_connect(&cfg, &c, err, sizeof err), ECS_OK);
  assert_string_equal(ecs_client_transport(c), "tcp");
  ecs_client_close(c);
  cfg.transport = "carrier-pigeon";
  assert_int_equal(ecs_client_connect(&cfg, &c, err, sizeof err), ECS_EINVAL);
  assert_non_null(strstr(err, "carrier-pigeon"));
  assert_int_equal(ecs_ts_env_stop(&e), 0);
}

/* A peer running as a user the server does not let map its pool (not in
 * --shm-allow-uid) is served by copy over the Unix socket, transport
 * "unix" (needs root to switch users: it runs as its own ctest entry,
 * test_shm_root, see main; test_shm_attack has the attacks). */
static void test_peer_uid_refused(void **state) {
  (void)state;
  assert_int_equal(geteuid(), 0);
  env_t e;
  assert_int_equal(ecs_ts_env_start(&e, NULL), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (setuid(65534) != 0)
      _exit(2);
    ecs_client_config_t cfg;
    ecs_client_config_init(&cfg);
    cfg.servers = e.servers;
    cfg.ns = "test";
    cfg.transport = "shm";
    cfg.timeout_ms = 2000;
    ecs_client_t *c = NULL;
    char err[256] = "";
    int rc = ecs_client_connect(&cfg, &c, err, sizeof err);
    if (rc != ECS_OK) {
      fprintf(stderr, "connect: %s\n", err);
      _exit(1);
    }
    if (strcmp(ecs_client_transport(c), "unix") != 0) {
      fprintf(stderr, "transport %s, not unix (a pool map?)\n", ecs_client_transport(c));
      _exit(3);
    }
    ecs_client_close(c);
    _exit(0);
  }
  int ws;
  assert_int_equal(waitpid(pid, &ws, 0), pid);
  assert_true(WIFEXITED(ws));
  assert_int_equal(WEXITSTATUS(ws), 0);
  assert_int_equal(ecs_ts_env_stop(&e), 0);
}

/* Tests that need root run as their own ctest entry (--root-only), which
 * exits 77 with a "skip:" line saying why when not root; the plain run
 * leaves them out.  So a skip shows in ctest, never as a silent pass. */
#define ROOT_ONLY "test_peer_uid_refused"

/* The server lock's held time (its /metrics counter) across one put of
 * n bytes by c under key; the object is removed again outside the
 * measurement, so that every put measured finds the same empty pool. */
static double held_across_put(ecs_client_t *c, int mport, const char *key, const void *obj, size_t n) {
  double held0 = ecs_ts_metric(mport, "ecstore_lock_held_microseconds_total");
  assert_true(held0 >= 0);
  assert_int_equal(put1(c, key, obj, n), ECS_OK);
  double held = ecs_ts_metric(mport, "ecstore_lock_held_microseconds_total") - held0;
  ecs_key_t k = {key, strlen(key)};
  int st;
  assert_int_equal(ecs_remove_batch(c, &k, 1, &st), ECS_OK);
  assert_int_equal(st, ECS_OK);
  return held;
}

/* A shm put's COMMIT hashes the bytes the client wrote without holding the
 * server lock.  The lock's held time across the put of a 128 MiB object
 * over shm is set against the same put over tcp (whose payload was always
 * hashed outside the lock; both pay the same reserve, commit and, under
 * ASan, poisoning under the lock) and against the time hashing the
 * object takes.  The old server held the lock through the hashing: its shm
 * put held it at least that much longer. */
static void test_commit_hashes_outside_lock(void **state) {
  (void)state;
  env_t e;
  int mport = ecs_ts_free_port();
  char mlisten[32];
  snprintf(mlisten, sizeof mlisten, "127.0.0.1:%d", mport);
  const char *const extra[] = {"--pool-size", "256M", "--metrics-listen", mlisten, NULL};
  assert_int_equal(ecs_ts_env_start(&e, extra), 0);
  ecs_client_t *c = client(&e, "shm", 0), *tc = client(&e, "tcp", 0);
  assert_non_null(c);
  assert_non_null(tc);
  assert_string_equal(ecs_client_transport(c), "shm");
  assert_string_equal(ecs_client_transport(tc), "tcp");
  const size_t n = 128u * MIB;
  uint8_t *obj = malloc(n);
  assert_non_null(obj);
  for (size_t i = 0; i < n; i += 8)
    memcpy(obj + i, &i, 8);
  /* Timed on a shared host, so up to five tries, each against timings
   * taken right before it: one quiet try shows it. */
  int quiet = 0;
  for (int attempt = 0; attempt < 5 && !quiet; attempt++) {
    double hash_us = 1e30; /* the fastest of three: a lower bound on the server's */
    for (int r = 0; r < 3; r++) {
      struct timespec t0, t1;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      volatile uint64_t h = ecs_checksum(obj, n);
      (void)h;
      clock_gettime(CLOCK_MONOTONIC, &t1);
      double us = (double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3;
      hash_us = us < hash_us ? us : hash_us;
    }
    double held_tcp = held_across_put(tc, mport, "big-tcp", obj, n);
    double held_shm = held_across_put(c, mport, "big-shm", obj, n);
    print_message(
        "lock held across a 128 MiB put: %.0f us over shm, %.0f us over tcp; hashing it takes %.0f us\n",
        held_shm, held_tcp, hash_us);
    quiet = held_shm < held_tcp + hash_us / 2 && held_shm < hash_us;
  }
  assert_true(quiet);
  /* and a shm put's object is whole */
  assert_int_equal(put1(c, "big", obj, n), ECS_OK);
  ecs_key_t k = {"big", 3};
  uint8_t *back = malloc(n);
  assert_non_null(back);
  ecs_get_buf_t b = {.data = back, .capacity = n};
  assert_int_equal(ecs_get_batch(c, &k, &b, 1), ECS_OK);
  assert_int_equal(b.status, ECS_OK);
  assert_true(b.nbytes == n && memcmp(back, obj, n) == 0);
  free(back);
  free(obj);
  ecs_client_close(tc);
  ecs_client_close(c);
  assert_int_equal(ecs_ts_env_stop(&e), 0);
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  if (argc > 1 && strcmp(argv[1], "--root-only") == 0) {
    if (geteuid() != 0) {
      printf("skip: %s needs root (it switches to another uid)\n", ROOT_ONLY);
      return 77;
    }
    cmocka_set_test_filter(ROOT_ONLY);
  } else {
    cmocka_set_skip_filter(ROOT_ONLY);
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_views_zero_copy),
      cmocka_unit_test(test_leases_under_eviction),
      cmocka_unit_test(test_client_killed_holding_pins),
      cmocka_unit_test(test_lease_expiry),
      cmocka_unit_test(test_read_only_and_copy_paths),
      cmocka_unit_test(test_transport_selection),
      cmocka_unit_test(test_peer_uid_refused),
      cmocka_unit_test(test_commit_hashes_outside_lock),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
