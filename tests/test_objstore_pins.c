/*
 * The object store's pins and eviction classes (issue 25): hard pins are
 * never evicted (on demand, background or a tenant's quota) and are
 * bounded by their quota; a refused put evicts nothing; the background
 * tick and other tenants' puts never walk past objects they may not
 * evict; soft pins with their own TTLs go in the order the pins end.  The
 * wire encoding of a per-put pin TTL is here too.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ecstore/pool.h"
#include "store/core/proto.h"
#include "store/server/objstore.h"

#define MiB (1024u * 1024u)
#define KiB 1024u
#define POOL_SIZE (64u * MiB)
#define FAR_FUTURE (UINT64_MAX / 2)

/* Per-test fixture: a pool, an objstore and the keys it evicted. */
typedef struct fx {
  ecs_pool_t *pool;     /* 64 MiB, min block 4096 */
  ecs_objstore_t *os;   /* the store under test */
  uint64_t base_in_use; /* pool bytes_in_use before any object */
  char evicted[64][16]; /* the first keys evicted, in order */
  size_t nev;           /* evictions seen (all of them, past 64 too) */
} fx_t;

static void on_drop(void *ctx, const ecs_obj_t *obj, ecs_drop_reason_t why) {
  fx_t *f = ctx;
  if (why != ECS_DROP_EVICTED)
    return;
  assert_int_equal(obj->hard_pin, 0); /* a hard pin is never evicted */
  if (f->nev < 64) {
    size_t n = obj->key_len < 15 ? obj->key_len : 15;
    memcpy(f->evicted[f->nev], obj->key, n);
    f->evicted[f->nev][n] = '\0';
  }
  f->nev++;
}

static uint64_t in_use(ecs_pool_t *pool) {
  ecs_pool_stats_t st;
  ecs_pool_stats(pool, &st);
  return st.bytes_in_use;
}

static fx_t *fx_new(double high, double low) {
  fx_t *f = calloc(1, sizeof *f);
  assert_non_null(f);
  ecs_pool_opts_t po;
  ecs_pool_opts_init(&po);
  po.size = POOL_SIZE;
  po.lock = 0;
  po.name = "test-objstore-pins";
  assert_int_equal(ecs_pool_create(&po, &f->pool), ECS_OK);
  f->base_in_use = in_use(f->pool);
  ecs_objstore_opts_t o;
  ecs_objstore_opts_init(&o);
  o.high_watermark = high;
  o.low_watermark = low;
  o.on_drop = on_drop;
  o.cb_ctx = f;
  assert_int_equal(ecs_objstore_create(f->pool, &o, &f->os), ECS_OK);
  return f;
}

static int fx_setup(void **state) {
  *state = fx_new(0.95, 0.85);
  return 0;
}

static int fx_teardown(void **state) {
  fx_t *f = *state;
  ecs_objstore_destroy(f->os);
  assert_int_equal(in_use(f->pool), f->base_in_use);
  assert_int_equal(ecs_pool_validate(f->pool), ECS_OK);
  ecs_pool_destroy(f->pool);
  free(f);
  return 0;
}

/* Reserves key (flags ECS_RESERVE_*, as owner, soft-pinned until `until`;
 * 0: not), stamps it, and commits it unless pending is given. */
static int put_x(fx_t *f, const char *key, uint64_t nbytes, unsigned flags, uint16_t owner, uint64_t until,
                 ecs_obj_t **pending) {
  ecs_obj_t *o = NULL;
  int rc = ecs_objstore_reserve_as(f->os, key, (uint16_t)strlen(key), nbytes, flags, owner, &o);
  if (rc != ECS_OK)
    return rc;
  if (nbytes) {
    uint8_t *p = ecs_objstore_data(f->os, o);
    p[0] = p[nbytes - 1] = (uint8_t)key[0];
  }
  o->raw_nbytes = nbytes;
  o->keep_until_ms = until;
  if (pending)
    *pending = o;
  else
    ecs_objstore_commit(f->os, o);
  return ECS_OK;
}

static int put(fx_t *f, const char *key, uint64_t nbytes) {
  return put_x(f, key, nbytes, 0, 0, 0, NULL);
}

static int put_hard(fx_t *f, const char *key, uint64_t nbytes) {
  return put_x(f, key, nbytes, ECS_RESERVE_HARD_PIN, 0, 0, NULL);
}

