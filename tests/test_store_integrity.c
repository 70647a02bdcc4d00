/*
 * test_store_integrity: What must never get through: corrupt objects (one, and one in a large
 * batch), malformed frames from a raw socket, and a client that vanishes
 * in the middle of a put (the server leaks nothing).
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

static void test_checksum_mismatch_detected(void **state) {
  ecs_ts_env_t *e = *state;
  uint8_t a[65536], out[65536];
  ecs_ts_fill(a, sizeof a, 5);
  assert_int_equal(ecs_ts_put1(e->c, "corrupt-me", a, sizeof a, ECS_DTYPE_U8), ECS_OK);
  assert_int_equal(ecs__client_debug_corrupt(e->c, "corrupt-me", 10), ECS_OK);
  uint64_t n = 1;
  assert_int_equal(ecs_ts_get1(e->c, "corrupt-me", out, sizeof out, &n), ECS_ECHECKSUM);
  assert_int_equal(n, 0);
  /* with verification off, the (corrupt) bytes do arrive: the check is real */
  ecs_client_config_t cfg;
  ecs_client_config_init(&cfg);
  cfg.servers = e->servers;
  cfg.ns = "test";
  cfg.transport = ecs_ts_transport();
  cfg.verify_checksum = 0;
  ecs_client_t *nv;
  assert_int_equal(ecs_client_connect(&cfg, &nv, NULL, 0), ECS_OK);
  assert_int_equal(ecs_ts_get1(nv, "corrupt-me", out, sizeof out, &n), ECS_OK);
  assert_memory_not_equal(out, a, sizeof a);
  ecs_client_close(nv);
  /* a retried put of the same content heals the corrupt object */
  assert_int_equal(ecs_ts_put1(e->c, "corrupt-me", a, sizeof a, ECS_DTYPE_U8), ECS_OK);
  assert_int_equal(ecs_ts_get1(e->c, "corrupt-me", out, sizeof out, &n), ECS_OK);
  assert_memory_equal(out, a, sizeof a);
}

/* Objects larger than the client's hashing slice (store/core/checksum.h) are
 * verified piece by piece as they land: a corrupt byte in the middle of
 * one fails that item alone, its neighbours in the batch arrive, and a
 * clean object of several slices (first, middle and last pieces) passes.
 * Into caller buffers, then with the allocating variant. */
