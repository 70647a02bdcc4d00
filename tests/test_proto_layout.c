/*
 * test_proto_layout: The wire codec's exact byte layouts: the header (and its validation),
 * the write and read buffers, every record byte for byte.
 *
 * Decoding always runs over a heap copy of exactly the bytes under test, so
 * that the ASan build catches a read one byte past a record.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ecstore/tensor.h"
#include "proto_util.h"
#include "store/core/proto.h"

static void test_hdr_exact_bytes(void **state) {
  (void)state;
  ecs_hdr_t h = {
      .magic = ECS_PROTO_MAGIC,
      .version = ECS_PROTO_VERSION,
      .opcode = ECS_OP_GET,
      .flags = ECS_FLAG_REPLY,
      .req_id = 0x11223344u,
      .status = ECS_EBUFSMALL,
      .count = 0x00000102u,
      .meta_len = 0x00030405u,
      .data_len = 0x0102030405060708ull,
  };
  static const uint8_t want[ECS_PROTO_HDR_SIZE] = {
      'E',  'C',  'S',  '1',                          /* magic */
      0x02,                                           /* version */
      0x03,                                           /* opcode GET */
      0x01, 0x00,                                     /* flags: REPLY */
      0x44, 0x33, 0x22, 0x11,                         /* req_id */
      0xf5, 0xff, 0xff, 0xff,                         /* status -11 */
      0x02, 0x01, 0x00, 0x00,                         /* count */
      0x05, 0x04, 0x03, 0x00,                         /* meta_len */
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, /* data_len */
  };
  uint8_t out[ECS_PROTO_HDR_SIZE];
  memset(out, 0xaa, sizeof out);
  ecs_proto_hdr_encode(&h, out);
  assert_memory_equal(out, want, sizeof want);

  ecs_hdr_t g;
  assert_int_equal(ecs_proto_hdr_decode(want, UINT64_MAX, &g), ECS_OK);
  assert_int_equal(g.magic, h.magic);
  assert_int_equal(g.version, h.version);
  assert_int_equal(g.opcode, h.opcode);
  assert_int_equal(g.flags, h.flags);
  assert_int_equal(g.req_id, h.req_id);
  assert_int_equal(g.status, h.status);
  assert_int_equal(g.count, h.count);
  assert_int_equal(g.meta_len, h.meta_len);
  assert_int_equal(g.data_len, h.data_len);
}

static int hdr_roundtrip(const ecs_hdr_t *h, uint64_t max_data, ecs_hdr_t *out) {
  uint8_t b[ECS_PROTO_HDR_SIZE];
  ecs_proto_hdr_encode(h, b);
  uint8_t *p = dup_exact(b, sizeof b);
  int rc = ecs_proto_hdr_decode(p, max_data, out);
  free(p);
  return rc;
}

