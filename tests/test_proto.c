/*
 * The wire codec: exact byte layouts, round trips of every record, every
 * validation error, truncation at every byte offset and random mutation.
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
#include "store/proto.h"

/* ---- helpers ------------------------------------------------------------ */

static uint64_t rng_state;

/* splitmix64: small, fast and reproducible from the printed seed. */
static uint64_t rnd(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint8_t *dup_exact(const void *src, size_t n) {
  uint8_t *p = malloc(n != 0 ? n : 1);
  assert_non_null(p);
  if (n != 0)
    memcpy(p, src, n);
  return p;
}

static ecs_tensor_desc_t mkdesc(int dtype, unsigned ndim, const uint64_t *shape) {
  ecs_tensor_desc_t d;
  memset(&d, 0, sizeof d);
  d.dtype = (uint8_t)dtype;
  d.ndim = (uint8_t)ndim;
  for (unsigned i = 0; i < ndim && i < ECS_MAX_DIMS; i++)
    d.shape[i] = shape[i];
  return d;
}

static ecs_put_item_t mkput(const char *key, int codec, ecs_tensor_desc_t desc) {
  ecs_put_item_t it;
  memset(&it, 0, sizeof it);
  it.key = (const uint8_t *)key;
  it.key_len = (uint16_t)strlen(key);
  it.codec = (uint8_t)codec;
  it.desc = desc;
  uint64_t n = 0;
  assert_int_equal(ecs_tensor_nbytes(&desc, &n), ECS_OK);
  it.raw_nbytes = n;
  it.nbytes = codec == ECS_CODEC_NONE ? n : n / 3 + 1;
  it.checksum = 0x0123456789abcdefull ^ n;
  return it;
}

static void assert_desc_equal(const ecs_tensor_desc_t *a, const ecs_tensor_desc_t *b) {
  assert_int_equal(a->dtype, b->dtype);
  assert_int_equal(a->ndim, b->ndim);
  for (unsigned i = 0; i < a->ndim && i < ECS_MAX_DIMS; i++)
    assert_int_equal(a->shape[i], b->shape[i]);
}

static int in_buf(const ecs_rbuf_t *r, const uint8_t *p, size_t n) {
  return p != NULL && p >= r->p && (size_t)(p - r->p) <= r->len && n <= r->len - (size_t)(p - r->p);
}

/* ---- header ------------------------------------------------------------- */

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
      0x01,                                           /* version */
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

static ecs_hdr_t good_hdr(void) {
  ecs_hdr_t h = {.magic = ECS_PROTO_MAGIC,
                 .version = ECS_PROTO_VERSION,
                 .opcode = ECS_OP_PUT,
                 .req_id = 77,
                 .count = 3,
                 .meta_len = 100,
                 .data_len = 1000};
  return h;
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
                                 ECS_OP_RDMA_CONNECT, ECS_OP_DEBUG};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    h = good_hdr();
    h.opcode = (uint8_t)ops[i];
    assert_int_equal(hdr_roundtrip(&h, 1000, &g), ECS_OK);
  }
  static const unsigned bad_ops[] = {0, 14, 15, 0x6f, 0x71, 0xff};
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

/* ---- buffers ------------------------------------------------------------ */

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

/* ---- exact record layouts ----------------------------------------------- */

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
  ecs_proto_stat_write(&w, &st);
  assert_int_equal(w.len, 16 * 8);
  assert_int_equal(w.p[0], 1);
  assert_int_equal(w.p[15 * 8], 2);
  ecs_wbuf_free(&w);
}

/* ---- round trips -------------------------------------------------------- */

static void test_put_item_roundtrip(void **state) {
  (void)state;
  char longkey[ECS_MAX_KEY + 1];
  memset(longkey, 'z', ECS_MAX_KEY);
  longkey[ECS_MAX_KEY] = '\0';
  const uint64_t s8[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  ecs_put_item_t in[] = {
      mkput("a", ECS_CODEC_NONE, mkdesc(ECS_DTYPE_BF16, 2, (const uint64_t[]){650, 2048})),
      mkput("scalar", ECS_CODEC_NONE, mkdesc(ECS_DTYPE_I64, 0, NULL)),
      mkput("empty", ECS_CODEC_NONE, mkdesc(ECS_DTYPE_F32, 3, (const uint64_t[]){4, 0, 5})),
      mkput(longkey, ECS_CODEC_NONE, mkdesc(ECS_DTYPE_U8, 8, s8)),
      mkput("compressed", 1, mkdesc(ECS_DTYPE_F16, 1, (const uint64_t[]){1000})),
  };
  size_t n = sizeof in / sizeof in[0];
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  for (size_t i = 0; i < n; i++)
    ecs_proto_put_item_write(&w, &in[i]);
  assert_int_equal(w.err, ECS_OK);
  uint8_t *p = dup_exact(w.p, w.len);
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, p, w.len);
  for (size_t i = 0; i < n; i++) {
    ecs_put_item_t out;
    assert_int_equal(ecs_proto_put_item_read(&r, &out), ECS_OK);
    assert_int_equal(out.key_len, in[i].key_len);
    assert_memory_equal(out.key, in[i].key, in[i].key_len);
    assert_true(in_buf(&r, out.key, out.key_len)); /* zero copy: points into the buffer */
    assert_int_equal(out.codec, in[i].codec);
    assert_desc_equal(&out.desc, &in[i].desc);
    assert_int_equal(out.nbytes, in[i].nbytes);
    assert_int_equal(out.raw_nbytes, in[i].raw_nbytes);
    assert_int_equal(out.checksum, in[i].checksum);
  }
  assert_int_equal(r.pos, r.len);
  assert_int_equal(r.err, ECS_OK);
  free(p);
  ecs_wbuf_free(&w);
}

