/*
 * test_pipeline: one connection, many requests in flight (issue 12).  A
 * PUT whose reply waits for Redis no longer holds its connection: the
 * server reads and runs the requests behind it and replies strictly in
 * request order.  Raw protocol peers (a client library call sends one
 * request at a time, or only puts), a real redis-server, frozen with
 * SIGSTOP where a test needs a put to stay parked:
 *   - a mix of puts and gets sent back to back: every reply in request
 *     order (req_id), every get's bytes verified;
 *   - with Redis frozen, puts behind a parked put are run at once (another
 *     connection reads them), at most 8 parked per connection (the 9th is
 *     not read), and all are answered in order once Redis answers;
 *   - a get behind a parked put waits for it (replies in order): it is
 *     answered after the put's Redis timeout, the put first, ECS_EREDIS;
 *   - a client that hangs up with parked requests: the server stays up,
 *     serves on, and exits clean (ASan: nothing leaked).
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
#include "store/checksum.h"
#include "store/net.h"
#include "store/proto.h"
#include "support/fixture.h"
#include "support/raw.h"

#define KIB 1024u
#define OBJ (64 * KIB)
#define IO_MS 10000
#define CLIENT_MS 20000

/* ---- a raw pipelining peer ------------------------------------------- */

/* Appends one request (header with id, records in w, payload) to out. */
static void req_add(ecs_wbuf_t *out, uint8_t op, uint32_t id, uint32_t count, const ecs_wbuf_t *w,
                    const void *data, size_t n) {
  ecs_hdr_t h = {.magic = ECS_PROTO_MAGIC,
                 .version = ECS_PROTO_VERSION,
                 .opcode = op,
                 .req_id = id,
                 .count = count,
                 .meta_len = (uint32_t)w->len,
                 .data_len = n};
  uint8_t hb[ECS_PROTO_HDR_SIZE];
  ecs_proto_hdr_encode(&h, hb);
  ecs_wbuf_put(out, hb, sizeof hb);
  ecs_wbuf_put(out, w->p, w->len);
  if (n)
    ecs_wbuf_put(out, data, n);
}

/* A PUT of one object of n bytes filled from seed. */
static void put_add(ecs_wbuf_t *out, uint32_t id, const char *key, uint32_t seed, size_t n) {
  uint8_t *a = malloc(n);
  assert_non_null(a);
  ecs_ts_fill(a, n, seed);
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_put_item_t it = {.key = (const uint8_t *)key,
                       .key_len = (uint16_t)strlen(key),
                       .nbytes = n,
                       .raw_nbytes = n,
                       .checksum = ecs_checksum(a, n)};
  it.desc.dtype = ECS_DTYPE_U8;
  it.desc.ndim = 1;
  it.desc.shape[0] = n;
  ecs_proto_put_item_write(&w, &it);
  req_add(out, ECS_OP_PUT, id, 1, &w, a, n);
  ecs_wbuf_free(&w);
  free(a);
}

/* A GET of one object (capacity n). */
static void get_add(ecs_wbuf_t *out, uint32_t id, const char *key, size_t n) {
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_get_item_t it = {.key = (const uint8_t *)key, .key_len = (uint16_t)strlen(key), .capacity = n};
  ecs_proto_get_item_write(&w, &it);
  req_add(out, ECS_OP_GET, id, 1, &w, NULL, 0);
  ecs_wbuf_free(&w);
}

/* Reads one reply; checks that it answers (op, id); returns its one
 * item's status, and for a GET checks its bytes against seed. */
