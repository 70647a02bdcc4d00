/*
 * The object store over a real (small, unpinned) pool: life cycle, key
 * conflicts, FIFO eviction observed through the callback, references that
 * hold objects and blocks, watermarks, zero-byte objects, a randomized run
 * against a model, and hash table growth.
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
#include "store/server/objstore.h"

#define MiB (1024u * 1024u)
#define POOL_SIZE (64u * MiB)
#define MAX_EVENTS 4096

/* One callback call, as observed. */
typedef struct event {
  char key[32];          /* the object's key, NUL-terminated here */
  ecs_drop_reason_t why; /* evicted or removed */
  uint64_t seq;          /* its commit sequence number */
  uint64_t nbytes;       /* its size */
  int state;             /* its state during the callback */
} event_t;

/* Per-test fixture: a pool, an objstore and the callback's log. */
typedef struct fx {
  ecs_pool_t *pool;       /* 64 MiB, min block 4096 */
  ecs_objstore_t *os;     /* the store under test */
  uint64_t base_in_use;   /* pool bytes_in_use before any object */
  event_t ev[MAX_EVENTS]; /* callback log */
  size_t nev;             /* entries in ev */
} fx_t;

static void on_drop(void *ctx, const ecs_obj_t *obj, ecs_drop_reason_t why) {
  fx_t *f = ctx;
  assert_true(f->nev < MAX_EVENTS);
  event_t *e = &f->ev[f->nev++];
  size_t n = obj->key_len < sizeof e->key - 1 ? obj->key_len : sizeof e->key - 1;
  memcpy(e->key, obj->key, n);
  e->key[n] = '\0';
  e->why = why;
  e->seq = obj->seq;
  e->nbytes = obj->nbytes;
  e->state = obj->state;
  /* The object and its bytes are still there during the callback; the key
   * is gone from the index, except for the replacement being committed. */
  ecs_obj_t *now = ecs_objstore_find(f->os, obj->key, obj->key_len);
  if (why == ECS_DROP_REPLACED)
    assert_true(now && now != obj && now->state == ECS_OBJ_PENDING);
  else /* NULL, or a replacement still being written */
    assert_true(now == NULL || (now != obj && now->state == ECS_OBJ_PENDING));
  if (obj->nbytes) {
    const uint8_t *p = ecs_objstore_data(f->os, obj);
    assert_int_equal(p[0], (uint8_t)obj->key[0]);
  }
}

/* For tests that only count drops (the many-keys one would overflow ev). */
static void count_drop(void *ctx, const ecs_obj_t *obj, ecs_drop_reason_t why) {
  (void)obj;
  (void)why;
  (*(uint64_t *)ctx)++;
}

static ecs_pool_t *make_pool(void) {
  ecs_pool_opts_t po;
  ecs_pool_opts_init(&po);
  po.size = POOL_SIZE;
  po.lock = 0;
  po.name = "test-objstore";
  ecs_pool_t *pool = NULL;
  assert_int_equal(ecs_pool_create(&po, &pool), ECS_OK);
  return pool;
}

static uint64_t in_use(ecs_pool_t *pool) {
  ecs_pool_stats_t st;
  ecs_pool_stats(pool, &st);
  return st.bytes_in_use;
}