static void test_hdr_validation(void **state) {
  (void)state;
  ecs_hdr_t h, g;
  static const unsigned ops[] = {ECS_OP_HELLO,        ECS_OP_PUT,     ECS_OP_GET,    ECS_OP_EXISTS,
                                 ECS_OP_REMOVE,       ECS_OP_STAT,    ECS_OP_PING,   ECS_OP_LEASE,
                                 ECS_OP_RELEASE,      ECS_OP_RESERVE, ECS_OP_COMMIT, ECS_OP_ATTACH,
                                 ECS_OP_RDMA_CONNECT, ECS_OP_UPGRADE, ECS_OP_PULL,   ECS_OP_DEBUG};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    h = good_hdr();
    h.opcode = (uint8_t)ops[i];
    assert_int_equal(hdr_roundtrip(&h, 1000, &g), ECS_OK);
  }
  static const unsigned bad_ops[] = {0, 16, 17, 0x6f, 0x71, 0xff};
  for (size_t i = 0; i < sizeof bad_ops / sizeof bad_ops[0]; i++) {
    h = good_hdr();
    h.opcode = (uint8_t)bad_ops[i];
    assert_int_equal(hdr_roundtrip(&h, 1000, &g), ECS_EPROTO);
  }
  h = good_hdr();
  h.magic ^= 1;
  assert_int_equal(hdr_roundtrip(&h, 1000, &g), ECS_EPROTO);
  assert_int_equal(g.req_id, 77); /* fields are decoded even on error */
  h = good_hdr();
  h.version = 0;
  assert_int_equal(hdr_roundtrip(&h, 1000, &g), ECS_EPROTO);
  h.version = ECS_PROTO_VERSION + 1;
  assert_int_equal(hdr_roundtrip(&h, 1000, &g), ECS_EPROTO);

  h = good_hdr();
  h.count = ECS_PROTO_MAX_ITEMS;
  assert_int_equal(hdr_roundtrip(&h, 1000, &g), ECS_OK);
  h.count = ECS_PROTO_MAX_ITEMS + 1;
  assert_int_equal(hdr_roundtrip(&h, 1000, &g), ECS_EPROTO);
  h.count = UINT32_MAX;
  assert_int_equal(hdr_roundtrip(&h, 1000, &g), ECS_EPROTO);

  h = good_hdr();
  h.meta_len = ECS_PROTO_MAX_META;
  assert_int_equal(hdr_roundtrip(&h, 1000, &g), ECS_OK);
  h.meta_len = ECS_PROTO_MAX_META + 1;
  assert_int_equal(hdr_roundtrip(&h, 1000, &g), ECS_EPROTO);

  h = good_hdr();
  assert_int_equal(hdr_roundtrip(&h, 999, &g), ECS_ETOOBIG);
  assert_int_equal(g.data_len, 1000);
  h.data_len = UINT64_MAX;
  assert_int_equal(hdr_roundtrip(&h, UINT64_MAX, &g), ECS_OK);
  assert_int_equal(hdr_roundtrip(&h, 0, &g), ECS_ETOOBIG);
  /* A malformed header is EPROTO even when data_len is also too big. */
  h.meta_len = ECS_PROTO_MAX_META + 1;
  assert_int_equal(hdr_roundtrip(&h, 0, &g), ECS_EPROTO);

  /* Flags and status are not validated (reserved bits are ignored). */
  h = good_hdr();
  h.flags = 0xffff;
  h.status = -12345;
  assert_int_equal(hdr_roundtrip(&h, 1000, &g), ECS_OK);
  assert_int_equal(g.flags, 0xffff);
  assert_int_equal(g.status, -12345);
}

static void test_wbuf(void **state) {
  (void)state;
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_wbuf_u8(&w, 0x01);
  ecs_wbuf_u16(&w, 0x0302);
  ecs_wbuf_u32(&w, 0x07060504u);
  ecs_wbuf_u64(&w, 0x0f0e0d0c0b0a0908ull);
  ecs_wbuf_put(&w, "\x10\x11", 2);
  ecs_wbuf_put(&w, NULL, 0);
  assert_int_equal(w.err, ECS_OK);
  assert_int_equal(w.len, 17);
  for (size_t i = 0; i < w.len; i++)
    assert_int_equal(w.p[i], i + 1);

  /* Growth keeps earlier bytes. */
  for (uint32_t i = 0; i < 100000; i++)
    ecs_wbuf_u32(&w, i);
  assert_int_equal(w.err, ECS_OK);
  assert_int_equal(w.len, 17 + 400000);
  assert_true(w.cap >= w.len);
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, w.p + 17, w.len - 17);
  for (uint32_t i = 0; i < 100000; i++)
    assert_int_equal(ecs_rbuf_u32(&r), i);
  assert_int_equal(r.err, ECS_OK);

  /* Reset keeps the memory. */
  size_t cap = w.cap;
  ecs_wbuf_reset(&w);
  assert_int_equal(w.len, 0);
  assert_int_equal(w.cap, cap);

  /* A size that cannot be represented fails without allocating, and the
   * error is sticky until reset. */
  ecs_wbuf_u8(&w, 9);
  ecs_wbuf_put(&w, "x", SIZE_MAX);
  assert_int_equal(w.err, ECS_ENOMEM);
  ecs_wbuf_u64(&w, 1);
  ecs_wbuf_put(&w, "abc", 3);
  assert_int_equal(w.len, 1);
  assert_int_equal(w.err, ECS_ENOMEM);
  ecs_wbuf_reset(&w);
  assert_int_equal(w.err, ECS_OK);
  ecs_wbuf_u8(&w, 5);
  assert_int_equal(w.len, 1);

  ecs_wbuf_free(&w);
  assert_null(w.p);
  assert_int_equal(w.len, 0);
  assert_int_equal(w.cap, 0);
  ecs_wbuf_free(&w);
  ecs_wbuf_free(NULL);
}