static int present(fx_t *f, const char *key) {
  ecs_obj_t *o = ecs_objstore_find(f->os, key, (uint16_t)strlen(key));
  return o && o->state == ECS_OBJ_COMMITTED;
}

static void fill(fx_t *f, const char *prefix, int n, uint64_t sz, unsigned flags, uint16_t owner) {
  char key[32];
  for (int i = 0; i < n; i++) {
    snprintf(key, sizeof key, "%s%d", prefix, i);
    assert_int_equal(put_x(f, key, sz, flags, owner, 0, NULL), ECS_OK);
  }
}

static ecs_objstore_stats_t stats(fx_t *f) {
  ecs_objstore_stats_t st;
  ecs_objstore_stats(f->os, &st);
  return st;
}

/* ---- hard pins ------------------------------------------------------------ */

/* Hard pins outlive any pressure: puts that cycle the pool several times
 * over, background eviction down to an empty pool, and a pool so full of
 * them that a plain put finds no room (ENOSPC, nothing of theirs taken). */
static void test_hard_pin_survives_pressure(void **state) {
  fx_t *f = fx_new(0.5, 0.0);
  *state = f;
  fill(f, "h", 8, MiB, ECS_RESERVE_HARD_PIN, 0);
  fill(f, "o", 200, MiB, 0, 0); /* three times the pool */
  assert_true(f->nev >= 200 - 56);
  for (int i = 0; i < 8; i++) {
    char key[8];
    snprintf(key, sizeof key, "h%d", i);
    assert_true(present(f, key));
  }
  ecs_objstore_evict_background(f->os, 1000);
  assert_int_equal(stats(f).objects, 8); /* only the hard pins are left */
  assert_int_equal(in_use(f->pool), f->base_in_use + 8ull * MiB);
  assert_int_equal(ecs_objstore_hard_bytes(f->os), 8ull * MiB);
  /* Hard pins up to the whole pool (the cap raised): a plain put is ENOSPC. */
  ecs_objstore_set_hard_max(f->os, POOL_SIZE);
  fill(f, "H", 56, MiB, ECS_RESERVE_HARD_PIN, 0);
  size_t nev = f->nev;
  assert_int_equal(put(f, "late", MiB), ECS_ENOSPC);
  assert_int_equal(f->nev, nev);
  assert_int_equal(stats(f).objects, 64);
  assert_int_equal(ecs_pool_validate(f->pool), ECS_OK);
}

/* Hard pins are bounded: past --hard-pin-max (default half the pool) an
 * item is ECS_EPINQUOTA and nothing is evicted; pending hard pins count;
 * an abort, a remove, a replacement give the room back.  Plain puts go on. */
static void test_hard_pin_quota(void **state) {
  fx_t *f = *state;
  fill(f, "o", 40, MiB, 0, 0);
  fill(f, "h", 31, MiB, ECS_RESERVE_HARD_PIN, 0); /* evicts 7 plain ones */
  ecs_obj_t *pend = NULL;
  assert_int_equal(put_x(f, "hp", MiB, ECS_RESERVE_HARD_PIN, 0, 0, &pend), ECS_OK); /* 32 MiB: the cap */
  size_t nev = f->nev;
  assert_int_equal(put_hard(f, "h-over", 1), ECS_EPINQUOTA);
  assert_int_equal(f->nev, nev);
  assert_false(present(f, "h-over"));
  ecs_objstore_abort(f->os, pend);
  assert_int_equal(ecs_objstore_hard_bytes(f->os), 31ull * MiB);
  assert_int_equal(put_hard(f, "h-2M", 2 * MiB), ECS_EPINQUOTA);
  assert_int_equal(put_hard(f, "h31", MiB), ECS_OK);
  assert_int_equal(put(f, "plain", 4 * MiB), ECS_OK); /* plain puts are not limited by it */
  /* remove gives the room back */
  assert_int_equal(ecs_objstore_remove(f->os, "h0", 2), ECS_OK);
  assert_int_equal(ecs_objstore_hard_bytes(f->os), 31ull * MiB);
  assert_int_equal(put_hard(f, "h-again", MiB), ECS_OK);
  /* so does an upsert of a hard pin by an unpinned object */
  assert_int_equal(put_x(f, "h1", 4096, ECS_RESERVE_REPLACE, 0, 0, NULL), ECS_OK);
  assert_int_equal(ecs_objstore_hard_bytes(f->os), 31ull * MiB);
  ecs_obj_t *h1 = ecs_objstore_find(f->os, "h1", 2);
  assert_int_equal(h1->hard_pin, 0);
  /* a cap of 0 means the default; one over the pool means the pool */
  ecs_objstore_set_hard_max(f->os, 0);
  assert_int_equal(put_hard(f, "h-x", 2 * MiB), ECS_EPINQUOTA);
  assert_int_equal(put_hard(f, "h-x", MiB), ECS_OK);
  assert_int_equal(ecs_pool_validate(f->pool), ECS_OK);
}