static int reply_read(int fd, uint8_t op, uint32_t id, uint32_t seed, size_t n) {
  uint8_t hb[ECS_PROTO_HDR_SIZE], meta[256];
  assert_int_equal(ecs_net_read_all(fd, hb, sizeof hb, ecs_now_ms() + IO_MS), ECS_OK);
  ecs_hdr_t h;
  assert_int_equal(ecs_proto_hdr_decode(hb, UINT64_MAX, &h), ECS_OK);
  assert_true(h.flags & ECS_FLAG_REPLY);
  if (h.req_id != id || h.opcode != op)
    fprintf(stderr, "reply %u (op %u) where %u (op %u) was due\n", h.req_id, h.opcode, id, op);
  assert_int_equal(h.req_id, id);
  assert_int_equal(h.opcode, op);
  assert_int_equal(h.status, ECS_OK);
  assert_int_equal(h.count, 1);
  assert_true(h.meta_len <= sizeof meta);
  assert_int_equal(ecs_net_read_all(fd, meta, h.meta_len, ecs_now_ms() + IO_MS), ECS_OK);
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, meta, h.meta_len);
  if (op == ECS_OP_PUT) {
    int32_t st;
    assert_int_equal(ecs_proto_status_read(&r, &st), ECS_OK);
    assert_int_equal(h.data_len, 0);
    return st;
  }
  ecs_get_reply_t rep;
  assert_int_equal(ecs_proto_get_reply_read(&r, &rep), ECS_OK);
  assert_int_equal(h.data_len, rep.status == ECS_OK ? rep.nbytes : 0);
  if (rep.status != ECS_OK)
    return rep.status;
  assert_int_equal(rep.nbytes, n);
  uint8_t *got = malloc(n), *want = malloc(n);
  assert_true(got && want);
  assert_int_equal(ecs_net_read_all(fd, got, n, ecs_now_ms() + IO_MS), ECS_OK);
  ecs_ts_fill(want, n, seed);
  assert_memory_equal(got, want, n);
  free(got);
  free(want);
  return ECS_OK;
}

static int open_raw(const ecs_ts_env_t *e) {
  int fd = -1, port = atoi(strrchr(e->servers, ':') + 1);
  assert_int_equal(ecs_ts_raw_open(port, "test", &fd), ECS_OK);
  return fd;
}

/* Whether key is stored, asked over another connection (no Redis). */
static int stored(ecs_client_t *c, const char *key) {
  uint8_t b[16];
  int rc = ecs_ts_get1(c, key, b, sizeof b, NULL);
  return rc == ECS_OK || rc == ECS_EBUFSMALL;
}

/* ---- 1: a put/get mix, back to back ---------------------------------- */

typedef struct sender {
  int fd;                /* where */
  const ecs_wbuf_t *out; /* what */
  int rc;                /* ecs_net_writev_all's */
} sender_t;

/* Sends everything while the test reads replies (the gets' replies would
 * fill the socket buffers otherwise, and the server stops reading while
 * a reply of its cannot leave). */
static void *sender_run(void *p) {
  sender_t *sd = p;
  struct iovec iov = {sd->out->p, sd->out->len};
  sd->rc = ecs_net_writev_all(sd->fd, &iov, 1, ecs_now_ms() + IO_MS);
  return NULL;
}

#define MIX 24

static void test_mix_in_order(void **state) {
  (void)state;
  ecs_ts_env_t e;
  assert_int_equal(ecs_ts_env_open(&e, NULL, CLIENT_MS), 0);
  int fd = open_raw(&e);
  /* put k0; get k0; put k1; get k1; get k0; ... all sent before any reply
   * is read (each get reads what the puts before it stored) */
  ecs_wbuf_t out;
  ecs_wbuf_init(&out);
  uint8_t ops[3 * MIX];
  uint32_t seeds[3 * MIX];
  uint32_t id = 100;
  int nreq = 0;
  for (int i = 0; i < MIX; i++) {
    char k[16], prev[16];
    snprintf(k, sizeof k, "mix-%d", i);
    snprintf(prev, sizeof prev, "mix-%d", i / 2);
    put_add(&out, id + (uint32_t)nreq, k, 1000u + (uint32_t)i, OBJ);
    ops[nreq] = ECS_OP_PUT;
    seeds[nreq++] = 0;
    get_add(&out, id + (uint32_t)nreq, k, OBJ);
    ops[nreq] = ECS_OP_GET;
    seeds[nreq++] = 1000u + (uint32_t)i;
    get_add(&out, id + (uint32_t)nreq, prev, OBJ);
    ops[nreq] = ECS_OP_GET;
    seeds[nreq++] = 1000u + (uint32_t)(i / 2);
  }
  assert_int_equal(out.err, ECS_OK);
  sender_t sd = {.fd = fd, .out = &out};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, sender_run, &sd), 0);
  for (int q = 0; q < nreq; q++)
    assert_int_equal(reply_read(fd, ops[q], id + (uint32_t)q, seeds[q], OBJ), ECS_OK);
  pthread_join(th, NULL);
  assert_int_equal(sd.rc, ECS_OK);
  ecs_wbuf_free(&out);
  close(fd);
  assert_int_equal(ecs_ts_env_close(&e), 0);
}