static void test_rbuf(void **state) {
  (void)state;
  static const uint8_t bytes[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  uint8_t *p = dup_exact(bytes, sizeof bytes);
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, p, sizeof bytes);
  assert_int_equal(ecs_rbuf_u8(&r), 1);
  assert_int_equal(ecs_rbuf_u16(&r), 0x0302);
  assert_int_equal(ecs_rbuf_u32(&r), 0x07060504u);
  const uint8_t *b = ecs_rbuf_bytes(&r, 0);
  assert_ptr_equal(b, p + 7);
  assert_int_equal(ecs_rbuf_u64(&r), 0); /* 4 left: overrun */
  assert_int_equal(r.err, ECS_EPROTO);
  assert_int_equal(r.pos, 7);
  /* Sticky: even reads that would fit now fail. */
  assert_int_equal(ecs_rbuf_u8(&r), 0);
  assert_null(ecs_rbuf_bytes(&r, 1));
  assert_null(ecs_rbuf_bytes(&r, 0));
  assert_int_equal(r.err, ECS_EPROTO);

  ecs_rbuf_init(&r, p, sizeof bytes);
  assert_null(ecs_rbuf_bytes(&r, SIZE_MAX));
  assert_int_equal(r.err, ECS_EPROTO);
  ecs_rbuf_init(&r, p, sizeof bytes);
  assert_ptr_equal(ecs_rbuf_bytes(&r, sizeof bytes), p);
  assert_int_equal(r.pos, r.len);
  assert_non_null(ecs_rbuf_bytes(&r, 0));
  assert_int_equal(r.err, ECS_OK);

  ecs_rbuf_init(&r, NULL, 0);
  assert_non_null(ecs_rbuf_bytes(&r, 0));
  assert_int_equal(ecs_rbuf_u16(&r), 0);
  assert_int_equal(r.err, ECS_EPROTO);
  free(p);
}

static void test_put_item_exact_bytes(void **state) {
  (void)state;
  ecs_put_item_t it;
  memset(&it, 0, sizeof it);
  it.key = (const uint8_t *)"kk";
  it.key_len = 2;
  it.codec = 0;
  it.desc = mkdesc(ECS_DTYPE_F16, 2, (const uint64_t[]){3, 0x0102});
  it.nbytes = it.raw_nbytes = 3 * 0x0102 * 2;
  it.checksum = 0x8877665544332211ull;
  static const uint8_t want[] = {
      0x02, 0x00,                                     /* key_len */
      0x00,                                           /* codec */
      0x02,                                           /* dtype f16 */
      0x02,                                           /* ndim */
      0x00, 0x00, 0x00,                               /* reserved */
      0x0c, 0x06, 0,    0,    0,    0,    0,    0,    /* nbytes 1548 */
      0x0c, 0x06, 0,    0,    0,    0,    0,    0,    /* raw_nbytes */
      0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, /* checksum */
      0x03, 0,    0,    0,    0,    0,    0,    0,    /* shape[0] */
      0x02, 0x01, 0,    0,    0,    0,    0,    0,    /* shape[1] */
      'k',  'k',                                      /* key */
  };
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_proto_put_item_write(&w, &it);
  assert_int_equal(w.err, ECS_OK);
  assert_int_equal(w.len, sizeof want);
  assert_memory_equal(w.p, want, sizeof want);
  ecs_wbuf_free(&w);
}

