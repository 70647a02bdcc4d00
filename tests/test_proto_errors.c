/*
 * test_proto_errors: Bad input to the wire codec: every validation error, truncation at
 * every byte offset, and random mutation; each leaves the reader where it
 * should and changes nothing.
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
  it.flags = ECS_PUT_F_UPSERT | ECS_PUT_F_SOFT_PIN; /* a soft pin (Mooncake's) travels too */
  ecs_proto_put_item_write(&w, &it);
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

/* A decoder for one meta section: count records of one kind. */
typedef struct section {
  const char *name;
  read1_fn fn;
  size_t count;
  ecs_wbuf_t w;
  size_t ok_cut; /* a shorter length that is still whole (0: none): an older peer's record */
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
  /* an older server's STAT reply ends after the 16 base counters */
  *s = (section_t){.name = "stat", .fn = read_stat, .count = 1, .ok_cut = ECS_STAT_BASE_COUNTERS * 8};
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
      if (cut == s->ok_cut && cut) {
        assert_int_equal(rc, ECS_OK);
        assert_int_equal(r.pos, cut);
        free(p);
        continue;
      }
      if (rc != ECS_EPROTO)
        fail_msg("%s truncated to %zu of %zu bytes: %d, want EPROTO", s->name, cut, s->w.len, rc);
      assert_int_equal(r.err, ECS_EPROTO);
      assert_true(r.pos <= cut);
      free(p);
    }
  }
  free_sections(secs, n);
}

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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_put_item_errors), cmocka_unit_test(test_get_errors),
      cmocka_unit_test(test_hello_errors),    cmocka_unit_test(test_truncation_every_offset),
      cmocka_unit_test(test_random_mutation),
  };
  return cmocka_run_group_tests_name("proto_errors", tests, NULL, NULL);
}