/* A tenant with a quota: its hard pins count against its quota, are not
 * evicted to make room under it, and are bounded by its share of the cap
 * (hard max / pool of its quota).  A tenant without a quota shares the
 * global cap. */
static void test_hard_pin_tenant(void **state) {
  fx_t *f = *state;
  const uint64_t quota[2] = {16 * MiB, 0};
  assert_int_equal(ecs_objstore_set_owners(f->os, 2, quota), ECS_OK);
  ecs_objstore_set_hard_max(f->os, 16 * MiB); /* a quarter: tenant 1 may hard-pin 4 MiB */
  fill(f, "h", 4, MiB, ECS_RESERVE_HARD_PIN, 1);
  assert_int_equal(put_x(f, "h-over", MiB, ECS_RESERVE_HARD_PIN, 1, 0, NULL), ECS_EPINQUOTA);
  fill(f, "u", 12, MiB, 0, 1); /* at its quota: 4 hard + 12 */
  assert_int_equal(ecs_objstore_owner_bytes(f->os, 1), 16ull * MiB);
  /* past the quota its own unpinned objects go, the hard pins never */
  assert_int_equal(put_x(f, "n0", 12 * MiB, 0, 1, 0, NULL), ECS_OK);
  assert_int_equal(f->nev, 12);
  for (int i = 0; i < 4; i++) {
    char key[8];
    snprintf(key, sizeof key, "h%d", i);
    assert_true(present(f, key));
  }
  /* only hard pins and the new one are left: a put that needs them is refused, nothing evicted */
  assert_int_equal(put_x(f, "n1", 13 * MiB, 0, 1, 0, NULL), ECS_EQUOTA);
  assert_int_equal(f->nev, 12);
  /* tenant 2 (no quota) shares the global cap: 16 - 4 = 12 MiB */
  assert_int_equal(put_x(f, "t2a", 12 * MiB, ECS_RESERVE_HARD_PIN, 2, 0, NULL), ECS_OK);
  assert_int_equal(put_x(f, "t2b", 1, ECS_RESERVE_HARD_PIN, 2, 0, NULL), ECS_EPINQUOTA);
  assert_int_equal(ecs_objstore_remove(f->os, "h0", 2), ECS_OK);
  assert_int_equal(ecs_objstore_owner_bytes(f->os, 1), 15ull * MiB);
  assert_int_equal(put_x(f, "t2b", 1, ECS_RESERVE_HARD_PIN, 2, 0, NULL), ECS_OK);
}

/* ---- refusals that evict nothing (issue 25 O1) ----------------------------- */

/* A tenant over its quota whose put can find no room in the pool anyway
 * (the rest is another tenant's, or pending) is refused before anything is
 * evicted: the old code evicted its oldest object, then failed ENOSPC. */
static void test_quota_no_wasted_eviction(void **state) {
  fx_t *f = *state;
  const uint64_t quota[2] = {10 * MiB, 56 * MiB};
  assert_int_equal(ecs_objstore_set_owners(f->os, 2, quota), ECS_OK);
  assert_int_equal(put_x(f, "a-old", 2 * MiB, 0, 1, 0, NULL), ECS_OK);
  ecs_obj_t *w = NULL;
  assert_int_equal(put_x(f, "a-pending", 6 * MiB, 0, 1, 0, &w), ECS_OK);
  fill(f, "b", 56, MiB, 0, 2); /* the pool is full */
  assert_int_equal(f->nev, 0);
  assert_int_equal(put_x(f, "a-new", 3 * MiB, 0, 1, 0, NULL), ECS_ENOSPC);
  assert_int_equal(f->nev, 0);
  assert_true(present(f, "a-old"));
  assert_int_equal(ecs_objstore_owner_bytes(f->os, 1), 8ull * MiB);
  ecs_objstore_commit(f->os, w);
  /* with a-pending committed there is room to make: both go, oldest first */
  assert_int_equal(put_x(f, "a-new", 3 * MiB, 0, 1, 0, NULL), ECS_OK);
  assert_int_equal(f->nev, 2);
  assert_string_equal(f->evicted[0], "a-old");
  assert_string_equal(f->evicted[1], "a-pending");
}