static void test_get_roundtrip(void **state) {
  (void)state;
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_get_item_t gi[] = {{.key = (const uint8_t *)"k1", .key_len = 2, .capacity = 0},
                         {.key = (const uint8_t *)"\0\xff", .key_len = 2, .capacity = UINT64_MAX}};
  for (size_t i = 0; i < 2; i++)
    ecs_proto_get_item_write(&w, &gi[i]);
  ecs_get_reply_t gr[3];
  memset(gr, 0, sizeof gr);
  gr[0].status = ECS_OK;
  gr[0].desc = mkdesc(ECS_DTYPE_F32, 2, (const uint64_t[]){2, 3});
  gr[0].nbytes = gr[0].raw_nbytes = 24;
  gr[0].checksum = 99;
  gr[1].status = ECS_ENOTFOUND; /* zeroed description */
  gr[2].status = ECS_EBUFSMALL;
  gr[2].desc = mkdesc(ECS_DTYPE_I8, 1, (const uint64_t[]){1 << 20});
  gr[2].nbytes = gr[2].raw_nbytes = 1 << 20;
  for (size_t i = 0; i < 3; i++)
    ecs_proto_get_reply_write(&w, &gr[i]);
  assert_int_equal(w.err, ECS_OK);

  uint8_t *p = dup_exact(w.p, w.len);
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, p, w.len);
  for (size_t i = 0; i < 2; i++) {
    ecs_get_item_t o;
    assert_int_equal(ecs_proto_get_item_read(&r, &o), ECS_OK);
    assert_int_equal(o.key_len, gi[i].key_len);
    assert_memory_equal(o.key, gi[i].key, o.key_len);
    assert_int_equal(o.capacity, gi[i].capacity);
  }
  for (size_t i = 0; i < 3; i++) {
    ecs_get_reply_t o;
    assert_int_equal(ecs_proto_get_reply_read(&r, &o), ECS_OK);
    assert_int_equal(o.status, gr[i].status);
    assert_int_equal(o.codec, gr[i].codec);
    assert_desc_equal(&o.desc, &gr[i].desc);
    assert_int_equal(o.nbytes, gr[i].nbytes);
    assert_int_equal(o.raw_nbytes, gr[i].raw_nbytes);
    assert_int_equal(o.checksum, gr[i].checksum);
  }
  assert_int_equal(r.pos, r.len);
  free(p);
  ecs_wbuf_free(&w);
}

static void test_key_status_roundtrip(void **state) {
  (void)state;
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  uint8_t big[ECS_MAX_KEY];
  memset(big, 0x80, sizeof big);
  ecs_proto_key_write(&w, "k", 1);
  ecs_proto_key_write(&w, big, ECS_MAX_KEY);
  static const int32_t st[] = {ECS_OK, ECS_ENOTFOUND, ECS_ECODEC, INT32_MIN, INT32_MAX};
  for (size_t i = 0; i < sizeof st / sizeof st[0]; i++)
    ecs_proto_status_write(&w, st[i]);
  uint8_t *p = dup_exact(w.p, w.len);
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, p, w.len);
  const uint8_t *k;
  uint16_t kl;
  assert_int_equal(ecs_proto_key_read(&r, &k, &kl), ECS_OK);
  assert_int_equal(kl, 1);
  assert_int_equal(k[0], 'k');
  assert_int_equal(ecs_proto_key_read(&r, &k, &kl), ECS_OK);
  assert_int_equal(kl, ECS_MAX_KEY);
  assert_memory_equal(k, big, ECS_MAX_KEY);
  for (size_t i = 0; i < sizeof st / sizeof st[0]; i++) {
    int32_t s = 1;
    assert_int_equal(ecs_proto_status_read(&r, &s), ECS_OK);
    assert_int_equal(s, st[i]);
  }
  assert_int_equal(r.pos, r.len);
  free(p);
  ecs_wbuf_free(&w);
}