static fx_t *fx_new(double high, double low) {
  fx_t *f = calloc(1, sizeof *f);
  assert_non_null(f);
  f->pool = make_pool();
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

/* Destroying the store gives every block back, whatever state it was in. */
static int fx_teardown(void **state) {
  fx_t *f = *state;
  ecs_objstore_destroy(f->os);
  assert_int_equal(in_use(f->pool), f->base_in_use);
  assert_int_equal(ecs_pool_validate(f->pool), ECS_OK);
  ecs_pool_destroy(f->pool);
  free(f);
  return 0;
}

static uint64_t rounded(uint64_t n) {
  return (n + 4095) / 4096 * 4096;
}

/* Reserves, stamps the first and last byte with the key's first byte,
 * commits.  Returns the reserve status. */
static int put(fx_t *f, const char *key, uint64_t nbytes) {
  ecs_obj_t *o = NULL;
  int rc = ecs_objstore_reserve(f->os, key, (uint16_t)strlen(key), nbytes, &o);
  if (rc != ECS_OK)
    return rc;
  if (nbytes) {
    uint8_t *p = ecs_objstore_data(f->os, o);
    p[0] = p[nbytes - 1] = (uint8_t)key[0];
  }
  o->raw_nbytes = nbytes;
  ecs_objstore_commit(f->os, o);
  return ECS_OK;
}

static ecs_obj_t *get(fx_t *f, const char *key) {
  return ecs_objstore_acquire(f->os, key, (uint16_t)strlen(key));
}

static ecs_objstore_stats_t stats(fx_t *f) {
  ecs_objstore_stats_t st;
  ecs_objstore_stats(f->os, &st);
  return st;
}

/* Fills the pool with n objects of sz bytes keyed "<prefix><i>". */
static void fill(fx_t *f, const char *prefix, int n, uint64_t sz) {
  char key[32];
  for (int i = 0; i < n; i++) {
    snprintf(key, sizeof key, "%s%d", prefix, i);
    assert_int_equal(put(f, key, sz), ECS_OK);
  }
}

/* ---- life cycle ----------------------------------------------------------- */

static void test_lifecycle(void **state) {
  fx_t *f = *state;
  ecs_obj_t *o = NULL;
  assert_int_equal(ecs_objstore_reserve(f->os, "alpha", 5, 10000, &o), ECS_OK);
  assert_int_equal(o->state, ECS_OBJ_PENDING);
  assert_int_equal(o->refs, 1);
  assert_int_equal(o->seq, 0);
  assert_int_equal(o->nbytes, 10000);
  assert_ptr_equal(ecs_objstore_find(f->os, "alpha", 5), o);
  assert_null(get(f, "alpha")); /* pending is invisible to readers */
  assert_int_equal(stats(f).pending, 1);
  assert_int_equal(in_use(f->pool), f->base_in_use + rounded(10000));

  memset(ecs_objstore_data(f->os, o), 'a', 10000); /* on_drop checks byte 0 */
  o->codec = 0;
  o->raw_nbytes = 10000;
  o->checksum = 42;
  o->desc.dtype = ECS_DTYPE_U8;
  o->desc.ndim = 1;
  o->desc.shape[0] = 10000;
  ecs_objstore_commit(f->os, o);
  assert_int_equal(o->state, ECS_OBJ_COMMITTED);
  assert_int_equal(o->refs, 0);
  assert_int_equal(o->seq, 1);
  assert_true(o->commit_ms > 1600000000000ull); /* filled in when left 0 */
  ecs_objstore_stats_t st = stats(f);
  assert_int_equal(st.objects, 1);
  assert_int_equal(st.pending, 0);
  assert_int_equal(st.bytes_live, 10000);

  ecs_obj_t *r = get(f, "alpha");
  assert_ptr_equal(r, o);
  assert_int_equal(r->refs, 1);
  const uint8_t *p = ecs_objstore_data(f->os, r);
  assert_int_equal(p[0], 'a');
  assert_int_equal(p[9999], 'a');
  assert_int_equal(r->checksum, 42);
  ecs_objstore_release(f->os, r);
  assert_int_equal(o->refs, 0);

  ecs_obj_t *b = NULL; /* a commit time set by the caller is kept */
  assert_int_equal(ecs_objstore_reserve(f->os, "beta", 4, 1, &b), ECS_OK);
  *(uint8_t *)ecs_objstore_data(f->os, b) = 'b';
  b->commit_ms = 1234;
  ecs_objstore_commit(f->os, b);
  assert_int_equal(b->commit_ms, 1234);
  assert_int_equal(b->seq, 2);

  assert_int_equal(ecs_objstore_remove(f->os, "alpha", 5), ECS_OK);
  assert_int_equal(f->nev, 1);
  assert_string_equal(f->ev[0].key, "alpha");
  assert_int_equal(f->ev[0].why, ECS_DROP_REMOVED);
  assert_int_equal(f->ev[0].state, ECS_OBJ_DOOMED);
  assert_int_equal(ecs_objstore_remove(f->os, "alpha", 5), ECS_ENOTFOUND);
  assert_null(ecs_objstore_find(f->os, "alpha", 5));
  assert_null(get(f, "alpha"));
  st = stats(f);
  assert_int_equal(st.objects, 1);
  assert_int_equal(st.removes, 1);
  assert_int_equal(st.evictions, 0);
  assert_int_equal(st.bytes_live, 1);
  assert_int_equal(in_use(f->pool), f->base_in_use + 4096);

  /* The key is free again once removed. */
  assert_int_equal(put(f, "alpha", 5), ECS_OK);
  assert_int_equal(ecs_objstore_find(f->os, "alpha", 5)->seq, 3);
}

static void test_key_conflicts(void **state) {
  fx_t *f = *state;
  ecs_obj_t *o = NULL, *o2 = NULL;
  char big[ECS_MAX_KEY + 1];
  memset(big, 'k', sizeof big);
  assert_int_equal(ecs_objstore_reserve(f->os, "k", 0, 1, &o2), ECS_EKEY);
  assert_null(o2);
  assert_int_equal(ecs_objstore_reserve(f->os, big, ECS_MAX_KEY + 1, 1, &o2), ECS_EKEY);
  assert_int_equal(ecs_objstore_reserve(f->os, big, ECS_MAX_KEY, 1, &o2), ECS_OK);
  ecs_objstore_commit(f->os, o2);
  assert_non_null(ecs_objstore_find(f->os, big, ECS_MAX_KEY));
  assert_null(ecs_objstore_find(f->os, big, ECS_MAX_KEY - 1));

  assert_int_equal(ecs_objstore_reserve(f->os, "key", 3, 4096, &o), ECS_OK);
  assert_int_equal(ecs_objstore_reserve(f->os, "key", 3, 4096, &o2), ECS_EBUSY);
  assert_null(o2);
  assert_int_equal(ecs_objstore_remove(f->os, "key", 3), ECS_ENOTFOUND); /* pending */
  ecs_objstore_commit(f->os, o);
  assert_int_equal(ecs_objstore_reserve(f->os, "key", 3, 4096, &o2), ECS_ECONFLICT);
  assert_int_equal(ecs_objstore_reserve(f->os, "key", 3, 0, &o2), ECS_ECONFLICT);
  /* Keys are bytes, not strings: a prefix or an embedded NUL is another key. */
  assert_int_equal(ecs_objstore_reserve(f->os, "ke", 2, 1, &o2), ECS_OK);
  ecs_objstore_abort(f->os, o2);
  assert_int_equal(ecs_objstore_reserve(f->os, "key\0x", 5, 1, &o2), ECS_OK);
  ecs_objstore_abort(f->os, o2);
  assert_int_equal(stats(f).objects, 2);
  assert_int_equal(f->nev, 0);
}

static void test_abort_frees(void **state) {
  fx_t *f = *state;
  ecs_obj_t *o = NULL;
  assert_int_equal(ecs_objstore_reserve(f->os, "a", 1, 3 * MiB + 17, &o), ECS_OK);
  assert_int_equal(in_use(f->pool), f->base_in_use + rounded(3 * MiB + 17));
  ecs_objstore_abort(f->os, o);
  assert_int_equal(in_use(f->pool), f->base_in_use);
  assert_null(ecs_objstore_find(f->os, "a", 1));
  ecs_objstore_stats_t st = stats(f);
  assert_int_equal(st.pending, 0);
  assert_int_equal(st.objects, 0);
  assert_int_equal(f->nev, 0); /* abort is not a drop */
  /* The same key can be reserved again and committed. */
  assert_int_equal(put(f, "a", 100), ECS_OK);
  assert_int_equal(ecs_pool_validate(f->pool), ECS_OK);
}

/* ---- replace (upsert) ----------------------------------------------------- */

/* Reserves a replacement of key, stamps it with mark, commits. */
static int put_replace(fx_t *f, const char *key, uint64_t nbytes, uint8_t mark) {
  ecs_obj_t *o = NULL;
  int rc = ecs_objstore_reserve_replace(f->os, key, (uint16_t)strlen(key), nbytes, &o);
  if (rc != ECS_OK)
    return rc;
  if (nbytes) {
    uint8_t *p = ecs_objstore_data(f->os, o);
    p[0] = p[nbytes - 1] = mark;
  }
  o->raw_nbytes = nbytes;
  ecs_objstore_commit(f->os, o);
  return ECS_OK;
}

/* The old version stays readable while the new one is written, the swap is
 * one step, and a reader of the old version keeps its bytes until it
 * releases them. */
static void test_replace_while_read(void **state) {
  fx_t *f = *state;
  assert_int_equal(put(f, "u", 3 * 4096), ECS_OK);
  ecs_obj_t *reader = get(f, "u");
  assert_non_null(reader);
  ecs_obj_t *n = NULL, *n2 = NULL;
  assert_int_equal(ecs_objstore_reserve_replace(f->os, "u", 1, 4096, &n), ECS_OK);
  assert_int_equal(n->state, ECS_OBJ_PENDING);
  /* Pending: readers still see the old version; other writers are busy. */
  ecs_obj_t *r2 = get(f, "u");
  assert_ptr_equal(r2, reader);
  ecs_objstore_release(f->os, r2);
  assert_ptr_equal(ecs_objstore_find(f->os, "u", 1), reader);
  assert_int_equal(ecs_objstore_reserve_replace(f->os, "u", 1, 4096, &n2), ECS_EBUSY);
  assert_int_equal(ecs_objstore_reserve(f->os, "u", 1, 4096, &n2), ECS_EBUSY);
  assert_null(n2);
  uint8_t *p = ecs_objstore_data(f->os, n);
  p[0] = p[4095] = 'U';
  n->raw_nbytes = 4096;
  ecs_objstore_commit(f->os, n);
  /* One REPLACED event for the old version; the new one is what a get finds. */
  assert_int_equal(f->nev, 1);
  assert_int_equal(f->ev[0].why, ECS_DROP_REPLACED);
  assert_int_equal(f->ev[0].nbytes, 3 * 4096);
  ecs_objstore_stats_t st = stats(f);
  assert_int_equal(st.objects, 1);
  assert_int_equal(st.replaces, 1);
  assert_int_equal(st.removes, 0);
  assert_int_equal(st.doomed, 1);
  assert_int_equal(st.bytes_live, 4096);
  ecs_obj_t *cur = get(f, "u");
  assert_ptr_equal(cur, n);
  assert_int_equal(((uint8_t *)ecs_objstore_data(f->os, cur))[0], 'U');
  ecs_objstore_release(f->os, cur);
  /* The reader of the old version still reads the old bytes. */
  assert_int_equal(reader->state, ECS_OBJ_DOOMED);
  const uint8_t *old = ecs_objstore_data(f->os, reader);
  assert_int_equal(old[0], 'u');
  assert_int_equal(old[3 * 4096 - 1], 'u');
  assert_int_equal(in_use(f->pool), f->base_in_use + 4 * 4096);
  ecs_objstore_release(f->os, reader);
  assert_int_equal(stats(f).doomed, 0);
  assert_int_equal(in_use(f->pool), f->base_in_use + 4096);
  assert_int_equal(ecs_pool_validate(f->pool), ECS_OK);
}

static void test_replace_edges(void **state) {
  fx_t *f = *state;
  ecs_obj_t *n = NULL;
  /* A replace of an absent key is an insert. */
  assert_int_equal(put_replace(f, "a", 4096, 'a'), ECS_OK);
  assert_int_equal(f->nev, 0);
  assert_int_equal(stats(f).objects, 1);
  /* Abort leaves the old version in place. */
  assert_int_equal(ecs_objstore_reserve_replace(f->os, "a", 1, 8192, &n), ECS_OK);
  ecs_objstore_abort(f->os, n);
  ecs_obj_t *o = get(f, "a");
  assert_non_null(o);
  assert_int_equal(o->nbytes, 4096);
  ecs_objstore_release(f->os, o);
  assert_int_equal(f->nev, 0);
  /* The old version removed while the new one is pending: a plain commit. */
  assert_int_equal(ecs_objstore_reserve_replace(f->os, "a", 1, 100, &n), ECS_OK);
  assert_int_equal(ecs_objstore_remove(f->os, "a", 1), ECS_OK);
  assert_null(get(f, "a"));
  ((uint8_t *)ecs_objstore_data(f->os, n))[0] = 'a';
  ecs_objstore_commit(f->os, n);
  assert_int_equal(f->nev, 1);
  assert_int_equal(f->ev[0].why, ECS_DROP_REMOVED);
  o = get(f, "a");
  assert_non_null(o);
  assert_int_equal(o->nbytes, 100);
  ecs_objstore_release(f->os, o);
  /* Zero-byte versions, both ways; a plain reserve of a committed key is
   * still a conflict. */
  assert_int_equal(put_replace(f, "a", 0, 0), ECS_OK);
  assert_int_equal(put_replace(f, "a", 4096, 'a'), ECS_OK);
  assert_int_equal(ecs_objstore_reserve(f->os, "a", 1, 4096, &n), ECS_ECONFLICT);
  assert_int_equal(stats(f).replaces, 2);
  assert_int_equal(stats(f).objects, 1);
  assert_int_equal(ecs_objstore_reserve_replace(f->os, "a", 0, 1, &n), ECS_EKEY);
  assert_int_equal(ecs_objstore_reserve_replace(f->os, "b", 1, POOL_SIZE + 1, &n), ECS_ETOOBIG);
  assert_int_equal(in_use(f->pool), f->base_in_use + 4096);
}

/* ---- eviction ------------------------------------------------------------- */

static void test_fifo_eviction_order(void **state) {
  fx_t *f = *state;
  fill(f, "o", 64, MiB); /* exactly full */
  assert_int_equal(ecs_pool_can_fit(f->pool, 1), 0);
  assert_int_equal(f->nev, 0);
  fill(f, "n", 10, MiB); /* each one evicts exactly the oldest */
  assert_int_equal(f->nev, 10);
  for (size_t i = 0; i < 10; i++) {
    char want[32];
    snprintf(want, sizeof want, "o%zu", i);
    assert_string_equal(f->ev[i].key, want);
    assert_int_equal(f->ev[i].why, ECS_DROP_EVICTED);
    assert_int_equal(f->ev[i].seq, i + 1);
    assert_null(ecs_objstore_find(f->os, want, (uint16_t)strlen(want)));
  }
  assert_non_null(ecs_objstore_find(f->os, "o10", 3));
  ecs_objstore_stats_t st = stats(f);
  assert_int_equal(st.objects, 64);
  assert_int_equal(st.evictions, 10);
  assert_int_equal(st.bytes_live, 64ull * MiB);
  /* A bigger request takes as many of the oldest as it needs, in order. */
  assert_int_equal(put(f, "big", 8 * MiB), ECS_OK);
  assert_true(f->nev >= 18);
  for (size_t i = 10; i < f->nev; i++)
    assert_true(f->ev[i].seq > f->ev[i - 1].seq);
  assert_int_equal(ecs_pool_validate(f->pool), ECS_OK);
}

/* put() with a soft pin until `until` (wall-clock ms; 1: long expired). */
static int put_kept(fx_t *f, const char *key, uint64_t nbytes, uint64_t until) {
  ecs_obj_t *o = NULL;
  int rc = ecs_objstore_reserve(f->os, key, (uint16_t)strlen(key), nbytes, &o);
  if (rc != ECS_OK)
    return rc;
  if (nbytes) {
    uint8_t *p = ecs_objstore_data(f->os, o);
    p[0] = p[nbytes - 1] = (uint8_t)key[0];
  }
  o->raw_nbytes = nbytes;
  o->keep_until_ms = until;
  ecs_objstore_commit(f->os, o);
  return ECS_OK;
}

#define FAR_FUTURE (UINT64_MAX / 2)

/* Soft pins (Mooncake's ReplicateConfig soft pin): a soft-pinned object is
 * evicted only when no unpinned one can be; an expired pin is no pin; when
 * only soft-pinned objects are left, they go oldest first.  Background
 * eviction keeps the same order. */
static void test_soft_pin_evicted_last(void **state) {
  fx_t *f = *state;
  assert_int_equal(put_kept(f, "p0", MiB, FAR_FUTURE), ECS_OK);
  assert_int_equal(put_kept(f, "x0", MiB, 1), ECS_OK); /* pin expired long ago */
  fill(f, "o", 61, MiB);
  assert_int_equal(put_kept(f, "p1", MiB, FAR_FUTURE), ECS_OK); /* 64 MiB: full */
  fill(f, "n", 3, MiB);
  assert_int_equal(f->nev, 3);
  assert_string_equal(f->ev[0].key, "x0");
  assert_string_equal(f->ev[1].key, "o0");
  assert_string_equal(f->ev[2].key, "o1");
  assert_non_null(ecs_objstore_find(f->os, "p0", 2));
  /* Everything unpinned referenced: the pinned go, oldest first. */
  ecs_obj_t *held[65];
  size_t nheld = 0;
  for (ecs_obj_t *o = NULL; nheld < 64; nheld++) {
    char key[16];
    snprintf(key, sizeof key, nheld < 59 ? "o%zu" : "n%zu", nheld < 59 ? nheld + 2 : nheld - 59);
    o = get(f, key);
    if (!o)
      break;
    held[nheld] = o;
  }
  assert_int_equal(nheld, 62); /* o2..o60 and n0..n2 */
  assert_int_equal(put(f, "z0", MiB), ECS_OK);
  assert_string_equal(f->ev[3].key, "p0");
  assert_int_equal(put(f, "z1", MiB), ECS_OK); /* z0 unpinned and not held: before p1 */
  assert_string_equal(f->ev[4].key, "z0");
  held[nheld++] = get(f, "z1");
  assert_int_equal(put(f, "z2", MiB), ECS_OK);
  assert_string_equal(f->ev[5].key, "p1");
  for (size_t i = 0; i < nheld; i++)
    ecs_objstore_release(f->os, held[i]);
  assert_int_equal(ecs_pool_validate(f->pool), ECS_OK);
}

/* Reserves key as owner (nbytes > 0; pinned until `until`, 0: not pinned),
 * stamped as put() does; committed
 * unless `commit` is 0, when *pending gets the pending object. */
static int put_as(fx_t *f, const char *key, uint64_t nbytes, uint16_t owner, uint64_t until, int commit,
                  ecs_obj_t **pending) {
  ecs_obj_t *o = NULL;
  int rc = ecs_objstore_reserve_as(f->os, key, (uint16_t)strlen(key), nbytes, 0, owner, &o);
  if (rc != ECS_OK)
    return rc;
  uint8_t *p = ecs_objstore_data(f->os, o);
  p[0] = p[nbytes - 1] = (uint8_t)key[0];
  o->raw_nbytes = nbytes;
  o->keep_until_ms = until;
  if (commit)
    ecs_objstore_commit(f->os, o);
  else
    *pending = o;
  return ECS_OK;
}

/* A tenant over its quota evicts its own objects only when that makes
 * enough room: with its pending put counted but not evictable, a put the
 * quota refuses anyway evicts nothing.  And its soft-pinned objects go
 * after its unpinned ones. */
static void test_quota_evicts_only_what_helps(void **state) {
  fx_t *f = *state;
  const uint64_t quota[1] = {10 * MiB};
  assert_int_equal(ecs_objstore_set_owners(f->os, 1, quota), ECS_OK);
  assert_int_equal(put_as(f, "p0", 2 * MiB, 1, FAR_FUTURE, 1, NULL), ECS_OK);
  assert_int_equal(put_as(f, "u0", 2 * MiB, 1, 0, 1, NULL), ECS_OK);
  assert_int_equal(put_as(f, "u1", 2 * MiB, 1, 0, 1, NULL), ECS_OK);
  ecs_obj_t *w = NULL;
  assert_int_equal(put_as(f, "w0", 4 * MiB, 1, 0, 0, &w), ECS_OK); /* 10 MiB: at the quota */
  /* 9 MiB more: 9 over, 6 evictable (w0's 4 are pending): refused whole. */
  assert_int_equal(put_as(f, "big", 9 * MiB, 1, 0, 1, NULL), ECS_EQUOTA);
  assert_int_equal(f->nev, 0);
  assert_int_equal(ecs_objstore_owner_bytes(f->os, 1), 10 * MiB);
  /* 3 MiB more: the oldest unpinned (u0, u1) go before the older pinned p0. */
  assert_int_equal(put_as(f, "n0", 3 * MiB, 1, 0, 1, NULL), ECS_OK);
  assert_int_equal(f->nev, 2);
  assert_string_equal(f->ev[0].key, "u0");
  assert_string_equal(f->ev[1].key, "u1");
  assert_non_null(ecs_objstore_find(f->os, "p0", 2));
  ecs_objstore_commit(f->os, w);
  /* 5 MiB more: 4 over; only pinned p0 (2) and the newer n0 (3), w0 (4)
   * are left: p0 last, so n0 then w0... n0 alone is not enough. */
  assert_int_equal(put_as(f, "n1", 5 * MiB, 1, 0, 1, NULL), ECS_OK);
  assert_string_equal(f->ev[2].key, "n0");
  assert_string_equal(f->ev[3].key, "w0");
  assert_non_null(ecs_objstore_find(f->os, "p0", 2));
  assert_int_equal(ecs_objstore_owner_bytes(f->os, 1), 7 * MiB);
  assert_int_equal(ecs_pool_validate(f->pool), ECS_OK);
}

static void test_soft_pin_background(void **state) {
  fx_t *f = fx_new(0.5, 0.25); /* high 32 MiB, low 16 MiB */
  *state = f;
  assert_int_equal(put_kept(f, "a0", MiB, FAR_FUTURE), ECS_OK);
  fill(f, "b", 39, MiB); /* 40 MiB */
  assert_int_equal(ecs_objstore_evict_background(f->os, 100), 24);
  for (size_t i = 0; i < f->nev; i++)
    assert_string_not_equal(f->ev[i].key, "a0");
  assert_non_null(ecs_objstore_find(f->os, "a0", 2));
  assert_int_equal(in_use(f->pool), f->base_in_use + 16ull * MiB);
}

static void collect_seq(void *ctx, const ecs_obj_t *obj) {
  uint64_t *v = ctx;
  assert_true(obj->state == ECS_OBJ_COMMITTED);
  assert_true(obj->seq > v[0]); /* oldest first */
  v[0] = obj->seq;
  v[1]++;
}

static void test_foreach_order(void **state) {
  fx_t *f = *state;
  fill(f, "x", 50, 1000);
  assert_int_equal(ecs_objstore_remove(f->os, "x7", 2), ECS_OK);
  uint64_t v[2] = {0, 0};
  ecs_objstore_foreach(f->os, collect_seq, v);
  assert_int_equal(v[1], 49);
  assert_int_equal(v[0], 50);
}

static void test_referenced_not_evicted(void **state) {
  fx_t *f = *state;
  fill(f, "o", 64, MiB);
  ecs_obj_t *o0 = get(f, "o0");
  assert_non_null(o0);
  assert_int_equal(put(f, "n0", MiB), ECS_OK);
  assert_int_equal(f->nev, 1);
  assert_string_equal(f->ev[0].key, "o1"); /* the next-oldest went instead */
  assert_ptr_equal(ecs_objstore_find(f->os, "o0", 2), o0);
  uint64_t v[2] = {0, 0};
  ecs_objstore_foreach(f->os, collect_seq, v); /* o0 still first (seq 1) */
  ecs_objstore_release(f->os, o0);
  assert_int_equal(o0->state, ECS_OBJ_COMMITTED);
  assert_int_equal(put(f, "n1", MiB), ECS_OK); /* now o0, still the oldest, goes */
  assert_string_equal(f->ev[1].key, "o0");

  /* Everything referenced: ENOSPC and nothing evicted. */
  ecs_obj_t *held[65];
  size_t nheld = 0;
  for (int i = 2; i < 64; i++) {
    char k[16];
    snprintf(k, sizeof k, "o%d", i);
    held[nheld++] = get(f, k);
  }
  held[nheld++] = get(f, "n0");
  held[nheld++] = get(f, "n1");
  for (size_t i = 0; i < nheld; i++)
    assert_non_null(held[i]);
  ecs_obj_t *o = NULL;
  size_t nev = f->nev;
  assert_int_equal(ecs_objstore_reserve(f->os, "z", 1, 1, &o), ECS_ENOSPC);
  assert_null(o);
  assert_null(ecs_objstore_find(f->os, "z", 1));
  assert_int_equal(f->nev, nev);
  assert_int_equal(stats(f).pending, 0);

  /* Removing a held object dooms it: the block stays until the last release. */
  ecs_obj_t *o5 = held[3];
  assert_string_equal((const char *)o5->key, "o5"); /* keys here are NUL-padded */
  ecs_obj_t *o5b = get(f, "o5");
  assert_ptr_equal(o5b, o5);
  uint64_t before = in_use(f->pool);
  assert_int_equal(ecs_objstore_remove(f->os, "o5", 2), ECS_OK);
  assert_int_equal(o5->state, ECS_OBJ_DOOMED);
  assert_int_equal(f->ev[f->nev - 1].why, ECS_DROP_REMOVED);
  assert_null(get(f, "o5"));
  assert_int_equal(ecs_objstore_remove(f->os, "o5", 2), ECS_ENOTFOUND);
  ecs_objstore_stats_t st = stats(f);
  assert_int_equal(st.doomed, 1);
  assert_int_equal(st.objects, 63);
  assert_int_equal(st.bytes_live, 63ull * MiB);
  assert_int_equal(in_use(f->pool), before);
  assert_int_equal(ecs_objstore_reserve(f->os, "z", 1, MiB, &o), ECS_ENOSPC);
  /* A new object under the doomed one's key is a different object. */
  assert_int_equal(ecs_objstore_reserve(f->os, "o5", 2, 0, &o), ECS_OK);
  assert_ptr_not_equal(o, o5);
  ecs_objstore_commit(f->os, o);
  ecs_objstore_release(f->os, o5b);
  assert_int_equal(in_use(f->pool), before);
  assert_int_equal(stats(f).doomed, 1);
  ecs_objstore_release(f->os, o5); /* the last one frees the block */
  assert_int_equal(in_use(f->pool), before - MiB);
  assert_int_equal(stats(f).doomed, 0);
  assert_int_equal(ecs_pool_validate(f->pool), ECS_OK);
  for (size_t i = 0; i < nheld; i++)
    if (i != 3)
      ecs_objstore_release(f->os, held[i]);
  assert_int_equal(put(f, "z", 2 * MiB), ECS_OK);
}

/* Pending objects hold their blocks: eviction never takes a writer's. */
static void test_pending_not_evicted(void **state) {
  fx_t *f = *state;
  ecs_obj_t *p[4];
  for (int i = 0; i < 4; i++) {
    char k[16];
    snprintf(k, sizeof k, "p%d", i);
    assert_int_equal(ecs_objstore_reserve(f->os, k, 2, 16 * MiB, &p[i]), ECS_OK);
    *(uint8_t *)ecs_objstore_data(f->os, p[i]) = 'p'; /* what on_drop checks */
  }
  ecs_obj_t *o = NULL;
  assert_int_equal(ecs_objstore_reserve(f->os, "x", 1, 1, &o), ECS_ENOSPC);
  assert_int_equal(f->nev, 0);
  ecs_objstore_commit(f->os, p[0]);
  assert_int_equal(put(f, "x", 1), ECS_OK); /* evicts p0, the only committed */
  assert_int_equal(f->nev, 1);
  assert_string_equal(f->ev[0].key, "p0");
  for (int i = 1; i < 4; i++)
    assert_int_equal(p[i]->state, ECS_OBJ_PENDING);
  assert_int_equal(stats(f).pending, 3);
  /* teardown's destroy frees the pending ones */
}

static void test_too_big(void **state) {
  fx_t *f = *state;
  fill(f, "o", 8, MiB);
  ecs_obj_t *o = NULL;
  assert_int_equal(ecs_objstore_reserve(f->os, "huge", 4, POOL_SIZE + 1ull, &o), ECS_ETOOBIG);
  assert_int_equal(ecs_objstore_reserve(f->os, "huge", 4, UINT64_MAX, &o), ECS_ETOOBIG);
  assert_null(o);
  assert_int_equal(f->nev, 0);
  assert_int_equal(stats(f).objects, 8);
  /* The whole pool is a legal size: it evicts everything. */
  assert_int_equal(put(f, "all", POOL_SIZE), ECS_OK);
  assert_int_equal(f->nev, 8);
  assert_int_equal(stats(f).objects, 1);
}

/* A 48 MiB region has no block above 32 MiB: 40 MiB is refused up front,
 * not after evicting everything. */
static void test_too_big_odd_region(void **state) {
  (void)state;
  ecs_pool_opts_t po;
  ecs_pool_opts_init(&po);
  po.size = 48u * MiB;
  po.lock = 0;
  ecs_pool_t *pool = NULL;
  assert_int_equal(ecs_pool_create(&po, &pool), ECS_OK);
  uint64_t drops = 0;
  ecs_objstore_opts_t o;
  ecs_objstore_opts_init(&o);
  o.on_drop = count_drop;
  o.cb_ctx = &drops;
  ecs_objstore_t *os = NULL;
  assert_int_equal(ecs_objstore_create(pool, &o, &os), ECS_OK);
  ecs_obj_t *obj = NULL;
  assert_int_equal(ecs_objstore_reserve(os, "a", 1, 8 * MiB, &obj), ECS_OK);
  ecs_objstore_commit(os, obj);
  assert_int_equal(ecs_objstore_reserve(os, "b", 1, 40 * MiB, &obj), ECS_ETOOBIG);
  assert_int_equal(drops, 0);
  assert_int_equal(ecs_objstore_reserve(os, "b", 1, 32 * MiB, &obj), ECS_OK);
  ecs_objstore_abort(os, obj);
  ecs_objstore_destroy(os);
  ecs_pool_destroy(pool);
}

static void test_zero_bytes(void **state) {
  fx_t *f = *state;
  fill(f, "o", 64, MiB); /* full */
  assert_int_equal(put(f, "empty", 0), ECS_OK);
  assert_int_equal(f->nev, 0); /* needs no room */
  assert_int_equal(in_use(f->pool), f->base_in_use + POOL_SIZE);
  ecs_obj_t *o = get(f, "empty");
  assert_non_null(o);
  assert_int_equal(o->nbytes, 0);
  assert_non_null(ecs_objstore_data(f->os, o));
  ecs_objstore_release(f->os, o);
  assert_int_equal(stats(f).objects, 65);
  /* Doomed while held, freed at release, with no pool call. */
  o = get(f, "empty");
  assert_int_equal(ecs_objstore_remove(f->os, "empty", 5), ECS_OK);
  assert_int_equal(stats(f).doomed, 1);
  ecs_objstore_release(f->os, o);
  assert_int_equal(stats(f).doomed, 0);
  assert_int_equal(put(f, "e2", 0), ECS_OK);
  ecs_obj_t *p = NULL;
  assert_int_equal(ecs_objstore_reserve(f->os, "e3", 2, 0, &p), ECS_OK);
  ecs_objstore_abort(f->os, p);
  /* A zero-byte object is evicted in its FIFO turn like any other. */
  assert_int_equal(put(f, "n", 2 * MiB), ECS_OK);
  assert_int_equal(f->nev, 3); /* "empty" (removed), o0, o1 */
  assert_int_equal(in_use(f->pool), f->base_in_use + POOL_SIZE);
  assert_int_equal(ecs_pool_validate(f->pool), ECS_OK);
}

/* ---- background eviction -------------------------------------------------- */

static void test_background(void **state) {
  fx_t *f = fx_new(0.5, 0.25); /* high 32 MiB, low 16 MiB */
  *state = f;
  fill(f, "a", 32, MiB); /* exactly at high: not above */
  assert_int_equal(ecs_objstore_evict_background(f->os, 100), 0);
  fill(f, "b", 8, MiB); /* 40 MiB > 32 MiB */
  assert_int_equal(ecs_objstore_evict_background(f->os, 10), 10);
  /* 30 MiB: below high, but the run goes on until low. */
  assert_int_equal(ecs_objstore_evict_background(f->os, 0), 0);
  assert_int_equal(ecs_objstore_evict_background(f->os, 10), 10);
  assert_int_equal(ecs_objstore_evict_background(f->os, 10), 4);
  assert_int_equal(in_use(f->pool), f->base_in_use + 16ull * MiB);
  assert_int_equal(ecs_objstore_evict_background(f->os, 10), 0);
  assert_int_equal(f->nev, 24);
  for (size_t i = 0; i < f->nev; i++) {
    assert_int_equal(f->ev[i].why, ECS_DROP_EVICTED);
    assert_int_equal(f->ev[i].seq, i + 1);
  }
  assert_int_equal(stats(f).evictions, 24);
  /* Between the watermarks, a new run does not start. */
  fill(f, "c", 10, MiB); /* 26 MiB */
  assert_int_equal(ecs_objstore_evict_background(f->os, 100), 0);
  /* Referenced objects are skipped, and stay the oldest. */
  fill(f, "d", 10, MiB); /* 36 MiB */
  ecs_obj_t *held = get(f, "a24");
  assert_non_null(held);
  size_t nev = f->nev;
  assert_int_equal(ecs_objstore_evict_background(f->os, 100), 20);
  assert_string_equal(f->ev[nev].key, "a25");
  assert_ptr_equal(ecs_objstore_find(f->os, "a24", 3), held);
  assert_int_equal(in_use(f->pool), f->base_in_use + 16ull * MiB);
  ecs_objstore_release(f->os, held);
  uint64_t v[2] = {0, 0};
  ecs_objstore_foreach(f->os, collect_seq, v);
  assert_int_equal(v[1], 16);
}

/* A run that finds nothing evictable above low (the object that crossed
 * high still being written, or the rest referenced) goes on once
 * something becomes evictable: the commit, or the last release.  It used
 * to stop for good, leaving the pool between the watermarks. */
static void test_background_resumes(void **state) {
  fx_t *f = fx_new(0.5, 0.25); /* high 32 MiB, low 16 MiB */
  *state = f;
  fill(f, "a", 20, MiB);
  ecs_obj_t *big = NULL;
  assert_int_equal(ecs_objstore_reserve(f->os, "big", 3, 20ull * MiB, &big), ECS_OK); /* 40 MiB */
  assert_int_equal(ecs_objstore_evict_background(f->os, 100), 20); /* 20 MiB left, all pending */
  assert_int_equal(ecs_objstore_evict_background(f->os, 100), 0);  /* nothing evictable yet */
  memset(ecs_objstore_data(f->os, big), 'b', 20u * MiB);           /* the callback checks the first byte */
  ecs_objstore_commit(f->os, big);
  assert_int_equal(ecs_objstore_evict_background(f->os, 100), 1);
  assert_int_equal(in_use(f->pool), f->base_in_use);
  /* the same with the rest held by a reader */
  fill(f, "b", 20, MiB);
  ecs_obj_t *held[20];
  for (int i = 0; i < 20; i++) {
    char k[8];
    snprintf(k, sizeof k, "b%d", i);
    held[i] = get(f, k);
    assert_non_null(held[i]);
  }
  fill(f, "c", 14, MiB);                                           /* 34 MiB */
  assert_int_equal(ecs_objstore_evict_background(f->os, 100), 14); /* 20 MiB left, all held */
  for (int i = 0; i < 19; i++)
    ecs_objstore_release(f->os, held[i]);
  assert_int_equal(ecs_objstore_evict_background(f->os, 100), 4); /* b0..b3: down to low */
  assert_int_equal(in_use(f->pool), f->base_in_use + 16ull * MiB);
  ecs_objstore_release(f->os, held[19]);
  assert_int_equal(ecs_objstore_evict_background(f->os, 100), 0); /* at low: no run */
}

/* ---- randomized against a model ------------------------------------------- */

#define RKEYS 48
#define ROPS 6000

/* The model of one object. */
typedef struct mobj {
  int key;         /* index into the key space */
  uint64_t nbytes; /* its size */
  int state;       /* ecs_obj_state_t */
  unsigned refs;   /* references the model holds (writer included) */
  uint64_t seq;    /* commit order */
  ecs_obj_t *obj;  /* the store's object */
} mobj_t;

/* The model: objects by key, all objects (doomed included), held refs. */
typedef struct model {
  fx_t *f;                 /* the fixture */
  mobj_t *bykey[RKEYS];    /* pending or committed object per key */
  mobj_t *all[9 * RKEYS];  /* every object still holding memory */
  size_t nall;             /* entries in all */
  mobj_t *held[8 * RKEYS]; /* reader references, one entry each */
  size_t nheld;            /* entries in held */
  int removing;            /* key being removed (-1: none) */
  unsigned evicted;        /* evictions seen by the callback */
  unsigned nospc;          /* reserves answered ENOSPC */
  unsigned max_doomed;     /* most doomed objects at once */
} model_t;

static void key_name(int k, char out[16]) {
  snprintf(out, 16, "r%02d", k);
}

static void model_forget(model_t *m, mobj_t *mo) {
  for (size_t i = 0; i < m->nall; i++)
    if (m->all[i] == mo) {
      m->all[i] = m->all[--m->nall];
      free(mo);
      return;
    }
  fail_msg("object not in the model");
}

/* The callback: the dropped object must be what the model expects. */
static void model_on_drop(void *ctx, const ecs_obj_t *obj, ecs_drop_reason_t why) {
  model_t *m = ctx;
  int k = atoi((const char *)obj->key + 1);
  mobj_t *mo = m->bykey[k];
  assert_non_null(mo);
  assert_ptr_equal(mo->obj, obj);
  assert_int_equal(mo->state, ECS_OBJ_COMMITTED);
  assert_int_equal(obj->state, ECS_OBJ_DOOMED);
  if (why == ECS_DROP_REMOVED) {
    assert_int_equal(m->removing, k);
  } else {
    /* FIFO: no unreferenced committed object is older. */
    assert_int_equal(mo->refs, 0);
    for (int i = 0; i < RKEYS; i++) {
      mobj_t *x = m->bykey[i];
      if (x && x->state == ECS_OBJ_COMMITTED && x->refs == 0)
        assert_true(x->seq >= mo->seq);
    }
    m->evicted++;
  }
  m->bykey[k] = NULL;
  mo->state = ECS_OBJ_DOOMED;
  if (!mo->refs)
    model_forget(m, mo);
}

static void model_check(model_t *m) {
  fx_t *f = m->f;
  uint64_t want = 0, live = 0, objects = 0, pending = 0, doomed = 0;
  for (size_t i = 0; i < m->nall; i++) {
    mobj_t *mo = m->all[i];
    want += rounded(mo->nbytes);
    assert_int_equal(mo->obj->state, mo->state);
    assert_int_equal(mo->obj->refs, mo->refs);
    if (mo->state == ECS_OBJ_COMMITTED) {
      objects++;
      live += mo->nbytes;
    }
    pending += mo->state == ECS_OBJ_PENDING;
    doomed += mo->state == ECS_OBJ_DOOMED;
  }
  assert_int_equal(in_use(f->pool) - f->base_in_use, want);
  ecs_objstore_stats_t st = stats(f);
  assert_int_equal(st.objects, objects);
  assert_int_equal(st.pending, pending);
  assert_int_equal(st.doomed, doomed);
  assert_int_equal(st.bytes_live, live);
  assert_int_equal(st.evictions, m->evicted);
  if (doomed > m->max_doomed)
    m->max_doomed = (unsigned)doomed;
}

static uint64_t random_size(void) {
  switch (rand() % 8) {
  case 0: return 0;
  case 1: return 1 + (uint64_t)rand() % 4096;
  case 2: return 8 * MiB + (uint64_t)rand() % (8 * MiB);
  default: return (uint64_t)rand() % (3 * MiB);
  }
}

static void op_reserve(model_t *m, int k) {
  char key[16];
  key_name(k, key);
  uint64_t n = random_size();
  ecs_obj_t *o = NULL;
  int rc = ecs_objstore_reserve(m->f->os, key, 3, n, &o);
  mobj_t *old = m->bykey[k];
  if (old) {
    assert_int_equal(rc, old->state == ECS_OBJ_PENDING ? ECS_EBUSY : ECS_ECONFLICT);
    return;
  }
  if (rc == ECS_ENOSPC) { /* only when everything committed left is held */
    m->nospc++;
    for (int i = 0; i < RKEYS; i++)
      if (m->bykey[i] && m->bykey[i]->state == ECS_OBJ_COMMITTED)
        assert_true(m->bykey[i]->refs > 0);
    return;
  }
  assert_int_equal(rc, ECS_OK);
  if (n) {
    uint8_t *p = ecs_objstore_data(m->f->os, o);
    p[0] = p[n - 1] = (uint8_t)k;
  }
  mobj_t *mo = calloc(1, sizeof *mo);
  assert_non_null(mo);
  assert_true(m->nall < sizeof m->all / sizeof m->all[0]);
  *mo = (mobj_t){.key = k, .nbytes = n, .state = ECS_OBJ_PENDING, .refs = 1, .obj = o};
  m->bykey[k] = mo;
  m->all[m->nall++] = mo;
}

static void finish(model_t *m, int k, int commit) {
  mobj_t *mo = m->bykey[k];
  if (!mo || mo->state != ECS_OBJ_PENDING)
    return;
  if (commit) {
    ecs_objstore_commit(m->f->os, mo->obj);
    mo->state = ECS_OBJ_COMMITTED;
    mo->refs = 0;
    mo->seq = mo->obj->seq;
    return;
  }
  ecs_objstore_abort(m->f->os, mo->obj);
  m->bykey[k] = NULL;
  model_forget(m, mo);
}

/* Commits or aborts a random pending object: by key, writers would linger. */
static void op_finish(model_t *m, int commit) {
  int pend[RKEYS], n = 0;
  for (int i = 0; i < RKEYS; i++)
    if (m->bykey[i] && m->bykey[i]->state == ECS_OBJ_PENDING)
      pend[n++] = i;
  if (n)
    finish(m, pend[rand() % n], commit);
}

static void op_acquire(model_t *m, int k) {
  char key[16];
  key_name(k, key);
  ecs_obj_t *o = ecs_objstore_acquire(m->f->os, key, 3);
  mobj_t *mo = m->bykey[k];
  if (!mo || mo->state != ECS_OBJ_COMMITTED) {
    assert_null(o);
    return;
  }
  assert_ptr_equal(o, mo->obj);
  if (m->nheld == sizeof m->held / sizeof m->held[0]) { /* the model is full */
    ecs_objstore_release(m->f->os, o);
    return;
  }
  if (mo->nbytes) {
    const uint8_t *p = ecs_objstore_data(m->f->os, o);
    assert_int_equal(p[0], (uint8_t)k);
    assert_int_equal(p[mo->nbytes - 1], (uint8_t)k);
  }
  mo->refs++;
  m->held[m->nheld++] = mo;
}

static void op_release(model_t *m) {
  if (!m->nheld)
    return;
  size_t i = (size_t)rand() % m->nheld;
  mobj_t *mo = m->held[i];
  m->held[i] = m->held[--m->nheld];
  ecs_objstore_release(m->f->os, mo->obj);
  if (--mo->refs == 0 && mo->state == ECS_OBJ_DOOMED)
    model_forget(m, mo);
}

static void op_remove(model_t *m, int k) {
  char key[16];
  key_name(k, key);
  mobj_t *mo = m->bykey[k];
  int committed = mo && mo->state == ECS_OBJ_COMMITTED; /* the callback may free mo */
  m->removing = k;
  int rc = ecs_objstore_remove(m->f->os, key, 3);
  m->removing = -1;
  assert_int_equal(rc, committed ? ECS_OK : ECS_ENOTFOUND);
  if (committed)
    assert_null(m->bykey[k]);
}

static void test_randomized(void **state) {
  fx_t *f = *state;
  model_t *m = calloc(1, sizeof *m);
  assert_non_null(m);
  m->f = f;
  m->removing = -1;
  /* Re-create the store with the model's callback and low watermarks. */
  ecs_objstore_destroy(f->os);
  ecs_objstore_opts_t o;
  ecs_objstore_opts_init(&o);
  o.high_watermark = 0.7;
  o.low_watermark = 0.4;
  o.on_drop = model_on_drop;
  o.cb_ctx = m;
  assert_int_equal(ecs_objstore_create(f->pool, &o, &f->os), ECS_OK);

  srand(12345);
  for (int i = 0; i < ROPS; i++) {
    int k = rand() % RKEYS;
    switch (rand() % 12) { /* acquire outweighs release: held objects pile up */
    case 0:
    case 1:
    case 2: op_reserve(m, k); break;
    case 3:
    case 4: op_finish(m, 1); break;
    case 5: op_finish(m, 0); break;
    case 6:
    case 7: op_acquire(m, k); break;
    case 8:
      if (rand() % 3 == 0)
        op_release(m);
      break;
    case 9:
    case 10: op_remove(m, k); break;
    default: {
      unsigned before = m->evicted;
      unsigned n = ecs_objstore_evict_background(f->os, (unsigned)(rand() % 5));
      assert_int_equal(n, m->evicted - before);
      break;
    }
    }
    model_check(m);
    if (i % 64 == 0)
      assert_int_equal(ecs_pool_validate(f->pool), ECS_OK);
  }
  /* The run did reach the interesting cases. */
  assert_true(m->evicted > 100);
  assert_true(m->nospc > 0);
  assert_true(m->max_doomed > 1);
  while (m->nheld)
    op_release(m);
  for (int k = 0; k < RKEYS; k++) {
    finish(m, k, 1);
    op_remove(m, k);
  }
  model_check(m);
  assert_int_equal(m->nall, 0);
  assert_int_equal(in_use(f->pool), f->base_in_use);
  assert_int_equal(ecs_pool_validate(f->pool), ECS_OK);
  free(m);
}

/* ---- hash table growth ---------------------------------------------------- */

#define NMANY 100000

static void test_many_keys(void **state) {
  fx_t *f = *state;
  char key[32];
  for (int i = 0; i < NMANY; i++) {
    snprintf(key, sizeof key, "many-%d", i);
    assert_int_equal(put(f, key, i % 100 == 0 ? 1 : 0), ECS_OK); /* a few hold blocks */
  }
  assert_int_equal(stats(f).objects, NMANY);
  assert_int_equal(in_use(f->pool), f->base_in_use + NMANY / 100 * 4096ull);
  for (int i = 0; i < NMANY; i++) {
    int n = snprintf(key, sizeof key, "many-%d", i);
    ecs_obj_t *o = ecs_objstore_find(f->os, key, (uint16_t)n);
    assert_non_null(o);
    assert_int_equal(o->seq, (uint64_t)i + 1);
  }
  for (int i = 0; i < NMANY; i += 2) {
    int n = snprintf(key, sizeof key, "many-%d", i);
    assert_int_equal(ecs_objstore_remove(f->os, key, (uint16_t)n), ECS_OK);
  }
  for (int i = 0; i < NMANY; i++) {
    int n = snprintf(key, sizeof key, "many-%d", i);
    ecs_obj_t *o = ecs_objstore_find(f->os, key, (uint16_t)n);
    if (i % 2)
      assert_non_null(o);
    else
      assert_null(o);
  }
  assert_null(ecs_objstore_find(f->os, "many-100000", 11));
  ecs_objstore_stats_t st = stats(f);
  assert_int_equal(st.objects, NMANY / 2);
  assert_int_equal(st.removes, NMANY / 2);
  for (int i = 1; i < NMANY; i += 2) {
    int n = snprintf(key, sizeof key, "many-%d", i);
    assert_int_equal(ecs_objstore_remove(f->os, key, (uint16_t)n), ECS_OK);
  }
  assert_int_equal(stats(f).objects, 0);
  assert_int_equal(in_use(f->pool), f->base_in_use);
}

/* Zero-byte objects hold no block, yet count: past max_objects the
 * oldest go (FIFO), so a flood of empty puts cannot grow the index
 * without end.  The default is one object per minimum block. */
static void test_zero_byte_flood_evicted(void **state) {
  fx_t *f = *state;
  enum { FLOOD = 3 * (POOL_SIZE / 4096) };
  char key[32];
  for (int i = 0; i < FLOOD; i++) {
    snprintf(key, sizeof key, "empty-%d", i);
    assert_int_equal(put(f, key, 0), ECS_OK);
    assert_true(stats(f).objects <= POOL_SIZE / 4096);
  }
  assert_int_equal(stats(f).objects, POOL_SIZE / 4096);
  assert_int_equal(stats(f).evictions, FLOOD - POOL_SIZE / 4096);
  /* oldest first: the first ones went, the last ones stay */
  assert_null(ecs_objstore_find(f->os, "empty-0", 7));
  snprintf(key, sizeof key, "empty-%d", FLOOD - 1);
  assert_non_null(ecs_objstore_find(f->os, key, (uint16_t)strlen(key)));
}

/* With scrub_freed a removed object's bytes are gone from the pool: the
 * next block of that size (the same one, the buddy allocator reuses it)
 * reads as zeros.  Without it they would still be there. */
static void test_scrub_freed(void **state) {
  fx_t *f = *state;
  ecs_objstore_destroy(f->os);
  ecs_objstore_opts_t o;
  ecs_objstore_opts_init(&o);
  o.scrub_freed = 1;
  assert_int_equal(ecs_objstore_create(f->pool, &o, &f->os), ECS_OK);
  ecs_obj_t *obj = NULL;
  assert_int_equal(ecs_objstore_reserve(f->os, "secret", 6, 8192, &obj), ECS_OK);
  memset(ecs_objstore_data(f->os, obj), 0xA5, 8192);
  uint64_t off = obj->off;
  ecs_objstore_commit(f->os, obj);
  assert_int_equal(ecs_objstore_remove(f->os, "secret", 6), ECS_OK);
  assert_int_equal(ecs_objstore_reserve(f->os, "next", 4, 8192, &obj), ECS_OK);
  assert_int_equal(obj->off, off);
  const uint8_t *p = ecs_objstore_data(f->os, obj);
  for (size_t i = 0; i < 8192; i++)
    assert_int_equal(p[i], 0);
  ecs_objstore_abort(f->os, obj);
}

/* A fixture whose store only counts drops, holding at most max_objects
 * objects (0: the default). */
static fx_t *fx_counting(uint64_t max_objects) {
  fx_t *f = fx_new(0.95, 0.85);
  ecs_objstore_destroy(f->os);
  static uint64_t drops;
  ecs_objstore_opts_t o;
  ecs_objstore_opts_init(&o);
  o.on_drop = count_drop;
  o.cb_ctx = &drops;
  o.max_objects = max_objects;
  assert_int_equal(ecs_objstore_create(f->pool, &o, &f->os), ECS_OK);
  return f;
}

static int fx_setup_counting(void **state) {
  *state = fx_counting(NMANY); /* more than the pool's blocks: the table's growth is under test */
  return 0;
}

static int fx_setup_counting_default(void **state) {
  *state = fx_counting(0);
  return 0;
}

/* ---- create / destroy ----------------------------------------------------- */

static void test_create_args(void **state) {
  (void)state;
  ecs_pool_t *pool = make_pool();
  ecs_objstore_t *os = NULL;
  ecs_objstore_opts_t o;
  ecs_objstore_opts_init(&o);
  assert_true(o.high_watermark > o.low_watermark);
  assert_null(o.on_drop);
  o.low_watermark = 0.99; /* above high */
  assert_int_equal(ecs_objstore_create(pool, &o, &os), ECS_EINVAL);
  assert_null(os);
  ecs_objstore_opts_init(&o);
  o.high_watermark = 1.5;
  assert_int_equal(ecs_objstore_create(pool, &o, &os), ECS_EINVAL);
  assert_int_equal(ecs_objstore_create(NULL, NULL, &os), ECS_EINVAL);
  assert_int_equal(ecs_objstore_create(pool, NULL, &os), ECS_OK); /* defaults */
  ecs_objstore_destroy(os);
  ecs_objstore_destroy(NULL);
  ecs_pool_destroy(pool);
}

/* Destroy with objects in every state frees them all (teardown checks the
 * pool; ASan checks the heap), and calls no callback. */
static void test_destroy_frees_all(void **state) {
  fx_t *f = *state;
  fill(f, "c", 4, MiB);
  ecs_obj_t *p = NULL;
  assert_int_equal(ecs_objstore_reserve(f->os, "p", 1, MiB, &p), ECS_OK);
  ecs_obj_t *h = get(f, "c0");
  ecs_obj_t *d = get(f, "c1");
  assert_int_equal(ecs_objstore_remove(f->os, "c1", 2), ECS_OK);
  assert_int_equal(stats(f).doomed, 1);
  (void)h;
  (void)d;
  size_t nev = f->nev;
  ecs_objstore_destroy(f->os);
  f->os = NULL;
  assert_int_equal(f->nev, nev);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_create_args),
      cmocka_unit_test_setup_teardown(test_lifecycle, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_key_conflicts, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_abort_frees, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_replace_while_read, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_replace_edges, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_fifo_eviction_order, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_foreach_order, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_soft_pin_evicted_last, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_soft_pin_background, NULL, fx_teardown),
      cmocka_unit_test_setup_teardown(test_quota_evicts_only_what_helps, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_referenced_not_evicted, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_pending_not_evicted, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_too_big, fx_setup, fx_teardown),
      cmocka_unit_test(test_too_big_odd_region),
      cmocka_unit_test_setup_teardown(test_zero_bytes, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_background, NULL, fx_teardown),
      cmocka_unit_test_setup_teardown(test_background_resumes, NULL, fx_teardown),
      cmocka_unit_test_setup_teardown(test_randomized, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_many_keys, fx_setup_counting, fx_teardown),
      cmocka_unit_test_setup_teardown(test_zero_byte_flood_evicted, fx_setup_counting_default, fx_teardown),
      cmocka_unit_test_setup_teardown(test_scrub_freed, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_destroy_frees_all, fx_setup, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