/* Without quotas too: a put that all the unheld objects could not make
 * room for evicts none of them. */
static void test_no_wasted_eviction(void **state) {
  fx_t *f = *state;
  fill(f, "o", 64, MiB, 0, 0);
  ecs_obj_t *held[62];
  for (int i = 0; i < 62; i++) {
    char key[8];
    snprintf(key, sizeof key, "o%d", i + 2);
    held[i] = ecs_objstore_acquire(f->os, key, (uint16_t)strlen(key));
    assert_non_null(held[i]);
  }
  assert_int_equal(put(f, "big", 4 * MiB), ECS_ENOSPC); /* 2 MiB could go: not enough */
  assert_int_equal(f->nev, 0);
  assert_int_equal(put(f, "two", 2 * MiB), ECS_OK);
  assert_int_equal(f->nev, 2);
  for (int i = 0; i < 62; i++)
    ecs_objstore_release(f->os, held[i]);
}

/* ---- what eviction walks past (issue 25 O3) --------------------------------- */

/* The background tick and other puts never look at hard pins, at other
 * tenants' quota'd objects, nor (before they must) at live soft pins: with
 * thousands of them in the store, a hundred ticks pass over none.  (One
 * FIFO made each tick walk past all of them: millions of steps here.) */
static void test_background_skips_pinned(void **state) {
  fx_t *f = fx_new(0.5, 0.25); /* high 32 MiB, low 16 MiB */
  *state = f;
  const uint64_t quota[1] = {32 * MiB};
  assert_int_equal(ecs_objstore_set_owners(f->os, 1, quota), ECS_OK);
  for (int i = 0; i < 1000; i++) { /* ~4 MiB soft pins, the oldest */
    char key[16];
    snprintf(key, sizeof key, "s%d", i);
    assert_int_equal(put_x(f, key, 4 * KiB, 0, 0, FAR_FUTURE, NULL), ECS_OK);
  }
  fill(f, "q", 4000, 4 * KiB, 0, 1);                    /* ~16 MiB a tenant's with a quota */
  fill(f, "h", 2000, 4 * KiB, ECS_RESERVE_HARD_PIN, 0); /* ~8 MiB hard pins */
  fill(f, "o", 2000, 4 * KiB, 0, 0);                    /* ~8 MiB anyone's: over high */
  uint64_t skipped = stats(f).evict_skipped;
  unsigned n = 0;
  for (int i = 0; i < 100; i++)
    n += ecs_objstore_evict_background(f->os, 8); /* a small budget: many ticks */
  assert_true(n > 0);
  assert_int_equal(stats(f).evict_skipped - skipped, 0);
  /* a stalled run (nothing but pins left above low: the soft ones went
   * last) that a commit wakes looks at the new object only */
  ecs_objstore_evict_background(f->os, 100000);
  for (int i = 0; i < 100; i++) {
    char key[16];
    snprintf(key, sizeof key, "late%d", i);
    assert_int_equal(put(f, key, 4 * KiB), ECS_OK);
    ecs_objstore_evict_background(f->os, 256);
  }
  assert_int_equal(stats(f).evict_skipped - skipped, 0);
  assert_false(present(f, "s0"));
  assert_true(present(f, "q0") && present(f, "h0"));
}

/* ---- soft pins with their own TTL ----------------------------------------- */

/* Soft pins with per-put TTLs: when only pinned objects are left, the pin
 * that ends first goes first (not the oldest); an expired pin is no pin. */