static void test_hello_roundtrip(void **state) {
  (void)state;
  uint8_t tok[ECS_PROTO_MAX_TOKEN], ns[ECS_PROTO_MAX_NS];
  memset(tok, 't', sizeof tok);
  memset(ns, 'n', sizeof ns);
  ecs_hello_t in[] = {
      {.token = NULL, .token_len = 0, .ns = (const uint8_t *)"default", .ns_len = 7, .client_flags = 0},
      {.token = tok,
       .token_len = ECS_PROTO_MAX_TOKEN,
       .ns = ns,
       .ns_len = ECS_PROTO_MAX_NS,
       .client_flags = 5},
  };
  for (size_t i = 0; i < 2; i++) {
    ecs_wbuf_t w;
    ecs_wbuf_init(&w);
    ecs_proto_hello_write(&w, &in[i]);
    assert_int_equal(w.len, 8u + in[i].token_len + in[i].ns_len);
    uint8_t *p = dup_exact(w.p, w.len);
    ecs_rbuf_t r;
    ecs_rbuf_init(&r, p, w.len);
    ecs_hello_t o;
    assert_int_equal(ecs_proto_hello_read(&r, &o), ECS_OK);
    assert_int_equal(o.token_len, in[i].token_len);
    if (o.token_len != 0)
      assert_memory_equal(o.token, in[i].token, o.token_len);
    assert_non_null(o.token);
    assert_int_equal(o.ns_len, in[i].ns_len);
    assert_memory_equal(o.ns, in[i].ns, o.ns_len);
    assert_int_equal(o.client_flags, in[i].client_flags);
    assert_int_equal(r.pos, r.len);
    free(p);
    ecs_wbuf_free(&w);
  }

  ecs_hello_reply_t hr;
  memset(&hr, 0, sizeof hr);
  memset(hr.node_id, 'x', sizeof hr.node_id - 1); /* the longest id: 63 */
  hr.max_items = ECS_PROTO_MAX_ITEMS;
  hr.epoch = 0x1122334455667788ull;
  hr.pool_size = 1ull << 40;
  hr.max_data = 1ull << 33;
  ecs_hello_reply_t unterminated = hr;
  memset(unterminated.node_id, 'y', sizeof unterminated.node_id); /* no NUL: 63 are sent */
  const ecs_hello_reply_t *cases[] = {&hr, &unterminated};
  for (size_t i = 0; i < 2; i++) {
    ecs_wbuf_t w;
    ecs_wbuf_init(&w);
    ecs_proto_hello_reply_write(&w, cases[i]);
    assert_int_equal(w.len, 32 + 63 + 2); /* + an empty shm path */
    uint8_t *p = dup_exact(w.p, w.len);
    ecs_rbuf_t r;
    ecs_rbuf_init(&r, p, w.len);
    ecs_hello_reply_t o;
    assert_int_equal(ecs_proto_hello_reply_read(&r, &o), ECS_OK);
    assert_int_equal(strlen(o.node_id), 63);
    assert_memory_equal(o.node_id, cases[i]->node_id, 63);
    assert_int_equal(o.max_items, hr.max_items);
    assert_int_equal(o.epoch, hr.epoch);
    assert_int_equal(o.pool_size, hr.pool_size);
    assert_int_equal(o.max_data, hr.max_data);
    free(p);
    ecs_wbuf_free(&w);
  }
}

static void test_stat_roundtrip(void **state) {
  (void)state;
  ecs_stat_reply_t s;
  uint64_t vals[16];
  for (int i = 0; i < 16; i++)
    vals[i] = 0x0100000000000000ull * (uint64_t)(i + 1) + (uint64_t)i;
  _Static_assert(sizeof s == sizeof vals, "16 counters");
  memcpy(&s, vals, sizeof s);
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_proto_stat_write(&w, &s);
  ecs_wbuf_u64(&w, 12345); /* a counter a newer server appended */
  uint8_t *p = dup_exact(w.p, w.len);
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, p, w.len);
  /* Wire order is declaration order. */
  for (int i = 0; i < 16; i++)
    assert_int_equal(ecs_rbuf_u64(&r), vals[i]);
  ecs_rbuf_init(&r, p, w.len);
  ecs_stat_reply_t o;
  assert_int_equal(ecs_proto_stat_read(&r, &o), ECS_OK);
  assert_memory_equal(&o, &s, sizeof s);
  assert_int_equal(o.pool_locked, vals[15]);
  assert_int_equal(r.pos, 16 * 8);
  free(p);
  ecs_wbuf_free(&w);
}

/* ---- validation errors -------------------------------------------------- */

/* Decodes one record then a trailing status record: validation errors must
 * leave the reader at the next record. */
typedef int (*read1_fn)(ecs_rbuf_t *r);

static int read_put(ecs_rbuf_t *r) {
  ecs_put_item_t it;
  return ecs_proto_put_item_read(r, &it);
}
static int read_get(ecs_rbuf_t *r) {
  ecs_get_item_t it;
  return ecs_proto_get_item_read(r, &it);
}
static int read_reply(ecs_rbuf_t *r) {
  ecs_get_reply_t it;
  return ecs_proto_get_reply_read(r, &it);
}
static int read_key(ecs_rbuf_t *r) {
  const uint8_t *k;
  uint16_t n;
  return ecs_proto_key_read(r, &k, &n);
}
static int read_status(ecs_rbuf_t *r) {
  int32_t s;
  return ecs_proto_status_read(r, &s);
}
static int read_hello(ecs_rbuf_t *r) {
  ecs_hello_t h;
  return ecs_proto_hello_read(r, &h);
}
static int read_hello_reply(ecs_rbuf_t *r) {
  ecs_hello_reply_t h;
  return ecs_proto_hello_reply_read(r, &h);
}
static int read_stat(ecs_rbuf_t *r) {
  ecs_stat_reply_t s;
  return ecs_proto_stat_read(r, &s);
}

#define SENTINEL ((int32_t)0x5eed5eed)

/* w holds one record; appends a sentinel status, decodes, and checks that
 * the record gives want and, unless want is EPROTO, that the sentinel
 * follows. */
static void expect_record(ecs_wbuf_t *w, read1_fn fn, int want) {
  ecs_proto_status_write(w, SENTINEL);
  assert_int_equal(w->err, ECS_OK);
  uint8_t *p = dup_exact(w->p, w->len);
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, p, w->len);
  assert_int_equal(fn(&r), want);
  if (want == ECS_EPROTO) {
    assert_int_equal(r.err, ECS_EPROTO);
  } else {
    assert_int_equal(r.err, ECS_OK);
    int32_t s = 0;
    assert_int_equal(ecs_proto_status_read(&r, &s), ECS_OK);
    assert_int_equal(s, SENTINEL);
    assert_int_equal(r.pos, r.len);
  }
  free(p);
  ecs_wbuf_reset(w);
}

