/*
 * The object store: a chained hash table of keys, a FIFO of committed
 * objects in commit order, reference counts, and eviction.
 *
 * Where an object lives, by state:
 *   PENDING    hash table only (a second reserve of its key sees EBUSY;
 *              eviction never sees it, so a writer's block is never taken);
 *              a replacing one shares its key with the COMMITTED object it
 *              replaces at commit, so a key has at most one of each
 *   COMMITTED  hash table and FIFO (appended at the tail at commit)
 *   DOOMED     neither; on the doomed list (reusing the FIFO links) only so
 *              that destroy() can free it; freed at its last release
 *
 * Eviction walks the FIFO from the head and skips referenced objects: they
 * keep their place and stay the oldest, to be evicted once released.
 *
 * The callback runs while the object is still allocated (and its block
 * still held), so it may read the object and its bytes; it must not call
 * back into the objstore to change it.
 */
#include "store/server/objstore.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xxhash.h>

/* First table size; a power of two, small enough to cost nothing idle. */
#define OS_INITIAL_BUCKETS 1024u

struct ecs_objstore {
  ecs_pool_t *pool;         /* borrowed; outlives us */
  ecs_objstore_opts_t opts; /* watermarks and callback, as given */
  uint64_t max_alloc;       /* the largest request the pool could ever serve */
  uint64_t min_block;       /* the pool's granule: what one block really costs */
  uint64_t max_objects;     /* bound on nkeys: what the index may cost in host memory */
  uint64_t high_bytes;      /* bytes_in_use above this starts background eviction */
  uint64_t low_bytes;       /* ...and at or below this stops it */
  int bg_active;            /* 1 between crossing high and reaching low */
  int bg_stalled;           /* a run stopped above low with nothing evictable: resume once something is */

  ecs_obj_t **buckets; /* hash chains through hnext; PENDING and COMMITTED */
  size_t nbuckets;     /* a power of two */
  size_t nkeys;        /* objects in the table */

  ecs_obj_t *head;   /* FIFO: oldest committed object */
  ecs_obj_t *tail;   /* FIFO: newest committed object */
  ecs_obj_t *doomed; /* dropped objects still referenced, through fnext */

  size_t kept; /* committed objects with a soft pin (expired ones too) */

  unsigned nowners;      /* tenants 1..nowners (ecs_objstore_set_owners) */
  uint64_t *owner_quota; /* [nowners + 1]: stored bytes each may hold (0: no limit) */
  uint64_t *owner_bytes; /* [nowners + 1]: stored bytes each holds, pending included */

  uint64_t next_seq;       /* the seq the next commit gets */
  ecs_objstore_stats_t st; /* counters returned by ecs_objstore_stats() */
};

/* ---- helpers ------------------------------------------------------------ */

static uint64_t key_hash(const void *key, size_t len) {
  return XXH3_64bits(key, len);
}

/* What the pool really takes for nbytes: exact-size blocks are rounded up
 * to the minimum block, and zero-byte objects take nothing. */