static void test_checksum_mismatch_large_batch(void **state) {
  ecs_ts_env_t *e = *state;
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
    ecs_ts_fill(in[i], sz[i], 40 + (uint32_t)i);
    assert_int_equal(ecs_ts_put1(e->c, names[i], in[i], sz[i], ECS_DTYPE_U8), ECS_OK);
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

static int raw_connect(int port) {
  int fd = -1;
  assert_int_equal(ecs_net_connect("127.0.0.1", port, 2000, &fd), ECS_OK);
  return fd;
}

static void raw_send(int fd, const void *p, size_t n) {
  assert_int_equal(ecs_ts_raw_send(fd, p, n), ECS_OK);
}

/* A raw connection that has said HELLO (namespace "test"). */
static int raw_open(int port) {
  int fd = -1;
  assert_int_equal(ecs_ts_raw_open(port, "test", &fd), ECS_OK);
  return fd;
}

/* The server hashes a put's payload as it lands, a slice at a time
 * (store/core/checksum.h), not in a second pass: a raw PUT whose bytes do not
 * match their records' checksums (one byte flipped in the middle of a
 * 1.1 MB item, and in the last byte of another), sent in odd-sized pieces
 * so that reads end anywhere, fails those items alone with ECS_ECHECKSUM
 * and stores nothing for them; its clean neighbours of one piece, of
 * several slices and of no byte at all are stored intact. */
static void test_put_checksum_mismatch_large(void **state) {
  ecs_ts_env_t *e = *state;
  enum { N = 5 };
  const size_t sz[N] = {70000, 1100001, 900001, 0, 600000};
  const char *names[N] = {"sput-ok-small", "sput-corrupt-mid", "sput-ok-3slices", "sput-empty",
                          "sput-corrupt-last"};
  const int bad[N] = {0, 1, 0, 0, 1};
  size_t total = 0;
  for (int i = 0; i < N; i++)
    total += sz[i];
  uint8_t *wire = malloc(total), *in[N];
  assert_non_null(wire);
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  size_t at = 0;
  for (int i = 0; i < N; i++) {
    in[i] = wire + at;
    ecs_ts_fill(in[i], sz[i], 90 + (uint32_t)i);
    ecs_put_item_t it = {.key = (const uint8_t *)names[i],
                         .key_len = (uint16_t)strlen(names[i]),
                         .nbytes = sz[i],
                         .raw_nbytes = sz[i],
                         .checksum = ecs_checksum(in[i], sz[i])};
    it.desc.dtype = ECS_DTYPE_U8;
    it.desc.ndim = 1;
    it.desc.shape[0] = sz[i];
    ecs_proto_put_item_write(&w, &it);
    at += sz[i];
  }
  assert_int_equal(w.err, ECS_OK);
  in[1][sz[1] / 2] ^= 0x5a; /* after the checksums were taken */
  in[4][sz[4] - 1] ^= 0x01;
  int fd = raw_open(e->server.port);
  uint8_t hb[ECS_PROTO_HDR_SIZE];
  ecs_ts_raw_hdr(hb, ECS_OP_PUT, N, (uint32_t)w.len, total);
  raw_send(fd, hb, sizeof hb);
  raw_send(fd, w.p, w.len);
  ecs_wbuf_free(&w);
  for (size_t off = 0; off < total; off += 100003)
    raw_send(fd, wire + off, total - off < 100003 ? total - off : 100003);
  uint8_t rb[ECS_PROTO_HDR_SIZE];
  assert_int_equal(ecs_net_read_all(fd, rb, sizeof rb, ecs_now_ms() + 5000), ECS_OK);
  ecs_hdr_t h;
  assert_int_equal(ecs_proto_hdr_decode(rb, UINT64_MAX, &h), ECS_OK);
  assert_true(h.flags & ECS_FLAG_REPLY);
  assert_int_equal(h.status, ECS_OK);
  assert_int_equal(h.count, N);
  assert_true(h.meta_len <= 4096);
  uint8_t meta[4096];
  assert_int_equal(ecs_net_read_all(fd, meta, h.meta_len, ecs_now_ms() + 5000), ECS_OK);
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, meta, h.meta_len);
  for (int i = 0; i < N; i++) {
    int32_t st = 1;
    assert_int_equal(ecs_proto_status_read(&r, &st), ECS_OK);
    if (st != (bad[i] ? ECS_ECHECKSUM : ECS_OK))
      fail_msg("%s: status %d (%s)", names[i], st, ecs_strerror(st));
  }
  close(fd);
  uint8_t *out = malloc(total + 1);
  assert_non_null(out);
  for (int i = 0; i < N; i++) {
    uint64_t n = 0;
    int rc = ecs_ts_get1(e->c, names[i], out, sz[i] + 1, &n);
    if (bad[i]) {
      assert_int_equal(rc, ECS_ENOTFOUND);
      continue;
    }
    assert_int_equal(rc, ECS_OK);
    assert_int_equal(n, sz[i]);
    assert_memory_equal(out, in[i], sz[i]);
  }
  free(out);
  free(wire);
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
                  .version = ECS_PROTO_VERSION,
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
  ecs_ts_env_t *e = *state;
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
    fd = raw_open(port);
    send_hdr(fd, ECS_PROTO_MAGIC, bad[i].op, bad[i].count, bad[i].meta, bad[i].data);
    expect_error_or_close(fd);
    close(fd);
  }
  /* records that lie about lengths: a key length past the end */
  fd = raw_open(port);
  uint8_t rec[8] = {0xff, 0x00, 'a', 'b'}; /* key_len 255 but 2 bytes */
  send_hdr(fd, ECS_PROTO_MAGIC, ECS_OP_EXISTS, 1, 4, 0);
  raw_send(fd, rec, 4);
  expect_error_or_close(fd);
  close(fd);
  /* a PUT whose item sizes disagree with data_len */
  fd = raw_open(port);
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
  ecs_ts_fill(junk, sizeof junk, 77);
  (void)!write(fd, junk, sizeof junk);
  expect_error_or_close(fd);
  close(fd);

  /* the server is still up and serving */
  assert_int_equal(ecs_ping(e->c), ECS_OK);
  uint8_t a[1000];
  ecs_ts_fill(a, sizeof a, 3);
  assert_int_equal(ecs_ts_put1(e->c, "after-garbage", a, sizeof a, ECS_DTYPE_U8), ECS_OK);
}

static void test_disconnect_mid_put_leaks_nothing(void **state) {
  ecs_ts_env_t *e = *state;
  ecs_server_stat_t before = ecs_ts_stat0(e->c);
  int fd = raw_open(e->server.port);
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
  /* the block is reserved while the put is in flight (once the server
   * read its header: with --threads, this STAT may be served by another
   * thread first) */
  ecs_server_stat_t mid = ecs_ts_stat0(e->c);
  for (int i = 0; i < 100 && mid.bytes_in_use < before.bytes_in_use + n; i++) {
    usleep(20000);
    mid = ecs_ts_stat0(e->c);
  }
  assert_true(mid.bytes_in_use >= before.bytes_in_use + n);
  close(fd);
  ecs_server_stat_t after;
  for (int i = 0; i < 100; i++) {
    after = ecs_ts_stat0(e->c);
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

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_checksum_mismatch_detected),
      cmocka_unit_test(test_checksum_mismatch_large_batch),
      cmocka_unit_test(test_put_checksum_mismatch_large),
      cmocka_unit_test(test_malformed_frames),
      cmocka_unit_test(test_disconnect_mid_put_leaks_nothing),
  };
  return cmocka_run_group_tests_name("store_integrity", tests, ecs_ts_group_open_debug, ecs_ts_group_close)
             ? 1
             : 0;
}