static void test_put_item_errors(void **state) {
  (void)state;
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  uint8_t big[ECS_MAX_KEY + 1];
  memset(big, 'b', sizeof big);
  ecs_put_item_t good = mkput("key", ECS_CODEC_NONE, mkdesc(ECS_DTYPE_F32, 2, (const uint64_t[]){3, 4}));
  ecs_put_item_t it;

  it = good;
  ecs_proto_put_item_write(&w, &it);
  expect_record(&w, read_put, ECS_OK);

  it = good;
  it.key_len = 0;
  ecs_proto_put_item_write(&w, &it);
  expect_record(&w, read_put, ECS_EKEY);
  it = good;
  it.key = big;
  it.key_len = ECS_MAX_KEY + 1;
  ecs_proto_put_item_write(&w, &it);
  expect_record(&w, read_put, ECS_EKEY);
  /* A bad key wins over a bad dtype. */
  it.desc.dtype = 0;
  ecs_proto_put_item_write(&w, &it);
  expect_record(&w, read_put, ECS_EKEY);

  it = good;
  it.desc.dtype = ECS_DTYPE_INVALID;
  ecs_proto_put_item_write(&w, &it);
  expect_record(&w, read_put, ECS_EDTYPE);

  /* Flags: UPSERT travels in byte 5; an unknown bit fails the item alone
   * (well framed), rather than being ignored. */
  it = good;
  it.flags = ECS_PUT_F_UPSERT;
  ecs_proto_put_item_write(&w, &it);
  assert_int_equal(w.p[w.len - (32 + 8 * 2 + 3) + 5], ECS_PUT_F_UPSERT);
  {
    ecs_rbuf_t r;
    ecs_put_item_t back;
    ecs_rbuf_init(&r, w.p + w.len - (32 + 8 * 2 + 3), 32 + 8 * 2 + 3);
    assert_int_equal(ecs_proto_put_item_read(&r, &back), ECS_OK);
    assert_int_equal(back.flags, ECS_PUT_F_UPSERT);
  }
  expect_record(&w, read_put, ECS_OK);
  it.flags = 0x80;
  ecs_proto_put_item_write(&w, &it);
  expect_record(&w, read_put, ECS_EINVAL);
  it = good;
  it.desc.dtype = ECS_DTYPE__COUNT;
  ecs_proto_put_item_write(&w, &it);
  expect_record(&w, read_put, ECS_EDTYPE);
  it.desc.dtype = 0xff;
  ecs_proto_put_item_write(&w, &it);
  expect_record(&w, read_put, ECS_EDTYPE);

  /* ndim 9 and 255: well framed (the writer emits ndim dimensions), so
   * the item fails alone. */
  it = good;
  it.desc.ndim = ECS_MAX_DIMS + 1;
  ecs_proto_put_item_write(&w, &it);
  assert_int_equal(w.len, 32 + 8 * 9 + 3);
  expect_record(&w, read_put, ECS_EDTYPE);
  it.desc.ndim = 255;
  ecs_proto_put_item_write(&w, &it);
  expect_record(&w, read_put, ECS_EDTYPE);

  /* Raw payloads: the shape's size must equal nbytes and raw_nbytes. */
  it = good;
  it.nbytes++;
  ecs_proto_put_item_write(&w, &it);
  expect_record(&w, read_put, ECS_EDTYPE);
  it = good;
  it.raw_nbytes--;
  ecs_proto_put_item_write(&w, &it);
  expect_record(&w, read_put, ECS_EDTYPE);
  it = good;
  it.desc.shape[1] = 5;
  ecs_proto_put_item_write(&w, &it);
  expect_record(&w, read_put, ECS_EDTYPE);
  /* A shape whose size overflows. */
  it = good;
  it.desc.shape[0] = it.desc.shape[1] = 1ull << 32;
  ecs_proto_put_item_write(&w, &it);
  expect_record(&w, read_put, ECS_EDTYPE);

  /* Encoded payloads: nbytes is free, raw_nbytes must still match. */
  it = good;
  it.codec = 1;
  it.nbytes = 7;
  ecs_proto_put_item_write(&w, &it);
  expect_record(&w, read_put, ECS_OK);
  it.raw_nbytes = 7;
  ecs_proto_put_item_write(&w, &it);
  expect_record(&w, read_put, ECS_EDTYPE);

  /* A key that runs past the end is a framing error. */
  it = good;
  ecs_proto_put_item_write(&w, &it);
  w.p[0] = 200; /* key_len 200, 3 + 4 (sentinel) bytes present */
  expect_record(&w, read_put, ECS_EPROTO);

  ecs_wbuf_free(&w);
}