/* ---- 2: requests behind a parked put run at once, at most 8 ------------ */

#define DEEP 12

static void test_parked_puts_read_on(void **state) {
  (void)state;
  const char *extra[] = {"--redis-timeout-ms", "8000", NULL};
  ecs_ts_env_t e;
  assert_int_equal(ecs_ts_env_open(&e, extra, CLIENT_MS), 0);
  int fd = open_raw(&e);
  assert_int_equal(ecs_ts_signal(&e.redis, SIGSTOP), 0);
  ecs_wbuf_t out;
  ecs_wbuf_init(&out);
  for (int i = 0; i < DEEP; i++) {
    char k[16];
    snprintf(k, sizeof k, "deep-%d", i);
    put_add(&out, 200u + (uint32_t)i, k, 2000u + (uint32_t)i, 4 * KIB);
  }
  assert_int_equal(ecs_ts_raw_send(fd, out.p, out.len), ECS_OK);
  /* the 8th put is stored while the 1st still waits for Redis (a server
   * that reads one request at a time reads only the 1st) */
  int eighth = 0;
  for (int i = 0; i < 200 && !eighth; i++) {
    eighth = stored(e.c, "deep-7");
    if (!eighth)
      usleep(10000);
  }
  int first = stored(e.c, "deep-0");
  usleep(200000);
  int ninth = stored(e.c, "deep-8"); /* not read: 8 are parked */
  assert_int_equal(ecs_ts_signal(&e.redis, SIGCONT), 0);
  if (!eighth)
    fprintf(stderr, "the requests behind a parked put were not run (deep-0 stored: %d)\n", first);
  assert_true(first);
  assert_true(eighth);
  assert_false(ninth);
  for (int i = 0; i < DEEP; i++)
    assert_int_equal(reply_read(fd, ECS_OP_PUT, 200u + (uint32_t)i, 0, 0), ECS_OK);
  assert_true(stored(e.c, "deep-11"));
  ecs_key_t k = {"deep-11", 7};
  int ex = 0;
  assert_int_equal(ecs_exists_batch(e.cr, &k, 1, &ex), ECS_OK);
  assert_int_equal(ex, 1); /* answered only once its record was acknowledged */
  ecs_wbuf_free(&out);
  close(fd);
  assert_int_equal(ecs_ts_env_close(&e), 0);
}

/* ---- 3: a get behind a parked put waits for it ----------------------- */

