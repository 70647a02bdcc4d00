/*
 * "Never a hang" (ARCHITECTURE.md, principle 4), server side: a peer that
 * stalls in the middle of a request header, its records or a PUT payload,
 * or that never reads its GET reply, is dropped within the server's
 * --io-timeout-ms, and the server keeps serving everyone else meanwhile.
 * A PUT dropped mid-payload gives its reservation back to the pool, and a
 * GET dropped mid-reply its references.
 *
 * The timeout here is 300 ms.  Bounds are generous (a loaded 2-core
 * machine, ASan) but far below what a wrong unit would give (300 s): a
 * drop must come after at least most of the timeout and within
 * DROP_BOUND_MS.  These are deadlines, not speed assertions.
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

#include "ecstore/ecstore.h"
#include "store/core/net.h"
#include "store/core/proto.h"
#include "support/raw.h"
#include "support/fixture.h"
#include "support/ts.h"

#define MIB (1024u * 1024u)
#define IO_TIMEOUT_MS 300
#define DROP_MIN_MS (IO_TIMEOUT_MS - 50) /* the server ticks every 100 ms; never early */
#define DROP_BOUND_MS 6000               /* generous, and 50x below the wrong unit */

/* Redis, the server and e->c, one well-behaved client (no e->cr: the
 * tests count the server's connections). */
typedef ecs_ts_env_t env_t;

static int setup(void **state) {
  env_t *e = calloc(1, sizeof *e);
  static const char *const extra[] = {"--io-timeout-ms", "300", NULL};
  if (!e || ecs_ts_env_start(e, extra)) {
    free(e);
    return -1;
  }
  ecs_client_config_t cfg;
  ecs_ts_client_config(&cfg, e->servers, "tcp");
  if (!(e->c = ecs_ts_connect(&cfg))) {
    ecs_ts_env_stop(e);
    free(e);
    return -1;
  }
  *state = e;
  return 0;
}

static int raw_open(const env_t *e) {
  int fd = -1;
  assert_int_equal(ecs_ts_raw_open(e->server.port, "test", &fd), ECS_OK);
  return fd;
}

/* While a peer stalls, others are served: a put and a get round trip,
 * done while the stalled peer is still connected (STAT counts it). */
static void others_served(env_t *e, const char *key, uint32_t stalled_conns) {
  uint8_t a[4096], b[4096];
  ecs_ts_fill(a, sizeof a, (uint32_t)strlen(key));
  ecs_key_t k = {key, strlen(key)};
  ecs_tensor_t t = {.data = a, .nbytes = sizeof a};
  t.desc.dtype = ECS_DTYPE_U8;
  t.desc.ndim = 1;
  t.desc.shape[0] = sizeof a;
  int st;
  assert_int_equal(ecs_put_batch(e->c, &k, &t, 1, &st), ECS_OK);
  assert_int_equal(st, ECS_OK);
  ecs_get_buf_t g = {.data = b, .capacity = sizeof b};
  assert_int_equal(ecs_get_batch(e->c, &k, &g, 1), ECS_OK);
  assert_int_equal(g.status, ECS_OK);
  assert_memory_equal(a, b, sizeof a);
  /* served while the stalled peer was still there, not after its drop */
  assert_int_equal(ecs_ts_stat0(e->c).connections, 1 + stalled_conns);
}

/* Waits for the server to drop fd, stalled since t_stall (monotonic ms);
 * asserts the drop came in the window. */
static void expect_dropped(int fd, uint64_t t_stall) {
  long w = ecs_ts_raw_wait_close(fd, DROP_BOUND_MS);
  long ms = w < 0 ? -1 : (long)(ecs_now_ms() - t_stall);
  if (ms < 0)
    fail_msg("a stalled connection was still open after %d ms (--io-timeout-ms %d)", DROP_BOUND_MS,
             IO_TIMEOUT_MS);
  if (ms < DROP_MIN_MS)
    fail_msg("dropped after %ld ms, before the %d ms timeout", ms, IO_TIMEOUT_MS);
  close(fd);
}

/* ------------------------------------------------------------------ */

static void test_stall_mid_header(void **state) {
  env_t *e = *state;
  int fd = raw_open(e);
  uint8_t hb[ECS_PROTO_HDR_SIZE];
  ecs_ts_raw_hdr(hb, ECS_OP_PING, 0, 0, 0);
  assert_int_equal(ecs_ts_raw_send(fd, hb, 10), ECS_OK); /* 10 of 32 bytes */
  uint64_t t0 = ecs_now_ms();
  others_served(e, "served-during-header-stall", 1);
  expect_dropped(fd, t0);
}

static void test_stall_mid_records(void **state) {
  env_t *e = *state;
  int fd = raw_open(e);
  uint8_t hb[ECS_PROTO_HDR_SIZE];
  ecs_ts_raw_hdr(hb, ECS_OP_EXISTS, 4, 200, 0);
  uint8_t rec[40];
  memset(rec, 'k', sizeof rec);
  assert_int_equal(ecs_ts_raw_send(fd, hb, sizeof hb), ECS_OK);
  assert_int_equal(ecs_ts_raw_send(fd, rec, sizeof rec), ECS_OK); /* 40 of 200 bytes */
  uint64_t t0 = ecs_now_ms();
  others_served(e, "served-during-records-stall", 1);
  expect_dropped(fd, t0);
}