static void test_get_errors(void **state) {
  (void)state;
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  uint8_t big[ECS_MAX_KEY + 1];
  memset(big, 'b', sizeof big);
  ecs_get_item_t gi = {.key = big, .key_len = 0, .capacity = 1};
  ecs_proto_get_item_write(&w, &gi);
  expect_record(&w, read_get, ECS_EKEY);
  gi.key_len = ECS_MAX_KEY + 1;
  ecs_proto_get_item_write(&w, &gi);
  expect_record(&w, read_get, ECS_EKEY);
  gi.key_len = ECS_MAX_KEY;
  ecs_proto_get_item_write(&w, &gi);
  expect_record(&w, read_get, ECS_OK);

  ecs_get_reply_t gr;
  memset(&gr, 0, sizeof gr);
  gr.status = ECS_OK;
  gr.desc = mkdesc(ECS_DTYPE_I32, 1, (const uint64_t[]){10});
  gr.nbytes = gr.raw_nbytes = 40;
  ecs_proto_get_reply_write(&w, &gr);
  expect_record(&w, read_reply, ECS_OK);
  gr.nbytes = 41;
  ecs_proto_get_reply_write(&w, &gr);
  expect_record(&w, read_reply, ECS_EDTYPE);
  gr.nbytes = 40;
  gr.desc.dtype = 0;
  ecs_proto_get_reply_write(&w, &gr);
  expect_record(&w, read_reply, ECS_EDTYPE);
  /* A miss needs no valid description... */
  gr.status = ECS_ENOTFOUND;
  ecs_proto_get_reply_write(&w, &gr);
  expect_record(&w, read_reply, ECS_OK);
  /* ...but ndim is always bounded. */
  gr.desc.ndim = ECS_MAX_DIMS + 1;
  ecs_proto_get_reply_write(&w, &gr);
  expect_record(&w, read_reply, ECS_EDTYPE);

  ecs_proto_key_write(&w, big, 0);
  expect_record(&w, read_key, ECS_EKEY);
  ecs_proto_key_write(&w, big, ECS_MAX_KEY + 1);
  expect_record(&w, read_key, ECS_EKEY);
  ecs_wbuf_free(&w);
}

static void test_hello_errors(void **state) {
  (void)state;
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  uint8_t buf[1024];
  memset(buf, 'q', sizeof buf);
  ecs_hello_t h = {.token = buf, .token_len = ECS_PROTO_MAX_TOKEN + 1, .ns = buf, .ns_len = 1};
  ecs_proto_hello_write(&w, &h);
  expect_record(&w, read_hello, ECS_EPROTO);
  h.token_len = 0;
  h.ns_len = 0;
  ecs_proto_hello_write(&w, &h);
  expect_record(&w, read_hello, ECS_EPROTO);
  h.ns_len = ECS_PROTO_MAX_NS + 1;
  ecs_proto_hello_write(&w, &h);
  expect_record(&w, read_hello, ECS_EPROTO);
  h.ns_len = ECS_PROTO_MAX_NS;
  ecs_proto_hello_write(&w, &h);
  expect_record(&w, read_hello, ECS_OK);

  /* node_id_len must leave room for the NUL. */
  ecs_hello_reply_t hr;
  memset(&hr, 0, sizeof hr);
  ecs_proto_hello_reply_write(&w, &hr); /* empty id is fine */
  expect_record(&w, read_hello_reply, ECS_OK);
  ecs_proto_hello_reply_write(&w, &hr);
  ecs_wbuf_put(&w, buf, 64);
  w.p[0] = 64;
  expect_record(&w, read_hello_reply, ECS_EPROTO);
  ecs_wbuf_free(&w);
}

/* ---- truncation --------------------------------------------------------- */

/* A decoder for one meta section: count records of one kind. */
typedef struct section {
  const char *name;
  read1_fn fn;
  size_t count;
  ecs_wbuf_t w;
} section_t;

static int decode_section(const section_t *s, const uint8_t *p, size_t len, ecs_rbuf_t *r) {
  ecs_rbuf_init(r, p, len);
  for (size_t i = 0; i < s->count; i++) {
    int rc = s->fn(r);
    if (rc == ECS_EPROTO)
      return rc;
  }
  return r->err;
}