static void test_get_behind_parked_put(void **state) {
  (void)state;
  const char *extra[] = {"--redis-timeout-ms", "1000", NULL};
  ecs_ts_env_t e;
  assert_int_equal(ecs_ts_env_open(&e, extra, CLIENT_MS), 0);
  uint8_t *a = malloc(OBJ);
  ecs_ts_fill(a, OBJ, 3000);
  assert_int_equal(ecs_ts_put1(e.c, "before", a, OBJ, ECS_DTYPE_U8), ECS_OK);
  free(a);
  int fd = open_raw(&e);
  assert_int_equal(ecs_ts_signal(&e.redis, SIGSTOP), 0);
  ecs_wbuf_t out;
  ecs_wbuf_init(&out);
  put_add(&out, 300, "parked", 3001, 4 * KIB);
  get_add(&out, 301, "before", OBJ);
  uint64_t t0 = ecs_now_ms();
  assert_int_equal(ecs_ts_raw_send(fd, out.p, out.len), ECS_OK);
  /* another connection is served at once meanwhile */
  uint8_t *b = malloc(OBJ);
  uint64_t n = 0;
  assert_int_equal(ecs_ts_get1(e.c, "before", b, OBJ, &n), ECS_OK);
  uint64_t other_ms = ecs_now_ms() - t0;
  free(b);
  /* on this one the put's reply comes first, after the Redis timeout:
   * stored, not published; then the get's, with the right bytes */
  assert_int_equal(reply_read(fd, ECS_OP_PUT, 300, 0, 0), ECS_EREDIS);
  uint64_t put_ms = ecs_now_ms() - t0;
  assert_int_equal(reply_read(fd, ECS_OP_GET, 301, 3000, OBJ), ECS_OK);
  assert_int_equal(ecs_ts_signal(&e.redis, SIGCONT), 0);
  assert_true(other_ms < 900);
  assert_true(put_ms >= 900);
  assert_true(stored(e.c, "parked"));
  ecs_wbuf_free(&out);
  close(fd);
  assert_int_equal(ecs_ts_env_close(&e), 0);
}

/* ---- 4: a client that hangs up with requests parked -------------------- */

static void test_hangup_with_parked(void **state) {
  (void)state;
  const char *extra[] = {"--redis-timeout-ms", "3000", NULL};
  ecs_ts_env_t e;
  assert_int_equal(ecs_ts_env_open(&e, extra, CLIENT_MS), 0);
  assert_int_equal(ecs_ts_signal(&e.redis, SIGSTOP), 0);
  for (int round = 0; round < 3; round++) {
    int fd = open_raw(&e);
    ecs_wbuf_t out;
    ecs_wbuf_init(&out);
    for (int i = 0; i < DEEP; i++) { /* 8 parked, the rest unread, one get queued */
      char k[24];
      snprintf(k, sizeof k, "gone-%d-%d", round, i);
      put_add(&out, 400u + (uint32_t)i, k, 4000u + (uint32_t)i, 16 * KIB);
      if (i == 3)
        get_add(&out, 900, k, 16 * KIB);
    }
    assert_int_equal(ecs_ts_raw_send(fd, out.p, out.len), ECS_OK);
    char k4[24];
    snprintf(k4, sizeof k4, "gone-%d-4", round);
    for (int i = 0; i < 200 && !stored(e.c, k4); i++)
      usleep(10000);
    close(fd); /* gone, with its replies parked and a get's reply built */
    ecs_wbuf_free(&out);
  }
  assert_int_equal(ecs_ts_signal(&e.redis, SIGCONT), 0);
  /* the server serves on: a put is acknowledged, objects read back */
  uint8_t a[4096], b[4096];
  ecs_ts_fill(a, sizeof a, 9);
  int ok = 0;
  for (int i = 0; i < 100 && !ok; i++) {
    ok = ecs_ts_put1(e.c, "after", a, sizeof a, ECS_DTYPE_U8) == ECS_OK;
    if (!ok)
      usleep(100000);
  }
  assert_true(ok);
  uint64_t n = 0;
  assert_int_equal(ecs_ts_get1(e.c, "after", b, sizeof b, &n), ECS_OK);
  assert_memory_equal(a, b, sizeof a);
  assert_true(stored(e.c, "gone-2-0"));
  /* and exits clean (under ASan: no leak of the parked replies) */
  assert_int_equal(ecs_ts_env_close(&e), 0);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mix_in_order),
      cmocka_unit_test(test_parked_puts_read_on),
      cmocka_unit_test(test_get_behind_parked_put),
      cmocka_unit_test(test_hangup_with_parked),
  };
  return cmocka_run_group_tests_name("pipeline", tests, NULL, NULL) ? 1 : 0;
}