/* PULL item (docs/protocol.md 5.11): u16 key_len, u16 addr_len, u32
 * timeout_ms, the address, the key. */
static void test_pull_item_exact_bytes(void **state) {
  (void)state;
  ecs_pull_item_t it = {
      .key = (const uint8_t *)"kk", .key_len = 2, .addr = "h:1", .addr_len = 3, .timeout_ms = 0x01020304};
  static const uint8_t want[] = {
      0x02, 0x00,             /* key_len */
      0x03, 0x00,             /* addr_len */
      0x04, 0x03, 0x02, 0x01, /* timeout_ms */
      'h',  ':',  '1',        /* addr */
      'k',  'k',              /* key */
  };
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_proto_pull_item_write(&w, &it);
  assert_int_equal(w.err, ECS_OK);
  assert_int_equal(w.len, sizeof want);
  assert_memory_equal(w.p, want, sizeof want);
  ecs_rbuf_t r;
  ecs_pull_item_t got;
  ecs_rbuf_init(&r, want, sizeof want);
  assert_int_equal(ecs_proto_pull_item_read(&r, &got), ECS_OK);
  assert_int_equal(got.key_len, 2);
  assert_int_equal(got.addr_len, 3);
  assert_int_equal(got.timeout_ms, 0x01020304);
  assert_memory_equal(got.addr, "h:1", 3);
  assert_memory_equal(got.key, "kk", 2);
  /* hostile records: cut short, an empty address, an empty key */
  ecs_rbuf_init(&r, want, sizeof want - 1);
  assert_int_equal(ecs_proto_pull_item_read(&r, &got), ECS_EPROTO);
  uint8_t bad[sizeof want];
  memcpy(bad, want, sizeof want);
  bad[2] = 0;
  ecs_rbuf_init(&r, bad, sizeof bad - 3); /* addr_len 0: the key follows at once */
  assert_int_equal(ecs_proto_pull_item_read(&r, &got), ECS_EINVAL);
  memcpy(bad, want, sizeof want);
  bad[0] = 0;
  ecs_rbuf_init(&r, bad, sizeof bad - 2);
  assert_int_equal(ecs_proto_pull_item_read(&r, &got), ECS_EKEY);
  ecs_wbuf_free(&w);
}

