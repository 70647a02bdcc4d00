/*
 * test_proto_records: The wire codec's records round trip: put, get, key/status, hello, stat,
 * and the lease/reserve/commit/attach records.
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
#include "store/core/auth.h"
#include "store/core/proto.h"
#include "store/core/sha256.h"

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
       .client_flags = 4}, /* a reserved bit: carried, ignored */
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
  uint64_t vals[17];
  for (int i = 0; i < 17; i++)
    vals[i] = 0x0100000000000000ull * (uint64_t)(i + 1) + (uint64_t)i;
  _Static_assert(sizeof s == sizeof vals, "17 counters");
  memcpy(&s, vals, sizeof s);
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_proto_stat_write(&w, &s);
  ecs_wbuf_u64(&w, 12345); /* a counter a newer server appended */
  uint8_t *p = dup_exact(w.p, w.len);
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, p, w.len);
  /* Wire order is declaration order. */
  for (int i = 0; i < 17; i++)
    assert_int_equal(ecs_rbuf_u64(&r), vals[i]);
  ecs_rbuf_init(&r, p, w.len);
  ecs_stat_reply_t o;
  assert_int_equal(ecs_proto_stat_read(&r, &o), ECS_OK);
  assert_memory_equal(&o, &s, sizeof s);
  assert_int_equal(o.pool_locked, vals[15]);
  assert_int_equal(o.pool_cuda_registered, vals[16]);
  assert_int_equal(r.pos, 17 * 8);
  free(p);
  ecs_wbuf_free(&w);
}

/* A server that predates the appended counters sends the 16 base ones:
 * they read as sent, the later ones as absent (not as 0, which would claim
 * "not registered").  Fewer than 16, or a counter cut short, is EPROTO. */
static void test_stat_older_server(void **state) {
  (void)state;
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  for (uint64_t i = 0; i < ECS_STAT_BASE_COUNTERS; i++)
    ecs_wbuf_u64(&w, i + 1);
  uint8_t *p = dup_exact(w.p, w.len);
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, p, w.len);
  ecs_stat_reply_t o;
  assert_int_equal(ecs_proto_stat_read(&r, &o), ECS_OK);
  assert_int_equal(o.pool_size, 1);
  assert_int_equal(o.pool_locked, 16);
  assert_true(o.pool_cuda_registered == ECS_STAT_ABSENT);
  free(p);

  p = dup_exact(w.p, w.len - 8); /* 15 counters */
  ecs_rbuf_init(&r, p, w.len - 8);
  assert_int_equal(ecs_proto_stat_read(&r, &o), ECS_EPROTO);
  free(p);

  ecs_wbuf_u32(&w, 1); /* half of a 17th counter */
  p = dup_exact(w.p, w.len);
  ecs_rbuf_init(&r, p, w.len);
  assert_int_equal(ecs_proto_stat_read(&r, &o), ECS_EPROTO);
  free(p);
  ecs_wbuf_free(&w);
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
  l.rkey = 0xa1b2c3d4u;
  ecs_reserve_reply_t rv = {.status = ECS_ENOSPC, .off = 4096, .resv_id = 7, .rkey = 0x01020304u};
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
          assert_int_equal(lo.rkey, 0xa1b2c3d4u);
          assert_int_equal(lo.checksum, l.checksum);
          assert_int_equal(lo.desc.shape[1], 5);
          break;
        case 1:
          assert_int_equal(ro.status, ECS_ENOSPC);
          assert_int_equal(ro.resv_id, 7);
          assert_int_equal(ro.rkey, 0x01020304u);
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

/* The token proof's records (HELLO CHALLENGE / PROVE, a reply with the
 * server's proof) round trip, and the ill-formed ones are refused; the
 * proof itself is the HMAC that auth.h spells out. */