static uint64_t granted(const ecs_objstore_t *os, uint64_t nbytes) {
  return (nbytes + os->min_block - 1) / os->min_block * os->min_block;
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The pool serves each request from one power-of-two block (pool.h), so
 * in a region that is not a power of two the largest block, not the
 * region, bounds a request.  Anything larger is ETOOBIG up front: evicting
 * the whole FIFO for it would only end in ENOSPC. */
static uint64_t largest_block(uint64_t size, uint64_t min_block) {
  uint64_t b = min_block;
  while (b <= size / 2)
    b *= 2;
  return b <= size ? b : 0;
}

/* Frees an object that is in no list, with its block.  Returns the bytes
 * this gave back to the pool.  With scrub_freed the bytes are zeroed
 * first: a removed tensor must not outlive its removal in a pool that
 * other clients map (shm) or read (RDMA), nor in a core dump. */
static uint64_t obj_free(ecs_objstore_t *os, ecs_obj_t *o) {
  uint64_t freed = 0;
  if (o->nbytes) {
    if (os->opts.scrub_freed)
      memset(ecs_pool_ptr(os->pool, o->off), 0, (size_t)o->nbytes);
    int rc = ecs_pool_free(os->pool, o->off, o->nbytes);
    assert(rc == ECS_OK); /* a failure here is our bookkeeping bug */
    (void)rc;
    freed = granted(os, o->nbytes);
  }
  free(o);
  return freed;
}

/* ---- hash table --------------------------------------------------------- */

static ecs_obj_t **bucket_of(ecs_objstore_t *os, const void *key, size_t len) {
  return &os->buckets[key_hash(key, len) & (os->nbuckets - 1)];
}

/* The object of a key in the given state (0: any, committed first). */
static ecs_obj_t *table_find_state(ecs_objstore_t *os, const void *key, uint16_t len, int state) {
  ecs_obj_t *other = NULL;
  for (ecs_obj_t *o = *bucket_of(os, key, len); o; o = o->hnext) {
    if (o->key_len != len || memcmp(o->key, key, len) != 0)
      continue;
    if (state ? o->state == state : o->state == ECS_OBJ_COMMITTED)
      return o;
    if (!state)
      other = o;
  }
  return other;
}

static ecs_obj_t *table_find(ecs_objstore_t *os, const void *key, uint16_t len) {
  return table_find_state(os, key, len, 0);
}

/* Doubles the table.  When the new array cannot be had the old one stays:
 * chains get longer, nothing breaks, so insertion never fails. */
static void table_grow(ecs_objstore_t *os) {
  size_t n = os->nbuckets * 2;
  ecs_obj_t **nb = calloc(n, sizeof *nb);
  if (!nb)
    return;
  for (size_t i = 0; i < os->nbuckets; i++) {
    ecs_obj_t *o = os->buckets[i];
    while (o) {
      ecs_obj_t *next = o->hnext;
      ecs_obj_t **b = &nb[key_hash(o->key, o->key_len) & (n - 1)];
      o->hnext = *b;
      *b = o;
      o = next;
    }
  }
  free(os->buckets);
  os->buckets = nb;
  os->nbuckets = n;
}

static void table_insert(ecs_objstore_t *os, ecs_obj_t *o) {
  if (os->nkeys >= os->nbuckets) /* keep the load factor at most 1 */
    table_grow(os);
  ecs_obj_t **b = bucket_of(os, o->key, o->key_len);
  o->hnext = *b;
  *b = o;
  os->nkeys++;
}

static void table_unlink(ecs_objstore_t *os, ecs_obj_t *o) {
  ecs_obj_t **p = bucket_of(os, o->key, o->key_len);
  while (*p != o) {
    assert(*p);
    p = &(*p)->hnext;
  }
  *p = o->hnext;
  o->hnext = NULL;
  os->nkeys--;
}

/* ---- FIFO and doomed list ----------------------------------------------- */

static void fifo_append(ecs_objstore_t *os, ecs_obj_t *o) {
  o->fnext = NULL;
  o->fprev = os->tail;
  if (os->tail)
    os->tail->fnext = o;
  else
    os->head = o;
  os->tail = o;
}

static void fifo_unlink(ecs_objstore_t *os, ecs_obj_t *o) {
  if (o->fprev)
    o->fprev->fnext = o->fnext;
  else
    os->head = o->fnext;
  if (o->fnext)
    o->fnext->fprev = o->fprev;
  else
    os->tail = o->fprev;
  o->fprev = o->fnext = NULL;
}

/* The doomed list is kept only so that destroy() finds these objects;
 * doubly linked so that a last release unlinks in O(1). */
static void doomed_push(ecs_objstore_t *os, ecs_obj_t *o) {
  o->fprev = NULL;
  o->fnext = os->doomed;
  if (os->doomed)
    os->doomed->fprev = o;
  os->doomed = o;
}

static void doomed_unlink(ecs_objstore_t *os, ecs_obj_t *o) {
  if (o->fprev)
    o->fprev->fnext = o->fnext;
  else
    os->doomed = o->fnext;
  if (o->fnext)
    o->fnext->fprev = o->fprev;
  o->fprev = o->fnext = NULL;
}

/* ---- dropping and eviction ---------------------------------------------- */

/* Takes o's bytes off its owner's account. */
static void owner_sub(ecs_objstore_t *os, const ecs_obj_t *o) {
  if (o->owner && o->owner <= os->nowners)
    os->owner_bytes[o->owner] -= o->nbytes;
}

/* 1 when evictor (an owner, 0: none, as background eviction) may evict o:
 * objects of an owner with a quota are that owner's alone to evict. */
static int evictable_by(const ecs_objstore_t *os, const ecs_obj_t *o, uint16_t evictor) {
  return !o->refs &&
         (!o->owner || o->owner > os->nowners || !os->owner_quota[o->owner] || o->owner == evictor);
}

/* Takes a committed object out of the index and the FIFO, tells the
 * callback, and frees it now or, when readers hold it, at its last release.
 * Returns the bytes given back to the pool now. */
static uint64_t drop(ecs_objstore_t *os, ecs_obj_t *o, ecs_drop_reason_t why) {
  assert(o->state == ECS_OBJ_COMMITTED);
  owner_sub(os, o);
  table_unlink(os, o);
  fifo_unlink(os, o);
  if (o->keep_until_ms)
    os->kept--;
  os->st.objects--;
  os->st.bytes_live -= o->nbytes;
  if (why == ECS_DROP_EVICTED)
    os->st.evictions++;
  else if (why == ECS_DROP_REPLACED)
    os->st.replaces++;
  else
    os->st.removes++;
  o->state = ECS_OBJ_DOOMED;
  if (o->refs) {
    doomed_push(os, o);
    os->st.doomed++;
  }
  if (os->opts.on_drop)
    os->opts.on_drop(os->opts.cb_ctx, o, why);
  return o->refs ? 0 : obj_free(os, o);
}

/* The oldest object at or after from that evictor may evict (no one holds
 * it: the only kind whose eviction gives bytes back now; and no other
 * tenant's quota keeps it) and, unless pinned_too, that no live soft pin
 * keeps. */
static ecs_obj_t *first_evictable(const ecs_objstore_t *os, ecs_obj_t *from, uint16_t evictor, uint64_t now,
                                  int pinned_too) {
  while (from && (!evictable_by(os, from, evictor) || (!pinned_too && from->keep_until_ms > now)))
    from = from->fnext;
  return from;
}

/* The oldest object of owner that no one holds, at or after from. */
static ecs_obj_t *first_of_owner(ecs_obj_t *from, uint16_t owner) {
  while (from && (from->refs || from->owner != owner))
    from = from->fnext;
  return from;
}

/* The next victim for evictor at or after *cur: an unpinned one first; when none is
 * left, the scan starts again at the head with soft-pinned objects
 * allowed (*pinned_too set), oldest first.  With no soft-pinned object
 * in the store, one pass as before (no clock read). */
static ecs_obj_t *next_victim(ecs_objstore_t *os, ecs_obj_t **cur, uint16_t evictor, uint64_t *now,
                              int *pinned_too) {
  if (!*pinned_too && !os->kept)
    *pinned_too = 1;
  if (!*pinned_too && !*now)
    *now = now_ms();
  ecs_obj_t *v = first_evictable(os, *cur, evictor, *now, *pinned_too);
  if (!v && !*pinned_too) {
    *pinned_too = 1;
    v = first_evictable(os, os->head, evictor, *now, 1);
  }
  if (v)
    *cur = v->fnext;
  return v;
}

/* Evicts oldest-first (soft-pinned objects last, other tenants' quota'd
 * objects never) until the pool can serve
 * nbytes and the index has room for one more object.  The count matters
 * for zero-byte objects, which hold no block: bounded by bytes alone, a
 * flood of them grew the index (host memory) without end and was never
 * evicted.  The scan resumes after the last victim instead of at the
 * head: the referenced objects it skipped cannot be released meanwhile
 * (one thread, and the callback must not call back), so one reserve costs
 * O(skipped + evicted), twice that when it reaches the soft-pinned. */
static int make_room(ecs_objstore_t *os, uint64_t nbytes, uint16_t owner) {
  ecs_obj_t *cur = os->head;
  uint64_t now = 0;
  int pinned_too = 0;
  while (os->nkeys >= os->max_objects || (nbytes && !ecs_pool_can_fit(os->pool, nbytes))) {
    ecs_obj_t *victim = next_victim(os, &cur, owner, &now, &pinned_too);
    if (!victim)
      return ECS_ENOSPC;
    drop(os, victim, ECS_DROP_EVICTED);
  }
  return ECS_OK;
}

/* ---- public API --------------------------------------------------------- */

void ecs_objstore_opts_init(ecs_objstore_opts_t *o) {
  memset(o, 0, sizeof *o);
  o->high_watermark = 0.95;
  o->low_watermark = 0.85;
}

static int opts_valid(const ecs_objstore_opts_t *o) {
  return o->low_watermark >= 0.0 && o->low_watermark <= o->high_watermark && o->high_watermark <= 1.0;
}

int ecs_objstore_create(ecs_pool_t *pool, const ecs_objstore_opts_t *o, ecs_objstore_t **out) {
  ecs_objstore_opts_t defaults;
  if (!out)
    return ECS_EINVAL;
  *out = NULL;
  if (!o) {
    ecs_objstore_opts_init(&defaults);
    o = &defaults;
  }
  if (!pool || !opts_valid(o))
    return ECS_EINVAL;
  ecs_objstore_t *os = calloc(1, sizeof *os);
  if (!os)
    return ECS_ENOMEM;
  os->buckets = calloc(OS_INITIAL_BUCKETS, sizeof *os->buckets);
  if (!os->buckets) {
    free(os);
    return ECS_ENOMEM;
  }
  ecs_pool_stats_t ps;
  ecs_pool_stats(pool, &ps);
  os->pool = pool;
  os->opts = *o;
  os->min_block = ps.min_block ? ps.min_block : 1;
  os->max_alloc = largest_block(ps.size, os->min_block);
  os->max_objects = o->max_objects ? o->max_objects : ps.size / os->min_block;
  if (!os->max_objects)
    os->max_objects = 1;
  /* Integer thresholds: bytes_in_use > high * size <=> > floor(high * size). */
  os->high_bytes = (uint64_t)(o->high_watermark * (double)ps.size);
  os->low_bytes = (uint64_t)(o->low_watermark * (double)ps.size);
  os->nbuckets = OS_INITIAL_BUCKETS;
  os->next_seq = 1;
  *out = os;
  return ECS_OK;
}

static void objstore_free_all(ecs_objstore_t *os, int give_back) {
  if (!os)
    return;
  for (size_t i = 0; i < os->nbuckets; i++) {
    ecs_obj_t *o = os->buckets[i];
    while (o) {
      ecs_obj_t *next = o->hnext;
      if (give_back)
        obj_free(os, o);
      else
        free(o);
      o = next;
    }
  }
  while (os->doomed) {
    ecs_obj_t *o = os->doomed;
    os->doomed = o->fnext;
    if (give_back)
      obj_free(os, o);
    else
      free(o);
  }
  free(os->buckets);
  free(os->owner_quota);
  free(os->owner_bytes);
  free(os);
}

void ecs_objstore_destroy(ecs_objstore_t *os) {
  objstore_free_all(os, 1);
}

void ecs_objstore_abandon(ecs_objstore_t *os) {
  objstore_free_all(os, 0);
}

ecs_obj_t *ecs_objstore_find(ecs_objstore_t *os, const void *key, uint16_t key_len) {
  if (ecs_key_check(key, key_len) != ECS_OK)
    return NULL;
  return table_find(os, key, key_len);
}

/* An owner with a quota first makes room under it from its own objects,
 * oldest first (FIFO within the tenant), soft-pinned ones last.  Nothing is
 * evicted unless enough of the owner's objects can go: its pending puts
 * count against the quota but cannot be evicted, and evicting the rest for
 * a put that is refused anyway would only lose them. */
static int quota_room(ecs_objstore_t *os, uint16_t owner, uint64_t nbytes) {
  if (!owner || owner > os->nowners || !os->owner_quota[owner])
    return ECS_OK;
  uint64_t q = os->owner_quota[owner];
  if (nbytes > q)
    return ECS_EQUOTA;
  if (os->owner_bytes[owner] <= q - nbytes)
    return ECS_OK;
  uint64_t need = os->owner_bytes[owner] - (q - nbytes), can = 0;
  for (ecs_obj_t *o = first_of_owner(os->head, owner); o && can < need; o = first_of_owner(o->fnext, owner))
    can += o->nbytes;
  if (can < need)
    return ECS_EQUOTA;
  uint64_t now = os->kept ? now_ms() : 0;
  for (int pinned_too = 0; pinned_too < 2; pinned_too++) {
    ecs_obj_t *cur = os->head;
    while (os->owner_bytes[owner] > q - nbytes) {
      ecs_obj_t *victim = first_of_owner(cur, owner);
      while (victim && !pinned_too && victim->keep_until_ms > now)
        victim = first_of_owner(victim->fnext, owner);
      if (!victim)
        break;
      cur = victim->fnext;
      drop(os, victim, ECS_DROP_EVICTED);
    }
  }
  return os->owner_bytes[owner] > q - nbytes ? ECS_EQUOTA : ECS_OK;
}

/* The struct is allocated before any eviction so that running out of host
 * memory never costs an object its place in the pool. */
static int reserve(ecs_objstore_t *os, const void *key, uint16_t key_len, uint64_t nbytes, int replace,
                   uint16_t owner, ecs_obj_t **out) {
  *out = NULL;
  if (ecs_key_check(key, key_len) != ECS_OK)
    return ECS_EKEY;
  if (table_find_state(os, key, key_len, ECS_OBJ_PENDING))
    return ECS_EBUSY;
  if (!replace && table_find_state(os, key, key_len, ECS_OBJ_COMMITTED))
    return ECS_ECONFLICT;
  if (nbytes > os->max_alloc)
    return ECS_ETOOBIG;
  ecs_obj_t *o = calloc(1, sizeof *o);
  if (!o)
    return ECS_ENOMEM;
  int rc = quota_room(os, owner, nbytes);
  if (rc == ECS_OK)
    rc = make_room(os, nbytes, owner);
  if (rc == ECS_OK && nbytes)
    rc = ecs_pool_alloc(os->pool, nbytes, &o->off);
  if (rc != ECS_OK) {
    free(o);
    return rc;
  }
  memcpy(o->key, key, key_len);
  o->key_len = key_len;
  o->state = ECS_OBJ_PENDING;
  o->replace = replace ? 1 : 0;
  o->refs = 1;
  o->nbytes = nbytes;
  o->owner = owner <= os->nowners ? owner : 0;
  if (o->owner)
    os->owner_bytes[o->owner] += nbytes;
  table_insert(os, o);
  os->st.pending++;
  *out = o;
  return ECS_OK;
}

int ecs_objstore_reserve(ecs_objstore_t *os, const void *key, uint16_t key_len, uint64_t nbytes,
                         ecs_obj_t **out) {
  return reserve(os, key, key_len, nbytes, 0, 0, out);
}

int ecs_objstore_reserve_as(ecs_objstore_t *os, const void *key, uint16_t key_len, uint64_t nbytes,
                            int replace, uint16_t owner, ecs_obj_t **out) {
  return reserve(os, key, key_len, nbytes, replace ? 1 : 0, owner, out);
}

int ecs_objstore_set_owners(ecs_objstore_t *os, unsigned n, const uint64_t *quota) {
  uint64_t *q = calloc((size_t)n + 1, sizeof *q), *b = calloc((size_t)n + 1, sizeof *b);
  if (!q || !b || n > UINT16_MAX) {
    free(q);
    free(b);
    return ECS_ENOMEM;
  }
  for (unsigned i = 0; i < n; i++)
    q[i + 1] = quota ? quota[i] : 0;
  free(os->owner_quota);
  free(os->owner_bytes);
  os->owner_quota = q;
  os->owner_bytes = b;
  os->nowners = n;
  return ECS_OK;
}

uint64_t ecs_objstore_owner_bytes(const ecs_objstore_t *os, uint16_t owner) {
  return owner && owner <= os->nowners ? os->owner_bytes[owner] : 0;
}

int ecs_objstore_reserve_replace(ecs_objstore_t *os, const void *key, uint16_t key_len, uint64_t nbytes,
                                 ecs_obj_t **out) {
  return reserve(os, key, key_len, nbytes, 1, 0, out);
}

/* A replacing commit drops the old version first, in the same call: there
 * is no moment at which neither (or both) can be acquired.  The old one may
 * already be gone (removed or evicted meanwhile); then this is a plain
 * commit. */
void ecs_objstore_commit(ecs_objstore_t *os, ecs_obj_t *obj) {
  assert(obj->state == ECS_OBJ_PENDING && obj->refs >= 1);
  if (obj->replace) {
    ecs_obj_t *old = table_find_state(os, obj->key, obj->key_len, ECS_OBJ_COMMITTED);
    if (old)
      drop(os, old, ECS_DROP_REPLACED);
    obj->replace = 0;
  }
  obj->state = ECS_OBJ_COMMITTED;
  obj->seq = os->next_seq++;
  if (!obj->commit_ms) /* a caller may stamp a whole batch with one time */
    obj->commit_ms = now_ms();
  if (obj->keep_until_ms)
    os->kept++;
  obj->refs--;
  fifo_append(os, obj);
  if (os->bg_stalled && obj->refs == 0)
    os->bg_active = 1; /* the stalled run resumes at its next call */
  os->st.pending--;
  os->st.objects++;
  os->st.bytes_live += obj->nbytes;
}

void ecs_objstore_abort(ecs_objstore_t *os, ecs_obj_t *obj) {
  assert(obj->state == ECS_OBJ_PENDING);
  table_unlink(os, obj);
  os->st.pending--;
  owner_sub(os, obj);
  obj_free(os, obj);
}

ecs_obj_t *ecs_objstore_acquire(ecs_objstore_t *os, const void *key, uint16_t key_len) {
  ecs_obj_t *o = ecs_objstore_find(os, key, key_len); /* the committed one first */
  if (!o || o->state != ECS_OBJ_COMMITTED)
    return NULL;
  o->refs++;
  return o;
}

void ecs_objstore_release(ecs_objstore_t *os, ecs_obj_t *obj) {
  /* A pending object's only reference is the writer's: commit or abort. */
  assert(obj->state != ECS_OBJ_PENDING && obj->refs > 0);
  if (--obj->refs == 0 && obj->state == ECS_OBJ_COMMITTED && os->bg_stalled)
    os->bg_active = 1; /* evictable now: the stalled run resumes at its next call */
  if (obj->refs || obj->state != ECS_OBJ_DOOMED)
    return;
  doomed_unlink(os, obj);
  os->st.doomed--;
  obj_free(os, obj);
}

int ecs_objstore_remove(ecs_objstore_t *os, const void *key, uint16_t key_len) {
  ecs_obj_t *o = ecs_objstore_find(os, key, key_len);
  if (!o || o->state != ECS_OBJ_COMMITTED)
    return ECS_ENOTFOUND;
  drop(os, o, ECS_DROP_REMOVED);
  return ECS_OK;
}

/* One pool stats call per invocation, not per object: the bytes each
 * eviction gives back are known exactly (granted()), so the fill is
 * tracked from there.  The active flag is the hysteresis: once started
 * above high, later calls (bounded by max_objects) go on until low; the
 * stalled flag carries a run that ran out of victims until there is one. */
unsigned ecs_objstore_evict_background(ecs_objstore_t *os, unsigned max_objects) {
  ecs_pool_stats_t ps;
  ecs_pool_stats(os->pool, &ps);
  uint64_t in_use = ps.bytes_in_use;
  if (in_use > os->high_bytes)
    os->bg_active = 1;
  if (!os->bg_active)
    return 0;
  unsigned n = 0;
  ecs_obj_t *cur = os->head;
  uint64_t now = 0;
  int pinned_too = 0;
  while (in_use > os->low_bytes) {
    if (n == max_objects)
      return n; /* budget spent; stay active for the next call */
    ecs_obj_t *victim = next_victim(os, &cur, 0, &now, &pinned_too);
    if (!victim) {
      /* The rest is referenced, or still being written (PENDING objects
       * are not in the FIFO yet).  Stop, and go on once a commit or a last
       * release makes something evictable: else a put that crossed high
       * while its bytes were being written would stay above low. */
      os->bg_active = 0;
      os->bg_stalled = 1;
      return n;
    }
    in_use -= drop(os, victim, ECS_DROP_EVICTED);
    n++;
  }
  os->bg_active = 0;
  os->bg_stalled = 0;
  return n;
}

void ecs_objstore_foreach(ecs_objstore_t *os, void (*fn)(void *ctx, const ecs_obj_t *obj), void *ctx) {
  for (ecs_obj_t *o = os->head; o; o = o->fnext)
    fn(ctx, o);
}

void ecs_objstore_stats(ecs_objstore_t *os, ecs_objstore_stats_t *st) {
  *st = os->st;
}

/* Zero-byte objects hold no block; they get the pool's base, a valid
 * address to copy 0 bytes from (memcpy with NULL is undefined). */
void *ecs_objstore_data(ecs_objstore_t *os, const ecs_obj_t *obj) {
  if (!obj->nbytes)
    return ecs_pool_base(os->pool);
  return ecs_pool_ptr(os->pool, obj->off);
}