static void build_sections(section_t *out, size_t *n) {
  size_t k = 0;
  const uint64_t s8[8] = {2, 2, 2, 2, 2, 2, 2, 2};

  section_t *s = &out[k++];
  *s = (section_t){.name = "put", .fn = read_put, .count = 3};
  ecs_wbuf_init(&s->w);
  ecs_put_item_t p1 = mkput("first", ECS_CODEC_NONE, mkdesc(ECS_DTYPE_F16, 2, (const uint64_t[]){3, 7}));
  ecs_put_item_t p2 = mkput("second-key", 1, mkdesc(ECS_DTYPE_U8, 8, s8));
  ecs_put_item_t p3 = mkput("s", ECS_CODEC_NONE, mkdesc(ECS_DTYPE_I64, 0, NULL));
  ecs_proto_put_item_write(&s->w, &p1);
  ecs_proto_put_item_write(&s->w, &p2);
  ecs_proto_put_item_write(&s->w, &p3);

  s = &out[k++];
  *s = (section_t){.name = "get", .fn = read_get, .count = 2};
  ecs_wbuf_init(&s->w);
  ecs_get_item_t g1 = {.key = (const uint8_t *)"alpha", .key_len = 5, .capacity = 4096};
  ecs_get_item_t g2 = {.key = (const uint8_t *)"b", .key_len = 1, .capacity = 0};
  ecs_proto_get_item_write(&s->w, &g1);
  ecs_proto_get_item_write(&s->w, &g2);

  s = &out[k++];
  *s = (section_t){.name = "get-reply", .fn = read_reply, .count = 3};
  ecs_wbuf_init(&s->w);
  ecs_get_reply_t r1;
  memset(&r1, 0, sizeof r1);
  r1.desc = mkdesc(ECS_DTYPE_BF16, 3, (const uint64_t[]){1, 2, 3});
  r1.nbytes = r1.raw_nbytes = 12;
  ecs_proto_get_reply_write(&s->w, &r1);
  ecs_get_reply_t r2;
  memset(&r2, 0, sizeof r2);
  r2.status = ECS_ENOTFOUND;
  ecs_proto_get_reply_write(&s->w, &r2);
  r1.status = ECS_EBUFSMALL;
  ecs_proto_get_reply_write(&s->w, &r1);

  s = &out[k++];
  *s = (section_t){.name = "key", .fn = read_key, .count = 2};
  ecs_wbuf_init(&s->w);
  ecs_proto_key_write(&s->w, "one", 3);
  ecs_proto_key_write(&s->w, "two!", 4);

  s = &out[k++];
  *s = (section_t){.name = "status", .fn = read_status, .count = 3};
  ecs_wbuf_init(&s->w);
  ecs_proto_status_write(&s->w, ECS_OK);
  ecs_proto_status_write(&s->w, ECS_ENOSPC);
  ecs_proto_status_write(&s->w, ECS_ECHECKSUM);

  s = &out[k++];
  *s = (section_t){.name = "hello", .fn = read_hello, .count = 1};
  ecs_wbuf_init(&s->w);
  ecs_hello_t h = {
      .token = (const uint8_t *)"secret", .token_len = 6, .ns = (const uint8_t *)"prod", .ns_len = 4};
  ecs_proto_hello_write(&s->w, &h);

  s = &out[k++];
  *s = (section_t){.name = "hello-reply", .fn = read_hello_reply, .count = 1};
  ecs_wbuf_init(&s->w);
  ecs_hello_reply_t hr;
  memset(&hr, 0, sizeof hr);
  strcpy(hr.node_id, "node-a");
  hr.max_items = 64;
  hr.max_data = 1 << 20;
  ecs_proto_hello_reply_write(&s->w, &hr);

  s = &out[k++];
  *s = (section_t){.name = "stat", .fn = read_stat, .count = 1};
  ecs_wbuf_init(&s->w);
  ecs_stat_reply_t st;
  memset(&st, 0x5a, sizeof st);
  ecs_proto_stat_write(&s->w, &st);

  *n = k;
}

static void free_sections(section_t *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    ecs_wbuf_free(&s[i].w);
}

static void test_truncation_every_offset(void **state) {
  (void)state;
  section_t secs[16];
  size_t n;
  build_sections(secs, &n);
  for (size_t i = 0; i < n; i++) {
    const section_t *s = &secs[i];
    assert_int_equal(s->w.err, ECS_OK);
    ecs_rbuf_t r;
    uint8_t *full = dup_exact(s->w.p, s->w.len);
    assert_int_equal(decode_section(s, full, s->w.len, &r), ECS_OK);
    assert_int_equal(r.pos, s->w.len);
    free(full);
    for (size_t cut = 0; cut < s->w.len; cut++) {
      uint8_t *p = dup_exact(s->w.p, cut);
      int rc = decode_section(s, p, cut, &r);
      if (rc != ECS_EPROTO)
        fail_msg("%s truncated to %zu of %zu bytes: %d, want EPROTO", s->name, cut, s->w.len, rc);
      assert_int_equal(r.err, ECS_EPROTO);
      assert_true(r.pos <= cut);
      free(p);
    }
  }
  free_sections(secs, n);
}

/* ---- random mutation ---------------------------------------------------- */

/* Checks whatever a reader accepted against the buffer and the limits. */
static void check_accepted(const section_t *s, ecs_rbuf_t *r) {
  for (size_t i = 0; i < s->count; i++) {
    size_t before = r->pos;
    int rc;
    if (s->fn == read_put) {
      ecs_put_item_t it;
      rc = ecs_proto_put_item_read(r, &it);
      if (rc == ECS_OK || rc == ECS_EKEY || rc == ECS_EDTYPE)
        assert_true(in_buf(r, it.key, it.key_len));
      if (rc == ECS_OK) {
        uint64_t size;
        assert_true(it.key_len >= 1 && it.key_len <= ECS_MAX_KEY);
        assert_true(it.desc.ndim <= ECS_MAX_DIMS);
        assert_int_equal(ecs_tensor_nbytes(&it.desc, &size), ECS_OK);
        assert_int_equal(size, it.raw_nbytes);
        if (it.codec == ECS_CODEC_NONE)
          assert_int_equal(size, it.nbytes);
      }
    } else if (s->fn == read_get) {
      ecs_get_item_t it;
      rc = ecs_proto_get_item_read(r, &it);
      if (rc == ECS_OK || rc == ECS_EKEY)
        assert_true(in_buf(r, it.key, it.key_len));
      if (rc == ECS_OK)
        assert_true(it.key_len >= 1 && it.key_len <= ECS_MAX_KEY);
    } else if (s->fn == read_reply) {
      ecs_get_reply_t it;
      rc = ecs_proto_get_reply_read(r, &it);
      if (rc == ECS_OK) {
        assert_true(it.desc.ndim <= ECS_MAX_DIMS);
        if (it.status == ECS_OK)
          assert_int_equal(ecs_tensor_nbytes(&it.desc, NULL), ECS_OK);
      }
    } else if (s->fn == read_key) {
      const uint8_t *k;
      uint16_t kl;
      rc = ecs_proto_key_read(r, &k, &kl);
      if (rc != ECS_EPROTO)
        assert_true(in_buf(r, k, kl));
      if (rc == ECS_OK)
        assert_true(kl >= 1 && kl <= ECS_MAX_KEY);
    } else if (s->fn == read_hello) {
      ecs_hello_t h;
      rc = ecs_proto_hello_read(r, &h);
      if (rc == ECS_OK) {
        assert_true(h.token_len <= ECS_PROTO_MAX_TOKEN);
        assert_true(h.ns_len >= 1 && h.ns_len <= ECS_PROTO_MAX_NS);
        assert_true(in_buf(r, h.token, h.token_len));
        assert_true(in_buf(r, h.ns, h.ns_len));
      }
    } else if (s->fn == read_hello_reply) {
      ecs_hello_reply_t h;
      rc = ecs_proto_hello_reply_read(r, &h);
      if (rc == ECS_OK)
        assert_true(memchr(h.node_id, '\0', sizeof h.node_id) != NULL);
    } else {
      rc = s->fn(r);
    }
    assert_true(r->pos <= r->len);
    if (rc == ECS_EPROTO) {
      assert_int_equal(r->err, ECS_EPROTO);
      return;
    }
    assert_true(rc == ECS_OK || rc == ECS_EKEY || rc == ECS_EDTYPE || rc == ECS_EINVAL);
    assert_true(r->pos > before); /* every record has a fixed part */
  }
}