/* A PUT stalled after 1 of 8 MiB: its reservation is aborted at the drop
 * and its bytes go back to the pool (STAT shows it). */
static void test_stall_mid_put_payload(void **state) {
  env_t *e = *state;
  ecs_server_stat_t before = ecs_ts_stat0(e->c);
  int fd = raw_open(e);
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  uint64_t n = 8 * MIB;
  ecs_put_item_t it = {.key = (const uint8_t *)"stalled-put", .key_len = 11, .nbytes = n, .raw_nbytes = n};
  it.desc.dtype = ECS_DTYPE_U8;
  it.desc.ndim = 1;
  it.desc.shape[0] = n;
  ecs_proto_put_item_write(&w, &it);
  uint8_t hb[ECS_PROTO_HDR_SIZE];
  ecs_ts_raw_hdr(hb, ECS_OP_PUT, 1, (uint32_t)w.len, n);
  assert_int_equal(ecs_ts_raw_send(fd, hb, sizeof hb), ECS_OK);
  assert_int_equal(ecs_ts_raw_send(fd, w.p, w.len), ECS_OK);
  ecs_wbuf_free(&w);
  uint8_t *chunk = calloc(1, MIB);
  assert_int_equal(ecs_ts_raw_send(fd, chunk, MIB), ECS_OK);
  uint64_t t0 = ecs_now_ms();
  free(chunk);
  /* reserved while in flight (STAT is answered after the records were
   * read: the server reads a request's bytes in order, and this client's
   * STAT comes on another connection, after our send returned) */
  ecs_server_stat_t mid = ecs_ts_stat0(e->c);
  for (int i = 0; i < 100 && mid.bytes_in_use < before.bytes_in_use + n; i++) {
    usleep(10000);
    mid = ecs_ts_stat0(e->c);
  }
  assert_true(mid.bytes_in_use >= before.bytes_in_use + n);
  others_served(e, "served-during-payload-stall", 1);
  uint64_t served = ecs_ts_stat0(e->c).bytes_in_use - mid.bytes_in_use; /* the others' object */
  expect_dropped(fd, t0);
  ecs_server_stat_t after = ecs_ts_stat0(e->c);
  assert_int_equal(after.bytes_in_use, before.bytes_in_use + served);
  assert_int_equal(after.objects, before.objects + 1);
  ecs_key_t k = {"stalled-put", 11};
  int ex = -1;
  assert_int_equal(ecs_exists_batch(e->c, &k, 1, &ex), ECS_OK);
  assert_int_equal(ex, 0);
}

/* A peer that asks for 24 MiB and never reads: the reply stalls in the
 * socket buffers, and the server drops the connection (and its references
 * to the object) within the timeout.  The peer cannot see the drop without
 * reading, which would unblock the server, so STAT's connection count
 * tells. */
static void test_unread_get_reply(void **state) {
  env_t *e = *state;
  uint64_t n = 24 * MIB;
  uint8_t *big = malloc(n);
  ecs_ts_fill(big, n, 77);
  ecs_key_t k = {"never-read", 10};
  ecs_tensor_t t = {.data = big, .nbytes = n};
  t.desc.dtype = ECS_DTYPE_U8;
  t.desc.ndim = 1;
  t.desc.shape[0] = n;
  int st;
  assert_int_equal(ecs_put_batch(e->c, &k, &t, 1, &st), ECS_OK);
  assert_int_equal(st, ECS_OK);
  free(big);
  ecs_server_stat_t before = ecs_ts_stat0(e->c);
  int fd = raw_open(e);
  assert_int_equal(ecs_ts_stat0(e->c).connections, before.connections + 1);
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_get_item_t gi = {.key = (const uint8_t *)"never-read", .key_len = 10, .capacity = n};
  ecs_proto_get_item_write(&w, &gi);
  uint8_t hb[ECS_PROTO_HDR_SIZE];
  ecs_ts_raw_hdr(hb, ECS_OP_GET, 1, (uint32_t)w.len, 0);
  assert_int_equal(ecs_ts_raw_send(fd, hb, sizeof hb), ECS_OK);
  assert_int_equal(ecs_ts_raw_send(fd, w.p, w.len), ECS_OK);
  ecs_wbuf_free(&w);
  uint64_t t0 = ecs_now_ms();
  others_served(e, "served-during-unread-reply", 1);
  ecs_server_stat_t now = ecs_ts_stat0(e->c);
  while (now.connections > before.connections && ecs_now_ms() - t0 < DROP_BOUND_MS) {
    usleep(10000);
    now = ecs_ts_stat0(e->c);
  }
  uint64_t ms = ecs_now_ms() - t0;
  if (now.connections > before.connections)
    fail_msg("a peer that never reads was still connected after %llu ms", (unsigned long long)ms);
  assert_true(ms >= DROP_MIN_MS);
  /* its references went with it: the object can be removed and freed now */
  uint64_t used = now.bytes_in_use;
  assert_int_equal(ecs_remove_batch(e->c, &k, 1, &st), ECS_OK);
  assert_int_equal(st, ECS_OK);
  assert_int_equal(ecs_ts_stat0(e->c).bytes_in_use, used - n);
  close(fd);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stall_mid_header),
      cmocka_unit_test(test_stall_mid_records),
      cmocka_unit_test(test_stall_mid_put_payload),
      cmocka_unit_test(test_unread_get_reply),
  };
  return cmocka_run_group_tests_name("deadlines", tests, setup, ecs_ts_group_close);
}