static void test_hello_proof(void **state) {
  (void)state;
  uint8_t id[ECS_AUTH_ID_SIZE], nonce[ECS_AUTH_NONCE_SIZE], mac[ECS_AUTH_MAC_SIZE];
  memset(id, 1, sizeof id);
  memset(nonce, 2, sizeof nonce);
  memset(mac, 3, sizeof mac);
  ecs_hello_t ch = {.ns = (const uint8_t *)"ns",
                    .ns_len = 2,
                    .client_flags = ECS_HELLO_C_CHALLENGE,
                    .key_id = id,
                    .nonce = nonce};
  ecs_hello_t pv = {.ns = (const uint8_t *)"ns", .ns_len = 2, .client_flags = ECS_HELLO_C_PROVE, .mac = mac};
  const ecs_hello_t *in[2] = {&ch, &pv};
  for (int i = 0; i < 2; i++) {
    ecs_wbuf_t w;
    ecs_wbuf_init(&w);
    ecs_proto_hello_write(&w, in[i]);
    assert_int_equal(w.len, 8u + 2 + (i == 0 ? 48u : 32u));
    for (size_t cut = 0; cut <= w.len; cut++) { /* every truncation refused, the whole accepted */
      uint8_t *p = dup_exact(w.p, cut);
      ecs_rbuf_t r;
      ecs_rbuf_init(&r, p, cut);
      ecs_hello_t o;
      int rc = ecs_proto_hello_read(&r, &o);
      assert_int_equal(rc, cut == w.len ? ECS_OK : ECS_EPROTO);
      if (rc == ECS_OK && i == 0) {
        assert_memory_equal(o.key_id, id, sizeof id);
        assert_memory_equal(o.nonce, nonce, sizeof nonce);
      } else if (rc == ECS_OK) {
        assert_memory_equal(o.mac, mac, sizeof mac);
      }
      free(p);
    }
    ecs_wbuf_free(&w);
  }
  /* both phases at once, or a token beside a proof: refused */
  uint8_t bad[8 + 1 + 1 + 48] = {1, 0, 1, 0, 3, 0, 0, 0, 't', 'n'};
  ecs_rbuf_t r;
  ecs_hello_t o;
  ecs_rbuf_init(&r, bad, sizeof bad);
  assert_int_equal(ecs_proto_hello_read(&r, &o), ECS_EPROTO);
  bad[4] = 1;
  ecs_rbuf_init(&r, bad, sizeof bad);
  assert_int_equal(ecs_proto_hello_read(&r, &o), ECS_EPROTO);

  ecs_hello_reply_t hr;
  memset(&hr, 0, sizeof hr);
  snprintf(hr.node_id, sizeof hr.node_id, "n1");
  hr.proof = 1;
  snprintf(hr.addr, sizeof hr.addr, "10.0.0.1:7700");
  memset(hr.snonce, 4, sizeof hr.snonce);
  memset(hr.smac, 5, sizeof hr.smac);
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_proto_hello_reply_write(&w, &hr);
  for (size_t cut = 0; cut <= w.len; cut++) {
    uint8_t *p = dup_exact(w.p, cut);
    ecs_rbuf_init(&r, p, cut);
    ecs_hello_reply_t ho;
    int rc = ecs_proto_hello_reply_read(&r, &ho);
    if (cut == w.len) {
      assert_int_equal(rc, ECS_OK);
      assert_int_equal(ho.proof, 1);
      assert_string_equal(ho.addr, "10.0.0.1:7700");
      assert_memory_equal(ho.snonce, hr.snonce, sizeof hr.snonce);
      assert_memory_equal(ho.smac, hr.smac, sizeof hr.smac);
    } else if (cut >= 34 + 2) {
      assert_int_equal(rc, ECS_EPROTO); /* the flag promised a proof */
    }
    free(p);
  }
  ecs_wbuf_free(&w);

  /* the MAC is HMAC(key, label NUL cn sn len|ns len|node len|addr) */
  uint8_t key[ECS_AUTH_KEY_SIZE], got[32], want[32], msg[256];
  ecs__auth_key("tok", 3, "ns", key);
  uint8_t k2[32];
  ecs__hmac_sha256("tok", 3, "ecstore-auth-v1 key\0ns", 22, k2);
  assert_memory_equal(key, k2, 32);
  ecs__auth_mac(key, 1, nonce, mac, "ns", "n1", "a:1", got);
  size_t n = 0;
  memcpy(msg, "ecstore-auth-v1 server", 23), n = 23;
  memcpy(msg + n, nonce, 32), n += 32;
  memcpy(msg + n, mac, 32), n += 32;
  memcpy(msg + n,
         "\x02\x00"
         "ns"
         "\x02\x00"
         "n1"
         "\x03\x00"
         "a:1",
         13),
      n += 13;
  ecs__hmac_sha256(key, 32, msg, n, want);
  assert_memory_equal(got, want, 32);
  ecs__auth_mac(key, 0, nonce, mac, "ns", "n1", "a:1", want); /* the client's differs */
  assert_memory_not_equal(got, want, 32);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_put_item_roundtrip),   cmocka_unit_test(test_get_roundtrip),
      cmocka_unit_test(test_key_status_roundtrip), cmocka_unit_test(test_hello_roundtrip),
      cmocka_unit_test(test_hello_proof),          cmocka_unit_test(test_stat_roundtrip),
      cmocka_unit_test(test_stat_older_server),    cmocka_unit_test(test_lease_records),
  };
  return cmocka_run_group_tests_name("proto_records", tests, NULL, NULL);
}