static void test_random_mutation(void **state) {
  (void)state;
  const char *env = getenv("ECS_TEST_SEED");
  uint64_t seed = env != NULL ? strtoull(env, NULL, 0) : 0x5eedull;
  rng_state = seed;
  print_message("mutation seed 0x%llx (set ECS_TEST_SEED to replay)\n", (unsigned long long)seed);

  section_t secs[16];
  size_t n;
  build_sections(secs, &n);
  uint8_t scratch[4096];
  size_t outcomes[4] = {0}; /* OK, EKEY, EDTYPE, EPROTO for the first record */
  for (int iter = 0; iter < 40000; iter++) {
    const section_t *s = &secs[(size_t)(rnd() % n)];
    size_t len = s->w.len;
    assert_true(len <= sizeof scratch / 2);
    memcpy(scratch, s->w.p, len);
    switch (rnd() % 4) {
    case 0: /* truncate */ len = (size_t)(rnd() % (len + 1)); break;
    case 1: /* extend with random bytes */
      for (size_t add = (size_t)(rnd() % 64); add > 0; add--)
        scratch[len++] = (uint8_t)rnd();
      break;
    default: break;
    }
    for (int flips = 1 + (int)(rnd() % 4); flips > 0 && len > 0; flips--) {
      size_t at = (size_t)(rnd() % len);
      if (rnd() % 2)
        scratch[at] = (uint8_t)rnd();
      else
        scratch[at] ^= (uint8_t)(1u << (rnd() % 8));
    }
    /* Length fields are the interesting targets: hit them on purpose. */
    if (len >= 2 && rnd() % 4 == 0) {
      uint16_t v = (uint16_t)(rnd() % 2 ? rnd() : rnd() % 300); /* small values stay in bounds */
      scratch[0] = (uint8_t)v;
      scratch[1] = (uint8_t)(v >> 8);
    }
    uint8_t *p = dup_exact(scratch, len);
    ecs_rbuf_t r;
    ecs_rbuf_init(&r, p, len);
    check_accepted(s, &r);
    ecs_rbuf_init(&r, p, len);
    int rc = s->fn(&r);
    outcomes[rc == ECS_OK ? 0 : rc == ECS_EKEY ? 1 : rc == ECS_EDTYPE ? 2 : 3]++;
    assert_true(rc == ECS_OK || rc == ECS_EKEY || rc == ECS_EDTYPE || rc == ECS_EINVAL || rc == ECS_EPROTO);
    free(p);
  }
  /* The mutations reach both acceptance and rejection, so the checks
   * above were exercised. */
  print_message("first-record verdicts: %zu OK, %zu EKEY, %zu EDTYPE, %zu EPROTO\n", outcomes[0], outcomes[1],
                outcomes[2], outcomes[3]);
  assert_true(outcomes[0] > 0 && outcomes[3] > 0 && outcomes[1] + outcomes[2] > 0);

  /* Random headers: anything accepted is within the limits. */
  for (int iter = 0; iter < 20000; iter++) {
    uint8_t b[ECS_PROTO_HDR_SIZE];
    ecs_hdr_t h = good_hdr();
    ecs_proto_hdr_encode(&h, b);
    for (int flips = 1 + (int)(rnd() % 3); flips > 0; flips--)
      b[rnd() % sizeof b] = (uint8_t)rnd();
    uint64_t max_data = rnd() % 2 ? rnd() : 4096;
    int rc = ecs_proto_hdr_decode(b, max_data, &h);
    if (rc == ECS_OK) {
      assert_int_equal(h.magic, ECS_PROTO_MAGIC);
      assert_int_equal(h.version, ECS_PROTO_VERSION);
      assert_true(h.count <= ECS_PROTO_MAX_ITEMS);
      assert_true(h.meta_len <= ECS_PROTO_MAX_META);
      assert_true(h.data_len <= max_data);
    } else {
      assert_true(rc == ECS_EPROTO || rc == ECS_ETOOBIG);
    }
  }
  free_sections(secs, n);
}