static void test_other_records_exact_bytes(void **state) {
  (void)state;
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);

  ecs_get_item_t gi = {.key = (const uint8_t *)"abc", .key_len = 3, .capacity = 0x0a0b};
  ecs_proto_get_item_write(&w, &gi);
  static const uint8_t want_get[] = {
      3,    0,                        /* key_len */
      0,    0,    0,   0, 0, 0,       /* reserved */
      0x0b, 0x0a, 0,   0, 0, 0, 0, 0, /* capacity */
      'a',  'b',  'c',                /* key */
  };
  assert_int_equal(w.len, sizeof want_get);
  assert_memory_equal(w.p, want_get, sizeof want_get);

  ecs_wbuf_reset(&w);
  ecs_get_reply_t gr;
  memset(&gr, 0, sizeof gr);
  gr.status = ECS_EBUFSMALL;
  gr.codec = 1;
  gr.desc = mkdesc(ECS_DTYPE_U8, 1, (const uint64_t[]){5});
  gr.nbytes = 4;
  gr.raw_nbytes = 5;
  gr.checksum = 6;
  ecs_proto_get_reply_write(&w, &gr);
  /* clang-format off */
  static const uint8_t want_reply[] = {
      0xf5, 0xff, 0xff, 0xff, /* status -11 */
      1,                      /* codec */
      ECS_DTYPE_U8,           /* dtype */
      1,                      /* ndim */
      0,                      /* reserved */
      4, 0, 0, 0, 0, 0, 0, 0, /* nbytes */
      5, 0, 0, 0, 0, 0, 0, 0, /* raw_nbytes */
      6, 0, 0, 0, 0, 0, 0, 0, /* checksum */
      5, 0, 0, 0, 0, 0, 0, 0, /* shape[0] */
  };
  /* clang-format on */
  assert_int_equal(w.len, sizeof want_reply);
  assert_memory_equal(w.p, want_reply, sizeof want_reply);

  ecs_wbuf_reset(&w);
  ecs_proto_key_write(&w, "xy", 2);
  ecs_proto_status_write(&w, ECS_ENOTFOUND);
  static const uint8_t want_key_status[] = {2, 0, 'x', 'y', 0xfb, 0xff, 0xff, 0xff};
  assert_int_equal(w.len, sizeof want_key_status);
  assert_memory_equal(w.p, want_key_status, sizeof want_key_status);

  ecs_wbuf_reset(&w);
  ecs_hello_t he = {.token = (const uint8_t *)"t", .token_len = 1, .ns = (const uint8_t *)"ns", .ns_len = 2};
  ecs_proto_hello_write(&w, &he);
  static const uint8_t want_hello[] = {1, 0, 2, 0, 0, 0, 0, 0, 't', 'n', 's'};
  assert_int_equal(w.len, sizeof want_hello);
  assert_memory_equal(w.p, want_hello, sizeof want_hello);

  ecs_wbuf_reset(&w);
  ecs_hello_reply_t hr;
  memset(&hr, 0, sizeof hr);
  strcpy(hr.node_id, "n1");
  hr.max_items = 4096;
  hr.epoch = 1;
  hr.pool_size = 2;
  hr.max_data = 3;
  strcpy(hr.shm_path, "/s");
  ecs_proto_hello_reply_write(&w, &hr);
  static const uint8_t want_hr[] = {
      2,   0,                      /* node_id_len */
      0,   0,                      /* reserved */
      0,   0x10, 0, 0,             /* max_items 4096 */
      1,   0,    0, 0, 0, 0, 0, 0, /* epoch */
      2,   0,    0, 0, 0, 0, 0, 0, /* pool_size */
      3,   0,    0, 0, 0, 0, 0, 0, /* max_data */
      'n', '1',                    /* node_id */
      2,   0,                      /* shm_path_len */
      '/', 's',                    /* shm_path */
  };
  assert_int_equal(w.len, sizeof want_hr);
  assert_memory_equal(w.p, want_hr, sizeof want_hr);

  ecs_wbuf_reset(&w);
  ecs_stat_reply_t st;
  memset(&st, 0, sizeof st);
  st.pool_size = 1;
  st.pool_locked = 2;
  st.pool_cuda_registered = 3;
  ecs_proto_stat_write(&w, &st);
  assert_int_equal(w.len, 17 * 8);
  assert_int_equal(w.p[0], 1);
  assert_int_equal(w.p[15 * 8], 2);
  assert_int_equal(w.p[16 * 8], 3); /* appended after the 16 base counters */
  ecs_wbuf_free(&w);
}

/* The shm upgrade on the wire: the HELLO reply's secret trailer (flagged
 * in what version 1 left reserved) and the UPGRADE request's two phases;
 * every malformed variant is refused. */