static void test_soft_pin_ttl_order(void **state) {
  fx_t *f = *state;
  assert_int_equal(put_x(f, "long", MiB, 0, 0, FAR_FUTURE, NULL), ECS_OK);
  assert_int_equal(put_x(f, "short", MiB, 0, 0, FAR_FUTURE - 1000, NULL), ECS_OK);
  assert_int_equal(put_x(f, "ended", MiB, 0, 0, 1, NULL), ECS_OK);
  fill(f, "o", 61, MiB, 0, 0); /* full */
  assert_int_equal(put(f, "n0", MiB), ECS_OK);
  assert_string_equal(f->evicted[0], "ended");
  ecs_obj_t *held[61];
  for (int i = 0; i < 61; i++) {
    char key[8];
    snprintf(key, sizeof key, "o%d", i);
    held[i] = ecs_objstore_acquire(f->os, key, (uint16_t)strlen(key));
  }
  ecs_obj_t *n0 = ecs_objstore_acquire(f->os, "n0", 2);
  assert_int_equal(put(f, "n1", MiB), ECS_OK);
  assert_string_equal(f->evicted[1], "short");
  assert_true(present(f, "long"));
  ecs_objstore_release(f->os, n0);
  for (int i = 0; i < 61; i++)
    ecs_objstore_release(f->os, held[i]);
}

/* The per-put TTL on the wire: seconds up to 32767, then minutes, rounded
 * up, clamped at 32767 minutes. */
static void test_pin_ttl_encoding(void **state) {
  (void)state;
  assert_int_equal(ecs_proto_pin_ttl_encode(0), 0);
  assert_int_equal(ecs_proto_pin_ttl_encode(1), 1);
  assert_int_equal(ecs_proto_pin_ttl_encode(1000), 1);
  assert_int_equal(ecs_proto_pin_ttl_encode(1001), 2);
  assert_int_equal(ecs_proto_pin_ttl_decode(ecs_proto_pin_ttl_encode(60000)), 60000);
  assert_int_equal(ecs_proto_pin_ttl_decode(ecs_proto_pin_ttl_encode(32767000)), 32767000);
  assert_int_equal(ecs_proto_pin_ttl_decode(ecs_proto_pin_ttl_encode(32768000)), 547ull * 60000); /* up */
  assert_int_equal(ecs_proto_pin_ttl_decode(ecs_proto_pin_ttl_encode(UINT64_MAX)), 32767ull * 60000);
  for (uint64_t ms = 1; ms < (1ull << 36); ms = ms * 3 + 7) {
    uint64_t back = ecs_proto_pin_ttl_decode(ecs_proto_pin_ttl_encode(ms));
    assert_true(back >= ms || back == 32767ull * 60000);
  }
  /* the item carries it in the once-reserved bytes 6..7 */
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_put_item_t it = {.key = (const uint8_t *)"k",
                       .key_len = 1,
                       .flags = ECS_PUT_F_SOFT_PIN | ECS_PUT_F_PIN_TTL,
                       .pin_ttl = 0x8123,
                       .desc = {.dtype = ECS_DTYPE_U8, .ndim = 1, .shape = {4}},
                       .nbytes = 4,
                       .raw_nbytes = 4};
  ecs_proto_put_item_write(&w, &it);
  assert_int_equal(w.err, ECS_OK);
  assert_int_equal(w.p[5], ECS_PUT_F_SOFT_PIN | ECS_PUT_F_PIN_TTL);
  assert_int_equal(w.p[6] | w.p[7] << 8, 0x8123); /* little-endian, as every field */
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, w.p, w.len);
  ecs_put_item_t back;
  assert_int_equal(ecs_proto_put_item_read(&r, &back), ECS_OK);
  assert_int_equal(back.pin_ttl, 0x8123);
  assert_int_equal(back.flags, ECS_PUT_F_SOFT_PIN | ECS_PUT_F_PIN_TTL);
  ecs_wbuf_free(&w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_hard_pin_survives_pressure, NULL, fx_teardown),
      cmocka_unit_test_setup_teardown(test_hard_pin_quota, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_hard_pin_tenant, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_quota_no_wasted_eviction, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_no_wasted_eviction, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_background_skips_pinned, NULL, fx_teardown),
      cmocka_unit_test_setup_teardown(test_soft_pin_ttl_order, fx_setup, fx_teardown),
      cmocka_unit_test(test_pin_ttl_encoding),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