/* The lease/reserve/commit/attach records: round trips, and every
 * truncation is EPROTO. */
static void test_lease_records(void **state) {
  (void)state;
  ecs_lease_reply_t l;
  memset(&l, 0, sizeof l);
  l.status = ECS_OK;
  l.codec = 0;
  l.desc.dtype = ECS_DTYPE_BF16;
  l.desc.ndim = 2;
  l.desc.shape[0] = 3;
  l.desc.shape[1] = 5;
  l.off = 1ull << 33;
  l.nbytes = l.raw_nbytes = 30;
  l.checksum = 0xabcdef0123456789ull;
  l.lease_id = 42;
  ecs_reserve_reply_t rv = {.status = ECS_ENOSPC, .off = 4096, .resv_id = 7};
  ecs_commit_item_t ci = {.resv_id = 9, .checksum = 0x55, .abort = 1};
  ecs_attach_reply_t ar = {.pool_size = 1ull << 30, .flags = ECS_ATTACH_WRITE};
  for (int kind = 0; kind < 5; kind++) {
    ecs_wbuf_t w;
    ecs_wbuf_init(&w);
    switch (kind) {
    case 0: ecs_proto_lease_reply_write(&w, &l); break;
    case 1: ecs_proto_reserve_reply_write(&w, &rv); break;
    case 2: ecs_proto_commit_item_write(&w, &ci); break;
    case 3: ecs_proto_attach_reply_write(&w, &ar); break;
    default: ecs_proto_u64_write(&w, 0x0102030405060708ull); break;
    }
    assert_int_equal(w.err, ECS_OK);
    for (size_t cut = 0; cut <= w.len; cut++) {
      uint8_t *p = dup_exact(w.p, cut);
      ecs_rbuf_t r;
      ecs_rbuf_init(&r, p, cut);
      int rc;
      ecs_lease_reply_t lo;
      ecs_reserve_reply_t ro;
      ecs_commit_item_t co;
      ecs_attach_reply_t ao;
      uint64_t u = 0;
      switch (kind) {
      case 0: rc = ecs_proto_lease_reply_read(&r, &lo); break;
      case 1: rc = ecs_proto_reserve_reply_read(&r, &ro); break;
      case 2: rc = ecs_proto_commit_item_read(&r, &co); break;
      case 3: rc = ecs_proto_attach_reply_read(&r, &ao); break;
      default: rc = ecs_proto_u64_read(&r, &u); break;
      }
      if (cut < w.len) {
        assert_int_equal(rc, ECS_EPROTO);
      } else {
        assert_int_equal(rc, ECS_OK);
        assert_int_equal(r.pos, w.len);
        switch (kind) {
        case 0:
          assert_int_equal(lo.off, l.off);
          assert_int_equal(lo.lease_id, 42);
          assert_int_equal(lo.checksum, l.checksum);
          assert_int_equal(lo.desc.shape[1], 5);
          break;
        case 1:
          assert_int_equal(ro.status, ECS_ENOSPC);
          assert_int_equal(ro.resv_id, 7);
          break;
        case 2:
          assert_int_equal(co.resv_id, 9);
          assert_int_equal(co.abort, 1);
          break;
        case 3:
          assert_int_equal(ao.pool_size, 1ull << 30);
          assert_int_equal(ao.flags, ECS_ATTACH_WRITE);
          break;
        default: assert_int_equal(u, 0x0102030405060708ull); break;
        }
      }
      free(p);
    }
    ecs_wbuf_free(&w);
  }
  /* a lease whose shape disagrees with its size is refused */
  l.nbytes = 31;
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_proto_lease_reply_write(&w, &l);
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, w.p, w.len);
  ecs_lease_reply_t lo;
  assert_int_equal(ecs_proto_lease_reply_read(&r, &lo), ECS_EDTYPE);
  ecs_wbuf_free(&w);
  /* commit with an abort value other than 0/1 */
  ci.abort = 2;
  ecs_wbuf_init(&w);
  ecs_proto_commit_item_write(&w, &ci);
  ecs_rbuf_init(&r, w.p, w.len);
  ecs_commit_item_t co;
  assert_int_equal(ecs_proto_commit_item_read(&r, &co), ECS_EPROTO);
  ecs_wbuf_free(&w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hdr_exact_bytes),
      cmocka_unit_test(test_hdr_validation),
      cmocka_unit_test(test_wbuf),
      cmocka_unit_test(test_rbuf),
      cmocka_unit_test(test_put_item_exact_bytes),
      cmocka_unit_test(test_other_records_exact_bytes),
      cmocka_unit_test(test_put_item_roundtrip),
      cmocka_unit_test(test_get_roundtrip),
      cmocka_unit_test(test_key_status_roundtrip),
      cmocka_unit_test(test_hello_roundtrip),
      cmocka_unit_test(test_stat_roundtrip),
      cmocka_unit_test(test_put_item_errors),
      cmocka_unit_test(test_get_errors),
      cmocka_unit_test(test_hello_errors),
      cmocka_unit_test(test_truncation_every_offset),
      cmocka_unit_test(test_random_mutation),
      cmocka_unit_test(test_lease_records),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