static void test_upgrade_exact_bytes(void **state) {
  (void)state;
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_hello_reply_t hr;
  memset(&hr, 0, sizeof hr);
  strcpy(hr.node_id, "n");
  hr.upgrade_id = 0x0102030405060708ull;
  memset(hr.upgrade_secret, 0xab, sizeof hr.upgrade_secret);
  ecs_proto_hello_reply_write(&w, &hr);
  assert_int_equal(w.len, 32 + 1 + 2 + 8 + 32);
  assert_int_equal(w.p[2], ECS_HELLO_F_UPGRADE); /* flags, little-endian */
  assert_int_equal(w.p[3], 0);
  assert_int_equal(w.p[35], 0x08); /* upgrade_id after the empty shm path */
  assert_int_equal(w.p[42], 0x01);
  assert_int_equal(w.p[43], 0xab);
  ecs_rbuf_t r;
  ecs_hello_reply_t o;
  ecs_rbuf_init(&r, w.p, w.len);
  assert_int_equal(ecs_proto_hello_reply_read(&r, &o), ECS_OK);
  assert_int_equal(r.pos, r.len);
  assert_int_equal(o.upgrade_id, hr.upgrade_id);
  assert_memory_equal(o.upgrade_secret, hr.upgrade_secret, sizeof hr.upgrade_secret);
  for (size_t cut = 35; cut < w.len; cut++) { /* a truncated secret */
    ecs_rbuf_init(&r, w.p, cut);
    assert_int_equal(ecs_proto_hello_reply_read(&r, &o), ECS_EPROTO);
  }
  memset(w.p + 35, 0, 8); /* id 0 names no secret */
  ecs_rbuf_init(&r, w.p, w.len);
  assert_int_equal(ecs_proto_hello_reply_read(&r, &o), ECS_EPROTO);

  ecs_wbuf_reset(&w);
  ecs_upgrade_t u = {.phase = ECS_UPGRADE_CHALLENGE};
  ecs_proto_upgrade_write(&w, &u);
  static const uint8_t want_ch[] = {1, 0, 0, 0, 0, 0, 0, 0};
  assert_int_equal(w.len, sizeof want_ch);
  assert_memory_equal(w.p, want_ch, sizeof want_ch);
  ecs_upgrade_t g;
  ecs_rbuf_init(&r, w.p, w.len);
  assert_int_equal(ecs_proto_upgrade_read(&r, &g), ECS_OK);
  assert_int_equal(g.phase, ECS_UPGRADE_CHALLENGE);
  ecs_wbuf_reset(&w);
  u.phase = ECS_UPGRADE_PROVE;
  u.upgrade_id = 7;
  memset(u.mac, 0xcd, sizeof u.mac);
  ecs_proto_upgrade_write(&w, &u);
  assert_int_equal(w.len, 8 + 8 + 32);
  assert_int_equal(w.p[0], 2);
  assert_int_equal(w.p[8], 7);
  assert_int_equal(w.p[16], 0xcd);
  ecs_rbuf_init(&r, w.p, w.len);
  assert_int_equal(ecs_proto_upgrade_read(&r, &g), ECS_OK);
  assert_int_equal(g.upgrade_id, 7);
  assert_memory_equal(g.mac, u.mac, sizeof u.mac);
  ecs_rbuf_init(&r, w.p, w.len - 1); /* short mac */
  assert_int_equal(ecs_proto_upgrade_read(&r, &g), ECS_EPROTO);
  w.p[4] = 1; /* reserved set */
  ecs_rbuf_init(&r, w.p, w.len);
  assert_int_equal(ecs_proto_upgrade_read(&r, &g), ECS_EPROTO);
  w.p[4] = 0;
  w.p[0] = 3; /* unknown phase */
  ecs_rbuf_init(&r, w.p, w.len);
  assert_int_equal(ecs_proto_upgrade_read(&r, &g), ECS_EPROTO);
  ecs_wbuf_free(&w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hdr_exact_bytes),
      cmocka_unit_test(test_hdr_validation),
      cmocka_unit_test(test_wbuf),
      cmocka_unit_test(test_rbuf),
      cmocka_unit_test(test_put_item_exact_bytes),
      cmocka_unit_test(test_pull_item_exact_bytes),
      cmocka_unit_test(test_other_records_exact_bytes),
      cmocka_unit_test(test_upgrade_exact_bytes),
  };
  return cmocka_run_group_tests_name("proto_layout", tests, NULL, NULL);
}
